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
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use zerocache_ledger::ConnId;

/// The pipe's buffer each way: what one stream may hold between the request path and the
/// client's window (with 128 streams, 8 MiB per connection at most).
const PIPE: usize = 64 * 1024;

/// Largest response head read off the pipe (the request path's heads are far smaller).
const MAX_HEAD: usize = 256 * 1024;

/// What a stream's task keeps of its connection.
pub(crate) struct Connection {
    pub shared: Arc<Shared>,
    pub peer: SocketAddr,
    pub id: ConnId,
    pub tls: bool,
    pub served: Option<crate::tls::server::Served>,
    /// Streams the client reset, for the connection's rapid-reset guard.
    pub resets: AtomicU64,
}

/// How a stream's response ended on the client's side.
enum End {
    /// Whole.
    Done,
    /// The client reset the stream.
    Reset,
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
    let (head, mode) = match request::to_h1(&parts, body.is_end_stream()) {
        Ok(t) => t,
        Err(refusal) => {
            acc.h2_event("malformed");
            refuse(&mut respond, refusal, &c);
            return;
        }
    };
    let head_request = parts.method == http::Method::HEAD;
    let send_timeout = ctx.client.send_timeout;
    let read_timeout = ctx.client.read_timeout;
    drop(ctx);
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let sock = ClientSock::H2Stream(Box::new(H2StreamSock {
        io: theirs,
        tls: c.tls,
        served: c.served.clone(),
    }));
    let (mut rd, wr) = tokio::io::split(ours);
    let served = conn::serve_stream(sock, c.peer, c.shared.clone(), c.id);
    let upload = upload(wr, head, mode, &mut body, read_timeout);
    // The request path's result, or the upload's failure: a body the client reset, or one the
    // `h2` crate refused (more DATA than its content-length), ends the request at once rather
    // than leaving the request path waiting for the rest until read_timeout.
    let work = async {
        let mut served = std::pin::pin!(served);
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
        let download = download(&mut rd, &mut respond, head_request, send_timeout);
        let mut download = std::pin::pin!(download);
        loop {
            tokio::select! {
                r = &mut work, if served.is_none() => served = Some(r),
                end = &mut download => break end,
            }
        }
    };
    match end {
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
    body: &mut RecvStream,
    read_timeout: Duration,
) -> std::io::Result<()> {
    wr.write_all(&head).await?;
    if mode != BodyMode::None {
        loop {
            let next = tokio::time::timeout(read_timeout, body.data())
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?;
            let chunk = match next {
                Some(Ok(c)) => c,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => break,
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
async fn download<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    respond: &mut SendResponse<Bytes>,
    head_request: bool,
    send_timeout: Duration,
) -> End {
    let mut buf = BytesMut::with_capacity(16 * 1024);
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
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => return End::Broken("no response on the pipe".into()),
                Ok(_) => {}
            },
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return End::Reset,
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
    let end = body(rd, &mut buf, &mut send, framing, send_timeout).await;
    if !matches!(end, End::Done | End::Reset) {
        send.send_reset(match end {
            End::Stalled => Reason::CANCEL,
            _ => Reason::INTERNAL_ERROR,
        });
    }
    end
}

/// Sends the body that follows the head on the pipe (`buf` holds what was read past the head).
async fn body<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
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
    loop {
        // What of `buf` is body, and whether it is the last of it.
        let (piece, last) = match framing {
            Framing::Length(_) => {
                let take = (buf.len() as u64).min(left) as usize;
                left -= take as u64;
                (buf.split_to(take).freeze(), left == 0)
            }
            Framing::Chunked => {
                decoded.clear();
                match decoder.decode(buf, &mut decoded) {
                    Ok(done) => (Bytes::copy_from_slice(&decoded), done),
                    Err(e) => return End::Broken(e.to_string()),
                }
            }
            Framing::None => (Bytes::new(), true),
        };
        if !piece.is_empty() || last {
            match send_data(send, piece, last, send_timeout).await {
                End::Done if last => return End::Done,
                End::Done => {}
                other => return other,
            }
        }
        if buf.capacity() - buf.len() < 8 * 1024 {
            buf.reserve(32 * 1024);
        }
        tokio::select! {
            r = rd.read_buf(buf) => match r {
                Ok(0) | Err(_) => return End::Broken("response cut on the pipe".into()),
                Ok(_) => {}
            },
            _ = poll_fn(|cx| send.poll_reset(cx)) => return End::Reset,
        }
    }
}

/// Sends `data` as the client's window allows, ending the stream with it when `last`; the window
/// must open within `send_timeout` each time it is waited for.
async fn send_data(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
    last: bool,
    send_timeout: Duration,
) -> End {
    if data.is_empty() {
        return match send.send_data(data, last) {
            Ok(()) => End::Done,
            Err(_) => End::Reset,
        };
    }
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let wait = poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            send.poll_capacity(cx)
        });
        let granted = match tokio::time::timeout(send_timeout, wait).await {
            Err(_) => return End::Stalled,
            Ok(None) | Ok(Some(Err(_))) => return End::Reset,
            Ok(Some(Ok(n))) => n,
        };
        if granted == 0 {
            continue;
        }
        let piece = data.split_to(granted.min(data.len()));
        let end = last && data.is_empty();
        if send.send_data(piece, end).is_err() {
            return End::Reset;
        }
    }
    End::Done
}
