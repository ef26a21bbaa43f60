//! HTTP caching semantics against a scriptable origin, one test per rule, named after the RFC
//! section it checks. Every test that expects a hit also checks, from the proxy's own accounting,
//! that the hit's body went out through sendfile.

use crate::support::*;
use std::time::{Duration, SystemTime};

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

fn reply(body: &str, headers: &[(&str, &str)]) -> Reply {
    Reply::ok(body.as_bytes().to_vec()).headers(headers)
}

fn not_modified(headers: &[(&str, &str)]) -> Reply {
    Reply::ok(Vec::new()).status(304).headers(headers)
}

#[test]
fn rfc9111_3_any_final_status_with_explicit_freshness_is_stored() {
    let (origin, _rt) = origin();
    origin.script(
        "/404",
        reply("gone", &[("Cache-Control", "max-age=60")]).status(404),
    );
    origin.script(
        "/500",
        reply("oops", &[("Cache-Control", "max-age=60")]).status(500),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    for path in ["/404", "/500"] {
        let mut c = proxy.client();
        let first = c.get(path, &[]);
        let before = zero_copy_bytes(&proxy);
        let second = c.get(path, &[]);
        assert_eq!(second.status, first.status);
        assert_hit(&proxy, &second, "HIT", &first.body, before);
        assert_eq!(origin.hits(path), 1);
    }
}

#[test]
fn rfc9111_4_2_2_heuristic_freshness_for_heuristically_cacheable_statuses_only() {
    let (origin, _rt) = origin();
    let now = SystemTime::now();
    let lm = http_date(now - Duration::from_secs(10_000));
    let date = http_date(now);
    origin.script(
        "/h200",
        reply("heuristic", &[("Last-Modified", &lm), ("Date", &date)]),
    );
    origin.script(
        "/h500",
        reply("nope", &[("Last-Modified", &lm), ("Date", &date)]).status(500),
    );
    origin.script(
        "/h-nocache",
        reply(
            "nope",
            &[("Last-Modified", &lm), ("Cache-Control", "no-store")],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/h200", &[]);
    let before = zero_copy_bytes(&proxy);
    let r = c.get("/h200", &[]);
    assert_hit(&proxy, &r, "HIT", b"heuristic", before);
    // 10% of 10,000 s.
    let ttl: i64 = r
        .header("cache-status")
        .and_then(|v| v.split("ttl=").nth(1))
        .and_then(|t| t.parse().ok())
        .expect("ttl");
    assert!((998..=1000).contains(&ttl), "ttl {ttl}");
    for p in ["/h500", "/h-nocache"] {
        c.get(p, &[]);
        assert_eq!(c.get(p, &[]).x_cache(), "MISS", "{p}");
    }
}

#[test]
fn rfc9111_3_1_fields_stored_as_received_including_set_cookie_minus_hop_by_hop() {
    let (origin, _rt) = origin();
    origin.script(
        "/cookie",
        reply(
            "c",
            &[
                ("Cache-Control", "max-age=60"),
                ("Set-Cookie", "a=b"),
                ("Connection", "X-Hop"),
                ("X-Hop", "1"),
                ("X-Other", "2"),
            ],
        ),
    );
    // Where the route opts in to storing cookies (off by default: see `poisoning`).
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    store_set_cookie: true\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    c.get("/cookie", &[]);
    let before = zero_copy_bytes(&proxy);
    let r = c.get("/cookie", &[]);
    assert_hit(&proxy, &r, "HIT", b"c", before);
    assert_eq!(
        (
            r.header("set-cookie"),
            r.header("x-other"),
            r.header("x-hop")
        ),
        (Some("a=b"), Some("2"), None)
    );
}

#[test]
fn rfc9111_4_2_1_invalid_expires_means_stale() {
    let (origin, _rt) = origin();
    origin.script("/exp0", reply("e", &[("Expires", "0")]));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/exp0", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/exp0", &[]).x_cache(), "EXPIRED");
    assert_eq!(origin.hits("/exp0"), 2);
}

/// The HTTP cache conformance suite's `freshness-expires-invalid-*` forms, each a year ahead but
/// not one of RFC 9110's three date formats (or, last, two Expires lines), so already expired
/// (RFC 9111 §5.3); beside them the valid forms, fresh.
#[test]
fn rfc9111_5_3_expires_not_in_the_three_formats_is_already_expired() {
    let (origin, _rt) = origin();
    let year = 1970
        + SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            / 31_556_952
        + 2;
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "/x1",
            vec![format!("Mon, 02 Jan {year} 1:00:00 GMT")],
            "EXPIRED",
        ),
        (
            "/x2",
            vec![format!("Mon, 02-Jan-{year} 10:00:00 GMT")],
            "EXPIRED",
        ),
        (
            "/x3",
            vec![format!("Mon,  02 Jan {year} 10:00:00 GMT")],
            "EXPIRED",
        ),
        (
            "/x4",
            vec![format!("Mon, 02 Jan {year} 10:00:00 UTC")],
            "EXPIRED",
        ),
        (
            "/x5",
            vec![
                format!("Mon, 02 Jan {year} 10:00:00 GMT"),
                format!("Tue, 03 Jan {year} 10:00:00 GMT"),
            ],
            "EXPIRED",
        ),
        (
            "/ok1",
            vec![format!("Mon, 02 Jan {year} 10:00:00 GMT")],
            "HIT",
        ),
        (
            "/ok2",
            vec![format!("mOn, 02 jAn {year} 10:00:00 gmt")],
            "HIT",
        ),
        ("/ok3", vec![format!("Mon Jan  2 10:00:00 {year}")], "HIT"),
    ];
    for (path, expires, _) in &cases {
        let fields: Vec<(&str, &str)> = expires.iter().map(|e| ("Expires", e.as_str())).collect();
        origin.script(path, reply("e", &fields));
    }
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for (path, expires, second) in &cases {
        assert_eq!(c.get(path, &[]).x_cache(), "MISS", "{path}");
        assert_eq!(c.get(path, &[]).x_cache(), *second, "{path}: {expires:?}");
    }
}

