//! What RLIMIT_NOFILE allows: every client connection, upstream connection, fill and cached open
//! file is a descriptor, so the limit is raised to its hard value at start-up and then split, a
//! share for the open-file cache and the rest for connections, with every clamp logged (it
//! depends on the environment, not only on the config).

use crate::cache::store::open_files_budget;
use zerocache_config::{Config, OpenFiles};

/// Raises RLIMIT_NOFILE's soft limit to the hard limit: every connection and every cached open
/// file is an fd.
pub(crate) fn raise_nofile() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    if soft < hard {
        // Refused or not, the hard limit is what was asked for; the caller reads the limit back.
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        return hard;
    }
    soft
}

/// The open-file cache's size for `cache.open_files` under a soft RLIMIT_NOFILE of `nofile`
/// (see [`open_files_budget`]), logged since it depends on the environment and not only on the
/// config.
pub(crate) fn open_files_for(setting: OpenFiles, nofile: u64) -> usize {
    let requested = match setting {
        OpenFiles::Auto => None,
        OpenFiles::Max(n) => Some(n),
    };
    let (open_files, clamped) = open_files_budget(requested, nofile);
    if clamped {
        tracing::warn!(
            requested,
            open_files,
            nofile,
            "cache.open_files is above half of RLIMIT_NOFILE; clamped so connections keep the other half"
        );
    }
    match requested {
        None => tracing::info!(open_files, nofile, "cache.open_files: auto"),
        Some(_) => tracing::info!(open_files, nofile, "cache.open_files"),
    }
    open_files
}

/// The most client connections RLIMIT_NOFILE could ever hold: each needs at least its own socket,
/// so a `limits.max_connections` above the fd limit is a limit that can never act, and the
/// operator who wrote it believes in a capacity the process does not have. Below it, running out
/// of fds (a connection also holds an upstream socket and a cache file) is still answered with
/// the canned 503 (see `server::workers`).
pub(crate) fn connection_cap(nofile: u64) -> usize {
    usize::try_from(nofile).unwrap_or(usize::MAX).max(1)
}

pub(crate) fn warn_if_clamped(config: &Config, cap: usize, nofile: u64) {
    if config.limits.max_connections > cap {
        tracing::warn!(
            max_connections = config.limits.max_connections,
            nofile,
            clamped_to = cap,
            "limits.max_connections is above what RLIMIT_NOFILE allows; clamped"
        );
    }
}
