//! ApiVersions: the table of what this broker implements, and the answer built from it.
//!
//! The table is the single source of truth: dispatch refuses any key or version outside it, and
//! ApiVersions advertises exactly it, so a client never negotiates a version we cannot serve.

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use crate::errors::code;
use crate::RequestContext;

/// Implemented APIs and the versions each handler supports. Intersected with what
/// `kafka-protocol` can decode before being used anywhere.
///
/// Consumer groups are Kafka's classic protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup),
/// every version `kafka-protocol` decodes. OffsetCommit stops at v9 and OffsetFetch at v9
/// because `kafka-protocol` decodes no later request (v10 would name topics by id). KIP-848
/// consumer groups (ConsumerGroupHeartbeat, ConsumerGroupDescribe) are served, and KIP-932
/// share groups (ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge) at v1,
/// the only version `kafka-protocol` decodes and the one Kafka 4.1+ clients send, and their
/// offsets APIs (Describe/Alter/DeleteShareGroupOffsets) at v0, likewise the only one decoded.
/// Transactions: the coordinator's APIs at the versions of `transaction.version` < 2 (the
/// feature is not advertised, so clients do not use KIP-890 part 2's AddPartitionsToTxn v5 /
/// EndTxn v5 semantics). The partition side: transactional Produce,
/// read_committed Fetch and ListOffsets, and WriteTxnMarkers v1 (the coordinator's request to
/// partition owners).
const IMPLEMENTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 16),
    (ApiKey::ListOffsets, 1, 8),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 1),
    (ApiKey::ShareAcknowledge, 1, 1),
    (ApiKey::DescribeShareGroupOffsets, 0, 0),
    (ApiKey::AlterShareGroupOffsets, 0, 0),
    (ApiKey::DeleteShareGroupOffsets, 0, 0),
    (ApiKey::AlterPartitionReassignments, 0, 0),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::ListConfigResources, 0, 1),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::AddPartitionsToTxn, 0, 4),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 4),
    (ApiKey::ListTransactions, 0, 2),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::WriteTxnMarkers, 1, 1),
];

/// One feature flag (KIP-584) as ApiVersions v3+ reports it, and DescribeFeatures in Java's
/// AdminClient shows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Feature {
    pub name: &'static str,
    /// The levels this broker's code supports.
    pub min: i16,
    pub max: i16,
    /// The level in force; None (or 0) is not reported as finalized, as in Kafka, where level
    /// 0 means "off".
    pub finalized: Option<i16>,
}

/// Strata's features, each at the level Kafka 4.2 finalizes for what Strata implements:
/// `group.version` 1 is the KIP-848 consumer protocol, `share.version` 1 share groups
/// (KIP-932). Not reported: `metadata.version` and `kraft.version` describe Kafka's KRaft
/// metadata log, which Strata does not have, and `transaction.version` 2 would claim KIP-890
/// part 2, which Strata does not implement (clients treat a missing feature as level 0, the
/// original transaction protocol).
pub(crate) const FEATURES: &[Feature] = &[
    Feature {
        name: "group.version",
        min: 0,
        max: 1,
        finalized: Some(1),
    },
    Feature {
        name: "share.version",
        min: 0,
        max: 1,
        finalized: Some(1),
    },
];

/// The epoch of the finalized features: they only change with the code, so any fixed number
/// serves; -1 (unknown) while none is finalized, as Kafka reports before it has any.
fn finalized_epoch(features: &[Feature]) -> i64 {
    if features.iter().any(|f| f.finalized.unwrap_or(0) > 0) {
        0
    } else {
        -1
    }
}

/// Fills the feature sections of a v3+ answer from `features`.
fn set_features(response: &mut ApiVersionsResponse, features: &[Feature]) {
    response.supported_features = features
        .iter()
        .map(|f| {
            let mut k = SupportedFeatureKey::default();
            k.name = StrBytes::from_static_str(f.name);
            k.min_version = f.min;
            k.max_version = f.max;
            k
        })
        .collect();
    response.finalized_features = features
        .iter()
        .filter_map(|f| {
            let level = f.finalized.filter(|level| *level > 0)?;
            let mut k = FinalizedFeatureKey::default();
            k.name = StrBytes::from_static_str(f.name);
            k.min_version_level = level;
            k.max_version_level = level;
            Some(k)
        })
        .collect();
    response.finalized_features_epoch = finalized_epoch(features);
}

/// The versions of `key` this broker serves, or None if it does not implement the API.
pub fn supported_versions(key: ApiKey) -> Option<VersionRange> {
    let (_, min, max) = IMPLEMENTED.iter().find(|(k, _, _)| *k == key)?;
    let range = VersionRange {
        min: *min,
        max: *max,
    }
    .intersect(&key.valid_versions());
    (!range.is_empty()).then_some(range)
}

/// [`supported_versions`] of a raw api key.
pub(crate) fn supported_versions_of(key: i16) -> Option<VersionRange> {
    ApiKey::try_from(key).ok().and_then(supported_versions)
}

/// Every implemented API with its version range, sorted by key.
pub fn supported_apis() -> Vec<(ApiKey, VersionRange)> {
    let mut apis: Vec<(ApiKey, VersionRange)> = IMPLEMENTED
        .iter()
        .filter_map(|(key, _, _)| supported_versions(*key).map(|range| (*key, range)))
        .collect();
    apis.sort_by_key(|(key, _)| *key as i16);
    apis
}

