//! Operations: SIGHUP reload, graceful shutdown, the access log, connection limits and the
//! systemd unit's capabilities.

use crate::support::*;
use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

const BIG: usize = 64 * 1024 * 1024;

fn signal(proxy: &Proxy, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, sig) };
}

fn slow_hit(proxy: &Proxy) -> std::thread::JoinHandle<Vec<u8>> {
    slow_64mib_hit(proxy, Duration::from_millis(8))
}

fn check_big(all: &[u8]) {
    assert_complete_64mib_hit(all);
}

/// `/healthz`, asked as a load balancer does: by address, with another `Host` and no token.
fn healthz(proxy: &Proxy) -> (u16, String) {
    let r = Client::connect(proxy.dashboard).get("/healthz", &[]);
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

#[test]
fn sighup_reload_changes_routes_for_new_requests_while_a_64mib_hit_finishes() {
    let (a, _rta) = origin();
    let (b, _rtb) = origin();
    a.script(
        "/which",
        Reply::ok(b"A".to_vec()).headers(&[("Cache-Control", "no-store")]),
    );
    b.script(
        "/which",
        Reply::ok(b"B".to_vec()).headers(&[("Cache-Control", "no-store")]),
    );
    let proxy = Proxy::start(a.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/67108864").body.len(), BIG);
    assert_eq!(proxy.get("/which").body, b"A");
    let inflight = slow_hit(&proxy);
    std::thread::sleep(Duration::from_millis(100));

    let text = std::fs::read_to_string(&proxy.config).expect("config");
    std::fs::write(
        &proxy.config,
        text.replace(&a.addr().to_string(), &b.addr().to_string()),
    )
    .expect("rewrite");
    signal(&proxy, libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.get("/which").body != b"B" {
        assert!(Instant::now() < deadline, "reload did not take effect");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_config_reloads_total{result=\"accepted\"}"
        ),
        1
    );
    // The cache survived the reload, and the transfer in flight finished intact.
    assert_eq!(proxy.get("/obj/67108864").x_cache(), "HIT");
    check_big(&inflight.join().expect("in-flight hit"));
}

#[test]
fn a_bad_reload_keeps_the_running_config() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/10").status, 200);
    let text = std::fs::read_to_string(&proxy.config).expect("config");
    std::fs::write(
        &proxy.config,
        text.replace("upstream: origin", "upstream: nowhere"),
    )
    .expect("rewrite");
    signal(&proxy, libc::SIGHUP);
    // The reload was attempted and refused: counted, so this test cannot pass without it.
    assert_eventually_eq(
        "the rejected reload is counted",
        Duration::from_secs(5),
        || {
            let m = proxy.metrics();
            (
                metric(&m, "zerocache_config_reloads_total{result=\"rejected\"}"),
                metric(&m, "zerocache_config_reloads_total{result=\"accepted\"}"),
            )
        },
        (1, 0),
    );
    let r = proxy.get("/obj/20");
    assert_eq!((r.status, r.body.clone()), (200, body(20)));
    assert_eq!(proxy.get("/obj/10").x_cache(), "HIT");
}

#[test]
fn sigterm_finishes_the_transfer_in_flight_refuses_new_connections_and_exits_0() {
    let (origin, _rt) = origin();
    let mut proxy = Proxy::start(origin.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/67108864").body.len(), BIG);
    // An idle keep-alive connection, which the drain closes without waiting for it.
    let mut idle = proxy.client();
    assert_eq!(idle.get("/obj/10", &[]).status, 200);
    assert_eq!(healthz(&proxy), (200, "ok\n".to_string()));
    let inflight = slow_hit(&proxy);
    std::thread::sleep(Duration::from_millis(100));
    signal(&proxy, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::net::TcpStream::connect(proxy.addr) {
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
                break;
            }
            Ok(_) => {
                assert!(Instant::now() < deadline, "still accepting after SIGTERM");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // While the 64 MiB transfer drains, the health check tells load balancers to stop.
    assert_eq!(healthz(&proxy), (503, "draining\n".to_string()));
    assert!(
        idle.is_closed(),
        "idle keep-alive connections are closed by the drain"
    );
    check_big(&inflight.join().expect("in-flight hit"));
    let status = proxy.child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
}

/// SIGTERM with a lame duck: `/healthz` answers 503 while the listeners still accept and serve,
/// on new connections and kept-alive ones, until the period ends or, as here, a second SIGTERM
/// ends it; then the drain as without one: no new connections, the transfer in flight finished,
/// the busy keep-alive client's last response says `Connection: close`, and none fails. The period
/// (60 s) is far longer than the test needs, so nothing here depends on the machine's speed: the
/// second signal ends it.
#[test]
fn sigterm_with_a_lame_duck_serves_with_healthz_503_until_a_second_sigterm_closes_the_listeners() {
    let (origin, _rt) = origin();
    let mut proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  lame_duck: 60s\n".into(),
            ..Default::default()
        },
    );
    assert_eq!(proxy.get("/obj/67108864").body.len(), BIG);
    assert_eq!(proxy.get("/obj/10").status, 200);
    // A keep-alive client that never pauses, as a busy one behind a load balancer does.
    let addr = proxy.addr;
    let busy = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let mut served = 0;
        loop {
            let r = c.get("/obj/10", &[]);
            assert_eq!((r.status, r.body.clone()), (200, body(10)), "{served}");
            served += 1;
            if r.header("connection") == Some("close") {
                assert!(c.is_closed());
                return served;
            }
        }
    });
    assert_eq!(healthz(&proxy), (200, "ok\n".to_string()));
    signal(&proxy, libc::SIGTERM);
    assert_eventually_eq(
        "the lame duck's health check",
        Duration::from_secs(10),
        || healthz(&proxy),
        (503, "draining\n".to_string()),
    );
    // Still accepting and serving, misses and hits, with the health check saying 503.
    for i in 0..20 {
        let r = proxy.get(&format!("/obj/{}", 100 + i % 10));
        assert_eq!((r.status, &r.body), (200, &body(100 + i % 10)), "{i}");
        assert_eq!(r.header("connection"), None, "{i}");
    }
    assert!(!busy.is_finished(), "the keep-alive client is served on");
    let inflight = slow_hit(&proxy);
    std::thread::sleep(Duration::from_millis(100));
    signal(&proxy, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(proxy.addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting after the second SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    check_big(&inflight.join().expect("in-flight hit"));
    assert!(busy.join().expect("the busy client") > 0);
    assert_eq!(proxy.child.wait().expect("wait").code(), Some(0));
}

/// Without a second signal the lame duck ends by itself and the process exits 0.
#[test]
fn a_lame_duck_ends_by_itself_and_the_process_exits_0() {
    let (origin, _rt) = origin();
    let mut proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  lame_duck: 1s\n".into(),
            ..Default::default()
        },
    );
    assert_eq!(proxy.get("/obj/10").status, 200);
    signal(&proxy, libc::SIGTERM);
    assert_eq!(proxy.child.wait().expect("wait").code(), Some(0));
}

/// A client that leaves in the middle of its request body was sent nothing, and its request still
/// gets its access-log line: nginx's 499 (client closed request), 0 bytes, `aborted`, for a body
/// held in memory (small) and one already streaming to the origin (large) alike.
#[test]
fn a_request_body_abandoned_mid_way_still_gets_its_access_log_line_as_499() {
    let (origin, _rt) = origin();
    origin.script("/up", Reply::ok(b"ok".to_vec()).headers(&[]));
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!("logging:\n  access_log: {}\n", log.display()),
            ..Opts::default()
        },
    );
    for (n, sent) in [1000usize, 200_000].into_iter().enumerate() {
        let mut c = proxy.client();
        c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n");
        c.send(&vec![b'x'; sent]);
        drop(c);
        let lines = log_lines(&log, n + 1);
        let line = &lines[n];
        assert!(
            line.contains("\"POST /up HTTP/1.1\" 499 0 ERROR copy "),
            "{sent}: {line}"
        );
        assert!(line.contains(" aborted \"a\" "), "{sent}: {line}");
    }
}

