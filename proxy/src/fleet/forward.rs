//! Forwarding a miss to the key's owner. The request the fetch built for the origin gets the hop
//! header and goes to the owner over that peer's pooled connections; the owner answers from its
//! cache or fills from the origin, and the answer is relayed to the client. A forward that fails
//! before any response byte (refused, reset, timed out) marks the peer down and falls back at
//! once: to the next member in the key's hash order (`on_owner_down: next`; when that is this
//! node, it fetches from the origin and stores as the owner would), or straight to the origin
//! (`origin`, not stored). A down peer or one whose routing hash differs is not asked at all.

use super::Fleet;
use super::members::View;
use super::peer::PeerState;
use crate::http::head::{CacheFields, CacheStatusField};
use crate::http::response::ResponseHead;
use crate::upstream::{Group, UpstreamConn, UpstreamError};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use zerocache_config::fleet::OnOwnerDown;

/// The members to ask for one key, in its hash order (the owner first, never this node first).
pub(crate) struct Plan {
    pub(crate) fleet: Arc<Fleet>,
    pub(crate) view: Arc<View>,
    pub(crate) order: Vec<usize>,
}

/// A response being relayed from a peer.
pub(crate) struct Relay {
    /// The peer.
    pub(crate) peer: Arc<PeerState>,
    /// This node's fleet.
    pub(crate) fleet: Arc<Fleet>,
}

impl Relay {
    /// Counts `n` body bytes relayed to the client (copied through user space: reason `peer`).
    pub(crate) fn relayed(&self, n: u64) {
        self.fleet.relayed.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether this node may store the owner's answer `head` too (`store_remote`): while the
    /// bytes of such objects stored so far stay within `local_hot_max`. Only a body whose length
    /// is known counts against it; it is reserved here.
    pub(crate) fn may_store(&self, head: &ResponseHead) -> bool {
        let cfg = &self.fleet.cfg;
        let Some(len) = head
            .field("content-length")
            .and_then(|v| v.parse::<u64>().ok())
        else {
            return false;
        };
        let max = cfg.local_hot_max.as_u64();
        let took = self
            .fleet
            .hot_stored
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (cfg.store_remote && used + len <= max).then_some(used + len)
            })
            .is_ok();
        if took {
            self.fleet.remote_objects.fetch_add(1, Ordering::Relaxed);
        }
        took
    }
}

/// Who answered a planned miss.
pub(crate) enum Went {
    /// A peer (the owner, or the next one up in the key's order).
    Peer(Relay),
    /// The origin, from this node; `store`: this node is the key's owner while the ones before it
    /// are down, so it stores the answer.
    Origin {
        /// Whether to store the answer here.
        store: bool,
    },
}

/// An exchange's result: the connection it answered on and the response head.
pub(crate) type Exchanged = Result<(UpstreamConn, ResponseHead), UpstreamError>;

