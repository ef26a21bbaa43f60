//! The in-memory index of the cache, kept to what a lookup, eviction and accounting need: per
//! object one 56-byte [`Slot`] (the key's hash, where the body is, its size and checksum, the
//! URL's hash, a few flags) in a slab, found through a table of 4-byte slot numbers, and the
//! eviction policy's 8 bytes. Everything else a hit needs (the key text, the stored fields, the
//! validators) stays in the entry file, read with one `pread` of its head when the entry is not
//! among the bounded set of hot entries kept whole ([`Index::lookup`] says which). The index kept
//! each whole entry once, 1.3 KB an object; an edge node holds tens of millions.
//!
//! Secondary indexes are by fixed-size hashes, never strings: the request fields each URL's
//! responses vary on (RFC 9111 §4.1) by the primary key's hash, each URL's entries by the URL's
//! hash (a second table over the same slots), each cache tag's entries by the tag's hash
//! ([`crate::cache::tags`]). A hash names candidates; the caller that must be exact (a lookup,
//! a purge by URL) compares the text read from the file, so a collision is a miss, never another
//! URL's body. It does no I/O: whatever leaves it is returned to the caller, which deletes files
//! outside the lock. Which entry leaves when the cache is full is the [`Eviction`] policy's choice.

use super::eviction::Eviction;
use super::tombstones::{Tombstone, Tombstones};
use crate::cache::entry::{Entry, Meta};
use crate::cache::key::CacheKey;
use crate::cache::tags::TagField;
use crate::cache::variance::primary_text;
use hashbrown::HashTable;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

mod encoding;
mod found;
mod hot;
pub(crate) use encoding::seal;
pub(crate) use found::{Found, Loaded, Located};
use hot::HotEntries;
mod slice_objects;
pub(crate) use slice_objects::SliceCensus;
use slice_objects::SliceObjects;
mod tag_index;
mod vary_names;

/// One indexed object: 56 bytes (the hash split in two words keeps the alignment at 8).
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    hash_lo: u64,
    hash_hi: u64,
    /// The identity of the entry this slot holds ([`Entry::id`]): a replaced, purged or evicted
    /// entry is told from the current one by it.
    id: u64,
    body_len: u64,
    body_checksum: u64,
    /// xxh3-64 of `Meta::url`: the URL table's key.
    url: u64,
    body_offset: u32,
    flags: u8,
}

/// Bytes of a slot in a snapshot, tags aside.
const SNAP_SLOT: usize = 47;

/// An empty slot, on the free list.
const FREE: u8 = 1;
/// The file is not where the layout puts its hash (an older `levels`): its path is in
/// `Index::foreign`.
const FOREIGN: u8 = 2;
/// The entry has tags (`Index::tags_of`).
const TAGGED: u8 = 4;
/// Not a response: the marker at a varying URL's primary hash (`store::marker`). Never served,
/// not counted among the entries, evicted like one when its URL is no longer asked for.
const MARKER: u8 = 8;
/// A slice of a sliced object (`cache::slice`): counted in `Index::sliced`.
const SLICE: u8 = 16;

impl Slot {
    fn hash(&self) -> u128 {
        u128::from(self.hash_hi) << 64 | u128::from(self.hash_lo)
    }

    fn disk_size(&self) -> u64 {
        u64::from(self.body_offset) + self.body_len
    }
}

/// The index, under the store's one mutex.
pub(crate) struct Index<E: Eviction> {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slot numbers by the entry's hash.
    by_hash: HashTable<u32>,
    /// Slot numbers by the URL's hash (every variant of a URL shares it).
    by_url: HashTable<u32>,
    policy: E,
    bytes: u64,
    len: u64,
    /// Files not where the layout puts them (found under an older `levels` at start-up).
    foreign: HashMap<u128, PathBuf>,
    /// The most recently used entries, whole: a hot hit reads nothing and keeps its file open.
    hot: HotEntries,
    /// Per primary key (by its hash, the name of its marker's file): the request fields its
    /// stored responses vary on. The lists are shared: most varying URLs vary on the same few
    /// fields.
    vary: HashMap<u128, Arc<[String]>>,
    vary_lists: HashSet<Arc<[String]>>,
    /// Which field names an entry's tags, and how.
    tag_field: TagField,
    /// Per tag (xxh3-128 of it): its entries' slots (a set: a popular tag may have most of the
    /// cache, and each eviction takes one out).
    by_tag: HashMap<u128, HashSet<u32>>,
    /// Per tagged slot: its tags' hashes (to unindex them when it goes).
    tags_of: HashMap<u32, Box<[u128]>>,
    tombstones: Tombstones,
    /// Sliced objects and their slices (`slice_objects.rs`).
    sliced: SliceObjects,
}

