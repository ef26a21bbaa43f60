//! One request, from its head to its answer: route → cache lookup → the cache's decision (fresh,
//! stale, revalidate, miss, bypass) → a hit, a fetch, or a generated answer. `Conn` carries the
//! connection; an [`Exchange`] is what the proxy does with one request on it, and this is
//! where it starts.

use super::fetch::{Fetch, FetchOptions, FetchSpec, RangeFill};
use super::hit::{HitKind, HitOutcome};
use super::request_body::RequestBody;
use crate::cache::conditional::{self, Precondition};
use crate::cache::decide::{Ask, Miss, Plan, Serve, Stored};
use crate::cache::entry::Entry;
use crate::cache::freshness::{self, Use};
use crate::cache::key::CacheKey;
use crate::cache::lock::{self, Role};
use crate::cache::variance;
use crate::http::head::CacheFields;
use crate::http::request::{BodyFraming, RequestHead};
use std::sync::Arc;
use std::time::Instant;
use zerocache_ledger::CacheStatus;

use super::conn_error::ConnError;
use super::exchange::Exchange;

/// What `Allow` lists on a 405 to TRACE: the methods the proxy forwards.
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH";

impl Exchange<'_> {
    /// One request: route → cache lookup → hit or fetch. Returns whether to keep the connection.
    ///
    /// What goes upstream (a miss, a pass, a tunnel) is awaited boxed: those futures are 2,800
    /// to 6,320 bytes, and inline they made the connection's (`Conn::run`) 7,072, the size of
    /// every HTTP/1.1 connection's task and of the future each HTTP/2 stream copies into its box,
    /// for hits that need about 1,200 of it. One allocation per upstream request is nothing
    /// beside the request.
    pub(super) async fn handle(
        &mut self,
        mut req: RequestHead,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let ctx = self.c.ctx.clone();
        // Found once, before anything answers: the request is counted under its route whatever
        // answers it (a 413 for its body too; `-` when it matches none), and routed by it below
        // (neither the admission nor the fleet intake changes its host or target). `OPTIONS *`
        // names the server, not a path: it is routed by its host alone.
        let (found, shape) = ctx
            .routes
            .find_shaped(&req.host, if req.target == "*" { "/" } else { &req.target });
        self.c.log_info.route = found.map(|r| r.counters);
        let body = match self.admit(&mut req, started).await? {
            Ok(body) => body,
            Err(keep) => return Ok(keep),
        };
        use super::fleet_intake::Intake;
        let from_peer = match self.fleet_intake(&mut req, &body).await? {
            Intake::Answered(keep) => return Ok(keep),
            Intake::Peer => true,
            Intake::Client => false,
        };
        if req.method == "PURGE"
            && let Some(rules) = &ctx.purge_method
        {
            return self.purge_by_method(&req, rules, started).await;
        }
        let route = match self.route_or_refusal(found, &req, started).await? {
            Ok(route) => route,
            Err(keep) => return Ok(keep),
        };
        // The route's query rules and edge rules, before anything reads the target or the
        // fields: the key, the upstream request and Vary all see what they leave.
        let ruled = match self
            .edge_rules(&mut req, route, shape, from_peer, started)
            .await?
        {
            Ok(ruled) => ruled,
            Err(keep) => return Ok(keep),
        };
        // The upstream and freshness the rules chose, else the route's.
        let forced = ruled.ttls(route);
        let ttls = forced.as_ref().unwrap_or(&route.ttls);
        let route = &crate::routing::Routed::new(route, ruled.upstream(route, &ctx.routes), ttls);
        // An Upgrade on a route that tunnels: past the cache, past HTTP (see `tunnel`).
        if route.upgrade && super::tunnel::wants_tunnel(&req) {
            return Box::pin(self.tunnel(&req, route.upstream.clone(), started)).await;
        }
        if req.upgrade.is_some() {
            super::tunnel::drop_handshake_fields(&mut req);
        }
        // A request the cache may answer is one request from here on: its key and its upstream
        // request both see the route's Accept-Encoding. One that goes past the cache keeps the
        // client's field (a zstd-capable client of an uncached API loses nothing).
        let bypassed = ruled.bypass || route.bypasses(&req);
        if route.cache && !bypassed && matches!(req.method.as_str(), "GET" | "HEAD") {
            route.normalise_accept_encoding(&mut req);
        }
        let directives = freshness::request_directives(&req);
        let ask = Ask {
            method: &req.method,
            route_caches: route.cache,
            bypassed,
            has_body: req.body != BodyFraming::None,
            has_range: req.field("range").is_some(),
            only_if_cached: directives.only_if_cached,
        };
        // The keys and the stored entry, made only when the plan asks for them.
        let mut keys: Option<(CacheKey, CacheKey)> = None;
        let mut found: Option<Arc<Entry>> = None;
        let mut plan = Plan::of(&ask, || {
            let (url, primary) =
                super::keys::keys_of(&req, route, ruled.key_part.as_deref(), ctx.hash_bits);
            let e = super::keys::lookup(&ctx, &primary, &req);
            keys = Some((url, primary));
            let stored = e.as_ref().map_or(Stored::Nothing, |e| {
                Stored::of(e, crate::clock::now(), &directives)
            });
            found = e;
            stored
        });
        loop {
            let (serve, refresh) = match plan {
                Plan::Bypass { detail, invalidate } => {
                    let opts = FetchOptions {
                        invalidate: invalidate.then_some(route.key_query),
                        ..FetchOptions::default()
                    };
                    let did = (CacheStatus::Bypass, detail);
                    let fetch = past_the_cache(&req, body, route, did, opts, started);
                    return Box::pin(self.fetch(fetch)).await;
                }
                // A GET or HEAD with a body: its meaning is the origin's business, so it goes
                // upstream with its body, but the answer depends on bytes no key holds.
                Plan::Unstored(why) => {
                    let opts = FetchOptions {
                        not_stored: Some(why),
                        ..FetchOptions::default()
                    };
                    let did = (CacheStatus::Miss, "miss");
                    let fetch = past_the_cache(&req, body, route, did, opts, started);
                    return Box::pin(self.fetch(fetch)).await;
                }
                Plan::Serve(Serve::Fresh) => (HitKind::Hit, false),
                Plan::Serve(Serve::Stale) => (HitKind::Stale, false),
                Plan::ServeThenRefresh => (HitKind::Stale, true),
                Plan::GatewayTimeout => return self.gateway_timeout(&req, started).await,
                Plan::RangeMiss | Plan::Head { .. } | Plan::Fill { .. } => {
                    // Nothing stored whole on a sliced route: from the object's slices.
                    if route.slicing.is_some()
                        && found.is_none()
                        && let Some(k) = &keys
                        && let Some(keep) = self.sliced(&req, route, &ask, k, started).await?
                    {
                        return Ok(keep);
                    }
                    let looked = (keys, found, from_peer);
                    let miss =
                        self.forward_miss(&req, body, route, plan, looked, &directives, started);
                    return Box::pin(miss).await;
                }
            };
            let Some(e) = found.as_ref() else {
                plan = Plan::after_lookup(&ask, Stored::Nothing);
                continue;
            };
            if refresh && let Some(keys) = &keys {
                self.refresh_behind(&req, route, keys, e);
            }
            match self.serve_hit(&req, e, serve, &[], started).await? {
                HitOutcome::Served(keep) => return Ok(keep),
                // Gone from disk before a byte was sent: planned again as what is left. A fresh
                // or usable entry leaves nothing; a stale one still asks for its revalidation.
                HitOutcome::Gone if refresh => {
                    plan = Plan::after_lookup(
                        &ask,
                        Stored::MustRevalidate {
                            while_revalidating: false,
                        },
                    );
                }
                HitOutcome::Gone => {
                    found = None;
                    plan = Plan::after_lookup(&ask, Stored::Nothing);
                }
            }
        }
    }

    /// The 504 of RFC 9111 §5.2.1.7: nothing usable stored, and the client forbids going
    /// upstream (`only-if-cached`).
    async fn gateway_timeout(
        &mut self,
        req: &RequestHead,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let cache = CacheFields {
            x_cache: CacheStatus::Miss.as_str(),
            upstream: None,
            member: None,
        };
        self.c
            .respond_simple(req, 504, CacheStatus::Miss, &[], Some(&cache), started)
            .await
    }

    /// The route that answers `req`, or its refusal sent (`Err(keep)`). No route: 404. TRACE
    /// echoes the request back, cookies and credentials included, to any script that can read
    /// the answer (cross-site tracing); only a route that allows it forwards it (RFC 9110
    /// §9.3.8, §15.5.6).
    async fn route_or_refusal<'r>(
        &mut self,
        found: Option<&'r crate::routing::Route>,
        req: &RequestHead,
        started: Instant,
    ) -> Result<Result<&'r crate::routing::Route, bool>, ConnError> {
        let (status, allow): (u16, &[(&str, &str)]) = match found {
            Some(r) if req.method != "TRACE" || r.allow_trace => return Ok(Ok(r)),
            None => (404, &[]),
            Some(_) => (405, &[("Allow", ALLOW)]),
        };
        let keep = self
            .c
            .respond_simple(req, status, CacheStatus::Error, allow, None, started)
            .await?;
        Ok(Err(keep))
    }

    /// What comes before routing: the request id (with an access log), the body read (or
    /// refused), and a connection made for another host refused. `Err(keep)`: answered already.
    async fn admit(
        &mut self,
        req: &mut RequestHead,
        started: Instant,
    ) -> Result<Result<RequestBody, bool>, ConnError> {
        // The id costs a hash and an allocation: a hit with no access log has no use for it (a
        // fetch makes one for the upstream request when none was made here).
        if self.c.ctx.access_log.is_some() {
            req.id = crate::request_id::of(
                req,
                self.c.peer.ip(),
                &self.c.ctx.forwarding.trusted_proxies,
                &self.c.ctx.forwarding.request_id_header,
            );
            self.c.begin_record(req, started);
        }
        let Some(body) = self.c.read_body(req).await? else {
            return Ok(Err(false));
        };
        // Part of a large body is still unread: whatever answers this request (a 404, a 405, a
        // 502 before the body went upstream), the next bytes on the connection are no request.
        // `Exchange::fetch` (relay.rs) clears this once the fetch has read the body to its end.
        self.c.must_close = matches!(body, RequestBody::Streaming { .. });
        if self.c.sock.misdirected(&req.host) {
            // A connection made (by SNI) for one site, asked for a host its certificate does
            // not name: the client must not have reused it (tls.strict_sni).
            return self
                .c
                .respond_simple(req, 421, CacheStatus::Error, &[], None, started)
                .await
                .map(Err);
        }
        // An Upgrade the proxy does not carry out: the connection closes after the answer, so
        // a front proxy that took the request for a switch cannot send raw bytes that would be
        // read as requests here.
        if req.upgrade.is_some() {
            req.close = true;
        }
        Ok(Ok(body))
    }

    /// Refreshes the stale entry `e` once in the background (stale-while-revalidate), unless
    /// another request holds the key's fill lock.
    fn refresh_behind(
        &self,
        req: &RequestHead,
        route: &crate::routing::Routed<'_>,
        (url, primary): &(CacheKey, CacheKey),
        e: &Arc<Entry>,
    ) {
        if let Role::Leader(guard) = self.c.ctx.locks.acquire(primary.hash) {
            let bg = Fetch::background(
                req.clone(),
                route.upstream.clone(),
                primary.clone(),
                url.text.clone(),
                Some(e.clone()),
                route.ttls.clone(),
                guard,
            )
            .store_set_cookie(route.store_set_cookie)
            .object_sizes(route.object_sizes);
            tokio::spawn(bg.refresh(self.c.ctx.clone(), self.c.peer.ip()));
        }
    }

    /// Carries out a plan that goes upstream as a miss: a Range miss, a HEAD, or a fill under
    /// the key's lock (waiting behind another request's fill when there is one).
    #[allow(clippy::too_many_arguments)]
    async fn forward_miss(
        &mut self,
        req: &RequestHead,
        body: RequestBody,
        route: &crate::routing::Routed<'_>,
        plan: Plan,
        (keys, found, from_peer): Looked,
        directives: &crate::cache::directives::RequestDirectives,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let ctx = self.c.ctx.clone();
        let upstream = route.upstream.clone();
        let ttls = route.ttls;
        // Every plan after a lookup made the keys, and only a miss's plan comes here.
        let (Some((url, primary)), Some(m)) = (keys, Miss::of(plan, found.is_some(), from_peer))
        else {
            return self
                .c
                .respond_simple(req, 500, CacheStatus::Error, &[], None, started)
                .await;
        };
        // The stale stored response it revalidates or updates.
        let stale = found.filter(|_| m.uses_stored);
        let status = if m.uses_stored {
            CacheStatus::Expired
        } else {
            CacheStatus::Miss
        };
        // Not this node's key: its owner answers.
        let owner = || {
            ctx.fleet
                .as_ref()
                // The owner runs no rules: a key with the rules' part, or a lifetime a rule
                // gives, is this node's to fill.
                .filter(|_| m.ask_owner && !primary.has_rules() && route.ttls.forced.is_none())
                .and_then(|f| f.plan(&primary.text))
        };
        // The fetch of this miss, with what its plan adds.
        let miss = |opts: FetchOptions| {
            Fetch::new(FetchSpec {
                req,
                body,
                upstream: route.upstream.clone(),
                started,
                status,
                detail: "miss",
                opts,
            })
        };
        if m.range_fill {
            // The size is unknown, so the range is forwarded and the 206 relayed, never stored;
            // the whole object is then filled in the background when it is small enough
            // (`cache.range_fill_max`), so the next request is a hit. Not this node's key: the
            // range goes to its owner, which fills the whole object.
            let fleet = owner();
            let range_fill = fleet.is_none().then_some(RangeFill {
                primary,
                url: url.text,
                ttls: ttls.clone(),
            });
            let opts = FetchOptions {
                not_stored: Some("range"),
                store_set_cookie: route.store_set_cookie,
                object_sizes: route.object_sizes,
                fleet,
                range_fill,
                ..FetchOptions::default()
            };
            return self.fetch(miss(opts)).await;
        }
        if !m.takes_lock {
            // A HEAD: the route's storage rules apply to its update as to a 304's.
            let opts = FetchOptions {
                ttls: ttls.clone(),
                store_set_cookie: route.store_set_cookie,
                object_sizes: route.object_sizes,
                head_update: stale.map(|e| (e, primary.hash)),
                fleet: owner(),
                ..FetchOptions::default()
            };
            return self.fetch(miss(opts)).await;
        }
        let guard = match ctx.locks.acquire(primary.hash) {
            Role::Leader(g) => Some(g),
            Role::Follower(rx) => {
                let wait = upstream.read_timeout;
                if let Some(keep) = self
                    .follow(req, &primary, rx, directives, wait, started)
                    .await?
                {
                    return Ok(keep);
                }
                None
            }
        };
        let opts = FetchOptions {
            fleet: owner(),
            fill: Some((primary, guard)),
            revalidating: stale,
            stale_grace: route.stale_grace,
            url: url.text,
            ttls: ttls.clone(),
            store_set_cookie: route.store_set_cookie,
            object_sizes: route.object_sizes,
            ..FetchOptions::default()
        };
        self.fetch(miss(opts)).await
    }

    /// Waits (up to `wait`) behind another request's fill of `primary`: reads behind it when its
    /// response is the variant this request selects, fresh enough for it and passing its
    /// preconditions; once the fill is done, serves what it stored as a hit. `None`: neither
    /// (the fill failed, or its response is not this request's), so the request goes upstream.
    async fn follow(
        &mut self,
        req: &RequestHead,
        primary: &CacheKey,
        rx: tokio::sync::watch::Receiver<lock::FillState>,
        directives: &crate::cache::directives::RequestDirectives,
        wait: std::time::Duration,
        started: Instant,
    ) -> Result<Option<bool>, ConnError> {
        let ctx = self.c.ctx.clone();
        // Fresh enough for this request.
        let fresh = |e: &Entry| {
            freshness::decide(
                e.age(crate::clock::now()),
                e.meta.lifetime,
                e.reuse,
                directives,
            ) == Use::Fresh
        };
        match tokio::time::timeout(wait, lock::wait(rx)).await {
            // The leader's response is being stored: read behind it when it is the variant this
            // request selects and fresh enough for it.
            Ok(Some(g)) => {
                let e = &g.entry;
                let key = if e.meta.vary.is_empty() {
                    primary.clone()
                } else {
                    variance::variant(primary, &e.meta.vary, req, ctx.hash_bits)
                };
                let usable = key.text == e.meta.key
                    && fresh(e)
                    && conditional::evaluate(
                        req,
                        e.etag.as_deref(),
                        e.last_modified.as_deref(),
                        e.date.as_deref(),
                    ) == Precondition::Proceed;
                if usable {
                    return self.serve_collapsed(req, &g, wait, started).await.map(Some);
                }
            }
            // The leader is done: what it stored is a hit now.
            Ok(None) => {
                if let Some(e) = super::keys::lookup(&ctx, primary, req)
                    && fresh(&e)
                    && let HitOutcome::Served(keep) = self
                        .serve_hit(req, &e, HitKind::Coalesced, &[], started)
                        .await?
                {
                    return Ok(Some(keep));
                }
            }
            Err(_) => {}
        }
        Ok(None)
    }
}

/// What the lookup left for a miss: the URL and primary keys, the entry found, and whether the
/// request came from a fleet peer (never forwarded again).
type Looked = (Option<(CacheKey, CacheKey)>, Option<Arc<Entry>>, bool);

/// The fetch of a request planned past the cache: a bypass or a miss never stored, with what
/// the cache did (`X-Cache`, `fwd=`).
fn past_the_cache<'r>(
    req: &'r RequestHead,
    body: RequestBody,
    route: &crate::routing::Routed<'_>,
    (status, detail): (CacheStatus, &'static str),
    opts: FetchOptions,
    started: Instant,
) -> Fetch<'r> {
    Fetch::new(FetchSpec {
        req,
        body,
        upstream: route.upstream.clone(),
        started,
        status,
        detail,
        opts,
    })
}
