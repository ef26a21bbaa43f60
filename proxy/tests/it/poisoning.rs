//! Cache poisoning, one attempt per test: an attacker sends a request shaped so that the answer it
//! provokes could be stored under a key that innocent requests use (a partial or error response, a
//! precondition, a second identity for the host, a field the origin sees differently from the
//! cache, a forged forwarding field, a key-encoding collision, a body on a GET, an invalid status),
//! and then an innocent client asks for the same resource. Each test pins what the attacker gets,
//! what the origin received, and the exact status, body and `X-Cache` the innocent client gets: a
//! shared cache must never hand one client's crafted answer to another.

use crate::support::*;
use std::time::Duration;
use zerocache_origin::Received;

const LAST_MODIFIED: &str = "Mon, 30 Nov 2026 00:00:00 GMT";

/// The 1000-byte object every cacheable test serves.
fn full() -> Vec<u8> {
    body(1000)
}

/// 200 with the full object, fresh for 10 minutes, with both validators.
fn cacheable() -> Reply {
    Reply::ok(full()).headers(&[
        ("Cache-Control", "max-age=600"),
        ("ETag", "\"v1\""),
        ("Last-Modified", LAST_MODIFIED),
    ])
}

/// A small cacheable text answer.
fn text(s: &str, extra: &[(&str, &str)]) -> Reply {
    let mut h = vec![("Cache-Control", "max-age=600")];
    h.extend_from_slice(extra);
    Reply::ok(s.as_bytes().to_vec()).headers(&h)
}

/// GET `path` with `headers` on a fresh connection (Host `test.example`).
fn get(proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> Response {
    proxy.client().get(path, headers)
}

/// Sends `raw` on a fresh connection and reads one response.
fn raw(proxy: &Proxy, raw: &[u8]) -> Response {
    let mut c = proxy.client();
    c.send(raw);
    c.try_read_response(false)
        .expect("a response before the connection closed")
}

/// Every value of field `name` in a received request.
fn values<'a>(r: &'a Received, name: &str) -> Vec<&'a str> {
    r.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Asserts an innocent response exactly: status, body bytes and `X-Cache`.
fn assert_innocent(r: &Response, status: u16, body: &[u8], x_cache: &str) {
    assert_eq!(
        (r.status, r.x_cache()),
        (status, x_cache),
        "innocent response {:?}",
        r.headers
    );
    assert!(
        r.body == body,
        "innocent body: {} bytes {:?}..., expected {} bytes",
        r.body.len(),
        String::from_utf8_lossy(&r.body[..r.body.len().min(40)]),
        body.len()
    );
}

/// `/r` answers like an origin that implements ranges over the 1000-byte object.
fn script_ranges(origin: &Origin) {
    let partial = Reply::ok(full()[..10].to_vec()).status(206).headers(&[
        ("Content-Range", "bytes 0-9/1000"),
        ("Cache-Control", "max-age=600"),
        ("ETag", "\"v1\""),
        ("Last-Modified", LAST_MODIFIED),
    ]);
    let unsatisfiable = Reply::ok(Vec::new()).status(416).headers(&[
        ("Content-Range", "bytes */1000"),
        ("Cache-Control", "max-age=600"),
    ]);
    origin.script("/r", cacheable());
    origin.script_by_header(
        "/r",
        "range",
        vec![
            (Some("bytes=99999-"), unsatisfiable),
            (Some("bytes=0-9"), partial),
            (None, cacheable()),
        ],
    );
}

/// A 416 provoked on a miss is relayed to the attacker and never stored: the next plain GET gets
/// the whole object, and a third one is a hit of it.
#[test]
fn range_416_on_a_miss_is_relayed_and_never_stored() {
    let (origin, _rt) = origin();
    script_ranges(&origin);
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = get(&proxy, "/r", &[("Range", "bytes=99999-")]);
    assert_eq!(attack.status, 416, "{:?}", attack.headers);
    assert_eq!(attack.header("content-range"), Some("bytes */1000"));
    assert!(attack.body.is_empty());
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(values(&seen[0], "range"), ["bytes=99999-"]);

    let innocent = get(&proxy, "/r", &[]);
    assert_eq!(innocent.status, 200, "{:?}", innocent.headers);
    assert!(
        matches!(innocent.x_cache(), "MISS" | "HIT"),
        "{:?}",
        innocent.headers
    );
    assert!(innocent.body == full(), "{} bytes", innocent.body.len());
    let seen = origin.received();
    let ranged: Vec<&str> = seen.iter().filter_map(|r| r.header("range")).collect();
    assert_eq!(
        ranged,
        ["bytes=99999-"],
        "only the attacker's request had a Range"
    );
    assert!(seen.len() >= 2, "the whole object was fetched");

    let n = origin.received().len();
    let third = get(&proxy, "/r", &[]);
    assert_innocent(&third, 200, &full(), "HIT");
    assert_eq!(origin.received().len(), n);
}

