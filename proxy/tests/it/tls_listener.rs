//! The `tls:` listener end to end: the real binary with certificates made here by rcgen, a real
//! rustls client, the real origin and (as root) the real probe. A hit on a TLS connection is
//! copied by design (`tls-userspace`, never a violation), and the kernel agrees: writes, no
//! sendfile.

use crate::support::*;
use crate::tls_support::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A proxy with a TLS listener on a port of its own; returns it with the TLS address.
fn tls_proxy(
    origin: std::net::SocketAddr,
    certs: &[(std::path::PathBuf, std::path::PathBuf)],
    probe: bool,
) -> (Proxy, std::net::SocketAddr) {
    tls_proxy_opts(origin, certs, probe, "")
}

/// [`tls_proxy`] with `extra` added to the `tls:` section (indented two spaces).
fn tls_proxy_with(
    origin: std::net::SocketAddr,
    certs: &[(std::path::PathBuf, std::path::PathBuf)],
    extra: &str,
) -> (Proxy, std::net::SocketAddr) {
    tls_proxy_opts(origin, certs, false, extra)
}

fn tls_proxy_opts(
    origin: std::net::SocketAddr,
    certs: &[(std::path::PathBuf, std::path::PathBuf)],
    probe: bool,
    extra: &str,
) -> (Proxy, std::net::SocketAddr) {
    let tport = free_port();
    let proxy = Proxy::start(
        origin,
        Opts {
            probe,
            // These tests hold the user-space path, so it is chosen on any kernel (tls_ktls.rs
            // holds the kernel's).
            extra_yaml: format!("{}  ktls: off\n{extra}", listener_yaml(tport, certs)),
            ..Opts::default()
        },
    );
    let addr = format!("127.0.0.1:{tport}").parse().expect("addr");
    (proxy, addr)
}

#[test]
fn a_tls_hit_is_encrypted_in_user_space_and_the_kernel_agrees() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let c = cert(&["test.example"]);
    let files = write(dir.path(), "a", &c);
    let (origin, _rt) = origin();
    let (proxy, taddr) = tls_proxy(origin.addr(), &[files], true);
    assert_eq!(proxy.api("/api/stats")["probe"]["state"], "attached");
    let mut client = TlsClient::connect(taddr, "test.example", client_config(Some(&c)));
    let miss = client.get("/obj/200000", &[]);
    assert_eq!((miss.status, miss.header("x-cache")), (200, Some("MISS")));
    assert!(miss.body == body(200_000));
    let hit = client.get("/obj/200000", &[]);
    assert_eq!((hit.status, hit.header("x-cache")), (200, Some("HIT")));
    assert!(hit.body == body(200_000));
    let local = client.local_addr().to_string();
    drop(client);

    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    let k = &conn["kernel"];
    // Not one byte by sendfile; every body byte (and the TLS records around it) by writes.
    assert_eq!(u(&k["zerocopy_bytes"]), 0, "{conn}");
    assert!(u(&k["copy_bytes"]) > 400_000, "{conn}");
    let by_kind = &k["counts"]["by_kind"];
    assert_eq!(u(&by_kind[0]["calls"]), 0, "sendfile calls: {by_kind}");
    assert_eq!(conn["verdict"], "copy (TLS in user space: tls.ktls is off)");
    assert_eq!(conn["tls_userspace"], true);
    assert_eq!(u(&conn["violations"]), 0);
    // Both bodies were read from the cache file (the miss behind its fill) and encrypted here.
    let m = proxy.metrics();
    assert_eq!(
        metric(
            &m,
            "zerocache_copied_body_bytes_total{reason=\"tls-userspace\"}"
        ),
        400_000
    );
    assert_eq!(
        metric(
            &m,
            "zerocache_copied_body_bytes_total{reason=\"debug-copy\"}"
        ),
        0
    );
    assert_eq!(
        metric(&m, "zerocache_tls_handshakes_total{result=\"ok\"}"),
        1
    );
    assert_eq!(metric(&m, "zerocache_zero_copy_violations_total"), 0);
    // The hero ratio leaves copies by design out: nothing was meant for sendfile, no ratio.
    let stats = proxy.api("/api/stats");
    assert_eq!(stats["body_zero_copy_ratio"], Value::Null, "{stats}");
    assert_eq!(u(&stats["copied_body_bytes"]["tls-userspace"]), 400_000);

    // The same URL to a plain client on the same proxy (its own entry: the scheme is in the
    // key): sendfile, as before, behind the fill and then from the entry.
    let mut plain = proxy.client();
    assert_eq!(plain.get("/obj/200000", &[]).x_cache(), "MISS");
    assert_eq!(plain.get("/obj/200000", &[]).x_cache(), "HIT");
    let local = plain.sock.local_addr().expect("local").to_string();
    drop(plain);
    let conn = closed_conn(&proxy, |c| c["peer"] == local.as_str());
    assert_eq!(u(&conn["kernel"]["zerocopy_bytes"]), 400_000, "{conn}");
    assert_eq!(conn["verdict"], "zero-copy");
    assert_eq!(proxy.api("/api/stats")["body_zero_copy_ratio"], 1.0);
}

