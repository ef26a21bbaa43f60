//! A fleet of three real zerocache processes on 127.0.0.2, .3 and .4 in front of one real
//! origin that logs its requests: every object reaches the origin once however the clients
//! spread over the nodes, bodies stay byte-exact, an owner's death moves only its keys and its
//! return brings them back, a fleet purge reaches every node (and one that missed it catches
//! up), and the hop header cannot be forged.

use crate::support::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use zerocache_origin::body;
use zerocache_origin::client::SimpleClient;

const OBJECTS: usize = 1000;

fn path(i: usize) -> String {
    // One Host, distinct sizes: 1000 distinct objects of 1000..2000 bytes.
    format!("/obj/{}", 1000 + i)
}

/// Requests `paths` on node `node` over one keep-alive connection; every answer must be a
/// byte-exact 200. Answers the `Cache-Status` of each.
fn fetch_all(f: &TestFleet, node: usize, items: &[usize]) -> Vec<String> {
    let mut c = f.client(node);
    items
        .iter()
        .map(|&i| {
            let r = c.get(&path(i), &[]);
            assert_eq!(r.status, 200, "{} on node {node}: {:?}", path(i), r.headers);
            assert!(
                r.body == body(1000 + i),
                "{} on node {node}: body differs",
                path(i)
            );
            r.header("cache-status").unwrap_or("").to_string()
        })
        .collect()
}

/// The node that owns object `i`: the one whose own answer was not relayed from a peer.
fn owners(f: &TestFleet, items: &[usize]) -> BTreeMap<usize, usize> {
    let mut owner = BTreeMap::new();
    for node in 0..f.nodes.len() {
        for (k, cs) in items.iter().zip(fetch_all(f, node, items)) {
            if !cs.contains("detail=peer") {
                assert!(owner.insert(*k, node).is_none(), "two owners of {k}");
            }
        }
    }
    assert_eq!(owner.len(), items.len(), "every object has an owner");
    owner
}

#[test]
fn a_thousand_objects_over_three_nodes_reach_the_origin_once_each() {
    let probe = require::is_root();
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 3, "", probe);
    let all: Vec<usize> = (0..OBJECTS).collect();
    // First round: each object asked on one node, spread round robin, from three clients at
    // once. Second round: each asked on the next node.
    std::thread::scope(|s| {
        for node in 0..3 {
            let f = &f;
            let mine: Vec<usize> = all.iter().copied().filter(|i| i % 3 == node).collect();
            s.spawn(move || fetch_all(f, node, &mine));
        }
    });
    std::thread::scope(|s| {
        for node in 0..3 {
            let f = &f;
            let mine: Vec<usize> = all
                .iter()
                .copied()
                .filter(|i| (i + 1) % 3 == node)
                .collect();
            s.spawn(move || {
                for cs in fetch_all(f, node, &mine) {
                    assert!(
                        cs.starts_with("zerocache; hit"),
                        "second round not a hit: {cs}"
                    );
                }
            });
        }
    });
    for i in &all {
        assert_eq!(origin.hits(&path(*i)), 1, "{} reached the origin", path(*i));
    }
    assert_eq!(origin.request_count(), OBJECTS as u64);
    // Owners fetched for their peers: the hop header (with the secret) never reached the origin.
    for got in origin.received() {
        assert!(got.header("zerocache-fleet").is_none(), "{}", got.path);
    }
    // Stored once in the fleet: on its owner only.
    let stored: Vec<u64> = (0..3).map(|n| f.objects(n)).collect();
    assert_eq!(stored.iter().sum::<u64>(), OBJECTS as u64, "{stored:?}");
    for (n, s) in stored.iter().enumerate() {
        // Rendezvous hashing: about a third each.
        assert!((250..=420).contains(s), "node {n} stores {s} of {OBJECTS}");
    }
    let owner = owners(&f, &all);
    for (n, &stored) in stored.iter().enumerate() {
        let owned = owner.values().filter(|o| **o == n).count() as u64;
        assert_eq!(owned, stored, "node {n} stores exactly what it owns");
        let v = f.api_fleet(n);
        assert_eq!(v["peers"].as_array().map(Vec::len), Some(2), "{v}");
        assert_eq!(v["owned_keys"], stored, "{v}");
    }
    assert_eq!(
        origin.request_count(),
        OBJECTS as u64,
        "finding owners fetched nothing"
    );
    // Every body a member relayed from an owner went through user space there, and is counted
    // as such (reason `peer`) byte for byte: both rounds, where the node asked was not the
    // owner, and the two non-owners of every object while finding the owners.
    let relayed: u64 = all
        .iter()
        .map(|&i| {
            let asked = [i % 3, (i + 1) % 3];
            let times = asked.iter().filter(|&&n| n != owner[&i]).count() as u64 + 2;
            times * (1000 + i) as u64
        })
        .sum();
    assert_eventually_eq(
        "bytes relayed from owners",
        Duration::from_secs(5),
        || {
            (0..3)
                .map(|n| {
                    metric(
                        &f.metrics(n),
                        r#"zerocache_copied_body_bytes_total{reason="peer"}"#,
                    )
                })
                .sum::<u64>()
        },
        relayed,
    );
    if probe {
        // Every hit an owner serves goes out through sendfile, by the kernel's count: one
        // connection per node asks for all it owns; its record says every body byte was sent
        // by sendfile and only the heads were copied.
        for n in 0..3 {
            let mine: Vec<usize> = all.iter().copied().filter(|i| owner[i] == n).collect();
            let mut c = f.client(n);
            let (mut bodies, mut heads) = (0u64, 0u64);
            for &i in &mine {
                let r = c.get(&path(i), &[]);
                assert_eq!(r.x_cache(), "HIT");
                assert!(r.body == body(1000 + i));
                bodies += r.body.len() as u64;
                heads += r.head_len as u64;
            }
            let local = c.sock.local_addr().expect("local").to_string();
            drop(c);
            let conn = closed_conn(&f, n, &local);
            assert_eq!(conn["kernel"]["zerocopy_bytes"], bodies, "node {n}: {conn}");
            assert_eq!(conn["kernel"]["copy_bytes"], heads, "node {n}: {conn}");
            assert_eq!(conn["violations"], 0, "node {n}: {conn}");
        }
    }
}

