//! The client side: accepting connections and running each one's request loop. A request flows one
//! way: parse → route → cache lookup → hit (sendfile, [`hit`]) or fetch (upstream → client + file,
//! [`fetch`]) → accounting.

pub mod conn;
pub mod fetch;
pub mod hit;

use crate::cache::lock::FillLocks;
use crate::cache::store::Store;
use crate::http::request::Limits;
use crate::routing::Routes;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use zerocache_dashboard::Accounting;

/// Everything a connection needs, shared by all of them.
pub struct Ctx {
    /// Routes and upstream groups.
    pub routes: Routes,
    /// The disk cache.
    pub store: Arc<Store>,
    /// Miss coalescing.
    pub locks: Arc<FillLocks>,
    /// What was served, for the dashboard and metrics.
    pub accounting: Arc<Accounting>,
    /// Parsing limits.
    pub limits: Limits,
    /// Time allowed for a request head once it has started.
    pub header_timeout: Duration,
    /// Time a keep-alive connection may idle between requests.
    pub idle_timeout: Duration,
    /// Largest request body accepted (413 beyond).
    pub max_body: u64,
    /// Largest single sendfile call.
    pub sendfile_max_chunk: u64,
    /// Bits of the key hash used (128 except in collision tests).
    pub hash_bits: u32,
    /// The planted zero-copy bug: hits sent by read+write.
    pub copy_hits: bool,
}

/// Accepts connections until the listener fails; each runs on its own task.
pub async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                tokio::spawn(conn::serve(sock, peer, ctx.clone()));
            }
            Err(e) => {
                // EMFILE and friends: back off briefly rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
