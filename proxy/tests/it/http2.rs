//! HTTP/2 to clients: by ALPN on the TLS listener (`tls.http2`) and with prior knowledge on a
//! plain one (`h2c`), checked with real clients (curl, nghttp) byte for byte, and attacked with
//! raw frames (`support::h2raw`): each hostile head refused and never forwarded, beside the
//! friendly one that is; rapid reset, CONTINUATION floods, too many streams and a window held
//! shut, each bounded while other clients are served.

use crate::support::h2raw::{self, RawH2};
use crate::support::*;
use crate::tls_support::*;
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// A proxy with `h2c: true` on its listener (`extra` added to its config).
fn h2c_proxy(origin: std::net::SocketAddr, extra: &str) -> Proxy {
    Proxy::start(
        origin,
        Opts {
            listen_options: "h2c: true".into(),
            extra_yaml: extra.into(),
            ..Opts::default()
        },
    )
}

/// curl's answer: (http_version, head, body).
fn curl(args: &[&str]) -> (String, String, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tmp");
    let head = dir.path().join("head");
    let body = dir.path().join("body");
    let out = Command::new("curl")
        .args(["-s", "--max-time", "20", "-D"])
        .arg(&head)
        .arg("-o")
        .arg(&body)
        .args(["-w", "%{http_version}"])
        .args(args)
        .output()
        .expect("curl");
    assert!(out.status.success(), "curl {args:?}: {out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        std::fs::read_to_string(&head).unwrap_or_default(),
        std::fs::read(&body).unwrap_or_default(),
    )
}

/// The value of `name` in a head curl wrote (lower-cased names over HTTP/2).
fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A proxy with a TLS listener for `name` (`tls.http2` as `http2`, user-space TLS), in front
/// of `origin`: the proxy, the listener's port, and the certificate file (kept in `dir`).
fn tls_proxy(
    origin: std::net::SocketAddr,
    dir: &std::path::Path,
    name: &str,
    http2: bool,
) -> (Proxy, u16, String) {
    let files = write(dir, "a", &cert(&[name]));
    let tport = free_port();
    let proxy = Proxy::start(
        origin,
        Opts {
            extra_yaml: format!(
                "{}  ktls: off\n  http2: {http2}\n",
                listener_yaml(tport, std::slice::from_ref(&files))
            ),
            ..Opts::default()
        },
    );
    (proxy, tport, files.0.display().to_string())
}

