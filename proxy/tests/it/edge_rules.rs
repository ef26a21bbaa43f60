//! Edge rules end to end (`routes[].query`, `routes[].rules`, docs/rules.md): a real origin, the
//! real proxy, raw HTTP/1.1 clients and, as root, the probe. Each friendly case has its hostile
//! twin: the encoded tracking parameter, the forged `X-Forwarded-For`, the client past its
//! bucket, the line break in a reloaded template.

use crate::support::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn start(origin: &Origin, route_yaml: &str, extra: Opts) -> Proxy {
    Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: format!("    name: site\n{route_yaml}"),
            ..extra
        },
    )
}

fn signal(proxy: &Proxy, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, sig) };
}

#[test]
fn a_sorted_query_without_tracking_parameters_is_one_entry_and_one_purge_finds_it() {
    let (origin, _rt) = origin();
    let proxy = start(
        &origin,
        "    query: { sort: true, drop: [\"utm_*\", fbclid] }\n",
        Opts::default(),
    );
    let mut c = proxy.client();
    let spellings = [
        ("/obj/100?a=1&b=2", "MISS"),
        ("/obj/100?b=2&a=1", "HIT"),
        ("/obj/100?utm_source=x&b=2&fbclid=Q&a=1&utm_medium=y", "HIT"),
    ];
    for (target, want) in spellings {
        let r = c.get(target, &[]);
        assert_eq!((r.x_cache(), r.body.clone()), (want, body(100)), "{target}");
    }
    // The origin was asked once, with the normalised target.
    let asked: Vec<String> = origin.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(asked, vec!["/obj/100?a=1&b=2"]);
    // `%5F` is an unreserved `_`, decoded with the target before the rules see it.
    assert_eq!(
        c.get("/obj/100?utm%5Fsource=x&b=2&a=1", &[]).x_cache(),
        "HIT"
    );
    // A name that only ends like one, or a value that looks like one, stays: its own key and
    // its own fetch, sorted.
    let r = c.get("/obj/100?xutm_source=1&b=utm_source&a=1", &[]);
    assert_eq!(r.x_cache(), "MISS");
    assert_eq!(origin.hits("/obj/100?a=1&b=utm_source&xutm_source=1"), 1);
    // A purge of any spelling normalises as a request does: it finds the one entry.
    let (status, answer) =
        proxy.purge(r#"{"url": "http://test.example/obj/100?b=2&utm_campaign=z&a=1"}"#);
    assert_eq!(
        (status, &answer["purged"]),
        (200, &serde_json::json!(1)),
        "{answer}"
    );
    assert_eq!(c.get("/obj/100?b=2&a=1", &[]).x_cache(), "MISS");
    assert_eq!(origin.hits("/obj/100?a=1&b=2"), 2);
}

/// An unsafe request's `Location` and `Content-Location` invalidate what a request for them
/// would be stored under: through the query rules of the route each one falls in (issue #46: a
/// `Location` with a tracking parameter missed the normalised entry).
#[test]
fn a_location_invalidates_the_normalised_entry_its_spelling_names() {
    let (origin, _rt) = origin();
    let fresh = || Reply::ok(b"i".to_vec()).headers(&[("Cache-Control", "max-age=600")]);
    origin.script("/items/7?a=1&b=2", fresh());
    origin.script("/items/8?a=1&b=2", fresh());
    origin.script(
        "/items",
        Reply::ok(b"created".to_vec())
            .headers(&[
                ("Location", "/items/7?utm_source=mail&b=2&a=1"),
                (
                    "Content-Location",
                    "http://test.example/items/8?b=2&fbclid=Q&a=1",
                ),
            ])
            .status(201),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    name: items\n    query: { sort: true, drop: [\"utm_*\", fbclid] }\n"
                .into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    for p in ["/items/7?b=2&a=1", "/items/8?a=1&b=2"] {
        c.get(p, &[]);
        assert_eq!(c.get(p, &[]).x_cache(), "HIT", "{p}");
    }
    assert_eq!(c.send_with_body("POST", "/items", &[], b"new").status, 201);
    assert_eq!(c.get("/items/7?a=1&b=2", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/items/8?b=2&a=1", &[]).x_cache(), "MISS");
    // The hostile twin: a Location naming another spelling of a query the rules keep apart.
    origin.script(
        "/items-x",
        Reply::ok(b"created".to_vec())
            .headers(&[("Location", "/items/7?a=2&b=2")])
            .status(201),
    );
    assert_eq!(c.get("/items/7?a=1&b=2", &[]).x_cache(), "HIT");
    assert_eq!(
        c.send_with_body("POST", "/items-x", &[], b"new").status,
        201
    );
    assert_eq!(c.get("/items/7?b=2&a=1", &[]).x_cache(), "HIT");
}

#[test]
fn response_fields_set_on_a_hit_leave_its_body_to_sendfile() {
    let probe = require::root("loads the eBPF probe");
    let (origin, _rt) = origin();
    let proxy = start(
        &origin,
        "    rules:\n      - name: hsts\n        response_headers:\n          set: { Strict-Transport-Security: \"max-age=31536000\", X-Route: $route }\n          remove: [Content-Type]\n",
        Opts {
            probe,
            ..Opts::default()
        },
    );
    let miss = proxy.get("/obj/300000");
    assert_eq!(miss.x_cache(), "MISS");
    assert_eq!(
        miss.header("strict-transport-security"),
        Some("max-age=31536000")
    );
    let mut c = proxy.client();
    let before = zero_copy_bytes(&proxy);
    let hit = c.get("/obj/300000", &[]);
    assert_hit(&proxy, &hit, "HIT", &body(300_000), before);
    assert_eq!(
        hit.header("strict-transport-security"),
        Some("max-age=31536000")
    );
    assert_eq!(hit.header("x-route"), Some("site"));
    assert_eq!(hit.header("content-type"), None);
    let set = hit
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("strict-transport-security"))
        .count();
    assert_eq!(set, 1, "{:?}", hit.headers);
    if !probe {
        return;
    }
    let local = c.sock.local_addr().expect("local").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    let k = &conn["kernel"];
    assert_eq!(u(&k["zerocopy_bytes"]), 300_000, "{conn}");
    assert_eq!(u(&k["copy_bytes"]), hit.head_len as u64, "{conn}");
    assert_eq!(u(&conn["violations"]), 0);
}

#[test]
fn a_redirect_takes_its_capture_and_other_paths_pass() {
    let (origin, _rt) = origin();
    let proxy = start(
        &origin,
        "    rules:\n      - name: old-blog\n        match: { path_regex: \"^/blog/(.*)$\" }\n        redirect: { status: 301, location: \"https://$host/posts/$1$query\" }\n",
        Opts::default(),
    );
    let mut c = proxy.client();
    let r = c.get("/blog/2019/hello?x=1", &[]);
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("location"),
        Some("https://test.example/posts/2019/hello?x=1")
    );
    // A path that only looks like it: the origin answers.
    let r = c.get("/obj/10?blog/x", &[]);
    assert_eq!((r.status, r.body.clone()), (200, body(10)));
    assert_eq!(origin.received().len(), 1);
    let m = proxy.metrics();
    assert_eq!(
        metric(
            &m,
            "zerocache_rule_matches_total{route=\"site\",rule=\"old-blog\"}"
        ),
        1
    );
}

/// Sends `proxy_header` and a GET of `target` with `extra` fields on a new connection; returns
/// the status.
fn via_proxy_protocol(proxy: &Proxy, proxy_header: &str, target: &str, extra: &str) -> u16 {
    let mut s = TcpStream::connect(proxy.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let req = format!(
        "{proxy_header}GET {target} HTTP/1.1\r\nHost: t.example\r\n{extra}Connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[test]
fn deny_by_cidr_reads_the_proxy_protocol_source_and_never_x_forwarded_for() {
    let (origin, _rt) = origin();
    let proxy = start(
        &origin,
        "    rules:\n      - name: admin\n        match: { path_prefix: /obj/, client_not_in: [10.0.0.0/8] }\n        deny: 403\n",
        Opts {
            listen_options: "proxy_protocol: true, proxy_protocol_from: [127.0.0.0/8]".into(),
            ..Opts::default()
        },
    );
    let inside = "PROXY TCP4 10.1.2.3 10.0.0.1 51234 80\r\n";
    let outside = "PROXY TCP4 192.0.2.7 10.0.0.1 51234 80\r\n";
    assert_eq!(via_proxy_protocol(&proxy, inside, "/obj/10", ""), 200);
    assert_eq!(via_proxy_protocol(&proxy, outside, "/obj/10", ""), 403);
    let forged = "X-Forwarded-For: 10.0.0.1\r\n";
    assert_eq!(via_proxy_protocol(&proxy, outside, "/obj/10", forged), 403);
    // A spelling that dodges the prefix is normalised before the rule sees it.
    assert_eq!(via_proxy_protocol(&proxy, outside, "/x/../obj/10", ""), 403);
    // Not even a hit: the denied never reached the origin, the one allowed did once.
    assert_eq!(origin.received().len(), 1);
}

#[test]
fn a_rate_limit_answers_429_with_retry_after_on_hits_too_then_lets_the_client_in_again() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let proxy = start(
        &origin,
        "    rules:\n      - name: api\n        match: { path_prefix: /obj/ }\n        rate_limit: { key: client, rate: 1/s, burst: 2 }\n",
        Opts {
            extra_yaml: format!(
                "logging:\n  access_log: {}\n  access_log_format: '$status $cache_status $rule'\n",
                log.display()
            ),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/10", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/obj/10", &[]).x_cache(), "HIT");
    let limited = c.get("/obj/10", &[]);
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("1"));
    // The test clock moves the buckets' time too: a second later, one more.
    proxy.advance_clock(1);
    assert_eq!(c.get("/obj/10", &[]).x_cache(), "HIT");
    assert_eq!(c.get("/obj/10", &[]).status, 429);
    // Another path is not the rule's.
    assert_eq!(c.get("/other", &[]).status, 404);
    let m = proxy.metrics();
    assert_eq!(
        metric(
            &m,
            "zerocache_rule_matches_total{route=\"site\",rule=\"api\"}"
        ),
        5
    );
    assert_eq!(
        metric(
            &m,
            "zerocache_rule_limited_total{route=\"site\",rule=\"api\"}"
        ),
        2
    );
    assert_eq!(origin.received().len(), 2);
    let lines = log_lines(&log, 6);
    assert_eq!(
        lines,
        vec![
            "200 MISS api",
            "200 HIT api",
            "429 BYPASS api",
            "200 HIT api",
            "429 BYPASS api",
            "404 MISS -"
        ]
    );
}

#[test]
fn a_request_edit_on_a_field_keys_its_own_entry() {
    let (origin, _rt) = origin();
    origin.script_by_header(
        "/v",
        "x-variant",
        vec![
            (
                Some("b"),
                Reply::ok(b"beta\n".to_vec()).headers(&[("Cache-Control", "max-age=60")]),
            ),
            (
                None,
                Reply::ok(b"stable\n".to_vec()).headers(&[("Cache-Control", "max-age=60")]),
            ),
        ],
    );
    let proxy = start(
        &origin,
        "    rules:\n      - name: beta\n        match: { cookies: [beta] }\n        request_headers: { set: { X-Variant: b } }\n",
        Opts::default(),
    );
    let mut c = proxy.client();
    let r = c.get("/v", &[("Cookie", "beta=1")]);
    assert_eq!(
        (r.x_cache(), r.body.as_slice()),
        ("MISS", b"beta\n".as_slice())
    );
    // Nobody without the cookie gets the beta's body from the cache.
    let r = c.get("/v", &[]);
    assert_eq!(
        (r.x_cache(), r.body.as_slice()),
        ("MISS", b"stable\n".as_slice())
    );
    // A client cannot ask for the variant by sending the field itself: it goes as sent, and the
    // key without the rule's part serves it the stable body.
    let r = c.get("/v", &[("X-Variant", "b")]);
    assert_eq!(r.body, b"stable\n");
    let r = c.get("/v", &[("Cookie", "beta=2")]);
    assert_eq!(
        (r.x_cache(), r.body.as_slice()),
        ("HIT", b"beta\n".as_slice())
    );
    assert_eq!(origin.hits("/v"), 2);
}

#[test]
fn a_reload_changes_the_rules_under_load_without_a_failed_request_and_refuses_a_line_break() {
    let (origin, _rt) = origin();
    let proxy = start(&origin, "", Opts::default());
    assert_eq!(proxy.get("/obj/1000").x_cache(), "MISS");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, mut c) = (stop.clone(), proxy.client());
        std::thread::spawn(move || {
            let (mut ok, mut tagged, mut bad) = (0u64, 0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c.get("/obj/1000", &[]);
                if r.status == 200 && r.body == body(1000) {
                    ok += 1;
                    tagged += u64::from(r.header("x-edge") == Some("2"));
                } else {
                    bad.push(r.status);
                }
            }
            (ok, tagged, bad)
        })
    };
    let text = std::fs::read_to_string(&proxy.config).expect("config");
    // A template with a line break in it: refused, the running rules kept.
    let broken = text.replace(
        "    name: site\n",
        "    name: site\n    rules:\n      - name: tag\n        response_headers: { set: { X-Edge: \"2\\r\\nSet-Cookie: a=1\" } }\n",
    );
    std::fs::write(&proxy.config, &broken).expect("rewrite");
    signal(&proxy, libc::SIGHUP);
    assert_eventually_eq(
        "the broken reload is refused",
        Duration::from_secs(10),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"rejected\"}",
            )
        },
        1,
    );
    let good = text.replace(
        "    name: site\n",
        "    name: site\n    rules:\n      - name: tag\n        response_headers: { set: { X-Edge: \"2\" } }\n",
    );
    std::fs::write(&proxy.config, &good).expect("rewrite");
    signal(&proxy, libc::SIGHUP);
    assert_eventually_eq(
        "the new rule answers",
        Duration::from_secs(10),
        || proxy.get("/obj/1000").header("x-edge").map(str::to_string),
        Some("2".to_string()),
    );
    // Some more requests under the new rules, then stop.
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, tagged, bad) = load.join().expect("load");
    assert_eq!(bad, Vec::<u16>::new());
    assert!(ok > tagged && tagged > 0, "ok {ok}, tagged {tagged}");
    assert_eq!(origin.hits("/obj/1000"), 1);
}

