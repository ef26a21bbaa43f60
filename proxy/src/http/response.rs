//! Upstream response heads: parsing, body framing (RFC 9112 §6.3), and the client-facing head the
//! proxy writes.

use super::framing::{self, Coding, FramingError};
use super::headers::Field;

/// A parsed response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Reason phrase, as received.
    pub reason: String,
    /// HTTP/1.0 response.
    pub http10: bool,
    /// Header fields in order.
    pub fields: Vec<Field>,
}

/// How an upstream response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

impl BodyFraming {
    /// The body length, when the framing says it in advance.
    pub fn length(self) -> Option<u64> {
        match self {
            BodyFraming::None => Some(0),
            BodyFraming::Length(n) => Some(n),
            BodyFraming::Chunked | BodyFraming::Close => None,
        }
    }
}

/// Parses a response head from the start of `buf`; `Ok(None)` means incomplete. A head with a
/// bare CR or LF is an error, as in a request (`request_line::bare_cr_or_lf`): httparse takes a
/// bare LF as a line end, a downstream cache may not, and the two would read different responses.
pub fn parse(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, String> {
    let mut storage = [httparse::EMPTY_HEADER; 128];
    let mut res = httparse::Response::new(&mut storage);
    match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) if super::request_line::bare_cr_or_lf(&buf[..n]) => {
            Err("bare CR or LF in the response head".into())
        }
        Ok(httparse::Status::Complete(n)) => Ok(Some((
            ResponseHead {
                status: res.code.unwrap_or(0),
                reason: res.reason.unwrap_or("").to_string(),
                http10: res.version == Some(0),
                fields: res
                    .headers
                    .iter()
                    .map(|h| (h.name.to_string(), h.value.to_vec()))
                    .collect(),
            },
            n,
        ))),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl ResponseHead {
    /// The first value of `name` (case-insensitive), as text.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Every value of `name`, comma-joined as RFC 9110 §5.3 allows.
    pub fn joined(&self, name: &str) -> Option<String> {
        super::headers::joined(&self.fields, name)
    }

    /// This head with its fields replaced by a stored `Name: value\r\n` block.
    pub fn with_stored_fields(mut self, block: &[u8]) -> ResponseHead {
        self.fields = super::stored_fields::StoredFields(block)
            .lines()
            .map(|l| (l.name.to_string(), l.value.to_vec()))
            .collect();
        self
    }

    /// The body framing, or why the response cannot be trusted (answered 502, never stored).
    /// The framing fields follow their exact grammar ([`framing`]): a malformed or contradictory
    /// Content-Length or Transfer-Encoding, or a transfer coding other than chunked before a final
    /// chunked (which the proxy cannot decode), is an error whatever the status.
    pub fn framing(&self, request_was_head: bool) -> Result<BodyFraming, &'static str> {
        let values = |name: &'static str| {
            self.fields
                .iter()
                .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_slice())
        };
        let content_length =
            framing::content_length(values("content-length")).map_err(FramingError::reason)?;
        let coding =
            framing::transfer_coding(values("transfer-encoding")).map_err(FramingError::reason)?;
        if coding != Coding::Absent && content_length.is_some() {
            return Err("both Content-Length and Transfer-Encoding");
        }
        if coding != Coding::Absent && self.http10 {
            // RFC 9112 §6.1: HTTP/1.0 has no transfer codings, so such framing is faulty.
            return Err("Transfer-Encoding in an HTTP/1.0 response");
        }
        if request_was_head || self.status < 200 || self.status == 204 || self.status == 304 {
            return Ok(BodyFraming::None);
        }
        Ok(match (coding, content_length) {
            (Coding::Chunked, _) => BodyFraming::Chunked,
            (Coding::NotChunked, _) => BodyFraming::Close,
            (Coding::Absent, Some(n)) => BodyFraming::Length(n),
            (Coding::Absent, None) => BodyFraming::Close,
        })
    }
}

