//! Whether the kernel offers kTLS, found once at start-up. Setting the `tls` upper-layer protocol
//! (TCP_ULP) on an unconnected TCP socket fails with ENOTCONN when the ULP exists (the socket is
//! merely in the wrong state) and with ENOENT when it does not: no `tls` module loaded, or a
//! kernel built without `CONFIG_TLS`. Loading the module on demand needs CAP_NET_ADMIN, so an
//! unprivileged service wants `modprobe tls` at boot (see docs/tls.md).
//!
//! The ULP alone does not say which ciphers the kernel can run (each needs its crypto module),
//! so [`offload`] then tries each version and cipher rustls negotiates on a connected loopback
//! socket pair with a dummy key: what the kernel accepts there is what connections are offered.

use super::crypto_info::{Cipher, Direction, Version, crypto_info};
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, setsockopt, socket, sockopt};
use std::collections::BTreeSet;

/// What the probe for the `tls` ULP found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ktls {
    /// The kernel has the `tls` ULP.
    Available,
    /// ENOENT: no `tls` ULP (module not loaded, or `CONFIG_TLS` off).
    Missing,
    /// Any other answer (no socket could be made, say): treated as missing.
    Unknown(Errno),
}

impl Ktls {
    /// Whether kTLS can be used.
    pub fn available(self) -> bool {
        self == Ktls::Available
    }

    /// In words, for the start-up log.
    pub fn describe(self) -> String {
        match self {
            Ktls::Available => "available (tls ULP present)".into(),
            Ktls::Missing => {
                "unavailable: the kernel has no tls ULP (modprobe tls, or CONFIG_TLS is off)".into()
            }
            Ktls::Unknown(e) => format!("unknown ({e}); treated as unavailable"),
        }
    }
}

/// Asks the kernel, on a throw-away unconnected TCP socket.
pub fn detect() -> Ktls {
    let fd = match socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) {
        Ok(fd) => fd,
        Err(e) => return Ktls::Unknown(e),
    };
    match setsockopt(&fd, sockopt::TcpUlp::default(), b"tls") {
        Err(Errno::ENOTCONN) | Ok(()) => Ktls::Available,
        Err(Errno::ENOENT) => Ktls::Missing,
        Err(e) => Ktls::Unknown(e),
    }
}

/// The versions and ciphers the kernel took, send and receive keys both, on a connected socket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    accepted: BTreeSet<(Version, Cipher)>,
}

impl Offload {
    /// Whether connections with this version and cipher can be handed to the kernel.
    pub fn accepts(&self, version: Version, cipher: Cipher) -> bool {
        self.accepted.contains(&(version, cipher))
    }

    /// Whether any can.
    pub fn any(&self) -> bool {
        !self.accepted.is_empty()
    }

    /// In words, for the start-up log and `zerocache check`: `TLS1.3 AES-128-GCM, ...`.
    pub fn describe(&self) -> String {
        if self.accepted.is_empty() {
            return "none".into();
        }
        self.accepted
            .iter()
            .map(|(v, c)| format!("{} {}", v.name(), c.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What this kernel offers, found once per process (the first TLS listener load, or `check`).
pub fn offered() -> (Ktls, &'static Offload) {
    static FOUND: std::sync::OnceLock<(Ktls, Offload)> = std::sync::OnceLock::new();
    let (ulp, offload) = FOUND.get_or_init(|| {
        let ulp = detect();
        (ulp, offload(ulp))
    });
    (*ulp, offload)
}

/// Tries every version and cipher on its own connected loopback socket: the `tls` ULP, then
/// send and receive keys (zeros: the kernel checks the form, not the key). Nothing when the ULP
/// is missing; a pair that cannot be made counts as not accepted.
pub fn offload(ulp: Ktls) -> Offload {
    let mut accepted = BTreeSet::new();
    if !ulp.available() {
        return Offload { accepted };
    }
    for version in [Version::Tls12, Version::Tls13] {
        for cipher in Cipher::ALL {
            match try_pair(version, cipher) {
                Ok(()) => {
                    accepted.insert((version, cipher));
                }
                Err(e) => tracing::debug!(
                    version = version.name(),
                    cipher = cipher.name(),
                    error = %e,
                    "kTLS: the kernel does not take this cipher"
                ),
            }
        }
    }
    Offload { accepted }
}

fn try_pair(version: Version, cipher: Cipher) -> std::io::Result<()> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    let client = std::net::TcpStream::connect(listener.local_addr()?)?;
    let _server = listener.accept()?;
    setsockopt(&client, sockopt::TcpUlp::default(), b"tls")?;
    let key = [0u8; 32];
    let key = &key[..if cipher == Cipher::Aes128Gcm { 16 } else { 32 }];
    let iv = [0u8; 12];
    for (dir, opt) in [(Direction::Tx, true), (Direction::Rx, false)] {
        let info = crypto_info(version, cipher, key, &iv, 0, dir).map_err(std::io::Error::other)?;
        if opt {
            setsockopt(&client, sockopt::TcpTlsTx, &info)?;
        } else {
            setsockopt(&client, sockopt::TcpTlsRx, &info)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the ULP nothing is offered; with it, every pair the kernel took is listed (on
    /// Debian's 6.1 and 6.12 kernels, all six: the kernel matrix runs this).
    #[test]
    fn offload_is_empty_without_the_ulp_and_names_what_the_kernel_took() {
        let ulp = detect();
        let o = offload(ulp);
        println!("kTLS offload: {}", o.describe());
        if ulp.available() {
            // AES-128-GCM in both versions is kTLS's oldest pair (4.13/5.1): every kernel with
            // the ULP that the probe runs on (5.15 and later) takes it.
            assert!(o.accepts(Version::Tls13, Cipher::Aes128Gcm), "{o:?}");
            assert!(o.accepts(Version::Tls12, Cipher::Aes128Gcm), "{o:?}");
        } else {
            assert_eq!(o, Offload::default());
            assert_eq!(o.describe(), "none");
        }
        assert!(offload(Ktls::Missing) == Offload::default());
    }

    /// The answer agrees with the kernel's own list of ULPs: `tls` is listed there exactly when
    /// it is loaded (a kernel with it built as a module that is not loaded yet may still answer
    /// ENOTCONN by loading it on demand, as root, so only that direction is asserted).
    #[test]
    fn detection_agrees_with_tcp_available_ulp() {
        let found = detect();
        println!("kTLS: {}", found.describe());
        let listed = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
            .unwrap_or_default()
            .split_whitespace()
            .any(|u| u == "tls");
        if listed {
            assert_eq!(found, Ktls::Available);
        }
        if found == Ktls::Missing {
            assert!(!listed);
        }
    }
}