/// A SIGTERM at any point after start ends the process: ten proxies, each stopped the moment it
/// answers, with a drain timeout (60 s) far beyond the 20 s this waits. Two waits used to have no
/// deadline: an accept loop that subscribed to the shutdown after it was sent never saw it, and
/// the workers' stopping was awaited before the drain timeout started.
#[test]
fn sigterm_right_after_start_exits_0_without_waiting_for_the_drain_timeout() {
    let (origin, _rt) = origin();
    for _ in 0..10 {
        let mut proxy = Proxy::start(
            origin.addr(),
            Opts {
                extra_yaml: "limits:\n  drain_timeout: 60s\n".into(),
                ..Opts::default()
            },
        );
        signal(&proxy, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = proxy.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "still running 20 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0));
    }
}

#[test]
fn the_access_log_has_one_exact_line_per_response() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!("logging:\n  access_log: {}\n", log.display()),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    c.get(
        "/obj/1000",
        &[
            ("User-Agent", "probe/1 (\"x\")"),
            ("Referer", "http://r.example/a b"),
        ],
    );
    c.get("/obj/1000", &[]);
    let peer = c.sock.local_addr().expect("addr").to_string();
    // A response the client walks away from is logged too, with what was sent and how it ended.
    proxy.get("/obj/16777216");
    let mut gone = proxy.client();
    gone.send(b"GET /obj/16777216 HTTP/1.1\r\nHost: a\r\n\r\n");
    let mut first = [0u8; 1];
    gone.sock.read_exact(&mut first).expect("first byte");
    // Closing with unread bytes makes the kernel reset the connection.
    drop(gone);
    let lines = log_lines(&log, 4);
    assert_eq!(lines.len(), 4);
    // The time, the two durations and the request id vary: masked, then every other byte is
    // pinned.
    let mask = |l: &str| {
        let mut t: Vec<String> = l.split(' ').map(str::to_string).collect();
        t[0] = "T".into();
        let n = t.len();
        t[n - 1] = "ID".into();
        for w in t.iter_mut() {
            let secs = w.split_once('.').is_some_and(|(a, b)| {
                !a.is_empty()
                    && b.len() == 6
                    && (a.to_string() + b).bytes().all(|c| c.is_ascii_digit())
            });
            if secs {
                *w = "S".into();
            }
        }
        t.join(" ")
    };
    let id = |l: &str| l.rsplit(' ').next().unwrap_or_default().to_string();
    let origin_addr = origin.addr();
    assert_eq!(
        mask(&lines[0]),
        format!(
            "T {peer} \"GET /obj/1000 HTTP/1.1\" 200 1000 MISS sendfile S complete \"test.example\" \"probe/1 (\\x22x\\x22)\" \"http://r.example/a b\" {origin_addr} 200 S ID"
        )
    );
    assert_eq!(
        mask(&lines[1]),
        format!(
            "T {peer} \"GET /obj/1000 HTTP/1.1\" 200 1000 HIT sendfile S complete \"test.example\" \"-\" \"-\" - - - ID"
        )
    );
    // Every id is 16 hex digits and distinct, and the miss's is the one the origin received.
    let ids: Vec<String> = lines.iter().map(|l| id(l)).collect();
    for i in &ids {
        assert!(
            i.len() == 16 && i.bytes().all(|b| b.is_ascii_hexdigit()),
            "{i}"
        );
    }
    assert_eq!(
        ids.iter().collect::<std::collections::HashSet<_>>().len(),
        4
    );
    let sent_upstream: Vec<String> = origin
        .received()
        .iter()
        .filter_map(|r| r.header("x-request-id").map(str::to_string))
        .collect();
    assert_eq!(sent_upstream[0], ids[0]);
    let aborted = mask(&lines[3]);
    let (head, tail) = aborted.split_once(" sendfile S ").expect("aborted line");
    let sent: u64 = head
        .rsplit(' ')
        .nth(1)
        .and_then(|b| b.parse().ok())
        .expect("bytes");
    assert!(sent < 16_777_216, "{}", lines[3]);
    // Another Host, so another key: a miss, with its upstream.
    assert_eq!(
        tail,
        format!("aborted \"a\" \"-\" \"-\" {origin_addr} 200 S ID"),
        "{lines:#?}"
    );
}

