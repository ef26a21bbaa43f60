//! The proxy's own account of what it served, and its reconciliation with the kernel's.
//!
//! The proxy knows, per response, which data path it meant to use (sendfile for hits, copy for
//! misses) and how many head and body bytes it sent; the probe knows, per socket, which syscalls
//! really carried them. Joining the two per connection (by fd, in close order, which the kernel
//! and the proxy agree on) gives the body zero-copy ratio and finds **violations**: body bytes the
//! proxy meant to send with sendfile that the kernel saw going through a copying syscall.

use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use zerocache_probe::{ClosedFd, FdCounts};

use crate::copy_reason::CopiedBytes;
use crate::tls_stats::{TLS_USERSPACE_VERDICT, TlsStats};

/// `X-Cache` values (nginx's `$upstream_cache_status`), plus `Error` for answers the proxy made up
/// itself (4xx for bad requests, 502/504).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CacheStatus {
    /// Served from a fresh entry.
    Hit,
    /// Not in the cache; fetched.
    Miss,
    /// In the cache but stale; fetched again.
    Expired,
    /// Stale entry served.
    Stale,
    /// Stale entry revalidated with the upstream.
    Revalidated,
    /// Cache not consulted (route, method or rule).
    Bypass,
    /// The proxy answered on its own (bad request, upstream failure).
    Error,
}

impl CacheStatus {
    /// All values, in metric order.
    pub const ALL: [CacheStatus; 7] = [
        CacheStatus::Hit,
        CacheStatus::Miss,
        CacheStatus::Expired,
        CacheStatus::Stale,
        CacheStatus::Revalidated,
        CacheStatus::Bypass,
        CacheStatus::Error,
    ];

    /// The `X-Cache` token and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Expired => "EXPIRED",
            CacheStatus::Stale => "STALE",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Bypass => "BYPASS",
            CacheStatus::Error => "ERROR",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Which path a response body was meant to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataPath {
    /// sendfile(2) from the cache file.
    Zerocopy,
    /// Copied through user space (misses stream the upstream body; error bodies).
    Copy,
}

impl DataPath {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            DataPath::Zerocopy => "zerocopy",
            DataPath::Copy => "copy",
        }
    }
}

/// One response as the proxy sent it.
#[derive(Clone, Debug)]
pub struct ResponseRecord<'a> {
    /// Method.
    pub method: &'a str,
    /// Request target.
    pub target: &'a str,
    /// Status code.
    pub status: u16,
    /// Cache status.
    pub cache_status: CacheStatus,
    /// Bytes of the response head (and interim heads).
    pub head_bytes: u64,
    /// Bytes of the body.
    pub body_bytes: u64,
    /// The data path the proxy chose for the body.
    pub path: DataPath,
    /// Time from request head to last byte.
    pub duration: Duration,
    /// The whole response was sent; false when it was cut short (client gone, send timeout,
    /// upstream failure mid-body), with `body_bytes` what actually went out.
    pub complete: bool,
}

/// Why a connection was answered 503 as soon as it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// `limits.max_connections` open already.
    MaxConnections,
    /// The process ran out of file descriptors.
    OutOfFds,
}

/// Every [`RejectReason`], in metric order.
pub const REJECT_REASONS: [RejectReason; 2] =
    [RejectReason::MaxConnections, RejectReason::OutOfFds];

impl RejectReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::MaxConnections => "max_connections",
            RejectReason::OutOfFds => "out_of_fds",
        }
    }
}

/// Connection id, unique for the process's lifetime.
pub type ConnId = u64;

/// One connection's account, live or closed.
#[derive(Clone, Debug, Serialize)]
pub struct ConnRecord {
    /// Connection id.
    pub id: ConnId,
    /// Client address.
    pub peer: String,
    /// Socket fd number.
    pub fd: u32,
    /// Opened at (Unix ms).
    pub opened_ms: u64,
    /// Duration so far, or total once closed, in ms.
    pub duration_ms: u64,
    /// Requests answered.
    pub requests: u64,
    /// The last request line.
    pub last_request: String,
    /// Head bytes the proxy sent.
    pub head_bytes: u64,
    /// Body bytes the proxy meant to send zero-copy.
    pub zerocopy_body_bytes: u64,
    /// Body bytes the proxy meant to copy.
    pub copy_body_bytes: u64,
    /// What the kernel saw on this socket (absent while the probe is off or the event is pending).
    pub kernel: Option<KernelView>,
    /// zero-copy, copied, mixed, or no-body.
    pub verdict: &'static str,
    /// Responses meant to be zero-copy whose bodies the kernel saw copied.
    pub violations: u64,
    /// Still open.
    pub active: bool,
    /// A TLS connection without kTLS: every body byte is copied by design.
    pub tls_userspace: bool,
    #[serde(skip)]
    started: Option<Instant>,
    /// (request line, body length) of recent zero-copy responses, for naming violations.
    #[serde(skip)]
    zc_responses: VecDeque<(String, u64)>,
}

