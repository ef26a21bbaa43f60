//! A fleet: several zerocache nodes that act as one cache. Every object has one owner, chosen
//! by rendezvous hashing of its primary cache key over the members ([`owner`]); a node that is
//! not the owner of a miss forwards the request to the owner over the pooled HTTP/1.1 upstream
//! client ([`forward`]) with a hop header proving the fleet secret ([`hop`]), and by default does
//! not store the answer. Membership comes from the config or DNS ([`members`]); peers are
//! watched by active health checks on an internal endpoint of the data port ([`health`],
//! [`internal`]); purges fan out to every peer and a purge epoch lets a member that missed one
//! catch up ([`purge`], [`epoch`]). No consensus protocol: every member computes the same owner
//! from the same membership, and a membership change moves about 1/N of the keys.

pub(crate) mod epoch;
pub(crate) mod forward;
pub(crate) mod health;
pub(crate) mod hop;
pub(crate) mod internal;
pub(crate) mod members;
pub(crate) mod owner;
pub(crate) mod peer;
pub(crate) mod purge;
pub(crate) mod purge_log;

use crate::cache::store::Store;
use arc_swap::ArcSwap;
use members::View;
use parking_lot::Mutex;
use peer::PeerState;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use zerocache_config::Config;
use zerocache_config::fleet::{FleetConfig, OnOwnerDown};
use zerocache_ledger::CacheStatus;

/// This node's membership of a fleet; kept across reloads (a change of `fleet:` needs a
/// restart), its routing hash updated on each.
pub struct Fleet {
    pub(crate) cfg: FleetConfig,
    routing: AtomicU64,
    pub(crate) view: ArcSwap<View>,
    /// Every peer ever seen, by id: its state (health, counters, pool) outlives a membership
    /// change that drops and re-adds it.
    known: Mutex<HashMap<String, Arc<PeerState>>>,
    pub(crate) epoch: epoch::Epoch,
    pub(crate) store: Arc<Store>,
    /// Where the purges it applies are counted.
    pub(crate) accounting: Arc<zerocache_ledger::Accounting>,
    /// Body bytes relayed from owners to clients.
    pub(crate) relayed: AtomicU64,
    /// Bytes of other owners' objects stored here (`store_remote`).
    pub(crate) hot_stored: AtomicU64,
    /// Stored objects filled for another owner (`store_remote`), for the owned-keys estimate.
    pub(crate) remote_objects: AtomicU64,
    /// The keys hop headers are signed and checked with (`fleet.secret`, `previous_secret`).
    pub(crate) keys: hop::Keys,
    /// Nonces of peer requests seen within the replay window.
    pub(crate) replay: Mutex<hop::Replay>,
    /// Hop headers refused, by [`hop::Refused`] (in `ALL` order).
    pub(crate) hop_refused: [AtomicU64; hop::Refused::ALL.len()],
    /// Every fleet purge applied here, for members that missed some.
    pub(crate) purge_log: purge_log::PurgeLog,
    /// What applying a purge needs besides the store: the fill locks and the key hash width.
    pub(crate) locks: Arc<crate::cache::lock::FillLocks>,
    pub(crate) hash_bits: u32,
    /// A catch-up from a peer's purge log is running, and how many failed in a row.
    pub(crate) catching_up: std::sync::atomic::AtomicBool,
    pub(crate) catch_up_failures: AtomicU64,
    /// Catch-ups: replayed from a peer's log, or everything stored treated as purged.
    pub(crate) catch_ups: [AtomicU64; 2],
    /// The routes in force, whose `query` rules a replayed purge's URL goes through (replaced on
    /// every reload).
    pub(crate) routes: ArcSwap<crate::routing::Routes>,
}

