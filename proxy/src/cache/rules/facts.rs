//! What a request has that the rules' conditions need, found once for all the rules: which of
//! the field names the rules name it carries (a bit each, for the first 62 names), whether it
//! carries a `Cookie` and a query, its path's first 8 bytes (against which a path prefix's
//! first 8 are one masked comparison), its host's last 16 (against a host glob's literal end)
//! and its client's bucket (against a `client_in` list's, `zerocache_config::cidr::bucket`). A
//! rule whose needs the request lacks is skipped with four mask tests before any of its
//! conditions runs: with 20 rules on a route most fail there, and the conditions cost 50 to 100
//! instructions a rule (callgrind) where this costs a few.
//!
//! A need is only ever a condition that cannot hold without it (a field condition without the
//! field, a cookie without `Cookie`, a query parameter without a query, a host glob without its
//! end, a client range without the client's bucket), so skipping never changes which rules
//! match; the conditions still decide for the rules that pass, unless the needs are all the
//! conditions say ([`Needs::decisive_when`]).

use crate::http::request::RequestHead;
use std::net::IpAddr;

/// `Needs::bits`' bit for a `Cookie` field, and for a query.
const COOKIE: u64 = 1 << 63;
const QUERY: u64 = 1 << 62;

/// The field names the rules' conditions read, lower case, each a bit of [`Facts::bits`].
#[derive(Debug, Default)]
pub(crate) struct FieldNames(Vec<String>);

impl FieldNames {
    /// `name`'s bit (0 past the 62nd name: a rule that reads it is not skipped for it).
    pub(crate) fn bit(&mut self, name: &str) -> u64 {
        let name = name.to_ascii_lowercase();
        let i = match self.0.iter().position(|n| *n == name) {
            Some(i) => i,
            None if self.0.len() < 62 => {
                self.0.push(name);
                self.0.len() - 1
            }
            None => return 0,
        };
        1 << i
    }
}

/// What a rule's conditions cannot hold without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Needs {
    /// The first bytes (up to 8) a path must start with, and which of the 8 they are.
    lead: u64,
    lead_mask: u64,
    /// Field names (a bit each), [`COOKIE`] and [`QUERY`].
    bits: u64,
    /// The last bytes (up to 16) a host must end with, and which of the 16 they are (16: a
    /// tenant's `*.name.example` differs from the request's `www.example` past the last 8).
    tail: u128,
    tail_mask: u128,
    /// The client buckets a `client_in` list covers (all of them without one).
    client: u64,
    /// These tests are the whole of the rule's `match`: a request that meets them matches.
    decisive: bool,
}

impl Default for Needs {
    fn default() -> Needs {
        Needs {
            lead: 0,
            lead_mask: 0,
            bits: 0,
            tail: 0,
            tail_mask: 0,
            client: u64::MAX,
            decisive: false,
        }
    }
}

impl Needs {
    /// Whether `f` has all of it (what [`Prefilter::passing`] finds for many at once).
    #[cfg(test)]
    pub(crate) fn met(&self, f: &Facts) -> bool {
        f.path8 & self.lead_mask == self.lead
            && self.bits & !f.bits == 0
            && f.host16 & self.tail_mask == self.tail
            && self.client & f.client != 0
    }

    /// Also needs the path to start with `prefix` (its first 8 bytes are what is checked here).
    pub(crate) fn path_starts_with(&mut self, prefix: &str) {
        let (lead, n) = lead(prefix.as_bytes());
        self.lead = lead;
        self.lead_mask = low_bytes(n);
    }

    /// Also needs the host to end with `suffix` (its last 16 bytes are what is checked here).
    pub(crate) fn host_ends_with(&mut self, suffix: &str) {
        let (tail, n) = tail(suffix.as_bytes());
        self.tail = tail;
        self.tail_mask = if n == 0 {
            0
        } else {
            u128::MAX << (8 * (16 - n))
        };
    }

    /// Also needs a field of this name's bit, a `Cookie`, a query.
    pub(crate) fn field(&mut self, bit: u64) {
        self.bits |= bit;
    }
    pub(crate) fn cookie(&mut self) {
        self.bits |= COOKIE;
    }
    pub(crate) fn query(&mut self) {
        self.bits |= QUERY;
    }

