//! The cache's configurable shape: index limits, shard levels, the open-file cache and per-route
//! cache keys, each observable from outside.

use crate::support::*;

fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "tmp") {
                    dirs.push(p);
                }
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn max_entries_bounds_the_index() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  max_entries: 3\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    for n in 1..=5 {
        assert_eq!(c.get(&format!("/obj/{n}00"), &[]).x_cache(), "MISS");
    }
    assert_eq!(files(&proxy.dir).len(), 3);
    assert_eq!(c.get("/obj/500", &[]).x_cache(), "HIT");
    assert_eq!(c.get("/obj/100", &[]).x_cache(), "MISS");
    // Five stored, then a sixth: three evictions, each counted.
    assert_eventually_eq(
        "evictions counted",
        std::time::Duration::from_secs(5),
        || metric(&proxy.metrics(), "zerocache_cache_evictions_total"),
        3,
    );
}

#[test]
fn shard_levels_shape_the_tree_and_a_changed_level_still_finds_old_entries() {
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let mut proxy = Proxy::start_in(
        origin.addr(),
        &dir,
        tmp.path(),
        Opts {
            cache_yaml: "  levels: 0\n".into(),
            ..Opts::default()
        },
    );
    proxy.get("/obj/1234");
    let f = files(&dir);
    assert_eq!(f.len(), 1);
    assert_eq!(
        f[0].parent(),
        Some(dir.as_path()),
        "levels 0: files directly under path"
    );
    proxy.kill9();
    let proxy = Proxy::start_in(
        origin.addr(),
        &dir,
        tmp.path(),
        Opts {
            cache_yaml: "  levels: 3\n".into(),
            ..Opts::default()
        },
    );
    assert_eq!(proxy.get("/obj/1234").x_cache(), "HIT");
    proxy.get("/obj/4321");
    let deep = files(&dir)
        .into_iter()
        .find(|p| p.parent() != Some(dir.as_path()))
        .expect("new entry");
    assert_eq!(
        deep.strip_prefix(&dir)
            .expect("under dir")
            .components()
            .count(),
        4
    );
}

/// The index keeps `hot_entries` entries whole; a hit on any other reads its file's head once
/// (`zerocache_cache_head_reads_total`) and is byte-exact, before and after a restart, which
/// keeps none whole.
#[test]
fn hits_beyond_the_hot_entries_read_one_head_each_and_are_exact() {
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    // No scrub and no start-up sample: they read heads too.
    let opts = || Opts {
        cache_yaml: "  hot_entries: 2\n  scrub_rate: 0\n  verify_on_start: 0\n".into(),
        ..Opts::default()
    };
    let reads = |p: &Proxy| metric(&p.metrics(), "zerocache_cache_head_reads_total");
    let sizes = [100usize, 200, 300, 400, 5000, 6000];
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), opts());
    let mut c = proxy.client();
    for n in sizes {
        assert_eq!(c.get(&format!("/obj/{n}"), &[]).x_cache(), "MISS");
    }
    assert_eq!(reads(&proxy), 0, "fills are kept whole");
    // /obj/100 left the two kept whole: one read, then kept.
    for _ in 0..3 {
        let r = c.get("/obj/100", &[]);
        assert_eq!((r.x_cache(), &r.body), ("HIT", &body(100)));
    }
    assert_eq!(reads(&proxy), 1);
    drop(c);
    proxy.kill9();
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), opts());
    let mut c = proxy.client();
    for n in sizes {
        let r = c.get(&format!("/obj/{n}"), &[]);
        assert_eq!((r.x_cache(), &r.body), ("HIT", &body(n)), "/obj/{n}");
    }
    assert_eq!(reads(&proxy), 6, "one head read per entry after a restart");
}

#[test]
fn the_open_file_cache_is_bounded_and_hits_still_work_beyond_it() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  open_files: 2\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    for round in 0..2 {
        for n in [1000usize, 2000, 3000, 4000] {
            let r = c.get(&format!("/obj/{n}"), &[]);
            assert_eq!(r.body, body(n));
            if round == 1 {
                assert_eq!(r.x_cache(), "HIT");
            }
        }
    }
    assert!(proxy.metrics().contains("zerocache_cache_open_files 2\n"));
}

#[test]
fn route_cache_key_options_ignore_the_query_or_add_headers() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    cache_key:\n      query: false\n      headers: [X-Variant]\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/10?a=1", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/obj/10?a=2", &[]).x_cache(), "HIT");
    assert_eq!(c.get("/obj/10", &[("X-Variant", "b")]).x_cache(), "MISS");
    assert_eq!(c.get("/obj/10?z", &[("X-Variant", "b")]).x_cache(), "HIT");
    assert_eq!(c.get("/obj/10", &[("X-Variant", "")]).x_cache(), "MISS");
    assert_eq!(origin.hits("/obj/10?a=1") + origin.hits("/obj/10"), 3);
}

