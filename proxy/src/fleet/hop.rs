//! The hop header that marks a request from a fleet peer: `Zerocache-Fleet: v1 from=ID
//! cfg=HASH key=SECRET`. It carries the fleet secret, so only members can make one. It is taken
//! out of every request as it is read, valid or not: a client's copy never reaches the origin
//! or another peer, and only a request proving the secret is treated as a peer's (never
//! forwarded again, which is what prevents loops, and allowed into the internal endpoint).
//! The secret travels in clear text, so peers must talk over a network clients cannot sniff
//! (the docs say so).

use crate::http::request::RequestHead;

/// The field's name (lower case, as request fields are compared).
pub(crate) const NAME: &str = "zerocache-fleet";

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

/// The header line (name, value, CRLF) a member sends with a peer request; `op` names an
/// internal operation (`health`, `purge`), absent for a forwarded client request. The internal
/// endpoint is chosen by `op`, never by path, so no origin path is ever shadowed.
pub(crate) fn line(self_id: &str, cfg: u64, secret: &str, op: Option<&str>) -> String {
    let op = op.map(|o| format!(" op={o}")).unwrap_or_default();
    format!("Zerocache-Fleet: v1 from={self_id} cfg={cfg:016x}{op} key={secret}\r\n")
}

/// Equal in time independent of where `a` and `b` first differ (the length still shows).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Parses a hop header value; `None` unless it is well formed and carries `secret`.
pub(crate) fn parse(value: &[u8], secret: &str) -> Option<Hop> {
    let text = std::str::from_utf8(value).ok()?;
    let mut parts = text.split_ascii_whitespace();
    if parts.next()? != "v1" {
        return None;
    }
    let (mut from, mut cfg, mut key, mut op) = (None, None, None, None);
    for p in parts {
        let (k, v) = p.split_once('=')?;
        match k {
            "from" => from = Some(v),
            "cfg" => cfg = u64::from_str_radix(v, 16).ok(),
            "key" => key = Some(v),
            "op" => op = Some(v.to_string()),
            _ => {}
        }
    }
    if !constant_time_eq(key?.as_bytes(), secret.as_bytes()) {
        return None;
    }
    Some(Hop {
        from: from?.to_string(),
        cfg: cfg?,
        op,
    })
}

/// Removes every hop header from `req` and returns what a valid one says (a request with two
/// is no peer's: a member sends one).
pub(crate) fn take(req: &mut RequestHead, secret: &str) -> Option<Hop> {
    let mut found = Vec::new();
    req.fields.retain(|(k, v)| {
        if k.eq_ignore_ascii_case(NAME) {
            found.push(parse(v, secret));
            false
        } else {
            true
        }
    });
    match found.as_slice() {
        [Some(h)] => Some(h.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef-secret";

    #[test]
    fn a_line_parses_back_only_with_the_secret() {
        let l = line("127.0.0.2:8080", 0xabc, SECRET, Some("health"));
        let value = l
            .trim_end()
            .strip_prefix("Zerocache-Fleet: ")
            .expect("prefix");
        assert_eq!(
            parse(value.as_bytes(), SECRET),
            Some(Hop {
                from: "127.0.0.2:8080".into(),
                cfg: 0xabc,
                op: Some("health".into()),
            })
        );
        assert_eq!(parse(value.as_bytes(), "0123456789abcdef-secreT"), None);
        assert_eq!(parse(value.as_bytes(), "short"), None);
        assert_eq!(parse(b"v1 from=a cfg=1", SECRET), None);
        assert_eq!(parse(b"v2 from=a cfg=1 key=x", SECRET), None);
        assert_eq!(parse(b"\xff\xfe", SECRET), None);
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }
}
