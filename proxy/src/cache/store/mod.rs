//! The disk cache: one [`Store`] made of an in-memory [`index`] (with its [`eviction`] policy),
//! the files on disk ([`layout`], and the [`rebuild`] that reads them back at start-up), and the
//! open-file cache ([`open_files`]). `Store` keeps the promises that span them: a file is deleted
//! only after its entry left the index (outside the lock), an entry is dropped only when its file
//! is really gone (ENOENT), and a write failure degrades the cache to pass-through instead of
//! serving a torn entry.
//!
//! The index is one mutex. A lookup holds it for two hash probes (the entry, then its place in the
//! eviction order) and a list splice, far shorter than
//! anything else on the request path, and on 2 cores a sharded or lock-free map would buy nothing
//! measurable (see docs/benchmark.md). Files are deleted outside the lock.

mod eviction;
mod index;
mod index_lock;
mod layout;
mod load;
mod marker;
mod oversized;
mod snapshot;
mod tombstones;
pub(crate) use layout::{holds_entries, state_dir};
use tombstones::Tombstone;
mod open_files;
mod rebuild;
#[cfg(test)]
mod tests;

pub(crate) use open_files::{OpenFailure, open_files_budget};

use super::entry::{self, Entry};
use super::key::CacheKey;
use super::targeted::Targeted;
use eviction::Lru;
use index::{Found, Index, Located, Placement};
use index_lock::IndexLock;
use layout::Layout;
use open_files::OpenFiles;
use parking_lot::Mutex;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The disk cache.
pub struct Store {
    layout: Layout,
    max_size: u64,
    max_entries: usize,
    index: IndexLock,
    files: OpenFiles,
    /// False after a write failure: the cache degrades to pass-through until a write works again.
    writable: AtomicBool,
    /// A SIGUSR2 upgrade is under way: the successor indexes this directory, so this process
    /// stores and evicts nothing (see [`Store::hand_over`]).
    handing_over: AtomicBool,
    /// The tag field's name while it is hidden from clients (`cache.tag_field_forward: false`):
    /// fleet peers still get it, so their copies (`store_remote`) carry the tags a fleet purge
    /// by tag finds.
    hidden_tag_field: Option<String>,
    /// Writes that failed (disk full, permissions).
    pub write_errors: AtomicU64,
    /// Entries evicted to make room (size or entry limit), since start.
    pub evictions: AtomicU64,
    /// Entry heads read from their files because the entry was not kept whole (a cold hit, a
    /// purge, the scrub), since start.
    pub head_reads: AtomicU64,
    /// Entries discarded because their body no longer had its checksum (start-up verification,
    /// scrub), since start.
    pub corrupt_entries: AtomicU64,
    /// Where corrupt entries are also counted for `/metrics`, once the ledger exists (it is
    /// created after the rebuild); a mutex so no count is lost or doubled while it is attached.
    corrupt_sink: Mutex<Option<Arc<zerocache_ledger::Accounting>>>,
    /// The target list (RFC 9213) under which entries are read: which stored field governs
    /// reuse, and whether targeted fields reach clients. Fixed for the process's life, like the
    /// rest of `cache:` (a change takes effect on restart).
    targeted: Targeted,
    /// Keys whose last fill of unknown length ran past the size bound.
    oversized: oversized::Oversized,
    unsliced: oversized::Oversized,
    /// Bits of the key hashes (`debug.key_hash_bits`; 128 but in tests that force collisions),
    /// for the primary key hash a variant's marker is named by.
    hash_bits: u32,
    /// xxh3-64 of the tag field's settings, which a snapshot's tags were read under.
    tag_settings: u64,
    /// The index is loading in the background ([`Store::load_in_background`]).
    loading: AtomicBool,
    /// Entries the load has indexed.
    load_progress: AtomicU64,
}

