//! HTTP/1.1 message handling: parsing requests, framing bodies, hop-by-hop hygiene, ranges.
//! Nothing here does I/O; the server and upstream modules drive it.

pub(crate) mod accept_encoding;
pub mod byteranges;
mod cache_status;
pub mod chunked;
pub mod date;
pub(crate) mod field_edit;
pub mod framing;
pub(crate) mod head;
pub mod headers;
pub mod range;
pub mod request;
mod request_line;
pub(crate) mod request_out;
pub mod response;
pub(crate) mod stored_fields;
pub mod target;