#[test]
fn the_combined_format_reads_like_nginx_and_ids_from_trusted_peers_are_kept() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!(
                "logging:\n  access_log: {}\n  access_log_format: combined\n  request_id_header: X-Trace\nproxy:\n  trusted_proxies: [127.0.0.0/8]\n",
                log.display()
            ),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    c.get(
        "/obj/10",
        &[
            ("X-Trace", "lb-42"),
            ("User-Agent", "ua"),
            ("Referer", "ref"),
        ],
    );
    // An invalid id is replaced, even from a trusted peer.
    c.get("/obj/11", &[("X-Trace", "a b")]);
    let lines = log_lines(&log, 2);
    let first = lines[0].as_str();
    let (ip, rest) = first.split_once(" - - [").expect("combined");
    assert_eq!(ip, "127.0.0.1");
    let (time, rest) = rest.split_once("] ").expect("time");
    assert_eq!(time.len(), "30/Nov/2026:08:26:58 +0000".len(), "{time}");
    assert!(time.ends_with(" +0000"), "{time}");
    assert_eq!(rest, "\"GET /obj/10 HTTP/1.1\" 200 10 \"ref\" \"ua\" MISS");
    let received = origin.received();
    let traces: Vec<&str> = received
        .iter()
        .filter_map(|r| r.header("x-trace"))
        .collect();
    assert_eq!(traces.len(), 2);
    assert_eq!(traces[0], "lb-42");
    assert!(
        traces[1].len() == 16 && traces[1].bytes().all(|b| b.is_ascii_hexdigit()),
        "{}",
        traces[1]
    );
    assert!(
        received.iter().all(|r| r.header("x-request-id").is_none()),
        "only the configured field is sent"
    );
}

