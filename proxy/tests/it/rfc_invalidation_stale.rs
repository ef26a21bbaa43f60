//! HTTP caching semantics II: invalidation (RFC 9111 §4.4), serving stale (RFC 5861 and the
//! default grace), purge and bypass rules.

use crate::support::*;
use std::time::{Duration, Instant};

fn reply(body: &str, headers: &[(&str, &str)]) -> Reply {
    Reply::ok(body.as_bytes().to_vec()).headers(headers)
}

const FRESH: (&str, &str) = ("Cache-Control", "max-age=600");

#[test]
fn rfc9111_4_4_unsafe_methods_invalidate_the_target_uri() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for method in ["POST", "PUT", "DELETE", "PATCH", "M-SEARCH"] {
        let path = format!("/res-{}", method.to_ascii_lowercase());
        origin.script(&path, reply("r", &[FRESH]));
        c.get(&path, &[]);
        assert_eq!(c.get(&path, &[]).x_cache(), "HIT", "{method}");
        assert_eq!(c.send_with_body(method, &path, &[], b"x").status, 200);
        assert_eq!(c.get(&path, &[]).x_cache(), "MISS", "{method} invalidates");
    }
    // Safe methods do not.
    origin.script("/safe", reply("s", &[FRESH]));
    c.get("/safe", &[]);
    c.send_with_body("OPTIONS", "/safe", &[], b"");
    assert_eq!(c.get("/safe", &[]).x_cache(), "HIT");
    // Neither does an error response.
    origin.script("/err", reply("e", &[FRESH]));
    c.get("/err", &[]);
    origin.script("/err", reply("no", &[]).status(500));
    assert_eq!(c.send_with_body("POST", "/err", &[], b"x").status, 500);
    assert_eq!(c.get("/err", &[]).x_cache(), "HIT");
}

