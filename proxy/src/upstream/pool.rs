//! An upstream group: its servers' connection pools, the balancer's choice of server, failover
//! and passive health bookkeeping around the request/response-head exchange.

use super::balance::Balancer;
use super::error::{ExchangeError, UpstreamError, no_servers};
use super::health;
use super::peer::{InFlight, Outcome, Peer};
use super::stream::UpstreamStream;
use crate::http::response::{self, ResponseHead};
use crate::worker_id;
use bytes::BytesMut;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use zerocache_config::Upstream;

/// One named upstream group.
pub struct Group {
    /// The group's name (metrics label).
    pub name: String,
    pub(super) peers: Vec<Arc<Peer>>,
    balancer: Balancer,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Read timeout (between bytes).
    pub read_timeout: Duration,
    keepalive: usize,
    /// The `Host` sent upstream in place of the client's (`upstreams.NAME.host`).
    pub host: Option<String>,
    /// How `https://` servers are reached; the error if the group's TLS files did not load
    /// (checked before any config is used, so only a file changed in between gets here).
    pub(super) tls: Option<Result<Arc<crate::tls::client::OriginTls>, String>>,
    /// Stops the group's health-check tasks: on [`Group::retire`], or when dropped.
    stop: watch::Sender<bool>,
    /// Where each failed connect is counted (`zerocache_upstream_errors_total{kind="connect"}`),
    /// also when another server then answered; `None` for a fleet peer's group.
    accounting: Option<Arc<zerocache_ledger::Accounting>>,
}

/// A connection to one server of a group.
pub struct UpstreamConn {
    /// The socket, plain or TLS.
    pub stream: UpstreamStream,
    /// Bytes read past the current response head.
    pub buf: BytesMut,
    server: usize,
    /// The worker whose runtime polls `stream` ([`worker_id::current`]).
    worker: usize,
    /// Counts this request in its server's in-flight requests (`least_conn`) while it lives.
    _in_flight: InFlight,
}

impl Group {
    /// Builds a group from its config. Its health check, if any, starts with
    /// [`Group::start_health_check`].
    pub fn new(name: &str, cfg: &Upstream) -> Group {
        let peers: Vec<Arc<Peer>> = cfg
            .resolved_servers()
            .iter()
            .map(|s| Arc::new(Peer::new(s)))
            .collect();
        let tls = peers.iter().any(|p| p.tls).then(|| {
            crate::tls::client::OriginTls::build(cfg.tls.as_ref())
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        Group {
            name: name.to_string(),
            balancer: Balancer::new(cfg.balance, peers.len()),
            peers,
            connect_timeout: cfg.connect_timeout,
            read_timeout: cfg.read_timeout,
            keepalive: cfg.keepalive,
            host: cfg.host.clone(),
            tls,
            stop: watch::channel(false).0,
            accounting: None,
        }
    }

    /// Counts this group's failed connects in `acc`.
    pub fn counted_by(mut self, acc: Arc<zerocache_ledger::Accounting>) -> Group {
        self.accounting = Some(acc);
        self
    }

    /// Each server (`host:port`) and whether the balancer may pick it now: neither marked down
    /// by failures (passive) nor by the health check (active).
    pub fn servers_up(&self) -> Vec<(String, bool)> {
        let now = Instant::now();
        self.peers
            .iter()
            .map(|p| (p.addr.clone(), p.is_up(now)))
            .collect()
    }

    /// Starts the active health check of `cfg` (if it has one) on the current runtime; it runs
    /// until the group is retired or dropped.
    pub fn start_health_check(&self, cfg: &Upstream) {
        if let Some(check) = &cfg.health_check {
            health::spawn(
                &self.name,
                &self.peers,
                check,
                self.host.as_deref(),
                self.tls.as_ref().and_then(|t| t.as_ref().ok()).cloned(),
                &self.stop,
            );
        }
    }

    /// The address of the server `conn` is connected to (metrics label).
    pub fn server_of(&self, conn: &UpstreamConn) -> &str {
        self.peers.get(conn.server).map_or("", |p| p.addr.as_str())
    }

    /// The group was replaced (a reload): its health checks stop now, rather than when the last
    /// response still using it ends.
    pub fn retire(&self) {
        let _ = self.stop.send(true);
    }

    /// An idle pooled connection to server `i` that is still quiet, moved to this worker's
    /// runtime if another polled it. Prefers one this worker polls already, so its readiness
    /// never waits on a thread busy with other clients.
    fn pooled(&self, i: usize) -> Option<UpstreamConn> {
        let me = worker_id::current();
        let peer = &self.peers[i];
        loop {
            let (worker, stream) = {
                let mut idle = peer.idle.lock();
                match idle.iter().rposition(|(w, _)| *w == me) {
                    Some(at) => idle.remove(at),
                    None => idle.pop()?,
                }
            };
            if !stream.tcp().is_some_and(quiet) {
                // Bytes (a late body, a stray response) or a close arrived while it was idle:
                // reusing it would read them as the next response. Drop it; try the next.
                continue;
            }
            let stream = if worker == me {
                stream
            } else {
                match stream.rehome() {
                    Ok(s) => s,
                    // Could not move it: drop it and try the next.
                    Err(_) => continue,
                }
            };
            return Some(UpstreamConn {
                stream,
                buf: BytesMut::with_capacity(16 * 1024),
                server: i,
                worker: me,
                _in_flight: peer.in_flight(),
            });
        }
    }

    /// A new connection to server `i`; a failure is recorded against it.
    async fn open(&self, i: usize) -> Result<UpstreamConn, UpstreamError> {
        let peer = &self.peers[i];
        let in_flight = peer.in_flight();
        let error = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&peer.addr))
            .await
        {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                let stream = if peer.tls {
                    self.handshake(i, tcp).await?
                } else {
                    UpstreamStream::Plain(tcp)
                };
                return Ok(UpstreamConn {
                    stream,
                    buf: BytesMut::with_capacity(16 * 1024),
                    server: i,
                    worker: worker_id::current(),
                    _in_flight: in_flight,
                });
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("timed out after {:?}", self.connect_timeout),
        };
        self.failed(i, "connect", &error);
        if let Some(acc) = &self.accounting {
            // Every failed connect, also one the next server makes good: the exchange's own
            // failure is then not counted again (see `UpstreamError::counted_per_attempt`).
            acc.upstream_error(&self.name, "connect");
        }
        Err(UpstreamError::Connect {
            server: peer.addr.clone(),
            error,
        })
    }

