//! Slices (`routes[].slice`): large objects fetched from the origin by aligned ranges, each slice
//! an entry of its own, fetched once, served by sendfile, never mixed across representations.

use crate::support::*;
use std::io::{Read, Write};

const MIB: u64 = 1 << 20;

fn sliced(size: &str) -> Opts {
    Opts {
        route_yaml: format!("    slice: {size}\n"),
        ..Opts::default()
    }
}

/// The `Range` fields the origin received for `path`, in order.
fn ranges_asked(origin: &Origin, path: &str) -> Vec<String> {
    origin
        .received()
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.header("range").unwrap_or("-").to_string())
        .collect()
}

/// Slice `k`'s range of `S`-byte slices, as the proxy asks for it.
fn slice_range(k: u64, s: u64) -> String {
    format!("bytes={}-{}", k * s, (k + 1) * s - 1)
}

/// GETs `path` on a new connection and reads until the proxy closes it: the head (lower case)
/// and the body bytes that came before the close.
fn read_cut(proxy: &Proxy, path: &str) -> (String, Vec<u8>) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let got = match send_then_read_to_close(
        proxy.addr,
        req.as_bytes(),
        false,
        std::time::Duration::from_secs(20),
    ) {
        Ending::Closed(got) => got,
        Ending::Open(got) => panic!("not closed after {} bytes", got.len()),
    };
    let at = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let head = String::from_utf8_lossy(&got[..at]).to_ascii_lowercase();
    (head, got[at..].to_vec())
}

fn generated(a: u64, b: u64) -> Vec<u8> {
    (a..=b).map(zerocache_origin::pattern_byte).collect()
}

#[test]
fn a_cold_range_in_the_middle_of_a_256mib_object_fetches_only_the_covering_slices() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), sliced("4MiB"));
    let path = "/ranged/268435456";
    let mut c = proxy.client();
    let r = c.get(path, &[("Range", "bytes=100000000-100999999")]);
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        Some("bytes 100000000-100999999/268435456")
    );
    assert_eq!(r.header("content-length"), Some("1000000"));
    assert_eq!(r.x_cache(), "MISS");
    assert_eq!(r.header("etag"), Some("\"ranged-268435456\""));
    assert_eq!(r.body, generated(100_000_000, 100_999_999));
    // Slices 23 and 24 of 64, and nothing else.
    assert_eq!(
        ranges_asked(&origin, path),
        [slice_range(23, 4 * MIB), slice_range(24, 4 * MIB)]
    );
    // Another client's overlapping range: both slices stored, a HIT.
    let mut other = proxy.client();
    let r = other.get(path, &[("Range", "bytes=99000000-100100000")]);
    assert_eq!((r.status, r.x_cache()), (206, "HIT"));
    assert_eq!(r.cache_status().as_deref(), Some("zerocache; hit"));
    assert_eq!(r.body, generated(99_000_000, 100_100_000));
    assert_eq!(origin.hits(path), 2);
    // A range ending at the object's end, and one past it, from what is stored.
    let r = other.get(path, &[("Range", "bytes=268435456-")]);
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */268435456"));
}

