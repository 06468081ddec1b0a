//! The client side of SASL (KIP-43, KIP-84, KIP-152): SaslHandshake v1 then SaslAuthenticate
//! v2, with PLAIN and SCRAM-SHA-256/512 (RFC 5802 without channel binding, as Kafka), so the
//! operator commands and the console reach brokers whose listeners require a login.
//!
//! The SCRAM nonce comes from the operating system's generator, not the process's seeded one:
//! a nonce is a secret that must not be replayable from a seed.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::TryRngCore;
use sha2::{Digest, Sha256, Sha512};

/// The mechanisms this client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl SaslMechanism {
    /// Kafka's name of the mechanism (`sasl.mechanism`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    /// Parses Kafka's name, case-insensitively.
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_uppercase().as_str() {
            "PLAIN" => Some(Self::Plain),
            "SCRAM-SHA-256" => Some(Self::ScramSha256),
            "SCRAM-SHA-512" => Some(Self::ScramSha512),
            _ => None,
        }
    }
}

/// Who to log in as.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslCredentials {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for SaslCredentials {
    // Never print the password (errors and logs may format the credentials).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslCredentials")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The most PBKDF2 iterations a server may ask for: Kafka's own limit (16384) with room, so a
/// hostile server cannot make the client spin for minutes.
const MAX_ITERATIONS: u32 = 100_000;

/// One login's state, message by message. `first` gives the first client message; each server
/// message goes to `respond`, which returns the next client message, or None when the server's
/// last message has been verified.
pub(crate) enum Exchange {
    Plain(Vec<u8>),
    Scram(Scram),
}

impl Exchange {
    pub(crate) fn start(credentials: &SaslCredentials) -> Result<Self, String> {
        match credentials.mechanism {
            SaslMechanism::Plain => {
                let mut message = Vec::new();
                message.push(0);
                message.extend_from_slice(credentials.username.as_bytes());
                message.push(0);
                message.extend_from_slice(credentials.password.as_bytes());
                Ok(Self::Plain(message))
            }
            SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
                let mut raw = [0u8; 24];
                rand::rngs::OsRng
                    .try_fill_bytes(&mut raw)
                    .map_err(|e| format!("no randomness for a SCRAM nonce: {e}"))?;
                Ok(Self::Scram(Scram::new(credentials, BASE64.encode(raw))))
            }
        }
    }

    pub(crate) fn first(&self) -> Vec<u8> {
        match self {
            Self::Plain(message) => message.clone(),
            Self::Scram(scram) => format!("n,,{}", scram.client_first_bare).into_bytes(),
        }
    }

    /// The next client message for the server's `message`; Ok(None) once logged in.
    pub(crate) fn respond(&mut self, message: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match self {
            // PLAIN is one message each way; the server's answer is empty.
            Self::Plain(_) => Ok(None),
            Self::Scram(scram) => scram.respond(message),
        }
    }
}

pub(crate) struct Scram {
    mechanism: SaslMechanism,
    password: String,
    nonce: String,
    client_first_bare: String,
    /// Set once the client's final message is sent: what the server's signature must be.
    expected_server_signature: Option<Vec<u8>>,
}

/// RFC 5802's escaping of `=` and `,` in a user name.
fn saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

impl Scram {
    fn new(credentials: &SaslCredentials, nonce: String) -> Self {
        let client_first_bare = format!("n={},r={nonce}", saslname(&credentials.username));
        Self {
            mechanism: credentials.mechanism,
            password: credentials.password.clone(),
            nonce,
            client_first_bare,
            expected_server_signature: None,
        }
    }