#[test]
fn curl_takes_h2_by_alpn_and_every_cache_answer_is_byte_exact() {
    if !require::command("curl") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    let (proxy, tport, ca) = tls_proxy(origin.addr(), dir.path(), "test.example", true);
    let url = format!("https://test.example:{tport}/obj/100000");
    let resolve = format!("test.example:{tport}:127.0.0.1");
    let h2 = |extra: &[&str]| {
        let mut a = vec!["--http2", "--cacert", &ca, "--resolve", &resolve];
        a.extend_from_slice(extra);
        a.push(&url);
        curl(&a)
    };
    let (v, head, b) = h2(&[]);
    assert_eq!(v, "2", "{head}");
    assert!(head.starts_with("HTTP/2 200"), "{head}");
    assert_eq!(field(&head, "x-cache"), Some("MISS"));
    assert_eq!(field(&head, "content-length"), Some("100000"));
    assert!(field(&head, "connection").is_none(), "{head}");
    assert!(b == body(100_000));
    let (v, head, b) = h2(&[]);
    assert_eq!((v.as_str(), field(&head, "x-cache")), ("2", Some("HIT")));
    assert_eq!(
        field(&head, "cache-status"),
        Some("zerocache; hit; ttl=3600")
    );
    assert!(b == body(100_000));
    // Range, a conditional and HEAD: the same answers as over HTTP/1.1.
    let (_, head, b) = h2(&["-r", "10-19"]);
    assert!(head.starts_with("HTTP/2 206"), "{head}");
    assert_eq!(field(&head, "content-range"), Some("bytes 10-19/100000"));
    assert_eq!(b, body(100_000)[10..20].to_vec());
    let (_, head, b) = h2(&["-H", "If-None-Match: \"obj-100000\""]);
    assert!(head.starts_with("HTTP/2 304"), "{head}");
    assert!(b.is_empty());
    let (_, head, b) = h2(&["-I"]);
    assert!(head.starts_with("HTTP/2 200"), "{head}");
    assert_eq!(field(&head, "content-length"), Some("100000"));
    // With -I curl writes the head where the body would go: no body byte follows it.
    assert_eq!(b, head.as_bytes());
    // Purge, then a miss again.
    let (status, answer) = proxy.purge(&format!(r#"{{"url": "{url}"}}"#));
    assert_eq!(
        (status, &answer["purged"]),
        (200, &serde_json::json!(1)),
        "{answer}"
    );
    let (_, head, b) = h2(&[]);
    assert_eq!(field(&head, "x-cache"), Some("MISS"), "{head}");
    assert!(b == body(100_000));
    assert_eq!(origin.hits("/obj/100000"), 2);
    // Every body went out as DATA frames from user space: a copy by design, to the byte.
    let m = proxy.metrics();
    assert_eq!(
        metric(&m, "zerocache_copied_body_bytes_total{reason=\"h2\"}"),
        300_010
    );
    assert_eq!(
        metric(&m, "zerocache_h2_events_total{event=\"connections\"}"),
        6
    );
    assert_eq!(
        metric(&m, "zerocache_h2_events_total{event=\"streams\"}"),
        6
    );
    assert_eq!(
        metric(&m, "zerocache_h2_events_total{event=\"malformed\"}"),
        0
    );
    assert_eq!(
        metric(
            &m,
            "zerocache_copied_body_bytes_total{reason=\"tls-userspace\"}"
        ),
        0
    );
}

/// Over user-space TLS a large DATA frame is sealed into records straight from the crate's
/// buffers, with the small frames gathered before it (`server/h2/output.rs`), and rustls's own
/// 64 KiB of records is the only buffer: a reader slower than the proxy fills it, and the
/// proxy then waits for the socket. Three answers on one connection (small, large, larger),
/// read at 4 MB/s, first as misses then as hits: every body exact to the byte.
#[test]
fn large_bodies_sealed_from_the_crate_arrive_exact_to_a_slow_tls_reader() {
    if !require::command("curl") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    let (_proxy, tport, ca) = tls_proxy(origin.addr(), dir.path(), "test.example", true);
    let resolve = format!("test.example:{tport}:127.0.0.1");
    let sizes = [1_000usize, 300_000, 2_000_000];
    for pass in ["miss", "hit"] {
        let mut args: Vec<String> = [
            "-s",
            "--max-time",
            "30",
            "--http2",
            "--parallel",
            "--limit-rate",
            "4M",
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-w",
            "%{num_connects}\n",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        for n in sizes {
            args.push("-o".into());
            args.push(dir.path().join(format!("{pass}-{n}")).display().to_string());
            args.push(format!("https://test.example:{tport}/obj/{n}"));
        }
        let out = Command::new("curl").args(&args).output().expect("curl");
        assert!(out.status.success(), "{pass}: {out:?}");
        // One connection for the three: curl multiplexes them.
        let connects: u32 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .sum();
        assert_eq!(connects, 1, "{pass}: {out:?}");
        for n in sizes {
            let got = std::fs::read(dir.path().join(format!("{pass}-{n}"))).expect("body");
            assert!(got == body(n), "{pass} {n}: {} bytes", got.len());
        }
    }
    for n in sizes {
        assert_eq!(origin.hits(&format!("/obj/{n}")), 1, "{n}");
    }
}

#[test]
fn without_tls_http2_alpn_offers_http11_only() {
    if !require::command("curl") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    let (_proxy, tport, ca) = tls_proxy(origin.addr(), dir.path(), "test.example", false);
    let (v, head, b) = curl(&[
        "--http2",
        "--cacert",
        &ca,
        "--resolve",
        &format!("test.example:{tport}:127.0.0.1"),
        &format!("https://test.example:{tport}/obj/1000"),
    ]);
    assert_eq!(v, "1.1", "{head}");
    assert!(b == body(1000));
}

#[test]
fn nghttp_negotiates_h2_and_reads_a_hit() {
    if !require::command("nghttp") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    let (_proxy, tport, _) = tls_proxy(origin.addr(), dir.path(), "127.0.0.1", true);
    let url = format!("https://127.0.0.1:{tport}/obj/5000");
    let run = || {
        let out = Command::new("nghttp")
            .args(["-nv", "-t", "20", &url])
            .output()
            .expect("nghttp");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = run();
    assert!(first.contains("The negotiated protocol: h2"), "{first}");
    assert!(first.contains("x-cache: MISS"), "{first}");
    let second = run();
    assert!(
        second.contains("recv (stream_id=13) :status: 200"),
        "{second}"
    );
    assert!(second.contains("x-cache: HIT"), "{second}");
}

#[test]
fn h2c_and_http11_share_a_listener_and_split_cookies_are_joined() {
    if !require::command("curl") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    let url = format!("http://{}/obj/7000", proxy.addr);
    let (v, head, b) = curl(&["--http2-prior-knowledge", &url]);
    assert_eq!((v.as_str(), field(&head, "x-cache")), ("2", Some("MISS")));
    assert!(b == body(7000));
    // An HTTP/1.1 client on the same port reads the entry the h2 stream stored.
    let (v, head, b) = curl(&["--http1.1", &url]);
    assert_eq!((v.as_str(), field(&head, "x-cache")), ("1.1", Some("HIT")));
    assert!(b == body(7000));
    // Without prior knowledge curl speaks HTTP/1.1 here: never an h2c upgrade.
    let (v, _, _) = curl(&["--http2", &url]);
    assert_eq!(v, "1.1");

    // RFC 9113 §8.2.3: cookie split across fields reaches the origin as one field.
    let mut c = RawH2::connect(proxy.addr, &[]);
    let block = h2raw::get(
        "/obj/300?cookies",
        &[(b"cookie", b"a=1"), (b"x-a", b"1"), (b"cookie", b"b=2")],
    );
    c.send(&h2raw::frame(
        h2raw::HEADERS,
        h2raw::END_HEADERS | h2raw::END_STREAM,
        1,
        &block,
    ));
    let frames = c.until_end(1, WAIT);
    assert!(
        frames
            .iter()
            .any(|f| f.kind == h2raw::HEADERS && f.stream == 1),
        "{frames:?}"
    );
    let got: Vec<u8> = frames
        .iter()
        .filter(|f| f.kind == h2raw::DATA && f.stream == 1)
        .flat_map(|f| f.payload.clone())
        .collect();
    assert!(got == body(300));
    let sent = origin
        .received()
        .into_iter()
        .find(|r| r.path == "/obj/300?cookies")
        .expect("forwarded");
    assert_eq!(sent.header("cookie"), Some("a=1; b=2"));
    assert_eq!(sent.header("via"), Some("2 zerocache"));
}

/// HEADERS for stream 1 ending the stream, with `block` as its field block.
fn one_request(block: &[u8]) -> Vec<u8> {
    h2raw::frame(
        h2raw::HEADERS,
        h2raw::END_HEADERS | h2raw::END_STREAM,
        1,
        block,
    )
}

#[test]
fn hostile_heads_are_refused_never_forwarded_and_the_friendly_twin_is_served() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    let b = |fields: &[(&[u8], &[u8])]| h2raw::block(fields);
    let m: &[u8] = b":method";
    let s: &[u8] = b":scheme";
    let a: &[u8] = b":authority";
    let p: &[u8] = b":path";
    // One field added to a good GET.
    let with_field: [(&str, &[u8], &[u8]); 11] = [
        ("transfer-encoding", b"transfer-encoding", b"chunked"),
        ("connection", b"connection", b"keep-alive"),
        ("keep-alive", b"keep-alive", b"timeout=5"),
        ("proxy-connection", b"proxy-connection", b"x"),
        ("upgrade", b"upgrade", b"websocket"),
        ("te gzip", b"te", b"gzip"),
        ("upper-case name", b"X-Foo", b"1"),
        ("CRLF in a value", b"x-a", b"1\r\nx-b: 2"),
        ("NUL in a value", b"x-a", b"1\x002"),
        ("leading space", b"x-a", b" 1"),
        ("trailing tab", b"x-a", b"1\t"),
    ];
    let mut cases: Vec<(&str, Vec<u8>)> = with_field
        .iter()
        .map(|(name, n, v)| (*name, one_request(&h2raw::get("/obj/10", &[(*n, *v)]))))
        .collect();
    cases.extend([
        ("empty :path", one_request(&h2raw::get("", &[]))),
        ("relative :path", one_request(&h2raw::get("obj/10", &[]))),
        ("* for GET", one_request(&h2raw::get("*", &[]))),
        (
            "absolute :path",
            one_request(&h2raw::get("http://evil.example/obj/10", &[])),
        ),
        (
            "no :method",
            one_request(&b(&[(s, b"http"), (a, b"a.example"), (p, b"/obj/10")])),
        ),
        (
            "no :path",
            one_request(&b(&[(m, b"GET"), (s, b"http"), (a, b"a.example")])),
        ),
        (
            "two :path",
            one_request(&b(&[
                (m, b"GET"),
                (s, b"http"),
                (a, b"a.example"),
                (p, b"/obj/10"),
                (p, b"/obj/11"),
            ])),
        ),
        (
            "pseudo after regular",
            one_request(&b(&[
                (m, b"GET"),
                (s, b"http"),
                (b"x-a", b"1"),
                (a, b"a.example"),
                (p, b"/obj/10"),
            ])),
        ),
        (
            "unknown pseudo",
            one_request(&b(&[
                (m, b"GET"),
                (s, b"http"),
                (a, b"a.example"),
                (p, b"/obj/10"),
                (b":foo", b"x"),
            ])),
        ),
        (
            ":status in a request",
            one_request(&b(&[
                (m, b"GET"),
                (s, b"http"),
                (a, b"a.example"),
                (p, b"/obj/10"),
                (b":status", b"200"),
            ])),
        ),
        (
            ":authority vs host",
            one_request(&h2raw::get("/obj/10", &[(b"host", b"evil.example")])),
        ),
        ("content-length vs DATA", {
            let mut v = h2raw::frame(
                h2raw::HEADERS,
                h2raw::END_HEADERS,
                1,
                &b(&[
                    (m, b"POST"),
                    (s, b"http"),
                    (a, b"a.example"),
                    (p, b"/upload"),
                    (b"content-length", b"5"),
                ]),
            );
            v.extend(h2raw::frame(
                h2raw::DATA,
                h2raw::END_STREAM,
                1,
                b"0123456789",
            ));
            v
        }),
    ]);
    for (name, bytes) in &cases {
        let mut c = RawH2::connect(proxy.addr, &[]);
        c.send(bytes);
        let answer = c.answer(1, WAIT);
        // A reset of the stream, a GOAWAY, or the connection closed: never a response.
        if let Some(f) = &answer {
            assert_ne!(
                f.kind,
                h2raw::HEADERS,
                "{name}: answered with a response: {f:?}"
            );
            assert!(
                f.error_code()
                    .is_some_and(|code| code != 0 || f.kind == h2raw::GOAWAY),
                "{name}: {f:?}"
            );
        }
    }
    // A name the `h2` crate passes (its HPACK names may hold `"`) that is no token: an HTTP/1.1
    // parser refuses it, so the request path answers 400 as to an HTTP/1.1 client. `:status
    // 400` is the static table's entry 12 (RFC 7541 Appendix A), sent indexed: 0x8c.
    for name in [&b"transfer-encoding\""[..], b"x-forwarded-for\""] {
        let mut c = RawH2::connect(proxy.addr, &[]);
        c.send(&one_request(&h2raw::get("/obj/10", &[(name, b"1")])));
        let frames = c.until_end(1, WAIT);
        let head = frames
            .iter()
            .find(|f| f.kind == h2raw::HEADERS)
            .unwrap_or_else(|| panic!("no answer: {frames:?}"));
        assert_eq!(head.payload.first(), Some(&0x8c), "{frames:?}");
    }
    // Nothing reached the origin, and nothing was stored for the key the hostile heads named.
    assert_eq!(origin.request_count(), 0, "{:?}", origin.received());
    // The friendly twin: the same head without the hostile field is served.
    let mut c = RawH2::connect(proxy.addr, &[]);
    c.send(&one_request(&h2raw::get("/obj/10", &[(b"x-a", b"1 2")])));
    let frames = c.until_end(1, WAIT);
    assert!(
        frames.iter().any(|f| f.kind == h2raw::HEADERS),
        "{frames:?}"
    );
    assert_eq!(origin.request_count(), 1);
    assert!(
        metric(
            &proxy.metrics(),
            "zerocache_h2_events_total{event=\"malformed\"}"
        ) >= 4
    );
}

/// Issue #43, item 10, pinned as it stands (docs/security.md, known limits): an h2 `:path`
/// with a fragment, `/obj/20#a/../p`, reaches the proxy as `/obj/20`: the `h2` crate (0.4.20)
/// parses `:path` with `http::PathAndQuery`, which cuts at `#` before the request is handed
/// over. HTTP/1.1 answers the same target 400. What it must never do is store under one name
/// what another hop reads as another: the origin is asked for `/obj/20` exactly, the entry is
/// `/obj/20`'s, and an HTTP/1.1 client's `/obj/20` is a HIT of those same bytes. If the crate
/// ever hands the fragment over, the request path refuses it and this test fails on purpose.
#[test]
fn an_h2_path_with_a_fragment_names_the_path_before_it_at_every_hop() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    let mut c = RawH2::connect(proxy.addr, &[]);
    c.send(&one_request(&h2raw::get("/obj/20#a/../p", &[])));
    let frames = c.until_end(1, WAIT);
    let body: Vec<u8> = frames
        .iter()
        .filter(|f| f.kind == h2raw::DATA)
        .flat_map(|f| f.payload.clone())
        .collect();
    assert!(body == zerocache_origin::body(20), "{frames:?}");
    let paths: Vec<String> = origin.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/obj/20"]);
    let mut h1 = proxy.client();
    h1.host = "a.example".into();
    let r = h1.get("/obj/20", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == zerocache_origin::body(20));
    assert!(
        r.header("cache-status").is_some_and(|s| s.contains("hit")),
        "{:?}",
        r.headers
    );
    assert_eq!(origin.request_count(), 1);
    // HTTP/1.1's own answer to the fragment.
    let mut c = proxy.client();
    c.send(b"GET /obj/20#a/../p HTTP/1.1\r\nHost: a.example\r\n\r\n");
    let r = c.try_read_response(false).expect("an answer");
    assert_eq!(r.status, 400);
}

#[test]
fn rapid_reset_gets_enhance_your_calm_while_other_clients_are_served() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    let mut c = RawH2::connect(proxy.addr, &[]);
    // CVE-2023-44487: HEADERS then RST_STREAM, over and over, on one connection.
    let mut flood = Vec::new();
    for i in 0..2000u32 {
        let id = 1 + 2 * i;
        flood.extend(h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_HEADERS | h2raw::END_STREAM,
            id,
            &h2raw::get("/obj/1000", &[]),
        ));
        flood.extend(h2raw::frame(
            h2raw::RST_STREAM,
            0,
            id,
            &h2raw::CANCEL.to_be_bytes(),
        ));
    }
    let writer = {
        let mut sock = c.sock.try_clone().expect("clone");
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = sock.write_all(&flood);
        })
    };
    // Meanwhile another client is answered.
    let other = proxy.get("/obj/2000");
    assert_eq!(other.status, 200);
    assert!(other.body == body(2000));
    let mut goaway = None;
    while let Some(f) = c.next(WAIT) {
        if f.kind == h2raw::GOAWAY {
            goaway = Some(f);
            break;
        }
    }
    let _ = writer.join();
    let goaway = goaway.expect("a GOAWAY");
    assert_eq!(
        goaway.error_code(),
        Some(h2raw::ENHANCE_YOUR_CALM),
        "{goaway:?}"
    );
    assert_eventually_eq(
        "enhance-your-calm counted",
        WAIT,
        || {
            metric(
                &proxy.metrics(),
                "zerocache_h2_events_total{event=\"enhance-your-calm\"}",
            )
        },
        1,
    );
    // Still serving.
    assert_eq!(proxy.get("/obj/2000").x_cache(), "HIT");
}