#[test]
fn a_full_get_after_a_range_fetches_only_the_missing_slices() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    // Five whole slices and a short sixth.
    let total = 5 * MIB + 123_457;
    let path = format!("/ranged/{total}");
    let mut c = proxy.client();
    let r = c.get(&path, &[("Range", "bytes=2500000-2600000")]);
    assert_eq!((r.status, r.body.len()), (206, 100_001));
    assert_eq!(ranges_asked(&origin, &path), [slice_range(2, MIB)]);
    // The range ended inside slice 2; its fill goes on to the slice's end.
    wait_for_slices(&proxy, 1);
    // One object, cached in part: one slice of six.
    let census = |proxy: &Proxy| {
        let m = proxy.metrics();
        let g = |name: &str| {
            m.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{name}: {m}"))
        };
        (
            g("zerocache_slice_objects"),
            g("zerocache_slice_objects_partial"),
            g("zerocache_slices"),
        )
    };
    assert_eq!(census(&proxy), (1, 1, 1));
    let r = c.get(&path, &[]);
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert_eq!(r.header("content-length"), Some(total.to_string().as_str()));
    assert_eq!(r.header("content-range"), None);
    assert_eq!(r.body, generated(0, total - 1));
    let mut asked = ranges_asked(&origin, &path);
    asked.sort();
    let mut want: Vec<String> = (0..6).map(|k| slice_range(k, MIB)).collect();
    want.sort();
    assert_eq!(asked, want, "each slice once");
    assert_eq!(census(&proxy), (1, 0, 6), "whole now");
    // Whole and stored: a HIT, a suffix range too, no origin request.
    let r = c.get(&path, &[]);
    assert_eq!((r.x_cache(), r.body.len() as u64), ("HIT", total));
    let r = c.get(&path, &[("Range", "bytes=-10")]);
    assert_eq!(r.status, 206);
    assert_eq!(r.body, generated(total - 10, total - 1));
    // A HEAD from slice 0's fields, with the object's length.
    let h = c.request("HEAD", &path, &[]);
    assert_eq!((h.status, h.x_cache()), (200, "HIT"));
    assert_eq!(h.header("content-length"), Some(total.to_string().as_str()));
    assert_eq!(h.header("content-range"), None);
    // A condition answered from the first slice's validators.
    let r = c.get(&path, &[("If-None-Match", &format!("\"ranged-{total}\""))]);
    assert_eq!((r.status, r.body.len()), (304, 0));
    assert_eq!(origin.hits(&path), 6);
    // A purge of the URL takes every slice.
    let (status, v) = proxy.purge(&format!(r#"{{"url": "http://test.example{path}"}}"#));
    assert_eq!((status, v), (200, serde_json::json!({"purged": 6})));
    assert_eq!(census(&proxy), (0, 0, 0));
    let r = c.get(&path, &[("Range", "bytes=0-0")]);
    assert_eq!((r.status, r.x_cache(), r.body.len()), (206, "MISS", 1));
    assert_eq!(origin.hits(&path), 7);
}

/// Waits until `n` slices are stored (`zerocache_slices`): a response read behind a slice's
/// fill can end before the fill does. The guard bounds a hang; it measures nothing.
fn wait_for_slices(proxy: &Proxy, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let m = proxy.metrics();
        let stored = m
            .lines()
            .find_map(|l| l.strip_prefix("zerocache_slices "))
            .and_then(|v| v.parse::<u64>().ok());
        if stored == Some(n) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{n} slices never stored: {m}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A body of `len` bytes unlike the generated pattern, for a second version of an object.
fn second_version(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 253) as u8 ^ 0x5a).collect()
}

fn version(body: Vec<u8>, etag: &str) -> Reply {
    Reply::ok(body)
        .headers(&[("Cache-Control", "max-age=3600"), ("ETag", etag)])
        .ranged()
}

#[test]
fn an_object_that_changed_at_the_origin_is_never_served_mixed() {
    let (origin, _rt) = origin();
    let len = 3 * MIB as usize + 10;
    let a = zerocache_origin::body(len);
    let b = second_version(len);
    origin.script("/v", version(a.clone(), "\"a\""));
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    // Slice 1 stored from version a.
    let r = c.get("/v", &[("Range", "bytes=1048576-1048675")]);
    assert_eq!(r.body, &a[1_048_576..1_048_676]);
    wait_for_slices(&proxy, 1);
    // The object changes. A full GET starts from slice 0 (version b), finds slice 1 of version a
    // before its head is sent, drops every slice and starts over: all of version b.
    origin.script("/v", version(b.clone(), "\"b\""));
    let r = c.get("/v", &[]);
    assert_eq!((r.status, r.header("etag")), (200, Some("\"b\"")));
    assert!(r.body == b, "the whole of version b");
    let r = c.get("/v", &[]);
    assert_eq!(r.x_cache(), "HIT");
    assert!(r.body == b);
    let m = proxy.metrics();
    assert!(m.contains("zerocache_slice_objects_changed_total 1"), "{m}");
}

