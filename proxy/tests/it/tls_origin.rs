//! HTTPS origins end to end: the real binary fetching from a real rustls origin (certificates
//! made here by rcgen, the origin's pinned with `tls.ca`). Upstream TLS costs hits nothing: a
//! plain client's hit is still sendfile, and (as root) the probe says so.

use crate::support::*;
use crate::tls_support::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A proxy in `dir` whose one upstream is `server` with `tls` (a YAML flow map).
fn proxy_for(dir: &std::path::Path, server: &str, tls: &str, probe: bool) -> Proxy {
    std::fs::create_dir_all(dir).expect("dir");
    Proxy::from_yaml(
        &format!(
            "listen: 127.0.0.1:{{port}}\ncache:\n  path: {cache}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"{server}\"]\n    tls: {tls}\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{{dport}}\nprobe:\n  enabled: {probe}\n",
            cache = dir.join("cache").display(),
        ),
        dir,
    )
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The origin's certificate for `names`, written to `dir/origin.crt` (the pinned `tls.ca`).
fn pinned(dir: &std::path::Path, names: &[&str]) -> (Cert, String) {
    let c = cert(names);
    let (crt, _) = write(dir, "origin", &c);
    let tls = format!("{{ ca: {} }}", crt.display());
    (c, tls)
}

#[test]
fn an_https_origin_fills_and_a_plain_client_hits_with_sendfile() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    let (c, tls) = pinned(dir.path(), &["localhost"]);
    let front = TlsFront::start(origin.addr(), &c);
    let proxy = proxy_for(
        dir.path(),
        &format!("https://localhost:{}", front.addr.port()),
        &tls,
        true,
    );
    assert_eq!(proxy.api("/api/stats")["probe"]["state"], "attached");
    let mut client = proxy.client();
    let miss = client.get("/obj/300000", &[]);
    assert_eq!((miss.status, miss.x_cache()), (200, "MISS"));
    assert!(miss.body == body(300_000));
    let hit = client.get("/obj/300000", &[]);
    assert_eq!((hit.status, hit.x_cache()), (200, "HIT"));
    assert!(hit.body == body(300_000));
    let heads = (miss.head_len + hit.head_len) as u64;
    let local = client.sock.local_addr().expect("local").to_string();
    drop(client);
    // The origin was reached over TLS, with the host name as SNI.
    assert_eq!(front.connections(), 1);
    assert_eq!(
        front.snis.lock().expect("lock").as_slice(),
        [Some("localhost".to_string())]
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let conn = loop {
        let conns = proxy.api("/api/connections?limit=1000");
        if let Some(c) = conns["closed"].as_array().and_then(|a| {
            a.iter()
                .find(|c| !c["kernel"].is_null() && c["peer"] == local.as_str())
        }) {
            break c.clone();
        }
        assert!(Instant::now() < deadline, "not joined: {conns}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Both bodies by sendfile (the miss read behind its fill), only the heads copied.
    assert_eq!(u(&conn["kernel"]["zerocopy_bytes"]), 600_000, "{conn}");
    assert_eq!(u(&conn["kernel"]["copy_bytes"]), heads, "{conn}");
    assert_eq!(conn["verdict"], "zero-copy");
    let m = proxy.metrics();
    assert_eq!(
        metric(
            &m,
            "zerocache_copied_body_bytes_total{reason=\"tls-userspace\"}"
        ),
        0
    );
    assert_eq!(
        metric(&m, "zerocache_copied_body_bytes_total{reason=\"miss\"}"),
        0
    );
}

#[test]
fn pooled_tls_connections_are_reused_and_an_ip_literal_sends_no_sni() {
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    // An IP literal: no SNI (RFC 6066 §3), verified against the certificate's IP SAN.
    let (c, tls) = pinned(dir.path(), &["127.0.0.1"]);
    let front = TlsFront::start(origin.addr(), &c);
    let proxy = proxy_for(dir.path(), &format!("https://{}", front.addr), &tls, false);
    let mut client = proxy.client();
    for i in 0..5 {
        let r = client.get(&format!("/obj/{}", 1000 + i), &[]);
        assert_eq!((r.status, r.x_cache()), (200, "MISS"));
        assert!(r.body == body(1000 + i));
        // Not stored: relayed through user space as it arrives, over the same TLS connection.
        let r = client.get(
            &format!("/obj/{}", 2000 + i),
            &[("Cache-Control", "no-store")],
        );
        assert_eq!(r.status, 200);
        assert!(r.body == body(2000 + i));
    }
    assert_eq!(
        front.connections(),
        1,
        "one pooled TLS connection for ten fetches"
    );
    assert_eq!(front.snis.lock().expect("lock").as_slice(), [None]);
    // A response is recorded just after its last byte is sent: the client can be quicker.
    let relayed: u64 = (0..5).map(|i| 2000 + i).sum();
    assert_eventually_eq(
        "relayed miss bytes",
        Duration::from_secs(5),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_copied_body_bytes_total{reason=\"miss\"}",
            )
        },
        relayed,
    );
}

#[test]
fn a_certificate_that_does_not_verify_is_a_502_with_detail_tls_verify() {
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    for (why, presented, ca) in [
        // The pinned certificate is for another name.
        ("wrong name", cert(&["other.example"]), None),
        // Expired.
        ("expired", expired_cert(&["localhost"]), None),
        // Signed by nobody the proxy trusts: the system roots do not know it.
        ("unknown issuer", cert(&["localhost"]), Some("")),
    ] {
        let front = TlsFront::start(origin.addr(), &presented);
        let tls = match ca {
            Some(_) => "{}".to_string(),
            None => {
                let (crt, _) = write(dir.path(), "origin", &presented);
                format!("{{ ca: {} }}", crt.display())
            }
        };
        let sub = dir.path().join(why.replace(' ', "-"));
        let proxy = proxy_for(
            &sub,
            &format!("https://localhost:{}", front.addr.port()),
            &tls,
            false,
        );
        let r = proxy.get("/obj/100");
        assert_eq!(r.status, 502, "{why}");
        assert_eq!(r.x_cache(), "ERROR", "{why}");
        assert_eq!(
            r.header("cache-status"),
            Some("zerocache; fwd=miss; detail=tls-verify"),
            "{why}"
        );
        assert_eq!(
            front.connections(),
            0,
            "{why}: no request reached the origin"
        );
        assert_eq!(
            metric(
                &proxy.metrics(),
                "zerocache_upstream_errors_total{kind=\"tls\",upstream=\"origin\"}"
            ),
            1,
            "{why}"
        );
    }
    assert_eq!(origin.request_count(), 0);
}

/// A self-signed certificate made the usual way, by `openssl req -x509` (which marks it
/// `CA:TRUE`), with the SAN entries `san`, valid for 30 days.
fn openssl_cert(dir: &std::path::Path, san: &str) -> Cert {
    let (key, crt) = (dir.join("ossl.key"), dir.join("ossl.crt"));
    let out = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            &format!("subjectAltName={san}"),
        ])
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let der = std::process::Command::new("openssl")
        .args(["x509", "-outform", "DER", "-in"])
        .arg(&crt)
        .output()
        .expect("openssl x509");
    let text = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&crt)
        .output()
        .expect("openssl x509 -text");
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("CA:TRUE"),
        "openssl req -x509 makes a CA certificate"
    );
    Cert {
        pem: std::fs::read_to_string(&crt).expect("crt"),
        key_pem: std::fs::read_to_string(&key).expect("key"),
        der: der.stdout,
    }
}

