//! TLS for SSL and SASL_SSL listeners, through rustls: TLS 1.2 and 1.3 only, the certificate
//! chain and key from PEM files read at start-up (a changed file takes a restart).

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("reading certificates from {path}: {reason}")]
    Certificates { path: String, reason: String },
    #[error("reading the private key from {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A TLS acceptor serving the chain in `certificate` (PEM, leaf first) with the key in `key`
/// (PEM: PKCS#8, PKCS#1 or SEC1).
pub fn acceptor(certificate: &Path, key: &Path) -> Result<TlsAcceptor, TlsConfigError> {
    let certs_error = |reason: String| TlsConfigError::Certificates {
        path: certificate.display().to_string(),
        reason,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certificate)
        .map_err(|e| certs_error(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| certs_error(e.to_string()))?;
    if chain.is_empty() {
        return Err(certs_error("no certificate in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsConfigError::Key {
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
