//! The configuration's types and defaults. The keys fixed by the data-plane issue (`listen`,
//! `cache.path`, `cache.max_size`, `upstreams.<name>.servers`, `routes`) are the only required ones.

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the proxy listens: one `host:port` or a list of them. A host may be a name
    /// (`localhost:8080`, every address it resolves to) or an IPv6 literal (`[::]:8080`).
    pub listen: Listen,
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
    /// Several nodes acting as one cache (see `fleet.rs`); absent: this node is alone.
    #[serde(default)]
    pub fleet: Option<crate::fleet::FleetConfig>,
}

impl Config {
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
        ]
    }
}

fn default_backlog() -> u32 {
    511
}

/// `listen`: one address or a list, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// `listen: 127.0.0.1:8080`.
    One(String),
    /// `listen: [127.0.0.1:8080, "[::1]:8080"]`.
    Many(Vec<String>),
}

impl Listen {
    /// Every `host:port` written, in order.
    pub fn entries(&self) -> Vec<&str> {
        match self {
            Listen::One(s) => vec![s.as_str()],
            Listen::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }

    /// Every socket address to bind: each entry resolved (names to all their addresses),
    /// duplicates removed, in order.
    pub fn addrs(&self) -> Result<Vec<std::net::SocketAddr>, String> {
        use std::net::ToSocketAddrs;
        let mut out = Vec::new();
        for e in self.entries() {
            let resolved = e
                .to_socket_addrs()
                .map_err(|err| format!("`{e}` is not an address (host:port): {err}"))?;
            for a in resolved {
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
        if out.is_empty() {
            return Err("no address to listen on".into());
        }
        Ok(out)
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.entries().join(", "))
    }
}

impl Serialize for Listen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Listen::One(a) => s.serialize_str(a),
            Listen::Many(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Listen, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Listen;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an address (`host:port`) or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Listen, E> {
                Ok(Listen::One(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Listen, A::Error> {
                let mut v = Vec::new();
                while let Some(a) = seq.next_element::<String>()? {
                    v.push(a);
                }
                Ok(Listen::Many(v))
            }
        }
        d.deserialize_any(V)
    }
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

/// Access log line formats.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One space-separated line.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
    /// Apache/nginx "combined", with the cache status appended, for existing log tooling.
    Combined,
}

/// The disk cache.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Directory holding the cache files; created if missing.
    pub path: PathBuf,
    /// Upper bound of the bytes of all cache files; least recently used entries are evicted.
    #[serde(with = "crate::units::size")]
    pub max_size: ByteSize,
    /// Largest single sendfile(2) call, so one huge transfer cannot starve other connections.
    #[serde(default = "default_sendfile_max_chunk", with = "crate::units::size")]
    pub sendfile_max_chunk: ByteSize,
    /// Directory levels between `path` and the files (0 to 3, two hex digits each), so no
    /// directory holds millions of files.
    #[serde(default = "default_levels")]
    pub levels: u8,
    /// Most entries in the in-memory index; beyond it the least recently used are evicted.
    #[serde(default = "default_max_entries")]
    pub max_entries: usize,
    /// Most cache files kept open, so hot hits cost no open(2): `auto` (the default) or a
    /// number. Every one is a file descriptor, so the proxy bounds it by RLIMIT_NOFILE at start-up
    /// (see [`OpenFiles`]).
    #[serde(default = "default_open_files")]
    pub open_files: OpenFiles,
    /// Cap of heuristic freshness: responses without explicit freshness but with
    /// `Last-Modified` stay fresh for 10% of their age, at most this long (RFC 9111 §4.2.2).
    #[serde(default = "default_heuristic_max", with = "crate::units::duration")]
    pub heuristic_max: Duration,
    /// Read hits whose pages are not in the page cache on the blocking pool before sendfile, so a
    /// disk wait never stalls a runtime thread (like nginx's `aio threads`).
    #[serde(default = "default_true")]
    pub offload_cold_hits: bool,
    /// Targeted cache-control fields (RFC 9213) that govern zerocache's caching in place of
    /// `Cache-Control` and `Expires`: the first with a valid, non-empty Structured Field
    /// Dictionary wins; an invalid one is ignored.
    #[serde(default = "default_targeted")]
    pub targeted_fields: Vec<String>,
    /// Forward the targeted fields to clients (true, the default: a cache in front of or behind
    /// zerocache needs them), or hide them (false).
    #[serde(default = "default_true")]
    pub targeted_fields_forward: bool,
    /// A `Range` request on a miss is forwarded and its 206 relayed, never stored; when the 206
    /// says the whole object is at most this large, the whole object is fetched and stored in the
    /// background, so the next request is a hit.
    #[serde(default = "default_range_fill_max", with = "crate::units::size")]
    pub range_fill_max: ByteSize,
    /// Store 5xx responses that carry explicit freshness (RFC 9111 §3 allows it); `false` never
    /// stores a 5xx.
    #[serde(default = "default_true")]
    pub store_5xx: bool,
    /// A fill reads the origin into the cache file while clients read behind it; once no client
    /// is reading, it stops after this many bytes.
    #[serde(default = "default_range_fill_max", with = "crate::units::size")]
    pub abandoned_fill_max: ByteSize,
    /// ...or after this long with no client reading.
    #[serde(
        default = "default_abandoned_fill_timeout",
        with = "crate::units::duration"
    )]
    pub abandoned_fill_timeout: Duration,
    /// At start-up, verify the bodies of at most this many entries, chosen at random, against the
    /// checksum stored with them, before listening; a corrupt one is deleted. 0 verifies none.
    #[serde(default = "default_verify_on_start")]
    pub verify_on_start: usize,
    /// Bytes per second the background scrub reads to verify every stored body against its
    /// checksum, over and over; a corrupt entry is discarded. 0 turns the scrub off.
    #[serde(default = "default_scrub_rate", with = "crate::units::size")]
    pub scrub_rate: ByteSize,
}

