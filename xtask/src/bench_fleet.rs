//! `cargo xtask bench --fleet`: three zerocache nodes on 127.0.0.2, .3 and .4 in front of one
//! origin, acting as one cache (docs/fleet.md). Every object is warmed once through one node and
//! checked byte for byte; then client threads ask random nodes for random objects for a bounded
//! time. Reported: total requests per second, origin requests per object (1.00 when every object
//! was fetched once by the fleet), and the share of hits that were zero-copy: hits the node asked
//! served itself with sendfile, against those relayed from the owner through user space (and
//! the kernel's count of body bytes by path when the probe is attached). Writes
//! xtask/bench/results/fleet.md.

use crate::{free_port, root, run};
use anyhow::Context;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use zerocache_origin::client::SimpleClient;

/// Fleet benchmark settings.
pub struct Options {
    /// Seconds of load.
    pub duration: u64,
    /// Distinct objects.
    pub objects: usize,
    /// Bytes per object.
    pub size: usize,
    /// Client threads.
    pub clients: usize,
    /// Release binaries (debug ones otherwise: a quick check, not figures).
    pub release: bool,
}

/// A child process killed on drop.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn wait_listening(
    addr: SocketAddr,
    child: &mut Child,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("{what} exited before listening on {addr}: {status}");
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Sum of every sample of `family` in a /metrics text whose labels contain all of `with`.
fn sum(text: &str, family: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(family)
                && l[family.len()..].starts_with(['{', ' '])
                && with.iter().all(|w| l.contains(w))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

pub(crate) fn metrics(dashboard: SocketAddr) -> anyhow::Result<String> {
    let mut c = SimpleClient::connect(dashboard)?;
    let r = c.get(&dashboard.to_string(), "/metrics", true)?;
    Ok(String::from_utf8_lossy(&r.body).into_owned())
}

/// What a benchmark of real processes starts from: the binaries' directory, an empty work
/// directory, and the demo origin running.
pub(crate) struct Prepared {
    pub(crate) bin: std::path::PathBuf,
    pub(crate) base: std::path::PathBuf,
    pub(crate) origin: SocketAddr,
    pub(crate) _origin: Proc,
}

/// Builds zerocache and the origin (release unless `release` is false), empties
/// `target/<work>`, and starts the origin on a free port.
pub(crate) fn prepare(release: bool, work: &str) -> anyhow::Result<Prepared> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(&cargo);
    build.args(["build", "-p", "zerocache", "-p", "zerocache-origin"]);
    if release {
        build.arg("--release");
    }
    run(&mut build)?;
    let bin = root().join(if release {
        "target/release"
    } else {
        "target/debug"
    });
    let base = root().join("target").join(work);
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let origin: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut o = Command::new(bin.join("zerocache-origin"))
        .arg(origin.to_string())
        .stdout(Stdio::null())
        .spawn()
        .context("starting the origin")?;
    wait_listening(origin, &mut o, "origin")?;
    Ok(Prepared {
        bin,
        base,
        origin,
        _origin: Proc(o),
    })
}

