//! `cargo xtask bench`: zerocache against nginx on the same machine, in the same run, as ratios.
//!
//! Servers: zerocache (probe attached), nginx `proxy_cache` with `tcp_nopush on` and with it off,
//! and nginx serving the objects as static files (the bare-sendfile ceiling), each with as many
//! workers as cores. Every cache is warmed and every warm body checked byte for byte first. Then
//! wrk drives each server on loopback for a bounded time, in rotated order over several
//! repetitions, and the medians go into one table. zerocache runs only during its own slots: the
//! probe's tracepoints tax every process on the machine, and nginx must not pay for them.
//!
//! CPU is read from `/proc/PID/task/*/schedstat` (nanoseconds on CPU), summed over the server's
//! processes and threads; the 250 Hz tick accounting of `/proc/PID/stat` is too coarse. With
//! `--pin`, wrk runs on CPU 1 and the servers on CPU 0, which steadies the CPU-per-GB figure.
//! By default each server runs with its own default placement: zerocache's
//! `workers.cpu_affinity: auto` pins its workers (and lets one off a CPU it cannot get), nginx's
//! workers are unpinned. With `--affinity`, every server pins its workers one per CPU (zerocache's
//! `cpu_affinity: true`, nginx's `worker_cpu_affinity auto`); with `--unpinned`, none does
//! (zerocache's `cpu_affinity: false`): both compared like for like.

use crate::{free_port, root, run};
use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zerocache_origin::client::SimpleClient;

mod burst;
mod cold;
mod measure;
mod report;
mod servers;

use cold::*;
pub(crate) use measure::*;
use report::*;
pub(crate) use servers::*;

/// Object sizes measured.
const SIZES: [usize; 7] = [
    1024,
    65_536,
    65_537,
    1_000_000,
    1_048_576,
    16 << 20,
    64 << 20,
];

/// Benchmark settings.
pub struct Options {
    /// Seconds per wrk run.
    pub duration: u64,
    /// Repetitions (medians are reported).
    pub reps: usize,
    /// Pin wrk to CPU 1 and the servers to CPU 0.
    pub pin: bool,
    /// Only these sizes (all when empty).
    pub sizes: Vec<usize>,
    /// Pin each server's workers one per CPU (zerocache `workers.cpu_affinity: true`, nginx
    /// `worker_cpu_affinity auto`).
    pub affinity: bool,
    /// Leave every server's workers unpinned (zerocache `workers.cpu_affinity: false`).
    pub unpinned: bool,
    /// Run the cold-cache mode instead: hot 1 KiB hits while cold 16 MiB hits run beside them.
    pub cold: bool,
    /// Run the burst mode instead: 1 KiB hits while 500 connections fetch a 16 MiB hit.
    pub burst: bool,
    /// Measure only the watch-mode probe cost per syscall (`bench_watch`).
    pub watch_cost: bool,
}

/// Builds the release binaries every benchmark runs: zerocache and the origin.
pub(crate) fn build_release() -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo).args([
        "build",
        "--release",
        "-p",
        "zerocache",
        "-p",
        "zerocache-origin",
    ]))
}

