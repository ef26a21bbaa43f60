//! Who encrypts a client TLS connection's records: the kernel (kTLS, keys handed over after the
//! handshake, so hits still go out with sendfile) or rustls in user space, and why not the
//! kernel. The reason is part of what the proxy reports: a TLS listener that copies every hit
//! must say whether that is the kernel, the config or the client's cipher.

use serde::Serialize;

/// Why a TLS connection stays in user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UserspaceReason {
    /// The kernel has no `tls` upper-layer protocol (no module, or `CONFIG_TLS` off).
    KernelHasNoKtls,
    /// `tls.ktls: off`.
    KtlsOff,
    /// The negotiated version and cipher are not among those the kernel accepted at start-up.
    CipherNotOffloadable,
    /// The connection could not be handed over cleanly, and went on in user space: the kernel
    /// refused the `tls` ULP, or the client's next record had only partly arrived when the
    /// handshake ended (rustls had read part of it). Also a connection closed because the
    /// kernel refused its keys, or the client updated keys before the hand-over.
    HandOverFailed,
}

impl UserspaceReason {
    /// Every reason, in metric order.
    pub const ALL: [UserspaceReason; 4] = [
        UserspaceReason::KernelHasNoKtls,
        UserspaceReason::KtlsOff,
        UserspaceReason::CipherNotOffloadable,
        UserspaceReason::HandOverFailed,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            UserspaceReason::KernelHasNoKtls => "kernel-has-no-ktls",
            UserspaceReason::KtlsOff => "ktls-off",
            UserspaceReason::CipherNotOffloadable => "cipher-not-offloadable",
            UserspaceReason::HandOverFailed => "hand-over-failed",
        }
    }

    /// The connection's verdict when its bodies are copied, in words.
    pub fn verdict(self) -> &'static str {
        match self {
            UserspaceReason::KernelHasNoKtls => TLS_USERSPACE_VERDICT,
            UserspaceReason::KtlsOff => "copy (TLS in user space: tls.ktls is off)",
            UserspaceReason::CipherNotOffloadable => {
                "copy (TLS in user space: cipher not offloadable)"
            }
            UserspaceReason::HandOverFailed => "copy (TLS in user space: kTLS hand-over failed)",
        }
    }
}

/// A TLS connection's record layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsTransport {
    /// Both directions in the kernel: bodies by sendfile, as on plain connections.
    Ktls,
    /// rustls encrypts: every body byte is copied by design.
    Userspace(UserspaceReason),
}

impl TlsTransport {
    /// The `ktls` label of `zerocache_tls_connections_total`.
    pub fn ktls_label(self) -> &'static str {
        match self {
            TlsTransport::Ktls => "txrx",
            TlsTransport::Userspace(_) => "none",
        }
    }

    /// The `reason` label: why not the kernel (`offloaded` when it is).
    pub fn reason_label(self) -> &'static str {
        match self {
            TlsTransport::Ktls => "offloaded",
            TlsTransport::Userspace(r) => r.as_str(),
        }
    }

    /// Every value, in metric order (kTLS first).
    pub fn all() -> impl Iterator<Item = TlsTransport> {
        std::iter::once(TlsTransport::Ktls).chain(
            UserspaceReason::ALL
                .into_iter()
                .map(TlsTransport::Userspace),
        )
    }

    /// The index of this value in [`TlsTransport::all`].
    pub(crate) fn index(self) -> usize {
        match self {
            TlsTransport::Ktls => 0,
            TlsTransport::Userspace(r) => 1 + r as usize,
        }
    }
}

/// The verdict of a connection in user space for want of kTLS in the kernel.
pub const TLS_USERSPACE_VERDICT: &str = "copy (TLS in user space: kernel has no kTLS)";

/// The verdict of a kTLS connection whose bodies all went out with sendfile.
pub const KTLS_VERDICT: &str = "sendfile (kTLS)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_fixed_and_indexes_follow_the_order() {
        let labels: Vec<(&str, &str)> = TlsTransport::all()
            .map(|t| (t.ktls_label(), t.reason_label()))
            .collect();
        assert_eq!(
            labels,
            [
                ("txrx", "offloaded"),
                ("none", "kernel-has-no-ktls"),
                ("none", "ktls-off"),
                ("none", "cipher-not-offloadable"),
                ("none", "hand-over-failed"),
            ]
        );
        for (i, t) in TlsTransport::all().enumerate() {
            assert_eq!(t.index(), i);
        }
    }
}
