//! The client side: accepting connections and running each one's request loop. A request flows one
//! way: parse → route → cache lookup → hit (sendfile, [`hit`]) or fetch (upstream → client + file,
//! [`fetch`]) → accounting.
//!
//! [`Shared`] is what outlives a config reload: the current [`Ctx`] is swapped atomically on
//! SIGHUP and each request picks up the one current when it starts, so a reload changes routes for
//! new requests while responses in flight finish on the old ones.

pub mod behind;
pub mod conn;
mod conn_error;
mod conn_state;
mod copy_account;
mod dispatch;
mod edge_rules;
mod exchange;
pub mod fetch;
mod fleet_intake;
pub(crate) mod h2;
pub mod hit;
mod keys;
mod purge_method;
mod refusal;
mod relay;
pub mod request_body;
mod respond;
mod sliced;
mod sliced_send;
mod tunnel;
pub mod upload;
pub mod workers;

use crate::accesslog::AccessLog;
use crate::cache::lock::FillLocks;
use crate::cache::store::Store;
use crate::http::request::Limits;
use crate::routing::Routes;
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use zerocache_ledger::Accounting;

/// Everything a request needs; replaced whole on reload. Grouped by concern: what outlives a
/// reload (store, locks, accounting, fleet), then what a client may do ([`ClientRules`]), what
/// is sent to origins besides the request ([`Forwarding`]), how responses are stored
/// ([`Storing`]) and how hits are sent ([`Sending`]).
pub struct Ctx {
    /// Routes and upstream groups.
    pub routes: Arc<Routes>,
    /// The disk cache (kept across reloads).
    pub store: Arc<Store>,
    /// Miss coalescing (kept across reloads).
    pub locks: Arc<FillLocks>,
    /// What was served, for the dashboard and metrics (kept across reloads).
    pub accounting: Arc<Accounting>,
    /// The access log, if configured.
    pub access_log: Option<Arc<AccessLog>>,
    /// The rules' rate-limit buckets (kept across reloads).
    pub(crate) limiter: Arc<crate::rate_limit::Limiter>,
    /// The `tls:` listener's certificates and settings, reloaded with the config.
    pub tls: Option<Arc<crate::tls::server::TlsServer>>,
    /// The fleet this node is a member of, if any (kept across reloads).
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
    /// Most open client connections.
    pub max_connections: usize,
    /// Bits of the key hash used (128 except in collision tests).
    pub hash_bits: u32,
    pub client: ClientRules,
    /// `purge.method`: who may send `PURGE` to the data port (None: it is forwarded).
    pub purge_method: Option<PurgeMethod>,
    pub forwarding: Forwarding,
    pub storing: Storing,
    pub sending: Sending,
}

impl Ctx {
    /// What carries out a purge on this node (the API's, a peer's, the `PURGE` method's).
    pub fn purger(&self) -> crate::purge::Purger<'_> {
        crate::purge::Purger {
            store: &self.store,
            accounting: &self.accounting,
            locks: &self.locks,
            hash_bits: self.hash_bits,
            routes: Some(&self.routes),
        }
    }
}

/// What a client may send, and how long it may take (`limits`).
pub struct ClientRules {
    /// Parsing limits.
    pub limits: Limits,
    /// Time allowed for a request head once it has started.
    pub header_timeout: Duration,
    /// Time a keep-alive connection may idle between requests.
    pub idle_timeout: Duration,
    /// Time allowed between reads of a request body.
    pub read_timeout: Duration,
    /// Longest wait for a client to take more bytes of a response.
    pub send_timeout: Duration,
    /// `limits.body_min_rate`, bytes per second (0: off).
    pub body_min_rate: u64,
    /// Largest request body accepted (413 beyond).
    pub max_body: u64,
}

/// Who may purge with the `PURGE` method (`purge`).
pub struct PurgeMethod {
    /// Clients allowed without a token.
    pub allowed: Vec<zerocache_config::cidr::Cidr>,
    /// The bearer token that allows any client.
    pub token: Option<String>,
}

/// What goes to an origin besides the client's request (`proxy`, `logging`).
pub struct Forwarding {
    /// Request fields never forwarded (lower-cased).
    pub strip_fields: Vec<String>,
    /// `logging.request_id_header`: the request id's field, sent upstream.
    pub request_id_header: String,
    /// Peers whose forwarding fields are kept and appended to.
    pub trusted_proxies: Vec<zerocache_config::cidr::Cidr>,
    /// `proxy.via`: whether this proxy names itself in `Via`, upstream and to clients.
    pub via: bool,
}

/// How responses are stored and filled (`cache`).
pub struct Storing {
    /// Whether 5xx responses with explicit freshness are stored.
    pub store_5xx: bool,
    /// Cap of heuristic freshness (10% of the time since Last-Modified).
    pub heuristic_max: Duration,
    /// Largest object filled in the background after a ranged miss.
    pub range_fill_max: u64,
    /// Bytes a fill may still read once no client is reading behind it.
    pub abandoned_fill_max: u64,
    /// How long a fill may go on once no client is reading behind it.
    pub abandoned_fill_timeout: Duration,
}

/// How hits are sent (`cache`, `debug`).
pub struct Sending {
    /// Largest single sendfile call.
    pub sendfile_max_chunk: u64,
    /// Read cold hits in on the blocking pool first.
    pub offload_cold_hits: bool,
    /// The planted zero-copy bug: hits sent by read+write.
    pub copy_hits: bool,
}

/// Milliseconds since the first call: a cheap monotonic clock for "recently hit" checks.
pub fn uptime_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// State shared by the accept loop, every connection and the signal handlers.
pub struct Shared {
    /// The current context.
    pub ctx: ArcSwap<Ctx>,
    /// Set to true to stop accepting and close idle connections.
    pub shutdown: watch::Sender<bool>,
    open: AtomicUsize,
    closed_all: Notify,
}

impl Shared {
    /// Wraps the first context.
    pub fn new(ctx: Ctx) -> Arc<Shared> {
        Arc::new(Shared {
            ctx: ArcSwap::from_pointee(ctx),
            shutdown: watch::channel(false).0,
            open: AtomicUsize::new(0),
            closed_all: Notify::new(),
        })
    }

    /// Counts a new connection unless `max` are open already. One atomic step, because every
    /// data-plane worker admits connections: a load followed by an add would let two workers
    /// both take the last place.
    pub fn admit(&self, max: usize) -> bool {
        self.open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// A connection counted by [`Shared::admit`] ended; wakes the drain after the last one.
    pub fn release(&self) {
        if self.open.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.closed_all.notify_waiters();
        }
    }

    /// Open client connections.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Waits until every connection has ended, or `timeout`; true if they all ended.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.open_connections() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = tokio::time::timeout(
                left.min(Duration::from_millis(100)),
                self.closed_all.notified(),
            )
            .await;
        }
        true
    }
}
