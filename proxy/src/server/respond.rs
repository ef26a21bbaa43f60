//! The responder: everything a request's answer goes out through. The request path composes a
//! head in the connection's [`HeadBuf`](crate::http::head::HeadBuf) (HTTP/1.1 bytes, or an h2
//! stream's fields) and sends it here; bodies follow by `send` or, from a cache file, by the
//! socket's sendfile. Every response is recorded here too, once, with the data path the
//! transport made of it (`copy_account`), so the ledger's intent side has one writer; and a
//! request an HTTP/2 client reset before its answer is logged here as it is dropped (499).

use super::conn_error::ConnError;
use super::conn_state::{Conn, Unanswered};
use super::copy_account::classify;
use crate::http::head::{CacheFields, text_response};
use crate::http::request::RequestHead;
use crate::http::response::reason;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zerocache_ledger::{CacheStatus, CopyReason, DataPath, ResponseRecord};

/// The status an abandoned request's line carries: nginx's "client closed request".
const CLIENT_CLOSED: u16 = 499;

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(u) = self.unanswered.take() else {
            return;
        };
        if *self.recorded.get_mut() {
            return;
        }
        if let Some(log) = &self.ctx.access_log {
            let r = ResponseRecord {
                method: &u.method,
                target: &u.target,
                status: CLIENT_CLOSED,
                cache_status: CacheStatus::Error,
                head_bytes: 0,
                body_bytes: 0,
                path: zerocache_ledger::DataPath::Copy,
                duration: u.started.elapsed(),
                complete: false,
            };
            log.log(&self.peer, &r, &self.log_info);
        }
    }
}

