//! Authentication: listeners and their security protocols, TLS (with client certificates and
//! Kafka's principal mapping rules), SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and the SCRAM
//! users kept in shared storage.
//!
//! A connection is authenticated before anything else reaches a handler; the result is its
//! [`Principal`], carried in every request's context, where authorization (ACLs) and quotas
//! will find it.

pub mod acl;
pub mod acl_store;
pub mod oauth;
pub mod principal_mapping;
pub(crate) mod sasl;
pub mod scram;
pub mod tls;
pub mod users;
pub mod x509;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

pub use acl_store::AclStore;
pub use users::UserStore;

/// What went wrong authenticating or managing users: the security layer's one error enum,
/// mapped to Kafka codes in [`crate::errors`].
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A SASL message that does not parse (truncated, garbage, unsupported feature).
    #[error("malformed SASL message: {0}")]
    BadSaslMessage(String),
    /// Wrong password, or a user that does not exist: the two are never told apart.
    #[error("invalid credentials")]
    BadCredentials,
    /// An OAUTHBEARER token that does not verify (signature, issuer, audience, expiry); why,
    /// for the log: the client is told only RFC 7628's `invalid_token`.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// A re-authentication (KIP-368) logged in as someone else than the connection is.
    #[error("Cannot change principals during re-authentication")]
    ReauthPrincipalChanged,
    /// The mechanism is not enabled on this broker.
    #[error("unsupported SASL mechanism {0}")]
    UnsupportedMechanism(String),
    /// A SASL request out of turn (SaslAuthenticate before SaslHandshake, …).
    #[error("illegal SASL state: {0}")]
    IllegalState(&'static str),
    /// A credential Kafka would not accept (iterations out of range, empty name…).
    #[error("unacceptable credential: {0}")]
    Unacceptable(String),
    /// The user has no credential of that mechanism.
    #[error("no such credential: {0}")]
    NotFound(String),
    /// The same user named twice in one request.
    #[error("user named more than once: {0}")]
    Duplicate(String),
    /// The user store could not be read or written.
    #[error("user store: {0}")]
    Storage(#[from] strata_layout::LayoutError),
    /// Another broker kept changing the user while we tried to; the client may retry.
    #[error("user {0} changed concurrently too many times")]
    Contended(String),
    /// An ACL binding or filter Kafka would refuse.
    #[error("{0}")]
    InvalidAcl(String),
    /// An ACL API on a broker without an authorizer (`authorizer = none`).
    #[error("No Authorizer is configured.")]
    AuthorizerDisabled,
    /// The ACL objects could not be read or written (what of, and why).
    #[error("ACL storage: {0}")]
    AclStorage(String),
}

/// Kafka's listener security protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "PLAINTEXT" => Some(Self::Plaintext),
            "SSL" => Some(Self::Ssl),
            "SASL_PLAINTEXT" => Some(Self::SaslPlaintext),
            "SASL_SSL" => Some(Self::SaslSsl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// Who a connection acts for: Kafka's `KafkaPrincipal`, `User:<name>`. `ANONYMOUS` on a
/// listener without authentication.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub kind: String,
    pub name: String,
}

impl Principal {
    pub fn anonymous() -> Self {
        Self::user("ANONYMOUS")
    }

    pub fn user(name: impl Into<String>) -> Self {
        Self {
            kind: "User".to_string(),
            name: name.into(),
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

/// The SASL mechanisms Strata implements, by Kafka name.
pub const MECHANISMS: [&str; 4] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

/// Fills `buf` from the operating system's generator. Not the process's seeded generator,
/// unlike every other random draw: a nonce or salt that a replayed seed reproduces would be
/// predictable, which is what SCRAM's nonces exist to prevent.
pub(crate) fn secure_random(buf: &mut [u8]) -> Result<(), SecurityError> {
    use rand::TryRngCore;
    rand::rngs::OsRng
        .try_fill_bytes(buf)
        .map_err(|e| SecurityError::BadSaslMessage(format!("no randomness: {e}")))
}

/// A SCRAM server nonce: 24 random bytes, base64 (printable, no comma).
pub(crate) fn random_nonce() -> Result<String, SecurityError> {
    use base64::Engine;
    let mut bytes = [0u8; 24];
    secure_random(&mut bytes)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A fresh salt for a new credential.
pub fn random_salt() -> Result<Vec<u8>, SecurityError> {
    let mut salt = vec![0u8; scram::SALT_LEN];
    secure_random(&mut salt)?;
    Ok(salt)
}

/// Counts of authentication outcomes by mechanism and result, for the metrics endpoint.
#[derive(Debug, Default)]
pub struct AuthStats {
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl AuthStats {
    /// Counts one outcome: `result` is `success` or a failure reason (`bad_credentials`,
    /// `malformed`, `unsupported_mechanism`, `illegal_state`, `tls_handshake`, `storage`).
    pub(crate) fn record(&self, mechanism: &str, result: &'static str) {
        if let Ok(mut counts) = self.counts.lock() {
            // Mechanism names come from clients: only known ones get their own series.
            let mechanism = if MECHANISMS.contains(&mechanism) || mechanism == "TLS" {
                mechanism
            } else {
                "other"
            };
            *counts.entry((mechanism.to_string(), result)).or_default() += 1;
        }
    }

    /// Every (mechanism, result) counted so far with its count.
    pub fn snapshot(&self) -> Vec<(String, &'static str, u64)> {
        self.counts
            .lock()
            .map(|counts| {
                counts
                    .iter()
                    .map(|((m, r), n)| (m.clone(), *r, *n))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The reason label of an authentication failure.
pub(crate) fn failure_reason(error: &SecurityError) -> &'static str {
    match error {
        SecurityError::BadCredentials => "bad_credentials",
        SecurityError::InvalidToken(_) => "invalid_token",
        SecurityError::ReauthPrincipalChanged => "reauth_principal_changed",
        SecurityError::BadSaslMessage(_) => "malformed",
        SecurityError::UnsupportedMechanism(_) => "unsupported_mechanism",
        SecurityError::IllegalState(_) => "illegal_state",
        SecurityError::Storage(_) | SecurityError::Contended(_) | SecurityError::AclStorage(_) => {
            "storage"
        }
        SecurityError::Unacceptable(_)
        | SecurityError::NotFound(_)
        | SecurityError::Duplicate(_)
        | SecurityError::InvalidAcl(_)
        | SecurityError::AuthorizerDisabled => "other",
    }
}

/// One listener as the broker serves it: its name, security protocol, the endpoint clients
/// who came in on it are told about, and its TLS configuration (SSL and SASL_SSL).
#[derive(Clone)]
pub struct Listener {
    /// The listener's name (`PLAINTEXT`, `INTERNAL`…), as in `listeners`.
    pub name: String,
    pub protocol: SecurityProtocol,
    pub advertised_host: String,
    pub advertised_port: u16,
    pub tls: Option<std::sync::Arc<tls::TlsContext>>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("name", &self.name)
            .field("protocol", &self.protocol)
            .field("advertised_host", &self.advertised_host)
            .field("advertised_port", &self.advertised_port)
            .field("tls", &self.tls.as_ref().map(|t| t.client_auth()))
            .finish()
    }
}

impl Listener {
    /// A PLAINTEXT listener advertising `host:port`.
    pub fn plaintext(host: impl Into<String>, port: u16) -> Self {
        Self {
            name: "PLAINTEXT".to_string(),
            protocol: SecurityProtocol::Plaintext,
            advertised_host: host.into(),
            advertised_port: port,
            tls: None,
        }
    }
}
