//! The fetch itself: one exchange with the upstream (retried once on a pooled connection that
//! turned out dead, for idempotent requests), then the decision on what the response is (stored
//! behind a fill, streamed, a precondition answered, a revalidation, stale on error) and the
//! relaying of its body to the client.

use crate::cache::conditional::{self, Precondition};
use crate::cache::decide::{Answer, Disposition};
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
use std::sync::Arc;
use std::time::SystemTime;
use zerocache_ledger::{CacheStatus, DataPath};

use super::stream::{drain, pump, upstream_closes};
use super::{Body, Fetch, Outcome, StreamError};
use crate::cache::policy::proxy_owned;

impl Fetch<'_> {
    /// Runs the fetch: the exchange, what it does to the store, what becomes of the answer
    /// (`cache::decide::Disposition`), then the answer relayed (stored behind a fill, or
    /// streamed). Returns what the connection does next.
    pub async fn run(mut self, conn: &mut Conn) -> Result<Outcome, ConnError> {
        let ctx = conn.ctx.clone();
        let req = self.req;
        let mut interim = Vec::new();
        let (up, head, request_time, response_time) =
            match self.exchange(conn, &ctx, &mut interim).await? {
                Ok(x) => x,
                Err(outcome) => return Ok(outcome),
            };
        let interim_bytes = if req.http10 {
            0
        } else {
            relay_interim(conn, &interim).await?
        };
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
        self.update_store(&ctx, &head, request_time, response_time);
        let mut stale = None;
        match Disposition::of(
            Answer::Status(head.status),
            self.revalidating.is_some(),
            || {
                stale = self.stale_on_error();
                stale.is_some()
            },
        ) {
            // The upstream answered with a server error while we hold a usable stale response.
            Disposition::ServeStale => {
                if let Some(stale) = stale {
                    tracing::warn!(upstream = %self.upstream.name, target = %req.target, status = head.status, "upstream error; serving stale");
                    ctx.accounting.upstream_error(&self.upstream.name, "status");
                    drop(up);
                    return Ok(Outcome::stale(stale));
                }
            }
            // A 304 to our revalidation: update the stored fields and serve it through sendfile.
            Disposition::Refresh => {
                if let Some(stale) = self.revalidating.clone() {
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
            }
            Disposition::Relay | Disposition::Fail => {}
        }
        let (fill, not_stored) = self.storage(&ctx, &head, framing, request_time, response_time);
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
                let reuse = !upstream_close && !self.no_pool;
                // A client answered locally (304/412) reads nothing, yet asked for the object:
                // its fill is not an abandoned one.
                let wanted = local == Precondition::Proceed;
                self.fill_behind(&ctx, up, framing, f, guard, reuse, wanted)
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
            && total <= ctx.storing.range_fill_max
        {
            self.spawn_range_fill(&ctx, r, conn.peer.ip());
        }

        let tokens =
            headers::connection_tokens(head.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let stored = matches!(body, Body::Behind(..));
        let (close_after, to_client_chunked) =
            self.client_head(conn, &ctx, &head, &tokens, framing, stored, not_stored);
        let head_bytes = conn.head.len() as u64 + interim_bytes;

        let up = match body {
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

        let relayed = Relaying {
            framing,
            status: head.status,
            head_bytes,
            chunked: to_client_chunked,
            reuse: !upstream_close && !self.no_pool,
        };
        self.relay_streamed(conn, &ctx, up, relayed).await?;
        Ok(Outcome::Done(!close_after))
    }

    /// Starts the fill of a storable body: a task copies it from the origin into the cache file
    /// at the origin's speed, the key's followers are told where to read behind it, and so is
    /// this client.
    #[allow(clippy::too_many_arguments)]
    fn fill_behind(
        &self,
        ctx: &Arc<crate::server::Ctx>,
        up: crate::upstream::UpstreamConn,
        framing: BodyFraming,
        f: Fill,
        guard: Option<crate::cache::lock::LeaderGuard>,
        reuse: bool,
        wanted: bool,
    ) -> Body {
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
            reuse,
            wanted,
        ));
        Body::Behind(g, reader)
    }

    /// The body of a response that is not stored, upstream → client through a buffer (chunked
    /// to the client when the origin's framing needs it), and the response recorded.
    async fn relay_streamed(
        &self,
        conn: &mut Conn,
        ctx: &crate::server::Ctx,
        mut up: crate::upstream::UpstreamConn,
        r: Relaying,
    ) -> Result<(), ConnError> {
        let req = self.req;
        let Relaying {
            framing,
            status,
            head_bytes,
            chunked: to_client_chunked,
            reuse,
        } = r;
        // Body: upstream → client, for a response that is not stored.
        let mut reader = BodyReader::new(framing, self.upstream.read_timeout);
        let mut piece = Vec::with_capacity(64 * 1024);
        let mut out = Vec::with_capacity(if to_client_chunked { 64 * 1024 + 32 } else { 0 });
        let mut body_bytes = 0u64;
        while !reader.is_done() {
            if let Err(e) = reader.next(&mut up, &mut piece).await {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, error = %e, received = body_bytes, "upstream body failed; closing client connection");
                ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                self.record(conn, status, head_bytes, body_bytes, false);
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
                self.record(conn, status, head_bytes, body_bytes, false);
                return Err(e);
            }
            body_bytes += piece.len() as u64;
        }
        if reader.reusable() && reuse {
            self.upstream.release(up);
        }
        self.record(conn, status, head_bytes, body_bytes, true);
        Ok(())
    }

    /// What the answer does to the store before the client hears it: a 200 to a HEAD updates
    /// (or makes stale) the stored GET response; an unsafe method's success invalidates.
    fn update_store(
        &mut self,
        ctx: &crate::server::Ctx,
        head: &crate::http::response::ResponseHead,
        request_time: SystemTime,
        response_time: SystemTime,
    ) {
        let req = self.req;
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
                    head,
                    stored.etag.as_deref(),
                    stored.last_modified.as_deref(),
                    stored.body_len,
                )
            {
                let (meta, storable) =
                    self.updated_meta(ctx, &stored, head, request_time, response_time);
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
            for url in invalidation::invalidated(&req.host, &req.target, head, keep_query)
                .into_iter()
                .flat_map(crate::cache::key::with_https_twin)
            {
                let n = ctx.store.purge_url(&url);
                if n > 0 {
                    tracing::debug!(%url, entries = n, method = %req.method, "invalidated");
                }
            }
        }
    }

    /// Whether the answer is stored here, and if so its fill, created with room reserved for a
    /// known length; else why not (`Cache-Status: detail=`).
    fn storage(
        &self,
        ctx: &crate::server::Ctx,
        head: &crate::http::response::ResponseHead,
        framing: BodyFraming,
        request_time: SystemTime,
        response_time: SystemTime,
    ) -> (Option<Fill>, Option<&'static str>) {
        let req = self.req;
        let mut fill: Option<Fill> = None;
        let mut not_stored: Option<&'static str> = self.not_stored;
        if let Some((primary, _)) = &self.fill
            && self.store_here
            && self.via_peer.as_ref().is_none_or(|r| r.may_store(head))
        {
            // An unwritable cache is retried on every storable miss (one failed open(2)), so a
            // freed disk or fixed permission brings the cache back without a restart.
            match policy::storable(
                req,
                head,
                request_time,
                response_time,
                self.heuristics(ctx),
                self.rules(ctx),
            ) {
                Ok(st) => {
                    let (key, meta) = fill_meta(
                        primary,
                        st,
                        req,
                        head,
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

        (fill, not_stored)
    }

    /// Writes the client's head for the origin's `head` into `conn.head`: its end-to-end
    /// fields, the framing the client gets, and what the cache did (`stored`, or why not).
    /// Returns whether the connection closes after it and whether the body is chunked to it.
    #[allow(clippy::too_many_arguments)]
    fn client_head(
        &self,
        conn: &mut Conn,
        ctx: &crate::server::Ctx,
        head: &crate::http::response::ResponseHead,
        tokens: &[String],
        framing: BodyFraming,
        stored: bool,
        not_stored: Option<&'static str>,
    ) -> (bool, bool) {
        let req = self.req;
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
            if headers::is_hop_by_hop(k, tokens)
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
            .then(|| crate::fleet::forward::relayed(head, stored));
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
        (close_after, to_client_chunked)
    }

    /// The exchange with the upstream (or the key's fleet owner), retried once on a dead pooled
    /// connection for an idempotent request; interim responses collected in `interim`. An
    /// exchange that failed is already an outcome: stale-if-error, or the failure's status.
    #[allow(clippy::type_complexity)]
    async fn exchange(
        &mut self,
        conn: &mut Conn,
        ctx: &Arc<crate::server::Ctx>,
        interim: &mut Vec<crate::http::response::ResponseHead>,
    ) -> Result<
        Result<
            (
                crate::upstream::UpstreamConn,
                crate::http::response::ResponseHead,
                SystemTime,
                SystemTime,
            ),
            Outcome,
        >,
        ConnError,
    > {
        let request = self.upstream_request(conn.peer.ip(), ctx);
        let req = self.req;
        let idempotent = matches!(
            req.method.as_str(),
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        );
        let request_time = SystemTime::now();
        let exchanged = match std::mem::replace(&mut self.body, RequestBody::Whole(Vec::new())) {
            RequestBody::Whole(_) => match self.fleet.take() {
                Some(plan) => self.exchange_fleet(plan, &request, interim).await,
                None => {
                    self.upstream
                        .exchange(&request, idempotent, &self.balance_key(), interim)
                        .await
                }
            },
            RequestBody::Streaming { first, rest } => {
                match self
                    .exchange_streaming(conn, &request, first, rest, interim)
                    .await
                {
                    Ok(x) => Ok(x),
                    Err(StreamError::Upstream(e)) => Err(e),
                    Err(StreamError::Body(e)) => {
                        // The origin got part of a body: its connection is dropped, never pooled.
                        return Ok(Err(Outcome::RefuseBody(e)));
                    }
                }
            }
        };
        let (up, head) = match exchanged {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(upstream = %self.upstream.name, target = %req.target, error = %e, "upstream failed");
                ctx.accounting.upstream_error(&self.upstream.name, e.kind());
                let stale = self.stale_on_error();
                let outcome = match Disposition::of(Answer::Failed, false, || stale.is_some()) {
                    Disposition::ServeStale => stale.map(Outcome::stale),
                    _ => None,
                };
                // The client still sees what the cache did (X-Cache: MISS); the accounting and
                // metrics see an upstream failure, not a miss.
                return Ok(Err(outcome.unwrap_or(Outcome::Reply {
                    status: e.status(),
                    x_cache: self.status,
                    detail: e.detail(),
                })));
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
        Ok(Ok((up, head, request_time, response_time)))
    }
}

/// What relaying a streamed body needs of the response.
struct Relaying {
    framing: BodyFraming,
    status: u16,
    /// Bytes of heads sent before the body (interim ones included).
    head_bytes: u64,
    /// The body goes to the client chunked.
    chunked: bool,
    /// The upstream connection may go back to the pool once the body is read.
    reuse: bool,
}

/// Sends the origin's interim responses (103 Early Hints) on: an interim head describes no body
/// and no connection of the client's, so only its end-to-end fields (103's Link) cross. Returns
/// the bytes sent.
async fn relay_interim(
    conn: &mut Conn,
    interim: &[crate::http::response::ResponseHead],
) -> Result<u64, ConnError> {
    let mut bytes = 0u64;
    for h in interim {
        let mut head = Head::new(&mut conn.head, h.status, &h.reason);
        head.end_to_end(&h.fields, proxy_owned);
        head.end(false);
        conn.send_head().await?;
        bytes += conn.head.len() as u64;
    }
    Ok(bytes)
}