#[test]
fn a_slice_of_another_version_after_the_head_closes_the_connection_mid_body() {
    let (origin, _rt) = origin();
    let len = 3 * MIB as usize;
    let a = zerocache_origin::body(len);
    let b = second_version(len);
    // An origin whose slices 1 and 2 are already version b while slice 0 is still version a
    // (a cluster mid-deploy).
    origin.script_by_header(
        "/mid",
        "range",
        vec![
            (Some(&slice_range(0, MIB)), version(a.clone(), "\"a\"")),
            (Some(&slice_range(1, MIB)), version(b.clone(), "\"b\"")),
            (Some(&slice_range(2, MIB)), version(b.clone(), "\"b\"")),
        ],
    );
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let (head, body) = read_cut(&proxy, "/mid");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains(&format!("content-length: {len}\r\n")),
        "{head}"
    );
    // Version a's first slice, then the close: never a byte of version b.
    assert_eq!(body.len() as u64, MIB, "cut after slice 0");
    assert!(body == a[..MIB as usize]);
}

#[test]
fn an_origin_that_ignores_range_is_served_whole() {
    let (origin, _rt) = origin();
    let len = 2 * MIB as usize + 5;
    let whole = zerocache_origin::body(len);
    // A plain origin: a 200 of the whole body whatever the Range.
    origin.script("/plain", Reply::ok(whole.clone()));
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    let r = c.get("/plain", &[("Range", "bytes=10-19")]);
    // The slice request's 200 is dropped; the range goes to the origin as it came, whose 200
    // is relayed.
    assert_eq!(r.status, 200);
    assert!(r.body == whole);
    // From now on the object is stored whole, as on a route without slices.
    let r = c.get("/plain", &[]);
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    let r = c.get("/plain", &[("Range", "bytes=10-19")]);
    assert_eq!((r.status, r.x_cache()), (206, "HIT"));
    assert_eq!(r.body, &whole[10..20]);
    assert_eq!(origin.hits("/plain"), 3);
}

#[test]
fn several_ranges_are_one_multipart_answer_from_the_slices_they_cover() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let path = "/ranged/20971520";
    let mut c = proxy.client();
    let asked = "bytes=10485760-10485761, 0-1, 1-3";
    let r = c.get(path, &[("Range", asked)]);
    assert_eq!((r.status, r.x_cache()), (206, "MISS"));
    // Slices 0 and 10 only: nothing between the ranges is pulled.
    let mut got = ranges_asked(&origin, path);
    got.sort();
    assert_eq!(got, [slice_range(0, MIB), slice_range(10, MIB)]);
    let ct = r.header("content-type").expect("content-type").to_string();
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .expect("multipart")
        .to_string();
    assert_eq!(r.header("content-range"), None);
    // 0-1 and 1-3 merged; the parts in ascending order, each with the object's type.
    let part = |a: u64, b: u64| {
        let mut p = format!(
            "\r\n--{boundary}\r\nContent-Type: video/mp4\r\nContent-Range: bytes {a}-{b}/20971520\r\n\r\n"
        )
        .into_bytes();
        p.extend(generated(a, b));
        p
    };
    let mut want = part(0, 3);
    want.extend(part(10_485_760, 10_485_761));
    want.extend(format!("\r\n--{boundary}--\r\n").into_bytes());
    assert_eq!(
        r.header("content-length"),
        Some(want.len().to_string().as_str())
    );
    assert!(r.body == want, "{:?}", String::from_utf8_lossy(&r.body));
    // Stored (once both fills reach their slices' ends): the same ranges again are a HIT, with
    // another boundary.
    wait_for_slices(&proxy, 2);
    let again = c.get(path, &[("Range", asked)]);
    assert_eq!((again.status, again.x_cache()), (206, "HIT"));
    assert_ne!(again.header("content-type"), Some(ct.as_str()));
    assert_eq!(origin.hits(path), 2);
    // Ranges that merge into one are a plain 206; none satisfiable is a 416.
    let r = c.get(path, &[("Range", "bytes=0-1,2-3")]);
    assert_eq!(r.header("content-range"), Some("bytes 0-3/20971520"));
    assert_eq!(r.body, generated(0, 3));
    let r = c.get(path, &[("Range", "bytes=30000000-,40000000-")]);
    assert_eq!(r.status, 416);
    assert_eq!(origin.hits(path), 2);
}

