//! `__consumer_offsets` records in Kafka's own binary schema, so Kafka's offsets-topic
//! formatters (and any client that knows the layout) can read what this coordinator writes,
//! and so the key cleaner, which keeps the newest record per key bytes, keeps exactly what
//! replay needs.
//!
//! A record's key is an int16 key version, which Kafka 4 uses as the record type, followed by
//! the key struct; its value is an int16 value version and the value struct; a deletion is a
//! tombstone (the key with no value). The layouts follow Kafka's message JSON files in
//! `group-coordinator/src/main/resources/common/message`:
//!
//! | type | key | value written |
//! |---|---|---|
//! | 1 | OffsetCommitKey (group, topic, partition) | OffsetCommitValue v3 (what Kafka 4 writes without an expire timestamp) |
//! | 2 | GroupMetadataKey (group) | GroupMetadataValue v3 (likewise) |
//! | 3 | ConsumerGroupMetadataKey (group) | ConsumerGroupMetadataValue v0: the group epoch |
//! | 4 | ConsumerGroupPartitionMetadataKey (group) | ConsumerGroupPartitionMetadataValue v0: subscribed topics' ids and partition counts |
//! | 5 | ConsumerGroupMemberMetadataKey (group, member) | ConsumerGroupMemberMetadataValue v0 |
//! | 6 | ConsumerGroupTargetAssignmentMetadataKey (group) | ConsumerGroupTargetAssignmentMetadataValue v0: the assignment epoch |
//! | 7 | ConsumerGroupTargetAssignmentMemberKey (group, member) | ConsumerGroupTargetAssignmentMemberValue v0 |
//! | 8 | ConsumerGroupCurrentMemberAssignmentKey (group, member) | ConsumerGroupCurrentMemberAssignmentValue v0 |
//! | 1000 | Strata only: group, producer id, topic, partition | OffsetCommitValue v3: a transactional offset still pending |
//!
//! Values of types 3–8 are flexible versions (compact strings and arrays, tagged fields);
//! keys and the values of types 1 and 2 are not. Kafka has no record for a pending
//! transactional offset (it keeps them in the producer's transactional batch and reads the
//! marker on load); Strata keeps its pending record and resolves it with a tombstone when the
//! marker arrives, under a key version no Kafka record uses.
//!
//! Strata's state machine speaks in [`PersistRecord`]s, some of which are several Kafka
//! records (a KIP-848 group's metadata is types 3, 4 and 6; a member is 5, 7 and 8; a group
//! deletion tombstones 2, 3, 4 and 6). [`encode`] splits them; [`Replay`] puts them back
//! together in log order. Nothing here does IO.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::{Buf, Bytes};
use strata_core::{Offset, TopicPartition};

use crate::assignor::Assignment;
use crate::record::{
    ClassicMemberMetadata, ClassicProtocol, ConsumerGroupValue, ConsumerMemberState,
    ConsumerMemberValue, GroupMetadataValue, OffsetValue, PersistRecord, PersistedMember,
    RecordBody, TopicId,
};

pub const OFFSET_COMMIT: i16 = 1;
pub const GROUP_METADATA: i16 = 2;
pub const CONSUMER_GROUP_METADATA: i16 = 3;
pub const CONSUMER_GROUP_PARTITION_METADATA: i16 = 4;
pub const CONSUMER_GROUP_MEMBER_METADATA: i16 = 5;
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA: i16 = 6;
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER: i16 = 7;
pub const CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT: i16 = 8;
/// Strata only (see the module documentation): a pending transactional offset.
pub const STRATA_TXN_OFFSET: i16 = 1000;

const OFFSET_COMMIT_VALUE_VERSION: i16 = 3;
const GROUP_METADATA_VALUE_VERSION: i16 = 3;
const CONSUMER_VALUE_VERSION: i16 = 0;

