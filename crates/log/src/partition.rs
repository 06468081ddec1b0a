//! In-memory state of one partition this broker serves: offsets, the uncompacted tail, the
//! cached batches, loaded index chunks and producer state. One short-held mutex guards it;
//! nothing awaits while holding it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use strata_core::{Offset, TopicPartition};
use strata_storage::Version;
use tokio::sync::watch;

use crate::cache::CachedBatch;
use crate::catalog::TopicId;
use crate::index::{ChunkStamp, IndexEntry};
use crate::manifest::Manifest;
use crate::producer::{BatchInfo, ProducerStates, TxnKind, TxnView};

/// Where a durable but not yet compacted batch lives: a range of a write-ahead object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailEntry {
    pub base_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub stream: u32,
    pub seq: u64,
    pub position: u32,
    pub length: u32,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
    pub kind: TxnKind,
}

impl TailEntry {
    pub fn info(&self) -> BatchInfo {
        BatchInfo {
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            record_count: self.record_count,
            base_offset: self.base_offset,
            max_timestamp: self.max_timestamp,
            kind: self.kind,
        }
    }
}

/// A loaded index chunk, who wrote it, and the version to compare-and-swap it against.
#[derive(Debug, Clone)]
pub struct LoadedChunk {
    pub entries: Arc<Vec<IndexEntry>>,
    pub stamp: ChunkStamp,
    pub version: Option<Version>,
}

/// Index chunks kept in memory per partition; older ones are dropped and re-read on demand.
pub const CHUNKS_KEPT: usize = 16;

/// What this broker does with a partition it holds in memory. One state, so that every path
/// that refuses appends or reads asks the same question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// Appends and reads are served.
    Active,
    /// A graceful handover is under way: appends are refused, reads still served.
    Releasing,
    /// Serving stopped without a handover (our lease was in doubt, or a newer owner deposed
    /// us). Everything is kept, so serving again under the same epoch resumes exactly here —
    /// the uncompacted tail lives in our own stream, which a fresh load would not replay.
    /// `readable`: reads below the high watermark are still served, because the suspension
    /// came from our own lease being in doubt, not from someone else holding the partition.
    Suspended { readable: bool },
    /// The topic was deleted or the partition handed over: it is leaving the partition map,
    /// and nothing more is appended to or published for it.
    Gone,
}

impl Serving {
    pub fn is_suspended(self) -> bool {
        matches!(self, Serving::Suspended { .. })
    }

    /// Reads are served: not suspended without reads. (A `Gone` partition is still read by
    /// requests that found it before it left the map.)
    pub fn is_readable(self) -> bool {
        self != Serving::Suspended { readable: false }
    }
}

#[derive(Debug)]
pub struct PartState {
    /// Next offset to assign (includes appends not yet durable).
    pub next_offset: i64,
    /// One past the last durable offset.
    pub high_watermark: i64,
    pub log_start: i64,
    /// Durable batches not yet compacted, in offset order.
    pub tail: VecDeque<TailEntry>,
    pub tail_bytes: usize,
    /// When the oldest tail entry became durable (monotonic), to trigger compaction by age.
    pub tail_since: Option<Duration>,
    /// Recent durable batches, in offset order (the tail cache's share of this partition).
    pub cache: VecDeque<CachedBatch>,
    /// Producer state including appends not yet durable: used to check new appends.
    pub producers: ProducerStates,
    /// Transactions of the durable batches: the last stable offset and aborted lists.
    pub txns: TxnView,
    pub manifest: Manifest,
    pub manifest_version: Option<Version>,
    pub chunks: BTreeMap<i64, LoadedChunk>,
    /// Whether appends and reads are served; see [`Serving`].
    pub serving: Serving,
    /// The manifest version the garbage collector last listed this partition's segments
    /// under. Orphan segments appear only with a manifest change (a compaction, a cleaning
    /// pass) or a failed pass (which clears this), so an unchanged partition is not listed
    /// again: listing every partition every pass was 10,000 listings per pass at 10,000
    /// partitions, idle or not. The inner None is a partition without a manifest yet (never
    /// compacted): it is collected once too, since nothing else leaves segments there; the
    /// outer None is "not collected since the last failure or start".
    pub segments_collected: Option<Option<Version>>,
}

