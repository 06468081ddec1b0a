//! The consumer-group coordinator for Kafka's *classic* group protocol (JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup) and, beside it, KIP-848 *consumer* groups (ConsumerGroupHeartbeat,
//! server-side assignors; see `consumer.rs`), with online migration of a live group between
//! the two (`migration.rs`); the committed offsets of those groups (OffsetCommit,
//! OffsetFetch, OffsetDelete), plus the group administration APIs (DescribeGroups, ListGroups,
//! DeleteGroups). It follows Apache Kafka's GroupCoordinator closely enough that unchanged
//! clients see the same errors, generations and rebalance behaviour.
//!
//! This crate owns the *decisions* only and never does IO: no sockets, no storage, no runtime,
//! no clock reads. [`GroupsState`] is a sans-IO state machine. The broker calls it with a
//! request, the current monotonic time and a [`RequestToken`]; it answers with [`Output`]s:
//! responses to deliver (possibly to requests parked earlier — JoinGroup and SyncGroup wait for
//! the rebalance) and [`PersistRecord`] batches that the broker must make durable before the
//! responses they gate are released via [`GroupsState::persist_completed`]. Timeouts fire
//! through [`GroupsState::tick`] at [`GroupsState::next_deadline`]. Because every change Kafka
//! would write to `__consumer_offsets` comes out as a record, a coordinator rebuilt with
//! [`GroupsState::replay`] from storage carries on where the previous one stopped. Wire structs
//! stay in the broker, which converts at the edge.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod api;
pub mod assignor;
mod config;
mod consumer;
mod error;
mod group;
mod ids;
pub mod kafka_records;
mod membership;
mod migration;
mod offsets;
mod record;
pub mod share;
pub mod share_partition;
mod state;
pub mod subscription;
mod txn_offsets;

pub use api::{
    CommitPartition, ConsumerGroupDescription, ConsumerHeartbeatRequest, ConsumerHeartbeatResponse,
    ConsumerMemberDescription, DeleteGroupsResponse, FetchedOffset, GroupDescription,
    GroupTimeouts, HeartbeatRequest, HeartbeatResponse, JoinMember, JoinRequest, JoinResponse,
    LeaveRequest, LeaveResponse, LeavingMember, LeftMember, ListedGroup, MemberDescription,
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, Output, PersistFailure, PersistId, PersistOutcome,
    Protocol, RequestToken, Response, SyncRequest, SyncResponse, TopicCatalog,
};
pub use config::{GroupConfig, MigrationPolicy};
pub use consumer::{LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH};
pub use error::{kafka_code, GroupError};
pub use group::GroupState;
pub use ids::{MemberIdGenerator, SeededMemberIds};
pub use record::{
    ClassicMemberMetadata, ClassicProtocol, ConsumerGroupValue, ConsumerMemberState,
    ConsumerMemberValue, GroupMetadataValue, OffsetValue, PersistKey, PersistRecord,
    PersistedMember, RecordBody, TopicId,
};
pub use state::GroupsState;
pub use txn_offsets::TxnOffsetCommitRequest;
