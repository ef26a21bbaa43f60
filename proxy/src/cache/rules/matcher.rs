//! A rule's `match`, compiled: every condition given must hold. Regular expressions were
//! compiled and size-checked when the config was read; here they are compiled again, once per
//! load, never per request.

use super::query::Glob;
use crate::http::request::RequestHead;
use std::net::IpAddr;
use zerocache_config::RuleMatch;
use zerocache_config::cidr::Cidr;

/// What a rule's conditions look at: the request, normalised (its query as `routes[].query`
/// left it), and the client's address.
pub(crate) struct Seen<'a> {
    pub req: &'a RequestHead,
    /// Its path (the target up to `?`) with runs of `/` merged, as the routes match it (origins
    /// that merge slashes serve `//admin/` as `/admin/`, so a deny of `/admin/` must hold for it
    /// too); found once for all the rules.
    pub path: &'a str,
    /// `?` and the query, or nothing.
    pub query: &'a str,
    /// The peer, or the source a PROXY header gave.
    pub client: IpAddr,
}

/// A value condition: present, equal, or matching.
#[derive(Debug)]
enum Value {
    Present,
    Equals(String),
    Matches(regex::Regex),
}

impl Value {
    fn holds(&self, v: &str) -> bool {
        match self {
            Value::Present => true,
            Value::Equals(e) => e == v,
            Value::Matches(r) => r.is_match(v),
        }
    }
}

/// One condition of a `match`.
#[derive(Debug)]
enum Cond {
    /// The path starts with it (a `path_prefix`, or the literal start of a `path_regex`).
    PathPrefix(String),
    Path(String),
    Tls(bool),
    H2(bool),
    Methods(Vec<String>),
    Host(Glob),
    ClientIn(Vec<Cidr>),
    ClientNotIn(Vec<Cidr>),
    Header(String, Value),
    Query(String, Value),
    Cookies(Vec<String>),
}

impl Cond {
    fn holds(&self, s: &Seen<'_>) -> bool {
        let req = s.req;
        match self {
            Cond::PathPrefix(p) => s.path.starts_with(p.as_str()),
            Cond::Path(p) => p == s.path,
            Cond::Tls(t) => *t == req.tls,
            Cond::H2(h) => *h == req.h2,
            Cond::Methods(m) => m.contains(&req.method),
            Cond::Host(g) => g.matches(&req.host),
            Cond::ClientIn(c) => c.iter().any(|c| c.contains(s.client)),
            Cond::ClientNotIn(c) => !c.iter().any(|c| c.contains(s.client)),
            Cond::Header(name, v) => req
                .fields
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .any(|(_, val)| std::str::from_utf8(val).is_ok_and(|val| v.holds(val.trim()))),
            Cond::Query(name, v) => {
                let query = s.query;
                !query.is_empty() && query_params(query).any(|(n, val)| n == name && v.holds(val))
            }
            // Every `Cookie` line is a list of its own: a cookie is present when any line names
            // it (no joined copy made).
            Cond::Cookies(want) => want.iter().all(|w| {
                req.fields
                    .iter()
                    .filter(|(k, _)| k.eq_ignore_ascii_case("cookie"))
                    .any(|(_, jar)| {
                        std::str::from_utf8(jar).is_ok_and(|jar| cookie_names(jar).any(|n| n == w))
                    })
            }),
        }
    }
}

/// A compiled `match`: its conditions, only those given, cheapest first (the path's), then its
/// regular expression, the one search.
#[derive(Debug, Default)]
pub(crate) struct Matcher {
    conds: Vec<Cond>,
    path_regex: Option<regex::Regex>,
    /// Whether a condition reads more than the URL the cache key holds.
    beyond_the_url: bool,
}

/// Where `path_regex`'s groups are in the path (`(start, end)`, `None` for a group that took no
/// part), for `$1`..`$9`.
pub(crate) type Groups = Vec<Option<(usize, usize)>>;

impl Matcher {
    /// Compiles a validated `match`; `Err` only for a config that skipped validation.
    pub(crate) fn new(m: &RuleMatch) -> Result<Matcher, String> {
        let value = |v: &zerocache_config::ValueMatch| -> Result<Value, String> {
            Ok(match (&v.equals, &v.regex) {
                (Some(e), _) => Value::Equals(e.clone()),
                (None, Some(r)) => Value::Matches(zerocache_config::rules_check::regex(r)?),
                (None, None) => Value::Present,
            })
        };
        let cidrs = |l: &[String]| {
            l.iter()
                .map(|c| Cidr::parse(c))
                .collect::<Result<Vec<_>, _>>()
        };
        let mut conds = Vec::new();
        if let Some(p) = &m.path {
            conds.push(Cond::Path(p.clone()));
        }
        if let Some(p) = &m.path_prefix {
            conds.push(Cond::PathPrefix(p.clone()));
        }
        // What every match of the regular expression starts with, when it says so
        // (`^/blog/(.*)` starts with `/blog/`): a path it cannot match costs a comparison.
        if let Some(p) = m.path_regex.as_deref().map(literal_prefix)
            && !p.is_empty()
        {
            conds.push(Cond::PathPrefix(p));
        }
        if let Some(s) = &m.scheme {
            conds.push(Cond::Tls(s == "https"));
        }
        if let Some(p) = &m.protocol {
            conds.push(Cond::H2(p == "h2"));
        }
        if !m.method.is_empty() {
            conds.push(Cond::Methods(m.method.clone()));
        }
        if let Some(h) = &m.host {
            conds.push(Cond::Host(Glob::new(&h.to_ascii_lowercase())));
        }
        if !m.client_in.is_empty() {
            conds.push(Cond::ClientIn(cidrs(&m.client_in)?));
        }
        if !m.client_not_in.is_empty() {
            conds.push(Cond::ClientNotIn(cidrs(&m.client_not_in)?));
        }
        for h in &m.headers {
            conds.push(Cond::Header(h.name.clone(), value(h)?));
        }
        for q in &m.query {
            conds.push(Cond::Query(q.name.clone(), value(q)?));
        }
        if !m.cookies.is_empty() {
            conds.push(Cond::Cookies(m.cookies.clone()));
        }
        let beyond_the_url = conds.iter().any(|c| {
            matches!(
                c,
                Cond::H2(_)
                    | Cond::Methods(_)
                    | Cond::ClientIn(_)
                    | Cond::ClientNotIn(_)
                    | Cond::Header(..)
                    | Cond::Query(..)
                    | Cond::Cookies(_)
            )
        });
        Ok(Matcher {
            conds,
            path_regex: m
                .path_regex
                .as_deref()
                .map(zerocache_config::rules_check::regex)
                .transpose()?,
            beyond_the_url,
        })
    }

