//! The dashboard is safe at the edge: it cannot be driven cross-site (a browser's `text/plain`
//! POST, a foreign `Origin`), it answers only to its own names (DNS rebinding), and a blank token
//! is no token. Real zerocache processes, raw requests on real sockets, so every `Host`, `Origin`
//! and `Content-Type` is exactly what the test wrote.

use crate::support::*;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PURGE_BODY: &str = r#"{"url": "http://test.example/obj/1000"}"#;

/// Sends `head` (request line and fields, without the final blank line) plus `body` to `addr`
/// on a fresh connection, with its `Content-Length`; returns the response.
fn raw(addr: SocketAddr, head: &str, body: &str) -> Response {
    let mut c = Client::connect(addr);
    let mut req = head.trim_end_matches("\r\n").to_string();
    req.push_str(&format!(
        "\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    c.send(req.as_bytes());
    c.read_response(head.starts_with("HEAD "))
}

/// A purge of `/obj/1000` with these extra fields (`Host` included).
fn purge_with(proxy: &Proxy, fields: &str) -> Response {
    raw(
        proxy.dashboard,
        &format!("POST /api/purge HTTP/1.1\r\n{fields}"),
        PURGE_BODY,
    )
}

/// The `error` of a JSON error body.
fn json_error(r: &Response) -> String {
    let v: serde_json::Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&r.body)));
    v["error"].as_str().expect("an `error` string").to_string()
}

/// A proxy with `/obj/1000` cached (and shown to be a HIT).
fn proxy_with_entry(origin: &Origin, dashboard_yaml: &str) -> Proxy {
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            dashboard_yaml: dashboard_yaml.into(),
            ..Opts::default()
        },
    );
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT");
    proxy
}

#[test]
fn a_cross_site_text_plain_purge_is_refused_and_the_entry_stays() {
    let (origin, _rt) = origin();
    let proxy = proxy_with_entry(&origin, "");
    let own = proxy.dashboard;
    // Exactly what a page on evil.example can make a browser send without a preflight: through
    // DNS rebinding (Host = the attacker's name), and straight at the loopback address.
    for host in ["evil.example:80".to_string(), own.to_string()] {
        let r = purge_with(
            &proxy,
            &format!(
                "Host: {host}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain;charset=UTF-8\r\n"
            ),
        );
        assert!(
            [403, 415, 421].contains(&r.status),
            "Host {host}: {} {:?}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT", "Host {host}");
    }
    // Same origin but the body not declared JSON: 415 with a JSON error.
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ] {
        let r = purge_with(&proxy, &format!("Host: {own}\r\nContent-Type: {ct}\r\n"));
        assert_eq!(r.status, 415, "{ct}");
        assert!(json_error(&r).contains("application/json"), "{ct}");
        assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT", "{ct}");
    }
    let r = purge_with(&proxy, &format!("Host: {own}\r\n"));
    assert_eq!(r.status, 415, "no Content-Type at all");
    assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT");
}

#[test]
fn a_json_purge_from_a_foreign_origin_is_refused_and_the_entry_stays() {
    let (origin, _rt) = origin();
    let proxy = proxy_with_entry(&origin, "");
    let own = proxy.dashboard;
    for foreign in [
        "http://evil.example",
        "null",
        "https://evil.example",
        // Another port on the same machine is another origin.
        "http://127.0.0.1:1",
    ] {
        let r = purge_with(
            &proxy,
            &format!("Host: {own}\r\nOrigin: {foreign}\r\nContent-Type: application/json\r\n"),
        );
        assert_eq!(r.status, 403, "Origin {foreign}");
        assert!(json_error(&r).contains("Origin"), "Origin {foreign}");
        assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT", "Origin {foreign}");
    }
}

#[test]
fn requests_for_a_foreign_host_are_misdirected_everywhere() {
    let (origin, _rt) = origin();
    let proxy = proxy_with_entry(&origin, "");
    let port = proxy.dashboard.port();
    for path in [
        "/",
        "/metrics",
        "/api/stats",
        "/assets/uplot.js",
        "/nowhere",
    ] {
        for host in [
            "evil.example".to_string(),
            format!("evil.example:{port}"),
            // A name that merely starts like ours.
            format!("localhost.evil.example:{port}"),
        ] {
            let r = raw(
                proxy.dashboard,
                &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n"),
                "",
            );
            assert_eq!(r.status, 421, "GET {path} with Host {host}");
            assert!(r.body.len() < 200, "a short body");
        }
    }
    // No Host at all, and an absolute-form target naming another host.
    let r = raw(proxy.dashboard, "GET /metrics HTTP/1.1\r\n", "");
    assert_eq!(r.status, 421, "no Host");
    let r = raw(
        proxy.dashboard,
        &format!(
            "GET http://evil.example/metrics HTTP/1.1\r\nHost: {}\r\n",
            proxy.dashboard
        ),
        "",
    );
    assert_eq!(r.status, 421, "absolute-form target for evil.example");
    // Nor can a rebinding page purge, whatever else it gets right.
    let r = purge_with(
        &proxy,
        &format!("Host: evil.example:{port}\r\nContent-Type: application/json\r\n"),
    );
    assert_eq!(r.status, 421);
    assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT");
    // The loopback names on the dashboard's port are its own.
    for host in [
        proxy.dashboard.to_string(),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = raw(
            proxy.dashboard,
            &format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\n"),
            "",
        );
        assert_eq!(r.status, 200, "Host {host}");
    }
    let r = raw(
        proxy.dashboard,
        &format!("HEAD / HTTP/1.1\r\nHost: localhost:{port}\r\n"),
        "",
    );
    assert_eq!(r.status, 200, "HEAD needs no Content-Type");
}

