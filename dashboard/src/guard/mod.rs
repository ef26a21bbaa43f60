//! What keeps the dashboard safe at the edge: the checks every request passes before a handler
//! runs.
//!
//! * **Host** (every request: page, API, `/metrics`): DNS rebinding lets any web page reach a
//!   loopback-only listener under a name of its own choosing, so the dashboard only answers to the
//!   names it really has: its listen address (`ip:port`), `localhost`, `127.0.0.1` and `[::1]` on
//!   its port when it listens on loopback, any IP literal when it listens on a wildcard address,
//!   and the names in `dashboard.allowed_hosts`. Anything else gets `421 Misdirected Request`.
//! * **Cross-site writes** (every method but GET and HEAD): a browser sends a cross-site POST with
//!   a `text/plain` body without asking first (no CORS preflight), so a state-changing request
//!   must say `Content-Type: application/json` (else 415), and an `Origin`, when present, must be
//!   the dashboard's own, `http://` + the Host the request was made to (else 403).
//! * **Token**: an empty or all-whitespace `dashboard.token` is no token and refused at start
//!   ([`check_token`]); a bearer is compared in time that depends only on the token's length
//!   ([`bearer_matches`]), and an empty or blank one never matches.

pub mod token;

pub use token::{BlankToken, bearer, bearer_matches, check_token, query_token};

use axum::http::header::{self, HeaderMap, HeaderName};
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A host as a request names it: an IP literal or a (lower-cased) name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HostName {
    Ip(IpAddr),
    Name(String),
}

/// `host[:port]` parsed; `port` is `None` when absent (or empty, `host:`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Authority {
    host: HostName,
    port: Option<u16>,
}

/// Parses an authority as it appears in `Host` or `Origin`: `name`, `name:port`, `1.2.3.4:port`,
/// `[v6]:port`. Names are compared case-insensitively, so they come back lower-cased. `None` for
/// anything else (userinfo, a path, a bare IPv6 address, stray characters).
fn parse_authority(s: &str) -> Option<Authority> {
    if s.is_empty() {
        return None;
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = v6.parse().ok()?;
        let port = match after {
            "" => None,
            p => parse_port(p.strip_prefix(':')?)?,
        };
        (HostName::Ip(IpAddr::V6(ip)), port)
    } else {
        let (name, port) = match s.split_once(':') {
            Some((name, p)) => (name, parse_port(p)?),
            None => (s, None),
        };
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return None;
        }
        let host = match name.parse::<Ipv4Addr>() {
            Ok(ip) => HostName::Ip(IpAddr::V4(ip)),
            Err(_) => HostName::Name(name.to_ascii_lowercase()),
        };
        (host, port)
    };
    Some(Authority { host, port })
}

/// `Some(None)` for an empty port (`host:`, the default), `Some(Some(p))` for digits that fit,
/// `None` (invalid) otherwise.
fn parse_port(p: &str) -> Option<Option<u16>> {
    if p.is_empty() {
        return Some(None);
    }
    if p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok().map(Some)
}

/// An `http` authority's port, the default (80) when none is written.
fn http_port(a: &Authority) -> u16 {
    a.port.unwrap_or(80)
}

/// The names the dashboard answers to (see the module documentation).
#[derive(Clone, Debug)]
pub struct HostPolicy {
    listen: SocketAddr,
    allowed: Vec<Authority>,
}

impl HostPolicy {
    /// The policy for a dashboard listening on `listen` (the bound address, real port) with the
    /// operator's `dashboard.allowed_hosts`. Entries are `name` or `name:port`, matched
    /// case-insensitively; one without a port matches the name on any port. Entries that are not
    /// a host name or address are returned in the second element (they match nothing).
    pub fn new(listen: SocketAddr, allowed_hosts: &[String]) -> (HostPolicy, Vec<String>) {
        let mut allowed = Vec::new();
        let mut invalid = Vec::new();
        for entry in allowed_hosts {
            match parse_authority(entry.trim()) {
                Some(a) => allowed.push(a),
                None => invalid.push(entry.clone()),
            }
        }
        (HostPolicy { listen, allowed }, invalid)
    }

    /// Whether a request for `host` (a `Host` value or a request target's authority) is for this
    /// dashboard.
    pub fn allows(&self, host: &str) -> bool {
        parse_authority(host).is_some_and(|a| self.allows_authority(&a))
    }

    fn allows_authority(&self, a: &Authority) -> bool {
        let listen_ip = self.listen.ip().to_canonical();
        let on_our_port = http_port(a) == self.listen.port();
        let built_in = match &a.host {
            HostName::Ip(ip) => {
                let ip = ip.to_canonical();
                listen_ip.is_unspecified()
                    || (on_our_port
                        && (ip == listen_ip
                            || (listen_ip.is_loopback()
                                && (ip == IpAddr::V4(Ipv4Addr::LOCALHOST)
                                    || ip == IpAddr::V6(Ipv6Addr::LOCALHOST)))))
            }
            // A wildcard listener is on loopback too, and no web page can make `localhost` its
            // own name.
            HostName::Name(n) => {
                on_our_port
                    && n == "localhost"
                    && (listen_ip.is_loopback() || listen_ip.is_unspecified())
            }
        };
        built_in
            || self
                .allowed
                .iter()
                .any(|e| e.host == a.host && e.port.is_none_or(|p| p == http_port(a)))
    }
}

