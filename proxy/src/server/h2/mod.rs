//! HTTP/2 to clients: by ALPN on the `tls:` listener (`tls.http2`) and with prior knowledge on a
//! plain one (`h2c` on a `listen` entry). Origins stay HTTP/1.1.
//!
//! **Why the `h2` crate, and why streams are served by the HTTP/1.1 path.** The framing layer
//! (HPACK, flow control, stream states, and the defences against rapid reset, MadeYouReset and
//! CONTINUATION floods) is the `h2` crate's, as in hyper and pingora: it is where HTTP/2's attack
//! surface is, and it has had the fixes (0.4.20 here). Each stream's head is then converted,
//! field by field, into the request head an HTTP/1.1 client's becomes ([`request`]: strict, and
//! through the same checks past its framing) and served by the very code that serves HTTP/1.1
//! clients (`conn::serve_stream`), as Apache's mod_http2 serves each stream on a secondary
//! connection: the route, the cache key, Vary, freshness, conditionals, Range, stale, collapsed
//! forwarding, purge, Cache-Status and the access log are the same code, not a second copy that
//! could drift. The request path reads a body off the stream's DATA frames itself. HTTP/2 copies
//! by design (DATA frames are written from user space): every body on an h2 connection is
//! counted as a copy (`h2`), and its connection's verdict says so.
//!
//! **Bounds.** 128 concurrent streams per connection (as nginx), a header list no larger than
//! `limits.max_header_bytes`, of a request body the DATA frame being read; of a response, a stream reads
//! ahead only what its window has room for, and a connection's streams hold at most
//! [`stream::CONNECTION_BUDGET_KIB`] of it until the socket takes it; a connection with no stream for
//! `idle_timeout` gets a GOAWAY, as does every connection on drain (in two steps, RFC 9113 §6.8,
//! which the crate's graceful shutdown sends), and is closed `send_timeout` after its last
//! stream if the client has not closed it. A client that resets more than [`RESET_BUDGET`]
//! streams and more than half of those it opened, or more than [`RESET_CAP`] in all, is sent
//! GOAWAY `ENHANCE_YOUR_CALM` (CVE-2023-44487); the crate bounds resets it has to send itself
//! (CVE-2025-8671) and streams reset before they were accepted. A reset stream whose response
//! was a fill leaves the fill running within `cache.abandoned_fill_max` and `_timeout`, as an
//! HTTP/1.1 client that leaves does.

mod output;
pub(crate) mod request;
mod stream;

use super::Shared;
use crate::net::client_sock::ClientSock;
use bytes::Bytes;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use zerocache_ledger::Accounting;

/// Streams a client may have open at once (nginx's `http2_max_concurrent_streams`).
const MAX_STREAMS: u32 = 128;

/// Client resets a connection may make before the ratio check applies.
pub(crate) const RESET_BUDGET: u64 = 200;

/// The HTTP/2 connection preface (RFC 9113 §3.4), which an h2c client sends first.
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How a plain connection on an `h2c` listener opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// With the HTTP/2 preface.
    H2,
    /// With anything else: served as HTTP/1.1 from its first byte.
    Http1,
    /// With a part of the preface and then nothing more within `header_timeout`, or a FIN (with
    /// or without bytes before it): closed (an HTTP/1.1 request cannot start `PRI * HTTP/2.0`,
    /// so nothing is lost by not answering).
    Close,
}

/// How a plain connection opens: the preface is peeked, not read, so an HTTP/1.1 connection is
/// served from its first byte. Waits within `wait` for a preface that comes in pieces, sleeping
/// until more bytes or a FIN arrive (`net::opening`); decided as soon as a byte differs.
pub(crate) async fn opening(tcp: &tokio::net::TcpStream, wait: Duration) -> Opening {
    use crate::net::opening::{Ended, peek_more};
    let deadline = tokio::time::Instant::now() + wait;
    let mut seen = [0u8; PREFACE.len()];
    let mut n = 0;
    loop {
        n = match peek_more(tcp, &mut seen, n, deadline).await {
            Ok(n) => n,
            // Nothing sent within header_timeout: an idle connection (a client's pre-connect
            // or pool), which the HTTP/1.1 path keeps for idle_timeout, as on a plain listener.
            Err(Ended::Deadline) if n == 0 => return Opening::Http1,
            Err(Ended::Closed | Ended::Deadline | Ended::Failed) => return Opening::Close,
        };
        if seen[..n] != PREFACE[..n] {
            return Opening::Http1;
        }
        if n == PREFACE.len() {
            return Opening::H2;
        }
    }
}

