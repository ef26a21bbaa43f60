//! Connections of other processes (watch mode): each socket record of a watched process with its
//! peer address and a verdict, as `/api/process_connections` shows them.
//!
//! The probe's records carry a pid, an fd and a generation, not an address. A poller reads the
//! peer of every live socket record from `/proc/PID/fd/FD` (`socket:[INODE]`) and the process's
//! `/proc/PID/net/tcp` and `tcp6` (the inode's remote address), and keeps it until the record's
//! close event arrives, which then carries it into the closed list. A connection that opens and
//! closes between two polls (every [`POLL`]) has no peer (`-`). Reading another user's
//! `/proc/PID/fd` needs CAP_SYS_PTRACE (root has it); without it peers are `-` too.

use crate::processes::verdict;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use zerocache_probe::{ClosedFd, FdCounts, Probe};

/// How often live sockets' peers are looked up.
pub const POLL: Duration = Duration::from_millis(200);
/// Closed connections kept.
const CLOSED_KEPT: usize = 1000;

/// One connection of a watched process.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessConn {
    /// The process.
    pub pid: u32,
    /// Its comm.
    pub comm: String,
    /// The fd number.
    pub fd: u32,
    /// The probe's generation of the fd (0: it predates the watch).
    pub generation: u64,
    /// `ip:port` of the other end, or `-` when it could not be read.
    pub peer: String,
    /// Still open.
    pub active: bool,
    /// Bytes via sendfile and splice.
    pub zero_copy_bytes: u64,
    /// Bytes via copying syscalls (write, writev, sendto, sendmsg).
    pub copied_bytes: u64,
    /// Of those, copy-loop bytes (file bytes read just before).
    pub copy_loop_bytes: u64,
    /// Calls of every kind.
    pub calls: u64,
    /// `zero-copy`, `copy-loop`, `copy` or `idle`.
    pub verdict: &'static str,
}

impl ProcessConn {
    fn new(pid: u32, comm: &str, fd: u32, generation: u64, peer: String, c: &FdCounts) -> Self {
        ProcessConn {
            pid,
            comm: comm.to_string(),
            fd,
            generation,
            peer,
            active: true,
            zero_copy_bytes: c.zero_copy_bytes(),
            copied_bytes: c.copy_bytes(),
            copy_loop_bytes: c.copy_loop_bytes,
            calls: c.calls(),
            verdict: verdict(c.zero_copy_bytes(), c.copy_bytes(), c.copy_loop_bytes),
        }
    }
}

/// `/api/process_connections`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessConns {
    /// Open sockets with live figures.
    pub active: Vec<ProcessConn>,
    /// Closed ones, newest first.
    pub closed: Vec<ProcessConn>,
}

#[derive(Default)]
struct Book {
    /// (pid, fd, generation) → peer.
    peers: HashMap<(u32, u32, u64), String>,
    /// pid → comm, for closed records of exited processes.
    comms: HashMap<u32, String>,
    closed: VecDeque<ProcessConn>,
}

/// The peer book and the closed list; cheap to clone.
#[derive(Clone)]
pub struct Peers {
    probe: Probe,
    book: Arc<Mutex<Book>>,
}

impl Peers {
    /// Starts the poller and the close-event reader (inside a tokio runtime). Records of
    /// `exclude` (zerocache itself) are left out.
    pub fn start(probe: Probe, exclude: u32) -> Peers {
        let peers = Peers {
            probe,
            book: Arc::new(Mutex::new(Book::default())),
        };
        let p = peers.clone();
        let mut rx = p.probe.subscribe_closed();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(r) if r.socket && r.pid != exclude => p.closed(&r),
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(lost = n, "watch view fell behind the probe's close events");
                    }
                    Err(_) => return,
                }
            }
        });
        let p = peers.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            loop {
                tick.tick().await;
                p.poll(exclude);
            }
        });
        peers
    }

    fn closed(&self, r: &ClosedFd) {
        let mut book = self.book.lock();
        let peer = book
            .peers
            .remove(&(r.pid, r.fd, r.generation))
            .unwrap_or_else(|| "-".into());
        let comm = book.comms.get(&r.pid).cloned().unwrap_or_default();
        let mut c = ProcessConn::new(r.pid, &comm, r.fd, r.generation, peer, &r.counts);
        c.active = false;
        book.closed.push_front(c);
        book.closed.truncate(CLOSED_KEPT);
    }

    /// Looks up the peers of live sockets that have none yet.
    fn poll(&self, exclude: u32) {
        for p in self.probe.snapshot().processes {
            if !p.alive || p.pid == exclude {
                continue;
            }
            let live = self.probe.live_fds(p.pid);
            let mut table: Option<HashMap<u64, SocketAddr>> = None;
            let mut book = self.book.lock();
            book.comms.insert(p.pid, p.comm.clone());
            for (fd, generation, socket, _) in live {
                if !socket || book.peers.contains_key(&(p.pid, fd, generation)) {
                    continue;
                }
                let table = table.get_or_insert_with(|| remote_by_inode(p.pid));
                if let Some(peer) = socket_inode(p.pid, fd).and_then(|i| table.get(&i)) {
                    book.peers.insert((p.pid, fd, generation), peer.to_string());
                }
            }
            // Forget peers of fds whose process is gone (their close events are flushed first).
            if book.peers.len() > 100_000 {
                book.peers.clear();
            }
        }
    }

    /// Live sockets of every watched process but zerocache, and the closed ones.
    pub fn view(&self, exclude: u32) -> ProcessConns {
        let mut active = Vec::new();
        for p in self.probe.snapshot().processes {
            if !p.alive || p.pid == exclude {
                continue;
            }
            let live = self.probe.live_fds(p.pid);
            let book = self.book.lock();
            for (fd, generation, socket, counts) in live {
                if !socket {
                    continue;
                }
                let peer = book
                    .peers
                    .get(&(p.pid, fd, generation))
                    .cloned()
                    .unwrap_or_else(|| "-".into());
                active.push(ProcessConn::new(
                    p.pid, &p.comm, fd, generation, peer, &counts,
                ));
            }
        }
        ProcessConns {
            active,
            closed: self.book.lock().closed.iter().cloned().collect(),
        }
    }
}

/// The inode of `/proc/PID/fd/FD` when it is a socket.
fn socket_inode(pid: u32, fd: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// inode → remote address, from the process's view of the TCP tables (its network namespace).
fn remote_by_inode(pid: u32) -> HashMap<u64, SocketAddr> {
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