#[test]
fn allowed_hosts_lets_a_named_scrape_through() {
    let (origin, _rt) = origin();
    let without = Proxy::start(origin.addr(), Opts::default());
    let port = without.dashboard.port();
    let r = raw(
        without.dashboard,
        &format!("GET /metrics HTTP/1.1\r\nHost: zc.internal:{port}\r\n"),
        "",
    );
    assert_eq!(r.status, 421, "not listed: refused");
    drop(without);

    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            dashboard_yaml: "  allowed_hosts: [zc.internal]\n".into(),
            ..Opts::default()
        },
    );
    let port = proxy.dashboard.port();
    for host in [
        format!("zc.internal:{port}"),
        "ZC.Internal".to_string(),
        format!("zc.internal:{}", port.wrapping_add(1)),
    ] {
        let r = raw(
            proxy.dashboard,
            &format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\n"),
            "",
        );
        assert_eq!(r.status, 200, "Host {host}");
        let text = String::from_utf8_lossy(&r.body);
        assert!(text.contains("# TYPE zerocache_requests_total"), "{text}");
    }
    for host in [
        "evil.example".to_string(),
        format!("www.zc.internal:{port}"),
    ] {
        let r = raw(
            proxy.dashboard,
            &format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\n"),
            "",
        );
        assert_eq!(r.status, 421, "Host {host}");
    }
    // A purge addressed to the listed name, from that name's own origin, is legitimate.
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT");
    let r = purge_with(
        &proxy,
        &format!(
            "Host: zc.internal:{port}\r\nOrigin: http://zc.internal:{port}\r\nContent-Type: application/json\r\n"
        ),
    );
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
}

#[test]
fn a_legitimate_purge_works_as_before() {
    let (origin, _rt) = origin();
    // Script-style: JSON, no Origin (what `Proxy::purge` sends).
    let proxy = proxy_with_entry(&origin, "");
    assert_eq!(
        proxy.purge(PURGE_BODY),
        (200, serde_json::json!({"purged": 1}))
    );
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT");
    // Browser-style from the dashboard's own page: its own Origin, JSON with a charset.
    let own = proxy.dashboard;
    let r = purge_with(
        &proxy,
        &format!(
            "Host: {own}\r\nOrigin: http://{own}\r\nContent-Type: application/json; charset=utf-8\r\n"
        ),
    );
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v, serde_json::json!({"purged": 1}));
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
    // The page reached as localhost is its own origin too.
    let port = own.port();
    let r = purge_with(
        &proxy,
        &format!(
            "Host: localhost:{port}\r\nOrigin: http://localhost:{port}\r\nContent-Type: application/json\r\n"
        ),
    );
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"purged": 1}),
        "the MISS above refilled it"
    );
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
}

#[test]
fn with_a_token_a_purge_needs_it_and_an_empty_bearer_is_no_bearer() {
    let (origin, _rt) = origin();
    let proxy = proxy_with_entry(&origin, "  token: s3cret\n");
    let own = proxy.dashboard;
    for auth in [
        "",
        "Authorization: Bearer \r\n",
        "Authorization: Bearer wrong\r\n",
    ] {
        for query in ["", "?token=", "?token=%20"] {
            let r = raw(
                own,
                &format!(
                    "POST /api/purge{query} HTTP/1.1\r\nHost: {own}\r\n{auth}Content-Type: application/json\r\n"
                ),
                PURGE_BODY,
            );
            assert_eq!(r.status, 401, "{auth:?} {query:?}");
        }
    }
    assert_eq!(proxy.get("/obj/1000").x_cache(), "HIT");
    let r = raw(
        own,
        &format!(
            "POST /api/purge HTTP/1.1\r\nHost: {own}\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/json\r\n"
        ),
        PURGE_BODY,
    );
    assert_eq!(r.status, 200);
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
}

#[test]
fn a_blank_token_is_refused_at_start_up() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (listen, token) in [
        ("127.0.0.1:0", "\"   \""),
        ("127.0.0.1:0", "\"\""),
        ("127.0.0.1:0", "\"\\t\""),
        // Off loopback a token is required; a blank one is not one.
        ("0.0.0.0:0", "\"  \""),
    ] {
        let cfg = tmp.path().join("zc.yaml");
        std::fs::write(
            &cfg,
            format!(
                "listen: 127.0.0.1:0\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\ndashboard: {{listen: \"{listen}\", token: {token}}}\nprobe: {{enabled: false}}\n",
                tmp.path().join("c").display()
            ),
        )
        .expect("write");
        let mut child = Command::new(env!("CARGO_BIN_EXE_zerocache"))
            .args(["run", "--config"])
            .arg(&cfg)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn zerocache");
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("zerocache kept running with token {token} on {listen}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
            .expect("read stderr");
        assert!(!status.success(), "token {token} on {listen}: {status}");
        assert!(
            err.contains("dashboard.token"),
            "token {token} on {listen}: {err}"
        );
    }
}
