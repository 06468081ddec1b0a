//! The group coordinator runtime: carries out what the sans-IO [`strata_groups::GroupsState`]
//! decides. Groups are sharded over the partitions of the internal topic
//! `__consumer_offsets` (Kafka's own layout: shard = hash(group id) mod partition count); each
//! shard is one task owning one `GroupsState` and persisting its records, as one record batch
//! per decision, into its partition through the log. A shard is therefore exactly as movable
//! as any partition, and a coordinator that starts rebuilds its groups by replaying the shard's
//! partition.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::{Clock, TopicPartition};
use strata_groups::{
    ConsumerGroupDescription, ConsumerHeartbeatRequest, DeleteGroupsResponse, GroupConfig,
    GroupDescription, GroupError, GroupState, GroupsState, HeartbeatRequest, JoinRequest,
    LeaveRequest, ListedGroup, OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest,
    OffsetFetchResponse, Output, PersistFailure, PersistOutcome, PersistRecord, RequestToken,
    Response, SeededMemberIds, SyncRequest, TopicCatalog, TopicId, TxnOffsetCommitRequest,
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

/// Handle to the coordinator shards this broker hosts. Shards come and go with ownership of
/// their `__consumer_offsets` partitions: `load_shard` when the partition is acquired (replay),
/// `unload_shard` when it is handed over. A request for a group whose shard is not hosted here
/// is answered NOT_COORDINATOR, and the client asks FindCoordinator again.
#[derive(Debug)]
pub struct GroupCoordinator {
    log: Arc<LogManager>,
    clock: Arc<dyn Clock>,
    config: GroupConfig,
    seed: u64,
    shard_count: usize,
    shards: std::sync::RwLock<HashMap<usize, mpsc::Sender<Command>>>,
}

/// Kafka's `Utils.abs(groupId.hashCode) % partitions`, with Java's String.hashCode over UTF-16
/// code units, so groups land on the shard a Kafka operator would expect.
pub fn shard_of(group_id: &str, shards: usize) -> usize {
    let mut h: i32 = 0;
    for unit in group_id.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(unit as i32);
    }
    ((h & 0x7fff_ffff) as usize) % shards.max(1)
}

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
                // Offsets must outlive any retention: they are compacted by key in Kafka, and
                // here they are simply kept (see docs/ARCHITECTURE.md, groups). One commit is
                // one batch, and a consumer of many partitions commits them all at once: a
                // batch over the 1 MB default would fail the commit as COORDINATOR_NOT_AVAILABLE
                // and the client would retry it forever, so the limit is raised to what a
                // request itself may carry.
                let overrides = [
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
        });
        if load_all {
            for p in 0..topic.partitions {
                coordinator.load_shard(p).await?;
            }
        }
        Ok(coordinator)
    }

    /// Starts hosting shard `p`: replays its partition and starts its task. Loading a shard
    /// already hosted does nothing.
    pub async fn load_shard(&self, p: i32) -> Result<(), LogError> {
        if p < 0 || self.read_shards().contains_key(&(p as usize)) {
            return Ok(());
        }
        let tp = TopicPartition::new(OFFSETS_TOPIC, p);
        let records = replay(&self.log, &tp).await?;
        // Nothing else writes this partition until the shard task starts below, which is
        // what makes rewriting its head safe here.
        let records = compact_shard(
            &self.log,
            &tp,
            records,
            self.clock.wall_millis(),
            self.config.offsets_commit_timeout,
        )
        .await;
        let loaded = records.len();
        let state = GroupsState::replay(
            self.config.clone(),
            Box::new(SeededMemberIds::new(self.seed.wrapping_add(p as u64))),
            self.clock.monotonic(),
            records,
        );
        tracing::info!(
            shard = p,
            records = loaded,
            "group coordinator shard loaded"
        );
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(run_shard(
            state,
            rx,
            self.log.clone(),
            tp,
            self.clock.clone(),
        ));
        let mut shards = match self.shards.write() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        shards.entry(p as usize).or_insert(tx);
        Ok(())
    }

    /// Stops hosting shard `p`: its task answers what it holds with NOT_COORDINATOR and ends.
    pub fn unload_shard(&self, p: i32) {
        let removed = match self.shards.write() {
            Ok(mut g) => g.remove(&(p as usize)),
            Err(e) => e.into_inner().remove(&(p as usize)),
        };
        if removed.is_some() {
            tracing::info!(shard = p, "group coordinator shard unloaded");
        }
    }

    /// Whether this broker hosts the shard of `group_id`.
    pub fn hosts(&self, group_id: &str) -> bool {
        self.read_shards()
            .contains_key(&shard_of(group_id, self.shard_count))
    }

    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    fn read_shards(&self) -> std::sync::RwLockReadGuard<'_, HashMap<usize, mpsc::Sender<Command>>> {
        match self.shards.read() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        }
    }

    fn shard(&self, group_id: &str) -> Result<mpsc::Sender<Command>, GroupError> {
        self.read_shards()
            .get(&shard_of(group_id, self.shard_count))
            .cloned()
            .ok_or(GroupError::NotCoordinator)
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
        let sender = self
            .read_shards()
            .get(&(p.max(0) as usize))
            .cloned()
            .ok_or(GroupError::NotCoordinator)?;
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
        let shards: Vec<mpsc::Sender<Command>> = self.read_shards().values().cloned().collect();
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
            let Some(sender) = self.read_shards().get(&shard).cloned() else {
                for id in ids {
                    results.insert(id, Some(GroupError::NotCoordinator));
                }
                continue;
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

/// Below this many records a shard's log is not worth compacting.
const COMPACT_MIN_RECORDS: usize = 1000;
/// Records per batch when rewriting a compacted shard.
const COMPACT_BATCH_RECORDS: usize = 500;

/// Kafka compacts `__consumer_offsets` by key; here the equivalent happens when a shard loads.
/// Only the newest record per key matters to replay (tombstones included), so once the log
/// holds more than twice that, the live records are written again at its end (sequence numbers
/// unchanged, so replay order is unchanged) and the log start moves past everything older.
/// Any failure leaves the log as it was: the old records are deleted only after the rewrite is
/// durable, and a rewrite that stopped half-way only duplicates records replay already
/// deduplicates.
async fn compact_shard(
    log: &LogManager,
    tp: &TopicPartition,
    records: Vec<PersistRecord>,
    now_ms: i64,
    timeout: Duration,
) -> Vec<PersistRecord> {
    let mut newest: HashMap<strata_groups::PersistKey, PersistRecord> = HashMap::new();
    for r in &records {
        let key = r.key();
        if newest.get(&key).is_none_or(|old| old.seq <= r.seq) {
            newest.insert(key, r.clone());
        }
    }
    let mut live: Vec<PersistRecord> = newest.into_values().filter(|r| !r.is_tombstone()).collect();
    if records.len() < COMPACT_MIN_RECORDS || records.len() < 2 * live.len() {
        return records;
    }
    live.sort_by_key(|r| r.seq);
    let start = match log.watermarks(tp) {
        Ok(w) => w.high,
        Err(_) => return records,
    };
    for chunk in live.chunks(COMPACT_BATCH_RECORDS) {
        if let PersistOutcome::Failed(_) = persist(log, tp, chunk, now_ms, timeout).await {
            tracing::warn!(partition = %tp, "compacting a group shard failed; keeping its full log");
            return records;
        }
    }
    match log.delete_records(tp, Some(start)).await {
        Ok(_) => tracing::info!(partition = %tp, before = records.len(), after = live.len(),
            "compacted group shard"),
        Err(e) => tracing::warn!(partition = %tp, error = %e,
            "compacted group shard written, but its old records could not be dropped"),
    }
    live
}

/// Reads a shard's partition from its start and decodes every persisted record. A record that
/// does not decode is skipped with an error log: losing one stale fact is better than a
/// coordinator that can never start.
async fn replay(log: &LogManager, tp: &TopicPartition) -> Result<Vec<PersistRecord>, LogError> {
    let mut records = Vec::new();
    // Transaction markers are skipped: making transactional offset commits visible on commit
    // and dropping them on abort happens when the marker is written
    // (`handlers::txn_markers::offsets_marker_written`), and replay finds its result as records.
    crate::shard_log::replay_records(log, tp, "group", |offset, record| {
        let Some(value) = record.value else { return };
        match serde_json::from_slice::<PersistRecord>(&value) {
            Ok(r) => records.push(r),
            Err(e) => {
                tracing::error!(partition = %tp, offset, error = %e, "undecodable group record skipped")
            }
        }
    })
    .await?;
    Ok(records)
}

async fn run_shard(
    mut state: GroupsState,
    mut commands: mpsc::Receiver<Command>,
    log: Arc<LogManager>,
    tp: TopicPartition,
    clock: Arc<dyn Clock>,
) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
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
                            Request::Join(r) => state.handle_join(now, token, r),
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
                    let log = log.clone();
                    let tp = tp.clone();
                    let done = done_tx.clone();
                    let now_ms = clock.wall_millis();
                    let timeout = state.config().offsets_commit_timeout;
                    tokio::spawn(async move {
                        let outcome = persist(&log, &tp, &records, now_ms, timeout).await;
                        let _ = done.send((id, outcome));
                    });
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

/// Writes one decision's records as one batch (so they land all or nothing).
async fn persist(
    log: &LogManager,
    tp: &TopicPartition,
    records: &[PersistRecord],
    now_ms: i64,
    timeout: Duration,
) -> PersistOutcome {
    let mut simple = Vec::with_capacity(records.len());
    for r in records {
        match serde_json::to_vec(r) {
            Ok(v) => simple.push(SimpleRecord {
                key: Some(Bytes::from(r.group_id.clone())),
                value: Some(Bytes::from(v)),
            }),
            Err(e) => {
                tracing::error!(error = %e, "encoding a group record failed");
                return PersistOutcome::Failed(PersistFailure::Unavailable);
            }
        }
    }
    let batch = build_batch(&simple, now_ms);
    match log.append(tp, batch, Acks::Durable { timeout }).await {
        Ok(_) => PersistOutcome::Durable,
        Err(LogError::Fenced | LogError::NotOwner | LogError::UnknownTopicOrPartition) => {
            PersistOutcome::Failed(PersistFailure::NotCoordinator)
        }
        Err(e) => {
            tracing::warn!(partition = %tp, error = %e, "persisting group records failed");
            PersistOutcome::Failed(PersistFailure::Unavailable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::Offset;

    #[tokio::test]
    async fn a_shard_log_full_of_superseded_commits_is_compacted_on_load() {
        use strata_groups::{OffsetValue, RecordBody};
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
        let tp = TopicPartition::new(OFFSETS_TOPIC, 0);
        let commit = |seq: u64, partition: i32, offset: i64| PersistRecord {
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
        };
        // 1,200 commits of two partitions: only the last of each matters.
        for seq in 0..1200u64 {
            let r = commit(seq, (seq % 2) as i32, seq as i64);
            assert_eq!(
                persist(&log, &tp, &[r], 0, Duration::from_secs(30)).await,
                PersistOutcome::Durable
            );
        }
        let replayed = replay(&log, &tp).await.unwrap();
        assert_eq!(replayed.len(), 1200);
        let compacted = compact_shard(&log, &tp, replayed, 0, Duration::from_secs(30)).await;
        assert_eq!(
            compacted,
            vec![commit(1198, 0, 1198), commit(1199, 1, 1199)]
        );
        // What a later load replays is the compacted head only, with the same facts.
        let again = replay(&log, &tp).await.unwrap();
        assert_eq!(again, compacted);
        assert_eq!(log.watermarks(&tp).unwrap().log_start, Offset(1200));
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
