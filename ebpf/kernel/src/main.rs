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
//! The shape: each output syscall is seen once, at its exit, where the return value is known and
//! the arguments are still in the task's saved user registers (`bpf_task_pt_regs`). An exit program
//! takes the running task, reads its tgid from it (at an offset the loader found in the kernel's
//! BTF) and checks it against `WATCH_FILTER`: one helper call and one array load, the only work an
//! unwatched process pays for. It then adds the result to the fd's record and to the process
//! totals, which sit in a per-CPU array at the process's watch index. The fd record of the first
//! few watched processes (zerocache itself among them) is a slot of `FD_TABLE`, a direct array
//! indexed by watch index and fd; others go to the `FD_RECORDS` hash. On this kind of machine each
//! program run costs ~60 ns before it does anything and every call into the kernel ~20 ns more
//! (retpolines, Safe-RET return thunks), a hash lookup ~60 ns, where array lookups are inlined by
//! the verifier: so a watched sendfile or sendto run makes two calls (task, registers) and no hash
//! lookup, ~150 ns in all, where the enter/exit pair with a hash in between cost ~500 ns. fd
//! creation (accept, socket) and destruction (close, dup2/dup3 over it, close_range, process
//! exit) keep records tied to one connection: a closed
//! fd's final record goes to user space through a ring buffer and is deleted, so a reused fd
//! number starts from zero with a new generation.
//!
//! The files: `programs.rs` holds the maps, the watch filter and the output programs;
//! `lifecycle.rs` fd creation and destruction; `copy_loop.rs` copy-loop detection (file reads
//! pending per process, matched by socket sends; attached only in watch mode).
//!
//! On the host this crate compiles to an empty `main`, so `cargo build --workspace` works.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod copy_loop;
#[cfg(target_arch = "bpf")]
mod lifecycle;
#[cfg(target_arch = "bpf")]
mod programs;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
