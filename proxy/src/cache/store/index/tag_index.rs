//! Cache tags in the index: each tag's hash names the slots of the entries that carry it, and
//! each tagged slot its tags' hashes, so a purge by tag is one lookup and an entry that leaves
//! takes its tags with it. A hash names candidates only where text must match; a tag purge
//! takes every entry its hash names (a collision of 128-bit hashes is not a practical case).

use super::*;

impl<E: Eviction> Index<E> {
    /// Every entry tagged `tag`.
    pub(crate) fn entries_of_tag(&self, tag: &str) -> Vec<Located> {
        self.by_tag
            .get(&xxh3_128(tag.as_bytes()))
            .into_iter()
            .flatten()
            .map(|&i| self.located(i))
            .collect()
    }

    /// Unindexes every entry tagged `tag`; returns them.
    pub(crate) fn purge_tag(&mut self, tag: &str) -> Vec<Located> {
        let slots = self
            .by_tag
            .remove(&xxh3_128(tag.as_bytes()))
            .unwrap_or_default();
        let mut gone = Vec::with_capacity(slots.len());
        for i in slots {
            if self.slots[i as usize].flags & FREE == 0 {
                self.policy.removed(i);
                gone.push(self.free_slot(i));
            }
        }
        gone
    }

    /// (distinct tags, tag-entry pairs) indexed.
    #[cfg(test)]
    pub(crate) fn tag_counts(&self) -> (usize, usize) {
        (
            self.by_tag.len(),
            self.by_tag.values().map(HashSet::len).sum(),
        )
    }

    /// Indexes the tags `meta` carries for slot `i`.
    pub(super) fn tags_add(&mut self, i: u32, meta: &Meta) {
        let tags = self.tag_field.parse(&meta.fields);
        if tags.is_empty() {
            return;
        }
        let hashes: Box<[u128]> = tags.iter().map(|t| xxh3_128(t.as_bytes())).collect();
        for &t in hashes.iter() {
            self.by_tag.entry(t).or_default().insert(i);
        }
        self.tags_of.insert(i, hashes);
        self.slots[i as usize].flags |= TAGGED;
    }

    /// Unindexes slot `i`'s tags.
    pub(super) fn tags_remove(&mut self, i: u32) {
        if self.slots[i as usize].flags & TAGGED == 0 {
            return;
        }
        self.slots[i as usize].flags &= !TAGGED;
        let Some(tags) = self.tags_of.remove(&i) else {
            return;
        };
        for t in tags.iter() {
            if let Some(v) = self.by_tag.get_mut(t) {
                v.remove(&i);
                if v.is_empty() {
                    self.by_tag.remove(t);
                }
            }
        }
    }
}