#[test]
fn a_continuation_flood_is_cut_off_and_others_are_served() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    let c = RawH2::connect(proxy.addr, &[]);
    // HEADERS without END_HEADERS, then CONTINUATION frames that never end: 64 MiB of fields.
    let filler = h2raw::block(&[(b"x-filler", &[b'a'; 16_000][..])]);
    let mut sock = c.sock.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut sent = 0usize;
        let first = h2raw::frame(h2raw::HEADERS, 0, 1, &h2raw::get("/obj/10", &[]));
        if sock.write_all(&first).is_err() {
            return sent;
        }
        let cont = h2raw::frame(h2raw::CONTINUATION, 0, 1, &filler);
        while sent < 64 << 20 {
            if sock.write_all(&cont).is_err() {
                return sent;
            }
            sent += cont.len();
        }
        sent
    });
    let other = proxy.get("/obj/3000");
    assert!(other.body == body(3000));
    let sent = writer.join().expect("writer");
    assert!(
        sent < 64 << 20,
        "the proxy read {sent} bytes of one header block"
    );
    assert_eq!(origin.hits("/obj/10"), 0);
}

#[test]
fn streams_beyond_the_limit_are_refused() {
    let (origin, _rt) = origin();
    origin.script(
        "/slow",
        Reply::ok(b"ok".to_vec()).delay(Duration::from_secs(3)),
    );
    let proxy = h2c_proxy(origin.addr(), "");
    let mut c = RawH2::connect(proxy.addr, &[]);
    // Wait for the proxy's SETTINGS (its stream limit) before opening 129 streams.
    while let Some(f) = c.next(WAIT) {
        if f.kind == h2raw::SETTINGS {
            break;
        }
    }
    let mut all = Vec::new();
    for i in 0..129u32 {
        all.extend(h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_HEADERS | h2raw::END_STREAM,
            1 + 2 * i,
            &h2raw::get(&format!("/slow?{i}"), &[]),
        ));
    }
    c.send(&all);
    let last = 1 + 2 * 128;
    let answer = c.answer(last, WAIT).expect("an answer to stream 257");
    assert_eq!(answer.kind, h2raw::RST_STREAM, "{answer:?}");
    assert_eq!(answer.error_code(), Some(h2raw::REFUSED_STREAM));
}

