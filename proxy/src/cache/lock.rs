//! Miss coalescing: the first miss for a key fills it, later misses for the same key wait for that
//! fill instead of sending the upstream the same request again (nginx's `proxy_cache_lock`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Fills in progress, by key hash.
#[derive(Default)]
pub struct FillLocks {
    map: Mutex<HashMap<u128, watch::Receiver<bool>>>,
}

/// What a miss should do.
pub enum Role {
    /// Fill the entry; other misses wait until the guard is dropped.
    Leader(LeaderGuard),
    /// Wait for the leader, then look the entry up again.
    Follower(watch::Receiver<bool>),
}

/// Held by the filling request; dropping it releases the followers.
pub struct LeaderGuard {
    locks: Arc<FillLocks>,
    hash: u128,
    tx: watch::Sender<bool>,
}

impl FillLocks {
    /// Becomes the leader for `hash`, or a follower if a fill is already running.
    pub fn acquire(self: &Arc<Self>, hash: u128) -> Role {
        let mut map = self.map.lock();
        if let Some(rx) = map.get(&hash) {
            return Role::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(false);
        map.insert(hash, rx);
        Role::Leader(LeaderGuard {
            locks: self.clone(),
            hash,
            tx,
        })
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        self.locks.map.lock().remove(&self.hash);
        let _ = self.tx.send(true);
    }
}

/// Waits until the leader is done (or gone).
pub async fn wait(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}
