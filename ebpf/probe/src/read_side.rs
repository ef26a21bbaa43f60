//! Copy-loop detection's read side: the `exit_read` program on the five file-read syscalls, and the
//! kernel struct offsets it needs.
//!
//! The programs are attached only while detection is wanted ([`crate::Probe::set_copy_loop`]) and
//! some process is watched: every `read` of every task on the machine runs them while they are
//! attached, so a probe that only watches zerocache itself (the proxy) never pays for them, and
//! an unwatched process pays one early return per read while they are.
//!
//! The offsets: Rust BPF has no CO-RE relocations, so the loader reads the members the program
//! follows from an fd to its superblock out of the running kernel's BTF and hands them to the
//! object as frozen globals before it loads (see `ebpf/kernel/src/copy_loop.rs`).

use crate::{btf, tracefs};
use aya::Ebpf;
use aya::programs::TracePoint;
use aya::programs::trace_point::TracePointLinkId;

/// The program and the syscalls it is attached to: every read that can bring file bytes into
/// user space through a file descriptor.
pub(crate) const PROGRAM: &str = "exit_read";
const TRACEPOINTS: [&str; 5] = [
    "sys_exit_read",
    "sys_exit_pread64",
    "sys_exit_readv",
    "sys_exit_preadv",
    "sys_exit_preadv2",
];

/// The one record field the program reads: the read's return value.
const RET: (&str, usize, usize) = ("ret", zerocache_probe_common::layout::SYSCALL_RET, 8);

/// (global in the BPF object, struct, member) for every offset the fd walk uses.
pub(crate) const OFFSETS: [(&str, &str, &str); 8] = [
    ("TASK_FILES", "task_struct", "files"),
    ("FILES_FDT", "files_struct", "fdt"),
    ("FDT_MAX_FDS", "fdtable", "max_fds"),
    ("FDT_FD", "fdtable", "fd"),
    ("FILE_INODE", "file", "f_inode"),
    ("INODE_MODE", "inode", "i_mode"),
    ("INODE_SB", "inode", "i_sb"),
    ("SB_MAGIC", "super_block", "s_magic"),
];

/// The offsets of [`OFFSETS`] in `data` (the kernel's BTF), in that order.
pub(crate) fn offsets(data: &[u8]) -> Result<[u32; 8], btf::BtfError> {
    let mut out = [0u32; 8];
    for (slot, (_, strukt, member)) in out.iter_mut().zip(OFFSETS) {
        *slot = btf::member_offset(data, strukt, member)?;
    }
    Ok(out)
}

/// Whether detection is wanted, and the read programs' links while they are attached.
#[derive(Default)]
pub(crate) struct ReadSide {
    /// Set by [`crate::Probe::set_copy_loop`].
    pub(crate) wanted: bool,
    links: Vec<TracePointLinkId>,
    /// Why the read programs could not be loaded or attached, if they could not.
    pub(crate) error: Option<String>,
}

impl ReadSide {
    /// True while the read programs are attached.
    pub(crate) fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches the read programs when `on` and they are not, detaches them when not `on`.
    pub(crate) fn sync(&mut self, ebpf: &mut Ebpf, on: bool) {
        if on == self.attached() {
            return;
        }
        let Some(prog) = ebpf.program_mut(PROGRAM) else {
            self.error = Some(format!("the BPF object has no program {PROGRAM}"));
            return;
        };
        let prog: &mut TracePoint = match prog.try_into() {
            Ok(p) => p,
            Err(e) => {
                self.error = Some(format!("{PROGRAM}: {e}"));
                return;
            }
        };
        if !on {
            for link in self.links.drain(..) {
                if let Err(e) = prog.detach(link) {
                    tracing::warn!(error = %e, "detaching a copy-loop read program failed");
                }
            }
            tracing::info!("copy-loop detection: read programs detached");
            return;
        }
        let formats = TRACEPOINTS.iter().try_for_each(|name| {
            let fields = tracefs::format("syscalls", name)?;
            tracefs::check(&fields, &format!("syscalls/{name}"), &[RET])
        });
        if let Err(e) = formats {
            tracing::warn!(error = %e, "copy-loop detection unavailable");
            self.error = Some(e);
            return;
        }
        if prog.fd().is_err()
            && let Err(e) = prog.load()
        {
            let e = crate::loader::rejected(PROGRAM, e);
            tracing::warn!(error = %e, "copy-loop detection unavailable");
            self.error = Some(e);
            return;
        }
        for name in TRACEPOINTS {
            match prog.attach("syscalls", name) {
                Ok(link) => self.links.push(link),
                Err(e) => {
                    let e = crate::loader::attach_failed(PROGRAM, "syscalls", name, &e);
                    tracing::warn!(error = %e, "copy-loop detection unavailable");
                    self.error = Some(e);
                    for link in self.links.drain(..) {
                        let _ = prog.detach(link);
                    }
                    return;
                }
            }
        }
        self.error = None;
        tracing::info!("copy-loop detection: read programs attached");
    }
}
