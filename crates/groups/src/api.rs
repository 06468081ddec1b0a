//! The requests the broker feeds in and the decisions that come back. These are domain types,
//! not wire structs: the broker converts from and to `kafka-protocol` messages, and applies the
//! per-version shaping (nullable strings, top-level versus per-member errors) on the way out.

use bytes::Bytes;
use strata_core::{Offset, TopicPartition};

use crate::assignor::Assignment;
use crate::error::GroupError;
use crate::record::{PersistRecord, TopicId};

/// The caller's handle for one request whose response may be held back. Every token passed to
/// a `handle_*` method gets exactly one [`Output::Respond`], now or later (after a rebalance,
/// a persist, a timeout or an unload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestToken(pub u64);

/// Names one batch of records to make durable; report its fate with
/// [`crate::GroupsState::persist_completed`]. Ids grow monotonically and double as the records'
/// sequence numbers, which is what replay orders by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PersistId(pub u64);

/// What the caller must do next, in order.
///
/// A `Respond` is always safe to send at once: no response is ever emitted before the records
/// it depends on are durable. Responses that need a write are withheld and come out of
/// [`crate::GroupsState::persist_completed`] instead.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send `response` to the request `token` now.
    Respond {
        token: RequestToken,
        response: Response,
    },
    /// Make `records` durable, atomically (all or none, e.g. in one object), then call
    /// `persist_completed(id, ..)`. Responses that depend on them are withheld until then: the
    /// coordinator never lets a client see a state that storage could forget. Batches may be
    /// written concurrently and complete in any order. A `NotCoordinator` failure means another
    /// broker owns the group now; the caller should then [`crate::GroupsState::unload`] it.
    Persist {
        id: PersistId,
        records: Vec<PersistRecord>,
    },
}

/// How a persist ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistOutcome {
    /// The records are durable.
    Durable,
    /// The records were not written.
    Failed(PersistFailure),
}

/// Why a persist failed, as far as the client needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistFailure {
    /// Storage rejected the write because another broker now owns the group (fenced).
    NotCoordinator,
    /// The write failed or timed out; the client may retry.
    Unavailable,
}

impl PersistFailure {
    pub(crate) fn as_error(self) -> GroupError {
        match self {
            PersistFailure::NotCoordinator => GroupError::NotCoordinator,
            PersistFailure::Unavailable => GroupError::CoordinatorNotAvailable,
        }
    }
}

/// A response to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Join(JoinResponse),
    Sync(SyncResponse),
    Heartbeat(HeartbeatResponse),
    Leave(LeaveResponse),
    OffsetCommit(OffsetCommitResponse),
    OffsetDelete(OffsetDeleteResponse),
    DeleteGroups(DeleteGroupsResponse),
    ConsumerHeartbeat(ConsumerHeartbeatResponse),
    /// A transaction's offsets of one group were made visible or dropped (None), or not.
    TxnEnd(Option<GroupError>),
}

/// One protocol a member supports, with its protocol-specific metadata (for "consumer": a
/// ConsumerProtocolSubscription).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    pub metadata: Bytes,
}

impl Protocol {
    pub fn new(name: impl Into<String>, metadata: impl Into<Bytes>) -> Self {
        Self {
            name: name.into(),
            metadata: metadata.into(),
        }
    }
}

/// JoinGroup, versions 0–9.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinRequest {
    /// The request's API version: v4+ makes new dynamic members fetch a member id first
    /// (KIP-394), v9+ lets a static leader skip the assignment (KIP-814), v0 has no rebalance
    /// timeout (the session timeout stands in for it).
    pub api_version: i16,
    pub group_id: String,
    /// Empty for a member that has no id yet.
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    /// Ignored for v0.
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    /// In the member's order of preference.
    pub protocols: Vec<Protocol>,
    /// v8+ free-text reason, only logged.
    pub reason: Option<String>,
}

