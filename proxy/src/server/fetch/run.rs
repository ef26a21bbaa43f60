//! The fetch itself: one exchange with the upstream (retried once on a pooled connection that
//! turned out dead, for idempotent requests), then the decision on what the response is (stored
//! behind a fill, streamed, a precondition answered, a revalidation, stale on error). What the
//! client gets is written by the connection (`relay.rs`), never here.

use crate::cache::conditional::{self, Precondition};
use crate::cache::decide::{Answer, Disposition, Relay, Relaying};
use crate::cache::fill::Fill;
use crate::cache::growing::Growing;
use crate::cache::invalidation;
use crate::cache::lock::Role;
use crate::cache::policy;
use crate::cache::stored_meta::fill_meta;
use crate::cache::validation;
use crate::http::range;
use crate::http::response::{BodyFraming, ResponseHead};
use crate::server::hit::HitKind;
use crate::server::request_body::{BodySource, RequestBody};
use crate::upstream::UpstreamConn;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use super::stream::{drain, pump, upstream_closes};
use super::{Body, Fetch, Fetched, Outcome, Relayed, StreamError};

impl Fetch<'_> {
    /// Runs the fetch: the exchange, what it does to the store, what becomes of the answer
    /// (`cache::decide::Disposition`), the body's fill started when it is stored. Returns what
    /// the connection sends; nothing is written to the client here. `client` is where the rest
    /// of a streamed request body comes from; `peer` the client's address (`X-Forwarded-For`).
    pub async fn run(
        mut self,
        ctx: &Arc<crate::server::Ctx>,
        peer: IpAddr,
        client: &mut impl BodySource,
    ) -> Fetched {
        let mut interim = Vec::new();
        let mut upstream = None;
        let outcome = self
            .exchange_and_dispose(ctx, peer, client, &mut interim, &mut upstream)
            .await;
        Fetched {
            interim,
            upstream,
            must_close: !self.body_read,
            outcome,
        }
    }

    /// The exchange and what becomes of its answer (see [`Fetch::run`]).
    async fn exchange_and_dispose(
        &mut self,
        ctx: &Arc<crate::server::Ctx>,
        peer: IpAddr,
        client: &mut impl BodySource,
        interim: &mut Vec<ResponseHead>,
        upstream: &mut Option<crate::accesslog::UpstreamInfo>,
    ) -> Outcome {
        let req = self.req;
        let (up, head, request_time, response_time) =
            match self.exchange(ctx, peer, client, interim, upstream).await {
                Ok(x) => x,
                // Interim heads of an exchange that then failed are not sent: the client
                // hears of the failure alone, as before any interim head crossed.
                Err(outcome) => {
                    interim.clear();
                    return outcome;
                }
            };
        let framing = match head.framing(req.method == "HEAD") {
            Ok(f) => f,
            Err(why) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, why, "upstream response has ambiguous framing; not stored");
                ctx.accounting
                    .upstream_error(&self.upstream.name, "protocol");
                return Outcome::Reply {
                    status: 502,
                    detail: None,
                };
            }
        };
        self.update_store(ctx, &head, request_time, response_time);
        let mut stale = None;
        match Disposition::of(
            Answer::Status(head.status),
            self.revalidating.is_some(),
            || {
                stale = self.stale_on_error();
                stale.is_some()
            },
        ) {
            // The upstream answered with a server error while we hold a usable stale response.
            Disposition::ServeStale => {
                if let Some(stale) = stale {
                    tracing::warn!(upstream = %self.upstream.name, target = %req.target, status = head.status, "upstream error; serving stale");
                    ctx.accounting.upstream_error(&self.upstream.name, "status");
                    drop(up);
                    return Outcome::stale(stale);
                }
            }
            // A 304 to our revalidation: update the stored fields and serve it through sendfile.
            Disposition::Refresh => {
                if let Some(stale) = self.revalidating.clone() {
                    drain(up, &head, framing, &self.upstream).await;
                    let (meta, storable) =
                        self.updated_meta(ctx, &stale, &head, request_time, response_time);
                    let updated = ctx.store.replace_meta(&stale, meta);
                    return Outcome::ServeStored {
                        entry: updated,
                        kind: HitKind::Revalidated,
                        // This client is answered from it; nobody else may be.
                        then_remove: !storable,
                        requester: crate::cache::validation::requester_fields(&head),
                    };
                }
            }
            Disposition::Relay | Disposition::Fail => {}
        }
        let relay = self.relay_of(ctx, &head, framing, request_time, response_time);
        let local = relay.answer;
        let (fill, not_stored) = match (relay.store, self.fill.as_ref()) {
            (Ok(st), Some((primary, _))) => {
                match self.create_fill(ctx, primary, st, &head, framing, response_time) {
                    Ok(f) => (Some(f), None),
                    Err(why) => (None, Some(why)),
                }
            }
            // Only a fill's answer is judged storable (`Relay::of`).
            (Ok(_), None) => (None, None),
            (Err(why), _) => (None, why),
        };
        if self.fill.is_some()
            && let Some(why) = not_stored
        {
            ctx.accounting.not_stored(why);
        }
        // Only a storable response keeps the followers waiting; for any other, let them go now
        // and fetch on their own (hit-for-miss), so an uncacheable URL never queues its clients.
        let primary = self.fill.as_ref().map(|(key, _)| key.hash);
        let guard = self.fill.take().and_then(|(_, g)| g);
        let guard = if fill.is_some() { guard } else { None };
        let reuse = !upstream_closes(&head) && !self.no_pool;
        // A storable body goes into the cache file by a task of its own, at the origin's speed;
        // this client, and followers whose variant matches, read behind it.
        let body = match fill {
            Some(f) => {
                // A client answered locally (304/412) reads nothing, yet asked for the object:
                // its fill is not an abandoned one.
                let wanted = local == Precondition::Proceed;
                let primary = primary.unwrap_or(f.hash());
                self.fill_behind(ctx, up, framing, (primary, f), guard, reuse, wanted)
            }
            None => Body::Stream(up),
        };

        if local == Precondition::Proceed
            && let Some(r) = self.range_fill.take()
            && head.status == 206
            && let Some(total) = head.field("content-range").and_then(range::complete_length)
            && total <= ctx.storing.range_fill_max
        {
            self.spawn_range_fill(ctx, r, peer);
        }
        Outcome::Relay(Box::new(Relayed {
            head,
            framing,
            body,
            local,
            not_stored,
            status: self.status,
            detail: self.detail,
            upstream: self.upstream.clone(),
            via_peer: self.via_peer.take(),
            reuse,
            body_unfinished: self.body_unfinished,
        }))
    }

    /// What becomes of a relayed answer (`cache::decide::Relay::of`): stored or not, and
    /// whether it answers the client's precondition.
    fn relay_of(
        &self,
        ctx: &crate::server::Ctx,
        head: &ResponseHead,
        framing: BodyFraming,
        request_time: SystemTime,
        response_time: SystemTime,
    ) -> Relay {
        let req = self.req;
        Relay::of(
            Relaying {
                status: head.status,
                fills: self.fill.is_some(),
                not_stored: self.not_stored,
                length: framing.length(),
                oversized: self
                    .fill
                    .as_ref()
                    .is_some_and(|(key, _)| ctx.store.oversized().recently(key.hash)),
                max_body: self.max_body(ctx),
                min_body: self.object_sizes.min,
            },
            || self.store_here && self.via_peer.as_ref().is_none_or(|r| r.may_store(head)),
            || {
                policy::storable(
                    req,
                    head,
                    request_time,
                    response_time,
                    self.heuristics(ctx),
                    self.rules(ctx),
                )
            },
            || {
                conditional::evaluate(
                    req,
                    head.field("etag"),
                    head.field("last-modified"),
                    head.field("date"),
                )
            },
        )
    }

    /// Starts the fill of a storable body: a task copies it from the origin into the cache file
    /// at the origin's speed, the key's followers are told where to read behind it, and so is
    /// this client. `primary`: the request's primary key hash (see `pump`).
    #[allow(clippy::too_many_arguments)]
    fn fill_behind(
        &self,
        ctx: &Arc<crate::server::Ctx>,
        up: crate::upstream::UpstreamConn,
        framing: BodyFraming,
        (primary, f): (u128, Fill),
        guard: Option<crate::cache::lock::LeaderGuard>,
        reuse: bool,
        wanted: bool,
    ) -> Body {
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
            primary,
            f,
            w,
            guard,
            reuse,
            wanted,
        ));
        Body::Behind(g, reader)
    }

    /// What the answer does to the store before the client hears it: a 200 to a HEAD updates
    /// (or makes stale) the stored GET response; an unsafe method's success invalidates.
    fn update_store(
        &mut self,
        ctx: &crate::server::Ctx,
        head: &crate::http::response::ResponseHead,
        request_time: SystemTime,
        response_time: SystemTime,
    ) {
        let req = self.req;
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
                    head,
                    stored.etag.as_deref(),
                    stored.last_modified.as_deref(),
                    stored.body_len,
                )
            {
                let (meta, storable) =
                    self.updated_meta(ctx, &stored, head, request_time, response_time);
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
            // Each URL as a request for it is keyed: through its own route's query rules.
            let key_of = |t: &str| match ctx.routes.find(&req.host, t) {
                Some(r) => {
                    let normal = r.normalised(t);
                    invalidation::url_text(&req.host, normal.as_deref().unwrap_or(t), r.key_query)
                }
                None => invalidation::url_text(&req.host, t, keep_query),
            };
            for url in invalidation::invalidated(&req.host, &req.target, head, key_of)
                .into_iter()
                .flat_map(crate::cache::key::with_https_twin)
            {
                let n = ctx.store.purge_url(&url);
                if n > 0 {
                    tracing::debug!(%url, entries = n, method = %req.method, "invalidated");
                }
            }
        }
    }

    /// The fill of a storable answer ([`create_fill`]), for this fetch's request and sizes.
    fn create_fill(
        &self,
        ctx: &crate::server::Ctx,
        primary: &crate::cache::key::CacheKey,
        st: policy::Storable,
        head: &ResponseHead,
        framing: BodyFraming,
        response_time: SystemTime,
    ) -> Result<Fill, &'static str> {
        let answer = Answered {
            req: self.req,
            url: &self.url,
            head,
            framing,
            response_time,
        };
        let sizes = (self.object_sizes.min, self.max_body(ctx));
        create_fill(ctx, primary, st, &answer, sizes)
    }

    /// The exchange with the upstream (or the key's fleet owner), retried once on a dead pooled
    /// connection for an idempotent request; interim responses collected in `interim`, and the
    /// upstream's part of the access log in `log`. An exchange that failed is already an outcome:
    /// stale-if-error, or the failure's status.
    async fn exchange(
        &mut self,
        ctx: &Arc<crate::server::Ctx>,
        peer: IpAddr,
        client: &mut impl BodySource,
        interim: &mut Vec<ResponseHead>,
        log: &mut Option<crate::accesslog::UpstreamInfo>,
    ) -> Result<(UpstreamConn, ResponseHead, SystemTime, SystemTime), Outcome> {
        let request = self.upstream_request(peer, ctx);
        let req = self.req;
        let idempotent = matches!(
            req.method.as_str(),
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        );
        let request_time = SystemTime::now();
        // The server asked last, for the log line of an exchange that fails.
        let mut tried: Option<String> = None;
        let exchanged = match std::mem::replace(&mut self.body, RequestBody::Whole(Vec::new())) {
            RequestBody::Whole(_) => match self.fleet.take() {
                Some(plan) => self.exchange_fleet(plan, &request, interim).await,
                None => {
                    self.upstream
                        .exchange(
                            &request,
                            idempotent,
                            &self.balance_key(),
                            interim,
                            &mut tried,
                        )
                        .await
                }
            },
            RequestBody::Streaming { first, rest } => {
                match self
                    .exchange_streaming(client, &request, first, rest, interim)
                    .await
                {
                    Ok(x) => Ok(x),
                    Err(StreamError::Upstream(e)) => Err(e),
                    // The origin got part of a body: its connection is dropped, never pooled.
                    Err(StreamError::Body(e)) => return Err(Outcome::RefuseBody(e)),
                }
            }
        };
        let (up, head) = match exchanged {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, error = %e, "upstream failed");
                if !e.counted_per_attempt() {
                    ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                }
                if ctx.access_log.is_some()
                    && let Some(addr) = tried
                {
                    *log = Some(crate::accesslog::UpstreamInfo {
                        addr,
                        status: None,
                        time: request_time.elapsed().unwrap_or_default(),
                    });
                }
                let stale = self.stale_on_error();
                let outcome = match Disposition::of(Answer::Failed, false, || stale.is_some()) {
                    Disposition::ServeStale => stale.map(Outcome::stale),
                    _ => None,
                };
                // The proxy answers itself: `X-Cache: ERROR`, as the log and the metrics say.
                return Err(outcome.unwrap_or(Outcome::Reply {
                    status: e.status(),
                    detail: e.detail(),
                }));
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
            *log = Some(crate::accesslog::UpstreamInfo {
                addr: addr.to_string(),
                status: Some(head.status),
                time: upstream_time,
            });
        }
        Ok((up, head, request_time, response_time))
    }
}

