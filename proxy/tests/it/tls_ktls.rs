//! kTLS: the keys of a completed handshake go to the kernel, and TLS hits leave with sendfile
//! exactly like plain ones, which the probe sees per connection. These machines' kernel has no
//! kTLS, so here the tests hold the fallback (user space, the reason shown) and print why the
//! kernel's half did not run; `cargo xtask vm-test` runs them on Debian's 6.1 and 6.12 kernels
//! after `modprobe tls`, where every one of them runs.

use crate::support::*;
use crate::tls_support::*;
use std::io::Write;

/// Whether the kernel lists the `tls` ULP (loaded).
fn kernel_has_ktls() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .unwrap_or_default()
        .split_whitespace()
        .any(|m| m == "tls")
}

/// For tests of the kernel's half: prints why they do not run on a kernel without kTLS. Not a
/// privilege the machine lacks but a feature its kernel was built without, so never a failure.
fn needs_ktls(test: &str) -> bool {
    if kernel_has_ktls() {
        return true;
    }
    let _ = writeln!(
        std::io::stderr(),
        "skipped {test}: needs a kernel with kTLS (the tls ULP: modprobe tls; this kernel has none); cargo xtask vm-test runs it on 6.1 and 6.12"
    );
    false
}

struct Setup {
    proxy: Proxy,
    addr: std::net::SocketAddr,
    cert: Cert,
    _dir: tempfile::TempDir,
    _origin: (Origin, tokio::runtime::Runtime),
}

fn setup(probe: bool, extra: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tmp");
    let cert = cert(&["test.example"]);
    let files = write(dir.path(), "a", &cert);
    let origin = origin();
    let tport = free_port();
    let proxy = Proxy::start(
        origin.0.addr(),
        Opts {
            probe,
            extra_yaml: format!("{}{extra}", listener_yaml(tport, &[files])),
            ..Opts::default()
        },
    );
    Setup {
        proxy,
        addr: format!("127.0.0.1:{tport}").parse().expect("addr"),
        cert,
        _dir: dir,
        _origin: origin,
    }
}

impl Setup {
    fn client(&self) -> TlsClient {
        TlsClient::connect(self.addr, "test.example", client_config(Some(&self.cert)))
    }
}

fn connections(m: &str, ktls: &str, reason: &str) -> u64 {
    metric(
        m,
        &format!("zerocache_tls_connections_total{{ktls=\"{ktls}\",reason=\"{reason}\"}}"),
    )
}

#[test]
fn the_metric_says_what_the_kernel_offers() {
    let s = setup(false, "");
    let m = s.proxy.metrics();
    let reported = metric(&m, "zerocache_ktls_available");
    // Read after start-up: as root, with CONFIG_TLS=m, the detection itself may have loaded the
    // module, and the kernel lists the ULP from then on. Without CONFIG_TLS (this project's
    // kernels) both say no.
    assert_eq!(reported == 1, kernel_has_ktls(), "{m}");
    let stats = s.proxy.api("/api/stats");
    assert_eq!(stats["tls"]["ktls_available"], reported == 1);
    assert_eq!(stats["tls"]["listener"], true);
    // One connection, counted by who encrypts it.
    let mut c = s.client();
    assert_eq!(c.get("/obj/1000", &[]).body, body(1000));
    drop(c);
    let m = s.proxy.metrics();
    let (ktls, none) = if kernel_has_ktls() { (1, 0) } else { (0, 1) };
    assert_eq!(connections(&m, "txrx", "offloaded"), ktls, "{m}");
    assert_eq!(connections(&m, "none", "kernel-has-no-ktls"), none, "{m}");
    for reason in ["ktls-off", "cipher-not-offloadable", "hand-over-failed"] {
        assert_eq!(connections(&m, "none", reason), 0, "{reason}: {m}");
    }
    assert_eq!(
        s.proxy.api("/api/stats")["tls"]["connections"]["offloaded"],
        ktls
    );
}