/// What a purge names ([`Store::purging`]).
#[derive(Debug, Clone, Copy)]
pub enum Purging<'a> {
    /// A URL key text, every variant.
    Url(&'a str),
    /// Every URL key text starting with it.
    Prefix(&'a str),
    /// A cache tag.
    Tag(&'a str),
}

/// Sizes and shape of the store.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// Bytes of all files.
    pub max_size: u64,
    /// Entries in the index.
    pub max_entries: usize,
    /// Shard directory levels.
    pub levels: u8,
    /// Files kept open (already bounded by the fd limit: see [`open_files_budget`]).
    pub open_files: usize,
    /// Entries kept whole in memory (`cache.hot_entries`); the others are read from their
    /// file's head when hit.
    pub hot_entries: usize,
}

#[cfg(test)]
/// Counts from a start-up rebuild.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// Entries restored from the previous process's snapshot.
    pub restored: u64,
    /// Entries indexed.
    pub entries: u64,
    /// Files deleted because they were corrupt, torn or left by an interrupted fill (including
    /// `corrupt`).
    pub discarded: u64,
    /// Entries whose bodies were verified.
    pub verified: u64,
    /// Verified entries whose body did not have its checksum: deleted, and counted in
    /// [`Store::corrupt_entries`].
    pub corrupt: u64,
}

impl Store {
    /// Opens (creating) the cache directory; call [`Store::rebuild_verifying`] next.
    pub fn open(dir: &Path, limits: StoreLimits) -> io::Result<Store> {
        let layout = Layout::create(dir, limits.levels)?;
        Ok(Store {
            max_size: clamp_to_filesystem(dir, limits.max_size),
            layout,
            max_entries: limits.max_entries.max(1),
            index: IndexLock::new(Index::new(Lru::new(), limits.hot_entries)),
            files: OpenFiles::new(limits.open_files),
            writable: AtomicBool::new(true),
            handing_over: AtomicBool::new(false),
            hidden_tag_field: None,
            write_errors: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            head_reads: AtomicU64::new(0),
            corrupt_entries: AtomicU64::new(0),
            corrupt_sink: Mutex::new(None),
            targeted: Targeted::default(),
            oversized: Default::default(),
            unsliced: Default::default(),
            hash_bits: 128,
            tag_settings: 0,
            loading: AtomicBool::new(false),
            load_progress: AtomicU64::new(0),
        })
    }

    /// Key hashes of `bits` bits (`debug.key_hash_bits`); call before the rebuild.
    pub fn with_hash_bits(mut self, bits: u32) -> Store {
        self.hash_bits = bits.min(128);
        self
    }

    /// Keys whose last fill of unknown length ran past the size bound (`oversized`).
    pub(crate) fn oversized(&self) -> &oversized::Oversized {
        &self.oversized
    }

    /// Objects of sliced routes whose origin answered a slice request with something no slice
    /// is made of (a 200: no range support; a weak validator, `Vary`): served unsliced for a
    /// while instead of asking for a slice again on every request (`cache::slice`).
    pub(crate) fn unsliced(&self) -> &oversized::Oversized {
        &self.unsliced
    }

    /// Sets the target list (`cache.targeted_fields`, `cache.targeted_fields_forward`); call
    /// before the rebuild, which builds entries under it.
    pub fn with_targeted(mut self, targeted: Targeted) -> Store {
        self.targeted = targeted;
        self
    }

    /// Reads cache tags from `f` (`cache.tag_field`), hidden from clients unless it forwards
    /// them; call after [`Store::with_targeted`] and before the rebuild.
    pub fn with_tags(mut self, f: crate::cache::tags::TagField) -> Store {
        if !f.forward() {
            self.targeted = self.targeted.hiding(f.name());
            self.hidden_tag_field = Some(f.name().to_string());
        }
        self.tag_settings = xxhash_rust::xxh3::xxh3_64(format!("{f:?}").as_bytes());
        self.index.lock().set_tag_field(f);
        self
    }

    /// The target list entries are read under.
    pub fn targeted(&self) -> &Targeted {
        &self.targeted
    }

    /// The hashes of every indexed entry, in no particular order: what the scrub walks, looking
    /// each up again with [`Store::peek`] when its turn comes (so entries evicted meanwhile are
    /// neither kept alive nor read).
    pub fn hashes(&self) -> Vec<u128> {
        self.index.lock().hashes()
    }

    /// Whether an entry is indexed under `hash`: one lookup, no file read (its key text is not
    /// compared, so a collision says yes).
    pub fn contains(&self, hash: u128) -> bool {
        self.index.lock().peek(hash).is_some()
    }

    /// The entry indexed under `hash`, without making it more recently used (a scrub is not a use).
    pub fn peek(&self, hash: u128) -> Option<Arc<Entry>> {
        let at = match self.index.lock().peek(hash)? {
            Ok(e) => return Some(e),
            Err(at) => at,
        };
        self.load(&at)
    }

