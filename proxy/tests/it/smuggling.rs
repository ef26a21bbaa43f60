//! Request smuggling and desync, pinned byte for byte: a table of raw requests, each sent on its
//! own connection to one running proxy in front of one real origin, with the status the proxy must
//! answer, whether it must close the connection, and exactly what the origin must have received.
//! A proxy and an origin that disagree about where one request ends are how one client's bytes
//! become the start of another client's request (RFC 9112 §6.3, §11.2), so every case that keeps
//! the connection open is followed by a plain `GET /ok` on the same connection, which must come
//! back 200 and reach the origin as exactly one separate request: nothing was left over, nothing
//! was swallowed. All failing cases are collected and reported together, so one run shows them all.

use crate::support::*;
use std::io::{Read, Write};
use std::panic::AssertUnwindSafe;
use std::time::Duration;
use zerocache_origin::Received;

/// What the origin must have received for one case (besides the follow-up `GET /ok`).
#[derive(Clone, Copy, Debug)]
enum Seen {
    /// Nothing: the proxy answered on its own.
    Nothing,
    /// Exactly one request: method, target and (de-chunked) body.
    One(&'static str, &'static str, &'static [u8]),
    /// Exactly one request as in `One`, whose only `Host` field has this value.
    OneWithHost(&'static str, &'static str, &'static [u8], &'static str),
    /// Pipelined requests: these, in this order, with one response (of the row's status) each.
    Each(&'static [(&'static str, &'static str, &'static [u8])]),
}

/// One case: name, the exact bytes sent, the status expected, whether the proxy must close the
/// connection after answering, and what the origin must have received.
type Row = (&'static str, &'static [u8], u16, bool, Seen);

const CLOSE: bool = true;
const KEEP: bool = false;
const NOTHING: Seen = Seen::Nothing;
const GET_ROOT: Seen = Seen::One("GET", "/", b"");
const POST_HELLO: Seen = Seen::One("POST", "/", b"hello");

/// `prefix`, then `unit` repeated to fill, then `suffix`: `N` bytes in all. For the oversized
/// cases, so the table stays a static of exact bytes.
const fn build<const N: usize>(prefix: &[u8], unit: &[u8], suffix: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut i = 0;
    while i < prefix.len() {
        out[i] = prefix[i];
        i += 1;
    }
    let middle = N - prefix.len() - suffix.len();
    let mut j = 0;
    while j < middle {
        out[i] = unit[j % unit.len()];
        i += 1;
        j += 1;
    }
    let mut k = 0;
    while k < suffix.len() {
        out[i] = suffix[k];
        i += 1;
        k += 1;
    }
    out
}

const BIG_FIELD_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: a.example\r\nX-Big: ";
const BIG_FIELD_TAIL: &[u8] = b"\r\n\r\n";
/// A GET with one 70,000-byte field value.
static BIG_FIELD: [u8; BIG_FIELD_HEAD.len() + 70_000 + BIG_FIELD_TAIL.len()] =
    build(BIG_FIELD_HEAD, b"v", BIG_FIELD_TAIL);

const LONG_TARGET_HEAD: &[u8] = b"GET /";
const LONG_TARGET_TAIL: &[u8] = b" HTTP/1.1\r\nHost: a.example\r\n\r\n";
/// A GET whose target is 10,000 bytes (`/` and 9,999 `a`).
static LONG_TARGET: [u8; LONG_TARGET_HEAD.len() + 9_999 + LONG_TARGET_TAIL.len()] =
    build(LONG_TARGET_HEAD, b"a", LONG_TARGET_TAIL);

const MANY_FIELDS_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: a.example\r\n";
const MANY_FIELDS_TAIL: &[u8] = b"\r\n";
/// A GET with 200 header fields besides Host (`X-F: 1` each).
static MANY_FIELDS: [u8; MANY_FIELDS_HEAD.len() + 200 * 8 + MANY_FIELDS_TAIL.len()] =
    build(MANY_FIELDS_HEAD, b"X-F: 1\r\n", MANY_FIELDS_TAIL);

