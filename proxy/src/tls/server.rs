//! The `tls:` listener: its rustls config (TLS 1.2 and 1.3, ALPN `http/1.1`, and `h2` first with `tls.http2`, no 0-RTT, session
//! tickets and a session cache shared by every worker and kept across reloads), the choice of
//! certificate by SNI from each certificate's SANs, and the handshake with its timeout.
//!
//! A client that speaks plain HTTP to this port gets a plain-HTTP `400` saying so (as nginx
//! does), not a TLS alert it could not read; anything else that is not a TLS handshake gets
//! rustls's alert. Failed handshakes are counted by result and logged at debug: a scanner must
//! not be able to fill the log.

use super::certs::{self, CertError};
use super::ktls::handover::{self, HandOver};
use super::ktls::handshake_io::HandshakeIo;
use super::ktls::stream::KtlsStream;
use super::ktls::{self, Offload};
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls::{ProtocolVersion, ServerConfig};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use zerocache_config::tls::{KtlsMode, TlsListener};
use zerocache_ledger::{Accounting, HandshakeResult, TlsTransport, UserspaceReason};

/// Sessions remembered for resumption by id (TLS 1.2), shared by all workers.
const SESSION_CACHE: usize = 4096;

/// The first byte of every TLS record that starts a handshake.
const HANDSHAKE_RECORD: u8 = 0x16;

/// What a plain-HTTP request on the TLS port is answered with.
static PLAIN_HTTP_ON_TLS: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let mut out = crate::http::head::HeadBuf::h1(128);
    crate::http::head::text_response(
        &mut out,
        400,
        &[],
        None,
        true,
        b"A plain HTTP request was sent to the TLS port.\n",
    );
    out.into_wire()
});

/// The loaded listener: its acceptor and handshake timeout. Replaced whole on a reload whose
/// certificates all load; a bad file keeps the running one.
pub struct TlsServer {
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    /// The certificates, as the resolver has them, to tell which one a connection was served.
    certs: Arc<Vec<Arc<CertifiedKey>>>,
    strict_sni: bool,
    /// Handshakes are read record by record and their keys offered to the kernel; else every
    /// connection stays in user space for this reason.
    ktls: Result<&'static Offload, UserspaceReason>,
    /// TLS 1.3 session tickets are sent after every handshake (see the hand-over's KeyUpdate
    /// check).
    tickets: bool,
    /// Each certificate's name, file and expiry, for the metrics.
    expiries: Vec<certs::CertExpiry>,
}

impl TlsServer {
    /// Loads every certificate of `cfg` and builds the server config.
    pub fn load(cfg: &TlsListener) -> Result<TlsServer, CertError> {
        let mut certs = Vec::with_capacity(cfg.certificates.len());
        let mut expiries = Vec::with_capacity(cfg.certificates.len());
        let mut staples = Vec::with_capacity(cfg.certificates.len());
        for pair in &cfg.certificates {
            let c = certs::certified(&pair.cert, &pair.key)?;
            expiries.extend(certs::expiry(&c, &pair.cert));
            staples.push(match &pair.ocsp {
                Some(file) => super::ocsp::stapled(&c, file)?,
                None => None,
            });
            certs.push(c);
        }
        let certs = Arc::new(certs);
        let mut config = ServerConfig::builder_with_provider(super::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| CertError {
                path: cfg.certificates[0].cert.clone(),
                what: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SniResolver {
                certs: certs.clone(),
                staples,
            }));
        // HTTP/2 only when asked (`tls.http2`), as nginx's `http2 on`: its DATA frames are
        // written from user space, so an h2 connection gives up sendfile, kTLS or not.
        config.alpn_protocols = if cfg.http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        // 0-RTT data can be replayed: a cache must never act on a replayed request.
        config.max_early_data_size = 0;
        config.session_storage = session_cache();
        let ktls = ktls_plan(cfg.ktls);
        // Secrets are kept for extraction only where they may go to the kernel.
        config.enable_secret_extraction = ktls.is_ok();
        if !cfg.ticket_keys.is_empty() {
            // The operator's keys: the same on every node and across upgrades.
            let t =
                super::tickets::FileTicketer::load(&cfg.ticket_keys).map_err(|e| CertError {
                    path: e.path,
                    what: e.what,
                })?;
            config.ticketer = Arc::new(t);
        } else if let Some(t) = ticketer() {
            config.ticketer = t;
        }
        let tickets = config.send_tls13_tickets > 0;
        Ok(TlsServer {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            handshake_timeout: cfg.handshake_timeout,
            certs,
            strict_sni: cfg.strict_sni,
            tickets,
            ktls,
            expiries,
        })
    }

