//! The Fetch response encoder that keeps record batches out of the encoded buffer.
//!
//! A partition's records in a Fetch response are one length-prefixed byte field, but what the
//! log hands us is a list of stored batches, each its own `Bytes`. kafka-protocol's
//! [`FetchResponse`] holds the field as one `Bytes`, so encoding it as is would mean joining the
//! batches — a copy of every byte served. Instead this module writes the response's fields
//! itself, in the order and with the version rules of kafka-protocol's generated encoder, and
//! emits each partition's records as a length prefix computed from the chunks' total followed by
//! the chunks themselves as separate parts of the frame. The frame is byte-for-byte
//! kafka-protocol's encoding of the same response with the records joined (the tests compare
//! every version).
//!
//! Only the field layout is written here; every nested structure that carries no records
//! (aborted transactions, diverging epoch, current leader, snapshot id, node endpoints) is
//! encoded by kafka-protocol itself.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::protocol::{Encodable, HeaderVersion};

use crate::frame::{encode_header, frame_size, EncodeError, ResponseFrame, SIZE_PREFIX_LEN};

/// Record chunks shorter than this are copied into the encoded part around them: an extra iovec
/// costs more than copying a few hundred bytes.
pub const COPY_BELOW: usize = 512;

/// Fetch versions kafka-protocol encodes, and so the versions this encoder can reproduce.
const VERSIONS: std::ops::RangeInclusive<i16> = 4..=18;

/// First version with compact (flexible) encodings and tagged fields.
const FLEXIBLE: i16 = 12;

/// A Fetch response whose partitions carry their records as lists of chunks.
///
/// The kafka-protocol structs hold every field except where the tree continues here: the
/// response's `responses` must be empty (the topics are [`topics`](Self::topics)), each topic's
/// `partitions` must be empty, and each partition's `records` must hold no bytes (the records
/// are [`FetchPartitionChunks::records`]). Anything set there is refused rather than silently
/// dropped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FetchResponseChunks {
    /// Throttle time, error code, session id, node endpoints and tagged fields.
    pub fields: FetchResponse,
    /// The topics, in response order.
    pub topics: Vec<FetchTopicChunks>,
}

/// One topic of a [`FetchResponseChunks`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FetchTopicChunks {
    /// Name, id and tagged fields.
    pub fields: FetchableTopicResponse,
    /// The partitions, in response order.
    pub partitions: Vec<FetchPartitionChunks>,
}

/// One partition of a [`FetchTopicChunks`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FetchPartitionChunks {
    /// Every field of the partition but its records.
    pub fields: PartitionData,
    /// The records field: `None` is a null field, `Some` the concatenation of the chunks (an
    /// empty list is an empty field). Chunks of at least [`COPY_BELOW`] bytes are written as
    /// their own parts of the frame, never copied.
    pub records: Option<Vec<Bytes>>,
}

impl FetchResponseChunks {
    /// Encodes the whole frame — size prefix, response header, body — at `version`.
    pub fn encode_frame(
        &self,
        correlation_id: i32,
        version: i16,
    ) -> Result<ResponseFrame, EncodeError> {
        if !VERSIONS.contains(&version) {
            return Err(body_error(
                version,
                "version not supported by FetchResponse",
            ));
        }
        let mut out = Writer::default();
        out.current.put_i32(0);
        encode_header(
            &mut out.current,
            correlation_id,
            FetchResponse::header_version(version),
        )?;
        self.encode_body(&mut out, version)?;
        out.finish()
    }

    /// The same response as one kafka-protocol message, records joined: a copy of every record
    /// byte, for comparisons and tests.
    pub fn to_joined(&self) -> FetchResponse {
        let mut response = self.fields.clone();
        response.responses = self
            .topics
            .iter()
            .map(|topic| {
                let mut fields = topic.fields.clone();
                fields.partitions = topic
                    .partitions
                    .iter()
                    .map(|partition| {
                        let mut fields = partition.fields.clone();
                        fields.records = partition.records.as_deref().map(join);
                        fields
                    })
                    .collect();
                fields
            })
            .collect();
        response
    }

