//! The client's socket, plain, TLS in the kernel (kTLS) or TLS in user space, and the three ways
//! a response leaves through it: a small buffer, a head that a file body follows, and a body
//! from a cache file.
//!
//! The plain socket keeps its exact syscalls: the head in one send(2) with `MSG_MORE` and the
//! body with sendfile(2) ([`crate::sendfile`]); this type only chooses. A kTLS socket takes the
//! very same syscalls (the kernel makes the records; `MSG_MORE` keeps the head's record open
//! for the body's first bytes). A TLS socket without kTLS cannot use sendfile: the file is read
//! in large chunks and written through rustls, which encrypts in user space, and the accounting
//! calls that a copy by design (`tls-userspace`).
//! The head is queued in rustls and leaves with the body's first write, as `MSG_MORE` does for
//! the plain socket.

use super::h2_stream::{H2Out, H2StreamSock};
use crate::sendfile::{self, SendfileError};
use crate::tls::ktls::handshake_io::HandshakeIo;
use crate::tls::ktls::stream::KtlsStream;
use crate::tls::server::Handshaken;
use std::fs::File;
use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use zerocache_ledger::{TlsTransport, UserspaceReason};

/// Plaintext read from a cache file per write into rustls: large, so a 16 MiB hit is 64 reads
/// and rustls cuts records of 16 KiB from each chunk without a partial record per chunk.
const TLS_FILE_CHUNK: usize = 256 * 1024;

/// File buffers a worker keeps for its next TLS bodies. A connection holds one only while it
/// sends a body: idle keep-alive connections hold none, so the memory is bounded by the bodies
/// in flight (plus these few), not by the connections open.
const SPARE_BUFFERS: usize = 4;

thread_local! {
    /// This worker's spare file buffers (each worker is one thread, its connections stay on it).
    static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A file buffer of [`TLS_FILE_CHUNK`] bytes, a spare one if the worker has one.
fn take_buffer() -> Vec<u8> {
    SPARE
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; TLS_FILE_CHUNK])
}

/// Gives a buffer back to the worker's spares (dropped when it has enough).
fn give_back(buf: Vec<u8>) {
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_BUFFERS {
            s.push(buf);
        }
    });
}

/// A client connection's transport.
pub enum ClientSock {
    /// Plain TCP: sendfile for bodies.
    Plain(TcpStream),
    /// TLS whose keys were handed to the kernel: a plain socket for sending.
    Ktls(Box<KtlsClient>),
    /// TLS in user space (rustls).
    Tls(Box<TlsClient>),
    /// One HTTP/2 stream, which the HTTP/1.1 request path serves as a connection of its own
    /// (see `server/h2`): heads go to the stream's driver as fields and bodies as chunks, so
    /// bodies are copied by design.
    H2Stream(Box<H2StreamSock>),
}

/// A TLS client connection in user space.
pub struct TlsClient {
    stream: tokio_rustls::server::TlsStream<HandshakeIo>,
    /// The certificate served, with `tls.strict_sni` on.
    served: Option<crate::tls::server::Served>,
    /// Why not kTLS.
    why: UserspaceReason,
}

/// A kTLS client connection.
pub struct KtlsClient {
    stream: KtlsStream,
    served: Option<crate::tls::server::Served>,
}

impl From<Handshaken> for ClientSock {
    /// A completed TLS handshake, in user space or handed to the kernel.
    fn from(h: Handshaken) -> ClientSock {
        match h {
            Handshaken::Userspace {
                stream,
                served,
                why,
            } => ClientSock::Tls(Box::new(TlsClient {
                stream: *stream,
                served,
                why,
            })),
            Handshaken::Kernel { stream, served } => {
                ClientSock::Ktls(Box::new(KtlsClient { stream, served }))
            }
        }
    }
}

