//! The client socket under a TLS handshake. When the keys may go to the kernel afterwards, it
//! reads one TLS record at a time (the 5-byte header, then exactly the length it gives), and
//! starts a record only once all of it has arrived (peeked first), so rustls never holds part
//! of a record: rustls reads on after the client's Finished for as long as records are there
//! without waiting, and a record still arriving then stays whole in the socket for the kernel
//! to decrypt. Whole records rustls did read are decrypted by it and handed over as plaintext.
//! Otherwise (no kTLS for this connection) it reads as much as rustls asks, as the bare socket
//! did.
//!
//! It also counts the bytes written, the handshake's, which a kTLS connection reports beside
//! its heads: the probe sees them on the socket, and they are not body bytes.

use nix::sys::socket::{MsgFlags, recv};
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// A TLS record header: type, version (2), length (2).
const HEADER: usize = 5;

/// The longest record a peer may send (TLS 1.2's ciphertext bound, RFC 5246 §6.2.3); a header
/// claiming more is read through for rustls to refuse.
const MAX_RECORD: usize = (1 << 14) + 2048;

/// The handshake's socket (see the module doc).
pub struct HandshakeIo {
    tcp: TcpStream,
    at_boundaries: bool,
    header: [u8; HEADER],
    header_len: usize,
    left_in_record: usize,
    written: u64,
    /// Where a record is peeked at before it is read (grown to the largest record seen).
    peek: Vec<u8>,
}

impl HandshakeIo {
    /// `at_boundaries`: read record by record (the connection may be handed to the kernel).
    pub fn new(tcp: TcpStream, at_boundaries: bool) -> HandshakeIo {
        HandshakeIo {
            tcp,
            at_boundaries,
            header: [0; HEADER],
            header_len: 0,
            left_in_record: 0,
            written: 0,
            peek: Vec::new(),
        }
    }

