//! Request ids: one per request, in the access log line and in the request sent upstream
//! (`logging.request_id_header`, `X-Request-Id` by default), so an origin's log and zerocache's
//! can be joined. A load balancer in front usually assigns one already: a valid id from a
//! `proxy.trusted_proxies` peer is kept; any other client's is replaced, so nobody can make
//! their requests look like someone else's in the origin's logs. Generated ids are 16 hex digits:
//! a per-process random prefix mixed with a counter, unique for the process's life, with no
//! syscall and no lock per request.

use crate::http::request::RequestHead;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use zerocache_config::cidr::Cidr;

/// The id of `req` from `peer`: a trusted proxy's (one of `trusted`, `proxy.trusted_proxies`),
/// when it sent a valid one in `header` (`logging.request_id_header`), else a new one.
pub fn of(req: &RequestHead, peer: IpAddr, trusted: &[Cidr], header: &str) -> String {
    if trusted.iter().any(|c| c.contains(peer))
        && let Some(v) = req
            .fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(header))
            .and_then(|(_, v)| accept(v))
    {
        return v.to_string();
    }
    generate()
}

/// Longest id kept from a trusted peer.
const MAX_LEN: usize = 128;

/// A fresh id.
pub fn generate() -> String {
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let pid = u64::from(std::process::id());
        xxhash_rust::xxh3::xxh3_64(&[t.to_le_bytes(), pid.to_le_bytes()].concat())
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // Distinct counters under one seed: two equal ids in a process would take a 64-bit hash
    // collision; across processes the seed differs.
    let id = xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), seed);
    format!("{id:016x}")
}

/// The id a trusted peer sent, if it is one we keep: 1 to 128 visible ASCII characters other
/// than `"` and `\` (it goes into log lines and an upstream header as it is).
pub fn accept(value: &[u8]) -> Option<&str> {
    let ok = !value.is_empty()
        && value.len() <= MAX_LEN
        && value
            .iter()
            .all(|&b| (0x21..0x7f).contains(&b) && b != b'"' && b != b'\\');
    if ok {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_16_hex_digits_and_distinct() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| generate()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(
            ids.iter()
                .all(|i| i.len() == 16 && i.bytes().all(|b| b.is_ascii_hexdigit()))
        );
    }

    #[test]
    fn only_visible_ascii_ids_are_kept() {
        assert_eq!(accept(b"abc-123_XYZ.9"), Some("abc-123_XYZ.9"));
        assert_eq!(accept(&[b'a'; 128]).map(str::len), Some(128));
        for bad in [
            &b""[..],
            b"has space",
            b"tab\there",
            b"quote\"",
            b"back\\slash",
            b"line\r\nX-Injected: 1",
            "caf\u{e9}".as_bytes(),
            &[b'a'; 129],
        ] {
            assert_eq!(accept(bad), None, "{bad:?}");
        }
    }
}