/// What is indexed for an entry besides its metadata: where and which it is.
pub(crate) type Placement = Located;

impl<E: Eviction> Index<E> {
    /// An empty index evicting by `policy`, keeping at most `hot` entries whole.
    pub(crate) fn new(policy: E, hot: usize) -> Index<E> {
        Index {
            slots: Vec::new(),
            free: Vec::new(),
            by_hash: HashTable::new(),
            by_url: HashTable::new(),
            policy,
            bytes: 0,
            len: 0,
            foreign: HashMap::new(),
            hot: HotEntries::new(hot),
            vary: HashMap::new(),
            vary_lists: HashSet::new(),
            tag_field: TagField::default(),
            by_tag: HashMap::new(),
            tags_of: HashMap::new(),
            tombstones: Tombstones::default(),
            sliced: SliceObjects::default(),
        }
    }

    /// `true` when the background load starts: purges are remembered until it ends (`false`).
    pub(crate) fn loading(&mut self, on: bool) {
        self.tombstones = Tombstones::default();
        self.tombstones.on = on;
    }

    /// Remembers a purge while loading; true if it is new (to be persisted too).
    pub(crate) fn tombstone(&mut self, t: Tombstone) -> bool {
        self.tombstones.on && self.tombstones.add(t)
    }

    fn purged_while_loading(&self, meta: &Meta) -> bool {
        self.tombstones
            .names(&meta.url, || self.tag_field.parse(&meta.fields))
    }

    /// Indexes a file the start-up load (or a request during it) read, unless its hash is
    /// indexed already or a purge since the start names it; as older than anything stored since.
    pub(crate) fn insert_loaded(&mut self, meta: &Meta, at: Placement, primary: u128) -> Loaded {
        if let Some(i) = self.slot_of(at.hash) {
            return Loaded::Present(self.located(i));
        }
        if self.purged_while_loading(meta) {
            return Loaded::Purged;
        }
        let hash = at.hash;
        // Whatever a request or a fill since the start said of the URL's Vary is newer than an
        // old file's.
        let names = self.vary.get(&primary).cloned();
        self.insert(meta, at, primary, None);
        if let Some(names) = names {
            self.vary.insert(primary, names);
        }
        if let Some(i) = self.slot_of(hash) {
            // Read back from a file stored before the start: oldest first (`Eviction::loaded`).
            let size = self.slots[i as usize].disk_size();
            self.policy.loaded(i, size);
        }
        Loaded::Indexed
    }

    /// Reads tags from `f` (`cache.tag_field`); set before anything is indexed.
    pub(crate) fn set_tag_field(&mut self, f: TagField) {
        self.tag_field = f;
    }

    fn slot_of(&self, hash: u128) -> Option<u32> {
        let slots = &self.slots;
        self.by_hash
            .find(hash as u64, |&i| slots[i as usize].hash() == hash)
            .copied()
    }

    fn located(&self, i: u32) -> Located {
        let s = &self.slots[i as usize];
        Located {
            hash: s.hash(),
            id: s.id,
            body_offset: u64::from(s.body_offset),
            body_len: s.body_len,
            body_checksum: s.body_checksum,
            foreign: (s.flags & FOREIGN != 0)
                .then(|| self.foreign.get(&s.hash()).cloned())
                .flatten(),
        }
    }

