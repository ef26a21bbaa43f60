//! Peer addresses of other processes' sockets, from /proc: `/proc/PID/fd/FD` names the socket's
//! inode (`socket:[INODE]`), and the process's `/proc/PID/net/tcp` and `tcp6` (its network
//! namespace's TCP tables) give that inode's remote address. Watch mode reads them when a watched
//! process accepts a connection (an `ACCEPTED` event from the kernel, while the fd is surely still
//! open) and for live sockets it polls; another user's `/proc/PID/fd` needs CAP_SYS_PTRACE.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

/// Peers resolved per second at most: each resolution reads the process's whole TCP table.
pub(crate) const RESOLVE_PER_SECOND: u32 = 200;
/// Peers kept for connections not yet closed; beyond this the oldest are forgotten.
pub(crate) const PEERS_KEPT: usize = 65_536;

/// The remote address of `pid`'s socket `fd`, if it is a TCP socket and /proc can be read.
pub fn peer_of(pid: u32, fd: u32) -> Option<SocketAddr> {
    let inode = socket_inode(pid, fd)?;
    remote_by_inode(pid).get(&inode).copied()
}

/// The remote addresses of several fds of one process, reading its TCP tables once.
pub fn peers_of(pid: u32, fds: &[u32]) -> Vec<(u32, SocketAddr)> {
    let inodes: Vec<(u32, u64)> = fds
        .iter()
        .filter_map(|fd| socket_inode(pid, *fd).map(|i| (*fd, i)))
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let table = remote_by_inode(pid);
    inodes
        .into_iter()
        .filter_map(|(fd, i)| table.get(&i).map(|a| (fd, *a)))
        .collect()
}

/// The inode of `/proc/PID/fd/FD` when it is a socket.
pub(crate) fn socket_inode(pid: u32, fd: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// inode → remote address, from the process's view of the TCP tables (its network namespace).
pub(crate) fn remote_by_inode(pid: u32) -> HashMap<u64, SocketAddr> {
    let mut out = HashMap::new();
    for (file, v6) in [("tcp", false), ("tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            if let Some((inode, addr)) = parse_tcp_line(line, v6) {
                out.insert(inode, addr);
            }
        }
    }
    out
}

/// One line of /proc/net/tcp or tcp6: (inode, remote address). Addresses are hex words in host
/// byte order, ports hex in network order as numbers.
fn parse_tcp_line(line: &str, v6: bool) -> Option<(u64, SocketAddr)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let (addr, port) = f.get(2)?.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let inode: u64 = f.get(9)?.parse().ok()?;
    let ip = if v6 {
        if addr.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for w in 0..4 {
            let word = u32::from_str_radix(&addr[w * 8..w * 8 + 8], 16).ok()?;
            bytes[w * 4..w * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        let v6 = Ipv6Addr::from(bytes);
        match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6(v6),
        }
    } else {
        let word = u32::from_str_radix(addr, 16).ok()?;
        std::net::IpAddr::V4(Ipv4Addr::from(word.to_le_bytes()))
    };
    Some((inode, SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_net_tcp_lines() {
        let v4 = "   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_tcp_line(v4, false),
            Some((123456, "127.0.0.1:54321".parse().expect("addr")))
        );
        let v6 = "   0: 00000000000000000000000001000000:1F90 0000000000000000FFFF00000100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_tcp_line(v6, true),
            Some((77, "127.0.0.1:54321".parse().expect("addr")))
        );
        assert_eq!(parse_tcp_line("garbage", false), None);
    }

    #[test]
    fn finds_the_peer_of_an_own_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, from) = l.accept().expect("accept");
        use std::os::fd::AsRawFd;
        let me = std::process::id();
        let inode = socket_inode(me, s.as_raw_fd() as u32).expect("socket inode");
        assert_eq!(remote_by_inode(me).get(&inode), Some(&from));
        drop(c);
    }
}
