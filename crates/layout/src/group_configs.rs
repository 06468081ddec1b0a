//! Per-group configs (Kafka's GROUP config resource, KIP-848 and KIP-932: for example
//! `share.auto.offset.reset`): one object per group that has any, rewritten by compare-and-swap,
//! and a change marker brokers poll.
//!
//! ```text
//! configs/groups/<group id as hex>   one group's configs (CAS)
//! configs/groups-changes             rewritten after every change
//! ```
//!
//! A group whose last config was removed keeps an object with none, as quota entities do:
//! deleting the object could race with another broker setting a value and lose it.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::schema::{self, Schema};
use crate::LayoutResult;

/// Prefix of every group-config object.
pub const PREFIX: &str = "configs/groups/";

/// Rewritten (a counter, [`crate::cluster::ChangesMarker`]) after every change, so brokers
/// watch one small object instead of listing the prefix.
pub const CHANGES_KEY: &str = "configs/groups-changes";

/// One group's object: the group id (so a reader never parses the key back) and its configs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StoredGroupConfig {
    pub group: String,
    /// Config name (Kafka's, e.g. `share.auto.offset.reset`) → value.
    pub values: BTreeMap<String, String>,
}

impl Schema for StoredGroupConfig {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "group config";
}

impl StoredGroupConfig {
    pub fn encode(&self) -> LayoutResult<Bytes> {
        schema::encode(self)
    }

    /// Decodes the object read from `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> LayoutResult<Self> {
        schema::decode(key, bytes)
    }
}

/// `configs/groups/<group as hex>`: hex keeps any group id a valid key segment.
pub fn key(group_id: &str) -> String {
    let mut key = String::with_capacity(PREFIX.len() + group_id.len() * 2 + 1);
    key.push_str(PREFIX);
    for byte in group_id.as_bytes() {
        key.push_str(&format!("{byte:02x}"));
    }
    if group_id.is_empty() {
        // No group has an empty id, but a key must be well formed for any input.
        key.push('-');
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_group_in_hex_and_objects_round_trip() {
        assert_eq!(key("g/1"), "configs/groups/672f31");
        assert_eq!(key(""), "configs/groups/-");
        let stored = StoredGroupConfig {
            group: "g/1".into(),
            values: BTreeMap::from([("share.auto.offset.reset".into(), "earliest".into())]),
        };
        let bytes = stored.encode().unwrap();
        assert_eq!(
            StoredGroupConfig::decode(&key("g/1"), &bytes).unwrap(),
            stored
        );
    }
}