    fn respond(&mut self, message: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let text = std::str::from_utf8(message).map_err(|_| "a SCRAM message that is not UTF-8")?;
        let field = |name: char| {
            text.split(',')
                .find_map(|part| part.strip_prefix(name).and_then(|p| p.strip_prefix('=')))
        };
        if let Some(error) = field('e') {
            return Err(format!("the broker refused the login: {error}"));
        }
        if let Some(expected) = &self.expected_server_signature {
            let signature = field('v').ok_or("the broker's last SCRAM message has no signature")?;
            let signature = BASE64
                .decode(signature)
                .map_err(|_| "the broker's SCRAM signature is not base64")?;
            if &signature != expected {
                return Err(
                    "the broker's SCRAM signature is wrong: it does not know this user's \
                            credentials (a server impersonating the broker?)"
                        .into(),
                );
            }
            return Ok(None);
        }
        let nonce = field('r').ok_or("the broker's first SCRAM message has no nonce")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the broker's SCRAM nonce does not extend ours".into());
        }
        let salt = field('s')
            .and_then(|s| BASE64.decode(s).ok())
            .ok_or("the broker's first SCRAM message has no salt")?;
        let iterations: u32 = field('i')
            .and_then(|i| i.parse().ok())
            .filter(|i| (1..=MAX_ITERATIONS).contains(i))
            .ok_or("the broker's SCRAM iteration count is missing or out of range")?;
        let salted = self.salted_password(&salt, iterations);
        let client_key = self.hmac(&salted, b"Client Key");
        let stored_key = self.hash(&client_key);
        // "biws" is base64 of "n,,": no channel binding, as in the first message.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let signature = self.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = self.hmac(&salted, b"Server Key");
        self.expected_server_signature = Some(self.hmac(&server_key, auth_message.as_bytes()));
        Ok(Some(
            format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes(),
        ))
    }

    fn salted_password(&self, salt: &[u8], iterations: u32) -> Vec<u8> {
        let password = self.password.as_bytes();
        match self.mechanism {
            SaslMechanism::ScramSha512 => {
                let mut out = vec![0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out
            }
            _ => {
                let mut out = vec![0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out
            }
        }
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes keys of any length, so `new_from_slice` cannot fail here.
        match self.mechanism {
            SaslMechanism::ScramSha512 => Hmac::<Sha512>::new_from_slice(key)
                .map(|mac| mac.chain_update(data).finalize().into_bytes().to_vec())
                .unwrap_or_default(),
            _ => Hmac::<Sha256>::new_from_slice(key)
                .map(|mac| mac.chain_update(data).finalize().into_bytes().to_vec())
                .unwrap_or_default(),
        }
    }

    fn hash(&self, data: &[u8]) -> Vec<u8> {
        match self.mechanism {
            SaslMechanism::ScramSha512 => Sha512::digest(data).to_vec(),
            _ => Sha256::digest(data).to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example, with its fixed client nonce: the client's final
    /// message must be byte for byte the RFC's, and the RFC's server signature accepted.
    #[test]
    fn scram_sha_256_matches_rfc_7677() {
        let credentials = SaslCredentials {
            mechanism: SaslMechanism::ScramSha256,
            username: "user".into(),
            password: "pencil".into(),
        };
        let mut scram = Scram::new(&credentials, "rOprNGfwEbeRWgbNEkqO".into());
        assert_eq!(scram.client_first_bare, "n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let client_final = scram.respond(server_first).unwrap().unwrap();
        assert_eq!(
            String::from_utf8(client_final).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert_eq!(
            scram
                .respond(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .unwrap(),
            None
        );
    }

    #[test]
    fn a_wrong_server_signature_or_a_foreign_nonce_is_refused() {
        let credentials = SaslCredentials {
            mechanism: SaslMechanism::ScramSha256,
            username: "user".into(),
            password: "pencil".into(),
        };
        let mut scram = Scram::new(&credentials, "rOprNGfwEbeRWgbNEkqO".into());
        assert!(scram
            .respond(b"r=someone-else,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .is_err());
        let mut scram = Scram::new(&credentials, "rOprNGfwEbeRWgbNEkqO".into());
        scram
            .respond(b"r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        assert!(scram.respond(b"v=AAAA").is_err());
        let mut scram = Scram::new(&credentials, "n".into());
        assert!(
            scram.respond(b"r=nn,s=AAAA,i=99999999").is_err(),
            "iterations bounded"
        );
        assert!(scram.respond(b"e=invalid-proof").is_err());
    }

    #[test]
    fn plain_sends_one_message_and_names_are_escaped() {
        let credentials = SaslCredentials {
            mechanism: SaslMechanism::Plain,
            username: "alice".into(),
            password: "secret".into(),
        };
        let exchange = Exchange::start(&credentials).unwrap();
        assert_eq!(exchange.first(), b"\0alice\0secret");
        assert_eq!(saslname("a=b,c"), "a=3Db=2Cc");
        assert_eq!(
            SaslMechanism::parse("scram-sha-512"),
            Some(SaslMechanism::ScramSha512)
        );
        assert!(!format!("{credentials:?}").contains("secret"));
    }
}
