//! The group coordinator runtime: carries out what the sans-IO [`strata_groups::GroupsState`]
//! decides. Groups are sharded over the partitions of the internal topic
//! `__consumer_offsets` (Kafka's own layout: shard = hash(group id) mod partition count); each
//! shard is one task owning one `GroupsState` and persisting its records, as one record batch
//! per decision, into its partition through the log. A shard is therefore exactly as movable
//! as any partition, and a coordinator that starts rebuilds its groups by replaying the shard's
//! partition.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::{Clock, TopicPartition};
use strata_groups::kafka_records;
use strata_groups::{
    ConsumerGroupDescription, ConsumerHeartbeatRequest, DeleteGroupsResponse, GroupConfig,
    GroupDescription, GroupError, GroupState, GroupsState, HeartbeatRequest, JoinRequest,
    LeaveRequest, ListedGroup, OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest,
    OffsetFetchResponse, Output, PersistFailure, PersistId, PersistOutcome, PersistRecord,
    RequestToken, Response, SeededMemberIds, SyncRequest, TopicCatalog, TopicId,
    TxnOffsetCommitRequest,
};
use strata_log::{Acks, LogError, LogManager};
use strata_wire::builder::{build_batch, SimpleRecord};
use tokio::sync::{mpsc, oneshot};

/// The internal topic holding committed offsets and group metadata.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// `max.message.bytes` of the offsets topic: Kafka's default request size limit (100 MiB).
const OFFSETS_MAX_BATCH_BYTES: i32 = 100 << 20;

/// Commands a shard task executes in arrival order.
enum Command {
    Respond(Request, oneshot::Sender<Response>),
    Fetch(OffsetFetchRequest, oneshot::Sender<OffsetFetchResponse>),
    Describe(String, oneshot::Sender<GroupDescription>),
    List(Vec<GroupState>, oneshot::Sender<Vec<ListedGroup>>),
    ConsumerDescribe(String, oneshot::Sender<ConsumerGroupDescription>),
    /// The groups of the shard holding offsets of a producer's open transaction.
    TxnGroups(i64, oneshot::Sender<Vec<String>>),
}

/// Requests whose answer may be held back by the state machine.
enum Request {
    Join(JoinRequest),
    Sync(SyncRequest),
    Heartbeat(HeartbeatRequest),
    Leave(LeaveRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetDelete(OffsetDeleteRequest),
    DeleteGroups(Vec<String>),
    // Boxed: the largest request by far, and the channel holds one slot per command.
    ConsumerHeartbeat(Box<ConsumerHeartbeatRequest>),
    TxnOffsetCommit(TxnOffsetCommitRequest),
    TxnEnd {
        group_id: String,
        producer_id: i64,
        commit: bool,
    },
}

/// The log's topic catalog as KIP-848 groups see it: an in-memory lookup, no IO.
pub(crate) struct LogCatalog<'a>(pub(crate) &'a LogManager);

impl TopicCatalog for LogCatalog<'_> {
    fn lookup(&self, name: &str) -> Option<(TopicId, i32)> {
        self.0.topic(name).map(|t| (TopicId(t.id.0), t.partitions))
    }

    fn names(&self) -> Vec<String> {
        self.0
            .topics()
            .into_iter()
            .filter(|t| !crate::handlers::is_internal_topic(&t.name))
            .map(|t| t.name.to_string())
            .collect()
    }

    fn version(&self) -> u64 {
        self.0.catalog_version()
    }
}

/// Counters for `strata_group_shard_loads_total` and `strata_group_shard_records_replayed_total`:
/// how much a shard load reads is what compaction bounds.
#[derive(Debug, Default)]
pub struct GroupLoadStats {
    pub loads: AtomicU64,
    pub replayed_records: AtomicU64,
}

/// A reading of [`GroupLoadStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupLoadSnapshot {
    pub loads: u64,
    pub replayed_records: u64,
}

impl GroupLoadStats {
    pub fn snapshot(&self) -> GroupLoadSnapshot {
        GroupLoadSnapshot {
            loads: self.loads.load(Ordering::Relaxed),
            replayed_records: self.replayed_records.load(Ordering::Relaxed),
        }
    }
}

/// One coordinator shard this broker hosts, or is about to.
#[derive(Debug)]
enum Slot {
    /// Claimed: its partition is being acquired or replayed. Requests are answered
    /// COORDINATOR_LOAD_IN_PROGRESS, which clients retry against this broker, as Kafka's
    /// coordinator answers while it loads a partition it leads. NOT_COORDINATOR here would
    /// send them back to FindCoordinator, which names this broker again, and some requests
    /// fail on it outright (librdkafka's `committed()`: docs/RELIABILITY.md, the transactions
    /// pipeline).
    Loading,
    Ready(mpsc::Sender<Command>),
}

