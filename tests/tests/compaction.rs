//! Key compaction (`cleanup.policy=compact`) with a real client against the real binary: the
//! cleaner leaves exactly the latest value of each key, at its original offset; a record
//! without a key is refused; a pass interrupted by SIGKILL is finished after the restart.
//!
//! The broker runs with a small segment size and interval, so produced data becomes sealed
//! segments (the only thing the cleaner touches) within a fraction of a second, and topics set
//! `min.cleanable.dirty.ratio` low so every new segment is cleaned.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use strata_tests::clients::{
    create_topic, future_record, produce_all, producer, stream_consumer, watermarks,
};
use strata_tests::records::TestRecord;
use strata_tests::wait::{remaining, wait_until_async, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

const FAST_SEGMENTS: &str = r#"
[log]
segment_interval = "100ms"
segment_bytes = "128KiB"
"#;

const COMPACT: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("min.cleanable.dirty.ratio", "0.01"),
];

fn update(i: usize, keys: usize) -> TestRecord {
    TestRecord {
        key: Some(format!("key-{}", i % keys).into_bytes()),
        value: Some(format!("value-{i}").into_bytes()),
        headers: Vec::new(),
        timestamp: None,
    }
}

/// The high watermark of partition 0, or None while no broker serves it yet (after a restart).
async fn high_watermark(bootstrap: &str, topic: &str) -> Option<i64> {
    let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        strata_tests::clients::base_consumer(&bootstrap)
            .fetch_watermarks(&topic, 0, Duration::from_secs(10))
            .ok()
            .map(|(_, high)| high)
    })
    .await
    .expect("watermarks task")
}

/// Every record of partition 0 from offset 0 up to the high watermark: (offset, key, value);
/// None while the partition is not served yet.
async fn read_everything(bootstrap: &str, topic: &str) -> Option<Vec<(i64, String, String)>> {
    let high = high_watermark(bootstrap, topic).await?;
    if high == 0 {
        return Some(Vec::new());
    }
    let consumer = stream_consumer(bootstrap);
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Offset(0))
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    loop {
        let wait = remaining(&format!("reading {topic} up to offset {high}"), deadline);
        let message = match tokio::time::timeout(wait, consumer.recv()).await {
            Ok(Ok(message)) => message,
            // Transport reports while a restarted broker takes its partitions back.
            Ok(Err(e)) => {
                eprintln!("{topic}: {e}");
                return None;
            }
            Err(_) => panic!("{topic}: nothing more before offset {high}"),
        };
        let record = strata_tests::clients::received(&message);
        let text = |b: Option<Vec<u8>>| String::from_utf8(b.unwrap_or_default()).unwrap();
        out.push((
            record.offset,
            text(record.record.key),
            text(record.record.value),
        ));
        // The last record is always its key's latest, so it is never cleaned away.
        if record.offset >= high - 1 {
            return Some(out);
        }
    }
}

/// Latest (offset, value) per key of what was acknowledged.
fn latest(acked: &[(i64, TestRecord)]) -> BTreeMap<String, (i64, String)> {
    acked
        .iter()
        .map(|(offset, r)| {
            (
                String::from_utf8(r.key.clone().unwrap()).unwrap(),
                (
                    *offset,
                    String::from_utf8(r.value.clone().unwrap()).unwrap(),
                ),
            )
        })
        .collect()
}

/// Waits until reading the partition from offset 0 yields exactly one record per key, each
/// the latest acknowledged one at its offset.
async fn wait_until_cleaned(
    bootstrap: &str,
    topic: &str,
    expect: &BTreeMap<String, (i64, String)>,
) {
    wait_until_async(
        &format!(
            "{topic} holds exactly the latest value of each of {} keys",
            expect.len()
        ),
        Duration::from_secs(90),
        || async {
            let read = read_everything(bootstrap, topic).await?;
            let got: BTreeMap<String, (i64, String)> = read
                .iter()
                .map(|(o, k, v)| (k.clone(), (*o, v.clone())))
                .collect();
            (read.len() == expect.len() && &got == expect).then_some(())
        },
    )
    .await;
}

