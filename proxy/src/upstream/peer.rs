//! One server of an upstream group and what the proxy knows about it: its idle keep-alive
//! connections, the requests in flight to it (what `least_conn` compares), and its health.
//!
//! Health has two independent sources, as in nginx (Plus): passive, from real requests
//! (`max_fails` failures within `fail_timeout` mark the server down for `fail_timeout`), and the
//! active health check's last verdict. A server is eligible when neither says it is down.
//! [`Peer::record`] is the one place every request's result on a server is known, so per-server
//! accounting (metrics) belongs there.

use super::stream::UpstreamStream;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use zerocache_config::ServerSpec;

/// How one attempt on a server ended, as far as its health is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A response head arrived (whatever its status: a 5xx is the origin answering).
    Answered,
    /// No response: the connect failed or timed out, or the connection failed or timed out
    /// before any response byte. The label says which (`connect`, `timeout`, `closed`, `io`).
    Failed(&'static str),
}

/// Passive health: nginx's `max_fails`/`fail_timeout` bookkeeping.
#[derive(Default, Debug)]
struct Passive {
    /// Failures in the current window.
    fails: u32,
    /// When the current window began (its first failure).
    window: Option<Instant>,
    /// Marked down until then. Kept after it passes: the server is then on probation, and one
    /// more failure marks it down again at once (nginx keeps `fails` at `max_fails` until a
    /// success for the same reason), while one answer clears it.
    down_until: Option<Instant>,
}

/// One server of a group.
pub(crate) struct Peer {
    /// `host:port` (without the `https://` of a TLS server).
    pub(crate) addr: String,
    /// An `https://` server: connections to it are TLS.
    pub(crate) tls: bool,
    /// Relative share of requests, at least 1.
    pub(crate) weight: u32,
    max_fails: u32,
    fail_timeout: Duration,
    /// Idle connections and the data-plane worker whose runtime polls each.
    pub(crate) idle: Mutex<Vec<(usize, UpstreamStream)>>,
    /// Connections handed out and not yet returned or dropped: requests in flight.
    active: AtomicUsize,
    passive: Mutex<Passive>,
    /// The active health check's last verdict was "down".
    check_down: AtomicBool,
}

/// One request in flight on a peer, counted while this lives (see [`Peer::active`]).
pub(crate) struct InFlight(Arc<Peer>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Peer {
    /// A peer from its resolved config.
    pub(crate) fn new(spec: &ServerSpec) -> Peer {
        let (tls, addr) = zerocache_config::tls::split_scheme(&spec.addr);
        Peer {
            addr: addr.to_string(),
            tls,
            weight: spec.weight.max(1),
            max_fails: spec.max_fails,
            fail_timeout: spec.fail_timeout,
            idle: Mutex::new(Vec::new()),
            active: AtomicUsize::new(0),
            passive: Mutex::new(Passive::default()),
            check_down: AtomicBool::new(false),
        }
    }

    /// Counts a request in flight until the returned guard is dropped.
    pub(crate) fn in_flight(self: &Arc<Self>) -> InFlight {
        self.active.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Requests in flight now.
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Whether the balancer may pick it at `now`: neither marked down by failures nor by the
    /// health check.
    pub(crate) fn is_up(&self, now: Instant) -> bool {
        !self.check_down.load(Ordering::Relaxed)
            && self.passive.lock().down_until.is_none_or(|u| now >= u)
    }

    /// Records how an attempt on this server ended: the one place each request's per-server
    /// result is known. Returns true when this failure marked the server down.
    pub(crate) fn record(&self, outcome: Outcome, now: Instant) -> bool {
        let mut p = self.passive.lock();
        match outcome {
            Outcome::Answered => {
                *p = Passive::default();
                false
            }
            Outcome::Failed(_) if self.max_fails == 0 => false,
            Outcome::Failed(_) => {
                let probation = p.down_until.is_some();
                if p.window
                    .is_none_or(|w| now.saturating_duration_since(w) >= self.fail_timeout)
                {
                    p.fails = 0;
                    p.window = Some(now);
                }
                p.fails += 1;
                if !probation && p.fails < self.max_fails {
                    return false;
                }
                // `now + fail_timeout` cannot overflow for any duration humans write, but a
                // config can say `fail_timeout: 500y`: down for a year is the same thing.
                let until = now
                    .checked_add(self.fail_timeout)
                    .unwrap_or(now + Duration::from_secs(365 * 86_400));
                let newly = p.down_until.is_none_or(|u| now >= u);
                *p = Passive {
                    fails: 0,
                    window: None,
                    down_until: Some(until),
                };
                newly
            }
        }
    }

    /// The active health check's verdict; returns whether it changed.
    pub(crate) fn set_checked(&self, healthy: bool) -> bool {
        self.check_down.swap(!healthy, Ordering::Relaxed) == healthy
    }

    /// How long a failure keeps it down (for the log line saying so).
    pub(crate) fn fail_timeout(&self) -> Duration {
        self.fail_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(max_fails: u32, secs: u64) -> Peer {
        Peer::new(&ServerSpec {
            addr: "127.0.0.1:1".into(),
            weight: 1,
            max_fails,
            fail_timeout: Duration::from_secs(secs),
        })
    }

    const FAIL: Outcome = Outcome::Failed("connect");

    #[test]
    fn max_fails_within_fail_timeout_mark_down_for_fail_timeout() {
        let p = peer(2, 10);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert!(!p.record(FAIL, t0));
        assert!(p.is_up(t0));
        // The window has passed: the count starts again.
        assert!(!p.record(FAIL, t0 + s(10)));
        assert!(p.is_up(t0 + s(10)));
        // The second within the window: down for fail_timeout from now.
        assert!(p.record(FAIL, t0 + s(15)));
        assert!(!p.is_up(t0 + s(15)));
        assert!(!p.is_up(t0 + s(24)));
        assert!(p.is_up(t0 + s(25)));
        // On probation: one failure is enough to mark it down again...
        assert!(p.record(FAIL, t0 + s(26)));
        assert!(!p.is_up(t0 + s(35)));
        // ...and one answer clears everything.
        assert!(!p.record(Outcome::Answered, t0 + s(36)));
        assert!(p.is_up(t0 + s(36)));
        assert!(!p.record(FAIL, t0 + s(37)));
        assert!(p.is_up(t0 + s(37)));
    }

    #[test]
    fn max_fails_zero_never_marks_down_and_the_check_is_separate() {
        let p = peer(0, 10);
        let t0 = Instant::now();
        for _ in 0..100 {
            assert!(!p.record(FAIL, t0));
        }
        assert!(p.is_up(t0));
        assert!(p.set_checked(false));
        assert!(!p.set_checked(false));
        assert!(!p.is_up(t0));
        assert!(p.set_checked(true));
        assert!(p.is_up(t0));
    }

    #[test]
    fn in_flight_counts_until_dropped() {
        let p = Arc::new(peer(1, 10));
        let a = p.in_flight();
        let b = p.in_flight();
        assert_eq!(p.active(), 2);
        drop(a);
        assert_eq!(p.active(), 1);
        drop(b);
        assert_eq!(p.active(), 0);
    }
}
