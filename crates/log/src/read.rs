//! The fetch path: from the tail cache when the reader keeps up, from write-ahead objects for
//! the uncompacted tail, and through the fixed-size index into segments for everything older.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use strata_core::Offset;
use strata_core::TopicPartition;
use strata_storage::{ObjectKey, ObjectStore, StorageError};
use tokio::sync::watch;

use crate::index::{self, IndexEntry};
use crate::manager::LogManager;
use crate::manifest;
use crate::partition::LoadedChunk;
use crate::partition::{Partition, TailEntry};
use crate::producer::ProducerSummary;
use crate::shared::Shared;
use crate::txn::Isolation;
use crate::wal;
use crate::{LogError, LogResult};

/// A partition's bounds as readers see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    pub log_start: Offset,
    /// One past the last durable offset: readers never see beyond it.
    pub high: Offset,
    /// Kafka's last stable offset: the first offset of the oldest transaction still open (its
    /// marker not yet durable), or the high watermark; never below the log start.
    pub last_stable: Offset,
}

/// Record batches read from a partition, as stored (the client's bytes, base offset rewritten).
#[derive(Debug, Clone, Default)]
pub struct ReadOutcome {
    pub batches: Vec<Bytes>,
    pub watermarks: Option<Watermarks>,
    /// For a read_committed read: the aborted transactions (producer id, first offset) the
    /// returned batches overlap. None for read_uncommitted.
    pub aborted: Option<Vec<(i64, i64)>>,
}

/// Adds batches to a response while they fit; the first always fits when `min_one`.
struct Budget {
    max: usize,
    used: usize,
    min_one: bool,
}

impl Budget {
    fn admits(&self, len: usize) -> bool {
        self.used + len <= self.max || (self.used == 0 && self.min_one)
    }
    fn take(&mut self, len: usize) {
        self.used += len;
    }
}

enum Plan {
    Done(Vec<Bytes>),
    Tail(Vec<TailEntry>),
    Index,
}

pub(crate) async fn read(
    shared: &Shared,
    part: &Arc<Partition>,
    offset: i64,
    max_bytes: usize,
    min_one: bool,
    isolation: Isolation,
) -> LogResult<ReadOutcome> {
    let mut outcome = read_upto(shared, part, offset, max_bytes, min_one, isolation).await?;
    if isolation == Isolation::ReadCommitted {
        let Some(wm) = outcome.watermarks else {
            return Ok(outcome);
        };
        // Batches never straddle the last stable offset (it is a batch's first offset or
        // the high watermark), so dropping the batches from it on leaves whole batches.
        let stable = wm.last_stable.0;
        outcome
            .batches
            .retain(|b| strata_wire::read_batch_header(b).is_some_and(|h| h.base_offset < stable));
        let end = outcome
            .batches
            .last()
            .and_then(|b| strata_wire::read_batch_header(b))
            .map(|h| h.last_offset() + 1);
        outcome.aborted = Some(match end {
            Some(end) => part.lock().txns.aborted_between(offset, end),
            None => Vec::new(),
        });
    }
    Ok(outcome)
}

