//! `cargo xtask fuzz [--time S] [--target NAME]`: the libFuzzer targets in `proxy/fuzz`, built by
//! cargo-fuzz with the nightly toolchain (AddressSanitizer, debug assertions and overflow checks
//! on), each run for S seconds (default 60). `cargo xtask test` runs each for 15 s after the test
//! suite. `cargo xtask setup` installs cargo-fuzz.
//!
//! The targets (`proxy/fuzz/fuzz_targets/`, properties in `proxy/src/fuzzing.rs`):
//!
//! | target          | what it feeds                                                       |
//! |-----------------|---------------------------------------------------------------------|
//! | `request_head`  | `http::request::parse` with the default limits                      |
//! | `chunked`       | `ChunkedDecoder::decode`, whole and split in two (same result)      |
//! | `response_head` | `http::response::parse`, then `.framing(false)` / `.framing(true)`  |
//! | `cache_entry`   | `cache::entry::Meta::decode` (round trip) and `read_header` on a file |
//! | `cache_fields`  | `http::date::parse` (round trip), `cache::targeted::parse`, `Vary` and Accept-Encoding normalisation (idempotent) |
//! | `config`        | `zerocache_config::parse` on UTF-8 input                            |
//! | `proxy_header`  | `net::proxy_protocol::parse`: within bounds, prefixes incomplete    |
//! | `h2_request`    | `server::h2::request::to_request` against `request::parse` of the same head as HTTP/1.1: the same request, or the same status |
//! | `edge_rules`    | `cache::rules` on a parsed request: idempotent query, fields that are fields, an upstream request that parses again |
//! | `ranges`        | `range::answer`/`range::set` inside the body and agreeing, `Slicing::first_wanted`, the multipart framing, `slice::judge` of a hostile `Content-Range` |
//!
//! # Where things go
//!
//! - `proxy/fuzz/corpus/<target>/`: the committed seeds, read-only to the runs.
//! - `proxy/fuzz/target/corpus/<target>/`: libFuzzer's working corpus: the committed seeds plus
//!   every input it found that reached new code. It is kept between runs, so a campaign resumes
//!   where the last one stopped; delete it to start from the seeds again.
//! - `proxy/fuzz/artifacts/<target>/`: crashing (`crash-*`), hanging (`timeout-*`, over 25 s) and
//!   memory-hungry (`oom-*`) inputs.
//! - `proxy/fuzz/target/logs/<target>.log`: libFuzzer's whole output for the last run.
//!
//! All three are git-ignored, so a run never dirties the checkout. The crate has its own
//! `Cargo.lock` and `target/`, outside the workspace, so its sanitizer build never invalidates
//! the main one.
//!
//! # A long campaign
//!
//! ```text
//! cargo xtask fuzz --time 3600 --target request_head        # an hour on one target
//! cargo xtask fuzz --time 3600 --target chunked --verbose   # the same, echoing libFuzzer
//! cargo xtask fuzz --time 3600 --target config -- -fork=4   # libFuzzer flags after `--`
//! ```
//!
//! Parallel workers on a bigger machine, and the working corpus trimmed to a minimal set with
//! the same coverage afterwards (run from `proxy/`):
//!
//! ```text
//! cargo +nightly fuzz run request_head fuzz/target/corpus/request_head fuzz/corpus/request_head -- -max_total_time=3600 -fork=8
//! cargo +nightly fuzz cmin request_head fuzz/target/corpus/request_head
//! ```
//!
//! # When it finds a crash
//!
//! The run fails naming the target, the artifact and its bytes in hex, with the panic message.
//! Then, from `proxy/`:
//!
//! 1. Reproduce it (runs the one input, prints the panic with a backtrace):
//!    `RUST_BACKTRACE=1 cargo +nightly fuzz run chunked fuzz/artifacts/chunked/crash-<sha1>`
//! 2. Minimize it: `cargo +nightly fuzz tmin chunked fuzz/artifacts/chunked/crash-<sha1>`
//!    (writes `minimized-from-*` beside it and prints its path).
//! 3. Fix the bug, with a unit test in the module that had it, built from the minimized bytes
//!    (`#[test] fn regression_<what>() { ... }`, e.g. in `proxy/src/http/chunked.rs`).
//! 4. Add the minimized input to the committed corpus under a name that says what it is,
//!    e.g. `cp fuzz/artifacts/chunked/minimized-from-* fuzz/corpus/chunked/regress-bare-cr-split`:
//!    every fuzz run starts by executing every seed, so `cargo xtask test` fails if it comes
//!    back. `cargo test -p zerocache --features fuzzing --lib fuzzing` replays the proxy
//!    targets' corpus on stable too, without libFuzzer.

