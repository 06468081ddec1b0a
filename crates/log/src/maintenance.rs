//! Background upkeep of partitions: compaction of the write-ahead tail into per-partition
//! segments (with their index chunks and a new manifest), retention, and record deletion.
//!
//! All three replace the manifest, so they run under the partition's maintenance lock, and
//! every replacement is a compare-and-swap: a writer that lost ownership fails instead of
//! overwriting its successor's manifest.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use strata_core::{Offset, TopicPartition};
use strata_storage::{ObjectKey, PutMode, StorageError, Version};
use tokio::sync::watch;

use crate::index::{self, ChunkStamp, IndexEntry, SegmentRef};
use crate::manager::LogManager;
use crate::manifest::read_manifest;
use crate::manifest::{self, Manifest, SegmentMeta};
use crate::partition::{LoadedChunk, Partition, Serving, TailEntry};
use crate::read::{index_entry_for, load_chunk, load_chunk_from_storage, read_range};
use crate::shared::{concat, lock_mutex, release_wal, Shared};
use crate::wal;
use crate::{LogError, LogResult};

/// Runs compaction and retention until `stop` turns true.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let tick = (shared.config.segment_interval / 4)
        .clamp(Duration::from_millis(10), Duration::from_millis(250));
    let mut last_retention = shared.clock.monotonic();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = shared.clock.sleep(tick) => {}
        }
        if *stop.borrow() {
            return;
        }
        let now = shared.clock.monotonic();
        // Without this, a takeover's kept stream copy stayed until the next takeover.
        shared.sealed_streams.expire(now);
        let parts: Vec<Arc<Partition>> = shared.partitions_snapshot();
        for part in &parts {
            let due = {
                let st = part.lock();
                !st.tail.is_empty()
                    && (st.tail_bytes >= shared.config.segment_bytes
                        || st
                            .tail_since
                            .is_some_and(|t| now >= t + shared.config.segment_interval))
            };
            if due {
                if let Err(e) = compact(&shared, part).await {
                    on_failure(&shared, part, "compaction", &e).await;
                }
            }
        }
        if now >= last_retention + shared.config.retention_check_interval {
            last_retention = now;
            for part in &parts {
                if let Err(e) = enforce_retention(&shared, part).await {
                    on_failure(&shared, part, "retention", &e).await;
                }
            }
            if let Err(e) = collect_garbage(&shared).await {
                tracing::warn!(error = %e, "garbage collection failed; will retry");
            }
        }
    }
}

/// Partitions served with a replayed tail (taken over from another stream), waiting for their
/// first compaction. A takeover queues them here instead of compacting before it serves (see
/// `ownership::acquire_pass`); [`compact_replayed`] drains the queue.
#[derive(Debug)]
pub(crate) struct ReplayedQueue {
    waiting: std::sync::Mutex<Vec<Arc<Partition>>>,
    ready: tokio::sync::Notify,
    /// Partitions queued or being compacted: back at 0 once every queued tail had its pass
    /// (a failed one is left to the maintenance task, which retries any tail that is due).
    outstanding: watch::Sender<usize>,
}

impl ReplayedQueue {
    pub(crate) fn new() -> Self {
        Self {
            waiting: std::sync::Mutex::new(Vec::new()),
            ready: tokio::sync::Notify::new(),
            outstanding: watch::channel(0).0,
        }
    }

    pub(crate) fn push(&self, parts: Vec<Arc<Partition>>) {
        if parts.is_empty() {
            return;
        }
        let n = parts.len();
        lock_mutex(&self.waiting).extend(parts);
        self.outstanding.send_modify(|c| *c += n);
        // Stores a permit when the task is busy, so a push during a drain is not missed.
        self.ready.notify_one();
    }

    fn take(&self) -> Vec<Arc<Partition>> {
        std::mem::take(&mut *lock_mutex(&self.waiting))
    }

    fn done(&self) {
        self.outstanding.send_modify(|c| *c = c.saturating_sub(1));
    }

    /// Waits until every queued partition had its compaction pass.
    pub(crate) async fn drained(&self) {
        let mut rx = self.outstanding.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we hold `self`.
        let _ = rx.wait_for(|c| *c == 0).await;
    }
}

/// Compacts the tails takeovers queued in `shared.replayed`, [`TAKEOVER_CONCURRENCY`] at a
/// time, until `stop` turns true. A partition still waiting at a stop is left to the shutdown
/// (which compacts every partition) or, after a crash, to the next owner's replay.
///
/// [`TAKEOVER_CONCURRENCY`]: crate::ownership::TAKEOVER_CONCURRENCY
pub(crate) async fn compact_replayed(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = shared.replayed.ready.notified() => {}
        }
        let parts = shared.replayed.take();
        if parts.is_empty() {
            continue;
        }
        let began = shared.clock.monotonic();
        let count = parts.len();
        let shared = &shared;
        let stop = &stop;
        futures::stream::iter(parts)
            .for_each_concurrent(
                crate::ownership::REPLAYED_COMPACTIONS_AT_ONCE,
                |part| async move {
                    if !*stop.borrow() {
                        if let Err(e) = compact(shared, &part).await {
                            on_failure(shared, &part, "compacting a replayed tail", &e).await;
                        }
                    }
                    shared.replayed.done();
                },
            )
            .await;
        let elapsed = shared.clock.monotonic().saturating_sub(began);
        tracing::info!(
            partitions = count,
            elapsed_ms = elapsed.as_millis() as u64,
            "compacted replayed tails"
        );
        if *stop.borrow() {
            return;
        }
    }
}