    fn encode_body(&self, out: &mut Writer, v: i16) -> Result<(), EncodeError> {
        let f = &self.fields;
        if !f.responses.is_empty() {
            return Err(body_error(v, "responses must be given as topics"));
        }
        let buf = &mut out.current;
        buf.put_i32(f.throttle_time_ms);
        if v >= 7 {
            buf.put_i16(f.error_code);
            buf.put_i32(f.session_id);
        } else if f.session_id != 0 {
            return Err(unavailable(v, "session_id"));
        }
        put_array_len(buf, v, self.topics.len())?;
        for topic in &self.topics {
            topic.encode(out, v)?;
        }
        if v >= FLEXIBLE {
            let buf = &mut out.current;
            let endpoints = v >= 16 && !f.node_endpoints.is_empty();
            // kafka-protocol counts every unknown tagged field, written or not; so do we.
            put_count(
                buf,
                v,
                f.unknown_tagged_fields.len() + usize::from(endpoints),
            )?;
            if endpoints {
                let mut value = BytesMut::new();
                put_array_len(&mut value, v, f.node_endpoints.len())?;
                for endpoint in &f.node_endpoints {
                    encode_struct(&mut value, endpoint, v)?;
                }
                put_tagged(buf, v, 0, &value)?;
            }
            put_unknown_tagged(buf, v, &f.unknown_tagged_fields, 1)?;
        }
        Ok(())
    }
}

impl FetchTopicChunks {
    fn encode(&self, out: &mut Writer, v: i16) -> Result<(), EncodeError> {
        let f = &self.fields;
        if !f.partitions.is_empty() {
            return Err(body_error(
                v,
                "a topic's partitions must be given as chunks",
            ));
        }
        let buf = &mut out.current;
        if v <= 12 {
            put_string(buf, v, f.topic.0.as_str())?;
        }
        if v >= 13 {
            buf.put_slice(f.topic_id.as_bytes());
        }
        put_array_len(buf, v, self.partitions.len())?;
        for partition in &self.partitions {
            partition.encode(out, v)?;
        }
        if v >= FLEXIBLE {
            let buf = &mut out.current;
            put_count(buf, v, f.unknown_tagged_fields.len())?;
            put_unknown_tagged(buf, v, &f.unknown_tagged_fields, 0)?;
        }
        Ok(())
    }
}

impl FetchPartitionChunks {
    fn encode(&self, out: &mut Writer, v: i16) -> Result<(), EncodeError> {
        let f = &self.fields;
        if f.records
            .as_ref()
            .is_some_and(|records| !records.is_empty())
        {
            return Err(body_error(
                v,
                "a partition's records must be given as chunks",
            ));
        }
        let buf = &mut out.current;
        buf.put_i32(f.partition_index);
        buf.put_i16(f.error_code);
        buf.put_i64(f.high_watermark);
        buf.put_i64(f.last_stable_offset);
        if v >= 5 {
            buf.put_i64(f.log_start_offset);
        }
        match &f.aborted_transactions {
            None => put_null_len(buf, v),
            Some(aborted) => {
                put_array_len(buf, v, aborted.len())?;
                for transaction in aborted {
                    encode_struct(buf, transaction, v)?;
                }
            }
        }
        if v >= 11 {
            buf.put_i32(f.preferred_read_replica.0);
        } else if f.preferred_read_replica.0 != -1 {
            return Err(unavailable(v, "preferred_read_replica"));
        }
        out.records(v, self.records.as_deref())?;
        if v >= FLEXIBLE {
            let buf = &mut out.current;
            // Tags 0, 1 and 2, each written only when it differs from its default.
            let diverging = (f.diverging_epoch != Default::default())
                .then(|| encoded(&f.diverging_epoch, v))
                .transpose()?;
            let leader = (f.current_leader != Default::default())
                .then(|| encoded(&f.current_leader, v))
                .transpose()?;
            let snapshot = (f.snapshot_id != Default::default())
                .then(|| encoded(&f.snapshot_id, v))
                .transpose()?;
            let known = [diverging, leader, snapshot];
            let set = known.iter().filter(|value| value.is_some()).count();
            put_count(buf, v, f.unknown_tagged_fields.len() + set)?;
            for (tag, value) in (0..).zip(&known) {
                if let Some(value) = value {
                    put_tagged(buf, v, tag, value)?;
                }
            }
            put_unknown_tagged(buf, v, &f.unknown_tagged_fields, 3)?;
        }
        Ok(())
    }
}

