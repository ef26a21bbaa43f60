//! Request bodies: small ones are held in memory, large ones streamed to the origin as they
//! arrive, so memory per connection stays bounded whatever clients upload; a client that
//! trickles its body slower than `limits.read_timeout` gets 408.

use crate::support::*;
use std::io::{Read, Write};
use std::time::Duration;

/// The proxy's peak resident memory so far, in bytes (VmHWM).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

#[test]
fn large_bodies_are_streamed_exactly_with_bounded_memory() {
    let (origin, _rt) = origin();
    origin.script(
        "/up",
        Reply::ok(b"stored".to_vec()).status(201).headers(&[]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let size = 8 << 20;
    let uploads: Vec<_> = (0..16u8)
        .map(|i| {
            let addr = proxy.addr;
            std::thread::spawn(move || {
                let body: Vec<u8> = (0..size).map(|j| (j as u8) ^ i).collect();
                let mut c = Client::connect(addr);
                let r = c.send_with_body("POST", "/up", &[("X-N", &i.to_string())], &body);
                (r.status, r.body)
            })
        })
        .collect();
    for u in uploads {
        assert_eq!(u.join().expect("upload"), (201, b"stored".to_vec()));
    }
    let got = origin.received();
    assert_eq!(got.len(), 16);
    for r in &got {
        let i: u8 = r.header("x-n").and_then(|n| n.parse().ok()).expect("x-n");
        assert_eq!(r.header("content-length"), Some("8388608"));
        assert_eq!(r.body.len(), size);
        assert!(
            r.body.iter().enumerate().all(|(j, b)| *b == (j as u8) ^ i),
            "body {i} differs"
        );
    }
    // 128 MiB went through; held whole it would have cost at least that much.
    let peak = peak_rss(proxy.child.id());
    assert!(peak < 96 << 20, "peak RSS {peak} bytes");
}

#[test]
fn a_large_chunked_body_is_streamed_dechunked_and_rechunked() {
    let (origin, _rt) = origin();
    origin.script("/up", Reply::ok(b"ok".to_vec()).headers(&[]));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let body: Vec<u8> = (0..1_000_000u32).map(|j| (j % 251) as u8).collect();
    let mut raw = b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in body.chunks(70_000) {
        raw.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        raw.extend_from_slice(piece);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let mut c = proxy.client();
    c.send(&raw);
    let r = c.read_response(false);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    let got = origin.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("transfer-encoding"), Some("chunked"));
    assert!(got[0].body == body, "body differs");
    // The connection is still good for the next request.
    assert_eq!(c.get("/up", &[]).status, 200);
}

#[test]
fn a_body_slower_than_read_timeout_gets_408() {
    let (origin, _rt) = origin();
    origin.script("/up", Reply::ok(b"ok".to_vec()).headers(&[]));
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  read_timeout: 1s\n".into(),
            ..Opts::default()
        },
    );
    // Small (held in memory) and large (already streaming) bodies alike.
    for sent in [10usize, 200_000] {
        let mut c = proxy.client();
        c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n");
        c.send(&vec![b'x'; sent]);
        let mut all = Vec::new();
        c.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let _ = c.sock.read_to_end(&mut all);
        let text = String::from_utf8_lossy(&all);
        assert!(
            text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{sent}: {text}"
        );
        assert!(text.contains("Connection: close\r\n"), "{text}");
    }
}

/// A body trickled one byte just inside every `read_timeout` never trips it; the minimum rate
/// (Apache's MinRate) does: with `read_timeout: 2s` and `body_min_rate: 100`, the body must be in
/// by 2 s plus 10 ms per byte received, and a byte every 1.5 s is cut off with 408 after the
/// second byte, long before the 1,000 it announced. Beside it, a body sent at once is forwarded.
#[test]
fn a_body_trickled_inside_every_read_timeout_is_cut_off_by_the_minimum_rate() {
    let (origin, _rt) = origin();
    origin.script("/up", Reply::ok(b"ok".to_vec()).headers(&[]));
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "limits:\n  read_timeout: 2s\n  body_min_rate: 100\n".into(),
            ..Opts::default()
        },
    );
    let mut quick = proxy.client();
    let r = quick.send_with_body("POST", "/up", &[], &[b'y'; 1000]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    let mut c = proxy.client();
    c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n");
    c.sock
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("timeout");
    let mut sent = 0;
    let mut answer = Vec::new();
    while sent < 10 {
        if c.sock.write_all(b"x").is_err() {
            break;
        }
        sent += 1;
        let mut buf = [0u8; 4096];
        match c.sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {} // nothing yet: the next byte, 1.5 s after this one
        }
    }
    c.sock
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = c.sock.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "after {sent} bytes: {text}"
    );
    assert!(sent <= 3, "cut off after {sent} of 1000 bytes");
    assert_eq!(
        origin.hits("/up"),
        1,
        "only the quick body reached the origin"
    );
}
