//! Consumer groups (Kafka's classic protocol) end to end: real librdkafka consumers (through
//! `rdkafka`) and Python's confluent-kafka, subscribed to topics on the real `strata` binary.
//!
//! What is proved here: members of one group share a topic's partitions (each record to
//! exactly one member, disjoint assignments), separate groups each see every record, per-key
//! order holds, a killed member's partitions move to the others after the session timeout and
//! resume from the committed offsets, cooperative-sticky rebalances revoke only what moves,
//! a static member that restarts within its session timeout keeps its partitions without a
//! rebalance, committed offsets survive a SIGKILL of the broker, and ListGroups /
//! DescribeGroups / DeleteGroups treat empty and live groups as Kafka does.
//!
//! How the group members work (see [`Member`]): each rdkafka `BaseConsumer` runs on its own
//! thread with `enable.auto.commit=false` and commits explicitly and synchronously — every
//! `commit_every` records, whenever a poll finds nothing new, on the revocation of a partition
//! (in the rebalance callback, before the partition can move) and when it stops. So a
//! partition handed over in a clean rebalance continues exactly where its previous owner
//! stopped, and "each record exactly once per group" is a property the tests can demand. Every
//! record received, every rebalance callback (with the generation librdkafka holds) and every
//! commit the broker acknowledged is recorded for the checks.
//!
//! Every broker here runs with `--group-initial-rebalance-delay 0s` (the first rebalance of an
//! empty group does not wait for more members; no test depends on that delay). The harness
//! already passes extra broker flags (`StrataOptions::with_args`), so nothing was added to it.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Deadlines and observation windows against real processes need the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::{DescribeGroupsRequest, GroupId};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::AdminOptions;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use strata_tests::binary::strata_binary;
use strata_tests::clients::{
    admin, base_config, client_log_tail, create_topic, produce_all, producer, Acked, TestContext,
};
use strata_tests::cluster::{Cluster, GROUP_SHARDS};
use strata_tests::command::run_with_deadline;
use strata_tests::raw::RawConnection;
use strata_tests::records::TestRecord;
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

/// How often members heartbeat: short, so that they learn of a rebalance quickly.
const HEARTBEAT_MS: u64 = 300;
/// The session timeout most members use: the broker's default minimum.
const DEFAULT_SESSION_MS: u64 = 6000;

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// A broker for group tests: directory storage, no initial rebalance delay, plus `extra` flags.
fn start_broker(extra: &[&str]) -> StrataProcess {
    StrataProcess::start_with(
        StrataOptions::default()
            .with_args(["--group-initial-rebalance-delay", "0s"])
            .with_args(extra.iter().copied()),
    )
}

/// Runs an async harness helper (CreateTopics, produce) from these synchronous tests.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime")
        .block_on(future)
}

/// `seq=<n>` values identify a record; the key is `k<n mod keys>`.
fn keyed_record(seq: usize, keys: usize) -> TestRecord {
    TestRecord {
        key: Some(format!("k{}", seq % keys).into_bytes()),
        value: Some(format!("seq={seq}").into_bytes()),
        headers: Vec::new(),
        timestamp: None,
    }
}

fn parse_seq(value: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(value?)
        .ok()?
        .strip_prefix("seq=")?
        .parse()
        .ok()
}

/// Produces `count` keyed records (default partitioner) with an idempotent acks=all producer
/// and returns where each landed, in sequence order.
fn produce_keyed(bootstrap: &str, topic: &str, first_seq: usize, count: usize) -> Vec<Acked> {
    let records: Vec<(Option<i32>, TestRecord)> = (first_seq..first_seq + count)
        .map(|seq| (None, keyed_record(seq, 1000)))
        .collect();
    let producer = producer(bootstrap, &[("enable.idempotence", "true")]);
    block_on(produce_all(&producer, topic, &records))
}

/// Produces `per_partition` records to each of `partitions` partitions (explicit partition),
/// which hold `base` records each before.
fn produce_per_partition(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    base: i64,
    per_partition: usize,
) {
    let mut records = Vec::new();
    for i in 0..per_partition {
        for p in 0..partitions {
            let seq = i * partitions as usize + p as usize;
            records.push((Some(p), keyed_record(seq, 1000)));
        }
    }
    let producer = producer(bootstrap, &[("enable.idempotence", "true")]);
    let acked = block_on(produce_all(&producer, topic, &records));
    for p in 0..partitions {
        let offsets: Vec<i64> = acked
            .iter()
            .filter(|a| a.partition == p)
            .map(|a| a.offset)
            .collect();
        let want: Vec<i64> = (base..base + per_partition as i64).collect();
        assert_eq!(offsets, want, "acknowledged offsets of {topic}/{p}");
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn partitions_of(list: &TopicPartitionList, topic: &str) -> BTreeSet<i32> {
    list.elements_for_topic(topic)
        .iter()
        .map(|e| e.partition())
        .collect()
}

fn show(set: &BTreeSet<i32>) -> String {
    let parts: Vec<String> = set.iter().map(i32::to_string).collect();
    parts.join(",")
}

/// OffsetFetch through librdkafka for `group` (the client never joins the group): the committed
/// offset of every partition, `None` where nothing is committed.
fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    let mut config = base_config(bootstrap);
    config
        .set("group.id", group)
        .set("client.id", "offset-fetcher")
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer<TestContext> = config
        .create_with_context(TestContext)
        .expect("create an OffsetFetch client");
    let mut query = TopicPartitionList::new();
    for p in 0..partitions {
        query.add_partition(topic, p);
    }
    let answer = consumer
        .committed_offsets(query, Duration::from_secs(10))
        .unwrap_or_else(|e| {
            panic!(
                "OffsetFetch for group {group} failed: {e}\nclient log:\n{}",
                client_log_tail(40)
            )
        });
    answer
        .elements_for_topic(topic)
        .iter()
        .map(|e| {
            if let Err(error) = e.error() {
                panic!("OffsetFetch {group} {topic}/{}: {error}", e.partition());
            }
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                Offset::Invalid => None,
                other => panic!("OffsetFetch {group} {topic}/{}: {other:?}", e.partition()),
            };
            (e.partition(), offset)
        })
        .collect()
}

/// DescribeGroups over a raw connection, to read what librdkafka does not expose (member ids,
/// group instance ids, the stored assignments).
fn describe_group(broker: &StrataProcess, group: &str) -> DescribedGroup {
    let mut connection = RawConnection::connect(broker.addr());
    let versions = connection.api_versions();
    let version = RawConnection::negotiate::<DescribeGroupsRequest>(&versions, 5);
    let mut request = DescribeGroupsRequest::default();
    request.groups = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let mut response = connection.request(version, &request);
    assert_eq!(
        response.groups.len(),
        1,
        "DescribeGroups {group}: one group"
    );
    let described = response.groups.remove(0);
    assert_eq!(
        described.error_code, 0,
        "DescribeGroups v{version} {group} answered error {}",
        described.error_code
    );
    described
}

/// The partitions of `topic` in a ConsumerProtocol assignment (version, [topic, [partition]],
/// user data), as a group's leader encodes it and DescribeGroups returns it.
fn decode_assignment(bytes: &[u8], topic: &str) -> BTreeSet<i32> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> &'a [u8] {
        assert!(bytes.len() >= n, "assignment truncated");
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        head
    }
    fn i16_of(bytes: &mut &[u8]) -> i16 {
        i16::from_be_bytes(take(bytes, 2).try_into().unwrap())
    }
    fn i32_of(bytes: &mut &[u8]) -> i32 {
        i32::from_be_bytes(take(bytes, 4).try_into().unwrap())
    }
    let mut rest = bytes;
    let mut partitions = BTreeSet::new();
    if rest.is_empty() {
        return partitions;
    }
    let _version = i16_of(&mut rest);
    let topics = i32_of(&mut rest);
    for _ in 0..topics {
        let len = usize::try_from(i16_of(&mut rest)).expect("topic name length");
        let name = String::from_utf8_lossy(take(&mut rest, len)).into_owned();
        let count = i32_of(&mut rest);
        for _ in 0..count {
            let p = i32_of(&mut rest);
            if name == topic {
                partitions.insert(p);
            }
        }
    }
    partitions
}

/// Waits until the given members' assignments are non-empty, pairwise disjoint and together
/// exactly partitions `0..partitions`; returns them.
fn wait_partitioned(what: &str, members: &[&Member], partitions: i32) -> Vec<BTreeSet<i32>> {
    let all: BTreeSet<i32> = (0..partitions).collect();
    wait_until_or_report(
        &format!("{what}: assignments split 0..{partitions} among the members"),
        || {
            let sets: Vec<BTreeSet<i32>> = members.iter().map(|m| m.assignment()).collect();
            is_partitioning(&sets, &all).then_some(sets)
        },
        || members.iter().map(|m| m.describe()).collect(),
    )
}

