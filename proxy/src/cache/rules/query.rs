//! `routes[].query`: the query string as one resource's many spellings become one. Sorting the
//! parameters and dropping tracking ones (`utm_*`, `fbclid`) before the key is made turns
//! `?b=2&a=1&utm_source=x` and `?a=1&b=2` into one entry and one origin fetch; the upstream
//! request is made from the same target, so the origin is asked exactly what is stored.
//!
//! Names are compared as the target's normalisation left them (`http::target`: unreserved
//! characters decoded, so `utm%5Fsource` is `utm_source`; anything else as sent): a spelling
//! the globs miss gets a key of its own, which costs a miss and can never serve another URL's
//! body.

use zerocache_config::QueryRules;

/// A glob over parameter or host names: `*` stands for any run of characters.
#[derive(Debug, Clone)]
pub(crate) struct Glob {
    /// The text between the stars (an empty first or last piece: it starts or ends with one).
    pieces: Vec<String>,
}

impl Glob {
    /// `pattern` compiled.
    pub(crate) fn new(pattern: &str) -> Glob {
        Glob {
            pieces: pattern.split('*').map(str::to_string).collect(),
        }
    }

    /// The text every match ends with: after its last star (all of it without one).
    pub(crate) fn literal_end(&self) -> &str {
        self.pieces.last().map_or("", String::as_str)
    }

    /// Whether `s` is all of it.
    pub(crate) fn matches(&self, s: &str) -> bool {
        if self.pieces.len() == 1 {
            return self.pieces[0] == s;
        }
        let (first, last) = (&self.pieces[0], &self.pieces[self.pieces.len() - 1]);
        if !s.starts_with(first.as_str()) || s.len() < first.len() + last.len() {
            return false;
        }
        if !s.ends_with(last.as_str()) {
            return false;
        }
        // The middle pieces, leftmost first, in what is between the first and the last.
        let mut rest = &s[first.len()..s.len() - last.len()];
        for p in &self.pieces[1..self.pieces.len() - 1] {
            match rest.find(p.as_str()) {
                Some(i) => rest = &rest[i + p.len()..],
                None => return false,
            }
        }
        true
    }
}

/// A route's query rules, compiled.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueryNorm {
    sort: bool,
    keep: Option<Vec<Glob>>,
    drop: Vec<Glob>,
}

impl QueryNorm {
    /// Compiled from the config; `None` when it changes nothing.
    pub(crate) fn new(q: &QueryRules) -> Option<QueryNorm> {
        (!q.is_noop()).then(|| QueryNorm {
            sort: q.sort,
            keep: q
                .keep
                .as_ref()
                .map(|k| k.iter().map(|g| Glob::new(g)).collect()),
            drop: q.drop.iter().map(|g| Glob::new(g)).collect(),
        })
    }

    /// `target` with its query normalised, or `None` when it is already (no allocation then).
    /// Empty parameters (`a=1&&b=2`) go; a query left empty goes with its `?`.
    pub(crate) fn apply(&self, target: &str) -> Option<String> {
        let (path, query) = target.split_once('?')?;
        let name = |p: &str| p.split_once('=').map_or(p, |(n, _)| n).to_string();
        let mut params: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter(|p| {
                let n = name(p);
                self.keep
                    .as_ref()
                    .is_none_or(|k| k.iter().any(|g| g.matches(&n)))
                    && !self.drop.iter().any(|g| g.matches(&n))
            })
            .collect();
        if self.sort {
            // Stable: `a=2&a=1` keeps its order, which an origin may read as a list.
            params.sort_by(|a, b| {
                let na = a.split_once('=').map_or(*a, |(n, _)| n);
                let nb = b.split_once('=').map_or(*b, |(n, _)| n);
                na.cmp(nb)
            });
        }
        let mut out = String::with_capacity(target.len());
        out.push_str(path);
        for (i, p) in params.iter().enumerate() {
            out.push(if i == 0 { '?' } else { '&' });
            out.push_str(p);
        }
        (out != target).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(sort: bool, keep: Option<&[&str]>, drop: &[&str]) -> QueryNorm {
        QueryNorm::new(&QueryRules {
            sort,
            keep: keep.map(|k| k.iter().map(|s| s.to_string()).collect()),
            drop: drop.iter().map(|s| s.to_string()).collect(),
        })
        .expect("changes something")
    }

    #[test]
    fn three_spellings_of_one_resource_become_one_target() {
        let n = norm(true, None, &["utm_*", "fbclid"]);
        assert_eq!(n.apply("/p?a=1&b=2"), None);
        assert_eq!(n.apply("/p?b=2&a=1").as_deref(), Some("/p?a=1&b=2"));
        assert_eq!(
            n.apply("/p?utm_source=x&b=2&fbclid=Q&a=1&utm_medium=y")
                .as_deref(),
            Some("/p?a=1&b=2")
        );
        assert_eq!(n.apply("/p?utm_source=x").as_deref(), Some("/p"));
        assert_eq!(n.apply("/p"), None);
        assert_eq!(n.apply("/p?").as_deref(), Some("/p"));
        // Repeated names keep their order; empty parameters go.
        assert_eq!(
            n.apply("/p?b=1&a=2&&a=1").as_deref(),
            Some("/p?a=2&a=1&b=1")
        );
    }

    #[test]
    fn hostile_spellings_stay_apart_and_keep_their_bytes() {
        let n = norm(true, None, &["utm_*"]);
        // Nothing is decoded here (the target was normalised before): a different key.
        assert_eq!(n.apply("/p?utm%5Fsource=x").as_deref(), None);
        // A value with `=` or `?` in it stays whole.
        assert_eq!(n.apply("/p?b=x=y?z&a").as_deref(), Some("/p?a&b=x=y?z"));
        // `utm_` alone matches `utm_*`; `utm` does not.
        assert_eq!(n.apply("/p?utm=1&utm_=2").as_deref(), Some("/p?utm=1"));
    }

    #[test]
    fn keep_then_drop() {
        let n = norm(false, Some(&["id", "page*"]), &["page_debug"]);
        assert_eq!(
            n.apply("/l?x=1&page=2&id=7&page_debug=1&pagesize=5")
                .as_deref(),
            Some("/l?page=2&id=7&pagesize=5")
        );
    }

    #[test]
    fn globs() {
        assert!(Glob::new("*.example.com").matches("a.example.com"));
        assert!(!Glob::new("*.example.com").matches("example.com"));
        assert!(Glob::new("a*b*c").matches("abc"));
        assert!(Glob::new("a*b*c").matches("axxbyyc"));
        assert!(!Glob::new("a*b*c").matches("acb"));
        assert!(!Glob::new("ab*ba").matches("aba"));
        assert!(Glob::new("*").matches(""));
        assert!(Glob::new("x").matches("x") && !Glob::new("x").matches("xy"));
    }
}
