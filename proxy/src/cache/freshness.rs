//! Freshness and age (RFC 9111 §4.2): how long a response stays fresh, how old a stored one is,
//! and whether a request may be answered with it, given the request's own directives.

use super::directives::{self, RequestDirectives, ResponseDirectives};
use crate::http::response::ResponseHead;
use std::time::{Duration, SystemTime};

/// Statuses RFC 9110 §15.1 lets a cache store without explicit freshness.
pub const HEURISTIC_STATUSES: [u16; 12] =
    [200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501];

/// Where a freshness lifetime came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `s-maxage`, `max-age` or `Expires`.
    Explicit,
    /// 10% of the time since `Last-Modified`, capped (§4.2.2).
    Heuristic,
    /// The route's `default_ttl`.
    Configured,
}

/// How freshness is computed where the origin gives none.
#[derive(Debug, Clone, Copy)]
pub struct Heuristics<'a> {
    /// Cap of the Last-Modified heuristic.
    pub max: Duration,
    /// The route's `default_ttl`.
    pub default_ttl: Option<Duration>,
    /// The route's `status_ttl`.
    pub status_ttl: Option<&'a zerocache_config::StatusTtl>,
    /// An edge rule's `ttl`: the lifetime whatever the response says (the caller has refused
    /// `no-store` and `private` already).
    pub forced: Option<Duration>,
}

/// The freshness lifetime of `res` (§4.2.1): `s-maxage` over `max-age` over `Expires`; an invalid
/// `Expires` (including `0`) means already stale. Without any: the route's `status_ttl` for its
/// status (an operator's override of §4.2.2, for any status), else a heuristic lifetime for the
/// statuses that allow one: the route's `default_ttl` when set, else 10% of the time since
/// `Last-Modified`. `None`: not storable for lack of freshness.
///
/// `default_ttl` comes before the `Last-Modified` heuristic: an operator who writes
/// `default_ttl: 2m` means two minutes, as nginx's `proxy_cache_valid` does (it has no heuristic),
/// and a file modified a minute ago must not get six seconds instead. §4.2.2 leaves the
/// heuristic to the cache; the route's is the operator's.
pub fn lifetime(
    res: &ResponseHead,
    d: &ResponseDirectives,
    targeted: bool,
    response_time: SystemTime,
    h: Heuristics,
) -> Option<(Duration, Source)> {
    let date = res
        .field("date")
        .and_then(crate::http::date::parse)
        .unwrap_or(response_time);
    if let Some(t) = h.forced.filter(|_| FORCED_STATUSES.contains(&res.status)) {
        return Some((t, Source::Configured));
    }
    if let Some(s) = d.s_maxage.or(d.max_age) {
        return Some((Duration::from_secs(s), Source::Explicit));
    }
    // A targeted field (RFC 9213) replaces Expires as well as Cache-Control.
    // Joined: two Expires lines make a list, which is no date, so the response is already
    // expired (RFC 9111 §5.3) rather than fresh until whichever line came first.
    if let Some(expires) = res.joined("expires").filter(|_| !targeted) {
        let life = match crate::http::date::parse(&expires) {
            Some(exp) => exp.duration_since(date).unwrap_or_default(),
            None => Duration::ZERO,
        };
        return Some((life, Source::Explicit));
    }
    if let Some(ttl) = h.status_ttl.and_then(|t| t.of(res.status)) {
        return Some((ttl, Source::Configured));
    }
    if !HEURISTIC_STATUSES.contains(&res.status) {
        return None;
    }
    if let Some(t) = h.default_ttl {
        return Some((t, Source::Configured));
    }
    if let Some(lm) = res
        .field("last-modified")
        .and_then(crate::http::date::parse)
        && let Ok(since) = date.duration_since(lm)
    {
        return Some(((since / 10).min(h.max), Source::Heuristic));
    }
    None
}

/// The statuses an edge rule's `ttl` may give a lifetime to, over the origin's freshness: the
/// successes and permanent redirects that say the same to everyone (nginx's
/// `proxy_cache_valid 10m` alone covers 200, 301 and 302). Never an error a client can cause
/// for everyone (a 400, 403, 404, 429 or 431 the origin made for one request), which keeps the
/// origin's own freshness or none.
const FORCED_STATUSES: [u16; 5] = [200, 203, 300, 301, 308];

