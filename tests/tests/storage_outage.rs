//! A storage outage under a running producer: the broker's S3 store (radosgw) is frozen with
//! SIGSTOP for a few seconds while an idempotent acks=all producer streams, then thawed with
//! SIGCONT. The producer must only ever see retriable errors, its acknowledgements must resume
//! after the outage, and every acknowledged record must be in the log exactly once, at the
//! offset it was acknowledged at.
//!
//! Needs a radosgw this test may freeze: `STRATA_TEST_RGW_PID_FILE` (its pid file, e.g.
//! `$STRATA_CEPH_DIR/pids/rgw.pid` as written by scripts/ceph-up.sh) and `STRATA_TEST_S3_URL`
//! (the S3 URL base, with the AWS_* credentials in the environment, from ceph-up.sh's env file).
//! Without both it prints SKIPPED and passes.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The outage is timed on the real clock, and so is the recovery it reports.
#![allow(
    clippy::disallowed_methods,
    reason = "the injected outage and the recovery time are measured on the real clock"
)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::DeliveryFuture;
use rdkafka::types::RDKafkaErrorCode;
use strata_tests::clients::{
    consume_exactly, create_topic, future_record, producer, watermarks, Acked,
};
use strata_tests::records::TestRecord;
use strata_tests::signals;
use strata_tests::stream::stream_record;
use strata_tests::wait::{wait_until_async, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

const PARTITIONS: i32 = 2;
/// Records kept unacknowledged at most.
const WINDOW: usize = 200;
/// Acknowledged records before the outage starts.
const BEFORE_OUTAGE: usize = 2_000;
/// More records that must be acknowledged after the outage ends.
const AFTER_OUTAGE: usize = 2_000;
/// How long radosgw is frozen. This sleep *is* the fault being injected, not synchronisation.
const OUTAGE: Duration = Duration::from_secs(5);
/// librdkafka's delivery timeout: long enough to ride out the outage with retries.
const MESSAGE_TIMEOUT_MS: &str = "60000";

/// Delivery errors a producer may see for a storage outage: the broker's retriable answers
/// and librdkafka's own timeouts and transport failures. Anything else is a bug.
const RETRIABLE: &[RDKafkaErrorCode] = &[
    RDKafkaErrorCode::KafkaStorageError,
    RDKafkaErrorCode::RequestTimedOut,
    RDKafkaErrorCode::NotEnoughReplicas,
    RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
    RDKafkaErrorCode::LeaderNotAvailable,
    RDKafkaErrorCode::NotLeaderForPartition,
    RDKafkaErrorCode::NetworkException,
    RDKafkaErrorCode::MessageTimedOut,
    RDKafkaErrorCode::BrokerTransportFailure,
    RDKafkaErrorCode::AllBrokersDown,
];

/// A stopped process, continued when dropped — also when the test panics while it is stopped,
/// so a failing test never leaves radosgw frozen for whatever runs next.
struct Stopped {
    pid: libc::pid_t,
}

impl Stopped {
    fn stop(pid: libc::pid_t) -> Self {
        signals::stop(pid, "radosgw");
        Self { pid }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // Not signals::resume: that asserts, and a panic inside a drop during a test's own
        // panic would abort the whole test binary.
        // SAFETY: kill(2) with a valid signal number has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.pid, libc::SIGCONT) };
        if rc != 0 {
            eprintln!(
                "SIGCONT to radosgw (pid {}) failed: {}",
                self.pid,
                std::io::Error::last_os_error()
            );
        }
    }
}

/// One record's fate.
struct Outcome {
    sequence: u64,
    partition: i32,
    record: TestRecord,
    result: Result<Acked, KafkaError>,
    /// When its delivery report arrived.
    reported: Instant,
}

/// Streams records 0, 1, 2, ... round-robin over the partitions with at most `WINDOW`
/// unacknowledged, until `stop` is set; returns every outcome in send order.
async fn produce_until(
    producer: strata_tests::clients::TestProducer,
    topic: String,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut in_flight: VecDeque<(u64, i32, TestRecord, DeliveryFuture)> = VecDeque::new();
    let mut next: u64 = 0;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if stopping && in_flight.is_empty() {
            break;
        }
        if stopping || in_flight.len() >= WINDOW {
            let (sequence, partition, record, delivery) = in_flight.pop_front().expect("non-empty");
            let result = match delivery.await {
                Ok(Ok(delivery)) => Ok(Acked {
                    partition: delivery.partition,
                    offset: delivery.offset,
                }),
                Ok(Err((error, _))) => Err(error),
                Err(_) => panic!("the delivery future of record {sequence} was dropped"),
            };
            if result.is_ok() {
                acked.fetch_add(1, Ordering::SeqCst);
            }
            outcomes.push(Outcome {
                sequence,
                partition,
                record,
                result,
                reported: Instant::now(),
            });
            continue;
        }
        let partition = (next % PARTITIONS as u64) as i32;
        let record = stream_record(next);
        let delivery = producer
            .send_result(future_record(&topic, Some(partition), &record))
            .unwrap_or_else(|(e, _)| panic!("enqueue record {next}: {e}"));
        in_flight.push_back((next, partition, record, delivery));
        next += 1;
    }
    outcomes
}