    /// Discards `e`, found corrupt, with [`Store::remove_if_same`] (a transfer in flight keeps its
    /// open file), and counts it. The index may hold a newer version of the same body (its
    /// header rewritten by a revalidation): that one goes too, since its body is these bytes; an
    /// entry refilled since keeps its place. True if an entry was removed.
    pub fn remove_corrupt(&self, e: &Arc<Entry>) -> bool {
        let Some(cur) = self.index.lock().locate(e.hash) else {
            return false;
        };
        let same_body = self.path_of(&cur) == e.path
            && cur.body_offset == e.body_offset
            && cur.body_len == e.body_len
            && cur.body_checksum == e.body_checksum;
        if !same_body || self.index.lock().take_if_same(cur.hash, cur.id).is_none() {
            return false;
        }
        let _ = fs::remove_file(&e.path);
        self.corrupt_found(1);
        true
    }

    /// Counts `n` corrupt entries, in [`Store::corrupt_entries`] and the attached accounting.
    pub fn corrupt_found(&self, n: u64) {
        let sink = self.corrupt_sink.lock();
        self.corrupt_entries.fetch_add(n, Ordering::Relaxed);
        if let Some(acc) = sink.as_ref() {
            acc.corrupt_entries_found(n);
        }
    }

    /// Counts corrupt entries in `acc` (`zerocache_cache_corrupt_entries_total`) from now on,
    /// starting with those the rebuild already found.
    pub fn attach_accounting(&self, acc: Arc<zerocache_ledger::Accounting>) {
        let mut sink = self.corrupt_sink.lock();
        acc.corrupt_entries_found(self.corrupt_entries.load(Ordering::Relaxed));
        *sink = Some(acc);
    }

    /// The entry a request should get for the URL key `primary`: when the URL's responses vary,
    /// under the secondary key `variant` builds from the fields they vary on. One lock for both
    /// steps, since this runs on every lookup. An entry that is not hot is read from its file's
    /// head (one `pread`, outside the lock) and made hot; its key must be the one looked up, so
    /// a hash collision is a miss.
    ///
    /// While the index loads, an entry it does not hold yet is looked for by the path its hash
    /// names (`Store::find_unindexed`).
    pub fn lookup_varying(
        &self,
        primary: &CacheKey,
        variant: impl Fn(&[String]) -> CacheKey,
    ) -> Option<Arc<Entry>> {
        // Bound first: a guard in the match's scrutinee would live through its arms.
        let indexed = self.index.lock().lookup(primary, &variant);
        let found = match indexed {
            Some(f) => f,
            None if self.is_loading() && self.find_unindexed(primary, &variant) => {
                self.index.lock().lookup(primary, &variant)?
            }
            None => return None,
        };
        let (at, key) = match found {
            Found::Hot(e) => return Some(e),
            Found::Cold(at, key) => (at, key),
        };
        let e = self.load(&at)?;
        if e.meta.key != key.as_ref().unwrap_or(primary).text {
            return None;
        }
        // What it pushes out is dropped (its file closed) after the unlock: `IndexGuard`.
        self.index.lock().adopt(e.clone());
        Some(e)
    }

    /// Rewrites `e`'s metadata (after a 304 updated its header fields) and indexes the updated
    /// entry in its place. The header is rewritten in the file when it still fits before the body
    /// (it nearly always does: the body starts at the next 4 KiB boundary); otherwise only the
    /// index is updated and the file keeps its older fields until the next fill.
    ///
    /// An entry the index no longer holds is left alone (returned as it is): its path may already
    /// belong to a newer fill's file, which the old header must never be written into. Callers
    /// hold the URL's fill lock, so no fill can replace the file between this check and the write.
    pub fn replace_meta(&self, e: &Arc<Entry>, meta: entry::Meta) -> Arc<Entry> {
        if !self.is_current(e) {
            return e.clone();
        }
        let encoded = meta.encode();
        // Handing the directory over: the file at this path may already be the successor's
        // (a refill of the key), and must not get this entry's header.
        if !self.is_handing_over() && entry::FIXED + encoded.len() <= e.body_offset as usize {
            let header =
                entry::encode_header_at(&encoded, e.body_len, e.body_offset, e.body_checksum);
            let written = std::fs::OpenOptions::new()
                .write(true)
                .open(&e.path)
                .and_then(|f| {
                    use std::os::unix::fs::FileExt;
                    f.write_all_at(&header, 0)
                });
            if let Err(err) = written {
                tracing::warn!(path = %e.path.display(), error = %err, "could not rewrite cache header after revalidation");
            }
        }
        let updated = Arc::new(
            Entry::new(
                e.hash,
                meta,
                e.path.clone(),
                e.body_offset,
                e.body_len,
                &self.targeted,
            )
            .with_body_checksum(e.body_checksum),
        );
        self.index.lock().replace_if_same(e.id, updated.clone());
        updated
    }

