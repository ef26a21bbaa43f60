//! The PROXY protocol (HAProxy's proxy-protocol.txt, versions 1 and 2): the header a load
//! balancer (HAProxy, AWS NLB, ...) sends before the client's bytes, naming the client's address.
//! On a listener with `proxy_protocol: true`, every connection must start with one, from a peer
//! in `proxy_protocol_from`; its source address is then the client's for everything after it.
//!
//! Why own the parser: it is the first thing read from a socket, before any limit of HTTP's, so
//! every length is checked here against the bytes there are (a v1 line is at most 107 bytes; a v2
//! header at most [`V2_MAX`]), and the header is peeked, then consumed exactly, so the bytes after
//! it (a TLS ClientHello, a request) stay in the socket for whoever reads next.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v2 signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The longest v1 line, CRLF included (the specification's bound).
const V1_MAX: usize = 107;
/// The longest v2 header taken, its 16 fixed bytes included: the addresses and room for TLVs
/// (AWS's VPC endpoint id, HAProxy's SSL and unique-id ones). A longer one is refused.
pub(crate) const V2_MAX: usize = 16 + 1024;

/// What the start of a connection holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// Not enough bytes yet to know.
    Incomplete,
    /// A whole header of `len` bytes; `source` is the client's address, or `None` where the
    /// header names none (v2 `LOCAL`, a load balancer's own health check; v1 `UNKNOWN`; a v2
    /// family other than TCP over IPv4 or IPv6), when the connection's own peer stands.
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
}

/// Parses the header at the start of `buf`. `Err`: not a PROXY header, or a malformed one.
pub(crate) fn parse(buf: &[u8]) -> Result<Parsed, &'static str> {
    if buf.len() >= V2_SIGNATURE.len() && buf.starts_with(V2_SIGNATURE) {
        return v2(buf);
    }
    if buf.starts_with(b"PROXY ") {
        return v1(buf);
    }
    let n = buf.len().min(12);
    if V2_SIGNATURE.starts_with(&buf[..n]) || b"PROXY ".starts_with(&buf[..n.min(6)]) {
        return Ok(Parsed::Incomplete);
    }
    Err("no PROXY protocol header")
}

fn v1(buf: &[u8]) -> Result<Parsed, &'static str> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX {
            Err("PROXY v1 line longer than 107 bytes")
        } else if window.contains(&b'\n') || window.contains(&b'\r') && !window.ends_with(b"\r") {
            Err("PROXY v1 line with a stray CR or LF")
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    let len = end + 2;
    if window[..end].iter().any(|b| *b == b'\r' || *b == b'\n') {
        return Err("PROXY v1 line with a stray CR or LF");
    }
    let line = std::str::from_utf8(&window[..end]).map_err(|_| "PROXY v1 line not ASCII")?;
    let mut words = line.split(' ');
    let _proxy = words.next();
    let source = match words.next() {
        // Anything may follow UNKNOWN; the connection's own addresses stand.
        Some("UNKNOWN") => None,
        Some(proto @ ("TCP4" | "TCP6")) => {
            let src = words.next().ok_or("PROXY v1 without a source address")?;
            let dst = words
                .next()
                .ok_or("PROXY v1 without a destination address")?;
            let sport = words.next().ok_or("PROXY v1 without a source port")?;
            let dport = words.next().ok_or("PROXY v1 without a destination port")?;
            if words.next().is_some() {
                return Err("PROXY v1 line with more than six fields");
            }
            let ip: IpAddr = if proto == "TCP4" {
                IpAddr::V4(
                    src.parse::<Ipv4Addr>()
                        .map_err(|_| "PROXY v1 TCP4 source is no IPv4 address")?,
                )
            } else {
                IpAddr::V6(
                    src.parse::<Ipv6Addr>()
                        .map_err(|_| "PROXY v1 TCP6 source is no IPv6 address")?,
                )
            };
            let dst_ok = if proto == "TCP4" {
                dst.parse::<Ipv4Addr>().is_ok()
            } else {
                dst.parse::<Ipv6Addr>().is_ok()
            };
            if !dst_ok {
                return Err("PROXY v1 destination is not of the protocol's family");
            }
            let source_port = port(sport)?;
            port(dport)?;
            Some(SocketAddr::new(ip, source_port))
        }
        _ => return Err("PROXY v1 protocol is not TCP4, TCP6 or UNKNOWN"),
    };
    Ok(Parsed::Header { len, source })
}