/// A 206 provoked on a miss is relayed and never stored; it starts a background fetch of the whole
/// object (1000 bytes, under `cache.range_fill_max`), after which the innocent GET is a hit of the
/// whole object. The poll asks with `only-if-cached` (504 until stored), so it never reaches the
/// origin itself and cannot be what filled the cache.
#[test]
fn range_206_on_a_miss_is_relayed_and_the_whole_object_is_filled_in_the_background() {
    let (origin, _rt) = origin();
    script_ranges(&origin);
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = get(&proxy, "/r", &[("Range", "bytes=0-9")]);
    assert_eq!(attack.status, 206, "{:?}", attack.headers);
    assert_eq!(attack.header("content-range"), Some("bytes 0-9/1000"));
    assert_eq!(attack.body, &full()[..10]);

    assert_eventually_eq(
        "the whole object is stored in the background",
        Duration::from_secs(5),
        || get(&proxy, "/r", &[("Cache-Control", "only-if-cached")]).status,
        200,
    );
    let innocent = get(&proxy, "/r", &[]);
    assert_innocent(&innocent, 200, &full(), "HIT");

    let seen = origin.received();
    assert_eq!(
        seen.len(),
        2,
        "the attacker's request and one background fetch"
    );
    assert_eq!(values(&seen[0], "range"), ["bytes=0-9"]);
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("GET", "/r")
    );
    assert_eq!(values(&seen[1], "range"), Vec::<&str>::new());
}

const CONDITIONALS: &[&str] = &[
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
];

