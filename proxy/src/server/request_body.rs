//! A request body as a fetch forwards it: whole when small, streamed when large, and what the
//! fetch reads the rest from ([`BodySource`], the client connection in `upload`). Types only: the
//! fetch sends a body without knowing the connection it comes from.

use super::conn_error::ConnError;
use crate::http::chunked::ChunkedDecoder;

/// Largest request body held in memory; larger ones are streamed.
pub const BUFFERED_MAX: usize = 64 * 1024;

/// A request body as a fetch forwards it.
pub enum RequestBody {
    /// Complete in memory (possibly empty).
    Whole(Vec<u8>),
    /// Too large to hold: `first` was read already, the rest comes from the client as it is sent.
    Streaming {
        /// Decoded body bytes read so far.
        first: Vec<u8>,
        /// What is left to read, and how it is framed.
        rest: Remaining,
    },
}

/// The unread part of a streamed body.
pub enum Remaining {
    /// This many bytes of a `Content-Length` body (its total is known).
    Length {
        /// Bytes still to read.
        left: u64,
        /// The whole body's length.
        total: u64,
    },
    /// The rest of a chunked body.
    Chunked {
        /// The decoder, mid-body.
        decoder: ChunkedDecoder,
        /// Decoded bytes so far, for `max_body_bytes`.
        seen: u64,
    },
    /// The rest of an HTTP/2 body that ends with its stream.
    EndStream {
        /// Bytes so far, for `max_body_bytes`.
        seen: u64,
    },
}

/// Why a request body could not be read; each ends the connection after its answer.
#[derive(Debug)]
pub enum BodyError {
    /// The client was slower than `limits.read_timeout` between reads: 408.
    Timeout,
    /// Malformed chunked framing: 400.
    Invalid,
    /// More than `limits.max_body_bytes`: 413.
    TooLarge,
    /// The client went away.
    Gone(ConnError),
}

impl BodyError {
    /// The status answered, if the client is still there.
    pub fn status(&self) -> Option<u16> {
        match self {
            BodyError::Timeout => Some(408),
            BodyError::Invalid => Some(400),
            BodyError::TooLarge => Some(413),
            BodyError::Gone(_) => None,
        }
    }
}

/// Where a streamed body's next pieces come from (the client's connection).
pub trait BodySource {
    /// Appends the next decoded piece of the body to `out`; true once the body is complete.
    fn body_piece(
        &mut self,
        rest: &mut Remaining,
        out: &mut Vec<u8>,
    ) -> impl std::future::Future<Output = Result<bool, BodyError>> + Send;
}
