//! Waiting for a connection's opening bytes without consuming them: the HTTP/2 preface on an
//! `h2c` listener, a PROXY protocol header. Both peek until enough bytes are queued to decide,
//! and both had the same two bugs: `peek` returns at once while any byte is queued, so a loop of
//! `timeout_at(deadline, peek())` never reaches its deadline (tokio polls the inner future first),
//! and a client that sent a prefix and then FIN looks exactly like one still sending, forever.
//!
//! Here the wait is for readiness, not for a timer: the peek runs inside `try_io`, which clears
//! the socket's readiness when it finds no new byte, so the task sleeps until the kernel reports
//! more data or the peer's FIN (epoll's `EPOLLRDHUP`, which tokio keeps as `read_closed` and
//! never clears). Nothing wakes a connection that sends nothing, and the deadline is its own
//! timer, checked whatever the socket does.

use std::io;
use std::os::fd::AsRawFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Why no more opening bytes will come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The peer closed its side (FIN, or a reset): what is queued is all there will be.
    Closed,
    /// `deadline` passed first.
    Deadline,
    /// The socket failed.
    Failed,
}

/// Waits until more than `seen` bytes are queued on `tcp` (at most `buf.len()`), or until no more
/// can come, and returns how many are queued, copied into the front of `buf` but left on the
/// socket. `seen` is what the caller already looked at and could not decide on: 0 the first time.
pub(crate) async fn peek_more(
    tcp: &TcpStream,
    buf: &mut [u8],
    seen: usize,
    deadline: Instant,
) -> Result<usize, Ended> {
    loop {
        // Checked first: a client trickling a byte per wake-up must not outlive its deadline.
        if Instant::now() >= deadline {
            return Err(Ended::Deadline);
        }
        let ready = match tokio::time::timeout_at(deadline, tcp.ready(Interest::READABLE)).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err(Ended::Failed),
            Err(_) => return Err(Ended::Deadline),
        };
        let peeked = tcp.try_io(Interest::READABLE, || {
            let n = nix::sys::socket::recv(
                tcp.as_raw_fd(),
                buf,
                nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            )
            .map_err(io::Error::from)?;
            if n > 0 && n <= seen {
                // Nothing new: clears the readiness, so the next wait sleeps until the kernel
                // has more (or the FIN).
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match peeked {
            Ok(0) => return Err(Ended::Closed),
            Ok(n) => return Ok(n),
            // Readiness said the FIN had come before this peek looked: nothing new will follow.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && ready.is_read_closed() => {
                return Err(Ended::Closed);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(Ended::Failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    async fn pair() -> (std::net::TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, _) = l.accept().expect("accept");
        s.set_nonblocking(true).expect("nonblocking");
        (c, TcpStream::from_std(s).expect("tokio"))
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[tokio::test]
    async fn a_prefix_then_fin_is_closed_not_waited_on() {
        let (mut c, s) = pair().await;
        c.write_all(b"P").expect("write");
        let mut buf = [0u8; 24];
        assert_eq!(peek_more(&s, &mut buf, 0, far()).await, Ok(1));
        c.shutdown(std::net::Shutdown::Write).expect("fin");
        // Before the fix this waited forever (the deadline is an hour away).
        assert_eq!(peek_more(&s, &mut buf, 1, far()).await, Err(Ended::Closed));
        assert_eq!(&buf[..1], b"P", "the byte stays queued, only peeked");
    }

    #[tokio::test]
    async fn more_bytes_wake_the_wait_and_are_all_returned() {
        let (mut c, s) = pair().await;
        c.write_all(b"PRI").expect("write");
        let mut buf = [0u8; 24];
        assert_eq!(peek_more(&s, &mut buf, 0, far()).await, Ok(3));
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            c.write_all(b" * HTTP").expect("write");
            c
        });
        assert_eq!(peek_more(&s, &mut buf, 3, far()).await, Ok(10));
        assert_eq!(&buf[..10], b"PRI * HTTP");
        drop(writer.join());
    }

    #[tokio::test]
    async fn a_stalled_prefix_ends_at_the_deadline() {
        let (mut c, s) = pair().await;
        c.write_all(b"PRI").expect("write");
        let mut buf = [0u8; 24];
        assert_eq!(peek_more(&s, &mut buf, 0, far()).await, Ok(3));
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(peek_more(&s, &mut buf, 3, soon).await, Err(Ended::Deadline));
        // A deadline already past ends the wait even while bytes are queued and new ones come.
        c.write_all(b" ").expect("write");
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(peek_more(&s, &mut buf, 3, past).await, Err(Ended::Deadline));
        drop(c);
    }

    #[tokio::test]
    async fn nothing_sent_then_fin_is_closed() {
        let (c, s) = pair().await;
        c.shutdown(std::net::Shutdown::Write).expect("fin");
        let mut buf = [0u8; 24];
        assert_eq!(peek_more(&s, &mut buf, 0, far()).await, Err(Ended::Closed));
    }
}
