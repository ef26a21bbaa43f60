//! Upstream groups as nginx's `upstream` block has them: balancing (round robin with weights,
//! least_conn, hash), failover and passive health, the active health check, and `host`. Each test
//! runs the real binary in front of several real origins on loopback and counts what each origin
//! received.

use crate::support::*;
use std::path::Path;
use std::time::Duration;

/// `n` origins on one runtime (kept alive by the caller).
fn origins(n: usize) -> (Vec<Origin>, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let os = (0..n)
        .map(|_| rt.block_on(Origin::start()).expect("origin"))
        .collect();
    (os, rt)
}

/// The config text with upstream group `o` given by `group` (its keys indented 4 spaces).
fn config(group: &str, dir: &Path) -> String {
    format!(
        "listen: 127.0.0.1:{{port}}\ncache: {{path: {}, max_size: 1GiB}}\nupstreams:\n  o:\n{group}routes:\n  - match: {{host: \"*\", path_prefix: /}}\n    upstream: o\ndashboard: {{listen: \"127.0.0.1:{{dport}}\"}}\nprobe: {{enabled: false}}\n",
        dir.join("cache").display()
    )
}

/// A proxy whose only group is `group`.
fn proxy_with(group: &str) -> (Proxy, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = Proxy::from_yaml(&config(group, tmp.path()), tmp.path());
    (p, tmp)
}

/// `servers: [...]` of these origins' addresses.
fn servers(os: &[&Origin]) -> String {
    let list: Vec<String> = os.iter().map(|o| format!("\"{}\"", o.addr())).collect();
    format!("    servers: [{}]\n", list.join(", "))
}

/// A 200 nothing may store, so every request reaches an origin.
fn uncacheable(body: &[u8]) -> Reply {
    Reply::ok(body.to_vec()).headers(&[("Cache-Control", "no-store")])
}

#[test]
fn round_robin_splits_requests_evenly() {
    let (os, _rt) = origins(2);
    let (a, b) = (&os[0], &os[1]);
    for o in [a, b] {
        o.script("/rr", uncacheable(b"rr"));
    }
    let (proxy, _tmp) = proxy_with(&servers(&[a, b]));
    for _ in 0..6 {
        let r = proxy.get("/rr");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"rr"[..]));
    }
    assert_eq!((a.hits("/rr"), b.hits("/rr")), (3, 3));
    assert_eq!((a.request_count(), b.request_count()), (3, 3));
}

#[test]
fn weights_share_requests_in_proportion() {
    let (os, _rt) = origins(2);
    let (a, b) = (&os[0], &os[1]);
    for o in [a, b] {
        o.script("/w", uncacheable(b"w"));
    }
    let group = format!(
        "    servers:\n      - {{addr: \"{}\", weight: 3}}\n      - \"{}\"\n",
        a.addr(),
        b.addr()
    );
    let (proxy, _tmp) = proxy_with(&group);
    for _ in 0..8 {
        assert_eq!(proxy.get("/w").status, 200);
    }
    assert_eq!((a.hits("/w"), b.hits("/w")), (6, 2));
}

#[test]
fn least_conn_sends_concurrent_requests_past_the_busy_server() {
    let (os, _rt) = origins(2);
    let (slow, fast) = (&os[0], &os[1]);
    for i in 0..5 {
        let path = format!("/lc/{i}");
        // Long enough to outlast the four requests below by far; nothing waits for it to pass
        // except the join at the end.
        slow.script(&path, uncacheable(b"slow").delay(Duration::from_secs(3)));
        fast.script(&path, uncacheable(b"fast"));
    }
    let (proxy, _tmp) = proxy_with(&format!(
        "{}    balance: least_conn\n",
        servers(&[slow, fast])
    ));
    // Nothing in flight: a tie, which round robin breaks towards the first server.
    let addr = proxy.addr;
    let first = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let r = c.get("/lc/0", &[]);
        (r.status, r.body)
    });
    assert_eventually_eq(
        "the slow server has the first request",
        Duration::from_secs(10),
        || slow.hits("/lc/0"),
        1,
    );
    // One keep-alive connection: it reads its next request only once the last one is done and
    // its upstream connection is back in the pool, so `fast` counts none in flight each time.
    let mut c = proxy.client();
    for i in 1..5 {
        let r = c.get(&format!("/lc/{i}"), &[]);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"fast"[..]));
    }
    assert_eq!(
        first.join().expect("first request"),
        (200, b"slow".to_vec())
    );
    assert_eq!((slow.request_count(), fast.request_count()), (1, 4));
}