/// The single value of header `name`: `Ok(None)` when absent, `Err(())` when repeated or not
/// visible ASCII.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, ()> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(());
    }
    first.to_str().map(Some).map_err(|_| ())
}

/// Why the edge refused a request; its [`IntoResponse`] is the answer sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not one of the dashboard's names (or no `Host`, or two): 421 with a short text body.
    Misdirected,
    /// A state-changing request from another origin: 403 with a JSON error.
    CrossOrigin,
    /// A state-changing request whose body is not declared `application/json`: 415 with a JSON
    /// error.
    NotJson,
}

impl Refusal {
    /// The status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            Refusal::CrossOrigin => StatusCode::FORBIDDEN,
            Refusal::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Misdirected => (
                self.status(),
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "misdirected request: this zerocache dashboard does not answer to that Host \
                 (see dashboard.allowed_hosts)\n",
            )
                .into_response(),
            Refusal::CrossOrigin => json_error(
                self.status(),
                "cross-origin request refused: `Origin` is not this dashboard",
            ),
            Refusal::NotJson => {
                json_error(self.status(), "`Content-Type: application/json` required")
            }
        }
    }
}

/// The Host check: `Ok(host)` with the authority the request was made to (its `Host`, else its
/// absolute-form target's authority). Every authority the request carries must be allowed, and
/// it must carry one.
pub fn check_host<'a, B>(policy: &HostPolicy, req: &'a Request<B>) -> Result<&'a str, Refusal> {
    let target = req.uri().authority().map(|a| a.as_str());
    let host = single(req.headers(), &header::HOST).map_err(|()| Refusal::Misdirected)?;
    let own = host.or(target).ok_or(Refusal::Misdirected)?;
    if [host, target]
        .into_iter()
        .flatten()
        .all(|h| policy.allows(h))
    {
        Ok(own)
    } else {
        Err(Refusal::Misdirected)
    }
}

/// Whether `method` may change state (anything but GET and HEAD).
pub fn is_state_changing(method: &Method) -> bool {
    !(method == Method::GET || method == Method::HEAD)
}

/// The cross-site check for a state-changing request made to `host` (as [`check_host`] found
/// it): an `Origin`, when present, must be `http://` + `host` (else 403), and the body must be
/// declared `application/json`, parameters allowed (else 415).
pub fn check_write(headers: &HeaderMap, host: &str) -> Result<(), Refusal> {
    match single(headers, &header::ORIGIN) {
        Ok(None) => {}
        Ok(Some(origin)) if is_own_origin(origin, host) => {}
        _ => return Err(Refusal::CrossOrigin),
    }
    match single(headers, &header::CONTENT_TYPE) {
        Ok(Some(ct)) if is_json(ct) => Ok(()),
        _ => Err(Refusal::NotJson),
    }
}

/// Whether `origin` (an `Origin` value) is `http://` + `host`, compared as authorities: names
/// case-insensitively, an absent port being 80.
fn is_own_origin(origin: &str, host: &str) -> bool {
    let Some(scheme_end) = origin.find("://") else {
        return false;
    };
    if !origin[..scheme_end].eq_ignore_ascii_case("http") {
        return false;
    }
    match (
        parse_authority(&origin[scheme_end + 3..]),
        parse_authority(host),
    ) {
        (Some(o), Some(h)) => o.host == h.host && http_port(&o) == http_port(&h),
        _ => false,
    }
}