async fn read_upto(
    shared: &Shared,
    part: &Arc<Partition>,
    offset: i64,
    max_bytes: usize,
    min_one: bool,
    isolation: Isolation,
) -> LogResult<ReadOutcome> {
    let mut budget = Budget {
        max: max_bytes,
        used: 0,
        min_one,
    };
    let (plan, wm) = {
        let st = part.lock();
        let wm = Watermarks {
            log_start: Offset(st.log_start),
            high: Offset(st.high_watermark),
            last_stable: Offset(st.last_stable()),
        };
        let end = match isolation {
            Isolation::ReadUncommitted => st.high_watermark,
            Isolation::ReadCommitted => wm.last_stable.0,
        };
        if offset < st.log_start || offset > st.high_watermark {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start: st.log_start,
                high_watermark: st.high_watermark,
            });
        }
        let from_cache = if st.cache.front().is_some_and(|c| c.base_offset <= offset) {
            let mut out = Vec::new();
            let mut i = st.cache.partition_point(|c| c.last_offset < offset);
            let mut expect = None;
            while let Some(c) = st.cache.get(i) {
                if expect.is_some_and(|e| e != c.base_offset) || !budget.admits(c.bytes.len()) {
                    break;
                }
                budget.take(c.bytes.len());
                out.push(c.bytes.clone());
                expect = Some(c.last_offset + 1);
                i += 1;
            }
            out
        } else {
            Vec::new()
        };
        let plan = if offset >= end {
            Plan::Done(Vec::new())
        } else if !from_cache.is_empty() {
            Plan::Done(from_cache)
        } else if offset >= st.checkpoint() {
            let i = st.tail.partition_point(|t| t.last_offset < offset);
            let mut out = Vec::new();
            for t in st.tail.iter().skip(i) {
                if !budget.admits(t.length as usize) {
                    break;
                }
                budget.take(t.length as usize);
                out.push(*t);
            }
            Plan::Tail(out)
        } else {
            Plan::Index
        };
        (plan, wm)
    };
    match &plan {
        Plan::Done(b) if !b.is_empty() => shared.read_stats.cache.fetch_add(1, Ordering::Relaxed),
        Plan::Done(_) => 0,
        Plan::Tail(_) => shared.read_stats.wal.fetch_add(1, Ordering::Relaxed),
        Plan::Index => shared.read_stats.segments.fetch_add(1, Ordering::Relaxed),
    };
    let batches = match plan {
        Plan::Done(b) => b,
        Plan::Tail(entries) => read_tail(shared, &entries).await?,
        Plan::Index => match read_indexed(shared, part, offset, &mut budget).await? {
            Some(batches) => batches,
            None => {
                // The cleaner removed every batch from `offset` to the checkpoint: the next
                // surviving one is in the tail (or nothing is, yet).
                let checkpoint = part.lock().checkpoint();
                return Box::pin(read_upto(
                    shared, part, checkpoint, max_bytes, min_one, isolation,
                ))
                .await;
            }
        },
    };
    Ok(ReadOutcome {
        batches,
        watermarks: Some(wm),
        aborted: None,
    })
}

/// Counts of partition reads by where their batches came from: the tail cache (memory), the
/// write-ahead objects of the uncompacted tail, or segments found through the index (both in
/// storage). Reads with nothing to return are not counted.
#[derive(Debug, Default)]
pub struct ReadStats {
    pub cache: AtomicU64,
    pub wal: AtomicU64,
    pub segments: AtomicU64,
}

/// A reading of [`ReadStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadSnapshot {
    pub cache: u64,
    pub wal: u64,
    pub segments: u64,
}

impl ReadStats {
    pub fn snapshot(&self) -> ReadSnapshot {
        ReadSnapshot {
            cache: self.cache.load(Ordering::Relaxed),
            wal: self.wal.load(Ordering::Relaxed),
            segments: self.segments.load(Ordering::Relaxed),
        }
    }
}

/// Reads tail batches from their write-ahead objects, one ranged read per run of adjacent
/// batches in the same object.
async fn read_tail(shared: &Shared, entries: &[TailEntry]) -> LogResult<Vec<Bytes>> {
    let mut out = Vec::with_capacity(entries.len());
    let mut i = 0;
    while i < entries.len() {
        let first = entries[i];
        let mut j = i + 1;
        let mut end = first.position + first.length;
        while j < entries.len()
            && entries[j].stream == first.stream
            && entries[j].seq == first.seq
            && entries[j].position == end
        {
            end += entries[j].length;
            j += 1;
        }
        let key = wal::key(first.stream, first.seq);
        let run = read_range(
            shared.store.as_ref(),
            &key,
            first.position,
            end - first.position,
        )
        .await?;
        for e in &entries[i..j] {
            let from = (e.position - first.position) as usize;
            out.push(run.slice(from..from + e.length as usize));
        }
        i = j;
    }
    Ok(out)
}

/// Finds `offset` through the index and reads a run of batches of one segment. None when no
/// indexed batch below the checkpoint reaches `offset` (the cleaner removed them all).
///
/// Offsets are not dense below the checkpoint of a compacted topic: the search finds the first
/// batch whose last offset reaches `offset`, so an offset cleaned away reads as the next
/// surviving batch. A segment the cleaner replaced may vanish between reading its chunk and
/// reading it; the chunk is then re-read once (the cleaner rewrote it before deleting).
async fn read_indexed(
    shared: &Shared,
    part: &Arc<Partition>,
    offset: i64,
    budget: &mut Budget,
) -> LogResult<Option<Vec<Bytes>>> {
    match read_indexed_once(shared, part, offset, budget).await {
        Err(LogError::Storage(e)) if e.is_not_found() => {
            part.lock().chunks.clear();
            match read_indexed_once(shared, part, offset, budget).await {
                // Retention removed the segment between our bounds check and the read.
                Err(LogError::Storage(e)) if e.is_not_found() => {
                    let st = part.lock();
                    Err(LogError::OffsetOutOfRange {
                        offset,
                        log_start: st.log_start,
                        high_watermark: st.high_watermark,
                    })
                }
                other => other,
            }
        }
        other => other,
    }
}