/// A part of the h2c preface and then a FIN, or a part that stalls: closed, with nothing
/// written, at once on the FIN and at `header_timeout` on the stall. Both were held forever
/// (`peek` returns at once while bytes are queued, so the deadline never fired, and a FIN
/// after queued bytes looked like a client still sending), each connection woken every 128 ms
/// and counted against `max_connections`. The friendly twin: a whole preface, and HTTP/1.1.
#[test]
fn an_h2c_preface_prefix_then_fin_or_a_stall_is_closed() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "limits:\n  header_timeout: 1s\n");
    // The guard only stops a hang: 60 s against a 1 s header_timeout.
    let guard = Duration::from_secs(60);
    for (prefix, fin) in [
        (&b"P"[..], true),
        (&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r"[..], true),
        (&b"PRI * HT"[..], false),
    ] {
        assert_eq!(
            send_then_read_to_close(proxy.addr, prefix, fin, guard),
            Ending::Closed(Vec::new()),
            "{:?}, fin {fin}",
            String::from_utf8_lossy(prefix)
        );
    }
    let mut c = RawH2::connect(proxy.addr, &[]);
    c.send(&one_request(&h2raw::get("/obj/10", &[])));
    let frames = c.until_end(1, WAIT);
    assert!(
        frames
            .iter()
            .any(|f| f.kind == h2raw::DATA && f.payload == body(10)),
        "{frames:?}"
    );
    assert_eq!(proxy.client().get("/obj/10", &[]).status, 200);
}

#[test]
fn a_window_held_shut_is_reset_after_send_timeout_and_pins_nothing() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "limits:\n  send_timeout: 1s\n");
    // SETTINGS_INITIAL_WINDOW_SIZE 0: the stream can be sent nothing until a WINDOW_UPDATE that
    // never comes.
    let mut c = RawH2::connect(proxy.addr, &[(0x4, 0)]);
    c.send(&one_request(&h2raw::get("/obj/1048576", &[])));
    let frames = c.until_end(1, WAIT);
    let last = frames.last().expect("frames");
    assert_eq!(last.kind, h2raw::RST_STREAM, "{frames:?}");
    assert_eq!(last.error_code(), Some(h2raw::CANCEL));
    assert!(
        frames
            .iter()
            .all(|f| f.kind != h2raw::DATA || f.payload.is_empty()),
        "{frames:?}"
    );
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_h2_events_total{event=\"send-timeouts\"}"
        ),
        1
    );
    // The object was stored and is served whole to the next client (of the same host).
    let mut client = proxy.client();
    client.host = "a.example".into();
    let hit = client.get("/obj/1048576", &[]);
    assert_eq!(hit.x_cache(), "HIT");
    assert!(hit.body == body(1_048_576));
}