    /// An open handle on the entry's file, from the open-file cache when possible. Detects a file
    /// deleted underneath (`st_nlink == 0`, then ENOENT) and drops the entry; any other error
    /// leaves the entry indexed (see [`OpenFailure::of`] to tell them apart). Out of fds, it closes
    /// the open-file cache's idle files and tries once more before giving up.
    pub fn open_file(&self, e: &Arc<Entry>) -> io::Result<Arc<File>> {
        self.files.open(e).inspect_err(|err| {
            // Only a missing file means the entry is gone: out of fds, or denied, or an I/O
            // error, the file is most likely intact and the entry must survive.
            if OpenFailure::of(err) == OpenFailure::Gone {
                self.remove_if_same(e);
            }
        })
    }

    /// Path of the final file for `hash`, creating its shard directories.
    pub fn entry_path(&self, hash: u128) -> io::Result<PathBuf> {
        self.layout.entry_path(hash)
    }

    /// Files currently held open by the open-file cache.
    pub fn open_files(&self) -> usize {
        self.files.count()
    }

    /// A fresh temp file path (same filesystem, so the commit is a rename).
    pub fn temp_path(&self) -> PathBuf {
        self.layout.temp_path()
    }

    /// Indexes a committed entry, replacing any entry with the same hash, and evicts to fit.
    pub fn insert_entry(&self, e: Arc<Entry>) {
        let at = self.placement(
            &e.path,
            e.hash,
            e.id,
            e.body_offset,
            e.body_len,
            e.body_checksum,
        );
        let meta = &e.meta;
        self.index_at(meta, at, Some(e.clone()));
    }

    fn index_at(&self, meta: &entry::Meta, at: Placement, whole: Option<Arc<Entry>>) {
        let new_path = self.path_of(&at);
        let primary = self.primary_hash(&meta.key);
        let replaced = self.index.lock().insert(meta, at, primary, whole);
        // The old entry's file was replaced by rename; nothing to delete unless paths differ.
        if let Some(old) = replaced {
            let old_path = self.path_of(&old);
            if old_path != new_path {
                let _ = fs::remove_file(&old_path);
            }
        }
        self.evict_to_fit(0);
    }

    fn placement(
        &self,
        path: &Path,
        hash: u128,
        id: u64,
        body_offset: u64,
        body_len: u64,
        body_checksum: u64,
    ) -> Placement {
        Placement {
            hash,
            id,
            body_offset,
            body_len,
            body_checksum,
            foreign: (path != self.layout.entry_path_unchecked(hash)).then(|| path.to_path_buf()),
        }
    }

    /// Runs `write` (creating, reserving or writing a fill; idempotent, as positioned writes are)
    /// and, if the file system is full, evicts entries until `needed` bytes were freed and runs
    /// it once more. The file system can fill below `max_size`: other files share it, or the
    /// clamp at start-up could not see what it held.
    pub fn on_full_disk_evict_and_retry<T>(
        &self,
        needed: u64,
        mut write: impl FnMut() -> io::Result<T>,
    ) -> io::Result<T> {
        match write() {
            Err(e) if is_full(&e) && self.make_room(needed.max(1)) => write(),
            other => other,
        }
    }

    /// Evicts entries until `needed` bytes were freed or none is left; true if any went.
    fn make_room(&self, needed: u64) -> bool {
        if self.is_handing_over() {
            return false;
        }
        let (bytes, _) = self.usage();
        let victims = self
            .index
            .lock()
            .evict_to_fit(needed, bytes, self.max_entries);
        let n = victims.len();
        self.evictions.fetch_add(n as u64, Ordering::Relaxed);
        self.delete(&victims);
        if n > 0 {
            tracing::info!(
                evicted = n,
                needed,
                "file system full: evicted to make room"
            );
        }
        n > 0
    }

    /// Evicts entries (the policy's choice) until `extra` more bytes fit under `max_size`.
    pub fn evict_to_fit(&self, extra: u64) {
        if self.is_handing_over() {
            return;
        }
        let victims = self
            .index
            .lock()
            .evict_to_fit(extra, self.max_size, self.max_entries);
        self.evictions
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        self.delete(&victims);
    }

