//! The JSON API: `/api/stats`, `/api/connections`, `/api/processes`. The same figures as the page
//! and `/metrics`, documented in docs/dashboard-and-metrics.md.

use crate::history::Sample;
use crate::server::{CacheStats, DashboardState};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use zerocache_ledger::{BodyTotals, CacheStatus, ConnRecord, DataPath, SortKey, Violation};
use zerocache_probe::{FdCounts, KindCounts, ProbeHealth, ProbeStatus, kind};

/// Seconds of history behind the "now" ratio.
pub const RECENT_SECONDS: usize = 10;

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
    /// Body bytes by `STATUS/path`, path being the one the proxy intended.
    pub body_bytes: BTreeMap<String, u64>,
    /// Kernel-verified body bytes: closed connections plus the live ones.
    pub kernel_body: BodyTotals,
    /// Body zero-copy ratio since start (kernel-verified); null before any body.
    pub body_zero_copy_ratio: Option<f64>,
    /// The same over the last [`RECENT_SECONDS`] seconds; null when no body moved.
    pub body_zero_copy_ratio_recent: Option<f64>,
    /// Violations (responses).
    pub violations: u64,
    /// Bytes involved in violations.
    pub violation_bytes: u64,
    /// Violations in the last [`RECENT_SECONDS`] seconds.
    pub violations_recent: u64,
    /// Most recent violations, newest last.
    pub recent_violations: Vec<Violation>,
    /// Hits ÷ (hits + misses + expired).
    pub hit_ratio: Option<f64>,
    /// Body bytes the proxy copied through user space, by reason (`miss`, `tls-userspace`, ...).
    pub copied_body_bytes: BTreeMap<&'static str, u64>,
    /// The TLS listener, its handshakes, and whether the kernel offers kTLS.
    pub tls: zerocache_ledger::TlsSnapshot,
    /// Cache usage and health.
    pub cache: CacheStats,
    /// zerocache's own socket syscalls by kind.
    pub syscalls: BTreeMap<&'static str, KindCounts>,
    /// Every configured upstream server: up or down, and what it answered.
    pub upstreams: Vec<UpstreamServer>,
    /// Upstream errors (refused, timed out, reset, ...) by group and kind, those seen so far.
    pub upstream_errors: Vec<UpstreamError>,
    /// Responses sent with a 5xx status, the proxy's own and the origins' relayed.
    pub responses_5xx: u64,
    /// Sliced objects (`routes[].slice`): what was fetched, what was a hit.
    pub slices: SliceStats,
    /// Per-second samples of the cumulative counters, oldest first.
    pub history: Vec<Sample>,
}

/// Sliced objects in `/api/stats` (the `zerocache_slice_*` metrics).
#[derive(Serialize)]
pub struct SliceStats {
    /// Slices fetched from the origin and stored.
    pub fetches: u64,
    /// Their body bytes.
    pub fetched_bytes: u64,
    /// Slices whose bytes were sent from the store.
    pub hits: u64,
    /// Objects found changed at the origin between slices (their slices dropped).
    pub objects_changed: u64,
    /// Objects served unsliced for a while, by reason; those seen so far.
    pub unsliced: BTreeMap<&'static str, u64>,
}

/// One upstream server in `/api/stats`.
#[derive(Serialize)]
pub struct UpstreamServer {
    /// Its group (`upstreams.NAME`).
    pub upstream: String,
    /// Its `host:port`.
    pub server: String,
    /// Whether the balancer may pick it (not marked down by failures or the health check).
    pub up: bool,
    /// Response heads it sent.
    pub responses: u64,
    /// Of those, 5xx.
    pub responses_5xx: u64,
}

/// Upstream errors of one kind in one group, in `/api/stats`.
#[derive(Serialize)]
pub struct UpstreamError {
    /// The group.
    pub upstream: String,
    /// What failed (`connect`, `timeout`, ...).
    pub kind: &'static str,
    /// How many times.
    pub count: u64,
}

