//! Why a response body went through user space: every copied body byte is counted under one
//! reason (`zerocache_copied_body_bytes_total{reason}`), so a copy is never unexplained. Some
//! copies are by design (a relayed miss, TLS encrypted in user space, the proxy's own error
//! bodies), one is the planted bug (`debug.copy_hits`). The hero zero-copy ratio leaves the
//! by-design ones out: it counts only bytes that were meant to go with sendfile.
//!
//! A new copy path adds a variant here and to [`CopyReason::ALL`]; the metric then lists it from
//! start-up with no other change.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a response body was copied through user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyReason {
    /// The body came from the upstream and was relayed to the client as it arrived (not stored:
    /// bypass, `no-store`, a range miss...). A stored miss is read behind its fill with sendfile
    /// and is not counted here.
    Miss,
    /// A stored body sent on a TLS connection without kTLS: read from the file in large chunks
    /// and encrypted by rustls in user space.
    TlsUserspace,
    /// `debug.copy_hits`, the planted bug: a hit sent with read(2) + write(2). Still declared
    /// zero-copy to the accounting, so the probe flags it as a violation.
    DebugCopy,
    /// A body the proxy generated itself (4xx/5xx text bodies).
    Generated,
    /// A fleet member relayed the answer of the key's owner (not stored here): the bytes came
    /// over a socket from the peer, so they pass through user space at this node by design.
    Peer,
    /// The bytes of an Upgrade tunnel (a WebSocket), relayed both ways after the origin's 101:
    /// a protocol the proxy does not cache, so through user space by design.
    Tunnel,
    /// A body sent on an HTTP/2 connection: DATA frames are written from user space (the `h2`
    /// crate frames and, on TLS, rustls or the kernel encrypts them), hits included. A copy by
    /// design, chosen with `tls.http2` or `h2c`: multiplexing traded for sendfile.
    H2,
}

impl CopyReason {
    /// Every reason, in metric order.
    pub const ALL: [CopyReason; 7] = [
        CopyReason::Miss,
        CopyReason::TlsUserspace,
        CopyReason::DebugCopy,
        CopyReason::Generated,
        CopyReason::Peer,
        CopyReason::Tunnel,
        CopyReason::H2,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyReason::Miss => "miss",
            CopyReason::TlsUserspace => "tls-userspace",
            CopyReason::DebugCopy => "debug-copy",
            CopyReason::Generated => "generated",
            CopyReason::Peer => "peer",
            CopyReason::Tunnel => "tunnel",
            CopyReason::H2 => "h2",
        }
    }

    /// Whether the copy is the design (true) or a bug that the probe should flag (false).
    pub fn by_design(self) -> bool {
        !matches!(self, CopyReason::DebugCopy)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Copied body bytes by [`CopyReason`].
#[derive(Default)]
pub struct CopiedBytes {
    by_reason: [AtomicU64; CopyReason::ALL.len()],
}

impl CopiedBytes {
    /// `n` body bytes were copied for `reason`.
    pub fn add(&self, reason: CopyReason, n: u64) {
        if n > 0 {
            self.by_reason[reason.index()].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Bytes copied so far for `reason`.
    pub fn get(&self, reason: CopyReason) -> u64 {
        self.by_reason[reason.index()].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_reason_once_in_index_order() {
        for (i, r) in CopyReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        let c = CopiedBytes::default();
        c.add(CopyReason::TlsUserspace, 10);
        c.add(CopyReason::TlsUserspace, 5);
        assert_eq!(c.get(CopyReason::TlsUserspace), 15);
        assert_eq!(c.get(CopyReason::Miss), 0);
        assert_eq!(
            CopyReason::ALL.map(CopyReason::as_str),
            [
                "miss",
                "tls-userspace",
                "debug-copy",
                "generated",
                "peer",
                "tunnel",
                "h2"
            ]
        );
    }
}