#[test]
fn rfc9111_4_4_location_and_content_location_on_the_same_origin_are_invalidated() {
    let (origin, _rt) = origin();
    for p in ["/items/7", "/other", "/items/8"] {
        origin.script(p, reply("i", &[FRESH]));
    }
    origin.script(
        "/items",
        reply(
            "created",
            &[
                ("Location", "/items/7"),
                ("Content-Location", "http://test.example/other"),
            ],
        )
        .status(201),
    );
    origin.script(
        "/items-x",
        reply(
            "created",
            &[("Location", "http://elsewhere.example/items/8")],
        )
        .status(201),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for p in ["/items/7", "/other", "/items/8"] {
        c.get(p, &[]);
        assert_eq!(c.get(p, &[]).x_cache(), "HIT");
    }
    assert_eq!(c.send_with_body("POST", "/items", &[], b"new").status, 201);
    assert_eq!(c.get("/items/7", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/other", &[]).x_cache(), "MISS");
    assert_eq!(
        c.send_with_body("POST", "/items-x", &[], b"new").status,
        201
    );
    assert_eq!(
        c.get("/items/8", &[]).x_cache(),
        "HIT",
        "another origin's Location is not ours to invalidate"
    );
}

#[test]
fn rfc5861_stale_while_revalidate_serves_stale_and_refreshes_once() {
    let (origin, _rt) = origin();
    origin.script(
        "/swr",
        reply(
            "v1",
            &[("Cache-Control", "max-age=1, stale-while-revalidate=30")],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/swr", &[]);
    proxy.advance_clock(2);
    origin.script(
        "/swr",
        reply("v2", &[("Cache-Control", "max-age=600")]).delay(Duration::from_secs(3)),
    );
    // During the refresh every request gets the stale copy; the origin sees one refresh. That
    // the answers did not wait is their content, not a clock: a request that waited for the
    // refresh (held back 3 s at the origin) would have been answered with v2.
    for _ in 0..5 {
        let r = c.get("/swr", &[]);
        assert_eq!((r.x_cache(), r.body.as_slice()), ("STALE", &b"v1"[..]));
    }
    until("the refresh landed", || {
        c.get("/swr", &[]).x_cache() == "HIT"
    });
    assert_eq!(c.get("/swr", &[]).body, b"v2");
    assert_eq!(origin.hits("/swr"), 2, "exactly one background refresh");
}

/// Waits for `done`, polling, for at most 10 s (a deadline for a background refresh to act, not
/// a bound on how fast it is): fails naming `what` did not happen.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A proxy in front of `origin` that stores bodies of at most 1 KiB.
fn storing_at_most_1kib(origin: &Origin) -> Proxy {
    Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  max_object_size: 1KiB\n".into(),
            ..Opts::default()
        },
    )
}

/// A background refresh is stored or not by the decision a client's fetch takes: an answer
/// that may not be stored (its own `no-store`, a body over `cache.max_object_size`) ends the
/// stale copy and is counted with its reason, as a client's would be.
#[test]
fn rfc5861_a_refresh_that_may_not_be_stored_ends_the_stale_copy_and_says_why() {
    let (origin, _rt) = origin();
    let proxy = storing_at_most_1kib(&origin);
    let mut c = proxy.client();
    let swr = ("Cache-Control", "max-age=1, stale-while-revalidate=30");
    for (path, then, reason) in [
        (
            "/no-store",
            reply("v2", &[("Cache-Control", "no-store")]),
            "response-directive",
        ),
        (
            "/too-large",
            reply(&"x".repeat(2048), &[("Cache-Control", "max-age=600")]),
            "too-large",
        ),
    ] {
        origin.script(path, reply("v1", &[swr]));
        assert_eq!(c.get(path, &[]).x_cache(), "MISS");
        proxy.advance_clock(2);
        origin.script(path, then);
        let r = c.get(path, &[]);
        assert_eq!(
            (r.x_cache(), r.body.as_slice()),
            ("STALE", &b"v1"[..]),
            "{path}"
        );
        // The refresh lands when the stale copy is gone: the next request goes to the origin.
        until(&format!("{path}: the stale copy went"), || {
            c.get(path, &[]).x_cache() != "STALE"
        });
        // Once for the refresh, once for the fetch that followed it.
        let series = format!("zerocache_cache_not_stored_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&proxy.metrics(), &series), 2, "{path}: {series}");
    }
}

/// A refresh of unknown length refused only because the URL's last fill ran past the bound
/// (here another variant's) is refused on a guess, not for what the resource is: the stale
/// copy stands.
#[test]
fn rfc5861_a_refresh_refused_on_a_guess_keeps_the_stale_copy() {
    let (origin, _rt) = origin();
    let proxy = storing_at_most_1kib(&origin);
    let mut c = proxy.client();
    let gzip = [("Accept-Encoding", "gzip")];
    let swr = [
        ("Cache-Control", "max-age=1, stale-while-revalidate=30"),
        ("Vary", "Accept-Encoding"),
    ];
    origin.script("/v", reply("small", &swr));
    assert_eq!(c.get("/v", &gzip).x_cache(), "MISS");
    assert_eq!(c.get("/v", &gzip).x_cache(), "HIT");
    // Another variant, chunked and too large: found out as it streams.
    origin.script(
        "/v",
        reply(&"x".repeat(4096), &swr).framing(Framing::Chunked(512)),
    );
    let r = c.get("/v", &[]);
    assert_eq!((r.x_cache(), r.body.len()), ("MISS", 4096));
    let too_large = "zerocache_cache_not_stored_total{reason=\"too-large\"}";
    assert_eq!(metric(&proxy.metrics(), too_large), 1);
    proxy.advance_clock(2);
    origin.script(
        "/v",
        reply("small again", &swr).framing(Framing::Chunked(512)),
    );
    let r = c.get("/v", &gzip);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("STALE", &b"small"[..]));
    // The refresh is refused as too large, once.
    until("the refresh ended", || {
        metric(&proxy.metrics(), too_large) >= 2
    });
    let r = c.get("/v", &gzip);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("STALE", &b"small"[..]));
}

/// A refresh refused for what its request said (the client's `Cache-Control: no-store`) says
/// nothing of the resource: one client must not end the copy the others are served. The stale
/// copy stands, the refusal is counted with its reason, and the next client's refresh stores.
#[test]
fn rfc5861_a_refresh_refused_for_its_request_keeps_the_stale_copy() {
    let (origin, _rt) = origin();
    let proxy = storing_at_most_1kib(&origin);
    let mut c = proxy.client();
    let swr = [("Cache-Control", "max-age=1, stale-while-revalidate=30")];
    origin.script("/r", reply("v1", &swr));
    assert_eq!(c.get("/r", &[]).x_cache(), "MISS");
    proxy.advance_clock(2);
    origin.script("/r", reply("v2", &[("Cache-Control", "max-age=600")]));
    let r = c.get("/r", &[("Cache-Control", "no-store")]);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("STALE", &b"v1"[..]));
    let refused = "zerocache_cache_not_stored_total{reason=\"request-no-store\"}";
    // The series is printed once counted: until then it is absent, not 0.
    until("the refresh ended", || {
        let m = proxy.metrics();
        m.lines().any(|l| l.starts_with(refused)) && metric(&m, refused) >= 1
    });
    assert_eq!(origin.hits("/r"), 2);
    // Still the stale copy, and this client's refresh stores the new one.
    let r = c.get("/r", &[]);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("STALE", &b"v1"[..]));
    until("the second refresh stored", || {
        c.get("/r", &[]).x_cache() == "HIT"
    });
    assert_eq!(c.get("/r", &[]).body, b"v2");
    assert_eq!(metric(&proxy.metrics(), refused), 1);
    assert_eq!(origin.hits("/r"), 3);
}

