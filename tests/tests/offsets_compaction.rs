//! `__consumer_offsets` is compacted by key (issue 14, item 4), with real librdkafka clients
//! against the real binary: 100 groups commit 50,000 offsets (10,000 commits of 5 partitions
//! each), the key cleaner brings the topic down to about its live offsets, a restarted broker
//! replays only those (the replayed-record count is the deterministic proxy for the load
//! time; nothing here times anything) and every group's committed offsets are exact.
//!
//! The million-commit version is the on-demand benchmark `bench/offsets_compaction.sh`
//! (docs/BENCHMARKS.md).

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Deadlines against real processes need the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use strata_tests::clients::{base_config, create_topic, TestContext};
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

/// Tail data becomes sealed segments (the only thing the cleaner touches) within a fraction
/// of a second.
const FAST_SEGMENTS: &str = r#"
[log]
segment_interval = "100ms"
segment_bytes = "64KiB"
"#;

const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// The broker's default `group_shards`.
const SHARDS: i32 = 8;
const GROUPS: usize = 100;
const PARTITIONS: i32 = 5;
const ROUNDS: i64 = 100;
const THREADS: usize = 10;
/// Live offsets: one per (group, partition).
const LIVE: usize = GROUPS * PARTITIONS as usize;
/// What the topic may hold once cleaned: the live offsets in cleaned segments, plus dirty
/// segments the cleaner leaves until they reach `min.cleanable.dirty.ratio` (0.5) of the
/// partition, so at most about as many again; the rest is slack for segment boundaries.
const BOUND: usize = 3 * LIVE;

fn group(g: usize) -> String {
    format!("flat-{g}")
}

fn committer(bootstrap: &str, group: &str) -> BaseConsumer<TestContext> {
    let mut config = base_config(bootstrap);
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    config.create_with_context(TestContext).unwrap()
}

/// Commits round `r` of every partition for each of `groups`, `ROUNDS` times, synchronously:
/// each commit is acknowledged (durable) before the next.
fn commit_rounds(bootstrap: &str, topic: &str, groups: Vec<usize>) {
    let consumers: Vec<BaseConsumer<TestContext>> = groups
        .iter()
        .map(|g| committer(bootstrap, &group(*g)))
        .collect();
    for round in 1..=ROUNDS {
        for consumer in &consumers {
            let mut list = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                list.add_partition_offset(topic, p, Offset::Offset(round * 10 + i64::from(p)))
                    .unwrap();
            }
            consumer.commit(&list, CommitMode::Sync).unwrap();
        }
    }
}

fn committed(bootstrap: &str, topic: &str, g: usize) -> BTreeMap<i32, i64> {
    let consumer = committer(bootstrap, &group(g));
    let mut query = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        query.add_partition(topic, p);
    }
    let answer = consumer
        .committed_offsets(query, Duration::from_secs(10))
        .unwrap();
    answer
        .elements_for_topic(topic)
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => (e.partition(), o),
            other => panic!("group {g} partition {}: {other:?}", e.partition()),
        })
        .collect()
}

/// Every record of `__consumer_offsets` from each partition's start to its high watermark:
/// what a shard load replays.
fn records_in_offsets_topic(bootstrap: &str) -> usize {
    let consumer = committer(bootstrap, "offsets-reader");
    let mut assignment = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..SHARDS {
        let (low, high) = consumer
            .fetch_watermarks(OFFSETS_TOPIC, p, Duration::from_secs(10))
            .unwrap();
        if high > low {
            assignment
                .add_partition_offset(OFFSETS_TOPIC, p, Offset::Offset(low))
                .unwrap();
            ends.insert(p, high);
        }
    }
    if ends.is_empty() {
        return 0;
    }
    consumer.assign(&assignment).unwrap();
    let mut count = 0;
    // The newest record of a key is never cleaned, so each partition's last record is at its
    // high watermark - 1 and reading stops there.
    wait_until("reading __consumer_offsets to its end", DEADLINE, || {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                count += 1;
                if ends.get(&m.partition()) == Some(&(m.offset() + 1)) {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => panic!("reading {OFFSETS_TOPIC}: {e}"),
            None => {}
        }
        ends.is_empty().then_some(())
    });
    count
}

/// The `read=` counts of the shard loads logged after the first `before` load lines.
fn replayed_by_loads_after(broker: &StrataProcess, before: usize) -> Vec<usize> {
    let lines = wait_until("the restarted broker loads every shard", DEADLINE, || {
        let lines = broker.log_lines_containing("group coordinator shard loaded");
        (lines.len() >= before + SHARDS as usize).then_some(lines)
    });
    lines[before..]
        .iter()
        .map(|line| {
            let at = line.find("read=").expect("read= in the load line") + 5;
            line[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_commits_of_100_groups_compact_to_their_live_offsets_and_replay_exactly() {
    let mut broker = StrataProcess::start_with(StrataOptions::default().with_config(FAST_SEGMENTS));
    let bootstrap = broker.bootstrap();
    let topic = "offsets-flat";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let bootstrap = bootstrap.clone();
            let groups: Vec<usize> = (0..GROUPS).filter(|g| g % THREADS == t).collect();
            std::thread::spawn(move || commit_rounds(&bootstrap, topic, groups))
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let written = GROUPS * PARTITIONS as usize * ROUNDS as usize;

    let cleaned = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            wait_until(
                &format!("{OFFSETS_TOPIC} holds at most {BOUND} of {written} records"),
                Duration::from_secs(120),
                || {
                    let n = records_in_offsets_topic(&bootstrap);
                    (n <= BOUND).then_some(n)
                },
            )
        }
    })
    .await
    .unwrap();
    eprintln!("{written} offset records written, {cleaned} left after cleaning");
    assert!(cleaned >= LIVE, "every live offset is kept: {cleaned}");

    let before = broker
        .log_lines_containing("group coordinator shard loaded")
        .len();
    broker.kill9();
    broker.restart();
    let bootstrap = broker.bootstrap();
    let replayed: usize = replayed_by_loads_after(&broker, before).iter().sum();
    eprintln!("the restarted broker replayed {replayed} records");
    assert!(
        (LIVE..=cleaned).contains(&replayed),
        "replay reads the cleaned topic only: {replayed} records, {cleaned} in the topic"
    );

    let expect: BTreeMap<i32, i64> = (0..PARTITIONS)
        .map(|p| (p, ROUNDS * 10 + i64::from(p)))
        .collect();
    tokio::task::spawn_blocking(move || {
        for g in 0..GROUPS {
            assert_eq!(committed(&bootstrap, topic, g), expect, "group {g}");
        }
    })
    .await
    .unwrap();
}

/// tests/python/offsets_schema.py decodes `__consumer_offsets` with Kafka's layout, written
/// independently of the broker's encoder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_reader_decodes_the_offsets_topic_with_kafkas_record_layout() {
    let broker = StrataProcess::start_with(
        StrataOptions::default().with_args(["--group-initial-rebalance-delay", "0s"]),
    );
    let topic = "schema-t";
    create_topic(&broker.bootstrap(), topic, 2, &[]).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/offsets_schema.py");
    let mut command = std::process::Command::new("python3");
    command
        .arg(script)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg(topic);
    let finished = tokio::task::block_in_place(|| {
        strata_tests::command::run_with_deadline(command, b"", Duration::from_secs(180))
    });
    finished.assert_success("tests/python/offsets_schema.py");
}