    /// The entry a request should get for `primary`: when the URL's responses vary, under the
    /// secondary key `variant` builds from the fields they vary on. A use, for eviction. A hot
    /// entry's full key is compared here; a cold one's is compared by the caller once read, so
    /// a hash collision is a miss either way, never another URL's body.
    pub(crate) fn lookup(
        &mut self,
        primary: &CacheKey,
        variant: impl FnOnce(&[String]) -> CacheKey,
    ) -> Option<Found> {
        // Borrowed, not cloned: this runs on every request, and a hot hit allocates nothing.
        let secondary = self.vary.get(&primary.hash).map(|names| variant(names));
        if secondary.is_some()
            && let Some(m) = self.slot_of(primary.hash)
        {
            // The marker is used while its URL is: it leaves only with a URL nobody asks for.
            self.policy.used(m);
        }
        let key = secondary.as_ref().unwrap_or(primary);
        let i = self.slot_of(key.hash)?;
        if self.slots[i as usize].flags & MARKER != 0 {
            return None;
        }
        self.policy.used(i);
        let id = self.slots[i as usize].id;
        match self.hot.get(&key.hash) {
            Some(e) if e.id == id => {
                return (e.meta.key == key.text).then(|| Found::Hot(e.clone()));
            }
            Some(_) => self.hot.remove(&key.hash),
            None => {}
        }
        // Read from its file next, with the variant's key it must hold (the caller has the primary).
        Some(Found::Cold(self.located(i), secondary))
    }

    /// Keeps `e`, just read from its file, among the hot entries if it is still the indexed one;
    /// the entry it displaces is released ([`Index::take_released`]).
    pub(crate) fn adopt(&mut self, e: Arc<Entry>) {
        if self.is_current(e.hash, e.id) {
            self.hot.keep(e);
        }
    }

    /// The hot entries that left the set since the last call (replaced, pushed out, purged,
    /// evicted): the store's guard drops them once the lock is released, since the last
    /// reference to an entry closes its file.
    pub(crate) fn take_released(&mut self) -> Vec<Arc<Entry>> {
        self.hot.take_released()
    }

    /// The entry under `hash`, without counting a use: hot, or where to read it.
    pub(crate) fn peek(&self, hash: u128) -> Option<Result<Arc<Entry>, Located>> {
        let i = self.slot_of(hash)?;
        let id = self.slots[i as usize].id;
        match self.hot.peek(&hash) {
            Some(e) if e.id == id => Some(Ok(e.clone())),
            _ => Some(Err(self.located(i))),
        }
    }

    /// Where the entry under `hash` is, without counting a use.
    pub(crate) fn locate(&self, hash: u128) -> Option<Located> {
        self.slot_of(hash).map(|i| self.located(i))
    }

    /// Every indexed entry's hash (markers are not entries).
    pub(crate) fn hashes(&self) -> Vec<u128> {
        self.slots
            .iter()
            .filter(|s| s.flags & (FREE | MARKER) == 0)
            .map(Slot::hash)
            .collect()
    }

    /// Up to `n` indexed entries from slot number `from` on, and the slot number to go on
    /// from (`None` at the end): a walk of the whole index a chunk at a time, without holding
    /// the lock for a million entries.
    pub(crate) fn chunk(&self, from: usize, n: usize) -> (Vec<Located>, Option<usize>) {
        let end = from.saturating_add(n).min(self.slots.len());
        let out = (from..end)
            .filter(|&i| self.slots[i].flags & (FREE | MARKER) == 0)
            .map(|i| self.located(i as u32))
            .collect();
        (out, (end < self.slots.len()).then_some(end))
    }

    /// Whether entry `id` is the one indexed under `hash` (not replaced, purged or evicted).
    pub(crate) fn is_current(&self, hash: u128, id: u64) -> bool {
        self.slot_of(hash)
            .is_some_and(|i| self.slots[i as usize].id == id)
    }