#[test]
fn rfc9111_4_2_3_age_is_carried_and_grows() {
    let (origin, _rt) = origin();
    let date = http_date(SystemTime::now() - Duration::from_secs(50));
    origin.script(
        "/aged",
        reply(
            "a",
            &[
                ("Cache-Control", "max-age=3600"),
                ("Age", "100"),
                ("Date", &date),
            ],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/aged", &[]);
    let before = zero_copy_bytes(&proxy);
    let r = c.get("/aged", &[]);
    assert_hit(&proxy, &r, "HIT", b"a", before);
    let age: u64 = r.header("age").and_then(|a| a.parse().ok()).expect("age");
    // Age 100 plus the response delay beats the apparent age of 50 s.
    assert!((100..=101).contains(&age), "age {age}");
    proxy.advance_clock(2);
    let later: u64 = c
        .get("/aged", &[])
        .header("age")
        .and_then(|a| a.parse().ok())
        .expect("age");
    assert!(later > age, "{later} after {age}");
}

#[test]
fn rfc9111_4_2_1_duplicate_directives_use_the_first() {
    let (origin, _rt) = origin();
    origin.script(
        "/dup",
        reply("d", &[("Cache-Control", "max-age=60, max-age=0")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/dup", &[]);
    let before = zero_copy_bytes(&proxy);
    assert_hit(&proxy, &c.get("/dup", &[]), "HIT", b"d", before);
}

#[test]
fn rfc9111_4_3_4_a_304_updates_the_stored_fields_and_is_served_through_sendfile() {
    let (origin, _rt) = origin();
    origin.script(
        "/val",
        reply(
            "validated body",
            &[
                ("Cache-Control", "max-age=1"),
                ("ETag", "\"v1\""),
                ("X-Version", "1"),
            ],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/val", &[]).x_cache(), "MISS");
    proxy.advance_clock(2);
    origin.script(
        "/val",
        not_modified(&[
            ("Cache-Control", "max-age=60"),
            ("ETag", "\"v1\""),
            ("X-Version", "2"),
        ]),
    );
    let before = zero_copy_bytes(&proxy);
    let r = c.get("/val", &[]);
    assert_hit(&proxy, &r, "REVALIDATED", b"validated body", before);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-version"),
        Some("2"),
        "the 304's fields replace the stored ones"
    );
    assert_eq!(
        r.cache_status().as_deref(),
        Some("zerocache; fwd=stale; fwd-status=304")
    );
    let sent = origin
        .received()
        .into_iter()
        .rfind(|q| q.path == "/val")
        .expect("revalidation");
    assert_eq!(sent.header("if-none-match"), Some("\"v1\""));
    // Now fresh for 60 s, with the new fields.
    let before = zero_copy_bytes(&proxy);
    let r = c.get("/val", &[]);
    assert_hit(&proxy, &r, "HIT", b"validated body", before);
    assert_eq!(r.header("x-version"), Some("2"));
    assert_eq!(origin.hits("/val"), 2);
}

#[test]
fn rfc9111_3_2_the_updated_fields_survive_a_restart() {
    let (origin, _rt) = origin();
    origin.script(
        "/val",
        reply(
            "v",
            &[
                ("Cache-Control", "max-age=1"),
                ("ETag", "\"v1\""),
                ("X-Version", "1"),
            ],
        ),
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    proxy.get("/val");
    proxy.advance_clock(2);
    origin.script(
        "/val",
        not_modified(&[("Cache-Control", "max-age=600"), ("X-Version", "2")]),
    );
    assert_eq!(proxy.get("/val").x_cache(), "REVALIDATED");
    proxy.kill9();
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    let before = zero_copy_bytes(&proxy);
    let r = proxy.get("/val");
    assert_hit(&proxy, &r, "HIT", b"v", before);
    assert_eq!(r.header("x-version"), Some("2"));
}

#[test]
fn rfc9111_4_3_3_a_200_to_a_revalidation_replaces_the_entry() {
    let (origin, _rt) = origin();
    let lm = http_date(SystemTime::now() - Duration::from_secs(3600));
    origin.script(
        "/rep",
        reply(
            "old",
            &[("Cache-Control", "max-age=1"), ("Last-Modified", &lm)],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/rep", &[]);
    proxy.advance_clock(2);
    origin.script("/rep", reply("new", &[("Cache-Control", "max-age=60")]));
    let r = c.get("/rep", &[]);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("EXPIRED", &b"new"[..]));
    let sent = origin
        .received()
        .into_iter()
        .rfind(|q| q.path == "/rep")
        .expect("sent");
    assert_eq!(sent.header("if-modified-since"), Some(lm.as_str()));
    let before = zero_copy_bytes(&proxy);
    assert_hit(&proxy, &c.get("/rep", &[]), "HIT", b"new", before);
}

#[test]
fn rfc9111_5_2_2_4_no_cache_responses_are_stored_and_revalidated_every_time() {
    let (origin, _rt) = origin();
    origin.script(
        "/nc",
        reply(
            "nc body",
            &[("Cache-Control", "no-cache"), ("ETag", "\"n\"")],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/nc", &[]);
    origin.script("/nc", not_modified(&[("ETag", "\"n\"")]));
    for _ in 0..2 {
        let before = zero_copy_bytes(&proxy);
        assert_hit(
            &proxy,
            &c.get("/nc", &[]),
            "REVALIDATED",
            b"nc body",
            before,
        );
    }
    assert_eq!(origin.hits("/nc"), 3);
}

#[test]
fn rfc9111_5_2_2_7_qualified_private_fields_are_not_stored() {
    let (origin, _rt) = origin();
    origin.script(
        "/pf",
        reply(
            "p",
            &[
                ("Cache-Control", "max-age=60, private=\"X-User\""),
                ("X-User", "alice"),
                ("X-Shared", "1"),
            ],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(
        c.get("/pf", &[]).header("x-user"),
        Some("alice"),
        "the first client still gets it"
    );
    let before = zero_copy_bytes(&proxy);
    let r = c.get("/pf", &[]);
    assert_hit(&proxy, &r, "HIT", b"p", before);
    assert_eq!(
        (r.header("x-user"), r.header("x-shared")),
        (None, Some("1"))
    );
}

#[test]
fn rfc9111_5_2_1_1_request_max_age_and_5_2_1_4_no_cache_revalidate() {
    let (origin, _rt) = origin();
    origin.script(
        "/rq",
        reply("rq", &[("Cache-Control", "max-age=600"), ("ETag", "\"r\"")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/rq", &[]);
    origin.script(
        "/rq",
        not_modified(&[("ETag", "\"r\""), ("Cache-Control", "max-age=600")]),
    );
    proxy.advance_clock(2);
    for (name, value) in [
        ("Cache-Control", "max-age=0"),
        ("Cache-Control", "no-cache"),
        ("Pragma", "no-cache"),
    ] {
        let before = zero_copy_bytes(&proxy);
        assert_hit(
            &proxy,
            &c.get("/rq", &[(name, value)]),
            "REVALIDATED",
            b"rq",
            before,
        );
    }
    // Without directives, it is still fresh.
    let before = zero_copy_bytes(&proxy);
    assert_hit(&proxy, &c.get("/rq", &[]), "HIT", b"rq", before);
    assert_eq!(origin.hits("/rq"), 4);
}

#[test]
fn rfc9111_5_2_1_3_min_fresh_and_5_2_1_2_max_stale() {
    let (origin, _rt) = origin();
    origin.script(
        "/mf",
        reply("mf", &[("Cache-Control", "max-age=1"), ("ETag", "\"m\"")]),
    );
    origin.script(
        "/mr",
        reply(
            "mr",
            &[
                ("Cache-Control", "max-age=1, must-revalidate"),
                ("ETag", "\"m\""),
            ],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/mf", &[]);
    c.get("/mr", &[]);
    // min-fresh beyond the remaining lifetime: revalidate.
    origin.script(
        "/mf",
        not_modified(&[("ETag", "\"m\""), ("Cache-Control", "max-age=1")]),
    );
    assert_eq!(
        c.get("/mf", &[("Cache-Control", "min-fresh=30")]).x_cache(),
        "REVALIDATED"
    );
    // The revalidated hit is recorded once its last send returns, which can be after the client
    // has it all: counted before the baseline is read, or the next hit's count would include it.
    assert_eventually_eq(
        "the revalidated hit recorded",
        std::time::Duration::from_secs(5),
        || zero_copy_bytes(&proxy),
        2,
    );
    proxy.advance_clock(2);
    // Stale, but the client accepts up to 100 s of staleness: served without asking the origin.
    let hits = origin.hits("/mf");
    let before = zero_copy_bytes(&proxy);
    assert_hit(
        &proxy,
        &c.get("/mf", &[("Cache-Control", "max-stale=100")]),
        "STALE",
        b"mf",
        before,
    );
    assert_eq!(origin.hits("/mf"), hits);
    // must-revalidate forbids it.
    origin.script("/mr", not_modified(&[("ETag", "\"m\"")]));
    assert_eq!(
        c.get("/mr", &[("Cache-Control", "max-stale")]).x_cache(),
        "REVALIDATED"
    );
}

#[test]
fn rfc9111_5_2_1_5_request_no_store_and_5_2_1_7_only_if_cached() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(
        c.get("/obj/10", &[("Cache-Control", "no-store")]).x_cache(),
        "MISS"
    );
    assert_eq!(
        c.get("/obj/10", &[("Cache-Control", "only-if-cached")])
            .status,
        504
    );
    c.get("/obj/10", &[]);
    let before = zero_copy_bytes(&proxy);
    assert_hit(
        &proxy,
        &c.get("/obj/10", &[("Cache-Control", "only-if-cached")]),
        "HIT",
        &body(10),
        before,
    );
    assert_eq!(origin.hits("/obj/10"), 2);
}

#[test]
fn rfc8246_immutable_fresh_responses_skip_revalidation() {
    let (origin, _rt) = origin();
    origin.script(
        "/imm",
        reply("i", &[("Cache-Control", "max-age=600, immutable")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/imm", &[]);
    let before = zero_copy_bytes(&proxy);
    assert_hit(
        &proxy,
        &c.get("/imm", &[("Cache-Control", "no-cache")]),
        "HIT",
        b"i",
        before,
    );
    assert_eq!(origin.hits("/imm"), 1);
}

#[test]
fn rfc9110_13_client_conditionals_are_answered_from_the_cache() {
    let (origin, _rt) = origin();
    let lm = "Sat, 01 Jan 2000 00:00:00 GMT";
    origin.script(
        "/cond",
        reply(
            "0123456789",
            &[
                ("Cache-Control", "max-age=600"),
                ("ETag", "\"c1\""),
                ("Last-Modified", lm),
            ],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/cond", &[]);
    let r = c.get("/cond", &[("If-None-Match", "W/\"c1\"")]);
    assert_eq!((r.status, r.x_cache(), r.body.len()), (304, "HIT", 0));
    assert_eq!(
        (r.header("etag"), r.header("content-length")),
        (Some("\"c1\""), None)
    );
    assert_eq!(c.get("/cond", &[("If-Modified-Since", lm)]).status, 304);
    assert_eq!(c.get("/cond", &[("If-Match", "\"other\"")]).status, 412);
    assert_eq!(
        c.get(
            "/cond",
            &[("If-Unmodified-Since", "Fri, 31 Dec 1999 00:00:00 GMT")]
        )
        .status,
        412
    );
    let r = c.get("/cond", &[("Range", "bytes=2-4"), ("If-Range", "\"c1\"")]);
    assert_eq!((r.status, r.body.as_slice()), (206, &b"234"[..]));
    let r = c.get("/cond", &[("Range", "bytes=2-4"), ("If-Range", "\"old\"")]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"0123456789"[..]));
    let before = zero_copy_bytes(&proxy);
    assert_hit(
        &proxy,
        &c.get("/cond", &[("If-None-Match", "\"other\"")]),
        "HIT",
        b"0123456789",
        before,
    );
    assert_eq!(origin.hits("/cond"), 1, "all answered from the cache");
}

#[test]
fn rfc9111_4_1_vary_stores_variants_side_by_side() {
    let (origin, _rt) = origin();
    let v = |b: &str| {
        reply(
            b,
            &[
                ("Cache-Control", "max-age=600"),
                ("Vary", "Accept-Encoding"),
            ],
        )
    };
    origin.script_by_header(
        "/vary",
        "accept-encoding",
        vec![
            (Some("gzip"), v("gzip body")),
            (Some("br"), v("br body")),
            (None, v("plain body")),
        ],
    );
    origin.script(
        "/star",
        reply("star", &[("Cache-Control", "max-age=600"), ("Vary", "*")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for (ae, body) in [
        (Some("gzip"), "gzip body"),
        (Some("br"), "br body"),
        (None, "plain body"),
    ] {
        let h: Vec<(&str, &str)> = ae.map(|a| vec![("Accept-Encoding", a)]).unwrap_or_default();
        assert_eq!(c.get("/vary", &h).x_cache(), "MISS");
        let before = zero_copy_bytes(&proxy);
        assert_hit(&proxy, &c.get("/vary", &h), "HIT", body.as_bytes(), before);
    }
    // Normalised: case and whitespace do not make a new variant.
    let before = zero_copy_bytes(&proxy);
    assert_hit(
        &proxy,
        &c.get("/vary", &[("Accept-Encoding", " GZIP ")]),
        "HIT",
        b"gzip body",
        before,
    );
    assert_eq!(origin.hits("/vary"), 3);
    // Vary: * never matches.
    c.get("/star", &[]);
    assert_eq!(c.get("/star", &[]).x_cache(), "MISS");
}

/// `Accept-Encoding` is normalised to the route's codings (default `[br, gzip]`) before the key
/// and the upstream request (issue #32): what Chrome, curl and Safari send is one variant, asked
/// of the origin as `br, gzip`; Python's `gzip, deflate` is `gzip`; a client accepting none of
/// them is identity, the field removed. `as-sent` forwards the field untouched.
#[test]
fn accept_encoding_is_normalised_to_the_routes_codings() {
    let (origin, _rt) = origin();
    let v = |b: &str| {
        reply(
            b,
            &[
                ("Cache-Control", "max-age=600"),
                ("Vary", "Accept-Encoding"),
            ],
        )
    };
    origin.script("/ae", v("not a canonical value"));
    origin.script_by_header(
        "/ae",
        "accept-encoding",
        vec![
            (Some("br, gzip"), v("br body")),
            (Some("gzip"), v("gzip body")),
            (Some("identity"), v("identity body")),
            (None, v("plain body")),
        ],
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for (sent, x_cache, body) in [
        (Some("gzip, deflate, br, zstd"), "MISS", "br body"), // Chrome, Firefox
        (Some("br, gzip"), "HIT", "br body"),
        (Some("deflate, gzip, br, zstd"), "HIT", "br body"), // curl --compressed
        (Some("gzip, deflate, br"), "HIT", "br body"),       // Safari
        (Some("gzip, deflate"), "MISS", "gzip body"),        // Python requests
        (Some("gzip"), "HIT", "gzip body"),                  // Go
        (Some("br;q=0, gzip"), "HIT", "gzip body"),
        (None, "MISS", "plain body"), // curl: no preference
        // Accepting none of the route's codings asks for none: identity, not "no preference".
        (Some("identity"), "MISS", "identity body"),
        (Some("deflate"), "HIT", "identity body"),
        (Some("gzip;q=2"), "HIT", "identity body"),
    ] {
        let h: Vec<(&str, &str)> = sent
            .map(|a| vec![("Accept-Encoding", a)])
            .unwrap_or_default();
        let r = c.get("/ae", &h);
        assert_eq!(
            (r.x_cache(), r.body.as_slice()),
            (x_cache, body.as_bytes()),
            "{sent:?}"
        );
    }
    let asked: Vec<Option<String>> = origin
        .received()
        .iter()
        .filter(|r| r.path == "/ae")
        .map(|r| r.header("accept-encoding").map(str::to_string))
        .collect();
    assert_eq!(
        asked,
        [
            Some("br, gzip".to_string()),
            Some("gzip".into()),
            None,
            Some("identity".into())
        ]
    );
    // A bypassed request keeps the client's field.
    let bypassing = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    bypass:\n      headers: [X-No-Cache]\n".into(),
            ..Opts::default()
        },
    );
    bypassing.client().get(
        "/ae",
        &[("Accept-Encoding", "gzip, deflate"), ("X-No-Cache", "1")],
    );
    let last = origin.received().pop().expect("asked");
    assert_eq!(last.header("accept-encoding"), Some("gzip, deflate"));

    let as_sent = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    accept_encoding: as-sent\n".into(),
            ..Opts::default()
        },
    );
    let r = as_sent
        .client()
        .get("/ae", &[("Accept-Encoding", "gzip, deflate")]);
    assert_eq!(r.body, b"not a canonical value");
    let last = origin.received().pop().expect("asked");
    assert_eq!(last.header("accept-encoding"), Some("gzip, deflate"));
}

#[test]
fn rfc9111_5_1_age_is_forwarded_verbatim_and_parsed_strictly_for_the_stored_copy() {
    let (origin, _rt) = origin();
    let cases: &[(&str, &str, Option<u64>)] = &[
        // (path, Age as sent, the stored copy's age at least, or None: the field is ignored)
        ("/a-plain", "1800", Some(1800)),
        ("/a-list", "1800, 60", Some(1800)),
        ("/a-frac", "1.5", None),
        ("/a-neg", "-5", None),
        ("/a-word", "abc", None),
        ("/a-param", "10;x=1", None),
        ("/a-plus", "+10", None),
    ];
    for (path, age, _) in cases {
        origin.script(
            path,
            reply("aged", &[("Cache-Control", "max-age=3600"), ("Age", age)]),
        );
    }
    let proxy = Proxy::start(origin.addr(), Opts::default());
    for (path, age, stored) in cases {
        let miss = proxy.get(path);
        assert_eq!(miss.x_cache(), "MISS");
        // Forwarded: the origin's Age, exactly as it came.
        assert_eq!(miss.header("age"), Some(*age), "{path}");
        let before = zero_copy_bytes(&proxy);
        let hit = proxy.get(path);
        // An invalid Age is ignored, not a reason to call the response stale.
        assert_hit(&proxy, &hit, "HIT", b"aged", before);
        let served: u64 = hit.header("age").and_then(|a| a.parse().ok()).expect("age");
        match stored {
            Some(at_least) => assert!(
                (*at_least..*at_least + 5).contains(&served),
                "{path}: {served}"
            ),
            None => assert!(served < 5, "{path}: {served}"),
        }
    }
    // Past 2^31 an Age saturates there (§1.2.2): far older than its hour of freshness.
    origin.script(
        "/a-huge",
        reply(
            "aged",
            &[
                ("Cache-Control", "max-age=3600"),
                ("Age", "99999999999999999999"),
            ],
        ),
    );
    assert_eq!(proxy.get("/a-huge").x_cache(), "MISS");
    let again = proxy.get("/a-huge");
    assert_eq!(again.x_cache(), "EXPIRED", "{:?}", again.headers);
}
