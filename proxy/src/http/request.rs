//! Request heads: parsing with httparse, the limits that earn 400/414/431, and the message-framing
//! checks of RFC 9112 §6.3 that stop request smuggling.

use super::headers::Field;

/// A parsed request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Method, as sent.
    pub method: String,
    /// Request target, as sent (origin-form; absolute-form is reduced to its path).
    pub target: String,
    /// Host from the `Host` field (or the absolute-form target), lower-cased, without the port
    /// when it is the default.
    pub host: String,
    /// HTTP/1.0 (true) or 1.1.
    pub http10: bool,
    /// Header fields in order.
    pub fields: Vec<Field>,
    /// How the body is framed.
    pub body: BodyFraming,
    /// The client asked to close after this exchange (or is HTTP/1.0 without keep-alive).
    pub close: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
}

/// How a request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// Why a request head was rejected, with the status it earns. All of them close the connection:
/// once framing is in doubt, nothing after it on the connection can be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Malformed request line or header.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// Head larger than the limit.
    #[error("request header fields too large")]
    HeadTooLarge,
    /// Target longer than the limit.
    #[error("request target too long")]
    UriTooLong,
    /// Ambiguous framing (smuggling attempt or broken client).
    #[error("ambiguous message framing: {0}")]
    Framing(&'static str),
    /// An HTTP version other than 1.0 and 1.1.
    #[error("unsupported HTTP version")]
    Version,
}

impl RequestError {
    /// Status code and reason phrase of the error response.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            RequestError::Malformed(_) | RequestError::Framing(_) => (400, "Bad Request"),
            RequestError::HeadTooLarge => (431, "Request Header Fields Too Large"),
            RequestError::UriTooLong => (414, "URI Too Long"),
            RequestError::Version => (505, "HTTP Version Not Supported"),
        }
    }
}

/// Limits applied while parsing.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest head in bytes.
    pub max_head: usize,
    /// Longest target in bytes.
    pub max_uri: usize,
}

/// Most header fields accepted in one request.
const MAX_FIELDS: usize = 128;

