//! Streaming pieces of a fetch: a request body too large to hold sent as it arrives, the
//! background fill after a Range miss, and the pump that writes a stored body to its cache file.

use crate::cache::fill::Fill;
use crate::cache::freshness::Heuristics;
use crate::cache::growing::Writer;
use crate::cache::lock::{LeaderGuard, Role};
use crate::http::headers;
use crate::http::response::BodyFraming;
use crate::http::response::ResponseHead;
use crate::server::request_body::{BUFFERED_MAX, BodySource, Remaining};
use crate::upstream::body::BodyReader;
use crate::upstream::{Group, UpstreamConn, UpstreamError};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use super::{Fetch, RangeFill, StreamError};

impl Fetch<'_> {
    /// Sends a request whose body is too large to hold: the head, then the body as it arrives from
    /// the client (re-framed as it came: Content-Length or chunked), then reads the response head.
    /// Always on a fresh connection: a pooled one that turned out dead could not be retried, the
    /// body being gone. An origin that answers before the whole body is sent (a 413, say) has its
    /// answer relayed; that connection is never pooled and the client's is closed afterwards,
    /// since neither side's framing can be trusted any more.
    pub(super) async fn exchange_streaming(
        &mut self,
        client: &mut impl BodySource,
        head: &[u8],
        first: Vec<u8>,
        mut rest: Remaining,
        interim: &mut Vec<ResponseHead>,
    ) -> Result<(UpstreamConn, ResponseHead), StreamError> {
        let key = self.balance_key().into_owned();
        let mut up = self.upstream.connect_fresh(&key).await?;
        // A body of unknown length (chunked, or an HTTP/2 stream's) goes chunked.
        let chunked = !matches!(rest, Remaining::Length { .. });
        up.stream
            .send_all(head)
            .await
            .map_err(UpstreamError::from)?;
        let mut piece = first;
        let mut framed = Vec::with_capacity(BUFFERED_MAX + 32);
        let mut done = false;
        loop {
            framed.clear();
            if chunked && !piece.is_empty() {
                framed.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                framed.extend_from_slice(&piece);
                framed.extend_from_slice(b"\r\n");
            } else if !chunked {
                framed.extend_from_slice(&piece);
            }
            if done && chunked {
                framed.extend_from_slice(b"0\r\n\r\n");
            }
            // An origin that has answered already is not reading: stop sending, read its answer.
            let answered = matches!(up.stream.try_read_buf(&mut up.buf), Ok(n) if n > 0);
            if answered || up.stream.send_all(&framed).await.is_err() {
                self.body_unfinished = !done;
                self.no_pool = true;
                break;
            }
            if done {
                break;
            }
            piece.clear();
            done = client
                .body_piece(&mut rest, &mut piece)
                .await
                .map_err(StreamError::Body)?;
        }
        self.body_read = !self.body_unfinished;
        let head = self
            .upstream
            .response_head(&mut up, interim, !self.body_unfinished)
            .await?;
        Ok((up, head))
    }

    /// Starts the background fill of the whole object after a Range miss, unless a fill of it is
    /// under way already.
    pub(super) fn spawn_range_fill(
        &self,
        ctx: &Arc<crate::server::Ctx>,
        r: RangeFill,
        peer: IpAddr,
    ) {
        let Role::Leader(guard) = ctx.locks.acquire(r.primary.hash) else {
            return;
        };
        let mut whole = self.req.clone();
        whole
            .fields
            .retain(|(k, _)| !headers::is_range_or_condition(k));
        let bg = Fetch::background(
            whole,
            self.upstream.clone(),
            r.primary,
            r.url,
            None,
            r.ttls,
            guard,
        )
        .store_set_cookie(self.store_set_cookie)
        .object_sizes(self.object_sizes);
        tokio::spawn(bg.refresh(ctx.clone(), peer));
    }

    pub(super) fn heuristics(&self, ctx: &crate::server::Ctx) -> Heuristics<'_> {
        self.ttls.heuristics(ctx.storing.heuristic_max)
    }
}

