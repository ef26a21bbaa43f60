//! `cargo xtask vm-test`: the probe's tests on the kernels users run, not only on this machine's.
//! The probe is eBPF: whether it loads and counts right depends on the kernel (tracepoint
//! formats, BTF, verifier), so the same test binaries built here run inside a VM booting each of
//! Debian's kernels (kernels.rs), one boot per kernel (guest.rs), and the results come back as a
//! kernel × test table (report.rs) with the time each kernel took.
//!
//! The tests run as root with `ZEROCACHE_REQUIRE_PRIVILEGED=1` (a skip for want of something is
//! a failure, as in CI), one at a time (`--test-threads=1`, the guest is slow). The run fails when
//! a test fails. On a kernel the probe is expected to refuse (5.10) only the test that the refusal
//! names the kernel, the minimum and the missing helper runs: every other test would only fail the
//! same way.

mod guest;
mod kernels;
mod report;
mod sources;
pub mod tools;

use anyhow::Context;
use report::Outcome;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Which test binaries run in the guest, and which of their tests (libtest substring filters, any
/// of which selects a test; none selects all). Easy to change: one entry per binary or package.
const SELECTION: &[Selected] = &[
    // The probe crate's kernel-facing unit tests: the tracepoint formats against the offsets the
    // programs read, the floor, BTF, a planted table slot.
    Selected {
        package: "zerocache-probe",
        test: Some(LIB),
        filters: &["probe::tests::", "kernel::tests::", "btf::tests::"],
    },
    // Every integration test of the probe crate (ebpf/probe/tests/*.rs).
    Selected {
        package: "zerocache-probe",
        test: None,
        filters: &[],
    },
    // The proxy's zero-copy tests and its kTLS tests (the hand-over, sendfile under kTLS: these
    // machines' kernel has no kTLS, Debian's 6.1 and 6.12 do), modules of its one
    // integration-test binary.
    Selected {
        package: "zerocache",
        test: Some("it"),
        filters: &["zero_copy::", "tls_ktls::"],
    },
    // The kTLS unit tests: which versions and ciphers the kernel takes.
    Selected {
        package: "zerocache",
        test: Some(LIB),
        filters: &["tls::ktls::"],
    },
];

struct Selected {
    package: &'static str,
    /// One integration-test target ([`LIB`]: the library's unit tests), or all of the package's.
    test: Option<&'static str>,
    filters: &'static [&'static str],
}

/// [`Selected::test`] for a package's library unit tests.
const LIB: &str = "lib";

/// What runs on a kernel the probe is expected to refuse: the test that the refusal names the
/// kernel, the minimum and the missing helper (and otherwise nothing: every other test would
/// only fail the same way, at several minutes a kernel under emulation).
const ON_REFUSING_KERNELS: &str = "the_floor_is_named_with_the_kernel_or_the_probe_attaches";

/// Each test binary gets this long in the guest before it is killed.
const PER_BINARY: Duration = Duration::from_secs(10 * 60);
const MEMORY: &str = "2G";
const CPUS: u32 = 2;

pub struct Options {
    /// `all`, or kernel labels separated by commas.
    pub kernel: String,
    /// Extra filters: a test runs when one of them is its binary's name or part of its name.
    pub filters: Vec<String>,
    pub kvm: bool,
    /// The hard limit of one kernel's boot and run.
    pub timeout: Duration,
    /// Run the [`HEAVY`] binaries on this kernel only (`None`: on every kernel).
    pub heavy_on: Option<&'static str>,
    /// Run the [`HEAVY_TESTS`] on this kernel only (`None`: on every kernel).
    pub heavy_tests_on: Option<&'static str>,
}

/// The binaries that take most of a kernel's time under emulation (the seeds' Go and Java
/// servers, ~250 s; 100,000 connections, ~165 s) and prove nothing kernel-specific beyond what
/// the others prove on every kernel: `cargo xtask test` runs them on one kernel.
const HEAVY: [&str; 2] = ["seeds", "bounded"];

