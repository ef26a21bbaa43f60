//! Certificate chains and private keys from PEM files, each error naming its file, so a bad file
//! fails `zerocache check`, start-up, or (keeping the running certificates) a reload, with its
//! path.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A certificate or key file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {what}", path.display())]
pub struct CertError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub what: String,
}

fn err(path: &Path, what: impl std::fmt::Display) -> CertError {
    CertError {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

/// Every certificate in a PEM file, in order (leaf first for a chain).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(path, e))?;
    if certs.is_empty() {
        return Err(err(
            path,
            "no PEM certificate (BEGIN CERTIFICATE) in the file",
        ));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, CertError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => err(
            path,
            "no PEM private key (BEGIN PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) in the file",
        ),
        e => err(path, e),
    })
}

/// A chain and its key, checked to belong together.
pub fn certified(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, CertError> {
    let chain = load_certs(cert)?;
    let der = load_key(key)?;
    let signing = super::provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| err(key, e))?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match()
        .map_err(|e| err(key, format!("does not belong to {}: {e}", cert.display())))?;
    Ok(Arc::new(ck))
}

/// What `zerocache_tls_certificate_expiry_timestamp_seconds` says of a served certificate: the
/// name it is known by (its first DNS name, else its subject's common name, else empty), the
/// file it came from, and its leaf's `notAfter` in Unix seconds. None when the leaf does not
/// parse as X.509 (rustls took it, so it is not expected).
pub fn expiry(cert: &CertifiedKey, file: &Path) -> Option<CertExpiry> {
    use x509_parser::extensions::GeneralName;
    let der = cert.end_entity_cert().ok()?;
    let (_, x509) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let dns = x509
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
        });
    let name = dns
        .or_else(|| {
            x509.subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_default();
    Some(CertExpiry {
        name,
        file: file.display().to_string(),
        not_after: x509.validity().not_after.timestamp(),
    })
}

/// See [`expiry`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertExpiry {
    /// The first DNS name, else the common name.
    pub name: String,
    /// The certificate file (`tls.certificates[].cert`).
    pub file: String,
    /// The leaf's `notAfter`, Unix seconds.
    pub not_after: i64,
}
