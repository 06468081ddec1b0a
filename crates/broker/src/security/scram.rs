//! SCRAM (RFC 5802, with the SHA-2 hashes of RFC 7677) as Kafka uses it: the credential a
//! server keeps, the parsing of the client's two messages, and the server's side of the
//! exchange. The primitives are RustCrypto's (`pbkdf2`, `hmac`, `sha2`); proofs are compared in
//! constant time (`subtle`).
//!
//! Kafka does not SASLprep names or passwords (its `ScramFormatter` uses their UTF-8 bytes),
//! and neither does this module, so a credential made by Kafka's tools verifies here.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use crate::security::SecurityError;

/// Fewest PBKDF2 iterations accepted for a stored credential (Kafka's minimum, RFC 7677's).
pub const MIN_ITERATIONS: u32 = 4096;
/// Most iterations accepted (Kafka's maximum): each PLAIN login recomputes them.
pub const MAX_ITERATIONS: u32 = 16384;
/// Length of the salts this broker draws.
pub const SALT_LEN: usize = 32;
/// Longest SCRAM message accepted; real ones are a few hundred bytes.
pub const MAX_MESSAGE_LEN: usize = 4096;

/// A SCRAM mechanism, with Kafka's numbering in the ScramCredential APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's `ScramMechanism` type number (1 and 2; 0 is UNKNOWN).
    pub fn kafka_type(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(kind: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.kafka_type() == kind)
    }

    /// Length of this mechanism's hash, and so of its salted passwords and keys.
    pub fn output_len(self) -> usize {
        match self {
            Mechanism::Sha256 => 32,
            Mechanism::Sha512 => 64,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes a key of any length, so `new_from_slice` cannot fail here.
        match self {
            Mechanism::Sha256 => Hmac::<Sha256>::new_from_slice(key)
                .map(|mut mac| {
                    mac.update(data);
                    mac.finalize().into_bytes().to_vec()
                })
                .unwrap_or_default(),
            Mechanism::Sha512 => Hmac::<Sha512>::new_from_slice(key)
                .map(|mut mac| {
                    mac.update(data);
                    mac.finalize().into_bytes().to_vec()
                })
                .unwrap_or_default(),
        }
    }

    /// `Hi(password, salt, iterations)`: PBKDF2 with this mechanism's HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            Mechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// What the server keeps of a password (RFC 5802 §3), never the password itself.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub mechanism: Mechanism,
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// The credential of a salted password, as AlterUserScramCredentials sends it.
    pub fn from_salted_password(
        mechanism: Mechanism,
        salted_password: &[u8],
        salt: Vec<u8>,
        iterations: u32,
    ) -> Self {
        let client_key = mechanism.hmac(salted_password, b"Client Key");
        Self {
            mechanism,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, b"Server Key"),
            salt,
            iterations,
        }
    }

    /// The credential of a password (the `strata users` command).
    pub fn from_password(
        mechanism: Mechanism,
        password: &[u8],
        salt: Vec<u8>,
        iterations: u32,
    ) -> Self {
        let salted = mechanism.salted_password(password, &salt, iterations);
        Self::from_salted_password(mechanism, &salted, salt, iterations)
    }

    /// Whether `password` is this credential's (SASL/PLAIN against the SCRAM store). Costs
    /// the credential's PBKDF2 iterations.
    pub fn verify_password(&self, password: &[u8]) -> bool {
        let salted = self
            .mechanism
            .salted_password(password, &self.salt, self.iterations);
        let client_key = self.mechanism.hmac(&salted, b"Client Key");
        let stored_key = self.mechanism.hash(&client_key);
        bool::from(stored_key.ct_eq(&self.stored_key))
    }

    /// The credential of a user who does not exist: the salt is a keyed hash of the name, so
    /// asking twice gives the same salt, as for a real user; nothing verifies against it.
    pub fn fake(mechanism: Mechanism, user: &str, secret: &[u8]) -> Self {
        let mut salt = mechanism.hmac(secret, user.as_bytes());
        salt.truncate(SALT_LEN);
        // A stored key no proof can hash to: the all-zero output of the hash is not reachable
        // in practice, and verification fails on `known` anyway.
        let len = mechanism.hash(b"").len();
        Self {
            mechanism,
            salt,
            iterations: MIN_ITERATIONS,
            stored_key: vec![0; len],
            server_key: vec![0; len],
        }
    }
}