/// One Kafka record: key bytes and value bytes, `None` for a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable __consumer_offsets record: {0}")]
pub struct SchemaError(pub &'static str);

/// The Kafka records of one state-machine record. `now_ms` is written as GroupMetadataValue's
/// `currentStateTimestamp`, which Strata does not otherwise keep.
pub fn encode(record: &PersistRecord, now_ms: i64) -> Vec<KafkaRecord> {
    let group = record.group_id.as_str();
    let group_key = |version: i16| {
        let mut k = key_head(version);
        put_str(&mut k, group);
        k
    };
    let member_key = |version: i16, member: &str| {
        let mut k = group_key(version);
        put_str(&mut k, member);
        k
    };
    let rec = |key: Vec<u8>, value: Option<Vec<u8>>| KafkaRecord {
        key: Bytes::from(key),
        value: value.map(Bytes::from),
    };
    match &record.body {
        RecordBody::Offset { partition, value } => {
            vec![rec(offset_key(group, partition), Some(offset_value(value)))]
        }
        RecordBody::OffsetTombstone { partition } => vec![rec(offset_key(group, partition), None)],
        RecordBody::GroupMetadata(value) => vec![rec(
            group_key(GROUP_METADATA),
            Some(group_metadata_value(value, now_ms)),
        )],
        RecordBody::GroupTombstone => [
            GROUP_METADATA,
            CONSUMER_GROUP_METADATA,
            CONSUMER_GROUP_PARTITION_METADATA,
            CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA,
        ]
        .into_iter()
        .map(|version| rec(group_key(version), None))
        .collect(),
        RecordBody::ConsumerGroupMetadata(v) => {
            let mut epoch = value_head(CONSUMER_VALUE_VERSION);
            epoch.extend_from_slice(&v.group_epoch.to_be_bytes());
            no_tags(&mut epoch);
            let mut topics = value_head(CONSUMER_VALUE_VERSION);
            put_compact_len(&mut topics, v.topics.len());
            for (name, (id, partitions)) in &v.topics {
                topics.extend_from_slice(&id.0);
                put_compact_str(&mut topics, name);
                topics.extend_from_slice(&partitions.to_be_bytes());
                // PartitionMetadata (racks per partition): Kafka 4 stores it empty too.
                put_compact_len(&mut topics, 0);
                no_tags(&mut topics);
            }
            no_tags(&mut topics);
            let mut assignment = value_head(CONSUMER_VALUE_VERSION);
            assignment.extend_from_slice(&v.assignment_epoch.to_be_bytes());
            no_tags(&mut assignment);
            vec![
                rec(group_key(CONSUMER_GROUP_PARTITION_METADATA), Some(topics)),
                rec(group_key(CONSUMER_GROUP_METADATA), Some(epoch)),
                rec(
                    group_key(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA),
                    Some(assignment),
                ),
            ]
        }
        RecordBody::ConsumerMember { member_id, value } => {
            let keys = [
                CONSUMER_GROUP_MEMBER_METADATA,
                CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
                CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
            ];
            match value {
                None => keys
                    .into_iter()
                    .map(|version| rec(member_key(version, member_id), None))
                    .collect(),
                Some(v) => {
                    let mut meta = value_head(CONSUMER_VALUE_VERSION);
                    put_compact_nullable_str(&mut meta, v.instance_id.as_deref());
                    put_compact_nullable_str(&mut meta, v.rack_id.as_deref());
                    put_compact_str(&mut meta, &v.client_id);
                    put_compact_str(&mut meta, &v.client_host);
                    put_compact_len(&mut meta, v.subscribed_topic_names.len());
                    for name in &v.subscribed_topic_names {
                        put_compact_str(&mut meta, name);
                    }
                    put_compact_nullable_str(&mut meta, v.subscribed_topic_regex.as_deref());
                    meta.extend_from_slice(&v.rebalance_timeout_ms.to_be_bytes());
                    put_compact_nullable_str(&mut meta, v.server_assignor.as_deref());
                    match &v.classic {
                        None => no_tags(&mut meta),
                        Some(classic) => {
                            // One tagged field, tag 0: ClassicMemberMetadata, a nullable
                            // struct (a presence byte, then the struct).
                            let mut field = vec![1u8];
                            field.extend_from_slice(&classic.session_timeout_ms.to_be_bytes());
                            put_compact_len(&mut field, classic.protocols.len());
                            for p in &classic.protocols {
                                put_compact_str(&mut field, &p.name);
                                put_compact_len(&mut field, p.metadata.len());
                                field.extend_from_slice(&p.metadata);
                                no_tags(&mut field);
                            }
                            no_tags(&mut field);
                            put_uvarint(&mut meta, 1);
                            put_uvarint(&mut meta, 0);
                            put_uvarint(&mut meta, field.len() as u64);
                            meta.extend_from_slice(&field);
                        }
                    }
                    let mut target = value_head(CONSUMER_VALUE_VERSION);
                    put_assignment(&mut target, &v.target);
                    no_tags(&mut target);
                    let mut current = value_head(CONSUMER_VALUE_VERSION);
                    current.extend_from_slice(&v.member_epoch.to_be_bytes());
                    current.extend_from_slice(&v.previous_member_epoch.to_be_bytes());
                    current.push(member_state_code(v.state) as u8);
                    put_assignment(&mut current, &v.assigned);
                    put_assignment(&mut current, &v.pending_revocation);
                    no_tags(&mut current);
                    vec![
                        rec(member_key(keys[0], member_id), Some(meta)),
                        rec(member_key(keys[1], member_id), Some(target)),
                        rec(member_key(keys[2], member_id), Some(current)),
                    ]
                }
            }
        }
        RecordBody::TxnOffset {
            producer_id,
            partition,
            value,
        } => {
            let mut k = group_key(STRATA_TXN_OFFSET);
            k.extend_from_slice(&producer_id.to_be_bytes());
            put_str(&mut k, &partition.topic);
            k.extend_from_slice(&partition.partition.to_be_bytes());
            vec![rec(k, value.as_ref().map(offset_value))]
        }
    }
}

fn offset_key(group: &str, tp: &TopicPartition) -> Vec<u8> {
    let mut k = key_head(OFFSET_COMMIT);
    put_str(&mut k, group);
    put_str(&mut k, &tp.topic);
    k.extend_from_slice(&tp.partition.to_be_bytes());
    k
}

fn offset_value(v: &OffsetValue) -> Vec<u8> {
    let mut out = value_head(OFFSET_COMMIT_VALUE_VERSION);
    out.extend_from_slice(&v.offset.get().to_be_bytes());
    out.extend_from_slice(&v.leader_epoch.unwrap_or(-1).to_be_bytes());
    put_str(&mut out, &v.metadata);
    out.extend_from_slice(&v.commit_timestamp_ms.to_be_bytes());
    out
}

fn group_metadata_value(v: &GroupMetadataValue, now_ms: i64) -> Vec<u8> {
    let mut out = value_head(GROUP_METADATA_VALUE_VERSION);
    // protocolType is not nullable in Kafka's schema; Kafka writes "" for a group without one.
    put_str(&mut out, v.protocol_type.as_deref().unwrap_or(""));
    out.extend_from_slice(&v.generation_id.to_be_bytes());
    put_nullable_str(&mut out, v.protocol_name.as_deref());
    put_nullable_str(&mut out, v.leader.as_deref());
    out.extend_from_slice(&now_ms.to_be_bytes());
    out.extend_from_slice(&(v.members.len() as i32).to_be_bytes());
    for m in &v.members {
        put_str(&mut out, &m.member_id);
        put_nullable_str(&mut out, m.group_instance_id.as_deref());
        put_str(&mut out, &m.client_id);
        put_str(&mut out, &m.client_host);
        out.extend_from_slice(&m.rebalance_timeout_ms.to_be_bytes());
        out.extend_from_slice(&m.session_timeout_ms.to_be_bytes());
        put_bytes(&mut out, &m.subscription);
        put_bytes(&mut out, &m.assignment);
    }
    out
}

fn member_state_code(state: ConsumerMemberState) -> i8 {
    // Kafka's MemberState codes.
    match state {
        ConsumerMemberState::Stable => 0,
        ConsumerMemberState::UnrevokedPartitions => 1,
        ConsumerMemberState::UnreleasedPartitions => 2,
    }
}

fn member_state(code: i8) -> Result<ConsumerMemberState, SchemaError> {
    match code {
        0 => Ok(ConsumerMemberState::Stable),
        1 => Ok(ConsumerMemberState::UnrevokedPartitions),
        2 => Ok(ConsumerMemberState::UnreleasedPartitions),
        _ => Err(SchemaError("unknown member state")),
    }
}

fn key_head(version: i16) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&version.to_be_bytes());
    out
}