/// A stream counted as live until its task ends (a panic included), when the connection's
/// idle clock starts again and its loop is woken to look.
struct Live(Arc<Streams>);

/// The streams of one connection, as its loop and their tasks see them.
struct Streams {
    live: AtomicUsize,
    /// When a stream last started or ended (`uptime_ms`), for the idle GOAWAY.
    last_active: AtomicU64,
    /// A stream ended.
    ended: tokio::sync::Notify,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0
            .last_active
            .store(super::uptime_ms(), Ordering::Relaxed);
        self.0.live.fetch_sub(1, Ordering::Relaxed);
        self.0.ended.notify_one();
    }
}

/// Runs an HTTP/2 connection to its end.
pub(crate) async fn serve(mut sock: ClientSock, peer: SocketAddr, shared: Arc<Shared>) {
    // Subscribed before the handshake, so a drain that starts during it is not missed.
    let stop = shared.shutdown.subscribe();
    let ctx = shared.ctx.load_full();
    let Some(tcp) = sock.tcp() else {
        return;
    };
    let _ = tcp.set_nodelay(true);
    let fd = tcp.as_raw_fd() as u32;
    let acc = ctx.accounting.clone();
    let id = acc.conn_opened(fd, peer);
    if let Some(t) = sock.tls_transport() {
        acc.conn_tls(id, t);
        acc.conn_tls_control(id, sock.take_control_bytes());
    }
    acc.conn_h2(id);
    acc.h2_event("connections");
    let c = Arc::new(stream::Connection {
        shared: shared.clone(),
        peer,
        id,
        tls: sock.is_tls(),
        served: sock.served(),
        resets: AtomicU64::new(0),
        budget: Arc::new(tokio::sync::Semaphore::new(stream::CONNECTION_BUDGET_KIB)),
    });
    // Closes the record just before the socket closes, on every path (see `output`).
    let out = output::Output::new(sock, acc.clone(), id);
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(ctx.client.limits.max_head.min(u32::MAX as usize) as u32)
        // One stream uploading to a slow origin holds at most its own window (64 KiB) of the
        // connection's, not all of it.
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buffer_size(64 * 1024);
    let handshake = builder.handshake::<_, Bytes>(output::CoalescedSock(out.clone()));
    let h2c = match tokio::time::timeout(ctx.client.header_timeout, handshake).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            acc.h2_event("connection-errors");
            tracing::debug!(conn = id, %peer, error = %e, "h2 handshake failed");
            return;
        }
        Err(_) => {
            acc.h2_event("connection-errors");
            tracing::debug!(conn = id, %peer, "h2 preface not received within header_timeout");
            return;
        }
    };
    out.defer_flushes();
    let session = Session {
        h2c,
        out,
        c,
        acc,
        stop,
        idle: ctx.client.idle_timeout,
        // How long a connection that was sent GOAWAY and has no stream left may take to finish
        // (the crate waits for the client's PING ack, and for the socket to take the frames).
        closing: ctx.client.send_timeout,
        streams: Arc::new(Streams {
            live: AtomicUsize::new(0),
            last_active: AtomicU64::new(super::uptime_ms()),
            ended: tokio::sync::Notify::new(),
        }),
        going_away: None,
        opened: 0,
    };
    drop(ctx);
    session.run().await;
}

/// The connection's receive window: room for 64 streams' full windows at once.
const CONNECTION_WINDOW: u32 = 4 << 20;

/// Client resets that end a connection whatever else it did: a browser cancels some streams,
/// no client needs this many on one connection.
const RESET_CAP: u64 = 10_000;

/// An accepted h2 connection's loop: it accepts streams and spawns their tasks, says GOAWAY on
/// drain, on idle and to a client that resets too much, and ends the connection once it has
/// no stream left after a GOAWAY.
struct Session {
    h2c: h2::server::Connection<output::CoalescedSock, Bytes>,
    /// The socket's coalesced output, written by `output::flush_due` beside the loop.
    out: Arc<output::Output>,
    c: Arc<stream::Connection>,
    acc: Arc<Accounting>,
    stop: tokio::sync::watch::Receiver<bool>,
    idle: Duration,
    closing: Duration,
    streams: Arc<Streams>,
    /// When the GOAWAY was sent.
    going_away: Option<tokio::time::Instant>,
    opened: u64,
}

