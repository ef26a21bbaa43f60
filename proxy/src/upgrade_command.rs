//! `zerocache upgrade`: the binary upgrade from a shell or a package's `postinst`. It checks the
//! config the new binary will read (a bad one is refused here, before any signal), sends SIGUSR2
//! to the process `pid_file` names, waits until `pid_file` names its successor (which rewrites
//! it once it serves), then until the old process has drained and exited, and says what
//! happened. An upgrade that failed is reported with the reason the old process wrote beside
//! the pid file (`<pid_file>.upgrade-failed`), as soon as it is known.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often the pid file and the old process are looked at.
const POLL: Duration = Duration::from_millis(50);
/// Beyond the successor's own deadline ([`crate::upgrade::READY_TIMEOUT`]).
const MARGIN: Duration = Duration::from_secs(10);

/// Runs the command; `out` gets the report, `err` the errors.
pub fn main(config: &Path, out: &mut impl Write, err: &mut impl Write) -> ExitCode {
    match upgrade(config, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn upgrade(config: &Path, out: &mut impl Write) -> Result<(), String> {
    let c = zerocache_config::load_and_check_dirs(config, zerocache_config::Dirs::Untouched)
        .map_err(|e| {
            let each: Vec<String> = e.each().iter().map(|one| one.to_string()).collect();
            format!(
                "the config is not valid; nothing was signalled:\n{}",
                each.join("\n")
            )
        })?;
    let pid_file = c.pid_file.as_deref().ok_or_else(|| {
        format!(
            "{}: pid_file is not set; the upgrade finds the running process by it",
            config.display()
        )
    })?;
    let old = read_pid(pid_file)?
        .filter(|pid| alive(*pid))
        .ok_or_else(|| {
            format!(
                "{} names no running process: nothing to upgrade (start the service instead)",
                pid_file.display()
            )
        })?;
    // A pid file left by a killed process may name a pid reused since by another program, to
    // which SIGUSR2 (default action: terminate) must not go.
    let comm = std::fs::read_to_string(format!("/proc/{old}/comm")).unwrap_or_default();
    if comm.trim_end() != "zerocache" {
        return Err(format!(
            "{} names pid {old}, which is {:?}, not zerocache: a stale pid file; nothing was signalled",
            pid_file.display(),
            comm.trim_end()
        ));
    }
    let failed = crate::upgrade::failed_file(pid_file);
    let _ = std::fs::remove_file(&failed);
    // A pid read from the pid file, checked to be running zerocache just above.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(old).unwrap_or(-1));
    if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2) {
        return Err(format!(
            "cannot signal pid {old}: {}",
            std::io::Error::from(e)
        ));
    }
    let _ = writeln!(
        out,
        "signalled pid {old}; waiting for the new process to serve"
    );
    let deadline = Instant::now() + crate::upgrade::READY_TIMEOUT + MARGIN;
    let new = loop {
        if let Ok(why) = std::fs::read_to_string(&failed) {
            return Err(format!(
                "the new process did not take over: {}; pid {old} keeps serving",
                why.trim_end()
            ));
        }
        match read_pid(pid_file)? {
            Some(pid) if pid != old && alive(pid) => break pid,
            _ if !alive(old) => {
                return Err(format!(
                    "pid {old} exited and {} names no successor",
                    pid_file.display()
                ));
            }
            _ if Instant::now() > deadline => {
                return Err(format!(
                    "no new process within {}s; pid {old} keeps serving (its log says why)",
                    (crate::upgrade::READY_TIMEOUT + MARGIN).as_secs()
                ));
            }
            _ => std::thread::sleep(POLL),
        }
    };
    let _ = writeln!(out, "pid {new} serves; pid {old} drains");
    let drained = Instant::now() + c.limits.drain_timeout + MARGIN;
    while alive(old) && Instant::now() < drained {
        std::thread::sleep(POLL);
    }
    if alive(old) {
        let _ = writeln!(
            out,
            "upgraded: pid {old} -> {new}; pid {old} is still draining"
        );
    } else {
        let _ = writeln!(out, "upgraded: pid {old} -> {new}; pid {old} exited");
    }
    Ok(())
}

/// The pid in `path`; none if the file is missing (between a process's exit and the next one's
/// start). Anything but a pid and a newline is an error: the file is not ours.
fn read_pid(path: &Path) -> Result<Option<u32>, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => s
            .trim_end_matches('\n')
            .parse::<u32>()
            .ok()
            .filter(|pid| *pid > 1 && *pid <= i32::MAX as u32)
            .map(Some)
            .ok_or_else(|| format!("{} holds {s:?}, not a pid", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Whether process `pid` exists and is not a zombie (a successor's parent may not reap it).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_file_holds_one_pid_or_nothing() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("z.pid");
        assert_eq!(read_pid(&p), Ok(None));
        std::fs::write(&p, "4242\n").expect("write");
        assert_eq!(read_pid(&p), Ok(Some(4242)));
        for bad in ["", "1\n", "0\n", "-5\n", "42 43\n", "9999999999\n", "abc"] {
            std::fs::write(&p, bad).expect("write");
            assert!(read_pid(&p).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_zombie_is_not_alive() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id();
        // Not reaped yet: a zombie once it has exited.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!alive(pid));
        child.wait().expect("reap");
        assert!(!alive(pid));
    }
}
