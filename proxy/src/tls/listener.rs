//! Start-up and reload of the TLS side: binding the `tls:` listener beside the plain one,
//! loading its certificates, detecting kTLS, and the loud warning for upstreams that do not
//! verify their origin's certificate.

use super::ktls::{self, Ktls};
use super::server::TlsServer;
use anyhow::Context;
use std::sync::Arc;
use zerocache_config::Config;
use zerocache_config::tls::KtlsMode;

/// What start-up found.
pub struct Started {
    /// The loaded listener, if `tls:` is configured.
    pub server: Option<Arc<TlsServer>>,
    /// Whether the kernel offers kTLS.
    pub ktls: Ktls,
    /// The addresses of `tls.listen` and the entries they come from (their options), for the
    /// caller to bind beside the plain ones.
    pub listen: Vec<(std::net::SocketAddr, zerocache_config::ListenEntry)>,
}

/// Loads the certificates and says where `tls.listen` is to be bound. A certificate that does
/// not load fails start-up with the file or key that names it.
pub fn start(config: &Config) -> anyhow::Result<Started> {
    warn_unverified(config);
    super::client::check_all(config).context("upstreams: TLS files")?;
    let Some(cfg) = &config.tls else {
        // No listener to offload: whether the kernel has the ULP is all there is to report.
        return Ok(Started {
            server: None,
            ktls: ktls::detect::detect(),
            listen: Vec::new(),
        });
    };
    let (ktls, _) = ktls::offered();
    let plan = super::server::ktls_plan(cfg.ktls);
    if cfg.ktls == KtlsMode::Require
        && let Err(why) = plan
    {
        anyhow::bail!(
            "tls.ktls is require, but this kernel cannot take TLS keys ({}): {}",
            why.as_str(),
            ktls.describe()
        );
    }
    let server = TlsServer::load(cfg).context("tls.certificates")?;
    let listen = cfg
        .listen
        .bound()
        .map_err(anyhow::Error::msg)
        .context("tls.listen")?
        .into_iter()
        .map(|(a, e)| (a, e.clone()))
        .collect();
    match plan {
        Ok(offload) => tracing::info!(
            listen = %cfg.listen,
            certificates = cfg.certificates.len(),
            ktls = %offload.describe(),
            "TLS listener ready; these versions and ciphers go to the kernel (kTLS) and their hits are sent with sendfile, others are encrypted in user space"
        ),
        Err(why) => tracing::info!(
            listen = %cfg.listen,
            certificates = cfg.certificates.len(),
            ktls = %ktls.describe(),
            reason = why.as_str(),
            "TLS listener ready; hits on it are encrypted in user space (tls-userspace)"
        ),
    }
    Ok(Started {
        server: Some(Arc::new(server)),
        ktls,
        listen,
    })
}

/// The listener for a reloaded config: its certificates read again. An error keeps the running
/// config whole (the caller rejects the reload).
pub fn reload(
    new: &Config,
    _old: &Config,
) -> Result<Option<Arc<TlsServer>>, super::certs::CertError> {
    warn_unverified(new);
    super::client::check_all(new)?;
    new.tls
        .as_ref()
        .map(|cfg| TlsServer::load(cfg).map(Arc::new))
        .transpose()
}

/// `verify: false` is allowed, never quietly.
pub fn warn_unverified(config: &Config) {
    for name in zerocache_config::tls::unverified_upstreams(config) {
        tracing::warn!(
            upstream = name,
            "upstreams.{name}.tls.verify is false: the origin's certificate is NOT verified, and anyone on the path can impersonate it"
        );
    }
}