    /// Each certificate's name, file and expiry, as the metrics have them (none without a
    /// listener).
    pub fn expiries(server: Option<&TlsServer>) -> Vec<(String, String, i64)> {
        server
            .iter()
            .flat_map(|s| &s.expiries)
            .map(|e| (e.name.clone(), e.file.clone(), e.not_after))
            .collect()
    }
}

/// What `tls.ktls` and the kernel allow: the offered ciphers, or why every connection stays in
/// user space.
pub fn ktls_plan(mode: KtlsMode) -> Result<&'static Offload, UserspaceReason> {
    if mode == KtlsMode::Off {
        return Err(UserspaceReason::KtlsOff);
    }
    let (ulp, offload) = ktls::offered();
    if !ulp.available() {
        Err(UserspaceReason::KernelHasNoKtls)
    } else if !offload.any() {
        Err(UserspaceReason::CipherNotOffloadable)
    } else {
        Ok(offload)
    }
}

/// The TLS 1.2 session cache, one for the process: every worker and every reload shares it.
fn session_cache() -> Arc<dyn rustls::server::StoresServerSessions> {
    static CACHE: OnceLock<Arc<ServerSessionMemoryCache>> = OnceLock::new();
    CACHE
        .get_or_init(|| ServerSessionMemoryCache::new(SESSION_CACHE))
        .clone()
}

/// The session-ticket key (rotating), one for the process, so a ticket issued by one worker, or
/// before a reload, resumes on any other.
fn ticketer() -> Option<Arc<dyn rustls::server::ProducesTickets>> {
    static TICKETER: OnceLock<Option<Arc<dyn rustls::server::ProducesTickets>>> = OnceLock::new();
    TICKETER
        .get_or_init(|| match rustls::crypto::ring::Ticketer::new() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "no TLS session tickets (cannot make a ticket key)");
                None
            }
        })
        .clone()
}

/// Picks the certificate whose SANs cover the client's SNI name and whose key can sign with a
/// scheme the client offers; the first usable one for no SNI or an unknown name.
#[derive(Debug)]
struct SniResolver {
    certs: Arc<Vec<Arc<CertifiedKey>>>,
    /// By the index of `certs`: the same certificate with its OCSP response, and the response's
    /// dates, when `tls.certificates[].ocsp` names one.
    staples: Vec<Option<(Arc<CertifiedKey>, super::ocsp::Staple)>>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let schemes = hello.signature_schemes();
        let chosen = pick(&self.certs, hello.server_name(), |c| {
            c.key.choose_scheme(schemes).is_some()
        })?;
        // Stapled while fresh: checked at every handshake, so a file left to expire stops
        // being sent at its nextUpdate.
        let i = self.certs.iter().position(|c| Arc::ptr_eq(c, &chosen))?;
        match self.staples.get(i) {
            Some(Some((stapled, s))) if s.fresh(super::ocsp::now()) => Some(stapled.clone()),
            _ => Some(chosen),
        }
    }
}

/// The certificate for SNI name `sni` among those `usable`: the first whose SANs cover it, else
/// the first usable one (no SNI, or an unknown name).
fn pick(
    certs: &[Arc<CertifiedKey>],
    sni: Option<&str>,
    usable: impl Fn(&Arc<CertifiedKey>) -> bool,
) -> Option<Arc<CertifiedKey>> {
    let by_name = sni.and_then(|name| {
        let name = rustls::pki_types::ServerName::try_from(name).ok()?;
        certs
            .iter()
            .filter(|c| usable(c))
            .find(|c| covers(c, &name))
    });
    by_name
        .or_else(|| certs.iter().find(|c| usable(c)))
        .cloned()
}

