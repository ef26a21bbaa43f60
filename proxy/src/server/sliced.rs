//! A GET on a route with `slice` (`cache::slice`): answered from the object's slices, each found
//! stored or fetched once (`fetch::slice`), the head built from the first slice's stored fields,
//! and the body sent by sendfile from each slice's file in turn, the next slice fetched in the
//! background while this one is sent.
//!
//! Every slice of one response must be a piece of one representation. A slice that disagrees with
//! the first (the object changed at the origin) drops every stored slice of the object: before the
//! head is sent the response starts over once from fresh slices; after it, the connection is
//! closed, never a mixed body.

use super::conn_error::ConnError;
use super::exchange::Exchange;
use super::fetch::slice::{Got, SliceJob};
use super::hit::HitKind;
use super::sliced_send::{Failure, Promised, changed, fits};
use crate::cache::conditional::{self, Precondition};
use crate::cache::entry::Entry;
use crate::cache::key::CacheKey;
use crate::cache::slice::{Slicing, body_plan, slice_count, slices_of, stored_identity};
use crate::http::byteranges::Ranged;
use crate::http::head::{CacheFields, CacheStatusField, Framing, Head};
use crate::http::request::RequestHead;
use crate::http::stored_fields::StoredFields;
use std::sync::Arc;
use std::time::Instant;
use zerocache_ledger::{CacheStatus, DataPath, ResponseRecord};

/// Stored slices a response's head waits for the check of, after its first: a stored slice of
/// another version among them starts the response over instead of cutting it. Past them the body
/// checks each slice as it comes (a whole 20 GB object is 5,000 slices: reading every head before
/// the first byte would cost a pread each).
const CHECKED_AHEAD: u64 = 64;

/// Slices past that window whose presence in the index decides a response's `X-Cache`.
const PRESENCE_CHECKED: usize = 4096;

/// How one attempt at a sliced response ended.
enum Attempt {
    /// Answered: keep the connection or not.
    Done(bool),
    /// A slice disagreed with the first before anything was sent: the object's slices are gone,
    /// try once more.
    Again,
    /// Not for slices (see [`Got::Unsliceable`]): the ordinary path answers.
    Unsliced,
}