/// What a fill is made of: the request, its URL, and the origin's answer.
pub(super) struct Answered<'a> {
    pub req: &'a crate::http::request::RequestHead,
    pub url: &'a str,
    pub head: &'a ResponseHead,
    pub framing: BodyFraming,
    pub response_time: SystemTime,
}

/// The fill of a storable answer, bounded to `(min, max)` bytes and created with room reserved
/// for a known length (a full disk evicts and retries once); else why not (`cache-unwritable`;
/// `upgrade` while a successor takes the directory over). A client's fetch and the background
/// refresh both make theirs here, so neither writes into a directory handed over nor publishes
/// a fill that a full disk would cut off under its readers. An unwritable cache is retried on
/// every storable miss (one failed open(2)), so a freed disk or fixed permission brings the
/// cache back without a restart.
pub(super) fn create_fill(
    ctx: &crate::server::Ctx,
    primary: &crate::cache::key::CacheKey,
    st: policy::Storable,
    a: &Answered<'_>,
    (min, max): (u64, u64),
) -> Result<Fill, &'static str> {
    let (key, meta) = fill_meta(
        primary,
        st,
        a.req,
        a.head,
        a.response_time,
        a.url,
        ctx.hash_bits,
    );
    super::new_fill(
        ctx,
        key.hash,
        meta,
        a.framing.length().unwrap_or(0),
        (min, max),
    )
}
