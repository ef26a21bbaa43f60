//! `cargo xtask bench --tls`: zerocache against nginx `proxy_cache`, both serving clients over
//! TLS, in the same run, as ratios. Same certificate (ECDSA P-256, made here with openssl), same
//! cipher suite (TLS 1.3 `TLS_AES_256_GCM_SHA384`: the first wrk's OpenSSL offers, which rustls
//! takes by the client's order and nginx is restricted to), `ssl_sendfile` where nginx has it
//! (`sendfile on` with `ssl_conf_command Options KTLS`: it needs kTLS in the kernel, without it
//! nginx copies too). Sizes 1 KiB, 64 KiB, 1 MiB and 16 MiB with keep-alive, and a
//! handshake-heavy row: 1 KiB with a new connection and handshake per request. wrk keeps its
//! TLS session across reconnects (OpenSSL's `SSL_clear`), so those handshakes are TLS 1.3
//! resumptions (PSK with a fresh X25519 exchange, no certificate signature), as a returning
//! browser's are; nginx's `$ssl_session_reused` said `r` for 4,132 of 4,134 of them.
//!
//! Each server is warmed over TLS and its warm bodies checked byte for byte (curl), and the
//! negotiated suite is checked on both (openssl s_client) before anything is measured. The
//! report says who encrypted zerocache's connections (`zerocache_tls_connections_total`): on
//! this project's machines `ktls: unavailable (kernel-has-no-ktls)`; on a kTLS host (`modprobe
//! tls` first) the same command measures TLS hits by sendfile, and nginx's `ssl_sendfile` too.

use crate::bench::{Running, cpu_ns, median, parse_bytes, pids, size_name, start_origin};
use crate::{free_port, root};
use anyhow::{Context, bail};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The sizes with keep-alive.
const SIZES: [usize; 4] = [1024, 65_536, 1_048_576, 16 << 20];
/// The handshake-heavy row's size.
const HANDSHAKE_SIZE: usize = 1024;
/// The one suite both servers use.
const SUITE: &str = "TLS_AES_256_GCM_SHA384";

/// One measured row: keep-alive at a size, or a handshake per request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    KeepAlive(usize),
    Handshakes,
}

impl Row {
    fn name(self) -> String {
        match self {
            Row::KeepAlive(s) => size_name(s),
            Row::Handshakes => format!("{} + handshake", size_name(HANDSHAKE_SIZE)),
        }
    }
    fn size(self) -> usize {
        match self {
            Row::KeepAlive(s) => s,
            Row::Handshakes => HANDSHAKE_SIZE,
        }
    }
}

#[derive(Clone, Default)]
struct Sample {
    rps: f64,
    mbps: f64,
    p99_ms: f64,
    errors: u64,
    cpu_s_per_gb: f64,
    cpu_us_per_req: f64,
}

/// Runs the TLS benchmark and writes `xtask/bench/results/tls.md`.
pub fn bench_tls(duration: u64, reps: usize) -> anyhow::Result<()> {
    let Prepared {
        base,
        cert,
        key,
        workers,
    } = prepare("bench-tls")?;
    let origin = start_origin()?;
    let nginx = start_nginx(&base, origin.addr, workers, &cert, &key, false)?;
    let zc_port = free_port()?;
    let rows: Vec<Row> = SIZES
        .iter()
        .map(|s| Row::KeepAlive(*s))
        .chain([Row::Handshakes])
        .collect();
    warm(nginx.addr, "nginx")?;
    let zc_path;
    {
        let z = start_zerocache(&base, zc_port, origin.addr, &cert, &key, false)?;
        warm(z.addr, "zerocache")?;
        println!("xtask: bench --tls: suite {} on both", negotiated(z.addr)?);
        zc_path = tls_path(&z)?;
        println!("xtask: bench --tls: zerocache's TLS connections: {zc_path}");
    }
    let started = Instant::now();
    // results[0] zerocache, results[1] nginx; [row] = samples
    let mut results = vec![vec![Vec::<Sample>::new(); rows.len()]; 2];
    for rep in 0..reps {
        for k in [rep % 2, (rep + 1) % 2] {
            let zc_guard = if k == 0 {
                Some(start_zerocache(
                    &base,
                    zc_port,
                    origin.addr,
                    &cert,
                    &key,
                    false,
                )?)
            } else {
                None
            };
            let (addr, server_pids) = match &zc_guard {
                Some(z) => (z.addr, pids(z.child.id())),
                None => (nginx.addr, pids(nginx.child.id())),
            };
            for (i, row) in rows.iter().enumerate() {
                wrk(addr, *row, 1, &server_pids)?;
                let s = wrk(addr, *row, duration, &server_pids)?;
                println!(
                    "xtask: bench --tls: rep {} {:<10} {:>18} {:>9.0} req/s {:>9.1} MB/s p99 {:>7.2} ms {:>7.1} µs CPU/req {:.3} CPU-s/GB errors {}",
                    rep + 1,
                    if k == 0 { "zerocache" } else { "nginx" },
                    row.name(),
                    s.rps,
                    s.mbps,
                    s.p99_ms,
                    s.cpu_us_per_req,
                    s.cpu_s_per_gb,
                    s.errors
                );
                results[k][i].push(s);
            }
            drop(zc_guard);
        }
    }
    let report = report(
        duration,
        reps,
        &rows,
        &results,
        started.elapsed().as_secs_f64(),
        &zc_path,
    )?;
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("tls.md"), &report)?;
    println!("\n{report}");
    println!("xtask: bench --tls: written to xtask/bench/results/tls.md");
    Ok(())
}

