//! `LogManager`: the broker-wide entry point of the log layer — catalog, partitions, the
//! group-commit writer and the background compaction and retention tasks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use strata_core::{BrokerId, Clock, Offset, TopicPartition};
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError};
use strata_wire::batch::{self as wire_batch, BatchView, RecordsCheck};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinHandle;

use crate::cache::{CachedBatch, TailCache};
use crate::catalog::{self, CatalogState, TopicId, TopicInfo};
use crate::config::{LogConfig, TimestampType, TopicConfig};
use crate::index::{self, IndexEntry};
use crate::manifest::{self, Manifest};
use crate::ownership;
use crate::partition::{LoadedChunk, Partition, Serving, TailEntry};
use crate::producer::{ProducerStates, SeqCheck};
use crate::wal::{self, WalEntry};
use crate::writer::{self, PendingAppend, WriterContext, WriterQueue};
use crate::{LogError, LogResult};

/// How long a produce waits for durability, from the request's acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// acks=0: do not wait (the append is still queued and written).
    None,
    /// acks=1 or acks=-1: wait until the batches are durable in storage. With no replicas
    /// besides the storage itself the two mean the same thing.
    Durable { timeout: Duration },
}

/// The result of a successful append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Offset given to the first record of the first batch.
    pub base_offset: Offset,
    /// Broker time stamped on the batches when the topic uses LogAppendTime, else -1.
    pub log_append_time: i64,
    pub log_start_offset: Offset,
}

/// An append whose offsets are assigned; `wait` for it to become durable.
#[derive(Debug)]
pub struct AppendTicket {
    waits: Vec<oneshot::Receiver<LogResult<()>>>,
    /// A retried batch found queued but not yet durable: answer only once the high watermark
    /// passes this offset (one past its last), or a retry would acknowledge undurable data.
    durable_at: Option<(watch::Receiver<Offset>, i64)>,
    deadline: tokio::time::Instant,
    outcome: AppendOutcome,
}

impl AppendTicket {
    /// Resolves once every batch of the append is durable (at once for acks=0), or fails with
    /// the reason one was not (Timeout if the deadline passed first).
    pub async fn wait(self) -> LogResult<AppendOutcome> {
        for rx in self.waits {
            match tokio::time::timeout_at(self.deadline, rx).await {
                Err(_) => return Err(LogError::Timeout),
                Ok(Err(_)) => return Err(LogError::ShuttingDown),
                Ok(Ok(result)) => result?,
            }
        }
        if let Some((mut hw, end)) = self.durable_at {
            match tokio::time::timeout_at(self.deadline, hw.wait_for(|hw| hw.0 >= end)).await {
                Err(_) => return Err(LogError::Timeout),
                Ok(Err(_)) => return Err(LogError::ShuttingDown),
                Ok(Ok(_)) => {}
            }
        }
        Ok(self.outcome)
    }
}

/// A topic to create: its name, partition count (None = the default) and config overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    pub name: String,
    pub partitions: Option<i32>,
    pub overrides: BTreeMap<String, String>,
}

/// A partition's bounds as readers see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    pub log_start: Offset,
    /// One past the last durable offset: readers never see beyond it.
    pub high: Offset,
}

/// Record batches read from a partition, as stored (the client's bytes, base offset rewritten).
#[derive(Debug, Clone, Default)]
pub struct ReadOutcome {
    pub batches: Vec<Bytes>,
    pub watermarks: Option<Watermarks>,
}

type PartitionMap = HashMap<TopicPartition, Arc<Partition>>;

/// State shared by the manager, the writer's publish callback and background tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Arc<dyn ObjectStore>,
    pub clock: Arc<dyn Clock>,
    pub config: LogConfig,
    pub stream: u32,
    pub broker: BrokerId,
    pub mode: Ownership,
    /// Turns true once this broker's stream was sealed by another: nothing more is served.
    pub fenced: watch::Sender<bool>,
    pub catalog: RwLock<CatalogState>,
    pub topics: RwLock<BTreeMap<String, Arc<TopicInfo>>>,
    pub partitions: RwLock<PartitionMap>,
    pub cache: TailCache,
    pub queue: Arc<WriterQueue>,
    pub pending_bytes: Arc<Semaphore>,
    /// Slots for decompressing compressed batches to check them (`max_concurrent_decompressions`).
    pub decompressions: Arc<Semaphore>,
    /// Write-ahead objects still holding uncompacted batches: (stream, seq) -> live batches.
    pub wal_live: Mutex<BTreeMap<(u32, u64), usize>>,
    /// The newest sequence this stream published, and an unreferenced object at that sequence
    /// whose deletion waits: a stream's newest object is never deleted, because a broker that
    /// seals the stream finds the writer's position by listing it.
    pub wal_newest: Mutex<(u64, Option<u64>)>,
    pub producer_ids: tokio::sync::Mutex<ProducerIdBlock>,
    /// Serialises catalog changes made by this broker.
    pub catalog_lock: tokio::sync::Mutex<()>,
}

/// Who decides which partitions this broker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// A broker alone on its storage: it serves every partition of every topic.
    All,
    /// A cluster member: the coordination layer calls `acquire` and `release`.
    Managed,
}

impl Shared {
    pub fn partition(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        read(&self.partitions).get(tp).cloned()
    }

    pub fn topics_snapshot(&self) -> Vec<Arc<TopicInfo>> {
        read(&self.topics).values().cloned().collect()
    }

    pub fn partitions_snapshot(&self) -> Vec<Arc<Partition>> {
        read(&self.partitions).values().cloned().collect()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<TopicInfo>> {
        read(&self.topics).get(name).cloned()
    }
}

#[derive(Debug, Default)]
pub(crate) struct ProducerIdBlock {
    next: i64,
    end: i64,
}

const PRODUCER_ID_BLOCK: i64 = 1000;
const PRODUCER_ID_PREFIX: &str = "meta/producer-ids/";
const STREAM_PREFIX: &str = "meta/streams/";

/// The log layer of one broker.
#[derive(Debug)]
pub struct LogManager {
    shared: Arc<Shared>,
    give_up: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    writer_task: Mutex<Option<JoinHandle<()>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    broker: BrokerId,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    match m.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    match m.write() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl LogManager {
    /// Opens the log on `store`: loads the catalog, recovers every partition (replaying
    /// write-ahead objects not yet compacted) and starts the group-commit writer and the
    /// background compaction and retention tasks.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        config: LogConfig,
        broker: BrokerId,
    ) -> LogResult<Arc<Self>> {
        Self::open_with(store, clock, config, broker, Ownership::All).await
    }

