//! TLS for SSL and SASL_SSL listeners, through rustls: TLS 1.2 and 1.3 only, the certificate
//! chain and key from PEM files, optionally client certificates checked against a CA bundle
//! (mTLS), and the files watched so that a renewed certificate is served to new connections
//! without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use strata_core::{Clock, Ticker};
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use super::principal_mapping::PrincipalMapper;
use super::Principal;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("reading certificates from {path}: {reason}")]
    Certificates { path: String, reason: String },
    #[error("reading the private key from {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("reading the truststore {path}: {reason}")]
    Truststore { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Kafka's `ssl.client.auth`: whether a TLS listener asks clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// Asked for; a client without one connects as `User:ANONYMOUS`, one with a certificate
    /// the truststore does not vouch for is refused.
    Requested,
    /// A client without a certificate the truststore vouches for is refused.
    Required,
}

impl ClientAuth {
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "none" => Some(Self::None),
            "requested" => Some(Self::Requested),
            "required" => Some(Self::Required),
            _ => None,
        }
    }
}

/// The files a TLS listener serves from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM chain, leaf first.
    pub certificate: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that client certificates must chain to (mTLS).
    pub truststore: Option<PathBuf>,
}

/// The files' bytes as last loaded: a reload happens when they differ (contents, not
/// modification times, which copies and some volume mounts do not keep).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loaded {
    certificate: Vec<u8>,
    key: Vec<u8>,
    truststore: Option<Vec<u8>>,
}

/// One TLS listener's configuration, swapped whole when its files change: a connection
/// takes the configuration current when it is accepted and keeps it.
pub struct TlsContext {
    files: TlsFiles,
    client_auth: ClientAuth,
    mapper: PrincipalMapper,
    current: RwLock<(Arc<ServerConfig>, Loaded)>,
}

impl std::fmt::Debug for TlsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsContext")
            .field("files", &self.files)
            .field("client_auth", &self.client_auth)
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| e.to_string())
}

fn load(files: &TlsFiles) -> Result<Loaded, TlsConfigError> {
    let certificate = read(&files.certificate).map_err(|reason| TlsConfigError::Certificates {
        path: files.certificate.display().to_string(),
        reason,
    })?;
    let key = read(&files.key).map_err(|reason| TlsConfigError::Key {
        path: files.key.display().to_string(),
        reason,
    })?;
    let truststore = match &files.truststore {
        Some(path) => Some(read(path).map_err(|reason| TlsConfigError::Truststore {
            path: path.display().to_string(),
            reason,
        })?),
        None => None,
    };
    Ok(Loaded {
        certificate,
        key,
        truststore,
    })
}

fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no certificate in the file".into());
    }
    Ok(certs)
}

