//! The data plane end to end: a real origin, the real zerocache binary, a real client.

use crate::support::*;
use std::time::Duration;

#[test]
fn miss_then_hit_is_byte_exact_at_every_size() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for size in [0usize, 1, 1024, 4096, 65_536, 65_537, 1_000_000] {
        let path = format!("/obj/{size}");
        let miss = c.get(&path, &[]);
        assert_eq!(miss.status, 200);
        assert_eq!(miss.x_cache(), "MISS", "{size}");
        assert_eq!(
            miss.header("cache-status"),
            Some("zerocache; fwd=miss; stored")
        );
        assert_eq!(miss.body, body(size), "miss body {size}");
        let hit = c.get(&path, &[]);
        assert_eq!(hit.x_cache(), "HIT", "{size}");
        assert_eq!(hit.cache_status().as_deref(), Some("zerocache; hit"));
        assert_eq!(
            hit.header("content-length"),
            Some(size.to_string().as_str())
        );
        assert!(hit.header("age").is_some());
        assert_eq!(hit.header("via"), Some("1.1 zerocache"));
        assert_eq!(hit.header("etag"), Some(format!("\"obj-{size}\"").as_str()));
        assert_eq!(hit.body, body(size), "hit body {size}");
        assert_eq!(origin.hits(&path), 1, "{size}");
    }
}

#[test]
fn head_and_ranges_on_hits() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    let full = body(10_000);
    assert_eq!(c.get("/obj/10000", &[]).x_cache(), "MISS");
    let head = c.request("HEAD", "/obj/10000", &[]);
    assert_eq!((head.status, head.x_cache()), (200, "HIT"));
    assert_eq!(head.header("content-length"), Some("10000"));
    assert!(head.body.is_empty());
    let r = c.get("/obj/10000", &[("Range", "bytes=10-19")]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 10-19/10000"));
    assert_eq!(r.body, &full[10..20]);
    let r = c.get("/obj/10000", &[("Range", "bytes=-5")]);
    assert_eq!((r.status, r.body.as_slice()), (206, &full[9995..]));
    let r = c.get("/obj/10000", &[("Range", "bytes=9000-")]);
    assert_eq!((r.status, r.body.as_slice()), (206, &full[9000..]));
    let r = c.get("/obj/10000", &[("Range", "bytes=10000-")]);
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */10000"));
    let r = c.get("/obj/10000", &[("Range", "bytes=0-1,5-6")]);
    assert_eq!((r.status, r.body.len()), (200, 10_000));
    // The connection survived all of it.
    assert_eq!(c.get("/obj/10000", &[]).body, full);
    assert_eq!(origin.hits("/obj/10000"), 1);
}

#[test]
fn concurrent_misses_are_coalesced() {
    let (origin, _rt) = origin();
    origin.script(
        "/slow",
        Reply::ok(body(200_000)).delay(Duration::from_millis(400)),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let addr = proxy.addr;
    let handles: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || Client::connect(addr).get("/slow", &[])))
        .collect();
    let responses: Vec<Response> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    assert_eq!(origin.hits("/slow"), 1);
    let mut statuses: Vec<&str> = responses.iter().map(|r| r.x_cache()).collect();
    statuses.sort();
    assert_eq!(statuses.iter().filter(|s| **s == "MISS").count(), 1);
    assert_eq!(statuses.iter().filter(|s| **s == "HIT").count(), 7);
    for r in &responses {
        assert_eq!(r.body, body(200_000));
    }
    // A follower that arrives while the body is being stored reads behind the fill
    // (`collapsed`); one that arrives after the commit is an ordinary hit on it (`coalesced`).
    assert_eq!(
        responses
            .iter()
            .filter(|r| matches!(
                r.cache_status().as_deref(),
                Some("zerocache; fwd=miss; collapsed") | Some("zerocache; hit; detail=coalesced")
            ))
            .count(),
        7
    );
}