    /// Indexes the entry `at` with metadata `meta` under the primary key hash `primary` (the
    /// entry's own hash unless it is a variant), and, if given, keeps it whole among the hot
    /// entries; replaces (and returns) any entry with the same hash. A marker
    /// (`store::marker::is_marker`) is indexed as one.
    pub(crate) fn insert(
        &mut self,
        meta: &Meta,
        at: Placement,
        primary: u128,
        whole: Option<Arc<Entry>>,
    ) -> Option<Located> {
        let marker = super::marker::is_marker(meta);
        let old = self.take(at.hash);
        if !meta.vary.is_empty() {
            let names = self.intern(&meta.vary);
            self.vary.insert(primary, names);
        } else if primary_text(&meta.key).len() == meta.key.len() {
            // A response without Vary for this URL: it no longer varies.
            self.vary.remove(&primary);
        }
        let slot = Slot {
            hash_lo: at.hash as u64,
            hash_hi: (at.hash >> 64) as u64,
            id: at.id,
            body_len: at.body_len,
            body_checksum: at.body_checksum,
            url: xxh3_64(meta.url.as_bytes()),
            // A body offset is the header's length rounded up, and a header is at most 1 MiB
            // (`read_entry_header`), so it always fits.
            body_offset: u32::try_from(at.body_offset).unwrap_or(u32::MAX),
            flags: if at.foreign.is_some() { FOREIGN } else { 0 } | if marker { MARKER } else { 0 },
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        let slots = &self.slots;
        self.by_hash
            .insert_unique(at.hash as u64, i, |&j| slots[j as usize].hash_lo);
        self.by_url
            .insert_unique(slot.url, i, |&j| slots[j as usize].url);
        if let Some(p) = at.foreign {
            self.foreign.insert(at.hash, p);
        }
        self.bytes += slot.disk_size();
        self.len += u64::from(!marker);
        self.tags_add(i, meta);
        self.slices_add(i, meta);
        self.policy.inserted(i, slot.disk_size());
        if let Some(e) = whole {
            self.hot.keep(e);
        }
        old
    }

    /// Puts `updated` (the same file, with new metadata) in the place of entry `old_id` if the
    /// index still holds that entry.
    pub(crate) fn replace_if_same(&mut self, old_id: u64, updated: Arc<Entry>) {
        let Some(i) = self.slot_of(updated.hash) else {
            return;
        };
        if self.slots[i as usize].id != old_id {
            return;
        }
        self.slots[i as usize].id = updated.id;
        // A revalidation may bring new fields, tags among them.
        self.tags_remove(i);
        self.tags_add(i, &updated.meta);
        self.hot.keep(updated);
    }

    /// Unindexes `hash`; returns where its entry was.
    pub(crate) fn take(&mut self, hash: u128) -> Option<Located> {
        let i = self.slot_of(hash)?;
        self.policy.removed(i);
        Some(self.free_slot(i))
    }

    /// Unindexes entry `id` under `hash` if the index still holds it.
    pub(crate) fn take_if_same(&mut self, hash: u128, id: u64) -> Option<Located> {
        if self.is_current(hash, id) {
            self.take(hash)
        } else {
            None
        }
    }

    /// Empties slot `i` (already out of the policy) and everything that names it.
    fn free_slot(&mut self, i: u32) -> Located {
        let at = self.located(i);
        let s = self.slots[i as usize];
        if let Ok(e) = self.by_hash.find_entry(s.hash_lo, |&j| j == i) {
            e.remove();
        }
        if let Ok(e) = self.by_url.find_entry(s.url, |&j| j == i) {
            e.remove();
        }
        if s.flags & FOREIGN != 0 {
            self.foreign.remove(&s.hash());
        }
        self.tags_remove(i);
        self.slices_remove(i);
        self.hot.remove(&s.hash());
        self.bytes -= s.disk_size();
        if s.flags & MARKER != 0 {
            // Its URL's variants can no longer be found by it: the next response names them.
            self.vary.remove(&s.hash());
        } else {
            self.len -= 1;
        }
        self.slots[i as usize] = Slot {
            flags: FREE,
            ..Slot::default()
        };
        self.free.push(i);
        at
    }

    /// Unindexes the policy's victims until `extra` more bytes fit under `max_size` and the
    /// entries number at most `max_entries`; returns them.
    pub(crate) fn evict_to_fit(
        &mut self,
        extra: u64,
        max_size: u64,
        max_entries: usize,
    ) -> Vec<Located> {
        let mut victims = Vec::new();
        while self.bytes + extra > max_size || self.len > max_entries as u64 {
            let Some(i) = self.policy.victim() else { break };
            if self
                .slots
                .get(i as usize)
                .is_some_and(|s| s.flags & FREE == 0)
            {
                victims.push(self.free_slot(i));
            }
        }
        victims
    }

    /// The entries indexed under the URL key text `url`'s hash (every variant of it, and any
    /// other URL with the same 64-bit hash: the caller compares the URL read from each file);
    /// not its marker.
    pub(crate) fn candidates_of_url(&self, url: &str) -> Vec<Located> {
        let slots = &self.slots;
        let h = xxh3_64(url.as_bytes());
        self.by_url
            .iter_hash(h)
            .filter(|&&i| slots[i as usize].url == h && slots[i as usize].flags & MARKER == 0)
            .map(|&i| self.located(i))
            .collect()
    }

    /// Whether `hash` is indexed (an entry or a marker).
    pub(crate) fn contains(&self, hash: u128) -> bool {
        self.slot_of(hash).is_some()
    }

    /// (bytes on disk, entries).
    pub(crate) fn usage(&self) -> (u64, u64) {
        (self.bytes, self.len)
    }

    /// Entries kept whole.
    #[cfg(test)]
    pub(crate) fn hot_len(&self) -> usize {
        self.hot.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::store::eviction::Lru;
    use crate::cache::targeted::Targeted;
    use crate::cache::variance::SEPARATOR;
    use std::time::{Duration, SystemTime};

    fn meta(key: &str, url: &str, vary: &[&str], fields: &str) -> Meta {
        Meta {
            key: key.to_string(),
            stored_at: SystemTime::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            status: 200,
            reason: "OK".into(),
            fields: fields.as_bytes().to_vec(),
            vary: vary.iter().map(|s| s.to_string()).collect(),
            url: url.to_string(),
        }
    }

    /// Indexes `key` (under `url`) with `body_len` body bytes after a 4 KiB head; the index
    /// never touches a file. Returns the placement, whose id tells this entry from a later one.
    fn put(ix: &mut Index<Lru>, key: &str, url: &str, vary: &[&str], body_len: u64) -> Located {
        put_meta(ix, meta(key, url, vary, ""), body_len)
    }

    fn put_meta(ix: &mut Index<Lru>, m: Meta, body_len: u64) -> Located {
        let at = Located {
            hash: CacheKey::from_text(m.key.clone(), 128).hash,
            id: crate::cache::entry::next_id(),
            body_offset: 4096,
            body_len,
            body_checksum: 7,
            foreign: None,
        };
        let primary = key(primary_text(&m.key)).hash;
        ix.insert(&m, at.clone(), primary, None);
        at
    }

    fn key(text: &str) -> CacheKey {
        CacheKey::from_text(text.to_string(), 128)
    }

    /// Indexes `m` kept whole (as a fill's entry is); returns the whole entry.
    fn put_whole(ix: &mut Index<Lru>, m: &Meta) -> Arc<Entry> {
        let whole = Arc::new(Entry::new(
            key(&m.key).hash,
            m.clone(),
            "/nonexistent".into(),
            4096,
            1,
            &Targeted::default(),
        ));
        let at = Located {
            hash: whole.hash,
            id: whole.id,
            body_offset: 4096,
            body_len: 1,
            body_checksum: 0,
            foreign: None,
        };
        ix.insert(m, at, key(&m.key).hash, Some(whole.clone()));
        whole
    }

    #[test]
    fn a_slot_is_56_bytes() {
        // What an object costs the index (with the policy's 8 bytes and the tables' 4-byte slot
        // numbers): `cargo xtask bench --index` measures the whole process's RSS per object.
        assert_eq!(std::mem::size_of::<Slot>(), 56);
    }

    #[test]
    fn insert_counts_bytes_and_replacing_does_not_double_them() {
        let mut ix = Index::new(Lru::new(), 16);
        let a = put(&mut ix, "GET http://h/a", "GET http://h/a", &[], 100);
        assert_eq!(ix.usage(), (4196, 1));
        let a2 = put(&mut ix, "GET http://h/a", "GET http://h/a", &[], 10);
        assert_eq!(ix.usage(), (4106, 1));
        assert!(ix.is_current(a2.hash, a2.id) && !ix.is_current(a.hash, a.id));
        assert!(
            ix.take_if_same(a.hash, a.id).is_none(),
            "a replaced entry is not taken"
        );
        assert_eq!(ix.take_if_same(a2.hash, a2.id), Some(a2));
        assert_eq!(ix.usage(), (0, 0));
        assert!(ix.hashes().is_empty());
    }

    #[test]
    fn eviction_follows_use_and_both_bounds() {
        let mut ix = Index::new(Lru::new(), 16);
        let keys = ["GET http://h/1", "GET http://h/2", "GET http://h/3"];
        for k in keys {
            put(&mut ix, k, k, &[], 904); // 5,000 bytes each on disk
        }
        assert!(ix.lookup(&key(keys[0]), |_| unreachable!()).is_some());
        // Room for 6,000 more bytes under 20,000: one entry goes, the least recently used (/2).
        let gone = ix.evict_to_fit(6000, 20_000, 10);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].hash, key(keys[1]).hash);
        // At most one entry: /3 (older than the used /1) goes.
        let gone = ix.evict_to_fit(0, u64::MAX, 1);
        assert_eq!(
            gone.iter().map(|g| g.hash).collect::<Vec<_>>(),
            [key(keys[2]).hash]
        );
        assert_eq!(ix.usage(), (5000, 1));
        assert_eq!(ix.hashes(), [key(keys[0]).hash]);
        // A freed slot is used again, and the entry in it is evicted like any other.
        put(&mut ix, "GET http://h/4", "GET http://h/4", &[], 904);
        assert_eq!(ix.slots.len(), 3, "a free slot is reused");
        let gone = ix.evict_to_fit(0, 5000, 10);
        assert_eq!(gone[0].hash, key(keys[0]).hash);
    }

