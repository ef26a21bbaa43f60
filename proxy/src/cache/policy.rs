//! Whether a response may be stored, what of it is stored, and for how long it is fresh, as RFC
//! 9111 §3 says for a shared cache. The smallest config behaves as the RFC says; the only widening
//! is a route's explicit `default_ttl`.

use super::freshness::{self, Heuristics, Source};
use super::targeted::Targeted;
use crate::http::headers;
use crate::http::request::RequestHead;
use crate::http::response::ResponseHead;
use std::time::{Duration, SystemTime};

/// Why a response was not stored, for `Cache-Status` and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    /// Method other than GET.
    Method,
    /// Request `no-store`.
    RequestNoStore,
    /// Response `no-store` or unqualified `private`.
    Directive,
    /// Request carried `Authorization` and the response did not allow sharing (§3.5).
    Authorization,
    /// No explicit freshness and no heuristic allowed.
    NoFreshness,
    /// `Vary: *`: no request can ever match it.
    VaryStar,
    /// 1xx, 206, 304, 412, 416, anything outside 100-599, or a `Content-Range`: answers that
    /// are not the whole resource (or not HTTP at all).
    Status,
    /// A 5xx, with `cache.store_5xx: false`.
    ServerError,
    /// `Set-Cookie` on a route with `store_set_cookie: false` (the default), or under freshness
    /// the origin did not give (the heuristic, `default_ttl`, `status_ttl`) whatever the route
    /// says: an origin that set a cookie and said nothing of caching did not mean it for everyone.
    SetCookie,
}

impl NotStored {
    /// True when the response, not the request, is why it was not stored.
    pub fn caused_by_response(self) -> bool {
        !matches!(
            self,
            NotStored::Method | NotStored::RequestNoStore | NotStored::Authorization
        )
    }

    /// Short token for `Cache-Status: detail=`.
    pub fn token(self) -> &'static str {
        match self {
            NotStored::Method => "method",
            NotStored::RequestNoStore => "request-no-store",
            NotStored::Directive => "response-directive",
            NotStored::Authorization => "authorization",
            NotStored::NoFreshness => "no-freshness",
            NotStored::VaryStar => "vary-star",
            NotStored::Status => "status",
            NotStored::ServerError => "server-error",
            NotStored::SetCookie => "set-cookie",
        }
    }
}

/// What to store of a storable response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storable {
    /// Freshness lifetime.
    pub lifetime: Duration,
    /// Where the lifetime came from.
    pub source: Source,
    /// Corrected initial age.
    pub initial_age: Duration,
    /// The stored header block (`Name: value\r\n` lines).
    pub fields: Vec<u8>,
    /// Lower-cased field names of `Vary`, in order.
    pub vary: Vec<String>,
}

