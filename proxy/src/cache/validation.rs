//! Revalidating a stored response with the origin (RFC 9111 §4.3): the conditional request it
//! sends, and how a 304 updates the stored header fields (§3.2, §4.3.4).

use super::entry::Entry;
use super::policy;
use crate::http::headers;
use crate::http::response::ResponseHead;
use crate::http::stored_fields::StoredFields;

/// The validators to send for `e`: `If-None-Match` with its ETag and `If-Modified-Since` with
/// its Last-Modified, whichever it has.
pub fn conditional_fields(e: &Entry) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(etag) = &e.etag {
        out.push(("If-None-Match", etag.clone()));
    }
    if let Some(lm) = &e.last_modified {
        out.push(("If-Modified-Since", lm.clone()));
    }
    out
}

/// Fields a 304 must not change in the stored response: the proxy's own, and what the stored
/// body's bytes and its selection depend on (framing, `Content-Range`, `Content-Encoding`,
/// `Vary`). A 304 that disagrees with them describes another representation, not this one.
fn never_updated(name: &str) -> bool {
    policy::proxy_owned(name)
        || ["content-encoding", "content-range", "vary"]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f))
}

/// Fields a 304 carries for the client whose request caused it, never for the shared entry:
/// `Set-Cookie`. A deliberate narrowing of RFC 9111 §3.2's header update, for the privacy
/// reasons of §7.3: merged, one user's session cookie would be served to every later client.
pub fn for_requester_only(name: &str) -> bool {
    name.eq_ignore_ascii_case("set-cookie")
}

/// The 304's fields that go to the client that caused it and nowhere else (see
/// [`for_requester_only`]), as header lines: they replace the stored fields of their name in
/// that one response (§4.3.4).
pub fn requester_fields(not_modified: &ResponseHead) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in &not_modified.fields {
        if for_requester_only(k) {
            headers::put(&mut out, k, v);
        }
    }
    out
}

/// The stored header block updated by a 304 (§3.2): every field the 304 carries replaces the
/// stored field of that name, except hop-by-hop fields, the fields [`never_updated`] keeps and
/// those that are [`for_requester_only`].
pub fn merge_304(stored: &[u8], not_modified: &ResponseHead) -> Vec<u8> {
    let tokens = headers::connection_tokens(
        not_modified
            .fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice())),
    );
    let updated: Vec<&(String, Vec<u8>)> = not_modified
        .fields
        .iter()
        .filter(|(k, _)| {
            !headers::is_hop_by_hop(k, &tokens) && !never_updated(k) && !for_requester_only(k)
        })
        .collect();
    let mut out = Vec::with_capacity(stored.len() + 128);
    for line in StoredFields(stored).lines() {
        if updated
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case(line.name))
        {
            continue;
        }
        out.extend_from_slice(line.raw);
    }
    for (k, v) in updated {
        headers::put(&mut out, k, v);
    }
    out
}

/// Whether a 200 to a HEAD describes the stored GET response (RFC 9111 §4.3.5): every validator
/// it carries (`ETag`, `Last-Modified`) equals the stored one, and its `Content-Length`, if any,
/// is the stored body's length. When it does, its fields update the stored ones as a 304's
/// would; when it does not, the stored response is to be considered stale.
pub fn head_matches(
    head: &ResponseHead,
    etag: Option<&str>,
    last_modified: Option<&str>,
    body_len: u64,
) -> bool {
    let same = |received: Option<&str>, stored: Option<&str>| match received {
        None => true,
        Some(r) => stored.is_some_and(|s| s.trim() == r.trim()),
    };
    same(head.field("etag"), etag)
        && same(head.field("last-modified"), last_modified)
        && match crate::http::framing::content_length(
            head.fields
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.as_slice()),
        ) {
            Ok(None) => true,
            Ok(Some(n)) => n == body_len,
            Err(_) => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc9111_4_3_5_a_head_response_matches_by_every_validator_it_carries() {
        let head = |extra: &str| crate::http::response::test_response(200, extra);
        let lm = "Sat, 01 Jan 2000 00:00:00 GMT";
        let etag = Some("\"a\"");
        assert!(head_matches(
            &head("ETag: \"a\"\r\nContent-Length: 5\r\n"),
            etag,
            Some(lm),
            5
        ));
        assert!(head_matches(&head(""), etag, Some(lm), 5));
        assert!(head_matches(
            &head(&format!("Last-Modified: {lm}\r\n")),
            None,
            Some(lm),
            5
        ));
        assert!(!head_matches(&head("ETag: \"b\"\r\n"), etag, Some(lm), 5));
        assert!(!head_matches(&head("ETag: W/\"a\"\r\n"), etag, Some(lm), 5));
        assert!(!head_matches(&head("ETag: \"a\"\r\n"), None, Some(lm), 5));
        assert!(!head_matches(
            &head("Content-Length: 6\r\n"),
            etag,
            Some(lm),
            5
        ));
        assert!(!head_matches(
            &head("Content-Length: +5\r\n"),
            etag,
            Some(lm),
            5
        ));
        assert!(!head_matches(
            &head("Last-Modified: Sun, 02 Jan 2000 00:00:00 GMT\r\n"),
            etag,
            Some(lm),
            5
        ));
    }

    #[test]
    fn rfc9111_3_2_a_304_replaces_stored_fields_but_not_content_length() {
        let stored =
            b"Cache-Control: max-age=5\r\nETag: \"a\"\r\nX-Old: 1\r\nContent-Type: text/plain\r\n";
        let r304 = crate::http::response::parse(
            b"HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=60\r\nETag: \"a\"\r\nX-New: 2\r\nContent-Length: 99\r\nConnection: X-Hop\r\nX-Hop: 1\r\n\r\n",
        )
        .expect("ok")
        .expect("complete")
        .0;
        let merged = String::from_utf8(merge_304(stored, &r304)).expect("utf8");
        assert_eq!(
            merged,
            "X-Old: 1\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nETag: \"a\"\r\nX-New: 2\r\n"
        );
    }

    #[test]
    fn a_304_never_puts_its_set_cookie_or_representation_fields_into_the_stored_block() {
        let stored = b"Set-Cookie: site=1\r\nVary: Accept\r\nContent-Range: bytes 0-4/5\r\nContent-Encoding: gzip\r\nX-A: 1\r\n";
        let r304 = crate::http::response::parse(
            b"HTTP/1.1 304 Not Modified\r\nSet-Cookie: sess=alice\r\nSet-Cookie: b=2\r\nVary: Cookie\r\nContent-Range: bytes 0-1/9\r\nContent-Encoding: br\r\nX-A: 2\r\n\r\n",
        )
        .expect("ok")
        .expect("complete")
        .0;
        let merged = String::from_utf8(merge_304(stored, &r304)).expect("utf8");
        assert_eq!(
            merged,
            "Set-Cookie: site=1\r\nVary: Accept\r\nContent-Range: bytes 0-4/5\r\nContent-Encoding: gzip\r\nX-A: 2\r\n"
        );
        assert_eq!(
            String::from_utf8(requester_fields(&r304)).expect("utf8"),
            "Set-Cookie: sess=alice\r\nSet-Cookie: b=2\r\n"
        );
        let none = crate::http::response::test_response(304, "ETag: \"a\"\r\n");
        assert!(requester_fields(&none).is_empty());
    }
}