/// The kernel's per-socket figures for one connection.
#[derive(Clone, Debug, Serialize)]
pub struct KernelView {
    /// Bytes via sendfile and splice.
    pub zerocopy_bytes: u64,
    /// Bytes via write, writev, sendto, sendmsg.
    pub copy_bytes: u64,
    /// Calls of every kind.
    pub calls: u64,
    /// The connection's generation number in the kernel.
    pub generation: u64,
    /// Per syscall kind.
    pub counts: FdCounts,
}

/// A detected violation.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// When it was detected (Unix ms).
    pub at_ms: u64,
    /// Connection id.
    pub conn: ConnId,
    /// Client address.
    pub peer: String,
    /// The request(s) affected.
    pub request: String,
    /// Body bytes meant for sendfile that the kernel saw copied.
    pub bytes: u64,
    /// Responses affected.
    pub responses: u64,
    /// In words.
    pub reason: String,
}

/// Cumulative kernel-verified body figures over joined connections.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct BodyTotals {
    /// Body bytes the kernel saw go through sendfile/splice.
    pub zerocopy_bytes: u64,
    /// Body bytes the kernel saw go through copying syscalls (copy bytes minus head bytes).
    pub copy_bytes: u64,
    /// Connections joined with a kernel record.
    pub connections: u64,
    /// Of `copy_bytes`, those the proxy meant to copy (relayed misses, generated bodies, TLS in
    /// user space): left out of the ratio, which counts only bytes meant for sendfile.
    pub intended_copy_bytes: u64,
}

impl BodyTotals {
    /// The body zero-copy ratio, or `None` before any body byte.
    pub fn ratio(&self) -> Option<f64> {
        let all = self.zerocopy_bytes + self.copy_bytes.saturating_sub(self.intended_copy_bytes);
        (all > 0).then(|| self.zerocopy_bytes as f64 / all as f64)
    }
}

/// How long a closed connection waits for its kernel record before it is kept without one.
const JOIN_GRACE: Duration = Duration::from_secs(5);
/// Zero-copy responses remembered per connection for naming violations.
const ZC_RESPONSES_KEPT: usize = 64;

