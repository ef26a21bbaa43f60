//! An HTTP/2 connection's socket, with its output coalesced: the frames of every stream that
//! answered since the last write go out in one write, one syscall, records sealed together.
//!
//! **Why.** Each stream runs on its own task and hands its frames to the `h2` crate, whose
//! connection task writes and flushes whatever is queued each time it is woken, and it is woken
//! by every frame a stream queues: a 1 KiB hit's HEADERS and its DATA were two writes, two TLS
//! records, two segments (2.1 writev per hit under h2load, 40% of the proxy's CPU in writev),
//! and a large body one writev per 16 KiB frame where HTTP/1.1 writes 64 KiB and more at once.
//! nginx answers a read's worth of requests and writes them together. Here the crate's flush only
//! marks the bytes due; they are written by [`flush_due`] on the connection's own task after it
//! has let every task that is ready now run (`yield_now`), so the streams finishing in the same
//! turn share a write, and frames are gathered up to [`CAP`] before one is made. Measured
//! (h2load, 10 × 10 streams, TLS): 0.24 writev per 1 KiB hit instead of 2.1, and a quarter less
//! CPU per 1 MiB hit. Over TLS in user space a large frame is not copied into the buffer: it is
//! sealed into records at once ([`SEAL_AT`]), and the records wait in rustls for the same flush.
//!
//! **Bounds.** At most [`CAP`] bytes wait, in a buffer that exists only while they do, and over
//! TLS at most rustls's own 64 KiB of sealed records; past that a write first waits for the
//! socket, so a client that does not read stops the crate as before. Before the handshake
//! completes, and on shutdown, flushes are real (the server's SETTINGS, the GOAWAY).

use crate::net::client_sock::ClientSock;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use zerocache_ledger::{Accounting, ConnId};

/// Bytes that may wait in the buffer for the next flush: four full TLS records' worth, written
/// by one writev as HTTP/1.1's large bodies are. (Over TLS in user space a large body's frames
/// skip the buffer: [`SEAL_AT`].)
const CAP: usize = 64 * 1024;

/// Over TLS in user space, a write of at least this many bytes (a DATA frame of a body past a
/// few KiB) is sealed into records at once, straight from the crate's buffers, with whatever
/// small frames were gathered before it. A frame is 16,384 bytes with its header
/// (`stream::FRAME_PAYLOAD`), so it is one whole record. Copying it into the buffer first, then
/// into rustls, was 8% of a 1 MiB hit's CPU in perf; paired runs gained less (0.99× CPU per
/// request at 1 MiB, 0.96× at 64 KiB), the copy removed being the one of hot bytes. Smaller
/// writes are gathered, so a small answer's HEADERS and DATA share a record.
const SEAL_AT: usize = 4096;

/// Slices sealed at once: the gathered bytes and as many of the crate's as tokio-util's
/// `poll_write_buf` hands over (64).
const SEAL_SLICES: usize = 65;

/// The socket and what waits to be written to it, shared by the crate's I/O handle
/// ([`CoalescedSock`]) and the connection's flusher ([`flush_due`]); both run on the
/// connection's task, so the lock is never contended.
pub(crate) struct Output(Mutex<Inner>);

struct Inner {
    /// Closes the connection's record just before the socket closes, however the connection
    /// ends: the record must be waiting before the kernel sees the close, or the probe's close
    /// event would find none. Fields drop in order: `_closed`, then `sock`.
    _closed: Closed,
    sock: ClientSock,
    buf: Vec<u8>,
    /// After the handshake: the crate's flushes only mark the buffer due.
    deferring: bool,
    /// The flusher, waiting for bytes.
    waker: Option<std::task::Waker>,
}

/// Closes the connection's record when dropped.
struct Closed(Arc<Accounting>, ConnId);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.conn_closed(self.1);
    }
}