#[test]
fn forced_hash_collisions_never_serve_another_urls_body() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            debug_yaml: "  key_hash_bits: 1\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    // With one hash bit, these ten keys share two file names.
    for round in 0..3 {
        for n in 100..110usize {
            let r = c.get(&format!("/obj/{n}"), &[]);
            assert_eq!(
                r.body,
                body(n),
                "round {round} /obj/{n} got {} bytes",
                r.body.len()
            );
        }
    }
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.send(b"GET /obj/100 HTTP/1.1\r\nHost: a\r\n\r\nGET /obj/200 HTTP/1.1\r\nHost: a\r\n\r\nGET /obj/100 HTTP/1.1\r\nHost: a\r\n\r\n");
    let a = c.read_response(false);
    let b = c.read_response(false);
    let a2 = c.read_response(false);
    assert_eq!((a.body.len(), b.body.len(), a2.body.len()), (100, 200, 100));
    assert_eq!(
        (a.x_cache(), b.x_cache(), a2.x_cache()),
        ("MISS", "MISS", "HIT")
    );
}

#[test]
fn chunked_upstream_is_streamed_stored_and_served_with_length() {
    let (origin, _rt) = origin();
    origin.script(
        "/chunked",
        Reply::ok(body(100_000)).framing(Framing::Chunked(7_000)),
    );
    origin.script("/close", Reply::ok(body(50_000)).framing(Framing::Close));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    let r = c.get("/chunked", &[]);
    assert!(r.chunked);
    assert_eq!((r.x_cache(), r.body.clone()), ("MISS", body(100_000)));
    let r = c.get("/chunked", &[]);
    assert_eq!(
        (r.x_cache(), r.header("content-length")),
        ("HIT", Some("100000"))
    );
    assert_eq!(r.body, body(100_000));
    let r = c.get("/close", &[]);
    assert_eq!(
        (r.x_cache(), r.body.len(), r.chunked),
        ("MISS", 50_000, true)
    );
    assert_eq!(c.get("/close", &[]).body, body(50_000));
}