/// Tries to parse a request head from the start of `buf`. `Ok(None)`: incomplete, read more.
pub fn parse(buf: &[u8], limits: Limits) -> Result<Option<(RequestHead, usize)>, RequestError> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut storage);
    let status = match req.parse(buf) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::HeadTooLarge),
        Err(e) => {
            // A long target in a still-incomplete line deserves 414, not 400.
            if e == httparse::Error::Token && first_line_len(buf) > limits.max_uri {
                return Err(RequestError::UriTooLong);
            }
            return Err(RequestError::Malformed(e.to_string()));
        }
    };
    let consumed = match status {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => {
            if first_line_len(buf) > limits.max_uri + 32 {
                return Err(RequestError::UriTooLong);
            }
            if buf.len() > limits.max_head {
                return Err(RequestError::HeadTooLarge);
            }
            return Ok(None);
        }
    };
    if consumed > limits.max_head {
        return Err(RequestError::HeadTooLarge);
    }
    let method = req.method.unwrap_or_default().to_string();
    let raw_target = req.path.unwrap_or_default();
    if raw_target.len() > limits.max_uri {
        return Err(RequestError::UriTooLong);
    }
    let http10 = match req.version {
        Some(0) => true,
        Some(1) => false,
        _ => return Err(RequestError::Version),
    };
    let fields: Vec<Field> = req
        .headers
        .iter()
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect();
    let (target, target_host) = split_target(raw_target)?;
    let mut host: Option<String> = target_host;
    let mut host_fields = 0;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut close = http10;
    let mut expect_continue = false;
    for (name, value) in &fields {
        let v = std::str::from_utf8(value)
            .map_err(|_| RequestError::Malformed("non-UTF-8 field".into()));
        if name.eq_ignore_ascii_case("host") {
            host_fields += 1;
            if host.is_none() {
                host = Some(normalise_host(v?.trim()));
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            for part in v?.split(',') {
                let n: u64 = part
                    .trim()
                    .parse()
                    .map_err(|_| RequestError::Framing("invalid Content-Length"))?;
                if content_length.is_some_and(|c| c != n) {
                    return Err(RequestError::Framing("differing Content-Length values"));
                }
                content_length = Some(n);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
            let v = v?.to_ascii_lowercase();
            let last = v.split(',').map(str::trim).rfind(|s| !s.is_empty());
            chunked = last == Some("chunked");
            if !chunked {
                return Err(RequestError::Framing(
                    "Transfer-Encoding without final chunked",
                ));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            let v = v?.to_ascii_lowercase();
            for t in v.split(',').map(str::trim) {
                if t == "close" {
                    close = true;
                } else if t == "keep-alive" && http10 {
                    close = false;
                }
            }
        } else if name.eq_ignore_ascii_case("expect")
            && v?.trim().eq_ignore_ascii_case("100-continue")
        {
            expect_continue = !http10;
        }
    }
    if transfer_encoding && content_length.is_some() {
        return Err(RequestError::Framing(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    if transfer_encoding && http10 {
        return Err(RequestError::Framing("Transfer-Encoding in HTTP/1.0"));
    }
    if host_fields > 1 {
        return Err(RequestError::Malformed("more than one Host field".into()));
    }
    let host = match host {
        Some(h) if !h.is_empty() => h,
        _ if http10 => String::new(),
        _ => return Err(RequestError::Malformed("missing Host".into())),
    };
    let body = if chunked {
        BodyFraming::Chunked
    } else {
        match content_length {
            Some(0) | None => BodyFraming::None,
            Some(n) => BodyFraming::Length(n),
        }
    };
    Ok(Some((
        RequestHead {
            method,
            target,
            host,
            http10,
            fields,
            body,
            close,
            expect_continue,
        },
        consumed,
    )))
}

fn first_line_len(buf: &[u8]) -> usize {
    buf.iter().position(|b| *b == b'\n').unwrap_or(buf.len())
}

/// Origin-form targets pass through untouched; absolute-form (`http://host/path`) gives its host
/// and path; `*` (OPTIONS) passes.
fn split_target(t: &str) -> Result<(String, Option<String>), RequestError> {
    if t.starts_with('/') || t == "*" {
        return Ok((t.to_string(), None));
    }
    let lower = t.get(..8).map(str::to_ascii_lowercase).unwrap_or_default();
    let rest = if lower.starts_with("http://") {
        &t[7..]
    } else if lower.starts_with("https://") {
        &t[8..]
    } else {
        return Err(RequestError::Malformed(
            "request target is not origin- or absolute-form".into(),
        ));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    Ok((path, Some(normalise_host(authority))))
}

/// Lower-cases the host and drops a default port, so `Example.com:80` and `example.com` are one.
pub fn normalise_host(h: &str) -> String {
    let h = h.to_ascii_lowercase();
    match h.strip_suffix(":80") {
        Some(base) => base.to_string(),
        None => h,
    }
}

impl RequestHead {
    /// The first value of `name` (case-insensitive), as text.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Every value of `name`, comma-joined (a repeated list field is one list).
    pub fn joined(&self, name: &str) -> Option<String> {
        super::headers::joined(&self.fields, name)
    }

    /// The path part of the target (without the query).
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// A parsed request for unit tests elsewhere: `METHOD /x HTTP/1.1`, `Host: h`, then `extra`
/// (header lines, each ending in CRLF).
#[cfg(test)]
pub fn test_request(method: &str, extra: &str) -> RequestHead {
    let s = format!("{method} /x HTTP/1.1\r\nHost: h\r\n{extra}\r\n");
    parse(
        s.as_bytes(),
        Limits {
            max_head: 8192,
            max_uri: 8192,
        },
    )
    .expect("valid test request")
    .expect("complete test request")
    .0
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        max_head: 8192,
        max_uri: 1024,
    };

    fn parse_ok(s: &str) -> RequestHead {
        parse(s.as_bytes(), L).expect("parses").expect("complete").0
    }

    #[test]
    fn parses_a_simple_get() {
        let r = parse_ok("GET /a?b=1 HTTP/1.1\r\nHost: Example.COM:80\r\n\r\n");
        assert_eq!(
            (r.method.as_str(), r.target.as_str(), r.host.as_str()),
            ("GET", "/a?b=1", "example.com")
        );
        assert_eq!(r.body, BodyFraming::None);
        assert!(!r.close);
        assert_eq!(r.path(), "/a");
    }

    #[test]
    fn incomplete_heads_ask_for_more() {
        assert!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\n", L)
                .expect("ok")
                .is_none()
        );
    }

    #[test]
    fn smuggling_shapes_are_rejected() {
        let cases = [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
        ];
        for c in cases {
            let e = parse(c.as_bytes(), L).expect_err(c);
            assert_eq!(e.status().0, 400, "{c}");
        }
        let same = parse_ok(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        );
        assert_eq!(same.body, BodyFraming::Length(3));
    }

    #[test]
    fn limits_give_414_and_431() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(2000));
        assert_eq!(parse(long.as_bytes(), L).expect_err("long").status().0, 414);
        let big = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
            "b".repeat(9000)
        );
        assert_eq!(parse(big.as_bytes(), L).expect_err("big").status().0, 431);
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n\r\n", L)
                .expect_err("no host")
                .status()
                .0,
            400
        );
        assert_eq!(
            parse(b"GE T / HTTP/1.1\r\n\r\n", L)
                .expect_err("bad")
                .status()
                .0,
            400
        );
    }

    #[test]
    fn absolute_form_and_connection_handling() {
        let r = parse_ok(
            "GET http://Host.example:8080/x HTTP/1.1\r\nHost: other\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(
            (r.target.as_str(), r.host.as_str(), r.close),
            ("/x", "host.example:8080", true)
        );
        let r = parse_ok("GET / HTTP/1.0\r\n\r\n");
        assert!(r.close && r.http10);
        let r = parse_ok("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert!(!r.close);
        let r = parse_ok(
            "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        );
        assert!(r.expect_continue);
        assert_eq!(r.body, BodyFraming::Length(5));
    }
}
