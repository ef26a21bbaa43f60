//! An HTTP/2 request head checked against RFC 9113 §8.2–8.3 and written as the HTTP/1.1 head the
//! request path reads. The `h2` crate refuses most malformed heads itself (connection-specific
//! fields, `te` other than `trailers`, upper-case names, pseudo-header fields missing, repeated,
//! unknown or after regular ones, CR/LF/NUL in values); what it lets through and HTTP/2 still
//! forbids is refused here, and the check is repeated for what it does refuse: a field that
//! crossed into HTTP/1.1 unchecked is the downgrade-smuggling gap (a `transfer-encoding` or a CRLF
//! in a value becomes a second request upstream). The HTTP/1.1 head written here is then parsed by
//! the same strict parser as a client's, so nothing reaches routing, the cache key or an origin
//! that an HTTP/1.1 client could not have sent.

use bytes::Bytes;
use http::request::Parts;

/// How the request's body follows its translated head on the pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyMode {
    /// None: the HEADERS frame ended the stream.
    None,
    /// Exactly the `content-length` the client sent (the `h2` crate holds the DATA frames to it).
    Length,
    /// DATA frames without a `content-length`: chunked on the pipe.
    Chunked,
}

/// Why a stream is refused before anything goes upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Malformed (RFC 9113 §8.1.1): the stream is reset with `PROTOCOL_ERROR`.
    Malformed(&'static str),
    /// Well formed but not served here: answered with this status.
    Status(u16, &'static str),
}

/// Fields that are connection-specific in HTTP/1.1 and forbidden in HTTP/2 (RFC 9113 §8.2.2).
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The HTTP/1.1 head for `parts` (a stream whose HEADERS frame ended it when `ended`), and how
/// its body follows; or why it is refused.
pub(crate) fn to_h1(parts: &Parts, ended: bool) -> Result<(Vec<u8>, BodyMode), Refusal> {
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
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut host: Option<&[u8]> = None;
    let mut cookies: Vec<&[u8]> = Vec::new();
    let mut length_fields = 0;
    for (name, value) in &parts.headers {
        let name = name.as_str();
        let value = value.as_bytes();
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
            // one here: the `h2` crate refuses it, and the translation must not depend on that
            // (the fuzz target's find: `000,0` read as a length by one side and none by the other).
            "content-length" if value.is_empty() || !value.iter().all(u8::is_ascii_digit) => {
                return Err(Refusal::Malformed("content-length not a number"));
            }
            "content-length" => {
                length_fields += 1;
                put(&mut out, name, value);
            }
            _ => put(&mut out, name, value),
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
        put(&mut out, "host", h);
    }
    if !cookies.is_empty() {
        put(&mut out, "cookie", &cookies.join(&b"; "[..]));
    }
    if length_fields > 1 {
        return Err(Refusal::Malformed("content-length twice"));
    }
    // §8.1.1: a content-length that the DATA frames (here: none) do not add up to. The crate
    // refuses it too; the translation must not depend on that.
    if ended
        && parts
            .headers
            .get("content-length")
            .is_some_and(|v| v.as_bytes().iter().any(|&b| b != b'0'))
    {
        return Err(Refusal::Malformed("content-length without DATA"));
    }
    let mode = if ended {
        BodyMode::None
    } else if length_fields == 1 {
        BodyMode::Length
    } else {
        put(&mut out, "transfer-encoding", b"chunked");
        BodyMode::Chunked
    };
    out.extend_from_slice(b"\r\n");
    Ok((out, mode))
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

fn put(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
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

    fn parts(method: &str, uri: &str, fields: &[(&str, &[u8])]) -> Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (n, v) in fields {
            b = b.header(*n, http::HeaderValue::from_bytes(v).expect("value"));
        }
        b.body(()).expect("request").into_parts().0
    }

    fn h1(p: &Parts, ended: bool) -> String {
        let (head, _) = to_h1(p, ended).expect("translated");
        String::from_utf8(head).expect("utf8")
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
        assert_eq!(to_h1(&p, true).expect("ok").1, BodyMode::None);
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
    }

    #[test]
    fn a_body_without_length_is_chunked_on_the_pipe_and_with_one_keeps_it() {
        let p = parts("POST", "https://a.example/u", &[]);
        let (head, mode) = to_h1(&p, false).expect("ok");
        assert_eq!(mode, BodyMode::Chunked);
        assert!(
            String::from_utf8(head)
                .expect("utf8")
                .ends_with("transfer-encoding: chunked\r\n\r\n")
        );
        let p = parts("POST", "https://a.example/u", &[("content-length", b"5")]);
        let (head, mode) = to_h1(&p, false).expect("ok");
        assert_eq!(mode, BodyMode::Length);
        assert_eq!(
            String::from_utf8(head).expect("utf8"),
            "POST /u HTTP/1.1\r\ncontent-length: 5\r\nhost: a.example\r\n\r\n"
        );
    }

    #[test]
    fn host_alone_is_used_and_must_agree_with_authority() {
        let p = parts("GET", "/x", &[("host", b"b.example")]);
        assert_eq!(h1(&p, true), "GET /x HTTP/1.1\r\nhost: b.example\r\n\r\n");
        let p = parts("GET", "https://a.example/x", &[("host", b"A.example")]);
        assert_eq!(h1(&p, true), "GET /x HTTP/1.1\r\nhost: a.example\r\n\r\n");
        let p = parts("GET", "https://a.example/x", &[("host", b"evil.example")]);
        assert_eq!(
            to_h1(&p, true),
            Err(Refusal::Malformed(":authority and host differ"))
        );
        let p = parts(
            "GET",
            "/x",
            &[("host", b"a.example"), ("host", b"evil.example")],
        );
        assert_eq!(to_h1(&p, true), Err(Refusal::Malformed("host twice")));
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
                to_h1(&p, false),
                Err(Refusal::Malformed("connection-specific field")),
                "{n}"
            );
        }
        let p = parts("GET", "https://a.example/", &[("te", b"gzip")]);
        assert_eq!(
            to_h1(&p, true),
            Err(Refusal::Malformed("te other than trailers"))
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
            to_h1(&p, false),
            Err(Refusal::Malformed("content-length twice"))
        );
        // The fuzz target's find: a length announced on a stream its HEADERS ended.
        let p = parts(
            "PUT",
            "/u",
            &[("host", b"b.example"), ("content-length", b"12")],
        );
        assert_eq!(
            to_h1(&p, true),
            Err(Refusal::Malformed("content-length without DATA"))
        );
        // And a list, a sign, an empty value: not a length (the fuzz target's second find).
        for bad in [&b"000,0"[..], b"0,0", b"+5", b"", b"0x10"] {
            let p = parts(
                "PUT",
                "/u",
                &[("host", b"b.example"), ("content-length", bad)],
            );
            assert_eq!(
                to_h1(&p, false),
                Err(Refusal::Malformed("content-length not a number")),
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
                to_h1(&p, true),
                Err(Refusal::Malformed("whitespace at the end of a field value"))
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
            to_h1(&p, true),
            Err(Refusal::Malformed(":path is not origin-form"))
        );
        let p = parts("CONNECT", "a.example:443", &[]);
        assert_eq!(
            to_h1(&p, true),
            Err(Refusal::Status(405, "CONNECT over HTTP/2"))
        );
        let p = parts("GET", "https://u:p@a.example/", &[]);
        assert_eq!(
            to_h1(&p, true),
            Err(Refusal::Malformed(":authority has userinfo"))
        );
    }
}
