//! Sending what a fetch got ([`Fetched`]): the interim heads, then the outcome. An origin's
//! answer gets the client's head (its end-to-end fields, the framing the client gets, what the
//! cache did) and its body, read behind the fill that stores it (sendfile) or streamed from the
//! upstream; a precondition the fetched representation answers gets its 304 or 412; a stored
//! entry is served as a hit; a failure gets its short generated answer.
//!
//! Why here and not in the fetch: the fetch decides and the exchange writes, so the fetch never
//! imports the connection (data flows one way), and the fetch is dropped before the client is
//! sent anything (a fill's lock lives on in its pump task).

use super::conn_error::ConnError;
use super::conn_state::Conn;
use super::exchange::Exchange;
use super::fetch::{Body, Fetch, Fetched, Outcome, Relayed};
use super::hit::{HitKind, HitOutcome};
use crate::cache::conditional::{self, Precondition};
use crate::cache::policy::proxy_owned;
use crate::http::head::{CacheFields, CacheStatusField, Framing, Head};
use crate::http::headers;
use crate::http::request::RequestHead;
use crate::http::response::{BodyFraming, ResponseHead};
use crate::upstream::UpstreamConn;
use crate::upstream::body::BodyReader;
use std::time::Instant;
use zerocache_ledger::{CacheStatus, CopyReason, DataPath, ResponseRecord};

/// The accounting of one relayed answer: what the ledger is told however the sending ends.
struct Account<'r> {
    req: &'r RequestHead,
    started: Instant,
    /// The status sent.
    status: u16,
    /// What the cache did (`X-Cache`).
    cache_status: CacheStatus,
    via_peer: Option<&'r crate::fleet::forward::Relay>,
}

impl Account<'_> {
    /// Records the answer: a body copied through the proxy was relayed from the origin (reason
    /// `miss`), or from the key's owner in a fleet (reason `peer`, counted by the fleet too).
    fn record(&self, conn: &Conn, head_bytes: u64, body_bytes: u64, path: DataPath, ok: bool) {
        if path == DataPath::Copy
            && let Some(r) = self.via_peer
        {
            r.relayed(body_bytes);
        }
        let reason = if self.via_peer.is_some() {
            CopyReason::Peer
        } else {
            CopyReason::Miss
        };
        conn.record_as(
            &ResponseRecord {
                method: &self.req.method,
                target: &self.req.target,
                status: self.status,
                cache_status: self.cache_status,
                head_bytes,
                body_bytes,
                path,
                duration: self.started.elapsed(),
                complete: ok,
            },
            reason,
        );
    }
}

