//! Key compaction (`cleanup.policy=compact`) with real clients against the real binary: the
//! cleaner leaves exactly the latest value of each key, at its original offset (rdkafka, and
//! 100,000 updates over 1,000 keys with kafka-python and confluent-kafka); a record without a
//! key is refused; tombstones vanish after `delete.retention.ms`; consumers reading from offset
//! 0 during passes see every latest value; `compact,delete` also drops old segments; a pass
//! interrupted by SIGKILL, or by a partition move and then SIGKILL of the new owner in a
//! 2-broker cluster, is finished by the next owner with nothing lost.
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
    create_topic, future_record, produce_all, producer, set_topic_configs, stream_consumer,
    watermarks,
};
use strata_tests::cluster::Cluster;
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

/// The (log start, high watermark) of partition 0, or None while no broker serves it yet
/// (after a restart or a move).
async fn watermarks_of(bootstrap: &str, topic: &str) -> Option<(i64, i64)> {
    let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        strata_tests::clients::base_consumer(&bootstrap)
            .fetch_watermarks(&topic, 0, Duration::from_secs(10))
            .ok()
    })
    .await
    .expect("watermarks task")
}

/// One record as read back: offset, key, value (None for a tombstone).
type Read = (i64, String, Option<String>);

/// Every record of partition 0 from its log start up to the high watermark; None while the
/// partition is not served yet.
async fn read_everything(bootstrap: &str, topic: &str) -> Option<Vec<Read>> {
    let (low, high) = watermarks_of(bootstrap, topic).await?;
    read_from(bootstrap, topic, low, high).await
}

/// Every record of partition 0 from offset `from` up to `high` (exclusive); None when the
/// client reports an error (a restarted or moved partition not served yet).
async fn read_from(bootstrap: &str, topic: &str, from: i64, high: i64) -> Option<Vec<Read>> {
    if high <= from {
        return Some(Vec::new());
    }
    let consumer = stream_consumer(bootstrap);
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Offset(from))
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
        if record.offset >= high {
            // The record at high - 1 was cleaned away by a newer value of its key.
            return Some(out);
        }
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        out.push((
            record.offset,
            text(record.record.key.unwrap_or_default()),
            record.record.value.map(text),
        ));
        // The last record is always its key's latest, so it is never cleaned away.
        if record.offset >= high - 1 {
            return Some(out);
        }
    }
}

/// Latest (offset, value) per key of what was acknowledged; a tombstone's value is None.
fn latest(acked: &[(i64, TestRecord)]) -> BTreeMap<String, (i64, Option<String>)> {
    acked
        .iter()
        .map(|(offset, r)| {
            (
                String::from_utf8(r.key.clone().unwrap()).unwrap(),
                (
                    *offset,
                    r.value.clone().map(|v| String::from_utf8(v).unwrap()),
                ),
            )
        })
        .collect()
}

/// The last record read of each key: (offset, value).
fn last_of_each_key(read: &[Read]) -> BTreeMap<String, (i64, Option<String>)> {
    read.iter()
        .map(|(o, k, v)| (k.clone(), (*o, v.clone())))
        .collect()
}

