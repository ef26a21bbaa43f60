//! `dashboard:` and `probe:`: the window on the proxy and which processes the probe watches.

use super::default_true;
use serde::{Deserialize, Serialize};

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
