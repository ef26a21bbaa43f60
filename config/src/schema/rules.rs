//! `routes[].query` and `routes[].rules`: what an edge changes about a request before the cache
//! key is made from it (its query, its fields, whether it goes on at all) and about the response
//! a client gets (its fields). Declarative on purpose: matchers ANDed, actions from a fixed set,
//! templates with a fixed set of variables, all checked when the config is read (see
//! [`crate::rules_check`]), so a rule is never a program.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `routes[].query`: the query as the cache key and the upstream request see it. Applied to the
/// request's target before anything else reads it, and to a purge's URL the same way.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueryRules {
    /// Sort the parameters by name (stably: repeated names keep their order), so `?b=2&a=1`
    /// and `?a=1&b=2` are one entry.
    #[serde(default)]
    pub sort: bool,
    /// Keep only the parameters these globs name (`*` any run of characters); unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<Vec<String>>,
    /// Drop the parameters these globs name (`utm_*`, `fbclid`), after `keep`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
}

impl QueryRules {
    /// Whether it changes nothing.
    pub fn is_noop(&self) -> bool {
        !self.sort && self.keep.is_none() && self.drop.is_empty()
    }
}

/// One rule of `routes[].rules`: when its `match` holds, its actions apply (see docs/rules.md for
/// their order).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Unique among the route's rules: the `rule` label of `zerocache_rule_matches_total` and
    /// the access log's `$rule`. Letters, digits, `_`, `.`, `-`.
    pub name: String,
    /// What the request must look like (every condition given; none: every request).
    #[serde(rename = "match", default)]
    pub matcher: RuleMatch,
    /// Fields of the request sent upstream (and seen by the cache key and Vary).
    #[serde(default, skip_serializing_if = "HeaderActions::is_empty")]
    pub request_headers: HeaderActions,
    /// Fields of the response the client gets, hits included (the stored entry is not changed).
    #[serde(default, skip_serializing_if = "HeaderActions::is_empty")]
    pub response_headers: HeaderActions,
    /// Answer with a redirect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    /// Answer with a status and a short body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub respond: Option<Respond>,
    /// Answer with this 4xx status (403 usually), nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<u16>,
    /// A token bucket per key; past it, 429 with `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Never served from, nor stored in, the cache (`X-Cache: BYPASS`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bypass: bool,
    /// Send a share of the matching requests to another upstream (a canary, like nginx's
    /// `split_clients`): chosen by a stable hash of a key, and part of the cache key, so what
    /// the canary answered is only ever served to the requests that chose it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Canary>,
    /// Freshness for what is stored from these requests, over the origin's own (like nginx's
    /// `proxy_cache_valid` with `proxy_ignore_headers Cache-Control Expires`); never over
    /// `no-store` or `private`, and a response with `Set-Cookie` is then never stored.
    #[serde(
        default,
        with = "crate::units::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl: Option<std::time::Duration>,
}

/// `upstream:` of a rule: `percent` of the matching requests go `to` that upstream.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    /// An entry of `upstreams`.
    pub to: String,
    /// The share, 0 to 100 (fractions allowed: `0.5`); 100 unless given.
    #[serde(default = "default_percent")]
    pub percent: f64,
    /// What the share is a hash of: `client` (its address: a client stays on its side),
    /// `url` (the path and query: an object stays on its side) or `header:NAME`.
    #[serde(default = "default_limit_key")]
    pub key: String,
}

fn default_percent() -> f64 {
    100.0
}

/// A rule's conditions, all of which must hold.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleMatch {
    /// The request's host, a glob (`*.example.com`; case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The path starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The path is exactly this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The path matches this regular expression (the `regex` crate's syntax, no look-around); its
    /// groups are `$1`..`$9` in the rule's templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// The method is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub method: Vec<String>,
    /// Request fields: each must be present (and equal or match, when given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    /// Query parameters: each must be present (and equal or match, when given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<ValueMatch>,
    /// Cookies that must be present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cookies: Vec<String>,
    /// The client's address is in one of these (the connection's peer, or the source a PROXY
    /// header gives; never `X-Forwarded-For`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_in: Vec<String>,
    /// The client's address is in none of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_not_in: Vec<String>,
    /// `http` or `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// `http/1.1` (1.0 too) or `h2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// A request field or query parameter that must be there, with a value equal to `equals` or
/// matching `regex` when one is given.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ValueMatch {
    /// The field's name (case-insensitive) or the parameter's (exact).
    pub name: String,
    /// The value, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
    /// A regular expression the value matches (anywhere, unless anchored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// Field edits: `remove`, then `set` (replacing every line of the name), then `append`. Values
/// are templates (see [`TEMPLATE_VARIABLES`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeaderActions {
    /// Fields to replace (or add).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Fields to add a line of.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub append: BTreeMap<String, String>,
    /// Fields to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