impl ClientSock {
    /// True for a TLS connection (with `tls.strict_sni`) whose certificate does not name
    /// `host`: the request belongs on another connection (421, RFC 9110 §15.5.20).
    pub fn misdirected(&self, host: &str) -> bool {
        let served = match self {
            ClientSock::Tls(t) => &t.served,
            ClientSock::Ktls(t) => &t.served,
            ClientSock::H2Stream(t) => &t.served,
            ClientSock::Plain(_) => return false,
        };
        served.as_ref().is_some_and(|s| !s.covers_host(host))
    }

    /// TLS in user space only (else `None`): encrypts what rustls will take of `bufs` into
    /// records that wait in it, without writing the socket; the slices are sealed together, a
    /// frame's header and payload into one record, copied once into it. The records leave with
    /// the next write or flush. `Ok(0)`: rustls holds all it will (64 KiB), flush first.
    pub(crate) fn seal_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> Option<io::Result<usize>> {
        match self {
            ClientSock::Tls(t) => Some(t.stream.get_mut().1.writer().write_vectored(bufs)),
            _ => None,
        }
    }

    /// True when records sealed by [`ClientSock::seal_vectored`] (or any rustls output) wait.
    pub(crate) fn sealed_waiting(&self) -> bool {
        match self {
            ClientSock::Tls(t) => t.stream.get_ref().1.wants_write(),
            _ => false,
        }
    }