    /// Records a failure of server `i` (see [`Peer::record`]).
    pub(super) fn failed(&self, i: usize, kind: &'static str, error: &dyn std::fmt::Display) {
        let peer = &self.peers[i];
        // Debug only: a client can make every request fail on a dead server. Marking it down is
        // logged, at most once per `fail_timeout`.
        tracing::debug!(upstream = %self.name, server = %peer.addr, kind, error = %error, "upstream server failed");
        if peer.record(Outcome::Failed(kind), Instant::now()) {
            tracing::warn!(upstream = %self.name, server = %peer.addr, kind, error = %error, down_for = ?peer.fail_timeout(), "upstream server marked down");
        }
    }

    /// Records that server `i` answered.
    fn answered(&self, i: usize) {
        self.peers[i].record(Outcome::Answered, Instant::now());
    }

    /// A new connection for a request with cache key `key` (used by `hash`), on the server the
    /// balancer picks, failing over to the next on connect failure (nothing was sent, so that is
    /// safe for any method). For requests whose body streams: no exchange retry is possible.
    pub async fn connect_fresh(&self, key: &str) -> Result<UpstreamConn, UpstreamError> {
        let mut tried = Vec::with_capacity(self.peers.len());
        let mut last = None;
        while let Some(i) = self.balancer.pick(&self.peers, key, &tried, Instant::now()) {
            tried.push(i);
            match self.open(i).await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(no_servers))
    }

    /// Returns a connection whose response was fully read to the pool.
    pub fn release(&self, conn: UpstreamConn) {
        if !conn.buf.is_empty() {
            return; // Bytes beyond the response: the connection is out of step; drop it.
        }
        if let Some(s) = self.peers.get(conn.server) {
            let mut idle = s.idle.lock();
            if idle.len() < self.keepalive {
                idle.push((conn.worker, conn.stream));
            }
        }
    }

