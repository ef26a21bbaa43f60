//! Copy-loop detection: file bytes read into user space and then written to a socket, the pattern
//! of a server that lost zero-copy (a `read`/`write` loop where `sendfile` would do).
//!
//! Per watched process (tgid), `PENDING` holds the bytes read from regular files on real
//! filesystems that no socket write has matched yet. A copying write to a socket takes
//! `min(pending, written)` from it, and those are the socket's copy-loop bytes. Pending bytes
//! decay all at once: after [`PENDING_TTL_NS`] without a file read they are dropped, so a file read
//! long ago does not make an unrelated generated response look like a copy loop.
//!
//! Classifying the fd of a read: this kernel has syscall tracepoints, BTF and no kprobes, and Rust
//! BPF has no CO-RE relocations. So the loader reads the offsets of
//! `task_struct.files → files_struct.fdt → fdtable.{max_fds, fd} → file.f_inode → inode.{i_mode,
//! i_sb} → super_block.s_magic` from the running kernel's BTF and hands them over as frozen
//! `.rodata` constants ("CO-RE by hand"); the program follows them with `bpf_probe_read_kernel`,
//! which faults safely on a pointer that changed under it (another thread closing the fd). procfs,
//! sysfs, cgroupfs and the other pseudo filesystems hold S_ISREG files too, which runtimes read
//! periodically (the JVM and Go read /proc and cgroup files): they are excluded by superblock
//! magic. The read programs are attached only while copy-loop detection is on for some watched
//! process; the cost to everyone else is then one early return per read.

