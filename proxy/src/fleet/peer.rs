//! One other member as this node sees it: its pooled connections (an upstream group of one
//! server, the same HTTP/1.1 client as an origin's), whether it is up, the routing hash and
//! purge epoch it last reported, and what was forwarded to it.

use crate::upstream::Group;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use zerocache_config::{Balance, Upstream, UpstreamServer};

/// The results a forward is counted under (`zerocache_fleet_forwarded_total{result}`).
pub(crate) const RESULTS: [&str; 3] = ["ok", "error", "refused"];

/// A peer and its state.
pub(crate) struct PeerState {
    /// Its member id (`ip:port`).
    pub(crate) id: String,
    /// Its connections.
    pub(crate) group: Arc<Group>,
    up: AtomicBool,
    /// The routing hash it last reported (0: not heard from yet).
    cfg: AtomicU64,
    /// The purge epoch it last reported.
    pub(crate) epoch: AtomicU64,
    forwarded: [AtomicU64; 3],
    /// Requests it forwarded here that this node answered.
    pub(crate) answered: AtomicU64,
    /// Why it was last marked down, for the dashboard.
    last_error: Mutex<Option<String>>,
}

impl PeerState {
    /// A peer at `id`, up until it fails.
    pub(crate) fn new(id: &str, connect_timeout: Duration, read_timeout: Duration) -> PeerState {
        let cfg = Upstream {
            servers: vec![UpstreamServer::Addr(id.to_string())],
            connect_timeout,
            read_timeout,
            keepalive: 64,
            balance: Balance::RoundRobin,
            // The fleet keeps its own up/down state (health checks bring a peer back).
            max_fails: 0,
            fail_timeout: Duration::from_secs(1),
            health_check: None,
            host: None,
            // Peers speak plain HTTP on their data ports (docs/fleet.md).
            tls: None,
        };
        PeerState {
            id: id.to_string(),
            group: Arc::new(Group::new(&format!("peer:{id}"), &cfg)),
            up: AtomicBool::new(true),
            cfg: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            forwarded: Default::default(),
            answered: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }

    /// Whether it is up.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Marks it down for `why`; true if it was up.
    pub(crate) fn mark_down(&self, why: String) -> bool {
        let was = self.up.swap(false, Ordering::Relaxed);
        if was {
            tracing::warn!(peer = %self.id, reason = %why, "fleet peer down");
        }
        *self.last_error.lock() = Some(why);
        was
    }

    /// Marks it up (a health check answered); true if it was down.
    pub(crate) fn mark_up(&self) -> bool {
        let was_down = !self.up.swap(true, Ordering::Relaxed);
        if was_down {
            tracing::info!(peer = %self.id, "fleet peer up");
        }
        was_down
    }

    /// The routing hash it last reported, 0 if none yet.
    pub(crate) fn cfg(&self) -> u64 {
        self.cfg.load(Ordering::Relaxed)
    }

    /// Records the routing hash it reported, logging a change into or out of disagreement
    /// with `ours`.
    pub(crate) fn set_cfg(&self, theirs: u64, ours: u64) {
        let before = self.cfg.swap(theirs, Ordering::Relaxed);
        if before != theirs && theirs != ours {
            tracing::error!(peer = %self.id, theirs = format_args!("{theirs:016x}"), ours = format_args!("{ours:016x}"), "fleet peer has a different routing and key configuration; not forwarding to it");
        }
    }

    /// Whether a key may be forwarded to it: up, and computing keys as this node does. A peer
    /// not heard from yet is trusted as up (peers start up), but its hash must match once known.
    pub(crate) fn usable(&self, ours: u64) -> bool {
        let cfg = self.cfg();
        self.is_up() && (cfg == 0 || cfg == ours)
    }

    /// Counts a forward with `result` (one of [`RESULTS`]).
    pub(crate) fn count(&self, result: &str) {
        if let Some(i) = RESULTS.iter().position(|r| *r == result) {
            self.forwarded[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forwards by result, in [`RESULTS`] order.
    pub(crate) fn forwarded(&self) -> [u64; 3] {
        std::array::from_fn(|i| self.forwarded[i].load(Ordering::Relaxed))
    }

    /// Why it was last marked down.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }
}
