//! ACL bindings: one object per resource pattern, holding every binding on it, rewritten by
//! compare-and-swap so two brokers adding bindings to one resource at once lose neither; and
//! one change marker that every broker polls, so a change made through any broker is
//! enforced by all of them within a poll interval.
//!
//! ```text
//! security/acls/<resource type>/<pattern type>/<hex of name>   the resource's bindings (CAS)
//! security/acls-changes                                        bumped after every change (CAS)
//! ```
//!
//! Resource and pattern types are Kafka's names in lower case (`topic`, `group`, `cluster`,
//! `transactional_id`, `delegation_token`; `literal`, `prefixed`). The name is hex-encoded
//! because resource names may hold `/`. A resource whose last binding was deleted keeps an
//! object with none: deleting it could race with another broker adding one and lose it.
//! Operations and permissions are stored by Kafka name (`READ`, `ALLOW`), so the object reads
//! the same as Kafka's own ACL tools print it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::cluster::ChangesMarker;
use crate::schema::{self, Schema};
use crate::LayoutResult;

/// Prefix of every ACL object.
pub const PREFIX: &str = "security/acls/";

/// The marker bumped after every ACL change (not under [`PREFIX`], so listing the ACLs never
/// returns it). Its content is a [`ChangesMarker`].
pub const CHANGES_KEY: &str = "security/acls-changes";

/// The content of [`CHANGES_KEY`].
pub type AclChanges = ChangesMarker;

fn hex(name: &str) -> String {
    let mut out = String::with_capacity(name.len() * 2);
    for byte in name.as_bytes() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn unhex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn is_segment(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// The key of the bindings on (`resource_type`, `pattern_type`, `name`); the two types are
/// lower-case words (see the module's documentation).
pub fn key(resource_type: &str, pattern_type: &str, name: &str) -> String {
    format!("{PREFIX}{resource_type}/{pattern_type}/{}", hex(name))
}

/// (resource type, pattern type, name) of a listed key; None for a key that is not an ACL
/// object.
pub fn parse_key(key: &str) -> Option<(String, String, String)> {
    let rest = key.strip_prefix(PREFIX)?;
    let mut parts = rest.splitn(3, '/');
    let resource_type = parts.next()?;
    let pattern_type = parts.next()?;
    let name = unhex(parts.next()?)?;
    if !is_segment(resource_type) || !is_segment(pattern_type) {
        return None;
    }
    Some((resource_type.to_string(), pattern_type.to_string(), name))
}

/// One binding on a resource: who, from where, may (or may not) do what.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StoredBinding {
    /// `User:alice`, `User:*`.
    pub principal: String,
    /// `*` or an IP address.
    pub host: String,
    /// Kafka's operation name: `READ`, `WRITE`, `ALL`, …
    pub operation: String,
    /// `ALLOW` or `DENY`.
    pub permission: String,
}

/// A resource's object.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StoredAcls {
    pub bindings: Vec<StoredBinding>,
}

impl Schema for StoredAcls {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "acls";
}

impl StoredAcls {
    pub fn encode(&self) -> LayoutResult<Bytes> {
        schema::encode(self)
    }

    /// Decodes the object read from `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> LayoutResult<Self> {
        schema::decode(key, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_name_round_trips_through_its_key() {
        for name in ["orders", "a/b", "ünï", "", "*", "app-"] {
            let key = key("topic", "prefixed", name);
            assert!(key.starts_with("security/acls/topic/prefixed/"));
            assert_eq!(
                parse_key(&key),
                Some(("topic".into(), "prefixed".into(), name.to_string()))
            );
        }
        assert_eq!(parse_key("security/acls/topic/literal/6"), None);
        assert_eq!(parse_key("security/acls/topic/literal"), None);
        assert_eq!(parse_key("security/acls/Topic/literal/61"), None);
        assert_eq!(parse_key(CHANGES_KEY), None);
        assert!(!CHANGES_KEY.starts_with(PREFIX));
    }

    #[test]
    fn a_literal_schema_1_object_decodes() {
        let literal = br#"{"schema":1,"bindings":[
            {"principal":"User:alice","host":"*","operation":"WRITE","permission":"ALLOW"},
            {"principal":"User:*","host":"10.0.0.1","operation":"ALL","permission":"DENY"}]}"#;
        let decoded = StoredAcls::decode("k", literal).unwrap();
        assert_eq!(decoded.bindings.len(), 2);
        assert_eq!(decoded.bindings[0].principal, "User:alice");
        assert_eq!(decoded.bindings[1].host, "10.0.0.1");
        assert_eq!(decoded.bindings[1].permission, "DENY");
        let again = StoredAcls::decode("k", &decoded.encode().unwrap()).unwrap();
        assert_eq!(again, decoded);
        assert!(StoredAcls::decode("k", br#"{"schema": 2, "bindings": []}"#).is_err());
    }
}