    #[test]
    fn a_varying_url_is_found_by_its_variant_and_its_entries_by_its_hash() {
        let mut ix = Index::new(Lru::new(), 16);
        let url = "GET http://h/v";
        for lang in ["en", "fr"] {
            let k = format!("{url}{SEPARATOR}accept-language={lang}");
            put(&mut ix, &k, url, &["accept-language"], 1);
        }
        let fr = format!("{url}{SEPARATOR}accept-language=fr");
        let found = ix.lookup(&key(url), |names| {
            assert_eq!(names, ["accept-language"]);
            key(&fr)
        });
        match found {
            Some(Found::Cold(at, Some(k))) => {
                assert_eq!(k.text, fr);
                assert_eq!(at.hash, key(&fr).hash);
            }
            _ => panic!("the fr variant, to read"),
        }
        // A variant nobody stored is a miss, not the primary.
        let de = ix.lookup(&key(url), |_| {
            key(&format!("{url}{SEPARATOR}accept-language=de"))
        });
        assert!(de.is_none());
        assert_eq!(ix.candidates_of_url(url).len(), 2);
        assert!(ix.candidates_of_url("GET http://h/w").is_empty());
        // The two share one list of names.
        assert_eq!(ix.vary_lists.len(), 1);
        assert!(ix.forget_vary(key(url).hash).is_none(), "no marker");
        assert!(ix.varies_on(key(url).hash).is_none());
    }