/// Pumps an upstream body into the cache file at the origin's speed, publishing its progress to
/// the clients reading behind it, then commits the entry, returns the connection to the pool and
/// lets the followers go. `abandon`: a fill begun for clients stops once none has been reading for
/// `cache.abandoned_fill_timeout` or it passes `cache.abandoned_fill_max` bytes with none, so
/// connect-and-disconnect cannot make the origin stream huge objects for nobody. `primary`: the
/// request's primary key hash, under which a body of unknown length found too large is
/// remembered (`Store::oversized`; the fill's own hash is a variant's under `Vary`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn pump(
    ctx: Arc<crate::server::Ctx>,
    mut up: UpstreamConn,
    framing: BodyFraming,
    group: Arc<Group>,
    primary: u128,
    mut fill: Fill,
    mut w: Writer,
    guard: Option<LeaderGuard>,
    reusable: bool,
    abandon: bool,
) {
    let expected = framing.length();
    let mut reader = BodyReader::new(framing, group.read_timeout);
    let mut piece = Vec::with_capacity(64 * 1024);
    let mut alone_since: Option<Instant> = None;
    let mut past_max = false;
    while !reader.is_done() {
        if let Err(e) = reader.next(&mut up, &mut piece).await {
            tracing::warn!(upstream = %group.name, error = %e, received = fill.written(), "upstream body failed; nothing stored, its readers aborted");
            ctx.accounting.upstream_error(&group.name, e.kind());
            return; // Dropping the writer fails the readers; dropping the fill deletes its file.
        }
        // A full file system evicts room for the rest of the body (or this piece) and retries;
        // never for a body past what may be stored, which could only take the room of entries
        // that can be kept (its readers are aborted instead).
        let rest = expected.map_or(piece.len() as u64, |n| n.saturating_sub(fill.written()));
        let written = if past_max {
            fill.write(&piece)
        } else {
            ctx.store
                .on_full_disk_evict_and_retry(rest, || fill.write(&piece))
        };
        if let Err(e) = written {
            if !past_max {
                ctx.store.write_failed(&e);
            }
            return;
        }
        if reader.is_done() {
            break;
        }
        w.advance(fill.written());
        // Past the largest object stored (a body of unknown length): it will not be committed.
        // Its readers still get every byte through the file; with none left, it stops.
        if let Some(why) = fill.too_large() {
            if !past_max {
                past_max = true;
                if expected.is_none() {
                    // Its head said `stored`: the next request for the key will not.
                    ctx.store.oversized().note(primary);
                }
                tracing::debug!(
                    bytes = fill.written(),
                    "larger than may be stored; relayed, not stored"
                );
                ctx.accounting.not_stored(why);
            }
            if w.readers() == 0 {
                return;
            }
        }
        // Handing the cache over to a successor, a fill nobody reads could never be committed
        // (commits are refused) and would die with the process, its temp file left behind.
        if w.readers() == 0 && ctx.store.is_handing_over() {
            tracing::debug!(
                bytes = fill.written(),
                "fill without readers stopped for the hand-over"
            );
            return;
        }
        if abandon && w.readers() == 0 {
            let since = *alone_since.get_or_insert_with(Instant::now);
            if fill.written() > ctx.storing.abandoned_fill_max
                || since.elapsed() > ctx.storing.abandoned_fill_timeout
            {
                tracing::debug!(
                    bytes = fill.written(),
                    "fill abandoned by every client; stopped"
                );
                return;
            }
        } else {
            alone_since = None;
        }
    }
    let n = fill.written();
    if let Some(why) = fill.too_large().or(fill.too_small()) {
        // Its length was unknown (or its header tipped it over the cache's size): the readers
        // still get every byte from the open file, and dropping the fill deletes it.
        if !past_max {
            if expected.is_none() && fill.too_large().is_some() {
                ctx.store.oversized().note(primary);
            }
            tracing::debug!(bytes = n, why, "body outside the sizes stored; not stored");
            ctx.accounting.not_stored(why);
        }
        w.finish(n);
        if reusable && reader.reusable() {
            group.release(up);
        }
        return;
    }
    // Committed before the last bytes are published: a client that has read the whole MISS and
    // asks again gets a HIT. A commit that fails leaves every byte in the open file, so the
    // readers still finish.
    if let Err(e) = fill.commit() {
        if ctx.store.is_handing_over() {
            ctx.accounting.not_stored("upgrade");
        } else {
            ctx.store.write_failed(&e);
        }
    }
    w.finish(n);
    if reusable && reader.reusable() {
        group.release(up);
    }
    drop(guard);
}

/// Whether the upstream said this connection ends after the response (HTTP/1.0, or
/// `Connection: close`): it must not go back to the pool.
pub(super) fn upstream_closes(head: &ResponseHead) -> bool {
    head.http10
        || headers::connection_tokens(head.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
            .iter()
            .any(|t| t == "close")
}

/// Reads and discards a (304's) body, then returns the connection to the pool when its framing
/// and its `Connection` allow. The client fetch and the background refresh both end a 304 here,
/// so they cannot drift apart on when a connection is reused.
pub(super) async fn drain(
    mut up: UpstreamConn,
    head: &ResponseHead,
    framing: BodyFraming,
    group: &Group,
) {
    let mut reader = BodyReader::new(framing, group.read_timeout);
    let mut sink = Vec::new();
    while !reader.is_done() {
        if reader.next(&mut up, &mut sink).await.is_err() {
            return;
        }
    }
    if reader.reusable() && !upstream_closes(head) {
        group.release(up);
    }
}