impl Fleet {
    /// Joins the fleet of `config`, if it has one: resolves the membership once (so the first
    /// request already knows the owners) and starts re-resolution and health checks on the
    /// current runtime.
    pub async fn start(
        config: &Config,
        store: &Arc<Store>,
        locks: &Arc<crate::cache::lock::FillLocks>,
        accounting: &Arc<zerocache_ledger::Accounting>,
        routes: &Arc<crate::routing::Routes>,
    ) -> Option<Arc<Fleet>> {
        let cfg = config.fleet.clone()?;
        let fleet = Arc::new(Fleet {
            routing: AtomicU64::new(zerocache_config::fleet::routing_hash(config)),
            view: ArcSwap::from_pointee(View::empty()),
            known: Mutex::new(HashMap::new()),
            epoch: epoch::Epoch::load(&config.cache.path),
            store: store.clone(),
            accounting: accounting.clone(),
            relayed: AtomicU64::new(0),
            hot_stored: AtomicU64::new(0),
            remote_objects: AtomicU64::new(0),
            keys: hop::Keys::of(&cfg),
            replay: Mutex::new(hop::Replay::default()),
            hop_refused: Default::default(),
            purge_log: purge_log::PurgeLog::load(
                &config.cache.path,
                cfg.purge_log_max,
                cfg.purge_log_age,
            ),
            locks: locks.clone(),
            hash_bits: config.debug.key_hash_bits.unwrap_or(128).min(128) as u32,
            catching_up: std::sync::atomic::AtomicBool::new(false),
            catch_up_failures: AtomicU64::new(0),
            catch_ups: Default::default(),
            routes: ArcSwap::new(routes.clone()),
            cfg,
        });
        fleet.refresh().await;
        health::first_round(&fleet).await;
        tokio::spawn(fleet.clone().resolve_loop());
        tokio::spawn(health::run(fleet.clone()));
        Some(fleet)
    }

    /// The fleet for a context built from `config` and its `routes` (at start and on every
    /// reload): the routing hash and the purge log's URL normalisation follow the routes in force.
    pub fn for_config(
        fleet: &Option<Arc<Fleet>>,
        config: &Config,
        routes: &Arc<crate::routing::Routes>,
    ) -> Option<Arc<Fleet>> {
        let f = fleet.as_ref()?;
        f.routes.store(routes.clone());
        let h = zerocache_config::fleet::routing_hash(config);
        if f.routing.swap(h, Ordering::Relaxed) != h {
            tracing::info!(
                routing_hash = format_args!("{h:016x}"),
                "fleet routing hash"
            );
        }
        Some(f.clone())
    }