fn value_head(version: i16) -> Vec<u8> {
    key_head(version)
}

/// Kafka strings are at most i16::MAX bytes. Every string here comes from a request whose
/// size is bounded far below that (group and member ids, topic names, metadata capped by
/// `offset.metadata.max.bytes`), so cutting is never expected; it keeps the encoding valid.
fn put_str(out: &mut Vec<u8>, s: &str) {
    let bytes = truncate_utf8(s, i16::MAX as usize);
    out.extend_from_slice(&(bytes.len() as i16).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_nullable_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => out.extend_from_slice(&(-1i16).to_be_bytes()),
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as i32).to_be_bytes());
    out.extend_from_slice(b);
}

fn truncate_utf8(s: &str, max: usize) -> &[u8] {
    if s.len() <= max {
        return s.as_bytes();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Compact arrays and strings store length + 1 (0 is null).
fn put_compact_len(out: &mut Vec<u8>, len: usize) {
    put_uvarint(out, len as u64 + 1);
}

fn put_compact_str(out: &mut Vec<u8>, s: &str) {
    put_compact_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_compact_nullable_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_compact_str(out, s),
        None => out.push(0),
    }
}

/// An empty tagged-field section.
fn no_tags(out: &mut Vec<u8>) {
    out.push(0);
}

/// `[]TopicPartitions` of the assignment records: topic id and its partitions, each entry a
/// flexible struct with its own (empty) tagged fields.
fn put_assignment(out: &mut Vec<u8>, a: &Assignment) {
    put_compact_len(out, a.len());
    for (topic, partitions) in a {
        out.extend_from_slice(&topic.0);
        put_compact_len(out, partitions.len());
        for p in partitions {
            out.extend_from_slice(&p.to_be_bytes());
        }
        no_tags(out);
    }
}

/// Kafka's record fields, the fixed-width ones through `bytes::Buf`'s checked getters: a short
/// record is an error, never a panic.
struct Reader<'a>(&'a [u8]);