#[test]
fn connections_beyond_max_connections_get_a_canned_503_at_once() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  max_connections: 2\n".into(),
            ..Opts::default()
        },
    );
    // Let the readiness probe's connection close first.
    std::thread::sleep(Duration::from_millis(200));
    let mut a = proxy.client();
    let mut b = proxy.client();
    assert_eq!(a.get("/obj/1", &[]).status, 200);
    assert_eq!(b.get("/obj/1", &[]).status, 200);
    // A third connection is answered without sending anything (no slowloris amplifier), and
    // closed with a FIN after the answer.
    let mut c = proxy.client();
    let mut got = Vec::new();
    c.sock.read_to_end(&mut got).expect("answer, then FIN");
    assert_eq!(
        String::from_utf8_lossy(&got),
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\nContent-Length: 24\r\nConnection: close\r\n\r\n503 Service Unavailable\n"
    );
    assert_eventually_eq(
        "the refused connection is counted",
        Duration::from_secs(5),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_connections_rejected_total{reason=\"max_connections\"}",
            )
        },
        1,
    );
    drop(a);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(proxy.get("/obj/1").status, 200);
}

/// The capabilities named in the systemd unit, as setpriv wants them (`+bpf,+perfmon,...`).
fn unit_caps() -> String {
    let unit = include_str!("../../../config/zerocache.service");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("AmbientCapabilities in the unit");
    line.split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn the_systemd_units_capabilities_are_enough_for_the_probe() {
    if !require::root(
        "runs the proxy as nobody with the unit's capabilities and loads the eBPF probe",
    ) {
        return;
    }
    let (origin, _rt) = origin();
    let caps = unit_caps();
    assert_eq!(caps, "+bpf,+perfmon,+dac_read_search,+net_bind_service");
    let tmp = tempfile::tempdir().expect("tmp");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let proxy = Proxy::start_in(
        origin.addr(),
        &tmp.path().join("cache"),
        tmp.path(),
        Opts {
            probe: true,
            run_as_caps: Some(caps),
            ..Opts::default()
        },
    );
    let stats = proxy.api("/api/stats");
    assert_eq!(stats["probe"]["state"], "attached", "{stats}");
    // And it works as a probe, not just as a load: the miss (read behind its fill) and the hit
    // are counted through sendfile, by the kernel's per-process totals (what these capabilities
    // must allow; joining each connection with its record is zero_copy.rs's).
    proxy.get("/obj/4096");
    let mut c = proxy.client();
    c.get("/obj/4096", &[("Connection", "close")]);
    assert!(c.is_closed());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = proxy.api("/api/stats");
        let sendfile = &s["syscalls"]["sendfile"];
        if sendfile["bytes"].as_u64() == Some(8192) && sendfile["calls"].as_u64() == Some(2) {
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_response_that_starts_while_draining_says_connection_close() {
    let (origin, _rt) = origin();
    let mut proxy = Proxy::start(origin.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/67108864").body.len(), BIG);
    // Two pipelined requests; the first (64 MiB) is still in flight when SIGTERM arrives.
    let mut c = proxy.client();
    c.send(b"GET /obj/67108864 HTTP/1.1\r\nHost: a\r\n\r\nGET /obj/10 HTTP/1.1\r\nHost: a\r\n\r\n");
    std::thread::sleep(Duration::from_millis(100));
    signal(&proxy, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(proxy.addr).is_ok() {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = c.read_response(false);
    assert_eq!((first.status, first.body.len()), (200, BIG));
    assert_eq!(first.header("connection"), None);
    // The second started during the drain: it is the connection's last, and says so.
    let second = c.read_response(false);
    assert_eq!((second.status, second.body.clone()), (200, body(10)));
    assert_eq!(second.header("connection"), Some("close"));
    assert!(c.is_closed());
    assert_eq!(proxy.child.wait().expect("wait").code(), Some(0));
}

#[test]
fn sigusr1_reopens_the_access_log_and_the_process_keeps_running() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let mut proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!("logging:\n  access_log: {}\n", log.display()),
            ..Opts::default()
        },
    );
    assert_eq!(proxy.get("/obj/10").status, 200);
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eventually_eq("the first line", Duration::from_secs(5), || lines(&log), 1);
    // logrotate: move the file, then signal, as nginx's postrotate does.
    std::fs::rename(&log, &rotated).expect("rotate");
    signal(&proxy, libc::SIGUSR1);
    assert_eventually_eq(
        "a new file after SIGUSR1",
        Duration::from_secs(5),
        || log.exists(),
        true,
    );
    assert_eq!(proxy.get("/obj/10").x_cache(), "HIT");
    assert_eventually_eq(
        "the next line, in the new file",
        Duration::from_secs(5),
        || lines(&log),
        1,
    );
    assert_eq!(lines(&rotated), 1, "nothing more goes to the rotated file");
    assert!(
        proxy.child.try_wait().expect("status").is_none(),
        "still running"
    );
}

#[test]
fn stray_signals_are_ignored_and_sigquit_drains_like_sigterm() {
    let (origin, _rt) = origin();
    let mut proxy = Proxy::start(origin.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/10").status, 200);
    // Its default action would end the process without a word (SIGUSR2 is the binary upgrade:
    // `binary_upgrade`).
    signal(&proxy, libc::SIGALRM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        proxy.child.try_wait().expect("status").is_none(),
        "ALRM must not end the process"
    );
    assert_eq!(proxy.get("/obj/10").x_cache(), "HIT");
    // nginx's graceful stop.
    signal(&proxy, libc::SIGQUIT);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = proxy.child.try_wait().expect("status") {
            break s;
        }
        assert!(Instant::now() < deadline, "SIGQUIT did not stop the proxy");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "a drain, not a core dump");
}

#[test]
fn listen_takes_a_list_names_and_ipv6_with_nginx_backlog() {
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    // 127.0.0.1 comes from `localhost` too: bound once. [::1] only where the host has IPv6.
    let v6 = std::net::TcpListener::bind("[::1]:0").is_ok();
    let extra = if v6 { ", \"[::1]:{port}\"" } else { "" };
    let yaml = format!(
        "listen: [\"localhost:{{port}}\", \"127.0.0.2:{{port}}\"{extra}]\nbacklog: 77\ncache: {{path: {}, max_size: 1GiB}}\nupstreams:\n  o: {{servers: [\"{}\"]}}\nroutes:\n  - match: {{host: \"*\", path_prefix: /}}\n    upstream: o\ndashboard: {{listen: \"127.0.0.1:{{dport}}\"}}\nprobe: {{enabled: false}}\n",
        tmp.path().join("cache").display(),
        origin.addr()
    );
    let proxy = Proxy::from_yaml(&yaml, tmp.path());
    let port = proxy.addr.port();
    let mut addrs = vec![format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")];
    if v6 {
        addrs.push(format!("[::1]:{port}"));
    }
    for a in &addrs {
        let mut c = Client::connect(a.parse().expect("addr"));
        assert_eq!(c.get("/obj/10", &[]).body, body(10), "{a}");
    }
    // Every listening socket has the configured backlog (ss shows it as Send-Q).
    if !require::command("ss") {
        return;
    }
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss");
    let text = String::from_utf8_lossy(&out.stdout);
    let backlogs: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(backlogs, vec!["77"; addrs.len()], "{text}");
}

#[test]
fn logrotate_with_sigusr1_under_traffic_loses_no_line() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!("logging:\n  access_log: {}\n", log.display()),
            ..Opts::default()
        },
    );
    const N: usize = 400;
    let addr = proxy.addr;
    let traffic = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        for _ in 0..N {
            assert_eq!(c.get("/obj/10", &[]).status, 200);
        }
    });
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    // Rotate in the middle of the traffic, as logrotate's postrotate would.
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(&log) < N / 4 {
        assert!(Instant::now() < deadline, "no traffic logged");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::rename(&log, &rotated).expect("rotate");
    signal(&proxy, libc::SIGUSR1);
    traffic.join().expect("traffic");
    assert_eventually_eq(
        "every response has its line, in one file or the other",
        Duration::from_secs(5),
        || lines(&rotated) + lines(&log),
        N,
    );
    assert!(lines(&rotated) >= N / 4, "{}", lines(&rotated));
    assert!(lines(&log) > 0, "lines after the signal go to the new file");
}