fn is_partitioning(sets: &[BTreeSet<i32>], all: &BTreeSet<i32>) -> bool {
    let total: usize = sets.iter().map(BTreeSet::len).sum();
    let union: BTreeSet<i32> = sets.iter().flatten().copied().collect();
    sets.iter().all(|s| !s.is_empty()) && total == all.len() && &union == all
}

/// [`wait_until`] with a report added to the failure (member states, client log).
fn wait_until_or_report<T>(
    what: &str,
    mut check: impl FnMut() -> Option<T>,
    report: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {DEADLINE:?} waiting until {what}\n{}\nclient log:\n{}",
                report(),
                client_log_tail(60)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// A group member on its own thread
// ---------------------------------------------------------------------------------------------

/// One record as a member saw it.
#[derive(Debug, Clone)]
struct Got {
    partition: i32,
    offset: i64,
    key: Option<String>,
    seq: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Assigned,
    Revoked,
}

/// One rebalance callback.
#[derive(Debug, Clone)]
struct RebalanceEvent {
    change: Change,
    partitions: BTreeSet<i32>,
    at: Instant,
    /// The generation librdkafka held when the callback ran.
    generation: i32,
}

#[derive(Debug, Default)]
struct MemberState {
    assignment: BTreeSet<i32>,
    events: Vec<RebalanceEvent>,
    received: Vec<Got>,
    /// Per partition, the offset after the last record the application processed; removed
    /// when the partition is revoked (the next owner takes over from the commit).
    positions: BTreeMap<i32, i64>,
    /// Per partition, the latest offset whose commit the broker acknowledged.
    committed: BTreeMap<i32, i64>,
    commit_errors: Vec<String>,
    consumer_errors: Vec<String>,
    /// The generation librdkafka holds (updated on rebalances and idle polls).
    generation: i32,
    /// The member stopped polling (and committing) for good, as its [`Plan`] says: it stands
    /// for a hung or crashed process (librdkafka keeps heartbeating).
    frozen: bool,
}

/// How a member commits.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// Commit every `commit_every` records, on idle polls, on revocation and on stop.
    Steady { commit_every: usize },
    /// Commit once after `commit_at` records, read `tail` more without committing, then stop
    /// polling for good (the killed member of the takeover test).
    CommitThenTail { commit_at: usize, tail: usize },
    /// Like `Steady` (without idle commits), but stop polling for good after `freeze_after`
    /// records, leaving whatever was read since the last commit uncommitted.
    SteadyThenFreeze {
        commit_every: usize,
        freeze_after: usize,
    },
}

/// Records rebalances and commits revoked partitions' progress before they move.
struct GroupContext {
    name: String,
    topic: String,
    state: Arc<Mutex<MemberState>>,
}

impl ClientContext for GroupContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        TestContext.log(level, &format!("[{}] {facility}", self.name), message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        TestContext.error(error, &format!("[{}] {reason}", self.name));
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let revoked = partitions_of(list, &self.topic);
            let frozen = lock(&self.state).frozen;
            // A frozen member stands for one that crashed: it commits nothing more.
            if !frozen {
                commit_positions(consumer, &self.topic, &self.state, Some(&revoked));
            }
            let generation = generation_of(consumer);
            let mut state = lock(&self.state);
            for p in &revoked {
                state.assignment.remove(p);
                state.positions.remove(p);
            }
            state.events.push(RebalanceEvent {
                change: Change::Revoked,
                partitions: revoked,
                at: Instant::now(),
                generation,
            });
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                let assigned = partitions_of(list, &self.topic);
                let generation = generation_of(consumer);
                let mut state = lock(&self.state);
                state.assignment.extend(assigned.iter().copied());
                state.generation = generation;
                state.events.push(RebalanceEvent {
                    change: Change::Assigned,
                    partitions: assigned,
                    at: Instant::now(),
                    generation,
                });
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(error) => {
                lock(&self.state)
                    .consumer_errors
                    .push(format!("rebalance error: {error}"));
            }
        }
    }
}

/// The group generation librdkafka currently holds (-1 before the first JoinGroup).
fn generation_of<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> i32 {
    let client = consumer.client().native_ptr();
    // SAFETY: `client` is the live rd_kafka_t of `consumer`, borrowed for this call.
    // rd_kafka_consumer_group_metadata returns a new object we own (or NULL); it is read and
    // then destroyed exactly once, and no pointer into it escapes.
    unsafe {
        let metadata = rdkafka::bindings::rd_kafka_consumer_group_metadata(client);
        if metadata.is_null() {
            return -1;
        }
        let generation =
            rdkafka::bindings::rd_kafka_consumer_group_metadata_generation_id(metadata);
        rdkafka::bindings::rd_kafka_consumer_group_metadata_destroy(metadata);
        generation
    }
}

/// Commits, synchronously, the processed positions of the assigned partitions (restricted to
/// `only` if given) that moved since their last acknowledged commit.
fn commit_positions(
    consumer: &BaseConsumer<GroupContext>,
    topic: &str,
    state: &Mutex<MemberState>,
    only: Option<&BTreeSet<i32>>,
) {
    let pending: Vec<(i32, i64)> = {
        let state = lock(state);
        state
            .positions
            .iter()
            .filter(|(p, _)| state.assignment.contains(p))
            .filter(|(p, _)| only.is_none_or(|only| only.contains(p)))
            .filter(|(p, o)| state.committed.get(p) != Some(o))
            .map(|(p, o)| (*p, *o))
            .collect()
    };
    if pending.is_empty() {
        return;
    }
    let mut list = TopicPartitionList::new();
    for (p, o) in &pending {
        list.add_partition_offset(topic, *p, Offset::Offset(*o))
            .expect("build the commit list");
    }
    let result = consumer.commit(&list, CommitMode::Sync);
    let mut state = lock(state);
    match result {
        Ok(()) => state.committed.extend(pending),
        Err(error) => state
            .commit_errors
            .push(format!("OffsetCommit {pending:?}: {error}")),
    }
}

