//! The connection's side of a route's edge rules (`cache::rules`): the query normalised, the
//! rules run on the request from this client, their counts and `$rule` kept, their response
//! edits handed to the head buffer, and a rule's own answer sent (a redirect, a body, a deny, a
//! 429). A fleet peer's forwarded request had its rules run where the client sent it: here it
//! only has its query normalised again, which changes nothing.

use super::conn_error::ConnError;
use super::exchange::Exchange;
use crate::cache::rules::Answer;
use crate::http::request::RequestHead;
use crate::routing::Route;
use std::time::Instant;
use zerocache_ledger::CacheStatus;

/// What the rules leave for the rest of the request.
#[derive(Debug, Default)]
pub(super) struct Ruled {
    /// Past the cache (`bypass: true`).
    pub bypass: bool,
    /// The rules' part of the cache key, if any.
    pub key_part: Option<String>,
    /// The upstream a canary chose.
    pub upstream: Option<String>,
    /// A rule's freshness for what is stored.
    pub ttl: Option<std::time::Duration>,
}

impl Ruled {
    /// The route's freshness with the rule's `ttl`, when a rule gave one.
    pub(super) fn ttls(&self, route: &Route) -> Option<crate::routing::Ttls> {
        self.ttl.map(|t| crate::routing::Ttls {
            forced: Some(t),
            ..route.ttls.clone()
        })
    }

    /// The upstream group a canary chose, else the route's.
    pub(super) fn upstream<'a>(
        &self,
        route: &'a Route,
        routes: &'a crate::routing::Routes,
    ) -> &'a std::sync::Arc<crate::upstream::Group> {
        self.upstream
            .as_deref()
            .and_then(|n| routes.groups.get(n))
            .unwrap_or(&route.upstream)
    }
}

impl Exchange<'_> {
    /// Runs `route`'s query rules and rules on `req`, whose target's path has `shape` (routing
    /// found it: `http::target::path_shape`). `Err(keep)`: a rule answered.
    pub(super) async fn edge_rules(
        &mut self,
        req: &mut RequestHead,
        route: &Route,
        shape: (usize, bool),
        from_peer: bool,
        started: Instant,
    ) -> Result<Result<Ruled, bool>, ConnError> {
        route.normalise_query(req);
        if from_peer || route.rules.is_empty() {
            return Ok(Ok(Ruled::default()));
        }
        let limiter = &self.c.ctx.limiter;
        let now = if route.rules.needs_clock() {
            limiter.now()
        } else {
            0
        };
        let v = route.rules.on_request_shaped(
            req,
            shape,
            self.c.peer.ip(),
            limiter,
            now,
            &mut self.c.head.edits,
        );
        if self.c.ctx.access_log.is_some() {
            self.c.log_info.rules = route.rules.matched(v.matched);
        }
        let Some(answer) = v.answer else {
            return Ok(Ok(Ruled {
                bypass: v.bypass,
                key_part: v.key_part,
                upstream: v.upstream,
                ttl: v.ttl,
            }));
        };
        let keep = match answer {
            Answer::Redirect(status, location) if !location.contains(['\r', '\n', '\0']) => {
                self.c
                    .respond_simple(
                        req,
                        status,
                        CacheStatus::Bypass,
                        &[("Location", &location)],
                        None,
                        started,
                    )
                    .await?
            }
            // No variable can put a line break in a location; should one ever, nothing of it is
            // sent.
            Answer::Redirect(..) => {
                self.c
                    .respond_simple(req, 500, CacheStatus::Error, &[], None, started)
                    .await?
            }
            Answer::Respond(status, body, content_type) => {
                crate::http::head::typed_response(
                    &mut self.c.head,
                    status,
                    &content_type,
                    &[],
                    None,
                    req.close,
                    body.as_bytes(),
                );
                self.c
                    .send_generated(req, status, CacheStatus::Bypass, body.len() as u64, started)
                    .await?
            }
            Answer::Deny(status) => {
                self.c
                    .respond_simple(req, status, CacheStatus::Bypass, &[], None, started)
                    .await?
            }
            Answer::Limited(after) => {
                let after = after.to_string();
                self.c
                    .respond_simple(
                        req,
                        429,
                        CacheStatus::Bypass,
                        &[("Retry-After", &after)],
                        None,
                        started,
                    )
                    .await?
            }
        };
        Ok(Err(keep))
    }
}
