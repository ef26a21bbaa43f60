//! OCSP stapling from a file the operator refreshes (`tls.certificates[].ocsp`, a DER
//! OCSPResponse as `openssl ocsp -respout` writes it): sent in the handshake while it is fresh,
//! so clients need not ask the CA (a privacy leak and a stall) and must-staple certificates work.
//! Read at start-up and by each reload; a response that is not for this certificate, not
//! `good`, or not fresh is not stapled (and said), rather than handed to clients that would
//! reject the handshake. Freshness is checked at every handshake: a file left to expire stops
//! being stapled at its `nextUpdate`.
//!
//! Only the fields that decide whether to staple are read (RFC 6960 §4.2.1): the response
//! status, the single response's serial number, its status and its `thisUpdate`/`nextUpdate`.
//! The signature, and the issuer hashes beside the serial, are the client's to check: it has
//! the issuer, and a response it rejects costs that handshake, so the file is the operator's
//! to fetch from the CA's responder (over HTTP, whose answer is signed, not private).

use super::certs::CertError;
use super::der::{element, time};
use rustls::sign::CertifiedKey;
use std::path::Path;
use std::sync::Arc;

/// The time now in Unix seconds, as freshness is judged.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `cert` with the OCSP response in `file` stapled, and the response's dates; none (and said in
/// the log) when the response cannot be stapled: another certificate's, not `good`, or stale.
/// A file that cannot be read is an error, as a certificate file is.
pub fn stapled(
    cert: &Arc<CertifiedKey>,
    file: &Path,
) -> Result<Option<(Arc<CertifiedKey>, Staple)>, CertError> {
    let der = std::fs::read(file).map_err(|e| CertError {
        path: file.to_path_buf(),
        what: e.to_string(),
    })?;
    let serial = cert
        .end_entity_cert()
        .ok()
        .and_then(|c| {
            x509_parser::parse_x509_certificate(c.as_ref())
                .ok()
                .map(|(_, x)| x.tbs_certificate.raw_serial().to_vec())
        })
        .unwrap_or_default();
    if serial.is_empty() {
        // No serial to match: an empty INTEGER in a response must not pass for it.
        tracing::warn!(file = %file.display(), "OCSP response not stapled: the certificate's serial number cannot be read");
        return Ok(None);
    }
    match read(&der, &serial) {
        // Kept until its nextUpdate; a thisUpdate a little ahead of this clock (skew) waits for
        // the per-handshake check rather than a reload.
        Ok(s) if now() < s.next_update => {
            tracing::info!(file = %file.display(), next_update = s.next_update, "OCSP response stapled while fresh, until its nextUpdate");
            let mut with = CertifiedKey::clone(cert);
            with.ocsp = Some(s.der.clone());
            Ok(Some((Arc::new(with), s)))
        }
        Ok(s) => {
            tracing::warn!(file = %file.display(), this_update = s.this_update, next_update = s.next_update, "OCSP response not fresh; not stapled (refresh the file and reload)");
            Ok(None)
        }
        Err(why) => {
            tracing::warn!(file = %file.display(), %why, "OCSP response not stapled");
            Ok(None)
        }
    }
}

/// What stapling needs of an OCSP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staple {
    /// The response, as sent in the handshake.
    pub der: Vec<u8>,
    /// `thisUpdate`, Unix seconds.
    pub this_update: i64,
    /// `nextUpdate`, Unix seconds: not stapled from then on.
    pub next_update: i64,
}

impl Staple {
    /// Whether it may be stapled at `now` (Unix seconds).
    pub fn fresh(&self, now: i64) -> bool {
        self.this_update <= now && now < self.next_update
    }
}

