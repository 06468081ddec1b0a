//! SCRAM users: one object per user, holding each mechanism's salted credential (never the
//! password), rewritten by compare-and-swap so two brokers altering the same user at once do
//! not lose either change.
//!
//! ```text
//! security/users/<hex of the user name>    the user's SCRAM credentials (CAS)
//! security/salt-key                        the key of unknown users' fake salts
//! ```
//!
//! The name is hex-encoded in the key because Kafka user names may hold any character,
//! including `/`, which the storage would read as a directory. A user whose last credential
//! was deleted keeps an object with none (a tombstone): deleting the object outright could
//! race with another broker adding a credential and lose it.

use serde::{Deserialize, Serialize};

use bytes::Bytes;

use crate::schema::{self, Schema};
use crate::LayoutResult;

/// Prefix of every user object.
pub const PREFIX: &str = "security/users/";

/// 32 random bytes, the key of the fake salts given to users who do not exist (so a client
/// cannot tell them from real ones by their salt); written once, create-only.
pub const SECRET_KEY: &str = "security/salt-key";

/// The key of `user`'s object.
pub fn key(user: &str) -> String {
    let mut key = String::with_capacity(PREFIX.len() + user.len() * 2);
    key.push_str(PREFIX);
    for byte in user.as_bytes() {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

/// The user name a listed key names; None for a key that is not a user object.
pub fn parse_key(key: &str) -> Option<String> {
    let hex = key.strip_prefix(PREFIX)?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// One mechanism's credential, as RFC 5802 keeps it on the server. Binary fields are base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCredential {
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    pub salt: String,
    pub iterations: u32,
    pub stored_key: String,
    pub server_key: String,
}

/// A user's object.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StoredUser {
    pub credentials: Vec<StoredCredential>,
}

impl Schema for StoredUser {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "user";
}

impl StoredUser {
    pub fn encode(&self) -> LayoutResult<Bytes> {
        schema::encode(self)
    }

    /// Decodes the object read from `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> LayoutResult<Self> {
        schema::decode(key, bytes)
    }

    /// The credential of `mechanism`, if the user has one.
    pub fn credential(&self, mechanism: &str) -> Option<&StoredCredential> {
        self.credentials.iter().find(|c| c.mechanism == mechanism)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_name_round_trips_through_its_key() {
        for name in ["alice", "a/b", "ünï", "", "x y%z"] {
            let key = key(name);
            assert!(key.starts_with(PREFIX));
            assert!(!key[PREFIX.len()..].contains('/'));
            assert_eq!(parse_key(&key).as_deref(), Some(name));
        }
        assert_eq!(parse_key("security/users/6"), None);
        assert_eq!(parse_key("security/users/zz"), None);
        assert_eq!(parse_key("meta/catalog/1"), None);
    }

    #[test]
    fn a_user_object_round_trips_and_a_newer_schema_is_refused() {
        let user = StoredUser {
            credentials: vec![StoredCredential {
                mechanism: "SCRAM-SHA-512".into(),
                salt: "c2FsdA==".into(),
                iterations: 4096,
                stored_key: "AA==".into(),
                server_key: "AQ==".into(),
            }],
        };
        let decoded = StoredUser::decode("k", &user.encode().unwrap()).unwrap();
        assert_eq!(decoded.credentials, user.credentials);
        assert!(StoredUser::decode("k", br#"{"schema": 99, "credentials": []}"#).is_err());
    }
}
