//! Fuzzing harnesses, compiled only with the `fuzzing` feature: the libFuzzer targets in
//! `proxy/fuzz/fuzz_targets/` are one-line wrappers around these functions, so the properties
//! live next to the code they check and use only its public API. Each function takes arbitrary
//! bytes, must never panic, and panics (which libFuzzer reports as a crash) when a property does
//! not hold. See `xtask/src/fuzz.rs` for how to run them.

use crate::cache::entry::{self, Meta};
use crate::http::{chunked::ChunkedDecoder, request, response};
use bytes::BytesMut;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, OnceLock};

mod ranges;
pub use ranges::ranges;

/// The limits the proxy runs with by default (`limits.max_header_bytes`, `limits.max_uri_bytes`).
pub const REQUEST_LIMITS: request::Limits = request::Limits {
    max_head: 16384,
    max_uri: 8192,
    path: crate::http::target::PathRules::SAFE,
};

/// `request::parse` never panics, and a complete head never claims more bytes than it was given.
pub fn request_head(data: &[u8]) {
    if let Ok(Some((_head, n))) = request::parse(data, REQUEST_LIMITS) {
        assert!(
            n <= data.len(),
            "request::parse consumed {n} of {} bytes",
            data.len()
        );
    }
}

/// What one decoder run ended with: `Ok(done)` or the error, the body bytes, and the bytes left
/// in the buffer (those after the last chunk and trailers, when done).
type Decoded = (Result<bool, String>, Vec<u8>, Vec<u8>);

/// The first byte picks a split point in the rest; the chunked decoder fed the rest in those two
/// pieces must end exactly as when fed it whole: same body, same leftover bytes, and an error in
/// one case only if there is one in the other. Error messages may differ (a bare LF past the
/// line limit is "bare LF" whole but "line too long" when the line arrives in pieces).
pub fn chunked(data: &[u8]) {
    let Some((&first, wire)) = data.split_first() else {
        return;
    };
    let split = usize::from(first) % (wire.len() + 1);

    let whole = {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut buf = BytesMut::from(wire);
        let r = d.decode(&mut buf, &mut out).map_err(|e| e.to_string());
        if let Ok(done) = r {
            assert_eq!(done, d.is_done(), "decode's result disagrees with is_done");
        }
        (r, out, buf.to_vec())
    };

    let pieces: Decoded = {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut buf = BytesMut::from(&wire[..split]);
        let first = d.decode(&mut buf, &mut out).map_err(|e| e.to_string());
        let r = match first {
            Err(e) => Err(e),
            Ok(_) => {
                buf.extend_from_slice(&wire[split..]);
                d.decode(&mut buf, &mut out).map_err(|e| e.to_string())
            }
        };
        (r, out, buf.to_vec())
    };

    let (wr, wout, wleft) = &whole;
    let (pr, pout, pleft) = &pieces;
    let same = match (wr, pr) {
        (Ok(a), Ok(b)) => a == b && wleft == pleft,
        (Err(_), Err(_)) => true,
        _ => false,
    };
    assert!(
        same && wout == pout,
        "split at {split} of {}: whole gave {:?} body {:?} left {:?}; \
         pieces gave {:?} body {:?} left {:?}",
        wire.len(),
        wr,
        String::from_utf8_lossy(wout),
        String::from_utf8_lossy(wleft),
        pr,
        String::from_utf8_lossy(pout),
        String::from_utf8_lossy(pleft),
    );
}

/// `response::parse` never panics, a complete head never claims more bytes than it was given,
/// and its body framing can be asked for either kind of request without a panic.
pub fn response_head(data: &[u8]) {
    if let Ok(Some((head, n))) = response::parse(data) {
        assert!(
            n <= data.len(),
            "response::parse consumed {n} of {} bytes",
            data.len()
        );
        let get = head.framing(false);
        let head_req = head.framing(true);
        // A HEAD request's response never has a body, but the same framing fields are judged.
        assert_eq!(
            get.is_err(),
            head_req.is_err(),
            "framing(false) = {get:?} but framing(true) = {head_req:?}"
        );
        if let Ok(f) = head_req {
            assert_eq!(
                f,
                response::BodyFraming::None,
                "a HEAD response with a body"
            );
        }
    }
}

/// One scratch file per process, unlinked at once, reused by every run of [`cache_entry`].
fn scratch() -> &'static Mutex<File> {
    static FILE: OnceLock<Mutex<File>> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!(
            "zerocache-fuzz-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("creating the fuzz scratch file");
        let _ = std::fs::remove_file(&path);
        Mutex::new(file)
    })
}

