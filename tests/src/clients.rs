//! librdkafka clients (through `rdkafka`) set up the way the tests need them, and the produce /
//! consume / admin steps the tests share.
//!
//! Consumers use `assign` with explicit offsets and never commit: they test Produce, Fetch,
//! ListOffsets and Metadata without depending on consumer groups.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::records::{ReceivedRecord, TestRecord};
use crate::wait::{remaining, wait_until, DEADLINE};

/// How many librdkafka log lines are kept, across all clients of the test process.
const CLIENT_LOG_LINES_KEPT: usize = 2000;

static CLIENT_LOG: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());

fn record_client_log(line: String) {
    if let Ok(mut log) = CLIENT_LOG.lock() {
        if log.len() == CLIENT_LOG_LINES_KEPT {
            log.pop_front();
        }
        log.push_back(line);
    }
}

/// The last `count` lines librdkafka logged in this test process (all tests running in it).
pub fn client_log_tail(count: usize) -> String {
    let Ok(log) = CLIENT_LOG.lock() else {
        return String::new();
    };
    let skip = log.len().saturating_sub(count);
    log.iter().skip(skip).map(|l| format!("{l}\n")).collect()
}

/// Keeps librdkafka's log lines and errors for failure reports instead of dropping them (no
/// `log` subscriber is installed in tests) or printing them from librdkafka's threads, where
/// the test harness cannot capture them.
#[derive(Clone, Default)]
pub struct TestContext;

impl ClientContext for TestContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        record_client_log(format!("librdkafka {level:?} {facility}: {message}"));
    }

    fn error(&self, error: KafkaError, reason: &str) {
        record_client_log(format!("librdkafka error: {error}: {reason}"));
    }
}

impl ConsumerContext for TestContext {}

pub type TestProducer = FutureProducer<TestContext>;
pub type TestConsumer = StreamConsumer<TestContext>;
pub type TestBaseConsumer = BaseConsumer<TestContext>;

/// Settings every client gets: where the broker is, and reconnecting quickly after a restart.
pub fn base_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "strata-tests")
        .set("reconnect.backoff.ms", "10")
        .set("reconnect.backoff.max.ms", "200")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .set_log_level(RDKafkaLogLevel::Info);
    config
}

/// A producer with acks=all and the given extra settings (which override the defaults).
pub fn producer(bootstrap: &str, settings: &[(&str, &str)]) -> TestProducer {
    let mut config = base_config(bootstrap);
    config
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .set("linger.ms", "5");
    for (key, value) in settings {
        config.set(*key, *value);
    }
    config
        .create_with_context(TestContext)
        .expect("create an rdkafka producer")
}

/// Consumer settings: no group membership and no commits; an out-of-range offset is an error
/// the test sees, not something silently "reset" away.
fn consumer_config(bootstrap: &str) -> ClientConfig {
    let mut config = base_config(bootstrap);
    config
        // librdkafka wants a group.id for a consumer handle even when only assign() is used;
        // nothing joins or commits to it.
        .set("group.id", "strata-tests-assign-only")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set("fetch.wait.max.ms", "100");
    config
}

pub fn stream_consumer(bootstrap: &str) -> TestConsumer {
    consumer_config(bootstrap)
        .create_with_context(TestContext)
        .expect("create an rdkafka stream consumer")
}

pub fn base_consumer(bootstrap: &str) -> TestBaseConsumer {
    consumer_config(bootstrap)
        .create_with_context(TestContext)
        .expect("create an rdkafka base consumer")
}

pub fn admin(bootstrap: &str) -> AdminClient<TestContext> {
    base_config(bootstrap)
        .create_with_context(TestContext)
        .expect("create an rdkafka admin client")
}

/// Creates a topic with CreateTopics and waits until Metadata shows all its partitions.
pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin = admin(bootstrap);
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (key, value) in configs {
        topic = topic.set(key, value);
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics([&topic], &options)
        .await
        .unwrap_or_else(|e| panic!("CreateTopics {name} failed: {e}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("CreateTopics {topic} answered {code:?}");
        }
    }
    let bootstrap = bootstrap.to_string();
    let name = name.to_string();
    tokio::task::spawn_blocking(move || wait_for_partitions(&bootstrap, &name, partitions))
        .await
        .expect("metadata wait task");
}

/// Replaces `name`'s config overrides with `configs` (AlterConfigs: overrides not listed go
/// back to their defaults), panicking on any error.
pub async fn set_topic_configs(bootstrap: &str, name: &str, configs: &[(&str, &str)]) {
    let admin = admin(bootstrap);
    let change = configs.iter().fold(
        AlterConfig::new(ResourceSpecifier::Topic(name)),
        |c, (k, v)| c.set(k, v),
    );
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .alter_configs([&change], &options)
        .await
        .unwrap_or_else(|e| panic!("AlterConfigs {name} failed: {e}"));
    for result in results {
        if let Err((resource, code)) = result {
            panic!("AlterConfigs {resource:?} answered {code:?}");
        }
    }
}

