//! Each URL's Vary field names (RFC 9111 §4.1), by its primary key's hash: what a lookup
//! needs to build the secondary key before it can find a variant, and what a marker file names
//! on disk (`store::marker`). The lists are interned (most URLs of a site vary on the same one or
//! two fields), and lists no URL uses are swept, so origins inventing lists cannot grow the set.

use super::*;

impl<E: Eviction> Index<E> {
    /// Forgets the fields the responses under primary key hash `primary` vary on (once a purge
    /// took them all), and unindexes its marker; returns the marker, whose file is to go.
    pub(crate) fn forget_vary(&mut self, primary: u128) -> Option<Located> {
        self.vary.remove(&primary);
        let i = self.slot_of(primary)?;
        if self.slots[i as usize].flags & MARKER == 0 {
            return None;
        }
        self.policy.removed(i);
        Some(self.free_slot(i))
    }

    /// Whether the marker under primary key hash `primary` names exactly `names`.
    pub(crate) fn marks(&self, primary: u128, names: &[String]) -> bool {
        self.slot_of(primary)
            .is_some_and(|i| self.slots[i as usize].flags & MARKER != 0)
            && self.vary.get(&primary).is_some_and(|l| **l == *names)
    }

    /// The fields the responses under primary key hash `primary` vary on, if they do.
    #[cfg(test)]
    pub(crate) fn varies_on(&self, primary: u128) -> Option<Arc<[String]>> {
        self.vary.get(&primary).cloned()
    }

    /// The shared copy of the field-name list `names`. Lists no URL uses any more are dropped
    /// when the set has doubled since the last sweep, so hostile origins inventing lists cannot
    /// grow it past twice what the index uses.
    pub(super) fn intern(&mut self, names: &[String]) -> Arc<[String]> {
        if let Some(l) = self.vary_lists.get(names) {
            return l.clone();
        }
        if self.vary_lists.len() >= 64 && self.vary_lists.len() >= 2 * self.vary.len() {
            self.vary_lists.retain(|l| Arc::strong_count(l) > 1);
        }
        let l: Arc<[String]> = names.into();
        self.vary_lists.insert(l.clone());
        l
    }
}