fn rewrite(file: &File, bytes: &[u8], len: u64) -> io::Result<()> {
    file.set_len(0)?;
    file.write_all_at(bytes, 0)?;
    file.set_len(len)
}

/// The cache entry reader:
/// - `Meta::decode` never panics, and what it decodes re-encodes to a block that decodes to the
///   same `Meta`;
/// - `read_header` on a file holding the input never panics, and an entry it accepts has the
///   length its header promises and a `Meta` that round-trips;
/// - the input used as the meta block of a well-formed header (right header checksum, aligned
///   body offset, empty body) reads back as exactly `Meta::decode(input)`, or is rejected as
///   malformed metadata when that is `None`.
pub fn cache_entry(data: &[u8]) {
    let decoded = Meta::decode(data);
    if let Some(m) = &decoded {
        let again = Meta::decode(&m.encode());
        assert_eq!(again.as_ref(), Some(m), "Meta::decode(m.encode()) != m");
    }

    let file = scratch().lock().unwrap_or_else(|e| e.into_inner());
    rewrite(&file, data, data.len() as u64).expect("writing the scratch file");
    if let Ok((m, offset, body_len)) = entry::read_header(&file) {
        assert_eq!(
            offset.checked_add(body_len),
            Some(data.len() as u64),
            "read_header accepted an entry whose length is not offset + body_len"
        );
        assert_eq!(Meta::decode(&m.encode()).as_ref(), Some(&m));
    }

    // read_header refuses meta blocks over 1 MiB whatever they hold; libFuzzer's inputs are far
    // smaller, but a hand-fed file need not be.
    if data.len() > 1 << 20 {
        return;
    }
    // An empty body, so its checksum is never looked at (read_header does not read bodies).
    let header = entry::encode_header(data, 0, 0);
    rewrite(&file, &header, entry::body_offset(data.len())).expect("writing the scratch file");
    match (entry::read_header(&file), &decoded) {
        (Ok((m, offset, 0)), Some(d)) => {
            assert_eq!(&m, d, "read_header's meta differs from Meta::decode's");
            assert_eq!(offset, entry::body_offset(data.len()));
        }
        (Err(entry::CorruptEntry::Meta), None) => {}
        (got, want) => panic!(
            "a well-formed header around this meta block read back as {got:?}, expected {want:?}"
        ),
    }
}

/// The field-value readers the cache decides by, on UTF-8 input:
/// - `http::date::parse` never panics, and a date it accepts formats (IMF-fixdate) and reads
///   back as the same instant;
/// - `cache::targeted::parse` never panics, and accepts only what `sfv` parses as a Dictionary;
/// - `cache::variance::normalise` never panics and is idempotent for the fields it reorders or
///   lower-cases (`Accept-Language`, `Accept-Encoding`) and one it leaves as written: two
///   requests that select the same variant once always do.
pub fn cache_fields(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(t) = crate::http::date::parse(s) {
        let formatted = httpdate::fmt_http_date(t);
        assert_eq!(
            crate::http::date::parse(&formatted),
            Some(t),
            "{s:?} read as {formatted:?}, which does not read back"
        );
    }
    if crate::cache::targeted::parse(s).is_some() {
        assert!(
            sfv::Parser::new(s).parse::<sfv::Dictionary>().is_ok(),
            "targeted::parse accepted a non-Dictionary {s:?}"
        );
    }
    for name in ["accept-language", "accept-encoding", "cookie"] {
        let once = crate::cache::variance::normalise(name, Some(s));
        let twice = crate::cache::variance::normalise(name, Some(&once));
        assert_eq!(once, twice, "normalise({name}) is not idempotent on {s:?}");
    }
    // The Accept-Encoding a route sends upstream reads back as itself.
    let codings = ["br".to_string(), "gzip".to_string(), "zstd".to_string()];
    let once = crate::http::accept_encoding::canonical(Some(s), &codings);
    let twice = crate::http::accept_encoding::canonical(once.as_deref(), &codings);
    assert_eq!(
        once, twice,
        "Accept-Encoding {s:?} is not canonical once normalised"
    );
}

/// A PROXY protocol header: parsing never panics; a whole header lies within the bytes given
/// and within the bound taken, reads the same without the bytes after it, and every shorter
/// prefix of it is incomplete (never an error, never another header).
pub fn proxy_header(data: &[u8]) {
    use crate::net::proxy_protocol::{Parsed, V2_MAX, parse};
    let Ok(Parsed::Header { len, source }) = parse(data) else {
        return;
    };
    assert!(
        len <= data.len() && len <= V2_MAX,
        "header of {len} bytes in {}",
        data.len()
    );
    assert_eq!(parse(&data[..len]), Ok(Parsed::Header { len, source }));
    for cut in [0, len / 2, len - 1] {
        assert_eq!(
            parse(&data[..cut]),
            Ok(Parsed::Incomplete),
            "prefix of {cut} of {len}"
        );
    }
}

