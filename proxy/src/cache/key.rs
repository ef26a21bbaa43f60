//! Cache keys. A key is the request's method class, scheme, host and target, joined into one
//! string that the entry file stores in full, plus a 128-bit hash of it that names the file.
//!
//! The text is `GET http://host/target`, then for each key field of the route `\n` + name +
//! `=` + the value's length + `:` + the value (`!` for an absent field). No two different
//! requests can share a text: the method class is a token (no SP), the host has passed the
//! `uri-host` grammar (no SP, no `/`), the target begins with `/` and holds no SP or LF (the
//! request line's grammar), and the field values are length-prefixed, so a `|` or `=` in a
//! target or a value is only ever itself.
//!
//! Why these parts and nothing more: the host is lower-cased and its default port dropped (those
//! spellings are one origin resource), but the path and query are kept byte for byte as received,
//! because decoding `%2F` or reordering a query could make two different resources one entry.
//! Why xxh3-128: fast (the key is hashed on every request), and 128 bits make an accidental
//! collision practically impossible; a lookup still compares the full key, so even a forced
//! collision can only turn a hit into a miss, never serve another URL's body.

use xxhash_rust::xxh3::xxh3_128;

/// A cache key: the full text and its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    /// `method-class scheme://host target` (see the module doc). Bytes: ~11 + host + target.
    pub text: String,
    /// xxh3-128 of `text` (masked to fewer bits only when a test forces collisions). 16 bytes.
    pub hash: u128,
}

impl CacheKey {
    /// The key of a request. GET and HEAD share the `GET` class: a HEAD can be answered from a
    /// stored GET response.
    pub fn new(method: &str, scheme: &str, host: &str, target: &str, hash_bits: u32) -> CacheKey {
        let class = if method == "HEAD" { "GET" } else { method };
        let text = format!("{class} {scheme}://{host}{target}");
        let mut hash = xxh3_128(text.as_bytes());
        if hash_bits < 128 {
            hash &= (1u128 << hash_bits) - 1;
        }
        CacheKey { text, hash }
    }

    /// A key from its full text (secondary keys are built as text).
    pub fn from_text(text: String, hash_bits: u32) -> CacheKey {
        let mut hash = xxh3_128(text.as_bytes());
        if hash_bits < 128 {
            hash &= (1u128 << hash_bits) - 1;
        }
        CacheKey { text, hash }
    }

    /// The file name: the hash in hex, 32 characters. `store::layout` writes the path in one
    /// buffer; this and [`CacheKey::shard`] spell it out for its test.
    #[cfg(test)]
    pub fn file_name(hash: u128) -> String {
        format!("{hash:032x}")
    }

    /// The shard directories (`ab/cd` for two levels), from the hash's low bytes so they stay
    /// spread even when a test masks the high bits away.
    #[cfg(test)]
    pub fn shard(hash: u128, levels: u8) -> std::path::PathBuf {
        (0..levels)
            .map(|i| format!("{:02x}", (hash >> (8 * i as u32)) & 0xff))
            .collect()
    }

    /// Appends the key parts a route adds: the values of `headers` in the request (an absent
    /// field is marked apart from an empty one).
    pub fn with_headers(
        mut self,
        headers: &[String],
        value: impl Fn(&str) -> Option<String>,
        hash_bits: u32,
    ) -> CacheKey {
        if headers.is_empty() {
            return self;
        }
        for h in headers {
            self.text.push('\n');
            self.text.push_str(&h.to_ascii_lowercase());
            match value(h) {
                Some(v) => {
                    self.text.push('=');
                    self.text.push_str(&v.len().to_string());
                    self.text.push(':');
                    self.text.push_str(&v);
                }
                None => self.text.push('!'),
            }
        }
        self.hash = xxh3_128(self.text.as_bytes());
        if hash_bits < 128 {
            self.hash &= (1u128 << hash_bits) - 1;
        }
        self
    }
}

