//! The clients: idempotent acks=all producers writing values no one else writes, consumer-group
//! members that commit what they read, and an observer of the group's committed offsets. Every
//! operation and its outcome goes into the [`History`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use strata_tests::clients::{base_config, TestContext};

use crate::history::{Event, History};

/// Records a producer may have unacknowledged at once: bounds memory and the number of records
/// a fault leaves in doubt.
const PRODUCER_WINDOW: usize = 200;
/// How often a group member commits what it has read.
const COMMIT_EVERY: Duration = Duration::from_millis(300);
/// How often the group's committed offsets are fetched.
const OBSERVE_EVERY: Duration = Duration::from_millis(250);

pub const GROUP: &str = "harness-group";

/// Idempotent, acks=all. Requests time out after 5 s rather than librdkafka's 30-60 s: a frozen
/// broker keeps its connections open, and the producer would wait that long before trying the
/// partition's new owner.
fn producer_config(bootstrap: &str, name: &str) -> ClientConfig {
    let mut config = base_config(bootstrap);
    config
        .set("client.id", name)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("max.in.flight.requests.per.connection", "5")
        .set("retry.backoff.ms", "20")
        .set("retry.backoff.max.ms", "200")
        .set("linger.ms", "2")
        .set("message.timeout.ms", "60000")
        .set("request.timeout.ms", "5000")
        .set("socket.timeout.ms", "5000")
        // Epoch bumps, sequence errors and drains, kept for the anomaly report (few lines).
        .set("debug", "eos");
    config
}

