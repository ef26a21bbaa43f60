//! Purges made while the index loads. A purge removes what the index holds, but a file the load
//! has not reached yet is not in it: the purge leaves a tombstone (the URL's hash, the prefix, the
//! tag's hash), and the load, reaching a file one names, deletes it instead of indexing it. So a
//! purge during the load wins over the load reaching the same file later.
//!
//! Tombstones are also appended (and synced) to `<cache>/state/load-purges`, and read back by the
//! next process's load: a stop, a crash or an upgrade before the load finishes would otherwise
//! let the next load index a file a purge had answered for. The file is deleted once a load has
//! walked the whole directory, when no file a tombstone names can be left.

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

/// The file tombstones are kept in, in the state directory.
pub(super) const FILE: &str = "load-purges";

/// One purge made during the load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tombstone {
    /// Every entry of a URL key text, by its xxh3-64 (a collision deletes an unrelated file the
    /// load has not reached: fetched again, never served wrong).
    Url(u64),
    /// Every entry whose URL key text starts with this.
    Prefix(String),
    /// Every entry with a tag, by its xxh3-128.
    Tag(u128),
}

impl Tombstone {
    pub(crate) fn url(url: &str) -> Tombstone {
        Tombstone::Url(xxh3_64(url.as_bytes()))
    }

    pub(crate) fn tag(tag: &str) -> Tombstone {
        Tombstone::Tag(xxh3_128(tag.as_bytes()))
    }

    /// Its line in the file (URL key texts hold no line break: the request line's grammar).
    fn line(&self) -> String {
        match self {
            Tombstone::Url(h) => format!("url {h:016x}\n"),
            Tombstone::Prefix(p) => format!("prefix {p}\n"),
            Tombstone::Tag(h) => format!("tag {h:032x}\n"),
        }
    }

    /// A line of the file; `None` for one that is not a tombstone (a torn last line).
    fn parse(line: &str) -> Option<Tombstone> {
        let (kind, rest) = line.split_once(' ')?;
        match kind {
            "url" if rest.len() == 16 => u64::from_str_radix(rest, 16).ok().map(Tombstone::Url),
            "tag" if rest.len() == 32 => u128::from_str_radix(rest, 16).ok().map(Tombstone::Tag),
            "prefix" if !rest.is_empty() => Some(Tombstone::Prefix(rest.to_string())),
            _ => None,
        }
    }
}

/// The tombstones of the running load.
#[derive(Default)]
pub(crate) struct Tombstones {
    /// Whether a load runs (purges are remembered only then).
    pub(crate) on: bool,
    urls: HashSet<u64>,
    prefixes: Vec<String>,
    tags: HashSet<u128>,
}

impl Tombstones {
    /// Adds `t`; true if it is new.
    pub(crate) fn add(&mut self, t: Tombstone) -> bool {
        match t {
            Tombstone::Url(h) => self.urls.insert(h),
            Tombstone::Tag(h) => self.tags.insert(h),
            Tombstone::Prefix(p) => {
                let new = !self.prefixes.contains(&p);
                if new {
                    self.prefixes.push(p);
                }
                new
            }
        }
    }

    /// Whether a purge names the entry of URL key text `url` with tags `tags` (asked for only
    /// when there are tag tombstones: `has_tags`).
    pub(crate) fn names(&self, url: &str, tags: impl FnOnce() -> Vec<String>) -> bool {
        self.urls.contains(&xxh3_64(url.as_bytes()))
            || self.prefixes.iter().any(|p| url.starts_with(p.as_str()))
            || (!self.tags.is_empty()
                && tags()
                    .iter()
                    .any(|t| self.tags.contains(&xxh3_128(t.as_bytes()))))
    }
}

/// Appends `t` to the file under `state` and syncs it: the purge has been answered for.
pub(super) fn persist(state: &Path, t: &Tombstone) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join(FILE))?;
    f.write_all(t.line().as_bytes())?;
    f.sync_data()
}

/// The tombstones a load that did not finish left under `state`.
pub(super) fn left(state: &Path) -> Vec<Tombstone> {
    std::fs::read_to_string(state.join(FILE))
        .map(|s| s.lines().filter_map(Tombstone::parse).collect())
        .unwrap_or_default()
}

/// Deletes the file: a load walked the whole directory.
pub(super) fn clear(state: &Path) {
    let _ = std::fs::remove_file(state.join(FILE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_survive_their_file_and_a_torn_line_is_skipped() {
        let tmp = tempfile::tempdir().expect("tmp");
        let all = [
            Tombstone::url("GET http://h/a"),
            Tombstone::Prefix("GET http://h/dir/".into()),
            Tombstone::tag("shop"),
        ];
        for t in &all {
            persist(tmp.path(), t).expect("persist");
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(tmp.path().join(FILE))
            .expect("open");
        f.write_all(b"url 12").expect("a torn line");
        assert_eq!(left(tmp.path()), all);
        let mut t = Tombstones::default();
        for x in left(tmp.path()) {
            assert!(t.add(x));
        }
        assert!(!t.add(Tombstone::tag("shop")), "once");
        assert!(t.names("GET http://h/a", Vec::new));
        assert!(t.names("GET http://h/dir/x", Vec::new));
        assert!(t.names("GET http://h/b", || vec!["shop".into()]));
        assert!(!t.names("GET http://h/b", || vec!["other".into()]));
        clear(tmp.path());
        assert!(left(tmp.path()).is_empty());
    }
}
