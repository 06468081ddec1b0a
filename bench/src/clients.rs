//! librdkafka clients configured for benchmarking, and the steps both benchmarks share:
//! creating the topic, sending one record, counting delivery reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use crate::cli::{Partitioning, TargetArgs, WorkloadArgs};
use crate::clock;
use crate::report::new_histogram;

/// How long to wait after a full producer queue before trying again. The queue holds 100,000
/// records by default, so 1 ms of waiting cannot starve the connection.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(1);
/// How long topic creation may take to show up in Metadata.
const TOPIC_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Client errors and warnings go to stderr as they happen: a benchmark whose client was
/// reconnecting the whole time should say so next to its numbers.
#[derive(Clone, Default)]
pub struct BenchContext;

impl ClientContext for BenchContext {
    /// Only warnings and worse arrive, unless -X debug=… lowered the clients' log level.
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        eprintln!("librdkafka {level:?} {facility}: {message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        eprintln!("librdkafka error: {error}: {reason}");
    }
}

impl ConsumerContext for BenchContext {}

/// Settings every client gets.
pub fn base_config(bootstrap: &str, target: &TargetArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "strata-bench");
    // Warnings and errors only, unless librdkafka debug contexts were asked for with -X debug=…
    let debugging = target.client_config.iter().any(|(key, _)| key == "debug");
    config.set_log_level(if debugging {
        RDKafkaLogLevel::Debug
    } else {
        RDKafkaLogLevel::Warning
    });
    apply_overrides(&mut config, target);
    config
}

fn apply_overrides(config: &mut ClientConfig, target: &TargetArgs) {
    for (key, value) in &target.client_config {
        config.set(key, value);
    }
}

/// A producer with the benchmark's settings; everything not named here (batch.size,
/// queue.buffering.max.*, max.in.flight) keeps librdkafka's default, which is what users get.
pub fn producer(
    bootstrap: &str,
    target: &TargetArgs,
    workload: &WorkloadArgs,
    linger_ms: u32,
    stats: ProduceStats,
) -> Result<ThreadedProducer<ProduceStats>> {
    let mut config = base_config(bootstrap, target);
    config
        .set("acks", &workload.acks)
        .set("linger.ms", linger_ms.to_string())
        .set("compression.type", "none")
        .set(
            "message.timeout.ms",
            (workload.timeout_secs * 1000).to_string(),
        );
    // -X settings win over the benchmark's own.
    apply_overrides(&mut config, target);
    // A threaded producer serves delivery reports on its own thread as soon as they arrive, so
    // the measured latency does not include time spent waiting for the sending loop to poll.
    config
        .create_with_context(stats)
        .context("create the producer")
}

/// A consumer for `assign` only: no group membership, no commits.
pub fn consumer(bootstrap: &str, target: &TargetArgs) -> Result<BaseConsumer<BenchContext>> {
    // librdkafka wants a group.id for a consumer handle even when only assign() is used;
    // nothing joins or commits to it.
    consumer_config(bootstrap, target, "strata-bench-assign-only")
        .create_with_context(BenchContext)
        .context("create the consumer")
}

/// A consumer for `assign` only that reports reaching each partition's end (a replay of old
/// data stops there).
pub fn replay_consumer(bootstrap: &str, target: &TargetArgs) -> Result<BaseConsumer<BenchContext>> {
    let mut config = consumer_config(bootstrap, target, "strata-bench-assign-only");
    config.set("enable.partition.eof", "true");
    config
        .create_with_context(BenchContext)
        .context("create the catch-up consumer")
}

/// A consumer that joins consumer group `group` (subscribe), with the same settings and no
/// commits (nothing here restarts from them).
pub fn group_consumer(
    bootstrap: &str,
    target: &TargetArgs,
    group: &str,
) -> Result<BaseConsumer<BenchContext>> {
    consumer_config(bootstrap, target, group)
        .create_with_context(BenchContext)
        .context("create the group consumer")
}

fn consumer_config(bootstrap: &str, target: &TargetArgs, group: &str) -> ClientConfig {
    let mut config = base_config(bootstrap, target);
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // When the application falls behind the fetcher (its local queue passes
        // queued.min.messages), librdkafka pauses that partition's fetching for this long; the
        // default of 1000 ms turns a consumer that polls 2 M records/s into one that averages
        // under 0.5 M/s, whatever the broker. 10 ms keeps the pause from dominating.
        .set("fetch.queue.backoff.ms", "10");
    apply_overrides(&mut config, target);
    config
}

