//! Why a connection ends without (further) response: its own type, so the parts of a request
//! that never touch the connection (the fetch, the request body's types) can name the error
//! without importing the connection.

/// Why a connection must end without (further) response.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Client socket error.
    #[error("client I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A response was cut short (upstream failure mid-body, truncated cache file).
    #[error("response aborted: {0}")]
    Aborted(String),
}
