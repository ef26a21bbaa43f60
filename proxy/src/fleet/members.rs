//! The membership: `self` and `peers` (or the address records of `peers_dns`) resolved to the
//! `ip:port` ids every member hashes by, `self` deduplicated out of the peers, re-resolved every
//! `dns_interval` so a Kubernetes headless Service or any DNS record set works. A resolution that
//! fails keeps the last membership (a DNS outage must not make every node think it is alone).

use super::owner::Member;
use super::peer::PeerState;
use std::collections::BTreeMap;
use std::sync::Arc;
use zerocache_config::UpstreamServer;
use zerocache_config::fleet::FleetConfig;

/// Longest wait for one name's addresses.
const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One resolved membership.
pub(crate) struct View {
    /// Every member, this node included, sorted by id.
    pub(crate) members: Vec<Member>,
    /// This node's index in `members` (`None` until `self` resolves: the node then forwards
    /// nothing).
    pub(crate) self_index: Option<usize>,
    /// The peers, by index in `members` (`None` at `self_index`).
    pub(crate) peers: Vec<Option<Arc<PeerState>>>,
}

impl View {
    /// A view of this node alone (before the first resolution).
    pub(crate) fn empty() -> View {
        View {
            members: Vec::new(),
            self_index: None,
            peers: Vec::new(),
        }
    }

    /// The member ids, for comparing two views.
    pub(crate) fn ids(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.id.as_str()).collect()
    }
}

/// `host:port` resolved to its addresses as ids; `ip:port` literals need no lookup.
async fn resolve(addr: &str) -> std::io::Result<Vec<String>> {
    if let Ok(a) = addr.parse::<std::net::SocketAddr>() {
        return Ok(vec![a.to_string()]);
    }
    let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host(addr))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no DNS answer within {LOOKUP_TIMEOUT:?}"),
            )
        })??;
    let mut out: Vec<String> = lookup.map(|a| a.to_string()).collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// This node's id and every member's (id, weight), or why resolution failed.
pub(crate) async fn resolve_all(cfg: &FleetConfig) -> Result<(String, Vec<(String, u32)>), String> {
    let me = resolve(&cfg.self_addr)
        .await
        .map_err(|e| format!("fleet.self `{}`: {e}", cfg.self_addr))?
        .into_iter()
        .next()
        .ok_or_else(|| format!("fleet.self `{}` has no address", cfg.self_addr))?;
    let mut all: BTreeMap<String, u32> = BTreeMap::new();
    all.insert(me.clone(), cfg.weight);
    if let Some(dns) = &cfg.peers_dns {
        for id in resolve(dns)
            .await
            .map_err(|e| format!("fleet.peers_dns `{dns}`: {e}"))?
        {
            // Every record weighs what this node does: a DNS record set carries no weights.
            all.entry(id).or_insert(cfg.weight);
        }
    }
    for p in &cfg.peers {
        let (addr, weight) = match p {
            UpstreamServer::Addr(a) => (a, 1),
            UpstreamServer::Detailed(d) => (&d.addr, d.weight),
        };
        let ids = resolve(addr)
            .await
            .map_err(|e| format!("fleet.peers `{addr}`: {e}"))?;
        for id in ids {
            if id == me {
                // `self` listed among the peers: its weight is the one given there.
                all.insert(id, weight);
            } else {
                all.entry(id).or_insert(weight);
            }
        }
    }
    Ok((me, all.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> FleetConfig {
        serde_yaml::from_str(yaml).expect("fleet config")
    }

    #[tokio::test]
    async fn self_is_deduplicated_from_the_peers_and_names_resolve() {
        let (me, all) = resolve_all(&cfg(
            "self: 127.0.0.2:8080\npeers: [\"127.0.0.2:8080\", \"127.0.0.3:8080\", {addr: \"127.0.0.4:8080\", weight: 3}]\nsecret: s\n",
        ))
        .await
        .expect("resolved");
        assert_eq!(me, "127.0.0.2:8080");
        assert_eq!(
            all,
            [
                ("127.0.0.2:8080".to_string(), 1),
                ("127.0.0.3:8080".to_string(), 1),
                ("127.0.0.4:8080".to_string(), 3)
            ]
        );
        // A DNS name: every address record is a member, this node's own among them once.
        let (me, all) = resolve_all(&cfg(
            "self: 127.0.0.1:8080\npeers_dns: localhost:8080\nsecret: s\n",
        ))
        .await
        .expect("resolved");
        assert_eq!(me, "127.0.0.1:8080");
        assert_eq!(all.iter().filter(|(id, _)| *id == me).count(), 1);
        assert!(all.iter().all(|(id, _)| id.ends_with(":8080")), "{all:?}");
        let e = resolve_all(&cfg(
            "self: 127.0.0.1:8080\npeers_dns: no-such-name.invalid:8080\nsecret: s\n",
        ))
        .await
        .expect_err("unresolvable");
        assert!(
            e.starts_with("fleet.peers_dns `no-such-name.invalid:8080`"),
            "{e}"
        );
    }
}
