//! The one writer of the response heads zerocache sends to clients: the status line, fields,
//! framing, the cache's own fields (`Age`, `X-Cache`, `Cache-Status`, `Via`), `Connection` and
//! the blank line, in that order, into the connection's reused buffer.
//!
//! Why one type: the same epilogue was written by hand in four places and `Cache-Status` spelled
//! in six, and a field one site forgot (or wrote twice) is a response that lies about itself. The
//! cache status is a typed value ([`CacheStatusField`]) rendered here, so every site says *what*
//! happened and this module alone says how it is spelled (RFC 9211). Writing allocates nothing:
//! numbers go in digit by digit, so a hit's head costs no allocation beyond its buffer's growth.
//! HTTP/2 will render the same calls as HEADERS fields instead of bytes.

use super::headers::{
    Field, VIA_SELF_LINE, connection_tokens, is_hop_by_hop, put, put_digits, put_num, via,
};
use super::response::reason;

/// How the body after a head is delimited, as the head announces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No framing field (a 304, a HEAD answered without one, or a body up to the close).
    None,
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// This cache's member of `Cache-Status` (RFC 9211 §2): `zerocache` and its parameters, always
/// in the order `hit` | `fwd`, `fwd-status`, `ttl`, `stored`, `collapsed`, `detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CacheStatusField<'a> {
    /// Served from the cache without going forward (`hit`).
    pub hit: bool,
    /// Why the request went forward (`fwd=miss`, `fwd=stale`, a bypass reason).
    pub fwd: Option<&'a str>,
    /// The status the forward got (`fwd-status=304` for a revalidation).
    pub fwd_status: Option<u16>,
    /// Freshness left, in seconds (negative once stale).
    pub ttl: Option<i64>,
    /// The response was stored.
    pub stored: bool,
    /// The request waited for another request's fill.
    pub collapsed: bool,
    /// A token saying more (`stale`, `coalesced`, why a response was not stored, `peer`).
    pub detail: Option<&'a str>,
}

impl<'a> CacheStatusField<'a> {
    /// `hit; ttl=N`.
    pub(crate) fn hit(ttl: i64) -> CacheStatusField<'a> {
        CacheStatusField {
            hit: true,
            ttl: Some(ttl),
            ..Default::default()
        }
    }

    /// `fwd=<why>`.
    pub(crate) fn fwd(why: &'a str) -> CacheStatusField<'a> {
        CacheStatusField {
            fwd: Some(why),
            ..Default::default()
        }
    }

    /// The same with `detail=<token>`.
    pub(crate) fn detail(self, token: &'a str) -> CacheStatusField<'a> {
        CacheStatusField {
            detail: Some(token),
            ..self
        }
    }

    /// Appends the member's text (no field name, no line end).
    pub(crate) fn render(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"zerocache");
        if self.hit {
            out.extend_from_slice(b"; hit");
        }
        if let Some(f) = self.fwd {
            out.extend_from_slice(b"; fwd=");
            out.extend_from_slice(f.as_bytes());
        }
        if let Some(s) = self.fwd_status {
            out.extend_from_slice(b"; fwd-status=");
            put_digits(out, u64::from(s));
        }
        if let Some(t) = self.ttl {
            out.extend_from_slice(b"; ttl=");
            if t < 0 {
                out.push(b'-');
            }
            put_digits(out, t.unsigned_abs());
        }
        if self.stored {
            out.extend_from_slice(b"; stored");
        }
        if self.collapsed {
            out.extend_from_slice(b"; collapsed");
        }
        if let Some(d) = self.detail {
            out.extend_from_slice(b"; detail=");
            out.extend_from_slice(d.as_bytes());
        }
    }
}

/// The two fields that say what the cache did: `X-Cache` (nginx's and Varnish's habit, one
/// token) and `Cache-Status` (RFC 9211).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheFields<'a> {
    /// `X-Cache`'s token (`zerocache_ledger::CacheStatus::as_str`, or a peer's as relayed).
    pub x_cache: &'a str,
    /// The `Cache-Status` members of caches nearer the origin, as received (a fleet peer's).
    pub upstream: Option<&'a str>,
    /// This cache's member; `None` writes no `Cache-Status` (nor relays `upstream`).
    pub member: Option<CacheStatusField<'a>>,
}

/// A response head being written into a buffer; [`Head::end`] finishes it.
pub(crate) struct Head<'b> {
    buf: &'b mut Vec<u8>,
}

