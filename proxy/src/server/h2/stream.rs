//! One HTTP/2 stream: its request head converted field by field (`request::to_request`), served
//! by the request path every request takes (`conn::serve_stream`), and the response read back off
//! the channel into HEADERS and DATA frames.
//!
//! Two things run at once: the request path, which reads the request's DATA from the stream as
//! it needs them (flow control released only as it takes them, so a slow origin slows the
//! client rather than filling memory), and the download (heads and body off the channel, sent as
//! the client's window allows). Every wait is bounded: the request path's own timeouts,
//! `send_timeout` for the client's window, and a client's RST_STREAM ends the stream at once.

use super::request::{self, Refusal};
use crate::http::head::{Framing as HeadFraming, H2Head};
use crate::net::client_sock::ClientSock;
use crate::net::h2_stream::{H2Out, H2StreamSock};
use crate::server::Shared;
use crate::server::conn;
use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::sync::mpsc::Receiver;
use zerocache_ledger::ConnId;

/// DATA payload per frame: a frame's 9-byte header and this fill one 16 KiB TLS record exactly.
/// A full 16,384-byte payload (the peer's default SETTINGS_MAX_FRAME_SIZE) would make every
/// frame two records, the second of 9 bytes: twice the records, seals and writes.
const FRAME_PAYLOAD: usize = 16_384 - 9;

/// What the request path may send before the head is on its way: a head and the start of a
/// small body (a 1 KiB hit goes out whole). A stream whose client never opens its window holds
/// this much of its body at most; the rest waits in the file.
const HEAD_CREDIT: usize = 4 * 1024;

/// The most a stream is let read ahead at once, once its window is open: a chunk of a file.
const BODY_CREDIT: usize = 64 * 1024;

/// A connection's budget of response bytes read for its streams and not yet written to its
/// socket (in KiB, the budget's unit): 2 MiB, 32 streams' full chunks at once. With the output
/// buffer's 64 KiB and what each stream keeps of its own (about 16 KiB: its request path's
/// buffers and tasks), it bounds what one client can make the proxy hold, and
/// `limits.max_connections` times it what all can.
pub(crate) const CONNECTION_BUDGET_KIB: usize = 2048;

/// What a stream's task keeps of its connection.
pub(crate) struct Connection {
    pub shared: Arc<Shared>,
    pub peer: SocketAddr,
    pub id: ConnId,
    pub tls: bool,
    pub served: Option<crate::tls::server::Served>,
    /// Streams the client reset, for the connection's rapid-reset guard.
    pub resets: AtomicU64,
    /// Response bytes its streams may hold ([`CONNECTION_BUDGET_KIB`]).
    pub budget: Arc<tokio::sync::Semaphore>,
}

/// How a stream's response ended on the client's side.
enum End {
    /// Whole.
    Done,
    /// The client reset the stream.
    Reset,
    /// The connection went (closed, or ended by an error): nothing more to send.
    Gone,
    /// The client's window stayed shut for `send_timeout`.
    Stalled,
    /// The response from the request path was cut or could not be carried: the stream is reset.
    Broken(String),
}