fn build(
    files: &TlsFiles,
    client_auth: ClientAuth,
    loaded: &Loaded,
) -> Result<ServerConfig, TlsConfigError> {
    let chain =
        certificates(&loaded.certificate).map_err(|reason| TlsConfigError::Certificates {
            path: files.certificate.display().to_string(),
            reason,
        })?;
    let key = PrivateKeyDer::from_pem_slice(&loaded.key).map_err(|e| TlsConfigError::Key {
        path: files.key.display().to_string(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Requested | ClientAuth::Required => {
            let trust_error = |reason: String| TlsConfigError::Truststore {
                path: files
                    .truststore
                    .as_ref()
                    .map_or_else(|| "(none)".to_string(), |p| p.display().to_string()),
                reason,
            };
            let pem = loaded
                .truststore
                .as_deref()
                .ok_or_else(|| trust_error("client authentication needs a truststore".into()))?;
            let mut roots = RootCertStore::empty();
            for ca in certificates(pem).map_err(trust_error)? {
                roots
                    .add(ca)
                    .map_err(|e| trust_error(format!("a CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match client_auth {
                ClientAuth::Requested => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            let verifier = verifier.build().map_err(|e| trust_error(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    Ok(builder.with_single_cert(chain, key)?)
}

impl TlsContext {
    /// Loads `files` (failing if they do not make a configuration).
    pub fn load(
        files: TlsFiles,
        client_auth: ClientAuth,
        mapper: PrincipalMapper,
    ) -> Result<Self, TlsConfigError> {
        let loaded = load(&files)?;
        let config = build(&files, client_auth, &loaded)?;
        Ok(Self {
            files,
            client_auth,
            mapper,
            current: RwLock::new((Arc::new(config), loaded)),
        })
    }

    pub fn client_auth(&self) -> ClientAuth {
        self.client_auth
    }

    /// An acceptor with the configuration current now.
    pub fn acceptor(&self) -> TlsAcceptor {
        let config = match self.current.read() {
            Ok(current) => Arc::clone(&current.0),
            Err(poisoned) => Arc::clone(&poisoned.into_inner().0),
        };
        TlsAcceptor::from(config)
    }

    /// Reads the files again and, if they changed, swaps in the configuration they make.
    /// Ok(true) when swapped; an error leaves the current configuration in place.
    pub fn reload(&self) -> Result<bool, TlsConfigError> {
        let loaded = load(&self.files)?;
        let unchanged = match self.current.read() {
            Ok(current) => current.1 == loaded,
            Err(poisoned) => poisoned.into_inner().1 == loaded,
        };
        if unchanged {
            return Ok(false);
        }
        let config = Arc::new(build(&self.files, self.client_auth, &loaded)?);
        match self.current.write() {
            Ok(mut current) => *current = (config, loaded),
            Err(poisoned) => *poisoned.into_inner() = (config, loaded),
        }
        Ok(true)
    }

    /// The principal of a connection that presented `certificates` (leaf first), or None
    /// when no mapping rule matches its subject (the connection is refused). Without a
    /// certificate: `User:ANONYMOUS`.
    pub fn principal(&self, certificates: Option<&[CertificateDer<'_>]>) -> Option<Principal> {
        let Some(leaf) = certificates.and_then(|c| c.first()) else {
            return Some(Principal::anonymous());
        };
        let dn = match super::x509::subject_dn(leaf.as_ref()) {
            Ok(dn) => dn,
            Err(e) => {
                warn!(error = %e, "client certificate subject unreadable");
                return None;
            }
        };
        self.mapper.map(&dn).map(Principal::user)
    }

    /// Reloads every context every `interval` until the process ends; a failed reload is
    /// logged and counted, and the old configuration kept.
    pub async fn watch(
        contexts: Vec<Arc<TlsContext>>,
        clock: Arc<dyn Clock>,
        interval: Duration,
        stats: Arc<TlsReloadStats>,
    ) {
        let mut ticker = Ticker::new(clock, interval);
        ticker.tick().await; // the first tick is now: the files were just loaded
        loop {
            ticker.tick().await;
            for context in &contexts {
                match context.reload() {
                    Ok(false) => {}
                    Ok(true) => {
                        stats.record("success");
                        info!(certificate = %context.files.certificate.display(),
                            "TLS certificate files changed; new connections get the new configuration");
                    }
                    Err(e) => {
                        stats.record("error");
                        warn!(error = %e, "TLS files changed but do not load; keeping the previous configuration");
                    }
                }
            }
        }
    }
}

/// Reloads of TLS files by result (`success`, `error`), for the metrics endpoint.
#[derive(Debug, Default)]
pub struct TlsReloadStats {
    success: std::sync::atomic::AtomicU64,
    error: std::sync::atomic::AtomicU64,
}

impl TlsReloadStats {
    fn record(&self, result: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        match result {
            "success" => self.success.fetch_add(1, Relaxed),
            _ => self.error.fetch_add(1, Relaxed),
        };
    }

    /// (successful reloads, failed ones).
    pub fn snapshot(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.success.load(Relaxed), self.error.load(Relaxed))
    }
}
