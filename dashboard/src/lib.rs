//! zerocache's window on itself: the proxy's accounting joined with the probe's kernel records,
//! served as an HTML dashboard, a JSON API and Prometheus `/metrics` by one axum app.

pub mod accounting;
pub mod api;
pub mod fleet;
pub mod guard;
pub mod history;
pub mod metrics;
pub mod server;

pub use accounting::{Accounting, CacheStatus, DataPath, RejectReason, ResponseRecord};
pub use server::{CacheStats, DashboardState, Purge, WorkerStats, serve};