#[test]
fn a_hit_over_tls_is_byte_exact_at_every_size_and_the_scheme_is_in_the_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = cert(&["test.example"]);
    let files = write(dir.path(), "a", &c);
    let (origin, _rt) = origin();
    let (proxy, taddr) = tls_proxy(origin.addr(), &[files], false);
    let mut client = TlsClient::connect(taddr, "test.example", client_config(Some(&c)));
    assert_eq!(client.tls.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    for size in [0usize, 1, 16_384, 16_385, 262_144, 262_145, 3_000_000] {
        let path = format!("/obj/{size}");
        let miss = client.get(&path, &[]);
        assert_eq!(miss.header("x-cache"), Some("MISS"), "{path}");
        assert!(miss.body == body(size), "{path}");
        let hit = client.get(&path, &[]);
        assert_eq!(hit.header("x-cache"), Some("HIT"), "{path}");
        assert!(hit.body == body(size), "{path}");
    }
    // A close says it is one: close_notify, so a client can tell it from a cut (rustls reads it
    // as a clean end of stream, and a bare FIN as an error).
    let last = client.get("/obj/10", &[("Connection", "close")]);
    assert_eq!(last.header("connection"), Some("close"));
    let mut rest = [0u8; 16];
    assert_eq!(
        std::io::Read::read(&mut client.tls, &mut rest).expect("clean close"),
        0
    );
    // The origin heard which listener each request came in on.
    let seen = origin.received();
    let last = seen
        .iter()
        .rev()
        .find(|r| r.path == "/obj/3000000")
        .expect("seen");
    assert_eq!(last.header("x-forwarded-proto"), Some("https"));
    assert_eq!(last.header("forwarded"), Some("for=127.0.0.1;proto=https"));
    // A plain client does not get what TLS clients stored: the scheme is in the key.
    let r = proxy.get("/obj/3000000");
    assert_eq!(r.x_cache(), "MISS");
    assert_eq!(origin.hits("/obj/3000000"), 2);
    let seen = origin.received();
    let last = seen
        .iter()
        .rev()
        .find(|r| r.path == "/obj/3000000")
        .expect("seen");
    assert_eq!(last.header("x-forwarded-proto"), Some("http"));
    // A client's own claim is never passed on.
    let mut c2 = proxy.client();
    c2.get("/obj/7", &[("X-Forwarded-Proto", "https")]);
    let seen = origin.received();
    let last = seen
        .iter()
        .rev()
        .find(|r| r.path == "/obj/7")
        .expect("seen");
    assert_eq!(last.header("x-forwarded-proto"), Some("http"));
}