/// Serves one stream to its end.
pub(crate) async fn run(
    req: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    c: Arc<Connection>,
) {
    let ctx = c.shared.ctx.load_full();
    let acc = ctx.accounting.clone();
    let (parts, mut body) = req.into_parts();
    let send_timeout = ctx.client.send_timeout;
    let read_timeout = ctx.client.read_timeout;
    let limits = ctx.client.limits;
    drop(ctx);
    let Some((ended, first)) = first_data(&parts, &mut body, read_timeout).await else {
        respond.send_reset(Reason::CANCEL);
        return;
    };
    let head = match request::to_request(&parts, ended, limits) {
        Ok(head) => Ok(head),
        // Answered by the request path, with its access-log line, as an HTTP/1.1 client's.
        Err(Refusal::Invalid(e)) => Err(e),
        Err(refusal) => {
            acc.h2_event(match refusal {
                Refusal::Malformed(_) => "malformed",
                _ => "refused",
            });
            refuse(&mut respond, refusal, &c);
            return;
        }
    };
    let head_request = parts.method == http::Method::HEAD;
    // One chunk in flight: the request path waits for the client's window, as it would on a
    // socket, and a stream holds at most a chunk and what h2 queues (64 KiB) of its response.
    let (out, mut rx) = tokio::sync::mpsc::channel::<H2Out>(1);
    let credit = Arc::new(tokio::sync::Semaphore::new(HEAD_CREDIT));
    let sock = ClientSock::H2Stream(Box::new(H2StreamSock {
        body: (!ended).then_some(body),
        pending: first.unwrap_or_default(),
        out: tokio_util::sync::PollSender::new(out),
        tls: c.tls,
        served: c.served.clone(),
        credit: credit.clone(),
        budget: c.budget.clone(),
    }));
    // Boxed: inline, the request path's future (7,504 bytes when measured; 2,352 since) made
    // this one 25,184 bytes, memcpy'd whole on every move of a stream's task (7% of the proxy's
    // CPU on 1 KiB hits). Boxed, it is copied once, into its box.
    let served = Box::pin(conn::serve_stream(
        sock,
        head,
        c.peer,
        c.shared.clone(),
        c.id,
    ));
    // The request path reads the body from the stream itself, within its own timeouts: a body
    // the client resets, or one the `h2` crate refuses (more DATA than its content-length), is
    // an error of its next read and ends the request at once.
    let work = async move { served.await.is_ok() };
    let mut work = std::pin::pin!(work);
    let mut served = None;
    let end = {
        let download = download(&mut rx, &credit, &mut respond, head_request, send_timeout);
        let mut download = std::pin::pin!(download);
        loop {
            tokio::select! {
                r = &mut work, if served.is_none() => served = Some(r),
                end = &mut download => break end,
            }
        }
    };
    // A stream the client reset can look cut from the request path first (its body read
    // failed): the reset is what happened, and it counts towards the rapid-reset guard.
    let end = match end {
        End::Broken(why) => match poll_fn(|cx| Poll::Ready(respond.poll_reset(cx))).await {
            Poll::Ready(Ok(_)) => End::Reset,
            Poll::Ready(Err(_)) => End::Gone,
            Poll::Pending => End::Broken(why),
        },
        other => other,
    };
    match end {
        End::Gone => {}
        End::Done => {
            // The request path records the response after its last byte: let it finish. What it
            // still sends is dropped (a generated body after a HEAD's head, which the stream
            // ended with the head): with nothing reading, it would wait out `send_timeout`.
            if served.is_none() {
                let drain = async {
                    while rx.recv().await.is_some() {
                        top_up(&credit, BODY_CREDIT);
                    }
                    std::future::pending::<()>().await
                };
                let finish = async {
                    tokio::select! {
                        _ = &mut work => {}
                        _ = drain => {}
                    }
                };
                let _ = tokio::time::timeout(send_timeout, finish).await;
            }
        }
        End::Reset => {
            let n = c.resets.fetch_add(1, Ordering::Relaxed);
            acc.h2_event("client-resets");
            tracing::trace!(conn = c.id, resets = n + 1, "h2 stream reset by the client");
        }
        End::Stalled => {
            acc.h2_event("send-timeouts");
            tracing::debug!(conn = c.id, peer = %c.peer, "h2 stream: client took nothing within send_timeout; reset");
        }
        End::Broken(why) => {
            // Whether or not a head went out: the stream must not end as if whole.
            respond.send_reset(Reason::INTERNAL_ERROR);
            tracing::debug!(conn = c.id, peer = %c.peer, why, "h2 stream reset");
        }
    }
}

/// What a stream's `poll_reset` said: the client's RST_STREAM, or the connection gone.
fn reset_or_gone(r: Result<Reason, h2::Error>) -> End {
    match r {
        Ok(_) => End::Reset,
        Err(_) => End::Gone,
    }
}

