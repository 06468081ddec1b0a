//! Produce, Fetch and ListOffsets semantics seen by clients: pipelined produce requests keep
//! their order, fetching from the middle of a batch, finding offsets by timestamp, and record
//! batches passed through byte for byte.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kafka_protocol::messages::{FetchRequest, ProduceRequest};
use strata_tests::batch::{self, BatchRecord, Codec};
use strata_tests::clients::{
    consume_exactly, create_topic, offsets_for_times, produce_all, producer,
};
use strata_tests::raw::{
    decode_response, produce_partition_response, produce_request, RawConnection, ReadOutcome,
    FETCH_VERSION_CAP, PRODUCE_VERSION_CAP, READ_TIMEOUT,
};
use strata_tests::records::{assert_same_content, now_ms, numbered_records, TestRecord};
use strata_tests::StrataProcess;

const ONE_MIB: i32 = 1 << 20;

/// Settings that hold records until 100 are queued, so they leave as one batch.
const ONE_BATCH: [(&str, &str); 3] = [
    ("linger.ms", "1000"),
    ("batch.num.messages", "100"),
    ("batch.size", "1000000"),
];

/// Produces `records` to partition 0 as one batch and checks, over a raw Fetch, that the
/// broker holds them as one batch starting at offset 0 — the precondition of the tests that
/// look inside a batch.
async fn produce_one_batch(
    broker: &StrataProcess,
    topic: &str,
    codec: &str,
    records: &[TestRecord],
) {
    let mut settings = ONE_BATCH.to_vec();
    settings.push(("compression.type", codec));
    let producer = producer(&broker.bootstrap(), &settings);
    let sent: Vec<_> = records.iter().map(|r| (Some(0), r.clone())).collect();
    let acked = produce_all(&producer, topic, &sent).await;
    let offsets: Vec<i64> = acked.iter().map(|a| a.offset).collect();
    assert_eq!(offsets, (0..records.len() as i64).collect::<Vec<_>>());

    let mut raw = RawConnection::connect(broker.addr());
    let version = RawConnection::negotiate::<FetchRequest>(&raw.api_versions(), FETCH_VERSION_CAP);
    let fetched = raw.fetch(version, topic, 0, 0, ONE_MIB);
    assert_eq!(fetched.error_code, 0, "raw Fetch of {topic} at 0");
    let bytes = fetched.records.unwrap_or_default();
    let batches = batch::split_batches(&bytes);
    assert!(
        !batches.is_empty(),
        "raw Fetch of {topic} at 0 returned no batch"
    );
    assert_eq!(
        (
            batch::base_offset(batches[0]),
            batch::record_span(batches[0])
        ),
        (0, records.len() as i64),
        "precondition: librdkafka sent the {} records as one batch",
        records.len()
    );
}

