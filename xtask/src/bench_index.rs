//! `cargo xtask bench --index [--objects N]`: what zerocache costs per stored object, the figures
//! an edge node with tens of millions of objects lives by. One proxy in front of the demo origin
//! is filled with N one-byte objects through its own front door (`/obj/1?i=<n>`, each a MISS
//! stored), then measured:
//!
//! - RAM per object: RSS growth from the empty process to the full one, divided by N;
//! - disk per object: the cache directory's allocated blocks, divided by N;
//! - hits, one keep-alive client, one request at a time, p50/p99 and the proxy's CPU per hit,
//!   against the same over the first 1,000 objects with only those stored: the first 1,000
//!   again with N stored (is a hot set slower with a big index?); random objects of N with
//!   their pages brought into the page cache by an untimed pass first (each hit reads its
//!   entry's head: the index's own cost); random objects as found (what this machine's
//!   proactive reclaim paged out comes from disk);
//! - a prefix purge that matches nothing (it reads every entry's head);
//! - a restart after `kill -9` (no snapshot: the index loads from the entries in the
//!   background) and one after SIGTERM (the snapshot written at the stop), each with the page
//!   cache dropped (as root; a warm one otherwise, said so): time from the spawn to the first
//!   HIT, and to a complete index (`/api/stats` counting N);
//! - a SIGUSR2 upgrade: time from the signal to the successor serving (its pid in the pid file),
//!   then to a HIT from it and to its complete index.
//!
//! Writes xtask/bench/results/index.md. Times here are for the record, never asserted.

use crate::bench_fleet::{Prepared, Proc, metrics, prepare, wait_listening};
use crate::{free_port, root};
use anyhow::Context;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use zerocache_origin::client::SimpleClient;

/// Index benchmark settings.
pub struct Options {
    /// Objects to store.
    pub objects: usize,
    /// Release binaries (debug ones otherwise: a quick check of the harness, no figures).
    pub release: bool,
}

/// Objects the "nearly empty" latency is measured over.
const SMALL: usize = 1_000;

/// Hits timed for each latency figure.
const TIMED: usize = 20_000;

const HOST: &str = "bench.example";

fn path(i: usize) -> String {
    format!("/obj/1?i={i}")
}

/// Resident memory of `pid`, in bytes.
fn rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    Ok(kib * 1024)
}

/// Bytes allocated to the files under `dir`, and how many files.
fn disk(dir: &Path) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut files) = (0, 0);
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let m = e.metadata()?;
            if m.is_dir() {
                dirs.push(e.path());
            } else {
                bytes += m.blocks() * 512;
                files += 1;
            }
        }
    }
    Ok((bytes, files))
}

/// Stores objects `range` through `proxy` on 4 keep-alive connections.
fn fill(proxy: SocketAddr, range: std::ops::Range<usize>) -> anyhow::Result<()> {
    let next = AtomicUsize::new(range.start);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    let mut c = SimpleClient::connect(proxy)?;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= range.end {
                            return Ok(());
                        }
                        let r = c.get(HOST, &path(i), false)?;
                        anyhow::ensure!(r.status == 200 && r.body == b"\0", "{}", path(i));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a fill thread panicked"))??;
        }
        Ok(())
    })
}

/// Clock ticks a second in `/proc/PID/stat`: USER_HZ, 100 on every Linux architecture this
/// builds for (the kernel's ABI, whatever its own HZ).
const USER_HZ: f64 = 100.0;

/// How hits were timed.
struct Timed {
    p50: f64,
    p99: f64,
    /// The proxy's CPU (user and system) per timed hit, in microseconds.
    cpu: f64,
}

/// [`TIMED`] hits on random objects below `n` (the sequence `seed` picks), p50 and p99 in
/// microseconds. `warm` requests the same sequence once untimed first, so the timed pass finds
/// each object's pages in the page cache (this machine's proactive reclaim, DAMON, pages out
/// file pages unused for a minute or so), and, with more objects than `cache.hot_entries`, still
/// reads each one's head.
fn latency(proxy: SocketAddr, pid: u32, n: usize, seed: u64, warm: bool) -> anyhow::Result<Timed> {
    let mut c = SimpleClient::connect(proxy)?;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed;
    let picks: Vec<usize> = (0..TIMED)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        })
        .collect();
    if warm {
        for &i in &picks {
            c.get(HOST, &path(i), false)?;
        }
    }
    let mut took = Vec::with_capacity(TIMED);
    let (u0, s0) = crate::bench::user_sys_ticks(&[pid]);
    for &i in &picks {
        let t = Instant::now();
        let r = c.get(HOST, &path(i), false)?;
        took.push(t.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(r.header("x-cache") == Some("HIT"), "{} not a HIT", path(i));
    }
    let (u1, s1) = crate::bench::user_sys_ticks(&[pid]);
    let ticks = (u1 + s1).saturating_sub(u0 + s0) as f64;
    took.sort_by(f64::total_cmp);
    Ok(Timed {
        p50: took[TIMED / 2],
        p99: took[TIMED * 99 / 100],
        cpu: ticks * 1e6 / USER_HZ / TIMED as f64,
    })
}

