//! One stored response on disk: the file layout, its encoding and decoding, and the checksums
//! that prove a header and a body whole.
//!
//! File layout (little-endian):
//!
//! ```text
//! 0   magic "ZCENTRY5"                                     8 B
//! 8   meta_len: u32                                         4 B
//! 12  checksum: u32 (xxh3-64 of bytes 16..40 and meta, low) 4 B
//! 16  body_len: u64                                         8 B
//! 24  body_offset: u64 (a multiple of 4096)                 8 B
//! 32  body_checksum: u64 (xxh3-64 of the body bytes)        8 B
//! 40  meta: key, times, status, stored header block         meta_len B
//! ..  zero padding up to body_offset
//! body_offset  body                                         body_len B
//! ```
//!
//! Why the body starts page-aligned: a hit is then one sendfile from an aligned offset, which
//! keeps page-cache reads whole pages and avoids the loopback stall nginx shows when it sends from
//! offset 618 to EOF with its head corked. Why a checksum and no fsync: a cache may lose entries in
//! a crash but must never serve a torn one; at start-up an entry whose checksum or length does not
//! hold is deleted.
//!
//! Why a body checksum: the header checksum says nothing of the body, so a flipped byte in a body
//! was served forever, across restarts. The fill computes the body's checksum as it writes (no
//! extra read) and stores it in the checksummed part of the header; it is verified where that
//! costs the hit path nothing: for a sample of entries at start-up, by the background scrub
//! ([`crate::cache::scrub`]) and by `zerocache check-cache`. A hit never reads the body.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// File magic, versioned.
pub const MAGIC: &[u8; 8] = b"ZCENTRY5";
/// Bytes before the meta block.
pub const FIXED: usize = 40;
/// Where the header checksum's coverage of the fixed part starts (it runs to [`FIXED`], then
/// covers the meta block).
const SUMMED: usize = 16;
/// Body alignment.
pub const ALIGN: u64 = 4096;

/// The metadata stored in an entry file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Full cache key text, compared on every lookup.
    pub key: String,
    /// When the response was received (RFC 9111 `response_time`).
    pub stored_at: SystemTime,
    /// Age the response already had when received (corrected initial age, §4.2.3).
    pub initial_age: Duration,
    /// Freshness lifetime (§4.2.1).
    pub lifetime: Duration,
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// Stored header fields as `Name: value\r\n` lines, without hop-by-hop and framing fields.
    pub fields: Vec<u8>,
    /// Lower-cased names of the request fields the response varies on (`Vary`).
    pub vary: Vec<String>,
    /// The URL part of the key (`GET|scheme|host|target`), shared by every variant of a URL:
    /// what invalidation and purge remove.
    pub url: String,
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Meta {
    /// Serialises the meta block.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.key.len() + self.fields.len());
        let put_bytes = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        };
        put_bytes(&mut out, self.key.as_bytes());
        out.extend_from_slice(&millis(self.stored_at).to_le_bytes());
        out.extend_from_slice(&(self.initial_age.as_millis() as u64).to_le_bytes());
        out.extend_from_slice(&(self.lifetime.as_millis() as u64).to_le_bytes());
        out.extend_from_slice(&self.status.to_le_bytes());
        put_bytes(&mut out, self.reason.as_bytes());
        put_bytes(&mut out, &self.fields);
        put_bytes(&mut out, self.vary.join(",").as_bytes());
        put_bytes(&mut out, self.url.as_bytes());
        out
    }

    /// Parses a meta block; `None` if it is malformed.
    pub fn decode(mut b: &[u8]) -> Option<Meta> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            if b.len() < n {
                return None;
            }
            let (h, t) = b.split_at(n);
            *b = t;
            Some(h)
        }
        fn u64_(b: &mut &[u8]) -> Option<u64> {
            Some(u64::from_le_bytes(take(b, 8)?.try_into().ok()?))
        }
        fn bytes<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
            let n = u32::from_le_bytes(take(b, 4)?.try_into().ok()?) as usize;
            take(b, n)
        }
        let key = String::from_utf8(bytes(&mut b)?.to_vec()).ok()?;
        let stored_at = UNIX_EPOCH + Duration::from_millis(u64_(&mut b)?);
        let initial_age = Duration::from_millis(u64_(&mut b)?);
        let lifetime = Duration::from_millis(u64_(&mut b)?);
        let status = u16::from_le_bytes(take(&mut b, 2)?.try_into().ok()?);
        let reason = String::from_utf8(bytes(&mut b)?.to_vec()).ok()?;
        let fields = bytes(&mut b)?.to_vec();
        let vary = std::str::from_utf8(bytes(&mut b)?)
            .ok()?
            .split(',')
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect();
        let url = String::from_utf8(bytes(&mut b)?.to_vec()).ok()?;
        Some(Meta {
            key,
            stored_at,
            initial_age,
            lifetime,
            status,
            reason,
            fields,
            vary,
            url,
        })
    }
}