#[test]
fn sni_chooses_the_certificate_from_its_sans_and_the_first_is_the_default() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = cert(&["a.example"]);
    let b = cert(&["b.example", "*.b.example"]);
    let fa = write(dir.path(), "a", &a);
    let fb = write(dir.path(), "b", &b);
    let (origin, _rt) = origin();
    let (_proxy, taddr) = tls_proxy(origin.addr(), &[fa, fb], false);
    let any = client_config(None);
    let got = |sni: &str| TlsClient::connect(taddr, sni, any.clone()).peer_cert();
    assert!(got("b.example") == b.der);
    assert!(got("www.b.example") == b.der);
    assert!(got("a.example") == a.der);
    assert!(got("unknown.example") == a.der, "unknown name: the first");
    assert!(got("127.0.0.1") == a.der, "no SNI: the first");
    // And a verifying client accepts what it was given for its name.
    let mut v = TlsClient::connect(taddr, "b.example", client_config(Some(&b)));
    assert_eq!(v.get_host("b.example", "/obj/10").status, 200);
}

/// tls.strict_sni (on by default): a connection made by SNI for one site and asked for a host its
/// certificate does not name is answered 421 Misdirected Request, never served or forwarded;
/// names its certificate covers (a wildcard's too, the Host's port aside) are served; off, the
/// host is served as before.
#[test]
fn a_host_the_served_certificate_does_not_name_is_421_misdirected() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = cert(&["a.example"]);
    let b = cert(&["b.example", "*.b.example"]);
    let fa = write(dir.path(), "a", &a);
    let fb = write(dir.path(), "b", &b);
    let (origin, _rt) = origin();
    let (_proxy, taddr) = tls_proxy(origin.addr(), &[fa.clone(), fb.clone()], false);
    let mut c = TlsClient::connect(taddr, "a.example", client_config(Some(&a)));
    for (host, want) in [
        ("a.example", 200),
        ("b.example", 421),
        ("A.EXAMPLE:8443", 200),
        ("www.b.example", 421),
        ("a.example", 200),
    ] {
        let r = c.get_host(host, "/obj/10");
        assert_eq!(r.status, want, "{host}");
    }
    let mut w = TlsClient::connect(taddr, "www.b.example", client_config(Some(&b)));
    assert_eq!(w.get_host("x.b.example", "/obj/10").status, 200);
    assert_eq!(w.get_host("a.example", "/obj/10").status, 421);
    // a.example, a.example:8443 and x.b.example are three keys; no 421 reached the origin.
    assert_eq!(
        origin.hits("/obj/10"),
        3,
        "only served hosts reached the origin"
    );
    drop(_proxy);
    let (proxy, taddr) = tls_proxy_with(origin.addr(), &[fa, fb], "  strict_sni: false\n");
    let mut off = TlsClient::connect(taddr, "a.example", client_config(Some(&a)));
    assert_eq!(off.get_host("b.example", "/obj/10").status, 200);
    drop(proxy);
}

#[test]
fn sighup_reloads_the_certificates_and_a_bad_file_keeps_the_running_ones() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = cert(&["test.example"]);
    let b = cert(&["test.example"]);
    let files = write(dir.path(), "site", &a);
    let (origin, _rt) = origin();
    let (proxy, taddr) = tls_proxy(origin.addr(), &[files], false);
    let any = client_config(None);
    let served = || TlsClient::connect(taddr, "test.example", any.clone()).peer_cert();
    assert!(served() == a.der);
    let hup = || {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(proxy.child.id() as i32, libc::SIGHUP) };
    };
    // Replace both files, HUP: new handshakes get B.
    write(dir.path(), "site", &b);
    hup();
    assert_eventually_eq(
        "cert B after reload",
        Duration::from_secs(10),
        || served() == b.der,
        true,
    );
    assert_eventually_eq(
        "accepted reloads",
        Duration::from_secs(5),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"accepted\"}",
            )
        },
        1,
    );
    // A broken certificate file: the reload is rejected and B is still served.
    std::fs::write(
        dir.path().join("site.crt"),
        "-----BEGIN CERTIFICATE-----\nnot base64!\n",
    )
    .expect("write");
    hup();
    assert_eventually_eq(
        "rejected reloads",
        Duration::from_secs(10),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"rejected\"}",
            )
        },
        1,
    );
    assert!(served() == b.der);
    // A key that belongs to another certificate is refused too.
    std::fs::write(dir.path().join("site.crt"), &a.pem).expect("write");
    hup();
    assert_eventually_eq(
        "rejected reloads",
        Duration::from_secs(10),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"rejected\"}",
            )
        },
        2,
    );
    assert!(served() == b.der);
}

