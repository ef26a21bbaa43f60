//! Conditional requests answered from the cache (RFC 9110 §13): `If-Match`,
//! `If-Unmodified-Since`, `If-None-Match`, `If-Modified-Since` in the order §13.2.2 gives, and
//! `If-Range` for ranges.

use crate::http::request::RequestHead;
use std::time::SystemTime;

/// Fields a 304 from the cache carries (RFC 9110 §15.4.5): those that guide cache updates.
pub const NOT_MODIFIED_FIELDS: &[&str] = &[
    "cache-control",
    "content-location",
    "date",
    "etag",
    "expires",
    "vary",
    "last-modified",
];

/// The outcome of evaluating a request's preconditions against a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Serve normally.
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// An entity tag: weak flag and opaque tag (quotes included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityTag<'a> {
    /// `W/` prefix.
    pub weak: bool,
    /// The quoted opaque tag.
    pub tag: &'a str,
}

/// Parses one entity tag.
pub fn parse_etag(s: &str) -> Option<EntityTag<'_>> {
    let s = s.trim();
    let (weak, rest) = match s.strip_prefix("W/") {
        Some(r) => (true, r),
        None => (false, s),
    };
    (rest.len() >= 2 && rest.starts_with('"') && rest.ends_with('"'))
        .then_some(EntityTag { weak, tag: rest })
}

/// The items of an `If-Match`/`If-None-Match` list; `None` for `*`.
fn etag_list(v: &str) -> Option<Vec<EntityTag<'_>>> {
    if v.trim() == "*" {
        return None;
    }
    Some(v.split(',').filter_map(parse_etag).collect())
}

fn weak_match(a: &EntityTag<'_>, b: &EntityTag<'_>) -> bool {
    a.tag == b.tag
}

fn strong_match(a: &EntityTag<'_>, b: &EntityTag<'_>) -> bool {
    !a.weak && !b.weak && a.tag == b.tag
}

fn date(v: Option<&str>) -> Option<SystemTime> {
    crate::http::date::parse(v?)
}

/// Evaluates `req`'s preconditions against a stored response with `etag`, `last_modified` and
/// the stored `Date` (`stored_date`).
pub fn evaluate(
    req: &RequestHead,
    etag: Option<&str>,
    last_modified: Option<&str>,
    stored_date: Option<&str>,
) -> Precondition {
    let current = etag.and_then(parse_etag);
    let lm = date(last_modified);
    let get_or_head = req.method == "GET" || req.method == "HEAD";
    // 1. If-Match (strong comparison).
    if let Some(v) = req.joined("if-match") {
        let ok = match etag_list(&v) {
            None => true,
            Some(list) => current
                .as_ref()
                .is_some_and(|c| list.iter().any(|t| strong_match(t, c))),
        };
        if !ok {
            return Precondition::Failed;
        }
    } else if let (Some(ius), Some(lm)) = (date(req.field("if-unmodified-since")), lm) {
        // 2. If-Unmodified-Since, only without If-Match.
        if lm > ius {
            return Precondition::Failed;
        }
    }
    // 3. If-None-Match (weak comparison).
    if let Some(v) = req.joined("if-none-match") {
        let matched = match etag_list(&v) {
            None => true,
            Some(list) => current
                .as_ref()
                .is_some_and(|c| list.iter().any(|t| weak_match(t, c))),
        };
        if matched {
            return if get_or_head {
                Precondition::NotModified
            } else {
                Precondition::Failed
            };
        }
    } else if get_or_head
        && let (Some(ims), Some(lm)) = (
            date(req.field("if-modified-since")),
            // A stored response without Last-Modified is compared by its Date (RFC 9111
            // §4.3.2): it was current then, so it has not changed since a later date. One whose
            // Last-Modified is present but unreadable is not compared at all.
            if last_modified.is_none() {
                date(stored_date)
            } else {
                lm
            },
        )
        && lm <= ims
    {
        // 4. If-Modified-Since, only without If-None-Match.
        return Precondition::NotModified;
    }
    Precondition::Proceed
}