/// Whether the request has a body (`ended` false), and its first DATA if it was waited for. A
/// HEADERS frame without END_STREAM may still carry no body (a GET whose END_STREAM comes on an
/// empty DATA frame, as some clients send it): without a `content-length` the first DATA is
/// waited for (within `read_timeout`), so such a request is the bodiless one it is, planned and
/// cached as over HTTP/1.1 rather than relayed as one with a body. Not with
/// `expect: 100-continue`, whose client waits for the 100 before sending. None: the client
/// reset the stream, or sent nothing in time.
async fn first_data(
    parts: &http::request::Parts,
    body: &mut RecvStream,
    read_timeout: Duration,
) -> Option<(bool, Option<Bytes>)> {
    if body.is_end_stream()
        || parts.headers.contains_key(http::header::CONTENT_LENGTH)
        || parts.headers.contains_key(http::header::EXPECT)
    {
        return Some((body.is_end_stream(), None));
    }
    loop {
        match tokio::time::timeout(read_timeout, body.data()).await {
            Ok(None) => return Some((true, None)),
            Ok(Some(Ok(c))) if c.is_empty() => {}
            Ok(Some(Ok(c))) => return Some((false, Some(c))),
            Ok(Some(Err(_))) | Err(_) => return None,
        }
    }
}

/// Answers a stream refused before anything went upstream: a reset for a malformed one (RFC
/// 9113 §8.1.1), a short response otherwise.
fn refuse(respond: &mut SendResponse<Bytes>, refusal: Refusal, c: &Connection) {
    match refusal {
        Refusal::Malformed(why) => {
            tracing::debug!(conn = c.id, peer = %c.peer, why, "h2 stream malformed; reset");
            respond.send_reset(Reason::PROTOCOL_ERROR);
        }
        Refusal::Status(status, why) => {
            tracing::debug!(conn = c.id, peer = %c.peer, why, status, "h2 stream refused");
            answer(respond, status);
        }
        Refusal::Invalid(e) => {
            tracing::debug!(conn = c.id, peer = %c.peer, error = %e, "h2 stream refused");
            answer(respond, e.status().0);
        }
    }
}

/// A short response with `status`, the stream's last.
fn answer(respond: &mut SendResponse<Bytes>, status: u16) {
    if let Ok(mut s) = respond.send_response(request::refusal_response(status), false) {
        let _ = s.send_data(request::refusal_body(status), true);
    }
}

/// How the body after a final head ends on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body: HEAD, 204, 304.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// At the request path's [`H2Out::End`]: its head said no length.
    Open,
}

/// Reads the response off the channel and sends it: interim heads as informational HEADERS, the
/// final head, then the body as DATA frames until it ends.
async fn download(
    rx: &mut Receiver<H2Out>,
    credit: &Semaphore,
    respond: &mut SendResponse<Bytes>,
    head_request: bool,
    send_timeout: Duration,
) -> End {
    let head = loop {
        top_up(credit, HEAD_CREDIT);
        let next = tokio::select! {
            r = rx.recv() => r,
            r = poll_fn(|cx| respond.poll_reset(cx)) => return reset_or_gone(r),
        };
        match next {
            Some(H2Out::Head(h)) if h.status == 101 => {
                return End::Broken("101 on an h2 stream".into());
            }
            Some(H2Out::Head(h)) if h.status < 200 => {
                if let Ok(interim) = to_response(*h) {
                    let _ = respond.send_informational(interim);
                }
            }
            Some(H2Out::Head(h)) => break h,
            Some(_) => return End::Broken("a body before its head".into()),
            None => return End::Broken("no response from the request path".into()),
        }
    };
    let framing = if head_request || matches!(head.status, 204 | 304) {
        Framing::None
    } else {
        match head.framing {
            HeadFraming::Length(n) => Framing::Length(n),
            HeadFraming::Chunked => Framing::Open,
            // The request path never writes a close-delimited body to a request it did not
            // read as HTTP/1.0.
            HeadFraming::None => {
                respond.send_reset(Reason::INTERNAL_ERROR);
                return End::Broken("a close-delimited response".into());
            }
        }
    };
    let res = match to_response(*head) {
        Ok(r) => r,
        Err(e) => {
            respond.send_reset(Reason::INTERNAL_ERROR);
            return End::Broken(e);
        }
    };
    let empty = framing == Framing::None || framing == Framing::Length(0);
    let mut send = match respond.send_response(res, empty) {
        Ok(s) => s,
        Err(_) => return End::Reset,
    };
    if empty {
        return End::Done;
    }
    let end = body(rx, credit, &mut send, framing, send_timeout).await;
    if !matches!(end, End::Done | End::Reset | End::Gone) {
        send.send_reset(match end {
            End::Stalled => Reason::CANCEL,
            _ => Reason::INTERNAL_ERROR,
        });
    }
    end
}

