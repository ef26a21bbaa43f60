//! The checks of `routes[].query` and `routes[].rules` that types cannot express: names unique,
//! regular expressions that compile within a size limit, templates with known variables and no
//! line breaks, one answer per rule, fields a rule may not touch. Each error names the key it is
//! about, so `zerocache check` prints its file, line and column.

use crate::schema::{Config, HeaderActions, Route, Rule, TemplatePart};
use crate::validate::{Invalid, invalid};

/// Largest compiled regular expression a rule may hold (the `regex` crate's `size_limit`): a
/// pattern that would take more is refused when the config is read, not at a request.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Most rules a route may have.
pub const MAX_RULES: usize = 64;

/// Largest `respond.body`.
pub const MAX_RESPOND_BODY: usize = 64 * 1024;

/// Request fields the proxy writes or scrubs itself when it sends the request upstream (the
/// forwarding fields it appends, `Expect`; and [`crate::validate::CLIENT_ADDRESS_FIELDS`] from an
/// untrusted peer): a rule that set one would be heard by the key and `Vary` but not by the
/// origin.
const REWRITTEN_UPSTREAM: &[&str] = &[
    "x-forwarded-for",
    "forwarded",
    "x-forwarded-proto",
    "via",
    "expect",
];

/// Fields a rule may never set or remove: the framing and the connection's own (the proxy
/// writes them), and `Host` (the route and the key were chosen by it).
const NOT_EDITABLE: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "host",
];

/// Compiles `pattern` as a rule does.
pub fn regex(pattern: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("not a regular expression this proxy runs: {e}"))
}

/// Whether `s` is a field name (an RFC 9110 token).
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Checks route `i`'s query rules and rules.
pub(crate) fn check(i: usize, r: &Route, config: &Config, errs: &mut Vec<Invalid>) {
    let q = &r.query;
    for (list, globs) in [
        ("keep", q.keep.as_deref().unwrap_or(&[])),
        ("drop", &q.drop),
    ] {
        for (j, g) in globs.iter().enumerate() {
            if g.is_empty() || g.contains(['&', '=', '#', ' ']) {
                errs.push(invalid(
                    format!("routes[{i}].query.{list}[{j}]"),
                    format!("`{g}` is not a parameter name or a glob of one"),
                ));
            }
        }
    }
    if r.rules.len() > MAX_RULES {
        errs.push(invalid(
            format!("routes[{i}].rules"),
            format!(
                "{} rules: a route has at most {MAX_RULES} (split the route by path or host)",
                r.rules.len()
            ),
        ));
    }
    let mut names = std::collections::HashMap::new();
    for (j, rule) in r.rules.iter().enumerate() {
        let at = format!("routes[{i}].rules[{j}]");
        if let Some(why) = crate::validate::name_problem(&rule.name) {
            errs.push(invalid(format!("{at}.name"), why));
        } else if let Some(first) = names.insert(rule.name.clone(), j) {
            errs.push(invalid(
                format!("{at}.name"),
                format!(
                    "`{}` is rules[{first}]'s name already: each rule of a route needs its own",
                    rule.name
                ),
            ));
        }
        let groups = matcher(&at, rule, errs);
        actions(&at, rule, groups, config, errs);
        per_request_values(&at, r, rule, errs);
    }
}

/// Checks a rule's `match`; returns how many groups its `path_regex` has.
fn matcher(at: &str, rule: &Rule, errs: &mut Vec<Invalid>) -> usize {
    let m = &rule.matcher;
    for (key, v) in [("path_prefix", &m.path_prefix), ("path", &m.path)] {
        if let Some(p) = v
            && !p.starts_with('/')
        {
            errs.push(invalid(
                format!("{at}.match.{key}"),
                format!("`{p}` must start with `/`"),
            ));
        }
    }
    if m.host.as_deref() == Some("") {
        errs.push(invalid(
            format!("{at}.match.host"),
            "an empty host matches nothing: leave the key out to match any".into(),
        ));
    }
    let mut groups = 0;
    if let Some(p) = &m.path_regex {
        match regex(p) {
            Ok(re) => groups = re.captures_len() - 1,
            Err(e) => errs.push(invalid(format!("{at}.match.path_regex"), e)),
        }
    }
    for (k, method) in m.method.iter().enumerate() {
        if !is_token(method) {
            errs.push(invalid(
                format!("{at}.match.method[{k}]"),
                format!("`{method}` is not a method"),
            ));
        }
    }
    for (list, values) in [("headers", &m.headers), ("query", &m.query)] {
        for (k, v) in values.iter().enumerate() {
            if (list == "headers" && !is_token(&v.name)) || v.name.is_empty() {
                errs.push(invalid(
                    format!("{at}.match.{list}[{k}].name"),
                    format!("`{}` is not a field name", v.name),
                ));
            }
            if v.equals.is_some() && v.regex.is_some() {
                errs.push(invalid(
                    format!("{at}.match.{list}[{k}]"),
                    "give `equals` or `regex`, not both".into(),
                ));
            }
            if let Some(Err(e)) = v.regex.as_deref().map(regex) {
                errs.push(invalid(format!("{at}.match.{list}[{k}].regex"), e));
            }
        }
    }
    for (list, cidrs) in [
        ("client_in", &m.client_in),
        ("client_not_in", &m.client_not_in),
    ] {
        for (k, c) in cidrs.iter().enumerate() {
            if let Err(e) = crate::cidr::Cidr::parse(c) {
                errs.push(invalid(format!("{at}.match.{list}[{k}]"), e));
            }
        }
    }
    if let Some(s) = m
        .scheme
        .as_deref()
        .filter(|s| !matches!(*s, "http" | "https"))
    {
        errs.push(invalid(
            format!("{at}.match.scheme"),
            format!("`{s}` is neither http nor https"),
        ));
    }
    if let Some(p) = m
        .protocol
        .as_deref()
        .filter(|p| !matches!(*p, "http/1.1" | "h2"))
    {
        errs.push(invalid(
            format!("{at}.match.protocol"),
            format!("`{p}` is neither http/1.1 nor h2"),
        ));
    }
    groups
}

