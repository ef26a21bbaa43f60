//! zerocache's configuration: one YAML file, parsed into the types of [`schema`], checked by
//! [`validate`], with every error naming the file, line, column and key path.
//!
//! Parsing is strict (`deny_unknown_fields` everywhere) because a misspelt key in a cache config
//! silently falls back to a default, and the default is usually "cache more than you meant".
#![forbid(unsafe_code)]

pub mod access_log;
mod cache_dir;
pub mod cidr;
pub mod error;
pub mod fleet;
pub mod rules_check;
pub mod schema;
mod sections;
mod slice_check;
pub mod template;
pub mod tls;
pub mod units;
pub mod validate;
pub mod watch;

pub use cache_dir::Dirs;
pub use error::ConfigError;
pub use schema::*;
pub use template::TemplatePart;

use std::path::Path;

/// Reads, parses and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        file: path.display().to_string(),
        error: e.to_string(),
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates config text; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
    // Not YAML at all: the one syntax error, where the scanner stopped. Parsing the sections
    // apart would only report it again at another position.
    if let Err(e) = serde_yaml::from_str::<serde_yaml::Value>(text) {
        return Err(error::from_yaml(file, text, &e));
    }
    let mut config: Config = serde_yaml::from_str(text)
        .map_err(|e| sections::errors(text, file, error::from_yaml(file, text, &e)))?;
    apply_env(&mut config, |k| std::env::var(k).ok());
    validate::validate(&config).map_err(|all| {
        ConfigError::from_list(
            all.into_iter()
                .map(|v| error::from_validation(file, text, v))
                .collect(),
        )
    })?;
    Ok(config)
}

/// Like [`load`], then checks that the cache directory is writable (creating it first when
/// `dirs` is [`Dirs::Create`]) and the TLS files readable: what `zerocache run` needs before it
/// starts, and `zerocache check` before it promises a start would work.
pub fn load_and_check_dirs(path: &Path, dirs: Dirs) -> Result<Config, ConfigError> {
    let config = load(path)?;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    cache_dir::check_cache_dir(&config, dirs)
        .map_err(|v| error::from_validation(&path.display().to_string(), &text, v))?;
    let unreadable = tls::check_files(&config);
    if !unreadable.is_empty() {
        return Err(ConfigError::from_list(
            unreadable
                .into_iter()
                .map(|v| error::from_validation(&path.display().to_string(), &text, v))
                .collect(),
        ));
    }
    Ok(config)
}

/// Per-host overrides operators set without editing the file.
pub fn apply_env(config: &mut Config, get: impl Fn(&str) -> Option<String>) {
    if let Some(listen) = get("ZEROCACHE_LISTEN") {
        config.listen = Listen::One(ListenEntry::plain(listen));
    }
    if let Some(path) = get("ZEROCACHE_CACHE_PATH") {
        config.cache.path = path.into();
    }
    // One config for every member of a fleet (a Kubernetes ConfigMap or Secret): each member's
    // own address comes from its environment (the pod's IP).
    if let (Some(fleet), Some(me)) = (config.fleet.as_mut(), get("ZEROCACHE_FLEET_SELF")) {
        fleet.self_addr = me;
    }
}