async fn read_indexed_once(
    shared: &Shared,
    part: &Arc<Partition>,
    offset: i64,
    budget: &mut Budget,
) -> LogResult<Option<Vec<Bytes>>> {
    let span = shared.config.index_chunk_span;
    let mut k = index::chunk_of(offset, span);
    let checkpoint = part.lock().checkpoint();
    let last_chunk = index::chunk_of(checkpoint.max(1) - 1, span);
    // The batch holding `offset` may have started in the previous chunk, but only if no batch
    // of this chunk starts at or before it (batches never overlap). Checking that first keeps
    // a cold lookup to one chunk read; the previous chunk is read only for offsets before the
    // first batch that starts in this one (about one in span / batch size).
    let mut next = if k <= last_chunk {
        Some(load_chunk(shared, part, k).await?)
    } else {
        None
    };
    let covered = next
        .as_ref()
        .and_then(|c| c.entries.first())
        .is_some_and(|e| e.base_offset <= offset);
    if k > 0 && !covered {
        let prev = load_chunk(shared, part, k - 1).await?;
        if prev
            .entries
            .last()
            .is_some_and(|l| l.last_offset() >= offset)
        {
            k -= 1;
            next = Some(prev);
        }
    }
    while k <= last_chunk {
        let chunk = match next.take() {
            Some(chunk) => chunk,
            None => load_chunk(shared, part, k).await?,
        };
        // Entries at or past the checkpoint are not the manifest's: a compaction whose
        // manifest update never landed, or a deposed owner, wrote them. Never read those.
        let found = index::find_at_or_after(&chunk.entries, offset)
            .filter(|&i| chunk.entries[i].base_offset < checkpoint);
        if let Some(i) = found {
            let first = chunk.entries[i];
            let mut j = i + 1;
            let mut end = first.position + first.length;
            if !budget.admits(first.length as usize) {
                return Ok(Some(Vec::new()));
            }
            budget.take(first.length as usize);
            while let Some(e) = chunk.entries.get(j) {
                if e.segment != first.segment
                    || e.base_offset >= checkpoint
                    || e.position != end
                    || !budget.admits(e.length as usize)
                {
                    break;
                }
                budget.take(e.length as usize);
                end += e.length;
                j += 1;
            }
            let key = manifest::segment_key(part.topic_id, part.tp.partition, first.segment);
            // The size only matters to windows: without them, no second lock of the partition.
            let size = if shared.read_ahead.windows_on() {
                part.lock().segment_size(first.segment, first.base_offset)
            } else {
                None
            };
            let run = shared
                .read_ahead
                .read(
                    &shared.store,
                    &shared.clock,
                    &key,
                    size,
                    first.position,
                    end,
                )
                .await?;
            return Ok(Some(
                chunk.entries[i..j]
                    .iter()
                    .map(|e| {
                        let from = (e.position - first.position) as usize;
                        run.slice(from, e.length as usize)
                    })
                    .collect(),
            ));
        }
        k += 1;
    }
    let st = part.lock();
    let cleaned = st.manifest.cleaning.is_some()
        || st.manifest.segments.iter().any(|s| s.cleaned_at.is_some());
    if cleaned {
        Ok(None)
    } else {
        Err(LogError::CorruptStorage(format!(
            "{}: offset {offset} is below the checkpoint {checkpoint} but not in the index",
            part.tp
        )))
    }
}

/// A located batch, for timestamp searches.
struct Located {
    base_offset: i64,
    max_timestamp: i64,
    bytes: Bytes,
}

pub(crate) async fn offset_for_timestamp(
    shared: &Shared,
    part: &Arc<Partition>,
    timestamp: i64,
) -> LogResult<Option<(Offset, i64)>> {
    let Some(found) = first_batch_reaching(shared, part, timestamp).await? else {
        return Ok(None);
    };
    let log_start = part.lock().log_start;
    let (offset, ts) = strata_wire::builder::first_record_at_or_after(&found.bytes, timestamp)
        .unwrap_or((found.base_offset, found.max_timestamp));
    Ok(Some((Offset(offset.max(log_start)), ts)))
}

