//! A fleet purge: applied here by the dashboard, logged ([`super::purge_log`]), then sent to
//! every peer (up or not: a peer marked down may be back already) with the next purge epoch,
//! concurrently. The answer says per peer how many entries went or why it could not be reached.
//! A peer that missed it learns the epoch from the health checks when it returns and replays
//! what it missed from a member's purge log (`super::health`).

use super::Fleet;
use std::sync::Arc;
use zerocache_ops::{Purge, Target};

/// Sends `p` to every peer; answers `{peer: {"purged": n} | {"error": why}}`.
pub(crate) async fn fan_out(fleet: Arc<Fleet>, p: Purge) -> serde_json::Value {
    let epoch = fleet.epoch.next();
    let me = fleet.self_id().unwrap_or_default();
    // Applied here already (by the dashboard): logged under its epoch, for members that miss it.
    fleet.purge_log.record(epoch, &me, &p);
    let body = match &p.target {
        Target::Url(u) => {
            serde_json::json!({"url": u, "soft": p.soft, "epoch": epoch, "from": me})
        }
        Target::Prefix(x) => {
            serde_json::json!({"prefix": x, "soft": p.soft, "epoch": epoch, "from": me})
        }
        Target::Tags(t) => {
            serde_json::json!({"tags": t, "soft": p.soft, "epoch": epoch, "from": me})
        }
    }
    .to_string();
    let view = fleet.view.load_full();
    let mut calls = tokio::task::JoinSet::new();
    for peer in view.peers.iter().flatten() {
        let (fleet, peer, body) = (fleet.clone(), peer.clone(), body.clone());
        calls.spawn(async move {
            let r = super::internal::call(&fleet, &peer, "purge", body.as_bytes()).await;
            let v = match r {
                Ok((200, json)) => json,
                Ok((status, json)) => serde_json::json!({"error": format!("{status}: {json}")}),
                Err(e) => serde_json::json!({ "error": e }),
            };
            (peer.id.clone(), v)
        });
    }
    let mut out = serde_json::Map::new();
    while let Some(r) = calls.join_next().await {
        if let Ok((id, v)) = r {
            out.insert(id, v);
        }
    }
    tracing::info!(?p, epoch, peers = %serde_json::Value::Object(out.clone()), "fleet purge sent");
    serde_json::Value::Object(out)
}
