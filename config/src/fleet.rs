//! `fleet:`: several zerocache nodes acting as one cache. Every member computes the owner of a
//! key by rendezvous hashing over the same membership, and a node that is not the owner of a miss
//! asks the owner instead of the origin. This file holds the section's schema, its defaults and
//! its checks; the behaviour lives in the proxy's `fleet/` module.

use crate::schema::{Config, UpstreamServer};
use crate::validate::Invalid;
use bytesize::ByteSize;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The shortest `fleet.secret` accepted: it is the only thing that tells a peer from a client.
pub const MIN_SECRET_LEN: usize = 16;

/// `fleet:` (absent: this node is alone).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// This node's data-port address as the other members name it (`host:port`).
    #[serde(rename = "self")]
    pub self_addr: String,
    /// The members' data-port addresses (`host:port` or `{addr, weight}`); may include `self`.
    #[serde(default)]
    pub peers: Vec<UpstreamServer>,
    /// A DNS name whose address records are the members (a Kubernetes headless Service),
    /// `NAME:PORT`, re-resolved every `dns_interval`. Instead of `peers`.
    #[serde(default)]
    pub peers_dns: Option<String>,
    /// How often `peers_dns` (and names in `peers` and `self`) are resolved again.
    #[serde(default = "default_dns_interval", with = "crate::units::duration")]
    pub dns_interval: Duration,
    /// This node's weight in the hash (its share of keys relative to the others).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Shared by every member; every peer request is signed with it (HMAC-SHA256; it never
    /// travels). Required.
    pub secret: String,
    /// The secret before a rotation, also accepted on peer requests while the members change
    /// over (requests are signed with `secret`). Remove it once every member has the new one.
    #[serde(default)]
    pub previous_secret: Option<String>,
    /// Store what the owner answers on this node too (bounded by `local_hot_max`).
    #[serde(default)]
    pub store_remote: bool,
    /// Bytes of objects owned elsewhere that `store_remote` may store on this node.
    #[serde(default = "default_local_hot_max", with = "crate::units::size")]
    pub local_hot_max: ByteSize,
    /// Where a key goes when its owner is down: `next` (the next member in its hash order) or
    /// `origin` (straight to the origin, not stored).
    #[serde(default)]
    pub on_owner_down: OnOwnerDown,
    /// How often each peer's internal health endpoint is asked.
    #[serde(default = "default_health_interval", with = "crate::units::duration")]
    pub health_interval: Duration,
    /// Time allowed for a health answer, and for connecting to a peer.
    #[serde(default = "default_health_timeout", with = "crate::units::duration")]
    pub health_timeout: Duration,
    /// Time allowed between bytes of a peer's answer.
    #[serde(default = "default_peer_read_timeout", with = "crate::units::duration")]
    pub read_timeout: Duration,
    /// Fleet purges kept in the purge log, from which a member that missed some catches up.
    #[serde(default = "default_purge_log_max")]
    pub purge_log_max: usize,
    /// How long a fleet purge stays in the purge log.
    #[serde(default = "default_purge_log_age", with = "crate::units::duration")]
    pub purge_log_age: Duration,
    /// The hop header this member signs peer requests with: 3 (names the member it is sent
    /// to, so it is good at that member only) or 2 (the header of releases before 2026-12-05,
    /// which any member accepts: only while a fleet upgrades from one of them).
    #[serde(default = "default_hop_version")]
    pub hop_version: u8,
    /// Also accept version-2 hop headers while signing with 3: the middle step of that upgrade,
    /// while some members still sign with 2. Implied by `hop_version: 2`.
    #[serde(default)]
    pub accept_hop_v2: bool,
}

fn default_hop_version() -> u8 {
    3
}

fn default_purge_log_max() -> usize {
    10_000
}

fn default_purge_log_age() -> Duration {
    Duration::from_secs(24 * 3600)
}

/// The largest `fleet.purge_log_max`: the whole log must fit in one catch-up answer.
pub const MAX_PURGE_LOG: usize = 20_000;

/// `fleet.on_owner_down`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnOwnerDown {
    /// The next member in the key's hash order (this node itself, if it comes next).
    #[default]
    Next,
    /// The origin, without storing.
    Origin,
}

