//! Peers of the connections watched processes accept: the kernel sends an `ACCEPTED` event while
//! watch mode has them on (`switch::ACCEPT_EVENTS`), and the reader looks the peer up in /proc at
//! once, before the connection can close, so even a connection that lasts a few milliseconds has
//! its peer. Kept per (pid, fd, generation) until a consumer takes it with the closed record,
//! bounded (oldest forgotten first) and rate-limited, since each lookup reads the process's TCP
//! tables.

use crate::peers::{PEERS_KEPT, RESOLVE_PER_SECOND, peers_of};
use crate::probe::Probe;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use zerocache_probe_common::{Event, event};

type Key = (u32, u32, u64);

/// The accepted connections' peers.
pub(crate) struct AcceptedPeers {
    peers: HashMap<Key, SocketAddr>,
    order: VecDeque<Key>,
    window: Instant,
    resolved: u32,
}

impl Default for AcceptedPeers {
    fn default() -> Self {
        AcceptedPeers {
            peers: HashMap::new(),
            order: VecDeque::new(),
            window: Instant::now(),
            resolved: 0,
        }
    }
}

impl AcceptedPeers {
    /// Takes up to `n` lookups from this second's budget; returns how many are allowed.
    fn budget(&mut self, n: u32) -> u32 {
        if self.window.elapsed() >= Duration::from_secs(1) {
            self.window = Instant::now();
            self.resolved = 0;
        }
        let allowed = n.min(RESOLVE_PER_SECOND.saturating_sub(self.resolved));
        self.resolved += allowed;
        allowed
    }

    fn insert(&mut self, key: Key, addr: SocketAddr) {
        if self.peers.insert(key, addr).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > PEERS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.peers.remove(&old);
            }
        }
    }
}

impl Probe {
    /// Reads the peers of the connections accepted in `batch`, one TCP-table read per process.
    pub(crate) fn resolve_accepted(&self, batch: &[Event]) {
        let mut by_pid: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
        for ev in batch.iter().filter(|e| e.event == event::ACCEPTED) {
            by_pid
                .entry(ev.tgid)
                .or_default()
                .push((ev.fd, ev.record.info.generation));
        }
        for (pid, conns) in by_pid {
            let allowed = self.inner.accepted.lock().budget(conns.len() as u32) as usize;
            let conns = &conns[..allowed];
            if conns.is_empty() {
                continue;
            }
            let fds: Vec<u32> = conns.iter().map(|(fd, _)| *fd).collect();
            let found = peers_of(pid, &fds);
            let mut acc = self.inner.accepted.lock();
            for (fd, addr) in found {
                if let Some((_, generation)) = conns.iter().find(|(f, _)| *f == fd) {
                    acc.insert((pid, fd, *generation), addr);
                }
            }
        }
    }

    /// The peer of an accepted connection, read when it was accepted (watch mode only).
    pub fn peer(&self, pid: u32, fd: u32, generation: u64) -> Option<SocketAddr> {
        self.inner
            .accepted
            .lock()
            .peers
            .get(&(pid, fd, generation))
            .copied()
    }

    /// Like [`Probe::peer`], and forgets it: for the consumer of the connection's closed record.
    pub fn take_peer(&self, pid: u32, fd: u32, generation: u64) -> Option<SocketAddr> {
        self.inner
            .accepted
            .lock()
            .peers
            .remove(&(pid, fd, generation))
    }
}
