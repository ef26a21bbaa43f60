//! Header field helpers, chiefly the hop-by-hop rules of RFC 9110 §7.6.1: fields that describe one
//! connection, not the message, and so must never cross the proxy or enter the cache.

/// Fields that are hop-by-hop whatever `Connection` says.
use zerocache_config::validate::HOP_BY_HOP;

/// A header field as owned bytes: names keep their case as received, values are raw.
pub type Field = (String, Vec<u8>);

/// Every value of `name` in `fields`, comma-joined (RFC 9110 §5.3: a repeated list field is one
/// list); `None` when absent.
pub fn joined(fields: &[Field], name: &str) -> Option<String> {
    let values: Vec<String> = fields
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// True when a field `name` is present, whatever its value (a decision that a field's presence
/// drives must not be dodged by a value that is not UTF-8).
pub fn has(fields: &[Field], name: &str) -> bool {
    fields.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
}

/// Every value of `name`, joined with `, ` and written losslessly: bytes that are not printable
/// ASCII, and `\`, as `\xHH`. For cache keys and `Vary`, where two different requests must
/// never look the same (a lossy decoding turns every invalid byte into one U+FFFD).
pub fn exact(fields: &[Field], name: &str) -> Option<String> {
    let mut out: Option<String> = None;
    for (_, v) in fields.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name)) {
        let s = out.get_or_insert_with(String::new);
        if !s.is_empty() {
            s.push_str(", ");
        }
        for &b in v {
            if (0x20..0x7f).contains(&b) && b != b'\\' || b == b'\t' {
                s.push(b as char);
            } else {
                s.push_str(&format!("\\x{b:02X}"));
            }
        }
    }
    out
}

/// True if `name` is hop-by-hop, either always or because `Connection` names it.
pub fn is_hop_by_hop(name: &str, connection_tokens: &[String]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || connection_tokens
            .iter()
            .any(|t| name.eq_ignore_ascii_case(t))
}

/// True for the fields that make a request partial or conditional (`Range`, `If-*`): a request
/// that fills the cache asks for the whole, unconditional representation without them.
pub fn is_range_or_condition(name: &str) -> bool {
    name.eq_ignore_ascii_case("range")
        || name.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("if-"))
}

/// The lower-cased tokens of every `Connection` field.
pub fn connection_tokens<'a>(fields: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, value) in fields {
        if name.eq_ignore_ascii_case("connection") {
            for t in String::from_utf8_lossy(value).split(',') {
                let t = t.trim();
                if !t.is_empty() {
                    out.push(t.to_ascii_lowercase());
                }
            }
        }
    }
    out
}

/// This proxy's `Via` member (RFC 9110 §7.6.3), by the protocol version of the message it
/// received: what a hit or a generated answer says, where nothing came before it.
pub const VIA_SELF: &str = "1.1 zerocache";

/// The whole `Via` line of a hit or a generated answer: one copy of a static slice on the hit
/// path, where a field built from its parts would be four.
pub const VIA_SELF_LINE: &[u8] = b"Via: 1.1 zerocache\r\n";

/// The `Via` value to send on: `received` (the message's own `Via`, its lines joined by the caller), then this
/// proxy as a member named by the version of the message it received (`http10`).
pub fn via(received: Option<&str>, http10: bool) -> String {
    via_as(received, if http10 { "1.0 zerocache" } else { VIA_SELF })
}

/// The `Via` value to send on a request that came over HTTP/2 (`2 zerocache`, RFC 9110 §7.6.3
/// names the protocol received).
pub fn via_h2(received: Option<&str>) -> String {
    via_as(received, "2 zerocache")
}

fn via_as(received: Option<&str>, me: &str) -> String {
    match received {
        Some(prev) if !prev.is_empty() => format!("{prev}, {me}"),
        _ => me.to_string(),
    }
}

/// Appends `name: value\r\n`.
pub fn put(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `name: n\r\n` without allocating.
pub fn put_num(out: &mut Vec<u8>, name: &str, n: u64) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    put_digits(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends the decimal digits of `n` without allocating.
pub fn put_digits(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_static_via_line_is_the_built_one() {
        let mut built = Vec::new();
        put(&mut built, "Via", via(None, false).as_bytes());
        assert_eq!(built, VIA_SELF_LINE);
        assert_eq!(
            via(Some("1.0 a, 1.1 b"), true),
            "1.0 a, 1.1 b, 1.0 zerocache"
        );
        assert_eq!(via(Some(""), false), VIA_SELF);
    }

    #[test]
    fn connection_names_extra_hop_by_hop_fields() {
        let fields = [
            ("Connection", &b"close, X-Secret"[..]),
            ("X-Other", &b"1"[..]),
        ];
        let tokens = connection_tokens(fields.iter().map(|(n, v)| (*n, *v)));
        assert_eq!(tokens, vec!["close".to_string(), "x-secret".to_string()]);
        assert!(is_hop_by_hop("X-Secret", &tokens));
        assert!(is_hop_by_hop("Transfer-Encoding", &tokens));
        assert!(is_hop_by_hop("Proxy-Authorization", &[]));
        assert!(!is_hop_by_hop("X-Other", &tokens));
    }

    #[test]
    fn exact_values_never_collide_where_lossy_ones_would() {
        let f = |v: &[u8]| vec![("X-T".to_string(), v.to_vec())];
        assert_eq!(exact(&f(b"a b"), "x-t").as_deref(), Some("a b"));
        assert_ne!(exact(&f(b"\xff"), "x-t"), exact(&f(b"\xfe"), "x-t"));
        assert_ne!(exact(&f(b"\xff"), "x-t"), exact(&f(b"\\xFF"), "x-t"));
        assert_eq!(exact(&f(b"\xff"), "x-t").as_deref(), Some("\\xFF"));
        assert_eq!(exact(&[], "x-t"), None);
        let two = vec![
            ("X-T".to_string(), b"victim".to_vec()),
            ("x-t".to_string(), b"evil".to_vec()),
        ];
        assert_eq!(exact(&two, "X-T").as_deref(), Some("victim, evil"));
        assert!(has(&f(b"\x80"), "X-t"));
    }

    #[test]
    fn numbers_are_written_exactly() {
        let mut v = Vec::new();
        put_num(&mut v, "Content-Length", 0);
        put_num(&mut v, "Age", 18_446_744_073_709_551_615);
        assert_eq!(v, b"Content-Length: 0\r\nAge: 18446744073709551615\r\n");
    }
}
