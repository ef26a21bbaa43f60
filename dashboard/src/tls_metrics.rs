//! The `/metrics` families for copies by reason and TLS: `zerocache_copied_body_bytes_total`,
//! `zerocache_kernel_body_intended_copy_bytes_total` (what the hero ratio leaves out),
//! `zerocache_tls_handshakes_total`, `zerocache_tls_connections_total` and
//! `zerocache_ktls_available`, every label value present
//! from start-up.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use zerocache_ledger::Accounting;
use zerocache_ledger::CopyReason;
use zerocache_ledger::HandshakeResult;
use zerocache_ledger::TlsTransport;

/// Adds the three families to `r`.
pub(crate) fn register(
    r: &Registry,
    acc: &Accounting,
    kernel: &zerocache_ledger::BodyTotals,
) -> prometheus::Result<()> {
    let intended = prometheus::IntCounter::new(
        "zerocache_kernel_body_intended_copy_bytes_total",
        "Of zerocache_kernel_body_bytes_total{path=\"copy\"}, the bytes the proxy meant to copy (relayed misses, generated bodies, TLS in user space): the body zero-copy ratio leaves them out.",
    )?;
    intended.inc_by(kernel.intended_copy_bytes.min(kernel.copy_bytes));
    r.register(Box::new(intended))?;
    let copied = IntCounterVec::new(
        Opts::new(
            "zerocache_copied_body_bytes_total",
            "Response body bytes the proxy sent through user space, by reason (miss, tls-userspace, debug-copy, generated, peer, tunnel, h2).",
        ),
        &["reason"],
    )?;
    for reason in CopyReason::ALL {
        copied
            .with_label_values(&[reason.as_str()])
            .inc_by(acc.copied.get(reason));
    }
    r.register(Box::new(copied))?;
    let expiry = prometheus::GaugeVec::new(
        Opts::new(
            "zerocache_tls_certificate_expiry_timestamp_seconds",
            "When each certificate the TLS listener serves expires (its leaf's notAfter, Unix seconds), by name (its first DNS name, else its common name) and file.",
        ),
        &["name", "file"],
    )?;
    for (name, file, not_after) in acc.tls.certificates() {
        expiry
            .with_label_values(&[&name, &file])
            .set(not_after as f64);
    }
    r.register(Box::new(expiry))?;
    let handshakes = IntCounterVec::new(
        Opts::new(
            "zerocache_tls_handshakes_total",
            "TLS handshakes on the tls: listener, by result (ok, failed, timeout, no_cert).",
        ),
        &["result"],
    )?;
    for result in HandshakeResult::ALL {
        handshakes
            .with_label_values(&[result.as_str()])
            .inc_by(acc.tls.handshakes(result));
    }
    r.register(Box::new(handshakes))?;
    let connections = IntCounterVec::new(
        Opts::new(
            "zerocache_tls_connections_total",
            "Completed TLS handshakes by who encrypts the connection: ktls=\"txrx\" (the kernel, both directions; hits by sendfile) or \"none\" (rustls in user space) with the reason (kernel-has-no-ktls, ktls-off, cipher-not-offloadable, hand-over-failed).",
        ),
        &["ktls", "reason"],
    )?;
    for t in TlsTransport::all() {
        connections
            .with_label_values(&[t.ktls_label(), t.reason_label()])
            .inc_by(acc.tls.connections(t));
    }
    r.register(Box::new(connections))?;
    let ktls = IntGauge::new(
        "zerocache_ktls_available",
        "1 when the kernel offers kTLS (the tls upper-layer protocol), so TLS hits can be sent with sendfile; zerocache_tls_connections_total says which connections were.",
    )?;
    ktls.set(i64::from(acc.tls.ktls_available()));
    r.register(Box::new(ktls))?;
    Ok(())
}
