//! The TLS parts of the config: the `tls:` listener (HTTPS clients) and an upstream group's
//! `tls:` (HTTPS origins). Only the schema and the checks that need no crypto live here: that
//! the files named exist and can be read. Parsing the PEM is the proxy's (`zerocache check` and
//! start-up both do it), so this crate does not depend on rustls.

use crate::schema::Listen;
use crate::validate::Invalid;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `tls:`: a listener for HTTPS clients beside the plain one, with the same routes and cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsListener {
    /// Where to listen for TLS clients: one `host:port` or a list.
    pub listen: Listen,
    /// Certificates with their keys (PEM). The names each one serves are its SANs, chosen by the
    /// client's SNI; the first is for clients without SNI or with an unknown name.
    pub certificates: Vec<CertificatePair>,
    /// Time allowed for a client's handshake to complete (nginx's `ssl_handshake_timeout`).
    #[serde(default = "default_handshake_timeout", with = "crate::units::duration")]
    pub handshake_timeout: Duration,
    /// Answer 421 Misdirected Request (RFC 9110 §15.5.20) to a request whose `Host` is not a
    /// name of the certificate this connection was served: a client must not reuse a connection
    /// made for one site (SNI) for a host routed elsewhere. Default true.
    #[serde(default = "default_strict_sni")]
    pub strict_sni: bool,
    /// Whether the keys of a completed handshake go to the kernel (kTLS), so hits on TLS
    /// connections are sent with sendfile as on plain ones. Default `auto`.
    #[serde(default)]
    pub ktls: KtlsMode,
    /// Offer HTTP/2 by ALPN (`h2`, then `http/1.1`), as nginx's `http2 on`. Off by default:
    /// an HTTP/2 connection's bodies are DATA frames written from user space, so a client that
    /// takes h2 gives up sendfile (and kTLS's zero-copy) for multiplexing.
    #[serde(default)]
    pub http2: bool,
    /// Session-ticket key files, nginx's `ssl_session_ticket_key` format (80 random bytes, or
    /// 48): the first makes tickets, all open them, reread on SIGHUP. The same files on every
    /// node of a fleet, and across upgrades, let clients resume where they did not start. Unset:
    /// a random key per process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ticket_keys: Vec<PathBuf>,
}

/// `tls.ktls`: kernel TLS for the `tls:` listener's connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KtlsMode {
    /// Wherever the kernel takes the negotiated version and cipher; user space elsewhere, with
    /// the reason reported.
    #[default]
    Auto,
    /// Never: every TLS connection is encrypted in user space.
    Off,
    /// Start only if the kernel offers kTLS for at least one cipher the listener negotiates.
    Require,
}

fn default_handshake_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_strict_sni() -> bool {
    true
}

/// One certificate chain and its private key, both PEM files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificatePair {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// A DER OCSP response for the leaf (`openssl ocsp -respout`), which the operator
    /// refreshes and reloads: stapled while it is fresh (`thisUpdate` to `nextUpdate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocsp: Option<PathBuf>,
}

/// `upstreams.NAME.tls`: how the group's `https://` servers are reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// The SNI name sent and verified; unset: the server's host name (none for an IP literal,
    /// RFC 6066 §3, where verification uses the IP SAN).
    #[serde(default)]
    pub sni: Option<String>,
    /// CA certificates (PEM) the origin's chain must lead to, in place of the system roots. A
    /// self-signed origin certificate given here is accepted when the origin presents exactly it.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// A client certificate chain (PEM) to present; needs `key`.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Verify the origin's certificate (default true). `false` accepts any certificate, which
    /// anyone on the path can then impersonate: warned about at start-up and by `check`.
    #[serde(default = "yes")]
    pub verify: bool,
}

impl Default for UpstreamTls {
    fn default() -> UpstreamTls {
        UpstreamTls {
            sni: None,
            ca: None,
            cert: None,
            key: None,
            verify: true,
        }
    }
}

fn yes() -> bool {
    true
}

/// The checks on the TLS sections that need no file system: at least one certificate, a listen
/// address that parses, `cert` and `key` together.
pub(crate) fn checks(config: &crate::Config, errs: &mut Vec<Invalid>) {
    if let Some(t) = &config.tls {
        for (at, why) in t.listen.problems("tls.listen") {
            errs.push(invalid(at, why));
        }
        for (i, e) in t.listen.entries().into_iter().enumerate() {
            if e.h2c {
                let at = match &t.listen {
                    crate::Listen::One(_) => "tls.listen.h2c".to_string(),
                    crate::Listen::Many(_) => format!("tls.listen[{i}].h2c"),
                };
                errs.push(invalid(
                    &at,
                    "is HTTP/2 without TLS; on the TLS listener, ALPN offers h2 with `tls.http2: true`".into(),
                ));
            }
        }
        if let Err(e) = t.listen.addrs() {
            errs.push(invalid("tls.listen", e));
        }
        if t.certificates.is_empty() {
            errs.push(invalid(
                "tls.certificates",
                "needs at least one {cert, key}".into(),
            ));
        }
        if t.handshake_timeout.is_zero() {
            errs.push(invalid(
                "tls.handshake_timeout",
                "must be more than 0".into(),
            ));
        }
    }
    for (name, up) in &config.upstreams {
        if let Some(t) = &up.tls
            && t.cert.is_some() != t.key.is_some()
        {
            errs.push(invalid(
                format!("upstreams.{name}.tls"),
                "`cert` and `key` go together: give both or neither".into(),
            ));
        }
    }
}