/// An h2 request abandoned before its answer left no access-log line (the origin had the
/// request and its `X-Request-Id`; HTTP/1.1 logs the same case as `aborted`), so a client could
/// hide requests from the log: a RST_STREAM and a closed connection, each while the origin
/// takes its time. Each is now a `499 ... aborted` line with the id the origin saw, beside the
/// friendly twin answered in full and logged `200`.
#[test]
fn an_abandoned_h2_request_is_logged_with_the_id_the_origin_saw() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    for p in ["/slow/reset", "/slow/closed", "/slow/answered"] {
        origin.script(
            p,
            Reply::ok(b"late".to_vec()).delay(Duration::from_millis(1500)),
        );
    }
    let proxy = h2c_proxy(
        origin.addr(),
        &format!("logging:\n  access_log: {}\n", log.display()),
    );
    let wait_for_origin = |path: &str| -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if let Some(r) = origin.received().iter().find(|r| r.path == path) {
                return r.header("x-request-id").expect("x-request-id").to_string();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{path} never reached the origin"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut c = RawH2::connect(proxy.addr, &[]);
    c.send(&one_request_on(1, "/slow/reset"));
    let reset_id = wait_for_origin("/slow/reset");
    c.send(&h2raw::frame(h2raw::RST_STREAM, 0, 1, &8u32.to_be_bytes()));
    let mut c2 = RawH2::connect(proxy.addr, &[]);
    c2.send(&one_request_on(1, "/slow/closed"));
    let closed_id = wait_for_origin("/slow/closed");
    drop(c2);
    c.send(&one_request_on(3, "/slow/answered"));
    let frames = c.until_end(3, WAIT);
    assert!(
        frames
            .iter()
            .any(|f| f.kind == h2raw::DATA && f.payload == b"late")
    );
    let answered_id = wait_for_origin("/slow/answered");
    let deadline = std::time::Instant::now() + WAIT;
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= 3 || std::time::Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(lines.len(), 3, "{lines:#?}");
    for (path, id, status, ended) in [
        ("/slow/reset", &reset_id, "499", "aborted"),
        ("/slow/closed", &closed_id, "499", "aborted"),
        ("/slow/answered", &answered_id, "200", "complete"),
    ] {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("\"GET {path} HTTP/2.0\" {status} ")))
            .unwrap_or_else(|| panic!("no {status} line for {path}: {lines:#?}"));
        assert!(line.contains(&format!(" {ended} ")), "{line}");
        assert!(line.trim_end().ends_with(id.as_str()), "{line} (id {id})");
    }
}

/// The proxy's resident memory, in KiB.
fn rss_kib(proxy: &Proxy) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", proxy.child.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .expect("VmRSS")
}

/// Streams whose client never opens its window held about 205 KiB each with no bound, kept after
/// the connections closed: 20 h2c connections × 128 streams of a 16 MiB hit with
/// `INITIAL_WINDOW_SIZE` 0 took RSS from 69 to 603 MB, still 470 MB 25 s after they closed. Now
/// a stream reads ahead only what the window has room for (a head's worth before it knows),
/// a connection's streams hold at most its budget (2 MiB), and what a burst freed is given back.
#[test]
fn streams_whose_window_stays_shut_hold_a_bounded_amount_and_give_it_back() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "limits:\n  send_timeout: 120s\n");
    let path = "/obj/16777216";
    assert_eq!(proxy.client().get(path, &[]).status, 200);
    assert_eq!(proxy.client().get(path, &[]).x_cache(), "HIT");
    let before = rss_kib(&proxy);
    let mut conns: Vec<RawH2> = (0..20)
        .map(|_| {
            let mut c = RawH2::connect(proxy.addr, &[(0x4, 0)]);
            let all: Vec<u8> = (0..128u32)
                .flat_map(|i| one_request_on(2 * i + 1, path))
                .collect();
            c.send(&all);
            c
        })
        .collect();
    // Every stream answered with its head; no DATA, the window being shut.
    for c in &mut conns {
        let mut heads = 0;
        while heads < 128 {
            let f = c.next(WAIT).expect("a frame before the guard");
            assert_ne!(f.kind, h2raw::DATA, "{f:?}");
            heads += usize::from(f.kind == h2raw::HEADERS);
        }
    }
    let held = rss_kib(&proxy).saturating_sub(before);
    // Each shut stream: its 4 KiB of head credit read ahead and its own state (buffers, tasks,
    // about 16 KiB in a debug build); 51 MB measured for the 2,560 (2026-12-04), 534 MB before.
    // 80 MB leaves room for the allocator's arenas under a loaded test run.
    assert!(held < 80 * 1024, "2,560 shut streams hold {held} KiB");
    drop(conns);
    // Given back: within the 32 MB the allocator keeps for reuse (the guard only bounds a hang).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut after = rss_kib(&proxy);
    while after > before + 40 * 1024 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        after = rss_kib(&proxy);
    }
    assert!(
        after <= before + 40 * 1024,
        "RSS {before} KiB before, {after} KiB after the connections closed"
    );
    assert_eq!(proxy.client().get(path, &[]).x_cache(), "HIT");
}

#[test]
fn drain_sends_goaway_and_the_stream_in_flight_finishes() {
    let (origin, _rt) = origin();
    goaway_on(&origin, libc::SIGTERM, "");
}

/// A SIGUSR2 upgrade drains the old process as SIGTERM does: its h2 connections get a GOAWAY,
/// their streams in flight their answers, and the successor serves new connections.
#[test]
fn an_upgrade_sends_goaway_and_the_stream_in_flight_finishes() {
    let dir = tempfile::tempdir().expect("tmp");
    let pid_file = dir.path().join("zerocache.pid");
    let (origin, _rt) = origin();
    let extra = format!("pid_file: {}\n", pid_file.display());
    let addr = goaway_on(&origin, libc::SIGUSR2, &extra);
    let successor: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    let (data, frames) = get_300(addr);
    // SAFETY: the successor this test started; nobody's child now.
    unsafe { libc::kill(successor, libc::SIGKILL) };
    assert!(data == body(300), "the successor answers: {frames:?}");
}

