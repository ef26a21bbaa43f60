//! What a request has that the rules' conditions need, found once for all the rules: which of
//! the field names the rules name it carries (a bit each, for the first 64 names), whether it
//! carries a `Cookie` and a query, and its path's first 8 bytes (against which a path prefix's
//! first 8 are one masked comparison). A rule whose needs the request lacks is skipped with a mask
//! test before any of its conditions runs: with 20 rules on a route most fail there, and the
//! conditions cost 77 instructions a rule a request (callgrind) where this costs a few.
//!
//! A need is only ever a condition that cannot hold without it (a field condition without the
//! field, a cookie without `Cookie`, a query parameter without a query), so skipping never
//! changes which rules match; the conditions still decide for the rules that pass.

use crate::http::request::RequestHead;

/// The field names the rules' conditions read, lower case, each a bit of [`Facts::fields`].
#[derive(Debug, Default)]
pub(crate) struct FieldNames(Vec<String>);

impl FieldNames {
    /// `name`'s bit (0 past the 64th name: a rule that reads it is not skipped for it).
    pub(crate) fn bit(&mut self, name: &str) -> u64 {
        let name = name.to_ascii_lowercase();
        let i = match self.0.iter().position(|n| *n == name) {
            Some(i) => i,
            None if self.0.len() < 64 => {
                self.0.push(name);
                self.0.len() - 1
            }
            None => return 0,
        };
        1 << i
    }
}

/// What a rule's conditions cannot hold without.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Needs {
    pub(crate) fields: u64,
    pub(crate) cookie: bool,
    pub(crate) query: bool,
    /// The first bytes (up to 8) a path must start with, and which of the 8 they are.
    lead: u64,
    lead_mask: u64,
}

impl Needs {
    /// Whether `f` has all of it.
    #[inline]
    pub(crate) fn met(self, f: &Facts) -> bool {
        f.path8 & self.lead_mask == self.lead
            && self.fields & !f.fields == 0
            && (!self.cookie || f.cookie)
            && (!self.query || f.query)
    }

    /// Also needs the path to start with `prefix` (its first 8 bytes are what is checked here).
    pub(crate) fn path_starts_with(&mut self, prefix: &str) {
        let (lead, n) = lead(prefix.as_bytes());
        self.lead = lead;
        self.lead_mask = if n == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * n)) - 1
        };
    }

    fn any(self) -> bool {
        self.fields != 0 || self.cookie
    }
}

/// Up to the first 8 bytes of `s`, little-endian in a word (the rest 0), and how many.
fn lead(s: &[u8]) -> (u64, usize) {
    let n = s.len().min(8);
    let mut w = [0u8; 8];
    w[..n].copy_from_slice(&s[..n]);
    (u64::from_le_bytes(w), n)
}

/// What one request has, of what the rules need.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Facts {
    fields: u64,
    cookie: bool,
    query: bool,
    /// The path's first 8 bytes (0 past its end: no path holds a NUL, so a shorter path never
    /// passes for a longer prefix).
    path8: u64,
}

/// What the rules of a route need, together: what a request's [`Facts`] look for.
#[derive(Debug, Default)]
pub(crate) struct Wanted {
    names: FieldNames,
    cookie: bool,
    /// Some rule needs anything (else there are no facts to find).
    any: bool,
}

impl Wanted {
    /// Everything `needs` ask for, with the names their bits stand for.
    pub(crate) fn of(names: FieldNames, needs: impl Iterator<Item = Needs>) -> Wanted {
        let (mut cookie, mut any) = (false, false);
        for n in needs {
            cookie |= n.cookie;
            any |= n.any();
        }
        Wanted { names, cookie, any }
    }

    /// The facts of `req` (its `path` as the rules match it, its target's `query`: `?` and
    /// after, or nothing).
    pub(crate) fn facts(&self, req: &RequestHead, path: &str, query: &str) -> Facts {
        let mut f = Facts {
            fields: 0,
            cookie: false,
            query: query.len() > 1,
            path8: lead(path.as_bytes()).0,
        };
        if !self.any {
            return f;
        }
        for (k, _) in &req.fields {
            if self.cookie && k.eq_ignore_ascii_case("cookie") {
                f.cookie = true;
            }
            for (i, n) in self.names.0.iter().enumerate() {
                if n.len() == k.len() && k.eq_ignore_ascii_case(n) {
                    f.fields |= 1 << i;
                }
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_is_skipped_only_for_what_its_conditions_cannot_do_without() {
        let mut names = FieldNames::default();
        let beta = Needs {
            fields: names.bit("X-Beta"),
            ..Needs::default()
        };
        let jar = Needs {
            cookie: true,
            ..Needs::default()
        };
        let preview = Needs {
            query: true,
            fields: names.bit("x-beta"),
            ..Needs::default()
        };
        assert_eq!(beta.fields, 1, "one bit a name, whatever its case");
        assert_eq!(preview.fields, 1);
        let wanted = Wanted::of(names, [beta, jar, preview, Needs::default()].into_iter());
        let req = |extra: &str| crate::http::request::test_request("GET", extra);
        let bare = wanted.facts(&req(""), "/", "");
        assert!(!beta.met(&bare) && !jar.met(&bare) && !preview.met(&bare));
        assert!(Needs::default().met(&bare));
        let full = wanted.facts(&req("x-BETA: 1\r\nCookie: a=1\r\n"), "/", "?p=1");
        assert!(beta.met(&full) && jar.met(&full) && preview.met(&full));
        // `?` alone is no query to find a parameter in.
        assert!(!preview.met(&wanted.facts(&req("X-Beta: 1\r\n"), "/", "?")));
        // A path prefix: its first 8 bytes, whatever its length; a shorter path never passes.
        let mut admin = Needs::default();
        admin.path_starts_with("/admin/");
        let mut long = Needs::default();
        long.path_starts_with("/blog/2026/");
        let at = |path: &str| wanted.facts(&req(""), path, "");
        assert!(admin.met(&at("/admin/x")) && admin.met(&at("/admin/")));
        assert!(!admin.met(&at("/admin")) && !admin.met(&at("/obj/1")) && !admin.met(&at("")));
        assert!(long.met(&at("/blog/2026/x")) && long.met(&at("/blog/20")));
        assert!(!long.met(&at("/blog/2")) && !long.met(&at("/blog/1999/")));
        let mut root = Needs::default();
        root.path_starts_with("");
        assert!(root.met(&at("")) && root.met(&at("/x")));
        // Past 64 names, a name has no bit and never skips a rule.
        let mut many = FieldNames::default();
        for i in 0..64 {
            assert_eq!(many.bit(&format!("x-{i}")), 1 << i);
        }
        assert_eq!(many.bit("x-64"), 0);
    }
}
