//! The records the zerocache probe shares between its kernel programs and user space.
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of pointers, because the same bytes are written
//! by BPF programs into maps and ring buffers and read back by the loader. Sizes are pinned by the
//! tests at the bottom: a field added on one side and not the other would otherwise show up as
//! silently shifted counters rather than a build error.
#![no_std]

/// Output syscalls the probe classifies, as indices into [`FdRecord::counts`].
///
/// The zero-copy ones come first so that "is this zero-copy?" is `kind < FIRST_COPY_KIND`.
pub mod kind {
    /// `sendfile64(2)`: file pages to a socket without a user-space copy.
    pub const SENDFILE: u32 = 0;
    /// `splice(2)`: pipe pages moved without a user-space copy.
    pub const SPLICE: u32 = 1;
    /// `write(2)`: copies from a user buffer.
    pub const WRITE: u32 = 2;
    /// `writev(2)`: copies from user buffers.
    pub const WRITEV: u32 = 3;
    /// `sendto(2)` (and `send(2)`, which the kernel implements as sendto).
    pub const SENDTO: u32 = 4;
    /// `sendmsg(2)`.
    pub const SENDMSG: u32 = 5;
    /// `sendmmsg(2)`: its return value is a message count, so its bytes are not known here.
    pub const SENDMMSG: u32 = 6;
    /// Number of kinds; the length of the per-fd counter array.
    pub const COUNT: usize = 7;
    /// Kinds below this index are zero-copy paths.
    pub const FIRST_COPY_KIND: u32 = 2;
    // Checked at compile time: the zero-copy kinds are exactly those below FIRST_COPY_KIND.
    const _: () = assert!(SENDFILE < FIRST_COPY_KIND && SPLICE < FIRST_COPY_KIND);
    const _: () = assert!(WRITE >= FIRST_COPY_KIND);
    /// Names, in index order, as they appear in metrics labels.
    pub const NAMES: [&str; COUNT] = [
        "sendfile", "splice", "write", "writev", "sendto", "sendmsg", "sendmmsg",
    ];
}

/// Flags describing what an fd is, learned in the kernel from the syscall that created it.
pub mod fd_flags {
    /// Created by `socket(2)`, `accept(2)` or `accept4(2)`, or seeded as a socket by user space.
    pub const SOCKET: u32 = 1;
    /// Created by `accept`/`accept4`: an inbound connection.
    pub const ACCEPTED: u32 = 2;
    /// Set in an `FD_TABLE` record once the fd has been counted: the table's slots always exist,
    /// so this bit, not the presence of a hash entry, says the record is in use.
    pub const LIVE: u32 = 4;
}

/// Key of the per-fd maps: one open file descriptor of one process. 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FdKey {
    /// Thread-group id, what user space calls the PID.
    pub tgid: u32,
    /// The descriptor number, reused by the kernel after close.
    pub fd: u32,
}

/// What the kernel learned about an fd when it was created. 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdInfo {
    /// A number unique for the probe's lifetime, so a reused fd number is never mistaken for the
    /// connection that held it before. 0 for fds the probe did not see being created.
    pub generation: u64,
    /// [`fd_flags`] bits.
    pub flags: u32,
    /// Padding, always 0: BPF map values must have no uninitialised bytes.
    pub _pad: u32,
}

/// Counters for one syscall kind on one fd (or one process). 40 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallCounts {
    /// Completed calls, successful or not.
    pub calls: u64,
    /// Bytes transferred, summed from the positive return values.
    pub bytes: u64,
    /// Calls that returned an error other than EAGAIN.
    pub errors: u64,
    /// Calls that returned EAGAIN (a non-blocking socket with a full send buffer).
    pub eagain: u64,
    /// Successful calls that moved fewer bytes than asked (only where the request size is an
    /// argument: sendfile, splice, write, sendto).
    pub short: u64,
}

/// Everything counted on one fd between its creation (or first use) and its close. 304 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdRecord {
    /// The fd's [`FdInfo`] at the time it was first counted.
    pub info: FdInfo,
    /// Per [`kind`], indexed by kind.
    pub counts: [SyscallCounts; kind::COUNT],
    /// Copy-loop bytes: bytes written to this socket by a copying syscall while the process had
    /// file bytes pending (see [`Pending`]); only counted while copy-loop detection is on.
    pub copy_loop: u64,
}

