//! The body of a response from slices (`sliced.rs`): each slice found or fetched and checked
//! against the response's representation (`slice_for_body`, `fits`), the head sent, then each
//! promised part (its `multipart/byteranges` framing written, its bytes from each slice's file in
//! turn by sendfile), the next slice fetched by a task of its own while this one goes out, and the
//! response recorded with the slices it used (`$slices`).

use super::conn_error::ConnError;
use super::exchange::Exchange;
use super::fetch::slice::{Got, Piece, SliceJob};
use crate::cache::entry::Entry;
use crate::cache::growing::{Growing, Progress};
use crate::cache::slice::{Identity, stored_identity};
use crate::http::byteranges::Ranged;
use crate::http::request::RequestHead;
use crate::sendfile::SendfileError;
use std::fs::File;
use std::sync::Arc;
use std::time::Instant;
use zerocache_ledger::{CacheStatus, DataPath, ResponseRecord};

/// What the head promised: the status, the parts of the object and their framing, and the
/// cache's status for the record.
pub(super) struct Promised {
    /// The request's slices and what it fetched.
    pub(super) job: Arc<SliceJob>,
    /// The slices the body is sent from.
    pub(super) slices: u64,
    pub(super) status: u16,
    /// The object's bytes sent, part by part.
    pub(super) ranged: Ranged,
    pub(super) cache_status: CacheStatus,
    /// The head and the multipart framing: written, not sent from a file.
    pub(super) head_bytes: u64,
}

