//! `fleet:`: defaults, the per-member environment override, and errors that name the file, line
//! and key.

use zerocache_config::fleet::{OnOwnerDown, routing_hash};
use zerocache_config::parse;

const GOOD: &str = "listen: 127.0.0.1:8080
cache:
  path: /tmp/zc
  max_size: 1GiB
upstreams:
  origin:
    servers: [\"127.0.0.1:8081\"]
routes:
  - match: { host: \"*\", path_prefix: / }
    upstream: origin
";

const FLEET: &str = "fleet:
  self: 10.0.0.2:8080
  peers: [10.0.0.2:8080, 10.0.0.3:8080, {addr: 10.0.0.4:8080, weight: 2}]
  secret: a-long-enough-fleet-secret
";

fn err(text: &str) -> String {
    match parse(text, "zc.yaml") {
        Err(e) => e.to_string(),
        Ok(c) => panic!("accepted: {c:?}"),
    }
}

#[test]
fn a_fleet_parses_with_its_defaults() {
    let c = parse(&format!("{GOOD}{FLEET}"), "zc.yaml").expect("valid");
    let f = c.fleet.as_ref().expect("fleet");
    assert_eq!(f.self_addr, "10.0.0.2:8080");
    assert_eq!(f.peers.len(), 3);
    assert!(!f.store_remote);
    assert_eq!(f.on_owner_down, OnOwnerDown::Next);
    assert_eq!(f.local_hot_max.as_u64(), 256 << 20);
    assert_eq!(f.health_interval, std::time::Duration::from_secs(1));
    // Hop headers name the member they are for, and version 2 is not accepted.
    assert_eq!((f.hop_version, f.accept_hop_v2), (3, false));
    assert!(parse(GOOD, "zc.yaml").expect("valid").fleet.is_none());
    let mut c = c;
    zerocache_config::apply_env(&mut c, |k| {
        (k == "ZEROCACHE_FLEET_SELF").then(|| "10.0.0.9:8080".to_string())
    });
    assert_eq!(c.fleet.expect("fleet").self_addr, "10.0.0.9:8080");
}

#[test]
fn fleet_errors_name_the_line_and_key() {
    assert_eq!(
        err(&format!(
            "{GOOD}{}",
            FLEET.replace("a-long-enough-fleet-secret", "short")
        )),
        "zc.yaml:14:3: fleet.secret: must be at least 16 characters: it is all that tells a peer from a client"
    );
    assert_eq!(
        err(&format!(
            "{GOOD}fleet:\n  self: 10.0.0.2:8080\n  peers: [10.0.0.3:8080]\n"
        )),
        "zc.yaml:12:3: fleet: missing field `secret`"
    );
    let e = err(&format!("{GOOD}{FLEET}  peers_dns: zc.default.svc:8080\n"));
    assert!(
        e.contains("fleet.peers_dns: give either `peers` or `peers_dns`, not both"),
        "{e}"
    );
    let e = err(&format!("{GOOD}{}", FLEET.replace("10.0.0.3:8080", "nope")));
    assert!(e.contains("fleet.peers[1]: `nope` is not host:port"), "{e}");
    assert_eq!(
        err(&format!("{GOOD}{FLEET}  hop_version: 1\n")),
        "zc.yaml:15:3: fleet.hop_version: must be 3 (or 2 while upgrading a fleet), not 1"
    );
    let e = err(&format!("{GOOD}{FLEET}  on_owner_down: elsewhere\n"));
    assert!(
        e.contains("zc.yaml:15:18: fleet.on_owner_down: unknown variant `elsewhere`"),
        "{e}"
    );
}

#[test]
fn the_routing_hash_follows_routes_and_keys_only() {
    let a = parse(&format!("{GOOD}{FLEET}"), "zc.yaml").expect("valid");
    let b = parse(
        &format!("{GOOD}{FLEET}").replace("127.0.0.1:8081", "127.0.0.1:9999"),
        "zc.yaml",
    )
    .expect("valid");
    assert_eq!(
        routing_hash(&a),
        routing_hash(&b),
        "servers do not change keys"
    );
    let c = parse(
        &format!("{GOOD}{FLEET}").replace(
            "    upstream: origin\n",
            "    upstream: origin\n    cache_key: {query: false}\n",
        ),
        "zc.yaml",
    )
    .expect("valid");
    assert_ne!(routing_hash(&a), routing_hash(&c));
}