fn stale_then(
    origin_failure: impl FnOnce(&Origin),
    headers: &[(&str, &str)],
) -> (Response, Proxy, Origin, tokio::runtime::Runtime) {
    let (origin, rt) = origin();
    origin.script("/s", reply("old", headers));
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            upstream_yaml: "    read_timeout: 1s\n".into(),
            ..Opts::default()
        },
    );
    proxy.get("/s");
    proxy.advance_clock(2);
    origin_failure(&origin);
    let r = proxy.get("/s");
    (r, proxy, origin, rt)
}

#[test]
fn rfc5861_stale_if_error_and_the_default_grace_on_5xx_and_early_close() {
    for (name, fail) in [
        (
            "503",
            Box::new(|o: &Origin| o.script("/s", reply("down", &[]).status(503)))
                as Box<dyn FnOnce(&Origin)>,
        ),
        (
            "hang-up",
            Box::new(|o: &Origin| o.script("/s", Reply::hang_up())),
        ),
        (
            "timeout",
            Box::new(|o: &Origin| o.script("/s", reply("late", &[]).delay(Duration::from_secs(3)))),
        ),
    ] {
        // No stale-if-error: the default 60 s grace applies.
        let (r, ..) = stale_then(fail, &[("Cache-Control", "max-age=1")]);
        assert_eq!(
            (r.status, r.x_cache(), r.body.as_slice()),
            (200, "STALE", &b"old"[..]),
            "{name}"
        );
    }
    // An explicit stale-if-error shorter than the staleness: the error passes through.
    let (r, ..) = stale_then(
        |o| o.script("/s", reply("down", &[]).status(503)),
        &[("Cache-Control", "max-age=1, stale-if-error=0")],
    );
    assert_eq!(r.status, 503);
}

