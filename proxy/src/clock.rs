//! The clock the cache's freshness decisions read: the system clock, plus an offset that only a
//! test can move (`debug.adjustable_clock` with `ZEROCACHE_TEST_CLOCK=1`, then
//! `POST /api/debug/clock`). Moving it ages every stored response at once, so a test of
//! `max-age=1` advances two seconds instead of sleeping them.
//!
//! Only decisions about stored responses read it (age, freshness, stale-while-revalidate,
//! stale-if-error); the times a fill records (`request_time`, `response_time`) and the `Date`
//! the proxy writes stay on the system clock, so an advance makes entries older without making
//! origins' `Date` fields look late. The offset only grows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// The name of the environment variable that must be `1` for `debug.adjustable_clock`.
pub(crate) const ENABLE_ENV: &str = "ZEROCACHE_TEST_CLOCK";

static OFFSET_SECS: AtomicU64 = AtomicU64::new(0);

/// Now, as the cache's freshness decisions see it.
pub(crate) fn now() -> SystemTime {
    let offset = OFFSET_SECS.load(Ordering::Relaxed);
    let now = SystemTime::now();
    if offset == 0 {
        now
    } else {
        now + Duration::from_secs(offset)
    }
}

/// Moves the clock `secs` forward; returns the whole offset.
pub(crate) fn advance(secs: u64) -> u64 {
    OFFSET_SECS
        .fetch_add(secs, Ordering::Relaxed)
        .saturating_add(secs)
}

/// Whether `debug.adjustable_clock` may be honoured: the environment says this is a test.
pub(crate) fn enabled_by_environment() -> bool {
    std::env::var(ENABLE_ENV).is_ok_and(|v| v == "1")
}