/// Waits until reading the partition from its log start yields exactly one record per key,
/// each the latest acknowledged one at its offset (`expect` lists no tombstones: they must be
/// gone too).
async fn wait_until_cleaned(
    bootstrap: &str,
    topic: &str,
    expect: &BTreeMap<String, (i64, Option<String>)>,
) {
    wait_until_async(
        &format!(
            "{topic} holds exactly the latest value of each of {} keys",
            expect.len()
        ),
        Duration::from_secs(90),
        || async {
            let read = read_everything(bootstrap, topic).await?;
            (read.len() == expect.len() && &last_of_each_key(&read) == expect).then_some(())
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

/// How many of the broker's log lines so far say a cleaning pass of `topic`'s partition 0
/// started, and how many say one ended (cleaned, or dropped because the manifest moved on).
fn passes_logged(broker: &StrataProcess, topic: &str) -> (usize, usize) {
    let partition = format!("partition={topic}-0");
    let count = |needle: &str| {
        broker
            .log_lines_containing(needle)
            .iter()
            .filter(|line| line.contains(&partition))
            .count()
    };
    (
        count("cleaning pass started"),
        count(" cleaned ") + count("cleaning pass dropped"),
    )
}

/// Tombstones are kept for `delete.retention.ms` after the pass that first covered them, then
/// removed by a later pass (Kafka's rule). A pass needs dirty data, as in Kafka, so while
/// waiting the test keeps appending one update of a single filler key.
///
/// The filler itself is not expected to be down to one record: each filler update is cleaned
/// away only by the pass the next one triggers, so a read right after an update sees the
/// previous one as well until that pass has run. (The test used to demand exactly one record
/// per key, which made it race each read against a compaction and a cleaning pass; on S3,
/// where a pass takes longer than a produce and a read, it lost that race for 90 s in one CI
/// run while the tombstones had long been removed — issue 14.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_vanish_after_delete_retention_ms() {
    let broker = StrataProcess::start_with(StrataOptions::default().with_config(FAST_SEGMENTS));
    let bootstrap = broker.bootstrap();
    let topic = "compacted-tombstones";
    let mut config = COMPACT.to_vec();
    config.push(("delete.retention.ms", "1000"));
    create_topic(&bootstrap, topic, 1, &config).await;
    let mut acked = produce_updates(&bootstrap, topic, 2_000, 100).await;
    // Keys 0..50 are deleted.
    let producer = producer(&bootstrap, &[("linger.ms", "5")]);
    let tombstones: Vec<_> = (0..50)
        .map(|k| {
            let record = TestRecord {
                key: Some(format!("key-{k}").into_bytes()),
                value: None,
                headers: Vec::new(),
                timestamp: None,
            };
            (Some(0), record)
        })
        .collect();
    for (a, (_, r)) in produce_all(&producer, topic, &tombstones)
        .await
        .into_iter()
        .zip(tombstones)
    {
        acked.push((a.offset, r));
    }
    let all_latest = latest(&acked);
    // A consumer reading now sees the deletions.
    let read = read_everything(&bootstrap, topic).await.unwrap();
    let seen = last_of_each_key(&read);
    assert!(
        (0..50).all(|k| seen[&format!("key-{k}")].1.is_none()),
        "every deleted key's last record read is its tombstone"
    );

    let mut expect: BTreeMap<_, _> = all_latest
        .into_iter()
        .filter(|(_, (_, value))| value.is_some())
        .collect();
    assert_eq!(expect.len(), 50);
    let filler = "f".repeat(2048);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut fillers = 0usize;
    loop {
        remaining(
            &format!("{topic} holds the 50 live keys and no tombstone"),
            deadline,
        );
        fillers += 1;
        let record = TestRecord {
            key: Some(b"filler".to_vec()),
            value: Some(filler.clone().into_bytes()),
            headers: Vec::new(),
            timestamp: None,
        };
        let acked = produce_all(&producer, topic, &[(Some(0), record)]).await;
        expect.insert(
            "filler".to_string(),
            (acked[0].offset, Some(filler.clone())),
        );
        let Some(read) = read_everything(&bootstrap, topic).await else {
            continue;
        };
        let tombstones = read.iter().filter(|(_, _, v)| v.is_none()).count();
        // Every key but the filler exactly once, at its latest offset.
        let settled = read.iter().filter(|(_, k, _)| k != "filler").count() == expect.len() - 1;
        if tombstones == 0 && settled && last_of_each_key(&read) == expect {
            break;
        }
    }
    eprintln!("tombstones gone after {fillers} filler updates");
}

/// Consumers reading from offset 0 while passes run (a throttled cleaner with a key map too
/// small for all keys, so cleaning takes several long passes) always see each key's latest
/// value, at its offset, and offsets only going forward, whatever mix of cleaned and uncleaned
/// segments and index chunks they meet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_reading_from_offset_0_during_cleaning_sees_every_latest_value() {
    let slow = format!(
        "{FAST_SEGMENTS}cleaner_io_max_bytes_per_second = \"256KiB\"\n\
         cleaner_dedupe_buffer_bytes = \"64KiB\"\n"
    );
    let broker = StrataProcess::start_with(StrataOptions::default().with_config(&slow));
    let bootstrap = broker.bootstrap();
    let topic = "compacted-read-during";
    create_topic(&bootstrap, topic, 1, COMPACT).await;
    // 5,000 keys: more than the 64 KiB map holds (about 2,400), so a pass covers part.
    let acked = produce_updates(&bootstrap, topic, 30_000, 5_000).await;
    let expect = latest(&acked);
    wait_until_async("a cleaning pass starts", DEADLINE, || async {
        (passes_logged(&broker, topic).0 > 0).then_some(())
    })
    .await;
    let (mut reads, mut during) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        remaining(
            &format!("{topic} is cleaned to one record per key while being read"),
            deadline,
        );
        reads += 1;
        let (_, ended_before) = passes_logged(&broker, topic);
        let read = read_from(&bootstrap, topic, 0, 30_000)
            .await
            .expect("the broker serves the partition throughout");
        let (started_by_end, _) = passes_logged(&broker, topic);
        if started_by_end > ended_before {
            // A pass was running at some point during this read.
            during += 1;
        }
        for pair in read.windows(2) {
            assert!(pair[0].0 < pair[1].0, "offsets go forward: {pair:?}");
        }
        assert_eq!(
            last_of_each_key(&read),
            expect,
            "read {reads}: each key's last record is its latest value"
        );
        if read.len() == expect.len() {
            break;
        }
    }
    eprintln!("{reads} reads from offset 0, {during} of them while a pass ran");
    assert!(
        during > 0,
        "no read overlapped a pass: the test did not test anything"
    );
}

