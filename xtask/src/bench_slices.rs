//! `cargo xtask bench --slices`: a 1 GiB object read by 8 clients as random 2 MiB ranges, through
//! zerocache with `slice: 4MiB` and through nginx with `slice 4m;` (its slice module with
//! `$slice_range` in the key and `proxy_cache_lock`), one at a time in front of one origin.
//!
//! Each server starts with an empty cache and gets four passes of the same 8 × `REQUESTS` ranges
//! (a fixed seed, so both servers see the same sequence): the first fills, three more read what
//! the first stored (their ranges are other ones, so a few slices are still fetched). Per pass: the origin's body bytes (`GET /__stats` on the origin: the goal is
//! each slice once, about 1.0× the object), the clients' throughput, and the server's CPU time per
//! GB sent (schedstat of every thread). Every body is checked byte for byte against the
//! generated pattern. Writes `xtask/bench/results/slices.md`.

use crate::bench::{Running, cpu_ns, pids, start_nginx_slice, start_origin};
use crate::bench_against::{start, write_result};
use crate::root;
use anyhow::Context;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Instant;
use zerocache_origin::client::SimpleClient;

/// The object: 1 GiB of the generated pattern (`/ranged/<n>` on the origin).
const OBJECT: u64 = 1 << 30;
/// Each client's range.
const RANGE: u64 = 2 << 20;
const CLIENTS: usize = 8;
/// Ranges per client per pass: 8 × 64 × 2 MiB = 1 GiB sent per pass.
const REQUESTS: usize = 64;
/// The generated pattern's period (`zerocache_origin::pattern_byte`).
const PERIOD: u64 = 251 * 7;

/// One pass's figures.
struct Pass {
    origin_bytes: u64,
    sent: u64,
    secs: f64,
    cpu_ns: u64,
}

/// A small deterministic generator (xorshift64*), so both servers get the same ranges.
fn ranges(seed: u64) -> Vec<Vec<u64>> {
    let mut x = seed | 1;
    (0..CLIENTS)
        .map(|_| {
            (0..REQUESTS)
                .map(|_| {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    x.wrapping_mul(0x2545_f491_4f6c_dd1d) % (OBJECT - RANGE)
                })
                .collect()
        })
        .collect()
}

/// The origin's body bytes so far.
fn origin_bytes(origin: SocketAddr) -> anyhow::Result<u64> {
    let r = SimpleClient::connect(origin)?.get("bench", "/__stats", true)?;
    let v: serde_json::Value = serde_json::from_slice(&r.body).context("origin stats")?;
    v["body_bytes"].as_u64().context("body_bytes")
}

