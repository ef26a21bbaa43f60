//! Slices: a large object stored as aligned pieces of `S` bytes (`routes[].slice`), each an entry
//! of its own under the object's key plus its index, fetched from the origin by
//! `Range: bytes=k*S-(k+1)*S-1` and evicted on its own, so the cold tail of a video leaves and its
//! popular start stays (nginx's `slice`, ATS's slice plugin).
//!
//! This module is the pure part: which slices a client's range covers, a slice's key, whether an
//! origin's answer to a slice request is that slice, whether two slices are pieces of one
//! representation, and what the response is (whole, one range, or `multipart/byteranges`). The serving and filling are `server/sliced.rs` and `server/fetch/slice.rs`.

use super::key::CacheKey;
use crate::http::range;

/// A route's slicing: the slice size, and the largest whole object stored in slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slicing {
    /// `S`, in bytes (256 KiB to 64 MiB).
    pub size: u64,
    /// `max_sliced_object_size`.
    pub max_object: u64,
}

impl Slicing {
    /// The slice holding byte `offset`.
    pub fn index_of(&self, offset: u64) -> u64 {
        offset / self.size
    }

    /// The bytes slice `k` asks the origin for (inclusive), before the object's length is known.
    pub fn request_range(&self, k: u64) -> (u64, u64) {
        let start = k.saturating_mul(self.size);
        (start, start.saturating_add(self.size - 1))
    }

    /// The bytes slice `k` holds of an object of `total` bytes (inclusive); `None` past its end.
    pub fn held(&self, k: u64, total: u64) -> Option<(u64, u64)> {
        let (start, end) = self.request_range(k);
        (start < total).then(|| (start, end.min(total - 1)))
    }

    /// The slice a request's first range starts in, before the object's length is known: the
    /// lowest first byte (`a-b`, `a-`) among its ranges; slice 0 for no range, for any suffix
    /// range (`-n` needs the length, which slice 0 brings, as in nginx's `slice`) and for a field
    /// the answer ignores (not the grammar, another unit, `a > b`), since then the whole object
    /// is sent.
    pub fn first_wanted(&self, range_field: Option<&str>) -> u64 {
        let Some(spec) = range_field.and_then(range::byte_ranges) else {
            return 0;
        };
        // As many specs as `range::set` reads at most: a field of more is ignored there too.
        if spec.split(',').count() > 64 {
            return 0;
        }
        let mut lowest: Option<u64> = None;
        for one in spec.split(',') {
            // Against the largest length there is, a spec is partial exactly when it is one the
            // answer honours.
            if one.trim().is_empty() {
                continue;
            }
            // A suffix needs the length first, and the range it names may start before every
            // explicit one: slice 0.
            if one.trim().starts_with('-') {
                return 0;
            }
            match range::answer(Some(&format!("bytes={one}")), u64::MAX) {
                range::RangeAnswer::Partial { start, .. } => {
                    lowest = Some(lowest.map_or(start, |l| l.min(start)));
                }
                _ => return 0,
            }
        }
        lowest.map_or(0, |s| self.index_of(s))
    }

    /// The key of slice `k` of the object keyed `primary`: `\n:slice=S/k` appended. The size is
    /// part of it, so slices stored under another size are never joined with these. No request
    /// key holds a line break, so no client can name a slice as its key.
    pub fn key(&self, primary: &CacheKey, k: u64, hash_bits: u32) -> CacheKey {
        CacheKey::from_text(
            format!("{}\n:slice={}/{k}", primary.text, self.size),
            hash_bits,
        )
    }
}

/// Which representation a slice belongs to: every slice of one response must agree on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The complete length, from `Content-Range`.
    pub total: u64,
    /// The strong `ETag`, if any.
    pub etag: Option<String>,
    /// `Last-Modified`, if any.
    pub last_modified: Option<String>,
}

impl Identity {
    /// Whether `other` is a piece of the same representation: the same length and the same
    /// validators. Every slice carries a strong `ETag` ([`judge`] takes no other), so two
    /// versions never pass for one.
    pub fn same(&self, other: &Identity) -> bool {
        self.total == other.total
            && self.etag == other.etag
            && self.last_modified == other.last_modified
    }
}

/// The identity of a stored slice: its stored `Content-Range`'s total and its validators.
/// `None` for an entry that is no slice (no complete `Content-Range`).
pub fn stored_identity(e: &super::entry::Entry) -> Option<Identity> {
    let cr = crate::http::stored_fields::StoredFields(&e.meta.fields)
        .lines()
        .find(|l| l.name.eq_ignore_ascii_case("content-range"))?;
    let (_, _, total) = parse_content_range(std::str::from_utf8(cr.value).ok()?)?;
    Some(Identity {
        total,
        etag: e.etag.clone(),
        last_modified: e.last_modified.clone(),
    })
}