/// Offset of the body for a meta block of `meta_len` bytes.
pub fn body_offset(meta_len: usize) -> u64 {
    ((FIXED + meta_len) as u64).div_ceil(ALIGN) * ALIGN
}

/// The fixed part and meta block, ready to write at offset 0, for a body of `body_len` bytes whose
/// xxh3-64 is `body_checksum`, at the smallest aligned offset after them.
pub fn encode_header(meta: &[u8], body_len: u64, body_checksum: u64) -> Vec<u8> {
    encode_header_at(meta, body_len, body_offset(meta.len()), body_checksum)
}

/// Like [`encode_header`] for a body at `offset` (a rewritten header keeps its body in place).
pub fn encode_header_at(meta: &[u8], body_len: u64, offset: u64, body_checksum: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED + meta.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&body_checksum.to_le_bytes());
    out.extend_from_slice(meta);
    let sum = checksum(&out[SUMMED..FIXED], meta);
    out[12..16].copy_from_slice(&sum.to_le_bytes());
    out
}

fn checksum(fixed_tail: &[u8], meta: &[u8]) -> u32 {
    let mut buf = Vec::with_capacity(fixed_tail.len() + meta.len());
    buf.extend_from_slice(fixed_tail);
    buf.extend_from_slice(meta);
    xxh3_64(&buf) as u32
}

#[cfg(test)]
/// The body checksum of a body held in memory (what [`BodyHasher`] computes piece by piece).
pub fn body_checksum(body: &[u8]) -> u64 {
    xxh3_64(body)
}

/// The body checksum computed as the body streams by: a fill feeds it every piece it writes, so
/// the checksum costs no read of its own. Boxed, since the hasher's state is over 500 bytes.
#[derive(Clone)]
pub struct BodyHasher(Box<Xxh3>);

impl BodyHasher {
    /// A hasher that has seen no bytes.
    pub fn new() -> BodyHasher {
        BodyHasher(Box::new(Xxh3::new()))
    }

    /// Feeds the next body bytes.
    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    /// The checksum of every byte fed so far.
    pub fn digest(&self) -> u64 {
        self.0.digest()
    }
}

impl Default for BodyHasher {
    fn default() -> Self {
        BodyHasher::new()
    }
}

impl std::fmt::Debug for BodyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BodyHasher").field(&self.digest()).finish()
    }
}

/// Why an entry file was rejected (at start-up, by the scrub or by `check-cache`).
#[derive(Debug, thiserror::Error)]
pub enum CorruptEntry {
    /// Could not read it.
    #[error("read: {0}")]
    Io(#[from] io::Error),
    /// Wrong magic or version.
    #[error("not a zerocache entry")]
    Magic,
    /// Header checksum mismatch.
    #[error("header checksum mismatch")]
    Checksum,
    /// File length differs from body offset + body length.
    #[error("length {actual} != expected {expected}")]
    Length {
        /// Bytes on disk.
        actual: u64,
        /// Bytes the header promises.
        expected: u64,
    },
    /// Malformed meta block.
    #[error("malformed metadata")]
    Meta,
    /// The body's bytes do not have the checksum the header holds.
    #[error("body checksum {actual:016x} != stored {expected:016x}")]
    Body {
        /// The checksum in the header.
        expected: u64,
        /// The checksum of the bytes on disk.
        actual: u64,
    },
}

/// An entry file's verified header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The stored metadata.
    pub meta: Meta,
    /// Where the body starts (a multiple of [`ALIGN`]).
    pub body_offset: u64,
    /// Body length.
    pub body_len: u64,
    /// xxh3-64 of the body bytes, as the fill computed it.
    pub body_checksum: u64,
}

