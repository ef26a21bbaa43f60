//! The join: the proxy's account of each connection (what it meant to send, response by
//! response) matched with the kernel's record of the same socket (what sendfile, splice and the
//! copying syscalls really carried). The probe reports a socket when it is closed; the proxy and
//! kernel agree on the fd, and the kernel numbers each socket it creates (its *generation*),
//! which the proxy reads back at accept ([`Accounting::set_generations`]): a closed connection
//! waits for the kernel record of its own (fd, generation), never another socket's that got the
//! same fd number (a dashboard connection, a socket closed without a record). A record whose
//! generation could not be read joins by fd in close order, as the kernel's events come. A
//! kernel record that arrives first waits for its connection as long; after [`JOIN_GRACE`]
//! either side is given up on (the probe lost the event). Body bytes meant for sendfile that the
//! kernel saw copied are **violations**, named by the responses they belong to.

use crate::accounting::Accounting;
use crate::records::{BodyTotals, ConnRecord, KernelView, ResponseRecord, SortKey, Violation};
use crate::tls_transport::{TlsTransport, UserspaceReason};
use crate::vocabulary::{ConnId, DataPath, Protocol};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use zerocache_probe::{ClosedFd, FdCounts};

/// How long a closed connection waits for its kernel record before it is kept without one.
const JOIN_GRACE: Duration = Duration::from_secs(5);
/// Zero-copy responses remembered per connection for naming violations.
const ZC_RESPONSES_KEPT: usize = 64;
/// Kernel records held for a connection not yet closed by the proxy (bounded: most are of
/// sockets that have none, such as the dashboard's).
const EARLY_KEPT: usize = 1024;

#[derive(Default)]
pub(crate) struct ConnState {
    active: HashMap<ConnId, ConnRecord>,
    /// Closed by the proxy, waiting for the kernel's record, by fd in close order.
    awaiting: HashMap<u32, VecDeque<ConnRecord>>,
    /// Kernel records with a generation no waiting connection has, oldest first, with when they
    /// came: a connection closed by the proxy after the kernel saw its close finds its own here.
    early: VecDeque<(Instant, ClosedFd)>,
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
    /// A connection was accepted.
    pub fn conn_opened(&self, fd: u32, peer: SocketAddr) -> ConnId {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let generation = self.generations.as_ref().and_then(|g| g(fd));
        let rec = ConnRecord {
            id,
            peer: peer.to_string(),
            fd,
            generation,
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
            tls_userspace_reason: None,
            ktls: false,
            h2: false,
            tls_control_bytes: 0,
            started: Some(Instant::now()),
            zc_responses: VecDeque::new(),
        };
        self.state.lock().active.insert(id, rec);
        id
    }

    /// Connection `id` is TLS with record layer `t`: in user space its bodies are copied by
    /// design; with kTLS they are held to sendfile like a plain connection's. (Counting it in
    /// `zerocache_tls_connections_total` is [`crate::TlsStats::connection`], once a handshake
    /// completed.)
    pub fn conn_tls(&self, id: ConnId, t: TlsTransport) {
        if let Some(c) = self.state.lock().active.get_mut(&id) {
            match t {
                TlsTransport::Ktls => c.ktls = true,
                TlsTransport::Userspace(r) => {
                    c.tls_userspace = true;
                    c.tls_userspace_reason = Some(r);
                }
            }
        }
    }

    /// Connection `id` speaks HTTP/2: its bodies are DATA frames written from user space, a copy
    /// by design however the socket below makes its records.
    pub fn conn_h2(&self, id: ConnId) {
        if let Some(c) = self.state.lock().active.get_mut(&id) {
            c.h2 = true;
        }
    }

    /// Connection `id`'s transport wrote `bytes` that are neither heads nor bodies (a kTLS
    /// connection's handshake before the hand-over, its closing alert).
    pub fn conn_tls_control(&self, id: ConnId, bytes: u64) {
        if let Some(c) = self.state.lock().active.get_mut(&id) {
            c.tls_control_bytes += bytes;
        }
    }

    /// The per-connection part of [`Accounting::response`]; the connection's protocol (HTTP/1.1
    /// for one no longer known).
    pub(crate) fn conn_response(&self, id: ConnId, r: &ResponseRecord<'_>) -> Protocol {
        let mut st = self.state.lock();
        let mut protocol = Protocol::Http1;
        if let Some(c) = st.active.get_mut(&id) {
            if c.h2 {
                protocol = Protocol::H2;
            }
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
        protocol
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
            let early = c.generation.and_then(|g| {
                st.early
                    .iter()
                    .position(|(_, k)| k.fd == c.fd && k.generation == g)
            });
            match early.and_then(|i| st.early.remove(i)) {
                Some((_, k)) => self.join(&mut st, c, &k),
                None => st.awaiting.entry(c.fd).or_default().push_back(c),
            }
        } else {
            c.verdict = proxy_verdict(&c);
            self.push_closed(&mut st, c);
        }
    }

