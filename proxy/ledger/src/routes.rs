//! Responses by route: what the `route` label of `zerocache_requests_total`,
//! `zerocache_responses_total` and `zerocache_request_duration_seconds` counts, so an SRE can
//! tell which route's hit ratio fell or which one answers 5xx. A route's counters are found by
//! its name (`routes[].name`, else its index) when the config is compiled and kept across
//! reloads, so a reload that keeps a name keeps its counts; `-` counts requests that matched no
//! route (a bad request before its head was whole, a request for no configured host). The label's values are the
//! names configured since start-up: bounded by the config, never by what clients send.

use crate::records::ResponseRecord;
use crate::vocabulary::{CacheStatus, Protocol};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The route label of a request that matched no route.
pub const NO_ROUTE: &str = "-";

/// Where a response came from: a client, or a fleet peer that forwarded its client's request.
const SOURCES: [&str; 2] = ["client", "peer"];

/// The status codes counted without a lock: every one RFC 9110 defines and the common extensions
/// (nginx's 499 among them). An origin's rarer code goes to a small map under a lock.
const CODES: [u16; 56] = [
    100, 101, 103, 200, 201, 202, 203, 204, 205, 206, 207, 300, 301, 302, 303, 304, 305, 307, 308,
    400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421,
    422, 425, 426, 428, 429, 431, 451, 499, 500, 501, 502, 503, 504, 505, 507, 508, 510, 511,
];

/// A code's place in [`CODES`].
fn slot(code: u16) -> Option<usize> {
    CODES.binary_search(&code).ok()
}

/// One route's counts.
pub struct RouteCounters {
    name: Box<str>,
    /// By protocol, source, cache status.
    requests: [[[AtomicU64; 7]; 2]; 2],
    /// By protocol, [`CODES`] slot and cache status: one relaxed add a response, no lock
    /// (all workers serve the same hot route).
    by_code: Box<[[[AtomicU64; 7]; CODES.len()]; 2]>,
    /// Codes outside [`CODES`], which only an unusual origin sends.
    other_codes: Mutex<HashMap<(Protocol, u16, CacheStatus), u64>>,
    /// `zerocache_request_duration_seconds{route=name}`, by cache status in
    /// [`CacheStatus::ALL`] order.
    durations: Vec<prometheus::Histogram>,
    /// Its rules' counts, by rule name (made when a config names them, kept as the route's are).
    rules: Mutex<Vec<&'static RuleCounters>>,
}

/// One rule's counts: `zerocache_rule_matches_total{route,rule}` and
/// `zerocache_rule_limited_total{route,rule}`.
#[derive(Debug)]
pub struct RuleCounters {
    name: Box<str>,
    matches: AtomicU64,
    limited: AtomicU64,
}

impl RuleCounters {
    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts a request it matched.
    pub fn matched(&self) {
        self.matches.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request its rate limit refused.
    pub fn limited(&self) {
        self.limited.fetch_add(1, Ordering::Relaxed);
    }

    /// (matches, refused by its rate limit).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.matches.load(Ordering::Relaxed),
            self.limited.load(Ordering::Relaxed),
        )
    }
}

impl std::fmt::Debug for RouteCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RouteCounters({})", self.name)
    }
}

impl RouteCounters {
    /// The route's name, as the label and the access log say it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The counters of its rule `name`, made on first use and kept for the process's life (a
    /// reload that keeps the name keeps the counts).
    pub fn rule(&self, name: &str) -> &'static RuleCounters {
        let mut rules = self.rules.lock();
        if let Some(r) = rules.iter().find(|r| &*r.name == name) {
            return r;
        }
        let r: &'static RuleCounters = Box::leak(Box::new(RuleCounters {
            name: name.into(),
            matches: AtomicU64::new(0),
            limited: AtomicU64::new(0),
        }));
        rules.push(r);
        r
    }

    /// Its rules' counters, in the order first configured.
    pub fn rules(&self) -> Vec<&'static RuleCounters> {
        self.rules.lock().clone()
    }

    /// Counts a response sent in `protocol`, to a fleet peer when `from_peer`.
    pub(crate) fn response(&self, protocol: Protocol, from_peer: bool, r: &ResponseRecord<'_>) {
        let cs = r.cache_status.index();
        self.requests[protocol.index()][usize::from(from_peer)][cs].fetch_add(1, Ordering::Relaxed);
        self.durations[cs].observe(r.duration.as_secs_f64());
        match slot(r.status) {
            Some(i) => {
                self.by_code[protocol.index()][i][cs].fetch_add(1, Ordering::Relaxed);
            }
            None if (100..600).contains(&r.status) => {
                *self
                    .other_codes
                    .lock()
                    .entry((protocol, r.status, r.cache_status))
                    .or_default() += 1;
            }
            None => {}
        }
    }

    /// Responses by (protocol, source, cache status, count), every combination a route can
    /// have: peers forward over HTTP/1.1 only.
    pub fn requests(&self) -> Vec<(Protocol, &'static str, CacheStatus, u64)> {
        let mut out = Vec::new();
        for p in Protocol::ALL {
            for (s, source) in SOURCES.iter().enumerate() {
                if p == Protocol::H2 && s == 1 {
                    continue;
                }
                for cs in CacheStatus::ALL {
                    let n = self.requests[p.index()][s][cs.index()].load(Ordering::Relaxed);
                    out.push((p, *source, cs, n));
                }
            }
        }
        out
    }

    /// Responses by (protocol, status code, cache status), the codes sent so far, sorted.
    pub fn by_code(&self) -> Vec<(Protocol, u16, CacheStatus, u64)> {
        let mut v: Vec<_> = self
            .other_codes
            .lock()
            .iter()
            .map(|((p, code, cs), n)| (*p, *code, *cs, *n))
            .collect();
        for p in Protocol::ALL {
            for (i, code) in CODES.iter().enumerate() {
                for cs in CacheStatus::ALL {
                    let n = self.by_code[p.index()][i][cs.index()].load(Ordering::Relaxed);
                    if n > 0 {
                        v.push((p, *code, cs, n));
                    }
                }
            }
        }
        v.sort_by_key(|(p, code, cs, _)| (p.index(), *code, cs.index()));
        v
    }
}