/// `cleanup.policy=compact,delete`: retention drops whole segments older than `retention.ms`
/// (the log start moves past them) and the key cleaner compacts what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_delete_drops_old_segments_by_retention_and_compacts_the_rest() {
    let config = format!("{FAST_SEGMENTS}retention_check_interval = \"200ms\"\n");
    let broker = StrataProcess::start_with(StrataOptions::default().with_config(&config));
    let bootstrap = broker.bootstrap();
    let topic = "compacted-and-deleted";
    create_topic(
        &bootstrap,
        topic,
        1,
        &[
            ("cleanup.policy", "compact,delete"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("retention.ms", "3600000"),
        ],
    )
    .await;
    // Old updates: CreateTime two hours ago, past retention as soon as they form a segment.
    let two_hours_ago = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
        - 2 * 3_600_000;
    let producer = producer(&bootstrap, &[("linger.ms", "5")]);
    let old: Vec<_> = (0..2_000)
        .map(|i| {
            let mut record = update(i, 200);
            record.key = Some(format!("old-{}", i % 200).into_bytes());
            record.timestamp = Some(two_hours_ago);
            (Some(0), record)
        })
        .collect();
    let old_end = produce_all(&producer, topic, &old)
        .await
        .last()
        .unwrap()
        .offset
        + 1;
    wait_until_async(
        "retention drops every old segment (the log start reaches their end)",
        Duration::from_secs(60),
        || async {
            let (low, _) = watermarks_of(&bootstrap, topic).await?;
            (low >= old_end).then_some(())
        },
    )
    .await;
    // New updates are compacted, and retention leaves them be.
    let fresh = produce_updates(&bootstrap, topic, 5_000, 100).await;
    let expect = latest(&fresh);
    wait_until_cleaned(&bootstrap, topic, &expect).await;
    let (low, high) = watermarks_of(&bootstrap, topic).await.unwrap();
    assert_eq!(high, old_end + 5_000);
    assert!(low <= fresh[0].0, "retention dropped no new update");
}

/// kafka-python and confluent-kafka (tests/python/compacted_topic.py) read back exactly the
/// latest value of each key of a compacted topic, at its offset, with offsets only going
/// forward in every read while the cleaner works: the issue's 100,000 updates over 1,000 keys
/// (15 s with kafka-python on a debug build, 4 s with confluent-kafka).
fn python_compacted_topic(client: &str, updates: usize) {
    let broker = StrataProcess::start_with(StrataOptions::default().with_config(FAST_SEGMENTS));
    let mut command = std::process::Command::new("python3");
    command
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/compacted_topic.py"))
        .arg("--client")
        .arg(client)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg(format!("compacted-{client}"))
        .arg("--updates")
        .arg(updates.to_string())
        .arg("--keys")
        .arg("1000");
    let finished = strata_tests::command::run_with_deadline(command, b"", Duration::from_secs(600));
    finished.assert_success("tests/python/compacted_topic.py");
    eprintln!("{}", finished.stdout);
}