async fn wait_for_acked(acked: &Arc<AtomicUsize>, count: usize, timeout: Duration) {
    wait_until_async(
        &format!("{count} records are acknowledged"),
        timeout,
        || {
            let now = acked.load(Ordering::SeqCst);
            async move { (now >= count).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_rides_out_a_storage_outage_without_loss_or_duplicates() {
    let (Ok(pid_file), Ok(s3_base)) = (
        std::env::var("STRATA_TEST_RGW_PID_FILE"),
        std::env::var("STRATA_TEST_S3_URL"),
    ) else {
        eprintln!("SKIPPED: set STRATA_TEST_RGW_PID_FILE and STRATA_TEST_S3_URL to run this test");
        return;
    };
    let pid: libc::pid_t = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("read {pid_file}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{pid_file} holds no pid: {e}"));

    // A prefix of its own under the bucket, so no other test's objects are seen.
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis();
    let prefix = format!("outage{}x{millis}", std::process::id());
    let url = match s3_base.split_once('?') {
        Some((head, query)) => format!("{}/{prefix}?{query}", head.trim_end_matches('/')),
        None => format!("{}/{prefix}", s3_base.trim_end_matches('/')),
    };
    eprintln!("storage: {url}; radosgw pid {pid}");
    let broker = StrataProcess::start_with(StrataOptions::default().with_storage_url(url));
    let bootstrap = broker.bootstrap();
    let topic = "storage-outage";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;

    let producer = producer(
        &bootstrap,
        &[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("retries", "2147483647"),
            ("retry.backoff.ms", "50"),
            ("message.timeout.ms", MESSAGE_TIMEOUT_MS),
            ("linger.ms", "5"),
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(produce_until(
        producer,
        topic.to_string(),
        Arc::clone(&stop),
        Arc::clone(&acked),
    ));

    wait_for_acked(&acked, BEFORE_OUTAGE, DEADLINE).await;
    let outage_started = Instant::now();
    let acked_at_stop;
    let acked_at_cont;
    {
        let _stopped = tokio::task::block_in_place(|| Stopped::stop(pid));
        acked_at_stop = acked.load(Ordering::SeqCst);
        tokio::time::sleep(OUTAGE).await;
        acked_at_cont = acked.load(Ordering::SeqCst);
    } // SIGCONT here (and on any panic above).
    let outage_ended = Instant::now();
    eprintln!(
        "radosgw stopped for {:?}: {acked_at_stop} records acknowledged at SIGSTOP, \
         {acked_at_cont} at SIGCONT",
        outage_ended - outage_started
    );

    // Recovery: AFTER_OUTAGE more acknowledgements, within the delivery timeout plus a margin.
    wait_for_acked(
        &acked,
        acked_at_cont + AFTER_OUTAGE,
        Duration::from_secs(90),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let outcomes = tokio::time::timeout(Duration::from_secs(90), task)
        .await
        .expect("the producer stream drains within 90 s")
        .expect("the producing task panicked");

    // Errors: only retriable ones, if any.
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.result.is_err()).collect();
    for outcome in &failed {
        let Err(error) = &outcome.result else {
            continue;
        };
        let code = error.rdkafka_error_code();
        assert!(
            code.is_some_and(|c| RETRIABLE.contains(&c)),
            "record {} failed with a non-retriable error: {error}\nbroker log:\n{}",
            outcome.sequence,
            broker.log_tail()
        );
    }
    // Recovery: acknowledgements after SIGCONT, and the first of them.
    let first_ack_after = outcomes
        .iter()
        .filter(|o| o.result.is_ok() && o.reported > outage_ended)
        .map(|o| o.reported)
        .min()
        .expect("acknowledgements resumed after the outage");
    let acked_after = outcomes
        .iter()
        .filter(|o| o.result.is_ok() && o.reported > outage_ended)
        .count();
    assert!(
        acked_after >= AFTER_OUTAGE,
        "only {acked_after} acknowledgements after the outage"
    );
    eprintln!(
        "{} records sent, {} acknowledged, {} failed (retriable); first acknowledgement {:?} \
         after SIGCONT",
        outcomes.len(),
        outcomes.len() - failed.len(),
        failed.len(),
        first_ack_after - outage_ended
    );

    // What the broker made of the outage, for the test's output: warnings, errors and (with
    // STRATA_TEST_LOG=info,strata_storage=debug) its storage retries.
    let broker_log = broker.log_tail();
    let complaints: Vec<&str> = broker_log
        .lines()
        .filter(|l| {
            [
                " WARN ",
                " ERROR ",
                "storage request failed",
                "retrying storage request",
                "ambiguous put",
            ]
            .iter()
            .any(|marker| l.contains(marker))
        })
        .collect();
    eprintln!(
        "broker warnings, errors and retries in its last log lines: {}",
        complaints.len()
    );
    for line in complaints.iter().take(10) {
        eprintln!("  {line}");
    }

    // Every acknowledged record exactly once, at its acknowledged offset. Records that failed
    // delivery may or may not be in the log (at most once, the producer is idempotent).
    let mut high = BTreeMap::new();
    for partition in 0..PARTITIONS {
        high.insert(partition, watermarks(&bootstrap, topic, partition).await.1);
    }
    let total: i64 = high.values().sum();
    let starts: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let consumed = consume_exactly(&bootstrap, topic, &starts, total as usize).await;
    let mut at: BTreeMap<(i32, i64), &TestRecord> = BTreeMap::new();
    let mut seen_keys: BTreeMap<Vec<u8>, (i32, i64)> = BTreeMap::new();
    for received in &consumed {
        let place = (received.partition, received.offset);
        assert!(
            at.insert(place, &received.record).is_none(),
            "offset {place:?} consumed twice"
        );
        let key = received
            .record
            .key
            .clone()
            .expect("stream records have keys");
        if let Some(first) = seen_keys.insert(key.clone(), place) {
            panic!(
                "record {} is in the log twice: at {first:?} and at {place:?}",
                String::from_utf8_lossy(&key)
            );
        }
    }
    for outcome in &outcomes {
        let Ok(ack) = &outcome.result else { continue };
        assert_eq!(
            ack.partition, outcome.partition,
            "record {} acknowledged on another partition",
            outcome.sequence
        );
        let found = at.get(&(ack.partition, ack.offset)).unwrap_or_else(|| {
            panic!(
                "record {} acknowledged at {}/{} is missing (high watermark {})",
                outcome.sequence, ack.partition, ack.offset, high[&ack.partition]
            )
        });
        // The log adds a timestamp the stream left to the client; the rest must be identical.
        assert!(
            (&found.key, &found.value, &found.headers)
                == (
                    &outcome.record.key,
                    &outcome.record.value,
                    &outcome.record.headers
                ),
            "record {} acknowledged at {}/{} but another record is there",
            outcome.sequence,
            ack.partition,
            ack.offset
        );
    }
}