/// Single tests of the same kind (each ~75 s a kernel under emulation): the 64 MiB hit over kTLS
/// exercises the same hand-over and sendfile path as the small ones, only longer. `cargo xtask
/// test` runs them on the other kTLS kernel, 6.12, which balances the two boots.
const HEAVY_TESTS: [&str; 1] = ["tls_ktls::a_64_mib_hit_and_a_client_that_leaves_mid_body"];

impl Options {
    /// What `cargo xtask test` runs: every kernel, every selected test, software emulation, the
    /// [`HEAVY`] binaries on 6.1 alone (the most common server kernel) and the [`HEAVY_TESTS`] on
    /// 6.12 alone, so the whole CI run stays within its budget (45 minutes on 2 cores; it took 43
    /// with both everywhere). `cargo xtask vm-test` runs everything everywhere.
    pub fn ci() -> Options {
        Options {
            kernel: "all".into(),
            filters: Vec::new(),
            kvm: false,
            timeout: Duration::from_secs(20 * 60),
            heavy_on: Some("6.1"),
            heavy_tests_on: Some("6.12"),
        }
    }
}

/// Tests counted over every kernel run.
pub struct Summary {
    pub passed: u64,
    pub failed: u64,
}

/// A built test binary and the tests of it to run.
#[derive(Clone)]
struct Binary {
    target: String,
    executable: PathBuf,
    manifest_dir: PathBuf,
    tests: Vec<String>,
    /// All of the binary's tests are selected: no filter arguments needed.
    all: bool,
}

pub fn vm_test(opts: Options) -> anyhow::Result<Summary> {
    tools::vng()?;
    let specs = kernels::select(&opts.kernel)?;
    let binaries = build(&opts.filters)?;
    anyhow::ensure!(
        !binaries.is_empty(),
        "no test matches the selection and filters {:?}",
        opts.filters
    );
    let planned: usize = binaries.iter().map(|b| b.tests.len()).sum();
    println!(
        "xtask: vm-test: {planned} tests in {} binaries: {}",
        binaries.len(),
        binaries
            .iter()
            .map(|b| b.target.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    // A renamed heavy test would quietly run everywhere again and push CI past its budget.
    if opts.heavy_tests_on.is_some() && opts.filters.is_empty() {
        for name in HEAVY_TESTS {
            anyhow::ensure!(
                binaries.iter().any(|b| b.tests.iter().any(|t| t == name)),
                "HEAVY_TESTS names {name}, which no selected test binary has"
            );
        }
    }
    let kernels = kernels::ensure(&specs)?;
    let mut rows: Vec<String> = Vec::new();
    for b in &binaries {
        rows.extend(b.tests.iter().map(|t| row(&b.target, t)));
    }
    let mut runs = Vec::new();
    for k in &kernels {
        println!(
            "xtask: vm-test: {}: {} ({}; {})",
            k.spec.label, k.release, k.package, k.spec.note
        );
        runs.push(run_kernel(k, &binaries, &opts)?);
    }
    println!();
    let columns: Vec<report::Column<'_>> = runs
        .iter()
        .map(|r| report::Column {
            label: r.label,
            results: &r.results,
        })
        .collect();
    report::print_table(&rows, &columns);
    println!();
    let mut fatal = Vec::new();
    let mut summary = Summary {
        passed: 0,
        failed: 0,
    };
    for r in &runs {
        let (passed, bad, skipped) = report::counts(&r.results);
        summary.passed += passed as u64;
        summary.failed += bad as u64;
        let expect = match r.expect {
            kernels::Expect::Pass => "expected to pass",
            kernels::Expect::Refuse => "expected to refuse, naming why: only that is tested",
        };
        println!(
            "xtask: vm-test: {} ({}): {passed} passed, {bad} failed, {skipped} skipped; {} [{expect}]",
            r.label, r.release, r.timing
        );
        if bad > 0 || r.problem.is_some() {
            fatal.push(r.label);
        }
        if let Some(p) = &r.problem {
            println!("xtask: vm-test: {}: {p}", r.label);
        }
    }
    anyhow::ensure!(
        fatal.is_empty(),
        "tests failed on kernel(s): {} (outputs under {})",
        fatal.join(", "),
        vm_dir().display()
    );
    Ok(summary)
}

fn row(target: &str, test: &str) -> String {
    format!("{target}: {test}")
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `target/` in the workspace.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target"))
}

/// `target/vm`: per kernel, the guest script, its console and the results.
fn vm_dir() -> PathBuf {
    target_dir().join("vm")
}

/// Builds the selected test binaries on the host and lists the tests of each to run.
fn build(filters: &[String]) -> anyhow::Result<Vec<Binary>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut out = Vec::new();
    for sel in SELECTION {
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(["-p", sel.package]);
        match sel.test {
            Some(LIB) => cmd.arg("--lib"),
            Some(t) => cmd.args(["--test", t]),
            None => cmd.arg("--tests"),
        };
        println!("xtask: $ {}", format!("{cmd:?}").replace('"', ""));
        let output = cmd
            .current_dir(crate::root())
            .stderr(Stdio::inherit())
            .output()
            .context("running cargo test --no-run")?;
        anyhow::ensure!(
            output.status.success(),
            "building the tests of {} failed ({})",
            sel.package,
            output.status
        );
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some((target, lib, executable, manifest_dir)) = test_artifact(&msg) else {
                continue;
            };
            let wanted = match sel.test {
                Some(LIB) => lib,
                Some(t) => !lib && t == target,
                None => !lib,
            };
            if !wanted {
                continue;
            }
            let listed = list(&executable)?;
            let tests: Vec<String> = listed
                .iter()
                .filter(|t| sel.filters.is_empty() || sel.filters.iter().any(|f| t.contains(f)))
                .filter(|t| {
                    filters.is_empty() || filters.iter().any(|f| *f == target || t.contains(f))
                })
                .cloned()
                .collect();
            if tests.is_empty() {
                continue;
            }
            out.push(Binary {
                all: tests.len() == listed.len(),
                target,
                executable,
                manifest_dir,
                tests,
            });
        }
    }
    out.sort_by(|a, b| a.target.cmp(&b.target));
    Ok(out)
}