use crate::programs::{
    add, current_task, reg_at, ret, table_slot, tgid_of, totals, user_regs, watch_index,
};
use aya_ebpf::{
    Global,
    helpers::{bpf_probe_read_kernel, generated::bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::Array,
    programs::TracePointContext,
};
use zerocache_probe_common::{FD_CLASS_OTHER, MAX_WATCHED, PENDING_TTL_NS, Pending, fd_flags};

/// Offsets of the members the fd walk follows, from the running kernel's BTF (see the module doc).
#[unsafe(no_mangle)]
static TASK_FILES: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FILES_FDT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FDT_MAX_FDS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FDT_FD: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FILE_INODE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static INODE_MODE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static INODE_SB: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SB_MAGIC: Global<u32> = Global::new(0);

/// Per watch index: file bytes read and not yet matched by a socket write.
#[map]
static PENDING: Array<Pending> = Array::with_max_entries(MAX_WATCHED, 0);

const S_IFMT: u16 = 0o170000;
const S_IFREG: u16 = 0o100000;

/// Superblock magics of filesystems whose regular files are not data a server sends: procfs,
/// sysfs, cgroup v1 and v2, debugfs, tracefs, securityfs, bpffs, configfs, pstore, efivarfs,
/// selinuxfs (include/uapi/linux/magic.h).
const PSEUDO: [u64; 12] = [
    0x9fa0,
    0x6265_6572,
    0x0027_e0eb,
    0x6367_7270,
    0x6462_6720,
    0x7472_6163,
    0x7363_6673,
    0xcafe_4a11,
    0x6265_6570,
    0x6165_676c,
    0xde5e_81e4,
    0xf97c_ff8c,
];

#[inline(always)]
fn read_at<T: Copy>(base: u64, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel copies from any kernel address and returns an error instead
    // of faulting.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T).ok() }
}

/// True when `fd` of `task` is a regular file on a real (not pseudo) filesystem.
#[inline(always)]
fn real_file(task: *const u8, fd: u32) -> bool {
    let Some(files) = read_at::<u64>(task as u64, TASK_FILES.load()) else {
        return false;
    };
    let Some(fdt) = read_at::<u64>(files, FILES_FDT.load()) else {
        return false;
    };
    let max_fds: u32 = read_at(fdt, FDT_MAX_FDS.load()).unwrap_or(0);
    if fd >= max_fds {
        return false;
    }
    let Some(array) = read_at::<u64>(fdt, FDT_FD.load()) else {
        return false;
    };
    let Some(file) = read_at::<u64>(array, fd.wrapping_mul(8)) else {
        return false;
    };
    if file == 0 {
        return false;
    }
    let Some(inode) = read_at::<u64>(file, FILE_INODE.load()) else {
        return false;
    };
    let mode: u16 = read_at(inode, INODE_MODE.load()).unwrap_or(0);
    if mode & S_IFMT != S_IFREG {
        return false;
    }
    let Some(sb) = read_at::<u64>(inode, INODE_SB.load()) else {
        return false;
    };
    let Some(magic) = read_at::<u64>(sb, SB_MAGIC.load()) else {
        return false;
    };
    let mut i = 0;
    while i < PSEUDO.len() {
        if magic == PSEUDO[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: takes no input.
    unsafe { bpf_ktime_get_ns() }
}

/// A read returned: if it read a real file of a watched process, its bytes become pending.
#[inline(always)]
fn read_exit(ctx: &TracePointContext) -> u32 {
    let task = current_task();
    let tgid = tgid_of(task);
    let Some(index) = watch_index(tgid) else {
        return 0;
    };
    let n = ret(ctx);
    if n <= 0 {
        return 0;
    }
    let fd = reg_at(user_regs(task), crate::programs::reg::ARG0) as u32;
    // A server's most frequent reads are of its sockets (requests): a socket already written to
    // has a live record marked SOCKET in the direct table, one inlined load, so it skips the walk.
    if let Some(slot) = table_slot(index, fd) {
        // SAFETY: a value of FD_TABLE, one word read.
        let flags = unsafe { (*slot).info.flags };
        let socket = fd_flags::LIVE | fd_flags::SOCKET;
        if flags & socket == socket {
            return 0;
        }
    }
    if !real_file(task, fd) {
        return 0;
    }
    let t = now();
    if let Some(p) = PENDING.get_ptr_mut(index) {
        // SAFETY: a value of this map. Plain stores of the reset and the time race with other
        // CPUs only in ways the rule tolerates (a reset or a time a moment off); the count itself
        // is an atomic add.
        unsafe {
            let stale = t.wrapping_sub((*p).last_read_ns) > PENDING_TTL_NS;
            if stale || ((*p).bytes as i64) < 0 {
                (*p).bytes = 0;
            }
            add(&raw mut (*p).bytes, n as u64);
            (*p).last_read_ns = t;
        }
    }
    if let Some(tot) = totals(index, FD_CLASS_OTHER) {
        // SAFETY: a per-CPU value: this CPU is its only writer while this program runs.
        unsafe {
            (*tot).file_read_calls += 1;
            (*tot).file_read_bytes += n as u64;
        }
    }
    0
}

/// `written` bytes went to a socket of watch index `index` through a copying syscall: takes the
/// copy-loop bytes among them from the pending file bytes and returns them.
#[inline(always)]
pub(crate) fn consume(index: u32, written: u64) -> u64 {
    let Some(p) = PENDING.get_ptr_mut(index) else {
        return 0;
    };
    // SAFETY: a value of this map; see `read_exit` about the races.
    unsafe {
        let pending = (*p).bytes as i64;
        if pending <= 0 {
            return 0;
        }
        if now().wrapping_sub((*p).last_read_ns) > PENDING_TTL_NS {
            (*p).bytes = 0;
            return 0;
        }
        let take = if (pending as u64) < written {
            pending as u64
        } else {
            written
        };
        add(&raw mut (*p).bytes, take.wrapping_neg());
        take
    }
}

#[tracepoint]
pub fn exit_read(ctx: TracePointContext) -> u32 {
    // read(fd, buf, count), pread64(fd, buf, count, pos), readv(fd, vec, vlen),
    // preadv(fd, vec, vlen, pos_l, pos_h), preadv2(..., flags): the fd is always the first.
    read_exit(&ctx)
}
