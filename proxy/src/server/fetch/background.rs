//! The background refresh (stale-while-revalidate, and the whole-object fill after a Range miss):
//! the same exchange as a fetch with no client waiting; the fill lock it holds keeps it to one
//! refresh per entry at a time.

use crate::cache::conditional::Precondition;
use crate::cache::decide::{Answer, Disposition, Relay, Relaying};
use crate::cache::entry::Entry;
use crate::cache::growing::Growing;
use crate::cache::key::CacheKey;
use crate::cache::lock::LeaderGuard;
use crate::cache::policy;
use crate::cache::stored_meta::revalidated_meta;
use crate::http::request::RequestHead;
use crate::server::request_body::RequestBody;
use crate::upstream::Group;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use zerocache_ledger::CacheStatus;

use super::stream::{drain, pump, upstream_closes};
use super::{Fetch, FetchOptions, FetchSpec};

/// A background refresh for stale-while-revalidate: the same exchange as a fetch, with no
/// client waiting; the fill lock it holds keeps it to one refresh per entry at a time.
pub struct Background {
    req: RequestHead,
    upstream: Arc<Group>,
    primary: CacheKey,
    url: String,
    /// The entry being refreshed; `None` for the first fill after a Range miss.
    stale: Option<Arc<Entry>>,
    ttls: crate::routing::Ttls,
    guard: LeaderGuard,
    store_set_cookie: bool,
    object_sizes: crate::routing::ObjectSizes,
}

impl Background {
    /// The route's `store_set_cookie`.
    pub fn store_set_cookie(mut self, store: bool) -> Self {
        self.store_set_cookie = store;
        self
    }

    /// The body sizes the route stores.
    pub fn object_sizes(mut self, sizes: crate::routing::ObjectSizes) -> Self {
        self.object_sizes = sizes;
        self
    }

    /// Revalidates (or refetches) the stale entry with no client waiting: a 304 updates it, a
    /// storable response replaces it, a failure leaves it as it was.
    pub async fn refresh(self, ctx: Arc<crate::server::Ctx>, peer: IpAddr) {
        let f = Fetch::new(FetchSpec {
            req: &self.req,
            body: RequestBody::Whole(Vec::new()),
            upstream: self.upstream.clone(),
            started: Instant::now(),
            status: CacheStatus::Expired,
            detail: "stale",
            opts: FetchOptions {
                revalidating: self.stale.clone(),
                ..FetchOptions::default()
            },
        });
        let request = f.upstream_request(peer, &ctx);
        let exchanged =
            super::exchange_alone(&ctx, &self.upstream, &request, &self.primary.text).await;
        let (up, head, request_time, response_time) = match exchanged {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(upstream = %self.upstream.name, target = %self.req.target, error = %e, "background fetch failed; keeping what is stored");
                return;
            }
        };
        let Ok(framing) = head.framing(false) else {
            return;
        };
        let h = self.ttls.heuristics(ctx.storing.heuristic_max);
        // No client waits: whatever is stored keeps standing in for an error.
        match Disposition::of(Answer::Status(head.status), self.stale.is_some(), || true) {
            // Keep serving what we have.
            Disposition::ServeStale | Disposition::Fail => return,
            Disposition::Refresh => {
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
            // A 304 with nothing of ours to refresh stores nothing.
            Disposition::Relay if head.status == 304 => {
                drain(up, &head, framing, &self.upstream).await;
                return;
            }
            Disposition::Relay => {}
        }
        // Stored or not by the decision a client's fetch takes (`Relay::of`), with no client
        // preconditions to answer: this node's own entry is being refreshed, so it stores here.
        let (min, max) = (
            self.object_sizes.min,
            super::max_body(&ctx, self.object_sizes),
        );
        let mut refused = None;
        let relay = Relay::of(
            Relaying {
                status: head.status,
                fills: true,
                not_stored: None,
                length: framing.length(),
                oversized: ctx.store.oversized().recently(self.primary.hash),
                max_body: max,
                min_body: min,
            },
            || true,
            || {
                policy::storable(
                    &self.req,
                    &head,
                    request_time,
                    response_time,
                    h,
                    super::rules(&ctx, self.store_set_cookie),
                )
                .inspect_err(|why| refused = Some(*why))
            },
            || Precondition::Proceed,
        );
        let st = match relay.store {
            Ok(st) => st,
            Err(why) => {
                if let Some(why) = why {
                    ctx.accounting.not_stored(why);
                }
                tracing::debug!(target = %self.req.target, why, "background fetch not stored");
                // The resource is no longer what may be stored: stop serving the old copy. That
                // is known from a refusal of the response's own, or from a length it states
                // outside the route's sizes. A refusal the request caused (its no-store, its
                // Authorization) says nothing about the resource, and must not let a client
                // evict what others are served; nor does a body of unknown length refused
                // because the key's last fill ran long (a guess, which another variant of the
                // URL may have caused).
                let ended = match refused {
                    Some(why) => why.caused_by_response(),
                    None => framing.length().is_some(),
                };
                if ended && let Some(stale) = &self.stale {
                    ctx.store.remove_if_same(stale);
                }
                return;
            }
        };
        // Made as a client's fetch makes its fill: not into a directory being handed over, and
        // with the body's room reserved, since readers may follow this fill (`publish` below).
        let answer = super::run::Answered {
            req: &self.req,
            url: &self.url,
            head: &head,
            framing,
            response_time,
        };
        let fill = match super::run::create_fill(&ctx, &self.primary, st, &answer, (min, max)) {
            Ok(f) => f,
            Err(why) => {
                ctx.accounting.not_stored(why);
                tracing::debug!(target = %self.req.target, why, "background fetch not stored");
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
            self.primary.hash,
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

impl Fetch<'_> {
    /// Prepares a background refresh of `stale` (stale-while-revalidate).
    pub fn background(
        req: RequestHead,
        upstream: Arc<Group>,
        primary: CacheKey,
        url: String,
        stale: Option<Arc<Entry>>,
        ttls: crate::routing::Ttls,
        guard: LeaderGuard,
    ) -> Background {
        Background {
            req,
            upstream,
            primary,
            url,
            stale,
            ttls,
            guard,
            store_set_cookie: true,
            object_sizes: crate::routing::ObjectSizes::ANY,
        }
    }
}
