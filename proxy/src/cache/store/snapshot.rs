//! The index handed from one process to the next. At a clean stop and at a SIGUSR2 hand-over,
//! once the process stores and evicts nothing more, the index is written to
//! `<cache>/state/index.snap` (56 bytes or so an entry, in eviction order, then the Vary lists,
//! then a checksum); the next process reads it back before it listens and starts with a complete
//! index, where a load would read every entry's head (a million heads, from a cold disk, take
//! minutes). The load still walks the directory for what the snapshot does not name (entries
//! under an older `levels`), but by file names only: a file whose hash is indexed is not
//! opened.
//!
//! A snapshot describes the directory only until someone stores into it again, so the next
//! process deletes it as soon as it has read it, and an upgrade that fails deletes it before
//! the old process stores again: a crash can never leave one behind that lies. One that is
//! missing, torn, corrupt or written under another `levels` or key width is ignored, and the
//! load reads every head as it would without one. Entries a snapshot names whose files are gone
//! (purged through the old process during the hand-over) are found gone on their next hit.
//! The state directory is never walked, so a snapshot is never taken for a foreign file.

use super::Store;
use super::layout::state_dir;
use std::io;
use std::path::PathBuf;

/// File magic, versioned.
const MAGIC: &[u8; 8] = b"ZCSNAP01";

/// The snapshot's name in the state directory.
const FILE: &str = "index.snap";

impl Store {
    fn snapshot_path(&self) -> PathBuf {
        state_dir(self.layout.dir()).join(FILE)
    }

    /// What a snapshot starts with: the magic, then the layout, key width and tag field it holds
    /// for.
    fn snapshot_head(&self) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[..8].copy_from_slice(MAGIC);
        h[8] = self.layout.levels();
        h[9] = self.hash_bits as u8;
        // Tags are restored as hashes read under the tag field's settings: another field, and
        // they would name other entries.
        h[10..].copy_from_slice(&self.tag_settings.to_le_bytes()[..6]);
        h
    }

    /// Writes the index for the next process; returns the entries written. Call once this
    /// process stores and evicts nothing more ([`Store::hand_over`]). Written under a temp name
    /// and renamed, so a crash mid-write leaves no snapshot at all.
    pub fn write_snapshot(&self) -> io::Result<u64> {
        let head = self.snapshot_head();
        // The buffer is sized and its pages touched before the lock, and the checksum made
        // after it: every request waits on this lock, and at a million entries a fresh 47 MB
        // buffer's page faults were half of the 47 ms it was held, the checksum 4 ms more.
        let size = self.index.lock().snapshot_size(head.len());
        // Not zeros: `vec![0; n]` is calloc's, whose fresh pages are not touched until written.
        let buf = std::hint::black_box(vec![0xa5u8; size]);
        let (body, entries) = {
            let ix = self.index.lock();
            (ix.snapshot_body(&head, buf), ix.usage().1)
        };
        let bytes = super::index::seal(body);
        let path = self.snapshot_path();
        let tmp = path.with_extension("snap.tmp");
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, &path)?;
        tracing::info!(entries, bytes = bytes.len(), path = %path.display(), "cache index written for the next process");
        Ok(entries)
    }

    /// Deletes the snapshot this process wrote for a successor that did not come: it stores
    /// again from now on, so the snapshot would go stale.
    pub fn discard_snapshot(&self) {
        let _ = std::fs::remove_file(self.snapshot_path());
    }

    /// Fills the (empty) index from the snapshot and deletes it; returns the entries restored,
    /// or `None` (and the index untouched) when there is none that holds.
    pub(super) fn restore_snapshot(&self) -> Option<u64> {
        let path = self.snapshot_path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the cache index snapshot; loading from the entries");
                let _ = std::fs::remove_file(&path);
                return None;
            }
        };
        // Read once, whatever it holds: from now on this process stores into the directory.
        let _ = std::fs::remove_file(&path);
        match self.index.lock().restore(&bytes, &self.snapshot_head()) {
            Ok(n) => Some(n),
            Err(why) => {
                tracing::warn!(path = %path.display(), why, "cache index snapshot ignored; loading from the entries");
                None
            }
        }
    }
}