/// Handle to the coordinator shards this broker hosts. Shards come and go with ownership of
/// their `__consumer_offsets` partitions: `expect_shard` when the partition is claimed,
/// `load_shard` once it is acquired (replay), `unload_shard` when it is handed over or its
/// start failed. A request for a group whose shard is not hosted here is answered
/// NOT_COORDINATOR, and the client asks FindCoordinator again.
#[derive(Debug)]
pub struct GroupCoordinator {
    log: Arc<LogManager>,
    clock: Arc<dyn Clock>,
    config: GroupConfig,
    seed: u64,
    shard_count: usize,
    shards: std::sync::RwLock<HashMap<usize, Slot>>,
    pub stats: GroupLoadStats,
    /// Shards loaded since start-up, whose logs hold no records of older builds any more.
    binary_shards: std::sync::Mutex<BTreeSet<i32>>,
}

/// The `__consumer_offsets` shard of a group (Kafka's hash; see strata_core).
pub use strata_core::coordinator_shard as shard_of;

impl GroupCoordinator {
    /// Ensures the offsets topic exists, replays every shard and starts the shard tasks.
    pub async fn start(
        log: Arc<LogManager>,
        clock: Arc<dyn Clock>,
        config: GroupConfig,
        shard_count: i32,
        seed: u64,
        load_all: bool,
    ) -> Result<Arc<Self>, LogError> {
        let topic = match log.topic(OFFSETS_TOPIC) {
            Some(t) => t,
            None => {
                // Offsets must outlive any retention: as in Kafka, only the key cleaner
                // removes them, once a newer record (or a tombstone) for the same key exists
                // (see docs/ARCHITECTURE.md, groups). One commit is one batch, and a consumer
                // of many partitions commits them all at once: a batch over the 1 MB default
                // would fail the commit as COORDINATOR_NOT_AVAILABLE and the client would
                // retry it forever, so the limit is raised to what a request itself may carry.
                let overrides = [
                    ("cleanup.policy".to_string(), "compact".to_string()),
                    ("retention.ms".to_string(), "-1".to_string()),
                    (
                        "max.message.bytes".to_string(),
                        OFFSETS_MAX_BATCH_BYTES.to_string(),
                    ),
                ]
                .into();
                match log
                    .create_topic(OFFSETS_TOPIC, Some(shard_count), overrides, false)
                    .await
                {
                    Ok(t) => t,
                    Err(LogError::TopicAlreadyExists(_)) => {
                        // Another broker of the cluster created it since our catalog was read.
                        log.refresh_catalog().await?;
                        log.topic(OFFSETS_TOPIC)
                            .ok_or(LogError::UnknownTopicOrPartition)?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let coordinator = Arc::new(Self {
            log: log.clone(),
            clock,
            config,
            seed,
            shard_count: topic.partitions.max(1) as usize,
            shards: std::sync::RwLock::new(HashMap::new()),
            binary_shards: std::sync::Mutex::new(BTreeSet::new()),
            stats: GroupLoadStats::default(),
        });
        if load_all {
            for p in 0..topic.partitions {
                coordinator.load_shard(p).await?;
            }
        }
        Ok(coordinator)
    }

    /// Makes an offsets topic created by an older build compacted, once that is safe: records
    /// of older builds are JSON keyed by group id alone, so the key cleaner would keep one
    /// record per group of them and lose offsets. Every shard this broker loads is first
    /// rewritten in Kafka's schema ([`migrate_legacy_shard`]); when this broker has loaded
    /// every shard (always for a broker alone on its storage), none can hold JSON any more.
    /// In a cluster whose shards are spread over brokers the topic stays uncompacted until one
    /// broker has loaded them all (see docs/ARCHITECTURE.md, groups).
    async fn compact_topic_when_safe(&self, p: i32) {
        let all_binary = {
            let mut binary = match self.binary_shards.lock() {
                Ok(g) => g,
                Err(e) => e.into_inner(),
            };
            binary.insert(p);
            binary.len() >= self.shard_count
        };
        if !all_binary {
            return;
        }
        let Some(topic) = self.log.topic(OFFSETS_TOPIC) else {
            return;
        };
        if topic.config.cleanup_policy.compact {
            return;
        }
        let change = vec![("cleanup.policy".to_string(), Some("compact".to_string()))];
        match self
            .log
            .alter_topic_configs(OFFSETS_TOPIC, change, false)
            .await
        {
            Ok(()) => tracing::info!("{OFFSETS_TOPIC} is now compacted by key"),
            Err(e) => tracing::warn!(error = %e,
                "could not make {OFFSETS_TOPIC} compacted; trying again at the next shard load"),
        }
    }

    /// Starts hosting shard `p`: replays its partition and starts its task. Loading a shard
    /// already hosted does nothing.
    pub async fn load_shard(&self, p: i32) -> Result<(), LogError> {
        if p < 0 || matches!(self.read_shards().get(&(p as usize)), Some(Slot::Ready(_))) {
            return Ok(());
        }
        self.expect_shard(p);
        let tp = TopicPartition::new(OFFSETS_TOPIC, p);
        let replayed = match replay(&self.log, &tp).await {
            Ok(r) => r,
            Err(e) => {
                self.unload_shard(p);
                return Err(e);
            }
        };
        let read = replayed.read;
        // Nothing else writes this partition until the shard task starts below, which is
        // what makes rewriting its head safe here.
        let (records, binary_only) = migrate_legacy_shard(
            &self.log,
            &tp,
            replayed,
            self.clock.wall_millis(),
            self.config.offsets_commit_timeout,
        )
        .await;
        let loaded = records.len();
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        self.stats
            .replayed_records
            .fetch_add(read as u64, Ordering::Relaxed);
        let state = GroupsState::replay(
            self.config.clone(),
            Box::new(SeededMemberIds::new(self.seed.wrapping_add(p as u64))),
            self.clock.monotonic(),
            records,
        );
        tracing::info!(
            shard = p,
            read,
            records = loaded,
            "group coordinator shard loaded"
        );
        if binary_only {
            self.compact_topic_when_safe(p).await;
        }
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(run_shard(
            state,
            rx,
            self.log.clone(),
            tp,
            self.clock.clone(),
        ));
        // Unloaded while it replayed (handed over, or its start given up): the task ends with
        // its channel, and the shard stays with whoever owns it now.
        if let Some(slot @ Slot::Loading) = self.write_shards().get_mut(&(p as usize)) {
            *slot = Slot::Ready(tx);
        }
        Ok(())
    }

    /// Shard `p`'s partition is being claimed here: until [`Self::load_shard`] finishes (or
    /// [`Self::unload_shard`] gives it up) its groups' requests are answered
    /// COORDINATOR_LOAD_IN_PROGRESS. A shard already hosted is left as it is.
    pub fn expect_shard(&self, p: i32) {
        if p >= 0 {
            self.write_shards()
                .entry(p as usize)
                .or_insert(Slot::Loading);
        }
    }

    /// Stops hosting shard `p` (or expecting it): its task answers what it holds with
    /// NOT_COORDINATOR and ends.
    pub fn unload_shard(&self, p: i32) {
        if let Some(slot) = self.write_shards().remove(&(p as usize)) {
            if matches!(slot, Slot::Ready(_)) {
                tracing::info!(shard = p, "group coordinator shard unloaded");
            }
        }
    }

    /// Whether this broker hosts the shard of `group_id`, loaded.
    pub fn hosts(&self, group_id: &str) -> bool {
        self.hosting(group_id).is_ok()
    }

    /// Ok when this broker hosts the shard of `group_id` and has loaded it; otherwise the
    /// refusal to answer: COORDINATOR_LOAD_IN_PROGRESS while it loads, NOT_COORDINATOR when
    /// it is not ours.
    pub fn hosting(&self, group_id: &str) -> Result<(), GroupError> {
        self.shard_hosting(shard_of(group_id, self.shard_count))
    }

    /// [`Self::hosting`] for shard `p`.
    pub fn shard_hosting(&self, p: usize) -> Result<(), GroupError> {
        self.sender(p).map(|_| ())
    }

    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    fn read_shards(&self) -> std::sync::RwLockReadGuard<'_, HashMap<usize, Slot>> {
        match self.shards.read() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        }
    }

    fn write_shards(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<usize, Slot>> {
        match self.shards.write() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        }
    }

    /// The task of shard `p`, or why there is none to ask.
    fn sender(&self, p: usize) -> Result<mpsc::Sender<Command>, GroupError> {
        match self.read_shards().get(&p) {
            Some(Slot::Ready(tx)) => Ok(tx.clone()),
            Some(Slot::Loading) => Err(GroupError::CoordinatorLoadInProgress),
            None => Err(GroupError::NotCoordinator),
        }
    }

    fn shard(&self, group_id: &str) -> Result<mpsc::Sender<Command>, GroupError> {
        self.sender(shard_of(group_id, self.shard_count))
    }

    async fn ask(&self, group_id: &str, request: Request) -> Result<Response, GroupError> {
        let (tx, rx) = oneshot::channel();
        self.shard(group_id)?
            .send(Command::Respond(request, tx))
            .await
            .map_err(|_| GroupError::CoordinatorNotAvailable)?;
        rx.await.map_err(|_| GroupError::CoordinatorNotAvailable)
    }

    pub async fn join(&self, req: JoinRequest) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::Join(req)).await
    }