impl HeaderActions {
    /// Whether it edits nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.append.is_empty() && self.remove.is_empty()
    }
}

/// `redirect:`: a status and a `Location` template.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Redirect {
    /// 301, 302, 303, 307 or 308 (302 unless given).
    #[serde(default = "default_redirect")]
    pub status: u16,
    /// The target, a template (`https://$host$target`, `/posts/$1$query`).
    pub location: String,
}

fn default_redirect() -> u16 {
    302
}

/// `respond:`: a status and a short text body.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Respond {
    /// 200 to 599.
    pub status: u16,
    /// The body, as written (at most 64 KiB).
    #[serde(default)]
    pub body: String,
    /// Its `Content-Type`.
    #[serde(default = "default_content_type")]
    pub content_type: String,
}

fn default_content_type() -> String {
    "text/plain; charset=utf-8".into()
}

/// `rate_limit:`: `rate` requests a second, bursts of `burst`, per `key`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// `client` (its address, as `client_in` sees it) or `header:NAME` (that field's value; a
    /// request without it shares one bucket).
    #[serde(default = "default_limit_key")]
    pub key: String,
    /// `N/s`, `N/m` or `N/h`.
    pub rate: String,
    /// Requests allowed at once after a quiet spell (at least 1).
    pub burst: u32,
}

fn default_limit_key() -> String {
    "client".into()
}

impl RateLimit {
    /// Tokens a second that `rate` gives, or why it is not a rate.
    pub fn per_second(&self) -> Result<f64, String> {
        let bad = || {
            format!(
                "`{}` is not a rate: write requests per second, minute or hour (`5/s`, `300/m`, `1000/h`)",
                self.rate
            )
        };
        let (n, unit) = self.rate.split_once('/').ok_or_else(bad)?;
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        let secs = match unit.trim() {
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        if n == 0 {
            return Err(format!(
                "`{}` lets nothing through: use `deny` for that",
                self.rate
            ));
        }
        Ok(f64::from(n) / secs)
    }
}

/// What a template may use: `$name` (or `${name}` beside a letter or digit), `$1`..`$9` for the
/// groups of the rule's `path_regex`, `$$` for a `$`.
pub const TEMPLATE_VARIABLES: &[(&str, &str)] = &[
    ("host", "the request's host (lower case, no default port)"),
    ("path", "the path, without the query"),
    ("query", "`?` and the query when there is one, else nothing"),
    ("target", "the path and query"),
    ("scheme", "http or https"),
    ("method", "the method"),
    ("client", "the client's address"),
    ("route", "the route's name"),
];

pub use crate::template::TemplatePart;

/// The parts of `template`, or why it cannot be one: an unknown variable, or a CR, LF or NUL,
/// which would end a header field early.
pub fn template_parts(template: &str) -> Result<Vec<TemplatePart>, String> {
    if template.contains(['\r', '\n', '\0']) {
        return Err("a CR, LF or NUL has no place in a header field or a redirect".into());
    }
    crate::template::scan(
        template,
        TEMPLATE_VARIABLES,
        true,
        ", and $1 to $9 for path_regex's groups",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_their_variables_and_groups_and_refuse_line_breaks() {
        assert_eq!(
            template_parts("https://$host/posts/$1${query}x$$").expect("valid"),
            vec![
                TemplatePart::Literal("https://".into()),
                TemplatePart::Var("host"),
                TemplatePart::Literal("/posts/".into()),
                TemplatePart::Group(1),
                TemplatePart::Var("query"),
                TemplatePart::Literal("x$".into()),
            ]
        );
        assert_eq!(
            template_parts("$12").expect("valid")[1],
            TemplatePart::Literal("2".into())
        );
        assert!(
            template_parts("$hots")
                .unwrap_err()
                .contains("`$hots` is not a variable")
        );
        assert!(template_parts("$0").is_err());
        assert!(
            template_parts("a\r\nSet-Cookie: x")
                .unwrap_err()
                .contains("CR, LF or NUL")
        );
        assert!(template_parts("a\0").is_err());
    }

    #[test]
    fn rates_are_per_second_minute_or_hour() {
        let r = |rate: &str| RateLimit {
            key: "client".into(),
            rate: rate.into(),
            burst: 1,
        };
        assert_eq!(r("5/s").per_second(), Ok(5.0));
        assert_eq!(r("120/m").per_second(), Ok(2.0));
        assert_eq!(r("3600/h").per_second(), Ok(1.0));
        assert!(r("0/s").per_second().unwrap_err().contains("deny"));
        assert!(r("5/d").per_second().is_err());
        assert!(r("five/s").per_second().is_err());
        assert!(r("-1/s").per_second().is_err());
    }
}
