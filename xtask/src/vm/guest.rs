//! One guest: boots a kernel with virtme-ng (`vng`), which runs it in QEMU over a read-only view
//! of the host's own root filesystem, so the test binaries built on the host run inside unchanged,
//! as root. The guest runs one shell script and powers off; `vng` exits with the script's code.
//!
//! QEMU runs under TCG (software emulation, `--disable-kvm`) unless asked for KVM: nested KVM on
//! the project's machines hangs a Linux guest at boot. A boot is slow (40-90 s) and a test run
//! under TCG more so, so the script runs every selected binary in one boot and writes each one's
//! output into a `--rwdir` results directory the host reads afterwards. A hard timeout kills QEMU
//! and everything vng started (QEMU is in a process group of its own, so the whole tree is walked)
//! when a guest hangs.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How to boot.
pub struct Boot<'a> {
    pub vmlinuz: &'a Path,
    /// The script to run (a host path, visible in the guest at the same path).
    pub script: &'a Path,
    /// Host directories the guest may write to (same paths inside).
    pub rw_dirs: Vec<PathBuf>,
    /// Host directories the guest may write to in memory only (an overlay; the host sees nothing).
    pub overlay_dirs: Vec<PathBuf>,
    /// Where vng's and the guest console's output goes.
    pub console: &'a Path,
    pub timeout: Duration,
    pub kvm: bool,
    pub memory: &'a str,
    pub cpus: u32,
}

/// How a boot ended.
pub struct Outcome {
    /// vng's exit code: the script's, or 255 and the like when the guest failed.
    pub code: Option<i32>,
    pub timed_out: bool,
    pub elapsed: Duration,
}

