//! Bad input over a raw TCP socket gets a clear error or a closed connection, never a crash,
//! a hang or a large allocation — and afterwards a well-behaved rdkafka client on another
//! connection still produces and consumes.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::{ApiVersionsRequest, FetchRequest, ProduceRequest};
use kafka_protocol::protocol::Encodable;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use strata_tests::batch::{self, BatchRecord, Codec};
use strata_tests::clients::{
    assert_broker_serves_clients, consume_exactly, create_topic, watermarks,
};
use strata_tests::raw::{
    decode_response_as, encode_frame_with_header, frame, request_header, RawConnection,
    ReadOutcome, FETCH_VERSION_CAP, PRODUCE_VERSION_CAP, READ_TIMEOUT,
};
use strata_tests::records::now_ms;
use strata_tests::StrataProcess;

// Kafka error codes.
const OFFSET_OUT_OF_RANGE: i16 = 1;
const CORRUPT_MESSAGE: i16 = 2;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const UNSUPPORTED_VERSION: i16 = 35;
const INVALID_RECORD: i16 = 87;

const API_KEY_PRODUCE: i16 = 0;
const API_KEY_API_VERSIONS: i16 = 18;

/// A broker with a one-partition topic holding nothing yet.
async fn broker_with_topic(topic: &str) -> StrataProcess {
    let broker = StrataProcess::start();
    create_topic(&broker.bootstrap(), topic, 1, &[]).await;
    broker
}

/// The broker process is still alive and serves a normal client on a fresh connection.
async fn assert_still_serving(broker: &mut StrataProcess, case: &str) {
    assert!(
        broker.is_running(),
        "the broker died after {case}\n{}",
        broker.log_tail()
    );
    assert_broker_serves_clients(&broker.bootstrap(), &format!("alive-after-{case}")).await;
}

fn valid_batch() -> Vec<u8> {
    batch::encode_batch(&[BatchRecord::new(b"key", b"value")], now_ms(), Codec::None)
}

