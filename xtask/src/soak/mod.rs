//! `cargo xtask soak`: a verified soak of the real zerocache binary, with faults injected on a
//! schedule, ending in one table.
//!
//! The origin runs in this process on its own tokio runtime, so killing it (dropping the runtime)
//! closes its listener and every connection it holds, and it restarts on the same port. It serves
//! objects of many sizes whose bytes are known ([`zerocache_origin::body`]): cacheable with an
//! ETag (`/obj/N`), `no-store` (`/ns/N`), chunked without a validator (`/ch/N`), and a "flaky" set
//! whose answers the origin faults rewrite: `/fl/N` (fresh for 2 s, revalidated with a 304) and
//! `/fn/N` (`no-store`). Client threads drive a weighted mix through the proxy, half of them over
//! HTTP/2 (h2c, `soak/h2.rs`) and half over HTTP/1.1 on the same listener: GET, HEAD, single
//! ranges, `If-None-Match` with the right and a wrong ETag, cache-busting misses, and purges
//! through the dashboard API. Every body is compared byte for byte with what the origin serves.
//!
//! Faults, one at a time every few seconds, each logged with its time: the origin killed and
//! restarted; the origin truncating responses (announcing the length, sending half, closing) and
//! hanging up; the origin stalling (before the head, and mid-body for less and for more than the
//! proxy's upstream read timeout); cache files truncated underneath; a byte of a cache file's body
//! flipped; SIGHUP storms (10 in 1 s).
//!
//! Classification. A response is ok, or an error of one kind: unexpected status, bad headers,
//! closed before the response, cut short mid-body, timeout, connect failure, protocol error, or
//! CORRUPT (a complete body, or the received part of a cut-short one, that differs from the
//! origin's). A non-corrupt error is *expected* when the request overlapped a fault window (the
//! fault's active time plus a grace for the proxy to notice recovery), or when it was cut short
//! on a URL whose cache file was truncated before it. A corrupt body whose every wrong byte is a
//! byte this soak flipped in that URL's cache file is counted apart (`flipped byte served`: the
//! cache cannot see a flip until its scrub reads the file). The run fails on any corrupt body not
//! so explained, on any unexpected error, and if the proxy died.
//!
//! A hit whose cache file is truncated *after* sendfile has handed its pages to the socket, but
//! before the client read them, reaches the client complete, with zeros from the cut to the end of
//! the kernel's page-cache folio (ext4 large folios: up to 128 KiB and more): zero-copy sends the
//! page cache's own pages, and truncate zeroes the partial folio in place. sendfile had returned
//! the full count, so no send-time check can see it; only an outside writer can cause it (the
//! proxy never modifies a cache file in place: fills are renamed into place whole). Like a flip,
//! such a body is counted apart ("injected truncation served as zeros") and does not fail the
//! run; any other wrong byte does. An HTTP/2 client's hit is read with pread(2) instead, and a
//! read racing the truncation can copy pages the kernel is zeroing: zeros that start past the
//! cut rather than at it, counted the same way.
//!
//! The run's directory (config, cache, the proxy's log) is removed after a pass unless
//! `XTASK_SOAK_KEEP` is set, and kept after a failure.

use crate::{free_port, root, run};
use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zerocache_origin::client::parse_head;
use zerocache_origin::{Framing, Origin, Reply};

mod faults;
mod h2;
mod http;
mod objects;
mod origin;
mod process;
mod requests;
mod rng;
mod verdict;

use faults::*;
use http::*;
use objects::*;
use origin::*;
use process::*;
use requests::*;
use rng::*;
use verdict::*;

/// Soak settings.
pub struct Options {
    /// Seconds of traffic.
    pub duration: u64,
    /// Client threads.
    pub clients: usize,
    /// Seed of every random choice (ops, objects, ranges, fault order, cache files).
    pub seed: u64,
    /// Load the eBPF probe (needs root).
    pub probe: bool,
    /// Build and run the release binary (else the debug one).
    pub release: bool,
    /// Run the debug binary `cargo test --workspace` has just built, without building again.
    /// `cargo build -p zerocache` resolves other features than the workspace's test build, so it
    /// would rebuild the crate graph and the eBPF object (with `core` from source) into a second
    /// tree: minutes of CI and gigabytes of its disk for the same program.
    pub prebuilt: bool,
}

/// The `Host` clients send; purges name `http://soak/...`.
pub(crate) const HOST: &str = "soak";
pub(crate) const MIB: usize = 1 << 20;
/// Every object size; the other families use subsets.
pub(crate) const SIZES: [usize; 9] = [0, 1, 1000, 4096, 65_535, 65_537, MIB, 3 * MIB, 16 * MIB];
/// Longest wait for one read from the proxy.
pub(crate) const CLIENT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time one request may take, whatever the progress: a hang becomes a timeout.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// The proxy's `read_timeout` towards the origin (the stall fault pauses longer than this).
pub(crate) const UPSTREAM_READ_TIMEOUT_S: u64 = 2;
/// Error records kept per client thread (the counts stay exact beyond it).
pub(crate) const RECORDS_KEPT: usize = 20_000;