#[test]
fn a_kill_during_a_slice_fill_leaves_no_slice_behind() {
    let (origin, _rt) = origin();
    let len = 2 * MIB as usize;
    let a = zerocache_origin::body(len);
    // Slice 0 trickles: the proxy is killed while it is being written.
    origin.script(
        "/k",
        version(a.clone(), "\"a\"").trickle(64 * 1024, std::time::Duration::from_millis(100)),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let mut proxy = Proxy::start_in(origin.addr(), &cache, dir.path(), sliced("1MiB"));
    let addr = proxy.addr;
    let t = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /k HTTP/1.1\r\nHost: test.example\r\n\r\n")
            .expect("send");
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    while origin.hits("/k") == 0 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    proxy.kill9();
    t.join().expect("client");
    origin.script("/k", version(a.clone(), "\"a\""));
    let proxy = Proxy::start_in(origin.addr(), &cache, dir.path(), sliced("1MiB"));
    let mut c = proxy.client();
    let r = c.get("/k", &[]);
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert!(r.body == a);
    let r = c.get("/k", &[]);
    assert_eq!(r.x_cache(), "HIT");
    assert!(r.body == a);
}

#[test]
fn h2_ranges_and_whole_objects_come_from_the_same_slices() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            listen_options: "h2c: true".into(),
            ..sliced("1MiB")
        },
    );
    let total = 3 * MIB + 7;
    let path = format!("/ranged/{total}");
    let url = format!("http://{}{path}", proxy.addr);
    let curl = |extra: &[&str]| {
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "20",
                "--http2-prior-knowledge",
                "-D",
                "-",
            ])
            .args(extra)
            .arg(&url)
            .output()
            .expect("curl");
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    let split = |raw: &[u8]| {
        let at = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
        (
            String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase(),
            raw[at..].to_vec(),
        )
    };
    let (head, body) = split(&curl(&["-r", "1048570-1048580"]));
    assert!(head.starts_with("http/2 206"), "{head}");
    assert!(
        head.contains("content-range: bytes 1048570-1048580/3145735"),
        "{head}"
    );
    assert_eq!(body, generated(1_048_570, 1_048_580));
    let (head, body) = split(&curl(&[]));
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(head.contains("x-cache: miss"), "{head}");
    assert!(body == generated(0, total - 1));
    let (head, _) = split(&curl(&[]));
    assert!(head.contains("x-cache: hit"), "{head}");
    assert_eq!(origin.hits(&path), 4, "each slice once");
}