#[test]
fn plain_http_on_the_tls_port_gets_a_plain_400_and_bad_handshakes_are_counted() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = cert(&["test.example"]);
    let files = write(dir.path(), "a", &c);
    let (origin, _rt) = origin();
    let (proxy, taddr) = tls_proxy(origin.addr(), &[files], false);
    // Every family complete from start-up, 0 until used.
    let m = proxy.metrics();
    for reason in ["miss", "tls-userspace", "debug-copy", "generated"] {
        assert_eq!(
            metric(
                &m,
                &format!("zerocache_copied_body_bytes_total{{reason=\"{reason}\"}}")
            ),
            0
        );
    }
    for result in ["ok", "failed", "timeout", "no_cert"] {
        assert_eq!(
            metric(
                &m,
                &format!("zerocache_tls_handshakes_total{{result=\"{result}\"}}")
            ),
            0
        );
    }
    // This kernel has no kTLS (no CONFIG_TLS); a kernel with the tls ULP reports 1.
    let ulp = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").unwrap_or_default();
    if ulp.split_whitespace().any(|u| u == "tls") {
        assert_eq!(metric(&m, "zerocache_ktls_available"), 1);
    }

    // Plain HTTP: answered in plain HTTP, saying what happened.
    let mut plain = Client::connect(taddr);
    plain.send(b"GET /obj/10 HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let r = plain.read_response(false);
    assert_eq!(r.status, 400);
    assert_eq!(r.body, b"A plain HTTP request was sent to the TLS port.\n");
    assert!(plain.is_closed());
    // Recorded as a connection that served nothing (so the probe's close event for its fd
    // joins it, and not the next connection that reuses the fd number).
    let local = plain.sock.local_addr().expect("local").to_string();
    let conns = proxy.api("/api/connections?limit=1000");
    let rec = conns["closed"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["peer"] == local.as_str()))
        .unwrap_or_else(|| panic!("no record of {local}: {conns}"))
        .clone();
    assert_eq!(
        (u(&rec["requests"]), &rec["tls_userspace"]),
        (0, &Value::Bool(true))
    );
    // Garbage that is not HTTP either: rustls's alert, and the connection closed.
    use std::io::{Read, Write};
    let mut junk = std::net::TcpStream::connect(taddr).expect("connect");
    junk.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // A ClientHello record whose hello is empty: rustls answers decode_error.
    junk.write_all(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00])
        .expect("send");
    let mut got = Vec::new();
    let _ = junk.read_to_end(&mut got);
    assert_eq!(
        got,
        [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32],
        "a fatal decode_error alert"
    );
    assert_eventually_eq(
        "failed handshakes",
        Duration::from_secs(5),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_tls_handshakes_total{result=\"failed\"}",
            )
        },
        2,
    );
    // The listener still serves.
    let mut ok = TlsClient::connect(taddr, "test.example", client_config(Some(&c)));
    assert_eq!(ok.get("/obj/10", &[]).status, 200);
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_tls_handshakes_total{result=\"ok\"}"
        ),
        1
    );
}