    /// Opens the log; with `Ownership::Managed` no partition is served until `acquire`.
    pub async fn open_with(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        config: LogConfig,
        broker: BrokerId,
        mode: Ownership,
    ) -> LogResult<Arc<Self>> {
        let catalog_state = catalog::load_latest(store.as_ref()).await?;
        let stream = register_stream(store.as_ref(), broker, clock.as_ref()).await?;
        tracing::info!(
            stream,
            catalog_version = catalog_state.version,
            "opening log"
        );

        let topics = catalog_state
            .topics
            .iter()
            .map(|(name, info)| (name.clone(), Arc::new(info.clone())))
            .collect::<BTreeMap<_, _>>();
        let shared = Arc::new(Shared {
            store: store.clone(),
            clock: clock.clone(),
            pending_bytes: Arc::new(Semaphore::new(config.max_pending_bytes)),
            decompressions: Arc::new(Semaphore::new(config.max_concurrent_decompressions.max(1))),
            cache: TailCache::new(config.cache_bytes),
            config,
            stream,
            broker,
            mode,
            fenced: watch::channel(false).0,
            catalog: RwLock::new(catalog_state),
            topics: RwLock::new(topics),
            partitions: RwLock::new(HashMap::new()),
            queue: Arc::new(WriterQueue::default()),
            wal_live: Mutex::new(BTreeMap::new()),
            wal_newest: Mutex::new((0, None)),
            producer_ids: tokio::sync::Mutex::new(ProducerIdBlock::default()),
            catalog_lock: tokio::sync::Mutex::new(()),
        });

        if mode == Ownership::All {
            // Alone on the storage: fence every earlier incarnation's stream (so the collector
            // may clean them up), then take every partition over, replaying whatever they left
            // uncompacted.
            let mut others = std::collections::BTreeSet::new();
            for meta in shared.store.list(wal::PREFIX).await? {
                if let Some((s, _)) = wal::parse_key(meta.key.as_str()) {
                    if s != stream {
                        others.insert(s);
                    }
                }
            }
            for s in others {
                wal::seal_stream(
                    shared.store.as_ref(),
                    s,
                    broker,
                    shared.clock.wall_millis(),
                    shared.config.max_inflight_flushes,
                )
                .await?;
            }
            let topics = read(&shared.topics).clone();
            for (tp, result) in
                ownership::acquire(&shared, ownership::missing(&shared, &topics)).await?
            {
                result.map_err(|e| {
                    tracing::error!(partition = %tp, error = %e, "cannot serve partition");
                    e
                })?;
            }
        }

        let (give_up, give_up_rx) = watch::channel(false);
        let (stop, stop_rx) = watch::channel(false);
        let publish_shared = shared.clone();
        let fenced_shared = shared.clone();
        let ctx = WriterContext {
            store,
            clock,
            queue: shared.queue.clone(),
            stream,
            flush_bytes: shared.config.flush_bytes,
            flush_interval: shared.config.flush_interval,
            max_inflight: shared.config.max_inflight_flushes,
            on_durable: Arc::new(move |seq, object, items| {
                publish(&publish_shared, seq, object, items)
            }),
            give_up: give_up_rx,
            on_fenced: Arc::new(move || {
                fenced_shared.fenced.send_replace(true);
            }),
        };
        let writer_task = tokio::spawn(writer::run(ctx));
        let tasks = vec![tokio::spawn(crate::maintenance::run(
            shared.clone(),
            stop_rx,
        ))];
        Ok(Arc::new(Self {
            shared,
            give_up,
            stop,
            writer_task: Mutex::new(Some(writer_task)),
            tasks: Mutex::new(tasks),
            broker,
        }))
    }

    pub fn config(&self) -> &LogConfig {
        &self.shared.config
    }

    pub fn broker(&self) -> BrokerId {
        self.broker
    }

    /// Bytes currently held by the tail cache.
    pub fn cache_used(&self) -> usize {
        self.shared.cache.used()
    }

    /// All topics, sorted by name.
    pub fn topics(&self) -> Vec<Arc<TopicInfo>> {
        read(&self.shared.topics).values().cloned().collect()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<TopicInfo>> {
        read(&self.shared.topics).get(name).cloned()
    }

    pub fn topic_by_id(&self, id: TopicId) -> Option<Arc<TopicInfo>> {
        read(&self.shared.topics)
            .values()
            .find(|t| t.id == id)
            .cloned()
    }

    /// Creates a topic. `partitions` None = the default count. With `validate_only` nothing is
    /// written. Errors: TopicAlreadyExists, InvalidTopic, InvalidPartitions, InvalidConfig.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: Option<i32>,
        overrides: BTreeMap<String, String>,
        validate_only: bool,
    ) -> LogResult<Arc<TopicInfo>> {
        let spec = NewTopic {
            name: name.to_string(),
            partitions,
            overrides,
        };
        self.create_topics(vec![spec], validate_only)
            .await?
            .pop()
            .unwrap_or(Err(LogError::UnknownTopicOrPartition))
    }

