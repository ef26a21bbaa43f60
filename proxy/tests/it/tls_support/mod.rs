//! TLS for the `tls_*` tests: certificates made with rcgen in the test, written as PEM files, a
//! blocking rustls client that keeps what it received, and a real rustls origin. Declared with
//! `mod tls_support;` beside `mod support;`.
#![allow(dead_code)]

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A certificate and its key, as PEM and DER.
pub struct Cert {
    pub pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

/// A self-signed certificate for `names` (DNS names or IP literals).
pub fn cert(names: &[&str]) -> Cert {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let c = rcgen::generate_simple_self_signed(names).expect("rcgen");
    Cert {
        pem: c.cert.pem(),
        key_pem: c.signing_key.serialize_pem(),
        der: c.cert.der().to_vec(),
    }
}

/// A self-signed certificate for `names` that expires at midnight UTC of `(year, month, day)`.
pub fn cert_until(names: &[&str], (year, month, day): (i32, u8, u8)) -> Cert {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).expect("params");
    params.not_after = rcgen::date_time_ymd(year, month, day);
    let key = rcgen::KeyPair::generate().expect("key");
    let c = params.self_signed(&key).expect("rcgen");
    Cert {
        pem: c.pem(),
        key_pem: key.serialize_pem(),
        der: c.der().to_vec(),
    }
}

/// A self-signed certificate for `names` with the serial number `serial`.
pub fn cert_with_serial(names: &[&str], serial: &[u8]) -> Cert {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).expect("params");
    params.serial_number = Some(rcgen::SerialNumber::from_slice(serial));
    let key = rcgen::KeyPair::generate().expect("key");
    let c = params.self_signed(&key).expect("rcgen");
    Cert {
        pem: c.pem(),
        key_pem: key.serialize_pem(),
        der: c.der().to_vec(),
    }
}

/// A DER OCSP response (RFC 6960 §4.2.1) saying `good` for the certificate with serial
/// `serial`, from `this` to `next` (GeneralizedTime, `20261201000000Z`); its signature is a
/// placeholder, which the proxy does not read (the client checks it).
pub fn ocsp_response(serial: &[u8], this: &str, next: &str) -> Vec<u8> {
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match content.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(content);
        out
    }
    let sha1 = tlv(
        0x30,
        &[tlv(0x06, &[0x2b, 0x0e, 0x03, 0x02, 0x1a]), tlv(0x05, &[])].concat(),
    );
    let cert_id = tlv(
        0x30,
        &[
            sha1,
            tlv(0x04, &[1; 20]),
            tlv(0x04, &[2; 20]),
            tlv(0x02, serial),
        ]
        .concat(),
    );
    let single = tlv(
        0x30,
        &[
            cert_id,
            tlv(0x80, &[]),
            tlv(0x18, this.as_bytes()),
            tlv(0xa0, &tlv(0x18, next.as_bytes())),
        ]
        .concat(),
    );
    let data = tlv(
        0x30,
        &[
            tlv(0xa2, &tlv(0x04, &[3; 20])),
            tlv(0x18, this.as_bytes()),
            tlv(0x30, &single),
        ]
        .concat(),
    );
    let sha256_rsa = tlv(
        0x30,
        &[
            tlv(
                0x06,
                &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b],
            ),
            tlv(0x05, &[]),
        ]
        .concat(),
    );
    let basic = tlv(
        0x30,
        &[data, sha256_rsa, tlv(0x03, &[0, 0xde, 0xad])].concat(),
    );
    let id_pkix_ocsp_basic = [0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01, 0x01];
    let bytes = tlv(
        0x30,
        &[tlv(0x06, &id_pkix_ocsp_basic), tlv(0x04, &basic)].concat(),
    );
    tlv(0x30, &[tlv(0x0a, &[0]), tlv(0xa0, &bytes)].concat())
}

/// Writes `c` as `dir/NAME.crt` and `dir/NAME.key`.
pub fn write(dir: &Path, name: &str, c: &Cert) -> (PathBuf, PathBuf) {
    let (crt, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&crt, &c.pem).expect("write cert");
    std::fs::write(&key, &c.key_pem).expect("write key");
    (crt, key)
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any certificate (the test looks at which one it got).
#[derive(Debug)]
struct AnyCert;

impl ServerCertVerifier for AnyCert {
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
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            m,
            c,
            d,
            &provider().signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            m,
            c,
            d,
            &provider().signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// What each handshake stapled, in order (empty: nothing).
pub type Seen = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// Accepts any certificate and keeps the OCSP response each handshake stapled (empty: none).
#[derive(Debug)]
struct SeesOcsp(Seen);

impl ServerCertVerifier for SeesOcsp {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        ocsp: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(mut seen) = self.0.lock() {
            seen.push(ocsp.to_vec());
        }
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        AnyCert.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        AnyCert.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        AnyCert.supported_verify_schemes()
    }
}

/// Accepts any certificate but offers only RSA signature schemes: a server with nothing but an
/// ECDSA certificate has none to present to it.
#[derive(Debug)]
struct RsaOnly;

impl ServerCertVerifier for RsaOnly {
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
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        AnyCert.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        AnyCert.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![
            SignatureScheme::RSA_PSS_SHA256,
            SignatureScheme::RSA_PKCS1_SHA256,
        ]
    }
}