/// One member as the leader sees it in its JoinGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

/// The JoinGroup response. On error, `generation_id` is -1 and the optional fields are empty.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinResponse {
    pub error: Option<GroupError>,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's member id; empty when there is none.
    pub leader: String,
    /// v9+: the receiving leader must not run the assignor (static leader rejoining a Stable
    /// group, KIP-814).
    pub skip_assignment: bool,
    pub member_id: String,
    /// All members' metadata for the leader; empty for followers.
    pub members: Vec<JoinMember>,
}

impl JoinResponse {
    pub(crate) fn error(member_id: impl Into<String>, error: GroupError) -> Self {
        Self {
            error: Some(error),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            skip_assignment: false,
            member_id: member_id.into(),
            members: Vec::new(),
        }
    }
}

/// SyncGroup, versions 0–5.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// v5+: checked against the group's protocol type when present.
    pub protocol_type: Option<String>,
    /// v5+: checked against the group's selected protocol when present.
    pub protocol_name: Option<String>,
    /// The leader's assignment (member id, assignment bytes); empty from followers.
    pub assignments: Vec<(String, Bytes)>,
}

/// The SyncGroup response.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncResponse {
    pub error: Option<GroupError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResponse {
    pub(crate) fn error(error: GroupError) -> Self {
        Self {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// Heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatResponse {
    pub error: Option<GroupError>,
}

/// LeaveGroup. Versions 0–2 carry one member id; the broker turns it into a one-element list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveRequest {
    pub group_id: String,
    pub members: Vec<LeavingMember>,
}

/// One member to remove: by member id, or (member id empty) by group instance id, which is how
/// administrators remove static members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeavingMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub reason: Option<String>,
}

/// The LeaveGroup response. For v0–2 the broker reports the single member's error as the
/// top-level error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveResponse {
    pub error: Option<GroupError>,
    pub members: Vec<LeftMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub error: Option<GroupError>,
}

/// OffsetCommit. Versions 0–1 of Kafka's own coordinator semantics (ZooKeeper storage,
/// client-side timestamps) are not modelled: the commit timestamp is always the broker's.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetCommitRequest {
    pub group_id: String,
    /// -1 (with an empty member id) for commits from consumers outside group management.
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// Wall-clock milliseconds (the broker's `Clock::wall_millis`), stored with each offset.
    pub commit_timestamp_ms: i64,
    pub partitions: Vec<CommitPartition>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CommitPartition {
    pub partition: TopicPartition,
    pub offset: Offset,
    pub leader_epoch: Option<i32>,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OffsetCommitResponse {
    /// In request order.
    pub partitions: Vec<(TopicPartition, Option<GroupError>)>,
}

/// OffsetFetch for one group (v8+ batches groups; the broker loops).
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetFetchRequest {
    pub group_id: String,
    /// `None` fetches every committed partition.
    pub partitions: Option<Vec<TopicPartition>>,
    /// KIP-447: report UNSTABLE_OFFSET_COMMIT for partitions with a commit still being written.
    pub require_stable: bool,
    /// v9+: the asking member's id and epoch, checked against KIP-848 consumer groups
    /// (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH); `None` for tools outside the group.
    pub member: Option<(String, i32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OffsetFetchResponse {
    pub error: Option<GroupError>,
    pub partitions: Vec<FetchedOffset>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FetchedOffset {
    pub partition: TopicPartition,
    /// -1 when nothing is committed.
    pub offset: Offset,
    pub leader_epoch: Option<i32>,
    pub metadata: String,
    pub error: Option<GroupError>,
}

/// OffsetDelete.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetDeleteRequest {
    pub group_id: String,
    pub partitions: Vec<TopicPartition>,
}

/// When `error` is set the partition list is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetDeleteResponse {
    pub error: Option<GroupError>,
    pub partitions: Vec<(TopicPartition, Option<GroupError>)>,
}

/// DeleteGroups result, one entry per distinct requested group in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteGroupsResponse {
    pub groups: Vec<(String, Option<GroupError>)>,
}

/// DescribeGroups data for one group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: crate::GroupState,
    /// Empty when the group has none.
    pub protocol_type: String,
    /// The selected protocol; empty unless the group is Stable (as Kafka reports it).
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

/// A member as DescribeGroups shows it. Metadata and assignment are empty unless Stable.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberDescription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// ListGroups data for one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroup {
    pub group_id: String,
    /// "classic" or "consumer" (ListGroups v5).
    pub group_type: &'static str,
    pub protocol_type: String,
    pub state: crate::GroupState,
}

