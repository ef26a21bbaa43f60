//! The clock the cache's freshness decisions read: the system clock, plus an offset that only a
//! test can move (`debug.adjustable_clock` with `ZEROCACHE_TEST_CLOCK=1`, then
//! `POST /api/debug/clock`). Moving it ages every stored response at once, so a test of
//! `max-age=1` advances two seconds instead of sleeping them.
//!
//! Only decisions about stored responses read it (age, freshness, stale-while-revalidate,
//! stale-if-error), and the moment a fill records as its entry's `stored_at` ([`shifted`]), so an
//! advance ages what is stored and what is stored afterwards starts at age 0. The times an
//! entry's initial age is computed from (`request_time`, `response_time`, the origin's `Date`)
//! and the `Date` the proxy writes stay on the system clock, so an advance never makes an
//! origin's `Date` look late. The offset only grows.

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

/// `t`, a time read from the system clock, on the cache's clock: what a fill records as the
/// moment it was stored, so an entry stored after an advance starts at age 0 like any other.
pub(crate) fn shifted(t: SystemTime) -> SystemTime {
    t + Duration::from_secs(OFFSET_SECS.load(Ordering::Relaxed))
}

/// How far a test has moved the clock (zero outside tests).
pub(crate) fn offset() -> Duration {
    Duration::from_secs(OFFSET_SECS.load(Ordering::Relaxed))
}

/// Moves the clock `secs` forward; returns the whole offset.
pub(crate) fn advance(secs: u64) -> u64 {
    OFFSET_SECS
        .fetch_add(secs, Ordering::Relaxed)
        .saturating_add(secs)
}

/// Why `config` may not run here: it sets `debug.adjustable_clock` and the environment does not
/// say this is a test. `run`, `check` and a SIGHUP reload all refuse such a config, so none of
/// them can accept what another would refuse.
pub fn refusal(config: &zerocache_config::Config) -> Option<String> {
    let enabled = std::env::var(ENABLE_ENV).is_ok_and(|v| v == "1");
    (config.debug.adjustable_clock && !enabled).then(|| {
        format!(
            "debug.adjustable_clock is a test hook and needs {ENABLE_ENV}=1 in the environment as well; remove it from a production config"
        )
    })
}
