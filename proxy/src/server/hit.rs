//! A cache hit: the response head in one send, then the body straight from the page cache to the
//! socket with sendfile. The head is the entry's prebuilt bytes plus a few dynamic fields, built
//! in the connection's reused buffer: no allocation proportional to the body, no read(2) of the
//! file's header, no open(2) when the open-file cache holds the file.

use super::conn_error::ConnError;
use super::exchange::Exchange;
use crate::cache::conditional::{self, Precondition};
use crate::cache::entry::Entry;
use crate::http::head::{CacheFields, CacheStatusField, Framing, Head};
use crate::http::range::{self, RangeAnswer};
use crate::http::request::RequestHead;
use crate::http::stored_fields::StoredFields;
use crate::sendfile::SendfileError;
use std::fs::File;
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

impl Exchange<'_> {
    /// Serves `e` for `req`: a 412 or 304 from the stored validators, else the stored response
    /// (whole, a range, or 416) with its head in one send and its body by sendfile.
    pub async fn serve_hit(
        &mut self,
        req: &RequestHead,
        e: &Arc<Entry>,
        kind: HitKind,
        requester: &[u8],
        started: Instant,
    ) -> Result<HitOutcome, ConnError> {
        let age = e.age(crate::clock::now()).as_secs();
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
                let cache = CacheFields {
                    x_cache: kind_token(kind),
                    upstream: None,
                    member: None,
                };
                let keep = self
                    .c
                    .respond_simple(req, 412, kind.cache_status(), &[], Some(&cache), started)
                    .await?;
                return Ok(HitOutcome::Served(keep));
            }
            Precondition::NotModified => {
                return self
                    .not_modified(req, e, kind, requester, (age, ttl), started)
                    .await;
            }
        }
        // Open before sending anything, so a vanished file can still become a miss.
        let file = if req.method == "HEAD" {
            None
        } else {
            match self.open_stored(req, e, started).await? {
                Ok(f) => Some(f),
                Err(answered) => return Ok(answered),
            }
        };
        let (start, len, status) = self.hit_head(req, e, kind, requester, (age, ttl));
        self.send_stored(req, e, kind, file.as_ref(), (start, len, status), started)
            .await
    }

    /// The 304 for a request whose validators match the entry's: the entry's 304 fields
    /// (RFC 9110 §15.4.5) and the requester's own.
    pub(super) async fn not_modified(
        &mut self,
        req: &RequestHead,
        e: &Entry,
        kind: HitKind,
        requester: &[u8],
        (age, ttl): (u64, i64),
        started: Instant,
    ) -> Result<HitOutcome, ConnError> {
        let mut h = Head::standard(&mut self.c.head, 304);
        for line in StoredFields(&e.meta.fields).lines() {
            if conditional::NOT_MODIFIED_FIELDS
                .iter()
                .any(|f| line.name.eq_ignore_ascii_case(f))
            {
                h.lines(line.raw);
            }
        }
        h.lines(requester);
        epilogue(h, kind, age, ttl, req.close);
        let sent = self.c.send_head().await;
        self.c.record(&ResponseRecord {
            method: &req.method,
            target: &req.target,
            status: 304,
            cache_status: kind.cache_status(),
            head_bytes: self.c.head.len() as u64,
            body_bytes: 0,
            path: DataPath::Zerocopy,
            duration: started.elapsed(),
            complete: sent.is_ok(),
        });
        sent?;
        Ok(HitOutcome::Served(!req.close))
    }

    /// The entry's file, open; or, when it cannot be opened, what became of the request: a 503
    /// when the process is out of descriptors, a miss when the file is gone.
    async fn open_stored(
        &mut self,
        req: &RequestHead,
        e: &Arc<Entry>,
        started: Instant,
    ) -> Result<Result<Arc<File>, HitOutcome>, ConnError> {
        use crate::cache::store::OpenFailure;
        let err = match self.c.ctx.store.open_file(e) {
            Ok(f) => return Ok(Ok(f)),
            Err(err) => err,
        };
        match OpenFailure::of(&err) {
            OpenFailure::NoFds => {
                // The entry is intact; the process is out of fds (the store has logged it). A
                // refetch would need more of them, so the client comes back soon.
                let cache = CacheFields {
                    x_cache: CacheStatus::Error.as_str(),
                    upstream: None,
                    member: None,
                };
                let keep = self
                    .c
                    .respond_simple(
                        req,
                        503,
                        CacheStatus::Error,
                        &[("Retry-After", "1")],
                        Some(&cache),
                        started,
                    )
                    .await?;
                Ok(Err(HitOutcome::Served(keep)))
            }
            OpenFailure::Gone => {
                tracing::warn!(path = %e.path.display(), error = %err, "cache file vanished; refetching");
                Ok(Err(HitOutcome::Gone))
            }
            OpenFailure::Other => {
                // Kept in the index: the file is probably there, and a refetch that succeeds
                // replaces it anyway.
                tracing::warn!(path = %e.path.display(), error = %err, "cannot open cache file; refetching");
                Ok(Err(HitOutcome::Gone))
            }
        }
    }

    /// Writes the head of a stored response into `self.c.head`: whole, a range of it (206) or a
    /// 416. Returns the body's start and length in the entry, and the status.
    fn hit_head(
        &mut self,
        req: &RequestHead,
        e: &Entry,
        kind: HitKind,
        requester: &[u8],
        (age, ttl): (u64, i64),
    ) -> (u64, u64, u16) {
        let ctx = &self.c.ctx;
        let answer = if req.method == "GET"
            && e.meta.status == 200
            && conditional::if_range_holds(req, e.etag.as_deref(), e.last_modified.as_deref())
        {
            range::answer(req.field("range"), e.body_len)
        } else {
            RangeAnswer::Full
        };
        match answer {
            RangeAnswer::Full => {
                // The entry's prebuilt head, copied as it is; only a requester's own fields (a
                // 304's Set-Cookie for the client that caused it) make it go line by line. An h2
                // stream's head is written from the entry's fields, as the prebuilt one was.
                let h = if self.c.head.is_h2() {
                    let mut h = Head::new(&mut self.c.head, e.meta.status, &e.meta.reason);
                    put_stored(
                        &mut h,
                        &ctx.store.targeted().visible(&e.meta.fields),
                        requester,
                    );
                    h.framing(Framing::Length(e.body_len));
                    h
                } else if requester.is_empty() {
                    // The rules' edits need not look at the stored lines when they remove
                    // none of their names.
                    if self.c.head.edits.is_empty() {
                        Head::resume(&mut self.c.head, &e.hit_head)
                    } else {
                        Head::resume_named(&mut self.c.head, &e.hit_head, e.head_names())
                    }
                } else {
                    let at = e
                        .hit_head
                        .windows(2)
                        .position(|w| w == b"\r\n")
                        .map_or(0, |i| i + 2);
                    let mut h = Head::resume(&mut self.c.head, &e.hit_head[..at]);
                    put_stored(&mut h, &e.hit_head[at..], requester);
                    h
                };
                let mut h = h;
                if self.c.from_peer {
                    h.lines(&ctx.store.tag_lines_for_peer(&e.meta.fields));
                }
                epilogue(h, kind, age, ttl, req.close);
                (0, e.body_len, e.meta.status)
            }
            // A range of it (206), or none it has (416): the stored fields, then the range.
            partial => {
                let (status, range, start, len) = match partial {
                    RangeAnswer::Partial { start, end } => (
                        206,
                        format!("bytes {start}-{end}/{}", e.body_len),
                        start,
                        end - start + 1,
                    ),
                    _ => (416, format!("bytes */{}", e.body_len), 0, 0),
                };
                let mut h = Head::standard(&mut self.c.head, status);
                put_stored(
                    &mut h,
                    &ctx.store.targeted().visible(&e.meta.fields),
                    requester,
                );
                h.field("Content-Range", range.as_bytes())
                    .framing(Framing::Length(len));
                if self.c.from_peer {
                    h.lines(&ctx.store.tag_lines_for_peer(&e.meta.fields));
                }
                epilogue(h, kind, age, ttl, req.close);
                (start, len, status)
            }
        }
    }

    /// Sends the head in `self.c.head`, then `len` bytes of the body from `start` by sendfile (a
    /// cold range read in first, off the event loop), and records the response.
    async fn send_stored(
        &mut self,
        req: &RequestHead,
        e: &Arc<Entry>,
        kind: HitKind,
        file: Option<&Arc<File>>,
        (start, len, status): (u64, u64, u16),
        started: Instant,
    ) -> Result<HitOutcome, ConnError> {
        let ctx = self.c.ctx.clone();
        let body_file = file.filter(|_| len > 0);
        let head_sent = if body_file.is_some() && !ctx.sending.copy_hits {
            self.c.send_head_for_body(true).await
        } else {
            self.c.send_head().await
        };
        let head_bytes = self.c.head.len() as u64;
        if let Err(err) = head_sent {
            self.record_hit(req, kind, status, (head_bytes, 0, false), started);
            return Err(err);
        }
        let mut sent = 0;
        if let Some(file) = body_file {
            let result = self
                .sendfile_entry(e, file, e.body_offset + start, len)
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

    /// `len` bytes of the stored entry `e`'s open `file` from `offset` by sendfile. Cold pages
    /// are read in on the blocking pool first, so sendfile never waits for the disk on a runtime
    /// thread (see `residency`); entries hit in the last second skip the check.
    pub(super) async fn sendfile_entry(
        &mut self,
        e: &Entry,
        file: &Arc<File>,
        offset: u64,
        len: u64,
    ) -> Result<u64, SendfileError> {
        // Borrowed beside the socket, not cloned: no reference count touched per hit.
        let ctx = &*self.c.ctx;
        let now_ms = crate::server::uptime_ms();
        let last = e
            .last_hit_ms
            .swap(now_ms, std::sync::atomic::Ordering::Relaxed);
        if ctx.sending.offload_cold_hits
            && (last == 0 || now_ms.saturating_sub(last) > 1000)
            && !crate::residency::resident(file, offset, len)
        {
            ctx.accounting.cold_offload();
            crate::residency::warm(file.clone(), offset, len).await;
        }
        self.c
            .sock
            .send_file(
                file,
                offset,
                len,
                ctx.sending.sendfile_max_chunk,
                ctx.client.send_timeout,
                ctx.sending.copy_hits,
            )
            .await
    }

    fn record_hit(
        &self,
        req: &RequestHead,
        kind: HitKind,
        status: u16,
        (head, body, complete): (u64, u64, bool),
        started: Instant,
    ) {
        self.c.record(&ResponseRecord {
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

/// Ends a served-from-cache head: `Age`, `X-Cache`, `Cache-Status` (RFC 9211, with `ttl`),
/// `Via`, `Connection` and the blank line.
fn epilogue(mut h: Head<'_>, kind: HitKind, age: u64, ttl: i64, close: bool) {
    let member = match kind {
        HitKind::Hit => CacheStatusField::hit(ttl),
        HitKind::Coalesced => CacheStatusField::hit(ttl).detail("coalesced"),
        HitKind::Stale => CacheStatusField::hit(ttl).detail("stale"),
        HitKind::Revalidated => CacheStatusField {
            fwd_status: Some(304),
            ttl: Some(ttl),
            ..CacheStatusField::fwd("stale")
        },
    };
    h.age(age)
        .cache(&CacheFields {
            x_cache: kind_token(kind),
            upstream: None,
            member: Some(member),
        })
        .via_self();
    h.end(close);
}

/// Appends the stored header lines `block` to `h`, with the fields that `requester` names
/// replaced by its lines: what a 304 carried for the client that caused it alone (RFC 9111
/// §4.3.4 for that client; `validation::for_requester_only` for why the entry keeps its own).
fn put_stored(h: &mut Head<'_>, block: &[u8], requester: &[u8]) {
    if requester.is_empty() {
        h.lines(block);
        return;
    }
    let replaced = |name: &str| {
        StoredFields(requester)
            .lines()
            .any(|r| r.name.eq_ignore_ascii_case(name))
    };
    for line in StoredFields(block).lines() {
        if !replaced(line.name) {
            h.lines(line.raw);
        }
    }
    h.lines(requester);
}
