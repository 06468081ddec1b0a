//! Cluster mode end to end: several `strata serve --cluster true` processes sharing one storage,
//! driven by real librdkafka clients while partitions move, a broker is SIGKILLed, and a broker
//! is frozen (SIGSTOP) past its lease and then let run again.
//!
//! The invariant every test checks: each record the producer got an acknowledgement for
//! (acks=all) is in the log, read back through the surviving brokers, at exactly the
//! (partition, offset) it was acknowledged at, and the log's offsets are dense. The producer is
//! not idempotent and retries, so a record whose first attempt was written but not acknowledged
//! may be stored twice (Kafka's at-least-once); such duplicates are counted and printed, not
//! failed on. Every record in the log must be one the test sent, to the partition it was sent to.
//!
//! Per-partition order is asserted only for the idempotent producer, the one configuration in
//! which librdkafka promises it across a change of leader (it drains a partition's requests in
//! flight to the old leader before sending to the new one). Without idempotence, even with one
//! request in flight per connection, a partition's NOT_LEADER answer rides in a response that
//! also waits for the other partitions of the same request; if the client learns the new leader
//! meanwhile (from a metadata refresh another error triggered), it sends newer records there
//! before it retries the older ones — a CI run caught exactly that after a move, and Kafka's
//! brokers answer the same way. After a SIGKILL or a pause the reordering is routine: requests
//! stuck on the dead broker's connection are retried only when that connection fails. So for
//! the non-idempotent producer the order is reported, not asserted.
//!
//! Brokers get node ids 1, 2, 3; the storage is a shared temporary directory, or a common
//! prefix under `STRATA_TEST_STORAGE` (see `SharedStorage`). Random choices (which partition
//! moves where) come from a seeded RNG whose seed is printed; `STRATA_TEST_SEED=<n>` replays it.
//! Handover and failover times are printed from the test's own clock and from the brokers'
//! `acquired ... in N ms` / `handed over ... in N ms` lines (`--nocapture` shows them).

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Deadlines and measured times against real processes need the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use kafka_protocol::messages::{MetadataRequest, ProduceRequest, ProduceResponse};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use tokio::task::JoinHandle;

use strata_tests::batch::{encode_batch, BatchRecord, Codec};
use strata_tests::clients::{
    base_config, client_log_tail, consume_exactly, create_topic, producer, watermarks, Acked,
    TestConsumer, TestContext, TestProducer,
};
use strata_tests::cluster::{describe_millis, reported_millis, short_log_line, Cluster};
use strata_tests::raw::{
    decode_response, produce_partition_response, produce_request, RawConnection, ReadOutcome,
    PRODUCE_VERSION_CAP,
};
use strata_tests::records::now_ms;
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{SharedStorage, StrataOptions, StrataProcess};

/// Records per second the producer offers (across all partitions): enough to keep every
/// partition busy through each handover, few enough that reading everything back is quick.
const PRODUCE_RATE: f64 = 1500.0;
/// Unacknowledged records per partition at most, so one stalled partition does not stop the
/// others.
const WINDOW_PER_PARTITION: usize = 100;

fn seed() -> u64 {
    match std::env::var("STRATA_TEST_SEED") {
        Ok(text) => text.parse().expect("STRATA_TEST_SEED must be an integer"),
        Err(_) => now_ms() as u64,
    }
}

// ---------------------------------------------------------------------------------------------
// The producer
// ---------------------------------------------------------------------------------------------

/// One record the test sent, and what became of it.
#[derive(Debug)]
struct Sent {
    sequence: u64,
    partition: i32,
    value: Vec<u8>,
    result: Result<Acked, String>,
    /// When the delivery report arrived.
    reported_at: Instant,
}

fn record_value(sequence: u64, partition: i32) -> Vec<u8> {
    format!(
        "v-{sequence}-p{partition}-{}",
        "x".repeat((sequence % 61) as usize)
    )
    .into_bytes()
}

/// The sequence number encoded in a value made by [`record_value`].
fn sequence_of(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value)
        .ok()?
        .strip_prefix("v-")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

#[derive(Debug, Clone, Default)]
struct Progress {
    acked: Vec<usize>,
    failed: usize,
}

/// Produces records 0, 1, 2, ... at [`PRODUCE_RATE`], each to the next partition (in turn) that
/// has fewer than [`WINDOW_PER_PARTITION`] records unacknowledged, until finished.
struct ProducerStream {
    stop: Arc<AtomicBool>,
    progress: Arc<Mutex<Progress>>,
    task: JoinHandle<Vec<Sent>>,
}

type Delivery = Pin<Box<dyn Future<Output = Sent> + Send>>;

impl ProducerStream {
    fn start(producer: TestProducer, topic: &str, partitions: i32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Mutex::new(Progress {
            acked: vec![0; partitions as usize],
            failed: 0,
        }));
        let task = tokio::spawn(produce_loop(
            producer,
            topic.to_string(),
            partitions,
            Arc::clone(&stop),
            Arc::clone(&progress),
        ));
        Self {
            stop,
            progress,
            task,
        }
    }

    fn progress(&self) -> Progress {
        self.progress.lock().unwrap().clone()
    }

    /// Waits until every partition in `partitions` has at least `more` acknowledgements beyond
    /// `since`, and returns how long that took.
    async fn wait_for_more_acks(
        &self,
        since: &Progress,
        partitions: &[i32],
        more: usize,
        what: &str,
    ) -> Duration {
        let started = Instant::now();
        let deadline = started + DEADLINE;
        loop {
            let now = self.progress();
            if partitions
                .iter()
                .all(|&p| now.acked[p as usize] >= since.acked[p as usize] + more)
            {
                return started.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {DEADLINE:?} waiting until {what}: {more} more acknowledgements \
                 on partitions {partitions:?}; acknowledged then {:?}, now {:?}, {} failed\n\
                 client log:\n{}",
                since.acked,
                now.acked,
                now.failed,
                client_log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops sending, waits for every outstanding delivery report, and returns every record in
    /// send order.
    async fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        // message.timeout.ms bounds every outstanding report.
        let mut sent = tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the producer's delivery reports did not all arrive within 60 s")
            .expect("the producing task panicked");
        sent.sort_by_key(|s| s.sequence);
        sent
    }
}

async fn produce_loop(
    producer: TestProducer,
    topic: String,
    partitions: i32,
    stop: Arc<AtomicBool>,
    progress: Arc<Mutex<Progress>>,
) -> Vec<Sent> {
    let started = Instant::now();
    let mut in_flight: FuturesUnordered<Delivery> = FuturesUnordered::new();
    let mut unacknowledged = vec![0usize; partitions as usize];
    let mut outcomes = Vec::new();
    let mut next: u64 = 0;
    let mut turn: i32 = 0;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if stopping && in_flight.is_empty() {
            break;
        }
        let due = started + Duration::from_secs_f64(next as f64 / PRODUCE_RATE);
        let free = (0..partitions)
            .map(|i| (turn + i) % partitions)
            .find(|&p| unacknowledged[p as usize] < WINDOW_PER_PARTITION);
        if let (false, Some(partition)) = (stopping, free) {
            if Instant::now() >= due {
                let sequence = next;
                let value = record_value(sequence, partition);
                let key = format!("k-{sequence}");
                let delivery = producer
                    .send_result(
                        FutureRecord::to(&topic)
                            .partition(partition)
                            .key(key.as_bytes())
                            .payload(value.as_slice()),
                    )
                    .unwrap_or_else(|(e, _)| panic!("enqueue record {sequence}: {e}"));
                in_flight.push(Box::pin(async move {
                    let result = match delivery.await {
                        Ok(Ok(delivery)) => Ok(Acked {
                            partition: delivery.partition,
                            offset: delivery.offset,
                        }),
                        Ok(Err((error, _))) => Err(error.to_string()),
                        Err(_) => Err("delivery future dropped by the producer".to_string()),
                    };
                    Sent {
                        sequence,
                        partition,
                        value,
                        result,
                        reported_at: Instant::now(),
                    }
                }));
                unacknowledged[partition as usize] += 1;
                next += 1;
                turn = (partition + 1) % partitions;
                continue;
            }
        }
        let wake_at = (!stopping && free.is_some()).then_some(due);
        tokio::select! {
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                unacknowledged[done.partition as usize] -= 1;
                {
                    let mut progress = progress.lock().unwrap();
                    match &done.result {
                        Ok(_) => progress.acked[done.partition as usize] += 1,
                        Err(_) => progress.failed += 1,
                    }
                }
                outcomes.push(done);
            }
            _ = tokio::time::sleep_until(wake_at.unwrap_or(started).into()), if wake_at.is_some() => {}
            else => {}
        }
    }
    outcomes
}

