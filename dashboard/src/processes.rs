//! One row per watched process: `/api/processes` (proxy and watch mode alike), the rows of
//! `zerocache watch`'s terminal table and its `--json` output. One type, so the field names are
//! the same everywhere (documented in docs/dashboard-and-metrics.md and docs/watch.md).

use serde::Serialize;
use zerocache_probe::{Probe, ProcessTotals};

/// One entry of `/api/processes`.
#[derive(Clone, Debug, Serialize)]
pub struct Process {
    /// `pid`, `comm`, `socket` and `other` (per syscall: calls, bytes, errors, eagain, short),
    /// `io_uring_enter`, `file_read_calls`, `file_read_bytes`, `copy_loop_bytes`, `alive`.
    #[serde(flatten)]
    pub totals: ProcessTotals,
    /// Socket bytes via sendfile/splice ÷ all socket bytes written; null before any.
    pub socket_zero_copy_ratio: Option<f64>,
    /// Copy-loop bytes ÷ all socket bytes written: the share of what the process sent that a
    /// copy loop moved from a file; null before any socket byte.
    pub copy_loop_share: Option<f64>,
    /// Sockets of the process with live records (written to since the watch began); 0 once it
    /// exited.
    pub connections: usize,
    /// See [`verdict`].
    pub verdict: &'static str,
    /// The command line (`/proc/PID/cmdline`, arguments joined by spaces, at most 160 bytes);
    /// empty once the process exited or when it cannot be read.
    pub cmdline: String,
}

/// The verdict for a process or a connection from its socket byte counts: `copy-loop` when
/// copy-loop bytes are at least 1% of what was sent (or there were no zero-copy bytes at all),
/// else `zero-copy` when some bytes went via sendfile/splice, `copy` when every byte was copied
/// but none came from a file (generated responses), `idle` before any byte. The 1%: a runtime
/// reads its own files now and then (a JVM loads a response's classes from lib/modules with
/// pread64), and a few hundred bytes of those matched by a response head beside megabytes of
/// sendfile do not make a server a copy loop; its copy-loop bytes are still counted exactly.
pub fn verdict(zero_copy: u64, copied: u64, copy_loop: u64) -> &'static str {
    let all = zero_copy + copied;
    if copy_loop > 0 && (zero_copy == 0 || copy_loop.saturating_mul(100) >= all) {
        "copy-loop"
    } else if zero_copy > 0 {
        "zero-copy"
    } else if copied > 0 {
        "copy"
    } else {
        "idle"
    }
}

impl Process {
    /// The row for one process's totals; `connections` counted by the caller.
    pub fn new(totals: ProcessTotals, connections: usize) -> Process {
        let zc = totals.socket.zero_copy_bytes();
        let cp = totals.socket.copy_bytes();
        let all = zc + cp;
        let ratio = |n: u64| (all > 0).then(|| n as f64 / all as f64);
        Process {
            socket_zero_copy_ratio: ratio(zc),
            copy_loop_share: ratio(totals.copy_loop_bytes),
            verdict: verdict(zc, cp, totals.copy_loop_bytes),
            connections,
            cmdline: String::new(),
            totals,
        }
    }
}

/// `/proc/PID/cmdline` with NULs as spaces, cut at 160 bytes (on a character boundary).
fn cmdline(pid: u32) -> String {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return String::new();
    };
    let text: String = String::from_utf8_lossy(&raw)
        .trim_end_matches('\0')
        .replace('\0', " ");
    let mut end = text.len().min(160);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Every watched (or once watched) process, live ones with their count of live sockets.
pub fn rows(probe: &Probe) -> Vec<Process> {
    probe
        .snapshot()
        .processes
        .into_iter()
        .map(|p| {
            let connections = if p.alive {
                probe
                    .live_fds(p.pid)
                    .iter()
                    .filter(|(_, _, socket, _)| *socket)
                    .count()
            } else {
                0
            };
            let alive = p.alive;
            let pid = p.pid;
            let mut row = Process::new(p, connections);
            if alive {
                row.cmdline = cmdline(pid);
            }
            row
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        assert_eq!(verdict(0, 0, 0), "idle");
        assert_eq!(verdict(0, 100, 0), "copy");
        assert_eq!(verdict(0, 100, 1), "copy-loop");
        assert_eq!(verdict(1 << 20, 255, 0), "zero-copy");
        // A JVM's class bytes matched by a head beside 48 MiB of sendfile.
        assert_eq!(verdict(48 << 20, 255, 170), "zero-copy");
        assert_eq!(verdict(1000, 1000, 20), "copy-loop");
    }

    #[test]
    fn reads_its_own_cmdline() {
        let me = cmdline(std::process::id());
        assert!(!me.is_empty() && me.len() <= 160, "{me}");
        assert!(!me.contains('\0'));
        assert_eq!(cmdline(u32::MAX), "");
    }
}