/// Waits until Metadata lists `topic` with `partitions` partitions, each with a leader.
pub fn wait_for_partitions(bootstrap: &str, topic: &str, partitions: i32) {
    let consumer = base_consumer(bootstrap);
    wait_until(
        &format!("Metadata lists {topic} with {partitions} partitions that have leaders"),
        DEADLINE,
        || {
            let metadata = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()?;
            let described = metadata.topics().iter().find(|t| t.name() == topic)?;
            let ready = described.error().is_none()
                && described.partitions().len() == partitions as usize
                && described.partitions().iter().all(|p| p.leader() >= 0);
            ready.then_some(())
        },
    );
}

/// A FutureRecord for `record`, leaving absent parts absent (null key, null value).
pub fn future_record<'a>(
    topic: &'a str,
    partition: Option<i32>,
    record: &'a TestRecord,
) -> FutureRecord<'a, [u8], [u8]> {
    let mut future = FutureRecord::to(topic);
    if let Some(partition) = partition {
        future = future.partition(partition);
    }
    if let Some(key) = &record.key {
        future = future.key(key.as_slice());
    }
    if let Some(value) = &record.value {
        future = future.payload(value.as_slice());
    }
    if !record.headers.is_empty() {
        future = future.headers(owned_headers(&record.headers));
    }
    if let Some(timestamp) = record.timestamp {
        future = future.timestamp(timestamp);
    }
    future
}

fn owned_headers(headers: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |all, (key, value)| {
            all.insert(Header {
                key,
                value: value.as_deref(),
            })
        },
    )
}

/// Where a produced record was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    pub partition: i32,
    pub offset: i64,
}

/// Enqueues every record in order, then waits for all delivery reports. Panics on the first
/// failed delivery, naming the record and librdkafka's error.
pub async fn produce_all(
    producer: &TestProducer,
    topic: &str,
    records: &[(Option<i32>, TestRecord)],
) -> Vec<Acked> {
    let futures: Vec<DeliveryFuture> = records
        .iter()
        .map(|(partition, record)| {
            producer
                .send_result(future_record(topic, *partition, record))
                .unwrap_or_else(|(e, _)| panic!("enqueue to {topic} failed: {e}"))
        })
        .collect();
    let mut acked = Vec::with_capacity(futures.len());
    for (index, future) in futures.into_iter().enumerate() {
        match future.await {
            Ok(Ok(delivery)) => acked.push(Acked {
                partition: delivery.partition,
                offset: delivery.offset,
            }),
            Ok(Err((error, _))) => panic!(
                "delivery of record #{index} to {topic} failed: {error}\nclient log:\n{}",
                client_log_tail(30)
            ),
            Err(_) => panic!("delivery future of record #{index} was dropped by the producer"),
        }
    }
    acked
}

/// Converts a consumed message to a [`ReceivedRecord`].
pub fn received(message: &BorrowedMessage<'_>) -> ReceivedRecord {
    let headers = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    ReceivedRecord {
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        record: TestRecord {
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: message.timestamp().to_millis(),
        },
    }
}

/// Assigns `topic`'s partitions at the given start offsets and reads until `count` records
/// arrived or the deadline passed. Any consumer error about the data fails the test: with no
/// group and `auto.offset.reset=error`, none is expected. Transport errors are librdkafka's
/// informational reports about a connection (it reconnects and rediscovers on its own); tests
/// that kill a broker see them while the dead broker still leads something, such as the
/// coordinator shard librdkafka looks up for the handle's group id, until its lease runs out.
/// They are logged, not fatal, and the deadline still bounds the read.
pub async fn consume_exactly(
    bootstrap: &str,
    topic: &str,
    starts: &[(i32, i64)],
    count: usize,
) -> Vec<ReceivedRecord> {
    let consumer = stream_consumer(bootstrap);
    let mut assignment = TopicPartitionList::new();
    for (partition, offset) in starts {
        assignment
            .add_partition_offset(topic, *partition, Offset::Offset(*offset))
            .expect("build the assignment");
    }
    consumer.assign(&assignment).expect("assign partitions");
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        let wait = remaining(
            &format!("consuming {topic}: got {} of {count} records", got.len()),
            deadline,
        );
        match tokio::time::timeout(wait, consumer.recv()).await {
            Ok(Ok(message)) => got.push(received(&message)),
            Ok(Err(error)) if is_transport_report(&error) => {
                eprintln!("consumer on {topic}: {error} (librdkafka reconnects)");
            }
            Ok(Err(error)) => panic!(
                "consumer error on {topic} after {} of {count} records: {error}\nclient log:\n{}",
                got.len(),
                client_log_tail(30)
            ),
            Err(_) => panic!(
                "consumed only {} of {count} records from {topic} within {DEADLINE:?}; got {}\nclient log:\n{}",
                got.len(),
                describe_progress(&got),
                client_log_tail(30)
            ),
        }
    }
    got
}

