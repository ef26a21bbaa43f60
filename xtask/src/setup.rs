//! `cargo xtask setup`: installs, on a bare machine of this kind, everything the build, the tests,
//! the demo and the benchmark need, and checks it is all there in well under 2 s when it is.
//!
//! - the nightly toolchain's `rust-src` (the probe is built with `-Z build-std=core`);
//! - `bpf-linker`, built against nightly's own libLLVM: there is no system LLVM of the right
//!   version, so a prefix under `~/.local/share/zerocache/llvm` links to nightly's libLLVM, and a
//!   bpf-linker that does not run, or that links another nightly's libLLVM, counts as missing;
//! - `cargo-fuzz`, for `cargo xtask fuzz` and the short fuzz runs of `cargo xtask test`;
//! - `cargo-deb` at a pinned version, for `cargo xtask package` and the package test;
//! - virtme-ng in the tools venv, for `cargo xtask vm-test` (xtask/src/vm/tools.rs; the kernels it
//!   boots are fetched by vm-test itself, on first use);
//! - tracefs mounted at /sys/kernel/tracing (the probe attaches through it);
//! - the Debian packages the tests and the benchmark use.
//!
//! The last two need root. Without it, `cargo xtask test` skips them with a message (the tests
//! that need what is missing skip themselves and are listed at the end of the run); every other
//! task, and a run with `ZEROCACHE_REQUIRE_PRIVILEGED=1`, fails naming what to install.

use crate::run;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Debian packages used by tests and the benchmark: nginx (bench, probe tests) and wrk for
/// `bench`; chromium and chromium-driver for the dashboard's browser test; prometheus for
/// `promtool check metrics`; util-linux's setpriv and prlimit for the unprivileged and fd-limit
/// tests; iproute2's ss for the listen backlog test; python3-venv for the venv that holds
/// kubernetes-validate (the fleet's Kubernetes manifests); strace and curl for the README's examples;
/// for `cargo xtask package` and its test, dpkg-dev (cargo-deb's dependency detection runs
/// dpkg-shlibdeps), binutils (strip, objcopy, readelf), logrotate (the test has it parse the
/// packaged snippet) and systemd (`systemd-analyze verify` of the installed unit);
/// ca-certificates for the system roots `https://` upstreams verify against, and openssl for
/// `bench --tls` (its certificate); for the watch mode's seed servers
/// (ebpf/probe/tests/seeds.rs, `cargo xtask demo --seeds`), golang-go (Go 1.19 on bookworm),
/// default-jdk-headless (OpenJDK 17 on bookworm, the JDK the Java seed is pinned to) and python3;
/// for `cargo xtask vm-test` (virtme-ng): qemu-system-x86, busybox-static (its initramfs), kmod
/// (depmod for the unpacked kernels, modprobe in the guest), udev (names the guest's virtio-serial
/// ports, without which vng loses the script's output and exit code) and file (reads a kernel
/// image's version); nghttp2-client (`nghttp` and `h2load`: the HTTP/2 tests' real clients
/// and `bench --h2`); buildah for `cargo xtask image` (the OCI image, built without a daemon);
/// valgrind (callgrind counts a hit's instructions in `bench --rules`).
/// As root the tests fail rather than skip when one of these is missing.
const APT_PACKAGES: &[&str] = &[
    "nginx",
    "wrk",
    "chromium",
    "chromium-driver",
    "prometheus",
    "strace",
    "util-linux",
    "iproute2",
    "systemd",
    "curl",
    "dpkg-dev",
    "binutils",
    "logrotate",
    "ca-certificates",
    "openssl",
    "golang-go",
    "default-jdk-headless",
    "python3",
    "python3-venv",
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "udev",
    "file",
    "nghttp2-client",
    "buildah",
    "valgrind",
];

/// The kubernetes-validate release (PyPI) that checks config/k8s/ in the fleet deployment test.
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

/// The bpf-linker release this recipe was verified with.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// The cargo-deb release `[package.metadata.deb]` in proxy/Cargo.toml was written for (its
/// `dbgsym` and `systemd-units` keys); it builds with the workspace's rustc 1.95.
pub const CARGO_DEB_VERSION: &str = "3.8.0";

/// Setup for every task but `test`: whatever is missing is installed, or the task fails.
pub fn setup() -> anyhow::Result<()> {
    setup_with(true)
}

/// Setup for `cargo xtask test`. With `require` (as root, or with ZEROCACHE_REQUIRE_PRIVILEGED=1)
/// as strict as [`setup`]; without, the steps that need root and are not done already are skipped
/// with a message, since the tests that need them skip themselves.
pub fn setup_for_tests(require: bool) -> anyhow::Result<()> {
    setup_with(require)
}

