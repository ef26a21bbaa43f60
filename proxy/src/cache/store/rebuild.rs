//! The rebuild at start-up: every file under the cache directory is read back into the index
//! (its header checked: magic, version, lengths), temp files of fills interrupted by a crash are
//! deleted, and a random sample of bodies is verified against their checksums.

use super::{Rebuilt, Store};
use crate::cache::entry;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

impl Store {
    /// Indexes every valid entry file and deletes the rest (temp files of fills interrupted by a
    /// crash or `kill -9`, torn or corrupt entries), then verifies the bodies of at most `verify` indexed entries, chosen at
    /// random (`cache.verify_on_start`): an entry whose body does not have its checksum is
    /// deleted and counted. Random rather than a fixed choice, so successive restarts cover
    /// different entries; the scrub covers them all in time. This reads up to `verify` whole
    /// bodies before the proxy listens, which is why it is a sample.
    pub fn rebuild_verifying(&self, verify: usize) -> io::Result<Rebuilt> {
        let mut out = Rebuilt::default();
        for t in fs::read_dir(self.layout.tmp_dir())? {
            let t = t?;
            // A SIGUSR2 upgrade shares the directory: the old process's fills in flight are its
            // own to finish or drop.
            if fill_of_another_live_process(&t.file_name().to_string_lossy()) {
                continue;
            }
            let _ = fs::remove_file(t.path());
            out.discarded += 1;
        }
        // Walk every directory but tmp and state: a changed `levels` still finds the old
        // entries, and the cache's own state is never taken for a foreign file.
        let (entries, discarded) = self.index_tree()?;
        out.entries += entries;
        out.discarded += discarded;
        self.evict_to_fit(0);
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

    /// Indexes every entry file under the cache directory (but `tmp/` and `state/`) on
    /// [`READERS`] threads, deleting what is not an entry; returns (indexed, deleted). A cold
    /// rebuild waits on the disk for every header it reads: one reader at a time left the disk's
    /// queue empty (37 s at 100,000 entries with the page cache dropped), where many keep it
    /// busy. Directories are the unit of work, shared through a queue, so the threads split any
    /// layout (`levels` 1 or 2, an old one beside a new one) without listing every file first.
    fn index_tree(&self) -> io::Result<(u64, u64)> {
        let work = Work {
            queue: parking_lot::Mutex::new((vec![self.layout.dir().to_path_buf()], 0)),
            more: parking_lot::Condvar::new(),
            entries: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            failed: parking_lot::Mutex::new(None),
        };
        std::thread::scope(|s| {
            for _ in 0..READERS {
                s.spawn(|| {
                    while let Some(d) = work.next() {
                        if let Err(e) = self.index_dir(&d, &work) {
                            work.failed.lock().get_or_insert(e);
                        }
                        work.done();
                    }
                });
            }
        });
        if let Some(e) = work.failed.into_inner() {
            return Err(e);
        }
        Ok((work.entries.into_inner(), work.discarded.into_inner()))
    }

    /// Indexes the files of `d` and queues its subdirectories.
    fn index_dir(&self, d: &Path, work: &Work) -> io::Result<()> {
        for e in fs::read_dir(d)? {
            let e = e?;
            let path = e.path();
            if e.file_type()?.is_dir() {
                if super::layout::holds_entries(self.layout.dir(), &path) {
                    work.push(path);
                }
                continue;
            }
            match self.index_file(&path) {
                Ok(()) => {
                    work.entries.fetch_add(1, Ordering::Relaxed);
                }
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

    fn index_file(&self, path: &Path) -> Result<(), entry::CorruptEntry> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let hash = u128::from_str_radix(name, 16).map_err(|_| entry::CorruptEntry::Magic)?;
        let file = File::open(path)?;
        let h = entry::read_entry_header(&file)?;
        self.index_read(path.to_path_buf(), hash, h);
        Ok(())
    }
}

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
    failed: parking_lot::Mutex<Option<io::Error>>,
}

impl Work {
    /// The next directory to read, waiting while others are read (they may find more); None
    /// once none is left and none is being read, or after a failure.
    fn next(&self) -> Option<PathBuf> {
        let mut q = self.queue.lock();
        loop {
            if self.failed.lock().is_some() {
                return None;
            }
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
        if q.1 == 0 && q.0.is_empty() || self.failed.lock().is_some() {
            // The walk is over (or failed): every waiting reader ends.
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
    // Signal 0 checks only that the process exists; EPERM says it does, under another user.
    // SAFETY: kill(2) with signal 0 sends nothing.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