    /// Also needs the client in one of these buckets.
    pub(crate) fn client_in(&mut self, buckets: u64) {
        self.client &= buckets;
    }

    /// Says that these needs are all of the rule's conditions (only a path prefix of at most 8
    /// bytes, or nothing), so that a rule whose needs are met matches without its conditions
    /// being run.
    pub(crate) fn decisive_when(&mut self, whole: bool) {
        self.decisive = whole;
    }

    fn reads_fields(&self) -> bool {
        self.bits & !QUERY != 0
    }
}

/// The needs of a route's rules (at most 64, a bit each by place), arranged by kind so that a
/// request's passing rules are found with one test a need that some rule has, rather than four
/// a rule: a route of 20 rules, each with one or two conditions, costs some 20 tests.
#[derive(Debug, Default)]
pub(crate) struct Prefilter {
    all: u64,
    lead: Vec<(u64, u64, u64)>,
    bits: Vec<(u64, u64)>,
    tail: Vec<(u128, u128, u64)>,
    client: Vec<(u64, u64)>,
    decisive: u64,
}

impl Prefilter {
    /// The prefilter of rules with `needs`, in order.
    pub(crate) fn of(needs: &[Needs]) -> Prefilter {
        let mut p = Prefilter::default();
        for (i, n) in needs.iter().enumerate().take(64) {
            let bit = 1u64 << i;
            p.all |= bit;
            if n.lead_mask != 0 {
                p.lead.push((n.lead, n.lead_mask, bit));
            }
            if n.bits != 0 {
                p.bits.push((n.bits, bit));
            }
            if n.tail_mask != 0 {
                p.tail.push((n.tail, n.tail_mask, bit));
            }
            if n.client != u64::MAX {
                p.client.push((n.client, bit));
            }
            if n.decisive {
                p.decisive |= bit;
            }
        }
        p
    }

    /// The rules whose needs `f` meets, a bit each.
    #[inline]
    pub(crate) fn passing(&self, f: &Facts) -> u64 {
        let mut pass = self.all;
        for &(lead, mask, bit) in &self.lead {
            if f.path8 & mask != lead {
                pass &= !bit;
            }
        }
        for &(need, bit) in &self.bits {
            if need & !f.bits != 0 {
                pass &= !bit;
            }
        }
        for &(tail, mask, bit) in &self.tail {
            if f.host16 & mask != tail {
                pass &= !bit;
            }
        }
        for &(client, bit) in &self.client {
            if client & f.client == 0 {
                pass &= !bit;
            }
        }
        pass
    }

    /// Whether the rule at `i` matches when it passes (see [`Needs::decisive_when`]).
    #[inline]
    pub(crate) fn decisive(&self, i: u32) -> bool {
        self.decisive & (1 << i) != 0
    }
}

/// The low `n` bytes of a word set (`n` at most 8).
fn low_bytes(n: usize) -> u64 {
    if n >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * n)) - 1
    }
}

/// `s`'s 8 bytes from `at`, little-endian (`at + 8` at most its length).
fn word(s: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Up to the first 8 bytes of `s`, little-endian in a word (the rest 0), and how many. Every
/// request's path goes through here: 8 bytes or more are one load, not a copy of a length.
fn lead(s: &[u8]) -> (u64, usize) {
    if s.len() >= 8 {
        return (word(s, 0), 8);
    }
    let n = s.len();
    let mut w = [0u8; 8];
    w[..n].copy_from_slice(s);
    (u64::from_le_bytes(w), n)
}

/// Up to the last 16 bytes of `s`, in the high bytes of a little-endian double word (the rest
/// 0), and how many. From 8 bytes on, two loads: the last 8 are the high word, the first 8
/// shifted up to meet them the low one (what they share falls off its top).
fn tail(s: &[u8]) -> (u128, usize) {
    let len = s.len();
    if len >= 8 {
        let n = len.min(16);
        let high = word(s, len - 8);
        let low = word(s, len - n)
            .checked_shl(8 * (16 - n) as u32)
            .unwrap_or(0);
        return ((u128::from(high) << 64) | u128::from(low), n);
    }
    let mut w = [0u8; 16];
    w[16 - len..].copy_from_slice(s);
    (u128::from_le_bytes(w), len)
}

/// What one request has, of what the rules need.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Facts {
    bits: u64,
    /// The path's first 8 bytes (0 past its end: no path holds a NUL, so a shorter path never
    /// passes for a longer prefix).
    path8: u64,
    /// The host's last 16 bytes (0 before its start: no host holds a NUL either).
    host16: u128,
    /// The client's bucket.
    client: u64,
}

