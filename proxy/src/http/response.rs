//! Upstream response heads: parsing, body framing (RFC 9112 §6.3), and the client-facing head the
//! proxy writes.

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

/// Parses a response head from the start of `buf`; `Ok(None)` means incomplete.
pub fn parse(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, String> {
    let mut storage = [httparse::EMPTY_HEADER; 128];
    let mut res = httparse::Response::new(&mut storage);
    match res.parse(buf) {
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
        self.fields = block
            .split(|b| *b == b'\n')
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|b| *b == b':')?;
                let name = String::from_utf8_lossy(&line[..colon]).trim().to_string();
                let value = line[colon + 1..].trim_ascii().to_vec();
                Some((name, value))
            })
            .collect();
        self
    }

    /// The body framing, or why the response cannot be trusted (answered 502, never stored).
    pub fn framing(&self, request_was_head: bool) -> Result<BodyFraming, &'static str> {
        let mut content_length: Option<u64> = None;
        let mut te = false;
        let mut chunked = false;
        for (name, value) in &self.fields {
            if name.eq_ignore_ascii_case("content-length") {
                let v = std::str::from_utf8(value).map_err(|_| "invalid Content-Length")?;
                for part in v.split(',') {
                    let n: u64 = part.trim().parse().map_err(|_| "invalid Content-Length")?;
                    if content_length.is_some_and(|c| c != n) {
                        return Err("differing Content-Length values");
                    }
                    content_length = Some(n);
                }
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                te = true;
                let v = String::from_utf8_lossy(value).to_ascii_lowercase();
                chunked = v.split(',').map(str::trim).rfind(|s| !s.is_empty()) == Some("chunked");
            }
        }
        if te && content_length.is_some() {
            return Err("both Content-Length and Transfer-Encoding");
        }
        if request_was_head || self.status < 200 || self.status == 204 || self.status == 304 {
            return Ok(BodyFraming::None);
        }
        Ok(if te {
            if chunked {
                BodyFraming::Chunked
            } else {
                BodyFraming::Close
            }
        } else {
            match content_length {
                Some(n) => BodyFraming::Length(n),
                None => BodyFraming::Close,
            }
        })
    }
}

/// Standard reason phrase for the statuses the proxy itself produces.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Content Too Large",
        414 => "URI Too Long",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
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
            head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").framing(false),
            Ok(BodyFraming::Chunked)
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
}