/// A non-idempotent acks=all producer that retries (librdkafka's default retry count) with one
/// request in flight per connection. Requests time out after 5 s instead of 30-60 s: a frozen
/// broker keeps its connections open, and librdkafka would otherwise wait that long on a
/// Produce or a Metadata request it sent there before trying the new owner.
fn cluster_producer(bootstrap: &str) -> TestProducer {
    producer(
        bootstrap,
        &[
            ("enable.idempotence", "false"),
            ("retries", "2147483647"),
            ("retry.backoff.ms", "20"),
            ("retry.backoff.max.ms", "200"),
            ("max.in.flight.requests.per.connection", "1"),
            ("linger.ms", "2"),
            ("message.timeout.ms", "45000"),
            ("request.timeout.ms", "5000"),
            ("socket.timeout.ms", "5000"),
        ],
    )
}

// ---------------------------------------------------------------------------------------------
// Reading back and checking
// ---------------------------------------------------------------------------------------------

/// Every record of every partition from offset 0 to the high watermark, read through the
/// brokers in `bootstrap`; offsets must be dense.
async fn read_whole_log(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<(i32, i64), Option<Vec<u8>>> {
    let mut starts = Vec::new();
    let mut total = 0usize;
    for partition in 0..partitions {
        let (low, high) = watermarks(bootstrap, topic, partition).await;
        assert_eq!(
            low, 0,
            "nothing was deleted, so {topic}/{partition} starts at 0"
        );
        starts.push((partition, 0));
        total += usize::try_from(high).unwrap();
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
        log.insert((record.partition, record.offset), record.record.value);
    }
    log
}

/// What the checks found beyond the assertions, for the report.
#[derive(Debug)]
struct Summary {
    sent: usize,
    acknowledged: usize,
    failed: usize,
    stored: usize,
    /// Records stored more than once (a retry of a write whose answer was lost).
    stored_twice: usize,
    /// Records stored although their delivery failed.
    stored_but_failed: usize,
    /// Pairs of consecutive acknowledged records of one partition whose offsets run backwards.
    order_inversions: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} records sent, {} acknowledged, {} failed; {} stored, {} of them stored twice, \
             {} stored although their delivery failed; {} order inversions among acknowledged",
            self.sent,
            self.acknowledged,
            self.failed,
            self.stored,
            self.stored_twice,
            self.stored_but_failed,
            self.order_inversions
        )
    }
}

/// The invariants; see the file comment. `strict_order` also demands that each partition's
/// acknowledged offsets increase in send order.
fn check_log(
    sent: &[Sent],
    log: &BTreeMap<(i32, i64), Option<Vec<u8>>>,
    strict_order: bool,
    seed: u64,
) -> Summary {
    let by_sequence: HashMap<u64, &Sent> = sent.iter().map(|s| (s.sequence, s)).collect();
    let mut copies: HashMap<u64, usize> = HashMap::new();
    for ((partition, offset), value) in log {
        let value = value.as_deref().unwrap_or_default();
        let sequence = sequence_of(value).unwrap_or_else(|| {
            panic!(
                "{partition}/{offset} holds {:?}, which the test never sent (seed {seed})",
                String::from_utf8_lossy(value)
            )
        });
        let original = by_sequence.get(&sequence).unwrap_or_else(|| {
            panic!("{partition}/{offset} holds record {sequence}, never sent (seed {seed})")
        });
        assert!(
            original.partition == *partition && original.value == value,
            "{partition}/{offset} holds {:?}, but record {sequence} was sent to partition {} \
             as {:?} (seed {seed})",
            String::from_utf8_lossy(value),
            original.partition,
            String::from_utf8_lossy(&original.value)
        );
        *copies.entry(sequence).or_default() += 1;
    }
    let mut acknowledged = 0;
    let mut failed = 0;
    let mut last_acked: HashMap<i32, (u64, i64)> = HashMap::new();
    let mut order_inversions = 0;
    for record in sent {
        let acked = match &record.result {
            Ok(acked) => acked,
            Err(_) => {
                failed += 1;
                continue;
            }
        };
        acknowledged += 1;
        assert_eq!(
            acked.partition, record.partition,
            "record {} was sent to partition {} but acknowledged on {} (seed {seed})",
            record.sequence, record.partition, acked.partition
        );
        let stored = log
            .get(&(acked.partition, acked.offset))
            .unwrap_or_else(|| {
                panic!(
                    "record {} was acknowledged at {}/{} but the log ends before that offset \
                 (seed {seed})",
                    record.sequence, acked.partition, acked.offset
                )
            });
        assert!(
            stored.as_deref() == Some(record.value.as_slice()),
            "record {} was acknowledged at {}/{} but that offset holds {:?} (seed {seed})",
            record.sequence,
            acked.partition,
            acked.offset,
            stored.as_deref().map(String::from_utf8_lossy)
        );
        if let Some((previous, previous_offset)) =
            last_acked.insert(acked.partition, (record.sequence, acked.offset))
        {
            if acked.offset <= previous_offset {
                order_inversions += 1;
                assert!(
                    !strict_order,
                    "on partition {}, record {} (sent later) was acknowledged at offset {} but \
                     record {previous} (sent earlier) at {previous_offset} (seed {seed})",
                    acked.partition, record.sequence, acked.offset
                );
            }
        }
    }
    let stored_but_failed = sent
        .iter()
        .filter(|s| s.result.is_err() && copies.contains_key(&s.sequence))
        .count();
    Summary {
        sent: sent.len(),
        acknowledged,
        failed,
        stored: log.len(),
        stored_twice: copies.values().filter(|&&n| n > 1).count(),
        stored_but_failed,
        order_inversions,
    }
}

