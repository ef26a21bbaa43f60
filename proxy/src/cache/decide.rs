//! The cache's decision for one request, pure and synchronous: from what the request asks and
//! what is stored for it, a [`Plan`] that the connection carries out (`server/dispatch.rs`).
//!
//! Why apart: the rules of RFC 9111 about when a stored response may be used, when the origin
//! must be asked and what the answer may do to the store were spread through the request loop
//! between sockets and awaits, reachable only end to end. Here they are one function with no
//! I/O, tested as a table, and the same for any protocol that carries the request (HTTP/1.1
//! today, HTTP/2 next): nothing in it knows framing, sockets or the fleet.
//!
//! The lookup is a closure, called only when the plan depends on it: a request that bypasses the
//! cache never touches the store.

use crate::cache::conditional::Precondition;
use crate::cache::invalidation;
use crate::cache::policy::{NotStored, Storable};

/// What the request asks, as far as the decision goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask<'a> {
    /// The request method.
    pub method: &'a str,
    /// The route caches at all (`routes[].cache`).
    pub route_caches: bool,
    /// A bypass rule of the route matched the request.
    pub bypassed: bool,
    /// The request has a body.
    pub has_body: bool,
    /// The request has a `Range` field.
    pub has_range: bool,
    /// `Cache-Control: only-if-cached` (RFC 9111 §5.2.1.7).
    pub only_if_cached: bool,
}

/// What is stored for the request's key, as the freshness rules judge it for this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Nothing usable (nothing stored, another variant, or dropped).
    Nothing,
    /// Fresh enough for this request.
    Fresh,
    /// Stale, and this request accepts it as it is (`max-stale`, RFC 9111 §4.2.4).
    UsableStale,
    /// Stale and must be validated; `while_revalidating`: stale-while-revalidate lets it be
    /// served now while one background request validates it (RFC 5861 §3).
    MustRevalidate { while_revalidating: bool },
}

impl Stored {
    /// How the freshness rules judge the stored response `e` at `now` for a request with
    /// `directives` (RFC 9111 §4.2, §4.2.4; RFC 5861 §3).
    pub(crate) fn of(
        e: &crate::cache::entry::Entry,
        now: std::time::SystemTime,
        directives: &crate::cache::directives::RequestDirectives,
    ) -> Stored {
        use crate::cache::freshness::{self, Use};
        match freshness::decide(e.age(now), e.meta.lifetime, e.reuse, directives) {
            Use::Fresh => Stored::Fresh,
            Use::Stale => Stored::UsableStale,
            // stale-while-revalidate: serve it now and refresh it in the background, once,
            // when only its age (not the request) asks for validation.
            Use::Revalidate => Stored::MustRevalidate {
                while_revalidating: crate::cache::stale::while_revalidate(e, now, directives),
            },
        }
    }
}

/// How a miss goes forward, once its plan is one of [`Plan::RangeMiss`], [`Plan::Head`] and
/// [`Plan::Fill`]: what it does with the stored response it found, whether the key's fleet owner
/// is asked instead of the origin, and whether it takes the key's fill lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Miss {
    /// It revalidates or updates the (stale) stored response: `X-Cache: EXPIRED`.
    pub uses_stored: bool,
    /// The key's owner answers when it is another node: not for a peer's request (never
    /// forwarded twice), nor for one that revalidates or updates what this node stored, which
    /// this node's own entry answers for; a Range miss goes to the owner whatever is stored,
    /// since the owner fills the whole object.
    pub ask_owner: bool,
    /// It fills the key under its fill lock (a Range miss and a HEAD cannot fill the entry).
    pub takes_lock: bool,
    /// Without an owner to ask, a Range miss fills the whole object in the background.
    pub range_fill: bool,
}

impl Miss {
    /// The miss of `plan`, with a stored response `found` or not, for a peer's request
    /// (`from_peer`) or a client's. `None` for a plan that is no miss.
    pub(crate) fn of(plan: Plan, found: bool, from_peer: bool) -> Option<Miss> {
        let uses_stored = found
            && matches!(
                plan,
                Plan::Head { update: true } | Plan::Fill { revalidate: true }
            );
        let (ask_owner, takes_lock) = match plan {
            Plan::RangeMiss => (!from_peer, false),
            Plan::Head { .. } => (!from_peer && !uses_stored, false),
            Plan::Fill { .. } => (!from_peer && !uses_stored, true),
            _ => return None,
        };
        Some(Miss {
            uses_stored,
            ask_owner,
            takes_lock,
            range_fill: plan == Plan::RangeMiss,
        })
    }
}

