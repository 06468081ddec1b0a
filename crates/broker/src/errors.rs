//! The one table that turns Strata's errors into Kafka error codes.
//!
//! Every layer below the broker has its own detailed error enum; this module is the only place
//! that decides which Kafka code a client sees for each of them. Clients act on the code alone
//! (retry, refresh metadata, fail the message), so the choice is about what the client should do
//! next, not about how the failure happened. The consumer-group coordinator's errors
//! ([`GroupError`]) are mapped by [`group_error_code`].

use kafka_protocol::protocol::StrBytes;
use strata_groups::share_partition::ShareAckError;
use strata_groups::GroupError;
use strata_log::LogError;
use strata_storage::StorageError;
use strata_txn::TxnError;
use strata_wire::batch::BatchError;

use crate::fetch_sessions::FetchSessionError;
use crate::quotas::store::QuotaError;
use crate::security::SecurityError;
use crate::share::ShareError;

/// Kafka error codes used by the broker, with the numbers of Kafka's `Errors` enum.
pub mod code {
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const BROKER_NOT_AVAILABLE: i16 = 8;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const OFFSET_METADATA_TOO_LARGE: i16 = 12;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const NETWORK_EXCEPTION: i16 = 13;
    pub const NOT_ENOUGH_REPLICAS: i16 = 19;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const RECORD_LIST_TOO_LARGE: i16 = 18;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const INVALID_GROUP_ID: i16 = 24;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
    pub const INVALID_TIMESTAMP: i16 = 32;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    pub const INVALID_CONFIG: i16 = 40;
    pub const NOT_CONTROLLER: i16 = 41;
    pub const INVALID_REQUEST: i16 = 42;
    pub const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
    pub const POLICY_VIOLATION: i16 = 44;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const INVALID_TXN_STATE: i16 = 48;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    pub const TRANSACTION_COORDINATOR_FENCED: i16 = 52;
    pub const PRODUCER_FENCED: i16 = 90;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub const ILLEGAL_SASL_STATE: i16 = 34;
    pub const SECURITY_DISABLED: i16 = 54;
    pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
    pub const DUPLICATE_RESOURCE: i16 = 92;
    pub const UNACCEPTABLE_CREDENTIAL: i16 = 93;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const UNKNOWN_PRODUCER_ID: i16 = 59;
    pub const NON_EMPTY_GROUP: i16 = 68;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
    pub const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
    pub const FENCED_LEADER_EPOCH: i16 = 74;
    pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
    pub const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
    pub const ELECTION_NOT_NEEDED: i16 = 84;
    pub const INVALID_RECORD: i16 = 87;
    pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    pub const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;
    pub const THROTTLING_QUOTA_EXCEEDED: i16 = 89;
    pub const RESOURCE_NOT_FOUND: i16 = 91;
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    pub const UNRELEASED_INSTANCE_ID: i16 = 111;
    pub const UNSUPPORTED_ASSIGNOR: i16 = 112;
    pub const INVALID_REGULAR_EXPRESSION: i16 = 128;
    pub const STALE_MEMBER_EPOCH: i16 = 113;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
    pub const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;
    pub const MISMATCHED_ENDPOINT_TYPE: i16 = 114;
    pub const UNSUPPORTED_ENDPOINT_TYPE: i16 = 115;
    pub const INVALID_RECORD_STATE: i16 = 121;
    pub const SHARE_SESSION_NOT_FOUND: i16 = 122;
    pub const INVALID_SHARE_SESSION_EPOCH: i16 = 123;
    pub const SHARE_SESSION_LIMIT_REACHED: i16 = 133;
}

