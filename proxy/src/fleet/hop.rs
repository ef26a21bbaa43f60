//! The hop header that marks a request from a fleet peer:
//! `Zerocache-Fleet: v2 from=ID cfg=HASH op=OP ts=SECS nonce=HEX bh=HEX sig=HEX`.
//!
//! The fleet secret never travels: `sig` is an HMAC-SHA256, keyed by it, of everything else in
//! the header and of the request it is on (method, target, `Host`, and the body's SHA-256 `bh`),
//! so a captured header is good for that one request only. A member checks the signature in
//! constant time against `fleet.secret` and, during a rotation, `fleet.previous_secret`; then
//! that `ts` is within [`WINDOW`] of its own clock, and that the nonce was not seen within it
//! ([`Replay`]): a replayed peer request is refused even inside the window.
//!
//! The header is taken out of every request as it is read, valid or not: a client's copy never
//! reaches the origin or another peer, and only a request that proves the secret is treated as
//! a peer's (never forwarded again, which is what prevents loops, and allowed into the internal
//! endpoint). Refusals are counted by reason (`zerocache_fleet_hop_refused_total`).

use crate::http::request::RequestHead;
use ring::{digest, hmac, rand::SecureRandom};
use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The field's name (lower case, as request fields are compared).
pub(crate) const NAME: &str = "zerocache-fleet";
/// How far a peer's clock may be from ours, and how long a nonce is remembered.
pub(crate) const WINDOW: Duration = Duration::from_secs(30);
/// Nonces remembered at most per [`WINDOW`]: past this, peer requests are refused (the fleet's
/// own traffic cannot reach it below about 8,700 peer requests a second per member).
const MAX_NONCES: usize = 1 << 18;

/// What a valid hop header says about the peer that sent it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hop {
    /// The sending member's id.
    pub(crate) from: String,
    /// Its routing hash (see `zerocache_config::fleet::routing_hash`).
    pub(crate) cfg: u64,
    /// The internal operation asked for, if any.
    pub(crate) op: Option<String>,
}

/// Why a hop header was refused: the label of `zerocache_fleet_hop_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a v2 header of the expected shape, or more than one.
    Malformed,
    /// The signature is not the fleet's.
    Forged,
    /// Its time is outside the window (a replay of an old request, or a clock far off).
    Stale,
    /// Its nonce was seen within the window.
    Replayed,
    /// Too many nonces to remember: refused rather than unchecked.
    Overloaded,
}

impl Refused {
    /// Every reason, in metric order.
    pub(crate) const ALL: [Refused; 5] = [
        Refused::Malformed,
        Refused::Forged,
        Refused::Stale,
        Refused::Replayed,
        Refused::Overloaded,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::Forged => "forged",
            Refused::Stale => "stale",
            Refused::Replayed => "replayed",
            Refused::Overloaded => "overloaded",
        }
    }
}

/// The keys: the fleet secret, and the previous one while a rotation is under way.
pub(crate) struct Keys {
    current: hmac::Key,
    previous: Option<hmac::Key>,
}

impl Keys {
    /// `fleet.secret` and `fleet.previous_secret`.
    pub(crate) fn new(secret: &str, previous: Option<&str>) -> Keys {
        let key = |s: &str| hmac::Key::new(hmac::HMAC_SHA256, s.as_bytes());
        Keys {
            current: key(secret),
            previous: previous.map(key),
        }
    }
}

/// The request a header is for: what its signature covers besides the header itself.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    pub(crate) target: &'a str,
    /// The `Host` field as sent.
    pub(crate) host: &'a str,
    pub(crate) body: &'a [u8],
}

/// The header's own fields, parsed.
struct Fields<'a> {
    from: &'a str,
    cfg: u64,
    op: &'a str,
    ts: u64,
    nonce: u128,
    bh: &'a str,
    sig: Vec<u8>,
}

