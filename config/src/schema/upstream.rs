//! `upstreams:`: the origin groups, their servers, balancing, health checks and timeouts.

use serde::{Deserialize, Serialize};
use std::time::Duration;

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