// ---------------------------------------------------------------------------------------------
// The soak.

pub fn soak(opts: Options) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let (profile, bin) = if opts.release {
        (vec!["--release"], root().join("target/release/zerocache"))
    } else {
        (vec![], root().join("target/debug/zerocache"))
    };
    if !(opts.prebuilt && !opts.release && bin.is_file()) {
        run(Command::new(&cargo)
            .args(["build", "-p", "zerocache"])
            .args(&profile))?;
    }
    // SAFETY: geteuid has no preconditions.
    let probe = opts.probe && unsafe { libc::geteuid() } == 0;
    if opts.probe && !probe {
        println!("xtask: soak: --probe needs root; running with the probe disabled");
    }
    let clients = opts.clients.max(1);
    let dir = std::env::temp_dir().join(format!("zerocache-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let cache_dir = dir.join("cache");

    let objects = Arc::new(catalogue());
    let mut bodies = Bodies::new();
    for o in objects.iter() {
        bodies
            .entry(o.size)
            .or_insert_with(|| zerocache_origin::body(o.size));
    }
    let bodies = Arc::new(bodies);

    let origin_addr = format!("127.0.0.1:{}", free_port()?);
    let mut origin = OriginCtl {
        addr: origin_addr.clone(),
        objects: objects.clone(),
        bodies: bodies.clone(),
        running: None,
    };
    origin.start()?;

    let port = free_port()?;
    let dport = free_port()?;
    let config = dir.join("zerocache.yaml");
    std::fs::write(
        &config,
        format!(
            "# Written by `cargo xtask soak`.\nlisten: [{{addr: \"127.0.0.1:{port}\", h2c: true}}]\ncache:\n  path: {}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"{origin_addr}\"]\n    connect_timeout: 1s\n    read_timeout: {UPSTREAM_READ_TIMEOUT_S}s\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: {probe}\nlogging:\n  level: warn\n",
            cache_dir.display()
        ),
    )?;
    let log_path = dir.join("zerocache.log");
    let log = std::fs::File::create(&log_path)?;
    let child = Command::new(&bin)
        .args(["run", "--config"])
        .arg(&config)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut proxy = Proxy { child };
    let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let dashboard: SocketAddr = format!("127.0.0.1:{dport}").parse()?;
    wait_listening(proxy_addr, &mut proxy.child, "zerocache")
        .with_context(|| format!("see {}", log_path.display()))?;
    wait_listening(dashboard, &mut proxy.child, "zerocache's dashboard")?;
    let pid = proxy.pid();
    let (rss_start, fds_start) = sample(pid).unwrap_or((0, 0));
    println!(
        "xtask: soak: {} s, {clients} clients (odd-numbered ones speak h2 with prior knowledge, the others HTTP/1.1, on one listener), seed {}, probe {}, {} build; proxy {proxy_addr} (pid {pid}), origin {origin_addr}, dashboard {dashboard}, dir {}",
        opts.duration,
        opts.seed,
        if probe { "on" } else { "off" },
        if opts.release { "release" } else { "debug" },
        dir.display()
    );

    let shared = Arc::new(Shared {
        objects: objects.clone(),
        bodies: bodies.clone(),
        proxy: proxy_addr,
        dashboard,
        stop: AtomicBool::new(false),
        requests: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let peak = Arc::new((AtomicU64::new(rss_start), AtomicU64::new(fds_start)));
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), sampler_stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some((rss, fds)) = sample(pid) {
                    peak.0.fetch_max(rss, Ordering::Relaxed);
                    peak.1.fetch_max(fds, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let t0 = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|tid| {
            let sh = shared.clone();
            let seed = opts.seed;
            std::thread::Builder::new()
                .name(format!("soak-client-{tid}"))
                .spawn(move || client(sh, tid, seed))
        })
        .collect::<Result<_, _>>()?;

    // The fault schedule: one at a time, the kinds in a seeded order, none in the last seconds
    // (so the run ends with a clean stretch that must be error-free).
    let duration = Duration::from_secs(opts.duration);
    let spacing = Duration::from_secs_f64(((opts.duration as f64 - 7.0) / 6.0).clamp(2.5, 4.0));
    let last_start = duration.saturating_sub(Duration::from_secs(5));
    let mut rng = Rng::new(opts.seed ^ 0xFA17);
    let mut order: Vec<FaultKind> = Vec::new();
    let mut windows: Vec<Window> = Vec::new();
    let flips = Mutex::new(Vec::<Flip>::new());
    let truncated = Mutex::new(Vec::<Truncation>::new());
    let mut fault_files: BTreeMap<FaultKind, usize> = BTreeMap::new();
    let mut next = Duration::from_secs(2);
    let mut next_report = Duration::from_secs(10);
    let mut died: Option<String> = None;
    let at = |t: Instant| t.duration_since(t0).as_secs_f64();
    while t0.elapsed() < duration {
        if let Ok(Some(s)) = proxy.child.try_wait() {
            died = Some(format!(
                "the proxy died at t={:.1}s ({s})",
                at(Instant::now())
            ));
            println!("xtask: soak: {}", died.as_deref().unwrap_or(""));
            break;
        }
        if t0.elapsed() >= next_report {
            println!(
                "xtask: soak: t={:5.1}s  {} requests, {} errors so far",
                at(Instant::now()),
                shared.requests.load(Ordering::Relaxed),
                shared.errors.load(Ordering::Relaxed)
            );
            next_report += Duration::from_secs(10);
        }
        if t0.elapsed() < next || t0.elapsed() > last_start {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        if order.is_empty() {
            order = FaultKind::ALL.to_vec();
            rng.shuffle(&mut order);
            order.reverse();
        }
        let Some(kind) = order.pop() else { continue };
        // (Reading every cache file's header takes a while: before the fault's clock starts.)
        let candidates = match kind {
            FaultKind::CacheTruncate | FaultKind::CacheFlip => {
                cache_candidates(&cache_dir, &mut rng)
            }
            _ => Vec::new(),
        };
        let start = Instant::now();
        let (desc, grace) = match kind {
            FaultKind::OriginRestart => {
                origin.kill();
                std::thread::sleep(Duration::from_secs(1));
                origin.start()?;
                (
                    format!(
                        "origin killed, down {:.1} s, restarted",
                        start.elapsed().as_secs_f64()
                    ),
                    Duration::from_secs(2),
                )
            }
            FaultKind::OriginTruncate => {
                origin.script(OriginMode::Truncating);
                std::thread::sleep(Duration::from_millis(1500));
                origin.script(OriginMode::Normal);
                (
                    "origin truncating /fl/* and /fn/* at half their length (and hanging up on /fn/1000) for 1.5 s".into(),
                    Duration::from_secs(2),
                )
            }
            FaultKind::OriginStall => {
                origin.script(OriginMode::Stalling);
                std::thread::sleep(Duration::from_millis(1500));
                origin.script(OriginMode::Normal);
                (
                    format!(
                        "origin stalling /fl/* and /fn/* for 1.5 s (4 s before the head, or 1 s / 4 s mid-body; proxy read_timeout {UPSTREAM_READ_TIMEOUT_S} s)"
                    ),
                    Duration::from_secs(5),
                )
            }
            FaultKind::CacheTruncate | FaultKind::CacheFlip => {
                let flip = kind == FaultKind::CacheFlip;
                let done = damage_cache(candidates, &mut rng, flip, &flips, &truncated);
                *fault_files.entry(kind).or_default() += done.len();
                let what = if flip { "flipped" } else { "truncated" };
                (
                    if done.is_empty() {
                        format!("cache files {what}: none to damage")
                    } else {
                        format!("cache files {what}: {}", done.join("; "))
                    },
                    Duration::from_secs(1),
                )
            }
            FaultKind::SighupStorm => {
                for _ in 0..10 {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(pid, libc::SIGHUP) };
                    std::thread::sleep(Duration::from_millis(100));
                }
                (
                    "10 SIGHUPs to the proxy in 1 s".into(),
                    Duration::from_secs(1),
                )
            }
        };
        let end = Instant::now() + grace;
        println!("xtask: soak: t={:5.1}s  fault: {desc}", at(start));
        windows.push(Window { kind, start, end });
        next = start.duration_since(t0) + spacing;
    }
    shared.stop.store(true, Ordering::Relaxed);
    let mut stats = Vec::new();
    for t in threads {
        stats.push(
            t.join()
                .map_err(|_| anyhow::anyhow!("a soak client thread panicked"))?,
        );
    }
    let traffic_end = Instant::now();
    if died.is_none()
        && let Ok(Some(s)) = proxy.child.try_wait()
    {
        died = Some(format!("the proxy died at t={:.1}s ({s})", at(traffic_end)));
    }

    // The end state: everything purged, 2 s idle.
    let mut end_note = String::new();
    let (mut rss_end, mut fds_end, mut files_left) = (0, 0, 0);
    if died.is_none() {
        match purge(dashboard, "prefix", &format!("http://{HOST}/")) {
            Ok(text) => end_note = format!("purge-all answered {}", text.trim()),
            Err(f) => end_note = format!("purge-all FAILED: {}", f.detail),
        }
        std::thread::sleep(Duration::from_secs(2));
        (rss_end, fds_end) = sample(pid).unwrap_or((0, 0));
        files_left = cache_files(&cache_dir).len();
    }
    sampler_stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let exit = proxy.stop();
    origin.kill();
    if died.is_none() && !exit.starts_with("exited on SIGTERM") {
        died = Some(format!("the proxy {exit}"));
    }

    verdict(Outcome {
        opts: &opts,
        dir: &dir,
        clients,
        t0,
        stats,
        windows,
        flips,
        truncated,
        fault_files,
        died,
        exit,
        end_note,
        rss_fds: [
            (rss_start, fds_start),
            (
                peak.0.load(Ordering::Relaxed),
                peak.1.load(Ordering::Relaxed),
            ),
            (rss_end, fds_end),
        ],
        files_left,
    })
}