/// (target name, whether it is the library's unit tests, executable, package directory) of a
/// test binary cargo built.
fn test_artifact(msg: &serde_json::Value) -> Option<(String, bool, PathBuf, PathBuf)> {
    if msg.get("reason")?.as_str()? != "compiler-artifact" {
        return None;
    }
    let target = msg.get("target")?;
    let kinds = target.get("kind")?.as_array()?;
    let is = |kind: &str| kinds.iter().any(|k| k.as_str() == Some(kind));
    let unit_tests = msg.get("profile")?.get("test")?.as_bool()? && is("lib");
    if !is("test") && !unit_tests {
        return None;
    }
    let executable = PathBuf::from(msg.get("executable")?.as_str()?);
    let manifest = PathBuf::from(msg.get("manifest_path")?.as_str()?);
    Some((
        target.get("name")?.as_str()?.to_string(),
        unit_tests,
        executable,
        manifest.parent()?.to_path_buf(),
    ))
}

/// The tests a libtest binary has (`--list --format terse`: `NAME: test`).
fn list(executable: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(executable)
        .args(["--list", "--format", "terse"])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("listing the tests of {}", executable.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} --list failed ({})",
        executable.display(),
        out.status
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// What runs on the kernel `label`: the [`HEAVY`] binaries and [`HEAVY_TESTS`] only on the
/// kernels `opts` names for them; on a kernel the probe must `refuse`, only
/// [`ON_REFUSING_KERNELS`].
fn for_kernel(binaries: &[Binary], label: &str, refuse: bool, opts: &Options) -> Vec<Binary> {
    binaries
        .iter()
        .filter(|b| {
            opts.heavy_on.is_none_or(|on| on == label) || !HEAVY.contains(&b.target.as_str())
        })
        .filter_map(|b| {
            if opts.heavy_tests_on.is_some_and(|on| on != label) {
                keep_tests(b, |t| !HEAVY_TESTS.contains(&t))
            } else {
                Some(b.clone())
            }
        })
        .filter_map(|b| {
            if refuse {
                keep_tests(&b, |t| t.ends_with(ON_REFUSING_KERNELS))
            } else {
                Some(b)
            }
        })
        .collect()
}

/// `b` with only the tests `keep` keeps (the same binary when it keeps them all; `None` when
/// it keeps none).
fn keep_tests(b: &Binary, keep: impl Fn(&str) -> bool) -> Option<Binary> {
    let tests: Vec<String> = b.tests.iter().filter(|t| keep(t)).cloned().collect();
    if tests.len() == b.tests.len() {
        return Some(b.clone());
    }
    (!tests.is_empty()).then(|| Binary {
        tests,
        all: false,
        ..b.clone()
    })
}

/// One kernel's results.
struct Run<'a> {
    label: &'a str,
    release: String,
    expect: kernels::Expect,
    results: BTreeMap<String, Outcome>,
    timing: String,
    /// Why the guest did not finish cleanly, if it did not.
    problem: Option<String>,
}