/// How a stored response is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serve {
    Fresh,
    Stale,
}

/// What the connection is to do with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Forward it past the cache, the answer neither stored nor taken from the store. `detail`
    /// names why for `Cache-Status` (`method`, `bypass`); `invalidate`: an unsafe method on a
    /// caching route, whose success invalidates what it names (RFC 9111 §4.4).
    Bypass {
        detail: &'static str,
        invalidate: bool,
    },
    /// Forward it as a miss that is never stored (`why`: `request-body`, a GET or HEAD with a
    /// body, whose answer depends on bytes no key holds).
    Unstored(&'static str),
    /// Serve the stored response.
    Serve(Serve),
    /// Serve the stale stored response now and refresh it once in the background.
    ServeThenRefresh,
    /// Nothing usable is stored and the client forbids forwarding: 504 (RFC 9111 §5.2.1.7).
    GatewayTimeout,
    /// A GET with a `Range` and nothing stored: the range is forwarded and its 206 relayed,
    /// never stored; the whole object may be filled in the background.
    RangeMiss,
    /// A HEAD: forwarded without the fill lock (it cannot fill a GET entry). `update`: its 200
    /// updates the stale stored response, or marks it stale (RFC 9111 §4.3.5).
    Head { update: bool },
    /// Fetch under the key's fill lock, storing what is storable; `revalidate`: with the stale
    /// stored response's validators, so a 304 refreshes it (RFC 9111 §4.3).
    Fill { revalidate: bool },
}

impl Plan {
    /// The plan for `ask`, with `stored` judged only when the plan depends on it.
    pub(crate) fn of(ask: &Ask<'_>, stored: impl FnOnce() -> Stored) -> Plan {
        let cacheable_method = ask.method == "GET" || ask.method == "HEAD";
        if !ask.route_caches || !cacheable_method || ask.bypassed {
            return Plan::Bypass {
                detail: if ask.route_caches && !ask.bypassed {
                    "method"
                } else {
                    "bypass"
                },
                invalidate: ask.route_caches && !invalidation::is_safe(ask.method),
            };
        }
        if ask.has_body {
            return Plan::Unstored("request-body");
        }
        Plan::after_lookup(ask, stored())
    }

    /// The plan once the store has been asked, or asked again after a stored response turned
    /// out to be gone from disk (then with what is left of it: [`Stored::Nothing`] for a fresh
    /// or usable one, a revalidation without serving for a stale-while-revalidate one).
    pub(crate) fn after_lookup(ask: &Ask<'_>, stored: Stored) -> Plan {
        let stale = match stored {
            Stored::Fresh => return Plan::Serve(Serve::Fresh),
            Stored::UsableStale => return Plan::Serve(Serve::Stale),
            Stored::MustRevalidate {
                while_revalidating: true,
            } if ask.method == "GET" => return Plan::ServeThenRefresh,
            Stored::MustRevalidate { .. } => true,
            Stored::Nothing => false,
        };
        if ask.only_if_cached {
            Plan::GatewayTimeout
        } else if ask.method == "GET" && !stale && ask.has_range {
            Plan::RangeMiss
        } else if ask.method == "HEAD" {
            Plan::Head { update: stale }
        } else {
            Plan::Fill { revalidate: stale }
        }
    }
}

/// What a fetch does with the origin's answer (or its failure) before anything reaches the
/// client: the other half of the decision, once the origin has been asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// The origin failed or answered 5xx, and the stale response being revalidated may stand
    /// in for it (stale-if-error, RFC 5861 §4; `proxy.stale_grace`).
    ServeStale,
    /// A 304 to this cache's own revalidation: the stored response's fields are updated from it
    /// and the stored response is served (RFC 9111 §4.3.4).
    Refresh,
    /// The answer itself goes to the client: stored behind a fill when storable, else relayed.
    Relay,
    /// The origin failed and nothing may stand in: the client gets the failure's status.
    Fail,
}