fn default_verify_on_start() -> usize {
    64
}

fn default_scrub_rate() -> ByteSize {
    ByteSize::mib(8)
}

fn default_abandoned_fill_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_range_fill_max() -> ByteSize {
    ByteSize::mib(64)
}

fn default_targeted() -> Vec<String> {
    vec!["CDN-Cache-Control".into()]
}

fn default_heuristic_max() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_levels() -> u8 {
    2
}
fn default_max_entries() -> usize {
    1_000_000
}
fn default_open_files() -> OpenFiles {
    OpenFiles::Auto
}

/// `cache.open_files`: `auto` or a number.
///
/// A fixed default (it was 10,000) ignores the fd limit: under `ulimit -n 256` the open-file
/// cache alone exhausted the process's descriptors, and then neither connections nor cache files
/// could be opened. The proxy turns this into a number at start-up, once RLIMIT_NOFILE is known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OpenFiles {
    /// min(10,000, RLIMIT_NOFILE / 4): the rest stays for connections, upstreams and fills.
    #[default]
    Auto,
    /// At most this many; more than RLIMIT_NOFILE / 2 is clamped to that, with a warning.
    Max(usize),
}

impl<'de> Deserialize<'de> for OpenFiles {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor, as for `CpuAffinity`: a wrong value is named and located at the value.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = OpenFiles;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`auto` or a non-negative integer")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<OpenFiles, E> {
                usize::try_from(n)
                    .map(OpenFiles::Max)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<OpenFiles, E> {
                u64::try_from(n)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<OpenFiles, E> {
                match s {
                    "auto" => Ok(OpenFiles::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for OpenFiles {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // As written, so that `zerocache check`'s effective config reads back.
        match self {
            OpenFiles::Auto => s.serialize_str("auto"),
            OpenFiles::Max(n) => s.serialize_u64(*n as u64),
        }
    }
}

fn default_sendfile_max_chunk() -> ByteSize {
    ByteSize::mib(2)
}

/// One named group of upstream servers, with what nginx's `upstream` block has: a balancing
/// method, weights, passive health (`max_fails`/`fail_timeout`) and an optional active check.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// The servers: `host:port`, or `{addr, weight, max_fails, fail_timeout}`.
    pub servers: Vec<UpstreamServer>,
    /// Time allowed for a TCP connect.
    #[serde(default = "default_connect_timeout", with = "crate::units::duration")]
    pub connect_timeout: Duration,
    /// Time allowed between bytes of the upstream response.
    #[serde(default = "default_read_timeout", with = "crate::units::duration")]
    pub read_timeout: Duration,
    /// Idle keep-alive connections kept per server.
    #[serde(default = "default_pool_size")]
    pub keepalive: usize,
    /// How a request picks its server.
    #[serde(default)]
    pub balance: Balance,
    /// Failures (connect error, timeout, or an error before any response byte) within
    /// `fail_timeout` that mark a server down for `fail_timeout`; 0 never marks it down. A
    /// server's own `max_fails` overrides it.
    #[serde(default = "default_max_fails")]
    pub max_fails: u32,
    /// The window in which `max_fails` failures count, and how long a server then stays down.
    #[serde(default = "default_fail_timeout", with = "crate::units::duration")]
    pub fail_timeout: Duration,
    /// An active health check: each server is asked for a path periodically; unset: none.
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    /// The `Host` sent upstream (an object store needs its own name); unset: the client's
    /// normalised host. The cache key keeps the client's host either way.
    #[serde(default)]
    pub host: Option<String>,
}

impl Upstream {
    /// The servers with the group's defaults applied.
    pub fn resolved_servers(&self) -> Vec<ServerSpec> {
        self.servers
            .iter()
            .map(|s| match s {
                UpstreamServer::Addr(a) => ServerSpec {
                    addr: a.clone(),
                    weight: 1,
                    max_fails: self.max_fails,
                    fail_timeout: self.fail_timeout,
                },
                UpstreamServer::Detailed(d) => ServerSpec {
                    addr: d.addr.clone(),
                    weight: d.weight,
                    max_fails: d.max_fails.unwrap_or(self.max_fails),
                    fail_timeout: d.fail_timeout.unwrap_or(self.fail_timeout),
                },
            })
            .collect()
    }
}

/// One server of a group after defaults: what the proxy runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    /// `host:port`.
    pub addr: String,
    /// Relative share of requests.
    pub weight: u32,
    /// Failures within `fail_timeout` that mark it down (0: never).
    pub max_fails: u32,
    /// Failure window and time down.
    pub fail_timeout: Duration,
}

/// One entry of `servers`: a plain `host:port` (weight 1, the group's `max_fails` and
/// `fail_timeout`) or a map. Deserialised like an untagged enum, but by the YAML node's kind, so a
/// map with a misspelt key gets serde's "unknown field" error (with a suggestion) rather than
/// untagged's "data did not match any variant".
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum UpstreamServer {
    /// `host:port`.
    Addr(String),
    /// `{addr: host:port, weight: N, max_fails: N, fail_timeout: 10s}`.
    Detailed(ServerDetail),
}

impl UpstreamServer {
    /// The `host:port`.
    pub fn addr(&self) -> &str {
        match self {
            UpstreamServer::Addr(a) => a,
            UpstreamServer::Detailed(d) => &d.addr,
        }
    }
}

impl<'de> Deserialize<'de> for UpstreamServer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = UpstreamServer;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "`host:port` or `{addr: host:port, weight: N, max_fails: N, fail_timeout: D}`",
                )
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<UpstreamServer, E> {
                Ok(UpstreamServer::Addr(s.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<UpstreamServer, A::Error> {
                ServerDetail::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(UpstreamServer::Detailed)
            }
        }
        d.deserialize_any(V)
    }
}

/// A server written as a map.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerDetail {
    /// `host:port`.
    pub addr: String,
    /// Relative share of requests (nginx `weight=`), at least 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Overrides the group's `max_fails`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fails: Option<u32>,
    /// Overrides the group's `fail_timeout`.
    #[serde(
        default,
        with = "crate::units::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub fail_timeout: Option<Duration>,
}