impl CacheKey {
    /// Appends the names of the edge rules that edited the request on a match beyond the URL
    /// (`cache::rules`): `\n:rules=` + length + `:` + names. A field name cannot hold `:`, so
    /// this part is never a key field's.
    pub fn with_rules(mut self, rules: Option<&str>, hash_bits: u32) -> CacheKey {
        let Some(r) = rules else { return self };
        self.text.push_str(&format!("\n:rules={}:{r}", r.len()));
        self.hash = xxh3_128(self.text.as_bytes());
        if hash_bits < 128 {
            self.hash &= (1u128 << hash_bits) - 1;
        }
        self
    }

    /// Whether the key has the rules' part: a request whose response depends on something only
    /// this node saw of its client, so it is never forwarded to a fleet owner.
    pub fn has_rules(&self) -> bool {
        self.text.contains("\n:rules=")
    }
}

/// The URL scheme of a request, by the listener it came in on: part of the cache key, so an
/// origin's `http`→`https` redirect cached for plain clients is never served to TLS clients.
pub(crate) fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// A URL key text and its `https` twin: an invalidation or a purge removes what either
/// listener stored for the URL.
pub(crate) fn with_https_twin(text: String) -> Vec<String> {
    let twin = text.replacen(" http://", " https://", 1);
    if twin == text {
        vec![text]
    } else {
        vec![text, twin]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_shares_get_and_nothing_else_is_normalised() {
        let get = CacheKey::new("GET", "http", "a.example", "/x?b=1&a=2", 128);
        let head = CacheKey::new("HEAD", "http", "a.example", "/x?b=1&a=2", 128);
        assert_eq!(get, head);
        assert_eq!(get.text, "GET http://a.example/x?b=1&a=2");
        let reordered = CacheKey::new("GET", "http", "a.example", "/x?a=2&b=1", 128);
        assert_ne!(get.hash, reordered.hash);
        let encoded = CacheKey::new("GET", "http", "a.example", "/a%2Fb", 128);
        let plain = CacheKey::new("GET", "http", "a.example", "/a/b", 128);
        assert_ne!(encoded.hash, plain.hash);
    }

    #[test]
    fn masked_hashes_collide_but_texts_differ() {
        let a = CacheKey::new("GET", "http", "h", "/a", 1);
        let b = CacheKey::new("GET", "http", "h", "/b", 1);
        let c = CacheKey::new("GET", "http", "h", "/c", 1);
        // With one bit, two of any three keys share a hash.
        assert!(a.hash == b.hash || a.hash == c.hash || b.hash == c.hash);
        assert_ne!(a.text, b.text);
        assert_eq!(
            CacheKey::file_name(0xab),
            "000000000000000000000000000000ab"
        );
        assert_eq!(
            CacheKey::shard(0x1234, 2),
            std::path::PathBuf::from("34/12")
        );
        assert_eq!(CacheKey::shard(0x1234, 0), std::path::PathBuf::new());
        let k = CacheKey::new("GET", "http", "h", "/a", 128).with_headers(
            &["Accept-Encoding".into(), "X-Absent".into()],
            |h| (h == "Accept-Encoding").then(|| "gzip".into()),
            128,
        );
        assert_eq!(k.text, "GET http://h/a\naccept-encoding=4:gzip\nx-absent!");
    }

    #[test]
    fn different_requests_never_share_a_text() {
        let tenant = ["X-Tenant".to_string(), "X-Region".to_string()];
        let key = |target: &str, t: Option<&str>, r: Option<&str>| {
            CacheKey::new("GET", "http", "h", target, 128)
                .with_headers(
                    &tenant,
                    |h| if h == "X-Tenant" { t } else { r }.map(str::to_string),
                    128,
                )
                .text
        };
        // Each pair collided under the old `|`-joined encoding.
        let pairs = [
            (
                key("/x", Some("a|x-region=b"), Some("c")),
                key("/x", Some("a"), Some("b|x-region=c")),
            ),
            (key("/x", Some("a=b"), None), key("/x", Some("a"), None)),
            (key("/x|x-tenant=a", None, None), key("/x", Some("a"), None)),
        ];
        for (a, b) in pairs {
            assert_ne!(a, b);
        }
    }
}
