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
                    addr: a.addr().to_string(),
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
            loop {
                let pooled = {
                    let mut idle = s.idle.lock();
                    match idle.iter().rposition(|(w, _)| *w == me) {
                        Some(at) => Some(idle.remove(at)),
                        None => idle.pop(),
                    }
                };
                let Some((worker, stream)) = pooled else {
                    break;
                };
                if !quiet(&stream) {
                    // Bytes (a late body, a stray response) or a close arrived while it was idle:
                    // reusing it would read them as the next response. Drop it; try the next.
                    continue;
                }
                let stream = if worker == me {
                    stream
                } else {
                    match stream.into_std().and_then(TcpStream::from_std) {
                        Ok(s) => s,
                        // Could not move it: drop it and try the next.
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
        self.read_response_head(conn, on_interim).await
    }

    /// Reads the final response head of a request already sent on `conn` (a streamed request
    /// body is sent by the caller), forwarding interim 103 heads to `on_interim`.
    pub async fn response_head(
        &self,
        conn: &mut UpstreamConn,
        on_interim: &mut Vec<ResponseHead>,
    ) -> Result<ResponseHead, UpstreamError> {
        self.read_response_head(conn, on_interim)
            .await
            .map_err(ExchangeError::into_inner)
    }

    async fn read_response_head(
        &self,
        conn: &mut UpstreamConn,
        on_interim: &mut Vec<ResponseHead>,
    ) -> Result<ResponseHead, ExchangeError> {
        let mut got_any = !conn.buf.is_empty();
        let mut interim = 0usize;
        loop {
            match parse_head(&conn.buf) {
                Ok(Some((head, n))) => {
                    let _ = conn.buf.split_to(n);
                    if (100..200).contains(&head.status) {
                        interim += 1;
                        if interim > MAX_INTERIM {
                            // Each is bounded in size, but an endless stream of them would hold
                            // the exchange (and the memory of the 103s kept) forever.
                            return Err(ExchangeError::After(UpstreamError::Protocol(
                                "too many interim responses".into(),
                            )));
                        }
                        match head.status {
                            // The proxy answers a client's Expect itself and never sends one
                            // upstream: an origin's 100 is for nobody.
                            100 => {}
                            101 => {
                                // No Upgrade is ever forwarded: a switch is a protocol error.
                                return Err(ExchangeError::After(UpstreamError::Protocol(
                                    "101 Switching Protocols without an Upgrade".into(),
                                )));
                            }
                            // RFC 9110 §15.2: a proxy forwards the 1xx it did not ask for (102,
                            // 103 Early Hints, any other).
                            _ => on_interim.push(head),
                        }
                        continue;
                    }
                    return Ok(head);
                }
                Ok(None) => {}
                Err(e) => return Err(ExchangeError::After(UpstreamError::Protocol(e))),
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

/// True when an idle connection has nothing to read and is not closed: one `recv` with
/// `MSG_PEEK | MSG_DONTWAIT`, which reads the socket itself (a readiness cache could be stale for
/// a connection that just moved between runtimes).
fn quiet(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: the fd is open (borrowed from `stream`) and `byte` is a valid 1-byte buffer.
    let r = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// Most interim (1xx) responses accepted before the final one.
const MAX_INTERIM: usize = 8;

/// Largest response head (status line, fields and the blank line) accepted from an upstream;
/// each interim (1xx) head is held to it separately.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// [`response::parse`] with the [`MAX_RESPONSE_HEAD`] limit, exact whatever the reads delivered:
/// a complete head longer than the limit is rejected like an incomplete one that already is.
fn parse_head(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, String> {
    const TOO_LARGE: &str = "response head too large";
    match response::parse(buf)? {
        Some((_, n)) if n > MAX_RESPONSE_HEAD => Err(TOO_LARGE.into()),
        Some(done) => Ok(Some(done)),
        None if buf.len() > MAX_RESPONSE_HEAD => Err(TOO_LARGE.into()),
        None => Ok(None),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A response head of exactly `len` bytes (one padding field), followed by `body`.
    fn head_of(len: usize, body: &[u8]) -> Vec<u8> {
        let start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: ";
        let end = b"\r\n\r\n";
        let mut wire = start.to_vec();
        wire.resize(len - end.len(), b'p');
        wire.extend_from_slice(end);
        assert_eq!(wire.len(), len);
        wire.extend_from_slice(body);
        wire
    }

    #[test]
    fn response_head_limit_is_exact() {
        let at = head_of(MAX_RESPONSE_HEAD, b"ok");
        let (head, n) = parse_head(&at).expect("at the limit").expect("complete");
        assert_eq!((head.status, n), (200, MAX_RESPONSE_HEAD));
        // Complete in the buffer yet one byte over: rejected, however it arrived.
        let over = head_of(MAX_RESPONSE_HEAD + 1, b"ok");
        assert_eq!(
            parse_head(&over).map(|h| h.is_some()),
            Err("response head too large".to_string())
        );
        let big = head_of(70_000, b"ok");
        assert!(parse_head(&big).is_err());
        // Incomplete: wait up to the limit, reject past it.
        assert!(matches!(parse_head(&over[..MAX_RESPONSE_HEAD]), Ok(None)));
        assert_eq!(
            parse_head(&over[..MAX_RESPONSE_HEAD + 1]).map(|h| h.is_some()),
            Err("response head too large".to_string())
        );
        // A small head followed by a large body is fine.
        let mut small = head_of(100, b"");
        small.resize(200_000, b'b');
        let (_, n) = parse_head(&small).expect("small head").expect("complete");
        assert_eq!(n, 100);
    }
}
