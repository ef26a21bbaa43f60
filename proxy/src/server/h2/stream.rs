//! One HTTP/2 stream: its request translated onto an in-process pipe, served by the HTTP/1.1
//! request path (`conn::serve_stream`, the same code as every other request), and the response
//! read back off the pipe into HEADERS and DATA frames.
//!
//! Three things run at once: the request path, the upload (the head, then DATA frames onto the
//! pipe, flow control released only as the pipe takes them, so a slow origin slows the client
//! rather than filling memory) and the download (heads and body off the pipe, sent as the client's
//! window allows). Every wait is bounded: the request path's own timeouts, `send_timeout` for the
//! client's window, and a client's RST_STREAM ends the stream at once.

use super::request::{self, BodyMode, Refusal};
use super::response::{self, Framing};
use crate::http::chunked::ChunkedDecoder;
use crate::net::client_sock::{ClientSock, H2StreamSock};
use crate::server::Shared;
use crate::server::conn;
use bytes::{Buf, Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::Receiver;
use zerocache_ledger::ConnId;

/// The request pipe's buffer: what one stream's upload may hold between the client's DATA frames
/// and the request path (with 128 streams, 8 MiB per connection at most).
const PIPE: usize = 64 * 1024;

/// DATA payload per frame: a frame's 9-byte header and this fill one 16 KiB TLS record exactly.
/// A full 16,384-byte payload (the peer's default SETTINGS_MAX_FRAME_SIZE) would make every
/// frame two records, the second of 9 bytes: twice the records, seals and writes.
const FRAME_PAYLOAD: usize = 16_384 - 9;

/// Largest response head read off the pipe (the request path's heads are far smaller).
const MAX_HEAD: usize = 256 * 1024;

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
    /// The response on the pipe was cut or could not be carried: the stream is reset.
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
    drop(ctx);
    let Some((ended, first)) = first_data(&parts, &mut body, read_timeout).await else {
        respond.send_reset(Reason::CANCEL);
        return;
    };
    let (head, mode) = match request::to_h1(&parts, ended) {
        Ok(t) => t,
        Err(refusal) => {
            acc.h2_event(match refusal {
                Refusal::Malformed(_) => "malformed",
                Refusal::Status(..) => "refused",
            });
            refuse(&mut respond, refusal, &c);
            return;
        }
    };
    let head_request = parts.method == http::Method::HEAD;
    let (ours, theirs) = tokio::io::duplex(PIPE);
    // One chunk in flight: the request path waits for the client's window, as it would on a
    // socket, and a stream holds at most a chunk and what h2 queues (64 KiB) of its response.
    let (out, mut rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let credit = Arc::new(tokio::sync::Semaphore::new(HEAD_CREDIT));
    let sock = ClientSock::H2Stream(Box::new(H2StreamSock {
        io: theirs,
        out: tokio_util::sync::PollSender::new(out),
        tls: c.tls,
        served: c.served.clone(),
        credit: credit.clone(),
        budget: c.budget.clone(),
    }));
    let wr = ours;
    // Boxed: inline, the request path's future (7,504 bytes when measured; 2,352 since) made
    // this one 25,184 bytes, memcpy'd whole on every move of a stream's task (7% of the proxy's
    // CPU on 1 KiB hits). Boxed, it is copied once, into its box.
    let served = Box::pin(conn::serve_stream(sock, c.peer, c.shared.clone(), c.id));
    let upload = upload(wr, head, mode, first, &mut body, read_timeout);
    // The request path's result, or the upload's failure: a body the client reset, or one the
    // `h2` crate refused (more DATA than its content-length), ends the request at once rather
    // than leaving the request path waiting for the rest until read_timeout.
    let work = async {
        let mut served = served;
        let mut upload = std::pin::pin!(upload);
        let mut uploaded = false;
        loop {
            tokio::select! {
                r = &mut served => return r.is_ok(),
                r = &mut upload, if !uploaded => match r {
                    Ok(()) => uploaded = true,
                    Err(_) => return false,
                },
            }
        }
    };
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
    // A stream the client reset can look cut on the pipe first (its upload failed): the reset
    // is what happened, and it counts towards the rapid-reset guard.
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
            // The request path records the response after its last byte: let it finish.
            if served.is_none() {
                let _ = tokio::time::timeout(send_timeout, &mut work).await;
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
            if let Ok(mut s) = respond.send_response(request::refusal_response(status), false) {
                let _ = s.send_data(request::refusal_body(status), true);
            }
        }
    }
}

