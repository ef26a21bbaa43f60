//! zerocache: an HTTP/1.1 edge cache that serves hits from disk with sendfile(2) and proves it
//! with an eBPF probe. This crate is the data plane and the process around it; the probe, the
//! dashboard and the config schema live in their own crates.

pub(crate) mod accesslog;
pub(crate) mod cache;
pub(crate) mod clock;
pub(crate) mod cpu;
pub mod exports;
pub(crate) mod fd_limits;
pub(crate) mod fleet;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod http;
pub mod man_pages;
pub(crate) mod memory;
pub(crate) mod net;
pub(crate) mod notify;
pub(crate) mod pid_file;
pub mod probe_check;
pub(crate) mod purge;
pub(crate) mod rate_limit;
pub(crate) mod request_id;
pub(crate) mod residency;
pub(crate) mod routing;
pub mod run;
pub(crate) mod sendfile;
pub(crate) mod server;
pub(crate) mod tls;
pub(crate) mod upgrade;
pub mod upgrade_command;
pub(crate) mod upstream;
pub mod watch;
pub(crate) mod worker_id;
