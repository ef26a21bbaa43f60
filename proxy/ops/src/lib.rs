//! What an operator asks of the data plane, as a type both sides share: the dashboard's API
//! parses a request into a command, and the proxy (its store, its fleet) carries it out. Neither
//! side owns the other's types: the dashboard depends on nothing of the proxy's, and the proxy's
//! purge and fleet code depend on nothing of the dashboard's.

#![forbid(unsafe_code)]

/// What a purge removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge {
    /// One URL (`http://host/path?query`), every variant of it.
    Url(String),
    /// Every URL starting with this (`http://host/prefix`).
    Prefix(String),
}