    /// The socket.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Reads as much as asked from now on (the connection stays in user space).
    pub fn read_freely(&mut self) {
        self.at_boundaries = false;
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Whether the reads so far ended exactly at a record boundary.
    pub fn at_record_boundary(&self) -> bool {
        self.header_len == 0 && self.left_in_record == 0
    }

    /// The socket, for the kernel.
    pub fn into_tcp(self) -> TcpStream {
        self.tcp
    }
}

impl AsyncRead for HandshakeIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.at_boundaries || buf.remaining() == 0 {
            return Pin::new(&mut this.tcp).poll_read(cx, buf);
        }
        if this.left_in_record == 0 && this.header_len == 0 {
            // A record starts here: wait until all of it is in the socket.
            let fd = this.tcp.as_raw_fd();
            loop {
                ready!(this.tcp.poll_read_ready(cx))?;
                let peek = &mut this.peek;
                match this
                    .tcp
                    .try_io(Interest::READABLE, || whole_record_arrived(fd, peek))
                {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        }
        let in_header = this.left_in_record == 0;
        let want = if in_header {
            HEADER - this.header_len
        } else {
            this.left_in_record
        }
        .min(buf.remaining());
        let mut part = ReadBuf::new(buf.initialize_unfilled_to(want));
        ready!(Pin::new(&mut this.tcp).poll_read(cx, &mut part))?;
        let n = part.filled().len();
        if in_header {
            this.header[this.header_len..this.header_len + n].copy_from_slice(part.filled());
            this.header_len += n;
            if this.header_len == HEADER {
                this.header_len = 0;
                this.left_in_record =
                    usize::from(u16::from_be_bytes([this.header[3], this.header[4]]));
            }
        } else {
            this.left_in_record -= n;
        }
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// Ok when the socket holds a whole record (or its end, or a header rustls will refuse);
/// WouldBlock while part of it has yet to arrive.
fn whole_record_arrived(fd: std::os::fd::RawFd, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut header = [0u8; HEADER];
    let n = recv(fd, &mut header, MsgFlags::MSG_PEEK)?;
    if n == 0 {
        return Ok(());
    }
    if n < HEADER {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    let whole = HEADER + usize::from(u16::from_be_bytes([header[3], header[4]]));
    if whole > HEADER + MAX_RECORD {
        return Ok(());
    }
    if buf.len() < whole {
        buf.resize(whole, 0);
    }
    if recv(fd, &mut buf[..whole], MsgFlags::MSG_PEEK)? < whole {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    Ok(())
}

impl AsyncWrite for HandshakeIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.tcp).poll_write(cx, buf))?;
        this.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs))?;
        this.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected loopback pair: (client, server).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (s, _) = l.accept().await.expect("accept");
        (c, s)
    }

    /// Two records and a request's first bytes arrive in one segment: read by record, the
    /// reads stop at each record's end and never take a byte of what follows.
    #[tokio::test]
    async fn reads_stop_at_record_ends() {
        let (mut c, s) = pair().await;
        let mut wire = vec![0x16, 3, 3, 0, 3, b'a', b'b', b'c'];
        wire.extend_from_slice(&[0x14, 3, 3, 0, 0]); // an empty record
        wire.extend_from_slice(&[0x17, 3, 3, 0, 2, b'x', b'y']);
        wire.extend_from_slice(b"AFTER");
        c.write_all(&wire).await.expect("write");
        let mut io = HandshakeIo::new(s, true);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let mut reads = Vec::new();
        while got.len() < wire.len() - 5 {
            let n = io.read(&mut buf).await.expect("read");
            assert!(n > 0);
            reads.push(n);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, wire[..wire.len() - 5]);
        assert_eq!(reads, [5, 3, 5, 5, 2]);
        assert!(io.at_record_boundary());
        let mut rest = [0u8; 5];
        let n = io.tcp().peek(&mut rest).await.expect("peek");
        assert_eq!(&rest[..n], b"AFTER");
        io.read_freely();
        let n = io.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"AFTER");
        io.write_all(b"12345").await.expect("write");
        assert_eq!(io.written(), 5);
    }

    /// A record that has only partly arrived is not started: nothing is read until the rest is
    /// in the socket (so a hand-over then never finds rustls holding part of a record).
    #[tokio::test]
    async fn a_record_is_read_only_once_whole() {
        let (mut c, s) = pair().await;
        let mut io = HandshakeIo::new(s, true);
        let mut buf = [0u8; 64];
        for part in [&[0x17u8, 3][..], &[3, 0, 2, b'z']] {
            c.write_all(part).await.expect("write");
            // Give the bytes time to arrive: the read must still wait for the rest.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let waited =
                tokio::time::timeout(std::time::Duration::from_millis(50), io.read(&mut buf)).await;
            assert!(waited.is_err(), "read part of a record");
            assert!(io.at_record_boundary());
        }
        c.write_all(b"yN").await.expect("write");
        let mut all = Vec::new();
        while all.len() < 7 {
            let n = io.read(&mut buf).await.expect("read");
            all.extend_from_slice(&buf[..n]);
        }
        assert_eq!(all, [0x17, 3, 3, 0, 2, b'z', b'y']);
        assert!(io.at_record_boundary());
        let mut rest = [0u8; 1];
        assert_eq!(io.tcp().peek(&mut rest).await.expect("peek"), 1);
        assert_eq!(rest, *b"N");
    }

    /// Hostile framing: a header claiming more than any record may hold is not waited for
    /// (the rest may never come): it is read through at once, for rustls to refuse.
    #[tokio::test]
    async fn an_oversized_record_header_is_read_through_not_waited_for() {
        let (mut c, s) = pair().await;
        let mut io = HandshakeIo::new(s, true);
        c.write_all(&[0x16, 3, 3, 0xff, 0xff, 1, 2])
            .await
            .expect("write");
        let mut buf = [0u8; 64];
        assert_eq!(io.read(&mut buf).await.expect("read"), 5);
        assert_eq!(buf[..5], [0x16, 3, 3, 0xff, 0xff]);
        assert_eq!(io.read(&mut buf).await.expect("read"), 2);
        assert!(!io.at_record_boundary());
    }
}
