//! fd lifecycle: creation (accept, socket) hands out generation numbers, destruction (close,
//! dup2/dup3 over an fd, close_range, process exit) flushes a record's final totals to user space
//! through the ring buffer and forgets it, so a reused fd number starts from zero. Also the
//! `ACCEPTED` events of watch mode and the io_uring_enter count.

use crate::programs::{
    ARG0, ARG1, EVENTS, FD_INFO, FD_RECORDS, GENERATION, GROUP_DEAD, RET, SWITCHES, arg, bump_stat,
    current_task, current_tgid, field, table_slot, tgid_of, totals, watch_index, watched,
};
use aya_ebpf::{
    Global,
    helpers::{bpf_probe_read_kernel, generated::bpf_get_smp_processor_id},
    macros::tracepoint,
    programs::TracePointContext,
};
use zerocache_probe_common::{
    Event, FD_CLASS_OTHER, FdInfo, FdKey, FdRecord, event, exit_mode, fd_flags, stat, switch,
};

/// Emits the final record of (tgid, fd) and forgets the fd. Accepted connections get an event even
/// when nothing was written to them, so user space can pair every close with its connection.
#[inline(always)]
fn flush(tgid: u32, index: u32, fd: u32) {
    let key = FdKey { tgid, fd };
    let slot = table_slot(index, fd);
    let record = match slot {
        // SAFETY: a live map value, read once.
        Some(p) if unsafe { (*p).info.flags } & fd_flags::LIVE != 0 => Some(p as *const FdRecord),
        Some(_) => None,
        None => FD_RECORDS.get_ptr(key),
    };
    let info = FD_INFO.get_ptr(key);
    let accepted = match info {
        // SAFETY: a live map value, read once.
        Some(i) => (unsafe { (*i).flags }) & fd_flags::ACCEPTED != 0,
        None => false,
    };
    if record.is_some() || accepted {
        match EVENTS.reserve::<Event>(0) {
            Some(mut entry) => {
                let e = entry.as_mut_ptr();
                // SAFETY: the reserved entry is exactly one Event and every byte is written;
                // record and info point at live map values.
                unsafe {
                    match (record, info) {
                        (Some(r), _) => core::ptr::copy_nonoverlapping(r, &raw mut (*e).record, 1),
                        (None, Some(i)) => {
                            core::ptr::write_bytes(&raw mut (*e).record, 0, 1);
                            core::ptr::copy_nonoverlapping(i, &raw mut (*e).record.info, 1);
                        }
                        (None, None) => core::ptr::write_bytes(&raw mut (*e).record, 0, 1),
                    }
                    (*e).event = event::FD_CLOSED;
                    (*e).tgid = tgid;
                    (*e).fd = fd;
                    (*e).fd_last = fd;
                }
                entry.submit(0);
            }
            None => bump_stat(stat::EVENTS_LOST),
        }
    }
    match (record, slot) {
        // SAFETY: the slot is a live map value; zeroing it clears LIVE, so the fd number starts
        // from zero when it is reused.
        (Some(_), Some(p)) => unsafe { core::ptr::write_bytes(p, 0, 1) },
        (Some(_), None) => {
            let _ = FD_RECORDS.remove(key);
        }
        _ => {}
    }
    if info.is_some() {
        let _ = FD_INFO.remove(key);
    }
}

#[inline(always)]
fn lifecycle_event(kind_: u32, tgid: u32, fd: u32, fd_last: u32) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            let e = entry.as_mut_ptr();
            // SAFETY: the reserved entry is exactly one Event; every byte is written.
            unsafe {
                core::ptr::write_bytes(e, 0, 1);
                (*e).event = kind_;
                (*e).tgid = tgid;
                (*e).fd = fd;
                (*e).fd_last = fd_last;
            }
            entry.submit(0);
        }
        None => bump_stat(stat::EVENTS_LOST),
    }
}

#[inline(always)]
fn created(ret: i64, flags: u32) -> u32 {
    let tgid = current_tgid();
    let Some(index) = watch_index(tgid) else {
        return 0;
    };
    if ret < 0 {
        return 0;
    }
    let fd = ret as u32;
    // A record still here means we missed this number's close (it predates the watch): close it.
    flush(tgid, index, fd);
    let generation = match GENERATION.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array: no other writer while we run. The CPU number
        // in the top bits makes the value unique across CPUs without a fetch-and-add, which the
        // generic BPF CPU target lacks.
        Some(p) => unsafe {
            *p += 1;
            ((bpf_get_smp_processor_id() as u64 + 1) << 48) | *p
        },
        None => 0,
    };
    let info = FdInfo {
        generation,
        flags,
        _pad: 0,
    };
    let _ = FD_INFO.insert(FdKey { tgid, fd }, info, 0);
    if flags & fd_flags::ACCEPTED != 0
        && SWITCHES
            .get(switch::ACCEPT_EVENTS)
            .is_some_and(|on| *on != 0)
    {
        accepted_event(tgid, fd, info);
    }
    0
}

