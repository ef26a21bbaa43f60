//! TLS on both sides, with rustls and the `ring` crypto provider (chosen explicitly: aws-lc
//! needs cmake, which this project's machines do not have).
//!
//! - [`server`]: the `tls:` listener's handshake, SNI certificate choice and reload.
//! - [`certs`]: reading PEM certificate chains and keys, with the file named in every error.
//! - [`client`]: connecting to `https://` upstream servers.
//! - [`ktls`]: handing a completed handshake's keys to the kernel, so TLS hits go out with
//!   sendfile; or why a connection stays in user space.
//!
//! What TLS costs zero-copy is accounted for, not hidden: hits on TLS connections are read into
//! user space and encrypted there (`zerocache_copied_body_bytes_total{reason="tls-userspace"}`),
//! while upstream TLS costs hits nothing (they are still sent from disk with sendfile).

pub mod certs;
pub mod client;
mod der;
pub mod ktls;
pub mod listener;
pub mod movable;
mod ocsp;
mod pinned;
pub mod server;
mod tickets;

use std::sync::Arc;

/// Loads every certificate, key and CA file the config names (the `tls:` listener's and the
/// upstreams'), as start-up would: what `zerocache check` adds to the schema checks.
pub fn check(config: &zerocache_config::Config) -> Result<(), certs::CertError> {
    if let Some(t) = &config.tls {
        server::TlsServer::load(t)?;
    }
    client::check_all(config)
}

/// What `tls.ktls` will do on this kernel, in one line for `zerocache check` (None without a
/// `tls:` listener).
pub fn ktls_summary(config: &zerocache_config::Config) -> Option<String> {
    use zerocache_config::tls::KtlsMode;
    let t = config.tls.as_ref()?;
    let mode = match t.ktls {
        KtlsMode::Auto => "auto",
        KtlsMode::Off => "off",
        KtlsMode::Require => "require",
    };
    Some(match server::ktls_plan(t.ktls) {
        Ok(offload) => format!(
            "{mode}: these go to the kernel, their hits by sendfile: {}",
            offload.describe()
        ),
        Err(why) if t.ktls == KtlsMode::Require => format!(
            "{mode}: start-up will refuse: this kernel cannot take TLS keys ({}; {})",
            why.as_str(),
            ktls::offered().0.describe()
        ),
        Err(why) => format!(
            "{mode}: every connection in user space ({}; {})",
            why.as_str(),
            ktls::offered().0.describe()
        ),
    })
}

/// The crypto provider every TLS config uses.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
