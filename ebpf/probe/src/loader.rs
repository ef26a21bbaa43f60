//! Loading, attaching and reading the probe. Kernel-facing and nothing else: policy (what counts as
//! a violation, how a connection is named) lives with the consumers.

use crate::btf;
use crate::fd_table::FdTable;
use crate::model::{
    ClosedFd, FdCounts, ProbeHealth, ProbeStatus, ProcessTotals, Snapshot, WatchTarget,
};
use crate::procfs;
use crate::store::ClosedStore;
use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuValues, RingBuf};
use aya::programs::{ProgramError, TracePoint};
use aya::{Ebpf, EbpfError, EbpfLoader};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::broadcast;
use zerocache_probe_common::{
    Event, FAST_WATCHED, FD_CLASS_OTHER, FD_CLASS_SOCKET, FD_CLASSES, FdInfo, FdKey, FdRecord,
    MAX_WATCHED, ProcTotals, WATCH_FILTER_SHARED, WATCH_FILTER_SLOTS, WatchSlot, event, fd_flags,
    stat,
};

static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/zerocache-probe-bpf"));

/// (program, category, tracepoint) for every attachment. Output syscalls are seen only at their
/// exit, where the return value is known and the arguments are still in the saved registers: one
/// program run per call instead of an enter and an exit with a per-thread map between them.
const ATTACHMENTS: &[(&str, &str, &str)] = &[
    ("exit_sendfile", "syscalls", "sys_exit_sendfile64"),
    ("exit_splice", "syscalls", "sys_exit_splice"),
    ("exit_write", "syscalls", "sys_exit_write"),
    ("exit_writev", "syscalls", "sys_exit_writev"),
    ("exit_sendto", "syscalls", "sys_exit_sendto"),
    ("exit_sendmsg", "syscalls", "sys_exit_sendmsg"),
    ("exit_sendmmsg", "syscalls", "sys_exit_sendmmsg"),
    ("exit_accept", "syscalls", "sys_exit_accept"),
    ("exit_accept", "syscalls", "sys_exit_accept4"),
    ("exit_socket", "syscalls", "sys_exit_socket"),
    ("enter_close", "syscalls", "sys_enter_close"),
    ("enter_dup", "syscalls", "sys_enter_dup2"),
    ("enter_dup", "syscalls", "sys_enter_dup3"),
    ("enter_close_range", "syscalls", "sys_enter_close_range"),
    ("enter_io_uring", "syscalls", "sys_enter_io_uring_enter"),
    ("sched_exit", "sched", "sched_process_exit"),
];

/// How often `comm` targets are re-resolved and dead PIDs noticed.
const RESOLVE_EVERY: Duration = Duration::from_secs(1);
/// Exited processes whose totals are still shown.
const EXITED_KEPT: usize = 64;

/// What to load and watch.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// False: do not touch the kernel at all.
    pub enabled: bool,
    /// Processes to count.
    pub watch: Vec<WatchTarget>,
    /// Closed-fd records kept for the dashboard.
    pub closed_capacity: usize,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            enabled: true,
            watch: vec![WatchTarget::SelfProcess],
            closed_capacity: 10_000,
        }
    }
}

/// A handle on the probe; cheap to clone.
#[derive(Clone)]
pub struct Probe {
    inner: Arc<Inner>,
}

struct Maps {
    /// tgid → watch index.
    watched: HashMap<MapData, u32, u32>,
    watch_filter: Array<MapData, WatchSlot>,
    fd_info: HashMap<MapData, FdKey, FdInfo>,
    /// Records of the fast watch indexes' low fds.
    fd_table: FdTable,
    /// Records of every other watched fd.
    fd_records: HashMap<MapData, FdKey, FdRecord>,
    totals: PerCpuArray<MapData, ProcTotals>,
    stats: Array<MapData, u64>,
    /// Watch indexes not in use, oldest-freed first: a retired process's index is reused as late
    /// as possible, so a program run that raced its retirement cannot touch its successor's totals.
    /// [`Maps::take_index`] still prefers the fast ones.
    free_indexes: std::collections::VecDeque<u32>,
    /// Possible CPUs: the length of a per-CPU value.
    cpus: usize,
}

