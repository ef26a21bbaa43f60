//! Cache tags (surrogate keys): an origin response names the groups it belongs to in one field,
//! `Surrogate-Key` by default (space-separated, as Fastly and Varnish's xkey read it) or
//! `Cache-Tag` (comma-separated, as Cloudflare reads it), and a purge by tag removes (or, soft,
//! makes stale) every stored response with any of the tags. The tags are read from the stored
//! response's own fields, so they are persisted with it and rebuilt with the index at start.
//!
//! What is taken is bounded: at most [`MAX_TAGS`] tags per response, each at most
//! `zerocache_ops::MAX_TAG_LEN` bytes of visible ASCII; the rest of a hostile or runaway list is ignored, not
//! stored, and the response is still cached with the tags that fit. The field is for the cache,
//! so clients do not see it unless `cache.tag_field_forward` says so (a tier below reads it).

use crate::http::stored_fields::StoredFields;

/// Tags kept per response.
pub const MAX_TAGS: usize = 256;
use zerocache_ops::valid_tag as valid;

/// How the field separates its tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Separator {
    /// Whitespace (`Surrogate-Key: a b c`).
    Space,
    /// Commas, with optional whitespace (`Cache-Tag: a, b,c`).
    Comma,
}

/// The tag field of `cache.tag_field`, how it separates tags, and whether clients see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagField {
    name: String,
    separator: Separator,
    forward: bool,
}

impl Default for TagField {
    fn default() -> Self {
        TagField::new("Surrogate-Key", Separator::Space, false)
    }
}

impl TagField {
    /// `cache.tag_field`, `cache.tag_separator`, `cache.tag_field_forward`.
    pub fn new(name: &str, separator: Separator, forward: bool) -> TagField {
        TagField {
            name: name.to_ascii_lowercase(),
            separator,
            forward,
        }
    }

    /// The field's name, lower case.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether clients see the field.
    pub fn forward(&self) -> bool {
        self.forward
    }

    /// The tags of a stored response's fields (`Name: value\r\n` lines), in order, without
    /// duplicates, bounded (see the module doc).
    pub fn parse(&self, fields: &[u8]) -> Vec<String> {
        let mut tags: Vec<String> = Vec::new();
        for line in StoredFields(fields).named(&self.name) {
            let Ok(value) = std::str::from_utf8(line.value) else {
                continue;
            };
            let words: Box<dyn Iterator<Item = &str>> = match self.separator {
                Separator::Space => Box::new(value.split_ascii_whitespace()),
                Separator::Comma => Box::new(value.split(',').map(str::trim)),
            };
            for t in words {
                if tags.len() == MAX_TAGS {
                    return tags;
                }
                if valid(t) && !tags.iter().any(|k| k == t) {
                    tags.push(t.to_string());
                }
            }
        }
        tags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocache_ops::MAX_TAG_LEN;

    #[test]
    fn surrogate_keys_are_space_separated_and_cache_tags_comma_separated() {
        let f = b"Content-Type: text/plain\r\nSurrogate-Key: a b  page:1\r\nsurrogate-key: b c\r\n";
        assert_eq!(
            TagField::default().parse(f),
            vec!["a", "b", "page:1", "c"],
            "every line of the field, duplicates once"
        );
        let cf = b"Cache-Tag: news, sports ,  ,x\r\n";
        assert_eq!(
            TagField::new("Cache-Tag", Separator::Comma, false).parse(cf),
            vec!["news", "sports", "x"]
        );
        assert!(TagField::default().parse(b"Cache-Tag: a\r\n").is_empty());
    }

    #[test]
    fn a_hostile_list_is_bounded_and_bad_tags_are_skipped() {
        let long = "x".repeat(MAX_TAG_LEN + 1);
        let many: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
        let fields = format!(
            "Surrogate-Key: ok {long} bad,comma caf\u{e9} {}\r\n",
            many.join(" ")
        );
        let tags = TagField::default().parse(fields.as_bytes());
        assert_eq!(tags.len(), MAX_TAGS);
        assert_eq!(tags[0], "ok");
        assert_eq!(tags[1], "t0", "too long, a comma, non-ASCII: skipped");
        assert_eq!(tags[MAX_TAGS - 1], format!("t{}", MAX_TAGS - 2));
        assert!(valid(&"y".repeat(MAX_TAG_LEN)));
        assert!(!valid(""));
        assert!(!valid("a b"));
        assert!(!valid("a\u{7f}"));
    }
}
