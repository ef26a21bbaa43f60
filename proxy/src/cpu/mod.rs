//! CPU placement: where the data-plane workers run. Which CPUs the process may use, pinning each
//! worker to one of them, which CPU a connection's packets arrive on (`SO_INCOMING_CPU`), and the
//! valve that moves a pinned worker off a CPU it cannot get.
//!
//! Why it exists: a connection is cheapest when the thread that sends on it runs on the CPU where
//! its packets are received. Its segments then all leave from one CPU's backlog queue and are never
//! reordered: 0 out-of-order events per GB at 16 and 64 MiB hits against 4–120 unpinned, and a
//! 16 MiB hit cost the proxy 0.069–0.085 CPU-s/GB pinned against 0.086–0.160 unpinned
//! (docs/benchmark.md, docs/architecture.md "Workers and CPU placement"). A pinned worker cannot
//! leave a CPU that a real-time task holds, hence the valve.
//!
//! It is its own module because it is about threads and CPUs, not connections: `server` asks it
//! where a worker runs and where a connection arrived, and nothing here knows about HTTP.
//! - [`affinity`]: the system calls and procfs reads (affinity masks, thread ids, schedstat).
//! - [`valve`]: the pure policy, readings in and an action out.
//! - [`placement`]: the workers' CPUs, shared by the workers and `/metrics`, and the loop that
//!   applies the valve.

pub mod affinity;
pub mod placement;
pub mod valve;
