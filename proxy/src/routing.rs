//! Routes: the first route whose host and path prefix match a request decides its upstream and
//! whether it may be cached.

use crate::upstream::Group;
use std::collections::HashMap;
use std::sync::Arc;
use zerocache_config::Config;

/// A compiled route.
pub struct Route {
    /// Its counts, under its name (`routes[].name`, else its index): the metrics' `route`
    /// label and the access log's `$route`.
    pub counters: &'static zerocache_ledger::RouteCounters,
    host: String,
    prefix: String,
    /// The upstream group.
    pub upstream: Arc<Group>,
    /// Whether responses may be stored and hits served.
    pub cache: bool,
    /// Freshness for storable responses that carry none (`default_ttl`, `status_ttl`).
    pub ttls: Ttls,
    /// Whether the query string is part of the cache key.
    pub key_query: bool,
    /// Request header fields whose values are part of the cache key.
    pub key_headers: Vec<String>,
    /// How long past expiry to serve stale when the upstream fails.
    pub stale_grace: std::time::Duration,
    /// Requests that bypass the cache.
    pub bypass: zerocache_config::BypassRules,
    /// Forward TRACE instead of answering 405.
    pub allow_trace: bool,
    /// Store responses that set cookies.
    pub store_set_cookie: bool,
    /// The sizes of body this route stores (`max_object_size`, `min_object_size`).
    pub object_sizes: ObjectSizes,
    /// The codings `Accept-Encoding` is normalised to (`None`: `as-sent`).
    pub accept_encoding: Option<Vec<String>>,
    /// Upgrade requests are tunnelled (`upgrade: true`).
    pub upgrade: bool,
    /// `routes[].query`, compiled (`None`: the query as sent).
    pub(crate) query: Option<crate::cache::rules::query::QueryNorm>,
    /// `routes[].rules`, compiled.
    pub(crate) rules: crate::cache::rules::Rules,
    /// `routes[].slice` (`None`: objects are stored whole).
    pub(crate) slicing: Option<crate::cache::slice::Slicing>,
}

/// A route as one request uses it: the route, with the upstream and the freshness its edge
/// rules chose (a canary's upstream, a rule's `ttl`); everything else is the route's.
pub(crate) struct Routed<'a> {
    route: &'a Route,
    /// The upstream group this request goes to.
    pub upstream: &'a Arc<Group>,
    /// The freshness of what is stored from it.
    pub ttls: &'a Ttls,
}

impl<'a> Routed<'a> {
    pub(crate) fn new(route: &'a Route, upstream: &'a Arc<Group>, ttls: &'a Ttls) -> Routed<'a> {
        Routed {
            route,
            upstream,
            ttls,
        }
    }
}

impl std::ops::Deref for Routed<'_> {
    type Target = Route;
    fn deref(&self) -> &Route {
        self.route
    }
}

/// A route's freshness for responses that carry none: `status_ttl` by status, then (for the
/// statuses RFC 9111 lets a cache give a heuristic lifetime) `default_ttl`.
#[derive(Debug, Clone, Default)]
pub struct Ttls {
    /// `default_ttl`.
    pub default: Option<std::time::Duration>,
    /// `status_ttl` (`None` when empty).
    pub by_status: Option<Arc<zerocache_config::StatusTtl>>,
    /// A rule's `ttl`: over the origin's freshness too.
    pub forced: Option<std::time::Duration>,
}

impl Ttls {
    /// The heuristics these TTLs give, with the Last-Modified heuristic capped at `max`.
    pub fn heuristics(&self, max: std::time::Duration) -> crate::cache::freshness::Heuristics<'_> {
        crate::cache::freshness::Heuristics {
            max,
            default_ttl: self.default,
            status_ttl: self.by_status.as_deref(),
            forced: self.forced,
        }
    }
}

