//! The kernels `cargo xtask vm-test` boots: Debian's own builds of the kernels users run, fetched
//! as Debian packages and unpacked into a cache the project owns, so a test on "6.1" means the
//! kernel a bookworm machine really runs (its config, its BTF, its modules) and not a custom build.
//!
//! apt is pointed at a sources list, a lists directory and a package cache of our own under
//! `~/.local/share/zerocache/kernels/apt/` (the system's sources and state stay untouched), built
//! from the Debian archive the system's own sources already name. The newest version of the
//! `linux-image-amd64` metapackage in the kernel's series gives the image package, which is
//! downloaded with `apt-get download`, unpacked with `dpkg-deb -x` into `kernels/<release>/`, and
//! given a `modules.dep` (depmod): virtme-ng finds `lib/modules/<release>` beside the image and
//! links it into the guest, so `modprobe tls` works there. A stamp file makes the unpacking
//! idempotent; the package lists are refreshed when older than a week, and without network an
//! already unpacked kernel of the series is used as it is.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

/// Whether a kernel's test failures fail the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The probe must load and every selected test pass.
    Pass,
    /// The probe must refuse this kernel and say why: only the test of that runs
    /// (`ON_REFUSING_KERNELS` in mod.rs), and it must pass.
    Refuse,
}

/// A kernel series to test on.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// What `--kernel` names it by.
    pub label: &'static str,
    /// The start of the `linux-image-amd64` versions of this series.
    pub version_prefix: &'static str,
    pub expect: Expect,
    /// Where Debian ships it, and what is special about it.
    pub note: &'static str,
}

/// Every kernel series vm-test knows, oldest first.
pub const KERNELS: &[Spec] = &[
    Spec {
        label: "5.10",
        version_prefix: "5.10.",
        expect: Expect::Refuse,
        note: "Debian 11 bullseye(-security); no kTLS (CONFIG_TLS unset)",
    },
    Spec {
        label: "6.1",
        version_prefix: "6.1.",
        expect: Expect::Pass,
        note: "Debian 12 bookworm(-security); tls is a module",
    },
    Spec {
        label: "6.12",
        version_prefix: "6.12.",
        expect: Expect::Pass,
        note: "bookworm-backports (Debian 13's kernel); tls is a module",
    },
];

/// The suites our own sources list names: every suite where a kernel above is published.
const ARCHIVE_SUITES: &[&str] = &[
    "bookworm",
    "bookworm-updates",
    "bookworm-backports",
    "bullseye",
    "bullseye-updates",
];
const SECURITY_SUITES: &[&str] = &["bookworm-security", "bullseye-security"];
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Package lists older than this are fetched again before a kernel is picked.
const LISTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
const STAMP: &str = ".zerocache-unpacked";

/// An unpacked kernel, ready to boot.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub spec: Spec,
    /// `uname -r` of the guest, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The Debian package and version it came from.
    pub package: String,
    pub vmlinuz: PathBuf,
}

/// The series `--kernel` names (`all`, or labels separated by commas).
pub fn select(arg: &str) -> anyhow::Result<Vec<Spec>> {
    if arg == "all" {
        return Ok(KERNELS.to_vec());
    }
    arg.split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|label| {
            KERNELS
                .iter()
                .find(|k| k.label == label)
                .copied()
                .with_context(|| {
                    let known: Vec<&str> = KERNELS.iter().map(|k| k.label).collect();
                    format!(
                        "unknown kernel {label:?}: known are {} and all",
                        known.join(", ")
                    )
                })
        })
        .collect()
}

/// `~/.local/share/zerocache/kernels`.
pub fn cache_dir() -> PathBuf {
    crate::setup::tools_venv().with_file_name("kernels")
}

/// Fetches and unpacks the newest Debian kernel of each series, once; returns them in order.
pub fn ensure(specs: &[Spec]) -> anyhow::Result<Vec<Kernel>> {
    let apt = Apt::new(&cache_dir())?;
    let fresh = apt.refresh_if_stale();
    specs
        .iter()
        .map(|spec| ensure_one(&apt, *spec, &fresh))
        .collect()
}

