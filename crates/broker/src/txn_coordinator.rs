//! The transaction coordinator runtime: carries out what the sans-IO [`strata_txn::TxnShard`]
//! decides, exactly as [`crate::coordinator`] does for groups. Transactional ids are sharded
//! over the partitions of the internal topic `__transaction_state` (Kafka's layout); each
//! shard is one task owning one `TxnShard`, persisting its records (Kafka's binary
//! TransactionLogKey/Value) with acks=all into its partition, and replayed from the partition
//! when the shard is acquired. Markers of a prepared transaction go out through a
//! [`MarkerWriter`] and are retried until written; only then is the transaction completed.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use strata_core::{Clock, TopicPartition};
use strata_log::{Acks, LogError, LogManager};
use strata_txn::{
    Completion, InitProducerIdRequest, ListFilter, MarkerJob, Output, PersistId, RequestToken,
    Response, TxnConfig, TxnDescription, TxnError, TxnRecord, TxnShard, TxnState,
};
use strata_wire::builder::{build_batch, SimpleRecord};
use tokio::sync::{mpsc, oneshot};

/// The internal topic holding the transaction coordinator's state (Kafka's name).
pub const TXN_TOPIC: &str = "__transaction_state";

/// First and largest pause between attempts to write a transaction's markers.
const MARKER_BACKOFF_MIN: Duration = Duration::from_millis(100);
const MARKER_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Writes the commit or abort markers of a transaction into its partitions.
#[async_trait]
pub trait MarkerWriter: Send + Sync + fmt::Debug {
    /// One attempt at writing `job`'s marker into `partitions`; answers the partitions still
    /// to be written (a retriable failure: owner unknown or moving, storage error). Writing a
    /// marker twice is harmless: the data partition's owner treats a marker for a producer
    /// epoch it has already ended as done.
    /// `coordinator_epoch` is the leader epoch of the coordinator's shard partition, so an
    /// owner can refuse markers from a deposed coordinator.
    async fn write(
        &self,
        job: &MarkerJob,
        coordinator_epoch: i32,
        partitions: &BTreeSet<TopicPartition>,
    ) -> BTreeSet<TopicPartition>;

    /// KIP-890 verification by a coordinator on another broker (AddPartitionsToTxn v4,
    /// `verify_only`): per partition, the coordinator's error code. Writers that reach no other
    /// broker answer COORDINATOR_NOT_AVAILABLE.
    async fn verify_remote(
        &self,
        _transactional_id: &str,
        _producer_id: i64,
        _producer_epoch: i16,
        partitions: &[TopicPartition],
    ) -> Vec<(TopicPartition, i16)> {
        partitions
            .iter()
            .map(|tp| (tp.clone(), crate::errors::code::COORDINATOR_NOT_AVAILABLE))
            .collect()
    }
}

/// Counters for `strata_transactions_total` and `strata_transactions_open`.
#[derive(Debug, Default)]
pub struct TxnStats {
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub timed_out: AtomicU64,
    open: std::sync::Mutex<HashMap<usize, i64>>,
    open_total: AtomicI64,
}

/// A reading of [`TxnStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxnStatsSnapshot {
    pub committed: u64,
    pub aborted: u64,
    pub timed_out: u64,
    pub open: i64,
}

impl TxnStats {
    pub fn snapshot(&self) -> TxnStatsSnapshot {
        TxnStatsSnapshot {
            committed: self.committed.load(Ordering::Relaxed),
            aborted: self.aborted.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            open: self.open(),
        }
    }

    pub fn open(&self) -> i64 {
        self.open_total.load(Ordering::Relaxed)
    }

    fn set_open(&self, shard: usize, n: Option<i64>) {
        let mut g = match self.open.lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        match n {
            Some(n) => g.insert(shard, n),
            None => g.remove(&shard),
        };
        self.open_total.store(g.values().sum(), Ordering::Relaxed);
    }
}

enum Command {
    Init(InitProducerIdRequest, oneshot::Sender<Response>),
    Add {
        id: String,
        producer_id: i64,
        epoch: i16,
        partitions: BTreeSet<TopicPartition>,
        reply: oneshot::Sender<Response>,
    },
    Verify {
        id: String,
        producer_id: i64,
        epoch: i16,
        partitions: Vec<TopicPartition>,
        reply: oneshot::Sender<Vec<(TopicPartition, Result<(), TxnError>)>>,
    },
    End {
        id: String,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        reply: oneshot::Sender<Response>,
    },
    Describe(String, oneshot::Sender<Result<TxnDescription, TxnError>>),
    List(ListFilter, oneshot::Sender<Vec<(String, i64, TxnState)>>),
}