struct State {
    targets: Vec<WatchTarget>,
    /// Watched PIDs and their comm.
    watching: BTreeMap<u32, String>,
    exited: Vec<ProcessTotals>,
    closed: ClosedStore,
}

struct Inner {
    status: ProbeStatus,
    maps: Option<Mutex<Maps>>,
    state: Mutex<State>,
    closed_tx: broadcast::Sender<ClosedFd>,
    /// Keeps the programs and their links alive; never read.
    _ebpf: Option<Mutex<Ebpf>>,
}

/// Why loading or attaching failed, phrased for an operator.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error(
        "loading the BPF object failed: {0} (loading BPF needs root, or CAP_BPF and CAP_PERFMON; unprivileged BPF is disabled on this kernel)"
    )]
    Load(#[source] EbpfError),
    #[error("the kernel's verifier rejected program {program}: {error}\nverifier log:\n{log}")]
    Verifier {
        program: String,
        error: String,
        log: String,
    },
    #[error("attaching {program} to {category}/{name} failed: {error}{hint}")]
    Attach {
        program: String,
        category: String,
        name: String,
        error: String,
        hint: &'static str,
    },
    #[error("the BPF object has no {0}: it does not match this loader")]
    Missing(&'static str),
    #[error("the probe reads x86-64 syscall registers and does not support {0} yet")]
    Arch(&'static str),
    #[error(
        "cannot read task_struct.tgid from the kernel's BTF ({path}): {error} (the probe needs a kernel built with CONFIG_DEBUG_INFO_BTF)"
    )]
    Btf { path: &'static str, error: String },
    #[error("cannot count the possible CPUs: {0}")]
    Cpus(#[source] std::io::Error),
    #[error("BPF map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
}

impl Probe {
    /// Loads and attaches the probe and starts watching. Never fails: a probe the kernel refuses is
    /// returned with [`ProbeStatus::Unavailable`] and the reason. Must run inside a tokio runtime.
    pub fn start(options: ProbeOptions) -> Probe {
        let (closed_tx, _) = broadcast::channel(4096);
        let state = Mutex::new(State {
            targets: options.watch.clone(),
            watching: BTreeMap::new(),
            exited: Vec::new(),
            closed: ClosedStore::new(options.closed_capacity),
        });
        if !options.enabled {
            return Probe {
                inner: Arc::new(Inner {
                    status: ProbeStatus::Disabled,
                    maps: None,
                    state,
                    closed_tx,
                    _ebpf: None,
                }),
            };
        }
        let started = Instant::now();
        match load_and_attach() {
            Ok((ebpf, maps, ring, attachments)) => {
                let probe = Probe {
                    inner: Arc::new(Inner {
                        status: ProbeStatus::Attached {
                            attachments,
                            load_ms: started.elapsed().as_millis() as u64,
                        },
                        maps: Some(Mutex::new(maps)),
                        state,
                        closed_tx,
                        _ebpf: Some(Mutex::new(ebpf)),
                    }),
                };
                probe.resolve_targets();
                probe.spawn_reader(ring);
                probe.spawn_resolver();
                tracing::info!(
                    attachments,
                    load_ms = started.elapsed().as_millis() as u64,
                    "probe attached"
                );
                probe
            }
            Err(e) => {
                let reason = e.to_string();
                tracing::warn!(%reason, "probe unavailable; serving without it");
                Probe {
                    inner: Arc::new(Inner {
                        status: ProbeStatus::Unavailable { reason },
                        maps: None,
                        state,
                        closed_tx,
                        _ebpf: None,
                    }),
                }
            }
        }
    }

    /// Attached, disabled, or unavailable and why.
    pub fn status(&self) -> &ProbeStatus {
        &self.inner.status
    }

    /// Closed-fd records as they arrive (for joining with connection tables).
    pub fn subscribe_closed(&self) -> broadcast::Receiver<ClosedFd> {
        self.inner.closed_tx.subscribe()
    }

    /// Adds a watch target at run time.
    pub fn watch(&self, target: WatchTarget) {
        {
            let mut st = self.inner.state.lock();
            if !st.targets.contains(&target) {
                st.targets.push(target);
            }
        }
        self.resolve_targets();
    }

    /// Replaces the watch targets (a config reload); processes no longer targeted stop being
    /// counted, their totals kept as exited.
    pub fn set_targets(&self, targets: Vec<WatchTarget>) {
        self.inner.state.lock().targets = targets;
        self.resolve_targets();
    }

    /// PIDs currently watched.
    pub fn watched_pids(&self) -> Vec<u32> {
        self.inner.state.lock().watching.keys().copied().collect()
    }

    /// Live (not yet closed) fd records of `pid`: (fd, generation, is_socket, counts).
    pub fn live_fds(&self, pid: u32) -> Vec<(u32, u64, bool, FdCounts)> {
        let Some(maps) = &self.inner.maps else {
            return Vec::new();
        };
        let maps = maps.lock();
        let mut records = match maps.watched.get(&pid, 0) {
            Ok(index) => maps.fd_table.live(index, 0..=u32::MAX),
            Err(_) => Vec::new(),
        };
        records.extend(
            maps.fd_records
                .iter()
                .filter_map(|r| r.ok())
                .filter(|(k, _)| k.tgid == pid)
                .map(|(k, r)| (k.fd, r)),
        );
        records
            .into_iter()
            .map(|(fd, r)| {
                (
                    fd,
                    r.info.generation,
                    r.info.flags & fd_flags::SOCKET != 0,
                    FdCounts::from_raw(&r.counts),
                )
            })
            .collect()
    }

    /// The last closed fds, newest first, at most `limit`.
    pub fn closed(&self, limit: usize) -> Vec<ClosedFd> {
        self.inner
            .state
            .lock()
            .closed
            .iter()
            .rev()
            .take(limit)
            .cloned()
            .collect()
    }

    /// Totals per process, loss counters and status.
    pub fn snapshot(&self) -> Snapshot {
        let mut processes = Vec::new();
        let mut health = ProbeHealth::default();
        let st = self.inner.state.lock();
        health.closed_evicted = st.closed.evicted;
        if let Some(maps) = &self.inner.maps {
            let maps = maps.lock();
            for (pid, comm) in &st.watching {
                let Ok(index) = maps.watched.get(pid, 0) else {
                    continue;
                };
                let mut p = read_totals(&maps, *pid, index);
                p.comm = comm.clone();
                p.alive = true;
                processes.push(p);
            }
            let stat_at = |i| maps.stats.get(&i, 0).unwrap_or(0);
            health.events_lost = stat_at(stat::EVENTS_LOST);
            health.fd_records_lost = stat_at(stat::FD_RECORDS_LOST);
        }
        processes.extend(st.exited.iter().cloned());
        Snapshot {
            status: self.inner.status.clone(),
            processes,
            health,
        }
    }

    /// Resolves targets to PIDs, starts watching new ones, stops watching dead or untargeted ones.
    fn resolve_targets(&self) {
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
    }

    fn spawn_reader(&self, ring: RingBuf<MapData>) {
        let probe = self.clone();
        tokio::spawn(async move {
            // SAFETY: the ring buffer owns its fd and the AsyncFd owns the ring buffer, so the fd
            // stays open for as long as it is registered.
            let mut fd = match unsafe { AsyncFd::register(ring) } {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::error!(error = %e, "probe ring buffer cannot be polled");
                    return;
                }
            };
            loop {
                let mut guard = match fd.readable_mut().await {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::error!(error = %e, "probe ring buffer poll failed");
                        return;
                    }
                };
                let ring = guard.get_inner_mut();
                let mut batch = Vec::new();
                while let Some(item) = ring.next() {
                    if item.len() >= size_of::<Event>() {
                        // SAFETY: the kernel wrote exactly one Event; read_unaligned copes with
                        // the ring's 8-byte alignment.
                        batch.push(unsafe {
                            std::ptr::read_unaligned(item.as_ptr() as *const Event)
                        });
                    }
                }
                guard.clear_ready();
                for ev in batch {
                    probe.handle_event(ev);
                }
            }
        });
    }

    fn spawn_resolver(&self) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RESOLVE_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Probe { inner }.resolve_targets();
            }
        });
    }

    fn handle_event(&self, ev: Event) {
        match ev.event {
            event::FD_CLOSED => {
                let r = ClosedFd::new(
                    ev.tgid,
                    ev.fd,
                    ev.record.info.generation,
                    ev.record.info.flags,
                    FdCounts::from_raw(&ev.record.counts),
                );
                self.inner.state.lock().closed.push(r.clone());
                let _ = self.inner.closed_tx.send(r);
            }
            event::CLOSE_RANGE => {
                let Some(maps) = &self.inner.maps else { return };
                let closed = {
                    let mut maps = maps.lock();
                    let index = maps.watched.get(&ev.tgid, 0).ok();
                    take_records(&mut maps, ev.tgid, index, ev.fd..=ev.fd_last)
                };
                self.push_closed(closed);
            }
            event::PROCESS_EXIT => {
                let Some(maps) = &self.inner.maps else { return };
                let mut st = self.inner.state.lock();
                if let Some(comm) = st.watching.remove(&ev.tgid) {
                    let closed = retire(&mut maps.lock(), ev.tgid, comm, &mut st);
                    drop(st);
                    drop_closed(&self.inner.closed_tx, closed);
                }
            }
            _ => {}
        }
    }

    fn push_closed(&self, closed: Vec<ClosedFd>) {
        let mut st = self.inner.state.lock();
        for r in &closed {
            st.closed.push(r.clone());
        }
        drop(st);
        drop_closed(&self.inner.closed_tx, closed);
    }
}

