//! The open-file cache: hot entries keep their file open, so a hit costs no open(2), and a bounded
//! number of them, so the cache can never take the descriptors client connections need. A held
//! file is trusted for [`NLINK_RECHECK`] before its link count is checked again (a file deleted
//! underneath is noticed within a second). Out of descriptors, it closes its idle files and tries
//! once more before giving up; only ENOENT says an entry is gone ([`OpenFailure`]).

use crate::cache::entry::{Entry, OpenFile, OpenSlot};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long an open file is trusted before its link count is checked again: a hot entry costs one
/// fstat(2) per second, not one per hit.
const NLINK_RECHECK: Duration = Duration::from_secs(1);

/// Size of the open-file cache for `cache.open_files: auto` when the fd limit allows it.
pub(crate) const OPEN_FILES_AUTO_MAX: usize = 10_000;

/// The open-file cache's size for `requested` (`None` for `auto`) under a soft RLIMIT_NOFILE of
/// `nofile`, and whether an explicit value had to be clamped.
///
/// `auto` takes a quarter of the fd limit (at most [`OPEN_FILES_AUTO_MAX`]) and an explicit value
/// at most half: the rest is for client connections, upstream connections and fills. A cache
/// allowed as many files as the limit (10,000 under `ulimit -n 256`) once took every descriptor,
/// after which neither a connection nor a cache file could be opened.
pub(crate) fn open_files_budget(requested: Option<usize>, nofile: u64) -> (usize, bool) {
    let share = |divisor: u64| usize::try_from(nofile / divisor).unwrap_or(usize::MAX);
    match requested {
        None => (OPEN_FILES_AUTO_MAX.min(share(4)), false),
        Some(n) if n > share(2) => (share(2), true),
        Some(n) => (n, false),
    }
}

/// What a failed open of an entry file says about the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenFailure {
    /// The file is gone (ENOENT): [`super::Store::open_file`] has dropped the entry from the
    /// index.
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
    pub(crate) fn of(err: &io::Error) -> OpenFailure {
        match err.raw_os_error() {
            Some(libc::ENOENT) => OpenFailure::Gone,
            Some(libc::EMFILE | libc::ENFILE) => OpenFailure::NoFds,
            _ => OpenFailure::Other,
        }
    }
}

/// Opens an entry file. Tests make it fail with a chosen errno (see `fail_next_opens`), since a
/// real EMFILE would need the whole test process's fd limit lowered.
fn open_entry_file(path: &Path) -> io::Result<File> {
    #[cfg(test)]
    if let Some(errno) = injected::next() {
        return Err(io::Error::from_raw_os_error(errno));
    }
    File::open(path)
}

/// The open-file cache's bookkeeping. The open file itself lives in its entry's slot
/// (`Entry::file`), so a hit finds it without a lookup here.
pub(crate) struct OpenFiles {
    max: usize,
    count: Arc<AtomicUsize>,
    /// The entries that were given a slot, oldest first, so that running out of fds can close the
    /// idle ones without walking the whole index. May hold entries that have since been dropped
    /// or lost their slot; [`OpenFiles::hold`] prunes those.
    held: Mutex<VecDeque<Weak<Entry>>>,
    /// Rate limit of the out-of-fds warning: when it was last logged, and failures since.
    fd_warning: Mutex<(Option<Instant>, u64)>,
}

impl OpenFiles {
    /// A cache of at most `max` open files.
    pub(crate) fn new(max: usize) -> OpenFiles {
        OpenFiles {
            max,
            count: Arc::new(AtomicUsize::new(0)),
            held: Mutex::new(VecDeque::new()),
            fd_warning: Mutex::new((None, 0)),
        }
    }

