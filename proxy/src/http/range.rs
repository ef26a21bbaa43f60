//! Single byte ranges (RFC 9110 §14): `Range: bytes=a-b`, `a-` and `-n` on a stored body of known
//! length. A hit answers a satisfiable single range with 206 and one sendfile of that slice;
//! several ranges get the whole body with 200, which §14.2 allows and which keeps the hit path a
//! single contiguous sendfile.

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

/// Decides the answer to `range` (the field value) for a body of `len` bytes.
pub fn answer(range: Option<&str>, len: u64) -> RangeAnswer {
    let Some(range) = range else {
        return RangeAnswer::Full;
    };
    let Some(spec) = range.trim().strip_prefix("bytes=") else {
        // Unknown range units are ignored (§14.2).
        return RangeAnswer::Full;
    };
    if spec.contains(',') {
        return RangeAnswer::Full;
    }
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
}
