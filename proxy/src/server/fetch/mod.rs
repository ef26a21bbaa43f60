//! Forwarding a request upstream and streaming the response to the client, filling the cache on
//! the way when the response may be stored (a miss or an expired entry) or not (a bypass).
//!
//! The order of the last steps is the promise the cache makes: the entry is committed (renamed
//! into place and indexed) before the last body byte goes to the client, so a client that has read
//! a whole MISS and asks again gets a HIT. An upstream that fails mid-body leaves no entry and the
//! client connection closed, never a short response followed by keep-alive.

use super::hit::HitKind;
use super::request_body::{BodyError, RequestBody};
use crate::cache::conditional::Precondition;
use crate::cache::entry::Entry;
use crate::cache::entry::Meta;
use crate::cache::growing::{Growing, Reader};
use crate::cache::key::CacheKey;
use crate::cache::lock::LeaderGuard;
use crate::cache::policy;
use crate::cache::stored_meta::revalidated_meta;
use crate::http::request::RequestHead;
use crate::http::response::{BodyFraming, ResponseHead};
use crate::upstream::{Group, UpstreamConn, UpstreamError};
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use zerocache_ledger::CacheStatus;

mod background;
mod fleet;
mod forward;
mod run;
pub(crate) mod slice;
mod stream;

/// One upstream fetch for one client request.
pub struct Fetch<'a> {
    req: &'a RequestHead,
    body: RequestBody,
    upstream: Arc<Group>,
    status: CacheStatus,
    detail: &'static str,
    /// The key to fill and the coalescing guard, when the response may be stored.
    fill: Option<(CacheKey, Option<LeaderGuard>)>,
    started: Instant,
    ttls: crate::routing::Ttls,
    /// The stored response being revalidated: its validators go upstream, and a 304 serves it.
    revalidating: Option<Arc<Entry>>,
    /// The URL key text of the entry being filled (see `Meta::url`).
    url: String,
    /// For unsafe methods: invalidate stored URLs on a non-error response, keeping the query in
    /// the key or not (the route's `cache_key.query`).
    invalidate: Option<bool>,
    /// How long past expiry the revalidated entry may be served if the upstream fails.
    stale_grace: std::time::Duration,
    /// Why the response will not be stored, decided before it arrives (a fat GET, a Range miss).
    not_stored: Option<&'static str>,
    /// A Range miss: the whole object to fill in the background once its size is known.
    range_fill: Option<RangeFill>,
    /// The route's `store_set_cookie`.
    store_set_cookie: bool,
    /// The origin answered before the whole request body was sent: its connection is not
    /// pooled.
    no_pool: bool,
    /// ...and the client's body was not read to its end: its connection closes.
    body_unfinished: bool,
    /// The client's body has been read to its end (a whole one from the start; a streamed one
    /// once sent): until then the next bytes on the connection are no request.
    body_read: bool,
    /// A HEAD's stale stored GET response and its URL's primary key hash, updated or made
    /// stale by a 200 (§4.3.5).
    head_update: Option<(Arc<Entry>, u128)>,
    /// The fleet members to ask before the origin (this node does not own the key).
    fleet: Option<crate::fleet::forward::Plan>,
    /// The peer whose answer is being relayed (see `fleet::forward`).
    via_peer: Option<crate::fleet::forward::Relay>,
    /// `false`: the answer is not stored here (an owner's, or `on_owner_down: origin`).
    store_here: bool,
    /// The body sizes the route stores.
    object_sizes: crate::routing::ObjectSizes,
}

/// How a response body reaches the client.
pub enum Body {
    /// Stored: a fill task writes it to the cache file, the client reads behind it.
    Behind(Arc<Growing>, Reader),
    /// Not stored: streamed from the upstream connection through the proxy.
    Stream(UpstreamConn),
}

/// Why a streamed request failed.
enum StreamError {
    /// The upstream failed (502/504).
    Upstream(UpstreamError),
    /// The client's body failed (408/400/413, or the client went away).
    Body(BodyError),
}

impl From<UpstreamError> for StreamError {
    fn from(e: UpstreamError) -> StreamError {
        StreamError::Upstream(e)
    }
}