/// The longest time partition `partition` went without an acknowledgement, among the gaps
/// that end within `window`.
fn longest_ack_gap(sent: &[Sent], partition: i32, window: (Instant, Instant)) -> Duration {
    let mut reports: Vec<Instant> = sent
        .iter()
        .filter(|s| s.partition == partition && s.result.is_ok())
        .map(|s| s.reported_at)
        .collect();
    reports.sort_unstable();
    reports
        .windows(2)
        .filter(|pair| pair[1] >= window.0 && pair[1] <= window.1)
        .map(|pair| pair[1] - pair[0])
        .max()
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// A consumer-group member
// ---------------------------------------------------------------------------------------------

/// One subscribed rdkafka consumer with auto-commit, recording every record it receives.
struct GroupMember {
    stop: Arc<AtomicBool>,
    received: Arc<Mutex<GroupReceived>>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct GroupReceived {
    /// (partition, offset) -> value, first delivery.
    records: HashMap<(i32, i64), Option<Vec<u8>>>,
    /// Deliveries of an offset already received (at-least-once after a rebalance).
    redelivered: usize,
    errors: Vec<String>,
}

impl GroupMember {
    fn start(bootstrap: &str, topic: &str, group: &str) -> Self {
        let mut config: ClientConfig = base_config(bootstrap);
        config
            .set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "200")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .set("fetch.wait.max.ms", "100");
        let consumer: TestConsumer = config
            .create_with_context(TestContext)
            .expect("create the group consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Mutex::new(GroupReceived::default()));
        let task = tokio::spawn({
            let stop = Arc::clone(&stop);
            let received = Arc::clone(&received);
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(next) =
                        tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await
                    else {
                        continue;
                    };
                    let mut received = received.lock().unwrap();
                    match next {
                        Ok(message) => {
                            let place = (message.partition(), message.offset());
                            let value = message.payload().map(<[u8]>::to_vec);
                            if received.records.insert(place, value).is_some() {
                                received.redelivered += 1;
                            }
                        }
                        // Transport errors while a broker dies are expected; librdkafka
                        // recovers by itself. The final check is what counts.
                        Err(error) => received.errors.push(error.to_string()),
                    }
                }
            }
        });
        Self {
            stop,
            received,
            task,
        }
    }

    /// How many of `wanted` this member has received.
    fn count_received(&self, wanted: &[(i32, i64)]) -> usize {
        let received = self.received.lock().unwrap();
        wanted
            .iter()
            .filter(|place| received.records.contains_key(place))
            .count()
    }

    async fn stop(self) -> GroupReceived {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the group consumer task panicked");
        Arc::try_unwrap(self.received)
            .ok()
            .expect("the consumer task is done")
            .into_inner()
            .unwrap()
    }
}

