//! The ledger's vocabulary: what a response was (`CacheStatus`), which path its body was meant to
//! take (`DataPath`), and why a connection was refused (`RejectReason`). The data plane produces
//! these values and the dashboard and `/metrics` render them; every metric label set is derived
//! from the `ALL` lists here, so a new value cannot be forgotten in one of them.

use serde::Serialize;

/// `X-Cache` values (nginx's `$upstream_cache_status`), plus `Error` for answers the proxy made up
/// itself (4xx for bad requests, 502/504).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CacheStatus {
    /// Served from a fresh entry.
    Hit,
    /// Not in the cache; fetched.
    Miss,
    /// In the cache but stale; fetched again.
    Expired,
    /// Stale entry served.
    Stale,
    /// Stale entry revalidated with the upstream.
    Revalidated,
    /// Cache not consulted (route, method or rule).
    Bypass,
    /// The proxy answered on its own (bad request, upstream failure).
    Error,
}

impl CacheStatus {
    /// All values, in metric order.
    pub const ALL: [CacheStatus; 7] = [
        CacheStatus::Hit,
        CacheStatus::Miss,
        CacheStatus::Expired,
        CacheStatus::Stale,
        CacheStatus::Revalidated,
        CacheStatus::Bypass,
        CacheStatus::Error,
    ];

    /// The status an `X-Cache` value names (a fleet owner's, relayed), if it is one of ours.
    pub fn from_x_cache(value: &str) -> Option<CacheStatus> {
        CacheStatus::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(value.trim()))
    }

    /// The `X-Cache` token and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Expired => "EXPIRED",
            CacheStatus::Stale => "STALE",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Bypass => "BYPASS",
            CacheStatus::Error => "ERROR",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Which path a response body was meant to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataPath {
    /// sendfile(2) from the cache file.
    Zerocopy,
    /// Copied through user space (misses stream the upstream body; error bodies).
    Copy,
}

impl DataPath {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            DataPath::Zerocopy => "zerocopy",
            DataPath::Copy => "copy",
        }
    }
}

/// Why a connection was answered 503 as soon as it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// `limits.max_connections` open already.
    MaxConnections,
    /// The process ran out of file descriptors.
    OutOfFds,
}

/// Every [`RejectReason`], in metric order.
pub const REJECT_REASONS: [RejectReason; 2] =
    [RejectReason::MaxConnections, RejectReason::OutOfFds];

impl RejectReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::MaxConnections => "max_connections",
            RejectReason::OutOfFds => "out_of_fds",
        }
    }
}

/// Connection id, unique for the process's lifetime.
pub type ConnId = u64;

/// The protocol a response went out in: the metric label, as ALPN names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Protocol {
    /// HTTP/1.1 (and 1.0), plain or TLS.
    Http1,
    /// HTTP/2, by ALPN on TLS or h2c.
    H2,
}

impl Protocol {
    /// All values, in metric order.
    pub const ALL: [Protocol; 2] = [Protocol::Http1, Protocol::H2];

    /// The `protocol` label: the ALPN identifier.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http/1.1",
            Protocol::H2 => "h2",
        }
    }

    /// Its index in [`Protocol::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}
