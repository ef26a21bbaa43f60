//! zerocache: an HTTP/1.1 edge cache that serves hits from disk with sendfile(2) and proves it
//! with an eBPF probe. This crate is the data plane and the process around it; the probe, the
//! dashboard and the config schema live in their own crates.

pub mod accesslog;
pub mod cache;
pub(crate) mod clock;
pub mod cpu;
pub(crate) mod fd_limits;
pub mod fleet;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod http;
pub mod notify;
pub(crate) mod purge;
pub mod request_id;
pub mod residency;
pub mod routing;
pub mod run;
pub mod sendfile;
pub mod server;
pub mod upstream;
pub mod worker_id;