/// Runs the benchmark and writes `xtask/bench/results/latest.md` (`pinned.md`, `affinity.md`,
/// `unpinned.md` or `cold.md` in those modes).
pub fn bench(opts: Options) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(opts.pin && (opts.affinity || opts.unpinned)) && !(opts.affinity && opts.unpinned),
        "--pin, --affinity and --unpinned each place the workers differently: use one"
    );
    anyhow::ensure!(
        !((opts.cold || opts.burst) && (opts.affinity || opts.pin || opts.unpinned)),
        "--cold and --burst run with default workers; they have no --pin, --affinity or --unpinned variant"
    );
    build_release()?;
    if opts.watch_cost {
        let section = crate::bench_watch::watch_cost()?;
        let out = root().join("xtask/bench/results");
        std::fs::create_dir_all(&out)?;
        std::fs::write(out.join("watch-cost.md"), &section)?;
        println!("{section}\nxtask: bench: written to xtask/bench/results/watch-cost.md");
        return Ok(());
    }
    if opts.cold {
        return cold(&opts);
    }
    if opts.burst {
        return burst::burst(&opts);
    }
    let sizes: Vec<usize> = if opts.sizes.is_empty() {
        SIZES.to_vec()
    } else {
        opts.sizes.clone()
    };
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let base = root().join("target/bench");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;

    let origin_server = start_origin()?;
    let origin = origin_server.addr;

    let nginx: Vec<(Server, Running)> = [
        Server::NginxNopush,
        Server::NginxNoNopush,
        Server::NginxStatic,
    ]
    .into_iter()
    .map(|s| start_nginx(&base, origin, s, workers, opts.affinity).map(|r| (s, r)))
    .collect::<anyhow::Result<_>>()?;
    for (s, r) in &nginx {
        warm(r.addr, *s, &sizes)?;
        println!("xtask: bench: {} warm, bodies checked", s.name());
    }
    let zc_port = free_port()?;
    {
        let z = start_zerocache(&base, zc_port, origin, true, zc_affinity(&opts))?;
        warm(z.addr, Server::Zerocache, &sizes)?;
        println!("xtask: bench: zerocache warm, bodies checked");
    }
    // Per-program BPF run time, for the probe's own cost; restored afterwards.
    let stats_path = "/proc/sys/kernel/bpf_stats_enabled";
    let stats_before = std::fs::read_to_string(stats_path).unwrap_or_default();
    let _ = std::fs::write(stats_path, "1");

    // results[server][size] = samples
    let mut results: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); sizes.len()]; Server::ALL.len()];
    let started = Instant::now();
    // None once a read of zerocache's /metrics failed: the count is then unknown.
    let mut unpins = Some(0);
    for rep in 0..opts.reps {
        let mut order = Server::ALL.to_vec();
        order.rotate_left(rep % Server::ALL.len());
        for server in order {
            let zc_guard;
            let (addr, server_pids, dashboard) = match server {
                Server::Zerocache | Server::ZerocacheNoProbe => {
                    let probe = server == Server::Zerocache;
                    zc_guard = Some(start_zerocache(
                        &base,
                        zc_port,
                        origin,
                        probe,
                        zc_affinity(&opts),
                    )?);
                    let z = zc_guard.as_ref().context("zerocache")?;
                    (z.addr, pids(z.child.id()), z.dashboard)
                }
                s => {
                    zc_guard = None;
                    let r = &nginx.iter().find(|(n, _)| *n == s).context("nginx")?.1;
                    (r.addr, pids(r.child.id()), None)
                }
            };
            if opts.pin {
                pin(&server_pids, "0");
            }
            for (i, &size) in sizes.iter().enumerate() {
                // One second of warm-up per run: connection set-up, page cache, open-file cache.
                wrk(addr, size, 1, opts.pin, &server_pids, dashboard)?;
                let s = wrk(addr, size, opts.duration, opts.pin, &server_pids, dashboard)?;
                println!(
                    "xtask: bench: rep {} {:<36} {:>8}  {:>10.0} req/s {:>9.1} MB/s  p99 {:>7.2} ms  {:.3} CPU-s/GB  errors {}",
                    rep + 1,
                    server.name(),
                    size_name(size),
                    s.rps,
                    s.mbps,
                    s.p99_ms,
                    s.cpu_s_per_gb,
                    s.errors
                );
                results[Server::ALL.iter().position(|x| *x == server).unwrap_or(0)][i].push(s);
            }
            // A run in which the valve moved a worker measured partly unpinned: say so.
            if let Some(d) = dashboard {
                let n = worker_unpins(d);
                unpins = unpins.zip(n).map(|(a, b)| a + b);
                if let Some(n) = n.filter(|n| *n > 0) {
                    println!(
                        "xtask: bench: rep {} {}: the valve moved a worker {n} times",
                        rep + 1,
                        server.name()
                    );
                }
            }
            drop(zc_guard);
        }
    }
    if !stats_before.trim().is_empty() {
        let _ = std::fs::write(stats_path, stats_before.trim());
    }
    let mut report = report(&opts, &sizes, &results, unpins, started.elapsed())?;
    report.push_str(&crate::bench_watch::watch_cost()?);
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    // Pinned runs answer a different question (steady CPU per GB), so they keep their own file.
    let name = match (opts.pin, opts.affinity, opts.unpinned) {
        (true, _, _) => "pinned.md",
        (false, true, _) => "affinity.md",
        (false, false, true) => "unpinned.md",
        (false, false, false) => "latest.md",
    };
    std::fs::write(out.join(name), &report)?;
    println!("\n{report}");
    println!("xtask: bench: written to xtask/bench/results/{name}");
    Ok(())
}