fn api_version_list() -> Vec<ApiVersion> {
    supported_apis()
        .into_iter()
        .map(|(key, range)| {
            let mut v = ApiVersion::default();
            v.api_key = key as i16;
            v.min_version = range.min;
            v.max_version = range.max;
            v
        })
        .collect()
}

/// The answer to an ApiVersions request of a supported version; from v3 with the feature
/// sections of [`FEATURES`].
pub(crate) fn handle(_request: ApiVersionsRequest, ctx: &RequestContext) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = code::NONE;
    response.api_keys = api_version_list();
    if ctx.api_version >= 3 {
        set_features(&mut response, FEATURES);
    }
    response
}

/// The answer to an ApiVersions request whose version we do not support (or could not decode):
/// to be encoded as version 0, which every client can read, carrying the error and the list
/// of what we do support so the client can pick a version and retry — what Kafka does.
pub(crate) fn error_response(error_code: i16) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = error_code;
    response.api_keys = api_version_list();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_ranges_are_within_what_kafka_protocol_decodes() {
        for (key, range) in supported_apis() {
            let codec = key.valid_versions();
            assert!(range.min >= codec.min && range.max <= codec.max, "{key:?}");
            assert!(!range.is_empty(), "{key:?}");
        }
        assert_eq!(supported_apis().len(), IMPLEMENTED.len());
    }

    #[test]
    fn a_feature_row_is_reported_supported_and_finalized_with_an_epoch() {
        let rows = [
            Feature {
                name: "group.version",
                min: 0,
                max: 1,
                finalized: Some(1),
            },
            Feature {
                name: "off.version",
                min: 0,
                max: 2,
                finalized: Some(0),
            },
        ];
        let mut response = ApiVersionsResponse::default();
        set_features(&mut response, &rows);
        let supported: Vec<_> = response
            .supported_features
            .iter()
            .map(|k| (k.name.as_str(), k.min_version, k.max_version))
            .collect();
        assert_eq!(supported, [("group.version", 0, 1), ("off.version", 0, 2)]);
        let finalized: Vec<_> = response
            .finalized_features
            .iter()
            .map(|k| (k.name.as_str(), k.min_version_level, k.max_version_level))
            .collect();
        assert_eq!(finalized, [("group.version", 1, 1)]);
        assert_eq!(response.finalized_features_epoch, 0);

        let mut none = ApiVersionsResponse::default();
        set_features(&mut none, &[]);
        assert_eq!(none.finalized_features_epoch, -1);
        assert!(none.finalized_features.is_empty());

        // What Strata itself reports: the two group protocols it implements.
        let mut ours = ApiVersionsResponse::default();
        set_features(&mut ours, FEATURES);
        let finalized: Vec<_> = ours
            .finalized_features
            .iter()
            .map(|k| (k.name.as_str(), k.max_version_level))
            .collect();
        assert_eq!(finalized, [("group.version", 1), ("share.version", 1)]);
    }

    #[test]
    fn group_apis_are_advertised_in_full() {
        for (key, max) in [
            (ApiKey::FindCoordinator, 6),
            (ApiKey::JoinGroup, 9),
            (ApiKey::SyncGroup, 5),
            (ApiKey::OffsetCommit, 9),
            (ApiKey::OffsetFetch, 9),
            (ApiKey::ListGroups, 5),
            (ApiKey::ConsumerGroupHeartbeat, 1),
            (ApiKey::ConsumerGroupDescribe, 1),
            (ApiKey::ShareGroupHeartbeat, 1),
            (ApiKey::ShareFetch, 1),
            (ApiKey::ShareAcknowledge, 1),
        ] {
            assert_eq!(supported_versions(key).map(|r| r.max), Some(max), "{key:?}");
        }
    }

    /// README's "Kafka APIs" table lists every advertised API with exactly its version range,
    /// and nothing else, so the documentation cannot drift from what clients negotiate.
    #[test]
    fn the_readme_lists_every_advertised_api_with_its_versions() {
        let readme = include_str!("../../../README.md");
        let section = readme
            .split("## Kafka APIs")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .expect("README has a Kafka APIs section");
        let mut listed = Vec::new();
        for row in section
            .lines()
            .filter(|l| l.starts_with("| ") && l.contains(") |"))
            .skip(1)
        {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let keys = cells[1].split("), ").map(|name| {
                let key = name.rsplit('(').next().unwrap().trim_end_matches(')');
                key.parse::<i16>()
                    .unwrap_or_else(|_| panic!("bad key in {row}"))
            });
            let ranges = cells[2].split(", ").map(|r| {
                let mut ends = r.split('–').map(|v| v.parse::<i16>().unwrap());
                let min = ends.next().unwrap();
                (min, ends.next().unwrap_or(min))
            });
            let keys: Vec<i16> = keys.collect();
            let mut ranges: Vec<(i16, i16)> = ranges.collect();
            // One range for several APIs means each has it.
            if ranges.len() == 1 {
                ranges = vec![ranges[0]; keys.len()];
            }
            assert_eq!(keys.len(), ranges.len(), "{row}");
            listed.extend(keys.into_iter().zip(ranges));
        }
        listed.sort();
        let advertised: Vec<(i16, (i16, i16))> = supported_apis()
            .into_iter()
            .map(|(key, range)| (key as i16, (range.min, range.max)))
            .collect();
        assert_eq!(listed, advertised);
    }
}