    /// The TCP socket underneath (none for an HTTP/2 stream: the connection's driver has it).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ClientSock::Plain(s) => Some(s),
            ClientSock::Ktls(t) => Some(t.stream.tcp()),
            ClientSock::Tls(t) => Some(t.stream.get_ref().0.tcp()),
            ClientSock::H2Stream(_) => None,
        }
    }

    /// Whether the connection is TLS (in the kernel or in user space): its scheme is https.
    pub fn is_tls(&self) -> bool {
        match self {
            ClientSock::Plain(_) => false,
            ClientSock::H2Stream(t) => t.tls,
            _ => true,
        }
    }

    /// Whether this is an HTTP/2 stream.
    pub fn is_h2(&self) -> bool {
        matches!(self, ClientSock::H2Stream(_))
    }

    /// What a TLS connection's handshake agreed, for the access log.
    pub fn tls_info(&self) -> Option<std::sync::Arc<crate::accesslog::TlsInfo>> {
        self.served().map(|s| s.info)
    }

    /// What a TLS connection's handshake agreed, and the certificate it was served (with
    /// `tls.strict_sni`).
    pub fn served(&self) -> Option<crate::tls::server::Served> {
        match self {
            ClientSock::Tls(t) => t.served.clone(),
            ClientSock::Ktls(t) => t.served.clone(),
            ClientSock::H2Stream(t) => t.served.clone(),
            ClientSock::Plain(_) => None,
        }
    }

    /// How a TLS connection's records are made (None for plain, and for a stream: its
    /// connection's record says it).
    pub fn tls_transport(&self) -> Option<TlsTransport> {
        match self {
            ClientSock::Plain(_) | ClientSock::H2Stream(_) => None,
            ClientSock::Ktls(_) => Some(TlsTransport::Ktls),
            ClientSock::Tls(t) => Some(TlsTransport::Userspace(t.why)),
        }
    }

    /// Why a body declared zero-copy is copied by design on this transport: TLS in user space,
    /// or an HTTP/2 stream (None: it goes by sendfile).
    pub fn copies_by_design(&self) -> Option<zerocache_ledger::CopyReason> {
        match self {
            ClientSock::Tls(_) => Some(zerocache_ledger::CopyReason::TlsUserspace),
            ClientSock::H2Stream(_) => Some(zerocache_ledger::CopyReason::H2),
            ClientSock::Plain(_) | ClientSock::Ktls(_) => None,
        }
    }

    /// Bytes a kTLS transport wrote that are neither heads nor bodies (the handshake, the
    /// closing alert) since the last call; 0 otherwise.
    pub fn take_control_bytes(&mut self) -> u64 {
        match self {
            ClientSock::Ktls(t) => t.stream.take_control_bytes(),
            _ => 0,
        }
    }

    /// Writes all of `buf`, within `timeout` per write that makes progress.
    pub async fn send_all(&mut self, buf: &[u8], timeout: Duration) -> io::Result<()> {
        match self {
            ClientSock::Plain(s) => sendfile::send_all(s, buf, timeout).await,
            ClientSock::Ktls(t) => sendfile::send_all(t.stream.tcp(), buf, timeout).await,
            ClientSock::Tls(t) => {
                t.write_all(buf, timeout).await?;
                t.flush(timeout).await
            }
            ClientSock::H2Stream(t) => t.send_body(buf, timeout).await,
        }
    }

    /// Sends the response head in `head`, and the body of an answer the proxy made after it:
    /// bytes on an HTTP/1.1 connection (`more` when a file body follows: see [`Self::send_head`]),
    /// the head's fields to an h2 stream's driver.
    pub async fn send_response_head(
        &mut self,
        head: &mut crate::http::head::HeadBuf,
        more: bool,
        timeout: Duration,
    ) -> io::Result<()> {
        match self {
            ClientSock::H2Stream(t) => {
                if let Some(h) = head.take_h2() {
                    t.send(H2Out::Head(Box::new(h)), timeout).await?;
                }
                if !head.wire().is_empty() {
                    t.send_body(head.wire(), timeout).await?;
                }
                Ok(())
            }
            _ if more => self.send_head(head.wire(), timeout).await,
            _ => self.send_all(head.wire(), timeout).await,
        }
    }

    /// Ends a body whose length its head did not say: an h2 stream's driver ends the stream;
    /// HTTP/1.1 needs nothing here (its last chunk, or the close, says it).
    pub async fn end_body(&mut self, timeout: Duration) -> io::Result<()> {
        match self {
            ClientSock::H2Stream(t) => t.send(H2Out::End, timeout).await,
            _ => Ok(()),
        }
    }

    /// Sends a head that a file body follows: plain, one send(2) with `MSG_MORE`; TLS, queued in
    /// rustls to leave with the body's first write.
    pub async fn send_head(&mut self, head: &[u8], timeout: Duration) -> io::Result<()> {
        match self {
            ClientSock::Plain(s) => sendfile::send_head(s, head, timeout).await,
            ClientSock::Ktls(t) => sendfile::send_head(t.stream.tcp(), head, timeout).await,
            ClientSock::Tls(t) => {
                let queued = t.stream.get_mut().1.writer().write(head)?;
                t.write_all(&head[queued..], timeout).await
            }
            ClientSock::H2Stream(t) => t.send_body(head, timeout).await,
        }
    }

    /// Sends `len` bytes of `file` from `offset`: plain, with sendfile (or read+write when
    /// `copy`, the planted bug); TLS, read in large chunks and written through rustls. Returns
    /// the bytes sent (always `len` on success).
    pub async fn send_file(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
        max_chunk: u64,
        timeout: Duration,
        copy: bool,
    ) -> Result<u64, SendfileError> {
        match self {
            ClientSock::Plain(s) if copy => {
                sendfile::send_by_copy(s, file, offset, len, timeout).await
            }
            ClientSock::Plain(s) => sendfile::send(s, file, offset, len, max_chunk, timeout).await,
            ClientSock::Ktls(t) if copy => {
                sendfile::send_by_copy(t.stream.tcp(), file, offset, len, timeout).await
            }
            ClientSock::Ktls(t) => {
                sendfile::send(t.stream.tcp(), file, offset, len, max_chunk, timeout).await
            }
            ClientSock::Tls(t) => t.send_file(file, offset, len, timeout).await,
            ClientSock::H2Stream(t) => t.send_file(file, offset, len, timeout).await,
        }
    }
}

