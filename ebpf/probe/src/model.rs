//! The probe's public data model: what the dashboard and the proxy read. Plain serialisable
//! structs, independent of aya, so consumers never touch BPF maps.

use serde::Serialize;
use zerocache_probe_common::{FdRecord, SyscallCounts, fd_flags, kind};

/// A process to watch, as written in `probe.watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchTarget {
    /// The process running the probe.
    SelfProcess,
    /// One PID.
    Pid(u32),
    /// Every process whose `comm` (as in /proc/PID/comm) equals this, re-resolved periodically.
    Comm(String),
}

/// Whether the probe is counting, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProbeStatus {
    /// Every program the proxy's own accounting needs is attached (others may be missing: see
    /// `programs`).
    Attached {
        /// Number of tracepoint attachments.
        attachments: usize,
        /// Time taken to load, verify and attach, in milliseconds.
        load_ms: u64,
        /// Every program, attached or missing and why.
        programs: Vec<ProgramState>,
    },
    /// Loaded, but a program the proxy's accounting needs is missing: the probe counts what its
    /// other programs see, and its figures are not to be taken as the whole truth.
    Partial {
        /// Number of tracepoint attachments.
        attachments: usize,
        /// Time taken to load, verify and attach, in milliseconds.
        load_ms: u64,
        /// Every program, attached or missing and why.
        programs: Vec<ProgramState>,
        /// Which accounting programs are missing, in a line.
        reason: String,
    },
    /// Turned off in the configuration.
    Disabled,
    /// The kernel refused; the reason is meant for the operator.
    Unavailable {
        /// What failed and what would fix it.
        reason: String,
    },
}

impl ProbeStatus {
    /// True when every program the proxy's own accounting needs is attached: what
    /// `zerocache_probe_up` reports, so a partial probe never passes for a whole one.
    pub fn is_attached(&self) -> bool {
        matches!(self, ProbeStatus::Attached { .. })
    }

    /// The programs and their states; empty when nothing was loaded.
    pub fn programs(&self) -> &[ProgramState] {
        match self {
            ProbeStatus::Attached { programs, .. } | ProbeStatus::Partial { programs, .. } => {
                programs
            }
            ProbeStatus::Disabled | ProbeStatus::Unavailable { .. } => &[],
        }
    }
}

/// What a program is for, and so what its absence costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramRole {
    /// Output syscalls and the fd lifecycle: the per-connection counts themselves.
    Accounting,
    /// The exit of a watched process's last thread.
    ProcessExits,
    /// `io_uring_enter` calls, counted as I/O the probe cannot classify.
    IoUring,
    /// File reads for copy-loop detection (`zerocache watch`), attached only while it runs.
    CopyLoop,
}

impl ProgramRole {
    /// What is lost while a program of this role is missing, in an operator's words.
    pub fn cost(self) -> &'static str {
        match self {
            ProgramRole::Accounting => {
                "per-connection kernel counts are incomplete, so the proxy does not trust them (zerocache_probe_up 0)"
            }
            ProgramRole::ProcessExits => {
                "exits of watched processes are not seen at once: their records are flushed by the 1 s re-resolve of the watch list instead"
            }
            ProgramRole::IoUring => {
                "io_uring_enter calls are not counted, so I/O submitted through io_uring goes unmentioned"
            }
            ProgramRole::CopyLoop => "copy-loop detection is unavailable",
        }
    }
}

/// One BPF program: where it attaches, and whether it is attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProgramState {
    /// The program's name in the object (`exit_sendfile`).
    pub program: String,
    /// What it is for.
    pub role: ProgramRole,
    /// `category/name` of each tracepoint it attaches to.
    pub tracepoints: Vec<String>,
    /// Attached to every one of them.
    pub attached: bool,
    /// Why not, naming the kernel; `None` when attached, or (copy-loop programs) not wanted.
    pub reason: Option<String>,
    /// How it works on this kernel where there is a choice (`sched_exit`: which way it tells the
    /// last thread).
    pub variant: Option<String>,
}

/// Counters of one syscall kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindCounts {
    /// Completed calls.
    pub calls: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Calls that failed (other than EAGAIN).
    pub errors: u64,
    /// Calls that returned EAGAIN.
    pub eagain: u64,
    /// Calls that moved fewer bytes than asked.
    pub short: u64,
}

impl KindCounts {
    fn add(&mut self, c: &SyscallCounts) {
        self.calls += c.calls;
        self.bytes += c.bytes;
        self.errors += c.errors;
        self.eagain += c.eagain;
        self.short += c.short;
    }
}