    /// Sends `request` (head and body bytes) for cache key `key` (what `hash` balances on) and
    /// reads the final response head, forwarding interim 103 heads to `on_interim`.
    ///
    /// The balancer picks the server; a pooled connection to it is used when one is idle. A
    /// failure before any response byte (refused, timed out, closed, reset) is recorded against
    /// the server and the request goes to the next one the balancer picks: always when the
    /// connect failed (nothing was sent), otherwise only for idempotent requests (nginx's
    /// `proxy_next_upstream error timeout`), until every server was tried once. A pooled
    /// connection that turns out dead is the pool's race with the server's keep-alive timeout,
    /// not a failure: it is replaced by a fresh one to the same server. Each server tried is
    /// noted in `asked`: when all fail, the access log says which was asked last.
    pub async fn exchange(
        &self,
        request: &[u8],
        idempotent: bool,
        key: &str,
        on_interim: &mut Vec<ResponseHead>,
        asked: &mut Option<String>,
    ) -> Result<(UpstreamConn, ResponseHead), UpstreamError> {
        let mut tried = Vec::with_capacity(self.peers.len());
        let mut last = None;
        while let Some(i) = self.balancer.pick(&self.peers, key, &tried, Instant::now()) {
            tried.push(i);
            if let Some(p) = self.peers.get(i) {
                *asked = Some(p.addr.clone());
            }
            if let Some(mut conn) = self.pooled(i) {
                match self.try_exchange(&mut conn, request, on_interim).await {
                    Ok(head) => {
                        self.answered(i);
                        return Ok((conn, head));
                    }
                    Err(ExchangeError::BeforeResponse(e)) if idempotent => {
                        tracing::debug!(upstream = %self.name, error = %e, "pooled connection was dead; retrying on a fresh one");
                    }
                    Err(e @ ExchangeError::TimedOut(_)) => {
                        let e = self.attempt_failed(i, e).into_inner();
                        if idempotent {
                            last = Some(e);
                            continue;
                        }
                        return Err(e);
                    }
                    Err(e) => return Err(e.into_inner()),
                }
            }
            let mut conn = match self.open(i).await {
                Ok(c) => c,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            match self.try_exchange(&mut conn, request, on_interim).await {
                Ok(head) => {
                    self.answered(i);
                    return Ok((conn, head));
                }
                Err(e) => {
                    let e = self.attempt_failed(i, e);
                    match e {
                        ExchangeError::BeforeResponse(e) | ExchangeError::TimedOut(e)
                            if idempotent =>
                        {
                            last = Some(e);
                        }
                        e => return Err(e.into_inner()),
                    }
                }
            }
        }
        Err(last.unwrap_or_else(no_servers))
    }

    /// Records a failed exchange on server `i` when it says the server failed (no response byte
    /// at all); a bad or cut response is the origin answering, not a dead server.
    fn attempt_failed(&self, i: usize, e: ExchangeError) -> ExchangeError {
        match &e {
            ExchangeError::BeforeResponse(inner) | ExchangeError::TimedOut(inner) => {
                self.failed(i, inner.kind(), inner)
            }
            ExchangeError::After(_) => {}
        }
        e
    }

    async fn try_exchange(
        &self,
        conn: &mut UpstreamConn,
        request: &[u8],
        on_interim: &mut Vec<ResponseHead>,
    ) -> Result<ResponseHead, ExchangeError> {
        conn.stream
            .send_all(request)
            .await
            .map_err(|e| ExchangeError::BeforeResponse(e.into()))?;
        self.read_response_head(conn, on_interim, false).await
    }

    /// Reads the final response head of a request already sent on `conn` (a streamed request
    /// body is sent by the caller), forwarding interim 103 heads to `on_interim`.
    /// `body_delivered` is false when the body could not be sent whole (the origin stopped
    /// reading it): a missing answer then says nothing against the server, since a client that
    /// trickles or oversizes an upload would otherwise mark healthy origins down at will.
    pub async fn response_head(
        &self,
        conn: &mut UpstreamConn,
        on_interim: &mut Vec<ResponseHead>,
        body_delivered: bool,
    ) -> Result<ResponseHead, UpstreamError> {
        match self.read_response_head(conn, on_interim, false).await {
            Ok(head) => {
                self.answered(conn.server);
                Ok(head)
            }
            Err(e) if body_delivered => Err(self.attempt_failed(conn.server, e).into_inner()),
            Err(e) => Err(e.into_inner()),
        }
    }

    /// An Upgrade request on a fresh connection: sends `request` (a head, no body) and reads
    /// the answer, a 101 included (the only exchange that takes one). Interim heads other than
    /// 101 are dropped: the client's Upgrade is answered by the final head alone.
    pub async fn exchange_upgrade(
        &self,
        request: &[u8],
        key: &str,
    ) -> Result<(UpstreamConn, ResponseHead), UpstreamError> {
        let mut conn = self.connect_fresh(key).await?;
        conn.stream
            .send_all(request)
            .await
            .map_err(UpstreamError::from)?;
        match self
            .read_response_head(&mut conn, &mut Vec::new(), true)
            .await
        {
            Ok(head) => {
                self.answered(conn.server);
                Ok((conn, head))
            }
            Err(e) => Err(self.attempt_failed(conn.server, e).into_inner()),
        }
    }

    /// Reads the final response head; `switching`: the request asked to Upgrade, so a 101 is
    /// its answer.
    async fn read_response_head(
        &self,
        conn: &mut UpstreamConn,
        on_interim: &mut Vec<ResponseHead>,
        switching: bool,
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
                            101 if switching => return Ok(head),
                            101 => {
                                // This request asked for no Upgrade: a switch is a protocol
                                // error.
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
                Err(_) if !got_any => {
                    return Err(ExchangeError::TimedOut(UpstreamError::Timeout(
                        self.read_timeout,
                    )));
                }
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
    use nix::sys::socket::{MsgFlags, recv};
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    let r = recv(
        stream.as_raw_fd(),
        &mut byte,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    );
    r.is_err_and(|e| std::io::Error::from(e).kind() == std::io::ErrorKind::WouldBlock)
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
