//! `cargo xtask package`: the Debian package, so a server runs zerocache as a systemd service
//! installed with `dpkg -i`, without a Rust toolchain.
//!
//! cargo-deb (pinned and installed by `cargo xtask setup`) does the work from
//! `[package.metadata.deb]` in proxy/Cargo.toml: a release build (the eBPF object is embedded in
//! the binary), the stripped binary, the unit, the conffile, the logrotate snippet and the docs in
//! `target/debian/zerocache_<version>_amd64.deb`, and the debug info in
//! `target/debian/zerocache-dbgsym_<version>_amd64.ddeb`. proxy/tests/it/package.rs installs and
//! removes the result.

use crate::root;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The package's version: the workspace's, which the proxy shares.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The two files `cargo xtask package` writes.
pub struct Built {
    /// The package to install.
    pub deb: PathBuf,
    /// Its debug symbols, installable beside it.
    pub dbgsym: PathBuf,
}

/// Builds the package and its dbgsym package; prints where they are and how large.
pub fn package() -> anyhow::Result<Built> {
    let started = Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    crate::run(Command::new(&cargo).args(["deb", "--package", "zerocache", "--locked"]))
        .context("cargo deb (is cargo-deb installed? `cargo xtask setup` installs it)")?;
    let dir = target_dir().join("debian");
    let built = Built {
        deb: dir.join(format!("zerocache_{VERSION}_amd64.deb")),
        dbgsym: dir.join(format!("zerocache-dbgsym_{VERSION}_amd64.ddeb")),
    };
    for file in [&built.deb, &built.dbgsym] {
        anyhow::ensure!(
            file.is_file(),
            "cargo deb succeeded but {} is missing",
            file.display()
        );
    }
    println!(
        "xtask: package: {} ({}) and {} ({}) in {:.0} s",
        built.deb.display(),
        mib(&built.deb)?,
        built.dbgsym.display(),
        mib(&built.dbgsym)?,
        started.elapsed().as_secs_f64()
    );
    Ok(built)
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set (cargo-deb honours it too), else
/// `target/` in the workspace.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root().join(p) })
        .unwrap_or_else(|| root().join("target"))
}

fn mib(path: &Path) -> anyhow::Result<String> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    Ok(format!("{:.1} MiB", len as f64 / (1024.0 * 1024.0)))
}
