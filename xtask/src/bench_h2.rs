//! `cargo xtask bench --tls --h2`: HTTP/2 over TLS, zerocache (`tls.http2: true`) against nginx
//! proxy_cache (`listen ... ssl http2`), in the same run, with one client for both: h2load
//! (nghttp2), 10 connections with 10 streams each. Sizes 1 KiB, 64 KiB and 1 MiB, all hits after a
//! checked warm-up. A third row set measures zerocache's own HTTP/1.1 over TLS with the same
//! client (`h2load --h1`, one request in flight per connection), so the report says what HTTP/2
//! costs in CPU per GB against HTTP/1.1 on the same server. The cipher suite is the one
//! `bench --tls` holds both servers to; CPU is read from /proc as there.

use crate::bench::{cpu_ns, median, pids, size_name, start_origin};
use crate::bench_tls::{Prepared, prepare, start_nginx, start_zerocache, warm};
use crate::{free_port, root};
use anyhow::Context;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Instant;

const SIZES: [usize; 3] = [1024, 65_536, 1_048_576];

/// Who serves, and how the client speaks to it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Server {
    ZerocacheH2,
    NginxH2,
    ZerocacheH1,
}

impl Server {
    const ALL: [Server; 3] = [Server::ZerocacheH2, Server::NginxH2, Server::ZerocacheH1];
    fn name(self) -> &'static str {
        match self {
            Server::ZerocacheH2 => "zerocache h2",
            Server::NginxH2 => "nginx proxy_cache h2",
            Server::ZerocacheH1 => "zerocache HTTP/1.1",
        }
    }
}

#[derive(Clone, Default)]
struct Sample {
    rps: f64,
    mbps: f64,
    failed: u64,
    cpu_s_per_gb: f64,
    cpu_us_per_req: f64,
}

/// Runs the HTTP/2 benchmark and writes `xtask/bench/results/h2.md`.
pub fn bench_h2(duration: u64, reps: usize) -> anyhow::Result<()> {
    let Prepared {
        base,
        cert,
        key,
        workers,
    } = prepare("bench-h2")?;
    let origin = start_origin()?;
    let nginx = start_nginx(&base, origin.addr, workers, &cert, &key, true)?;
    let zc_port = free_port()?;
    let zc = start_zerocache(&base, zc_port, origin.addr, &cert, &key, true)?;
    warm(nginx.addr, "nginx")?;
    warm(zc.addr, "zerocache")?;
    let started = Instant::now();
    let mut results = vec![vec![Vec::<Sample>::new(); SIZES.len()]; Server::ALL.len()];
    for rep in 0..reps {
        for k in 0..Server::ALL.len() {
            // Rotated, so no server always runs first.
            let k = (k + rep) % Server::ALL.len();
            let server = Server::ALL[k];
            let (addr, server_pids) = match server {
                Server::NginxH2 => (nginx.addr, pids(nginx.child.id())),
                _ => (zc.addr, pids(zc.child.id())),
            };
            for (i, size) in SIZES.iter().enumerate() {
                h2load(addr, *size, 1, server, &server_pids)?;
                let s = h2load(addr, *size, duration, server, &server_pids)?;
                println!(
                    "xtask: bench --h2: rep {} {:<22} {:>8} {:>9.0} req/s {:>9.1} MB/s {:>7.1} µs CPU/req {:.3} CPU-s/GB failed {}",
                    rep + 1,
                    server.name(),
                    size_name(*size),
                    s.rps,
                    s.mbps,
                    s.cpu_us_per_req,
                    s.cpu_s_per_gb,
                    s.failed
                );
                results[k][i].push(s);
            }
        }
    }
    let report = report(duration, reps, &results, started.elapsed().as_secs_f64())?;
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("h2.md"), &report)?;
    println!("\n{report}");
    println!("xtask: bench --h2: written to xtask/bench/results/h2.md");
    Ok(())
}

