//! Address ranges in CIDR notation (`10.0.0.0/8`, `::1/128`, or a bare address), for
//! `proxy.trusted_proxies`. Parsed once at load time so that a typo is a config error with its
//! line, not a peer silently left untrusted (or trusted).

use std::net::IpAddr;

/// An address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    /// Parses `addr/bits` or a bare address (all bits).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let net: IpAddr = a
            .parse()
            .map_err(|e| format!("`{s}` is not an address or CIDR: {e}"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => match b.parse::<u8>() {
                Ok(n) if n <= max && b.bytes().all(|c| c.is_ascii_digit()) => n,
                _ => return Err(format!("`{s}`: prefix length must be 0 to {max}")),
            },
        };
        Ok(Cidr { net, bits })
    }

    /// The buckets of [`bucket`] an address in the range can fall in, as bits: a prefilter that
    /// tells most addresses outside the range apart with one mask test.
    pub fn buckets(&self) -> u64 {
        match self.net {
            IpAddr::V4(n) if self.bits >= 8 => 1 << (n.octets()[0] % 63),
            IpAddr::V4(_) => (1 << 63) - 1,
            IpAddr::V6(_) => 1 << 63,
        }
    }

    /// True when `ip` is inside the range (an IPv4-mapped IPv6 peer counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - self.bits as u32).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - self.bits as u32).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// An address's bucket, a bit: an IPv4 address (an IPv4-mapped IPv6 one too, as [`Cidr::contains`]
/// takes it) by its first octet modulo 63, every other IPv6 address the 64th.
pub fn bucket(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(a) => 1 << (a.octets()[0] % 63),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(a) => 1 << (a.octets()[0] % 63),
            None => 1 << 63,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_contain_exactly_their_addresses() {
        let c = Cidr::parse("10.1.0.0/16").expect("valid");
        assert!(c.contains("10.1.255.3".parse().expect("ip")));
        assert!(!c.contains("10.2.0.1".parse().expect("ip")));
        assert!(c.contains("::ffff:10.1.0.9".parse().expect("ip")));
        let one = Cidr::parse("127.0.0.1").expect("valid");
        assert!(one.contains("127.0.0.1".parse().expect("ip")));
        assert!(!one.contains("127.0.0.2".parse().expect("ip")));
        let all = Cidr::parse("0.0.0.0/0").expect("valid");
        assert!(all.contains("8.8.8.8".parse().expect("ip")));
        assert!(!all.contains("::1".parse().expect("ip")));
        let v6 = Cidr::parse("fd00::/8").expect("valid");
        assert!(v6.contains("fd12::1".parse().expect("ip")));
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/+8",
            "nonsense",
            "::/129",
            "10.0.0/8",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_address_in_a_range_is_in_one_of_its_buckets() {
        let ranges = [
            "10.1.0.0/16",
            "127.0.0.1",
            "0.0.0.0/0",
            "64.0.0.0/3",
            "fd00::/8",
            "::/0",
        ];
        let addrs = [
            "10.1.2.3",
            "10.2.0.1",
            "127.0.0.1",
            "73.1.1.1",
            "64.0.0.1",
            "95.255.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::ffff:10.1.0.9",
            "::ffff:127.0.0.1",
            "fd12::1",
            "::1",
            "2001:db8::1",
        ];
        for r in ranges {
            let c = Cidr::parse(r).expect("valid");
            for a in addrs {
                let ip: IpAddr = a.parse().expect("ip");
                if c.contains(ip) {
                    assert_ne!(c.buckets() & bucket(ip), 0, "{a} in {r}");
                }
            }
        }
        // What the prefilter is for: most addresses outside a range are told apart.
        let c = Cidr::parse("10.1.0.0/16").expect("valid");
        assert_eq!(c.buckets() & bucket("127.0.0.1".parse().expect("ip")), 0);
        assert_eq!(c.buckets() & bucket("::1".parse().expect("ip")), 0);
        assert_eq!(bucket("::ffff:10.9.9.9".parse().expect("ip")), 1 << 10);
    }
}