/// A group member: an rdkafka `BaseConsumer` subscribed to one topic, polled on its own thread.
struct Member {
    name: String,
    state: Arc<Mutex<MemberState>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Consumer settings for a member: explicit commits, start at the earliest offset when the
/// group has no commit, quick heartbeats, `settings` on top.
fn member_config(
    bootstrap: &str,
    group: &str,
    name: &str,
    settings: &[(&str, &str)],
) -> ClientConfig {
    let mut config = base_config(bootstrap);
    config
        .set("client.id", name)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", DEFAULT_SESSION_MS.to_string())
        .set("heartbeat.interval.ms", HEARTBEAT_MS.to_string())
        .set("fetch.wait.max.ms", "100")
        .set_log_level(RDKafkaLogLevel::Info);
    for (key, value) in settings {
        config.set(*key, *value);
    }
    config
}

impl Member {
    fn start(
        bootstrap: &str,
        topic: &str,
        group: &str,
        name: &str,
        settings: &[(&str, &str)],
        plan: Plan,
    ) -> Self {
        let config = member_config(bootstrap, group, name, settings);
        let state = Arc::new(Mutex::new(MemberState {
            generation: -1,
            ..MemberState::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let context = GroupContext {
            name: name.to_string(),
            topic: topic.to_string(),
            state: Arc::clone(&state),
        };
        let thread = {
            let (topic, state, stop) = (topic.to_string(), Arc::clone(&state), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("member-{name}"))
                .spawn(move || run_member(config, context, &topic, &state, &stop, plan))
                .expect("spawn a member thread")
        };
        Self {
            name: name.to_string(),
            state,
            stop,
            thread: Some(thread),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&MemberState) -> T) -> T {
        f(&lock(&self.state))
    }

    fn assignment(&self) -> BTreeSet<i32> {
        self.with(|s| s.assignment.clone())
    }

    fn event_count(&self) -> usize {
        self.with(|s| s.events.len())
    }

    fn generation(&self) -> i32 {
        self.with(|s| s.generation)
    }

    /// A one-paragraph summary for failure messages.
    fn describe(&self) -> String {
        self.with(|s| {
            let events: Vec<String> = s
                .events
                .iter()
                .map(|e| format!("{:?}[{}]@gen{}", e.change, show(&e.partitions), e.generation))
                .collect();
            format!(
                "member {}: assignment [{}], generation {}, {} records, events {events:?}, committed {:?}, commit errors {:?}, consumer errors {:?}\n",
                self.name,
                show(&s.assignment),
                s.generation,
                s.received.len(),
                s.committed,
                s.commit_errors,
                s.consumer_errors
            )
        })
    }

    /// Stops the member (a final commit unless frozen, then close: LeaveGroup for dynamic
    /// members) and returns everything it recorded.
    fn stop(mut self) -> MemberState {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                panic!("member {} panicked", self.name);
            }
        }
        std::mem::take(&mut *lock(&self.state))
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run_member(
    config: ClientConfig,
    context: GroupContext,
    topic: &str,
    state: &Mutex<MemberState>,
    stop: &AtomicBool,
    plan: Plan,
) {
    let consumer: BaseConsumer<GroupContext> = config
        .create_with_context(context)
        .expect("create a group consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut since_commit = 0usize;
    let mut total = 0usize;
    while !stop.load(Ordering::SeqCst) {
        if lock(state).frozen {
            // Not polling: the member looks hung to the group, librdkafka still heartbeats.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match consumer.poll(Duration::from_millis(50)) {
            None => {
                if let Plan::Steady { .. } = plan {
                    if since_commit > 0 {
                        commit_positions(&consumer, topic, state, None);
                        since_commit = 0;
                    }
                }
                let generation = generation_of(&consumer);
                lock(state).generation = generation;
            }
            Some(Ok(message)) => {
                let got = Got {
                    partition: message.partition(),
                    offset: message.offset(),
                    key: message
                        .key()
                        .map(|k| String::from_utf8_lossy(k).into_owned()),
                    seq: parse_seq(message.payload()),
                };
                {
                    let mut state = lock(state);
                    state.positions.insert(got.partition, got.offset + 1);
                    state.received.push(got);
                }
                since_commit += 1;
                total += 1;
                match plan {
                    Plan::Steady { commit_every } => {
                        if since_commit >= commit_every {
                            commit_positions(&consumer, topic, state, None);
                            since_commit = 0;
                        }
                    }
                    Plan::SteadyThenFreeze {
                        commit_every,
                        freeze_after,
                    } => {
                        if total == freeze_after {
                            lock(state).frozen = true;
                        } else if since_commit >= commit_every {
                            commit_positions(&consumer, topic, state, None);
                            since_commit = 0;
                        }
                    }
                    Plan::CommitThenTail { commit_at, tail } => {
                        if total == commit_at {
                            commit_positions(&consumer, topic, state, None);
                        }
                        if total == commit_at + tail {
                            lock(state).frozen = true;
                        }
                    }
                }
            }
            Some(Err(error)) => lock(state).consumer_errors.push(error.to_string()),
        }
    }
    if !lock(state).frozen {
        if let Plan::Steady { .. } = plan {
            commit_positions(&consumer, topic, state, None);
        }
    }
    // Dropping the consumer closes it: the revoke callback, then LeaveGroup (dynamic members).
    drop(consumer);
}

/// Per partition, the offsets the given members received (with who received each).
fn offsets_by_partition(members: &[(&str, &MemberState)]) -> BTreeMap<i32, Vec<(i64, String)>> {
    let mut by_partition: BTreeMap<i32, Vec<(i64, String)>> = BTreeMap::new();
    for (name, state) in members {
        for got in &state.received {
            by_partition
                .entry(got.partition)
                .or_default()
                .push((got.offset, (*name).to_string()));
        }
    }
    by_partition
}

/// Per-key order: in each member's view, the sequence numbers of every key strictly increase.
fn assert_per_key_order(name: &str, state: &MemberState) {
    let mut last: BTreeMap<&str, (u64, i32, i64)> = BTreeMap::new();
    for got in &state.received {
        let key = got.key.as_deref().expect("every test record has a key");
        let seq = got.seq.expect("every test record has a seq=N value");
        if let Some((previous, p, o)) = last.insert(key, (seq, got.partition, got.offset)) {
            assert!(
                seq > previous,
                "{name}: key {key} went from seq {previous} ({p}/{o}) to seq {seq} ({}/{})",
                got.partition,
                got.offset
            );
        }
    }
}

/// Checks that `members` together received every record of `expected` ((partition, offset) →
/// seq) exactly once, with the content that was produced there.
fn assert_exactly_once(
    group: &str,
    members: &[(&str, &MemberState)],
    expected: &BTreeMap<(i32, i64), u64>,
) {
    let mut seen: BTreeMap<(i32, i64), &str> = BTreeMap::new();
    let mut duplicates = Vec::new();
    let mut wrong = Vec::new();
    for (name, state) in members {
        for got in &state.received {
            let at = (got.partition, got.offset);
            if let Some(first) = seen.insert(at, name) {
                duplicates.push(format!("{}/{} to {first} and {name}", at.0, at.1));
            }
            match expected.get(&at) {
                Some(seq) if got.seq == Some(*seq) => {}
                other => wrong.push(format!(
                    "{name} got seq {:?} at {}/{}, expected {other:?}",
                    got.seq, at.0, at.1
                )),
            }
        }
    }
    let missing: Vec<&(i32, i64)> = expected.keys().filter(|k| !seen.contains_key(k)).collect();
    assert!(
        duplicates.is_empty(),
        "group {group}: {} records delivered more than once, first {:?}",
        duplicates.len(),
        &duplicates[..duplicates.len().min(10)]
    );
    assert!(
        wrong.is_empty(),
        "group {group}: {} records with unexpected content, first {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert!(
        missing.is_empty(),
        "group {group}: {} records never delivered, first {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

/// Total distinct (partition, offset) pairs the members received.
fn distinct_received(members: &[&Member]) -> usize {
    let mut seen = BTreeSet::new();
    for m in members {
        m.with(|s| {
            for g in &s.received {
                seen.insert((g.partition, g.offset));
            }
        });
    }
    seen.len()
}

fn assert_no_errors(name: &str, state: &MemberState) {
    assert!(
        state.commit_errors.is_empty(),
        "{name}: commits failed: {:?}",
        state.commit_errors
    );
    assert!(
        state.consumer_errors.is_empty(),
        "{name}: consumer errors: {:?}",
        state.consumer_errors
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Work queue and publish/subscribe
// ---------------------------------------------------------------------------------------------

#[test]
fn work_queue_and_pub_sub() {
    const PARTITIONS: i32 = 6;
    const RECORDS: usize = 60_000;
    let started = Instant::now();
    let broker = start_broker(&[]);
    let bootstrap = broker.bootstrap();
    let topic = "groups-work-queue";
    block_on(create_topic(&bootstrap, topic, PARTITIONS, &[]));

    let steady = Plan::Steady { commit_every: 1000 };
    let a: Vec<Member> = (0..3)
        .map(|i| Member::start(&bootstrap, topic, "group-a", &format!("a{i}"), &[], steady))
        .collect();
    let b = Member::start(&bootstrap, topic, "group-b", "b0", &[], steady);
    let a_refs: Vec<&Member> = a.iter().collect();
    let assignments = wait_partitioned("group A is stable", &a_refs, PARTITIONS);
    wait_partitioned("group B is stable", &[&b], PARTITIONS);
    let events_when_stable: Vec<usize> = a.iter().map(Member::event_count).collect();
    eprintln!(
        "group A stable after {:.1?}: {assignments:?}",
        started.elapsed()
    );

    // The broker's view of group A (DescribeGroups through librdkafka): three members holding
    // the assignments they reported.
    {
        let client: BaseConsumer<TestContext> = base_config(&bootstrap)
            .create_with_context(TestContext)
            .expect("create a client for DescribeGroups");
        let list = client
            .fetch_group_list(Some("group-a"), Duration::from_secs(10))
            .expect("ListGroups/DescribeGroups group-a");
        let group = list
            .groups()
            .iter()
            .find(|g| g.name() == "group-a")
            .expect("DescribeGroups lists group-a");
        assert_eq!(group.state(), "Stable", "group-a state");
        assert_eq!(group.protocol_type(), "consumer");
        let described: BTreeMap<String, BTreeSet<i32>> = group
            .members()
            .iter()
            .map(|m| {
                (
                    m.client_id().to_string(),
                    decode_assignment(m.assignment().unwrap_or_default(), topic),
                )
            })
            .collect();
        let reported: BTreeMap<String, BTreeSet<i32>> =
            a.iter().map(|m| (m.name.clone(), m.assignment())).collect();
        assert_eq!(
            described,
            reported,
            "DescribeGroups assignments (protocol {}) vs what the members were given",
            group.protocol()
        );
    }

    let produce_started = Instant::now();
    let acked = produce_keyed(&bootstrap, topic, 0, RECORDS);
    eprintln!(
        "produced {RECORDS} keyed records in {:.1?}",
        produce_started.elapsed()
    );
    let expected: BTreeMap<(i32, i64), u64> = acked
        .iter()
        .enumerate()
        .map(|(seq, a)| ((a.partition, a.offset), seq as u64))
        .collect();
    assert_eq!(expected.len(), RECORDS, "acknowledged offsets are distinct");
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    for a in &acked {
        let end = ends.entry(a.partition).or_default();
        *end = (*end).max(a.offset + 1);
    }

    wait_until_or_report(
        &format!("group A and group B each received {RECORDS} distinct records"),
        || {
            (distinct_received(&a_refs) >= RECORDS && distinct_received(&[&b]) >= RECORDS)
                .then_some(())
        },
        || {
            format!(
                "A has {}, B has {}\n{}{}{}{}",
                distinct_received(&a_refs),
                distinct_received(&[&b]),
                a[0].describe(),
                a[1].describe(),
                a[2].describe(),
                b.describe()
            )
        },
    );
    eprintln!(
        "consumed by both groups {:.1?} after producing started",
        produce_started.elapsed()
    );
    let events_at_end: Vec<usize> = a.iter().map(Member::event_count).collect();
    let report: String = a.iter().map(Member::describe).collect();
    assert_eq!(
        events_when_stable, events_at_end,
        "group A rebalanced while consuming, with no membership change\n{report}"
    );

    let names = ["a0", "a1", "a2"];
    let a_states: Vec<MemberState> = a.into_iter().map(Member::stop).collect();
    let b_state = b.stop();
    for (name, state) in names.iter().zip(&a_states) {
        assert_no_errors(name, state);
    }
    assert_no_errors("b0", &b_state);

    // Group A: a work queue. Disjoint partitions, each record to exactly one member.
    let members: Vec<(&str, &MemberState)> = names.iter().copied().zip(&a_states).collect();
    for (i, set) in assignments.iter().enumerate() {
        for other in &assignments[i + 1..] {
            assert!(
                set.is_disjoint(other),
                "overlapping assignments {assignments:?}"
            );
        }
    }
    for ((name, state), owned) in members.iter().zip(&assignments) {
        let from: BTreeSet<i32> = state.received.iter().map(|g| g.partition).collect();
        assert!(
            from.is_subset(owned),
            "{name} received records of partitions {from:?} but owns {owned:?}"
        );
        assert_per_key_order(name, state);
    }
    assert_exactly_once("group-a", &members, &expected);
    // Group B: publish/subscribe. The single member gets everything, once, in key order.
    assert_exactly_once("group-b", &[("b0", &b_state)], &expected);
    assert_per_key_order("b0", &b_state);

    // Both groups' final commits are the end of every partition.
    for group in ["group-a", "group-b"] {
        let committed = committed_offsets(&bootstrap, group, topic, PARTITIONS);
        let want: BTreeMap<i32, Option<i64>> = ends.iter().map(|(p, e)| (*p, Some(*e))).collect();
        assert_eq!(committed, want, "{group}'s committed offsets after closing");
    }
    let per_member: Vec<usize> = a_states.iter().map(|s| s.received.len()).collect();
    eprintln!(
        "work_queue_and_pub_sub: group A split {per_member:?}, group B {} records; {:.1?} in all",
        b_state.received.len(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A killed member's partitions move to the others and resume from the commits
// ---------------------------------------------------------------------------------------------

/// Env var that turns [`killed_member_child_process`] into the member the test kills:
/// `bootstrap|topic|group`.
const CHILD_ENV: &str = "GROUPS_TEST_KILLED_MEMBER";
const CHILD_PREFIX: &str = "GROUPS-CHILD ";
/// The takeover test's session timeout (the broker's minimum is lowered to allow it).
const KILL_SESSION_MS: u64 = 3000;
/// The killed member commits after this many records, then reads this many more uncommitted.
const CHILD_COMMIT_AT: usize = 500;
const CHILD_TAIL: usize = 150;

/// Not a test on its own: the group member that `killed_member_partitions_move_...` runs in a
/// child process (this test binary, re-invoked with [`CHILD_ENV`]) and SIGKILLs, so that no
/// LeaveGroup is sent. Without the variable it does nothing.
#[test]
fn killed_member_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [bootstrap, topic, group] = parts[..] else {
        panic!("{CHILD_ENV}={spec}: want bootstrap|topic|group");
    };
    let session = KILL_SESSION_MS.to_string();
    let member = Member::start(
        bootstrap,
        topic,
        group,
        "killed",
        &[("session.timeout.ms", session.as_str())],
        Plan::CommitThenTail {
            commit_at: CHILD_COMMIT_AT,
            tail: CHILD_TAIL,
        },
    );
    // Start on a fresh line: libtest may have printed "test ... " without a newline.
    println!();
    let mut printed: Option<BTreeSet<i32>> = None;
    // The parent kills this process; the deadline only keeps an orphan from lingering.
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let (assignment, frozen) = member.with(|s| (s.assignment.clone(), s.frozen));
        if printed.as_ref() != Some(&assignment) {
            println!("{CHILD_PREFIX}assignment {}", show(&assignment));
            printed = Some(assignment);
        }
        if frozen {
            member.with(|s| {
                for got in &s.received {
                    println!("{CHILD_PREFIX}got {} {}", got.partition, got.offset);
                }
                let committed: Vec<String> = s
                    .committed
                    .iter()
                    .map(|(p, o)| format!("{p}={o}"))
                    .collect();
                println!("{CHILD_PREFIX}committed {}", committed.join(","));
                for error in s.commit_errors.iter().chain(&s.consumer_errors) {
                    println!("{CHILD_PREFIX}error {error}");
                }
            });
            println!("{CHILD_PREFIX}paused");
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the parent test never killed this member");
}

/// The killed member's process and what it printed.
struct ChildMember {
    child: Option<Child>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChildMember {
    fn start(bootstrap: &str, topic: &str, group: &str) -> Self {
        let exe = std::env::current_exe().expect("current_exe");
        let mut child = Command::new(exe)
            .args([
                "killed_member_child_process",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, format!("{bootstrap}|{topic}|{group}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the child member");
        let lines = Arc::new(Mutex::new(Vec::new()));
        for (stream, label) in [
            (
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                "out",
            ),
            (
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                "err",
            ),
        ] {
            let Some(stream) = stream else { continue };
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    lock(&lines).push(format!("{label}: {line}"));
                }
            });
        }
        Self {
            child: Some(child),
            lines,
        }
    }

    /// The protocol lines (after [`CHILD_PREFIX`]) printed so far.
    fn protocol(&self) -> Vec<String> {
        lock(&self.lines)
            .iter()
            .filter_map(|l| {
                l.find(CHILD_PREFIX)
                    .map(|at| l[at + CHILD_PREFIX.len()..].to_string())
            })
            .collect()
    }

    fn assignment(&self) -> BTreeSet<i32> {
        self.protocol()
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("assignment ").map(parse_set))
            .unwrap_or_default()
    }

    fn output(&self) -> String {
        lock(&self.lines).join("\n")
    }

    fn kill9(&mut self) {
        let mut child = self.child.take().expect("the child member is running");
        child.kill().expect("SIGKILL the child member");
        child.wait().expect("reap the child member");
    }
}

impl Drop for ChildMember {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn parse_set(text: &str) -> BTreeSet<i32> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("a partition number"))
        .collect()
}

#[test]
fn killed_member_partitions_move_and_resume_from_commits() {
    const PARTITIONS: i32 = 6;
    const PER_PARTITION: usize = 1200;
    let started = Instant::now();
    let broker = start_broker(&["--group-min-session-timeout", "1s"]);
    let bootstrap = broker.bootstrap();
    let topic = "groups-killed-member";
    let group = "group-takeover";
    block_on(create_topic(&bootstrap, topic, PARTITIONS, &[]));

    let session = KILL_SESSION_MS.to_string();
    let settings = [("session.timeout.ms", session.as_str())];
    let mut killed = ChildMember::start(&bootstrap, topic, group);
    let steady = Plan::Steady { commit_every: 100 };
    let survivors = [
        Member::start(&bootstrap, topic, group, "s0", &settings, steady),
        Member::start(&bootstrap, topic, group, "s1", &settings, steady),
    ];
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let killed_partitions = wait_until_or_report(
        "the child member and two in-process members split the partitions",
        || {
            let sets = vec![
                killed.assignment(),
                survivors[0].assignment(),
                survivors[1].assignment(),
            ];
            is_partitioning(&sets, &all).then(|| sets[0].clone())
        },
        || {
            format!(
                "child:\n{}\n{}{}",
                killed.output(),
                survivors[0].describe(),
                survivors[1].describe()
            )
        },
    );
    eprintln!(
        "stable after {:.1?}; the child member owns {killed_partitions:?}",
        started.elapsed()
    );

    produce_per_partition(&bootstrap, topic, PARTITIONS, 0, PER_PARTITION);

    // The child commits after CHILD_COMMIT_AT records, reads CHILD_TAIL more, and stops
    // polling (still heartbeating): then it has an uncommitted tail.
    wait_until_or_report(
        "the child member commits, reads an uncommitted tail and pauses",
        || {
            killed
                .protocol()
                .iter()
                .any(|l| l == "paused")
                .then_some(())
        },
        || format!("child:\n{}", killed.output()),
    );
    let protocol = killed.protocol();
    let child_errors: Vec<&String> = protocol
        .iter()
        .filter(|l| l.starts_with("error "))
        .collect();
    assert!(
        child_errors.is_empty(),
        "the child member saw errors: {child_errors:?}"
    );
    let child_committed: BTreeMap<i32, i64> = protocol
        .iter()
        .find_map(|l| l.strip_prefix("committed "))
        .map(|text| {
            text.split(',')
                .filter(|s| !s.is_empty())
                .map(|pair| {
                    let (p, o) = pair.split_once('=').expect("p=o");
                    (p.parse().unwrap(), o.parse().unwrap())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut child_got: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for line in &protocol {
        if let Some(rest) = line.strip_prefix("got ") {
            let (p, o) = rest.split_once(' ').expect("got P O");
            child_got
                .entry(p.parse().unwrap())
                .or_default()
                .push(o.parse().unwrap());
        }
    }
    assert!(
        !child_committed.is_empty(),
        "the child member's commit was not acknowledged\nchild:\n{}",
        killed.output()
    );
    // What the broker holds for the group before the kill (nobody else owns those partitions).
    let fetched = committed_offsets(&bootstrap, group, topic, PARTITIONS);
    for (p, offset) in &child_committed {
        assert_eq!(
            fetched.get(p).copied().flatten(),
            Some(*offset),
            "OffsetFetch of partition {p} vs the child's acknowledged commit"
        );
    }

    killed.kill9();
    let killed_at = Instant::now();
    eprintln!(
        "child member SIGKILLed {:.1?} into the test",
        started.elapsed()
    );

    let survivor_refs: Vec<&Member> = survivors.iter().collect();
    wait_partitioned(
        "the survivors take over the killed member's partitions",
        &survivor_refs,
        PARTITIONS,
    );
    let moved_at = survivors
        .iter()
        .flat_map(|m| m.with(|s| s.events.clone()))
        .filter(|e| e.change == Change::Assigned && e.at > killed_at)
        .filter(|e| !e.partitions.is_disjoint(&killed_partitions))
        .map(|e| e.at)
        .min()
        .expect("an assignment after the kill gave the killed member's partitions away");
    let takeover = moved_at - killed_at;
    eprintln!(
        "partitions moved {takeover:.1?} after the SIGKILL (session timeout {KILL_SESSION_MS} ms)"
    );
    // Kafka expires a member a session timeout after its last heartbeat, and that heartbeat was
    // at most one heartbeat interval before the kill.
    let earliest = Duration::from_millis(KILL_SESSION_MS - HEARTBEAT_MS - 200);
    assert!(
        takeover >= earliest,
        "the killed member's partitions moved {takeover:?} after the kill, before its session could expire ({earliest:?})"
    );

    wait_until_or_report(
        "the survivors read every partition to its end",
        || {
            let mut max: BTreeMap<i32, i64> = BTreeMap::new();
            for m in &survivors {
                m.with(|s| {
                    for g in &s.received {
                        let e = max.entry(g.partition).or_insert(-1);
                        *e = (*e).max(g.offset);
                    }
                });
            }
            (0..PARTITIONS)
                .all(|p| max.get(&p) == Some(&(PER_PARTITION as i64 - 1)))
                .then_some(())
        },
        || survivors.iter().map(Member::describe).collect(),
    );
    let [s0, s1] = survivors;
    let states = [("s0", s0.stop()), ("s1", s1.stop())];
    for (name, state) in &states {
        assert_no_errors(name, state);
    }

    // For every partition: survivors' offsets after the takeover start exactly at the commit,
    // all offsets are covered, and only the killed member's uncommitted tail came twice.
    let survivor_offsets = offsets_by_partition(&[("s0", &states[0].1), ("s1", &states[1].1)]);
    let mut redelivered_total = 0;
    for p in 0..PARTITIONS {
        let by_survivors = survivor_offsets.get(&p).cloned().unwrap_or_default();
        let by_child = child_got.get(&p).cloned().unwrap_or_default();
        let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
        for o in by_survivors
            .iter()
            .map(|(o, _)| *o)
            .chain(by_child.iter().copied())
        {
            *counts.entry(o).or_default() += 1;
        }
        let missing: Vec<i64> = (0..PER_PARTITION as i64)
            .filter(|o| !counts.contains_key(o))
            .collect();
        assert!(
            missing.is_empty(),
            "partition {p}: offsets skipped by the takeover: {:?}",
            &missing[..missing.len().min(20)]
        );
        if killed_partitions.contains(&p) {
            let commit = child_committed.get(&p).copied().unwrap_or(0);
            let child_end = by_child.iter().max().map_or(0, |o| o + 1);
            let first_after = by_survivors.iter().map(|(o, _)| *o).min();
            assert_eq!(
                first_after,
                Some(commit),
                "partition {p}: the new owner must start at the committed offset {commit} (child read up to {child_end})"
            );
            let twice: Vec<i64> = counts
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(o, _)| *o)
                .collect();
            let tail: Vec<i64> = (commit..child_end).collect();
            assert_eq!(
                twice, tail,
                "partition {p}: only the uncommitted tail {commit}..{child_end} may come twice"
            );
            assert!(
                counts.values().all(|n| *n <= 2),
                "partition {p}: an offset came more than twice"
            );
            redelivered_total += tail.len();
        } else {
            let twice: Vec<i64> = counts
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(o, _)| *o)
                .collect();
            assert!(
                twice.is_empty(),
                "partition {p} (a survivor's) had redeliveries at {:?}",
                &twice[..twice.len().min(20)]
            );
        }
    }
    assert!(
        redelivered_total > 0,
        "test setup: the killed member left no uncommitted tail (got {child_got:?}, committed {child_committed:?})"
    );
    eprintln!(
        "killed_member: committed {child_committed:?}, {redelivered_total} tail records redelivered; {:.1?} in all",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Cooperative-sticky: a newcomer only takes what is revoked
// ---------------------------------------------------------------------------------------------

#[test]
fn cooperative_sticky_only_moves_revoked_partitions() {
    const PARTITIONS: i32 = 12;
    let started = Instant::now();
    let broker = start_broker(&[]);
    let bootstrap = broker.bootstrap();
    let topic = "groups-cooperative";
    let group = "group-cooperative";
    block_on(create_topic(&bootstrap, topic, PARTITIONS, &[]));
    let settings = [("partition.assignment.strategy", "cooperative-sticky")];
    let steady = Plan::Steady { commit_every: 200 };
    let old: Vec<Member> = (0..3)
        .map(|i| {
            Member::start(
                &bootstrap,
                topic,
                group,
                &format!("c{i}"),
                &settings,
                steady,
            )
        })
        .collect();
    let old_refs: Vec<&Member> = old.iter().collect();
    let before = wait_partitioned(
        "three cooperative members are stable",
        &old_refs,
        PARTITIONS,
    );
    assert!(
        before.iter().all(|s| s.len() == 4),
        "cooperative-sticky should balance 12 partitions 4/4/4: {before:?}"
    );
    let first_acked = produce_keyed(&bootstrap, topic, 0, 1200);
    wait_until_or_report(
        "the three members consume the first 1200 records",
        || (distinct_received(&old_refs) >= 1200).then_some(()),
        || old.iter().map(Member::describe).collect(),
    );
    let marks: Vec<usize> = old.iter().map(Member::event_count).collect();
    eprintln!(
        "3 members stable after {:.1?}: {before:?}",
        started.elapsed()
    );

    let newcomer = Member::start(&bootstrap, topic, group, "c3", &settings, steady);
    let joined_at = Instant::now();
    let mut everyone: Vec<&Member> = old.iter().collect();
    everyone.push(&newcomer);
    let after = wait_partitioned("the newcomer gets its share", &everyone, PARTITIONS);
    eprintln!(
        "rebalanced {:.1?} after the 4th member started: {after:?}",
        joined_at.elapsed()
    );
    let second_acked = produce_keyed(&bootstrap, topic, 1200, 1200);
    wait_until_or_report(
        "the four members consume the next 1200 records",
        || (distinct_received(&everyone) >= 2400).then_some(()),
        || everyone.iter().map(|m| m.describe()).collect(),
    );

    let mut moved = BTreeSet::new();
    for (i, member) in old.iter().enumerate() {
        let events: Vec<RebalanceEvent> = member.with(|s| s.events[marks[i]..].to_vec());
        let revoked: BTreeSet<i32> = events
            .iter()
            .filter(|e| e.change == Change::Revoked)
            .flat_map(|e| e.partitions.iter().copied())
            .collect();
        let added: BTreeSet<i32> = events
            .iter()
            .filter(|e| e.change == Change::Assigned)
            .flat_map(|e| e.partitions.iter().copied())
            .collect();
        let kept = &after[i];
        assert!(
            kept.is_subset(&before[i]),
            "{}: new assignment {kept:?} is not a subset of its old {:?}",
            member.name,
            before[i]
        );
        let lost: BTreeSet<i32> = before[i].difference(kept).copied().collect();
        assert_eq!(
            revoked, lost,
            "{}: revoked partitions vs partitions that moved (events {events:?})",
            member.name
        );
        assert!(
            added.is_empty(),
            "{}: was assigned {added:?} by the rebalance",
            member.name
        );
        moved.extend(lost);
    }
    assert_eq!(
        after[3], moved,
        "the newcomer should own exactly the partitions revoked from the others"
    );
    assert!(
        after.iter().all(|s| s.len() == 3),
        "12 partitions over 4 members should be 3 each: {after:?}"
    );
    let newcomer_revoked = newcomer.with(|s| {
        s.events
            .iter()
            .any(|e| e.change == Change::Revoked && !e.partitions.is_empty())
    });
    assert!(
        !newcomer_revoked,
        "the newcomer had partitions revoked: {}",
        newcomer.describe()
    );

    let mut states: Vec<(String, MemberState)> = Vec::new();
    for m in old.into_iter().chain([newcomer]) {
        let name = m.name.clone();
        states.push((name, m.stop()));
    }
    for (name, state) in &states {
        assert_no_errors(name, state);
    }
    let expected: BTreeMap<(i32, i64), u64> = first_acked
        .iter()
        .chain(&second_acked)
        .enumerate()
        .map(|(seq, a)| ((a.partition, a.offset), seq as u64))
        .collect();
    let members: Vec<(&str, &MemberState)> = states.iter().map(|(n, s)| (n.as_str(), s)).collect();
    assert_exactly_once(group, &members, &expected);
    for (name, state) in &members {
        assert_per_key_order(name, state);
    }
    eprintln!(
        "cooperative_sticky: moved {moved:?} to the newcomer; {:.1?} in all",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Static membership: a restart within the session timeout is not a rebalance
// ---------------------------------------------------------------------------------------------

#[test]
fn static_member_restart_keeps_partitions_without_rebalance() {
    const PARTITIONS: i32 = 6;
    let started = Instant::now();
    let broker = start_broker(&[]);
    let bootstrap = broker.bootstrap();
    let topic = "groups-static";
    let group = "group-static";
    block_on(create_topic(&bootstrap, topic, PARTITIONS, &[]));
    let steady = Plan::Steady { commit_every: 100 };
    let start_static = |i: usize| {
        let instance = format!("static-{i}");
        Member::start(
            &bootstrap,
            topic,
            group,
            &format!("st{i}"),
            &[("group.instance.id", instance.as_str())],
            steady,
        )
    };
    // st0 joins first, so it is the group's leader: the restart below is the leader's.
    let st0 = start_static(0);
    wait_partitioned("st0 alone owns everything", &[&st0], PARTITIONS);
    let st1 = start_static(1);
    let st2 = start_static(2);
    let assignments = wait_partitioned(
        "three static members are stable",
        &[&st0, &st1, &st2],
        PARTITIONS,
    );
    produce_per_partition(&bootstrap, topic, PARTITIONS, 0, 100);
    wait_until_or_report(
        "the members consume and commit the first 600 records",
        || {
            let mut committed = BTreeMap::new();
            for m in [&st0, &st1, &st2] {
                m.with(|s| committed.extend(s.committed.clone()));
            }
            (0..PARTITIONS)
                .all(|p| committed.get(&p) == Some(&100))
                .then_some(())
        },
        || [&st0, &st1, &st2].iter().map(|m| m.describe()).collect(),
    );
    let fetched = committed_offsets(&bootstrap, group, topic, PARTITIONS);
    assert!(
        fetched.values().all(|o| *o == Some(100)),
        "OffsetFetch after the first 600 records: {fetched:?}"
    );
    let generation = st1.generation();
    assert!(generation > 0, "generation {generation}");
    wait_until("every member reports the same generation", DEADLINE, || {
        [&st0, &st2]
            .iter()
            .all(|m| m.generation() == generation)
            .then_some(())
    });
    let described_before = describe_group(&broker, group);
    let marks = [st1.event_count(), st2.event_count()];

    let st0_state = st0.stop();
    let closed_at = Instant::now();
    assert_no_errors("st0", &st0_state);
    let st0_again = start_static(0);
    let reassigned = wait_until_or_report(
        "the restarted static member gets an assignment",
        || {
            let set = st0_again.assignment();
            (!set.is_empty()).then_some(set)
        },
        || {
            [&st0_again, &st1, &st2]
                .iter()
                .map(|m| m.describe())
                .collect()
        },
    );
    eprintln!(
        "static member back with {reassigned:?} {:.1?} after closing",
        closed_at.elapsed()
    );
    assert_eq!(
        reassigned, assignments[0],
        "the restarted static member's partitions"
    );
    assert_eq!(
        st0_again.generation(),
        generation,
        "the restarted static member should rejoin the current generation"
    );

    // Watch the others through the old instance's session timeout (and a margin): a broker
    // that rebalanced on the restart, or expired the replaced member id, shows up here.
    let window_end = closed_at + Duration::from_millis(DEFAULT_SESSION_MS + 2000);
    while Instant::now() < window_end {
        for (member, mark) in [(&st1, marks[0]), (&st2, marks[1])] {
            let (events, gen) = member.with(|s| (s.events[mark..].to_vec(), s.generation));
            assert!(
                events.is_empty() && gen == generation,
                "{} saw a rebalance after the static restart: events {events:?}, generation {gen} (was {generation})",
                member.name
            );
        }
        let again = st0_again.with(|s| s.events.len());
        assert_eq!(again, 1, "the restarted member: {}", st0_again.describe());
        std::thread::sleep(Duration::from_millis(20));
    }

    let described_after = describe_group(&broker, group);
    assert_eq!(described_after.group_state.to_string(), "Stable");
    let instances = |d: &DescribedGroup| -> BTreeMap<String, String> {
        d.members
            .iter()
            .map(|m| {
                (
                    m.group_instance_id
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    m.member_id.to_string(),
                )
            })
            .collect()
    };
    let (before_ids, after_ids) = (instances(&described_before), instances(&described_after));
    let want: BTreeSet<String> = (0..3).map(|i| format!("static-{i}")).collect();
    assert_eq!(
        after_ids.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "DescribeGroups instance ids after the restart: {after_ids:?}"
    );
    eprintln!("member ids before {before_ids:?}\nmember ids after {after_ids:?}");

    // The restarted member continues from the group's commits: it gets exactly the new
    // records of its partitions, the others theirs.
    produce_per_partition(&bootstrap, topic, PARTITIONS, 100, 100);
    let members = [&st0_again, &st1, &st2];
    wait_until_or_report(
        "the new records are consumed",
        || {
            let ok = members.iter().zip(&assignments).all(|(m, owned)| {
                m.with(|s| {
                    s.received.iter().filter(|g| g.offset >= 100).count() >= owned.len() * 100
                })
            });
            ok.then_some(())
        },
        || members.iter().map(|m| m.describe()).collect(),
    );
    for (i, (m, owned)) in members.iter().zip(&assignments).enumerate() {
        let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        m.with(|s| {
            for g in &s.received {
                by_partition.entry(g.partition).or_default().push(g.offset);
            }
        });
        for p in owned {
            let got = by_partition.remove(p).unwrap_or_default();
            let want: Vec<i64> = if i == 0 {
                (100..200).collect()
            } else {
                (0..200).collect()
            };
            assert_eq!(got, want, "{} partition {p}", m.name);
        }
        assert!(
            by_partition.is_empty(),
            "{} read other partitions {by_partition:?}",
            m.name
        );
    }
    for m in members {
        m.with(|s| assert_no_errors(&m.name, s));
    }
    eprintln!("static_member: {:.1?} in all", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 5. Committed offsets survive a SIGKILL of the broker
// ---------------------------------------------------------------------------------------------

#[test]
fn committed_offsets_survive_broker_sigkill() {
    const PARTITIONS: i32 = 4;
    const PER_PARTITION: usize = 1000;
    let started = Instant::now();
    let mut broker = start_broker(&[]);
    let bootstrap = broker.bootstrap();
    let topic = "groups-broker-kill";
    let group = "group-survives";
    block_on(create_topic(&bootstrap, topic, PARTITIONS, &[]));
    produce_per_partition(&bootstrap, topic, PARTITIONS, 0, PER_PARTITION);

    // Mid-consumption: the member commits every 100 records and stops polling after 1550
    // (50 read since its last acknowledged commit); the broker dies right away.
    let first = Member::start(
        &bootstrap,
        topic,
        group,
        "before-kill",
        &[],
        Plan::SteadyThenFreeze {
            commit_every: 100,
            freeze_after: 1550,
        },
    );
    wait_until_or_report(
        "the member reads 1550 records and stops",
        || first.with(|s| s.frozen).then_some(()),
        || first.describe(),
    );
    let (acked_commits, positions) = first.with(|s| (s.committed.clone(), s.positions.clone()));
    first.with(|s| assert_no_errors("before-kill", s));
    broker.kill9();
    broker.restart();
    assert_eq!(
        broker.bootstrap(),
        bootstrap,
        "the broker restarts on the same port"
    );
    eprintln!(
        "broker SIGKILLed and restarted {:.1?} into the test; acknowledged commits {acked_commits:?}, positions {positions:?}",
        started.elapsed()
    );

    let fetched = committed_offsets(&bootstrap, group, topic, PARTITIONS);
    let want: BTreeMap<i32, Option<i64>> = (0..PARTITIONS)
        .map(|p| (p, acked_commits.get(&p).copied()))
        .collect();
    assert_eq!(
        fetched,
        want,
        "OffsetFetch after the broker restart vs the commits acknowledged before the SIGKILL\n{}",
        broker.log_tail()
    );
    let described = describe_group(&broker, group);
    eprintln!(
        "after the restart DescribeGroups says {} with {} member(s)",
        described.group_state,
        described.members.len()
    );

    let before = first.stop();
    let second = Member::start(
        &bootstrap,
        topic,
        group,
        "after-restart",
        &[],
        Plan::Steady { commit_every: 100 },
    );
    wait_until_or_report(
        "the new member reads every partition to its end",
        || {
            let end = PER_PARTITION as i64;
            let done = second.with(|s| {
                (0..PARTITIONS).all(|p| {
                    acked_commits.get(&p) == Some(&end)
                        || s.received
                            .iter()
                            .any(|g| g.partition == p && g.offset == end - 1)
                })
            });
            done.then_some(())
        },
        || second.describe(),
    );
    let after = second.stop();
    assert_no_errors("after-restart", &after);
    for p in 0..PARTITIONS {
        let commit = acked_commits.get(&p).copied().unwrap_or(0);
        let old: Vec<i64> = before
            .received
            .iter()
            .filter(|g| g.partition == p)
            .map(|g| g.offset)
            .collect();
        let new: Vec<i64> = after
            .received
            .iter()
            .filter(|g| g.partition == p)
            .map(|g| g.offset)
            .collect();
        let old_end = old.last().map_or(0, |o| o + 1);
        assert_eq!(
            old,
            (0..old_end).collect::<Vec<_>>(),
            "partition {p}: what the first member read"
        );
        assert!(
            commit <= old_end,
            "partition {p}: commit {commit} beyond what was read"
        );
        assert_eq!(
            new,
            (commit..PER_PARTITION as i64).collect::<Vec<_>>(),
            "partition {p}: the new member must resume exactly at the committed offset {commit}"
        );
    }
    let final_commits = committed_offsets(&bootstrap, group, topic, PARTITIONS);
    assert!(
        final_commits
            .values()
            .all(|o| *o == Some(PER_PARTITION as i64)),
        "final commits {final_commits:?}"
    );
    eprintln!("broker_sigkill: {:.1?} in all", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 7. Group administration: ListGroups / DescribeGroups / DeleteGroups on empty and live groups
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_groups_are_listed_and_deleted_with_their_offsets() {
    const PARTITIONS: i32 = 2;
    let started = Instant::now();
    let broker = start_broker(&[]);
    let bootstrap = broker.bootstrap();
    let topic = "groups-admin";
    block_on(create_topic(&bootstrap, topic, PARTITIONS, &[]));
    produce_per_partition(&bootstrap, topic, PARTITIONS, 0, 10);
    let steady = Plan::Steady { commit_every: 5 };
    let leaving = Member::start(&bootstrap, topic, "g-empty", "leaver", &[], steady);
    let live = Member::start(&bootstrap, topic, "g-live", "stayer", &[], steady);
    for member in [&leaving, &live] {
        wait_until_or_report(
            &format!("{} reads and commits both partitions", member.name),
            || {
                member
                    .with(|s| (0..PARTITIONS).all(|p| s.committed.get(&p) == Some(&10)))
                    .then_some(())
            },
            || member.describe(),
        );
    }
    let left = leaving.stop();
    assert_no_errors("leaver", &left);

    let client: BaseConsumer<TestContext> = base_config(&bootstrap)
        .create_with_context(TestContext)
        .expect("create a client for ListGroups");
    let groups = |client: &BaseConsumer<TestContext>| -> BTreeMap<String, (String, usize)> {
        client
            .fetch_group_list(None, Duration::from_secs(10))
            .expect("ListGroups + DescribeGroups")
            .groups()
            .iter()
            .map(|g| {
                (
                    g.name().to_string(),
                    (g.state().to_string(), g.members().len()),
                )
            })
            .collect()
    };
    let listed = groups(&client);
    assert_eq!(
        listed.get("g-empty"),
        Some(&("Empty".to_string(), 0)),
        "the group whose only member left: {listed:?}"
    );
    assert_eq!(
        listed.get("g-live"),
        Some(&("Stable".to_string(), 1)),
        "the group with a member: {listed:?}"
    );

    let admin = admin(&bootstrap);
    let options = AdminOptions::new();
    let results = block_on(admin.delete_groups(&["g-empty", "g-live", "g-missing"], &options))
        .expect("DeleteGroups");
    let results: BTreeMap<String, Result<(), RDKafkaErrorCode>> = results
        .into_iter()
        .map(|r| match r {
            Ok(name) => (name, Ok(())),
            Err((name, code)) => (name, Err(code)),
        })
        .collect();
    let want = BTreeMap::from([
        ("g-empty".to_string(), Ok(())),
        ("g-live".to_string(), Err(RDKafkaErrorCode::NonEmptyGroup)),
        (
            "g-missing".to_string(),
            Err(RDKafkaErrorCode::GroupIdNotFound),
        ),
    ]);
    assert_eq!(results, want, "DeleteGroups answers");

    let listed = groups(&client);
    assert!(
        !listed.contains_key("g-empty") && listed.contains_key("g-live"),
        "ListGroups after deleting g-empty: {listed:?}"
    );
    let none: BTreeMap<i32, Option<i64>> = (0..PARTITIONS).map(|p| (p, None)).collect();
    assert_eq!(
        committed_offsets(&bootstrap, "g-empty", topic, PARTITIONS),
        none,
        "a deleted group's committed offsets"
    );
    let ten: BTreeMap<i32, Option<i64>> = (0..PARTITIONS).map(|p| (p, Some(10))).collect();
    assert_eq!(
        committed_offsets(&bootstrap, "g-live", topic, PARTITIONS),
        ten,
        "the live group's committed offsets are untouched"
    );
    assert_no_errors("stayer", &live.stop());
    eprintln!("group admin: {:.1?} in all", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 6. Python confluent-kafka: one group shares, another gets everything
// ---------------------------------------------------------------------------------------------

#[test]
fn python_confluent_kafka_groups_share_and_broadcast() {
    let started = Instant::now();
    let broker = start_broker(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/groups.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg("groups-python");
    let finished = run_with_deadline(command, b"", Duration::from_secs(90));
    finished.assert_success("tests/python/groups.py");
    eprintln!(
        "{}python groups: {:.1?}",
        finished.stdout,
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 7. KIP-848 consumer groups (group.protocol=consumer) with Python's confluent-kafka
// ---------------------------------------------------------------------------------------------

/// Runs one scenario of tests/python/consumer_protocol.py against a fresh broker whose
/// KIP-848 session timeout is short, so a killed member's partitions move within seconds.
fn python_consumer_protocol(scenario: &str) {
    let started = Instant::now();
    let broker = start_broker(&[
        "--group-consumer-session-timeout",
        "3s",
        "--group-consumer-heartbeat-interval",
        "200ms",
    ]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/consumer_protocol.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg(format!("kip848-{scenario}"))
        .arg("--scenario")
        .arg(scenario);
    let finished = run_with_deadline(command, b"", Duration::from_secs(120));
    finished.assert_success("tests/python/consumer_protocol.py");
    eprintln!(
        "{}python consumer protocol {scenario}: {:.1?}",
        finished.stdout,
        started.elapsed()
    );
}

#[test]
fn kip848_two_members_share_partitions_with_exact_committed_offsets() {
    python_consumer_protocol("share");
}

#[test]
fn kip848_a_live_group_migrates_from_classic_to_consumer_members_and_back_exactly_once() {
    python_consumer_protocol("migrate");
}

#[test]
fn kip848_a_live_group_of_cooperative_classic_members_migrates_and_back_exactly_once() {
    python_consumer_protocol("migrate-cooperative");
}

#[test]
fn kip848_five_members_share_partitions_with_exact_committed_offsets() {
    python_consumer_protocol("five");
}

#[test]
fn kip848_a_member_added_while_consuming_gets_partitions_without_duplicates() {
    python_consumer_protocol("added");
}

#[test]
fn kip848_a_killed_members_partitions_go_to_the_others_after_the_session_timeout() {
    python_consumer_protocol("killed");
}

#[test]
fn kip848_a_regex_subscription_gets_the_matching_topics_and_one_created_later() {
    python_consumer_protocol("regex");
}

/// Kafka's shard of a group id (`abs(String.hashCode) % shards`), to find which
/// `__consumer_offsets` partition coordinates it.
fn offsets_shard_of(group: &str, shards: i32) -> i32 {
    let mut hash: i32 = 0;
    for unit in group.encode_utf16() {
        hash = hash.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    (hash & 0x7fff_ffff) % shards
}

/// KIP-848 members on a 3-broker cluster live through a move of their group's coordinator
/// shard and of a data partition, half-way through: the new coordinator replays the group
/// (members, epochs, assignments) and its offsets from storage, so the members keep their
/// partitions, and every record is received exactly once with exact committed offsets.
#[test]
fn kip848_members_keep_exact_offsets_while_the_coordinator_shard_and_a_partition_move() {
    let started = Instant::now();
    let cluster = Cluster::start_with_env(
        3,
        "3s",
        "500ms",
        &[
            ("STRATA_GROUP_CONSUMER_SESSION_TIMEOUT", "15s"),
            ("STRATA_GROUP_CONSUMER_HEARTBEAT_INTERVAL", "200ms"),
        ],
    );
    let ids = cluster.all_ids();
    let topic = "kip848-moved";
    let shard = offsets_shard_of(&format!("{topic}-group"), GROUP_SHARDS);
    let coordinators = cluster.wait_for_leaders(
        ids[0],
        "__consumer_offsets",
        GROUP_SHARDS,
        &ids,
        "every coordinator shard has an owner",
    );
    let coordinator = coordinators[&shard];
    let shard_target = *ids
        .iter()
        .find(|&&id| id != coordinator)
        .unwrap_or(&coordinator);
    let bootstrap = cluster.bootstrap_of(&ids);
    block_on(create_topic(&bootstrap, topic, 6, &[]));
    let data_owner = cluster.wait_for_leaders(ids[0], topic, 6, &ids, "the topic has owners")[&0];
    let data_target = *ids
        .iter()
        .find(|&&id| id != data_owner)
        .unwrap_or(&data_owner);
    let strata = strata_binary();
    let strata = strata.to_string_lossy();
    let move_command = |topic: &str, partition: i32, target: i32| {
        serde_json::json!([
            strata,
            "partitions",
            "move",
            topic,
            partition.to_string(),
            "--to",
            target.to_string(),
            "--timeout",
            "20s",
            "--storage",
            cluster.storage.url(),
        ])
        .to_string()
    };
    eprintln!(
        "group shard {shard} on broker {coordinator} moves to {shard_target}; {topic}/0 on broker {data_owner} moves to {data_target}"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/consumer_protocol.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(&bootstrap)
        .arg("--topic")
        .arg(topic)
        .arg("--scenario")
        .arg("moved")
        .arg("--between")
        .arg(move_command("__consumer_offsets", shard, shard_target))
        .arg("--between")
        .arg(move_command(topic, 0, data_target));
    let finished = run_with_deadline(command, b"", Duration::from_secs(180));
    finished.assert_success("tests/python/consumer_protocol.py");
    let after = cluster.metadata_from(ids[0], Some("__consumer_offsets"));
    assert_eq!(
        after.leaders.get(&shard),
        Some(&shard_target),
        "the coordinator shard moved"
    );
    let moved = cluster.metadata_from(ids[0], Some(topic));
    assert_eq!(
        moved.leaders.get(&0),
        Some(&data_target),
        "the data partition moved"
    );
    eprintln!(
        "{}python consumer protocol moved: {:.1?}",
        finished.stdout,
        started.elapsed()
    );
}

/// One consumer group as ConsumerGroupDescribe reports it: (group epoch, assignment epoch,
/// instance id → (member epoch, partitions)).
type ConsumerGroupView = (i32, i32, BTreeMap<String, (i32, Vec<i32>)>);

/// Waits until the group's coordinator answers (a restarted broker replays its shards first).
fn describe_consumer_group(broker: &StrataProcess, group: &str) -> ConsumerGroupView {
    wait_until("ConsumerGroupDescribe answers", DEADLINE, || {
        try_describe_consumer_group(broker, group)
    })
}

fn try_describe_consumer_group(broker: &StrataProcess, group: &str) -> Option<ConsumerGroupView> {
    use kafka_protocol::messages::ConsumerGroupDescribeRequest;
    let mut raw = RawConnection::connect(broker.addr());
    let mut request = ConsumerGroupDescribeRequest::default();
    request.group_ids = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let response = raw.request(1, &request);
    let described = &response.groups[0];
    if described.error_code != 0 {
        eprintln!(
            "ConsumerGroupDescribe {group}: error {}",
            described.error_code
        );
        return None;
    }
    let members = described
        .members
        .iter()
        .map(|m| {
            let mut partitions: Vec<i32> = m
                .assignment
                .topic_partitions
                .iter()
                .flat_map(|t| t.partitions.iter().copied())
                .collect();
            partitions.sort();
            let instance = m.instance_id.as_ref().map(|s| s.to_string());
            (instance.unwrap_or_default(), (m.member_epoch, partitions))
        })
        .collect();
    Some((described.group_epoch, described.assignment_epoch, members))
}

#[test]
fn kip848_static_members_resume_with_the_same_epochs_and_partitions_after_a_broker_kill() {
    let started = Instant::now();
    // A session long enough for the members to come back after the restart.
    let mut broker = start_broker(&[
        "--group-consumer-session-timeout",
        "30s",
        "--group-consumer-heartbeat-interval",
        "200ms",
    ]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/consumer_protocol.py");
    let phase = |broker: &StrataProcess, scenario: &str| {
        let mut command = Command::new("python3");
        command
            .arg(&script)
            .arg("--bootstrap")
            .arg(broker.bootstrap())
            .arg("--topic")
            .arg("kip848-restart")
            .arg("--scenario")
            .arg(scenario);
        let finished = run_with_deadline(command, b"", Duration::from_secs(120));
        finished.assert_success("tests/python/consumer_protocol.py");
        eprint!("{}", finished.stdout);
    };
    let group = "kip848-restart-group";
    phase(&broker, "restart-a");
    // Both members left as static members: still in the group, epoch -2, partitions kept.
    let before = describe_consumer_group(&broker, group);
    assert_eq!(before.2.len(), 2, "{before:?}");
    assert!(
        before
            .2
            .values()
            .all(|(epoch, p)| *epoch == -2 && !p.is_empty()),
        "{before:?}"
    );
    broker.kill9();
    broker.restart();
    // The replayed group is the same group: epochs, members and assignments.
    assert_eq!(describe_consumer_group(&broker, group), before);
    phase(&broker, "restart-b");
    // The instances came back to their own partitions without a new group epoch (a join as
    // new members would have bumped it), and left as static members again when phase b closed.
    let after = describe_consumer_group(&broker, group);
    assert_eq!(after, before);
    eprintln!("kip848 restart: {:.1?}", started.elapsed());
}
