//! Forwarding a request upstream and streaming the response to the client, filling the cache on
//! the way when the response may be stored (a miss or an expired entry) or not (a bypass).
//!
//! The order of the last steps is the promise the cache makes: the entry is committed (renamed
//! into place and indexed) before the last body byte goes to the client, so a client that has read
//! a whole MISS and asks again gets a HIT. An upstream that fails mid-body leaves no entry and the
//! client connection closed, never a short response followed by keep-alive.

use super::conn::{Conn, ConnError};
use super::hit::HitKind;
use super::upload::{BUFFERED_MAX, BodyError, Remaining, RequestBody};
use crate::cache::conditional::{self, Precondition};
use crate::cache::entry::Entry;
use crate::cache::entry::Meta;
use crate::cache::fill::Fill;
use crate::cache::freshness::Heuristics;
use crate::cache::growing::{Growing, Reader, Writer};
use crate::cache::invalidation;
use crate::cache::key::CacheKey;
use crate::cache::lock::{LeaderGuard, Role};
use crate::cache::policy;
use crate::cache::stored_meta::{fill_meta, revalidated_meta};
use crate::cache::validation;
use crate::http::headers::{self, put, put_num};
use crate::http::range;
use crate::http::request::RequestHead;
use crate::http::response::BodyFraming;
use crate::http::response::{ResponseHead, reason};
use crate::upstream::body::BodyReader;
use crate::upstream::{Group, UpstreamConn, UpstreamError};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use tokio::io::AsyncWriteExt;
use zerocache_dashboard::{CacheStatus, DataPath, ResponseRecord};

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
    default_ttl: Option<std::time::Duration>,
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
    /// A HEAD's stale stored GET response and its URL's primary key hash, updated or made
    /// stale by a 200 (§4.3.5).
    head_update: Option<(Arc<Entry>, u128)>,
    /// The fleet members to ask before the origin (this node does not own the key).
    fleet: Option<crate::fleet::forward::Plan>,
    /// The peer that answered, and whether this node stores its answer (see `fleet::forward`).
    via_peer: Option<crate::fleet::forward::Relay>,
    /// `false`: the answer is not stored here (an owner's, or `on_owner_down: origin`).
    store_here: bool,
}

