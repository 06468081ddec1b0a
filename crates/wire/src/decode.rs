//! Request body decoding that a hostile client cannot turn into a crash.
//!
//! kafka-protocol 0.18 decodes arrays with `Vec::with_capacity(n)`, where `n` is the length read
//! from the wire (an `i32` for classic arrays, an unsigned varint for compact ones), before it has
//! decoded a single element. A flexible Metadata request of a dozen bytes whose compact topic
//! array claims 2^32 - 2 entries asks the allocator for about 300 GB, the allocation fails, and
//! Rust aborts the process (`handle_alloc_error`), which `catch_unwind` cannot intercept —
//! observed with kafka-protocol 0.18.0 on this project's machines. Upstream pull requests
//! that bound the capacity by the remaining input exist but are not released. Until they are (and
//! the workspace can take the fix through `[patch.crates-io]`), [`decode_request`] guards the
//! decoder from the outside:
//!
//! * Every array element occupies at least one byte on the wire, so a length larger than the
//!   bytes left can only belong to a malformed request. Such lengths are what must never reach
//!   `with_capacity`. (Kafka's own generated Java decoders refuse them the same way.)
//! * The decoder reads through `GuardedBuf`, our `ByteBuf`, which sees every integer it reads.
//!   Unsigned varints in message bodies are always structural (lengths, tagged-field counts, tags
//!   and sizes), so one announcing more than 1024 entries and more than the bytes left is
//!   rejected outright; tags that large do not exist in Kafka's schemas.
//! * An `i32`, though, may be an array length or an ordinary field (`max_bytes`, `session_id`,
//!   `timeout_ms`), which the reader cannot tell apart. So a first, probing decode clamps every
//!   `i32` above 1024 that exceeds the bytes left down to "bytes left + 1": an array length thus
//!   clamped makes the probe fail without a large allocation, while an ordinary field only gets
//!   a wrong value. If the probe clamped nothing its result is the answer; if it clamped and
//!   still succeeded, every clamped value was an ordinary field (structure never depends on
//!   them), so an unguarded decode of the same bytes takes the same path and is safe.
//!   This relies on array elements never being zero bytes wide, which holds for every request
//!   message of kafka-protocol 0.18 at every version where its array is present (checked by
//!   walking the generated decoders; zero-width structs exist only at versions where no array of
//!   them is read).
//! * Lengths up to the bytes left still let an allocation reach "bytes left × element size", the
//!   an amplification inherent to decoding into owned structs: keep the frame limit given to
//!   `try_split_frame` in the megabytes, not gigabytes.
//! * Anything that still panics inside the decoder is caught with `catch_unwind` and reported as
//!   a malformed body (this needs the default `panic = "unwind"`).

use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::{Buf, Bytes, TryGetError};
use kafka_protocol::messages::{ApiKey, RequestKind};
use kafka_protocol::protocol::buf::ByteBuf;
use kafka_protocol::protocol::Decodable;

use crate::frame::{FrameError, RequestApi, RequestHeaderInfo};

/// Lengths up to this many entries are trusted even when they exceed the bytes left: the
/// allocation they can cause is small, and tags and tagged-field counts stay far below it.
const TRUSTED_LENGTH: u64 = 1024;