/// An h2 stream in flight when `sig` starts the drain: the GOAWAY (no error) comes, the stream
/// gets its whole answer, and the process exits 0. Returns the proxy's address.
fn goaway_on(origin: &Origin, sig: i32, extra: &str) -> std::net::SocketAddr {
    origin.script(
        "/slow",
        Reply::ok(b"slow answer".to_vec())
            .headers(&[("Cache-Control", "no-store")])
            .delay(Duration::from_millis(1500)),
    );
    let mut proxy = h2c_proxy(origin.addr(), extra);
    let mut c = RawH2::connect(proxy.addr, &[]);
    c.send(&one_request(&h2raw::get("/slow", &[])));
    assert_eq!(assert_eventually_origin_hit(origin), 1);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, sig) };
    let frames = c.until_end(1, WAIT);
    let goaway = frames.iter().position(|f| f.kind == h2raw::GOAWAY);
    let data: Vec<u8> = frames
        .iter()
        .filter(|f| f.kind == h2raw::DATA)
        .flat_map(|f| f.payload.clone())
        .collect();
    // The GOAWAY comes first (no error), and the stream already accepted still gets its answer.
    let g = goaway.map(|i| frames[i].clone());
    if let Some(g) = &g {
        assert_eq!(g.error_code(), Some(0), "{frames:?}");
    }
    let rest = c.until_end(1, WAIT);
    let data: Vec<u8> = data
        .into_iter()
        .chain(
            rest.iter()
                .filter(|f| f.kind == h2raw::DATA)
                .flat_map(|f| f.payload.clone()),
        )
        .collect();
    assert!(
        g.is_some() || rest.iter().any(|f| f.kind == h2raw::GOAWAY),
        "no GOAWAY: {frames:?} {rest:?}"
    );
    assert_eq!(data, b"slow answer");
    assert!(proxy.child.wait().expect("wait").success());
    proxy.addr
}

/// Waits until the origin has the `/slow` request; returns how many it has.
fn assert_eventually_origin_hit(origin: &Origin) -> usize {
    for _ in 0..500 {
        if origin.hits("/slow") > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    origin.hits("/slow")
}

#[test]
fn ping_and_settings_floods_from_a_client_that_does_not_read_stall_only_that_client() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    for (name, one) in [
        ("PING", h2raw::frame(h2raw::PING, 0, 0, &[7u8; 8])),
        (
            "SETTINGS",
            h2raw::frame(h2raw::SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]),
        ),
    ] {
        let c = RawH2::connect(proxy.addr, &[]);
        // 48 MiB of frames, never reading the answers: the proxy's answers back up in its
        // socket, after which it must stop reading this client rather than queue more.
        let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 4096).collect();
        let mut sock = c.sock.try_clone().expect("clone");
        sock.set_write_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let mut sent = 0usize;
            while sent < 48 << 20 {
                if sock.write_all(&batch).is_err() {
                    break;
                }
                sent += batch.len();
            }
            sent
        });
        let other = proxy.get("/obj/4000");
        assert!(other.body == body(4000), "{name}");
        let sent = writer.join().expect("writer");
        assert!(sent < 48 << 20, "{name}: the proxy took all {sent} bytes");
        drop(c);
    }
    assert_eq!(proxy.get("/obj/4000").x_cache(), "HIT");
}

#[test]
fn sighup_reloads_without_goaway_and_the_connection_goes_on() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    let mut c = RawH2::connect(proxy.addr, &[]);
    c.send(&one_request(&h2raw::get("/obj/100", &[])));
    let first = c.until_end(1, WAIT);
    assert!(first.iter().any(|f| f.kind == h2raw::HEADERS), "{first:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, libc::SIGHUP) };
    assert_eventually_eq(
        "reload counted",
        WAIT,
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"accepted\"}",
            )
        },
        1,
    );
    c.send(&h2raw::frame(
        h2raw::HEADERS,
        h2raw::END_HEADERS | h2raw::END_STREAM,
        3,
        &h2raw::get("/obj/100", &[]),
    ));
    let second = c.until_end(3, WAIT);
    assert!(
        second.iter().all(|f| f.kind != h2raw::GOAWAY),
        "a GOAWAY on reload: {second:?}"
    );
    let data: Vec<u8> = second
        .iter()
        .filter(|f| f.kind == h2raw::DATA && f.stream == 3)
        .flat_map(|f| f.payload.clone())
        .collect();
    assert!(data == body(100));
    assert_eq!(origin.hits("/obj/100"), 1);
}

#[test]
fn a_get_whose_stream_ends_on_an_empty_data_frame_is_cached_like_any_get() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    for round in 0..3 {
        let mut c = RawH2::connect(proxy.addr, &[]);
        // HEADERS without END_STREAM, then END_STREAM on an empty DATA frame.
        let mut bytes = h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_HEADERS,
            1,
            &h2raw::get("/obj/77", &[]),
        );
        bytes.extend(h2raw::frame(h2raw::DATA, h2raw::END_STREAM, 1, &[]));
        c.send(&bytes);
        let frames = c.until_end(1, WAIT);
        let data: Vec<u8> = frames
            .iter()
            .filter(|f| f.kind == h2raw::DATA)
            .flat_map(|f| f.payload.clone())
            .collect();
        assert!(data == body(77), "round {round}: {frames:?}");
    }
    // Stored by the first and served from the cache to the next two.
    assert_eq!(origin.hits("/obj/77"), 1);
}

#[test]
fn a_connection_past_its_goaway_that_never_answers_is_closed() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(
        origin.addr(),
        "limits:\n  idle_timeout: 1s\n  send_timeout: 1s\n",
    );
    let mut c = RawH2::connect(proxy.addr, &[]);
    // Never acknowledges the PING that follows the idle GOAWAY: the connection must still end.
    let mut saw_goaway = false;
    let mut closed = false;
    for _ in 0..100 {
        match c.next(WAIT) {
            Some(f) if f.kind == h2raw::GOAWAY => saw_goaway = true,
            Some(_) => {}
            None => {
                closed = true;
                break;
            }
        }
    }
    assert!(saw_goaway && closed, "goaway {saw_goaway}, closed {closed}");
    assert_eventually_eq(
        "the connection slot given back",
        WAIT,
        || {
            worker_loads(&proxy, worker_count(&proxy))
                .iter()
                .sum::<usize>()
        },
        0,
    );
}