/// `der` read as the OCSP response for the certificate with serial number `serial` (its
/// DER INTEGER contents); why not, in words for the log.
pub fn read(der: &[u8], serial: &[u8]) -> Result<Staple, String> {
    let bad = || "not a DER OCSPResponse".to_string();
    // OCSPResponse ::= SEQUENCE { responseStatus ENUMERATED, responseBytes [0] EXPLICIT ... }
    let (0x30, resp, _) = element(der).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x0a, status, rest) = element(resp).ok_or_else(bad)? else {
        return Err(bad());
    };
    if status != [0] {
        return Err(format!(
            "the responder answered status {status:?}, not successful (0)"
        ));
    }
    // responseBytes: SEQUENCE { responseType OID, response OCTET STRING (BasicOCSPResponse) }
    let (0xa0, bytes, _) = element(rest).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x30, bytes, _) = element(bytes).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x06, _, rest) = element(bytes).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x04, basic, _) = element(rest).ok_or_else(bad)? else {
        return Err(bad());
    };
    // BasicOCSPResponse ::= SEQUENCE { tbsResponseData ResponseData, ... }
    let (0x30, basic, _) = element(basic).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x30, data, _) = element(basic).ok_or_else(bad)? else {
        return Err(bad());
    };
    // ResponseData ::= SEQUENCE { version [0] OPTIONAL, responderID [1]|[2], producedAt,
    // responses SEQUENCE OF SingleResponse, ... }
    let mut rest = data;
    let (tag, _, after) = element(rest).ok_or_else(bad)?;
    if tag == 0xa0 {
        rest = after;
    }
    let (0xa1 | 0xa2, _, rest) = element(rest).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x18, _, rest) = element(rest).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (0x30, mut responses, _) = element(rest).ok_or_else(bad)? else {
        return Err(bad());
    };
    while !responses.is_empty() {
        let (0x30, single, next) = element(responses).ok_or_else(bad)? else {
            return Err(bad());
        };
        responses = next;
        // SingleResponse ::= SEQUENCE { certID, certStatus, thisUpdate, nextUpdate [0] OPTIONAL }
        // CertID ::= SEQUENCE { hashAlgorithm, issuerNameHash, issuerKeyHash, serialNumber }
        let (0x30, cert_id, rest) = element(single).ok_or_else(bad)? else {
            return Err(bad());
        };
        let mut id = cert_id;
        for expected in [0x30, 0x04, 0x04] {
            let (tag, _, after) = element(id).ok_or_else(bad)?;
            if tag != expected {
                return Err(bad());
            }
            id = after;
        }
        let (0x02, their_serial, _) = element(id).ok_or_else(bad)? else {
            return Err(bad());
        };
        if their_serial != serial {
            continue;
        }
        let (status, _, rest) = element(rest).ok_or_else(bad)?;
        match status {
            0x80 => {}
            0xa1 => return Err("the certificate is revoked".into()),
            _ => return Err("the responder does not know the certificate".into()),
        }
        let (tag, this, rest) = element(rest).ok_or_else(bad)?;
        let this_update = time(tag, this).ok_or_else(bad)?;
        let next_update = match element(rest) {
            Some((0xa0, next, _)) => {
                let (tag, t, _) = element(next).ok_or_else(bad)?;
                time(tag, t).ok_or_else(bad)?
            }
            _ => return Err("the response has no nextUpdate: it cannot be known fresh".into()),
        };
        return Ok(Staple {
            der: der.to_vec(),
            this_update,
            next_update,
        });
    }
    Err("the response is for another certificate (no matching serial number)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// An OCSP response as a responder writes it (the signature is not read here).
    fn single(serial: &[u8], cert_status: &[u8], next: Option<&str>) -> Vec<u8> {
        let cert_id = [
            tlv(
                0x30,
                &[tlv(0x06, &[0x2b, 0x0e, 0x03, 0x02, 0x1a]), tlv(0x05, &[])].concat(),
            ),
            tlv(0x04, &[1; 20]),
            tlv(0x04, &[2; 20]),
            tlv(0x02, serial),
        ]
        .concat();
        let mut single = [
            tlv(0x30, &cert_id),
            cert_status.to_vec(),
            tlv(0x18, b"20261201000000Z"),
        ]
        .concat();
        if let Some(n) = next {
            single.extend(tlv(0xa0, &tlv(0x18, n.as_bytes())));
        }
        tlv(0x30, &single)
    }

    fn response(status: u8, serial: &[u8], cert_status: &[u8], next: Option<&str>) -> Vec<u8> {
        // Another certificate's answer first: the one for this serial is found after it.
        let other = single(&[0x55], &tlv(0xa1, &[]), None);
        let data = [
            tlv(0xa2, &tlv(0x04, &[3; 20])),
            tlv(0x18, b"20261201000000Z"),
            tlv(0x30, &[other, single(serial, cert_status, next)].concat()),
        ]
        .concat();
        let basic = tlv(
            0x30,
            &[
                tlv(0x30, &data),
                tlv(0x30, &tlv(0x06, &[0x2a])),
                tlv(0x03, &[0, 7]),
            ]
            .concat(),
        );
        let bytes = tlv(
            0x30,
            &[
                tlv(0x06, &[0x2b, 6, 1, 5, 5, 7, 48, 1, 1]),
                tlv(0x04, &basic),
            ]
            .concat(),
        );
        tlv(0x30, &[tlv(0x0a, &[status]), tlv(0xa0, &bytes)].concat())
    }

    #[test]
    fn a_good_response_for_this_certificate_is_stapled_while_fresh() {
        let good = tlv(0x80, &[]);
        let r = response(0, &[0x01, 0x23], &good, Some("20261208000000Z"));
        let s = read(&r, &[0x01, 0x23]).expect("stapled");
        // 2026-12-01 and 2026-12-08, 00:00 UTC.
        assert_eq!(
            (s.this_update, s.next_update),
            (1_796_083_200, 1_796_688_000)
        );
        assert_eq!(s.der, r);
        assert!(!s.fresh(1_796_083_199) && s.fresh(1_796_083_200));
        assert!(s.fresh(1_796_687_999) && !s.fresh(1_796_688_000));
        assert_eq!(
            read(&r, &[0x01, 0x24]).expect_err("another serial"),
            "the response is for another certificate (no matching serial number)"
        );
        let revoked = response(
            0,
            &[1],
            &tlv(0xa1, &tlv(0x18, b"20261201000000Z")),
            Some("20261208000000Z"),
        );
        assert_eq!(
            read(&revoked, &[1]).expect_err("revoked"),
            "the certificate is revoked"
        );
        let unknown = response(0, &[1], &tlv(0x82, &[]), Some("20261208000000Z"));
        assert_eq!(
            read(&unknown, &[1]).expect_err("unknown"),
            "the responder does not know the certificate"
        );
        assert_eq!(
            read(&response(0, &[1], &good, None), &[1]).expect_err("no next"),
            "the response has no nextUpdate: it cannot be known fresh"
        );
        assert!(
            read(&response(3, &[1], &good, Some("20261208000000Z")), &[1])
                .expect_err("tryLater")
                .contains("not successful")
        );
        // A date with a multi-byte character where a digit goes (the review's crash): refused.
        let mut odd = r.clone();
        let at = odd
            .windows(15)
            .rposition(|w| w == b"20261201000000Z")
            .expect("this certificate's thisUpdate, the last of its kind");
        odd.splice(at + 1..at + 3, "é".bytes());
        assert!(read(&odd, &[0x01, 0x23]).is_err());
        // Every truncation and every flipped byte: an error or another reading, never a panic.
        for i in 0..r.len() {
            assert!(read(&r[..i], &[0x01, 0x23]).is_err(), "{i}");
            let mut bad = r.clone();
            bad[i] ^= 0xff;
            let _ = read(&bad, &[0x01, 0x23]);
        }
    }
}