#[test]
fn hash_sends_each_object_to_one_server() {
    let (os, _rt) = origins(2);
    let (a, b) = (&os[0], &os[1]);
    let paths: Vec<String> = (0..20).map(|i| format!("/h/{i}")).collect();
    for p in &paths {
        for o in [a, b] {
            o.script(p, uncacheable(b"h"));
        }
    }
    let (proxy, _tmp) = proxy_with(&format!("{}    balance: hash\n", servers(&[a, b])));
    for p in &paths {
        for _ in 0..3 {
            assert_eq!(proxy.get(p).status, 200);
        }
        // A HEAD (which fills nothing) hashes the same key: the same server again.
        assert_eq!(proxy.client().request("HEAD", p, &[]).status, 200);
    }
    let mut on_a = 0;
    for p in &paths {
        let split = (a.hits(p), b.hits(p));
        assert!(
            split == (4, 0) || split == (0, 4),
            "{p} went to both: {split:?}"
        );
        on_a += usize::from(split.0 == 4);
    }
    // 20 keys over two servers: both have some (all on one would be a 2^-19 chance).
    assert!(
        (1..20).contains(&on_a),
        "{on_a} of 20 keys on the first server"
    );
    assert_eq!(a.request_count() + b.request_count(), 80);
}

#[test]
fn a_dead_server_costs_no_client_errors_and_is_marked_down() {
    let (os, rt) = origins(1);
    let live = &os[0];
    let dead = free_port();
    for i in 0..7 {
        live.script(&format!("/d/{i}"), uncacheable(b"live"));
    }
    let (proxy, _tmp) = proxy_with(&format!(
        "    servers: [\"127.0.0.1:{dead}\", \"{}\"]\n",
        live.addr()
    ));
    // Every configured server has its state from start-up.
    let up = |server: &str| {
        metric(
            &proxy.metrics(),
            &format!("zerocache_upstream_server_up{{server=\"{server}\",upstream=\"o\"}}"),
        )
    };
    let live_addr = live.addr().to_string();
    let dead_addr = format!("127.0.0.1:{dead}");
    assert_eq!((up(&dead_addr), up(&live_addr)), (1, 1));
    // Round robin tries the dead server first: refused, so the request goes to the live one.
    let r = proxy.get("/d/0");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"live"[..]));
    // The refused connect is counted although the client got its answer, and the server is down.
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_upstream_errors_total{kind=\"connect\",upstream=\"o\"}"
        ),
        1
    );
    assert_eq!((up(&dead_addr), up(&live_addr)), (0, 1));
    // Something listens there now, but the server is down for fail_timeout (10 s): the next
    // requests, which round robin would split between the two, all go to the live one.
    let revived = rt
        .block_on(Origin::bind(&format!("127.0.0.1:{dead}")))
        .expect("rebind the dead port");
    for i in 1..7 {
        let r = proxy.get(&format!("/d/{i}"));
        assert_eq!((r.status, r.body.as_slice()), (200, &b"live"[..]));
    }
    assert_eq!(
        (revived.connection_count(), revived.request_count()),
        (0, 0)
    );
    assert_eq!(live.request_count(), 7);
}

#[test]
fn a_server_that_hangs_up_is_retried_elsewhere_for_idempotent_requests_only() {
    let (os, _rt) = origins(2);
    let (bad, good) = (&os[0], &os[1]);
    // `bad` accepts and closes without a byte on every path; `good` answers /x.
    for p in ["/x", "/p", "/g"] {
        bad.script(p, Reply::hang_up());
    }
    good.script("/x", uncacheable(b"x"));
    good.script("/p", Reply::hang_up());
    good.script("/g", Reply::hang_up());
    // max_fails 0: never marked down, so every request meets the failure. keepalive 0: every
    // attempt is a fresh connection, so each counts once (a hang-up on a pooled connection is
    // first retried on a fresh one to the same server, since it may be a keep-alive race).
    let (proxy, _tmp) = proxy_with(&format!(
        "{}    max_fails: 0\n    keepalive: 0\n",
        servers(&[bad, good])
    ));
    for _ in 0..6 {
        let r = proxy.get("/x");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"x"[..]));
    }
    // Round robin starts requests 1, 3 and 5 on `bad`; each is retried on `good`.
    assert_eq!((bad.hits("/x"), good.hits("/x")), (3, 6));
    // A POST that reached a server is not sent again: one attempt, a 502.
    let r = proxy.client().send_with_body("POST", "/p", &[], b"once");
    assert_eq!(r.status, 502);
    assert_eq!(bad.hits("/p") + good.hits("/p"), 1);
    // A GET is tried on every server once, then fails.
    assert_eq!(proxy.get("/g").status, 502);
    assert_eq!((bad.hits("/g"), good.hits("/g")), (1, 1));
}

