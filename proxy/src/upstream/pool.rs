//! Connection pools and the request/response-head exchange.

use crate::http::response::{self, ResponseHead};
use crate::server::workers;
use bytes::BytesMut;
use parking_lot::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zerocache_config::Upstream;

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
}

impl UpstreamError {
    /// Status for the client: 504 for timeouts, 502 otherwise.
    pub fn status(&self) -> u16 {
        match self {
            UpstreamError::Timeout(_) => 504,
            _ => 502,
        }
    }

    /// Metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Connect { .. } => "connect",
            UpstreamError::Timeout(_) => "timeout",
            UpstreamError::Closed | UpstreamError::Truncated => "closed",
            UpstreamError::Protocol(_) => "protocol",
            UpstreamError::Io(_) => "io",
        }
    }
}

/// One named upstream group.
pub struct Group {
    /// The group's name (metrics label).
    pub name: String,
    servers: Vec<Server>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Read timeout (between bytes).
    pub read_timeout: Duration,
    keepalive: usize,
}

struct Server {
    addr: String,
    /// Idle connections and the data-plane worker whose runtime polls each.
    idle: Mutex<Vec<(usize, TcpStream)>>,
}

/// A connection to one server of a group.
pub struct UpstreamConn {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes read past the current response head.
    pub buf: BytesMut,
    server: usize,
    /// The worker whose runtime polls `stream` ([`workers::current`]).
    worker: usize,
    /// Came from the pool (may have been closed by the server meanwhile).
    pub reused: bool,
}

impl Group {
    /// Builds a group from its config.
    pub fn new(name: &str, cfg: &Upstream) -> Group {
        Group {
            name: name.to_string(),
            servers: cfg
                .servers
                .iter()
                .map(|a| Server {
                    addr: a.clone(),
                    idle: Mutex::new(Vec::new()),
                })
                .collect(),
            connect_timeout: cfg.connect_timeout,
            read_timeout: cfg.read_timeout,
            keepalive: cfg.keepalive,
        }
    }

    /// A pooled connection if one is idle, else a new one (servers in order, failing over).
    /// Prefers a connection this worker polls already; one another worker polls is moved to this
    /// worker's runtime first, so its readiness never waits on a thread busy with other clients.
    pub async fn connect(&self) -> Result<UpstreamConn, UpstreamError> {
        let me = workers::current();
        for (i, s) in self.servers.iter().enumerate() {
            let pooled = {
                let mut idle = s.idle.lock();
                match idle.iter().rposition(|(w, _)| *w == me) {
                    Some(at) => Some(idle.remove(at)),
                    None => idle.pop(),
                }
            };
            if let Some((worker, stream)) = pooled {
                let stream = if worker == me {
                    stream
                } else {
                    match stream.into_std().and_then(TcpStream::from_std) {
                        Ok(s) => s,
                        // Could not move it: drop it and go on to the next server or a new connection.
                        Err(_) => continue,
                    }
                };
                return Ok(UpstreamConn {
                    stream,
                    buf: BytesMut::with_capacity(16 * 1024),
                    server: i,
                    worker: me,
                    reused: true,
                });
            }
        }
        self.connect_fresh().await
    }

