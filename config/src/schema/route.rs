//! `routes:`: which requests go to which upstream, and how each route's responses are keyed,
//! bypassed and kept.

use super::default_true;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A route: which requests go to which upstream.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The route's name in metrics (the `route` label) and the access log (`$route`): letters,
    /// digits, `_`, `.` and `-`, at most 64, unique among the routes. Unset: its index (`0`,
    /// `1`, ...), which changes when routes are inserted before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the request must look like.
    #[serde(rename = "match")]
    pub matcher: RouteMatch,
    /// Name of an entry of `upstreams`.
    pub upstream: String,
    /// Whether responses on this route may be cached.
    #[serde(default = "default_true")]
    pub cache: bool,
    /// Freshness lifetime for responses that carry none (like nginx `proxy_cache_valid`), for the
    /// statuses RFC 9111 lets a cache give a heuristic lifetime; before the `Last-Modified`
    /// heuristic, which applies only where this is unset. Never overrides `no-store`, `private`
    /// or explicit freshness.
    #[serde(default, with = "crate::units::opt_duration")]
    pub default_ttl: Option<Duration>,
    /// Freshness by status for responses that carry none (`{404: 1m, 4xx: 10s}`; an exact
    /// status over its class, and a class never covers a status one request can cause for
    /// everyone: 400, 401, 403, 407, 408, 411, 413, 414, 415, 421, 429, 431, 500), like nginx's
    /// `proxy_cache_valid`. An operator's override of
    /// RFC 9111's heuristics: it applies to any final status (a 302, a 403 too, which RFC 9111
    /// would not store without explicit freshness), and before the `Last-Modified` heuristic and
    /// `default_ttl`. Never over `no-store`, `private` or explicit freshness; a 5xx still needs
    /// `cache.store_5xx`.
    #[serde(default)]
    pub status_ttl: super::StatusTtl,
    /// What goes into the cache key beyond method, scheme, host and path.
    #[serde(default)]
    pub cache_key: CacheKeyConfig,
    /// How long past expiry a stored response may be served when the upstream fails (refused,
    /// closed, timed out, 5xx) and the response has no `stale-if-error`. Never past
    /// `must-revalidate`, `proxy-revalidate` or `no-cache`.
    #[serde(default = "default_stale_grace", with = "crate::units::duration")]
    pub stale_grace: Duration,
    /// Requests that must never be served from, or stored in, the cache (`X-Cache: BYPASS`).
    #[serde(default)]
    pub bypass: BypassRules,
    /// Forward `TRACE` (which echoes the request, cookies and credentials included); otherwise
    /// it is answered 405.
    #[serde(default)]
    pub allow_trace: bool,
    /// Store responses that carry `Set-Cookie` and explicit freshness (`max-age`, `s-maxage`,
    /// `Expires`), replaying the cookie to every client, as RFC 9111 allows. Off by default, as
    /// in nginx, Varnish and CDNs: such a response goes to its requester and is not stored
    /// (`Cache-Status: ...; detail=set-cookie`). Never stored under freshness the origin did not
    /// give (the heuristic, `default_ttl`, `status_ttl`), whatever this says.
    #[serde(default)]
    pub store_set_cookie: bool,
    /// Forward `Upgrade` requests (WebSocket and any other protocol) and, when the origin
    /// answers 101, tunnel the bytes both ways until either side closes or stays idle for
    /// `limits.idle_timeout`; never cached. Off: the Upgrade is not forwarded, and an origin's
    /// 101 is a 502.
    #[serde(default)]
    pub upgrade: bool,
    /// The request's `Accept-Encoding`, before the cache key and the upstream request are made
    /// from it: the content codings this route's origin serves, in preference order (default
    /// `[br, gzip]`). The field becomes those of them the client accepts (`q=0` honoured, `*`
    /// understood), so one variant is stored per set and the origin is asked with it; none
    /// accepted removes the field (identity). `as-sent` leaves the field as the client sent it.
    #[serde(default)]
    pub accept_encoding: AcceptEncoding,
    /// This route's `cache.max_object_size` (unset: the cache's).
    #[serde(default, with = "crate::units::opt_size")]
    pub max_object_size: Option<bytesize::ByteSize>,
    /// This route's `cache.min_object_size` (unset: the cache's).
    #[serde(default, with = "crate::units::opt_size")]
    pub min_object_size: Option<bytesize::ByteSize>,
    /// Store objects on this route as aligned slices of this size (256KiB to 64MiB; unset: off),
    /// like nginx's `slice`: a GET is fetched from the origin as `Range: bytes=k*S-(k+1)*S-1`
    /// requests, each slice an entry of its own, filled once and evicted on its own, and a
    /// client's Range is answered from the slices that cover it. `cache.range_fill_max` does not
    /// apply here; `max_object_size` applies to each slice (docs/slices.md).
    #[serde(default, with = "crate::units::opt_size")]
    pub slice: Option<bytesize::ByteSize>,
    /// The largest whole object stored in slices on this route (unset, and at most:
    /// `cache.max_size`); a larger one is served as on an unsliced route.
    #[serde(default, with = "crate::units::opt_size")]
    pub max_sliced_object_size: Option<bytesize::ByteSize>,
    /// The query as the cache key, the upstream request and purges see it: parameters sorted,
    /// kept or dropped by name (`{sort: true, drop: ["utm_*", fbclid]}`). Applied first;
    /// `cache_key.query: false` then leaves the query out of the key altogether.
    #[serde(default, skip_serializing_if = "super::QueryRules::is_noop")]
    pub query: super::QueryRules,
    /// Edge rules, in order: each one's actions apply when its `match` holds (docs/rules.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<super::Rule>,
}