/// Decodes the body of a supported request, never panicking or aborting on malformed input.
///
/// `body` is the frame after [`parse_request_header`](crate::frame::parse_request_header), which
/// must have returned [`RequestApi::Supported`]. Bytes left over after the body are ignored, as
/// Kafka does. See the module documentation for how the decoder is guarded.
pub fn decode_request(header: &RequestHeaderInfo, body: &Bytes) -> Result<RequestKind, FrameError> {
    let RequestApi::Supported { key, .. } = &header.api else {
        return Err(FrameError::Unsupported {
            api_key: header.api_key,
            api_version: header.api_version,
        });
    };
    let key = *key;
    let version = header.api_version;
    let malformed = |reason: String| FrameError::MalformedBody {
        api_key: key,
        api_version: version,
        reason,
    };

    let mut probe = GuardedBuf::new(body.clone());
    let probed = catch_unwind(AssertUnwindSafe(|| decode_body(key, &mut probe, version)));
    if let Some(rejected) = probe.rejected {
        return Err(malformed(format!(
            "length {} exceeds the {} bytes left",
            rejected.length, rejected.available
        )));
    }
    let decoded = match probed {
        Err(_) => return Err(malformed("decoder panicked".into())),
        Ok(Err(reason)) => return Err(malformed(reason)),
        Ok(Ok(decoded)) => decoded,
    };
    if !probe.clamped {
        return Ok(decoded);
    }
    // The probe succeeded with some ordinary i32 fields clamped; decode again for their values.
    let mut plain = body.clone();
    match catch_unwind(AssertUnwindSafe(|| decode_body(key, &mut plain, version))) {
        Ok(Ok(decoded)) => Ok(decoded),
        Ok(Err(reason)) => Err(malformed(reason)),
        Err(_) => Err(malformed("decoder panicked".into())),
    }
}

macro_rules! decode_by_key {
    ($key:expr, $buf:expr, $version:expr, [$($api:ident),* $(,)?]) => {
        match $key {
            $(ApiKey::$api => Decodable::decode($buf, $version).map(RequestKind::$api),)*
        }
    };
}

/// `RequestKind::decode`, but generic over the buffer so the guard can sit underneath. The match
/// is exhaustive, so a kafka-protocol upgrade that adds an api fails to compile here until the
/// list is extended.
fn decode_body<B: ByteBuf>(key: ApiKey, buf: &mut B, version: i16) -> Result<RequestKind, String> {
    decode_by_key!(
        key,
        buf,
        version,
        [
            Produce,
            Fetch,
            ListOffsets,
            Metadata,
            OffsetCommit,
            OffsetFetch,
            FindCoordinator,
            JoinGroup,
            Heartbeat,
            LeaveGroup,
            SyncGroup,
            DescribeGroups,
            ListGroups,
            SaslHandshake,
            ApiVersions,
            CreateTopics,
            DeleteTopics,
            DeleteRecords,
            InitProducerId,
            OffsetForLeaderEpoch,
            AddPartitionsToTxn,
            AddOffsetsToTxn,
            EndTxn,
            WriteTxnMarkers,
            TxnOffsetCommit,
            DescribeAcls,
            CreateAcls,
            DeleteAcls,
            DescribeConfigs,
            AlterConfigs,
            AlterReplicaLogDirs,
            DescribeLogDirs,
            SaslAuthenticate,
            CreatePartitions,
            CreateDelegationToken,
            RenewDelegationToken,
            ExpireDelegationToken,
            DescribeDelegationToken,
            DeleteGroups,
            ElectLeaders,
            IncrementalAlterConfigs,
            AlterPartitionReassignments,
            ListPartitionReassignments,
            OffsetDelete,
            DescribeClientQuotas,
            AlterClientQuotas,
            DescribeUserScramCredentials,
            AlterUserScramCredentials,
            Vote,
            BeginQuorumEpoch,
            EndQuorumEpoch,
            DescribeQuorum,
            AlterPartition,
            UpdateFeatures,
            Envelope,
            FetchSnapshot,
            DescribeCluster,
            DescribeProducers,
            BrokerRegistration,
            BrokerHeartbeat,
            UnregisterBroker,
            DescribeTransactions,
            ListTransactions,
            AllocateProducerIds,
            ConsumerGroupHeartbeat,
            ConsumerGroupDescribe,
            ControllerRegistration,
            GetTelemetrySubscriptions,
            PushTelemetry,
            AssignReplicasToDirs,
            ListConfigResources,
            DescribeTopicPartitions,
            ShareGroupHeartbeat,
            ShareGroupDescribe,
            ShareFetch,
            ShareAcknowledge,
            AddRaftVoter,
            RemoveRaftVoter,
            UpdateRaftVoter,
            InitializeShareGroupState,
            ReadShareGroupState,
            WriteShareGroupState,
            DeleteShareGroupState,
            ReadShareGroupStateSummary,
            DescribeShareGroupOffsets,
            AlterShareGroupOffsets,
            DeleteShareGroupOffsets,
        ]
    )
    .map_err(|error| format!("{error:#}"))
}