/// Per-process totals keep sockets and everything else apart, so that log files and cache fills
/// never dilute a socket figure: the class of fds known to be sockets.
pub const FD_CLASS_SOCKET: u32 = 0;
/// The class of every other fd (files, pipes, fds of unknown origin).
pub const FD_CLASS_OTHER: u32 = 1;
/// Number of fd classes: the `TOTALS` array holds this many entries per watch index.
pub const FD_CLASSES: u32 = 2;

/// Processes watched at once. Each gets a watch index, and its totals live at
/// `TOTALS[index * FD_CLASSES + class]`: an array slot the verifier inlines, where a hash keyed by
/// (tgid, class) cost ~35 ns per counted syscall. 256 × 2 × 312 bytes = 156 KiB per CPU.
pub const MAX_WATCHED: u32 = 256;

/// Watch indexes below this keep their fd records in `FD_TABLE`, a direct array indexed by
/// `index * FAST_FDS + fd`; higher indexes (and fds from [`FAST_FDS`] up) use the `FD_RECORDS`
/// hash. Why: the verifier inlines an array lookup, while a hash lookup is a call into the kernel
/// that costs ~60 ns per counted syscall on this kind of machine (Safe-RET return thunks), a
/// quarter of a watched run. User space hands these indexes out first, so zerocache itself and
/// the first few processes an operator points the probe at get the fast path.
pub const FAST_WATCHED: u32 = 4;
/// fds per fast watch index: `FD_TABLE` holds 4 × 16,384 records × 304 bytes = 19 MiB.
pub const FAST_FDS: u32 = 16384;

/// Per-process totals, one per CPU in a per-CPU map, summed by user space. 312 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcTotals {
    /// Per [`kind`].
    pub counts: [SyscallCounts; kind::COUNT],
    /// `io_uring_enter(2)` calls: I/O submitted this way passes the syscall tracepoints unseen.
    pub io_uring_enter: u64,
    /// Successful reads (`read`, `pread64`, `readv`, `preadv`, `preadv2`) of regular files on
    /// real filesystems (class [`FD_CLASS_OTHER`] only; copy-loop detection on).
    pub file_read_calls: u64,
    /// Bytes those reads returned.
    pub file_read_bytes: u64,
    /// Copy-loop bytes written to sockets (class [`FD_CLASS_SOCKET`] only).
    pub copy_loop_bytes: u64,
}

/// Copy-loop state of one watched process (tgid, not thread: runtimes read files on one thread
/// and write sockets on another), at its watch index in `PENDING`. 16 bytes.
///
/// The rule: every byte a read returns from a regular file on a real filesystem is added to
/// `bytes`; every byte a copying syscall (write, writev, sendto, sendmsg) then sends to a socket
/// takes from it, and `min(pending, written)` are copy-loop bytes of that socket. Pending bytes
/// decay all at once: when no file read has happened for [`PENDING_TTL_NS`], they are dropped.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// File bytes read and not yet matched by socket writes. Updated with atomic adds from
    /// several CPUs; a race can leave it briefly below zero (as `i64`), which counts as zero.
    pub bytes: u64,
    /// `bpf_ktime_get_ns` of the process's last file read.
    pub last_read_ns: u64,
}

/// Pending file bytes older than this (no file read since) no longer match socket writes: 1 s.
pub const PENDING_TTL_NS: u64 = 1_000_000_000;

/// Ring-buffer event types, in [`Event::event`].
pub mod event {
    /// A counted fd was closed (close, dup2/dup3 over it, accept reusing a number we missed the
    /// close of); [`super::Event::record`] holds its final totals.
    pub const FD_CLOSED: u32 = 1;
    /// `close_range(fd, fd_last)`: user space flushes the counted fds in the range.
    pub const CLOSE_RANGE: u32 = 2;
    /// The last thread of a watched process exited: user space flushes all of its records.
    pub const PROCESS_EXIT: u32 = 3;
    /// A watched process accepted a connection (sent only while [`super::switch::ACCEPT_EVENTS`]
    /// is on): `record.info` holds its generation, so user space can read its peer at once.
    pub const ACCEPTED: u32 = 4;
}

/// Indices into the `SWITCHES` array map: run-time switches user space flips (a frozen global
/// cannot change after load).
pub mod switch {
    /// 1: send an [`super::event::ACCEPTED`] event for every connection a watched process
    /// accepts (watch mode, for peer addresses). 0 by default, so the proxy pays nothing.
    pub const ACCEPT_EVENTS: u32 = 0;
    /// Number of switches.
    pub const COUNT: u32 = 1;
}