impl Exchange<'_> {
    /// Runs a fetch and sends what it got: the one place a fetch's result turns into bytes for
    /// the client.
    pub(super) async fn fetch(&mut self, f: Fetch<'_>) -> Result<bool, ConnError> {
        let (req, started) = (f.request(), f.started());
        let ctx = self.c.ctx.clone();
        let peer = self.c.peer.ip();
        let Fetched {
            interim,
            upstream,
            must_close,
            outcome,
        } = f.run(&ctx, peer, &mut *self.c).await;
        self.c.must_close = must_close;
        if upstream.is_some() {
            self.c.log_info.upstream = upstream;
        }
        let interim_bytes = if req.http10 {
            0
        } else {
            self.relay_interim(&interim).await?
        };
        match outcome {
            Outcome::Relay(r) => self.relay(req, started, *r, interim_bytes).await,
            Outcome::ServeStored {
                entry,
                kind,
                then_remove,
                requester,
            } => {
                let served = self.serve_hit(req, &entry, kind, &requester, started).await;
                if then_remove {
                    self.c.ctx.store.remove_if_same(&entry);
                }
                match served? {
                    HitOutcome::Served(keep) => Ok(keep),
                    // A stale entry gone from disk leaves nothing to say; a just-revalidated one
                    // owes the client an answer.
                    HitOutcome::Gone if kind == HitKind::Stale => Ok(false),
                    HitOutcome::Gone => {
                        self.c
                            .respond_simple(req, 502, CacheStatus::Error, &[], None, started)
                            .await
                    }
                }
            }
            Outcome::Reply { status, detail } => {
                // Answered by the proxy itself: `X-Cache: ERROR`, as the log line and the
                // metrics count it (CloudFront says `Error from cloudfront`).
                let cache = CacheFields {
                    x_cache: CacheStatus::Error.as_str(),
                    upstream: None,
                    member: detail.map(|d| CacheStatusField::fwd("miss").detail(d)),
                };
                self.c
                    .respond_simple(req, status, CacheStatus::Error, &[], Some(&cache), started)
                    .await
            }
            Outcome::RefuseBody(e) => {
                self.c.refuse_body(req, e).await?;
                Ok(false)
            }
        }
    }

    /// Sends the origin's interim responses (103 Early Hints) on: an interim head describes no
    /// body and no connection of the client's, so only its end-to-end fields (103's Link)
    /// cross. Returns the bytes sent.
    async fn relay_interim(&mut self, interim: &[ResponseHead]) -> Result<u64, ConnError> {
        let mut bytes = 0u64;
        for h in interim {
            let mut head = Head::new(&mut self.c.head, h.status, &h.reason);
            head.end_to_end(&h.fields, proxy_owned);
            head.end(false);
            self.c.send_head().await?;
            bytes += self.c.head.len() as u64;
        }
        Ok(bytes)
    }

    /// Sends the origin's answer `r` to `req`: its precondition answered here, or its head and
    /// body. Returns whether the connection stays open.
    pub(super) async fn relay(
        &mut self,
        req: &RequestHead,
        started: Instant,
        r: Relayed,
        interim_bytes: u64,
    ) -> Result<bool, ConnError> {
        if r.local != Precondition::Proceed {
            // The body goes on into the cache without this client (a stored one), or is not
            // read at all (dropping the upstream connection closes it).
            return self
                .answer_precondition(req, started, &r, interim_bytes)
                .await;
        }
        let stored = matches!(r.body, Body::Behind(..));
        let (close_after, chunked) = self.client_head(req, &r, stored);
        let head_bytes = self.c.head.len() as u64 + interim_bytes;
        let account = Account {
            req,
            started,
            status: r.head.status,
            cache_status: r.status,
            via_peer: r.via_peer.as_ref(),
        };
        let up = match r.body {
            Body::Behind(g, reader) => {
                let (body, framing_bytes, result) = match self.c.send_head().await {
                    Ok(()) => {
                        self.read_behind(&g, reader, chunked, r.upstream.read_timeout)
                            .await
                    }
                    Err(e) => (0, 0, Err(e)),
                };
                account.record(
                    self.c,
                    head_bytes + framing_bytes,
                    body,
                    DataPath::Zerocopy,
                    result.is_ok(),
                );
                result?;
                return Ok(!close_after);
            }
            Body::Stream(up) => up,
        };
        if let Err(e) = self.c.send_head().await {
            account.record(self.c, head_bytes, 0, DataPath::Copy, false);
            return Err(e);
        }
        let streamed = Streamed {
            framing: r.framing,
            chunked,
            reuse: r.reuse,
            head_bytes,
        };
        self.relay_streamed(&r.upstream, up, streamed, &account)
            .await?;
        Ok(!close_after)
    }

    /// The body of a response that is not stored, upstream → client through a buffer (chunked
    /// to the client when the origin's framing needs it), and the response recorded.
    async fn relay_streamed(
        &mut self,
        group: &crate::upstream::Group,
        mut up: UpstreamConn,
        s: Streamed,
        account: &Account<'_>,
    ) -> Result<(), ConnError> {
        let mut reader = BodyReader::new(s.framing, group.read_timeout);
        let mut piece = Vec::with_capacity(64 * 1024);
        // Chunk-encoded for an HTTP/1.1 client; an h2 stream's end ends its body.
        let encode = s.chunked && !self.c.sock.is_h2();
        let mut out = Vec::with_capacity(if encode { 64 * 1024 + 32 } else { 0 });
        let mut body_bytes = 0u64;
        while !reader.is_done() {
            if let Err(e) = reader.next(&mut up, &mut piece).await {
                tracing::warn!(upstream = %group.name, target = %account.req.target, error = %e, received = body_bytes, "upstream body failed; closing client connection");
                self.c.ctx.accounting.upstream_error(&group.name, e.kind());
                account.record(self.c, s.head_bytes, body_bytes, DataPath::Copy, false);
                return Err(ConnError::Aborted(e.to_string()));
            }
            let sent = if encode {
                out.clear();
                if !piece.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(&piece);
                    out.extend_from_slice(b"\r\n");
                }
                if reader.is_done() {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                self.c.send(&out).await
            } else {
                self.c.send(&piece).await
            };
            if let Err(e) = sent {
                account.record(self.c, s.head_bytes, body_bytes, DataPath::Copy, false);
                return Err(e);
            }
            body_bytes += piece.len() as u64;
        }
        if s.chunked
            && let Err(e) = self.c.end_body().await
        {
            account.record(self.c, s.head_bytes, body_bytes, DataPath::Copy, false);
            return Err(e);
        }
        if reader.reusable() && s.reuse {
            group.release(up);
        }
        account.record(self.c, s.head_bytes, body_bytes, DataPath::Copy, true);
        Ok(())
    }

    /// Answers the client's precondition (304 or 412) from the origin's answer `r` to the
    /// unconditional request sent in its place.
    async fn answer_precondition(
        &mut self,
        req: &RequestHead,
        started: Instant,
        r: &Relayed,
        interim_bytes: u64,
    ) -> Result<bool, ConnError> {
        let status = if r.local == Precondition::NotModified {
            304
        } else {
            412
        };
        let mut h = Head::standard(&mut self.c.head, status);
        if status == 304 {
            for (k, v) in &r.head.fields {
                if conditional::NOT_MODIFIED_FIELDS
                    .iter()
                    .any(|f| k.eq_ignore_ascii_case(f))
                {
                    h.field(k, v);
                }
            }
        } else {
            h.framing(Framing::Length(0));
        }
        h.cache(&CacheFields {
            x_cache: r.status.as_str(),
            upstream: None,
            member: Some(CacheStatusField::fwd("miss")),
        })
        .via_self();
        h.end(req.close);
        let sent = self.c.send_head().await;
        let account = Account {
            req,
            started,
            status,
            cache_status: r.status,
            via_peer: r.via_peer.as_ref(),
        };
        let head_bytes = self.c.head.len() as u64 + interim_bytes;
        account.record(self.c, head_bytes, 0, DataPath::Copy, sent.is_ok());
        sent?;
        Ok(!req.close)
    }

    /// Writes the client's head for the origin's answer `r` into `self.c.head`: its end-to-end
    /// fields, the framing the client gets, and what the cache did (`stored`, or why not).
    /// Returns whether the connection closes after it and whether the body is chunked to it.
    fn client_head(&mut self, req: &RequestHead, r: &Relayed, stored: bool) -> (bool, bool) {
        let (head, framing) = (&r.head, r.framing);
        let tokens =
            headers::connection_tokens(head.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let client_close = req.close || r.body_unfinished;
        let to_client_chunked =
            matches!(framing, BodyFraming::Chunked | BodyFraming::Close) && !req.http10;
        let close_after = client_close
            || (matches!(framing, BodyFraming::Chunked | BodyFraming::Close) && req.http10);
        let ctx = self.c.ctx.clone();
        let mut h = Head::new(&mut self.c.head, head.status, &head.reason);
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
            // Hidden from clients; a fleet peer gets the tag field, for its own copy's tags.
            if ctx.store.targeted().hides(k)
                && !(self.c.from_peer && ctx.store.is_hidden_tag_field(k))
            {
                continue;
            }
            h.field(k, v);
        }
        h.framing(match framing {
            BodyFraming::Length(n) => Framing::Length(n),
            BodyFraming::Chunked | BodyFraming::Close if to_client_chunked => Framing::Chunked,
            _ => Framing::None,
        });
        let fwd = match r.status {
            CacheStatus::Expired => "stale",
            CacheStatus::Bypass => r.detail,
            _ => "miss",
        };
        // `detail` says why a response will not be stored.
        let member = match (stored, r.not_stored, r.status) {
            (_, _, CacheStatus::Bypass) => CacheStatusField::fwd(fwd),
            // Every response that completes was stored: a fill that fails aborts its readers.
            (true, _, _) => CacheStatusField {
                stored: true,
                ..CacheStatusField::fwd(fwd)
            },
            (false, Some(why), _) => CacheStatusField::fwd(fwd).detail(why),
            (false, None, _) => CacheStatusField::fwd(fwd),
        };
        let relayed = r
            .via_peer
            .is_some()
            .then(|| crate::fleet::forward::relayed(head, stored));
        let cache = match &relayed {
            // A peer's answer: what happened at the owner, then this node's own member.
            Some(p) => {
                self.c.log_info.relayed_cache = CacheStatus::from_x_cache(p.x_cache());
                p.fields()
            }
            None => CacheFields {
                x_cache: r.status.as_str(),
                upstream: None,
                member: Some(member),
            },
        };
        h.cache(&cache).via(via.as_deref(), head.http10);
        h.end(close_after);
        (close_after, to_client_chunked)
    }
}

/// What relaying a streamed body needs of the response.
struct Streamed {
    framing: BodyFraming,
    /// The body goes to the client chunked.
    chunked: bool,
    /// The upstream connection may go back to the pool once the body is read.
    reuse: bool,
    /// Bytes of heads sent before the body (interim ones included).
    head_bytes: u64,
}