/// An HTTP/2 request head converted for the request path (`server::h2::request::to_request`),
/// against what the HTTP/1.1 parser makes of the same head written as HTTP/1.1 (method, path,
/// the fields the conversion kept, in its order): the two agree on whether the request is taken
/// and, when it is, on its method, target, host, fields and body framing; when it is not, on the
/// status. So an HTTP/2 client reaches nothing an HTTP/1.1 client could not. The input is split
/// at 0xFF: method, path, authority, then name/value pairs; what the `http` crate (and so the
/// `h2` crate) would not carry is skipped.
pub fn h2_request(data: &[u8]) {
    use crate::server::h2::request::{Refusal, to_request};
    let mut data_fields = data.split(|&b| b == 0xff);
    let (Some(method), Some(path), Some(authority)) =
        (data_fields.next(), data_fields.next(), data_fields.next())
    else {
        return;
    };
    let ended = method.first().is_some_and(|b| b & 1 == 1);
    let method = method.get(1..).unwrap_or_default();
    let mut uri = http::Uri::builder();
    if !authority.is_empty() {
        uri = uri.scheme("https").authority(authority);
    }
    let Ok(uri) = uri.path_and_query(path).build() else {
        return;
    };
    let Ok(req) = http::Request::builder().method(method).uri(uri).body(()) else {
        return;
    };
    let (mut parts, ()) = req.into_parts();
    let mut rest = data_fields;
    // Names as the `h2` crate makes them from HPACK (`from_lowercase`, wider than a token:
    // it passes `"`), so the target sees what the crate hands over.
    while let (Some(n), Some(v)) = (rest.next(), rest.next()) {
        let (Ok(n), Ok(v)) = (
            http::HeaderName::from_lowercase(n),
            http::HeaderValue::from_bytes(v),
        ) else {
            return;
        };
        parts.headers.append(n, v);
    }
    let h1 = h1_form(&parts);
    let parsed = request::parse(&h1, REQUEST_LIMITS);
    match to_request(&parts, ended, REQUEST_LIMITS) {
        Ok(kept) => match parsed {
            Ok(Some((h, n))) => {
                assert_eq!(n, h1.len(), "the HTTP/1.1 form read as a shorter request");
                assert_eq!(h.method, kept.method);
                assert_eq!(h.target, kept.target);
                assert_eq!(h.host, kept.host);
                assert_eq!(h.fields, kept.fields);
                assert_eq!(h.expect_continue, kept.expect_continue);
                assert!(!kept.close && kept.upgrade.is_none() && kept.h2);
                // A stream whose HEADERS did not end it and that announced no length: its
                // body ends with the stream, where HTTP/1.1 reads none; a stream its HEADERS
                // ended has none whatever it announced (zero, written long); otherwise the
                // same framing.
                let want = match kept.body {
                    request::BodyFraming::EndStream => {
                        assert!(!ended && parts.headers.get("content-length").is_none());
                        request::BodyFraming::None
                    }
                    request::BodyFraming::None => request::BodyFraming::None,
                    other => other,
                };
                let got = match h.body {
                    request::BodyFraming::Length(_) if ended => request::BodyFraming::None,
                    other => other,
                };
                assert_eq!(got, want, "body framing");
            }
            Ok(None) => panic!("the HTTP/1.1 form of a converted head is incomplete"),
            Err(e) => panic!("converted, yet the HTTP/1.1 parser refuses its form: {e}"),
        },
        // The checks every request gets: the HTTP/1.1 parser refuses the same head, with the
        // same status.
        Err(Refusal::Invalid(e)) => match parsed {
            Err(h1e) => assert_eq!(h1e.status(), e.status(), "{e} / {h1e}"),
            other => panic!("refused ({e}), yet the HTTP/1.1 parser takes its form: {other:?}"),
        },
        // What HTTP/2 alone forbids (RFC 9113 §8.2-8.3): nothing to compare.
        Err(Refusal::Malformed(_) | Refusal::Status(..)) => {}
    }
}

