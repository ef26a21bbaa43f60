//! Routes: the first route whose host and path prefix match a request decides its upstream and
//! whether it may be cached.

use crate::upstream::Group;
use std::collections::HashMap;
use std::sync::Arc;
use zerocache_config::Config;

/// A compiled route.
pub struct Route {
    host: String,
    prefix: String,
    /// The upstream group.
    pub upstream: Arc<Group>,
    /// Whether responses may be stored and hits served.
    pub cache: bool,
    /// Freshness for storable responses that carry none.
    pub default_ttl: Option<std::time::Duration>,
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
}

impl Route {
    /// True when `req` matches one of the route's bypass rules.
    pub fn bypasses(&self, req: &crate::http::request::RequestHead) -> bool {
        let b = &self.bypass;
        b.methods
            .iter()
            .any(|m| m.eq_ignore_ascii_case(&req.method))
            || b.paths.iter().any(|p| req.target.starts_with(p.as_str()))
            || b.headers.iter().any(|h| req.field(h).is_some())
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
    /// Compiles the routes of a validated config.
    pub fn new(config: &Config) -> Routes {
        let groups: HashMap<String, Arc<Group>> = config
            .upstreams
            .iter()
            .map(|(name, u)| (name.clone(), Arc::new(Group::new(name, u))))
            .collect();
        let routes = config
            .routes
            .iter()
            .filter_map(|r| {
                Some(Route {
                    host: r.matcher.host.to_ascii_lowercase(),
                    prefix: r.matcher.path_prefix.clone(),
                    upstream: groups.get(&r.upstream)?.clone(),
                    cache: r.cache,
                    default_ttl: r.default_ttl,
                    key_query: r.cache_key.query,
                    key_headers: r.cache_key.headers.clone(),
                    stale_grace: r.stale_grace,
                    bypass: r.bypass.clone(),
                    allow_trace: r.allow_trace,
                    store_set_cookie: r.store_set_cookie,
                })
            })
            .collect();
        Routes { routes, groups }
    }

    /// The first route matching `host` (lower-cased, port allowed) and `target`.
    pub fn find(&self, host: &str, target: &str) -> Option<&Route> {
        let bare = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
        self.routes.iter().find(|r| {
            (r.host == "*" || r.host == host || r.host == bare) && target.starts_with(&r.prefix)
        })
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
        let r = Routes::new(&cfg);
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
    }
}
