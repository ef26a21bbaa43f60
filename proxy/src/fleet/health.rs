//! Active health checks of the peers: every `health_interval` each peer's internal `health`
//! operation is asked, concurrently and within `health_timeout`. An answer brings a down peer
//! back (it takes its keys again) and reports its routing hash (a differing one stops forwards
//! to it, logged) and its purge epoch (one ahead of ours means this node missed a purge; see
//! `epoch`). No answer marks it down, as a failed forward does.

use super::Fleet;
use super::peer::PeerState;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Runs the checks until the process ends.
pub(crate) async fn run(fleet: Arc<Fleet>) {
    let mut tick = tokio::time::interval(fleet.cfg.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let view = fleet.view.load_full();
        let mut checks = tokio::task::JoinSet::new();
        for p in view.peers.iter().flatten() {
            checks.spawn(check(fleet.clone(), p.clone()));
        }
        while checks.join_next().await.is_some() {}
    }
}

async fn check(fleet: Arc<Fleet>, peer: Arc<PeerState>) {
    match super::internal::call(&fleet, &peer, "health", b"").await {
        Ok((200, json)) => {
            let theirs = json["routing_hash"]
                .as_str()
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .unwrap_or(0);
            peer.set_cfg(theirs, fleet.routing());
            let epoch = json["purge_epoch"].as_u64().unwrap_or(0);
            peer.epoch.store(epoch, Ordering::Relaxed);
            fleet.epoch.seen(epoch);
            peer.mark_up();
        }
        Ok((status, _)) => {
            peer.mark_down(format!("health check answered {status}"));
        }
        Err(e) => {
            peer.mark_down(format!("health check: {e}"));
        }
    }
}
