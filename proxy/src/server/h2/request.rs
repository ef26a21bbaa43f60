//! An HTTP/2 request head checked against RFC 9113 §8.2–8.3 and converted, field by field, into
//! the [`RequestHead`] the request path takes from either protocol. The `h2` crate refuses most
//! malformed heads itself (connection-specific fields, `te` other than `trailers`, upper-case
//! names, pseudo-header fields missing, repeated, unknown or after regular ones, CR/LF/NUL in
//! values); what it lets through and HTTP/2 still forbids is refused here, and the check is
//! repeated for what it does refuse: a field that crossed into HTTP/1.1 unchecked is the
//! downgrade-smuggling gap (a `transfer-encoding` or a CRLF in a value becomes a second request
//! upstream). The fields then pass [`request::from_parts`], the checks and normalisation an
//! HTTP/1.1 head gets after its framing, and the same limits (the head's size counted as its
//! HTTP/1.1 form would be), so nothing reaches routing, the cache key or an origin that an
//! HTTP/1.1 client could not have sent. No bytes are written or parsed again: the fuzz target
//! `h2_request` holds the conversion to what the HTTP/1.1 parser makes of the same head.

use crate::http::headers::Field;
use crate::http::request::{self, BodyFraming, Limits, RequestError, RequestHead};
use bytes::Bytes;
use http::request::Parts;

