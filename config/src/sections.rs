//! Every schema error in a file, not just the first. serde stops at the first value that does
//! not fit, so an operator who fixed one key would find the next only on the next run. When the
//! whole file fails, each top-level section is parsed again on its own, as the type it must be,
//! and each section's first error is reported with its line in the file. Validation (which
//! needs the whole config) runs only once every section parses.

use crate::error::{ConfigError, from_yaml_at};
use crate::schema::*;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

/// The top-level keys, as the schema names them.
pub const TOP_LEVEL: &[&str] = &[
    "listen",
    "backlog",
    "cache",
    "upstreams",
    "routes",
    "dashboard",
    "probe",
    "limits",
    "workers",
    "logging",
    "proxy",
    "debug",
    "tls",
    "fleet",
];

/// The first error of each top-level section of `text`, beside `whole` (the whole file's first
/// error, which may lie outside any section: a YAML syntax error, a missing or unknown key).
pub(crate) fn errors(text: &str, file: &str, whole: ConfigError) -> ConfigError {
    let mut all = vec![whole];
    for (key, first_line, block) in split(text) {
        let e = match key {
            "listen" => first_error::<Listen>(&block),
            "backlog" => first_error::<u32>(&block),
            "cache" => first_error::<CacheConfig>(&block),
            "upstreams" => first_error::<BTreeMap<String, Upstream>>(&block),
            "routes" => first_error::<Vec<Route>>(&block),
            "dashboard" => first_error::<DashboardConfig>(&block),
            "probe" => first_error::<ProbeConfig>(&block),
            "tls" => first_error::<crate::tls::TlsListener>(&block),
            "limits" => first_error::<Limits>(&block),
            "workers" => first_error::<WorkersConfig>(&block),
            "logging" => first_error::<LoggingConfig>(&block),
            "proxy" => first_error::<ProxyConfig>(&block),
            "debug" => first_error::<DebugConfig>(&block),
            "fleet" => first_error::<crate::fleet::FleetConfig>(&block),
            _ => None,
        };
        if let Some(e) = e {
            all.push(from_yaml_at(file, &e, first_line - 1));
        }
    }
    ConfigError::from_list(all)
}

/// The error of `block` (`key: ...` and its indented lines) read as a one-key map of `T`.
fn first_error<T: DeserializeOwned>(block: &str) -> Option<serde_yaml::Error> {
    serde_yaml::from_str::<BTreeMap<String, T>>(block).err()
}

/// The top-level sections: key, 1-based first line, and the block's text (the key's line and
/// every following line up to the next top-level key).
fn split(text: &str) -> Vec<(&str, usize, String)> {
    let mut out: Vec<(&str, usize, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let top = line
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace() && c != '#' && c != '-');
        let key = line.split_once(':').map(|(k, _)| k.trim());
        match key {
            Some(k) if top && TOP_LEVEL.contains(&k) => {
                out.push((k, i + 1, format!("{line}\n")));
            }
            _ if top => {
                // Anything else at column 0 ends the section before it.
                out.push(("", i + 1, String::new()));
            }
            _ => {
                if let Some((_, _, block)) = out.last_mut() {
                    block.push_str(line);
                    block.push('\n');
                }
            }
        }
    }
    out.retain(|(k, _, _)| !k.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_start_at_top_level_keys_and_end_at_the_next() {
        let text = "# comment\nlisten: a\ncache:\n  path: /x\n\n  max_size: 1g\nbogus: 1\n  indented: 2\nroutes:\n- match: {}\n";
        let s = split(text);
        let keys: Vec<(&str, usize)> = s.iter().map(|(k, l, _)| (*k, *l)).collect();
        assert_eq!(keys, [("listen", 2), ("cache", 3), ("routes", 9)]);
        assert_eq!(s[1].2, "cache:\n  path: /x\n\n  max_size: 1g\n");
        assert_eq!(s[2].2, "routes:\n- match: {}\n");
    }
}
