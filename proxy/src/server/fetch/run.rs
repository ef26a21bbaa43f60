//! The fetch itself: one exchange with the upstream (retried once on a pooled connection that
//! turned out dead, for idempotent requests), then the decision on what the response is (stored
//! behind a fill, streamed, a precondition answered, a revalidation, stale on error) and the
//! relaying of its body to the client.

use crate::cache::conditional::{self, Precondition};
use crate::cache::fill::Fill;
use crate::cache::growing::Growing;
use crate::cache::invalidation;
use crate::cache::lock::Role;
use crate::cache::policy;
use crate::cache::stored_meta::fill_meta;
use crate::cache::validation;
use crate::http::head::{CacheFields, CacheStatusField, Framing, Head};
use crate::http::headers;
use crate::http::range;
use crate::http::response::BodyFraming;
use crate::server::conn::{Conn, ConnError};
use crate::server::hit::HitKind;
use crate::server::upload::RequestBody;
use crate::upstream::body::BodyReader;
use std::time::SystemTime;
use zerocache_ledger::{CacheStatus, DataPath};

use super::stream::{drain, pump, upstream_closes};
use super::{Body, Fetch, Outcome, StreamError};
use crate::cache::policy::proxy_owned;

impl Fetch<'_> {
    /// Runs the fetch; returns whether the client connection stays open.
    pub async fn run(mut self, conn: &mut Conn) -> Result<Outcome, ConnError> {
        let ctx = conn.ctx.clone();
        let req = self.req;
        let request = self.upstream_request(conn.peer.ip(), &ctx);
        let idempotent = matches!(
            req.method.as_str(),
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        );
        let mut interim = Vec::new();
        let request_time = SystemTime::now();
        let exchanged = match std::mem::replace(&mut self.body, RequestBody::Whole(Vec::new())) {
            RequestBody::Whole(_) => match self.fleet.take() {
                Some(plan) => self.exchange_fleet(plan, &request, &mut interim).await,
                None => {
                    self.upstream
                        .exchange(&request, idempotent, &self.balance_key(), &mut interim)
                        .await
                }
            },
            RequestBody::Streaming { first, rest } => {
                match self
                    .exchange_streaming(conn, &request, first, rest, &mut interim)
                    .await
                {
                    Ok(x) => Ok(x),
                    Err(StreamError::Upstream(e)) => Err(e),
                    Err(StreamError::Body(e)) => {
                        // The origin got part of a body: its connection is dropped, never pooled.
                        return Ok(Outcome::RefuseBody(e));
                    }
                }
            }
        };
        let (up, head) = match exchanged {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, error = %e, "upstream failed");
                ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                if let Some(stale) = self.stale_on_error() {
                    return Ok(Outcome::stale(stale));
                }
                // The client still sees what the cache did (X-Cache: MISS); the accounting and
                // metrics see an upstream failure, not a miss.
                return Ok(Outcome::Reply {
                    status: e.status(),
                    x_cache: self.status,
                    detail: e.detail(),
                });
            }
        };
        let response_time = SystemTime::now();
        let upstream_time = response_time
            .duration_since(request_time)
            .unwrap_or_default();
        ctx.accounting.upstream_response(
            &self.upstream.name,
            self.upstream.server_of(&up),
            head.status,
            upstream_time,
        );
        if ctx.access_log.is_some()
            && let Ok(addr) = up.stream.peer_addr()
        {
            conn.log_info.upstream = Some(crate::accesslog::UpstreamInfo {
                addr,
                status: head.status,
                time: upstream_time,
            });
        }
        let mut interim_bytes = 0u64;
        if !req.http10 {
            for h in &interim {
                // An interim head describes no body and no connection of the client's: only its
                // end-to-end fields (103's Link) cross.
                let mut head = Head::new(&mut conn.head, h.status, &h.reason);
                head.end_to_end(&h.fields, proxy_owned);
                head.end(false);
                conn.send_head().await?;
                interim_bytes += conn.head.len() as u64;
            }
        }
        let framing = match head.framing(req.method == "HEAD") {
            Ok(f) => f,
            Err(why) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, why, "upstream response has ambiguous framing; not stored");
                ctx.accounting
                    .upstream_error(&self.upstream.name, "protocol");
                return Ok(Outcome::Reply {
                    status: 502,
                    x_cache: self.status,
                    detail: None,
                });
            }
        };

        // A 200 to a HEAD updates the stored GET response it could have been chosen for, or
        // makes it stale when it describes another representation (RFC 9111 §4.3.5).
        // Only as the fill leader of the URL, and only while `stored` is still what the index
        // holds: a fill committing meanwhile renames a new file onto the same path, which an
        // update of the old entry must never write into.
        if head.status == 200
            && let Some((stored, primary_hash)) = self.head_update.take()
            && let Role::Leader(_guard) = ctx.locks.acquire(primary_hash)
            && ctx.store.is_current(&stored)
        {
            // Only a stored 200 is described by a 200 to a HEAD; a stored 404 or 301 is not.
            if stored.meta.status == 200
                && validation::head_matches(
                    &head,
                    stored.etag.as_deref(),
                    stored.last_modified.as_deref(),
                    stored.body_len,
                )
            {
                let (meta, storable) =
                    self.updated_meta(&ctx, &stored, &head, request_time, response_time);
                if storable {
                    ctx.store.replace_meta(&stored, meta);
                } else {
                    ctx.store.remove_if_same(&stored);
                }
            } else {
                let mut meta = stored.meta.clone();
                meta.lifetime = std::time::Duration::ZERO;
                ctx.store.replace_meta(&stored, meta);
            }
        }

        // An unsafe method's non-error response invalidates what is stored for its URLs, before
        // the client hears back.
        if let Some(keep_query) = self.invalidate
            && (200..400).contains(&head.status)
        {
            for url in invalidation::invalidated(&req.host, &req.target, &head, keep_query)
                .into_iter()
                .flat_map(crate::cache::key::with_https_twin)
            {
                let n = ctx.store.purge_url(&url);
                if n > 0 {
                    tracing::debug!(%url, entries = n, method = %req.method, "invalidated");
                }
            }
        }

        // The upstream answered with a server error while we hold a usable stale response.
        if head.status >= 500
            && let Some(stale) = self.stale_on_error()
        {
            tracing::warn!(upstream = %self.upstream.name, target = %req.target, status = head.status, "upstream error; serving stale");
            ctx.accounting.upstream_error(&self.upstream.name, "status");
            drop(up);
            return Ok(Outcome::stale(stale));
        }

        // A 304 to our revalidation: update the stored fields and serve it through sendfile.
        if head.status == 304
            && let Some(stale) = self.revalidating.clone()
        {
            drain(up, &head, framing, &self.upstream).await;
            let (meta, storable) =
                self.updated_meta(&ctx, &stale, &head, request_time, response_time);
            let updated = ctx.store.replace_meta(&stale, meta);
            return Ok(Outcome::ServeStored {
                entry: updated,
                kind: HitKind::Revalidated,
                // This client is answered from it; nobody else may be.
                then_remove: !storable,
                requester: crate::cache::validation::requester_fields(&head),
            });
        }

        // Decide storage.
        let tokens =
            headers::connection_tokens(head.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let mut fill: Option<Fill> = None;
        let mut not_stored: Option<&'static str> = self.not_stored;
        if let Some((primary, _)) = &self.fill
            && self.store_here
            && self.via_peer.as_ref().is_none_or(|r| r.may_store(&head))
        {
            // An unwritable cache is retried on every storable miss (one failed open(2)), so a
            // freed disk or fixed permission brings the cache back without a restart.
            match policy::storable(
                req,
                &head,
                request_time,
                response_time,
                self.heuristics(&ctx),
                self.rules(&ctx),
            ) {
                Ok(st) => {
                    let (key, meta) = fill_meta(
                        primary,
                        st,
                        req,
                        &head,
                        response_time,
                        &self.url,
                        ctx.hash_bits,
                    );
                    let len = framing.length().unwrap_or(0);
                    match Fill::create(ctx.store.clone(), key.hash, meta).and_then(|f| {
                        ctx.store
                            .on_full_disk_evict_and_retry(len, || f.reserve(len))?;
                        Ok(f)
                    }) {
                        Ok(f) => {
                            fill = Some(f);
                            not_stored = None;
                        }
                        Err(e) => {
                            ctx.store.write_failed(&e);
                            not_stored = Some("cache-unwritable");
                        }
                    }
                }
                Err(why) => not_stored = Some(why.token()),
            }
        }

        // Only a storable response keeps the followers waiting; for any other, let them go now
        // and fetch on their own (hit-for-miss), so an uncacheable URL never queues its clients.
        let fetched_whole = self.fill.is_some();
        let guard = self.fill.take().and_then(|(_, g)| g);
        let guard = if fill.is_some() { guard } else { None };
        let upstream_close = upstream_closes(&head);

        // The whole representation was fetched in place of the client's conditional request:
        // its preconditions are answered here, from what the origin sent (RFC 9110 §13.2.2),
        // while the body still goes into the cache.
        let local = if fetched_whole && (200..300).contains(&head.status) {
            conditional::evaluate(
                req,
                head.field("etag"),
                head.field("last-modified"),
                head.field("date"),
            )
        } else {
            Precondition::Proceed
        };
        // A storable body goes into the cache file by a task of its own, at the origin's speed;
        // this client, and followers whose variant matches, read behind it.
        let body = match fill {
            Some(f) => {
                let (g, w) = Growing::new(f.file(), f.entry_preview(), framing.length());
                let reader = g.reader();
                if let Some(guard) = &guard {
                    guard.publish(g.clone());
                }
                tokio::spawn(pump(
                    ctx.clone(),
                    up,
                    framing,
                    self.upstream.clone(),
                    f,
                    w,
                    guard,
                    !upstream_close && !self.no_pool,
                    // A client answered locally (304/412) reads nothing, yet asked for the
                    // object: its fill is not an abandoned one.
                    local == Precondition::Proceed,
                ));
                Body::Behind(g, reader)
            }
            None => Body::Stream(up),
        };

        if local != Precondition::Proceed {
            return self
                .answer_precondition(conn, local, &head, interim_bytes)
                .await
                .map(Outcome::Done);
        }

        if let Some(r) = self.range_fill.take()
            && head.status == 206
            && let Some(total) = head.field("content-range").and_then(range::complete_length)
            && total <= ctx.range_fill_max
        {
            self.spawn_range_fill(&ctx, r, conn.peer.ip());
        }

        // Client head.
        let client_close = req.close || self.body_unfinished;
        let to_client_chunked =
            matches!(framing, BodyFraming::Chunked | BodyFraming::Close) && !req.http10;
        let close_after = client_close
            || (matches!(framing, BodyFraming::Chunked | BodyFraming::Close) && req.http10);
        let mut h = Head::new(&mut conn.head, head.status, &head.reason);
        let mut via: Option<String> = None;
        for (k, v) in &head.fields {
            if k.eq_ignore_ascii_case("age") {
                // End-to-end (RFC 9111 §5.1): a forwarded response carries the upstream's Age
                // as received; only a response served from the cache gets one computed.
                h.field(k, v);
                continue;
            }
            if headers::is_hop_by_hop(k, &tokens)
                || proxy_owned(k) && !k.eq_ignore_ascii_case("content-length")
            {
                continue;
            }
            if k.eq_ignore_ascii_case("content-length") {
                // Kept only where it describes a body not sent: the GET body of a HEAD, the
                // selected representation of a 304. On a 204 or 1xx it is a framing error the
                // client might act on (reading the next response as this one's body).
                if framing == BodyFraming::None && (req.method == "HEAD" || head.status == 304) {
                    h.field(k, v);
                }
                continue;
            }
            if k.eq_ignore_ascii_case("via") {
                // Every line of a repeated Via is one list (RFC 9110 §5.3): keep every hop.
                let v = String::from_utf8_lossy(v);
                via = Some(match via {
                    Some(p) => format!("{p}, {v}"),
                    None => v.into_owned(),
                });
                continue;
            }
            if ctx.store.targeted().hides(k) {
                continue;
            }
            h.field(k, v);
        }
        h.framing(match framing {
            BodyFraming::Length(n) => Framing::Length(n),
            BodyFraming::Chunked | BodyFraming::Close if to_client_chunked => Framing::Chunked,
            _ => Framing::None,
        });
        let stored = matches!(body, Body::Behind(..));
        let fwd = match self.status {
            CacheStatus::Expired => "stale",
            CacheStatus::Bypass => self.detail,
            _ => "miss",
        };
        // `detail` says why a response will not be stored.
        let member = match (stored, not_stored, self.status) {
            (_, _, CacheStatus::Bypass) => CacheStatusField::fwd(fwd),
            // Every response that completes was stored: a fill that fails aborts its readers.
            (true, _, _) => CacheStatusField {
                stored: true,
                ..CacheStatusField::fwd(fwd)
            },
            (false, Some(why), _) => CacheStatusField::fwd(fwd).detail(why),
            (false, None, _) => CacheStatusField::fwd(fwd),
        };
        let relayed = self
            .via_peer
            .is_some()
            .then(|| crate::fleet::forward::relayed(&head, stored));
        let cache = match &relayed {
            // A peer's answer: what happened at the owner, then this node's own member.
            Some(r) => {
                conn.log_info.relayed_cache = CacheStatus::from_x_cache(r.x_cache());
                r.fields()
            }
            None => CacheFields {
                x_cache: self.status.as_str(),
                upstream: None,
                member: Some(member),
            },
        };
        h.cache(&cache).via(via.as_deref(), head.http10);
        h.end(close_after);
        let head_bytes = conn.head.len() as u64 + interim_bytes;

        let mut up = match body {
            Body::Stream(up) => up,
            Body::Behind(g, reader) => {
                let (body, framing_bytes, result) = match conn.send_head().await {
                    Ok(()) => {
                        conn.read_behind(&g, reader, to_client_chunked, self.upstream.read_timeout)
                            .await
                    }
                    Err(e) => (0, 0, Err(e)),
                };
                self.record_path(
                    conn,
                    head.status,
                    head_bytes + framing_bytes,
                    body,
                    DataPath::Zerocopy,
                    result.is_ok(),
                );
                result?;
                return Ok(Outcome::Done(!close_after));
            }
        };
        if let Err(e) = conn.send_head().await {
            self.record(conn, head.status, head_bytes, 0, false);
            return Err(e);
        }

        // Body: upstream → client, for a response that is not stored.
        let mut reader = BodyReader::new(framing, self.upstream.read_timeout);
        let mut piece = Vec::with_capacity(64 * 1024);
        let mut out = Vec::with_capacity(if to_client_chunked { 64 * 1024 + 32 } else { 0 });
        let mut body_bytes = 0u64;
        while !reader.is_done() {
            if let Err(e) = reader.next(&mut up, &mut piece).await {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, error = %e, received = body_bytes, "upstream body failed; closing client connection");
                ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                self.record(conn, head.status, head_bytes, body_bytes, false);
                return Err(ConnError::Aborted(e.to_string()));
            }
            let sent = if to_client_chunked {
                out.clear();
                if !piece.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(&piece);
                    out.extend_from_slice(b"\r\n");
                }
                if reader.is_done() {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                conn.send(&out).await
            } else {
                conn.send(&piece).await
            };
            if let Err(e) = sent {
                self.record(conn, head.status, head_bytes, body_bytes, false);
                return Err(e);
            }
            body_bytes += piece.len() as u64;
        }
        if reader.reusable() && !upstream_close && !self.no_pool {
            self.upstream.release(up);
        }
        self.record(conn, head.status, head_bytes, body_bytes, true);
        Ok(Outcome::Done(!close_after))
    }
}
