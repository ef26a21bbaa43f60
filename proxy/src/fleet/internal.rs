//! The fleet's internal endpoint on the data port, both sides. A request is internal only when
//! its hop header proves the fleet secret *and* names an operation (`op=health`, `op=purge`);
//! the path is for logs only. A client cannot reach it (it has no secret), and no origin path
//! is shadowed (a forwarded client request names no operation, whatever its path).
//!
//! - `health`: answers this node's id, routing hash and purge epoch;
//! - `purge`: applies a fleet purge (`{"url"|"prefix": ..., "epoch": n, "from": id}`), logs it
//!   and answers how many entries went;
//! - `purge_log`: answers the purges logged since an epoch (`{"since": n}`), for a member that
//!   missed them, and whether the log still reaches back that far.

use super::Fleet;
use super::peer::PeerState;
use crate::http::head::{Framing, Head, HeadBuf};
use crate::upstream::body::BodyReader;
use serde::Deserialize;

/// Longest wait for one peer's answer to a fleet purge.
const PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The `Host` of an internal request (signed with it).
const HOST: &str = "zerocache-fleet";

/// Largest internal answer or request body read.
const MAX_BODY: usize = 64 * 1024;

/// A fleet purge as sent to a peer.
#[derive(Deserialize)]
struct PurgeRequest {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
    #[serde(default)]
    soft: bool,
    epoch: u64,
    /// The member that started it (for the purge log).
    #[serde(default)]
    from: String,
}

/// A catch-up's question: the purges since this epoch.
#[derive(Deserialize)]
struct LogRequest {
    since: u64,
}

/// Largest purge-log answer: the whole log fits (`fleet.purge_log_max` is bounded so).
pub(crate) const MAX_LOG_ANSWER: usize = 8 << 20;

/// The answer (status, JSON) to internal operation `op` with request body `body` (`None`: too
/// large to have been held in memory).
pub(crate) fn answer(
    fleet: &Fleet,
    purger: &crate::purge::Purger<'_>,
    op: &str,
    body: Option<&[u8]>,
) -> (u16, serde_json::Value) {
    match op {
        "health" => (
            200,
            serde_json::json!({
                "id": fleet.self_id(),
                "routing_hash": format!("{:016x}", fleet.routing()),
                "purge_epoch": fleet.epoch.current(),
            }),
        ),
        "purge" => match body {
            Some(b) => purge(fleet, purger, b),
            None => (413, serde_json::json!({"error": "purge body too large"})),
        },
        "purge_log" => match body.map(serde_json::from_slice::<LogRequest>) {
            Some(Ok(q)) => {
                let (entries, complete) = fleet.purge_log.since(q.since);
                (
                    200,
                    serde_json::json!({
                        "epoch": fleet.epoch.current(),
                        "complete": complete,
                        "entries": entries,
                    }),
                )
            }
            _ => (400, serde_json::json!({"error": "give {\"since\": epoch}"})),
        },
        _ => (
            400,
            serde_json::json!({"error": format!("unknown fleet operation `{op}`")}),
        ),
    }
}

/// An internal answer as a response into `out`: head and JSON body (`close`: the connection
/// ends after).
pub(crate) fn response(out: &mut HeadBuf, status: u16, json: &serde_json::Value, close: bool) {
    let text = json.to_string();
    let mut h = Head::standard(out, status);
    h.field("Content-Type", b"application/json")
        .field("Cache-Control", b"no-store")
        .framing(Framing::Length(text.len() as u64));
    h.end(close);
    out.body(text.as_bytes());
}

fn purge(
    fleet: &Fleet,
    purger: &crate::purge::Purger<'_>,
    body: &[u8],
) -> (u16, serde_json::Value) {
    let p: PurgeRequest = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => {
            return (
                400,
                serde_json::json!({"error": format!("invalid JSON: {e}")}),
            );
        }
    };
    if !fleet.epoch.plausible(p.epoch) {
        return (
            400,
            serde_json::json!({"error": format!("purge epoch {} is beyond what a peer could have issued", p.epoch)}),
        );
    }
    let target = match (p.url, p.prefix, p.tags) {
        (Some(u), None, None) => zerocache_ops::Purge::url(u).soft(p.soft),
        (None, Some(x), None) => zerocache_ops::Purge::prefix(x).soft(p.soft),
        (None, None, Some(t)) => match zerocache_ops::check_tags(&t) {
            Ok(()) => zerocache_ops::Purge::tags(t).soft(p.soft),
            Err(e) => return (400, serde_json::json!({ "error": e })),
        },
        _ => {
            return (
                400,
                serde_json::json!({"error": "give exactly one of `url`, `prefix` and `tags`"}),
            );
        }
    };
    match purger.purge(&target) {
        Ok(n) => {
            fleet.purge_log.record(p.epoch, &p.from, &target);
            fleet.epoch.applied(p.epoch);
            tracing::info!(?target, purged = n, epoch = p.epoch, "fleet purge");
            (200, serde_json::json!({"purged": n}))
        }
        Err(e) => (400, serde_json::json!({ "error": e })),
    }
}

/// Asks `peer` for operation `op` with JSON `body` (empty for none); answers its status and
/// JSON, within the fleet's health timeout for a health check, and within its read timeout but
/// at most 5 s otherwise.
pub(crate) async fn call(
    fleet: &Fleet,
    peer: &PeerState,
    op: &str,
    body: &[u8],
) -> Result<(u16, serde_json::Value), String> {
    let method = if body.is_empty() { "GET" } else { "POST" };
    let target = format!("/_zerocache/fleet/{op}");
    let signed = super::hop::Request {
        method,
        target: &target,
        host: HOST,
        body,
    };
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n{}",
        super::hop::line(
            &fleet.self_id().unwrap_or_default(),
            &peer.id,
            fleet.routing(),
            &fleet.keys,
            Some(op),
            &signed
        )
    )
    .into_bytes();
    if !body.is_empty() {
        req.extend_from_slice(
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    // A purge waits for a hung peer no longer than this: the operator is waiting for the answer,
    // and the peer catches up by the epoch anyway.
    let limit = if op == "health" {
        fleet.cfg.health_timeout
    } else {
        fleet.cfg.read_timeout.min(PURGE_WAIT)
    };
    let exchange = async {
        let (mut up, head) = peer
            .group
            .exchange(&req, op == "health", "", &mut Vec::new(), &mut None)
            .await
            .map_err(|e| e.to_string())?;
        let framing = head.framing(false).map_err(str::to_string)?;
        let mut reader = BodyReader::new(framing, fleet.cfg.read_timeout);
        let (mut all, mut piece) = (Vec::new(), Vec::new());
        while !reader.is_done() {
            reader
                .next(&mut up, &mut piece)
                .await
                .map_err(|e| e.to_string())?;
            all.extend_from_slice(&piece);
            let max = if op == "purge_log" {
                MAX_LOG_ANSWER
            } else {
                MAX_BODY
            };
            if all.len() > max {
                return Err(format!("answer larger than {max} bytes"));
            }
        }
        let closes = head.http10
            || head
                .field("connection")
                .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        if reader.reusable() && !closes {
            peer.group.release(up);
        }
        let json = serde_json::from_slice(&all).map_err(|e| format!("invalid JSON: {e}"))?;
        Ok((head.status, json))
    };
    tokio::time::timeout(limit, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}
