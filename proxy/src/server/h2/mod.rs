//! HTTP/2 to clients: by ALPN on the `tls:` listener (`tls.http2`) and with prior knowledge on a
//! plain one (`h2c` on a `listen` entry). Origins stay HTTP/1.1.
//!
//! **Why the `h2` crate, and why streams are served by the HTTP/1.1 path.** The framing layer
//! (HPACK, flow control, stream states, and the defences against rapid reset, MadeYouReset and
//! CONTINUATION floods) is the `h2` crate's, as in hyper and pingora: it is where HTTP/2's attack
//! surface is, and it has had the fixes (0.4.20 here). Each stream is then translated into an
//! HTTP/1.1 request on an in-process pipe and served by the very code that serves HTTP/1.1
//! clients (`conn::serve_stream`), as Apache's mod_http2 serves each stream on a secondary
//! connection: the route, the cache key, Vary, freshness, conditionals, Range, stale, collapsed
//! forwarding, purge, Cache-Status and the access log are the same code, not a second copy that
//! could drift. The translation is strict both ways ([`request`], [`response`]), and the request
//! side is parsed again by the HTTP/1.1 parser, so an h2 client can send nothing an HTTP/1.1
//! client could not. The cost is a copy through the pipe, on top of the copy HTTP/2 has anyway
//! (DATA frames are written from user space): every body on an h2 connection is counted as a
//! copy by design (`h2`), and its connection's verdict says so.
//!
//! **Bounds.** 128 concurrent streams per connection (as nginx), a header list no larger than
//! `limits.max_header_bytes`, a 64 KiB pipe per stream; a connection with no stream for
//! `idle_timeout` gets a GOAWAY, as does every connection on drain (in two steps, RFC 9113 §6.8,
//! which the crate's graceful shutdown sends). A client that resets more than
//! [`RESET_BUDGET`] streams, and more than half of those it opened, is sent GOAWAY
//! `ENHANCE_YOUR_CALM` (CVE-2023-44487); the crate bounds resets it has to send itself
//! (CVE-2025-8671) and streams reset before they were accepted.

pub(crate) mod request;
mod response;
mod stream;

use super::Shared;
use crate::net::client_sock::ClientSock;
use bytes::Bytes;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use zerocache_ledger::{Accounting, ConnId};

/// Streams a client may have open at once (nginx's `http2_max_concurrent_streams`).
const MAX_STREAMS: u32 = 128;

/// Client resets a connection may make before the ratio check applies.
pub(crate) const RESET_BUDGET: u64 = 200;

/// The HTTP/2 connection preface (RFC 9113 §3.4), which an h2c client sends first.
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a plain connection opens with the HTTP/2 preface: peeked, not read, so an HTTP/1.1
/// connection is served from its first byte. Waits within `wait` for a preface that came in
/// pieces; false as soon as a byte differs.
pub(crate) async fn opens_with_preface(tcp: &tokio::net::TcpStream, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    let mut seen = [0u8; PREFACE.len()];
    loop {
        let n = match tokio::time::timeout_at(deadline, tcp.peek(&mut seen)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || seen[..n] != PREFACE[..n] {
            return false;
        }
        if n == PREFACE.len() {
            return true;
        }
        // A matching start: the rest is on its way (peek would return the same bytes at once).
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A stream counted as live until its task ends (a panic included), when the connection's
/// idle clock starts again.
struct Live(Arc<AtomicUsize>, Arc<AtomicU64>);

impl Drop for Live {
    fn drop(&mut self) {
        self.1.store(super::uptime_ms(), Ordering::Relaxed);
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs an HTTP/2 connection to its end.
pub(crate) async fn serve(mut sock: ClientSock, peer: SocketAddr, shared: Arc<Shared>) {
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
    /// Closes the connection's record however the task ends.
    struct Closed(Arc<Accounting>, ConnId);
    impl Drop for Closed {
        fn drop(&mut self) {
            self.0.conn_closed(self.1);
        }
    }
    let _closed = Closed(acc.clone(), id);
    let c = Arc::new(stream::Connection {
        shared: shared.clone(),
        peer,
        id,
        tls: sock.is_tls(),
        served: sock.served(),
        resets: AtomicU64::new(0),
    });
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(ctx.client.limits.max_head.min(u32::MAX as usize) as u32)
        .max_send_buffer_size(64 * 1024);
    let handshake = builder.handshake::<_, Bytes>(sock);
    let mut h2c = match tokio::time::timeout(ctx.client.header_timeout, handshake).await {
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
    let idle = ctx.client.idle_timeout;
    drop(ctx);
    let live = Arc::new(AtomicUsize::new(0));
    // When a stream last started or ended (`uptime_ms`), for the idle GOAWAY.
    let last_active = Arc::new(AtomicU64::new(super::uptime_ms()));
    let mut stop = shared.shutdown.subscribe();
    let mut going_away = false;
    let mut opened = 0u64;
    loop {
        let quiet = live.load(Ordering::Relaxed) == 0 && !going_away;
        let since = super::uptime_ms().saturating_sub(last_active.load(Ordering::Relaxed));
        let idle_left = idle.saturating_sub(Duration::from_millis(since));
        tokio::select! {
            next = h2c.accept() => match next {
                Some(Ok((req, respond))) => {
                    opened += 1;
                    acc.h2_event("streams");
                    live.fetch_add(1, Ordering::Relaxed);
                    last_active.store(super::uptime_ms(), Ordering::Relaxed);
                    let stream_conn = c.clone();
                    let live = Live(live.clone(), last_active.clone());
                    tokio::spawn(async move {
                        let _live = live;
                        stream::run(req, respond, stream_conn).await;
                    });
                    let resets = c.resets.load(Ordering::Relaxed);
                    if resets > RESET_BUDGET && resets * 2 > opened {
                        acc.h2_event("enhance-your-calm");
                        tracing::info!(conn = id, %peer, resets, opened, "h2 client resets most of its streams (rapid reset); GOAWAY ENHANCE_YOUR_CALM");
                        h2c.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                        going_away = true;
                    }
                }
                Some(Err(e)) => {
                    // The crate's own flood guards end a connection with ENHANCE_YOUR_CALM
                    // (streams reset before they were accepted, resets it had to send).
                    acc.h2_event(match e.reason() {
                        Some(h2::Reason::ENHANCE_YOUR_CALM) => "enhance-your-calm",
                        _ => "connection-errors",
                    });
                    tracing::debug!(conn = id, %peer, error = %e, "h2 connection ended");
                    break;
                }
                None => break,
            },
            _ = stop.changed(), if !going_away => {
                // Drain: GOAWAY (twice, as the crate does), in-flight streams finish.
                acc.h2_event("goaway");
                h2c.graceful_shutdown();
                going_away = true;
            }
            _ = tokio::time::sleep(idle_left.max(Duration::from_millis(10))), if !going_away => {
                if quiet && idle_left.is_zero() {
                    acc.h2_event("goaway");
                    h2c.graceful_shutdown();
                    going_away = true;
                }
            }
        }
    }
}
