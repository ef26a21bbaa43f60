//! The active health check of a group (`upstreams.NAME.health_check`): one task per server
//! that GETs the configured path every `interval`. A 2xx or 3xx within `timeout` says the server
//! is up; anything else (another status, a refused or hung connection) marks it down until a
//! check succeeds, whatever real requests see meanwhile (nginx Plus's `health_check`).
//!
//! The tasks live as long as their group: they stop when the group is retired by a reload or
//! dropped (the group holds the only sender of their stop channel), so a reload never leaves the
//! old config's checks running beside the new ones.

use super::peer::Peer;
use super::stream::UpstreamStream;
use crate::http::request_out::RequestOut;
use crate::http::response;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use zerocache_config::HealthCheck;

/// Largest response head a check reads; a health endpoint's is a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;

/// Starts checking each of `peers` on the current runtime until `stop` says so or its sender is
/// dropped.
pub(crate) fn spawn(
    group: &str,
    peers: &[Arc<Peer>],
    check: &HealthCheck,
    host: Option<&str>,
    tls: Option<Arc<crate::tls::client::OriginTls>>,
    stop: &watch::Sender<bool>,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::error!(upstream = %group, "no runtime to run the health check on; not checking");
        return;
    };
    for peer in peers {
        let mut request = Vec::with_capacity(128);
        let mut r = RequestOut::new(&mut request, "GET", &check.path);
        r.field("Host", host.unwrap_or(&peer.addr).as_bytes())
            .field("User-Agent", b"zerocache-health-check")
            .field("Connection", b"close");
        r.end();
        rt.spawn(run(
            group.to_string(),
            peer.clone(),
            tls.clone().filter(|_| peer.tls),
            request,
            check.interval,
            check.timeout,
            stop.subscribe(),
        ));
    }
}

async fn run(
    group: String,
    peer: Arc<Peer>,
    tls: Option<Arc<crate::tls::client::OriginTls>>,
    request: Vec<u8>,
    interval: Duration,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let verdict = tokio::select! {
            v = tokio::time::timeout(timeout, probe(&peer.addr, tls.as_deref(), &request)) => {
                v.unwrap_or_else(|_| Err(format!("no response within {timeout:?}")))
            }
            _ = stop.changed() => return,
        };
        if *stop.borrow() {
            return;
        }
        let healthy = verdict.is_ok();
        // Logged on changes only: at most one line per server per interval.
        if peer.set_checked(healthy) {
            match &verdict {
                Ok(status) => {
                    tracing::info!(upstream = %group, server = %peer.addr, status, "health check passed; server up")
                }
                Err(why) => {
                    tracing::warn!(upstream = %group, server = %peer.addr, why = %why, "health check failed; server down")
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One check: the status of a 2xx or 3xx answer, or why the server is not healthy.
/// An `https://` server (`tls`) is checked over TLS, with the group's verification.
async fn probe(
    addr: &str,
    tls: Option<&crate::tls::client::OriginTls>,
    request: &[u8],
) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut sock = match tls {
        Some(t) => UpstreamStream::Tls(Box::new(
            t.connect(tcp, zerocache_config::tls::host_of(addr))
                .await
                .map_err(|e| e.to_string())?,
        )),
        None => UpstreamStream::Plain(tcp),
    };
    sock.send_all(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut buf = Vec::with_capacity(1024);
    loop {
        if let Some((head, _)) = response::parse(&buf)? {
            return match head.status {
                200..=399 => Ok(head.status),
                s => Err(format!("status {s}")),
            };
        }
        if buf.len() > MAX_HEAD {
            return Err("response head too large".into());
        }
        let n = sock
            .read_buf(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("closed before a response".into());
        }
    }
}
