//! The one writer of the response heads zerocache sends to clients: the status line, fields,
//! framing, the cache's own fields (`Age`, `X-Cache`, `Cache-Status`, `Via`), `Connection` and
//! the blank line, in that order, into the connection's reused [`HeadBuf`], rendered for the
//! connection's protocol: HTTP/1.1 bytes, or an HTTP/2 stream's HEADERS fields ([`H2Head`]).
//!
//! Why one type: the same epilogue was written by hand in four places and `Cache-Status` spelled
//! in six, and a field one site forgot (or wrote twice) is a response that lies about itself. The
//! cache status is a typed value ([`CacheStatusField`]) rendered here, so every site says *what*
//! happened and this module alone says how it is spelled (RFC 9211). Writing allocates nothing:
//! numbers go in digit by digit, so a hit's head costs no allocation beyond its buffer's growth.
//! An HTTP/2 stream's head takes the same calls as fields of a header map: the connection-specific
//! ones left out (RFC 9113 §8.2.2), no `Transfer-Encoding` (the stream frames its body) and no
//! `Connection`, so no HTTP/1.1 bytes stand between the request path and an h2 stream.

pub(crate) use super::cache_status::{CacheFields, CacheStatusField};
use super::field_edit::name_bits;
use super::headers::{
    Field, VIA_SELF, VIA_SELF_LINE, connection_tokens, is_hop_by_hop, put, put_digits, put_num, via,
};
use super::response::reason;
use super::stored_fields::StoredFields;

/// How the body after a head is delimited, as the head announces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Framing {
    /// No framing field (a 304, a HEAD answered without one, or a body up to the close).
    #[default]
    None,
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Fields HTTP/2 forbids in a response (RFC 9113 §8.2.2): an HTTP/2 head leaves them out.
const NOT_IN_H2: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// A connection's reused buffer for the heads it sends (and the body of an answer the proxy
/// makes itself, which follows its head): HTTP/1.1 bytes, or an HTTP/2 stream's fields.
#[derive(Debug, Default)]
pub(crate) struct HeadBuf {
    /// HTTP/1.1: the head's bytes, then a generated body. HTTP/2: a generated body alone.
    pub(super) wire: Vec<u8>,
    /// HTTP/2: the head as fields.
    pub(super) h2: Option<Box<H2Head>>,
    /// Whether `Via` names this proxy (`proxy.via`); without, a relayed response's own hops
    /// still go on.
    via_self: bool,
    /// The rules' edits of this request's final response heads (`response_headers`), made by
    /// [`Head::end`]; empty for most requests.
    pub(crate) edits: super::field_edit::FieldEdits,
    /// HTTP/1.1: the head's first `.0` bytes are lines whose names are in the set `.1`
    /// (`field_edit::name_bits`): an edit that removes none of them looks only past them.
    pub(super) named: (usize, u128),
}

/// A response head for an HTTP/2 stream: its status and fields, what it said of its body's
/// framing, and its size as HTTP/1.1 would have written it (for the accounting, which counts
/// an h2 stream's head bytes so).
#[derive(Debug, Default)]
pub(crate) struct H2Head {
    /// The status code.
    pub status: u16,
    /// The fields, lower-cased as HTTP/2 sends them.
    pub fields: http::HeaderMap,
    /// The framing the head announced: a length, or none known (`Chunked`: the stream's end
    /// ends the body), or no body.
    pub framing: Framing,
    /// Its size in HTTP/1.1 form.
    pub size: usize,
    /// A field that HTTP/2 cannot carry (not a valid name or value): the stream is reset
    /// rather than sent a head without it.
    pub invalid: Option<String>,
}

impl HeadBuf {
    /// A buffer for HTTP/1.1 heads, with room for `n` bytes.
    pub(crate) fn h1(n: usize) -> HeadBuf {
        HeadBuf {
            wire: Vec::with_capacity(n),
            h2: None,
            via_self: true,
            edits: Default::default(),
            named: (0, 0),
        }
    }

