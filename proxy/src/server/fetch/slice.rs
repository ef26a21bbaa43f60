//! One slice of a sliced object (`cache::slice`): found stored, or fetched from the origin with
//! `Range: bytes=k*S-(k+1)*S-1` under the slice's own fill lock (so a slice is fetched once
//! however many clients want it) and stored as an entry of its own. Everything a fetch needs is
//! owned ([`SliceJob`]), so the next slice can be fetched by a task of its own while this one is
//! sent.

use crate::cache::entry::{Entry, Meta};
use crate::cache::fill::Fill;
use crate::cache::growing::{Growing, Progress, Reader};
use crate::cache::key::CacheKey;
use crate::cache::lock::{LeaderGuard, Role};
use crate::cache::policy;
use crate::cache::slice::{self, SliceAnswer, Slicing};
use crate::cache::stored_meta::revalidated_meta;
use crate::http::request::RequestHead;
use crate::server::request_body::RequestBody;
use crate::upstream::Group;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use zerocache_ledger::CacheStatus;

use super::stream::{drain, pump, upstream_closes};
use super::{Fetch, FetchOptions, FetchSpec};

/// Slice fetches started ahead of the response that wants them, in the whole process.
static PREFETCHING: AtomicUsize = AtomicUsize::new(0);

/// At most this many at once: past it, a slice is fetched when its response reaches it.
const MAX_PREFETCHES: usize = 32;

/// Slice fills at once in the whole process: a fill may outlive the response that started it
/// (it reads to its slice's end), so a client walking an object's slices could otherwise start
/// any number. Past it a slice waits for a permit up to the upstream's read timeout, then 503.
const MAX_FILLS: usize = 64;

/// The permits of [`MAX_FILLS`].
fn fill_permits() -> Arc<Semaphore> {
    static PERMITS: std::sync::OnceLock<Arc<Semaphore>> = std::sync::OnceLock::new();
    PERMITS
        .get_or_init(|| Arc::new(Semaphore::new(MAX_FILLS)))
        .clone()
}

/// How one exchange for a slice ended.
enum Once {
    /// With this.
    Done(Got),
    /// A revalidation that cannot stand: fetch the slice whole, with the lock and permit held.
    Unconditional((LeaderGuard, OwnedSemaphorePermit)),
}

/// What every slice of one client's request is fetched with.
pub(crate) struct SliceJob {
    /// The client's request with its `Range` and preconditions removed: a slice's request adds
    /// its own `Range`, and never carries one client's conditions to an entry all clients share.
    pub req: RequestHead,
    pub upstream: Arc<Group>,
    /// The object's primary key: slice keys are made from it, and it picks the upstream server,
    /// so every slice of an object comes from the same one.
    pub primary: CacheKey,
    /// The URL key text every slice is stored under (a URL purge finds them all).
    pub url: String,
    pub slicing: Slicing,
    pub ttls: crate::routing::Ttls,
    pub store_set_cookie: bool,
    /// The route's bounds, applied to each slice.
    pub object_sizes: crate::routing::ObjectSizes,
    pub peer: IpAddr,
    pub hash_bits: u32,
    /// The slices this request's fetches stored (its prefetches too): found stored later, they
    /// are still fetched for it, not hits.
    pub fetched_here: parking_lot::Mutex<std::collections::HashSet<u64>>,
}

/// A slice a response can send: stored, or being stored (its bytes sent as they come, as a
/// whole-object miss's are).
#[derive(Clone)]
pub(crate) enum Piece {
    /// In the store: its entry.
    Stored(Arc<Entry>),
    /// Being filled: its file as it grows, and its entry as it will be indexed; and a reader
    /// of it, held while this response may still send it, so the fill counts this response
    /// among its readers (a fill all its readers left stops: `pump`'s abandon rule).
    Growing(Arc<Growing>, Arc<Reader>),
}

impl Piece {
    /// The slice's entry: its metadata (for a growing one, as it will be indexed).
    pub(crate) fn entry(&self) -> &Entry {
        match self {
            Piece::Stored(e) => e,
            Piece::Growing(g, _) => &g.entry,
        }
    }

    /// The slice's body length (a growing one's is its response's, which `judge` checked).
    pub(crate) fn body_len(&self) -> u64 {
        match self {
            Piece::Stored(e) => e.body_len,
            Piece::Growing(g, _) => g.length.unwrap_or(0),
        }
    }
}

