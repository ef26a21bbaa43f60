//! What an operator asks of the data plane, as a type both sides share: the dashboard's API
//! parses a request into a command, and the proxy (its store, its fleet) carries it out. Neither
//! side owns the other's types: the dashboard depends on nothing of the proxy's, and the proxy's
//! purge and fleet code depend on nothing of the dashboard's.

#![forbid(unsafe_code)]

/// A purge: what it removes, and whether it only marks it stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purge {
    /// What it names.
    pub target: Target,
    /// Soft: the entries stay, stale (as if their freshness lifetime had ended), so a request
    /// revalidates them and stale-if-error can still serve them, as Fastly's soft purge. Hard:
    /// they are removed.
    pub soft: bool,
}

/// What a purge names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One URL (`http://host/path?query`), every variant of it.
    Url(String),
    /// Every URL starting with this (`http://host/prefix`).
    Prefix(String),
}

impl Purge {
    /// A hard purge of one URL.
    pub fn url(u: impl Into<String>) -> Purge {
        Purge {
            target: Target::Url(u.into()),
            soft: false,
        }
    }

    /// A hard purge of every URL under a prefix.
    pub fn prefix(p: impl Into<String>) -> Purge {
        Purge {
            target: Target::Prefix(p.into()),
            soft: false,
        }
    }

    /// The same purge, soft or hard.
    pub fn soft(self, soft: bool) -> Purge {
        Purge { soft, ..self }
    }
}