    /// Deletes the files of entries that left the index. A transfer in flight keeps its open fd;
    /// unlinking never cuts it short.
    fn delete(&self, gone: &[Located]) {
        for at in gone {
            let _ = fs::remove_file(self.path_of(at));
        }
    }

    /// Whether `e` is the entry the index holds for its hash (not replaced, purged or evicted).
    pub fn is_current(&self, e: &Arc<Entry>) -> bool {
        self.index.lock().is_current(e.hash, e.id)
    }

    /// Removes `e` from the index (and its file) if the index still holds this very entry;
    /// true if it did.
    pub fn remove_if_same(&self, e: &Arc<Entry>) -> bool {
        let removed = self.index.lock().take_if_same(e.hash, e.id).is_some();
        if removed {
            let _ = fs::remove_file(&e.path);
        }
        removed
    }

    /// Removes every entry of the URL key text `url` (all its variants) and deletes their files;
    /// returns how many went. Transfers in flight keep their open file and finish intact.
    ///
    /// The index names candidates by the URL's 64-bit hash; each one's URL is read from its file
    /// and decides. One that cannot be read now goes too: a purge must not leave what it names
    /// (at worst an unrelated entry sharing the hash is fetched again).
    pub fn purge_url(&self, url: &str) -> usize {
        // First, so the load cannot index one of them after the candidates are collected.
        self.tombstone(Tombstone::url(url));
        let candidates = self.index.lock().candidates_of_url(url);
        // The Vary names are kept per primary key, which is the URL's only on routes without
        // `cache_key.headers`: forget those of each purged entry's primary key, and its marker.
        let mut primaries = vec![self.primary_hash(url)];
        let mut gone = Vec::new();
        for at in candidates {
            match self.entry_of(&at) {
                Some(e) if e.meta.url != url => continue,
                Some(e) => primaries.push(self.primary_hash(&e.meta.key)),
                None => {}
            }
            gone.extend(self.index.lock().take_if_same(at.hash, at.id));
        }
        let n = gone.len();
        {
            let mut ix = self.index.lock();
            for p in primaries {
                gone.extend(ix.forget_vary(p));
            }
        }
        // Only what was taken: a fill may have replaced a candidate's file since it was read.
        self.delete(&gone);
        n
    }

    /// Whether `name` is the tag field hidden from clients (which a fleet peer still gets).
    pub fn is_hidden_tag_field(&self, name: &str) -> bool {
        self.hidden_tag_field
            .as_deref()
            .is_some_and(|t| name.eq_ignore_ascii_case(t))
    }

    /// The stored lines of the hidden tag field in `fields`, for a fleet peer's copy of the
    /// head (empty when the field is forwarded to everyone anyway, or absent).
    pub fn tag_lines_for_peer(&self, fields: &[u8]) -> Vec<u8> {
        let Some(name) = &self.hidden_tag_field else {
            return Vec::new();
        };
        crate::http::stored_fields::StoredFields(fields)
            .named(name)
            .flat_map(|l| l.raw.iter().copied())
            .collect()
    }

    /// Removes every entry tagged `tag` and deletes their files; returns how many went.
    pub fn purge_tag(&self, tag: &str) -> usize {
        self.tombstone(Tombstone::tag(tag));
        let gone = self.index.lock().purge_tag(tag);
        self.delete(&gone);
        gone.len()
    }

    /// Marks a purge (or soft purge) of `url`, every URL under `prefix`, or `tag` about to be
    /// made: while the index loads, the load deletes the files it names instead of indexing
    /// them (a soft purge of an entry the load has not reached is a purge). Nothing otherwise.
    pub fn purging(&self, what: Purging<'_>) {
        self.tombstone(match what {
            Purging::Url(u) => Tombstone::url(u),
            Purging::Prefix(p) => Tombstone::Prefix(p.to_string()),
            Purging::Tag(t) => Tombstone::tag(t),
        });
    }

    /// Remembers a purge while the index loads, in memory (the load then deletes what it names)
    /// and in the state directory (so does the next process's load, should this one stop, crash
    /// or hand over before its load is done).
    fn tombstone(&self, t: Tombstone) {
        if !self.is_loading() || !self.index.lock().tombstone(t.clone()) {
            return;
        }
        if let Err(e) = tombstones::persist(&state_dir(self.layout.dir()), &t) {
            tracing::warn!(error = %e, "could not keep a purge made during the index load; if this process stops before the load ends, the next may index what it purged");
        }
    }