fn default_dns_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_weight() -> u32 {
    1
}
fn default_local_hot_max() -> ByteSize {
    ByteSize::mib(256)
}
fn default_health_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_health_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_peer_read_timeout() -> Duration {
    Duration::from_secs(30)
}

/// Whether `a` is `host:port` with a non-empty host and a port other than 0.
fn host_port(a: &str) -> bool {
    a.rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0))
}

/// The checks of `fleet:`.
pub(crate) fn check(config: &Config, errs: &mut Vec<Invalid>) {
    let Some(f) = &config.fleet else { return };
    let mut bad = |path: &str, message: String| {
        errs.push(Invalid {
            path: format!("fleet.{path}"),
            message,
        })
    };
    if !host_port(&f.self_addr) {
        bad("self", format!("`{}` is not host:port", f.self_addr));
    }
    if f.secret.trim().len() < MIN_SECRET_LEN {
        bad(
            "secret",
            format!(
                "must be at least {MIN_SECRET_LEN} characters: it is all that tells a peer from a client"
            ),
        );
    }
    if f.purge_log_max == 0 || f.purge_log_max > MAX_PURGE_LOG {
        bad(
            "purge_log_max",
            format!("must be 1 to {MAX_PURGE_LOG} (the log is sent whole to a member catching up)"),
        );
    }
    if f.purge_log_age.is_zero() {
        bad(
            "purge_log_age",
            "must be more than 0 (a member down for longer than this drops its whole cache when it returns)".into(),
        );
    }
    if let Some(p) = &f.previous_secret {
        if p.trim().len() < MIN_SECRET_LEN {
            bad(
                "previous_secret",
                format!("must be at least {MIN_SECRET_LEN} characters, as `secret`"),
            );
        } else if *p == f.secret {
            bad(
                "previous_secret",
                "is the same as `secret`: a rotation names the old one here".into(),
            );
        }
    }
    match (&f.peers_dns, f.peers.is_empty()) {
        (Some(_), false) => bad(
            "peers_dns",
            "give either `peers` or `peers_dns`, not both".into(),
        ),
        (None, true) => bad(
            "peers",
            "list the members (`peers`) or name them by DNS (`peers_dns`)".into(),
        ),
        (Some(d), true) if !host_port(d) => bad("peers_dns", format!("`{d}` is not NAME:PORT")),
        _ => {}
    }
    for (i, p) in f.peers.iter().enumerate() {
        let (at, addr, weight) = match p {
            UpstreamServer::Addr(a) => (format!("peers[{i}]"), a, 1),
            UpstreamServer::Detailed(d) => (format!("peers[{i}].addr"), &d.addr, d.weight),
        };
        if !host_port(addr) {
            bad(&at, format!("`{addr}` is not host:port"));
        }
        if weight == 0 {
            bad(&format!("peers[{i}].weight"), "must be at least 1".into());
        }
    }
    if f.weight == 0 {
        bad("weight", "must be at least 1".into());
    }
    if !(2..=3).contains(&f.hop_version) {
        bad(
            "hop_version",
            format!(
                "must be 3 (or 2 while upgrading a fleet), not {}",
                f.hop_version
            ),
        );
    }
    for (k, d) in [
        ("dns_interval", f.dns_interval),
        ("health_interval", f.health_interval),
        ("health_timeout", f.health_timeout),
        ("read_timeout", f.read_timeout),
    ] {
        if d.is_zero() {
            bad(k, "must be more than 0".into());
        }
    }
}

/// A hash of everything that decides a request's cache key and route, which every member must
/// share: two members that disagree would disagree on owners and on what a key means. Peers
/// exchange it in health checks and forward only to members with the same one.
pub fn routing_hash(config: &Config) -> u64 {
    // serde_yaml's output of the same values is the same text; the map of upstreams is ordered.
    let routes = serde_yaml::to_string(&config.routes).unwrap_or_default();
    let bits = config.debug.key_hash_bits.unwrap_or(128);
    let mut text = routes;
    text.push_str(&format!("\nkey_hash_bits={bits}\n"));
    for (name, up) in &config.upstreams {
        // The Host sent upstream changes what an object is; its servers and timeouts do not.
        text.push_str(&format!("{name}.host={:?}\n", up.host));
    }
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}
