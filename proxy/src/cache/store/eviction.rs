//! Which entry leaves when the cache is full: a policy behind a small trait, told of every
//! insert, use and removal, asked for the next victim. [`Lru`] (least recently used) is the one
//! policy today; a size-aware policy or TinyLFU's admission filter would go here as a second
//! implementation without touching the index, the disk layout or the data plane.

use lru::LruCache;

/// An eviction policy over entry hashes. The index calls it under its lock, so every method must
/// be O(1) (amortised) and never block.
pub(crate) trait Eviction: Send {
    /// `hash` was indexed (or re-indexed, replacing an entry with the same hash) with `size`
    /// bytes on disk.
    fn inserted(&mut self, hash: u128, size: u64);
    /// `hash` was served: a use.
    fn used(&mut self, hash: u128);
    /// `hash` left the index (purged, replaced by nothing, found gone or corrupt).
    fn removed(&mut self, hash: u128);
    /// The next entry to evict, taken out of the policy's own bookkeeping; `None` when empty.
    fn victim(&mut self) -> Option<u128>;
    /// Every hash the policy tracks, in no particular order.
    fn hashes(&self) -> Vec<u128>;
}

/// Least recently used: a hit moves its entry to the front, the back leaves first.
pub(crate) struct Lru {
    order: LruCache<u128, ()>,
}

impl Lru {
    /// An empty policy.
    pub(crate) fn new() -> Lru {
        Lru {
            order: LruCache::unbounded(),
        }
    }
}

impl Eviction for Lru {
    fn inserted(&mut self, hash: u128, _size: u64) {
        self.order.push(hash, ());
    }

    fn used(&mut self, hash: u128) {
        self.order.promote(&hash);
    }

    fn removed(&mut self, hash: u128) {
        self.order.pop(&hash);
    }

    fn victim(&mut self) -> Option<u128> {
        self.order.pop_lru().map(|(h, ())| h)
    }

    fn hashes(&self) -> Vec<u128> {
        self.order.iter().map(|(h, ())| *h).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_leaves_first() {
        let mut p = Lru::new();
        for h in 1..=3 {
            p.inserted(h, 10);
        }
        p.used(1);
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), Some(3));
        assert_eq!(p.victim(), Some(1));
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn a_removed_entry_is_never_a_victim_and_reinsertion_counts_as_new() {
        let mut p = Lru::new();
        p.inserted(1, 10);
        p.inserted(2, 10);
        p.removed(1);
        p.inserted(3, 10);
        // Replacing 2 makes it the most recent.
        p.inserted(2, 20);
        assert_eq!(p.victim(), Some(3));
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), None);
        // Using or removing an unknown hash is harmless.
        p.used(9);
        p.removed(9);
        assert!(p.hashes().is_empty());
    }
}