#[test]
fn rfc5861_stale_on_connection_refused() {
    let (origin, rt) = origin();
    origin.script("/s", reply("old", &[("Cache-Control", "max-age=1")]));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    proxy.get("/s");
    proxy.advance_clock(2);
    drop(origin); // The listener is gone: connections are refused.
    drop(rt);
    let r = proxy.get("/s");
    assert_eq!(
        (r.status, r.x_cache(), r.body.as_slice()),
        (200, "STALE", &b"old"[..])
    );
}

#[test]
fn rfc9111_must_revalidate_and_no_cache_forbid_serving_stale() {
    for cc in [
        "max-age=1, must-revalidate",
        "max-age=1, proxy-revalidate",
        "no-cache",
    ] {
        let (r, ..) = stale_then(
            |o| o.script("/s", reply("down", &[]).status(503)),
            &[("Cache-Control", cc), ("ETag", "\"e\"")],
        );
        assert_eq!(r.status, 503, "{cc}");
    }
}

#[test]
fn rfc9111_5_2_2_10_s_maxage_forbids_serving_stale_when_the_upstream_fails() {
    // s-maxage carries proxy-revalidate's meaning for a shared cache: no stale, not even in the
    // default grace, whether the origin answers 503 or closes the connection.
    for (name, fail) in [
        (
            "503",
            Box::new(|o: &Origin| o.script("/s", reply("down", &[]).status(503)))
                as Box<dyn FnOnce(&Origin)>,
        ),
        (
            "hang-up",
            Box::new(|o: &Origin| o.script("/s", Reply::hang_up())),
        ),
    ] {
        let (r, ..) = stale_then(
            fail,
            &[
                ("Cache-Control", "max-age=1, s-maxage=1"),
                ("ETag", "\"e\""),
            ],
        );
        assert_ne!(r.x_cache(), "STALE", "{name}");
        assert_eq!(r.status, if name == "503" { 503 } else { 502 }, "{name}");
    }
}