/// A failed compaction or retention pass. Most failures are retried at the next tick; a
/// `Fenced` one is checked against the stored manifest, and if a newer owner wrote it this
/// broker was deposed: a takeover seals the deposed owner's stream before it claims the
/// manifest, so nothing more can be acknowledged here. The partition stops serving at once and
/// the broker is told it is fenced (it exits and restarts as a new incarnation), instead of
/// answering as leader until a produce runs into the seal.
pub(crate) async fn on_failure(
    shared: &Shared,
    part: &Arc<Partition>,
    what: &str,
    error: &LogError,
) {
    // A partition we handed over (or whose topic was deleted) has a successor by design: a
    // task that was still working on it when it left is not a sign of being deposed.
    let gone = part.lock().serving == Serving::Gone;
    let deposed = match error {
        LogError::Fenced if !gone => {
            matches!(resync_manifest(shared, part).await, Err(LogError::Fenced))
        }
        _ => false,
    };
    // A failed pass may have left a segment its manifest does not list.
    part.lock().segments_collected = None;
    if deposed {
        let hw = {
            let mut st = part.lock();
            // A successor owns it: even reads of old data must go there now.
            st.serving = Serving::Suspended { readable: false };
            st.high_watermark
        };
        part.hw.send_replace(strata_core::Offset(hw));
        tracing::error!(partition = %part.tp, epoch = part.epoch(), "{what}: a newer owner took this partition over; this broker is fenced");
        shared.fenced.send_replace(true);
    } else {
        tracing::warn!(partition = %part.tp, error = %error, "{what} failed; will retry");
    }
}

/// One compaction run with the maintenance task's failure handling (for tests that play a
/// paused owner whose pass runs late).
#[cfg(test)]
pub(crate) async fn compact_now(shared: &Shared, part: &Arc<Partition>) -> LogResult<()> {
    let result = compact(shared, part).await;
    if let Err(e) = &result {
        on_failure(shared, part, "compaction", e).await;
    }
    result
}

/// Write-ahead ranges read at once when compacting batches the cache no longer holds.
const COMPACTION_READS: usize = 8;

/// Rewrites the partition's whole durable tail as segments of about `segment_bytes` each,
/// indexes them, and moves the manifest's checkpoint past them. Afterwards the write-ahead
/// objects they came from are no longer needed by this partition.
///
/// One segment per pass, not one for the whole tail: after a bulk load compaction can lag
/// the writes by hundreds of megabytes, and one giant segment (one giant fsync on a local
/// disk) would stall the group commit behind it for a second or more.
pub(crate) async fn compact(shared: &Shared, part: &Arc<Partition>) -> LogResult<()> {
    let mut freed = Vec::new();
    let result = compact_collecting(shared, part, &mut freed).await;
    delete_unreferenced(
        Arc::clone(&shared.store),
        freed,
        shared.config.wal_delete_concurrency,
    )
    .await;
    result
}

/// [`compact`], leaving the write-ahead objects it freed in `freed` for the caller to delete
/// (a handover deletes them after it released the partition, not while produce waits). The
/// manifest already moved past them, so deleting them later, or never, is safe.
pub(crate) async fn compact_collecting(
    shared: &Shared,
    part: &Arc<Partition>,
    freed: &mut Vec<String>,
) -> LogResult<()> {
    // What is durable now; batches appended meanwhile wait for the next call, so a partition
    // written faster than it compacts cannot keep one call going forever.
    let Some(target) = part.lock().tail.back().map(|e| e.last_offset) else {
        return Ok(());
    };
    loop {
        compact_pass(shared, part, freed).await?;
        let st = part.lock();
        match st.tail.front() {
            Some(front) if st.serving != Serving::Gone && front.base_offset <= target => {}
            _ => return Ok(()),
        }
    }
}