#[test]
fn a_client_that_never_finishes_its_handshake_is_timed_out() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = cert(&["test.example"]);
    let (cf, kf) = write(dir.path(), "a", &c);
    let (origin, _rt) = origin();
    let tport = free_port();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!(
                "{}  handshake_timeout: 300ms\n",
                listener_yaml(tport, &[(cf, kf)])
            ),
            ..Opts::default()
        },
    );
    use std::io::Read;
    let mut idle = std::net::TcpStream::connect(("127.0.0.1", tport)).expect("connect");
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let started = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(idle.read(&mut buf).expect("closed, not reset"), 0);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_tls_handshakes_total{result=\"timeout\"}"
        ),
        1
    );
}

#[test]
fn check_names_a_missing_or_unreadable_certificate_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = cert(&["test.example"]);
    let (cf, _) = write(dir.path(), "a", &c);
    let missing = dir.path().join("nope.key");
    let config = dir.path().join("zc.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:1\ncache:\n  path: {}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"127.0.0.1:2\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\n{}",
            dir.path().join("cache").display(),
            listener_yaml(3, &[(cf, missing.clone())])
        ),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerocache"))
        .args(["check", "-c"])
        .arg(&config)
        .output()
        .expect("run check");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls.certificates[0].key"), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(err.contains("No such file"), "{err}");
}

#[test]
fn sessions_resume_on_every_worker_and_across_a_reload() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = cert(&["test.example"]);
    let files = write(dir.path(), "a", &c);
    let (origin, _rt) = origin();
    let (proxy, taddr) = tls_proxy(origin.addr(), &[files], false);
    // One client config: its session store keeps the tickets the proxy sends.
    let config = client_config(Some(&c));
    let kind = |config: &std::sync::Arc<rustls::ClientConfig>| {
        let mut t = TlsClient::connect(taddr, "test.example", config.clone());
        // TLS 1.3 tickets arrive after the handshake: read a response so they are taken in.
        assert_eq!(t.get("/obj/10", &[]).status, 200);
        t.tls.conn.handshake_kind()
    };
    assert_eq!(kind(&config), Some(rustls::HandshakeKind::Full));
    // Connections go to whichever worker is least loaded: every one of them resumes.
    for _ in 0..6 {
        assert_eq!(kind(&config), Some(rustls::HandshakeKind::Resumed));
    }
    // SIGHUP: the ticket key is the process's, kept across reloads.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, libc::SIGHUP) };
    assert_eventually_eq(
        "accepted reloads",
        Duration::from_secs(10),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"accepted\"}",
            )
        },
        1,
    );
    assert_eq!(kind(&config), Some(rustls::HandshakeKind::Resumed));
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_tls_handshakes_total{result=\"ok\"}"
        ),
        8
    );
    // 0-RTT is off: a client that would send early data gets tickets that allow none.
    let mut eager = (*client_config(Some(&c))).clone();
    eager.enable_early_data = true;
    let eager = std::sync::Arc::new(eager);
    assert_eq!(kind(&eager), Some(rustls::HandshakeKind::Full));
    let name = rustls::pki_types::ServerName::try_from("test.example").expect("name");
    let mut next = rustls::ClientConnection::new(eager.clone(), name).expect("client");
    assert!(next.early_data().is_none(), "a ticket offered 0-RTT");
    assert_eq!(kind(&eager), Some(rustls::HandshakeKind::Resumed));
}

#[test]
fn a_client_no_certificate_can_sign_for_is_counted_as_no_cert() {
    let dir = tempfile::tempdir().expect("tmp");
    let files = write(dir.path(), "a", &cert(&["test.example"]));
    let (origin, _rt) = origin();
    let (proxy, taddr) = tls_proxy(origin.addr(), &[files], false);
    // The only certificate is ECDSA; this client verifies only RSA signatures.
    let sock = std::net::TcpStream::connect(taddr).expect("connect");
    let name = rustls::pki_types::ServerName::try_from("test.example").expect("name");
    let conn = rustls::ClientConnection::new(rsa_only_client_config(), name).expect("client");
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut failed = false;
    while tls.conn.is_handshaking() {
        if tls.conn.complete_io(&mut tls.sock).is_err() {
            failed = true;
            break;
        }
    }
    assert!(
        failed,
        "the handshake completed without a usable certificate"
    );
    assert_eventually_eq(
        "no_cert handshakes",
        Duration::from_secs(5),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_tls_handshakes_total{result=\"no_cert\"}",
            )
        },
        1,
    );
}