#[test]
fn without_an_access_log_a_forwarded_request_still_carries_a_request_id() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    // A client's own id is replaced: it is no trusted proxy.
    assert_eq!(c.get("/obj/10", &[("X-Request-Id", "forged")]).status, 200);
    assert_eq!(c.get("/obj/10", &[]).x_cache(), "HIT");
    let ids: Vec<String> = origin
        .received()
        .iter()
        .map(|r| r.header("x-request-id").unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "the hit never went upstream");
    assert!(
        ids[0].len() == 16 && ids[0].bytes().all(|b| b.is_ascii_hexdigit()),
        "{ids:?}"
    );
}

/// `pid_file` names the serving process once its listeners accept, and goes when it exits
/// (SIGTERM: drained, then removed), so logrotate's postrotate signals the right process.
#[test]
fn the_pid_file_names_the_process_while_it_serves() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let pid_file = dir.path().join("zerocache.pid");
    std::fs::write(&pid_file, "999999\n").expect("a stale one");
    let mut proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!("pid_file: {}\n", pid_file.display()),
            ..Opts::default()
        },
    );
    let pid = proxy.child.id();
    // The stale one replaced by this process's (written once the workers accept).
    wait_pid_file(&pid_file, pid);
    assert_eq!(proxy.get("/obj/100").status, 200);
    signal(&proxy, libc::SIGTERM);
    let status = proxy.child.wait().expect("exit");
    assert!(status.success(), "{status}");
    assert!(!pid_file.exists(), "removed at exit");
}