#[test]
fn kafka_python_reads_back_the_latest_of_100k_updates_over_1k_keys() {
    python_compacted_topic("kafka-python", 100_000);
}

#[test]
fn confluent_kafka_reads_back_the_latest_of_100k_updates_over_1k_keys() {
    python_compacted_topic("confluent-kafka", 100_000);
}

/// How many passes over `topic`'s partition 0 the broker logged as finished.
fn passes_finished(broker: &StrataProcess, topic: &str) -> usize {
    let partition = format!("partition={topic}-0");
    broker
        .log_lines_containing(" cleaned ")
        .iter()
        .filter(|line| line.contains(&partition))
        .count()
}

/// A pass interrupted by a partition move (`strata partitions move`) and then one interrupted
/// by SIGKILL of the new owner: the next owner cleans the partition from what the manifest
/// says, and exactly the latest value of each key is left, at its offset. Which broker owns the
/// topic first is up to placement; the test moves it to the other one either way.
///
/// `min.compaction.lag.ms` holds every pass off until all records are in, then is lifted, so
/// the first pass covers the whole partition and lasts seconds at the throttled rate. (Without
/// it a pass could start on the first segment while producing, finish before the move, and the
/// test would then see the move land between passes — as one CI run on S3 did.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_interrupted_by_a_move_and_by_sigkill_finishes_on_the_next_owner() {
    let mut cluster = tokio::task::block_in_place(|| {
        Cluster::start_with_env(
            2,
            "3s",
            "500ms",
            &[
                ("STRATA_LOG_SEGMENT_INTERVAL", "100ms"),
                ("STRATA_LOG_SEGMENT_BYTES", "128KiB"),
                // Passes of several seconds, so the move and the kill land inside one.
                ("STRATA_LOG_CLEANER_IO_MAX_BYTES_PER_SECOND", "128KiB"),
            ],
        )
    });
    let bootstrap = cluster.bootstrap_of(&[1, 2]);
    let topic = "compacted-moved";
    let held: Vec<_> = COMPACT
        .iter()
        .copied()
        .chain([("min.compaction.lag.ms", "3600000")])
        .collect();
    create_topic(&bootstrap, topic, 1, &held).await;
    let first = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(1, topic, 1, &[1, 2], "the topic has an owner")[&0]
    });
    let second = 3 - first;
    let acked = produce_updates(&bootstrap, topic, 10_000, 1_000).await;
    let expect = latest(&acked);
    assert_eq!(
        passes_logged(&cluster.brokers[&first], topic).0,
        0,
        "a pass started while min.compaction.lag.ms held every record back"
    );
    set_topic_configs(&bootstrap, topic, COMPACT).await;

    wait_until_async("the first owner starts a pass", DEADLINE, || async {
        (passes_logged(&cluster.brokers[&first], topic).0 > 0).then_some(())
    })
    .await;
    tokio::task::block_in_place(|| cluster.move_partition(topic, 0, second));
    assert_eq!(
        passes_finished(&cluster.brokers[&first], topic),
        0,
        "the move came after the first owner's pass finished: the test tested nothing"
    );

    wait_until_async("the second owner starts a pass", DEADLINE, || async {
        (passes_logged(&cluster.brokers[&second], topic).0 > 0).then_some(())
    })
    .await;
    assert_eq!(
        passes_finished(&cluster.brokers[&second], topic),
        0,
        "the second owner finished its pass before the kill: the test tested nothing"
    );
    cluster.broker(second).kill9();
    eprintln!("moved {topic}-0 from broker {first} to {second} during a pass, then SIGKILLed {second} during its pass");

    tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(first, topic, 1, &[first], "the first broker owns it again")
    });
    let survivor = cluster.bootstrap_of(&[first]);
    wait_until_cleaned(&survivor, topic, &expect).await;
    assert_eq!(
        watermarks_of(&survivor, topic).await,
        Some((0, 10_000)),
        "offsets are kept"
    );
}