#[derive(Debug, Clone, Copy)]
struct Rejected {
    length: u64,
    available: usize,
}

/// The read side of the guard: a `Bytes` cursor that vets the integers the decoder reads.
struct GuardedBuf {
    inner: Bytes,
    /// Some i32 above the trusted size exceeded the bytes left and was clamped.
    clamped: bool,
    /// A varint length exceeded the bytes left; the decode was failed on purpose.
    rejected: Option<Rejected>,
}

impl GuardedBuf {
    fn new(inner: Bytes) -> Self {
        Self {
            inner,
            clamped: false,
            rejected: None,
        }
    }
}

/// Reads an unsigned varint at the front of `bytes` exactly as kafka-protocol's decoder does (at
/// most five bytes, high bits beyond 32 dropped); returns the value and its encoded length, or
/// `None` if the bytes end first.
fn peek_unsigned_varint(bytes: &[u8]) -> Option<(u32, usize)> {
    let mut value: u32 = 0;
    for (index, byte) in bytes.iter().take(5).enumerate() {
        value |= u32::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 || index == 4 {
            return Some((value, index + 1));
        }
    }
    None
}

impl Buf for GuardedBuf {
    fn remaining(&self) -> usize {
        self.inner.remaining()
    }

    fn chunk(&self) -> &[u8] {
        self.inner.chunk()
    }

    fn advance(&mut self, cnt: usize) {
        self.inner.advance(cnt)
    }

    /// Single bytes are booleans or varint bytes. A byte with the continuation bit set starts (or
    /// continues) a varint, which in a message body is always a length, count, tag or size.
    fn try_get_u8(&mut self) -> Result<u8, TryGetError> {
        let Some(&first) = self.inner.first() else {
            return Err(TryGetError {
                requested: 1,
                available: 0,
            });
        };
        if first & 0x80 != 0 {
            if let Some((value, len)) = peek_unsigned_varint(&self.inner) {
                // Compact encodings store length + 1, with 0 for null.
                let length = u64::from(value).saturating_sub(1);
                let available = self.inner.len() - len;
                if length > TRUSTED_LENGTH && length > available as u64 {
                    self.rejected = Some(Rejected { length, available });
                    return Err(TryGetError {
                        requested: usize::try_from(length).unwrap_or(usize::MAX),
                        available,
                    });
                }
            }
        }
        self.inner.advance(1);
        Ok(first)
    }

    fn try_get_i32(&mut self) -> Result<i32, TryGetError> {
        let value = self.inner.try_get_i32()?;
        let available = self.inner.len();
        if let Ok(length) = u64::try_from(value) {
            if length > TRUSTED_LENGTH && length > available as u64 {
                self.clamped = true;
                return Ok(i32::try_from(available + 1).unwrap_or(i32::MAX));
            }
        }
        Ok(value)
    }
}

impl ByteBuf for GuardedBuf {
    // kafka-protocol only calls these through the `try_` variants, which check the length
    // first; clamping here keeps even a direct call from panicking.
    fn peek_bytes(&mut self, r: std::ops::Range<usize>) -> Bytes {
        if r.start <= r.end && r.end <= self.inner.len() {
            self.inner.slice(r)
        } else {
            Bytes::new()
        }
    }