impl Conn {
    /// Answers a request the proxy will not process, then closes gracefully: the client may still
    /// be sending, and closing with unread data would reset the connection and lose the answer.
    pub async fn reject(&mut self, status: u16) {
        let body_len = self.simple_response(status, true, &[], None);
        let sent = self.send_head().await;
        self.record_simple("-", "-", status, body_len, sent.is_ok(), Duration::ZERO);
        let _ = self.sock.shutdown().await;
        // On the heap: held across an await, an array would make this future 4 KiB, and with it
        // every future that may reject (each request's body read, each connection's loop).
        let mut sink = vec![0u8; 4096];
        let linger = Instant::now() + Duration::from_secs(1);
        let mut drained = 0usize;
        while drained < 256 * 1024 {
            let left = linger.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.sock.read(&mut sink)).await {
                Ok(Ok(n)) if n > 0 => drained += n,
                _ => break,
            }
        }
    }

    /// Builds a small text response (head and body) into `self.head`, with `extra` fields and
    /// the cache fields `cache`; returns the body length.
    pub fn simple_response(
        &mut self,
        status: u16,
        close: bool,
        extra: &[(&str, &str)],
        cache: Option<&CacheFields<'_>>,
    ) -> u64 {
        let body = format!("{status} {}\n", reason(status));
        text_response(&mut self.head, status, extra, cache, close, body.as_bytes());
        body.len() as u64
    }

    /// Sends a small text response for `req` and records it.
    pub async fn respond_simple(
        &mut self,
        req: &RequestHead,
        status: u16,
        cache_status: CacheStatus,
        extra: &[(&str, &str)],
        cache: Option<&CacheFields<'_>>,
        started: Instant,
    ) -> Result<bool, ConnError> {
        let body_len = self.simple_response(status, req.close, extra, cache);
        self.send_generated(req, status, cache_status, body_len, started)
            .await
    }

    /// Sends the proxy's own answer built in `self.head` (its body the last `body_len` bytes,
    /// left out for HEAD) and records it.
    pub(super) async fn send_generated(
        &mut self,
        req: &RequestHead,
        status: u16,
        cache_status: CacheStatus,
        body_len: u64,
        started: Instant,
    ) -> Result<bool, ConnError> {
        if req.method == "HEAD" {
            let len = self.head.len() - body_len as usize;
            self.head.truncate(len);
        }
        let sent = self.send_head().await;
        let body = if req.method == "HEAD" { 0 } else { body_len };
        self.record_as(
            &ResponseRecord {
                method: &req.method,
                target: &req.target,
                status,
                cache_status,
                head_bytes: self.head.len() as u64 - body,
                body_bytes: if sent.is_ok() { body } else { 0 },
                path: DataPath::Copy,
                duration: started.elapsed(),
                complete: sent.is_ok(),
            },
            CopyReason::Generated,
        );
        sent?;
        Ok(!req.close)
    }

    /// The access-log line (and response count) of a request whose client left before its body
    /// was read: 499, nothing sent.
    pub(super) fn record_client_gone(&self, req: &crate::http::request::RequestHead) {
        self.record_simple(&req.method, &req.target, 499, 0, false, Duration::ZERO);
    }

    fn record_simple(
        &self,
        method: &str,
        target: &str,
        status: u16,
        body: u64,
        complete: bool,
        d: Duration,
    ) {
        self.record_as(
            &ResponseRecord {
                method,
                target,
                status,
                cache_status: CacheStatus::Error,
                head_bytes: self.head.len() as u64 - body,
                body_bytes: if complete { body } else { 0 },
                path: DataPath::Copy,
                duration: d,
                complete,
            },
            CopyReason::Generated,
        );
    }

    /// Starts the record of `req` for the access log: its part of the line and, on an HTTP/2
    /// stream, the request as unanswered until it is (a stream reset first is logged 499).
    pub(super) fn begin_record(&mut self, req: &RequestHead, started: Instant) {
        let route = self.log_info.route.take();
        self.log_info = crate::accesslog::RequestInfo::of(req);
        self.log_info.route = route;
        self.log_info.tls = self.sock.tls_info();
        if self.sock.is_h2() {
            self.unanswered = Some(Box::new(Unanswered {
                method: req.method.to_string(),
                target: req.target.clone(),
                started,
            }));
            self.recorded
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sends the response head built in `self.head` (and the body of an answer the proxy made,
    /// after it), within `limits.send_timeout` per write.
    pub async fn send_head(&mut self) -> Result<(), ConnError> {
        self.send_head_for_body(false).await
    }

    /// Sends the head built in `self.head` before a body of the exchange's own sending: with
    /// `more`, a cache file's body follows at once (plain TCP: one send with `MSG_MORE`; TLS:
    /// queued in rustls to leave with the body's first record).
    pub(super) async fn send_head_for_body(&mut self, more: bool) -> Result<(), ConnError> {
        Ok(self
            .sock
            .send_response_head(&mut self.head, more, self.ctx.client.send_timeout)
            .await?)
    }

    /// Sends framing that more of the body follows at once (a chunk's size line): with
    /// `MSG_MORE` on plain TCP, so it leaves in the body's first segment.
    pub(super) async fn send_more(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        Ok(self
            .sock
            .send_head(bytes, self.ctx.client.send_timeout)
            .await?)
    }

    /// Ends a body whose length its head did not say (an h2 stream's end; nothing on HTTP/1.1,
    /// whose last chunk or close says it).
    pub(super) async fn end_body(&mut self) -> Result<(), ConnError> {
        Ok(self.sock.end_body(self.ctx.client.send_timeout).await?)
    }

    /// The request was answered, but not as a client's response (a fleet peer's internal
    /// operation): its stream's reset is no abandoned request.
    pub(super) fn answered_unrecorded(&mut self) {
        self.unanswered = None;
    }

    /// Sends `bytes` to the client, within `limits.send_timeout` per write that makes progress.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        Ok(self
            .sock
            .send_all(bytes, self.ctx.client.send_timeout)
            .await?)
    }

    /// Records a response in the accounting (the proxy's "intent" side of the ledger); a copied
    /// body declared `Copy` here was relayed from the upstream.
    pub fn record(&self, r: &ResponseRecord<'_>) {
        self.record_as(r, CopyReason::Miss)
    }

    /// [`Conn::record`], with `relay` the reason a body declared `Copy` was copied. The declared
    /// path becomes what the transport made of it (see `copy_account`).
    pub(super) fn record_as(&self, r: &ResponseRecord<'_>, relay: CopyReason) {
        let acc = &self.ctx.accounting;
        let (path, reason) = classify(
            r.path,
            relay,
            self.sock.copies_by_design(),
            self.ctx.sending.copy_hits,
        );
        if let Some(reason) = reason {
            acc.copied.add(reason, r.body_bytes);
        }
        let r = &ResponseRecord { path, ..r.clone() };
        match &self.log_info.route {
            Some(route) => acc.response(self.id, r, route, self.from_peer),
            None => acc.response(self.id, r, acc.no_route(), self.from_peer),
        }
        if let Some(log) = &self.ctx.access_log {
            log.log(&self.peer, r, &self.log_info);
            self.recorded
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
