//! Invalidation (RFC 9111 §4.4) and purge: which stored URLs an unsafe request or an operator's
//! purge removes, expressed as the URL key texts the store indexes entries under.

use super::key::CacheKey;
use crate::http::response::ResponseHead;
use crate::http::target::{self, PathRules};

/// URLs named by a purge or a `Location` are normalised as request targets are, so they name
/// the keys requests were stored under; nothing is refused that some config could have stored.
const ANY_PATH: PathRules = PathRules {
    reject_backslash: false,
    reject_parameters: false,
    reject_encoded_traversal: false,
};

/// Methods known to be safe (RFC 9110 §9.2.1); every other method, unknown ones included,
/// invalidates.
pub fn is_safe(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE")
}

/// The URL key text for `host` and `target`, as lookups build it.
pub fn url_text(host: &str, target: &str, keep_query: bool) -> String {
    let target = if keep_query {
        target
    } else {
        target::path_of(target)
    };
    CacheKey::new("GET", "http", host, target, 128).text
}

/// Splits `http://host/path` (or `https://`) into host and target, both normalised the way a
/// request's are (see `http::target`); `None` when either is not the grammar.
pub fn split_absolute(uri: &str) -> Option<(String, String)> {
    let rest = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let host = target::authority(authority, "80").ok()?;
    let path = target::normalise(path, ANY_PATH).ok()?;
    (!host.is_empty()).then_some((host, path))
}

/// The URL key texts a non-error response to an unsafe request invalidates: the target URI,
/// and `Location` and `Content-Location` when they share the request's origin. `key_of` makes
/// a target on `host` (normalised by the request grammar) the URL key text a request for it
/// would be stored under: its route's `query` rules and `cache_key.query`, so a `Location` of
/// `/a?utm_source=x&b=1` invalidates what `/a?b=1` stored.
pub fn invalidated(
    host: &str,
    target: &str,
    res: &ResponseHead,
    key_of: impl Fn(&str) -> String,
) -> Vec<String> {
    let mut out = vec![key_of(target)];
    for field in ["location", "content-location"] {
        let Some(v) = res.field(field) else { continue };
        let v = v.trim();
        let same_origin = if v.starts_with('/') {
            target::normalise(v, ANY_PATH).ok()
        } else {
            split_absolute(v).and_then(|(h, t)| (h == host).then_some(t))
        };
        if let Some(t) = same_origin {
            let u = key_of(&t);
            if !out.contains(&u) {
                out.push(u);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc9111_4_4_targets_location_and_content_location_on_the_same_origin() {
        let res = crate::http::response::parse(
            b"HTTP/1.1 201 Created\r\nLocation: /items/7\r\nContent-Location: http://OTHER.example/x\r\n\r\n",
        )
        .expect("ok")
        .expect("complete")
        .0;
        assert_eq!(
            invalidated("shop.example", "/items", &res, |t| url_text(
                "shop.example",
                t,
                true
            )),
            vec![
                "GET http://shop.example/items",
                "GET http://shop.example/items/7"
            ]
        );
        let same = crate::http::response::parse(
            b"HTTP/1.1 200 OK\r\nContent-Location: http://shop.example:80/a?b\r\n\r\n",
        )
        .expect("ok")
        .expect("complete")
        .0;
        assert_eq!(
            invalidated("shop.example", "/items", &same, |t| url_text(
                "shop.example",
                t,
                false
            )),
            vec!["GET http://shop.example/items", "GET http://shop.example/a"]
        );
        assert!(is_safe("GET") && !is_safe("POST") && !is_safe("M-SEARCH"));
    }

    #[test]
    fn purge_and_location_urls_name_the_keys_requests_are_stored_under() {
        // Requests are keyed by their normalised target: so are the URLs that remove them.
        assert_eq!(
            split_absolute("http://Shop.Example:80/a/%7Eb/../c"),
            Some(("shop.example".to_string(), "/a/c".to_string()))
        );
        assert_eq!(split_absolute("http://shop.example|x/a"), None);
        let res = crate::http::response::parse(
            b"HTTP/1.1 201 Created\r\nLocation: /items/%37/./\r\n\r\n",
        )
        .expect("ok")
        .expect("complete")
        .0;
        assert_eq!(
            invalidated("shop.example", "/items", &res, |t| url_text(
                "shop.example",
                t,
                true
            )),
            vec![
                "GET http://shop.example/items",
                "GET http://shop.example/items/7/"
            ]
        );
    }
}