/// A latency row: p50 / p99 and CPU per hit, each as a ratio to `base`'s when given.
fn row(t: &Timed, base: Option<&Timed>) -> String {
    let figures = format!("{:.0} / {:.0} µs, {:.0} µs CPU", t.p50, t.p99, t.cpu);
    match base {
        None => figures,
        Some(b) => format!(
            "{figures} ({:.2}× / {:.2}×, {:.2}×)",
            t.p50 / b.p50,
            t.p99 / b.p99,
            t.cpu / b.cpu
        ),
    }
}

/// Spawns the proxy with `config`.
fn start(bin: &Path, config: &Path) -> anyhow::Result<Child> {
    Command::new(bin.join("zerocache"))
        .args(["run", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .spawn()
        .context("starting zerocache")
}

/// Polls GET `path(0)` on new connections until it is a HIT; the time since `from`.
fn until_hit(proxy: SocketAddr, from: Instant) -> anyhow::Result<Duration> {
    let deadline = from + Duration::from_secs(3600);
    loop {
        let hit = SimpleClient::connect(proxy)
            .and_then(|mut c| c.get(HOST, &path(0), true))
            .is_ok_and(|r| r.header("x-cache") == Some("HIT"));
        if hit {
            return Ok(from.elapsed());
        }
        anyhow::ensure!(Instant::now() < deadline, "no HIT within an hour");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls `/api/stats` until it counts `n` objects; the time since `from`.
fn until_indexed(dashboard: SocketAddr, n: usize, from: Instant) -> anyhow::Result<Duration> {
    loop {
        let objects = SimpleClient::connect(dashboard)
            .and_then(|mut c| c.get(&dashboard.to_string(), "/api/stats?history=false", true))
            .ok()
            .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
            .and_then(|v| v["cache"]["objects"].as_u64());
        if objects.is_some_and(|o| o as usize >= n) {
            return Ok(from.elapsed());
        }
        anyhow::ensure!(
            from.elapsed() < Duration::from_secs(3600),
            "not indexed within an hour"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Drops the page cache (as root): a restart then reads every entry from the disk.
fn drop_page_cache() -> bool {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// POSTs `json` to the dashboard's purge API; the answer's body.
fn post_purge(dashboard: SocketAddr, json: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(dashboard)?;
    write!(
        s,
        "POST /api/purge HTTP/1.1\r\nHost: {dashboard}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn read_pid(file: &Path) -> Option<u32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Runs the index benchmark.
pub fn bench_index(opts: Options) -> anyhow::Result<()> {
    anyhow::ensure!(opts.objects > SMALL, "--objects must be more than {SMALL}");
    let Prepared {
        bin,
        base,
        origin,
        _origin,
    } = prepare(opts.release, "bench-index")?;

    let proxy: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let dashboard: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let cache = base.join("cache");
    let pid_file = base.join("zerocache.pid");
    let config = base.join("zerocache.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {proxy}\npid_file: {}\ncache:\n  path: {}\n  max_size: 100GiB\nupstreams:\n  origin:\n    servers: [\"{origin}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: {dashboard}\nlogging:\n  level: warn\n",
            pid_file.display(),
            cache.display(),
        ),
    )?;

    let mut p = Proc(start(&bin, &config)?);
    wait_listening(proxy, &mut p.0, "zerocache")?;
    wait_listening(dashboard, &mut p.0, "zerocache dashboard")?;
    std::thread::sleep(Duration::from_millis(500));
    let empty = rss(p.0.id())?;
    fill(proxy, 0..SMALL)?;
    let small = latency(proxy, p.0.id(), SMALL, 0, true)?;
    let started = Instant::now();
    fill(proxy, SMALL..opts.objects)?;
    let fill_secs = started.elapsed().as_secs_f64();
    let full = rss(p.0.id())?;
    // Random objects as they are found, then others with their pages brought in, then the
    // first thousand again: with a million indexed, are hits on a hot set any slower?
    let found = latency(proxy, p.0.id(), opts.objects, 1, false)?;
    let warm = latency(proxy, p.0.id(), opts.objects, 2, true)?;
    let hot = latency(proxy, p.0.id(), SMALL, 0, true)?;
    let (disk_bytes, files) = disk(&cache)?;
    let n = opts.objects as f64;
    println!(
        "xtask: {} objects stored in {fill_secs:.0} s; RSS {} -> {} MB",
        opts.objects,
        empty >> 20,
        full >> 20
    );

    // A prefix purge that matches nothing: the index keeps no key text, so it reads every head.
    let from = Instant::now();
    let purged = post_purge(
        dashboard,
        &format!("{{\"prefix\": \"http://{HOST}/none/\"}}"),
    )?;
    let prefix_purge = from.elapsed();
    anyhow::ensure!(purged.contains("\"purged\":0"), "prefix purge: {purged}");

    // A crash: no snapshot, so the restart serves while its index loads from the entries, the
    // page cache dropped where this may.
    let _ = p.0.kill();
    let _ = p.0.wait();
    let cold = drop_page_cache();
    let from = Instant::now();
    let mut p = Proc(start(&bin, &config)?);
    let first_hit = until_hit(proxy, from)?;
    let indexed = until_indexed(dashboard, opts.objects, from)?;
    // A clean restart: the index written at the stop is read back.
    // SAFETY: our own child.
    unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) };
    let _ = p.0.wait();
    drop_page_cache();
    let from = Instant::now();
    let mut p = Proc(start(&bin, &config)?);
    let clean_hit = until_hit(proxy, from)?;
    let clean_indexed = until_indexed(dashboard, opts.objects, from)?;

    // An upgrade: from the signal to the successor serving, then a HIT from it.
    let old = p.0.id();
    let from = Instant::now();
    // SAFETY: our own child.
    unsafe { libc::kill(old as i32, libc::SIGUSR2) };
    let new = loop {
        if let Some(pid) = read_pid(&pid_file).filter(|p| *p != old) {
            break pid;
        }
        anyhow::ensure!(from.elapsed() < Duration::from_secs(3600), "no successor");
        std::thread::sleep(Duration::from_millis(5));
    };
    let upgraded = from.elapsed();
    let _ = p.0.wait();
    let upgrade_hit = until_hit(proxy, from)?;
    let upgrade_indexed = until_indexed(dashboard, opts.objects, from)?;
    let after = metrics(dashboard)?;
    // SAFETY: the successor this benchmark started.
    unsafe { libc::kill(new as i32, libc::SIGTERM) };
    anyhow::ensure!(
        after.contains("zerocache_cache_objects"),
        "no metrics from the successor"
    );

    let start_kind = if cold {
        "page cache dropped"
    } else {
        "page cache warm (not root)"
    };
    let table = format!(
        "| figure | value |\n|---|---|\n\
         | objects | {} |\n\
         | RAM per object (RSS {} → {} MB) | {:.0} bytes |\n\
         | disk per object ({files} files) | {:.0} bytes |\n\
         | hit p50 / p99 and CPU, {SMALL} objects stored | {} |\n\
         | the same {SMALL} objects, {} stored | {} |\n\
         | random objects of {}, their heads read, pages in the page cache | {} |\n\
         | random objects of {}, as found (pages reclaimed read from disk) | {} |\n\
         | a prefix purge (reads every head) | {:.1} s |\n\
         | restart after kill -9 to the first HIT ({start_kind}) | {:.1} s |\n\
         | restart after kill -9 to a complete index (loaded from the entries) | {:.1} s |\n\
         | restart after SIGTERM to the first HIT ({start_kind}) | {:.1} s |\n\
         | restart after SIGTERM to a complete index (the snapshot) | {:.1} s |\n\
         | SIGUSR2 upgrade to the successor serving | {:.1} s |\n\
         | SIGUSR2 upgrade to its first HIT | {:.1} s |\n\
         | SIGUSR2 upgrade to a complete index (the snapshot) | {:.1} s |\n\
         | fill through the proxy | {:.0} objects/s |\n",
        opts.objects,
        empty >> 20,
        full >> 20,
        full.saturating_sub(empty) as f64 / n,
        disk_bytes as f64 / n,
        row(&small, None),
        opts.objects,
        row(&hot, Some(&small)),
        opts.objects,
        row(&warm, Some(&small)),
        opts.objects,
        row(&found, Some(&small)),
        prefix_purge.as_secs_f64(),
        first_hit.as_secs_f64(),
        indexed.as_secs_f64(),
        clean_hit.as_secs_f64(),
        clean_indexed.as_secs_f64(),
        upgraded.as_secs_f64(),
        upgrade_hit.as_secs_f64(),
        upgrade_indexed.as_secs_f64(),
        (n - SMALL as f64) / fill_secs,
    );
    println!("{table}");
    if opts.release {
        let out = root().join("xtask/bench/results/index.md");
        let text = format!(
            "# zerocache index at {} objects\n\n`cargo xtask bench --index --objects {}` ({} UTC; {} cores). One-byte objects filled through the proxy on 4 connections; latency from one keep-alive client, one request at a time.\n\n{table}",
            opts.objects,
            opts.objects,
            utc_now(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
        std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
        println!("xtask: wrote {}", out.display());
    }
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

/// The time now, `YYYY-MM-DD HH:MM`, from `date` (the benchmark's record, not a measurement).
pub(crate) fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