impl Exchange<'_> {
    /// Sends the head, then each part: its framing, then its bytes from each slice in turn by
    /// sendfile, the next slice the body needs fetched while this one is sent; then the closing
    /// boundary. `first` is the first slice the body needs, already checked. Records the
    /// response. `None`: the first slice turned out to be of another version before the head
    /// went (every stored slice dropped): the response starts over.
    pub(super) async fn sliced_body(
        &mut self,
        req: &RequestHead,
        id: &Identity,
        first: Option<Piece>,
        p: &Promised,
        started: Instant,
    ) -> Result<Option<bool>, ConnError> {
        let ctx = self.c.ctx.clone();
        let job = p.job.clone();
        let size = job.slicing.size;
        let parts = &p.ranged.parts;
        let mut fetched = false;
        // The first slice's file is opened before the head goes: one evicted meanwhile is
        // fetched again, not a response cut at its first byte; one of another version starts
        // the response over.
        let mut opened_first = None;
        if let Some(k) = parts.iter().find(|q| q.len > 0).map(|q| q.start / size) {
            match self.open_slice(&job, k, id, first, &mut fetched).await {
                Ok(x) => opened_first = Some(x),
                Err(Failure::Changed) => return Ok(None),
                Err(why) => {
                    let status = match why {
                        Failure::Status(s) => s,
                        // Out of descriptors: the slice is intact, the client comes back.
                        _ => 503,
                    };
                    return self
                        .c
                        .respond_simple(req, status, CacheStatus::Error, &[], None, started)
                        .await
                        .map(Some);
                }
            }
        }
        let more = p.ranged.content_length() > 0;
        let sent_head = self.c.send_head_for_body(more).await;
        if let Err(e) = sent_head {
            self.record_sliced(req, p, 0, false, started);
            return Err(e);
        }
        let mut sent = 0u64;
        // The last slice counted a hit: a slice two parts share is one.
        let mut counted = None;
        for (i, part) in parts.iter().enumerate() {
            if !part.head.is_empty()
                && let Err(e) = self.c.send(&part.head).await
            {
                self.record_sliced(req, p, sent, false, started);
                return Err(e);
            }
            if part.len == 0 {
                continue;
            }
            let (a, b) = (part.start / size, (part.start + part.len - 1) / size);
            for k in a..=b {
                let next = if k < b {
                    Some(k + 1)
                } else {
                    parts[i + 1..]
                        .iter()
                        .find(|q| q.len > 0)
                        .map(|q| q.start / size)
                };
                if let Some(n) = next.filter(|n| *n != k) {
                    job.prefetch(&ctx, n);
                }
                let opened = match opened_first.take() {
                    Some(x) => Ok(x),
                    None => self.open_slice(&job, k, id, None, &mut fetched).await,
                };
                let piece = match opened {
                    Ok(x) => x,
                    Err(why) => {
                        // The head is out: a body of another representation must not follow.
                        // A change found only now may be an origin whose ranges are not
                        // pieces of one object: served unsliced for a while, not cut again.
                        if matches!(why, Failure::Changed) {
                            ctx.store.unsliced().note(job.primary.hash);
                            ctx.accounting.slices.unsliced("slice-unstable");
                        }
                        self.record_sliced(req, p, sent, false, started);
                        return Err(ConnError::Aborted(
                            "slice failed or changed mid-body".into(),
                        ));
                    }
                };
                // The part's bytes this slice holds: `fits` made its length its place's.
                let slice_start = k * size;
                let from = part.start.max(slice_start) - slice_start;
                let to = (part.start + part.len).min(slice_start + piece.body_len()) - slice_start;
                let Some(len) = to.checked_sub(from) else {
                    self.record_sliced(req, p, sent, false, started);
                    return Err(ConnError::Aborted("slice shorter than its place".into()));
                };
                let from_store = matches!(piece, Sendable::File(..));
                let result = match &piece {
                    Sendable::File(e, file) => self.send_slice(e, file, from, len).await,
                    Sendable::Growing { g, .. } => {
                        self.send_growing(g, from, len, job.upstream.read_timeout)
                            .await
                    }
                };
                match result {
                    Ok(n) => {
                        sent += n;
                        if from_store
                            && counted.replace(k) != Some(k)
                            && !job.fetched_here.lock().contains(&k)
                        {
                            ctx.accounting.slices.served();
                        }
                    }
                    Err(err) => {
                        self.record_sliced(req, p, sent, false, started);
                        return Err(err);
                    }
                }
            }
        }
        if !p.ranged.tail.is_empty()
            && let Err(e) = self.c.send(&p.ranged.tail).await
        {
            self.record_sliced(req, p, sent, false, started);
            return Err(e);
        }
        self.record_sliced(req, p, sent, true, started);
        Ok(Some(!req.close))
    }

    /// Slice `k` for the body, checked against the object's identity `id` and its place in it.
    /// A slice of another representation drops every stored slice of the object.
    pub(super) async fn slice_for_body(
        &self,
        ctx: &Arc<crate::server::Ctx>,
        job: &Arc<SliceJob>,
        k: u64,
        id: &Identity,
        fetched: &mut bool,
    ) -> Result<Piece, Failure> {
        let e = match job.get(ctx, k).await {
            Got::Stored(e, f) => {
                *fetched |= f;
                e
            }
            Got::Failed(status) => return Err(Failure::Status(status)),
            // Not a slice at all now (a 200, a 416: the object's kind or length may have
            // changed, or this request caused it): proven nothing, dropped nothing.
            Got::Unsliceable(_) | Got::PastEnd(_) => return Err(Failure::Unsliced),
        };
        if fits(job, k, id, e.entry(), e.body_len()) {
            return Ok(e);
        }
        changed(ctx, job, k, stored_identity(e.entry())).await;
        Err(Failure::Changed)
    }

    /// Slice `k` (`given` when the caller has it), ready to send: a stored one with its file
    /// open, or one being filled. A file gone underneath (evicted, purged) drops the entry and
    /// the slice is looked up or fetched once more. `Failure::Unsliced` here means out of
    /// descriptors, or gone twice.
    async fn open_slice(
        &self,
        job: &Arc<SliceJob>,
        k: u64,
        id: &Identity,
        mut given: Option<Piece>,
        fetched: &mut bool,
    ) -> Result<Sendable, Failure> {
        let ctx = self.c.ctx.clone();
        for _ in 0..2 {
            let piece = match given.take() {
                Some(p) => p,
                None => self.slice_for_body(&ctx, job, k, id, fetched).await?,
            };
            let e = match piece {
                Piece::Growing(g, reader) => {
                    return Ok(Sendable::Growing { g, _reader: reader });
                }
                Piece::Stored(e) => e,
            };
            match ctx.store.open_file(&e) {
                Ok(f) => return Ok(Sendable::File(e, f)),
                Err(err) => {
                    use crate::cache::store::OpenFailure;
                    // Out of descriptors: the slice is intact; nothing to fetch again.
                    if OpenFailure::of(&err) == OpenFailure::NoFds {
                        return Err(Failure::Unsliced);
                    }
                    tracing::debug!(path = %e.path.display(), error = %err, "slice file gone; fetching it again");
                    ctx.store.remove_if_same(&e);
                }
            }
        }
        Err(Failure::Unsliced)
    }

    /// `len` bytes from `from` of slice `g` while it is being filled, by sendfile from its file
    /// as the fill publishes them (`behind.rs` does the same for a whole object); `wait` bounds
    /// each wait for more (the upstream's read timeout, twice: a chunk's size line, then its
    /// data). A fill that fails or ends short aborts the response.
    async fn send_growing(
        &mut self,
        g: &Growing,
        from: u64,
        len: u64,
        wait: std::time::Duration,
    ) -> Result<u64, ConnError> {
        let ctx = self.c.ctx.clone();
        let end = from + len;
        let mut at = from;
        let mut r = g.reader();
        let mut p = r.now();
        loop {
            let avail = p.available().min(end);
            if avail > at {
                let result = self
                    .c
                    .sock
                    .send_file(
                        &g.file,
                        g.entry.body_offset + at,
                        avail - at,
                        ctx.sending.sendfile_max_chunk,
                        ctx.client.send_timeout,
                        ctx.sending.copy_hits,
                    )
                    .await;
                match result {
                    Ok(n) => at += n,
                    Err(SendfileError::Truncated { .. }) => {
                        return Err(ConnError::Aborted(
                            "slice file shorter than published".into(),
                        ));
                    }
                    Err(SendfileError::Io { error, .. }) => return Err(error.into()),
                }
                p = r.now();
                continue;
            }
            if at >= end {
                return Ok(len);
            }
            match p {
                Progress::Writing(_) => p = r.next(wait.saturating_mul(2)).await,
                Progress::Done(_) | Progress::Failed(_) => {
                    return Err(ConnError::Aborted(
                        "the slice fill this response read behind failed".into(),
                    ));
                }
            }
        }
    }

    /// `len` bytes of slice `e` from `from` by sendfile (`sendfile_entry`).
    async fn send_slice(
        &mut self,
        e: &Arc<Entry>,
        file: &Arc<File>,
        from: u64,
        len: u64,
    ) -> Result<u64, ConnError> {
        let ctx = self.c.ctx.clone();
        let result = self
            .sendfile_entry(e, file, e.body_offset + from, len)
            .await;
        match result {
            Ok(n) => Ok(n),
            Err(SendfileError::Truncated { sent, expected }) => {
                tracing::warn!(path = %e.path.display(), sent, expected, "slice file truncated underneath; dropping it and closing");
                ctx.store.remove_if_same(e);
                Err(ConnError::Aborted("truncated slice file".into()))
            }
            Err(SendfileError::Io { error, .. }) => Err(error.into()),
        }
    }

    /// Records the response, with the slices it used and those fetched for it (`$slices`,
    /// `$slices_fetched`).
    fn record_sliced(
        &mut self,
        req: &RequestHead,
        p: &Promised,
        body: u64,
        complete: bool,
        started: Instant,
    ) {
        self.c.log_info.slices = Some((p.slices, p.job.fetched_here.lock().len() as u64));
        self.c.record(&ResponseRecord {
            method: &req.method,
            target: &req.target,
            status: p.status,
            cache_status: p.cache_status,
            head_bytes: p.head_bytes,
            body_bytes: body,
            path: DataPath::Zerocopy,
            duration: started.elapsed(),
            complete,
        });
    }
}