/// The accounting shared by the data plane and the dashboard.
pub struct Accounting {
    requests: [AtomicU64; 7],
    body_bytes: [[AtomicU64; 2]; 7],
    violations: AtomicU64,
    violation_bytes: AtomicU64,
    cold_offloads: AtomicU64,
    corrupt_entries: AtomicU64,
    next_conn: AtomicU64,
    upstream_errors: Mutex<HashMap<(String, &'static str), u64>>,
    /// Upstream response heads received, by (group, server, status code).
    upstream_responses: Mutex<HashMap<(String, String, u16), u64>>,
    /// `zerocache_upstream_response_seconds`: request sent to response head, by group.
    upstream_seconds: prometheus::HistogramVec,
    /// Responses by status code (100-599) and cache status: `(code - 100) * 7 + cache status`.
    by_code: Box<[AtomicU64]>,
    /// Connections answered 503 at accept, by [`REJECT_REASONS`] index.
    rejected: [AtomicU64; 2],
    /// Config reloads: accepted, rejected.
    reloads: [AtomicU64; 2],
    /// `zerocache_request_duration_seconds`, by cache status; `duration_children` are its
    /// children in [`CacheStatus::ALL`] order, so recording needs no label lookup.
    durations: prometheus::HistogramVec,
    duration_children: Vec<prometheus::Histogram>,
    state: Mutex<ConnState>,
    closed_capacity: usize,
    probe_attached: bool,
    /// Copied body bytes by reason.
    pub copied: CopiedBytes,
    /// TLS handshakes and kTLS availability.
    pub tls: TlsStats,
}

struct ConnState {
    active: HashMap<ConnId, ConnRecord>,
    /// Closed by the proxy, waiting for the kernel's record, by fd in close order.
    awaiting: HashMap<u32, VecDeque<ConnRecord>>,
    closed: VecDeque<ConnRecord>,
    closed_evicted: u64,
    body: BodyTotals,
    recent_violations: VecDeque<Violation>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Accounting {
    /// New, empty accounting. `probe_attached`: whether kernel records will arrive to join.
    pub fn new(closed_capacity: usize, probe_attached: bool) -> Accounting {
        let durations = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "zerocache_request_duration_seconds",
                "Time from a complete request head to the last response byte, by cache status.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ]),
            &["cache_status"],
        )
        .expect("static histogram options are valid");
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
        let duration_children = CacheStatus::ALL
            .iter()
            .map(|cs| durations.with_label_values(&[cs.as_str()]))
            .collect();
        Accounting {
            requests: Default::default(),
            body_bytes: Default::default(),
            violations: AtomicU64::new(0),
            violation_bytes: AtomicU64::new(0),
            cold_offloads: AtomicU64::new(0),
            corrupt_entries: AtomicU64::new(0),
            next_conn: AtomicU64::new(1),
            upstream_errors: Mutex::new(HashMap::new()),
            upstream_responses: Mutex::new(HashMap::new()),
            upstream_seconds,
            rejected: Default::default(),
            reloads: Default::default(),
            by_code: (0..500 * CacheStatus::ALL.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            durations,
            duration_children,
            state: Mutex::new(ConnState {
                active: HashMap::new(),
                awaiting: HashMap::new(),
                closed: VecDeque::new(),
                closed_evicted: 0,
                body: BodyTotals::default(),
                recent_violations: VecDeque::new(),
            }),
            closed_capacity,
            probe_attached,
            copied: CopiedBytes::default(),
            tls: TlsStats::default(),
        }
    }

    /// A connection was accepted.
    pub fn conn_opened(&self, fd: u32, peer: SocketAddr) -> ConnId {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let rec = ConnRecord {
            id,
            peer: peer.to_string(),
            fd,
            opened_ms: unix_ms(SystemTime::now()),
            duration_ms: 0,
            requests: 0,
            last_request: String::new(),
            head_bytes: 0,
            zerocopy_body_bytes: 0,
            copy_body_bytes: 0,
            kernel: None,
            verdict: "no-body",
            violations: 0,
            active: true,
            tls_userspace: false,
            started: Some(Instant::now()),
            zc_responses: VecDeque::new(),
        };
        self.state.lock().active.insert(id, rec);
        id
    }

    /// Connection `id` is TLS encrypted in user space (no kTLS): its bodies are copied by design.
    pub fn conn_tls_userspace(&self, id: ConnId) {
        if let Some(c) = self.state.lock().active.get_mut(&id) {
            c.tls_userspace = true;
        }
    }

    /// A response was sent completely (or as far as it went) on connection `id`.
    pub fn response(&self, id: ConnId, r: &ResponseRecord<'_>) {
        let cs = r.cache_status.index();
        self.requests[cs].fetch_add(1, Ordering::Relaxed);
        let p = if r.path == DataPath::Zerocopy { 0 } else { 1 };
        self.body_bytes[cs][p].fetch_add(r.body_bytes, Ordering::Relaxed);
        self.duration_children[cs].observe(r.duration.as_secs_f64());
        if (100..600).contains(&r.status) {
            let i = usize::from(r.status - 100) * CacheStatus::ALL.len() + cs;
            self.by_code[i].fetch_add(1, Ordering::Relaxed);
        }
        let mut st = self.state.lock();
        if let Some(c) = st.active.get_mut(&id) {
            c.requests += 1;
            c.head_bytes += r.head_bytes;
            c.last_request.clear();
            c.last_request.push_str(r.method);
            c.last_request.push(' ');
            c.last_request.push_str(r.target);
            match r.path {
                DataPath::Zerocopy => {
                    c.zerocopy_body_bytes += r.body_bytes;
                    if r.body_bytes > 0 {
                        if c.zc_responses.len() == ZC_RESPONSES_KEPT {
                            c.zc_responses.pop_front();
                        }
                        c.zc_responses
                            .push_back((c.last_request.clone(), r.body_bytes));
                    }
                }
                DataPath::Copy => c.copy_body_bytes += r.body_bytes,
            }
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

    /// The proxy is about to close connection `id`'s socket. Call before the fd is closed, so the
    /// record is waiting when the kernel's close event arrives.
    pub fn conn_closed(&self, id: ConnId) {
        let mut st = self.state.lock();
        let Some(mut c) = st.active.remove(&id) else {
            return;
        };
        c.active = false;
        if let Some(s) = c.started.take() {
            c.duration_ms = s.elapsed().as_millis() as u64;
        }
        c.started = Some(Instant::now()); // now: when it started waiting for the kernel
        if self.probe_attached {
            st.awaiting.entry(c.fd).or_default().push_back(c);
        } else {
            c.verdict = proxy_verdict(&c);
            self.push_closed(&mut st, c);
        }
    }

    /// The kernel's final record for one of this process's accepted sockets.
    pub fn kernel_closed(&self, k: &ClosedFd) {
        let mut st = self.state.lock();
        let Some(queue) = st.awaiting.get_mut(&k.fd) else {
            return;
        };
        let Some(mut c) = queue.pop_front() else {
            return;
        };
        if queue.is_empty() {
            st.awaiting.remove(&k.fd);
        }
        let zc = k.counts.zero_copy_bytes();
        let copied = k.counts.copy_bytes();
        c.kernel = Some(KernelView {
            zerocopy_bytes: zc,
            copy_bytes: copied,
            calls: k.counts.calls(),
            generation: k.generation,
            counts: k.counts,
        });
        st.body.zerocopy_bytes += zc;
        st.body.copy_bytes += copied.saturating_sub(c.head_bytes);
        st.body.intended_copy_bytes += intended_copy(&c, copied);
        st.body.connections += 1;
        // Body bytes meant for sendfile that sendfile did not carry, and that the copy path did.
        let missing = c.zerocopy_body_bytes.saturating_sub(zc);
        let excess_copy = copied.saturating_sub(c.head_bytes + c.copy_body_bytes);
        let violated = missing.min(excess_copy);
        if violated > 0 {
            // Attribute whole responses, oldest first, until the missing bytes are covered.
            let mut left = violated;
            let mut affected = Vec::new();
            for (req, len) in &c.zc_responses {
                if left == 0 {
                    break;
                }
                left = left.saturating_sub(*len);
                affected.push(req.clone());
            }
            let responses = (affected.len() as u64).max(1);
            c.violations = responses;
            self.violations.fetch_add(responses, Ordering::Relaxed);
            self.violation_bytes.fetch_add(violated, Ordering::Relaxed);
            let v = Violation {
                at_ms: unix_ms(SystemTime::now()),
                conn: c.id,
                peer: c.peer.clone(),
                request: affected
                    .first()
                    .cloned()
                    .unwrap_or_else(|| c.last_request.clone()),
                bytes: violated,
                responses,
                reason: format!(
                    "{violated} body bytes meant for sendfile went through write/writev/sendto/sendmsg ({responses} responses)"
                ),
            };
            tracing::warn!(conn = c.id, peer = %c.peer, request = %v.request, bytes = violated, responses, "zero-copy violation");
            if st.recent_violations.len() == 100 {
                st.recent_violations.pop_front();
            }
            st.recent_violations.push_back(v);
        }
        c.verdict = conn_verdict(&c, zc, copied.saturating_sub(c.head_bytes));
        self.push_closed(&mut st, c);
    }

    /// Gives up waiting for kernel records older than the grace period (probe lost an event).
    pub fn expire_awaiting(&self) {
        let mut st = self.state.lock();
        let mut expired = Vec::new();
        st.awaiting.retain(|_, q| {
            while q
                .front()
                .is_some_and(|c| c.started.is_some_and(|s| s.elapsed() > JOIN_GRACE))
            {
                if let Some(c) = q.pop_front() {
                    expired.push(c);
                }
            }
            !q.is_empty()
        });
        for mut c in expired {
            c.verdict = proxy_verdict(&c);
            self.push_closed(&mut st, c);
        }
    }

    fn push_closed(&self, st: &mut ConnState, c: ConnRecord) {
        if st.closed.len() >= self.closed_capacity {
            st.closed.pop_front();
            st.closed_evicted += 1;
        }
        st.closed.push_back(c);
    }

    /// Requests answered with `cs`.
    pub fn requests(&self, cs: CacheStatus) -> u64 {
        self.requests[cs.index()].load(Ordering::Relaxed)
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
        &self.durations
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

    /// Responses sent so far by status code and cache status, those with at least one.
    pub fn responses_by_code(&self) -> Vec<(u16, CacheStatus, u64)> {
        let n = CacheStatus::ALL.len();
        self.by_code
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let v = c.load(Ordering::Relaxed);
                (v > 0).then(|| ((i / n) as u16 + 100, CacheStatus::ALL[i % n], v))
            })
            .collect()
    }

    /// Kernel-verified body totals.
    pub fn body_totals(&self) -> BodyTotals {
        self.state.lock().body
    }

    /// Active connections, each with its live kernel view from `live` (fd → counts) when present.
    pub fn active(&self, live: &HashMap<u32, (u64, FdCounts)>) -> Vec<ConnRecord> {
        let st = self.state.lock();
        let mut active: Vec<ConnRecord> = st
            .active
            .values()
            .map(|c| {
                let mut c = c.clone();
                if let Some(s) = c.started {
                    c.duration_ms = s.elapsed().as_millis() as u64;
                }
                if let Some((generation, counts)) = live.get(&c.fd) {
                    let zc = counts.zero_copy_bytes();
                    let copied = counts.copy_bytes();
                    c.verdict = conn_verdict(&c, zc, copied.saturating_sub(c.head_bytes));
                    c.kernel = Some(KernelView {
                        zerocopy_bytes: zc,
                        copy_bytes: copied,
                        calls: counts.calls(),
                        generation: *generation,
                        counts: *counts,
                    });
                } else {
                    c.verdict = proxy_verdict(&c);
                }
                c
            })
            .collect();
        active.sort_by_key(|c| c.id);
        active
    }

    /// A page of closed connections (those waiting for their kernel record first), sorted by
    /// `sort` (`id`, `requests`, `zerocopy`, `copied`, `violations`, `duration`), newest or largest
    /// first unless `ascending`. Returns the page, the number of closed records held and the number
    /// evicted from the bounded history. Sorting borrows; only the page is cloned.
    pub fn closed_page(
        &self,
        offset: usize,
        limit: usize,
        sort: &str,
        ascending: bool,
    ) -> (Vec<ConnRecord>, usize, u64) {
        let st = self.state.lock();
        let mut all: Vec<&ConnRecord> = st
            .awaiting
            .values()
            .flatten()
            .chain(st.closed.iter())
            .collect();
        let key = |c: &ConnRecord| -> u64 {
            match sort {
                "requests" => c.requests,
                "zerocopy" => c
                    .kernel
                    .as_ref()
                    .map_or(c.zerocopy_body_bytes, |k| k.zerocopy_bytes),
                "copied" => c
                    .kernel
                    .as_ref()
                    .map_or(c.copy_body_bytes + c.head_bytes, |k| k.copy_bytes),
                "violations" => c.violations,
                "duration" => c.duration_ms,
                _ => c.id,
            }
        };
        all.sort_by_key(|c| (key(c), c.id));
        if !ascending {
            all.reverse();
        }
        let total = all.len();
        let page = all.into_iter().skip(offset).take(limit).cloned().collect();
        (page, total, st.closed_evicted)
    }

    /// Kernel-verified body totals over closed connections plus the live ones in `live`.
    pub fn body_totals_with_live(&self, live: &HashMap<u32, (u64, FdCounts)>) -> BodyTotals {
        let st = self.state.lock();
        let mut t = st.body;
        for c in st.active.values() {
            if let Some((_, counts)) = live.get(&c.fd) {
                t.zerocopy_bytes += counts.zero_copy_bytes();
                t.copy_bytes += counts.copy_bytes().saturating_sub(c.head_bytes);
                t.intended_copy_bytes += intended_copy(c, counts.copy_bytes());
            }
        }
        t
    }

    /// Recent violations, newest last.
    pub fn recent_violations(&self) -> Vec<Violation> {
        self.state
            .lock()
            .recent_violations
            .iter()
            .cloned()
            .collect()
    }

    /// Number of closed connections recorded.
    pub fn closed_count(&self) -> usize {
        self.state.lock().closed.len()
    }
}

fn verdict(zc: u64, copied_body: u64) -> &'static str {
    match (zc > 0, copied_body > 0) {
        (true, false) => "zero-copy",
        (false, true) => "copied",
        (true, true) => "mixed",
        (false, false) => "no-body",
    }
}

fn proxy_verdict(c: &ConnRecord) -> &'static str {
    conn_verdict(c, c.zerocopy_body_bytes, c.copy_body_bytes)
}

/// A TLS connection in user space is a copy by design, whatever the figures.
fn conn_verdict(c: &ConnRecord, zc: u64, copied_body: u64) -> &'static str {
    if c.tls_userspace && copied_body > 0 {
        TLS_USERSPACE_VERDICT
    } else {
        verdict(zc, copied_body)
    }
}

