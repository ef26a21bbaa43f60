//! The hop header that marks a request from a fleet peer:
//! `Zerocache-Fleet: v3 from=ID to=ID cfg=HASH op=OP ts=SECS nonce=HEX bh=HEX sig=HEX`.
//!
//! The fleet secret never travels: `sig` is an HMAC-SHA256, keyed by it, of everything else in
//! the header and of the request it is on (method, target, `Host`, and the body's SHA-256 `bh`),
//! so a captured header is good for that one request at that one member (`to`) only. A member
//! checks the signature in constant time against `fleet.secret` and, during a rotation,
//! `fleet.previous_secret`; then that `ts` is within [`WINDOW`] of its own clock, that `to` is
//! itself (a purge signed for one member, replayed to another within the window, is refused),
//! and that the nonce was not seen within the window ([`Replay`]): a replayed peer request is
//! refused even at its own member.
//!
//! Version 2 (the releases before 2026-12-05) has no `to`: a member signs with it only when
//! `fleet.hop_version: 2`, and accepts it only then or with `fleet.accept_hop_v2`, the steps of
//! upgrading a fleet from such a release (docs/fleet.md).
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
    /// Not a v2 or v3 header of the expected shape, or more than one.
    Malformed,
    /// The signature is not the fleet's.
    Forged,
    /// Its time is outside the window (a replay of an old request, or a clock far off).
    Stale,
    /// Its nonce was seen within the window.
    Replayed,
    /// Too many nonces to remember: refused rather than unchecked.
    Overloaded,
    /// Signed for another member (`to`), or this member does not know its own id yet.
    Misdirected,
    /// A version-2 header (no `to`), not accepted here (`fleet.accept_hop_v2`).
    Unaddressed,
}

impl Refused {
    /// Every reason, in metric order.
    pub(crate) const ALL: [Refused; 7] = [
        Refused::Malformed,
        Refused::Forged,
        Refused::Stale,
        Refused::Replayed,
        Refused::Overloaded,
        Refused::Misdirected,
        Refused::Unaddressed,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::Forged => "forged",
            Refused::Stale => "stale",
            Refused::Replayed => "replayed",
            Refused::Overloaded => "overloaded",
            Refused::Misdirected => "misdirected",
            Refused::Unaddressed => "unaddressed",
        }
    }
}

/// The keys: the fleet secret, and the previous one while a rotation is under way; and the
/// header versions signed and accepted.
pub(crate) struct Keys {
    current: hmac::Key,
    previous: Option<hmac::Key>,
    /// Sign with version 2 (no `to`): `fleet.hop_version: 2`.
    sign_v2: bool,
    /// Accept version 2: `fleet.hop_version: 2` or `fleet.accept_hop_v2`.
    accept_v2: bool,
}

impl Keys {
    /// The keys and versions of `fleet:`.
    pub(crate) fn of(cfg: &zerocache_config::fleet::FleetConfig) -> Keys {
        Keys::new(
            &cfg.secret,
            cfg.previous_secret.as_deref(),
            cfg.hop_version,
            cfg.accept_hop_v2,
        )
    }