/// Three brokers (see [`Cluster::start`]) and a topic whose every partition has an owner:
/// the cluster, its ids, a bootstrap list naming all of them, and the owner of each partition.
async fn three_brokers_with_topic(
    lease: &str,
    heartbeat: &str,
    topic: &str,
    partitions: i32,
) -> (Cluster, Vec<i32>, String, BTreeMap<i32, i32>) {
    let cluster = Cluster::start(3, lease, heartbeat);
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    create_topic(&bootstrap, topic, partitions, &[]).await;
    let owners = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(1, topic, partitions, &ids, "every partition has an owner")
    });
    (cluster, ids, bootstrap, owners)
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_in_a_loop_while_producing_loses_nothing() {
    const PARTITIONS: i32 = 4;
    const MOVES: usize = 12;
    let seed = seed();
    eprintln!("migration test seed: {seed} (replay with STRATA_TEST_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);

    let topic = "cluster-migrations";
    let (mut cluster, ids, bootstrap, _) =
        three_brokers_with_topic("3s", "500ms", topic, PARTITIONS).await;

    let stream = ProducerStream::start(cluster_producer(&bootstrap), topic, PARTITIONS);
    let all: Vec<i32> = (0..PARTITIONS).collect();
    stream
        .wait_for_more_acks(&stream.progress(), &all, 200, "the stream is running")
        .await;

    let mut moves = Vec::new();
    for round in 1..=MOVES {
        let partition = rng.random_range(0..PARTITIONS);
        let asked = ids[rng.random_range(0..ids.len())];
        let owner = tokio::task::block_in_place(|| cluster.metadata_from(asked, Some(topic)))
            .leaders
            .get(&partition)
            .copied()
            .unwrap_or_else(|| panic!("broker {asked} names no owner of {topic}/{partition}"));
        let others: Vec<i32> = ids.iter().copied().filter(|&id| id != owner).collect();
        let target = others[rng.random_range(0..others.len())];

        let started = Instant::now();
        let said = tokio::task::block_in_place(|| cluster.move_partition(topic, partition, target));
        let command_took = started.elapsed();
        // Every broker's Metadata must now name the target.
        for &id in &ids {
            tokio::task::block_in_place(|| {
                wait_until(
                    &format!("broker {id} names broker {target} owner of {topic}/{partition}"),
                    DEADLINE,
                    || {
                        let view = cluster.metadata_from(id, Some(topic));
                        (view.leaders.get(&partition) == Some(&target)).then_some(())
                    },
                )
            });
        }
        let since = stream.progress();
        stream
            .wait_for_more_acks(
                &since,
                &[partition],
                20,
                &format!("the producer writes to {topic}/{partition} on broker {target}"),
            )
            .await;
        let resumed_at = Instant::now();
        eprintln!(
            "move {round}/{MOVES}: {topic}/{partition} {owner} -> {target}: command took \
             {command_took:?} and said {said:?}"
        );
        moves.push((partition, started, resumed_at));
    }

    let since = stream.progress();
    stream
        .wait_for_more_acks(&since, &all, 200, "the stream runs on after the moves")
        .await;
    let sent = stream.finish().await;
    let log = read_whole_log(&bootstrap, topic, PARTITIONS).await;
    // Not idempotent: order is reported, not asserted (see the file comment).
    let summary = check_log(&sent, &log, false, seed);
    eprintln!("migration test: {summary} (seed {seed})");
    for (round, (partition, started, resumed)) in moves.iter().enumerate() {
        eprintln!(
            "move {}: longest pause between acknowledgements on partition {partition}: {:?}",
            round + 1,
            longest_ack_gap(&sent, *partition, (*started, *resumed))
        );
    }
    eprintln!(
        "brokers' handovers: {}",
        describe_millis(&reported_millis(&cluster, "handed over ", topic))
    );
    eprintln!(
        "brokers' acquisitions: {}",
        describe_millis(&reported_millis(&cluster, "acquired ", topic))
    );
    assert_eq!(
        summary.failed, 0,
        "no delivery may fail in an orderly migration (seed {seed})"
    );
    // Every move is one graceful handover and one acquisition, and the brokers' metrics say so.
    let total = |cluster: &mut Cluster, series: &str| -> f64 {
        ids.iter().map(|&id| cluster.metric(id, series)).sum()
    };
    let handed_over = total(
        &mut cluster,
        "strata_cluster_ownership_changes_total{change=\"handed_over\"}",
    );
    assert!(
        handed_over >= MOVES as f64,
        "{handed_over} handovers reported for {MOVES} moves"
    );
    for &id in &ids {
        assert_eq!(cluster.metric(id, "strata_cluster_live_brokers"), 3.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_broker_while_producing_keeps_every_acknowledged_record() {
    const PARTITIONS: i32 = 6;
    let seed = seed();
    eprintln!("sigkill test seed: {seed}");
    let topic = "cluster-sigkill";
    let (mut cluster, ids, bootstrap, owners) =
        three_brokers_with_topic("3s", "500ms", topic, PARTITIONS).await;

    let member = GroupMember::start(&bootstrap, topic, "cluster-sigkill-group");
    let stream = ProducerStream::start(cluster_producer(&bootstrap), topic, PARTITIONS);
    let all: Vec<i32> = (0..PARTITIONS).collect();
    stream
        .wait_for_more_acks(&stream.progress(), &all, 300, "the stream is running")
        .await;

    // The owner of partition 0 dies, with whatever it holds.
    let victim = owners[&0];
    let survivors: Vec<i32> = ids.iter().copied().filter(|&id| id != victim).collect();
    let orphaned: Vec<i32> = owners
        .iter()
        .filter(|(_, &owner)| owner == victim)
        .map(|(&p, _)| p)
        .collect();
    let before = stream.progress();
    let killed_at = Instant::now();
    cluster.broker(victim).kill9();
    eprintln!("SIGKILL broker {victim}, owner of partitions {orphaned:?}");

    let new_owners = tokio::task::block_in_place(|| {
        for &id in &survivors {
            wait_until(
                &format!("broker {id} no longer counts broker {victim} live"),
                DEADLINE,
                || (!cluster.live_brokers_from(id).contains(&victim)).then_some(()),
            );
            // Metadata still lists it (departed_broker_listing), so that librdkafka keeps its
            // broker object; the leaders awaited below are all survivors.
            assert!(
                cluster.metadata_from(id, None).brokers.contains(&victim),
                "broker {id} should still list the departed broker {victim} in Metadata"
            );
        }
        cluster.wait_for_leaders(
            survivors[0],
            topic,
            PARTITIONS,
            &survivors,
            "the survivors own every partition",
        )
    });
    let taken_over = killed_at.elapsed();
    let resumed = stream
        .wait_for_more_acks(
            &before,
            &orphaned,
            50,
            "the orphaned partitions take writes again",
        )
        .await;
    eprintln!(
        "failover: survivors own every partition {taken_over:?} after the SIGKILL ({new_owners:?}); \
         the producer had 50 more acknowledgements on each orphaned partition after {resumed:?}"
    );
    let since = stream.progress();
    stream
        .wait_for_more_acks(&since, &all, 300, "the stream runs on after the failover")
        .await;
    let sent = stream.finish().await;

    let survivors_bootstrap = cluster.bootstrap_of(&survivors);
    let log = read_whole_log(&survivors_bootstrap, topic, PARTITIONS).await;
    let summary = check_log(&sent, &log, false, seed);
    eprintln!("sigkill test: {summary}");
    for &partition in &orphaned {
        eprintln!(
            "partition {partition}: longest pause between acknowledgements around the kill: {:?}",
            longest_ack_gap(&sent, partition, (killed_at, Instant::now()))
        );
    }

    // The group member must see every acknowledged record, each where it was acknowledged.
    let acknowledged: Vec<(i32, i64)> = sent
        .iter()
        .filter_map(|s| s.result.as_ref().ok())
        .map(|a| (a.partition, a.offset))
        .collect();
    tokio::task::block_in_place(|| {
        wait_until(
            &format!(
                "the group member received all {} acknowledged records",
                acknowledged.len()
            ),
            DEADLINE,
            || (member.count_received(&acknowledged) == acknowledged.len()).then_some(()),
        )
    });
    let received = member.stop().await;
    for (place, value) in &received.records {
        assert_eq!(
            log.get(place),
            Some(value),
            "the group member received {place:?} with another value than the log holds there"
        );
    }
    eprintln!(
        "group member: {} records, {} redelivered, {} consumer errors (first: {:?})",
        received.records.len(),
        received.redelivered,
        received.errors.len(),
        received.errors.first()
    );
    eprintln!(
        "brokers' acquisitions: {}",
        describe_millis(&reported_millis(&cluster, "acquired ", topic))
    );
    for line in cluster.ownership_log(topic) {
        eprintln!("  {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_broker_is_fenced_and_never_acknowledges_after_takeover() {
    const PARTITIONS: i32 = 4;
    let seed = seed();
    eprintln!("pause test seed: {seed}");
    let topic = "cluster-pause";
    let (mut cluster, ids, bootstrap, owners) =
        three_brokers_with_topic("2s", "300ms", topic, PARTITIONS).await;

    let stream = ProducerStream::start(cluster_producer(&bootstrap), topic, PARTITIONS);
    let all: Vec<i32> = (0..PARTITIONS).collect();
    stream
        .wait_for_more_acks(&stream.progress(), &all, 200, "the stream is running")
        .await;

    let victim = owners[&0];
    let survivors: Vec<i32> = ids.iter().copied().filter(|&id| id != victim).collect();
    let orphaned: Vec<i32> = owners
        .iter()
        .filter(|(_, &owner)| owner == victim)
        .map(|(&p, _)| p)
        .collect();
    // A connection opened while the victim runs; the Produce written to it while the victim
    // is frozen waits in its socket and is read only after the takeover.
    let mut stale = RawConnection::connect(cluster.brokers[&victim].addr());
    let versions = stale.api_versions();
    let produce_version =
        RawConnection::negotiate::<ProduceRequest>(&versions, PRODUCE_VERSION_CAP);

    let before = stream.progress();
    let paused_at = Instant::now();
    // pause() returns only once every thread of the broker is stopped: kill(SIGSTOP) alone
    // returns while its workers still run, and a Produce sent then can be taken in, written
    // and (after SIGCONT) truthfully acknowledged — it did reach storage before the seal.
    tokio::task::block_in_place(|| cluster.broker(victim).pause());
    eprintln!("SIGSTOP broker {victim}, owner of partitions {orphaned:?}");
    let stale_batch = encode_batch(
        &[BatchRecord::new(b"stale", b"written-to-a-paused-owner")],
        now_ms(),
        Codec::None,
    );
    let correlation_id = stale.send(produce_version, &produce_request(topic, 0, stale_batch));

    let new_owners = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(
            survivors[0],
            topic,
            PARTITIONS,
            &survivors,
            "the survivors own every partition",
        )
    });
    let taken_over = paused_at.elapsed();
    let resumed = stream
        .wait_for_more_acks(&before, &orphaned, 50, "the new owners take writes")
        .await;
    eprintln!(
        "takeover: survivors own every partition {taken_over:?} after the SIGSTOP \
         ({new_owners:?}); 50 more acknowledgements on each orphaned partition after {resumed:?}"
    );

    let resumed_at = Instant::now();
    cluster.broker(victim).resume();
    eprintln!("SIGCONT broker {victim}");
    // Whatever it does now, it must not acknowledge the Produce it finds waiting. The verdict
    // waits until the broker has exited, so a failure shows its whole log (fenced or not).
    let answer = tokio::task::block_in_place(|| stale.read_frame(DEADLINE));
    let stale_ack = match answer {
        ReadOutcome::Frame(frame) => {
            let response: ProduceResponse =
                decode_response::<ProduceRequest>(produce_version, correlation_id, frame);
            let partition = produce_partition_response(response, topic, 0);
            eprintln!(
                "the resumed broker answered the stale Produce with error code {}",
                partition.error_code
            );
            (partition.error_code == 0).then_some(partition.base_offset)
        }
        ReadOutcome::Closed => {
            eprintln!("the resumed broker closed the connection with the stale Produce");
            None
        }
        ReadOutcome::TimedOut => panic!(
            "broker {victim} neither answered nor closed the stale Produce within {DEADLINE:?} \
             of SIGCONT"
        ),
    };
    let status = tokio::task::block_in_place(|| {
        wait_until(
            &format!("the fenced broker {victim} exits"),
            DEADLINE,
            || cluster.broker(victim).try_exit_status(),
        )
    });
    eprintln!(
        "broker {victim} exited {:?} after SIGCONT: {status}",
        resumed_at.elapsed()
    );
    if let Some(offset) = stale_ack {
        panic!(
            "broker {victim}, resumed after the survivors took {topic}/0 over, acknowledged a \
             Produce at offset {offset}\n{}",
            cluster.broker(victim).log_tail()
        );
    }
    assert!(
        !status.success(),
        "a fenced broker exits with a failure status, got {status}"
    );
    // It withdrew its registration on the way out, so the survivors stop advertising it to
    // clients at their next listing rather than a lease later.
    assert!(
        !cluster
            .broker(victim)
            .log_lines_containing("withdrew this broker's registration")
            .is_empty(),
        "the fenced broker should withdraw its registration\n{}",
        cluster.broker(victim).log_tail()
    );
    tokio::task::block_in_place(|| {
        for &id in &survivors {
            wait_until(
                &format!("broker {id} no longer counts the exited broker {victim} live"),
                DEADLINE,
                || (!cluster.live_brokers_from(id).contains(&victim)).then_some(()),
            );
        }
    });

    let since = stream.progress();
    stream
        .wait_for_more_acks(&since, &all, 200, "the stream runs on after the takeover")
        .await;
    let sent = stream.finish().await;
    let survivors_bootstrap = cluster.bootstrap_of(&survivors);
    let log = read_whole_log(&survivors_bootstrap, topic, PARTITIONS).await;
    // check_log fails on the stale record too: it is not one of the stream's values.
    let summary = check_log(&sent, &log, false, seed);
    eprintln!("pause test: {summary}");
    for &partition in &orphaned {
        eprintln!(
            "partition {partition}: longest pause between acknowledgements around the SIGSTOP: {:?}",
            longest_ack_gap(&sent, partition, (paused_at, resumed_at))
        );
    }
    eprintln!(
        "brokers' acquisitions: {}",
        describe_millis(&reported_millis(&cluster, "acquired ", topic))
    );
    for line in cluster.ownership_log(topic) {
        eprintln!("  {line}");
    }
    for line in cluster.brokers[&victim].log_lines_containing("ERROR") {
        eprintln!("  broker {victim}: {}", short_log_line(&line));
    }
}

/// Three brokers started back to back (each as soon as the previous one listens) must all
/// stay members: none may judge another dead, seal its stream and so make it exit, when no
/// lease has lapsed.
///
/// Regression: a broker whose last membership listing predated a newcomer treated an ownership
/// record naming the newcomer as held by a dead owner (`is_live_incarnation` is false for a
/// broker not listed yet) and fenced it at once; the newcomer's next write failed and it exited
/// with status 1. Owners now have to stay absent for `dead_owner_grace` (two heartbeats).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_started_together_do_not_fence_one_another() {
    const LEASE: Duration = Duration::from_secs(3);
    let mut cluster = Cluster::start_unsettled(3, "3s", "500ms");
    let started = Instant::now();
    // Observe two lease periods: long enough for every broker to have claimed its share, and
    // for a wrongly fenced broker to have found out and exited.
    let observed_until = started + 2 * LEASE;
    tokio::task::block_in_place(|| {
        while Instant::now() < observed_until {
            for id in cluster.all_ids() {
                if let Some(status) = cluster.broker(id).try_exit_status() {
                    let seals: Vec<String> = cluster
                        .ownership_log("")
                        .into_iter()
                        .filter(|l| l.contains("sealing its stream") || l.contains("stream sealed"))
                        .collect();
                    panic!(
                        "broker {id} exited ({status}) {:?} after three brokers started together, \
                         although none stopped heartbeating; seals:\n{}",
                        started.elapsed(),
                        seals.join("\n")
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let sealed: Vec<String> = cluster
        .ownership_log("")
        .into_iter()
        .filter(|l| l.contains("sealing its stream"))
        .collect();
    assert!(
        sealed.is_empty(),
        "no broker may seal another's stream while all heartbeat:\n{}",
        sealed.join("\n")
    );
}

/// An idempotent producer (librdkafka's `enable.idempotence`, up to five requests in flight,
/// unlimited retries) streams while partitions move between brokers and while an owner is
/// SIGKILLed. Its retries after NOT_LEADER_OR_FOLLOWER, timeouts and the dead broker's
/// unacknowledged requests go to the new owner with the same producer id and sequence numbers,
/// so the new owner must know the producer state (from the manifest, plus the replayed tail)
/// to answer DUPLICATE_SEQUENCE for what was already written: afterwards every record is
/// stored exactly once, acknowledged in send order per partition, and none failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_producer_across_moves_and_a_failover_stores_every_record_once() {
    const PARTITIONS: i32 = 3;
    const MOVES: usize = 6;
    let seed = seed();
    eprintln!("idempotent cluster test seed: {seed} (replay with STRATA_TEST_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let topic = "cluster-idempotent";
    let (mut cluster, ids, bootstrap, _) =
        three_brokers_with_topic("3s", "500ms", topic, PARTITIONS).await;
    let idempotent = producer(
        &bootstrap,
        &[
            ("enable.idempotence", "true"),
            ("max.in.flight.requests.per.connection", "5"),
            ("retry.backoff.ms", "20"),
            ("retry.backoff.max.ms", "200"),
            ("linger.ms", "2"),
            ("message.timeout.ms", "60000"),
            ("request.timeout.ms", "5000"),
            ("socket.timeout.ms", "5000"),
        ],
    );
    let stream = ProducerStream::start(idempotent, topic, PARTITIONS);
    let all: Vec<i32> = (0..PARTITIONS).collect();
    stream
        .wait_for_more_acks(&stream.progress(), &all, 200, "the stream is running")
        .await;

    for round in 1..=MOVES {
        let partition = rng.random_range(0..PARTITIONS);
        // Other brokers learn of a move from their next read of the ownership records (1 s on
        // S3), so broker 1 may still be between the old owner and the new one: wait for it.
        let owner = tokio::task::block_in_place(|| {
            wait_until(
                &format!("broker 1 names an owner of {topic}/{partition}"),
                DEADLINE,
                || {
                    cluster
                        .metadata_from(1, Some(topic))
                        .leaders
                        .get(&partition)
                        .copied()
                },
            )
        });
        let others: Vec<i32> = ids.iter().copied().filter(|&id| id != owner).collect();
        let target = others[rng.random_range(0..others.len())];
        tokio::task::block_in_place(|| cluster.move_partition(topic, partition, target));
        let since = stream.progress();
        stream
            .wait_for_more_acks(
                &since,
                &[partition],
                20,
                &format!("move {round}: {topic}/{partition} takes writes on broker {target}"),
            )
            .await;
    }

    // The owner of partition 0 dies with requests in flight; the survivors take over.
    let owners = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(1, topic, PARTITIONS, &ids, "every partition has an owner")
    });
    let victim = owners[&0];
    let survivors: Vec<i32> = ids.iter().copied().filter(|&id| id != victim).collect();
    let before = stream.progress();
    cluster.broker(victim).kill9();
    eprintln!("SIGKILL broker {victim}, owner of {topic}/0");
    tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(
            survivors[0],
            topic,
            PARTITIONS,
            &survivors,
            "the survivors own every partition",
        )
    });
    stream
        .wait_for_more_acks(&before, &all, 100, "every partition takes writes again")
        .await;
    let sent = stream.finish().await;

    let log = read_whole_log(&cluster.bootstrap_of(&survivors), topic, PARTITIONS).await;
    let summary = check_log(&sent, &log, true, seed);
    eprintln!("idempotent cluster test: {summary} (seed {seed})");
    assert_eq!(summary.failed, 0, "no delivery may fail (seed {seed})");
    assert_eq!(
        summary.stored_twice, 0,
        "an idempotent producer's retries must never be stored twice (seed {seed})"
    );
    assert_eq!(
        summary.stored, summary.acknowledged,
        "exactly the acknowledged records are stored (seed {seed})"
    );
}

/// Creating a topic (or partitions) announces the change through storage, so brokers claim the
/// new partitions at their next move watch instead of their next full ownership round. Here a
/// full round comes only every five minutes, far beyond the producer's delivery timeout: the
/// records are acknowledged only if the announcement works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_topics_and_partitions_are_served_without_waiting_for_a_full_round() {
    let broker = StrataProcess::start_with(StrataOptions::default().with_args([
        "--cluster",
        "true",
        "--lease-period",
        "10m",
        "--ownership-interval",
        "5m",
    ]));
    let bootstrap = broker.bootstrap();
    let fast = producer(&bootstrap, &[("message.timeout.ms", "30000")]);
    let topic = "announced";
    create_topic(&bootstrap, topic, 2, &[]).await;
    let records: Vec<_> = strata_tests::records::varied_records(2)
        .into_iter()
        .enumerate()
        .map(|(p, r)| (Some(p as i32), r))
        .collect();
    let acked = strata_tests::clients::produce_all(&fast, topic, &records).await;
    assert_eq!(acked.len(), 2);

    // More partitions for the same topic are announced the same way.
    let admin = strata_tests::clients::admin(&bootstrap);
    let results = admin
        .create_partitions(
            &[rdkafka::admin::NewPartitions::new(topic, 3)],
            &rdkafka::admin::AdminOptions::new(),
        )
        .await
        .expect("CreatePartitions");
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let third: Vec<_> = strata_tests::records::varied_records(1)
        .into_iter()
        .map(|r| (Some(2), r))
        .collect();
    // A new client: the first one caches the old partition count for a while.
    tokio::task::block_in_place(|| {
        strata_tests::clients::wait_for_partitions(&bootstrap, topic, 3)
    });
    let fresh = producer(&bootstrap, &[("message.timeout.ms", "30000")]);
    let acked = strata_tests::clients::produce_all(&fresh, topic, &third).await;
    assert_eq!((acked[0].partition, acked[0].offset), (2, 0));
}

/// Issue 12, item 1: a topic that exists has leaders. Kafka assigns leaders while creating a
/// topic, and some clients (the `rskafka` crate) cache a leaderless Metadata answer and back
/// off for ever. Here new partitions are claimed at the owners' next move watch, slowed to 2 s:
/// a Metadata request sent the moment CreateTopics, CreatePartitions or an auto-creation
/// answers must already name a leader for every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_topics_have_leaders_as_soon_as_creation_answers() {
    let broker = StrataProcess::start_with(StrataOptions::default().with_args([
        "--cluster",
        "true",
        "--lease-period",
        "10m",
        "--ownership-interval",
        "5m",
        "--move-watch-interval",
        "2s",
    ]));
    let bootstrap = broker.bootstrap();
    let leaders = |topic: &str, auto_create: bool| -> Vec<(i16, i32)> {
        let mut connection = RawConnection::connect(broker.addr());
        let versions = connection.api_versions();
        let version = RawConnection::negotiate::<MetadataRequest>(&versions, 9);
        let mut wanted =
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default();
        wanted.name = Some(kafka_protocol::messages::TopicName(
            kafka_protocol::protocol::StrBytes::from_string(topic.to_string()),
        ));
        let request = MetadataRequest::default()
            .with_topics(Some(vec![wanted]))
            .with_allow_auto_topic_creation(auto_create);
        let response = connection.request(version, &request);
        let found = &response.topics[0];
        assert_eq!(found.error_code, 0, "{topic}: {found:?}");
        found
            .partitions
            .iter()
            .map(|p| (p.error_code, p.leader_id.0))
            .collect()
    };
    let all_led = |partitions: &[(i16, i32)], count: usize| {
        partitions.len() == count
            && partitions
                .iter()
                .all(|&(error, leader)| error == 0 && leader >= 0)
    };

    // Not the `create_topic` helper: it waits for leaders itself.
    let admin = strata_tests::clients::admin(&bootstrap);
    let options =
        rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let topic =
        rdkafka::admin::NewTopic::new("led-at-once", 6, rdkafka::admin::TopicReplication::Fixed(1));
    let results = admin
        .create_topics([&topic], &options)
        .await
        .expect("CreateTopics");
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let created = leaders("led-at-once", false);
    assert!(all_led(&created, 6), "after CreateTopics: {created:?}");

    let results = admin
        .create_partitions(
            &[rdkafka::admin::NewPartitions::new("led-at-once", 9)],
            &options,
        )
        .await
        .expect("CreatePartitions");
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let grown = leaders("led-at-once", false);
    assert!(all_led(&grown, 9), "after CreatePartitions: {grown:?}");

    // Auto-creation through Metadata answers with the leaders in that same response.
    let auto = leaders("auto-led-at-once", true);
    assert!(all_led(&auto, 1), "auto-created: {auto:?}");
}

/// The brokers one broker lists in Metadata: node id -> advertised port.
fn listed_brokers(addr: std::net::SocketAddr) -> BTreeMap<i32, u16> {
    let mut connection = RawConnection::connect(addr);
    let versions = connection.api_versions();
    let version = RawConnection::negotiate::<MetadataRequest>(&versions, 9);
    let response = connection.request(
        version,
        &MetadataRequest::default().with_topics(Some(vec![])),
    );
    response
        .brokers
        .iter()
        .map(|b| (b.node_id.0, u16::try_from(b.port).expect("a port fits u16")))
        .collect()
}

/// Brokers started back to back with no node id get distinct ids from the cluster (create-only
/// registration: 1001, 1002, 1003, above the range operators set by hand), and one restarted
/// after SIGKILL on the same machine comes back under its old id — at once, since its
/// predecessor's process is provably gone — instead of a fourth id beside a dead one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_without_node_ids_get_distinct_ids_and_keep_them_across_a_restart() {
    let storage = SharedStorage::new();
    eprintln!("cluster storage: {}", storage.url());
    let start = || {
        StrataProcess::start_with(
            StrataOptions::default()
                .with_storage_url(storage.url())
                // A lease far beyond the test: nothing here may wait one out.
                .with_args(["--cluster", "true", "--lease-period", "10m"]),
        )
    };
    let mut brokers: Vec<StrataProcess> = (0..3).map(|_| start()).collect();
    let by_port = tokio::task::block_in_place(|| {
        wait_until("every broker lists three brokers", DEADLINE, || {
            let views: Vec<BTreeMap<i32, u16>> =
                brokers.iter().map(|b| listed_brokers(b.addr())).collect();
            views
                .iter()
                .all(|v| v.len() == 3 && *v == views[0])
                .then(|| views[0].clone())
        })
    });
    let ids: BTreeSet<i32> = by_port.keys().copied().collect();
    assert_eq!(
        ids,
        BTreeSet::from([1001, 1002, 1003]),
        "allocated ids: {by_port:?}"
    );
    let id_of = |broker: &StrataProcess| {
        by_port
            .iter()
            .find(|(_, &port)| port == broker.addr().port())
            .map(|(&id, _)| id)
            .expect("every broker is listed under its own port")
    };
    let restarted_id = id_of(&brokers[1]);

    brokers[1].kill9();
    brokers[1].restart();
    let after = tokio::task::block_in_place(|| {
        wait_until("the restarted broker lists itself", DEADLINE, || {
            let view = listed_brokers(brokers[1].addr());
            view.values()
                .any(|&port| port == brokers[1].addr().port())
                .then_some(view)
        })
    });
    assert_eq!(
        after
            .iter()
            .find(|(_, &port)| port == brokers[1].addr().port())
            .map(|(&id, _)| id),
        Some(restarted_id),
        "the restarted broker should be back under its old id: {after:?}\n{}",
        brokers[1].log_tail()
    );
    assert!(
        after.keys().all(|id| ids.contains(id)),
        "no new id may appear: {after:?}"
    );
    assert!(
        !brokers[1]
            .log_lines_containing("process no longer runs on this machine")
            .is_empty(),
        "the restart should have proven its predecessor dead\n{}",
        brokers[1].log_tail()
    );
}

/// Sum of broker `id`'s `strata_storage_requests_by_area_total` samples of `area` and `op`
/// (any backend label), or None if it reports none.
fn requests_by_area(cluster: &mut Cluster, id: i32, area: &str, op: &str) -> Option<f64> {
    let text = cluster.metrics_text(id);
    let (area, op) = (format!("area=\"{area}\""), format!("op=\"{op}\""));
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("strata_storage_requests_by_area_total{"))
        .filter(|l| l.contains(&area) && l.contains(&op))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// Kafka-level metrics follow real traffic: requests per API with their latency histogram,
/// records and bytes in and bytes out per topic, and the open connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_topic_and_connection_metrics_follow_real_traffic() {
    let mut cluster = Cluster::start(1, "5s", "200ms");
    let bootstrap = cluster.bootstrap_of(&[1]);
    let topic = "metered";
    create_topic(&bootstrap, topic, 2, &[]).await;
    let producer = producer(&bootstrap, &[]);
    let count = 40;
    let futures: Vec<_> = (0..count)
        .map(|i| {
            let (key, value) = (format!("key-{i}"), format!("value-{i}"));
            producer
                .send_result(
                    FutureRecord::to(topic)
                        .partition(i % 2)
                        .key(&key)
                        .payload(&value),
                )
                .unwrap_or_else(|(e, _)| panic!("enqueue: {e}"))
        })
        .collect();
    for future in futures {
        future
            .await
            .expect("delivered")
            .unwrap_or_else(|(e, _)| panic!("produce failed: {e}"));
    }
    let got = consume_exactly(&bootstrap, topic, &[(0, 0), (1, 0)], count as usize).await;
    assert_eq!(got.len(), count as usize);
    // One request that fails, for its error code to be counted.
    let deleted = strata_tests::clients::admin(&bootstrap)
        .delete_topics(&["never-created"], &rdkafka::admin::AdminOptions::new())
        .await
        .expect("DeleteTopics answered");
    assert!(deleted[0].is_err(), "{deleted:?}");

    let text = cluster.metrics_text(1);
    let value = |series: &str| -> f64 {
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .trim()
            .parse()
            .expect("a number")
    };
    let topic_label = format!("{{topic=\"{topic}\"}}");
    assert_eq!(
        value(&format!("strata_topic_records_in_total{topic_label}")),
        f64::from(count),
        "every produced record counted once"
    );
    let bytes_in = value(&format!("strata_topic_bytes_in_total{topic_label}"));
    assert!(bytes_in > 0.0);
    // The consumer read every batch at least once (a batch can be sent again when a fetch
    // starts inside it).
    assert!(value(&format!("strata_topic_bytes_out_total{topic_label}")) >= bytes_in);
    let produces = value("strata_requests_total{api=\"Produce\"}");
    assert!(produces >= 1.0);
    assert_eq!(
        value("strata_request_seconds_count{api=\"Produce\"}"),
        produces
    );
    assert_eq!(
        value("strata_request_seconds_bucket{api=\"Produce\",le=\"+Inf\"}"),
        produces
    );
    assert!(value("strata_requests_total{api=\"Fetch\"}") >= 1.0);
    // Error codes by API: each produced partition's outcome was NONE, and nothing else was
    // answered to a Produce; the one failed delete is counted under its code.
    assert!(value("strata_request_errors_total{api=\"Produce\",error=\"NONE\"}") >= 2.0);
    assert!(
        !text.lines().any(
            |l| l.starts_with("strata_request_errors_total{api=\"Produce\"")
                && !l.contains("error=\"NONE\"")
        ),
        "{text}"
    );
    assert_eq!(
        value("strata_request_errors_total{api=\"DeleteTopics\",error=\"UNKNOWN_TOPIC_OR_PARTITION\"}"),
        1.0
    );
    assert!(value("strata_request_errors_total{api=\"Fetch\",error=\"NONE\"}") >= 2.0);
    // Read right after they were written, the records come from the tail cache.
    assert!(value("strata_log_reads_total{source=\"cache\"}") >= 1.0);
    assert!(value("strata_requests_total{api=\"Metadata\"}") >= 1.0);
    // The producer is still connected.
    assert!(value("strata_connections") >= 1.0);
    assert!(value("strata_connections_accepted_total") >= value("strata_connections"));
}

/// Lag per (topic, partition).
type LagSamples = BTreeMap<(String, i32), f64>;

/// Broker `id`'s `strata_group_lag` samples of `group`.
fn group_lag_samples(cluster: &mut Cluster, id: i32, group: &str) -> LagSamples {
    let text = cluster.metrics_text(id);
    let group_label = format!("group=\"{group}\"");
    let label = |line: &str, name: &str| -> Option<String> {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        Some(line[start..].split('"').next()?.to_string())
    };
    text.lines()
        .filter(|l| l.starts_with("strata_group_lag{") && l.contains(&group_label))
        .filter_map(|l| {
            let topic = label(l, "topic")?;
            let partition = label(l, "partition")?.parse().ok()?;
            let value = l.rsplit(' ').next()?.parse().ok()?;
            Some(((topic, partition), value))
        })
        .collect()
}

/// Consumer lag on `/metrics` is the log end minus the committed offset of every partition a
/// group committed for, reported once in the cluster (by the broker coordinating the group),
/// including partitions another broker owns, and it follows new records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_lag_metrics_match_committed_offsets_and_log_ends_across_brokers() {
    let mut cluster =
        Cluster::start_with_env(2, "5s", "200ms", &[("STRATA_GROUP_LAG_INTERVAL", "200ms")]);
    let bootstrap = cluster.bootstrap_of(&[1, 2]);
    let (topic, group) = ("lagging", "lag-metrics");
    create_topic(&bootstrap, topic, 4, &[]).await;
    let leaders = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(1, topic, 4, &[1, 2], "the topic's partitions have leaders")
    });
    let owners: BTreeSet<i32> = leaders.values().copied().collect();
    let producer = producer(&bootstrap, &[]);
    let send = |partition: i32, count: usize| {
        let futures: Vec<_> = (0..count)
            .map(|i| {
                let value = format!("value-{partition}-{i}");
                producer
                    .send_result(
                        FutureRecord::<(), _>::to(topic)
                            .partition(partition)
                            .payload(&value),
                    )
                    .unwrap_or_else(|(e, _)| panic!("enqueue: {e}"))
            })
            .collect();
        futures
    };
    // Partition p gets 10 * (p + 1) records; the group commits 5 on each.
    for partition in 0..4 {
        for future in send(partition, 10 * (partition as usize + 1)) {
            future
                .await
                .expect("delivered")
                .unwrap_or_else(|(e, _)| panic!("produce failed: {e}"));
        }
    }
    {
        let mut config = strata_tests::clients::base_config(&bootstrap);
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false");
        let consumer: rdkafka::consumer::BaseConsumer<strata_tests::clients::TestContext> = config
            .create_with_context(strata_tests::clients::TestContext)
            .unwrap();
        let mut offsets = rdkafka::TopicPartitionList::new();
        for partition in 0..4 {
            offsets
                .add_partition_offset(topic, partition, rdkafka::Offset::Offset(5))
                .unwrap();
        }
        tokio::task::block_in_place(|| {
            consumer.commit(&offsets, rdkafka::consumer::CommitMode::Sync)
        })
        .expect("commit");
    }
    let expected = |extra_on_3: f64| -> LagSamples {
        (0..4)
            .map(|p| {
                let lag = f64::from(10 * (p + 1) - 5) + if p == 3 { extra_on_3 } else { 0.0 };
                ((topic.to_string(), p), lag)
            })
            .collect()
    };
    let reported = |cluster: &mut Cluster| -> Vec<(i32, LagSamples)> {
        [1, 2]
            .into_iter()
            .map(|id| (id, group_lag_samples(cluster, id, group)))
            .filter(|(_, samples)| !samples.is_empty())
            .collect()
    };
    let want = expected(0.0);
    let seen = tokio::task::block_in_place(|| {
        wait_until("the group's lag on /metrics", DEADLINE, || {
            let seen = reported(&mut cluster);
            (seen.len() == 1 && seen[0].1 == want).then_some(seen)
        })
    });
    let coordinator = seen[0].0;
    let sum = cluster.metric(
        coordinator,
        &format!("strata_group_lag_sum{{group=\"{group}\"}}"),
    );
    assert_eq!(
        sum,
        want.values().sum::<f64>(),
        "the sum is the partitions' lag"
    );
    println!("group coordinated by broker {coordinator}; partition owners {owners:?}");

    // Partition 3 is owned by a broker other than the coordinator from here on, so its log end
    // is one the coordinator has to ask another broker for.
    let other = if coordinator == 1 { 2 } else { 1 };
    if leaders.get(&3) != Some(&other) {
        tokio::task::block_in_place(|| cluster.move_partition(topic, 3, other));
    }
    // Seven more records on partition 3: its lag follows, the others stay.
    for future in send(3, 7) {
        future
            .await
            .expect("delivered")
            .unwrap_or_else(|(e, _)| panic!("produce failed: {e}"));
    }
    let want = expected(7.0);
    // The coordinator is whichever broker reports the group. Right after start the cluster may
    // still hand group shards to the newer broker (one CI run saw the group's shard move to
    // partition 3's new owner in the middle of this test), so who reports is read again, and
    // partition 3 moved away from it if the two met. The lag must be right every time.
    let mut owner_of_3 = other;
    for _ in 0..3 {
        let reporter = tokio::task::block_in_place(|| {
            wait_until(
                "partition 3's lag grows by the new records",
                DEADLINE,
                || {
                    let seen = reported(&mut cluster);
                    (seen.len() == 1 && seen[0].1 == want).then_some(seen[0].0)
                },
            )
        });
        if reporter != owner_of_3 {
            println!("broker {reporter} reports the lag of partition 3, owned by {owner_of_3}");
            return;
        }
        owner_of_3 = if reporter == 1 { 2 } else { 1 };
        println!(
            "the group moved to broker {reporter}, partition 3's owner; moving it to {owner_of_3}"
        );
        tokio::task::block_in_place(|| cluster.move_partition(topic, 3, owner_of_3));
    }
    panic!("the group's coordinator kept landing on partition 3's owner");
}