/// `openssl req -x509` makes a `CA:TRUE` certificate, which rustls refuses as an end entity; pinned
/// in `tls.ca` it is trusted as itself (curl's `--cacert` and nginx accept it too), while its name
/// is still checked: the same kind of certificate for another name is 502. (Its dates are too:
/// the expired pinned certificate of the test above takes the same path.)
#[test]
fn a_pinned_openssl_self_signed_ca_certificate_is_accepted_and_still_name_checked() {
    if !require::command("openssl") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    for (why, san, want) in [
        ("pinned", "DNS:localhost,IP:127.0.0.1", 200),
        ("other name", "DNS:other.example", 502),
    ] {
        let sub = dir.path().join(why.replace(' ', "-"));
        std::fs::create_dir_all(&sub).expect("dir");
        let c = openssl_cert(&sub, san);
        let (crt, _) = write(&sub, "origin", &c);
        let front = TlsFront::start(origin.addr(), &c);
        let proxy = proxy_for(
            &sub,
            &format!("https://localhost:{}", front.addr.port()),
            &format!("{{ ca: {} }}", crt.display()),
            false,
        );
        let r = proxy.get("/obj/1000");
        assert_eq!(r.status, want, "{why}: {:?}", r.headers);
        if want == 200 {
            assert!(r.body == body(1000));
            // check says which kind of trust the upstream uses.
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerocache"))
                .args(["check", "-c"])
                .arg(&proxy.config)
                .output()
                .expect("check");
            let text = String::from_utf8_lossy(&out.stdout);
            let want_line = format!(
                "#   upstreams.origin: pinned: 1 certificate(s) in {}, trusted as issuers and as themselves",
                crt.display()
            );
            assert!(text.lines().any(|l| l == want_line), "{text}");
        } else {
            assert_eq!(
                r.header("cache-status"),
                Some("zerocache; fwd=miss; detail=tls-verify"),
                "{why}"
            );
        }
    }
}

#[test]
fn verify_false_accepts_any_certificate_and_check_warns() {
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    let front = TlsFront::start(origin.addr(), &cert(&["whatever.example"]));
    let proxy = proxy_for(
        dir.path(),
        &format!("https://localhost:{}", front.addr.port()),
        "{ verify: false }",
        false,
    );
    let r = proxy.get("/obj/100");
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert!(r.body == body(100));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerocache"))
        .args(["check", "-q", "-c"])
        .arg(&proxy.config)
        .output()
        .expect("check");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("upstreams.origin.tls.verify is false"),
        "{err}"
    );
}