#[test]
fn a_canarys_answer_is_stored_apart_and_served_only_to_its_own_side() {
    let (stable, _rt1) = origin();
    let (canary, _rt2) = origin();
    let fresh = [("Cache-Control", "max-age=60")];
    stable.script("/c", Reply::ok(b"stable\n".to_vec()).headers(&fresh));
    canary.script("/c", Reply::ok(b"canary\n".to_vec()).headers(&fresh));
    let proxy = start(
        &stable,
        "    rules:\n      - name: canary\n        upstream: { to: canary, percent: 50, key: header:X-User }\n",
        Opts {
            upstream_yaml: format!("  canary:\n    servers: [\"{}\"]\n", canary.addr()),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    let mut sides = Vec::new();
    for i in 0..20 {
        let user = format!("u{i}");
        let first = c.get("/c", &[("X-User", &user)]).body;
        // Again, and from a fresh cache entry's point of view: the same side every time.
        let again = c.get("/c", &[("X-User", &user)]);
        assert_eq!((again.x_cache(), &again.body), ("HIT", &first), "{user}");
        sides.push(first == b"canary\n");
        assert!(first == b"canary\n" || first == b"stable\n");
    }
    let on_canary = sides.iter().filter(|c| **c).count();
    assert!((1..20).contains(&on_canary), "{sides:?}");
    // One fetch a side: each side's users shared its entry, and none got the other's.
    assert_eq!((stable.hits("/c"), canary.hits("/c")), (1, 1));
    let m = proxy.metrics();
    assert_eq!(
        metric(
            &m,
            "zerocache_rule_matches_total{route=\"site\",rule=\"canary\"}"
        ),
        40
    );
}

#[test]
fn a_rules_ttl_stores_a_max_age_0_response_for_its_time_but_never_a_no_store() {
    let (origin, _rt) = origin();
    origin.script(
        "/zero",
        Reply::ok(b"zero\n".to_vec()).headers(&[("Cache-Control", "max-age=0")]),
    );
    origin.script(
        "/never",
        Reply::ok(b"never\n".to_vec()).headers(&[("Cache-Control", "no-store")]),
    );
    let proxy = start(
        &origin,
        "    rules:\n      - name: pin\n        ttl: 5m\n",
        Opts::default(),
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/zero", &[]).x_cache(), "MISS");
    proxy.advance_clock(200);
    assert_eq!(c.get("/zero", &[]).x_cache(), "HIT");
    proxy.advance_clock(200);
    assert_eq!(c.get("/zero", &[]).x_cache(), "EXPIRED");
    assert_eq!(c.get("/never", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/never", &[]).x_cache(), "MISS");
    assert_eq!((origin.hits("/zero"), origin.hits("/never")), (2, 2));
}

#[test]
fn an_h2_stream_gets_the_same_field_edits_on_a_hit() {
    if !require::command("curl") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = start(
        &origin,
        "    rules:\n      - name: hsts\n        response_headers:\n          set: { Strict-Transport-Security: \"max-age=31536000\" }\n          append: { X-Via-Rule: \"$scheme $path\" }\n          remove: [Content-Type, ETag]\n",
        Opts {
            listen_options: "h2c: true".into(),
            ..Opts::default()
        },
    );
    let h2 = || {
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "-D",
                "-",
                "-o",
                "/dev/null",
                "--http2-prior-knowledge",
            ])
            .arg(format!("http://{}/obj/5000", proxy.addr))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
    };
    assert!(h2().contains("x-cache: miss\r\n"));
    let head = h2();
    assert!(head.starts_with("http/2 200"), "{head}");
    for (want, present) in [
        ("x-cache: hit\r\n", true),
        ("strict-transport-security: max-age=31536000\r\n", true),
        ("x-via-rule: http /obj/5000\r\n", true),
        ("content-length: 5000\r\n", true),
        ("content-type:", false),
        ("etag:", false),
    ] {
        assert_eq!(head.contains(want), present, "{want}: {head}");
    }
}