    /// A buffer for an HTTP/2 stream's heads.
    pub(crate) fn h2() -> HeadBuf {
        HeadBuf {
            wire: Vec::new(),
            h2: Some(Box::default()),
            via_self: true,
            edits: Default::default(),
            named: (0, 0),
        }
    }

    /// Whether the heads written here name this proxy in `Via` (`proxy.via`; on by default).
    pub(crate) fn set_via_self(&mut self, on: bool) {
        self.via_self = on;
    }

    /// Whether heads are an HTTP/2 stream's.
    pub(crate) fn is_h2(&self) -> bool {
        self.h2.is_some()
    }

    /// The head's size (as HTTP/1.1 for an h2 stream's) and any body after it.
    pub(crate) fn len(&self) -> usize {
        self.h2.as_ref().map_or(0, |h| h.size) + self.wire.len()
    }

    /// Shortens head and body to `n` bytes: drops a generated body (never cuts into the head).
    pub(crate) fn truncate(&mut self, n: usize) {
        let head = self.h2.as_ref().map_or(0, |h| h.size);
        self.wire.truncate(n.saturating_sub(head));
    }

    /// Empties it.
    pub(crate) fn clear(&mut self) {
        self.wire.clear();
        self.named = (0, 0);
        if let Some(h) = &mut self.h2 {
            h.fields.clear();
            h.size = 0;
            h.invalid = None;
        }
    }

    /// Appends a generated body after the head.
    pub(crate) fn body(&mut self, bytes: &[u8]) {
        self.wire.extend_from_slice(bytes);
    }

    /// HTTP/1.1: the head and body bytes. HTTP/2: the body.
    pub(crate) fn wire(&self) -> &[u8] {
        &self.wire
    }

    /// The HTTP/1.1 bytes, for a head written once and kept (an entry's hit head, a canned
    /// answer).
    pub(crate) fn into_wire(self) -> Vec<u8> {
        self.wire
    }

    /// HTTP/2: the head, to be sent (its fields are taken; its size stays for the accounting).
    pub(crate) fn take_h2(&mut self) -> Option<H2Head> {
        let h = self.h2.as_mut()?;
        Some(H2Head {
            status: h.status,
            fields: std::mem::take(&mut h.fields),
            framing: h.framing,
            size: h.size,
            invalid: h.invalid.take(),
        })
    }

    /// `name: value`, in the head's protocol. HTTP/2 leaves out what it forbids.
    pub(super) fn put(&mut self, name: &str, value: &[u8]) {
        let Some(h) = &mut self.h2 else {
            put(&mut self.wire, name, value);
            return;
        };
        h.size += name.len() + value.len() + 4;
        if NOT_IN_H2.iter().any(|n| name.eq_ignore_ascii_case(n)) {
            return;
        }
        match (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            (Ok(n), Ok(v)) => {
                h.fields.append(n, v);
            }
            _ => {
                h.invalid
                    .get_or_insert_with(|| format!("a field HTTP/2 cannot carry: {name}"));
            }
        }
    }

    /// Says that the lines written since `start` have names in `bits`, when all before them
    /// were known already (see `named`).
    #[inline]
    fn noted(&mut self, start: usize, bits: u128) {
        if self.named.0 == start {
            self.named = (self.wire.len(), self.named.1 | bits);
        }
    }

    /// `name: n`, without allocating for HTTP/1.1.
    fn put_num(&mut self, name: &str, n: u64) {
        if self.h2.is_none() {
            put_num(&mut self.wire, name, n);
            return;
        }
        let mut digits = Vec::with_capacity(20);
        put_digits(&mut digits, n);
        self.put(name, &digits);
    }
}

/// A response head being written into a [`HeadBuf`]; [`Head::end`] finishes it.
pub(crate) struct Head<'b> {
    buf: &'b mut HeadBuf,
}

