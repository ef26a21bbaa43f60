//! Whether a response may be stored, and for how long it is fresh, as RFC 9111 says for a shared
//! cache. This stage stores GET responses with explicit freshness (`s-maxage`, `max-age`,
//! `Expires`) of any status; heuristic freshness, validation and `Vary` variants come later, so a
//! response with `Vary` is not stored rather than risk serving the wrong variant.

use crate::http::request::RequestHead;
use crate::http::response::ResponseHead;
use std::time::{Duration, SystemTime};

/// Cache-Control directives that matter here, parsed once.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Directives {
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache` (this stage: not stored).
    pub no_cache: bool,
    /// `private`.
    pub private: bool,
    /// `public`.
    pub public: bool,
    /// `must-revalidate`.
    pub must_revalidate: bool,
    /// `max-age`.
    pub max_age: Option<u64>,
    /// `s-maxage`.
    pub s_maxage: Option<u64>,
}

/// Parses a `Cache-Control` value. The first occurrence of a duplicated directive wins (§4.2.1);
/// quoted numbers are accepted (§5.2); unknown directives are ignored.
pub fn directives(value: Option<&str>) -> Directives {
    let mut d = Directives::default();
    let Some(value) = value else { return d };
    for part in value.split(',') {
        let (name, arg) = match part.split_once('=') {
            Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
            None => (part.trim(), None),
        };
        let num = || arg.and_then(|a| a.parse::<u64>().ok());
        match name.to_ascii_lowercase().as_str() {
            "no-store" => d.no_store = true,
            "no-cache" => d.no_cache = true,
            "private" => d.private = true,
            "public" => d.public = true,
            "must-revalidate" | "proxy-revalidate" => d.must_revalidate = true,
            "max-age" if d.max_age.is_none() => d.max_age = num(),
            "s-maxage" if d.s_maxage.is_none() => d.s_maxage = num(),
            _ => {}
        }
    }
    d
}

/// Why a response was not stored, for `Cache-Status` and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    /// Method other than GET.
    Method,
    /// Request `no-store`.
    RequestNoStore,
    /// Response `no-store`, `no-cache` or `private`.
    Directive,
    /// Request carried `Authorization` and the response did not allow sharing.
    Authorization,
    /// No explicit freshness.
    NoFreshness,
    /// `Vary` (variants are not stored yet).
    Vary,
    /// 1xx, 206 or 304: partial or bodiless answers that are not the resource.
    Status,
}

impl NotStored {
    /// Short token for `Cache-Status: detail=`.
    pub fn token(self) -> &'static str {
        match self {
            NotStored::Method => "method",
            NotStored::RequestNoStore => "request-no-store",
            NotStored::Directive => "response-directive",
            NotStored::Authorization => "authorization",
            NotStored::NoFreshness => "no-freshness",
            NotStored::Vary => "vary",
            NotStored::Status => "status",
        }
    }
}

/// Statuses RFC 9110 §15.1 lets a cache store without explicit freshness.
const HEURISTIC_STATUSES: [u16; 12] = [200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501];

/// Decides storability and returns the freshness lifetime and the corrected initial age.
pub fn storable(
    req: &RequestHead,
    res: &ResponseHead,
    request_time: SystemTime,
    response_time: SystemTime,
    default_ttl: Option<Duration>,
) -> Result<(Duration, Duration), NotStored> {
    if req.method != "GET" {
        return Err(NotStored::Method);
    }
    if res.status < 200 || res.status == 206 || res.status == 304 {
        return Err(NotStored::Status);
    }
    if directives(req.field("cache-control")).no_store {
        return Err(NotStored::RequestNoStore);
    }
    let cc = res.joined("cache-control");
    let d = directives(cc.as_deref());
    if d.no_store || d.private || d.no_cache {
        return Err(NotStored::Directive);
    }
    if req.field("authorization").is_some()
        && !(d.public || d.s_maxage.is_some() || d.must_revalidate)
    {
        return Err(NotStored::Authorization);
    }
    if res.field("vary").is_some_and(|v| !v.trim().is_empty()) {
        return Err(NotStored::Vary);
    }
    let date = res
        .field("date")
        .and_then(|v| httpdate::parse_http_date(v).ok());
    let lifetime = if let Some(s) = d.s_maxage.or(d.max_age) {
        Duration::from_secs(s)
    } else if let Some(expires) = res.field("expires") {
        // An invalid Expires (including "0") means already expired (§5.3).
        match httpdate::parse_http_date(expires) {
            Ok(exp) => exp
                .duration_since(date.unwrap_or(response_time))
                .unwrap_or_default(),
            Err(_) => Duration::ZERO,
        }
    } else if let Some(ttl) = default_ttl.filter(|_| HEURISTIC_STATUSES.contains(&res.status)) {
        // The operator's default (a route's `default_ttl`), only for statuses RFC 9110 §15.1
        // calls heuristically cacheable.
        ttl
    } else {
        return Err(NotStored::NoFreshness);
    };
    // §4.2.3: corrected initial age from the received Age and the apparent age from Date.
    let age_value = res
        .field("age")
        .and_then(|a| a.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or_default();
    let apparent = date
        .and_then(|d| response_time.duration_since(d).ok())
        .unwrap_or_default();
    let delay = response_time
        .duration_since(request_time)
        .unwrap_or_default();
    let initial_age = apparent.max(age_value + delay);
    Ok((lifetime, initial_age))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_parse_leniently() {
        let d = directives(Some(
            "public, max-age=\"60\", s-maxage=30, max-age=5, X-Unknown",
        ));
        assert_eq!(d.max_age, Some(60));
        assert_eq!(d.s_maxage, Some(30));
        assert!(d.public && !d.no_store);
        assert!(directives(Some("No-Store")).no_store);
    }

    fn req(extra: &str) -> RequestHead {
        let s = format!("GET /x HTTP/1.1\r\nHost: h\r\n{extra}\r\n");
        crate::http::request::parse(
            s.as_bytes(),
            crate::http::request::Limits {
                max_head: 8192,
                max_uri: 8192,
            },
        )
        .expect("ok")
        .expect("complete")
        .0
    }

    fn res(extra: &str) -> ResponseHead {
        let s = format!("HTTP/1.1 200 OK\r\n{extra}\r\n");
        crate::http::response::parse(s.as_bytes())
            .expect("ok")
            .expect("complete")
            .0
    }

    #[test]
    fn lifetime_precedence_and_age() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (life, age) = storable(
            &req(""),
            &res("Cache-Control: max-age=60, s-maxage=10\r\nAge: 3\r\n"),
            t,
            t,
            None,
        )
        .expect("storable");
        assert_eq!(
            (life, age),
            (Duration::from_secs(10), Duration::from_secs(3))
        );
        let date = httpdate::fmt_http_date(t - Duration::from_secs(7));
        let exp = httpdate::fmt_http_date(t + Duration::from_secs(93));
        let (life, age) = storable(
            &req(""),
            &res(&format!("Date: {date}\r\nExpires: {exp}\r\n")),
            t,
            t,
            None,
        )
        .expect("storable");
        assert_eq!(
            (life, age),
            (Duration::from_secs(100), Duration::from_secs(7))
        );
        let (life, _) =
            storable(&req(""), &res("Expires: 0\r\n"), t, t, None).expect("storable but stale");
        assert_eq!(life, Duration::ZERO);
    }

    #[test]
    fn refusals() {
        let t = SystemTime::now();
        assert_eq!(
            storable(&req(""), &res(""), t, t, None),
            Err(NotStored::NoFreshness)
        );
        let ttl = Some(Duration::from_secs(60));
        assert_eq!(
            storable(&req(""), &res(""), t, t, ttl).map(|x| x.0),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(
            storable(&req(""), &res("Cache-Control: no-store\r\n"), t, t, ttl),
            Err(NotStored::Directive)
        );
        assert_eq!(
            storable(
                &req(""),
                &res("Cache-Control: no-store, max-age=5\r\n"),
                t,
                t,
                None,
            ),
            Err(NotStored::Directive)
        );
        assert_eq!(
            storable(
                &req(""),
                &res("Cache-Control: private, max-age=5\r\n"),
                t,
                t,
                None,
            ),
            Err(NotStored::Directive)
        );
        assert_eq!(
            storable(
                &req("Authorization: x\r\n"),
                &res("Cache-Control: max-age=5\r\n"),
                t,
                t,
                None,
            ),
            Err(NotStored::Authorization)
        );
        assert!(
            storable(
                &req("Authorization: x\r\n"),
                &res("Cache-Control: s-maxage=5\r\n"),
                t,
                t,
                None,
            )
            .is_ok()
        );
        assert_eq!(
            storable(
                &req("Cache-Control: no-store\r\n"),
                &res("Cache-Control: max-age=5\r\n"),
                t,
                t,
                None,
            ),
            Err(NotStored::RequestNoStore)
        );
        assert_eq!(
            storable(
                &req(""),
                &res("Cache-Control: max-age=5\r\nVary: Accept\r\n"),
                t,
                t,
                None,
            ),
            Err(NotStored::Vary)
        );
    }
}