/// The Kafka error code a client gets for a log-layer failure.
///
/// Retryable conditions map to codes clients retry on (usually after refreshing metadata);
/// anything that would fail again unchanged maps to a non-retriable code.
pub fn error_code(error: &LogError) -> i16 {
    match error {
        LogError::UnknownTopicOrPartition => code::UNKNOWN_TOPIC_OR_PARTITION,
        LogError::TopicAlreadyExists(_) => code::TOPIC_ALREADY_EXISTS,
        LogError::InvalidTopic(_) => code::INVALID_TOPIC_EXCEPTION,
        LogError::InvalidPartitions(_) => code::INVALID_PARTITIONS,
        LogError::InvalidConfig(_) => code::INVALID_CONFIG,
        LogError::InvalidReplicaAssignment(_) => code::INVALID_REPLICA_ASSIGNMENT,
        LogError::CorruptMessage(e) => batch_error_code(e),
        LogError::MessageTooLarge { .. } => code::MESSAGE_TOO_LARGE,
        LogError::OffsetOutOfRange { .. } => code::OFFSET_OUT_OF_RANGE,
        LogError::OutOfOrderSequence { .. } => code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        LogError::InvalidProducerEpoch { .. } => code::INVALID_PRODUCER_EPOCH,
        LogError::UnknownProducerId(_) => code::UNKNOWN_PRODUCER_ID,
        // Kafka's ProducerAppendInfo: a non-transactional write while the producer's
        // transaction is open.
        LogError::InvalidTxnState(_) => code::INVALID_TXN_STATE,
        LogError::TransactionCoordinatorFenced { .. } => code::TRANSACTION_COORDINATOR_FENCED,
        // A bound Kafka does not have (its aborted index is per segment): not retriable as
        // is, and the producer aborts the transaction, which adds nothing here.
        LogError::TooManyAbortedTransactions { .. } => code::POLICY_VIOLATION,
        LogError::InvalidTimestamp(_) => code::INVALID_TIMESTAMP,
        LogError::InvalidRequest(_) => code::INVALID_REQUEST,
        LogError::Storage(e) => storage_error_code(e),
        // The partition has a newer owner: the client must refresh metadata and go there.
        LogError::Fenced => code::NOT_LEADER_OR_FOLLOWER,
        // Another broker serves the partition: the client refreshes metadata and goes there.
        LogError::NotOwner => code::NOT_LEADER_OR_FOLLOWER,
        LogError::Timeout => code::REQUEST_TIMED_OUT,
        // Produce backpressure outlasted the request's timeout: retriable, and the client's
        // own backoff is exactly the relief we want.
        LogError::Backpressure => code::REQUEST_TIMED_OUT,
        // Compaction cannot keep up (or its storage is down): nothing was stored, and every
        // client retries this code; Java's also refreshes metadata, which is harmless.
        LogError::CompactionBehind { .. } => code::KAFKA_STORAGE_ERROR,
        // Like a Kafka broker in controlled shutdown: the client refreshes metadata and
        // retries, by then against the partition's next owner (or this broker restarted).
        LogError::ShuttingDown => code::NOT_LEADER_OR_FOLLOWER,
        // Not retriable: the same read would hit the same bytes.
        LogError::CorruptStorage(_) => code::UNKNOWN_SERVER_ERROR,
    }
}

/// The Kafka error code of a fetch whose session cannot be used. Each is what Kafka answers in
/// the same case; clients answer all three by starting over with a full fetch.
pub fn fetch_session_error_code(error: &FetchSessionError) -> i16 {
    match error {
        FetchSessionError::NotFound => code::FETCH_SESSION_ID_NOT_FOUND,
        FetchSessionError::InvalidEpoch => code::INVALID_FETCH_SESSION_EPOCH,
        FetchSessionError::TopicIdMismatch => code::FETCH_SESSION_TOPIC_ID_ERROR,
    }
}

