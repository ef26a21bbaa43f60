//! The probe's maps as user space holds them, and the reads and deletions of records and totals
//! that several parts of the loader share.

use crate::fd_table::FdTable;
use crate::model::{ClosedFd, FdCounts, ProcessTotals};
use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use std::ops::RangeInclusive;
use zerocache_probe_common::{
    FD_CLASS_OTHER, FD_CLASS_SOCKET, FD_CLASSES, FdInfo, FdKey, FdRecord, Pending, ProcTotals,
    WatchSlot,
};

pub(crate) struct Maps {
    /// tgid → watch index.
    pub(crate) watched: HashMap<MapData, u32, u32>,
    pub(crate) watch_filter: Array<MapData, WatchSlot>,
    pub(crate) fd_info: HashMap<MapData, FdKey, FdInfo>,
    /// Records of the fast watch indexes' low fds.
    pub(crate) fd_table: FdTable,
    /// Records of every other watched fd.
    pub(crate) fd_records: HashMap<MapData, FdKey, FdRecord>,
    pub(crate) totals: PerCpuArray<MapData, ProcTotals>,
    pub(crate) stats: Array<MapData, u64>,
    /// Copy-loop state per watch index, zeroed when an index is handed out.
    pub(crate) pending: Array<MapData, Pending>,
    /// Run-time switches (`switch`).
    pub(crate) switches: Array<MapData, u32>,
    /// Watch indexes not in use, oldest-freed first: a retired process's index is reused as late
    /// as possible, so a program run that raced its retirement cannot touch its successor's totals.
    /// [`Maps::take_index`] still prefers the fast ones.
    pub(crate) free_indexes: std::collections::VecDeque<u32>,
    /// Possible CPUs: the length of a per-CPU value.
    pub(crate) cpus: usize,
}

/// Turns the records of `tgid`'s fds in `fds` into closed records and forgets them, in the table
/// (when `index` has a range there) and in the hash.
pub(crate) fn take_records(
    maps: &mut Maps,
    tgid: u32,
    index: Option<u32>,
    fds: RangeInclusive<u32>,
) -> Vec<ClosedFd> {
    let mut out = Vec::new();
    if let Some(index) = index {
        for (fd, r) in maps.fd_table.live(index, fds.clone()) {
            let _ = maps.fd_table.clear(index, fd);
            let _ = maps.fd_info.remove(&FdKey { tgid, fd });
            out.push(ClosedFd::new(
                tgid,
                fd,
                r.info.generation,
                r.info.flags,
                FdCounts::from_record(&r),
            ));
        }
    }
    let keys: Vec<FdKey> = maps
        .fd_records
        .keys()
        .filter_map(|k| k.ok())
        .filter(|k| k.tgid == tgid && fds.contains(&k.fd))
        .collect();
    for k in keys {
        if let Ok(r) = maps.fd_records.get(&k, 0) {
            let _ = maps.fd_records.remove(&k);
            let _ = maps.fd_info.remove(&k);
            out.push(ClosedFd::new(
                k.tgid,
                k.fd,
                r.info.generation,
                r.info.flags,
                FdCounts::from_record(&r),
            ));
        }
    }
    out
}

pub(crate) fn read_totals(maps: &Maps, pid: u32, index: u32) -> ProcessTotals {
    let mut p = ProcessTotals {
        pid,
        ..Default::default()
    };
    for class in [FD_CLASS_SOCKET, FD_CLASS_OTHER] {
        if let Ok(per_cpu) = maps.totals.get(&(index * FD_CLASSES + class), 0) {
            for t in per_cpu.iter() {
                let dest = if class == FD_CLASS_SOCKET {
                    &mut p.socket
                } else {
                    &mut p.other
                };
                dest.add_raw(&t.counts);
                p.io_uring_enter += t.io_uring_enter;
                p.file_read_calls += t.file_read_calls;
                p.file_read_bytes += t.file_read_bytes;
                p.copy_loop_bytes += t.copy_loop_bytes;
                dest.copy_loop_bytes += t.copy_loop_bytes;
            }
        }
    }
    p
}