/// Checks a rule's actions; `groups` is how many `$1`.. its templates may use.
fn actions(at: &str, rule: &Rule, groups: usize, config: &Config, errs: &mut Vec<Invalid>) {
    let answers = [
        rule.redirect.is_some(),
        rule.respond.is_some(),
        rule.deny.is_some(),
    ];
    if answers.iter().filter(|a| **a).count() > 1 {
        errs.push(invalid(
            at.to_string(),
            "a rule answers one way: give one of `redirect`, `respond` and `deny`".into(),
        ));
    }
    let template =
        |key: String, t: &str, errs: &mut Vec<Invalid>| match crate::schema::template_parts(t) {
            Err(e) => errs.push(invalid(key, e)),
            Ok(parts) => {
                if let Some(TemplatePart::Group(n)) = parts
                    .iter()
                    .find(|p| matches!(p, TemplatePart::Group(n) if usize::from(*n) > groups))
                {
                    errs.push(invalid(
                        key,
                        format!(
                            "`${n}` names a group the rule's path_regex does not have ({groups})"
                        ),
                    ));
                }
            }
        };
    if let Some(r) = &rule.redirect {
        if !matches!(r.status, 301 | 302 | 303 | 307 | 308) {
            errs.push(invalid(
                format!("{at}.redirect.status"),
                format!(
                    "{} is not a redirect: use 301, 302, 303, 307 or 308",
                    r.status
                ),
            ));
        }
        template(format!("{at}.redirect.location"), &r.location, errs);
    }
    if let Some(r) = &rule.respond {
        if !(200..=599).contains(&r.status) || matches!(r.status, 204 | 205 | 304) {
            errs.push(invalid(
                format!("{at}.respond.status"),
                format!(
                    "{} is not a status a rule can answer with a body (200 to 599, not 204, 205 or 304, which end at their head)",
                    r.status
                ),
            ));
        }
        if r.body.len() > MAX_RESPOND_BODY {
            errs.push(invalid(
                format!("{at}.respond.body"),
                format!("{} bytes: a rule's body is at most 64 KiB", r.body.len()),
            ));
        }
        if r.content_type.contains(['\r', '\n', '\0']) {
            errs.push(invalid(
                format!("{at}.respond.content_type"),
                "a CR, LF or NUL has no place in a header field".into(),
            ));
        }
    }
    if let Some(d) = rule.deny
        && !(400..=499).contains(&d)
    {
        errs.push(invalid(
            format!("{at}.deny"),
            format!("{d} is not a 4xx status: deny answers 403 usually"),
        ));
    }
    for (side, acts) in [
        ("request_headers", &rule.request_headers),
        ("response_headers", &rule.response_headers),
    ] {
        fields(at, side, acts, config, errs, &template);
    }
    if let Some(c) = &rule.upstream {
        if !config.upstreams.contains_key(&c.to) {
            let defined: Vec<&str> = config.upstreams.keys().map(String::as_str).collect();
            errs.push(invalid(
                format!("{at}.upstream.to"),
                format!(
                    "upstream `{}` is not defined; defined: {}",
                    c.to,
                    defined.join(", ")
                ),
            ));
        }
        if !(0.0..=100.0).contains(&c.percent) {
            errs.push(invalid(
                format!("{at}.upstream.percent"),
                format!("{} is not a share: 0 to 100", c.percent),
            ));
        }
        let key_ok = matches!(c.key.as_str(), "client" | "url")
            || c.key.strip_prefix("header:").is_some_and(is_token);
        if !key_ok {
            errs.push(invalid(
                format!("{at}.upstream.key"),
                format!("`{}` is neither `client`, `url` nor `header:NAME`", c.key),
            ));
        }
    }
    if rule.ttl.is_some() && rule.bypass {
        errs.push(invalid(
            format!("{at}.ttl"),
            "a bypassed request stores nothing: `ttl` and `bypass` conflict".into(),
        ));
    }
    if rule.ttl.is_some_and(|t| t.is_zero()) {
        errs.push(invalid(
            format!("{at}.ttl"),
            "a ttl of 0 stores for nothing: use `bypass: true`".into(),
        ));
    }
    if let Some(l) = &rule.rate_limit {
        if let Err(e) = l.per_second() {
            errs.push(invalid(format!("{at}.rate_limit.rate"), e));
        }
        if l.burst == 0 {
            errs.push(invalid(
                format!("{at}.rate_limit.burst"),
                "a burst of 0 lets nothing through: at least 1".into(),
            ));
        }
        let key_ok = l.key == "client" || l.key.strip_prefix("header:").is_some_and(is_token);
        if !key_ok {
            errs.push(invalid(
                format!("{at}.rate_limit.key"),
                format!("`{}` is neither `client` nor `header:NAME`", l.key),
            ));
        }
    }
}