/// The Kafka error code of a security failure: a failed login and a malformed SASL message
/// both read SASL_AUTHENTICATION_FAILED (the client is refused either way, and the message
/// must not say whether the user exists); a user store that cannot be reached is retriable.
pub fn security_error_code(error: &SecurityError) -> i16 {
    match error {
        SecurityError::BadSaslMessage(_)
        | SecurityError::BadCredentials
        | SecurityError::InvalidToken(_)
        | SecurityError::ReauthPrincipalChanged => code::SASL_AUTHENTICATION_FAILED,
        SecurityError::UnsupportedMechanism(_) => code::UNSUPPORTED_SASL_MECHANISM,
        SecurityError::IllegalState(_) => code::ILLEGAL_SASL_STATE,
        SecurityError::Unacceptable(_) => code::UNACCEPTABLE_CREDENTIAL,
        SecurityError::NotFound(_) => code::RESOURCE_NOT_FOUND,
        SecurityError::Duplicate(_) => code::DUPLICATE_RESOURCE,
        SecurityError::Storage(_) | SecurityError::Contended(_) | SecurityError::AclStorage(_) => {
            code::KAFKA_STORAGE_ERROR
        }
        SecurityError::InvalidAcl(_) => code::INVALID_REQUEST,
        SecurityError::AuthorizerDisabled => code::SECURITY_DISABLED,
    }
}

/// The Kafka error code of a failed client-quota change.
pub fn quota_error_code(error: &QuotaError) -> i16 {
    match error {
        QuotaError::Invalid(_) => code::INVALID_REQUEST,
        QuotaError::Storage(_) | QuotaError::Contended => code::KAFKA_STORAGE_ERROR,
        QuotaError::NotAuthorized => code::CLUSTER_AUTHORIZATION_FAILED,
    }
}

/// The group-config layer's errors as Kafka codes: a refused name or value is INVALID_CONFIG,
/// as Kafka answers for group configs.
pub fn group_config_error_code(error: &crate::group_configs::GroupConfigError) -> i16 {
    use crate::group_configs::GroupConfigError;
    match error {
        GroupConfigError::Invalid(_) => code::INVALID_CONFIG,
        GroupConfigError::Storage(_) | GroupConfigError::Contended => code::KAFKA_STORAGE_ERROR,
    }
}

/// Why a topic a request names by name cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error(transparent)]
    Log(LogError),
    /// A failure shared by every topic of one catalog change.
    #[error(transparent)]
    Shared(std::sync::Arc<LogError>),
    /// Auto-creation is on but this request or the broker reached its creation limit.
    #[error("topic creation deferred: too many topics auto-created at once; retry")]
    CreationDeferred,
}

/// The Kafka error code a client gets for a topic it named that cannot be served.
pub fn lookup_error_code(error: &LookupError) -> i16 {
    match error {
        LookupError::Log(e) => error_code(e),
        LookupError::Shared(e) => error_code(e),
        // What Kafka answers for a topic whose auto-creation is under way: retriable, so the
        // client refreshes metadata and asks again, and the topic is created then.
        LookupError::CreationDeferred => code::LEADER_NOT_AVAILABLE,
    }
}

