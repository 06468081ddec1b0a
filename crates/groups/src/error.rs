//! The coordinator's error vocabulary. Each variant is exactly one Kafka error name, because the
//! classic group protocol is defined by which error a client sees: clients decide whether to
//! rejoin, reset their member id, retry or give up from the code alone.

use serde::{Deserialize, Serialize};

/// Why the coordinator refused (part of) a request. One variant per Kafka error name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum GroupError {
    /// UNKNOWN_SERVER_ERROR: a request the coordinator cannot make sense of even though it is
    /// well formed (for example a pending member id presented together with an instance id).
    #[error("the coordinator hit an unexpected condition (UNKNOWN_SERVER_ERROR)")]
    UnknownServerError,
    /// UNKNOWN_TOPIC_OR_PARTITION: the broker layer reports it for commits to topics it does not
    /// know; the state machine itself has no topic catalogue.
    #[error("the topic or partition does not exist (UNKNOWN_TOPIC_OR_PARTITION)")]
    UnknownTopicOrPartition,
    /// OFFSET_METADATA_TOO_LARGE: the committed metadata string exceeds
    /// `offset.metadata.max.bytes`.
    #[error("the offset metadata string is too large (OFFSET_METADATA_TOO_LARGE)")]
    OffsetMetadataTooLarge,
    /// COORDINATOR_LOAD_IN_PROGRESS: the group is still being replayed from storage.
    #[error("the coordinator is still loading group state (COORDINATOR_LOAD_IN_PROGRESS)")]
    CoordinatorLoadInProgress,
    /// COORDINATOR_NOT_AVAILABLE: a write to storage failed transiently; retry after
    /// rediscovering the coordinator.
    #[error("the group coordinator is not available (COORDINATOR_NOT_AVAILABLE)")]
    CoordinatorNotAvailable,
    /// NOT_COORDINATOR: this broker no longer owns the group (its writes were fenced or the group
    /// was unloaded).
    #[error("this broker is not the coordinator for the group (NOT_COORDINATOR)")]
    NotCoordinator,
    /// ILLEGAL_GENERATION: the request names a generation other than the group's current one.
    #[error("the generation is not the group's current generation (ILLEGAL_GENERATION)")]
    IllegalGeneration,
    /// INCONSISTENT_GROUP_PROTOCOL: the member's protocol type or protocols do not match the
    /// group's.
    #[error(
        "the member's protocols are incompatible with the group's (INCONSISTENT_GROUP_PROTOCOL)"
    )]
    InconsistentGroupProtocol,
    /// INVALID_GROUP_ID: an empty group id where the API requires one.
    #[error("the group id is invalid (INVALID_GROUP_ID)")]
    InvalidGroupId,
    /// UNKNOWN_MEMBER_ID: the member id is not (or no longer) part of the group.
    #[error("the member id is not known to the group (UNKNOWN_MEMBER_ID)")]
    UnknownMemberId,
    /// INVALID_SESSION_TIMEOUT: the session timeout is outside
    /// `group.min.session.timeout.ms ..= group.max.session.timeout.ms`.
    #[error("the session timeout is outside the broker's allowed range (INVALID_SESSION_TIMEOUT)")]
    InvalidSessionTimeout,
    /// REBALANCE_IN_PROGRESS: the group is rebalancing; the member must rejoin.
    #[error("the group is rebalancing (REBALANCE_IN_PROGRESS)")]
    RebalanceInProgress,
    /// INVALID_COMMIT_OFFSET_SIZE: the offset commit was too large to store.
    #[error("the offset commit is too large to store (INVALID_COMMIT_OFFSET_SIZE)")]
    InvalidCommitOffsetSize,
    /// NON_EMPTY_GROUP: the operation needs a group without members.
    #[error("the group still has members (NON_EMPTY_GROUP)")]
    NonEmptyGroup,
    /// GROUP_ID_NOT_FOUND: no such group.
    #[error("the group does not exist (GROUP_ID_NOT_FOUND)")]
    GroupIdNotFound,
    /// MEMBER_ID_REQUIRED (KIP-394): rejoin with the member id carried in the response.
    #[error("a member id is required; rejoin with the one provided (MEMBER_ID_REQUIRED)")]
    MemberIdRequired,
    /// GROUP_MAX_SIZE_REACHED: the group already has `group.max.size` members.
    #[error("the group has reached its maximum size (GROUP_MAX_SIZE_REACHED)")]
    GroupMaxSizeReached,
    /// FENCED_INSTANCE_ID (KIP-345): another member id now holds this group instance id.
    #[error("a newer member holds this group instance id (FENCED_INSTANCE_ID)")]
    FencedInstanceId,
    /// GROUP_SUBSCRIBED_TO_TOPIC: offsets of a topic the group consumes cannot be deleted.
    #[error("the group is subscribed to the topic (GROUP_SUBSCRIBED_TO_TOPIC)")]
    GroupSubscribedToTopic,
    /// UNSTABLE_OFFSET_COMMIT (KIP-447): a commit for the partition is still being written.
    #[error("an offset commit for the partition is still pending (UNSTABLE_OFFSET_COMMIT)")]
    UnstableOffsetCommit,
    /// INVALID_REQUEST: a ConsumerGroupHeartbeat missing what its member epoch requires (a
    /// joining member without a subscription, a rebalance timeout, an empty member id).
    #[error("the request is invalid (INVALID_REQUEST)")]
    InvalidRequest,
    /// FENCED_MEMBER_EPOCH (KIP-848): the member's epoch is not one the coordinator accepts;
    /// the member must give up its partitions and rejoin with epoch 0.
    #[error("the member epoch is fenced (FENCED_MEMBER_EPOCH)")]
    FencedMemberEpoch,
    /// UNRELEASED_INSTANCE_ID (KIP-848): another live member still holds the group instance id.
    #[error("the group instance id is still in use (UNRELEASED_INSTANCE_ID)")]
    UnreleasedInstanceId,
    /// UNSUPPORTED_ASSIGNOR (KIP-848): the requested server-side assignor does not exist.
    #[error("the server-side assignor is not supported (UNSUPPORTED_ASSIGNOR)")]
    UnsupportedAssignor,
    /// STALE_MEMBER_EPOCH (KIP-848): an offset commit from a member epoch that is not current.
    #[error("the member epoch is stale (STALE_MEMBER_EPOCH)")]
    StaleMemberEpoch,
    /// INVALID_REGULAR_EXPRESSION (KIP-848): a subscription regex that does not compile.
    #[error("the subscription's regular expression is invalid (INVALID_REGULAR_EXPRESSION)")]
    InvalidRegularExpression,
}

