//! Sliced objects in the index (`cache::slice`): per URL (its hash, which every slice of an
//! object is stored under), how many of its slices are indexed and how many it has, so
//! `/metrics` says how many objects are cached in part without reading a file. A slice is known
//! by its key when it is indexed, and its object's slice count by its stored `Content-Range`. A
//! snapshot keeps which slots are slices but not the objects' slice counts: after a hand-over an
//! object counts as in part only once a slice of it is stored again. Variants of one URL (by
//! `cache_key.headers`) count as one object.

use super::*;

/// What the index knows of its sliced objects.
#[derive(Default)]
pub(crate) struct SliceObjects {
    /// Per URL hash: (slices indexed, slices the object has; 0 when not known).
    by_url: HashMap<u64, (u32, u32)>,
    /// Slices indexed, in all.
    slices: u64,
}

/// Sliced objects at a glance, for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SliceCensus {
    /// Objects with at least one slice indexed.
    pub objects: u64,
    /// Of those, objects known to have a slice that is not.
    pub partial: u64,
    /// Slices indexed.
    pub slices: u64,
}

/// The slices the object of slice entry `meta` has: its `Content-Range` total over the slice
/// size in its key (`\n:slice=S/k`); 0 when either cannot be read. `None` for an entry that is
/// no slice.
fn slices_of_object(meta: &Meta) -> Option<u32> {
    let at = meta.key.rfind("\n:slice=")?;
    let size: u64 = meta.key[at + 8..]
        .split('/')
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s > 0)?;
    let total = crate::http::stored_fields::StoredFields(&meta.fields)
        .lines()
        .find(|l| l.name.eq_ignore_ascii_case("content-range"))
        .and_then(|l| std::str::from_utf8(l.value).ok())
        .and_then(crate::cache::slice::parse_content_range)
        .map(|(_, _, t)| t);
    Some(total.map_or(0, |t| u32::try_from(t.div_ceil(size)).unwrap_or(u32::MAX)))
}

impl<E: Eviction> Index<E> {
    /// Counts slot `i` among its object's slices when `meta` is a slice's.
    pub(super) fn slices_add(&mut self, i: u32, meta: &Meta) {
        let Some(count) = slices_of_object(meta) else {
            return;
        };
        let s = &mut self.slots[i as usize];
        s.flags |= SLICE;
        let o = self.sliced.by_url.entry(s.url).or_default();
        o.0 += 1;
        if count > 0 {
            o.1 = count;
        }
        self.sliced.slices += 1;
    }

    /// Counts a slice slot a snapshot restored (its object's slice count unknown).
    pub(super) fn slice_restored(&mut self, url: u64) {
        self.sliced.by_url.entry(url).or_default().0 += 1;
        self.sliced.slices += 1;
    }

    /// Slot `i` leaves the index: out of its object's slices if it is one.
    pub(super) fn slices_remove(&mut self, i: u32) {
        let s = self.slots[i as usize];
        if s.flags & SLICE == 0 {
            return;
        }
        self.sliced.slices -= 1;
        if let Some(o) = self.sliced.by_url.get_mut(&s.url) {
            o.0 -= 1;
            if o.0 == 0 {
                self.sliced.by_url.remove(&s.url);
            }
        }
    }

    /// Sliced objects, those in part, and slices.
    pub(crate) fn slice_census(&self) -> SliceCensus {
        SliceCensus {
            objects: self.sliced.by_url.len() as u64,
            partial: self
                .sliced
                .by_url
                .values()
                .filter(|(n, of)| *of > 0 && n < of)
                .count() as u64,
            slices: self.sliced.slices,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::store::eviction::Lru;
    use std::time::{Duration, SystemTime};

    /// Slice `k` of an object of `total` bytes in slices of 4, under `url`.
    fn slice(ix: &mut Index<Lru>, url: &str, k: u64, total: u64) -> Located {
        let key = format!("GET {url}\n:slice=4/{k}");
        let m = Meta {
            key: key.clone(),
            stored_at: SystemTime::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            status: 206,
            reason: "Partial Content".into(),
            fields: format!(
                "ETag: \"e\"\r\nContent-Range: bytes {}-{}/{total}\r\n",
                k * 4,
                (k * 4 + 3).min(total - 1)
            )
            .into_bytes(),
            vary: Vec::new(),
            url: format!("GET {url}"),
        };
        let at = Located {
            hash: CacheKey::from_text(key, 128).hash,
            id: crate::cache::entry::next_id(),
            body_offset: 4096,
            body_len: 4,
            body_checksum: 1,
            foreign: None,
        };
        ix.insert(&m, at.clone(), 0, None);
        at
    }

    #[test]
    fn objects_in_part_and_whole_and_through_a_snapshot() {
        let mut ix = Index::new(Lru::new(), 16);
        let census = |ix: &Index<Lru>| {
            let c = ix.slice_census();
            (c.objects, c.partial, c.slices)
        };
        // A 10-byte object is 3 slices of 4; another of 8 bytes is 2.
        slice(&mut ix, "http://h/a", 0, 10);
        slice(&mut ix, "http://h/b", 1, 8);
        assert_eq!(census(&ix), (2, 2, 2));
        slice(&mut ix, "http://h/a", 1, 10);
        let last = slice(&mut ix, "http://h/a", 2, 10);
        // The same slice again replaces itself: still three.
        slice(&mut ix, "http://h/a", 2, 10);
        assert_eq!(census(&ix), (2, 1, 4));
        // An entry that is no slice is not counted.
        let plain = Meta {
            key: "GET http://h/c".into(),
            ..ix_meta()
        };
        ix.insert(
            &plain,
            Located {
                hash: 99,
                id: 1,
                body_offset: 4096,
                body_len: 1,
                body_checksum: 0,
                foreign: None,
            },
            0,
            None,
        );
        assert_eq!(census(&ix), (2, 1, 4));
        // Through a snapshot the slices stay; the counts are learned again.
        let bytes = ix.snapshot(b"h");
        let mut back = Index::new(Lru::new(), 16);
        back.restore(&bytes, b"h").expect("restore");
        assert_eq!(census(&back), (2, 0, 4));
        slice(&mut back, "http://h/b", 0, 8);
        assert_eq!(census(&back), (2, 0, 5));
        // Evicted or purged, a slice leaves its object; its last one, the object.
        assert!(ix.take(last.hash).is_some());
        assert_eq!(census(&ix), (2, 2, 3));
        for _ in 0..10 {
            if let Some(i) = ix.policy.victim() {
                ix.free_slot(i);
            }
        }
        assert_eq!(census(&ix), (0, 0, 0));
    }

    fn ix_meta() -> Meta {
        Meta {
            key: String::new(),
            stored_at: SystemTime::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            status: 200,
            reason: "OK".into(),
            fields: Vec::new(),
            vary: Vec::new(),
            url: "GET http://h/c".into(),
        }
    }
}
