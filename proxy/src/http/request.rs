//! Request heads: parsing with httparse, the limits that earn 400/414/431, and the message-framing
//! checks of RFC 9112 §6.3 that stop request smuggling.

use super::framing::{self, Coding, FramingError};
use super::headers::Field;
use super::request_line::{
    Version, bare_cr_or_lf, first_line_len, request_line_version, split_target,
};

/// A parsed request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Method, as sent.
    pub method: String,
    /// Request target, normalised (see [`super::target`]); absolute-form is reduced to its path.
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
    /// The request id (`logging.request_id_header`), assigned by the connection before routing;
    /// empty until then. See [`crate::request_id`].
    pub id: String,
    /// It came in on the TLS listener: `https` in its cache key and in the `X-Forwarded-Proto`
    /// and `Forwarded: proto=` sent upstream.
    pub tls: bool,
    /// It came on an HTTP/2 stream (see `server/h2`), its fields converted into this head: the
    /// access log says `HTTP/2.0` and the upstream request's `Via` says `2`.
    pub h2: bool,
    /// The protocols an `Upgrade` field named by `Connection` asked for (trimmed, non-empty).
    /// Hop-by-hop, so it is not among `fields`; only an Upgrade tunnel (`routes[].upgrade`)
    /// forwards it.
    pub upgrade: Option<String>,
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
    /// The end of an HTTP/2 stream: DATA frames without a `content-length` (RFC 9113 §8.1).
    /// Forwarded upstream chunked.
    EndStream,
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
    /// A major HTTP version other than 1.
    #[error("unsupported HTTP version")]
    Version,
    /// A transfer coding the proxy does not implement (RFC 9112 §6.1).
    #[error("unsupported transfer coding: {0}")]
    Unsupported(&'static str),
}

impl RequestError {
    /// Status code and reason phrase of the error response.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            RequestError::Malformed(_) | RequestError::Framing(_) => (400, "Bad Request"),
            RequestError::HeadTooLarge => (431, "Request Header Fields Too Large"),
            RequestError::UriTooLong => (414, "URI Too Long"),
            RequestError::Version => (505, "HTTP Version Not Supported"),
            RequestError::Unsupported(_) => (501, "Not Implemented"),
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
    /// How backslashes and path parameters are treated.
    pub path: super::target::PathRules,
}

/// Most header fields accepted in one request.
const MAX_FIELDS: usize = 128;