/// The package's logrotate snippet, run by logrotate itself with no systemd (its paths moved to
/// a temporary directory): the log is rotated, the process named by the pid file reopens it, and
/// the next request's line is in the new file, not the rotated one.
#[test]
fn the_shipped_logrotate_snippet_reopens_the_log_without_systemd() {
    if !require::command("logrotate") {
        return;
    }
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let logs = dir.path().join("log");
    std::fs::create_dir_all(&logs).expect("log dir");
    let log = logs.join("access.log");
    let pid_file = dir.path().join("zerocache.pid");
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!(
                "pid_file: {}\nlogging:\n  access_log: {}\n",
                pid_file.display(),
                log.display()
            ),
            ..Opts::default()
        },
    );
    wait_pid_file(&pid_file, proxy.child.id());
    proxy.get("/obj/100");
    assert_eq!(log_lines(&log, 1).len(), 1);
    let snippet = include_str!("../../../config/packaging/logrotate")
        .replace("/var/log/zerocache", &logs.display().to_string())
        .replace(
            "/run/zerocache/zerocache.pid",
            &pid_file.display().to_string(),
        );
    let conf = dir.path().join("logrotate.conf");
    std::fs::write(&conf, snippet).expect("snippet");
    let state = dir.path().join("logrotate.state");
    let out = Command::new("logrotate")
        .arg("-f")
        .arg("-s")
        .arg(&state)
        .arg(&conf)
        .output()
        .expect("logrotate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Rotated (not yet compressed: delaycompress), and reopened by the signal.
    let rotated = logs.join("access.log.1");
    assert_eq!(log_lines(&rotated, 1).len(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.get("/obj/200");
    let fresh = log_lines(&log, 1);
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    assert!(fresh[0].contains("/obj/200"), "{fresh:?}");
    assert_eq!(
        log_lines(&rotated, 1).len(),
        1,
        "nothing more in the rotated file"
    );
}