    /// The kernel's final record for one of this process's accepted sockets.
    pub fn kernel_closed(&self, k: &ClosedFd) {
        let mut st = self.state.lock();
        let found = st.awaiting.get_mut(&k.fd).and_then(|queue| {
            // Its own record, or the oldest whose generation is unknown; a record of another
            // generation is another socket's.
            let i = queue
                .iter()
                .position(|c| c.generation == Some(k.generation))
                .or_else(|| queue.iter().position(|c| c.generation.is_none()))?;
            queue.remove(i)
        });
        if st.awaiting.get(&k.fd).is_some_and(|q| q.is_empty()) {
            st.awaiting.remove(&k.fd);
        }
        match found {
            Some(c) => self.join(&mut st, c, k),
            None => {
                if st.early.len() == EARLY_KEPT {
                    st.early.pop_front();
                }
                st.early.push_back((Instant::now(), k.clone()));
            }
        }
    }

    /// Joins closed connection `c` with `k`, the kernel's record of its socket.
    fn join(&self, st: &mut ConnState, mut c: ConnRecord, k: &ClosedFd) {
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
        st.body.copy_bytes += copied.saturating_sub(non_body(&c));
        st.body.intended_copy_bytes += intended_copy(&c, copied);
        st.body.connections += 1;
        // Body bytes meant for sendfile that sendfile did not carry, and that the copy path did.
        let missing = c.zerocopy_body_bytes.saturating_sub(zc);
        let excess_copy = copied.saturating_sub(non_body(&c) + c.copy_body_bytes);
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
        c.verdict = conn_verdict(&c, zc, copied.saturating_sub(non_body(&c)));
        self.push_closed(st, c);
    }