/// The sizes of response body a route stores: the route's `max_object_size`/`min_object_size`,
/// else the cache's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectSizes {
    /// Smallest body stored.
    pub min: u64,
    /// Largest body stored (`None`: up to the cache's `max_size`).
    pub max: Option<u64>,
}

impl ObjectSizes {
    /// Any size (up to the cache's `max_size`).
    pub const ANY: ObjectSizes = ObjectSizes { min: 0, max: None };
}

impl Route {
    /// Normalises `req`'s `Accept-Encoding` to this route's codings (see
    /// [`crate::http::accept_encoding`]): every line of it replaced by one canonical line, or
    /// none for identity. The cache key and the upstream request are made from the result.
    pub fn normalise_accept_encoding(&self, req: &mut crate::http::request::RequestHead) {
        let Some(codings) = &self.accept_encoding else {
            return;
        };
        let sent = req.joined("accept-encoding");
        let canonical = crate::http::accept_encoding::canonical(sent.as_deref(), codings);
        req.fields
            .retain(|(k, _)| !k.eq_ignore_ascii_case("accept-encoding"));
        if let Some(v) = canonical {
            req.fields.push(("Accept-Encoding".into(), v.into_bytes()));
        }
    }

    /// `req`'s target with the route's query rules applied (see `cache::rules::query`).
    pub(crate) fn normalise_query(&self, req: &mut crate::http::request::RequestHead) {
        if let Some(t) = self.normalised(&req.target) {
            req.target = t;
        }
    }

    /// `target` through the route's `query` rules, or `None` when they leave it as it is: what a
    /// request, a purge or an invalidation naming it is keyed by.
    pub(crate) fn normalised(&self, target: &str) -> Option<String> {
        self.query.as_ref().and_then(|q| q.apply(target))
    }

    /// True when `req` matches one of the route's bypass rules.
    pub fn bypasses(&self, req: &crate::http::request::RequestHead) -> bool {
        let b = &self.bypass;
        b.methods
            .iter()
            .any(|m| m.eq_ignore_ascii_case(&req.method))
            || {
                let target = crate::http::target::merged_slashes(&req.target);
                b.paths.iter().any(|p| target.starts_with(p.as_str()))
            }
            || b.headers
                .iter()
                .any(|h| crate::http::headers::has(&req.fields, h))
            || (!b.cookies.is_empty()
                && req.joined("cookie").is_some_and(|c| {
                    c.split([';', ','])
                        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim()))
                        .any(|name| b.cookies.iter().any(|want| want == name))
                }))
    }
}

/// All routes, in config order.
pub struct Routes {
    routes: Vec<Route>,
    /// Upstream groups by name.
    pub groups: HashMap<String, Arc<Group>>,
}