/// How a request picks its server.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Smooth weighted round robin, as nginx's default.
    #[default]
    RoundRobin,
    /// The fewest requests in flight relative to weight (nginx `least_conn`).
    LeastConn,
    /// Rendezvous hashing of the cache key: one object, one server; removing a server moves only
    /// its own keys (nginx `hash $key consistent`).
    Hash,
}

/// An active health check of every server of a group.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// The path asked for with GET; a 2xx or 3xx is healthy.
    #[serde(default = "default_health_path")]
    pub path: String,
    /// Time between checks of a server.
    #[serde(default = "default_health_interval", with = "crate::units::duration")]
    pub interval: Duration,
    /// Time allowed for one check (connect and response head).
    #[serde(default = "default_health_timeout", with = "crate::units::duration")]
    pub timeout: Duration,
}

fn default_weight() -> u32 {
    1
}
fn default_max_fails() -> u32 {
    1
}
fn default_fail_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_health_path() -> String {
    "/".into()
}
fn default_health_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_health_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_read_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_pool_size() -> usize {
    32
}

/// A route: which requests go to which upstream.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// What the request must look like.
    #[serde(rename = "match")]
    pub matcher: RouteMatch,
    /// Name of an entry of `upstreams`.
    pub upstream: String,
    /// Whether responses on this route may be cached.
    #[serde(default = "default_true")]
    pub cache: bool,
    /// Freshness lifetime for responses that carry none (like nginx `proxy_cache_valid`); unset:
    /// such responses are not stored. Never overrides `no-store`, `private` or explicit freshness.
    #[serde(default, with = "crate::units::opt_duration")]
    pub default_ttl: Option<Duration>,
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
    /// Store responses that carry `Set-Cookie` and explicit freshness, replaying the cookie to
    /// every client (RFC 9111 allows it; nginx and Varnish don't by default). `false` never
    /// stores them.
    #[serde(default = "default_true")]
    pub store_set_cookie: bool,
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
fn default_true() -> bool {
    true
}

