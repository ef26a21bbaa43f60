//! A cache hit: the response head in one send, then the body straight from the page cache to the
//! socket with sendfile. The head is the entry's prebuilt bytes plus a few dynamic fields, built
//! in the connection's reused buffer: no allocation proportional to the body, no read(2) of the
//! file's header, no open(2) when the open-file cache holds the file.

use super::conn::{Conn, ConnError};
use crate::cache::entry::Entry;
use crate::http::headers::{put, put_num};
use crate::http::range::{self, RangeAnswer};
use crate::http::request::RequestHead;
use crate::sendfile::{self, SendfileError};
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use tokio::io::AsyncWriteExt;
use zerocache_dashboard::{CacheStatus, DataPath, ResponseRecord};

/// What became of a hit attempt.
pub enum HitOutcome {
    /// Answered; keep the connection or not.
    Served(bool),
    /// The entry's file vanished before anything was sent: treat as a miss.
    Gone,
}

impl Conn {
    /// Serves `e` for `req`. `coalesced`: this request waited for another request's fill.
    pub async fn serve_hit(
        &mut self,
        req: &RequestHead,
        e: &Arc<Entry>,
        coalesced: bool,
        started: Instant,
    ) -> Result<HitOutcome, ConnError> {
        let ctx = self.ctx.clone();
        let head_only = req.method == "HEAD";
        // Open before sending anything, so a vanished file can still become a miss.
        let file = if head_only {
            None
        } else {
            match ctx.store.open_file(e) {
                Ok(f) => Some(f),
                Err(err) => {
                    tracing::warn!(path = %e.path.display(), error = %err, "cache file vanished; refetching");
                    return Ok(HitOutcome::Gone);
                }
            }
        };
        let answer = if req.method == "GET" && e.meta.status == 200 {
            range::answer(req.field("range"), e.body_len)
        } else {
            RangeAnswer::Full
        };
        let age = e.age(SystemTime::now()).as_secs();
        let h = &mut self.head;
        h.clear();
        let (start, len, status) = match answer {
            RangeAnswer::Full => {
                h.extend_from_slice(&e.hit_head);
                (0, e.body_len, e.meta.status)
            }
            RangeAnswer::Partial { start, end } => {
                h.extend_from_slice(b"HTTP/1.1 206 Partial Content\r\n");
                h.extend_from_slice(&e.meta.fields);
                put(
                    h,
                    "Content-Range",
                    format!("bytes {start}-{end}/{}", e.body_len).as_bytes(),
                );
                put_num(h, "Content-Length", end - start + 1);
                (start, end - start + 1, 206)
            }
            RangeAnswer::Unsatisfiable => {
                h.extend_from_slice(b"HTTP/1.1 416 Range Not Satisfiable\r\n");
                h.extend_from_slice(&e.meta.fields);
                put(
                    h,
                    "Content-Range",
                    format!("bytes */{}", e.body_len).as_bytes(),
                );
                put_num(h, "Content-Length", 0);
                (0, 0, 416)
            }
        };
        put_num(h, "Age", age);
        h.extend_from_slice(b"X-Cache: HIT\r\n");
        if coalesced {
            h.extend_from_slice(b"Cache-Status: zerocache; hit; detail=coalesced\r\n");
        } else {
            h.extend_from_slice(b"Cache-Status: zerocache; hit\r\n");
        }
        h.extend_from_slice(b"Via: 1.1 zerocache\r\n");
        if req.close {
            h.extend_from_slice(b"Connection: close\r\n");
        }
        h.extend_from_slice(b"\r\n");
        self.sock.write_all(&self.head).await?;
        let head_bytes = self.head.len() as u64;
        let mut sent = 0;
        if let Some(file) = file.as_ref().filter(|_| len > 0) {
            let offset = e.body_offset + start;
            // Cold pages are read in on the blocking pool, so sendfile never waits for the disk
            // on a runtime thread (see `residency`). Entries hit in the last second skip the check.
            let now_ms = crate::server::uptime_ms();
            let last = e
                .last_hit_ms
                .swap(now_ms, std::sync::atomic::Ordering::Relaxed);
            if (last == 0 || now_ms.saturating_sub(last) > 1000)
                && !crate::residency::resident(file, offset, len)
            {
                ctx.accounting.cold_offload();
                crate::residency::warm(file.clone(), offset, len).await;
            }
            let result = if ctx.copy_hits {
                sendfile::send_by_copy(&self.sock, file, offset, len).await
            } else {
                sendfile::send(&self.sock, file, offset, len, ctx.sendfile_max_chunk).await
            };
            match result {
                Ok(n) => sent = n,
                Err(SendfileError::Truncated { sent: s, expected }) => {
                    tracing::warn!(path = %e.path.display(), sent = s, expected, "cache file truncated underneath; dropping entry and closing");
                    ctx.store.remove_if_same(e);
                    self.record_hit(req, status, head_bytes, s, started);
                    return Err(ConnError::Aborted("truncated cache file".into()));
                }
                Err(SendfileError::Io(err)) => return Err(err.into()),
            }
        }
        self.record_hit(req, status, head_bytes, sent, started);
        Ok(HitOutcome::Served(!req.close))
    }

    fn record_hit(&self, req: &RequestHead, status: u16, head: u64, body: u64, started: Instant) {
        self.record(&ResponseRecord {
            method: &req.method,
            target: &req.target,
            status,
            cache_status: CacheStatus::Hit,
            head_bytes: head,
            body_bytes: body,
            // The planted bug still *declares* zero-copy: that is what makes it a violation.
            path: DataPath::Zerocopy,
            duration: started.elapsed(),
        });
    }
}
