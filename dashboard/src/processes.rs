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
    /// `zero-copy` (socket bytes, none of them copy-loop bytes, some via sendfile/splice),
    /// `copy-loop` (some copy-loop bytes), `copy` (only copying sends, none from a file) or
    /// `idle` (no socket bytes yet).
    pub verdict: &'static str,
}

/// The verdict for a process or a connection from its byte counts.
pub fn verdict(zero_copy: u64, copied: u64, copy_loop: u64) -> &'static str {
    if copy_loop > 0 {
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
            totals,
        }
    }
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
            Process::new(p, connections)
        })
        .collect()
}
