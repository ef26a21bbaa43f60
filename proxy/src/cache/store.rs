//! The cache index and the files behind it: lookup, insert with LRU eviction to `max_size`,
//! removal, the open-file cache, and the rebuild from disk at start-up (which verifies the bodies
//! of a random sample of entries: see [`Store::rebuild_verifying`]).
//!
//! The index is one mutex around an LRU map. A lookup holds it for a hash probe and a list splice,
//! far shorter than anything else on the request path, and on 2 cores a sharded or lock-free map
//! would buy nothing measurable (see the bench). Files are deleted outside the lock.

use super::entry::{self, Entry, OpenFile, OpenSlot};
use super::key::CacheKey;
use super::targeted::Targeted;
use lru::LruCache;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long an open file is trusted before its link count is checked again: a hot entry costs one
/// fstat(2) per second, not one per hit.
const NLINK_RECHECK: Duration = Duration::from_secs(1);

/// Size of the open-file cache for `cache.open_files: auto` when the fd limit allows it.
pub const OPEN_FILES_AUTO_MAX: usize = 10_000;

/// The open-file cache's size for `requested` (`None` for `auto`) under a soft RLIMIT_NOFILE of
/// `nofile`, and whether an explicit value had to be clamped.
///
/// `auto` takes a quarter of the fd limit (at most [`OPEN_FILES_AUTO_MAX`]) and an explicit value
/// at most half: the rest is for client connections, upstream connections and fills. A cache
/// allowed as many files as the limit (10,000 under `ulimit -n 256`) once took every descriptor,
/// after which neither a connection nor a cache file could be opened.
pub fn open_files_budget(requested: Option<usize>, nofile: u64) -> (usize, bool) {
    let share = |divisor: u64| usize::try_from(nofile / divisor).unwrap_or(usize::MAX);
    match requested {
        None => (OPEN_FILES_AUTO_MAX.min(share(4)), false),
        Some(n) if n > share(2) => (share(2), true),
        Some(n) => (n, false),
    }
}

/// What a failed open of an entry file says about the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFailure {
    /// The file is gone (ENOENT): [`Store::open_file`] has dropped the entry from the index.
    Gone,
    /// The process (EMFILE) or the system (ENFILE) is out of file descriptors, even after the
    /// open-file cache gave back its idle ones. The entry is intact; only this request cannot be
    /// served from it now.
    NoFds,
    /// Anything else (EACCES, EIO...): the entry is kept, since the file may well still be there.
    Other,
}

impl OpenFailure {
    /// Classifies an error of open(2) on an entry file. Only ENOENT says the file is gone:
    /// treating every error that way deleted entries wholesale once the fd limit was reached.
    pub fn of(err: &io::Error) -> OpenFailure {
        match err.raw_os_error() {
            Some(libc::ENOENT) => OpenFailure::Gone,
            Some(libc::EMFILE | libc::ENFILE) => OpenFailure::NoFds,
            _ => OpenFailure::Other,
        }
    }
}

/// Opens an entry file. Tests make it fail with a chosen errno (see `tests::fail_next_opens`),
/// since a real EMFILE would need the whole test process's fd limit lowered.
fn open_entry_file(path: &Path) -> io::Result<File> {
    #[cfg(test)]
    if let Some(errno) = tests::injected_open_error() {
        return Err(io::Error::from_raw_os_error(errno));
    }
    File::open(path)
}

/// The disk cache.
pub struct Store {
    dir: PathBuf,
    max_size: u64,
    max_entries: usize,
    levels: u8,
    open_files_max: usize,
    open_files: Arc<AtomicUsize>,
    /// The entries that were given a slot in the open-file cache, oldest first, so that running
    /// out of fds can close the idle ones without walking the whole index. May hold entries that
    /// have since been dropped or lost their slot; [`Store::hold`] prunes those.
    held: Mutex<VecDeque<Weak<Entry>>>,
    /// Rate limit of the out-of-fds warning: when it was last logged, and failures since.
    fd_warning: Mutex<(Option<Instant>, u64)>,
    inner: Mutex<Inner>,
    tmp_seq: AtomicU64,
    /// False after a write failure: the cache degrades to pass-through until a write works again.
    writable: AtomicBool,
    /// Writes that failed (disk full, permissions).
    pub write_errors: AtomicU64,
    /// Entries evicted to make room (size or entry limit), since start.
    pub evictions: AtomicU64,
    /// Entries discarded because their body no longer had its checksum (start-up verification,
    /// scrub), since start.
    pub corrupt_entries: AtomicU64,
    /// Where corrupt entries are also counted for `/metrics`, once the dashboard's accounting
    /// exists (it is created after the rebuild); a mutex so no count is lost or doubled while it
    /// is attached.
    corrupt_sink: Mutex<Option<Arc<zerocache_ledger::Accounting>>>,
    /// The target list (RFC 9213) under which entries are read: which stored field governs
    /// reuse, and whether targeted fields reach clients. Fixed for the process's life, like the
    /// rest of `cache:` (a change takes effect on restart).
    targeted: Targeted,
}