/// The origin's answer as the client gets it: its head and framing, where its body comes from
/// (read behind the fill that stores it, or streamed from the upstream), and what the cache did,
/// for the connection's head and accounting.
pub struct Relayed {
    /// The origin's head, fields as received.
    pub head: ResponseHead,
    /// How the origin framed the body.
    pub framing: BodyFraming,
    /// Where the body comes from.
    pub body: Body,
    /// `NotModified`/`Failed`: the whole representation was fetched in place of the client's
    /// conditional request; answer its precondition (304/412) instead (RFC 9110 §13.2.2).
    pub local: Precondition,
    /// Why the answer is not stored (`Cache-Status: detail=`).
    pub not_stored: Option<&'static str>,
    /// What the cache did (`X-Cache`).
    pub status: CacheStatus,
    /// `Cache-Status`'s `fwd=` reason of a bypass.
    pub detail: &'static str,
    /// The group the body is streamed from (its read timeout, its pool).
    pub upstream: Arc<Group>,
    /// The fleet member whose answer this is, when it is one.
    pub via_peer: Option<crate::fleet::forward::Relay>,
    /// A streamed body's upstream connection may go back to the pool once read.
    pub reuse: bool,
    /// The client's body was not read to its end (the connection closes after this).
    pub body_unfinished: bool,
}

impl std::fmt::Debug for Relayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relayed")
            .field("status", &self.head.status)
            .field("framing", &self.framing)
            .field("stored", &matches!(self.body, Body::Behind(..)))
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// What a Range miss needs to fill the whole object in the background.
pub struct RangeFill {
    /// The primary key of the object.
    pub primary: CacheKey,
    /// The URL key text (see `Meta::url`).
    pub url: String,
    /// The route's `default_ttl` and `status_ttl`.
    pub ttls: crate::routing::Ttls,
}

/// What a fetch got, for the connection to send. The fetch exchanges with the upstream, updates
/// the store and starts a fill, but writes nothing to the client: keeping the data flow one way
/// (request → fetch → outcome → response), and the fetch dropped before the connection sends
/// anything (a fill's lock lives on in its pump task).
pub struct Fetched {
    /// Interim responses (103 Early Hints) that came before a final head, in order: the
    /// connection sends them on first (never to an HTTP/1.0 client). Empty when the exchange
    /// failed: the client hears of the failure alone.
    pub interim: Vec<ResponseHead>,
    /// The upstream's part of the access-log line, once its head arrived (with an access log).
    pub upstream: Option<crate::accesslog::UpstreamInfo>,
    /// The client's body was not read to its end (an origin that answered early, an exchange
    /// that failed before the body was sent, or the client's body failed): the connection closes
    /// after this answer.
    pub must_close: bool,
    /// What the connection does.
    pub outcome: Outcome,
}

/// What the connection does with a fetch's result.
#[derive(Debug)]
pub enum Outcome {
    /// Send the origin's answer (see [`Relayed`]).
    Relay(Box<Relayed>),
    /// Serve this stored entry: stale in place of a failed upstream, or just revalidated.
    ServeStored {
        /// The entry.
        entry: Arc<Entry>,
        /// How it is served (`STALE`, `REVALIDATED`).
        kind: HitKind,
        /// Remove it from the cache once this client has it (its new directives forbid storing).
        then_remove: bool,
        /// Header lines for this client alone, replacing the stored fields of their names in
        /// this one response: a 304's `Set-Cookie` (`validation::requester_fields`).
        requester: Vec<u8>,
    },
    /// Answer with a short generated response (an upstream that failed or misframed).
    Reply {
        /// Status code.
        status: u16,
        /// `Cache-Status: zerocache; fwd=miss; detail=...` when the failure has a name the
        /// client may see (`tls-verify`).
        detail: Option<&'static str>,
    },
    /// The client's body could not be read to its end: refuse it.
    RefuseBody(BodyError),
}

impl Outcome {
    /// A stored entry served stale in place of a failed upstream answer.
    fn stale(entry: Arc<Entry>) -> Outcome {
        Outcome::ServeStored {
            entry,
            kind: HitKind::Stale,
            then_remove: false,
            requester: Vec::new(),
        }
    }
}

