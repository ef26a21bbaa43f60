//! The client side of the network, below the request path: binding the listening sockets, and
//! the client's socket (plain, TLS in the kernel or TLS in user space) with the three ways a
//! response leaves through it. It knows sockets, files and TLS streams, and nothing of requests,
//! routes or the cache, so the server, the TLS listener and (later) other protocols stand on it.

pub(crate) mod client_sock;
pub(crate) mod h2_stream;
pub(crate) mod inherit;
pub(crate) mod listen;
pub(crate) mod opening;
pub(crate) mod proxy_protocol;
