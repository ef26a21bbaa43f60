//! The BPF programs and maps. See the crate documentation for the design.

use aya_ebpf::{
    EbpfContext, Global,
    helpers::generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use core::intrinsics::{AtomicOrdering, atomic_xadd};
use zerocache_probe_common::{
    FAST_FDS, FAST_WATCHED, FD_CLASS_OTHER, FD_CLASS_SOCKET, FD_CLASSES, FdInfo, FdKey, FdRecord,
    MAX_WATCHED, ProcTotals, WATCH_FILTER_SHARED, WATCH_FILTER_SLOTS, WatchSlot, fd_flags, kind,
    stat, switch,
};

/// Offsets in the tracepoint records (see `zerocache_probe_common::layout`: the loader checks
/// each against the kernel's format before it attaches a program that reads it).
pub(crate) use zerocache_probe_common::layout::{
    SCHED_EXIT_GROUP_DEAD as GROUP_DEAD, SYSCALL_ARG0 as ARG0, SYSCALL_ARG1 as ARG1,
    SYSCALL_RET as RET,
};

/// Byte offsets in x86-64 `struct pt_regs` (UAPI `asm/ptrace.h`, so stable) of the registers that
/// carry syscall arguments 0 to 4. The kernel leaves them as user space set them until the syscall
/// returns (only `ax` takes the return value), so an exit program can read the arguments there and
/// no enter program has to run.
pub(crate) mod reg {
    pub const ARG0: usize = 112; // di
    pub const ARG2: usize = 96; // dx
    pub const ARG3: usize = 56; // r10 (rcx is clobbered by the syscall instruction)
    pub const ARG4: usize = 72; // r8
}
/// No byte count among the arguments (writev, sendmsg, sendmmsg).
const NO_LEN: usize = 0;

const EAGAIN: i64 = -11;

/// Byte offset of `tgid` in this kernel's `struct task_struct`, read from its BTF by the loader.
/// It lives in `.rodata`, which is frozen before the programs load, so the verifier treats it as a
/// constant and checks the load against BTF. Reading the tgid from the task saves the
/// `bpf_get_current_pid_tgid` call (~20 ns) on every run: output programs need the task anyway,
/// for its saved registers.
#[unsafe(no_mangle)]
static TGID_OFFSET: Global<u32> = Global::new(0);

/// tgid → watch index, for every watched process; filled and changed by user space.
#[map]
static WATCHED: HashMap<u32, u32> = HashMap::with_max_entries(MAX_WATCHED, 0);

/// `tgid & (slots - 1)` → the one watched tgid there and its watch index, a shared marker, or
/// nobody: checked on every traced syscall of every process, so it must be cheaper than a hash.
#[map]
static WATCH_FILTER: Array<WatchSlot> = Array::with_max_entries(WATCH_FILTER_SLOTS, 0);

/// Per fd: what created it, for fds created while watched or seeded by user space.
#[map]
pub(crate) static FD_INFO: HashMap<FdKey, FdInfo> = HashMap::with_max_entries(131072, 0);

/// Per fd of a fast watch index (below `FAST_WATCHED`) and below `FAST_FDS`: counters since the fd
/// was first written to, at `index * FAST_FDS + fd`, in use while `fd_flags::LIVE` is set. An array
/// slot costs one inlined bounds check where a hash lookup is a kernel call. Mmapable, so user space
/// reads the live records without a syscall per slot.
#[map]
static FD_TABLE: Array<FdRecord> =
    Array::with_max_entries(FAST_WATCHED * FAST_FDS, aya_ebpf::bindings::BPF_F_MMAPABLE);

/// Per fd, for the other watch indexes and fds: counters since the fd was first written to. Half
/// the size it had before `FD_TABLE` took the first watch indexes' records, so the two together
/// preallocate what the hash alone did (131,072 × 304 bytes, ~38 MiB).
#[map]
pub(crate) static FD_RECORDS: HashMap<FdKey, FdRecord> = HashMap::with_max_entries(65536, 0);

/// Per watch index and fd class, per CPU: running totals that never reset while the process is
/// watched. User space zeroes an index's entries before handing it to a new process.
#[map]
static TOTALS: PerCpuArray<ProcTotals> = PerCpuArray::with_max_entries(MAX_WATCHED * FD_CLASSES, 0);

/// Final records of closed fds and lifecycle events for user space. 4 MiB holds ~13,000 events.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(4 * 1024 * 1024, 0);

/// Index 0, per CPU: connections seen on this CPU, the low bits of the generation numbers it hands out.
#[map]
pub(crate) static GENERATION: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Run-time switches, indexed by [`switch`]; written by user space.
#[map]
pub(crate) static SWITCHES: Array<u32> = Array::with_max_entries(switch::COUNT, 0);

/// The probe's own health counters, indexed by [`stat`].
#[map]
static STATS: Array<u64> = Array::with_max_entries(stat::COUNT, 0);

#[inline(always)]
pub(crate) fn add(ptr: *mut u64, v: u64) {
    // SAFETY: ptr points into a map value the verifier has bounds-checked. BPF has atomic add but
    // no compare-and-swap, and this compiles to the former.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(ptr, v) };
}

#[inline(always)]
pub(crate) fn bump_stat(index: u32) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        add(p, 1);
    }
}

