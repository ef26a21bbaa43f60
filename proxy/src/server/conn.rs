//! One client connection's loop: reading request heads within their limits and timeouts, handing
//! each request to an `Exchange` (`dispatch`: route → cache decision → hit or fetch, whose result
//! `relay` sends), and answering malformed input with its 4xx before closing. The connection
//! knows nothing of the cache: the exchange calls down into it (`respond.rs`, `upload.rs`), and
//! this hand-off is the only way up.

pub use super::conn_error::ConnError;
use super::conn_state::Conn;
use super::exchange::Exchange;
use super::{Ctx, Shared};
use crate::http::head::HeadBuf;
use crate::http::request::{self, RequestHead};
use crate::net::client_sock::ClientSock;
use bytes::BytesMut;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zerocache_ledger::ConnId;

/// Runs the connection to its end.
pub async fn serve(sock: ClientSock, peer: SocketAddr, shared: Arc<Shared>) {
    let ctx = shared.ctx.load_full();
    let Some(tcp) = sock.tcp() else {
        // An HTTP/2 stream has no socket of its own: `serve_stream` runs it.
        return;
    };
    // Small heads followed by sendfile bodies: without NODELAY, Nagle can hold a body's last
    // partial segment behind a delayed ACK (the ~40 ms stall nginx shows with tcp_nopush).
    let _ = tcp.set_nodelay(true);
    let fd = tcp.as_raw_fd() as u32;
    let id = ctx.accounting.conn_opened(fd, peer);
    let mut sock = sock;
    if let Some(t) = sock.tls_transport() {
        ctx.accounting.conn_tls(id, t);
        ctx.accounting
            .conn_tls_control(id, sock.take_control_bytes());
    }
    let mut conn = Conn::new(sock, peer, id, ctx.clone(), shared);
    /// Closes the connection's record however the task ends (a panic included). Declared after
    /// `conn`, so it runs first: the record must be waiting before the kernel sees the close.
    struct Closed(Arc<Ctx>, ConnId);
    impl Drop for Closed {
        fn drop(&mut self) {
            self.0.accounting.conn_closed(self.1);
        }
    }
    let _closed = Closed(ctx, id);
    if let Err(e) = conn.run().await {
        tracing::debug!(conn = id, %peer, error = %e, "connection ended");
        // A response cut short must not look complete: a close-delimited body (HTTP/1.0, or no
        // length) ended by a FIN would be taken as whole, and a downstream cache could store it.
        // SO_LINGER 0 makes the close a reset, at once (no blocking on drop, unlike a timeout).
        let reset = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        if let Some(tcp) = conn.sock.tcp() {
            let _ = nix::sys::socket::setsockopt(tcp, nix::sys::socket::sockopt::Linger, &reset);
        }
    } else if conn.sock.is_tls() {
        // A TLS close says it is one (close_notify), so a close-delimited body is known whole.
        let _ = tokio::time::timeout(conn.ctx.client.send_timeout, conn.sock.shutdown()).await;
        // A kTLS connection's close_notify is a write the probe sees: not a body byte.
        let alert = conn.sock.take_control_bytes();
        conn.ctx.accounting.conn_tls_control(id, alert);
    }
}

/// Serves one HTTP/2 stream (`sock`, a [`ClientSock::H2Stream`]) as a connection of its own,
/// recording its response under its h2 connection's accounting `id`: its request `head`,
/// converted from the stream's HEADERS (or the checks' refusal, answered with its status as an
/// HTTP/1.1 client's is). An error means the response did not end as its head said: the
/// stream's driver resets the stream.
pub(crate) async fn serve_stream(
    sock: ClientSock,
    head: Result<RequestHead, request::RequestError>,
    peer: SocketAddr,
    shared: Arc<Shared>,
    id: ConnId,
) -> Result<(), ConnError> {
    let ctx = shared.ctx.load_full();
    let mut conn = Conn::new(sock, peer, id, ctx, shared);
    match head {
        Ok(mut head) => {
            head.tls = conn.sock.is_tls();
            Exchange { c: &mut conn }
                .handle(head, Instant::now())
                .await
                .map(|_| ())
        }
        Err(e) => {
            tracing::info!(conn = id, %peer, error = %e, "bad request on an h2 stream");
            conn.reject(e.status().0).await;
            Ok(())
        }
    }
}