impl Routes {
    /// Compiles the routes of a validated config; the groups count their failed connects in
    /// `accounting`.
    pub fn new(config: &Config, accounting: &Arc<zerocache_ledger::Accounting>) -> Routes {
        let groups: HashMap<String, Arc<Group>> = config
            .upstreams
            .iter()
            .map(|(name, u)| {
                let g = Group::new(name, u).counted_by(accounting.clone());
                (name.clone(), Arc::new(g))
            })
            .collect();
        let routes = config
            .routes
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let counters = accounting.route(&r.name_or_index(i));
                // Validated already: a rule that does not compile here is a bug, and the route
                // is left out rather than run without it.
                let rules = match crate::cache::rules::Rules::new(r, counters) {
                    Ok(rules) => rules,
                    Err(e) => {
                        tracing::error!(route = counters.name(), error = %e, "a route's rules did not compile; the route is left out");
                        return None;
                    }
                };
                Some(Route {
                    counters,
                    query: crate::cache::rules::query::QueryNorm::new(&r.query),
                    rules,
                    host: r.matcher.host.to_ascii_lowercase(),
                    prefix: r.matcher.path_prefix.clone(),
                    upstream: groups.get(&r.upstream)?.clone(),
                    cache: r.cache,
                    ttls: Ttls {
                        default: r.default_ttl,
                        by_status: (!r.status_ttl.is_empty())
                            .then(|| Arc::new(r.status_ttl.clone())),
                        forced: None,
                    },
                    key_query: r.cache_key.query,
                    key_headers: r.cache_key.headers.clone(),
                    stale_grace: r.stale_grace,
                    bypass: r.bypass.clone(),
                    allow_trace: r.allow_trace,
                    store_set_cookie: r.store_set_cookie,
                    upgrade: r.upgrade,
                    accept_encoding: match &r.accept_encoding {
                        zerocache_config::AcceptEncoding::Codings(c) => Some(c.clone()),
                        zerocache_config::AcceptEncoding::AsSent => None,
                    },
                    slicing: r.slice.map(|size| crate::cache::slice::Slicing {
                        size: size.as_u64(),
                        max_object: r
                            .max_sliced_object_size
                            .unwrap_or(config.cache.max_size)
                            .as_u64(),
                    }),
                    object_sizes: ObjectSizes {
                        min: r
                            .min_object_size
                            .unwrap_or(config.cache.min_object_size)
                            .as_u64(),
                        max: r
                            .max_object_size
                            .or(config.cache.max_object_size)
                            .map(|b| b.as_u64()),
                    },
                })
            })
            .collect();
        Routes { routes, groups }
    }

    /// The first route matching `host` (lower-cased, port allowed) and `target`.
    pub fn find(&self, host: &str, target: &str) -> Option<&Route> {
        self.find_shaped(host, target).0
    }

    /// [`Routes::find`], and the target's `http::target::path_shape`, found on the way (the
    /// edge rules read the path as routing does, and need not look for its end again; `OPTIONS
    /// *`, routed as `/`, has the same shape: one byte, no `?`, no `//`).
    pub(crate) fn find_shaped(&self, host: &str, target: &str) -> (Option<&Route>, (usize, bool)) {
        let bare = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
        let shape = crate::http::target::path_shape(target);
        let merged = match shape.1 {
            true => crate::http::target::merged_slashes(target),
            false => std::borrow::Cow::Borrowed(target),
        };
        let target = merged.as_ref();
        let found = self.routes.iter().find(|r| {
            (r.host == "*" || r.host == host || r.host == bare) && target.starts_with(&r.prefix)
        });
        (found, shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins() {
        let cfg = zerocache_config::parse(
            "listen: 127.0.0.1:1\ncache: {path: /tmp/x, max_size: 1MiB}\nupstreams:\n  a: {servers: ['127.0.0.1:2']}\n  b: {servers: ['127.0.0.1:3']}\nroutes:\n  - match: {host: img.example, path_prefix: /i/}\n    upstream: b\n  - match: {host: '*', path_prefix: /}\n    upstream: a\n    cache: false\n",
            "t.yaml",
        )
        .expect("valid");
        let r = Routes::new(
            &cfg,
            &Arc::new(zerocache_ledger::Accounting::new(16, false)),
        );
        assert_eq!(
            r.find("img.example", "/i/1")
                .map(|r| r.upstream.name.as_str()),
            Some("b")
        );
        assert_eq!(
            r.find("img.example:8080", "/i/1")
                .map(|r| r.upstream.name.as_str()),
            Some("b")
        );
        assert_eq!(
            r.find("img.example", "/x")
                .map(|r| r.upstream.name.as_str()),
            Some("a")
        );
        assert!(!r.find("other", "/i/1").map(|r| r.cache).unwrap_or(true));
        // `//i/1` is `/i/1` to an origin that merges slashes: it matches the same route.
        assert_eq!(
            r.find("img.example", "//i//1?a=//b")
                .map(|r| r.upstream.name.as_str()),
            Some("b")
        );
        assert_eq!(
            crate::http::target::merged_slashes("//i//1?a=//b"),
            "/i/1?a=//b"
        );
    }
}