/// What a TLS benchmark starts from: release binaries built, its own directory under `target/`
/// emptied, a certificate, and the worker count both servers get.
pub(crate) struct Prepared {
    pub(crate) base: std::path::PathBuf,
    pub(crate) cert: String,
    pub(crate) key: String,
    pub(crate) workers: usize,
}

pub(crate) fn prepare(dir: &str) -> anyhow::Result<Prepared> {
    crate::bench::build_release()?;
    let base = root().join("target").join(dir);
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let (cert, key) = make_cert(&base)?;
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    Ok(Prepared {
        base,
        cert,
        key,
        workers,
    })
}

/// A self-signed ECDSA P-256 certificate for localhost and 127.0.0.1.
fn make_cert(dir: &Path) -> anyhow::Result<(String, String)> {
    let (cert, key) = (dir.join("bench.crt"), dir.join("bench.key"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args([
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("openssl (installed by cargo xtask setup)")?;
    anyhow::ensure!(status.success(), "openssl req failed");
    Ok((cert.display().to_string(), key.display().to_string()))
}

/// nginx proxy_cache over TLS; with `h2`, `http2` on its listener (nginx 1.22's syntax; 1.25's
/// `http2 on;` means the same).
pub(crate) fn start_nginx(
    base: &Path,
    origin: SocketAddr,
    workers: usize,
    cert: &str,
    key: &str,
    h2: bool,
) -> anyhow::Result<Running> {
    let dir = base.join("nginx");
    std::fs::create_dir_all(&dir)?;
    let d = dir.display();
    let port = free_port()?;
    let http2 = if h2 { " http2" } else { "" };
    let conf = format!(
        "{}  proxy_cache_path {d}/cache levels=1:2 keys_zone=zc:10m max_size=4g inactive=60m use_temp_path=off;
  upstream origin {{ server {origin}; keepalive 32; }}
  ssl_session_cache shared:SSL:10m; ssl_session_tickets on;
  server {{ listen 127.0.0.1:{port} ssl{http2};
    ssl_certificate {cert}; ssl_certificate_key {key};
    ssl_protocols TLSv1.3; ssl_conf_command Ciphersuites {SUITE}; ssl_conf_command Options KTLS;
    location / {{ proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\";
      proxy_cache zc; proxy_cache_valid 200 60m; add_header X-Cache $upstream_cache_status; }} }}
}}
",
        crate::bench::nginx_prelude(&dir, workers, false)
    );
    crate::bench::spawn_nginx(&dir, &conf, port, "nginx")
}

/// zerocache with a TLS listener on `port`; with `h2`, `tls.http2: true`.
pub(crate) fn start_zerocache(
    base: &Path,
    port: u16,
    origin: SocketAddr,
    cert: &str,
    key: &str,
    h2: bool,
) -> anyhow::Result<Running> {
    let dir = base.join("zc");
    std::fs::create_dir_all(&dir)?;
    let (plain, dport) = (free_port()?, free_port()?);
    let conf = dir.join("zerocache.yaml");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{plain}\ncache:\n  path: {}\n  max_size: 4GiB\nupstreams:\n  origin:\n    servers: [\"{origin}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: true\nlogging:\n  level: warn\ntls:\n  listen: 127.0.0.1:{port}\n  http2: {h2}\n  certificates:\n    - {{ cert: {cert}, key: {key} }}\n",
            dir.join("cache").display()
        ),
    )?;
    let mut child = Command::new(root().join("target/release/zerocache"))
        .args(["run", "--config"])
        .arg(&conf)
        .spawn()
        .context("starting zerocache")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    crate::bench::wait_listening(addr, &mut child, "zerocache")?;
    Ok(Running {
        child,
        addr,
        dashboard: Some(format!("127.0.0.1:{dport}").parse()?),
    })
}

/// Who encrypted zerocache's warm-up connections, from `zerocache_tls_connections_total`:
/// `ktls: txrx (hits by sendfile)` on a kTLS kernel, else `ktls: unavailable (<reason>)`.
fn tls_path(z: &Running) -> anyhow::Result<String> {
    let dash = z.dashboard.context("zerocache has a dashboard")?;
    let out = Command::new("curl")
        .args(["-s", &format!("http://{dash}/metrics")])
        .output()
        .context("curl /metrics")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut used: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("zerocache_tls_connections_total{"))
        .filter_map(|l| l.split_once("} "))
        .filter(|(_, v)| v.trim().parse::<f64>().is_ok_and(|n| n > 0.0))
        .map(|(labels, _)| {
            let get = |k: &str| {
                labels
                    .split(',')
                    .find_map(|p| p.strip_prefix(&format!("{k}=\"")))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            (get("ktls"), get("reason"))
        })
        .collect();
    used.sort();
    Ok(match used.as_slice() {
        [] => "unknown (no TLS connection counted)".into(),
        [(k, _)] if k == "txrx" => "ktls: txrx (keys in the kernel, hits by sendfile)".into(),
        [(_, reason)] => format!(
            "ktls: unavailable ({reason}; hits encrypted in user space, accounted as tls-userspace)"
        ),
        many => format!("mixed: {many:?}"),
    })
}

/// Fetches every size over TLS until it is a hit, checking the bodies byte for byte.
pub(crate) fn warm(addr: SocketAddr, what: &str) -> anyhow::Result<()> {
    for s in SIZES {
        let url = format!("https://127.0.0.1:{}/obj/{s}", addr.port());
        let expected = zerocache_origin::body(s);
        let mut hit = false;
        for _ in 0..3 {
            let out = Command::new("curl")
                .args(["-sk", "--http1.1", "-D", "/dev/stderr", &url])
                .output()
                .context("curl")?;
            anyhow::ensure!(out.status.success(), "{what}: curl {url} failed");
            anyhow::ensure!(
                out.stdout == expected,
                "{what}: {url} body differs from the origin's"
            );
            let head = String::from_utf8_lossy(&out.stderr).to_ascii_lowercase();
            if head.contains("x-cache: hit") {
                hit = true;
                break;
            }
        }
        anyhow::ensure!(hit, "{what}: {url} is not a cache hit when warm");
    }
    println!("xtask: bench --tls: {what} warm over TLS, bodies checked");
    Ok(())
}

/// The suite `addr` negotiates with OpenSSL's default client offer (wrk's).
fn negotiated(addr: SocketAddr) -> anyhow::Result<String> {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            "localhost",
        ])
        .stdin(Stdio::null())
        .output()
        .context("openssl s_client")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let suite = text
        .lines()
        .find_map(|l| l.split("Cipher is ").nth(1))
        .map(str::trim)
        .unwrap_or("")
        .to_string();
    if suite != SUITE {
        bail!("zerocache negotiated `{suite}`, nginx is held to {SUITE}: not like for like");
    }
    Ok(suite)
}