#[test]
fn a_hit_across_two_slices_is_sendfile_from_each_slice_file() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            probe: true,
            ..sliced("1MiB")
        },
    );
    let path = "/ranged/4194304";
    // Filled on one connection.
    assert_eq!(
        proxy
            .client()
            .get(path, &[("Range", "bytes=1000000-1100000")])
            .x_cache(),
        "MISS"
    );
    // The miss ended once its bytes were in; the fills of slices 0 and 1 go on to their ends.
    wait_for_slices(&proxy, 2);
    // Hit on another: the body is the kernel's sendfile from slices 0 and 1, the head the
    // only copied bytes.
    let mut c = proxy.client();
    let r = c.get(path, &[("Range", "bytes=1000000-1100000")]);
    assert_eq!((r.status, r.x_cache()), (206, "HIT"));
    assert_eq!(r.body, generated(1_000_000, 1_100_000));
    let local = c.sock.local_addr().expect("local").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    let k = &conn["kernel"];
    assert_eq!(u(&k["zerocopy_bytes"]), 100_001, "{conn}");
    assert_eq!(u(&k["copy_bytes"]), r.head_len as u64, "{conn}");
    assert_eq!(conn["verdict"], "zero-copy");
    // One sendfile per slice (index 0 of the kinds).
    assert_eq!(u(&k["counts"]["by_kind"][0]["calls"]), 2, "{conn}");
    // Two ranges in one multipart answer: the bytes by sendfile, the framing written with the
    // head, and the ledger agrees (no violation).
    let mut c = proxy.client();
    let r = c.get(path, &[("Range", "bytes=1000000-1000009,1100000-1100009")]);
    assert_eq!((r.status, r.x_cache()), (206, "HIT"));
    let framing = r.body.len() as u64 - 20;
    let local = c.sock.local_addr().expect("local").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    let k = &conn["kernel"];
    assert_eq!(u(&k["zerocopy_bytes"]), 20, "{conn}");
    assert_eq!(u(&k["copy_bytes"]), r.head_len as u64 + framing, "{conn}");
    assert_eq!(conn["verdict"], "zero-copy", "{conn}");
    assert_eq!(u(&conn["violations"]), 0, "{conn}");
}

#[test]
fn slice_metrics_and_the_access_log_count_fetches_and_hits() {
    let (origin, _rt) = origin();
    origin.script("/plain", Reply::ok(zerocache_origin::body(1000)));
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!(
                "logging:\n  access_log: {}\n  access_log_format: '$status $cache_status $slices $slices_fetched $zero_copy'\n",
                log.display()
            ),
            ..sliced("256KiB")
        },
    );
    let mut c = proxy.client();
    let path = "/ranged/600000";
    assert_eq!(c.get(path, &[]).x_cache(), "MISS");
    assert_eq!(
        c.get(path, &[("Range", "bytes=300000-300009")]).x_cache(),
        "HIT"
    );
    assert_eq!(c.get("/plain", &[]).status, 200);
    let m = proxy.metrics();
    for line in [
        "zerocache_slice_fetches_total 3",
        "zerocache_slice_fetched_bytes_total 600000",
        // The second request's one slice.
        "zerocache_slice_hits_total 1",
        "zerocache_slice_objects_changed_total 0",
        "zerocache_slice_unsliced_total{reason=\"slice-whole\"} 1",
        "zerocache_slice_unsliced_total{reason=\"slice-vary\"} 0",
    ] {
        assert!(m.lines().any(|l| l == line), "{line}: {m}");
    }
    let stats = proxy.api("/api/stats");
    let sl = &stats["slices"];
    assert_eq!(
        (u(&sl["fetches"]), u(&sl["fetched_bytes"]), u(&sl["hits"])),
        (3, 600_000, 1),
        "{sl}"
    );
    assert_eq!(sl["unsliced"], serde_json::json!({"slice-whole": 1}));
    // Three slices, all fetched; one slice, none fetched; an object not sliced (stored whole, read
    // behind its fill by sendfile).
    assert_eq!(
        log_lines(&log, 3),
        ["200 MISS 3 3 yes", "206 HIT 1 0 yes", "200 MISS - - yes"]
    );
}

