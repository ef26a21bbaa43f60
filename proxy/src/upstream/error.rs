//! Why an upstream exchange failed, and what the client is told: each failure maps to one status
//! (502 or 504), one `Cache-Status` detail and one `zerocache_upstream_errors_total` kind.

use std::time::Duration;

/// Why an upstream exchange failed; each maps to the status the client gets.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No server accepted a connection.
    #[error("connect to {server} failed: {error}")]
    Connect {
        /// Last server tried.
        server: String,
        /// Last error.
        error: String,
    },
    /// No response (or no further bytes) within the read timeout.
    #[error("upstream timed out after {0:?}")]
    Timeout(Duration),
    /// The upstream closed before a complete response head.
    #[error("upstream closed the connection before responding")]
    Closed,
    /// The upstream closed in the middle of a body.
    #[error("upstream closed the connection mid-body")]
    Truncated,
    /// The response could not be parsed or framed.
    #[error("invalid upstream response: {0}")]
    Protocol(String),
    /// A socket error.
    #[error("upstream I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS handshake with an `https://` server failed.
    #[error("TLS to {server}: {error}")]
    Tls {
        /// The server.
        server: String,
        /// What failed.
        error: String,
        /// The failure was the certificate's verification.
        verify: bool,
    },
}

impl UpstreamError {
    /// Status for the client: 504 for timeouts, 502 otherwise.
    pub fn status(&self) -> u16 {
        match self {
            UpstreamError::Timeout(_) => 504,
            _ => 502,
        }
    }

    /// The `Cache-Status` `detail=` of the proxy's answer, when the error has one.
    pub fn detail(&self) -> Option<&'static str> {
        match self {
            UpstreamError::Tls { verify: true, .. } => Some("tls-verify"),
            _ => None,
        }
    }

    /// Whether the group counted this failure already, attempt by attempt (a failed connect,
    /// counted even when another server then answered): the caller must not count it again.
    pub fn counted_per_attempt(&self) -> bool {
        matches!(self, UpstreamError::Connect { .. })
    }

    /// Metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Connect { .. } => "connect",
            UpstreamError::Timeout(_) => "timeout",
            UpstreamError::Closed | UpstreamError::Truncated => "closed",
            UpstreamError::Protocol(_) => "protocol",
            UpstreamError::Io(_) => "io",
            UpstreamError::Tls { .. } => "tls",
        }
    }
}

/// How an exchange failed, which decides whether it counts against the server and may go to
/// another.
pub(super) enum ExchangeError {
    /// Closed or failed before any response byte: maybe a pooled connection the server had
    /// closed, maybe a dead server.
    BeforeResponse(UpstreamError),
    /// No response byte within the read timeout: the server is not answering (never a stale
    /// pooled connection, which fails at once).
    TimedOut(UpstreamError),
    /// After part of a response: the server answered, badly.
    After(UpstreamError),
}

impl ExchangeError {
    pub(super) fn into_inner(self) -> UpstreamError {
        match self {
            ExchangeError::BeforeResponse(e)
            | ExchangeError::TimedOut(e)
            | ExchangeError::After(e) => e,
        }
    }
}

pub(super) fn no_servers() -> UpstreamError {
    UpstreamError::Connect {
        server: String::new(),
        error: "no servers".into(),
    }
}