struct Inner {
    lru: LruCache<u128, Arc<Entry>>,
    bytes: u64,
    /// Per URL key text: the request fields its stored responses vary on (RFC 9111 §4.1).
    vary: std::collections::HashMap<String, Vec<String>>,
    /// Per URL (`Meta::url`): the hashes of its entries, every variant included, so
    /// invalidation and purge find them without scanning the index.
    by_url: std::collections::HashMap<String, Vec<u128>>,
}

impl Inner {
    fn url_add(&mut self, url: &str, hash: u128) {
        let v = self.by_url.entry(url.to_string()).or_default();
        if !v.contains(&hash) {
            v.push(hash);
        }
    }

    fn url_remove(&mut self, url: &str, hash: u128) {
        if let Some(v) = self.by_url.get_mut(url) {
            v.retain(|h| *h != hash);
            if v.is_empty() {
                self.by_url.remove(url);
            }
        }
    }

    /// Unindexes `hash`; returns the entry if it was there.
    fn take(&mut self, hash: u128) -> Option<Arc<Entry>> {
        let e = self.lru.pop(&hash)?;
        self.bytes -= e.disk_size();
        self.url_remove(&e.meta.url, hash);
        Some(e)
    }
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
}

/// Counts from a start-up rebuild.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
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
    /// Opens (creating) the cache directory; call [`Store::rebuild`] next.
    pub fn open(dir: &Path, limits: StoreLimits) -> io::Result<Store> {
        fs::create_dir_all(dir.join("tmp"))?;
        Ok(Store {
            dir: dir.to_path_buf(),
            max_size: limits.max_size,
            max_entries: limits.max_entries.max(1),
            levels: limits.levels,
            open_files_max: limits.open_files,
            open_files: Arc::new(AtomicUsize::new(0)),
            held: Mutex::new(VecDeque::new()),
            fd_warning: Mutex::new((None, 0)),
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                bytes: 0,
                vary: std::collections::HashMap::new(),
                by_url: std::collections::HashMap::new(),
            }),
            tmp_seq: AtomicU64::new(0),
            writable: AtomicBool::new(true),
            write_errors: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            corrupt_entries: AtomicU64::new(0),
            corrupt_sink: Mutex::new(None),
            targeted: Targeted::default(),
        })
    }

    /// Sets the target list (`cache.targeted_fields`, `cache.targeted_fields_forward`); call
    /// before the rebuild, which builds entries under it.
    pub fn with_targeted(mut self, targeted: Targeted) -> Store {
        self.targeted = targeted;
        self
    }

    /// The target list entries are read under.
    pub fn targeted(&self) -> &Targeted {
        &self.targeted
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Indexes every valid entry file and deletes the rest (temp files of fills interrupted by a
    /// crash or `kill -9`, torn or corrupt entries). Verifies no body: see
    /// [`Store::rebuild_verifying`].
    pub fn rebuild(&self) -> io::Result<Rebuilt> {
        self.rebuild_verifying(0)
    }

    /// [`Store::rebuild`], then verifies the bodies of at most `verify` indexed entries, chosen at
    /// random (`cache.verify_on_start`): an entry whose body does not have its checksum is
    /// deleted and counted. Random rather than a fixed choice, so successive restarts cover
    /// different entries; the scrub covers them all in time. This reads up to `verify` whole
    /// bodies before the proxy listens, which is why it is a sample.
    pub fn rebuild_verifying(&self, verify: usize) -> io::Result<Rebuilt> {
        let mut out = Rebuilt::default();
        for t in fs::read_dir(self.dir.join("tmp"))? {
            let t = t?;
            let _ = fs::remove_file(t.path());
            out.discarded += 1;
        }
        // Walk every directory but tmp: a changed `levels` still finds the old entries.
        let mut dirs = vec![self.dir.clone()];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d)? {
                let e = e?;
                let path = e.path();
                if e.file_type()?.is_dir() {
                    if path != self.dir.join("tmp") {
                        dirs.push(path);
                    }
                    continue;
                }
                match self.index_file(&path) {
                    Ok(()) => out.entries += 1,
                    Err(err) => {
                        tracing::warn!(path = %path.display(), error = %err, "discarding cache file");
                        let _ = fs::remove_file(&path);
                        out.discarded += 1;
                    }
                }
            }
        }
        self.evict_to_fit(0);
        let mut buf = Vec::new();
        for hash in self.sample(verify) {
            let Some(e) = self.peek(hash) else { continue };
            let verdict = File::open(&e.path)
                .map_err(entry::CorruptEntry::from)
                .and_then(|f| {
                    super::scrub::verify_body(
                        &f,
                        e.body_offset,
                        e.body_len,
                        e.body_checksum,
                        &mut buf,
                    )
                });
            out.verified += 1;
            match verdict {
                Ok(()) => {}
                Err(err @ entry::CorruptEntry::Body { .. }) => {
                    tracing::warn!(path = %e.path.display(), key = %e.meta.key, error = %err, "discarding corrupt cache entry");
                    if self.remove_corrupt(&e) {
                        out.entries = out.entries.saturating_sub(1);
                        out.discarded += 1;
                        out.corrupt += 1;
                    }
                }
                // An I/O error says nothing of the bytes: the entry stays, the scrub tries again.
                Err(err) => {
                    tracing::warn!(path = %e.path.display(), error = %err, "could not verify cache entry at start-up");
                }
            }
        }
        Ok(out)
    }

    /// At most `n` hashes of indexed entries, chosen at random.
    fn sample(&self, n: usize) -> Vec<u128> {
        if n == 0 {
            return Vec::new();
        }
        let mut hashes = self.hashes();
        if hashes.len() > n {
            // A random order without a random-number crate: rank by a hash keyed with the clock.
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()).rotate_left(32);
            let rank = |h: &u128| xxhash_rust::xxh3::xxh3_64_with_seed(&h.to_le_bytes(), seed);
            hashes.select_nth_unstable_by_key(n, rank);
            hashes.truncate(n);
        }
        hashes
    }

    fn index_file(&self, path: &Path) -> Result<(), entry::CorruptEntry> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let hash = u128::from_str_radix(name, 16).map_err(|_| entry::CorruptEntry::Magic)?;
        let file = File::open(path)?;
        let h = entry::read_entry_header(&file)?;
        let e = Entry::new(
            hash,
            h.meta,
            path.to_path_buf(),
            h.body_offset,
            h.body_len,
            &self.targeted,
        )
        .with_body_checksum(h.body_checksum);
        self.insert_entry(Arc::new(e));
        Ok(())
    }

    /// The hashes of every indexed entry, in no particular order: what the scrub walks, looking
    /// each up again with [`Store::peek`] when its turn comes (so entries evicted meanwhile are
    /// neither kept alive nor read).
    pub fn hashes(&self) -> Vec<u128> {
        self.inner.lock().lru.iter().map(|(h, _)| *h).collect()
    }

    /// The entry indexed under `hash`, without making it more recently used (a scrub is not a use).
    pub fn peek(&self, hash: u128) -> Option<Arc<Entry>> {
        self.inner.lock().lru.peek(&hash).cloned()
    }

    /// Discards `e`, found corrupt, with [`Store::remove_if_same`] (a transfer in flight keeps its
    /// open file), and counts it. The index may hold a newer version of the same body (its
    /// header rewritten by a revalidation): that one goes too, since its body is these bytes; an
    /// entry refilled since keeps its place. True if an entry was removed.
    pub fn remove_corrupt(&self, e: &Arc<Entry>) -> bool {
        let Some(cur) = self.peek(e.hash) else {
            return false;
        };
        let same_body = cur.path == e.path
            && cur.body_offset == e.body_offset
            && cur.body_len == e.body_len
            && cur.body_checksum == e.body_checksum;
        if !same_body || !self.remove_if_same(&cur) {
            return false;
        }
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
    /// steps, since this runs on every lookup.
    pub fn lookup_varying(
        &self,
        primary: &CacheKey,
        variant: impl FnOnce(&[String]) -> CacheKey,
    ) -> Option<Arc<Entry>> {
        let mut inner = self.inner.lock();
        let secondary = inner.vary.get(&primary.text).map(|names| variant(names));
        // The full key is compared, so a hash collision is a miss, never another URL's body.
        let key = secondary.as_ref().unwrap_or(primary);
        let e = inner.lru.get(&key.hash)?;
        (e.meta.key == key.text).then(|| e.clone())
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
        if entry::FIXED + encoded.len() <= e.body_offset as usize {
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
        {
            let mut inner = self.inner.lock();
            if let Some(cur) = inner.lru.peek_mut(&e.hash)
                && Arc::ptr_eq(cur, e)
            {
                *cur = updated.clone();
            }
        }
        updated
    }

    /// An open handle on the entry's file, from the open-file cache when possible. Detects a file
    /// deleted underneath (`st_nlink == 0`, then ENOENT) and drops the entry; any other error
    /// leaves the entry indexed (see [`OpenFailure::of`] to tell them apart). Out of fds, it closes
    /// the open-file cache's idle files and tries once more before giving up.
    pub fn open_file(&self, e: &Arc<Entry>) -> io::Result<Arc<File>> {
        let now = Instant::now();
        {
            let mut slot = e.file.lock();
            if let Some(of) = slot.as_mut() {
                // (Only entries that won a slot in the open-file cache get here.)
                if now.duration_since(of.checked) < NLINK_RECHECK {
                    return Ok(of.file.clone());
                }
                let nlink = of.file.metadata()?.nlink();
                if nlink > 0 {
                    of.checked = now;
                    return Ok(of.file.clone());
                }
                *slot = None;
            }
        }
        let opened = match open_entry_file(&e.path) {
            Err(err) if OpenFailure::of(&err) == OpenFailure::NoFds => {
                // The idle files of the open-file cache are the only descriptors the store can
                // give back; a file still being sent keeps its fd until the send ends.
                let released = self.release_open_files(e);
                let retried = open_entry_file(&e.path);
                if let Err(err) = &retried {
                    self.warn_no_fds(err, released);
                }
                retried
            }
            other => other,
        };
        match opened {
            Ok(f) => {
                let f = Arc::new(f);
                // Keep it open only while the open-file cache has room; a cold entry beyond
                // that costs an open(2) per hit rather than an fd forever.
                if self.open_files.fetch_add(1, Ordering::Relaxed) < self.open_files_max {
                    *e.file.lock() = Some(OpenFile {
                        file: f.clone(),
                        checked: now,
                        _slot: OpenSlot(self.open_files.clone()),
                    });
                    self.hold(e);
                } else {
                    self.open_files.fetch_sub(1, Ordering::Relaxed);
                }
                Ok(f)
            }
            Err(err) => {
                // Only a missing file means the entry is gone: out of fds, or denied, or an I/O
                // error, the file is most likely intact and the entry must survive.
                if OpenFailure::of(&err) == OpenFailure::Gone {
                    self.remove_if_same(e);
                }
                Err(err)
            }
        }
    }

    /// Records that `e` was given a slot in the open-file cache.
    fn hold(&self, e: &Arc<Entry>) {
        let mut held = self.held.lock();
        held.push_back(Arc::downgrade(e));
        // Evicted entries and entries whose slot went leave stale references behind: prune them
        // once the list is twice the cache's size, so it stays O(open_files) at O(1) amortised.
        if held.len() > 2 * self.open_files_max.max(32) {
            held.retain(|w| {
                w.upgrade()
                    .is_some_and(|x| x.file.try_lock().is_none_or(|slot| slot.is_some()))
            });
        }
    }

    /// Closes the files the open-file cache holds for entries other than `except`; returns how
    /// many slots were given back. Entries keep their place in the index: their next hit opens
    /// the file again.
    fn release_open_files(&self, except: &Arc<Entry>) -> usize {
        let held = std::mem::take(&mut *self.held.lock());
        let mut kept = Vec::new();
        let mut released = 0;
        for w in held {
            let Some(x) = w.upgrade() else { continue };
            if Arc::ptr_eq(&x, except) {
                kept.push(w);
                continue;
            }
            // A slot locked right now is being checked or filled by another hit; skip it
            // rather than wait on it.
            match x.file.try_lock() {
                Some(mut slot) => released += usize::from(slot.take().is_some()),
                None => kept.push(w),
            }
        }
        if !kept.is_empty() {
            self.held.lock().extend(kept);
        }
        released
    }

    /// Logs running out of fds at most once a second, with the failures it did not log.
    fn warn_no_fds(&self, err: &io::Error, released: usize) {
        let mut w = self.fd_warning.lock();
        if w.0.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            w.1 += 1;
            return;
        }
        let suppressed = std::mem::take(&mut w.1);
        w.0 = Some(Instant::now());
        drop(w);
        tracing::warn!(
            error = %err,
            released,
            suppressed,
            open_files = self.open_files(),
            "out of file descriptors opening a cache file, even after closing idle cached files; entry kept"
        );
    }

    /// Path of the final file for `hash`, creating its shard directories.
    pub fn entry_path(&self, hash: u128) -> io::Result<PathBuf> {
        let dir = self.dir.join(CacheKey::shard(hash, self.levels));
        fs::create_dir_all(&dir)?;
        Ok(dir.join(CacheKey::file_name(hash)))
    }

    /// Files currently held open by the open-file cache.
    pub fn open_files(&self) -> usize {
        self.open_files.load(Ordering::Relaxed)
    }

    /// A fresh temp file path (same filesystem, so the commit is a rename).
    pub fn temp_path(&self) -> PathBuf {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join("tmp")
            .join(format!("{}-{n}.tmp", std::process::id()))
    }

    /// Indexes a committed entry, replacing any entry with the same hash, and evicts to fit.
    pub fn insert_entry(&self, e: Arc<Entry>) {
        let size = e.disk_size();
        let replaced = {
            let mut inner = self.inner.lock();
            let primary = crate::cache::variance::primary_text(&e.meta.key);
            if !e.meta.vary.is_empty() {
                inner.vary.insert(primary.to_string(), e.meta.vary.clone());
            } else if primary.len() == e.meta.key.len() {
                // A response without Vary for this URL: it no longer varies.
                inner.vary.remove(primary);
            }
            inner.bytes += size;
            inner.url_add(&e.meta.url, e.hash);
            let url = e.meta.url.clone();
            let old = inner.lru.push(e.hash, e);
            if let Some((_, old)) = &old {
                inner.bytes -= old.disk_size();
                if old.meta.url != url {
                    let (u, h) = (old.meta.url.clone(), old.hash);
                    inner.url_remove(&u, h);
                }
            }
            old
        };
        // The old entry's file was replaced by rename; nothing to delete unless paths differ.
        if let Some((_, old)) = replaced
            && old.path != self.entry_path_unchecked(old.hash)
        {
            let _ = fs::remove_file(&old.path);
        }
        self.evict_to_fit(0);
    }

    fn entry_path_unchecked(&self, hash: u128) -> PathBuf {
        self.dir
            .join(CacheKey::shard(hash, self.levels))
            .join(CacheKey::file_name(hash))
    }

    /// Evicts least recently used entries until `extra` more bytes fit under `max_size`.
    pub fn evict_to_fit(&self, extra: u64) {
        let mut victims = Vec::new();
        {
            let mut inner = self.inner.lock();
            while inner.bytes + extra > self.max_size || inner.lru.len() > self.max_entries {
                match inner.lru.pop_lru() {
                    Some((_, e)) => {
                        inner.bytes -= e.disk_size();
                        let (u, h) = (e.meta.url.clone(), e.hash);
                        inner.url_remove(&u, h);
                        victims.push(e);
                    }
                    None => break,
                }
            }
        }
        self.evictions
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        for v in victims {
            // A transfer in flight keeps its open fd; unlinking never cuts it short.
            let _ = fs::remove_file(&v.path);
        }
    }

    /// Whether `e` is the entry the index holds for its hash (not replaced, purged or evicted).
    pub fn is_current(&self, e: &Arc<Entry>) -> bool {
        self.inner
            .lock()
            .lru
            .peek(&e.hash)
            .is_some_and(|cur| Arc::ptr_eq(cur, e))
    }

    /// Removes `e` from the index (and its file) if the index still holds this very entry;
    /// true if it did.
    pub fn remove_if_same(&self, e: &Arc<Entry>) -> bool {
        let removed = {
            let mut inner = self.inner.lock();
            match inner.lru.peek(&e.hash) {
                Some(cur) if Arc::ptr_eq(cur, e) => inner.take(e.hash),
                _ => None,
            }
        };
        if removed.is_some() {
            let _ = fs::remove_file(&e.path);
        }
        removed.is_some()
    }

    /// Removes every entry of the URL key text `url` (all its variants) and deletes their files;
    /// returns how many went. Transfers in flight keep their open file and finish intact.
    pub fn purge_url(&self, url: &str) -> usize {
        let gone: Vec<Arc<Entry>> = {
            let mut inner = self.inner.lock();
            let hashes = inner.by_url.get(url).cloned().unwrap_or_default();
            let gone: Vec<Arc<Entry>> = hashes.into_iter().filter_map(|h| inner.take(h)).collect();
            // The Vary map is keyed by primary key text, which is the URL's only on routes without
            // `cache_key.headers`: forget the fields each purged entry's primary key varied on.
            inner.vary.remove(url);
            for e in &gone {
                inner
                    .vary
                    .remove(crate::cache::variance::primary_text(&e.meta.key));
            }
            gone
        };
        for e in &gone {
            let _ = fs::remove_file(&e.path);
        }
        gone.len()
    }

    /// Removes every entry whose URL key text starts with `prefix`; returns how many went.
    pub fn purge_prefix(&self, prefix: &str) -> usize {
        let urls: Vec<String> = self
            .inner
            .lock()
            .by_url
            .keys()
            .filter(|u| u.starts_with(prefix))
            .cloned()
            .collect();
        urls.iter().map(|u| self.purge_url(u)).sum()
    }

    /// (bytes on disk, entries).
    pub fn usage(&self) -> (u64, u64) {
        let inner = self.inner.lock();
        (inner.bytes, inner.lru.len() as u64)
    }

    /// Configured bound.
    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    /// Whether fills are attempted.
    pub fn is_writable(&self) -> bool {
        self.writable.load(Ordering::Relaxed)
    }

    /// Records a failed write: warn once per transition, degrade to pass-through.
    pub fn write_failed(&self, e: &io::Error) {
        self.write_errors.fetch_add(1, Ordering::Relaxed);
        if self.writable.swap(false, Ordering::Relaxed) {
            tracing::warn!(error = %e, dir = %self.dir.display(), "cache write failed; serving pass-through until a write succeeds");
        }
    }

    /// Records a successful commit.
    pub fn write_ok(&self) {
        if !self.writable.swap(true, Ordering::Relaxed) {
            tracing::info!("cache writable again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::Meta;
    use crate::cache::fill::Fill;
    use std::cell::RefCell;
    use std::time::SystemTime;

    thread_local! {
        /// Errnos the next opens of entry files on this thread fail with, in order (per thread,
        /// since tests run in parallel).
        static FAIL_OPENS: RefCell<VecDeque<i32>> = const { RefCell::new(VecDeque::new()) };
    }

    /// The errno the next open of an entry file on this thread must fail with, if any.
    pub(super) fn injected_open_error() -> Option<i32> {
        FAIL_OPENS.with(|f| f.borrow_mut().pop_front())
    }

    fn fail_next_opens(errnos: &[i32]) {
        FAIL_OPENS.with(|f| f.borrow_mut().extend(errnos));
    }

    fn store(dir: &Path, open_files: usize) -> Arc<Store> {
        let limits = StoreLimits {
            max_size: 1 << 30,
            max_entries: 1000,
            levels: 1,
            open_files,
        };
        Arc::new(Store::open(dir, limits).expect("store"))
    }

    /// Stores `body` for `target` through a real fill, as the proxy does.
    fn put(store: &Arc<Store>, target: &str, body: &[u8]) -> Arc<Entry> {
        let key = CacheKey::new("GET", "http", "h", target, 128);
        let url = key.text.clone();
        fill(
            store,
            &key,
            &url,
            b"Cache-Control: max-age=600\r\n",
            Vec::new(),
            body,
        )
    }

    /// Stores `body` under `key` (for `url`) through a real fill, fresh for 10 minutes.
    fn fill(
        store: &Arc<Store>,
        key: &CacheKey,
        url: &str,
        fields: &[u8],
        vary: Vec<String>,
        body: &[u8],
    ) -> Arc<Entry> {
        let meta = Meta {
            key: key.text.clone(),
            stored_at: SystemTime::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(600),
            status: 200,
            reason: "OK".into(),
            fields: fields.to_vec(),
            vary,
            url: url.to_string(),
        };
        let mut fill = Fill::create(store.clone(), key.hash, meta).expect("fill");
        fill.write(body).expect("write");
        fill.commit().expect("commit")
    }

    fn indexed(store: &Store, e: &Arc<Entry>) -> bool {
        let key = CacheKey::from_text(e.meta.key.clone(), 128);
        store
            .lookup_varying(&key, |_| key.clone())
            .is_some_and(|found| Arc::ptr_eq(&found, e))
    }

    #[test]
    fn purging_a_url_forgets_what_its_keyed_primary_varied_on() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        // A route with `cache_key.headers`: the primary key is the URL's plus a key field.
        let url = CacheKey::new("GET", "http", "h", "/v", 128);
        let primary =
            url.clone()
                .with_headers(&["x-tenant".to_string()], |_| Some("a".into()), 128);
        assert_ne!(primary.text, url.text);
        for lang in ["en", "fr"] {
            let key = CacheKey::from_text(
                format!(
                    "{}{}accept-language={lang}",
                    primary.text,
                    crate::cache::variance::SEPARATOR
                ),
                128,
            );
            fill(
                &s,
                &key,
                &url.text,
                b"Vary: Accept-Language\r\n",
                vec!["accept-language".into()],
                lang.as_bytes(),
            );
        }
        assert!(s.inner.lock().vary.contains_key(&primary.text));
        assert_eq!(s.purge_url(&url.text), 2);
        assert_eq!(s.usage(), (0, 0));
        assert!(
            !s.inner.lock().vary.contains_key(&primary.text),
            "the primary's Vary names outlived its entries"
        );
    }

    #[test]
    fn only_enoent_means_gone() {
        let of = |errno| OpenFailure::of(&io::Error::from_raw_os_error(errno));
        assert_eq!(of(libc::ENOENT), OpenFailure::Gone);
        assert_eq!(of(libc::EMFILE), OpenFailure::NoFds);
        assert_eq!(of(libc::ENFILE), OpenFailure::NoFds);
        for errno in [libc::EACCES, libc::EIO, libc::ENOTDIR, libc::ENOMEM] {
            assert_eq!(of(errno), OpenFailure::Other, "errno {errno}");
        }
        assert_eq!(
            OpenFailure::of(&io::Error::other("not an OS error")),
            OpenFailure::Other
        );
    }

    #[test]
    fn a_deleted_file_drops_its_entry() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let e = put(&s, "/gone", b"body");
        fs::remove_file(&e.path).expect("rm");
        let err = s.open_file(&e).expect_err("file is gone");
        assert_eq!(OpenFailure::of(&err), OpenFailure::Gone);
        assert!(!indexed(&s, &e));
        assert_eq!(s.usage(), (0, 0));
    }

    #[test]
    fn a_file_deleted_while_cached_drops_its_entry_at_the_recheck() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let e = put(&s, "/gone-later", b"body");
        s.open_file(&e).expect("open");
        assert_eq!(s.open_files(), 1);
        fs::remove_file(&e.path).expect("rm");
        // Age the cached handle past the link-count recheck.
        if let Some(of) = e.file.lock().as_mut() {
            of.checked -= NLINK_RECHECK;
        }
        let err = s.open_file(&e).expect_err("file is gone");
        assert_eq!(OpenFailure::of(&err), OpenFailure::Gone);
        assert!(!indexed(&s, &e));
        assert_eq!(s.open_files(), 0);
    }

    #[test]
    fn out_of_fds_gives_back_idle_files_and_retries() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let a = put(&s, "/a", b"aaaa");
        let b = put(&s, "/b", b"bbbb");
        s.open_file(&a).expect("open a");
        assert_eq!(s.open_files(), 1);
        fail_next_opens(&[libc::EMFILE]);
        let f = s
            .open_file(&b)
            .expect("the retry after giving back a's fd works");
        let mut got = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&*f, &mut got, b.body_offset).expect("read");
        assert_eq!(&got, b"bbbb");
        // a's idle handle went, b's took its place; both entries stay.
        assert!(a.file.lock().is_none());
        assert!(b.file.lock().is_some());
        assert_eq!(s.open_files(), 1);
        assert!(indexed(&s, &a) && indexed(&s, &b));
        // a opens again on its next hit.
        s.open_file(&a).expect("reopen a");
        assert_eq!(s.open_files(), 2);
    }

    #[test]
    fn emfile_or_any_other_error_keeps_the_entry() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let e = put(&s, "/kept", b"kept");
        for (errnos, want) in [
            (&[libc::EMFILE, libc::EMFILE][..], OpenFailure::NoFds),
            (&[libc::ENFILE, libc::ENFILE][..], OpenFailure::NoFds),
            (&[libc::EACCES][..], OpenFailure::Other),
            (&[libc::EIO][..], OpenFailure::Other),
        ] {
            fail_next_opens(errnos);
            let err = s.open_file(&e).expect_err("injected failure");
            assert_eq!(OpenFailure::of(&err), want, "{errnos:?}");
            assert!(indexed(&s, &e), "{errnos:?} must not drop the entry");
            assert!(e.path.exists(), "{errnos:?} must not delete the file");
            assert_eq!(injected_open_error(), None, "{errnos:?}: one retry at most");
        }
        assert_eq!(s.usage().1, 1);
        s.open_file(&e).expect("opens once fds are back");
    }

    #[test]
    fn the_held_list_stays_bounded() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 4);
        for i in 0..500 {
            // Each entry is replaced before the next: its slot goes with it.
            let e = put(&s, "/churn", format!("{i}").as_bytes());
            s.open_file(&e).expect("open");
        }
        assert!(s.held.lock().len() <= 2 * 32 + 1);
        assert!(s.open_files() <= 4);
    }

    /// Flips one byte of `e`'s body in place, as a bad sector or a stray write would.
    fn flip_body_byte(e: &Entry, at: u64) {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&e.path)
            .expect("open");
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, e.body_offset + at).expect("read");
        f.write_all_at(&[b[0] ^ 0x20], e.body_offset + at)
            .expect("write");
    }

    #[test]
    fn a_fill_stores_its_body_checksum() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let e = put(&s, "/sum", &body);
        assert_eq!(e.body_checksum, entry::body_checksum(&body));
        let h = entry::read_entry_header(&File::open(&e.path).expect("open")).expect("header");
        assert_eq!(h.body_checksum, e.body_checksum);
        // A revalidation rewrites the header and keeps the checksum.
        let mut meta = e.meta.clone();
        meta.fields = b"Cache-Control: max-age=900\r\n".to_vec();
        let updated = s.replace_meta(&e, meta);
        assert_eq!(updated.body_checksum, e.body_checksum);
        let h = entry::read_entry_header(&File::open(&e.path).expect("open")).expect("header");
        assert_eq!(h.body_checksum, e.body_checksum);
        assert_eq!(h.meta.fields, b"Cache-Control: max-age=900\r\n");
    }

    #[test]
    fn start_up_verification_discards_a_corrupt_body() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let good = put(&s, "/good", &[7u8; 5000]);
        let bad = put(&s, "/bad", &[9u8; 5000]);
        flip_body_byte(&bad, 500);
        drop(s);
        // Without verification the corrupt entry is indexed (a hit never reads the body).
        let s = store(tmp.path(), 10);
        let r = s.rebuild_verifying(0).expect("rebuild");
        assert_eq!((r.entries, r.verified, r.corrupt), (2, 0, 0));
        drop(s);
        let s = store(tmp.path(), 10);
        let r = s.rebuild_verifying(64).expect("rebuild");
        assert_eq!(
            r,
            Rebuilt {
                entries: 1,
                discarded: 1,
                verified: 2,
                corrupt: 1
            }
        );
        assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 1);
        assert!(!bad.path.exists());
        assert!(good.path.exists());
        assert_eq!(s.usage().1, 1);
        assert!(s.peek(good.hash).is_some() && s.peek(bad.hash).is_none());
        // Counted for /metrics once the accounting exists, and after.
        let acc = Arc::new(zerocache_ledger::Accounting::new(8, false));
        s.attach_accounting(acc.clone());
        assert_eq!(acc.corrupt_entries(), 1);
        s.corrupt_found(2);
        assert_eq!(acc.corrupt_entries(), 3);
        assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn start_up_verification_reads_at_most_its_sample() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        for i in 0..6 {
            put(&s, &format!("/e{i}"), format!("body {i}").as_bytes());
        }
        drop(s);
        let s = store(tmp.path(), 10);
        let r = s.rebuild_verifying(2).expect("rebuild");
        assert_eq!((r.entries, r.verified, r.corrupt), (6, 2, 0));
        assert_eq!(s.sample(6).len(), 6);
        assert_eq!(s.sample(10).len(), 6);
        assert_eq!(s.sample(0).len(), 0);
    }

    #[test]
    fn remove_corrupt_spares_a_newer_fill() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let old = put(&s, "/k", b"old body");
        let new = put(&s, "/k", b"new body");
        assert!(!s.remove_corrupt(&old), "the index holds a newer fill");
        assert!(indexed(&s, &new) && new.path.exists());
        assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 0);
        // The same body with its header rewritten after a revalidation goes, though.
        let revalidated = s.replace_meta(&new, new.meta.clone());
        assert!(s.remove_corrupt(&new));
        assert!(!indexed(&s, &revalidated) && !new.path.exists());
        assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn open_files_follows_the_fd_limit() {
        // auto: a quarter of the limit, at most 10,000.
        assert_eq!(open_files_budget(None, 256), (64, false));
        assert_eq!(
            open_files_budget(None, 1 << 20),
            (OPEN_FILES_AUTO_MAX, false)
        );
        assert_eq!(
            open_files_budget(None, u64::MAX),
            (OPEN_FILES_AUTO_MAX, false)
        );
        // An explicit value: kept up to half the limit, clamped above.
        assert_eq!(open_files_budget(Some(10_000), 256), (128, true));
        assert_eq!(open_files_budget(Some(128), 256), (128, false));
        assert_eq!(open_files_budget(Some(0), 256), (0, false));
        assert_eq!(open_files_budget(Some(50_000), 1 << 20), (50_000, false));
    }
}