/// Whether a `Range` may be honoured under `If-Range` (§13.1.5): the validator must match the
/// stored one strongly (an entity tag) or exactly (a date).
pub fn if_range_holds(req: &RequestHead, etag: Option<&str>, last_modified: Option<&str>) -> bool {
    let Some(v) = req.field("if-range") else {
        return true;
    };
    match parse_etag(v) {
        Some(t) => etag
            .and_then(parse_etag)
            .is_some_and(|c| strong_match(&t, &c)),
        None => matches!((date(Some(v)), date(last_modified)), (Some(a), Some(b)) if a == b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, extra: &str) -> RequestHead {
        crate::http::request::test_request(method, extra)
    }

    const LM: &str = "Sat, 01 Jan 2000 00:00:00 GMT";
    const LATER: &str = "Sun, 02 Jan 2000 00:00:00 GMT";
    const EARLIER: &str = "Fri, 31 Dec 1999 00:00:00 GMT";

    fn ev(method: &str, extra: &str) -> Precondition {
        evaluate(&req(method, extra), Some("\"v1\""), Some(LM), Some(LATER))
    }

    #[test]
    fn rfc9110_13_1_2_if_none_match_uses_weak_comparison() {
        assert_eq!(
            ev("GET", "If-None-Match: W/\"v1\"\r\n"),
            Precondition::NotModified
        );
        assert_eq!(
            ev("GET", "If-None-Match: \"x\", \"v1\"\r\n"),
            Precondition::NotModified
        );
        assert_eq!(ev("GET", "If-None-Match: *\r\n"), Precondition::NotModified);
        assert_eq!(
            ev("GET", "If-None-Match: \"v2\"\r\n"),
            Precondition::Proceed
        );
        assert_eq!(
            ev("HEAD", "If-None-Match: \"v1\"\r\n"),
            Precondition::NotModified
        );
    }

    #[test]
    fn rfc9110_13_1_3_if_modified_since_only_without_if_none_match() {
        assert_eq!(
            ev("GET", &format!("If-Modified-Since: {LM}\r\n")),
            Precondition::NotModified
        );
        assert_eq!(
            ev("GET", &format!("If-Modified-Since: {LATER}\r\n")),
            Precondition::NotModified
        );
        assert_eq!(
            ev("GET", &format!("If-Modified-Since: {EARLIER}\r\n")),
            Precondition::Proceed
        );
        assert_eq!(
            ev(
                "GET",
                &format!("If-None-Match: \"v2\"\r\nIf-Modified-Since: {LATER}\r\n")
            ),
            Precondition::Proceed
        );
        assert_eq!(
            ev("GET", "If-Modified-Since: garbage\r\n"),
            Precondition::Proceed
        );
    }

    #[test]
    fn rfc9111_4_3_2_if_modified_since_falls_back_to_the_stored_date() {
        let ims = |v: &str, date: Option<&str>| {
            evaluate(
                &req("GET", &format!("If-Modified-Since: {v}\r\n")),
                None,
                None,
                date,
            )
        };
        assert_eq!(ims(LM, Some(LM)), Precondition::NotModified);
        assert_eq!(ims(LATER, Some(LM)), Precondition::NotModified);
        assert_eq!(ims(EARLIER, Some(LM)), Precondition::Proceed);
        assert_eq!(ims(LATER, None), Precondition::Proceed);
        assert_eq!(ims(LATER, Some("garbage")), Precondition::Proceed);
        assert_eq!(
            evaluate(
                &req("GET", &format!("If-Modified-Since: {LATER}\r\n")),
                None,
                Some("garbage"),
                Some(LM),
            ),
            Precondition::Proceed,
            "an unreadable Last-Modified is not replaced by Date"
        );
        // Last-Modified, when there is one, wins over Date.
        assert_eq!(
            evaluate(
                &req("GET", &format!("If-Modified-Since: {LM}\r\n")),
                None,
                Some(LATER),
                Some(EARLIER),
            ),
            Precondition::Proceed
        );
    }

    #[test]
    fn rfc9110_13_1_1_if_match_uses_strong_comparison() {
        assert_eq!(ev("GET", "If-Match: \"v1\"\r\n"), Precondition::Proceed);
        assert_eq!(ev("GET", "If-Match: *\r\n"), Precondition::Proceed);
        assert_eq!(ev("GET", "If-Match: W/\"v1\"\r\n"), Precondition::Failed);
        assert_eq!(ev("GET", "If-Match: \"v2\"\r\n"), Precondition::Failed);
    }

    #[test]
    fn rfc9110_13_1_4_if_unmodified_since() {
        assert_eq!(
            ev("GET", &format!("If-Unmodified-Since: {EARLIER}\r\n")),
            Precondition::Failed
        );
        assert_eq!(
            ev("GET", &format!("If-Unmodified-Since: {LM}\r\n")),
            Precondition::Proceed
        );
        assert_eq!(
            ev(
                "GET",
                &format!("If-Match: \"v1\"\r\nIf-Unmodified-Since: {EARLIER}\r\n")
            ),
            Precondition::Proceed,
            "ignored when If-Match is present"
        );
    }

    #[test]
    fn rfc9110_13_1_5_if_range() {
        let e = Some("\"v1\"");
        assert!(if_range_holds(
            &req("GET", "If-Range: \"v1\"\r\n"),
            e,
            Some(LM)
        ));
        assert!(!if_range_holds(
            &req("GET", "If-Range: W/\"v1\"\r\n"),
            e,
            Some(LM)
        ));
        assert!(!if_range_holds(
            &req("GET", "If-Range: \"v2\"\r\n"),
            e,
            Some(LM)
        ));
        assert!(if_range_holds(
            &req("GET", &format!("If-Range: {LM}\r\n")),
            e,
            Some(LM)
        ));
        assert!(!if_range_holds(
            &req("GET", &format!("If-Range: {LATER}\r\n")),
            e,
            Some(LM)
        ));
        assert!(if_range_holds(&req("GET", ""), e, Some(LM)));
    }
}
