//! The process-wide counters: responses by cache status, data path and status code, upstream
//! answers and errors, rejected connections, reloads, and the two latency histograms. The data
//! plane updates them with relaxed atomics (one per response, no lock on a hit); `/metrics`, the
//! JSON API and the dashboard read them.

use crate::join::ConnState;
use crate::records::ResponseRecord;
use crate::routes::{RouteCounters, RouteTable};
use crate::vocabulary::{CacheStatus, ConnId, DataPath, Protocol, REJECT_REASONS, RejectReason};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What `zerocache_h2_events_total` counts: `connections` (h2 by ALPN or h2c), `streams`
/// (requests), `malformed` (streams refused before any byte went upstream: a field HTTP/2 forbids
/// or a request the HTTP/1.1 path could not carry), `refused` (well formed but not served: CONNECT),
/// `client-resets` (RST_STREAM from the client),
/// `send-timeouts` (a stream whose client took nothing within `send_timeout`, reset),
/// `connection-errors` (the connection closed with an error: a flood, a protocol violation, a
/// broken socket), `goaway` (a graceful GOAWAY on drain or idle), `enhance-your-calm` (GOAWAY
/// to a client that reset most of its streams: rapid reset).
pub const H2_EVENTS: [&str; 9] = [
    "connections",
    "streams",
    "malformed",
    "refused",
    "client-resets",
    "send-timeouts",
    "connection-errors",
    "goaway",
    "enhance-your-calm",
];

/// What a purge named: one URL, every URL under a prefix, or every entry with a tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PurgeKind {
    /// One URL.
    Url,
    /// A URL prefix.
    Prefix,
    /// Cache tags.
    Tag,
}

impl PurgeKind {
    /// All values, in metric order.
    pub const ALL: [PurgeKind; 3] = [PurgeKind::Url, PurgeKind::Prefix, PurgeKind::Tag];

    /// The `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            PurgeKind::Url => "url",
            PurgeKind::Prefix => "prefix",
            PurgeKind::Tag => "tag",
        }
    }
}