/// The origin's side of a fetch, as the disposition sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// No response (refused, reset, timed out, misframed).
    Failed,
    /// A final response with this status.
    Status(u16),
}

impl Disposition {
    /// The disposition of `answer` to a fetch that was revalidating a stored response or not
    /// (`revalidating`); `stale_usable` says whether that response may stand in for an error,
    /// asked only when it matters.
    pub(crate) fn of(
        answer: Answer,
        revalidating: bool,
        stale_usable: impl FnOnce() -> bool,
    ) -> Disposition {
        let error = match answer {
            Answer::Failed => true,
            Answer::Status(s) => s >= 500,
        };
        if error && stale_usable() {
            return Disposition::ServeStale;
        }
        match answer {
            Answer::Failed => Disposition::Fail,
            Answer::Status(304) if revalidating => Disposition::Refresh,
            Answer::Status(_) => Disposition::Relay,
        }
    }
}

/// What becomes of an answer that goes to the client ([`Disposition::Relay`]): whether it is
/// stored, and whether the client gets it or the 304/412 it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relay {
    /// Stored behind a fill, with what to store (`Ok`); else not, and why when there is a why
    /// (`Cache-Status: detail=`).
    pub store: Result<Storable, Option<&'static str>>,
    /// `Proceed`: the client gets the answer. `NotModified`/`Failed`: the whole representation
    /// was fetched in place of the client's conditional request, and answers it with a 304 or
    /// 412 (RFC 9110 §13.2.2), while its body still goes into the cache.
    pub answer: Precondition,
}

/// What the relay decision reads of the fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Relaying {
    /// The answer's status.
    pub status: u16,
    /// The fetch would fill its key (`FetchOptions::fill`): the whole representation, the
    /// client's Range and preconditions not forwarded. Only a fill's answer may be stored or
    /// answer a precondition.
    pub fills: bool,
    /// Why the answer will not be stored, known before it came (a Range miss, a fat GET).
    pub not_stored: Option<&'static str>,
    /// The body's length, when its framing says it (`Content-Length`).
    pub length: Option<u64>,
    /// The key's last fill, of unknown length, ran past `max_body` a moment ago.
    pub oversized: bool,
    /// The largest body that may be stored: the route's `max_object_size`, and never more than
    /// the cache's `max_size` (an entry larger than the whole cache would evict everything
    /// else, then itself).
    pub max_body: u64,
    /// The smallest body that may be stored (the route's `min_object_size`).
    pub min_body: u64,
}

impl Relay {
    /// The relay of `r`'s answer. A fill's answer whose length is outside `min_body..=max_body`
    /// is not stored (`too-large`, `too-small`); one of unknown length is checked by its fill
    /// when it ends. Each closure is asked only when the decision needs it, in this order:
    /// `stores_here` (this node may keep it: not a fleet owner's answer beyond
    /// `local_hot_max`, which reserves room when it says yes), `storable` (RFC 9111 §3 under
    /// the route's rules, `cache/policy.rs`), `precondition` (the client's conditions against
    /// the answer's validators).
    pub(crate) fn of(
        r: Relaying,
        stores_here: impl FnOnce() -> bool,
        storable: impl FnOnce() -> Result<Storable, NotStored>,
        precondition: impl FnOnce() -> Precondition,
    ) -> Relay {
        let store = if !r.fills {
            Err(r.not_stored)
        } else if r.length.is_some_and(|n| n > r.max_body) || (r.length.is_none() && r.oversized) {
            Err(Some("too-large"))
        } else if stores_here() {
            // Too small only once storable: a small no-store answer says `response-directive`.
            storable()
                .map_err(|why| Some(why.token()))
                .and_then(|st| match r.length {
                    Some(n) if n < r.min_body => Err(Some("too-small")),
                    _ => Ok(st),
                })
        } else {
            Err(r.not_stored)
        };
        let answer = if r.fills && (200..300).contains(&r.status) {
            precondition()
        } else {
            Precondition::Proceed
        };
        Relay { store, answer }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: Ask<'static> = Ask {
        method: "GET",
        route_caches: true,
        bypassed: false,
        has_body: false,
        has_range: false,
        only_if_cached: false,
    };