fn setup_with(strict: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut changed = Vec::new();
    nightly(&mut changed)?;
    let sysroot = nightly_sysroot()?;
    rust_src(&sysroot, &mut changed)?;
    bpf_linker(&sysroot, &mut changed)?;
    cargo_fuzz(&mut changed)?;
    cargo_deb(&mut changed)?;
    tracefs(&mut changed)?;
    apt(&mut changed, strict)?;
    kubernetes_validate(&mut changed, strict)?;
    crate::vm::tools::virtme_ng(&mut changed, strict)?;
    if changed.is_empty() {
        println!(
            "xtask: setup: everything present ({} ms)",
            started.elapsed().as_millis()
        );
    } else {
        println!(
            "xtask: setup: installed {} in {:.1} s",
            changed.join(", "),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn nightly(changed: &mut Vec<String>) -> anyhow::Result<()> {
    let list = output(Command::new("rustup").args(["toolchain", "list"])).context(
        "rustup is missing: this project needs rustup with a stable and a nightly toolchain",
    )?;
    if !list.lines().any(|l| l.starts_with("nightly")) {
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))
        .context("installing the nightly toolchain")?;
        changed.push("nightly toolchain".into());
    }
    Ok(())
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .map(PathBuf::from)
        .context("`rustc +nightly --print sysroot` failed: the nightly toolchain is broken")
}

fn rust_src(sysroot: &Path, changed: &mut Vec<String>) -> anyhow::Result<()> {
    if sysroot
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .exists()
    {
        return Ok(());
    }
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("installing rust-src for nightly")?;
    changed.push("rust-src (nightly)".into());
    Ok(())
}

/// nightly's versioned libLLVM, found by glob (`libLLVM.so.<ver>-rust-<ver>-nightly`).
fn nightly_libllvm(sysroot: &Path) -> anyhow::Result<PathBuf> {
    let lib = sysroot.join("lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .collect();
    found.sort();
    found.pop().with_context(|| {
        format!(
            "no libLLVM.so.* in {}: cannot build bpf-linker",
            lib.display()
        )
    })
}

fn prefix() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".local/share/zerocache/llvm"))
}

fn bpf_linker_ok(prefix: &Path, llvm: &Path) -> bool {
    let Some(name) = llvm.file_name() else {
        return false;
    };
    // The prefix must point at this nightly's libLLVM, and the binary must run.
    let linked = std::fs::read_link(prefix.join("lib").join(name)).ok();
    linked.as_deref() == Some(llvm) && output(Command::new("bpf-linker").arg("--version")).is_some()
}

fn bpf_linker(sysroot: &Path, changed: &mut Vec<String>) -> anyhow::Result<()> {
    let llvm = nightly_libllvm(sysroot)?;
    let prefix = prefix()?;
    if bpf_linker_ok(&prefix, &llvm) {
        return Ok(());
    }
    let name = llvm
        .file_name()
        .and_then(|n| n.to_str())
        .context("libLLVM file name")?
        .to_string();
    // libLLVM.so.22.1-rust-... → llvm-22
    let major = name
        .trim_start_matches("libLLVM.so.")
        .split(['.', '-'])
        .next()
        .unwrap_or("")
        .to_string();
    anyhow::ensure!(
        major.chars().all(|c| c.is_ascii_digit()) && !major.is_empty(),
        "cannot tell the LLVM version from {name}"
    );
    println!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against nightly's {name} (about a minute)"
    );
    let lib = prefix.join("lib");
    let _ = std::fs::remove_dir_all(&lib);
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for link in ["libLLVM.so", name.as_str()] {
        std::os::unix::fs::symlink(&llvm, lib.join(link))
            .with_context(|| format!("linking {} into {}", llvm.display(), lib.display()))?;
    }
    run(Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--force",
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .env("LLVM_PREFIX", &prefix))
    .context("building bpf-linker (needs nightly's libLLVM and a C toolchain)")?;
    anyhow::ensure!(
        bpf_linker_ok(&prefix, &llvm),
        "bpf-linker was installed but `bpf-linker --version` does not run: is ~/.cargo/bin on PATH?"
    );
    changed.push("bpf-linker".into());
    Ok(())
}

/// True when `cargo fuzz` runs (cargo-fuzz is on PATH).
pub fn cargo_fuzz_ok() -> bool {
    output(Command::new("cargo").args(["fuzz", "--version"])).is_some()
}