    /// `secret`, `previous`, signing with `version` (2 or 3), accepting version 2 too when
    /// `accept_v2` (always when signing with it).
    fn new(secret: &str, previous: Option<&str>, version: u8, accept_v2: bool) -> Keys {
        let key = |s: &str| hmac::Key::new(hmac::HMAC_SHA256, s.as_bytes());
        Keys {
            current: key(secret),
            previous: previous.map(key),
            sign_v2: version == 2,
            accept_v2: accept_v2 || version == 2,
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
    /// The member it was signed for: `None` in a version-2 header.
    to: Option<&'a str>,
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
    // The version is the first line, so a header of one version can never verify as the other.
    let head = match f.to {
        Some(to) => format!("zerocache-fleet v3\n{}\n{to}", f.from),
        None => format!("zerocache-fleet v2\n{}", f.from),
    };
    format!(
        "{head}\n{:016x}\n{}\n{}\n{:032x}\n{}\n{}\n{}\n{}",
        f.cfg, f.op, f.ts, f.nonce, f.bh, r.method, r.target, r.host
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

/// The header line (name, value, CRLF) a member sends with peer request `r` to member `to`;
/// `op` names an internal operation (`health`, `purge`), absent for a forwarded client request.
/// The internal endpoint is chosen by `op`, never by path, so no origin path is ever shadowed.
pub(crate) fn line(
    self_id: &str,
    to: &str,
    cfg: u64,
    keys: &Keys,
    op: Option<&str>,
    r: &Request<'_>,
) -> String {
    line_at(self_id, to, cfg, keys, op, r, now_secs(), random_nonce())
}

fn random_nonce() -> u128 {
    let mut n = [0u8; 16];
    // The system's CSPRNG; it does not fail on Linux once booted, and a zero nonce would only
    // make this request look like a replay of another zero one.
    let _ = ring::rand::SystemRandom::new().fill(&mut n);
    u128::from_be_bytes(n)
}

#[allow(clippy::too_many_arguments)]
fn line_at(
    self_id: &str,
    to: &str,
    cfg: u64,
    keys: &Keys,
    op: Option<&str>,
    r: &Request<'_>,
    ts: u64,
    nonce: u128,
) -> String {
    let bh = body_hash(r.body);
    let f = Fields {
        to: (!keys.sign_v2).then_some(to),
        from: self_id,
        cfg,
        op: op.unwrap_or("-"),
        ts,
        nonce,
        bh: &bh,
        sig: Vec::new(),
    };
    let sig = hmac::sign(&keys.current, &signed(&f, r));
    let (version, to) = match f.to {
        Some(to) => ("v3", format!(" to={to}")),
        None => ("v2", String::new()),
    };
    format!(
        "Zerocache-Fleet: {version} from={self_id}{to} cfg={cfg:016x} op={} ts={ts} nonce={nonce:032x} bh={bh} sig={}\r\n",
        f.op,
        hex(sig.as_ref())
    )
}

fn parse(value: &[u8]) -> Option<Fields<'_>> {
    let text = std::str::from_utf8(value).ok()?;
    let mut parts = text.split_ascii_whitespace();
    let v3 = match parts.next()? {
        "v3" => true,
        "v2" => false,
        _ => return None,
    };
    let (mut to, mut from, mut cfg, mut op, mut ts, mut nonce, mut bh, mut sig) =
        (None, None, None, None, None, None, None, None);
    for p in parts {
        let (k, v) = p.split_once('=')?;
        let slot = match k {
            // Only version 3 names the member it is for.
            "to" if v3 => to.replace(v).is_some(),
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
    if v3 && to.is_none() {
        return None;
    }
    Some(Fields {
        to,
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

/// Who checks a header: this member's id (`None` while it is not in its own membership view),
/// the address the request's connection came in on, and its nonce memory.
///
/// A header is this member's when its `to` is either: a name that resolves to several addresses
/// (a dual-stack name, a multi-homed host) makes each a member id, so a peer may know this
/// member under an address other than its own id, and dials that address. A header signed for
/// another member names an address this connection did not come in on.
pub(crate) struct Receiver<'a> {
    pub(crate) self_id: Option<&'a str>,
    pub(crate) dialled: Option<&'a str>,
    pub(crate) replay: &'a parking_lot::Mutex<Replay>,
}

/// Checks a hop header `value` on request `r` at time `now` (Unix seconds).
fn verify(
    value: &[u8],
    r: &Request<'_>,
    keys: &Keys,
    at: &Receiver<'_>,
    now: u64,
) -> Result<Hop, Refused> {
    let f = parse(value).ok_or(Refused::Malformed)?;
    if f.to.is_none() && !keys.accept_v2 {
        return Err(Refused::Unaddressed);
    }
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
    if let Some(to) = f.to
        && at.self_id != Some(to)
        && at.dialled != Some(to)
    {
        return Err(Refused::Misdirected);
    }
    at.replay.lock().first_use(f.nonce)?;
    Ok(Hop {
        from: f.from.to_string(),
        cfg: f.cfg,
        op: (f.op != "-").then(|| f.op.to_string()),
    })
}

/// Whether `req` carries a hop header (valid or not).
pub(crate) fn present(req: &RequestHead) -> bool {
    req.fields.iter().any(|(k, _)| k.eq_ignore_ascii_case(NAME))
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
    at: &Receiver<'_>,
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
    Some(verify(value, &r, keys, at, now_secs()))
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

    /// The member checking, in these tests.
    const ME: &str = "127.0.0.3:8080";

    fn me(replay: &parking_lot::Mutex<Replay>) -> Receiver<'_> {
        Receiver {
            self_id: Some(ME),
            dialled: Some(ME),
            replay,
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
        let keys = Keys::new(SECRET, None, 3, false);
        let replay = parking_lot::Mutex::new(Replay::default());
        let now = 1_800_000_000;
        let v = value(&line_at(
            "127.0.0.2:8080",
            ME,
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
            verify(&v, &request(), &keys, &me(&replay), now + 5),
            Ok(Hop {
                from: "127.0.0.2:8080".into(),
                cfg: 0xabc,
                op: Some("purge".into()),
            })
        );
        // The same header again, inside the window: a replay.
        assert_eq!(
            verify(&v, &request(), &keys, &me(&replay), now + 6),
            Err(Refused::Replayed)
        );
        // On another request (body, target, method or host changed): not its signature.
        let fresh = |n| {
            value(&line_at(
                "127.0.0.2:8080",
                ME,
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
            verify(&fresh(8), &other, &keys, &me(&replay), now),
            Err(Refused::Forged)
        );
        let mut other = request();
        other.host = "evil";
        assert_eq!(
            verify(&fresh(9), &other, &keys, &me(&replay), now),
            Err(Refused::Forged)
        );
        let mut other = request();
        other.target = "/x";
        assert_eq!(
            verify(&fresh(10), &other, &keys, &me(&replay), now),
            Err(Refused::Forged)
        );
        // Outside the window either way.
        assert_eq!(
            verify(&fresh(11), &request(), &keys, &me(&replay), now + 31),
            Err(Refused::Stale)
        );
        assert_eq!(
            verify(&fresh(12), &request(), &keys, &me(&replay), now - 31),
            Err(Refused::Stale)
        );
    }

    #[test]
    fn another_secret_is_a_forgery_and_the_previous_one_counts_during_a_rotation() {
        let replay = parking_lot::Mutex::new(Replay::default());
        let now = 1_800_000_000;
        let old = Keys::new("the-old-fleet-secret-0000", None, 3, false);
        let v = value(&line_at("a", ME, 1, &old, None, &request(), now, 1));
        let new_only = Keys::new(SECRET, None, 3, false);
        assert_eq!(
            verify(&v, &request(), &new_only, &me(&replay), now),
            Err(Refused::Forged)
        );
        let rotating = Keys::new(SECRET, Some("the-old-fleet-secret-0000"), 3, false);
        assert!(verify(&v, &request(), &rotating, &me(&replay), now).is_ok());
        // A tampered field breaks the signature.
        let t = String::from_utf8(value(&line_at("a", ME, 1, &old, None, &request(), now, 2)))
            .expect("utf8")
            .replace("from=a", "from=b");
        assert_eq!(
            verify(t.as_bytes(), &request(), &rotating, &me(&replay), now),
            Err(Refused::Forged)
        );
    }

    #[test]
    fn malformed_headers_are_refused_before_any_crypto() {
        let keys = Keys::new(SECRET, None, 3, false);
        let replay = parking_lot::Mutex::new(Replay::default());
        let good = String::from_utf8(value(&line_at("a", ME, 1, &keys, None, &request(), 5, 3)))
            .expect("utf8");
        for bad in [
            "v1 from=a cfg=1 key=0123456789abcdef-secret".to_string(),
            good.replace(" sig=", " sig=zz"),
            good.replace("nonce=", "nonce=1"),
            format!("{good} from=b"),
            format!("{good} extra=1"),
            // v3 without `to`, v3 with two, v2 with one.
            good.replace(" to=127.0.0.3:8080", ""),
            format!("{good} to=b"),
            good.replace("v3 ", "v2 "),
            good.replace("ts=5", "ts=-5"),
            String::new(),
        ] {
            assert_eq!(
                verify(bad.as_bytes(), &request(), &keys, &me(&replay), 5),
                Err(Refused::Malformed),
                "{bad}"
            );
        }
        assert_eq!(
            verify(b"\xff\xfe", &request(), &keys, &me(&replay), 5),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn a_header_signed_for_one_member_is_refused_by_another() {
        let keys = Keys::new(SECRET, None, 3, false);
        let replay = parking_lot::Mutex::new(Replay::default());
        let now = 1_800_000_000;
        let to = |to, n| {
            value(&line_at(
                "a",
                to,
                1,
                &keys,
                Some("purge"),
                &request(),
                now,
                n,
            ))
        };
        let text = String::from_utf8(to(ME, 1)).expect("utf8");
        assert!(
            text.starts_with("v3 from=a to=127.0.0.3:8080 cfg="),
            "{text}"
        );
        // The same purge signed for member .4, replayed here inside the window.
        assert_eq!(
            verify(
                &to("127.0.0.4:8080", 2),
                &request(),
                &keys,
                &me(&replay),
                now
            ),
            Err(Refused::Misdirected)
        );
        // Its `to` rewritten to this member: the signature covers it.
        let moved = String::from_utf8(to("127.0.0.4:8080", 3))
            .expect("utf8")
            .replace("to=127.0.0.4:8080", "to=127.0.0.3:8080");
        assert_eq!(
            verify(moved.as_bytes(), &request(), &keys, &me(&replay), now),
            Err(Refused::Forged)
        );
        // A member that does not know its own id yet is the one a header names only at the
        // address it was dialled at.
        let lost = Receiver {
            self_id: None,
            dialled: Some("127.0.0.9:8080"),
            replay: &replay,
        };
        assert_eq!(
            verify(&to(ME, 4), &request(), &keys, &lost, now),
            Err(Refused::Misdirected)
        );
        // Known to its peers under another address of its name (`localhost` is 127.0.0.1 and
        // ::1): the address the connection came in on is its own too.
        let alias = Receiver {
            self_id: Some(ME),
            dialled: Some("[::1]:8080"),
            replay: &replay,
        };
        assert!(verify(&to("[::1]:8080", 5), &request(), &keys, &alias, now).is_ok());
        assert_eq!(
            verify(&to("[::1]:8081", 6), &request(), &keys, &alias, now),
            Err(Refused::Misdirected)
        );
        // The misdirected copies did not use up the nonce at its own member.
        assert!(verify(&to(ME, 2), &request(), &keys, &me(&replay), now).is_ok());
    }

    #[test]
    fn version_2_is_signed_and_accepted_only_while_a_fleet_upgrades() {
        let replay = parking_lot::Mutex::new(Replay::default());
        let now = 1_800_000_000;
        // Step 1 of the upgrade: `hop_version: 2` signs without `to` and accepts both.
        let old = Keys::new(SECRET, None, 2, false);
        let v2 = |n| value(&line_at("a", ME, 1, &old, None, &request(), now, n));
        let text = String::from_utf8(v2(1)).expect("utf8");
        assert!(text.starts_with("v2 from=a cfg="), "{text}");
        assert!(!text.contains(" to="), "{text}");
        assert!(verify(&v2(1), &request(), &old, &me(&replay), now).is_ok());
        let v3 = |n| {
            value(&line_at(
                "a",
                ME,
                1,
                &Keys::new(SECRET, None, 3, false),
                None,
                &request(),
                now,
                n,
            ))
        };
        assert!(verify(&v3(2), &request(), &old, &me(&replay), now).is_ok());
        // Step 2: signing with 3, still accepting 2.
        let middle = Keys::new(SECRET, None, 3, true);
        assert!(verify(&v2(3), &request(), &middle, &me(&replay), now).is_ok());
        // Done (the default): a version-2 header is refused, however well signed.
        let new = Keys::new(SECRET, None, 3, false);
        assert_eq!(
            verify(&v2(4), &request(), &new, &me(&replay), now),
            Err(Refused::Unaddressed)
        );
        // A v2 header relabelled v3 (with a `to` added) does not verify: the version is signed.
        let relabelled = String::from_utf8(v2(5))
            .expect("utf8")
            .replace("v2 from=a", "v3 from=a to=127.0.0.3:8080");
        assert_eq!(
            verify(relabelled.as_bytes(), &request(), &new, &me(&replay), now),
            Err(Refused::Forged)
        );
        // A v3 header relabelled v2 (its `to` dropped): forged where v2 is accepted.
        let dropped = String::from_utf8(v3(6))
            .expect("utf8")
            .replace("v3 from=a to=127.0.0.3:8080", "v2 from=a");
        assert_eq!(
            verify(dropped.as_bytes(), &request(), &middle, &me(&replay), now),
            Err(Refused::Forged)
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