/// The dashboard, JSON API and `/metrics` listener.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DashboardConfig {
    /// Whether to serve it at all.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Address, loopback by default (9180: not Prometheus's own 9090).
    #[serde(default = "default_dashboard_listen")]
    pub listen: String,
    /// Bearer token for the page and the API; required when `listen` is not loopback.
    #[serde(default)]
    pub token: Option<String>,
    /// Require the token for `/metrics` too (Prometheus then sends it as `authorization`).
    #[serde(default)]
    pub metrics_require_token: bool,
    /// More names (`name` or `name:port`, case-insensitive; without a port, any port) the
    /// dashboard answers to. It always answers to its `listen` address, on loopback also to
    /// `localhost`, `127.0.0.1` and `[::1]` on its port, and on a wildcard address to any IP
    /// literal; a request with any other `Host` gets 421 (against DNS rebinding). List the names
    /// a wildcard listener is reached by, such as the one Prometheus scrapes.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

fn default_dashboard_listen() -> String {
    "127.0.0.1:9180".into()
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            enabled: true,
            listen: default_dashboard_listen(),
            token: None,
            metrics_require_token: false,
            allowed_hosts: Vec::new(),
        }
    }
}

/// The eBPF probe.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// Load the probe at start-up (needs root or CAP_BPF+CAP_PERFMON); without it the proxy serves
    /// on and reports the probe as off.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Processes to count.
    #[serde(default = "default_watch")]
    pub watch: Vec<WatchEntry>,
}