impl<'b> Head<'b> {
    /// Clears `buf` and writes the status line `HTTP/1.1 <status> <reason>` (an HTTP/2 head's
    /// `:status`; HTTP/2 has no reason phrase).
    pub(crate) fn new(buf: &'b mut HeadBuf, status: u16, reason: &str) -> Head<'b> {
        buf.clear();
        match &mut buf.h2 {
            Some(h) => {
                h.status = status;
                h.framing = Framing::None;
                h.size = 9 + 3 + 1 + reason.len() + 2;
            }
            None => {
                let w = &mut buf.wire;
                w.extend_from_slice(b"HTTP/1.1 ");
                put_digits(w, u64::from(status));
                w.push(b' ');
                w.extend_from_slice(reason.as_bytes());
                w.extend_from_slice(b"\r\n");
                buf.named = (w.len(), 0);
            }
        }
        Head { buf }
    }

    /// The same with the standard reason phrase of `status`.
    pub(crate) fn standard(buf: &'b mut HeadBuf, status: u16) -> Head<'b> {
        Head::new(buf, status, reason(status))
    }

    /// Clears `buf` and copies `prefix`: a status line and fields this type wrote before (an
    /// entry's prebuilt hit head), to be continued. HTTP/1.1 only: an h2 stream's head is
    /// written from the entry's fields.
    pub(crate) fn resume(buf: &'b mut HeadBuf, prefix: &[u8]) -> Head<'b> {
        debug_assert!(
            prefix.starts_with(b"HTTP/1.1 ") && !buf.is_h2(),
            "not a head this type wrote, or not an HTTP/1.1 one"
        );
        buf.clear();
        buf.wire.extend_from_slice(prefix);
        buf.named = (0, 0);
        Head { buf }
    }

    /// [`Head::resume`] with the set of the names in `prefix` (`field_edit::names_of`), which
    /// spares the rules' edits a look at its lines.
    pub(crate) fn resume_named(buf: &'b mut HeadBuf, prefix: &[u8], names: u128) -> Head<'b> {
        let h = Head::resume(buf, prefix);
        h.buf.named = (prefix.len(), names);
        h
    }

    /// `name: value`.
    pub(crate) fn field(&mut self, name: &str, value: &[u8]) -> &mut Self {
        self.buf.put(name, value);
        self
    }

    /// `name: n`, without allocating.
    pub(crate) fn num(&mut self, name: &str, n: u64) -> &mut Self {
        self.buf.put_num(name, n);
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
                self.buf.put(k, v);
            }
        }
        self
    }

    /// Header lines already in wire form (`Name: value\r\n` each), such as stored fields: copied
    /// as they are for HTTP/1.1, read line by line into an h2 stream's fields.
    pub(crate) fn lines(&mut self, block: &[u8]) -> &mut Self {
        if self.buf.is_h2() {
            for line in StoredFields(block).lines() {
                self.buf.put(line.name, line.value);
            }
        } else {
            self.buf.wire.extend_from_slice(block);
        }
        self
    }

    /// The framing field: for an h2 stream, `content-length` alone (the stream frames the body).
    pub(crate) fn framing(&mut self, f: Framing) -> &mut Self {
        if let Some(h) = &mut self.buf.h2 {
            h.framing = f;
        }
        match f {
            Framing::None => {}
            Framing::Length(n) => self.buf.put_num("Content-Length", n),
            Framing::Chunked => self.buf.put("Transfer-Encoding", b"chunked"),
        }
        self
    }

    /// `Age`, for a response served from the cache (RFC 9111 §5.1).
    pub(crate) fn age(&mut self, secs: u64) -> &mut Self {
        const AGE: u128 = name_bits(b"Age");
        let start = self.buf.wire.len();
        self.num("Age", secs);
        self.buf.noted(start, AGE);
        self
    }

    /// `X-Cache` and `Cache-Status`.
    pub(crate) fn cache(&mut self, c: &CacheFields<'_>) -> &mut Self {
        const NAMES: u128 = name_bits(b"X-Cache") | name_bits(b"Cache-Status");
        let start = self.buf.wire.len();
        self.buf.put("X-Cache", c.x_cache.as_bytes());
        let Some(m) = &c.member else {
            self.buf.noted(start, NAMES);
            return self;
        };
        let render = |v: &mut Vec<u8>| {
            if let Some(up) = c.upstream.filter(|u| !u.is_empty()) {
                v.extend_from_slice(up.as_bytes());
                v.extend_from_slice(b", ");
            }
            m.render(v);
        };
        if self.buf.is_h2() {
            let mut v = Vec::with_capacity(64);
            render(&mut v);
            self.buf.put("Cache-Status", &v);
        } else {
            // Straight into the head: a hit's head allocates nothing.
            let w = &mut self.buf.wire;
            w.extend_from_slice(b"Cache-Status: ");
            render(w);
            w.extend_from_slice(b"\r\n");
        }
        self.buf.noted(start, NAMES);
        self
    }

    /// `Via` naming this proxy alone (a response it made or served from its cache).
    pub(crate) fn via_self(&mut self) -> &mut Self {
        if !self.buf.via_self {
            return self;
        }
        if self.buf.is_h2() {
            self.buf.put("Via", VIA_SELF.as_bytes());
        } else {
            const VIA: u128 = name_bits(b"Via");
            let start = self.buf.wire.len();
            self.buf.wire.extend_from_slice(VIA_SELF_LINE);
            self.buf.noted(start, VIA);
        }
        self
    }

    /// `Via` for a relayed response: the hops it `received` (its lines joined), then this proxy
    /// named by the version of the response it got (`http10`).
    pub(crate) fn via(&mut self, received: Option<&str>, http10: bool) -> &mut Self {
        if self.buf.via_self {
            self.buf.put("Via", via(received, http10).as_bytes());
        } else if let Some(r) = received.filter(|r| !r.is_empty()) {
            self.buf.put("Via", r.as_bytes());
        }
        self
    }

    /// `Connection: close` when `close`, and the blank line (neither for an h2 stream, whose
    /// size counts them). Returns the head's length.
    pub(crate) fn end(self, close: bool) -> usize {
        self.buf.edit();
        match &mut self.buf.h2 {
            Some(h) => h.size += (if close { 19 } else { 0 }) + 2,
            None => {
                if close {
                    self.buf.wire.extend_from_slice(b"Connection: close\r\n");
                }
                self.buf.wire.extend_from_slice(b"\r\n");
            }
        }
        self.buf.len()
    }
}

/// A small complete response with a text body, for the proxy's own answers: the head (with
/// `extra` fields, cache fields if any, `Via` when `via`), then `body`.
pub(crate) fn text_response(
    buf: &mut HeadBuf,
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
    buf: &mut HeadBuf,
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
    buf.body(body);
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
        let mut buf = HeadBuf::h1(0);
        buf.body(b"left over");
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
        assert_eq!(String::from_utf8_lossy(buf.wire()), want);
        assert_eq!(n, want.len());

        let mut prefix = HeadBuf::h1(0);
        // Unfinished: a prebuilt prefix, as an entry keeps one.
        Head::standard(&mut prefix, 404).framing(Framing::Length(0));
        let prefix = prefix.into_wire();
        let mut buf = HeadBuf::h1(0);
        let mut h = Head::resume(&mut buf, &prefix);
        h.cache(&CacheFields {
            x_cache: "MISS",
            upstream: None,
            member: None,
        })
        .framing(Framing::Chunked);
        h.end(false);
        assert_eq!(
            buf.wire(),
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
        let mut buf = HeadBuf::h1(0);
        let mut h = Head::new(&mut buf, 103, "Early Hints");
        h.end_to_end(&fields, |k| k.eq_ignore_ascii_case("x-cache"));
        h.end(false);
        assert_eq!(
            buf.wire(),
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\nLink: </b>; rel=preload\r\n\r\n"
        );
    }

    /// The proxy's own small answers.
    #[test]
    fn a_text_response() {
        let answer = |mut buf: HeadBuf| {
            text_response(
                &mut buf,
                503,
                &[("Retry-After", "1")],
                None,
                true,
                b"503 Service Unavailable\n",
            );
            buf
        };
        let mut buf = answer(HeadBuf::h1(0));
        let want: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\nContent-Length: 24\r\nConnection: close\r\n\r\n503 Service Unavailable\n";
        assert_eq!(buf.wire(), want);
        // HEAD: the body goes, the head stays.
        buf.truncate(want.len() - 24);
        assert!(buf.wire().ends_with(b"close\r\n\r\n"));
        // The same answer to an h2 stream: fields, and the body alone in the buffer; its size
        // counted as the HTTP/1.1 head's.
        let mut buf = answer(HeadBuf::h2());
        assert_eq!(buf.wire(), b"503 Service Unavailable\n");
        assert_eq!(buf.len(), want.len());
        buf.truncate(want.len() - 24);
        assert_eq!(buf.wire(), b"");
        let h = buf.take_h2().expect("h2");
        assert_eq!((h.status, h.framing), (503, Framing::Length(24)));
        assert_eq!(
            fields(&h),
            [
                ("content-type", "text/plain"),
                ("retry-after", "1"),
                ("content-length", "24")
            ]
        );
    }

    fn fields(h: &H2Head) -> Vec<(&str, &str)> {
        h.fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().expect("ascii")))
            .collect()
    }

