//! Clients that stop reading. A MISS is filled by a task of its own at the origin's speed and
//! every client reads behind the fill, so a stalled client holds up nobody else: not the origin
//! connection, not the fill lock, not the next client of the same URL. `limits.send_timeout`
//! bounds how long a stalled client keeps its own connection, and a fill nobody reads any more
//! stops at `cache.abandoned_fill_max`.

use crate::support::*;
use std::io::Read;
use std::time::{Duration, Instant};

/// Reads the head of a response and nothing more.
fn read_head_only(c: &mut Client) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = c.sock.read(&mut b).expect("head byte");
        assert_eq!(n, 1, "closed before the end of the head");
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[test]
fn a_client_that_stops_reading_a_miss_holds_up_nobody() {
    let (origin, _rt) = origin();
    let size = 32 << 20;
    let proxy = Proxy::start(origin.addr(), Opts::default());
    // The first client asks, reads the head, and stops reading.
    let mut stalled = proxy.client();
    stalled.send(b"GET /obj/33554432 HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let head = read_head_only(&mut stalled);
    assert!(head.contains("X-Cache: MISS"), "{head}");
    // Another client of the same URL gets every byte while the first still reads nothing: it
    // read behind the fill, or the fill was already complete.
    let r = proxy.get("/obj/33554432");
    assert_eq!(r.status, 200);
    assert!(r.body == body(size), "body differs");
    assert!(
        matches!(
            r.cache_status().as_deref(),
            Some("zerocache; fwd=miss; collapsed") | Some("zerocache; hit")
        ),
        "{:?}",
        r.cache_status()
    );
    // The fill finished at the origin's speed: the entry is stored and the origin was asked once.
    assert_eq!(proxy.get("/obj/33554432").x_cache(), "HIT");
    assert_eq!(origin.hits("/obj/33554432"), 1);
    // The stalled client still gets its whole body when it reads again.
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    while got < size {
        let n = stalled.sock.read(&mut buf).expect("read");
        assert!(n > 0, "closed after {got} bytes");
        got += n;
    }
    assert_eq!(got, size);
}

#[test]
fn send_timeout_disconnects_a_client_that_takes_nothing() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  send_timeout: 1s\n".into(),
            ..Opts::default()
        },
    );
    assert_eq!(proxy.get("/obj/67108864").x_cache(), "MISS");
    let mut c = proxy.client();
    c.send(b"GET /obj/67108864 HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let head = read_head_only(&mut c);
    assert!(head.contains("X-Cache: HIT"), "{head}");
    // Take nothing until the proxy has given up on us, then drain what the socket buffers
    // hold: the connection ends short of the body.
    let started = Instant::now();
    assert_eventually_eq(
        "the hit's connection is counted closed after send_timeout",
        Duration::from_secs(10),
        || {
            let m = proxy.metrics();
            m.lines()
                .filter(|l| l.starts_with("zerocache_worker_connections{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>()
        },
        0,
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match c.sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got < 64 << 20, "got the whole body: {got}");
}

#[test]
fn a_fill_nobody_reads_stops_at_abandoned_fill_max() {
    let (origin, _rt) = origin();
    // 16 MiB trickled in 64 KiB pieces: slow enough that the client leaves long before the end.
    origin.script(
        "/big",
        Reply::ok(body(16 << 20)).trickle(64 << 10, Duration::from_millis(5)),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml: "  abandoned_fill_max: 1MiB\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    c.send(b"GET /big HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let head = read_head_only(&mut c);
    assert!(head.contains("X-Cache: MISS"), "{head}");
    drop(c);
    // The fill stops and deletes its temp file instead of reading 16 MiB for nobody.
    assert_eventually_eq(
        "the abandoned fill's temp file is gone",
        Duration::from_secs(10),
        || {
            std::fs::read_dir(proxy.dir.join("tmp"))
                .map(|d| d.count())
                .unwrap_or(0)
        },
        0,
    );
    let r = proxy.get("/big");
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert!(r.body == body(16 << 20));
    assert_eq!(origin.hits("/big"), 2);
}