    pub async fn sync(&self, req: SyncRequest) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::Sync(req)).await
    }

    pub async fn heartbeat(&self, req: HeartbeatRequest) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::Heartbeat(req)).await
    }

    pub async fn leave(&self, req: LeaveRequest) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::Leave(req)).await
    }

    pub async fn consumer_heartbeat(
        &self,
        req: ConsumerHeartbeatRequest,
    ) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::ConsumerHeartbeat(Box::new(req)))
            .await
    }

    pub async fn consumer_describe(
        &self,
        group_id: String,
    ) -> Result<ConsumerGroupDescription, GroupError> {
        let (tx, rx) = oneshot::channel();
        self.shard(&group_id)?
            .send(Command::ConsumerDescribe(group_id, tx))
            .await
            .map_err(|_| GroupError::CoordinatorNotAvailable)?;
        rx.await.map_err(|_| GroupError::CoordinatorNotAvailable)
    }

    pub async fn offset_commit(&self, req: OffsetCommitRequest) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::OffsetCommit(req)).await
    }

    /// TxnOffsetCommit: the offsets stay pending until the transaction's marker reaches the
    /// group's shard ([`Self::complete_txn_offsets`]).
    pub async fn txn_offset_commit(
        &self,
        req: TxnOffsetCommitRequest,
    ) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::TxnOffsetCommit(req)).await
    }

    /// A transaction marker of `producer_id` is durable in shard `p`'s partition: the
    /// producer's pending offsets in that shard become visible (commit) or are dropped, and
    /// this returns once that is durable too, so a WriteTxnMarkers answered OK leaves nothing
    /// pending. An error leaves them pending; the coordinator retries the marker.
    pub async fn complete_txn_offsets(
        &self,
        p: i32,
        producer_id: i64,
        commit: bool,
    ) -> Result<(), GroupError> {
        let sender = self.sender(p.max(0) as usize)?;
        let (tx, rx) = oneshot::channel();
        sender
            .send(Command::TxnGroups(producer_id, tx))
            .await
            .map_err(|_| GroupError::CoordinatorNotAvailable)?;
        let groups = rx.await.map_err(|_| GroupError::CoordinatorNotAvailable)?;
        for group_id in groups {
            let answer = self
                .ask(
                    &group_id.clone(),
                    Request::TxnEnd {
                        group_id,
                        producer_id,
                        commit,
                    },
                )
                .await?;
            match answer {
                Response::TxnEnd(None) => {}
                Response::TxnEnd(Some(e)) => return Err(e),
                _ => return Err(GroupError::CoordinatorNotAvailable),
            }
        }
        Ok(())
    }

    pub async fn offset_delete(&self, req: OffsetDeleteRequest) -> Result<Response, GroupError> {
        let group = req.group_id.clone();
        self.ask(&group, Request::OffsetDelete(req)).await
    }

    pub async fn offset_fetch(
        &self,
        req: OffsetFetchRequest,
    ) -> Result<OffsetFetchResponse, GroupError> {
        let (tx, rx) = oneshot::channel();
        self.shard(&req.group_id)?
            .send(Command::Fetch(req, tx))
            .await
            .map_err(|_| GroupError::CoordinatorNotAvailable)?;
        rx.await.map_err(|_| GroupError::CoordinatorNotAvailable)
    }

    pub async fn describe(&self, group_id: String) -> Result<GroupDescription, GroupError> {
        let (tx, rx) = oneshot::channel();
        self.shard(&group_id)?
            .send(Command::Describe(group_id, tx))
            .await
            .map_err(|_| GroupError::CoordinatorNotAvailable)?;
        rx.await.map_err(|_| GroupError::CoordinatorNotAvailable)
    }

    /// Groups of every shard hosted here, filtered by state (empty = all). In a cluster,
    /// ListGroups is asked of every broker (as with Kafka), each answering for its own shards.
    pub async fn list(&self, states: Vec<GroupState>) -> Result<Vec<ListedGroup>, GroupError> {
        let mut all = Vec::new();
        // A shard still loading has no groups to list yet, as far as clients can tell.
        let shards: Vec<mpsc::Sender<Command>> = self
            .read_shards()
            .values()
            .filter_map(|slot| match slot {
                Slot::Ready(tx) => Some(tx.clone()),
                Slot::Loading => None,
            })
            .collect();
        for shard in &shards {
            let (tx, rx) = oneshot::channel();
            shard
                .send(Command::List(states.clone(), tx))
                .await
                .map_err(|_| GroupError::CoordinatorNotAvailable)?;
            all.extend(rx.await.map_err(|_| GroupError::CoordinatorNotAvailable)?);
        }
        all.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        Ok(all)
    }

    /// Deletes groups, each on its own shard; the answer lists every group in request order.
    pub async fn delete_groups(&self, group_ids: Vec<String>) -> DeleteGroupsResponse {
        let mut by_shard: HashMap<usize, Vec<String>> = HashMap::new();
        for g in &group_ids {
            by_shard
                .entry(shard_of(g, self.shard_count))
                .or_default()
                .push(g.clone());
        }
        let mut results: HashMap<String, Option<GroupError>> = HashMap::new();
        for (shard, ids) in by_shard {
            let (tx, rx) = oneshot::channel();
            let sender = match self.sender(shard) {
                Ok(sender) => sender,
                Err(refusal) => {
                    for id in ids {
                        results.insert(id, Some(refusal));
                    }
                    continue;
                }
            };
            let sent = sender
                .send(Command::Respond(Request::DeleteGroups(ids.clone()), tx))
                .await;
            let answer = match sent {
                Ok(()) => rx.await.ok(),
                Err(_) => None,
            };
            match answer {
                Some(Response::DeleteGroups(r)) => results.extend(r.groups),
                _ => {
                    for id in ids {
                        results.insert(id, Some(GroupError::CoordinatorNotAvailable));
                    }
                }
            }
        }
        DeleteGroupsResponse {
            groups: group_ids
                .into_iter()
                .map(|g| {
                    let e = results.get(&g).cloned().flatten();
                    (g, e)
                })
                .collect(),
        }
    }
}