/// Of the kernel's `copied` bytes on `c`'s socket, the body bytes the proxy meant to copy: all of
/// them on a TLS connection in user space (records, handshake and all), else its declared ones.
fn intended_copy(c: &ConnRecord, copied: u64) -> u64 {
    let body = copied.saturating_sub(c.head_bytes);
    if c.tls_userspace {
        body
    } else {
        body.min(c.copy_body_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocache_probe::kind;

    fn counts(sendfile: u64, sendto: u64) -> FdCounts {
        let mut c = FdCounts::default();
        c.by_kind[kind::SENDFILE as usize].bytes = sendfile;
        c.by_kind[kind::SENDTO as usize].bytes = sendto;
        c
    }

    fn rec<'a>(path: DataPath, body: u64) -> ResponseRecord<'a> {
        ResponseRecord {
            method: "GET",
            target: "/obj/1000",
            status: 200,
            cache_status: CacheStatus::Hit,
            head_bytes: 100,
            body_bytes: body,
            path,
            duration: Duration::from_millis(1),
            complete: true,
        }
    }

    #[test]
    fn clean_hits_have_ratio_one_and_no_violation() {
        let a = Accounting::new(10, true);
        let id = a.conn_opened(7, "127.0.0.1:1".parse().expect("addr"));
        a.response(id, &rec(DataPath::Zerocopy, 1000));
        a.response(id, &rec(DataPath::Zerocopy, 1000));
        a.conn_closed(id);
        a.kernel_closed(&ClosedFd {
            pid: 1,
            fd: 7,
            generation: 9,
            socket: true,
            accepted: true,
            counts: counts(2000, 200),
        });
        assert_eq!(a.violations(), 0);
        assert_eq!(a.body_totals().ratio(), Some(1.0));
        let (closed, _, _) = a.closed_page(0, 10, "id", false);
        assert_eq!(closed[0].verdict, "zero-copy");
    }

    #[test]
    fn copied_hits_are_violations_one_per_response() {
        let a = Accounting::new(10, true);
        let id = a.conn_opened(7, "127.0.0.1:1".parse().expect("addr"));
        for _ in 0..3 {
            a.response(id, &rec(DataPath::Zerocopy, 1000));
        }
        a.conn_closed(id);
        a.kernel_closed(&ClosedFd {
            pid: 1,
            fd: 7,
            generation: 9,
            socket: true,
            accepted: true,
            counts: counts(0, 3300),
        });
        assert_eq!(a.violations(), 3);
        assert_eq!(a.violation_bytes(), 3000);
        assert_eq!(a.body_totals().ratio(), Some(0.0));
        assert_eq!(a.recent_violations()[0].request, "GET /obj/1000");
    }

    #[test]
    fn closed_history_is_bounded() {
        let a = Accounting::new(3, false);
        for fd in 0..5 {
            let id = a.conn_opened(fd, "127.0.0.1:1".parse().expect("addr"));
            a.conn_closed(id);
        }
        let (closed, total, evicted) = a.closed_page(0, 100, "id", false);
        assert_eq!(total, 3);
        assert_eq!((closed.len(), evicted), (3, 2));
        // Newest first: fds 4, 3, 2 survived.
        assert_eq!(
            closed.iter().map(|c| c.fd).collect::<Vec<_>>(),
            vec![4, 3, 2]
        );
    }
}