/// Whether a `Content-Type` value is `application/json`, with or without parameters.
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// A JSON `{"error": message}` response.
pub fn json_error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn policy(listen: &str, allowed: &[&str]) -> HostPolicy {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        let (p, invalid) = HostPolicy::new(listen.parse().expect("addr"), &allowed);
        assert!(invalid.is_empty(), "{invalid:?}");
        p
    }

    #[test]
    fn loopback_listen_answers_to_its_own_names_on_its_port_only() {
        let p = policy("127.0.0.1:9180", &[]);
        for ok in [
            "127.0.0.1:9180",
            "localhost:9180",
            "LocalHost:9180",
            "[::1]:9180",
        ] {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9180",
            "localhost:9181",
            "127.0.0.1",
            "10.0.0.1:9180",
            "localhost.evil.example:9180",
            "",
            "127.0.0.1:9180/x",
            "user@127.0.0.1:9180",
            "::1:9180",
            "[::1]x:9180",
            "127.0.0.1:99999",
            "127.0.0.1:+9180",
        ] {
            assert!(!p.allows(bad), "{bad}");
        }
        let p6 = policy("[::1]:9180", &[]);
        assert!(p6.allows("[::1]:9180") && p6.allows("localhost:9180"));
        assert!(p6.allows("127.0.0.1:9180"));
    }

    #[test]
    fn a_port_80_listen_accepts_a_host_without_port() {
        let p = policy("127.0.0.1:80", &[]);
        assert!(p.allows("localhost") && p.allows("127.0.0.1") && p.allows("127.0.0.1:80"));
    }

    #[test]
    fn wildcard_listen_answers_to_ip_literals_and_listed_names() {
        let p = policy("0.0.0.0:9180", &["zc.internal", "Metrics.Example:9180"]);
        for ok in [
            "10.1.2.3:9180",
            "10.1.2.3",
            "[2001:db8::1]:9180",
            "0.0.0.0:9180",
            "zc.internal",
            "ZC.INTERNAL:9180",
            "zc.internal:8080",
            "metrics.example:9180",
            "localhost:9180",
        ] {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example:9180",
            "metrics.example:9181",
            "metrics.example",
        ] {
            assert!(!p.allows(bad), "{bad}");
        }
        assert!(policy("[::]:9180", &[]).allows("192.0.2.1:9180"));
    }

    #[test]
    fn a_specific_listen_does_not_take_other_ips() {
        let p = policy("192.0.2.7:9180", &["zc.internal"]);
        assert!(p.allows("192.0.2.7:9180") && p.allows("zc.internal:9180"));
        assert!(!p.allows("127.0.0.1:9180") && !p.allows("localhost:9180"));
        assert!(!p.allows("192.0.2.8:9180"));
    }

    #[test]
    fn invalid_allowed_hosts_entries_are_reported() {
        let (_, invalid) = HostPolicy::new(
            "127.0.0.1:1".parse().expect("addr"),
            &["http://zc.internal".into(), "ok.example".into(), "".into()],
        );
        assert_eq!(
            invalid,
            vec!["http://zc.internal".to_string(), String::new()]
        );
    }

    fn req(headers: &[(&str, &str)], uri: &str) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request")
    }

    #[test]
    fn the_host_check_uses_host_and_an_absolute_target() {
        let p = policy("127.0.0.1:9180", &[]);
        let ok = req(&[("host", "127.0.0.1:9180")], "/");
        assert_eq!(check_host(&p, &ok).ok(), Some("127.0.0.1:9180"));
        let no_host = req(&[], "/");
        assert!(check_host(&p, &no_host).is_err());
        let two = req(&[("host", "127.0.0.1:9180"), ("host", "evil.example")], "/");
        assert!(check_host(&p, &two).is_err());
        let abs = req(&[("host", "127.0.0.1:9180")], "http://evil.example/");
        assert!(check_host(&p, &abs).is_err());
        let r = check_host(&p, &req(&[("host", "evil.example")], "/")).err();
        assert_eq!(r.map(|r| r.status()), Some(StatusCode::MISDIRECTED_REQUEST));
    }

    fn headers(h: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in h {
            m.append(*k, HeaderValue::from_static(v));
        }
        m
    }

    fn write_status(h: &[(&'static str, &'static str)]) -> u16 {
        match check_write(&headers(h), "127.0.0.1:9180") {
            Ok(()) => 200,
            Err(r) => r.status().as_u16(),
        }
    }

    #[test]
    fn writes_need_json_and_no_foreign_origin() {
        let json = ("content-type", "application/json");
        assert_eq!(write_status(&[json]), 200);
        assert_eq!(
            write_status(&[("content-type", "Application/JSON; charset=utf-8")]),
            200
        );
        assert_eq!(
            write_status(&[json, ("origin", "http://127.0.0.1:9180")]),
            200
        );
        assert_eq!(
            write_status(&[json, ("origin", "HTTP://127.0.0.1:9180")]),
            200
        );
        assert_eq!(write_status(&[("content-type", "text/plain")]), 415);
        assert_eq!(write_status(&[]), 415);
        assert_eq!(write_status(&[("content-type", "application/jsonx")]), 415);
        assert_eq!(write_status(&[json, ("content-type", "text/plain")]), 415);
        for bad in [
            "http://evil.example",
            "null",
            "https://127.0.0.1:9180",
            "http://127.0.0.1:9181",
            "http://127.0.0.1",
            "http://localhost:9180",
            "http://127.0.0.1:9180/",
        ] {
            let h = headers(&[json]);
            let mut h2 = h.clone();
            h2.insert("origin", HeaderValue::from_static(bad));
            let status = check_write(&h2, "127.0.0.1:9180").err().map(|r| r.status());
            assert_eq!(status, Some(StatusCode::FORBIDDEN), "{bad}");
        }
        assert_eq!(
            write_status(&[
                ("content-type", "text/plain"),
                ("origin", "http://evil.example")
            ]),
            403
        );
    }

    #[test]
    fn refusals_answer_with_their_status() {
        for r in [Refusal::Misdirected, Refusal::CrossOrigin, Refusal::NotJson] {
            assert_eq!(r.into_response().status(), r.status());
        }
    }
}