/// What became of one slice.
pub(crate) enum Got {
    /// Stored or being stored: the slice and whether it was fetched for this request.
    Stored(Piece, bool),
    /// The origin's answer is no slice of this object (`SliceAnswer::Whole`/`Unusable`): the
    /// object is served unsliced.
    Unsliceable(&'static str),
    /// The slice starts past the object's end (the origin's 416, with its length if it said).
    PastEnd(Option<u64>),
    /// The origin failed: answer with this status.
    Failed(u16),
}

impl SliceJob {
    /// The stored slice `k` of this object, fresh or not.
    fn indexed(&self, ctx: &crate::server::Ctx, k: u64) -> Option<Arc<Entry>> {
        let key = self.slicing.key(&self.primary, k, self.hash_bits);
        ctx.store
            .lookup_varying(&key, |_| key.clone())
            .filter(|e| !crate::fleet::Fleet::drops(ctx.fleet.as_deref(), &ctx.store, e))
    }

    /// Whether slice `k` is in the index, fresh or not: one lookup, no file read.
    pub(crate) fn is_indexed(&self, ctx: &crate::server::Ctx, k: u64) -> bool {
        ctx.store
            .contains(self.slicing.key(&self.primary, k, self.hash_bits).hash)
    }

    /// The stored slice `k` of this object, if it is there and fresh.
    pub(crate) fn stored(&self, ctx: &crate::server::Ctx, k: u64) -> Option<Arc<Entry>> {
        self.indexed(ctx, k).filter(|e| {
            // The client's own request directives do not reach a slice (as in nginx): one
            // `no-cache` would otherwise refetch every slice of a 20 GB object.
            let fresh = crate::cache::freshness::decide(
                e.age(crate::clock::now()),
                e.meta.lifetime,
                e.reuse,
                &Default::default(),
            );
            fresh == crate::cache::freshness::Use::Fresh
        })
    }

    /// Slice `k`: stored and fresh, else fetched under its fill lock, or waited for behind the
    /// request that holds it. Stored slices that are no longer fresh are fetched again.
    pub(crate) async fn get(self: &Arc<Self>, ctx: &Arc<crate::server::Ctx>, k: u64) -> Got {
        let key = self.slicing.key(&self.primary, k, self.hash_bits);
        // A follower that found nothing after its leader let go asks once more, as a leader.
        for _ in 0..3 {
            if let Some(e) = self.stored(ctx, k) {
                let fetched = self.fetched_here.lock().contains(&k);
                return Got::Stored(Piece::Stored(e), fetched);
            }
            match ctx.locks.acquire(key.hash) {
                Role::Leader(guard) => {
                    // A fill may outlive its response: at most `MAX_FILLS` in the process.
                    let permit = tokio::time::timeout(
                        self.upstream.read_timeout,
                        fill_permits().acquire_owned(),
                    )
                    .await;
                    let Ok(Ok(permit)) = permit else {
                        return Got::Failed(503);
                    };
                    return self.fetch(ctx, k, &key, guard, permit).await;
                }
                // Behind another request's fetch of it: its bytes as they come, once its head
                // is in; when it let go without storing, looked up (or fetched) again.
                // Not from the store: `X-Cache: MISS`, as for a slice this response fetched.
                Role::Follower(rx) => {
                    let wait = self.upstream.read_timeout;
                    match tokio::time::timeout(wait, crate::cache::lock::wait(rx)).await {
                        Ok(Some(g)) if g.entry.meta.key == key.text => {
                            let r = Arc::new(g.reader());
                            return Got::Stored(Piece::Growing(g, r), true);
                        }
                        // Another key's fill under the same hash (only with the short hashes
                        // tests force): not this slice.
                        Ok(Some(_)) => return Got::Failed(502),
                        Ok(None) => {}
                        Err(_) => return Got::Failed(504),
                    }
                }
            }
        }
        Got::Failed(502)
    }