    #[test]
    fn an_old_file_the_load_reaches_does_not_override_the_vary_names_stored_since() {
        let mut ix = Index::new(Lru::new(), 16);
        let url = "GET http://h/v";
        put(
            &mut ix,
            &format!("{url}{SEPARATOR}accept-encoding=br"),
            url,
            &["accept-encoding"],
            1,
        );
        ix.loading(true);
        let old = meta(
            &format!("{url}{SEPARATOR}accept-language=fr"),
            url,
            &["accept-language"],
            "",
        );
        let at = Located {
            hash: key(&old.key).hash,
            id: crate::cache::entry::next_id(),
            body_offset: 4096,
            body_len: 1,
            body_checksum: 0,
            foreign: None,
        };
        assert_eq!(ix.insert_loaded(&old, at, key(url).hash), Loaded::Indexed);
        assert_eq!(
            ix.varies_on(key(url).hash).as_deref(),
            Some(&["accept-encoding".to_string()][..])
        );
        // A purge during the load names it: not indexed.
        assert!(ix.tombstone(Tombstone::url(url)));
        assert!(!ix.tombstone(Tombstone::url(url)), "once");
        let again = meta(&format!("{url}{SEPARATOR}x"), url, &[], "");
        let at = Located {
            hash: key(&again.key).hash,
            id: crate::cache::entry::next_id(),
            body_offset: 4096,
            body_len: 1,
            body_checksum: 0,
            foreign: None,
        };
        assert_eq!(ix.insert_loaded(&again, at, key(url).hash), Loaded::Purged);
        ix.loading(false);
        assert!(
            !ix.tombstone(Tombstone::url(url)),
            "remembered only while loading"
        );
    }

