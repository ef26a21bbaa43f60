//! zerocache's window on itself: the ledger (the proxy's accounting joined with the probe's
//! kernel records, crate `zerocache-ledger`) served as an HTML dashboard, a JSON API and
//! Prometheus `/metrics` by one axum app. It only reads the ledger and the probe; what it changes
//! goes through functions the proxy hands it: the purge, and in tests the cache clock.
#![forbid(unsafe_code)]

pub(crate) mod api;
pub mod clock;
pub mod fleet;
pub mod guard;
pub(crate) mod history;
pub(crate) mod metrics;
pub mod peers;
pub mod probe_state;
pub(crate) mod process_metrics;
pub mod processes;
pub(crate) mod server;
mod slice_metrics;
mod tls_metrics;
pub mod watch;

pub use server::{CacheStats, DashboardState, PurgeFn, WorkerStats, serve};
