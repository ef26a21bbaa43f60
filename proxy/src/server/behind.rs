//! Serving a client from a fill in progress ([`Growing`]): the body goes from the cache file to
//! the socket with sendfile as the fill task writes it, so a miss is zero-copy too, and a client
//! that stops reading holds up only itself (see `cache::growing` for why).

use super::conn_error::ConnError;
use super::exchange::Exchange;
use crate::cache::growing::{Growing, Progress, Reader};
use crate::http::head::{CacheFields, CacheStatusField, Framing, Head};
use crate::http::request::RequestHead;
use crate::sendfile::SendfileError;
use std::time::{Duration, Instant};
use zerocache_ledger::{CacheStatus, DataPath, ResponseRecord};

impl Exchange<'_> {
    /// Sends the body of `g` as it grows, chunk-framed when `chunked` (the length is unknown and
    /// the client speaks HTTP/1.1). `wait` bounds each wait for more bytes (the fill has its own
    /// upstream timeouts; this only guards against a fill that stops publishing). Returns the
    /// body bytes sent, the chunk-framing bytes sent, and how it ended.
    pub async fn read_behind(
        &mut self,
        g: &Growing,
        mut r: Reader,
        chunked: bool,
        wait: Duration,
    ) -> (u64, u64, Result<(), ConnError>) {
        let ctx = self.c.ctx.clone();
        let mut sent = 0u64;
        let mut framing = 0u64;
        // Chunk-encoded for an HTTP/1.1 client; an h2 stream's end ends its body.
        let encode = chunked && !self.c.sock.is_h2();
        // A chunk's closing CRLF travels with the next chunk's size line: one send fewer.
        let mut pending_crlf = false;
        let mut p = r.now();
        loop {
            let avail = p.available();
            if avail > sent {
                let n = avail - sent;
                if encode {
                    let line = format!("{}{n:x}\r\n", if pending_crlf { "\r\n" } else { "" });
                    if let Err(e) = self.c.send_more(line.as_bytes()).await {
                        return (sent, framing, Err(e));
                    }
                    framing += line.len() as u64;
                    pending_crlf = true;
                }
                let offset = g.entry.body_offset + sent;
                let result = self
                    .c
                    .sock
                    .send_file(
                        &g.file,
                        offset,
                        n,
                        ctx.sending.sendfile_max_chunk,
                        ctx.client.send_timeout,
                        ctx.sending.copy_hits,
                    )
                    .await;
                match result {
                    Ok(k) => sent += k,
                    Err(SendfileError::Truncated { sent: k, .. }) => {
                        sent += k;
                        let e = ConnError::Aborted("fill file shorter than published".into());
                        return (sent, framing, Err(e));
                    }
                    Err(SendfileError::Io { sent: k, error }) => {
                        return (sent + k, framing, Err(error.into()));
                    }
                }
                p = r.now();
                continue;
            }
            match p {
                Progress::Done(_) => {
                    if chunked && let Err(e) = self.c.end_body().await {
                        return (sent, framing, Err(e));
                    }
                    if encode {
                        let end: &[u8] = if pending_crlf {
                            b"\r\n0\r\n\r\n"
                        } else {
                            b"0\r\n\r\n"
                        };
                        if let Err(e) = self.c.send(end).await {
                            return (sent, framing, Err(e));
                        }
                        framing += end.len() as u64;
                    }
                    return (sent, framing, Ok(()));
                }
                Progress::Failed(_) => {
                    let e = ConnError::Aborted("the fill this response read behind failed".into());
                    return (sent, framing, Err(e));
                }
                // The pump may need two upstream reads (a chunk-size line, then its data) before
                // it publishes anything, each allowed the upstream read timeout.
                Progress::Writing(_) => p = r.next(wait * 2).await,
            }
        }
    }

    /// Serves a follower from the fill another request started (RFC 9211 §2.7 `collapsed`):
    /// the stored head, framed by the known length or chunked, then the body as it grows.
    pub async fn serve_collapsed(
        &mut self,
        req: &RequestHead,
        g: &Growing,
        wait: Duration,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let e = &g.entry;
        let reader = g.reader();
        let chunked = g.length.is_none() && !req.http10;
        let close = req.close || (g.length.is_none() && req.http10);
        let ctx = self.c.ctx.clone();
        let mut h = Head::new(&mut self.c.head, e.meta.status, &e.meta.reason);
        if self.c.from_peer {
            h.lines(&ctx.store.tag_lines_for_peer(&e.meta.fields));
        }
        h.lines(&ctx.store.targeted().visible(&e.meta.fields))
            .framing(match g.length {
                Some(n) => Framing::Length(n),
                None if chunked => Framing::Chunked,
                None => Framing::None,
            })
            .age(e.age(crate::clock::now()).as_secs())
            // It sent nothing to the origin itself: a hit, as nginx counts requests that waited
            // on `proxy_cache_lock`; `Cache-Status` says how (RFC 9211 §2.7).
            .cache(&CacheFields {
                x_cache: CacheStatus::Hit.as_str(),
                upstream: None,
                member: Some(CacheStatusField {
                    collapsed: true,
                    ..CacheStatusField::fwd("miss")
                }),
            })
            .via_self();
        h.end(close);
        let mut head_bytes = self.c.head.len() as u64;
        let (body, framing, result) = match self.c.send_head().await {
            Ok(()) if req.method != "HEAD" => self.read_behind(g, reader, chunked, wait).await,
            sent => (0, 0, sent),
        };
        head_bytes += framing;
        self.c.record(&ResponseRecord {
            method: &req.method,
            target: &req.target,
            status: e.meta.status,
            cache_status: CacheStatus::Hit,
            head_bytes,
            body_bytes: body,
            path: DataPath::Zerocopy,
            duration: started.elapsed(),
            complete: result.is_ok(),
        });
        result?;
        Ok(!close)
    }
}