/// `request` (built for the origin) as a peer gets it: the hop header `line` after the request
/// line, and `Host` the client's (`host`), whatever the upstream group sends its origin
/// (`upstreams.NAME.host`): the owner routes and keys the request by the client's host, as this
/// node did. The request builder writes `Host` first.
fn with_hop(request: &[u8], line: &str, host: &str) -> Vec<u8> {
    let line_end = |from: usize| {
        request[from..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(request.len(), |i| from + i + 2)
    };
    let first = line_end(0);
    let rest = if request[first..]
        .get(..5)
        .is_some_and(|h| h.eq_ignore_ascii_case(b"host:"))
    {
        line_end(first)
    } else {
        first
    };
    let mut out = Vec::with_capacity(request.len() + line.len() + host.len());
    out.extend_from_slice(&request[..first]);
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
    out.extend_from_slice(&request[rest..]);
    out
}

/// Sends `request` (a GET or HEAD without body, built for the origin) along `plan`; `origin`
/// is the route's upstream group, for when this node must fetch itself. `key` is the primary
/// key, `host` the client's (normalised) host.
pub(crate) async fn exchange(
    plan: Plan,
    origin: &Group,
    request: &[u8],
    key: &str,
    host: &str,
    interim: &mut Vec<ResponseHead>,
) -> (Went, Exchanged) {
    let f = &plan.fleet;
    let ours = f.routing();
    // The request line: what the signature covers with the host (the body is empty).
    let first = request.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut words = std::str::from_utf8(first).unwrap_or_default().split(' ');
    let signed = super::hop::Request {
        method: words.next().unwrap_or_default(),
        target: words.next().unwrap_or_default(),
        host,
        body: b"",
    };
    let self_id = f.self_id().unwrap_or_default();
    let mut store_at_origin = true;
    for &i in &plan.order {
        if Some(i) == plan.view.self_index {
            break;
        }
        let Some(peer) = plan.view.peers.get(i).cloned().flatten() else {
            continue;
        };
        if !peer.usable(ours) {
            peer.count("refused");
            if f.on_owner_down() == OnOwnerDown::Origin {
                store_at_origin = false;
                break;
            }
            continue;
        }
        interim.clear();
        // Signed for this peer: the header is good at no other member.
        let line = super::hop::line(&self_id, &peer.id, ours, &f.keys, None, &signed);
        let hopped = with_hop(request, &line, host);
        match peer
            .group
            .exchange(&hopped, true, key, interim, &mut None)
            .await
        {
            Ok(x) => {
                peer.count("ok");
                let fleet = plan.fleet.clone();
                return (Went::Peer(Relay { peer, fleet }), Ok(x));
            }
            Err(e) => {
                peer.count("error");
                peer.mark_down(e.to_string());
                if f.on_owner_down() == OnOwnerDown::Origin {
                    store_at_origin = false;
                    break;
                }
            }
        }
    }
    // This node is next in the key's order (or, having left the membership meanwhile, fetches as
    // if alone), or `on_owner_down: origin` sends the key to the origin unstored.
    interim.clear();
    let x = origin
        .exchange(request, true, key, interim, &mut None)
        .await;
    (
        Went::Origin {
            store: store_at_origin,
        },
        x,
    )
}

/// What a response relayed from a peer says of the cache: `X-Cache` as the owner sent it, and
/// `Cache-Status` with the owner's members first and this node's after them (RFC 9211 lists the
/// cache nearest the origin first).
pub(crate) struct Relayed {
    x_cache: String,
    owner: Option<String>,
    stored: bool,
}

/// The cache fields of `head`, relayed from a peer; `stored`: this node stores it too.
pub(crate) fn relayed(head: &ResponseHead, stored: bool) -> Relayed {
    Relayed {
        x_cache: head.field("x-cache").unwrap_or("MISS").to_string(),
        owner: head.joined("cache-status"),
        stored,
    }
}

impl Relayed {
    /// The owner's `X-Cache` token.
    pub(crate) fn x_cache(&self) -> &str {
        &self.x_cache
    }

    /// The fields to write: this node's member is `fwd=miss` (`stored` when it keeps a copy),
    /// `detail=peer`.
    pub(crate) fn fields(&self) -> CacheFields<'_> {
        CacheFields {
            x_cache: &self.x_cache,
            upstream: self.owner.as_deref(),
            member: Some(CacheStatusField {
                stored: self.stored,
                ..CacheStatusField::fwd("miss").detail("peer")
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hop_header_goes_after_the_request_line_with_the_clients_host() {
        let r = with_hop(
            b"GET /a HTTP/1.1\r\nHost: bucket.s3.example\r\nVia: 1.1 zerocache\r\n\r\n",
            "Zerocache-Fleet: v1\r\n",
            "www.example",
        );
        assert_eq!(
            r,
            b"GET /a HTTP/1.1\r\nZerocache-Fleet: v1\r\nHost: www.example\r\nVia: 1.1 zerocache\r\n\r\n".to_vec()
        );
        let r = with_hop(b"GET /a HTTP/1.1\r\nVia: x\r\n\r\n", "Z: 1\r\n", "h");
        assert_eq!(
            r,
            b"GET /a HTTP/1.1\r\nZ: 1\r\nHost: h\r\nVia: x\r\n\r\n".to_vec()
        );
    }
}
