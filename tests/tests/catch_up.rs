//! Consumers replaying compacted data through read-ahead windows (issue 19, item 4): a real
//! librdkafka consumer reads every record back at its offset when segment reads go through
//! windows with room for only one window per partition replayed, and the broker reads the
//! segments about once, not once per fetch.
//!
//! Which window is dropped when, and that the old rule re-read data, is pinned by the unit
//! tests in `crates/log/src/read_ahead.rs`; this test checks the whole path with real storage
//! (the directory here, S3 and RADOS in CI's later phases).

// Tests: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use strata_tests::clients::{consume_exactly, create_topic, produce_all, producer, Acked};
use strata_tests::records::{assert_partitions_match, TestRecord};
use strata_tests::{StrataOptions, StrataProcess};

const PARTITIONS: i32 = 4;
const RECORDS: usize = 16_000;
const VALUE_BYTES: usize = 1_000;

/// The window size below, in bytes: twice librdkafka's 1 MiB per partition and fetch, so
/// consecutive fetches share windows.
const WINDOW: u64 = 2 << 20;

/// Segments compacted at once; a tail cache far smaller than the data, so the replay after a
/// restart reads segments; 2 MiB windows with room for four, one per partition replayed.
const CONFIG: &str = r#"
[log]
segment_interval = "100ms"
cache_bytes = "1MiB"
read_ahead_bytes = "2MiB"
read_ahead_memory_bytes = "8MiB"
"#;

fn start() -> StrataProcess {
    StrataProcess::start_with(
        StrataOptions::default()
            .with_config(CONFIG)
            .with_args(["--metrics-listen", "127.0.0.1:0"]),
    )
}

/// One series of the broker's `/metrics`, 0 when absent.
fn metric(broker: &StrataProcess, series: &str) -> u64 {
    broker.metric(series).unwrap_or(0.0) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_through_read_ahead_windows_reads_every_record_and_each_segment_about_once() {
    let mut broker = start();
    let topic = "replayed";
    create_topic(&broker.bootstrap(), topic, PARTITIONS, &[]).await;
    let sent: Vec<(Option<i32>, TestRecord)> = (0..RECORDS)
        .map(|i| {
            (
                Some((i % PARTITIONS as usize) as i32),
                TestRecord {
                    key: Some(format!("key-{i}").into_bytes()),
                    value: Some(vec![b'a' + (i % 26) as u8; VALUE_BYTES]),
                    headers: Vec::new(),
                    timestamp: None,
                },
            )
        })
        .collect();
    let producer = producer(&broker.bootstrap(), &[("linger.ms", "5")]);
    let acked: Vec<Acked> = produce_all(&producer, topic, &sent).await;
    drop(producer);
    let bytes_in = metric(
        &broker,
        &format!("strata_topic_bytes_in_total{{topic=\"{topic}\"}}"),
    );
    assert!(
        bytes_in >= (RECORDS * VALUE_BYTES) as u64,
        "{bytes_in} bytes in"
    );

    // A clean stop compacts everything into segments; the restarted broker's cache is empty.
    let status = broker.sigterm();
    assert!(status.success(), "the broker stopped cleanly: {status:?}");
    broker.restart();

    let mut expected: BTreeMap<i32, Vec<TestRecord>> = BTreeMap::new();
    let mut by_offset: Vec<(i32, i64, TestRecord)> = sent
        .iter()
        .zip(&acked)
        .map(|((_, record), ack)| (ack.partition, ack.offset, record.clone()))
        .collect();
    by_offset.sort_by_key(|(p, o, _)| (*p, *o));
    for (p, o, record) in by_offset {
        let list = expected.entry(p).or_default();
        assert_eq!(o, list.len() as i64, "offsets are dense from 0");
        list.push(record);
    }
    let starts: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let got = consume_exactly(&broker.bootstrap(), topic, &starts, RECORDS).await;
    assert_partitions_match(&expected, &got, 0);

    let hits = metric(&broker, "strata_log_catchup_reads_total{result=\"hit\"}");
    let misses = metric(&broker, "strata_log_catchup_reads_total{result=\"miss\"}");
    let read = metric(&broker, "strata_log_catchup_bytes_read_total");
    eprintln!("segment reads: {hits} from windows, {misses} from storage; {read} bytes read for {bytes_in} bytes in");
    assert!(misses > 0, "the replay read segments");
    assert!(hits > 0, "fetches were answered from kept windows");
    // Every window read once, plus at most one window per partition read ahead and dropped.
    let slack = u64::from(PARTITIONS as u32) * WINDOW;
    assert!(
        read <= bytes_in + slack,
        "{read} bytes read from segments for {bytes_in} bytes stored: windows were read again"
    );
}