/// What a connection asks of a fetch, every part named: the request and its body, where it
/// goes, what the cache did so far, and the [`FetchOptions`] its plan calls for.
pub struct FetchSpec<'a> {
    pub req: &'a RequestHead,
    pub body: RequestBody,
    pub upstream: Arc<Group>,
    /// When the request's head was complete.
    pub started: Instant,
    /// What the cache did (`X-Cache`): miss, expired, bypass.
    pub status: CacheStatus,
    /// `Cache-Status`'s `fwd=` reason (`miss`, `stale`, `method`, `bypass`).
    pub detail: &'static str,
    pub opts: FetchOptions,
}

/// The optional parts of a fetch; the defaults store nothing special and forward plainly.
pub struct FetchOptions {
    /// The key to fill and the coalescing guard, when the response may be stored.
    pub fill: Option<(CacheKey, Option<LeaderGuard>)>,
    /// The route's `default_ttl` and `status_ttl`: freshness for storable responses that carry
    /// none.
    pub ttls: crate::routing::Ttls,
    /// Revalidate this stale entry instead of fetching unconditionally (RFC 9111 §4.3.1).
    pub revalidating: Option<Arc<Entry>>,
    /// The URL key text the filled entry is indexed under for invalidation and purge.
    pub url: String,
    /// Invalidate the target (and same-origin `Location`/`Content-Location`) on a non-error
    /// response, keeping the query in the key or not (RFC 9111 §4.4).
    pub invalidate: Option<bool>,
    /// How long past expiry the entry being revalidated may be served if the upstream fails.
    pub stale_grace: std::time::Duration,
    /// The response will not be stored, for this reason (`Cache-Status: detail=`).
    pub not_stored: Option<&'static str>,
    /// A Range miss: after a 206 whose complete length is at most `cache.range_fill_max`, fill
    /// the whole object in the background.
    pub range_fill: Option<RangeFill>,
    /// The route's `store_set_cookie`: whether responses that set cookies may be stored.
    pub store_set_cookie: bool,
    /// A HEAD forwarded while this (a GET response it could have been answered from) is stale:
    /// a 200 updates or invalidates it, under the fill lock of the primary key hash.
    pub head_update: Option<(Arc<Entry>, u128)>,
    /// Ask these fleet members first (a miss of a key this node does not own).
    pub fleet: Option<crate::fleet::forward::Plan>,
    /// The body sizes the route stores (`max_object_size`, `min_object_size`).
    pub object_sizes: crate::routing::ObjectSizes,
}

impl Default for FetchOptions {
    fn default() -> FetchOptions {
        FetchOptions {
            fill: None,
            ttls: crate::routing::Ttls::default(),
            revalidating: None,
            url: String::new(),
            invalidate: None,
            stale_grace: std::time::Duration::ZERO,
            not_stored: None,
            range_fill: None,
            store_set_cookie: true,
            head_update: None,
            fleet: None,
            object_sizes: crate::routing::ObjectSizes::ANY,
        }
    }
}

impl<'a> Fetch<'a> {
    /// Prepares a fetch.
    pub fn new(spec: FetchSpec<'a>) -> Fetch<'a> {
        let FetchSpec {
            req,
            body,
            upstream,
            started,
            status,
            detail,
            opts,
        } = spec;
        Fetch {
            req,
            body_read: matches!(body, RequestBody::Whole(_)),
            body,
            upstream,
            status,
            detail,
            fill: opts.fill,
            started,
            ttls: opts.ttls,
            revalidating: opts.revalidating,
            url: opts.url,
            invalidate: opts.invalidate,
            stale_grace: opts.stale_grace,
            not_stored: opts.not_stored,
            range_fill: opts.range_fill,
            store_set_cookie: opts.store_set_cookie,
            no_pool: false,
            body_unfinished: false,
            head_update: opts.head_update,
            fleet: opts.fleet,
            via_peer: None,
            store_here: true,
            object_sizes: opts.object_sizes,
        }
    }

    /// The request being fetched for.
    pub fn request(&self) -> &'a RequestHead {
        self.req
    }