async fn produce_updates(
    bootstrap: &str,
    topic: &str,
    count: usize,
    keys: usize,
) -> Vec<(i64, TestRecord)> {
    let producer = producer(bootstrap, &[("linger.ms", "5")]);
    let records: Vec<_> = (0..count).map(|i| (Some(0), update(i, keys))).collect();
    let acked = produce_all(&producer, topic, &records).await;
    acked
        .into_iter()
        .zip(records)
        .map(|(a, (_, r))| (a.offset, r))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_reads_back_exactly_the_latest_value_of_each_key() {
    let broker = StrataProcess::start_with(StrataOptions::default().with_config(FAST_SEGMENTS));
    let bootstrap = broker.bootstrap();
    let topic = "compacted-latest";
    create_topic(&bootstrap, topic, 1, COMPACT).await;
    let acked = produce_updates(&bootstrap, topic, 20_000, 1_000).await;
    let expect = latest(&acked);
    assert_eq!(expect.len(), 1_000);
    wait_until_cleaned(&bootstrap, topic, &expect).await;
    // Offsets are kept: the log start stays 0 and new records continue after the last.
    assert_eq!(watermarks(&bootstrap, topic, 0).await, (0, 20_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_a_key_is_refused_by_a_compacted_topic() {
    let broker = StrataProcess::start();
    let bootstrap = broker.bootstrap();
    let topic = "compacted-keyless";
    create_topic(&bootstrap, topic, 1, COMPACT).await;
    let producer = producer(&bootstrap, &[]);
    let keyless = TestRecord {
        key: None,
        value: Some(b"no key".to_vec()),
        headers: Vec::new(),
        timestamp: None,
    };
    let delivery = producer
        .send_result(future_record(topic, Some(0), &keyless))
        .unwrap_or_else(|(e, _)| panic!("enqueue: {e}"))
        .await
        .expect("a delivery report");
    match delivery {
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::InvalidRecord), _)) => {}
        other => panic!("expected INVALID_RECORD, got {other:?}"),
    }
    assert_eq!(
        watermarks(&bootstrap, topic, 0).await,
        (0, 0),
        "nothing stored"
    );
    // A keyed record is taken.
    let acked = produce_updates(&bootstrap, topic, 1, 1).await;
    assert_eq!(acked[0].0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaning_pass_killed_with_sigkill_is_finished_after_the_restart_with_nothing_lost() {
    // A throttled cleaner, so the kill lands inside a pass.
    let slow = format!("{FAST_SEGMENTS}cleaner_io_max_bytes_per_second = \"256KiB\"\n");
    let mut broker = StrataProcess::start_with(StrataOptions::default().with_config(&slow));
    let bootstrap = broker.bootstrap();
    let topic = "compacted-killed";
    create_topic(&bootstrap, topic, 1, COMPACT).await;
    let acked = produce_updates(&bootstrap, topic, 5_000, 200).await;
    wait_until_async("a cleaning pass starts", DEADLINE, || async {
        (!broker
            .log_lines_containing("cleaning pass started")
            .is_empty())
        .then_some(())
    })
    .await;
    broker.kill9();
    broker.restart();
    let bootstrap = broker.bootstrap();
    wait_until_cleaned(&bootstrap, topic, &latest(&acked)).await;
}

/// Committed and aborted transactions of confluent-kafka's transactional producer over the
/// same keys (tests/python/txn_compaction.py): read_committed sees exactly the latest committed
/// value of each key before and after cleaning, and once cleaned no aborted record is left for
/// read_uncommitted consumers either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_on_a_compacted_topic_read_back_the_latest_committed_values() {
    let broker = StrataProcess::start_with(StrataOptions::default().with_config(FAST_SEGMENTS));
    let bootstrap = broker.bootstrap();
    let topic = "compacted-txn";
    // Nothing is cleaned until the script lowers the lag, after its first reads.
    let mut config = COMPACT.to_vec();
    config.push(("min.compaction.lag.ms", "3600000"));
    create_topic(&bootstrap, topic, 1, &config).await;
    let mut command = std::process::Command::new("python3");
    command
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/txn_compaction.py"))
        .arg("--bootstrap")
        .arg(&bootstrap)
        .arg("--topic")
        .arg(topic);
    let finished = tokio::task::block_in_place(|| {
        strata_tests::command::run_with_deadline(command, b"", Duration::from_secs(300))
    });
    finished.assert_success("tests/python/txn_compaction.py");
}
