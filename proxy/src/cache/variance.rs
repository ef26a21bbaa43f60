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

/// A field value normalised for comparison (§4.1): list items trimmed, whitespace runs collapsed,
/// lower-cased where the field is case-insensitive. An absent field differs from an empty one.
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
    if CASE_INSENSITIVE.contains(&name) {
        joined.to_ascii_lowercase()
    } else {
        joined
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
            "gzip,br"
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
}