fn default_watch() -> Vec<WatchEntry> {
    vec![WatchEntry::Keyword(Keyword::SelfProcess)]
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            enabled: true,
            watch: default_watch(),
        }
    }
}

/// One `probe.watch` entry: `self`, `{pid: N}` or `{comm: NAME}`.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum WatchEntry {
    /// `self`.
    Keyword(Keyword),
    /// `{pid: 1234}`.
    Pid {
        /// The PID.
        pid: u32,
    },
    /// `{comm: nginx}`.
    Comm {
        /// The process name as in /proc/PID/comm.
        comm: String,
    },
}

impl<'de> Deserialize<'de> for WatchEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        // Parsed by hand: serde's untagged enums only say "did not match any variant".
        let v = serde_yaml::Value::deserialize(d)?;
        let expected = "expected `self`, `{pid: N}` or `{comm: NAME}`";
        match &v {
            serde_yaml::Value::String(s) if s == "self" => {
                Ok(WatchEntry::Keyword(Keyword::SelfProcess))
            }
            serde_yaml::Value::Mapping(m) if m.len() == 1 => {
                let (k, val) = m.iter().next().ok_or_else(|| D::Error::custom(expected))?;
                match (k.as_str(), val) {
                    (Some("pid"), serde_yaml::Value::Number(n)) => n
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .map(|pid| WatchEntry::Pid { pid })
                        .ok_or_else(|| D::Error::custom("pid must be a positive integer")),
                    (Some("comm"), serde_yaml::Value::String(c))
                        if !c.is_empty() && c.len() <= 15 =>
                    {
                        Ok(WatchEntry::Comm { comm: c.clone() })
                    }
                    (Some("comm"), _) => Err(D::Error::custom(
                        "comm must be a process name of 1 to 15 characters (as in /proc/PID/comm)",
                    )),
                    _ => Err(D::Error::custom(expected)),
                }
            }
            _ => Err(D::Error::custom(expected)),
        }
    }
}

/// Bare-word watch entries.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub enum Keyword {
    /// zerocache itself.
    #[serde(rename = "self")]
    SelfProcess,
}

/// Limits on client requests.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest request head (request line and headers); larger gets 431.
    #[serde(default = "default_max_header", with = "crate::units::size")]
    pub max_header_bytes: ByteSize,
    /// Longest request target; longer gets 414.
    #[serde(default = "default_max_uri", with = "crate::units::size")]
    pub max_uri_bytes: ByteSize,
    /// Time a client has to send a complete request head; slower gets 408.
    #[serde(default = "default_header_timeout", with = "crate::units::duration")]
    pub header_timeout: Duration,
    /// Time a keep-alive connection may sit idle between requests.
    #[serde(default = "default_idle_timeout", with = "crate::units::duration")]
    pub idle_timeout: Duration,
    /// Time allowed between reads of a request body; slower clients are disconnected.
    #[serde(
        default = "default_client_read_timeout",
        with = "crate::units::duration"
    )]
    pub read_timeout: Duration,
    /// Largest request body accepted; larger gets 413.
    #[serde(default = "default_max_body", with = "crate::units::size")]
    pub max_body_bytes: ByteSize,
    /// Most client connections open at once; further connections are closed on accept.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// On SIGTERM/SIGINT, how long in-flight responses may run before the process exits anyway.
    #[serde(default = "default_drain_timeout", with = "crate::units::duration")]
    pub drain_timeout: Duration,
    /// Longest time between two writes to a client that make progress (nginx's `send_timeout`);
    /// a client that stops reading is disconnected after it.
    #[serde(default = "default_send_timeout", with = "crate::units::duration")]
    pub send_timeout: Duration,
}

fn default_send_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_max_connections() -> usize {
    100_000
}
fn default_drain_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_body() -> ByteSize {
    ByteSize::mib(16)
}

