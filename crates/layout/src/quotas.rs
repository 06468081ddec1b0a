//! Client quotas (Kafka's KIP-55/KIP-546 entity model): one object per quota entity, holding
//! its quota values, rewritten by compare-and-swap; and a change marker brokers poll.
//!
//! ```text
//! security/quotas/<hex of the entity>    one entity's quota values (CAS)
//! security/quotas-changes                rewritten after every quota change
//! ```
//!
//! The entity is hex-encoded in the key because its names (user names, client ids) may hold
//! any character. The object names its entity itself, so a reader never parses the key back.
//! An entity whose last value was removed keeps an object with none (a tombstone): deleting
//! the object could race with another broker adding a value and lose it.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::schema::{self, Schema};
use crate::LayoutResult;

/// Prefix of every quota entity object.
pub const PREFIX: &str = "security/quotas/";

/// Rewritten (a counter, [`crate::cluster::ChangesMarker`]) after every change of a quota
/// object, so brokers watch one small object instead of listing the prefix.
pub const CHANGES_KEY: &str = "security/quotas-changes";

/// One part of an entity: its type (`user`, `client-id`) and its name; None is the type's
/// default (`<default>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StoredEntityPart {
    pub entity_type: String,
    pub name: Option<String>,
}

/// One entity's object.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StoredQuota {
    /// The entity's parts, sorted by type.
    pub entity: Vec<StoredEntityPart>,
    /// Quota key (`producer_byte_rate`, …) → value.
    pub values: BTreeMap<String, f64>,
}

impl Schema for StoredQuota {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "client quota";
}

impl StoredQuota {
    pub fn encode(&self) -> LayoutResult<Bytes> {
        schema::encode(self)
    }

    /// Decodes the object read from `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> LayoutResult<Self> {
        schema::decode(key, bytes)
    }
}

/// The key of the entity made of `parts` (sorted by type by the caller). A default name and a
/// name are told apart by a flag byte, so the user named `<default>` is not the default user.
pub fn key(parts: &[StoredEntityPart]) -> String {
    let mut raw = Vec::new();
    for part in parts {
        raw.extend_from_slice(part.entity_type.as_bytes());
        raw.push(0);
        match &part.name {
            None => raw.push(0),
            Some(name) => {
                raw.push(1);
                raw.extend_from_slice(name.as_bytes());
            }
        }
        raw.push(0);
    }
    let mut key = String::with_capacity(PREFIX.len() + raw.len() * 2);
    key.push_str(PREFIX);
    for byte in raw {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(entity_type: &str, name: Option<&str>) -> StoredEntityPart {
        StoredEntityPart {
            entity_type: entity_type.into(),
            name: name.map(str::to_string),
        }
    }

    #[test]
    fn keys_tell_defaults_names_and_combinations_apart() {
        let keys = [
            key(&[part("user", None)]),
            key(&[part("user", Some("<default>"))]),
            key(&[part("user", Some(""))]),
            key(&[part("client-id", None)]),
            key(&[part("client-id", None), part("user", None)]),
            key(&[part("client-id", Some("a/b")), part("user", Some("x"))]),
        ];
        for (i, a) in keys.iter().enumerate() {
            assert!(a.starts_with(PREFIX));
            assert!(!a[PREFIX.len()..].contains('/'));
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert!(!CHANGES_KEY.starts_with(PREFIX));
    }

    #[test]
    fn a_literal_quota_object_decodes_and_a_newer_schema_is_refused() {
        let literal = br#"{"schema":1,"entity":[{"entity_type":"client-id","name":null},
            {"entity_type":"user","name":"alice"}],"values":{"producer_byte_rate":1048576.0}}"#;
        let decoded = StoredQuota::decode("k", literal).unwrap();
        assert_eq!(
            decoded.entity,
            [part("client-id", None), part("user", Some("alice"))]
        );
        assert_eq!(decoded.values["producer_byte_rate"], 1_048_576.0);
        assert_eq!(
            StoredQuota::decode("k", &decoded.encode().unwrap()).unwrap(),
            decoded
        );
        assert!(StoredQuota::decode("k", br#"{"schema":2,"entity":[],"values":{}}"#).is_err());
    }
}
