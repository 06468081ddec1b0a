//! Records produced by librdkafka (rdkafka's FutureProducer) come back to librdkafka's consumer
//! exactly once, in order per partition, with the same key, headers and value, at offsets dense
//! from 0 — for every compression codec, on one partition and on eight.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use strata_tests::clients::{
    by_partition, consume_exactly, create_topic, produce_all, producer, watermarks, Acked,
};
use strata_tests::records::{assert_partitions_match, varied_records, TestRecord};
use strata_tests::StrataProcess;

/// Enough records for several batches per partition at the batch size below.
const RECORDS: usize = 600;

async fn round_trip(codec: &str, partitions: i32) {
    let broker = StrataProcess::start();
    let bootstrap = broker.bootstrap();
    let topic = format!("round-trip-{codec}-{partitions}p");
    if partitions > 1 {
        create_topic(&bootstrap, &topic, partitions, &[]).await;
    } // else: the first produce auto-creates it, as it does against Kafka.

    let sent: Vec<(Option<i32>, TestRecord)> = varied_records(RECORDS)
        .into_iter()
        .enumerate()
        .map(|(i, record)| (Some(i as i32 % partitions), record))
        .collect();
    let producer = producer(
        &bootstrap,
        &[("compression.type", codec), ("batch.num.messages", "40")],
    );
    let acked = produce_all(&producer, &topic, &sent).await;
    assert_acks_dense_in_send_order(&acked);

    let produced = by_partition(&sent, &acked);
    let starts: Vec<(i32, i64)> = (0..partitions).map(|p| (p, 0)).collect();
    let consumed = consume_exactly(&bootstrap, &topic, &starts, RECORDS).await;
    assert_partitions_match(&produced, &consumed, 0);

    for (partition, records) in &produced {
        let (low, high) = watermarks(&bootstrap, &topic, *partition).await;
        assert_eq!(
            (low, high),
            (0, records.len() as i64),
            "watermarks of {topic}/{partition}"
        );
    }
}

/// Each partition's acknowledged offsets, in send order, are 0, 1, 2, ...
fn assert_acks_dense_in_send_order(acked: &[Acked]) {
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for (index, ack) in acked.iter().enumerate() {
        let expected = next.entry(ack.partition).or_insert(0);
        assert_eq!(
            ack.offset, *expected,
            "record #{index} was acknowledged at {}/{}, expected offset {expected}",
            ack.partition, ack.offset
        );
        *expected += 1;
    }
}

macro_rules! round_trip_tests {
    ($($name:ident: $codec:literal, $partitions:literal;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            round_trip($codec, $partitions).await;
        }
    )*};
}

round_trip_tests! {
    uncompressed_records_round_trip_on_one_partition: "none", 1;
    uncompressed_records_round_trip_on_eight_partitions: "none", 8;
    gzip_records_round_trip_on_one_partition: "gzip", 1;
    gzip_records_round_trip_on_eight_partitions: "gzip", 8;
    snappy_records_round_trip_on_one_partition: "snappy", 1;
    snappy_records_round_trip_on_eight_partitions: "snappy", 8;
    lz4_records_round_trip_on_one_partition: "lz4", 1;
    lz4_records_round_trip_on_eight_partitions: "lz4", 8;
    zstd_records_round_trip_on_one_partition: "zstd", 1;
    zstd_records_round_trip_on_eight_partitions: "zstd", 8;
}
