//! One request's exchange on a connection, the type the cache's behaviour is written on:
//! `dispatch`, `hit`, `relay`, `sliced`, `sliced_send`, `behind`, `tunnel` and the edge's own
//! answers (`edge_rules`, `purge_method`, `fleet_intake`). `Conn` owns the socket and its loop
//! and knows nothing of the cache; an exchange reaches its client only through it: the responder
//! (`respond.rs`) for heads (composed in the connection's head buffer), bodies it copies, the
//! proxy's short answers and the record; the request body's reader (`upload.rs`); and the socket
//! itself for what is the socket's: a cache file's body by sendfile, a tunnel's bytes, and what
//! the socket is (HTTP/2 or not, its address, the host its TLS was made for). Calls go one way,
//! from here down to the connection (the loop's methods are private): a newcomer's walk from the
//! accept to the sendfile never comes back to a file it left but the responder and the socket.

use super::conn_state::Conn;

/// One request on its connection, `c`, which it borrows for as long as the request is served.
pub(super) struct Exchange<'c> {
    pub(super) c: &'c mut Conn,
}