/// The bytes the signature covers.
fn signed(f: &Fields<'_>, r: &Request<'_>) -> Vec<u8> {
    format!(
        "zerocache-fleet v2\n{}\n{:016x}\n{}\n{}\n{:032x}\n{}\n{}\n{}\n{}",
        f.from, f.cfg, f.op, f.ts, f.nonce, f.bh, r.method, r.target, r.host
    )
    .into_bytes()
}

/// Equal in time independent of where `a` and `b` first differ (the length still shows): for
/// tokens compared as given (the PURGE method's).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn body_hash(body: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, body).as_ref())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The header line (name, value, CRLF) a member sends with peer request `r`; `op` names an
/// internal operation (`health`, `purge`), absent for a forwarded client request. The internal
/// endpoint is chosen by `op`, never by path, so no origin path is ever shadowed.
pub(crate) fn line(
    self_id: &str,
    cfg: u64,
    keys: &Keys,
    op: Option<&str>,
    r: &Request<'_>,
) -> String {
    line_at(self_id, cfg, keys, op, r, now_secs(), random_nonce())
}

fn random_nonce() -> u128 {
    let mut n = [0u8; 16];
    // The system's CSPRNG; it does not fail on Linux once booted, and a zero nonce would only
    // make this request look like a replay of another zero one.
    let _ = ring::rand::SystemRandom::new().fill(&mut n);
    u128::from_be_bytes(n)
}

fn line_at(
    self_id: &str,
    cfg: u64,
    keys: &Keys,
    op: Option<&str>,
    r: &Request<'_>,
    ts: u64,
    nonce: u128,
) -> String {
    let bh = body_hash(r.body);
    let f = Fields {
        from: self_id,
        cfg,
        op: op.unwrap_or("-"),
        ts,
        nonce,
        bh: &bh,
        sig: Vec::new(),
    };
    let sig = hmac::sign(&keys.current, &signed(&f, r));
    format!(
        "Zerocache-Fleet: v2 from={self_id} cfg={cfg:016x} op={} ts={ts} nonce={nonce:032x} bh={bh} sig={}\r\n",
        f.op,
        hex(sig.as_ref())
    )
}

fn parse(value: &[u8]) -> Option<Fields<'_>> {
    let text = std::str::from_utf8(value).ok()?;
    let mut parts = text.split_ascii_whitespace();
    if parts.next()? != "v2" {
        return None;
    }
    let (mut from, mut cfg, mut op, mut ts, mut nonce, mut bh, mut sig) =
        (None, None, None, None, None, None, None);
    for p in parts {
        let (k, v) = p.split_once('=')?;
        let slot = match k {
            "from" => from.replace(v).is_some(),
            "cfg" => cfg.replace(u64::from_str_radix(v, 16).ok()?).is_some(),
            "op" => op.replace(v).is_some(),
            "ts" => ts.replace(v.parse::<u64>().ok()?).is_some(),
            "nonce" => nonce
                .replace(u128::from_str_radix(v, 16).ok().filter(|_| v.len() == 32)?)
                .is_some(),
            "bh" => bh.replace(v).is_some(),
            "sig" => sig.replace(unhex(v)?).is_some(),
            _ => return None,
        };
        if slot {
            // A field twice: no member sends that.
            return None;
        }
    }
    Some(Fields {
        from: from?,
        cfg: cfg?,
        op: op?,
        ts: ts?,
        nonce: nonce?,
        bh: bh?,
        sig: sig?,
    })
}

/// The nonces seen within the last one or two windows.
pub(crate) struct Replay {
    current: HashSet<u128>,
    previous: HashSet<u128>,
    rotated: Instant,
}

impl Default for Replay {
    fn default() -> Self {
        Replay {
            current: HashSet::new(),
            previous: HashSet::new(),
            rotated: Instant::now(),
        }
    }
}

impl Replay {
    /// Remembers `nonce`; false if it was seen within the window (or too many were).
    fn first_use(&mut self, nonce: u128) -> Result<(), Refused> {
        if self.rotated.elapsed() >= WINDOW {
            self.previous = std::mem::take(&mut self.current);
            self.rotated = Instant::now();
        }
        if self.current.contains(&nonce) || self.previous.contains(&nonce) {
            return Err(Refused::Replayed);
        }
        if self.current.len() >= MAX_NONCES {
            return Err(Refused::Overloaded);
        }
        self.current.insert(nonce);
        Ok(())
    }
}