#[test]
fn every_copied_body_byte_is_counted_under_its_reason() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            debug_yaml: "  copy_hits: true\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    // The planted bug: the miss read behind its fill and the hit, both by read+write.
    assert_eq!(c.get("/obj/1000", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/obj/1000", &[]).x_cache(), "HIT");
    // Not stored: relayed from the origin as it arrives.
    let r = c.get("/obj/3000", &[("Cache-Control", "no-store")]);
    assert_eq!(r.body.len(), 3000);
    // The proxy's own answer.
    let r = c.request("TRACE", "/x", &[]);
    assert_eq!(r.status, 405);
    let generated = r.body.len() as u64;
    // The 405 is recorded just after its last byte is sent: wait for it before reading the rest.
    assert_eventually_eq(
        "generated bytes",
        Duration::from_secs(5),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_copied_body_bytes_total{reason=\"generated\"}",
            )
        },
        generated,
    );
    let m = proxy.metrics();
    let reason = |r: &str| {
        metric(
            &m,
            &format!("zerocache_copied_body_bytes_total{{reason=\"{r}\"}}"),
        )
    };
    assert_eq!(reason("debug-copy"), 2000);
    assert_eq!(reason("miss"), 3000);
    assert_eq!(reason("generated"), generated);
    assert_eq!(reason("tls-userspace"), 0);
}

/// `zerocache_tls_certificate_expiry_timestamp_seconds{name,file}`: each served certificate's
/// `notAfter`, by its first DNS name and its file, from start-up; a reload that loads new files
/// says their dates, one that is refused keeps the running ones'.
#[test]
fn every_served_certificates_expiry_is_a_gauge_and_a_reload_updates_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = write(
        dir.path(),
        "a",
        &cert_until(&["a.example", "www.a.example"], (2031, 1, 2)),
    );
    let b = write(dir.path(), "b", &cert_until(&["b.example"], (2032, 3, 4)));
    let (origin, _rt) = origin();
    let (proxy, _) = tls_proxy(origin.addr(), &[a.clone(), b.clone()], false);
    let expiry = |name: &str, file: &std::path::Path| {
        format!(
            "zerocache_tls_certificate_expiry_timestamp_seconds{{file=\"{}\",name=\"{name}\"}}",
            file.display()
        )
    };
    let m = proxy.metrics();
    assert_eq!(metric(&m, &expiry("a.example", &a.0)), 1_925_078_400);
    assert_eq!(metric(&m, &expiry("b.example", &b.0)), 1_961_971_200);
    // Renewed: the same files, a later date, after SIGHUP.
    write(dir.path(), "b", &cert_until(&["b.example"], (2033, 5, 6)));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, libc::SIGHUP) };
    assert_eventually_eq(
        "the renewed certificate's date",
        Duration::from_secs(10),
        || metric(&proxy.metrics(), &expiry("b.example", &b.0)),
        1_998_950_400,
    );
    assert_eq!(
        metric(&proxy.metrics(), &expiry("a.example", &a.0)),
        1_925_078_400
    );
}

