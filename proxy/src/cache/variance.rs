//! `Vary` (RFC 9111 §4.1): a response that varies on request fields is stored under a secondary
//! key made of the URL's key plus the normalised values of those fields in the request that
//! produced it, so several variants of one URL live side by side. The store remembers, per URL,
//! which fields its responses vary on, so a lookup can build the secondary key before it knows
//! which variant it will find.

use super::key::CacheKey;
use crate::http::request::RequestHead;

/// Separates the URL key from the variant part in a key's text.
pub const SEPARATOR: char = '\u{1f}';

/// Fields whose values compare case-insensitively (RFC 9110 defines their tokens that way).
const CASE_INSENSITIVE: &[&str] = &[
    "accept",
    "accept-encoding",
    "accept-language",
    "accept-charset",
    "origin",
];

/// Fields whose members carry only a quality value (RFC 9110 §12.4.2): members are ordered by
/// quality (a stable sort, so `q=1.0` and no `q` are one spelling). Among equal qualities,
/// `Accept-Encoding` members are also sorted by name (their order means nothing), but
/// `Accept-Language` members keep their order: RFC 9110 §12.5.4 notes that recipients read it as
/// priority, so `en, de` and `de, en` may get different answers, and merging them would let
/// one client choose the language every other client gets.
const QUALITY_LISTS: &[&str] = &["accept-encoding", "accept-language"];

/// A field value normalised for comparison (§4.1): list items trimmed, whitespace runs collapsed,
/// lower-cased where the field is case-insensitive, and for the quality lists members ordered as
/// [`QUALITY_LISTS`] says. An absent field differs from an empty one.
pub fn normalise(name: &str, value: Option<&str>) -> String {
    let Some(v) = value else {
        return "\u{0}".into();
    };
    let items: Vec<String> = v
        .split(',')
        .map(|i| {
            // Only SP and HTAB are whitespace in a field value (RFC 9110 §5.6.3): a no-break
            // space is a different value, not a spelling of the same one.
            i.split([' ', '\t'])
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|i| !i.is_empty())
        .collect();
    let joined = items.join(",");
    if !CASE_INSENSITIVE.contains(&name) {
        return joined;
    }
    let lower = joined.to_ascii_lowercase();
    if QUALITY_LISTS.contains(&name)
        && let Some(sorted) = by_quality(&lower, name == "accept-encoding")
    {
        return sorted;
    }
    lower
}

/// `a;q=0.5,c,b` as `c,b,a;q=0.500` (`b,c,...` with `by_name`); `None` when a member has anything
/// but a valid `q` (then the value is compared as written rather than guessed at).
fn by_quality(list: &str, by_name: bool) -> Option<String> {
    // Only SP and HTAB are whitespace here, as in `normalise`. Members borrow from `list`: this
    // runs on every lookup of a URL that varies, hits included.
    fn ws(s: &str) -> &str {
        s.trim_matches([' ', '\t'])
    }
    let mut members: Vec<(&str, u16)> = Vec::new();
    for item in list.split(',') {
        let (value, q) = match item.split_once(';') {
            None => (ws(item), 1000),
            Some((value, param)) => {
                let (k, v) = param.split_once('=')?;
                if ws(k) != "q" {
                    return None;
                }
                (ws(value), qvalue(ws(v))?)
            }
        };
        if value.is_empty() {
            return None;
        }
        members.push((value, q));
    }
    if by_name {
        members.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    } else {
        members.sort_by_key(|m| std::cmp::Reverse(m.1));
    }
    let mut out = String::with_capacity(list.len() + 8);
    for (i, (v, q)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(v);
        if *q != 1000 {
            out.push_str(&format!(";q=0.{q:03}"));
        }
    }
    Some(out)
}

/// A qvalue (RFC 9110 §12.4.2: `0[.ddd]` or `1[.000]`) in thousandths.
fn qvalue(s: &str) -> Option<u16> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // `0.5` is 500 thousandths: the digits, scaled by the ones not written.
    let thousandths = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// The secondary key of `req` for a URL whose responses vary on `names`.
pub fn variant(
    primary: &CacheKey,
    names: &[String],
    req: &RequestHead,
    hash_bits: u32,
) -> CacheKey {
    let mut text = primary.text.clone();
    text.push(SEPARATOR);
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            text.push(SEPARATOR);
        }
        text.push_str(n);
        text.push('=');
        text.push_str(&normalise(
            n,
            crate::http::headers::exact(&req.fields, n).as_deref(),
        ));
    }
    CacheKey::from_text(text, hash_bits)
}

