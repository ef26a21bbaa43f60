//! The request target and the authority, as one normalised identity.
//!
//! Routing, bypass rules, the cache key and the request sent upstream are all computed from what
//! this module returns, so they can never disagree about which resource a request names. An origin
//! that decodes `%2e%2e` or merges `//` itself could otherwise be asked for `/account` while the
//! cache files the answer under a public, cacheable path (web cache deception).
//!
//! The normalisation is RFC 3986 §6.2.2's and nothing more: percent-encoded *unreserved*
//! characters are decoded, the hex digits of every other escape are upper-cased, and dot-segments
//! are removed from the path. Reserved escapes stay opaque: `%2F` is not `/` (npm scoped packages,
//! GitLab project paths and S3 keys depend on it).
//!
//! Two spellings mean different things to different origins, so their treatment is the operator's
//! choice ([`PathRules`]), with a safe default. A backslash (IIS and some Java containers take it
//! as `/`) is refused by default. A `;` path parameter is kept opaque by default (routes and
//! bypass rules match prefixes, which a parameter cannot fake), but a dot-segment with parameters
//! (`/static/..;/account`, which Tomcat resolves to `/account`) is always refused: no key could
//! name what such a path means to the origin.
//!
//! The authority is RFC 9112 §3.2's `uri-host [ ":" port ]`, narrowed to what names a host: an IP
//! literal, or a DNS name (labels of letters, digits, `-` and `_`); one trailing dot and leading
//! zeros in the port are normalised away, anything else (`%2e`, sub-delims, `-a`, port 99999) is
//! 400, so one origin has exactly one key.

/// How the two origin-dependent path spellings are treated (`proxy.path_backslash`,
/// `proxy.path_parameters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRules {
    /// Refuse `\` in the path (else it is an ordinary, opaque byte).
    pub reject_backslash: bool,
    /// Refuse any `;` in the path (else `;params` are opaque; `..;` and `.;` are refused anyway).
    pub reject_parameters: bool,
    /// Refuse a dot-segment beside an encoded separator (`..%2F`, `%2e%2e%5C`).
    pub reject_encoded_traversal: bool,
}

impl PathRules {
    /// The defaults: backslashes refused, parameters kept opaque.
    #[cfg(any(test, feature = "fuzzing"))]
    pub const SAFE: PathRules = PathRules {
        reject_backslash: true,
        reject_parameters: false,
        reject_encoded_traversal: true,
    };
}

/// Why a target or authority was refused (always 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

/// True for RFC 3986 `unreserved`.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Validates `uri-host [ ":" port ]` (RFC 9112 §3.2, RFC 3986 §3.2.2) and returns it lower-cased,
/// without an empty port and without the default port `default_port`.
pub fn authority(a: &str, default_port: &str) -> Result<String, Invalid> {
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let end = rest.find(']').ok_or(Invalid("unclosed IP literal"))?;
        let literal = &rest[..end];
        if literal.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(Invalid("invalid IP literal"));
        }
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(Invalid("junk after IP literal")),
        };
        (&a[..end + 2], port)
    } else {
        let (host, port) = match a.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        };
        // One trailing dot names the same host (a fully qualified name): keyed once.
        let host = host.strip_suffix('.').unwrap_or(host);
        host_name(host)?;
        (host, port)
    };
    // Decimal, 1 to 65535; leading zeros name the same port (`080` is 80).
    let port = match port {
        None | Some("") => None,
        Some(p) if p.len() > 5 || !p.bytes().all(|c| c.is_ascii_digit()) => {
            return Err(Invalid("invalid port"));
        }
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(Invalid("port out of range")),
            Ok(n) if n.to_string() == default_port => None,
            Ok(n) => Some(n),
        },
    };
    let mut out = host.to_ascii_lowercase();
    if let Some(p) = port {
        out.push(':');
        out.push_str(&p.to_string());
    }
    Ok(out)
}

