//! The upstream side: named groups of servers with nginx's balancing methods, weights, passive
//! and active health, pooled keep-alive connections per server, and the exchange of one request
//! for one response head, failing over to the next server when one does not answer.

mod balance;
pub mod body;
mod error;
mod health;
mod https;
mod peer;
pub mod pool;
pub mod stream;

pub use error::UpstreamError;
pub use pool::{Group, UpstreamConn};