#[test]
fn data_frames_fill_whole_tls_records_and_the_body_is_exact() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    // A window large enough for the whole body, on the stream and on the connection.
    let mut c = RawH2::connect(proxy.addr, &[(0x4, 1 << 20)]);
    c.send(&h2raw::frame(
        h2raw::WINDOW_UPDATE,
        0,
        0,
        &(1u32 << 20).to_be_bytes(),
    ));
    for stream in [1u32, 3] {
        c.send(&h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_HEADERS | h2raw::END_STREAM,
            stream,
            &h2raw::get("/obj/200000", &[]),
        ));
        let frames = c.until_end(stream, WAIT);
        let data: Vec<&h2raw::Frame> = frames
            .iter()
            .filter(|f| f.kind == h2raw::DATA && f.stream == stream)
            .collect();
        // 16,375 bytes of payload and a 9-byte frame header: one 16 KiB TLS record each.
        assert!(
            data.iter().all(|f| f.payload.len() <= 16_375),
            "{:?}",
            data.iter().map(|f| f.payload.len()).collect::<Vec<_>>()
        );
        let got: Vec<u8> = data.iter().flat_map(|f| f.payload.clone()).collect();
        assert!(got == body(200_000), "stream {stream}");
    }
    assert_eq!(origin.hits("/obj/200000"), 1);
}

/// The probe's count of an h2 connection's socket is joined with that connection's record: all
/// its bytes went by writes, all of them copies by design, none a violation.
#[test]
fn an_h2_connection_is_joined_with_its_own_kernel_record() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = h2c_probe_proxy(origin.addr());
    let mut c = RawH2::connect(proxy.addr, &[(0x4, 1 << 20)]);
    c.send(&h2raw::frame(
        h2raw::WINDOW_UPDATE,
        0,
        0,
        &(1u32 << 20).to_be_bytes(),
    ));
    for stream in [1u32, 3] {
        c.send(&one_request_on(stream, "/obj/200000"));
        let got: Vec<u8> = c
            .until_end(stream, WAIT)
            .iter()
            .filter(|f| f.kind == h2raw::DATA)
            .flat_map(|f| f.payload.clone())
            .collect();
        assert!(got == body(200_000), "stream {stream}");
    }
    let local = c.sock.local_addr().expect("addr").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |x| x["peer"] == local.as_str());
    assert_eq!(conn["h2"], true, "{conn}");
    assert_eq!(u(&conn["requests"]), 2, "{conn}");
    assert_eq!(u(&conn["copy_body_bytes"]), 400_000, "{conn}");
    let k = &conn["kernel"];
    assert_eq!(u(&k["zerocopy_bytes"]), 0, "{conn}");
    // Every body byte, framed, went out by writes on this very socket.
    assert!(u(&k["copy_bytes"]) > 400_000, "{conn}");
    assert_eq!(
        conn["verdict"], "copy (HTTP/2: frames written from user space)",
        "{conn}"
    );
    assert_eq!(u(&conn["violations"]), 0, "{conn}");
}

/// A proxy with `h2c: true` and the eBPF probe loaded (root only).
fn h2c_probe_proxy(origin: std::net::SocketAddr) -> Proxy {
    Proxy::start(
        origin,
        Opts {
            probe: true,
            listen_options: "h2c: true".into(),
            ..Opts::default()
        },
    )
}

/// HEADERS for `stream` asking for `path`, ending the stream.
fn one_request_on(stream: u32, path: &str) -> Vec<u8> {
    h2raw::frame(
        h2raw::HEADERS,
        h2raw::END_HEADERS | h2raw::END_STREAM,
        stream,
        &h2raw::get(path, &[]),
    )
}

