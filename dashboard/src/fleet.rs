//! The fleet as this node sees it: `GET /api/fleet` and the `zerocache_fleet_*` families. The
//! proxy owns the fleet (membership, health, forwarding); it hands the dashboard a snapshot
//! function ([`FleetHooks::view`]) and the purge fan-out ([`FleetHooks::purge`]), so this crate
//! depends on nothing of the proxy's.

use crate::server::DashboardState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use zerocache_ops::Purge;

/// The results a forward is counted under.
pub const FORWARD_RESULTS: [&str; 3] = ["ok", "error", "refused"];

/// One other member.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PeerView {
    /// Its member id (`ip:port` of its data port).
    pub id: String,
    /// Whether it is up (peers start up; a failure marks one down, a health check brings it back).
    pub up: bool,
    /// Its routing and key configuration hash (hex), once heard from.
    pub routing_hash: Option<String>,
    /// Whether that hash is this node's (a member that differs gets no forwards).
    pub routing_matches: bool,
    /// The purge epoch it last reported.
    pub purge_epoch: u64,
    /// Misses forwarded to it, by result, in [`FORWARD_RESULTS`] order.
    pub forwarded: [u64; 3],
    /// Its forwarded requests this node answered (as their owner).
    pub answered: u64,
    /// Why it was last marked down.
    pub last_error: Option<String>,
}

/// This node's view of the fleet.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FleetView {
    /// This node's member id.
    pub self_id: String,
    /// This node's routing and key configuration hash (hex).
    pub routing_hash: String,
    /// This node's purge epoch.
    pub purge_epoch: u64,
    /// Keys this node owns among those it stores (estimate).
    pub owned_keys: u64,
    /// Responses this node sent to peers' (forwarded) requests, by cache status.
    pub peer_responses: std::collections::BTreeMap<String, u64>,
    /// Response body bytes relayed from owners to clients (through user space).
    pub relayed_body_bytes: u64,
    /// Hop headers refused (served as clients' requests), by reason: malformed, forged, stale,
    /// replayed, overloaded, misdirected, unaddressed.
    pub hop_refused: std::collections::BTreeMap<String, u64>,
    /// Catch-ups after missed fleet purges: `replayed` from a peer's purge log, or `wiped`
    /// (the log no longer reached back: everything stored before was treated as purged).
    pub catch_ups: std::collections::BTreeMap<String, u64>,
    /// Fleet purges held in this node's purge log.
    pub purge_log_entries: u64,
    /// The other members.
    pub peers: Vec<PeerView>,
}

/// A purge fan-out's answer per peer, as JSON.
pub type PurgeFuture = Pin<Box<dyn Future<Output = serde_json::Value> + Send>>;

/// What the proxy gives the dashboard when it runs in a fleet.
pub struct FleetHooks {
    /// A snapshot of the fleet.
    pub view: Box<dyn Fn() -> FleetView + Send + Sync>,
    /// Sends a purge (already applied here) to every peer; answers per peer.
    pub purge: Box<dyn Fn(Purge) -> PurgeFuture + Send + Sync>,
}

/// `GET /api/fleet`: the view, or 404 when this node is not in a fleet.
pub(crate) async fn api(State(state): State<Arc<DashboardState>>) -> Response {
    match &state.fleet {
        Some(h) => Json((h.view)()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": "this node is not in a fleet (no `fleet:` in its config)"})),
        )
            .into_response(),
    }
}

