//! Connecting to `https://` upstream servers: the rustls client config of a group
//! (`upstreams.NAME.tls`) and the handshake on a new connection.
//!
//! Verification is on by default, against the system roots (Debian's ca-certificates, read
//! once through rustls-native-certs) or the group's `tls.ca`; a certificate in `tls.ca` is also
//! trusted as itself when the origin presents exactly it, `CA:TRUE` self-signed ones included
//! (`pinned`), with its name and dates still checked.
//! The SNI name is `tls.sni` or the server's host name; an IP literal sends none (RFC 6066 §3)
//! and is verified against the certificate's IP SANs. `verify: false` accepts any certificate
//! (signatures are still checked), with a warning at start-up and in `check`.

use super::certs::{self, CertError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use tokio::net::TcpStream;
use zerocache_config::tls::UpstreamTls;

/// A group's TLS settings, built once per config (start-up, reload).
pub struct OriginTls {
    connector: tokio_rustls::TlsConnector,
    sni: Option<String>,
}

/// Why a TLS connection to an origin failed.
#[derive(Debug, thiserror::Error)]
pub enum OriginTlsError {
    /// The origin's certificate did not verify (expired, wrong name, unknown issuer...).
    #[error("TLS certificate verification failed: {0}")]
    Verify(String),
    /// Any other handshake failure.
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
}

impl OriginTls {
    /// Builds the client config of `cfg` (the defaults when the group has no `tls:`).
    pub fn build(cfg: Option<&UpstreamTls>) -> Result<OriginTls, CertError> {
        let default = UpstreamTls::default();
        let cfg = cfg.unwrap_or(&default);
        let provider = super::provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| CertError {
                path: "upstreams.*.tls".into(),
                what: e.to_string(),
            })?;
        let builder = if cfg.verify {
            match &cfg.ca {
                // The CA file's certificates are trust anchors, and each is also trusted as
                // itself when an origin presents exactly it (see `pinned`).
                Some(ca) => {
                    let roots = roots_from(ca)?;
                    let chain = rustls::client::WebPkiServerVerifier::builder_with_provider(
                        Arc::new(roots),
                        provider.clone(),
                    )
                    .build()
                    .map_err(|e| CertError {
                        path: ca.clone(),
                        what: e.to_string(),
                    })?;
                    let pins = certs::load_certs(ca)?;
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(super::pinned::PinnedOrChain {
                            chain,
                            pins,
                        }))
                }
                None => builder.with_root_certificates(system_roots()),
            }
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
        };
        let mut config = match (&cfg.cert, &cfg.key) {
            (Some(cert), Some(key)) => {
                let chain = certs::load_certs(cert)?;
                let der = certs::load_key(key)?;
                builder
                    .with_client_auth_cert(chain, der)
                    .map_err(|e| CertError {
                        path: key.clone(),
                        what: e.to_string(),
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(OriginTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            sni: cfg.sni.clone(),
        })
    }

    /// Runs the handshake on `tcp`, a connection to `host` (the server's host name or IP).
    pub async fn connect(
        &self,
        tcp: TcpStream,
        host: &str,
    ) -> Result<tokio_rustls::client::TlsStream<super::movable::Movable>, OriginTlsError> {
        let name = self.sni.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| OriginTlsError::Handshake(format!("`{name}` as a server name: {e}")))?;
        self.connector
            .connect(name, super::movable::Movable::new(tcp))
            .await
            .map_err(|e| {
                let rustls_error = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
                match rustls_error {
                    Some(rustls::Error::InvalidCertificate(c)) => {
                        OriginTlsError::Verify(certificate_problem(c))
                    }
                    _ => OriginTlsError::Handshake(e.to_string()),
                }
            })
    }
}

/// Every certificate of the PEM file `ca` as a trust anchor.
fn roots_from(ca: &Path) -> Result<RootCertStore, CertError> {
    let mut roots = RootCertStore::empty();
    for c in certs::load_certs(ca)? {
        roots.add(c).map_err(|e| CertError {
            path: ca.to_path_buf(),
            what: format!("not usable as a trust anchor: {e}"),
        })?;
    }
    Ok(roots)
}

/// The system's CA certificates, read once for the process (a few hundred files).
fn system_roots() -> RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "reading the system CA certificates");
            }
            let mut roots = RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    ignored,
                    "no system CA certificates (install ca-certificates, or set upstreams.NAME.tls.ca): https origins will not verify"
                );
            }
            roots
        })
        .clone()
}

/// `verify: false`: any certificate is accepted; the handshake signatures are still checked, so
/// the key exchange is at least with the holder of the presented certificate's key.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Loads every upstream group's TLS files, as start-up, a reload and `check` do before anything
/// uses them: the first error names its file.
pub fn check_all(config: &zerocache_config::Config) -> Result<(), CertError> {
    for up in config.upstreams.values() {
        let https = up
            .resolved_servers()
            .iter()
            .any(|s| zerocache_config::tls::split_scheme(&s.addr).0);
        if https || up.tls.is_some() {
            OriginTls::build(up.tls.as_ref())?;
        }
    }
    Ok(())
}

/// What is wrong with an origin's certificate, in words (rustls prints these with `{:?}`).
fn certificate_problem(c: &rustls::CertificateError) -> String {
    use rustls::CertificateError as C;
    match c {
        C::BadEncoding => "the certificate is not valid DER".into(),
        C::Expired | C::ExpiredContext { .. } => "the certificate has expired".into(),
        C::NotValidYet | C::NotValidYetContext { .. } => "the certificate is not valid yet".into(),
        C::Revoked => "the certificate is revoked".into(),
        C::UnknownIssuer => {
            "the certificate is issued by no CA this upstream trusts (system roots, or tls.ca)"
                .into()
        }
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            "the certificate is not valid for the name connected to (tls.sni, or the server's host)"
                .into()
        }
        C::BadSignature => "the certificate's signature does not verify".into(),
        C::Other(o) => format!("the certificate is refused: {o}"),
        _ => "the certificate is refused".into(),
    }
}

/// How each upstream group that speaks TLS verifies its servers, in a line each, for `check`.
pub fn trust(config: &zerocache_config::Config) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, up) in &config.upstreams {
        let https = up
            .resolved_servers()
            .iter()
            .any(|s| zerocache_config::tls::split_scheme(&s.addr).0);
        if !https && up.tls.is_none() {
            continue;
        }
        let default = UpstreamTls::default();
        let tls = up.tls.as_ref().unwrap_or(&default);
        let how = match (&tls.ca, tls.verify) {
            (_, false) => "NOT verified (tls.verify: false)".to_string(),
            (Some(ca), true) => {
                let n = certs::load_certs(ca).map(|c| c.len()).unwrap_or(0);
                format!(
                    "pinned: {n} certificate(s) in {}, trusted as issuers and as themselves",
                    ca.display()
                )
            }
            (None, true) => "the system's CA certificates".to_string(),
        };
        out.push((name.clone(), how));
    }
    out
}