/// A host name as DNS has them (an IPv4 address is one too): dot-separated labels of 1 to 63
/// letters, digits, `-` and `_`, none starting or ending with `-`, 253 bytes at most. RFC 3986's
/// reg-name also allows percent-encoding and sub-delims, which name no host a resolver finds
/// and would only key one origin several ways (`a%2eexample`, `a.example`), so they are 400.
fn host_name(host: &str) -> Result<(), Invalid> {
    if host.is_empty() {
        return Ok(()); // an empty authority: the callers refuse or default it
    }
    if host.len() > 253 {
        return Err(Invalid("host name too long"));
    }
    for label in host.split('.') {
        let b = label.as_bytes();
        if b.is_empty() || b.len() > 63 {
            return Err(Invalid("invalid host name label"));
        }
        if !b
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
        {
            return Err(Invalid("invalid character in host"));
        }
        if b[0] == b'-' || b[b.len() - 1] == b'-' {
            return Err(Invalid("host name label starts or ends with -"));
        }
    }
    Ok(())
}

/// The normalised form of an origin-form target (`/path?query`). Returns the input unchanged (and
/// unallocated beyond the copy) when there is nothing to normalise, which is the common case.
pub fn normalise(t: &str, rules: PathRules) -> Result<String, Invalid> {
    let (path, query) = match t.find('?') {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    if rules.reject_backslash && (path.contains('\\') || contains_escape(path, b'\\')) {
        return Err(Invalid("backslash in path"));
    }
    if rules.reject_encoded_traversal && encoded_traversal(path)? {
        return Err(Invalid("dot-segment beside an encoded separator"));
    }
    if path.contains(';') {
        if rules.reject_parameters {
            return Err(Invalid("path parameter"));
        }
        // Decoded first, so `%2e%2e;` is caught as well as `..;`.
        let decoded = decode_unreserved(path)?;
        if decoded
            .split('/')
            .any(|s| matches!(s.split(';').next(), Some(".") | Some("..")) && s.contains(';'))
        {
            return Err(Invalid("dot-segment with parameters"));
        }
    }
    let needs_work = t.contains('%') || has_dot_segment(path);
    if !needs_work {
        return Ok(t.to_string());
    }
    let path = remove_dot_segments(&decode_unreserved(path)?);
    let mut out = path;
    if let Some(q) = query {
        out.push('?');
        out.push_str(&decode_unreserved(q)?);
    }
    Ok(out)
}

/// True when `s` holds `c` percent-encoded (`%5C`, `%5c` for `\\`).
fn contains_escape(s: &str, c: u8) -> bool {
    s.as_bytes().windows(3).any(|w| {
        w[0] == b'%'
            && hex(w[1])
                .zip(hex(w[2]))
                .is_some_and(|(h, l)| h * 16 + l == c)
    })
}

/// True when a `.` or `..` piece of the path (unreserved escapes decoded, so `%2e%2e` counts)
/// is delimited on some side by an encoded `/` or `\\`: `/static/..%2Fprivate`. Such a path is one
/// segment to the cache and a climb out of its prefix to an origin that decodes `%2F`.
fn encoded_traversal(path: &str) -> Result<bool, Invalid> {
    if !path.contains('%') {
        return Ok(false);
    }
    let decoded = decode_unreserved(path)?;
    Ok(decoded.split('/').any(|segment| {
        let pieces: Vec<&str> = segment.split("%2F").flat_map(|p| p.split("%5C")).collect();
        pieces.len() > 1 && pieces.iter().any(|p| *p == "." || *p == "..")
    }))
}

/// True when some segment of `path` is `.` or `..` (before any decoding).
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|s| s == "." || s == "..")
}

/// Decodes escapes of unreserved characters and upper-cases the hex of the rest; a `%` not
/// followed by two hex digits is refused (origins disagree on what it means).
fn decode_unreserved(s: &str) -> Result<String, Invalid> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(Invalid("invalid percent-encoding"));
            };
            let c = h * 16 + l;
            if unreserved(c) {
                out.push(c);
            } else {
                out.push(b'%');
                out.push(b[i + 1].to_ascii_uppercase());
                out.push(b[i + 2].to_ascii_uppercase());
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    // Only ASCII was decoded and the rest copied byte for byte, so the bytes are still UTF-8.
    String::from_utf8(out).map_err(|_| Invalid("invalid UTF-8 in target"))
}

