//! Reading an indexed entry back from its file: the index keeps a few words per entry, so an
//! entry that is not among the hot ones is made whole from its file's head, one `pread` (see
//! `entry::read_entry_head`), on the hit that needs it. The file is checked against what the
//! index holds (lengths and body checksum), so a file replaced underneath (a successor's fill
//! during an upgrade) is never served as this entry; a file gone is unindexed, a corrupt head
//! deleted, and anything else (EIO, out of fds) leaves the entry for the next try. While the
//! index loads in the background, an entry it does not hold yet is found here too, by the path
//! its hash names.

use super::index::{Loaded, Located};
use super::open_files::OpenFailure;
use super::{Store, marker};
use crate::cache::entry::{self, CorruptEntry, Entry};
use crate::cache::key::CacheKey;
use std::path::PathBuf;
use std::sync::Arc;

impl Store {
    /// While the index loads: looks for the entry `primary` (or, when its URL varies, the
    /// variant `variant` builds from its marker's names) by the path its hash names under the
    /// current `levels`, and indexes what it finds (the marker too); true if it indexed the
    /// entry, which the caller then looks up as usual. A file under an older `levels` is found
    /// only by the load.
    pub(super) fn find_unindexed(
        &self,
        primary: &CacheKey,
        variant: &impl Fn(&[String]) -> CacheKey,
    ) -> bool {
        let Some((path, h)) = self.read_unindexed(primary.hash) else {
            return false;
        };
        let (key, path, h) = if marker::is_marker(&h.meta) {
            if h.meta.key != primary.text {
                return false;
            }
            let key = variant(&h.meta.vary);
            if self.index_loaded(path, primary.hash, h) == Loaded::Purged {
                return false;
            }
            let Some((path, h)) = self.read_unindexed(key.hash) else {
                return false;
            };
            (key, path, h)
        } else {
            (primary.clone(), path, h)
        };
        if h.meta.key != key.text || marker::is_marker(&h.meta) {
            return false;
        }
        self.index_loaded(path, key.hash, h) != Loaded::Purged
    }

    /// The head of the file the current layout names for `hash`, checked whole (as the load
    /// checks it); `None` if there is none or it does not hold.
    fn read_unindexed(&self, hash: u128) -> Option<(PathBuf, entry::Header)> {
        let path = self.layout.entry_path_unchecked(hash);
        let file = std::fs::File::open(&path).ok()?;
        self.head_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let h = entry::read_entry_header(&file).ok()?;
        Some((path, h))
    }

    /// Where the file of `at` is.
    pub(super) fn path_of(&self, at: &Located) -> PathBuf {
        at.foreign
            .clone()
            .unwrap_or_else(|| self.layout.entry_path_unchecked(at.hash))
    }

    /// The whole entry `at`: kept hot, or read from its file (without making it hot: a purge or
    /// a scrub is not a use). `None` if it is gone or cannot be read now.
    pub(super) fn entry_of(&self, at: &Located) -> Option<Arc<Entry>> {
        if let Some(Ok(e)) = self.index.lock().peek(at.hash)
            && e.id == at.id
        {
            return Some(e);
        }
        self.load(at)
    }

    /// Reads entry `at` from its file's head and holds the file open (the open-file cache).
    pub(super) fn load(&self, at: &Located) -> Option<Arc<Entry>> {
        let path = self.path_of(at);
        let file = match self.files.open_path(&path, None) {
            Ok(f) => f,
            Err(err) => {
                if OpenFailure::of(&err) == OpenFailure::Gone {
                    self.index.lock().take_if_same(at.hash, at.id);
                }
                return None;
            }
        };
        self.head_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let h = match entry::read_entry_head(&file, at.body_offset) {
            Ok(h) => h,
            // An I/O error says nothing of the bytes: the entry stays for the next try.
            Err(CorruptEntry::Io(err)) => {
                tracing::debug!(path = %path.display(), error = %err, "could not read a cache entry's head");
                return None;
            }
            Err(err) => {
                // Handing over, the file may be the successor's, mid-rewrite: not ours to delete.
                if !self.is_handing_over()
                    && self.index.lock().take_if_same(at.hash, at.id).is_some()
                {
                    tracing::warn!(path = %path.display(), error = %err, "discarding cache entry with a corrupt head");
                    let _ = std::fs::remove_file(&path);
                }
                return None;
            }
        };
        if (h.body_offset, h.body_len, h.body_checksum)
            != (at.body_offset, at.body_len, at.body_checksum)
            || marker::is_marker(&h.meta)
        {
            // Another body under this name (a successor's refill during an upgrade), or a
            // marker (never a response): not the entry indexed, so not served as it.
            return None;
        }
        let e = Arc::new(
            Entry::new(
                at.hash,
                h.meta,
                path,
                at.body_offset,
                at.body_len,
                &self.targeted,
            )
            .with_body_checksum(at.body_checksum)
            .with_id(at.id),
        );
        self.files.keep(&e, file, std::time::Instant::now());
        Some(e)
    }
}