/// How a response body reaches the client.
enum Body {
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

/// What a Range miss needs to fill the whole object in the background.
pub struct RangeFill {
    /// The primary key of the object.
    pub primary: CacheKey,
    /// The URL key text (see `Meta::url`).
    pub url: String,
    /// The route's `default_ttl`.
    pub default_ttl: Option<std::time::Duration>,
}

/// A background refresh for stale-while-revalidate: the same exchange as a fetch, with no
/// client waiting; the fill lock it holds keeps it to one refresh per entry at a time.
pub struct Background {
    req: RequestHead,
    upstream: Arc<Group>,
    primary: CacheKey,
    url: String,
    /// The entry being refreshed; `None` for the first fill after a Range miss.
    stale: Option<Arc<Entry>>,
    default_ttl: Option<std::time::Duration>,
    guard: LeaderGuard,
    store_set_cookie: bool,
}

use crate::cache::policy::proxy_owned;

/// Fields in which a client states its own address, as origins read them for geolocation and
/// rate limits: forwarded only from a trusted proxy.
const CLIENT_ADDRESS_FIELDS: &[&str] = &[
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
];

/// The `for=` pairs of a trusted proxy's `Forwarded` field, one element each: `host=`, `proto=`
/// and `by=` describe the request as the client framed it, and none of them is in the cache key,
/// so they are never passed on (RFC 7239 §5).
fn forwarded_for_only(v: &str) -> String {
    v.split(',')
        .filter_map(|element| {
            element.split(';').map(str::trim).find(|pair| {
                pair.len() > 4
                    && pair
                        .get(..4)
                        .is_some_and(|p| p.eq_ignore_ascii_case("for="))
            })
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a fetch leaves to the connection: the fetch exchanges with the upstream and streams what
/// it relays, but never calls back into the connection to serve an entry or a generated answer.
/// Returning those instead keeps the data flow one way (request → fetch → outcome → response) and
/// drops the fetch, with its fill lock, before the connection serves anything.
#[derive(Debug)]
pub enum Outcome {
    /// The response went out (relayed, or answered from the fetched head); `true` keeps the
    /// connection.
    Done(bool),
    /// Serve this stored entry: stale in place of a failed upstream, or just revalidated.
    ServeStored {
        /// The entry.
        entry: Arc<Entry>,
        /// How it is served (`STALE`, `REVALIDATED`).
        kind: HitKind,
        /// Remove it from the cache once this client has it (its new directives forbid storing).
        then_remove: bool,
    },
    /// Answer with a short generated response (an upstream that failed or misframed).
    Reply {
        /// Status code.
        status: u16,
        /// The `X-Cache` the client sees (what the cache did); the accounting records `ERROR`.
        x_cache: Option<CacheStatus>,
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
        }
    }
}

impl<'a> Fetch<'a> {
    /// Prepares a fetch.
    pub fn new(
        req: &'a RequestHead,
        body: RequestBody,
        upstream: Arc<Group>,
        status: CacheStatus,
        detail: &'static str,
        fill: Option<(CacheKey, Option<LeaderGuard>)>,
        started: Instant,
    ) -> Fetch<'a> {
        Fetch {
            req,
            body,
            upstream,
            status,
            detail,
            fill,
            started,
            default_ttl: None,
            revalidating: None,
            url: String::new(),
            invalidate: None,
            stale_grace: std::time::Duration::ZERO,
            not_stored: None,
            range_fill: None,
            store_set_cookie: true,
            no_pool: false,
            body_unfinished: false,
            head_update: None,
            fleet: None,
            via_peer: None,
            store_here: true,
        }
    }

    /// Ask the fleet members of `plan` first (a miss of a key this node does not own).
    pub(crate) fn fleet(mut self, plan: Option<crate::fleet::forward::Plan>) -> Self {
        self.fleet = plan;
        self
    }

    /// Takes note of who answered a planned miss: a peer's answer is relayed (its group now
    /// holds the connection) and stored here only under `store_remote`.
    fn went(&mut self, went: crate::fleet::forward::Went) {
        use crate::fleet::forward::Went;
        match went {
            Went::Peer(relay) => {
                self.upstream = relay.peer.group.clone();
                self.store_here = relay.fleet.cfg.store_remote;
                self.via_peer = Some(relay);
            }
            Went::Origin { store } => {
                self.store_here = store;
                if !store {
                    self.not_stored = Some("fleet-owner-down");
                }
            }
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

    /// A HEAD forwarded while `stored` (a GET response it could have been answered from) is
    /// stale: a 200 updates or invalidates it, under the fill lock of `primary_hash`.
    pub fn head_update(mut self, stored: Arc<Entry>, primary_hash: u128) -> Self {
        self.head_update = Some((stored, primary_hash));
        self
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

    /// The route's `store_set_cookie`: whether responses that set cookies may be stored.
    pub fn store_set_cookie(mut self, store: bool) -> Self {
        self.store_set_cookie = store;
        self
    }

    fn rules<'c>(&self, ctx: &'c crate::server::Ctx) -> policy::Rules<'c> {
        policy::Rules {
            store_5xx: ctx.store_5xx,
            store_set_cookie: self.store_set_cookie,
            targeted: ctx.store.targeted(),
        }
    }

    /// The response will not be stored, for this reason (`Cache-Status: detail=`).
    pub fn not_stored(mut self, why: &'static str) -> Self {
        self.not_stored = Some(why);
        self
    }

    /// A Range miss: after a 206 whose complete length is at most `cache.range_fill_max`, fill
    /// the whole object in the background.
    pub fn range_fill(mut self, r: RangeFill) -> Self {
        self.range_fill = Some(r);
        self
    }

    /// How long past expiry the entry being revalidated may be served if the upstream fails.
    pub fn stale_grace(mut self, grace: std::time::Duration) -> Self {
        self.stale_grace = grace;
        self
    }

    /// Prepares a background refresh of `stale` (stale-while-revalidate).
    pub fn background(
        req: RequestHead,
        upstream: Arc<Group>,
        primary: CacheKey,
        url: String,
        stale: Option<Arc<Entry>>,
        default_ttl: Option<std::time::Duration>,
        guard: LeaderGuard,
    ) -> Background {
        Background {
            req,
            upstream,
            primary,
            url,
            stale,
            default_ttl,
            guard,
            store_set_cookie: true,
        }
    }

    /// The entry being revalidated, if it may be served stale now that the upstream failed
    /// (RFC 5861 stale-if-error, or the route's grace without it), never past
    /// must-revalidate/proxy-revalidate/no-cache.
    fn stale_on_error(&self) -> Option<Arc<Entry>> {
        let e = self.revalidating.as_ref()?;
        crate::cache::stale::if_error(e, self.stale_grace, SystemTime::now()).then(|| e.clone())
    }

    /// Invalidate the target (and same-origin `Location`/`Content-Location`) on a non-error
    /// response (RFC 9111 §4.4).
    pub fn invalidating(mut self, keep_query: Option<bool>) -> Self {
        self.invalidate = keep_query;
        self
    }

    /// The URL key text the filled entry is indexed under for invalidation and purge.
    pub fn url(mut self, url: String) -> Self {
        self.url = url;
        self
    }

    /// Revalidate `stale` instead of fetching unconditionally (RFC 9111 §4.3.1).
    pub fn revalidating(mut self, stale: Option<Arc<Entry>>) -> Self {
        self.revalidating = stale;
        self
    }

    /// The route's `default_ttl`: freshness for storable responses that carry none.
    pub fn default_ttl(mut self, ttl: Option<std::time::Duration>) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// What the group's `hash` balancing hashes, so one object reaches one server: the primary
    /// key being filled, or for a fetch that fills none (a bypass, a HEAD, a Range miss) the URL
    /// key, which is the primary key of a route with no `cache_key.headers`.
    fn balance_key(&self) -> std::borrow::Cow<'_, str> {
        if let Some((k, _)) = &self.fill {
            return std::borrow::Cow::Borrowed(&k.text);
        }
        if let Some(r) = &self.range_fill {
            return std::borrow::Cow::Borrowed(&r.primary.text);
        }
        let req = self.req;
        std::borrow::Cow::Owned(
            CacheKey::new(&req.method, "http", &req.host, &req.target, 128).text,
        )
    }

    /// The request sent upstream: the client's, minus hop-by-hop fields, the fields the operator
    /// strips, and the client's own claims about where it came from (unless its peer is a trusted
    /// proxy); `Host` regenerated from the one normalised authority the key and the route used,
    /// or the group's `host` (which never changes the key: that was computed from the client's).
    fn upstream_request(&self, peer: IpAddr, ctx: &crate::server::Ctx) -> Vec<u8> {
        let req = self.req;
        let mut out = Vec::with_capacity(1024);
        out.extend_from_slice(req.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(req.target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let host = self.upstream.host.as_deref().unwrap_or(&req.host);
        put(&mut out, "Host", host.as_bytes());
        let tokens =
            headers::connection_tokens(req.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let trusted = ctx.trusted_proxies.iter().any(|c| c.contains(peer));
        let mut xff: Option<String> = None;
        let mut forwarded: Option<String> = None;
        let mut via: Option<String> = None;
        // A fetch that may be stored asks for the whole, unconditional representation: the
        // client's preconditions and Range are answered from it afterwards (locally, or from the
        // entry), so the origin's 206, 304, 412 or 416 to one client can never become what every
        // client gets. When revalidating, the cache's own validators go instead.
        let whole = self.fill.is_some() || self.revalidating.is_some();
        let validators = self
            .revalidating
            .as_ref()
            .map(|e| validation::conditional_fields(e))
            .unwrap_or_default();
        for (name, value) in &req.fields {
            let n = name.as_str();
            if headers::is_hop_by_hop(n, &tokens)
                || ctx.strip_fields.iter().any(|s| n.eq_ignore_ascii_case(s))
                || n.eq_ignore_ascii_case("host")
                || n.eq_ignore_ascii_case("content-length")
                || n.eq_ignore_ascii_case("expect")
                || n.eq_ignore_ascii_case(&ctx.request_id_header)
                || (whole && headers::is_range_or_condition(n))
            {
                continue;
            }
            let v = String::from_utf8_lossy(value);
            if n.eq_ignore_ascii_case("x-forwarded-for") {
                if trusted {
                    xff = Some(match xff {
                        Some(p) => format!("{p}, {v}"),
                        None => v.into_owned(),
                    });
                }
            } else if n.eq_ignore_ascii_case("forwarded") {
                if trusted {
                    let nodes = forwarded_for_only(&v);
                    if !nodes.is_empty() {
                        forwarded = Some(match forwarded {
                            Some(p) => format!("{p}, {nodes}"),
                            None => nodes,
                        });
                    }
                }
            } else if CLIENT_ADDRESS_FIELDS
                .iter()
                .any(|f| n.eq_ignore_ascii_case(f))
            {
                if trusted {
                    put(&mut out, n, value);
                }
            } else if n.eq_ignore_ascii_case("via") {
                via = Some(v.into_owned());
            } else {
                put(&mut out, n, value);
            }
        }
        for (k, v) in &validators {
            put(&mut out, k, v.as_bytes());
        }
        let ip = peer.to_string();
        let append = |prev: Option<String>, new: String| match prev {
            Some(p) => format!("{p}, {new}"),
            None => new,
        };
        put(
            &mut out,
            "X-Forwarded-For",
            append(xff, ip.clone()).as_bytes(),
        );
        let node = if peer.is_ipv6() {
            format!("for=\"[{ip}]\"")
        } else {
            format!("for={ip}")
        };
        put(&mut out, "Forwarded", append(forwarded, node).as_bytes());
        let via_me = if req.http10 {
            "1.0 zerocache"
        } else {
            "1.1 zerocache"
        };
        put(&mut out, "Via", append(via, via_me.to_string()).as_bytes());
        // Made when the request was read if an access log line needs it; otherwise here, where it
        // is first needed.
        let id = if req.id.is_empty() {
            std::borrow::Cow::Owned(crate::request_id::of(req, peer, ctx))
        } else {
            std::borrow::Cow::Borrowed(req.id.as_str())
        };
        put(&mut out, &ctx.request_id_header, id.as_bytes());
        match &self.body {
            RequestBody::Whole(b) => {
                if !b.is_empty() || matches!(req.method.as_str(), "POST" | "PUT" | "PATCH") {
                    put_num(&mut out, "Content-Length", b.len() as u64);
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(b);
            }
            RequestBody::Streaming {
                rest: Remaining::Length { total, .. },
                ..
            } => {
                put_num(&mut out, "Content-Length", *total);
                out.extend_from_slice(b"\r\n");
            }
            RequestBody::Streaming { .. } => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            }
        }
        out
    }

    /// Runs the fetch; returns whether the client connection stays open.
    pub async fn run(mut self, conn: &mut Conn) -> Result<Outcome, ConnError> {
        let ctx = conn.ctx.clone();
        let req = self.req;
        let request = self.upstream_request(conn.peer.ip(), &ctx);
        let idempotent = matches!(
            req.method.as_str(),
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        );
        let mut interim = Vec::new();
        let request_time = SystemTime::now();
        let exchanged = match std::mem::replace(&mut self.body, RequestBody::Whole(Vec::new())) {
            RequestBody::Whole(_) => match self.fleet.take() {
                Some(plan) => {
                    let key = self.balance_key().into_owned();
                    let (went, x) = crate::fleet::forward::exchange(
                        plan,
                        &self.upstream,
                        &request,
                        &key,
                        &mut interim,
                    )
                    .await;
                    self.went(went);
                    x
                }
                None => {
                    self.upstream
                        .exchange(&request, idempotent, &self.balance_key(), &mut interim)
                        .await
                }
            },
            RequestBody::Streaming { first, rest } => {
                match self
                    .exchange_streaming(conn, &request, first, rest, &mut interim)
                    .await
                {
                    Ok(x) => Ok(x),
                    Err(StreamError::Upstream(e)) => Err(e),
                    Err(StreamError::Body(e)) => {
                        // The origin got part of a body: its connection is dropped, never pooled.
                        return Ok(Outcome::RefuseBody(e));
                    }
                }
            }
        };
        let (up, head) = match exchanged {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, error = %e, "upstream failed");
                ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                if let Some(stale) = self.stale_on_error() {
                    return Ok(Outcome::stale(stale));
                }
                // The client still sees what the cache did (X-Cache: MISS); the accounting and
                // metrics see an upstream failure, not a miss.
                return Ok(Outcome::Reply {
                    status: e.status(),
                    x_cache: Some(self.status),
                });
            }
        };
        let response_time = SystemTime::now();
        let upstream_time = response_time
            .duration_since(request_time)
            .unwrap_or_default();
        ctx.accounting.upstream_response(
            &self.upstream.name,
            self.upstream.server_of(&up),
            head.status,
            upstream_time,
        );
        if ctx.access_log.is_some()
            && let Ok(addr) = up.stream.peer_addr()
        {
            conn.log_info.upstream = Some(crate::accesslog::UpstreamInfo {
                addr,
                status: head.status,
                time: upstream_time,
            });
        }
        let mut interim_bytes = 0u64;
        if !req.http10 {
            for h in &interim {
                conn.head.clear();
                conn.head.extend_from_slice(
                    format!("HTTP/1.1 {} {}\r\n", h.status, h.reason).as_bytes(),
                );
                // An interim head describes no body and no connection of the client's: only its
                // end-to-end fields (103's Link) cross.
                let tokens = headers::connection_tokens(
                    h.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
                );
                for (k, v) in &h.fields {
                    if !headers::is_hop_by_hop(k, &tokens) && !proxy_owned(k) {
                        put(&mut conn.head, k, v);
                    }
                }
                conn.head.extend_from_slice(b"\r\n");
                conn.send_head().await?;
                interim_bytes += conn.head.len() as u64;
            }
        }
        let framing = match head.framing(req.method == "HEAD") {
            Ok(f) => f,
            Err(why) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, why, "upstream response has ambiguous framing; not stored");
                ctx.accounting
                    .upstream_error(&self.upstream.name, "protocol");
                return Ok(Outcome::Reply {
                    status: 502,
                    x_cache: Some(self.status),
                });
            }
        };

        // A 200 to a HEAD updates the stored GET response it could have been chosen for, or
        // makes it stale when it describes another representation (RFC 9111 §4.3.5).
        // Only as the fill leader of the URL, and only while `stored` is still what the index
        // holds: a fill committing meanwhile renames a new file onto the same path, which an
        // update of the old entry must never write into.
        if head.status == 200
            && let Some((stored, primary_hash)) = self.head_update.take()
            && let Role::Leader(_guard) = ctx.locks.acquire(primary_hash)
            && ctx.store.is_current(&stored)
        {
            // Only a stored 200 is described by a 200 to a HEAD; a stored 404 or 301 is not.
            if stored.meta.status == 200
                && validation::head_matches(
                    &head,
                    stored.etag.as_deref(),
                    stored.last_modified.as_deref(),
                    stored.body_len,
                )
            {
                let (meta, storable) =
                    self.updated_meta(&ctx, &stored, &head, request_time, response_time);
                if storable {
                    ctx.store.replace_meta(&stored, meta);
                } else {
                    ctx.store.remove_if_same(&stored);
                }
            } else {
                let mut meta = stored.meta.clone();
                meta.lifetime = std::time::Duration::ZERO;
                ctx.store.replace_meta(&stored, meta);
            }
        }

        // An unsafe method's non-error response invalidates what is stored for its URLs, before
        // the client hears back.
        if let Some(keep_query) = self.invalidate
            && (200..400).contains(&head.status)
        {
            for url in invalidation::invalidated(&req.host, &req.target, &head, keep_query) {
                let n = ctx.store.purge_url(&url);
                if n > 0 {
                    tracing::debug!(%url, entries = n, method = %req.method, "invalidated");
                }
            }
        }

        // The upstream answered with a server error while we hold a usable stale response.
        if head.status >= 500
            && let Some(stale) = self.stale_on_error()
        {
            tracing::warn!(upstream = %self.upstream.name, target = %req.target, status = head.status, "upstream error; serving stale");
            ctx.accounting.upstream_error(&self.upstream.name, "status");
            drop(up);
            return Ok(Outcome::stale(stale));
        }

        // A 304 to our revalidation: update the stored fields and serve it through sendfile.
        if head.status == 304
            && let Some(stale) = self.revalidating.clone()
        {
            drain(up, &head, framing, &self.upstream).await;
            let (meta, storable) =
                self.updated_meta(&ctx, &stale, &head, request_time, response_time);
            let updated = ctx.store.replace_meta(&stale, meta);
            return Ok(Outcome::ServeStored {
                entry: updated,
                kind: HitKind::Revalidated,
                // This client is answered from it; nobody else may be.
                then_remove: !storable,
            });
        }

        // Decide storage.
        let tokens =
            headers::connection_tokens(head.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let mut fill: Option<Fill> = None;
        let mut not_stored: Option<&'static str> = self.not_stored;
        if let Some((primary, _)) = &self.fill
            && self.store_here
            && self.via_peer.as_ref().is_none_or(|r| r.may_store(&head))
        {
            // An unwritable cache is retried on every storable miss (one failed open(2)), so a
            // freed disk or fixed permission brings the cache back without a restart.
            match policy::storable(
                req,
                &head,
                request_time,
                response_time,
                self.heuristics(&ctx),
                self.rules(&ctx),
            ) {
                Ok(st) => {
                    let (key, meta) = fill_meta(
                        primary,
                        st,
                        req,
                        &head,
                        response_time,
                        &self.url,
                        ctx.hash_bits,
                    );
                    match Fill::create(ctx.store.clone(), key.hash, meta).and_then(|f| {
                        f.reserve(framing.length().unwrap_or(0))?;
                        Ok(f)
                    }) {
                        Ok(f) => {
                            fill = Some(f);
                            not_stored = None;
                        }
                        Err(e) => {
                            ctx.store.write_failed(&e);
                            not_stored = Some("cache-unwritable");
                        }
                    }
                }
                Err(why) => not_stored = Some(why.token()),
            }
        }

        // Only a storable response keeps the followers waiting; for any other, let them go now
        // and fetch on their own (hit-for-miss), so an uncacheable URL never queues its clients.
        let fetched_whole = self.fill.is_some();
        let guard = self.fill.take().and_then(|(_, g)| g);
        let guard = if fill.is_some() { guard } else { None };
        let upstream_close = upstream_closes(&head);

        // The whole representation was fetched in place of the client's conditional request:
        // its preconditions are answered here, from what the origin sent (RFC 9110 §13.2.2),
        // while the body still goes into the cache.
        let local = if fetched_whole && (200..300).contains(&head.status) {
            conditional::evaluate(
                req,
                head.field("etag"),
                head.field("last-modified"),
                head.field("date"),
            )
        } else {
            Precondition::Proceed
        };
        // A storable body goes into the cache file by a task of its own, at the origin's speed;
        // this client, and followers whose variant matches, read behind it.
        let body = match fill {
            Some(f) => {
                let (g, w) = Growing::new(f.file(), f.entry_preview(), framing.length());
                let reader = g.reader();
                if let Some(guard) = &guard {
                    guard.publish(g.clone());
                }
                tokio::spawn(pump(
                    ctx.clone(),
                    up,
                    framing,
                    self.upstream.clone(),
                    f,
                    w,
                    guard,
                    !upstream_close && !self.no_pool,
                    // A client answered locally (304/412) reads nothing, yet asked for the
                    // object: its fill is not an abandoned one.
                    local == Precondition::Proceed,
                ));
                Body::Behind(g, reader)
            }
            None => Body::Stream(up),
        };

        if local != Precondition::Proceed {
            return self
                .answer_precondition(conn, local, &head, interim_bytes)
                .await
                .map(Outcome::Done);
        }

        if let Some(r) = self.range_fill.take()
            && head.status == 206
            && let Some(total) = head.field("content-range").and_then(range::complete_length)
            && total <= ctx.range_fill_max
        {
            self.spawn_range_fill(&ctx, r, conn.peer.ip());
        }

        // Client head.
        let client_close = req.close || self.body_unfinished;
        let to_client_chunked =
            matches!(framing, BodyFraming::Chunked | BodyFraming::Close) && !req.http10;
        let close_after = client_close
            || (matches!(framing, BodyFraming::Chunked | BodyFraming::Close) && req.http10);
        let h = &mut conn.head;
        h.clear();
        h.extend_from_slice(format!("HTTP/1.1 {} {}\r\n", head.status, head.reason).as_bytes());
        let mut via: Option<String> = None;
        for (k, v) in &head.fields {
            if k.eq_ignore_ascii_case("age") {
                // End-to-end (RFC 9111 §5.1): a forwarded response carries the upstream's Age
                // as received; only a response served from the cache gets one computed.
                put(h, k, v);
                continue;
            }
            if headers::is_hop_by_hop(k, &tokens)
                || proxy_owned(k) && !k.eq_ignore_ascii_case("content-length")
            {
                continue;
            }
            if k.eq_ignore_ascii_case("content-length") {
                // Kept only where it describes a body not sent: the GET body of a HEAD, the
                // selected representation of a 304. On a 204 or 1xx it is a framing error the
                // client might act on (reading the next response as this one's body).
                if framing == BodyFraming::None && (req.method == "HEAD" || head.status == 304) {
                    put(h, k, v);
                }
                continue;
            }
            if k.eq_ignore_ascii_case("via") {
                via = Some(String::from_utf8_lossy(v).into_owned());
                continue;
            }
            if ctx.store.targeted().hides(k) {
                continue;
            }
            put(h, k, v);
        }
        match framing {
            BodyFraming::Length(n) => put_num(h, "Content-Length", n),
            BodyFraming::Chunked | BodyFraming::Close if to_client_chunked => {
                h.extend_from_slice(b"Transfer-Encoding: chunked\r\n")
            }
            _ => {}
        }
        let stored = matches!(body, Body::Behind(..));
        if self.via_peer.is_some() {
            let (x_cache, cache_status) = crate::fleet::forward::cache_fields(&head, stored);
            put(h, "X-Cache", x_cache.as_bytes());
            put(h, "Cache-Status", cache_status.as_bytes());
        } else {
            put(h, "X-Cache", self.status.as_str().as_bytes());
        }
        let fwd = match self.status {
            CacheStatus::Expired => "stale",
            CacheStatus::Bypass => self.detail,
            _ => "miss",
        };
        // `detail` says why a response will not be stored.
        let cache_status = match (stored, not_stored, self.status) {
            (_, _, CacheStatus::Bypass) => format!("zerocache; fwd={fwd}"),
            // Every response that completes was stored: a fill that fails aborts its readers.
            (true, _, _) => format!("zerocache; fwd={fwd}; stored"),
            (false, Some(why), _) => format!("zerocache; fwd={fwd}; detail={why}"),
            (false, None, _) => format!("zerocache; fwd={fwd}"),
        };
        if self.via_peer.is_none() {
            put(h, "Cache-Status", cache_status.as_bytes());
        }
        let via_me = if head.http10 {
            "1.0 zerocache"
        } else {
            "1.1 zerocache"
        };
        let via = match via {
            Some(v) => format!("{v}, {via_me}"),
            None => via_me.to_string(),
        };
        put(h, "Via", via.as_bytes());
        if close_after {
            h.extend_from_slice(b"Connection: close\r\n");
        }
        h.extend_from_slice(b"\r\n");
        let head_bytes = conn.head.len() as u64 + interim_bytes;

        let mut up = match body {
            Body::Stream(up) => up,
            Body::Behind(g, reader) => {
                let (body, framing_bytes, result) = match conn.send_head().await {
                    Ok(()) => {
                        conn.read_behind(&g, reader, to_client_chunked, self.upstream.read_timeout)
                            .await
                    }
                    Err(e) => (0, 0, Err(e)),
                };
                self.record_path(
                    conn,
                    head.status,
                    head_bytes + framing_bytes,
                    body,
                    DataPath::Zerocopy,
                    result.is_ok(),
                );
                result?;
                return Ok(Outcome::Done(!close_after));
            }
        };
        if let Err(e) = conn.send_head().await {
            self.record(conn, head.status, head_bytes, 0, false);
            return Err(e);
        }

        // Body: upstream → client, for a response that is not stored.
        let mut reader = BodyReader::new(framing, self.upstream.read_timeout);
        let mut piece = Vec::with_capacity(64 * 1024);
        let mut out = Vec::with_capacity(if to_client_chunked { 64 * 1024 + 32 } else { 0 });
        let mut body_bytes = 0u64;
        while !reader.is_done() {
            if let Err(e) = reader.next(&mut up, &mut piece).await {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, error = %e, received = body_bytes, "upstream body failed; closing client connection");
                ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                self.record(conn, head.status, head_bytes, body_bytes, false);
                return Err(ConnError::Aborted(e.to_string()));
            }
            let sent = if to_client_chunked {
                out.clear();
                if !piece.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(&piece);
                    out.extend_from_slice(b"\r\n");
                }
                if reader.is_done() {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                conn.send(&out).await
            } else {
                conn.send(&piece).await
            };
            if let Err(e) = sent {
                self.record(conn, head.status, head_bytes, body_bytes, false);
                return Err(e);
            }
            body_bytes += piece.len() as u64;
        }
        if reader.reusable() && !upstream_close && !self.no_pool {
            self.upstream.release(up);
        }
        self.record(conn, head.status, head_bytes, body_bytes, true);
        Ok(Outcome::Done(!close_after))
    }

    /// Sends a request whose body is too large to hold: the head, then the body as it arrives from
    /// the client (re-framed as it came: Content-Length or chunked), then reads the response head.
    /// Always on a fresh connection: a pooled one that turned out dead could not be retried, the
    /// body being gone. An origin that answers before the whole body is sent (a 413, say) has its
    /// answer relayed; that connection is never pooled and the client's is closed afterwards,
    /// since neither side's framing can be trusted any more.
    async fn exchange_streaming(
        &mut self,
        conn: &mut Conn,
        head: &[u8],
        first: Vec<u8>,
        mut rest: Remaining,
        interim: &mut Vec<ResponseHead>,
    ) -> Result<(UpstreamConn, ResponseHead), StreamError> {
        let key = self.balance_key().into_owned();
        let mut up = self.upstream.connect_fresh(&key).await?;
        let chunked = matches!(rest, Remaining::Chunked { .. });
        up.stream
            .write_all(head)
            .await
            .map_err(UpstreamError::from)?;
        let mut piece = first;
        let mut framed = Vec::with_capacity(BUFFERED_MAX + 32);
        let mut done = false;
        loop {
            framed.clear();
            if chunked && !piece.is_empty() {
                framed.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                framed.extend_from_slice(&piece);
                framed.extend_from_slice(b"\r\n");
            } else if !chunked {
                framed.extend_from_slice(&piece);
            }
            if done && chunked {
                framed.extend_from_slice(b"0\r\n\r\n");
            }
            // An origin that has answered already is not reading: stop sending, read its answer.
            let answered = matches!(up.stream.try_read_buf(&mut up.buf), Ok(n) if n > 0);
            if answered || up.stream.write_all(&framed).await.is_err() {
                self.body_unfinished = !done;
                self.no_pool = true;
                break;
            }
            if done {
                break;
            }
            piece.clear();
            done = conn
                .body_piece(&mut rest, &mut piece)
                .await
                .map_err(StreamError::Body)?;
        }
        conn.must_close = self.body_unfinished;
        let head = self
            .upstream
            .response_head(&mut up, interim, !self.body_unfinished)
            .await?;
        Ok((up, head))
    }

    /// Answers the client's precondition (304 or 412) from the response just received. A body
    /// being stored goes on into the cache without this client; any other is not read at all
    /// (dropping the upstream connection closes it).
    async fn answer_precondition(
        self,
        conn: &mut Conn,
        p: Precondition,
        head: &ResponseHead,
        interim_bytes: u64,
    ) -> Result<bool, ConnError> {
        let req = self.req;
        let status = if p == Precondition::NotModified {
            304
        } else {
            412
        };
        let h = &mut conn.head;
        h.clear();
        h.extend_from_slice(format!("HTTP/1.1 {status} {}\r\n", reason(status)).as_bytes());
        if status == 304 {
            for (k, v) in &head.fields {
                if conditional::NOT_MODIFIED_FIELDS
                    .iter()
                    .any(|f| k.eq_ignore_ascii_case(f))
                {
                    put(h, k, v);
                }
            }
        } else {
            put_num(h, "Content-Length", 0);
        }
        put(h, "X-Cache", self.status.as_str().as_bytes());
        put(h, "Cache-Status", b"zerocache; fwd=miss");
        put(h, "Via", b"1.1 zerocache");
        if req.close {
            h.extend_from_slice(b"Connection: close\r\n");
        }
        h.extend_from_slice(b"\r\n");
        let sent = conn.send_head().await;
        self.record(
            conn,
            status,
            conn.head.len() as u64 + interim_bytes,
            0,
            sent.is_ok(),
        );
        sent?;
        Ok(!req.close)
    }

    /// Starts the background fill of the whole object after a Range miss, unless a fill of it is
    /// under way already.
    fn spawn_range_fill(&self, ctx: &Arc<crate::server::Ctx>, r: RangeFill, peer: IpAddr) {
        let Role::Leader(guard) = ctx.locks.acquire(r.primary.hash) else {
            return;
        };
        let mut whole = self.req.clone();
        whole
            .fields
            .retain(|(k, _)| !headers::is_range_or_condition(k));
        let bg = Fetch::background(
            whole,
            self.upstream.clone(),
            r.primary,
            r.url,
            None,
            r.default_ttl,
            guard,
        )
        .store_set_cookie(self.store_set_cookie);
        tokio::spawn(bg.refresh(ctx.clone(), peer));
    }

    fn heuristics(&self, ctx: &crate::server::Ctx) -> Heuristics {
        heuristics(ctx, self.default_ttl)
    }

    fn record(&self, conn: &Conn, status: u16, head_bytes: u64, body_bytes: u64, complete: bool) {
        if let Some(r) = &self.via_peer {
            r.relayed(body_bytes);
        }
        self.record_path(
            conn,
            status,
            head_bytes,
            body_bytes,
            DataPath::Copy,
            complete,
        );
    }

    fn record_path(
        &self,
        conn: &Conn,
        status: u16,
        head_bytes: u64,
        body_bytes: u64,
        path: DataPath,
        complete: bool,
    ) {
        conn.record(&ResponseRecord {
            method: &self.req.method,
            target: &self.req.target,
            status,
            cache_status: self.status,
            head_bytes,
            body_bytes,
            path,
            duration: self.started.elapsed(),
            complete,
        });
    }
}

fn heuristics(ctx: &crate::server::Ctx, default_ttl: Option<std::time::Duration>) -> Heuristics {
    Heuristics {
        max: ctx.heuristic_max,
        default_ttl,
    }
}

/// Pumps an upstream body into the cache file at the origin's speed, publishing its progress to
/// the clients reading behind it, then commits the entry, returns the connection to the pool and
/// lets the followers go. `abandon`: a fill begun for clients stops once none has been reading for
/// `cache.abandoned_fill_timeout` or it passes `cache.abandoned_fill_max` bytes with none, so
/// connect-and-disconnect cannot make the origin stream huge objects for nobody.
#[allow(clippy::too_many_arguments)]
async fn pump(
    ctx: Arc<crate::server::Ctx>,
    mut up: UpstreamConn,
    framing: BodyFraming,
    group: Arc<Group>,
    mut fill: Fill,
    mut w: Writer,
    guard: Option<LeaderGuard>,
    reusable: bool,
    abandon: bool,
) {
    let mut reader = BodyReader::new(framing, group.read_timeout);
    let mut piece = Vec::with_capacity(64 * 1024);
    let mut alone_since: Option<Instant> = None;
    while !reader.is_done() {
        if let Err(e) = reader.next(&mut up, &mut piece).await {
            tracing::warn!(upstream = %group.name, error = %e, received = fill.written(), "upstream body failed; nothing stored, its readers aborted");
            ctx.accounting.upstream_error(&group.name, e.kind());
            return; // Dropping the writer fails the readers; dropping the fill deletes its file.
        }
        if let Err(e) = fill.write(&piece) {
            ctx.store.write_failed(&e);
            return;
        }
        if reader.is_done() {
            break;
        }
        w.advance(fill.written());
        if abandon && w.readers() == 0 {
            let since = *alone_since.get_or_insert_with(Instant::now);
            if fill.written() > ctx.abandoned_fill_max
                || since.elapsed() > ctx.abandoned_fill_timeout
            {
                tracing::debug!(
                    bytes = fill.written(),
                    "fill abandoned by every client; stopped"
                );
                return;
            }
        } else {
            alone_since = None;
        }
    }
    let n = fill.written();
    // Committed before the last bytes are published: a client that has read the whole MISS and
    // asks again gets a HIT. A commit that fails leaves every byte in the open file, so the
    // readers still finish.
    if let Err(e) = fill.commit() {
        ctx.store.write_failed(&e);
    }
    w.finish(n);
    if reusable && reader.reusable() {
        group.release(up);
    }
    drop(guard);
}

/// Whether the upstream said this connection ends after the response (HTTP/1.0, or
/// `Connection: close`): it must not go back to the pool.
fn upstream_closes(head: &ResponseHead) -> bool {
    head.http10
        || headers::connection_tokens(head.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
            .iter()
            .any(|t| t == "close")
}

/// Reads and discards a (304's) body, then returns the connection to the pool when its framing
/// and its `Connection` allow. The client fetch and the background refresh both end a 304 here,
/// so they cannot drift apart on when a connection is reused.
async fn drain(mut up: UpstreamConn, head: &ResponseHead, framing: BodyFraming, group: &Group) {
    let mut reader = BodyReader::new(framing, group.read_timeout);
    let mut sink = Vec::new();
    while !reader.is_done() {
        if reader.next(&mut up, &mut sink).await.is_err() {
            return;
        }
    }
    if reader.reusable() && !upstream_closes(head) {
        group.release(up);
    }
}

impl Background {
    /// The route's `store_set_cookie`.
    pub fn store_set_cookie(mut self, store: bool) -> Self {
        self.store_set_cookie = store;
        self
    }

    /// Revalidates (or refetches) the stale entry with no client waiting: a 304 updates it, a
    /// storable response replaces it, a failure leaves it as it was.
    pub async fn refresh(self, ctx: Arc<crate::server::Ctx>, peer: IpAddr) {
        let f = Fetch::new(
            &self.req,
            RequestBody::Whole(Vec::new()),
            self.upstream.clone(),
            CacheStatus::Expired,
            "stale",
            None,
            Instant::now(),
        )
        .revalidating(self.stale.clone());
        let request = f.upstream_request(peer, &ctx);
        let request_time = SystemTime::now();
        let (up, head) = match self
            .upstream
            .exchange(&request, true, &self.primary.text, &mut Vec::new())
            .await
        {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(upstream = %self.upstream.name, target = %self.req.target, error = %e, "background fetch failed; keeping what is stored");
                ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                return;
            }
        };
        let response_time = SystemTime::now();
        ctx.accounting.upstream_response(
            &self.upstream.name,
            self.upstream.server_of(&up),
            head.status,
            response_time
                .duration_since(request_time)
                .unwrap_or_default(),
        );
        let Ok(framing) = head.framing(false) else {
            return;
        };
        let h = heuristics(&ctx, self.default_ttl);
        if head.status == 304 {
            drain(up, &head, framing, &self.upstream).await;
            if let Some(stale) = &self.stale {
                let (meta, storable) = revalidated_meta(
                    stale,
                    &head,
                    request_time,
                    response_time,
                    h,
                    self.store_set_cookie,
                    ctx.store.targeted(),
                );
                if storable {
                    ctx.store.replace_meta(stale, meta);
                } else {
                    ctx.store.remove_if_same(stale);
                }
            }
            return;
        }
        if head.status >= 500 {
            return; // Keep serving what we have.
        }
        let st = match policy::storable(
            &self.req,
            &head,
            request_time,
            response_time,
            h,
            policy::Rules {
                store_5xx: ctx.store_5xx,
                store_set_cookie: self.store_set_cookie,
                targeted: ctx.store.targeted(),
            },
        ) {
            Ok(st) => st,
            Err(why) => {
                // The resource is no longer storable: stop serving the old copy. A refusal the
                // request caused (its no-store, its Authorization) says nothing about the
                // resource, and must not let a client evict what others are served.
                if why.caused_by_response()
                    && let Some(stale) = &self.stale
                {
                    ctx.store.remove_if_same(stale);
                }
                return;
            }
        };
        let (key, meta) = fill_meta(
            &self.primary,
            st,
            &self.req,
            &head,
            response_time,
            &self.url,
            ctx.hash_bits,
        );
        let fill = match Fill::create(ctx.store.clone(), key.hash, meta) {
            Ok(f) => f,
            Err(e) => {
                ctx.store.write_failed(&e);
                return;
            }
        };
        let upstream_close = upstream_closes(&head);
        let (g, w) = Growing::new(fill.file(), fill.entry_preview(), framing.length());
        self.guard.publish(g);
        pump(
            ctx.clone(),
            up,
            framing,
            self.upstream.clone(),
            fill,
            w,
            Some(self.guard),
            !upstream_close,
            false,
        )
        .await;
        tracing::debug!(target = %self.req.target, "filled in the background");
    }
}
