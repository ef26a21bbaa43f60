//! The load at start-up: every file under the cache directory is read back into the index (its
//! header checked: magic, version, lengths), temp files of fills interrupted by a crash are
//! deleted, and a random sample of bodies is verified against their checksums. It runs in the
//! background while the proxy serves ([`Store::load_in_background`]); what it has not reached
//! yet is found by hash on request (`store::load`).

#[cfg(test)]
use super::Rebuilt;
use super::Store;
use super::index::Loaded;
use super::layout::state_dir;
use super::tombstones;
use crate::cache::entry;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

impl Store {
    #[cfg(test)]
    /// Indexes every valid entry file and deletes the rest, then verifies a sample of bodies, all
    /// before returning: [`Store::load_in_background`]'s work on the caller's thread (tests,
    /// tools).
    pub fn rebuild_verifying(&self, verify: usize) -> io::Result<Rebuilt> {
        let mut out = Rebuilt {
            discarded: self.clear_tmp()?,
            restored: self.restore_snapshot().unwrap_or(0),
            ..Rebuilt::default()
        };
        self.begin_load();
        let walked = self.index_tree();
        self.end_load(&walked);
        out.entries = walked.entries;
        out.discarded += walked.discarded;
        let v = self.verify_sample(verify);
        out.entries = out.entries.saturating_sub(v.corrupt);
        out.discarded += v.corrupt;
        out.verified = v.verified;
        out.corrupt = v.corrupt;
        Ok(out)
    }