fn truncated(_: bytes::TryGetError) -> SchemaError {
    SchemaError("truncated")
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], SchemaError> {
        if self.0.len() < n {
            return Err(SchemaError("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn i8(&mut self) -> Result<i8, SchemaError> {
        self.0.try_get_i8().map_err(truncated)
    }
    fn i16(&mut self) -> Result<i16, SchemaError> {
        self.0.try_get_i16().map_err(truncated)
    }
    fn i32(&mut self) -> Result<i32, SchemaError> {
        self.0.try_get_i32().map_err(truncated)
    }
    fn i64(&mut self) -> Result<i64, SchemaError> {
        self.0.try_get_i64().map_err(truncated)
    }
    fn uuid(&mut self) -> Result<TopicId, SchemaError> {
        let mut a = [0u8; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(TopicId(a))
    }
    fn utf8(b: &[u8]) -> Result<String, SchemaError> {
        String::from_utf8(b.to_vec()).map_err(|_| SchemaError("string not UTF-8"))
    }
    fn nullable_str(&mut self) -> Result<Option<String>, SchemaError> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        let b = self.take(len as usize)?;
        Self::utf8(b).map(Some)
    }
    fn str(&mut self) -> Result<String, SchemaError> {
        self.nullable_str()?.ok_or(SchemaError("null string"))
    }
    fn bytes(&mut self) -> Result<Bytes, SchemaError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(Bytes::new());
        }
        Ok(Bytes::copy_from_slice(self.take(len as usize)?))
    }
    fn uvarint(&mut self) -> Result<u64, SchemaError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(SchemaError("varint too long"))
    }
    /// A compact length: None for null. Bounded by the bytes left so a corrupt length cannot
    /// make a caller reserve memory for it.
    fn compact_len(&mut self) -> Result<Option<usize>, SchemaError> {
        let n = self.uvarint()?;
        if n == 0 {
            return Ok(None);
        }
        let n = usize::try_from(n - 1).map_err(|_| SchemaError("length too large"))?;
        if n > self.0.len() {
            return Err(SchemaError("truncated"));
        }
        Ok(Some(n))
    }
    fn compact_nullable_str(&mut self) -> Result<Option<String>, SchemaError> {
        match self.compact_len()? {
            None => Ok(None),
            Some(n) => Self::utf8(self.take(n)?).map(Some),
        }
    }
    fn compact_str(&mut self) -> Result<String, SchemaError> {
        self.compact_nullable_str()?
            .ok_or(SchemaError("null string"))
    }
    fn compact_array_len(&mut self) -> Result<usize, SchemaError> {
        Ok(self.compact_len()?.unwrap_or(0))
    }
    /// Skips a tagged-field section: fields added by later Kafka versions are not ours to
    /// interpret, and a reader must pass over them.
    fn tags(&mut self) -> Result<(), SchemaError> {
        self.tags_with(|_, _| Ok(()))
    }

    /// A tagged-field section, handing each field's tag and bytes to `field`.
    fn tags_with(
        &mut self,
        mut field: impl FnMut(u64, &[u8]) -> Result<(), SchemaError>,
    ) -> Result<(), SchemaError> {
        let count = self.uvarint()?;
        for _ in 0..count {
            let tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|_| SchemaError("tag size"))?;
            field(tag, self.take(size)?)?;
        }
        Ok(())
    }

    /// ClassicMemberMetadata (the nullable struct in tag 0 of a member's metadata).
    fn classic_member(&mut self) -> Result<Option<Box<ClassicMemberMetadata>>, SchemaError> {
        if self.i8()? < 0 {
            return Ok(None);
        }
        let session_timeout_ms = self.i32()?;
        let mut protocols = Vec::new();
        for _ in 0..self.compact_array_len()? {
            let name = self.compact_str()?;
            let len = self.compact_len()?.unwrap_or(0);
            let metadata = Bytes::copy_from_slice(self.take(len)?);
            self.tags()?;
            protocols.push(ClassicProtocol { name, metadata });
        }
        self.tags()?;
        Ok(Some(Box::new(ClassicMemberMetadata {
            session_timeout_ms,
            protocols,
        })))
    }
    fn assignment(&mut self) -> Result<Assignment, SchemaError> {
        let mut out = BTreeMap::new();
        for _ in 0..self.compact_array_len()? {
            let topic = self.uuid()?;
            let mut partitions = BTreeSet::new();
            for _ in 0..self.compact_array_len()? {
                partitions.insert(self.i32()?);
            }
            self.tags()?;
            out.insert(topic, partitions);
        }
        Ok(out)
    }
    fn version(&mut self, expected: &[i16]) -> Result<i16, SchemaError> {
        let v = self.i16()?;
        if expected.contains(&v) {
            Ok(v)
        } else {
            Err(SchemaError("unsupported value version"))
        }
    }
}