    /// Every entry tagged `tag`, left in place (each read from its file unless hot).
    pub fn entries_of_tag(&self, tag: &str) -> Vec<Arc<Entry>> {
        let at = self.index.lock().entries_of_tag(tag);
        at.iter().filter_map(|a| self.entry_of(a)).collect()
    }

    /// The URL key texts that start with `prefix`. The index holds no key text, so this reads
    /// the head of every entry, [`PREFIX_SCAN_CHUNK`] at a time under the lock (a blocking walk
    /// of the whole cache: a prefix purge costs a read per stored object, measured by
    /// `cargo xtask bench --index`).
    pub fn urls_with_prefix(&self, prefix: &str) -> Vec<String> {
        let mut urls = std::collections::BTreeSet::new();
        let mut from = Some(0);
        while let Some(at) = from {
            let (chunk, next) = self.index.lock().chunk(at, PREFIX_SCAN_CHUNK);
            from = next;
            for at in &chunk {
                let Ok(f) = File::open(self.path_of(at)) else {
                    continue;
                };
                if let Ok(h) = entry::read_entry_head(&f, at.body_offset)
                    && h.meta.url.starts_with(prefix)
                {
                    urls.insert(h.meta.url);
                }
            }
        }
        urls.into_iter().collect()
    }

    /// Every entry (variant) of the URL key text `url`, left in place: the entries under the
    /// URL's hash whose file names this very URL.
    pub fn entries_of_url(&self, url: &str) -> Vec<Arc<Entry>> {
        let at = self.index.lock().candidates_of_url(url);
        at.iter()
            .filter_map(|a| self.entry_of(a))
            .filter(|e| e.meta.url == url)
            .collect()
    }

    /// (bytes on disk, entries).
    pub fn usage(&self) -> (u64, u64) {
        self.index.lock().usage()
    }

    /// Sliced objects, those cached in part, and slices (`index::SliceCensus`).
    pub(crate) fn slice_census(&self) -> index::SliceCensus {
        self.index.lock().slice_census()
    }

    /// The configured bound on bytes (`cache.max_size`).
    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    /// `on`: a successor process is taking the directory over (a SIGUSR2 upgrade). From now on
    /// no fill starts or commits and nothing is evicted here, so the files the successor indexes
    /// stay as it found them; `false` again if the upgrade failed.
    pub fn hand_over(&self, on: bool) {
        self.handing_over.store(on, Ordering::Relaxed);
    }

    /// Whether the directory is being handed to a successor ([`Store::hand_over`]).
    pub fn is_handing_over(&self) -> bool {
        self.handing_over.load(Ordering::Relaxed)
    }

    /// Whether fills are attempted.
    pub fn is_writable(&self) -> bool {
        self.writable.load(Ordering::Relaxed)
    }

    /// Records a failed write: warn once per transition, degrade to pass-through.
    pub fn write_failed(&self, e: &io::Error) {
        self.write_errors.fetch_add(1, Ordering::Relaxed);
        if self.writable.swap(false, Ordering::Relaxed) {
            tracing::warn!(error = %e, dir = %self.layout.dir().display(), "cache write failed; serving pass-through until a write succeeds");
        }
    }

    /// Records a successful commit.
    pub fn write_ok(&self) {
        if !self.writable.swap(true, Ordering::Relaxed) {
            tracing::info!("cache writable again");
        }
    }
}

/// Entries whose heads a prefix scan reads per hold of the index lock.
const PREFIX_SCAN_CHUNK: usize = 4096;

/// ENOSPC or EDQUOT: the file system (or the quota) is full.
pub(crate) fn is_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// `max_size`, or the size of the file system holding `dir` when that is smaller (with a
/// warning): a cache configured larger than its disk would fill it and then fail every write.
fn clamp_to_filesystem(dir: &Path, max_size: u64) -> u64 {
    let Ok(fs) = nix::sys::statvfs::statvfs(dir) else {
        return max_size;
    };
    let total = fs.blocks().saturating_mul(fs.fragment_size());
    if total > 0 && max_size > total {
        tracing::warn!(
            max_size,
            filesystem = total,
            dir = %dir.display(),
            "cache.max_size is larger than the file system that holds the cache; clamped to it"
        );
        total
    } else {
        max_size
    }
}
