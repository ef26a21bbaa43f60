//! Upgrade tunnels (WebSocket, and any other protocol a client asks to switch to), on routes with
//! `upgrade: true`: the request goes to the origin on a fresh connection with its `Upgrade` and
//! `Connection: upgrade`; the origin's 101 is relayed, and from then on the bytes are copied both
//! ways until a side closes or both stay idle for `limits.idle_timeout`. Nothing of it is
//! cached; its bytes are counted as copies of reason `tunnel`, its outcome in
//! `zerocache_upgrades_total`.
//!
//! Why apart from the fetch: after a 101 there is no HTTP left on either connection, so nothing
//! of the request path (cache, framing, pooling) applies; the origin's connection is never
//! pooled and the client's ends with the tunnel.

use super::conn::Conn;
use super::conn_error::ConnError;
use super::fetch::{Body, Fetch, FetchOptions, FetchSpec, Relayed};
use super::request_body::RequestBody;
use crate::cache::conditional::Precondition;
use crate::cache::policy::proxy_owned;
use crate::http::head::Head;
use crate::http::request::{BodyFraming, RequestHead};
use crate::upstream::UpstreamConn;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zerocache_ledger::{CacheStatus, CopyReason, DataPath, ResponseRecord};

/// Whether `req` asks to switch protocols in a way a tunnel may carry: an `Upgrade` field named
/// by `Connection` (the parser keeps its value aside, see `RequestHead::upgrade`), HTTP/1.1, and
/// no body (the body of an Upgrade request would have to be read before the switch, and none of
/// the protocols proxied this way sends one).
pub(super) fn wants_tunnel(req: &RequestHead) -> bool {
    !req.http10 && req.body == BodyFraming::None && req.upgrade.is_some()
}

impl Conn {
    /// Tunnels `req` (see the module doc). Returns whether the connection stays open: never.
    pub(super) async fn tunnel(
        &mut self,
        req: &RequestHead,
        upstream: std::sync::Arc<crate::upstream::Group>,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let ctx = self.ctx.clone();
        let upgrade = req.upgrade.clone().unwrap_or_default();
        let f = Fetch::new(FetchSpec {
            req,
            body: RequestBody::Whole(Vec::new()),
            upstream: upstream.clone(),
            started,
            status: CacheStatus::Bypass,
            detail: "upgrade",
            opts: FetchOptions::default(),
        });
        let request = f.upgrade_request(self.peer.ip(), &ctx, upgrade.as_bytes());
        let (up, head) = match upstream.exchange_upgrade(&request, &req.target).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(upstream = %upstream.name, target = %req.target, error = %e, "upgrade failed");
                ctx.accounting.upgrade("failed");
                if !e.counted_per_attempt() {
                    ctx.accounting.upstream_error(&upstream.name, e.kind());
                }
                let mut close = req.clone();
                close.close = true;
                self.respond_simple(&close, e.status(), CacheStatus::Error, &[], None, started)
                    .await?;
                return Ok(false);
            }
        };
        if head.status != 101 {
            // Declined: the origin's answer is relayed as any uncached one, and the connection
            // closes after it (the origin's may carry bytes of the protocol it did not switch to).
            ctx.accounting.upgrade("refused");
            let Ok(framing) = head.framing(req.method == "HEAD") else {
                let mut close = req.clone();
                close.close = true;
                self.respond_simple(&close, 502, CacheStatus::Error, &[], None, started)
                    .await?;
                return Ok(false);
            };
            let r = Relayed {
                head,
                framing,
                body: Body::Stream(up),
                local: Precondition::Proceed,
                not_stored: None,
                status: CacheStatus::Bypass,
                detail: "upgrade",
                upstream,
                via_peer: None,
                reuse: false,
                body_unfinished: true,
            };
            self.relay(req, started, r, 0).await?;
            return Ok(false);
        }
        ctx.accounting.upgrade("switched");
        let switched = head.field("upgrade").map(str::to_string).unwrap_or(upgrade);
        let mut h = Head::new(&mut self.head, 101, &head.reason);
        h.end_to_end(&head.fields, proxy_owned)
            .field("Connection", b"upgrade")
            .field("Upgrade", switched.as_bytes());
        h.end(false);
        let sent = self.send_head().await;
        let head_bytes = self.head.len() as u64;
        let (down, complete) = match sent {
            Ok(()) => self.pipe(up).await,
            Err(_) => (0, false),
        };
        self.record_as(
            &ResponseRecord {
                method: &req.method,
                target: &req.target,
                status: 101,
                cache_status: CacheStatus::Bypass,
                head_bytes,
                body_bytes: down,
                path: DataPath::Copy,
                duration: started.elapsed(),
                complete,
            },
            CopyReason::Tunnel,
        );
        Ok(false)
    }

    /// Copies bytes both ways between the client and `up` until both have closed, a side
    /// fails, or neither sends for `limits.idle_timeout`. What either had sent past its head
    /// goes first. Returns the bytes sent to the client and whether the tunnel ended by both
    /// sides closing.
    async fn pipe(&mut self, mut up: UpstreamConn) -> (u64, bool) {
        let idle = self.ctx.client.idle_timeout;
        let send = self.ctx.client.send_timeout;
        let mut down = 0u64;
        if !up.buf.is_empty() {
            let early = up.buf.split();
            if self.sock.send_all(&early, send).await.is_err() {
                return (0, false);
            }
            down += early.len() as u64;
        }
        if !self.buf.is_empty() {
            let early = self.buf.split();
            if up.stream.send_all(&early).await.is_err() {
                return (down, false);
            }
        }
        let mut from_client = vec![0u8; 16 * 1024];
        let mut from_origin = vec![0u8; 16 * 1024];
        let (mut client_open, mut origin_open) = (true, true);
        while client_open || origin_open {
            let step = tokio::time::timeout(idle, async {
                tokio::select! {
                    r = self.sock.read(&mut from_client), if client_open => (true, r),
                    r = up.stream.read(&mut from_origin), if origin_open => (false, r),
                }
            })
            .await;
            let Ok((client_side, read)) = step else {
                return (down, false); // idle on both sides
            };
            match (client_side, read) {
                (_, Err(_)) => return (down, false),
                (true, Ok(0)) => {
                    client_open = false;
                    let _ = up.stream.shutdown().await;
                }
                (false, Ok(0)) => {
                    origin_open = false;
                    let _ = self.sock.shutdown().await;
                }
                (true, Ok(n)) => {
                    if up.stream.send_all(&from_client[..n]).await.is_err() {
                        return (down, false);
                    }
                }
                (false, Ok(n)) => {
                    if self.sock.send_all(&from_origin[..n], send).await.is_err() {
                        return (down, false);
                    }
                    down += n as u64;
                }
            }
        }
        (down, true)
    }
}
