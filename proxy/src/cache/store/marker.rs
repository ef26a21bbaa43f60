//! The marker of a varying URL: a small entry file at the URL's primary key hash that names the
//! request fields its responses vary on (RFC 9111 §4.1). A variant's file is named by the hash of
//! its secondary key, which those names build (`cache::variance`); the index knows them, but a
//! request that comes before the index does (the background load after a start, an upgrade)
//! finds the variant through the marker: one read of the file its primary hash names, a second
//! of the variant's. The rebuild indexes markers too, as the URL's Vary names, not as entries.
//!
//! A marker is an entry file like any other (same header, checksum and layout) whose status is
//! 0, which no response has, with an empty body; it is written when the first variant of a URL
//! is stored, replaced by a response without Vary stored at the primary hash (the URL no longer
//! varies), deleted with a purge of its URL, and evicted once its URL is no longer asked for.

use super::Store;
use crate::cache::entry::{self, Meta};
use crate::cache::key::CacheKey;
use crate::cache::variance::primary_text;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, SystemTime};

/// The status a marker's meta carries.
const MARKER_STATUS: u16 = 0;

/// Whether `meta` is a marker's.
pub(crate) fn is_marker(meta: &Meta) -> bool {
    meta.status == MARKER_STATUS
}

impl Store {
    /// The hash of the primary key of the entry keyed `key` (its own hash's text unless it is a
    /// variant), masked as keys are (`debug.key_hash_bits`).
    pub(super) fn primary_hash(&self, key: &str) -> u128 {
        CacheKey::from_text(primary_text(key).to_string(), self.hash_bits).hash
    }

    /// Writes (and indexes) the marker of the URL `variant` is a variant of, unless the one
    /// there already names the same fields. A failure costs only the finding of this URL's
    /// variants before the index has them: logged, not returned.
    pub(crate) fn mark_varying(&self, variant: &Meta) {
        let primary = primary_text(&variant.key);
        if variant.vary.is_empty() || primary.len() == variant.key.len() {
            return;
        }
        let hash = self.primary_hash(&variant.key);
        if self.index.lock().marks(hash, &variant.vary) {
            return;
        }
        let meta = Meta {
            key: primary.to_string(),
            stored_at: SystemTime::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::ZERO,
            status: MARKER_STATUS,
            reason: String::new(),
            fields: Vec::new(),
            vary: variant.vary.clone(),
            url: variant.url.clone(),
        };
        if let Err(e) = self.write_marker(hash, &meta) {
            tracing::debug!(error = %e, key = %meta.key, "could not write a Vary marker");
        }
    }

    fn write_marker(&self, hash: u128, meta: &Meta) -> io::Result<()> {
        let encoded = meta.encode();
        let header = entry::encode_header(&encoded, 0, entry::BodyHasher::new().digest());
        let tmp = self.temp_path();
        let written = (|| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all_at(&header, 0)?;
            f.set_len(entry::body_offset(encoded.len()))?;
            let path = self.entry_path(hash)?;
            if self.is_handing_over() {
                return Err(io::Error::other(crate::cache::fill::HANDING_OVER));
            }
            std::fs::rename(&tmp, &path)?;
            Ok(path)
        })();
        let path = match written {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let at = self.placement(
            &path,
            hash,
            entry::next_id(),
            entry::body_offset(encoded.len()),
            0,
            entry::BodyHasher::new().digest(),
        );
        self.index_at(meta, at, None);
        Ok(())
    }
}
