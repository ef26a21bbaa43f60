//! The metadata stored for a response: for a fill (the key a varying response is stored under,
//! and what is kept of it), and for an update of a stored response by a 304 or by a HEAD's 200
//! (fields merged, freshness recomputed). Cache decisions, so they live in `cache/`: the fetch
//! only carries them out.

use super::entry::{Entry, Meta};
use super::freshness::{self, Heuristics};
use super::key::CacheKey;
use super::targeted::Targeted;
use super::{policy, validation, variance};
use crate::http::request::RequestHead;
use crate::http::response::ResponseHead;
use std::time::SystemTime;

/// The key and metadata of a storable response: a varying response is stored under this
/// request's secondary key.
pub(crate) fn fill_meta(
    primary: &CacheKey,
    st: policy::Storable,
    req: &RequestHead,
    head: &ResponseHead,
    response_time: SystemTime,
    url: &str,
    hash_bits: u32,
) -> (CacheKey, Meta) {
    let key = if st.vary.is_empty() {
        primary.clone()
    } else {
        variance::variant(primary, &st.vary, req, hash_bits)
    };
    let meta = Meta {
        key: key.text.clone(),
        stored_at: crate::clock::shifted(response_time),
        initial_age: st.initial_age,
        lifetime: st.lifetime,
        status: head.status,
        reason: head.reason.clone(),
        fields: st.fields,
        vary: st.vary,
        url: url.to_string(),
    };
    (key, meta)
}

/// The stored response's metadata after a 304 (RFC 9111 §3.2, §4.3.4): fields merged, freshness
/// recomputed from them, age restarted from the 304.
///
/// The merged fields pass the same filter as a stored response's (RFC 9111 §3.1): fields that
/// `private="…"`/`no-cache="…"` name, and `Set-Cookie` on a route that doesn't store cookies or
/// once the freshness is no longer the origin's explicit one, are dropped, so a 304 to one
/// user's request cannot put that user's cookie into the shared entry.
/// The second value is false when the merged directives forbid storing at all (`no-store`,
/// `private`): the caller serves this client and then removes the entry.
pub(crate) fn revalidated_meta(
    stale: &Entry,
    head: &ResponseHead,
    request_time: SystemTime,
    response_time: SystemTime,
    h: Heuristics<'_>,
    store_set_cookie: bool,
    targeted: &Targeted,
) -> (Meta, bool) {
    let merged_block = validation::merge_304(&stale.meta.fields, head);
    let merged = ResponseHead {
        status: stale.meta.status,
        reason: stale.meta.reason.clone(),
        http10: false,
        fields: Vec::new(),
    }
    .with_stored_fields(&merged_block);
    let (d, governed) = targeted.governing(|n| merged.joined(n));
    let mut drop = d.private_fields.clone();
    drop.extend(d.no_cache_fields.iter().cloned());
    let fresh = freshness::lifetime(&merged, &d, governed, response_time, h);
    let lifetime = fresh.map(|(l, _)| l).unwrap_or_default();
    if !store_set_cookie || !matches!(fresh, Some((_, freshness::Source::Explicit))) {
        drop.push("set-cookie".into());
    }
    let fields = policy::stored_fields(&merged, &drop);
    let storable = !policy::forbids_storing(&d, stale.meta.status);
    let meta = Meta {
        key: stale.meta.key.clone(),
        stored_at: crate::clock::shifted(response_time),
        initial_age: freshness::initial_age(head, request_time, response_time),
        lifetime,
        status: stale.meta.status,
        reason: stale.meta.reason.clone(),
        fields,
        vary: stale.meta.vary.clone(),
        url: stale.meta.url.clone(),
    };
    (meta, storable)
}