/// One ring-buffer event. 320 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// An [`event`] constant.
    pub event: u32,
    /// The process.
    pub tgid: u32,
    /// The fd closed, or the first fd of a range.
    pub fd: u32,
    /// The last fd of a range (`close_range`), otherwise equal to `fd`.
    pub fd_last: u32,
    /// Final totals for [`event::FD_CLOSED`]; zero otherwise.
    pub record: FdRecord,
}

/// Slots of the `WATCH_FILTER` array: a direct-mapped filter in front of the `WATCHED` hash, so
/// the common case, a syscall of a process nobody watches, costs one array load and no hashing.
pub const WATCH_FILTER_SLOTS: u32 = 4096;
/// A [`WatchSlot::tgid`] meaning "several watched tgids share this slot: ask `WATCHED`".
pub const WATCH_FILTER_SHARED: u32 = u32::MAX;

/// One `WATCH_FILTER` slot: which tgid owns it and that process's watch index. 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchSlot {
    /// The only watched tgid in this slot, [`WATCH_FILTER_SHARED`], or 0 (nobody).
    pub tgid: u32,
    /// Its watch index (below [`MAX_WATCHED`]); for a shared slot the `WATCHED` hash has it.
    pub index: u32,
}

/// Where the programs read the tracepoint records: compiled into the load instructions (the
/// verifier refuses a context read at an offset held in a register), and checked by the loader
/// against each tracepoint's format in tracefs before it attaches a program, so a kernel whose
/// record differs gets that program refused with the reason instead of wrong numbers.
///
/// The syscall records (`trace_event_raw_sys_enter`/`_exit`) have been the same since Linux 3.x:
/// an 8-byte common header, `int __syscall_nr` at 8, then 8-byte arguments from 16 (enter) or
/// `long ret` at 16 (exit). `sched_process_exit` is not: `bool group_dead` at 32 exists only from
/// Linux 6.16, so the program has a second way to tell the process's last thread (see
/// [`exit_mode`]).
pub mod layout {
    /// Syscall enter records: argument 0 (`fd`, `oldfd`).
    pub const SYSCALL_ARG0: usize = 16;
    /// Syscall enter records: argument 1 (`newfd`, `max_fd`).
    pub const SYSCALL_ARG1: usize = 24;
    /// Syscall exit records: `ret`.
    pub const SYSCALL_RET: usize = 16;
    /// `sched_process_exit`: `group_dead`, where the kernel has it (Linux 6.16 and later).
    pub const SCHED_EXIT_GROUP_DEAD: usize = 32;
}

/// How `sched_exit` tells that the last thread of a process is leaving, chosen by the loader per
/// kernel and frozen into the object (`EXIT_MODE`); the verifier prunes the branch not taken, so
/// the record field is never read on a kernel whose record lacks it.
pub mod exit_mode {
    /// The record's `group_dead` field at [`super::layout::SCHED_EXIT_GROUP_DEAD`].
    pub const RECORD: u32 = 0;
    /// The exiting task's `signal->live`, read through BTF offsets: `do_exit()` decrements it
    /// before the tracepoint fires, so it is 0 for the last thread.
    pub const SIGNAL_LIVE: u32 = 1;
}

/// Indices into the `STATS` array map: the probe's own health counters.
pub mod stat {
    /// Ring-buffer events that could not be reserved (buffer full): lost close events.
    pub const EVENTS_LOST: u32 = 0;
    /// Per-fd records that could not be inserted (map full).
    pub const FD_RECORDS_LOST: u32 = 1;
    /// Number of stats.
    pub const COUNT: u32 = 2;
}

#[cfg(feature = "user")]
mod pod {
    // Each impl below: the type is #[repr(C)], Copy, made of integers only, with explicit
    // padding, so every byte pattern is a valid value and none is uninitialised.
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FdKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FdInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FdRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::WatchSlot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcTotals {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Event {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Pending {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_are_pinned() {
        assert_eq!(size_of::<FdKey>(), 8);
        assert_eq!(size_of::<FdInfo>(), 16);
        assert_eq!(size_of::<SyscallCounts>(), 40);
        assert_eq!(size_of::<FdRecord>(), 304);
        assert_eq!(size_of::<WatchSlot>(), 8);
        assert_eq!(size_of::<ProcTotals>(), 312);
        assert_eq!(size_of::<Event>(), 320);
        assert_eq!(size_of::<Pending>(), 16);
    }

    #[test]
    fn zero_copy_kinds_come_first() {
        assert_eq!(kind::NAMES[kind::SENDFILE as usize], "sendfile");
        assert_eq!(kind::NAMES[kind::SPLICE as usize], "splice");
    }
}