/// Whether a consumer error only reports a lost or refused connection, which librdkafka
/// recovers from by itself.
fn is_transport_report(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown
        )
    )
}

/// Per partition, how many records were consumed and the offsets of the first and last.
fn describe_progress(got: &[ReceivedRecord]) -> String {
    let mut spans: BTreeMap<i32, (usize, i64, i64)> = BTreeMap::new();
    for record in got {
        let span = spans
            .entry(record.partition)
            .or_insert((0, record.offset, record.offset));
        span.0 += 1;
        span.2 = record.offset;
    }
    let parts: Vec<String> = spans
        .iter()
        .map(|(p, (n, first, last))| {
            format!("partition {p}: {n} records, offsets {first}..={last}")
        })
        .collect();
    if parts.is_empty() {
        "nothing".to_string()
    } else {
        parts.join("; ")
    }
}

/// (low, high) watermarks of one partition, from ListOffsets.
pub async fn watermarks(bootstrap: &str, topic: &str, partition: i32) -> (i64, i64) {
    let bootstrap = bootstrap.to_string();
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        base_consumer(&bootstrap)
            .fetch_watermarks(&topic, partition, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("ListOffsets (watermarks) of {topic}/{partition}: {e}"))
    })
    .await
    .expect("watermarks task")
}

/// The earliest offset whose timestamp is at or after each given timestamp, per partition,
/// from ListOffsets by timestamp. `None` when no such record exists (librdkafka's `End`).
pub async fn offsets_for_times(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    timestamps: &[i64],
) -> Vec<Option<i64>> {
    let bootstrap = bootstrap.to_string();
    let topic = topic.to_string();
    let timestamps = timestamps.to_vec();
    tokio::task::spawn_blocking(move || {
        let consumer = base_consumer(&bootstrap);
        timestamps
            .iter()
            .map(|&timestamp| {
                let mut query = TopicPartitionList::new();
                query
                    .add_partition_offset(&topic, partition, Offset::Offset(timestamp))
                    .expect("build the query");
                let answer = consumer
                    .offsets_for_times(query, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("ListOffsets by timestamp {timestamp}: {e}"));
                let element = answer
                    .find_partition(&topic, partition)
                    .expect("answer has the partition");
                if let Err(e) = element.error() {
                    panic!("ListOffsets by timestamp {timestamp}: partition error {e}");
                }
                match element.offset() {
                    Offset::Offset(offset) => Some(offset),
                    Offset::End => None,
                    other => panic!("ListOffsets by timestamp {timestamp} answered {other:?}"),
                }
            })
            .collect()
    })
    .await
    .expect("offsets_for_times task")
}

/// Produces one record to a fresh topic and reads it back: the broker still serves a
/// well-behaved client (used after feeding it bad input on another connection).
pub async fn assert_broker_serves_clients(bootstrap: &str, topic: &str) {
    let record = TestRecord {
        key: Some(b"still-alive".to_vec()),
        value: Some(format!("probe for {topic}").into_bytes()),
        headers: vec![("probe".to_string(), Some(b"1".to_vec()))],
        timestamp: None,
    };
    let producer = producer(bootstrap, &[]);
    let acked = produce_all(&producer, topic, &[(Some(0), record.clone())]).await;
    let consumed = consume_exactly(bootstrap, topic, &[(0, acked[0].offset)], 1).await;
    assert_eq!(consumed[0].offset, acked[0].offset);
    assert_eq!(consumed[0].record.value, record.value);
    assert_eq!(consumed[0].record.key, record.key);
}

/// Groups `(partition, record)` pairs by partition, keeping send order.
pub fn by_partition(
    sent: &[(Option<i32>, TestRecord)],
    acked: &[Acked],
) -> BTreeMap<i32, Vec<TestRecord>> {
    let mut grouped: BTreeMap<i32, Vec<TestRecord>> = BTreeMap::new();
    for ((_, record), ack) in sent.iter().zip(acked) {
        grouped
            .entry(ack.partition)
            .or_default()
            .push(record.clone());
    }
    grouped
}
