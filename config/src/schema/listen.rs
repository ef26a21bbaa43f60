//! `listen` (and `tls.listen`): where the proxy accepts connections. Each entry is a `host:port`,
//! or a map with the same address under `addr` and the options of that listener; the map is the
//! one shape listener options take (`proxy_protocol`, HTTP/2's `h2c`).
//!
//! Why a map and not more top-level keys: options belong to a socket (a load balancer's PROXY
//! header arrives on one port, plain clients on another), and an entry says which.

use serde::{Deserialize, Serialize};

/// `listen`: one entry or a list, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// `listen: 127.0.0.1:8080`.
    One(ListenEntry),
    /// `listen: [127.0.0.1:8080, {addr: "[::1]:8080", proxy_protocol: true, ...}]`.
    Many(Vec<ListenEntry>),
}

/// One listener: its address and options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenEntry {
    /// `host:port`.
    pub addr: String,
    /// Every connection starts with a PROXY protocol header (v1 or v2, as HAProxy and AWS NLB
    /// send), whose source address is the client's for everything after it (access log,
    /// `X-Forwarded-For`, trusted proxies, the fleet). A connection without one is closed.
    pub proxy_protocol: bool,
    /// The peers (CIDRs or addresses) a PROXY header is taken from; a connection from any other
    /// is closed. Required with `proxy_protocol`: whoever can reach the port could otherwise
    /// claim any address.
    pub proxy_protocol_from: Vec<String>,
    /// HTTP/2 without TLS, with prior knowledge (RFC 9113 §3.3): a connection that opens with
    /// the HTTP/2 preface speaks h2, any other HTTP/1.1. Off by default; never on the TLS
    /// listener (there ALPN chooses: `tls.http2`), and never by `Upgrade: h2c`.
    pub h2c: bool,
}

impl ListenEntry {
    /// A plain `host:port` entry.
    pub fn plain(addr: impl Into<String>) -> ListenEntry {
        ListenEntry {
            addr: addr.into(),
            proxy_protocol: false,
            proxy_protocol_from: Vec::new(),
            h2c: false,
        }
    }
}

impl Listen {
    /// Every entry written, in order.
    pub fn entries(&self) -> Vec<&ListenEntry> {
        match self {
            Listen::One(e) => vec![e],
            Listen::Many(v) => v.iter().collect(),
        }
    }

    /// Every socket address to bind with the entry it comes from: each entry resolved (names to
    /// all their addresses), duplicates removed, in order.
    pub fn bound(&self) -> Result<Vec<(std::net::SocketAddr, &ListenEntry)>, String> {
        use std::net::ToSocketAddrs;
        let mut out: Vec<(std::net::SocketAddr, &ListenEntry)> = Vec::new();
        for e in self.entries() {
            let resolved = e
                .addr
                .to_socket_addrs()
                .map_err(|err| format!("`{}` is not an address (host:port): {err}", e.addr))?;
            for a in resolved {
                if !out.iter().any(|(b, _)| *b == a) {
                    out.push((a, e));
                }
            }
        }
        if out.is_empty() {
            return Err("no address to listen on".into());
        }
        Ok(out)
    }

    /// Every socket address to bind (see [`Listen::bound`]).
    pub fn addrs(&self) -> Result<Vec<std::net::SocketAddr>, String> {
        Ok(self.bound()?.into_iter().map(|(a, _)| a).collect())
    }

    /// The checks of the entries' options, as (key path under `at`, why).
    pub fn problems(&self, at: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, e) in self.entries().into_iter().enumerate() {
            let key = match self {
                Listen::One(_) => at.to_string(),
                Listen::Many(_) => format!("{at}[{i}]"),
            };
            if e.proxy_protocol && e.proxy_protocol_from.is_empty() {
                out.push((
                    format!("{key}.proxy_protocol_from"),
                    "is needed with proxy_protocol: the load balancers' addresses (CIDRs), since whoever can reach the port could otherwise claim any client address".into(),
                ));
            }
            if !e.proxy_protocol && !e.proxy_protocol_from.is_empty() {
                out.push((
                    format!("{key}.proxy_protocol_from"),
                    "has no meaning without `proxy_protocol: true`".into(),
                ));
            }
            for (j, c) in e.proxy_protocol_from.iter().enumerate() {
                if let Err(why) = crate::cidr::Cidr::parse(c) {
                    out.push((format!("{key}.proxy_protocol_from[{j}]"), why));
                }
            }
        }
        out
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all: Vec<String> = self
            .entries()
            .iter()
            .map(|e| {
                let mut s = e.addr.clone();
                if e.proxy_protocol {
                    s.push_str(" (PROXY protocol)");
                }
                if e.h2c {
                    s.push_str(" (h2c)");
                }
                s
            })
            .collect();
        f.write_str(&all.join(", "))
    }
}

/// The map form of an entry, as written.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct EntryMap {
    addr: String,
    #[serde(default)]
    proxy_protocol: bool,
    #[serde(default)]
    proxy_protocol_from: Vec<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    h2c: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Serialize for ListenEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !self.proxy_protocol && self.proxy_protocol_from.is_empty() && !self.h2c {
            return s.serialize_str(&self.addr);
        }
        EntryMap {
            addr: self.addr.clone(),
            proxy_protocol: self.proxy_protocol,
            proxy_protocol_from: self.proxy_protocol_from.clone(),
            h2c: self.h2c,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ListenEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ListenEntry, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ListenEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an address (`host:port`) or a map with `addr` and options")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ListenEntry, E> {
                Ok(ListenEntry::plain(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ListenEntry, A::Error> {
                let m = EntryMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ListenEntry {
                    addr: m.addr,
                    proxy_protocol: m.proxy_protocol,
                    proxy_protocol_from: m.proxy_protocol_from,
                    h2c: m.h2c,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Listen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Listen::One(e) => e.serialize(s),
            Listen::Many(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Listen, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Listen;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "an address (`host:port`), a map with `addr` and options, or a list of them",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Listen, E> {
                Ok(Listen::One(ListenEntry::plain(v)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Listen, A::Error> {
                let e =
                    ListenEntry::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Listen::One(e))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Listen, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = seq.next_element::<ListenEntry>()? {
                    v.push(e);
                }
                Ok(Listen::Many(v))
            }
        }
        d.deserialize_any(V)
    }
}
