//! What the coordinator asks the caller to make durable: the same facts Kafka writes to
//! `__consumer_offsets` (group metadata after a completed rebalance, offset commits, and
//! tombstones for deletions), so a new coordinator can rebuild the groups from storage alone.
//!
//! Every record carries the sequence number of its batch ([`crate::PersistId`]). Replay sorts by
//! it, so storage may hand records back in any order; and each record has a [`PersistKey`], so
//! storage may compact to the newest record per key (tombstones included) without changing what
//! replay rebuilds.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_core::{Offset, TopicPartition};

/// One durable fact about a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistRecord {
    /// The batch's [`crate::PersistId`]; later sequence numbers win on replay.
    pub seq: u64,
    pub group_id: String,
    pub body: RecordBody,
}

/// The payload of a [`PersistRecord`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RecordBody {
    /// The group's membership and assignment as of a completed rebalance (or a static member's
    /// replacement), like Kafka's GroupMetadataValue.
    GroupMetadata(GroupMetadataValue),
    /// The group was deleted: forget its metadata. Offsets get their own tombstones.
    GroupTombstone,
    /// A committed offset.
    Offset {
        partition: TopicPartition,
        value: OffsetValue,
    },
    /// A committed offset was deleted.
    OffsetTombstone { partition: TopicPartition },
    /// A KIP-848 consumer group's epochs and the topic metadata its target assignment was
    /// computed from: Kafka's ConsumerGroupMetadataValue (key version 3),
    /// ConsumerGroupPartitionMetadataValue (4) and ConsumerGroupTargetAssignmentMetadataValue
    /// (6) in one record. It shares the classic metadata's key, so whichever type the group
    /// last had wins on replay, and a group tombstone deletes either.
    ConsumerGroupMetadata(ConsumerGroupValue),
    /// One consumer-group member: Kafka's ConsumerGroupMemberMetadataValue (key version 5),
    /// ConsumerGroupTargetAssignmentMemberValue (7) and ConsumerGroupCurrentMemberAssignmentValue
    /// (8) in one record, because a batch here is written atomically; `None` removes the member.
    ConsumerMember {
        member_id: String,
        value: Option<ConsumerMemberValue>,
    },
    /// An offset committed inside a transaction (TxnOffsetCommit), pending until the
    /// transaction's marker reaches this shard; `None` once the transaction ended (on commit
    /// written in the same batch as the offset it became).
    TxnOffset {
        producer_id: i64,
        partition: TopicPartition,
        value: Option<OffsetValue>,
    },
}

/// A topic id (the catalog's UUID), written as 32 hex digits so it can key JSON maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId(pub [u8; 16]);

impl Serialize for TopicId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        serializer.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for TopicId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let bad = || serde::de::Error::custom(format!("bad topic id {text:?}"));
        if text.len() != 32 || !text.is_ascii() {
            return Err(bad());
        }
        let mut id = [0u8; 16];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(TopicId(id))
    }
}

/// See [`RecordBody::ConsumerGroupMetadata`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroupValue {
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    /// Subscribed topics (name → id, partition count) as of the last group epoch bump; a
    /// difference with the catalog is a metadata change that bumps the epoch again.
    pub topics: std::collections::BTreeMap<String, (TopicId, i32)>,
}

/// Where a member is in reconciling its current assignment with its target (Kafka's
/// `MemberState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsumerMemberState {
    /// Owns its current assignment at its epoch.
    Stable,
    /// Must give up `pending_revocation` before it advances to the target epoch.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions other members still own.
    UnreleasedPartitions,
}

/// See [`RecordBody::ConsumerMember`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerMemberValue {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    pub state: ConsumerMemberState,
    pub assigned: crate::assignor::Assignment,
    pub pending_revocation: crate::assignor::Assignment,
    pub target: crate::assignor::Assignment,
    /// Set for a member that speaks the classic protocol (JoinGroup, SyncGroup, Heartbeat)
    /// inside a consumer group, during an online migration between the two protocols.
    /// Boxed: most members have none, and the record enum stays small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classic: Option<Box<ClassicMemberMetadata>>,
}

