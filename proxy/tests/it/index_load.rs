//! The cache index loads in the background while the proxy serves (`Store::load_in_background`):
//! an entry the load has not reached is found by the path its hash names (through its URL's
//! marker when it varies), a purge made meanwhile wins over the load, the cache stays under
//! `max_size`, and a `kill -9` during the load loses nothing. `debug.hold_index_load` holds the
//! load until the test says, so "during the load" is a state, not a race.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn reply(body: &str, headers: &[(&str, &str)]) -> Reply {
    Reply::ok(body.as_bytes().to_vec()).headers(headers)
}

/// Options holding the load until `gate` exists, with no scrub and no start-up sample (they
/// read entries too).
fn held(gate: &Path, cache_yaml: &str) -> Opts {
    Opts {
        cache_yaml: format!("  scrub_rate: 0\n  verify_on_start: 0\n{cache_yaml}"),
        debug_yaml: format!("  hold_index_load: {}\n", gate.display()),
        extra_yaml: "purge:\n  method: true\n  allowed_clients: [127.0.0.1]\n".into(),
        ..Opts::default()
    }
}

fn loading(p: &Proxy) -> u64 {
    metric(&p.metrics(), "zerocache_cache_index_loading")
}

fn objects(p: &Proxy) -> u64 {
    metric(&p.metrics(), "zerocache_cache_objects")
}

fn release(gate: &Path, p: &Proxy) {
    std::fs::write(gate, b"go").expect("gate");
    assert_eventually_eq("the load ends", Duration::from_secs(30), || loading(p), 0);
}

fn vary_origin(origin: &Origin) {
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
}

/// Stops `proxy` and deletes the index it wrote for the next start, so that start loads from
/// the entries, as after a crash (`kill -9` writes none).
fn stop_as_after_a_crash(proxy: &mut Proxy, dir: &Path) {
    proxy.stop();
    std::fs::remove_file(dir.join("state/index.snap")).expect("a snapshot at the stop");
}

/// Stores /obj/100, /obj/200, /obj/300 and /vary's br variant (four entries and a marker).
fn stock(proxy: &Proxy) {
    let mut c = proxy.client();
    for n in [100, 200, 300] {
        assert_eq!(c.get(&format!("/obj/{n}"), &[]).x_cache(), "MISS");
    }
    assert_eq!(
        c.get("/vary", &[("Accept-Encoding", "br")]).x_cache(),
        "MISS"
    );
}

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let gate = tmp.path().join("go");
    (tmp, dir, gate)
}

#[test]
fn before_the_load_reaches_them_entries_are_hits_by_their_hash_with_and_without_vary() {
    let (origin, _rt) = origin();
    vary_origin(&origin);
    let (tmp, dir, gate) = dirs();
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
    let mut c = proxy.client();
    assert_eq!(loading(&proxy), 1, "held");
    for n in [100, 200, 300] {
        assert_eq!(c.get(&format!("/obj/{n}"), &[]).x_cache(), "MISS");
    }
    for enc in ["gzip", "br"] {
        assert_eq!(
            c.get("/vary", &[("Accept-Encoding", enc)]).x_cache(),
            "MISS"
        );
    }
    drop(c);
    stop_as_after_a_crash(&mut proxy, &dir);

    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
    assert_eq!(
        (loading(&proxy), objects(&proxy)),
        (1, 0),
        "nothing indexed yet"
    );
    let health = Client::connect(proxy.dashboard).get("/healthz", &[]);
    assert_eq!(
        (health.status, &health.body[..]),
        (200, &b"ok\n"[..]),
        "healthy while loading"
    );
    let before = origin.received().len();
    let mut c = proxy.client();
    let r = c.get("/obj/200", &[]);
    assert_eq!((r.x_cache(), &r.body), ("HIT", &body(200)));
    let r = c.get("/vary", &[("Accept-Encoding", "br")]);
    assert_eq!((r.x_cache(), &r.body[..]), ("HIT", &b"br body"[..]));
    let r = c.get("/vary", &[("Accept-Encoding", "gzip")]);
    assert_eq!((r.x_cache(), &r.body[..]), ("HIT", &b"gzip body"[..]));
    assert_eq!(origin.received().len(), before, "all from the cache");
    // A variant never stored is a miss, not another variant's body.
    let r = c.get("/vary", &[]);
    assert_eq!((r.x_cache(), &r.body[..]), ("MISS", &b"plain body"[..]));
    // Found and indexed: /obj/200 and the two variants, and the miss just stored.
    assert_eq!(objects(&proxy), 4);
    release(&gate, &proxy);
    // The load found the rest, and counted nothing twice.
    assert_eq!(objects(&proxy), 6);
    for n in [100, 200, 300] {
        assert_eq!(c.get(&format!("/obj/{n}"), &[]).x_cache(), "HIT");
    }
}

#[test]
fn a_purge_during_the_load_wins_over_the_load_reaching_the_file() {
    purge_during_the_load(Ending::LoadEnds);
}

/// The same purges, then the process goes before its load ends: the next one's load (after a
/// snapshot that names none of what was purged, or after a crash) must not index what they
/// named either.
#[test]
fn a_purge_during_the_load_survives_a_stop_or_a_crash_before_the_load_ends() {
    purge_during_the_load(Ending::Stop);
    purge_during_the_load(Ending::Kill);
}