pub(crate) async fn max_timestamp(
    shared: &Shared,
    part: &Arc<Partition>,
) -> LogResult<Option<(Offset, i64)>> {
    let best = {
        let st = part.lock();
        let segs = st.manifest.segments.iter().map(|s| s.max_timestamp);
        let tail = st.tail.iter().map(|t| t.max_timestamp);
        segs.chain(tail).max()
    };
    match best {
        None => Ok(None),
        Some(ts) => offset_for_timestamp(shared, part, ts).await,
    }
}

/// The first batch (at or after the log start) whose max timestamp reaches `timestamp`.
async fn first_batch_reaching(
    shared: &Shared,
    part: &Arc<Partition>,
    timestamp: i64,
) -> LogResult<Option<Located>> {
    let (segment, tail_hit, log_start) = {
        let st = part.lock();
        let segment = st
            .manifest
            .segments
            .iter()
            .find(|s| s.last_offset >= st.log_start && s.max_timestamp >= timestamp)
            .copied();
        let tail_hit = st
            .tail
            .iter()
            .find(|t| t.last_offset >= st.log_start && t.max_timestamp >= timestamp)
            .copied();
        (segment, tail_hit, st.log_start)
    };
    if let Some(seg) = segment {
        let span = shared.config.index_chunk_span;
        let from = seg.segment.base_offset.max(log_start);
        for k in index::chunk_of(from, span)..=index::chunk_of(seg.last_offset, span) {
            let chunk = load_chunk(shared, part, k).await?;
            let hit = chunk.entries.iter().find(|e| {
                e.last_offset() >= from
                    && e.base_offset <= seg.last_offset
                    && e.max_timestamp >= timestamp
            });
            if let Some(e) = hit {
                let key = manifest::segment_key(part.topic_id, part.tp.partition, e.segment);
                let bytes = read_range(shared.store.as_ref(), &key, e.position, e.length).await?;
                return Ok(Some(Located {
                    base_offset: e.base_offset,
                    max_timestamp: e.max_timestamp,
                    bytes,
                }));
            }
        }
    }
    if let Some(t) = tail_hit {
        let cached = part.lock().cached(t.base_offset);
        let bytes = match cached {
            Some(b) => b,
            None => {
                read_range(
                    shared.store.as_ref(),
                    &wal::key(t.stream, t.seq),
                    t.position,
                    t.length,
                )
                .await?
            }
        };
        return Ok(Some(Located {
            base_offset: t.base_offset,
            max_timestamp: t.max_timestamp,
            bytes,
        }));
    }
    Ok(None)
}

// The manager's read API: each call finds the partition, then runs the fetch path above.
impl LogManager {
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
        self.read_isolated(
            tp,
            offset,
            max_bytes,
            min_one_batch,
            Isolation::ReadUncommitted,
        )
        .await
    }

    /// [`Self::read`] at an isolation level: read_committed returns only batches below the
    /// last stable offset and lists the aborted transactions they overlap.
    pub async fn read_isolated(
        &self,
        tp: &TopicPartition,
        offset: Offset,
        max_bytes: usize,
        min_one_batch: bool,
        isolation: Isolation,
    ) -> LogResult<ReadOutcome> {
        let part = self.partition_readable(tp)?;
        crate::read::read(
            &self.shared,
            &part,
            offset.0,
            max_bytes,
            min_one_batch,
            isolation,
        )
        .await
    }

    pub fn watermarks(&self, tp: &TopicPartition) -> LogResult<Watermarks> {
        let part = self.partition_readable(tp)?;
        let st = part.lock();
        Ok(Watermarks {
            log_start: Offset(st.log_start),
            high: Offset(st.high_watermark),
            last_stable: Offset(st.last_stable()),
        })
    }

    /// Bytes of record batches the partition holds, from its own accounting (no storage
    /// read): the compacted segments that still reach past the log start, plus the durable
    /// tail not yet compacted. Like Kafka's partition size, which counts whole segment files,
    /// a segment the log start has moved into counts whole until retention drops it.
    pub fn partition_size(&self, tp: &TopicPartition) -> LogResult<u64> {
        let part = self.partition_readable(tp)?;
        let st = part.lock();
        let segments: u64 = st
            .manifest
            .segments
            .iter()
            .filter(|s| s.last_offset >= st.log_start)
            .map(|s| s.size)
            .sum();
        Ok(segments.saturating_add(st.tail_bytes as u64))
    }

    /// The idempotent producers the partition keeps state for, including appends not yet
    /// durable (the state new appends are checked against).
    pub fn producers(&self, tp: &TopicPartition) -> LogResult<Vec<ProducerSummary>> {
        let part = self.partition_readable(tp)?;
        let st = part.lock();
        Ok(st.producers.summaries())
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