/// A v1 port: decimal 0 to 65535 without a leading zero.
fn port(s: &str) -> Result<u16, &'static str> {
    let plain = !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
        && s.len() <= 5;
    if !plain {
        return Err("PROXY v1 port is not a decimal 0 to 65535");
    }
    s.parse()
        .map_err(|_| "PROXY v1 port is not a decimal 0 to 65535")
}

fn v2(buf: &[u8]) -> Result<Parsed, &'static str> {
    if buf.len() < 16 {
        return Ok(Parsed::Incomplete);
    }
    let (ver_cmd, family) = (buf[12], buf[13]);
    if ver_cmd >> 4 != 2 {
        return Err("PROXY v2 header of another version");
    }
    let local = match ver_cmd & 0x0f {
        0 => true,
        1 => false,
        _ => return Err("PROXY v2 command neither LOCAL nor PROXY"),
    };
    let body = u16::from_be_bytes([buf[14], buf[15]]) as usize;
    let len = 16 + body;
    if len > V2_MAX {
        return Err("PROXY v2 header longer than the bound taken");
    }
    if buf.len() < len {
        return Ok(Parsed::Incomplete);
    }
    let addrs = &buf[16..len];
    let source = match (family >> 4, family & 0x0f) {
        _ if local => None,
        // TCP over IPv4: src, dst, sport, dport.
        (1, 1) => {
            let a = addrs
                .get(..12)
                .ok_or("PROXY v2 IPv4 addresses past its length")?;
            let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            Some(SocketAddr::new(ip.into(), u16::from_be_bytes([a[8], a[9]])))
        }
        // TCP over IPv6.
        (2, 1) => {
            let a = addrs
                .get(..36)
                .ok_or("PROXY v2 IPv6 addresses past its length")?;
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&a[..16]);
            Some(SocketAddr::new(
                Ipv6Addr::from(ip).into(),
                u16::from_be_bytes([a[32], a[33]]),
            ))
        }
        // UNSPEC, UDP over IPv4 or IPv6, UNIX stream or datagram: the families the specification
        // lists, for which the connection's own addresses stand.
        (0, 0) | (1, 2) | (2, 2) | (3, 1) | (3, 2) => None,
        _ => return Err("PROXY v2 address family or transport unknown"),
    };
    // Whatever follows the addresses is TLVs, skipped whole: nothing in them is used.
    Ok(Parsed::Header { len, source })
}