/// Fields the proxy itself controls: never stored, always recomputed.
pub fn proxy_owned(name: &str) -> bool {
    [
        "content-length",
        "transfer-encoding",
        "age",
        "x-cache",
        "cache-status",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// The stored header block of `res`: as received, minus hop-by-hop fields, fields the proxy
/// recomputes, and fields `private="..."` or `no-cache="..."` name (a shared cache must not
/// store the former, and must not send the latter unrevalidated: not storing them does both).
pub fn stored_fields(res: &ResponseHead, drop: &[String]) -> Vec<u8> {
    let tokens =
        headers::connection_tokens(res.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
    let mut out = Vec::with_capacity(512);
    for (k, v) in &res.fields {
        if headers::is_hop_by_hop(k, &tokens)
            || proxy_owned(k)
            || drop.iter().any(|d| k.eq_ignore_ascii_case(d))
        {
            continue;
        }
        headers::put(&mut out, k, v);
    }
    out
}

/// Lower-cased `Vary` field names; `None` for `Vary: *`.
pub fn vary_names(res: &ResponseHead) -> Option<Vec<String>> {
    let mut names = Vec::new();
    if let Some(v) = res.joined("vary") {
        for n in v.split(',').map(|n| n.trim().to_ascii_lowercase()) {
            if n == "*" {
                return None;
            }
            if !n.is_empty() && !names.contains(&n) {
                names.push(n);
            }
        }
    }
    Some(names)
}

/// The operator's narrowing of what RFC 9111 allows to be stored, and the target list that
/// decides which cache-control field governs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules<'a> {
    /// `cache.store_5xx`.
    pub store_5xx: bool,
    /// The route's `store_set_cookie`.
    pub store_set_cookie: bool,
    /// `cache.targeted_fields` (RFC 9213).
    pub targeted: &'a Targeted,
}

/// Status codes whose caching rules zerocache implements, for `must-understand` (RFC 9111
/// §5.2.2.3): the final statuses RFC 9110 §15 defines that a cache may store (206, 304, 412 and
/// 416 never are: they are not the whole representation). An unknown status with
/// `must-understand` is not stored even when the rest of the response allows it.
pub fn understood(status: u16) -> bool {
    matches!(
        status,
        200..=205 | 300..=303 | 305 | 307 | 308 | 400..=411 | 413..=415 | 417 | 421..=426
            | 428 | 429 | 431 | 451 | 500..=505 | 511
    )
}

/// Whether a response's own directives forbid a shared cache to store it: `no-store` or
/// unqualified `private`. With `must-understand`, a cache that implements the status code's rules
/// ignores `no-store`, and one that does not must not store (§5.2.2.3). Used for a fill and for
/// every update of a stored response (304, HEAD), so the two can never disagree.
pub fn forbids_storing(d: &super::directives::ResponseDirectives, status: u16) -> bool {
    let no_store = if d.must_understand {
        !understood(status)
    } else {
        d.no_store
    };
    no_store || d.private
}

/// Decides storability (§3, §3.5) and what to store.
pub fn storable(
    req: &RequestHead,
    res: &ResponseHead,
    request_time: SystemTime,
    response_time: SystemTime,
    heuristics: Heuristics<'_>,
    rules: Rules<'_>,
) -> Result<Storable, NotStored> {
    if req.method != "GET" {
        return Err(NotStored::Method);
    }
    // The request that fills an entry never carries Range or preconditions (they are answered
    // from the whole representation), so a partial or precondition answer can only be an
    // origin's mistake: never what every later client gets.
    if !(200..=599).contains(&res.status)
        || matches!(res.status, 206 | 304 | 412 | 416)
        || headers::has(&res.fields, "content-range")
    {
        return Err(NotStored::Status);
    }
    if res.status >= 500 && !rules.store_5xx {
        return Err(NotStored::ServerError);
    }
    if !rules.store_set_cookie && headers::has(&res.fields, "set-cookie") {
        return Err(NotStored::SetCookie);
    }
    if freshness::request_directives(req).no_store {
        return Err(NotStored::RequestNoStore);
    }
    let (d, targeted) = rules.targeted.governing(|n| res.joined(n));
    if forbids_storing(&d, res.status) {
        return Err(NotStored::Directive);
    }
    if headers::has(&req.fields, "authorization")
        && !(d.public || d.s_maxage.is_some() || d.must_revalidate)
    {
        return Err(NotStored::Authorization);
    }
    let vary = vary_names(res).ok_or(NotStored::VaryStar)?;
    // `must-understand, no-store` lets a cache that knows the status store it (§5.2.2.3), as the
    // origin's own rules say: never for a lifetime the operator made up.
    let heuristics = if d.must_understand && d.no_store {
        Heuristics {
            default_ttl: None,
            status_ttl: None,
            forced: None,
            ..heuristics
        }
    } else {
        heuristics
    };
    let (lifetime, source) = match freshness::lifetime(res, &d, targeted, response_time, heuristics)
    {
        Some(l) => l,
        // no-cache: stored, but revalidated on every use, so its lifetime does not matter.
        None if d.no_cache && freshness::HEURISTIC_STATUSES.contains(&res.status) => {
            (Duration::ZERO, Source::Explicit)
        }
        None => return Err(NotStored::NoFreshness),
    };
    if source != Source::Explicit && headers::has(&res.fields, "set-cookie") {
        return Err(NotStored::SetCookie);
    }
    let mut drop = d.private_fields.clone();
    drop.extend(d.no_cache_fields.iter().cloned());
    Ok(Storable {
        lifetime,
        source,
        initial_age: freshness::initial_age(res, request_time, response_time),
        fields: stored_fields(res, &drop),
        vary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(extra: &str) -> RequestHead {
        crate::http::request::test_request("GET", extra)
    }

    fn res(status: u16, extra: &str) -> ResponseHead {
        crate::http::response::test_response(status, extra)
    }

    const H: Heuristics<'static> = Heuristics {
        max: Duration::from_secs(86_400),
        default_ttl: None,
        status_ttl: None,
        forced: None,
    };

    fn rules(t: &Targeted) -> Rules<'_> {
        Rules {
            store_5xx: true,
            store_set_cookie: true,
            targeted: t,
        }
    }

    fn st(req_extra: &str, status: u16, res_extra: &str) -> Result<Storable, NotStored> {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let targeted = Targeted::default();
        storable(
            &req(req_extra),
            &res(status, res_extra),
            t,
            t,
            H,
            rules(&targeted),
        )
    }

    #[test]
    fn partial_precondition_and_invalid_answers_are_never_the_resource() {
        let fresh = "Cache-Control: max-age=600\r\n";
        for status in [206, 412, 416, 999, 600, 304] {
            assert_eq!(
                st("", status, fresh).err(),
                Some(NotStored::Status),
                "{status}"
            );
        }
        assert_eq!(
            st(
                "",
                200,
                "Cache-Control: max-age=600\r\nContent-Range: bytes 0-9/100\r\n"
            )
            .err(),
            Some(NotStored::Status)
        );
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let targeted = Targeted::default();
        let no_5xx = Rules {
            store_5xx: false,
            ..rules(&targeted)
        };
        assert_eq!(
            storable(&req(""), &res(503, fresh), t, t, H, no_5xx).err(),
            Some(NotStored::ServerError)
        );
        assert!(storable(&req(""), &res(503, fresh), t, t, H, rules(&targeted)).is_ok());
        let no_cookies = Rules {
            store_set_cookie: false,
            ..rules(&targeted)
        };
        let cookie = "Cache-Control: max-age=600\r\nSet-Cookie: s=1\r\n";
        assert_eq!(
            storable(&req(""), &res(200, cookie), t, t, H, no_cookies).err(),
            Some(NotStored::SetCookie)
        );
        assert!(storable(&req(""), &res(200, cookie), t, t, H, rules(&targeted)).is_ok());
    }

    /// The session-replay bug: a 404 under `status_ttl`, a 302 or 200 under `default_ttl` and a
    /// 200 with only `Last-Modified` were stored with their `Set-Cookie` and replayed to the
    /// next client. Never, whatever `store_set_cookie` says; with explicit freshness only where
    /// the route opts in.
    #[test]
    fn a_cookie_is_never_stored_under_freshness_the_origin_did_not_give() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000_000);
        let targeted = Targeted::default();
        let lm = httpdate::fmt_http_date(t - Duration::from_secs(1000));
        let ttl: zerocache_config::StatusTtl =
            serde_yaml::from_str("404: 1m\n302: 1m").expect("status_ttl");
        let configured = Heuristics {
            default_ttl: Some(Duration::from_secs(120)),
            status_ttl: Some(&ttl),
            ..H
        };
        let opted_in = rules(&targeted);
        let cookie = "Set-Cookie: sess=alice\r\n";
        let cases = [
            (404, String::new(), configured, Source::Configured),
            (302, String::new(), configured, Source::Configured),
            (200, String::new(), configured, Source::Configured),
            (
                200,
                format!("Last-Modified: {lm}\r\n"),
                H,
                Source::Heuristic,
            ),
        ];
        for (status, extra, h, source) in cases {
            let without = storable(&req(""), &res(status, &extra), t, t, h, opted_in);
            assert_eq!(without.map(|s| s.source), Ok(source), "{status} {extra}");
            let with = res(status, &format!("{extra}{cookie}"));
            assert_eq!(
                storable(&req(""), &with, t, t, h, opted_in).err(),
                Some(NotStored::SetCookie),
                "{status} {extra}"
            );
        }
        // Explicit freshness: stored only where the route opts in (`false` is the default).
        let explicit = res(200, &format!("Cache-Control: max-age=60\r\n{cookie}"));
        let default_rules = Rules {
            store_set_cookie: false,
            ..opted_in
        };
        assert_eq!(
            storable(&req(""), &explicit, t, t, H, default_rules).err(),
            Some(NotStored::SetCookie)
        );
        assert!(storable(&req(""), &explicit, t, t, H, opted_in).is_ok());
    }

    #[test]
    fn a_rules_ttl_is_over_the_origins_freshness_but_never_over_no_store_private_or_a_cookie() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000_000);
        let targeted = Targeted::default();
        let forced = Heuristics {
            forced: Some(Duration::from_secs(300)),
            ..H
        };
        let opted_in = rules(&targeted);
        let life = |extra: &str| {
            storable(&req(""), &res(200, extra), t, t, forced, opted_in)
                .map(|s| (s.lifetime, s.source))
        };
        let five_minutes = Ok((Duration::from_secs(300), Source::Configured));
        assert_eq!(life("Cache-Control: max-age=0\r\n"), five_minutes);
        assert_eq!(
            life("Cache-Control: s-maxage=5, max-age=9\r\n"),
            five_minutes
        );
        assert_eq!(life("Expires: 0\r\n"), five_minutes);
        assert_eq!(life(""), five_minutes);
        assert_eq!(
            life("Cache-Control: no-store\r\n"),
            Err(NotStored::Directive)
        );
        assert_eq!(
            life("Cache-Control: private, max-age=60\r\n"),
            Err(NotStored::Directive)
        );
        // Not for an error one request can cause for everyone: a 404, 403 or 429 keeps the
        // origin's own freshness, or is not stored.
        for status in [400, 403, 404, 429, 431] {
            let r = storable(&req(""), &res(status, ""), t, t, forced, opted_in);
            assert_eq!(r.err(), Some(NotStored::NoFreshness), "{status}");
        }
        let own = storable(
            &req(""),
            &res(404, "Cache-Control: max-age=7\r\n"),
            t,
            t,
            forced,
            opted_in,
        );
        assert_eq!(own.map(|s| s.lifetime), Ok(Duration::from_secs(7)));
        // Even where the route stores cookies: freshness the origin did not give.
        assert_eq!(
            life("Cache-Control: max-age=60\r\nSet-Cookie: s=1\r\n"),
            Err(NotStored::SetCookie)
        );
    }

    #[test]
    fn rfc9111_3_any_final_status_with_explicit_freshness() {
        assert_eq!(
            st("", 404, "Cache-Control: max-age=5\r\n").map(|s| s.lifetime),
            Ok(Duration::from_secs(5))
        );
        assert_eq!(
            st("", 500, "Cache-Control: max-age=5\r\n").map(|s| s.lifetime),
            Ok(Duration::from_secs(5))
        );
        assert_eq!(st("", 500, ""), Err(NotStored::NoFreshness));
        assert_eq!(
            st("", 206, "Cache-Control: max-age=5\r\n"),
            Err(NotStored::Status)
        );
    }

    #[test]
    fn rfc9111_3_refusals() {
        assert_eq!(
            st("", 200, "Cache-Control: no-store, max-age=5\r\n"),
            Err(NotStored::Directive)
        );
        assert_eq!(
            st("", 200, "Cache-Control: private, max-age=5\r\n"),
            Err(NotStored::Directive)
        );
        assert_eq!(
            st("Authorization: x\r\n", 200, "Cache-Control: max-age=5\r\n"),
            Err(NotStored::Authorization)
        );
        assert!(st("Authorization: x\r\n", 200, "Cache-Control: s-maxage=5\r\n").is_ok());
        assert!(
            st(
                "Authorization: x\r\n",
                200,
                "Cache-Control: public, max-age=5\r\n"
            )
            .is_ok()
        );
        assert_eq!(
            st(
                "Cache-Control: no-store\r\n",
                200,
                "Cache-Control: max-age=5\r\n"
            ),
            Err(NotStored::RequestNoStore)
        );
        assert_eq!(
            st("", 200, "Cache-Control: max-age=5\r\nVary: Accept, *\r\n"),
            Err(NotStored::VaryStar)
        );
    }

    #[test]
    fn rfc9111_5_2_2_qualified_private_and_no_cache_fields_are_not_stored() {
        let s = st(
            "",
            200,
            "Cache-Control: max-age=5, private=\"X-Secret\", no-cache=\"Set-Cookie\"\r\nX-Secret: 1\r\nSet-Cookie: a=b\r\nX-Kept: 2\r\nConnection: X-Hop\r\nX-Hop: 3\r\nAge: 7\r\n",
        )
        .expect("storable");
        let text = String::from_utf8(s.fields).expect("utf8");
        assert_eq!(
            text,
            "Cache-Control: max-age=5, private=\"X-Secret\", no-cache=\"Set-Cookie\"\r\nX-Kept: 2\r\n"
        );
        assert_eq!(s.initial_age, Duration::from_secs(7));
    }

    #[test]
    fn rfc9213_targeted_cache_control_governs_and_replaces_expires() {
        // CDN-Cache-Control: no-store wins over a permissive Cache-Control.
        assert_eq!(
            st(
                "",
                200,
                "Cache-Control: max-age=600\r\nCDN-Cache-Control: no-store\r\n"
            ),
            Err(NotStored::Directive)
        );
        // And a permissive one wins over Cache-Control: private.
        assert_eq!(
            st(
                "",
                200,
                "Cache-Control: private\r\nCDN-Cache-Control: max-age=30\r\n"
            )
            .map(|s| s.lifetime),
            Ok(Duration::from_secs(30))
        );
        // Expires is ignored when the targeted field governs.
        assert_eq!(
            st("", 200, "Expires: 0\r\nCDN-Cache-Control: max-age=30\r\n").map(|s| s.lifetime),
            Ok(Duration::from_secs(30))
        );
    }

    #[test]
    fn rfc9213_2_1_an_invalid_targeted_field_is_ignored() {
        // Each falls back to Cache-Control (max-age=7) and Expires, as if the field were absent.
        for bad in [
            "",
            "max-age=\"10000\"",
            "MaX-aGe=60",
            "max-age=60,",
            "no-store=?0",
        ] {
            assert_eq!(
                st(
                    "",
                    200,
                    &format!("Cache-Control: max-age=7\r\nCDN-Cache-Control: {bad}\r\n")
                )
                .map(|s| s.lifetime),
                Ok(Duration::from_secs(7)),
                "{bad:?}"
            );
        }
        assert_eq!(
            st(
                "",
                200,
                "Cache-Control: no-store\r\nCDN-Cache-Control: max-age=\"60\"\r\n"
            ),
            Err(NotStored::Directive)
        );
    }

    #[test]
    fn rfc9111_5_2_2_3_must_understand_overrides_no_store_for_understood_statuses() {
        let mu = "Cache-Control: must-understand, no-store, max-age=60\r\n";
        assert_eq!(
            st("", 200, mu).map(|s| s.lifetime),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(
            st("", 404, mu).map(|s| s.lifetime),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(st("", 299, mu), Err(NotStored::Directive));
        assert_eq!(st("", 599, mu), Err(NotStored::Directive));
        // Without must-understand, 299 with explicit freshness is stored as any valid status.
        assert!(st("", 299, "Cache-Control: max-age=60\r\n").is_ok());
        assert_eq!(
            st(
                "",
                200,
                "Cache-Control: must-understand, private, max-age=60\r\n"
            ),
            Err(NotStored::Directive)
        );
    }

    #[test]
    fn rfc9111_5_2_2_4_no_cache_is_stored_for_revalidation() {
        let s = st("", 200, "Cache-Control: no-cache\r\nETag: \"a\"\r\n").expect("stored");
        assert_eq!(s.lifetime, Duration::ZERO);
        assert_eq!(
            st("", 200, "Set-Cookie: a=b\r\nCache-Control: max-age=9\r\n")
                .map(|s| !s.fields.is_empty()),
            Ok(true)
        );
    }

    #[test]
    fn vary_names_are_normalised() {
        let s = st("", 200, "Cache-Control: max-age=5\r\nVary: Accept-Encoding, accept-language\r\nVary: ACCEPT-ENCODING\r\n").expect("ok");
        assert_eq!(s.vary, vec!["accept-encoding", "accept-language"]);
    }
}
