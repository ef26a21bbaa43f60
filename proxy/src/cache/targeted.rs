//! Targeted cache-control fields (RFC 9213): `CDN-Cache-Control` and any operator-chosen field
//! that governs zerocache's caching in place of `Cache-Control` and `Expires`.
//!
//! A targeted field is a Structured Field Dictionary (RFC 9651), parsed by `sfv`, not by the
//! lenient `Cache-Control` parser: §2.1 says the two differ in error handling, and a field that is
//! empty or fails to parse is ignored as if absent, so `Cache-Control` applies again. One rule for
//! well-formed fields with a wrongly typed value (§2.1 only says not to use the value): a known
//! directive whose value has the wrong type (`max-age="60"`, `max-age=1.5`, `max-age=-1`,
//! `no-store=?0`, `no-store=5`) makes the whole field invalid, so the origin's `Cache-Control`
//! decides instead of a half-read targeted policy. Unknown directives are ignored whatever their
//! type, and parameters on any directive are ignored (§2.1). A strict parser rejects upper-case
//! keys (`MaX-aGe`): such a field is invalid too.
//!
//! The fields are forwarded downstream by default (a tiered deployment, zerocache behind
//! zerocache or in front of another CDN, needs them; RFC 9213 §2.2 requires passing through only
//! the fields not on the target list, so hiding the ones on it is an operator's choice:
//! `cache.targeted_fields_forward: false`).

use crate::http::stored_fields::StoredFields;
use std::borrow::Cow;

use sfv::{BareItem, Dictionary, ListEntry, Parser};

use super::directives::{self, ResponseDirectives};

/// The target list (RFC 9213 §2.2), in priority order, and whether the fields reach clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targeted {
    /// Lower-cased field names, most applicable first.
    names: Vec<String>,
    /// `cache.targeted_fields_forward`.
    forward: bool,
    /// Other fields for the cache alone, never shown to clients (the cache tag field, unless it
    /// is forwarded): hidden with the targeted ones, from every path a stored or relayed
    /// response takes to a client.
    hidden: Vec<String>,
}

impl Default for Targeted {
    fn default() -> Self {
        Targeted::new(&["CDN-Cache-Control".to_string()], true)
    }
}

impl Targeted {
    /// `cache.targeted_fields` and `cache.targeted_fields_forward`.
    pub fn new(names: &[String], forward: bool) -> Targeted {
        Targeted {
            names: names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            forward,
            hidden: Vec::new(),
        }
    }

    /// The same, also hiding field `name` from clients.
    pub fn hiding(mut self, name: &str) -> Targeted {
        self.hidden.push(name.to_ascii_lowercase());
        self
    }

    /// The directives that govern zerocache's own caching of a response (§2.2): those of the
    /// first targeted field with a valid, non-empty value, in which case `Cache-Control` and
    /// `Expires` are ignored (`true`); otherwise `Cache-Control` (`false`). `get` returns a
    /// field's value, its lines joined with ", " (a Dictionary may be split over lines).
    pub fn governing(&self, get: impl Fn(&str) -> Option<String>) -> (ResponseDirectives, bool) {
        for name in &self.names {
            if let Some(d) = get(name).as_deref().and_then(parse) {
                return (d, true);
            }
        }
        (directives::response(get("cache-control").as_deref()), false)
    }

    /// True for a field [`Targeted::governing`] may read: a targeted one or `Cache-Control`.
    pub fn may_govern(&self, name: &str) -> bool {
        name.eq_ignore_ascii_case("cache-control")
            || self.names.iter().any(|t| name.eq_ignore_ascii_case(t))
    }

    /// True for a field withheld from clients: a targeted field when forwarding is off.
    pub fn hides(&self, name: &str) -> bool {
        (!self.forward && self.names.iter().any(|t| name.eq_ignore_ascii_case(t)))
            || self.hidden.iter().any(|t| name.eq_ignore_ascii_case(t))
    }

    /// A stored field block (`Name: value\r\n` lines) as clients see it.
    pub fn visible<'a>(&self, fields: &'a [u8]) -> Cow<'a, [u8]> {
        // Copied only when a line is withheld: the tag field is hidden by default, and most
        // responses carry none, so a range or read-behind head costs no allocation for it.
        if self.forward && self.hidden.is_empty()
            || !StoredFields(fields).lines().any(|l| self.hides(l.name))
        {
            return Cow::Borrowed(fields);
        }
        let mut out = Vec::with_capacity(fields.len());
        for line in StoredFields(fields).lines() {
            if !self.hides(line.name) {
                out.extend_from_slice(line.raw);
            }
        }
        Cow::Owned(out)
    }
}