/// A client that can verify only RSA signatures.
pub fn rsa_only_client_config() -> Arc<ClientConfig> {
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(RsaOnly))
            .with_no_client_auth(),
    )
}

/// A client config trusting exactly `trust`, or any certificate when `None`.
/// A client that accepts any certificate and keeps, handshake by handshake, the OCSP response
/// the server stapled (empty when none).
pub fn client_config_seeing_ocsp() -> (Arc<ClientConfig>, Seen) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut c = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SeesOcsp(seen.clone())))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    // A full handshake every time: a resumed one carries no certificate, and no OCSP response.
    c.resumption = rustls::client::Resumption::disabled();
    (Arc::new(c), seen)
}

pub fn client_config(trust: Option<&Cert>) -> Arc<ClientConfig> {
    let b = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let mut c = match trust {
        Some(t) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from(t.der.clone()))
                .expect("root");
            b.with_root_certificates(roots).with_no_client_auth()
        }
        None => b
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert))
            .with_no_client_auth(),
    };
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

/// A response as received over TLS.
#[derive(Debug)]
pub struct TlsResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub head_len: usize,
}

impl TlsResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A blocking keep-alive HTTPS client (rustls).
pub struct TlsClient {
    pub tls: StreamOwned<ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

impl TlsClient {
    /// Connects to `addr`, sending `sni` (none when it is an IP literal), verifying with `config`.
    pub fn connect(addr: SocketAddr, sni: &str, config: Arc<ClientConfig>) -> TlsClient {
        TlsClient::connect_pipelined(addr, sni, config, b"")
    }

    /// Connects and writes `early` (a request) into the connection before the handshake ends:
    /// rustls sends it in the same write as its Finished, so it arrives right behind the
    /// handshake.
    pub fn connect_pipelined(
        addr: SocketAddr,
        sni: &str,
        config: Arc<ClientConfig>,
        early: &[u8],
    ) -> TlsClient {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        let name = ServerName::try_from(sni.to_string()).expect("name");
        let mut conn = ClientConnection::new(config, name).expect("client");
        conn.writer().write_all(early).expect("buffer early");
        let mut tls = StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() || tls.conn.wants_write() {
            tls.conn
                .complete_io(&mut tls.sock)
                .expect("TLS handshake with the proxy");
        }
        TlsClient {
            tls,
            buf: Vec::new(),
        }
    }

    /// Sends raw request bytes.
    pub fn send(&mut self, req: &[u8]) {
        self.tls.write_all(req).expect("send");
        self.tls.flush().expect("flush");
    }

    /// Reads one response (its body by Content-Length).
    pub fn response(&mut self) -> TlsResponse {
        self.read_response()
    }

    /// Reads one response head only (for HEAD, whose Content-Length has no body behind it).
    pub fn head_only(&mut self) -> String {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(self.fill() > 0, "closed before a response head");
        };
        let head = String::from_utf8(self.buf[..end].to_vec()).expect("utf8 head");
        self.buf.drain(..end);
        head
    }

    /// Whether the server ends the connection with close_notify and nothing else: the next
    /// read is a clean end (rustls reports a close without close_notify as an error).
    pub fn closed_cleanly(&mut self) -> Result<(), String> {
        if !self.buf.is_empty() {
            return Err(format!("{} unread bytes", self.buf.len()));
        }
        let mut chunk = [0u8; 4096];
        match self.tls.read(&mut chunk) {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!(
                "{n} more bytes: {:?}",
                String::from_utf8_lossy(&chunk[..n])
            )),
            Err(e) => Err(format!("not a clean close: {e}")),
        }
    }

    /// The certificate the server presented.
    /// The cipher suite agreed, by its name in the IANA registry (TLS 1.3's three, written out
    /// here apart from the proxy's own spelling of them).
    pub fn cipher_iana(&self) -> &'static str {
        let suite = self.tls.conn.negotiated_cipher_suite().expect("negotiated");
        match u16::from(suite.suite()) {
            0x1301 => "TLS_AES_128_GCM_SHA256",
            0x1302 => "TLS_AES_256_GCM_SHA384",
            0x1303 => "TLS_CHACHA20_POLY1305_SHA256",
            other => panic!("not a TLS 1.3 suite: {other:#06x}"),
        }
    }

    pub fn peer_cert(&self) -> Vec<u8> {
        self.tls.conn.peer_certificates().expect("certs")[0].to_vec()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.tls.sock.local_addr().expect("local")
    }

    /// GET `path` with `Host: host`.
    pub fn get_host(&mut self, host: &str, path: &str) -> TlsResponse {
        self.tls
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .expect("send");
        self.tls.flush().expect("flush");
        self.read_response()
    }

    /// GET `path` with `Host: test.example`.
    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> TlsResponse {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: test.example\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.tls.write_all(req.as_bytes()).expect("send");
        self.tls.flush().expect("flush");
        self.read_response()
    }

    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 64 * 1024];
        let n = self.tls.read(&mut chunk).expect("read");
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    fn read_response(&mut self) -> TlsResponse {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(self.fill() > 0, "closed before a response head");
        };
        let head = String::from_utf8(self.buf[..end].to_vec()).expect("utf8 head");
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().expect("length"))
            .unwrap_or(0);
        while self.buf.len() < end + len {
            assert!(self.fill() > 0, "closed mid-body");
        }
        let body = self.buf[end..end + len].to_vec();
        self.buf.drain(..end + len);
        TlsResponse {
            status,
            headers,
            body,
            head_len: end,
        }
    }
}