/// The closed connection from `local` on node `n`, once the kernel's record is joined to it.
fn closed_conn(f: &TestFleet, n: usize, local: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let conns = f.api(n, "/api/connections?limit=1000");
        if let Some(c) = conns["closed"].as_array().and_then(|a| {
            a.iter()
                .find(|c| !c["kernel"].is_null() && c["peer"] == local)
        }) {
            return c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no joined closed connection on node {n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// POSTs a fleet purge of object `i` to node `node`'s dashboard; answers its JSON.
fn fleet_purge(f: &TestFleet, node: usize, i: usize) -> serde_json::Value {
    fleet_purge_url(f, node, &format!("http://test.example{}", path(i)))
}

/// POSTs a fleet purge of `url` to node `node`'s dashboard; answers its JSON.
fn fleet_purge_url(f: &TestFleet, node: usize, url: &str) -> serde_json::Value {
    let mut c = Client::connect_dashboard(f.nodes[node].dashboard);
    let r = c.send_with_body(
        "POST",
        "/api/purge",
        &[
            ("Content-Type", "application/json"),
            ("Connection", "close"),
        ],
        format!(r#"{{"url": "{url}", "fleet": true}}"#).as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    serde_json::from_slice(&r.body).expect("json")
}

#[test]
fn a_fleet_purge_reaches_every_node_and_one_that_missed_it_catches_up() {
    let (origin, _rt) = origin();
    let mut f = TestFleet::start(origin.addr(), 3, "", false);
    let items: Vec<usize> = (0..60).collect();
    fetch_all(&f, 0, &items);
    let owner = owners(&f, &items);
    let on = |n: usize| {
        items
            .iter()
            .copied()
            .find(|i| owner[i] == n)
            .expect("owned")
    };
    // A purge on node 0 of an object node 1 owns: gone everywhere, fetched once more.
    let x = on(1);
    let answer = fleet_purge(&f, 0, x);
    assert_eq!(answer["purged"], 0, "node 0 did not store it: {answer}");
    assert_eq!(
        answer["peers"][f.nodes[1].addr.to_string()]["purged"],
        1,
        "{answer}"
    );
    assert_eq!(
        answer["peers"][f.nodes[2].addr.to_string()]["purged"],
        0,
        "{answer}"
    );
    for n in 0..3 {
        fetch_all(&f, n, &[x]);
    }
    assert_eq!(
        origin.hits(&path(x)),
        2,
        "purged object fetched again, once"
    );
    for n in 0..3 {
        assert_eq!(f.api_fleet(n)["purge_epoch"], 1, "node {n}");
    }
    // Node 2 is down during a purge of one of its objects: the answer says so, and when it
    // returns (its cache intact) it replays the purge from a peer's purge log: it does not
    // serve its pre-purge copy of that object, and keeps the rest of its share (issue #31: the
    // whole share was refetched).
    let y = on(2);
    let share: Vec<usize> = items
        .iter()
        .copied()
        .filter(|i| owner[i] == 2 && *i != y && *i != x)
        .collect();
    assert!(!share.is_empty());
    f.kill(2);
    let answer = fleet_purge(&f, 0, y);
    assert!(
        answer["peers"][f.nodes[2].addr.to_string()]["error"].is_string(),
        "{answer}"
    );
    f.start_node(2);
    // Its very first answer, the moment it listens: it caught up before serving (it served the
    // purged copy until its first health check, a HIT 0.1 s after its return).
    let cs = fetch_all(&f, 2, &[y]);
    assert!(
        cs[0].contains("fwd=miss"),
        "node 2 served its pre-purge copy: {cs:?}"
    );
    assert_eq!(f.api_fleet(2)["purge_epoch"], 2);
    f.wait_peers_up(0, 2);
    assert_eq!(origin.hits(&path(y)), 2);
    fetch_all(&f, 2, &share);
    for i in &share {
        assert_eq!(
            origin.hits(&path(*i)),
            1,
            "object {i} of node 2's share refetched"
        );
    }
    let m = f.metrics(2);
    assert_eq!(
        metric(&m, "zerocache_fleet_catch_ups_total{result=\"replayed\"}"),
        1
    );
    assert_eq!(
        metric(&m, "zerocache_fleet_catch_ups_total{result=\"wiped\"}"),
        0
    );
    assert_eq!(metric(&m, "zerocache_fleet_purge_log_entries"), 2);
}

/// The purge log's bound reached: a member that missed more purges than the log keeps cannot
/// replay them, and falls back to treating everything it stored before as purged, counted.
#[test]
fn a_member_behind_the_purge_log_drops_what_it_stored_and_says_so() {
    let (origin, _rt) = origin();
    let mut f = TestFleet::start(origin.addr(), 3, "  purge_log_max: 1\n", false);
    let items: Vec<usize> = (0..60).collect();
    fetch_all(&f, 0, &items);
    let owner = owners(&f, &items);
    let share: Vec<usize> = items.iter().copied().filter(|i| owner[i] == 2).collect();
    f.kill(2);
    // Two purges while it is down; the log keeps one.
    for i in [1000, 1001] {
        fleet_purge(&f, 0, i);
    }
    f.start_node(2);
    f.wait_peers_up(0, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.api_fleet(2)["purge_epoch"] != 2 {
        assert!(Instant::now() < deadline, "node 2 never learnt the epoch");
        std::thread::sleep(Duration::from_millis(50));
    }
    let m = f.metrics(2);
    assert_eq!(
        metric(&m, "zerocache_fleet_catch_ups_total{result=\"wiped\"}"),
        1
    );
    assert_eq!(
        metric(&m, "zerocache_fleet_catch_ups_total{result=\"replayed\"}"),
        0
    );
    // Its whole share is fetched again.
    fetch_all(&f, 2, &share);
    for i in &share {
        assert_eq!(origin.hits(&path(*i)), 2, "object {i}");
    }
}

/// A member's epoch and purge log survive its restarts. The rebuild took `fleet-epoch` and
/// `fleet-purge-log` in the cache directory for foreign files and deleted them, so a member came
/// back at epoch 0: with `purge_log_max: 3` after 5 purges, a `kill -9` and restart wiped its
/// whole share (`catch_ups{wiped}` 1, every object fetched again), and so did an upgrade. Now a
/// restart, a `kill -9` and an upgrade of a member that missed nothing refetch nothing, and one
/// that missed k purges replays exactly those k.
#[test]
fn a_member_restarted_killed_or_upgraded_keeps_its_epoch_and_its_share() {
    let (origin, _rt) = origin();
    let mut f = TestFleet::start(origin.addr(), 3, "  purge_log_max: 3\n", false);
    let items: Vec<usize> = (0..60).collect();
    fetch_all(&f, 0, &items);
    let owner = owners(&f, &items);
    let share: Vec<usize> = items.iter().copied().filter(|i| owner[i] == 2).collect();
    assert!(share.len() >= 2, "{share:?}");
    // Five purges of objects nobody stored: every member at epoch 5, the logs keep 3.
    for i in 1000..1005 {
        fleet_purge(&f, 0, i);
    }
    let catch_ups = |f: &TestFleet| {
        let m = f.metrics(2);
        (
            metric(&m, "zerocache_fleet_catch_ups_total{result=\"replayed\"}"),
            metric(&m, "zerocache_fleet_catch_ups_total{result=\"wiped\"}"),
        )
    };
    let wait_epoch = |f: &TestFleet, want: u64, how: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while f.api_fleet(2)["purge_epoch"] != want {
            assert!(
                Instant::now() < deadline,
                "{how}: node 2 never reached epoch {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_epoch(&f, 5, "before");
    for how in ["restart", "kill -9", "upgrade"] {
        match how {
            "restart" => {
                f.stop(2);
                f.start_node(2);
            }
            "kill -9" => {
                f.kill(2);
                f.start_node(2);
            }
            _ => f.upgrade(2),
        }
        f.wait_peers_up(2, 2);
        f.wait_peers_up(0, 2);
        assert_eq!(f.api_fleet(2)["purge_epoch"], 5, "{how}");
        fetch_all(&f, 2, &share);
        for i in &share {
            assert_eq!(origin.hits(&path(*i)), 1, "{how}: object {i} fetched again");
        }
        assert_eq!(catch_ups(&f), (0, 0), "{how}");
    }
    // Down for two purges of its own objects (the log of 3 reaches back): it replays those two,
    // and fetches those two again and nothing else of its share.
    let (a, b) = (share[0], share[1]);
    f.kill(2);
    fleet_purge(&f, 0, a);
    fleet_purge(&f, 0, b);
    f.start_node(2);
    f.wait_peers_up(0, 2);
    wait_epoch(&f, 7, "missed two");
    let statuses = fetch_all(&f, 2, &share);
    let refetched: Vec<usize> = share
        .iter()
        .copied()
        .filter(|i| origin.hits(&path(*i)) != 1)
        .collect();
    assert_eq!(
        (refetched, catch_ups(&f)),
        (vec![a, b], (1, 0)),
        "{statuses:?}"
    );
    for i in [a, b] {
        assert_eq!(origin.hits(&path(i)), 2, "object {i}");
    }
}

#[test]
fn a_client_cannot_forge_the_hop_header() {
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 2, "", false);
    let host = f.client(0).host.clone();
    let me = f.id(0);
    let now = unix_now();
    let sign = |secret: &str, target: &str, ts: u64, nonce: u128| {
        signed_hop(secret, &me, "health", "GET", target, &host, b"", ts, nonce)
    };
    // (header, the refusal it must be counted as)
    let forged = [
        // The old protocol, secret in clear: no longer a peer's.
        (
            format!("v1 from=127.0.0.9:1 cfg=0 op=health key={FLEET_SECRET}"),
            "malformed",
        ),
        ("v2 op=purge".to_string(), "malformed"),
        // Signed with another secret.
        (
            sign("wrong-secret-0123456789", "/obj/5002", now, 11),
            "forged",
        ),
        // A valid signature for another path (a captured header moved to this request).
        (sign(FLEET_SECRET, "/obj/other", now, 12), "forged"),
        // Valid but from 2 minutes ago: a replay of an old request.
        (sign(FLEET_SECRET, "/obj/5004", now - 120, 13), "stale"),
    ];
    for (k, (h, _)) in forged.iter().enumerate() {
        let p = format!("/obj/{}", 5000 + k);
        let mut c = f.client(0);
        let r = c.get(&p, &[("Zerocache-Fleet", h)]);
        // Served as a client's request: the object, not the internal endpoint's JSON.
        assert_eq!(r.status, 200);
        assert!(r.body == body(5000 + k), "{h}");
    }
    // A valid one is answered by the internal endpoint once; the same header again, within
    // the window, is a replay: served as a client's request (the origin's 404 for this path).
    let valid = sign(FLEET_SECRET, "/_zerocache/fleet/health", now, 14);
    for (attempt, want) in [(0, 200), (1, 404)] {
        let mut c = f.client(0);
        let r = c.get(
            "/_zerocache/fleet/health",
            &[("Zerocache-Fleet", valid.as_str())],
        );
        assert_eq!(r.status, want, "attempt {attempt}");
    }
    let m = f.metrics(0);
    for (reason, n) in [
        ("malformed", 2),
        ("forged", 2),
        ("stale", 1),
        ("replayed", 1),
    ] {
        assert_eq!(
            metric(
                &m,
                &format!("zerocache_fleet_hop_refused_total{{reason=\"{reason}\"}}")
            ),
            n,
            "{reason}"
        );
    }
    // The header never reached the origin.
    for got in origin.received() {
        assert!(got.header("zerocache-fleet").is_none(), "{:?}", got.path);
    }
    // Whatever the path, a forwarded request is not the internal endpoint: only an operation
    // in a header proving the secret is.
    let mut c = f.client(0);
    let r = c.get("/_zerocache/fleet/health", &[]);
    assert_eq!(r.status, 404, "an origin path like any other");
    assert_eq!(origin.hits("/_zerocache/fleet/health"), 2);
}

#[test]
fn an_owner_killed_mid_run_moves_only_its_keys_and_takes_them_back() {
    let (origin, _rt) = origin();
    let mut f = TestFleet::start(origin.addr(), 3, "", false);
    let items: Vec<usize> = (0..150).collect();
    fetch_all(&f, 0, &items);
    let owner = owners(&f, &items);
    let victims: Vec<usize> = items.iter().copied().filter(|i| owner[i] == 2).collect();
    assert!(!victims.is_empty());
    // Clients keep asking nodes 0 and 1 for everything while node 2 dies.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let errors = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for node in 0..2 {
            let (f, items, stop, errors) = (&f, &items, &stop, &errors);
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut c) = SimpleClient::connect(f.nodes[node].addr) else {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    };
                    for &i in items {
                        match c.get("test.example", &path(i), false) {
                            Ok(r) if r.status == 200 && r.body == body(1000 + i) => {}
                            _ => {
                                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        f_kill(&f, 2);
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // Objects of a few KB: a client can lose at most the one response in flight from the
    // victim, per client.
    let errors = errors.into_inner();
    assert!(errors <= 2, "{errors} client errors");
    for i in &items {
        let want = if owner[i] == 2 { 2 } else { 1 };
        assert_eq!(
            origin.hits(&path(*i)),
            want,
            "{} (owner {})",
            path(*i),
            owner[i]
        );
    }
    // Back on the same address and cache: its keys go to it again, served from its disk. The
    // node that stood in for it keeps serving the copies it stored meanwhile as hits; the other
    // asks the owner again.
    f.start_node(2);
    f.wait_peers_up(0, 2);
    f.wait_peers_up(1, 2);
    let before = origin.request_count();
    let (on0, on1) = (fetch_all(&f, 0, &victims), fetch_all(&f, 1, &victims));
    for (k, (a, b)) in victims.iter().zip(on0.iter().zip(&on1)) {
        assert!(
            a.contains("detail=peer") || b.contains("detail=peer"),
            "{k}: neither node asked its returned owner: {a} / {b}"
        );
    }
    assert_eq!(
        origin.request_count(),
        before,
        "returned keys were served by their owner"
    );
    // New keys of the returned node are stored there, and only there.
    let stored_before: Vec<u64> = (0..3).map(|n| f.objects(n)).collect();
    let fresh: Vec<usize> = (150..450).collect();
    fetch_all(&f, 0, &fresh);
    let fresh_owner = owners(&f, &fresh);
    for (n, before) in stored_before.iter().enumerate() {
        let owned = fresh_owner.values().filter(|o| **o == n).count() as u64;
        assert_eq!(f.objects(n) - before, owned, "node {n}");
    }
    let back = f.api_fleet(0);
    let p2 = f.nodes[2].addr.to_string();
    let peer = back["peers"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == p2.as_str()))
        .expect("node 2 listed");
    assert_eq!(peer["up"], true, "{peer}");
    assert!(peer["forwarded"][0].as_u64().unwrap_or(0) >= 1, "{peer}");
}

/// Kills node `i` of a fleet shared with client threads (the kill needs no `&mut`).
fn f_kill(f: &TestFleet, i: usize) {
    let pid = f.nodes[i].child.as_ref().expect("running").id();
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(f.nodes[i].addr).is_ok() {
        assert!(Instant::now() < deadline, "node {i} still listening");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn metrics_count_forwards_and_peer_requests_and_a_member_whose_keys_differ_gets_none() {
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 2, "", false);
    let p1 = f.nodes[1].addr.to_string();
    let m = f.metrics(0);
    // Complete from start-up.
    assert_eq!(
        metric(&m, &format!("zerocache_fleet_peer_up{{peer=\"{p1}\"}}")),
        1
    );
    for result in ["ok", "error", "refused"] {
        let s = format!("zerocache_fleet_forwarded_total{{peer=\"{p1}\",result=\"{result}\"}}");
        assert_eq!(metric(&m, &s), 0, "{s}");
    }
    assert_eq!(metric(&m, "zerocache_fleet_owned_keys"), 0);
    assert_eq!(
        metric(
            &f.metrics(1),
            "zerocache_fleet_peer_requests_total{cache_status=\"HIT\"}"
        ),
        0
    );
    let items: Vec<usize> = (0..40).collect();
    fetch_all(&f, 0, &items);
    fetch_all(&f, 0, &items);
    let owner = owners(&f, &items);
    let of1 = owner.values().filter(|o| **o == 1).count() as u64;
    assert!(of1 > 0);
    let m0 = f.metrics(0);
    // Two rounds on node 0, then one more when finding the owners: three forwards per key.
    let ok = format!("zerocache_fleet_forwarded_total{{peer=\"{p1}\",result=\"ok\"}}");
    assert_eq!(metric(&m0, &ok), 3 * of1);
    assert_eq!(metric(&m0, "zerocache_fleet_owned_keys"), 40 - of1);
    let m1 = f.metrics(1);
    let peer = |cs: &str| format!("zerocache_fleet_peer_requests_total{{cache_status=\"{cs}\"}}");
    assert_eq!(metric(&m1, &peer("MISS")), of1);
    assert_eq!(metric(&m1, &peer("HIT")), 2 * of1);
    let v1 = f.api_fleet(1);
    assert_eq!(v1["peers"][0]["answered"], 3 * of1, "{v1}");
    // Relayed bytes: node 0 relayed node 1's objects three times.
    let relayed: u64 = items
        .iter()
        .filter(|i| owner[i] == 1)
        .map(|i| 3 * (1000 + *i as u64))
        .sum();
    assert_eq!(
        metric(&m0, "zerocache_fleet_relayed_body_bytes_total"),
        relayed
    );

    // Node 1 reloads routes that key differently: node 0 stops forwarding to it.
    let cfg = std::fs::read_to_string(&f.nodes[1].config).expect("config");
    let cfg = cfg.replace(
        "upstream: origin\n",
        "upstream: origin\n    default_ttl: 60\n",
    );
    std::fs::write(&f.nodes[1].config, cfg).expect("write");
    let pid = f.nodes[1].child.as_ref().expect("running").id();
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = f.api_fleet(0);
        if v["peers"][0]["routing_matches"] == false {
            assert_ne!(v["peers"][0]["routing_hash"], v["routing_hash"], "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "mismatch never seen: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        metric(
            &f.metrics(0),
            &format!("zerocache_fleet_peer_up{{peer=\"{p1}\"}}")
        ),
        0
    );
    let fresh: Vec<usize> = (100..140).collect();
    for cs in fetch_all(&f, 0, &fresh) {
        assert!(
            !cs.contains("detail=peer"),
            "forwarded to a member keyed differently: {cs}"
        );
    }
    let refused = format!("zerocache_fleet_forwarded_total{{peer=\"{p1}\",result=\"refused\"}}");
    assert!(metric(&f.metrics(0), &refused) > 0);
    assert_eq!(metric(&f.metrics(0), &ok), 3 * of1, "no forward since");
}

#[test]
fn on_owner_down_origin_goes_straight_to_the_origin_without_storing() {
    let (origin, _rt) = origin();
    let mut f = TestFleet::start(origin.addr(), 2, "  on_owner_down: origin\n", false);
    let items: Vec<usize> = (0..30).collect();
    fetch_all(&f, 0, &items);
    let owner = owners(&f, &items);
    let theirs: Vec<usize> = items.iter().copied().filter(|i| owner[i] == 1).collect();
    assert!(!theirs.is_empty());
    let stored = f.objects(0);
    f.kill(1);
    for _ in 0..2 {
        for cs in fetch_all(&f, 0, &theirs) {
            assert!(cs.contains("detail=fleet-owner-down"), "{cs}");
        }
    }
    assert_eq!(
        f.objects(0),
        stored,
        "nothing of the dead owner's stored here"
    );
    for i in &theirs {
        assert_eq!(
            origin.hits(&path(*i)),
            3,
            "{}: its fill, then two fetches",
            path(*i)
        );
    }
}

#[test]
fn store_remote_keeps_owners_objects_here_too_within_local_hot_max() {
    let (origin, _rt) = origin();
    // Room for exactly three objects of 1000..1030 bytes.
    let f = TestFleet::start(
        origin.addr(),
        2,
        "  store_remote: true\n  local_hot_max: 3100\n",
        false,
    );
    let items: Vec<usize> = (0..30).collect();
    let first = fetch_all(&f, 0, &items);
    let relayed: Vec<usize> = items
        .iter()
        .zip(&first)
        .filter(|(_, cs)| cs.contains("detail=peer"))
        .map(|(i, _)| *i)
        .collect();
    assert!(relayed.len() > 3, "{first:?}");
    let kept: Vec<usize> = items
        .iter()
        .zip(&first)
        .filter(|(_, cs)| cs.contains("stored; detail=peer"))
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(kept, relayed[..3], "the first three relayed fit: {first:?}");
    let second = fetch_all(&f, 0, &items);
    for (i, cs) in items.iter().zip(&second) {
        if kept.contains(i) {
            assert!(cs.starts_with("zerocache; hit"), "{i}: {cs}");
        } else if relayed.contains(i) {
            assert!(cs.contains("detail=peer"), "{i}: {cs}");
        }
    }
    let own = (items.len() - relayed.len()) as u64;
    assert_eq!(f.objects(0), own + 3, "no more than local_hot_max");
    assert_eq!(f.objects(1), relayed.len() as u64);
    assert_eq!(origin.request_count(), items.len() as u64);
}

#[test]
fn a_head_miss_asks_the_owner_which_answers_from_its_cache() {
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 2, "", false);
    let items: Vec<usize> = (0..20).collect();
    fetch_all(&f, 1, &items);
    let owner = owners(&f, &items);
    let before = origin.request_count();
    for &i in &items {
        let r = f.client(0).request("HEAD", &path(i), &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.x_cache(), "HIT", "{:?}", r.headers);
        assert_eq!(
            r.header("content-length"),
            Some((1000 + i).to_string().as_str())
        );
        let relayed = r
            .header("cache-status")
            .is_some_and(|c| c.contains("detail=peer"));
        assert_eq!(relayed, owner[&i] == 1, "{i}: {:?}", r.headers);
    }
    assert_eq!(origin.request_count(), before, "no HEAD reached the origin");
}

#[test]
fn a_range_miss_asks_the_owner_which_serves_it_from_its_cache() {
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 2, "", false);
    let items: Vec<usize> = (0..20).collect();
    fetch_all(&f, 1, &items);
    let owner = owners(&f, &items);
    let theirs: Vec<usize> = items.iter().copied().filter(|i| owner[i] == 1).collect();
    assert!(!theirs.is_empty());
    let before = origin.request_count();
    for &i in &theirs {
        let r = f.client(0).get(&path(i), &[("Range", "bytes=100-199")]);
        assert_eq!(r.status, 206, "{:?}", r.headers);
        assert!(r.body == body(1000 + i)[100..200], "{i}: wrong bytes");
        assert_eq!(r.x_cache(), "HIT", "{:?}", r.headers);
        assert!(
            r.header("cache-status")
                .is_some_and(|c| c.contains("detail=peer"))
        );
    }
    assert_eq!(
        origin.request_count(),
        before,
        "no range reached the origin"
    );
    assert_eq!(
        f.objects(0),
        (items.len() - theirs.len()) as u64,
        "nothing stored here"
    );
}

#[test]
fn an_upstream_host_override_does_not_change_which_node_owns_a_key() {
    let (origin, _rt) = origin();
    // The origin is asked with its own name; keys and owners keep the client's host.
    let f = TestFleet::start_with(
        origin.addr(),
        3,
        "",
        false,
        "    host: bucket.origin.example\n",
    );
    let items: Vec<usize> = (0..60).collect();
    for n in 0..3 {
        fetch_all(&f, n, &items);
    }
    for i in &items {
        assert_eq!(origin.hits(&path(*i)), 1, "{}", path(*i));
    }
    for got in origin.received() {
        assert_eq!(got.header("host"), Some("bucket.origin.example"));
    }
    let stored: u64 = (0..3).map(|n| f.objects(n)).sum();
    assert_eq!(stored, items.len() as u64, "each stored once, by its owner");
}

/// A member's access log says what the owner's cache did for a response it relayed (the owner's
/// `X-Cache`), not its own `MISS`: hit ratios read from logs are right. The bytes went through
/// user space here, so the path stays `copy`; the metrics still count the hit once, on the owner.
#[test]
fn a_relayed_hit_is_logged_as_the_owners_hit() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let f = TestFleet::start_with(
        origin.addr(),
        2,
        "",
        false,
        &format!("logging:\n  access_log: {}\n", log.display()),
    );
    let items: Vec<usize> = (0..20).collect();
    let owner = owners(&f, &items);
    let i = *items
        .iter()
        .find(|i| owner[i] == 0)
        .expect("node 0 owns one of 20");
    let mut c = f.client(1);
    let r = c.get(&path(i), &[]);
    assert_eq!((r.status, r.x_cache()), (200, "HIT"));
    let local = c.sock.local_addr().expect("local").to_string();
    let want = format!(
        " {local} \"GET {} HTTP/1.1\" 200 {} HIT copy ",
        path(i),
        1000 + i
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().any(|l| l.contains(&want)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no line with `{want}` in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fleet purge whose epoch is beyond what any member could have issued (issue #31: it was
/// accepted, and the next purge wrapped to 0) is refused with 400 and moves nothing; a real
/// fleet purge after it still counts from where the fleet was.
#[test]
fn an_implausible_purge_epoch_is_refused() {
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 2, "", false);
    let body = br#"{"url":"http://a/obj/1","epoch":18446744073709551615}"#;
    let mut c = f.client(0);
    let hop = signed_hop(
        FLEET_SECRET,
        &f.id(0),
        "purge",
        "POST",
        "/_zerocache/fleet/purge",
        &c.host,
        body,
        unix_now(),
        1,
    );
    let r = c.send_with_body(
        "POST",
        "/_zerocache/fleet/purge",
        &[("Zerocache-Fleet", hop.as_str())],
        body,
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        String::from_utf8_lossy(&r.body).contains("beyond what a peer could have issued"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let mut h = f.client(0);
    let hop = signed_hop(
        FLEET_SECRET,
        &f.id(0),
        "health",
        "GET",
        "/_zerocache/fleet/health",
        &h.host,
        b"",
        unix_now(),
        2,
    );
    let health = h.get(
        "/_zerocache/fleet/health",
        &[("Zerocache-Fleet", hop.as_str())],
    );
    let json: serde_json::Value = serde_json::from_slice(&health.body).expect("json");
    assert_eq!(json["purge_epoch"], 0, "{json}");
}

/// The refusals of node `i`'s hop headers, by reason, as `/metrics` prints them.
fn refusals(f: &TestFleet, i: usize) -> BTreeMap<String, u64> {
    let m = f.metrics(i);
    [
        "malformed",
        "forged",
        "stale",
        "replayed",
        "overloaded",
        "misdirected",
        "unaddressed",
    ]
    .iter()
    .map(|r| {
        let n = metric(
            &m,
            &format!("zerocache_fleet_hop_refused_total{{reason=\"{r}\"}}"),
        );
        (r.to_string(), n)
    })
    .filter(|(_, n)| *n > 0)
    .collect()
}

/// Issue #43, item 10: a fleet signature did not name the receiving member, so a signed purge
/// sent to one member was accepted by another within 30 s. The version-3 header names it: the
/// purge signed for node 0 purges there, and the same bytes sent to node 1 are refused
/// (`misdirected`) and served as a client's request; a version-2 header, which names no member,
/// is refused (`unaddressed`) by a member that has finished upgrading.
#[test]
fn a_purge_signed_for_one_member_is_refused_by_another() {
    let (origin, _rt) = origin();
    let f = TestFleet::start(origin.addr(), 2, "", false);
    let body = br#"{"url":"http://a/obj/1","epoch":1,"from":"127.0.0.9:1"}"#;
    let host = f.client(0).host.clone();
    // `to` empty: the header of the releases before, without it.
    let sign = |to: &str, nonce| {
        signed_hop(
            FLEET_SECRET,
            to,
            "purge",
            "POST",
            "/_zerocache/fleet/purge",
            &host,
            body,
            unix_now(),
            nonce,
        )
    };
    let purge = sign(&f.id(0), 21);
    let send = |node: usize, hop: &str| {
        let mut c = f.client(node);
        // Node 1 is sent node 0's `Host` too: the captured request, byte for byte.
        c.host = host.clone();
        c.send_with_body(
            "POST",
            "/_zerocache/fleet/purge",
            &[("Zerocache-Fleet", hop)],
            body,
        )
    };
    // Replayed to node 1 first, inside the window: not its header.
    let r = send(1, &purge);
    assert!(
        !String::from_utf8_lossy(&r.body).contains("purged"),
        "node 1 applied a purge signed for node 0: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(
        origin.hits("/_zerocache/fleet/purge"),
        1,
        "served as a client's"
    );
    assert_eq!(
        refusals(&f, 1),
        BTreeMap::from([("misdirected".to_string(), 1)])
    );
    assert_eq!(f.api_fleet(1)["purge_epoch"], 0, "{}", f.api_fleet(1));
    // At node 0, the member it was signed for, it is a purge.
    let r = send(0, &purge);
    assert_eq!(
        (r.status, String::from_utf8_lossy(&r.body).to_string()),
        (200, r#"{"purged":0}"#.to_string())
    );
    // The header of the releases before, without `to`: refused by default.
    let v2 = sign("", 22);
    let r = send(0, &v2);
    assert!(!String::from_utf8_lossy(&r.body).contains("purged"));
    assert_eq!(
        refusals(&f, 0),
        BTreeMap::from([("unaddressed".to_string(), 1)])
    );
}

/// Upgrading a fleet from a release that signs version-2 hop headers, one member at a time,
/// in the three steps docs/fleet.md gives: every member on `hop_version: 2`; then each on 3 with
/// `accept_hop_v2`; then each on the defaults. After every restart both members see each other
/// up (their health checks, signed each way, are accepted) and no hop header was refused.
#[test]
fn a_fleet_upgrades_its_hop_header_one_member_at_a_time() {
    let (origin, _rt) = origin();
    let mut f = TestFleet::start(origin.addr(), 2, "  hop_version: 2\n", false);
    let restart_with = |f: &mut TestFleet, i: usize, from: &str, to: &str| {
        let yaml = std::fs::read_to_string(&f.nodes[i].config).expect("config");
        assert!(yaml.contains(from), "{yaml}");
        std::fs::write(&f.nodes[i].config, yaml.replace(from, to)).expect("write");
        f.kill(i);
        // The other member has seen it go, so seeing it up again means a new health check.
        f.wait_peers_up(1 - i, 0);
        f.start_node(i);
        f.wait_peers_up(i, 1);
        f.wait_peers_up(1 - i, 1);
    };
    let step2 = "  hop_version: 3\n  accept_hop_v2: true\n";
    for i in [0, 1] {
        restart_with(&mut f, i, "  hop_version: 2\n", step2);
        assert_eq!((refusals(&f, 0), refusals(&f, 1)), Default::default());
    }
    for i in [0, 1] {
        restart_with(&mut f, i, step2, "");
        assert_eq!((refusals(&f, 0), refusals(&f, 1)), Default::default());
    }
    // Forwarding works across the upgraded fleet: each object from the origin once.
    for i in 0..20 {
        for node in [0, 1] {
            let r = f.client(node).get(&path(i), &[]);
            assert_eq!(r.status, 200);
        }
        assert_eq!(origin.hits(&path(i)), 1, "{}", path(i));
    }
    // ...as peers' requests, not refused ones served as clients' (which would fetch once too).
    assert_eq!((refusals(&f, 0), refusals(&f, 1)), Default::default());
}

/// A member down during a fleet purge of a URL spelled with tracking parameters and another
/// order replays it from a peer's purge log through the route's query rules, as a request is
/// keyed (issue #46: the replay skipped them and kept serving its pre-purge copy).
#[test]
fn a_replayed_purge_goes_through_the_query_rules() {
    let (origin, _rt) = origin();
    let mut f = TestFleet::start_routed(
        origin.addr(),
        2,
        "",
        false,
        "",
        "    query: { sort: true, drop: [\"utm_*\"] }\n",
    );
    let target = |i: usize| format!("/obj/{}?b=2&a=1", 1000 + i);
    // An object node 1 owns: its own answer is not relayed from node 0.
    let x = (0..40)
        .find(|&i| {
            let r = f.client(1).get(&target(i), &[]);
            assert!(r.body == body(1000 + i));
            !r.header("cache-status")
                .unwrap_or("")
                .contains("detail=peer")
        })
        .expect("node 1 owns one of 40 objects");
    let normal = format!("/obj/{}?a=1&b=2", 1000 + x);
    assert_eq!(f.client(1).get(&target(x), &[]).x_cache(), "HIT");
    f.kill(1);
    f.wait_peers_up(0, 0);
    fleet_purge_url(
        &f,
        0,
        &format!(
            "http://test.example/obj/{}?utm_source=mail&b=2&a=1",
            1000 + x
        ),
    );
    f.start_node(1);
    // Its first answer: fetched again, not the copy from before the purge.
    let r = f.client(1).get(&format!("/obj/{}?a=1&b=2", 1000 + x), &[]);
    assert_eq!(r.x_cache(), "MISS", "{:?}", r.headers);
    assert_eq!(origin.hits(&normal), 2);
    assert_eq!(
        metric(
            &f.metrics(1),
            "zerocache_fleet_catch_ups_total{result=\"replayed\"}"
        ),
        1
    );
}