/// Writes the translated head, then the body's DATA frames (chunked when the client sent no
/// length), then ends the pipe's request side: the stream's one request. Window is given back
/// to the client only as the pipe takes its bytes.
async fn upload<W: AsyncWrite + Unpin>(
    mut wr: W,
    head: Vec<u8>,
    mode: BodyMode,
    mut first: Option<Bytes>,
    body: &mut RecvStream,
    read_timeout: Duration,
) -> std::io::Result<()> {
    wr.write_all(&head).await?;
    if mode != BodyMode::None {
        loop {
            let chunk = match first.take() {
                Some(c) => c,
                None => {
                    let next = tokio::time::timeout(read_timeout, body.data())
                        .await
                        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?;
                    match next {
                        Some(Ok(c)) => c,
                        Some(Err(e)) => return Err(std::io::Error::other(e)),
                        None => break,
                    }
                }
            };
            let n = chunk.len();
            if mode == BodyMode::Chunked && n > 0 {
                wr.write_all(format!("{n:x}\r\n").as_bytes()).await?;
                wr.write_all(&chunk).await?;
                wr.write_all(b"\r\n").await?;
            } else {
                wr.write_all(&chunk).await?;
            }
            let _ = body.flow_control().release_capacity(n);
        }
        if mode == BodyMode::Chunked {
            wr.write_all(b"0\r\n\r\n").await?;
        }
    }
    wr.shutdown().await
}

/// Reads the response off the pipe and sends it: interim heads as informational HEADERS, the
/// final head, then the body as DATA frames until its framing says it ended.
async fn download(
    rx: &mut Receiver<Bytes>,
    credit: &Semaphore,
    respond: &mut SendResponse<Bytes>,
    head_request: bool,
    send_timeout: Duration,
) -> End {
    let mut buf = BytesMut::new();
    let head = loop {
        match crate::http::response::parse(&buf) {
            Ok(Some((head, n))) => {
                buf.advance(n);
                if head.status >= 200 {
                    break head;
                }
                if head.status == 101 {
                    return End::Broken("101 on an h2 stream".into());
                }
                if let Ok((interim, _)) = response::to_h2(&head, true) {
                    let _ = respond.send_informational(interim);
                }
                continue;
            }
            Ok(None) if buf.len() > MAX_HEAD => {
                return End::Broken("response head too large".into());
            }
            Ok(None) => {}
            Err(e) => return End::Broken(e),
        }
        top_up(credit, HEAD_CREDIT);
        tokio::select! {
            r = rx.recv() => match r {
                Some(chunk) => buf.extend_from_slice(&chunk),
                None => return End::Broken("no response from the request path".into()),
            },
            r = poll_fn(|cx| respond.poll_reset(cx)) => return reset_or_gone(r),
        }
    };
    let (res, framing) = match response::to_h2(&head, head_request) {
        Ok(t) => t,
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
    let end = body(rx, credit, buf, &mut send, framing, send_timeout).await;
    if !matches!(end, End::Done | End::Reset | End::Gone) {
        send.send_reset(match end {
            End::Stalled => Reason::CANCEL,
            _ => Reason::INTERNAL_ERROR,
        });
    }
    end
}

/// Sends the body that follows the head (`buf` holds what came with it). A sized body's chunks
/// go out as they came, each the payload of its DATA frames; a chunked one is decoded.
async fn body(
    rx: &mut Receiver<Bytes>,
    credit: &Semaphore,
    mut buf: BytesMut,
    send: &mut SendStream<Bytes>,
    framing: Framing,
    send_timeout: Duration,
) -> End {
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    let mut decoder = ChunkedDecoder::default();
    let mut decoded = Vec::new();
    let mut next = Some(buf.split().freeze());
    // Whether the client took the last piece without the stream waiting for window.
    let mut flowing = false;
    loop {
        let chunk = match next.take() {
            Some(c) => c,
            None => {
                // The next chunk may be a file's chunk while the client takes what it is sent,
                // a head's worth while its window is shut: what a stalled stream holds stays
                // small, and a stream reserves none of the connection's window while it waits
                // for its request path (a slow origin must not starve its siblings).
                top_up(credit, if flowing { BODY_CREDIT } else { HEAD_CREDIT });
                tokio::select! {
                    r = rx.recv() => match r {
                        Some(c) => c,
                        None => return End::Broken("response cut short by the request path".into()),
                    },
                    r = poll_fn(|cx| send.poll_reset(cx)) => return reset_or_gone(r),
                }
            }
        };
        // What of this chunk is body, and whether it is the last of it.
        let (piece, last) = match framing {
            Framing::Length(_) => {
                let mut chunk = chunk;
                let take = (chunk.len() as u64).min(left) as usize;
                left -= take as u64;
                (chunk.split_to(take), left == 0)
            }
            Framing::Chunked => {
                buf.extend_from_slice(&chunk);
                decoded.clear();
                match decoder.decode(&mut buf, &mut decoded) {
                    Ok(done) => (Bytes::copy_from_slice(&decoded), done),
                    Err(e) => return End::Broken(e.to_string()),
                }
            }
            Framing::None => (Bytes::new(), true),
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