/// The HTTP/1.1 form of an HTTP/2 head, written independently of the conversion: the request
/// line, the fields in order but `host` and `cookie`, then `host` (`:authority` when sent), then
/// the cookies joined (RFC 9113 §8.2.3).
fn h1_form(parts: &http::request::Parts) -> Vec<u8> {
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("");
    let mut out = format!("{} {path} HTTP/1.1\r\n", parts.method.as_str()).into_bytes();
    let mut line = |n: &str, v: &[u8]| {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    };
    for (n, v) in &parts.headers {
        if n != "host" && n != "cookie" {
            line(n.as_str(), v.as_bytes());
        }
    }
    let host = parts
        .uri
        .authority()
        .map(|a| a.as_str().as_bytes())
        .or(parts.headers.get("host").map(|h| h.as_bytes()));
    if let Some(h) = host {
        line("host", h);
    }
    let cookies: Vec<&[u8]> = parts
        .headers
        .get_all("cookie")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if !cookies.is_empty() {
        line("cookie", &cookies.join(&b"; "[..]));
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The edge rules (`cache::rules`) on a request as a client sends it, under a fixed route with a
/// query rule and rules of every action that edits: the query's normalisation is idempotent and
/// keeps the path; every field a rule writes is a field (a token, a value without CR, LF or NUL);
/// a redirect's `Location` is one line; and the request sent upstream, written out in its
/// version, parses again as the same request (method, target, host).
pub fn edge_rules(data: &[u8]) {
    use crate::cache::rules::{Answer, Rules, query::QueryNorm};
    use crate::http::field_edit::FieldEdits;
    type Compiled = (zerocache_ledger::Accounting, Rules, Option<QueryNorm>);
    static RULES: std::sync::OnceLock<Compiled> = std::sync::OnceLock::new();
    let Ok(Some((mut req, _))) = request::parse(data, REQUEST_LIMITS) else {
        return;
    };
    // The accounting is kept with the rules, whose counters it holds: nothing for the leak
    // checker to report.
    let (_, rules, query) = RULES.get_or_init(|| {
        let cfg = zerocache_config::parse(EDGE_RULES, "fuzz.yaml").expect("the harness's config");
        let acc = zerocache_ledger::Accounting::new(16, false);
        let route = &cfg.routes[0];
        let rules = Rules::new(route, acc.route("site")).expect("compiles");
        (acc, rules, QueryNorm::new(&route.query))
    });
    if let Some(t) = query.as_ref().and_then(|q| q.apply(&req.target)) {
        assert_eq!(
            t.split('?').next(),
            Some(req.path()),
            "the path changed: {t}"
        );
        let again = query.as_ref().and_then(|q| q.apply(&t));
        assert_eq!(again, None, "not idempotent: {t}");
        req.target = t;
    }
    let limiter = crate::rate_limit::Limiter::new(64);
    let mut edits = FieldEdits::default();
    let client = std::net::IpAddr::from([192, 0, 2, 1]);
    let v = rules.on_request(&mut req, client, &limiter, 0, &mut edits);
    for (_, name, value) in edits.iter() {
        assert!(zerocache_config::rules_check::is_token(name), "{name}");
        assert!(
            !value.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)),
            "{value:?}"
        );
    }
    if let Some(Answer::Redirect(_, location)) = &v.answer {
        assert!(!location.contains(['\r', '\n', '\0']), "{location:?}");
    }
    let version = if req.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let mut h1 = format!("{} {} {version}\r\n", req.method, req.target).into_bytes();
    // `Host` as the upstream request writes it: from the request's host, which an absolute-form
    // target decides over the field.
    if !req.host.is_empty() {
        h1.extend_from_slice(format!("Host: {}\r\n", req.host).as_bytes());
    }
    for (k, val) in req
        .fields
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("host"))
    {
        h1.extend_from_slice(k.as_bytes());
        h1.extend_from_slice(b": ");
        h1.extend_from_slice(val);
        h1.extend_from_slice(b"\r\n");
    }
    h1.extend_from_slice(b"\r\n");
    match request::parse(&h1, REQUEST_LIMITS) {
        Ok(Some((sent, _))) => {
            assert_eq!(
                (&sent.method, &sent.target, &sent.host),
                (&req.method, &req.target, &req.host)
            );
        }
        // The rules' fields took it past the field count (or size) a client may send: the origin
        // may refuse it, as it may any large request; nothing is misread.
        Err(request::RequestError::HeadTooLarge) => {}
        other => panic!(
            "the upstream request does not parse: {other:?}\n{}",
            String::from_utf8_lossy(&h1)
        ),
    }
}

/// The route [`edge_rules`] runs: a query rule, and rules that redirect with groups, edit both
/// sides with templates, key on a field and split by URL.
const EDGE_RULES: &str = r#"listen: 127.0.0.1:1
cache: { path: /tmp/zerocache-fuzz, max_size: 1MiB }
upstreams:
  o: { servers: ["127.0.0.1:2"] }
  canary: { servers: ["127.0.0.1:3"] }