/// RFC 3986 §5.2.4 on an absolute path: `.` segments vanish, `..` removes the segment before it
/// (never climbing above the root), and a trailing `.`/`..` leaves the directory's slash.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." | ".." => {
                if *seg == ".." {
                    out.pop();
                }
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let mut s = String::with_capacity(path.len());
    for seg in &out {
        s.push('/');
        s.push_str(seg);
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

/// The path part of a request target: up to its `?`. A plain scan: the `str` searcher's setup
/// costs more than the short targets it finds `?` in (about 100 instructions a call, and every
/// request asks more than once).
pub(crate) fn path_of(target: &str) -> &str {
    let end = target
        .bytes()
        .position(|b| b == b'?')
        .unwrap_or(target.len());
    &target[..end]
}

/// `target` with runs of `/` in its path merged, for matching prefixes only: origins that merge
/// slashes (nginx's `merge_slashes`, most frameworks) serve `//account` as `/account`, so a
/// prefix rule for `/account` must match it too. The key and the upstream request keep the target
/// as it is (merging is not RFC 3986 normalisation, and some origins do distinguish).
pub(crate) fn merged_slashes(target: &str) -> std::borrow::Cow<'_, str> {
    let (end, doubled) = path_shape(target);
    if !doubled {
        return std::borrow::Cow::Borrowed(target);
    }
    let path = &target[..end];
    let mut out = String::with_capacity(target.len());
    let mut last_slash = false;
    for c in path.chars() {
        if c == '/' && last_slash {
            continue;
        }
        last_slash = c == '/';
        out.push(c);
    }
    out.push_str(&target[end..]);
    std::borrow::Cow::Owned(out)
}