fn ensure_one(apt: &Apt, spec: Spec, fresh: &anyhow::Result<()>) -> anyhow::Result<Kernel> {
    let pointer = apt.root.join(format!("{}.current", spec.label));
    let resolved = match fresh {
        Ok(()) => apt.resolve(spec),
        Err(e) => Err(anyhow::anyhow!("{e:#}")),
    };
    let (package, version) = match resolved {
        Ok(found) => found,
        Err(e) => {
            // No fresh package lists (offline): a kernel of this series unpacked before will do.
            let release = std::fs::read_to_string(&pointer).unwrap_or_default();
            let release = release.trim();
            if !release.is_empty() && apt.root.join(release).join(STAMP).is_file() {
                println!("xtask: vm-test: {e:#}; using the {release} unpacked before");
                return kernel(apt, spec, release);
            }
            return Err(e).with_context(|| format!("finding Debian's {} kernel", spec.label));
        }
    };
    let release = package
        .strip_prefix("linux-image-")
        .map(|r| r.trim_end_matches("-unsigned").to_string())
        .with_context(|| format!("unexpected kernel package name {package}"))?;
    let dir = apt.root.join(&release);
    let want = format!("{package}={version}");
    let have = std::fs::read_to_string(dir.join(STAMP)).unwrap_or_default();
    if have.trim() != want {
        apt.unpack(&package, &version, &release, &dir)?;
        std::fs::write(dir.join(STAMP), &want)
            .with_context(|| format!("writing {}", dir.join(STAMP).display()))?;
    }
    // The series moved on: drop the kernel unpacked before (hundreds of MB).
    let old = std::fs::read_to_string(&pointer).unwrap_or_default();
    let old = old.trim();
    if !old.is_empty() && old != release && !old.contains('/') {
        let _ = std::fs::remove_dir_all(apt.root.join(old));
    }
    std::fs::write(&pointer, &release).with_context(|| format!("writing {}", pointer.display()))?;
    kernel(apt, spec, &release)
}

fn kernel(apt: &Apt, spec: Spec, release: &str) -> anyhow::Result<Kernel> {
    let dir = apt.root.join(release);
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    anyhow::ensure!(vmlinuz.is_file(), "{} is missing", vmlinuz.display());
    let package = std::fs::read_to_string(dir.join(STAMP)).unwrap_or_default();
    Ok(Kernel {
        spec,
        release: release.to_string(),
        package: package.trim().to_string(),
        vmlinuz,
    })
}

/// apt with a sources list, lists and cache of our own.
struct Apt {
    root: PathBuf,
    dir: PathBuf,
}

