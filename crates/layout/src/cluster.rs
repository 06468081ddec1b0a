//! The coordination objects under `cluster/` (their protocol is `strata-cluster`'s).
//!
//! Resources (what is owned and placed) are opaque names to the cluster; a partition's is
//! `<topic-id>/<partition>` ([`partition_resource`]), ids rather than names so a topic deleted
//! and re-created under the same name never inherits the old one's records.

use std::fmt;

use serde::{Deserialize, Serialize};
use strata_core::BrokerId;

use crate::schema::Schema;
use crate::TopicId;

pub const BROKERS_PREFIX: &str = "cluster/brokers/";
pub const OWNERS_PREFIX: &str = "cluster/owners/";
pub const PLACEMENT_PREFIX: &str = "cluster/placement/";
/// Outside `PLACEMENT_PREFIX` (`-`, not `/`), so listing the overrides never returns it.
pub const PLACEMENT_CHANGES_KEY: &str = "cluster/placement-changes";
/// Outside `OWNERS_PREFIX` (`-`, not `/`), so listing the records never returns it.
pub const OWNERS_CHANGES_KEY: &str = "cluster/owners-changes";
pub const DRAIN_PREFIX: &str = "cluster/drain/";

/// `cluster/brokers/<node id>`: a broker's registration.
pub fn broker_key(broker: BrokerId) -> String {
    format!("{BROKERS_PREFIX}{}", broker.0)
}

/// The node id of a listed registration key.
pub fn parse_broker_key(key: &str) -> Option<BrokerId> {
    key.strip_prefix(BROKERS_PREFIX)?.parse().ok().map(BrokerId)
}

/// `cluster/owners/<resource>`. The resource must itself be a valid key suffix; the caller
/// checks that when it makes the key an `ObjectKey`.
pub fn owner_key(resource: &str) -> String {
    format!("{OWNERS_PREFIX}{resource}")
}

/// The resource of a listed owner-record key.
pub fn parse_owner_key(key: &str) -> Option<&str> {
    key.strip_prefix(OWNERS_PREFIX)
}

/// `cluster/placement/<resource>`.
pub fn placement_key(resource: &str) -> String {
    format!("{PLACEMENT_PREFIX}{resource}")
}

/// The resource of a listed placement key.
pub fn parse_placement_key(key: &str) -> Option<&str> {
    key.strip_prefix(PLACEMENT_PREFIX)
}

/// `cluster/drain/<node id>`: an operator's request that this broker drain.
pub fn drain_key(broker: BrokerId) -> String {
    format!("{DRAIN_PREFIX}{}", broker.0)
}

/// The resource name of a partition.
pub fn partition_resource(topic: TopicId, partition: i32) -> String {
    format!("{topic}/{partition}")
}

/// The topic id and partition of a resource name; None for anything else.
pub fn parse_partition_resource(resource: &str) -> Option<(TopicId, i32)> {
    let (id, partition) = resource.split_once('/')?;
    let partition: i32 = partition.parse().ok()?;
    (partition >= 0).then_some((TopicId::parse_hex(id)?, partition))
}

/// A random id drawn at every process start, so a restarted broker with the same node id is
/// told apart from its previous life (whose partitions must be fenced, not inherited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation(pub u64);

impl Incarnation {
    /// Draws a new incarnation from `rng` (injected, so simulations replay by seed).
    pub fn random(rng: &mut impl rand::Rng) -> Self {
        Self(rng.random())
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

// A hex string rather than a JSON number: 64-bit numbers lose precision in many JSON tools.
impl Serialize for Incarnation {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Incarnation {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        u64::from_str_radix(&text, 16)
            .map(Incarnation)
            .map_err(serde::de::Error::custom)
    }
}

/// The content of `cluster/placement/<resource>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementOverride {
    pub broker: BrokerId,
}

impl Schema for PlacementOverride {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "placement override";
}

/// The content of the changes markers (`cluster/placement-changes`, `cluster/owners-changes`).
/// Only that it changes matters; a counter (not a constant) so that even a backend whose
/// version is a hash of the bytes sees a new version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesMarker {
    pub changes: u64,
}

impl Schema for ChangesMarker {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "changes marker";
}

/// The content of `cluster/drain/<node id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRequest {
    /// The incarnation the operator asked to drain (a restarted broker ignores the request).
    pub incarnation: Incarnation,
}

impl Schema for DrainRequest {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "drain request";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{decode, encode};

    #[test]
    fn keys_round_trip() {
        assert_eq!(broker_key(BrokerId(7)), "cluster/brokers/7");
        assert_eq!(parse_broker_key("cluster/brokers/-3"), Some(BrokerId(-3)));
        assert_eq!(owner_key("abc/3"), "cluster/owners/abc/3");
        assert_eq!(parse_owner_key("cluster/owners/abc/3"), Some("abc/3"));
        assert_eq!(parse_placement_key(&placement_key("abc/3")), Some("abc/3"));
        assert_eq!(drain_key(BrokerId(4)), "cluster/drain/4");
        assert!(!PLACEMENT_CHANGES_KEY.starts_with(PLACEMENT_PREFIX));
        assert!(!OWNERS_CHANGES_KEY.starts_with(OWNERS_PREFIX));
        let t = TopicId([0x0f; 16]);
        assert_eq!(
            parse_partition_resource(&partition_resource(t, 5)),
            Some((t, 5))
        );
        assert_eq!(parse_partition_resource("abc/1"), None);
        assert_eq!(parse_partition_resource(&format!("{t}/-1")), None);
    }

    #[test]
    fn objects_of_the_old_format_still_read() {
        // As strata-cluster and the broker's admin code wrote them before this crate existed.
        assert_eq!(
            decode::<PlacementOverride>("k", br#"{"broker":4}"#).unwrap(),
            PlacementOverride {
                broker: BrokerId(4)
            }
        );
        assert_eq!(
            decode::<ChangesMarker>("k", br#"{"changes":12}"#).unwrap(),
            ChangesMarker { changes: 12 }
        );
        assert_eq!(
            decode::<DrainRequest>("k", br#"{"incarnation":"00000000000000ff"}"#).unwrap(),
            DrainRequest {
                incarnation: Incarnation(0xff)
            }
        );
        let request = DrainRequest {
            incarnation: Incarnation(u64::MAX),
        };
        assert_eq!(
            decode::<DrainRequest>("k", &encode(&request).unwrap()).unwrap(),
            request
        );
    }
}