    #[test]
    fn a_hot_entry_with_another_key_is_a_miss_and_a_stale_one_is_not_served() {
        let mut ix = Index::new(Lru::new(), 16);
        let m = meta("GET http://h/a", "GET http://h/a", &[], "");
        let whole = put_whole(&mut ix, &m);
        assert!(
            matches!(ix.lookup(&key(&m.key), |_| unreachable!()), Some(Found::Hot(e)) if Arc::ptr_eq(&e, &whole))
        );
        // Another key text that (as a forged collision) carries the same hash.
        let mut other = key("GET http://h/b");
        other.hash = whole.hash;
        assert!(ix.lookup(&other, |_| unreachable!()).is_none());
        // Replaced by a fill not kept whole: the old whole entry is never served for it.
        put(&mut ix, &m.key, &m.url, &[], 2);
        assert!(
            matches!(ix.lookup(&key(&m.key), |_| unreachable!()), Some(Found::Cold(at, _)) if at.body_len == 2)
        );
        assert_eq!(ix.hot_len(), 0);
        // The replaced whole entry was released, to be dropped after the lock.
        let released = ix.take_released();
        assert_eq!(released.len(), 1);
        assert!(Arc::ptr_eq(&released[0], &whole));
        ix.adopt(whole);
        assert_eq!(ix.hot_len(), 0, "an entry no longer indexed is not kept");
        assert!(ix.take_released().is_empty());
    }

    #[test]
    fn hot_entries_are_bounded() {
        let mut ix = Index::new(Lru::new(), 2);
        for i in 0..5 {
            let k = format!("GET http://h/{i}");
            put_whole(&mut ix, &meta(&k, &k, &[], ""));
        }
        assert_eq!((ix.hot_len(), ix.usage().1), (2, 5));
        // An entry read back from its file takes the place of the least recently used one,
        // handed back to be dropped (its file closed) outside the lock.
        let m = meta("GET http://h/0", "GET http://h/0", &[], "");
        let Some(Found::Cold(at, _)) = ix.lookup(&key(&m.key), |_| unreachable!()) else {
            panic!("entry 0 is indexed, not hot");
        };
        let read = Arc::new(
            Entry::new(
                at.hash,
                m,
                "/nonexistent".into(),
                4096,
                1,
                &Targeted::default(),
            )
            .with_id(at.id),
        );
        // The three pushed out by the fills, then the one the read pushed out.
        let pushed: Vec<String> = ix
            .take_released()
            .iter()
            .map(|e| e.meta.key.clone())
            .collect();
        assert_eq!(
            pushed,
            ["GET http://h/0", "GET http://h/1", "GET http://h/2"]
        );
        ix.adopt(read);
        let gone: Vec<String> = ix
            .take_released()
            .iter()
            .map(|e| e.meta.key.clone())
            .collect();
        assert_eq!(gone, ["GET http://h/3"]);
        assert_eq!(ix.hot_len(), 2);
    }

    fn tagged(ix: &mut Index<Lru>, k: &str, tags: &str) -> Located {
        put_meta(
            ix,
            meta(k, k, &[], &format!("Surrogate-Key: {tags}\r\n")),
            10,
        )
    }