    fn never() -> Stored {
        panic!("the store must not be asked")
    }

    const SWR: Stored = Stored::MustRevalidate {
        while_revalidating: true,
    };
    const REVALIDATE: Stored = Stored::MustRevalidate {
        while_revalidating: false,
    };

    /// How a stored response is judged, by age and by what the request asks: a 60 s lifetime
    /// with `stale-while-revalidate=30`, at 10 s (fresh), 70 s (in the window), 100 s (past it);
    /// a request's `no-cache` forces validation without the window, `max-stale` takes it stale.
    #[test]
    fn a_stored_response_is_judged_by_its_age_and_the_request() {
        use crate::cache::directives::request;
        use std::time::{Duration, SystemTime};
        let stored_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let meta = crate::cache::entry::Meta {
            key: "GET|http|a.example|/x".into(),
            stored_at,
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            status: 200,
            reason: "OK".into(),
            fields: b"Cache-Control: max-age=60, stale-while-revalidate=30\r\n".to_vec(),
            vary: Vec::new(),
            url: "GET|http|a.example|/x".into(),
        };
        let e = crate::cache::entry::Entry::new(
            1,
            meta,
            "/nonexistent".into(),
            0,
            0,
            &crate::cache::targeted::Targeted::default(),
        );
        let at = |s: u64| stored_at + Duration::from_secs(s);
        let plain = request(None, None);
        assert_eq!(Stored::of(&e, at(10), &plain), Stored::Fresh);
        assert_eq!(Stored::of(&e, at(70), &plain), SWR);
        assert_eq!(Stored::of(&e, at(100), &plain), REVALIDATE);
        let no_cache = request(Some("no-cache"), None);
        assert_eq!(Stored::of(&e, at(10), &no_cache), REVALIDATE);
        assert_eq!(Stored::of(&e, at(70), &no_cache), REVALIDATE);
        let max_stale = request(Some("max-stale=60"), None);
        assert_eq!(Stored::of(&e, at(100), &max_stale), Stored::UsableStale);
    }

    /// How each miss goes forward, whether something was stored and whose request it is.
    #[test]
    fn a_miss_asks_the_owner_unless_it_answers_for_its_own_entry() {
        let m = |plan, found, from_peer| Miss::of(plan, found, from_peer).expect("a miss");
        let fill = |revalidate| Plan::Fill { revalidate };
        let head = |update| Plan::Head { update };
        let t = |uses_stored, ask_owner, takes_lock, range_fill| Miss {
            uses_stored,
            ask_owner,
            takes_lock,
            range_fill,
        };
        assert_eq!(m(fill(false), false, false), t(false, true, true, false));
        assert_eq!(m(fill(true), true, false), t(true, false, true, false));
        // A revalidation planned, yet nothing found (gone meanwhile): a plain fill.
        assert_eq!(m(fill(true), false, false), t(false, true, true, false));
        assert_eq!(m(fill(false), false, true), t(false, false, true, false));
        assert_eq!(m(head(false), false, false), t(false, true, false, false));
        assert_eq!(m(head(true), true, false), t(true, false, false, false));
        assert_eq!(m(head(true), true, true), t(true, false, false, false));
        assert_eq!(m(Plan::RangeMiss, true, false), t(false, true, false, true));
        assert_eq!(
            m(Plan::RangeMiss, false, true),
            t(false, false, false, true)
        );
        assert_eq!(Miss::of(Plan::Serve(Serve::Fresh), true, false), None);
        assert_eq!(Miss::of(Plan::GatewayTimeout, false, false), None);
    }

