//! The zero-copy data plane: a body from a cache file to a socket with sendfile(2), driven by
//! the socket's readiness, never through a user-space buffer.
//!
//! Why by hand: tokio has no sendfile, and every generic copy helper (`io::copy`, a BufWriter, a
//! body stream) reads the file into user memory first, which is exactly the silent fallback this
//! project exists to catch. Each call is capped at `max_chunk` and the task yields between chunks,
//! so one 1 GiB transfer cannot starve the other connections on the same worker thread.
//!
//! The cap also shrinks as a worker's transfers grow in number ([`chunk_for`]): a worker goes
//! through every ready transfer before a new request's task runs, so a round of 250 transfers
//! at 2 MiB each is 500 MiB of sendfile between two looks at anyone else. With the server sharing
//! two CPUs with 500 clients, that round took ~400 ms and a 1 KiB keep-alive hit waited for it
//! (`cargo xtask bench --burst`). A worker's round is held near [`ROUND_BUDGET`] instead.

use nix::sys::socket::MsgFlags;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Runs the non-blocking socket write `op` once the socket is writable, allowing at most
/// `timeout` for it to become so (nginx's `send_timeout`: the longest time between two writes
/// that make progress). A client that stops reading can hold nothing for longer: not a worker's
/// buffers, not an upstream connection, not a fill lock. The first attempt is made without arming
/// a timer, so a socket with room (every small hit) pays nothing for the deadline.
async fn when_writable<R>(
    sock: &TcpStream,
    timeout: Duration,
    mut op: impl FnMut() -> io::Result<R>,
) -> io::Result<R> {
    match sock.try_io(Interest::WRITABLE, &mut op) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        done => return done,
    }
    match tokio::time::timeout(timeout, sock.async_io(Interest::WRITABLE, op)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client took no bytes within send_timeout",
        )),
    }
}

/// Writes all of `buf` to `sock` (send(2) with `MSG_NOSIGNAL`), within `timeout` per write that
/// makes progress.
pub async fn send_all(sock: &TcpStream, buf: &[u8], timeout: Duration) -> io::Result<()> {
    send_flags(sock, buf, MsgFlags::empty(), timeout).await
}

/// `MSG_MORE`, which nix's `MsgFlags` does not name: the raw bit, passed through unchanged.
const MSG_MORE: MsgFlags = MsgFlags::from_bits_retain(libc::MSG_MORE);

async fn send_flags(
    sock: &TcpStream,
    buf: &[u8],
    flags: MsgFlags,
    timeout: Duration,
) -> io::Result<()> {
    // nix's send takes a raw fd; sock keeps it open for the whole call.
    let fd = sock.as_raw_fd();
    let mut done = 0;
    while done < buf.len() {
        let rest = &buf[done..];
        done += when_writable(sock, timeout, || {
            Ok(nix::sys::socket::send(
                fd,
                rest,
                flags | MsgFlags::MSG_NOSIGNAL,
            )?)
        })
        .await?;
    }
    Ok(())
}

/// Why a sendfile transfer stopped early.
#[derive(Debug, thiserror::Error)]
pub enum SendfileError {
    /// The file ended before `len` bytes: it was truncated underneath.
    #[error("cache file ended after {sent} of {expected} bytes")]
    Truncated {
        /// Bytes sent.
        sent: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// The socket failed (client went away, or took nothing within the send timeout).
    #[error("sendfile after {sent} bytes: {error}")]
    Io {
        /// Bytes sent before the failure.
        sent: u64,
        /// The failure.
        error: io::Error,
    },
}

/// Sends a response head that a sendfile body follows, with `MSG_MORE`: the kernel holds the
/// head's bytes until the body's first pages join them, so a small hit leaves as one segment
/// instead of two (one transmit, one receive and one wake-up of the client fewer per request).
/// Safe from the corked-tail stall that `tcp_nopush` gives nginx: the socket has `TCP_NODELAY`,
/// and sendfile's last call carries no `MSG_MORE`, so the tail is pushed the moment it is queued.
pub async fn send_head(sock: &TcpStream, head: &[u8], timeout: Duration) -> io::Result<()> {
    send_flags(sock, head, MSG_MORE, timeout).await
}

/// Bytes of sendfile one worker thread's transfers get, together, per round of its run queue.
/// Large enough that a handful of transfers keep the full `max_chunk` (16 at 2 MiB), small
/// enough that a round under a burst of hundreds stays tens of milliseconds of CPU.
pub(crate) const ROUND_BUDGET: u64 = 32 << 20;

/// The smallest chunk a crowd of transfers is cut to: two loopback TSO segments, so each call
/// still moves whole segments and the syscall count stays ~8,000 per GB at worst.
pub(crate) const MIN_CHUNK: u64 = 128 << 10;

/// The cap of one sendfile call while `active` transfers run on this worker: an equal share of
/// [`ROUND_BUDGET`], between [`MIN_CHUNK`] and the configured `max_chunk`.
pub(crate) fn chunk_for(active: u64, max_chunk: u64) -> u64 {
    let max_chunk = max_chunk.max(1);
    (ROUND_BUDGET / active.max(1)).clamp(MIN_CHUNK.min(max_chunk), max_chunk)
}

thread_local! {
    /// Transfers in [`send`] on this thread (a worker's runtime is single-threaded). Shared
    /// through an `Arc` so that a guard dropped elsewhere still decrements the right count.
    static ACTIVE: Arc<AtomicU64> = Arc::new(AtomicU64::new(0));
}

/// One transfer counted in its worker's [`ACTIVE`] for as long as it lives.
struct Active(Arc<AtomicU64>);

impl Active {
    fn enter() -> Active {
        let count = ACTIVE.with(Arc::clone);
        count.fetch_add(1, Ordering::Relaxed);
        Active(count)
    }

    fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sends `len` bytes of `file` from `offset` to `sock`. Returns the bytes sent (always `len` on
/// success).
pub async fn send(
    sock: &TcpStream,
    file: &File,
    offset: u64,
    len: u64,
    max_chunk: u64,
    timeout: Duration,
) -> Result<u64, SendfileError> {
    let mut off = offset as libc::off64_t;
    let end = offset + len;
    let mut sent = 0u64;
    let active = Active::enter();
    while sent < len {
        let chunk = chunk_for(active.count(), max_chunk);
        let want = (end - off as u64).min(chunk) as usize;
        let n = when_writable(sock, timeout, || {
            // nix's sendfile64 is the same one syscall (sendfile64 on x86_64, as libc::sendfile
            // was): no allocation, the kernel advances `off`, and an error is the same errno.
            Ok(nix::sys::sendfile::sendfile64(sock, file, Some(&mut off), want)? as u64)
        })
        .await
        .map_err(|error| SendfileError::Io { sent, error })?;
        if n == 0 {
            return Err(SendfileError::Truncated {
                sent,
                expected: len,
            });
        }
        sent += n;
        if n as usize == want && want as u64 == chunk && sent < len {
            // A full chunk went out: let other connections on this worker run.
            tokio::task::yield_now().await;
        }
    }
    Ok(sent)
}

/// The copying paths' one read: the next piece of a body, `sent` bytes into `len` at `offset` of
/// `file`, into `buf` (at most its length). A file that ends early was truncated underneath.
pub(crate) fn read_piece(
    file: &File,
    buf: &mut [u8],
    offset: u64,
    sent: u64,
    len: u64,
) -> Result<usize, SendfileError> {
    use std::os::unix::fs::FileExt;
    let want = ((len - sent) as usize).min(buf.len());
    let n = file
        .read_at(&mut buf[..want], offset + sent)
        .map_err(|error| SendfileError::Io { sent, error })?;
    if n == 0 {
        return Err(SendfileError::Truncated {
            sent,
            expected: len,
        });
    }
    Ok(n)
}

/// [`read_piece`] appended to `buf`'s spare room (at most `max` bytes), without zeroing it first.
/// The HTTP/2 path hands every chunk on as it was read, so each is a new buffer, and zeroing
/// 64 KiB only for pread to overwrite it was 4.5% of the CPU of 1 MiB h2 hits.
pub(crate) fn read_piece_into(
    file: &File,
    buf: &mut bytes::BytesMut,
    max: usize,
    offset: u64,
    sent: u64,
    len: u64,
) -> Result<usize, SendfileError> {
    let want = ((len - sent) as usize).min(max);
    buf.reserve(want);
    let spare = buf.spare_capacity_mut();
    let at = offset
        .checked_add(sent)
        .and_then(|at| libc::off_t::try_from(at).ok());
    let at = at.ok_or_else(|| SendfileError::Io {
        sent,
        error: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    let n = loop {
        // SAFETY: `spare` is valid for writes of `want` bytes (reserved above), pread writes at
        // most `want`, and no reference to the uninitialised bytes is made.
        let r = unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), want, at) };
        if r >= 0 {
            break r as usize;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(SendfileError::Io { sent, error });
        }
    };
    if n == 0 {
        return Err(SendfileError::Truncated {
            sent,
            expected: len,
        });
    }
    // SAFETY: the kernel initialised the first `n` (≤ `want`) bytes of the spare room.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// The planted bug (`debug.copy_hits`): the same transfer through read(2) into a buffer and
/// write(2) out of it. It exists so tests and demos can show the violation detector firing.
pub async fn send_by_copy(
    sock: &TcpStream,
    file: &File,
    offset: u64,
    len: u64,
    timeout: Duration,
) -> Result<u64, SendfileError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    while sent < len {
        let n = read_piece(file, &mut buf, offset, sent, len)?;
        let mut done = 0;
        while done < n {
            let chunk = &buf[done..n];
            // write(2), not send(2): the copying syscall the probe is meant to catch.
            let w = when_writable(sock, timeout, || Ok(nix::unistd::write(sock, chunk)?))
                .await
                .map_err(|error| SendfileError::Io {
                    sent: sent + done as u64,
                    error,
                })?;
            done += w;
        }
        sent += n as u64;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Up to 16 transfers keep the configured 2 MiB; beyond, equal shares of 32 MiB, never below
    /// 128 KiB; a configured cap below the floor is kept as it is.
    #[test]
    fn the_chunk_shrinks_with_the_crowd() {
        let mib = 1 << 20;
        assert_eq!(chunk_for(0, 2 * mib), 2 * mib);
        assert_eq!(chunk_for(1, 2 * mib), 2 * mib);
        assert_eq!(chunk_for(16, 2 * mib), 2 * mib);
        assert_eq!(chunk_for(17, 2 * mib), 1_973_790);
        assert_eq!(chunk_for(64, 2 * mib), 512 << 10);
        assert_eq!(chunk_for(250, 2 * mib), 134_217);
        assert_eq!(chunk_for(256, 2 * mib), 128 << 10);
        assert_eq!(chunk_for(10_000, 2 * mib), 128 << 10);
        assert_eq!(chunk_for(1, 64 << 10), 64 << 10);
        assert_eq!(chunk_for(10_000, 64 << 10), 64 << 10);
        assert_eq!(chunk_for(1, 16 * mib), 16 * mib);
        assert_eq!(chunk_for(4, 16 * mib), 8 * mib);
    }

    /// A guard counts on its own thread and uncounts where it was made, even when dropped on
    /// another thread (a future that moved).
    #[test]
    fn a_transfer_is_counted_while_it_lives() {
        let a = Active::enter();
        let b = Active::enter();
        assert_eq!(a.count(), 2);
        std::thread::spawn(move || drop(b)).join().expect("thread");
        assert_eq!(a.count(), 1);
        let elsewhere = std::thread::spawn(|| Active::enter().count())
            .join()
            .expect("thread");
        assert_eq!(elsewhere, 1);
        drop(a);
        assert_eq!(ACTIVE.with(|c| c.load(Ordering::Relaxed)), 0);
    }

    /// A piece read into fresh room is the file's bytes at the offset, at most `max` of them and
    /// no more than the body has left; a file shorter than its body is named truncated, an offset
    /// past what off_t holds refused.
    #[test]
    fn a_piece_read_into_fresh_room_is_exactly_the_files_bytes() {
        use std::io::Write;
        let mut f = temp_file();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
        f.write_all(&data).expect("write");
        let mut buf = bytes::BytesMut::new();
        assert_eq!(
            read_piece_into(&f, &mut buf, 65_536, 10, 0, 99_990).expect("read"),
            65_536
        );
        assert_eq!(&buf[..], &data[10..65_546]);
        // Appended after what the buffer held; the body's end bounds it, not `max`.
        assert_eq!(
            read_piece_into(&f, &mut buf, 65_536, 10, 65_536, 99_990).expect("read"),
            34_454
        );
        assert_eq!(&buf[..], &data[10..]);
        let mut short = bytes::BytesMut::new();
        assert!(matches!(
            read_piece_into(&f, &mut short, 1_000, 0, 100_000, 100_500),
            Err(SendfileError::Truncated {
                sent: 100_000,
                expected: 100_500
            })
        ));
        assert!(short.is_empty());
        assert!(matches!(
            read_piece_into(&f, &mut short, 1_000, u64::MAX - 10, 0, 20),
            Err(SendfileError::Io { sent: 0, .. })
        ));
        // An offset and a count that overflow together, not wrapped round to the file's start.
        assert!(matches!(
            read_piece_into(&f, &mut short, 1_000, u64::MAX - 10, 20, 40),
            Err(SendfileError::Io { sent: 20, .. })
        ));
        assert!(short.is_empty());
    }

    fn temp_file() -> File {
        let path = std::env::temp_dir().join(format!("zc-read-piece-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("temp file");
        let _ = std::fs::remove_file(&path);
        f
    }

    /// nix's `MsgFlags` does not name `MSG_MORE`: the raw bit must reach send(2) as it was.
    #[test]
    fn msg_more_survives_nix_flags() {
        assert_eq!(MSG_MORE.bits(), libc::MSG_MORE);
        assert_eq!(
            (MSG_MORE | MsgFlags::MSG_NOSIGNAL).bits(),
            libc::MSG_MORE | libc::MSG_NOSIGNAL
        );
    }
}