/// cargo-fuzz, which builds the libFuzzer targets in proxy/fuzz with nightly; installed only
/// when `cargo fuzz` does not run.
fn cargo_fuzz(changed: &mut Vec<String>) -> anyhow::Result<()> {
    if cargo_fuzz_ok() {
        return Ok(());
    }
    println!("xtask: installing cargo-fuzz (a minute or two)");
    let started = Instant::now();
    run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
        .context("installing cargo-fuzz")?;
    anyhow::ensure!(
        cargo_fuzz_ok(),
        "cargo-fuzz was installed but `cargo fuzz --version` does not run: is ~/.cargo/bin on PATH?"
    );
    changed.push(format!(
        "cargo-fuzz ({:.0} s)",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// True when `cargo deb` runs and is [`CARGO_DEB_VERSION`].
pub fn cargo_deb_ok() -> bool {
    output(Command::new("cargo").args(["deb", "--version"]))
        .is_some_and(|v| v == format!("cargo-deb {CARGO_DEB_VERSION}"))
}

/// cargo-deb, which builds the Debian package; installed (or replaced) when `cargo deb` does not
/// run or is another version.
fn cargo_deb(changed: &mut Vec<String>) -> anyhow::Result<()> {
    if cargo_deb_ok() {
        return Ok(());
    }
    println!("xtask: installing cargo-deb {CARGO_DEB_VERSION} (a minute or two)");
    let started = Instant::now();
    run(Command::new("cargo").args([
        "install",
        "cargo-deb",
        "--version",
        CARGO_DEB_VERSION,
        "--locked",
        "--force",
    ]))
    .context("installing cargo-deb")?;
    anyhow::ensure!(
        cargo_deb_ok(),
        "cargo-deb was installed but `cargo deb --version` does not say {CARGO_DEB_VERSION}: is ~/.cargo/bin on PATH?"
    );
    changed.push(format!(
        "cargo-deb ({:.0} s)",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

fn tracefs(changed: &mut Vec<String>) -> anyhow::Result<()> {
    if Path::new("/sys/kernel/tracing/events/syscalls").exists() {
        return Ok(());
    }
    if !crate::is_root() {
        // Mounted or not, tracefs is root's alone (mode 700): only root can load the probe.
        println!(
            "xtask: setup: skipped the tracefs check and mount at /sys/kernel/tracing (needs root); the probe will report itself unavailable"
        );
        return Ok(());
    }
    run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
        .context("mounting tracefs at /sys/kernel/tracing")?;
    changed.push("tracefs mount".into());
    Ok(())
}

fn installed(pkg: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .is_some_and(|s| s == "install ok installed")
}

fn apt(changed: &mut Vec<String>, strict: bool) -> anyhow::Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !crate::is_root() {
        anyhow::ensure!(
            !strict,
            "missing Debian packages and not root: install them with `sudo apt-get install {}`",
            missing.join(" ")
        );
        println!(
            "xtask: setup: skipped installing Debian packages {} (apt-get needs root); the tests that need them are skipped",
            missing.join(" ")
        );
        return Ok(());
    }
    run(Command::new("apt-get")
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .context("apt-get update")?;
    // RUNLEVEL=1 keeps Debian's maintainer scripts from starting nginx on port 80.
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("RUNLEVEL", "1"))
    .with_context(|| format!("installing Debian packages {missing:?}"))?;
    for p in &missing {
        anyhow::ensure!(installed(p), "Debian package {p} is still not installed");
    }
    changed.push(format!("apt: {}", missing.join(" ")));
    Ok(())
}

/// Where setup installs kubernetes-validate when it is not on PATH: a venv of its own (Debian's
/// Python refuses `pip install` outside one), which the fleet deployment test looks in too.
pub fn tools_venv() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".local/share/zerocache/venv")
}

fn kubernetes_validate_ok() -> bool {
    output(Command::new("kubernetes-validate").arg("--version")).is_some()
        || output(Command::new(tools_venv().join("bin/kubernetes-validate")).arg("--version"))
            .is_some()
}

/// kubernetes-validate (PyPI), for the fleet's manifests: into [`tools_venv`] when it is not
/// on PATH already.
fn kubernetes_validate(changed: &mut Vec<String>, strict: bool) -> anyhow::Result<()> {
    venv_tool(
        changed,
        strict,
        ("kubernetes-validate", KUBERNETES_VALIDATE_VERSION),
        kubernetes_validate_ok,
        "the fleet deployment test is skipped",
    )
}

/// Installs PyPI package `name==version` into [`tools_venv`] unless `present()` already holds;
/// `strict` as in setup: without it a failure is a message saying `without_it`.
pub fn venv_tool(
    changed: &mut Vec<String>,
    strict: bool,
    (name, version): (&str, &str),
    present: fn() -> bool,
    without_it: &str,
) -> anyhow::Result<()> {
    if present() {
        return Ok(());
    }
    let venv = tools_venv();
    let made = run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).and_then(|()| {
        run(Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            &format!("{name}=={version}"),
        ]))
    });
    match made {
        Ok(()) if present() => {
            changed.push(format!("{name} {version}"));
            Ok(())
        }
        _ if !strict => {
            println!("xtask: setup: could not install {name} (python3 -m venv, pip); {without_it}");
            Ok(())
        }
        Ok(()) => anyhow::bail!("{name} installed in {} but does not run", venv.display()),
        Err(e) => Err(e).context(format!("installing {name} (python3 -m venv, pip)")),
    }
}