    #[test]
    fn tags_follow_their_entries_through_replace_purge_and_eviction() {
        let mut ix = Index::new(Lru::new(), 16);
        tagged(&mut ix, "GET http://h/a", "product:1 shop");
        let b = tagged(&mut ix, "GET http://h/b", "product:2 shop");
        assert_eq!(ix.entries_of_tag("shop").len(), 2);
        assert_eq!(ix.tag_counts(), (3, 4));
        // Replaced with other tags: the old ones no longer name it.
        tagged(&mut ix, "GET http://h/a", "product:9");
        assert_eq!(ix.entries_of_tag("product:1").len(), 0);
        assert_eq!(ix.entries_of_tag("shop").len(), 1);
        let gone = ix.purge_tag("shop");
        assert_eq!(gone, [b]);
        assert_eq!(ix.usage().1, 1);
        // Evicted: its tags go with it, nothing left behind.
        let victims = ix.evict_to_fit(0, 0, 0);
        assert_eq!(victims.len(), 1);
        assert_eq!(ix.tag_counts(), (0, 0));
    }

    /// The store writes a snapshot in parts (the buffer sized and touched before its lock, the
    /// body under it, the checksum after): the same bytes as whole, into a buffer of
    /// `snapshot_size` that never grows, whatever the buffer held before.
    #[test]
    fn a_snapshot_in_parts_is_the_snapshot_and_its_size_holds_it() {
        let mut ix = Index::new(Lru::new(), 16);
        // More bytes of tags (5 × 16) and of Vary names (52) than the freed slot leaves spare
        // (47): a size that left either out would be short.
        tagged(&mut ix, "GET http://h/a", "product:1 shop a b c");
        let url = "GET http://h/v";
        for lang in ["fr", "de"] {
            let k = format!("{url}{SEPARATOR}accept-language={lang}");
            put(&mut ix, &k, url, &["accept-language", "accept-encoding"], 1);
        }
        let gone = put(&mut ix, "GET http://h/gone", "GET http://h/gone", &[], 3);
        ix.take(gone.hash);
        let head = b"head";
        let whole = ix.snapshot(head);
        let size = ix.snapshot_size(head.len());
        let buf = vec![7u8; size];
        let body = ix.snapshot_body(head, buf);
        assert_eq!(body.capacity(), size, "never grown under the lock");
        // Exact but for the slack: the freed slot is not counted.
        assert_eq!(size - body.len() - 8, encoding::SIZE_SLACK * SNAP_SLOT);
        assert_eq!(seal(body), whole);
        // Restored, it is the same index: its entries, tags, Vary names and eviction order.
        let mut back = Index::new(Lru::new(), 16);
        assert_eq!(back.restore(&whole, head), Ok(3));
        assert_eq!(back.usage(), ix.usage());
        assert_eq!(back.entries_of_tag("shop").len(), 1);
        let names = |ix: &Index<Lru>| ix.vary.get(&key(url).hash).map(|n| n.to_vec());
        assert_eq!(
            names(&back),
            Some(vec!["accept-language".into(), "accept-encoding".into()])
        );
        let order = |ix: &Index<Lru>| -> Vec<u128> {
            let slots = ix.policy.oldest_first();
            slots.iter().map(|&i| ix.slots[i as usize].hash()).collect()
        };
        assert_eq!(order(&back), order(&ix));
    }

    /// The cost of 100,000 tagged entries: printed (`--nocapture`), not asserted (timing is for
    /// the bench); what is asserted is the count purged.
    #[test]
    fn a_hundred_thousand_tagged_entries() {
        let mut ix = Index::new(Lru::new(), 16);
        let started = std::time::Instant::now();
        for i in 0..100_000 {
            // Each in its product's tag, its category's (100 of them) and the site's.
            tagged(
                &mut ix,
                &format!("GET http://h/p/{i}"),
                &format!("product:{i} category:{} site", i % 100),
            );
        }
        let built = started.elapsed();
        assert_eq!(ix.tag_counts(), (100_101, 300_000));
        let started = std::time::Instant::now();
        assert_eq!(ix.purge_tag("category:7").len(), 1_000);
        let one_category = started.elapsed();
        let started = std::time::Instant::now();
        assert_eq!(ix.purge_tag("site").len(), 99_000);
        let the_site = started.elapsed();
        println!(
            "100,000 entries with 3 tags each: indexed in {built:?}; a 1,000-entry tag purged in {one_category:?}; the 99,000 left in {the_site:?}"
        );
    }
}
