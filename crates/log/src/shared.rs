//! The state every part of the log shares (the manager, the writer's publish callback, the
//! background tasks): the storage, the catalog and partitions served, the tail cache, the
//! writer queue and write-ahead bookkeeping; and the small helpers they all use.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use bytes::{Bytes, BytesMut};
use strata_core::{BrokerId, Clock, TopicPartition};
use strata_storage::{ObjectKey, ObjectStore};
use tokio::sync::{watch, Semaphore};

use crate::cache::TailCache;
use crate::catalog::{CatalogState, TopicInfo};
use crate::config::LogConfig;
use crate::partition::{Partition, TailEntry};
use crate::producer::ProducerIdBlock;
use crate::wal;
use crate::writer::WriterQueue;

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
    /// Streams the collector found retired (sealed, nothing but markers below the seal) whose
    /// registration it could not delete (the highest stays): stream -> the sequence numbers
    /// of those markers. A pass that lists nothing else for the stream reads nothing of it.
    pub retired_streams: Mutex<HashMap<u32, BTreeSet<u64>>>,
    /// Other streams whose newest object the collector found to be data, not a seal: stream
    /// -> (that newest sequence, whether the objects below it were searched for a seal too).
    /// A live writer's stream changes between passes; a sealed one whose deposed writer's
    /// late writes landed above the seal does not, and is searched once (see
    /// `maintenance::find_end_seal`).
    pub unsealed_tops: Mutex<HashMap<u32, (u64, bool)>>,
    /// What takeovers read of the streams they sealed, for a takeover's later batches.
    pub sealed_streams: crate::ownership::SealedStreams,
    pub producer_ids: tokio::sync::Mutex<ProducerIdBlock>,
    /// Serialises catalog changes made by this broker.
    pub catalog_lock: tokio::sync::Mutex<()>,
    /// Cleaning passes running at once (`cleaner_threads`).
    pub cleaner_slots: Semaphore,
    /// Partitions a cleaner task has picked, so two tasks never clean one partition.
    pub cleaning_now: Mutex<std::collections::HashSet<TopicPartition>>,
    /// Keys of cleaned segments written by a pass not yet recorded in its manifest: the
    /// collector must not take them for orphans.
    pub cleaner_inflight: Mutex<std::collections::HashSet<String>>,
    /// Names cleaned segments uniquely within this process (with the claim and stream).
    pub cleaner_generation: std::sync::atomic::AtomicU32,
    pub cleaner_stats: crate::cleaner::CleanerStats,
    pub tiering_stats: crate::tiering::TieringStats,
    /// Catch-up reads of segments: kept windows, read-ahead and their IO budget.
    pub read_ahead: Arc<crate::read_ahead::ReadAhead>,
    /// Where reads were served from (`strata_log_reads_total{source}`).
    pub read_stats: crate::read::ReadStats,
    pub txn_stats: crate::txn::TxnStats,
    /// Partitions taken over whose replayed tail still waits for its first compaction.
    pub replayed: crate::maintenance::ReplayedQueue,
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
    /// A fresh generation for a cleaned segment's name (never 0, which marks compaction's).
    pub fn next_cleaner_generation(&self) -> u32 {
        self.cleaner_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .max(1)
    }

    pub fn partition(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        read_lock(&self.partitions).get(tp).cloned()
    }

    pub fn topics_snapshot(&self) -> Vec<Arc<TopicInfo>> {
        read_lock(&self.topics).values().cloned().collect()
    }

    pub fn partitions_snapshot(&self) -> Vec<Arc<Partition>> {
        read_lock(&self.partitions).values().cloned().collect()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<TopicInfo>> {
        read_lock(&self.topics).get(name).cloned()
    }
}

pub(crate) fn lock_mutex<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

pub(crate) fn read_lock<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    match m.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

pub(crate) fn write_lock<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    match m.write() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

pub(crate) fn write_partitions(shared: &Shared) -> std::sync::RwLockWriteGuard<'_, PartitionMap> {
    write_lock(&shared.partitions)
}

/// Drops the references a partition's compacted (or deleted) tail held on write-ahead
/// objects; returns the keys of objects nothing references any more.
#[must_use]
pub(crate) fn release_wal(shared: &Shared, entries: &[TailEntry]) -> Vec<String> {
    let mut freed = Vec::new();
    {
        let mut live = lock_mutex(&shared.wal_live);
        // Another stream's objects may hold other brokers' partitions: the collector, which
        // reads their manifests, decides when those can go.
        for e in entries.iter().filter(|e| e.stream == shared.stream) {
            if let Some(n) = live.get_mut(&(e.stream, e.seq)) {
                *n -= 1;
                if *n == 0 {
                    live.remove(&(e.stream, e.seq));
                    let mut newest = lock_mutex(&shared.wal_newest);
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

pub(crate) fn spawn_delete(shared: &Shared, key: String) {
    let store = shared.store.clone();
    tokio::spawn(async move {
        let Ok(k) = ObjectKey::new(&key) else { return };
        if let Err(e) = store.delete(&k).await {
            tracing::warn!(%key, error = %e, "deleting an unreferenced object failed; it stays as garbage");
        }
    });
}

pub(crate) fn concat(parts: &[Bytes]) -> Bytes {
    let mut buf = BytesMut::with_capacity(parts.iter().map(|b| b.len()).sum());
    for p in parts {
        buf.extend_from_slice(p);
    }
    buf.freeze()
}
