//! The binary upgrade on SIGUSR2, as nginx's: the running process starts the binary at the path
//! it was started from (after a package upgrade, the new one: `/proc/self/exe` would name the
//! deleted file), with its own arguments and environment, and hands it its listening sockets
//! ([`crate::net::inherit`]). The successor checks its config, rebuilds the index and listens on
//! the same sockets, then says so on a pipe ([`READY_FD`]); only then does the old process stop
//! accepting and drain. A successor that exits or is not ready within [`READY_TIMEOUT`] changes
//! nothing: the old process logs why and keeps serving.
//!
//! The cache directory is shared during the hand-over, and each process has its own index of it,
//! so from the signal on the old process stores nothing and evicts nothing
//! ([`crate::cache::store::Store::hand_over`]): the successor indexes files that stay as it
//! found them.

use crate::net::inherit::{FROM, Role, SYSTEMD_VARS, UPGRADE_FDS, started_by_upgrade};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The variable naming the pipe on which the successor says it serves.
pub(crate) const READY_FD: &str = "ZEROCACHE_UPGRADE_READY_FD";
/// How long a successor may take to be ready: its index rebuild reads every entry's header.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// What the successor writes on the pipe once it serves.
const READY: &[u8] = b"ready\n";
/// What a successor that cannot start writes on the pipe before it exits, followed by why: the
/// old process says it, and so does `zerocache upgrade`, instead of an exit status alone.
const FAILED: &[u8] = b"failed: ";
/// The most of a successor's word the old process reads: a reason, cut.
const WORD_MAX: u64 = 4096;

/// A successor being started: its pid once it serves, or why it did not.
pub(crate) type Starting<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<u32, String>> + Send + 'a>>;

/// What an upgrade needs, captured at start-up: the program, its arguments, and a copy of each
/// listening socket. Dropped when the drain starts: a process that stops (rather than upgrades)
/// must not keep its listening sockets open, or new clients would wait in a backlog nobody
/// accepts from.
pub(crate) struct Upgrade {
    exe: PathBuf,
    args: Vec<OsString>,
    sockets: Vec<(OwnedFd, Role)>,
}

impl Upgrade {
    /// The running program's path, read now: after a package upgrade replaces the file, the path
    /// names the new binary, while `/proc/self/exe` names the deleted one.
    pub(crate) fn new() -> std::io::Result<Upgrade> {
        // The path it was started by when absolute (a `current` symlink to a release directory
        // then names the new release), else the resolved one.
        let argv0 = std::env::args_os().next().map(PathBuf::from);
        let exe = match argv0 {
            Some(p) if p.is_absolute() => p,
            _ => std::env::current_exe()?,
        };
        Ok(Upgrade {
            exe,
            args: std::env::args_os().skip(1).collect(),
            sockets: Vec::new(),
        })
    }

    /// Keeps a copy of a listening socket for the successor.
    pub(crate) fn keep(&mut self, fd: &impl AsRawFd, role: Role) -> std::io::Result<()> {
        // SAFETY: a borrowed fd, valid for the call.
        let copy =
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd.as_raw_fd()) }.try_clone_to_owned()?;
        self.sockets.push((copy, role));
        Ok(())
    }

    /// Starts the successor and waits until it serves (its pid), or says why it did not.
    pub(crate) async fn start_successor(&self) -> Result<u32, String> {
        let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| format!("cannot make the readiness pipe: {e}"))?;
        // Above the standard streams, which a process started with them closed would reuse
        // (the successor refuses a pipe below 3).
        let ready_w = above_stdio(ready_w).map_err(|e| format!("readiness pipe: {e}"))?;
        let fds: Vec<String> = self
            .sockets
            .iter()
            .map(|(fd, role)| format!("{}={}", fd.as_raw_fd(), role.name()))
            .collect();
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(&self.args)
            .env(UPGRADE_FDS, fds.join(","))
            .env(READY_FD, ready_w.as_raw_fd().to_string())
            .env(FROM, std::process::id().to_string())
            // Until it serves: a stop while it starts (SIGTERM, the future dropped) must not
            // leave it to serve on our sockets with nobody supervising it.
            .kill_on_drop(true);
        for v in SYSTEMD_VARS {
            cmd.env_remove(v);
        }
        let pass: Vec<i32> = self
            .sockets
            .iter()
            .map(|(fd, _)| fd.as_raw_fd())
            .chain([ready_w.as_raw_fd()])
            .collect();
        // SAFETY: runs in the forked child before exec; fcntl is async-signal-safe, and only
        // the child's copies of these fds lose close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                for fd in &pass {
                    if libc::fcntl(*fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.exe.display()))?;
        drop(ready_w);
        let pid = child.id().unwrap_or(0);
        tracing::info!(pid, exe = %self.exe.display(), "SIGUSR2: started the new binary; serving until it is ready");
        let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(ready_r)
            .map_err(|e| format!("cannot poll the readiness pipe: {e}"))?;
        let mut said = Vec::new();
        let mut bounded = (&mut pipe).take(WORD_MAX);
        let outcome = tokio::time::timeout(READY_TIMEOUT, async {
            let exited = tokio::select! {
                // EOF: the successor wrote its word and closed, or exited without it.
                r = bounded.read_to_end(&mut said) => match r {
                    Ok(_) if said == READY => return Ok(()),
                    Ok(_) => child.wait().await,
                    Err(e) => return Err(format!("cannot read the readiness pipe: {e}")),
                },
                status = child.wait() => {
                    // Its reason, written before it exited, is in the pipe already.
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        bounded.read_to_end(&mut said),
                    )
                    .await;
                    status
                }
            };
            let reason = said
                .strip_prefix(FAILED)
                .map(|why| format!(": {}", String::from_utf8_lossy(why).trim_end()))
                .unwrap_or_default();
            Err(match exited {
                Ok(status) => {
                    format!("the new process exited ({status}) before it was ready{reason}")
                }
                Err(e) => format!("cannot wait for the new process: {e}{reason}"),
            })
        })
        .await;
        match outcome {
            Ok(Ok(())) => {
                // It runs on after this process exits: not killed when the handle goes, and
                // never waited for (it is the service now; its parent exits soon).
                std::mem::forget(child);
                Ok(pid)
            }
            Ok(Err(why)) => Err(why),
            Err(_) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                Err(format!(
                    "the new process was not ready within {}s; stopped it",
                    READY_TIMEOUT.as_secs()
                ))
            }
        }
    }
}