/// Parses one targeted field's value: `None` when it is empty, not a Dictionary, or gives a known
/// directive a value of the wrong type (see the module doc).
pub fn parse(value: &str) -> Option<ResponseDirectives> {
    let dict: Dictionary = Parser::new(value).parse().ok()?;
    if dict.is_empty() {
        return None;
    }
    let mut d = ResponseDirectives::default();
    for (key, entry) in &dict {
        let name = key.as_str();
        let known = matches!(
            name,
            "max-age"
                | "s-maxage"
                | "stale-while-revalidate"
                | "stale-if-error"
                | "no-store"
                | "must-revalidate"
                | "proxy-revalidate"
                | "public"
                | "immutable"
                | "must-understand"
                | "no-cache"
                | "private"
        );
        let item = match entry {
            ListEntry::Item(item) => &item.bare_item,
            ListEntry::InnerList(_) if known => return None,
            ListEntry::InnerList(_) => continue,
        };
        let seconds = || match item {
            BareItem::Integer(i) => u64::try_from(i64::from(*i)).ok(),
            _ => None,
        };
        let flag = || matches!(item, BareItem::Boolean(true));
        let fields = || match item {
            BareItem::Boolean(true) => Some(None),
            BareItem::String(s) => Some(Some(
                s.as_str()
                    .split(',')
                    .map(|f| f.trim().to_ascii_lowercase())
                    .filter(|f| !f.is_empty())
                    .collect::<Vec<_>>(),
            )),
            _ => None,
        };
        match name {
            "max-age" => d.max_age = Some(seconds()?),
            "s-maxage" => d.s_maxage = Some(seconds()?),
            "stale-while-revalidate" => d.stale_while_revalidate = Some(seconds()?),
            "stale-if-error" => d.stale_if_error = Some(seconds()?),
            "no-store" => d.no_store = flag().then_some(true)?,
            "must-revalidate" => d.must_revalidate = flag().then_some(true)?,
            "proxy-revalidate" => d.proxy_revalidate = flag().then_some(true)?,
            "public" => d.public = flag().then_some(true)?,
            "immutable" => d.immutable = flag().then_some(true)?,
            "must-understand" => d.must_understand = flag().then_some(true)?,
            "no-cache" => match fields()? {
                None => d.no_cache = true,
                Some(f) => d.no_cache_fields = f,
            },
            "private" => match fields()? {
                None => d.private = true,
                Some(f) => d.private_fields = f,
            },
            _ => {}
        }
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(fields: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| {
            let v: Vec<&str> = fields
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| *v)
                .collect();
            (!v.is_empty()).then(|| v.join(", "))
        }
    }

    #[test]
    fn rfc9213_2_1_a_valid_dictionary_maps_to_directives() {
        let d = parse("max-age=60, s-maxage=30, no-cache=\"Set-Cookie, X-A\", private, immutable;x=1, x-ext=(a b)").unwrap();
        assert_eq!((d.max_age, d.s_maxage), (Some(60), Some(30)));
        assert_eq!(d.no_cache_fields, vec!["set-cookie", "x-a"]);
        assert!(d.private && d.immutable && !d.no_cache && !d.public);
        assert!(parse("no-store").unwrap().no_store);
        assert!(parse("no-store=?1").unwrap().no_store);
        // `none` is the RFC's own example of a valid field that names no known directive.
        assert_eq!(parse("none"), Some(ResponseDirectives::default()));
    }

    #[test]
    fn rfc9213_2_1_empty_unparsable_or_wrongly_typed_fields_are_invalid() {
        for bad in [
            "",
            "   ",
            "max-age=\"10000\"",
            "max-age=1.5",
            "max-age=-1",
            "max-age=abc",
            "MaX-aGe=60",
            "max-age=60,",
            "max-age=60;",
            "max-age=60 s-maxage=5",
            "no-store=?0",
            "no-store=5",
            "private=5",
            "no-cache=(a b)",
            "max-age=9999999999999999",
            "max-age=60, ,s-maxage=5",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rfc9213_2_2_first_valid_field_governs_else_cache_control() {
        let t = Targeted::new(
            &["Zc-Cache-Control".into(), "CDN-Cache-Control".into()],
            true,
        );
        let (d, targeted) = t.governing(get(&[
            ("Cache-Control", "no-store"),
            ("Zc-Cache-Control", "max-age=\"5\""),
            ("CDN-Cache-Control", "max-age=60"),
        ]));
        assert!(targeted);
        assert_eq!((d.max_age, d.no_store), (Some(60), false));
        let (d, targeted) = t.governing(get(&[
            ("Cache-Control", "max-age=7"),
            ("CDN-Cache-Control", "MaX-aGe=60"),
        ]));
        assert!(!targeted);
        assert_eq!(d.max_age, Some(7));
        // Two lines of one field form one Dictionary.
        let (d, _) = t.governing(get(&[
            ("CDN-Cache-Control", "max-age=60"),
            ("CDN-Cache-Control", "must-revalidate"),
        ]));
        assert!(d.must_revalidate && d.max_age == Some(60));
    }

    #[test]
    fn targeted_fields_are_forwarded_unless_the_operator_hides_them() {
        let block = b"ETag: \"a\"\r\nCDN-Cache-Control: max-age=60\r\nX-A: 1\r\n";
        let shown = Targeted::default();
        assert!(!shown.hides("cdn-cache-control"));
        assert_eq!(&*shown.visible(block), &block[..]);
        let hidden = Targeted::new(&["CDN-Cache-Control".into()], false);
        assert!(hidden.hides("CDN-Cache-Control") && !hidden.hides("Cache-Control"));
        assert_eq!(&*hidden.visible(block), b"ETag: \"a\"\r\nX-A: 1\r\n");
    }
}
