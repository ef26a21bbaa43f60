//! A cache hit: the response head in one send, then the body straight from the page cache to the
//! socket with sendfile. The head is the entry's prebuilt bytes plus a few dynamic fields, built
//! in the connection's reused buffer: no allocation proportional to the body, no read(2) of the
//! file's header, no open(2) when the open-file cache holds the file.

use super::conn::{Conn, ConnError};
use crate::cache::conditional::{self, Precondition};
use crate::cache::entry::Entry;
use crate::http::headers::{put, put_digits, put_num};
use crate::http::range::{self, RangeAnswer};
use crate::http::request::RequestHead;
use crate::http::stored_fields::StoredFields;
use crate::sendfile::SendfileError;
use std::sync::Arc;
use std::time::Instant;
use zerocache_ledger::{CacheStatus, DataPath, ResponseRecord};

/// Why a stored response is being served, for `X-Cache` and `Cache-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitKind {
    /// Fresh.
    Hit,
    /// Fresh, after waiting for another request's fill.
    Coalesced,
    /// Stale, allowed by the client's `max-stale` (or the stale rules).
    Stale,
    /// Stale, then confirmed by a 304 from the origin.
    Revalidated,
}

impl HitKind {
    fn cache_status(self) -> CacheStatus {
        match self {
            HitKind::Hit | HitKind::Coalesced => CacheStatus::Hit,
            HitKind::Stale => CacheStatus::Stale,
            HitKind::Revalidated => CacheStatus::Revalidated,
        }
    }
}

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
        kind: HitKind,
        requester: &[u8],
        started: Instant,
    ) -> Result<HitOutcome, ConnError> {
        let ctx = self.ctx.clone();
        let now = crate::clock::now();
        let age = e.age(now).as_secs();
        let ttl = e.meta.lifetime.as_secs() as i64 - age as i64;
        // Conditional requests are answered from the stored validators (RFC 9110 §13.2.2).
        match conditional::evaluate(
            req,
            e.etag.as_deref(),
            e.last_modified.as_deref(),
            e.date.as_deref(),
        ) {
            Precondition::Proceed => {}
            Precondition::Failed => {
                let keep = self
                    .respond_simple(
                        req,
                        412,
                        kind.cache_status(),
                        &[("X-Cache", kind_token(kind))],
                        started,
                    )
                    .await?;
                return Ok(HitOutcome::Served(keep));
            }
            Precondition::NotModified => {
                let h = &mut self.head;
                h.clear();
                h.extend_from_slice(b"HTTP/1.1 304 Not Modified\r\n");
                for line in StoredFields(&e.meta.fields).lines() {
                    if conditional::NOT_MODIFIED_FIELDS
                        .iter()
                        .any(|f| line.name.eq_ignore_ascii_case(f))
                    {
                        h.extend_from_slice(line.raw);
                    }
                }
                h.extend_from_slice(requester);
                self.dynamic_fields(kind, age, ttl, req.close);
                let sent = self.send_head().await;
                self.record(&ResponseRecord {
                    method: &req.method,
                    target: &req.target,
                    status: 304,
                    cache_status: kind.cache_status(),
                    head_bytes: self.head.len() as u64,
                    body_bytes: 0,
                    path: DataPath::Zerocopy,
                    duration: started.elapsed(),
                    complete: sent.is_ok(),
                });
                sent?;
                return Ok(HitOutcome::Served(!req.close));
            }
        }
        let head_only = req.method == "HEAD";
        // Open before sending anything, so a vanished file can still become a miss.
        let file = if head_only {
            None
        } else {
            match ctx.store.open_file(e) {
                Ok(f) => Some(f),
                Err(err) => match crate::cache::store::OpenFailure::of(&err) {
                    crate::cache::store::OpenFailure::NoFds => {
                        // The entry is intact; the process is out of fds (the store has logged
                        // it). A refetch would need more of them, so the client comes back soon.
                        let keep = self
                            .respond_simple(
                                req,
                                503,
                                CacheStatus::Error,
                                &[
                                    ("Retry-After", "1"),
                                    ("X-Cache", CacheStatus::Error.as_str()),
                                ],
                                started,
                            )
                            .await?;
                        return Ok(HitOutcome::Served(keep));
                    }
                    crate::cache::store::OpenFailure::Gone => {
                        tracing::warn!(path = %e.path.display(), error = %err, "cache file vanished; refetching");
                        return Ok(HitOutcome::Gone);
                    }
                    crate::cache::store::OpenFailure::Other => {
                        // Kept in the index: the file is probably there, and a refetch that
                        // succeeds replaces it anyway.
                        tracing::warn!(path = %e.path.display(), error = %err, "cannot open cache file; refetching");
                        return Ok(HitOutcome::Gone);
                    }
                },
            }
        };
        let answer = if req.method == "GET"
            && e.meta.status == 200
            && conditional::if_range_holds(req, e.etag.as_deref(), e.last_modified.as_deref())
        {
            range::answer(req.field("range"), e.body_len)
        } else {
            RangeAnswer::Full
        };
        let h = &mut self.head;
        h.clear();
        let (start, len, status) = match answer {
            RangeAnswer::Full => {
                put_stored(h, &e.hit_head, requester);
                (0, e.body_len, e.meta.status)
            }
            RangeAnswer::Partial { start, end } => {
                h.extend_from_slice(b"HTTP/1.1 206 Partial Content\r\n");
                put_stored(h, &ctx.store.targeted().visible(&e.meta.fields), requester);
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
                put_stored(h, &ctx.store.targeted().visible(&e.meta.fields), requester);
                put(
                    h,
                    "Content-Range",
                    format!("bytes */{}", e.body_len).as_bytes(),
                );
                put_num(h, "Content-Length", 0);
                (0, 0, 416)
            }
        };
        self.dynamic_fields(kind, age, ttl, req.close);
        let body_file = file.as_ref().filter(|_| len > 0);
        let head_sent = if body_file.is_some() && !ctx.copy_hits {
            self.sock
                .send_head(&self.head, ctx.send_timeout)
                .await
                .map_err(ConnError::from)
        } else {
            self.send_head().await
        };
        let head_bytes = self.head.len() as u64;
        if let Err(err) = head_sent {
            self.record_hit(req, kind, status, (head_bytes, 0, false), started);
            return Err(err);
        }
        let mut sent = 0;
        if let Some(file) = body_file {
            let offset = e.body_offset + start;
            // Cold pages are read in on the blocking pool, so sendfile never waits for the disk
            // on a runtime thread (see `residency`). Entries hit in the last second skip the check.
            let now_ms = crate::server::uptime_ms();
            let last = e
                .last_hit_ms
                .swap(now_ms, std::sync::atomic::Ordering::Relaxed);
            if ctx.offload_cold_hits
                && (last == 0 || now_ms.saturating_sub(last) > 1000)
                && !crate::residency::resident(file, offset, len)
            {
                ctx.accounting.cold_offload();
                crate::residency::warm(file.clone(), offset, len).await;
            }
            let result = self
                .sock
                .send_file(
                    file,
                    offset,
                    len,
                    ctx.sendfile_max_chunk,
                    ctx.send_timeout,
                    ctx.copy_hits,
                )
                .await;
            match result {
                Ok(n) => sent = n,
                Err(SendfileError::Truncated { sent: s, expected }) => {
                    tracing::warn!(path = %e.path.display(), sent = s, expected, "cache file truncated underneath; dropping entry and closing");
                    ctx.store.remove_if_same(e);
                    self.record_hit(req, kind, status, (head_bytes, s, false), started);
                    return Err(ConnError::Aborted("truncated cache file".into()));
                }
                Err(SendfileError::Io { sent: s, error }) => {
                    self.record_hit(req, kind, status, (head_bytes, s, false), started);
                    return Err(error.into());
                }
            }
        }
        self.record_hit(req, kind, status, (head_bytes, sent, true), started);
        Ok(HitOutcome::Served(!req.close))
    }

    /// Appends `Age`, `X-Cache`, `Cache-Status` (RFC 9211, with `ttl`), `Via`, `Connection` and
    /// the blank line to the head being built.
    fn dynamic_fields(&mut self, kind: HitKind, age: u64, ttl: i64, close: bool) {
        let h = &mut self.head;
        put_num(h, "Age", age);
        h.extend_from_slice(b"X-Cache: ");
        h.extend_from_slice(kind_token(kind).as_bytes());
        h.extend_from_slice(b"\r\n");
        // Written piecewise: a hit allocates nothing for its head.
        let (before, after): (&[u8], &[u8]) = match kind {
            HitKind::Hit => (b"Cache-Status: zerocache; hit; ttl=", b"\r\n"),
            HitKind::Coalesced => (
                b"Cache-Status: zerocache; hit; ttl=",
                b"; detail=coalesced\r\n",
            ),
            HitKind::Stale => (b"Cache-Status: zerocache; hit; ttl=", b"; detail=stale\r\n"),
            HitKind::Revalidated => (
                b"Cache-Status: zerocache; fwd=stale; fwd-status=304; ttl=",
                b"\r\n",
            ),
        };
        h.extend_from_slice(before);
        if ttl < 0 {
            h.push(b'-');
        }
        put_digits(h, ttl.unsigned_abs());
        h.extend_from_slice(after);
        h.extend_from_slice(crate::http::headers::VIA_SELF_LINE);
        if close {
            h.extend_from_slice(b"Connection: close\r\n");
        }
        h.extend_from_slice(b"\r\n");
    }

    fn record_hit(
        &self,
        req: &RequestHead,
        kind: HitKind,
        status: u16,
        (head, body, complete): (u64, u64, bool),
        started: Instant,
    ) {
        self.record(&ResponseRecord {
            method: &req.method,
            target: &req.target,
            status,
            cache_status: kind.cache_status(),
            head_bytes: head,
            body_bytes: body,
            // The planted bug still *declares* zero-copy: that is what makes it a violation.
            path: DataPath::Zerocopy,
            duration: started.elapsed(),
            complete,
        });
    }
}

fn kind_token(kind: HitKind) -> &'static str {
    kind.cache_status().as_str()
}

/// Appends the stored header lines `block` to `h`, with the fields that `requester` names
/// replaced by its lines: what a 304 carried for the client that caused it alone (RFC 9111
/// §4.3.4 for that client; `validation::for_requester_only` for why the entry keeps its own).
/// A status line in `block` has no field name and is kept.
fn put_stored(h: &mut Vec<u8>, block: &[u8], requester: &[u8]) {
    if requester.is_empty() {
        h.extend_from_slice(block);
        return;
    }
    let replaced = |name: &str| {
        StoredFields(requester)
            .lines()
            .any(|r| r.name.eq_ignore_ascii_case(name))
    };
    for line in StoredFields(block).lines() {
        if !replaced(line.name) {
            h.extend_from_slice(line.raw);
        }
    }
    h.extend_from_slice(requester);
}