/// A conditional GET on a miss: the proxy fetches and stores the full object unconditionally,
/// answers the precondition itself, and the next plain GET is a hit of the full object. The 304 or
/// 412 leaves as soon as the origin's head is in, while the body goes on into the cache, so the
/// innocent GET waits for that fill to commit (polled with `only-if-cached`, which never reaches
/// the origin: the one origin request stays the attacker's).
fn precondition_on_a_miss(field: (&str, &str), attacker_status: u16) -> Response {
    let (origin, _rt) = origin();
    origin.script("/p", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = get(&proxy, "/p", &[field]);
    assert_eq!(attack.status, attacker_status, "{:?}", attack.headers);
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    for c in CONDITIONALS {
        assert_eq!(values(&seen[0], c), Vec::<&str>::new(), "origin saw {c}");
    }

    assert_eventually_eq(
        "the attacker's request stored the full object",
        Duration::from_secs(5),
        || get(&proxy, "/p", &[("Cache-Control", "only-if-cached")]).status,
        200,
    );
    let innocent = get(&proxy, "/p", &[]);
    assert_innocent(&innocent, 200, &full(), "HIT");
    assert_eq!(origin.hits("/p"), 1);
    attack
}

#[test]
fn if_match_on_a_miss_is_412_from_the_proxy_and_the_full_object_is_stored() {
    precondition_on_a_miss(("If-Match", "\"nope\""), 412);
}

#[test]
fn if_unmodified_since_on_a_miss_is_412_from_the_proxy_and_the_full_object_is_stored() {
    precondition_on_a_miss(
        ("If-Unmodified-Since", "Sat, 01 Jan 2000 00:00:00 GMT"),
        412,
    );
}

#[test]
fn if_none_match_on_a_miss_is_304_from_the_proxy_and_the_full_object_is_stored() {
    let attack = precondition_on_a_miss(("If-None-Match", "\"v1\""), 304);
    // RFC 9110 §15.4.5: a 304 carries the ETag the 200 would have.
    assert_eq!(attack.header("etag"), Some("\"v1\""));
}

/// The absolute-form target names the resource (RFC 9112 §3.2.2): the origin is asked for the
/// victim's host, not the attacker's Host field, so what is stored under the victim's key is the
/// victim's answer.
#[test]
fn absolute_form_authority_is_what_the_origin_sees() {
    let (origin, _rt) = origin();
    origin.script_by_header(
        "/p",
        "host",
        vec![
            (Some("victim.example"), text("victim", &[])),
            (Some("attacker.example"), text("attacker", &[])),
        ],
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = raw(
        &proxy,
        b"GET http://victim.example/p HTTP/1.1\r\nHost: attacker.example\r\n\r\n",
    );
    assert_eq!(
        (attack.status, attack.body.as_slice()),
        (200, &b"victim"[..])
    );
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(values(&seen[0], "host"), ["victim.example"]);

    let innocent = raw(&proxy, b"GET /p HTTP/1.1\r\nHost: victim.example\r\n\r\n");
    assert_innocent(&innocent, 200, b"victim", "HIT");
    assert_eq!(origin.received().len(), 1);

    // The attacker's own host is its own entry.
    let other = raw(&proxy, b"GET /p HTTP/1.1\r\nHost: attacker.example\r\n\r\n");
    assert_innocent(&other, 200, b"attacker", "MISS");
}

/// Userinfo in an absolute-form target (`victim@attacker`) is refused before anything is sent.
#[test]
fn absolute_form_with_userinfo_is_400_and_never_forwarded() {
    let (origin, _rt) = origin();
    origin.script("/p", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let attack = raw(
        &proxy,
        b"GET http://victim.example@attacker.example/p HTTP/1.1\r\nHost: victim.example\r\n\r\n",
    );
    assert_eq!(attack.status, 400);
    assert!(origin.received().is_empty(), "{:?}", origin.received());
    let innocent = raw(&proxy, b"GET /p HTTP/1.1\r\nHost: victim.example\r\n\r\n");
    assert_innocent(&innocent, 200, &full(), "MISS");
}

/// A field the client names in `Connection` is hop-by-hop and not forwarded, so the origin
/// answers as if it were absent; the cache must then not file that answer under the field's
/// value. Here the field is one the response varies on.
#[test]
fn connection_nominated_vary_field_does_not_poison_its_variant() {
    let (origin, _rt) = origin();
    let vary = [("Vary", "Accept-Language")];
    origin.script_by_header(
        "/lang",
        "accept-language",
        vec![
            (Some("de"), text("deutsch", &vary)),
            (None, text("default", &vary)),
        ],
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = get(
        &proxy,
        "/lang",
        &[
            ("Accept-Language", "de"),
            ("Connection", "close, Accept-Language"),
        ],
    );
    assert_eq!(
        (attack.status, attack.body.as_slice()),
        (200, &b"default"[..])
    );
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(values(&seen[0], "accept-language"), Vec::<&str>::new());

    let innocent = get(&proxy, "/lang", &[("Accept-Language", "de")]);
    assert_innocent(&innocent, 200, b"deutsch", "MISS");
    let seen = origin.received();
    assert_eq!(seen.len(), 2);
    assert_eq!(values(&seen[1], "accept-language"), ["de"]);

    let plain = get(&proxy, "/lang", &[]);
    assert_eq!(
        (plain.status, plain.body.as_slice()),
        (200, &b"default"[..])
    );
}

/// The same with a field that is part of the route's cache key.
#[test]
fn connection_nominated_key_field_does_not_poison_its_key() {
    let (origin, _rt) = origin();
    origin.script_by_header(
        "/t",
        "x-tenant",
        vec![
            (Some("acme"), text("acme", &[])),
            (None, text("nobody", &[])),
        ],
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    cache_key:\n      headers: [X-Tenant]\n".into(),
            ..Opts::default()
        },
    );

    let attack = get(
        &proxy,
        "/t",
        &[("X-Tenant", "acme"), ("Connection", "X-Tenant")],
    );
    assert_eq!(
        (attack.status, attack.body.as_slice()),
        (200, &b"nobody"[..])
    );
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(values(&seen[0], "x-tenant"), Vec::<&str>::new());

    let innocent = get(&proxy, "/t", &[("X-Tenant", "acme")]);
    assert_innocent(&innocent, 200, b"acme", "MISS");
    let seen = origin.received();
    assert_eq!(seen.len(), 2);
    assert_eq!(values(&seen[1], "x-tenant"), ["acme"]);

    let plain = get(&proxy, "/t", &[]);
    assert_eq!((plain.status, plain.body.as_slice()), (200, &b"nobody"[..]));
}

/// Forwarding fields from an untrusted client (none are trusted by default) never reach the
/// origin: overrides of host, scheme and path are dropped, client-address fields are replaced by
/// the peer's own address.
#[test]
fn forwarding_overrides_from_an_untrusted_client_never_reach_the_origin() {
    let (origin, _rt) = origin();
    origin.script("/f", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = get(
        &proxy,
        "/f",
        &[
            ("Forwarded", "host=evil.example;proto=https;for=1.2.3.4"),
            ("X-Forwarded-Server", "evil"),
            ("X-Original-Host", "evil"),
            ("X-Forwarded-Uri", "/admin"),
            ("X-Forwarded-Host", "evil"),
            ("X-Real-IP", "6.6.6.6"),
            ("True-Client-IP", "6.6.6.6"),
            ("X-Forwarded-For", "6.6.6.6"),
        ],
    );
    assert_eq!(attack.status, 200);
    assert!(attack.body == full());
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    for (k, v) in &seen[0].headers {
        let line = format!("{k}: {v}").to_ascii_lowercase();
        // `proto=` is the proxy's own (`http`, the listener's scheme), never the client's claim.
        for bad in [
            "host=",
            "proto=https",
            "evil",
            "6.6.6.6",
            "1.2.3.4",
            "/admin",
        ] {
            assert!(!line.contains(bad), "origin saw {line:?}");
        }
    }
    assert_eq!(values(&seen[0], "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(values(&seen[0], "forwarded"), ["for=127.0.0.1;proto=http"]);

    let innocent = get(&proxy, "/f", &[]);
    assert_innocent(&innocent, 200, &full(), "HIT");
    assert_eq!(origin.hits("/f"), 1);
}

/// `|` joined the parts of the old key text; a Host with one is refused.
#[test]
fn host_with_a_pipe_is_400_and_never_forwarded() {
    let (origin, _rt) = origin();
    origin.script("/p", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let attack = raw(&proxy, b"GET /p HTTP/1.1\r\nHost: a.example|/pipe\r\n\r\n");
    assert_eq!(attack.status, 400);
    assert!(origin.received().is_empty(), "{:?}", origin.received());
}

/// Two different requests whose parts, joined with `|` (the old `method|scheme|host|target`
/// encoding plus `|name=value` or `|name!` per key field), give the same text must still be two
/// entries: each client gets its own body, twice (a miss, then a hit). Here `|` is in the target.
#[test]
fn a_pipe_in_the_target_cannot_forge_another_requests_key() {
    // Old text of both: GET|http|test.example|/x|x-tenant=t|x-tenant!
    let (origin, _rt) = origin();
    origin.script_by_header(
        "/x",
        "x-tenant",
        vec![(Some("t|x-tenant!"), text("body-a", &[]))],
    );
    origin.script("/x|x-tenant=t", text("body-b", &[]));
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    cache_key:\n      headers: [X-Tenant]\n".into(),
            ..Opts::default()
        },
    );
    for x_cache in ["MISS", "HIT"] {
        let a = get(&proxy, "/x", &[("X-Tenant", "t|x-tenant!")]);
        assert_innocent(&a, 200, b"body-a", x_cache);
        let b = get(&proxy, "/x|x-tenant=t", &[]);
        assert_innocent(&b, 200, b"body-b", x_cache);
    }
    assert_eq!((origin.hits("/x"), origin.hits("/x|x-tenant=t")), (1, 1));
}

/// The same collision with `|` only in key field values (legitimate field-value characters).
#[test]
fn a_pipe_in_a_key_field_cannot_forge_another_requests_key() {
    // Old text of both: GET|http|test.example|/y|x-tenant=t|x-other=u|x-other!
    let (origin, _rt) = origin();
    origin.script_by_header(
        "/y",
        "x-tenant",
        vec![
            (Some("t|x-other=u"), text("body-a", &[])),
            (Some("t"), text("body-b", &[])),
        ],
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    cache_key:\n      headers: [X-Tenant, X-Other]\n".into(),
            ..Opts::default()
        },
    );
    for x_cache in ["MISS", "HIT"] {
        let a = get(&proxy, "/y", &[("X-Tenant", "t|x-other=u")]);
        assert_innocent(&a, 200, b"body-a", x_cache);
        let b = get(
            &proxy,
            "/y",
            &[("X-Tenant", "t"), ("X-Other", "u|x-other!")],
        );
        assert_innocent(&b, 200, b"body-b", x_cache);
    }
    assert_eq!(origin.hits("/y"), 2);
}

/// A GET with a body is forwarded with it, and its answer (which may depend on the body the cache
/// cannot key on) is not stored.
#[test]
fn a_get_with_a_body_is_forwarded_and_its_answer_not_stored() {
    let (origin, _rt) = origin();
    origin.script("/fat", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = raw(
        &proxy,
        b"GET /fat HTTP/1.1\r\nHost: test.example\r\nContent-Length: 4\r\n\r\nabcd",
    );
    assert_eq!(attack.status, 200);
    assert_eq!(
        attack.header("cache-status"),
        Some("zerocache; fwd=miss; detail=request-body")
    );
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, b"abcd");

    let innocent = get(&proxy, "/fat", &[]);
    assert_innocent(&innocent, 200, &full(), "MISS");
    let seen = origin.received();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].body.is_empty());
}

/// A status outside 100..=599 is invalid (RFC 9110 §15): the client gets it relayed as received
/// or a 502 (either is accepted here; a client must treat an invalid status like a 5xx anyway),
/// and it is never stored: the next GET goes to the origin again.
#[test]
fn an_invalid_status_is_never_stored() {
    let (origin, _rt) = origin();
    origin.script(
        "/bad",
        Reply::ok(b"nine-nine-nine".to_vec())
            .status(999)
            .headers(&[("Cache-Control", "max-age=600")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let check = |r: &Response| {
        match r.status {
            999 => assert_eq!(r.body, b"nine-nine-nine"),
            502 => assert_ne!(r.body, b"nine-nine-nine"),
            s => panic!("status {s}, expected 999 relayed or 502"),
        }
        assert_eq!(r.x_cache(), "MISS", "{:?}", r.headers);
    };
    let first = get(&proxy, "/bad", &[]);
    check(&first);
    let innocent = get(&proxy, "/bad", &[]);
    check(&innocent);
    assert_eq!(innocent.status, first.status);
    assert_eq!(origin.hits("/bad"), 2);
}

/// A field name with `_` is never forwarded: behind a CGI-style gateway `X_Forwarded_Host` and
/// `X-Forwarded-Host` are the same variable, and the latter is an unkeyed override.
#[test]
fn underscore_fields_are_not_forwarded() {
    let (origin, _rt) = origin();
    origin.script("/u", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());

    let attack = get(&proxy, "/u", &[("X_Forwarded_Host", "evil")]);
    assert_eq!(attack.status, 200);
    let seen = origin.received();
    assert_eq!(seen.len(), 1);
    for (k, v) in &seen[0].headers {
        assert!(
            !k.contains('_') && !v.contains("evil"),
            "origin saw {k}: {v}"
        );
    }

    let innocent = get(&proxy, "/u", &[]);
    assert_innocent(&innocent, 200, &full(), "HIT");
    assert_eq!(origin.hits("/u"), 1);
}

/// TRACE would reflect the request, credentials included (cross-site tracing): the proxy answers
/// 405 itself, echoes nothing, and the origin never sees it.
#[test]
fn trace_with_credentials_is_405_and_never_forwarded() {
    let (origin, _rt) = origin();
    origin.script("/t", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.send(b"TRACE /t HTTP/1.1\r\nHost: test.example\r\nCookie: session=s3cr3t\r\nAuthorization: Bearer t0k3n\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.status, 405);
    assert!(r.header("allow").is_some(), "{:?}", r.headers);
    let all = format!("{:?}{}", r.headers, String::from_utf8_lossy(&r.body));
    assert!(!all.contains("s3cr3t") && !all.contains("t0k3n"), "{all}");
    assert!(origin.received().is_empty(), "{:?}", origin.received());
    // The connection is still usable, and the resource is untouched.
    let innocent = c.get("/t", &[]);
    assert_innocent(&innocent, 200, &full(), "MISS");
}

/// One user's session handed to the next: a response with `Set-Cookie` was stored by default
/// with explicit freshness, and under `status_ttl` or the Last-Modified heuristic even with
/// `store_set_cookie: false`, so the next client without a cookie got a HIT carrying
/// `sess=alice`. Now: by default never stored (`detail=set-cookie`), with `store_set_cookie:
/// true` only under the origin's explicit freshness.
#[test]
fn a_set_cookie_is_stored_only_with_explicit_freshness_where_the_route_opts_in() {
    let (origin, _rt) = origin();
    let alice = [("Set-Cookie", "sess=alice")];
    origin.script("/explicit", text("session page", &alice));
    origin.script(
        "/missing",
        Reply::ok(b"gone".to_vec()).status(404).headers(&alice),
    );
    origin.script(
        "/moved",
        Reply::ok(Vec::new())
            .status(302)
            .headers(&[("Location", "/explicit"), alice[0]]),
    );
    origin.script(
        "/modified",
        Reply::ok(b"page".to_vec()).headers(&[("Last-Modified", LAST_MODIFIED), alice[0]]),
    );
    let configured = "    status_ttl: { 404: 1m, 302: 1m }\n";
    for opt_in in [false, true] {
        let proxy = Proxy::start(
            origin.addr(),
            Opts {
                route_yaml: format!(
                    "{configured}{}",
                    if opt_in {
                        "    store_set_cookie: true\n"
                    } else {
                        ""
                    }
                ),
                ..Opts::default()
            },
        );
        for path in ["/explicit", "/missing", "/moved", "/modified"] {
            let stored = opt_in && path == "/explicit";
            let first = get(&proxy, path, &[("Cookie", "sess=alice")]);
            assert_eq!(first.header("set-cookie"), Some("sess=alice"), "{path}");
            if !stored {
                assert_eq!(
                    first.cache_status().as_deref(),
                    Some("zerocache; fwd=miss; detail=set-cookie"),
                    "{path}, opt-in {opt_in}"
                );
            }
            let next = get(&proxy, path, &[]);
            let want = if stored { "HIT" } else { "MISS" };
            assert_eq!(next.x_cache(), want, "{path}, opt-in {opt_in}");
        }
    }
    // Each path fetched twice but /explicit with opt-in (once): 2 × 4 + 2 × 3 + 1.
    let fetched: usize = ["/explicit", "/missing", "/moved", "/modified"]
        .iter()
        .map(|p| origin.hits(p))
        .sum();
    assert_eq!(fetched, 15);
}

#[test]
fn dot_segments_are_resolved_once_for_route_key_and_origin() {
    let (origin, _rt) = origin();
    origin.script("/account", text("private page", &[]));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    // Web cache deception: what the origin resolves, the cache resolves the same way first.
    let r = get(&proxy, "/static/%2e%2e/account", &[]);
    assert_innocent(&r, 200, b"private page", "MISS");
    assert_eq!(
        origin.received().last().map(|r| r.path.clone()).as_deref(),
        Some("/account")
    );
    // One resource, one key: its plain name is now a hit.
    assert_innocent(&get(&proxy, "/account", &[]), 200, b"private page", "HIT");
    // Tomcat's `..;` names something no key can: refused, never forwarded.
    let r = raw(
        &proxy,
        b"GET /static/..;/account HTTP/1.1\r\nHost: a\r\n\r\n",
    );
    assert_eq!(r.status, 400);
    let r = raw(
        &proxy,
        b"GET /static\\..\\account HTTP/1.1\r\nHost: a\r\n\r\n",
    );
    assert_eq!(r.status, 400);
    assert_eq!(origin.received().len(), 1);
}

#[test]
fn a_304_never_puts_a_users_cookie_into_the_shared_entry() {
    let (origin, _rt) = origin();
    for (path, extra) in [
        ("/r", "max-age=600"),
        ("/p", "max-age=600, private=\"Set-Cookie\""),
    ] {
        origin.script_by_header(
            path,
            "if-none-match",
            vec![
                (
                    None,
                    Reply::ok(full())
                        .headers(&[("Cache-Control", "max-age=0"), ("ETag", "\"v1\"")]),
                ),
                (
                    Some("\"v1\""),
                    Reply::ok(Vec::new())
                        .status(304)
                        .headers(&[("Cache-Control", extra), ("Set-Cookie", "sid=victim")]),
                ),
            ],
        );
    }
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    store_set_cookie: false\n".into(),
            ..Opts::default()
        },
    );
    for path in ["/r", "/p"] {
        assert_eq!(get(&proxy, path, &[]).x_cache(), "MISS");
        // The victim's request revalidates; the origin's 304 carries the victim's session.
        let victim = get(&proxy, path, &[]);
        assert_eq!(victim.x_cache(), "REVALIDATED");
        // Her own cookie reaches her even where cookies are never stored (RFC 9111 §4.3.4).
        assert_eq!(set_cookies(&victim), ["sid=victim"], "{path}");
        // The next client gets the stored response, fresh now, and no cookie of anyone's.
        let next = get(&proxy, path, &[]);
        assert_innocent(&next, 200, &full(), "HIT");
        assert_eq!(next.header("set-cookie"), None, "{path}");
    }
}

fn set_cookies(r: &Response) -> Vec<&str> {
    r.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The session leak of a revalidation: on a route that stores cookies, a 304's
/// `Set-Cookie` went into the shared entry and every later hit handed out that user's session.
/// It goes to the client whose request caused the 304, and replaces the stored response's own
/// cookie in that response only; the entry keeps what the 200 set.
#[test]
fn a_304s_set_cookie_goes_to_its_requester_only_where_cookies_are_stored() {
    let (origin, _rt) = origin();
    for (path, stored_cookie) in [("/cond/x", None), ("/cond/y", Some("site=1"))] {
        let mut fields = vec![("Cache-Control", "max-age=0"), ("ETag", "\"c1\"")];
        fields.extend(stored_cookie.map(|c| ("Set-Cookie", c)));
        origin.script_by_header(
            path,
            "if-none-match",
            vec![
                (None, Reply::ok(full()).headers(&fields)),
                (
                    Some("\"c1\""),
                    Reply::ok(Vec::new()).status(304).headers(&[
                        ("Cache-Control", "max-age=600"),
                        ("Set-Cookie", "sess=alice-FROM-304"),
                    ]),
                ),
            ],
        );
    }
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    store_set_cookie: true\n".into(),
            ..Opts::default()
        },
    );
    for (path, stored_cookie) in [("/cond/x", None), ("/cond/y", Some("site=1"))] {
        let first = get(&proxy, path, &[]);
        assert_eq!(first.x_cache(), "MISS");
        assert_eq!(set_cookies(&first), Vec::from_iter(stored_cookie), "{path}");
        let alice = get(&proxy, path, &[("Cookie", "alice")]);
        assert_eq!(
            (alice.x_cache(), alice.body.as_slice()),
            ("REVALIDATED", &full()[..])
        );
        assert_eq!(set_cookies(&alice), ["sess=alice-FROM-304"], "{path}");
        for _ in 0..2 {
            let next = get(&proxy, path, &[]);
            assert_innocent(&next, 200, &full(), "HIT");
            assert_eq!(set_cookies(&next), Vec::from_iter(stored_cookie), "{path}");
        }
        // A Range request served from the entry carries no one's 304 cookie either.
        let ranged = get(&proxy, path, &[("Range", "bytes=0-3")]);
        assert_eq!((ranged.status, ranged.body.len()), (206, 4));
        assert_eq!(
            set_cookies(&ranged),
            Vec::from_iter(stored_cookie),
            "{path}"
        );
    }
    assert_eq!(origin.hits("/cond/x"), 2);
    assert_eq!(origin.hits("/cond/y"), 2);
}

#[test]
fn an_unread_large_body_is_never_parsed_as_the_next_request() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    // TRACE is answered 405 without reading its body; part of it is already past the 64 KiB the
    // proxy reads up front, and the rest hides a request.
    let mut body = vec![b'x'; 140_000];
    let smuggled = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
    body[100_000..100_000 + smuggled.len()].copy_from_slice(smuggled);
    let mut c = proxy.client();
    c.send(b"TRACE / HTTP/1.1\r\nHost: a\r\nContent-Length: 140000\r\n\r\n");
    c.send(&body);
    let r = c.read_response(false);
    assert_eq!(r.status, 405);
    assert!(c.is_closed());
    assert_eq!(origin.hits("/smuggled"), 0);
}

/// Web cache deception through an encoded separator: with the victim's cookie,
/// `/static/..%2fprivate/x` would be one segment under `/static/` to the cache and `/private/x`
/// to an origin that decodes `%2F`. Refused (400) and never forwarded, in every spelling; the
/// same escape without a dot-segment beside it (npm's `@scope%2fname`) is forwarded as it is.
#[test]
fn a_dot_segment_beside_an_encoded_separator_is_400_and_never_forwarded() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    for target in [
        "/static/..%2fprivate/x",
        "/static/%2e%2e%2fprivate/x",
        "/static/..%5cprivate/x",
        "/static/%5c",
    ] {
        let r = raw(
            &proxy,
            format!("GET {target} HTTP/1.1\r\nHost: a.example\r\nCookie: session=victim\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(r.status, 400, "{target}");
    }
    assert_eq!(origin.request_count(), 0, "{:?}", origin.received());
    let r = get(&proxy, "/-/@scope%2fname", &[]);
    assert_eq!(
        r.status, 404,
        "the origin's own answer (nothing is scripted there)"
    );
    assert_eq!(origin.received()[0].path, "/-/@scope%2Fname");
}

/// Request validation (RFC 9112 §3.2, RFC 3986): a fragment, `*` with any method but OPTIONS, raw
/// non-ASCII in the target, and Host forms no resolver finds are 400 and never forwarded; the
/// spellings of one host (`a.example.`, port `080`) name it once, so they share one entry.
#[test]
fn targets_and_hosts_outside_the_grammar_are_400_and_spellings_of_one_host_share_a_key() {
    let (origin, _rt) = origin();
    origin.script("/same", cacheable());
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let hostile: [&[u8]; 9] = [
        b"GET /static/#x HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET * HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a%2eexample\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: -a.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example:99999\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a..example\r\n\r\n",
        b"GET http://a.example/x#frag HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a!b.example\r\n\r\n",
    ];
    for req in hostile {
        let r = raw(&proxy, req);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(req));
    }
    assert_eq!(origin.request_count(), 0, "{:?}", origin.received());
    // OPTIONS * is the asterisk-form's one use: not refused.
    let r = raw(&proxy, b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n");
    assert_ne!(r.status, 400);
    let before = origin.hits("/same");
    for host in ["a.example", "a.example.", "A.EXAMPLE:080", "a.example.:80"] {
        let mut c = proxy.client();
        c.host = host.into();
        let r = c.get("/same", &[]);
        assert_eq!(r.status, 200, "{host}");
    }
    assert_eq!(
        origin.hits("/same") - before,
        1,
        "one key for every spelling"
    );
}

/// A node without `fleet:` forwarded a client's `Zerocache-Fleet` header to the origin, over
/// HTTP/1.1 and h2 (docs/fleet.md says a client's copy never goes further): an origin that is
/// also some fleet's member, or trusts the header, would take the client for a peer.
#[test]
fn a_clients_fleet_header_never_reaches_the_origin_without_a_fleet() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            listen_options: "h2c: true".into(),
            ..Opts::default()
        },
    );
    let forged = "v2 from=10.0.0.9:8080 cfg=0 op=purge ts=1 nonce=0 bh=0 sig=00";
    let r = get(
        &proxy,
        "/obj/10",
        &[("Zerocache-Fleet", forged), ("X-Other", "1")],
    );
    assert_eq!(r.status, 200);
    let mut c = h2raw::RawH2::connect(proxy.addr, &[]);
    let block = h2raw::get("/obj/11", &[(b"zerocache-fleet", forged.as_bytes())]);
    c.send(&h2raw::frame(
        h2raw::HEADERS,
        h2raw::END_HEADERS | h2raw::END_STREAM,
        1,
        &block,
    ));
    let frames = c.until_end(1, Duration::from_secs(10));
    assert!(frames.iter().any(|f| f.kind == h2raw::DATA), "{frames:?}");
    let received = origin.received();
    assert_eq!(received.len(), 2);
    for r in &received {
        assert_eq!(r.header("zerocache-fleet"), None, "{}", r.path);
    }
    assert_eq!(received[0].header("x-other"), Some("1"));
}
