//! What survives a broker restart: a graceful stop (SIGTERM) flushes and exits 0, and an
//! idempotent producer streaming across a restart — graceful or SIGKILL — ends with every
//! record exactly once, in order, with no gaps.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use std::process::Command;

use strata_tests::binary::strata_binary;
use strata_tests::clients::{consume_exactly, create_topic, produce_all, producer, watermarks};
use strata_tests::command::run_with_deadline;
use strata_tests::process::StorageKind;
use strata_tests::records::{assert_partitions_match, varied_records, TestRecord};
use strata_tests::stream::{ContinuousProducer, Outcome};
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_a_restart_serves_every_acknowledged_record() {
    let mut broker = StrataProcess::start();
    let topic = "survives-sigterm";
    let sent: Vec<_> = varied_records(300)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    let acked = produce_all(&producer(&broker.bootstrap(), &[]), topic, &sent).await;
    assert_eq!(acked.last().map(|a| a.offset), Some(299));

    let status = broker.sigterm();
    assert!(
        status.success(),
        "strata exited with {status} after SIGTERM"
    );
    broker.restart();

    let produced = BTreeMap::from([(0, sent.into_iter().map(|(_, r)| r).collect::<Vec<_>>())]);
    let consumed = consume_exactly(&broker.bootstrap(), topic, &[(0, 0)], 300).await;
    assert_partitions_match(&produced, &consumed, 0);
    assert_eq!(watermarks(&broker.bootstrap(), topic, 0).await, (0, 300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_storage_serves_a_round_trip() {
    let broker =
        StrataProcess::start_with(StrataOptions::default().with_storage(StorageKind::Memory));
    let topic = "in-memory";
    let sent: Vec<_> = varied_records(100)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    produce_all(&producer(&broker.bootstrap(), &[]), topic, &sent).await;
    let produced = BTreeMap::from([(0, sent.into_iter().map(|(_, r)| r).collect::<Vec<_>>())]);
    let consumed = consume_exactly(&broker.bootstrap(), topic, &[(0, 0)], 100).await;
    assert_partitions_match(&produced, &consumed, 0);
    // The harness opts in to memory:// (--ephemeral-storage-ok); the broker says what it costs.
    assert!(
        broker.log_tail().contains("lost when the broker exits"),
        "no start-up warning about memory storage:\n{}",
        broker.log_tail()
    );
}

/// memory:// acknowledges acks=all and loses everything on exit: without the explicit opt-in
/// the broker refuses to start, naming the setting that allows it.
#[test]
fn memory_storage_without_the_opt_in_refuses_to_start() {
    let mut command = Command::new(strata_binary());
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--storage",
        "memory://",
        "--cluster",
        "false",
    ]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STRATA_") {
            command.env_remove(name);
        }
    }
    command.env("NO_COLOR", "1");
    let finished = run_with_deadline(command, b"", DEADLINE);
    assert!(
        !finished.status.success(),
        "strata serve --storage memory:// started without the opt-in (status {})\n{}",
        finished.status,
        finished.stderr
    );
    assert!(
        finished.stderr.contains("ephemeral_storage_ok")
            && finished.stderr.contains("--ephemeral-storage-ok"),
        "the refusal does not name the setting:\n{}",
        finished.stderr
    );
}

#[derive(Debug, Clone, Copy)]
enum Stop {
    Graceful,
    Kill9,
}

/// Streams with an idempotent producer, stops the broker once 1/4 of the records are
/// acknowledged, restarts it on the same data and port, and lets the producer finish.
async fn idempotent_stream_across_restart(stop: Stop) {
    const PARTITIONS: i32 = 2;
    const RECORDS: u64 = 4000;
    let mut broker = StrataProcess::start();
    let bootstrap = broker.bootstrap();
    let topic = format!("idempotent-across-{stop:?}").to_lowercase();
    create_topic(&bootstrap, &topic, PARTITIONS, &[]).await;

    let producer = producer(
        &bootstrap,
        &[
            ("enable.idempotence", "true"),
            ("message.timeout.ms", "60000"),
            ("retry.backoff.ms", "20"),
            ("linger.ms", "2"),
        ],
    );
    let stream = ContinuousProducer::start(producer, &topic, PARTITIONS, 200, Some(RECORDS));
    stream.wait_for_acked(RECORDS as usize / 4, DEADLINE).await;
    match stop {
        Stop::Graceful => {
            let status = broker.sigterm();
            assert!(
                status.success(),
                "strata exited with {status} after SIGTERM"
            );
        }
        Stop::Kill9 => broker.kill9(),
    }
    let acked_before_restart = stream.acked();
    broker.restart();
    // Delivery reports wait for the message timeout at most; the stream needs a bit longer.
    let outcomes = stream.join(Duration::from_secs(90)).await;
    assert_eq!(
        outcomes.len() as u64,
        RECORDS,
        "the stream sent every record"
    );
    eprintln!(
        "{acked_before_restart} of {RECORDS} records were acknowledged when the broker stopped"
    );

    assert_every_record_acknowledged(&outcomes);
    let produced = records_by_partition(&outcomes);
    let starts: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let consumed = consume_exactly(&bootstrap, &topic, &starts, RECORDS as usize).await;
    assert_partitions_match(&produced, &consumed, 0);
    for (partition, records) in &produced {
        let high = watermarks(&bootstrap, &topic, *partition).await.1;
        assert_eq!(
            high,
            records.len() as i64,
            "high watermark of {topic}/{partition}: a duplicate or a gap"
        );
    }
}