/// `tls.ticket_keys` (nginx's 80-byte `ssl_session_ticket_key` files): two processes with the
/// same file resume each other's sessions, as a fleet behind one name and the two sides of an
/// upgrade must; a process with another key makes a full handshake; a file that is no key is
/// refused by `zerocache check` with its key path.
#[test]
fn two_processes_with_the_same_ticket_keys_resume_each_others_sessions() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = cert(&["test.example"]);
    let files = write(dir.path(), "site", &c);
    let (shared, other, bad) = (
        dir.path().join("shared.key"),
        dir.path().join("other.key"),
        dir.path().join("bad.key"),
    );
    std::fs::write(&shared, [42u8; 80]).expect("key");
    std::fs::write(&other, [7u8; 48]).expect("key");
    std::fs::write(&bad, [1u8; 64]).expect("key");
    let (origin, _rt) = origin();
    let with = |key: &std::path::Path| {
        tls_proxy_with(
            origin.addr(),
            std::slice::from_ref(&files),
            &format!("  ticket_keys: [{}]\n", key.display()),
        )
    };
    let (_a, a) = with(&shared);
    let (_b, b) = with(&shared);
    let (elsewhere, c_addr) = with(&other);
    let config = client_config(Some(&c));
    let kind = |addr: std::net::SocketAddr| {
        let mut t = TlsClient::connect(addr, "test.example", config.clone());
        // TLS 1.3 tickets arrive after the handshake: read a response so they are taken in.
        assert_eq!(t.get("/obj/10", &[]).status, 200);
        t.tls.conn.handshake_kind()
    };
    assert_eq!(kind(a), Some(rustls::HandshakeKind::Full));
    assert_eq!(
        kind(b),
        Some(rustls::HandshakeKind::Resumed),
        "b opens a's ticket"
    );
    assert_eq!(
        kind(a),
        Some(rustls::HandshakeKind::Resumed),
        "and a opens b's"
    );
    assert_eq!(
        kind(c_addr),
        Some(rustls::HandshakeKind::Full),
        "another key"
    );
    let text = std::fs::read_to_string(&elsewhere.config).expect("config");
    std::fs::write(
        &elsewhere.config,
        text.replace(&other.display().to_string(), &bad.display().to_string()),
    )
    .expect("rewrite");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerocache"))
        .args(["check", "-q", "-c"])
        .arg(&elsewhere.config)
        .output()
        .expect("check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tls.ticket_keys[0]")
            && err.contains("64 bytes: a ticket key file has 80 (or 48) random bytes"),
        "{err}"
    );
}

/// `tls.certificates[].ocsp`: a fresh response for the certificate is stapled in the handshake;
/// after the file is replaced by a stale one and reloaded, none is (a client would reject it).
#[test]
fn a_fresh_ocsp_response_is_stapled_and_a_stale_one_is_not() {
    let dir = tempfile::tempdir().expect("tmp");
    let serial = [0x12, 0x34, 0x56];
    let (crt, key) = write(
        dir.path(),
        "site",
        &cert_with_serial(&["test.example"], &serial),
    );
    let ocsp = dir.path().join("site.ocsp");
    let fresh = ocsp_response(&serial, "20260101000000Z", "20991231000000Z");
    std::fs::write(&ocsp, &fresh).expect("ocsp");
    let (origin, _rt) = origin();
    let tport = free_port();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: format!(
                "tls:\n  listen: 127.0.0.1:{tport}\n  certificates:\n    - {{ cert: {}, key: {}, ocsp: {} }}\n  ktls: off\n",
                crt.display(),
                key.display(),
                ocsp.display()
            ),
            ..Opts::default()
        },
    );
    let taddr: std::net::SocketAddr = format!("127.0.0.1:{tport}").parse().expect("addr");
    let (config, seen) = client_config_seeing_ocsp();
    let stapled = || {
        let mut t = TlsClient::connect(taddr, "test.example", config.clone());
        assert_eq!(t.get("/obj/10", &[]).status, 200);
        seen.lock()
            .expect("seen")
            .last()
            .cloned()
            .expect("a handshake")
    };
    assert_eq!(stapled(), fresh);
    // Its nextUpdate passed: not stapled after the reload that reads it.
    std::fs::write(
        &ocsp,
        ocsp_response(&serial, "20260101000000Z", "20260102000000Z"),
    )
    .expect("ocsp");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, libc::SIGHUP) };
    assert_eventually_eq(
        "accepted reloads",
        Duration::from_secs(10),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"accepted\"}",
            )
        },
        1,
    );
    assert_eq!(stapled(), Vec::<u8>::new());
}
