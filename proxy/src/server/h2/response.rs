//! The HTTP/1.1 response the request path wrote for a stream, made an HTTP/2 response head:
//! connection-specific fields dropped (RFC 9113 §8.2.2; HTTP/2 frames its own body), and the
//! body's framing read from the head, so the stream ends exactly where the response does.

use crate::http::response::ResponseHead;

/// How the translated response's body is delimited on the pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body: HEAD, 1xx, 204, 304.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked: decoded, and the stream ends with the last chunk.
    Chunked,
}

/// Fields HTTP/2 forbids in a response, beside any that `Connection` names.
const DROPPED: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// The HTTP/2 head of `head` (the answer to a HEAD request when `head_request`), and its body's
/// framing. A head that cannot be carried (a bad field, a close-delimited body, which the
/// request path never writes to an HTTP/1.1 request) is an error: the stream is reset.
pub(crate) fn to_h2(
    head: &ResponseHead,
    head_request: bool,
) -> Result<(http::Response<()>, Framing), String> {
    let status = http::StatusCode::from_u16(head.status).map_err(|e| e.to_string())?;
    let named: Vec<String> = head
        .fields
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    // Sized once: growing a map rehashes it, and a hit's head has a dozen fields.
    let mut headers = http::HeaderMap::with_capacity(head.fields.len());
    let mut chunked = false;
    let mut length = None;
    for (k, v) in &head.fields {
        // Lower-cased by the parse, without an allocation for the fields it knows.
        let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
        let lower = name.as_str();
        if lower == "transfer-encoding" {
            chunked = true;
        }
        if DROPPED.contains(&lower) || named.iter().any(|n| n == lower) {
            continue;
        }
        if lower == "content-length" {
            length = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
        }
        let value = http::HeaderValue::from_bytes(v).map_err(|e| e.to_string())?;
        headers.append(name, value);
    }
    let mut r = http::Response::new(());
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    let framing = if head_request || matches!(head.status, 100..=199 | 204 | 304) {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        return Err("a close-delimited response".into());
    };
    Ok((r, framing))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, fields: &[(&str, &str)]) -> ResponseHead {
        ResponseHead {
            status,
            reason: String::new(),
            http10: false,
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn connection_fields_go_and_the_rest_stays_in_order() {
        let h = head(
            200,
            &[
                ("Content-Length", "5"),
                ("Connection", "close, X-Hop"),
                ("X-Hop", "1"),
                ("Keep-Alive", "timeout=5"),
                ("X-Cache", "HIT"),
                ("Set-Cookie", "a=1"),
                ("Set-Cookie", "b=2"),
            ],
        );
        let (r, f) = to_h2(&h, false).expect("ok");
        assert_eq!(f, Framing::Length(5));
        let got: Vec<(String, String)> = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().expect("ascii").to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("content-length", "5"),
                ("x-cache", "HIT"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
    }

    #[test]
    fn framing_follows_the_head_and_the_request() {
        let chunked = head(200, &[("Transfer-Encoding", "chunked")]);
        let (r, f) = to_h2(&chunked, false).expect("ok");
        assert_eq!(f, Framing::Chunked);
        assert!(r.headers().get("transfer-encoding").is_none());
        let sized = head(200, &[("Content-Length", "10")]);
        assert_eq!(to_h2(&sized, true).expect("ok").1, Framing::None);
        assert_eq!(to_h2(&head(304, &[]), false).expect("ok").1, Framing::None);
        assert_eq!(to_h2(&head(204, &[]), false).expect("ok").1, Framing::None);
        assert_eq!(
            to_h2(&head(200, &[]), false).map(|r| r.1),
            Err("a close-delimited response".to_string())
        );
    }
}
