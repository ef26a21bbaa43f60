//! Active health checks of the peers: every `health_interval` each peer's internal `health`
//! operation is asked, concurrently and within `health_timeout`. An answer brings a down peer
//! back (it takes its keys again) and reports its routing hash (a differing one stops forwards
//! to it, logged) and its purge epoch. One ahead of ours means this node missed a purge: it asks
//! that peer for its purge log since our epoch and applies what it missed ([`catch_up`]); only
//! when the log no longer reaches back, or no catch-up works three times in a row, is everything
//! stored before treated as purged (`epoch`). No answer marks it down, as a failed forward does.

use super::Fleet;
use super::peer::PeerState;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Runs the checks until the process ends, the first round already made by [`first_round`].
pub(crate) async fn run(fleet: Arc<Fleet>) {
    let mut tick = tokio::time::interval(fleet.cfg.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Some((peer, theirs)) = round(&fleet).await {
            tokio::spawn(catch_up(fleet.clone(), peer, theirs));
        }
    }
}

/// The first round of checks, made before the node serves: a member that comes back after
/// missing fleet purges applies them (or, past the log, treats what it stored as purged) before
/// its first response, where it served purged objects until its first health check. Bounded by
/// `health_timeout` per call; peers that do not answer are marked down, as in any round.
pub(crate) async fn first_round(fleet: &Arc<Fleet>) {
    if let Some((peer, theirs)) = round(fleet).await {
        catch_up(fleet.clone(), peer, theirs).await;
    }
}

/// Asks every peer at once; returns the peer to catch up from, if one is ahead and no catch-up
/// is under way.
async fn round(fleet: &Arc<Fleet>) -> Option<(Arc<PeerState>, u64)> {
    let view = fleet.view.load_full();
    let mut checks = tokio::task::JoinSet::new();
    for p in view.peers.iter().flatten() {
        checks.spawn(check(fleet.clone(), p.clone()));
    }
    let mut behind = None;
    while let Some(r) = checks.join_next().await {
        if let Ok(Some(b)) = r {
            behind = Some(b);
        }
    }
    behind
}

/// Checks `peer`; returns it with its epoch when it is ahead and this node should catch up from
/// it (the catch-up flag is then taken: whoever gets this runs [`catch_up`]).
async fn check(fleet: Arc<Fleet>, peer: Arc<PeerState>) -> Option<(Arc<PeerState>, u64)> {
    match super::internal::call(&fleet, &peer, "health", b"").await {
        Ok((200, json)) => {
            let theirs = json["routing_hash"]
                .as_str()
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .unwrap_or(0);
            peer.set_cfg(theirs, fleet.routing());
            let epoch = json["purge_epoch"].as_u64().unwrap_or(0);
            peer.epoch.store(epoch, Ordering::Relaxed);
            peer.mark_up();
            if epoch > fleet.epoch.current()
                && fleet.epoch.plausible(epoch)
                && !fleet.catching_up.swap(true, Ordering::AcqRel)
            {
                return Some((peer, epoch));
            }
        }
        Ok((status, _)) => {
            peer.mark_down(format!("health check answered {status}"));
        }
        Err(e) => {
            peer.mark_down(format!("health check: {e}"));
        }
    }
    None
}

/// Catch-ups that may fail in a row (the peer gone again, an answer cut) before this node stops
/// trying and treats everything it stored before as purged.
const CATCH_UP_TRIES: u64 = 3;

/// Applies the purges `peer` logged since this node's epoch (it reported `theirs`): only the
/// objects they name are refetched. If the log no longer reaches back that far, or the catch-up
/// failed [`CATCH_UP_TRIES`] times, everything stored before is treated as purged instead.
async fn catch_up(fleet: Arc<Fleet>, peer: Arc<PeerState>, theirs: u64) {
    let ours = fleet.epoch.current();
    let body = serde_json::json!({ "since": ours }).to_string();
    let asked = super::internal::call(&fleet, &peer, "purge_log", body.as_bytes()).await;
    let log = match asked {
        Ok((200, json)) => {
            let entries: Option<Vec<super::purge_log::Logged>> =
                serde_json::from_value(json["entries"].clone()).ok();
            match (entries, json["complete"].as_bool()) {
                (Some(e), Some(complete)) => Ok((e, complete)),
                _ => Err("a purge log answer of the wrong shape".to_string()),
            }
        }
        Ok((status, json)) => Err(format!("{status}: {json}")),
        Err(e) => Err(e),
    };
    match log {
        Ok((entries, true)) => {
            let routes = fleet.routes.load_full();
            let purger = fleet.purger(&routes);
            let (mut applied, mut newest) = (0usize, theirs);
            for l in &entries {
                let Some(p) = l.purge() else { continue };
                if !fleet.purge_log.contains(l) {
                    if let Err(e) = purger.purge(&p) {
                        tracing::warn!(error = %e, ?p, "a purge from a peer's log does not apply here");
                    }
                    fleet.purge_log.record(l.epoch, &l.from, &p);
                    applied += 1;
                }
                newest = newest.max(l.epoch);
            }
            // Counted before the epoch moves: whoever sees the new epoch sees the count.
            fleet.catch_ups[0].fetch_add(1, Ordering::Relaxed);
            fleet.epoch.applied(newest);
            fleet.catch_up_failures.store(0, Ordering::Relaxed);
            tracing::info!(peer = %peer.id, ours, theirs, applied, "caught up with missed fleet purges from a peer's purge log");
        }
        Ok((_, false)) => {
            tracing::warn!(peer = %peer.id, ours, theirs, "missed fleet purges older than the peer's purge log keeps (fleet.purge_log_max, purge_log_age)");
            wipe(&fleet, theirs);
        }
        Err(why) => {
            let failed = fleet.catch_up_failures.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(peer = %peer.id, %why, failed, "cannot read a peer's purge log");
            if failed >= CATCH_UP_TRIES {
                wipe(&fleet, theirs);
            }
        }
    }
    fleet.catching_up.store(false, Ordering::Release);
}

/// The fallback: everything stored until now counts as purged (`epoch`).
fn wipe(fleet: &Fleet, theirs: u64) {
    // Counted before the epoch moves, as a replay is.
    if theirs > fleet.epoch.current() {
        fleet.catch_ups[1].fetch_add(1, Ordering::Relaxed);
    }
    fleet.epoch.seen(theirs);
    fleet.catch_up_failures.store(0, Ordering::Relaxed);
}