    /// A new connection, trying each server in order.
    pub async fn connect_fresh(&self) -> Result<UpstreamConn, UpstreamError> {
        let mut last = UpstreamError::Connect {
            server: String::new(),
            error: "no servers".into(),
        };
        for (i, s) in self.servers.iter().enumerate() {
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&s.addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(UpstreamConn {
                        stream,
                        buf: BytesMut::with_capacity(16 * 1024),
                        server: i,
                        worker: workers::current(),
                        reused: false,
                    });
                }
                Ok(Err(e)) => {
                    tracing::warn!(upstream = %self.name, server = %s.addr, error = %e, "upstream connect failed; trying next");
                    last = UpstreamError::Connect {
                        server: s.addr.clone(),
                        error: e.to_string(),
                    };
                }
                Err(_) => {
                    tracing::warn!(upstream = %self.name, server = %s.addr, "upstream connect timed out; trying next");
                    last = UpstreamError::Connect {
                        server: s.addr.clone(),
                        error: format!("timed out after {:?}", self.connect_timeout),
                    };
                }
            }
        }
        Err(last)
    }

    /// Returns a connection whose response was fully read to the pool.
    pub fn release(&self, conn: UpstreamConn) {
        if !conn.buf.is_empty() {
            return; // Bytes beyond the response: the connection is out of step; drop it.
        }
        if let Some(s) = self.servers.get(conn.server) {
            let mut idle = s.idle.lock();
            if idle.len() < self.keepalive {
                idle.push((conn.worker, conn.stream));
            }
        }
    }

    /// Sends `request` (head and body bytes) and reads the final response head, forwarding
    /// interim 103 heads to `on_interim`. A pooled connection that fails before any response byte
    /// is replaced by a fresh one once, for idempotent requests.
    pub async fn exchange(
        &self,
        request: &[u8],
        idempotent: bool,
        on_interim: &mut Vec<ResponseHead>,
    ) -> Result<(UpstreamConn, ResponseHead), UpstreamError> {
        let mut conn = self.connect().await?;
        match self.try_exchange(&mut conn, request, on_interim).await {
            Ok(head) => Ok((conn, head)),
            Err(ExchangeError::BeforeResponse(e)) if conn.reused && idempotent => {
                tracing::debug!(upstream = %self.name, error = %e, "pooled connection was dead; retrying on a fresh one");
                let mut fresh = self.connect_fresh().await?;
                let head = self
                    .try_exchange(&mut fresh, request, on_interim)
                    .await
                    .map_err(ExchangeError::into_inner)?;
                Ok((fresh, head))
            }
            Err(e) => Err(e.into_inner()),
        }
    }

    async fn try_exchange(
        &self,
        conn: &mut UpstreamConn,
        request: &[u8],
        on_interim: &mut Vec<ResponseHead>,
    ) -> Result<ResponseHead, ExchangeError> {
        conn.stream
            .write_all(request)
            .await
            .map_err(|e| ExchangeError::BeforeResponse(e.into()))?;
        let mut got_any = false;
        loop {
            match response::parse(&conn.buf) {
                Ok(Some((head, n))) => {
                    let _ = conn.buf.split_to(n);
                    if (100..200).contains(&head.status) {
                        if head.status == 103 {
                            on_interim.push(head);
                        }
                        continue;
                    }
                    return Ok(head);
                }
                Ok(None) => {}
                Err(e) => return Err(ExchangeError::After(UpstreamError::Protocol(e))),
            }
            if conn.buf.len() > 64 * 1024 {
                return Err(ExchangeError::After(UpstreamError::Protocol(
                    "response head too large".into(),
                )));
            }
            let read =
                tokio::time::timeout(self.read_timeout, conn.stream.read_buf(&mut conn.buf)).await;
            match read {
                Err(_) => {
                    return Err(ExchangeError::After(UpstreamError::Timeout(
                        self.read_timeout,
                    )));
                }
                Ok(Ok(0)) if !got_any => {
                    return Err(ExchangeError::BeforeResponse(UpstreamError::Closed));
                }
                Ok(Ok(0)) => return Err(ExchangeError::After(UpstreamError::Closed)),
                Ok(Ok(_)) => got_any = true,
                Ok(Err(e)) if !got_any => return Err(ExchangeError::BeforeResponse(e.into())),
                Ok(Err(e)) => return Err(ExchangeError::After(e.into())),
            }
        }
    }
}

enum ExchangeError {
    BeforeResponse(UpstreamError),
    After(UpstreamError),
}

impl ExchangeError {
    fn into_inner(self) -> UpstreamError {
        match self {
            ExchangeError::BeforeResponse(e) | ExchangeError::After(e) => e,
        }
    }
}