enum Slot {
    Loading,
    Ready(mpsc::Sender<Command>),
}

/// Handle to the transaction coordinator shards this broker hosts; like
/// [`crate::coordinator::GroupCoordinator`], shards follow ownership of their partitions.
pub struct TxnCoordinator {
    log: Arc<LogManager>,
    clock: Arc<dyn Clock>,
    config: TxnConfig,
    write_timeout: Duration,
    shard_count: usize,
    shards: std::sync::RwLock<HashMap<usize, Slot>>,
    markers: std::sync::RwLock<Option<Arc<dyn MarkerWriter>>>,
    pub stats: Arc<TxnStats>,
}

impl fmt::Debug for TxnCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxnCoordinator")
            .field("shard_count", &self.shard_count)
            .finish_non_exhaustive()
    }
}

/// The `__transaction_state` shard of a transactional id (Kafka's hash; see strata_core).
pub use strata_core::coordinator_shard as shard_of;

impl TxnCoordinator {
    /// Ensures `__transaction_state` exists and, if `load_all`, hosts every shard (a broker
    /// alone on its storage). `write_timeout` bounds each record's durability wait.
    pub async fn start(
        log: Arc<LogManager>,
        clock: Arc<dyn Clock>,
        config: TxnConfig,
        shard_count: i32,
        write_timeout: Duration,
        load_all: bool,
    ) -> Result<Arc<Self>, LogError> {
        let topic = match log.topic(TXN_TOPIC) {
            Some(t) => t,
            None => {
                // Transaction state must outlive any retention, as the offsets topic's; the
                // key cleaner keeps the newest record per transactional id, which is all
                // replay reads (`TxnShard::replay`: the last value wins, a tombstone forgets).
                let overrides = [
                    ("cleanup.policy".to_string(), "compact".to_string()),
                    ("retention.ms".to_string(), "-1".to_string()),
                ]
                .into();
                match log
                    .create_topic(TXN_TOPIC, Some(shard_count), overrides, false)
                    .await
                {
                    Ok(t) => t,
                    Err(LogError::TopicAlreadyExists(_)) => {
                        log.refresh_catalog().await?;
                        log.topic(TXN_TOPIC)
                            .ok_or(LogError::UnknownTopicOrPartition)?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        if !topic.config.cleanup_policy.compact {
            // Created by an older build. Its records have always been keyed by transactional
            // id, so compaction is safe at once, unlike the offsets topic's.
            let change = vec![("cleanup.policy".to_string(), Some("compact".to_string()))];
            match log.alter_topic_configs(TXN_TOPIC, change, false).await {
                Ok(()) => tracing::info!("{TXN_TOPIC} is now compacted by key"),
                Err(e) => tracing::warn!(error = %e,
                    "could not make {TXN_TOPIC} compacted; trying again at the next start"),
            }
        }
        let coordinator = Arc::new(Self {
            log,
            clock,
            config,
            write_timeout,
            shard_count: topic.partitions.max(1) as usize,
            shards: std::sync::RwLock::new(HashMap::new()),
            markers: std::sync::RwLock::new(None),
            stats: Arc::new(TxnStats::default()),
        });
        if load_all {
            for p in 0..topic.partitions {
                coordinator.load_shard(p).await?;
            }
        }
        Ok(coordinator)
    }

    /// Installs `writer` unless one is set already.
    pub(crate) fn set_default_marker_writer(&self, writer: Arc<dyn MarkerWriter>) {
        let mut g = match self.markers.write() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        if g.is_none() {
            *g = Some(writer);
        }
    }

    /// Where markers go. Until set, prepared transactions wait (their marker tasks retry).
    pub fn set_marker_writer(&self, writer: Arc<dyn MarkerWriter>) {
        match self.markers.write() {
            Ok(mut g) => *g = Some(writer),
            Err(e) => *e.into_inner() = Some(writer),
        }
    }

    /// Whether markers have somewhere to go (a broker serving a PLAINTEXT listener).
    pub fn can_write_markers(&self) -> bool {
        self.marker_writer().is_some()
    }

    pub(crate) fn marker_writer(&self) -> Option<Arc<dyn MarkerWriter>> {
        match self.markers.read() {
            Ok(g) => g.clone(),
            Err(e) => e.into_inner().clone(),
        }
    }

    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    fn write_shards(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<usize, Slot>> {
        match self.shards.write() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        }
    }

    /// Starts hosting shard `p`: replays its partition, starts its task, and resumes the
    /// markers of every transaction it finds prepared. Requests meanwhile are answered
    /// COORDINATOR_LOAD_IN_PROGRESS.
    pub async fn load_shard(self: &Arc<Self>, p: i32) -> Result<(), LogError> {
        if p < 0 {
            return Ok(());
        }
        {
            let mut shards = self.write_shards();
            if let Some(Slot::Ready(_)) = shards.get(&(p as usize)) {
                return Ok(());
            }
            shards.insert(p as usize, Slot::Loading);
        }
        let tp = TopicPartition::new(TXN_TOPIC, p);
        let records = match replay(&self.log, &tp).await {
            Ok(r) => r,
            Err(e) => {
                self.write_shards().remove(&(p as usize));
                return Err(e);
            }
        };
        let loaded = records.len();
        let state = TxnShard::replay(self.config, records);
        tracing::info!(
            shard = p,
            records = loaded,
            "transaction coordinator shard loaded"
        );
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(run_shard(Arc::clone(self), p as usize, state, rx, tp));
        // Unloaded while it replayed (handed over, or its start given up): the task ends with
        // its channel.
        if let Some(slot @ Slot::Loading) = self.write_shards().get_mut(&(p as usize)) {
            *slot = Slot::Ready(tx);
        }
        Ok(())
    }

    /// Shard `p`'s partition is being claimed here: until [`Self::load_shard`] finishes (or
    /// [`Self::unload_shard`] gives it up) its requests are answered
    /// COORDINATOR_LOAD_IN_PROGRESS. A shard already hosted is left as it is.
    pub fn expect_shard(&self, p: i32) {
        if p >= 0 {
            self.write_shards()
                .entry(p as usize)
                .or_insert(Slot::Loading);
        }
    }

    /// Stops hosting shard `p`; its task ends, and so do its marker retries (the next
    /// coordinator resumes them from the Prepare records).
    pub fn unload_shard(&self, p: i32) {
        if let Some(Slot::Ready(_)) = self.write_shards().remove(&(p as usize)) {
            self.stats.set_open(p as usize, None);
            tracing::info!(shard = p, "transaction coordinator shard unloaded");
        }
    }

    fn shard(&self, transactional_id: &str) -> Result<mpsc::Sender<Command>, TxnError> {
        let shards = match self.shards.read() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        match shards.get(&shard_of(transactional_id, self.shard_count)) {
            Some(Slot::Ready(tx)) => Ok(tx.clone()),
            Some(Slot::Loading) => Err(TxnError::CoordinatorLoadInProgress),
            None => Err(TxnError::NotCoordinator),
        }
    }

    async fn ask<T>(
        &self,
        transactional_id: &str,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, TxnError> {
        let (tx, rx) = oneshot::channel();
        self.shard(transactional_id)?
            .send(make(tx))
            .await
            .map_err(|_| TxnError::NotCoordinator)?;
        // A shard unloaded while the request waited: the client looks the coordinator up again.
        rx.await.map_err(|_| TxnError::NotCoordinator)
    }

    pub async fn init_producer_id(
        &self,
        req: InitProducerIdRequest,
    ) -> Result<(i64, i16), TxnError> {
        let id = req.transactional_id.clone();
        match self.ask(&id, |tx| Command::Init(req, tx)).await? {
            Response::InitProducerId(r) => r,
            _ => Err(TxnError::CoordinatorNotAvailable),
        }
    }

    pub async fn add_partitions(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: BTreeSet<TopicPartition>,
    ) -> Result<(), TxnError> {
        let answer = self
            .ask(id, |reply| Command::Add {
                id: id.to_string(),
                producer_id,
                epoch,
                partitions,
                reply,
            })
            .await?;
        match answer {
            Response::AddPartitions(r) => r,
            _ => Err(TxnError::CoordinatorNotAvailable),
        }
    }

    pub async fn verify_partitions(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: Vec<TopicPartition>,
    ) -> Result<Vec<(TopicPartition, Result<(), TxnError>)>, TxnError> {
        self.ask(id, |reply| Command::Verify {
            id: id.to_string(),
            producer_id,
            epoch,
            partitions,
            reply,
        })
        .await
    }

    pub async fn end_txn(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> Result<(), TxnError> {
        let answer = self
            .ask(id, |reply| Command::End {
                id: id.to_string(),
                producer_id,
                epoch,
                commit,
                reply,
            })
            .await?;
        match answer {
            Response::EndTxn(r) => r,
            _ => Err(TxnError::CoordinatorNotAvailable),
        }
    }

    pub async fn describe(&self, id: &str) -> Result<TxnDescription, TxnError> {
        self.ask(id, |reply| Command::Describe(id.to_string(), reply))
            .await?
    }

    /// ListTransactions over every shard hosted here (Kafka asks every broker).
    pub async fn list(&self, filter: ListFilter) -> Vec<(String, i64, TxnState)> {
        let senders: Vec<mpsc::Sender<Command>> = {
            let shards = match self.shards.read() {
                Ok(g) => g,
                Err(e) => e.into_inner(),
            };
            shards
                .values()
                .filter_map(|s| match s {
                    Slot::Ready(tx) => Some(tx.clone()),
                    Slot::Loading => None,
                })
                .collect()
        };
        let mut all = Vec::new();
        for s in senders {
            let (tx, rx) = oneshot::channel();
            if s.send(Command::List(filter.clone(), tx)).await.is_ok() {
                all.extend(rx.await.unwrap_or_default());
            }
        }
        all.sort();
        all
    }
}

/// Reads a shard's partition from its start and decodes every record; an undecodable one is
/// skipped with an error log, as the group coordinator does.
async fn replay(log: &LogManager, tp: &TopicPartition) -> Result<Vec<TxnRecord>, LogError> {
    let mut records = Vec::new();
    crate::shard_log::replay_records(log, tp, "transaction", |offset, record| {
        let Some(key) = record.key else { return };
        let id = match strata_txn::decode_key(&key) {
            Ok(id) => id,
            Err(e) => {
                tracing::error!(partition = %tp, offset, error = %e, "undecodable transaction key skipped");
                return;
            }
        };
        let value = match record.value.map(|v| strata_txn::decode_value(&v)) {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(e)) => {
                tracing::error!(partition = %tp, offset, error = %e, "undecodable transaction record skipped");
                return;
            }
        };
        records.push(TxnRecord {
            transactional_id: id,
            value,
        });
    })
    .await?;
    Ok(records)
}

async fn persist(
    log: &LogManager,
    tp: &TopicPartition,
    record: &TxnRecord,
    now_ms: i64,
    timeout: Duration,
) -> Result<(), TxnError> {
    let simple = SimpleRecord {
        key: Some(Bytes::from(strata_txn::encode_key(
            &record.transactional_id,
        ))),
        value: record
            .value
            .as_ref()
            .map(|v| Bytes::from(strata_txn::encode_value(v))),
    };
    let batch = build_batch(&[simple], now_ms);
    match log.append(tp, batch, Acks::Durable { timeout }).await {
        Ok(_) => Ok(()),
        Err(LogError::Fenced | LogError::NotOwner | LogError::UnknownTopicOrPartition) => {
            Err(TxnError::NotCoordinator)
        }
        Err(e) => {
            tracing::warn!(partition = %tp, error = %e, "persisting transaction state failed");
            Err(TxnError::CoordinatorNotAvailable)
        }
    }
}

enum Done {
    Persisted(PersistId, Result<(), TxnError>),
    Markers(MarkerJob),
}

async fn run_shard(
    coordinator: Arc<TxnCoordinator>,
    shard: usize,
    mut state: TxnShard,
    mut commands: mpsc::Receiver<Command>,
    tp: TopicPartition,
) {
    let clock = Arc::clone(&coordinator.clock);
    // Kafka's coordinator epoch is the leader epoch of the shard's partition.
    let coordinator_epoch = coordinator
        .log
        .readable_epoch(&tp)
        .and_then(|e| i32::try_from(e).ok())
        .unwrap_or(0);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut waiting: HashMap<RequestToken, oneshot::Sender<Response>> = HashMap::new();
    let mut next_token = 0u64;
    let mut outputs = state.resume();
    loop {
        for output in std::mem::take(&mut outputs) {
            match output {
                Output::Respond { token, response } => {
                    if let Some(reply) = waiting.remove(&token) {
                        let _ = reply.send(response);
                    }
                }
                Output::Persist { id, record } => {
                    let log = Arc::clone(&coordinator.log);
                    let tp = tp.clone();
                    let done = done_tx.clone();
                    let now_ms = clock.wall_millis();
                    let timeout = coordinator.write_timeout;
                    tokio::spawn(async move {
                        let outcome = persist(&log, &tp, &record, now_ms, timeout).await;
                        let _ = done.send(Done::Persisted(id, outcome));
                    });
                }
                Output::WriteMarkers(job) => {
                    tokio::spawn(write_markers(
                        Arc::clone(&coordinator),
                        job,
                        coordinator_epoch,
                        done_tx.clone(),
                    ));
                }
                Output::Completed(c) => {
                    let counter = match c {
                        Completion::Committed => &coordinator.stats.committed,
                        Completion::Aborted => &coordinator.stats.aborted,
                        Completion::TimedOut => &coordinator.stats.timed_out,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        coordinator
            .stats
            .set_open(shard, Some(state.open_count() as i64));
        let now_ms = clock.wall_millis();
        let wait = Duration::from_millis(
            u64::try_from(state.next_deadline_ms().saturating_sub(now_ms)).unwrap_or(0),
        );
        outputs = tokio::select! {
            cmd = commands.recv() => {
                let Some(cmd) = cmd else {
                    // Unloaded: parked requests learn to look for the new coordinator.
                    for (_, reply) in waiting.drain() {
                        drop(reply);
                    }
                    coordinator.stats.set_open(shard, None);
                    break;
                };
                let now_ms = clock.wall_millis();
                let mut park = |reply: oneshot::Sender<Response>| {
                    next_token += 1;
                    let token = RequestToken(next_token);
                    waiting.insert(token, reply);
                    token
                };
                match cmd {
                    Command::Init(req, reply) => {
                        let token = park(reply);
                        state.handle_init_producer_id(now_ms, token, req)
                    }
                    Command::Add { id, producer_id, epoch, partitions, reply } => {
                        let token = park(reply);
                        state.handle_add_partitions(now_ms, token, &id, producer_id, epoch, partitions)
                    }
                    Command::End { id, producer_id, epoch, commit, reply } => {
                        let token = park(reply);
                        state.handle_end_txn(now_ms, token, &id, producer_id, epoch, commit)
                    }
                    Command::Verify { id, producer_id, epoch, partitions, reply } => {
                        let _ = reply.send(state.verify_partitions(&id, producer_id, epoch, &partitions));
                        Vec::new()
                    }
                    Command::Describe(id, reply) => {
                        let _ = reply.send(state.describe(&id));
                        Vec::new()
                    }
                    Command::List(filter, reply) => {
                        let _ = reply.send(state.list(now_ms, &filter));
                        Vec::new()
                    }
                }
            }
            Some(done) = done_rx.recv() => match done {
                Done::Persisted(id, outcome) => state.persist_completed(id, outcome),
                Done::Markers(job) => state.markers_written(clock.wall_millis(), &job),
            },
            _ = clock.sleep(wait) => state.tick(clock.wall_millis()),
        };
    }
}

/// Writes a job's markers until every partition has its marker, backing off between
/// attempts; gives up only when the shard is unloaded (the next coordinator resumes).
async fn write_markers(
    coordinator: Arc<TxnCoordinator>,
    job: MarkerJob,
    coordinator_epoch: i32,
    done: mpsc::UnboundedSender<Done>,
) {
    let mut left = job.partitions.clone();
    let mut backoff = MARKER_BACKOFF_MIN;
    while !left.is_empty() {
        if done.is_closed() {
            return;
        }
        if let Some(writer) = coordinator.marker_writer() {
            left = writer.write(&job, coordinator_epoch, &left).await;
            if left.is_empty() {
                break;
            }
            tracing::debug!(txn = %job.transactional_id, left = left.len(), "markers not all written yet; retrying");
        }
        coordinator.clock.sleep(backoff).await;
        backoff = (backoff * 2).min(MARKER_BACKOFF_MAX);
    }
    let _ = done.send(Done::Markers(job));
}
