//! The request path's end of an HTTP/2 stream: where [`ClientSock::H2Stream`] reads a request's
//! body from and sends a response to. The stream's driver (`server::h2::stream`) holds the other
//! end: the request's DATA frames come from the `h2` crate's receive stream, with the window given
//! back as they are read; heads go to the driver as fields ([`H2Out::Head`]), never as bytes, and
//! bodies as chunks, read from a cache file or copied from an origin only as far as the client's
//! window and the connection's budget allow.
//!
//! [`ClientSock::H2Stream`]: super::client_sock::ClientSock::H2Stream

use super::client_sock::timed_out;
use crate::sendfile::SendfileError;
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::ReadBuf;

/// The request path's end of an HTTP/2 stream, with what it keeps of the connection: the
/// request's head arrives converted (see `server::h2::request`) and its body is read from the
/// stream's DATA frames; the response leaves as chunks on a channel, so a cache file's body is
/// read once into the chunk that becomes the DATA frames' payload.
pub(crate) struct H2StreamSock {
    /// The request's body, until its stream ends (`None` once it has, or when HEADERS ended it).
    pub body: Option<h2::RecvStream>,
    /// DATA received and not yet read by the request path (the flow-control window is given
    /// back only as it is).
    pub pending: bytes::Bytes,
    /// The response, to the stream's driver (bounded: one message in flight).
    pub out: tokio_util::sync::PollSender<H2Out>,
    /// The connection is TLS (h2 by ALPN) rather than h2c.
    pub tls: bool,
    /// The certificate the connection was served, with `tls.strict_sni`.
    pub served: Option<crate::tls::server::Served>,
    /// Bytes of response this side may read ahead (from a cache file, or copy from an origin):
    /// what the client's window has room for, granted by the stream's driver, and a head's
    /// worth before it knows. A stream whose window stays shut reads nothing more: its body
    /// waits in the file, not in memory.
    pub credit: Arc<tokio::sync::Semaphore>,
    /// The connection's budget, in KiB, of response bytes read for its streams and not yet
    /// taken by the socket's writer: each chunk holds its share until `h2` drops it.
    pub budget: Arc<tokio::sync::Semaphore>,
}

/// What the request path sends an HTTP/2 stream's driver: heads as fields, never as bytes.
#[derive(Debug)]
pub(crate) enum H2Out {
    /// A response head: interim (1xx) or final.
    Head(Box<crate::http::head::H2Head>),
    /// Body bytes.
    Data(bytes::Bytes),
    /// The body whose length its head did not say has ended.
    End,
}

/// Chunks of a cache file sent to an HTTP/2 stream: a DATA frame's worth several times over,
/// and small enough that 128 streams each holding one stay within 8 MiB per connection.
const H2_FILE_CHUNK: usize = 64 * 1024;

/// A chunk of an h2 stream's response with its share of the connection's budget, given back
/// when the last piece of it is dropped (by `h2`, once written, or with a reset stream).
struct Held {
    bytes: bytes::Bytes,
    _budget: tokio::sync::OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl H2StreamSock {
    /// Reads the request's body: what is pending of the last DATA frame, else the next one; at
    /// the stream's end, nothing (EOF). Each byte read gives its window back to the client.
    pub(super) fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending.split_to(n));
                if let Some(body) = &mut self.body {
                    let _ = body.flow_control().release_capacity(n);
                }
                return Poll::Ready(Ok(()));
            }
            let Some(body) = &mut self.body else {
                return Poll::Ready(Ok(()));
            };
            match std::task::ready!(body.poll_data(cx)) {
                Some(Ok(data)) => self.pending = data,
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                None => {
                    self.body = None;
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }

    /// Waits, within `timeout` each, for credit from the client's window and for the
    /// connection's budget, for at most `want` bytes: returns how many may be read (at least 1)
    /// and the budget held for them.
    async fn room(
        &self,
        want: usize,
        timeout: Duration,
    ) -> io::Result<(usize, tokio::sync::OwnedSemaphorePermit)> {
        let gone = || io::Error::from(io::ErrorKind::BrokenPipe);
        tokio::time::timeout(timeout, self.credit.acquire())
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| gone())?
            .forget();
        let more = want.saturating_sub(1).min(self.credit.available_permits());
        let more = match u32::try_from(more).map(|m| self.credit.try_acquire_many(m)) {
            Ok(Ok(p)) => {
                p.forget();
                more
            }
            _ => 0,
        };
        let n = 1 + more;
        let kib = u32::try_from(n.div_ceil(1024)).map_err(|_| gone())?;
        let held = tokio::time::timeout(timeout, self.budget.clone().acquire_many_owned(kib))
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| gone())?;
        Ok((n, held))
    }

    /// Sends `buf` as body, in pieces as credit and budget allow.
    pub(super) async fn send_body(&mut self, mut buf: &[u8], timeout: Duration) -> io::Result<()> {
        while !buf.is_empty() {
            let (n, held) = self.room(buf.len().min(H2_FILE_CHUNK), timeout).await?;
            let bytes = bytes::Bytes::copy_from_slice(&buf[..n]);
            self.send(H2Out::Data(held_bytes(bytes, held)), timeout)
                .await?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// Sends one message, within `timeout` for the channel to take it.
    pub(super) async fn send(&mut self, chunk: H2Out, timeout: Duration) -> io::Result<()> {
        let gone = || io::Error::from(io::ErrorKind::BrokenPipe);
        tokio::time::timeout(
            timeout,
            std::future::poll_fn(|cx| self.out.poll_reserve(cx)),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(|_| gone())?;
        self.out.send_item(chunk).map_err(|_| gone())
    }

    /// Sends `len` bytes of `file` from `offset`, each chunk read once into the buffer that
    /// leaves as DATA.
    pub(super) async fn send_file(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
        timeout: Duration,
    ) -> Result<u64, SendfileError> {
        let mut sent = 0u64;
        while sent < len {
            let want = (len - sent).min(H2_FILE_CHUNK as u64) as usize;
            let (room, held) = self
                .room(want, timeout)
                .await
                .map_err(|error| SendfileError::Io { sent, error })?;
            let mut buf = bytes::BytesMut::new();
            let n = crate::sendfile::read_piece_into(file, &mut buf, room, offset, sent, len)?;
            self.send(H2Out::Data(held_bytes(buf.freeze(), held)), timeout)
                .await
                .map_err(|error| SendfileError::Io { sent, error })?;
            sent += n as u64;
        }
        Ok(sent)
    }
}

/// `bytes` holding `budget` until its last piece is dropped.
fn held_bytes(bytes: bytes::Bytes, budget: tokio::sync::OwnedSemaphorePermit) -> bytes::Bytes {
    bytes::Bytes::from_owner(Held {
        bytes,
        _budget: budget,
    })
}