/// Tries to parse a request head from the start of `buf`. `Ok(None)`: incomplete, read more.
pub fn parse(buf: &[u8], limits: Limits) -> Result<Option<(RequestHead, usize)>, RequestError> {
    let rewritten: Vec<u8>;
    let input: &[u8] = match request_line_version(buf)? {
        Version::Plain => buf,
        Version::LaterMinor(at) => {
            let mut v = buf.to_vec();
            v[at] = b'1';
            rewritten = v;
            &rewritten
        }
    };
    let mut storage = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut storage);
    let status = match req.parse(input) {
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
    if bare_cr_or_lf(&input[..consumed]) {
        return Err(RequestError::Malformed("bare CR or LF in head".into()));
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
    Ok(Some((
        from_parts(method, raw_target, http10, fields, limits)?,
        consumed,
    )))
}

/// The request head of a method, a target as sent, a version and the fields in order: the
/// checks and normalisation every request gets, whichever protocol carried it. An HTTP/1.1 head
/// comes here from [`parse`]; an HTTP/2 one field by field from `server::h2::request`, so the
/// two are one grammar past their framing, and nothing reaches routing, the cache key or an
/// origin that an HTTP/1.1 client could not have sent.
pub(crate) fn from_parts(
    method: String,
    raw_target: &str,
    http10: bool,
    mut fields: Vec<Field>,
    limits: Limits,
) -> Result<RequestHead, RequestError> {
    if raw_target.len() > limits.max_uri {
        return Err(RequestError::UriTooLong);
    }
    // Field names with `_` are dropped, as nginx's `underscores_in_headers off` does: CGI-style
    // origins map `X_Forwarded_Host` and `X-Forwarded-Host` to the same variable, so forwarding
    // the one the proxy doesn't know would let a client set the one it strips.
    fields.retain(|(k, _)| !k.contains('_'));
    let (target, target_host) = split_target(&method, raw_target, limits.path)?;
    let Message {
        host_field,
        host_fields,
        close,
        expect_continue,
    } = message_fields(&fields, http10)?;
    let body = body_framing(&fields, http10)?;
    if host_fields > 1 {
        return Err(RequestError::Malformed("more than one Host field".into()));
    }
    if host_fields == 0 && !http10 {
        return Err(RequestError::Malformed("missing Host".into()));
    }
    // RFC 9112 §3.2.2: the target's authority wins over Host; routing, the key and the Host sent
    // upstream all use the one chosen here.
    let host = target_host.or(host_field).unwrap_or_default();
    if host.is_empty() && !http10 {
        return Err(RequestError::Malformed("empty Host".into()));
    }
    // Fields a `Connection` option names are hop-by-hop (RFC 9110 §7.6.1): removed here, once,
    // so that the key, Vary, bypass rules, conditionals and the upstream request all see the
    // same request.
    let nominated =
        super::headers::connection_tokens(fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
    let upgrade = if nominated.iter().any(|t| t == "upgrade") {
        super::headers::joined(&fields, "upgrade")
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
    } else {
        None
    };
    if !nominated.is_empty() {
        fields.retain(|(k, _)| {
            k.eq_ignore_ascii_case("connection")
                || !nominated.iter().any(|t| k.eq_ignore_ascii_case(t))
        });
    }
    Ok(RequestHead {
        method,
        target,
        host,
        http10,
        fields,
        body,
        close,
        expect_continue,
        id: String::new(),
        tls: false,
        h2: false,
        upgrade,
    })
}

/// What the fields say of the message itself: its `Host` (and how many there were), whether the
/// connection closes after it, and whether the client waits for `100 Continue`.
struct Message {
    host_field: Option<String>,
    host_fields: usize,
    close: bool,
    expect_continue: bool,
}

fn message_fields(fields: &[Field], http10: bool) -> Result<Message, RequestError> {
    let mut host_field: Option<String> = None;
    let mut host_fields = 0;
    let mut close = http10;
    let mut expect_continue = false;
    for (name, value) in fields {
        let v = std::str::from_utf8(value)
            .map_err(|_| RequestError::Malformed("non-UTF-8 field".into()));
        if name.eq_ignore_ascii_case("host") {
            host_fields += 1;
            let h = super::target::authority(v?, "80")
                .map_err(|e| RequestError::Malformed(format!("Host: {}", e.0)))?;
            host_field = Some(h);
        } else if name.eq_ignore_ascii_case("connection") {
            let v = v?.to_ascii_lowercase();
            for t in v.split(',').map(|t| t.trim_matches([' ', '\t'])) {
                if t == "close" {
                    close = true;
                } else if t == "keep-alive" && http10 {
                    close = false;
                }
            }
        } else if name.eq_ignore_ascii_case("expect")
            && v?
                .trim_matches([' ', '\t'])
                .eq_ignore_ascii_case("100-continue")
        {
            expect_continue = !http10;
        }
    }
    Ok(Message {
        host_field,
        host_fields,
        close,
        expect_continue,
    })
}

/// How the request's body is delimited (RFC 9112 §6): `Content-Length`, chunked, or none; an
/// ambiguous or unknowable framing is refused.
fn body_framing(fields: &[Field], http10: bool) -> Result<BodyFraming, RequestError> {
    let values = |n: &'static str| {
        fields
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.as_slice())
    };
    let content_length = framing::content_length(values("content-length"))?;
    let coding = framing::transfer_coding(values("transfer-encoding"))?;
    if coding != Coding::Absent && content_length.is_some() {
        return Err(RequestError::Framing(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    if coding != Coding::Absent && http10 {
        return Err(RequestError::Framing("Transfer-Encoding in HTTP/1.0"));
    }
    if coding == Coding::NotChunked {
        // RFC 9112 §6.3: a request whose final coding isn't chunked has no knowable length.
        return Err(RequestError::Framing(
            "Transfer-Encoding without final chunked",
        ));
    }
    Ok(if coding == Coding::Chunked {
        BodyFraming::Chunked
    } else {
        match content_length {
            Some(0) | None => BodyFraming::None,
            Some(n) => BodyFraming::Length(n),
        }
    })
}

impl From<FramingError> for RequestError {
    fn from(e: FramingError) -> RequestError {
        match e {
            FramingError::Invalid(why) => RequestError::Framing(why),
            FramingError::Unsupported(why) => RequestError::Unsupported(why),
        }
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
        super::target::path_of(&self.target)
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
            path: super::target::PathRules::SAFE,
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
        path: crate::http::target::PathRules::SAFE,
    };

    fn parse_ok(s: &str) -> RequestHead {
        parse(s.as_bytes(), L).expect("parses").expect("complete").0
    }

    /// An `Upgrade` named by `Connection` is kept aside (it is hop-by-hop, so not among the
    /// fields); one not named, or empty, asks for nothing.
    #[test]
    fn an_upgrade_named_by_connection_is_kept_aside() {
        let r = parse_ok(
            "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\r\n",
        );
        assert_eq!(r.upgrade.as_deref(), Some("websocket"));
        assert_eq!(r.field("upgrade"), None);
        for head in [
            "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade:  \r\nConnection: upgrade\r\n\r\n",
            "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n",
        ] {
            assert_eq!(parse_ok(head).upgrade, None, "{head:?}");
        }
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
    fn versions_are_checked_before_httparse() {
        let r = parse_ok("GET / HTTP/1.2\r\nHost: a\r\n\r\n");
        assert!(!r.http10);
        for (line, status) in [
            ("GET / HTTP/2.0", 505),
            ("GET / HTTP/0.9", 505),
            ("GET / http/1.1", 400),
            ("GET / HTTP/1.10", 400),
            ("GET / HTTP/1", 400),
        ] {
            let s = format!("{line}\r\nHost: a\r\n\r\n");
            assert_eq!(
                parse(s.as_bytes(), L).expect_err(line).status().0,
                status,
                "{line}"
            );
        }
    }

    #[test]
    fn one_identity_per_request() {
        // The target's authority wins over Host, and userinfo is refused.
        let r = parse_ok("GET http://victim.example/x HTTP/1.1\r\nHost: attacker.example\r\n\r\n");
        assert_eq!(
            (r.host.as_str(), r.target.as_str()),
            ("victim.example", "/x")
        );
        for bad in [
            "GET http://victim.example@attacker.example/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.example|/pipe\r\n\r\n",
            "GET / HTTP/1.1\nHost: a\n\n",
            "GET / HTTP/1.1\r\nHost: a\nX: 1\r\n\r\n",
            "GET /a/..\\b HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert_eq!(
                parse(bad.as_bytes(), L).expect_err(bad).status().0,
                400,
                "{bad:?}"
            );
        }
        // Fields a Connection option names, and names with `_`, are gone before anyone looks.
        let r = parse_ok(
            "GET /a/%2e%2e/b HTTP/1.1\r\nHost: a\r\nAccept-Language: de\r\nX_Y: 1\r\nConnection: close, Accept-Language\r\n\r\n",
        );
        assert_eq!(r.target, "/b");
        assert_eq!(r.field("accept-language"), None);
        assert_eq!(r.fields.iter().filter(|(k, _)| k.contains('_')).count(), 0);
        assert!(r.close);
        let e = parse(
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            L,
        )
        .expect_err("coding before chunked");
        assert_eq!(e.status().0, 501);
        let e = parse(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
            L,
        )
        .expect_err("signed length");
        assert_eq!(e.status().0, 400);
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