/// The `zerocache_fleet_*` families, complete from start-up: every configured peer and every
/// result appear, at 0 until used. Nothing is registered for a node outside a fleet.
pub(crate) fn render(r: &Registry, state: &DashboardState) -> prometheus::Result<()> {
    let Some(h) = &state.fleet else {
        return Ok(());
    };
    let v = (h.view)();
    let up = IntGaugeVec::new(
        Opts::new(
            "zerocache_fleet_peer_up",
            "1 while a fleet peer is up (and computes keys as this node does), 0 while it is down or differs.",
        ),
        &["peer"],
    )?;
    r.register(Box::new(up.clone()))?;
    let forwarded = IntCounterVec::new(
        Opts::new(
            "zerocache_fleet_forwarded_total",
            "Misses this node forwarded to the key's owner, by peer and result (ok: answered; error: failed before a response, fell back; refused: not sent, the peer was down or its routing hash differs).",
        ),
        &["peer", "result"],
    )?;
    r.register(Box::new(forwarded.clone()))?;
    for p in &v.peers {
        up.with_label_values(&[p.id.as_str()])
            .set(i64::from(p.up && p.routing_matches));
        for (i, result) in FORWARD_RESULTS.iter().enumerate() {
            forwarded
                .with_label_values(&[p.id.as_str(), result])
                .inc_by(p.forwarded[i]);
        }
    }
    let gauge = |name: &str, help: &str, n: u64| -> prometheus::Result<()> {
        let g = prometheus::IntGauge::new(name, help)?;
        g.set(i64::try_from(n).unwrap_or(i64::MAX));
        r.register(Box::new(g))
    };
    gauge(
        "zerocache_fleet_owned_keys",
        "Stored keys this node owns (estimate: stored objects not filled for another owner).",
        v.owned_keys,
    )?;
    gauge(
        "zerocache_fleet_purge_epoch",
        "The fleet purge epoch this node has applied.",
        v.purge_epoch,
    )?;
    let counter = |name: &str, help: &str, n: u64| -> prometheus::Result<()> {
        let c = prometheus::IntCounter::new(name, help)?;
        c.inc_by(n);
        r.register(Box::new(c))
    };
    let peer = IntCounterVec::new(
        Opts::new(
            "zerocache_fleet_peer_requests_total",
            "Responses to fleet peers' forwarded requests, by cache status: zerocache_requests_total{source=\"peer\"} by another name.",
        ),
        &["cache_status"],
    )?;
    r.register(Box::new(peer.clone()))?;
    for cs in zerocache_ledger::CacheStatus::ALL {
        let n = v.peer_responses.get(cs.as_str()).copied().unwrap_or(0);
        peer.with_label_values(&[cs.as_str()]).inc_by(n);
    }
    let catch_ups = IntCounterVec::new(
        Opts::new(
            "zerocache_fleet_catch_ups_total",
            "Catch-ups after fleet purges this node missed: replayed (the purges applied from a peer's purge log) or wiped (the log no longer reached back, or no peer answered: everything stored before was treated as purged).",
        ),
        &["result"],
    )?;
    r.register(Box::new(catch_ups.clone()))?;
    for (result, n) in &v.catch_ups {
        catch_ups.with_label_values(&[result.as_str()]).inc_by(*n);
    }
    gauge(
        "zerocache_fleet_purge_log_entries",
        "Fleet purges held in this node's purge log (fleet.purge_log_max, purge_log_age).",
        v.purge_log_entries,
    )?;
    let refused = IntCounterVec::new(
        Opts::new(
            "zerocache_fleet_hop_refused_total",
            "Requests whose fleet hop header was refused (they were served as clients'), by reason: malformed, forged (not signed with the fleet secret), stale (outside the 30 s window), replayed (a nonce seen before), overloaded (too many nonces to remember), misdirected (signed for another member), unaddressed (a version-2 header without `to`).",
        ),
        &["reason"],
    )?;
    r.register(Box::new(refused.clone()))?;
    for (reason, n) in &v.hop_refused {
        refused.with_label_values(&[reason.as_str()]).inc_by(*n);
    }
    counter(
        "zerocache_fleet_relayed_body_bytes_total",
        "Response body bytes relayed from a key's owner to a client here: copied through user space (reason `peer`).",
        v.relayed_body_bytes,
    )?;
    Ok(())
}