/// An object larger than the whole cache (`cache.max_size`) is relayed whole and never stored:
/// committing it would evict every other entry, then itself (a 5 MB object in a 4 MiB cache
/// answered `stored` on every request and emptied the cache each time). With a Content-Length
/// the client is told why (`detail=too-large`, no `stored`); a chunked one is found out when
/// its fill ends, and dropped then.
#[test]
fn an_object_larger_than_the_cache_is_relayed_and_evicts_nothing() {
    let (origin, _rt) = origin();
    origin.script(
        "/chunked/big",
        Reply::ok(body(5_000_000))
            .framing(Framing::Chunked(65_536))
            .headers(&[("Cache-Control", "max-age=3600")]),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  max_size: 4MiB\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/1000", &[]).x_cache(), "MISS");
    for _ in 0..2 {
        let r = c.get("/obj/5000000", &[]);
        assert_eq!(r.x_cache(), "MISS");
        assert_eq!(
            r.cache_status().as_deref(),
            Some("zerocache; fwd=miss; detail=too-large")
        );
        assert_eq!(r.body, body(5_000_000));
        let r = c.get("/chunked/big", &[]);
        assert_eq!(r.x_cache(), "MISS");
        assert_eq!(r.body, body(5_000_000));
    }
    assert_eq!(origin.hits("/obj/5000000"), 2);
    assert_eq!(origin.hits("/chunked/big"), 2);
    assert_eq!(c.get("/obj/1000", &[]).x_cache(), "HIT");
    assert_eq!(files(&proxy.dir).len(), 1, "only /obj/1000 is stored");
    assert_eq!(
        metric(&proxy.metrics(), "zerocache_cache_evictions_total"),
        0
    );
}

/// `cache.max_object_size`, and a route's own: a 16 MiB object under a 1 MiB bound is relayed
/// whole twice (the origin asked twice, no `stored`), with a Content-Length and chunked; a
/// route's `min_object_size` keeps small bodies out; what lies between is stored. Each refusal is
/// counted by reason.
#[test]
fn object_size_bounds_relay_what_lies_outside_them() {
    let (origin, _rt) = origin();
    // With Vary, as a gzip'd chunked answer usually is: the fill's hash is a variant's, and the
    // too-large memory must still find the next request by its primary key.
    origin.script(
        "/chunked/16m",
        Reply::ok(body(16 << 20))
            .framing(Framing::Chunked(65_536))
            .headers(&[
                ("Cache-Control", "max-age=3600"),
                ("Vary", "Accept-Encoding"),
            ]),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  max_object_size: 1MiB\n".into(),
            route_yaml: "    min_object_size: 100\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    for round in 0..2 {
        let r = c.get(&format!("/obj/{}", 16 << 20), &[]);
        assert_eq!(
            (r.x_cache(), r.cache_status().as_deref()),
            ("MISS", Some("zerocache; fwd=miss; detail=too-large"))
        );
        assert_eq!(r.body, body(16 << 20));
        let r = c.get("/chunked/16m", &[]);
        assert_eq!(r.x_cache(), "MISS");
        assert_eq!(r.body, body(16 << 20));
        // A chunked body's head goes out before its length is known: the first says `stored`
        // and is found out as it streams; the next says why, as a Content-Length one does (it
        // said `stored` on every request and never was).
        let want = if round == 0 {
            "zerocache; fwd=miss; stored"
        } else {
            "zerocache; fwd=miss; detail=too-large"
        };
        assert_eq!(r.cache_status().as_deref(), Some(want), "round {round}");
        let r = c.get("/obj/99", &[]);
        assert_eq!(
            (r.x_cache(), r.cache_status().as_deref()),
            ("MISS", Some("zerocache; fwd=miss; detail=too-small"))
        );
        assert_eq!(r.body, body(99));
    }
    assert_eq!(origin.hits(&format!("/obj/{}", 16 << 20)), 2);
    assert_eq!(origin.hits("/chunked/16m"), 2);
    assert_eq!(origin.hits("/obj/99"), 2);
    // The bounds themselves are stored.
    for size in [100, 1 << 20] {
        let path = format!("/obj/{size}");
        assert_eq!(c.get(&path, &[]).x_cache(), "MISS");
        assert_eq!(c.get(&path, &[]).x_cache(), "HIT");
    }
    assert_eq!(files(&proxy.dir).len(), 2);
    let m = proxy.metrics();
    // The chunked one is found out as it streams: counted once per response, like the others.
    assert_eq!(
        metric(&m, "zerocache_cache_not_stored_total{reason=\"too-large\"}"),
        4
    );
    assert_eq!(
        metric(&m, "zerocache_cache_not_stored_total{reason=\"too-small\"}"),
        2
    );
}

/// `routes[].status_ttl`: a response without freshness of a listed status (an exact status over
/// its class) is stored for its TTL, even a status RFC 9111 would not store without explicit
/// freshness (302); explicit freshness, `no-store` and `cache.store_5xx: false` still win; and it
/// comes before the `Last-Modified` heuristic and `default_ttl`.
#[test]
fn status_ttl_stores_what_the_origin_gave_no_freshness() {
    let (origin, _rt) = origin();
    let reply = |status: u16, headers: &[(&str, &str)]| {
        Reply::ok(format!("{status}\n").into_bytes())
            .status(status)
            .headers(headers)
    };
    let lm = httpdate::fmt_http_date(
        std::time::SystemTime::now() - std::time::Duration::from_secs(100_000),
    );
    origin.script("/missing", reply(404, &[]));
    origin.script("/gone", reply(410, &[]));
    origin.script("/moved", reply(302, &[("Location", "/elsewhere")]));
    origin.script("/forbidden", reply(403, &[]));
    origin.script("/explicit", reply(404, &[("Cache-Control", "max-age=5")]));
    origin.script(
        "/must-understand",
        reply(404, &[("Cache-Control", "must-understand, no-store")]),
    );
    origin.script("/nostore", reply(404, &[("Cache-Control", "no-store")]));
    origin.script("/error", reply(503, &[]));
    origin.script("/modified", reply(200, &[("Last-Modified", &lm)]));
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  store_5xx: false\n".into(),
            route_yaml: "    default_ttl: 30s\n    status_ttl: { 404: 1m, 4xx: 10s, 3xx: 20s, 5xx: 1h, 200: 40s }\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    let ttl = |r: &Response| -> Option<u64> {
        r.header("cache-status")?.split("ttl=").nth(1)?.parse().ok()
    };
    for (path, want) in [
        ("/missing", 60),
        ("/gone", 10),
        ("/moved", 20),
        ("/explicit", 5),
        // status_ttl before the Last-Modified heuristic (10% of 100,000 s) and default_ttl.
        ("/modified", 40),
    ] {
        let first = c.get(path, &[]);
        assert_eq!(
            (first.x_cache(), first.cache_status().as_deref()),
            ("MISS", Some("zerocache; fwd=miss; stored")),
            "{path}"
        );
        let hit = c.get(path, &[]);
        assert_eq!(hit.x_cache(), "HIT", "{path}");
        assert_eq!(ttl(&hit), Some(want), "{path}: {:?}", hit.cache_status());
        assert_eq!(hit.body, first.body, "{path}");
    }
    for (path, why) in [
        ("/nostore", "response-directive"),
        ("/error", "server-error"),
        // A class never covers a status one request can cause for everyone (403: an address
        // rule, credentials): it goes on needing explicit freshness.
        ("/forbidden", "no-freshness"),
        // must-understand, no-store: stored only by the origin's own rules, never a made-up TTL.
        ("/must-understand", "no-freshness"),
    ] {
        for _ in 0..2 {
            let r = c.get(path, &[]);
            assert_eq!(
                (r.x_cache(), r.cache_status()),
                ("MISS", Some(format!("zerocache; fwd=miss; detail={why}"))),
                "{path}"
            );
        }
    }
    // Past the 404's minute (and the 4xx's ten seconds), each is asked again.
    proxy.advance_clock(61);
    assert_eq!(c.get("/missing", &[]).x_cache(), "EXPIRED");
    assert_eq!(c.get("/gone", &[]).x_cache(), "EXPIRED");
    assert_eq!(origin.hits("/missing"), 2);
}

/// `default_ttl: 2m` lost to the `Last-Modified` heuristic: a file modified 30 s ago was stored
/// for 3 s. The route's lifetime comes first, and the heuristic applies only where it is unset.
#[test]
fn default_ttl_comes_before_the_last_modified_heuristic() {
    let (origin, _rt) = origin();
    let lm =
        httpdate::fmt_http_date(std::time::SystemTime::now() - std::time::Duration::from_secs(30));
    origin.script(
        "/recent",
        Reply::ok(b"recent\n".to_vec()).headers(&[("Last-Modified", &lm)]),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    default_ttl: 2m\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/recent", &[]).x_cache(), "MISS");
    let hit = c.get("/recent", &[]);
    let ttl: Option<u64> = hit
        .header("cache-status")
        .and_then(|s| s.split("ttl=").nth(1)?.parse().ok());
    // 120 less the whole seconds since it was stored (one, if a second turned in between).
    assert!(matches!(ttl, Some(119..=120)), "{:?}", hit.cache_status());
    // Past the heuristic's 3 s it is still fresh.
    proxy.advance_clock(10);
    assert_eq!(c.get("/recent", &[]).x_cache(), "HIT");
    assert_eq!(origin.hits("/recent"), 1);
}
