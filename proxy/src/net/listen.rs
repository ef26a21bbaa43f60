//! The listening sockets, made with nix rather than `TcpListener::bind` so the backlog is the
//! operator's (`backlog`, nginx's 511 by default; std uses 128) and an IPv6 socket is IPv6-only,
//! so `[::]:8080` and `0.0.0.0:8080` can both be listed, as in nginx (`ipv6only=on`).

use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt, socket,
    sockopt,
};
use std::net::SocketAddr;
use std::sync::Arc;
use zerocache_config::cidr::Cidr;

/// What a listening socket's connections start with: TLS or plain, a PROXY protocol header
/// from one of these peers or none, and on a plain one perhaps the HTTP/2 preface.
#[derive(Debug, Clone, Default)]
pub struct Accepting {
    /// The `tls:` listener's.
    pub tls: bool,
    /// `proxy_protocol: true`: the peers a header is taken from (`proxy_protocol_from`).
    pub proxy_from: Option<Arc<[Cidr]>>,
    /// `h2c: true`: a plain connection that opens with the HTTP/2 preface speaks h2.
    pub h2c: bool,
}

impl Accepting {
    /// The options of a `listen` (or, with `tls`, `tls.listen`) entry of a validated config.
    pub fn of(entry: &zerocache_config::ListenEntry, tls: bool) -> Accepting {
        let proxy_from = entry.proxy_protocol.then(|| {
            entry
                .proxy_protocol_from
                .iter()
                .filter_map(|c| Cidr::parse(c).ok())
                .collect::<Vec<_>>()
                .into()
        });
        Accepting {
            tls,
            proxy_from,
            h2c: entry.h2c && !tls,
        }
    }
}

/// A listening, non-blocking, close-on-exec TCP socket on `addr` with `backlog` pending
/// connections at most (the kernel caps it at `net.core.somaxconn`).
pub fn bind_listener(addr: SocketAddr, backlog: u32) -> std::io::Result<std::net::TcpListener> {
    let family = if addr.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let fd = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    // A restart must not fail on the previous process's connections in TIME_WAIT.
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(addr),
    )?;
    listen(&fd, backlog_of(backlog))?;
    Ok(std::net::TcpListener::from(fd))
}

/// `backlog` as listen(2) takes it. nix refuses values above the libc constant SOMAXCONN (4096);
/// the kernel's own cap is the sysctl net.core.somaxconn, which a tuned host raises. Above the
/// constant, -1 asks the kernel for its cap.
fn backlog_of(backlog: u32) -> Backlog {
    i32::try_from(backlog)
        .ok()
        .and_then(|n| Backlog::new(n).ok())
        .unwrap_or(Backlog::MAXALLOWABLE)
}

/// A listening socket handed down (socket activation, an upgrade), given this config's
/// `backlog`: listen(2) again on a listening socket only changes its backlog, and the
/// connections already in it stay.
pub fn relisten(fd: std::os::fd::OwnedFd, backlog: u32) -> std::io::Result<std::net::TcpListener> {
    listen(&fd, backlog_of(backlog))?;
    Ok(std::net::TcpListener::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_v4_and_v6_on_one_port_and_accepts() {
        let v4 = bind_listener("127.0.0.1:0".parse().expect("addr"), 511).expect("v4");
        let port = v4.local_addr().expect("addr").port();
        // IPv6-only: the same port on [::1] is a different socket, not a conflict.
        if let Ok(v6) = bind_listener(format!("[::1]:{port}").parse().expect("addr"), 511) {
            assert_eq!(v6.local_addr().expect("addr").port(), port);
        }
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        v4.set_nonblocking(false).expect("blocking");
        assert!(v4.accept().is_ok());
        // A port that is taken is an error, not a silent second listener.
        assert!(bind_listener(format!("127.0.0.1:{port}").parse().expect("addr"), 511).is_err());
    }
}
