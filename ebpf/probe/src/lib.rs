//! User side of zerocache's kernel witness: loads the eBPF object built from `ebpf/kernel`,
//! attaches it to the syscall tracepoints, tells it which processes to watch and turns its maps
//! and ring buffer into the figures the proxy and the dashboard show.
//!
//! The probe never takes the proxy down with it: [`Probe::start`] always returns a probe, and when
//! the kernel refuses (no privileges, tracefs missing, verifier rejection) its [`ProbeStatus`] says
//! so in words an operator can act on, and every figure stays empty.
//!
//! Copy-loop detection ([`Probe::set_copy_loop`], used by `zerocache watch`) adds the read side:
//! file reads pending per process, matched by socket sends (`read_side`, and
//! `ebpf/kernel/src/copy_loop.rs` for the rule), and the peers of accepted connections
//! (`accepted`, `peers`). Files: `probe` (the handle), `loader`, `maps`, `watching` (the watch
//! list), `events` (the ring buffer), `fd_table`, `btf`, `procfs`, `store`, `model`; `kernel`
//! (the minimum kernel, asked of its BTF) and `tracefs` (tracepoint record formats), with which the
//! loader attaches each program where the running kernel allows it and names why where it does not.

mod accepted;
mod btf;
mod events;
mod fd_table;
mod kernel;
mod loader;
mod maps;
mod model;
mod peers;
mod probe;
mod procfs;
mod read_side;
mod store;
pub mod tracefs;
mod watching;

pub use kernel::{MINIMUM as MINIMUM_KERNEL, release as kernel_release};
pub use model::{
    ClosedFd, CopyLoopStatus, FdCounts, KindCounts, ProbeHealth, ProbeStatus, ProcessTotals,
    ProgramRole, ProgramState, Snapshot, WatchTarget,
};
pub use peers::{peer_of, peers_of};
pub use probe::{Probe, ProbeOptions};
pub use zerocache_probe_common::{FAST_WATCHED, MAX_WATCHED, kind};