#[test]
fn non_storable_responses_are_not_stored() {
    let (origin, _rt) = origin();
    origin.script(
        "/nostore",
        Reply::ok(b"x".to_vec()).headers(&[("Cache-Control", "no-store")]),
    );
    origin.script(
        "/private",
        Reply::ok(b"x".to_vec()).headers(&[("Cache-Control", "private, max-age=60")]),
    );
    origin.script("/nofresh", Reply::ok(b"x".to_vec()).headers(&[]));
    origin.script(
        "/auth",
        Reply::ok(b"x".to_vec()).headers(&[("Cache-Control", "max-age=60")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for (path, detail) in [
        ("/nostore", "response-directive"),
        ("/private", "response-directive"),
        ("/nofresh", "no-freshness"),
    ] {
        for _ in 0..2 {
            let r = c.get(path, &[]);
            assert_eq!(r.x_cache(), "MISS");
            assert_eq!(
                r.header("cache-status"),
                Some(format!("zerocache; fwd=miss; detail={detail}").as_str())
            );
        }
        assert_eq!(origin.hits(path), 2, "{path}");
    }
    for _ in 0..2 {
        let r = c.get("/auth", &[("Authorization", "Bearer x")]);
        assert_eq!(
            r.header("cache-status"),
            Some("zerocache; fwd=miss; detail=authorization")
        );
    }
    assert_eq!(origin.hits("/auth"), 2);
}

#[test]
fn requests_are_forwarded_with_proxy_hygiene() {
    let (origin, _rt) = origin();
    origin.script(
        "/hyg",
        Reply::ok(b"ok".to_vec()).headers(&[
            ("Cache-Control", "max-age=60"),
            ("Connection", "X-Hop"),
            ("X-Hop", "secret"),
            ("Keep-Alive", "timeout=5"),
            ("X-End", "1"),
        ]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    let r = c.get(
        "/hyg",
        &[
            ("Connection", "X-Client-Hop"),
            ("X-Client-Hop", "1"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("X-Forwarded-Host", "evil.example"),
            ("Keep-Alive", "300"),
            ("X-Kept", "yes"),
        ],
    );
    assert_eq!(r.header("x-hop"), None);
    assert_eq!(r.header("keep-alive"), None);
    assert_eq!(r.header("x-end"), Some("1"));
    let hit = c.get("/hyg", &[]);
    assert_eq!(
        (hit.x_cache(), hit.header("x-hop"), hit.header("x-end")),
        ("HIT", None, Some("1"))
    );
    let got = origin
        .received()
        .into_iter()
        .find(|r| r.path == "/hyg")
        .expect("received");
    assert_eq!(got.header("x-client-hop"), None);
    assert_eq!(got.header("keep-alive"), None);
    assert_eq!(got.header("x-forwarded-host"), None);
    assert_eq!(got.header("x-kept"), Some("yes"));
    // The client is no trusted proxy: its claim about where it came from is replaced.
    assert_eq!(got.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(got.header("forwarded"), Some("for=127.0.0.1;proto=http"));
    assert_eq!(got.header("x-forwarded-proto"), Some("http"));
    assert_eq!(got.header("via"), Some("1.1 zerocache"));
    assert_eq!(got.header("host"), Some("test.example"));
}

#[test]
fn a_trusted_proxy_s_forwarding_fields_are_appended_to() {
    let (origin, _rt) = origin();
    origin.script("/fwd", Reply::ok(b"ok".to_vec()).headers(&[]));
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "proxy:\n  trusted_proxies: [127.0.0.0/8]\n".into(),
            ..Opts::default()
        },
    );
    let r = proxy.client().get(
        "/fwd",
        &[
            ("X-Forwarded-For", "10.0.0.1"),
            (
                "Forwarded",
                "for=10.0.0.1;host=evil.example;proto=https, for=10.0.0.2",
            ),
            ("X-Real-IP", "10.0.0.1"),
        ],
    );
    assert_eq!(r.status, 200);
    let got = origin
        .received()
        .into_iter()
        .find(|r| r.path == "/fwd")
        .expect("received");
    assert_eq!(got.header("x-forwarded-for"), Some("10.0.0.1, 127.0.0.1"));
    // Only the `for=` pairs survive (`host=` is in no cache key); `proto=` is the proxy's own,
    // the scheme of the listener the request came in on.
    assert_eq!(
        got.header("forwarded"),
        Some("for=10.0.0.1, for=10.0.0.2, for=127.0.0.1;proto=http")
    );
    assert_eq!(got.header("x-real-ip"), Some("10.0.0.1"));
}

#[test]
fn request_bodies_are_forwarded_with_100_continue() {
    let (origin, _rt) = origin();
    origin.script(
        "/post",
        Reply::ok(b"created".to_vec()).status(201).headers(&[]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.send(b"POST /post HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    // The interim answer arrives before we send the body.
    let mut first = [0u8; 25];
    use std::io::Read;
    c.sock.read_exact(&mut first).expect("100 continue");
    assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send(b"hello");
    let r = c.read_response(false);
    assert_eq!(
        (r.status, r.body.as_slice(), r.x_cache()),
        (201, &b"created"[..], "BYPASS")
    );
    assert_eq!(r.header("cache-status"), Some("zerocache; fwd=method"));
    c.send(b"POST /post HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
    assert_eq!(c.read_response(false).status, 201);
    let bodies: Vec<Vec<u8>> = origin
        .received()
        .into_iter()
        .filter(|r| r.path == "/post")
        .map(|r| r.body)
        .collect();
    assert_eq!(bodies, vec![b"hello".to_vec(), b"abcde".to_vec()]);
}

#[test]
fn early_hints_are_forwarded_and_not_stored() {
    let (origin, _rt) = origin();
    origin.script(
        "/hints",
        Reply::ok(b"body".to_vec()).interim(103, &[("Link", "</s.css>; rel=preload")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.send(b"GET /hints HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let mut raw = Vec::new();
    use std::io::Read;
    let mut chunk = [0u8; 4096];
    while !raw.windows(4).filter(|w| *w == b"\r\n\r\n").count().ge(&2) {
        let n = c.sock.read(&mut chunk).expect("read");
        assert!(n > 0);
        raw.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.starts_with(
            "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"
        ),
        "{text}"
    );
    let hit = proxy.get("/hints");
    assert_eq!(
        (hit.x_cache(), hit.status, hit.body.as_slice()),
        ("HIT", 200, &b"body"[..]),
        "{:?}",
        hit.headers
    );
}

/// An origin whose exchange fails after interim heads (here a ninth 103, past the bound of
/// eight) gets the client its failure alone: the 103s already received are not sent before the
/// 502, which would announce hints for a response that never comes.
#[test]
fn interim_heads_of_a_failed_exchange_are_not_sent() {
    let (origin, _rt) = origin();
    let mut reply = Reply::ok(b"body".to_vec());
    for _ in 0..9 {
        reply = reply.interim(103, &[("Link", "</s.css>; rel=preload")]);
    }
    origin.script("/many-hints", reply);
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.send(b"GET /many-hints HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let mut raw = Vec::new();
    use std::io::Read;
    let mut chunk = [0u8; 4096];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.sock.read(&mut chunk).expect("read");
        assert!(n > 0, "closed before a head");
        raw.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{text}");
}

/// Each data-plane worker (one per core) keeps the connections it is given, and a new connection
/// goes to the worker with the fewest: opened one after another, they split exactly evenly, and
/// the counts fall back to zero as they close. Left to whichever worker wakes first, a burst of
/// connections lands on one thread (what made 64 MiB hits cost 1.6× the CPU per GB). With
/// `cpu_affinity: false` every worker may run on every CPU the process may.
#[test]
fn connections_are_spread_evenly_over_the_workers() {
    use zerocache::exports::allowed_cpus;
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "workers:\n  cpu_affinity: false\n".into(),
            ..Opts::default()
        },
    );
    let workers = allowed_cpus().expect("affinity mask").len();
    let mask = process_cpu_list(proxy.child.id());
    // The readiness probe's connections may still be counted.
    assert_workers_drain(&proxy, workers);
    let per_worker = 4;
    let mut clients = Vec::new();
    for _ in 0..per_worker * workers {
        let mut c = proxy.client();
        assert_eq!(c.get("/obj/1024", &[]).body, body(1024));
        clients.push(c);
    }
    assert_eq!(worker_loads(&proxy, workers), vec![per_worker; workers]);
    // Every worker has served by now, so every worker thread exists.
    assert_eq!(worker_cpu_lists(proxy.child.id()), vec![mask; workers]);
    drop(clients);
    assert_workers_drain(&proxy, workers);
}

/// `workers.count` and `workers.cpu_affinity`: one worker more than there are CPUs, pinned round
/// robin, and connections kept on the CPU their packets arrive on within `SLACK`. A client thread
/// pinned to the first CPU (over loopback its packets arrive there) fills that CPU's two workers
/// to `SLACK + 1` each, evenly, before any other worker gets one; after that no two workers are
/// more than `SLACK + 1` apart. Fails without the steering (the first connections spread at
/// once), without the slack (one CPU takes every connection) and without the pinning.
#[test]
fn pinned_workers_keep_connections_on_their_cpu_within_a_bounded_imbalance() {
    if !require::cpus(
        2,
        "keeps connections on the CPU their packets arrive on, apart from the others",
    ) {
        return;
    }
    use zerocache::exports::SLACK;
    use zerocache::exports::{allowed_cpus, pin_current_thread};
    let (origin, _rt) = origin();
    let cpus = allowed_cpus().expect("affinity mask");
    let workers = cpus.len() + 1;
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!("workers:\n  count: {workers}\n  cpu_affinity: true\n"),
            ..Opts::default()
        },
    );
    let pinned: Vec<String> = (0..workers)
        .map(|w| cpus[w % cpus.len()].to_string())
        .collect();
    // The readiness probe's connections may still be counted.
    assert_workers_drain(&proxy, workers);
    // Workers 0 and cpus.len() share the first CPU.
    let local = [0, cpus.len()];
    let first = 2 * (SLACK + 1);
    let more = 4 * workers;
    let clients = std::thread::scope(|s| {
        s.spawn(|| {
            pin_current_thread(cpus[0]).expect("pin the client");
            let mut clients = Vec::new();
            for i in 0..first + more {
                let mut c = proxy.client();
                assert_eq!(c.get("/obj/1024", &[]).body, body(1024));
                clients.push(c);
                if i + 1 == first {
                    let mut want = vec![0; workers];
                    for w in local {
                        want[w] = SLACK + 1;
                    }
                    assert_eq!(worker_loads(&proxy, workers), want, "the first {first}");
                }
            }
            clients
        })
        .join()
        .expect("client thread")
    });
    let now = worker_loads(&proxy, workers);
    assert_eq!(now.iter().sum::<usize>(), first + more);
    let (lo, hi) = (now.iter().min(), now.iter().max());
    assert!(
        hi.zip(lo).is_some_and(|(h, l)| h - l <= SLACK + 1),
        "{now:?}"
    );
    assert!(
        (0..workers)
            .filter(|w| !local.contains(w))
            .all(|w| now[w] > 0),
        "nothing spread: {now:?}"
    );
    // Every worker has served by now, so every worker thread exists and has pinned itself.
    assert_eq!(worker_cpu_lists(proxy.child.id()), pinned);
    drop(clients);
    assert_workers_drain(&proxy, workers);
}

#[test]
fn rfc9110_15_2_interim_responses_other_than_100_are_forwarded() {
    let (origin, _rt) = origin();
    origin.script(
        "/interim",
        Reply::ok(b"body".to_vec())
            .headers(&[("Cache-Control", "no-store")])
            .interim(100, &[])
            .interim(102, &[])
            .interim(103, &[("Link", "</a.css>; rel=preload")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.send(b"GET /interim HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let mut raw = Vec::new();
    use std::io::Read;
    let mut chunk = [0u8; 4096];
    while !raw.ends_with(b"body") {
        let n = c.sock.read(&mut chunk).expect("read");
        assert!(n > 0, "{}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    // The origin's 100 answers an Expect the proxy never sent: it is dropped; 102 and 103 cross.
    assert!(
        text.starts_with(
            "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"
        ),
        "{text}"
    );
}

/// RFC 9110 §7.6.3: each proxy appends itself to `Via`; a repeated `Via` is one list (§5.3), so
/// every earlier hop is kept, in the request sent upstream and in the response relayed back.
#[test]
fn via_keeps_every_earlier_hop_both_ways() {
    let (origin, _rt) = origin();
    origin.script(
        "/via",
        Reply::ok(b"v".to_vec()).headers(&[("Via", "1.1 a"), ("Via", "1.1 b")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let r = proxy
        .client()
        .get("/via", &[("Via", "1.1 x"), ("Via", "1.0 y")]);
    assert_eq!(r.header("via"), Some("1.1 a, 1.1 b, 1.1 zerocache"));
    let got = origin
        .received()
        .into_iter()
        .find(|r| r.path == "/via")
        .expect("received");
    assert_eq!(got.header("via"), Some("1.1 x, 1.0 y, 1.1 zerocache"));
}

/// `proxy.via: false` (Squid's `via off`): the proxy names itself in no `Via`, upstream or to
/// the client, on a miss, a hit or its own answer, and passes on the hops it received. With it
/// a default nginx origin (`gzip_proxied off`) compressed nothing for the cache.
#[test]
fn proxy_via_false_adds_no_via_of_its_own_and_keeps_the_hops_received() {
    let (origin, _rt) = origin();
    origin.script(
        "/hops",
        Reply::ok(b"v".to_vec()).headers(&[("Via", "1.1 a"), ("Cache-Control", "no-store")]),
    );
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "proxy:\n  via: false\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    let miss = c.get("/obj/10", &[]);
    let hit = c.get("/obj/10", &[]);
    assert_eq!((miss.x_cache(), hit.x_cache()), ("MISS", "HIT"));
    assert_eq!((miss.header("via"), hit.header("via")), (None, None));
    let own = c.get("/obj/10", &[("Range", "bytes=20-")]);
    assert_eq!((own.status, own.header("via")), (416, None));
    let got = origin
        .received()
        .into_iter()
        .find(|r| r.path == "/obj/10")
        .expect("received");
    assert_eq!(got.header("via"), None);
    let relayed = c.get("/hops", &[("Via", "1.1 x")]);
    assert_eq!(relayed.header("via"), Some("1.1 a"));
    let got = origin
        .received()
        .into_iter()
        .find(|r| r.path == "/hops")
        .expect("received");
    assert_eq!(got.header("via"), Some("1.1 x"));
}