/// Records per batch when rewriting a shard of an older build.
const MIGRATE_BATCH_RECORDS: usize = 500;

/// What a shard's log replays to.
struct Replayed {
    /// In the order [`GroupsState::replay`] applies them.
    records: Vec<PersistRecord>,
    /// Records of older builds (JSON) among them.
    legacy: usize,
    /// Kafka records read (tombstones included), plus the JSON ones: what a load costs.
    read: usize,
}

/// Older builds wrote JSON records keyed by group id; the key cleaner would keep one of them
/// per group and lose the rest, so a shard holding any is rewritten once when it loads: its
/// live facts (the newest record per [`strata_groups::PersistKey`], tombstones dropped since
/// nothing older will remain) appended in Kafka's schema in replay order, then the log start
/// moved past everything older. From then on the key cleaner bounds the shard, which is why
/// the rewrite of every load (the old compact-on-load) is gone: it copied all live records at
/// every load, rewriting what the cleaner now keeps in place. Any failure leaves the log as it
/// was (the old records are deleted only after the rewrite is durable; a rewrite that stopped
/// half-way only repeats facts replay already has); the shard then loads from the old records
/// and reports `false`, so the topic is not made compacted on its account.
async fn migrate_legacy_shard(
    log: &LogManager,
    tp: &TopicPartition,
    replayed: Replayed,
    now_ms: i64,
    timeout: Duration,
) -> (Vec<PersistRecord>, bool) {
    let Replayed {
        records, legacy, ..
    } = replayed;
    if legacy == 0 {
        return (records, true);
    }
    let mut newest: HashMap<strata_groups::PersistKey, usize> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        newest.insert(r.key(), i);
    }
    let mut live: Vec<usize> = newest
        .into_values()
        .filter(|&i| !records[i].is_tombstone())
        .collect();
    live.sort_unstable();
    let live: Vec<PersistRecord> = live.into_iter().map(|i| records[i].clone()).collect();
    let start = match log.watermarks(tp) {
        Ok(w) => w.high,
        Err(_) => return (records, false),
    };
    for chunk in live.chunks(MIGRATE_BATCH_RECORDS) {
        if let PersistOutcome::Failed(_) = persist(log, tp, chunk, now_ms, timeout).await {
            tracing::warn!(partition = %tp,
                "rewriting a group shard of an older build failed; keeping its old records");
            return (records, false);
        }
    }
    match log.delete_records(tp, Some(start)).await {
        Ok(_) => {
            tracing::info!(partition = %tp, before = records.len(), legacy, after = live.len(),
                "group shard of an older build rewritten in Kafka's schema");
            (live, true)
        }
        Err(e) => {
            tracing::warn!(partition = %tp, error = %e,
                "group shard rewritten in Kafka's schema, but its old records could not be dropped");
            (live, false)
        }
    }
}

