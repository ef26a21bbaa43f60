//! Which entry leaves when the cache is full: a policy behind a small trait, told of every
//! insert, use and removal, asked for the next victim. [`Lru`] (least recently used) is the one
//! policy today; a size-aware policy or TinyLFU's admission filter would go here as a second
//! implementation without touching the index, the disk layout or the data plane.
//!
//! Policies work on the index's slot numbers (`u32`, dense from 0), not on hashes, so their
//! state is a flat array beside the slots: [`Lru`] costs 8 bytes per entry, where a linked hash
//! map of hashes cost about 100 (a table bucket plus a heap node per entry).

/// An eviction policy over the index's slots. The index calls it under its lock, so every method
/// must be O(1) (amortised) and never block.
pub(crate) trait Eviction: Send {
    /// `slot` was filled (or refilled, its entry replaced by one with the same hash) with an
    /// entry of `size` bytes on disk.
    fn inserted(&mut self, slot: u32, size: u64);
    /// `slot` was filled by the start-up load from a file stored before this process started:
    /// older than anything stored or used since.
    fn loaded(&mut self, slot: u32, size: u64);
    /// `slot`'s entry was served: a use.
    fn used(&mut self, slot: u32);
    /// `slot` was emptied (purged, replaced by nothing, found gone or corrupt).
    fn removed(&mut self, slot: u32);
    /// The next slot to evict, taken out of the policy's own bookkeeping; `None` when empty.
    fn victim(&mut self) -> Option<u32>;
    /// Every slot the policy holds, the next victim first: the order a snapshot keeps, so
    /// filling a new policy with [`Eviction::inserted`] in it rebuilds the same one.
    fn oldest_first(&self) -> Vec<u32>;
}

/// No slot: the end of a list.
const NIL: u32 = u32::MAX;

/// Least recently used: a hit moves its entry to the front, the back leaves first. A doubly
/// linked list threaded through an array indexed by slot.
pub(crate) struct Lru {
    /// Per slot: (previous, next) towards the back and the front; (NIL, NIL) for a slot not in
    /// the list (an unlinked slot is also told apart by not being `front`).
    links: Vec<(u32, u32)>,
    /// Most recently used.
    front: u32,
    /// Least recently used: the next victim.
    back: u32,
}

impl Lru {
    /// An empty policy.
    pub(crate) fn new() -> Lru {
        Lru {
            links: Vec::new(),
            front: NIL,
            back: NIL,
        }
    }

    fn linked(&self, slot: u32) -> bool {
        self.links
            .get(slot as usize)
            .is_some_and(|&(p, n)| p != NIL || n != NIL || self.front == slot)
    }

    fn unlink(&mut self, slot: u32) {
        if !self.linked(slot) {
            return;
        }
        let (prev, next) = self.links[slot as usize];
        match prev {
            NIL => self.back = next,
            p => self.links[p as usize].1 = next,
        }
        match next {
            NIL => self.front = prev,
            n => self.links[n as usize].0 = prev,
        }
        self.links[slot as usize] = (NIL, NIL);
    }

    fn push_back(&mut self, slot: u32) {
        self.grow(slot);
        self.links[slot as usize] = (NIL, self.back);
        match self.back {
            NIL => self.front = slot,
            b => self.links[b as usize].0 = slot,
        }
        self.back = slot;
    }

    fn grow(&mut self, slot: u32) {
        let i = slot as usize;
        if self.links.len() <= i {
            self.links.resize(i + 1, (NIL, NIL));
        }
    }

    fn push_front(&mut self, slot: u32) {
        let i = slot as usize;
        self.grow(slot);
        self.links[i] = (self.front, NIL);
        match self.front {
            NIL => self.back = slot,
            f => self.links[f as usize].1 = slot,
        }
        self.front = slot;
    }
}

impl Eviction for Lru {
    fn inserted(&mut self, slot: u32, _size: u64) {
        self.unlink(slot);
        self.push_front(slot);
    }

    fn loaded(&mut self, slot: u32, _size: u64) {
        self.unlink(slot);
        self.push_back(slot);
    }

    fn used(&mut self, slot: u32) {
        if self.linked(slot) && self.front != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    fn removed(&mut self, slot: u32) {
        self.unlink(slot);
    }

    fn oldest_first(&self) -> Vec<u32> {
        // Sized once: it runs under the store's lock for the snapshot.
        let mut out = Vec::with_capacity(self.links.len());
        let mut at = self.back;
        while at != NIL {
            out.push(at);
            at = self.links[at as usize].1;
        }
        out
    }

    fn victim(&mut self) -> Option<u32> {
        let v = self.back;
        if v == NIL {
            return None;
        }
        self.unlink(v);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_leaves_first() {
        let mut p = Lru::new();
        for s in 1..=3 {
            p.inserted(s, 10);
        }
        p.used(1);
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), Some(3));
        assert_eq!(p.victim(), Some(1));
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn a_removed_slot_is_never_a_victim_and_refilling_counts_as_new() {
        let mut p = Lru::new();
        p.inserted(1, 10);
        p.inserted(2, 10);
        p.removed(1);
        p.inserted(3, 10);
        // Refilling 2 makes it the most recent.
        p.inserted(2, 20);
        assert_eq!(p.victim(), Some(3));
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), None);
        // Using or removing an unknown or emptied slot is harmless.
        p.used(9);
        p.removed(9);
        p.used(2);
        p.removed(2);
        assert_eq!(p.victim(), None);
        // A slot number emptied and filled again goes to the front like any other.
        p.inserted(0, 1);
        p.inserted(2, 1);
        p.used(0);
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), Some(0));
    }

    #[test]
    fn what_the_start_up_load_finds_leaves_before_anything_stored_since() {
        let mut p = Lru::new();
        p.inserted(1, 10);
        p.loaded(2, 10);
        p.loaded(3, 10);
        p.inserted(4, 10);
        // Used since the start: no longer the oldest.
        p.used(2);
        assert_eq!(p.victim(), Some(3));
        assert_eq!(p.victim(), Some(1));
        assert_eq!(p.victim(), Some(4));
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), None);
        p.loaded(5, 1);
        assert_eq!(p.victim(), Some(5));
    }

    #[test]
    fn the_order_written_down_rebuilds_the_same_policy() {
        let mut p = Lru::new();
        for s in [4, 1, 7, 2] {
            p.inserted(s, 1);
        }
        p.used(1);
        p.loaded(9, 1);
        let order = p.oldest_first();
        assert_eq!(order, [9, 4, 7, 2, 1]);
        let mut q = Lru::new();
        for &s in &order {
            q.inserted(s, 1);
        }
        assert_eq!(q.oldest_first(), order);
        assert_eq!(q.victim(), Some(9));
    }
}