/// The fallback, on any kernel: without kTLS (this machine) a connection stays in user space
/// and says the kernel is why; with `ktls: off`, the config is why; `ktls: require` refuses to
/// start on a kernel without it, and `check` says so beforehand.
#[test]
fn without_ktls_a_connection_stays_in_user_space_and_says_why() {
    let (extra, reason, verdict) = if kernel_has_ktls() {
        (
            "  ktls: off\n",
            "ktls-off",
            "copy (TLS in user space: tls.ktls is off)",
        )
    } else {
        (
            "",
            "kernel-has-no-ktls",
            "copy (TLS in user space: kernel has no kTLS)",
        )
    };
    let s = setup(false, extra);
    let mut c = s.client();
    assert_eq!(c.get("/obj/5000", &[]).body, body(5000));
    let hit = c.get("/obj/5000", &[]);
    assert_eq!(hit.header("x-cache"), Some("HIT"));
    assert_eq!(hit.body, body(5000));
    let local = c.local_addr().to_string();
    drop(c);
    // The connection's record closes after its responses are accounted: wait for it, then read.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let rec = loop {
        let conns = s.proxy.api("/api/connections?limit=100");
        if let Some(r) = conns["closed"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["peer"] == local.as_str()))
        {
            break r.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no record of {local}: {conns}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let m = s.proxy.metrics();
    assert_eq!(connections(&m, "none", reason), 1, "{m}");
    assert_eq!(
        metric(
            &m,
            "zerocache_copied_body_bytes_total{reason=\"tls-userspace\"}"
        ),
        10_000
    );
    assert_eq!(rec["verdict"], verdict, "{rec}");
    assert_eq!(
        (&rec["ktls"], &rec["tls_userspace"]),
        (&false.into(), &true.into())
    );
    assert_eq!(rec["tls_userspace_reason"], reason);

    // `require`: check names the refusal, and start-up refuses, on a kernel without kTLS (the
    // proxy stopped first, so the refusal is not a taken port).
    if !kernel_has_ktls() {
        let Setup { proxy, _dir, .. } = s;
        let cfg = std::fs::read_to_string(&proxy.config).expect("config");
        drop(proxy);
        let req = _dir.path().join("require.yaml");
        std::fs::write(
            &req,
            cfg.replace("  certificates:", "  ktls: require\n  certificates:"),
        )
        .expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerocache"))
            .args(["check", "-c"])
            .arg(&req)
            .env("ZEROCACHE_TEST_CLOCK", "1")
            .output()
            .expect("check");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("# tls.ktls require: start-up will refuse: this kernel cannot take TLS keys (kernel-has-no-ktls;"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerocache"))
            .args(["run", "-c"])
            .arg(&req)
            .env("ZEROCACHE_TEST_CLOCK", "1")
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains(
                "tls.ktls is require, but this kernel cannot take TLS keys (kernel-has-no-ktls)"
            ),
            "{err}"
        );
    }
}