/// The `tls:` section for a proxy listening on `port` with `certs` (cert, key paths).
pub fn listener_yaml(port: u16, certs: &[(PathBuf, PathBuf)]) -> String {
    let mut y = format!("tls:\n  listen: 127.0.0.1:{port}\n  certificates:\n");
    for (c, k) in certs {
        y.push_str(&format!(
            "    - {{ cert: {}, key: {} }}\n",
            c.display(),
            k.display()
        ));
    }
    y
}

/// A real rustls origin: TLS terminated with the certificate given, each connection then piped
/// to a plain backend (the scripted test origin). Counts connections and remembers each one's
/// SNI name.
pub struct TlsFront {
    pub addr: SocketAddr,
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    pub snis: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    _rt: tokio::runtime::Runtime,
}

impl TlsFront {
    pub fn start(backend: SocketAddr, c: &Cert) -> TlsFront {
        TlsFront::start_with(backend, c, None)
    }

    /// Like [`TlsFront::start`], requiring a client certificate issued by (or equal to)
    /// `client_ca` when given.
    pub fn start_with(backend: SocketAddr, c: &Cert, client_ca: Option<&Cert>) -> TlsFront {
        TlsFront::start_opts(backend, c, client_ca, false)
    }

    /// Like [`TlsFront::start`], but when the backend closes, the TLS connection is closed
    /// without `close_notify` (a bare FIN, as a cut would look).
    pub fn start_abrupt(backend: SocketAddr, c: &Cert) -> TlsFront {
        TlsFront::start_opts(backend, c, None, true)
    }

    fn start_opts(
        backend: SocketAddr,
        c: &Cert,
        client_ca: Option<&Cert>,
        abrupt: bool,
    ) -> TlsFront {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).expect("key");
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions");
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots
                    .add(CertificateDer::from(ca.der.clone()))
                    .expect("client root");
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .expect("client verifier");
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(vec![CertificateDer::from(c.der.clone())], key)
            .expect("server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let snis = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (n, s) = (connections.clone(), snis.clone());
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, n, s) = (acceptor.clone(), n.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    s.lock()
                        .expect("lock")
                        .push(tls.get_ref().1.server_name().map(str::to_string));
                    let Ok(mut back) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    if !abrupt {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut back).await;
                        return;
                    }
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let (mut up, mut down) = ([0u8; 16384], [0u8; 16384]);
                    loop {
                        tokio::select! {
                            r = tls.read(&mut up) => match r {
                                Ok(n) if n > 0 => {
                                    if back.write_all(&up[..n]).await.is_err() { return; }
                                }
                                _ => return,
                            },
                            r = back.read(&mut down) => match r {
                                Ok(n) if n > 0 => {
                                    if tls.write_all(&down[..n]).await.is_err() { return; }
                                    let _ = tls.flush().await;
                                }
                                // The backend closed: drop the TLS session unannounced.
                                _ => return,
                            },
                        }
                    }
                });
            }
        });
        TlsFront {
            addr,
            connections,
            snis,
            _rt: rt,
        }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A certificate for `names` valid only from 2000 to 2001.
pub fn expired_cert(names: &[&str]) -> Cert {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).expect("params");
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("sign");
    Cert {
        pem: cert.pem(),
        key_pem: key.serialize_pem(),
        der: cert.der().to_vec(),
    }
}

/// A client config that offers exactly one protocol version and one cipher suite (and accepts
/// any certificate).
pub fn client_config_suite(
    version: &'static rustls::SupportedProtocolVersion,
    suite: rustls::SupportedCipherSuite,
) -> Arc<ClientConfig> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![suite];
    let mut c = ClientConfig::builder_with_provider(Arc::new(p))
        .with_protocol_versions(&[version])
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}
