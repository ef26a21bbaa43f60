//! `cargo xtask bench --against REV`: this checkout's zerocache against another commit's, on the
//! same objects, in one run, so a change's cost is a ratio measured side by side rather than two
//! figures from two days of a shared machine.
//!
//! REV is checked out into `target/against/src` (`git worktree`) and built in release there, with
//! its own target directory (`target/against/target`, kept between runs, so a second run against
//! the same commit builds nothing). Both binaries run at once, each with its own port and cache
//! directory, the probe off (what is measured is the request path, and the tracepoints would tax
//! both); each is warmed and its warm bodies checked byte for byte. Then wrk drives one at a time,
//! alternating which goes first, `--reps` times per size: medians of req/s and of CPU per request
//! (from /proc schedstat), and the median of the ratios rep by rep (two adjacent runs see the
//! same machine, so the paired ratio cancels the drift that moves both: the figure to quote), go
//! to `xtask/bench/results/against.md`.

use crate::bench::{Server, cpu_ns, median, pids, size_name, start_origin, warm, wrk};
use crate::{free_port, root, run};
use anyhow::Context;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Instant;

/// Sizes compared when `--sizes` is not given: the two the hit path's cost shows in.
const SIZES: [usize; 2] = [1024, 65_536];

/// A running zerocache binary.
pub(crate) struct Proxy {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds `rev` in its own worktree and returns its release binary.
fn build_rev(rev: &str) -> anyhow::Result<(PathBuf, String)> {
    let base = root().join("target/against");
    let src = base.join("src");
    let commit = git_out(&["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .with_context(|| format!("{rev} is not a commit here"))?;
    if src.exists() {
        run(Command::new("git")
            .arg("-C")
            .arg(&src)
            .args(["checkout", "-q", "--detach", &commit]))?;
    } else {
        std::fs::create_dir_all(&base)?;
        run(Command::new("git")
            .arg("-C")
            .arg(root())
            .args(["worktree", "add", "-q", "--detach"])
            .arg(&src)
            .arg(&commit))?;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("xtask: bench --against: building {commit} (its own target directory)");
    run(Command::new(&cargo)
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", base.join("target"))
        .args(["build", "--release", "-p", "zerocache"]))?;
    Ok((base.join("target/release/zerocache"), commit))
}

fn git_out(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root())
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Starts `bin` in `dir` in front of `origin`, the probe off; `route_yaml` goes on in the one
/// route (its `rules:`, for `bench --rules`).
pub(crate) fn start(
    bin: &Path,
    dir: &Path,
    origin: SocketAddr,
    route_yaml: &str,
    pinned: bool,
) -> anyhow::Result<Proxy> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let port = free_port()?;
    let dport = free_port()?;
    let conf = dir.join("zerocache.yaml");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\ncache:\n  path: {}\n  max_size: 4GiB\nupstreams:\n  origin:\n    servers: [\"{origin}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\n{route_yaml}dashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: false\nlogging:\n  level: warn\n",
            dir.join("cache").display()
        ),
    )?;
    // Pinned: the proxy on CPU 0 alone (so one worker), wrk on CPU 1 (`measured_run`), neither
    // scheduled on the other's core.
    let mut cmd = if pinned {
        let mut c = Command::new("taskset");
        c.args(["-c", "0"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    let child = cmd
        .args(["run", "--config"])
        .arg(&conf)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut p = Proxy { child, addr };
    crate::bench::wait_listening(addr, &mut p.child, "zerocache")?;
    Ok(p)
}

/// Runs the comparison and writes `xtask/bench/results/against.md`.
pub fn bench_against(rev: &str, duration: u64, reps: usize, sizes: &[usize]) -> anyhow::Result<()> {
    let sizes: Vec<usize> = if sizes.is_empty() {
        SIZES.to_vec()
    } else {
        sizes.to_vec()
    };
    let (theirs_bin, theirs) = build_rev(rev)?;
    crate::bench::build_release()?;
    let ours = git_out(&["rev-parse", "HEAD"])?;
    let dirty = !git_out(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    let base = root().join("target/bench-against");
    let origin = start_origin()?;
    let mine = start(
        &root().join("target/release/zerocache"),
        &base.join("ours"),
        origin.addr,
        "",
        false,
    )?;
    let other = start(&theirs_bin, &base.join("theirs"), origin.addr, "", false)?;
    warm(mine.addr, Server::Zerocache, &sizes)?;
    warm(other.addr, Server::Zerocache, &sizes)?;
    println!("xtask: bench --against: both warm, bodies checked");
    let started = Instant::now();
    // samples[0] ours, [1] theirs; per size: (req/s, CPU µs per request).
    let mut samples = vec![vec![Vec::<(f64, f64)>::new(); sizes.len()]; 2];
    for rep in 0..reps {
        for k in 0..2 {
            // Alternated, so neither always runs first.
            let which = (k + rep) % 2;
            let p = if which == 0 { &mine } else { &other };
            for (i, &size) in sizes.iter().enumerate() {
                let (s, per_req) = measured_run(p, size, duration, false)?;
                println!(
                    "xtask: bench --against: rep {} {:<6} {:>8} {:>10.0} req/s {:>7.1} µs CPU/req errors {}",
                    rep + 1,
                    if which == 0 { "ours" } else { "theirs" },
                    size_name(size),
                    s.rps,
                    per_req,
                    s.errors
                );
                anyhow::ensure!(s.errors == 0, "errors in a run: the figures would lie");
                samples[which][i].push((s.rps, per_req));
            }
        }
    }
    let mut r = String::new();
    writeln!(
        r,
        "# This checkout against another commit: `cargo xtask bench --against`\n"
    )?;
    writeln!(
        r,
        "{} UTC. Ours: {}{}; theirs: {theirs} ({rev}). Machine: {} cores. Both binaries running at once, the probe off, each warmed and checked; wrk -t2 -c32 (-c8 for 1 MB and up) on loopback, {duration} s per run after 1 s of warm-up, {reps} repetitions alternating which goes first, medians. CPU from /proc/PID/task/*/schedstat over the run. Took {:.0} s.\n",
        crate::bench_index::utc_now(),
        &ours[..12.min(ours.len())],
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        },
        std::thread::available_parallelism().map_or(2, |n| n.get()),
        started.elapsed().as_secs_f64()
    )?;
    writeln!(
        r,
        "| size | ours req/s | theirs req/s | req/s, ours ÷ theirs, paired | ours CPU µs/req | theirs CPU µs/req | CPU per request, ours ÷ theirs, paired |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        let med =
            |w: usize, f: fn(&(f64, f64)) -> f64| median(samples[w][i].iter().map(f).collect());
        let (or, tr) = (med(0, |s| s.0), med(1, |s| s.0));
        let (oc, tc) = (med(0, |s| s.1), med(1, |s| s.1));
        let paired = |f: fn(&(f64, f64)) -> f64| {
            median(
                samples[0][i]
                    .iter()
                    .zip(&samples[1][i])
                    .map(|(o, t)| f(o) / f(t).max(1e-9))
                    .collect(),
            )
        };
        writeln!(
            r,
            "| {} | {or:.0} | {tr:.0} | {:.2}× | {oc:.1} | {tc:.1} | {:.2}× |",
            size_name(size),
            paired(|s| s.0),
            paired(|s| s.1)
        )?;
    }
    write_result("against", &r)
}

/// One measured run on `p`: 1 s of warm-up, then `duration` s of wrk on `size`-byte objects;
/// its figures and the proxy's CPU µs per request (from /proc schedstat over the run).
pub(crate) fn measured_run(
    p: &Proxy,
    size: usize,
    duration: u64,
    pinned: bool,
) -> anyhow::Result<(crate::bench::Sample, f64)> {
    let server_pids = pids(p.child.id());
    wrk(p.addr, size, 1, pinned, &server_pids, None)?;
    let before = cpu_ns(&server_pids);
    let s = wrk(p.addr, size, duration, pinned, &server_pids, None)?;
    let cpu_s = cpu_ns(&server_pids).saturating_sub(before) as f64 / 1e9;
    let per_req = cpu_s * 1e6 / (s.rps * duration as f64).max(1.0);
    Ok((s, per_req))
}

/// Writes `xtask/bench/results/NAME.md` and prints it.
pub(crate) fn write_result(name: &str, report: &str) -> anyhow::Result<()> {
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join(format!("{name}.md")), report)?;
    println!("\n{report}");
    println!("xtask: bench --{name}: written to xtask/bench/results/{name}.md");
    Ok(())
}
