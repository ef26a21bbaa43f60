//! Bad input and faults: every one gets its answer, nothing bad is stored, and the proxy keeps
//! serving other connections.

use crate::support::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn raw(proxy: &Proxy, request: &[u8]) -> (Response, bool) {
    let mut c = proxy.client();
    c.send(request);
    let r = c.read_response(false);
    let closed = c.is_closed();
    (r, closed)
}

#[test]
fn malformed_requests_get_their_4xx_and_close() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  max_header_bytes: 4KiB\n  max_uri_bytes: 1KiB\n".into(),
            ..Opts::default()
        },
    );
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(2000));
    let big_head = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "b".repeat(5000)
    );
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("bad method token", b"GE T / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(), 400),
        ("bad header", b"GET / HTTP/1.1\r\nHost a\r\n\r\n".to_vec(), 400),
        ("no host", b"GET / HTTP/1.1\r\n\r\n".to_vec(), 400),
        ("long uri", long_uri.into_bytes(), 414),
        ("big head", big_head.into_bytes(), 431),
        ("CL and TE", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), 400),
        ("two CLs", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde".to_vec(), 400),
        ("bad chunked body", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(), 400),
    ];
    for (name, req, status) in cases {
        let (r, closed) = raw(&proxy, &req);
        assert_eq!(r.status, status, "{name}");
        assert_eq!(r.header("connection"), Some("close"), "{name}");
        assert!(closed, "{name}: connection must close");
    }
    // Nothing reached the origin, and the proxy still serves.
    assert_eq!(origin.request_count(), 0);
    assert_eq!(proxy.get("/obj/10").body, body(10));
}

#[test]
fn slow_request_heads_get_408() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  header_timeout: 300ms\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    c.send(b"GET /obj/1 HTTP/1.1\r\nHost:");
    let started = Instant::now();
    let r = c.read_response(false);
    assert_eq!(r.status, 408);
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(c.is_closed());
    // An idle keep-alive connection is not a slow request: it is closed quietly, not with 408.
    assert_eq!(proxy.get("/obj/1").status, 200);
}