    /// Starts fetching slice `k` in a task of its own when it is neither stored nor being
    /// fetched: the next slice of a response comes in while this one is sent.
    pub(crate) fn prefetch(self: &Arc<Self>, ctx: &Arc<crate::server::Ctx>, k: u64) {
        if self.stored(ctx, k).is_some() {
            return;
        }
        let key = self.slicing.key(&self.primary, k, self.hash_bits);
        let Role::Leader(guard) = ctx.locks.acquire(key.hash) else {
            return;
        };
        // Bounded for the process: a client that reads a head and resets leaves at most one
        // slice fetch behind it, and all such clients together at most `MAX_PREFETCHES`.
        if PREFETCHING.fetch_add(1, Ordering::Relaxed) >= MAX_PREFETCHES {
            PREFETCHING.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let Ok(permit) = fill_permits().try_acquire_owned() else {
            PREFETCHING.fetch_sub(1, Ordering::Relaxed);
            return;
        };
        let (job, ctx) = (self.clone(), ctx.clone());
        tokio::spawn(async move {
            // Counted, and reading, until the slice is whole: a fetch returns once its head
            // is in, and a prefetch is a reader its fill must not be abandoned by.
            if let Got::Stored(Piece::Growing(g, _), _) =
                job.fetch(&ctx, k, &key, guard, permit).await
            {
                let mut r = g.reader();
                let mut p = r.now();
                while let Progress::Writing(_) = p {
                    p = r.next(job.upstream.read_timeout.saturating_mul(2)).await;
                }
            }
            PREFETCHING.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Fetches slice `k` from the origin and stores it, holding its fill lock and a fill
    /// permit: a stale slice revalidated first, and fetched whole when its revalidation cannot
    /// stand (a 304 of other validators, or the slice gone meanwhile).
    async fn fetch(
        &self,
        ctx: &Arc<crate::server::Ctx>,
        k: u64,
        key: &CacheKey,
        guard: LeaderGuard,
        permit: OwnedSemaphorePermit,
    ) -> Got {
        // Fetched for this request from here on, whatever comes of it: the access log's
        // `$slices_fetched`, and no hit counted for it even when the body waits for it.
        self.fetched_here.lock().insert(k);
        match self.fetch_once(ctx, k, key, (guard, permit), true).await {
            Once::Done(got) => got,
            Once::Unconditional(held) => match self.fetch_once(ctx, k, key, held, false).await {
                Once::Done(got) => got,
                Once::Unconditional(_) => Got::Failed(502),
            },
        }
    }

    /// One exchange for slice `k`: conditional on a stale slice's ETag when `revalidate`.
    async fn fetch_once(
        &self,
        ctx: &Arc<crate::server::Ctx>,
        k: u64,
        key: &CacheKey,
        (guard, permit): (LeaderGuard, OwnedSemaphorePermit),
        revalidate: bool,
    ) -> Once {
        let asked = self.slicing.request_range(k);
        let mut req = self.req.clone();
        req.fields.push((
            "Range".into(),
            format!("bytes={}-{}", asked.0, asked.1).into_bytes(),
        ));
        // A stored slice no longer fresh is revalidated by its ETag: a 304 makes it fresh
        // again without its bytes (RFC 9110 §13.2.2 puts If-None-Match before Range).
        let stale = self
            .indexed(ctx, k)
            .filter(|e| revalidate && e.etag.is_some());
        if let Some(etag) = stale.as_ref().and_then(|e| e.etag.as_deref()) {
            req.fields
                .push(("If-None-Match".into(), etag.as_bytes().to_vec()));
        }
        let f = Fetch::new(FetchSpec {
            req: &req,
            body: RequestBody::Whole(Vec::new()),
            upstream: self.upstream.clone(),
            started: Instant::now(),
            status: CacheStatus::Miss,
            detail: "miss",
            opts: FetchOptions::default(),
        });
        let request = f.upstream_request(self.peer, ctx);
        let exchanged =
            super::exchange_alone(ctx, &self.upstream, &request, &self.primary.text).await;
        let (up, head, request_time, response_time) = match exchanged {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, slice = k, error = %e, "slice fetch failed");
                return Once::Done(Got::Failed(e.status()));
            }
        };
        let Ok(framing) = head.framing(false) else {
            ctx.accounting
                .upstream_error(&self.upstream.name, "protocol");
            return Once::Done(Got::Failed(502));
        };
        if head.status == 304
            && let Some(stale) = stale
        {
            drain(up, &head, framing, &self.upstream).await;
            let (meta, storable) = revalidated_meta(
                &stale,
                &head,
                request_time,
                response_time,
                self.ttls.heuristics(ctx.storing.heuristic_max),
                self.store_set_cookie,
                ctx.store.targeted(),
            );
            // A 304 updates only the response its validators name (RFC 9111 §4.3.4): other
            // ones (a weak or new ETag, a new Last-Modified) say the slice is not what the
            // origin has now, and one gone meanwhile has nothing to update: fetched whole.
            let same = |name: &str, stored: &Option<String>| {
                head.field(name)
                    .is_none_or(|v| Some(v.trim()) == stored.as_deref())
            };
            if !same("etag", &stale.etag)
                || !same("last-modified", &stale.last_modified)
                || !ctx.store.is_current(&stale)
            {
                ctx.store.remove_if_same(&stale);
                return Once::Unconditional((guard, permit));
            }
            if !storable || meta.lifetime <= meta.initial_age {
                ctx.store.remove_if_same(&stale);
                let why = if storable {
                    "slice-stale"
                } else {
                    "not-storable"
                };
                return Once::Done(self.unsliced(ctx, why, true));
            }
            ctx.accounting.slices.revalidated();
            let updated = ctx.store.replace_meta(&stale, meta);
            return Once::Done(Got::Stored(Piece::Stored(updated), true));
        }
        let answer = slice::judge(
            head.status,
            head.field("content-range"),
            framing.length(),
            (head.field("etag"), head.field("last-modified")),
            head.field("vary").is_some_and(|v| !v.trim().is_empty()),
            asked,
        );
        let identity = match answer {
            SliceAnswer::Slice(identity) => identity,
            SliceAnswer::PastEnd(total) => {
                drain(up, &head, framing, &self.upstream).await;
                return Once::Done(Got::PastEnd(total));
            }
            SliceAnswer::Whole => return Once::Done(self.unsliced(ctx, "slice-whole", true)),
            SliceAnswer::Unusable(why) => {
                tracing::debug!(target = %req.target, slice = k, why, "origin's answer is no slice; served unsliced");
                // A status (a 403, a 404, a 5xx) may be this request's doing: it is served the
                // ordinary way, and says nothing about the object for other clients.
                return Once::Done(self.unsliced(ctx, why, why != "slice-status"));
            }
        };
        if identity.total > self.slicing.max_object {
            return Once::Done(self.unsliced(ctx, "too-large", true));
        }
        let len = framing.length().unwrap_or(0);
        let fill = match self.fill_of(ctx, key, &head, len, (request_time, response_time)) {
            Ok(f) => f,
            Err((why, of_the_object)) => {
                ctx.accounting.not_stored(why);
                return Once::Done(self.unsliced(ctx, why, of_the_object));
            }
        };
        // The body is stored by a task of its own at the origin's speed; this response and
        // any other that wants the slice read behind it (`sliced_send`), never waiting for
        // the whole slice before its first byte.
        let (g, w) = Growing::new(fill.file(), fill.entry_preview(), framing.length());
        let reader = Arc::new(g.reader());
        guard.publish(g.clone());
        let reuse = !upstream_closes(&head);
        // Counted as its body starts: a body that fails is counted by `pump` as an upstream
        // error beside it.
        ctx.accounting.slices.fetched(len);
        let pumped = pump(
            ctx.clone(),
            up,
            framing,
            self.upstream.clone(),
            key.hash,
            fill,
            w,
            Some(guard),
            reuse,
            true,
        );
        tokio::spawn(async move {
            pumped.await;
            drop(permit);
        });
        Once::Done(Got::Stored(Piece::Growing(g, reader), true))
    }

    /// This request is served unsliced, for `why`; and, when `why` is the object's and not
    /// the request's, every request for it for a while (`Store::unsliced`).
    fn unsliced(&self, ctx: &crate::server::Ctx, why: &'static str, of_the_object: bool) -> Got {
        if of_the_object {
            ctx.store.unsliced().note(self.primary.hash);
            ctx.accounting.slices.unsliced(why);
        }
        Got::Unsliceable(why)
    }

    /// The fill of slice `key` from the origin's 206 `head`: stored under the rules a whole
    /// response of the object would be (its directives, cookies, freshness), as a 206 whose
    /// `Content-Range` names where it sits in the object.
    fn fill_of(
        &self,
        ctx: &crate::server::Ctx,
        key: &CacheKey,
        head: &crate::http::response::ResponseHead,
        len: u64,
        (request_time, response_time): (SystemTime, SystemTime),
    ) -> Result<Fill, (&'static str, bool)> {
        // Judged as the whole response it is a piece of.
        let mut whole = head.clone();
        whole.status = 200;
        whole
            .fields
            .retain(|(n, _)| !n.eq_ignore_ascii_case("content-range"));
        let heuristics = self.ttls.heuristics(ctx.storing.heuristic_max);
        let rules = super::rules(ctx, self.store_set_cookie);
        let st = policy::storable(
            &self.req,
            &whole,
            request_time,
            response_time,
            heuristics,
            rules,
        )
        .map_err(|why| (why.token(), why.caused_by_response()))?;
        // Stored only to be fetched again at once (no-cache, max-age=0, an Age past it): served
        // the ordinary way, which revalidates.
        if st.lifetime <= st.initial_age {
            return Err(("slice-stale", true));
        }
        let mut fields = st.fields;
        let cr = head.field("content-range").unwrap_or_default();
        fields.extend_from_slice(format!("Content-Range: {}\r\n", cr.trim()).as_bytes());
        let meta = Meta {
            key: key.text.clone(),
            stored_at: crate::clock::shifted(response_time),
            initial_age: st.initial_age,
            lifetime: st.lifetime,
            status: 206,
            reason: head.reason.clone(),
            fields,
            vary: Vec::new(),
            url: self.url.clone(),
        };
        // `min_object_size` is the whole object's business: an object's last slice is short.
        let max = super::max_body(ctx, self.object_sizes);
        super::new_fill(ctx, key.hash, meta, len, (0, max)).map_err(|why| (why, false))
    }
}
