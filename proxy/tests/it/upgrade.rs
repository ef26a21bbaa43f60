//! Upgrade tunnels (`routes[].upgrade: true`): a WebSocket handshake gets the origin's 101 and
//! the bytes after it go both ways; an origin that declines is relayed and the connection
//! closes; without `upgrade: true` the Upgrade is not forwarded and an origin's 101 is a 502.

use crate::support::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// A raw origin: `/ws` answers 101 (WebSocket) and echoes every byte after the head, those sent
/// with it included; `/decline` answers 426. Returns its address and the heads it received.
fn ws_origin() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { return };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let end = loop {
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                    match sock.read(&mut chunk) {
                        Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                seen.lock().expect("heads").push(head.clone());
                if head.starts_with("GET /decline ") {
                    let _ = sock.write_all(
                        b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 4\r\n\r\nnope",
                    );
                    return;
                }
                let reply = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {ACCEPT}\r\nSurrogate-Key: ws-tag\r\n\r\n"
                );
                if sock.write_all(reply.as_bytes()).is_err() {
                    return;
                }
                if head.starts_with("GET /push ") {
                    // Sends 4 MiB and never reads: the proxy must go on relaying this way while
                    // the client's bytes pile up the other way.
                    let _ = sock.write_all(&body(PUSHED));
                    std::thread::sleep(Duration::from_secs(30));
                    return;
                }
                let _ = sock.write_all(&buf[end..]);
                loop {
                    match sock.read(&mut chunk) {
                        Ok(n) if n > 0 => {
                            if sock.write_all(&chunk[..n]).is_err() {
                                return;
                            }
                        }
                        _ => return,
                    }
                }
            });
        }
    });
    (addr, heads)
}

const PUSHED: usize = 4 << 20;

const HANDSHAKE: &[u8] = b"GET /ws HTTP/1.1\r\nHost: t.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

/// A proxy whose one route tunnels Upgrades to `origin`.
fn tunnelling(origin: std::net::SocketAddr) -> Proxy {
    Proxy::start(
        origin,
        Opts {
            route_yaml: "    upgrade: true\n".into(),
            ..Opts::default()
        },
    )
}

fn client(proxy: &Proxy) -> TcpStream {
    let s = TcpStream::connect(proxy.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s
}

/// Reads until `want` bytes after the head's end, or the connection closes.
fn read_head_and(s: &mut TcpStream, want: usize) -> (String, Vec<u8>) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n")
            && got.len() >= p + 4 + want
        {
            let head = String::from_utf8_lossy(&got[..p + 4]).into_owned();
            return (head, got[p + 4..].to_vec());
        }
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => got.extend_from_slice(&chunk[..n]),
            _ => {
                let p = got
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map_or(got.len(), |p| p + 4);
                return (
                    String::from_utf8_lossy(&got[..p]).into_owned(),
                    got[p..].to_vec(),
                );
            }
        }
    }
}

#[test]
fn a_websocket_handshake_gets_the_origins_101_and_its_echo() {
    let (origin, heads) = ws_origin();
    let proxy = tunnelling(origin);
    let mut s = client(&proxy);
    // Bytes sent right behind the handshake cross too.
    s.write_all(&[HANDSHAKE, b"ping-1"].concat()).expect("send");
    let (head, echoed) = read_head_and(&mut s, 6);
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{head}"
    );
    for line in [
        &format!("Sec-WebSocket-Accept: {ACCEPT}\r\n"),
        "Connection: upgrade\r\n",
        "Upgrade: websocket\r\n",
    ] {
        assert!(head.contains(line), "{line} in {head}");
    }
    // The tag field is hidden from clients on a 101 as on every other response.
    assert!(
        !head.to_ascii_lowercase().contains("surrogate-key"),
        "{head}"
    );
    assert_eq!(echoed, b"ping-1");
    s.write_all(b"ping-2").expect("send");
    let mut back = [0u8; 6];
    s.read_exact(&mut back).expect("echo");
    assert_eq!(&back, b"ping-2");
    // The client closes its side: the origin sees it, closes too, and so does the tunnel.
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert_eq!(rest, b"");
    let sent = heads.lock().expect("heads")[0].to_ascii_lowercase();
    for line in [
        "upgrade: websocket\r\n",
        "connection: upgrade\r\n",
        "sec-websocket-key: dghlihnhbxbszsbub25jzq==\r\n",
        "x-forwarded-for: 127.0.0.1\r\n",
    ] {
        assert!(sent.contains(line), "{line} in {sent}");
    }
    let m = || proxy.metrics();
    assert_eventually_eq(
        "tunnel bytes counted once the connection closed",
        Duration::from_secs(10),
        || metric(&m(), "zerocache_copied_body_bytes_total{reason=\"tunnel\"}"),
        12,
    );
    assert_eq!(
        metric(&m(), "zerocache_upgrades_total{outcome=\"switched\"}"),
        1
    );
}

#[test]
fn a_declined_upgrade_is_relayed_and_without_upgrade_true_a_101_is_a_502() {
    let (origin, heads) = ws_origin();
    let proxy = tunnelling(origin);
    let mut s = client(&proxy);
    let decline = String::from_utf8_lossy(HANDSHAKE).replace("GET /ws ", "GET /decline ");
    s.write_all(decline.as_bytes()).expect("send");
    let (head, body) = read_head_and(&mut s, 4);
    assert!(
        head.starts_with("HTTP/1.1 426 Upgrade Required\r\n"),
        "{head}"
    );
    assert!(head.contains("Connection: close\r\n"), "{head}");
    assert_eq!(body, b"nope");
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_upgrades_total{outcome=\"refused\"}"
        ),
        1
    );

    // The default route does not forward Upgrade: the origin switches anyway, which is a 502.
    let plain = Proxy::start(origin, Opts::default());
    let mut s = client(&plain);
    s.write_all(HANDSHAKE).expect("send");
    let (head, _) = read_head_and(&mut s, 0);
    assert!(head.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{head}");
    let sent = heads
        .lock()
        .expect("heads")
        .last()
        .cloned()
        .unwrap_or_default();
    assert!(
        !sent.to_ascii_lowercase().contains("upgrade: websocket"),
        "{sent}"
    );
    // Nor the handshake's own fields: the request goes on as the plain GET it also is, so no
    // per-connection key reaches the origin (or a stored response's request).
    assert!(
        !sent.to_ascii_lowercase().contains("sec-websocket-"),
        "{sent}"
    );
    assert_eq!(
        metric(
            &plain.metrics(),
            "zerocache_upgrades_total{outcome=\"switched\"}"
        ),
        0
    );
}

/// Each direction of a tunnel goes on its own: an origin that never reads while it sends 4 MiB,
/// to a client that sends 4 MiB the other way at the same time, still gets every byte to the
/// client (copying one direction at a time would deadlock on the full buffers).
#[test]
fn a_side_that_stops_reading_holds_up_only_its_own_direction() {
    let (origin, _heads) = ws_origin();
    let proxy = tunnelling(origin);
    let mut s = client(&proxy);
    let push = String::from_utf8_lossy(HANDSHAKE).replace("GET /ws ", "GET /push ");
    s.write_all(push.as_bytes()).expect("send");
    let mut writer = s.try_clone().expect("clone");
    std::thread::spawn(move || {
        let _ = writer.write_all(&vec![7u8; PUSHED]);
    });
    let (head, got) = read_head_and(&mut s, PUSHED);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert_eq!(got.len(), PUSHED);
    assert!(got == body(PUSHED), "the pushed bytes, in order");
}