/// `fd`, moved to a number of 3 or more if it is below.
fn above_stdio(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    if fd.as_raw_fd() >= 3 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC makes a new fd nothing else owns; `fd` closes when dropped.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if moved == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(moved) })
}

/// Why this process must not start a successor, if it must not: its exit (after the drain)
/// would take the successor down with it, as PID 1 of a container, or as the main process of a
/// systemd unit that cannot be told the successor's pid (no `Type=notify`).
pub(crate) fn refusal() -> Option<&'static str> {
    if std::process::id() == 1 {
        return Some(
            "this process is PID 1 (a container's init): its exit would end the successor too; replace the container instead",
        );
    }
    let systemd = std::env::var_os("INVOCATION_ID").is_some();
    if systemd && std::env::var_os(crate::notify::NOTIFY_SOCKET).is_none() {
        return Some(
            "systemd runs this process without Type=notify, so it cannot be told the successor's pid and would stop the unit when this process exits; use the packaged unit (Type=notify, NotifyAccess=main)",
        );
    }
    None
}

/// The file beside `pid_file` in which a failed upgrade says why, for `zerocache upgrade`.
pub(crate) fn failed_file(pid_file: &std::path::Path) -> PathBuf {
    let mut name = pid_file.as_os_str().to_owned();
    name.push(".upgrade-failed");
    PathBuf::from(name)
}

/// In a successor: the pipe on which to tell the process that started it that this one serves,
/// or why it could not; none in a process not started by an upgrade. Taken at the first call: at
/// start-up, after the inherited sockets (it must be none of them), or by a start that fails
/// before (a config error), which says why on it.
fn pipe() -> std::sync::MutexGuard<'static, Option<OwnedFd>> {
    static PIPE: std::sync::OnceLock<std::sync::Mutex<Option<OwnedFd>>> =
        std::sync::OnceLock::new();
    PIPE.get_or_init(|| std::sync::Mutex::new(take_pipe()))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether this process was started by an upgrade with a pipe to answer on (taking it now).
pub(crate) fn has_ready_pipe() -> bool {
    pipe().is_some()
}

/// A successor that cannot start says why to the process that started it, which says it in its
/// log and beside the pid file for `zerocache upgrade`. Nothing in a process not started so.
pub fn tell_failed(why: &str) {
    if !started_by_upgrade() {
        return;
    }
    if let Some(p) = pipe().take() {
        let mut word = FAILED.to_vec();
        word.extend_from_slice(why.as_bytes());
        word.truncate(WORD_MAX as usize - 1);
        word.push(b'\n');
        let _ = nix::unistd::write(&p, &word);
    }
}

fn take_pipe() -> Option<OwnedFd> {
    if !started_by_upgrade() {
        return None;
    }
    let fd = std::env::var(READY_FD).ok()?.parse::<i32>().ok()?;
    // SAFETY: fstat on any number only reads (or fails for a closed one); the buffer is ours.
    let is_fifo = fd >= 3
        && unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
        };
    if !is_fifo {
        tracing::warn!(
            fd,
            "{READY_FD} names no pipe; the old process will not hear we are ready"
        );
        return None;
    }
    // SAFETY: the fd was handed to this process for this one write, and is owned from here on
    // (the variable is read once, at start-up); close-on-exec so no later child inherits it.
    let pipe = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    let _ = fcntl(&pipe, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    Some(pipe)
}

/// Tells the process that started this one that it serves, and closes the pipe.
pub(crate) fn tell_ready() {
    let Some(pipe) = self::pipe().take() else {
        return;
    };
    if let Err(e) = nix::unistd::write(&pipe, READY) {
        tracing::warn!(error = %e, "cannot tell the old process we are ready");
    }
}