use crate::root;
use anyhow::Context;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Every target, in the order they run.
pub const TARGETS: &[&str] = &[
    "request_head",
    "chunked",
    "response_head",
    "cache_entry",
    "cache_fields",
    "config",
    "proxy_header",
    "h2_request",
    "edge_rules",
    "ranges",
];

/// libFuzzer's per-input time limit: a hang is reported (as a `timeout-*` artifact) instead of
/// stalling the run.
const INPUT_TIMEOUT_SECS: u64 = 25;

fn fuzz_dir() -> PathBuf {
    root().join("proxy/fuzz")
}

/// `cargo +nightly fuzz <args>` in `proxy/fuzz`'s parent, with nothing inherited from the stable
/// cargo running xtask that could send the build to another toolchain or target dir.
fn cargo_fuzz() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["+nightly", "fuzz"])
        .current_dir(root().join("proxy"));
    for var in [
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Builds every target (the first time, the whole dependency tree with sanitizers: minutes).
pub fn build() -> anyhow::Result<()> {
    anyhow::ensure!(
        crate::setup::cargo_fuzz_ok(),
        "cargo-fuzz is not installed: run `cargo xtask setup`"
    );
    let started = Instant::now();
    let mut cmd = cargo_fuzz();
    cmd.args(["build", "--fuzz-dir", "fuzz"]);
    println!("xtask: $ (cd proxy && cargo +nightly fuzz build --fuzz-dir fuzz)");
    let status = cmd.status().context("running cargo +nightly fuzz build")?;
    anyhow::ensure!(
        status.success(),
        "building the fuzz targets failed ({status})"
    );
    println!(
        "xtask: fuzz targets built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The host triple, which cargo-fuzz builds for (`--target`).
fn host_triple() -> anyhow::Result<String> {
    let out = Command::new("rustc")
        .args(["+nightly", "-vV"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .context("running rustc +nightly -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .context("no host line in `rustc +nightly -vV`")
}

/// The libFuzzer binary of `target`, as `cargo fuzz build` leaves it.
fn binary(target: &str) -> anyhow::Result<PathBuf> {
    let bin = fuzz_dir()
        .join("target")
        .join(host_triple()?)
        .join("release")
        .join(target);
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: `cargo +nightly fuzz build` did not build it",
        bin.display()
    );
    Ok(bin)
}

/// How one target's run ended.
pub struct Outcome {
    pub target: &'static str,
    /// Inputs executed (libFuzzer's `Done N runs`, or its last status line after a crash).
    pub runs: u64,
    pub secs: f64,
    /// Why it failed, with the artifact, if it did.
    pub failure: Option<String>,
}

/// Runs one target for `secs` seconds.
pub fn run_target(
    target: &'static str,
    secs: u64,
    verbose: bool,
    extra: &[String],
) -> anyhow::Result<Outcome> {
    let dir = fuzz_dir();
    let work = dir.join("target/corpus").join(target);
    let seeds = dir.join("corpus").join(target);
    let artifacts = dir.join("artifacts").join(target);
    let logs = dir.join("target/logs");
    for d in [&work, &artifacts, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let log_path = logs.join(format!("{target}.log"));
    let mut log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;

    // The binary `build` made, run directly (as `cargo fuzz run` would, less its rebuild check):
    // every target then runs the same build, and the output is libFuzzer's alone.
    let bin = binary(target)?;
    let mut cmd = Command::new(&bin);
    let asan = std::env::var("ASAN_OPTIONS").unwrap_or_default();
    cmd.current_dir(&dir)
        // What cargo-fuzz sets: Rust's statics trip ASan's ODR check.
        .env("ASAN_OPTIONS", format!("detect_odr_violation=0:{asan}"))
        // New inputs go to the first corpus dir; the committed seeds are only read.
        .arg(&work)
        .arg(&seeds)
        .arg(format!("-max_total_time={secs}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    println!("xtask: fuzz {target}: {secs} s (log: {})", shown(&log_path));
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;

    // libFuzzer writes to stderr; a target's stdout is kept in the log too.
    let stdout = child.stdout.take().context("stdout")?;
    let out_thread = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut lines = Vec::new();
    let stderr = child.stderr.take().context("stderr")?;
    let mut stderr = BufReader::new(stderr);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if stderr.read_until(b'\n', &mut raw)? == 0 {
            break;
        }
        // A harness's panic message may quote the input: not necessarily UTF-8.
        let line = String::from_utf8_lossy(&raw)
            .trim_end_matches(['\r', '\n'])
            .to_string();
        writeln!(log, "{line}")?;
        if verbose {
            eprintln!("{line}");
        }
        lines.push(line);
    }
    let status = child.wait()?;
    let out_lines = out_thread.join().unwrap_or_default();
    for line in &out_lines {
        writeln!(log, "{line}")?;
    }
    let secs_taken = started.elapsed().as_secs_f64();

    let runs = done_runs(&lines)
        .or_else(|| last_status_runs(&lines))
        .unwrap_or(0);
    let artifact = lines
        .iter()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .map(PathBuf::from);
    let failure = if status.success() && artifact.is_none() {
        if done_runs(&lines).is_none() {
            Some(format!(
                "{target}: libFuzzer ended without its `Done N runs` line; see {}",
                shown(&log_path)
            ))
        } else {
            None
        }
    } else {
        Some(describe_failure(
            target,
            status,
            artifact.as_deref(),
            &lines,
            &log_path,
        ))
    };
    Ok(Outcome {
        target,
        runs,
        secs: secs_taken,
        failure,
    })
}

/// `Done 123456 runs in 15 second(s)`.
fn done_runs(lines: &[String]) -> Option<u64> {
    lines.iter().rev().find_map(|l| {
        l.trim()
            .strip_prefix("Done ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// `#123456\tpulse  cov: ...`: the last count libFuzzer printed before it stopped.
fn last_status_runs(lines: &[String]) -> Option<u64> {
    lines.iter().rev().find_map(|l| {
        l.strip_prefix('#')?
            .split(|c: char| c.is_whitespace())
            .next()?
            .parse()
            .ok()
    })
}

fn shown(p: &Path) -> String {
    p.strip_prefix(root())
        .map(|r| r.display().to_string())
        .unwrap_or_else(|_| p.display().to_string())
}

fn describe_failure(
    target: &str,
    status: std::process::ExitStatus,
    artifact: Option<&Path>,
    lines: &[String],
    log: &Path,
) -> String {
    let mut s = format!("fuzz target {target} failed ({status})");
    if let Some(kind) = lines
        .iter()
        .find_map(|l| l.split_once("ERROR: libFuzzer: ").map(|(_, k)| k.trim()))
    {
        s += &format!(": libFuzzer: {kind}");
    }
    // The panic message and where it came from.
    if let Some(at) = lines.iter().position(|l| l.contains("panicked at")) {
        for l in lines[at..].iter().take(6) {
            if l.starts_with("note:") || l.starts_with("==") || l.starts_with("stack backtrace") {
                break;
            }
            s += &format!("\n    {l}");
        }
    } else if let Some(at) = lines
        .iter()
        .position(|l| l.contains("ERROR: AddressSanitizer"))
    {
        for l in lines[at..].iter().take(8) {
            s += &format!("\n    {l}");
        }
    }
    match artifact {
        Some(a) => {
            s += &format!("\n  crash artifact: {}", shown(a));
            if let Ok(bytes) = std::fs::read(a) {
                let hex: String = bytes.iter().take(256).map(|b| format!("{b:02x}")).collect();
                let more = if bytes.len() > 256 { "..." } else { "" };
                s += &format!("\n  input ({} bytes, hex): {hex}{more}", bytes.len());
            }
            s += &format!(
                "\n  reproduce: (cd proxy && RUST_BACKTRACE=1 cargo +nightly fuzz run {target} {})",
                a.strip_prefix(root().join("proxy")).unwrap_or(a).display()
            );
        }
        None => s += "\n  no crash artifact was written",
    }
    s += &format!("\n  log: {}", shown(log));
    s
}

/// Builds, then runs `targets` for `secs` seconds each, printing one line per target with the
/// number of runs; every target runs even after one fails.
pub fn run_all(
    targets: &[&'static str],
    secs: u64,
    verbose: bool,
    extra: &[String],
) -> anyhow::Result<Vec<Outcome>> {
    build()?;
    let mut outcomes = Vec::new();
    for &t in targets {
        let o = run_target(t, secs, verbose, extra)?;
        match &o.failure {
            None => println!(
                "xtask: fuzz {}: {} runs in {:.0} s, no crash",
                o.target, o.runs, o.secs
            ),
            Some(why) => println!(
                "xtask: fuzz {}: FAILED after {} runs in {:.0} s: {why}",
                o.target, o.runs, o.secs
            ),
        }
        outcomes.push(o);
    }
    Ok(outcomes)
}

/// `cargo xtask fuzz`.
pub fn fuzz(
    secs: u64,
    target: Option<String>,
    verbose: bool,
    extra: &[String],
) -> anyhow::Result<()> {
    anyhow::ensure!(secs > 0, "--time must be at least 1 second");
    let targets: Vec<&'static str> = match target {
        None => TARGETS.to_vec(),
        Some(name) => vec![
            TARGETS
                .iter()
                .copied()
                .find(|t| *t == name)
                .with_context(|| {
                    format!("no fuzz target `{name}`; targets: {}", TARGETS.join(", "))
                })?,
        ],
    };
    let outcomes = run_all(&targets, secs, verbose, extra)?;
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.failure.is_some())
        .map(|o| o.target)
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "fuzz target(s) failed: {} (artifacts under proxy/fuzz/artifacts/)",
        failed.join(", ")
    );
    Ok(())
}