/// Standard reason phrase for the statuses the proxy itself produces.
pub fn reason(status: u16) -> &'static str {
    // Every status RFC 9110 §15 defines, with 103 (RFC 8297), 429 and 431 (RFC 6585) and 451
    // (RFC 7725): whatever zerocache answers itself, now or from an operator's rule, goes out
    // with its own phrase, never `Unknown`.
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// A parsed response for unit tests elsewhere: `HTTP/1.1 STATUS X`, then `extra`.
#[cfg(test)]
pub fn test_response(status: u16, extra: &str) -> ResponseHead {
    let s = format!("HTTP/1.1 {status} X\r\n{extra}\r\n");
    parse(s.as_bytes())
        .expect("valid test response")
        .expect("complete test response")
        .0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused PURGE went out as `403 Unknown`: every status the proxy answers itself, and
    /// every one RFC 9110 defines, has its phrase.
    #[test]
    fn every_defined_status_has_its_reason_phrase() {
        let defined = [
            100, 101, 103, 200, 201, 202, 203, 204, 205, 206, 300, 301, 302, 303, 304, 305, 307,
            308, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415,
            416, 417, 421, 422, 426, 428, 429, 431, 451, 500, 501, 502, 503, 504, 505,
        ];
        for s in defined {
            assert_ne!(reason(s), "Unknown", "{s}");
        }
        assert_eq!(
            [reason(301), reason(403), reason(429), reason(308)],
            [
                "Moved Permanently",
                "Forbidden",
                "Too Many Requests",
                "Permanent Redirect"
            ]
        );
        assert_eq!(reason(299), "Unknown");
    }

    #[test]
    fn a_bare_lf_or_cr_in_a_response_head_is_an_error() {
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_ok());
        for bad in [
            &b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok",
            b"HTTP/1.1 200 OK\r\nX-A: 1\rX-B: 2\r\nContent-Length: 2\r\n\r\nok",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    fn head(s: &str) -> ResponseHead {
        parse(s.as_bytes()).expect("ok").expect("complete").0
    }

    #[test]
    fn framing_follows_rfc9112() {
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").framing(false),
            Ok(BodyFraming::Length(5))
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").framing(false),
            Ok(BodyFraming::Chunked)
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").framing(false),
            Ok(BodyFraming::Close)
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\n\r\n").framing(false),
            Ok(BodyFraming::Close)
        );
        assert_eq!(
            head("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n").framing(false),
            Ok(BodyFraming::None)
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").framing(true),
            Ok(BodyFraming::None)
        );
        assert!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
                .framing(false)
                .is_err()
        );
        assert!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
                .framing(false)
                .is_err()
        );
    }

    /// The response head with `fields` (raw bytes, so non-ASCII can be sent) after the status line.
    fn raw(status: u16, fields: &[u8]) -> ResponseHead {
        let mut wire = format!("HTTP/1.1 {status} OK\r\n").into_bytes();
        wire.extend_from_slice(fields);
        wire.extend_from_slice(b"\r\n");
        parse(&wire).expect("parses").expect("complete").0
    }

    #[test]
    fn framing_grammar_is_exact() {
        for (fields, want) in [
            (&b"Content-Length: 5\r\n"[..], BodyFraming::Length(5)),
            (b"Content-Length: 005\r\n", BodyFraming::Length(5)),
            (b"Content-Length: 5, 5\r\n", BodyFraming::Length(5)),
            (
                b"Content-Length: 5\r\nContent-Length: 5\r\n",
                BodyFraming::Length(5),
            ),
            (b"Transfer-Encoding: Chunked\r\n", BodyFraming::Chunked),
            (b"Transfer-Encoding: gzip, deflate\r\n", BodyFraming::Close),
        ] {
            assert_eq!(raw(200, fields).framing(false), Ok(want), "{fields:?}");
        }
        for (fields, why) in [
            (&b"Content-Length: +5\r\n"[..], "invalid Content-Length"),
            (b"Content-Length: 5, +5\r\n", "invalid Content-Length"),
            (b"Content-Length: -1\r\n", "invalid Content-Length"),
            (b"Content-Length: 5\xc2\xa0\r\n", "invalid Content-Length"),
            (b"Content-Length: \xc2\xa05\r\n", "invalid Content-Length"),
            (b"Content-Length: 0x5\r\n", "invalid Content-Length"),
            (b"Content-Length: 5,\r\n", "empty Content-Length element"),
            (
                b"Content-Length: 99999999999999999999999\r\n",
                "Content-Length too large",
            ),
            (
                b"Content-Length: 5, 6\r\n",
                "differing Content-Length values",
            ),
            (
                b"Transfer-Encoding: chunked\xc2\xa0\r\n",
                "invalid Transfer-Encoding",
            ),
            (
                b"Transfer-Encoding: gzip, chunked\r\n",
                "transfer coding other than chunked",
            ),
            (
                b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
                "transfer coding other than chunked",
            ),
            (
                b"Transfer-Encoding: chunked, chunked\r\n",
                "chunked applied more than once",
            ),
            (
                b"Transfer-Encoding: chunked, gzip\r\n",
                "chunked is not the final transfer coding",
            ),
            (
                b"Transfer-Encoding: chunked;x=1\r\n",
                "chunked with parameters",
            ),
            (b"Transfer-Encoding:\r\n", "empty Transfer-Encoding element"),
            (
                b"Transfer-Encoding: gzip\r\nContent-Length: 5\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
        ] {
            assert_eq!(raw(200, fields).framing(false), Err(why), "{fields:?}");
        }
        // Bodiless responses get no pass for malformed framing fields either.
        assert_eq!(
            raw(304, b"Content-Length: +5\r\n").framing(false),
            Err("invalid Content-Length")
        );
        assert_eq!(
            raw(200, b"Transfer-Encoding: gzip, chunked\r\n").framing(true),
            Err("transfer coding other than chunked")
        );
        let old = parse(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .expect("parses")
            .expect("complete")
            .0;
        assert_eq!(
            old.framing(false),
            Err("Transfer-Encoding in an HTTP/1.0 response")
        );
    }
}
