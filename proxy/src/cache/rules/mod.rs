//! A route's edge rules (`routes[].rules`) and query normalisation (`routes[].query`), run on
//! the request before its cache key is made: pure functions of the request, the client's
//! address and, for rate limits, the process's bucket table, beside [`super::decide`] and
//! tested the same way.
//!
//! Rules run in order and every one whose `match` holds acts, in this order within a rule:
//! its rate limit (past it: 429, and nothing after runs), its answer (`deny`, `respond` or
//! `redirect`: answered, nothing after runs), its request field edits (made at once, so later
//! rules and the key see them), `bypass`, and its response field edits (kept for the answer,
//! whoever makes it; also for a rule's own answer).
//!
//! The cache key follows what the origin is asked: a rule that edits the request on a condition
//! beyond the URL (a field, a cookie, the query, the client, the method or protocol) adds its
//! name to the key, so the response made for its matches is never served to the others.

pub(crate) mod action;
mod facts;
mod matcher;
pub(crate) mod query;

use crate::http::field_edit::FieldEdits;
use crate::http::request::RequestHead;
use crate::rate_limit::Limiter;
use action::{Edits, Template, Vars};
use matcher::{Matcher, Seen};
use std::net::IpAddr;
use std::sync::Arc;
use zerocache_ledger::{RouteCounters, RuleCounters};

/// A rule's own answer, as configured.
#[derive(Debug)]
enum Reply {
    Redirect(u16, Template),
    Respond(u16, Arc<str>, Arc<str>),
    Deny(u16),
}

/// Whose bucket a request takes from.
#[derive(Debug)]
enum LimitKey {
    Client,
    Url,
    Header(String),
}

impl LimitKey {
    fn of(key: &str) -> LimitKey {
        match (key, key.strip_prefix("header:")) {
            (_, Some(h)) => LimitKey::Header(h.to_string()),
            ("url", None) => LimitKey::Url,
            _ => LimitKey::Client,
        }
    }

    /// The key's value for `req` from `client`, hashed with `seed`.
    fn hash(&self, req: &RequestHead, client: IpAddr, seed: u64) -> u64 {
        use xxhash_rust::xxh3::xxh3_64_with_seed as h;
        match self {
            // An IPv6 client is its /64: one host is given a whole /64, and keying by /128
            // would give it a fresh bucket per address.
            LimitKey::Client => match client {
                IpAddr::V4(a) => h(&a.octets(), seed),
                IpAddr::V6(a) => h(&a.octets()[..8], seed),
            },
            LimitKey::Url => h(req.target.as_bytes(), seed),
            LimitKey::Header(name) => h(req.joined(name).unwrap_or_default().as_bytes(), seed),
        }
    }
}

#[derive(Debug)]
struct Limit {
    /// Tells this rule's buckets apart from every other's (route and rule names hashed).
    salt: u64,
    key: LimitKey,
    rate: f64,
    burst: f64,
}

/// `upstream:` of a rule, compiled.
#[derive(Debug)]
struct Split {
    to: String,
    /// This rule's own hash seed (route and rule names): two canaries split independently.
    seed: u64,
    /// Out of 10,000: a request whose key hashes below it goes `to`.
    below: u64,
    key: LimitKey,
}

/// One compiled rule.
#[derive(Debug)]
struct Rule {
    counters: &'static RuleCounters,
    matcher: Matcher,
    /// Request edits on a match beyond the URL: its name goes into the key.
    keyed: bool,
    /// Its templates use `path_regex`'s groups (else a match is a yes or no, no captures).
    groups: bool,
    request: Edits,
    response: Edits,
    reply: Option<Reply>,
    limit: Option<Limit>,
    bypass: bool,
    split: Option<Split>,
    ttl: Option<std::time::Duration>,
    /// It does nothing but edit the response (the usual rule: one step when it matches).
    response_only: bool,
}

/// What the rules answer a request with instead of the cache and the origin.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A redirect: status and `Location`.
    Redirect(u16, String),
    /// Status, body, `Content-Type`.
    Respond(u16, Arc<str>, Arc<str>),
    /// A 4xx with no more to say.
    Deny(u16),
    /// 429, and the seconds for `Retry-After`.
    Limited(u64),
}

/// What the rules decided for a request.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Answered here, if so.
    pub answer: Option<Answer>,
    /// Past the cache.
    pub bypass: bool,
    /// What the key adds: the names of the rules that edited the request on a match beyond the
    /// URL, in order.
    pub key_part: Option<String>,
    /// The rules that matched, a bit each by their place (at most 64 a route; counted
    /// already): the access log's `$rule` ([`Rules::matched`]).
    pub matched: u64,
    /// The upstream a canary rule chose (the last one that did).
    pub upstream: Option<String>,
    /// The freshness a rule gave what is stored (the last one that did).
    pub ttl: Option<std::time::Duration>,
}

