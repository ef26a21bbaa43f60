//! The `PURGE` method on the data port (`purge.method`): off, it is forwarded like any method;
//! on, an allowed client (by address or bearer token) purges the URL and reads the count, and
//! anyone else gets 403 with nothing purged.

use crate::support::*;

fn proxy_with(origin: std::net::SocketAddr, purge: &str) -> Proxy {
    Proxy::start(
        origin,
        Opts {
            extra_yaml: format!("purge:\n{purge}"),
            ..Opts::default()
        },
    )
}

#[test]
fn off_by_default_purge_is_forwarded_like_any_method() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/100").x_cache(), "MISS");
    let mut c = proxy.client();
    let r = c.request("PURGE", "/obj/100", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        origin.received().last().map(|r| r.method.clone()),
        Some("PURGE".to_string())
    );
    // Forwarded; and like any unsafe method the origin answered 2xx, it invalidates the URL
    // (RFC 9111 §4.4): the proxy did not purge it, the origin's answer did.
    assert_eq!(proxy.get("/obj/100").x_cache(), "MISS");
}

#[test]
fn an_allowed_client_purges_the_url_and_reads_the_count() {
    let (origin, _rt) = origin();
    let proxy = proxy_with(
        origin.addr(),
        "  method: true\n  allowed_clients: [127.0.0.1]\n",
    );
    assert_eq!(proxy.get("/obj/100").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/100").x_cache(), "HIT");
    let mut c = proxy.client();
    let r = c.request("PURGE", "/obj/100", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.body, b"{\"purged\":1}\n");
    // Answered here, never forwarded; the next GET goes to the origin again.
    assert!(origin.received().iter().all(|r| r.method != "PURGE"));
    assert_eq!(proxy.get("/obj/100").x_cache(), "MISS");
    assert_eq!(origin.hits("/obj/100"), 2);
    // Nothing stored under the URL: purged 0.
    assert_eq!(
        c.request("PURGE", "/obj/nothing", &[]).body,
        b"{\"purged\":0}\n"
    );
}

#[test]
fn others_need_the_token_and_get_403_without_it() {
    let (origin, _rt) = origin();
    let token = "a-long-purge-token-0123456789";
    let proxy = proxy_with(
        origin.addr(),
        &format!("  method: true\n  allowed_clients: [10.0.0.0/8]\n  token: {token}\n"),
    );
    assert_eq!(proxy.get("/obj/100").x_cache(), "MISS");
    let mut c = proxy.client();
    for auth in [
        None,
        Some("Bearer wrong-token-0123456789abc".to_string()),
        Some(format!("Basic {token}")),
        Some(format!("Bearer {token}x")),
    ] {
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let r = c.request("PURGE", "/obj/100", &headers);
        assert_eq!(r.status, 403, "{auth:?}");
        assert_eq!(proxy.get("/obj/100").x_cache(), "HIT", "{auth:?}");
    }
    // With its phrase: it went out as `403 Unknown`.
    let mut raw = std::net::TcpStream::connect(proxy.addr).expect("connect");
    std::io::Write::write_all(
        &mut raw,
        b"PURGE /obj/100 HTTP/1.1\r\nHost: test.example\r\nConnection: close\r\n\r\n",
    )
    .expect("send");
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut raw, &mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 403 Forbidden\r\n"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let bearer = format!("Bearer {token}");
    let r = c.request("PURGE", "/obj/100", &[("Authorization", &bearer)]);
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"{\"purged\":1}\n"[..])
    );
    assert_eq!(proxy.get("/obj/100").x_cache(), "MISS");
    assert!(origin.received().iter().all(|r| r.method != "PURGE"));
}