    /// Gives up waiting for kernel records older than the grace period (probe lost an event).
    pub fn expire_awaiting(&self) {
        let mut st = self.state.lock();
        while st
            .early
            .front()
            .is_some_and(|(at, _)| at.elapsed() > JOIN_GRACE)
        {
            st.early.pop_front();
        }
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
                // The live record of this socket, not of one that had its fd number before.
                let own = live
                    .get(&c.fd)
                    .filter(|(g, _)| c.generation.is_none_or(|mine| mine == *g));
                if let Some((generation, counts)) = own {
                    let zc = counts.zero_copy_bytes();
                    let copied = counts.copy_bytes();
                    c.verdict = conn_verdict(&c, zc, copied.saturating_sub(non_body(&c)));
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
    /// `sort`, newest or largest
    /// first unless `ascending`. Returns the page, the number of closed records held and the number
    /// evicted from the bounded history. Sorting borrows; only the page is cloned.
    pub fn closed_page(
        &self,
        offset: usize,
        limit: usize,
        sort: SortKey,
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
                SortKey::Requests => c.requests,
                SortKey::Zerocopy => c
                    .kernel
                    .as_ref()
                    .map_or(c.zerocopy_body_bytes, |k| k.zerocopy_bytes),
                SortKey::Copied => c
                    .kernel
                    .as_ref()
                    .map_or(c.copy_body_bytes + non_body(c), |k| k.copy_bytes),
                SortKey::Violations => c.violations,
                SortKey::Duration => c.duration_ms,
                SortKey::Id => c.id,
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
                t.copy_bytes += counts.copy_bytes().saturating_sub(non_body(c));
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

/// A TLS connection in user space is a copy by design, whatever the figures, and says why; a
/// kTLS connection whose bodies all went by sendfile says so.
fn conn_verdict(c: &ConnRecord, zc: u64, copied_body: u64) -> &'static str {
    if c.h2 && copied_body > 0 {
        H2_VERDICT
    } else if c.tls_userspace && copied_body > 0 {
        c.tls_userspace_reason
            .unwrap_or(UserspaceReason::KernelHasNoKtls)
            .verdict()
    } else {
        match verdict(zc, copied_body) {
            "zero-copy" if c.ktls => crate::tls_transport::KTLS_VERDICT,
            v => v,
        }
    }
}

/// The verdict of an HTTP/2 connection that sent bodies: copied, by design.
pub const H2_VERDICT: &str = "copy (HTTP/2: frames written from user space)";

/// Bytes on `c`'s socket that carry no body: heads, and a kTLS connection's handshake and alerts.
fn non_body(c: &ConnRecord) -> u64 {
    c.head_bytes + c.tls_control_bytes
}

/// Of the kernel's `copied` bytes on `c`'s socket, the body bytes the proxy meant to copy: all of
/// them on a TLS connection in user space (records, handshake and all), else its declared ones.
fn intended_copy(c: &ConnRecord, copied: u64) -> u64 {
    let body = copied.saturating_sub(non_body(c));
    if c.tls_userspace || c.h2 {
        body
    } else {
        body.min(c.copy_body_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::CacheStatus;
    use std::time::Duration;
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
        a.response(id, &rec(DataPath::Zerocopy, 1000), a.no_route(), false);
        a.response(id, &rec(DataPath::Zerocopy, 1000), a.no_route(), false);
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
        let (closed, _, _) = a.closed_page(0, 10, SortKey::Id, false);
        assert_eq!(closed[0].verdict, "zero-copy");
    }

    #[test]
    fn copied_hits_are_violations_one_per_response() {
        let a = Accounting::new(10, true);
        let id = a.conn_opened(7, "127.0.0.1:1".parse().expect("addr"));
        for _ in 0..3 {
            a.response(id, &rec(DataPath::Zerocopy, 1000), a.no_route(), false);
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

    /// Accounting whose sockets get generations 1, 2, 3, ... at accept, as the probe gives them.
    fn with_generations() -> Accounting {
        let mut a = Accounting::new(10, true);
        let next = std::sync::atomic::AtomicU64::new(1);
        a.set_generations(move |_| Some(next.fetch_add(1, Ordering::Relaxed)));
        a
    }

    fn closed_fd(fd: u32, generation: u64, counts: FdCounts) -> ClosedFd {
        ClosedFd {
            pid: 1,
            fd,
            generation,
            socket: true,
            accepted: true,
            counts,
        }
    }

    #[test]
    fn another_sockets_close_on_the_same_fd_is_not_joined() {
        // Connection 1 (generation 1) on fd 7 closes and its kernel record never comes; the fd
        // number goes to a dashboard socket (generation 5) that writes 4,077 bytes and closes.
        let a = with_generations();
        let id = a.conn_opened(7, "127.0.0.1:1".parse().expect("addr"));
        a.response(id, &rec(DataPath::Zerocopy, 1000), a.no_route(), false);
        a.conn_closed(id);
        a.kernel_closed(&closed_fd(7, 5, counts(0, 4077)));
        assert_eq!(a.body_totals().connections, 0);
        assert_eq!(a.body_totals().copy_bytes, 0);
        assert_eq!(a.violations(), 0);
        // Its own record still joins it.
        a.kernel_closed(&closed_fd(7, 1, counts(1000, 100)));
        let t = a.body_totals();
        assert_eq!(
            (t.connections, t.zerocopy_bytes, t.copy_bytes),
            (1, 1000, 0)
        );
        assert_eq!(t.ratio(), Some(1.0));
    }

    #[test]
    fn a_kernel_record_that_comes_first_waits_for_its_connection() {
        let a = with_generations();
        let id = a.conn_opened(9, "127.0.0.1:1".parse().expect("addr"));
        a.response(id, &rec(DataPath::Zerocopy, 2000), a.no_route(), false);
        a.kernel_closed(&closed_fd(9, 1, counts(2000, 100)));
        assert_eq!(a.body_totals().connections, 0);
        a.conn_closed(id);
        let t = a.body_totals();
        assert_eq!((t.connections, t.zerocopy_bytes), (1, 2000));
        let (closed, _, _) = a.closed_page(0, 10, SortKey::Id, false);
        assert_eq!(closed[0].verdict, "zero-copy");
        assert_eq!(closed[0].kernel.as_ref().map(|k| k.generation), Some(1));
    }

    #[test]
    fn records_of_one_fd_join_their_own_generation_whatever_the_order() {
        let a = with_generations();
        let first = a.conn_opened(4, "127.0.0.1:1".parse().expect("addr"));
        a.response(first, &rec(DataPath::Zerocopy, 100), a.no_route(), false);
        a.conn_closed(first);
        let second = a.conn_opened(4, "127.0.0.1:2".parse().expect("addr"));
        a.response(second, &rec(DataPath::Zerocopy, 300), a.no_route(), false);
        a.conn_closed(second);
        a.kernel_closed(&closed_fd(4, 2, counts(300, 100)));
        a.kernel_closed(&closed_fd(4, 1, counts(0, 200)));
        // The second is clean; the first's 100 body bytes were copied: one violation, its own.
        assert_eq!((a.violations(), a.violation_bytes()), (1, 100));
        let (closed, _, _) = a.closed_page(0, 10, SortKey::Id, false);
        let verdicts: Vec<(u64, &str)> = closed.iter().map(|c| (c.id, c.verdict)).collect();
        assert_eq!(verdicts, vec![(second, "zero-copy"), (first, "copied")]);
    }

    #[test]
    fn closed_history_is_bounded() {
        let a = Accounting::new(3, false);
        for fd in 0..5 {
            let id = a.conn_opened(fd, "127.0.0.1:1".parse().expect("addr"));
            a.conn_closed(id);
        }
        let (closed, total, evicted) = a.closed_page(0, 100, SortKey::Id, false);
        assert_eq!(total, 3);
        assert_eq!((closed.len(), evicted), (3, 2));
        // Newest first: fds 4, 3, 2 survived.
        assert_eq!(
            closed.iter().map(|c| c.fd).collect::<Vec<_>>(),
            vec![4, 3, 2]
        );
    }
}
