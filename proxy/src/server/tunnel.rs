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

use super::conn_error::ConnError;
use super::exchange::Exchange;
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
///
/// Never `h2c`: an HTTP/2 connection to the origin handed to the client would carry requests
/// that no route, rule or key of this proxy ever sees (h2c smuggling).
pub(super) fn wants_tunnel(req: &RequestHead) -> bool {
    !req.http10
        && req.body == BodyFraming::None
        && req
            .upgrade
            .as_deref()
            .is_some_and(|u| !protocols(u).any(|p| p.eq_ignore_ascii_case("h2c")))
}

/// Removes a WebSocket handshake's own fields from a request that will not be tunnelled (its
/// route has no `upgrade: true`): it goes on as the plain GET it also is, and neither the origin
/// nor the stored response sees a per-connection key that belongs to a switch never made.
pub(super) fn drop_handshake_fields(req: &mut RequestHead) {
    req.fields.retain(|(k, _)| {
        !k.as_bytes()
            .get(..14)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"sec-websocket-"))
    });
}

/// The protocol names of an `Upgrade` list (`websocket`, `foo/2` → `foo`), trimmed.
fn protocols(list: &str) -> impl Iterator<Item = &str> {
    list.split(',')
        .map(|p| p.trim().split('/').next().unwrap_or("").trim())
        .filter(|p| !p.is_empty())
}

/// The protocol a 101 switched to, if it is one the client asked for (RFC 9110 §7.8: the 101
/// names the protocol chosen, among those requested). `None`: no such switch.
fn switched_to<'a>(asked: &str, answer: Option<&'a str>) -> Option<&'a str> {
    let answer = answer?.trim();
    let chosen = protocols(answer).next()?;
    protocols(asked)
        .any(|p| p.eq_ignore_ascii_case(chosen))
        .then_some(answer)
}

