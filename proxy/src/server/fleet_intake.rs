//! The connection's side of the fleet, at the start of every request: the hop header is taken
//! out of the request (a client's copy never goes further), a valid one marks the request as a
//! peer's (never forwarded again, and counted as such), and one that names an internal
//! operation is answered here (see `crate::fleet::internal`).

use super::conn_error::ConnError;
use super::exchange::Exchange;
use super::request_body::RequestBody;
use crate::http::request::RequestHead;

/// What the start of a request's handling learns from its hop header.
pub(super) enum Intake {
    /// An internal request, answered; `true` keeps the connection.
    Answered(bool),
    /// A peer's forwarded miss: served here, never forwarded again.
    Peer,
    /// A client's request (any hop header it carried is gone).
    Client,
}

impl Exchange<'_> {
    /// Takes the hop header out of `req` and answers it if it is internal.
    pub(super) async fn fleet_intake(
        &mut self,
        req: &mut RequestHead,
        body: &RequestBody,
    ) -> Result<Intake, ConnError> {
        let Some(fleet) = self.c.ctx.fleet.clone() else {
            crate::fleet::hop::strip(req);
            return Ok(Intake::Client);
        };
        let whole = match body {
            RequestBody::Whole(b) => Some(b.as_slice()),
            RequestBody::Streaming { .. } => None,
        };
        if !crate::fleet::hop::present(req) {
            return Ok(Intake::Client);
        }
        let self_id = fleet.self_id();
        let dialled = self
            .c
            .sock
            .tcp()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.to_string());
        let at = crate::fleet::hop::Receiver {
            self_id: self_id.as_deref(),
            dialled: dialled.as_deref(),
            replay: &fleet.replay,
        };
        let hop = match crate::fleet::hop::take(req, whole, &fleet.keys, &at) {
            None => return Ok(Intake::Client),
            Some(Err(why)) => {
                fleet.hop_refused(why, self.c.peer.ip());
                return Ok(Intake::Client);
            }
            Some(Ok(hop)) => hop,
        };
        if let Some(op) = hop.op.as_deref() {
            let (status, json) =
                crate::fleet::internal::answer(&fleet, &self.c.ctx.purger(), op, whole);
            crate::fleet::internal::response(&mut self.c.head, status, &json, req.close);
            self.c.send_head().await?;
            // Answered, though not recorded as a client's response: no abandoned-request line.
            self.c.answered_unrecorded();
            return Ok(Intake::Answered(!req.close));
        }
        self.c.from_peer = true;
        fleet.answering(&hop.from);
        Ok(Intake::Peer)
    }
}
