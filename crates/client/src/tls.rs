//! The client side of TLS (SSL and SASL_SSL listeners), through rustls on the ring provider as
//! the broker's server side: the operator commands and the console reach TLS-only listeners,
//! and brokers reach each other on a TLS inter-broker listener.
//!
//! The server's certificate is checked against the CA file given (librdkafka's
//! `ssl.ca.location`), or else the system's trust store; its name against the host part of the
//! address dialled, an IP address included. A client certificate and key (for listeners that
//! require one, mTLS) are sent when the server asks for them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::{ClientError, ClientResult};

/// Where the TLS material is (PEM files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates to trust; None = the system's trust store.
    pub ca: Option<PathBuf>,
    /// Our certificate chain (leaf first), for listeners that ask for one.
    pub certificate: Option<PathBuf>,
    /// The certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
}

/// A TLS client configuration, cheap to clone.
#[derive(Clone)]
pub struct Tls {
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

fn failed(what: String) -> ClientError {
    ClientError::Tls(what)
}

fn read(path: &Path, what: &str) -> ClientResult<Vec<u8>> {
    std::fs::read(path).map_err(|e| failed(format!("reading the {what} {}: {e}", path.display())))
}

fn certificates(path: &Path, what: &str) -> ClientResult<Vec<CertificateDer<'static>>> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(format!("the {what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(failed(format!(
            "the {what} {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

impl Tls {
    /// Loads `files` into a client configuration: TLS 1.2 and 1.3 only, rustls's default
    /// cipher suites (the broker's own choices).
    pub fn load(files: &TlsFiles) -> ClientResult<Self> {
        if files.certificate.is_some() != files.key.is_some() {
            return Err(failed(
                "a client certificate needs both its certificate and its key file".into(),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        match &files.ca {
            Some(ca) => {
                for cert in certificates(ca, "CA file")? {
                    roots
                        .add(cert)
                        .map_err(|e| failed(format!("the CA file {}: {e}", ca.display())))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for cert in native.certs {
                    // A system certificate rustls cannot use is skipped, as browsers do.
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(failed(
                        "no CA file given and no usable certificate in the system's trust store"
                            .into(),
                    ));
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| failed(format!("TLS versions: {e}")))?
            .with_root_certificates(roots);
        let config = match (&files.certificate, &files.key) {
            (Some(cert), Some(key)) => {
                let chain = certificates(cert, "certificate file")?;
                let pem = read(key, "key file")?;
                let key_der = PrivateKeyDer::from_pem_slice(&pem)
                    .map_err(|e| failed(format!("the key file {}: {e}", key.display())))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| failed(format!("the client certificate and key: {e}")))?
            }
            // Checked above: both or neither.
            _ => builder.with_no_client_auth(),
        };
        Ok(Self {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// Runs the handshake on `tcp`, checking the server's certificate against `addr`'s host.
    pub(crate) async fn handshake(
        &self,
        addr: &str,
        tcp: TcpStream,
    ) -> ClientResult<tokio_rustls::client::TlsStream<TcpStream>> {
        let host = host_of(addr);
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            failed(format!(
                "{host:?} is not a name a certificate can hold: {e}"
            ))
        })?;
        self.connector
            .connect(name, tcp)
            .await
            .map_err(|e| failed(format!("TLS handshake with {addr}: {e}")))
    }
}

/// The host part of `host:port`, `[v6]:port` or a bare host.
fn host_of(addr: &str) -> &str {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => addr,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_what_the_certificate_must_name() {
        assert_eq!(host_of("broker.example:9093"), "broker.example");
        assert_eq!(host_of("127.0.0.1:9093"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9093"), "::1");
        assert_eq!(host_of("broker"), "broker");
    }

    #[test]
    fn half_a_client_certificate_is_refused() {
        let dir = std::env::temp_dir();
        let files = TlsFiles {
            ca: None,
            certificate: Some(dir.join("missing.pem")),
            key: None,
        };
        let error = Tls::load(&files).map(|_| ()).unwrap_err().to_string();
        assert!(
            error.contains("both its certificate and its key"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let files = TlsFiles {
            ca: Some(PathBuf::from("/nonexistent/ca.pem")),
            ..TlsFiles::default()
        };
        let error = Tls::load(&files).map(|_| ()).unwrap_err().to_string();
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
    }
}