#[test]
fn check_names_a_bad_ca_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not a certificate\n").expect("write");
    let config = dir.path().join("zc.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:1\ncache:\n  path: {}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"https://o.example:443\"]\n    tls: {{ ca: {} }}\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\n",
            dir.path().join("cache").display(),
            ca.display()
        ),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerocache"))
        .args(["check", "-c"])
        .arg(&config)
        .output()
        .expect("check");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&ca.display().to_string()), "{err}");
    assert!(err.contains("no PEM certificate"), "{err}");
}

#[test]
fn the_health_check_of_an_https_server_speaks_tls() {
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    origin.script("/health", Reply::ok(b"ok".to_vec()));
    let (c, tls) = pinned(dir.path(), &["localhost"]);
    let front = TlsFront::start(origin.addr(), &c);
    let _proxy = proxy_for(
        dir.path(),
        &format!("https://localhost:{}", front.addr.port()),
        &format!("{tls}\n    health_check: {{ path: /health, interval: 100ms, timeout: 2s }}"),
        false,
    );
    assert_eventually_eq(
        "health checks over TLS",
        Duration::from_secs(10),
        || {
            origin
                .received()
                .iter()
                .filter(|r| {
                    r.path == "/health" && r.header("user-agent") == Some("zerocache-health-check")
                })
                .count()
                >= 2
        },
        true,
    );
    // Each check is its own TLS connection (Connection: close), each with the host as SNI.
    assert!(front.connections() >= 2);
    assert!(
        front
            .snis
            .lock()
            .expect("lock")
            .iter()
            .all(|s| s.as_deref() == Some("localhost"))
    );
}

#[test]
fn a_client_certificate_is_presented_when_the_origin_asks_for_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    let (c, _) = pinned(dir.path(), &["localhost"]);
    let client = cert(&["zerocache.client"]);
    let (ccrt, ckey) = write(dir.path(), "client", &client);
    let front = TlsFront::start_with(origin.addr(), &c, Some(&client));
    let server = format!("https://localhost:{}", front.addr.port());
    let ca = dir.path().join("origin.crt");
    let with = proxy_for(
        &dir.path().join("with"),
        &server,
        &format!(
            "{{ ca: {}, cert: {}, key: {} }}",
            ca.display(),
            ccrt.display(),
            ckey.display()
        ),
        false,
    );
    let r = with.get("/obj/100");
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert!(r.body == body(100));
    // Without it the origin refuses the handshake: a 502, but not a verification failure.
    let without = proxy_for(
        &dir.path().join("without"),
        &server,
        &format!("{{ ca: {} }}", ca.display()),
        false,
    );
    let r = without.get("/obj/101");
    assert_eq!(r.status, 502);
    assert_eq!(r.header("cache-status"), None);
    assert_eq!(origin.hits("/obj/101"), 0);
}

#[test]
fn a_close_delimited_body_is_whole_only_with_close_notify() {
    let dir = tempfile::tempdir().expect("tmp");
    let (origin, _rt) = origin();
    origin.script("/close", Reply::ok(body(50_000)).framing(Framing::Close));
    let (c, tls) = pinned(dir.path(), &["localhost"]);
    // Ended with close_notify: whole, stored, then a hit.
    let clean = TlsFront::start(origin.addr(), &c);
    let proxy = proxy_for(
        &dir.path().join("clean"),
        &format!("https://localhost:{}", clean.addr.port()),
        &tls,
        false,
    );
    let r = proxy.get("/close");
    assert_eq!((r.status, r.x_cache()), (200, "MISS"));
    assert!(r.body == body(50_000));
    assert_eq!(proxy.get("/close").x_cache(), "HIT");
    // Ended with a bare FIN: a cut. The client's response is aborted, nothing is stored.
    let cut = TlsFront::start_abrupt(origin.addr(), &c);
    let proxy = proxy_for(
        &dir.path().join("cut"),
        &format!("https://localhost:{}", cut.addr.port()),
        &tls,
        false,
    );
    let mut client = proxy.client();
    client.send(b"GET /close HTTP/1.1\r\nHost: test.example\r\n\r\n");
    // The client gets the head and what arrived, then a reset: never the chunked end.
    let mut raw = Vec::new();
    let ended = std::io::Read::read_to_end(&mut client.sock, &mut raw);
    assert!(
        raw.starts_with(b"HTTP/1.1 200 "),
        "{:?}",
        String::from_utf8_lossy(&raw[..raw.len().min(200)])
    );
    assert!(
        !raw.ends_with(b"0\r\n\r\n"),
        "a cut body was delivered as whole"
    );
    assert!(ended.is_err(), "the cut was closed like a whole response");
    // Not stored: only-if-cached finds nothing.
    let again = proxy
        .client()
        .get("/close", &[("Cache-Control", "only-if-cached")]);
    assert_eq!(again.status, 504, "the cut response was stored");
}