/// Writes all of `buf` to `w`, within `timeout` per write that makes progress.
async fn write_all_within<W: AsyncWrite + Unpin>(
    w: &mut W,
    buf: &[u8],
    timeout: Duration,
) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = tokio::time::timeout(timeout, w.write(&buf[done..]))
            .await
            .map_err(|_| timed_out())??;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n;
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` through `w` in large chunks read from the page
/// cache: the path of every transport that cannot take sendfile.
async fn copy_file<W: AsyncWrite + Unpin>(
    w: &mut W,
    file: &File,
    offset: u64,
    len: u64,
    timeout: Duration,
) -> Result<u64, SendfileError> {
    let mut buf = take_buffer();
    let mut sent = 0u64;
    let result = async {
        while sent < len {
            // The pages are resident (cold hits are read in on the blocking pool first), so
            // this read copies from the page cache without waiting for the disk.
            let n = crate::sendfile::read_piece(file, &mut buf, offset, sent, len)?;
            write_all_within(w, &buf[..n], timeout)
                .await
                .map_err(|error| SendfileError::Io { sent, error })?;
            sent += n as u64;
            if sent < len {
                // A chunk written: let other connections on this worker run.
                tokio::task::yield_now().await;
            }
        }
        tokio::time::timeout(timeout, w.flush())
            .await
            .map_err(|_| timed_out())
            .and_then(|r| r)
            .map_err(|error| SendfileError::Io { sent, error })?;
        Ok(sent)
    }
    .await;
    give_back(buf);
    result
}

pub(super) fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "client took no bytes within send_timeout",
    )
}

impl TlsClient {
    async fn write_all(&mut self, buf: &[u8], timeout: Duration) -> io::Result<()> {
        write_all_within(&mut self.stream, buf, timeout).await
    }

    async fn flush(&mut self, timeout: Duration) -> io::Result<()> {
        tokio::time::timeout(timeout, self.stream.flush())
            .await
            .map_err(|_| timed_out())?
    }

    async fn send_file(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
        timeout: Duration,
    ) -> Result<u64, SendfileError> {
        copy_file(&mut self.stream, file, offset, len, timeout).await
    }
}

impl AsyncRead for ClientSock {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientSock::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientSock::Ktls(t) => Pin::new(&mut t.stream).poll_read(cx, buf),
            ClientSock::Tls(t) => Pin::new(&mut t.stream).poll_read(cx, buf),
            ClientSock::H2Stream(t) => t.poll_body(cx, buf),
        }
    }
}

impl AsyncWrite for ClientSock {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientSock::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientSock::Ktls(t) => Pin::new(&mut t.stream).poll_write(cx, buf),
            ClientSock::Tls(t) => Pin::new(&mut t.stream).poll_write(cx, buf),
            ClientSock::H2Stream(t) => {
                std::task::ready!(t.out.poll_reserve(cx))
                    .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
                t.out
                    .send_item(H2Out::Data(bytes::Bytes::copy_from_slice(buf)))
                    .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
                Poll::Ready(Ok(buf.len()))
            }
        }
    }

    /// Vectored where the transport is: over rustls, slices written together are sealed into
    /// the same records, so a frame's header and its payload make one record, not two.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match &mut *this {
            ClientSock::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientSock::Ktls(t) => Pin::new(&mut t.stream).poll_write_vectored(cx, bufs),
            ClientSock::Tls(t) => Pin::new(&mut t.stream).poll_write_vectored(cx, bufs),
            ClientSock::H2Stream(_) => {
                let buf = bufs
                    .iter()
                    .find(|b| !b.is_empty())
                    .map_or(&[][..], |b| &**b);
                Pin::new(this).poll_write(cx, buf)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        !matches!(self, ClientSock::H2Stream(_))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientSock::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientSock::Ktls(t) => Pin::new(&mut t.stream).poll_flush(cx),
            ClientSock::Tls(t) => Pin::new(&mut t.stream).poll_flush(cx),
            ClientSock::H2Stream(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientSock::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientSock::Ktls(t) => Pin::new(&mut t.stream).poll_shutdown(cx),
            ClientSock::Tls(t) => Pin::new(&mut t.stream).poll_shutdown(cx),
            ClientSock::H2Stream(t) => {
                t.out.close();
                Poll::Ready(Ok(()))
            }
        }
    }
}