/// Slice `k` (of identity `other`) is not a piece of the response's representation: the object
/// changed at the origin, so every entry stored under its URL goes (its slices of every version;
/// off the runtime, a purge's cost).
pub(super) async fn changed(
    ctx: &Arc<crate::server::Ctx>,
    job: &SliceJob,
    k: u64,
    other: Option<Identity>,
) {
    tracing::info!(target = %job.req.target, slice = k, other = ?other.map(|o| o.etag), "a slice disagrees with the object's first: its slices are dropped");
    ctx.accounting.slices.changed();
    let (ctx, url) = (ctx.clone(), job.url.clone());
    let _ = tokio::task::spawn_blocking(move || ctx.store.purge_url(&url)).await;
}

/// Why a slice cannot go into a response.
pub(super) enum Failure {
    /// The origin failed: this status.
    Status(u16),
    /// The slice is of another representation: the object's slices are dropped.
    Changed,
    /// The origin's answer was no slice: the ordinary path answers.
    Unsliced,
}

/// Whether slice entry `e` with a body of `body_len` bytes is slice `k` of the representation
/// `id`: its identity, and the length its place in the object gives it.
pub(super) fn fits(job: &SliceJob, k: u64, id: &Identity, e: &Entry, body_len: u64) -> bool {
    let held = job.slicing.held(k, id.total);
    stored_identity(e).is_some_and(|o| o.same(id))
        && held.is_some_and(|(a, b)| b - a + 1 == body_len)
}

/// A slice ready to send.
enum Sendable {
    /// Stored, its file open.
    File(Arc<Entry>, Arc<File>),
    /// Being filled: sent as its bytes come; the reader keeps this response among its fill's.
    Growing {
        g: Arc<Growing>,
        _reader: Arc<crate::cache::growing::Reader>,
    },
}

impl Sendable {
    fn body_len(&self) -> u64 {
        match self {
            Sendable::File(e, _) => e.body_len,
            Sendable::Growing { g, .. } => g.length.unwrap_or(0),
        }
    }
}