/// What a classic-protocol member of a consumer group told the coordinator in its JoinGroup
/// (Kafka's `ConsumerGroupMemberMetadataValue.ClassicMemberMetadata`): its session timeout,
/// which it chooses itself in that protocol, and the protocols it supports, which a downgrade
/// back to a classic group needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassicMemberMetadata {
    pub session_timeout_ms: i32,
    pub protocols: Vec<ClassicProtocol>,
}

/// One (name, subscription metadata) entry of a JoinGroup's protocol list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassicProtocol {
    pub name: String,
    #[serde(with = "bytes_serde")]
    pub metadata: Bytes,
}

/// Group metadata, as Kafka's GroupMetadataValue records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupMetadataValue {
    pub protocol_type: Option<String>,
    pub generation_id: i32,
    pub protocol_name: Option<String>,
    pub leader: Option<String>,
    pub members: Vec<PersistedMember>,
}

/// A member as stored: only the metadata of the selected protocol is kept, as in Kafka.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    #[serde(with = "bytes_serde")]
    pub subscription: Bytes,
    #[serde(with = "bytes_serde")]
    pub assignment: Bytes,
}

/// A committed offset, as Kafka's OffsetCommitValue records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetValue {
    pub offset: Offset,
    pub leader_epoch: Option<i32>,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

/// The compaction key of a record: only the newest record per key matters for replay.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PersistKey {
    GroupMetadata(String),
    Offset(String, TopicPartition),
    ConsumerMember(String, String),
    TxnOffset(String, i64, TopicPartition),
}

impl PersistRecord {
    pub fn key(&self) -> PersistKey {
        match &self.body {
            RecordBody::GroupMetadata(_)
            | RecordBody::GroupTombstone
            | RecordBody::ConsumerGroupMetadata(_) => {
                PersistKey::GroupMetadata(self.group_id.clone())
            }
            RecordBody::Offset { partition, .. } | RecordBody::OffsetTombstone { partition } => {
                PersistKey::Offset(self.group_id.clone(), partition.clone())
            }
            RecordBody::ConsumerMember { member_id, .. } => {
                PersistKey::ConsumerMember(self.group_id.clone(), member_id.clone())
            }
            RecordBody::TxnOffset {
                producer_id,
                partition,
                ..
            } => PersistKey::TxnOffset(self.group_id.clone(), *producer_id, partition.clone()),
        }
    }

    /// Whether the record deletes its key (storage may drop it once nothing older remains).
    pub fn is_tombstone(&self) -> bool {
        matches!(
            self.body,
            RecordBody::GroupTombstone
                | RecordBody::OffsetTombstone { .. }
                | RecordBody::ConsumerMember { value: None, .. }
                | RecordBody::TxnOffset { value: None, .. }
        )
    }
}

/// `Bytes` as a serde byte string; formats without one (JSON) get a sequence, which the
/// deserializer also accepts.
mod bytes_serde {
    use bytes::Bytes;
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;

    pub fn serialize<S: Serializer>(value: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        deserializer.deserialize_byte_buf(BytesVisitor)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Bytes;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a byte string")
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(v))
        }

        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(v))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
            while let Some(byte) = seq.next_element::<u8>()? {
                out.push(byte);
            }
            Ok(Bytes::from(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_json() {
        let record = PersistRecord {
            seq: 9,
            group_id: "g".into(),
            body: RecordBody::GroupMetadata(GroupMetadataValue {
                protocol_type: Some("consumer".into()),
                generation_id: 3,
                protocol_name: Some("range".into()),
                leader: Some("m-1".into()),
                members: vec![PersistedMember {
                    member_id: "m-1".into(),
                    group_instance_id: Some("i-1".into()),
                    client_id: "c".into(),
                    client_host: "/10.0.0.1".into(),
                    rebalance_timeout_ms: 30_000,
                    session_timeout_ms: 10_000,
                    subscription: Bytes::from_static(&[0, 1, 2]),
                    assignment: Bytes::from_static(&[255]),
                }],
            }),
        };
        let json = serde_json::to_string(&record).unwrap();
        let back: PersistRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, record);
        assert_eq!(record.key(), PersistKey::GroupMetadata("g".into()));
    }
}