/// The running task, as the BTF pointer the verifier lets us load fields from.
#[inline(always)]
pub(crate) fn current_task() -> *const u8 {
    // SAFETY: takes no input; the running task outlives this program run.
    unsafe { bpf_get_current_task_btf() as *const u8 }
}

/// The task's thread-group id, what user space calls its PID.
#[inline(always)]
pub(crate) fn tgid_of(task: *const u8) -> u32 {
    // SAFETY: a BTF-typed load the verifier checks: TGID_OFFSET is a constant, the offset of the
    // `tgid` field in this kernel's task_struct.
    unsafe { core::ptr::read_volatile(task.add(TGID_OFFSET.load() as usize) as *const u32) }
}

#[inline(always)]
pub(crate) fn current_tgid() -> u32 {
    tgid_of(current_task())
}

/// The watch index of `tgid`, or None when nobody watches it (the common case: one array load).
#[inline(always)]
pub(crate) fn watch_index(tgid: u32) -> Option<u32> {
    let slot = WATCH_FILTER.get(tgid & (WATCH_FILTER_SLOTS - 1))?;
    if slot.tgid == tgid {
        Some(slot.index)
    } else if slot.tgid == WATCH_FILTER_SHARED {
        // SAFETY: a u32 value of this map, copied out at once.
        WATCHED.get_ptr(tgid).map(|p| unsafe { *p })
    } else {
        None
    }
}

#[inline(always)]
pub(crate) fn watched(tgid: u32) -> bool {
    watch_index(tgid).is_some()
}

/// A field of the tracepoint record, loaded straight from the context: the verifier allows direct
/// reads of a tracepoint record, which saves a `bpf_probe_read_kernel` helper call.
#[inline(always)]
pub(crate) fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: offsets are those of the tracepoint formats, inside the record and aligned for T.
    unsafe { core::ptr::read_volatile((ctx.as_ptr() as *const u8).add(offset) as *const T) }
}

/// A syscall argument (8 bytes from offset 16) or an exit record's return value.
#[inline(always)]
pub(crate) fn arg(ctx: &TracePointContext, offset: usize) -> u64 {
    field(ctx, offset)
}

/// This CPU's totals for watch index `index` and fd class `class`.
#[inline(always)]
pub(crate) fn totals(index: u32, class: u32) -> Option<*mut ProcTotals> {
    TOTALS.get_ptr_mut(index * FD_CLASSES + class)
}

