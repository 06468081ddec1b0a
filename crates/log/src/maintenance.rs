//! Background upkeep of partitions: compaction of the write-ahead tail into per-partition
//! segments (with their index chunks and a new manifest), retention, and record deletion.
//!
//! All three replace the manifest, so they run under the partition's maintenance lock, and
//! every replacement is a compare-and-swap: a writer that lost ownership fails instead of
//! overwriting its successor's manifest.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_storage::{ObjectKey, PutMode, StorageError, Version};
use tokio::sync::watch;

use crate::index::{self, IndexEntry, SegmentRef};
use crate::manager::{concat, index_entry_for, load_chunk, read_range, release_wal, Shared};
use crate::manifest::{self, Manifest, SegmentMeta};
use crate::partition::{LoadedChunk, Partition, TailEntry};
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
            _ = tokio::time::sleep(tick) => {}
        }
        if *stop.borrow() {
            return;
        }
        let now = shared.clock.monotonic();
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
                    tracing::warn!(partition = %part.tp, error = %e, "compaction failed; will retry");
                }
            }
        }
        if now >= last_retention + shared.config.retention_check_interval {
            last_retention = now;
            for part in &parts {
                if let Err(e) = enforce_retention(&shared, part).await {
                    tracing::warn!(partition = %part.tp, error = %e, "retention failed; will retry");
                }
            }
        }
    }
}

/// Rewrites the partition's whole durable tail as one segment, indexes it, and moves the
/// manifest's checkpoint past it. Afterwards the write-ahead objects it came from are no
/// longer needed by this partition.
pub(crate) async fn compact(shared: &Shared, part: &Arc<Partition>) -> LogResult<()> {
    let _serial = part.maintenance.lock().await;
    let (entries, cached, manifest, manifest_version) = {
        let st = part.lock();
        if st.deleted || st.tail.is_empty() {
            return Ok(());
        }
        let entries: Vec<TailEntry> = st.tail.iter().copied().collect();
        let cached: Vec<Option<Bytes>> = entries.iter().map(|e| st.cached(e.base_offset)).collect();
        (
            entries,
            cached,
            st.manifest.clone(),
            st.manifest_version.clone(),
        )
    };

    // Gather the bytes: from the cache where still there, else from the write-ahead objects.
    let mut parts = Vec::with_capacity(entries.len());
    for (e, c) in entries.iter().zip(cached) {
        let bytes = match c {
            Some(b) => b,
            None => {
                read_range(
                    shared.store.as_ref(),
                    &wal::key(e.stream, e.seq),
                    e.position,
                    e.length,
                )
                .await?
            }
        };
        parts.push(bytes);
    }
    let segment = SegmentRef {
        base_offset: entries[0].base_offset,
        stream: shared.stream,
    };
    let mut position = 0u32;
    let mut new_entries = Vec::with_capacity(entries.len());
    for (e, b) in entries.iter().zip(&parts) {
        new_entries.push(index_entry_for(e, segment, position));
        position += b.len() as u32;
    }
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
        // Our own earlier attempt (a crash or failure after this put) left the same object.
        Err(StorageError::AlreadyExists(_)) => {
            let (existing, _) = shared.store.get(&seg_key).await?;
            if existing != body {
                return Err(LogError::Fenced);
            }
        }
        Err(e) => return Err(e.into()),
    }

    // Index chunks: keep entries before this segment, replace anything at or after it (left
    // by an attempt whose manifest update never landed), append the new entries.
    let span = shared.config.index_chunk_span;
    let mut by_chunk: BTreeMap<i64, Vec<IndexEntry>> = BTreeMap::new();
    for e in &new_entries {
        by_chunk
            .entry(index::chunk_of(e.base_offset, span))
            .or_default()
            .push(*e);
    }
    let mut written = Vec::new();
    for (k, fresh) in by_chunk {
        let current = load_chunk(shared, part, k).await?;
        let mut merged: Vec<IndexEntry> = current
            .entries
            .iter()
            .filter(|e| e.last_offset() < segment.base_offset)
            .copied()
            .collect();
        merged.extend(fresh);
        let version = put_versioned(
            shared,
            &manifest::chunk_key(part.topic_id, part.tp.partition, k),
            index::encode_chunk(&merged),
            current.version.clone(),
        )
        .await?;
        written.push((
            k,
            LoadedChunk {
                entries: Arc::new(merged),
                version: Some(version),
            },
        ));
    }

    let last = entries[entries.len() - 1];
    let mut next = manifest.clone();
    next.checkpoint = last.last_offset + 1;
    next.writer_stream = shared.stream;
    next.segments.push(SegmentMeta {
        segment,
        last_offset: last.last_offset,
        size,
        max_timestamp: entries.iter().map(|e| e.max_timestamp).max().unwrap_or(-1),
    });
    for e in &entries {
        if e.producer_id >= 0 {
            next.producers.record(
                e.producer_id,
                e.producer_epoch,
                e.base_sequence,
                e.record_count,
                e.base_offset,
            );
        }
    }
    let version = put_manifest(shared, part, &next, manifest_version).await?;

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
    for key in release_wal(shared, &entries) {
        delete_quietly(shared, &key).await;
    }
    tracing::debug!(partition = %part.tp, base = segment.base_offset, last = last.last_offset, size, "compacted");
    Ok(())
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

async fn put_manifest(
    shared: &Shared,
    part: &Partition,
    manifest: &Manifest,
    version: Option<Version>,
) -> LogResult<Version> {
    let body = serde_json::to_vec(manifest)
        .map_err(|e| LogError::CorruptStorage(format!("encoding manifest: {e}")))?;
    put_versioned(
        shared,
        &manifest::manifest_key(part.topic_id, part.tp.partition),
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
    let (manifest, tail_bytes) = {
        let st = part.lock();
        (st.manifest.clone(), st.tail_bytes as i64)
    };
    let segs = &manifest.segments;
    let mut drop = segs
        .iter()
        .take_while(|s| s.last_offset < manifest.log_start)
        .count();
    if topic.config.retention_ms >= 0 {
        let cutoff = now - topic.config.retention_ms;
        while drop < segs.len() && segs[drop].max_timestamp < cutoff {
            drop += 1;
        }
    }
    if topic.config.retention_bytes >= 0 {
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

async fn delete_quietly(shared: &Shared, key: &str) {
    let Ok(k) = ObjectKey::new(key) else { return };
    if let Err(e) = shared.store.delete(&k).await {
        tracing::warn!(%key, error = %e, "delete failed; the object stays as garbage");
    }
}