    fn get_bytes(&mut self, size: usize) -> Bytes {
        self.inner.split_to(size.min(self.inner.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::parse_request_header;
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::{FetchRequest, MetadataRequest, ProduceRequest, RequestHeader};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn request_frame_body<M: Encodable>(key: ApiKey, version: i16, message: &M) -> Bytes {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(77)
            .with_client_id(Some(StrBytes::from_static_str("test")))
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        message.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    fn decode(frame: Bytes) -> Result<RequestKind, FrameError> {
        let mut frame = frame;
        let header = parse_request_header(&mut frame).unwrap();
        decode_request(&header, &frame)
    }

    /// The guarded decode must agree with kafka-protocol's own on well-formed input.
    fn assert_decodes_like_upstream(key: ApiKey, version: i16, frame: Bytes) {
        let mut body = frame.clone();
        parse_request_header(&mut body).unwrap();
        let upstream = RequestKind::decode(key, &mut body, version).unwrap();
        assert_eq!(decode(frame).unwrap(), upstream, "{key:?} v{version}");
    }

    #[test]
    fn well_formed_requests_decode_like_kafka_protocol_does() {
        let fetch = FetchRequest::default()
            .with_max_wait_ms(500)
            .with_max_bytes(52_428_800) // far above the bytes left: clamped in the probe
            .with_session_id(0x7abc_def0);
        for version in [4, 7, 11, 12, 17] {
            let frame = request_frame_body(ApiKey::Fetch, version, &fetch);
            assert_decodes_like_upstream(ApiKey::Fetch, version, frame);
        }
        let decoded = decode(request_frame_body(ApiKey::Fetch, 12, &fetch)).unwrap();
        assert_eq!(decoded, RequestKind::Fetch(fetch));
        let produce = ProduceRequest::default()
            .with_timeout_ms(30_000)
            .with_acks(-1);
        for version in [3, 8, 9, 11] {
            let frame = request_frame_body(ApiKey::Produce, version, &produce);
            assert_decodes_like_upstream(ApiKey::Produce, version, frame);
        }
    }

    /// The eight bytes from the upstream report: a Metadata v0 body claiming 54 million topics.
    /// Unguarded, kafka-protocol asks for ~3.6 GiB up front and the process aborts.
    #[test]
    fn huge_array_length_is_rejected_without_allocating() {
        let mut frame = BytesMut::new();
        frame.put_i16(ApiKey::Metadata as i16);
        frame.put_i16(0);
        frame.put_i32(1); // correlation id
        frame.put_i16(-1); // null client id
        frame.put_i32(0x033c_0c00); // topics array length
        frame.put_u8(0xb6);
        match decode(frame.freeze()) {
            Err(FrameError::MalformedBody {
                api_key: ApiKey::Metadata,
                ..
            }) => {}
            other => panic!("expected a malformed body, got {other:?}"),
        }
    }

    #[test]
    fn huge_compact_array_length_is_rejected_without_allocating() {
        // Metadata v12 is flexible: the topics array length is an unsigned varint.
        let mut frame = BytesMut::new();
        frame.put_i16(ApiKey::Metadata as i16);
        frame.put_i16(12);
        frame.put_i32(1);
        frame.put_i16(-1);
        frame.put_u8(0); // no tagged fields in the header
        frame.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // 2^32 - 1 → 2^32 - 2 topics
        let error = decode(frame.freeze()).unwrap_err();
        assert!(
            error.to_string().contains("exceeds the"),
            "unexpected error {error}"
        );
    }

    #[test]
    fn large_but_honest_arrays_still_decode() {
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        use kafka_protocol::messages::TopicName;
        let topics = (0..3000)
            .map(|i| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(format!("t{i}")))))
            })
            .collect();
        let metadata = MetadataRequest::default().with_topics(Some(topics));
        for version in [1, 4, 9, 12] {
            let frame = request_frame_body(ApiKey::Metadata, version, &metadata);
            assert_decodes_like_upstream(ApiKey::Metadata, version, frame);
        }
    }

    #[test]
    fn unsupported_requests_are_not_decoded() {
        let mut frame = BytesMut::new();
        frame.put_i16(ApiKey::Produce as i16);
        frame.put_i16(99);
        frame.put_i32(5);
        let mut frame = frame.freeze();
        let header = parse_request_header(&mut frame).unwrap();
        assert_eq!(
            decode_request(&header, &frame),
            Err(FrameError::Unsupported {
                api_key: 0,
                api_version: 99
            })
        );
    }

    #[test]
    fn varint_peek_matches_the_decoder() {
        assert_eq!(peek_unsigned_varint(&[0x05]), Some((5, 1)));
        assert_eq!(peek_unsigned_varint(&[0x80, 0x01]), Some((128, 2)));
        assert_eq!(
            peek_unsigned_varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Some((u32::MAX, 5))
        );
        assert_eq!(peek_unsigned_varint(&[0x80, 0x80]), None);
    }
}
