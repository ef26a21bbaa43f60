//! Trust by pin: an origin certificate byte-identical to one the operator put in `tls.ca` is
//! trusted as itself, not through a chain.
//!
//! The usual way to make a self-signed certificate, `openssl req -x509`, marks it `CA:TRUE`, and
//! webpki (rightly, for chains) refuses a CA certificate as the end entity: every request was a
//! 502 although curl's `--cacert` and nginx's `proxy_ssl_trusted_certificate` accept it. A pin
//! needs no chain: the operator named these exact bytes. What still holds is everything else a
//! verifier checks: the certificate must be valid for the name connected to (webpki's own name
//! check) and within its validity dates, and the handshake must be signed by its key (the
//! signature methods below). Any other certificate goes to the chain verifier unchanged.

use super::der::{element, time};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};
use std::sync::Arc;

/// The chain verifier of a group's `tls.ca`, with its certificates also trusted as pins.
#[derive(Debug)]
pub(super) struct PinnedOrChain {
    pub(super) chain: Arc<WebPkiServerVerifier>,
    pub(super) pins: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for PinnedOrChain {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if !self.pins.iter().any(|p| p.as_ref() == end_entity.as_ref()) {
            return self.chain.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp,
                now,
            );
        }
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(server_name)
            .map_err(|_| Error::InvalidCertificate(CertificateError::NotValidForName))?;
        let (not_before, not_after) =
            validity(end_entity).ok_or(Error::InvalidCertificate(CertificateError::BadEncoding))?;
        let now = now.as_secs() as i64;
        if now < not_before {
            return Err(Error::InvalidCertificate(CertificateError::NotValidYet));
        }
        if now > not_after {
            return Err(Error::InvalidCertificate(CertificateError::Expired));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// `notBefore` and `notAfter` of an X.509 certificate, as Unix seconds: Certificate ::=
/// SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
/// validity SEQUENCE { notBefore, notAfter }, ... }, ... } (RFC 5280 §4.1).
fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (0x30, cert, _) = element(der)? else {
        return None;
    };
    let (0x30, tbs, _) = element(cert)? else {
        return None;
    };
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == 0xa0 {
        rest = after; // version
    }
    for expected in [0x02, 0x30, 0x30] {
        // serialNumber, signature, issuer
        let (tag, _, after) = element(rest)?;
        if tag != expected {
            return None;
        }
        rest = after;
    }
    let (0x30, validity, _) = element(rest)? else {
        return None;
    };
    let (t1, before, after) = element(validity)?;
    let (t2, after_time, _) = element(after)?;
    Some((time(t1, before)?, time(t2, after_time)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_time_forms_and_refuses_garbage() {
        assert_eq!(time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time(0x18, b"20500808120000Z"), Some(2_543_572_800));
        for (tag, bad) in [
            (0x17, &b"7001010000Z"[..]),
            (0x17, b"700101000000"),
            (0x18, b"700101000000Z"),
            (0x17, b"701301000000Z"),
            (0x17, b"70010100000+Z"),
            (0x05, b"700101000000Z"),
            (0x17, "1é123456789Z".as_bytes()),
            (0x18, "2é26120100000Z".as_bytes()),
        ] {
            assert_eq!(time(tag, bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn hostile_der_is_none_not_a_panic() {
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x85, 1, 2, 3, 4, 5],
            &[0x30, 0x82, 0xff, 0xff, 0],
            &[0x30, 0x03, 0x30, 0x01, 0x00],
            &[0x31, 0x00],
        ] {
            assert_eq!(validity(bad), None, "{bad:?}");
        }
    }
}
