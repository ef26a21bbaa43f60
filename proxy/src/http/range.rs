//! Byte ranges (RFC 9110 §14): `Range: bytes=a-b`, `a-` and `-n` on a stored body of known
//! length. A hit answers a satisfiable single range with 206 and one sendfile of that slice;
//! several ranges get the whole body with 200, which §14.2 allows and which keeps the hit path a
//! single contiguous sendfile. A sliced object (`cache::slice`) answers several ranges with a
//! `multipart/byteranges` 206 from the slices they cover ([`set`]).

/// What to send for a request's `Range` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAnswer {
    /// No (usable) range: 200 with the whole body.
    Full,
    /// 206 with bytes `start..=end`.
    Partial {
        /// First byte offset.
        start: u64,
        /// Last byte offset, inclusive.
        end: u64,
    },
    /// 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
}

/// `1*DIGIT` as a number: `str::parse` would also take `+5`.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The complete length from a 206's or 416's `Content-Range` (`bytes a-b/len`, `bytes */len`);
/// `None` when it is unknown (`/*`) or the field is not the grammar.
pub fn complete_length(content_range: &str) -> Option<u64> {
    let rest = content_range.strip_prefix("bytes ")?;
    let (_, len) = rest.split_once('/')?;
    digits(len)
}

/// The range set of a `Range` value in bytes (`bytes=...`, the unit compared without case, as
/// RFC 9110 §14.1 has it); `None` for another unit.
pub fn byte_ranges(range: &str) -> Option<&str> {
    let r = range.trim();
    r.get(..6)
        .filter(|u| u.eq_ignore_ascii_case("bytes="))
        .map(|_| &r[6..])
}

/// Decides the answer to `range` (the field value) for a body of `len` bytes.
pub fn answer(range: Option<&str>, len: u64) -> RangeAnswer {
    let Some(range) = range else {
        return RangeAnswer::Full;
    };
    let Some(spec) = byte_ranges(range) else {
        // Unknown range units are ignored (§14.2).
        return RangeAnswer::Full;
    };
    if spec.contains(',') {
        return RangeAnswer::Full;
    }
    one(spec, len)
}

/// One `range-spec` (`a-b`, `a-`, `-n`) against a body of `len` bytes: `Full` when it is not the
/// grammar (the whole field is then ignored).
fn one(spec: &str, len: u64) -> RangeAnswer {
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeAnswer::Full;
    };
    let (a, b) = (a.trim(), b.trim());
    let parsed = match (a.is_empty(), b.is_empty()) {
        (false, _) => {
            let Some(start) = digits(a) else {
                return RangeAnswer::Full;
            };
            let end = if b.is_empty() {
                u64::MAX
            } else {
                match digits(b) {
                    Some(e) if e >= start => e,
                    _ => return RangeAnswer::Full,
                }
            };
            if start >= len {
                return RangeAnswer::Unsatisfiable;
            }
            (start, end.min(len - 1))
        }
        (true, false) => {
            let Some(n) = digits(b) else {
                return RangeAnswer::Full;
            };
            if n == 0 || len == 0 {
                return RangeAnswer::Unsatisfiable;
            }
            (len.saturating_sub(n), len - 1)
        }
        (true, true) => return RangeAnswer::Full,
    };
    RangeAnswer::Partial {
        start: parsed.0,
        end: parsed.1,
    }
}

/// Most ranges one answer is made of, after merging: a request for more is answered with the
/// whole body (§14.2 lets a server ignore a Range; many small ranges are how a client makes a
/// server do the most work for the fewest bytes).
pub const MAX_PARTS: usize = 16;

/// Most `range-spec`s read from one field: past them the field is ignored, unparsed.
const MAX_SPECS: usize = 64;