/// Whether `cert`'s leaf is valid for `name` (its SANs, wildcards as RFC 6125 has them).
fn covers(cert: &CertifiedKey, name: &rustls::pki_types::ServerName<'_>) -> bool {
    cert.end_entity_cert()
        .ok()
        .and_then(|der| webpki::EndEntityCert::try_from(der).ok())
        .is_some_and(|ee| ee.verify_is_valid_for_subject_name(name).is_ok())
}

/// What a connection keeps of its handshake: what it agreed (for the access log), and with
/// `tls.strict_sni` on, the certificate it was served.
#[derive(Clone)]
pub struct Served {
    cert: Option<Arc<CertifiedKey>>,
    /// The version, cipher suite and SNI name.
    pub info: Arc<crate::accesslog::TlsInfo>,
}

impl Served {
    /// Whether `host` (a request's `Host`, lower-cased, maybe with a port) is a name of the
    /// certificate served, so the request belongs on this connection; always, without
    /// `tls.strict_sni`.
    pub fn covers_host(&self, host: &str) -> bool {
        let Some(cert) = &self.cert else {
            return true;
        };
        let name = match host.strip_prefix('[') {
            Some(rest) => rest.split(']').next().unwrap_or(rest),
            None => host.rsplit_once(':').map_or(host, |(h, _)| h),
        };
        rustls::pki_types::ServerName::try_from(name).is_ok_and(|n| covers(cert, &n))
    }
}

/// A connection whose handshake succeeded: its records made in user space by rustls (and why),
/// or handed to the kernel. `served` is what the handshake agreed (see [`Served`]).
pub enum Handshaken {
    Userspace {
        stream: Box<tokio_rustls::server::TlsStream<HandshakeIo>>,
        served: Option<Served>,
        why: UserspaceReason,
    },
    Kernel {
        stream: KtlsStream,
        served: Option<Served>,
    },
}

/// What the handshake of `conn` agreed, as the access log says it: nginx's `$ssl_protocol`
/// spelling, and the cipher suite by its IANA name (rustls writes TLS 1.3's `TLS13_...`).
fn agreed(conn: &rustls::ServerConnection) -> crate::accesslog::TlsInfo {
    let version = match conn.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "",
    };
    let cipher = conn
        .negotiated_cipher_suite()
        .and_then(|s| s.suite().as_str())
        .map(|name| match name.strip_prefix("TLS13_") {
            Some(rest) => format!("TLS_{rest}"),
            None => name.to_string(),
        })
        .unwrap_or_default();
    crate::accesslog::TlsInfo {
        version,
        cipher,
        sni: conn.server_name().map(str::to_string),
    }
}

/// A completed handshake, and whether ALPN chose HTTP/2 (`h2`, offered with `tls.http2`).
pub struct Accepted {
    pub conn: Handshaken,
    pub h2: bool,
}

impl Handshaken {
    /// How its records are made, as the accounting counts it.
    pub fn transport(&self) -> TlsTransport {
        match self {
            Handshaken::Userspace { why, .. } => TlsTransport::Userspace(*why),
            Handshaken::Kernel { .. } => TlsTransport::Ktls,
        }
    }
}

