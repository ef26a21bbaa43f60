//! When a stored response may be served stale (RFC 5861, RFC 9111 §4.2.4): while it is
//! revalidated in the background (`stale-while-revalidate`), and in place of an upstream that
//! failed (`stale-if-error`, or the route's `stale_grace` without it). Never past
//! `must-revalidate`, `proxy-revalidate`, `no-cache` or `s-maxage`, which forbid serving stale.

use super::directives::RequestDirectives;
use super::entry::Entry;
use super::freshness::{self, Use};
use std::time::{Duration, SystemTime};

/// How long past its lifetime `e` is at `now`.
fn staleness(e: &Entry, now: SystemTime) -> Duration {
    e.age(now).saturating_sub(e.meta.lifetime)
}

/// Whether `e` may be served now and refreshed in the background, once: within its
/// `stale-while-revalidate` window, when only its age (not the request) asks for validation.
pub fn while_revalidate(e: &Entry, now: SystemTime, req: &RequestDirectives) -> bool {
    e.stale_while_revalidate
        .is_some_and(|w| staleness(e, now) <= w)
        && !e.reuse.no_stale
        && !e.reuse.always_revalidate
        && freshness::decide(e.age(now), e.meta.lifetime, e.reuse, &Default::default())
            == Use::Revalidate
        && !req.no_cache
        && req.max_age.is_none()
        && req.min_fresh.is_none()
}

/// Whether `e` may be served in place of a failed upstream answer: within its `stale-if-error`
/// window, or `grace` when it has none.
pub fn if_error(e: &Entry, grace: Duration, now: SystemTime) -> bool {
    if e.reuse.no_stale || e.reuse.always_revalidate {
        return false;
    }
    staleness(e, now) <= e.stale_if_error.unwrap_or(grace)
}