impl Output {
    /// The connection's socket; `acc`'s record `id` is closed when the socket is dropped.
    pub(crate) fn new(sock: ClientSock, acc: Arc<Accounting>, id: ConnId) -> Arc<Output> {
        Arc::new(Output(Mutex::new(Inner {
            _closed: Closed(acc, id),
            sock,
            buf: Vec::new(),
            deferring: false,
            waker: None,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding it leaves bytes, not broken invariants: go on.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on the crate's flushes are deferred to [`flush_due`].
    pub(crate) fn defer_flushes(&self) {
        self.lock().deferring = true;
    }
}

impl Inner {
    /// Writes every waiting byte.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.buf.is_empty() {
            let n = ready!(Pin::new(&mut self.sock).poll_write(cx, &self.buf))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            debug_assert!(n <= self.buf.len());
            self.buf.drain(..n.min(self.buf.len()));
        }
        Poll::Ready(Ok(()))
    }

    /// Copies what fits of `bufs` (at most `room` bytes), waking the flusher if the buffer was
    /// empty; returns the bytes taken.
    fn append(&mut self, bufs: &[IoSlice<'_>], room: usize) -> usize {
        self.wake_flusher();
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(CAP);
        }
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(room - taken);
            self.buf.extend_from_slice(&b[..n]);
            taken += n;
            if taken == room {
                break;
            }
        }
        taken
    }

    /// The flusher waits only while nothing does (buffer empty, no sealed records), so it is
    /// woken by whatever adds the first bytes.
    fn wake_flusher(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// True when bytes wait for the flusher: in the buffer or sealed in rustls.
    fn waiting(&self) -> bool {
        !self.buf.is_empty() || self.sock.sealed_waiting()
    }

    /// Seals the gathered bytes and then `bufs` into TLS records, as much as rustls takes (a
    /// full rustls first writes its records to the socket); returns the bytes of `bufs` taken.
    /// Only for TLS in user space (an error otherwise).
    fn poll_seal(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        loop {
            let gathered = self.buf.len();
            let n = {
                // On the stack: a seal per DATA frame allocates nothing of ours. Slices past
                // the array's room are left for the crate's next write.
                let mut all = [IoSlice::new(&[]); SEAL_SLICES];
                let mut k = 0;
                if gathered > 0 {
                    all[0] = IoSlice::new(&self.buf);
                    k = 1;
                }
                for b in bufs.iter().filter(|b| !b.is_empty()).take(SEAL_SLICES - k) {
                    all[k] = IoSlice::new(b);
                    k += 1;
                }
                self.sock
                    .seal_vectored(&all[..k])
                    .unwrap_or_else(|| Err(io::ErrorKind::Unsupported.into()))?
            };
            if n == 0 {
                // rustls holds all it will: its records go to the socket first.
                ready!(Pin::new(&mut self.sock).poll_flush(cx))?;
                continue;
            }
            self.wake_flusher();
            let from_buf = n.min(gathered);
            self.buf.drain(..from_buf);
            if n > from_buf {
                return Poll::Ready(Ok(n - from_buf));
            }
        }
    }

    /// After the handshake a write of [`SEAL_AT`] or more over TLS in user space is sealed into
    /// rustls ([`Inner::poll_seal`]); every other write is copied into the buffer, as much as
    /// fits (a partial write, which the crate continues), a full buffer first written to the
    /// socket. Either way bytes then wait (in the buffer or in rustls), and the flusher, woken
    /// by them, ends with the socket's flush: nothing stays in the transport's own buffer with
    /// no one to send it.
    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if !self.deferring {
            ready!(self.poll_drain(cx))?;
            return Pin::new(&mut self.sock).poll_write_vectored(cx, bufs);
        }
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        if len >= SEAL_AT && matches!(self.sock, ClientSock::Tls(_)) {
            return self.poll_seal(cx, bufs);
        }
        loop {
            let room = CAP - self.buf.len();
            if room > 0 {
                return Poll::Ready(Ok(self.append(bufs, room)));
            }
            let n = ready!(Pin::new(&mut self.sock).poll_write(cx, &self.buf))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            debug_assert!(n <= self.buf.len());
            self.buf.drain(..n.min(self.buf.len()));
        }
    }
}

/// Writes, after every task ready now has run, whatever the crate has left waiting; runs for the
/// connection's life beside its loop. Ends only with the socket's error.
pub(crate) async fn flush_due(out: Arc<Output>) -> io::Result<()> {
    loop {
        std::future::poll_fn(|cx| {
            let mut inner = out.lock();
            if !inner.waiting() {
                inner.waker = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        tokio::task::yield_now().await;
        std::future::poll_fn(|cx| {
            let mut inner = out.lock();
            ready!(inner.poll_drain(cx))?;
            // Drained: the buffer goes, so an idle connection holds none.
            inner.buf = Vec::new();
            Pin::new(&mut inner.sock).poll_flush(cx)
        })
        .await?;
    }
}

/// Writes what waits and flushes the socket, at once: a connection's last frames when its loop
/// ends without the crate's shutdown (the client closed first, as a TLS client that sends no
/// close_notify does, when the last answers still wait for their turn).
pub(crate) async fn flush_now(out: &Output) -> io::Result<()> {
    std::future::poll_fn(|cx| {
        let mut inner = out.lock();
        ready!(inner.poll_drain(cx))?;
        Pin::new(&mut inner.sock).poll_flush(cx)
    })
    .await
}

/// The I/O handle the `h2` crate drives.
pub(crate) struct CoalescedSock(pub(crate) Arc<Output>);

impl AsyncRead for CoalescedSock {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.lock().sock).poll_read(cx, buf)
    }
}

impl AsyncWrite for CoalescedSock {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.lock().poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.lock().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut inner = self.0.lock();
        if inner.deferring {
            return Poll::Ready(Ok(()));
        }
        ready!(inner.poll_drain(cx))?;
        Pin::new(&mut inner.sock).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut inner = self.0.lock();
        ready!(inner.poll_drain(cx))?;
        Pin::new(&mut inner.sock).poll_shutdown(cx)
    }
}