/// Every file the TLS sections name that cannot be read, each with its key path and the file.
pub fn check_files(config: &crate::Config) -> Vec<Invalid> {
    let mut errs = Vec::new();
    let mut file = |at: String, p: &Path| {
        if let Err(e) = std::fs::File::open(p) {
            errs.push(invalid(at, format!("cannot read `{}`: {e}", p.display())));
        }
    };
    if let Some(t) = &config.tls {
        for (i, c) in t.certificates.iter().enumerate() {
            file(format!("tls.certificates[{i}].cert"), &c.cert);
            file(format!("tls.certificates[{i}].key"), &c.key);
            if let Some(o) = &c.ocsp {
                file(format!("tls.certificates[{i}].ocsp"), o);
            }
        }
        for (i, k) in t.ticket_keys.iter().enumerate() {
            file(format!("tls.ticket_keys[{i}]"), k);
        }
    }
    for (name, up) in &config.upstreams {
        if let Some(t) = &up.tls {
            for (key, p) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
                if let Some(p) = p {
                    file(format!("upstreams.{name}.tls.{key}"), p);
                }
            }
        }
    }
    errs
}

/// The key path (`tls.certificates[0].key`, `upstreams.NAME.tls.ca`, ...) that names `file`.
pub fn key_path_of(config: &crate::Config, file: &Path) -> Option<String> {
    if let Some(t) = &config.tls {
        for (i, c) in t.certificates.iter().enumerate() {
            if c.cert == file {
                return Some(format!("tls.certificates[{i}].cert"));
            }
            if c.key == file {
                return Some(format!("tls.certificates[{i}].key"));
            }
            if c.ocsp.as_deref() == Some(file) {
                return Some(format!("tls.certificates[{i}].ocsp"));
            }
        }
        for (i, k) in t.ticket_keys.iter().enumerate() {
            if k == file {
                return Some(format!("tls.ticket_keys[{i}]"));
            }
        }
    }
    for (name, up) in &config.upstreams {
        if let Some(t) = &up.tls {
            for (key, p) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
                if p.as_deref() == Some(file) {
                    return Some(format!("upstreams.{name}.tls.{key}"));
                }
            }
        }
    }
    None
}

/// A certificate, key or CA file of the config at `config_path` that does not load (`what`),
/// as a config error at the line of the key that names it.
pub fn file_error(
    config_path: &Path,
    config: &crate::Config,
    file: &Path,
    what: &str,
) -> crate::ConfigError {
    let name = config_path.display().to_string();
    let message = format!("`{}`: {what}", file.display());
    match key_path_of(config, file) {
        Some(at) => {
            let text = std::fs::read_to_string(config_path).unwrap_or_default();
            crate::error::from_validation(&name, &text, invalid(at, message))
        }
        None => crate::ConfigError::Read {
            file: file.display().to_string(),
            error: what.to_string(),
        },
    }
}

/// The upstream groups that turn certificate verification off, for the loud warning.
pub fn unverified_upstreams(config: &crate::Config) -> Vec<&str> {
    config
        .upstreams
        .iter()
        .filter(|(_, u)| u.tls.as_ref().is_some_and(|t| !t.verify))
        .map(|(n, _)| n.as_str())
        .collect()
}

fn invalid(path: impl Into<String>, message: String) -> Invalid {
    Invalid {
        path: path.into(),
        message,
    }
}

/// An upstream server address without its scheme, and whether the scheme was `https://`
/// (`http://` and no scheme are plain).
pub fn split_scheme(addr: &str) -> (bool, &str) {
    if let Some(rest) = addr.strip_prefix("https://") {
        (true, rest)
    } else {
        (false, addr.strip_prefix("http://").unwrap_or(addr))
    }
}

/// The host part of `host:port` (brackets of an IPv6 literal removed).
pub fn host_of(host_port: &str) -> &str {
    let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_hosts() {
        assert_eq!(
            split_scheme("https://o.example:443"),
            (true, "o.example:443")
        );
        assert_eq!(split_scheme("http://o.example:80"), (false, "o.example:80"));
        assert_eq!(split_scheme("10.0.0.1:8080"), (false, "10.0.0.1:8080"));
        assert_eq!(host_of("o.example:443"), "o.example");
        assert_eq!(host_of("[::1]:8443"), "::1");
    }

    #[test]
    fn verify_defaults_to_on_and_cert_needs_key() {
        let yaml = "listen: 127.0.0.1:8080\ncache:\n  path: /tmp/x\n  max_size: 1GiB\nupstreams:\n  o:\n    servers: [\"https://o.example:443\"]\n    tls: { cert: /a.pem }\nroutes:\n  - match: { host: \"*\", path_prefix: / }\n    upstream: o\n";
        let err = crate::parse(yaml, "zc.yaml").expect_err("cert without key");
        assert!(err.to_string().contains("upstreams.o.tls"), "{err}");
        let ok = crate::parse(&yaml.replace("tls: { cert: /a.pem }", "tls: {}"), "zc.yaml")
            .expect("valid");
        assert!(ok.upstreams["o"].tls.as_ref().is_some_and(|t| t.verify));
    }
}