/// Reads and verifies an entry file's header (magic, header checksum, length, meta). The body is
/// not read: its checksum is returned for whoever verifies it.
pub fn read_entry_header(file: &File) -> Result<Header, CorruptEntry> {
    let mut fixed = [0u8; FIXED];
    file.read_exact_at(&mut fixed, 0)?;
    let (meta_len, sum, body_len, offset, body_checksum) = parse_fixed(&fixed)?;
    let mut meta = vec![0u8; meta_len];
    file.read_exact_at(&mut meta, FIXED as u64)?;
    if checksum(&fixed[SUMMED..FIXED], &meta) != sum {
        return Err(CorruptEntry::Checksum);
    }
    let actual = file.metadata()?.len();
    let expected = offset.saturating_add(body_len);
    if actual != expected {
        return Err(CorruptEntry::Length { actual, expected });
    }
    let meta = Meta::decode(&meta).ok_or(CorruptEntry::Meta)?;
    Ok(Header {
        meta,
        body_offset: offset,
        body_len,
        body_checksum,
    })
}

/// The most a hit reads of an entry's head in its one `pread`: a head is nearly always one page
/// (the body starts at the next 4 KiB boundary), and a longer one costs a second read.
const HEAD_READ: u64 = 16 * 1024;

/// Reads and verifies an indexed entry's head (magic, header checksum, meta) with one `pread`
/// of its first `body_offset` bytes (at most [`HEAD_READ`]; a longer head takes a second). The
/// hit path's read: unlike [`read_entry_header`] it does not stat the file, since the caller
/// compares the lengths and body checksum with what the index holds.
///
/// The bytes land in a buffer each thread keeps (see [`HEAD_BUF`]): a fresh zeroed 4 KiB
/// allocation per cold hit cost more instructions than the rest of the read, and a freed
/// chunk that size made the allocator consolidate its free lists on the next one.
pub fn read_entry_head(file: &File, body_offset: u64) -> Result<Header, CorruptEntry> {
    let want = body_offset.clamp(FIXED as u64, HEAD_READ) as usize;
    HEAD_BUF.with_borrow_mut(|buf| {
        if buf.len() < want {
            buf.resize(want, 0);
        }
        let mut got = 0;
        while got < want {
            match file.read_at(&mut buf[got..want], got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        let head = decode_head(file, buf, got);
        if buf.len() > HEAD_READ as usize {
            // A meta longer than a hit reads at once is rare: its buffer is not kept.
            *buf = Vec::new();
        }
        head
    })
}

thread_local! {
    /// The buffer [`read_entry_head`] reads into on this thread: it grows to the longest head
    /// read, at most [`HEAD_READ`], and stays, zeroed only once.
    static HEAD_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The head in `buf[..got]` (read from `file`'s start), checked and decoded; a meta longer than
/// what was read is read on into `buf`.
fn decode_head(file: &File, buf: &mut Vec<u8>, got: usize) -> Result<Header, CorruptEntry> {
    let fixed: &[u8; FIXED] = buf
        .get(..FIXED)
        .filter(|_| got >= FIXED)
        .and_then(|f| f.try_into().ok())
        .ok_or(CorruptEntry::Length {
            actual: got as u64,
            expected: FIXED as u64,
        })?;
    let (meta_len, sum, body_len, offset, body_checksum) = parse_fixed(fixed)?;
    if got < FIXED + meta_len {
        if buf.len() < FIXED + meta_len {
            buf.resize(FIXED + meta_len, 0);
        }
        file.read_exact_at(&mut buf[got..FIXED + meta_len], got as u64)?;
    }
    let meta = &buf[FIXED..FIXED + meta_len];
    if checksum(&buf[SUMMED..FIXED], meta) != sum {
        return Err(CorruptEntry::Checksum);
    }
    let meta = Meta::decode(meta).ok_or(CorruptEntry::Meta)?;
    Ok(Header {
        meta,
        body_offset: offset,
        body_len,
        body_checksum,
    })
}

/// The fixed part's fields: (meta_len, header checksum, body_len, body_offset, body_checksum),
/// with the magic, the meta's bound and the body's alignment checked.
fn parse_fixed(fixed: &[u8; FIXED]) -> Result<(usize, u32, u64, u64, u64), CorruptEntry> {
    if &fixed[..8] != MAGIC {
        return Err(CorruptEntry::Magic);
    }
    let u64_at = |at: usize| -> Result<u64, CorruptEntry> {
        let b = fixed.get(at..at + 8).ok_or(CorruptEntry::Meta)?;
        Ok(u64::from_le_bytes(
            b.try_into().map_err(|_| CorruptEntry::Meta)?,
        ))
    };
    let meta_len = u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]) as usize;
    let sum = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]);
    let body_len = u64_at(16)?;
    let offset = u64_at(24)?;
    let body_checksum = u64_at(32)?;
    if meta_len > 1 << 20 || offset < body_offset(meta_len) || offset % ALIGN != 0 {
        return Err(CorruptEntry::Meta);
    }
    Ok((meta_len, sum, body_len, offset, body_checksum))
}