/// What the rules of a route need, together: what a request's [`Facts`] look for.
#[derive(Debug, Default)]
pub(crate) struct Wanted {
    names: FieldNames,
    /// Some rule reads a field (else the fields are not looked at).
    fields: bool,
}

impl Wanted {
    /// Everything `needs` ask for, with the names their bits stand for.
    pub(crate) fn of<'a>(names: FieldNames, mut needs: impl Iterator<Item = &'a Needs>) -> Wanted {
        Wanted {
            names,
            fields: needs.any(Needs::reads_fields),
        }
    }

    /// The facts of `req` from `client` (its `path` as the rules match it, its target's
    /// `query`: `?` and after, or nothing).
    pub(crate) fn facts(
        &self,
        req: &RequestHead,
        client: IpAddr,
        path: &str,
        query: &str,
    ) -> Facts {
        let mut f = Facts {
            bits: if query.len() > 1 { QUERY } else { 0 },
            path8: lead(path.as_bytes()).0,
            host16: tail(req.host.as_bytes()).0,
            client: zerocache_config::cidr::bucket(client),
        };
        if !self.fields {
            return f;
        }
        for (k, _) in &req.fields {
            if k.eq_ignore_ascii_case("cookie") {
                f.bits |= COOKIE;
            }
            for (i, n) in self.names.0.iter().enumerate() {
                if n.len() == k.len() && k.eq_ignore_ascii_case(n) {
                    f.bits |= 1 << i;
                }
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_is_skipped_only_for_what_its_conditions_cannot_do_without() {
        let mut names = FieldNames::default();
        let mut beta = Needs::default();
        beta.field(names.bit("X-Beta"));
        let mut jar = Needs::default();
        jar.cookie();
        let mut preview = Needs::default();
        preview.query();
        preview.field(names.bit("x-beta"));
        assert_eq!(names.bit("X-BETA"), 1, "one bit a name, whatever its case");
        let all = [beta, jar, preview, Needs::default()];
        let wanted = Wanted::of(names, all.iter());
        let req = |extra: &str| crate::http::request::test_request("GET", extra);
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        let bare = wanted.facts(&req(""), lo, "/", "");
        assert!(!beta.met(&bare) && !jar.met(&bare) && !preview.met(&bare));
        assert!(Needs::default().met(&bare));
        let full = wanted.facts(&req("x-BETA: 1\r\nCookie: a=1\r\n"), lo, "/", "?p=1");
        assert!(beta.met(&full) && jar.met(&full) && preview.met(&full));
        // `?` alone is no query to find a parameter in.
        assert!(!preview.met(&wanted.facts(&req("X-Beta: 1\r\n"), lo, "/", "?")));
        // A path prefix: its first 8 bytes, whatever its length; a shorter path never passes.
        let mut admin = Needs::default();
        admin.path_starts_with("/admin/");
        let mut long = Needs::default();
        long.path_starts_with("/blog/2026/");
        let at = |path: &str| wanted.facts(&req(""), lo, path, "");
        assert!(admin.met(&at("/admin/x")) && admin.met(&at("/admin/")));
        assert!(!admin.met(&at("/admin")) && !admin.met(&at("/obj/1")) && !admin.met(&at("")));
        assert!(long.met(&at("/blog/2026/x")) && long.met(&at("/blog/20")));
        assert!(!long.met(&at("/blog/2")) && !long.met(&at("/blog/1999/")));
        let mut root = Needs::default();
        root.path_starts_with("");
        assert!(root.met(&at("")) && root.met(&at("/x")));
        // Past 62 names, a name has no bit and never skips a rule.
        let mut many = FieldNames::default();
        for i in 0..62 {
            assert_eq!(many.bit(&format!("x-{i}")), 1 << i);
        }
        assert_eq!(many.bit("x-62"), 0);
    }

    #[test]
    fn the_first_and_last_bytes_are_those_of_a_byte_by_byte_copy() {
        let text = b"abcdefghijklmnopqrstuvwxyz";
        for len in 0..=text.len() {
            let s = &text[..len];
            let n = len.min(8);
            let mut w = [0u8; 8];
            w[..n].copy_from_slice(&s[..n]);
            assert_eq!(lead(s), (u64::from_le_bytes(w), n), "{len}");
            let n = len.min(16);
            let mut w = [0u8; 16];
            w[16 - n..].copy_from_slice(&s[len - n..]);
            assert_eq!(tail(s), (u128::from_le_bytes(w), n), "{len}");
        }
    }

    #[test]
    fn a_host_glob_needs_its_end_and_a_client_range_its_bucket() {
        let host = |h: &str| {
            let mut r = crate::http::request::test_request("GET", "");
            r.host = h.to_string();
            r
        };
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        let wanted = Wanted::default();
        let on = |h: &str, ip: IpAddr| wanted.facts(&host(h), ip, "/", "");
        let mut tenant = Needs::default();
        tenant.host_ends_with(".tenant6.example");
        assert!(tenant.met(&on("a.tenant6.example", lo)));
        assert!(!tenant.met(&on("a.tenant7.example", lo)) && !tenant.met(&on("bench.example", lo)));
        assert!(!tenant.met(&on("a.tenant6.example.org", lo)) && !tenant.met(&on("example", lo)));
        let mut long = Needs::default();
        long.host_ends_with(".eu.tenant6.example");
        assert!(
            long.met(&on("a.us.tenant6.example", lo)),
            "only the last 16 bytes are checked"
        );
        assert!(long.met(&on("a.eu.tenant6.example", lo)));
        assert!(!long.met(&on("tenant6.example", lo)) && !long.met(&on("a.tenant6.exampla", lo)));
        let mut short = Needs::default();
        short.host_ends_with(".io");
        assert!(short.met(&on("a.io", lo)) && short.met(&on(".io", lo)));
        assert!(
            !short.met(&on("io", lo)) && !short.met(&on("a.iox", lo)) && !short.met(&on("", lo))
        );
        let mut exact = Needs::default();
        exact.host_ends_with("");
        assert!(exact.met(&on("", lo)) && exact.met(&on("anything", lo)));
        let ten = zerocache_config::cidr::Cidr::parse("10.5.0.0/16").expect("cidr");
        let mut lan = Needs::default();
        lan.client_in(ten.buckets());
        assert!(lan.met(&on("h", "10.5.1.1".parse().expect("ip"))));
        assert!(
            lan.met(&on("h", "10.6.1.1".parse().expect("ip"))),
            "a bucket, not the range"
        );
        assert!(lan.met(&on("h", "::ffff:10.5.1.1".parse().expect("ip"))));
        assert!(!lan.met(&on("h", lo)) && !lan.met(&on("h", "::1".parse().expect("ip"))));
        assert!(Needs::default().met(&on("h", "::1".parse().expect("ip"))));
        // The prefilter finds for all the rules at once what `met` says of each.
        let mut admin = Needs::default();
        admin.path_starts_with("/admin/");
        admin.decisive_when(true);
        let rules = [tenant, short, exact, lan, Needs::default(), admin];
        let p = Prefilter::of(&rules);
        for (h, ip, path) in [
            ("a.tenant6.example", "10.5.0.1", "/"),
            ("a.io", "127.0.0.1", "/admin/x"),
            ("b.example", "::1", "/admin"),
            ("", "10.6.0.1", ""),
        ] {
            let f = wanted.facts(&host(h), ip.parse().expect("ip"), path, "");
            let want = (0..rules.len())
                .filter(|&i| rules[i].met(&f))
                .fold(0, |m, i| m | 1 << i);
            assert_eq!(p.passing(&f), want, "{h} {ip} {path}");
        }
        assert!(p.decisive(5) && !p.decisive(4));
    }
}