/// The Kafka error code a client gets for a group-coordinator refusal. The coordinator's errors
/// are Kafka's own names one for one (clients drive the classic group protocol from these codes
/// alone: rejoin, reset the member id, rediscover the coordinator, retry), so this is the
/// identity on names; spelled out so that every code a client can see is listed in this file.
pub fn group_error_code(error: &GroupError) -> i16 {
    match error {
        GroupError::UnknownServerError => code::UNKNOWN_SERVER_ERROR,
        GroupError::UnknownTopicOrPartition => code::UNKNOWN_TOPIC_OR_PARTITION,
        GroupError::OffsetMetadataTooLarge => code::OFFSET_METADATA_TOO_LARGE,
        GroupError::CoordinatorLoadInProgress => code::COORDINATOR_LOAD_IN_PROGRESS,
        GroupError::CoordinatorNotAvailable => code::COORDINATOR_NOT_AVAILABLE,
        GroupError::NotCoordinator => code::NOT_COORDINATOR,
        GroupError::IllegalGeneration => code::ILLEGAL_GENERATION,
        GroupError::InconsistentGroupProtocol => code::INCONSISTENT_GROUP_PROTOCOL,
        GroupError::InvalidGroupId => code::INVALID_GROUP_ID,
        GroupError::UnknownMemberId => code::UNKNOWN_MEMBER_ID,
        GroupError::InvalidSessionTimeout => code::INVALID_SESSION_TIMEOUT,
        GroupError::RebalanceInProgress => code::REBALANCE_IN_PROGRESS,
        GroupError::InvalidCommitOffsetSize => code::INVALID_COMMIT_OFFSET_SIZE,
        GroupError::NonEmptyGroup => code::NON_EMPTY_GROUP,
        GroupError::GroupIdNotFound => code::GROUP_ID_NOT_FOUND,
        GroupError::MemberIdRequired => code::MEMBER_ID_REQUIRED,
        GroupError::GroupMaxSizeReached => code::GROUP_MAX_SIZE_REACHED,
        GroupError::FencedInstanceId => code::FENCED_INSTANCE_ID,
        GroupError::GroupSubscribedToTopic => code::GROUP_SUBSCRIBED_TO_TOPIC,
        GroupError::UnstableOffsetCommit => code::UNSTABLE_OFFSET_COMMIT,
        GroupError::InvalidRequest => code::INVALID_REQUEST,
        GroupError::FencedMemberEpoch => code::FENCED_MEMBER_EPOCH,
        GroupError::UnreleasedInstanceId => code::UNRELEASED_INSTANCE_ID,
        GroupError::UnsupportedAssignor => code::UNSUPPORTED_ASSIGNOR,
        GroupError::StaleMemberEpoch => code::STALE_MEMBER_EPOCH,
        GroupError::InvalidRegularExpression => code::INVALID_REGULAR_EXPRESSION,
    }
}

/// A refused share acknowledgement: Kafka's codes for the same refusals.
pub fn share_ack_error_code(error: &ShareAckError) -> i16 {
    match error {
        ShareAckError::InvalidRecordState(..) => code::INVALID_RECORD_STATE,
        ShareAckError::InvalidRequest(..) => code::INVALID_REQUEST,
    }
}

/// A share partition or share session that could not serve a request. A deposed owner's
/// fenced write answers NOT_LEADER_OR_FOLLOWER, as a fenced manifest write does: the client
/// refreshes metadata and finds the new owner.
pub fn share_error_code(error: &ShareError) -> i16 {
    match error {
        ShareError::Log(e) => error_code(e),
        ShareError::Fenced(_) => code::NOT_LEADER_OR_FOLLOWER,
        ShareError::Storage(_) => code::KAFKA_STORAGE_ERROR,
        // Retriable: idle share partitions are dropped as their records are acknowledged.
        ShareError::TooManySharePartitions => code::LEADER_NOT_AVAILABLE,
        ShareError::SessionNotFound => code::SHARE_SESSION_NOT_FOUND,
        ShareError::InvalidSessionEpoch(..) => code::INVALID_SHARE_SESSION_EPOCH,
        ShareError::SessionLimitReached => code::SHARE_SESSION_LIMIT_REACHED,
    }
}

/// [`group_error_code`] for an optional error: `None` is NONE.
pub fn group_code(error: Option<GroupError>) -> i16 {
    error.as_ref().map_or(code::NONE, group_error_code)
}

