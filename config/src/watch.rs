//! The config file of `zerocache watch`: which processes to watch, the dashboard and logging. A
//! schema of its own, because watch mode runs no proxy: a proxy config's `listen`, `cache` and
//! `upstreams` mean nothing there, and a watch file must not need them. Same rules as the proxy's
//! config: unknown keys are errors, and every error names the file, line, column and key.
//!
//! ```yaml
//! watch:
//!   - comm: java
//!   - pid: 4242
//! dashboard:
//!   listen: 127.0.0.1:9181   # the default; a proxy's dashboard has 9180
//! logging:
//!   level: info
//! ```

use crate::error::{self, ConfigError};
use crate::schema::{Keyword, WatchEntry};
use crate::validate::Invalid;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;

/// The whole watch-mode file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    /// Processes to watch: `{pid: N}` or `{comm: NAME}` (names re-resolved every second).
    #[serde(default)]
    pub watch: Vec<WatchEntry>,
    /// The dashboard, API and `/metrics`.
    #[serde(default)]
    pub dashboard: WatchDashboard,
    /// Log level.
    #[serde(default)]
    pub logging: WatchLogging,
}

/// `dashboard:` in watch mode: the proxy's keys, with its own default address.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WatchDashboard {
    /// Whether to serve it at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Address; 9181 by default, so it never collides with a proxy's dashboard on 9180.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Bearer token for the page and the API; required when `listen` is not loopback.
    #[serde(default)]
    pub token: Option<String>,
    /// Require the token for `/metrics` too.
    #[serde(default)]
    pub metrics_require_token: bool,
    /// More names the dashboard answers to (see the proxy's `dashboard.allowed_hosts`).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// The default watch-mode dashboard address.
pub const DEFAULT_WATCH_DASHBOARD: &str = "127.0.0.1:9181";

fn yes() -> bool {
    true
}

fn default_listen() -> String {
    DEFAULT_WATCH_DASHBOARD.into()
}

impl Default for WatchDashboard {
    fn default() -> Self {
        WatchDashboard {
            enabled: true,
            listen: default_listen(),
            token: None,
            metrics_require_token: false,
            allowed_hosts: Vec::new(),
        }
    }
}

/// `logging:` in watch mode: only the level (there is no access log without a proxy).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WatchLogging {
    /// `error`, `warn`, `info`, `debug` or `trace` (or a tracing filter); `RUST_LOG` overrides it.
    #[serde(default = "default_level")]
    pub level: String,
}

fn default_level() -> String {
    "warn".into()
}

impl Default for WatchLogging {
    fn default() -> Self {
        WatchLogging {
            level: default_level(),
        }
    }
}

/// Reads, parses and validates a watch-mode file.
pub fn load_watch(path: &Path) -> Result<WatchConfig, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        file: file.clone(),
        error: e.to_string(),
    })?;
    parse_watch(&text, &file)
}

/// Parses and validates watch-mode config text; `file` names it in errors.
pub fn parse_watch(text: &str, file: &str) -> Result<WatchConfig, ConfigError> {
    let config: WatchConfig =
        serde_yaml::from_str(text).map_err(|e| error::from_yaml(file, text, &e))?;
    let errs = validate_watch(&config);
    if errs.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::from_list(
            errs.into_iter()
                .map(|v| error::from_validation(file, text, v))
                .collect(),
        ))
    }
}

/// The checks that need more than a type: addresses, the token rules, no `self`.
pub fn validate_watch(config: &WatchConfig) -> Vec<Invalid> {
    let mut errs = Vec::new();
    for (i, w) in config.watch.iter().enumerate() {
        if matches!(w, WatchEntry::Keyword(Keyword::SelfProcess)) {
            errs.push(Invalid {
                path: format!("watch[{i}]"),
                message: "`self` is zerocache itself; watch mode watches other processes: name a `{pid: N}` or a `{comm: NAME}`".into(),
            });
        }
    }
    let d = &config.dashboard;
    if d.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        errs.push(Invalid {
            path: "dashboard.token".into(),
            message:
                "is empty or only whitespace, which is no token: set a real one or remove the key"
                    .into(),
        });
    }
    if d.enabled {
        match d.listen.parse::<SocketAddr>() {
            Err(e) => errs.push(Invalid {
                path: "dashboard.listen".into(),
                message: format!("`{}` is not an address (host:port): {e}", d.listen),
            }),
            Ok(a) if !a.ip().is_loopback() && d.token.is_none() => errs.push(Invalid {
                path: "dashboard.listen".into(),
                message: format!(
                    "`{a}` is not loopback: set `dashboard.token` so the dashboard and its API need a bearer token"
                ),
            }),
            Ok(_) => {}
        }
        if d.metrics_require_token && d.token.is_none() {
            errs.push(Invalid {
                path: "dashboard.metrics_require_token".into(),
                message: "needs `dashboard.token`".into(),
            });
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_watches_nothing_on_9181() {
        let c = parse_watch("{}\n", "w.yaml").expect("valid");
        assert!(c.watch.is_empty());
        assert_eq!(c.dashboard.listen, "127.0.0.1:9181");
        assert_eq!(c.logging.level, "warn");
    }

    #[test]
    fn targets_parse_and_errors_name_line_and_key() {
        let c = parse_watch("watch:\n  - comm: java\n  - pid: 42\n", "w.yaml").expect("valid");
        assert_eq!(
            c.watch,
            vec![
                WatchEntry::Comm {
                    comm: "java".into()
                },
                WatchEntry::Pid { pid: 42 }
            ]
        );
        let e = parse_watch(
            "watch:\n  - self\ndashboard:\n  listen: 0.0.0.0:9181\n",
            "w.yaml",
        )
        .expect_err("invalid");
        let all: Vec<String> = e.each().iter().map(|e| e.to_string()).collect();
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all[0].starts_with("w.yaml:2:"), "{all:?}");
        assert!(all[0].contains("watch[0]"), "{all:?}");
        assert!(all[1].starts_with("w.yaml:4:"), "{all:?}");
        assert!(all[1].contains("not loopback"), "{all:?}");
        let e = parse_watch("cache:\n  path: /x\n", "w.yaml").expect_err("unknown key");
        assert!(e.to_string().contains("unknown field `cache`"), "{e}");
    }
}