/// OffsetCommitValue v0–v3 (v1's expire timestamp is read and ignored, as Kafka 4 does).
fn decode_offset_value(bytes: &[u8]) -> Result<OffsetValue, SchemaError> {
    let mut r = Reader(bytes);
    let version = r.version(&[0, 1, 2, 3])?;
    let offset = r.i64()?;
    let leader_epoch = if version >= 3 { r.i32()? } else { -1 };
    let metadata = r.str()?;
    let commit_timestamp_ms = r.i64()?;
    Ok(OffsetValue {
        offset: Offset(offset),
        leader_epoch: (leader_epoch >= 0).then_some(leader_epoch),
        metadata,
        commit_timestamp_ms,
    })
}

/// GroupMetadataValue v0–v3.
fn decode_group_metadata(bytes: &[u8]) -> Result<GroupMetadataValue, SchemaError> {
    let mut r = Reader(bytes);
    let version = r.version(&[0, 1, 2, 3])?;
    let protocol_type = r.str()?;
    let generation_id = r.i32()?;
    let protocol_name = r.nullable_str()?;
    let leader = r.nullable_str()?;
    if version >= 2 {
        let _current_state_timestamp = r.i64()?;
    }
    let count = r.i32()?.max(0) as usize;
    let mut members = Vec::with_capacity(count.min(r.0.len()));
    for _ in 0..count {
        let member_id = r.str()?;
        let group_instance_id = if version >= 3 {
            r.nullable_str()?
        } else {
            None
        };
        let client_id = r.str()?;
        let client_host = r.str()?;
        let rebalance_timeout_ms = if version >= 1 { r.i32()? } else { -1 };
        let session_timeout_ms = r.i32()?;
        let subscription = r.bytes()?;
        let assignment = r.bytes()?;
        members.push(PersistedMember {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            subscription,
            assignment,
        });
    }
    Ok(GroupMetadataValue {
        protocol_type: (!protocol_type.is_empty()).then_some(protocol_type),
        generation_id,
        protocol_name,
        leader,
        members,
    })
}