/// The transaction coordinator's refusals, each named after its Kafka code.
pub fn txn_error_code(error: &TxnError) -> i16 {
    match error {
        TxnError::NotCoordinator => code::NOT_COORDINATOR,
        TxnError::CoordinatorLoadInProgress => code::COORDINATOR_LOAD_IN_PROGRESS,
        TxnError::CoordinatorNotAvailable => code::COORDINATOR_NOT_AVAILABLE,
        TxnError::InvalidRequest => code::INVALID_REQUEST,
        TxnError::InvalidTransactionTimeout => code::INVALID_TRANSACTION_TIMEOUT,
        TxnError::InvalidProducerIdMapping => code::INVALID_PRODUCER_ID_MAPPING,
        TxnError::ProducerFenced => code::PRODUCER_FENCED,
        TxnError::InvalidProducerEpoch => code::INVALID_PRODUCER_EPOCH,
        TxnError::ConcurrentTransactions => code::CONCURRENT_TRANSACTIONS,
        TxnError::InvalidTxnState => code::INVALID_TXN_STATE,
        TxnError::TransactionalIdNotFound => code::TRANSACTIONAL_ID_NOT_FOUND,
    }
}

/// What a transactional produce answers when the coordinator did not verify its partition
/// (KIP-890 part 1, as Kafka's `AddPartitionsToTxnManager` and `ReplicaManager` map it): a
/// fenced producer gets INVALID_PRODUCER_EPOCH, which producers expect from produce; a refused
/// inter-broker request INVALID_TXN_STATE (the client must not see an authorization error
/// that is not its own); and the coordinator's retriable errors NOT_ENOUGH_REPLICAS, which
/// clients of every version retry without a metadata refresh.
pub fn txn_verification_code(coordinator_code: i16) -> i16 {
    match coordinator_code {
        code::PRODUCER_FENCED => code::INVALID_PRODUCER_EPOCH,
        code::CLUSTER_AUTHORIZATION_FAILED => code::INVALID_TXN_STATE,
        code::CONCURRENT_TRANSACTIONS
        | code::NETWORK_EXCEPTION
        | code::COORDINATOR_LOAD_IN_PROGRESS
        | code::COORDINATOR_NOT_AVAILABLE
        | code::NOT_COORDINATOR => code::NOT_ENOUGH_REPLICAS,
        other => other,
    }
}

pub fn txn_code(result: &Result<(), TxnError>) -> i16 {
    result.as_ref().err().map_or(code::NONE, txn_error_code)
}

/// Record-batch validation failures: damaged bytes are CORRUPT_MESSAGE (the producer may retry
/// a batch damaged in transit), old formats UNSUPPORTED_FOR_MESSAGE_FORMAT, and well-formed
/// batches that break the producer rules INVALID_RECORD (not retried).
fn batch_error_code(error: &BatchError) -> i16 {
    match error {
        BatchError::Truncated { .. }
        | BatchError::LengthMismatch { .. }
        | BatchError::CorruptCrc { .. }
        | BatchError::InvalidRecords(_) => code::CORRUPT_MESSAGE,
        BatchError::UnsupportedMagic(_) => code::UNSUPPORTED_FOR_MESSAGE_FORMAT,
        // Like a batch over max.message.bytes: the same batch would be refused again, and the
        // Java producer answers it by splitting the batch.
        BatchError::DecompressedTooLarge { .. } => code::MESSAGE_TOO_LARGE,
        BatchError::InvalidRecordCount { .. }
        | BatchError::InvalidRecord { .. }
        // Kafka 4: InvalidRecordException from LogValidator.validateKey.
        | BatchError::KeylessRecordOnCompactedTopic { .. }
        | BatchError::UnknownCompression(_)
        | BatchError::ControlBatchFromClient
        | BatchError::InvalidSequence { .. } => code::INVALID_RECORD,
    }
}

fn storage_error_code(error: &StorageError) -> i16 {
    if error.is_retryable() {
        // Transient: KAFKA_STORAGE_ERROR is retriable in every client.
        return code::KAFKA_STORAGE_ERROR;
    }
    match error {
        // A conditional write lost to another writer: someone else owns the partition now.
        StorageError::Precondition(_) | StorageError::AlreadyExists(_) => {
            code::NOT_LEADER_OR_FOLLOWER
        }
        _ => code::UNKNOWN_SERVER_ERROR,
    }
}

