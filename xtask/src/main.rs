//! `cargo xtask setup|demo|test|bench|fuzz|soak|package|vm-test`: everything a fresh machine needs, in the
//! project's own code, so CI and the next developer start from the same place with no manual step.

mod bench;
mod bench_against;
mod bench_fleet;
mod bench_h2;
mod bench_h2_data;
mod bench_index;
mod bench_instructions;
mod bench_rules;
mod bench_slices;
mod bench_tls;
mod bench_watch;
mod demo;
mod demo_seeds;
mod fuzz;
mod image;
mod package;
mod setup;
mod soak;
mod vm;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

#[derive(Parser)]
#[command(name = "xtask", about = "zerocache's project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the project needs (idempotent; fast when everything is there).
    Setup,
    /// Build, start an origin, zerocache with the probe and the dashboard, drive traffic.
    Demo {
        /// Stop after this many seconds instead of waiting for Ctrl-C.
        #[arg(long)]
        duration: Option<u64>,
        /// Instead of the proxy: the seed servers (Python, nginx, Go, Java, each serving one file
        /// the zero-copy way and the copying way) under `zerocache watch`, dashboard on
        /// 127.0.0.1:9181.
        #[arg(long)]
        seeds: bool,
    },
    /// Setup, then formatting, lints, the whole test suite, a 20-second soak with faults
    /// injected, and a short run of every fuzz target. As root (CI) every test runs and a test
    /// that would skip for want of root, a CPU, Chromium or a tool fails instead
    /// (ZEROCACHE_REQUIRE_PRIVILEGED=1); without root those are skipped and listed at the end.
    Test {
        /// Seconds per fuzz target after the test suite (0 skips fuzzing).
        #[arg(long, default_value_t = 15)]
        fuzz_time: u64,
        /// Skip the kernel matrix (`vm-test` on 5.10, 6.1 and 6.12), which runs last, as root.
        #[arg(long)]
        no_vm: bool,
    },
    /// Setup, then run the libFuzzer targets in proxy/fuzz (nightly, cargo-fuzz); fails naming
    /// the target and the crash artifact if any crashes. See xtask/src/fuzz.rs for campaigns.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        time: u64,
        /// Only this target (request_head, chunked, response_head, cache_entry, cache_fields, config).
        #[arg(long)]
        target: Option<String>,
        /// Echo libFuzzer's output (it always goes to proxy/fuzz/target/logs/<target>.log).
        #[arg(long)]
        verbose: bool,
        /// Extra libFuzzer flags, after `--` (e.g. `-- -fork=4 -max_len=65536`).
        #[arg(last = true)]
        libfuzzer_args: Vec<String>,
    },
    /// Benchmark zerocache against nginx proxy_cache on this machine; writes
    /// xtask/bench/results/latest.md (pinned.md, affinity.md, unpinned.md, cold.md or burst.md in
    /// those modes).
    Bench {
        /// Seconds per wrk run.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Repetitions, in rotated server order (medians are reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Pin wrk to CPU 1 and the servers to CPU 0.
        #[arg(long)]
        pin: bool,
        /// Only these object sizes in bytes (comma-separated); all by default.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Pin every server's workers one per CPU (zerocache workers.cpu_affinity: true, nginx
        /// worker_cpu_affinity auto); writes xtask/bench/results/affinity.md.
        #[arg(long)]
        affinity: bool,
        /// Leave every server's workers unpinned (zerocache workers.cpu_affinity: false, nginx's
        /// default); writes xtask/bench/results/unpinned.md.
        #[arg(long)]
        unpinned: bool,
        /// The cold-cache mode: hot 1 KiB hits beside cold 16 MiB hits, offload on and off.
        #[arg(long)]
        cold: bool,
        /// The burst mode: 1 KiB hits while 500 connections fetch a 16 MiB hit, zerocache and
        /// nginx proxy_cache; writes xtask/bench/results/burst.md. Uses --reps.
        #[arg(long)]
        burst: bool,
        /// zerocache against nginx proxy_cache, both serving clients over TLS (1 KiB to 16 MiB,
        /// and a handshake per request); writes xtask/bench/results/tls.md.
        #[arg(long)]
        tls: bool,
        /// With --tls: HTTP/2 (h2load) against nginx `listen ... ssl http2`, and zerocache's own
        /// HTTP/1.1 with the same client; writes xtask/bench/results/h2.md.
        #[arg(long, requires = "tls")]
        h2: bool,
        /// Only the watch-mode probe cost per syscall (watched and unwatched); writes
        /// xtask/bench/results/watch-cost.md. The full run appends the same section.
        #[arg(long)]
        watch_cost: bool,
        /// The fleet mode: three nodes on loopback acting as one cache (xtask/src/bench_fleet.rs);
        /// writes xtask/bench/results/fleet.md. Uses --duration.
        #[arg(long)]
        fleet: bool,
        /// With --fleet or --index: debug binaries, for a quick check of the harness (no figures
        /// to quote).
        #[arg(long)]
        debug: bool,
        /// The index mode: one proxy filled with --objects one-byte objects through its front
        /// door; RAM and disk per object, hit latency against a nearly empty cache, restart and
        /// upgrade to the first HIT (xtask/src/bench_index.rs); writes
        /// xtask/bench/results/index.md.
        #[arg(long)]
        index: bool,
        /// With --index: how many objects.
        #[arg(long, default_value_t = 1_000_000)]
        objects: usize,
        /// This checkout's zerocache against the one built from commit REV, both running at once
        /// on the same objects, wrk alternating between them (1 KiB and 64 KiB unless --sizes);
        /// writes xtask/bench/results/against.md. Uses --duration, --reps and --sizes.
        #[arg(long, value_name = "REV")]
        against: Option<String>,
        /// What edge rules cost a 1 KiB HIT: no rules, 20 that never match, and 21 with one
        /// matching that sets two fields, three proxies of one binary side by side
        /// (xtask/src/bench_rules.rs); writes xtask/bench/results/rules.md. Uses --duration
        /// and --reps.
        #[arg(long)]
        rules: bool,
        /// Large objects in slices: a 1 GiB object read as random 2 MiB ranges by 8 clients
        /// through zerocache `slice: 4MiB` and nginx `slice 4m;`, a cold pass and a warm one;
        /// origin bytes, throughput and CPU per GB (xtask/src/bench_slices.rs); writes
        /// xtask/bench/results/slices.md.
        #[arg(long)]
        slices: bool,
        /// HTTP/2 DATA by sendfile against copied, gathered writes, on a prototype h2c server
        /// that owns its write side (xtask/src/bench_h2_data.rs), at 16 KiB and 1 MiB frames;
        /// writes xtask/bench/results/h2-data.md. Uses --duration and --reps.
        #[arg(long)]
        h2_data: bool,
    },
    /// Build the Debian package: target/debian/zerocache_<version>_amd64.deb (stripped binary,
    /// systemd unit, /etc/zerocache/zerocache.yaml, logrotate snippet, docs) and its debug symbols
    /// in zerocache-dbgsym_<version>_amd64.ddeb. Install with `dpkg -i`.
    Package,
    /// Build the OCI image with buildah, without a daemon: target/image/zerocache_<version>.oci.tar
    /// (the stripped binary and the libraries it links on an empty base, running as uid 65534,
    /// the cache a volume). `podman load -i` it, or `skopeo copy oci-archive:... docker://...`.
    Image,
    /// A verified soak of the real binary: client threads check every byte while faults are
    /// injected on a schedule (origin killed, truncating, stalling; cache files truncated and
    /// flipped; SIGHUP storms); prints one table, fails on a corrupt body, an unexpected error or
    /// a dead proxy. See xtask/src/soak.rs.
    Soak {
        /// Seconds of traffic.
        #[arg(long, default_value_t = 60)]
        duration: u64,
        /// Client threads.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Seed of every random choice (ops, objects, ranges, fault order, damaged files).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Load the eBPF probe (root only; off otherwise).
        #[arg(long)]
        probe: bool,
        /// Run the debug binary instead of the release one.
        #[arg(long)]
        debug: bool,
    },
    /// Run the probe's tests (and the proxy's zero_copy ones) inside VMs booting Debian's own
    /// kernels (virtme-ng, QEMU), one boot per kernel; prints a kernel × test table and each
    /// kernel's time. Fails when a test fails on a kernel expected to pass. See xtask/src/vm/.
    VmTest {
        /// Which kernels: 5.10, 6.1, 6.12 (comma-separated) or all.
        #[arg(long, default_value = "all")]
        kernel: String,
        /// Use KVM instead of TCG (software emulation): nested KVM hangs guests on some hosts.
        #[arg(long, env = "ZEROCACHE_VM_KVM")]
        kvm: bool,
        /// Minutes one kernel's boot and test run may take before QEMU is killed.
        #[arg(long, default_value_t = 20)]
        timeout: u64,
        /// Only tests whose name contains one of these, or whose binary is one of these, after
        /// `--` (e.g. `-- self_counts zero_copy::sendfile`).
        #[arg(last = true)]
        filters: Vec<String>,
    },
}

