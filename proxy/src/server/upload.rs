//! Request bodies: held in memory when small, streamed to the upstream when large.
//!
//! Why: a body buffered whole costs its size in memory per connection (forty 15 MiB uploads took
//! 609 MiB), so any client could make the proxy's memory its own. A body up to [`BUFFERED_MAX`]
//! is read before the upstream is asked (so a dead pooled connection can be retried with it); a
//! larger one is read piece by piece while it is sent, with `limits.read_timeout` between reads
//! (408 when a client trickles slower) and `limits.max_body_bytes` in total (413).
//!
//! A per-read timeout alone lets a client hold a connection forever by sending a byte just inside
//! every timeout. So the whole body also has a deadline that grows with what arrived, Apache
//! mod_reqtimeout's `MinRate`: `read_timeout` plus one second per `limits.body_min_rate` bytes
//! received since the body started; a read that would wait past it is a 408 too.

use super::conn_error::ConnError;
use super::conn_state::Conn;
use super::request_body::{BUFFERED_MAX, BodyError, BodySource, Remaining, RequestBody};
use crate::http::chunked::ChunkedDecoder;
use crate::http::request::{BodyFraming, RequestHead};
use std::time::Duration;
use tokio::io::AsyncReadExt;

impl Conn {
    /// What the client sent past the request's head and the loop has not used: a tunnel's first
    /// bytes, once the origin has answered 101.
    pub(super) fn take_unread(&mut self) -> bytes::BytesMut {
        self.buf.split()
    }

    /// Reads the request body, sending `100 Continue` first when asked: whole when it is small,
    /// the start of it when it is not. `Ok(None)`: the body was refused and answered (408, 413,
    /// 400); the connection must close.
    pub async fn read_body(&mut self, req: &RequestHead) -> Result<Option<RequestBody>, ConnError> {
        if req.body == BodyFraming::None {
            return Ok(Some(RequestBody::Whole(Vec::new())));
        }
        if let BodyFraming::Length(n) = req.body
            && n > self.ctx.client.max_body
        {
            self.reject(413).await;
            return Ok(None);
        }
        if req.expect_continue && self.buf.is_empty() {
            // The interim answer to `Expect: 100-continue`.
            crate::http::head::Head::standard(&mut self.head, 100).end(false);
            self.send_head().await?;
        }
        self.body_pace = Some((tokio::time::Instant::now(), 0));
        let mut rest = match req.body {
            BodyFraming::Length(n) => Remaining::Length { left: n, total: n },
            BodyFraming::EndStream => Remaining::EndStream { seen: 0 },
            _ => Remaining::Chunked {
                decoder: ChunkedDecoder::default(),
                seen: 0,
            },
        };
        let mut first = Vec::new();
        loop {
            match self.body_piece(&mut rest, &mut first).await {
                Ok(true) => return Ok(Some(RequestBody::Whole(first))),
                Ok(false) if first.len() > BUFFERED_MAX => {
                    return Ok(Some(RequestBody::Streaming { first, rest }));
                }
                Ok(false) => {}
                Err(e) => return self.refuse_body(req, e).await.map(|_| None),
            }
        }
    }

    /// Answers a body that could not be read (408, 400, 413) and closes, or reports the client
    /// gone. A client that left mid-body was sent nothing, yet its request gets its access-log
    /// line, with nginx's 499 (client closed request): every request has one.
    pub async fn refuse_body(&mut self, req: &RequestHead, e: BodyError) -> Result<(), ConnError> {
        match e.status() {
            Some(status) => {
                tracing::info!(conn = self.id, status, "request body refused");
                self.reject(status).await;
                Ok(())
            }
            None => match e {
                BodyError::Gone(e) => {
                    self.head.clear();
                    self.record_client_gone(req);
                    Err(e)
                }
                _ => Ok(()),
            },
        }
    }

    /// Reads more of the body into `buf`, within its deadline; the client's close mid-body is
    /// an error.
    async fn body_read(&mut self, timeout: Duration) -> Result<(), BodyError> {
        match self.body_read_or_end(timeout).await? {
            0 => Err(BodyError::Gone(ConnError::Aborted(
                "client closed mid-body".into(),
            ))),
            _ => Ok(()),
        }
    }

    /// Reads more of the body into `buf`, within its deadline: how many bytes, 0 at the end of
    /// the stream (an HTTP/2 body without `content-length` ends so).
    async fn body_read_or_end(&mut self, timeout: Duration) -> Result<usize, BodyError> {
        self.buf.reserve(16 * 1024);
        let deadline = self.body_deadline(timeout);
        match tokio::time::timeout_at(deadline, self.sock.read_buf(&mut self.buf)).await {
            Ok(Ok(n)) => {
                if let Some((_, received)) = &mut self.body_pace {
                    *received += n as u64;
                }
                Ok(n)
            }
            Ok(Err(e)) => Err(BodyError::Gone(e.into())),
            Err(_) => Err(BodyError::Timeout),
        }
    }

    /// When the next read of the body must have returned: `timeout` from now, and no later than
    /// the body's own deadline under `limits.body_min_rate` (see the module doc).
    fn body_deadline(&self, timeout: Duration) -> tokio::time::Instant {
        let per_read = tokio::time::Instant::now() + timeout;
        match (self.body_pace, self.ctx.client.body_min_rate) {
            (Some((started, received)), rate) if rate > 0 => {
                let earned = Duration::from_secs_f64(received as f64 / rate as f64);
                per_read.min(started + timeout + earned)
            }
            _ => per_read,
        }
    }
}

impl BodySource for Conn {
    async fn body_piece(
        &mut self,
        rest: &mut Remaining,
        out: &mut Vec<u8>,
    ) -> Result<bool, BodyError> {
        let timeout = self.ctx.client.read_timeout;
        let max = self.ctx.client.max_body;
        match rest {
            Remaining::Length { left, .. } => {
                if *left == 0 {
                    return Ok(true);
                }
                if self.buf.is_empty() {
                    self.body_read(timeout).await?;
                }
                let n = (*left).min(self.buf.len() as u64) as usize;
                out.extend_from_slice(&self.buf.split_to(n));
                *left -= n as u64;
                Ok(*left == 0)
            }
            Remaining::Chunked { decoder, seen } => {
                let before = out.len();
                let done = decoder
                    .decode(&mut self.buf, out)
                    .map_err(|_| BodyError::Invalid)?;
                *seen += (out.len() - before) as u64;
                if *seen > max {
                    return Err(BodyError::TooLarge);
                }
                if !done && out.len() == before {
                    self.body_read(timeout).await?;
                }
                Ok(done)
            }
            Remaining::EndStream { seen } => {
                if self.buf.is_empty() && self.body_read_or_end(timeout).await? == 0 {
                    return Ok(true);
                }
                *seen += self.buf.len() as u64;
                if *seen > max {
                    return Err(BodyError::TooLarge);
                }
                out.extend_from_slice(&self.buf.split());
                Ok(false)
            }
        }
    }
}