    /// An h2 stream's head takes the same calls as fields: names lower-cased, in order, the
    /// fields HTTP/2 forbids left out (a stored or relayed `Connection`, `Keep-Alive`,
    /// `Transfer-Encoding`), no `Connection: close`, the framing kept aside; its size is the
    /// HTTP/1.1 head's, byte for byte, so the accounting counts the same either way.
    #[test]
    fn an_h2_head_is_fields_without_the_connection_specific_ones() {
        let call = |buf: &mut HeadBuf| {
            let mut h = Head::new(buf, 200, "OK");
            h.lines(b"Content-Type: text/html\r\nConnection: close\r\nSet-Cookie: a=1\r\nKeep-Alive: timeout=5\r\nSet-Cookie: b=2\r\n")
                .field("TE", b"trailers")
                .framing(Framing::Chunked)
                .age(7)
                .cache(&CacheFields {
                    x_cache: "HIT",
                    upstream: Some("peer; hit"),
                    member: Some(CacheStatusField::hit(3)),
                })
                .via_self();
            h.end(true)
        };
        let mut h1 = HeadBuf::h1(0);
        let n1 = call(&mut h1);
        let mut h2 = HeadBuf::h2();
        let n2 = call(&mut h2);
        assert_eq!(n1, h1.wire().len());
        assert_eq!(n2, n1);
        let h = h2.take_h2().expect("h2");
        assert_eq!((h.status, h.framing, h.size), (200, Framing::Chunked, n1));
        assert_eq!(h.invalid, None);
        assert_eq!(
            fields(&h),
            [
                ("content-type", "text/html"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
                ("age", "7"),
                ("x-cache", "HIT"),
                ("cache-status", "peer; hit, zerocache; hit; ttl=3"),
                ("via", "1.1 zerocache"),
            ]
        );
        // Taken: the fields go with the head, the size stays for the accounting.
        assert_eq!(h2.len(), n1);
        // A value HTTP/2 cannot carry is not dropped quietly: the stream is reset.
        let mut h2 = HeadBuf::h2();
        Head::new(&mut h2, 200, "OK").field("X-Bad", b"a\x01b");
        assert_eq!(
            h2.take_h2().expect("h2").invalid.as_deref(),
            Some("a field HTTP/2 cannot carry: X-Bad")
        );
    }
}