    /// Past the cache without asking the store: a route that does not cache, a method that is
    /// not GET or HEAD (RFC 9111 §2), a bypass rule; an unsafe method on a caching route
    /// invalidates (§4.4), a safe one or a non-caching route does not.
    #[test]
    fn bypasses_never_ask_the_store() {
        let post = Ask {
            method: "POST",
            ..GET
        };
        assert_eq!(
            Plan::of(&post, never),
            Plan::Bypass {
                detail: "method",
                invalidate: true
            }
        );
        let options = Ask {
            method: "OPTIONS",
            ..GET
        };
        assert_eq!(
            Plan::of(&options, never),
            Plan::Bypass {
                detail: "method",
                invalidate: false
            }
        );
        let bypassed_delete = Ask {
            method: "DELETE",
            bypassed: true,
            ..GET
        };
        assert_eq!(
            Plan::of(&bypassed_delete, never),
            Plan::Bypass {
                detail: "bypass",
                invalidate: true
            }
        );
        let uncached = Ask {
            route_caches: false,
            ..post
        };
        assert_eq!(
            Plan::of(&uncached, never),
            Plan::Bypass {
                detail: "bypass",
                invalidate: false
            }
        );
        let bypassed_get = Ask {
            bypassed: true,
            ..GET
        };
        assert_eq!(
            Plan::of(&bypassed_get, never),
            Plan::Bypass {
                detail: "bypass",
                invalidate: false
            }
        );
        // A GET or HEAD with a body: forwarded as a miss, never stored, store not asked.
        for method in ["GET", "HEAD"] {
            let with_body = Ask {
                method,
                has_body: true,
                ..GET
            };
            assert_eq!(Plan::of(&with_body, never), Plan::Unstored("request-body"));
        }
    }

    /// A fresh or acceptably stale response is served, whatever else the request says (its
    /// Range and conditionals are the hit's business); one that must be validated is served
    /// under stale-while-revalidate to a GET only.
    #[test]
    fn what_is_stored_is_served_when_it_may_be() {
        let ranged = Ask {
            has_range: true,
            only_if_cached: true,
            ..GET
        };
        for ask in [
            GET,
            ranged,
            Ask {
                method: "HEAD",
                ..GET
            },
        ] {
            assert_eq!(Plan::of(&ask, || Stored::Fresh), Plan::Serve(Serve::Fresh));
            assert_eq!(
                Plan::of(&ask, || Stored::UsableStale),
                Plan::Serve(Serve::Stale)
            );
        }
        assert_eq!(Plan::of(&GET, || SWR), Plan::ServeThenRefresh);
        assert_eq!(
            Plan::of(
                &Ask {
                    method: "HEAD",
                    ..GET
                },
                || SWR
            ),
            Plan::Head { update: true }
        );
    }

    /// Nothing usable: only-if-cached gets a 504 (§5.2.1.7), even with a stale response
    /// stored; a Range miss is forwarded as a range, but a Range on a stale entry revalidates
    /// the whole; a HEAD never takes the fill lock; the rest fills, revalidating a stale one.
    #[test]
    fn without_a_usable_response() {
        let only = Ask {
            only_if_cached: true,
            ..GET
        };
        assert_eq!(Plan::of(&only, || Stored::Nothing), Plan::GatewayTimeout);
        assert_eq!(Plan::of(&only, || REVALIDATE), Plan::GatewayTimeout);
        let ranged = Ask {
            has_range: true,
            ..GET
        };
        assert_eq!(Plan::of(&ranged, || Stored::Nothing), Plan::RangeMiss);
        assert_eq!(
            Plan::of(&ranged, || REVALIDATE),
            Plan::Fill { revalidate: true }
        );
        let head = Ask {
            method: "HEAD",
            has_range: true,
            ..GET
        };
        assert_eq!(
            Plan::of(&head, || Stored::Nothing),
            Plan::Head { update: false }
        );
        assert_eq!(Plan::of(&head, || REVALIDATE), Plan::Head { update: true });
        assert_eq!(
            Plan::of(&GET, || Stored::Nothing),
            Plan::Fill { revalidate: false }
        );
        assert_eq!(
            Plan::of(&GET, || REVALIDATE),
            Plan::Fill { revalidate: true }
        );
    }