/// The parts of a KIP-848 group's metadata read so far (types 3, 4, 6).
#[derive(Debug, Default)]
struct PartialGroup {
    epoch: Option<i32>,
    topics: Option<BTreeMap<String, (TopicId, i32)>>,
    assignment_epoch: Option<i32>,
}

/// The parts of a KIP-848 member read so far (types 5, 7, 8).
#[derive(Debug, Default)]
struct PartialMember {
    metadata: Option<MemberMetadata>,
    target: Option<Assignment>,
    current: Option<CurrentAssignment>,
}

#[derive(Debug)]
struct MemberMetadata {
    instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    subscribed_topic_names: Vec<String>,
    subscribed_topic_regex: Option<String>,
    rebalance_timeout_ms: i32,
    server_assignor: Option<String>,
    classic: Option<Box<ClassicMemberMetadata>>,
}

#[derive(Debug)]
struct CurrentAssignment {
    member_epoch: i32,
    previous_member_epoch: i32,
    state: ConsumerMemberState,
    assigned: Assignment,
    pending_revocation: Assignment,
}

/// Rebuilds the state machine's records from a shard's log, read in log order: records of
/// older builds (JSON [`PersistRecord`]s, handed over already decoded) and Kafka records.
///
/// The result is in the order [`crate::GroupsState::replay`] must apply it, renumbered: the
/// older builds' records first, in their own sequence order (those builds wrote batches
/// concurrently, so their log order was not their decision order, and they may precede a
/// newer build's records but never follow them), then the Kafka records in log order, which
/// this build keeps equal to decision order. A KIP-848 group's metadata and members are
/// emitted last, whole, from the newest part of each kind; a classic metadata record or a
/// group tombstone read after some of their parts discards those parts, as the combined
/// record of older builds did.
#[derive(Debug, Default)]
pub struct Replay {
    legacy: Vec<PersistRecord>,
    records: Vec<PersistRecord>,
    groups: HashMap<String, PartialGroup>,
    members: HashMap<String, BTreeMap<String, PartialMember>>,
}

impl Replay {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a stored value is an older build's JSON record rather than a Kafka value (whose
    /// first byte is the high byte of a small version number).
    pub fn is_legacy_value(value: Option<&[u8]>) -> bool {
        value.is_some_and(|v| v.first() == Some(&b'{'))
    }

    /// An older build's record.
    pub fn push_legacy(&mut self, record: PersistRecord) {
        self.legacy.push(record);
    }

    /// How many records of older builds were pushed.
    pub fn legacy_count(&self) -> usize {
        self.legacy.len()
    }