fn run_kernel<'a>(
    k: &'a kernels::Kernel,
    binaries: &[Binary],
    opts: &Options,
) -> anyhow::Result<Run<'a>> {
    let dir = vm_dir().join(k.spec.label);
    let results = dir.join("results");
    let _ = std::fs::remove_dir_all(&results);
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    // The tests build their fixtures under CARGO_TARGET_TMPDIR, as under `cargo test`.
    let target_tmp = target_dir().join("tmp");
    std::fs::create_dir_all(&target_tmp)
        .with_context(|| format!("creating {}", target_tmp.display()))?;
    let path = std::env::var("PATH").unwrap_or_default();
    let selected = for_kernel(
        binaries,
        k.spec.label,
        k.spec.expect == kernels::Expect::Refuse,
        opts,
    );
    let binaries = &selected[..];
    let jobs: Vec<guest::Job> = binaries
        .iter()
        .enumerate()
        .map(|(i, b)| guest::Job {
            id: format!("{i:02}-{}", b.target),
            executable: b.executable.clone(),
            cwd: b.manifest_dir.clone(),
            args: if b.all {
                Vec::new()
            } else {
                std::iter::once("--exact".to_string())
                    .chain(b.tests.iter().cloned())
                    .collect()
            },
            env: vec![
                (crate::REQUIRE_PRIVILEGED.to_string(), "1".to_string()),
                // A failure in the guest is read from its output alone: say where.
                ("RUST_BACKTRACE".to_string(), "1".to_string()),
                (
                    "CARGO_MANIFEST_DIR".to_string(),
                    b.manifest_dir.to_string_lossy().into_owned(),
                ),
                ("PATH".to_string(), path.clone()),
            ],
        })
        .collect();
    let script = dir.join("run.sh");
    std::fs::write(&script, guest::script(&results, &jobs, PER_BINARY))
        .with_context(|| format!("writing {}", script.display()))?;
    let console = dir.join("console.log");
    let mut overlay_dirs = Vec::new();
    // The guest sees the host's root read-only; /home is an overlay already, root's home is not.
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
        && home.is_dir()
        && !home.starts_with("/home")
    {
        overlay_dirs.push(home);
    }
    let boot = || {
        guest::boot(&guest::Boot {
            vmlinuz: &k.vmlinuz,
            script: &script,
            rw_dirs: vec![results.clone(), target_tmp.clone()],
            overlay_dirs: overlay_dirs.clone(),
            console: &console,
            timeout: opts.timeout,
            kvm: opts.kvm,
            memory: MEMORY,
            cpus: CPUS,
        })
    };
    let mut outcome = boot()?;
    // A kernel that died before its user space ran the script (a boot-time panic under QEMU's
    // software emulation, seen once on 6.12 while patching kernel text) ran no test: boot it
    // once more, keeping the first console. A failure in the tests themselves is never retried.
    if !outcome.timed_out && !results.join("guest").is_file() {
        let first = dir.join("console-first-boot.log");
        let _ = std::fs::rename(&console, &first);
        println!(
            "xtask: vm-test: {}: the kernel stopped before the test script ran (console in {}); booting it once more",
            k.spec.label,
            first.display()
        );
        outcome = boot()?;
    }
    let facts = read_facts(&results.join("guest"));
    let mut merged = BTreeMap::new();
    for (job, b) in jobs.iter().zip(binaries) {
        for (name, o) in report::parse_job(&results, &job.id, &b.tests) {
            merged.insert(row(&b.target, &name), o);
        }
    }
    let done = results.join("done").is_file();
    let problem = if outcome.timed_out {
        Some(format!(
            "killed at the {} s timeout; console in {}",
            opts.timeout.as_secs(),
            console.display()
        ))
    } else if !done {
        Some(format!(
            "the guest stopped before the end (vng exit {:?}); console in {}",
            outcome.code,
            console.display()
        ))
    } else {
        None
    };
    let secs = |key: &str| facts.get(key).and_then(|v| v.parse::<f64>().ok());
    let timing = match (secs("boot_secs"), secs("end_secs")) {
        (Some(boot), Some(end)) => format!(
            "boot {boot:.0} s, tests {:.0} s, wall {:.0} s (boot+run+power-off)",
            end - boot,
            outcome.elapsed.as_secs_f64()
        ),
        _ => format!("wall {:.0} s", outcome.elapsed.as_secs_f64()),
    };
    if let Some(tls) = facts.get("tls") {
        println!("xtask: vm-test: {}: modprobe tls: {tls}", k.spec.label);
    }
    let release = facts
        .get("release")
        .cloned()
        .unwrap_or_else(|| k.release.clone());
    let bad = merged.values().filter(|o| o.status.is_bad()).count();
    let failed_note = if bad > 0 || problem.is_some() {
        "; see below"
    } else {
        ""
    };
    println!(
        "xtask: vm-test: {} done in {:.0} s{failed_note}",
        k.spec.label,
        outcome.elapsed.as_secs_f64()
    );
    Ok(Run {
        label: k.spec.label,
        release,
        expect: k.spec.expect,
        results: merged,
        timing,
        problem,
    })
}

