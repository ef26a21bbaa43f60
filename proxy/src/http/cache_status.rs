//! What the cache says it did, in a response's head: `X-Cache` (nginx's and Varnish's habit, one
//! token) and this cache's member of `Cache-Status` (RFC 9211), a typed value that every site
//! fills in (*what* happened) and [`CacheStatusField::render`] alone spells. `http::head` writes
//! them into every head the proxy sends.

use super::headers::put_digits;

/// This cache's member of `Cache-Status` (RFC 9211 §2): `zerocache` and its parameters, always
/// in the order `hit` | `fwd`, `fwd-status`, `ttl`, `stored`, `collapsed`, `detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CacheStatusField<'a> {
    /// Served from the cache without going forward (`hit`).
    pub hit: bool,
    /// Why the request went forward (`fwd=miss`, `fwd=stale`, a bypass reason).
    pub fwd: Option<&'a str>,
    /// The status the forward got (`fwd-status=304` for a revalidation).
    pub fwd_status: Option<u16>,
    /// Freshness left, in seconds (negative once stale).
    pub ttl: Option<i64>,
    /// The response was stored.
    pub stored: bool,
    /// The request waited for another request's fill.
    pub collapsed: bool,
    /// A token saying more (`stale`, `coalesced`, why a response was not stored, `peer`).
    pub detail: Option<&'a str>,
}

impl<'a> CacheStatusField<'a> {
    /// `hit; ttl=N`.
    pub(crate) fn hit(ttl: i64) -> CacheStatusField<'a> {
        CacheStatusField {
            hit: true,
            ttl: Some(ttl),
            ..Default::default()
        }
    }

    /// `fwd=<why>`.
    pub(crate) fn fwd(why: &'a str) -> CacheStatusField<'a> {
        CacheStatusField {
            fwd: Some(why),
            ..Default::default()
        }
    }

    /// The same with `detail=<token>`.
    pub(crate) fn detail(self, token: &'a str) -> CacheStatusField<'a> {
        CacheStatusField {
            detail: Some(token),
            ..self
        }
    }

    /// Appends the member's text (no field name, no line end).
    pub(crate) fn render(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"zerocache");
        if self.hit {
            out.extend_from_slice(b"; hit");
        }
        if let Some(f) = self.fwd {
            out.extend_from_slice(b"; fwd=");
            out.extend_from_slice(f.as_bytes());
        }
        if let Some(s) = self.fwd_status {
            out.extend_from_slice(b"; fwd-status=");
            put_digits(out, u64::from(s));
        }
        if let Some(t) = self.ttl {
            out.extend_from_slice(b"; ttl=");
            if t < 0 {
                out.push(b'-');
            }
            put_digits(out, t.unsigned_abs());
        }
        if self.stored {
            out.extend_from_slice(b"; stored");
        }
        if self.collapsed {
            out.extend_from_slice(b"; collapsed");
        }
        if let Some(d) = self.detail {
            out.extend_from_slice(b"; detail=");
            out.extend_from_slice(d.as_bytes());
        }
    }
}

/// The two fields that say what the cache did: `X-Cache` (nginx's and Varnish's habit, one
/// token) and `Cache-Status` (RFC 9211).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheFields<'a> {
    /// `X-Cache`'s token (`zerocache_ledger::CacheStatus::as_str`, or a peer's as relayed).
    pub x_cache: &'a str,
    /// The `Cache-Status` members of caches nearer the origin, as received (a fleet peer's).
    pub upstream: Option<&'a str>,
    /// This cache's member; `None` writes no `Cache-Status` (nor relays `upstream`).
    pub member: Option<CacheStatusField<'a>>,
}