/// The client's first message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// The `gs2-header` (`n,,` or `y,,`, with an optional authzid), echoed in `c=` later.
    pub gs2_header: String,
    pub user: String,
    pub nonce: String,
    /// `client-first-message-bare`, part of the AuthMessage.
    pub bare: String,
    /// Kafka's `tokenauth=true` extension (delegation tokens), which Strata does not serve.
    pub token_auth: bool,
}

/// The client's final message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFinal {
    pub channel_binding: Vec<u8>,
    pub nonce: String,
    pub proof: Vec<u8>,
    /// `client-final-message-without-proof`, part of the AuthMessage.
    pub without_proof: String,
}

fn bad(why: &str) -> SecurityError {
    SecurityError::BadSaslMessage(why.to_string())
}

/// A `saslname`: `=2C` is `,` and `=3D` is `=`; any other `=` is malformed.
fn decode_saslname(text: &str) -> Result<String, SecurityError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let escape = rest
            .get(at..at + 3)
            .ok_or_else(|| bad("bad escape in name"))?;
        match escape {
            "=2C" => out.push(','),
            "=3D" => out.push('='),
            _ => return Err(bad("bad escape in name")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn printable_nonce(nonce: &str) -> Result<(), SecurityError> {
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(bad("bad nonce"));
    }
    Ok(())
}

/// Parses `client-first-message`.
pub fn parse_client_first(message: &[u8]) -> Result<ClientFirst, SecurityError> {
    if message.len() > MAX_MESSAGE_LEN {
        return Err(bad("message too long"));
    }
    let text = std::str::from_utf8(message).map_err(|_| bad("not UTF-8"))?;
    let mut parts = text.splitn(3, ',');
    let cbind = parts.next().ok_or_else(|| bad("empty message"))?;
    match cbind {
        "n" | "y" => {}
        _ if cbind.starts_with("p=") => return Err(bad("channel binding is not supported")),
        _ => return Err(bad("bad gs2 channel-binding flag")),
    }
    let authzid = parts.next().ok_or_else(|| bad("no gs2 header"))?;
    if !authzid.is_empty() && !authzid.starts_with("a=") {
        return Err(bad("bad authzid"));
    }
    let bare = parts
        .next()
        .ok_or_else(|| bad("no client-first-message-bare"))?;
    let gs2_header = format!("{cbind},{authzid},");
    let mut fields = bare.split(',');
    let name = fields.next().unwrap_or_default();
    if name.starts_with("m=") {
        return Err(bad("mandatory extensions are not supported"));
    }
    let user = decode_saslname(name.strip_prefix("n=").ok_or_else(|| bad("no user name"))?)?;
    if user.is_empty() {
        return Err(bad("empty user name"));
    }
    if let Some(authzid) = authzid.strip_prefix("a=") {
        if decode_saslname(authzid)? != user {
            return Err(bad("authorization id differs from the user name"));
        }
    }
    let nonce = fields
        .next()
        .and_then(|f| f.strip_prefix("r="))
        .ok_or_else(|| bad("no nonce"))?;
    printable_nonce(nonce)?;
    let mut token_auth = false;
    for extension in fields {
        let (key, value) = extension
            .split_once('=')
            .ok_or_else(|| bad("bad extension"))?;
        if key.is_empty() {
            return Err(bad("bad extension"));
        }
        if key == "tokenauth" && value.eq_ignore_ascii_case("true") {
            token_auth = true;
        }
    }
    Ok(ClientFirst {
        gs2_header,
        user,
        nonce: nonce.to_string(),
        bare: bare.to_string(),
        token_auth,
    })
}

/// Parses `client-final-message`.
pub fn parse_client_final(message: &[u8]) -> Result<ClientFinal, SecurityError> {
    if message.len() > MAX_MESSAGE_LEN {
        return Err(bad("message too long"));
    }
    let text = std::str::from_utf8(message).map_err(|_| bad("not UTF-8"))?;
    let (without_proof, proof) = text.rsplit_once(",p=").ok_or_else(|| bad("no proof"))?;
    let proof = B64.decode(proof).map_err(|_| bad("proof is not base64"))?;
    let mut fields = without_proof.split(',');
    let binding = fields
        .next()
        .and_then(|f| f.strip_prefix("c="))
        .ok_or_else(|| bad("no channel binding"))?;
    let channel_binding = B64
        .decode(binding)
        .map_err(|_| bad("channel binding is not base64"))?;
    let nonce = fields
        .next()
        .and_then(|f| f.strip_prefix("r="))
        .ok_or_else(|| bad("no nonce"))?;
    printable_nonce(nonce)?;
    for extension in fields {
        if !extension.contains('=') {
            return Err(bad("bad extension"));
        }
    }
    Ok(ClientFinal {
        channel_binding,
        nonce: nonce.to_string(),
        proof,
        without_proof: without_proof.to_string(),
    })
}

/// The server's side of one exchange, between its first and final messages.
#[derive(Debug)]
pub struct ServerExchange {
    credential: Credential,
    /// False for a user who does not exist: the exchange runs to the end with a fake
    /// credential and then fails like a wrong password.
    known: bool,
    first: ClientFirst,
    /// `server-first-message`, part of the AuthMessage.
    server_first: String,
    nonce: String,
}

impl ServerExchange {
    /// Starts an exchange for `first` with the user's credential (None: unknown user, answered
    /// with `fake`) and this broker's nonce part.
    pub fn start(
        first: ClientFirst,
        credential: Option<Credential>,
        fake: Credential,
        server_nonce: &str,
    ) -> Self {
        let known = credential.is_some();
        let credential = credential.unwrap_or(fake);
        let nonce = format!("{}{}", first.nonce, server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        Self {
            credential,
            known,
            first,
            server_first,
            nonce,
        }
    }

    pub fn user(&self) -> &str {
        &self.first.user
    }

    pub fn mechanism(&self) -> Mechanism {
        self.credential.mechanism
    }

    pub fn server_first(&self) -> &[u8] {
        self.server_first.as_bytes()
    }

    /// Checks the client's final message; on success returns `server-final-message`.
    pub fn finish(&self, message: &[u8]) -> Result<Vec<u8>, SecurityError> {
        let last = parse_client_final(message)?;
        if last.channel_binding != self.first.gs2_header.as_bytes() {
            return Err(bad("channel binding does not match the first message"));
        }
        if last.nonce != self.nonce {
            return Err(bad("nonce does not match"));
        }
        let mechanism = self.credential.mechanism;
        let auth_message = format!(
            "{},{},{}",
            self.first.bare, self.server_first, last.without_proof
        );
        let signature = mechanism.hmac(&self.credential.stored_key, auth_message.as_bytes());
        if last.proof.len() != signature.len() {
            return Err(SecurityError::BadCredentials);
        }
        let client_key: Vec<u8> = last
            .proof
            .iter()
            .zip(&signature)
            .map(|(p, s)| p ^ s)
            .collect();
        let matches = bool::from(
            mechanism
                .hash(&client_key)
                .ct_eq(&self.credential.stored_key),
        );
        if !(matches && self.known) {
            return Err(SecurityError::BadCredentials);
        }
        let server_signature = mechanism.hmac(&self.credential.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

#[cfg(test)]
mod tests;
