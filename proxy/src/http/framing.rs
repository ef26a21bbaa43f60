//! The exact grammar of the message-framing fields, `Content-Length` (RFC 9110 §8.6) and
//! `Transfer-Encoding` (RFC 9112 §6.1, §7), for requests and responses alike.
//!
//! Why exact: a proxy that reads a body length more leniently than the server behind it (or the
//! client in front of it) is the classic request-smuggling gap. `str::parse` accepts `+5`,
//! `str::trim` strips Unicode spaces such as U+00A0, and either lets one message be read as two.
//! So nothing here is forgiving: `Content-Length` elements are `1*DIGIT`, optional whitespace is
//! only SP and HTAB (RFC 9110 §5.6.3), transfer codings are tokens (RFC 9110 §5.6.2), and anything
//! else is an error for the caller to answer (400/501 for a request, 502 for a response).

/// Why framing fields are unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramingError {
    /// Not the grammar, or contradictory (a request gets 400, a response 502).
    Invalid(&'static str),
    /// A transfer coding other than chunked is applied (before chunked): a request gets 501.
    Unsupported(&'static str),
}

impl FramingError {
    /// The reason, for logs and error responses.
    pub fn reason(self) -> &'static str {
        match self {
            FramingError::Invalid(r) | FramingError::Unsupported(r) => r,
        }
    }
}

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for FramingError {}

/// What Transfer-Encoding says, from every value of every Transfer-Encoding field in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// No Transfer-Encoding field.
    Absent,
    /// Exactly `chunked` (case-insensitive) as the only coding.
    Chunked,
    /// The final coding is not chunked (and chunked appears nowhere): for a response the body runs
    /// until close; a request with it has no determinable length (RFC 9112 §6.3: 400).
    NotChunked,
}

/// OWS / BWS: only SP and HTAB (RFC 9110 §5.6.3), never other (Unicode) spaces.
pub(crate) fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// `tchar` of RFC 9110 §5.6.2.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

/// `s` without leading and trailing SP/HTAB.
fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_ows(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !is_ows(*last) {
            break;
        }
        s = rest;
    }
    s
}