/// Runs one pass against `addr` (server process `pid`).
fn pass(addr: SocketAddr, pid: u32, origin: SocketAddr, seed: u64) -> anyhow::Result<Pass> {
    let path = format!("/ranged/{OBJECT}");
    let before = origin_bytes(origin)?;
    let threads = pids(pid);
    let cpu_before = cpu_ns(&threads);
    let table: std::sync::Arc<Vec<u8>> = std::sync::Arc::new(
        (0..PERIOD + RANGE)
            .map(zerocache_origin::pattern_byte)
            .collect(),
    );
    let started = Instant::now();
    let handles: Vec<_> = ranges(seed)
        .into_iter()
        .map(|starts| {
            let path = path.clone();
            let table = table.clone();
            std::thread::spawn(move || -> anyhow::Result<u64> {
                let mut c = SimpleClient::connect(addr)?;
                let mut sent = 0;
                for a in starts {
                    let b = a + RANGE - 1;
                    let r = c.get_with(
                        "bench",
                        &path,
                        &[("Range", &format!("bytes={a}-{b}"))],
                        false,
                    )?;
                    anyhow::ensure!(r.status == 206, "{path} bytes={a}-{b}: {}", r.status);
                    // The pattern repeats every 251 × 7 bytes: one memcmp against a table, so the
                    // clients' check costs little beside the servers' work.
                    let at = (a % PERIOD) as usize;
                    anyhow::ensure!(
                        r.body.len() as u64 == RANGE
                            && r.body[..] == table[at..at + RANGE as usize],
                        "{path} bytes={a}-{b}: the body differs from the object's"
                    );
                    sent += RANGE;
                }
                Ok(sent)
            })
        })
        .collect();
    let mut sent = 0;
    for h in handles {
        sent += h
            .join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(Pass {
        origin_bytes: origin_bytes(origin)? - before,
        sent,
        secs,
        cpu_ns: cpu_ns(&pids(pid)).saturating_sub(cpu_before),
    })
}

/// Runs the comparison and writes `xtask/bench/results/slices.md`.
pub fn bench_slices() -> anyhow::Result<()> {
    crate::bench::build_release()?;
    let base = root().join("target/bench-slices");
    let _ = std::fs::remove_dir_all(&base);
    let origin: Running = start_origin()?;
    let started = Instant::now();
    let mut rows = Vec::new();
    for server in ["zerocache", "nginx"] {
        let (running_pid, addr, _keep) = match server {
            "zerocache" => {
                let p = start(
                    &root().join("target/release/zerocache"),
                    &base.join("zc"),
                    origin.addr,
                    "    slice: 4MiB\n",
                    false,
                )?;
                (p.child.id(), p.addr, Box::new(p) as Box<dyn std::any::Any>)
            }
            _ => {
                let n = start_nginx_slice(&base.join("ngx"), origin.addr)?;
                (n.child.id(), n.addr, Box::new(n) as Box<dyn std::any::Any>)
            }
        };
        for (name, seed) in [
            ("cold (fills)", 7),
            ("warm 1", 11),
            ("warm 2", 13),
            ("warm 3", 17),
        ] {
            let p = pass(addr, running_pid, origin.addr, seed)?;
            println!(
                "xtask: bench --slices: {server:<9} {name:<12} origin {:>6.3}× the object, {:>7.0} MB/s, {:>6.2} s CPU/GB",
                p.origin_bytes as f64 / OBJECT as f64,
                p.sent as f64 / p.secs / 1e6,
                p.cpu_ns as f64 / 1e9 / (p.sent as f64 / 1e9)
            );
            rows.push((server, name, p));
        }
    }
    let mut r = String::new();
    writeln!(
        r,
        "# Large objects in slices: `cargo xtask bench --slices`\n"
    )?;
    writeln!(
        r,
        "{} UTC. One release origin serving a 1 GiB object with byte ranges; zerocache `slice: 4MiB` and nginx `slice 4m;` (`proxy_cache_key $uri$is_args$args$slice_range`, `proxy_cache_lock on`), one at a time, each from an empty cache, default workers, the probe off. {CLIENTS} clients on keep-alive connections, {REQUESTS} random 2 MiB ranges each per pass (the same sequence for both servers), every body checked byte for byte; a cold pass that fills, then three warm passes of other ranges. Machine: {} cores, loopback. Took {:.0} s.\n",
        crate::bench_index::utc_now(),
        std::thread::available_parallelism().map_or(2, |n| n.get()),
        started.elapsed().as_secs_f64()
    )?;
    writeln!(
        r,
        "| server | pass | origin bytes ÷ object | client MB/s | server CPU s per GB sent |"
    )?;
    writeln!(r, "|---|---|---|---|---|")?;
    for (server, name, p) in &rows {
        writeln!(
            r,
            "| {server} | {name} | {:.3}× | {:.0} | {:.2} |",
            p.origin_bytes as f64 / OBJECT as f64,
            p.sent as f64 / p.secs / 1e6,
            p.cpu_ns as f64 / 1e9 / (p.sent as f64 / 1e9)
        )?;
    }
    let ratio = |server: &str, name: &str, f: fn(&Pass) -> f64| {
        rows.iter()
            .find(|(s, n, _)| *s == server && *n == name)
            .map_or(f64::NAN, |(_, _, p)| f(p))
    };
    let tput = |p: &Pass| p.sent as f64 / p.secs;
    let cpu = |p: &Pass| p.cpu_ns as f64 / p.sent as f64;
    for name in ["cold (fills)", "warm 1", "warm 2", "warm 3"] {
        writeln!(
            r,
            "\n{name}: zerocache ÷ nginx: {:.2}× the throughput, {:.2}× the CPU per GB.",
            ratio("zerocache", name, tput) / ratio("nginx", name, tput),
            ratio("zerocache", name, cpu) / ratio("nginx", name, cpu)
        )?;
    }
    write_result("slices", &r)
}