/// Why a stream is refused before anything goes upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Malformed (RFC 9113 §8.1.1): the stream is reset with `PROTOCOL_ERROR`.
    Malformed(&'static str),
    /// Well formed but not served here: answered with this status.
    Status(u16, &'static str),
    /// Refused by the checks every request gets (a bad `Host`, a target too long, a head too
    /// large): answered by the request path with its status, as an HTTP/1.1 client's is.
    Invalid(RequestError),
}

/// Fields that are connection-specific in HTTP/1.1 and forbidden in HTTP/2 (RFC 9113 §8.2.2).
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// Most fields a request may carry: the HTTP/1.1 parser's limit.
const MAX_FIELDS: usize = 128;

/// The request head of `parts` (a stream whose HEADERS frame ended it when `ended`), under
/// `limits`; or why it is refused. A body without `content-length` ends with its stream
/// ([`BodyFraming::EndStream`]).
pub(crate) fn to_request(
    parts: &Parts,
    ended: bool,
    limits: Limits,
) -> Result<RequestHead, Refusal> {
    let method = parts.method.as_str();
    if method == "CONNECT" {
        // Plain or extended CONNECT (RFC 8441): the proxy tunnels no protocol over h2.
        return Err(Refusal::Status(405, "CONNECT over HTTP/2"));
    }
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("");
    let path_ok = path.starts_with('/') || (path == "*" && method == "OPTIONS");
    if !path_ok {
        // §8.3.1: `:path` is origin-form, or `*` for OPTIONS; never empty.
        return Err(Refusal::Malformed(":path is not origin-form"));
    }
    let authority = parts.uri.authority().map(|a| a.as_str());
    if authority.is_some_and(|a| a.contains('@')) {
        return Err(Refusal::Malformed(":authority has userinfo"));
    }
    let mut fields: Vec<Field> = Vec::with_capacity(parts.headers.len() + 1);
    let mut host: Option<&[u8]> = None;
    let mut cookies: Vec<&[u8]> = Vec::new();
    let mut length_fields = 0;
    for (name, value) in &parts.headers {
        let name = name.as_str();
        let value = value.as_bytes();
        // The `h2` crate takes a name with `"` in it (its table for HPACK-decoded names is
        // wider than RFC 9110's token), which no HTTP/1.1 parser would pass: an origin that
        // reads `transfer-encoding"` as `transfer-encoding` is a desync (the review's find).
        if !is_token(name) {
            return Err(Refusal::Invalid(RequestError::Malformed(
                "a field name that is not a token".into(),
            )));
        }
        // The HTTP/1.1 parser reads fields in order and stops at the first fault, a field's
        // name read before its place is counted: the 129th field is "too large" (431) when
        // its name is a token, whatever follows (the fuzz target's two finds).
        if fields.len() >= MAX_FIELDS {
            return Err(Refusal::Invalid(RequestError::HeadTooLarge));
        }
        check_value(value)?;
        if CONNECTION_SPECIFIC.contains(&name) {
            return Err(Refusal::Malformed("connection-specific field"));
        }
        match name {
            "te" if value != b"trailers" => {
                return Err(Refusal::Malformed("te other than trailers"));
            }
            "host" if host.is_some() => return Err(Refusal::Malformed("host twice")),
            "host" => host = Some(value),
            // §8.2.3: a client may split `cookie` into several fields; joined before the
            // request path sees it, so bypass rules, the key and the origin see one field.
            "cookie" => cookies.push(value),
            // RFC 9110 §8.6: 1*DIGIT. The list an HTTP/1.1 recipient may fold (`0,0`) is not
            // one here: the `h2` crate refuses it, and the conversion must not depend on that
            // (the fuzz target's find: `000,0` read as a length by one side and none by the other).
            "content-length" if value.is_empty() || !value.iter().all(u8::is_ascii_digit) => {
                return Err(Refusal::Malformed("content-length not a number"));
            }
            "content-length" => {
                length_fields += 1;
                fields.push((name.to_string(), value.to_vec()));
            }
            _ => fields.push((name.to_string(), value.to_vec())),
        }
    }
    // §8.3.1: `:authority` and `host` name the same origin when both are sent.
    let host = match (authority, host) {
        (Some(a), Some(h)) if !a.as_bytes().eq_ignore_ascii_case(h) => {
            return Err(Refusal::Malformed(":authority and host differ"));
        }
        (Some(a), _) => Some(a.as_bytes()),
        (None, h) => h,
    };
    if let Some(h) = host {
        fields.push(("host".to_string(), h.to_vec()));
    }
    if !cookies.is_empty() {
        // Joined as §8.2.3 says, then trimmed as an HTTP/1.1 field value is (RFC 9110 §5.5): an
        // empty crumb would leave `; ` at an end, which the same head over HTTP/1.1 would not
        // carry (the fuzz target's find).
        let joined = cookies.join(&b"; "[..]);
        let ws = |b: &u8| *b == b' ' || *b == b'\t';
        let start = joined.iter().position(|b| !ws(b)).unwrap_or(joined.len());
        let end = joined.iter().rposition(|b| !ws(b)).map_or(start, |i| i + 1);
        fields.push(("cookie".to_string(), joined[start..end].to_vec()));
    }
    if length_fields > 1 {
        return Err(Refusal::Malformed("content-length twice"));
    }
    // §8.1.1: a content-length that the DATA frames (here: none) do not add up to. The crate
    // refuses it too; the conversion must not depend on that.
    if ended
        && parts
            .headers
            .get("content-length")
            .is_some_and(|v| v.as_bytes().iter().any(|&b| b != b'0'))
    {
        return Err(Refusal::Malformed("content-length without DATA"));
    }
    // The limits of the head's HTTP/1.1 form: `METHOD path HTTP/1.1`, each `name: value`, the
    // blank line. The `h2` crate's own limit counts 32 bytes more a field (RFC 9113 §6.5.2).
    if fields.len() > MAX_FIELDS {
        return Err(Refusal::Invalid(RequestError::HeadTooLarge));
    }
    let size = method.len()
        + path.len()
        + 12
        + fields
            .iter()
            .map(|(n, v)| n.len() + v.len() + 4)
            .sum::<usize>()
        + 2;
    if size > limits.max_head {
        return Err(Refusal::Invalid(RequestError::HeadTooLarge));
    }
    let mut head = request::from_parts(method.to_string(), path, false, fields, limits)
        .map_err(Refusal::Invalid)?;
    head.h2 = true;
    head.body = if ended {
        BodyFraming::None
    } else if length_fields == 1 {
        head.body
    } else {
        BodyFraming::EndStream
    };
    Ok(head)
}

/// RFC 9110 §5.1: a field name is a token (`tchar`s).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// §8.2.1: no CR, LF or NUL anywhere, and no whitespace at either end of a value (HTTP/1.1
/// would trim it, so two hops could read two values).
fn check_value(v: &[u8]) -> Result<(), Refusal> {
    if v.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(Refusal::Malformed("CR, LF or NUL in a field value"));
    }
    let ws = |b: &u8| *b == b' ' || *b == b'\t';
    if v.first().is_some_and(ws) || v.last().is_some_and(ws) {
        return Err(Refusal::Malformed("whitespace at the end of a field value"));
    }
    Ok(())
}