/// Learns the leaders of `topic`'s partitions, so that a following [`assign_all`] starts
/// fetching at once: librdkafka parks a partition assigned before its leader is known and
/// retries the offset lookup only after 500 ms, which would be charged to the broker.
pub fn learn_leaders(consumer: &BaseConsumer<BenchContext>, topic: &str) -> Result<()> {
    consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map(drop)
        .with_context(|| format!("consumer metadata for {topic}"))
}

/// How many partitions `topic` has, from the broker's metadata.
pub fn partition_count(consumer: &BaseConsumer<BenchContext>, topic: &str) -> Result<i32> {
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .with_context(|| format!("metadata for {topic}"))?;
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len());
    if partitions == 0 {
        anyhow::bail!("topic {topic} does not exist or has no partitions");
    }
    Ok(partitions as i32)
}

/// Assigns every partition of `topic` from its first offset.
pub fn assign_all(
    consumer: &BaseConsumer<BenchContext>,
    topic: &str,
    partitions: i32,
) -> Result<()> {
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .context("build the assignment")?;
    }
    consumer.assign(&assignment).context("assign partitions")
}

/// A fresh topic name, so runs against a long-lived broker never read each other's records.
pub fn default_topic_name() -> String {
    let millis = (clock::unix_seconds() * 1000.0) as u64;
    format!("strata-bench-{}-{millis}", std::process::id())
}

/// Creates `topic` with CreateTopics and waits until Metadata lists all its partitions with
/// leaders, so the first produce does not pay for metadata retries.
pub fn create_topic(
    bootstrap: &str,
    target: &TargetArgs,
    topic: &str,
    partitions: i32,
    configs: &[(String, String)],
) -> Result<()> {
    let admin: AdminClient<BenchContext> = base_config(bootstrap, target)
        .create_with_context(BenchContext)
        .context("create the admin client")?;
    let new_topic = configs.iter().fold(
        NewTopic::new(topic, partitions, TopicReplication::Fixed(1)),
        |t, (name, value)| t.set(name, value),
    );
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    // The admin client has its own polling thread, so a plain executor can wait on its future.
    let results = futures::executor::block_on(admin.create_topics([&new_topic], &options))
        .with_context(|| format!("CreateTopics {topic}"))?;
    for result in results {
        if let Err((name, code)) = result {
            bail!("CreateTopics {name} answered {code:?} (a --topic must not exist yet)");
        }
    }

    let consumer = consumer(bootstrap, target)?;
    let deadline = clock::now() + TOPIC_READY_TIMEOUT;
    loop {
        let ready = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()
            .and_then(|metadata| {
                let described = metadata.topics().iter().find(|t| t.name() == topic)?;
                Some(
                    described.error().is_none()
                        && described.partitions().len() == usize::try_from(partitions).ok()?
                        && described.partitions().iter().all(|p| p.leader() >= 0),
                )
            })
            .unwrap_or(false);
        if ready {
            return Ok(());
        }
        if clock::remaining(deadline).is_zero() {
            bail!("Metadata did not list {topic} with {partitions} led partitions within {TOPIC_READY_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Delivery-report bookkeeping, kept in the producer's context because that is where librdkafka
/// calls back with each record's outcome.
pub struct ProduceStats {
    /// Time zero: send times travel as nanoseconds since this instant.
    origin: Instant,
    /// Records sent before this (nanoseconds since `origin`) are counted but not timed (warm-up).
    /// Atomic because it is set after the producer (and so this context) exists.
    timed_from_ns: AtomicU64,
    /// Send-to-delivery-report latency in microseconds.
    latency_us: Mutex<Histogram<u64>>,
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ProduceStats {
    /// Stats that time every record; see [`ProduceStats::time_from`].
    pub fn new(origin: Instant) -> Result<Self> {
        Ok(Self {
            origin,
            timed_from_ns: AtomicU64::new(0),
            latency_us: Mutex::new(new_histogram()?),
            delivered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            first_error: Mutex::new(None),
        })
    }

    /// Leave records sent before `sent_ns` (nanoseconds since origin) out of the latencies.
    pub fn time_from(&self, sent_ns: u64) {
        self.timed_from_ns.store(sent_ns, Ordering::Release);
    }

    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Acquire)
    }

    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Acquire)
    }

    pub fn first_error(&self) -> Option<String> {
        self.first_error.lock().ok().and_then(|e| e.clone())
    }

    pub fn latency(&self) -> Result<Histogram<u64>> {
        self.latency_us
            .lock()
            .map(|h| h.clone())
            .map_err(|_| anyhow!("latency histogram lock poisoned"))
    }
}

impl ClientContext for ProduceStats {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        BenchContext.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        BenchContext.error(error, reason);
    }
}