fn wrk(addr: SocketAddr, row: Row, secs: u64, server_pids: &[u32]) -> anyhow::Result<Sample> {
    let conns = if row.size() < 1_000_000 { 32 } else { 8 };
    let url = format!("https://127.0.0.1:{}/obj/{}", addr.port(), row.size());
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t2",
        &format!("-c{conns}"),
        &format!("-d{secs}s"),
        "--latency",
        "--timeout",
        "10s",
    ]);
    if row == Row::Handshakes {
        // wrk closes and reconnects after a response that says so: one handshake each (a
        // resumption: wrk keeps its session).
        cmd.args(["-H", "Connection: close"]);
    }
    let before = cpu_ns(server_pids);
    let out = cmd.arg(&url).output().context("running wrk")?;
    let cpu = cpu_ns(server_pids).saturating_sub(before) as f64 / 1e9;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "wrk failed: {text}");
    let mut s = Sample::default();
    let mut bytes = 0f64;
    for l in text.lines().map(str::trim) {
        if let Some(v) = l.strip_prefix("Requests/sec:") {
            s.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = l.strip_prefix("99%") {
            s.p99_ms = crate::bench::parse_duration_ms(v).unwrap_or(0.0);
        } else if let Some(v) = l.strip_prefix("Non-2xx or 3xx responses:") {
            s.errors += v.trim().parse::<u64>().unwrap_or(0);
        } else if let Some(v) = l.strip_prefix("Socket errors:") {
            // With Connection: close, wrk counts the server's close after each response as a
            // read error only when the response was cut: those count.
            s.errors += v
                .split(',')
                .filter(|p| !p.contains("connect 0"))
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        } else if l.contains("requests in")
            && let Some(read) = l.split(", ").nth(1).and_then(|r| r.strip_suffix(" read"))
        {
            bytes = parse_bytes(read);
        }
    }
    s.mbps = bytes / secs as f64 / 1e6;
    let requests = (s.rps * secs as f64).max(1.0);
    s.cpu_us_per_req = cpu * 1e6 / requests;
    s.cpu_s_per_gb = if bytes > 0.0 {
        cpu / (bytes / 1e9)
    } else {
        0.0
    };
    Ok(s)
}

