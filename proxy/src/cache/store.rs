//! The cache index and the files behind it: lookup, insert with LRU eviction to `max_size`,
//! removal, the open-file cache, and the rebuild from disk at start-up.
//!
//! The index is one mutex around an LRU map. A lookup holds it for a hash probe and a list splice,
//! far shorter than anything else on the request path, and on 2 cores a sharded or lock-free map
//! would buy nothing measurable (see the bench). Files are deleted outside the lock.

use super::entry::{self, Entry, OpenFile, OpenSlot};
use super::key::CacheKey;
use lru::LruCache;
use parking_lot::Mutex;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long an open file is trusted before its link count is checked again: a hot entry costs one
/// fstat(2) per second, not one per hit.
const NLINK_RECHECK: Duration = Duration::from_secs(1);

/// The disk cache.
pub struct Store {
    dir: PathBuf,
    max_size: u64,
    max_entries: usize,
    levels: u8,
    open_files_max: usize,
    open_files: Arc<AtomicUsize>,
    inner: Mutex<Inner>,
    tmp_seq: AtomicU64,
    /// False after a write failure: the cache degrades to pass-through until a write works again.
    writable: AtomicBool,
    /// Writes that failed (disk full, permissions).
    pub write_errors: AtomicU64,
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
    /// Files kept open.
    pub open_files: usize,
}

/// Counts from a start-up rebuild.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// Entries indexed.
    pub entries: u64,
    /// Files deleted because they were corrupt, torn or left by an interrupted fill.
    pub discarded: u64,
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
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                bytes: 0,
                vary: std::collections::HashMap::new(),
                by_url: std::collections::HashMap::new(),
            }),
            tmp_seq: AtomicU64::new(0),
            writable: AtomicBool::new(true),
            write_errors: AtomicU64::new(0),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Indexes every valid entry file and deletes the rest (temp files of fills interrupted by a
    /// crash or `kill -9`, torn or corrupt entries).
    pub fn rebuild(&self) -> io::Result<Rebuilt> {
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
        Ok(out)
    }

    fn index_file(&self, path: &Path) -> Result<(), entry::CorruptEntry> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let hash = u128::from_str_radix(name, 16).map_err(|_| entry::CorruptEntry::Magic)?;
        let file = File::open(path)?;
        let (meta, offset, len) = entry::read_header(&file)?;
        let e = Entry::new(hash, meta, path.to_path_buf(), offset, len);
        self.insert_entry(Arc::new(e));
        Ok(())
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
    pub fn replace_meta(&self, e: &Arc<Entry>, meta: entry::Meta) -> Arc<Entry> {
        let encoded = meta.encode();
        if entry::FIXED + encoded.len() <= e.body_offset as usize {
            let header = entry::encode_header_at(&encoded, e.body_len, e.body_offset);
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
        let updated = Arc::new(Entry::new(
            e.hash,
            meta,
            e.path.clone(),
            e.body_offset,
            e.body_len,
        ));
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
    /// deleted underneath (`st_nlink == 0`) and drops the entry.
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
        match File::open(&e.path) {
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
                } else {
                    self.open_files.fetch_sub(1, Ordering::Relaxed);
                }
                Ok(f)
            }
            Err(err) => {
                self.remove_if_same(e);
                Err(err)
            }
        }
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
        for v in victims {
            // A transfer in flight keeps its open fd; unlinking never cuts it short.
            let _ = fs::remove_file(&v.path);
        }
    }

    /// Removes `e` from the index (and its file) if the index still holds this very entry.
    pub fn remove_if_same(&self, e: &Arc<Entry>) {
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
    }

    /// Removes every entry of the URL key text `url` (all its variants) and deletes their files;
    /// returns how many went. Transfers in flight keep their open file and finish intact.
    pub fn purge_url(&self, url: &str) -> usize {
        let gone: Vec<Arc<Entry>> = {
            let mut inner = self.inner.lock();
            let hashes = inner.by_url.get(url).cloned().unwrap_or_default();
            inner.vary.remove(url);
            hashes.into_iter().filter_map(|h| inner.take(h)).collect()
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