/// Checks a hop header `value` on request `r` at time `now` (Unix seconds).
fn verify(
    value: &[u8],
    r: &Request<'_>,
    keys: &Keys,
    replay: &parking_lot::Mutex<Replay>,
    now: u64,
) -> Result<Hop, Refused> {
    let f = parse(value).ok_or(Refused::Malformed)?;
    // The body hash is compared as text, like the rest of the signed bytes.
    if f.bh != body_hash(r.body) {
        return Err(Refused::Forged);
    }
    let msg = signed(&f, r);
    let ok = std::iter::once(&keys.current)
        .chain(keys.previous.as_ref())
        .any(|k| hmac::verify(k, &msg, &f.sig).is_ok());
    if !ok {
        return Err(Refused::Forged);
    }
    if f.ts.abs_diff(now) > WINDOW.as_secs() {
        return Err(Refused::Stale);
    }
    replay.lock().first_use(f.nonce)?;
    Ok(Hop {
        from: f.from.to_string(),
        cfg: f.cfg,
        op: (f.op != "-").then(|| f.op.to_string()),
    })
}

/// Removes every hop header from `req`, on a node without a fleet: a client's copy must not
/// reach the origin there either (the origin may be a member's, or trust it).
pub(crate) fn strip(req: &mut RequestHead) {
    req.fields.retain(|(k, _)| !k.eq_ignore_ascii_case(NAME));
}