/// Reads the PROXY header at the start of `sock`, waiting until `deadline` for its bytes: peeked
/// until whole (`net::opening`: a FIN or the deadline ends the wait, a stalled or half-sent
/// header holds nothing), then consumed exactly. Returns the client's address (`None`: the
/// header names none, so the peer stands), or why the connection must close.
pub(crate) async fn read(
    sock: &mut tokio::net::TcpStream,
    deadline: tokio::time::Instant,
) -> Result<Option<SocketAddr>, &'static str> {
    use super::opening::{Ended, peek_more};
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; V2_MAX];
    let mut seen = 0;
    let (len, source) = loop {
        seen = peek_more(sock, &mut buf, seen, deadline)
            .await
            .map_err(|e| match e {
                Ended::Closed => "connection closed before its PROXY header was whole",
                Ended::Deadline => "no whole PROXY header before limits.header_timeout",
                Ended::Failed => "connection failed before its PROXY header",
            })?;
        match parse(&buf[..seen])? {
            Parsed::Header { len, source } => break (len, source),
            Parsed::Incomplete if seen == buf.len() => return Err("PROXY header past its bound"),
            Parsed::Incomplete => {}
        }
    };
    sock.read_exact(&mut buf[..len])
        .await
        .map_err(|_| "connection failed inside its PROXY header")?;
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2_header(ver_cmd: u8, family: u8, addrs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(ver_cmd);
        h.push(family);
        h.extend_from_slice(&(addrs.len() as u16).to_be_bytes());
        h.extend_from_slice(addrs);
        h
    }

    fn ipv4_addrs() -> Vec<u8> {
        let mut a = vec![192, 0, 2, 7, 10, 0, 0, 1];
        a.extend_from_slice(&51234u16.to_be_bytes());
        a.extend_from_slice(&443u16.to_be_bytes());
        a
    }

    #[test]
    fn v1_names_the_client() {
        let line = b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 443\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(line),
            Ok(Parsed::Header {
                len: 41,
                source: Some("192.0.2.7:51234".parse().unwrap())
            })
        );
        let six = b"PROXY TCP6 2001:db8::7 2001:db8::1 65535 80\r\n";
        assert_eq!(
            parse(six),
            Ok(Parsed::Header {
                len: six.len(),
                source: Some("[2001:db8::7]:65535".parse().unwrap())
            })
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n"),
            Ok(Parsed::Header {
                len: 15,
                source: None
            })
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\nx"),
            Ok(Parsed::Header {
                len: 35,
                source: None
            })
        );
    }

    #[test]
    fn v2_names_the_client_and_skips_its_tlvs() {
        let mut addrs = ipv4_addrs();
        addrs.extend_from_slice(&[0x04, 0x00, 0x03, b'a', b'b', b'c']); // a TLV: skipped
        let h = v2_header(0x21, 0x11, &addrs);
        let mut with_request = h.clone();
        with_request.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(
            parse(&with_request),
            Ok(Parsed::Header {
                len: h.len(),
                source: Some("192.0.2.7:51234".parse().unwrap())
            })
        );
        let mut six = vec![0x20, 0x01, 0x0d, 0xb8];
        six.extend_from_slice(&[0; 11]);
        six.push(7);
        six.extend_from_slice(&[0; 16]);
        six.extend_from_slice(&8080u16.to_be_bytes());
        six.extend_from_slice(&443u16.to_be_bytes());
        assert_eq!(
            parse(&v2_header(0x21, 0x21, &six)),
            Ok(Parsed::Header {
                len: 16 + 36,
                source: Some("[2001:db8::7]:8080".parse().unwrap())
            })
        );
        // LOCAL (a health check), UNSPEC, UNIX and UDP: the connection's own peer stands.
        for (cmd, fam, addrs) in [
            (0x20, 0x00, vec![]),
            (0x20, 0x11, ipv4_addrs()),
            (0x21, 0x00, vec![]),
            (0x21, 0x31, vec![0; 216]),
            (0x21, 0x12, ipv4_addrs()),
        ] {
            let h = v2_header(cmd, fam, &addrs);
            assert_eq!(
                parse(&h),
                Ok(Parsed::Header {
                    len: h.len(),
                    source: None
                }),
                "{cmd:x} {fam:x}"
            );
        }
    }

    /// Every prefix of a good header is incomplete, never an error, never a header.
    #[test]
    fn prefixes_are_incomplete() {
        let v1 = b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 443\r\n".to_vec();
        let v2 = v2_header(0x21, 0x11, &ipv4_addrs());
        for whole in [v1, v2] {
            for n in 0..whole.len() {
                assert_eq!(
                    parse(&whole[..n]),
                    Ok(Parsed::Incomplete),
                    "{n} of {whole:?}"
                );
            }
        }
    }

    #[test]
    fn hostile_headers_are_refused() {
        let long = format!("PROXY TCP4 {} 10.0.0.1 1 2\r\n", "1".repeat(100));
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"GET / HTTP/1.1\r\n".to_vec(), "no PROXY protocol header"),
            (b"\x16\x03\x01\x02\x00".to_vec(), "no PROXY protocol header"),
            (long.into_bytes(), "PROXY v1 line longer than 107 bytes"),
            (
                vec![b'P', b'R', b'O', b'X', b'Y', b' ']
                    .into_iter()
                    .chain(std::iter::repeat_n(b'A', 120))
                    .collect(),
                "PROXY v1 line longer than 107 bytes",
            ),
            (
                b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 443\n".to_vec(),
                "PROXY v1 line with a stray CR or LF",
            ),
            (
                b"PROXY UNKNOWN\nx\r\n".to_vec(),
                "PROXY v1 line with a stray CR or LF",
            ),
            (
                b"PROXY UNKNOWN\rx\r\n".to_vec(),
                "PROXY v1 line with a stray CR or LF",
            ),
            (
                b"PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n".to_vec(),
                "PROXY v1 protocol is not TCP4, TCP6 or UNKNOWN",
            ),
            (
                b"PROXY  TCP4 1.2.3.4 1.2.3.4 1 2\r\n".to_vec(),
                "PROXY v1 protocol is not TCP4, TCP6 or UNKNOWN",
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 1\r\n".to_vec(),
                "PROXY v1 without a destination port",
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2 3\r\n".to_vec(),
                "PROXY v1 line with more than six fields",
            ),
            (
                b"PROXY TCP4 ::1 1.2.3.4 1 2\r\n".to_vec(),
                "PROXY v1 TCP4 source is no IPv4 address",
            ),
            (
                b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n".to_vec(),
                "PROXY v1 TCP6 source is no IPv6 address",
            ),
            (
                b"PROXY TCP4 01.2.3.4 1.2.3.4 1 2\r\n".to_vec(),
                "PROXY v1 TCP4 source is no IPv4 address",
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n".to_vec(),
                "PROXY v1 port is not a decimal 0 to 65535",
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 080 2\r\n".to_vec(),
                "PROXY v1 port is not a decimal 0 to 65535",
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 +1 2\r\n".to_vec(),
                "PROXY v1 port is not a decimal 0 to 65535",
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 1 \r\n".to_vec(),
                "PROXY v1 port is not a decimal 0 to 65535",
            ),
            (
                b"PROXY TCP4 1.2.3.\xff 1.2.3.4 1 2\r\n".to_vec(),
                "PROXY v1 line not ASCII",
            ),
            (
                v2_header(0x11, 0x11, &ipv4_addrs()),
                "PROXY v2 header of another version",
            ),
            (
                v2_header(0x22, 0x11, &ipv4_addrs()),
                "PROXY v2 command neither LOCAL nor PROXY",
            ),
            (
                v2_header(0x21, 0x11, &ipv4_addrs()[..11]),
                "PROXY v2 IPv4 addresses past its length",
            ),
            (
                v2_header(0x21, 0x21, &ipv4_addrs()),
                "PROXY v2 IPv6 addresses past its length",
            ),
            (
                v2_header(0x21, 0x41, &ipv4_addrs()),
                "PROXY v2 address family or transport unknown",
            ),
            (
                v2_header(0x21, 0x01, &ipv4_addrs()),
                "PROXY v2 address family or transport unknown",
            ),
            (
                v2_header(0x21, 0x30, &ipv4_addrs()),
                "PROXY v2 address family or transport unknown",
            ),
            (
                v2_header(0x21, 0x13, &ipv4_addrs()),
                "PROXY v2 address family or transport unknown",
            ),
            (
                v2_header(0x21, 0x11, &vec![0; V2_MAX - 15]),
                "PROXY v2 header longer than the bound taken",
            ),
        ];
        for (bytes, why) in cases {
            assert_eq!(
                parse(&bytes),
                Err(why),
                "{:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
        // A length past the packet is waited for, not read past: incomplete until it comes.
        let mut short = v2_header(0x21, 0x11, &ipv4_addrs());
        short[15] = 200;
        assert_eq!(parse(&short), Ok(Parsed::Incomplete));
    }
}
