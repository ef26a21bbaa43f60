//! The configuration's types and defaults. The keys fixed by the data-plane issue (`listen`,
//! `cache.path`, `cache.max_size`, `upstreams.<name>.servers`, `routes`) are the only required ones.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod cache;
mod dashboard;
mod limits;
mod listen;
mod purge;
mod route;
mod rules;
mod status_ttl;
mod upstream;

pub use cache::*;
pub use dashboard::*;
pub use limits::*;
pub use listen::*;
pub use purge::*;
pub use route::*;
pub use rules::*;
pub use status_ttl::*;
pub use upstream::*;

/// For `#[serde(default = ...)]` of switches that are on unless turned off.
pub(crate) fn default_true() -> bool {
    true
}

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the proxy listens: one entry or a list of them, each a `host:port` or a map with
    /// options (`{addr: "0.0.0.0:80", proxy_protocol: true, proxy_protocol_from: [10.0.0.0/8]}`).
    /// A host may be a name (`localhost:8080`, every address it resolves to) or an IPv6 literal
    /// (`[::]:8080`).
    pub listen: Listen,
    /// Where the process id is written once the listeners are bound, and removed at exit, for
    /// scripts that signal it (logrotate's `postrotate`, an init system without systemd), as
    /// nginx's `pid`. Unset: none.
    #[serde(default)]
    pub pid_file: Option<std::path::PathBuf>,
    /// The listen backlog of each listening socket (nginx's `backlog=`, 511 by default, as
    /// nginx's); the kernel caps it at `net.core.somaxconn`.
    #[serde(default = "default_backlog")]
    pub backlog: u32,
    /// The disk cache.
    pub cache: CacheConfig,
    /// Named upstream groups.
    pub upstreams: BTreeMap<String, Upstream>,
    /// Routes, first match wins.
    pub routes: Vec<Route>,
    /// The dashboard and metrics listener.
    #[serde(default)]
    pub dashboard: DashboardConfig,
    /// The eBPF probe.
    #[serde(default)]
    pub probe: ProbeConfig,
    /// Limits on client requests.
    #[serde(default)]
    pub limits: Limits,
    /// The data-plane worker threads.
    #[serde(default)]
    pub workers: WorkersConfig,
    /// Log level and access log.
    #[serde(default)]
    pub logging: LoggingConfig,
    /// What the proxy does to requests it forwards.
    #[serde(default)]
    pub proxy: ProxyConfig,
    /// Switches for demonstrations and tests; never on in production.
    #[serde(default)]
    pub debug: DebugConfig,
    /// The `PURGE` method on the data port (off by default).
    #[serde(default)]
    pub purge: PurgeConfig,
    /// A listener for HTTPS clients (see [`crate::tls`]); unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls::TlsListener>,
    /// Several nodes acting as one cache (see `fleet.rs`); absent: this node is alone.
    #[serde(default)]
    pub fleet: Option<crate::fleet::FleetConfig>,
}

impl Config {
    /// The config with its secrets (`dashboard.token`, `fleet.secret`, `purge.token`) replaced by `<redacted>`:
    /// what `check` prints, since its output goes to terminals, CI logs and the journal.
    pub fn redacted(mut self) -> Config {
        const REDACTED: &str = "<redacted>";
        if let Some(t) = &mut self.dashboard.token {
            *t = REDACTED.into();
        }
        if let Some(f) = &mut self.fleet {
            f.secret = REDACTED.into();
            if let Some(p) = &mut f.previous_secret {
                *p = REDACTED.into();
            }
        }
        if let Some(t) = &mut self.purge.token {
            *t = REDACTED.into();
        }
        self
    }

    /// Every size in the config, by key path, in bytes: what `check` prints beside their binary
    /// form, so nobody is surprised by what `1g` or `10MB` became.
    pub fn sizes(&self) -> Vec<(&'static str, u64)> {
        let (c, l) = (&self.cache, &self.limits);
        vec![
            ("cache.max_size", c.max_size.as_u64()),
            ("cache.sendfile_max_chunk", c.sendfile_max_chunk.as_u64()),
            ("cache.range_fill_max", c.range_fill_max.as_u64()),
            ("cache.abandoned_fill_max", c.abandoned_fill_max.as_u64()),
            ("cache.scrub_rate", c.scrub_rate.as_u64()),
            ("limits.max_header_bytes", l.max_header_bytes.as_u64()),
            ("limits.max_uri_bytes", l.max_uri_bytes.as_u64()),
            ("limits.max_body_bytes", l.max_body_bytes.as_u64()),
            ("limits.body_min_rate", l.body_min_rate.as_u64()),
        ]
    }
}