/// Compacts the oldest `segment_bytes` (at least one batch) of the tail.
async fn compact_pass(
    shared: &Shared,
    part: &Arc<Partition>,
    freed: &mut Vec<String>,
) -> LogResult<()> {
    let _serial = part.maintenance.lock().await;
    let began = shared.clock.monotonic();
    let (entries, cached, manifest, manifest_version, left_streams) = {
        let st = part.lock();
        if st.serving == Serving::Gone || st.tail.is_empty() {
            return Ok(());
        }
        let limit = shared.config.segment_bytes.max(1);
        let mut bytes = 0usize;
        let take = st
            .tail
            .iter()
            .take_while(|e| {
                let fits = bytes == 0 || bytes + e.length as usize <= limit;
                bytes += e.length as usize;
                fits
            })
            .count();
        let entries: Vec<TailEntry> = st.tail.iter().take(take).copied().collect();
        // Streams the rest of the tail still needs (only ours can be added meanwhile).
        let left_streams: BTreeSet<u32> = st.tail.iter().skip(take).map(|e| e.stream).collect();
        let cached: Vec<Option<Bytes>> = entries.iter().map(|e| st.cached(e.base_offset)).collect();
        (
            entries,
            cached,
            st.manifest.clone(),
            st.manifest_version.clone(),
            left_streams,
        )
    };

    // Gather the bytes: from the cache where still there, else from the write-ahead objects
    // (several ranges at once: a lagging compaction reads mostly uncached batches).
    let mut reads = Vec::with_capacity(entries.len());
    for (e, c) in entries.iter().zip(cached) {
        // Owned captures: futures borrowing from here would not be `Send` for every lifetime
        // the spawned maintenance task needs.
        let store = Arc::clone(&shared.store);
        let key = wal::key(e.stream, e.seq);
        let (position, length) = (e.position, e.length);
        reads.push(async move {
            match c {
                Some(b) => Ok(b),
                None => read_range(store.as_ref(), &key, position, length).await,
            }
        });
    }
    let parts: Vec<Bytes> = futures::stream::iter(reads)
        .buffered(COMPACTION_READS)
        .try_collect()
        .await?;
    // A topic whose `local.retention.*` asks for a stay on the fast tier gets its segment
    // there, named by our claim and a fresh generation like a cleaned segment (so no other
    // writer's name collides, and the collector judges it by claim); the tiering pass moves it
    // to the bulk tier later.
    let fast = shared.config.tiered
        && shared
            .topic(&part.tp.topic)
            .is_some_and(|t| t.config.fast_tier().is_some());
    let segment = if fast {
        SegmentRef {
            base_offset: entries[0].base_offset,
            stream: shared.stream,
            claim: manifest.claim,
            generation: shared.next_cleaner_generation(),
            fast: true,
        }
    } else {
        SegmentRef::compacted(entries[0].base_offset, shared.stream)
    };
    let mut position = 0u32;
    let mut new_entries = Vec::with_capacity(entries.len());
    for (e, b) in entries.iter().zip(&parts) {
        new_entries.push(index_entry_for(e, segment, position));
        position += b.len() as u32;
    }
    let gathered = shared.clock.monotonic();
    let body = concat(&parts);
    let size = body.len() as u64;
    let seg_key = ObjectKey::new(manifest::segment_key(
        part.topic_id,
        part.tp.partition,
        segment,
    ))?;
    match shared
        .store
        .put(&seg_key, body.clone(), PutMode::Create)
        .await
    {
        Ok(_) => {}
        Err(StorageError::AlreadyExists(_)) => {
            let (existing, existing_version) = shared.store.get(&seg_key).await?;
            if existing != body {
                // Our own stream wrote this key before: an earlier pass whose manifest update
                // failed, with a different run of batches. Either that update landed after all
                // (ambiguously) and the segment is now referenced, or it is an orphan only we
                // can have written; never overwrite the first.
                if resync_manifest(shared, part).await? {
                    return Ok(());
                }
                if part
                    .lock()
                    .manifest
                    .segments
                    .iter()
                    .any(|s| s.segment == segment)
                {
                    return Ok(());
                }
                // Unreferenced, and no manifest can come to reference it: ours names only what
                // this pass writes next, and a successor's copies ours. Replace it in place.
                match shared
                    .store
                    .put(&seg_key, body.clone(), PutMode::Update(existing_version))
                    .await
                {
                    Ok(_) => {}
                    Err(StorageError::Precondition(_)) => return Err(LogError::Fenced),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Err(e) => return Err(e.into()),
    }

    let segment_written = shared.clock.monotonic();
    // Index chunks: keep entries before this segment, replace anything at or after it (left
    // by an attempt whose manifest update never landed, or by a deposed owner), append the new
    // entries. Each write is fenced by the chunk's claim stamp (see `write_chunk`).
    let span = shared.config.index_chunk_span;
    let mut by_chunk: BTreeMap<i64, Vec<IndexEntry>> = BTreeMap::new();
    for e in &new_entries {
        by_chunk
            .entry(index::chunk_of(e.base_offset, span))
            .or_default()
            .push(*e);
    }
    let stamp = ChunkStamp {
        claim: manifest.claim,
        stream: shared.stream,
    };
    let mut written = Vec::new();
    for (k, fresh) in by_chunk {
        let chunk = write_chunk(shared, part, k, segment.base_offset, &fresh, stamp).await?;
        written.push((k, chunk));
    }

    let indexed = shared.clock.monotonic();
    let last = entries[entries.len() - 1];
    let mut next = manifest.clone();
    next.checkpoint = last.last_offset + 1;
    next.writer_stream = shared.stream;
    // Earlier owners' streams stay named only while the rest of the tail still reads them.
    next.inherited_streams
        .retain(|stream| left_streams.contains(stream));
    next.segments.push(SegmentMeta {
        segment,
        last_offset: last.last_offset,
        size,
        max_timestamp: entries.iter().map(|e| e.max_timestamp).max().unwrap_or(-1),
        cleaned_at: None,
    });
    for e in &entries {
        next.producers.apply(&e.info());
    }
    next.producers.prune_aborted(next.log_start);
    let version = match put_manifest(shared, part, &next, manifest_version).await {
        Ok(v) => v,
        Err(LogError::Fenced) => {
            // Someone changed the manifest since we read it: a successor (we are deposed), or
            // our own earlier update that landed although it reported a failure.
            resync_manifest(shared, part).await?;
            return Ok(());
        }
        Err(e) => return Err(e),
    };

    let manifest_written = shared.clock.monotonic();
    {
        let mut st = part.lock();
        for e in &entries {
            if st.tail.front().map(|t| t.base_offset) == Some(e.base_offset) {
                st.tail.pop_front();
                st.tail_bytes = st.tail_bytes.saturating_sub(e.length as usize);
            }
        }
        st.tail_since = if st.tail.is_empty() {
            None
        } else {
            Some(shared.clock.monotonic())
        };
        st.manifest = next;
        st.manifest_version = Some(version);
        for (k, chunk) in written {
            st.remember_chunk(k, chunk);
        }
    }
    let unreferenced = release_wal(shared, &entries);
    let ms =
        |a: std::time::Duration, b: std::time::Duration| b.saturating_sub(a).as_secs_f64() * 1e3;
    tracing::debug!(partition = %part.tp, base = segment.base_offset, last = last.last_offset, size,
        batches = entries.len(), unreferenced = unreferenced.len(),
        gather_ms = ms(began, gathered), segment_ms = ms(gathered, segment_written),
        index_ms = ms(segment_written, indexed), manifest_ms = ms(indexed, manifest_written),
        "compacted");
    freed.extend(unreferenced);
    Ok(())
}

/// Deletes write-ahead objects nothing references any more, `concurrency` at a time. One at
/// a time, a thousand of them cost seconds on a local disk (each delete syncs its directory):
/// that was most of a handover's time in the migration benchmark (issue 19).
pub(crate) async fn delete_unreferenced(
    store: Arc<dyn strata_storage::ObjectStore>,
    keys: Vec<String>,
    concurrency: usize,
) {
    futures::stream::iter(keys)
        .for_each_concurrent(concurrency.max(1), |key| {
            let store = Arc::clone(&store);
            async move {
                let Ok(k) = ObjectKey::new(&key) else { return };
                if let Err(e) = store.delete(&k).await {
                    tracing::warn!(%key, error = %e, "delete failed; the object stays as garbage");
                }
            }
        })
        .await;
}

/// How often one chunk write re-reads the chunk after losing a compare-and-swap before the
/// pass gives up (and is retried later): only a deposed owner racing us can make it lose.
const CHUNK_WRITE_ATTEMPTS: usize = 4;

/// Merges `fresh` (the entries of a new segment starting at `from`) into index chunk `k` and
/// writes it back stamped with our claim number.
///
/// The fence: a chunk stamped with a later claim than ours was written by a successor, so we
/// are deposed and write nothing (`Fenced`). Otherwise the write is a compare-and-swap on the
/// version read, so nobody's write can land between our read and our write; on a conflict the
/// chunk is re-read and the check made again. What a deposed owner can still write is a chunk
/// no successor has written yet, and then only entries at or after its own checkpoint — which
/// is where its successor's claim starts, so the successor never reads them (reads through the
/// index stop at the manifest's checkpoint) and its own first write of that chunk drops them.
async fn write_chunk(
    shared: &Shared,
    part: &Partition,
    k: i64,
    from: i64,
    fresh: &[IndexEntry],
    stamp: ChunkStamp,
) -> LogResult<LoadedChunk> {
    write_chunk_with(shared, part, k, stamp, |current| {
        let mut merged: Vec<IndexEntry> = current
            .iter()
            .filter(|e| e.last_offset() < from)
            .copied()
            .collect();
        merged.extend_from_slice(fresh);
        merged
    })
    .await
}

/// Replaces index chunk `k` by `merge` of its current entries, stamped with our claim: the
/// fence and compare-and-swap of [`write_chunk`], for compaction and the cleaner alike.
pub(crate) async fn write_chunk_with(
    shared: &Shared,
    part: &Partition,
    k: i64,
    stamp: ChunkStamp,
    merge: impl Fn(&[IndexEntry]) -> Vec<IndexEntry>,
) -> LogResult<LoadedChunk> {
    let key = ObjectKey::new(manifest::chunk_key(part.topic_id, part.tp.partition, k))?;
    let mut current = load_chunk(shared, part, k).await?;
    for _ in 0..CHUNK_WRITE_ATTEMPTS {
        if current.stamp.claim > stamp.claim {
            tracing::warn!(
                partition = %part.tp,
                chunk = k,
                ours = stamp.claim,
                theirs = current.stamp.claim,
                "index chunk written by a newer owner; this broker was deposed"
            );
            return Err(LogError::Fenced);
        }
        let merged = merge(&current.entries);
        let mode = match current.version.clone() {
            Some(v) => PutMode::Update(v),
            None => PutMode::Create,
        };
        match shared
            .store
            .put(&key, index::encode_chunk(stamp, &merged), mode)
            .await
        {
            Ok(version) => {
                return Ok(LoadedChunk {
                    entries: Arc::new(merged),
                    stamp,
                    version: Some(version),
                })
            }
            Err(StorageError::Precondition(_)) | Err(StorageError::AlreadyExists(_)) => {
                current = load_chunk_from_storage(shared, part, k).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(LogError::Storage(StorageError::Unavailable(format!(
        "index chunk {key} kept changing under {CHUNK_WRITE_ATTEMPTS} writes"
    ))))
}

/// Re-reads the partition's manifest after our view of it turned out stale. If it is still
/// ours (same claim and stream: an update of ours landed although it reported a failure), our
/// state adopts it and `true` is returned; if a successor wrote it, we are deposed: `Fenced`.
pub(crate) async fn resync_manifest(shared: &Shared, part: &Partition) -> LogResult<bool> {
    let (stored, version) = read_manifest(shared, part.topic_id, part.tp.partition).await?;
    let passed = {
        let mut st = part.lock();
        if version == st.manifest_version {
            return Ok(false);
        }
        if stored.claim != st.manifest.claim
            || stored.writer_stream != shared.stream
            || stored.released
        {
            tracing::warn!(
                partition = %part.tp,
                ours = st.manifest.claim,
                theirs = stored.claim,
                "manifest written by a newer owner; this broker was deposed"
            );
            return Err(LogError::Fenced);
        }
        if stored.checkpoint < st.manifest.checkpoint || stored.log_start < st.manifest.log_start {
            return Err(LogError::CorruptStorage(format!(
                "{}: the stored manifest went backwards (checkpoint {} < {})",
                part.tp, stored.checkpoint, st.manifest.checkpoint
            )));
        }
        let mut passed = Vec::new();
        while let Some(front) = st.tail.front().copied() {
            if front.last_offset >= stored.checkpoint {
                break;
            }
            st.tail.pop_front();
            st.tail_bytes = st.tail_bytes.saturating_sub(front.length as usize);
            passed.push(front);
        }
        st.log_start = st.log_start.max(stored.log_start);
        st.manifest = stored;
        st.manifest_version = version;
        // Cached chunks may predate what that update wrote.
        st.chunks.clear();
        tracing::info!(partition = %part.tp, checkpoint = st.manifest.checkpoint, "adopted our own manifest update that had reported a failure");
        passed
    };
    for key in release_wal(shared, &passed) {
        delete_quietly(shared, &key).await;
    }
    Ok(true)
}

async fn put_versioned(
    shared: &Shared,
    key: &str,
    body: Bytes,
    version: Option<Version>,
) -> LogResult<Version> {
    let key = ObjectKey::new(key)?;
    let mode = match version {
        Some(v) => PutMode::Update(v),
        None => PutMode::Create,
    };
    match shared.store.put(&key, body, mode).await {
        Ok(v) => Ok(v),
        Err(StorageError::Precondition(_)) | Err(StorageError::AlreadyExists(_)) => {
            Err(LogError::Fenced)
        }
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn put_manifest(
    shared: &Shared,
    part: &Partition,
    manifest: &Manifest,
    version: Option<Version>,
) -> LogResult<Version> {
    put_manifest_raw(shared, part.topic_id, part.tp.partition, manifest, version).await
}

/// Replaces a manifest by compare-and-swap (create when `version` is None). A mismatch means
/// another broker took the partition over: `Fenced`.
pub(crate) async fn put_manifest_raw(
    shared: &Shared,
    topic: crate::catalog::TopicId,
    partition: i32,
    manifest: &Manifest,
    version: Option<Version>,
) -> LogResult<Version> {
    let body = serde_json::to_vec(manifest)
        .map_err(|e| LogError::CorruptStorage(format!("encoding manifest: {e}")))?;
    put_versioned(
        shared,
        &manifest::manifest_key(topic, partition),
        Bytes::from(body),
        version,
    )
    .await
}

/// Applies retention.ms and retention.bytes to whole compacted segments.
async fn enforce_retention(shared: &Shared, part: &Arc<Partition>) -> LogResult<()> {
    let Some(topic) = shared.topic(&part.tp.topic) else {
        return Ok(());
    };
    let now = shared.clock.wall_millis();
    let _serial = part.maintenance.lock().await;
    // A pass recorded by a crashed or deposed cleaner is finished before segments may go.
    crate::cleaner::finish_pending(shared, part, None).await?;
    let (manifest, tail_bytes) = {
        let st = part.lock();
        (st.manifest.clone(), st.tail_bytes as i64)
    };
    let segs = &manifest.segments;
    let mut drop = segs
        .iter()
        .take_while(|s| s.last_offset < manifest.log_start)
        .count();
    // `compact` alone: the cleaner decides what goes, never age or size.
    let deletes = topic.config.cleanup_policy.delete;
    if deletes && topic.config.retention_ms >= 0 {
        let cutoff = now - topic.config.retention_ms;
        while drop < segs.len() && segs[drop].max_timestamp < cutoff {
            drop += 1;
        }
    }
    if deletes && topic.config.retention_bytes >= 0 {
        let mut total: i64 = segs[drop..].iter().map(|s| s.size as i64).sum::<i64>() + tail_bytes;
        while drop < segs.len() && total > topic.config.retention_bytes {
            total -= segs[drop].size as i64;
            drop += 1;
        }
    }
    if drop == 0 {
        return Ok(());
    }
    let new_start = manifest.log_start.max(segs[drop - 1].last_offset + 1);
    truncate_front(shared, part, manifest, new_start).await?;
    Ok(())
}

/// DeleteRecords: moves the log start forward (to `before`, or the high watermark).
pub(crate) async fn delete_records(
    shared: &Shared,
    part: &Arc<Partition>,
    before: Option<i64>,
) -> LogResult<strata_core::Offset> {
    let _serial = part.maintenance.lock().await;
    crate::cleaner::finish_pending(shared, part, None).await?;
    let (manifest, hw, log_start) = {
        let st = part.lock();
        (st.manifest.clone(), st.high_watermark, st.log_start)
    };
    let target = before.unwrap_or(hw);
    if target < 0 || target > hw {
        return Err(LogError::OffsetOutOfRange {
            offset: target,
            log_start,
            high_watermark: hw,
        });
    }
    if target <= log_start {
        return Ok(strata_core::Offset(log_start));
    }
    truncate_front(shared, part, manifest, target).await?;
    Ok(strata_core::Offset(target))
}

/// Records a new log start in the manifest, then deletes the segments and index chunks that
/// lie wholly below it. Deleting after the manifest update means a crash in between leaves
/// garbage, never a manifest pointing at missing data.
async fn truncate_front(
    shared: &Shared,
    part: &Arc<Partition>,
    manifest: Manifest,
    new_start: i64,
) -> LogResult<()> {
    let version = part.lock().manifest_version.clone();
    let mut next = manifest.clone();
    next.log_start = new_start;
    let (gone, kept): (Vec<SegmentMeta>, Vec<SegmentMeta>) = manifest
        .segments
        .iter()
        .partition(|s| s.last_offset < new_start);
    next.segments = kept;
    next.writer_stream = shared.stream;
    // Aborted transactions wholly below the new start can overlap no fetch any more.
    next.producers.prune_aborted(new_start);
    let new_version = put_manifest(shared, part, &next, version).await?;
    let span = shared.config.index_chunk_span;
    let old_chunk = index::chunk_of(manifest.log_start, span);
    let new_chunk = index::chunk_of(new_start, span);
    {
        let mut st = part.lock();
        st.log_start = st.log_start.max(new_start);
        st.manifest = next;
        st.manifest_version = Some(new_version);
        st.chunks.retain(|k, _| *k >= new_chunk - 1);
        let start = st.log_start;
        st.txns.prune(start);
        st.producers.prune_aborted(start);
    }
    tracing::info!(partition = %part.tp, log_start = new_start, segments_deleted = gone.len(), "log start moved");
    for s in gone {
        let key = manifest::segment_key(part.topic_id, part.tp.partition, s.segment);
        delete_quietly(shared, &key).await;
    }
    // Keep the chunk just below the new start: a batch straddling the boundary is found there.
    for k in old_chunk..new_chunk.saturating_sub(1) {
        delete_quietly(
            shared,
            &manifest::chunk_key(part.topic_id, part.tp.partition, k),
        )
        .await;
    }
    Ok(())
}

pub(crate) async fn delete_quietly(shared: &Shared, key: &str) {
    delete_checked(shared, key).await;
}

/// Deletes `key`, logging a failure; whether the object is gone.
async fn delete_checked(shared: &Shared, key: &str) -> bool {
    let Ok(k) = ObjectKey::new(key) else {
        return false;
    };
    match shared.store.delete(&k).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(%key, error = %e, "delete failed; the object stays as garbage");
            false
        }
    }
}

/// Records that `stream` is retired: sealed, with only the `markers` (seal and holes) left.
/// Its registration goes (unless it is the highest), so no later start-up seals it again and
/// no later pass, here or on another broker, reads it again; what cannot go is remembered
/// here for this process. Both are only savings: a stream judged again is judged the same.
async fn retire_stream(shared: &Shared, stream: u32, markers: BTreeSet<u64>, registered: &[u32]) {
    match strata_layout::streams::retire(shared.store.as_ref(), stream, registered).await {
        Ok(true) => {
            lock_mutex(&shared.retired_streams).remove(&stream);
            tracing::info!(
                stream = format_args!("{stream:08x}"),
                "write-ahead stream retired: only its seal and hole markers are left"
            );
        }
        Ok(false) => {
            lock_mutex(&shared.retired_streams).insert(stream, markers);
        }
        Err(e) => {
            tracing::warn!(stream = format_args!("{stream:08x}"), error = %e, "cannot delete a retired stream's registration; it is judged again next pass");
        }
    }
}

/// The sequence of `stream`'s end-of-stream seal, if it is sealed (`objects` as listed,
/// ascending); None for a stream that may still be written.
///
/// Usually the seal is the newest object. But a deposed writer's writes that were in flight
/// when it was sealed may land above the seal (at most `max_inflight_flushes` of them), and
/// a stream whose newest object is data was skipped as live for ever, all its objects kept.
/// Telling those apart costs reads below the newest object, so they are spent only on a
/// stream whose newest object did not change since the previous pass — a live writer's
/// changes unless it is idle — and only once per newest object: a stream judged unsealed at
/// a given newest object is not read again until that changes (a seal or a write adds one).
async fn find_end_seal(shared: &Shared, stream: u32, objects: &[(u64, ObjectKey)]) -> Option<u64> {
    let (top, _) = objects.last()?;
    let seen = lock_mutex(&shared.unsealed_tops).get(&stream).copied();
    if seen == Some((*top, true)) {
        return None;
    }
    let store = shared.store.as_ref();
    match strata_cluster::find_end_seal(store, stream, &[*top]).await {
        Ok(Some(seq)) => {
            lock_mutex(&shared.unsealed_tops).remove(&stream);
            return Some(seq);
        }
        Ok(None) => {}
        Err(_) => return None,
    }
    if seen != Some((*top, false)) {
        lock_mutex(&shared.unsealed_tops).insert(stream, (*top, false));
        return None;
    }
    let depth = shared.config.max_inflight_flushes.saturating_add(1);
    let below_top: Vec<u64> = objects
        .iter()
        .rev()
        .skip(1)
        .take(depth)
        .map(|(seq, _)| *seq)
        .collect();
    match strata_cluster::find_end_seal(store, stream, &below_top).await {
        Ok(Some(seq)) => {
            lock_mutex(&shared.unsealed_tops).remove(&stream);
            return Some(seq);
        }
        Ok(None) => {}
        // Judged again next pass.
        Err(_) => return None,
    }
    lock_mutex(&shared.unsealed_tops).insert(stream, (*top, true));
    None
}

/// The garbage collector: deletes what nothing references any more, never what something
/// might still need.
///
/// - Write-ahead objects of *sealed* streams of other incarnations (a live broker's stream is
///   never touched): an object goes once every batch in it belongs to a deleted topic or lies
///   below its partition's checkpoint, or comes from a stream the partition's manifest no
///   longer names for replay.
/// - Segments of partitions served here that the manifest does not list and that lie wholly
///   below its checkpoint (left by a compaction whose manifest update never landed).
pub(crate) async fn collect_garbage(shared: &Shared) -> LogResult<usize> {
    let mut deleted = 0usize;
    // Only registered streams, each listed on its own: an unregistered stream was retired,
    // its seal and hole markers stay for ever (they fence the deposed writer's late writes)
    // and nothing else is left, so listing all of `wal/` grew with every broker start.
    let registered = strata_layout::streams::registered(shared.store.as_ref()).await?;
    let mut streams: BTreeMap<u32, Vec<(u64, ObjectKey)>> = BTreeMap::new();
    for &stream in registered.iter().filter(|s| **s != shared.stream) {
        let listed = shared.store.list(&wal::stream_prefix(stream)).await?;
        let objects = streams.entry(stream).or_default();
        for meta in listed {
            if let Some(seq) = strata_layout::wal::parse_seq(stream, meta.key.as_str()) {
                objects.push((seq, meta.key));
            }
        }
    }
    let by_id: std::collections::HashMap<crate::catalog::TopicId, ()> = shared
        .topics_snapshot()
        .iter()
        .map(|t| (t.id, ()))
        .collect();
    let mut manifests: BTreeMap<(crate::catalog::TopicId, i32), Manifest> = BTreeMap::new();
    for (stream, mut objects) in streams {
        objects.sort();
        let known_retired = lock_mutex(&shared.retired_streams)
            .get(&stream)
            .is_some_and(|markers| objects.iter().all(|(seq, _)| markers.contains(seq)));
        if known_retired {
            continue;
        }
        let Some(last_seq) = find_end_seal(shared, stream, &objects).await else {
            continue;
        };
        // Retired once nothing but markers is left below the seal.
        let mut markers = BTreeSet::from([last_seq]);
        let mut retired = true;
        for (seq, key) in objects {
            if seq == last_seq {
                continue;
            }
            if seq > last_seq {
                // Above the seal: a write the deposed writer had in flight when it was sealed.
                // Never acknowledged (its write at the seal failed first, and it acknowledges
                // in order) and never replayed (a replay stops at the seal): garbage. Should a
                // retried write land again, a later pass finds it here again.
                if delete_checked(shared, key.as_str()).await {
                    deleted += 1;
                } else {
                    retired = false;
                }
                continue;
            }
            let object = match shared.store.get(&key).await {
                Ok((bytes, _)) => bytes,
                Err(StorageError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            if wal::is_seal(&object) {
                // A hole marker: it stays, so a late write of the deposed writer at this
                // sequence number fails instead of landing unseen by every replay.
                markers.insert(seq);
                continue;
            }
            let Ok(header) = wal::decode(&object) else {
                retired = false;
                continue;
            };
            let mut needed = false;
            for e in &header.entries {
                if !by_id.contains_key(&e.topic_id) {
                    continue;
                }
                let m = match manifests.get(&(e.topic_id, e.partition)) {
                    Some(m) => m.clone(),
                    None => {
                        let (m, _) =
                            crate::manifest::read_manifest(shared, e.topic_id, e.partition).await?;
                        manifests.insert((e.topic_id, e.partition), m.clone());
                        m
                    }
                };
                let named = m.writer_stream == stream || m.inherited_streams.contains(&stream);
                if named && e.last_offset() >= m.checkpoint {
                    needed = true;
                    break;
                }
            }
            if needed {
                retired = false;
            } else if delete_checked(shared, key.as_str()).await {
                deleted += 1;
            } else {
                retired = false;
            }
        }
        if retired {
            retire_stream(shared, stream, markers, &registered).await;
        }
    }
    lock_mutex(&shared.unsealed_tops).retain(|stream, _| registered.contains(stream));
    for part in shared.partitions_snapshot() {
        deleted += collect_segments(shared, &part).await?;
    }
    if deleted > 0 {
        tracing::info!(deleted, "garbage collected");
    }
    Ok(deleted)
}

/// The segment half of the collector, for one partition served here.
///
/// - Segments of tail compaction (`seg/<base>-<stream>`): those the manifest does not list and
///   that lie wholly below its checkpoint (left by a compaction whose manifest update never
///   landed).
/// - Cleaned segments (`seg/<base>-<stream>-<claim>-<gen>`): those written under a claim no
///   later than ours that the *stored* manifest, read under the maintenance lock and found
///   still ours, neither lists nor names in a recorded pass, and that no pass of ours is
///   writing. A deposed owner finds the stored manifest is not its own and deletes nothing;
///   a successor's segments carry a larger claim and are never judged here.
async fn collect_segments(shared: &Shared, part: &Arc<Partition>) -> LogResult<usize> {
    let mut deleted = 0usize;
    let seen = {
        let st = part.lock();
        // Empty partitions too: without this, 10,000 idle partitions that never had a
        // manifest were listed again on every pass (10,000 listings every 30 s).
        if st.segments_collected.as_ref() == Some(&st.manifest_version) {
            return Ok(0);
        }
        st.manifest_version.clone()
    };
    let prefix = strata_layout::partition::segment_prefix(part.topic_id, part.tp.partition);
    let listed = shared.store.list(&prefix).await?;
    // Segments named by claim: cleaned ones, and those a topic keeps on the fast tier.
    let claimed = |key: &str, fast: bool| {
        let parse = if fast {
            strata_layout::partition::parse_fast_segment_key
        } else {
            strata_layout::partition::parse_cleaned_segment_key
        };
        parse(key).map(|(base_offset, stream, claim, generation)| {
            let r = SegmentRef {
                base_offset,
                stream,
                claim,
                generation,
                fast,
            };
            (key.to_string(), r)
        })
    };
    let mut cleaned: Vec<(String, SegmentRef)> = Vec::new();
    if shared.config.tiered {
        let fast_prefix =
            strata_layout::partition::fast_segment_prefix(part.topic_id, part.tp.partition);
        for meta in shared.store.list(&fast_prefix).await? {
            cleaned.extend(claimed(meta.key.as_str(), true));
        }
    }
    for meta in &listed {
        let key = meta.key.as_str();
        if let Some(named) = claimed(key, false) {
            cleaned.push(named);
            continue;
        }
        let Some((base, stream)) = parse_segment_key(key) else {
            continue;
        };
        let segment = SegmentRef::compacted(base, stream);
        // Checked against the live manifest, which a compaction may have just moved.
        let unlisted_below = {
            let st = part.lock();
            !st.manifest.segments.iter().any(|s| s.segment == segment)
                && base < st.manifest.checkpoint
        };
        if unlisted_below {
            delete_quietly(shared, key).await;
            deleted += 1;
        }
    }
    if cleaned.is_empty() {
        collected(part, seen);
        return Ok(deleted);
    }
    let _serial = part.maintenance.lock().await;
    let (stored, version) = read_manifest(shared, part.topic_id, part.tp.partition).await?;
    let ours = {
        let st = part.lock();
        version == st.manifest_version && stored.claim == st.manifest.claim
    };
    if !ours {
        return Ok(deleted);
    }
    let inflight = lock_mutex(&shared.cleaner_inflight).clone();
    // A cleaning pass still writing keeps its segments; they are judged at the next change.
    let writing = !inflight.is_empty();
    for key in crate::cleaner::unreferenced_cleaned(&stored, &cleaned, &inflight) {
        delete_quietly(shared, &key).await;
        deleted += 1;
    }
    if !writing {
        collected(part, seen);
    }
    Ok(deleted)
}

use strata_layout::partition::parse_segment_key;

/// Records that the partition's segments were collected under manifest version `seen` (if
/// the manifest has not moved since: a pass that changed it meanwhile may have left more).
fn collected(part: &Partition, seen: Option<Version>) {
    let mut st = part.lock();
    if st.manifest_version == seen {
        st.segments_collected = Some(seen);
    }
}

// The manager's maintenance API, for operators and tests (the background task above runs
// the same passes on its own schedule).
impl LogManager {
    /// Moves the log start to `before` (None = the high watermark). Returns the new log start.
    pub async fn delete_records(
        &self,
        tp: &TopicPartition,
        before: Option<Offset>,
    ) -> LogResult<Offset> {
        let part = self.partition(tp)?;
        crate::maintenance::delete_records(&self.shared, &part, before.map(|o| o.0)).await
    }

    /// Runs the garbage collector once (it also runs with retention); returns objects deleted.
    pub async fn collect_garbage(&self) -> LogResult<usize> {
        crate::maintenance::collect_garbage(&self.shared).await
    }

    /// Waits until every tail a takeover replayed so far had its first compaction pass (they
    /// are compacted behind serving). For tests and tools that look at the storage after a
    /// takeover.
    pub async fn replayed_tails_compacted(&self) {
        self.shared.replayed.drained().await;
    }

    /// Runs one compaction of `tp` now, as the maintenance task would (including what it does
    /// when the pass finds this broker deposed), whether or not it is due.
    #[cfg(test)]
    pub(crate) async fn compact_now(&self, tp: &TopicPartition) -> LogResult<()> {
        let part = self.partition(tp)?;
        crate::maintenance::compact_now(&self.shared, &part).await
    }

    /// Runs one tiering pass over `tp` now, as the tiering task would; returns the segments
    /// moved to the bulk tier.
    #[cfg(test)]
    pub(crate) async fn tier_down_now(&self, tp: &TopicPartition) -> LogResult<usize> {
        let part = self.partition(tp)?;
        crate::tiering::tier_down_once(&self.shared, &part).await
    }
}
