//! Crash safety: a broker killed with SIGKILL at random points of a continuous acks=all stream
//! loses nothing it acknowledged. Every acknowledged record is present exactly once, at the
//! offset it was acknowledged at, and acknowledged records keep their send order.
//!
//! The producer does not retry (`retries=0`) and is not idempotent, so the client never
//! writes a record twice: any duplicate or loss is the broker's. Records whose delivery failed
//! (in flight at a kill) may or may not be in the log, but at most once.
//!
//! Kill points are drawn from a seeded RNG; the seed is printed, and `STRATA_TEST_SEED=<seed>`
//! replays the same schedule (the same acknowledgement counts; thread timing still varies).

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_tests::clients::{consume_exactly, create_topic, producer, watermarks};
use strata_tests::records::{now_ms, ReceivedRecord};
use strata_tests::stream::{ContinuousProducer, Outcome};
use strata_tests::wait::DEADLINE;
use strata_tests::StrataProcess;

const PARTITIONS: i32 = 2;

fn seed() -> u64 {
    match std::env::var("STRATA_TEST_SEED") {
        Ok(text) => text.parse().expect("STRATA_TEST_SEED must be an integer"),
        Err(_) => now_ms() as u64,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_repeated_sigkills_exactly_once_and_in_place() {
    let seed = seed();
    eprintln!("crash test seed: {seed} (replay with STRATA_TEST_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);

    let mut broker = StrataProcess::start();
    let bootstrap = broker.bootstrap();
    let topic = "crash-acks-all";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;
    let producer = producer(
        &bootstrap,
        &[
            ("retries", "0"),
            ("enable.idempotence", "false"),
            ("message.timeout.ms", "20000"),
            ("linger.ms", "1"),
        ],
    );
    let stream = ContinuousProducer::start(producer, topic, PARTITIONS, 500, None);

    let kills = rng.random_range(3..=5);
    for kill in 1..=kills {
        let target = stream.acked() + rng.random_range(200..1500);
        stream.wait_for_acked(target, DEADLINE).await;
        // A random extra moment, so kills land at different phases of the group commit.
        let jitter = Duration::from_millis(rng.random_range(0..25));
        tokio::time::sleep(jitter).await;
        broker.kill9();
        eprintln!(
            "kill {kill}/{kills}: SIGKILL after {} acknowledgements (+{jitter:?})",
            stream.acked()
        );
        broker.restart();
    }
    // The last incarnation must take writes too before the stream stops.
    let target = stream.acked() + 500;
    stream.wait_for_acked(target, DEADLINE).await;
    let outcomes = stream.finish().await;
    let acknowledged = outcomes.iter().filter(|o| o.result.is_ok()).count();
    eprintln!(
        "{} records sent, {acknowledged} acknowledged, {kills} kills (seed {seed})",
        outcomes.len()
    );

    let log = read_whole_log(&bootstrap, topic).await;
    assert_acknowledged_records_in_place(&outcomes, &log, seed);
    assert_no_record_twice(&log, seed);
    assert_acknowledged_order_kept(&outcomes, seed);
}

/// Every record of every partition, from offset 0 to the high watermark; offsets must be dense.
async fn read_whole_log(bootstrap: &str, topic: &str) -> BTreeMap<(i32, i64), ReceivedRecord> {
    let mut starts = Vec::new();
    let mut total = 0usize;
    for partition in 0..PARTITIONS {
        let (low, high) = watermarks(bootstrap, topic, partition).await;
        assert_eq!(
            low, 0,
            "nothing was deleted, so {topic}/{partition} must start at 0"
        );
        starts.push((partition, 0));
        total += high as usize;
    }
    let consumed = consume_exactly(bootstrap, topic, &starts, total).await;
    let mut log = BTreeMap::new();
    let mut next_offset: HashMap<i32, i64> = HashMap::new();
    for record in consumed {
        let expected = next_offset.entry(record.partition).or_insert(0);
        assert_eq!(
            record.offset, *expected,
            "gap or repeat in {topic}/{}",
            record.partition
        );
        *expected += 1;
        log.insert((record.partition, record.offset), record);
    }
    log
}

fn assert_acknowledged_records_in_place(
    outcomes: &[Outcome],
    log: &BTreeMap<(i32, i64), ReceivedRecord>,
    seed: u64,
) {
    for outcome in outcomes {
        let Ok(acked) = &outcome.result else { continue };
        let stored = log
            .get(&(acked.partition, acked.offset))
            .unwrap_or_else(|| {
                panic!(
                    "record {} was acknowledged at {}/{} but the log ends before it (seed {seed})",
                    outcome.sequence, acked.partition, acked.offset
                )
            });
        assert!(
            stored.record.key == outcome.record.key && stored.record.value == outcome.record.value,
            "record {} was acknowledged at {}/{} but that offset holds key {:?} (seed {seed})",
            outcome.sequence,
            acked.partition,
            acked.offset,
            stored.record.key.as_deref().map(String::from_utf8_lossy),
        );
    }
}

/// Values are unique per sequence number, and the client never resends.
fn assert_no_record_twice(log: &BTreeMap<(i32, i64), ReceivedRecord>, seed: u64) {
    let mut seen: HashMap<&[u8], (i32, i64)> = HashMap::new();
    for (place, record) in log {
        let value = record.record.value.as_deref().unwrap_or_default();
        if let Some(first) = seen.insert(value, *place) {
            panic!(
                "value {:?} is stored twice, at {first:?} and {place:?} (seed {seed})",
                String::from_utf8_lossy(value)
            );
        }
    }
}

/// Within a partition, acknowledged records sent later sit at higher offsets.
fn assert_acknowledged_order_kept(outcomes: &[Outcome], seed: u64) {
    let mut last: HashMap<i32, (u64, i64)> = HashMap::new();
    for outcome in outcomes {
        let Ok(acked) = &outcome.result else { continue };
        if let Some((sequence, offset)) =
            last.insert(acked.partition, (outcome.sequence, acked.offset))
        {
            assert!(
                acked.offset > offset,
                "record {} (offset {}) was sent after record {sequence} (offset {offset}) on partition {} (seed {seed})",
                outcome.sequence,
                acked.offset,
                acked.partition
            );
        }
    }
}