    /// Files currently held open.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// An open handle on `e`'s file, from the cache when possible. A held file whose link count
    /// fell to 0 is let go and the path opened again (ENOENT then tells the caller the entry is
    /// gone).
    pub(crate) fn open(&self, e: &Arc<Entry>) -> io::Result<Arc<File>> {
        let now = Instant::now();
        {
            let mut slot = e.file.lock();
            if let Some(of) = slot.as_mut() {
                if now.duration_since(of.checked) < NLINK_RECHECK {
                    return Ok(of.file.clone());
                }
                // An fstat error says nothing of the path: never let it read as ENOENT (gone).
                let nlink = of.file.metadata().map_err(io::Error::other)?.nlink();
                if nlink > 0 {
                    of.checked = now;
                    return Ok(of.file.clone());
                }
                *slot = None;
            }
        }
        let f = self.open_path(&e.path, Some(e))?;
        Ok(self.keep(e, f, now))
    }

    /// Opens the entry file at `path`; out of fds, closes the open-file cache's idle files (but
    /// `except`'s) and tries once more.
    pub(crate) fn open_path(&self, path: &Path, except: Option<&Arc<Entry>>) -> io::Result<File> {
        match open_entry_file(path) {
            Err(err) if OpenFailure::of(&err) == OpenFailure::NoFds => {
                // The idle files of the open-file cache are the only descriptors the store can
                // give back; a file still being sent keeps its fd until the send ends.
                let released = self.release(except);
                let retried = open_entry_file(path);
                if let Err(err) = &retried {
                    self.warn_no_fds(err, released);
                }
                retried
            }
            other => other,
        }
    }

    /// Keeps `f`, just opened for `e`, in `e`'s slot if the cache has room; returns it.
    pub(crate) fn keep(&self, e: &Arc<Entry>, f: File, now: Instant) -> Arc<File> {
        let f = Arc::new(f);
        // Keep it open only while the cache has room; a cold entry beyond that costs an open(2)
        // per hit rather than an fd forever.
        if self.count.fetch_add(1, Ordering::Relaxed) < self.max {
            *e.file.lock() = Some(OpenFile {
                file: f.clone(),
                checked: now,
                _slot: OpenSlot(self.count.clone()),
            });
            self.hold(e);
        } else {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        f
    }

    /// Records that `e` was given a slot.
    fn hold(&self, e: &Arc<Entry>) {
        let mut held = self.held.lock();
        held.push_back(Arc::downgrade(e));
        // Evicted entries and entries whose slot went leave stale references behind: prune them
        // once the list is twice the cache's size, so it stays O(max) at O(1) amortised.
        if held.len() > 2 * self.max.max(32) {
            held.retain(|w| {
                w.upgrade()
                    .is_some_and(|x| x.file.try_lock().is_none_or(|slot| slot.is_some()))
            });
        }
    }

    /// Closes the files held for entries other than `except`; returns how many slots were given
    /// back. Entries keep their place in the index: their next hit opens the file again.
    fn release(&self, except: Option<&Arc<Entry>>) -> usize {
        let held = std::mem::take(&mut *self.held.lock());
        let mut kept = Vec::new();
        let mut released = 0;
        for w in held {
            let Some(x) = w.upgrade() else { continue };
            if except.is_some_and(|e| Arc::ptr_eq(&x, e)) {
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
            open_files = self.count(),
            "out of file descriptors opening a cache file, even after closing idle cached files; entry kept"
        );
    }

    /// Entries on the held list (tests check it stays bounded).
    #[cfg(test)]
    pub(crate) fn held_len(&self) -> usize {
        self.held.lock().len()
    }
}

/// Injected open(2) failures for tests, per thread since tests run in parallel.
#[cfg(test)]
pub(crate) mod injected {
    use std::cell::RefCell;
    use std::collections::VecDeque;

    thread_local! {
        static FAIL_OPENS: RefCell<VecDeque<i32>> = const { RefCell::new(VecDeque::new()) };
    }

    /// The errno the next open of an entry file on this thread must fail with, if any.
    pub(crate) fn next() -> Option<i32> {
        FAIL_OPENS.with(|f| f.borrow_mut().pop_front())
    }

    /// Makes the next opens of entry files on this thread fail with `errnos`, in order.
    pub(crate) fn fail_next_opens(errnos: &[i32]) {
        FAIL_OPENS.with(|f| f.borrow_mut().extend(errnos));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