#[test]
fn prefix_tag_and_soft_purges_cover_every_slice() {
    let (origin, _rt) = origin();
    let len = 3 * MIB as usize;
    let a = zerocache_origin::body(len);
    let tagged = |etag: &str| {
        Reply::ok(a.clone())
            .headers(&[
                ("Cache-Control", "max-age=3600"),
                ("ETag", etag),
                ("Surrogate-Key", "video:7"),
            ])
            .ranged()
    };
    origin.script("/p/v", tagged("\"a\""));
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    let fill = |c: &mut Client| {
        let r = c.get("/p/v", &[]);
        assert!(r.body == a);
        r.x_cache().to_string()
    };
    assert_eq!(fill(&mut c), "MISS");
    assert_eq!(
        proxy.purge(r#"{"tags": ["video:7"]}"#),
        (200, serde_json::json!({"purged": 3}))
    );
    assert_eq!(fill(&mut c), "MISS");
    assert_eq!(
        proxy.purge(r#"{"prefix": "http://test.example/p/"}"#),
        (200, serde_json::json!({"purged": 3}))
    );
    assert_eq!(fill(&mut c), "MISS");
    assert_eq!(origin.hits("/p/v"), 9);
    // Soft: every slice stays, stale, and is fetched again (this origin ignores If-None-Match,
    // so its answer to the revalidation is the slice).
    let (status, _) = proxy.purge(r#"{"url": "http://test.example/p/v", "soft": true}"#);
    assert_eq!(status, 200);
    assert_eq!(fill(&mut c), "MISS");
    assert_eq!(origin.hits("/p/v"), 12);
    assert_eq!(fill(&mut c), "HIT");
}

#[test]
fn concurrent_clients_of_one_cold_slice_fetch_it_once() {
    let (origin, _rt) = origin();
    let len = 2 * MIB as usize;
    let a = zerocache_origin::body(len);
    origin.script(
        "/slow",
        version(a.clone(), "\"a\"").delay(std::time::Duration::from_millis(300)),
    );
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let addr = proxy.addr;
    let clients: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                let at = 1000 * i;
                Client::connect(addr).get("/slow", &[("Range", &format!("bytes={at}-{}", at + 99))])
            })
        })
        .collect();
    for (i, t) in clients.into_iter().enumerate() {
        let r = t.join().expect("client");
        assert_eq!(r.status, 206);
        assert!(r.body == a[1000 * i..1000 * i + 100]);
    }
    assert_eq!(ranges_asked(&origin, "/slow"), [slice_range(0, MIB)]);
}

#[test]
fn what_one_client_sends_neither_drops_slices_nor_unslices_the_object() {
    let (origin, _rt) = origin();
    let len = 3 * MIB as usize;
    let a = zerocache_origin::body(len);
    // The origin refuses slice requests that carry a cookie it does not like.
    origin.script_by_header(
        "/o",
        "cookie",
        vec![
            (None, version(a.clone(), "\"a\"")),
            (Some("evil=1"), Reply::ok(b"no".to_vec()).status(403)),
        ],
    );
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    assert_eq!(c.get("/o", &[("Range", "bytes=0-9")]).x_cache(), "MISS");
    wait_for_slices(&proxy, 1);
    // Credentials, no-store and a refused cookie each go the ordinary way for that client alone.
    let r = c.get("/o", &[("Authorization", "Basic eDp5")]);
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert!(r.body == a);
    let r = c.get(
        "/o",
        &[("Cache-Control", "no-store"), ("Range", "bytes=0-9")],
    );
    assert_eq!(r.status, 206);
    let r = c.get(
        "/o",
        &[("Cookie", "evil=1"), ("Range", "bytes=2097152-2097161")],
    );
    assert_eq!(r.status, 403);
    // Slice 0 is still stored for everyone, and the object still sliced.
    let r = c.get("/o", &[("Range", "bytes=0-9")]);
    assert_eq!((r.status, r.x_cache()), (206, "HIT"));
    assert_eq!(r.body, &a[..10]);
    let r = c.get("/o", &[("Range", "bytes=2097152-2097161")]);
    assert_eq!((r.status, r.x_cache()), (206, "MISS"));
    assert_eq!(r.body, &a[2_097_152..2_097_162]);
    let m = proxy.metrics();
    assert!(
        m.lines()
            .all(|l| !l.starts_with("zerocache_slice_unsliced_total") || l.ends_with(" 0")),
        "{m}"
    );
}