/// Several ranges at once (`bytes=0-99,500-599`) of a body of `len` bytes: the satisfiable ones,
/// in ascending order, overlapping or adjacent ones merged (§14.2 allows both). `None`: answer
/// with the whole body (no field, another unit, a spec that is not the grammar, or more than
/// [`MAX_PARTS`] ranges after merging); an empty list: none is satisfiable (416).
pub fn set(range: Option<&str>, len: u64) -> Option<Vec<(u64, u64)>> {
    let spec = byte_ranges(range?)?;
    if spec.split(',').count() > MAX_SPECS {
        return None;
    }
    let mut parts = Vec::new();
    // Empty list elements are allowed (RFC 9110 §5.6.1): `bytes=0-1,,5-6`.
    for s in spec.split(',').filter(|s| !s.trim().is_empty()) {
        match one(s, len) {
            RangeAnswer::Partial { start, end } => parts.push((start, end)),
            RangeAnswer::Unsatisfiable => {}
            RangeAnswer::Full => return None,
        }
    }
    parts.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(parts.len());
    for (a, b) in parts {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    (merged.len() <= MAX_PARTS).then_some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeAnswer::*;

    #[test]
    fn single_ranges() {
        assert_eq!(
            answer(Some("bytes=0-99"), 1000),
            Partial { start: 0, end: 99 }
        );
        assert_eq!(
            answer(Some("bytes=900-"), 1000),
            Partial {
                start: 900,
                end: 999
            }
        );
        assert_eq!(
            answer(Some("bytes=-100"), 1000),
            Partial {
                start: 900,
                end: 999
            }
        );
        assert_eq!(
            answer(Some("bytes=-5000"), 1000),
            Partial { start: 0, end: 999 }
        );
        assert_eq!(
            answer(Some("bytes=500-5000"), 1000),
            Partial {
                start: 500,
                end: 999
            }
        );
    }

    #[test]
    fn unsatisfiable_and_ignored() {
        assert_eq!(answer(Some("bytes=1000-"), 1000), Unsatisfiable);
        assert_eq!(answer(Some("bytes=-0"), 1000), Unsatisfiable);
        assert_eq!(answer(Some("bytes=5-1"), 1000), Full);
        assert_eq!(answer(Some("bytes=0-1,5-6"), 1000), Full);
        assert_eq!(answer(Some("items=0-1"), 1000), Full);
        assert_eq!(answer(None, 1000), Full);
    }

    #[test]
    fn several_ranges_merged_in_order() {
        assert_eq!(set(Some("bytes=0-1,5-6"), 1000), Some(vec![(0, 1), (5, 6)]));
        assert_eq!(
            set(Some("bytes=500-599, 0-99"), 1000),
            Some(vec![(0, 99), (500, 599)])
        );
        // Overlapping and adjacent ones merge; a suffix counts from the end.
        assert_eq!(
            set(Some("bytes=0-10,5-20,21-30"), 1000),
            Some(vec![(0, 30)])
        );
        assert_eq!(
            set(Some("bytes=0-0,-1"), 1000),
            Some(vec![(0, 0), (999, 999)])
        );
        // The unsatisfiable ones go; none left is a 416.
        assert_eq!(set(Some("bytes=0-0,2000-3000"), 1000), Some(vec![(0, 0)]));
        assert_eq!(set(Some("bytes=2000-,3000-"), 1000), Some(vec![]));
        // One bad spec, another unit, too many parts: the whole body.
        assert_eq!(set(Some("bytes=0-1,x-2"), 1000), None);
        assert_eq!(set(Some("items=0-1,2-3"), 1000), None);
        let many: Vec<String> = (0..17).map(|i| format!("{}-{}", i * 10, i * 10)).collect();
        assert_eq!(set(Some(&format!("bytes={}", many.join(","))), 1000), None);
        let sixteen: Vec<String> = (0..16).map(|i| format!("{}-{}", i * 10, i * 10)).collect();
        assert_eq!(
            set(Some(&format!("bytes={}", sixteen.join(","))), 1000).map(|v| v.len()),
            Some(16)
        );
        // A field of thousands of specs is not even parsed.
        let huge = vec!["0-0"; 10_000].join(",");
        assert_eq!(set(Some(&format!("bytes={huge}")), 1000), None);
        assert_eq!(set(None, 1000), None);
        // Empty elements are no ranges; the unit is case-insensitive.
        assert_eq!(
            set(Some("Bytes=0-1,, 5-6,"), 1000),
            Some(vec![(0, 1), (5, 6)])
        );
        assert_eq!(
            answer(Some("BYTES=0-1"), 1000),
            Partial { start: 0, end: 1 }
        );
    }
}