/// What an origin's answer to the request for slice `k` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceAnswer {
    /// The slice: a 206 of exactly the bytes asked for (the last slice ends at the object's end).
    Slice(Identity),
    /// The whole object (a 200): the origin does not do ranges. Stored or relayed whole.
    Whole,
    /// A 416: the object has `total` bytes and the slice starts past them.
    PastEnd(Option<u64>),
    /// Not a slice of a representation this cache can join; relayed, never stored as one.
    Unusable(&'static str),
}

/// Judges the origin's answer (status, `Content-Range`, body length, `ETag`, `Last-Modified`,
/// whether it varies) to the request for bytes `asked` (inclusive).
pub fn judge(
    status: u16,
    content_range: Option<&str>,
    body_len: Option<u64>,
    (etag, last_modified): (Option<&str>, Option<&str>),
    varies: bool,
    asked: (u64, u64),
) -> SliceAnswer {
    match status {
        200 => return SliceAnswer::Whole,
        416 => return SliceAnswer::PastEnd(content_range.and_then(range::complete_length)),
        206 => {}
        _ => return SliceAnswer::Unusable("slice-status"),
    }
    let Some((first, last, total)) = content_range.and_then(parse_content_range) else {
        return SliceAnswer::Unusable("slice-content-range");
    };
    // Exactly the bytes asked for: the start, and the end or the object's last byte.
    if first != asked.0 || last != asked.1.min(total.saturating_sub(1)) || last >= total {
        return SliceAnswer::Unusable("slice-content-range");
    }
    if body_len != Some(last - first + 1) {
        return SliceAnswer::Unusable("slice-length");
    }
    if varies {
        return SliceAnswer::Unusable("slice-vary");
    }
    // Only a strong ETag says two responses are the same bytes (RFC 9110 §8.8.3): a weak one
    // does not, and a Last-Modified alone cannot tell two versions written in the same second.
    let etag = etag.map(str::trim);
    match etag {
        Some(e) if e.starts_with("W/") => return SliceAnswer::Unusable("slice-weak-etag"),
        Some(e) if e.starts_with('"') && e.len() >= 2 && e.ends_with('"') => {}
        _ => return SliceAnswer::Unusable("slice-no-etag"),
    }
    SliceAnswer::Slice(Identity {
        total,
        etag: etag.map(str::to_string),
        last_modified: last_modified.map(|l| l.trim().to_string()),
    })
}

/// `bytes first-last/total` (RFC 9110 §14.4) with every number present.
pub fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (a, b, t) = (num(a)?, num(b)?, num(total)?);
    (a <= b).then_some((a, b, t))
}

/// What the response is, from the first slice `first` of an object of `total` bytes: 200 with the
/// whole object; 206 with one range, or several as `multipart/byteranges`; `None` for a 416. An
/// `If-Range` that does not hold asks for the whole object (RFC 9110 §13.1.5).
pub fn body_plan(
    req: &crate::http::request::RequestHead,
    first: &super::entry::Entry,
    total: u64,
) -> Option<(u16, crate::http::byteranges::Ranged)> {
    let holds = super::conditional::if_range_holds(
        req,
        first.etag.as_deref(),
        first.last_modified.as_deref(),
    );
    let field = req.field("range").filter(|_| holds);
    let whole = (200, crate::http::byteranges::Ranged::single(0, total));
    if field.is_some_and(|f| f.contains(',')) {
        return match range::set(field, total) {
            None => Some(whole),
            Some(parts) => match parts.as_slice() {
                [] => None,
                [(a, b)] => Some((206, crate::http::byteranges::Ranged::single(*a, b - a + 1))),
                _ => {
                    let boundary = boundary(&first.meta.key);
                    let content_type = crate::http::stored_fields::StoredFields(&first.meta.fields)
                        .lines()
                        .find(|l| l.name.eq_ignore_ascii_case("content-type"))
                        .map(|l| l.value);
                    let r = crate::http::byteranges::Ranged::multipart(
                        &parts,
                        total,
                        content_type,
                        &boundary,
                    );
                    Some((206, r))
                }
            },
        };
    }
    match range::answer(field, total) {
        range::RangeAnswer::Full => Some(whole),
        range::RangeAnswer::Partial { start, end } => Some((
            206,
            crate::http::byteranges::Ranged::single(start, end - start + 1),
        )),
        range::RangeAnswer::Unsatisfiable => None,
    }
}