#[test]
fn objects_without_a_strong_etag_or_fresh_slices_are_served_unsliced() {
    let (origin, _rt) = origin();
    let len = 2 * MIB as usize + 3;
    let a = zerocache_origin::body(len);
    let lm = Reply::ok(a.clone())
        .headers(&[
            ("Cache-Control", "max-age=3600"),
            ("Last-Modified", "Tue, 01 Dec 2026 00:00:00 GMT"),
        ])
        .ranged();
    origin.script("/lm", lm);
    origin.script(
        "/nc",
        Reply::ok(a.clone())
            .headers(&[("Cache-Control", "no-cache"), ("ETag", "\"n\"")])
            .ranged(),
    );
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    for path in ["/lm", "/nc"] {
        let r = c.get(path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body == a, "{path}");
        // The ordinary way: stored whole (a no-cache one revalidated by a GET this origin
        // answers whole, which may be relayed whole: a server may ignore Range).
        let r = c.get(path, &[("Range", "bytes=5-9")]);
        match r.status {
            206 => assert!(r.body == a[5..10], "{path}"),
            200 => assert!(r.body == a, "{path}"),
            s => panic!("{path}: {s}"),
        }
    }
    // An empty object: a 200, not a 416.
    let r = c.get("/ranged/0", &[]);
    assert_eq!((r.status, r.body.len()), (200, 0));
    let m = proxy.metrics();
    for line in [
        "zerocache_slice_unsliced_total{reason=\"slice-no-etag\"} 1",
        "zerocache_slice_unsliced_total{reason=\"slice-stale\"} 1",
    ] {
        assert!(m.lines().any(|l| l == line), "{line}: {m}");
    }
}

#[test]
fn an_origin_whose_ranges_carry_their_own_etag_is_served_unsliced_after_one_cut() {
    let (origin, _rt) = origin();
    let len = 2 * MIB as usize;
    let a = zerocache_origin::body(len);
    // An ETag middleware hashing each answer's own bytes: every range its own ETag.
    origin.script_by_header(
        "/u",
        "range",
        vec![
            (None, version(a.clone(), "\"whole\"")),
            (Some(&slice_range(0, MIB)), version(a.clone(), "\"r0\"")),
            (Some(&slice_range(1, MIB)), version(a.clone(), "\"r1\"")),
        ],
    );
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let (_, body) = read_cut(&proxy, "/u");
    assert_eq!(body.len(), MIB as usize, "cut after slice 0");
    // From now on the ordinary way: the whole object, whole.
    let mut c = proxy.client();
    let r = c.get("/u", &[]);
    assert_eq!((r.status, r.header("etag")), (200, Some("\"whole\"")));
    assert!(r.body == a);
    let m = proxy.metrics();
    assert!(
        m.lines()
            .any(|l| l == "zerocache_slice_unsliced_total{reason=\"slice-unstable\"} 1"),
        "{m}"
    );
}

/// Scripts `path` as version `"a"` of `body`, answering `If-None-Match: "a"` with a 304 that
/// names `etag_304`.
fn revalidates(origin: &Origin, path: &str, body: &[u8], etag_304: &str) {
    origin.script_by_header(
        path,
        "if-none-match",
        vec![
            (None, version(body.to_vec(), "\"a\"")),
            (
                Some("\"a\""),
                Reply::ok(Vec::new())
                    .status(304)
                    .headers(&[("ETag", etag_304), ("Cache-Control", "max-age=3600")]),
            ),
        ],
    );
}

