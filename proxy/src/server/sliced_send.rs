//! The body of a response from slices (`sliced.rs`): the head sent, then each promised part (its
//! `multipart/byteranges` framing written, its bytes from each slice's file in turn by sendfile),
//! the next slice fetched by a task of its own while this one goes out, and the response
//! recorded with the slices it used (`$slices`).

use super::conn::{Conn, ConnError};
use super::fetch::slice::SliceJob;
use crate::cache::entry::Entry;
use crate::cache::slice::Identity;
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

impl Conn {
    /// Sends the head, then each part: its framing, then its bytes from each slice in turn by
    /// sendfile, the next slice the body needs fetched while this one is sent; then the closing
    /// boundary. `first` is the first slice the body needs, already checked. Records the
    /// response.
    pub(super) async fn sliced_body(
        &mut self,
        req: &RequestHead,
        id: &Identity,
        first: Option<Arc<Entry>>,
        p: &Promised,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let ctx = self.ctx.clone();
        let job = p.job.clone();
        let size = job.slicing.size;
        let parts = &p.ranged.parts;
        let mut fetched = false;
        // The first slice's file is opened before the head goes: one evicted meanwhile is
        // fetched again, not a response cut at its first byte.
        let mut opened_first = None;
        if let Some(k) = parts.iter().find(|q| q.len > 0).map(|q| q.start / size) {
            match self.open_slice(&job, k, id, first, &mut fetched).await {
                Some(x) => opened_first = Some(x),
                None => {
                    return self
                        .respond_simple(req, 502, CacheStatus::Error, &[], None, started)
                        .await;
                }
            }
        }
        let more = p.ranged.content_length() > 0;
        let sent_head = self
            .sock
            .send_response_head(&mut self.head, more, ctx.client.send_timeout)
            .await
            .map_err(ConnError::from);
        if let Err(e) = sent_head {
            self.record_sliced(req, p, 0, false, started);
            return Err(e);
        }
        let mut sent = 0u64;
        for (i, part) in parts.iter().enumerate() {
            if !part.head.is_empty()
                && let Err(e) = self.send(&part.head).await
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
                    Some(x) => Some(x),
                    None => self.open_slice(&job, k, id, None, &mut fetched).await,
                };
                let Some((e, file)) = opened else {
                    // The head is out: a body of another representation must not follow.
                    self.record_sliced(req, p, sent, false, started);
                    return Err(ConnError::Aborted(
                        "slice failed or changed mid-body".into(),
                    ));
                };
                // The part's bytes this slice holds: `fits` made its length its place's.
                let slice_start = k * size;
                let from = part.start.max(slice_start) - slice_start;
                let to = (part.start + part.len).min(slice_start + e.body_len) - slice_start;
                let Some(len) = to.checked_sub(from) else {
                    self.record_sliced(req, p, sent, false, started);
                    return Err(ConnError::Aborted("slice shorter than its place".into()));
                };
                if !job.fetched_here.lock().contains(&k) {
                    ctx.accounting.slices.served();
                }
                match self.send_slice(&e, &file, from, len).await {
                    Ok(n) => sent += n,
                    Err(err) => {
                        self.record_sliced(req, p, sent, false, started);
                        return Err(err);
                    }
                }
            }
        }
        if !p.ranged.tail.is_empty()
            && let Err(e) = self.send(&p.ranged.tail).await
        {
            self.record_sliced(req, p, sent, false, started);
            return Err(e);
        }
        self.record_sliced(req, p, sent, true, started);
        Ok(!req.close)
    }

    /// Slice `k` (the entry `given` when the caller has it) and its file, open. A file gone
    /// underneath (evicted, purged) drops the entry and the slice is looked up or fetched once
    /// more. `None`: the origin failed, or the slice is of another representation.
    async fn open_slice(
        &self,
        job: &Arc<SliceJob>,
        k: u64,
        id: &Identity,
        mut given: Option<Arc<Entry>>,
        fetched: &mut bool,
    ) -> Option<(Arc<Entry>, Arc<File>)> {
        let ctx = self.ctx.clone();
        for _ in 0..2 {
            let e = match given.take() {
                Some(e) => e,
                None => self.slice_for_body(&ctx, job, k, id, fetched).await.ok()?,
            };
            match ctx.store.open_file(&e) {
                Ok(f) => return Some((e, f)),
                Err(err) => {
                    use crate::cache::store::OpenFailure;
                    // Out of descriptors: the slice is intact; nothing to fetch again.
                    if OpenFailure::of(&err) == OpenFailure::NoFds {
                        return None;
                    }
                    tracing::debug!(path = %e.path.display(), error = %err, "slice file gone; fetching it again");
                    ctx.store.remove_if_same(&e);
                }
            }
        }
        None
    }

    /// `len` bytes of slice `e` from `from` by sendfile (`sendfile_entry`).
    async fn send_slice(
        &mut self,
        e: &Arc<Entry>,
        file: &Arc<File>,
        from: u64,
        len: u64,
    ) -> Result<u64, ConnError> {
        let ctx = self.ctx.clone();
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
        self.log_info.slices = Some((p.slices, p.job.fetched_here.lock().len() as u64));
        self.record(&ResponseRecord {
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
