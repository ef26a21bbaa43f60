//! The hand-over: after a completed handshake, the keys of a connection whose version and
//! cipher the kernel took at start-up go to the kernel, or the connection stays with rustls and
//! says why. Order matters, because extracting the secrets consumes the rustls connection:
//! everything that can still fall back (the cipher, records rustls has yet to send, a partial
//! record read, the `tls` ULP on this socket) is checked first. Only the key setsockopts come
//! after the point of no return; if the kernel refuses them the connection is lost (closed),
//! which start-up's trial of each cipher makes unexpected.

use super::crypto_info::{Cipher, Direction, Version, crypto_info};
use super::detect::Offload;
use super::handshake_io::HandshakeIo;
use super::stream::KtlsStream;
use nix::sys::socket::{setsockopt, sockopt};
use rustls::{CipherSuite, ConnectionTrafficSecrets, ProtocolVersion};
use std::io::Read;
use tokio_rustls::server::TlsStream;
use zerocache_ledger::UserspaceReason;

/// How a connection goes on after its handshake.
pub enum HandOver {
    /// The kernel has both directions.
    Kernel(KtlsStream),
    /// rustls keeps it, for this reason.
    Userspace(Box<TlsStream<HandshakeIo>>, UserspaceReason),
    /// The keys left rustls but the kernel refused them: the connection cannot go on (its
    /// socket is returned to be recorded before it closes).
    Lost(String, tokio::net::TcpStream),
}

/// The kernel's names for a negotiated suite (every suite rustls's `ring` provider offers).
pub fn kernel_suite(v: ProtocolVersion, s: CipherSuite) -> Option<(Version, Cipher)> {
    let version = match v {
        ProtocolVersion::TLSv1_2 => Version::Tls12,
        ProtocolVersion::TLSv1_3 => Version::Tls13,
        _ => return None,
    };
    let cipher = match s {
        CipherSuite::TLS13_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Cipher::Aes128Gcm,
        CipherSuite::TLS13_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Cipher::Aes256Gcm,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Cipher::Chacha20Poly1305,
        _ => return None,
    };
    Some((version, cipher))
}

/// Hands `s` to the kernel if `offload` takes its version and cipher.
pub fn hand_over(s: TlsStream<HandshakeIo>, offload: &Offload, tickets_sent: bool) -> HandOver {
    let userspace = |mut s: TlsStream<HandshakeIo>, why| {
        s.get_mut().0.read_freely();
        HandOver::Userspace(Box::new(s), why)
    };
    let (io, conn) = s.get_ref();
    let suite = conn
        .protocol_version()
        .zip(conn.negotiated_cipher_suite())
        .and_then(|(v, c)| kernel_suite(v, c.suite()));
    let Some((version, cipher)) = suite.filter(|(v, c)| offload.accepts(*v, *c)) else {
        return userspace(s, UserspaceReason::CipherNotOffloadable);
    };
    if conn.wants_write() || !io.at_record_boundary() {
        // Records still queued in rustls, or a record half read: neither can be handed over.
        tracing::debug!(
            queued = conn.wants_write(),
            "kTLS: the handshake did not end cleanly at a record boundary; staying in user space"
        );
        return userspace(s, UserspaceReason::HandOverFailed);
    }
    if let Err(e) = setsockopt(io.tcp(), sockopt::TcpUlp::default(), b"tls") {
        tracing::debug!(error = %e, "kTLS: TCP_ULP refused; staying in user space");
        return userspace(s, UserspaceReason::HandOverFailed);
    }
    // Point of no return: the rustls connection is consumed from here.
    let (io, mut conn) = s.into_inner();
    let handshake_bytes = io.written();
    let tcp = io.into_tcp();
    let mut early = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut closed = false;
    loop {
        match conn.reader().read(&mut chunk) {
            Ok(0) => {
                // The client's close_notify came with its first records.
                closed = true;
                break;
            }
            Ok(n) => early.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return HandOver::Lost(format!("reading what rustls decrypted: {e}"), tcp),
        }
    }
    let secrets = match conn.dangerous_extract_secrets() {
        Ok(s) => s,
        Err(e) => return HandOver::Lost(format!("extracting the secrets: {e}"), tcp),
    };
    // rustls reads on after the client's Finished while records keep arriving. A TLS 1.3
    // KeyUpdate among them that asks for ours resets rustls's send keys (sequence 0) and queues
    // its reply where the extraction cannot see it: handed over, the kernel would encrypt with
    // keys the client never got. The server always sends session tickets first (sequence >= 1),
    // so sequence 0 means exactly that; the connection is closed rather than corrupted.
    if version == Version::Tls13 && secrets.tx.0 == 0 && tickets_sent {
        return HandOver::Lost("the client updated keys before the hand-over".into(), tcp);
    }
    for (dir, (seq, secret)) in [(Direction::Tx, secrets.tx), (Direction::Rx, secrets.rx)] {
        let (key, iv) = match &secret {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
            | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
            _ => return HandOver::Lost("rustls extracted an unknown AEAD".into(), tcp),
        };
        let Ok(iv) = <[u8; 12]>::try_from(iv.as_ref()) else {
            return HandOver::Lost("rustls extracted an IV that is not 12 bytes".into(), tcp);
        };
        let info = match crypto_info(version, cipher, key.as_ref(), &iv, seq, dir) {
            Ok(i) => i,
            Err(e) => return HandOver::Lost(e.to_string(), tcp),
        };
        let set = match dir {
            Direction::Tx => setsockopt(&tcp, sockopt::TcpTlsTx, &info),
            Direction::Rx => setsockopt(&tcp, sockopt::TcpTlsRx, &info),
        };
        if let Err(e) = set {
            return HandOver::Lost(
                format!(
                    "the kernel refused the {dir:?} keys for {} {}: {e}",
                    version.name(),
                    cipher.name()
                ),
                tcp,
            );
        }
    }
    HandOver::Kernel(KtlsStream::new(
        tcp,
        early,
        closed,
        handshake_bytes,
        version,
        cipher,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ring_suite_has_its_kernel_name() {
        let provider = rustls::crypto::ring::default_provider();
        for s in provider.cipher_suites {
            let v = s.version().version;
            assert!(
                kernel_suite(v, s.suite()).is_some(),
                "{:?} {:?} has no kernel name",
                v,
                s.suite()
            );
        }
        assert_eq!(
            kernel_suite(
                ProtocolVersion::TLSv1_3,
                CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            ),
            Some((Version::Tls13, Cipher::Chacha20Poly1305))
        );
        assert_eq!(
            kernel_suite(
                ProtocolVersion::TLSv1_0,
                CipherSuite::TLS13_AES_128_GCM_SHA256
            ),
            None
        );
    }
}
