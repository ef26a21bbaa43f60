//! Whether the kernel offers kTLS, found once at start-up. Setting the `tls` upper-layer protocol
//! (TCP_ULP) on an unconnected TCP socket fails with ENOTCONN when the ULP exists (the socket is
//! merely in the wrong state) and with ENOENT when it does not: no `tls` module loaded, or a
//! kernel built without `CONFIG_TLS`. Loading the module on demand needs CAP_NET_ADMIN, so an
//! unprivileged service wants `modprobe tls` at boot (see docs/tls.md).
//!
//! zerocache does not hand keys to the kernel yet: with or without kTLS, TLS hits are encrypted
//! in user space and accounted as `tls-userspace`. The detection is reported
//! (`zerocache_ktls_available`, the dashboard) so an operator sees what the machine could do.

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, setsockopt, socket, sockopt};

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

#[cfg(test)]
mod tests {
    use super::*;

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
