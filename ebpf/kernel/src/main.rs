//! Kernel side of the zerocache probe: syscall tracepoint programs that count, per watched process
//! and per file descriptor, how many bytes left through zero-copy paths (`sendfile64`, `splice`)
//! and how many through copying ones (`write`, `writev`, `sendto`, `sendmsg`, `sendmmsg`).
//!
//! Why tracepoints on syscalls: they are stable ABI (the argument offsets below come from
//! `/sys/kernel/tracing/events/syscalls/*/format`), this kernel has no kprobes, and a syscall is
//! exactly the unit at which user space chooses between copying and not copying. Their price:
//! while any syscall tracepoint is enabled, every syscall of every task takes the kernel's slower
//! tracing path. fentry/fexit trampolines on the `__x64_sys_*` wrappers would avoid that, but
//! loading tracing programs fails with EPERM on this kind of machine (lockdown), so the probe
//! keeps the tracepoints and the benchmark reports what they cost.
//!
//! The shape: an enter program checks the process against `WATCHED` (the only work an unwatched
//! process pays for), stashes the fd and requested length per thread, and the shared exit program
//! adds the return value to the fd's record and to the process totals. fd creation (accept,
//! socket) and destruction (close, dup2/dup3 over it, close_range, process exit) keep records tied
//! to one connection: a closed fd's final record goes to user space through a ring buffer and is
//! deleted, so a reused fd number starts from zero with a new generation.
//!
//! On the host this crate compiles to an empty `main`, so `cargo build --workspace` works.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod programs;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