/// The task's saved user registers: a BTF pointer the verifier lets us load from.
#[inline(always)]
pub(crate) fn user_regs(task: *const u8) -> *const u8 {
    // SAFETY: task is the running task's BTF pointer, which outlives this program run.
    unsafe { bpf_task_pt_regs(task as *mut _) as *const u8 }
}

#[inline(always)]
pub(crate) fn reg_at(regs: *const u8, offset: usize) -> u64 {
    // SAFETY: regs is the verifier-typed pt_regs pointer and offset one of the `reg` constants,
    // inside the struct; the verifier turns this load into a fault-tolerant one.
    unsafe { core::ptr::read_volatile(regs.add(offset) as *const u64) }
}

/// One output syscall returned: count it against its fd if the process is watched.
#[inline(always)]
fn output_exit(ctx: &TracePointContext, k: u32, fd_reg: usize, len_reg: usize) -> u32 {
    let task = current_task();
    let tgid = tgid_of(task);
    let Some(index) = watch_index(tgid) else {
        return 0;
    };
    let regs = user_regs(task);
    let fd = reg_at(regs, fd_reg) as u32;
    let requested = if len_reg == NO_LEN {
        0
    } else {
        reg_at(regs, len_reg)
    };
    count(tgid, index, fd, k, requested, ret(ctx));
    0
}

/// An exit record's return value.
#[inline(always)]
pub(crate) fn ret(ctx: &TracePointContext) -> i64 {
    arg(ctx, RET) as i64
}

#[tracepoint]
pub fn exit_sendfile(ctx: TracePointContext) -> u32 {
    // sendfile64(out_fd, in_fd, offset, count)
    output_exit(&ctx, kind::SENDFILE, reg::ARG0, reg::ARG3)
}

#[tracepoint]
pub fn exit_splice(ctx: TracePointContext) -> u32 {
    // splice(fd_in, off_in, fd_out, off_out, len, flags)
    output_exit(&ctx, kind::SPLICE, reg::ARG2, reg::ARG4)
}

#[tracepoint]
pub fn exit_write(ctx: TracePointContext) -> u32 {
    // write(fd, buf, count)
    output_exit(&ctx, kind::WRITE, reg::ARG0, reg::ARG2)
}

#[tracepoint]
pub fn exit_writev(ctx: TracePointContext) -> u32 {
    // writev(fd, vec, vlen): the byte count is behind a user pointer, so shorts are not counted.
    output_exit(&ctx, kind::WRITEV, reg::ARG0, NO_LEN)
}

#[tracepoint]
pub fn exit_sendto(ctx: TracePointContext) -> u32 {
    // sendto(fd, buff, len, flags, addr, addr_len)
    output_exit(&ctx, kind::SENDTO, reg::ARG0, reg::ARG2)
}

#[tracepoint]
pub fn exit_sendmsg(ctx: TracePointContext) -> u32 {
    // sendmsg(fd, msg, flags)
    output_exit(&ctx, kind::SENDMSG, reg::ARG0, NO_LEN)
}

#[tracepoint]
pub fn exit_sendmmsg(ctx: TracePointContext) -> u32 {
    // sendmmsg(fd, mmsg, vlen, flags)
    output_exit(&ctx, kind::SENDMMSG, reg::ARG0, NO_LEN)
}