impl Conn {
    fn new(
        sock: ClientSock,
        peer: SocketAddr,
        id: ConnId,
        ctx: Arc<Ctx>,
        shared: Arc<Shared>,
    ) -> Conn {
        // An h2 stream's request head comes converted, not as bytes: its buffer is only for a
        // body, and 128 streams a connection each keep theirs while they wait on a shut window.
        let buf = BytesMut::with_capacity(if sock.is_h2() { 0 } else { 8 * 1024 });
        let mut head = if sock.is_h2() {
            HeadBuf::h2()
        } else {
            HeadBuf::h1(1024)
        };
        head.set_via_self(ctx.forwarding.via);
        Conn {
            sock,
            peer,
            id,
            buf,
            head,
            ctx,
            shared,
            must_close: false,
            log_info: Default::default(),
            from_peer: false,
            body_pace: None,
            unanswered: None,
            recorded: Default::default(),
        }
    }
}

/// How long a connection may take, once a drain starts, to send its next request (its first,
/// for one accepted just before; or the next on an idle keep-alive one), within its own
/// `header_timeout` or `idle_timeout`: that request is answered with `Connection: close`
/// instead of finding the connection closed under it (a restart or an upgrade otherwise fails
/// the next request of every idle client).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

enum Head {
    Request(Box<RequestHead>),
    Closed,
    Reject(u16),
}

impl Conn {
    async fn run(&mut self) -> Result<(), ConnError> {
        let mut stop = self.shared.shutdown.subscribe();
        let mut first = true;
        loop {
            // Each request runs under the context current when it starts (reloads apply to new
            // requests; responses in flight finish under the old one).
            self.ctx = self.shared.ctx.load_full();
            self.head.set_via_self(self.ctx.forwarding.via);
            // Whether a request is a fleet peer's is its own: `fleet_intake` says so for each.
            self.from_peer = false;
            let mut req = match self.read_head(&mut stop, first).await? {
                Head::Request(r) => {
                    first = false;
                    r
                }
                Head::Closed => return Ok(()),
                Head::Reject(status) => {
                    // No request to describe: the line must not carry the previous one's.
                    self.log_info = Default::default();
                    self.reject(status).await;
                    return Ok(());
                }
            };
            if *stop.borrow() {
                // Draining: this response is the connection's last, and says so.
                req.close = true;
            }
            let started = Instant::now();
            let keep = Exchange { c: self }.handle(*req, started).await?;
            // A rule's response edits are its request's: not the next 408's or 400's.
            self.head.edits.clear();
            if !keep || self.must_close {
                return Ok(());
            }
        }
    }

    async fn read_head(
        &mut self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
        first: bool,
    ) -> Result<Head, ConnError> {
        let mut deadline: Option<Instant> = None;
        loop {
            if *stop.borrow() && self.buf.is_empty() {
                // Shutting down: an idle connection is closed between requests, after a grace
                // for the request its client may be sending just now (one already in the socket
                // was sent before the client could know), answered with `Connection: close`: a
                // new connection's first request, or the next on a keep-alive one. Without it a
                // restart or an upgrade would fail the next request of every idle client.
                let wait = DRAIN_GRACE.min(if first {
                    self.ctx.client.header_timeout
                } else {
                    self.ctx.client.idle_timeout
                });
                match tokio::time::timeout(wait, self.sock.read_buf(&mut self.buf)).await {
                    Ok(Ok(0)) | Err(_) => return Ok(Head::Closed),
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => return Err(e.into()),
                }
            }
            if !self.buf.is_empty() {
                match request::parse(&self.buf, self.ctx.client.limits) {
                    Ok(Some((head, n))) => {
                        let _ = self.buf.split_to(n);
                        let mut head = Box::new(head);
                        head.tls = self.sock.is_tls();
                        return Ok(Head::Request(head));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::info!(conn = self.id, peer = %self.peer, error = %e, "bad request");
                        return Ok(Head::Reject(e.status().0));
                    }
                }
                deadline.get_or_insert_with(|| Instant::now() + self.ctx.client.header_timeout);
            }
            let wait = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => self.ctx.client.idle_timeout,
            };
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(8192);
            }
            let read = tokio::select! {
                r = tokio::time::timeout(wait, self.sock.read_buf(&mut self.buf)) => r,
                _ = stop.changed(), if self.buf.is_empty() => continue,
            };
            match read {
                Ok(Ok(0)) => return Ok(Head::Closed),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_) if deadline.is_some() => return Ok(Head::Reject(408)),
                Err(_) => return Ok(Head::Closed),
            }
        }
    }
}