impl GroupError {
    /// The numeric code of Kafka's `Errors` enum.
    pub fn kafka_code(&self) -> i16 {
        match self {
            GroupError::UnknownServerError => -1,
            GroupError::UnknownTopicOrPartition => 3,
            GroupError::OffsetMetadataTooLarge => 12,
            GroupError::CoordinatorLoadInProgress => 14,
            GroupError::CoordinatorNotAvailable => 15,
            GroupError::NotCoordinator => 16,
            GroupError::IllegalGeneration => 22,
            GroupError::InconsistentGroupProtocol => 23,
            GroupError::InvalidGroupId => 24,
            GroupError::UnknownMemberId => 25,
            GroupError::InvalidSessionTimeout => 26,
            GroupError::RebalanceInProgress => 27,
            GroupError::InvalidCommitOffsetSize => 28,
            GroupError::NonEmptyGroup => 68,
            GroupError::GroupIdNotFound => 69,
            GroupError::MemberIdRequired => 79,
            GroupError::GroupMaxSizeReached => 81,
            GroupError::FencedInstanceId => 82,
            GroupError::GroupSubscribedToTopic => 86,
            GroupError::UnstableOffsetCommit => 88,
            GroupError::InvalidRequest => 42,
            GroupError::FencedMemberEpoch => 110,
            GroupError::UnreleasedInstanceId => 111,
            GroupError::UnsupportedAssignor => 112,
            GroupError::StaleMemberEpoch => 113,
            GroupError::InvalidRegularExpression => 128,
        }
    }