/// `key=value` lines the guest script wrote.
fn read_facts(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(target: &str, tests: &[&str]) -> Binary {
        Binary {
            target: target.into(),
            executable: PathBuf::from(format!("/x/{target}")),
            manifest_dir: PathBuf::from("/x"),
            tests: tests.iter().map(|t| t.to_string()).collect(),
            all: true,
        }
    }

    fn names(v: &[Binary]) -> Vec<(String, Vec<String>, bool)> {
        v.iter()
            .map(|b| (b.target.clone(), b.tests.clone(), b.all))
            .collect()
    }

    /// CI's selection: the heavy binaries on 6.1 alone, the 64 MiB kTLS test on 6.12 alone, and
    /// on the refusing 5.10 only the test of the refusal.
    #[test]
    fn each_kernel_gets_its_share() {
        let heavy_test = HEAVY_TESTS[0];
        let all = vec![
            binary("seeds", &["seeds::a"]),
            binary("it", &["zero_copy::a", heavy_test]),
            binary(
                "probe",
                &[&format!("x::{ON_REFUSING_KERNELS}"), "probe::tests::b"],
            ),
        ];
        let ci = Options::ci();
        let on = |label, refuse| names(&for_kernel(&all, label, refuse, &ci));
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(
            on("6.1", false),
            vec![
                ("seeds".into(), s(&["seeds::a"]), true),
                ("it".into(), s(&["zero_copy::a"]), false),
                (
                    "probe".into(),
                    s(&[&format!("x::{ON_REFUSING_KERNELS}"), "probe::tests::b"]),
                    true
                ),
            ]
        );
        assert_eq!(
            on("6.12", false),
            vec![
                ("it".into(), s(&["zero_copy::a", heavy_test]), true),
                (
                    "probe".into(),
                    s(&[&format!("x::{ON_REFUSING_KERNELS}"), "probe::tests::b"]),
                    true
                ),
            ]
        );
        assert_eq!(
            on("5.10", true),
            vec![(
                "probe".into(),
                s(&[&format!("x::{ON_REFUSING_KERNELS}")]),
                false
            )]
        );
        // `cargo xtask vm-test` runs everything everywhere.
        let everything = Options {
            heavy_on: None,
            heavy_tests_on: None,
            ..Options::ci()
        };
        assert_eq!(for_kernel(&all, "6.1", false, &everything).len(), 3);
        assert_eq!(
            names(&for_kernel(&all, "6.1", false, &everything))[1].1,
            s(&["zero_copy::a", heavy_test])
        );
    }
}