impl Exchange<'_> {
    /// Tunnels `req` (see the module doc). Returns whether the connection stays open: never.
    pub(super) async fn tunnel(
        &mut self,
        req: &RequestHead,
        upstream: std::sync::Arc<crate::upstream::Group>,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let ctx = self.c.ctx.clone();
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
        let request = f.upgrade_request(self.c.peer.ip(), &ctx, upgrade.as_bytes());
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
                self.c
                    .respond_simple(&close, e.status(), CacheStatus::Error, &[], None, started)
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
                self.c
                    .respond_simple(&close, 502, CacheStatus::Error, &[], None, started)
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
        let Some(switched) = switched_to(&upgrade, head.field("upgrade")).map(str::to_string)
        else {
            // A 101 to a protocol nobody asked for, or to none: no tunnel, and the origin's
            // connection is dropped.
            tracing::debug!(upstream = %upstream.name, target = %req.target, "101 without a protocol the client asked for");
            ctx.accounting.upgrade("failed");
            let mut close = req.clone();
            close.close = true;
            self.c
                .respond_simple(&close, 502, CacheStatus::Error, &[], None, started)
                .await?;
            return Ok(false);
        };
        ctx.accounting.upgrade("switched");
        let mut h = Head::new(&mut self.c.head, 101, &head.reason);
        // What clients never see on any other response (the tag field, targeted fields the
        // proxy consumes) is hidden on a 101 too.
        let hidden = |k: &str| proxy_owned(k) || ctx.store.targeted().hides(k);
        h.end_to_end(&head.fields, hidden)
            .field("Connection", b"upgrade")
            .field("Upgrade", switched.as_bytes());
        h.end(false);
        let sent = self.c.send_head().await;
        let head_bytes = self.c.head.len() as u64;
        let (down, ending) = match sent {
            Ok(()) => self.pipe(up).await,
            Err(_) => (0, Ending::Failed),
        };
        self.c.record_as(
            &ResponseRecord {
                method: &req.method,
                target: &req.target,
                status: 101,
                cache_status: CacheStatus::Bypass,
                head_bytes,
                body_bytes: down,
                path: DataPath::Copy,
                duration: started.elapsed(),
                complete: ending != Ending::Failed,
            },
            CopyReason::Tunnel,
        );
        match ending {
            Ending::Failed => Err(ConnError::Aborted("tunnel failed".into())),
            Ending::Closed | Ending::Idle => Ok(false),
        }
    }

    /// Copies bytes both ways between the client and `up`, each direction on its own (a side
    /// that stops reading holds up only what is sent to it), until both have closed, a side
    /// fails or a write waits past `limits.send_timeout`, or neither sends for
    /// `limits.idle_timeout`. What either had sent past its head goes first. Returns the bytes
    /// sent to the client and how the tunnel ended.
    async fn pipe(&mut self, mut up: UpstreamConn) -> (u64, Ending) {
        use std::sync::atomic::{AtomicU64, Ordering};
        let idle = self.c.ctx.client.idle_timeout;
        let send = self.c.ctx.client.send_timeout;
        let down = AtomicU64::new(0);
        if !up.buf.is_empty() {
            let early = up.buf.split();
            if self.c.sock.send_all(&early, send).await.is_err() {
                return (0, Ending::Failed);
            }
            down.fetch_add(early.len() as u64, Ordering::Relaxed);
        }
        let early = self.c.take_unread();
        if !early.is_empty() {
            let sent = tokio::time::timeout(send, up.stream.send_all(&early)).await;
            if !matches!(sent, Ok(Ok(()))) {
                return (down.into_inner(), Ending::Failed);
            }
        }
        // Milliseconds since `start` of the last byte either way, for the idle rule.
        let start = tokio::time::Instant::now();
        let last = AtomicU64::new(0);
        let touch = || last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        let (mut client_r, mut client_w) = tokio::io::split(&mut self.c.sock);
        let (mut origin_r, mut origin_w) = tokio::io::split(&mut up.stream);
        let to_origin = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = client_r.read(&mut buf).await?;
                if n == 0 {
                    let _ = tokio::time::timeout(send, origin_w.shutdown()).await;
                    return Ok::<(), std::io::Error>(());
                }
                tokio::time::timeout(send, origin_w.write_all(&buf[..n]))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
                touch();
            }
        };
        let to_client = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = origin_r.read(&mut buf).await?;
                if n == 0 {
                    let _ = tokio::time::timeout(send, client_w.shutdown()).await;
                    return Ok::<(), std::io::Error>(());
                }
                tokio::time::timeout(send, client_w.write_all(&buf[..n]))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
                down.fetch_add(n as u64, Ordering::Relaxed);
                touch();
            }
        };
        let idle_for = async {
            loop {
                let seen = std::time::Duration::from_millis(last.load(Ordering::Relaxed));
                let quiet_until = start + seen + idle;
                if tokio::time::Instant::now() >= quiet_until {
                    return;
                }
                tokio::time::sleep_until(quiet_until).await;
            }
        };
        let ending = tokio::select! {
            r = async { tokio::try_join!(to_origin, to_client) } => match r {
                Ok(_) => Ending::Closed,
                Err(_) => Ending::Failed,
            },
            _ = idle_for => Ending::Idle,
        };
        (down.into_inner(), ending)
    }
}

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Both sides closed.
    Closed,
    /// Neither sent for `limits.idle_timeout`: closed by the proxy, as an idle keep-alive
    /// connection is.
    Idle,
    /// A side failed, or a write waited past `limits.send_timeout`: the client's connection is
    /// reset, so a protocol that reads a close as "complete" is not misled.
    Failed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_101_must_name_a_protocol_the_client_asked_for() {
        assert_eq!(
            switched_to("websocket", Some("WebSocket")),
            Some("WebSocket")
        );
        assert_eq!(
            switched_to("foo/2, websocket", Some(" websocket ")),
            Some("websocket")
        );
        assert_eq!(switched_to("foo/2", Some("foo/3")), Some("foo/3"));
        assert_eq!(switched_to("websocket", None), None);
        assert_eq!(switched_to("websocket", Some("")), None);
        assert_eq!(switched_to("websocket", Some("h2c")), None);
        assert_eq!(switched_to("websocket", Some(",,")), None);
    }

    #[test]
    fn h2c_is_never_tunnelled() {
        let req = |upgrade: &str| {
            let mut r = crate::http::request::test_request("GET", "");
            r.upgrade = Some(upgrade.to_string());
            r
        };
        assert!(wants_tunnel(&req("websocket")));
        for u in ["h2c", "H2C", "websocket, h2c", "h2c/1"] {
            assert!(!wants_tunnel(&req(u)), "{u}");
        }
        let mut http10 = req("websocket");
        http10.http10 = true;
        assert!(!wants_tunnel(&http10));
        let mut with_body = req("websocket");
        with_body.body = BodyFraming::Length(1);
        assert!(!wants_tunnel(&with_body));
    }
}
