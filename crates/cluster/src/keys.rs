//! The coordination objects' keys as `ObjectKey`s. The layout itself (prefixes, spellings,
//! parsers) is `strata_layout::cluster`'s and `strata_layout::wal`'s; this only checks that a
//! resource name makes a valid key before any request is sent.

use strata_core::BrokerId;
use strata_layout::cluster as layout;
use strata_storage::ObjectKey;

use crate::{ClusterError, ClusterResult};

pub use strata_layout::cluster::{
    parse_broker_key, BROKERS_PREFIX, DRAIN_PREFIX, OWNERS_CHANGES_KEY, OWNERS_PREFIX,
    PLACEMENT_CHANGES_KEY, PLACEMENT_PREFIX,
};
pub use strata_layout::streams::PREFIX as STREAMS_PREFIX;
pub use strata_layout::wal::{
    parse_seq as parse_wal_seq, stream_prefix as wal_stream_prefix, PREFIX as WAL_PREFIX,
};

pub fn broker_key(broker: BrokerId) -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(layout::broker_key(broker))?)
}

pub fn drain_key(broker: BrokerId) -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(layout::drain_key(broker))?)
}

/// A resource name must itself be a valid key suffix: `/`-separated, no empty segment, the
/// characters keys allow. Checked here so a bad name fails before any request is sent.
fn resource_key(key: String, resource: &str) -> ClusterResult<ObjectKey> {
    ObjectKey::new(key).map_err(|_| {
        ClusterError::Invalid(format!("resource name {resource:?} is not a valid key"))
    })
}

pub fn owner_key(resource: &str) -> ClusterResult<ObjectKey> {
    resource_key(layout::owner_key(resource), resource)
}

pub fn placement_key(resource: &str) -> ClusterResult<ObjectKey> {
    resource_key(layout::placement_key(resource), resource)
}

pub fn placement_changes_key() -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(PLACEMENT_CHANGES_KEY)?)
}

pub fn owners_changes_key() -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(OWNERS_CHANGES_KEY)?)
}

pub fn wal_key(stream: u32, seq: u64) -> ClusterResult<ObjectKey> {
    Ok(ObjectKey::new(strata_layout::wal::key(stream, seq))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_resource_name_is_refused_before_any_request() {
        assert_eq!(owner_key("abc/3").unwrap().as_str(), "cluster/owners/abc/3");
        assert!(matches!(owner_key("a//b"), Err(ClusterError::Invalid(_))));
        assert!(matches!(
            placement_key("a/../b"),
            Err(ClusterError::Invalid(_))
        ));
    }
}
