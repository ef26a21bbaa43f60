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