/// A route's rules, compiled.
#[derive(Debug, Default)]
pub(crate) struct Rules {
    rules: Vec<Rule>,
    /// What each rule's conditions cannot hold without (a request that lacks it skips the
    /// rule), arranged to find the rules a request passes at once.
    prefilter: facts::Prefilter,
    /// What the rules' conditions need of a request, looked for once a request.
    wanted: facts::Wanted,
    /// Some rule has a rate limit (the clock is read only then).
    limits: bool,
}

impl Rules {
    /// Compiles a validated route's rules, counted under `counters`.
    pub(crate) fn new(
        r: &zerocache_config::Route,
        counters: &'static RouteCounters,
    ) -> Result<Rules, String> {
        let mut names = facts::FieldNames::default();
        let mut needs = Vec::with_capacity(r.rules.len());
        let rules = r
            .rules
            .iter()
            .map(|rule| {
                let matcher = Matcher::new(&rule.matcher)?;
                needs.push(matcher.needs(&mut names));
                let reply = if let Some(re) = &rule.redirect {
                    Some(Reply::Redirect(
                        re.status,
                        Template::new(&re.location, counters.name())?,
                    ))
                } else if let Some(re) = &rule.respond {
                    Some(Reply::Respond(
                        re.status,
                        Arc::from(re.body.as_str()),
                        Arc::from(re.content_type.as_str()),
                    ))
                } else {
                    rule.deny.map(Reply::Deny)
                };
                let limit = match &rule.rate_limit {
                    None => None,
                    Some(l) => Some(Limit {
                        salt: xxhash_rust::xxh3::xxh3_64(
                            format!("{}\n{}", counters.name(), rule.name).as_bytes(),
                        ),
                        key: LimitKey::of(&l.key),
                        rate: l.per_second()?,
                        burst: f64::from(l.burst),
                    }),
                };
                let request = Edits::new(&rule.request_headers, counters.name())?;
                let response = Edits::new(&rule.response_headers, counters.name())?;
                let groups = request.uses_groups()
                    || response.uses_groups()
                    || matches!(&reply, Some(Reply::Redirect(_, t)) if t.uses_groups());
                Ok(Rule {
                    groups,
                    counters: counters.rule(&rule.name),
                    // A ttl on a condition beyond the URL is a lifetime some clients choose for
                    // an entry others share: keyed like a request edit.
                    keyed: matcher.beyond_the_url() && (!request.is_empty() || rule.ttl.is_some()),
                    matcher,
                    request,
                    response,
                    reply,
                    limit,
                    bypass: rule.bypass,
                    split: rule.upstream.as_ref().map(|c| Split {
                        to: c.to.clone(),
                        seed: xxhash_rust::xxh3::xxh3_64(
                            format!("split\n{}\n{}", counters.name(), rule.name).as_bytes(),
                        ),
                        below: (c.percent * 100.0).round() as u64,
                        key: LimitKey::of(&c.key),
                    }),
                    ttl: rule.ttl,
                    response_only: false,
                })
                .map(|mut r| {
                    r.response_only = r.limit.is_none()
                        && r.reply.is_none()
                        && r.request.is_empty()
                        && !r.bypass
                        && r.split.is_none()
                        && r.ttl.is_none()
                        && !r.keyed;
                    r
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Rules {
            limits: rules.iter().any(|r| r.limit.is_some()),
            wanted: facts::Wanted::of(names, needs.iter()),
            prefilter: facts::Prefilter::of(&needs),
            rules,
        })
    }

    /// Whether there are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a rule has a rate limit, which needs the limiter's clock.
    pub(crate) fn needs_clock(&self) -> bool {
        self.limits
    }

    /// The counters (and names) of the rules in `matched`, in order.
    pub(crate) fn matched(&self, matched: u64) -> Vec<&'static RuleCounters> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < 64 && matched & (1 << i) != 0)
            .map(|(_, r)| r.counters)
            .collect()
    }

    /// Runs the rules on `req` from `client` at `now` (the limiter's clock, read by the caller
    /// when [`Rules::needs_clock`]); edits `req`, and adds the response edits to `response`.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn on_request(
        &self,
        req: &mut RequestHead,
        client: IpAddr,
        limiter: &Limiter,
        now: u64,
        response: &mut FieldEdits,
    ) -> Verdict {
        let shape = crate::http::target::path_shape(&req.target);
        self.on_request_shaped(req, shape, client, limiter, now, response)
    }

    /// [`Rules::on_request`] of a request whose target's path has `shape`
    /// (`http::target::path_shape`, found when it was routed: no rule edits the target, and the
    /// query rules before change only its query).
    pub(crate) fn on_request_shaped(
        &self,
        req: &mut RequestHead,
        (path_len, doubled): (usize, bool),
        client: IpAddr,
        limiter: &Limiter,
        now: u64,
        response: &mut FieldEdits,
    ) -> Verdict {
        debug_assert_eq!(
            (path_len, doubled),
            crate::http::target::path_shape(&req.target),
            "{}",
            req.target
        );
        let mut v = Verdict::default();
        let mut edits = FieldEdits::default();
        // The path and query once for all the rules (no rule edits the target): a copy only when
        // slashes were merged, and a request edit between rules needs `req` mutable, so the path
        // is held apart from it.
        let merged = doubled
            .then(|| crate::http::target::merged_slashes(&req.target[..path_len]).into_owned());
        let facts = self.wanted.facts(
            req,
            client,
            merged.as_deref().unwrap_or(&req.target[..path_len]),
            &req.target[path_len..],
        );
        let no_groups = Vec::new();
        // The rules whose needs the request meets, a bit each by place (at most 64 a route).
        let mut pass = self.prefilter.passing(&facts);
        while pass != 0 {
            let i = pass.trailing_zeros();
            pass &= pass - 1;
            let Some(rule) = self.rules.get(i as usize) else {
                break;
            };
            // The usual rule (a path prefix that sets fixed response fields): matched by its
            // needs, its edits made once.
            if rule.response_only
                && self.prefilter.decisive(i)
                && let Some(fixed) = rule.response.fixed()
            {
                rule.counters.matched();
                v.matched |= 1u64 << i;
                response.extend(fixed);
                continue;
            }
            let seen = Seen {
                path: merged.as_deref().unwrap_or(&req.target[..path_len]),
                query: &req.target[path_len..],
                req: &*req,
                client,
            };
            let found;
            let groups = if self.prefilter.decisive(i) {
                &no_groups
            } else {
                match rule.matcher.matches(&seen, rule.groups) {
                    Some(g) => {
                        found = g;
                        &found
                    }
                    None => continue,
                }
            };
            rule.counters.matched();
            v.matched |= 1u64 << i;
            let vars = Vars {
                seen: &seen,
                groups,
            };
            if rule.response_only {
                rule.response.render(&vars, response);
                continue;
            }
            if let Some(l) = &rule.limit {
                let key = l.key.hash(req, client, l.salt);
                if let Err(after) = limiter.take(key, l.rate, l.burst, now) {
                    rule.counters.limited();
                    rule.response.render(&vars, response);
                    v.answer = Some(Answer::Limited(after));
                    return v;
                }
            }
            if let Some(reply) = &rule.reply {
                v.answer = Some(match reply {
                    Reply::Redirect(status, t) => {
                        let mut location = t.render_string(&vars);
                        // `$path/` for `GET //evil.example/x` would say `//evil.example/x/`: a
                        // location that starts with a client's text starts with one `/`.
                        if t.starts_with_a_variable() && location.starts_with("//") {
                            location = format!("/{}", location.trim_start_matches('/'));
                        }
                        Answer::Redirect(*status, location)
                    }
                    Reply::Respond(status, body, ct) => {
                        Answer::Respond(*status, body.clone(), ct.clone())
                    }
                    Reply::Deny(status) => Answer::Deny(*status),
                });
                rule.response.render(&vars, response);
                return v;
            }
            edits.clear();
            if !rule.request.is_empty() {
                rule.request.render(&vars, &mut edits);
            }
            if !rule.response.is_empty() {
                rule.response.render(&vars, response);
            }
            v.bypass |= rule.bypass;
            v.ttl = rule.ttl.or(v.ttl);
            // The side is the same for a key at every request and every reload that keeps the
            // rule's name, so a client or an object stays where it went.
            let canary = rule
                .split
                .as_ref()
                .filter(|s| s.key.hash(req, client, s.seed) % 10_000 < s.below);
            if let Some(s) = canary {
                v.upstream = Some(s.to.clone());
            }
            if rule.keyed || canary.is_some() {
                let part = v.key_part.get_or_insert_with(String::new);
                if !part.is_empty() {
                    part.push(',');
                }
                part.push_str(rule.counters.name());
            }
            if !edits.is_empty() {
                action::apply_to_fields(&edits, &mut req.fields);
                // A later rule may need a field this one set or removed: the rules after this
                // one pass or not by the request as it is now.
                let facts = self.wanted.facts(
                    req,
                    client,
                    merged.as_deref().unwrap_or(&req.target[..path_len]),
                    &req.target[path_len..],
                );
                let after = u64::MAX.checked_shl(i + 1).unwrap_or(0);
                pass = self.prefilter.passing(&facts) & after;
            }
        }
        v
    }
}

#[cfg(test)]
mod tests;
