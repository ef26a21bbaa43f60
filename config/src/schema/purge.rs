//! `purge:`: the `PURGE` method on the data port, as Varnish and Squid users script their purges
//! (`curl -X PURGE http://edge/path`). Off by default: a method anyone who can reach the data
//! port could send must name who may use it, by address or by token.

use serde::{Deserialize, Serialize};

/// The `PURGE` method.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PurgeConfig {
    /// Accept `PURGE` on the data port: the request's URL (its scheme, host and target) is
    /// purged on this node, answered 200 `{"purged": N}`. Off: `PURGE` is forwarded like any
    /// other method.
    #[serde(default)]
    pub method: bool,
    /// Clients (CIDRs or addresses) allowed to purge without a token; the client is the
    /// connection's peer, or the PROXY protocol's source where a listener takes one.
    #[serde(default)]
    pub allowed_clients: Vec<String>,
    /// A token that allows a purge from anywhere, sent as `Authorization: Bearer <token>`; at
    /// least 16 characters.
    #[serde(default)]
    pub token: Option<String>,
}

impl PurgeConfig {
    /// The checks of this section, as (key path, why).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.method && self.allowed_clients.is_empty() && self.token.is_none() {
            out.push((
                "purge.method".to_string(),
                "needs `purge.allowed_clients` or `purge.token`: without either, anyone who can reach the data port could empty the cache".to_string(),
            ));
        }
        for (i, c) in self.allowed_clients.iter().enumerate() {
            if let Err(why) = crate::cidr::Cidr::parse(c) {
                out.push((format!("purge.allowed_clients[{i}]"), why));
            }
        }
        if let Some(t) = &self.token
            && t.trim().len() < 16
        {
            out.push((
                "purge.token".to_string(),
                "is shorter than 16 characters: a token that short can be guessed".to_string(),
            ));
        }
        out
    }
}