impl Route {
    /// The name the route goes by: its `name`, else its index among the routes.
    pub fn name_or_index(&self, index: usize) -> String {
        self.name.clone().unwrap_or_else(|| index.to_string())
    }
}

/// `routes[].accept_encoding`: the codings the route serves, or `as-sent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptEncoding {
    /// Normalise to these codings (lower case, in preference order).
    Codings(Vec<String>),
    /// Leave the client's field as it came.
    AsSent,
}

impl Default for AcceptEncoding {
    fn default() -> AcceptEncoding {
        AcceptEncoding::Codings(vec!["br".into(), "gzip".into()])
    }
}

impl<'de> Deserialize<'de> for AcceptEncoding {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AcceptEncoding, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = AcceptEncoding;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of content codings (`[br, gzip]`) or `as-sent`")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<AcceptEncoding, E> {
                match s {
                    "as-sent" => Ok(AcceptEncoding::AsSent),
                    _ => Err(E::custom(format!(
                        "`{s}` is neither a list of content codings (`[br, gzip]`) nor `as-sent`"
                    ))),
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<AcceptEncoding, A::Error> {
                let mut codings: Vec<String> = Vec::new();
                while let Some(c) = seq.next_element::<String>()? {
                    let c = c.to_ascii_lowercase();
                    let token = !c.is_empty()
                        && c.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'+-.^_`|~".contains(&b));
                    if !token || c == "identity" || c == "x-gzip" {
                        return Err(serde::de::Error::custom(format!(
                            "`{c}` is not a content coding a route can list (`br`, `gzip`, `zstd`, `deflate`; identity is what no coding means, and a client's x-gzip is read as gzip)"
                        )));
                    }
                    if codings.contains(&c) {
                        return Err(serde::de::Error::custom(format!("`{c}` is listed twice")));
                    }
                    codings.push(c);
                }
                Ok(AcceptEncoding::Codings(codings))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for AcceptEncoding {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AcceptEncoding::Codings(c) => c.serialize(s),
            AcceptEncoding::AsSent => s.serialize_str("as-sent"),
        }
    }
}

fn default_stale_grace() -> Duration {
    Duration::from_secs(60)
}

/// Per-route rules that bypass the cache; any one matching is enough.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BypassRules {
    /// Names of cookies whose presence bypasses the cache (e.g. a session cookie).
    #[serde(default)]
    pub cookies: Vec<String>,
    /// Request header fields whose presence bypasses the cache.
    #[serde(default)]
    pub headers: Vec<String>,
    /// Methods that bypass the cache (GET and HEAD otherwise use it).
    #[serde(default)]
    pub methods: Vec<String>,
    /// Path prefixes that bypass the cache.
    #[serde(default)]
    pub paths: Vec<String>,
}

/// Cache key options of a route.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CacheKeyConfig {
    /// Include the query string (as received). Turning it off makes `/a?x=1` and `/a?x=2` one
    /// entry: only for origins that ignore the query.
    #[serde(default = "default_true")]
    pub query: bool,
    /// Request header fields whose values are part of the key (e.g. `Accept-Encoding`).
    #[serde(default)]
    pub headers: Vec<String>,
}

impl Default for CacheKeyConfig {
    fn default() -> Self {
        CacheKeyConfig {
            query: true,
            headers: Vec::new(),
        }
    }
}

/// A route's request matcher.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    /// Host (without port, case-insensitive), or `*` for any.
    #[serde(default = "default_any_host")]
    pub host: String,
    /// Path prefix the request target must start with.
    #[serde(default = "default_prefix")]
    pub path_prefix: String,
}

fn default_any_host() -> String {
    "*".into()
}
fn default_prefix() -> String {
    "/".into()
}
