//! One stored response in memory: what a hit needs once the file's head is read (the prebuilt
//! hit head, validators, the reuse rules of its directives), and its slot in the open-file
//! cache. The index keeps only a few words per entry and the hottest entries whole
//! (`cache::store::index`); the file itself is [`format`].

mod format;

pub use format::*;

use crate::cache::targeted::Targeted;
use crate::http::head::{Framing, Head, HeadBuf};
use crate::http::stored_fields::StoredFields;
use bytes::Bytes;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A stored response read from its file's head (or kept whole while hot): everything a hit
/// needs, built once.
#[derive(Debug)]
pub struct Entry {
    /// Hash (index key and file name).
    pub hash: u128,
    /// This entry's identity, unique in the process ([`next_id`]): the index holds an entry's
    /// id, not the entry, so a replaced, purged or evicted entry is told from the current one
    /// by it. A copy read back from the file takes the id the index holds.
    pub id: u64,
    /// The stored metadata.
    pub meta: Meta,
    /// Where the file is.
    pub path: PathBuf,
    /// Body offset in the file.
    pub body_offset: u64,
    /// Body length.
    pub body_len: u64,
    /// xxh3-64 of the body as the fill wrote it (set by [`Entry::with_body_checksum`]; 0 in a
    /// preview, whose body is not complete). Kept in memory for the scrub, never used by a hit.
    pub body_checksum: u64,
    /// Status line, stored fields and Content-Length for a full-body hit, built once at insert.
    pub hit_head: Bytes,
    /// The set of the names in `hit_head` (`field_edit::names_of`), found the first time a
    /// rule edits a hit's head: [`Entry::head_names`].
    head_names: std::sync::OnceLock<u128>,
    /// Open-file cache: the file stays open while the entry is indexed, so a hot hit costs no
    /// open(2). Replaced when the file turns out to be deleted underneath.
    pub file: parking_lot::Mutex<Option<OpenFile>>,
    /// Milliseconds since the process epoch of the last hit; an entry hit within the last second
    /// is taken as resident in the page cache without asking the kernel.
    pub last_hit_ms: std::sync::atomic::AtomicU64,
    /// What the stored response's directives demand of its reuse.
    pub reuse: crate::cache::freshness::Reuse,
    /// Stored `ETag`, for validation and conditional requests.
    pub etag: Option<String>,
    /// Stored `Last-Modified`.
    pub last_modified: Option<String>,
    /// Stored `Date`: what `If-Modified-Since` is compared with when there is no
    /// `Last-Modified`.
    pub date: Option<String>,
    /// `stale-if-error` of the stored response.
    pub stale_if_error: Option<Duration>,
    /// `stale-while-revalidate` of the stored response.
    pub stale_while_revalidate: Option<Duration>,
}

/// What [`Entry::new`] needs of a stored field block, found in one pass over its lines: an entry
/// read back from its file on a hit is built on that hit, and a pass per field (validators,
/// `Date`, each directive field, the hidden-field check) was most of its cost.
struct Picked<'a> {
    /// The first UTF-8 value of each validator field and of `Date` (as [`StoredFields::get`]).
    etag: Option<&'a str>,
    last_modified: Option<&'a str>,
    date: Option<&'a str>,
    /// The UTF-8 values of the fields that may govern reuse (the targeted ones and
    /// `Cache-Control`), with their names, in order.
    directives: Vec<(&'a str, &'a str)>,
    /// Whether a line is withheld from clients (`Targeted::hides`).
    hidden: bool,
}

impl<'a> Picked<'a> {
    fn of(fields: &'a [u8], targeted: &Targeted) -> Picked<'a> {
        let mut p = Picked {
            etag: None,
            last_modified: None,
            date: None,
            directives: Vec::new(),
            hidden: false,
        };
        for line in StoredFields(fields).lines() {
            let name = line.name;
            p.hidden = p.hidden || targeted.hides(name);
            let Ok(value) = std::str::from_utf8(line.value) else {
                continue;
            };
            let first = |slot: &mut Option<&'a str>, field: &str| {
                if slot.is_none() && name.eq_ignore_ascii_case(field) {
                    *slot = Some(value);
                }
            };
            first(&mut p.etag, "etag");
            first(&mut p.last_modified, "last-modified");
            first(&mut p.date, "date");
            if targeted.may_govern(name) {
                p.directives.push((name, value));
            }
        }
        p
    }

    /// Field `name`'s values comma-joined, as [`StoredFields::joined`] gives them.
    fn joined(&self, name: &str) -> Option<String> {
        let mut values = self
            .directives
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v);
        let mut joined = values.next()?.to_string();
        for v in values {
            joined.push_str(", ");
            joined.push_str(v);
        }
        Some(joined)
    }
}

/// An open entry file and when its link count was last checked.
#[derive(Debug)]
pub struct OpenFile {
    /// The file.
    pub file: Arc<File>,
    /// When `st_nlink` was last checked.
    pub checked: std::time::Instant,
    /// This file's place in the open-file cache's count, given back on drop.
    pub _slot: OpenSlot,
}

