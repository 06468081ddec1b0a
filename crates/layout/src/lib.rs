//! The storage layout: every object key and every stored schema the brokers write, defined
//! once. Other crates build keys, parse listed keys and encode or decode stored objects only
//! through this crate, so a change of layout is a change here and nowhere else.
//!
//! ```text
//! meta/catalog/<version:020>             topic catalog; version N+1 is written create-only
//! meta/streams/<stream:08x>              one per broker incarnation (write-ahead stream id)
//! meta/producer-ids/<block:020>          claimed blocks of idempotent producer ids (empty)
//! wal/<stream:08x>/<seq:020>             a group-commit object, or a seal / hole marker
//! log/<topic-id>/<p>/manifest            a partition's manifest (CAS)
//! log/<topic-id>/<p>/index/<chunk:020>   an index chunk
//! log/<topic-id>/<p>/seg/<base:020>-<stream:08x>   a compacted segment
//! cluster/brokers/<node id>              registration + heartbeat of one broker (CAS)
//! cluster/owners/<resource>              owner record of one resource (CAS)
//! cluster/placement/<resource>           an operator's explicit placement
//! cluster/placement-changes              rewritten after every placement override change
//! cluster/owners-changes                 rewritten after every owner record change (RADOS)
//! cluster/drain/<node id>                an operator's request that a broker drain
//! security/users/<hex of name>           a SCRAM user's salted credentials (CAS)
//! security/salt-key                      the key of unknown users' fake SCRAM salts
//! security/acls/<type>/<pattern>/<hex>   one resource's ACL bindings (CAS)
//! security/acls-changes                  bumped after every ACL change; brokers poll it
//! security/quotas/<hex of entity>        one client-quota entity's values (CAS)
//! security/quotas-changes                rewritten after every quota change
//! ```
//!
//! Stored JSON schemas carry a `schema` number ([`schema`]). Objects written before it existed
//! have none and read as schema 1, which is what they are; an object of a newer schema than
//! this build knows is refused ([`LayoutError::UnsupportedSchema`]) rather than half-read.
//!
//! What stays with its only user: the binary codecs of write-ahead objects and index chunks,
//! and the JSON of partition manifests (the log's offsets, index references and producer
//! state), the consumer-group records (records of `__consumer_offsets`, not objects), and the
//! cluster's own registration and owner-record schemas (read and written only by
//! `strata-cluster`, which versions them with [`schema`]).
//!
//! This crate knows only [`strata_core`] and [`strata_storage`].

pub mod acls;
pub mod cas;
pub mod catalog;
pub mod cluster;
mod error;
pub mod group_configs;
pub mod ids;
pub mod partition;
pub mod producer_ids;
pub mod quotas;
pub mod schema;
pub mod share;
pub mod streams;
pub mod tier;
pub mod users;
pub mod wal;

pub use catalog::{Catalog, CatalogReader, CatalogTopic, TopicSummary};

/// The part of the layout `key` (or a listed prefix) belongs to, named after what polls or
/// writes it: the storage metrics count requests by it (`StorageMetrics::set_key_areas`), which
/// is how an operator tells the pollers of an idle broker apart. A fixed set of names, so it
/// can label a metric.
pub fn key_area(key: &str) -> &'static str {
    use cluster::{
        BROKERS_PREFIX, DRAIN_PREFIX, OWNERS_CHANGES_KEY, OWNERS_PREFIX, PLACEMENT_CHANGES_KEY,
        PLACEMENT_PREFIX,
    };
    let areas: [(&str, &'static str); 19] = [
        (acls::PREFIX, "acls"),
        (acls::CHANGES_KEY, "acls"),
        (BROKERS_PREFIX, "membership"),
        (OWNERS_PREFIX, "ownership"),
        (OWNERS_CHANGES_KEY, "ownership"),
        (PLACEMENT_PREFIX, "placement"),
        (PLACEMENT_CHANGES_KEY, "placement_changes"),
        (DRAIN_PREFIX, "drain"),
        (catalog::PREFIX, "catalog"),
        (streams::PREFIX, "streams"),
        (producer_ids::PREFIX, "producer_ids"),
        (wal::PREFIX, "wal"),
        (partition::PREFIX, "partition"),
        ("cluster/", "cluster"),
        (quotas::PREFIX, "quotas"),
        (quotas::CHANGES_KEY, "quotas"),
        (share::PREFIX, "share"),
        (group_configs::PREFIX, "group_configs"),
        (group_configs::CHANGES_KEY, "group_configs"),
    ];
    areas
        .iter()
        .find(|(prefix, _)| key.starts_with(prefix))
        .map_or("other", |(_, area)| area)
}
pub use error::{LayoutError, LayoutResult};
pub use ids::TopicId;

#[cfg(test)]
mod key_area_tests {
    use super::key_area;

    #[test]
    fn every_kind_of_key_has_its_area() {
        for (key, area) in [
            ("cluster/brokers/3", "membership"),
            ("cluster/owners/0000abcd/1", "ownership"),
            ("cluster/owners-changes", "ownership"),
            ("cluster/placement/0000abcd/1", "placement"),
            ("cluster/placement-changes", "placement_changes"),
            ("cluster/drain/3", "drain"),
            ("meta/catalog/00000000000000000001", "catalog"),
            ("meta/streams/0000abcd", "streams"),
            ("meta/producer-ids/00000000000000000001", "producer_ids"),
            ("wal/0000abcd/00000000000000000001", "wal"),
            ("log/0000abcd/1/manifest", "partition"),
            ("cluster/", "cluster"),
            ("security/acls/topic/literal/61", "acls"),
            ("security/acls-changes", "acls"),
            ("security/quotas/7573657200", "quotas"),
            ("security/quotas-changes", "quotas"),
            ("configs/groups/67", "group_configs"),
            ("configs/groups-changes", "group_configs"),
            ("elsewhere", "other"),
        ] {
            assert_eq!(key_area(key), area, "{key}");
        }
    }
}