/// The human-readable message for a response's `error_message` field.
pub fn error_message(error: &LogError) -> Option<StrBytes> {
    Some(StrBytes::from_string(error.to_string()))
}

/// Shorthand for an owned error message.
pub(crate) fn message(text: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(text.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_log_errors_map_to_retriable_kafka_codes() {
        let retriable = [
            code::NOT_LEADER_OR_FOLLOWER,
            code::REQUEST_TIMED_OUT,
            code::KAFKA_STORAGE_ERROR,
        ];
        let cases = [
            LogError::Timeout,
            LogError::Backpressure,
            LogError::CompactionBehind {
                bytes: 1 << 30,
                batches: 10,
                max_bytes: 1 << 30,
                max_batches: 1_000_000,
            },
            LogError::ShuttingDown,
            LogError::Fenced,
            LogError::Storage(StorageError::Unavailable("down".into())),
            LogError::Storage(StorageError::Throttled("slow down".into())),
        ];
        for e in cases {
            assert!(e.is_retryable(), "{e}");
            assert!(
                retriable.contains(&error_code(&e)),
                "{e} -> {}",
                error_code(&e)
            );
        }
    }

    #[test]
    fn client_mistakes_map_to_their_kafka_codes() {
        assert_eq!(error_code(&LogError::UnknownTopicOrPartition), 3);
        assert_eq!(error_code(&LogError::InvalidTopic("x".into())), 17);
        assert_eq!(error_code(&LogError::TopicAlreadyExists("t".into())), 36);
        assert_eq!(error_code(&LogError::InvalidPartitions("0".into())), 37);
        assert_eq!(error_code(&LogError::InvalidConfig("x".into())), 40);
        assert_eq!(
            error_code(&LogError::InvalidReplicaAssignment("x".into())),
            39
        );
        assert_eq!(
            error_code(&LogError::MessageTooLarge { size: 2, max: 1 }),
            10
        );
        assert_eq!(
            error_code(&LogError::OffsetOutOfRange {
                offset: 9,
                log_start: 0,
                high_watermark: 1
            }),
            1
        );
        assert_eq!(
            error_code(&LogError::OutOfOrderSequence {
                producer_id: 1,
                expected: 1,
                got: 3
            }),
            45
        );
        assert_eq!(
            error_code(&LogError::InvalidProducerEpoch {
                producer_id: 1,
                got: 0,
                current: 1
            }),
            47
        );
        assert_eq!(error_code(&LogError::UnknownProducerId(7)), 59);
        assert_eq!(error_code(&LogError::InvalidTimestamp("x".into())), 32);
        assert_eq!(error_code(&LogError::CorruptStorage("x".into())), -1);
        assert_eq!(
            error_code(&LogError::CorruptMessage(BatchError::InvalidRecords(
                "gzip data does not decompress".into()
            ))),
            2
        );
        assert_eq!(
            error_code(&LogError::CorruptMessage(
                BatchError::DecompressedTooLarge { limit: 1 }
            )),
            10
        );
    }

    #[test]
    fn group_errors_map_to_the_codes_the_groups_layer_names() {
        use GroupError::*;
        let all = [
            UnknownServerError,
            UnknownTopicOrPartition,
            OffsetMetadataTooLarge,
            CoordinatorLoadInProgress,
            CoordinatorNotAvailable,
            NotCoordinator,
            IllegalGeneration,
            InconsistentGroupProtocol,
            InvalidGroupId,
            UnknownMemberId,
            InvalidSessionTimeout,
            RebalanceInProgress,
            InvalidCommitOffsetSize,
            NonEmptyGroup,
            GroupIdNotFound,
            MemberIdRequired,
            GroupMaxSizeReached,
            FencedInstanceId,
            GroupSubscribedToTopic,
            UnstableOffsetCommit,
        ];
        for e in all {
            assert_eq!(group_error_code(&e), e.kafka_code(), "{}", e.kafka_name());
        }
        assert_eq!(group_code(None), code::NONE);
    }
}
