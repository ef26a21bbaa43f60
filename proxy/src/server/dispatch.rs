//! One request, from its head to its answer: route → cache lookup → the cache's decision (fresh,
//! stale, revalidate, miss, bypass) → a hit, a fetch, or a generated answer. `Conn` carries the
//! connection; this is what it does with each request on it.

use super::fetch::{Fetch, RangeFill};
use super::hit::{HitKind, HitOutcome};
use super::upload::RequestBody;
use crate::cache::conditional::{self, Precondition};
use crate::cache::entry::Entry;
use crate::cache::freshness::{self, Use};
use crate::cache::invalidation;
use crate::cache::key::CacheKey;
use crate::cache::lock::{self, Role};
use crate::cache::variance;
use crate::http::request::{BodyFraming, RequestHead};
use std::sync::Arc;
use std::time::Instant;
use zerocache_ledger::CacheStatus;

use super::conn::{ALLOW, Conn, ConnError};

impl Conn {
    /// One request: route → cache lookup → hit or fetch. Returns whether to keep the connection.
    pub(super) async fn handle(
        &mut self,
        mut req: RequestHead,
        started: Instant,
    ) -> Result<bool, ConnError> {
        // The id costs a hash and an allocation: a hit with no access log has no use for it (a
        // fetch makes one for the upstream request when none was made here).
        if self.ctx.access_log.is_some() {
            req.id = crate::request_id::of(&req, self.peer.ip(), &self.ctx);
            self.log_info = crate::accesslog::RequestInfo::of(&req);
        }
        let Some(body) = self.read_body(&req).await? else {
            return Ok(false);
        };
        // Part of a large body is still unread: whatever answers this request (a 404, a 405, a
        // 502 before the body went upstream), the next bytes on the connection are no request.
        // The streaming exchange clears this once it has read the body to its end.
        self.must_close = matches!(body, RequestBody::Streaming { .. });
        if self.sock.misdirected(&req.host) {
            // A connection made (by SNI) for one site, asked for a host its certificate does
            // not name: the client must not have reused it (tls.strict_sni).
            return self
                .respond_simple(&req, 421, CacheStatus::Error, &[], started)
                .await;
        }
        let ctx = self.ctx.clone();
        use super::fleet_intake::Intake;
        let from_peer = match self.fleet_intake(&mut req, &body).await? {
            Intake::Answered(keep) => return Ok(keep),
            Intake::Peer => true,
            Intake::Client => false,
        };
        // `OPTIONS *` names the server, not a path: it is routed by its host alone.
        let route_path = if req.target == "*" { "/" } else { &req.target };
        let Some(route) = ctx.routes.find(&req.host, route_path) else {
            return self
                .respond_simple(&req, 404, CacheStatus::Error, &[], started)
                .await;
        };
        if req.method == "TRACE" && !route.allow_trace {
            // TRACE echoes the request back, cookies and credentials included, to any script
            // that can read the answer (cross-site tracing); only a route that allows it
            // forwards it (RFC 9110 §9.3.8, §15.5.6).
            return self
                .respond_simple(&req, 405, CacheStatus::Error, &[("Allow", ALLOW)], started)
                .await;
        }
        let upstream = route.upstream.clone();
        let default_ttl = route.default_ttl;
        let cacheable_method = req.method == "GET" || req.method == "HEAD";
        let bypassed = route.bypasses(&req);
        if !route.cache || !cacheable_method || bypassed {
            let detail = if route.cache && !bypassed {
                "method"
            } else {
                "bypass"
            };
            let invalidate =
                (route.cache && !invalidation::is_safe(&req.method)).then_some(route.key_query);
            return self
                .fetch(
                    Fetch::new(
                        &req,
                        body,
                        upstream,
                        CacheStatus::Bypass,
                        detail,
                        None,
                        started,
                    )
                    .invalidating(invalidate),
                )
                .await;
        }
        if req.body != BodyFraming::None {
            // A GET or HEAD with a body: its meaning is the origin's business, so it goes upstream
            // with its body, but the answer depends on bytes no key holds, so it is neither
            // served from the cache nor stored.
            return self
                .fetch(
                    Fetch::new(
                        &req,
                        body,
                        upstream,
                        CacheStatus::Miss,
                        "miss",
                        None,
                        started,
                    )
                    .not_stored("request-body"),
                )
                .await;
        }
        let target = if route.key_query {
            req.target.as_str()
        } else {
            req.path()
        };
        let url = CacheKey::new(
            &req.method,
            crate::tls::scheme(req.tls),
            &req.host,
            target,
            ctx.hash_bits,
        );
        let primary = url.clone().with_headers(
            &route.key_headers,
            |h| crate::http::headers::exact(&req.fields, h),
            ctx.hash_bits,
        );
        // A URL whose responses vary is looked up under the secondary key of this request.
        let lookup = || {
            ctx.store.lookup_varying(&primary, |names| {
                variance::variant(&primary, names, &req, ctx.hash_bits)
            })
        };
        let directives = freshness::request_directives(&req);
        let mut status = CacheStatus::Miss;
        let mut stale: Option<Arc<Entry>> = None;
        if let Some(e) = lookup().filter(|e| !crate::fleet::Fleet::drops(&ctx, e)) {
            let now = crate::clock::now();
            match freshness::decide(e.age(now), e.meta.lifetime, e.reuse, &directives) {
                Use::Fresh => match self.serve_hit(&req, &e, HitKind::Hit, &[], started).await? {
                    HitOutcome::Served(keep) => return Ok(keep),
                    HitOutcome::Gone => {}
                },
                Use::Stale => match self
                    .serve_hit(&req, &e, HitKind::Stale, &[], started)
                    .await?
                {
                    HitOutcome::Served(keep) => return Ok(keep),
                    HitOutcome::Gone => {}
                },
                Use::Revalidate => {
                    // stale-while-revalidate (RFC 5861): serve it now and refresh it in the
                    // background, once, when only its age (not the request) asks for validation.
                    if crate::cache::stale::while_revalidate(&e, now, &directives)
                        && req.method == "GET"
                    {
                        if let Role::Leader(guard) = ctx.locks.acquire(primary.hash) {
                            let bg = Fetch::background(
                                req.clone(),
                                upstream.clone(),
                                primary.clone(),
                                url.text.clone(),
                                Some(e.clone()),
                                route.default_ttl,
                                guard,
                            )
                            .store_set_cookie(route.store_set_cookie);
                            tokio::spawn(bg.refresh(ctx.clone(), self.peer.ip()));
                        }
                        match self
                            .serve_hit(&req, &e, HitKind::Stale, &[], started)
                            .await?
                        {
                            HitOutcome::Served(keep) => return Ok(keep),
                            HitOutcome::Gone => {}
                        }
                    }
                    status = CacheStatus::Expired;
                    stale = Some(e);
                }
            }
        }
        if directives.only_if_cached {
            // §5.2.1.7: nothing usable stored, and the client forbids going to the origin.
            return self
                .respond_simple(
                    &req,
                    504,
                    CacheStatus::Miss,
                    &[("X-Cache", "MISS")],
                    started,
                )
                .await;
        }
        if req.method == "GET" && stale.is_none() && req.field("range").is_some() {
            // A Range miss: the size is unknown, so the range is forwarded and the 206 relayed,
            // never stored; the whole object is then filled in the background when it is small
            // enough (`cache.range_fill_max`), so the next request is a hit.
            // Not this node's key: the range goes to its owner, which fills the whole object.
            let plan = ctx
                .fleet
                .as_ref()
                .filter(|_| !from_peer)
                .and_then(|f| f.plan(&primary.text));
            let fetch = Fetch::new(&req, body, upstream, status, "miss", None, started)
                .not_stored("range")
                .store_set_cookie(route.store_set_cookie);
            let fetch = match plan {
                Some(p) => fetch.fleet(Some(p)),
                None => fetch.range_fill(RangeFill {
                    primary,
                    url: url.text,
                    default_ttl,
                }),
            };
            return self.fetch(fetch).await;
        }
        if req.method == "HEAD" {
            // A HEAD cannot fill a GET entry; forward it without taking the fill lock. Its 200
            // updates a stale stored response, or marks it stale (RFC 9111 §4.3.5).
            // The route's storage rules apply to that update as to a 304's.
            let fetch = Fetch::new(&req, body, upstream, status, "miss", None, started)
                .default_ttl(default_ttl)
                .store_set_cookie(route.store_set_cookie);
            let fetch = match stale {
                Some(e) => fetch.head_update(e, primary.hash),
                // Not this node's key: its owner answers (from its cache, if it has it).
                None => fetch.fleet(
                    ctx.fleet
                        .as_ref()
                        .filter(|_| !from_peer)
                        .and_then(|f| f.plan(&primary.text)),
                ),
            };
            return self.fetch(fetch).await;
        }
        // Fresh enough for this request, for a follower of another request's fill.
        let fresh = |e: &Entry| {
            freshness::decide(
                e.age(crate::clock::now()),
                e.meta.lifetime,
                e.reuse,
                &directives,
            ) == Use::Fresh
        };
        let guard = match ctx.locks.acquire(primary.hash) {
            Role::Leader(g) => Some(g),
            Role::Follower(rx) => {
                match tokio::time::timeout(upstream.read_timeout, lock::wait(rx)).await {
                    // The leader's response is being stored: read behind it when it is the
                    // variant this request selects and fresh enough for it.
                    Ok(Some(g)) => {
                        let e = &g.entry;
                        let key = if e.meta.vary.is_empty() {
                            primary.clone()
                        } else {
                            variance::variant(&primary, &e.meta.vary, &req, ctx.hash_bits)
                        };
                        let usable = key.text == e.meta.key
                            && fresh(e)
                            && conditional::evaluate(
                                &req,
                                e.etag.as_deref(),
                                e.last_modified.as_deref(),
                                e.date.as_deref(),
                            ) == Precondition::Proceed;
                        if usable {
                            return self
                                .serve_collapsed(&req, &g, upstream.read_timeout, started)
                                .await;
                        }
                    }
                    // The leader is done: what it stored is a hit now.
                    Ok(None) => {
                        if let Some(e) = lookup()
                            && fresh(&e)
                            && let HitOutcome::Served(keep) = self
                                .serve_hit(&req, &e, HitKind::Coalesced, &[], started)
                                .await?
                        {
                            return Ok(keep);
                        }
                    }
                    Err(_) => {}
                }
                None
            }
        };
        // Not this node's key: ask its owner (a peer's request is never forwarded again).
        let owner = ctx.fleet.as_ref().filter(|_| !from_peer && stale.is_none());
        let plan = owner.and_then(|f| f.plan(&primary.text));
        self.fetch(
            Fetch::new(
                &req,
                body,
                upstream,
                status,
                "miss",
                Some((primary, guard)),
                started,
            )
            .fleet(plan)
            .revalidating(stale)
            .stale_grace(route.stale_grace)
            .url(url.text)
            .default_ttl(default_ttl)
            .store_set_cookie(route.store_set_cookie),
        )
        .await
    }
}
