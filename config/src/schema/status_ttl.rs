//! `routes[].status_ttl`: how long a response of a given status stays fresh when the origin gave
//! no freshness (no `max-age`, `s-maxage` or `Expires`), like nginx's `proxy_cache_valid 404 1m`.
//!
//! Why its own type: its keys are status codes (`404`) or classes (`4xx`), read from YAML as
//! numbers or strings, and a key that can never apply (`206`, `1xx`, `600`) is refused where it
//! is written rather than ignored at run time.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Statuses that are never stored whatever the TTL: a partial or precondition answer (the fill
/// never asks with Range or preconditions, so such an answer is an origin's mistake), and 1xx
/// (interim, never a response of its own).
const NEVER_STORED: [u16; 4] = [206, 304, 412, 416];

/// Statuses a class key (`4xx`, `5xx`) does not cover: each can depend on the one request that
/// caused it (a header too large for the origin, credentials, an address rule, a client's rate
/// limit, a crafted field that makes the origin fail, or a gateway in front of the origin that
/// one request makes fail or wait: 502, 503, 504), so storing it for a class would serve one
/// client's error to everyone (cache-poisoned denial of service). An exact key still may.
pub const NOT_BY_CLASS: [u16; 16] = [
    400, 401, 403, 407, 408, 411, 413, 414, 415, 421, 429, 431, 500, 502, 503, 504,
];

/// A `status_ttl` key: one status code, or a class of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatusKey {
    /// `404`: exactly this status.
    Exact(u16),
    /// `4xx`: every status of this hundred without an exact key.
    Class(u8),
}

impl StatusKey {
    /// Parses `404` or `4xx` (`4XX` too), refusing keys that could never apply.
    pub fn parse(s: &str) -> Result<StatusKey, String> {
        let bad = |why: &str| Err(format!("`{s}` {why}"));
        let b = s.as_bytes();
        if b.len() != 3 || !b[0].is_ascii_digit() {
            return bad("is not a status (`404`) or a class of them (`4xx`)");
        }
        let class = b[0] - b'0';
        if !(2..=5).contains(&class) {
            return bad("is not a final status: only 2xx to 5xx are stored");
        }
        if b[1..].eq_ignore_ascii_case(b"xx") {
            return Ok(StatusKey::Class(class));
        }
        let Ok(code) = s.parse::<u16>() else {
            return bad("is not a status (`404`) or a class of them (`4xx`)");
        };
        if NEVER_STORED.contains(&code) {
            return bad("is never stored (206, 304, 412 and 416 only answer their own request)");
        }
        Ok(StatusKey::Exact(code))
    }
}

impl std::fmt::Display for StatusKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusKey::Exact(c) => write!(f, "{c}"),
            StatusKey::Class(c) => write!(f, "{c}xx"),
        }
    }
}

impl<'de> Deserialize<'de> for StatusKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StatusKey, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = StatusKey;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a status (`404`) or a class of them (`4xx`)")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<StatusKey, E> {
                StatusKey::parse(&n.to_string()).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<StatusKey, E> {
                StatusKey::parse(&n.to_string()).map_err(E::custom)
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<StatusKey, E> {
                StatusKey::parse(s).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for StatusKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// A duration value of the map (`1m`, `3600`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Ttl(#[serde(with = "crate::units::duration")] pub Duration);

/// `routes[].status_ttl`: TTLs by status, an exact status over its class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct StatusTtl(pub BTreeMap<StatusKey, Ttl>);

impl StatusTtl {
    /// The TTL of `status`: its exact key, else its class's (never for [`NOT_BY_CLASS`]);
    /// `None` without either.
    pub fn of(&self, status: u16) -> Option<Duration> {
        let exact = self.0.get(&StatusKey::Exact(status));
        let class = u8::try_from(status / 100)
            .ok()
            .filter(|_| !NOT_BY_CLASS.contains(&status))
            .and_then(|c| self.0.get(&StatusKey::Class(c)));
        exact.or(class).map(|t| t.0)
    }

    /// No key at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_statuses_or_classes_that_can_be_stored() {
        assert_eq!(StatusKey::parse("404"), Ok(StatusKey::Exact(404)));
        assert_eq!(StatusKey::parse("4xx"), Ok(StatusKey::Class(4)));
        assert_eq!(StatusKey::parse("5XX"), Ok(StatusKey::Class(5)));
        assert_eq!(StatusKey::parse("200"), Ok(StatusKey::Exact(200)));
        for (key, why) in [
            ("206", "is never stored"),
            ("304", "is never stored"),
            ("1xx", "is not a final status"),
            ("101", "is not a final status"),
            ("600", "is not a final status"),
            ("099", "is not a final status"),
            ("40x", "is not a status"),
            ("4xxx", "is not a status"),
            (" 404", "is not a status"),
            ("", "is not a status"),
            ("4০4", "is not a status"),
            ("+40", "is not a status"),
        ] {
            let e = StatusKey::parse(key).expect_err(key);
            assert!(e.starts_with(&format!("`{key}` {why}")), "{key}: {e}");
        }
    }

    #[test]
    fn an_exact_status_wins_over_its_class() {
        let t = StatusTtl(BTreeMap::from([
            (StatusKey::Exact(404), Ttl(Duration::from_secs(60))),
            (StatusKey::Class(4), Ttl(Duration::from_secs(5))),
            (StatusKey::Exact(301), Ttl(Duration::from_secs(3600))),
            (StatusKey::Class(5), Ttl(Duration::from_secs(10))),
        ]));
        assert_eq!(t.of(404), Some(Duration::from_secs(60)));
        assert_eq!(t.of(410), Some(Duration::from_secs(5)));
        assert_eq!(t.of(301), Some(Duration::from_secs(3600)));
        assert_eq!(t.of(302), None);
        assert_eq!(t.of(200), None);
        assert_eq!(t.of(u16::MAX), None);
        // A 5xx class covers what the origin itself says of the resource (501 Not Implemented),
        // never a gateway's failure one request can cause (502, 503, 504), nor 500.
        assert_eq!(t.of(501), Some(Duration::from_secs(10)));
        for s in [500, 502, 503, 504] {
            assert!(NOT_BY_CLASS.contains(&s), "{s}");
        }
        // A class never covers what one request can cause for everyone; an exact key may.
        for s in NOT_BY_CLASS {
            assert_eq!(t.of(s), None, "{s}");
        }
        let exact = StatusTtl(BTreeMap::from([(
            StatusKey::Exact(403),
            Ttl(Duration::from_secs(7)),
        )]));
        assert_eq!(exact.of(403), Some(Duration::from_secs(7)));
    }
}