fn drop_closed(tx: &broadcast::Sender<ClosedFd>, closed: Vec<ClosedFd>) {
    for r in closed {
        let _ = tx.send(r);
    }
}

/// Stops counting `pid`: its open fds become closed records, its totals are kept as exited.
fn retire(maps: &mut Maps, pid: u32, comm: String, st: &mut State) -> Vec<ClosedFd> {
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

/// Turns the records of `tgid`'s fds in `fds` into closed records and forgets them, in the table
/// (when `index` has a range there) and in the hash.
fn take_records(
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
                FdCounts::from_raw(&r.counts),
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
                FdCounts::from_raw(&r.counts),
            ));
        }
    }
    out
}

fn read_totals(maps: &Maps, pid: u32, index: u32) -> ProcessTotals {
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
            }
        }
    }
    p
}

fn load_and_attach() -> Result<(Ebpf, Maps, RingBuf<MapData>, usize), StartError> {
    // The exit programs read syscall arguments at x86-64 `pt_regs` offsets.
    if !cfg!(target_arch = "x86_64") {
        return Err(StartError::Arch(std::env::consts::ARCH));
    }
    let btf_error = |e: &dyn std::fmt::Display| StartError::Btf {
        path: btf::VMLINUX,
        error: e.to_string(),
    };
    let tgid_offset = std::fs::read(btf::VMLINUX)
        .map_err(|e| btf_error(&e))
        .and_then(|b| btf::member_offset(&b, "task_struct", "tgid").map_err(|e| btf_error(&e)))?;
    let mut ebpf = EbpfLoader::new()
        .override_global("TGID_OFFSET", &tgid_offset, true)
        .load(OBJECT)
        .map_err(StartError::Load)?;
    let mut attachments = 0;
    for (program, category, name) in ATTACHMENTS {
        let prog: &mut TracePoint = ebpf
            .program_mut(program)
            .ok_or(StartError::Missing("program"))?
            .try_into()
            .map_err(|_| StartError::Missing("tracepoint program"))?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| match e {
                ProgramError::LoadError {
                    io_error,
                    verifier_log,
                } => StartError::Verifier {
                    program: program.to_string(),
                    error: io_error.to_string(),
                    log: verifier_log.to_string(),
                },
                other => StartError::Verifier {
                    program: program.to_string(),
                    error: other.to_string(),
                    log: String::new(),
                },
            })?;
        }
        prog.attach(category, name).map_err(|e| {
            let error = e.to_string();
            let hint = if error.contains("tracefs") || error.contains("ermission") {
                " (tracefs at /sys/kernel/tracing must be mounted and readable: mount it with `mount -t tracefs nodev /sys/kernel/tracing`; it is mode 0700, so a non-root service needs CAP_DAC_READ_SEARCH)"
            } else {
                ""
            };
            StartError::Attach {
                program: program.to_string(),
                category: category.to_string(),
                name: name.to_string(),
                error,
                hint,
            }
        })?;
        attachments += 1;
    }
    let take =
        |ebpf: &mut Ebpf, name: &'static str| ebpf.take_map(name).ok_or(StartError::Missing(name));
    let maps = Maps {
        watched: HashMap::try_from(take(&mut ebpf, "WATCHED")?)
            .map_err(|e| StartError::Map("WATCHED", e))?,
        watch_filter: Array::try_from(take(&mut ebpf, "WATCH_FILTER")?)
            .map_err(|e| StartError::Map("WATCH_FILTER", e))?,
        fd_info: HashMap::try_from(take(&mut ebpf, "FD_INFO")?)
            .map_err(|e| StartError::Map("FD_INFO", e))?,
        fd_table: FdTable::new(take(&mut ebpf, "FD_TABLE")?)
            .map_err(|e| StartError::Map("FD_TABLE", e))?,
        fd_records: HashMap::try_from(take(&mut ebpf, "FD_RECORDS")?)
            .map_err(|e| StartError::Map("FD_RECORDS", e))?,
        totals: PerCpuArray::try_from(take(&mut ebpf, "TOTALS")?)
            .map_err(|e| StartError::Map("TOTALS", e))?,
        stats: Array::try_from(take(&mut ebpf, "STATS")?)
            .map_err(|e| StartError::Map("STATS", e))?,
        free_indexes: (0..MAX_WATCHED).collect(),
        cpus: aya::util::nr_cpus().map_err(|(_, e)| StartError::Cpus(e))?,
    };
    let ring =
        RingBuf::try_from(take(&mut ebpf, "EVENTS")?).map_err(|e| StartError::Map("EVENTS", e))?;
    Ok((ebpf, maps, ring, attachments))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WatchTarget;
    use std::os::fd::AsRawFd;
    use zerocache_probe_common::{FAST_FDS, SyscallCounts, kind};

    /// A program run on one thread can add to an fd's slot just after another thread's close
    /// zeroed it, leaving counts without `LIVE`. The next fd with that number must still start from
    /// zero: this plants such a slot and expects exactly the one write made afterwards. Needs root.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slot_left_with_counts_after_a_close_starts_from_zero() {
        let probe = Probe::start(ProbeOptions {
            enabled: true,
            watch: vec![WatchTarget::SelfProcess],
            closed_capacity: 10,
        });
        assert!(probe.status().is_attached(), "{:?}", probe.status());
        let pid = std::process::id();
        let file = tempfile::tempfile().expect("tempfile");
        let fd = file.as_raw_fd() as u32;
        assert!(fd < FAST_FDS);
        {
            let maps = probe.inner.maps.as_ref().expect("maps");
            let mut maps = maps.lock();
            let index = maps.watched.get(&pid, 0).expect("watched");
            assert!(index < FAST_WATCHED, "self gets a fast index");
            let mut stale = FdRecord::default();
            stale.counts[kind::WRITE as usize] = SyscallCounts {
                calls: 7,
                bytes: 7000,
                ..SyscallCounts::default()
            };
            maps.fd_table.set(index, fd, stale).expect("plant");
        }
        let bytes = [0u8; 123];
        // SAFETY: a valid fd and buffer.
        let n = unsafe { libc::write(file.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, 123);
        let live = probe.live_fds(pid);
        let (_, _, _, counts) = live.iter().find(|r| r.0 == fd).expect("record");
        let w = &counts.by_kind[kind::WRITE as usize];
        assert_eq!((w.calls, w.bytes), (1, 123));
    }
}