    /// Creates several topics with one catalog change, so the catalog is written once however
    /// many topics a request names (each change rewrites the whole catalog: one change per
    /// topic made a request naming n topics write O(n²) bytes). Returns one result per spec,
    /// in order; a topic that fails validation or already exists does not stop the others.
    /// A failed catalog write fails them all (the outer error).
    pub async fn create_topics(
        &self,
        specs: Vec<NewTopic>,
        validate_only: bool,
    ) -> LogResult<Vec<LogResult<Arc<TopicInfo>>>> {
        let mut results: Vec<LogResult<Arc<TopicInfo>>> = specs
            .into_iter()
            .map(|spec| self.new_topic_info(spec).map(Arc::new))
            .collect();
        // Known to exist already: refused without a catalog write (checked again under the
        // change, against the newest catalog).
        for result in &mut results {
            if let Ok(info) = result {
                if self.topic(&info.name).is_some() {
                    *result = Err(LogError::TopicAlreadyExists(info.name.to_string()));
                }
            }
        }
        if validate_only {
            return Ok(results);
        }
        let wanted: Vec<(usize, Arc<TopicInfo>)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.as_ref().ok().cloned()?)))
            .collect();
        if wanted.is_empty() {
            return Ok(results);
        }
        let taken = self
            .change_catalog(|cat| {
                // Recomputed on every attempt: a lost race re-runs this on the newer catalog.
                let mut taken = std::collections::HashSet::new();
                for (i, info) in &wanted {
                    if cat.topics.contains_key(&*info.name) {
                        taken.insert(*i);
                    } else {
                        cat.topics.insert(info.name.to_string(), (**info).clone());
                    }
                }
                Ok(taken)
            })
            .await?;
        for (i, result) in results.iter_mut().enumerate() {
            if let Ok(info) = result {
                if taken.contains(&i) {
                    *result = Err(LogError::TopicAlreadyExists(info.name.to_string()));
                } else {
                    tracing::info!(topic = %info.name, partitions = info.partitions,
                        id = %info.id, "created topic");
                }
            }
        }
        Ok(results)
    }

    /// A new topic's catalog entry, validated.
    fn new_topic_info(&self, spec: NewTopic) -> LogResult<TopicInfo> {
        catalog::validate_topic_name(&spec.name)?;
        let count = spec
            .partitions
            .unwrap_or(self.shared.config.default_partitions);
        if count < 1 {
            return Err(LogError::InvalidPartitions(format!(
                "a topic needs at least one partition, got {count}"
            )));
        }
        if count > MAX_PARTITIONS {
            return Err(LogError::InvalidPartitions(format!(
                "at most {MAX_PARTITIONS} partitions per topic, got {count}"
            )));
        }
        let config = TopicConfig::from_overrides(&spec.overrides)?;
        Ok(TopicInfo {
            name: spec.name.into(),
            id: TopicId::random(),
            partitions: count,
            overrides: spec.overrides,
            config,
        })
    }

    /// Deletes a topic and, in the background, its data.
    pub async fn delete_topic(&self, name: &str) -> LogResult<()> {
        let removed = self
            .change_catalog(|cat| {
                cat.topics
                    .remove(name)
                    .ok_or(LogError::UnknownTopicOrPartition)
            })
            .await?;
        tracing::info!(topic = name, id = %removed.id, "deleted topic");
        Ok(())
    }

    /// Raises a topic's partition count to `total` (InvalidPartitions if not larger).
    pub async fn create_partitions(
        &self,
        name: &str,
        total: i32,
        validate_only: bool,
    ) -> LogResult<()> {
        let check = |info: &TopicInfo| {
            if total <= info.partitions {
                return Err(LogError::InvalidPartitions(format!(
                    "topic {name} has {} partitions; the new count {total} must be larger",
                    info.partitions
                )));
            }
            if total > MAX_PARTITIONS {
                return Err(LogError::InvalidPartitions(format!(
                    "at most {MAX_PARTITIONS} partitions per topic, got {total}"
                )));
            }
            Ok(())
        };
        let current = self.topic(name).ok_or(LogError::UnknownTopicOrPartition)?;
        check(&current)?;
        if validate_only {
            return Ok(());
        }
        self.change_catalog(|cat| {
            let t = cat
                .topics
                .get_mut(name)
                .ok_or(LogError::UnknownTopicOrPartition)?;
            check(t)?;
            t.partitions = total;
            Ok(())
        })
        .await
    }

    /// Replaces a topic's overrides wholesale (AlterConfigs semantics).
    pub async fn set_topic_configs(
        &self,
        name: &str,
        overrides: BTreeMap<String, String>,
        validate_only: bool,
    ) -> LogResult<()> {
        let config = TopicConfig::from_overrides(&overrides)?;
        if self.topic(name).is_none() {
            return Err(LogError::UnknownTopicOrPartition);
        }
        if validate_only {
            return Ok(());
        }
        self.change_catalog(|cat| {
            let t = cat
                .topics
                .get_mut(name)
                .ok_or(LogError::UnknownTopicOrPartition)?;
            t.overrides = overrides.clone();
            t.config = config.clone();
            Ok(())
        })
        .await
    }

    /// Changes individual overrides (IncrementalAlterConfigs): Some = set, None = delete
    /// (back to default).
    pub async fn alter_topic_configs(
        &self,
        name: &str,
        changes: Vec<(String, Option<String>)>,
        validate_only: bool,
    ) -> LogResult<()> {
        let apply = |overrides: &mut BTreeMap<String, String>| -> LogResult<TopicConfig> {
            for (k, v) in &changes {
                match v {
                    Some(v) => {
                        overrides.insert(k.clone(), v.clone());
                    }
                    None => {
                        if !crate::config::TOPIC_CONFIG_NAMES.contains(&k.as_str()) {
                            return Err(LogError::InvalidConfig(format!(
                                "unknown or unsupported topic config {k:?}"
                            )));
                        }
                        overrides.remove(k);
                    }
                }
            }
            TopicConfig::from_overrides(overrides)
        };
        let current = self.topic(name).ok_or(LogError::UnknownTopicOrPartition)?;
        apply(&mut current.overrides.clone())?;
        if validate_only {
            return Ok(());
        }
        self.change_catalog(|cat| {
            let t = cat
                .topics
                .get_mut(name)
                .ok_or(LogError::UnknownTopicOrPartition)?;
            let mut overrides = t.overrides.clone();
            t.config = apply(&mut overrides)?;
            t.overrides = overrides;
            Ok(())
        })
        .await
    }

    /// Applies a catalog change durably, then brings topics and partitions in line with it.
    async fn change_catalog<F, T>(&self, change: F) -> LogResult<T>
    where
        F: FnMut(&mut CatalogState) -> LogResult<T>,
    {
        let _serial = self.shared.catalog_lock.lock().await;
        let current = read(&self.shared.catalog).clone();
        let (next, out) = catalog::update(self.shared.store.as_ref(), current, change).await?;
        self.apply_catalog(next).await?;
        Ok(out)
    }

    async fn apply_catalog(&self, next: CatalogState) -> LogResult<()> {
        let shared = &self.shared;
        let old_topics: BTreeMap<String, Arc<TopicInfo>> = read(&shared.topics).clone();
        // Deleted topics first (a topic re-created under the same name has a new id): drop
        // their partitions and delete their data in the background.
        for (name, old) in &old_topics {
            if next.topics.get(name).is_some_and(|t| t.id == old.id) {
                continue;
            }
            let gone: Vec<Arc<Partition>> = {
                let mut parts = write(&shared.partitions);
                (0..old.partitions)
                    .filter_map(|p| parts.remove(&TopicPartition::new(name.as_str(), p)))
                    .collect()
            };
            for part in gone {
                let tail: Vec<TailEntry> = {
                    let mut st = part.lock();
                    st.serving = Serving::Gone;
                    st.tail.drain(..).collect()
                };
                for key in release_wal(shared, &tail) {
                    spawn_delete(shared, key);
                }
            }
            let store = shared.store.clone();
            let prefix = manifest::topic_prefix(old.id);
            tokio::spawn(async move {
                if let Err(e) = delete_prefix(store.as_ref(), &prefix).await {
                    tracing::warn!(%prefix, error = %e, "deleting a removed topic's data failed; it stays as garbage");
                }
            });
        }
        let topics: BTreeMap<String, Arc<TopicInfo>> = next
            .topics
            .iter()
            .map(|(name, info)| {
                let same = old_topics.get(name).filter(|t| ***t == *info).cloned();
                (name.clone(), same.unwrap_or_else(|| Arc::new(info.clone())))
            })
            .collect();
        *write(&shared.topics) = topics.clone();
        *write(&shared.catalog) = next;
        // New partitions (new topics or raised counts): a broker alone serves them at once;
        // in a cluster the coordination layer decides who acquires them.
        if shared.mode == Ownership::All {
            for (tp, result) in
                ownership::acquire(shared, ownership::missing(shared, &topics)).await?
            {
                if let Err(e) = result {
                    tracing::warn!(partition = %tp, error = %e, "could not serve a new partition");
                }
            }
        }
        Ok(())
    }

    fn partition(&self, tp: &TopicPartition) -> LogResult<Arc<Partition>> {
        let p = self.partition_readable(tp)?;
        if p.lock().serving.is_suspended() {
            return Err(LogError::NotOwner);
        }
        Ok(p)
    }

    /// [`Self::partition`], but also a partition suspended by [`Self::suspend_writes`]: its
    /// data below the high watermark is durable and never rewritten, so it can still be read.
    fn partition_readable(&self, tp: &TopicPartition) -> LogResult<Arc<Partition>> {
        if let Some(p) = self.shared.partition(tp) {
            let st = p.lock();
            if !st.serving.is_readable() {
                return Err(LogError::NotOwner);
            }
            drop(st);
            return Ok(p);
        }
        match self.topic(&tp.topic) {
            Some(t) if tp.partition >= 0 && tp.partition < t.partitions => Err(LogError::NotOwner),
            _ => Err(LogError::UnknownTopicOrPartition),
        }
    }

    /// Whether this broker serves reads of the partition now (also while appends are suspended
    /// by [`Self::suspend_writes`]), and under which epoch.
    pub fn readable_epoch(&self, tp: &TopicPartition) -> Option<u64> {
        self.shared
            .partition(tp)
            .filter(|p| p.lock().serving.is_readable())
            .map(|p| p.epoch())
    }

    /// Whether this broker serves the partition now, and under which epoch.
    pub fn served_epoch(&self, tp: &TopicPartition) -> Option<u64> {
        self.shared
            .partition(tp)
            .filter(|p| !p.lock().serving.is_suspended())
            .map(|p| p.epoch())
    }

    /// Partitions served here.
    pub fn served(&self) -> Vec<(TopicPartition, u64)> {
        read(&self.shared.partitions)
            .values()
            .filter(|p| !p.lock().serving.is_suspended())
            .map(|p| (p.tp.clone(), p.epoch()))
            .collect()
    }

    /// This incarnation's write-ahead stream id.
    pub fn stream(&self) -> u32 {
        self.shared.stream
    }

    /// Turns true if another broker fenced this one (sealed its stream): from then on nothing
    /// can be acknowledged, and the broker should stop and start afresh.
    pub fn fenced(&self) -> watch::Receiver<bool> {
        self.shared.fenced.subscribe()
    }

    /// Takes partitions over (cluster mode): fence the previous owner if it did not release,
    /// replay its uncompacted tail, claim the manifest under `epoch`. No record data is copied
    /// from the previous owner; the partition's data stays where it is in storage.
    pub async fn acquire(
        &self,
        wanted: Vec<(String, i32, u64)>,
    ) -> LogResult<Vec<(TopicPartition, LogResult<()>)>> {
        // A broker paused past its lease can come back, see itself alive (its next heartbeat
        // succeeds) and be given partitions again before anything tells it that a successor
        // sealed its stream. Claiming then would seal the successor in turn and advertise us as
        // leader of partitions we can no longer write. So look first; a takeover is rare
        // enough for one listing of our own stream.
        if !wanted.is_empty() && self.is_sealed().await? {
            tracing::error!(
                stream = self.shared.stream,
                "refusing to take partitions over: a successor sealed our write-ahead stream"
            );
            self.shared.fenced.send_replace(true);
            return Err(LogError::Fenced);
        }
        let mut list = Vec::new();
        let mut results = Vec::new();
        for (topic, partition, epoch) in wanted {
            match self.topic(&topic) {
                Some(info) if partition >= 0 && partition < info.partitions => {
                    list.push(ownership::Acquire {
                        topic: info,
                        partition,
                        epoch: Some(epoch),
                    })
                }
                _ => results.push((
                    TopicPartition::new(topic, partition),
                    Err(LogError::UnknownTopicOrPartition),
                )),
            }
        }
        results.extend(ownership::acquire(&self.shared, list).await?);
        Ok(results)
    }

    /// Hands a partition over gracefully; returns its final high watermark.
    pub async fn release(&self, tp: &TopicPartition) -> LogResult<Offset> {
        ownership::release(&self.shared, tp).await
    }

    /// Stops serving a partition at once, without flushing or checkpointing: ownership is in
    /// doubt (our lease may have lapsed) or lost. Appends and reads are refused from now on;
    /// appends already queued still become durable. The state is kept: `acquire` under the
    /// same epoch resumes it, and if another broker took over instead, it sealed our stream and
    /// nothing more can be acknowledged here anyway.
    pub fn abandon(&self, tp: &TopicPartition) {
        if let Some(part) = self.shared.partition(tp) {
            let hw = {
                let mut st = part.lock();
                if st.serving != Serving::Gone {
                    st.serving = Serving::Suspended { readable: false };
                }
                st.high_watermark
            };
            part.hw.send_replace(Offset(hw));
            tracing::warn!(partition = %tp, "stopped serving partition (ownership in doubt)");
        }
    }

    /// Stops accepting appends to a partition at once but keeps serving reads: our own lease
    /// is in doubt (our heartbeats stopped landing, typically because the storage refuses
    /// writes), while nobody is known to hold the partition instead. Appends already queued
    /// still become durable. Data below the high watermark is durable, immutable and exactly
    /// what a successor replays at the same offsets, so reading it is safe (docs/ARCHITECTURE.md,
    /// "Storage full or failing"). `acquire` under the same epoch resumes appends; `abandon`
    /// stops the reads too.
    pub fn suspend_writes(&self, tp: &TopicPartition) {
        if let Some(part) = self.shared.partition(tp) {
            {
                let mut st = part.lock();
                if matches!(
                    st.serving,
                    Serving::Gone | Serving::Suspended { readable: false }
                ) {
                    return;
                }
                st.serving = Serving::Suspended { readable: true };
            }
            tracing::warn!(partition = %tp, "refusing appends to partition (our lease is in doubt); reads still served");
        }
    }

    /// Whether another broker has sealed this incarnation's stream (looked up in storage, not
    /// waited for): a broker that was paused past its lease checks this before claiming
    /// anything again, instead of learning it from its next write.
    pub async fn is_sealed(&self) -> LogResult<bool> {
        let listed = self
            .shared
            .store
            .list(&wal::stream_prefix(self.shared.stream))
            .await?;
        // A seal sits after the last object the writer landed, with late writes of its
        // in-flight window possibly above it: look at that many of the newest objects.
        let window = self.shared.config.max_inflight_flushes + 2;
        for meta in listed.iter().rev().take(window) {
            match self.shared.store.get(&meta.key).await {
                Ok((bytes, _)) if wal::is_seal(&bytes) => return Ok(true),
                Ok(_) | Err(StorageError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }

    /// Re-reads the catalog (topics created or deleted by other brokers).
    pub async fn refresh_catalog(&self) -> LogResult<()> {
        // The cluster's ownership rounds call this several times a second: one listing while
        // nothing changed, the read only when a newer version is listed.
        let newest = catalog::newest_version(self.shared.store.as_ref()).await?;
        if newest.is_none_or(|newest| newest <= read(&self.shared.catalog).version) {
            return Ok(());
        }
        let latest = catalog::load_latest(self.shared.store.as_ref()).await?;
        let _serial = self.shared.catalog_lock.lock().await;
        if latest.version > read(&self.shared.catalog).version {
            self.apply_catalog(latest).await?;
        }
        Ok(())
    }

    /// Appends the record batches of one produce partition (raw bytes as the client sent
    /// them). Validates every batch (framing, magic 2, CRC, size, producer sequence) before
    /// accepting any, assigns dense offsets and, unless `acks` is None, returns only once the
    /// data is durable.
    pub async fn append(
        &self,
        tp: &TopicPartition,
        records: Bytes,
        acks: Acks,
    ) -> LogResult<AppendOutcome> {
        self.enqueue(tp, records, acks).await?.wait().await
    }

    /// The first half of [`Self::append`]: validates, assigns offsets and queues the batches
    /// for the group commit, then returns a ticket to wait for durability with. Offsets are
    /// assigned in the order `enqueue` calls complete, so a caller that must keep its requests
    /// in order (a connection's pipelined produces) enqueues them one after another and waits
    /// for them concurrently.
    pub async fn enqueue(
        &self,
        tp: &TopicPartition,
        records: Bytes,
        acks: Acks,
    ) -> LogResult<AppendTicket> {
        let shared = &self.shared;
        let part = self.partition_readable(tp)?;
        if part.lock().serving.is_suspended() {
            // Kept readable while our lease is in doubt: say why appends are refused. The
            // storage refusing our heartbeats is the usual cause, and the client retries.
            shared.queue.check_accepting()?;
            return Err(LogError::Storage(StorageError::Unavailable(
                "ownership in doubt: this broker's heartbeats are not landing in storage".into(),
            )));
        }
        let topic = self
            .topic(&tp.topic)
            .ok_or(LogError::UnknownTopicOrPartition)?;
        let batches = wire_batch::split_batches(&records)?;
        if batches.is_empty() {
            return Err(LogError::InvalidRequest(
                "produce with no record batch".into(),
            ));
        }
        let max = topic.config.max_message_bytes.max(0) as usize;
        let mut max_timestamps = Vec::with_capacity(batches.len());
        let mut compressed = Vec::new();
        for (i, b) in batches.iter().enumerate() {
            if b.encoded_len() > max {
                return Err(LogError::MessageTooLarge {
                    size: b.encoded_len(),
                    max,
                });
            }
            if b.is_transactional() || b.is_control() {
                return Err(LogError::TransactionsUnsupported);
            }
            wire_batch::validate_client_batch(b)?;
            // Like Kafka, trust the records over the header for an uncompressed batch's max
            // timestamp: it drives retention and timestamp lookups.
            max_timestamps.push(match wire_batch::validate_records(b)? {
                RecordsCheck::Verified { max_timestamp } => max_timestamp,
                RecordsCheck::Compressed => {
                    compressed.push(i);
                    b.max_timestamp()
                }
            });
        }
        if !compressed.is_empty() {
            let views = compressed.iter().map(|i| batches[*i].clone()).collect();
            let limit = shared.config.max_decompressed_batch_bytes.max(max) as u64;
            let checks = check_compressed(&shared.decompressions, views, limit).await?;
            for (i, check) in compressed.iter().zip(checks) {
                if let RecordsCheck::Verified { max_timestamp } = check {
                    max_timestamps[*i] = max_timestamp;
                }
            }
        }
        shared.queue.check_accepting()?;

        // Backpressure: hold the request's bytes against the broker-wide in-flight budget.
        let timeout = match acks {
            Acks::Durable { timeout } => timeout,
            Acks::None => Duration::from_secs(30),
        };
        let want = records
            .len()
            .clamp(1, shared.config.max_pending_bytes.max(1)) as u32;
        let permit = match tokio::time::timeout(
            timeout,
            shared.pending_bytes.clone().acquire_many_owned(want),
        )
        .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(LogError::ShuttingDown),
            Err(_) => return Err(LogError::Backpressure),
        };

        let log_append_time = match topic.config.timestamp_type {
            TimestampType::LogAppendTime => Some(shared.clock.wall_millis()),
            TimestampType::CreateTime => None,
        };
        let now = shared.clock.monotonic();
        let mut waits = Vec::new();
        let mut durable_at: Option<(watch::Receiver<Offset>, i64)> = None;
        let (first_base, log_start) = {
            let mut st = part.lock();
            // Suspended since the check above: refused like a handover racing the append.
            if st.serving != Serving::Active {
                return Err(LogError::NotOwner);
            }
            let decisions = check_producers(&st.producers, &batches)?;
            for (b, decision) in batches.iter().zip(&decisions) {
                if let SeqCheck::Duplicate { base_offset } = decision {
                    let end = base_offset + b.last_offset_delta() as i64 + 1;
                    if end > st.high_watermark {
                        let later = durable_at.as_ref().map_or(0, |(_, e)| *e).max(end);
                        durable_at = Some((part.hw.subscribe(), later));
                    }
                }
            }
            let mut first_base = None;
            let mut permit = Some(permit);
            let appended = decisions.iter().filter(|d| **d == SeqCheck::Append).count();
            let mut seen = 0;
            for ((b, decision), max_ts) in batches.iter().zip(decisions).zip(&max_timestamps) {
                if let SeqCheck::Duplicate { base_offset } = decision {
                    first_base.get_or_insert(base_offset);
                    continue;
                }
                seen += 1;
                let base_offset = st.next_offset;
                first_base.get_or_insert(base_offset);
                let stored = wire_batch::rewrite_for_append(
                    b,
                    base_offset,
                    part.epoch() as i32,
                    log_append_time,
                );
                st.next_offset += b.last_offset_delta() as i64 + 1;
                if b.producer_id() >= 0 {
                    st.producers.record(
                        b.producer_id(),
                        b.producer_epoch(),
                        b.base_sequence(),
                        b.record_count(),
                        base_offset,
                    );
                }
                let done = match acks {
                    Acks::None => None,
                    Acks::Durable { .. } => {
                        let (tx, rx) = oneshot::channel();
                        waits.push(rx);
                        Some(tx)
                    }
                };
                let entry = WalEntry {
                    topic_id: part.topic_id,
                    partition: tp.partition,
                    base_offset,
                    last_offset_delta: b.last_offset_delta() as u32,
                    position: 0,
                    length: 0,
                    max_timestamp: log_append_time.unwrap_or(*max_ts),
                    producer_id: b.producer_id(),
                    producer_epoch: b.producer_epoch(),
                    base_sequence: b.base_sequence(),
                    record_count: b.record_count(),
                };
                let (header, body) = stored.into_parts();
                shared.queue.push(
                    PendingAppend {
                        partition: part.clone(),
                        entry,
                        parts: [header, body],
                        done,
                        // The last batch carries the budget, so it is freed once all are durable.
                        permit: if seen == appended {
                            permit.take()
                        } else {
                            None
                        },
                    },
                    now,
                );
            }
            (first_base.unwrap_or(st.next_offset), st.log_start)
        };

        Ok(AppendTicket {
            waits,
            durable_at,
            deadline: tokio::time::Instant::now() + timeout,
            outcome: AppendOutcome {
                base_offset: Offset(first_base),
                log_append_time: log_append_time.unwrap_or(-1),
                log_start_offset: Offset(log_start),
            },
        })
    }

    /// Reads batches starting with the one containing `offset`, up to `max_bytes` (the first
    /// batch is returned whole even if larger, as Kafka does, when `min_one_batch`).
    /// OffsetOutOfRange if `offset` is below the log start or above the high watermark.
    pub async fn read(
        &self,
        tp: &TopicPartition,
        offset: Offset,
        max_bytes: usize,
        min_one_batch: bool,
    ) -> LogResult<ReadOutcome> {
        let part = self.partition_readable(tp)?;
        crate::read::read(&self.shared, &part, offset.0, max_bytes, min_one_batch).await
    }

    pub fn watermarks(&self, tp: &TopicPartition) -> LogResult<Watermarks> {
        let part = self.partition_readable(tp)?;
        let st = part.lock();
        Ok(Watermarks {
            log_start: Offset(st.log_start),
            high: Offset(st.high_watermark),
        })
    }

    /// A channel whose value is the partition's high watermark; long-poll fetches wait on it.
    pub fn subscribe(&self, tp: &TopicPartition) -> LogResult<watch::Receiver<Offset>> {
        Ok(self.partition_readable(tp)?.hw.subscribe())
    }

    /// The earliest offset whose record timestamp is >= `timestamp`, with that timestamp;
    /// None when every record is older.
    pub async fn offset_for_timestamp(
        &self,
        tp: &TopicPartition,
        timestamp: i64,
    ) -> LogResult<Option<(Offset, i64)>> {
        let part = self.partition_readable(tp)?;
        crate::read::offset_for_timestamp(&self.shared, &part, timestamp).await
    }

    /// The largest timestamp in the partition and its offset (ListOffsets MAX_TIMESTAMP).
    pub async fn max_timestamp(&self, tp: &TopicPartition) -> LogResult<Option<(Offset, i64)>> {
        let part = self.partition_readable(tp)?;
        crate::read::max_timestamp(&self.shared, &part).await
    }

    /// Moves the log start to `before` (None = the high watermark). Returns the new log start.
    pub async fn delete_records(
        &self,
        tp: &TopicPartition,
        before: Option<Offset>,
    ) -> LogResult<Offset> {
        let part = self.partition(tp)?;
        crate::maintenance::delete_records(&self.shared, &part, before.map(|o| o.0)).await
    }

    /// Allocates a new idempotent producer id (unique across restarts and brokers) with
    /// epoch 0. Ids come in blocks claimed by create-only writes, so brokers sharing the
    /// storage never hand out the same id.
    pub async fn init_producer_id(&self) -> LogResult<(i64, i16)> {
        let mut block = self.shared.producer_ids.lock().await;
        if block.next >= block.end {
            let store = self.shared.store.as_ref();
            let mut candidate = match store.list(PRODUCER_ID_PREFIX).await?.last() {
                Some(meta) => parse_tail_number(meta.key.as_str()).map_or(0, |n| n + 1),
                None => 0,
            };
            loop {
                let key = ObjectKey::new(format!("{PRODUCER_ID_PREFIX}{candidate:020}"))?;
                match store.put(&key, Bytes::new(), PutMode::Create).await {
                    Ok(_) => break,
                    Err(StorageError::AlreadyExists(_)) => candidate += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            block.next = candidate as i64 * PRODUCER_ID_BLOCK;
            block.end = block.next + PRODUCER_ID_BLOCK;
        }
        let id = block.next;
        block.next += 1;
        Ok((id, 0))
    }

    /// Runs the garbage collector once (it also runs with retention); returns objects deleted.
    pub async fn collect_garbage(&self) -> LogResult<usize> {
        crate::maintenance::collect_garbage(&self.shared).await
    }

    /// Runs one compaction of `tp` now, as the maintenance task would (including what it does
    /// when the pass finds this broker deposed), whether or not it is due.
    #[cfg(test)]
    pub(crate) async fn compact_now(&self, tp: &TopicPartition) -> LogResult<()> {
        let part = self.partition(tp)?;
        crate::maintenance::compact_now(&self.shared, &part).await
    }

    /// Simulates a crash: stops every task at once without flushing or compacting.
    #[cfg(test)]
    pub(crate) fn abort_for_test(&self) {
        self.shared.queue.close();
        if let Some(w) = lock(&self.writer_task).take() {
            w.abort();
        }
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }

    /// Stops accepting appends, flushes everything queued and compacts every partition, so a
    /// restart has nothing to replay.
    pub async fn shutdown(&self) -> LogResult<()> {
        self.shared.queue.close();
        let writer = lock(&self.writer_task).take();
        if let Some(mut handle) = writer {
            // Storage may be down: bound the wait, then let pending appends fail.
            if tokio::time::timeout(Duration::from_secs(30), &mut handle)
                .await
                .is_err()
            {
                let _ = self.give_up.send(true);
                let _ = handle.await;
            }
        }
        let _ = self.stop.send(true);
        let tasks: Vec<JoinHandle<()>> = lock(&self.tasks).drain(..).collect();
        for t in tasks {
            let _ = t.await;
        }
        let parts: Vec<Arc<Partition>> = read(&self.shared.partitions).values().cloned().collect();
        let mut first_error = None;
        for part in parts {
            if let Err(e) = crate::maintenance::compact(&self.shared, &part).await {
                tracing::warn!(partition = %part.tp, error = %e, "final compaction failed; the tail will be replayed at start-up");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A topic with more partitions than this is almost certainly a typo.
const MAX_PARTITIONS: i32 = 100_000;

/// Decompresses compressed batches to check their records, on a blocking thread: a batch can
/// take milliseconds of CPU, which must not stall the connection tasks sharing the runtime's
/// workers (the CRC and the uncompressed walk stay inline: they read each byte once, at memory
/// speed). `slots` bounds how many run at once.
async fn check_compressed(
    slots: &Arc<Semaphore>,
    batches: Vec<BatchView>,
    limit: u64,
) -> LogResult<Vec<RecordsCheck>> {
    let _slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| LogError::ShuttingDown)?;
    let checked = tokio::task::spawn_blocking(move || {
        batches
            .iter()
            .map(|b| strata_wire::validate_compressed_records(b, limit))
            .collect::<Result<Vec<_>, _>>()
    })
    .await;
    match checked {
        Ok(result) => Ok(result?),
        // Only a panic inside a decompressor gets here (the runtime is not shutting down while
        // a request is served): the batch is what it choked on.
        Err(e) => Err(LogError::CorruptMessage(
            wire_batch::BatchError::InvalidRecords(format!("decompression failed: {e}")),
        )),
    }
}

/// Checks every idempotent batch of one append against a scratch copy of the producers'
/// state, so that either all batches are acceptable or none is appended.
fn check_producers(states: &ProducerStates, batches: &[BatchView]) -> LogResult<Vec<SeqCheck>> {
    let mut scratch: Option<ProducerStates> = None;
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let (pid, epoch, seq, count) = (
            b.producer_id(),
            b.producer_epoch(),
            b.base_sequence(),
            b.record_count(),
        );
        if pid < 0 {
            out.push(SeqCheck::Append);
            continue;
        }
        let view = scratch.as_ref().unwrap_or(states);
        let decision = view.check(pid, epoch, seq, count)?;
        if decision == SeqCheck::Append && batches.len() > 1 {
            scratch
                .get_or_insert_with(|| states.clone())
                .record(pid, epoch, seq, count, 0);
        }
        out.push(decision);
    }
    Ok(out)
}

fn parse_tail_number(key: &str) -> Option<u64> {
    key.rsplit('/').next()?.parse().ok()
}

/// Claims a new write-ahead stream id for this broker incarnation (create-only, so two
/// brokers, or a broker and its restarted self, never share one).
async fn register_stream(
    store: &dyn ObjectStore,
    broker: BrokerId,
    clock: &dyn Clock,
) -> LogResult<u32> {
    let mut candidate = match store.list(STREAM_PREFIX).await?.last() {
        Some(meta) => parse_hex_tail(meta.key.as_str()).map_or(1, |n| n + 1),
        None => 1,
    };
    loop {
        let key = ObjectKey::new(format!("{STREAM_PREFIX}{candidate:08x}"))?;
        let body = serde_json::json!({ "broker": broker.0, "started_ms": clock.wall_millis() });
        match store
            .put(&key, Bytes::from(body.to_string()), PutMode::Create)
            .await
        {
            Ok(_) => return Ok(candidate),
            Err(StorageError::AlreadyExists(_)) => candidate += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

fn parse_hex_tail(key: &str) -> Option<u32> {
    u32::from_str_radix(key.rsplit('/').next()?, 16).ok()
}

pub(crate) async fn read_manifest(
    shared: &Shared,
    topic: TopicId,
    partition: i32,
) -> LogResult<(Manifest, Option<strata_storage::Version>)> {
    let key = ObjectKey::new(manifest::manifest_key(topic, partition))?;
    match shared.store.get(&key).await {
        Ok((bytes, version)) => {
            let m: Manifest = serde_json::from_slice(&bytes)
                .map_err(|e| LogError::CorruptStorage(format!("manifest {key}: {e}")))?;
            Ok((m, Some(version)))
        }
        Err(StorageError::NotFound(_)) => Ok((Manifest::default(), None)),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn write_partitions(shared: &Shared) -> std::sync::RwLockWriteGuard<'_, PartitionMap> {
    write(&shared.partitions)
}

/// Publishes a durable group: runs on the writer task, in sequence order.
fn publish(shared: &Arc<Shared>, seq: u64, object: &Bytes, items: Vec<(PendingAppend, WalEntry)>) {
    let now = shared.clock.monotonic();
    let mut live = 0usize;
    let mut admitted = Vec::with_capacity(items.len());
    for (item, entry) in items {
        let part = item.partition.clone();
        // The cache shares the write-ahead object's buffer: no copy per batch.
        let bytes = object.slice(entry.position as usize..(entry.position + entry.length) as usize);
        let hw = {
            let mut st = part.lock();
            if st.serving == Serving::Gone {
                None
            } else {
                let tail = TailEntry {
                    base_offset: entry.base_offset,
                    last_offset: entry.last_offset(),
                    max_timestamp: entry.max_timestamp,
                    stream: shared.stream,
                    seq,
                    position: entry.position,
                    length: entry.length,
                    producer_id: entry.producer_id,
                    producer_epoch: entry.producer_epoch,
                    base_sequence: entry.base_sequence,
                    record_count: entry.record_count,
                };
                st.tail.push_back(tail);
                st.tail_bytes += entry.length as usize;
                st.tail_since.get_or_insert(now);
                st.cache.push_back(CachedBatch {
                    base_offset: tail.base_offset,
                    last_offset: tail.last_offset,
                    bytes: bytes.clone(),
                });
                st.high_watermark = tail.last_offset + 1;
                live += 1;
                Some(st.high_watermark)
            }
        };
        if let Some(hw) = hw {
            part.hw.send_replace(Offset(hw));
            admitted.push((part, entry.base_offset, bytes.len()));
        }
        if let Some(done) = item.done {
            let _ = done.send(if hw.is_some() {
                Ok(())
            } else {
                Err(LogError::UnknownTopicOrPartition)
            });
        }
        drop(item.permit);
    }
    if live > 0 {
        lock(&shared.wal_live).insert((shared.stream, seq), live);
    }
    // This object is now the stream's newest: one held back as the previous newest may go.
    let deferred = {
        let mut newest = lock(&shared.wal_newest);
        newest.0 = seq;
        let previous = newest.1.take();
        if live == 0 {
            newest.1 = Some(seq);
        }
        previous
    };
    if let Some(old) = deferred {
        spawn_delete(shared, wal::key(shared.stream, old));
    }
    for (part, base, len) in admitted {
        shared.cache.admitted(&part, base, len);
    }
}

/// Drops the references a partition's compacted (or deleted) tail held on write-ahead
/// objects; returns the keys of objects nothing references any more.
#[must_use]
pub(crate) fn release_wal(shared: &Shared, entries: &[TailEntry]) -> Vec<String> {
    let mut freed = Vec::new();
    {
        let mut live = lock(&shared.wal_live);
        // Another stream's objects may hold other brokers' partitions: the collector, which
        // reads their manifests, decides when those can go.
        for e in entries.iter().filter(|e| e.stream == shared.stream) {
            if let Some(n) = live.get_mut(&(e.stream, e.seq)) {
                *n -= 1;
                if *n == 0 {
                    live.remove(&(e.stream, e.seq));
                    let mut newest = lock(&shared.wal_newest);
                    if e.seq >= newest.0 {
                        newest.1 = Some(e.seq);
                    } else {
                        freed.push(wal::key(e.stream, e.seq));
                    }
                }
            }
        }
    }
    freed
}

fn spawn_delete(shared: &Shared, key: String) {
    let store = shared.store.clone();
    tokio::spawn(async move {
        let Ok(k) = ObjectKey::new(&key) else { return };
        if let Err(e) = store.delete(&k).await {
            tracing::warn!(%key, error = %e, "deleting an unreferenced object failed; it stays as garbage");
        }
    });
}

pub(crate) async fn delete_prefix(store: &dyn ObjectStore, prefix: &str) -> LogResult<()> {
    for meta in store.list(prefix).await? {
        store.delete(&meta.key).await?;
    }
    Ok(())
}

/// Reads one stored range of a write-ahead object or segment.
pub(crate) async fn read_range(
    store: &dyn ObjectStore,
    key: &str,
    position: u32,
    length: u32,
) -> LogResult<Bytes> {
    let key = ObjectKey::new(key)?;
    let start = position as u64;
    let bytes = store.get_range(&key, start..start + length as u64).await?;
    if bytes.len() != length as usize {
        return Err(LogError::CorruptStorage(format!(
            "{key}: wanted {length} bytes at {position}, got {}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Loads index chunk `k` of a partition (from memory, else storage; missing = empty).
pub(crate) async fn load_chunk(
    shared: &Shared,
    part: &Partition,
    k: i64,
) -> LogResult<LoadedChunk> {
    if let Some(c) = part.lock().chunks.get(&k) {
        return Ok(c.clone());
    }
    load_chunk_from_storage(shared, part, k).await
}

/// Loads index chunk `k` from storage, bypassing (and refreshing) the in-memory copy: for a
/// writer whose compare-and-swap found the cached version stale.
pub(crate) async fn load_chunk_from_storage(
    shared: &Shared,
    part: &Partition,
    k: i64,
) -> LogResult<LoadedChunk> {
    let key = ObjectKey::new(manifest::chunk_key(part.topic_id, part.tp.partition, k))?;
    let chunk = match shared.store.get(&key).await {
        Ok((bytes, version)) => {
            let (stamp, entries) = index::decode_chunk(&bytes)?;
            LoadedChunk {
                entries: Arc::new(entries),
                stamp,
                version: Some(version),
            }
        }
        Err(StorageError::NotFound(_)) => LoadedChunk {
            entries: Arc::new(Vec::new()),
            stamp: index::ChunkStamp::default(),
            version: None,
        },
        Err(e) => return Err(e.into()),
    };
    part.lock().remember_chunk(k, chunk.clone());
    Ok(chunk)
}

pub(crate) fn concat(parts: &[Bytes]) -> Bytes {
    let mut buf = BytesMut::with_capacity(parts.iter().map(|b| b.len()).sum());
    for p in parts {
        buf.extend_from_slice(p);
    }
    buf.freeze()
}

pub(crate) fn index_entry_for(
    tail: &TailEntry,
    segment: index::SegmentRef,
    position: u32,
) -> IndexEntry {
    IndexEntry {
        base_offset: tail.base_offset,
        last_offset_delta: (tail.last_offset - tail.base_offset) as u32,
        length: tail.length,
        position,
        segment,
        max_timestamp: tail.max_timestamp,
    }
}