/// Reads a shard's partition from its start: Kafka records and, from older builds, JSON
/// records. A record that does not decode is skipped with an error log: losing one stale fact
/// is better than a coordinator that can never start.
async fn replay(log: &LogManager, tp: &TopicPartition) -> Result<Replayed, LogError> {
    let mut replay = strata_groups::kafka_records::Replay::new();
    let mut read = 0usize;
    // Transaction markers are skipped: making transactional offset commits visible on commit
    // and dropping them on abort happens when the marker is written
    // (`handlers::txn_markers::offsets_marker_written`), and replay finds its result as records.
    crate::shard_log::replay_records(log, tp, "group", |offset, record| {
        read += 1;
        let value = record.value.as_deref();
        if strata_groups::kafka_records::Replay::is_legacy_value(value) {
            match serde_json::from_slice::<PersistRecord>(value.unwrap_or_default()) {
                Ok(r) => replay.push_legacy(r),
                Err(e) => {
                    tracing::error!(partition = %tp, offset, error = %e, "undecodable group record skipped")
                }
            }
            return;
        }
        let key = record.key.as_deref().unwrap_or_default();
        if let Err(e) = replay.push(key, value) {
            tracing::error!(partition = %tp, offset, error = %e, "undecodable group record skipped")
        }
    })
    .await?;
    let legacy = replay.legacy_count();
    Ok(Replayed {
        records: replay.finish(),
        legacy,
        read,
    })
}

