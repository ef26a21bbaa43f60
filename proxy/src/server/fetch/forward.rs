//! The request sent upstream, built from the one normalised request the route and the cache key
//! were computed from: hop-by-hop fields and the operator's stripped fields removed, `Host`
//! regenerated, the client's claims about its own address dropped unless its peer is a trusted
//! proxy, `X-Forwarded-For`, `Forwarded` and `Via` appended, and the request id added.

use super::Fetch;
use crate::cache::key::CacheKey;
use crate::cache::validation;
use crate::http::headers;
use crate::http::request_out::RequestOut;
use crate::server::request_body::{Remaining, RequestBody};
use std::net::IpAddr;

// Fields in which a client states its own address: forwarded only from a trusted proxy (the
// config's list, which `check` also refuses in a rule's request edits).
use zerocache_config::validate::CLIENT_ADDRESS_FIELDS;

/// The `for=` pairs of a trusted proxy's `Forwarded` field, one element each: `host=`, `proto=`
/// and `by=` describe the request as the client framed it, and none of them is in the cache key,
/// so they are never passed on (RFC 7239 §5).
fn forwarded_for_only(v: &str) -> String {
    v.split(',')
        .filter_map(|element| {
            element.split(';').map(str::trim).find(|pair| {
                pair.len() > 4
                    && pair
                        .get(..4)
                        .is_some_and(|p| p.eq_ignore_ascii_case("for="))
            })
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Fetch<'_> {
    /// What the group's `hash` balancing hashes, so one object reaches one server: the primary
    /// key being filled, or for a fetch that fills none (a bypass, a HEAD, a Range miss) the URL
    /// key, which is the primary key of a route with no `cache_key.headers`.
    pub(super) fn balance_key(&self) -> std::borrow::Cow<'_, str> {
        if let Some((k, _)) = &self.fill {
            return std::borrow::Cow::Borrowed(&k.text);
        }
        if let Some(r) = &self.range_fill {
            return std::borrow::Cow::Borrowed(&r.primary.text);
        }
        let req = self.req;
        std::borrow::Cow::Owned(
            CacheKey::new(&req.method, "http", &req.host, &req.target, 128).text,
        )
    }

    /// The request sent upstream: the client's, minus hop-by-hop fields, the fields the operator
    /// strips, and the client's own claims about where it came from (unless its peer is a trusted
    /// proxy); `Host` regenerated from the one normalised authority the key and the route used,
    /// or the group's `host` (which never changes the key: that was computed from the client's).
    pub(super) fn upstream_request(&self, peer: IpAddr, ctx: &crate::server::Ctx) -> Vec<u8> {
        self.request_upgrading(peer, ctx, None)
    }

    /// [`Fetch::upstream_request`], with `Upgrade:` the protocols `upgrade` names and
    /// `Connection: upgrade` when it is given: written by the same writer, before the framing fields.
    fn request_upgrading(
        &self,
        peer: IpAddr,
        ctx: &crate::server::Ctx,
        upgrade: Option<&[u8]>,
    ) -> Vec<u8> {
        let req = self.req;
        let mut out = Vec::with_capacity(1024);
        let mut h = RequestOut::new(&mut out, &req.method, &req.target);
        let host = self.upstream.host.as_deref().unwrap_or(&req.host);
        h.field("Host", host.as_bytes());
        let tokens =
            headers::connection_tokens(req.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let trusted = ctx
            .forwarding
            .trusted_proxies
            .iter()
            .any(|c| c.contains(peer));
        let mut xff: Option<String> = None;
        let mut forwarded: Option<String> = None;
        let mut via: Option<String> = None;
        // A fetch that may be stored asks for the whole, unconditional representation: the
        // client's preconditions and Range are answered from it afterwards (locally, or from the
        // entry), so the origin's 206, 304, 412 or 416 to one client can never become what every
        // client gets. When revalidating, the cache's own validators go instead.
        let whole = self.fill.is_some() || self.revalidating.is_some();
        let validators = self
            .revalidating
            .as_ref()
            .map(|e| validation::conditional_fields(e))
            .unwrap_or_default();
        for (name, value) in &req.fields {
            let n = name.as_str();
            if headers::is_hop_by_hop(n, &tokens)
                || ctx
                    .forwarding
                    .strip_fields
                    .iter()
                    .any(|s| n.eq_ignore_ascii_case(s))
                || n.eq_ignore_ascii_case("host")
                || n.eq_ignore_ascii_case("content-length")
                || n.eq_ignore_ascii_case("expect")
                || n.eq_ignore_ascii_case("x-forwarded-proto")
                || n.eq_ignore_ascii_case(&ctx.forwarding.request_id_header)
                || (whole && headers::is_range_or_condition(n))
            {
                continue;
            }
            let v = String::from_utf8_lossy(value);
            if n.eq_ignore_ascii_case("x-forwarded-for") {
                if trusted {
                    xff = Some(match xff {
                        Some(p) => format!("{p}, {v}"),
                        None => v.into_owned(),
                    });
                }
            } else if n.eq_ignore_ascii_case("forwarded") {
                if trusted {
                    let nodes = forwarded_for_only(&v);
                    if !nodes.is_empty() {
                        forwarded = Some(match forwarded {
                            Some(p) => format!("{p}, {nodes}"),
                            None => nodes,
                        });
                    }
                }
            } else if CLIENT_ADDRESS_FIELDS
                .iter()
                .any(|f| n.eq_ignore_ascii_case(f))
            {
                if trusted {
                    h.field(n, value);
                }
            } else if n.eq_ignore_ascii_case("via") {
                // Every line of a repeated Via is one list (RFC 9110 §5.3): keep every hop.
                via = Some(match via {
                    Some(p) => format!("{p}, {v}"),
                    None => v.into_owned(),
                });
            } else {
                h.field(n, value);
            }
        }
        for (k, v) in &validators {
            h.field(k, v.as_bytes());
        }
        let ip = peer.to_string();
        let append = |prev: Option<String>, new: String| match prev {
            Some(p) => format!("{p}, {new}"),
            None => new,
        };
        h.field("X-Forwarded-For", append(xff, ip.clone()).as_bytes());
        // The scheme of the listener the request came in on, never the client's claim.
        let proto = crate::cache::key::scheme(req.tls);
        h.field("X-Forwarded-Proto", proto.as_bytes());
        let node = if peer.is_ipv6() {
            format!("for=\"[{ip}]\";proto={proto}")
        } else {
            format!("for={ip};proto={proto}")
        };
        h.field("Forwarded", append(forwarded, node).as_bytes());
        if ctx.forwarding.via {
            h.field(
                "Via",
                if req.h2 {
                    headers::via_h2(via.as_deref())
                } else {
                    headers::via(via.as_deref(), req.http10)
                }
                .as_bytes(),
            );
        } else if let Some(received) = via.filter(|v| !v.is_empty()) {
            // `proxy.via: false`: the hops before this one still go on; this one adds none.
            h.field("Via", received.as_bytes());
        }
        // Made when the request was read if an access log line needs it; otherwise here, where it
        // is first needed.
        let id = if req.id.is_empty() {
            std::borrow::Cow::Owned(crate::request_id::of(
                req,
                peer,
                &ctx.forwarding.trusted_proxies,
                &ctx.forwarding.request_id_header,
            ))
        } else {
            std::borrow::Cow::Borrowed(req.id.as_str())
        };
        h.field(&ctx.forwarding.request_id_header, id.as_bytes());
        if let Some(protocols) = upgrade {
            h.field("Upgrade", protocols);
            h.field("Connection", b"upgrade");
        }
        let body = self.frame_body(h, &req.method);
        out.extend_from_slice(body);
        out
    }

    /// The body's framing fields and the blank line that ends the head; returns the bytes of a
    /// body read whole, which follow it.
    fn frame_body(&self, mut h: RequestOut<'_>, method: &str) -> &[u8] {
        match &self.body {
            RequestBody::Whole(b) => {
                if !b.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
                    h.num("Content-Length", b.len() as u64);
                }
                h.end();
                b
            }
            RequestBody::Streaming {
                rest: Remaining::Length { total, .. },
                ..
            } => {
                h.num("Content-Length", *total);
                h.end();
                &[]
            }
            RequestBody::Streaming { .. } => {
                h.field("Transfer-Encoding", b"chunked");
                h.end();
                &[]
            }
        }
    }
}

impl Fetch<'_> {
    /// The request of an Upgrade tunnel: the one [`Fetch::upstream_request`] makes (hop-by-hop
    /// fields removed, forwarding fields added), with the client's `Upgrade` value and
    /// `Connection: upgrade` put back, the only hop-by-hop fields a tunnel forwards. The request
    /// has no body (an Upgrade with one is not tunnelled).
    pub(crate) fn upgrade_request(
        &self,
        peer: IpAddr,
        ctx: &crate::server::Ctx,
        upgrade: &[u8],
    ) -> Vec<u8> {
        self.request_upgrading(peer, ctx, Some(upgrade))
    }
}