#[test]
fn upstream_failures_map_to_502_and_504_and_store_nothing() {
    let (origin, _rt) = origin();
    origin.script(
        "/slow",
        Reply::ok(b"late".to_vec()).delay(Duration::from_secs(3)),
    );
    origin.script("/hangup", Reply::hang_up());
    // Nine interim responses: more than any origin needs, and a way to hold an exchange open.
    let mut chatty = Reply::ok(b"x".to_vec());
    for _ in 0..9 {
        chatty = chatty.interim(100, &[]);
    }
    origin.script("/chatty", chatty);
    origin.script(
        "/ambiguous",
        Reply::ok(b"x".to_vec()).headers(&[
            ("Cache-Control", "max-age=60"),
            ("Transfer-Encoding", "chunked"),
        ]),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            upstream_yaml: "    read_timeout: 500ms\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    let r = c.get("/slow", &[]);
    assert_eq!(r.status, 504);
    let r = c.get("/hangup", &[]);
    assert_eq!(r.status, 502);
    let r = c.get("/ambiguous", &[]);
    assert_eq!(r.status, 502);
    assert_eq!(c.get("/ambiguous", &[]).status, 502);
    assert_eq!(origin.hits("/ambiguous"), 2, "a 502 must not be cached");
    assert_eq!(c.get("/chatty", &[]).status, 502);
    // The same client connection is still usable.
    assert_eq!(c.get("/obj/5", &[]).body, body(5));
    let m = proxy.metrics();
    assert!(
        m.contains("zerocache_upstream_errors_total{kind=\"timeout\",upstream=\"origin\"} 1"),
        "{m}"
    );
}

#[test]
fn unreachable_upstream_gets_502_and_failover_uses_the_next_server() {
    let (origin, _rt) = origin();
    let dead = free_port();
    // Only a dead server: 502.
    let proxy = Proxy::start(
        format!("127.0.0.1:{dead}").parse().expect("addr"),
        Opts::default(),
    );
    assert_eq!(proxy.get("/obj/1").status, 502);
    drop(proxy);
    // A dead server first, then the origin: served.
    let tmp = tempfile::tempdir().expect("tmp");
    let yaml = format!(
        "listen: 127.0.0.1:{{port}}\ncache: {{path: {}, max_size: 1GiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:{dead}\", \"{}\"]}}\nroutes:\n  - match: {{host: \"*\", path_prefix: /}}\n    upstream: o\ndashboard: {{listen: \"127.0.0.1:{{dport}}\"}}\nprobe: {{enabled: false}}\n",
        tmp.path().join("cache").display(),
        origin.addr()
    );
    let proxy = Proxy::from_yaml(&yaml, tmp.path());
    let r = proxy.get("/obj/77");
    assert_eq!((r.status, r.body), (200, body(77)));
}

#[test]
fn truncated_upstream_body_closes_the_client_and_is_never_stored() {
    let (origin, _rt) = origin();
    origin.script(
        "/trunc",
        Reply::ok(body(100_000)).framing(Framing::Truncate(60_000)),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    for _ in 0..2 {
        let mut c = proxy.client();
        c.send(b"GET /trunc HTTP/1.1\r\nHost: test.example\r\n\r\n");
        // The head promised 100,000 bytes; the connection must end short, not carry on. It ends
        // with a reset, so that not even a close-delimited reader could take it as complete.
        let mut all = Vec::new();
        let end = c.sock.read_to_end(&mut all);
        assert_eq!(
            end.map_err(|e| e.kind()).err(),
            Some(std::io::ErrorKind::ConnectionReset)
        );
        let head_end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
        assert!(String::from_utf8_lossy(&all[..head_end]).contains("Content-Length: 100000"));
        assert_eq!(all.len() - head_end, 60_000);
    }
    assert_eq!(
        origin.hits("/trunc"),
        2,
        "a truncated body must not be stored"
    );
    assert_eq!(
        std::fs::read_dir(proxy.dir.join("tmp"))
            .expect("tmp")
            .count(),
        0
    );
}

#[test]
fn restart_keeps_the_cache_and_kill9_mid_fill_leaves_no_entry() {
    let (origin, _rt) = origin();
    origin.script(
        "/trickle",
        Reply::ok(body(400_000)).trickle(50_000, Duration::from_millis(100)),
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    assert_eq!(proxy.get("/obj/3000").x_cache(), "MISS");
    // Start a slow fill and kill the proxy in the middle of it.
    let mut c = proxy.client();
    c.send(b"GET /trickle HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let mut first = [0u8; 1024];
    let _ = c.sock.read(&mut first).expect("some bytes");
    std::thread::sleep(Duration::from_millis(150));
    proxy.kill9();
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    let hit = proxy.get("/obj/3000");
    assert_eq!((hit.x_cache(), hit.body.clone()), ("HIT", body(3000)));
    let again = proxy.get("/trickle");
    assert_eq!((again.x_cache(), again.body.len()), ("MISS", 400_000));
    assert_eq!(proxy.stop().code(), Some(0));
}

#[test]
fn corrupt_entries_are_discarded_at_startup() {
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    proxy.get("/obj/5000");
    proxy.get("/obj/6000");
    proxy.kill9();
    let files: Vec<std::path::PathBuf> = walk(&dir);
    assert_eq!(files.len(), 2);
    // Truncate one entry, flip a header byte in the other.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .expect("open");
    f.set_len(4096 + 10).expect("truncate");
    let mut g = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[1])
        .expect("open");
    use std::io::{Seek, SeekFrom};
    g.seek(SeekFrom::Start(40)).expect("seek");
    g.write_all(b"\xff").expect("flip");
    drop((f, g));
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    assert_eq!(proxy.get("/obj/5000").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/6000").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/6000").body, body(6000));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for a in std::fs::read_dir(dir).expect("dir").flatten() {
        if a.file_name() == "tmp" || !a.path().is_dir() {
            continue;
        }
        for b in std::fs::read_dir(a.path()).expect("dir").flatten() {
            for f in std::fs::read_dir(b.path()).expect("dir").flatten() {
                out.push(f.path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn truncated_cache_file_is_detected_dropped_and_refetched() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/50000").x_cache(), "MISS");
    let files = walk(&proxy.dir);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .expect("open");
    f.set_len(4096 + 20_000).expect("truncate underneath");
    let mut c = proxy.client();
    c.send(b"GET /obj/50000 HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let mut all = Vec::new();
    let end = c.sock.read_to_end(&mut all);
    assert_eq!(
        end.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionReset),
        "short body, then a reset"
    );
    let head_end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    assert_eq!(all.len() - head_end, 20_000, "short body, then a reset");
    let r = proxy.get("/obj/50000");
    assert_eq!((r.x_cache(), r.body.clone()), ("MISS", body(50_000)));
}

#[test]
fn eviction_holds_max_size() {
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let yaml = format!(
        "listen: 127.0.0.1:{{port}}\ncache: {{path: {}, max_size: 100KiB}}\nupstreams:\n  o: {{servers: [\"{}\"]}}\nroutes:\n  - match: {{host: \"*\", path_prefix: /}}\n    upstream: o\ndashboard: {{listen: \"127.0.0.1:{{dport}}\"}}\nprobe: {{enabled: false}}\n",
        dir.display(),
        origin.addr()
    );
    let proxy = Proxy::from_yaml(&yaml, tmp.path());
    let mut c = proxy.client();
    for n in 0..10 {
        let r = c.get(&format!("/obj/{}", 30_000 + n), &[]);
        assert_eq!(r.body, body(30_000 + n));
        let on_disk: u64 = walk(&dir)
            .iter()
            .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        assert!(on_disk <= 100 * 1024, "{on_disk} bytes on disk after {n}");
    }
    // Each entry is 4,096 + ~30,000 bytes on disk: three fit in 102,400.
    assert_eq!(walk(&dir).len(), 3);
    // The most recent is still a hit; the oldest was evicted.
    assert_eq!(c.get("/obj/30009", &[]).x_cache(), "HIT");
    assert_eq!(c.get("/obj/30000", &[]).x_cache(), "MISS");
}

#[test]
fn a_dead_pooled_upstream_connection_is_retried_once_on_a_fresh_one() {
    let (origin, _rt) = origin();
    origin.set_idle_close(Duration::from_millis(100));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/11", &[]).status, 200);
    // The origin closes the idle pooled connection; the proxy does not know yet.
    std::thread::sleep(Duration::from_millis(300));
    let r = c.get("/obj/12", &[]);
    assert_eq!((r.status, r.body.clone()), (200, body(12)));
    assert_eq!(origin.connection_count(), 2);
    assert_eq!(origin.request_count(), 2);
}

/// Unmounts a test's tmpfs when the test ends, however it ends.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A tmpfs of `size` (as mount's `size=`) at `dir`, unmounted when the guard drops.
fn tmpfs(dir: &std::path::Path, size: &str) -> Unmount {
    std::fs::create_dir_all(dir).expect("mkdir");
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .status()
        .expect("mount");
    assert!(ok.success(), "mounting a tmpfs needs root");
    Unmount(dir.to_path_buf())
}

/// A file system that fills below `max_size` (another file took the space): the fill that hits
/// ENOSPC evicts least-recently-used entries and is stored after all, the node stays healthy,
/// and a `max_size` larger than the file system was clamped to it at start-up.
#[test]
fn enospc_evicts_to_make_room_and_max_size_is_clamped_to_the_file_system() {
    if !require::root("mounts an 8 MiB tmpfs as the cache") {
        return;
    }
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let _unmount = tmpfs(&dir, "8m");
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    // The config says 1 GiB; the file system holds 8 MiB.
    assert_eq!(
        metric(&proxy.metrics(), "zerocache_cache_max_size_bytes"),
        8 * 1024 * 1024
    );
    let mut c = proxy.client();
    for i in 0..3 {
        let path = format!("/obj/{}", 1_000_000 + i);
        assert_eq!(c.get(&path, &[]).x_cache(), "MISS");
        assert_eq!(c.get(&path, &[]).x_cache(), "HIT", "{path}");
    }
    // Another file takes what is left of the file system.
    let filler = dir.join("filler");
    {
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
    }
    let evictions = metric(&proxy.metrics(), "zerocache_cache_evictions_total");
    let r = c.get("/obj/1500000", &[]);
    assert_eq!((r.x_cache(), r.body.len()), ("MISS", 1_500_000));
    assert!(r.body == body(1_500_000));
    assert_eventually_eq(
        "stored after eviction",
        Duration::from_secs(5),
        || c.get("/obj/1500000", &[]).x_cache().to_string(),
        "HIT".to_string(),
    );
    let m = proxy.metrics();
    assert!(
        metric(&m, "zerocache_cache_evictions_total") > evictions,
        "{m}"
    );
    assert!(m.contains("zerocache_cache_writable 1"), "{m}");
    let health = Client::connect(proxy.dashboard).get("/healthz", &[]);
    assert_eq!((health.status, health.body.as_slice()), (200, &b"ok\n"[..]));
}

#[test]
fn a_full_disk_degrades_to_pass_through_never_an_error() {
    if !require::root("mounts a 1 MiB tmpfs as the cache") {
        return;
    }
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    // A 4 MiB filesystem for the cache (max_size is clamped to it), 3 MiB of it then taken by
    // another file: the disk fills below max_size.
    let _unmount = tmpfs(&dir, "4m");
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    std::fs::write(dir.join("not-the-caches"), vec![0u8; 3 << 20]).expect("filler");
    let mut c = proxy.client();
    // 2 MB is within max_size but cannot fit: the fill fails, the client still gets every byte.
    for _ in 0..2 {
        let r = c.get("/obj/2000000", &[]);
        assert_eq!(
            (r.status, r.x_cache(), r.cache_status().as_deref()),
            (
                200,
                "MISS",
                Some("zerocache; fwd=miss; detail=cache-unwritable")
            )
        );
        assert_eq!(r.body, body(2_000_000));
    }
    let m = proxy.metrics();
    assert!(m.contains("zerocache_cache_writable 0"), "{m}");
    // Every response is right, so a load balancer keeps the node: 200, saying it is not caching.
    let health = Client::connect(proxy.dashboard).get("/healthz", &[]);
    assert_eq!(
        (health.status, health.body.as_slice()),
        (
            200,
            &b"ok; cache unwritable: responses are passed through, not stored\n"[..]
        )
    );
    let errors: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("zerocache_cache_write_errors_total "))
        .and_then(|v| v.parse().ok())
        .expect("write errors metric");
    assert!(errors >= 2, "{errors}");
    // Small objects still fit and are cached; the cache comes back by itself.
    assert_eq!(c.get("/obj/1000", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/obj/1000", &[]).x_cache(), "HIT");
    assert!(proxy.metrics().contains("zerocache_cache_writable 1"));
    assert_eq!(
        Client::connect(proxy.dashboard).get("/healthz", &[]).status,
        200
    );
    assert_eq!(
        std::fs::read_dir(dir.join("tmp")).expect("tmp").count(),
        0,
        "no temp file left"
    );
}

/// A raw origin on loopback: for each request head on each connection it writes the pieces
/// `answer(head)` returns, 100 ms apart, as bytes no well-behaved origin would send.
fn raw_origin(answer: fn(&str) -> Vec<Vec<u8>>) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { return };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = sock.read(&mut chunk) else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        for (i, piece) in answer(&head).iter().enumerate() {
                            if i > 0 {
                                std::thread::sleep(Duration::from_millis(100));
                            }
                            let _ = sock.write_all(piece);
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn bytes_arriving_on_an_idle_pooled_connection_never_answer_the_next_request() {
    // After answering /a the origin sends a stray response on the idle keep-alive connection (a
    // late body, a buggy server), which must not become the answer to /b.
    let addr = raw_origin(|head| {
        let ok = |body: &str| {
            format!("HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 1\r\n\r\n{body}")
                .into_bytes()
        };
        if head.starts_with("GET /a ") {
            vec![
                ok("a"),
                b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 6\r\n\r\npoison"
                    .to_vec(),
            ]
        } else {
            vec![ok("b")]
        }
    });
    let proxy = Proxy::start(addr, Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/a", &[]).body, b"a");
    std::thread::sleep(Duration::from_millis(400));
    for _ in 0..3 {
        assert_eq!(c.get("/b", &[]).body, b"b");
    }
}

/// An origin head with a bare LF (or CR) is a 502 and nothing is stored: httparse reads a bare LF
/// as a line end, another parser on the path might not, and the two would see two responses
/// (docs/security.md; RFC 9112 §2.2 lets a recipient choose, and the proxy chooses the same way
/// for requests and responses).
#[test]
fn a_bare_lf_in_an_origin_head_is_a_502_and_nothing_is_stored() {
    let addr = raw_origin(|_| {
        vec![b"HTTP/1.1 200 OK\nCache-Control: max-age=600\nContent-Length: 2\n\nok".to_vec()]
    });
    let proxy = Proxy::start(addr, Opts::default());
    for _ in 0..2 {
        let r = proxy.get("/lf");
        assert_eq!((r.status, r.x_cache()), (502, "ERROR"));
    }
    assert_eq!(metric(&proxy.metrics(), "zerocache_cache_objects"), 0);
}

#[test]
fn a_content_length_on_a_204_is_not_relayed() {
    // A client that believed it would read the next response as this one's body.
    let addr = raw_origin(|_| {
        vec![
            b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\r\n"
                .to_vec(),
        ]
    });
    let proxy = Proxy::start(addr, Opts::default());
    let mut c = proxy.client();
    for _ in 0..2 {
        let r = c.get("/nothing", &[]);
        assert_eq!(r.status, 204);
        assert_eq!(r.header("content-length"), None);
    }
}

#[test]
fn a_304_returns_its_connection_to_the_pool_unless_the_origin_says_close() {
    let (origin, _rt) = origin();
    let reply = |body: &str| {
        Reply::ok(body.as_bytes().to_vec()).headers(&[
            ("Cache-Control", "max-age=0, stale-while-revalidate=60"),
            ("ETag", "\"v\""),
        ])
    };
    origin.script("/v", reply("v"));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/v", &[]).x_cache(), "MISS");
    // A client-driven revalidation (no-cache): the 304's connection goes back to the pool.
    origin.script(
        "/v",
        Reply::ok(Vec::new()).status(304).headers(&[
            ("ETag", "\"v\""),
            ("Cache-Control", "max-age=0, stale-while-revalidate=60"),
        ]),
    );
    let r = c.get("/v", &[("Cache-Control", "no-cache")]);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("REVALIDATED", &b"v"[..]));
    assert_eq!(c.get("/obj/5", &[]).body, body(5));
    assert_eq!(
        (origin.request_count(), origin.connection_count()),
        (3, 1),
        "the 304's connection was reused"
    );
    // A background refresh (stale-while-revalidate) whose 304 says `Connection: close`: that
    // connection is not pooled, so the next request opens a new one.
    origin.script(
        "/v",
        Reply::ok(Vec::new()).status(304).headers(&[
            ("ETag", "\"v\""),
            ("Cache-Control", "max-age=0, stale-while-revalidate=60"),
            ("Connection", "close"),
        ]),
    );
    assert_eq!(c.get("/v", &[]).x_cache(), "STALE");
    assert_eventually_eq(
        "the background refresh reached the origin",
        Duration::from_secs(5),
        || origin.request_count(),
        4,
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(c.get("/obj/6", &[]).body, body(6));
    assert_eq!(
        (origin.request_count(), origin.connection_count()),
        (5, 2),
        "a connection the origin said it would close was reused"
    );
}
