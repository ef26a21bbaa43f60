//! The watch list: resolving targets (`self`, a PID, a `comm`) to processes, handing each a
//! watch index and publishing it to the kernel's filter, and retiring processes that exited or are
//! no longer targeted (their open fds become closed records, their totals are kept).

use crate::maps::{Maps, read_totals, take_records};
use crate::model::{ClosedFd, WatchTarget};
use crate::probe::{EXITED_KEPT, Probe, State};
use crate::procfs;
use aya::maps::PerCpuValues;
use std::collections::BTreeMap;
use tokio::sync::broadcast;
use zerocache_probe_common::{
    FAST_WATCHED, FD_CLASS_OTHER, FD_CLASS_SOCKET, FD_CLASSES, FdInfo, FdKey, MAX_WATCHED, Pending,
    ProcTotals, WATCH_FILTER_SHARED, WATCH_FILTER_SLOTS, WatchSlot, fd_flags,
};

impl Probe {
    /// Resolves targets to PIDs, starts watching new ones, stops watching dead or untargeted ones.
    pub(crate) fn resolve_targets(&self) {
        let Some(maps) = &self.inner.maps else {
            return;
        };
        let mut st = self.inner.state.lock();
        let mut wanted: BTreeMap<u32, String> = BTreeMap::new();
        for t in &st.targets {
            match t {
                WatchTarget::SelfProcess => {
                    let me = std::process::id();
                    wanted.insert(me, procfs::read_comm(me).unwrap_or_default());
                }
                WatchTarget::Pid(pid) => {
                    if procfs::alive(*pid) {
                        wanted.insert(*pid, procfs::read_comm(*pid).unwrap_or_default());
                    }
                }
                WatchTarget::Comm(c) => {
                    for pid in procfs::pids_by_comm(c) {
                        wanted.insert(pid, c.clone());
                    }
                }
            }
        }
        let mut maps = maps.lock();
        let gone: Vec<u32> = st
            .watching
            .keys()
            .filter(|p| !wanted.contains_key(p) || !procfs::alive(**p))
            .copied()
            .collect();
        for pid in gone {
            if let Some(comm) = st.watching.remove(&pid) {
                let closed = retire(&mut maps, pid, comm, &mut st);
                drop_closed(&self.inner.closed_tx, closed);
            }
        }
        for (pid, comm) in wanted {
            if st.watching.contains_key(&pid) || !procfs::alive(pid) {
                continue;
            }
            // Seed the fds that are already sockets: the kernel only sees those created later.
            for fd in procfs::socket_fds(pid) {
                let info = FdInfo {
                    generation: 0,
                    flags: fd_flags::SOCKET,
                    _pad: 0,
                };
                let _ = maps.fd_info.insert(FdKey { tgid: pid, fd }, info, 0);
            }
            let Some(index) = maps.take_index() else {
                tracing::warn!(pid, %comm, limit = MAX_WATCHED, "cannot watch process: watch limit reached");
                continue;
            };
            if let Err(e) = start_counting(&mut maps, pid, index) {
                maps.free_indexes.push_back(index);
                tracing::warn!(pid, error = %e, "cannot watch process");
                continue;
            }
            tracing::info!(pid, %comm, "probe watching");
            st.watching.insert(pid, comm);
        }
        drop(maps);
        drop(st);
        self.sync_read_side();
    }
}

pub(crate) fn drop_closed(tx: &broadcast::Sender<ClosedFd>, closed: Vec<ClosedFd>) {
    for r in closed {
        let _ = tx.send(r);
    }
}

/// Stops counting `pid`: its open fds become closed records, its totals are kept as exited.
pub(crate) fn retire(maps: &mut Maps, pid: u32, comm: String, st: &mut State) -> Vec<ClosedFd> {
    let index = maps.watched.get(&pid, 0).ok();
    let _ = maps.watched.remove(&pid);
    let _ = refresh_filter(maps, pid);
    let closed = take_records(maps, pid, index, 0..=u32::MAX);
    let mut totals = index.map(|i| read_totals(maps, pid, i)).unwrap_or_default();
    totals.pid = pid;
    totals.comm = comm;
    totals.alive = false;
    if let Some(i) = index {
        maps.free_indexes.push_back(i);
    }
    let stale: Vec<FdKey> = maps
        .fd_info
        .keys()
        .filter_map(|k| k.ok())
        .filter(|k| k.tgid == pid)
        .collect();
    for k in stale {
        let _ = maps.fd_info.remove(&k);
    }
    for r in &closed {
        st.closed.push(r.clone());
    }
    st.exited.push(totals);
    if st.exited.len() > EXITED_KEPT {
        st.exited.remove(0);
    }
    closed
}

/// Zeroes the totals of watch index `index` (a previous process may have used it), then publishes
/// `pid` with that index: totals first, so the kernel never counts into stale ones.
fn start_counting(maps: &mut Maps, pid: u32, index: u32) -> Result<(), aya::maps::MapError> {
    maps.fd_table.clear_index(index)?;
    for class in [FD_CLASS_SOCKET, FD_CLASS_OTHER] {
        // The length is the possible-CPU count aya itself checks against, so this cannot fail.
        if let Ok(zero) = PerCpuValues::try_from(vec![ProcTotals::default(); maps.cpus]) {
            maps.totals.set(index * FD_CLASSES + class, zero, 0)?;
        }
    }
    maps.pending.set(index, Pending::default(), 0)?;
    maps.watched.insert(pid, index, 0)?;
    refresh_filter(maps, pid)
}

/// Recomputes the filter slot `pid` maps to from the watched set: empty, that one tgid with its
/// index, or "shared" (the kernel then asks the hash).
fn refresh_filter(maps: &mut Maps, pid: u32) -> Result<(), aya::maps::MapError> {
    let slot = pid & (WATCH_FILTER_SLOTS - 1);
    let in_slot: Vec<(u32, u32)> = maps
        .watched
        .iter()
        .filter_map(|k| k.ok())
        .filter(|(k, _)| k & (WATCH_FILTER_SLOTS - 1) == slot)
        .collect();
    let value = match in_slot.as_slice() {
        [] => WatchSlot::default(),
        [(tgid, index)] => WatchSlot {
            tgid: *tgid,
            index: *index,
        },
        _ => WatchSlot {
            tgid: WATCH_FILTER_SHARED,
            index: 0,
        },
    };
    maps.watch_filter.set(slot, value, 0)
}

impl Maps {
    /// A free watch index, a fast one (with an `FD_TABLE` range) if any is free.
    fn take_index(&mut self) -> Option<u32> {
        match self.free_indexes.iter().position(|i| *i < FAST_WATCHED) {
            Some(at) => self.free_indexes.remove(at),
            None => self.free_indexes.pop_front(),
        }
    }
}
