//! Reading an upstream response body in pieces, whatever its framing, with the read timeout
//! between pieces. A body that ends before its announced length is an error, never a short success.

use super::error::UpstreamError;
use super::pool::UpstreamConn;
use crate::http::chunked::ChunkedDecoder;
use crate::http::response::BodyFraming;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Largest piece handed out at once.
const PIECE: usize = 256 * 1024;

/// Reads one response body.
pub struct BodyReader {
    framing: BodyFraming,
    remaining: u64,
    decoder: ChunkedDecoder,
    done: bool,
    timeout: Duration,
}

impl BodyReader {
    /// A reader for a body framed as `framing`.
    pub fn new(framing: BodyFraming, timeout: Duration) -> BodyReader {
        let (remaining, done) = match framing {
            BodyFraming::None => (0, true),
            BodyFraming::Length(n) => (n, n == 0),
            BodyFraming::Chunked | BodyFraming::Close => (0, false),
        };
        BodyReader {
            framing,
            remaining,
            decoder: ChunkedDecoder::default(),
            done,
            timeout,
        }
    }

    /// True once the whole body has been read.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether the connection can be reused after the body.
    pub fn reusable(&self) -> bool {
        self.done && self.framing != BodyFraming::Close
    }

    /// Reads the next piece of body into `out` (cleared first). Returns `Ok(())` with `out`
    /// possibly empty only when the body is done.
    pub async fn next(
        &mut self,
        conn: &mut UpstreamConn,
        out: &mut Vec<u8>,
    ) -> Result<(), UpstreamError> {
        out.clear();
        while !self.done && out.is_empty() {
            match self.framing {
                BodyFraming::None => self.done = true,
                BodyFraming::Length(_) => {
                    if conn.buf.is_empty() {
                        self.fill(conn, false).await?;
                    }
                    let n = (self.remaining as usize).min(conn.buf.len()).min(PIECE);
                    out.extend_from_slice(&conn.buf.split_to(n));
                    self.remaining -= n as u64;
                    self.done = self.remaining == 0;
                }
                BodyFraming::Chunked => {
                    let finished = self
                        .decoder
                        .decode(&mut conn.buf, out)
                        .map_err(|e| UpstreamError::Protocol(e.to_string()))?;
                    if finished {
                        self.done = true;
                    } else if out.is_empty() {
                        self.fill(conn, false).await?;
                    }
                }
                BodyFraming::Close => {
                    if conn.buf.is_empty() && !self.fill(conn, true).await? {
                        self.done = true;
                    }
                    let n = conn.buf.len().min(PIECE);
                    out.extend_from_slice(&conn.buf.split_to(n));
                }
            }
        }
        Ok(())
    }

    /// Reads more into the connection buffer. Returns false on a clean EOF when EOF ends the body.
    async fn fill(&mut self, conn: &mut UpstreamConn, eof_ok: bool) -> Result<bool, UpstreamError> {
        if conn.buf.capacity() - conn.buf.len() < 16 * 1024 {
            conn.buf.reserve(PIECE);
        }
        match tokio::time::timeout(self.timeout, conn.stream.read_buf(&mut conn.buf)).await {
            Err(_) => Err(UpstreamError::Timeout(self.timeout)),
            Ok(Ok(0)) if eof_ok => Ok(false),
            Ok(Ok(0)) => Err(UpstreamError::Truncated),
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) => Err(e.into()),
        }
    }
}