/// One h2load run of `secs` seconds against `addr`.
fn h2load(
    addr: SocketAddr,
    size: usize,
    secs: u64,
    server: Server,
    server_pids: &[u32],
) -> anyhow::Result<Sample> {
    let url = format!("https://127.0.0.1:{}/obj/{size}", addr.port());
    let mut cmd = Command::new("h2load");
    cmd.args(["-t", "2", "-c", "10", "-D", &secs.to_string()]);
    if server == Server::ZerocacheH1 {
        cmd.args(["--h1", "-m", "1"]);
    } else {
        cmd.args(["-m", "10"]);
    }
    let before = cpu_ns(server_pids);
    let out = cmd
        .arg(&url)
        .output()
        .context("running h2load (nghttp2-client)")?;
    let cpu = cpu_ns(server_pids).saturating_sub(before) as f64 / 1e9;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "h2load failed: {text}");
    let mut s = Sample::default();
    let mut done = 0f64;
    for l in text.lines().map(str::trim) {
        if let Some(rest) = l.strip_prefix("finished in ") {
            // "finished in 10.00s, 12345.67 req/s, 12.34MB/s"
            let parts: Vec<&str> = rest.split(", ").collect();
            s.rps = parts
                .get(1)
                .and_then(|p| p.strip_suffix(" req/s"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
        } else if let Some(rest) = l.strip_prefix("requests: ") {
            // "10000 total, 10000 started, 10000 done, 10000 succeeded, 0 failed, 0 errored, 0 timeout"
            for p in rest.split(", ") {
                let mut w = p.split_whitespace();
                let (Some(n), Some(what)) = (w.next(), w.next()) else {
                    continue;
                };
                let n: f64 = n.parse().unwrap_or(0.0);
                match what {
                    "succeeded" => done = n,
                    "failed" | "errored" | "timeout" => s.failed += n as u64,
                    _ => {}
                }
            }
        }
    }
    // Body bytes: what the benchmark is about (h2load's traffic line counts frames and heads).
    let bytes = done * size as f64;
    s.mbps = bytes / secs as f64 / 1e6;
    s.cpu_us_per_req = cpu * 1e6 / done.max(1.0);
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
    results: &[Vec<Vec<Sample>>],
    took: f64,
) -> anyhow::Result<String> {
    let mut r = String::new();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    writeln!(r, "# HTTP/2 over TLS: `cargo xtask bench --tls --h2`\n")?;
    writeln!(
        r,
        "{date}. Machine: {} cores, kernel {}. zerocache with `tls.http2: true` and nginx proxy_cache with `listen ... ssl http2`, both TLS 1.3 with the suite `bench --tls` uses, every request a hit. Client h2load (nghttp2): -t 2 -c 10 -m 10 for h2; zerocache's HTTP/1.1 rows with `h2load --h1 -m 1` over the same TLS listener. {duration} s per run after 1 s of warm-up, {reps} repetitions, order rotated, medians; MB/s and CPU-s/GB count body bytes. CPU from /proc/PID/task/*/schedstat. Took {took:.0} s.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim(),
    )?;
    writeln!(
        r,
        "| size | server | req/s | MB/s | failed | CPU µs/req | CPU-s/GB |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|")?;
    for (i, size) in SIZES.iter().enumerate() {
        for (k, server) in Server::ALL.iter().enumerate() {
            let s = &results[k][i];
            writeln!(
                r,
                "| {} | {} | {:.0} | {:.1} | {} | {:.1} | {:.3} |",
                size_name(*size),
                server.name(),
                med(s, |x| x.rps),
                med(s, |x| x.mbps),
                s.iter().map(|x| x.failed).sum::<u64>(),
                med(s, |x| x.cpu_us_per_req),
                med(s, |x| x.cpu_s_per_gb),
            )?;
        }
    }
    writeln!(
        r,
        "\n| size | h2 req/s, zerocache ÷ nginx (target ≥ 1) | h2 CPU-s/GB, zerocache ÷ nginx (target ≤ 1) | zerocache CPU-s/GB, h2 ÷ HTTP/1.1 |"
    )?;
    writeln!(r, "|---|---|---|---|")?;
    for (i, size) in SIZES.iter().enumerate() {
        let (z, n, h1) = (&results[0][i], &results[1][i], &results[2][i]);
        writeln!(
            r,
            "| {} | {:.2}× | {:.2}× | {:.2}× |",
            size_name(*size),
            med(z, |x| x.rps) / med(n, |x| x.rps).max(1e-9),
            med(z, |x| x.cpu_s_per_gb) / med(n, |x| x.cpu_s_per_gb).max(1e-12),
            med(z, |x| x.cpu_s_per_gb) / med(h1, |x| x.cpu_s_per_gb).max(1e-12),
        )?;
    }
    Ok(r)
}