/// The Content-Length of a message from every value of every Content-Length field (each value may be a
/// comma list). Ok(None) when there is no field. Elements are 1*DIGIT with only SP/HTAB around them;
/// all elements must be equal; empty elements, signs, non-ASCII, overflow of u64 are Invalid.
pub fn content_length<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<u64>, FramingError> {
    let mut length: Option<u64> = None;
    for value in values {
        for element in value.split(|b| *b == b',') {
            let digits = trim_ows(element);
            if digits.is_empty() {
                return Err(FramingError::Invalid("empty Content-Length element"));
            }
            let mut n: u64 = 0;
            for &d in digits {
                if !d.is_ascii_digit() {
                    return Err(FramingError::Invalid("invalid Content-Length"));
                }
                n = n
                    .checked_mul(10)
                    .and_then(|n| n.checked_add(u64::from(d - b'0')))
                    .ok_or(FramingError::Invalid("Content-Length too large"))?;
            }
            if length.is_some_and(|l| l != n) {
                return Err(FramingError::Invalid("differing Content-Length values"));
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// What the Transfer-Encoding fields say, from every value of every Transfer-Encoding field in
/// order (RFC 9112 §6.1, §7). Each list element is a token with optional `;` parameters
/// (`token BWS "=" BWS (token / quoted-string)`), separated by commas with only SP/HTAB around
/// them. Empty lists and elements, non-token bytes, `chunked` more than once, `chunked` not last
/// and `chunked` with parameters are [`FramingError::Invalid`]; another coding before a final
/// `chunked` is [`FramingError::Unsupported`].
pub fn transfer_coding<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Coding, FramingError> {
    let mut any_field = false;
    let mut codings = 0usize;
    let mut chunked_seen = false;
    // Facts about the last coding so far: is it chunked, and did chunked carry parameters.
    let mut last_is_chunked = false;
    let mut other_before_chunked = false;
    for value in values {
        any_field = true;
        let mut rest = value;
        loop {
            let Element {
                name,
                has_params,
                after,
            } = coding_element(rest)?;
            codings += 1;
            if name.eq_ignore_ascii_case(b"chunked") {
                if chunked_seen {
                    return Err(FramingError::Invalid("chunked applied more than once"));
                }
                if has_params {
                    return Err(FramingError::Invalid("chunked with parameters"));
                }
                chunked_seen = true;
                last_is_chunked = true;
                other_before_chunked = codings > 1;
            } else {
                if chunked_seen {
                    return Err(FramingError::Invalid(
                        "chunked is not the final transfer coding",
                    ));
                }
                last_is_chunked = false;
            }
            match after {
                Some(next) => rest = next,
                None => break,
            }
        }
    }
    if !any_field {
        return Ok(Coding::Absent);
    }
    if !last_is_chunked {
        return Ok(Coding::NotChunked);
    }
    if other_before_chunked {
        return Err(FramingError::Unsupported(
            "transfer coding other than chunked",
        ));
    }
    Ok(Coding::Chunked)
}

/// One transfer-coding list element.
struct Element<'a> {
    /// The coding's name.
    name: &'a [u8],
    /// It has `;` parameters.
    has_params: bool,
    /// What follows the comma after it; `None` at the end of the field value.
    after: Option<&'a [u8]>,
}

/// Parses one transfer-coding list element from the start of `s`.
fn coding_element(s: &[u8]) -> Result<Element<'_>, FramingError> {
    let invalid = FramingError::Invalid("invalid Transfer-Encoding");
    let mut i = skip_ows(s, 0);
    let name = token(s, &mut i);
    if name.is_empty() {
        return Err(match s.get(i) {
            None | Some(b',') => FramingError::Invalid("empty Transfer-Encoding element"),
            Some(_) => invalid,
        });
    }
    let mut has_params = false;
    loop {
        i = skip_ows(s, i);
        match s.get(i) {
            None => {
                return Ok(Element {
                    name,
                    has_params,
                    after: None,
                });
            }
            Some(b',') => {
                return Ok(Element {
                    name,
                    has_params,
                    after: Some(&s[i + 1..]),
                });
            }
            Some(b';') => {
                has_params = true;
                i = skip_ows(s, i + 1);
                if token(s, &mut i).is_empty() {
                    return Err(invalid);
                }
                i = skip_ows(s, i);
                if s.get(i) != Some(&b'=') {
                    return Err(invalid);
                }
                i = skip_ows(s, i + 1);
                if s.get(i) == Some(&b'"') {
                    i = quoted_string_end(s, i).ok_or(invalid)?;
                } else if token(s, &mut i).is_empty() {
                    return Err(invalid);
                }
            }
            Some(_) => return Err(invalid),
        }
    }
}

/// The index of the first non-OWS byte at or after `i`.
fn skip_ows(s: &[u8], mut i: usize) -> usize {
    while s.get(i).is_some_and(|b| is_ows(*b)) {
        i += 1;
    }
    i
}

/// The (possibly empty) token starting at `*i`; advances `*i` past it.
fn token<'a>(s: &'a [u8], i: &mut usize) -> &'a [u8] {
    let start = *i;
    while s.get(*i).is_some_and(|b| is_tchar(*b)) {
        *i += 1;
    }
    &s[start..*i]
}

