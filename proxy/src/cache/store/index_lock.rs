//! The store's one index mutex, and the one thing its guard does besides unlocking: the hot
//! entries that left the index while it was held are dropped after the unlock, not before.
//!
//! A hot entry holds its file open, and dropping its last reference closes it. Replacing,
//! evicting or purging an entry, or reading a cold one that pushes out the least recently used,
//! all release a hot entry under this mutex, which every request takes; a close(2) there made
//! every request wait for it. The index keeps what it releases ([`Index::take_released`]) and
//! [`IndexGuard`]'s drop takes it out, unlocks, then drops it, whatever the caller did under
//! the lock, so no call site can forget.

use super::eviction::Lru;
use super::index::Index;
use parking_lot::{Mutex, MutexGuard};
use std::ops::{Deref, DerefMut};

pub(crate) struct IndexLock(Mutex<Index<Lru>>);

impl IndexLock {
    pub(crate) fn new(index: Index<Lru>) -> IndexLock {
        IndexLock(Mutex::new(index))
    }

    /// The index, until the guard is dropped.
    pub(crate) fn lock(&self) -> IndexGuard<'_> {
        IndexGuard(Some(self.0.lock()))
    }
}

/// The locked index. `None` only inside `drop`.
pub(crate) struct IndexGuard<'a>(Option<MutexGuard<'a, Index<Lru>>>);

impl Deref for IndexGuard<'_> {
    type Target = Index<Lru>;

    fn deref(&self) -> &Index<Lru> {
        match &self.0 {
            Some(g) => g,
            None => unreachable!("the guard is present until it is dropped"),
        }
    }
}

impl DerefMut for IndexGuard<'_> {
    fn deref_mut(&mut self) -> &mut Index<Lru> {
        match &mut self.0 {
            Some(g) => g,
            None => unreachable!("the guard is present until it is dropped"),
        }
    }
}

impl Drop for IndexGuard<'_> {
    fn drop(&mut self) {
        unlock_then_drop(&mut self.0, Index::take_released);
    }
}

/// Takes what `take` gives out of the locked value, unlocks, and only then drops it.
fn unlock_then_drop<T, R>(guard: &mut Option<MutexGuard<'_, T>>, take: impl FnOnce(&mut T) -> R) {
    let released = guard.as_mut().map(|g| take(g));
    *guard = None;
    drop(released);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::{Entry, Meta};
    use crate::cache::targeted::Targeted;
    use std::sync::Arc;

    /// An entry pushed out of the hot set under the lock is still alive, held by the index, as
    /// long as the guard is; once the guard is dropped it is gone and the lock is free.
    #[test]
    fn a_released_hot_entry_is_dropped_after_the_unlock() {
        let lock = IndexLock::new(Index::new(Lru::new(), 1));
        let entry = |key: &str, hash: u128| {
            let meta = Meta {
                key: key.into(),
                stored_at: std::time::SystemTime::now(),
                initial_age: std::time::Duration::ZERO,
                lifetime: std::time::Duration::from_secs(60),
                status: 200,
                reason: "OK".into(),
                fields: Vec::new(),
                vary: Vec::new(),
                url: key.into(),
            };
            Arc::new(Entry::new(
                hash,
                meta,
                "/nonexistent".into(),
                4096,
                1,
                &Targeted::default(),
            ))
        };
        let first = entry("GET http://h/1", 1);
        let weak = Arc::downgrade(&first);
        let mut ix = lock.lock();
        ix.insert(&first.meta.clone(), located(&first), 1, Some(first));
        let second = entry("GET http://h/2", 2);
        ix.insert(&second.meta.clone(), located(&second), 2, Some(second));
        assert_eq!(weak.strong_count(), 1, "held by the index until the unlock");
        drop(ix);
        assert_eq!(weak.strong_count(), 0);
        assert!(lock.0.try_lock().is_some());
        // Nothing is left over for the next guard.
        assert!(lock.lock().take_released().is_empty());
    }

    /// What the guard takes out is dropped once the lock is free: a value whose drop tries the
    /// lock finds it free (it would not, were it dropped before the unlock).
    #[test]
    fn what_is_taken_is_dropped_after_the_unlock() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static LOCK: Mutex<Vec<Probe>> = Mutex::new(Vec::new());
        struct Probe(Arc<AtomicBool>);
        impl Drop for Probe {
            fn drop(&mut self) {
                self.0.store(LOCK.try_lock().is_some(), Ordering::SeqCst);
            }
        }
        let free_at_drop = Arc::new(AtomicBool::new(false));
        let mut guard = Some(LOCK.lock());
        if let Some(g) = guard.as_mut() {
            g.push(Probe(free_at_drop.clone()));
        }
        unlock_then_drop(&mut guard, std::mem::take);
        assert!(free_at_drop.load(Ordering::SeqCst));
    }

    fn located(e: &Entry) -> super::super::index::Placement {
        super::super::index::Placement {
            hash: e.hash,
            id: e.id,
            body_offset: e.body_offset,
            body_len: e.body_len,
            body_checksum: 0,
            foreign: None,
        }
    }
}