    /// One Kafka record, in log order. An error leaves the replay as it was.
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), SchemaError> {
        let mut k = Reader(key);
        let version = k.i16()?;
        let group = k.str()?;
        let body = match version {
            // Version 0 is the pre-0.10 offset key, laid out as version 1.
            0 | OFFSET_COMMIT => {
                let topic = k.str()?;
                let partition = TopicPartition::new(topic.as_str(), k.i32()?);
                match value {
                    Some(v) => RecordBody::Offset {
                        partition,
                        value: decode_offset_value(v)?,
                    },
                    None => RecordBody::OffsetTombstone { partition },
                }
            }
            GROUP_METADATA => {
                let body = match value {
                    Some(v) => RecordBody::GroupMetadata(decode_group_metadata(v)?),
                    None => RecordBody::GroupTombstone,
                };
                self.groups.remove(&group);
                self.members.remove(&group);
                body
            }
            STRATA_TXN_OFFSET => {
                let producer_id = k.i64()?;
                let topic = k.str()?;
                let partition = TopicPartition::new(topic.as_str(), k.i32()?);
                RecordBody::TxnOffset {
                    producer_id,
                    partition,
                    value: value.map(decode_offset_value).transpose()?,
                }
            }
            CONSUMER_GROUP_METADATA
            | CONSUMER_GROUP_PARTITION_METADATA
            | CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA => {
                return self.push_group_part(version, group, value);
            }
            CONSUMER_GROUP_MEMBER_METADATA
            | CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER
            | CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT => {
                let member = k.str()?;
                return self.push_member_part(version, group, member, value);
            }
            _ => return Err(SchemaError("unknown record type")),
        };
        self.records.push(PersistRecord {
            seq: 0,
            group_id: group,
            body,
        });
        Ok(())
    }

    fn push_group_part(
        &mut self,
        version: i16,
        group: String,
        value: Option<&[u8]>,
    ) -> Result<(), SchemaError> {
        let Some(value) = value else {
            if let Some(part) = self.groups.get_mut(&group) {
                match version {
                    CONSUMER_GROUP_METADATA => part.epoch = None,
                    CONSUMER_GROUP_PARTITION_METADATA => part.topics = None,
                    _ => part.assignment_epoch = None,
                }
            }
            return Ok(());
        };
        let mut r = Reader(value);
        r.version(&[CONSUMER_VALUE_VERSION])?;
        match version {
            CONSUMER_GROUP_METADATA => {
                let epoch = r.i32()?;
                r.tags()?;
                self.groups.entry(group).or_default().epoch = Some(epoch);
            }
            CONSUMER_GROUP_PARTITION_METADATA => {
                let mut topics = BTreeMap::new();
                for _ in 0..r.compact_array_len()? {
                    let id = r.uuid()?;
                    let name = r.compact_str()?;
                    let partitions = r.i32()?;
                    for _ in 0..r.compact_array_len()? {
                        let _partition = r.i32()?;
                        for _ in 0..r.compact_array_len()? {
                            r.compact_str()?;
                        }
                        r.tags()?;
                    }
                    r.tags()?;
                    topics.insert(name, (id, partitions));
                }
                r.tags()?;
                self.groups.entry(group).or_default().topics = Some(topics);
            }
            _ => {
                let epoch = r.i32()?;
                r.tags()?;
                self.groups.entry(group).or_default().assignment_epoch = Some(epoch);
            }
        }
        Ok(())
    }

    fn push_member_part(
        &mut self,
        version: i16,
        group: String,
        member: String,
        value: Option<&[u8]>,
    ) -> Result<(), SchemaError> {
        let Some(value) = value else {
            if let Some(members) = self.members.get_mut(&group) {
                if let Some(part) = members.get_mut(&member) {
                    match version {
                        CONSUMER_GROUP_MEMBER_METADATA => part.metadata = None,
                        CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER => part.target = None,
                        _ => part.current = None,
                    }
                }
            }
            return Ok(());
        };
        let mut r = Reader(value);
        r.version(&[CONSUMER_VALUE_VERSION])?;
        match version {
            CONSUMER_GROUP_MEMBER_METADATA => {
                let instance_id = r.compact_nullable_str()?;
                let rack_id = r.compact_nullable_str()?;
                let client_id = r.compact_str()?;
                let client_host = r.compact_str()?;
                let mut subscribed_topic_names = Vec::new();
                for _ in 0..r.compact_array_len()? {
                    subscribed_topic_names.push(r.compact_str()?);
                }
                let subscribed_topic_regex = r.compact_nullable_str()?;
                let rebalance_timeout_ms = r.i32()?;
                let server_assignor = r.compact_nullable_str()?;
                // Tag 0 is ClassicMemberMetadata, set for members that speak the classic
                // protocol inside a consumer group; other tags are skipped.
                let mut classic = None;
                r.tags_with(|tag, bytes| {
                    if tag == 0 {
                        classic = Reader(bytes).classic_member()?;
                    }
                    Ok(())
                })?;
                let part = self.member_part(group, member);
                part.metadata = Some(MemberMetadata {
                    instance_id,
                    rack_id,
                    client_id,
                    client_host,
                    subscribed_topic_names,
                    subscribed_topic_regex,
                    rebalance_timeout_ms,
                    server_assignor,
                    classic,
                });
            }
            CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER => {
                let target = r.assignment()?;
                r.tags()?;
                self.member_part(group, member).target = Some(target);
            }
            _ => {
                let member_epoch = r.i32()?;
                let previous_member_epoch = r.i32()?;
                let state = member_state(r.i8()?)?;
                let assigned = r.assignment()?;
                let pending_revocation = r.assignment()?;
                r.tags()?;
                self.member_part(group, member).current = Some(CurrentAssignment {
                    member_epoch,
                    previous_member_epoch,
                    state,
                    assigned,
                    pending_revocation,
                });
            }
        }
        Ok(())
    }

    fn member_part(&mut self, group: String, member: String) -> &mut PartialMember {
        self.members
            .entry(group)
            .or_default()
            .entry(member)
            .or_default()
    }

    /// The records to replay, numbered from 1 in the order they must be applied.
    pub fn finish(self) -> Vec<PersistRecord> {
        let Replay {
            mut legacy,
            records,
            groups,
            members,
        } = self;
        legacy.sort_by_key(|r| r.seq);
        let mut out = legacy;
        out.extend(records);
        let mut groups: Vec<(String, PartialGroup)> = groups.into_iter().collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        for (group_id, part) in groups {
            // The three parts are always written together; the epoch alone identifies a group
            // (the others default as for a group that has not computed an assignment yet).
            let Some(group_epoch) = part.epoch else {
                continue;
            };
            out.push(PersistRecord {
                seq: 0,
                group_id,
                body: RecordBody::ConsumerGroupMetadata(ConsumerGroupValue {
                    group_epoch,
                    assignment_epoch: part.assignment_epoch.unwrap_or(0),
                    topics: part.topics.unwrap_or_default(),
                }),
            });
        }
        let mut members: Vec<(String, BTreeMap<String, PartialMember>)> =
            members.into_iter().collect();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        for (group_id, members) in members {
            for (member_id, part) in members {
                // A member's records are written and deleted together; a member with no
                // metadata was deleted.
                let Some(meta) = part.metadata else { continue };
                let current = part.current.unwrap_or(CurrentAssignment {
                    member_epoch: 0,
                    previous_member_epoch: 0,
                    state: ConsumerMemberState::Stable,
                    assigned: Assignment::new(),
                    pending_revocation: Assignment::new(),
                });
                out.push(PersistRecord {
                    seq: 0,
                    group_id: group_id.clone(),
                    body: RecordBody::ConsumerMember {
                        member_id,
                        value: Some(ConsumerMemberValue {
                            instance_id: meta.instance_id,
                            rack_id: meta.rack_id,
                            client_id: meta.client_id,
                            client_host: meta.client_host,
                            subscribed_topic_names: meta.subscribed_topic_names,
                            subscribed_topic_regex: meta.subscribed_topic_regex,
                            server_assignor: meta.server_assignor,
                            rebalance_timeout_ms: meta.rebalance_timeout_ms,
                            member_epoch: current.member_epoch,
                            previous_member_epoch: current.previous_member_epoch,
                            state: current.state,
                            assigned: current.assigned,
                            pending_revocation: current.pending_revocation,
                            target: part.target.unwrap_or_default(),
                            classic: meta.classic,
                        }),
                    },
                });
            }
        }
        for (i, r) in out.iter_mut().enumerate() {
            r.seq = i as u64 + 1;
        }
        out
    }
}

#[cfg(test)]
mod tests;
