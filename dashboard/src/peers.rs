//! Connections of other processes (watch mode): each socket record of a watched process with its
//! peer address and a verdict, as `/api/process_connections` shows them.
//!
//! The probe's records carry a pid, an fd and a generation, not an address. The probe reads the
//! peer of every connection a watched process accepts as soon as the kernel reports the accept
//! (`Probe::peer`); for the other live sockets (connected ones, those open before the watch) a
//! poller reads it every [`POLL`]. Both go through `/proc/PID/fd/FD` (`socket:[INODE]`) and the
//! process's `/proc/PID/net/tcp{,6}`. A closed record takes its peer along into the closed list.
//! Reading another user's `/proc/PID/fd` needs CAP_SYS_PTRACE (root has it); without it, and for
//! a connected socket that opens and closes between two polls, the peer is `-`.

use crate::processes::verdict;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
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
        let key = (r.pid, r.fd, r.generation);
        let from_accept = self.probe.take_peer(r.pid, r.fd, r.generation);
        let mut book = self.book.lock();
        let polled = book.peers.remove(&key);
        let peer = from_accept
            .map(|a| a.to_string())
            .or(polled)
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
            let unknown: Vec<(u32, u64)> = {
                let mut book = self.book.lock();
                book.comms.insert(p.pid, p.comm.clone());
                live.iter()
                    .filter(|(fd, generation, socket, _)| {
                        *socket
                            && !book.peers.contains_key(&(p.pid, *fd, *generation))
                            && self.probe.peer(p.pid, *fd, *generation).is_none()
                    })
                    .map(|(fd, generation, _, _)| (*fd, *generation))
                    .collect()
            };
            if unknown.is_empty() {
                continue;
            }
            let fds: Vec<u32> = unknown.iter().map(|(fd, _)| *fd).collect();
            let found = zerocache_probe::peers_of(p.pid, &fds);
            let mut book = self.book.lock();
            for (fd, addr) in found {
                if let Some((_, generation)) = unknown.iter().find(|(f, _)| *f == fd) {
                    book.peers
                        .insert((p.pid, fd, *generation), addr.to_string());
                }
            }
            // Bounded: peers of fds whose close event was lost would otherwise stay.
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
                    .or_else(|| {
                        self.probe
                            .peer(p.pid, fd, generation)
                            .map(|a| a.to_string())
                    })
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