/// Tells user space a watched process accepted `fd` (watch mode reads its peer from /proc).
#[inline(always)]
fn accepted_event(tgid: u32, fd: u32, info: FdInfo) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            let e = entry.as_mut_ptr();
            // SAFETY: the reserved entry is exactly one Event; every byte is written.
            unsafe {
                core::ptr::write_bytes(e, 0, 1);
                (*e).event = event::ACCEPTED;
                (*e).tgid = tgid;
                (*e).fd = fd;
                (*e).fd_last = fd;
                (*e).record.info = info;
            }
            entry.submit(0);
        }
        None => bump_stat(stat::EVENTS_LOST),
    }
}

/// Attached to `sys_exit_accept` and `sys_exit_accept4`: a new inbound connection.
#[tracepoint]
pub fn exit_accept(ctx: TracePointContext) -> u32 {
    created(arg(&ctx, RET) as i64, fd_flags::SOCKET | fd_flags::ACCEPTED)
}

/// Attached to `sys_exit_socket`: an outbound (or listening) socket.
#[tracepoint]
pub fn exit_socket(ctx: TracePointContext) -> u32 {
    created(arg(&ctx, RET) as i64, fd_flags::SOCKET)
}

/// `close(fd)`: Linux releases the fd number even when close reports an error, so flush on enter.
#[tracepoint]
pub fn enter_close(ctx: TracePointContext) -> u32 {
    closing(arg(&ctx, ARG0) as u32)
}

#[inline(always)]
fn closing(fd: u32) -> u32 {
    let tgid = current_tgid();
    if let Some(index) = watch_index(tgid) {
        flush(tgid, index, fd);
    }
    0
}

/// `dup2(oldfd, newfd)` / `dup3(oldfd, newfd, flags)` close `newfd` first when it differs.
#[tracepoint]
pub fn enter_dup(ctx: TracePointContext) -> u32 {
    duping(arg(&ctx, ARG0) as u32, arg(&ctx, ARG1) as u32)
}

#[inline(always)]
fn duping(old: u32, new: u32) -> u32 {
    let tgid = current_tgid();
    if let Some(index) = watch_index(tgid)
        && old != new
    {
        flush(tgid, index, new);
    }
    0
}

/// `close_range(fd, max_fd, flags)`: a loop over the range would not verify, so user space flushes.
#[tracepoint]
pub fn enter_close_range(ctx: TracePointContext) -> u32 {
    closing_range(arg(&ctx, ARG0) as u32, arg(&ctx, ARG1) as u32)
}

#[inline(always)]
fn closing_range(first: u32, last: u32) -> u32 {
    let tgid = current_tgid();
    if watched(tgid) {
        lifecycle_event(event::CLOSE_RANGE, tgid, first, last);
    }
    0
}

/// `io_uring_enter`: counted so the dashboard can say there is I/O the probe cannot classify.
#[tracepoint]
pub fn enter_io_uring(_ctx: TracePointContext) -> u32 {
    uring()
}

#[inline(always)]
fn uring() -> u32 {
    if let Some(index) = watch_index(current_tgid())
        && let Some(t) = totals(index, FD_CLASS_OTHER)
    {
        // SAFETY: per-CPU value, this CPU is its only writer.
        unsafe { (*t).io_uring_enter += 1 };
    }
    0
}

/// How this kernel tells the last thread (a `zerocache_probe_common::exit_mode`), and the BTF
/// offsets of `task_struct.signal` and `signal_struct.live` for the fallback; set by the loader.
#[unsafe(no_mangle)]
static EXIT_MODE: Global<u32> = Global::new(exit_mode::RECORD);
#[unsafe(no_mangle)]
static TASK_SIGNAL: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SIGNAL_LIVE: Global<u32> = Global::new(0);

/// `sched/sched_process_exit` of a watched process's last thread: user space flushes its records.
#[tracepoint]
pub fn sched_exit(ctx: TracePointContext) -> u32 {
    let task = current_task();
    let tgid = tgid_of(task);
    if !watched(tgid) {
        return 0;
    }
    // EXIT_MODE is frozen before load: the verifier follows one branch only, so a kernel whose
    // record has no `group_dead` never sees the read past its record (which it refuses at attach).
    let last = if EXIT_MODE.load() == exit_mode::RECORD {
        field::<u8>(&ctx, GROUP_DEAD) != 0
    } else {
        // do_exit() has already decremented signal->live: 0 for the last thread. Two threads
        // exiting together can both read 0; user space's flush is idempotent.
        let signal = read_kernel::<u64>(task as u64 + TASK_SIGNAL.load() as u64);
        match signal {
            Some(s) if s != 0 => read_kernel::<i32>(s + SIGNAL_LIVE.load() as u64) == Some(0),
            _ => false,
        }
    };
    if last {
        lifecycle_event(event::PROCESS_EXIT, tgid, 0, 0);
    }
    0
}

#[inline(always)]
fn read_kernel<T: Copy>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel copies from any kernel address and returns an error instead
    // of faulting.
    unsafe { bpf_probe_read_kernel(addr as *const T).ok() }
}