/// The bar: over one connection (TLS 1.3, the client's first choice), a 1 MiB miss and
/// three hits; every body byte left by sendfile (the miss behind its fill too), the kernel saw
/// nothing else written but heads, the handshake and the closing alert, and nothing was copied
/// by TLS in user space.
#[test]
fn a_miss_and_three_hits_over_ktls_go_out_by_sendfile() {
    if !needs_ktls("a_miss_and_three_hits_over_ktls_go_out_by_sendfile")
        || !require::root("loads the eBPF probe")
    {
        return;
    }
    let s = setup(true, "");
    assert_eq!(s.proxy.api("/api/stats")["probe"]["state"], "attached");
    let mut c = s.client();
    let statuses: Vec<String> = (0..4)
        .map(|_| {
            let r = c.get("/obj/1048576", &[]);
            assert_eq!(r.status, 200);
            assert!(r.body == body(1 << 20), "body differs");
            r.header("x-cache").unwrap_or("").to_string()
        })
        .collect();
    assert_eq!(statuses, ["MISS", "HIT", "HIT", "HIT"]);
    let local = c.local_addr().to_string();
    assert_eq!(
        c.tls
            .conn
            .negotiated_cipher_suite()
            .map(|s| s.version().version),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    drop(c);
    let conn = closed_conn(&s.proxy, |c| c["peer"] == local.as_str());
    assert_the_bar(&s, &conn);
}

/// What the bar asks of one connection that carried a 1 MiB miss and three hits over
/// kTLS, and of the proxy's figures after it.
fn assert_the_bar(s: &Setup, conn: &serde_json::Value) {
    assert_eq!(u(&conn["requests"]), 4, "{conn}");
    let k = &conn["kernel"];
    // Every body byte by sendfile, the miss behind its fill too (>= the 3 MiB of the hits).
    assert_eq!(u(&k["zerocopy_bytes"]), 4 << 20, "{conn}");
    // Written bytes: the four heads, the handshake and close_notify, nothing more.
    assert_eq!(
        u(&k["copy_bytes"]),
        u(&conn["head_bytes"]) + u(&conn["tls_control_bytes"]),
        "{conn}"
    );
    assert!(u(&conn["tls_control_bytes"]) > 0, "{conn}");
    assert_eq!(conn["verdict"], "sendfile (kTLS)");
    assert_eq!(
        (&conn["ktls"], &conn["tls_userspace"]),
        (&true.into(), &false.into())
    );
    assert_eq!(u(&conn["violations"]), 0);
    let m = s.proxy.metrics();
    assert_eq!(metric(&m, "zerocache_ktls_available"), 1);
    assert_eq!(
        metric(
            &m,
            "zerocache_copied_body_bytes_total{reason=\"tls-userspace\"}"
        ),
        0
    );
    assert_eq!(metric(&m, "zerocache_zero_copy_violations_total"), 0);
    assert_eq!(connections(&m, "txrx", "offloaded"), 1);
    assert_eq!(s.proxy.api("/api/stats")["body_zero_copy_ratio"], 1.0);
}

/// The same bar with curl as the client: one connection, a 1 MiB miss and three hits, each
/// body written to its own file and compared byte for byte.
/// curl (`protocol`: `--http1.1`, `--http2`) fetches a 1 MiB object four times on one
/// connection, each body checked; returns its `http_version num_connects x-cache` lines.
fn curl_miss_and_three_hits(s: &Setup, protocol: &str) -> String {
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("https://test.example:{}/obj/1048576", s.addr.port());
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sk", protocol, "--resolve"])
        .arg(format!("test.example:{}:127.0.0.1", s.addr.port()))
        .args(["-w", "%{http_version} %{num_connects} %header{x-cache}\n"]);
    for i in 0..4 {
        cmd.arg("-o").arg(dir.path().join(i.to_string())).arg(&url);
    }
    let out = cmd.output().expect("curl");
    assert!(out.status.success(), "{out:?}");
    for i in 0..4 {
        let got = std::fs::read(dir.path().join(i.to_string())).expect("body");
        assert!(got == body(1 << 20), "body {i} differs");
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn curl_miss_and_three_hits_over_ktls() {
    if !needs_ktls("curl_miss_and_three_hits_over_ktls") || !require::root("loads the eBPF probe") {
        return;
    }
    let s = setup(true, "");
    // One connection: curl made it for the first URL and reused it.
    assert_eq!(
        curl_miss_and_three_hits(&s, "--http1.1"),
        "1.1 1 MISS\n1.1 0 HIT\n1.1 0 HIT\n1.1 0 HIT\n"
    );
    let conn = closed_conn(&s.proxy, |c| c["ktls"] == true);
    assert_the_bar(&s, &conn);
}

/// TLS 1.2 and 1.3, each with AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305: each connection
/// is handed to the kernel, and a hit comes back byte-exact behind its miss (the kernel's
/// records decrypt with the client's keys, in both directions, since the second request was
/// decrypted by the kernel too).
#[test]
fn every_version_and_cipher_goes_to_the_kernel() {
    if !needs_ktls("every_version_and_cipher_goes_to_the_kernel") {
        return;
    }
    use rustls::crypto::ring::cipher_suite as cs;
    let s = setup(false, "");
    let suites = [
        (&rustls::version::TLS13, cs::TLS13_AES_128_GCM_SHA256),
        (&rustls::version::TLS13, cs::TLS13_AES_256_GCM_SHA384),
        (&rustls::version::TLS13, cs::TLS13_CHACHA20_POLY1305_SHA256),
        (
            &rustls::version::TLS12,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            &rustls::version::TLS12,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            &rustls::version::TLS12,
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ];
    for (i, (version, suite)) in suites.into_iter().enumerate() {
        let mut c = TlsClient::connect(s.addr, "test.example", client_config_suite(version, suite));
        let path = format!("/obj/{}", 300_000 + i);
        for want in ["MISS", "HIT", "HIT"] {
            let r = c.get(&path, &[]);
            assert_eq!(r.header("x-cache"), Some(want), "{:?}", suite.suite());
            assert!(
                r.body == body(300_000 + i),
                "{:?}: body differs",
                suite.suite()
            );
        }
        drop(c);
        let m = s.proxy.metrics();
        assert_eq!(
            connections(&m, "txrx", "offloaded"),
            i as u64 + 1,
            "{:?}",
            suite.suite()
        );
    }
}

/// A request sent in the same write as the client's Finished reaches the kernel, not a
/// half-read rustls buffer, and is answered; so is the next one on the connection.
#[test]
fn a_request_right_behind_the_handshake_is_answered() {
    let s = setup(false, "");
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let suite = if version == &rustls::version::TLS13 {
            rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
        } else {
            rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        };
        let mut c = TlsClient::connect_pipelined(
            s.addr,
            "test.example",
            client_config_suite(version, suite),
            b"GET /obj/7000 HTTP/1.1\r\nHost: test.example\r\n\r\n",
        );
        let r = c.response();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, body(7000));
        let again = c.get("/obj/7000", &[]);
        assert_eq!(again.header("x-cache"), Some("HIT"));
        assert_eq!(again.body, body(7000));
    }
    let m = s.proxy.metrics();
    let offloaded = if kernel_has_ktls() { 2 } else { 0 };
    assert_eq!(connections(&m, "txrx", "offloaded"), offloaded, "{m}");
}

/// A client's TLS 1.3 KeyUpdate: the kernels users run cannot take new receive keys, so the
/// connection ends cleanly: what was asked before it is answered, then close_notify, and the
/// request sent under the new keys is not answered (never misread).
#[test]
fn a_client_key_update_ends_the_connection_cleanly() {
    let s = setup(false, "");
    let mut c = s.client();
    assert_eq!(c.get("/obj/9000", &[]).body, body(9000));
    c.tls.conn.refresh_traffic_keys().expect("key update");
    c.send(b"GET /obj/9000 HTTP/1.1\r\nHost: test.example\r\n\r\n");
    if kernel_has_ktls() {
        c.closed_cleanly().expect("close_notify after a KeyUpdate");
    } else {
        // rustls in user space follows the update: the request is answered.
        let r = c.response();
        assert_eq!(r.header("x-cache"), Some("HIT"));
        assert_eq!(r.body, body(9000));
    }
    // The proxy is unharmed.
    let mut next = s.client();
    assert_eq!(next.get("/obj/9000", &[]).body, body(9000));
}

/// HEAD and Range hits over kTLS: exact heads and bytes, and the connection's framing intact
/// after each (a GET behind them comes back whole).
#[test]
fn head_and_range_hits_are_exact() {
    let s = setup(false, "");
    let mut c = s.client();
    assert_eq!(c.get("/obj/100000", &[]).body, body(100_000));
    c.send(b"HEAD /obj/100000 HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let head = c.head_only();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("\r\nContent-Length: 100000\r\n"), "{head}");
    assert!(head.contains("\r\nX-Cache: HIT\r\n"), "{head}");
    let r = c.get("/obj/100000", &[("Range", "bytes=1000-1999")]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 1000-1999/100000"));
    assert_eq!(r.body, body(100_000)[1000..2000]);
    let r = c.get("/obj/100000", &[("Range", "bytes=-10")]);
    assert_eq!(r.body, body(100_000)[99_990..]);
    let r = c.get("/obj/100000", &[]);
    assert_eq!(r.body, body(100_000));
}

/// A 64 MiB hit over kTLS is byte-exact, and a client that leaves in the middle of one costs
/// the proxy nothing: the next connection is served.
///
/// Under the VM's software emulation the miss takes ~50 s (the in-process test origin, a debug
/// build, spends ~20 s making the 64 MiB body before its first byte) and the hit ~20 s (the
/// kernel's AES-GCM, emulated): the client's 120 s read timeout only stops a hung test.
#[test]
fn a_64_mib_hit_and_a_client_that_leaves_mid_body() {
    let s = setup(false, "");
    let mut c = s.client();
    let first = c.get("/obj/67108864", &[]);
    assert!(first.body == body(64 << 20), "miss body differs");
    let hit = c.get("/obj/67108864", &[]);
    assert_eq!(hit.header("x-cache"), Some("HIT"));
    assert!(hit.body == body(64 << 20), "hit body differs");
    drop(c);
    let mut leaver = s.client();
    leaver.send(b"GET /obj/67108864 HTTP/1.1\r\nHost: test.example\r\n\r\n");
    let mut got = 0;
    let mut chunk = [0u8; 65536];
    while got < (1 << 20) {
        got += std::io::Read::read(&mut leaver.tls, &mut chunk).expect("read");
    }
    drop(leaver);
    let mut next = s.client();
    assert_eq!(next.get("/obj/2000", &[]).body, body(2000));
    assert_eq!(
        metric(&s.proxy.metrics(), "zerocache_zero_copy_violations_total"),
        0
    );
}

/// The same with `openssl s_client`'s `k` command (a KeyUpdate, TLS 1.3) after one request:
/// with kTLS the proxy answers what came before, then closes cleanly and s_client exits; in
/// user space it follows the update and answers the request sent after it.
#[test]
fn openssl_s_client_key_update() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    let s = setup(false, "");
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &s.addr.to_string()])
        .args(["-servername", "test.example", "-tls1_3", "-crlf"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_client (cargo xtask setup installs openssl)");
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().expect("stdout");
    let sink = out.clone();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().expect("lock").extend_from_slice(&chunk[..n]);
        }
    });
    let responses = || {
        let o = out.lock().expect("lock");
        String::from_utf8_lossy(&o)
            .matches("HTTP/1.1 200 OK")
            .count()
    };
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while responses() < n {
            assert!(Instant::now() < deadline, "no response {n}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut stdin = child.stdin.take().expect("stdin");
    let get = b"GET /obj/10 HTTP/1.1\nHost: test.example\n\n";
    stdin.write_all(get).expect("request");
    wait_for(1);
    // Its own read of stdin: a line that starts with `k`.
    stdin.write_all(b"k\n").expect("k");
    std::thread::sleep(Duration::from_millis(300));
    let _ = stdin.write_all(get);
    if kernel_has_ktls() {
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "s_client still connected");
            std::thread::sleep(Duration::from_millis(50));
        }
        reader.join().expect("reader");
        assert_eq!(
            responses(),
            1,
            "{}",
            String::from_utf8_lossy(&out.lock().expect("lock"))
        );
    } else {
        wait_for(2);
        drop(stdin);
        let _ = child.wait();
        reader.join().expect("reader");
        assert_eq!(responses(), 2);
    }
    let mut next = s.client();
    assert_eq!(next.get("/obj/10", &[]).body, body(10));
}