    /// A purger of this node's store, normalising URLs with `routes`.
    pub(crate) fn purger<'a>(
        &'a self,
        routes: &'a crate::routing::Routes,
    ) -> crate::purge::Purger<'a> {
        crate::purge::Purger {
            store: &self.store,
            accounting: &self.accounting,
            locks: &self.locks,
            hash_bits: self.hash_bits,
            routes: Some(routes),
        }
    }

    /// A hop header was refused: counted, and logged at most once a minute (clients can send
    /// them at will).
    pub(crate) fn hop_refused(&self, why: hop::Refused, peer: std::net::IpAddr) {
        let i = hop::Refused::ALL
            .iter()
            .position(|r| *r == why)
            .unwrap_or(0);
        let before = self.hop_refused[i].fetch_add(1, Ordering::Relaxed);
        static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let now = START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64;
        let last = LAST.load(Ordering::Relaxed);
        if before == 0 || now.saturating_sub(last) >= 60_000 {
            LAST.store(now, Ordering::Relaxed);
            tracing::warn!(reason = why.as_str(), %peer, "fleet hop header refused; the request is served as a client's");
        }
    }

    /// This node's routing hash.
    pub(crate) fn routing(&self) -> u64 {
        self.routing.load(Ordering::Relaxed)
    }

    /// This node's id, once resolved.
    pub(crate) fn self_id(&self) -> Option<String> {
        let v = self.view.load();
        v.self_index.map(|i| v.members[i].id.clone())
    }

    /// Where a miss of `key` goes: `None` when this node owns it (or is alone), else the plan
    /// of members to ask, in the key's hash order.
    pub(crate) fn plan(self: &Arc<Self>, key: &str) -> Option<forward::Plan> {
        let view = self.view.load_full();
        let me = view.self_index?;
        if owner::owner(&view.members, key) == Some(me) {
            return None;
        }
        let order = owner::order(&view.members, key);
        Some(forward::Plan {
            fleet: self.clone(),
            view,
            order,
        })
    }

    /// Whether a stored entry predates a purge this node missed.
    pub(crate) fn is_stale(&self, entry: &crate::cache::entry::Entry) -> bool {
        self.epoch.is_stale(entry.meta.stored_at)
    }

    /// What `fleet.on_owner_down` says.
    pub(crate) fn on_owner_down(&self) -> OnOwnerDown {
        self.cfg.on_owner_down
    }

    async fn refresh(&self) {
        match members::resolve_all(&self.cfg).await {
            Ok((me, all)) => self.apply(&me, all),
            Err(e) => {
                tracing::warn!(error = %e, "fleet membership not resolved; keeping the last one")
            }
        }
    }

    async fn resolve_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.cfg.dns_interval).await;
            self.refresh().await;
        }
    }

    /// Installs a resolved membership (logging a change).
    fn apply(&self, me: &str, all: Vec<(String, u32)>) {
        let mut known = self.known.lock();
        let mut members = Vec::with_capacity(all.len());
        let mut peers = Vec::with_capacity(all.len());
        let mut self_index = None;
        for (i, (id, weight)) in all.into_iter().enumerate() {
            if id == me {
                self_index = Some(i);
                peers.push(None);
            } else {
                let p = known.entry(id.clone()).or_insert_with(|| {
                    Arc::new(PeerState::new(
                        &id,
                        self.cfg.health_timeout,
                        self.cfg.read_timeout,
                    ))
                });
                peers.push(Some(p.clone()));
            }
            members.push(owner::Member::new(id, weight));
        }
        let view = View {
            members,
            self_index,
            peers,
        };
        let old = self.view.load();
        if old.ids() != view.ids() {
            tracing::info!(self_id = me, members = ?view.ids(), "fleet membership");
        }
        self.view.store(Arc::new(view));
    }

    /// The dashboard's snapshot.
    /// The dashboard's view; responses to peers' requests are the ledger's (`source="peer"`).
    pub(crate) fn snapshot(
        &self,
        acc: &zerocache_ledger::Accounting,
    ) -> zerocache_dashboard::fleet::FleetView {
        let view = self.view.load();
        let ours = self.routing();
        let objects = self.store.usage().1;
        zerocache_dashboard::fleet::FleetView {
            self_id: self.self_id().unwrap_or_default(),
            routing_hash: format!("{ours:016x}"),
            purge_epoch: self.epoch.current(),
            owned_keys: objects.saturating_sub(self.remote_objects.load(Ordering::Relaxed)),
            peer_responses: CacheStatus::ALL
                .iter()
                .map(|s| (s.as_str().to_string(), acc.peer_requests(*s)))
                .collect(),
            relayed_body_bytes: self.relayed.load(Ordering::Relaxed),
            catch_ups: [("replayed", 0), ("wiped", 1)]
                .iter()
                .map(|(k, i)| (k.to_string(), self.catch_ups[*i].load(Ordering::Relaxed)))
                .collect(),
            purge_log_entries: self.purge_log.len() as u64,
            hop_refused: hop::Refused::ALL
                .iter()
                .zip(&self.hop_refused)
                .map(|(r, n)| (r.as_str().to_string(), n.load(Ordering::Relaxed)))
                .collect(),
            peers: view
                .peers
                .iter()
                .flatten()
                .map(|p| {
                    let cfg = p.cfg();
                    zerocache_dashboard::fleet::PeerView {
                        id: p.id.clone(),
                        up: p.is_up(),
                        routing_hash: (cfg != 0).then(|| format!("{cfg:016x}")),
                        routing_matches: cfg == 0 || cfg == ours,
                        purge_epoch: p.epoch.load(Ordering::Relaxed),
                        forwarded: p.forwarded(),
                        answered: p.answered.load(Ordering::Relaxed),
                        last_error: p.last_error(),
                    }
                })
                .collect(),
        }
    }

    /// The dashboard's hooks for `fleet`, if this node is in one.
    pub fn hooks(
        fleet: &Option<Arc<Fleet>>,
        acc: &Arc<zerocache_ledger::Accounting>,
    ) -> Option<zerocache_dashboard::fleet::FleetHooks> {
        let (view, purge, acc) = (fleet.clone()?, fleet.clone()?, acc.clone());
        Some(zerocache_dashboard::fleet::FleetHooks {
            view: Box::new(move || view.snapshot(&acc)),
            purge: Box::new(move |p| Box::pin(purge::fan_out(purge.clone(), p))),
        })
    }
}

impl Fleet {
    /// Counts a forwarded request from member `from` that this node answers.
    pub(crate) fn answering(&self, from: &str) {
        if let Some(p) = self.known.lock().get(from) {
            p.answered.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether a looked-up entry must be dropped: it predates a fleet purge this node missed.
    /// It is removed from the cache, so the request goes on as a miss.
    pub(crate) fn drops(
        fleet: Option<&Fleet>,
        store: &crate::cache::store::Store,
        e: &Arc<crate::cache::entry::Entry>,
    ) -> bool {
        let stale = fleet.is_some_and(|f| f.is_stale(e));
        if stale {
            store.remove_if_same(e);
        }
        stale
    }
}
