//! ApiVersions: the table of what this broker implements, and the answer built from it.
//!
//! The table is the single source of truth: dispatch refuses any key or version outside it, and
//! ApiVersions advertises exactly it, so a client never negotiates a version we cannot serve.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::VersionRange;

use crate::errors::code;
use crate::RequestContext;

/// Implemented APIs and the versions each handler supports. Intersected with what
/// `kafka-protocol` can decode before being used anywhere.
///
/// Consumer groups are Kafka's classic protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup),
/// every version `kafka-protocol` decodes. OffsetCommit stops at v9 and OffsetFetch at v9
/// because `kafka-protocol` decodes no later request (v10 would name topics by id). KIP-848
/// consumer groups (ConsumerGroupHeartbeat, ConsumerGroupDescribe) are served; share groups
/// are not implemented and not advertised.
/// Transactions (AddPartitionsToTxn, EndTxn, ...) are not implemented and not advertised;
/// FindCoordinator for a transaction answers COORDINATOR_NOT_AVAILABLE.
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
    (ApiKey::AlterPartitionReassignments, 0, 0),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::ListPartitionReassignments, 0, 0),
];

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

/// The answer to an ApiVersions request of a supported version. No feature sections: Strata
/// has no finalized features (no transactions, no KRaft metadata versions) and clients do not
/// require them.
pub(crate) fn handle(_request: ApiVersionsRequest, _ctx: &RequestContext) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = code::NONE;
    response.api_keys = api_version_list();
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
        ] {
            assert_eq!(supported_versions(key).map(|r| r.max), Some(max), "{key:?}");
        }
    }

    #[test]
    fn transaction_and_new_group_protocol_apis_are_not_advertised() {
        for key in [
            ApiKey::ShareGroupHeartbeat,
            ApiKey::AddPartitionsToTxn,
            ApiKey::EndTxn,
            ApiKey::SaslHandshake,
        ] {
            assert!(supported_versions(key).is_none(), "{key:?}");
        }
    }
}