/// HTTP/2 over kTLS: the keys go to the kernel as for HTTP/1.1, the h2 connection works through
/// the kernel's records, and its bodies are DATA frames written from user space: a copy by
/// design (`h2`), never zero-copy and never a violation, which the kernel's counts confirm.
#[test]
fn curl_h2_over_ktls_is_a_copy_by_design_and_says_so() {
    if !needs_ktls("curl_h2_over_ktls_is_a_copy_by_design_and_says_so")
        || !require::root("loads the eBPF probe")
    {
        return;
    }
    let s = setup(true, "  http2: true\n");
    assert_eq!(
        curl_miss_and_three_hits(&s, "--http2"),
        "2 1 MISS\n2 0 HIT\n2 0 HIT\n2 0 HIT\n"
    );
    let conn = closed_conn(&s.proxy, |c| c["ktls"] == true);
    assert_eq!(conn["h2"], true, "{conn}");
    assert_eq!(
        conn["verdict"], "copy (HTTP/2: frames written from user space)",
        "{conn}"
    );
    assert_eq!(u(&conn["violations"]), 0, "{conn}");
    let k = &conn["kernel"];
    assert_eq!(u(&k["zerocopy_bytes"]), 0, "{conn}");
    assert!(u(&k["copy_bytes"]) > 4 << 20, "{conn}");
    let m = s.proxy.metrics();
    assert_eq!(
        metric(&m, "zerocache_copied_body_bytes_total{reason=\"h2\"}"),
        4 << 20
    );
    assert_eq!(metric(&m, "zerocache_zero_copy_violations_total"), 0);
}
