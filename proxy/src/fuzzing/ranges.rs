//! The `ranges` fuzz target's property: byte ranges and slices (`http::range`,
//! `http::byteranges`, `cache::slice`), apart from the other harnesses because it grew with them.

/// Byte ranges and slices: the first 8 bytes are a body length (little-endian, up to i64::MAX), the
/// rest a `Range` field value. `range::answer` gives a range inside the body; `range::set` gives
/// ranges inside it, ascending, neither overlapping nor touching, at most `MAX_PARTS`, and agrees
/// with `answer` on a single range; `Slicing::first_wanted` is the slice of that range's start;
/// the multipart framing's length is its parts' and the tail's. And `slice::judge` of a 206 whose
/// `Content-Range` is the rest of the input takes it as a slice only when it is exactly the bytes
/// asked for.
pub fn ranges(data: &[u8]) {
    use crate::cache::slice::{SliceAnswer, Slicing, judge, parse_content_range};
    use crate::http::range::{self, MAX_PARTS, RangeAnswer};
    if data.len() < 8 {
        return;
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&data[..8]);
    // A body is a file (or an origin's stated length, which the proxy stores only within
    // `max_object_size`): at most i64::MAX bytes. Within 80 bytes of u64::MAX a part's head and
    // its bytes would not add up in a u64, a length no body reaches.
    let len = u64::from_le_bytes(n) & i64::MAX as u64;
    let text = String::from_utf8_lossy(&data[8..]);
    let field = Some(text.as_ref());
    let single = range::answer(field, len);
    if let RangeAnswer::Partial { start, end } = single {
        assert!(start <= end && end < len, "{start}-{end} of {len}");
    }
    if let Some(parts) = range::set(field, len) {
        assert!(parts.len() <= MAX_PARTS);
        for (a, b) in &parts {
            assert!(a <= b && *b < len, "{a}-{b} of {len}");
        }
        for w in parts.windows(2) {
            assert!(w[0].1.saturating_add(1) < w[1].0, "{parts:?} not merged");
        }
        if let RangeAnswer::Partial { start, end } = single {
            assert_eq!(parts, [(start, end)], "set and answer disagree on {text:?}");
        }
        if parts.len() > 1 {
            // The framing written out independently: each part's head is its two lines.
            let r = crate::http::byteranges::Ranged::multipart(&parts, len, Some(b"a/b"), "x");
            let mut want = "\r\n--x--\r\n".len() as u64;
            for (a, b) in &parts {
                let head = format!(
                    "\r\n--x\r\nContent-Type: a/b\r\nContent-Range: bytes {a}-{b}/{len}\r\n\r\n"
                );
                want += head.len() as u64 + (b - a + 1);
            }
            assert_eq!(r.content_length(), want, "{parts:?}");
        }
    }
    let s = Slicing {
        size: 1 << 20,
        max_object: u64::MAX,
    };
    let k = s.first_wanted(field);
    let suffix = range::byte_ranges(&text)
        .is_some_and(|r| r.split(',').any(|one| one.trim().starts_with('-')));
    // Without a suffix, the lowest start the answer would send from (several ranges merged and
    // ordered by `set`, one by `answer`); with one, slice 0.
    match range::set(field, u64::MAX) {
        Some(parts) if !suffix && !parts.is_empty() => {
            assert_eq!(k, parts[0].0 >> 20, "{text:?}");
        }
        _ if suffix => assert_eq!(k, 0, "{text:?}"),
        _ => {}
    }
    if let Some((a, b, t)) = parse_content_range(&text) {
        assert!(a <= b, "{text:?}");
        let asked = (a, a.saturating_add((1 << 20) - 1));
        let answer = judge(
            206,
            Some(&text),
            (b - a).checked_add(1),
            (Some("\"e\""), None),
            false,
            asked,
        );
        if let SliceAnswer::Slice(id) = answer {
            assert!(
                b < t && id.total == t && b == asked.1.min(t - 1),
                "{text:?}"
            );
        }
    }
}
