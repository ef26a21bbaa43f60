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
