//! zerocache's window on itself: the proxy's accounting joined with the probe's kernel records,
//! served as an HTML dashboard, a JSON API and Prometheus `/metrics` by one axum app.

pub mod accounting;
pub mod api;
pub mod copy_reason;
pub mod guard;
pub mod history;
pub mod metrics;
pub mod server;
mod tls_metrics;
pub mod tls_stats;

pub use accounting::{Accounting, CacheStatus, DataPath, RejectReason, ResponseRecord};
pub use copy_reason::CopyReason;
pub use server::{CacheStats, DashboardState, Purge, WorkerStats, serve};
pub use tls_stats::HandshakeResult;
