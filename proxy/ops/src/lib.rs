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
    /// Every stored response tagged with any of these (its `Surrogate-Key` or `Cache-Tag`).
    Tags(Vec<String>),
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

    /// A hard purge of every response with any of `tags`.
    pub fn tags(tags: Vec<String>) -> Purge {
        Purge {
            target: Target::Tags(tags),
            soft: false,
        }
    }

    /// The same purge, soft or hard.
    pub fn soft(self, soft: bool) -> Purge {
        Purge { soft, ..self }
    }
}

/// Longest cache tag, in bytes (Fastly's limit for a surrogate key).
pub const MAX_TAG_LEN: usize = 1024;
/// Most tags one purge may name.
pub const MAX_PURGE_TAGS: usize = 256;

/// Whether `t` can be a cache tag: 1 to [`MAX_TAG_LEN`] bytes of visible ASCII without a comma
/// (so a tag reads the same in a space- or a comma-separated field).
pub fn valid_tag(t: &str) -> bool {
    !t.is_empty() && t.len() <= MAX_TAG_LEN && t.bytes().all(|b| b.is_ascii_graphic() && b != b',')
}

/// The tags of a purge, checked: 1 to [`MAX_PURGE_TAGS`], each [`valid_tag`].
pub fn check_tags(tags: &[String]) -> Result<(), String> {
    if tags.is_empty() || tags.len() > MAX_PURGE_TAGS {
        return Err(format!(
            "`tags` must list 1 to {MAX_PURGE_TAGS} tags, not {}",
            tags.len()
        ));
    }
    match tags.iter().find(|t| !valid_tag(t)) {
        Some(bad) => Err(format!(
            "tag {:?} is not 1 to {MAX_TAG_LEN} bytes of visible ASCII without a comma",
            bad.chars().take(64).collect::<String>()
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_tags_are_bounded_and_plain() {
        assert_eq!(check_tags(&["a".into(), "page:1".into()]), Ok(()));
        assert!(check_tags(&[]).is_err());
        let many: Vec<String> = (0..=MAX_PURGE_TAGS).map(|i| format!("t{i}")).collect();
        assert!(check_tags(&many).is_err());
        for bad in ["", "a b", "a,b", "caf\u{e9}", "\u{1}"] {
            assert!(check_tags(&[bad.to_string()]).is_err(), "{bad:?}");
        }
        assert!(check_tags(&["x".repeat(MAX_TAG_LEN + 1)]).is_err());
        assert!(check_tags(&["x".repeat(MAX_TAG_LEN)]).is_ok());
    }
}