pub struct Producers {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Producers {
    pub fn start(
        runtime: &tokio::runtime::Handle,
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        count: usize,
        rate: f64,
        history: &History,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..count)
            .map(|id| {
                runtime.spawn(produce(
                    id,
                    bootstrap.to_string(),
                    topic.to_string(),
                    partitions,
                    rate,
                    history.clone(),
                    Arc::clone(&stop),
                ))
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops sending and waits for every outstanding delivery report (message.timeout.ms bounds
    /// each one).
    pub async fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

type Delivery = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

async fn produce(
    id: usize,
    bootstrap: String,
    topic: String,
    partitions: i32,
    rate: f64,
    history: History,
    stop: Arc<AtomicBool>,
) {
    let started = Instant::now();
    let mut sequence: u64 = 0;
    let mut incarnation = 0;
    // A producer whose idempotence broke (fatal error) is replaced by a new one with a new
    // producer id, as an application would; the fatal error is in the history.
    while !stop.load(Ordering::SeqCst) {
        let name = format!("p{id}.{incarnation}");
        incarnation += 1;
        let producer: FutureProducer<TestContext> =
            match producer_config(&bootstrap, &name).create_with_context(TestContext) {
                Ok(producer) => producer,
                Err(error) => {
                    history.record(Event::ClientError {
                        who: name,
                        error: error.to_string(),
                    });
                    return;
                }
            };
        let mut in_flight: FuturesUnordered<Delivery> = FuturesUnordered::new();
        let mut fatal = None;
        while !stop.load(Ordering::SeqCst) && fatal.is_none() {
            let due = started + Duration::from_secs_f64(sequence as f64 / rate);
            if in_flight.len() < PRODUCER_WINDOW && Instant::now() >= due {
                let value = format!("{name}-{sequence}");
                let partition = i32::try_from(sequence % partitions as u64).unwrap_or(0);
                sequence += 1;
                history.record(Event::Send {
                    producer: name.clone(),
                    value: value.clone(),
                    partition,
                });
                let record = FutureRecord::<(), _>::to(&topic)
                    .partition(partition)
                    .payload(value.as_bytes());
                match producer.send_result(record) {
                    Ok(delivery) => {
                        let history = history.clone();
                        in_flight.push(Box::pin(async move {
                            let event = match delivery.await {
                                Ok(Ok(delivered)) => Event::Ack {
                                    value,
                                    partition: delivered.partition,
                                    offset: delivered.offset,
                                },
                                Ok(Err((error, _))) => Event::SendFailed {
                                    value,
                                    error: error.to_string(),
                                },
                                Err(_) => Event::SendFailed {
                                    value,
                                    error: "delivery future dropped".to_string(),
                                },
                            };
                            history.record(event);
                        }));
                    }
                    Err((error, _)) => history.record(Event::SendFailed {
                        value,
                        error: format!("enqueue: {error}"),
                    }),
                }
                continue;
            }
            let wake = if in_flight.len() < PRODUCER_WINDOW {
                due
            } else {
                Instant::now() + Duration::from_millis(50)
            };
            tokio::select! {
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            fatal = producer.client().fatal_error();
        }
        while in_flight.next().await.is_some() {}
        if let Some((code, reason)) = fatal {
            history.record(Event::ProducerFatal {
                producer: name,
                error: format!("{code:?}: {reason}"),
            });
        }
    }
}

/// A group member's view of its own assignment, shared with librdkafka's callbacks (which run
/// inside `poll` on the member's thread).
struct MemberContext {
    member: usize,
    session: Arc<AtomicU64>,
    /// Next offset to commit per partition, read since the last commit; cleared on every
    /// rebalance so a member never commits for a partition it may no longer own.
    positions: Arc<Mutex<HashMap<i32, i64>>>,
    history: History,
}

impl ClientContext for MemberContext {}

impl ConsumerContext for MemberContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let session = self.session.fetch_add(1, Ordering::SeqCst) + 1;
        if let Ok(mut positions) = self.positions.lock() {
            positions.clear();
        }
        let (kind, partitions) = match rebalance {
            Rebalance::Assign(list) => ("assign", partition_ids(list)),
            Rebalance::Revoke(list) => ("revoke", partition_ids(list)),
            Rebalance::Error(error) => ("error", {
                self.history.record(Event::ClientError {
                    who: format!("member {}", self.member),
                    error: format!("rebalance: {error}"),
                });
                Vec::new()
            }),
        };
        self.history.record(Event::Rebalance {
            member: self.member,
            session,
            kind: kind.to_string(),
            partitions,
        });
    }
}

fn partition_ids(list: &TopicPartitionList) -> Vec<i32> {
    list.elements().iter().map(|e| e.partition()).collect()
}

fn group_config(bootstrap: &str) -> ClientConfig {
    let mut config = base_config(bootstrap);
    config
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "100")
        .set("socket.timeout.ms", "10000");
    config
}

/// The consumer-group members and the committed-offset observer, each on its own thread.
pub struct Consumers {
    stop: Arc<AtomicBool>,
    kills: Arc<Vec<AtomicBool>>,
    members: Vec<JoinHandle<()>>,
    stop_observer: Arc<AtomicBool>,
    observer: JoinHandle<()>,
}

impl Consumers {
    pub fn start(bootstrap: &str, topic: &str, members: usize, history: &History) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let kills: Arc<Vec<AtomicBool>> =
            Arc::new((0..members).map(|_| AtomicBool::new(false)).collect());
        let mut threads = Vec::new();
        for member in 0..members {
            let (bootstrap, topic, history, stop, kills) = (
                bootstrap.to_string(),
                topic.to_string(),
                history.clone(),
                Arc::clone(&stop),
                Arc::clone(&kills),
            );
            threads.push(std::thread::spawn(move || {
                consume(member, &bootstrap, &topic, &history, &stop, &kills[member]);
            }));
        }
        let stop_observer = Arc::new(AtomicBool::new(false));
        let observer = {
            let (bootstrap, topic, history, stop) = (
                bootstrap.to_string(),
                topic.to_string(),
                history.clone(),
                Arc::clone(&stop_observer),
            );
            std::thread::spawn(move || observe_commits(&bootstrap, &topic, &history, &stop))
        };
        Self {
            stop,
            kills,
            members: threads,
            stop_observer,
            observer,
        }
    }

    pub fn killer(&self) -> MemberKiller {
        MemberKiller {
            kills: Arc::clone(&self.kills),
        }
    }

    /// Stops the members, then the observer, whose last look thus follows every commit.
    pub fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.members {
            let _ = thread.join();
        }
        self.stop_observer.store(true, Ordering::SeqCst);
        let _ = self.observer.join();
    }
}

/// Kills group members on the nemesis's behalf: the member's thread destroys its consumer
/// without leaving the group and starts a new one.
pub struct MemberKiller {
    kills: Arc<Vec<AtomicBool>>,
}

impl MemberKiller {
    /// Asks member `member` to die and waits until its thread has destroyed the consumer.
    pub fn kill(&self, member: usize) -> Result<String, String> {
        let flag = self
            .kills
            .get(member)
            .ok_or_else(|| format!("no member {member}"))?;
        let asked = Instant::now();
        flag.store(true, Ordering::SeqCst);
        // A member blocks at most a commit's socket timeout (10 s) before it looks at the flag.
        let deadline = asked + Duration::from_secs(30);
        while flag.load(Ordering::SeqCst) {
            if Instant::now() >= deadline {
                flag.store(false, Ordering::SeqCst);
                return Err(format!("member {member} did not notice the kill in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(format!(
            "destroyed without LeaveGroup after {} ms, replaced",
            asked.elapsed().as_millis()
        ))
    }
}

/// Destroys the consumer the way a crash would look to the group: no LeaveGroup, no final
/// commit. librdkafka's flag skips the consumer close; the Rust wrapper is leaked because its
/// `Drop` would close (and leave) again on a destroyed handle.
fn destroy_without_leaving(consumer: BaseConsumer<MemberContext>) {
    let handle = consumer.client().native_ptr();
    // SAFETY: the handle is live (the consumer is owned here) and is never used again: the
    // wrapper that owns it is forgotten right after, so nothing destroys or polls it twice.
    #[allow(
        unsafe_code,
        reason = "librdkafka's destroy-without-close has no safe wrapper"
    )]
    unsafe {
        rdkafka::bindings::rd_kafka_destroy_flags(
            handle,
            rdkafka::bindings::RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE,
        );
    }
    std::mem::forget(consumer);
}

fn consume(
    member: usize,
    bootstrap: &str,
    topic: &str,
    history: &History,
    stop: &AtomicBool,
    kill: &AtomicBool,
) {
    let session = Arc::new(AtomicU64::new(0));
    let mut incarnation = 0;
    while !stop.load(Ordering::SeqCst) {
        let Some(consumer) = member_incarnation(member, bootstrap, topic, history, &session) else {
            return;
        };
        incarnation += 1;
        let positions = consumer.context().positions.clone();
        poll_and_commit(
            member, &consumer, topic, history, stop, kill, &session, &positions,
        );
        if kill.load(Ordering::SeqCst) {
            history.record(Event::ClientError {
                who: format!("member {member}"),
                error: format!("killed by the nemesis (incarnation {})", incarnation - 1),
            });
            destroy_without_leaving(consumer);
            kill.store(false, Ordering::SeqCst);
        }
    }
}

fn member_incarnation(
    member: usize,
    bootstrap: &str,
    topic: &str,
    history: &History,
    session: &Arc<AtomicU64>,
) -> Option<BaseConsumer<MemberContext>> {
    let positions = Arc::new(Mutex::new(HashMap::new()));
    let context = MemberContext {
        member,
        session: Arc::clone(session),
        positions,
        history: history.clone(),
    };
    let consumer: BaseConsumer<MemberContext> =
        match group_config(bootstrap).create_with_context(context) {
            Ok(consumer) => consumer,
            Err(error) => {
                history.record(Event::ClientError {
                    who: format!("member {member}"),
                    error: error.to_string(),
                });
                return None;
            }
        };
    if let Err(error) = consumer.subscribe(&[topic]) {
        history.record(Event::ClientError {
            who: format!("member {member}"),
            error: format!("subscribe: {error}"),
        });
        return None;
    }
    Some(consumer)
}

#[allow(
    clippy::too_many_arguments,
    reason = "one member's whole state, passed once"
)]
fn poll_and_commit(
    member: usize,
    consumer: &BaseConsumer<MemberContext>,
    topic: &str,
    history: &History,
    stop: &AtomicBool,
    kill: &AtomicBool,
    session: &AtomicU64,
    positions: &Mutex<HashMap<i32, i64>>,
) {
    let mut last_commit = Instant::now();
    while !stop.load(Ordering::SeqCst) && !kill.load(Ordering::SeqCst) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let value = message
                    .payload()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                history.record(Event::Read {
                    member,
                    session: session.load(Ordering::SeqCst),
                    partition: message.partition(),
                    offset: message.offset(),
                    value,
                });
                if let Ok(mut positions) = positions.lock() {
                    positions.insert(message.partition(), message.offset() + 1);
                }
            }
            Some(Err(error)) => history.record(Event::ClientError {
                who: format!("member {member}"),
                error: error.to_string(),
            }),
            None => {}
        }
        if last_commit.elapsed() >= COMMIT_EVERY {
            last_commit = Instant::now();
            let pending: Vec<(i32, i64)> = positions
                .lock()
                .map(|mut p| p.drain().collect())
                .unwrap_or_default();
            if pending.is_empty() {
                continue;
            }
            let mut list = TopicPartitionList::new();
            for (partition, offset) in &pending {
                let _ = list.add_partition_offset(topic, *partition, Offset::Offset(*offset));
            }
            // Synchronous, so the coordinator's answer is known when it is recorded; the
            // socket timeout bounds how long a commit to a frozen coordinator blocks reading.
            let result = consumer.commit(&list, CommitMode::Sync);
            for (partition, offset) in pending {
                history.record(Event::Commit {
                    member,
                    partition,
                    offset,
                    ok: result.is_ok(),
                    error: result.as_ref().err().map(ToString::to_string),
                });
            }
        }
    }
}