/// Removes every hop header from `req` and returns what a valid one says; `None` for a request
/// without one, the reason for one refused. `body` is the request's whole body (empty for a
/// forwarded GET; `None`: too large to hold, so no peer's).
pub(crate) fn take(
    req: &mut RequestHead,
    body: Option<&[u8]>,
    keys: &Keys,
    replay: &parking_lot::Mutex<Replay>,
) -> Option<Result<Hop, Refused>> {
    let mut found = Vec::new();
    req.fields.retain(|(k, v)| {
        if k.eq_ignore_ascii_case(NAME) {
            found.push(v.clone());
            false
        } else {
            true
        }
    });
    let value = match found.as_slice() {
        [] => return None,
        [one] => one,
        // A request with two is no peer's: a member sends one.
        _ => return Some(Err(Refused::Malformed)),
    };
    let Some(body) = body else {
        return Some(Err(Refused::Malformed));
    };
    let host = req
        .fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("host"))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .unwrap_or_default();
    let r = Request {
        method: &req.method,
        target: &req.target,
        host,
        body,
    };
    Some(verify(value, &r, keys, replay, now_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef-secret";

    fn request() -> Request<'static> {
        Request {
            method: "POST",
            target: "/_zerocache/fleet/purge",
            host: "zerocache-fleet",
            body: br#"{"url":"http://a/x","epoch":3}"#,
        }
    }

    fn value(line: &str) -> Vec<u8> {
        line.trim_end()
            .strip_prefix("Zerocache-Fleet: ")
            .expect("prefix")
            .as_bytes()
            .to_vec()
    }

    #[test]
    fn a_signed_line_verifies_once_and_only_for_its_request() {
        let keys = Keys::new(SECRET, None);
        let replay = parking_lot::Mutex::new(Replay::default());
        let now = 1_800_000_000;
        let v = value(&line_at(
            "127.0.0.2:8080",
            0xabc,
            &keys,
            Some("purge"),
            &request(),
            now,
            7,
        ));
        let text = String::from_utf8(v.clone()).expect("utf8");
        assert!(!text.contains(SECRET), "the secret never travels: {text}");
        assert_eq!(
            verify(&v, &request(), &keys, &replay, now + 5),
            Ok(Hop {
                from: "127.0.0.2:8080".into(),
                cfg: 0xabc,
                op: Some("purge".into()),
            })
        );
        // The same header again, inside the window: a replay.
        assert_eq!(
            verify(&v, &request(), &keys, &replay, now + 6),
            Err(Refused::Replayed)
        );
        // On another request (body, target, method or host changed): not its signature.
        let fresh = |n| {
            value(&line_at(
                "127.0.0.2:8080",
                0xabc,
                &keys,
                Some("purge"),
                &request(),
                now,
                n,
            ))
        };
        let mut other = request();
        other.body = br#"{"prefix":"http://a/","epoch":3}"#;
        assert_eq!(
            verify(&fresh(8), &other, &keys, &replay, now),
            Err(Refused::Forged)
        );
        let mut other = request();
        other.host = "evil";
        assert_eq!(
            verify(&fresh(9), &other, &keys, &replay, now),
            Err(Refused::Forged)
        );
        let mut other = request();
        other.target = "/x";
        assert_eq!(
            verify(&fresh(10), &other, &keys, &replay, now),
            Err(Refused::Forged)
        );
        // Outside the window either way.
        assert_eq!(
            verify(&fresh(11), &request(), &keys, &replay, now + 31),
            Err(Refused::Stale)
        );
        assert_eq!(
            verify(&fresh(12), &request(), &keys, &replay, now - 31),
            Err(Refused::Stale)
        );
    }

    #[test]
    fn another_secret_is_a_forgery_and_the_previous_one_counts_during_a_rotation() {
        let replay = parking_lot::Mutex::new(Replay::default());
        let now = 1_800_000_000;
        let old = Keys::new("the-old-fleet-secret-0000", None);
        let v = value(&line_at("a", 1, &old, None, &request(), now, 1));
        let new_only = Keys::new(SECRET, None);
        assert_eq!(
            verify(&v, &request(), &new_only, &replay, now),
            Err(Refused::Forged)
        );
        let rotating = Keys::new(SECRET, Some("the-old-fleet-secret-0000"));
        assert!(verify(&v, &request(), &rotating, &replay, now).is_ok());
        // A tampered field breaks the signature.
        let t = String::from_utf8(value(&line_at("a", 1, &old, None, &request(), now, 2)))
            .expect("utf8")
            .replace("from=a", "from=b");
        assert_eq!(
            verify(t.as_bytes(), &request(), &rotating, &replay, now),
            Err(Refused::Forged)
        );
    }

    #[test]
    fn malformed_headers_are_refused_before_any_crypto() {
        let keys = Keys::new(SECRET, None);
        let replay = parking_lot::Mutex::new(Replay::default());
        let good = String::from_utf8(value(&line_at("a", 1, &keys, None, &request(), 5, 3)))
            .expect("utf8");
        for bad in [
            "v1 from=a cfg=1 key=0123456789abcdef-secret".to_string(),
            good.replace(" sig=", " sig=zz"),
            good.replace("nonce=", "nonce=1"),
            format!("{good} from=b"),
            format!("{good} extra=1"),
            good.replace("ts=5", "ts=-5"),
            String::new(),
        ] {
            assert_eq!(
                verify(bad.as_bytes(), &request(), &keys, &replay, 5),
                Err(Refused::Malformed),
                "{bad}"
            );
        }
        assert_eq!(
            verify(b"\xff\xfe", &request(), &keys, &replay, 5),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn the_nonce_memory_is_bounded_and_forgets_after_two_windows() {
        let mut r = Replay::default();
        assert_eq!(r.first_use(1), Ok(()));
        assert_eq!(r.first_use(1), Err(Refused::Replayed));
        r.rotated -= WINDOW;
        // One window later it is still remembered (in `previous`)...
        assert_eq!(r.first_use(1), Err(Refused::Replayed));
        r.rotated -= WINDOW;
        assert_eq!(r.first_use(2), Ok(()));
        // ...and forgotten after two.
        assert_eq!(r.first_use(1), Ok(()));
        r.current = (0..MAX_NONCES as u128).map(|n| n + 100).collect();
        assert_eq!(r.first_use(5), Err(Refused::Overloaded));
    }
}