#[rustfmt::skip]
static CASES: &[Row] = &[
    // Baselines: the plain shapes every other row mutates.
    ("baseline get", b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", 200, KEEP, GET_ROOT),
    ("baseline post content-length", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n\r\nhello", 200, KEEP, POST_HELLO),
    ("baseline connection close", b"GET / HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n", 200, CLOSE, GET_ROOT),

    // Content-Length is 1*DIGIT (RFC 9110 §8.6); anything else is invalid framing: 400 and close
    // (RFC 9112 §6.3 item 5). Identical repeats may be collapsed (§8.6).
    ("cl plus sign", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: +5\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl list with plus sign", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5, +5\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl negative", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: -1\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl hex", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0x5\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl inner space", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5 5\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl trailing comma", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5,\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl leading comma", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: ,5\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl exponent", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1e3\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl overflow", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 99999999999999999999999\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl nbsp before", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: \xc2\xa05\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl nbsp after", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\xc2\xa0\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl vertical tab after", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\x0b\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl empty value", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: \r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl differing list", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3, 4\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl two differing fields", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nhello", 400, CLOSE, NOTHING),
    ("cl equal list", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5, 5\r\n\r\nhello", 200, KEEP, POST_HELLO),
    ("cl two equal fields", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", 200, KEEP, POST_HELLO),
    ("cl leading zeros", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 005\r\n\r\nhello", 200, KEEP, POST_HELLO),
    ("cl surrounding ows", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length:\t5 \r\n\r\nhello", 200, KEEP, POST_HELLO),
    ("cl zero", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0\r\n\r\n", 200, KEEP, Seen::One("POST", "/", b"")),
    ("fat get content-length", b"GET / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 4\r\n\r\nabcd", 200, KEEP, Seen::One("GET", "/", b"abcd")),

    // Content-Length and Transfer-Encoding together: 400 and close, in any order and spelling.
    ("cl then te", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te then cl", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("cl te lower-case names", b"POST / HTTP/1.1\r\nhost: a.example\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("cl te upper-case names and value", b"POST / HTTP/1.1\r\nHOST: a.example\r\nTRANSFER-ENCODING: CHUNKED\r\nCONTENT-LENGTH: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("cl zero with te", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("cl between two te", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),

    // Transfer-Encoding: chunked must be the final (and here the only) coding (RFC 9112 §6.1,
    // §6.3 item 4); an unknown coding before it is 501 (§6.1).
    ("te chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("te Chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("te CHUNKED", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("te tab ows", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding:\tchunked\t\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("te chunked on a get", b"GET / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200, KEEP, Seen::One("GET", "/", b"hello")),
    ("te chunked twice in a list", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te two chunked fields", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te chunked then gzip", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te chunked then identity", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te gzip only", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te xchunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te chunked with parameter", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked;x=1\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te chunked nbsp", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\xc2\xa0\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te nbsp chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: \xc2\xa0chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te vertical tab chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: \x0bchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te empty value", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: \r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te chunked trailing comma", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked,\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te space before colon", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("te gzip then chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 501, CLOSE, NOTHING),
    ("te identity then chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: identity, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 501, CLOSE, NOTHING),
    ("te deflate then chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: deflate, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 501, CLOSE, NOTHING),
    ("te custom then chunked", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: x-custom, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 501, CLOSE, NOTHING),
    ("te in http/1.0", b"POST / HTTP/1.0\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),

    // Chunked bodies (RFC 9112 §7.1): chunk-size is 1*HEXDIG, lines end in CRLF, extensions and
    // trailers follow their grammar. A body the proxy cannot delimit exactly is 400 and close.
    ("chunk size plus sign", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size leading space", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size nbsp", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\xc2\xa0\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size 0x prefix", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size negative", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size empty line", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size 17 hex digits", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size leading zeros", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n005\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("chunk size upper-case hex", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\nA\r\nhelloworld\r\n0\r\n\r\n", 200, KEEP, Seen::One("POST", "/", b"helloworld")),
    ("chunk several chunks", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("chunk ext after space", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5 ;ext=1\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("chunk ext after tab", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\t;a=b\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("chunk ext quoted value", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\"q d\"\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("chunk ext without value", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5;ext\r\nhello\r\n0\r\n\r\n", 200, KEEP, POST_HELLO),
    ("chunk ext bare cr", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk ext bare lf", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5;a\nb\r\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk data without crlf", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk data then bare lf", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk size line bare lf", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk last size line bare lf", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\n\r\n", 400, CLOSE, NOTHING),
    ("chunk trailer without colon", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nNoColon\r\n\r\n", 400, CLOSE, NOTHING),
    ("chunk trailer bare lf", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\n\r\n", 400, CLOSE, NOTHING),
    ("chunk valid trailer", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", 200, KEEP, POST_HELLO),

    // HTTP-version (RFC 9112 §2.3): a higher 1.x minor is served as 1.1 (RFC 9110 §2.5); another
    // major is 505; anything not `HTTP/` DIGIT `.` DIGIT is 400.
    ("version 1.2", b"GET / HTTP/1.2\r\nHost: a.example\r\n\r\n", 200, KEEP, GET_ROOT),
    ("version 1.9", b"GET / HTTP/1.9\r\nHost: a.example\r\n\r\n", 200, KEEP, GET_ROOT),
    ("version 1.0", b"GET / HTTP/1.0\r\nHost: a.example\r\n\r\n", 200, CLOSE, GET_ROOT),
    ("version 1.0 keep-alive", b"GET / HTTP/1.0\r\nHost: a.example\r\nConnection: keep-alive\r\n\r\n", 200, KEEP, GET_ROOT),
    ("version 2.0", b"GET / HTTP/2.0\r\nHost: a.example\r\n\r\n", 505, CLOSE, NOTHING),
    ("version 0.9", b"GET / HTTP/0.9\r\nHost: a.example\r\n\r\n", 505, CLOSE, NOTHING),
    ("version 3.0", b"GET / HTTP/3.0\r\nHost: a.example\r\n\r\n", 505, CLOSE, NOTHING),
    ("version lower-case name", b"GET / http/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("version two-digit minor", b"GET / HTTP/1.10\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("version without minor", b"GET / HTTP/1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("version with junk", b"GET / HTTP/1.1x\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),

    // Host (RFC 9112 §3.2): exactly one, and a valid `uri-host [ ":" port ]`.
    ("host missing", b"GET / HTTP/1.1\r\n\r\n", 400, CLOSE, NOTHING),
    ("host twice identical", b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("host twice differing", b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("host with pipe", b"GET / HTTP/1.1\r\nHost: a.example|/pipe\r\n\r\n", 400, CLOSE, NOTHING),
    ("host with space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, CLOSE, NOTHING),
    ("host with letters for port", b"GET / HTTP/1.1\r\nHost: a.example:abc\r\n\r\n", 400, CLOSE, NOTHING),
    ("host with userinfo", b"GET / HTTP/1.1\r\nHost: a@b\r\n\r\n", 400, CLOSE, NOTHING),
    ("host with slash", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, CLOSE, NOTHING),
    ("host with nbsp", b"GET / HTTP/1.1\r\nHost: a.example\xc2\xa0\r\n\r\n", 400, CLOSE, NOTHING),
    ("host utf-8 name", b"GET / HTTP/1.1\r\nHost: \xe4\xbe\x8b.jp\r\n\r\n", 400, CLOSE, NOTHING),
    ("host unclosed ip literal", b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400, CLOSE, NOTHING),
    ("host with port", b"GET / HTTP/1.1\r\nHost: a.example:8080\r\n\r\n", 200, KEEP, GET_ROOT),
    ("host mixed case", b"GET / HTTP/1.1\r\nHost: A.Example\r\n\r\n", 200, KEEP, GET_ROOT),
    ("host ipv6 literal with port", b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", 200, KEEP, GET_ROOT),
    ("host ipv4 address", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 200, KEEP, GET_ROOT),
    ("host field name upper-case", b"GET / HTTP/1.1\r\nHOST: a.example\r\n\r\n", 200, KEEP, GET_ROOT),

    // Request targets (RFC 9112 §3.2): origin-form, absolute-form (whose authority wins over
    // Host, §3.2.2), `*` for OPTIONS; nothing else.
    ("absolute form overrides host", b"GET http://a.example/x HTTP/1.1\r\nHost: other.example\r\n\r\n", 200, KEEP, Seen::OneWithHost("GET", "/x", b"", "a.example")),
    ("absolute form with port", b"GET http://a.example:8080/x HTTP/1.1\r\nHost: other.example\r\n\r\n", 200, KEEP, Seen::OneWithHost("GET", "/x", b"", "a.example:8080")),
    ("absolute form empty path", b"GET http://a.example HTTP/1.1\r\nHost: a.example\r\n\r\n", 200, KEEP, Seen::OneWithHost("GET", "/", b"", "a.example")),
    ("absolute form query only", b"GET http://a.example?q=1 HTTP/1.1\r\nHost: a.example\r\n\r\n", 200, KEEP, Seen::OneWithHost("GET", "/?q=1", b"", "a.example")),
    ("absolute form userinfo", b"GET http://user@a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("absolute form pipe in host", b"GET http://a.example|x/ HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("absolute form ftp scheme", b"GET ftp://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("target without scheme or slash", b"GET a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("target with nul", b"GET /a\0b HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("target with bare cr", b"GET /a\rb HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("target with space", b"GET /a b HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),

    // Heads (RFC 9112 §2.2, §5): CRLF line ends, no obs-fold, no whitespace before the colon,
    // no CR/LF/NUL in values, token names and methods; limits give 431 and 414.
    ("obs-fold with spaces", b"GET / HTTP/1.1\r\nHost: a.example\r\nX-A: 1\r\n  continued\r\n\r\n", 400, CLOSE, NOTHING),
    ("obs-fold with tab", b"GET / HTTP/1.1\r\nHost: a.example\r\nX-A: 1\r\n\tcontinued\r\n\r\n", 400, CLOSE, NOTHING),
    ("whitespace before first field", b"GET / HTTP/1.1\r\n Host: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("field without colon", b"GET / HTTP/1.1\r\nHost: a.example\r\nX-A\r\n\r\n", 400, CLOSE, NOTHING),
    ("space before colon", b"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("empty field name", b"GET / HTTP/1.1\r\nHost: a.example\r\n: x\r\n\r\n", 400, CLOSE, NOTHING),
    ("field name not a token", b"GET / HTTP/1.1\r\nHost: a.example\r\nX(A): 1\r\n\r\n", 400, CLOSE, NOTHING),
    ("field name with nul", b"GET / HTTP/1.1\r\nHost: a.example\r\nX-\0A: 1\r\n\r\n", 400, CLOSE, NOTHING),
    ("bare lf everywhere", b"GET / HTTP/1.1\nHost: a.example\n\n", 400, CLOSE, NOTHING),
    ("bare lf after request line", b"GET / HTTP/1.1\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("bare lf after field", b"GET / HTTP/1.1\r\nHost: a.example\n\r\n", 400, CLOSE, NOTHING),
    ("bare lf ending head", b"GET / HTTP/1.1\r\nHost: a.example\r\n\n", 400, CLOSE, NOTHING),
    ("bare cr in value", b"GET / HTTP/1.1\r\nHost: a.example\r\nX-A: 1\r2\r\n\r\n", 400, CLOSE, NOTHING),
    ("nul in value", b"GET / HTTP/1.1\r\nHost: a.example\r\nX-A: 1\x002\r\n\r\n", 400, CLOSE, NOTHING),
    ("method not a token", b"G(T / HTTP/1.1\r\nHost: a.example\r\n\r\n", 400, CLOSE, NOTHING),
    ("field value 70000 bytes", &BIG_FIELD, 431, CLOSE, NOTHING),
    ("target 10000 bytes", &LONG_TARGET, 414, CLOSE, NOTHING),
    ("200 header fields", &MANY_FIELDS, 431, CLOSE, NOTHING),

    // Methods: TRACE is answered by the proxy (405 with Allow, RFC 9110 §15.5.6) and never
    // reflects a request upstream; OPTIONS * is forwarded.
    ("trace", b"TRACE / HTTP/1.1\r\nHost: a.example\r\n\r\n", 405, KEEP, NOTHING),
    ("options asterisk", b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n", 200, KEEP, Seen::One("OPTIONS", "*", b"")),

    // Field names with `_`: served, but never forwarded (an origin behind a CGI-style gateway
    // maps `_` and `-` to the same variable, so `Transfer_Encoding` could frame the body there).
    ("underscore transfer-encoding on get", b"GET / HTTP/1.1\r\nHost: a.example\r\nTransfer_Encoding: chunked\r\n\r\n", 200, KEEP, GET_ROOT),
    ("underscore transfer-encoding with cl", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nTransfer_Encoding: chunked\r\n\r\nhello", 200, KEEP, POST_HELLO),
    ("underscore x-forwarded-host", b"GET / HTTP/1.1\r\nHost: a.example\r\nX_Forwarded_Host: evil\r\n\r\n", 200, KEEP, GET_ROOT),

    // Pipelining: requests sent back to back are answered in order, each exactly once.
    ("pipelined gets", b"GET /one HTTP/1.1\r\nHost: a.example\r\n\r\nGET /two HTTP/1.1\r\nHost: a.example\r\n\r\n", 200, KEEP, Seen::Each(&[("GET", "/one", b""), ("GET", "/two", b"")])),
    ("pipelined post then get", b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n\r\nhelloGET /two HTTP/1.1\r\nHost: a.example\r\n\r\n", 200, KEEP, Seen::Each(&[("POST", "/", b"hello"), ("GET", "/two", b"")])),
    ("pipelined chunked post then get", b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /two HTTP/1.1\r\nHost: a.example\r\n\r\n", 200, KEEP, Seen::Each(&[("POST", "/", b"hello"), ("GET", "/two", b"")])),

    // Expect: the body already follows the head, so a 100 is optional; the request is served.
    ("expect 100-continue body sent at once", b"POST / HTTP/1.1\r\nHost: a.example\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", 200, KEEP, POST_HELLO),
];

/// Every path the table and the follow-up use: 200 `ok`, never stored.
const PATHS: &[&str] = &["/", "/ok", "/x", "/one", "/two", "/?q=1", "*"];

fn no_store_ok() -> Reply {
    Reply::ok(b"ok".to_vec()).headers(&[("Cache-Control", "no-store")])
}

/// The follow-up request sent on every connection that must stay open.
const FOLLOW_UP: &[u8] = b"GET /ok HTTP/1.1\r\nHost: a.example\r\n\r\n";

/// One response, or why there is none: `Ok(None)` when the proxy closed first, `Err` when the
/// read failed (timed out or reset; the support client panics on those, which is caught here so
/// one bad case does not hide the others).
fn read(c: &mut Client) -> Result<Option<Response>, String> {
    std::panic::catch_unwind(AssertUnwindSafe(|| c.try_read_response(false))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "read failed".into())
    })
}

/// Whether the proxy has closed the connection: EOF or a reset within 2 s. Stricter than
/// `Client::is_closed`, which counts a read timeout as closed and so cannot tell a connection the
/// proxy left open from one it closed.
fn closed(c: &mut Client) -> Result<(), String> {
    c.sock
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut b = [0u8; 256];
    match c.sock.read(&mut b) {
        Ok(0) => Ok(()),
        Ok(n) => Err(format!(
            "connection not closed: {n} more bytes followed: {:?}",
            String::from_utf8_lossy(&b[..n])
        )),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err("connection left open".into())
        }
        Err(_) => Ok(()),
    }
}

fn describe(r: &Received) -> String {
    format!(
        "{} {} body {:?} fields {:?}",
        r.method,
        r.path,
        String::from_utf8_lossy(&r.body),
        r.headers
    )
}

/// Whether `got` is the request `(method, path, body)`; a mismatch as text.
fn check_request(got: &Received, want: (&str, &str, &[u8])) -> Result<(), String> {
    let (method, path, body) = want;
    if got.method != method || got.path != path || got.body != body {
        return Err(format!(
            "origin saw {}, expected {method} {path} body {:?}",
            describe(got),
            String::from_utf8_lossy(body)
        ));
    }
    if let Some((name, _)) = got.headers.iter().find(|(k, _)| k.contains('_')) {
        return Err(format!("origin saw a field named {name:?}"));
    }
    Ok(())
}

/// Runs one case on a fresh connection; every way it differs from the row, as text.
fn run_case(proxy: &Proxy, origin: &Origin, row: &Row) -> Vec<String> {
    let &(_, raw, status, must_close, seen) = row;
    let mut problems = Vec::new();
    let before = origin.received().len();
    let mut c = Client::connect(proxy.addr);
    c.sock
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    if let Err(e) = c.sock.write_all(raw) {
        problems.push(format!("send failed: {e}"));
        return problems;
    }
    let responses = match seen {
        Seen::Each(list) => list.len(),
        _ => 1,
    };
    for i in 0..responses {
        match read(&mut c) {
            Ok(Some(r)) => {
                if r.status != status {
                    problems.push(format!(
                        "response {}: status {} expected {status} (body {:?})",
                        i + 1,
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    ));
                }
                if status == 405 && r.header("allow").is_none() {
                    problems.push("405 without an Allow field".into());
                }
            }
            Ok(None) => {
                problems.push(format!(
                    "response {}: connection closed without one (expected {status})",
                    i + 1
                ));
                return problems;
            }
            Err(e) => {
                problems.push(format!("response {}: none (expected {status}): {e}", i + 1));
                return problems;
            }
        }
    }
    let got = origin.received().split_off(before);
    let want: Vec<(&str, &str, &[u8])> = match seen {
        Seen::Nothing => Vec::new(),
        Seen::One(m, p, b) | Seen::OneWithHost(m, p, b, _) => vec![(m, p, b)],
        Seen::Each(list) => list.to_vec(),
    };
    if got.len() != want.len() {
        problems.push(format!(
            "origin received {} requests, expected {}: {:?}",
            got.len(),
            want.len(),
            got.iter().map(describe).collect::<Vec<_>>()
        ));
    } else {
        for (g, w) in got.iter().zip(&want) {
            if let Err(e) = check_request(g, *w) {
                problems.push(e);
            }
        }
        if let (Seen::OneWithHost(.., host), Some(g)) = (seen, got.first()) {
            let hosts: Vec<&str> = g
                .headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
                .map(|(_, v)| v.as_str())
                .collect();
            if hosts != [host] {
                problems.push(format!("origin saw Host {hosts:?}, expected [{host:?}]"));
            }
        }
    }
    if must_close {
        if let Err(e) = closed(&mut c) {
            problems.push(e);
        }
        return problems;
    }
    // No desync: the next request on this connection is exactly one plain GET /ok.
    let before = origin.received().len();
    if let Err(e) = c.sock.write_all(FOLLOW_UP) {
        problems.push(format!("follow-up: send failed: {e}"));
        return problems;
    }
    match read(&mut c) {
        Ok(Some(r)) if r.status == 200 && r.body == b"ok" => {}
        Ok(Some(r)) => problems.push(format!(
            "follow-up: status {} body {:?}, expected 200 \"ok\"",
            r.status,
            String::from_utf8_lossy(&r.body)
        )),
        Ok(None) => problems.push("follow-up: connection closed without a response".into()),
        Err(e) => problems.push(format!("follow-up: no response: {e}")),
    }
    let got = origin.received().split_off(before);
    match got.as_slice() {
        [one] => {
            if let Err(e) = check_request(one, ("GET", "/ok", b"")) {
                problems.push(format!("follow-up: {e}"));
            }
        }
        _ => problems.push(format!(
            "follow-up: origin received {:?}, expected exactly GET /ok",
            got.iter().map(describe).collect::<Vec<_>>()
        )),
    }
    problems
}

#[test]
fn smuggling_table() {
    assert!(CASES.len() >= 100, "{} rows", CASES.len());
    let mut names: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), CASES.len(), "case names are unique");

    let (origin, _rt) = origin();
    for p in PATHS {
        origin.script(p, no_store_ok());
    }
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut failures = Vec::new();
    for row in CASES {
        let problems = run_case(&proxy, &origin, row);
        if !problems.is_empty() {
            failures.push(format!("{}: {}", row.0, problems.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n  {}",
        failures.len(),
        CASES.len(),
        failures.join("\n  ")
    );
}

/// `Expect: 100-continue` with the body held back: the proxy must say `100 Continue` before the
/// client sends it (RFC 9110 §10.1.1), then answer the request, and the origin gets the body once.
#[test]
fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let (origin, _rt) = origin();
    for p in ["/", "/ok"] {
        origin.script(p, no_store_ok());
    }
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.send(
        b"POST / HTTP/1.1\r\nHost: a.example\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
    );
    // Byte by byte up to the end of the interim head, so nothing after it is consumed here.
    let mut interim = Vec::new();
    while !interim.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = c.sock.read(&mut b).expect("the 100 Continue arrives");
        assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&interim));
        interim.push(b[0]);
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100 Continue\r\n"),
        "{:?}",
        String::from_utf8_lossy(&interim)
    );
    assert!(
        origin.received().is_empty(),
        "nothing forwarded before the body"
    );
    c.send(b"hello");
    let r = c.read_response(false);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    let got = origin.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (
            got[0].method.as_str(),
            got[0].path.as_str(),
            got[0].body.as_slice()
        ),
        ("POST", "/", &b"hello"[..])
    );
    // And the connection is still in step.
    c.send(FOLLOW_UP);
    assert_eq!(c.read_response(false).status, 200);
    assert_eq!(origin.hits("/ok"), 1);
}