async fn consuming_from_the_middle_of_a_batch_starts_at_the_requested_offset(codec: &str) {
    let broker = StrataProcess::start();
    let topic = format!("mid-batch-{codec}");
    let records = numbered_records(100, None, 0);
    produce_one_batch(&broker, &topic, codec, &records).await;

    // The broker returns the whole batch holding offset 37; librdkafka must skip 0..=36.
    let consumed = consume_exactly(&broker.bootstrap(), &topic, &[(0, 37)], 63).await;
    for (received, offset) in consumed.iter().zip(37i64..) {
        assert_eq!(received.offset, offset, "consuming from 37");
        assert_same_content(&received.record, &records[offset as usize], 0, offset);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuming_from_the_middle_of_an_uncompressed_batch_starts_at_the_requested_offset() {
    consuming_from_the_middle_of_a_batch_starts_at_the_requested_offset("none").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuming_from_the_middle_of_an_lz4_batch_starts_at_the_requested_offset() {
    consuming_from_the_middle_of_a_batch_starts_at_the_requested_offset("lz4").await;
}

/// Timestamps one second apart, ending a minute ago (recent, so retention never touches them).
fn timestamped_records(count: usize) -> (i64, Vec<TestRecord>) {
    let first = now_ms() - 60_000 - count as i64 * 1000;
    (first, numbered_records(count, Some(first), 1000))
}

/// Kafka's rule: the earliest offset whose timestamp is at or after the one asked for.
async fn assert_offsets_for_times(broker: &StrataProcess, topic: &str, first: i64, count: i64) {
    let last = first + (count - 1) * 1000;
    let queries = [first - 1, first, first + 1, first + 2500, last, last + 1];
    let expected = [Some(0), Some(0), Some(1), Some(3), Some(count - 1), None];
    let answers = offsets_for_times(&broker.bootstrap(), topic, 0, &queries).await;
    for ((query, answer), expected) in queries.iter().zip(&answers).zip(&expected) {
        assert_eq!(
            answer, expected,
            "ListOffsets by timestamp {query} (first record at {first}, 1 s apart)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_by_timestamp_finds_the_first_record_at_or_after_it_across_batches() {
    let broker = StrataProcess::start();
    let topic = "timestamps-across-batches";
    let (first, records) = timestamped_records(10);
    // One record per batch: each produce is acknowledged before the next is sent.
    let producer = producer(&broker.bootstrap(), &[("linger.ms", "0")]);
    for (index, record) in records.iter().enumerate() {
        let acked = produce_all(&producer, topic, &[(Some(0), record.clone())]).await;
        assert_eq!(acked[0].offset, index as i64);
    }
    assert_offsets_for_times(&broker, topic, first, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_by_timestamp_finds_the_first_record_at_or_after_it_inside_one_batch() {
    let broker = StrataProcess::start();
    let topic = "timestamps-inside-a-batch";
    let (first, records) = timestamped_records(10);
    produce_one_batch(&broker, topic, "none", &records).await;
    assert_offsets_for_times(&broker, topic, first, 10).await;
}

/// Twenty records with keys, values and headers, for the hand-built batch below.
fn lz4_test_records() -> Vec<BatchRecord> {
    (0..20)
        .map(|i| BatchRecord {
            key: Some(format!("key-{i}").into_bytes()),
            value: Some(strata_tests::records::payload(i, 200 + i * 10)),
            headers: vec![(b"h".to_vec(), Some(format!("{i}").into_bytes()))],
            timestamp_delta: i as i64,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_batches_are_served_byte_for_byte_with_only_the_base_offset_rewritten() {
    let broker = StrataProcess::start();
    let topic = "lz4-byte-identical";
    create_topic(&broker.bootstrap(), topic, 1, &[]).await;
    let records = lz4_test_records();
    let base_timestamp = now_ms();
    let sent = batch::encode_batch(&records, base_timestamp, Codec::Lz4);

    let mut raw = RawConnection::connect(broker.addr());
    let versions = raw.api_versions();
    let produce_version =
        RawConnection::negotiate::<ProduceRequest>(&versions, PRODUCE_VERSION_CAP);
    let fetch_version = RawConnection::negotiate::<FetchRequest>(&versions, FETCH_VERSION_CAP);
    // The same batch twice: the second copy must come back at base offset 20, bytes unchanged.
    for expected_base in [0, 20] {
        let produced = raw.produce(produce_version, topic, 0, sent.clone());
        assert_eq!(produced.error_code, 0, "Produce of a valid lz4 batch");
        assert_eq!(produced.base_offset, expected_base, "Produce base offset");
    }

    for expected_base in [0i64, 20] {
        let fetched = raw.fetch(fetch_version, topic, 0, expected_base, ONE_MIB);
        assert_eq!(fetched.error_code, 0, "Fetch at {expected_base}");
        let bytes = fetched.records.unwrap_or_default();
        let got = batch::split_batches(&bytes)
            .first()
            .copied()
            .unwrap_or_else(|| panic!("Fetch at {expected_base} returned no whole batch"));
        assert_eq!(
            batch::base_offset(got),
            expected_base,
            "the broker assigns the base offset"
        );
        assert_eq!(got.len(), sent.len(), "batch length");
        // partitionLeaderEpoch (bytes 12..16) is the broker's to set; from the magic byte on —
        // CRC, attributes, timestamps, producer fields and the compressed records — nothing
        // may change.
        assert!(
            got[batch::MAGIC_AT..] == sent[batch::MAGIC_AT..],
            "the batch at {expected_base} differs from the bytes produced after the header"
        );
    }

    // And librdkafka decodes the hand-made lz4 frame to the records that went in.
    let consumed = consume_exactly(&broker.bootstrap(), topic, &[(0, 0)], 40).await;
    for received in &consumed {
        let record = &records[(received.offset % 20) as usize];
        assert_eq!(
            received.record.key, record.key,
            "key at {}",
            received.offset
        );
        assert_eq!(
            received.record.value, record.value,
            "value at {}",
            received.offset
        );
        assert_eq!(
            received.timestamp,
            Some(base_timestamp + record.timestamp_delta),
            "timestamp at {}",
            received.offset
        );
    }
}

/// Kafka appends the requests of one connection in the order they arrived, so a producer that
/// pipelines requests (librdkafka's default allows a million in flight) keeps its per-partition
/// order without idempotence. Large and small batches alternate so that a broker running them
/// concurrently would finish a later, smaller one first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_produce_requests_on_one_connection_are_appended_in_request_order() {
    const REQUESTS: usize = 20;
    let broker = StrataProcess::start();
    let topic = "pipelined-order";
    create_topic(&broker.bootstrap(), topic, 1, &[]).await;
    let mut raw = RawConnection::connect(broker.addr());
    let version =
        RawConnection::negotiate::<ProduceRequest>(&raw.api_versions(), PRODUCE_VERSION_CAP);

    let timestamp = now_ms();
    let correlation_ids: Vec<i32> = (0..REQUESTS)
        .map(|i| {
            let size = if i % 2 == 0 { 400_000 } else { 10 };
            let record = BatchRecord::new(
                format!("request-{i}").as_bytes(),
                &strata_tests::records::payload(i, size),
            );
            let batch = batch::encode_batch(&[record], timestamp, Codec::None);
            raw.send(version, &produce_request(topic, 0, batch))
        })
        .collect();
    let mut base_offsets = Vec::with_capacity(REQUESTS);
    for correlation_id in correlation_ids {
        let ReadOutcome::Frame(frame) = raw.read_frame(READ_TIMEOUT) else {
            panic!("no response to pipelined Produce #{correlation_id}");
        };
        let response = decode_response::<ProduceRequest>(version, correlation_id, frame);
        let answer = produce_partition_response(response, topic, 0);
        assert_eq!(answer.error_code, 0, "pipelined Produce #{correlation_id}");
        base_offsets.push(answer.base_offset);
    }
    assert_eq!(
        base_offsets,
        (0..REQUESTS as i64).collect::<Vec<_>>(),
        "base offsets of {REQUESTS} pipelined one-record Produce requests, in request order"
    );
}