fn default_backlog() -> u32 {
    511
}

/// What the proxy does to the requests it forwards upstream.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Request fields never forwarded: each lets a client change what the origin answers without
    /// being part of the cache key (unkeyed-input cache poisoning). Replaces the default list.
    #[serde(default = "default_strip_request_fields")]
    pub strip_request_fields: Vec<String>,
    /// Peers (CIDRs or addresses) whose `X-Forwarded-For`, `Forwarded: for=`, `X-Real-IP` and
    /// `True-Client-IP` are believed and appended to. From any other peer those fields are
    /// replaced by the peer's own address, so a client cannot pick the address an origin
    /// geolocates or rate-limits on.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// A `\` in a request path: `reject` (400, the default: IIS and some Java containers take
    /// it as `/`, others don't, so no key can say what it names) or `keep` (an ordinary byte).
    #[serde(default = "default_reject")]
    pub path_backslash: PathSpelling,
    /// A `;` path parameter: `keep` (the default: opaque, part of the key like any byte) or
    /// `reject` (400). A dot-segment with parameters (`..;`) is refused either way.
    #[serde(default = "default_keep")]
    pub path_parameters: PathSpelling,
    /// A dot-segment beside an encoded separator (`/static/..%2fprivate`, `%2e%2e%2f`, `..%5c`):
    /// `reject` (400, the default: an origin that decodes `%2F` reads it as a climb out of the
    /// prefix the cache keys it under, the web cache deception pattern) or `keep` (opaque).
    #[serde(default = "default_reject")]
    pub path_encoded_traversal: PathSpelling,
    /// Whether the proxy names itself in `Via` (RFC 9110 §7.6.3) on the requests it sends
    /// upstream and the responses it sends clients (`1.1 zerocache`). `false` (Squid's `via off`)
    /// adds none and passes on the hops received: a default nginx origin does not compress for
    /// a request with `Via` (`gzip_proxied off`).
    #[serde(default = "default_true")]
    pub via: bool,
}

/// What to do with a path spelling that origins read differently.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PathSpelling {
    /// Keep it, as an opaque part of the path.
    Keep,
    /// Answer 400.
    Reject,
}

fn default_reject() -> PathSpelling {
    PathSpelling::Reject
}

fn default_keep() -> PathSpelling {
    PathSpelling::Keep
}

/// The fields `proxy.strip_request_fields` lists by default.
pub fn default_strip_request_fields() -> Vec<String> {
    [
        "X-Forwarded-Host",
        "X-Forwarded-Proto",
        "X-Forwarded-Scheme",
        "X-Forwarded-Port",
        "X-Forwarded-Prefix",
        "X-Forwarded-Server",
        "X-Forwarded-Uri",
        "X-Original-Host",
        "X-Host",
        "X-Original-URL",
        "X-Rewrite-URL",
        "X-HTTP-Method-Override",
        "X-HTTP-Method",
        "X-Method-Override",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            strip_request_fields: default_strip_request_fields(),
            trusted_proxies: Vec::new(),
            path_backslash: default_reject(),
            path_parameters: default_keep(),
            path_encoded_traversal: default_reject(),
            via: true,
        }
    }
}

/// Logging.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// `error`, `warn`, `info`, `debug` or `trace` (or a tracing filter); `RUST_LOG` overrides it.
    #[serde(default = "default_level")]
    pub level: String,
    /// Where the access log goes: a file path, `stdout`, `stderr`, or unset for none.
    #[serde(default)]
    pub access_log: Option<String>,
    /// Access log line format.
    #[serde(default)]
    pub access_log_format: AccessLogFormat,
    /// The request-id field: sent upstream with every forwarded request, and in every access log
    /// line. A valid value from a `proxy.trusted_proxies` peer is kept; otherwise one is generated.
    #[serde(default = "default_request_id_header")]
    pub request_id_header: String,
}

fn default_request_id_header() -> String {
    "X-Request-Id".into()
}

fn default_level() -> String {
    "info".into()
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            level: default_level(),
            access_log: None,
            access_log_format: AccessLogFormat::default(),
            request_id_header: default_request_id_header(),
        }
    }
}

pub use crate::access_log::AccessLogFormat;
