//! The probe's handle: start-up (load, attach, or the reason it could not), the watch targets, and
//! the figures consumers read (live and closed fd records, per-process totals). Loading lives in
//! `loader`, the watch list in `watching`, the ring-buffer reader in `events`.

use crate::loader::load_and_attach;
use crate::maps::{Maps, read_totals};
use crate::model::{
    ClosedFd, CopyLoopStatus, FdCounts, ProbeHealth, ProbeStatus, ProcessTotals, Snapshot,
    WatchTarget,
};
use crate::read_side::ReadSide;
use crate::store::ClosedStore;
use aya::Ebpf;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use zerocache_probe_common::{fd_flags, stat};

/// How often `comm` targets are re-resolved and dead PIDs noticed.
pub(crate) const RESOLVE_EVERY: Duration = Duration::from_secs(1);
/// Exited processes whose totals are still shown.
pub(crate) const EXITED_KEPT: usize = 64;

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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct State {
    pub(crate) targets: Vec<WatchTarget>,
    /// Watched PIDs and their comm.
    pub(crate) watching: BTreeMap<u32, String>,
    pub(crate) exited: Vec<ProcessTotals>,
    pub(crate) closed: ClosedStore,
}

pub(crate) struct Inner {
    pub(crate) status: ProbeStatus,
    pub(crate) maps: Option<Mutex<Maps>>,
    /// FD_INFO alone, for [`Probe::generation`] on the accept path.
    pub(crate) fd_info: Option<
        Mutex<
            aya::maps::HashMap<
                aya::maps::MapData,
                zerocache_probe_common::FdKey,
                zerocache_probe_common::FdInfo,
            >,
        >,
    >,
    pub(crate) state: Mutex<State>,
    pub(crate) closed_tx: broadcast::Sender<ClosedFd>,
    /// The programs and their links; the read side's are attached and detached at run time.
    pub(crate) ebpf: Option<Mutex<Ebpf>>,
    /// Copy-loop detection: wanted or not, and the read programs' links while attached.
    pub(crate) read_side: Mutex<ReadSide>,
    /// Peers of accepted connections (watch mode).
    pub(crate) accepted: Mutex<crate::accepted::AcceptedPeers>,
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
                    fd_info: None,
                    state,
                    closed_tx,
                    ebpf: None,
                    read_side: Mutex::new(ReadSide::default()),
                    accepted: Mutex::default(),
                }),
            };
        }
        let started = Instant::now();
        match load_and_attach() {
            Ok(crate::loader::Loaded {
                ebpf,
                maps,
                fd_info_reader,
                ring,
                attachments,
                programs,
                read_side,
            }) => {
                let load_ms = started.elapsed().as_millis() as u64;
                let missing: Vec<String> = programs
                    .iter()
                    .filter(|p| !p.attached && p.role == crate::ProgramRole::Accounting)
                    .map(|p| {
                        format!(
                            "{} ({})",
                            p.program,
                            p.reason.as_deref().unwrap_or("not attached")
                        )
                    })
                    .collect();
                let status = if missing.is_empty() {
                    ProbeStatus::Attached {
                        attachments,
                        load_ms,
                        programs,
                    }
                } else {
                    let reason = format!(
                        "programs the proxy's accounting needs are missing, so its kernel counts are incomplete: {}",
                        missing.join("; ")
                    );
                    tracing::warn!(%reason, "probe partial");
                    ProbeStatus::Partial {
                        attachments,
                        load_ms,
                        programs,
                        reason,
                    }
                };
                let probe = Probe {
                    inner: Arc::new(Inner {
                        status,
                        maps: Some(Mutex::new(maps)),
                        fd_info: Some(Mutex::new(fd_info_reader)),
                        state,
                        closed_tx,
                        ebpf: Some(Mutex::new(ebpf)),
                        read_side: Mutex::new(read_side),
                        accepted: Mutex::default(),
                    }),
                };
                probe.resolve_targets();
                probe.spawn_reader(ring);
                probe.spawn_resolver();
                tracing::info!(attachments, load_ms, "probe attached");
                probe
            }
            Err(e) => {
                let reason = e.to_string();
                tracing::warn!(%reason, "probe unavailable; serving without it");
                Probe {
                    inner: Arc::new(Inner {
                        status: ProbeStatus::Unavailable { reason },
                        maps: None,
                        fd_info: None,
                        state,
                        closed_tx,
                        ebpf: None,
                        read_side: Mutex::new(ReadSide::default()),
                        accepted: Mutex::default(),
                    }),
                }
            }
        }
    }

    /// Turns copy-loop detection on or off for every watched process: while on and some process
    /// is watched, the read programs are attached (see `read_side`). Off by default.
    ///
    /// It also turns on `ACCEPTED` events, so the peer of every connection a watched process
    /// accepts is read at once ([`Probe::peer`]).
    pub fn set_copy_loop(&self, on: bool) {
        self.inner.read_side.lock().wanted = on;
        if let Some(maps) = &self.inner.maps
            && let Err(e) = maps.lock().switches.set(
                zerocache_probe_common::switch::ACCEPT_EVENTS,
                on as u32,
                0,
            )
        {
            tracing::warn!(error = %e, "cannot switch accept events");
        }
        self.sync_read_side();
    }

    /// Copy-loop detection's state: wanted, attached, and why not if it cannot be.
    pub fn copy_loop(&self) -> CopyLoopStatus {
        let rs = self.inner.read_side.lock();
        CopyLoopStatus {
            wanted: rs.wanted,
            attached: rs.attached(),
            error: rs.error.clone(),
        }
    }

    /// Attaches or detaches the read programs to match what is wanted and watched.
    pub(crate) fn sync_read_side(&self) {
        let Some(ebpf) = &self.inner.ebpf else {
            return;
        };
        let any = !self.inner.state.lock().watching.is_empty();
        let mut rs = self.inner.read_side.lock();
        let on = rs.wanted && any;
        rs.sync(&mut ebpf.lock(), on);
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

    /// The generation the kernel gave the socket now on `fd` of `pid` when it was created
    /// (accept or socket); none for an fd the probe did not see created, or without the probe.
    /// One map lookup, under a lock of its own (not the one a walk of every fd record holds):
    /// cheap enough for every accepted connection.
    pub fn generation(&self, pid: u32, fd: u32) -> Option<u64> {
        let info = self
            .inner
            .fd_info
            .as_ref()?
            .lock()
            .get(&zerocache_probe_common::FdKey { tgid: pid, fd }, 0)
            .ok()?;
        Some(info.generation)
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
                    FdCounts::from_record(&r),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WatchTarget;
    use std::os::fd::AsRawFd;
    use zerocache_probe_common::{FAST_FDS, FAST_WATCHED, FdRecord, SyscallCounts, kind};

    /// `proxy/tests/it/support/require.rs`'s rule for this crate-internal test (that file cannot be
    /// included into a module nested in `src/`): go on as root; otherwise print why the test was
    /// skipped, or fail under `ZEROCACHE_REQUIRE_PRIVILEGED=1`.
    mod require {
        pub(super) fn root(why: &str) -> bool {
            // The effective uid, from procfs: no unsafe geteuid for a test's gate.
            let euid = std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_string))
                });
            if euid.as_deref() == Some("0") {
                return true;
            }
            let msg = format!("needs root ({why})");
            if std::env::var("ZEROCACHE_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") {
                panic!("{msg}");
            }
            use std::io::Write;
            let name = std::thread::current().name().unwrap_or("?").to_string();
            let _ = writeln!(std::io::stderr().lock(), "skipped {name}: {msg}");
            false
        }
    }

    /// A program run on one thread can add to an fd's slot just after another thread's close
    /// zeroed it, leaving counts without `LIVE`. The next fd with that number must still start from
    /// zero: this plants such a slot and expects exactly the one write made afterwards. Needs root.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slot_left_with_counts_after_a_close_starts_from_zero() {
        if !require::root("loads the eBPF probe") {
            return;
        }
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

    /// No kernel layout is taken on faith: every record field a program reads is where this
    /// kernel's tracepoint format puts it (read here with a plain text search, apart from the
    /// loader's parser), every program attaches, and `sched_exit` chose its variant by whether the
    /// record has `group_dead` (Linux 6.16 on) or not (the `signal->live` fallback). Run on every
    /// kernel of the VM matrix (`cargo xtask vm-test`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_record_read_matches_this_kernels_tracepoint_formats() {
        if !require::root("reads tracefs and loads the eBPF probe") {
            return;
        }
        let format = |tp: &str| {
            std::fs::read_to_string(format!("{}/events/{tp}/format", crate::tracefs::TRACEFS))
                .unwrap_or_else(|e| panic!("{tp}: {e}"))
        };
        let mut checked = 0;
        for spec in crate::loader::PROGRAMS {
            for (category, name) in spec.tracepoints {
                let text = format(&format!("{category}/{name}"));
                for (field, offset, size) in spec.reads {
                    let line = text
                        .lines()
                        .find(|l| l.contains(&format!(" {field};")))
                        .unwrap_or_else(|| panic!("{category}/{name} has no {field}:\n{text}"));
                    assert!(
                        line.contains(&format!("offset:{offset};"))
                            && line.contains(&format!("size:{size};")),
                        "{category}/{name}: {field} read at {offset} ({size} bytes), format says {line}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 17, "record reads checked");
        let exit = format("sched/sched_process_exit");
        let has_group_dead = exit.contains("bool group_dead;\toffset:32;\tsize:1;");
        let probe = Probe::start(ProbeOptions {
            enabled: true,
            watch: vec![WatchTarget::SelfProcess],
            closed_capacity: 10,
        });
        let status = probe.status();
        assert!(status.is_attached(), "{status:?}");
        let missing: Vec<&str> = status
            .programs()
            .iter()
            .filter(|p| !p.attached)
            .map(|p| p.program.as_str())
            .collect();
        assert_eq!(missing, Vec::<&str>::new(), "{status:?}");
        assert_eq!(status.programs().len(), crate::loader::PROGRAMS.len());
        let sched = status
            .programs()
            .iter()
            .find(|p| p.program == "sched_exit")
            .expect("sched_exit");
        let want = if has_group_dead {
            "group_dead in the record"
        } else {
            "task->signal->live (the record has no group_dead)"
        };
        assert_eq!(sched.variant.as_deref(), Some(want));
    }

    /// The floor, on whatever kernel runs this: where the kernel's BTF lists both helpers the
    /// probe calls, it attaches; where it does not (5.10 in the VM matrix), it is unavailable
    /// with one sentence naming this kernel's release, the minimum and the missing helper, never
    /// a verifier log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_floor_is_named_with_the_kernel_or_the_probe_attaches() {
        if !require::root("loads the eBPF probe") {
            return;
        }
        let vmlinux = std::fs::read(crate::btf::VMLINUX).expect("this kernel publishes BTF");
        let above = crate::kernel::check_floor(&vmlinux).is_ok();
        let probe = Probe::start(ProbeOptions {
            enabled: true,
            watch: vec![WatchTarget::SelfProcess],
            closed_capacity: 10,
        });
        match (above, probe.status()) {
            (true, status) => assert!(status.is_attached(), "{status:?}"),
            (false, ProbeStatus::Unavailable { reason }) => {
                let want = format!(
                    "kernel {} is below the probe's minimum, Linux 5.15: it lacks the BPF helper bpf_",
                    crate::kernel::release()
                );
                assert!(reason.starts_with(&want), "{reason}");
                assert!(!reason.contains("verifier"), "{reason}");
            }
            (false, other) => panic!("below the floor but {other:?}"),
        }
    }
}