/// Waits until `o` has received `n` more requests for `path` than `from`.
fn wait_for_checks(o: &Origin, path: &str, from: usize, n: usize) {
    assert_eventually_eq(
        "health checks arrive",
        Duration::from_secs(10),
        || o.hits(path) >= from + n,
        true,
    );
}

#[test]
fn the_health_check_marks_a_server_down_and_back_up() {
    let (os, _rt) = origins(2);
    let (a, b) = (&os[0], &os[1]);
    a.script("/health", uncacheable(b"sick").status(503));
    b.script("/health", uncacheable(b"ok"));
    for o in [a, b] {
        o.script("/x", uncacheable(b"x"));
    }
    let (proxy, _tmp) = proxy_with(&format!(
        "{}    health_check: {{path: /health, interval: 50ms, timeout: 1s}}\n",
        servers(&[a, b])
    ));
    // A check's verdict is applied before the next check is sent: two received means the first
    // 503 has marked `a` down.
    wait_for_checks(a, "/health", 0, 2);
    for _ in 0..6 {
        assert_eq!(proxy.get("/x").status, 200);
    }
    assert_eq!((a.hits("/x"), b.hits("/x")), (0, 6));
    // Healthy again. A check already past its choice of reply may still get the 503, so the
    // third from now is the first sure to follow a 200.
    a.script("/health", uncacheable(b"ok"));
    let seen = a.hits("/health");
    wait_for_checks(a, "/health", seen, 3);
    for _ in 0..6 {
        assert_eq!(proxy.get("/x").status, 200);
    }
    assert_eq!((a.hits("/x"), b.hits("/x")), (3, 9));
    // The checks are plain GETs of the path with the server as Host.
    let check = a
        .received()
        .into_iter()
        .find(|r| r.path == "/health")
        .expect("a check");
    assert_eq!(check.method, "GET");
    assert_eq!(check.header("host"), Some(a.addr().to_string().as_str()));
}

#[test]
fn a_reload_stops_the_old_groups_health_checks() {
    let (os, _rt) = origins(1);
    let o = &os[0];
    o.script("/health", uncacheable(b"ok"));
    o.script("/x", uncacheable(b"x"));
    let tmp = tempfile::tempdir().expect("tmp");
    let checked = format!(
        "{}    health_check: {{path: /health, interval: 50ms}}\n",
        servers(&[o])
    );
    let proxy = Proxy::from_yaml(&config(&checked, tmp.path()), tmp.path());
    wait_for_checks(o, "/health", 0, 2);
    // The same group without the check, and a host to see the reload take effect.
    let text = std::fs::read_to_string(&proxy.config).expect("config");
    let reloaded = text.replace(
        "    health_check: {path: /health, interval: 50ms}\n",
        "    host: reloaded.example\n",
    );
    assert_ne!(text, reloaded);
    std::fs::write(&proxy.config, reloaded).expect("write config");
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(proxy.child.id() as i32, libc::SIGHUP) };
    assert_eventually_eq(
        "the reload applies to new requests",
        Duration::from_secs(10),
        || {
            proxy.get("/x");
            o.received()
                .last()
                .and_then(|r| r.header("host").map(str::to_string))
        },
        Some("reloaded.example".to_string()),
    );
    // The old group's checks stopped with the swap, before that request. In the next twenty
    // intervals at most one more arrives (a check already written to its socket when the swap
    // came); had they kept running, twenty would have.
    let seen = o.hits("/health");
    std::thread::sleep(Duration::from_secs(1));
    let after = o.hits("/health");
    assert!(
        after <= seen + 1,
        "{} checks after the reload",
        after - seen
    );
}

#[test]
fn host_is_what_the_origin_receives_and_the_key_keeps_the_client_s() {
    let (os, _rt) = origins(1);
    let o = &os[0];
    let (proxy, _tmp) = proxy_with(&format!("{}    host: objects.example\n", servers(&[o])));
    let mut c = proxy.client();
    c.host = "www.example".into();
    let r = c.get("/obj/10", &[]);
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    let got = o.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("host"), Some("objects.example"));
    // Stored under the client's host: a hit for it...
    let r = c.get("/obj/10", &[]);
    assert_eq!((r.status, r.x_cache()), (200, "HIT"));
    assert_eq!(r.body, body(10));
    // ...and another client host is another object.
    c.host = "other.example".into();
    assert_eq!(c.get("/obj/10", &[]).x_cache(), "MISS");
    let hosts: Vec<Option<String>> = o
        .received()
        .iter()
        .map(|r| r.header("host").map(str::to_string))
        .collect();
    assert_eq!(hosts, vec![Some("objects.example".to_string()); 2]);
}