/// The live kernel records of this process's fds: fd → (generation, counts).
pub fn live(state: &DashboardState) -> HashMap<u32, (u64, FdCounts)> {
    state
        .probe
        .live_fds(std::process::id())
        .into_iter()
        .filter(|(_, _, socket, _)| *socket)
        .map(|(fd, generation, _, counts)| (fd, (generation, counts)))
        .collect()
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
    let kernel_body = acc.body_totals_with_live(&live(state));
    let mut syscalls = BTreeMap::new();
    if let Some(me) = snap.processes.iter().find(|p| p.pid == std::process::id()) {
        for (i, name) in kind::NAMES.iter().enumerate() {
            syscalls.insert(*name, me.socket.by_kind[i]);
        }
    }
    let io_uring: u64 = snap.processes.iter().map(|p| p.io_uring_enter).sum();
    let mut blind_spots = crate::probe_state::gaps(&snap.status);
    blind_spots.extend([
        "io_uring operations are not syscalls: they pass the syscall tracepoints unseen."
            .to_string(),
        "sendfile can copy inside the kernel for some files (O_DIRECT, sockets without scatter-gather); syscall tracepoints cannot tell.".to_string(),
        "sendmmsg returns a message count, so its bytes are not counted.".to_string(),
    ]);
    if io_uring > 0 {
        blind_spots.insert(
            0,
            format!(
                "{io_uring} io_uring_enter calls by watched processes: I/O the probe cannot classify."
            ),
        );
    }
    let history = state.history.lock().samples();
    let (recent_ratio, violations_recent) = recent(&history, RECENT_SECONDS);
    let answered = acc.upstream_responses();
    let upstreams = (state.upstream_servers)()
        .into_iter()
        .map(|(upstream, server, up)| {
            let of = |five: bool| -> u64 {
                answered
                    .iter()
                    .filter(|((g, s, code), _)| {
                        *g == upstream && *s == server && (!five || *code >= 500)
                    })
                    .map(|(_, n)| n)
                    .sum()
            };
            UpstreamServer {
                responses: of(false),
                responses_5xx: of(true),
                upstream,
                server,
                up,
            }
        })
        .collect();
    Stats {
        probe: snap.status,
        probe_health: snap.health,
        blind_spots,
        requests,
        body_bytes,
        body_zero_copy_ratio: kernel_body.ratio(),
        body_zero_copy_ratio_recent: recent_ratio,
        kernel_body,
        violations: acc.violations(),
        violation_bytes: acc.violation_bytes(),
        violations_recent,
        recent_violations: acc.recent_violations(),
        hit_ratio: (lookups > 0).then(|| hits as f64 / lookups as f64),
        copied_body_bytes: zerocache_ledger::CopyReason::ALL
            .iter()
            .map(|r| (r.as_str(), acc.copied.get(*r)))
            .collect(),
        tls: acc.tls.snapshot(),
        cache: (state.cache)(),
        syscalls,
        upstreams,
        upstream_errors: acc
            .upstream_errors()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|((upstream, kind), count)| UpstreamError {
                upstream,
                kind,
                count,
            })
            .collect(),
        responses_5xx: acc
            .responses_by_code()
            .iter()
            .filter(|(_, code, _, _)| *code >= 500)
            .map(|(_, _, _, n)| n)
            .sum(),
        slices: {
            let (fetches, fetched_bytes, hits, objects_changed) = acc.slices.totals();
            SliceStats {
                fetches,
                fetched_bytes,
                hits,
                objects_changed,
                unsliced: acc
                    .slices
                    .unsliced_by_reason()
                    .filter(|(_, n)| *n > 0)
                    .collect(),
            }
        },
        history: if with_history { history } else { Vec::new() },
    }
}

/// Ratio and violations over the last `secs` samples.
fn recent(history: &[Sample], secs: usize) -> (Option<f64>, u64) {
    let (Some(last), Some(first)) = (
        history.last(),
        history.get(history.len().saturating_sub(secs + 1)),
    ) else {
        return (None, 0);
    };
    let zc = last.body_zerocopy.saturating_sub(first.body_zerocopy);
    let cp = last.body_copy.saturating_sub(first.body_copy);
    let ratio = (zc + cp > 0).then(|| zc as f64 / (zc + cp) as f64);
    (ratio, last.violations.saturating_sub(first.violations))
}

/// `/api/connections`.
#[derive(Serialize)]
pub struct Connections {
    /// Open connections, with their live kernel figures.
    pub active: Vec<ConnRecord>,
    /// One page of closed connections.
    pub closed: Vec<ConnRecord>,
    /// Closed connections held (the page is a slice of these).
    pub closed_total: usize,
    /// Closed connections dropped from the bounded history.
    pub closed_evicted: u64,
}

/// Builds `/api/connections`.
pub fn connections(
    state: &DashboardState,
    offset: usize,
    limit: usize,
    sort: SortKey,
    ascending: bool,
) -> Connections {
    let active = state.accounting.active(&live(state));
    let (closed, closed_total, closed_evicted) =
        state.accounting.closed_page(offset, limit, sort, ascending);
    Connections {
        active,
        closed,
        closed_total,
        closed_evicted,
    }
}

pub use crate::processes::Process;

/// Builds `/api/processes`.
pub fn processes(state: &DashboardState) -> Vec<Process> {
    crate::processes::rows(&state.probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(zc: u64, cp: u64, v: u64) -> Sample {
        Sample {
            body_zerocopy: zc,
            body_copy: cp,
            violations: v,
            ..Sample::default()
        }
    }

    #[test]
    fn recent_window_uses_differences() {
        let h: Vec<Sample> = (0..20)
            .map(|i| s(i * 100, if i >= 15 { (i - 15) * 100 } else { 0 }, i / 10))
            .collect();
        // Last 10 s: zc +1000, copy +400.
        let (r, v) = recent(&h, 10);
        assert_eq!(r, Some(1000.0 / 1400.0));
        assert_eq!(v, 1);
        assert_eq!(recent(&[], 10), (None, 0));
    }
}