async fn run_shard(
    mut state: GroupsState,
    mut commands: mpsc::Receiver<Command>,
    log: Arc<LogManager>,
    tp: TopicPartition,
    clock: Arc<dyn Clock>,
) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (writes, pending_writes) = mpsc::unbounded_channel();
    tokio::spawn(write_in_order(
        log.clone(),
        tp.clone(),
        pending_writes,
        done_tx.clone(),
    ));
    let mut waiting: HashMap<RequestToken, oneshot::Sender<Response>> = HashMap::new();
    let mut next_token = 0u64;
    loop {
        let sleep_for = state
            .next_deadline()
            .map(|d| d.saturating_sub(clock.monotonic()));
        let outputs = tokio::select! {
            cmd = commands.recv() => {
                let Some(cmd) = cmd else {
                    // Unloaded: parked requests learn to look for the new coordinator.
                    let ids: Vec<String> = state.list_groups(&[]).into_iter().map(|g| g.group_id).collect();
                    for output in state.unload(&ids) {
                        if let Output::Respond { token, response } = output {
                            if let Some(reply) = waiting.remove(&token) {
                                let _ = reply.send(response);
                            }
                        }
                    }
                    break;
                };
                let now = clock.monotonic();
                match cmd {
                    Command::Respond(request, reply) => {
                        next_token += 1;
                        let token = RequestToken(next_token);
                        waiting.insert(token, reply);
                        match request {
                            Request::Join(r) => state.handle_join(now, token, r, &LogCatalog(&log)),
                            Request::Sync(r) => state.handle_sync(now, token, r),
                            Request::Heartbeat(r) => state.handle_heartbeat(now, token, r),
                            Request::Leave(r) => state.handle_leave(now, token, r),
                            Request::OffsetCommit(r) => state.handle_offset_commit(now, token, r),
                            Request::OffsetDelete(r) => state.handle_offset_delete(now, token, r),
                            Request::DeleteGroups(ids) => state.handle_delete_groups(now, token, ids),
                            Request::TxnOffsetCommit(r) => state.handle_txn_offset_commit(now, token, r),
                            Request::TxnEnd { group_id, producer_id, commit } => {
                                state.handle_txn_end(now, token, &group_id, producer_id, commit)
                            }
                            Request::ConsumerHeartbeat(r) => {
                                state.handle_consumer_heartbeat(now, token, *r, &LogCatalog(&log))
                            }
                        }
                    }
                    Command::Fetch(r, reply) => {
                        let _ = reply.send(state.offset_fetch(&r));
                        Vec::new()
                    }
                    Command::Describe(g, reply) => {
                        let _ = reply.send(state.describe_group(&g));
                        Vec::new()
                    }
                    Command::List(states, reply) => {
                        let _ = reply.send(state.list_groups(&states));
                        Vec::new()
                    }
                    Command::ConsumerDescribe(g, reply) => {
                        let _ = reply.send(state.describe_consumer_group(&g));
                        Vec::new()
                    }
                    Command::TxnGroups(producer_id, reply) => {
                        let _ = reply.send(state.groups_with_txn_offsets(producer_id));
                        Vec::new()
                    }
                }
            }
            Some((id, outcome)) = done_rx.recv() => state.persist_completed(clock.monotonic(), id, outcome),
            _ = sleep_or_forever(clock.as_ref(), sleep_for) => state.tick(clock.monotonic()),
        };
        for output in outputs {
            match output {
                Output::Respond { token, response } => {
                    if let Some(reply) = waiting.remove(&token) {
                        let _ = reply.send(response);
                    }
                }
                Output::Persist { id, records } => {
                    let write = Write {
                        id,
                        records,
                        now_ms: clock.wall_millis(),
                        timeout: state.config().offsets_commit_timeout,
                    };
                    if let Err(mpsc::error::SendError(write)) = writes.send(write) {
                        let _ = done_tx.send((
                            write.id,
                            PersistOutcome::Failed(PersistFailure::Unavailable),
                        ));
                    }
                }
            }
        }
    }
}

async fn sleep_or_forever(clock: &dyn Clock, d: Option<Duration>) {
    match d {
        Some(d) => clock.sleep(d).await,
        None => std::future::pending().await,
    }
}

/// One decision's records, to be appended as one batch.
struct Write {
    id: PersistId,
    records: Vec<PersistRecord>,
    now_ms: i64,
    timeout: Duration,
}

/// Appends the shard's batches in decision order and waits for their durability
/// concurrently. The order matters: Kafka records carry no sequence number, so replay and the
/// key cleaner take the last record of a key in the log as its value, and two commits of one
/// partition in flight at once must land in the order they were decided. The log assigns
/// offsets in the order `enqueue` calls complete.
async fn write_in_order(
    log: Arc<LogManager>,
    tp: TopicPartition,
    mut writes: mpsc::UnboundedReceiver<Write>,
    done: mpsc::UnboundedSender<(PersistId, PersistOutcome)>,
) {
    while let Some(write) = writes.recv().await {
        let batch = encode_batch(&write.records, write.now_ms);
        let enqueued = log
            .enqueue(
                &tp,
                batch,
                Acks::Durable {
                    timeout: write.timeout,
                },
            )
            .await;
        match enqueued {
            Ok(ticket) => {
                let done = done.clone();
                let tp = tp.clone();
                tokio::spawn(async move {
                    let outcome = append_outcome(&tp, ticket.wait().await.map(|_| ()));
                    let _ = done.send((write.id, outcome));
                });
            }
            Err(e) => {
                let _ = done.send((write.id, append_outcome(&tp, Err(e))));
            }
        }
    }
}

/// One batch of Kafka records (see `strata_groups::kafka_records`) for a decision's records.
fn encode_batch(records: &[PersistRecord], now_ms: i64) -> Bytes {
    let simple: Vec<SimpleRecord> = records
        .iter()
        .flat_map(|r| kafka_records::encode(r, now_ms))
        .map(|r| SimpleRecord {
            key: Some(r.key),
            value: r.value,
        })
        .collect();
    build_batch(&simple, now_ms)
}

fn append_outcome(tp: &TopicPartition, result: Result<(), LogError>) -> PersistOutcome {
    match result {
        Ok(()) => PersistOutcome::Durable,
        Err(LogError::Fenced | LogError::NotOwner | LogError::UnknownTopicOrPartition) => {
            PersistOutcome::Failed(PersistFailure::NotCoordinator)
        }
        Err(e) => {
            tracing::warn!(partition = %tp, error = %e, "persisting group records failed");
            PersistOutcome::Failed(PersistFailure::Unavailable)
        }
    }
}