enum Ending {
    LoadEnds,
    Stop,
    Kill,
}

fn purge_during_the_load(ending: Ending) {
    let (origin, _rt) = origin();
    vary_origin(&origin);
    let (tmp, dir, gate) = dirs();
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    stock(&proxy);
    stop_as_after_a_crash(&mut proxy, &dir);

    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
    let mut c = proxy.client();
    // One the load has not reached and nobody asked for, one found by a request first, and a
    // varying URL by its marker: all purged while the load is held.
    assert_eq!(c.get("/obj/200", &[]).x_cache(), "HIT");
    for path in ["/obj/100", "/obj/200", "/vary"] {
        let r = c.request("PURGE", path, &[]);
        assert_eq!(r.status, 200, "{path}");
    }
    drop(c);
    match ending {
        Ending::LoadEnds => {}
        Ending::Stop => {
            proxy.stop();
            proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
        }
        Ending::Kill => {
            proxy.kill9();
            proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
        }
    }
    release(&gate, &proxy);
    assert!(
        !dir.join("state/load-purges").exists(),
        "a load that ends forgets its purges"
    );
    let mut c = proxy.client();
    assert_eq!(objects(&proxy), 1, "only /obj/300 is left");
    for path in ["/obj/100", "/obj/200"] {
        assert_eq!(c.get(path, &[]).x_cache(), "MISS", "{path}");
    }
    assert_eq!(
        c.get("/vary", &[("Accept-Encoding", "br")]).x_cache(),
        "MISS"
    );
    assert_eq!(c.get("/obj/300", &[]).x_cache(), "HIT");
}

#[test]
fn during_the_load_the_cache_stays_under_max_size_and_what_was_stored_before_leaves_first() {
    let (origin, _rt) = origin();
    let (tmp, dir, gate) = dirs();
    // Five of about 104 KiB each on disk (a 4 KiB head, a 100,000-byte body).
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    let mut c = proxy.client();
    for i in 1..=5 {
        assert_eq!(c.get(&format!("/obj/100000?i={i}"), &[]).x_cache(), "MISS");
    }
    drop(c);
    stop_as_after_a_crash(&mut proxy, &dir);
    // Room for four: one of the five stored before goes when the load reaches them, and the two
    // stored during the load stay (the load's entries are older than anything stored since).
    let proxy = Proxy::start_in(
        origin.addr(),
        &dir,
        tmp.path(),
        held(&gate, "  max_size: 430KiB\n"),
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/100000?i=6", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/obj/100000?i=7", &[]).x_cache(), "MISS");
    release(&gate, &proxy);
    let size = metric(&proxy.metrics(), "zerocache_cache_size_bytes");
    assert!(size <= 430 * 1024, "{size} bytes over max_size");
    assert_eq!(objects(&proxy), 4);
    assert_eq!(
        metric(&proxy.metrics(), "zerocache_cache_evictions_total"),
        3
    );
    for i in [6, 7] {
        assert_eq!(c.get(&format!("/obj/100000?i={i}"), &[]).x_cache(), "HIT");
    }
}

#[test]
fn a_kill_during_the_load_loses_nothing() {
    let (origin, _rt) = origin();
    vary_origin(&origin);
    let (tmp, dir, gate) = dirs();
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    stock(&proxy);
    stop_as_after_a_crash(&mut proxy, &dir);
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
    assert_eq!(proxy.get("/obj/100").x_cache(), "HIT");
    proxy.kill9();
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    assert_eventually_eq(
        "the load ends",
        Duration::from_secs(30),
        || loading(&proxy),
        0,
    );
    assert_eq!(objects(&proxy), 4);
    let mut c = proxy.client();
    for n in [100, 200, 300] {
        let r = c.get(&format!("/obj/{n}"), &[]);
        assert_eq!((r.x_cache(), &r.body), ("HIT", &body(n)));
    }
    let r = c.get("/vary", &[("Accept-Encoding", "br")]);
    assert_eq!((r.x_cache(), &r.body[..]), ("HIT", &b"br body"[..]));
}

#[test]
fn a_clean_stop_hands_its_index_to_the_next_start_and_a_kill_leaves_none() {
    let (origin, _rt) = origin();
    vary_origin(&origin);
    let (tmp, dir, gate) = dirs();
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
    stock(&proxy);
    proxy.stop();
    assert!(dir.join("state/index.snap").exists(), "written at the stop");
    // Held, the load has read nothing: what is counted came from the snapshot.
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
    assert_eq!((loading(&proxy), objects(&proxy)), (1, 4));
    assert!(!dir.join("state/index.snap").exists(), "read once");
    let r = proxy.client().get("/vary", &[("Accept-Encoding", "br")]);
    assert_eq!((r.x_cache(), &r.body[..]), ("HIT", &b"br body"[..]));
    // A process killed writes none, and the one read is gone: the next start loads.
    proxy.kill9();
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), held(&gate, ""));
    assert_eq!((loading(&proxy), objects(&proxy)), (1, 0));
    release(&gate, &proxy);
    assert_eq!(objects(&proxy), 4);
}