    /// What its conditions cannot hold without (see `facts`), the field names given bits in
    /// `names`.
    pub(crate) fn needs(&self, names: &mut super::facts::FieldNames) -> super::facts::Needs {
        let mut n = super::facts::Needs::default();
        // The first path condition (they come first): the path must start with its text.
        if let Some(Cond::PathPrefix(p) | Cond::Path(p)) = self.conds.first() {
            n.path_starts_with(p);
        }
        for c in &self.conds {
            match c {
                Cond::Header(name, _) => n.field(names.bit(name)),
                Cond::Query(..) => n.query(),
                Cond::Cookies(want) if !want.is_empty() => n.cookie(),
                Cond::Host(g) => n.host_ends_with(g.literal_end()),
                Cond::ClientIn(c) => n.client_in(c.iter().fold(0, |a, c| a | c.buckets())),
                _ => {}
            }
        }
        // A path prefix the first 8 bytes hold whole is all the needs check: its rule matches
        // when they are met. (Not one with a NUL: a shorter path's padding would pass for it.)
        n.decisive_when(
            self.path_regex.is_none()
                && match self.conds.as_slice() {
                    [] => true,
                    [Cond::PathPrefix(p)] => p.len() <= 8 && !p.as_bytes().contains(&0),
                    _ => false,
                },
        );
        n
    }

    /// Whether its outcome depends on more than the URL the cache key holds (fields, cookies, the
    /// query, the client, the method or protocol): a rule that changes the upstream request on
    /// such a match must put itself in the key.
    pub(crate) fn beyond_the_url(&self) -> bool {
        self.beyond_the_url
    }

    /// `Some(groups)` when every condition holds (the groups of `path_regex` when `groups` asks
    /// for them, else none: a yes-or-no match allocates nothing).
    pub(crate) fn matches(&self, s: &Seen<'_>, groups: bool) -> Option<Groups> {
        if !self.conds.iter().all(|c| c.holds(s)) {
            return None;
        }
        let Some(re) = &self.path_regex else {
            return Some(Vec::new());
        };
        if !groups {
            return re.is_match(s.path).then(Vec::new);
        }
        let caps = re.captures(s.path)?;
        Some(
            caps.iter()
                .map(|m| m.map(|m| (m.start(), m.end())))
                .collect(),
        )
    }
}

/// The text every match of `pattern` must start with: after a leading `^`, the characters up to
/// the first that is not plainly itself (a metacharacter, an escape, or one a quantifier makes
/// optional). Empty when that cannot be said: no `^`, or an alternation anywhere.
fn literal_prefix(pattern: &str) -> String {
    let Some(rest) = pattern.strip_prefix('^') else {
        return String::new();
    };
    if pattern.contains('|') {
        return String::new();
    }
    let chars: Vec<char> = rest.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        let meta = "\\.+*?()|[]{}^$".contains(*c);
        let quantified = chars.get(i + 1).is_some_and(|n| "*?{".contains(*n));
        if meta || quantified || !c.is_ascii() {
            break;
        }
        out.push(*c);
    }
    out
}

/// The parameters of `query` (`?` and what follows, or nothing) as (name, value), as sent.
fn query_params(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .strip_prefix('?')
        .unwrap_or(query)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

/// The names in a `Cookie` field's value.
fn cookie_names(jar: &str) -> impl Iterator<Item = &str> {
    jar.split(';')
        .map(|kv| kv.split_once('=').map_or(kv, |(k, _)| k).trim())
}

#[cfg(test)]
mod tests {
    use super::literal_prefix;

    #[test]
    fn a_regex_prefix_is_what_every_match_starts_with_or_nothing() {
        assert_eq!(literal_prefix("^/blog/(.*)$"), "/blog/");
        assert_eq!(literal_prefix("^/blog/[0-9]+"), "/blog/");
        // A quantifier makes the character before it optional.
        assert_eq!(literal_prefix("^/blogs?/x"), "/blog");
        assert_eq!(literal_prefix("^/a{2}"), "/");
        assert_eq!(literal_prefix("^/a*"), "/");
        // An escape, a dot, a flag group, an alternation or no anchor: nothing to say.
        assert_eq!(literal_prefix("^\\/x"), "");
        assert_eq!(literal_prefix("^/a.b"), "/a");
        assert_eq!(literal_prefix("^(?i)/admin"), "");
        assert_eq!(literal_prefix("^/a|^/b"), "");
        assert_eq!(literal_prefix("/blog/"), "");
    }
}