#[derive(Debug)]
pub struct Partition {
    pub tp: TopicPartition,
    pub topic_id: TopicId,
    /// Ownership epoch this broker serves the partition under (the Kafka leader epoch).
    epoch: std::sync::atomic::AtomicU64,
    state: Mutex<PartState>,
    pub hw: watch::Sender<Offset>,
    /// Serialises compaction, retention and record deletion, which all replace the manifest.
    pub maintenance: tokio::sync::Mutex<()>,
}

impl Partition {
    pub fn new(tp: TopicPartition, topic_id: TopicId, epoch: u64, state: PartState) -> Self {
        let (hw, _) = watch::channel(Offset(state.high_watermark));
        Self {
            tp,
            topic_id,
            epoch: std::sync::atomic::AtomicU64::new(epoch),
            state: Mutex::new(state),
            hw,
            maintenance: tokio::sync::Mutex::new(()),
        }
    }

    /// The ownership epoch this broker serves the partition under.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Moves to a newer epoch granted to this same owner (see `ownership::acquire`).
    pub(crate) fn set_epoch(&self, epoch: u64) {
        self.epoch
            .store(epoch, std::sync::atomic::Ordering::Release);
    }

    /// Locks the state. A panic while holding the lock cannot leave offsets half-updated in a
    /// way that matters more than the panic itself, so a poisoned lock is simply taken over.
    pub fn lock(&self) -> MutexGuard<'_, PartState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Drops the cached batch at `base_offset` (called only by the cache's FIFO).
    pub fn evict_cached(&self, base_offset: i64) {
        let mut st = self.lock();
        if st
            .cache
            .front()
            .is_some_and(|c| c.base_offset == base_offset)
        {
            st.cache.pop_front();
        } else if let Ok(i) = st
            .cache
            .binary_search_by_key(&base_offset, |c| c.base_offset)
        {
            st.cache.remove(i);
        }
    }
}

impl PartState {
    pub fn fresh(manifest: Manifest, manifest_version: Option<Version>) -> Self {
        Self {
            next_offset: manifest.checkpoint,
            high_watermark: manifest.checkpoint,
            log_start: manifest.log_start,
            tail: VecDeque::new(),
            tail_bytes: 0,
            tail_since: None,
            cache: VecDeque::new(),
            producers: manifest.producers.clone(),
            txns: TxnView::from_snapshot(&manifest.producers),
            manifest,
            manifest_version,
            chunks: BTreeMap::new(),
            serving: Serving::Active,
            segments_collected: None,
        }
    }

    /// The cached bytes of the batch starting at `base_offset`, if still cached.
    pub fn cached(&self, base_offset: i64) -> Option<Bytes> {
        self.cache
            .binary_search_by_key(&base_offset, |c| c.base_offset)
            .ok()
            .map(|i| self.cache[i].bytes.clone())
    }

    /// Kafka's last stable offset (read_committed consumers read below it).
    pub fn last_stable(&self) -> i64 {
        // A transaction DeleteRecords cut into starts, for readers, at the log start (Kafka).
        self.txns
            .last_stable(self.high_watermark)
            .max(self.log_start)
    }

    pub fn checkpoint(&self) -> i64 {
        self.manifest.checkpoint
    }

    /// The stored size of `segment`, which holds `offset`, if the manifest lists it (as a
    /// segment or as a replacement of a cleaning pass in progress).
    pub fn segment_size(&self, segment: crate::index::SegmentRef, offset: i64) -> Option<u64> {
        let segments = &self.manifest.segments;
        let i = segments.partition_point(|s| s.last_offset < offset);
        let replacements = self
            .manifest
            .cleaning
            .iter()
            .flat_map(|c| c.replacements.iter());
        segments
            .get(i)
            .into_iter()
            .chain(replacements)
            .find(|s| s.segment == segment)
            .map(|s| s.size)
    }

    pub fn remember_chunk(&mut self, k: i64, chunk: LoadedChunk) {
        self.chunks.insert(k, chunk);
        while self.chunks.len() > CHUNKS_KEPT {
            // Keep the newest chunks: readers that keep up and compaction use those.
            self.chunks.pop_first();
        }
    }
}
