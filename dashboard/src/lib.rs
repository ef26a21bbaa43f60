//! zerocache's window on itself: the ledger (the proxy's accounting joined with the probe's kernel
//! records, crate `zerocache-ledger`) served as an HTML dashboard, a JSON API and Prometheus `/metrics` by one axum app.

pub mod api;
pub mod clock;
pub mod fleet;
pub mod guard;
pub mod history;
pub mod metrics;
pub mod server;

pub use server::{CacheStats, DashboardState, Purge, WorkerStats, serve};