/// The accounting shared by the data plane and the dashboard.
pub struct Accounting {
    /// By protocol, then cache status.
    requests: [[AtomicU64; 7]; 2],
    /// Of `requests`, those a fleet peer forwarded here (source `peer`).
    peer_requests: [AtomicU64; 7],
    body_bytes: [[AtomicU64; 2]; 7],
    pub(crate) violations: AtomicU64,
    pub(crate) violation_bytes: AtomicU64,
    cold_offloads: AtomicU64,
    corrupt_entries: AtomicU64,
    pub(crate) next_conn: AtomicU64,
    upstream_errors: Mutex<HashMap<(String, &'static str), u64>>,
    /// Responses that could have been stored and were not, by `Cache-Status` detail token.
    not_stored: Mutex<HashMap<&'static str, u64>>,
    /// Upgrade requests by outcome (`switched`, `refused`, `failed`).
    upgrades: Mutex<HashMap<&'static str, u64>>,
    h2_events: Mutex<HashMap<&'static str, u64>>,
    /// Upstream response heads received, by (group, server, status code).
    upstream_responses: Mutex<HashMap<(String, String, u16), u64>>,
    /// `zerocache_upstream_response_seconds`: request sent to response head, by group.
    upstream_seconds: prometheus::HistogramVec,
    /// Responses by protocol, status code (100-599) and cache status:
    /// `(protocol * 500 + code - 100) * 7 + cache status`.
    by_code: Box<[AtomicU64]>,
    /// Connections answered 503 at accept, by [`REJECT_REASONS`] index.
    rejected: [AtomicU64; 2],
    /// Config reloads: accepted, rejected.
    reloads: [AtomicU64; 2],
    /// SIGUSR2 binary upgrades: the successor served, it did not.
    binary_upgrades: [AtomicU64; 2],
    /// Purges carried out on this node, by [`PurgeKind`] and hard (0) or soft (1).
    purges: [[AtomicU64; 2]; 3],
    /// Responses by route (the `route` label), with `zerocache_request_duration_seconds`.
    routes: RouteTable,
    /// `routes`'s `-`, without its lock.
    no_route: &'static RouteCounters,
    pub(crate) state: Mutex<ConnState>,
    pub(crate) closed_capacity: usize,
    pub(crate) probe_attached: bool,
    /// Reads the kernel's generation of one of this process's fds (see [`Accounting::set_generations`]).
    pub(crate) generations: Option<Generations>,
    /// Copied body bytes by reason.
    pub copied: crate::copy_reason::CopiedBytes,
    /// Sliced objects (`routes[].slice`).
    pub slices: crate::slices::SliceCounts,
    /// TLS handshakes and kTLS availability.
    pub tls: crate::tls_stats::TlsStats,
}

/// See [`Accounting::set_generations`].
pub(crate) type Generations = Box<dyn Fn(u32) -> Option<u64> + Send + Sync>;

impl Accounting {
    /// New, empty accounting. `probe_attached`: whether kernel records will arrive to join.
    pub fn new(closed_capacity: usize, probe_attached: bool) -> Accounting {
        let durations = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "zerocache_request_duration_seconds",
                "Time from a complete request head to the last response byte, by cache status and route.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ]),
            &["cache_status", "route"],
        )
        .expect("static histogram options are valid");
        let (routes, no_route) = RouteTable::new(durations);
        let upstream_seconds = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "zerocache_upstream_response_seconds",
                "Time from sending a request upstream to its response head, by upstream group.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["upstream"],
        )
        .expect("static histogram options are valid");
        Accounting {
            requests: Default::default(),
            peer_requests: Default::default(),
            body_bytes: Default::default(),
            violations: AtomicU64::new(0),
            violation_bytes: AtomicU64::new(0),
            cold_offloads: AtomicU64::new(0),
            corrupt_entries: AtomicU64::new(0),
            next_conn: AtomicU64::new(1),
            upstream_errors: Mutex::new(HashMap::new()),
            not_stored: Mutex::default(),
            upgrades: Mutex::default(),
            h2_events: Mutex::default(),
            upstream_responses: Mutex::new(HashMap::new()),
            upstream_seconds,
            rejected: Default::default(),
            reloads: Default::default(),
            binary_upgrades: Default::default(),
            purges: Default::default(),
            by_code: (0..Protocol::ALL.len() * 500 * CacheStatus::ALL.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            routes,
            no_route,
            state: Mutex::new(ConnState::default()),
            closed_capacity,
            probe_attached,
            generations: None,
            copied: Default::default(),
            slices: Default::default(),
            tls: Default::default(),
        }
    }

    /// Gives the join the kernel's generation numbers: `read(fd)` is called at each accept and
    /// answers the generation the probe gave the socket now on `fd` of this process.
    pub fn set_generations(&mut self, read: impl Fn(u32) -> Option<u64> + Send + Sync + 'static) {
        self.generations = Some(Box::new(read));
    }

