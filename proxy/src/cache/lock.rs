//! Miss coalescing: the first miss for a key fills it, later misses for the same key wait for that
//! fill instead of sending the upstream the same request again (nginx's `proxy_cache_lock`).
//!
//! A follower waits only for the leader's response head. If the response will be stored, the
//! leader publishes the [`Growing`] fill and followers read behind it; if not, the leader lets
//! go at once and each follower fetches on its own (Varnish's hit-for-miss), so one uncacheable
//! URL never serialises its clients.

use super::growing::Growing;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Where a fill stands, as its followers see it.
#[derive(Clone, Debug)]
pub enum FillState {
    /// The leader is waiting for the response head.
    Pending,
    /// The response is being stored: read behind it.
    Growing(Arc<Growing>),
    /// The leader is done (or gone): look the key up again.
    Released,
}

/// Fills in progress, by key hash.
#[derive(Default)]
pub struct FillLocks {
    map: Mutex<HashMap<u128, watch::Receiver<FillState>>>,
}

/// What a miss should do.
pub enum Role {
    /// Fill the entry; other misses wait until the guard publishes or is dropped.
    Leader(LeaderGuard),
    /// Wait for the leader, then read behind its fill or look the entry up again.
    Follower(watch::Receiver<FillState>),
}

/// Held by the filling request (and then by its fill task); dropping it releases the followers.
pub struct LeaderGuard {
    locks: Arc<FillLocks>,
    hash: u128,
    tx: watch::Sender<FillState>,
}

impl FillLocks {
    /// Becomes the leader for `hash`, or a follower if a fill is already running.
    pub fn acquire(self: &Arc<Self>, hash: u128) -> Role {
        let mut map = self.map.lock();
        if let Some(rx) = map.get(&hash) {
            return Role::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(FillState::Pending);
        map.insert(hash, rx);
        Role::Leader(LeaderGuard {
            locks: self.clone(),
            hash,
            tx,
        })
    }
}

impl LeaderGuard {
    /// The response is being stored in `g`: waiting and later followers read behind it.
    pub fn publish(&self, g: Arc<Growing>) {
        self.tx.send_replace(FillState::Growing(g));
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        self.locks.map.lock().remove(&self.hash);
        self.tx.send_replace(FillState::Released);
    }
}

/// Waits until the leader has published its fill or let go; `Some` while the fill is growing.
pub async fn wait(mut rx: watch::Receiver<FillState>) -> Option<Arc<Growing>> {
    loop {
        match &*rx.borrow_and_update() {
            FillState::Pending => {}
            FillState::Growing(g) => return Some(g.clone()),
            FillState::Released => return None,
        }
        if rx.changed().await.is_err() {
            return None;
        }
    }
}
