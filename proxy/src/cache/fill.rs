//! A fill: the upstream body written to a temp file as it streams to the client, becoming an entry
//! only by [`Fill::commit`] (write the header, rename into place, index). Dropping a fill that was
//! not committed deletes the temp file, so a failing or truncated upstream never leaves an entry.
//!
//! The body's checksum is computed from the bytes as they are written (no extra read) and stored
//! in the header at commit, so a body that changes on disk later is found (see
//! [`super::scrub`]).

use super::entry::{self, BodyHasher, Entry, Meta};
use super::store::Store;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

/// An entry being written.
pub struct Fill {
    store: Arc<Store>,
    hash: u128,
    meta: Vec<u8>,
    decoded_meta: Meta,
    file: Arc<File>,
    tmp: PathBuf,
    body_offset: u64,
    written: u64,
    /// Checksum of the body bytes written so far.
    hasher: BodyHasher,
    committed: bool,
    /// The body sizes this fill may commit (its route's `min_object_size`/`max_object_size`).
    min_body: u64,
    max_body: u64,
}

impl Fill {
    /// Creates the temp file; the header is written at commit, when the body length is known.
    pub fn create(store: Arc<Store>, hash: u128, meta: Meta) -> io::Result<Fill> {
        let tmp = store.temp_path();
        let file = OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&tmp)?;
        let encoded = meta.encode();
        let body_offset = entry::body_offset(encoded.len());
        Ok(Fill {
            store,
            hash,
            meta: encoded,
            decoded_meta: meta,
            file: Arc::new(file),
            tmp,
            body_offset,
            written: 0,
            hasher: BodyHasher::new(),
            committed: false,
            min_body: 0,
            max_body: u64::MAX,
        })
    }

    /// Bounds the body this fill may commit: a body found smaller than `min` or larger than
    /// `max` when it ends is relayed to its readers and never committed.
    pub fn bounded(mut self, min: u64, max: u64) -> Fill {
        self.min_body = min;
        self.max_body = max;
        self
    }

    /// The key hash this fill stores under.
    pub fn hash(&self) -> u128 {
        self.hash
    }

    /// Why what was written so far may never be committed: larger than the fill's bound, or,
    /// header included, than the whole cache (`cache.max_size`: committing it would evict every
    /// other entry to make room, then the entry itself). `None` while it may.
    pub fn too_large(&self) -> Option<&'static str> {
        (self.written > self.max_body || self.body_offset + self.written > self.store.max_size())
            .then_some("too-large")
    }

    /// Whether the whole body, once written, is smaller than the fill's bound.
    pub fn too_small(&self) -> Option<&'static str> {
        (self.written < self.min_body).then_some("too-small")
    }

    /// Appends body bytes, adding them to the body checksum.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.file
            .write_all_at(data, self.body_offset + self.written)?;
        self.hasher.update(data);
        self.written += data.len() as u64;
        Ok(())
    }

    /// Reserves the disk space of a body of `len` bytes (fallocate(2)), so a disk that cannot
    /// hold it says so before any client reads behind the fill: a full disk then degrades to
    /// pass-through instead of cutting readers off mid-body. A filesystem without fallocate
    /// reserves nothing and is not an error.
    pub fn reserve(&self, len: u64) -> io::Result<()> {
        use nix::fcntl::{FallocateFlags, fallocate};
        if len == 0 {
            return Ok(());
        }
        match fallocate(
            &*self.file,
            FallocateFlags::empty(),
            self.body_offset as i64,
            len as i64,
        ) {
            Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(io::Error::from(e)),
        }
    }

    /// The file being written, for clients that read behind the fill.
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// The entry as it will be indexed, with the body length not yet known (0).
    pub fn entry_preview(&self) -> Entry {
        Entry::new(
            self.hash,
            self.decoded_meta.clone(),
            self.tmp.clone(),
            self.body_offset,
            0,
            self.store.targeted(),
        )
    }

    /// Body bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Writes the header (with the body checksum), renames into place and indexes the entry.
    pub fn commit(mut self) -> io::Result<Arc<Entry>> {
        if self.store.is_handing_over() {
            // Dropped: the temp file goes, and the successor's index stays true.
            return Err(io::Error::other(HANDING_OVER));
        }
        let body_checksum = self.hasher.digest();
        let header = entry::encode_header(&self.meta, self.written, body_checksum);
        self.file.write_all_at(&header, 0)?;
        // An empty body still needs the file to reach body_offset for the length check.
        self.file.set_len(self.body_offset + self.written)?;
        let path = self.store.entry_path(self.hash)?;
        self.store.evict_to_fit(self.body_offset + self.written);
        std::fs::rename(&self.tmp, &path)?;
        self.committed = true;
        let e = Arc::new(
            Entry::new(
                self.hash,
                self.decoded_meta.clone(),
                path,
                self.body_offset,
                self.written,
                self.store.targeted(),
            )
            .with_body_checksum(body_checksum),
        );
        self.store.insert_entry(e.clone());
        self.store.mark_varying(&e.meta);
        self.store.write_ok();
        Ok(e)
    }
}

/// Why a commit was refused during a SIGUSR2 upgrade.
pub(crate) const HANDING_OVER: &str = "the cache directory is being handed to a new process";

impl Drop for Fill {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
