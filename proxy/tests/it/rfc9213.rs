//! Targeted cache control (RFC 9213) against a scriptable origin: which field governs, what an
//! invalid field does, and what reaches the client. Every expected hit also checks that its body
//! went out through sendfile.

use crate::support::*;

fn reply(body: &str, headers: &[(&str, &str)]) -> Reply {
    Reply::ok(body.as_bytes().to_vec()).headers(headers)
}

#[test]
fn rfc9213_2_2_the_first_valid_targeted_field_governs_and_is_forwarded() {
    let (origin, _rt) = origin();
    origin.script(
        "/cdn-ok",
        reply(
            "a",
            &[
                ("Cache-Control", "no-store"),
                ("CDN-Cache-Control", "max-age=600"),
            ],
        ),
    );
    origin.script(
        "/cdn-no",
        reply(
            "b",
            &[
                ("Cache-Control", "max-age=600"),
                ("CDN-Cache-Control", "no-store"),
            ],
        ),
    );
    origin.script(
        "/own",
        reply(
            "c",
            &[
                ("Cache-Control", "no-store"),
                ("Zerocache-Cache-Control", "max-age=600"),
                ("CDN-Cache-Control", "no-store"),
            ],
        ),
    );
    // Cache-Control's no-cache is ignored too: the targeted field governs reuse, not only storage.
    origin.script(
        "/cdn-reuse",
        reply(
            "d",
            &[
                ("Cache-Control", "no-cache"),
                ("CDN-Cache-Control", "max-age=600"),
                ("ETag", "\"d\""),
            ],
        ),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  targeted_fields: [Zerocache-Cache-Control, CDN-Cache-Control]\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    let first = c.get("/cdn-ok", &[]);
    assert_eq!(
        (
            first.x_cache(),
            first.header("cache-control"),
            first.header("cdn-cache-control")
        ),
        ("MISS", Some("no-store"), Some("max-age=600")),
        "both fields reach the client on a miss"
    );
    let before = zero_copy_bytes(&proxy);
    let hit = c.get("/cdn-ok", &[]);
    assert_hit(&proxy, &hit, "HIT", b"a", before);
    assert_eq!(hit.header("cdn-cache-control"), Some("max-age=600"));

    c.get("/cdn-no", &[]);
    assert_eq!(c.get("/cdn-no", &[]).x_cache(), "MISS");
    assert_eq!(origin.hits("/cdn-no"), 2);

    c.get("/own", &[]);
    let before = zero_copy_bytes(&proxy);
    let own = c.get("/own", &[]);
    assert_hit(&proxy, &own, "HIT", b"c", before);
    assert_eq!(
        (
            own.header("zerocache-cache-control"),
            own.header("cdn-cache-control")
        ),
        (Some("max-age=600"), Some("no-store"))
    );

    c.get("/cdn-reuse", &[]);
    let before = zero_copy_bytes(&proxy);
    let reused = c.get("/cdn-reuse", &[]);
    assert_hit(&proxy, &reused, "HIT", b"d", before);
    assert_eq!(origin.hits("/cdn-reuse"), 1, "no revalidation");
}

#[test]
fn rfc9213_2_2_targeted_fields_forward_false_hides_them_on_misses_and_hits() {
    let (origin, _rt) = origin();
    origin.script(
        "/cdn",
        reply(
            "a",
            &[
                ("Cache-Control", "no-store"),
                ("CDN-Cache-Control", "max-age=600"),
            ],
        ),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  targeted_fields_forward: false\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    let first = c.get("/cdn", &[]);
    assert_eq!(
        (first.x_cache(), first.header("cdn-cache-control")),
        ("MISS", None)
    );
    let before = zero_copy_bytes(&proxy);
    let hit = c.get("/cdn", &[]);
    assert_hit(&proxy, &hit, "HIT", b"a", before);
    assert_eq!(
        (hit.header("cdn-cache-control"), hit.header("cache-control")),
        (None, Some("no-store"))
    );
    let ranged = c.get("/cdn", &[("Range", "bytes=0-0")]);
    assert_eq!(
        (ranged.status, ranged.header("cdn-cache-control")),
        (206, None)
    );
}

#[test]
fn rfc9213_2_1_an_invalid_targeted_field_is_ignored_and_cache_control_applies() {
    let (origin, _rt) = origin();
    // Each invalid field with Cache-Control: no-store: not stored. With max-age=600: stored.
    let invalid = [
        ("string", "max-age=\"10000\""),
        ("decimal", "max-age=1.5"),
        ("negative", "max-age=-1"),
        ("mixed-case", "MaX-aGe=600"),
        ("trailing-comma", "max-age=600,"),
        ("false-flag", "no-store=?0"),
        ("garbage", "max-age=600 public"),
    ];
    for (name, value) in invalid {
        origin.script(
            &format!("/ns-{name}"),
            reply(
                name,
                &[("Cache-Control", "no-store"), ("CDN-Cache-Control", value)],
            ),
        );
        origin.script(
            &format!("/ok-{name}"),
            reply(
                name,
                &[
                    ("Cache-Control", "max-age=600"),
                    ("CDN-Cache-Control", value),
                ],
            ),
        );
    }
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for (name, value) in invalid {
        let ns = format!("/ns-{name}");
        c.get(&ns, &[]);
        assert_eq!(c.get(&ns, &[]).x_cache(), "MISS", "{value}");
        assert_eq!(origin.hits(&ns), 2, "{value}");
        let ok = format!("/ok-{name}");
        let miss = c.get(&ok, &[]);
        assert_eq!(
            miss.header("cdn-cache-control"),
            Some(value),
            "forwarded as received"
        );
        let before = zero_copy_bytes(&proxy);
        let hit = c.get(&ok, &[]);
        assert_hit(&proxy, &hit, "HIT", name.as_bytes(), before);
        assert_eq!(origin.hits(&ok), 1, "{value}");
    }
}