/// Every metric family the broker exports is named in docs/METRICS.md, and every metric the
/// Grafana dashboard queries is one the broker exports: a metric added without documentation,
/// or renamed under the dashboard (which would show an empty panel, not an error), fails here.
#[test]
fn every_exported_metric_is_documented_and_the_dashboard_queries_only_real_ones() {
    let mut cluster = Cluster::start(1, "5s", "200ms");
    let text = cluster.metrics_text(1);
    let exported: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        exported.len() > 20,
        "too few families scraped to judge:\n{text}"
    );

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
    };
    let documented = read("docs/METRICS.md");
    let undocumented: Vec<&&str> = exported
        .iter()
        .filter(|name| {
            !documented.contains(&format!("`{name}`"))
                && !documented.contains(&format!("`{name}{{"))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/METRICS.md: {undocumented:?}"
    );

    let dashboard: serde_json::Value =
        serde_json::from_str(&read("docs/grafana/strata.json")).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    fn exprs<'a>(value: &'a serde_json::Value, into: &mut Vec<&'a str>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(expr)) = map.get("expr") {
                    into.push(expr);
                }
                map.values().for_each(|v| exprs(v, into));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, into)),
            _ => {}
        }
    }
    exprs(&dashboard, &mut queries);
    assert!(
        queries.len() > 20,
        "the dashboard has only {} queries",
        queries.len()
    );
    let mut unknown = BTreeSet::new();
    for query in &queries {
        for (start, _) in query.match_indices("strata_") {
            let name: String = query[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // Histograms and summaries are queried through their series suffixes.
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| exported.contains(base))
                .unwrap_or(&name);
            if !exported.contains(family) {
                unknown.insert(name.clone());
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics the broker does not export: {unknown:?}"
    );
}

/// The idle cost is visible per poller: an idle broker's heartbeats alone move the membership
/// series of `strata_storage_requests_by_area_total`, without any client traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_requests_are_reported_by_area_and_move_without_traffic() {
    let mut cluster = Cluster::start(1, "5s", "200ms");
    let first = wait_until(
        "broker 1 reports its membership heartbeats",
        DEADLINE,
        || requests_by_area(&mut cluster, 1, "membership", "put_update"),
    );
    wait_until(
        "the membership heartbeats counted by area move while idle",
        DEADLINE,
        || requests_by_area(&mut cluster, 1, "membership", "put_update").filter(|now| *now > first),
    );
    // The ownership round's listing of the cluster's objects is reported too.
    assert!(
        requests_by_area(&mut cluster, 1, "ownership", "list").is_some()
            || requests_by_area(&mut cluster, 1, "cluster", "list").is_some(),
        "no ownership listing reported"
    );
}