/// A multipart boundary: 20 hex digits from the key, the time and a counter, so no two answers
/// share one and the bytes of a part are unlikely to hold it (RFC 2046 §5.1.1).
fn boundary(key: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let h = xxhash_rust::xxh3::xxh3_64(format!("{key}\n{t}\n{n}").as_bytes());
    format!("zc{h:016x}{:04x}", n & 0xffff)
}

/// How many slices [`slices_of`] walks, counted without walking them.
pub fn slice_count(r: &crate::http::byteranges::Ranged, size: u64) -> u64 {
    let mut n = 0;
    let mut last = None;
    for p in r.parts.iter().filter(|p| p.len > 0) {
        let (a, b) = (p.start / size, (p.start + p.len - 1) / size);
        n += b - a + 1 - u64::from(last == Some(a));
        last = Some(b);
    }
    n
}

/// The slices a ranged body is sent from, part by part, in order; a slice where one part ends and
/// the next begins counted once.
pub fn slices_of(r: &crate::http::byteranges::Ranged, size: u64) -> impl Iterator<Item = u64> + '_ {
    let mut last = None;
    r.parts
        .iter()
        .filter(|p| p.len > 0)
        .flat_map(move |p| p.start / size..=(p.start + p.len - 1) / size)
        .filter(move |k| last.replace(*k) != Some(*k))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const S: Slicing = Slicing {
        size: 4 * MIB,
        max_object: u64::MAX,
    };

    #[test]
    fn geometry() {
        assert_eq!(S.request_range(0), (0, 4 * MIB - 1));
        assert_eq!(S.request_range(3), (12 * MIB, 16 * MIB - 1));
        assert_eq!(S.held(2, 10 * MIB), Some((8 * MIB, 10 * MIB - 1)));
        assert_eq!(S.held(3, 10 * MIB), None);
        assert_eq!(S.first_wanted(None), 0);
        assert_eq!(S.first_wanted(Some("bytes=9437184-9437283")), 2);
        assert_eq!(S.first_wanted(Some("bytes=4194304-")), 1);
        assert_eq!(S.first_wanted(Some("bytes=-500")), 0);
        assert_eq!(S.first_wanted(Some("bytes=+5-9")), 0);
        assert_eq!(S.first_wanted(Some("items=5-9")), 0);
        // What the answer ignores starts at slice 0, as the whole object does.
        assert_eq!(S.first_wanted(Some("bytes=99999999999-1")), 0);
        assert_eq!(S.first_wanted(Some("bytes=9437184-,x-1")), 0);
        // Several ranges: the lowest explicit start; suffixes alone need slice 0.
        assert_eq!(
            S.first_wanted(Some("bytes=9437184-9437283,4194304-4194305")),
            1
        );
        assert_eq!(S.first_wanted(Some("bytes=-5,9437184-9437283")), 0);
        assert_eq!(S.first_wanted(Some("bytes=99999999999-,-500")), 0);
        assert_eq!(
            S.first_wanted(Some("BYTES=9437184-9437283,,4194304-4194305")),
            1
        );
        assert_eq!(S.first_wanted(Some("bytes=-5,-9")), 0);
        assert_eq!(S.first_wanted(Some("bytes=99999999999999999999999-")), 0);
        // Far past any object: no overflow.
        assert_eq!(S.request_range(u64::MAX / 1024), (u64::MAX, u64::MAX));
    }

    #[test]
    fn a_slice_key_is_no_request_key() {
        let primary = CacheKey::new("GET", "http", "v.example", "/movie.mp4", 128);
        let k = S.key(&primary, 7, 128);
        assert_eq!(k.text, "GET http://v.example/movie.mp4\n:slice=4194304/7");
        // Another slice size names other entries.
        let other = Slicing { size: MIB, ..S };
        assert_ne!(other.key(&primary, 7, 128).hash, k.hash);
    }

    fn judge_of(status: u16, cr: Option<&str>, len: Option<u64>) -> SliceAnswer {
        judge(
            status,
            cr,
            len,
            (Some("\"v1\""), None),
            false,
            (4 * MIB, 8 * MIB - 1),
        )
    }

    #[test]
    fn an_answer_is_the_slice_only_when_it_is_exactly_the_bytes_asked_for() {
        let ok = SliceAnswer::Slice(Identity {
            total: 10 * MIB,
            etag: Some("\"v1\"".into()),
            last_modified: None,
        });
        let cr = format!("bytes {}-{}/{}", 4 * MIB, 8 * MIB - 1, 10 * MIB);
        assert_eq!(judge_of(206, Some(&cr), Some(4 * MIB)), ok);
        // The last slice ends at the object's end.
        let last = judge(
            206,
            Some("bytes 8388608-10485759/10485760"),
            Some(2 * MIB),
            (Some("\"v1\""), Some("Tue, 01 Dec 2026 00:00:00 GMT")),
            false,
            (8 * MIB, 12 * MIB - 1),
        );
        assert_eq!(
            last,
            SliceAnswer::Slice(Identity {
                total: 10 * MIB,
                etag: Some("\"v1\"".into()),
                last_modified: Some("Tue, 01 Dec 2026 00:00:00 GMT".into()),
            })
        );
        // A Last-Modified alone, or an ETag that is not the grammar, identifies no bytes.
        let no_etag = |etag: Option<&str>| {
            judge(
                206,
                Some("bytes 8388608-10485759/10485760"),
                Some(2 * MIB),
                (etag, Some("Tue, 01 Dec 2026 00:00:00 GMT")),
                false,
                (8 * MIB, 12 * MIB - 1),
            )
        };
        assert_eq!(no_etag(None), SliceAnswer::Unusable("slice-no-etag"));
        assert_eq!(no_etag(Some("v1")), SliceAnswer::Unusable("slice-no-etag"));
        assert_eq!(no_etag(Some("\"")), SliceAnswer::Unusable("slice-no-etag"));
        // Hostile or mistaken answers.
        assert_eq!(judge_of(200, None, Some(10)), SliceAnswer::Whole);
        assert_eq!(
            judge_of(416, Some("bytes */100"), Some(0)),
            SliceAnswer::PastEnd(Some(100))
        );
        assert_eq!(
            judge_of(206, None, Some(4 * MIB)),
            SliceAnswer::Unusable("slice-content-range")
        );
        let shifted = format!("bytes {}-{}/{}", 4 * MIB + 1, 8 * MIB, 10 * MIB);
        assert_eq!(
            judge_of(206, Some(&shifted), Some(4 * MIB)),
            SliceAnswer::Unusable("slice-content-range")
        );
        let short = format!("bytes {}-{}/{}", 4 * MIB, 6 * MIB, 10 * MIB);
        assert_eq!(
            judge_of(206, Some(&short), Some(2 * MIB + 1)),
            SliceAnswer::Unusable("slice-content-range")
        );
        assert_eq!(
            judge_of(206, Some(&cr), Some(4 * MIB - 1)),
            SliceAnswer::Unusable("slice-length")
        );
        assert_eq!(
            judge_of(206, Some(&cr), None),
            SliceAnswer::Unusable("slice-length")
        );
        let unknown_total = format!("bytes {}-{}/*", 4 * MIB, 8 * MIB - 1);
        assert_eq!(
            judge_of(206, Some(&unknown_total), Some(4 * MIB)),
            SliceAnswer::Unusable("slice-content-range")
        );
        // A total that says the slice runs past the object's end.
        let past = format!("bytes {}-{}/{}", 4 * MIB, 8 * MIB - 1, 5 * MIB);
        assert_eq!(
            judge_of(206, Some(&past), Some(4 * MIB)),
            SliceAnswer::Unusable("slice-content-range")
        );
        assert_eq!(
            judge(
                206,
                Some(&cr),
                Some(4 * MIB),
                (None, None),
                true,
                (4 * MIB, 8 * MIB - 1)
            ),
            SliceAnswer::Unusable("slice-vary")
        );
        assert_eq!(
            judge(
                206,
                Some(&cr),
                Some(4 * MIB),
                (Some("W/\"v1\""), None),
                false,
                (4 * MIB, 8 * MIB - 1)
            ),
            SliceAnswer::Unusable("slice-weak-etag")
        );
        assert_eq!(
            judge_of(302, None, Some(0)),
            SliceAnswer::Unusable("slice-status")
        );
    }

    #[test]
    fn content_range_grammar() {
        assert_eq!(parse_content_range("bytes 0-9/10"), Some((0, 9, 10)));
        assert_eq!(parse_content_range("bytes 9-0/10"), None);
        assert_eq!(parse_content_range("bytes 0-9/*"), None);
        assert_eq!(parse_content_range("bytes +0-9/10"), None);
        assert_eq!(parse_content_range("bytes -9/10"), None);
        assert_eq!(parse_content_range("items 0-9/10"), None);
        assert_eq!(parse_content_range("bytes 0-99999999999999999999/10"), None);
    }

    #[test]
    fn identity_is_length_and_validators() {
        let a = Identity {
            total: 10,
            etag: Some("\"a\"".into()),
            last_modified: None,
        };
        assert!(a.same(&a.clone()));
        assert!(!a.same(&Identity {
            total: 11,
            ..a.clone()
        }));
        assert!(!a.same(&Identity {
            etag: Some("\"b\"".into()),
            ..a.clone()
        }));
        assert!(!a.same(&Identity {
            etag: None,
            ..a.clone()
        }));
    }
}