impl Exchange<'_> {
    /// A miss the ordinary path planned (nothing stored whole under `keys`, the request's URL
    /// and primary keys) on a route that slices (`routes[].slice`): a GET or HEAD answered from
    /// the object's slices; `None` for any other request, or one its slices cannot answer. The
    /// plan's own lookup decided there is no whole object, so a hit never comes here.
    pub(super) async fn sliced(
        &mut self,
        req: &RequestHead,
        route: &crate::routing::Routed<'_>,
        ask: &crate::cache::decide::Ask<'_>,
        (url, primary): &(CacheKey, CacheKey),
        started: Instant,
    ) -> Result<Option<bool>, ConnError> {
        let Some(slicing) = route.slicing else {
            return Ok(None);
        };
        // A request with credentials or `no-store` is answered for its client alone, the
        // ordinary way, and tells nothing of the object. (`only-if-cached`, a bypass and a body
        // never plan a miss.)
        if !matches!(ask.method, "GET" | "HEAD")
            || req.field("authorization").is_some()
            || crate::cache::freshness::request_directives(req).no_store
        {
            return Ok(None);
        }
        Box::pin(self.serve_sliced(req, route, slicing, (url, primary), started)).await
    }

    /// Answers `req` from the object's slices. `None`: the object is not served in slices (a
    /// multi-range request, an origin that answers slice requests whole or unusably, an object
    /// over `max_sliced_object_size`): the ordinary path answers it.
    pub(super) async fn serve_sliced(
        &mut self,
        req: &RequestHead,
        route: &crate::routing::Routed<'_>,
        slicing: Slicing,
        (url, primary): (&CacheKey, &CacheKey),
        started: Instant,
    ) -> Result<Option<bool>, ConnError> {
        let ctx = self.c.ctx.clone();
        if ctx.store.unsliced().recently(primary.hash) {
            return Ok(None);
        }
        // A slice's request is the object's, for every client: no Range or precondition of
        // this one, and no request directive (as in nginx; `no-store` went the ordinary way).
        let mut base = req.clone();
        base.fields.retain(|(k, _)| {
            !crate::http::headers::is_range_or_condition(k)
                && !k.eq_ignore_ascii_case("cache-control")
                && !k.eq_ignore_ascii_case("pragma")
        });
        let job = Arc::new(SliceJob {
            req: base,
            upstream: route.upstream.clone(),
            primary: primary.clone(),
            url: url.text.clone(),
            slicing,
            ttls: route.ttls.clone(),
            store_set_cookie: route.store_set_cookie,
            object_sizes: route.object_sizes,
            peer: self.c.peer.ip(),
            hash_bits: ctx.hash_bits,
            fetched_here: Default::default(),
        });
        if req.method == "HEAD" {
            return self.sliced_head_only(req, &job, started).await;
        }
        for _ in 0..2 {
            match self.sliced_attempt(req, &job, started).await? {
                Attempt::Done(keep) => return Ok(Some(keep)),
                Attempt::Unsliced => return Ok(None),
                Attempt::Again => {}
            }
        }
        // The object changed twice under one request: the origin does not serve one object in
        // pieces (a range's ETag its own, say). Served the ordinary way, and for a while so are
        // all requests for it.
        ctx.store.unsliced().note(primary.hash);
        ctx.accounting.slices.unsliced("slice-unstable");
        Ok(None)
    }

    /// One attempt: the first slice, the head from it, then the body.
    async fn sliced_attempt(
        &mut self,
        req: &RequestHead,
        job: &Arc<SliceJob>,
        started: Instant,
    ) -> Result<Attempt, ConnError> {
        let ctx = self.c.ctx.clone();
        let slicing = job.slicing;
        // The object's length and identity come from the first slice wanted, or from slice 0
        // when it is stored: a range past the end is then a 416 without asking the origin.
        let k0 = match slicing.first_wanted(req.field("range")) {
            k if k != 0 && job.stored(&ctx, 0).is_some() => 0,
            k => k,
        };
        let (first, fetched) = match job.get(&ctx, k0).await {
            Got::Stored(e, fetched) => (e, fetched),
            Got::Unsliceable(why) => {
                tracing::debug!(target = %req.target, why, "not served in slices");
                return Ok(Attempt::Unsliced);
            }
            // No range (an empty object), or one an If-Range may turn into the whole object:
            // the ordinary path answers. Else the range starts past the end.
            Got::PastEnd(_) if k0 == 0 || req.field("if-range").is_some() => {
                return Ok(Attempt::Unsliced);
            }
            Got::PastEnd(Some(total)) => {
                let cr = format!("bytes */{total}");
                let keep = self
                    .c
                    .respond_simple(
                        req,
                        416,
                        CacheStatus::Miss,
                        &[("Content-Range", &cr)],
                        None,
                        started,
                    )
                    .await?;
                return Ok(Attempt::Done(keep));
            }
            Got::PastEnd(None) => return Ok(Attempt::Unsliced),
            Got::Failed(status) => {
                let keep = self
                    .c
                    .respond_simple(req, status, CacheStatus::Error, &[], None, started)
                    .await?;
                return Ok(Attempt::Done(keep));
            }
        };
        let Some(id) = stored_identity(first.entry()) else {
            return Ok(Attempt::Unsliced);
        };
        if let Some(keep) = self
            .sliced_precondition(req, first.entry(), fetched, started)
            .await?
        {
            return Ok(Attempt::Done(keep));
        }
        let Some((status, ranged)) = body_plan(req, first.entry(), id.total) else {
            let cr = format!("bytes */{}", id.total);
            let keep = self
                .c
                .respond_simple(
                    req,
                    416,
                    if fetched {
                        CacheStatus::Miss
                    } else {
                        CacheStatus::Hit
                    },
                    &[("Content-Range", &cr)],
                    None,
                    started,
                )
                .await?;
            return Ok(Attempt::Done(keep));
        };
        // The first slice the body needs, checked before the head goes: a disagreement here can
        // still start over, and so can one of the stored slices after it (`CHECKED_AHEAD`).
        // The slices are walked, never listed: a whole terabyte object is millions of them.
        let mut ready = None;
        let mut all_stored = !fetched;
        if let Some(a) = slices_of(&ranged, slicing.size).next() {
            let e = if a == k0 && fits(job, k0, &id, first.entry(), first.body_len()) {
                Ok(first.clone())
            } else if a == k0 {
                changed(&ctx, job, k0, stored_identity(first.entry())).await;
                Err(Failure::Changed)
            } else {
                let mut fetched_a = false;
                let e = self.slice_for_body(&ctx, job, a, &id, &mut fetched_a).await;
                all_stored &= !fetched_a;
                e
            };
            match e {
                Ok(e) => ready = Some(e),
                Err(Failure::Changed) => return Ok(Attempt::Again),
                Err(Failure::Unsliced) => return Ok(Attempt::Unsliced),
                Err(Failure::Status(status)) => {
                    let keep = self
                        .c
                        .respond_simple(req, status, CacheStatus::Error, &[], None, started)
                        .await?;
                    return Ok(Attempt::Done(keep));
                }
            }
            for k in slices_of(&ranged, slicing.size)
                .skip(1)
                .take(CHECKED_AHEAD as usize)
            {
                match job.stored(&ctx, k) {
                    None => all_stored = false,
                    Some(e) if fits(job, k, &id, &e, e.body_len) => {}
                    Some(e) => {
                        changed(&ctx, job, k, stored_identity(&e)).await;
                        return Ok(Attempt::Again);
                    }
                }
            }
            // Past the window only whether they are there is asked, cheaply (no file read), and
            // of at most `PRESENCE_CHECKED` more: `X-Cache` of a longer body speaks for its start.
            all_stored &= slices_of(&ranged, slicing.size)
                .skip(1 + CHECKED_AHEAD as usize)
                .take(PRESENCE_CHECKED)
                .all(|k| job.is_indexed(&ctx, k));
        }
        self.sliced_head(req, first.entry(), (status, &ranged, id.total), all_stored);
        let promised = Promised {
            job: job.clone(),
            slices: slice_count(&ranged, slicing.size),
            status,
            cache_status: if all_stored {
                CacheStatus::Hit
            } else {
                CacheStatus::Miss
            },
            head_bytes: self.c.head.len() as u64 + ranged.framing_len(),
            ranged,
        };
        match self
            .sliced_body(req, &id, ready, &promised, started)
            .await?
        {
            Some(keep) => Ok(Attempt::Done(keep)),
            None => Ok(Attempt::Again),
        }
    }

    /// A HEAD, answered from slice 0 when it is stored and fresh (the object's fields and
    /// length), without asking the origin; `None` otherwise: the ordinary path forwards it, as
    /// it forwards a HEAD it has no stored response for, and stores nothing.
    async fn sliced_head_only(
        &mut self,
        req: &RequestHead,
        job: &Arc<SliceJob>,
        started: Instant,
    ) -> Result<Option<bool>, ConnError> {
        let Some(first) = job.stored(&self.c.ctx, 0) else {
            return Ok(None);
        };
        let Some(id) = stored_identity(&first) else {
            return Ok(None);
        };
        if let Some(keep) = self
            .sliced_precondition(req, &first, false, started)
            .await?
        {
            return Ok(Some(keep));
        }
        let whole = Ranged::single(0, id.total);
        self.sliced_head(req, &first, (200, &whole, id.total), true);
        let sent = self.c.send_head().await;
        self.c.record(&ResponseRecord {
            method: &req.method,
            target: &req.target,
            status: 200,
            cache_status: CacheStatus::Hit,
            head_bytes: self.c.head.len() as u64,
            body_bytes: 0,
            path: DataPath::Zerocopy,
            duration: started.elapsed(),
            complete: sent.is_ok(),
        });
        sent?;
        Ok(Some(!req.close))
    }

    /// A 412 or 304 from the first slice's validators, sent; `None` when the request's
    /// preconditions hold (or it has none).
    async fn sliced_precondition(
        &mut self,
        req: &RequestHead,
        first: &Entry,
        fetched: bool,
        started: Instant,
    ) -> Result<Option<bool>, ConnError> {
        let kind = HitKind::Hit;
        let status = if fetched {
            CacheStatus::Miss
        } else {
            CacheStatus::Hit
        };
        match conditional::evaluate(
            req,
            first.etag.as_deref(),
            first.last_modified.as_deref(),
            first.date.as_deref(),
        ) {
            Precondition::Proceed => Ok(None),
            Precondition::Failed => {
                let cache = CacheFields {
                    x_cache: status.as_str(),
                    upstream: None,
                    member: None,
                };
                self.c
                    .respond_simple(req, 412, status, &[], Some(&cache), started)
                    .await
                    .map(Some)
            }
            Precondition::NotModified => {
                let (age, ttl) = age_ttl(first);
                match self
                    .not_modified(req, first, kind, &[], (age, ttl), started)
                    .await?
                {
                    super::hit::HitOutcome::Served(keep) => Ok(Some(keep)),
                    super::hit::HitOutcome::Gone => Ok(Some(false)),
                }
            }
        }
    }

    /// Writes the head of a sliced response into `self.c.head`: the first slice's stored fields
    /// (less its own `Content-Range`, and its `Content-Type` when the parts carry it), then the
    /// response's range or multipart type and its length.
    fn sliced_head(
        &mut self,
        req: &RequestHead,
        first: &Entry,
        (status, ranged, total): (u16, &Ranged, u64),
        all_stored: bool,
    ) {
        let (age, ttl) = age_ttl(first);
        let visible = self.c.ctx.store.targeted().visible(&first.meta.fields);
        let mut h = Head::standard(&mut self.c.head, status);
        for line in StoredFields(&visible).lines() {
            // A slice's own `Content-Range` and digests of its bytes describe that 206, not
            // this answer.
            let replaced = ["content-range", "content-digest", "content-md5"]
                .iter()
                .any(|n| line.name.eq_ignore_ascii_case(n))
                || (ranged.content_type.is_some()
                    && line.name.eq_ignore_ascii_case("content-type"));
            if !replaced {
                h.lines(line.raw);
            }
        }
        match (&ranged.content_type, ranged.parts.first()) {
            (Some(t), _) => {
                h.field("Content-Type", t.as_bytes());
            }
            (None, Some(p)) if status == 206 => {
                let cr = format!("bytes {}-{}/{total}", p.start, p.start + p.len - 1);
                h.field("Content-Range", cr.as_bytes());
            }
            _ => {}
        }
        h.framing(Framing::Length(ranged.content_length()));
        let member = if all_stored {
            CacheStatusField::hit(ttl)
        } else {
            CacheStatusField {
                stored: true,
                ..CacheStatusField::fwd("miss")
            }
        };
        let x_cache = if all_stored { "HIT" } else { "MISS" };
        h.age(age)
            .cache(&CacheFields {
                x_cache,
                upstream: None,
                member: Some(member),
            })
            .via_self();
        h.end(req.close);
    }
}

/// The stored age and the freshness left of a slice, in seconds.
fn age_ttl(e: &Entry) -> (u64, i64) {
    let age = e.age(crate::clock::now()).as_secs();
    (age, e.meta.lifetime.as_secs() as i64 - age as i64)
}