fn produce_version(raw: &mut RawConnection) -> i16 {
    RawConnection::negotiate::<ProduceRequest>(&raw.api_versions(), PRODUCE_VERSION_CAP)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frame_followed_by_close_is_dropped_cleanly() {
    let mut broker = StrataProcess::start();
    let mut raw = RawConnection::connect(broker.addr());
    // Announces 100 bytes, sends 10, then closes its side.
    let mut bytes = 100i32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 10]);
    raw.write_raw(&bytes).expect("write a truncated frame");
    raw.shutdown_write();
    raw.expect_closed("a truncated frame and a half close", READ_TIMEOUT);
    assert_still_serving(&mut broker, "truncated-frame").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_body_of_a_known_api_closes_the_connection() {
    let mut broker = StrataProcess::start();
    let seed = now_ms() as u64;
    eprintln!("garbage seed: {seed}");
    let mut garbage = vec![0u8; 64];
    StdRng::seed_from_u64(seed).fill_bytes(&mut garbage);
    // A valid Produce v3 header (classic, non-flexible) followed by random bytes: the header
    // parses, the body cannot.
    let bytes = encode_frame_with_header(API_KEY_PRODUCE, 3, 1, 1, &garbage);
    let mut raw = RawConnection::connect(broker.addr());
    raw.write_raw(&bytes).expect("write a garbage frame");
    match raw.read_frame(READ_TIMEOUT) {
        ReadOutcome::Closed => {}
        ReadOutcome::Frame(frame) => panic!(
            "the broker answered an unparseable Produce body with a {}-byte frame instead of closing (seed {seed})",
            frame.len()
        ),
        ReadOutcome::TimedOut => panic!("the broker neither answered nor closed (seed {seed})"),
    }
    assert_still_serving(&mut broker, "garbage-body").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_over_the_size_limit_closes_the_connection_without_allocating_it() {
    let mut broker = StrataProcess::start();
    let peak_before = broker.proc_status_bytes("VmPeak");
    let mut raw = RawConnection::connect(broker.addr());
    // Announces ~2 GiB, far over any request size limit; sends only a little of it.
    let announced: i32 = 0x7fff_fff0;
    let mut bytes = announced.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 1024]);
    // The broker may close while we write; that is a pass, and the read below will tell.
    let _ = raw.write_raw(&bytes);
    raw.expect_closed("a frame announcing 2 GiB", READ_TIMEOUT);
    let peak_after = broker.proc_status_bytes("VmPeak");
    let grown = peak_after.saturating_sub(peak_before);
    assert!(
        grown < 1 << 30,
        "the broker's peak virtual memory grew by {grown} bytes after a frame announcing {announced}: it reserved the frame"
    );
    assert_still_serving(&mut broker, "oversized-frame").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_frame_size_closes_the_connection() {
    let mut broker = StrataProcess::start();
    let mut raw = RawConnection::connect(broker.addr());
    let _ = raw.write_raw(&(-1i32).to_be_bytes());
    raw.expect_closed("a frame size of -1", READ_TIMEOUT);
    assert_still_serving(&mut broker, "negative-frame-size").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_api_key_is_answered_with_an_error_or_a_close() {
    let mut broker = StrataProcess::start();
    let mut raw = RawConnection::connect(broker.addr());
    let correlation_id = 4242;
    let mut message = bytes::BytesMut::new();
    request_header(9999, 0, correlation_id)
        .encode(&mut message, 1)
        .expect("encode a header");
    raw.write_raw(&frame(&message))
        .expect("write an unknown API request");
    // Kafka closes the connection (the header does not parse); an error response that
    // carries our correlation id is also a clear answer. Silence is not.
    match raw.read_frame(READ_TIMEOUT) {
        ReadOutcome::Closed => {}
        ReadOutcome::Frame(frame) => {
            assert!(frame.len() >= 4, "a {}-byte response frame", frame.len());
            let answered = i32::from_be_bytes(frame[..4].try_into().expect("4 bytes"));
            assert_eq!(
                answered, correlation_id,
                "the error response's correlation id"
            );
        }
        ReadOutcome::TimedOut => panic!("an unknown API key got neither an answer nor a close"),
    }
    assert_still_serving(&mut broker, "unknown-api-key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_at_an_unsupported_version_answers_v0_with_unsupported_version() {
    let mut broker = StrataProcess::start();
    let mut raw = RawConnection::connect(broker.addr());
    // What a client newer than the broker sends: a flexible (v2) header and a v3+ body.
    let mut body = bytes::BytesMut::new();
    ApiVersionsRequest::default()
        .encode(&mut body, 3)
        .expect("encode an ApiVersions v3 body");
    let correlation_id = 99;
    raw.write_raw(&encode_frame_with_header(
        API_KEY_API_VERSIONS,
        99,
        correlation_id,
        2,
        &body,
    ))
    .expect("write ApiVersions v99");
    let ReadOutcome::Frame(frame) = raw.read_frame(READ_TIMEOUT) else {
        panic!("ApiVersions v99 got no response frame");
    };
    // Kafka answers in v0 so that any client can read it and retry with a version it lists.
    let response: ApiVersionsResponse = decode_response_as(0, correlation_id, frame);
    assert_eq!(
        response.error_code, UNSUPPORTED_VERSION,
        "ApiVersions v99 error code"
    );
    let listed = response
        .api_keys
        .iter()
        .find(|k| k.api_key == API_KEY_API_VERSIONS)
        .expect("the error response still lists ApiVersions' own versions");
    assert_eq!(listed.min_version, 0, "ApiVersions v0 stays supported");
    assert_still_serving(&mut broker, "api-versions-v99").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_with_a_wrong_crc_is_rejected_as_corrupt_and_not_stored() {
    let topic = "bad-crc";
    let mut broker = broker_with_topic(topic).await;
    let mut raw = RawConnection::connect(broker.addr());
    let version = produce_version(&mut raw);
    let answer = raw.produce(version, topic, 0, batch::with_wrong_crc(&valid_batch()));
    assert_eq!(
        answer.error_code, CORRUPT_MESSAGE,
        "Produce with a wrong CRC"
    );
    assert_eq!(
        watermarks(&broker.bootstrap(), topic, 0).await,
        (0, 0),
        "nothing stored"
    );
    // The same connection still works, and the next valid batch takes offset 0.
    let answer = raw.produce(version, topic, 0, valid_batch());
    assert_eq!(
        (answer.error_code, answer.base_offset),
        (0, 0),
        "valid Produce after a corrupt one"
    );
    assert_still_serving(&mut broker, "bad-crc").await;
}

/// Compression bits, random bytes, a valid CRC: Kafka decompresses and answers
/// CORRUPT_MESSAGE. Acknowledged, such a batch stalls librdkafka consumers on the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_compressed_batches_are_rejected_as_corrupt_and_consumers_keep_reading() {
    let topic = "poison";
    let mut broker = broker_with_topic(topic).await;
    let mut raw = RawConnection::connect(broker.addr());
    let version = produce_version(&mut raw);
    assert_eq!(raw.produce(version, topic, 0, valid_batch()).error_code, 0);
    let seed = now_ms() as u64;
    let mut rng = StdRng::seed_from_u64(seed);
    for (codec_id, codec) in [(1, "gzip"), (2, "snappy"), (3, "lz4"), (4, "zstd")] {
        let mut garbage = vec![0u8; 200];
        rng.fill_bytes(&mut garbage);
        let poison = batch::with_compressed_body(codec_id, &garbage, 3);
        let answer = raw.produce(version, topic, 0, poison);
        assert_eq!(
            answer.error_code, CORRUPT_MESSAGE,
            "{codec} batch of random bytes with a valid CRC (seed {seed}): {:?}",
            answer.error_message
        );
    }
    assert_eq!(
        watermarks(&broker.bootstrap(), topic, 0).await,
        (0, 1),
        "nothing of the poison batches stored (seed {seed})"
    );
    assert_eq!(raw.produce(version, topic, 0, valid_batch()).error_code, 0);
    // A real consumer reads the partition from the start to past where the poison was sent.
    let consumed = consume_exactly(&broker.bootstrap(), topic, &[(0, 0)], 2).await;
    assert_eq!(
        consumed.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_still_serving(&mut broker, "poison").await;
}

async fn produce_with_wrong_batch_length(delta: i32, case: &str) {
    let topic = format!("bad-length-{case}");
    let mut broker = broker_with_topic(&topic).await;
    let mut raw = RawConnection::connect(broker.addr());
    let version = produce_version(&mut raw);
    let answer = raw.produce(
        version,
        &topic,
        0,
        batch::with_length_off_by(&valid_batch(), delta),
    );
    assert!(
        [CORRUPT_MESSAGE, INVALID_RECORD].contains(&answer.error_code),
        "Produce with batchLength off by {delta}: error code {} (expected CORRUPT_MESSAGE or INVALID_RECORD)",
        answer.error_code
    );
    assert_eq!(
        watermarks(&broker.bootstrap(), &topic, 0).await,
        (0, 0),
        "nothing stored"
    );
    assert_still_serving(&mut broker, &topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_with_a_batch_length_longer_than_the_bytes_is_rejected() {
    produce_with_wrong_batch_length(10, "longer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_with_a_batch_length_shorter_than_the_bytes_is_rejected() {
    produce_with_wrong_batch_length(-10, "shorter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_to_a_partition_the_topic_does_not_have_is_unknown_topic_or_partition() {
    let topic = "one-partition";
    let mut broker = broker_with_topic(topic).await;
    let mut raw = RawConnection::connect(broker.addr());
    let version = produce_version(&mut raw);
    let answer = raw.produce(version, topic, 5, valid_batch());
    assert_eq!(
        answer.error_code, UNKNOWN_TOPIC_OR_PARTITION,
        "Produce to partition 5 of 1"
    );
    assert_still_serving(&mut broker, "unknown-partition").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_past_the_end_or_before_the_start_is_offset_out_of_range() {
    let topic = "fetch-out-of-range";
    let mut broker = broker_with_topic(topic).await;
    let mut raw = RawConnection::connect(broker.addr());
    let versions = raw.api_versions();
    let produce = RawConnection::negotiate::<ProduceRequest>(&versions, PRODUCE_VERSION_CAP);
    let fetch = RawConnection::negotiate::<FetchRequest>(&versions, FETCH_VERSION_CAP);
    assert_eq!(raw.produce(produce, topic, 0, valid_batch()).error_code, 0);

    // Offset 1 is the end: a valid position that simply has no data yet.
    let at_end = raw.fetch(fetch, topic, 0, 1, 1 << 20);
    assert_eq!(at_end.error_code, 0, "Fetch at the high watermark");
    assert_eq!(at_end.high_watermark, 1);
    for offset in [2, 100, -5] {
        let answer = raw.fetch(fetch, topic, 0, offset, 1 << 20);
        assert_eq!(
            answer.error_code, OFFSET_OUT_OF_RANGE,
            "Fetch at offset {offset} of [0, 1)"
        );
    }
    assert_still_serving(&mut broker, "fetch-out-of-range").await;
}

/// KIP-467: a batch refused because of one record names it. The CRC is valid (computed over the
/// out-of-sequence record), so only the broker's record walk sees the second record's offset
/// delta; the answer is INVALID_RECORD with `record_errors` naming record 1 and an
/// `error_message`, and nothing of the batch is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_one_bad_record_names_it_in_record_errors() {
    let topic = "record-errors";
    let mut broker = broker_with_topic(topic).await;
    let mut raw = RawConnection::connect(broker.addr());
    let version = produce_version(&mut raw);
    assert!(
        version >= 8,
        "record_errors need Produce v8, negotiated v{version}"
    );
    let records = [
        BatchRecord::new(b"k0", b"first"),
        BatchRecord::new(b"k1", b"second"),
        BatchRecord::new(b"k2", b"third"),
    ];
    let bad = batch::encode_batch_with_offset_deltas(&records, now_ms(), Codec::None, &[0, 7, 2]);
    assert!(batch::crc_is_valid(&bad));
    let answer = raw.produce(version, topic, 0, bad);
    assert_eq!(answer.error_code, INVALID_RECORD, "{answer:?}");
    let named: Vec<(i32, String)> = answer
        .record_errors
        .iter()
        .map(|e| {
            (
                e.batch_index,
                e.batch_index_error_message
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(named.len(), 1, "{answer:?}");
    assert_eq!(named[0].0, 1);
    assert!(named[0].1.contains("offset delta 7"), "{named:?}");
    let message = answer
        .error_message
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_default();
    assert!(message.contains("record 1"), "{message}");
    assert_eq!(
        watermarks(&broker.bootstrap(), topic, 0).await,
        (0, 0),
        "nothing stored"
    );
    assert_still_serving(&mut broker, "record-errors").await;
}