/// The frame being written: encoded parts and record chunks, in wire order.
#[derive(Default)]
struct Writer {
    /// The encoded part being written.
    current: BytesMut,
    /// Parts already finished. The first encoded part starts with the size prefix, which is
    /// patched in [`Writer::finish`], so encoded parts stay mutable until then.
    parts: Vec<Part>,
}

enum Part {
    Encoded(BytesMut),
    Shared(Bytes),
}

impl Writer {
    /// Writes a records field: its length prefix, then the chunks.
    fn records(&mut self, v: i16, records: Option<&[Bytes]>) -> Result<(), EncodeError> {
        let Some(chunks) = records else {
            put_null_len(&mut self.current, v);
            return Ok(());
        };
        let len: usize = chunks.iter().map(Bytes::len).sum();
        if v >= FLEXIBLE {
            // The compact length is len + 1; u32::MAX itself is refused as kafka-protocol does.
            let prefix = u32::try_from(len)
                .ok()
                .and_then(|len| len.checked_add(1))
                .ok_or_else(|| too_long(v, "records", len))?;
            put_uvarint(&mut self.current, prefix);
        } else {
            let prefix = i32::try_from(len).map_err(|_| too_long(v, "records", len))?;
            self.current.put_i32(prefix);
        }
        for chunk in chunks {
            if chunk.len() < COPY_BELOW {
                self.current.extend_from_slice(chunk);
            } else {
                if !self.current.is_empty() {
                    self.parts.push(Part::Encoded(self.current.split()));
                }
                self.parts.push(Part::Shared(chunk.clone()));
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<ResponseFrame, EncodeError> {
        if !self.current.is_empty() {
            self.parts.push(Part::Encoded(self.current.split()));
        }
        let len: usize = self
            .parts
            .iter()
            .map(|part| match part {
                Part::Encoded(bytes) => bytes.len(),
                Part::Shared(bytes) => bytes.len(),
            })
            .sum();
        let size = frame_size(len.saturating_sub(SIZE_PREFIX_LEN))?;
        // The prefix was the first thing written, and an encoded part is never empty, so the
        // first part is encoded and holds it.
        if let Some(Part::Encoded(first)) = self.parts.first_mut() {
            if let Some(prefix) = first.get_mut(..SIZE_PREFIX_LEN) {
                prefix.copy_from_slice(&size.to_be_bytes());
            }
        }
        let parts = self
            .parts
            .into_iter()
            .map(|part| match part {
                Part::Encoded(bytes) => bytes.freeze(),
                Part::Shared(bytes) => bytes,
            })
            .collect();
        Ok(ResponseFrame::from_parts(parts))
    }
}

fn join(chunks: &[Bytes]) -> Bytes {
    let mut joined = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for chunk in chunks {
        joined.extend_from_slice(chunk);
    }
    joined.freeze()
}

fn encoded<M: Encodable>(message: &M, v: i16) -> Result<BytesMut, EncodeError> {
    let mut value = BytesMut::new();
    encode_struct(&mut value, message, v)?;
    Ok(value)
}

fn encode_struct<M: Encodable>(buf: &mut BytesMut, message: &M, v: i16) -> Result<(), EncodeError> {
    message
        .encode(buf, v)
        .map_err(|error| body_error(v, format!("{error:#}")))
}

/// An array length: compact (length + 1, unsigned varint) from v12, else i32.
fn put_array_len(buf: &mut BytesMut, v: i16, len: usize) -> Result<(), EncodeError> {
    if v >= FLEXIBLE {
        let prefix = u32::try_from(len)
            .ok()
            .and_then(|len| len.checked_add(1))
            .ok_or_else(|| too_long(v, "array", len))?;
        put_uvarint(buf, prefix);
    } else {
        buf.put_i32(i32::try_from(len).map_err(|_| too_long(v, "array", len))?);
    }
    Ok(())
}

/// The length of a null array or null bytes.
fn put_null_len(buf: &mut BytesMut, v: i16) {
    if v >= FLEXIBLE {
        put_uvarint(buf, 0);
    } else {
        buf.put_i32(-1);
    }
}

/// A non-null string: compact from v12, else an i16 length.
fn put_string(buf: &mut BytesMut, v: i16, s: &str) -> Result<(), EncodeError> {
    if v >= FLEXIBLE {
        let prefix = u32::try_from(s.len())
            .ok()
            .and_then(|len| len.checked_add(1))
            .ok_or_else(|| too_long(v, "string", s.len()))?;
        put_uvarint(buf, prefix);
    } else {
        buf.put_i16(i16::try_from(s.len()).map_err(|_| too_long(v, "string", s.len()))?);
    }
    buf.put_slice(s.as_bytes());
    Ok(())
}

fn put_count(buf: &mut BytesMut, v: i16, count: usize) -> Result<(), EncodeError> {
    put_uvarint(
        buf,
        u32::try_from(count).map_err(|_| too_long(v, "tagged fields", count))?,
    );
    Ok(())
}

fn put_tagged(buf: &mut BytesMut, v: i16, tag: u32, value: &[u8]) -> Result<(), EncodeError> {
    put_uvarint(buf, tag);
    put_uvarint(
        buf,
        u32::try_from(value.len()).map_err(|_| too_long(v, "tagged field", value.len()))?,
    );
    buf.put_slice(value);
    Ok(())
}

/// Unknown tagged fields from tag `first` up, in tag order, after the known ones.
fn put_unknown_tagged(
    buf: &mut BytesMut,
    v: i16,
    fields: &BTreeMap<i32, Bytes>,
    first: i32,
) -> Result<(), EncodeError> {
    for (&tag, value) in fields.range(first..) {
        // Tags are non-negative here (the range starts at 0 or above), so the cast is exact.
        put_tagged(buf, v, tag.unsigned_abs(), value)?;
    }
    Ok(())
}

fn put_uvarint(buf: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        buf.put_u8((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

fn body_error(version: i16, reason: impl Into<String>) -> EncodeError {
    EncodeError::Body {
        version,
        reason: reason.into(),
    }
}

fn unavailable(version: i16, field: &str) -> EncodeError {
    body_error(
        version,
        format!("{field} is set but not available in FetchResponse v{version}"),
    )
}

fn too_long(version: i16, what: &str, len: usize) -> EncodeError {
    body_error(version, format!("{what} too long to encode ({len})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_response;
    use crate::testutil::Rng;
    use kafka_protocol::messages::fetch_response::{
        AbortedTransaction, EpochEndOffset, LeaderIdAndEpoch, NodeEndpoint, SnapshotId,
    };
    use kafka_protocol::messages::{BrokerId, ProducerId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    const CORRELATION_ID: i32 = 0x0102_0304;

    /// Encodes `response` at `version` both ways and checks the frames are the same bytes (or
    /// both refused), and that every chunk of at least `COPY_BELOW` bytes went out as its own
    /// part, from the chunk's own memory.
    fn check(response: &FetchResponseChunks, version: i16, case: &str) -> bool {
        let joined = response.to_joined();
        let expected = encode_response(
            CORRELATION_ID,
            FetchResponse::header_version(version),
            &joined,
            version,
        );
        let frame = response.encode_frame(CORRELATION_ID, version);
        let frame = match (expected, frame) {
            (Ok(expected), Ok(frame)) => {
                assert_eq!(frame.to_contiguous(), expected, "{case} v{version}");
                assert_eq!(frame.wire_len(), expected.len(), "{case} v{version}");
                frame
            }
            (Err(_), Err(_)) => return false,
            (expected, frame) => panic!(
                "{case} v{version}: kafka-protocol {:?}, chunked {:?}",
                expected.map(|b| b.len()),
                frame.map(|f| f.wire_len())
            ),
        };
        assert!(frame.parts().iter().all(|part| !part.is_empty()));
        let shared: Vec<&Bytes> = response
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .flat_map(|p| p.records.iter().flatten())
            .filter(|chunk| chunk.len() >= COPY_BELOW)
            .collect();
        let mut parts = frame.parts().iter();
        for chunk in shared {
            // In order, each one a part of its own pointing at the chunk's memory.
            assert!(
                parts.any(|part| part.as_ptr() == chunk.as_ptr() && part.len() == chunk.len()),
                "{case} v{version}: a {}-byte chunk was copied",
                chunk.len()
            );
        }
        true
    }

    fn chunk(len: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; len])
    }

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    fn partition(index: i32, records: Option<Vec<Bytes>>) -> FetchPartitionChunks {
        let mut fields = PartitionData::default();
        fields.partition_index = index;
        fields.high_watermark = 1000 + i64::from(index);
        fields.last_stable_offset = 990;
        fields.log_start_offset = 7;
        FetchPartitionChunks { fields, records }
    }

    fn topic(
        topic: &'static str,
        id: u128,
        partitions: Vec<FetchPartitionChunks>,
    ) -> FetchTopicChunks {
        let mut fields = FetchableTopicResponse::default();
        fields.topic = name(topic);
        fields.topic_id = uuid::Uuid::from_u128(id);
        FetchTopicChunks { fields, partitions }
    }

    fn response(topics: Vec<FetchTopicChunks>) -> FetchResponseChunks {
        FetchResponseChunks {
            fields: FetchResponse::default(),
            topics,
        }
    }

    /// Sets every optional field and tagged field a flexible version can carry, at every level.
    fn with_everything(mut response: FetchResponseChunks) -> FetchResponseChunks {
        let f = &mut response.fields;
        f.throttle_time_ms = 250;
        f.error_code = 0;
        f.node_endpoints = vec![
            NodeEndpoint::default()
                .with_node_id(BrokerId(3))
                .with_host(StrBytes::from_static_str("broker-3.example"))
                .with_port(9092)
                .with_rack(Some(StrBytes::from_static_str("rack-a"))),
            NodeEndpoint::default()
                .with_node_id(BrokerId(1001))
                .with_host(StrBytes::from_static_str("h"))
                .with_port(19092),
        ];
        f.unknown_tagged_fields
            .insert(5, Bytes::from_static(b"top"));
        for topic in &mut response.topics {
            topic
                .fields
                .unknown_tagged_fields
                .insert(0, Bytes::from_static(b"topic-tag"));
            for p in &mut topic.partitions {
                let f = &mut p.fields;
                f.diverging_epoch = EpochEndOffset::default().with_epoch(4).with_end_offset(400);
                f.current_leader = LeaderIdAndEpoch::default()
                    .with_leader_id(BrokerId(3))
                    .with_leader_epoch(9);
                f.snapshot_id = SnapshotId::default().with_end_offset(77).with_epoch(2);
                f.aborted_transactions = Some(vec![AbortedTransaction::default()
                    .with_producer_id(ProducerId(42))
                    .with_first_offset(100)]);
                f.unknown_tagged_fields
                    .insert(3, Bytes::from_static(b"partition-tag"));
                f.unknown_tagged_fields.insert(200, chunk(300, 9));
            }
        }
        response
    }

    fn shapes() -> Vec<(&'static str, FetchResponseChunks)> {
        let several = vec![chunk(700, 1), chunk(100, 2), chunk(4096, 3), chunk(511, 4)];
        let many_topics = (0..5)
            .map(|t| {
                let partitions = (0..7)
                    .map(|p| {
                        let records = (0..p).map(|b| chunk(200 * b + 300, p as u8)).collect();
                        partition(p as i32, Some(records))
                    })
                    .collect();
                topic(
                    ["a", "bb", "orders", "x", "long-topic-name"][t],
                    t as u128 + 1,
                    partitions,
                )
            })
            .collect();
        let mut errors = response(vec![topic(
            "t",
            1,
            vec![partition(0, Some(vec![])), partition(1, Some(vec![]))],
        )]);
        for p in &mut errors.topics[0].partitions {
            p.fields.error_code = 1; // OFFSET_OUT_OF_RANGE
            p.fields.high_watermark = -1;
            p.fields.last_stable_offset = -1;
        }
        let mut session_error = response(vec![]);
        session_error.fields.error_code = 70; // FETCH_SESSION_ID_NOT_FOUND
        let mut replica = response(vec![topic("t", 1, vec![partition(0, None)])]);
        replica.topics[0].partitions[0]
            .fields
            .preferred_read_replica = BrokerId(2);
        let mut session = response(vec![]);
        session.fields.session_id = 12;
        vec![
            ("no topics", response(vec![])),
            (
                "topic without partitions",
                response(vec![topic("t", 1, vec![])]),
            ),
            (
                "null records",
                response(vec![topic("t", 1, vec![partition(0, None)])]),
            ),
            (
                "empty records",
                response(vec![topic("t", 1, vec![partition(0, Some(vec![]))])]),
            ),
            (
                "one small batch",
                response(vec![topic(
                    "t",
                    1,
                    vec![partition(0, Some(vec![chunk(61, 5)]))],
                )]),
            ),
            (
                "one batch",
                response(vec![topic(
                    "t",
                    1,
                    vec![partition(0, Some(vec![chunk(4096, 5)]))],
                )]),
            ),
            (
                "several batches",
                response(vec![topic(
                    "t",
                    1,
                    vec![partition(0, Some(several.clone()))],
                )]),
            ),
            ("many topics and partitions", response(many_topics)),
            ("partition errors", errors),
            ("response error", session_error),
            ("preferred read replica", replica),
            ("session id", session),
            (
                "everything set",
                with_everything(response(vec![
                    topic(
                        "t",
                        1,
                        vec![partition(0, Some(several)), partition(1, None)],
                    ),
                    topic("u", 2, vec![partition(3, Some(vec![chunk(2000, 8)]))]),
                ])),
            ),
        ]
    }

    #[test]
    fn every_version_and_shape_encodes_as_kafka_protocol_does() {
        for (case, response) in shapes() {
            for version in VERSIONS {
                let refused = match case {
                    "preferred read replica" => version < 11,
                    "session id" => version < 7,
                    _ => false,
                };
                assert_eq!(
                    check(&response, version, case),
                    !refused,
                    "{case} v{version}"
                );
            }
        }
    }

    /// Responses of random shape with every field randomly set or left default, including
    /// fields a version cannot carry (both encoders must then refuse). The seed is in the
    /// failure message.
    #[test]
    fn random_responses_encode_as_kafka_protocol_does() {
        let seed = 0x000f_e7c4_5eed_0001;
        let mut rng = Rng::new(seed);
        let coin = |rng: &mut Rng, odds: usize| rng.below(odds) == 0;
        let mut encoded = 0;
        for round in 0..400 {
            let mut topics = Vec::new();
            for t in 0..rng.below(4) {
                let mut partitions = Vec::new();
                for p in 0..rng.below(5) {
                    let records = (!coin(&mut rng, 8)).then(|| {
                        (0..rng.below(5))
                            .map(|_| {
                                let len = [0, 1, 61, 511, 512, 513, 3000][rng.below(7)];
                                Bytes::from(rng.bytes(len))
                            })
                            .collect()
                    });
                    let mut part = partition(p as i32, records);
                    let f = &mut part.fields;
                    if coin(&mut rng, 4) {
                        f.error_code = rng.below(120) as i16;
                    }
                    if coin(&mut rng, 5) {
                        f.aborted_transactions = Some(vec![]);
                    }
                    if coin(&mut rng, 8) {
                        f.preferred_read_replica = BrokerId(rng.below(5) as i32);
                    }
                    if coin(&mut rng, 4) {
                        f.diverging_epoch = EpochEndOffset::default().with_epoch(1);
                    }
                    if coin(&mut rng, 4) {
                        f.current_leader = LeaderIdAndEpoch::default().with_leader_epoch(5);
                    }
                    if coin(&mut rng, 4) {
                        f.snapshot_id = SnapshotId::default().with_epoch(3);
                    }
                    if coin(&mut rng, 6) {
                        f.unknown_tagged_fields
                            .insert(rng.below(300) as i32, Bytes::from(rng.bytes(3)));
                    }
                    partitions.push(part);
                }
                topics.push(topic(
                    ["p", "q", "r", "s"][t],
                    rng.next_u64() as u128,
                    partitions,
                ));
            }
            let mut response = response(topics);
            let f = &mut response.fields;
            f.throttle_time_ms = rng.below(1000) as i32;
            if coin(&mut rng, 4) {
                f.error_code = rng.below(120) as i16;
            }
            if coin(&mut rng, 10) {
                f.session_id = 1;
            }
            if coin(&mut rng, 4) {
                f.node_endpoints = vec![NodeEndpoint::default().with_node_id(BrokerId(1))];
            }
            if coin(&mut rng, 6) {
                f.unknown_tagged_fields
                    .insert(rng.below(4) as i32, Bytes::from(rng.bytes(2)));
            }
            for version in VERSIONS {
                encoded += usize::from(check(
                    &response,
                    version,
                    &format!("seed {seed:#x} round {round}"),
                ));
            }
        }
        // Most are encodable, so the comparison is not vacuous.
        assert!(encoded > 400 * 15 / 2, "{encoded}");
    }

    #[test]
    fn batches_over_a_128_mib_response_are_not_copied() {
        // Zeroed allocations the encoder never reads: address space, not memory.
        let batches: Vec<Bytes> = (0..3).map(|_| Bytes::from(vec![0u8; 60 << 20])).collect();
        let response = response(vec![topic(
            "big",
            1,
            vec![partition(0, Some(batches.clone()))],
        )]);
        for version in [4, 11, 12, 16] {
            let frame = response.encode_frame(CORRELATION_ID, version).unwrap();
            // The encoded head, the batches, and from v12 the partition's tagged fields after.
            let trailer = usize::from(version >= FLEXIBLE);
            assert_eq!(
                frame.parts().len(),
                1 + batches.len() + trailer,
                "v{version}"
            );
            for (part, batch) in frame.parts()[1..].iter().zip(&batches) {
                assert_eq!((part.as_ptr(), part.len()), (batch.as_ptr(), batch.len()));
            }
        }
    }

    #[test]
    fn fields_set_outside_the_chunk_tree_are_refused() {
        let mut records_in_fields = response(vec![topic("t", 1, vec![partition(0, None)])]);
        records_in_fields.topics[0].partitions[0].fields.records = Some(chunk(10, 1));
        let mut partitions_in_fields = response(vec![topic("t", 1, vec![])]);
        partitions_in_fields.topics[0].fields.partitions = vec![PartitionData::default()];
        let mut topics_in_fields = response(vec![]);
        topics_in_fields.fields.responses = vec![FetchableTopicResponse::default()];
        for response in [records_in_fields, partitions_in_fields, topics_in_fields] {
            assert!(matches!(
                response.encode_frame(1, 12),
                Err(EncodeError::Body { version: 12, .. })
            ));
        }
        assert!(response(vec![]).encode_frame(1, 3).is_err());
        assert!(response(vec![]).encode_frame(1, 19).is_err());
    }
}