/// Counters per syscall kind, indexed by [`kind`] (names in [`kind::NAMES`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FdCounts {
    /// Indexed by [`kind`].
    pub by_kind: [KindCounts; kind::COUNT],
    /// Copy-loop bytes: bytes of this socket's copying sends that matched file bytes the process
    /// had read just before (0 unless copy-loop detection is on; see `docs/watch.md`).
    pub copy_loop_bytes: u64,
}

impl FdCounts {
    pub(crate) fn from_record(r: &FdRecord) -> Self {
        let mut out = FdCounts::default();
        out.add_raw(&r.counts);
        out.copy_loop_bytes = r.copy_loop;
        out
    }

    pub(crate) fn add_raw(&mut self, raw: &[SyscallCounts; kind::COUNT]) {
        for (o, r) in self.by_kind.iter_mut().zip(raw.iter()) {
            o.add(r);
        }
    }

    /// Adds another set of counters to this one.
    pub fn add(&mut self, other: &FdCounts) {
        for (o, r) in self.by_kind.iter_mut().zip(other.by_kind.iter()) {
            o.calls += r.calls;
            o.bytes += r.bytes;
            o.errors += r.errors;
            o.eagain += r.eagain;
            o.short += r.short;
        }
        self.copy_loop_bytes += other.copy_loop_bytes;
    }

    /// Bytes through sendfile and splice.
    pub fn zero_copy_bytes(&self) -> u64 {
        self.by_kind[..kind::FIRST_COPY_KIND as usize]
            .iter()
            .map(|k| k.bytes)
            .sum()
    }

    /// Bytes through write, writev, sendto, sendmsg (sendmmsg's bytes are not known).
    pub fn copy_bytes(&self) -> u64 {
        self.by_kind[kind::FIRST_COPY_KIND as usize..]
            .iter()
            .map(|k| k.bytes)
            .sum()
    }

    /// Calls of every kind.
    pub fn calls(&self) -> u64 {
        self.by_kind.iter().map(|k| k.calls).sum()
    }
}

/// The final record of one closed file descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClosedFd {
    /// The process.
    pub pid: u32,
    /// The fd number (reused by the kernel; `generation` tells connections apart).
    pub fd: u32,
    /// Unique per fd creation seen by the probe; 0 when the fd predates the watch.
    pub generation: u64,
    /// Known to be a socket (created by socket/accept, or seen as one in /proc).
    pub socket: bool,
    /// An inbound connection (created by accept).
    pub accepted: bool,
    /// What was written to it.
    pub counts: FdCounts,
}

impl ClosedFd {
    pub(crate) fn new(pid: u32, fd: u32, generation: u64, flags: u32, counts: FdCounts) -> Self {
        ClosedFd {
            pid,
            fd,
            generation,
            socket: flags & fd_flags::SOCKET != 0,
            accepted: flags & fd_flags::ACCEPTED != 0,
            counts,
        }
    }
}

/// Totals of one watched process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessTotals {
    /// The process.
    pub pid: u32,
    /// Its `comm`.
    pub comm: String,
    /// Written to sockets.
    pub socket: FdCounts,
    /// Written to everything else (files, pipes, fds of unknown origin).
    pub other: FdCounts,
    /// `io_uring_enter` calls: I/O the probe cannot classify.
    pub io_uring_enter: u64,
    /// Successful reads of regular files on real filesystems (copy-loop detection on).
    pub file_read_calls: u64,
    /// Bytes those reads returned.
    pub file_read_bytes: u64,
    /// Socket bytes sent by copying syscalls that matched file bytes read just before: the
    /// bytes a copy loop moved where sendfile could have (0 unless copy-loop detection is on).
    pub copy_loop_bytes: u64,
    /// Still running.
    pub alive: bool,
}

/// The probe's own loss counters: never silent about what it missed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProbeHealth {
    /// Close events lost because the ring buffer was full.
    pub events_lost: u64,
    /// fd records not created because the map was full.
    pub fd_records_lost: u64,
    /// Closed records dropped from the bounded history (oldest first).
    pub closed_evicted: u64,
}

/// Everything the probe knows at one instant.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// Attached or not, and why.
    pub status: ProbeStatus,
    /// One entry per watched (or once watched) process.
    pub processes: Vec<ProcessTotals>,
    /// Loss counters.
    pub health: ProbeHealth,
}

/// Copy-loop detection's state, as the dashboard shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CopyLoopStatus {
    /// Turned on (`zerocache watch` does).
    pub wanted: bool,
    /// The read programs are attached (wanted and some process is watched).
    pub attached: bool,
    /// Why detection cannot work here, if it cannot.
    pub error: Option<String>,
}