/// The corrected initial age (§4.2.3): the larger of the apparent age (`response_time − Date`)
/// and the received `Age` plus the response delay.
pub fn initial_age(
    res: &ResponseHead,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Duration {
    let age_value = res
        .field("age")
        .and_then(age_seconds)
        .map(Duration::from_secs)
        .unwrap_or_default();
    let apparent = res
        .field("date")
        .and_then(crate::http::date::parse)
        .and_then(|d| response_time.duration_since(d).ok())
        .unwrap_or_default();
    let delay = response_time
        .duration_since(request_time)
        .unwrap_or_default();
    apparent.max(age_value.saturating_add(delay))
}

/// The largest age a cache needs to represent (RFC 9111 §1.2.2): larger values saturate here.
const AGE_MAX: u64 = 1 << 31;

/// An `Age` value in seconds: its first list member, `1*DIGIT`, saturated at 2^31. Anything
/// else (a sign, a fraction, a parameter) makes the field count as absent.
fn age_seconds(v: &str) -> Option<u64> {
    let first = v.split(',').next()?.trim_matches([' ', '\t']);
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(first.parse::<u64>().unwrap_or(u64::MAX).min(AGE_MAX))
}

/// What a stored response's own directives demand of its reuse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reuse {
    /// `no-cache`: revalidate before every use.
    pub always_revalidate: bool,
    /// `must-revalidate`, `proxy-revalidate` or `s-maxage` (which carries proxy-revalidate's
    /// meaning for a shared cache, RFC 9111 §5.2.2.10): never serve stale.
    pub no_stale: bool,
    /// `immutable`: a fresh response needs no revalidation even when the client asks for one.
    pub immutable: bool,
}

impl Reuse {
    /// From stored response directives.
    pub fn of(d: &ResponseDirectives) -> Reuse {
        Reuse {
            always_revalidate: d.no_cache,
            no_stale: d.must_revalidate || d.proxy_revalidate || d.s_maxage.is_some(),
            immutable: d.immutable,
        }
    }
}

/// How a request may use a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Serve it.
    Fresh,
    /// Serve it although stale: the client allowed it with `max-stale`.
    Stale,
    /// Revalidate with the origin first.
    Revalidate,
}

/// Decides how `req` may use a response of `age` and `lifetime` (§4, §5.2.1).
pub fn decide(age: Duration, lifetime: Duration, reuse: Reuse, req: &RequestDirectives) -> Use {
    let fresh = age < lifetime;
    if reuse.always_revalidate {
        return Use::Revalidate;
    }
    if req.no_cache && !(reuse.immutable && fresh) {
        return Use::Revalidate;
    }
    if req.max_age.is_some_and(|m| age > Duration::from_secs(m)) {
        return Use::Revalidate;
    }
    if let Some(mf) = req.min_fresh
        && age + Duration::from_secs(mf) >= lifetime
    {
        return Use::Revalidate;
    }
    if fresh {
        return Use::Fresh;
    }
    let staleness = age - lifetime;
    match req.max_stale {
        Some(limit)
            if !reuse.no_stale && limit.is_none_or(|l| staleness <= Duration::from_secs(l)) =>
        {
            Use::Stale
        }
        _ => Use::Revalidate,
    }
}