    /// After the origin answers: stale-if-error stands in for a failure or a 5xx only when
    /// allowed; a 304 refreshes only this cache's own revalidation (a client's conditional 304
    /// is relayed); everything else is relayed.
    #[test]
    fn what_becomes_of_the_origins_answer() {
        let yes = || true;
        let no = || false;
        assert_eq!(
            Disposition::of(Answer::Failed, true, yes),
            Disposition::ServeStale
        );
        assert_eq!(Disposition::of(Answer::Failed, true, no), Disposition::Fail);
        assert_eq!(
            Disposition::of(Answer::Failed, false, no),
            Disposition::Fail
        );
        for s in [500, 502, 503, 504, 599] {
            assert_eq!(
                Disposition::of(Answer::Status(s), true, yes),
                Disposition::ServeStale
            );
            assert_eq!(
                Disposition::of(Answer::Status(s), true, no),
                Disposition::Relay
            );
        }
        // A 4xx is an answer, not an error: never replaced by the stale response.
        let not_asked = || -> bool { panic!("stale-if-error asked for a 404") };
        assert_eq!(
            Disposition::of(Answer::Status(404), true, not_asked),
            Disposition::Relay
        );
        assert_eq!(
            Disposition::of(Answer::Status(304), true, no),
            Disposition::Refresh
        );
        assert_eq!(
            Disposition::of(Answer::Status(304), false, no),
            Disposition::Relay
        );
        assert_eq!(
            Disposition::of(Answer::Status(200), true, no),
            Disposition::Relay
        );
    }

    /// A stored response that vanished from disk is planned again as what is left of it.
    #[test]
    fn a_vanished_response_is_planned_again() {
        assert_eq!(
            Plan::after_lookup(&GET, Stored::Nothing),
            Plan::Fill { revalidate: false }
        );
        // The stale-while-revalidate entry that vanished is still revalidated, not served.
        assert_eq!(
            Plan::after_lookup(&GET, REVALIDATE),
            Plan::Fill { revalidate: true }
        );
    }

    /// A fill's answer of `status`: 1 MiB, within any size bound.
    fn fill_of(status: u16) -> Relaying {
        Relaying {
            status,
            fills: true,
            not_stored: None,
            length: Some(1 << 20),
            oversized: false,
            max_body: 1 << 30,
            min_body: 0,
        }
    }

    fn stored() -> Storable {
        Storable {
            lifetime: std::time::Duration::from_secs(60),
            source: crate::cache::freshness::Source::Explicit,
            initial_age: std::time::Duration::ZERO,
            fields: b"ETag: \"a\"\r\n".to_vec(),
            vary: Vec::new(),
        }
    }

    /// Only a fill's answer is stored or answers a precondition: a bypass or a Range miss keeps
    /// the reason it had before the answer, and neither the policy nor the client's conditions
    /// are asked for it.
    #[test]
    fn only_a_fills_answer_is_stored_or_answers_a_precondition() {
        let not_asked = || -> bool { panic!("stores_here asked") };
        let not_judged = || -> Result<Storable, NotStored> { panic!("storable asked") };
        let no_conditions = || -> Precondition { panic!("precondition asked") };
        let range_miss = Relaying {
            status: 206,
            fills: false,
            not_stored: Some("range"),
            length: None,
            oversized: false,
            max_body: 1 << 30,
            min_body: 0,
        };
        assert_eq!(
            Relay::of(range_miss, not_asked, not_judged, no_conditions),
            Relay {
                store: Err(Some("range")),
                answer: Precondition::Proceed
            }
        );
        let bypass = Relaying {
            status: 200,
            fills: false,
            not_stored: None,
            length: Some(10),
            oversized: false,
            max_body: 1 << 30,
            min_body: 0,
        };
        assert_eq!(
            Relay::of(bypass, not_asked, not_judged, no_conditions),
            Relay {
                store: Err(None),
                answer: Precondition::Proceed
            }
        );
    }

    /// A fill's answer: stored when the policy allows and this node keeps it; the policy's
    /// reason when not; a fleet owner's answer this node may not keep is relayed, not judged.
    #[test]
    fn a_fills_answer_is_stored_as_the_policy_and_the_fleet_allow() {
        let fill = fill_of;
        let proceed = || Precondition::Proceed;
        assert_eq!(
            Relay::of(fill(200), || true, || Ok(stored()), proceed),
            Relay {
                store: Ok(stored()),
                answer: Precondition::Proceed
            }
        );
        assert_eq!(
            Relay::of(fill(200), || true, || Err(NotStored::Directive), proceed).store,
            Err(Some("response-directive"))
        );
        assert_eq!(
            Relay::of(fill(503), || true, || Err(NotStored::ServerError), proceed).store,
            Err(Some("server-error"))
        );
        let not_judged = || -> Result<Storable, NotStored> { panic!("storable asked") };
        assert_eq!(
            Relay::of(fill(200), || false, not_judged, proceed).store,
            Err(None)
        );
    }

