//! The kernel witness end to end: the real probe (root only; CI runs as root) watching the real
//! proxy, with exact per-connection figures.

use crate::support::*;
use serde_json::Value;
use std::time::Duration;

fn probe_opts(extra: &str) -> Opts {
    Opts {
        probe: true,
        extra_yaml: extra.into(),
        ..Opts::default()
    }
}

#[test]
fn hits_go_through_sendfile_and_only_heads_are_copied() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), probe_opts(""));
    let stats = proxy.api("/api/stats");
    assert_eq!(stats["probe"]["state"], "attached", "{stats}");
    let sizes = [1024usize, 65_536, 65_537, 1_000_000, 3 * 1024 * 1024];
    // Fill on one connection.
    {
        let mut c = proxy.client();
        for s in sizes {
            assert_eq!(c.get(&format!("/obj/{s}"), &[]).x_cache(), "MISS");
        }
    }
    // Hit on another, twice each, and count exactly what we received.
    let mut c = proxy.client();
    let mut heads = 0u64;
    let mut bodies = 0u64;
    for _ in 0..2 {
        for s in sizes {
            let r = c.get(&format!("/obj/{s}"), &[]);
            assert_eq!((r.x_cache(), r.body.len()), ("HIT", s));
            heads += r.head_len as u64;
            bodies += s as u64;
        }
    }
    let local = c.sock.local_addr().expect("local").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    let k = &conn["kernel"];
    assert_eq!(u(&k["zerocopy_bytes"]), bodies, "{conn}");
    assert_eq!(u(&k["copy_bytes"]), heads, "{conn}");
    assert_eq!(u(&conn["requests"]), 10);
    assert_eq!(u(&conn["head_bytes"]), heads);
    assert_eq!(conn["verdict"], "zero-copy");
    assert_eq!(u(&conn["violations"]), 0);
    // One head send per response (sendto: tokio writes with send(2)), no write/writev.
    let counts = &k["counts"]["by_kind"];
    assert_eq!(u(&counts[4]["calls"]), 10, "sendto calls: {counts}");
    assert_eq!(
        u(&counts[2]["calls"]) + u(&counts[3]["calls"]) + u(&counts[5]["calls"]),
        0,
        "{counts}"
    );
    let stats = proxy.api("/api/stats");
    assert_eq!(u(&stats["violations"]), 0);
}

/// The kernel matrix's yardstick, the same on every kernel it runs on: a 1 MiB MISS and three
/// HITs are 4 MiB the kernel saw leave by sendfile, with the probe whole and no violation.
#[test]
fn a_1mib_miss_and_three_hits_are_4mib_of_kernel_verified_sendfile() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), probe_opts(""));
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/1048576", &[]).x_cache(), "MISS");
    for _ in 0..3 {
        let r = c.get("/obj/1048576", &[]);
        assert_eq!((r.x_cache(), r.body.len()), ("HIT", 1_048_576));
    }
    drop(c);
    assert_eventually_eq(
        "the kernel's zero-copy body bytes",
        Duration::from_secs(10),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_kernel_body_bytes_total{path=\"zerocopy\"}",
            )
        },
        4_194_304,
    );
    let m = proxy.metrics();
    assert_eq!(metric(&m, "zerocache_probe_up"), 1, "{m}");
    assert_eq!(metric(&m, "zerocache_zero_copy_violations_total"), 0, "{m}");
    assert_eq!(
        metric(&m, "zerocache_kernel_body_bytes_total{path=\"copy\"}"),
        0,
        "{m}"
    );
}

#[test]
fn a_stored_miss_is_read_behind_its_fill_and_an_uncacheable_one_is_copied() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), probe_opts(""));
    // Stored: the body goes from the cache file to the socket with sendfile as it is filled.
    let mut c = proxy.client();
    let r = c.get("/obj/200000", &[]);
    assert_eq!((r.x_cache(), r.body.len()), ("MISS", 200_000));
    let head = r.head_len as u64;
    let local = c.sock.local_addr().expect("local").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    assert_eq!(u(&conn["kernel"]["zerocopy_bytes"]), 200_000, "{conn}");
    assert_eq!(u(&conn["kernel"]["copy_bytes"]), head);
    assert_eq!(conn["verdict"], "zero-copy");
    // Not stored (the request forbids it): streamed through the proxy, as declared.
    let mut c = proxy.client();
    let r = c.get("/obj/300000", &[("Cache-Control", "no-store")]);
    assert_eq!((r.x_cache(), r.body.len()), ("MISS", 300_000));
    let head = r.head_len as u64;
    let local = c.sock.local_addr().expect("local").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    assert_eq!(u(&conn["kernel"]["zerocopy_bytes"]), 0);
    assert_eq!(u(&conn["kernel"]["copy_bytes"]), head + 300_000);
    assert_eq!(conn["verdict"], "copied");
    assert_eq!(
        u(&conn["violations"]),
        0,
        "an uncacheable miss is meant to copy"
    );
}