routes:
  - name: site
    match: { path_prefix: / }
    upstream: o
    query: { sort: true, keep: ["*"], drop: ["utm_*", "fbclid", "a*b*c"] }
    rules:
      - name: tag
        request_headers: { set: { X-Path: "$path$query" }, append: { X-Edge-Host: "$host via $route" }, remove: [X-Debug] }
        response_headers: { set: { X-Target: "$target", X-Client: "$client" } }
      - name: beta
        match: { headers: [{ name: X-Beta, regex: "^[0-9]+$" }], cookies: [s] }
        request_headers: { set: { X-Variant: "b-$method" } }
      - name: split
        upstream: { to: canary, percent: 50, key: url }
      - name: old
        match: { path_regex: "^/blog/([^/]*)/(.*)$" }
        redirect: { status: 301, location: "https://$host/p/$2?y=$1$query" }
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::{Duration, UNIX_EPOCH};

    fn corpus() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus")
    }

    /// The Meta seeds of the committed `cache_entry` corpus, as the real encoder writes them.
    fn meta_seeds() -> Vec<(&'static str, Vec<u8>)> {
        let plain = Meta {
            key: "GET|http|example.com|/index.html".into(),
            stored_at: UNIX_EPOCH + Duration::from_millis(1_767_225_600_000),
            initial_age: Duration::from_secs(3),
            lifetime: Duration::from_secs(600),
            status: 200,
            reason: "OK".into(),
            fields: b"Content-Type: text/html\r\nCache-Control: max-age=600\r\nETag: \"v1\"\r\n"
                .to_vec(),
            vary: vec![],
            url: "GET|http|example.com|/index.html".into(),
        };
        let varied = Meta {
            key: "GET|https|cdn.example.com|/app.js?v=2|accept-encoding=gzip".into(),
            stored_at: UNIX_EPOCH + Duration::from_millis(1_767_225_600_123),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(86_400),
            status: 203,
            reason: "Non-Authoritative Information".into(),
            fields: concat!(
                "Content-Type: application/javascript\r\n",
                "Vary: Accept-Encoding, Accept-Language\r\n",
                "Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\n",
            )
            .as_bytes()
            .to_vec(),
            vary: vec!["accept-encoding".into(), "accept-language".into()],
            url: "GET|https|cdn.example.com|/app.js?v=2".into(),
        };
        let meta = plain.encode();
        let body = b"<html>hello</html>\n";
        let mut file = entry::encode_header(&meta, body.len() as u64, entry::body_checksum(body));
        file.resize(entry::body_offset(meta.len()) as usize, 0);
        file.extend_from_slice(body);
        vec![
            ("meta-plain", meta),
            ("meta-vary", varied.encode()),
            ("entry-file", file),
        ]
    }

    /// The committed Meta seeds are what the encoder writes now; `ZEROCACHE_WRITE_SEEDS=1` with
    /// `cargo test -p zerocache --features fuzzing --lib fuzzing` rewrites them after a format
    /// change.
    #[test]
    fn meta_seeds_are_the_encoders_output() {
        let dir = corpus().join("cache_entry");
        for (name, bytes) in meta_seeds() {
            let path = dir.join(name);
            if std::env::var_os("ZEROCACHE_WRITE_SEEDS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            }
            let committed = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (ZEROCACHE_WRITE_SEEDS=1 writes it)",
                    path.display()
                )
            });
            assert!(
                committed == bytes,
                "{} is stale: rerun with ZEROCACHE_WRITE_SEEDS=1",
                path.display()
            );
        }
    }

    /// Every committed seed (and crash regression) passes its harness on the stable toolchain.
    #[test]
    fn committed_corpus_passes() {
        type Harness = fn(&[u8]);
        let targets: [(&str, Harness); 9] = [
            ("request_head", request_head),
            ("chunked", chunked),
            ("response_head", response_head),
            ("cache_entry", cache_entry),
            ("cache_fields", cache_fields),
            ("proxy_header", proxy_header),
            ("h2_request", h2_request),
            ("edge_rules", edge_rules),
            ("ranges", ranges),
        ];
        for (target, harness) in targets {
            let dir = corpus().join(target);
            let mut n = 0;
            for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
                let path = e.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                if std::panic::catch_unwind(|| harness(&bytes)).is_err() {
                    panic!("{} fails its harness", path.display());
                }
                n += 1;
            }
            assert!(n > 0, "no seed in {}", dir.display());
        }
    }
}