/// The HEADERS of a head the request path wrote, or why it cannot be sent.
fn to_response(h: H2Head) -> Result<http::Response<()>, String> {
    if let Some(why) = h.invalid {
        return Err(why);
    }
    let mut r = http::Response::new(());
    *r.status_mut() = http::StatusCode::from_u16(h.status).map_err(|e| e.to_string())?;
    *r.headers_mut() = h.fields;
    Ok(r)
}

/// Sends the body that follows the head, each chunk the payload of its DATA frames, until its
/// length is reached or the request path says it ended.
async fn body(
    rx: &mut Receiver<H2Out>,
    credit: &Semaphore,
    send: &mut SendStream<Bytes>,
    framing: Framing,
    send_timeout: Duration,
) -> End {
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    // Whether the client took the last piece without the stream waiting for window.
    let mut flowing = false;
    loop {
        // The next chunk may be a file's chunk while the client takes what it is sent, a
        // head's worth while its window is shut: what a stalled stream holds stays small, and
        // a stream reserves none of the connection's window while it waits for its request
        // path (a slow origin must not starve its siblings).
        top_up(credit, if flowing { BODY_CREDIT } else { HEAD_CREDIT });
        let next = tokio::select! {
            r = rx.recv() => r,
            r = poll_fn(|cx| send.poll_reset(cx)) => return reset_or_gone(r),
        };
        let (piece, last) = match next {
            Some(H2Out::Data(mut chunk)) => {
                if framing == Framing::Open {
                    (chunk, false)
                } else {
                    let take = (chunk.len() as u64).min(left) as usize;
                    left -= take as u64;
                    (chunk.split_to(take), left == 0)
                }
            }
            Some(H2Out::End) if framing == Framing::Open => (Bytes::new(), true),
            Some(H2Out::End) | None => {
                return End::Broken("response cut short by the request path".into());
            }
            Some(H2Out::Head(_)) => return End::Broken("a second head".into()),
        };
        if !piece.is_empty() || last {
            match send_data(send, piece, last, send_timeout, &mut flowing).await {
                End::Done if last => return End::Done,
                End::Done => {}
                other => return other,
            }
        }
    }
}

/// Sends `data` as the client's window allows, ending the stream with it when `last`; the window
/// must open within `send_timeout` each time it is waited for. `flowing` says afterwards whether
/// it went out without a wait for window.
async fn send_data(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
    last: bool,
    send_timeout: Duration,
    flowing: &mut bool,
) -> End {
    *flowing = true;
    if data.is_empty() {
        return match send.send_data(data, last) {
            Ok(()) => End::Done,
            Err(_) => End::Reset,
        };
    }
    while !data.is_empty() {
        let granted = match window(send, data.len(), send_timeout, flowing).await {
            Ok(n) => n,
            Err(end) => return end,
        };
        let piece = data.split_to(granted.min(data.len()).min(FRAME_PAYLOAD));
        let end = last && data.is_empty();
        if send.send_data(piece, end).is_err() {
            return End::Reset;
        }
    }
    End::Done
}

/// Waits for room in the stream's send window for up to `want` bytes, which must open within
/// `send_timeout`: how much there is (at least 1), or how the stream ended meanwhile. A wait
/// clears `flowing`.
async fn window(
    send: &mut SendStream<Bytes>,
    want: usize,
    send_timeout: Duration,
    flowing: &mut bool,
) -> Result<usize, End> {
    loop {
        send.reserve_capacity(want);
        // Capacity already assigned is used first: poll_capacity wakes only when it grows.
        let granted = send.capacity();
        if granted > 0 {
            return Ok(granted);
        }
        *flowing = false;
        let wait = poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            send.poll_capacity(cx)
        });
        match tokio::time::timeout(send_timeout, wait).await {
            Err(_) => return Err(End::Stalled),
            Ok(None) | Ok(Some(Err(_))) => return Err(End::Reset),
            Ok(Some(Ok(0))) => {}
            Ok(Some(Ok(n))) => return Ok(n),
        }
    }
}

/// Lets the request path read ahead up to `to` bytes in all (what it was given and has not
/// used counts).
fn top_up(credit: &Semaphore, to: usize) {
    let have = credit.available_permits();
    if have < to {
        credit.add_permits(to - have);
    }
}
