//! TLS figures the proxy reports: handshakes by result (`zerocache_tls_handshakes_total{result}`)
//! and whether the kernel offers kTLS (`zerocache_ktls_available`). Kept apart from the
//! per-response accounting: a handshake that fails has no response to attach to.

use crate::tls_transport::{TlsTransport, UserspaceReason};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How a client's TLS handshake ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandshakeResult {
    /// Completed.
    Ok,
    /// The client sent something that is not TLS, or the negotiation failed (no common version,
    /// cipher or ALPN, a bad record, a reset mid-handshake).
    Failed,
    /// Not complete within the handshake timeout.
    Timeout,
    /// No certificate to present (none loaded).
    NoCert,
}

impl HandshakeResult {
    /// Every result, in metric order.
    pub const ALL: [HandshakeResult; 4] = [
        HandshakeResult::Ok,
        HandshakeResult::Failed,
        HandshakeResult::Timeout,
        HandshakeResult::NoCert,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeResult::Ok => "ok",
            HandshakeResult::Failed => "failed",
            HandshakeResult::Timeout => "timeout",
            HandshakeResult::NoCert => "no_cert",
        }
    }
}

/// Handshake counters, connections by record layer, and the kTLS flag.
#[derive(Default)]
pub struct TlsStats {
    /// The certificates served: (name, file, notAfter in Unix seconds).
    certificates: parking_lot::Mutex<Vec<(String, String, i64)>>,
    handshakes: [AtomicU64; HandshakeResult::ALL.len()],
    connections: [AtomicU64; 1 + UserspaceReason::ALL.len()],
    ktls_available: AtomicBool,
    listener: AtomicBool,
}

/// A copy of [`TlsStats`] for the API.
#[derive(Clone, Debug, Serialize)]
pub struct TlsSnapshot {
    /// Whether a `tls:` listener is configured.
    pub listener: bool,
    /// Whether the kernel offers kTLS (the `tls` upper-layer protocol).
    pub ktls_available: bool,
    /// Handshakes by result label.
    pub handshakes: std::collections::BTreeMap<&'static str, u64>,
    /// Completed handshakes by record layer: `txrx` (kTLS) and each reason for user space.
    pub connections: std::collections::BTreeMap<&'static str, u64>,
}

impl TlsStats {
    /// The certificates the listener serves from now on: (name, file, notAfter in Unix
    /// seconds), replaced whole at start-up and by each reload that loads them.
    pub fn set_certificates(&self, certs: Vec<(String, String, i64)>) {
        *self.certificates.lock() = certs;
    }

    /// The certificates served, as set.
    pub fn certificates(&self) -> Vec<(String, String, i64)> {
        self.certificates.lock().clone()
    }

