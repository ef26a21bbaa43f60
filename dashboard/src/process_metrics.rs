//! The per-process metric families, shared by the proxy's `/metrics` and `zerocache watch`'s:
//! `zerocache_syscalls_total`, `zerocache_syscall_bytes_total` (by process, syscall and fd
//! class), `zerocache_copy_loop_bytes_total` and `zerocache_file_read_bytes_total` (by process).
//! The `process` label is the comm (zerocache itself is `zerocache`); processes sharing a name are
//! summed, so no label grows with PIDs.

use crate::metrics::counter_vec;
use prometheus::Registry;
use zerocache_probe::{Snapshot, kind};

/// Registers the families with a 0 sample for every name in `initial` (complete from start-up),
/// then adds every process of `snap`. `self_pid`'s process is labelled `zerocache`.
pub fn register(
    r: &Registry,
    snap: &Snapshot,
    initial: &[&str],
    self_pid: Option<u32>,
) -> prometheus::Result<()> {
    let calls = counter_vec(
        r,
        "zerocache_syscalls_total",
        "Output syscalls of watched processes, by process name, syscall and fd class (socket or other).",
        &["process", "syscall", "fd_class"],
    )?;
    let bytes = counter_vec(
        r,
        "zerocache_syscall_bytes_total",
        "Bytes moved by output syscalls of watched processes.",
        &["process", "syscall", "fd_class"],
    )?;
    let copy_loop = counter_vec(
        r,
        "zerocache_copy_loop_bytes_total",
        "Socket bytes of watched processes sent by copying syscalls that matched file bytes the process had just read (a read/write copy loop where sendfile could have been used); 0 while copy-loop detection is off.",
        &["process"],
    )?;
    let file_read = counter_vec(
        r,
        "zerocache_file_read_bytes_total",
        "Bytes watched processes read from regular files on real filesystems (copy-loop detection on).",
        &["process"],
    )?;
    for process in initial {
        for name in kind::NAMES {
            for class in ["socket", "other"] {
                calls.with_label_values(&[process, name, class]).inc_by(0);
                bytes.with_label_values(&[process, name, class]).inc_by(0);
            }
        }
        copy_loop.with_label_values(&[process]).inc_by(0);
        file_read.with_label_values(&[process]).inc_by(0);
    }
    for p in &snap.processes {
        let process = if Some(p.pid) == self_pid {
            "zerocache"
        } else {
            p.comm.as_str()
        };
        for (class, counts) in [("socket", &p.socket), ("other", &p.other)] {
            for (i, name) in kind::NAMES.iter().enumerate() {
                let k = counts.by_kind[i];
                calls
                    .with_label_values(&[process, name, class])
                    .inc_by(k.calls);
                bytes
                    .with_label_values(&[process, name, class])
                    .inc_by(k.bytes);
            }
        }
        copy_loop
            .with_label_values(&[process])
            .inc_by(p.copy_loop_bytes);
        file_read
            .with_label_values(&[process])
            .inc_by(p.file_read_bytes);
    }
    Ok(())
}