/// Request and response counters say which protocol answered: an h2 MISS and HIT are counted
/// with `protocol="h2"`, an HTTP/1.1 GET beside them with `http/1.1`.
#[test]
fn request_and_response_counters_carry_the_protocol() {
    let (origin, _rt) = origin();
    let proxy = h2c_proxy(origin.addr(), "");
    for expected in ["MISS", "HIT"] {
        let (data, frames) = get_300(proxy.addr);
        assert!(data == body(300), "{expected}: {frames:?}");
    }
    let mut h1 = proxy.client();
    h1.host = "a.example".into();
    assert_eq!(h1.get("/obj/300", &[]).x_cache(), "HIT");
    // A response is counted once it is sent, which can be just after the client has read it.
    let expected = [
        ("MISS", "h2", 1),
        ("HIT", "h2", 1),
        ("HIT", "http/1.1", 1),
        ("MISS", "http/1.1", 0),
    ];
    let counted = || {
        let m = proxy.metrics();
        let series = |name: &str, labels: String| metric(&m, &format!("{name}{{{labels}}}"));
        expected
            .iter()
            .map(|(cs, proto, _)| {
                (
                    series(
                        "zerocache_requests_total",
                        format!("cache_status=\"{cs}\",protocol=\"{proto}\",route=\"0\",source=\"client\""),
                    ),
                    series(
                        "zerocache_responses_total",
                        format!("cache_status=\"{cs}\",code=\"200\",protocol=\"{proto}\",route=\"0\""),
                    ),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eventually_eq(
        "requests and responses by protocol",
        Duration::from_secs(5),
        counted,
        expected.iter().map(|(_, _, n)| (*n, *n)).collect(),
    );
}

/// `GET /obj/300` on a new h2c connection: the DATA payloads joined, and every frame.
fn get_300(addr: std::net::SocketAddr) -> (Vec<u8>, Vec<h2raw::Frame>) {
    let mut c = RawH2::connect(addr, &[]);
    c.send(&one_request(&h2raw::get("/obj/300", &[])));
    let frames = c.until_end(1, WAIT);
    let data = frames
        .iter()
        .filter(|f| f.kind == h2raw::DATA)
        .flat_map(|f| f.payload.clone())
        .collect();
    (data, frames)
}

/// A zero `content-length` (written `0000`, as the fuzzer found) on a stream whose HEADERS do not
/// end it, then an empty DATA frame that does: one request with no body reaches the origin, and
/// the stream is answered (not left waiting for a body that HTTP/1.1 says is not there).
#[test]
fn a_zero_content_length_on_an_open_stream_is_an_empty_body() {
    let (origin, _rt) = origin();
    origin.script(
        "/zero",
        Reply::ok(b"took it".to_vec()).headers(&[("Cache-Control", "no-store")]),
    );
    let proxy = h2c_proxy(origin.addr(), "");
    let mut c = RawH2::connect(proxy.addr, &[]);
    let head = h2raw::block(&[
        (b":method", b"PUT"),
        (b":scheme", b"http"),
        (b":authority", b"a.example"),
        (b":path", b"/zero"),
        (b"content-length", b"0000"),
    ]);
    let mut frames = h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS, 1, &head);
    frames.extend(h2raw::frame(h2raw::DATA, h2raw::END_STREAM, 1, b""));
    c.send(&frames);
    let got = c.until_end(1, WAIT);
    let data: Vec<u8> = got
        .iter()
        .filter(|f| f.kind == h2raw::DATA)
        .flat_map(|f| f.payload.clone())
        .collect();
    assert_eq!(data, b"took it", "{got:?}");
    let sent = origin.received();
    let put = sent.iter().find(|r| r.path == "/zero").expect("forwarded");
    assert_eq!(put.method, "PUT");
    assert!(put.body.is_empty());
}

/// An answer's frames, and the answers ready in the same turn, share a write
/// (`server/h2/output.rs`). Before, the crate's connection task was woken by each frame a stream
/// queued and wrote and flushed it alone: a hit's HEADERS and its DATA in two writes (two TLS
/// records, two segments), 2.1 writes per 1 KiB hit under h2load and 40% of the proxy's CPU in
/// writev. Counted by the probe on this connection's own socket: ten hits one after the other,
/// then ten asked for in one packet.
#[test]
fn an_answer_and_answers_ready_together_share_a_write() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = h2c_probe_proxy(origin.addr());
    // Warmed on a connection of its own.
    let mut warm = RawH2::connect(proxy.addr, &[]);
    warm.send(&one_request_on(1, "/obj/1000"));
    assert!(
        warm.until_end(1, WAIT)
            .iter()
            .any(|f| f.kind == h2raw::DATA)
    );
    drop(warm);
    let mut c = RawH2::connect(proxy.addr, &[]);
    let mut bodies: std::collections::BTreeMap<u32, Vec<u8>> = Default::default();
    let mut read_until_ended = |c: &mut RawH2, count: usize| {
        let mut ended = 0;
        while ended < count {
            let Some(f) = c.next(WAIT) else {
                panic!("{ended} of {count} streams ended");
            };
            if f.kind == h2raw::DATA {
                bodies
                    .entry(f.stream)
                    .or_default()
                    .extend_from_slice(&f.payload);
            }
            if f.stream != 0 && f.flags & h2raw::END_STREAM != 0 {
                ended += 1;
            }
        }
    };
    for i in 0..10 {
        c.send(&one_request_on(1 + 2 * i, "/obj/1000"));
        read_until_ended(&mut c, 1);
    }
    let batch: Vec<u8> = (10..20)
        .flat_map(|i| one_request_on(1 + 2 * i, "/obj/1000"))
        .collect();
    c.send(&batch);
    read_until_ended(&mut c, 10);
    assert_eq!(bodies.len(), 20);
    assert!(bodies.values().all(|b| *b == body(1000)));
    let local = c.sock.local_addr().expect("addr").to_string();
    drop(c);
    let conn = closed_conn(&proxy, |x| x["peer"] == local.as_str());
    assert_eq!(u(&conn["requests"]), 20, "{conn}");
    // The server's SETTINGS and the ack of the client's, one write per answer of the ten one
    // after the other, and a few for the ten together: 16 on a quiet machine. How few for the
    // ten together depends on how many are ready at once, which a busy machine changes (19 was
    // seen beside a build), so what is held is what does not depend on it: no answer is split
    // (at most 2 + 10 + 10 = 22, where an answer's HEADERS and DATA written apart made 24 with
    // every answer of the ten together in one write).
    let calls = u(&conn["kernel"]["calls"]);
    assert!(calls <= 22, "{calls} writes for twenty answers: {conn}");
    assert_eq!(origin.hits("/obj/1000"), 1);
}

/// curl over h2c posting `body` to `path` on stdin: with `--data-binary` when `sized` (a
/// `content-length`), with `-T -` otherwise (DATA frames until END_STREAM, no length). Returns
/// the status.
fn h2_upload(addr: std::net::SocketAddr, path: &str, body: &[u8], sized: bool) -> u16 {
    use std::io::Write;
    let url = format!("http://{addr}{path}");
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "20", "--http2-prior-knowledge"])
        .args(["-o", "/dev/null", "-w", "%{http_code}"]);
    if sized {
        cmd.args(["--data-binary", "@-"]);
    } else {
        cmd.args(["-X", "POST", "-T", "-"]);
    }
    let mut child = cmd
        .arg(&url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(body).expect("body to curl");
    drop(stdin);
    let out = child.wait_with_output().expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .parse()
        .expect("status")
}

/// An h2 request's body reaches the origin exactly, read off the stream by the request path
/// itself (no HTTP/1.1 bytes between): with a `content-length` it is forwarded with it; without
/// one a small body is held and sent with the length it turned out to have, a large one is
/// streamed chunked; one over `limits.max_body_bytes` is refused with 413 and never forwarded.
#[test]
fn request_bodies_over_h2_reach_the_origin_exactly() {
    let (origin, _rt) = origin();
    origin.script(
        "/up",
        Reply::ok(b"stored".to_vec()).status(201).headers(&[]),
    );
    let proxy = h2c_proxy(origin.addr(), "limits:\n  max_body_bytes: 1MiB\n");
    let small: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let large: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(h2_upload(proxy.addr, "/up", &small, true), 201);
    assert_eq!(h2_upload(proxy.addr, "/up", &small, false), 201);
    assert_eq!(h2_upload(proxy.addr, "/up", &large, false), 201);
    let got = origin.received();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0].header("content-length"), Some("5000"));
    assert_eq!(got[1].header("content-length"), Some("5000"));
    assert_eq!(got[1].header("transfer-encoding"), None);
    assert_eq!(got[2].header("content-length"), None);
    assert_eq!(got[2].header("transfer-encoding"), Some("chunked"));
    assert_eq!(got[0].body, small);
    assert_eq!(got[1].body, small);
    assert_eq!(got[2].body, large);
    for r in &got {
        assert_eq!(r.method, "POST");
        assert_eq!(r.header("via"), Some("2 zerocache"), "{r:?}");
    }
    // Over the limit, without a length: refused once it is seen, nothing forwarded.
    let too_large = vec![b'x'; (1 << 20) + 1];
    assert_eq!(h2_upload(proxy.addr, "/up", &too_large, false), 413);
    assert_eq!(origin.request_count(), 3);
}