#[test]
fn reused_fd_numbers_keep_separate_records() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), probe_opts(""));
    // The fill's connection is closed by the proxy before the first hit connects, so its fd number
    // is free again (a client that merely drops its socket races the proxy's close).
    let mut fill = proxy.client();
    fill.get("/obj/5000", &[("Connection", "close")]);
    assert!(fill.is_closed());
    let mut peers = Vec::new();
    for _ in 0..6 {
        let mut c = proxy.client();
        assert_eq!(
            c.get("/obj/5000", &[("Connection", "close")]).x_cache(),
            "HIT"
        );
        assert!(c.is_closed());
        peers.push(c.sock.local_addr().expect("local").to_string());
    }
    let recs: Vec<Value> = peers
        .iter()
        .map(|p| closed_conn(&proxy, |c| c["peer"] == p.as_str()))
        .collect();
    // The proxy closed each before the next arrived, so the kernel handed out the same lowest free
    // fd number again, unless the control plane briefly held one (it opens files of its own): at
    // least one number must recur, and every record must stay its own.
    let mut by_fd: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for r in &recs {
        assert_eq!(u(&r["kernel"]["zerocopy_bytes"]), 5000, "{recs:?}");
        assert_eq!(u(&r["requests"]), 1);
        by_fd
            .entry(u(&r["fd"]))
            .or_default()
            .push(u(&r["kernel"]["generation"]));
    }
    assert!(
        by_fd.values().any(|g| g.len() >= 2),
        "no fd reused: {recs:?}"
    );
    let gens: std::collections::BTreeSet<u64> = by_fd.values().flatten().copied().collect();
    assert_eq!(gens.len(), recs.len(), "generations repeat: {by_fd:?}");
}

#[test]
fn the_planted_copy_bug_is_reported_as_violations() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            debug_yaml: "  copy_hits: true\n".into(),
            ..probe_opts("")
        },
    );
    let mut c = proxy.client();
    c.get("/obj/70000", &[]);
    for _ in 0..3 {
        let r = c.get("/obj/70000", &[]);
        assert_eq!((r.x_cache(), r.body.clone()), ("HIT", body(70_000)));
    }
    let local = c.sock.local_addr().expect("local").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    // The miss (read behind its fill) and the three hits were all meant for sendfile.
    assert_eq!(u(&conn["violations"]), 4, "{conn}");
    assert_eq!(u(&conn["kernel"]["zerocopy_bytes"]), 0);
    let stats = proxy.api("/api/stats");
    assert_eq!(u(&stats["violations"]), 4);
    assert_eq!(u(&stats["violation_bytes"]), 280_000);
    let v = &stats["recent_violations"][0];
    assert_eq!(v["request"], "GET /obj/70000");
    let m = proxy.metrics();
    assert!(m.contains("zerocache_zero_copy_violations_total 4"), "{m}");
}

#[test]
fn without_privileges_the_proxy_serves_and_says_why_the_probe_is_off() {
    if !require::root("drops to nobody with setpriv") {
        return;
    }
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    // nobody must be able to create the cache there.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let dir = tmp.path().join("cache");
    let proxy = Proxy::start_in(
        origin.addr(),
        &dir,
        tmp.path(),
        Opts {
            probe: true,
            run_as: Some("nobody"),
            ..Opts::default()
        },
    );
    assert_eq!(proxy.get("/obj/100").body, body(100));
    assert_eq!(proxy.get("/obj/100").x_cache(), "HIT");
    let stats = proxy.api("/api/stats");
    assert_eq!(stats["probe"]["state"], "unavailable", "{stats}");
    let reason = stats["probe"]["reason"].as_str().expect("reason");
    assert!(reason.contains("CAP_BPF"), "{reason}");
    assert!(proxy.metrics().contains("zerocache_probe_up 0"));
}