    /// The client's conditions are answered from a fill's 2xx alone (RFC 9110 §13.2.2): a 304
    /// or 412 in place of the body, which is stored all the same; a 3xx, 4xx or 5xx goes to the
    /// client as it is.
    #[test]
    fn a_fills_2xx_answers_the_clients_precondition() {
        let fill = fill_of;
        for (p, status) in [
            (Precondition::NotModified, 200),
            (Precondition::Failed, 200),
            (Precondition::NotModified, 204),
        ] {
            assert_eq!(
                Relay::of(fill(status), || true, || Ok(stored()), || p),
                Relay {
                    store: Ok(stored()),
                    answer: p
                }
            );
        }
        let no_conditions = || -> Precondition { panic!("precondition asked") };
        for status in [301, 404, 500] {
            assert_eq!(
                Relay::of(
                    fill(status),
                    || true,
                    || Err(NotStored::Status),
                    no_conditions
                )
                .answer,
                Precondition::Proceed
            );
        }
    }

    /// A fill's answer longer than the whole cache is relayed, not stored (`too-large`), and
    /// neither the fleet's budget nor the policy is asked; at the bound, or of unknown length
    /// (the fill checks it when it ends), it is judged as any other.
    #[test]
    fn a_body_larger_than_the_cache_is_not_stored() {
        let fill = |length| Relaying {
            status: 200,
            fills: true,
            not_stored: None,
            length,
            oversized: false,
            max_body: 4 << 20,
            min_body: 0,
        };
        let not_asked = || -> bool { panic!("stores_here asked") };
        let not_judged = || -> Result<Storable, NotStored> { panic!("storable asked") };
        let proceed = || Precondition::Proceed;
        assert_eq!(
            Relay::of(fill(Some((4 << 20) + 1)), not_asked, not_judged, proceed),
            Relay {
                store: Err(Some("too-large")),
                answer: Precondition::Proceed
            }
        );
        for length in [Some(4 << 20), None, Some(0)] {
            assert_eq!(
                Relay::of(fill(length), || true, || Ok(stored()), proceed).store,
                Ok(stored())
            );
        }
        // Of unknown length again, after the key's last such fill ran past the bound: relayed
        // as too large from the start, where it said `stored` each time and never was. A known
        // length is judged by itself.
        let again = |length| Relaying {
            oversized: true,
            ..fill(length)
        };
        assert_eq!(
            Relay::of(again(None), not_asked, not_judged, proceed).store,
            Err(Some("too-large"))
        );
        assert_eq!(
            Relay::of(again(Some(10)), || true, || Ok(stored()), proceed).store,
            Ok(stored())
        );
    }

    /// The route's object sizes: outside them a known length is relayed, not stored, and the
    /// bounds themselves are stored. Too large is known before anything is asked; too small
    /// only of a storable answer, so a small no-store answer keeps its own reason.
    #[test]
    fn a_known_length_outside_the_routes_sizes_is_not_stored() {
        let fill = |length| Relaying {
            status: 200,
            fills: true,
            not_stored: None,
            length: Some(length),
            oversized: false,
            max_body: 1 << 20,
            min_body: 1024,
        };
        let proceed = || Precondition::Proceed;
        let not_asked = || -> bool { panic!("stores_here asked") };
        let not_judged = || -> Result<Storable, NotStored> { panic!("storable asked") };
        assert_eq!(
            Relay::of(fill((1 << 20) + 1), not_asked, not_judged, proceed).store,
            Err(Some("too-large"))
        );
        for length in [1023, 0] {
            assert_eq!(
                Relay::of(fill(length), || true, || Ok(stored()), proceed).store,
                Err(Some("too-small")),
                "{length}"
            );
            assert_eq!(
                Relay::of(fill(length), || true, || Err(NotStored::Directive), proceed).store,
                Err(Some("response-directive")),
                "{length}"
            );
        }
        for length in [1024, 1 << 20] {
            assert_eq!(
                Relay::of(fill(length), || true, || Ok(stored()), proceed).store,
                Ok(stored()),
                "{length}"
            );
        }
    }
}