fn default_max_header() -> ByteSize {
    ByteSize::kib(16)
}
fn default_max_uri() -> ByteSize {
    ByteSize::kib(8)
}
fn default_header_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_client_read_timeout() -> Duration {
    Duration::from_secs(30)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: default_max_header(),
            max_uri_bytes: default_max_uri(),
            header_timeout: default_header_timeout(),
            idle_timeout: default_idle_timeout(),
            read_timeout: default_client_read_timeout(),
            max_body_bytes: default_max_body(),
            max_connections: default_max_connections(),
            drain_timeout: default_drain_timeout(),
            send_timeout: default_send_timeout(),
        }
    }
}

/// The data-plane worker threads: how many, and whether each is pinned to a CPU (nginx's
/// `worker_processes` and `worker_cpu_affinity`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkersConfig {
    /// Worker threads; absent means one per CPU the process may use (its affinity mask, so
    /// `taskset` and cpusets count, and no more than a cgroup CPU quota allows). The data plane
    /// is syscall-bound: more threads than CPUs only add context switches.
    #[serde(default)]
    pub count: Option<usize>,
    /// Whether the workers are pinned one per allowed CPU, round robin, with each new connection
    /// given to a worker on the CPU its packets arrive on. `auto` (the default) pins them and
    /// moves a worker that keeps waiting for its CPU to the other CPUs for a while; `true` always
    /// pins; `false` never does.
    #[serde(default)]
    pub cpu_affinity: CpuAffinity,
}

/// `workers.cpu_affinity`: `auto`, `true` or `false`.
///
/// Pinned, a connection's sends, the ACKs that clock them and its socket lock stay on one CPU and
/// one backlog queue, which costs the proxy about two thirds of the CPU per GB of an unpinned
/// worker on large hits (docs/benchmark.md). The price is that a pinned worker
/// cannot leave a CPU that something else holds. An ordinary busy loop costs a waking worker
/// little (the scheduler lets it preempt), but a real-time task or a crowded CPU can hold it off
/// for hundreds of milliseconds (nginx leaves `worker_cpu_affinity` off unless asked). `auto`
/// keeps the pinning and moves such a worker to the other CPUs while its CPU is taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuAffinity {
    /// Never pinned (`false`).
    Off,
    /// Always pinned (`true`), as nginx's `worker_cpu_affinity auto`.
    On,
    /// Pinned, but a worker whose runs keep waiting for its CPU is moved to the other CPUs for a
    /// while.
    #[default]
    Auto,
}

impl<'de> Deserialize<'de> for CpuAffinity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor rather than an untagged enum, so that a wrong value is named ("did not match
        // any variant" otherwise) and located at the value itself.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = CpuAffinity;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`auto`, `true` or `false`")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<CpuAffinity, E> {
                Ok(if b { CpuAffinity::On } else { CpuAffinity::Off })
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<CpuAffinity, E> {
                match s {
                    "auto" => Ok(CpuAffinity::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for CpuAffinity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The way it is written, so that `zerocache check`'s effective config reads back.
        match self {
            CpuAffinity::On => s.serialize_bool(true),
            CpuAffinity::Off => s.serialize_bool(false),
            CpuAffinity::Auto => s.serialize_str("auto"),
        }
    }
}

/// Switches for demonstrations and tests.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// Plant the zero-copy bug on purpose: send bodies from cache files (hits, and misses read
    /// behind their fill) with read(2)+write(2) instead of sendfile(2), while still declaring them
    /// zero-copy, so the violation detector has something to find.
    #[serde(default)]
    pub copy_hits: bool,
    /// Use only this many bits of the cache-key hash, to force collisions in tests. Never set it
    /// in production: collisions are still safe (the full key is compared) but cost hit ratio.
    #[serde(default)]
    pub key_hash_bits: Option<u8>,
}