/// Reads the group's committed offsets with OffsetFetch (no membership needed) over and over.
fn observe_commits(bootstrap: &str, topic: &str, history: &History, stop: &AtomicBool) {
    let mut config = base_config(bootstrap);
    config
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false");
    let observer: BaseConsumer<TestContext> = match config.create_with_context(TestContext) {
        Ok(observer) => observer,
        Err(error) => {
            history.record(Event::ClientError {
                who: OBSERVER.to_string(),
                error: error.to_string(),
            });
            return;
        }
    };
    let mut seen: HashMap<i32, i64> = HashMap::new();
    // A failing look is recorded (once per distinct error), so a stale view is visible in the
    // history rather than silently judged by "commit kept".
    let mut last_error = None;
    let mut failed = |error: String| {
        if last_error.as_ref() != Some(&error) {
            history.record(Event::ClientError {
                who: OBSERVER.to_string(),
                error: error.clone(),
            });
            last_error = Some(error);
        }
    };
    while !stop.load(Ordering::SeqCst) {
        match fetch_committed(&observer, topic) {
            Ok(committed) => {
                for (partition, offset) in committed {
                    if seen.insert(partition, offset) != Some(offset) {
                        history.record(Event::Committed { partition, offset });
                    }
                }
            }
            Err(error) => failed(error),
        }
        std::thread::sleep(OBSERVE_EVERY);
    }
    // One last look, after the members stopped committing: the cluster has healed, so it is
    // waited for (up to FINAL_LOOK) rather than taken from whatever the last poll saw.
    let until = Instant::now() + FINAL_LOOK;
    loop {
        match fetch_committed(&observer, topic) {
            Ok(committed) => {
                for (partition, offset) in committed {
                    history.record(Event::Committed { partition, offset });
                }
                return;
            }
            Err(error) if Instant::now() >= until => {
                failed(format!("{FINAL_LOOK_FAILED} for {FINAL_LOOK:?}: {error}"));
                return;
            }
            Err(error) => failed(error),
        }
        std::thread::sleep(OBSERVE_EVERY);
    }
}

/// Who the observer is in the history.
pub const OBSERVER: &str = "commit observer";
/// How a failed final look starts in the history (the checker looks for it).
pub const FINAL_LOOK_FAILED: &str = "final look failed";

/// How long the observer's last look at the committed offsets may take after the faults.
const FINAL_LOOK: Duration = Duration::from_secs(30);

fn fetch_committed(
    observer: &BaseConsumer<TestContext>,
    topic: &str,
) -> Result<Vec<(i32, i64)>, String> {
    let metadata = observer
        .fetch_metadata(Some(topic), Duration::from_secs(2))
        .map_err(|e| format!("metadata: {e}"))?;
    let partitions = metadata
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .ok_or("metadata lists no topic")?;
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        list.add_partition(topic, i32::try_from(partition).unwrap_or(i32::MAX));
    }
    let committed = observer
        .committed_offsets(list, Duration::from_secs(2))
        .map_err(|e| format!("OffsetFetch: {e}"))?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some((e.partition(), offset)),
            _ => None,
        })
        .collect())
}
