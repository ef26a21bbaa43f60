//! A fetch's side of the fleet: a miss of a key this node does not own goes to the members of
//! its plan first (see `crate::fleet::forward`), and what comes back decides whether the answer
//! is relayed from a peer, and whether it is stored here.

use super::Fetch;
use crate::fleet::forward::{Exchanged, Plan, Went};
use crate::http::response::ResponseHead;

impl Fetch<'_> {
    /// Sends `request` along `plan` and takes note of who answered: a peer's answer is relayed
    /// (its group now holds the connection, which goes back to its pool) and stored here only
    /// under `store_remote`; the origin's is stored as the plan says.
    pub(super) async fn exchange_fleet(
        &mut self,
        plan: Plan,
        request: &[u8],
        interim: &mut Vec<ResponseHead>,
    ) -> Exchanged {
        let key = self.balance_key().into_owned();
        let host = self.req.host.as_str();
        let (went, x) =
            crate::fleet::forward::exchange(plan, &self.upstream, request, &key, host, interim)
                .await;
        match went {
            Went::Peer(relay) => {
                self.upstream = relay.peer.group.clone();
                self.store_here = relay.fleet.cfg.store_remote;
                self.via_peer = Some(relay);
            }
            Went::Origin { store } => {
                self.store_here = store;
                if !store {
                    self.not_stored = Some("fleet-owner-down");
                }
            }
        }
        x
    }
}