/// One unit of the open-file cache's count; dropping it frees the slot.
#[derive(Debug)]
pub struct OpenSlot(pub Arc<std::sync::atomic::AtomicUsize>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Entry {
    /// Builds the in-memory entry, with a body checksum of 0 until
    /// [`Entry::with_body_checksum`] gives the real one. `targeted` decides which stored field
    /// governs reuse (RFC 9213) and whether targeted fields are in the hit head.
    pub fn new(
        hash: u128,
        meta: Meta,
        path: PathBuf,
        body_offset: u64,
        body_len: u64,
        targeted: &Targeted,
    ) -> Entry {
        let picked = Picked::of(&meta.fields, targeted);
        // The hit head's unfinished start, which a hit resumes (`http::head`).
        let mut head = HeadBuf::h1(64 + meta.fields.len());
        let visible = if picked.hidden {
            targeted.visible(&meta.fields)
        } else {
            std::borrow::Cow::Borrowed(&meta.fields[..])
        };
        Head::new(&mut head, meta.status, &meta.reason)
            .lines(&visible)
            .framing(Framing::Length(body_len));
        let head = head.into_wire();
        // The field that governed storage governs reuse too: a valid CDN-Cache-Control replaces
        // Cache-Control's no-cache, must-revalidate and stale-* directives as well (RFC 9213 §2.2).
        let (d, _) = targeted.governing(|name| picked.joined(name));
        Entry {
            reuse: crate::cache::freshness::Reuse::of(&d),
            etag: picked.etag.map(str::to_string),
            last_modified: picked.last_modified.map(str::to_string),
            date: picked.date.map(str::to_string),
            stale_if_error: d.stale_if_error.map(Duration::from_secs),
            stale_while_revalidate: d.stale_while_revalidate.map(Duration::from_secs),
            hash,
            id: next_id(),
            hit_head: Bytes::from(head),
            head_names: std::sync::OnceLock::new(),
            meta,
            path,
            body_offset,
            body_len,
            body_checksum: 0,
            file: parking_lot::Mutex::new(None),
            last_hit_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The set of the field names in the hit head, found once.
    pub fn head_names(&self) -> u128 {
        *self
            .head_names
            .get_or_init(|| crate::http::field_edit::names_of(&self.hit_head))
    }

    /// The entry as the index knows it: read back from its file, it takes the id indexed.
    pub fn with_id(mut self, id: u64) -> Entry {
        self.id = id;
        self
    }

    /// The entry with the checksum of its complete body.
    pub fn with_body_checksum(mut self, body_checksum: u64) -> Entry {
        self.body_checksum = body_checksum;
        self
    }

    /// Current age (§4.2.3): corrected initial age plus resident time.
    pub fn age(&self, now: SystemTime) -> Duration {
        self.meta
            .initial_age
            .saturating_add(now.duration_since(self.meta.stored_at).unwrap_or_default())
    }
}

/// A new entry identity ([`Entry::id`]).
pub fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::format::tests::meta;
    use super::*;

    #[test]
    fn hit_head_is_prebuilt() {
        let e = Entry::new(
            1,
            meta(),
            PathBuf::from("/x"),
            4096,
            1024,
            &Targeted::default(),
        );
        assert_eq!(
            &e.hit_head[..],
            b"HTTP/1.1 200 OK\r\nCache-Control: max-age=3600\r\nContent-Length: 1024\r\n"
        );
    }

    /// The one pass of [`Picked`] against what a pass per field gives (`StoredFields::get`,
    /// `joined`, `Targeted::visible` and `governing`), over hostile blocks: values that are not
    /// UTF-8, repeated and split directive fields, an invalid targeted field, a name that is
    /// not UTF-8, a hidden tag field, names in any case.
    #[test]
    fn one_pass_over_the_fields_finds_what_a_pass_per_field_finds() {
        let blocks: [&[u8]; 7] = [
            b"ETag: \"a\"\r\nCache-Control: max-age=5\r\ncache-control: must-revalidate\r\n",
            b"etag: \xff\r\nETAG: \"b\"\r\nLast-Modified: x\r\nDATE: d1\r\nDate: d2\r\n",
            b"CDN-Cache-Control: max-age=60\r\nCache-Control: no-cache\r\n",
            b"CDN-Cache-Control: max-age=\"60\"\r\nCache-Control: no-cache, stale-if-error=9\r\n",
            b"CDN-Cache-Control: max-age=60\r\ncdn-cache-control: immutable\r\n",
            b"Surrogate-Key: a b\r\n\xffName: v\r\nCache-Control: \xff\r\nX: y\r\n",
            b"",
        ];
        let plain = Targeted::default();
        let hiding =
            Targeted::new(&["CDN-Cache-Control".to_string()], false).hiding("surrogate-key");
        for fields in blocks {
            for targeted in [&plain, &hiding] {
                let mut m = meta();
                m.fields = fields.to_vec();
                let e = Entry::new(1, m, PathBuf::from("/x"), 4096, 3, targeted);
                let stored = StoredFields(fields);
                let what = String::from_utf8_lossy(fields);
                assert_eq!(e.etag.as_deref(), stored.get("etag"), "{what}");
                assert_eq!(
                    e.last_modified.as_deref(),
                    stored.get("last-modified"),
                    "{what}"
                );
                assert_eq!(e.date.as_deref(), stored.get("date"), "{what}");
                let (d, _) = targeted.governing(|n| stored.joined(n));
                assert_eq!(e.reuse, crate::cache::freshness::Reuse::of(&d), "{what}");
                assert_eq!(e.stale_if_error, d.stale_if_error.map(Duration::from_secs));
                let mut head = HeadBuf::h1(64);
                Head::new(&mut head, 200, "OK")
                    .lines(&targeted.visible(fields))
                    .framing(Framing::Length(3));
                assert_eq!(&e.hit_head[..], &head.into_wire()[..], "{what}");
            }
        }
    }
}