impl Session {
    async fn run(mut self) {
        self.serve_streams().await;
        // Frames still waiting for their turn when the loop ended without the crate's shutdown
        // (which writes them itself): sent within `closing`, as a client that is still reading
        // would get them.
        let _ = tokio::time::timeout(self.closing, output::flush_now(&self.out)).await;
    }

    async fn serve_streams(&mut self) {
        let (id, peer) = (self.c.id, self.c.peer);
        let flusher = output::flush_due(self.out.clone());
        let mut flusher = std::pin::pin!(flusher);
        loop {
            if self.going_away.is_none() && *self.stop.borrow() {
                // Drain: GOAWAY (twice, as the crate does), in-flight streams finish.
                self.go_away("goaway");
            }
            let quiet = self.streams.live.load(Ordering::Relaxed) == 0;
            let wait = match self.going_away {
                // Past its GOAWAY with nothing left to serve: a bounded wait for the close.
                Some(at) if quiet => {
                    (at + self.closing).saturating_duration_since(tokio::time::Instant::now())
                }
                Some(_) => Duration::MAX,
                None if quiet => {
                    let last = self.streams.last_active.load(Ordering::Relaxed);
                    let since = Duration::from_millis(super::uptime_ms().saturating_sub(last));
                    self.idle.saturating_sub(since)
                }
                None => Duration::MAX,
            };
            tokio::select! {
                next = self.h2c.accept() => match next {
                    Some(Ok((req, respond))) => self.spawn(req, respond),
                    Some(Err(e)) => {
                        // The crate's own flood guards end a connection with ENHANCE_YOUR_CALM
                        // (streams reset before they were accepted, resets it had to send).
                        self.acc.h2_event(match e.reason() {
                            Some(h2::Reason::ENHANCE_YOUR_CALM) => "enhance-your-calm",
                            _ => "connection-errors",
                        });
                        tracing::debug!(conn = id, %peer, error = %e, "h2 connection ended");
                        return;
                    }
                    None => return,
                },
                r = &mut flusher => {
                    if let Err(e) = r {
                        tracing::debug!(conn = id, %peer, error = %e, "h2 connection ended: write failed");
                    }
                    return;
                }
                _ = self.stop.changed(), if self.going_away.is_none() => {}
                _ = self.streams.ended.notified() => {}
                _ = tokio::time::sleep(wait), if wait != Duration::MAX => {
                    if self.going_away.is_some() {
                        tracing::debug!(conn = id, %peer, "h2 connection closed: no stream left after GOAWAY");
                        return;
                    }
                    self.go_away("goaway");
                }
            }
        }
    }

    /// Sends GOAWAY (graceful) and counts it as `event`.
    fn go_away(&mut self, event: &'static str) {
        self.acc.h2_event(event);
        self.h2c.graceful_shutdown();
        self.going_away = Some(tokio::time::Instant::now());
    }

    /// Runs a new stream on its own task, after the rapid-reset check.
    fn spawn(
        &mut self,
        req: http::Request<h2::RecvStream>,
        respond: h2::server::SendResponse<Bytes>,
    ) {
        self.opened += 1;
        self.acc.h2_event("streams");
        self.streams.live.fetch_add(1, Ordering::Relaxed);
        self.streams
            .last_active
            .store(super::uptime_ms(), Ordering::Relaxed);
        let live = Live(self.streams.clone());
        let c = self.c.clone();
        tokio::spawn(async move {
            let _live = live;
            stream::run(req, respond, c).await;
        });
        let resets = self.c.resets.load(Ordering::Relaxed);
        if (resets > RESET_BUDGET && resets * 2 > self.opened) || resets > RESET_CAP {
            self.acc.h2_event("enhance-your-calm");
            tracing::info!(conn = self.c.id, peer = %self.c.peer, resets, opened = self.opened, "h2 client resets most of its streams (rapid reset); GOAWAY ENHANCE_YOUR_CALM");
            self.h2c.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
            self.going_away = Some(tokio::time::Instant::now());
        }
    }
}