/// Where a target's path ends (its `?`, or its end), and whether the path holds `//`: every
/// request's route is found through here. Eight bytes at a time, in a word: a byte loop cost 10
/// instructions a byte (callgrind), and a substring search or a vector scan costs more to set up
/// than the short path it searches.
pub(crate) fn path_shape(target: &str) -> (usize, bool) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // The bytes of `w` equal to `b`, as their top bits. Exact: `(t & 0x7f) + 0x7f` stays within
    // its byte, so no carry marks a neighbour.
    let equal = |w: u64, b: u8| {
        let t = w ^ (ONES * u64::from(b));
        !(((t & LOW7) + LOW7) | t | LOW7)
    };
    let bytes = target.as_bytes();
    let mut doubled = false;
    // The last byte of the word before, when it was a `/`, as the first byte's top bit.
    let mut carried = 0u64;
    let mut i = 0;
    while i < bytes.len() {
        let n = (bytes.len() - i).min(8);
        let w = match bytes.get(i..i + 8) {
            Some(word) => u64::from_le_bytes([
                word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
            ]),
            // The last few bytes, zero after them (a zero is neither `/` nor `?`).
            None => bytes[i..]
                .iter()
                .rev()
                .fold(0u64, |w, &b| (w << 8) | u64::from(b)),
        };
        let question = equal(w, b'?');
        let mut slashes = equal(w, b'/');
        if question != 0 {
            // Only the slashes before the `?`.
            slashes &= question - 1;
        }
        doubled |= slashes & ((slashes << 8) | carried) != 0;
        if question != 0 {
            return (i + question.trailing_zeros() as usize / 8, doubled);
        }
        carried = (slashes >> 56) & 0x80;
        i += n;
    }
    (bytes.len(), doubled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_shape_is_what_a_byte_by_byte_look_says() {
        let naive = |t: &str| {
            let end = t.find('?').unwrap_or(t.len());
            (end, t[..end].contains("//"))
        };
        // Every string of up to 7 characters of `/`, `?`, `a` and `é` (bytes with the top bit
        // set: the word trick's hard case), up to 14 bytes, and longer ones across word
        // boundaries.
        let alphabet = ["/", "?", "a", "é"];
        let mut cases = vec![String::new()];
        for _ in 0..7 {
            let more: Vec<String> = cases
                .iter()
                .flat_map(|c| alphabet.iter().map(move |a| format!("{c}{a}")))
                .collect();
            cases.extend(more);
            cases.sort();
            cases.dedup();
        }
        for pad in ["", "x", "xxxxxxx", "xxxxxxxx", "xxxxxxxxxxxxxxx"] {
            for c in ["//", "/?/", "?//", "/a/", "a/", "/", "//?"] {
                cases.push(format!("{pad}{c}"));
                cases.push(format!("{pad}{c}{pad}"));
            }
        }
        for t in &cases {
            assert_eq!(path_shape(t), naive(t), "{t:?}");
        }
        assert_eq!(path_shape("/obj/1024"), (9, false));
        assert_eq!(path_shape("/obj/1024//"), (11, true));
        assert_eq!(path_shape("/1234567/?a=//"), (9, false));
        assert_eq!(
            path_shape("/1234567//"),
            (10, true),
            "across a word boundary"
        );
    }

    #[test]
    fn authorities_follow_the_grammar() {
        for (a, want) in [
            ("A.Example", "a.example"),
            ("a.example:80", "a.example"),
            ("a.example:", "a.example"),
            ("a.example:8080", "a.example:8080"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]:8080", "[::1]:8080"),
            ("[::1]:80", "[::1]"),
            ("xn--r8jz45g.jp", "xn--r8jz45g.jp"),
            ("a.example.", "a.example"),
            ("a.example.:8080", "a.example:8080"),
            ("a.example:080", "a.example"),
            ("a.example:0443", "a.example:443"),
            ("a.example:65535", "a.example:65535"),
            ("_dmarc.a.example", "_dmarc.a.example"),
        ] {
            assert_eq!(authority(a, "80"), Ok(want.to_string()), "{a}");
        }
        for bad in [
            "a.example|/pipe",
            "a b",
            "a.example:abc",
            "a@b",
            "a/b",
            "a.example\u{a0}",
            "例え.jp",
            "[::1",
            "[zz]",
            "a:123456",
            "a%zz",
            "a.example:80:80",
            "a%2eexample",
            "a%41.example",
            "-a.example",
            "a-.example",
            "a..example",
            ".a.example",
            "a.example..",
            "a.example:99999",
            "a.example:65536",
            "a.example:0",
            "a!.example",
            "a;b.example",
            "a.example:+80",
        ] {
            assert!(authority(bad, "80").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn targets_are_normalised_once() {
        for (t, want) in [
            ("/a/b?x=1", "/a/b?x=1"),
            ("/a/%2e%2e/admin", "/admin"),
            ("/a/%2E%2e/admin", "/admin"),
            ("/a/./b/../c", "/a/c"),
            ("/../../etc", "/etc"),
            ("/a/..", "/"),
            ("/a/b/.", "/a/b/"),
            ("/%7Euser/%41", "/~user/A"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%2Fb", "/a%2Fb"),
            ("/q?a=%41%2f", "/q?a=A%2F"),
            ("/a//b", "/a//b"),
            ("/x;jsessionid=1", "/x;jsessionid=1"),
        ] {
            assert_eq!(normalise(t, PathRules::SAFE), Ok(want.to_string()), "{t}");
        }
        for bad in [
            "/a\\b",
            "/a%",
            "/a%2",
            "/a%zz",
            "/q?a=%g1",
            "/static/..;/account",
            "/static/.;/x",
            "/static/%2e%2e;x/account",
        ] {
            assert!(normalise(bad, PathRules::SAFE).is_err(), "{bad}");
        }
        // Web cache deception through an encoded separator: refused, as is an encoded backslash.
        for bad in [
            "/static/..%2fprivate/x",
            "/static/..%2Fprivate/x",
            "/static/%2e%2e%2fprivate",
            "/static/%2E%2E%2Fprivate",
            "/static/..%5cprivate",
            "/static/x%2F..%2Fprivate",
            "/static/x%2F.",
            "/a%5Cb",
            "/a%5cb",
        ] {
            assert!(normalise(bad, PathRules::SAFE).is_err(), "{bad}");
        }
        // An encoded separator without a dot-segment beside it is an ordinary, opaque escape.
        for (good, want) in [
            ("/-/@scope%2fname", "/-/@scope%2Fname"),
            ("/a%2F..b/c", "/a%2F..b/c"),
            ("/a/...%2Fb", "/a/...%2Fb"),
            ("/q?x=..%2f", "/q?x=..%2F"),
        ] {
            assert_eq!(
                normalise(good, PathRules::SAFE),
                Ok(want.to_string()),
                "{good}"
            );
        }
        let lenient = PathRules {
            reject_backslash: false,
            reject_parameters: false,
            reject_encoded_traversal: false,
        };
        assert_eq!(normalise("/a\\b", lenient), Ok("/a\\b".to_string()));
        let strict = PathRules {
            reject_backslash: true,
            reject_parameters: true,
            reject_encoded_traversal: true,
        };
        assert!(normalise("/x;jsessionid=1", strict).is_err());
        assert!(
            normalise("/x?a=1;b=2", strict).is_ok(),
            "a query's `;` is no path parameter"
        );
    }
}