/// Parses the request's directives (Cache-Control, or Pragma without it).
pub fn request_directives(req: &crate::http::request::RequestHead) -> RequestDirectives {
    directives::request(req.field("cache-control"), req.field("pragma"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(extra: &str) -> ResponseHead {
        crate::http::response::test_response(200, extra)
    }
    const H: Heuristics<'static> = Heuristics {
        max: Duration::from_secs(86_400),
        default_ttl: None,
        status_ttl: None,
        forced: None,
    };
    fn life(extra: &str, t: SystemTime) -> Option<(Duration, Source)> {
        let r = res(extra);
        let (d, targeted) = crate::cache::targeted::Targeted::default().governing(|n| r.joined(n));
        lifetime(&r, &d, targeted, t, H)
    }

    #[test]
    fn rfc9111_4_2_1_precedence_and_invalid_expires() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let date = httpdate::fmt_http_date(t - Duration::from_secs(7));
        let exp = httpdate::fmt_http_date(t + Duration::from_secs(93));
        let both = format!("Cache-Control: max-age=60, s-maxage=10\r\nExpires: {exp}\r\n");
        assert_eq!(
            life(&both, t),
            Some((Duration::from_secs(10), Source::Explicit))
        );
        assert_eq!(
            life("Cache-Control: max-age=60\r\n", t),
            Some((Duration::from_secs(60), Source::Explicit))
        );
        assert_eq!(
            life(&format!("Date: {date}\r\nExpires: {exp}\r\n"), t),
            Some((Duration::from_secs(100), Source::Explicit))
        );
        assert_eq!(
            life(
                &format!("Date: {date}\r\nExpires: {exp}\r\nExpires: {exp}\r\n"),
                t
            ),
            Some((Duration::ZERO, Source::Explicit)),
            "two Expires lines are invalid, so already expired"
        );
        assert_eq!(
            life("Expires: 0\r\n", t),
            Some((Duration::ZERO, Source::Explicit))
        );
        assert_eq!(life("", t), None);
    }

    #[test]
    fn rfc9111_4_2_2_heuristic_is_a_tenth_of_last_modified_capped() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000_000);
        let lm = httpdate::fmt_http_date(t - Duration::from_secs(1000));
        let date = httpdate::fmt_http_date(t);
        assert_eq!(
            life(&format!("Date: {date}\r\nLast-Modified: {lm}\r\n"), t),
            Some((Duration::from_secs(100), Source::Heuristic))
        );
        let old = httpdate::fmt_http_date(t - Duration::from_secs(9_000_000));
        assert_eq!(
            life(&format!("Last-Modified: {old}\r\n"), t),
            Some((Duration::from_secs(86_400), Source::Heuristic))
        );
    }

    /// `default_ttl: 2m` gave a file modified 30 s ago 3 s of freshness (the heuristic won): the
    /// route's lifetime comes first, for the statuses a heuristic may cover, and never over
    /// explicit freshness or for a status §4.2.2 leaves unstored.
    #[test]
    fn default_ttl_comes_before_the_last_modified_heuristic() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000_000);
        let lm = httpdate::fmt_http_date(t - Duration::from_secs(30));
        let date = httpdate::fmt_http_date(t);
        let h = Heuristics {
            default_ttl: Some(Duration::from_secs(120)),
            ..H
        };
        let of = |status: u16, extra: &str| {
            let r = crate::http::response::test_response(status, extra);
            let (d, targeted) =
                crate::cache::targeted::Targeted::default().governing(|n| r.joined(n));
            lifetime(&r, &d, targeted, t, h)
        };
        let recent = format!("Date: {date}\r\nLast-Modified: {lm}\r\n");
        assert_eq!(
            of(200, &recent),
            Some((Duration::from_secs(120), Source::Configured))
        );
        assert_eq!(
            life(&recent, t),
            Some((Duration::from_secs(3), Source::Heuristic)),
            "without default_ttl, the heuristic"
        );
        assert_eq!(
            of(200, &format!("{recent}Cache-Control: max-age=5\r\n")),
            Some((Duration::from_secs(5), Source::Explicit))
        );
        assert_eq!(of(302, &recent), None, "302 allows no heuristic");
    }

    #[test]
    fn rfc9111_4_2_3_age_calculation() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let date = httpdate::fmt_http_date(t - Duration::from_secs(30));
        // Apparent age 30 s beats Age 10 + 2 s delay.
        assert_eq!(
            initial_age(
                &res(&format!("Date: {date}\r\nAge: 10\r\n")),
                t - Duration::from_secs(2),
                t
            ),
            Duration::from_secs(30)
        );
        // Age 100 + 2 s delay beats apparent age 30 s.
        assert_eq!(
            initial_age(
                &res(&format!("Date: {date}\r\nAge: 100\r\n")),
                t - Duration::from_secs(2),
                t
            ),
            Duration::from_secs(102)
        );
    }

    #[test]
    fn rfc9111_5_2_1_request_directives_decide_reuse() {
        let s = Duration::from_secs;
        let none = RequestDirectives::default();
        let r = Reuse::default();
        assert_eq!(decide(s(5), s(10), r, &none), Use::Fresh);
        assert_eq!(decide(s(15), s(10), r, &none), Use::Revalidate);
        let max_age = RequestDirectives {
            max_age: Some(3),
            ..Default::default()
        };
        assert_eq!(decide(s(5), s(10), r, &max_age), Use::Revalidate);
        let min_fresh = RequestDirectives {
            min_fresh: Some(6),
            ..Default::default()
        };
        assert_eq!(decide(s(5), s(10), r, &min_fresh), Use::Revalidate);
        assert_eq!(decide(s(3), s(10), r, &min_fresh), Use::Fresh);
        let stale_ok = RequestDirectives {
            max_stale: Some(Some(10)),
            ..Default::default()
        };
        assert_eq!(decide(s(15), s(10), r, &stale_ok), Use::Stale);
        assert_eq!(decide(s(25), s(10), r, &stale_ok), Use::Revalidate);
        let must = Reuse {
            no_stale: true,
            ..Default::default()
        };
        assert_eq!(decide(s(15), s(10), must, &stale_ok), Use::Revalidate);
        let no_cache = RequestDirectives {
            no_cache: true,
            ..Default::default()
        };
        assert_eq!(decide(s(1), s(10), r, &no_cache), Use::Revalidate);
        let immutable = Reuse {
            immutable: true,
            ..Default::default()
        };
        assert_eq!(decide(s(1), s(10), immutable, &no_cache), Use::Fresh);
        let always = Reuse {
            always_revalidate: true,
            ..Default::default()
        };
        assert_eq!(decide(s(1), s(10), always, &none), Use::Revalidate);
    }
}
