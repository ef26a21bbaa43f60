//! The upstream side: pooled keep-alive connections per server with failover, and the exchange of
//! one request for one response head, retried once when a pooled connection turns out dead.

pub mod body;
pub mod pool;

pub use pool::{Group, UpstreamConn, UpstreamError};