/// Given the opening DQUOTE at `start`, the index just past the closing one (RFC 9110 §5.6.4:
/// qdtext is HTAB, SP, visible ASCII but `"` and `\`, obs-text; `\` quotes HTAB, SP, VCHAR,
/// obs-text). `None` if unterminated or containing other bytes.
fn quoted_string_end(s: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match *s.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => {
                let q = *s.get(i + 1)?;
                if !(q == b'\t' || q == b' ' || q.is_ascii_graphic() || q >= 0x80) {
                    return None;
                }
                i += 2;
            }
            b if b == b'\t' || b == b' ' || b.is_ascii_graphic() || b >= 0x80 => i += 1,
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cl(values: &[&str]) -> Result<Option<u64>, FramingError> {
        content_length(values.iter().map(|v| v.as_bytes()))
    }

    fn te(values: &[&[u8]]) -> Result<Coding, FramingError> {
        transfer_coding(values.iter().copied())
    }

    #[test]
    fn content_length_is_digits_only() {
        assert_eq!(cl(&[]), Ok(None));
        for good in ["5", "005", "5, 5", " 5\t", "5 ,\t5", "5,5"] {
            assert_eq!(cl(&[good]), Ok(Some(5)), "{good:?}");
        }
        assert_eq!(cl(&["5", "5"]), Ok(Some(5)));
        assert_eq!(cl(&["5", "005, 5"]), Ok(Some(5)));
        assert_eq!(cl(&["0"]), Ok(Some(0)));
        assert_eq!(
            cl(&["18446744073709551615"]),
            Ok(Some(18_446_744_073_709_551_615))
        );
        for bad in [
            "+5",
            "5, +5",
            "-1",
            "\u{a0}5",
            "5\u{a0}",
            "0x5",
            "5 5",
            "5,",
            ",5",
            "",
            " ",
            "5,,5",
            "1e3",
            "5.0",
            "99999999999999999999999",
            "18446744073709551616",
            "\u{0660}",
            "5\r",
            "5\n",
            "\x0b5",
        ] {
            assert!(
                matches!(cl(&[bad]), Err(FramingError::Invalid(_))),
                "{bad:?}: {:?}",
                cl(&[bad])
            );
        }
        assert_eq!(
            cl(&["5, 6"]),
            Err(FramingError::Invalid("differing Content-Length values"))
        );
        assert_eq!(
            cl(&["5", "6"]),
            Err(FramingError::Invalid("differing Content-Length values"))
        );
        assert_eq!(
            content_length([&b"5\xc2\xa0"[..]]),
            Err(FramingError::Invalid("invalid Content-Length"))
        );
        assert_eq!(
            content_length([&b"\xff"[..]]),
            Err(FramingError::Invalid("invalid Content-Length"))
        );
    }

    #[test]
    fn transfer_coding_absent_chunked_or_not() {
        assert_eq!(te(&[]), Ok(Coding::Absent));
        for good in [&b"chunked"[..], b"Chunked", b"CHUNKED", b" chunked\t"] {
            assert_eq!(te(&[good]), Ok(Coding::Chunked), "{good:?}");
        }
        for not in [
            &b"gzip"[..],
            b"identity",
            b"gzip, deflate",
            b"gzip;q=1",
            b"x-foo ; a = \"q, d\"",
            b"x;a=\"\\\"\"",
        ] {
            assert_eq!(te(&[not]), Ok(Coding::NotChunked), "{not:?}");
        }
        assert_eq!(
            te(&[b"chunked", b"gzip"]),
            Err(FramingError::Invalid(
                "chunked is not the final transfer coding"
            ))
        );
        assert_eq!(te(&[b"gzip", b"deflate"]), Ok(Coding::NotChunked));
    }

    #[test]
    fn transfer_coding_before_chunked_is_unsupported() {
        for v in [
            &b"gzip, chunked"[..],
            b"identity, chunked",
            b"x-foo, chunked",
            b"gzip;q=\"a,b\" , chunked",
        ] {
            assert_eq!(
                te(&[v]),
                Err(FramingError::Unsupported(
                    "transfer coding other than chunked"
                )),
                "{v:?}"
            );
        }
        assert_eq!(
            te(&[b"gzip", b"chunked"]),
            Err(FramingError::Unsupported(
                "transfer coding other than chunked"
            ))
        );
    }

    #[test]
    fn transfer_coding_rejects_everything_else() {
        assert_eq!(
            te(&[b"chunked, chunked"]),
            Err(FramingError::Invalid("chunked applied more than once"))
        );
        assert_eq!(
            te(&[b"chunked", b"chunked"]),
            Err(FramingError::Invalid("chunked applied more than once"))
        );
        assert_eq!(
            te(&[b"chunked, gzip"]),
            Err(FramingError::Invalid(
                "chunked is not the final transfer coding"
            ))
        );
        assert_eq!(
            te(&[b"chunked;x=1"]),
            Err(FramingError::Invalid("chunked with parameters"))
        );
        assert_eq!(
            te(&[b"gzip, chunked;x=1"]),
            Err(FramingError::Invalid("chunked with parameters"))
        );
        for empty in [
            &b""[..],
            b" ",
            b",",
            b"chunked,",
            b", chunked",
            b"gzip,,chunked",
        ] {
            assert_eq!(
                te(&[empty]),
                Err(FramingError::Invalid("empty Transfer-Encoding element")),
                "{empty:?}"
            );
        }
        assert_eq!(
            te(&[b"chunked", b""]),
            Err(FramingError::Invalid("empty Transfer-Encoding element"))
        );
        for bad in [
            &b"chunked\xc2\xa0"[..],
            b"\xc2\xa0chunked",
            b"chunked\r",
            b"chunked\n",
            b"chun\x00ked",
            b"\x0bchunked",
            b"chunked\x7f",
            b"\"chunked\"",
            b"chunked x",
            b"gzip;",
            b"gzip;q",
            b"gzip;q=",
            b"gzip;=1",
            b"gzip;q=\"open",
            b"gzip;q=\"a\rb\"",
            b"gzip;q=a b",
            b"gzip chunked",
        ] {
            assert_eq!(
                te(&[bad]),
                Err(FramingError::Invalid("invalid Transfer-Encoding")),
                "{bad:?}"
            );
        }
    }
}