/// Runs the fleet benchmark.
pub fn bench_fleet(opts: Options) -> anyhow::Result<()> {
    let Prepared {
        bin,
        base,
        origin,
        _origin,
    } = prepare(opts.release, "bench-fleet")?;

    let probe = crate::is_root();
    let nodes: Vec<(SocketAddr, SocketAddr)> = (0..3)
        .map(|i| -> anyhow::Result<_> {
            Ok((
                format!("127.0.0.{}:{}", i + 2, free_port()?).parse()?,
                format!("127.0.0.1:{}", free_port()?).parse()?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let peers = nodes
        .iter()
        .map(|(a, _)| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut procs = Vec::new();
    for (i, (addr, dash)) in nodes.iter().enumerate() {
        let dir = base.join(format!("node-{i}"));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("zerocache.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: {addr}\ncache:\n  path: {}\n  max_size: 4GiB\nupstreams:\n  origin:\n    servers: [\"{origin}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: {dash}\nprobe:\n  enabled: {probe}\nworkers:\n  count: 1\nlogging:\n  level: warn\nfleet:\n  self: {addr}\n  peers: [{peers}]\n  secret: bench-fleet-secret-0123456789\n",
                dir.join("cache").display()
            ),
        )?;
        let mut c = Command::new(bin.join("zerocache"))
            .args(["run", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .spawn()
            .context("starting a zerocache node")?;
        wait_listening(*addr, &mut c, "zerocache")?;
        wait_listening(*dash, &mut c, "zerocache dashboard")?;
        procs.push(Proc(c));
    }
    // The members must see each other before the warm-up, or it measures a partial fleet.
    std::thread::sleep(Duration::from_millis(1500));

    let path = |i: usize| format!("/obj/{}?o={i}", opts.size);
    let expected = zerocache_origin::body(opts.size);
    let started = Instant::now();
    let mut conns: Vec<SimpleClient> = nodes
        .iter()
        .map(|(a, _)| SimpleClient::connect(*a))
        .collect::<Result<_, _>>()?;
    for i in 0..opts.objects {
        let r = conns[i % 3].get("bench.example", &path(i), false)?;
        anyhow::ensure!(
            r.status == 200 && r.body == expected,
            "warm-up: {} body differs from the origin's",
            path(i)
        );
    }
    let warm = started.elapsed();
    let before: Vec<String> = nodes
        .iter()
        .map(|(_, d)| metrics(*d))
        .collect::<anyhow::Result<_>>()?;

    let done = AtomicU64::new(0);
    let bad = AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs(opts.duration);
    let load_started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..opts.clients {
            let (nodes, done, bad, expected) = (&nodes, &done, &bad, &expected);
            s.spawn(move || {
                let mut conns: Vec<Option<SimpleClient>> = vec![None, None, None];
                let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1);
                while Instant::now() < until {
                    // xorshift: which node, which object.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let n = (x % 3) as usize;
                    let i = ((x >> 8) % opts.objects as u64) as usize;
                    if conns[n].is_none() {
                        conns[n] = SimpleClient::connect(nodes[n].0).ok();
                    }
                    let ok = conns[n].as_mut().is_some_and(|c| {
                        c.get("bench.example", &path(i), false)
                            .is_ok_and(|r| r.status == 200 && r.body.len() == expected.len())
                    });
                    if ok {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        bad.fetch_add(1, Ordering::Relaxed);
                        conns[n] = None;
                    }
                }
            });
        }
    });
    let secs = load_started.elapsed().as_secs_f64();
    let after: Vec<String> = nodes
        .iter()
        .map(|(_, d)| metrics(*d))
        .collect::<anyhow::Result<_>>()?;
    let total = |f: &dyn Fn(&str) -> f64| -> f64 { after.iter().map(|m| f(m)).sum() };
    let delta =
        |f: &dyn Fn(&str) -> f64| -> f64 { total(f) - before.iter().map(|m| f(m)).sum::<f64>() };
    let origin_requests = total(&|m| {
        sum(
            m,
            "zerocache_upstream_requests_total",
            &["upstream=\"origin\""],
        )
    });
    let hits = delta(&|m| sum(m, "zerocache_requests_total", &["cache_status=\"HIT\""]));
    let peer_hits = delta(&|m| {
        sum(
            m,
            "zerocache_fleet_peer_requests_total",
            &["cache_status=\"HIT\""],
        )
    });
    let local_hits = hits - peer_hits;
    let kernel_zc = delta(&|m| {
        sum(
            m,
            "zerocache_kernel_body_bytes_total",
            &["path=\"zerocopy\""],
        )
    });
    let kernel_all = delta(&|m| sum(m, "zerocache_kernel_body_bytes_total", &[]));
    let relayed = delta(&|m| sum(m, "zerocache_fleet_relayed_body_bytes_total", &[]));
    let mut per_node = BTreeMap::new();
    for (i, m) in after.iter().enumerate() {
        per_node.insert(
            nodes[i].0.to_string(),
            sum(m, "zerocache_fleet_owned_keys", &[]),
        );
    }
    let n = done.load(Ordering::Relaxed);
    let report = format!(
        "# zerocache fleet benchmark\n\n3 nodes on 127.0.0.2-4 (1 worker each), one origin, {} objects of {} bytes, {} client threads asking random nodes for random objects for {} s after a verified warm-up ({:.1} s). {} binaries; probe {}. Machine: {} CPUs shared by the nodes, the origin and the clients.\n\n| figure | value |\n|---|---|\n| total requests/s | {:.0} |\n| failed requests | {} |\n| origin requests per object | {:.2} |\n| hits served by the node asked (sendfile) | {:.0} |\n| hits relayed from the owner (copied) | {:.0} |\n| zero-copy share of hits | {:.1}% |\n| kernel: body bytes by sendfile / all | {} |\n| body bytes relayed from owners | {:.0} |\n| keys owned per node | {:?} |\n",
        opts.objects,
        opts.size,
        opts.clients,
        opts.duration,
        warm.as_secs_f64(),
        if opts.release { "release" } else { "debug" },
        if probe { "attached" } else { "off (not root)" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        n as f64 / secs,
        bad.load(Ordering::Relaxed),
        origin_requests / opts.objects as f64,
        local_hits,
        peer_hits,
        100.0 * local_hits / hits.max(1.0),
        if kernel_all > 0.0 {
            format!("{:.1}%", 100.0 * kernel_zc / kernel_all)
        } else {
            "n/a (probe off)".into()
        },
        relayed,
        per_node,
    );
    println!("{report}");
    let out = root().join("xtask/bench/results/fleet.md");
    std::fs::create_dir_all(out.parent().context("results dir")?)?;
    std::fs::write(&out, &report)?;
    println!("xtask: wrote {}", out.display());
    drop(procs);
    Ok(())
}
