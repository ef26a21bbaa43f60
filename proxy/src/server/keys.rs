//! A request's cache keys and the stored entry they find: the URL key (what purges and
//! invalidations name) and the primary key (the URL with the route's key fields and its edge
//! rules' part), and the lookup under the variant key when the URL's responses vary.

use crate::cache::entry::Entry;
use crate::cache::key::CacheKey;
use crate::cache::variance;
use crate::http::request::RequestHead;
use std::sync::Arc;

/// The request's URL key and its primary key (the URL with the route's key fields).
pub(super) fn keys_of(
    req: &RequestHead,
    route: &crate::routing::Routed<'_>,
    rules: Option<&str>,
    hash_bits: u32,
) -> (CacheKey, CacheKey) {
    let target = if route.key_query {
        req.target.as_str()
    } else {
        req.path()
    };
    let url = CacheKey::new(
        &req.method,
        crate::cache::key::scheme(req.tls),
        &req.host,
        target,
        hash_bits,
    );
    let primary = url
        .clone()
        .with_headers(
            &route.key_headers,
            |h| crate::http::headers::exact(&req.fields, h),
            hash_bits,
        )
        .with_rules(rules, hash_bits);
    (url, primary)
}

/// The stored response for `primary`, under the secondary key of this request when its URL's
/// responses vary; one that predates a fleet purge this node missed is dropped.
pub(super) fn lookup(
    ctx: &super::Ctx,
    primary: &CacheKey,
    req: &RequestHead,
) -> Option<Arc<Entry>> {
    ctx.store
        .lookup_varying(primary, |names| {
            variance::variant(primary, names, req, ctx.hash_bits)
        })
        .filter(|e| !crate::fleet::Fleet::drops(ctx.fleet.as_deref(), &ctx.store, e))
}