    /// When the request's head was complete.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// `stored` updated by `head` (a 304 to a revalidation, a 200 to a HEAD) under this route's
    /// rules, and whether it may stay stored.
    fn updated_meta(
        &self,
        ctx: &crate::server::Ctx,
        stored: &Entry,
        head: &ResponseHead,
        request_time: SystemTime,
        response_time: SystemTime,
    ) -> (Meta, bool) {
        revalidated_meta(
            stored,
            head,
            request_time,
            response_time,
            self.heuristics(ctx),
            self.store_set_cookie,
            ctx.store.targeted(),
        )
    }

    /// The largest body this fetch may store: the route's bound, within the cache's size.
    fn max_body(&self, ctx: &crate::server::Ctx) -> u64 {
        max_body(ctx, self.object_sizes)
    }

    fn rules<'c>(&self, ctx: &'c crate::server::Ctx) -> policy::Rules<'c> {
        rules(ctx, self.store_set_cookie)
    }

    /// The entry being revalidated, if it may be served stale now that the upstream failed
    /// (RFC 5861 stale-if-error, or the route's grace without it), never past
    /// must-revalidate/proxy-revalidate/no-cache.
    fn stale_on_error(&self) -> Option<Arc<Entry>> {
        let e = self.revalidating.as_ref()?;
        crate::cache::stale::if_error(e, self.stale_grace, crate::clock::now()).then(|| e.clone())
    }
}

/// An exchange with no client waiting (a background refresh, a slice's fetch): the request
/// sent on a pooled connection (retried once on a dead one; balanced by `key`), interim heads
/// dropped, its failure or its answer counted. Returns the connection, the head, and when the
/// request went and the answer came.
pub(super) async fn exchange_alone(
    ctx: &crate::server::Ctx,
    upstream: &Group,
    request: &[u8],
    key: &str,
) -> Result<(UpstreamConn, ResponseHead, SystemTime, SystemTime), UpstreamError> {
    let request_time = SystemTime::now();
    let (up, head) = match upstream
        .exchange(request, true, key, &mut Vec::new(), &mut None)
        .await
    {
        Ok(x) => x,
        Err(e) => {
            if !e.counted_per_attempt() {
                ctx.accounting.upstream_error(&upstream.name, e.kind());
            }
            return Err(e);
        }
    };
    let response_time = SystemTime::now();
    ctx.accounting.upstream_response(
        &upstream.name,
        upstream.server_of(&up),
        head.status,
        response_time
            .duration_since(request_time)
            .unwrap_or_default(),
    );
    Ok((up, head, request_time, response_time))
}

/// The largest body a fetch under `ctx` with the route's `sizes` may store: its
/// `max_object_size`, never more than the cache's `max_size`.
fn max_body(ctx: &crate::server::Ctx, sizes: crate::routing::ObjectSizes) -> u64 {
    sizes
        .max
        .map_or(ctx.store.max_size(), |m| m.min(ctx.store.max_size()))
}

/// The storage rules of a response fetched under `ctx` for a route that stores `Set-Cookie` or
/// not: the same for a client's fetch and a background refresh.
fn rules(ctx: &crate::server::Ctx, store_set_cookie: bool) -> policy::Rules<'_> {
    policy::Rules {
        store_5xx: ctx.storing.store_5xx,
        store_set_cookie,
        targeted: ctx.store.targeted(),
    }
}

/// The temp file of an entry `meta` under `hash` with `len` body bytes' room reserved, bounded to
/// `(min, max)`: not into a directory handed over (`upgrade`), and `cache-unwritable` when it
/// cannot be made (see `run::create_fill`). A whole response's fill and a slice's are made here.
pub(super) fn new_fill(
    ctx: &crate::server::Ctx,
    hash: u128,
    meta: crate::cache::entry::Meta,
    len: u64,
    (min, max): (u64, u64),
) -> Result<crate::cache::fill::Fill, &'static str> {
    if ctx.store.is_handing_over() {
        return Err("upgrade");
    }
    crate::cache::fill::Fill::create(ctx.store.clone(), hash, meta)
        .map(|f| f.bounded(min, max))
        .and_then(|f| {
            ctx.store
                .on_full_disk_evict_and_retry(len, || f.reserve(len))?;
            Ok(f)
        })
        .map_err(|e| {
            ctx.store.write_failed(&e);
            "cache-unwritable"
        })
}