/// Boots, runs the script, waits for the guest to power off (or kills it at the timeout).
pub fn boot(b: &Boot<'_>) -> anyhow::Result<Outcome> {
    let vng = super::tools::vng()?;
    let bin = vng.parent().context("vng has no directory")?;
    // vng starts `virtme-run` by name: the venv's bin must be on PATH.
    let path = match std::env::var_os("PATH") {
        Some(p) => {
            let mut dirs = vec![bin.to_path_buf()];
            dirs.extend(std::env::split_paths(&p));
            std::env::join_paths(dirs).context("joining PATH")?
        }
        None => bin.as_os_str().to_owned(),
    };
    let log = std::fs::File::create(b.console)
        .with_context(|| format!("creating {}", b.console.display()))?;
    let log2 = log.try_clone().context("duplicating the console file")?;
    let mut cmd = Command::new(&vng);
    cmd.arg("-r").arg(b.vmlinuz);
    if !b.kvm {
        cmd.arg("--disable-kvm");
    }
    cmd.args(["--memory", b.memory, "--cpus", &b.cpus.to_string()]);
    // --verbose puts the kernel's log on the console too: a guest that panics says why.
    cmd.arg("--verbose");
    for dir in &b.rw_dirs {
        cmd.arg("--rwdir").arg(dir);
    }
    for dir in &b.overlay_dirs {
        cmd.arg("--overlay-rwdir").arg(dir);
    }
    // The command goes on the kernel command line (2 KiB at most): a short one, the script.
    cmd.arg("--").arg(format!("/bin/sh {}", b.script.display()));
    cmd.env("PATH", path)
        .current_dir(crate::root())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    println!("xtask: $ {}", format!("{cmd:?}").replace('"', ""));
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", vng.display()))?;
    let pid = child.id();
    loop {
        if let Some(status) = child.try_wait().context("waiting for vng")? {
            return Ok(Outcome {
                code: status.code(),
                timed_out: false,
                elapsed: started.elapsed(),
            });
        }
        if started.elapsed() > b.timeout {
            kill_tree(pid);
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome {
                code: None,
                timed_out: true,
                elapsed: started.elapsed(),
            });
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// SIGKILLs every descendant of `pid` (deepest first), then `pid`.
fn kill_tree(pid: u32) {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // /proc/PID/stat: "PID (COMM) STATE PPID ...", COMM may hold spaces and parens.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((p, ppid));
            }
        }
    }
    let mut order = vec![pid];
    let mut i = 0;
    while i < order.len() {
        let parent = order[i];
        order.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    for p in order.into_iter().rev() {
        if let Ok(p) = libc::pid_t::try_from(p) {
            // SAFETY: kill has no memory preconditions; the pids are our own descendants.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
    }
}

/// One test binary as the guest script runs it.
pub struct Job {
    /// The file stem its results get in the results directory.
    pub id: String,
    pub executable: PathBuf,
    /// The directory it runs in (its package's, as `cargo test` does).
    pub cwd: PathBuf,
    /// libtest arguments after `--test-threads=1`.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Size of the guest's temporary directory: an ext4 image in guest memory (/run is a tmpfs of
/// half of it).
const TMP_MB: u32 = 768;

/// The guest-side script: mounts tracefs when missing, loads tls, puts an ext4 filesystem at
/// `/run/zerocache-tmp` and makes it the tests' `TMPDIR` (vng's /tmp is an overlay over the
/// host's, and neither overlayfs nor tmpfs on 6.1 accepts `preadv2(RWF_NOWAIT)`, which the tests
/// use; the host's /tmp is ext4). Not over /tmp itself: a checkout under the host's /tmp (a clone
/// made there) would vanish under it, binaries and results directory too. Notes the guest's
/// facts, then
/// runs each job with its own timeout and writes `<id>.out`, `<id>.err`, `<id>.rc` and
/// `<id>.secs` into `results`; `done` last, so a hung or crashed guest is told from a clean one.
pub fn script(results: &Path, jobs: &[Job], per_job: Duration) -> String {
    let r = quote(&results.to_string_lossy());
    let mut s = format!(
        "#!/bin/sh\n# Written by cargo xtask vm-test (xtask/src/vm/guest.rs); runs inside the guest.\n\
         R={r}\n\
         up() {{ cut -d' ' -f1 /proc/uptime; }}\n\
         echo \"boot_secs=$(up)\" > \"$R/guest\"\n\
         echo \"release=$(uname -r)\" >> \"$R/guest\"\n\
         [ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing\n\
         I=/run/zerocache-tmp.img\n\
         T=/run/zerocache-tmp\n\
         if modprobe loop && truncate -s {TMP_MB}M $I && mkfs.ext4 -q -F $I && mkdir -p $T \
         && D=$(losetup -f --show $I) && mount -t ext4 \"$D\" $T && chmod 1777 $T; \
         then export TMPDIR=$T; echo tmp=ext4 >> \"$R/guest\"; else echo tmp=overlay >> \"$R/guest\"; fi\n\
         if modprobe tls 2>/dev/null; then echo tls=loaded >> \"$R/guest\"; \
         else echo tls=unavailable >> \"$R/guest\"; fi\n"
    );
    for job in jobs {
        let id = quote(&job.id);
        let mut line = String::new();
        for (k, v) in &job.env {
            line.push_str(&format!("{k}={} ", quote(v)));
        }
        line.push_str(&format!(
            "timeout --kill-after=10 {} {} --test-threads=1",
            per_job.as_secs(),
            quote(&job.executable.to_string_lossy())
        ));
        for a in &job.args {
            line.push(' ');
            line.push_str(&quote(a));
        }
        s.push_str(&format!(
            "t0=$(up)\n\
             (cd {} && env {line}) > \"$R/\"{id}.out 2> \"$R/\"{id}.err\n\
             echo $? > \"$R/\"{id}.rc\n\
             echo \"$t0 $(up)\" > \"$R/\"{id}.secs\n",
            quote(&job.cwd.to_string_lossy()),
        ));
    }
    s.push_str("echo \"end_secs=$(up)\" >> \"$R/guest\"\ntouch \"$R/done\"\n");
    s
}

/// Single-quotes a word for sh.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}