/// Runs the handshake of a connection accepted on the TLS listener (`server`, the current
/// config's), within the handshake timeout, counting its result in `acc`; `None` when it failed
/// (the socket is then closed).
///
/// A failed handshake's socket is still recorded in the accounting, as a connection that served
/// nothing, before it is closed: the probe's close event for its fd then joins that record, and
/// never the next connection that gets the same fd number.
pub async fn accept(
    tcp: TcpStream,
    peer: SocketAddr,
    server: Option<&TlsServer>,
    acc: &Accounting,
) -> Option<Accepted> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&tcp) as u32;
    let failed = |result: HandshakeResult| {
        acc.tls.handshake(result);
        let id = acc.conn_opened(fd, peer);
        // Never handed over: the listener's own reason, if it has one.
        let why = server
            .and_then(|s| s.ktls.err())
            .unwrap_or(UserspaceReason::HandOverFailed);
        acc.conn_tls(id, TlsTransport::Userspace(why));
        acc.conn_closed(id);
    };
    let Some(server) = server else {
        // A TLS listener is only bound with a loaded server; a reload cannot remove it.
        failed(HandshakeResult::NoCert);
        return None;
    };
    let deadline = tokio::time::Instant::now() + server.handshake_timeout;
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out before the first byte");
            failed(HandshakeResult::Timeout);
            return None;
        }
        Ok(Ok(0)) | Ok(Err(_)) => {
            failed(HandshakeResult::Failed);
            return None;
        }
        Ok(Ok(_)) if first[0] != HANDSHAKE_RECORD && first[0].is_ascii_uppercase() => {
            tracing::debug!(%peer, "plain HTTP on the TLS port; answered 400");
            let mut tcp = tcp;
            let _ = tokio::time::timeout_at(deadline, tcp.write_all(&PLAIN_HTTP_ON_TLS)).await;
            let _ = tokio::time::timeout_at(deadline, tcp.shutdown()).await;
            failed(HandshakeResult::Failed);
            return None;
        }
        Ok(Ok(_)) => {}
    }
    // Fallible, and polled beside the deadline rather than under a timeout, so the socket is
    // still here (and still open) when the failure is recorded.
    let io = HandshakeIo::new(tcp, server.ktls.is_ok());
    let mut handshake = std::pin::pin!(server.acceptor.accept(io).into_fallible());
    let done = tokio::select! {
        r = &mut handshake => r,
        _ = tokio::time::sleep_until(deadline) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            failed(HandshakeResult::Timeout);
            return None;
        }
    };
    match done {
        Err((e, tcp)) => {
            let no_cert = e
                .get_ref()
                .and_then(|i| i.downcast_ref::<rustls::Error>())
                .is_some_and(|r| matches!(r, rustls::Error::General(m) if m.contains("no server certificate")));
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            failed(if no_cert {
                HandshakeResult::NoCert
            } else {
                HandshakeResult::Failed
            });
            drop(tcp);
            None
        }
        Ok(s) => {
            acc.tls.handshake(HandshakeResult::Ok);
            let (_, conn) = s.get_ref();
            let h2 = conn.alpn_protocol() == Some(b"h2");
            tracing::trace!(%peer, version = ?conn.protocol_version().unwrap_or(ProtocolVersion::Unknown(0)), sni = ?conn.server_name(), "TLS handshake done");
            // The certificate the resolver chose for this SNI (its key's scheme aside, which
            // does not change the names).
            let served = Some(Served {
                cert: server
                    .strict_sni
                    .then(|| pick(&server.certs, conn.server_name(), |_| true))
                    .flatten(),
                info: Arc::new(agreed(conn)),
            });
            let done = match server.ktls {
                Err(why) => Handshaken::Userspace {
                    stream: Box::new(s),
                    served,
                    why,
                },
                Ok(offload) => match handover::hand_over(s, offload, server.tickets) {
                    HandOver::Kernel(k) => {
                        tracing::trace!(%peer, suite = %k.describe(), "TLS handed to the kernel");
                        Handshaken::Kernel { stream: k, served }
                    }
                    HandOver::Userspace(s, why) => Handshaken::Userspace {
                        stream: s,
                        served,
                        why,
                    },
                    HandOver::Lost(why, tcp) => {
                        tracing::warn!(%peer, %why, "kTLS hand-over failed after the keys left rustls; connection closed");
                        let lost = TlsTransport::Userspace(UserspaceReason::HandOverFailed);
                        acc.tls.connection(lost);
                        let id = acc.conn_opened(fd, peer);
                        acc.conn_tls(id, lost);
                        acc.conn_closed(id);
                        drop(tcp);
                        return None;
                    }
                },
            };
            acc.tls.connection(done.transport());
            Some(Accepted { conn: done, h2 })
        }
    }
}
