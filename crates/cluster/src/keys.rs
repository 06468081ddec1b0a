//! Where the coordination objects live. One place, so the layout in `docs/` has one source.
//!
//! ```text
//! cluster/brokers/<node id>          registration + heartbeat of one broker (CAS)
//! cluster/owners/<resource>          owner, incarnation, epoch, state of one resource (CAS)
//! cluster/placement/<resource>       an operator's explicit placement (move / reassignment)
//! cluster/placement-changes          rewritten after every override change (brokers poll it)
//! cluster/owners-changes             rewritten after every owner record change, on stores
//!                                    whose listings carry no change tags (RADOS)
//! wal/<stream:08x>/<seq:020>         the log's group-commit objects; we only add seals
//! meta/streams/<stream:08x>          the log's stream registrations; we only read them
//! ```

use strata_core::BrokerId;
use strata_storage::ObjectKey;

use crate::{ClusterError, ClusterResult};

pub const BROKERS_PREFIX: &str = "cluster/brokers/";
pub const OWNERS_PREFIX: &str = "cluster/owners/";
pub const PLACEMENT_PREFIX: &str = "cluster/placement/";
/// Outside `PLACEMENT_PREFIX` (`-`, not `/`), so listing the overrides never returns it.
pub const PLACEMENT_CHANGES_KEY: &str = "cluster/placement-changes";
/// Outside `OWNERS_PREFIX` (`-`, not `/`), so listing the records never returns it.
pub const OWNERS_CHANGES_KEY: &str = "cluster/owners-changes";
pub const WAL_PREFIX: &str = "wal/";
pub const STREAMS_PREFIX: &str = "meta/streams/";

pub fn broker_key(broker: BrokerId) -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(format!("{BROKERS_PREFIX}{}", broker.0))?)
}

/// Parses the node id back out of a listed registration key.
pub fn parse_broker_key(key: &str) -> Option<BrokerId> {
    key.strip_prefix(BROKERS_PREFIX)?.parse().ok().map(BrokerId)
}

/// A resource name must itself be a valid key suffix: `/`-separated, no empty segment, the
/// characters keys allow. Checked here so a bad name fails before any request is sent.
fn resource_key(prefix: &str, resource: &str) -> ClusterResult<ObjectKey> {
    ObjectKey::new(format!("{prefix}{resource}")).map_err(|_| {
        ClusterError::Invalid(format!("resource name {resource:?} is not a valid key"))
    })
}

pub fn owner_key(resource: &str) -> ClusterResult<ObjectKey> {
    resource_key(OWNERS_PREFIX, resource)
}

pub fn placement_key(resource: &str) -> ClusterResult<ObjectKey> {
    resource_key(PLACEMENT_PREFIX, resource)
}

pub fn placement_changes_key() -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(PLACEMENT_CHANGES_KEY)?)
}

pub fn owners_changes_key() -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(OWNERS_CHANGES_KEY)?)
}

pub fn wal_stream_prefix(stream: u32) -> String {
    format!("{WAL_PREFIX}{stream:08x}/")
}

pub fn wal_key(stream: u32, seq: u64) -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(format!(
        "{WAL_PREFIX}{stream:08x}/{seq:020}"
    ))?)
}

/// The sequence number of a listed key of `stream`'s write-ahead objects.
pub fn parse_wal_seq(stream: u32, key: &str) -> Option<u64> {
    key.strip_prefix(&wal_stream_prefix(stream))?.parse().ok()
}

pub fn parse_stream_key(key: &str) -> Option<u32> {
    u32::from_str_radix(key.strip_prefix(STREAMS_PREFIX)?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_match_the_logs_layout() {
        let key = broker_key(BrokerId(7)).unwrap();
        assert_eq!(parse_broker_key(key.as_str()), Some(BrokerId(7)));
        assert_eq!(parse_broker_key("cluster/brokers/-3"), Some(BrokerId(-3)));
        assert_eq!(
            wal_key(0x2a, 5).unwrap().as_str(),
            "wal/0000002a/00000000000000000005"
        );
        assert_eq!(
            parse_wal_seq(0x2a, "wal/0000002a/00000000000000000005"),
            Some(5)
        );
        assert_eq!(
            parse_wal_seq(0x2b, "wal/0000002a/00000000000000000005"),
            None
        );
        assert_eq!(parse_stream_key("meta/streams/0000002a"), Some(0x2a));
        assert_eq!(owner_key("abc/3").unwrap().as_str(), "cluster/owners/abc/3");
        assert!(matches!(owner_key("a//b"), Err(ClusterError::Invalid(_))));
        assert!(!placement_changes_key()
            .unwrap()
            .as_str()
            .starts_with(PLACEMENT_PREFIX));
    }
}