/// Every route's counters, by name. Each lives as long as the process (it is leaked when made):
/// a name's counts outlive every reload that keeps it, the set is bounded by the names
/// configured, and a request refers to its route's counters without a reference count that
/// every worker would bump on the same cache line.
pub(crate) struct RouteTable {
    routes: Mutex<Vec<&'static RouteCounters>>,
    /// Request durations by cache status and route.
    durations: prometheus::HistogramVec,
}

impl RouteTable {
    /// The table, with `-`'s counters made first (and returned: the accounting keeps them at
    /// hand, since a client decides how often a request matches no route).
    pub(crate) fn new(durations: prometheus::HistogramVec) -> (RouteTable, &'static RouteCounters) {
        let t = RouteTable {
            routes: Mutex::default(),
            durations,
        };
        let none = t.named(NO_ROUTE);
        (t, none)
    }

    /// The counters of the route named `name`, made on first use.
    pub(crate) fn named(&self, name: &str) -> &'static RouteCounters {
        let mut routes = self.routes.lock();
        if let Some(r) = routes.iter().find(|r| &*r.name == name) {
            return r;
        }
        let r: &'static RouteCounters = Box::leak(Box::new(RouteCounters {
            name: name.into(),
            requests: Default::default(),
            by_code: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| Default::default())
            })),
            other_codes: Mutex::default(),
            durations: CacheStatus::ALL
                .iter()
                .map(|cs| self.durations.with_label_values(&[cs.as_str(), name]))
                .collect(),
            rules: Mutex::default(),
        }));
        routes.push(r);
        r
    }

    /// Every route's counters, `-` first, then in the order they were first configured.
    pub(crate) fn all(&self) -> Vec<&'static RouteCounters> {
        self.routes.lock().clone()
    }

    pub(crate) fn durations(&self) -> &prometheus::HistogramVec {
        &self.durations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DataPath;
    use std::time::Duration;

    fn rec(status: u16, cs: CacheStatus) -> ResponseRecord<'static> {
        ResponseRecord {
            method: "GET",
            target: "/",
            status,
            cache_status: cs,
            head_bytes: 100,
            body_bytes: 10,
            path: DataPath::Copy,
            duration: Duration::from_millis(3),
            complete: true,
        }
    }

    #[test]
    fn a_route_is_found_by_its_name_and_counts_by_protocol_source_and_code() {
        let durations = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("d", "d"),
            &["cache_status", "route"],
        )
        .expect("histogram");
        let (t, _) = RouteTable::new(durations);
        let api = t.named("api");
        assert!(std::ptr::eq(api, t.named("api")), "one counter set a name");
        api.response(Protocol::Http1, false, &rec(200, CacheStatus::Hit));
        api.response(Protocol::Http1, true, &rec(200, CacheStatus::Hit));
        api.response(Protocol::H2, false, &rec(502, CacheStatus::Error));
        api.response(Protocol::Http1, false, &rec(299, CacheStatus::Miss));
        let n = |p: Protocol, source: &str, cs: CacheStatus| {
            api.requests()
                .into_iter()
                .find(|r| (r.0, r.1, r.2) == (p, source, cs))
                .map(|r| r.3)
        };
        assert_eq!(n(Protocol::Http1, "client", CacheStatus::Hit), Some(1));
        assert_eq!(n(Protocol::Http1, "peer", CacheStatus::Hit), Some(1));
        assert_eq!(n(Protocol::H2, "client", CacheStatus::Error), Some(1));
        assert_eq!(
            n(Protocol::H2, "peer", CacheStatus::Hit),
            None,
            "peers use HTTP/1.1"
        );
        assert_eq!(api.requests().len(), 3 * CacheStatus::ALL.len());
        assert!(
            CODES.windows(2).all(|w| w[0] < w[1]),
            "sorted for the search"
        );
        assert_eq!(
            api.by_code(),
            [
                (Protocol::Http1, 200, CacheStatus::Hit, 2),
                (Protocol::Http1, 299, CacheStatus::Miss, 1),
                (Protocol::H2, 502, CacheStatus::Error, 1)
            ]
        );
        assert_eq!(
            t.all()
                .iter()
                .map(|r| r.name().to_string())
                .collect::<Vec<_>>(),
            ["-", "api"]
        );
        let hits = t.durations().with_label_values(&["HIT", "api"]);
        assert_eq!(hits.get_sample_count(), 2);
    }
}