/// An idempotent producer with unlimited retries must get every record in.
fn assert_every_record_acknowledged(outcomes: &[Outcome]) {
    let failed: Vec<_> = outcomes.iter().filter(|o| o.result.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} deliveries failed; first: {:?}",
        failed.len(),
        outcomes.len(),
        failed.first()
    );
}

/// Send order per partition; each acknowledged offset must match its position.
fn records_by_partition(outcomes: &[Outcome]) -> BTreeMap<i32, Vec<TestRecord>> {
    let mut produced: BTreeMap<i32, Vec<TestRecord>> = BTreeMap::new();
    for outcome in outcomes {
        let records = produced.entry(outcome.partition).or_default();
        let acked = outcome.result.as_ref().expect("checked above");
        assert_eq!(
            (acked.partition, acked.offset),
            (outcome.partition, records.len() as i64),
            "record {} acknowledged out of place",
            outcome.sequence
        );
        records.push(outcome.record.clone());
    }
    produced
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_streams_across_a_graceful_restart_without_duplicates_or_gaps() {
    idempotent_stream_across_restart(Stop::Graceful).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_streams_across_a_kill9_restart_without_duplicates_or_gaps() {
    idempotent_stream_across_restart(Stop::Kill9).await;
}

/// In cluster mode (the default) a broker restarted on the same machine after SIGKILL finds its
/// predecessor's registration, proves through the process table that its process is gone, and
/// takes the id and every partition over at once. The lease here is ten minutes, far beyond the
/// producer's delivery timeout: had the restart waited it out, nothing would be acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_after_sigkill_does_not_wait_out_its_own_lease() {
    let mut broker = StrataProcess::start_with(StrataOptions::default().with_args([
        "--cluster",
        "true",
        "--lease-period",
        "10m",
    ]));
    let topic = "restart-without-lease";
    let first: Vec<_> = varied_records(50)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    produce_all(&producer(&broker.bootstrap(), &[]), topic, &first).await;

    broker.kill9();
    broker.restart();
    let second: Vec<_> = varied_records(50)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    let acked = produce_all(
        &producer(&broker.bootstrap(), &[("message.timeout.ms", "30000")]),
        topic,
        &second,
    )
    .await;
    assert_eq!(acked.first().map(|a| a.offset), Some(50));
    assert!(
        !broker
            .log_lines_containing("process no longer runs on this machine")
            .is_empty(),
        "the restart should have proven its predecessor dead\n{}",
        broker.log_tail()
    );
    let produced = BTreeMap::from([(
        0,
        first
            .into_iter()
            .chain(second)
            .map(|(_, r)| r)
            .collect::<Vec<_>>(),
    )]);
    let consumed = consume_exactly(&broker.bootstrap(), topic, &[(0, 0)], 100).await;
    assert_partitions_match(&produced, &consumed, 0);
}

/// A cluster broker killed before it wrote anything leaves a write-ahead stream that no
/// partition's manifest names, so no takeover seals it. Its node id's next start does, and the
/// collector retires it: a crash loop does not pile up registrations that every collector pass
/// lists (and every start reads) for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_before_any_write_leaves_no_stream_registrations_behind() {
    let mut broker = StrataProcess::start_with(
        StrataOptions::default().with_config("[log]\nretention_check_interval = \"200ms\"\n"),
    );
    for _ in 0..3 {
        broker.kill9();
        broker.restart();
    }
    // Four starts registered four streams; the three crashed ones must be retired (their
    // registrations deleted). The broker's log says so on every backend (CI reruns this on
    // S3 and RADOS, where there are no files to count).
    let retired = || {
        let mut streams: Vec<String> = broker
            .log_lines_containing("write-ahead stream retired")
            .iter()
            .filter_map(|line| line.rsplit("stream=").next().map(str::to_string))
            .collect();
        streams.sort();
        streams.dedup();
        streams.len()
    };
    wait_until("the crashed starts' streams retired", DEADLINE, || {
        (retired() >= 3).then_some(())
    });
    // The broker still serves.
    let topic = "after-a-crash-loop";
    let sent: Vec<_> = varied_records(10)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    produce_all(&producer(&broker.bootstrap(), &[]), topic, &sent).await;
    assert_eq!(watermarks(&broker.bootstrap(), topic, 0).await, (0, 10));
}
