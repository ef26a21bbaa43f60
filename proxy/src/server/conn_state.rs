//! A client connection's state: its socket, what was read of it and not yet used, the head
//! buffer its answers are composed in, and the current request's part of the record. Its own
//! file so that the loop (`conn.rs`), which hands each request to an `Exchange`, sits above the
//! request path, and the state, its responder (`respond.rs`) and body reader (`upload.rs`) below.

use super::{Ctx, Shared};
use crate::http::head::HeadBuf;
use crate::net::client_sock::ClientSock;
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use zerocache_ledger::ConnId;

/// A client connection's state. Its fields are `server/`'s alone: an `Exchange` borrows the
/// connection for one request, and nothing outside `server/` reaches into one.
pub struct Conn {
    /// The socket, plain or TLS.
    pub(super) sock: ClientSock,
    /// Client address.
    pub(super) peer: SocketAddr,
    /// Accounting id.
    pub(super) id: ConnId,
    /// Bytes read and not yet consumed (pipelined requests wait here).
    pub(super) buf: BytesMut,
    /// Reused buffer for response heads, in the connection's protocol.
    pub(super) head: HeadBuf,
    /// The context current when this request started.
    pub(super) ctx: Arc<Ctx>,
    /// What outlives reloads: the current context and the shutdown signal.
    pub(super) shared: Arc<Shared>,
    /// Close after the current response: the request's body was not read to its end, so the
    /// next bytes on the connection are no request.
    pub(super) must_close: bool,
    /// The current request's part of its access log line (left empty without an access log).
    pub(super) log_info: crate::accesslog::RequestInfo,
    /// The current request is a fleet peer's (its responses are counted as such).
    pub(super) from_peer: bool,
    /// The current request body's pace: when its reading started and the bytes received since,
    /// for `limits.body_min_rate` (see `upload`).
    pub(super) body_pace: Option<(tokio::time::Instant, u64)>,
    /// An HTTP/2 stream's request, admitted with an access log and not yet answered: logged as
    /// abandoned if the stream is dropped first (see [`Unanswered`]).
    pub(super) unanswered: Option<Box<Unanswered>>,
    /// The current request's response was recorded (and logged).
    pub(super) recorded: std::sync::atomic::AtomicBool,
}

/// A request whose stream its client reset or whose connection went before it was answered.
/// An HTTP/1.1 client that leaves is noticed when the response is written, and its line says
/// `aborted`; an h2 stream's request path is dropped at the reset (it must stop its work at
/// once, or rapid reset is an amplifier), so its line is written here, as nginx writes 499.
pub(super) struct Unanswered {
    pub method: String,
    pub target: String,
    pub started: Instant,
}