/// Adds one completed output syscall to the fd's record and the process totals.
#[inline(always)]
fn count(tgid: u32, index: u32, fd: u32, k32: u32, requested: u64, ret: i64) {
    let k = k32 as usize;
    if k >= kind::COUNT {
        return;
    }
    let key = FdKey { tgid, fd };
    let record = match table_slot(index, fd) {
        Some(p) => {
            // SAFETY: a live map value. A slot without LIVE belongs to no open fd, but is not
            // necessarily zero: another thread's exit can add to it right after a close zeroed it.
            // So the first count of an fd clears the whole slot (once per fd, not per call).
            unsafe {
                if (*p).info.flags & fd_flags::LIVE == 0 {
                    core::ptr::write_bytes(p, 0, 1);
                    (*p).info = created_info(key);
                }
            }
            p
        }
        None => match FD_RECORDS.get_ptr_mut(key) {
            Some(p) => p,
            None => {
                let fresh = FdRecord {
                    info: created_info(key),
                    ..FdRecord::default()
                };
                if FD_RECORDS.insert(key, fresh, 0).is_err() {
                    bump_stat(stat::FD_RECORDS_LOST);
                }
                match FD_RECORDS.get_ptr_mut(key) {
                    Some(p) => p,
                    None => return,
                }
            }
        },
    };
    // SAFETY: record points at a live map value; k < kind::COUNT was checked above.
    let (counts, flags) = unsafe { (&raw mut (*record).counts[k], (*record).info.flags) };
    let (bytes, short, err, again) = classify(ret, requested, k32);
    // SAFETY: fields of the map value above. Atomic because two threads may write one fd; the
    // rare counters are only touched when non-zero.
    unsafe {
        add(&raw mut (*counts).calls, 1);
        if bytes != 0 {
            add(&raw mut (*counts).bytes, bytes);
        }
        if short != 0 {
            add(&raw mut (*counts).short, short);
        }
        if err != 0 {
            add(&raw mut (*counts).errors, err);
        }
        if again != 0 {
            add(&raw mut (*counts).eagain, again);
        }
    }
    let socket = flags & fd_flags::SOCKET != 0;
    let class = if socket {
        FD_CLASS_SOCKET
    } else {
        FD_CLASS_OTHER
    };
    // Copy-loop bytes: a copying send to a socket matched against the process's pending file
    // bytes (zero while detection is off: nothing adds to them then).
    let looped = if socket && bytes != 0 && k32 >= kind::FIRST_COPY_KIND {
        crate::copy_loop::consume(index, bytes)
    } else {
        0
    };
    if looped != 0 {
        // SAFETY: a field of the live map value above.
        unsafe { add(&raw mut (*record).copy_loop, looped) };
    }
    if let Some(t) = totals(index, class) {
        // SAFETY: a per-CPU value: this CPU is its only writer while this program runs.
        unsafe {
            let c = &mut (*t).counts[k];
            c.calls += 1;
            c.bytes += bytes;
            c.short += short;
            c.errors += err;
            c.eagain += again;
            (*t).copy_loop_bytes += looped;
        }
    }
}

/// The fd's record slot in `FD_TABLE`, if its watch index and number are in the table's range.
#[inline(always)]
pub(crate) fn table_slot(index: u32, fd: u32) -> Option<*mut FdRecord> {
    if index < FAST_WATCHED && fd < FAST_FDS {
        FD_TABLE.get_ptr_mut(index * FAST_FDS + fd)
    } else {
        None
    }
}

/// The info a new record of `key` starts with: what `FD_INFO` learned at its creation, if anything.
#[inline(always)]
fn created_info(key: FdKey) -> FdInfo {
    let mut info = match FD_INFO.get_ptr(key) {
        // SAFETY: a value of this map, copied.
        Some(p) => unsafe { *p },
        None => FdInfo::default(),
    };
    info.flags |= fd_flags::LIVE;
    info
}

/// (bytes, short, error, eagain) for one return value.
#[inline(always)]
fn classify(ret: i64, requested: u64, k: u32) -> (u64, u64, u64, u64) {
    if ret >= 0 {
        // sendmmsg returns a message count, not bytes.
        let bytes = if k == kind::SENDMMSG { 0 } else { ret as u64 };
        let short = (requested != 0 && (ret as u64) < requested) as u64;
        (bytes, short, 0, 0)
    } else if ret == EAGAIN {
        (0, 0, 0, 1)
    } else {
        (0, 0, 1, 0)
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