    /// A handshake ended with `r`.
    pub fn handshake(&self, r: HandshakeResult) {
        self.handshakes[r as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Handshakes so far that ended with `r`.
    pub fn handshakes(&self, r: HandshakeResult) -> u64 {
        self.handshakes[r as usize].load(Ordering::Relaxed)
    }

    /// A completed handshake's connection goes on with `t`.
    pub fn connection(&self, t: TlsTransport) {
        self.connections[t.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections so far that went on with `t`.
    pub fn connections(&self, t: TlsTransport) -> u64 {
        self.connections[t.index()].load(Ordering::Relaxed)
    }

    /// Records what start-up found: a TLS listener or not, kTLS or not.
    pub fn set_detected(&self, listener: bool, ktls_available: bool) {
        self.listener.store(listener, Ordering::Relaxed);
        self.ktls_available.store(ktls_available, Ordering::Relaxed);
    }

    /// Whether the kernel offers kTLS.
    pub fn ktls_available(&self) -> bool {
        self.ktls_available.load(Ordering::Relaxed)
    }

    /// The figures, for the API.
    pub fn snapshot(&self) -> TlsSnapshot {
        TlsSnapshot {
            listener: self.listener.load(Ordering::Relaxed),
            ktls_available: self.ktls_available(),
            handshakes: HandshakeResult::ALL
                .iter()
                .map(|r| (r.as_str(), self.handshakes(*r)))
                .collect(),
            connections: TlsTransport::all()
                .map(|t| (t.reason_label(), self.connections(t)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Accounting, CacheStatus, DataPath, ResponseRecord};
    use std::time::Duration;
    use zerocache_probe::{ClosedFd, FdCounts, kind};

    fn closed(fd: u32, sendfile: u64, write: u64) -> ClosedFd {
        let mut counts = FdCounts::default();
        counts.by_kind[kind::SENDFILE as usize].bytes = sendfile;
        counts.by_kind[kind::WRITE as usize].bytes = write;
        ClosedFd {
            pid: 1,
            fd,
            generation: 1,
            socket: true,
            accepted: true,
            counts,
        }
    }

    fn hit(path: DataPath, body: u64) -> ResponseRecord<'static> {
        ResponseRecord {
            method: "GET",
            target: "/obj",
            status: 200,
            cache_status: CacheStatus::Hit,
            head_bytes: 100,
            body_bytes: body,
            path,
            duration: Duration::from_millis(1),
            complete: true,
        }
    }

    /// A TLS connection in user space writes everything (records, handshake): no violation, its
    /// own verdict, and nothing against the ratio, which a plain connection's sendfile sets alone.
    #[test]
    fn tls_userspace_is_a_copy_by_design_not_a_violation() {
        let a = Accounting::new(10, true);
        let tls = a.conn_opened(7, "127.0.0.1:1".parse().expect("addr"));
        a.conn_tls(
            tls,
            crate::TlsTransport::Userspace(crate::UserspaceReason::KernelHasNoKtls),
        );
        a.response(tls, &hit(DataPath::Copy, 10_000), a.no_route(), false);
        a.conn_closed(tls);
        a.kernel_closed(&closed(7, 0, 12_345));
        let plain = a.conn_opened(8, "127.0.0.1:2".parse().expect("addr"));
        a.response(plain, &hit(DataPath::Zerocopy, 1000), a.no_route(), false);
        a.conn_closed(plain);
        a.kernel_closed(&closed(8, 1000, 100));
        assert_eq!(a.violations(), 0);
        assert_eq!(a.body_totals().ratio(), Some(1.0));
        assert_eq!(a.body_totals().copy_bytes, 12_245);
        assert_eq!(a.body_totals().intended_copy_bytes, 12_245);
        let (page, _, _) = a.closed_page(0, 10, crate::SortKey::Id, true);
        assert_eq!(page[0].verdict, crate::TLS_USERSPACE_VERDICT);
        assert_eq!(page[1].verdict, "zero-copy");
    }

    /// A kTLS connection is held to sendfile like a plain one: its handshake (written before the
    /// hand-over) and closing alert count beside heads, its hit bodies by sendfile give the kTLS
    /// verdict, and a hit body the kernel saw copied is a violation.
    #[test]
    fn ktls_is_held_to_sendfile_with_its_handshake_beside_heads() {
        let a = Accounting::new(10, true);
        let good = a.conn_opened(7, "127.0.0.1:1".parse().expect("addr"));
        a.tls.connection(crate::TlsTransport::Ktls);
        a.conn_tls(good, crate::TlsTransport::Ktls);
        a.conn_tls_control(good, 3_000);
        a.response(
            good,
            &hit(DataPath::Zerocopy, 1_000_000),
            a.no_route(),
            false,
        );
        a.conn_tls_control(good, 2);
        a.conn_closed(good);
        // head 100 + handshake 3,000 + alert 2 written; the body by sendfile.
        a.kernel_closed(&closed(7, 1_000_000, 3_102));
        assert_eq!(a.violations(), 0);
        assert_eq!(a.body_totals().copy_bytes, 0);
        let bad = a.conn_opened(8, "127.0.0.1:2".parse().expect("addr"));
        a.tls.connection(crate::TlsTransport::Ktls);
        a.conn_tls(bad, crate::TlsTransport::Ktls);
        a.conn_tls_control(bad, 3_000);
        a.response(
            bad,
            &hit(DataPath::Zerocopy, 1_000_000),
            a.no_route(),
            false,
        );
        a.conn_closed(bad);
        a.kernel_closed(&closed(8, 0, 1_003_100));
        assert_eq!(a.violations(), 1);
        let (page, _, _) = a.closed_page(0, 10, crate::SortKey::Id, true);
        assert_eq!(page[0].verdict, crate::KTLS_VERDICT);
        assert!(page[0].ktls && !page[0].tls_userspace);
        assert_eq!(page[1].verdict, "copied");
        assert_eq!(page[1].violations, 1);
        let snap = a.tls.snapshot();
        assert_eq!(snap.connections["offloaded"], 2);
        assert_eq!(snap.connections["kernel-has-no-ktls"], 0);
    }

    /// Each reason for user space gives its own verdict.
    #[test]
    fn a_userspace_connection_says_why() {
        let a = Accounting::new(10, false);
        let c = a.conn_opened(9, "127.0.0.1:3".parse().expect("addr"));
        let t = crate::TlsTransport::Userspace(crate::UserspaceReason::CipherNotOffloadable);
        a.tls.connection(t);
        a.conn_tls(c, t);
        a.response(c, &hit(DataPath::Copy, 10), a.no_route(), false);
        a.conn_closed(c);
        let (page, _, _) = a.closed_page(0, 10, crate::SortKey::Id, true);
        assert_eq!(
            page[0].verdict,
            "copy (TLS in user space: cipher not offloadable)"
        );
        assert_eq!(a.tls.snapshot().connections["cipher-not-offloadable"], 1);
    }
}
