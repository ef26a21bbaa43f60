//! One request's exchange on a connection, the type the cache's behaviour is written on:
//! `dispatch`, `hit`, `relay`, `sliced`, `sliced_send`, `behind`, `tunnel` and the edge's own
//! answers (`edge_rules`, `purge_method`, `fleet_intake`). `Conn` owns the socket and its loop
//! and knows nothing of the cache; an exchange reaches its client only through it: the responder
//! (`respond.rs`) for heads, the proxy's short answers and the record; the request body's reader
//! (`upload.rs`); and the socket itself for the two things that are the socket's, a cache file's
//! body by sendfile and a tunnel's bytes. Calls go one way, from here down to the connection: a
//! newcomer's walk from the accept to the sendfile never comes back to a file it left.

use super::conn_state::Conn;

/// One request on its connection, `c`, which it borrows for as long as the request is served.
pub(super) struct Exchange<'c> {
    pub(super) c: &'c mut Conn,
}