#[test]
fn when_every_server_is_down_they_are_tried_anyway() {
    let (_none, rt) = origins(0);
    let port = free_port();
    let (proxy, _tmp) = proxy_with(&format!("    servers: [\"127.0.0.1:{port}\"]\n"));
    // Refused: the only server is marked down for 10 s...
    assert_eq!(proxy.get("/obj/3").status, 502);
    let back = rt
        .block_on(Origin::bind(&format!("127.0.0.1:{port}")))
        .expect("rebind the port");
    // ...but with no server up, the down one is tried rather than failing outright.
    let r = proxy.get("/obj/3");
    assert_eq!((r.status, r.body), (200, body(3)));
    assert_eq!(back.request_count(), 1);
}

#[test]
fn a_down_server_gets_requests_again_after_fail_timeout() {
    let (os, rt) = origins(1);
    let live = &os[0];
    live.script("/f", uncacheable(b"f"));
    let dead = free_port();
    let (proxy, _tmp) = proxy_with(&format!(
        "    servers: [\"127.0.0.1:{dead}\", \"{}\"]\n    fail_timeout: 1s\n",
        live.addr()
    ));
    assert_eq!(proxy.get("/f").status, 200);
    let revived = rt
        .block_on(Origin::bind(&format!("127.0.0.1:{dead}")))
        .expect("rebind the dead port");
    revived.script("/f", uncacheable(b"f"));
    // Once the second has passed, round robin includes it again; every answer meanwhile is a 200.
    assert_eventually_eq(
        "the revived server is used again",
        Duration::from_secs(10),
        || {
            assert_eq!(proxy.get("/f").status, 200);
            revived.hits("/f") > 0
        },
        true,
    );
}

/// An origin that reads the first 64 KiB of whatever it is sent, then resets the connection:
/// one that gives up on a request body. Counts the connections it took.
fn quitter() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = taken.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // Slow to read, as on a loaded machine: the proxy has filled every buffer on the
            // way by the time it gives up.
            std::thread::sleep(std::time::Duration::from_millis(100));
            let mut buf = vec![0u8; 64 << 10];
            let _ = s.read(&mut buf);
            // Closing with unread bytes: a reset.
            drop(s);
        }
    });
    (addr, taken)
}

#[test]
fn an_upload_the_origin_gave_up_on_does_not_mark_the_origin_down() {
    let (os, _rt) = origins(1);
    let good = &os[0];
    good.script("/g", uncacheable(b"g"));
    let (bad, taken) = quitter();
    // Round robin over [bad, good]; one counted failure would take `bad` out for 10 s.
    let (proxy, _tmp) = proxy_with(&format!(
        "    max_fails: 1\n    fail_timeout: 10s\n    servers: [\"{bad}\", \"{}\"]\n",
        good.addr()
    ));
    // Streamed (not buffered); `bad` stops reading it after 64 KiB. Larger than the socket
    // buffers between the proxy and `bad` can hold (the proxy's send buffer grows to tcp_wmem's
    // 4 MiB; `bad`'s receive buffer stays near its initial 128 KiB, as it reads once), so the
    // proxy cannot have sent all of it before `bad` resets. With 4 MiB, a loaded machine
    // delayed `bad`'s reset until the whole body sat in those buffers: the upload looked
    // delivered, and the reset after it was rightly counted as a failure (once, in a full
    // suite run beside a build). Under limits.max_body_bytes (16 MiB).
    let body = vec![b'x'; 12 << 20];
    let addr = proxy.addr;
    let upload = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let mut raw = format!(
            "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(&body);
        // The proxy may answer and close before taking the whole body.
        let _ = std::io::Write::write_all(&mut c.sock, &raw);
        c.try_read_response(false).map(|r| r.status)
    });
    let status = upload.join().expect("upload");
    assert!(matches!(status, Some(502) | None), "{status:?}");
    assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 1);
    // `bad` is still in the rotation: the next GETs reach it (and fail over to `good`).
    for _ in 0..2 {
        let r = proxy.get("/g");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"g"[..]));
    }
    assert_eq!(
        taken.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the upload the origin gave up on was held against it"
    );
}