    /// Kafka's name for the error, as it appears in logs and client exceptions.
    pub fn kafka_name(&self) -> &'static str {
        match self {
            GroupError::UnknownServerError => "UNKNOWN_SERVER_ERROR",
            GroupError::UnknownTopicOrPartition => "UNKNOWN_TOPIC_OR_PARTITION",
            GroupError::OffsetMetadataTooLarge => "OFFSET_METADATA_TOO_LARGE",
            GroupError::CoordinatorLoadInProgress => "COORDINATOR_LOAD_IN_PROGRESS",
            GroupError::CoordinatorNotAvailable => "COORDINATOR_NOT_AVAILABLE",
            GroupError::NotCoordinator => "NOT_COORDINATOR",
            GroupError::IllegalGeneration => "ILLEGAL_GENERATION",
            GroupError::InconsistentGroupProtocol => "INCONSISTENT_GROUP_PROTOCOL",
            GroupError::InvalidGroupId => "INVALID_GROUP_ID",
            GroupError::UnknownMemberId => "UNKNOWN_MEMBER_ID",
            GroupError::InvalidSessionTimeout => "INVALID_SESSION_TIMEOUT",
            GroupError::RebalanceInProgress => "REBALANCE_IN_PROGRESS",
            GroupError::InvalidCommitOffsetSize => "INVALID_COMMIT_OFFSET_SIZE",
            GroupError::NonEmptyGroup => "NON_EMPTY_GROUP",
            GroupError::GroupIdNotFound => "GROUP_ID_NOT_FOUND",
            GroupError::MemberIdRequired => "MEMBER_ID_REQUIRED",
            GroupError::GroupMaxSizeReached => "GROUP_MAX_SIZE_REACHED",
            GroupError::FencedInstanceId => "FENCED_INSTANCE_ID",
            GroupError::GroupSubscribedToTopic => "GROUP_SUBSCRIBED_TO_TOPIC",
            GroupError::UnstableOffsetCommit => "UNSTABLE_OFFSET_COMMIT",
            GroupError::InvalidRequest => "INVALID_REQUEST",
            GroupError::FencedMemberEpoch => "FENCED_MEMBER_EPOCH",
            GroupError::UnreleasedInstanceId => "UNRELEASED_INSTANCE_ID",
            GroupError::UnsupportedAssignor => "UNSUPPORTED_ASSIGNOR",
            GroupError::StaleMemberEpoch => "STALE_MEMBER_EPOCH",
            GroupError::InvalidRegularExpression => "INVALID_REGULAR_EXPRESSION",
        }
    }

    /// Whether Kafka classifies the error as retriable (the client may retry the same request,
    /// possibly after rediscovering the coordinator or rejoining).
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            GroupError::UnknownTopicOrPartition
                | GroupError::CoordinatorLoadInProgress
                | GroupError::CoordinatorNotAvailable
                | GroupError::NotCoordinator
                | GroupError::RebalanceInProgress
                | GroupError::UnstableOffsetCommit
        )
    }

    /// Whether the error means this broker should stop acting as the group's coordinator.
    pub fn is_not_coordinator(&self) -> bool {
        matches!(self, GroupError::NotCoordinator)
    }
}

/// The Kafka code for an optional error: `None` is NONE (0).
pub fn kafka_code(error: Option<GroupError>) -> i16 {
    error.map_or(0, |e| e.kafka_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_match_kafka_errors_enum() {
        let expected = [
            (GroupError::UnknownTopicOrPartition, 3),
            (GroupError::OffsetMetadataTooLarge, 12),
            (GroupError::CoordinatorNotAvailable, 15),
            (GroupError::NotCoordinator, 16),
            (GroupError::IllegalGeneration, 22),
            (GroupError::InconsistentGroupProtocol, 23),
            (GroupError::InvalidGroupId, 24),
            (GroupError::UnknownMemberId, 25),
            (GroupError::InvalidSessionTimeout, 26),
            (GroupError::RebalanceInProgress, 27),
            (GroupError::NonEmptyGroup, 68),
            (GroupError::GroupIdNotFound, 69),
            (GroupError::MemberIdRequired, 79),
            (GroupError::GroupMaxSizeReached, 81),
            (GroupError::FencedInstanceId, 82),
            (GroupError::GroupSubscribedToTopic, 86),
            (GroupError::UnstableOffsetCommit, 88),
            (GroupError::InvalidRequest, 42),
            (GroupError::FencedMemberEpoch, 110),
            (GroupError::UnreleasedInstanceId, 111),
            (GroupError::UnsupportedAssignor, 112),
            (GroupError::StaleMemberEpoch, 113),
            (GroupError::InvalidRegularExpression, 128),
        ];
        for (error, code) in expected {
            assert_eq!(error.kafka_code(), code, "{}", error.kafka_name());
        }
        assert_eq!(kafka_code(None), 0);
    }

    #[test]
    fn display_names_the_kafka_error() {
        let text = GroupError::FencedInstanceId.to_string();
        assert!(text.contains("FENCED_INSTANCE_ID"), "{text}");
    }
}