#[test]
fn stale_slices_are_revalidated_by_their_etag() {
    let (origin, _rt) = origin();
    let len = 3 * MIB as usize;
    let a = zerocache_origin::body(len);
    revalidates(&origin, "/r", &a, "\"a\"");
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    assert_eq!(c.get("/r", &[]).x_cache(), "MISS");
    proxy.advance_clock(4000);
    // Every slice stale: each revalidated with its range and its ETag, none fetched again.
    let r = c.get("/r", &[]);
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert!(r.body == a);
    let asked: Vec<(String, String)> = origin
        .received()
        .iter()
        .filter(|q| q.path == "/r")
        .skip(3)
        .map(|q| {
            (
                q.header("range").unwrap_or("-").to_string(),
                q.header("if-none-match").unwrap_or("-").to_string(),
            )
        })
        .collect();
    let mut asked = asked;
    asked.sort();
    let want: Vec<(String, String)> = (0..3)
        .map(|k| (slice_range(k, MIB), "\"a\"".to_string()))
        .collect();
    assert_eq!(asked, want);
    let m = proxy.metrics();
    for line in [
        "zerocache_slice_revalidations_total 3",
        "zerocache_slice_fetches_total 3",
    ] {
        assert!(m.lines().any(|l| l == line), "{line}: {m}");
    }
    // Fresh again: a HIT.
    let r = c.get("/r", &[("Range", "bytes=2097150-2097160")]);
    assert_eq!((r.status, r.x_cache()), (206, "HIT"));
    assert_eq!(r.body, &a[2_097_150..2_097_161]);
    assert_eq!(origin.hits("/r"), 6);
}

#[test]
fn a_range_is_sent_as_its_slice_arrives_not_after_the_whole_slice() {
    let (origin, _rt) = origin();
    let len = 2 * MIB as usize;
    let a = zerocache_origin::body(len);
    // The origin sends a quarter of the slice, then nothing for a minute.
    origin.script(
        "/t",
        version(a.clone(), "\"t\"").trickle(256 * 1024, std::time::Duration::from_secs(60)),
    );
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    let r = c.get("/t", &[("Range", "bytes=100-199")]);
    assert_eq!((r.status, r.x_cache()), (206, "MISS"));
    assert_eq!(r.body, &a[100..200]);
    // Answered from the first quarter: the slice is still being filled, not stored.
    let m = proxy.metrics();
    for line in ["zerocache_slices 0", "zerocache_slice_fetches_total 1"] {
        assert!(m.lines().any(|l| l == line), "{line}: {m}");
    }
    // A second client reads behind the same fill: no second origin request, and not from the
    // store, so a MISS.
    let r = proxy.client().get("/t", &[("Range", "bytes=200-299")]);
    assert_eq!((r.status, r.body.as_slice()), (206, &a[200..300]));
    assert_eq!(r.x_cache(), "MISS");
    assert_eq!(origin.hits("/t"), 1);
}

#[test]
fn a_304_naming_other_validators_is_not_taken_for_the_stale_slice() {
    let (origin, _rt) = origin();
    let len = MIB as usize + MIB as usize / 2;
    let a = zerocache_origin::body(len);
    // An origin whose 304 names another ETag than the one asked about.
    revalidates(&origin, "/l", &a, "\"b\"");
    let proxy = Proxy::start(origin.addr(), sliced("1MiB"));
    let mut c = proxy.client();
    assert_eq!(c.get("/l", &[]).x_cache(), "MISS");
    proxy.advance_clock(4000);
    let r = c.get("/l", &[]);
    assert_eq!((r.status, r.header("etag")), (200, Some("\"a\"")));
    assert!(r.body == a);
    // Each slice: the conditional request, then the whole slice again without it.
    let conditions: Vec<String> = origin
        .received()
        .iter()
        .filter(|q| q.path == "/l")
        .skip(2)
        .map(|q| q.header("if-none-match").unwrap_or("-").to_string())
        .collect();
    let mut sorted = conditions.clone();
    sorted.sort();
    assert_eq!(sorted, ["\"a\"", "\"a\"", "-", "-"], "{conditions:?}");
    let m = proxy.metrics();
    assert!(
        m.lines()
            .any(|l| l == "zerocache_slice_revalidations_total 0"),
        "{m}"
    );
}
