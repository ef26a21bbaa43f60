//! The `PURGE` method on the data port (`purge.method`), as Varnish and Squid users script their
//! purges: `curl -X PURGE http://edge/path` purges that URL (both schemes, with and without the
//! query where a route keys without it) on this node and answers 200 `{"purged": N}`. Only a
//! client in `purge.allowed_clients` (the peer, or the PROXY protocol's source) or one sending
//! `Authorization: Bearer <purge.token>` (compared in constant time) may; anyone else gets 403
//! and nothing is purged. With the method off, `PURGE` is forwarded like any other method.

use super::PurgeMethod;
use super::conn_error::ConnError;
use super::exchange::Exchange;
use crate::http::request::RequestHead;
use std::time::Instant;
use zerocache_ledger::CacheStatus;

/// Whether the request proves it may purge: its client is allowed, or it carries the token.
pub(crate) fn allowed(rules: &PurgeMethod, client: std::net::IpAddr, req: &RequestHead) -> bool {
    if rules.allowed.iter().any(|c| c.contains(client)) {
        return true;
    }
    let (Some(token), Some(auth)) = (&rules.token, req.field("authorization")) else {
        return false;
    };
    auth.strip_prefix("Bearer ")
        .is_some_and(|t| crate::fleet::hop::constant_time_eq(t.trim().as_bytes(), token.as_bytes()))
}

impl Exchange<'_> {
    /// Answers a `PURGE`: the purge and its count, or 403.
    pub(super) async fn purge_by_method(
        &mut self,
        req: &RequestHead,
        rules: &PurgeMethod,
        started: Instant,
    ) -> Result<bool, ConnError> {
        if !allowed(rules, self.c.peer.ip(), req) {
            tracing::info!(peer = %self.c.peer, target = %req.target, "PURGE refused: client not in purge.allowed_clients and no purge.token");
            return self
                .c
                .respond_simple(req, 403, CacheStatus::Error, &[], None, started)
                .await;
        }
        let scheme = if req.tls { "https" } else { "http" };
        let url = format!("{scheme}://{}{}", req.host, req.target);
        let purged = self
            .c
            .ctx
            .purger()
            .purge(&zerocache_ops::Purge::url(url.clone()));
        let (status, body) = match purged {
            Ok(n) => {
                tracing::info!(peer = %self.c.peer, %url, purged = n, "PURGE");
                (200, format!("{{\"purged\":{n}}}\n"))
            }
            Err(why) => (400, format!("{{\"error\":{:?}}}\n", why)),
        };
        crate::http::head::typed_response(
            &mut self.c.head,
            status,
            "application/json",
            &[("Cache-Control", "no-store")],
            None,
            req.close,
            body.as_bytes(),
        );
        self.c
            .send_generated(req, status, CacheStatus::Error, body.len() as u64, started)
            .await
    }
}