#[cfg(any(test, feature = "fuzzing"))]
/// [`read_entry_header`] as (meta, body_offset, body_len), for callers that do not verify bodies.
pub fn read_header(file: &File) -> Result<(Meta, u64, u64), CorruptEntry> {
    let h = read_entry_header(file)?;
    Ok((h.meta, h.body_offset, h.body_len))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::io::Write;

    /// A typical stored response's metadata.
    pub(crate) fn meta() -> Meta {
        Meta {
            key: "GET http://h/x".into(),
            stored_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            initial_age: Duration::from_secs(5),
            lifetime: Duration::from_secs(3600),
            status: 200,
            reason: "OK".into(),
            fields: b"Cache-Control: max-age=3600\r\n".to_vec(),
            vary: vec!["accept-encoding".into()],
            url: "GET http://h/x".into(),
        }
    }

    #[test]
    fn meta_round_trips_and_body_is_page_aligned() {
        let m = meta();
        let enc = m.encode();
        assert_eq!(
            enc.len(),
            4 + 14 + 8 + 8 + 8 + 2 + 4 + 2 + 4 + 29 + 4 + 15 + 4 + 14
        );
        assert_eq!(Meta::decode(&enc), Some(m));
        assert_eq!(body_offset(10), 4096);
        assert_eq!(body_offset(4096 - FIXED), 4096);
        assert_eq!(body_offset(4096 - FIXED + 1), 8192);
    }

    #[test]
    fn header_checks_catch_corruption() {
        let meta = meta().encode();
        let header = encode_header(&meta, 3, body_checksum(b"abc"));
        let mut f = tempfile::tempfile().expect("tmp");
        f.write_all(&header).expect("w");
        f.write_all_at(b"abc", 4096).expect("w");
        let (m, off, len) = read_header(&f).expect("valid");
        assert_eq!((m.status, off, len), (200, 4096, 3));
        f.set_len(4098).expect("truncate");
        assert!(matches!(
            read_header(&f),
            Err(CorruptEntry::Length {
                actual: 4098,
                expected: 4099
            })
        ));
        f.set_len(4099).expect("restore");
        f.write_all_at(b"X", 40).expect("flip");
        assert!(matches!(read_header(&f), Err(CorruptEntry::Checksum)));
    }

    /// An entry file with `body` after the header, as a fill writes it.
    fn entry_file(meta: &[u8], body: &[u8]) -> File {
        let mut f = tempfile::tempfile().expect("tmp");
        f.write_all(&encode_header(meta, body.len() as u64, body_checksum(body)))
            .expect("w");
        f.write_all_at(body, body_offset(meta.len())).expect("w");
        f
    }

    #[test]
    fn header_round_trips_with_the_body_checksum() {
        let m = meta();
        let enc = m.encode();
        let body = b"the body bytes";
        let header = encode_header(&enc, body.len() as u64, body_checksum(body));
        assert_eq!(&header[..8], b"ZCENTRY5");
        assert_eq!(header.len(), FIXED + enc.len());
        assert_eq!(&header[32..40], &body_checksum(body).to_le_bytes());
        let f = entry_file(&enc, body);
        let h = read_entry_header(&f).expect("valid");
        assert_eq!(
            h,
            Header {
                meta: m.clone(),
                body_offset: 4096,
                body_len: body.len() as u64,
                body_checksum: xxh3_64(body),
            }
        );
        // A header rewritten in place (after a 304) keeps the body and its checksum.
        let again = encode_header_at(&enc, body.len() as u64, 8192, h.body_checksum);
        assert_eq!(&again[24..32], &8192u64.to_le_bytes());
        assert_eq!(&again[32..40], &h.body_checksum.to_le_bytes());
        // The compatibility reader agrees.
        let (rm, off, len) = read_header(&f).expect("valid");
        assert_eq!((rm, off, len), (m, 4096, body.len() as u64));
    }

    #[test]
    fn the_streaming_hasher_matches_the_one_shot_checksum() {
        let body: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 255) as u8).collect();
        let mut h = BodyHasher::new();
        for piece in body.chunks(65_536 - 3) {
            h.update(piece);
        }
        assert_eq!(h.digest(), body_checksum(&body));
        assert_eq!(BodyHasher::default().digest(), body_checksum(b""));
    }

    #[test]
    fn a_changed_body_checksum_field_fails_the_header_checksum() {
        let enc = meta().encode();
        let body = b"0123456789";
        let f = entry_file(&enc, body);
        read_entry_header(&f).expect("valid before");
        // A hostile or flipped checksum field, even one that matches some other body, is caught by
        // the header checksum before anyone trusts it.
        for (at, value) in [
            (32, body_checksum(b"another body").to_le_bytes()),
            (32, 0u64.to_le_bytes()),
            (32, (body_checksum(body) ^ (1 << 63)).to_le_bytes()),
        ] {
            f.write_all_at(&value, at).expect("tamper");
            assert!(
                matches!(read_entry_header(&f), Err(CorruptEntry::Checksum)),
                "{value:?}"
            );
        }
        f.write_all_at(&body_checksum(body).to_le_bytes(), 32)
            .expect("restore");
        read_entry_header(&f).expect("valid again");
    }

    /// The hit path's read, through the buffer its thread keeps, agrees with the whole check for
    /// heads of every length in turn (shorter after longer: no byte of an earlier head is read
    /// as this one's), a meta longer than one read and a file cut short.
    #[test]
    fn the_hit_paths_head_read_agrees_with_the_whole_check_whatever_came_before() {
        let sized = |extra: usize| {
            let mut m = meta();
            m.fields = format!("X-Pad: {}\r\n", "p".repeat(extra)).into_bytes();
            m
        };
        for extra in [0, 5_000, 30_000, 10, 4_000, 0] {
            let m = sized(extra);
            let enc = m.encode();
            let f = entry_file(&enc, b"body");
            let offset = body_offset(enc.len());
            let h = read_entry_head(&f, offset).expect("valid");
            assert_eq!(h, read_entry_header(&f).expect("valid"), "{extra}");
            assert_eq!(h.meta, m);
            // The last byte of the meta flipped: the checksum catches it, whatever the buffer held.
            let last = (FIXED + enc.len() - 1) as u64;
            f.write_all_at(b"~", last).expect("flip");
            assert!(
                matches!(read_entry_head(&f, offset), Err(CorruptEntry::Checksum)),
                "{extra}"
            );
            // Cut inside the fixed part: too short, not a stale head.
            f.set_len(FIXED as u64 - 1).expect("cut");
            assert!(
                matches!(
                    read_entry_head(&f, offset),
                    Err(CorruptEntry::Length { .. })
                ),
                "{extra}"
            );
        }
    }

    #[test]
    fn an_older_format_is_not_an_entry() {
        let enc = meta().encode();
        let f = entry_file(&enc, b"x");
        f.write_all_at(b"ZCENTRY4", 0).expect("old magic");
        assert!(matches!(read_entry_header(&f), Err(CorruptEntry::Magic)));
    }
}
