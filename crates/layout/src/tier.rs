//! Which storage tier each kind of object lives in, when a broker runs with a separate
//! write-ahead tier (`wal_storage`): a partition's compacted data — segments and the index
//! chunks that point into them — goes to the bulk tier, everything else to the write-ahead
//! tier, including the segments a topic's `local.retention.*` keeps on the fast tier for a
//! while (`hot/`).
//!
//! Why: write-ahead objects and seals are what acknowledgements and fencing wait for; the
//! catalog, streams, producer ids, cluster, security and share objects are small and polled;
//! manifests are read at every takeover and rewritten at every compaction. Those stay on the
//! fast tier. Segments are large, written once, read rarely. Index chunks go with them, so a
//! fetch of compacted data touches the bulk tier alone (a served partition's manifest is in
//! memory) and keeps working while the write-ahead tier is down; they are written only by
//! compaction and the cleaner, which write segments to the bulk tier anyway, so nothing an
//! acknowledgement waits for goes there. Both tiers keep their own conditional writes: a
//! chunk's claim-stamped compare-and-swap works on any backend, so fencing is unchanged.

use strata_storage::{PrefixTiers, Tier, TierRouting};

use crate::partition;

/// The routing [`strata_storage::TieredStore`] needs.
pub const ROUTING: TierRouting = TierRouting {
    key: tier_of_key,
    prefix: tiers_of_prefix,
};

/// The directories of a partition whose objects live on the bulk tier.
const BULK_KINDS: [&str; 2] = ["seg", "index"];

/// The tier of one key: the bulk tier for segments (compacted and cleaned) and index chunks, the
/// write-ahead tier for the rest.
pub fn tier_of_key(key: &str) -> Tier {
    match key.strip_prefix(partition::PREFIX) {
        Some(rest) if is_bulk_path(rest) => Tier::Bulk,
        _ => Tier::Wal,
    }
}

/// `<topic-id>/<p>/seg/<name>` or `<topic-id>/<p>/index/<chunk>`: exactly the keys
/// `partition::segment_key`, `partition::cleaned_segment_key` and `partition::chunk_key` build.
fn is_bulk_path(rest: &str) -> bool {
    let mut parts = rest.split('/');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some(_), Some(_), Some(kind), Some(_), None) => BULK_KINDS.contains(&kind),
        _ => false,
    }
}

/// The tiers a listing of `prefix` must ask: both for a prefix under which both segments and
/// other objects can live (`log/`, a topic, a partition), one otherwise.
pub fn tiers_of_prefix(prefix: &str) -> PrefixTiers {
    let Some(rest) = prefix.strip_prefix(partition::PREFIX) else {
        // "", "l", "lo", "log": a prefix of `log/` can still reach segments.
        return if partition::PREFIX.starts_with(prefix) {
            PrefixTiers::Both
        } else {
            PrefixTiers::Only(Tier::Wal)
        };
    };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        // `<t>` or `<t>/` or `<t>/<p>`: segments below.
        [_] | [_, _] => PrefixTiers::Both,
        // `<t>/<p>/<kind…>`: under `seg/` and `index/` only the bulk tier; the partition's
        // directory or a part of a bulk kind's name (`s`, `ind`) both.
        [_, _, kind] if BULK_KINDS.iter().any(|k| k.starts_with(kind)) => PrefixTiers::Both,
        [_, _, kind, ..] if BULK_KINDS.contains(kind) => PrefixTiers::Only(Tier::Bulk),
        _ => PrefixTiers::Only(Tier::Wal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TopicId;

    #[test]
    fn segments_and_index_chunks_alone_go_to_the_bulk_tier() {
        let t = TopicId([0xab; 16]);
        assert_eq!(
            tier_of_key(&partition::segment_key(t, 3, 100, 7)),
            Tier::Bulk
        );
        assert_eq!(
            tier_of_key(&partition::cleaned_segment_key(t, 3, 100, 7, 2, 1)),
            Tier::Bulk
        );
        assert_eq!(tier_of_key(&partition::chunk_key(t, 3, 0)), Tier::Bulk);
        for key in [
            partition::manifest_key(t, 3),
            crate::wal::key(7, 1),
            "meta/catalog/00000000000000000001".to_string(),
            "cluster/brokers/3".to_string(),
            "security/users/61".to_string(),
            // Segments a topic's `local.retention.*` keeps on the fast tier.
            partition::fast_segment_key(t, 3, 100, 7, 2, 1),
            // A topic or partition literally named like the segment directory is not a segment.
            "log/seg/x".to_string(),
        ] {
            assert_eq!(tier_of_key(&key), Tier::Wal, "{key}");
        }
    }

    #[test]
    fn listings_ask_every_tier_that_can_hold_a_key_under_the_prefix() {
        let t = TopicId([0xab; 16]);
        let both = PrefixTiers::Both;
        let wal = PrefixTiers::Only(Tier::Wal);
        let bulk = PrefixTiers::Only(Tier::Bulk);
        for (prefix, tiers) in [
            ("".to_string(), both),
            ("lo".to_string(), both),
            ("log/".to_string(), both),
            (partition::topic_prefix(t), both),
            (format!("{}3/", partition::topic_prefix(t)), both),
            (format!("{}3/s", partition::topic_prefix(t)), both),
            (partition::segment_prefix(t, 3), bulk),
            (format!("{}0000", partition::segment_prefix(t, 3)), bulk),
            (format!("{}3/index/", partition::topic_prefix(t)), bulk),
            (format!("{}3/ind", partition::topic_prefix(t)), both),
            (format!("{}3/manifest", partition::topic_prefix(t)), wal),
            (partition::fast_segment_prefix(t, 3), wal),
            (crate::wal::PREFIX.to_string(), wal),
            (crate::wal::stream_prefix(7), wal),
            ("meta/".to_string(), wal),
            ("cluster/".to_string(), wal),
        ] {
            assert_eq!(tiers_of_prefix(&prefix), tiers, "{prefix:?}");
        }
        // Every key the routing sends to a tier is found by a listing of each of its prefixes.
        for key in [
            partition::segment_key(t, 3, 100, 7),
            partition::manifest_key(t, 3),
            partition::chunk_key(t, 3, 0),
            partition::fast_segment_key(t, 3, 100, 7, 2, 1),
        ] {
            for end in 0..=key.len() {
                let prefix = &key[..end];
                let asks = tiers_of_prefix(prefix);
                let tier = tier_of_key(&key);
                assert!(
                    asks == PrefixTiers::Both || asks == PrefixTiers::Only(tier),
                    "{key} under {prefix:?}: {asks:?}"
                );
            }
        }
    }
}
