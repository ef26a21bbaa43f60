//! A listener behind an L4 load balancer (`listen: {addr, proxy_protocol: true,
//! proxy_protocol_from}`): the PROXY header's source is the client for the access log and
//! `X-Forwarded-For`; a connection without a header, with a malformed one, or from a peer not in
//! `proxy_protocol_from` is closed without a response.

use crate::support::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn v2(cmd: u8, src: [u8; 4], sport: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[cmd, 0x11, 0, 12 + 7]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&80u16.to_be_bytes());
    // A TLV (AWS's VPC endpoint id type), skipped.
    h.extend_from_slice(&[0xEA, 0, 4, b'v', b'p', b'c', b'e']);
    h
}

/// Sends `pieces` on a new connection, 50 ms apart, then reads until the proxy closes; returns
/// every byte read (nothing, for a connection closed without a response).
fn exchange(proxy: &Proxy, pieces: &[&[u8]]) -> Vec<u8> {
    let mut s = TcpStream::connect(proxy.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    for (i, p) in pieces.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        // The proxy may close before the last piece: a failed write is part of the answer.
        if s.write_all(p).is_err() {
            break;
        }
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

const GET: &[u8] = b"GET /obj/100 HTTP/1.1\r\nHost: t.example\r\nConnection: close\r\n\r\n";

fn start(origin: &Origin, from: &str, log: &std::path::Path) -> Proxy {
    Proxy::start(
        origin.addr(),
        Opts {
            listen_options: format!("proxy_protocol: true, proxy_protocol_from: [{from}]"),
            extra_yaml: format!("logging:\n  access_log: {}\n", log.display()),
            ..Opts::default()
        },
    )
}

#[test]
fn a_header_from_an_allowed_peer_names_the_client() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let proxy = start(&origin, "127.0.0.0/8", &log);
    let v1 = b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 80\r\n";
    // v1 whole with the request; v2 in three pieces (its header split mid-way: peeked until
    // whole, and the request after it left for HTTP); v2 LOCAL (a health check): the peer's own.
    let v2_proxy = v2(0x21, [198, 51, 100, 9], 40000);
    let v2_local = v2(0x20, [203, 0, 113, 1], 1);
    let answers = [
        exchange(&proxy, &[&[v1.as_slice(), GET].concat()]),
        exchange(&proxy, &[&v2_proxy[..10], &v2_proxy[10..], GET]),
        exchange(&proxy, &[&[v2_local.as_slice(), GET].concat()]),
    ];
    for a in &answers {
        let text = String::from_utf8_lossy(a);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(a.ends_with(&body(100)), "{text}");
    }
    let forwarded: Vec<String> = origin
        .received()
        .iter()
        .filter_map(|r| r.header("x-forwarded-for").map(str::to_string))
        .collect();
    assert_eq!(forwarded[0], "192.0.2.7");
    let lines = wait_for_lines(&log, 3);
    assert!(
        lines[0].contains(" 192.0.2.7:51234 \"GET /obj/100 HTTP/1.1\" 200 "),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(" 198.51.100.9:40000 \"GET /obj/100 HTTP/1.1\" 200 "),
        "{}",
        lines[1]
    );
    assert!(lines[2].contains(" 127.0.0.1:"), "{}", lines[2]);
    assert!(!lines[2].contains("203.0.113.1"), "{}", lines[2]);
}

#[test]
fn without_a_good_header_from_an_allowed_peer_the_connection_is_closed() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let proxy = start(&origin, "127.0.0.0/8", &log);
    let mut bad_version = v2(0x21, [192, 0, 2, 7], 1);
    bad_version[12] = 0x11;
    let mut past_packet = v2(0x21, [192, 0, 2, 7], 1);
    past_packet[15] = 4; // 4 bytes of addresses: too short for IPv4's 12
    let long_v1 = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120], b"\r\n"].concat();
    for (what, bytes) in [
        ("no header", GET.to_vec()),
        ("a TLS ClientHello", b"\x16\x03\x01\x00\x05hello".to_vec()),
        ("v1 longer than 107 bytes", long_v1),
        (
            "v1 with a bad port",
            b"PROXY TCP4 192.0.2.7 10.0.0.1 65536 80\r\n".to_vec(),
        ),
        ("v2 of another version", bad_version),
        ("v2 addresses past its length", past_packet),
    ] {
        let got = exchange(&proxy, &[&[bytes.as_slice(), GET].concat()]);
        assert_eq!(got, b"", "{what}");
    }
    // From a peer not in proxy_protocol_from, a good header is not believed either.
    let elsewhere = start(&origin, "10.0.0.0/8", &dir.path().join("other.log"));
    let v1 = b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 80\r\n";
    assert_eq!(exchange(&elsewhere, &[&[v1.as_slice(), GET].concat()]), b"");
    assert_eq!(origin.hits("/obj/100"), 0, "nothing reached the origin");
}

/// A partial PROXY header from an allowed peer, then a FIN or a stall: closed with nothing
/// written, at once on the FIN and at `limits.header_timeout` on the stall (both were held
/// forever, polled every 5 ms). v1 cut inside its addresses, v2 announcing 500 bytes and
/// sending 100. The friendly twin: the same headers whole are served.
#[test]
fn a_partial_proxy_header_then_fin_or_a_stall_is_closed() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            listen_options: "proxy_protocol: true, proxy_protocol_from: [127.0.0.0/8]".into(),
            extra_yaml: format!(
                "logging:\n  access_log: {}\nlimits:\n  header_timeout: 1s\n",
                dir.path().join("access.log").display()
            ),
            ..Opts::default()
        },
    );
    let mut v2_long = v2(0x21, [192, 0, 2, 7], 1);
    v2_long[14..16].copy_from_slice(&500u16.to_be_bytes());
    v2_long.resize(100, 0);
    let guard = Duration::from_secs(60);
    for (what, bytes) in [("v1", b"PROXY TCP4 1".to_vec()), ("v2", v2_long)] {
        for fin in [true, false] {
            assert_eq!(
                send_then_read_to_close(proxy.addr, &bytes, fin, guard),
                Ending::Closed(Vec::new()),
                "{what}, fin {fin}"
            );
        }
    }
    let v1 = b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 80\r\n";
    let answer = exchange(&proxy, &[&[v1.as_slice(), GET].concat()]);
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert_eq!(origin.hits("/obj/100"), 1);
}

/// The access log's lines once there are `n` of them (it is written by a thread of its own).
fn wait_for_lines(log: &std::path::Path, n: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= n || std::time::Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