#[test]
fn purge_one_url_with_its_variants_and_by_prefix() {
    let (origin, _rt) = origin();
    let v = |b: &str| reply(b, &[FRESH, ("Vary", "Accept-Language")]);
    origin.script_by_header(
        "/p/a",
        "accept-language",
        vec![(Some("en"), v("en")), (Some("fr"), v("fr"))],
    );
    for p in ["/p/b", "/q"] {
        origin.script(p, reply("x", &[FRESH]));
    }
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/p/a", &[("Accept-Language", "en")]);
    c.get("/p/a", &[("Accept-Language", "fr")]);
    c.get("/p/b", &[]);
    c.get("/q", &[]);
    assert_eq!(
        proxy.purge(r#"{"url": "http://test.example/p/a"}"#),
        (200, serde_json::json!({"purged": 2}))
    );
    assert_eq!(
        c.get("/p/a", &[("Accept-Language", "fr")]).x_cache(),
        "MISS"
    );
    assert_eq!(c.get("/p/b", &[]).x_cache(), "HIT");
    assert_eq!(
        proxy.purge(r#"{"prefix": "http://test.example/p/"}"#),
        (200, serde_json::json!({"purged": 2}))
    );
    assert_eq!(c.get("/p/b", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/q", &[]).x_cache(), "HIT");
    assert_eq!(proxy.purge(r#"{"url": "nonsense"}"#).0, 400);
    assert_eq!(
        proxy
            .purge(r#"{"url": "http://a/", "prefix": "http://a/"}"#)
            .0,
        400
    );
}

#[test]
fn purge_during_an_in_flight_64mib_hit_lets_it_finish_and_serves_no_one_after() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    const BIG: usize = 64 << 20;
    assert_eq!(proxy.get("/obj/67108864").body.len(), BIG);
    let reader = slow_64mib_hit(&proxy, Duration::from_millis(5));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        proxy.purge(r#"{"url": "http://test.example/obj/67108864"}"#),
        (200, serde_json::json!({"purged": 1}))
    );
    assert_eq!(proxy.get("/obj/10").x_cache(), "MISS");
    let after = proxy.client().request("HEAD", "/obj/67108864", &[]);
    assert_ne!(
        after.x_cache(),
        "HIT",
        "a request after the purge answered is never served the entry"
    );
    assert_complete_64mib_hit(&reader.join().expect("reader"));
}

#[test]
fn bypass_rules_skip_the_cache() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    bypass:\n      cookies: [session]\n      headers: [X-Debug]\n      paths: [/admin]\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    for (path, h) in [
        ("/obj/5", vec![("Cookie", "a=1; session=xyz")]),
        ("/obj/6", vec![("X-Debug", "1")]),
        ("/admin/obj", vec![]),
    ] {
        for _ in 0..2 {
            let r = c.get(path, &h);
            assert_eq!(r.x_cache(), "BYPASS", "{path}");
            assert_eq!(r.cache_status().as_deref(), Some("zerocache; fwd=bypass"));
        }
    }
    c.get("/obj/5", &[("Cookie", "sessionx=1")]);
    assert_eq!(
        c.get("/obj/5", &[]).x_cache(),
        "HIT",
        "a different cookie name does not bypass"
    );
}

/// A soft purge (`"soft": true`) keeps the entry and ends its freshness: the next request
/// revalidates it (a 304 refreshes it, nothing fetched again), a failing origin is answered
/// from it within the stale grace, and it stays stale across a restart (the header on disk
/// says so). A hard purge of the same URL removes it.
#[test]
fn a_soft_purge_makes_entries_stale_not_gone_and_survives_a_restart() {
    let (origin, _rt) = origin();
    let fresh = [("Cache-Control", "max-age=3600"), ("ETag", "\"s1\"")];
    origin.script("/soft/a", reply("version one", &fresh));
    origin.script("/soft/b", reply("bee", &fresh));
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/soft/a", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/soft/b", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/soft/a", &[]).x_cache(), "HIT");
    assert_eq!(
        proxy.purge(r#"{"url": "http://test.example/soft/a", "soft": true}"#),
        (200, serde_json::json!({"purged": 1}))
    );
    // Revalidated: the origin is asked with the stored validator and answers 304.
    origin.script(
        "/soft/a",
        Reply::ok(Vec::new())
            .status(304)
            .headers(&[("ETag", "\"s1\""), ("Cache-Control", "max-age=3600")]),
    );
    let r = c.get("/soft/a", &[]);
    assert_eq!(
        (r.x_cache(), r.body.as_slice()),
        ("REVALIDATED", &b"version one"[..])
    );
    assert_eq!(
        origin
            .received()
            .last()
            .and_then(|r| r.header("if-none-match").map(str::to_string)),
        Some("\"s1\"".to_string())
    );
    assert_eq!(c.get("/soft/a", &[]).x_cache(), "HIT");
    // Soft-purged by prefix, then the origin fails: the stale entry answers (stale_grace).
    assert_eq!(
        proxy.purge(r#"{"prefix": "http://test.example/soft/", "soft": true}"#),
        (200, serde_json::json!({"purged": 2}))
    );
    origin.script("/soft/b", Reply::ok(b"down".to_vec()).status(503));
    let r = c.get("/soft/b", &[]);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("STALE", &b"bee"[..]));
    // Across a restart the entry is still stale: asked again, not served as a HIT.
    assert_eq!(proxy.stop().code(), Some(0));
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    let mut c = proxy.client();
    let hits = origin.hits("/soft/b");
    let r = c.get("/soft/b", &[]);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("STALE", &b"bee"[..]));
    assert_eq!(origin.hits("/soft/b"), hits + 1);
    // A hard purge removes it.
    assert_eq!(
        proxy.purge(r#"{"url": "http://test.example/soft/b"}"#),
        (200, serde_json::json!({"purged": 1}))
    );
    origin.script("/soft/b", reply("bee two", &fresh));
    assert_eq!(c.get("/soft/b", &[]).x_cache(), "MISS");
}