    /// Starts the index's load on a thread of its own and returns at once, so the proxy listens
    /// and serves while it runs: a request for an entry the load has not reached opens the file
    /// its hash names (through its URL's marker when it varies: `store::marker`), a purge made
    /// meanwhile wins over the load reaching the same file later, and `verify` bodies are
    /// verified once every file is indexed (`cache.verify_on_start`). Temp files of fills a crash
    /// interrupted are deleted first, here. With `hold`, the load waits until that file exists
    /// (`debug.hold_index_load`, for tests of requests during the load).
    pub fn load_in_background(
        self: &Arc<Self>,
        verify: usize,
        hold: Option<PathBuf>,
    ) -> io::Result<()> {
        let discarded = self.clear_tmp()?;
        // Before listening: with a snapshot the index is complete from the first request.
        let restored = self.restore_snapshot();
        if let Some(n) = restored {
            tracing::info!(
                entries = n,
                "cache index restored from the previous process's snapshot"
            );
        }
        self.begin_load();
        let store = self.clone();
        let spawned = std::thread::Builder::new()
            .name("cache-load".into())
            .spawn(move || {
                if let Some(p) = hold {
                    while !p.exists() {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
                let started = std::time::Instant::now();
                let w = store.index_tree();
                let v = store.verify_sample(verify);
                store.end_load(&w);
                tracing::info!(
                    restored = restored.unwrap_or(0),
                    entries = w.entries.saturating_sub(v.corrupt),
                    discarded = discarded + w.discarded + v.corrupt,
                    unreadable = w.unreadable,
                    foreign = w.foreign,
                    verified = v.verified,
                    corrupt = v.corrupt,
                    seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
                    "cache index loaded"
                );
            });
        // Without its thread the load never ends: what it would have indexed is found by hash.
        spawned.map(|_| ())
    }

    /// The load starts: purges are remembered from now on, those a load that did not finish
    /// left first (`store::tombstones`).
    fn begin_load(&self) {
        let left = tombstones::left(&state_dir(self.layout.dir()));
        let mut ix = self.index.lock();
        ix.loading(true);
        for t in left {
            ix.tombstone(t);
        }
        drop(ix);
        self.loading.store(true, Ordering::Relaxed);
    }

    /// The load's walk is over. Complete, nothing a purge names can be left unread: the
    /// tombstones go, and so does the lookup by hash. A directory it could not read keeps both
    /// (its entries are found by hash, and the next start's load tries again).
    fn end_load(&self, w: &Walked) {
        if w.unread_dirs > 0 {
            tracing::warn!(
                directories = w.unread_dirs,
                "cache directories the index load could not read: their entries are found by their hash on request until a start reads them"
            );
            return;
        }
        self.index.lock().loading(false);
        self.loading.store(false, Ordering::Relaxed);
        tombstones::clear(&state_dir(self.layout.dir()));
    }

    /// Whether the index is still loading ([`Store::load_in_background`]).
    pub fn is_loading(&self) -> bool {
        self.loading.load(Ordering::Relaxed)
    }

    /// Entries the load has indexed so far.
    pub fn loaded_entries(&self) -> u64 {
        self.load_progress.load(Ordering::Relaxed)
    }

    /// Deletes the temp files of fills a crash or `kill -9` interrupted; returns how many.
    fn clear_tmp(&self) -> io::Result<u64> {
        let mut n = 0;
        for t in fs::read_dir(self.layout.tmp_dir())? {
            let t = t?;
            // A SIGUSR2 upgrade shares the directory: the old process's fills in flight are its
            // own to finish or drop.
            if fill_of_another_live_process(&t.file_name().to_string_lossy()) {
                continue;
            }
            let _ = fs::remove_file(t.path());
            n += 1;
        }
        Ok(n)
    }

    /// Verifies the bodies of at most `verify` indexed entries, chosen at random: one whose
    /// body does not have its checksum is deleted and counted. Random rather than a fixed
    /// choice, so successive starts cover different entries; the scrub covers them all in time.
    fn verify_sample(&self, verify: usize) -> Verified {
        let mut out = Verified::default();
        let mut buf = Vec::new();
        for hash in self.sample(verify) {
            let Some(e) = self.peek(hash) else { continue };
            let verdict = File::open(&e.path)
                .map_err(entry::CorruptEntry::from)
                .and_then(|f| {
                    crate::cache::scrub::verify_body(
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
                        out.corrupt += 1;
                    }
                }
                // An I/O error says nothing of the bytes: the entry stays, the scrub tries again.
                Err(err) => {
                    tracing::warn!(path = %e.path.display(), error = %err, "could not verify cache entry at start-up");
                }
            }
        }
        out
    }

    /// Indexes every entry file under the cache directory (but `tmp/` and `state/`) on
    /// [`READERS`] threads, deleting what is not an entry. A cold load waits on the disk for
    /// every header it reads: one reader at a time left the disk's queue empty (37 s at 100,000
    /// entries with the page cache dropped), where many keep it busy. Directories are the unit
    /// of work, shared through a queue, so the threads split any layout (`levels` 1 or 2, an old
    /// one beside a new one) without listing every file first.
    fn index_tree(&self) -> Walked {
        let work = Work {
            queue: parking_lot::Mutex::new((vec![self.layout.dir().to_path_buf()], 0)),
            more: parking_lot::Condvar::new(),
            entries: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            unread_dirs: AtomicU64::new(0),
            logged: parking_lot::Mutex::new(std::time::Instant::now()),
        };
        std::thread::scope(|s| {
            for _ in 0..READERS {
                s.spawn(|| {
                    while let Some(d) = work.next() {
                        if let Err(e) = self.index_dir(&d, &work) {
                            // One directory lost (out of fds, EIO): the walk goes on.
                            tracing::warn!(dir = %d.display(), error = %e, "could not read a cache directory");
                            work.unread_dirs.fetch_add(1, Ordering::Relaxed);
                        }
                        work.done();
                    }
                });
            }
        });
        Walked {
            entries: work.entries.into_inner(),
            discarded: work.discarded.into_inner(),
            unreadable: work.unreadable.into_inner(),
            foreign: work.foreign.into_inner(),
            unread_dirs: work.unread_dirs.into_inner(),
        }
    }

    /// Indexes the files of `d` and queues its subdirectories.
    fn index_dir(&self, d: &Path, work: &Work) -> io::Result<()> {
        for e in fs::read_dir(d)? {
            let e = e?;
            // Handing the directory over, the successor owns it: the walk neither indexes nor
            // deletes until the upgrade fails (and this process goes on) or this one exits.
            while self.is_handing_over() {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let path = e.path();
            // Gone since it was listed (evicted, purged): nothing to do.
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                if super::layout::holds_entries(self.layout.dir(), &path) {
                    work.push(path);
                }
                continue;
            }
            if !is_entry_name(&e.file_name()) {
                // Not named as an entry is: not the cache's to delete (a file an operator put
                // there, or a directory shared by mistake), and no entry either.
                work.foreign.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if self.indexed_in_place(&e.file_name(), &path) {
                // Restored from a snapshot, or found by a request: nothing to read.
                continue;
            }
            match self.index_file(&path) {
                Ok(Loaded::Indexed) => {
                    work.entries.fetch_add(1, Ordering::Relaxed);
                    let n = self.load_progress.fetch_add(1, Ordering::Relaxed) + 1;
                    work.progress(n);
                }
                Ok(_) => {}
                // An I/O error (out of fds, EIO, deleted meanwhile) says nothing of the bytes:
                // the file stays, found by its hash on request and by the next start.
                Err(entry::CorruptEntry::Io(err)) => {
                    tracing::debug!(path = %path.display(), error = %err, "could not read a cache file");
                    work.unreadable.fetch_add(1, Ordering::Relaxed);
                }
                // Refilled since it was read: the new file is the index's, not this one's.
                Err(_) if self.indexed_in_place(&e.file_name(), &path) => {}
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "discarding cache file");
                    let _ = fs::remove_file(&path);
                    work.discarded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// At most `n` hashes of indexed entries, chosen at random.
    pub(super) fn sample(&self, n: usize) -> Vec<u128> {
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

    /// Whether the file `name` at `path` is the one the index holds for its hash, where the
    /// layout puts it (a file under an older `levels` for an indexed hash is a second copy: the
    /// load reads it, and deletes it).
    fn indexed_in_place(&self, name: &std::ffi::OsStr, path: &Path) -> bool {
        let Some(hash) = name.to_str().and_then(|n| u128::from_str_radix(n, 16).ok()) else {
            return false;
        };
        self.index.lock().contains(hash) && self.layout.entry_path_unchecked(hash) == path
    }

    fn index_file(&self, path: &Path) -> Result<Loaded, entry::CorruptEntry> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let hash = u128::from_str_radix(name, 16).map_err(|_| entry::CorruptEntry::Magic)?;
        let file = File::open(path)?;
        let h = entry::read_entry_header(&file)?;
        Ok(self.index_loaded(path.to_path_buf(), hash, h))
    }

    /// Indexes the file at `path` (hash `hash`, head `h`) that the load or a request during it
    /// read: unless the hash is indexed already (a second file for it, under an old `levels`,
    /// is deleted) or a purge made during the load names it (deleted).
    pub(super) fn index_loaded(&self, path: PathBuf, hash: u128, h: entry::Header) -> Loaded {
        let at = self.placement(
            &path,
            hash,
            entry::next_id(),
            h.body_offset,
            h.body_len,
            h.body_checksum,
        );
        let primary = self.primary_hash(&h.meta.key);
        let loaded = self.index.lock().insert_loaded(&h.meta, at, primary);
        match &loaded {
            Loaded::Indexed => self.evict_to_fit(0),
            Loaded::Present(other) if self.path_of(other) != path => {
                let _ = fs::remove_file(&path);
            }
            Loaded::Present(_) => {}
            Loaded::Purged => {
                let _ = fs::remove_file(&path);
            }
        }
        loaded
    }
}

/// What the walk of the tree found.
struct Walked {
    entries: u64,
    discarded: u64,
    /// Files it could not read (I/O errors): left as they are.
    unreadable: u64,
    /// Files not named as entries are: left as they are.
    foreign: u64,
    /// Directories it could not read.
    unread_dirs: u64,
}

/// Whether a file's name is an entry's: the hexadecimal hash `Layout::entry_path` names it by.
/// Anything else in the cache directory is not the cache's, and the load leaves it alone.
fn is_entry_name(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.len() == 32 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What the verification of a sample found.
#[derive(Default)]
struct Verified {
    verified: u64,
    corrupt: u64,
}

/// How often the load logs its progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Threads reading entry headers during the rebuild (see [`Store::index_tree`]): enough reads
/// in flight for an SSD's or a virtual disk's queue; on a warm page cache the work is CPU-bound
/// and the extra threads only wait.
const READERS: usize = 16;

/// The rebuild's shared state: directories to read and how many are being read (the walk ends
/// when both are none), and what was found.
struct Work {
    queue: parking_lot::Mutex<(Vec<PathBuf>, usize)>,
    more: parking_lot::Condvar,
    entries: AtomicU64,
    discarded: AtomicU64,
    unreadable: AtomicU64,
    foreign: AtomicU64,
    unread_dirs: AtomicU64,
    /// When progress was last logged.
    logged: parking_lot::Mutex<std::time::Instant>,
}

impl Work {
    /// Logs the load's progress (`n` entries indexed) at most every [`PROGRESS_EVERY`].
    fn progress(&self, n: u64) {
        let Some(mut at) = self.logged.try_lock() else {
            return;
        };
        if at.elapsed() >= PROGRESS_EVERY {
            *at = std::time::Instant::now();
            tracing::info!(entries = n, "cache index loading");
        }
    }

    /// The next directory to read, waiting while others are read (they may find more); None
    /// once none is left and none is being read.
    fn next(&self) -> Option<PathBuf> {
        let mut q = self.queue.lock();
        loop {
            if let Some(d) = q.0.pop() {
                q.1 += 1;
                return Some(d);
            }
            if q.1 == 0 {
                return None;
            }
            self.more.wait(&mut q);
        }
    }

    /// A directory found: queued for a reader.
    fn push(&self, d: PathBuf) {
        self.queue.lock().0.push(d);
        self.more.notify_one();
    }

    /// A directory read to its end.
    fn done(&self) {
        let mut q = self.queue.lock();
        q.1 -= 1;
        if q.1 == 0 && q.0.is_empty() {
            // The walk is over: every waiting reader ends.
            self.more.notify_all();
        }
    }
}

/// Whether temp file `name` (`<pid>-<n>.tmp`, see `Layout::temp_path`) belongs to a running
/// process other than this one. A pid reused by an unrelated process keeps a dead fill's file
/// until the next start: a few bytes, against deleting a live process's fill under it.
fn fill_of_another_live_process(name: &str) -> bool {
    let Some(pid) = name
        .split_once('-')
        .and_then(|(pid, _)| pid.parse::<i32>().ok())
        .filter(|pid| *pid > 0)
    else {
        return false;
    };
    if pid as u32 == std::process::id() {
        return false;
    }
    // No signal checks only that the process exists; EPERM says it does, under another user.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    }
}
