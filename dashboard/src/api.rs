//! The JSON API: `/api/stats`, `/api/connections`, `/api/processes`. The same figures as the page
//! and `/metrics`, documented in the README.

use crate::accounting::{CacheStatus, ConnRecord, DataPath, Violation};
use crate::history::Sample;
use crate::server::DashboardState;
use serde::Serialize;
use std::collections::BTreeMap;
use zerocache_probe::{ProbeHealth, ProbeStatus, ProcessTotals, kind};

/// `/api/stats`.
#[derive(Serialize)]
pub struct Stats {
    /// Probe status.
    pub probe: ProbeStatus,
    /// Probe loss counters.
    pub probe_health: ProbeHealth,
    /// What the probe cannot see, in plain words.
    pub blind_spots: Vec<String>,
    /// Responses by cache status.
    pub requests: BTreeMap<&'static str, u64>,
    /// Body bytes by cache status and intended path.
    pub body_bytes: BTreeMap<String, u64>,
    /// Kernel-verified body bytes over closed connections.
    pub kernel_body: crate::accounting::BodyTotals,
    /// Body zero-copy ratio (kernel-verified), null before any body.
    pub body_zero_copy_ratio: Option<f64>,
    /// Violations (responses).
    pub violations: u64,
    /// Bytes involved in violations.
    pub violation_bytes: u64,
    /// Most recent violations.
    pub recent_violations: Vec<Violation>,
    /// Hits ÷ (hits + misses + expired).
    pub hit_ratio: Option<f64>,
    /// Cache usage and health.
    pub cache: crate::server::CacheStats,
    /// zerocache's own socket syscalls by kind.
    pub syscalls: BTreeMap<&'static str, zerocache_probe::KindCounts>,
    /// Per-second samples of the cumulative counters.
    pub history: Vec<Sample>,
}

/// Builds `/api/stats`.
pub fn stats(state: &DashboardState, with_history: bool) -> Stats {
    let acc = &state.accounting;
    let snap = state.probe.snapshot();
    let mut requests = BTreeMap::new();
    let mut body_bytes = BTreeMap::new();
    for cs in CacheStatus::ALL {
        requests.insert(cs.as_str(), acc.requests(cs));
        for p in [DataPath::Zerocopy, DataPath::Copy] {
            body_bytes.insert(
                format!("{}/{}", cs.as_str(), p.as_str()),
                acc.body_bytes(cs, p),
            );
        }
    }
    let hits = acc.requests(CacheStatus::Hit);
    let lookups = hits + acc.requests(CacheStatus::Miss) + acc.requests(CacheStatus::Expired);
    let kernel_body = acc.body_totals();
    let mut syscalls = BTreeMap::new();
    if let Some(me) = snap.processes.iter().find(|p| p.pid == std::process::id()) {
        for (i, name) in kind::NAMES.iter().enumerate() {
            syscalls.insert(*name, me.socket.by_kind[i]);
        }
    }
    let io_uring: u64 = snap.processes.iter().map(|p| p.io_uring_enter).sum();
    let mut blind_spots = vec![
        "io_uring operations are not syscalls: they pass the syscall tracepoints unseen.".to_string(),
        "sendfile can copy inside the kernel for some files (O_DIRECT, sockets without scatter-gather); syscall tracepoints cannot tell.".to_string(),
        "sendmmsg returns a message count, so its bytes are not counted.".to_string(),
    ];
    if io_uring > 0 {
        blind_spots.insert(
            0,
            format!("{io_uring} io_uring_enter calls by watched processes: I/O the probe cannot classify."),
        );
    }
    Stats {
        probe: snap.status,
        probe_health: snap.health,
        blind_spots,
        requests,
        body_bytes,
        body_zero_copy_ratio: kernel_body.ratio(),
        kernel_body,
        violations: acc.violations(),
        violation_bytes: acc.violation_bytes(),
        recent_violations: acc.recent_violations(),
        hit_ratio: (lookups > 0).then(|| hits as f64 / lookups as f64),
        cache: (state.cache)(),
        syscalls,
        history: if with_history {
            state.history.lock().samples()
        } else {
            Vec::new()
        },
    }
}

/// `/api/connections`.
#[derive(Serialize)]
pub struct Connections {
    /// Open connections.
    pub active: Vec<ConnRecord>,
    /// Closed connections, newest first.
    pub closed: Vec<ConnRecord>,
    /// Closed connections dropped from the bounded history.
    pub closed_evicted: u64,
}

/// Builds `/api/connections`.
pub fn connections(state: &DashboardState, limit: usize) -> Connections {
    let (active, closed, closed_evicted) = state.accounting.connections(limit);
    Connections {
        active,
        closed,
        closed_evicted,
    }
}

/// One entry of `/api/processes`.
#[derive(Serialize)]
pub struct Process {
    /// Totals.
    #[serde(flatten)]
    pub totals: ProcessTotals,
    /// Socket bytes via sendfile/splice ÷ all socket bytes written.
    pub socket_zero_copy_ratio: Option<f64>,
}

/// Builds `/api/processes`.
pub fn processes(state: &DashboardState) -> Vec<Process> {
    state
        .probe
        .snapshot()
        .processes
        .into_iter()
        .map(|p| {
            let zc = p.socket.zero_copy_bytes();
            let all = zc + p.socket.copy_bytes();
            Process {
                socket_zero_copy_ratio: (all > 0).then(|| zc as f64 / all as f64),
                totals: p,
            }
        })
        .collect()
}