/// The topics a KIP-848 group may subscribe to, as the broker's catalog knows them now. The
/// state machine reads it during a heartbeat (to resolve subscriptions and notice partitions
/// added); it is an in-memory view, never IO.
pub trait TopicCatalog {
    /// The topic's id and partition count.
    fn lookup(&self, name: &str) -> Option<(TopicId, i32)>;
    /// Every topic a regex subscription may match: all but the internal ones.
    fn names(&self) -> Vec<String>;
    /// Changes whenever the set of topics may have changed, so regex resolutions are kept
    /// until it does instead of being redone on every heartbeat.
    fn version(&self) -> u64;
}

/// A fixed catalog (simulations and tests): internal topics are those named `__…`.
impl TopicCatalog for std::collections::BTreeMap<String, (TopicId, i32)> {
    fn lookup(&self, name: &str) -> Option<(TopicId, i32)> {
        self.get(name).copied()
    }

    fn names(&self) -> Vec<String> {
        self.keys()
            .filter(|n| !n.starts_with("__"))
            .cloned()
            .collect()
    }

    fn version(&self) -> u64 {
        // Content-derived, so a test that adds a topic to its map is seen as a new version.
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (name, (_, partitions)) in self {
            name.hash(&mut h);
            partitions.hash(&mut h);
        }
        h.finish()
    }
}

/// ConsumerGroupHeartbeat (KIP-848), versions 0–1. `None` fields mean "unchanged since the
/// last heartbeat", as on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerHeartbeatRequest {
    pub api_version: i16,
    pub group_id: String,
    /// v0: empty on the first heartbeat (the coordinator picks one); v1+: the client's own.
    pub member_id: String,
    /// 0 joins, -1 leaves, -2 leaves as a static member keeping its assignment.
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1 when unchanged.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member owns now; `None` when unchanged.
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
    /// The group's own `consumer.session.timeout.ms` and `consumer.heartbeat.interval.ms`
    /// (Kafka's group configs), which the broker passes in; unset ones are the coordinator's.
    pub timeouts: GroupTimeouts,
}

/// A group's own timings (Kafka's group configs), overriding the coordinator's settings for
/// that group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupTimeouts {
    pub session: Option<std::time::Duration>,
    pub heartbeat_interval: Option<std::time::Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerHeartbeatResponse {
    pub error: Option<GroupError>,
    pub member_id: Option<String>,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's assignment, sent when it changed or the request was a full one.
    pub assignment: Option<Assignment>,
}

impl ConsumerHeartbeatResponse {
    pub(crate) fn error(error: GroupError, member_id: &str, epoch: i32) -> Self {
        Self {
            error: Some(error),
            member_id: (!member_id.is_empty()).then(|| member_id.to_string()),
            member_epoch: epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        }
    }
}

/// ConsumerGroupDescribe data for one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDescription {
    pub group_id: String,
    /// GROUP_ID_NOT_FOUND for unknown groups and classic ones.
    pub error: Option<GroupError>,
    pub state: crate::GroupState,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor_name: String,
    pub members: Vec<ConsumerMemberDescription>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: Assignment,
    pub target_assignment: Assignment,
    /// The member speaks the classic protocol (KIP-1099's member type 0; else 1).
    pub classic: bool,
}