fn med(v: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(v.iter().map(f).collect())
}

fn report(
    duration: u64,
    reps: usize,
    rows: &[Row],
    results: &[Vec<Vec<Sample>>],
    took: f64,
    zc_path: &str,
) -> anyhow::Result<String> {
    let mut r = String::new();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let ktls = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .unwrap_or_default()
        .split_whitespace()
        .any(|u| u == "tls");
    writeln!(
        r,
        "# zerocache vs nginx over TLS: `cargo xtask bench --tls`\n"
    )?;
    writeln!(
        r,
        "{date}. Machine: {} cores, kernel {} (kTLS: {}). Both serve clients over TLS 1.3 with {SUITE}, X25519, one ECDSA P-256 certificate; nginx proxy_cache with `sendfile on` and `ssl_conf_command Options KTLS` (its ssl_sendfile, which needs kTLS), zerocache with the probe attached and `tls.ktls: auto`; its TLS connections: {zc_path}. wrk -t2, {duration} s per run after 1 s of warm-up, {reps} repetitions in alternating order, medians; 32 connections below 1 MB, 8 from 1 MB up. The handshake row sends `Connection: close`: a new connection and a handshake per request (wrk resumes its TLS session, so a TLS 1.3 resumption with a fresh key exchange). CPU from /proc/PID/task/*/schedstat. Took {took:.0} s.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim(),
        if ktls {
            "yes"
        } else {
            "no: the kernel has no tls ULP"
        },
    )?;
    writeln!(
        r,
        "| row | server | req/s | MB/s | p99 ms | errors | CPU µs/req | CPU-s/GB |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|---|")?;
    for (i, row) in rows.iter().enumerate() {
        for (k, name) in ["zerocache", "nginx proxy_cache"].iter().enumerate() {
            let s = &results[k][i];
            writeln!(
                r,
                "| {} | {name} | {:.0} | {:.1} | {:.2} | {} | {:.1} | {:.3} |",
                row.name(),
                med(s, |x| x.rps),
                med(s, |x| x.mbps),
                med(s, |x| x.p99_ms),
                s.iter().map(|x| x.errors).sum::<u64>(),
                med(s, |x| x.cpu_us_per_req),
                med(s, |x| x.cpu_s_per_gb),
            )?;
        }
    }
    writeln!(r, "\n## zerocache / nginx\n")?;
    writeln!(
        r,
        "| row | req/s ratio (target ≥ 1) | CPU-s/GB ratio (target ≤ 1) |"
    )?;
    writeln!(r, "|---|---|---|")?;
    for (i, row) in rows.iter().enumerate() {
        let (z, n) = (&results[0][i], &results[1][i]);
        writeln!(
            r,
            "| {} | {:.2}× | {:.2}× |",
            row.name(),
            med(z, |x| x.rps) / med(n, |x| x.rps).max(1e-9),
            med(z, |x| x.cpu_s_per_gb) / med(n, |x| x.cpu_s_per_gb).max(1e-12),
        )?;
    }
    Ok(r)
}
