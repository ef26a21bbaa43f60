//! The hot entries: the most recently used entries kept whole (`cache.hot_entries` of them), so
//! a hot hit reads nothing and finds its file already open (`Entry::file`).
//!
//! What leaves the set is not dropped here. The last reference to an entry closes its file, and
//! the set changes under the store's one index mutex, which every request takes: a close(2)
//! there (of an entry replaced by a fill, pushed out by a newer one, purged or evicted) made
//! every request wait for it. Leavers wait in `released` until the store's guard has unlocked
//! (`IndexGuard`, in `store/index_lock.rs`), and are dropped then.

use crate::cache::entry::Entry;
use std::num::NonZeroUsize;
use std::sync::Arc;

pub(crate) struct HotEntries {
    lru: lru::LruCache<u128, Arc<Entry>>,
    /// Entries that left the set since the guard last took them: dropped after the unlock.
    released: Vec<Arc<Entry>>,
}

impl HotEntries {
    /// An empty set of at most `max` entries (at least one).
    pub(crate) fn new(max: usize) -> HotEntries {
        HotEntries {
            lru: lru::LruCache::new(NonZeroUsize::new(max.max(1)).unwrap_or(NonZeroUsize::MIN)),
            released: Vec::new(),
        }
    }

    /// The entry under `hash`, as a use (it becomes the most recent).
    pub(crate) fn get(&mut self, hash: &u128) -> Option<&Arc<Entry>> {
        self.lru.get(hash)
    }

    /// The entry under `hash`, not as a use.
    pub(crate) fn peek(&self, hash: &u128) -> Option<&Arc<Entry>> {
        self.lru.peek(hash)
    }

    /// Keeps `e` as the most recent; the entry it replaces or pushes out is released.
    pub(crate) fn keep(&mut self, e: Arc<Entry>) {
        if let Some((_, gone)) = self.lru.push(e.hash, e) {
            self.released.push(gone);
        }
    }

    /// Takes the entry under `hash` out of the set; it is released.
    pub(crate) fn remove(&mut self, hash: &u128) {
        if let Some(gone) = self.lru.pop(hash) {
            self.released.push(gone);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lru.len()
    }

    /// What left the set since the last call, for the caller to drop once unlocked.
    pub(crate) fn take_released(&mut self) -> Vec<Arc<Entry>> {
        std::mem::take(&mut self.released)
    }
}