/// Writes one decision's records as one batch (so they land all or nothing).
async fn persist(
    log: &LogManager,
    tp: &TopicPartition,
    records: &[PersistRecord],
    now_ms: i64,
    timeout: Duration,
) -> PersistOutcome {
    let batch = encode_batch(records, now_ms);
    let result = log.append(tp, batch, Acks::Durable { timeout }).await;
    append_outcome(tp, result.map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::Offset;

    use strata_groups::{OffsetValue, RecordBody};

    async fn offsets_log() -> (Arc<LogManager>, TopicPartition) {
        let store: Arc<dyn strata_storage::ObjectStore> =
            Arc::new(strata_storage::MemoryStore::new());
        let log = LogManager::open(
            store,
            strata_core::SystemClock::shared(),
            strata_log::LogConfig::default(),
            strata_core::BrokerId(0),
        )
        .await
        .unwrap();
        log.create_topic(OFFSETS_TOPIC, Some(1), Default::default(), false)
            .await
            .unwrap();
        (log, TopicPartition::new(OFFSETS_TOPIC, 0))
    }

    fn commit(seq: u64, partition: i32, offset: i64) -> PersistRecord {
        PersistRecord {
            seq,
            group_id: "g".into(),
            body: RecordBody::Offset {
                partition: TopicPartition::new("t", partition),
                value: OffsetValue {
                    offset: Offset(offset),
                    leader_epoch: None,
                    metadata: String::new(),
                    commit_timestamp_ms: 0,
                },
            },
        }
    }

    /// What older builds appended: JSON records keyed by group id.
    async fn append_legacy(log: &LogManager, tp: &TopicPartition, records: &[PersistRecord]) {
        let simple: Vec<SimpleRecord> = records
            .iter()
            .map(|r| SimpleRecord {
                key: Some(Bytes::from(r.group_id.clone())),
                value: Some(Bytes::from(serde_json::to_vec(r).unwrap())),
            })
            .collect();
        log.append(
            tp,
            build_batch(&simple, 0),
            Acks::Durable {
                timeout: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
    }

    async fn append_binary(log: &LogManager, tp: &TopicPartition, records: &[PersistRecord]) {
        assert_eq!(
            persist(log, tp, records, 0, Duration::from_secs(30)).await,
            PersistOutcome::Durable
        );
    }

    fn offsets_of(records: &[PersistRecord]) -> Vec<(i32, i64)> {
        let mut out: std::collections::BTreeMap<i32, i64> = Default::default();
        for r in records {
            match &r.body {
                RecordBody::Offset { partition, value } => {
                    out.insert(partition.partition, value.offset.get());
                }
                RecordBody::OffsetTombstone { partition } => {
                    out.remove(&partition.partition);
                }
                _ => {}
            }
        }
        out.into_iter().collect()
    }

    #[tokio::test]
    async fn records_are_written_in_kafkas_schema_keyed_per_offset() {
        let (log, tp) = offsets_log().await;
        append_binary(&log, &tp, &[commit(1, 3, 42)]).await;
        let read = log.read(&tp, Offset(0), 1 << 20, true).await.unwrap();
        let records = strata_wire::builder::read_records(&read.batches[0]).unwrap();
        let (_, record) = &records[0];
        assert_eq!(
            record.key.as_deref(),
            Some(&[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 3][..])
        );
        assert_eq!(&record.value.as_deref().unwrap()[..2], &[0, 3]);
    }

    #[tokio::test]
    async fn a_mixed_log_replays_older_json_records_first_then_kafka_records_in_log_order() {
        let (log, tp) = offsets_log().await;
        // An older build: its batches landed out of sequence order (written concurrently).
        append_legacy(&log, &tp, &[commit(9, 0, 90), commit(9, 1, 91)]).await;
        append_legacy(&log, &tp, &[commit(8, 0, 80), commit(8, 2, 82)]).await;
        // Then this build, whose records carry no sequence number: the log orders them, and
        // they win over every JSON record however high its seq.
        append_binary(&log, &tp, &[commit(0, 1, 100)]).await;
        append_binary(&log, &tp, &[commit(0, 1, 101)]).await;
        let replayed = replay(&log, &tp).await.unwrap();
        assert_eq!(replayed.legacy, 4);
        assert_eq!(replayed.read, 6);
        assert_eq!(
            offsets_of(&replayed.records),
            vec![(0, 90), (1, 101), (2, 82)]
        );
        let seqs: Vec<u64> = replayed.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6]);
        // The state machine agrees.
        let state = GroupsState::replay(
            GroupConfig::default(),
            Box::new(SeededMemberIds::new(1)),
            Duration::ZERO,
            replayed.records,
        );
        let fetched = state.offset_fetch(&OffsetFetchRequest {
            group_id: "g".into(),
            partitions: None,
            require_stable: false,
            member: None,
        });
        let mut got: Vec<(i32, i64)> = fetched
            .partitions
            .iter()
            .map(|f| (f.partition.partition, f.offset.get()))
            .collect();
        got.sort();
        assert_eq!(got, vec![(0, 90), (1, 101), (2, 82)]);
    }

    #[tokio::test]
    async fn a_shard_of_an_older_build_is_rewritten_in_kafkas_schema_once() {
        let (log, tp) = offsets_log().await;
        for seq in 0..50u64 {
            append_legacy(&log, &tp, &[commit(seq, (seq % 2) as i32, seq as i64)]).await;
        }
        let replayed = replay(&log, &tp).await.unwrap();
        assert_eq!((replayed.legacy, replayed.read), (50, 50));
        let (records, binary_only) =
            migrate_legacy_shard(&log, &tp, replayed, 0, Duration::from_secs(30)).await;
        assert!(binary_only);
        assert_eq!(offsets_of(&records), vec![(0, 48), (1, 49)]);
        assert_eq!(log.watermarks(&tp).unwrap().log_start, Offset(50));
        // The next load reads two Kafka records, and rewrites nothing.
        let again = replay(&log, &tp).await.unwrap();
        assert_eq!((again.legacy, again.read), (0, 2));
        assert_eq!(offsets_of(&again.records), vec![(0, 48), (1, 49)]);
        let (_, binary_only) =
            migrate_legacy_shard(&log, &tp, again, 0, Duration::from_secs(30)).await;
        assert!(binary_only);
        assert_eq!(log.watermarks(&tp).unwrap().high, Offset(52));
    }

    #[tokio::test]
    async fn an_offsets_topic_of_an_older_build_becomes_compacted_once_every_shard_is_rewritten() {
        let (log, tp) = offsets_log().await;
        assert!(
            !log.topic(OFFSETS_TOPIC)
                .unwrap()
                .config
                .cleanup_policy
                .compact
        );
        append_legacy(&log, &tp, &[commit(1, 0, 10), commit(2, 0, 20)]).await;
        let coordinator = GroupCoordinator::start(
            log.clone(),
            strata_core::SystemClock::shared(),
            GroupConfig::default(),
            1,
            0,
            true,
        )
        .await
        .unwrap();
        assert!(
            log.topic(OFFSETS_TOPIC)
                .unwrap()
                .config
                .cleanup_policy
                .compact
        );
        assert_eq!(log.watermarks(&tp).unwrap().log_start, Offset(2));
        assert_eq!(
            coordinator.stats.snapshot(),
            GroupLoadSnapshot {
                loads: 1,
                replayed_records: 2
            }
        );
        let fetched = coordinator
            .offset_fetch(OffsetFetchRequest {
                group_id: "g".into(),
                partitions: None,
                require_stable: false,
                member: None,
            })
            .await
            .unwrap();
        assert_eq!(fetched.partitions[0].offset, Offset(20));
    }

    /// A shard claimed but not loaded yet answers COORDINATOR_LOAD_IN_PROGRESS, which clients
    /// retry against this broker; NOT_COORDINATOR, which librdkafka's `committed()` fails on,
    /// is kept for shards that are not ours (never claimed, given up, or handed over).
    #[tokio::test]
    async fn a_claimed_shard_answers_load_in_progress_until_it_is_loaded() {
        let (log, tp) = offsets_log().await;
        append_binary(&log, &tp, &[commit(1, 0, 10)]).await;
        let coordinator = GroupCoordinator::start(
            log,
            strata_core::SystemClock::shared(),
            GroupConfig::default(),
            1,
            0,
            false,
        )
        .await
        .unwrap();
        let fetch = || {
            coordinator.offset_fetch(OffsetFetchRequest {
                group_id: "g".into(),
                partitions: None,
                require_stable: false,
                member: None,
            })
        };
        assert_eq!(fetch().await.unwrap_err(), GroupError::NotCoordinator);
        assert_eq!(coordinator.hosting("g"), Err(GroupError::NotCoordinator));

        coordinator.expect_shard(0);
        assert_eq!(
            fetch().await.unwrap_err(),
            GroupError::CoordinatorLoadInProgress
        );
        assert_eq!(
            coordinator.hosting("g"),
            Err(GroupError::CoordinatorLoadInProgress)
        );
        assert!(!coordinator.hosts("g"));
        assert!(coordinator.list(Vec::new()).await.unwrap().is_empty());
        // The claim given up (its partition's acquire failed): not ours.
        coordinator.unload_shard(0);
        assert_eq!(fetch().await.unwrap_err(), GroupError::NotCoordinator);

        coordinator.expect_shard(0);
        coordinator.load_shard(0).await.unwrap();
        assert!(coordinator.hosts("g"));
        assert_eq!(fetch().await.unwrap().partitions[0].offset, Offset(10));
        // Expecting a shard already loaded changes nothing.
        coordinator.expect_shard(0);
        assert!(coordinator.hosts("g"));
        coordinator.unload_shard(0);
        assert_eq!(fetch().await.unwrap_err(), GroupError::NotCoordinator);
    }

    #[test]
    fn shards_follow_kafkas_hash() {
        // Java: "group".hashCode() == 98629247; 98629247 % 50 == 47.
        assert_eq!(shard_of("group", 50), 47);
        assert_eq!(shard_of("", 8), 0);
        for g in ["a", "consumers", "ééé", "x".repeat(1000).as_str()] {
            assert!(shard_of(g, 8) < 8);
        }
    }
}