impl<'b> Head<'b> {
    /// Clears `buf` and writes the status line `HTTP/1.1 <status> <reason>`.
    pub(crate) fn new(buf: &'b mut Vec<u8>, status: u16, reason: &str) -> Head<'b> {
        buf.clear();
        buf.extend_from_slice(b"HTTP/1.1 ");
        put_digits(buf, u64::from(status));
        buf.push(b' ');
        buf.extend_from_slice(reason.as_bytes());
        buf.extend_from_slice(b"\r\n");
        Head { buf }
    }

    /// The same with the standard reason phrase of `status`.
    pub(crate) fn standard(buf: &'b mut Vec<u8>, status: u16) -> Head<'b> {
        Head::new(buf, status, reason(status))
    }

    /// Clears `buf` and copies `prefix`: a status line and fields this type wrote before (an
    /// entry's prebuilt hit head), to be continued.
    pub(crate) fn resume(buf: &'b mut Vec<u8>, prefix: &[u8]) -> Head<'b> {
        debug_assert!(
            prefix.starts_with(b"HTTP/1.1 "),
            "not a head this type wrote"
        );
        buf.clear();
        buf.extend_from_slice(prefix);
        Head { buf }
    }

    /// `name: value`.
    pub(crate) fn field(&mut self, name: &str, value: &[u8]) -> &mut Self {
        put(self.buf, name, value);
        self
    }

    /// `name: n`, without allocating.
    pub(crate) fn num(&mut self, name: &str, n: u64) -> &mut Self {
        put_num(self.buf, name, n);
        self
    }

    /// The end-to-end fields of a received message, in order: every field but the hop-by-hop
    /// ones (the standard list and what its `Connection` names, RFC 9110 §7.6.1) and those
    /// `skip` names.
    pub(crate) fn end_to_end(
        &mut self,
        fields: &[Field],
        skip: impl Fn(&str) -> bool,
    ) -> &mut Self {
        let tokens = connection_tokens(fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        for (k, v) in fields {
            if !is_hop_by_hop(k, &tokens) && !skip(k) {
                put(self.buf, k, v);
            }
        }
        self
    }

    /// Header lines already in wire form (`Name: value\r\n` each), such as stored fields.
    pub(crate) fn lines(&mut self, block: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(block);
        self
    }

    /// The framing field.
    pub(crate) fn framing(&mut self, f: Framing) -> &mut Self {
        match f {
            Framing::None => {}
            Framing::Length(n) => {
                put_num(self.buf, "Content-Length", n);
            }
            Framing::Chunked => self
                .buf
                .extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        }
        self
    }

    /// `Age`, for a response served from the cache (RFC 9111 §5.1).
    pub(crate) fn age(&mut self, secs: u64) -> &mut Self {
        self.num("Age", secs)
    }

    /// `X-Cache` and `Cache-Status`.
    pub(crate) fn cache(&mut self, c: &CacheFields<'_>) -> &mut Self {
        self.buf.extend_from_slice(b"X-Cache: ");
        self.buf.extend_from_slice(c.x_cache.as_bytes());
        self.buf.extend_from_slice(b"\r\n");
        if let Some(m) = &c.member {
            self.buf.extend_from_slice(b"Cache-Status: ");
            if let Some(up) = c.upstream.filter(|u| !u.is_empty()) {
                self.buf.extend_from_slice(up.as_bytes());
                self.buf.extend_from_slice(b", ");
            }
            m.render(self.buf);
            self.buf.extend_from_slice(b"\r\n");
        }
        self
    }

    /// `Via` naming this proxy alone (a response it made or served from its cache).
    pub(crate) fn via_self(&mut self) -> &mut Self {
        self.buf.extend_from_slice(VIA_SELF_LINE);
        self
    }

    /// `Via` for a relayed response: the hops it `received` (its lines joined), then this proxy
    /// named by the version of the response it got (`http10`).
    pub(crate) fn via(&mut self, received: Option<&str>, http10: bool) -> &mut Self {
        put(self.buf, "Via", via(received, http10).as_bytes());
        self
    }

    /// `Connection: close` when `close`, and the blank line. Returns the head's length.
    pub(crate) fn end(self, close: bool) -> usize {
        if close {
            self.buf.extend_from_slice(b"Connection: close\r\n");
        }
        self.buf.extend_from_slice(b"\r\n");
        self.buf.len()
    }
}

/// A small complete response with a text body, for the proxy's own answers: the head (with
/// `extra` fields, cache fields if any, `Via` when `via`), then `body`.
pub(crate) fn text_response(
    buf: &mut Vec<u8>,
    status: u16,
    extra: &[(&str, &str)],
    cache: Option<&CacheFields<'_>>,
    close: bool,
    body: &[u8],
) {
    typed_response(buf, status, "text/plain", extra, cache, close, body)
}

/// [`text_response`] with a body of `content_type` (the `PURGE` method's JSON answer).
pub(crate) fn typed_response(
    buf: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    cache: Option<&CacheFields<'_>>,
    close: bool,
    body: &[u8],
) {
    let mut h = Head::standard(buf, status);
    h.field("Content-Type", content_type.as_bytes());
    for (k, v) in extra {
        h.field(k, v.as_bytes());
    }
    h.framing(Framing::Length(body.len() as u64));
    if let Some(c) = cache {
        h.cache(c);
    }
    h.end(close);
    buf.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: CacheStatusField<'_>) -> String {
        let mut out = Vec::new();
        f.render(&mut out);
        String::from_utf8(out).expect("ascii")
    }

    /// Every member the proxy sends, byte for byte, in RFC 9211's parameter order.
    #[test]
    fn cache_status_members_are_spelled_once() {
        assert_eq!(text(CacheStatusField::hit(60)), "zerocache; hit; ttl=60");
        assert_eq!(
            text(CacheStatusField::hit(-5).detail("stale")),
            "zerocache; hit; ttl=-5; detail=stale"
        );
        assert_eq!(
            text(CacheStatusField {
                fwd_status: Some(304),
                ttl: Some(0),
                ..CacheStatusField::fwd("stale")
            }),
            "zerocache; fwd=stale; fwd-status=304; ttl=0"
        );
        assert_eq!(
            text(CacheStatusField {
                stored: true,
                ..CacheStatusField::fwd("miss").detail("peer")
            }),
            "zerocache; fwd=miss; stored; detail=peer"
        );
        assert_eq!(
            text(CacheStatusField {
                collapsed: true,
                ..CacheStatusField::fwd("miss")
            }),
            "zerocache; fwd=miss; collapsed"
        );
        assert_eq!(
            text(CacheStatusField::fwd("miss").detail("no-store")),
            "zerocache; fwd=miss; detail=no-store"
        );
        assert_eq!(text(CacheStatusField::default()), "zerocache");
    }

    /// A whole head: status line, fields in call order, the cache epilogue, `Connection`, the
    /// blank line; a relayed peer's member first; `resume` continues a prefix.
    #[test]
    fn a_head_is_written_in_order() {
        let mut buf = b"left over".to_vec();
        let mut h = Head::new(&mut buf, 200, "OK");
        h.field("ETag", b"\"a\"")
            .framing(Framing::Length(5))
            .age(3)
            .cache(&CacheFields {
                x_cache: "HIT",
                upstream: Some("other; hit"),
                member: Some(CacheStatusField::hit(7)),
            })
            .via_self();
        let n = h.end(true);
        let want = "HTTP/1.1 200 OK\r\nETag: \"a\"\r\nContent-Length: 5\r\nAge: 3\r\nX-Cache: HIT\r\nCache-Status: other; hit, zerocache; hit; ttl=7\r\nVia: 1.1 zerocache\r\nConnection: close\r\n\r\n";
        assert_eq!(String::from_utf8_lossy(&buf), want);
        assert_eq!(n, want.len());

        let mut prefix = Vec::new();
        // Unfinished: a prebuilt prefix, as an entry keeps one.
        Head::standard(&mut prefix, 404).framing(Framing::Length(0));
        let mut buf = Vec::new();
        let mut h = Head::resume(&mut buf, &prefix);
        h.cache(&CacheFields {
            x_cache: "MISS",
            upstream: None,
            member: None,
        })
        .framing(Framing::Chunked);
        h.end(false);
        assert_eq!(
            buf,
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nX-Cache: MISS\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
    }

    /// A received message's hop-by-hop fields stay behind, and what `skip` names.
    #[test]
    fn only_end_to_end_fields_cross() {
        let fields: Vec<Field> = [
            ("Link", "</a>; rel=preload"),
            ("Connection", "X-Hop"),
            ("X-Hop", "1"),
            ("Keep-Alive", "timeout=5"),
            ("X-Cache", "HIT"),
            ("Link", "</b>; rel=preload"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
        let mut buf = Vec::new();
        let mut h = Head::new(&mut buf, 103, "Early Hints");
        h.end_to_end(&fields, |k| k.eq_ignore_ascii_case("x-cache"));
        h.end(false);
        assert_eq!(
            buf,
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\nLink: </b>; rel=preload\r\n\r\n"
        );
    }

    /// The proxy's own small answers.
    #[test]
    fn a_text_response() {
        let mut buf = Vec::new();
        text_response(
            &mut buf,
            503,
            &[("Retry-After", "1")],
            None,
            true,
            b"503 Service Unavailable\n",
        );
        assert_eq!(
            buf,
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\nContent-Length: 24\r\nConnection: close\r\n\r\n503 Service Unavailable\n"
        );
    }
}