    /// A response was sent completely (or as far as it went) on connection `id`, for a request
    /// of `route` ([`Accounting::no_route`] for one that matched none), to a fleet peer that
    /// forwarded it when `from_peer`.
    pub fn response(
        &self,
        id: ConnId,
        r: &ResponseRecord<'_>,
        route: &RouteCounters,
        from_peer: bool,
    ) {
        let cs = r.cache_status.index();
        let protocol = self.conn_response(id, r);
        let proto = protocol.index();
        self.requests[proto][cs].fetch_add(1, Ordering::Relaxed);
        if from_peer {
            self.peer_requests[cs].fetch_add(1, Ordering::Relaxed);
        }
        route.response(protocol, from_peer, r);
        let p = if r.path == DataPath::Zerocopy { 0 } else { 1 };
        self.body_bytes[cs][p].fetch_add(r.body_bytes, Ordering::Relaxed);
        if (100..600).contains(&r.status) {
            let i = (proto * 500 + usize::from(r.status - 100)) * CacheStatus::ALL.len() + cs;
            self.by_code[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A hit's pages were not in the page cache and were read in on the blocking pool.
    pub fn cold_offload(&self) {
        self.cold_offloads.fetch_add(1, Ordering::Relaxed);
    }

    /// Hits whose pages had to be read in first.
    pub fn cold_offloads(&self) -> u64 {
        self.cold_offloads.load(Ordering::Relaxed)
    }

    /// `n` cache entries were found corrupt (their body no longer had its checksum) and discarded.
    pub fn corrupt_entries_found(&self, n: u64) {
        self.corrupt_entries.fetch_add(n, Ordering::Relaxed);
    }

    /// Cache entries found corrupt and discarded since start.
    pub fn corrupt_entries(&self) -> u64 {
        self.corrupt_entries.load(Ordering::Relaxed)
    }

    /// Server `server` of group `upstream` answered with a response head of status `code`,
    /// `time` after the request was sent.
    pub fn upstream_response(&self, upstream: &str, server: &str, code: u16, time: Duration) {
        *self
            .upstream_responses
            .lock()
            .entry((upstream.to_string(), server.to_string(), code))
            .or_insert(0) += 1;
        self.upstream_seconds
            .with_label_values(&[upstream])
            .observe(time.as_secs_f64());
    }

    /// Upstream response heads so far, by (group, server, status code).
    pub fn upstream_responses(&self) -> Vec<((String, String, u16), u64)> {
        self.upstream_responses
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// The upstream response-time histogram.
    pub fn upstream_seconds(&self) -> &prometheus::HistogramVec {
        &self.upstream_seconds
    }

    /// A failed upstream exchange of group `upstream`, by kind.
    pub fn upstream_error(&self, upstream: &str, kind: &'static str) {
        *self
            .upstream_errors
            .lock()
            .entry((upstream.to_string(), kind))
            .or_insert(0) += 1;
    }

    /// A response that could have been stored was not, for `reason` (its `Cache-Status`
    /// detail: `too-large`, `no-freshness`, ...).
    pub fn not_stored(&self, reason: &'static str) {
        *self.not_stored.lock().entry(reason).or_insert(0) += 1;
    }

    /// An Upgrade request ended so: `switched` (the origin's 101, then a tunnel), `refused` (the
    /// origin answered otherwise) or `failed` (no answer).
    pub fn upgrade(&self, outcome: &'static str) {
        *self.upgrades.lock().entry(outcome).or_insert(0) += 1;
    }

    /// Something happened on an HTTP/2 connection: one of [`H2_EVENTS`].
    pub fn h2_event(&self, event: &'static str) {
        *self.h2_events.lock().entry(event).or_insert(0) += 1;
    }

    /// HTTP/2 events by name, sorted.
    pub fn h2_event_counts(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self
            .h2_events
            .lock()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        v.sort();
        v
    }

    /// Upgrade requests by outcome, sorted.
    pub fn upgrade_counts(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self.upgrades.lock().iter().map(|(k, v)| (*k, *v)).collect();
        v.sort();
        v
    }

    /// Responses not stored, by reason, sorted.
    pub fn not_stored_counts(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self
            .not_stored
            .lock()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        v.sort();
        v
    }

    /// Requests answered with `cs`.
    pub fn requests(&self, cs: CacheStatus) -> u64 {
        Protocol::ALL.iter().map(|p| self.requests_in(*p, cs)).sum()
    }

    /// Of [`Accounting::requests`] with `cs`, those answered in `protocol`.
    pub fn requests_in(&self, protocol: Protocol, cs: CacheStatus) -> u64 {
        self.requests[protocol.index()][cs.index()].load(Ordering::Relaxed)
    }

    /// A purge was carried out on this node (from the API, a `PURGE` request or a fleet peer).
    pub fn purge(&self, kind: PurgeKind, soft: bool) {
        self.purges[kind as usize][usize::from(soft)].fetch_add(1, Ordering::Relaxed);
    }

    /// Purges by (kind, `hard` or `soft`, count), every combination.
    pub fn purges(&self) -> Vec<(PurgeKind, &'static str, u64)> {
        PurgeKind::ALL
            .iter()
            .flat_map(|k| {
                ["hard", "soft"].iter().enumerate().map(move |(s, mode)| {
                    (
                        *k,
                        *mode,
                        self.purges[*k as usize][s].load(Ordering::Relaxed),
                    )
                })
            })
            .collect()
    }

    /// The counters of the route named `name` (its `routes[].name`, else its index), made on
    /// first use and kept across reloads.
    pub fn route(&self, name: &str) -> &'static RouteCounters {
        self.routes.named(name)
    }

    /// The counters of requests that matched no route (`route="-"`).
    pub fn no_route(&self) -> &'static RouteCounters {
        self.no_route
    }

    /// Every route's counters, `-` first.
    pub fn routes(&self) -> Vec<&'static RouteCounters> {
        self.routes.all()
    }

    /// Of [`Accounting::requests`] with `cs`, those forwarded by a fleet peer.
    pub fn peer_requests(&self, cs: CacheStatus) -> u64 {
        self.peer_requests[cs.index()].load(Ordering::Relaxed)
    }

    /// Body bytes sent with `cs` on `path`.
    pub fn body_bytes(&self, cs: CacheStatus, path: DataPath) -> u64 {
        let p = if path == DataPath::Zerocopy { 0 } else { 1 };
        self.body_bytes[cs.index()][p].load(Ordering::Relaxed)
    }

    /// Violations (responses) so far.
    pub fn violations(&self) -> u64 {
        self.violations.load(Ordering::Relaxed)
    }

    /// Body bytes involved in violations so far.
    pub fn violation_bytes(&self) -> u64 {
        self.violation_bytes.load(Ordering::Relaxed)
    }

    /// Upstream errors by (upstream, kind).
    pub fn upstream_errors(&self) -> Vec<((String, &'static str), u64)> {
        let mut v: Vec<_> = self
            .upstream_errors
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        v.sort();
        v
    }

    /// The request-duration histogram.
    pub fn durations(&self) -> &prometheus::HistogramVec {
        self.routes.durations()
    }

    /// `n` connections were answered 503 at accept for `reason` (one of [`REJECT_REASONS`]).
    pub fn connections_rejected(&self, reason: RejectReason, n: u64) {
        self.rejected[reason as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Connections rejected so far, by reason.
    pub fn rejected(&self) -> [(RejectReason, u64); 2] {
        REJECT_REASONS.map(|r| (r, self.rejected[r as usize].load(Ordering::Relaxed)))
    }

    /// A SIGHUP reload was accepted (`true`) or rejected (`false`, the running config kept).
    pub fn config_reload(&self, accepted: bool) {
        self.reloads[usize::from(!accepted)].fetch_add(1, Ordering::Relaxed);
    }

    /// Reloads so far: (accepted, rejected).
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.reloads[0].load(Ordering::Relaxed),
            self.reloads[1].load(Ordering::Relaxed),
        )
    }

    /// A SIGUSR2 upgrade ended: its successor serves (`true`), or it did not and this process
    /// keeps serving (`false`).
    pub fn binary_upgrade(&self, served: bool) {
        self.binary_upgrades[usize::from(!served)].fetch_add(1, Ordering::Relaxed);
    }

    /// SIGUSR2 upgrades so far: (the successor served, it did not).
    pub fn binary_upgrades(&self) -> (u64, u64) {
        (
            self.binary_upgrades[0].load(Ordering::Relaxed),
            self.binary_upgrades[1].load(Ordering::Relaxed),
        )
    }

    /// Responses sent so far by status code and cache status, those with at least one.
    pub fn responses_by_code(&self) -> Vec<(Protocol, u16, CacheStatus, u64)> {
        let n = CacheStatus::ALL.len();
        self.by_code
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let v = c.load(Ordering::Relaxed);
                let (proto, code) = ((i / n) / 500, (i / n) % 500);
                (v > 0).then(|| {
                    (
                        Protocol::ALL[proto],
                        code as u16 + 100,
                        CacheStatus::ALL[i % n],
                        v,
                    )
                })
            })
            .collect()
    }
}