impl Apt {
    fn new(root: &Path) -> anyhow::Result<Apt> {
        let dir = root.join("apt");
        for sub in ["lists/partial", "cache/archives/partial", "download"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let (archive, security) = super::sources::system_debian_uris()?;
        let mut list =
            String::from("# Written by cargo xtask vm-test (xtask/src/vm/kernels.rs).\n");
        for (uri, suites) in [(&archive, ARCHIVE_SUITES), (&security, SECURITY_SUITES)] {
            for suite in suites {
                list.push_str(&format!("deb [signed-by={KEYRING}] {uri} {suite} main\n"));
            }
        }
        let path = dir.join("sources.list");
        if std::fs::read_to_string(&path).ok().as_deref() != Some(list.as_str()) {
            std::fs::write(&path, list).with_context(|| format!("writing {}", path.display()))?;
            // New sources: the lists fetched for the old ones are stale.
            let _ = std::fs::remove_file(dir.join("lists/.fetched"));
        }
        Ok(Apt {
            root: root.to_path_buf(),
            dir,
        })
    }

    fn options(&self) -> Vec<String> {
        let mut opts = vec![
            format!(
                "Dir::Etc::SourceList={}",
                self.dir.join("sources.list").display()
            ),
            "Dir::Etc::SourceParts=/dev/null".to_string(),
            format!("Dir::State::Lists={}", self.dir.join("lists").display()),
            format!("Dir::Cache={}", self.dir.join("cache").display()),
            // Only the Packages indices: no AppStream metadata for these suites.
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_string(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_string(),
            "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".to_string(),
        ];
        if crate::is_root() {
            // _apt cannot write into root's home.
            opts.push("APT::Sandbox::User=root".to_string());
        }
        opts.into_iter()
            .flat_map(|o| ["-o".to_string(), o])
            .collect()
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.args(self.options())
            .env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    }

    /// `apt-get update` into our lists when they are missing or older than a week.
    fn refresh_if_stale(&self) -> anyhow::Result<()> {
        let stamp = self.dir.join("lists/.fetched");
        let age = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok());
        if age.is_some_and(|a| a < LISTS_MAX_AGE) {
            return Ok(());
        }
        println!("xtask: vm-test: fetching Debian's package lists for the kernels");
        let out = self
            .command("apt-get")
            .args(["-q", "update"])
            .stdin(Stdio::null())
            .output()
            .context("running apt-get update")?;
        anyhow::ensure!(
            out.status.success(),
            "apt-get update for the kernels' suites failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::fs::write(&stamp, b"").with_context(|| format!("writing {}", stamp.display()))
    }

    /// The newest `linux-image-amd64` of the series, as (image package, version).
    fn resolve(&self, spec: Spec) -> anyhow::Result<(String, String)> {
        let out = self
            .command("apt-cache")
            .args(["show", "linux-image-amd64"])
            .stderr(Stdio::null())
            .output()
            .context("running apt-cache show linux-image-amd64")?;
        anyhow::ensure!(
            out.status.success(),
            "apt-cache show linux-image-amd64 failed"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let mut best: Option<(String, String)> = None;
        for stanza in text.split("\n\n") {
            let field = |name: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(str::trim)
            };
            let (Some(meta), Some(depends)) = (field("Version"), field("Depends")) else {
                continue;
            };
            if !meta.starts_with(spec.version_prefix) {
                continue;
            }
            // "linux-image-6.1.0-57-amd64 (= 6.1.192-3)"
            let Some((package, version)) = depends.split(',').find_map(|d| {
                let (name, rest) = d.trim().split_once(" (= ")?;
                Some((name.to_string(), rest.strip_suffix(')')?.to_string()))
            }) else {
                continue;
            };
            if best.as_ref().is_none_or(|(_, v)| newer(&version, v)) {
                best = Some((package, version));
            }
        }
        best.with_context(|| {
            format!(
                "no linux-image-amd64 {}* in {}",
                spec.version_prefix,
                self.dir.join("sources.list").display()
            )
        })
    }

    /// Downloads the image package, unpacks it into `dir` and runs depmod there.
    fn unpack(
        &self,
        package: &str,
        version: &str,
        release: &str,
        dir: &Path,
    ) -> anyhow::Result<()> {
        println!("xtask: vm-test: fetching {package} {version}");
        let download = self.dir.join("download");
        let _ = std::fs::remove_dir_all(&download);
        std::fs::create_dir_all(&download)
            .with_context(|| format!("creating {}", download.display()))?;
        let status = self
            .command("apt-get")
            .args(["-q", "download", &format!("{package}={version}")])
            .current_dir(&download)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .context("running apt-get download")?;
        anyhow::ensure!(
            status.success(),
            "apt-get download {package}={version} failed ({status})"
        );
        let deb = std::fs::read_dir(&download)
            .with_context(|| format!("reading {}", download.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", download.display()))?;
        let partial = self.root.join(format!("{release}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        let _ = std::fs::remove_dir_all(dir);
        crate::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))
            .with_context(|| format!("unpacking {}", deb.display()))?;
        // Debian's postinst runs depmod; unpacked by hand the modules have no index yet.
        crate::run(Command::new("depmod").arg("-b").arg(&partial).arg(release))
            .context("depmod (Debian package kmod) for the unpacked kernel")?;
        std::fs::rename(&partial, dir)
            .with_context(|| format!("moving {} to {}", partial.display(), dir.display()))?;
        let _ = std::fs::remove_dir_all(&download);
        Ok(())
    }
}

/// Whether Debian version `a` sorts after `b` (`dpkg --compare-versions`).
fn newer(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .is_ok_and(|s| s.success())
}