/// The URL part of a (possibly secondary) key's text.
pub fn primary_text(key_text: &str) -> &str {
    key_text.split(SEPARATOR).next().unwrap_or(key_text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(extra: &str) -> RequestHead {
        crate::http::request::test_request("GET", extra)
    }

    #[test]
    fn rfc9111_4_1_values_are_normalised_before_comparison() {
        assert_eq!(
            normalise("accept-encoding", Some(" GZIP ,  br ")),
            "br,gzip"
        );
        assert_eq!(
            normalise("accept-language", Some("en-US,   fr")),
            "en-us,fr"
        );
        assert_eq!(
            normalise("cookie", Some("A=1")),
            "A=1",
            "cookie values keep their case"
        );
        assert_ne!(normalise("x", None), normalise("x", Some("")));
        // Members by quality; equal-quality languages keep their order, encodings do not.
        assert_ne!(
            normalise("accept-language", Some("en, de")),
            normalise("accept-language", Some("de, EN"))
        );
        assert_eq!(
            normalise("accept-language", Some("fr;q=0.5, en, de;q=1.0, it;q=0.50")),
            "en,de,fr;q=0.500,it;q=0.500"
        );
        assert_eq!(
            normalise("accept-encoding", Some("gzip;q=0.5, zstd, BR;q=1.0")),
            "br,zstd,gzip;q=0.500"
        );
        assert_ne!(
            normalise("accept-language", Some("en;q=0.9, de")),
            normalise("accept-language", Some("en, de;q=0.9"))
        );
        // Anything but a valid q keeps the value as written.
        for odd in [
            "en;q=2, de",
            "en;q=0.1234, de",
            "en;level=1, de",
            "en;q, de",
            "en;q=-0, de",
        ] {
            assert_eq!(
                normalise("accept-language", Some(odd)),
                odd.replace(' ', ""),
                "{odd}"
            );
        }
        assert_eq!(
            normalise("accept", Some("b, a")),
            "b,a",
            "Accept is not reordered"
        );
        let p = CacheKey::new("GET", "http", "h", "/x", 128);
        let names = vec!["accept-encoding".to_string()];
        let a = variant(&p, &names, &req("Accept-Encoding: gzip, br\r\n"), 128);
        let b = variant(&p, &names, &req("Accept-Encoding: GZIP,br\r\n"), 128);
        let c = variant(&p, &names, &req("Accept-Encoding: br\r\n"), 128);
        let d = variant(
            &p,
            &names,
            &req("Accept-Encoding: gzip\r\nAccept-Encoding: br\r\n"),
            128,
        );
        assert_eq!(a, b);
        assert_eq!(a, d, "repeated fields are one list");
        assert_ne!(a, c);
        assert_eq!(primary_text(&a.text), p.text);
    }

    #[test]
    fn regression_normalise_is_idempotent_on_a_line_feed_member() {
        // Found by the cache_fields fuzz target: `\n` is not whitespace in a field value, so a
        // member made of it is a member, and must not vanish on a second normalisation.
        let once = normalise("accept-encoding", Some("\n,\0 "));
        assert_eq!(once, "\0,\n");
        assert_eq!(normalise("accept-encoding", Some(&once)), once);
    }
}
