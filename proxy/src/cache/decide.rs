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

use crate::cache::invalidation;

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
}