/// A port free right now on loopback.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs a command in the workspace root, echoing it; fails with its name on a non-zero exit.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    println!("xtask: $ {shown}");
    let status = cmd.current_dir(root()).status()?;
    anyhow::ensure!(status.success(), "`{shown}` failed ({status})");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Setup => setup::setup(),
        Task::Demo { duration, seeds } => setup::setup().and_then(|_| {
            if seeds {
                demo_seeds::demo_seeds(duration)
            } else {
                demo::demo(duration)
            }
        }),
        Task::Test { fuzz_time, no_vm } => {
            let require = require_privileged();
            setup::setup_for_tests(require).and_then(|_| test(fuzz_time, require, !no_vm))
        }
        Task::Fuzz {
            time,
            target,
            verbose,
            libfuzzer_args,
        } => setup::setup().and_then(|_| fuzz::fuzz(time, target, verbose, &libfuzzer_args)),
        Task::Bench {
            against: Some(rev),
            duration,
            reps,
            sizes,
            ..
        } => setup::setup()
            .and_then(|_| bench_against::bench_against(&rev, duration, reps, &sizes)),
        Task::Bench {
            h2_data: true,
            duration,
            reps,
            ..
        } => setup::setup().and_then(|_| bench_h2_data::bench_h2_data(duration, reps)),
        Task::Bench { slices: true, .. } => {
            setup::setup().and_then(|_| bench_slices::bench_slices())
        }
        Task::Bench {
            rules: true,
            duration,
            reps,
            ..
        } => setup::setup().and_then(|_| bench_rules::bench_rules(duration, reps)),
        Task::Bench {
            index: true,
            objects,
            debug,
            ..
        } => setup::setup().and_then(|_| {
            bench_index::bench_index(bench_index::Options {
                objects,
                release: !debug,
            })
        }),
        Task::Bench {
            duration,
            fleet: true,
            debug,
            ..
        } => setup::setup().and_then(|_| {
            bench_fleet::bench_fleet(bench_fleet::Options {
                duration,
                objects: 300,
                size: 16 * 1024,
                clients: 4,
                release: !debug,
            })
        }),
        Task::Bench {
            duration,
            reps,
            pin,
            sizes,
            affinity,
            unpinned,
            cold,
            tls: true,
            h2,
            ..
        } => setup::setup().and_then(|_| {
            anyhow::ensure!(
                !(pin || affinity || unpinned || cold) && sizes.is_empty(),
                "--tls runs its own sizes with default placement: no --pin, --affinity, --unpinned, --cold or --sizes"
            );
            if h2 {
                bench_h2::bench_h2(duration, reps)
            } else {
                bench_tls::bench_tls(duration, reps)
            }
        }),
        Task::Bench {
            duration,
            reps,
            pin,
            sizes,
            affinity,
            unpinned,
            cold,
            burst,
            tls: false,
            watch_cost,
            ..
        } => setup::setup().and_then(|_| {
            bench::bench(bench::Options {
                duration,
                reps,
                pin,
                sizes,
                affinity,
                unpinned,
                cold,
                burst,
                watch_cost,
            })
        }),
        Task::Package => setup::setup().and_then(|_| package::package().map(|_| ())),
        Task::Image => setup::setup().and_then(|_| image::image().map(|_| ())),
        Task::Soak {
            duration,
            clients,
            seed,
            probe,
            debug,
        } => setup::setup().and_then(|_| {
            soak::soak(soak::Options {
                duration,
                clients,
                seed,
                probe,
                release: !debug,
                prebuilt: false,
            })
        }),
        Task::VmTest {
            kernel,
            kvm,
            timeout,
            filters,
        } => setup::setup().and_then(|_| {
            vm::vm_test(vm::Options {
                kernel,
                filters,
                kvm,
                timeout: std::time::Duration::from_secs(timeout * 60),
                heavy_on: None,
                heavy_tests_on: None,
            })
            .map(|_| ())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Set to `1` for the test suite, it turns every skip for want of root, a second CPU, Chromium or
/// a tool into a failure (proxy/tests/it/support/require.rs).
const REQUIRE_PRIVILEGED: &str = "ZEROCACHE_REQUIRE_PRIVILEGED";

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a skip for want of a privilege fails the run: always as root (CI, which must not pass
/// by skipping), otherwise only when `ZEROCACHE_REQUIRE_PRIVILEGED=1` is set explicitly.
fn require_privileged() -> bool {
    is_root() || std::env::var(REQUIRE_PRIVILEGED).is_ok_and(|v| v == "1")
}

/// A line a gated test prints when it skips: `skipped <test>: needs <what>`.
fn is_skip_line(line: &str) -> bool {
    line.starts_with("skipped ") && line.contains(": needs ")
}

fn test(fuzz_time: u64, require: bool, vm: bool) -> anyhow::Result<()> {
    if !require {
        println!(
            "xtask: not root: the tests that need root (the eBPF probe, tmpfs, setpriv, dpkg, SCHED_FIFO) \
             are skipped and listed at the end; set {REQUIRE_PRIVILEGED}=1 to fail on them instead"
        );
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo).args(["fmt", "--all", "--check"]))?;
    run(Command::new(&cargo).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Echo cargo's output and add up its per-binary results, so the run ends with one total
    // rather than the last doc-test binary's "0 passed". The tests' stderr is echoed too, and
    // the skip lines of gated tests kept for the summary.
    let mut cmd = Command::new(&cargo);
    cmd.args(["test", "--workspace"]);
    let mut skipped: Vec<String> = Vec::new();
    if require {
        cmd.env(REQUIRE_PRIVILEGED, "1");
        println!("xtask: $ {REQUIRE_PRIVILEGED}=1 cargo test --workspace");
    } else {
        cmd.env_remove(REQUIRE_PRIVILEGED);
        println!("xtask: $ cargo test --workspace");
    }
    let mut child = cmd
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().map(|err| {
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut skips = Vec::new();
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                if is_skip_line(&line) {
                    skips.push(line);
                }
            }
            skips
        })
    });
    let (mut passed, mut failed) = (0u64, 0u64);
    if let Some(out) = child.stdout.take() {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test result: ") {
                let num = |word: &str| {
                    rest.split(';')
                        .find_map(|part| part.trim().strip_suffix(word))
                        .and_then(|n| n.trim().rsplit(' ').next()?.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                passed += num(" passed");
                failed += num(" failed");
            }
        }
    }
    let status = child.wait()?;
    if let Some(thread) = stderr {
        skipped.extend(thread.join().unwrap_or_default());
    }
    // Once the suite passed: a 20-second soak of the (debug) binary with faults injected.
    if status.success() && failed == 0 && passed > 0 {
        soak::soak(soak::Options {
            duration: 20,
            clients: 8,
            seed: 1,
            probe: false,
            release: false,
            prebuilt: true,
        })?;
    }
    if !status.success() || failed > 0 || passed == 0 || fuzz_time == 0 {
        report_skips(&skipped);
        println!("xtask: {passed} passed, {failed} failed");
    }
    anyhow::ensure!(
        status.success() && failed == 0,
        "the test suite failed ({status})"
    );
    anyhow::ensure!(passed > 0, "the test suite ran no test");
    // Each fuzz target counts as one test in the closing total, which stays the last line.
    let outcomes = if fuzz_time > 0 {
        fuzz::run_all(fuzz::TARGETS, fuzz_time, false, &[])?
    } else {
        Vec::new()
    };
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.failure.is_some())
        .map(|o| o.target)
        .collect();
    let fuzz_passed = (outcomes.len() - crashed.len()) as u64;
    // The kernel matrix, as root (CI): the probe's tests on Debian's kernels in a VM. Each of its
    // tests counts in the closing total too.
    let matrix = if vm && require {
        Some(vm::vm_test(vm::Options::ci()))
    } else {
        if vm {
            println!("xtask: not root: the kernel matrix (cargo xtask vm-test) is skipped");
        }
        None
    };
    let (vm_passed, vm_failed) = match &matrix {
        Some(Ok(s)) => (s.passed, s.failed),
        Some(Err(_)) | None => (0, 0),
    };
    report_skips(&skipped);
    println!(
        "xtask: cargo test: {passed} passed; fuzz: {fuzz_passed} of {} targets clean; kernel matrix: {vm_passed} passed, {vm_failed} failed",
        outcomes.len()
    );
    println!(
        "xtask: {} passed, {} failed",
        passed + fuzz_passed + vm_passed,
        crashed.len() as u64 + vm_failed + matrix.as_ref().is_some_and(|m| m.is_err()) as u64
    );
    anyhow::ensure!(
        crashed.is_empty(),
        "fuzz target(s) failed: {} (artifacts under proxy/fuzz/artifacts/)",
        crashed.join(", ")
    );
    if let Some(m) = matrix {
        m?;
    }
    Ok(())
}

/// Lists what the run skipped for want of root, a CPU, Chromium or a tool (nothing when it had to
/// run everything: then a skip is a failure).
fn report_skips(skipped: &[String]) {
    if skipped.is_empty() {
        return;
    }
    println!(
        "xtask: skipped {} test(s) this machine or user cannot run (as root, as CI runs, they run; \
         gated ones count as passed above):",
        skipped.len()
    );
    for line in skipped {
        println!("xtask:   {line}");
    }
}