/// The head of a stream refused with `status`, for the client.
pub(crate) fn refusal_response(status: u16) -> http::Response<()> {
    let mut r = http::Response::new(());
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

/// The body of a stream refused with `status`.
pub(crate) fn refusal_body(status: u16) -> Bytes {
    Bytes::from(format!(
        "{status} {}\n",
        crate::http::response::reason(status)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's parts with names as the `h2` crate makes them from HPACK
    /// (`HeaderName::from_lowercase`, wider than a token).
    fn parts(method: &str, uri: &str, fields: &[(&str, &[u8])]) -> Parts {
        let b = http::Request::builder().method(method).uri(uri);
        let mut p = b.body(()).expect("request").into_parts().0;
        for (n, v) in fields {
            let name = http::HeaderName::from_lowercase(n.as_bytes()).expect("name");
            p.headers
                .append(name, http::HeaderValue::from_bytes(v).expect("value"));
        }
        p
    }

    const LIMITS: Limits = Limits {
        max_head: 16384,
        max_uri: 8192,
        path: crate::http::target::PathRules::SAFE,
    };

    fn to_h1(p: &Parts, ended: bool) -> Result<RequestHead, Refusal> {
        to_request(p, ended, LIMITS)
    }

    /// The converted head, written as its HTTP/1.1 form would be (for reading the tests).
    fn h1(p: &Parts, ended: bool) -> String {
        let head = to_h1(p, ended).expect("converted");
        assert!(head.h2);
        let mut out = format!("{} {} HTTP/1.1\r\n", head.method, head.target);
        for (n, v) in &head.fields {
            out.push_str(&format!("{n}: {}\r\n", String::from_utf8_lossy(v)));
        }
        out + "\r\n"
    }

    #[test]
    fn a_get_becomes_the_http11_head_with_host_from_authority() {
        let p = parts(
            "GET",
            "https://a.example/x?y=1",
            &[("accept", b"*/*"), ("user-agent", b"curl/7.88")],
        );
        assert_eq!(
            h1(&p, true),
            "GET /x?y=1 HTTP/1.1\r\naccept: */*\r\nuser-agent: curl/7.88\r\nhost: a.example\r\n\r\n"
        );
        let head = to_h1(&p, true).expect("ok");
        assert_eq!(head.body, BodyFraming::None);
        assert_eq!(head.host, "a.example");
    }

    #[test]
    fn split_cookies_are_joined_into_one_field() {
        let p = parts(
            "GET",
            "https://a.example/",
            &[("cookie", b"a=1"), ("x", b"y"), ("cookie", b"b=2")],
        );
        assert_eq!(
            h1(&p, true),
            "GET / HTTP/1.1\r\nx: y\r\nhost: a.example\r\ncookie: a=1; b=2\r\n\r\n"
        );
        // An empty crumb: joined, then trimmed as the HTTP/1.1 value would be.
        let p = parts(
            "GET",
            "https://a.example/",
            &[("cookie", b"a=1"), ("cookie", b"")],
        );
        assert_eq!(
            h1(&p, true),
            "GET / HTTP/1.1\r\nhost: a.example\r\ncookie: a=1;\r\n\r\n"
        );
    }

    #[test]
    fn a_body_without_length_ends_with_the_stream_and_with_one_keeps_it() {
        let p = parts("POST", "https://a.example/u", &[]);
        let head = to_h1(&p, false).expect("ok");
        assert_eq!(head.body, BodyFraming::EndStream);
        // No framing field is made up for it: the fetch frames what it forwards.
        assert_eq!(h1(&p, false), "POST /u HTTP/1.1\r\nhost: a.example\r\n\r\n");
        let p = parts("POST", "https://a.example/u", &[("content-length", b"5")]);
        assert_eq!(to_h1(&p, false).expect("ok").body, BodyFraming::Length(5));
        assert_eq!(
            h1(&p, false),
            "POST /u HTTP/1.1\r\ncontent-length: 5\r\nhost: a.example\r\n\r\n"
        );
        // A zero length with its stream still open: DATA can only be empty, no body.
        let p = parts("POST", "https://a.example/u", &[("content-length", b"0")]);
        assert_eq!(to_h1(&p, false).expect("ok").body, BodyFraming::None);
    }

    /// What every request gets after its framing, an h2 one included: the HTTP/1.1 parser's
    /// limits (the head's size counted as its HTTP/1.1 form), its `Host` grammar and its
    /// target rules, answered with their statuses.
    #[test]
    fn the_checks_every_request_gets_apply() {
        let p = parts(
            "GET",
            "https://a.example/",
            &[("x-big", &[b'a'; 16_400][..])],
        );
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Invalid(RequestError::HeadTooLarge))
        );
        // Exactly at the limit: `GET / HTTP/1.1` (16), the field (`x-big: ` and CRLF, 9), `host:
        // a.example` (17), the blank line (2).
        let fits = vec![b'a'; 16_384 - 16 - 9 - 17 - 2];
        let p = parts("GET", "https://a.example/", &[("x-big", &fits[..])]);
        assert!(to_h1(&p, true).is_ok());
        let mut over = fits.clone();
        over.push(b'a');
        let p = parts("GET", "https://a.example/", &[("x-big", &over[..])]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Invalid(RequestError::HeadTooLarge))
        );
        let many: Vec<(String, Vec<u8>)> = (0..129)
            .map(|i| (format!("x-{i}"), b"1".to_vec()))
            .collect();
        let many: Vec<(&str, &[u8])> = many.iter().map(|(n, v)| (n.as_str(), &v[..])).collect();
        let p = parts("GET", "https://a.example/", &many);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Invalid(RequestError::HeadTooLarge))
        );
        let long = format!("/{}", "a".repeat(8192));
        let p = parts("GET", &format!("https://a.example{long}"), &[]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Invalid(RequestError::UriTooLong))
        );
        let p = parts("GET", "/x", &[("host", b"a.example:notaport")]);
        assert!(matches!(
            to_h1(&p, true).err(),
            Some(Refusal::Invalid(RequestError::Malformed(_)))
        ));
        let p = parts("GET", "/x", &[]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Invalid(RequestError::Malformed(
                "missing Host".into()
            )))
        );
        // A name the `h2` crate passes and no HTTP/1.1 parser would: refused with 400.
        for name in ["transfer-encoding\"", "x\"y"] {
            let p = parts("POST", "https://a.example/", &[(name, b"chunked")]);
            assert_eq!(
                to_h1(&p, false).err(),
                Some(Refusal::Invalid(RequestError::Malformed(
                    "a field name that is not a token".into()
                ))),
                "{name}"
            );
        }
        // Underscored names are dropped, as from an HTTP/1.1 client.
        let p = parts(
            "GET",
            "https://a.example/",
            &[("x_forwarded_host", b"evil")],
        );
        assert_eq!(h1(&p, true), "GET / HTTP/1.1\r\nhost: a.example\r\n\r\n");
        // The target is normalised as an HTTP/1.1 one is.
        let p = parts("GET", "https://a.example/a/../b/%7e", &[]);
        assert_eq!(to_h1(&p, true).expect("ok").target, "/b/~");
    }

    #[test]
    fn host_alone_is_used_and_must_agree_with_authority() {
        let p = parts("GET", "/x", &[("host", b"b.example")]);
        assert_eq!(h1(&p, true), "GET /x HTTP/1.1\r\nhost: b.example\r\n\r\n");
        let p = parts("GET", "https://a.example/x", &[("host", b"A.example")]);
        assert_eq!(h1(&p, true), "GET /x HTTP/1.1\r\nhost: a.example\r\n\r\n");
        let p = parts("GET", "https://a.example/x", &[("host", b"evil.example")]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Malformed(":authority and host differ"))
        );
        let p = parts(
            "GET",
            "/x",
            &[("host", b"a.example"), ("host", b"evil.example")],
        );
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Malformed("host twice"))
        );
    }

    #[test]
    fn downgrade_smuggling_fields_are_refused() {
        for (n, v) in [
            ("transfer-encoding", &b"chunked"[..]),
            ("connection", b"close"),
            ("keep-alive", b"timeout=5"),
            ("proxy-connection", b"keep-alive"),
            ("upgrade", b"websocket"),
        ] {
            let p = parts("POST", "https://a.example/", &[(n, v)]);
            assert_eq!(
                to_h1(&p, false).err(),
                Some(Refusal::Malformed("connection-specific field")),
                "{n}"
            );
        }
        let p = parts("GET", "https://a.example/", &[("te", b"gzip")]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Malformed("te other than trailers"))
        );
        let p = parts("GET", "https://a.example/", &[("te", b"trailers")]);
        assert_eq!(
            h1(&p, true),
            "GET / HTTP/1.1\r\nte: trailers\r\nhost: a.example\r\n\r\n"
        );
        let p = parts(
            "POST",
            "https://a.example/",
            &[("content-length", b"5"), ("content-length", b"50")],
        );
        assert_eq!(
            to_h1(&p, false).err(),
            Some(Refusal::Malformed("content-length twice"))
        );
        // The fuzz target's find: a length announced on a stream its HEADERS ended.
        let p = parts(
            "PUT",
            "/u",
            &[("host", b"b.example"), ("content-length", b"12")],
        );
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Malformed("content-length without DATA"))
        );
        // And a list, a sign, an empty value: not a length (the fuzz target's second find).
        for bad in [&b"000,0"[..], b"0,0", b"+5", b"", b"0x10"] {
            let p = parts(
                "PUT",
                "/u",
                &[("host", b"b.example"), ("content-length", bad)],
            );
            assert_eq!(
                to_h1(&p, false).err(),
                Some(Refusal::Malformed("content-length not a number")),
                "{bad:?}"
            );
        }
        // Zero written long is still zero: no DATA is what it announced.
        let p = parts(
            "PUT",
            "/u",
            &[("host", b"b.example"), ("content-length", b"0000")],
        );
        assert_eq!(
            h1(&p, true),
            "PUT /u HTTP/1.1\r\ncontent-length: 0000\r\nhost: b.example\r\n\r\n"
        );
    }

    #[test]
    fn whitespace_at_a_value_end_is_refused() {
        for v in [&b" x"[..], b"x ", b"\tx", b"x\t"] {
            let p = parts("GET", "https://a.example/", &[("x-a", v)]);
            assert_eq!(
                to_h1(&p, true).err(),
                Some(Refusal::Malformed("whitespace at the end of a field value"))
            );
        }
        assert_eq!(
            check_value(b"a\0b"),
            Err(Refusal::Malformed("CR, LF or NUL in a field value"))
        );
        assert_eq!(
            check_value(b"a\r\nb: c"),
            Err(Refusal::Malformed("CR, LF or NUL in a field value"))
        );
        assert_eq!(check_value(b"a b"), Ok(()));
    }

    #[test]
    fn path_must_be_origin_form_or_star_for_options() {
        let p = parts("OPTIONS", "*", &[("host", b"a.example")]);
        assert_eq!(
            h1(&p, true),
            "OPTIONS * HTTP/1.1\r\nhost: a.example\r\n\r\n"
        );
        let p = parts("GET", "*", &[("host", b"a.example")]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Malformed(":path is not origin-form"))
        );
        let p = parts("CONNECT", "a.example:443", &[]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Status(405, "CONNECT over HTTP/2"))
        );
        let p = parts("GET", "https://u:p@a.example/", &[]);
        assert_eq!(
            to_h1(&p, true).err(),
            Some(Refusal::Malformed(":authority has userinfo"))
        );
    }
}