impl ProducerContext for ProduceStats {
    /// The record's send time in nanoseconds since `origin`: a number travels through
    /// librdkafka's opaque pointer without an allocation per record.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let now_ns = clock::nanos_since(self.origin);
        let sent_ns = u64::try_from(sent_ns).unwrap_or(u64::MAX);
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::AcqRel);
                if sent_ns >= self.timed_from_ns.load(Ordering::Acquire) {
                    let micros = now_ns.saturating_sub(sent_ns) / 1000;
                    if let Ok(mut histogram) = self.latency_us.lock() {
                        histogram.saturating_record(micros);
                    }
                }
            }
            Err((error, _)) => {
                self.failed.fetch_add(1, Ordering::AcqRel);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| error.to_string());
                }
            }
        }
    }
}

/// The partition for record `index`, or `None` to let librdkafka's partitioner choose.
pub fn partition_for(partitioning: Partitioning, index: u64, partitions: i32) -> Option<i32> {
    match partitioning {
        Partitioning::Sticky => None,
        Partitioning::RoundRobin => {
            let partitions = u64::try_from(partitions).unwrap_or(1).max(1);
            i32::try_from(index % partitions).ok()
        }
    }
}

/// Send times for records, in nanoseconds since `origin`.
///
/// On this VM reading the clock showed up as ~15% of the sending thread's profile at 1 M
/// records/s, on a client that is already the bottleneck. So a clock may be read once per
/// `every` records and that reading reused: a record's latency is then overstated by at most the
/// time to hand `every - 1` records to librdkafka (about a microsecond each), never understated.
pub struct SendClock {
    origin: Instant,
    every: u32,
    left: u32,
    cached_ns: u64,
}

impl SendClock {
    pub fn new(origin: Instant, every: u32) -> Self {
        Self {
            origin,
            every: every.max(1),
            left: 0,
            cached_ns: 0,
        }
    }

    fn next(&mut self) -> u64 {
        if self.left == 0 {
            self.cached_ns = clock::nanos_since(self.origin);
            self.left = self.every;
        }
        self.left -= 1;
        self.cached_ns
    }

    /// The next record reads the clock afresh (after a wait).
    fn refresh(&mut self) {
        self.left = 0;
    }
}

/// Sends one record, waiting while the producer's queue is full. When the payload has room, its
/// first 8 bytes are the send time (little-endian, from `send_clock`) for a consumer in this
/// process to compute end-to-end latency; the same time goes with the delivery report.
/// Returns the send time.
pub fn send(
    producer: &ThreadedProducer<ProduceStats>,
    topic: &str,
    partition: Option<i32>,
    payload: &mut [u8],
    send_clock: &mut SendClock,
    deadline: Instant,
) -> Result<u64> {
    loop {
        let sent_ns = send_clock.next();
        if let Some(stamp) = payload.get_mut(..8) {
            stamp.copy_from_slice(&sent_ns.to_le_bytes());
        }
        let opaque = usize::try_from(sent_ns).unwrap_or(usize::MAX);
        let mut record =
            BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, opaque).payload(&payload[..]);
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        match producer.send(record) {
            Ok(()) => return Ok(sent_ns),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                if clock::remaining(deadline).is_zero() {
                    bail!("the producer queue stayed full until the phase timeout");
                }
                std::thread::sleep(QUEUE_FULL_BACKOFF);
                send_clock.refresh();
            }
            Err((error, _)) => bail!("send to {topic}: {error}"),
        }
    }
}

/// The send time stamped into a payload by [`send`], if the payload carries one.
pub fn stamped_send_ns(payload: &[u8]) -> Option<u64> {
    let stamp: [u8; 8] = payload.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(stamp))
}