/// Checks one side's field edits.
fn fields(
    at: &str,
    side: &str,
    acts: &HeaderActions,
    config: &Config,
    errs: &mut Vec<Invalid>,
    template: &impl Fn(String, &str, &mut Vec<Invalid>),
) {
    let named = acts
        .set
        .keys()
        .map(|k| ("set", k))
        .chain(acts.append.keys().map(|k| ("append", k)))
        .chain(acts.remove.iter().map(|k| ("remove", k)));
    for (op, name) in named {
        let key = format!("{at}.{side}.{op}");
        if !is_token(name) {
            errs.push(invalid(key, format!("`{name}` is not a field name")));
        } else if NOT_EDITABLE.iter().any(|n| name.eq_ignore_ascii_case(n)) {
            errs.push(invalid(
                key,
                format!("`{name}` is the proxy's to write: a rule cannot set or remove it"),
            ));
        } else if side == "request_headers"
            && op != "remove"
            && REWRITTEN_UPSTREAM
                .iter()
                .chain(crate::validate::CLIENT_ADDRESS_FIELDS)
                .any(|n| name.eq_ignore_ascii_case(n))
        {
            errs.push(invalid(
                key,
                format!(
                    "`{name}` is written or scrubbed by the proxy when it forwards, so the origin would not see what the key and Vary saw"
                ),
            ));
        } else if side == "request_headers"
            && op != "remove"
            && let Some(why) = crate::validate::never_forwarded(config, name)
        {
            errs.push(invalid(
                key,
                format!("`{name}` is {why}, so setting it would reach no origin"),
            ));
        }
    }
    for (op, map) in [("set", &acts.set), ("append", &acts.append)] {
        for (name, value) in map {
            template(format!("{at}.{side}.{op}.{name}"), value, errs);
            if acts.remove.iter().any(|r| r.eq_ignore_ascii_case(name)) {
                errs.push(invalid(
                    format!("{at}.{side}.{op}.{name}"),
                    format!("`{name}` is both removed and written: conflicting actions"),
                ));
            }
        }
    }
}

/// A request edit whose value differs from request to request in a way the cache key does not
/// hold (`$client` always; `$query` when `cache_key.query: false`) would store one client's
/// answer for all: refused on a route that caches, unless the rule bypasses the cache.
fn per_request_values(at: &str, r: &Route, rule: &Rule, errs: &mut Vec<Invalid>) {
    if !r.cache || rule.bypass {
        return;
    }
    let acts = &rule.request_headers;
    for (op, map) in [("set", &acts.set), ("append", &acts.append)] {
        for (name, value) in map {
            let Ok(parts) = crate::schema::template_parts(value) else {
                continue;
            };
            let unkeyed = parts.iter().find_map(|p| match p {
                TemplatePart::Var(v @ "client") => Some(*v),
                TemplatePart::Var(v @ "query") if !r.cache_key.query => Some(*v),
                _ => None,
            });
            if let Some(v) = unkeyed {
                errs.push(invalid(
                    format!("{at}.request_headers.{op}.{name}"),
                    format!(
                        "`${v}` differs between requests that share a cache entry: one client's answer would be stored for all; add `bypass: true` to the rule or leave the route uncached"
                    ),
                ));
            }
        }
    }
}
