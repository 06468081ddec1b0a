//! The log cleaner: key compaction of topics whose `cleanup.policy` includes `compact` (Kafka's
//! LogCleaner). Not to be confused with *compaction* in `maintenance`, which moves the
//! write-ahead tail into segments: the cleaner only ever rewrites those sealed segments, below
//! the manifest's checkpoint, and never the tail.
//!
//! A pass over one partition (by its owner):
//! 1. **Map** the dirty segments (from the manifest's `cleaned_to`, Kafka's cleaner checkpoint,
//!    up to the first segment younger than `min.compaction.lag.ms`): key hash → latest offset,
//!    in an [`OffsetMap`] of `cleaner_dedupe_buffer_bytes`. More keys than fit end the map early:
//!    the pass covers fewer offsets, and the next pass continues; memory never grows.
//! 2. **Filter** every segment from the log start through the mapped range, batch by batch
//!    (`strata_wire::clean::filter_batch`): a record survives if it has a key, no later offset of
//!    its key is mapped, and it is not a tombstone whose segment was first cleaned more than
//!    `delete.retention.ms` ago. Each changed segment is written whole as a new object whose
//!    name carries our claim number and a generation (`seg/<base>-<stream>-<claim>-<gen>`),
//!    create-only: it collides with nothing. Adjacent segments whose tombstones all expire in
//!    this pass are merged into one of at most `segment_bytes` ([`merge_small`]), so small
//!    segments do not pile up in a long-lived partition.
//! 3. **Swap**, under the partition's maintenance lock: record the intent in the manifest
//!    (compare-and-swap: a deposed owner stops here), point the index chunks of the range at the
//!    new segments (claim-stamped compare-and-swap, as compaction writes them), then replace the
//!    segment list and move `cleaned_to` (compare-and-swap), and only then delete the replaced
//!    segments. A crash between the two manifest updates leaves an intent whose segments are
//!    protected from garbage collection; the next owner finishes it ([`finish_pending`]).
//!
//! Offsets never move: a filtered batch keeps its base offset and last offset delta, and a
//! fetch of an offset cleaned away gets the next surviving batch (the index search finds the
//! first batch whose last offset reaches the requested one).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_storage::{ObjectKey, PutMode};
use strata_wire::clean::{self as wire_clean, Filtered};
use tokio::sync::watch;

use crate::config::TopicConfig;
use crate::index::{self, ChunkStamp, IndexEntry, SegmentRef};
use crate::maintenance::{
    delete_quietly, on_failure, put_manifest, resync_manifest, write_chunk_with,
};
use crate::manifest::{self, CleaningIntent, Manifest, SegmentMeta};
use crate::partition::{Partition, Serving};
use crate::producer::AbortedTxn;
use crate::shared::{lock_mutex, Shared};
use crate::{LogError, LogResult};

/// Counters the cleaner keeps, for `/metrics`.
#[derive(Debug, Default)]
pub struct CleanerStats {
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub records_removed: AtomicU64,
    pub passes: AtomicU64,
    /// Wall-clock ms of the last pass that finished (0 = none yet).
    pub last_pass_millis: AtomicU64,
}

/// A point-in-time copy of [`CleanerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanerSnapshot {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_removed: u64,
    pub passes: u64,
    pub last_pass_millis: u64,
}

impl CleanerStats {
    pub fn snapshot(&self) -> CleanerSnapshot {
        CleanerSnapshot {
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            records_removed: self.records_removed.load(Ordering::Relaxed),
            passes: self.passes.load(Ordering::Relaxed),
            last_pass_millis: self.last_pass_millis.load(Ordering::Relaxed),
        }
    }
}

/// Key hash → latest offset, in a fixed amount of memory (Kafka's SkimpyOffsetMap): 128-bit
/// hashes, not keys, in an open-addressed table filled to at most 90%. Two keys whose 128-bit
/// hashes collide would make the older one's latest record look superseded; at 2^-128 per pair
/// that risk is the one Kafka takes with MD5.
pub(crate) struct OffsetMap {
    hashes: Vec<[u64; 2]>,
    offsets: Vec<i64>,
    used: usize,
    capacity: usize,
}

/// Bytes one slot of the map costs.
pub(crate) const SLOT_BYTES: usize = 24;

impl OffsetMap {
    pub fn with_memory(bytes: usize) -> Self {
        let slots = (bytes / SLOT_BYTES).max(2);
        Self {
            hashes: vec![[0, 0]; slots],
            offsets: vec![0; slots],
            used: 0,
            capacity: (slots * 9 / 10).max(1),
        }
    }

    fn hash(key: &[u8]) -> [u64; 2] {
        let half = |salt: u8| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            salt.hash(&mut h);
            key.hash(&mut h);
            h.finish()
        };
        let h = [half(0), half(1)];
        // [0, 0] marks an empty slot.
        if h == [0, 0] {
            [0, 1]
        } else {
            h
        }
    }

    fn slot(&self, h: [u64; 2]) -> (usize, bool) {
        let n = self.hashes.len();
        let mut i = (h[0] as usize) % n;
        loop {
            if self.hashes[i] == h {
                return (i, true);
            }
            if self.hashes[i] == [0, 0] {
                return (i, false);
            }
            i = (i + 1) % n;
        }
    }

    /// Records `offset` as the latest of `key`. False (and nothing recorded) when the key is
    /// new and the map is full.
    pub fn put(&mut self, key: &[u8], offset: i64) -> bool {
        let h = Self::hash(key);
        let (i, found) = self.slot(h);
        if !found {
            if self.used >= self.capacity {
                return false;
            }
            self.used += 1;
            self.hashes[i] = h;
        }
        self.offsets[i] = offset;
        true
    }

    pub fn get(&self, key: &[u8]) -> Option<i64> {
        let (i, found) = self.slot(Self::hash(key));
        found.then(|| self.offsets[i])
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.used
    }
}

/// Whether and why a partition is due for cleaning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Dirtiness {
    /// Bytes of segments at or past `cleaned_to`, over all segments' bytes.
    pub ratio: f64,
    /// Due: the ratio reached `min.cleanable.dirty.ratio`, or dirty data is older than
    /// `max.compaction.lag.ms`; and some dirty segment is older than `min.compaction.lag.ms`.
    pub due: bool,
}

/// Kafka's scheduling rule over a manifest's segments (the tail is never cleaned); only
/// segments wholly below the last stable offset are cleanable.
pub(crate) fn dirtiness(
    manifest: &Manifest,
    config: &TopicConfig,
    now_ms: i64,
    last_stable: i64,
) -> Dirtiness {
    let live = manifest
        .segments
        .iter()
        .filter(|s| s.last_offset >= manifest.log_start);
    let (mut total, mut dirty) = (0u64, 0u64);
    let mut cleanable = false;
    let mut overdue = false;
    for s in live {
        total += s.size;
        if s.last_offset >= manifest.cleaned_to {
            dirty += s.size;
            // A segment's newest record decides both lags: we keep its max timestamp only, so
            // a segment is overdue a little later than Kafka (which uses the earliest record).
            let age = now_ms.saturating_sub(s.max_timestamp);
            let stable = s.last_offset < last_stable;
            cleanable |= stable && age >= config.min_compaction_lag_ms;
            overdue |= stable && age > config.max_compaction_lag_ms;
        }
    }
    let ratio = if total == 0 {
        0.0
    } else {
        dirty as f64 / total as f64
    };
    Dirtiness {
        ratio,
        due: cleanable && (ratio >= config.min_cleanable_dirty_ratio || overdue),
    }
}

/// Paces the cleaner's reads and writes to `cleaner_io_max_bytes_per_second` (the tiering pass,
/// another background rewrite of segments, shares the setting).
pub(crate) struct Throttle<'a> {
    shared: &'a Shared,
    started: Duration,
    bytes: u64,
}

impl<'a> Throttle<'a> {
    pub(crate) fn new(shared: &'a Shared) -> Self {
        Self {
            shared,
            started: shared.clock.monotonic(),
            bytes: 0,
        }
    }

    pub(crate) async fn charge(&mut self, bytes: usize) {
        let rate = self.shared.config.cleaner_io_max_bytes_per_second;
        if rate == 0 || rate == u64::MAX {
            return;
        }
        self.bytes += bytes as u64;
        let due = Duration::from_secs_f64(self.bytes as f64 / rate as f64);
        let elapsed = self.shared.clock.monotonic().saturating_sub(self.started);
        if due > elapsed {
            self.shared.clock.sleep(due - elapsed).await;
        }
    }
}

/// Runs cleaning passes until `stop` turns true: each tick, the dirtiest due partition this
/// broker serves that no other cleaner task holds (`cleaner_threads` tasks in all).
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let tick = (shared.config.segment_interval / 4)
        .clamp(Duration::from_millis(10), Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = shared.clock.sleep(tick) => {}
        }
        if *stop.borrow() {
            return;
        }
        while let Some(part) = pick(&shared) {
            let result = clean_once(&shared, &part).await;
            lock_mutex(&shared.cleaning_now).remove(&part.tp);
            match result {
                Err(e) => {
                    on_failure(&shared, &part, "cleaning", &e).await;
                    break;
                }
                // Nothing cleanable after all (a segment still too young or unstable): picking
                // again now would pick the same partition, so wait for the next tick.
                Ok(false) => break,
                Ok(true) => {}
            }
            if *stop.borrow() {
                return;
            }
        }
    }
}

/// The partition to clean next, claimed for this task: one with an unfinished pass first,
/// else the dirtiest due one.
fn pick(shared: &Shared) -> Option<Arc<Partition>> {
    let now = shared.clock.wall_millis();
    let mut best: Option<(f64, Arc<Partition>)> = None;
    let mut busy = lock_mutex(&shared.cleaning_now);
    for part in shared.partitions_snapshot() {
        if busy.contains(&part.tp) {
            continue;
        }
        let Some(topic) = shared.topic(&part.tp.topic) else {
            continue;
        };
        let st = part.lock();
        if st.serving != Serving::Active {
            continue;
        }
        let score = if st.manifest.cleaning.is_some() {
            f64::INFINITY
        } else if topic.config.cleanup_policy.compact {
            let d = dirtiness(&st.manifest, &topic.config, now, st.last_stable());
            if !d.due {
                continue;
            }
            d.ratio
        } else {
            continue;
        };
        drop(st);
        if best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, part));
        }
    }
    let (_, part) = best?;
    busy.insert(part.tp.clone());
    Some(part)
}

/// One pass over `part` now, due or not (tests, and the scheduler above). Returns whether a
/// pass ran to completion.
pub(crate) async fn clean_once(shared: &Shared, part: &Arc<Partition>) -> LogResult<bool> {
    if part.lock().manifest.cleaning.is_some() {
        let _serial = part.maintenance.lock().await;
        finish_pending(shared, part, None).await?;
        return Ok(true);
    }
    let Some(topic) = shared.topic(&part.tp.topic) else {
        return Ok(false);
    };
    let _slot = shared
        .cleaner_slots
        .acquire()
        .await
        .map_err(|_| LogError::ShuttingDown)?;
    clean_pass(shared, part, &topic.config).await
}

/// A segment as the pass filters it.
struct Output {
    /// The segments this output stands for: one, or several adjacent ones merged.
    originals: Vec<SegmentMeta>,
    /// None: unchanged (the segment stays, only marked cleaned); Some(None): every batch
    /// removed; Some(Some(..)): the replacement and its index entries.
    replacement: Option<Option<(SegmentMeta, Bytes, Vec<IndexEntry>)>>,
}

/// One segment after filtering, before adjacent small ones are merged.
struct Piece {
    original: SegmentMeta,
    /// The surviving batches, in order, and their index entries (positions within them).
    body: Vec<Bytes>,
    entries: Vec<IndexEntry>,
    changed: bool,
    /// The map covered the whole segment and its tombstones expire in this pass, so none is
    /// left in it: it may be merged without moving any tombstone's clock.
    mergeable: bool,
    /// `cleaned_at` of its replacement.
    cleaned_at: Option<i64>,
}

impl Piece {
    fn size(&self) -> u64 {
        self.body.iter().map(|b| b.len() as u64).sum()
    }

    /// This segment on its own: kept, removed or replaced.
    fn alone(self) -> Output {
        let replacement = if !self.changed {
            None
        } else if self.entries.is_empty() {
            Some(None)
        } else {
            let body = crate::shared::concat(&self.body);
            let meta = SegmentMeta {
                segment: self.entries[0].segment,
                last_offset: self.original.last_offset,
                size: body.len() as u64,
                max_timestamp: max_timestamp(&self.entries),
                cleaned_at: self.cleaned_at,
            };
            Some(Some((meta, body, self.entries)))
        };
        Output {
            originals: vec![self.original],
            replacement,
        }
    }
}

fn max_timestamp(entries: &[IndexEntry]) -> i64 {
    entries.iter().map(|e| e.max_timestamp).max().unwrap_or(-1)
}

/// Merges runs of adjacent mergeable pieces into segments of at most `limit` bytes (Kafka's
/// cleaner groups segments by size the same way), so a long-lived compacted partition does not
/// keep one small object per original segment. Other pieces stay as they are. Pieces on
/// different tiers are never merged: a merged segment lives on the tier of its run (`name`
/// gets the base offset and whether the run is on the fast tier).
fn merge_small(
    pieces: Vec<Piece>,
    limit: u64,
    mut name: impl FnMut(i64, bool) -> SegmentRef,
) -> Vec<Output> {
    let mut outputs = Vec::new();
    let mut run: Vec<Piece> = Vec::new();
    let mut run_size = 0u64;
    let mut close = |run: &mut Vec<Piece>, outputs: &mut Vec<Output>| match run.len() {
        0 => {}
        1 => outputs.extend(run.pop().map(Piece::alone)),
        _ => outputs.push(merged(std::mem::take(run), &mut name)),
    };
    for piece in pieces {
        let size = piece.size();
        let same_tier = run
            .first()
            .is_none_or(|r| r.original.segment.fast == piece.original.segment.fast);
        if piece.mergeable && !run.is_empty() && same_tier && run_size + size <= limit {
            run_size += size;
            run.push(piece);
            continue;
        }
        close(&mut run, &mut outputs);
        run_size = size;
        if piece.mergeable {
            run.push(piece);
        } else {
            outputs.push(piece.alone());
        }
    }
    close(&mut run, &mut outputs);
    outputs
}

/// Several adjacent pieces as one new segment (or none, if nothing survived in any).
fn merged(run: Vec<Piece>, name: &mut impl FnMut(i64, bool) -> SegmentRef) -> Output {
    let originals: Vec<SegmentMeta> = run.iter().map(|p| p.original).collect();
    // Every piece of a run is on one tier; its replacements say which (see `clean_pass`).
    let fast = run
        .iter()
        .any(|p| p.entries.first().is_some_and(|e| e.segment.fast));
    let segment = name(originals[0].segment.base_offset, fast);
    let last_offset = originals.iter().map(|o| o.last_offset).max().unwrap_or(-1);
    let cleaned_at = run.iter().filter_map(|p| p.cleaned_at).min();
    let mut body = Vec::new();
    let mut entries = Vec::new();
    let mut position = 0u32;
    for piece in run {
        let start = position;
        for e in piece.entries {
            entries.push(IndexEntry {
                segment,
                position: start + e.position,
                ..e
            });
        }
        for b in piece.body {
            position += b.len() as u32;
            body.push(b);
        }
    }
    let replacement = if entries.is_empty() {
        Some(None)
    } else {
        let body = crate::shared::concat(&body);
        let meta = SegmentMeta {
            segment,
            last_offset,
            size: body.len() as u64,
            max_timestamp: max_timestamp(&entries),
            cleaned_at,
        };
        Some(Some((meta, body, entries)))
    };
    Output {
        originals,
        replacement,
    }
}

pub(crate) async fn read_segment(
    shared: &Shared,
    part: &Partition,
    s: &SegmentMeta,
) -> LogResult<Bytes> {
    let key = ObjectKey::new(manifest::segment_key(
        part.topic_id,
        part.tp.partition,
        s.segment,
    ))?;
    Ok(shared.store.get(&key).await?.0)
}

/// The aborted transactions of the partition as the pass sees them (Kafka's
/// `CleanedTransactionMetadata`): every transaction below the last stable offset is closed, so
/// a transactional batch there is aborted exactly when an aborted range of its producer holds
/// it, and committed otherwise.
struct AbortedRanges {
    /// Producer id → (first offset, marker offset), in marker order.
    by_producer: BTreeMap<i64, Vec<(i64, i64)>>,
}

impl AbortedRanges {
    fn new(aborted: &[AbortedTxn]) -> Self {
        let mut by_producer: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
        for a in aborted {
            by_producer
                .entry(a.producer_id)
                .or_default()
                .push((a.first_offset, a.last_offset));
        }
        Self { by_producer }
    }

    fn holds(&self, producer_id: i64, offset: i64) -> bool {
        self.by_producer.get(&producer_id).is_some_and(|ranges| {
            let i = ranges.partition_point(|(_, last)| *last <= offset);
            ranges.get(i).is_some_and(|(first, _)| *first <= offset)
        })
    }

    fn find(&self, producer_id: i64, marker_offset: i64) -> Option<AbortedTxn> {
        self.by_producer.get(&producer_id).and_then(|ranges| {
            ranges
                .iter()
                .find(|(_, last)| *last == marker_offset)
                .map(|(first, last)| AbortedTxn {
                    producer_id,
                    first_offset: *first,
                    last_offset: *last,
                })
        })
    }
}

/// What the filter does with a control batch (Kafka's `onControlBatchRead` and
/// `checkBatchRetention`): a marker stays while the pass still read data of its transaction
/// (for an abort, the aborted batches it removes now; for a commit, any batch left of it),
/// then gets a delete horizon of `delete.retention.ms`, and goes once that has passed.
enum MarkerFate {
    Keep,
    SetHorizon(i64),
    Remove,
}

fn marker_fate(
    batch: &strata_wire::BatchView,
    aborted: &AbortedRanges,
    open_txns: &mut HashSet<i64>,
    forgotten: &mut Vec<AbortedTxn>,
    now: i64,
    delete_retention_ms: i64,
) -> MarkerFate {
    let h = batch.header();
    let removable = if h.record_count == 0 {
        // Kafka: an empty control batch was already cleaned.
        true
    } else {
        match strata_wire::builder::read_txn_marker(batch.bytes()) {
            // A control record of a type we do not know is kept, as Kafka keeps it.
            None => false,
            Some(marker) => {
                let had_data = open_txns.remove(&h.producer_id);
                if !marker.commit && !had_data {
                    // Its data is gone: read_committed fetches no longer need the range, and
                    // it must be gone from the list before the marker goes, or a consumer told
                    // about it would wait for that marker and skip the producer's later
                    // committed records.
                    forgotten.extend(aborted.find(h.producer_id, h.base_offset));
                }
                !had_data
            }
        }
    };
    if !removable {
        return MarkerFate::Keep;
    }
    match wire_clean::delete_horizon(batch) {
        Some(horizon) if horizon <= now => MarkerFate::Remove,
        Some(_) => MarkerFate::Keep,
        None => MarkerFate::SetHorizon(now.saturating_add(delete_retention_ms)),
    }
}

fn batches_of(bytes: &Bytes) -> LogResult<Vec<strata_wire::BatchView>> {
    strata_wire::split_batches(bytes)
        .map_err(|e| LogError::CorruptStorage(format!("segment does not parse: {e}")))
}

async fn clean_pass(
    shared: &Shared,
    part: &Arc<Partition>,
    config: &TopicConfig,
) -> LogResult<bool> {
    let now = shared.clock.wall_millis();
    // The aborted list and the last stable offset of the durable log: data below it belongs to
    // closed transactions only, so the list tells aborted from committed.
    let (manifest, last_stable, aborted) = {
        let st = part.lock();
        (
            st.manifest.clone(),
            st.last_stable(),
            AbortedRanges::new(&st.txns.aborted),
        )
    };
    let limit = shared.config.max_decompressed_batch_bytes as u64;
    let segments: Vec<SegmentMeta> = manifest
        .segments
        .iter()
        .filter(|s| s.last_offset >= manifest.log_start)
        .copied()
        .collect();
    let lag_cutoff = now.saturating_sub(config.min_compaction_lag_ms);
    let dirty: Vec<SegmentMeta> = segments
        .iter()
        .filter(|s| s.last_offset >= manifest.cleaned_to)
        // Never at or past the last stable offset (Kafka's first unstable offset): whether an
        // open transaction commits or aborts is not known yet.
        .take_while(|s| s.max_timestamp <= lag_cutoff && s.last_offset < last_stable)
        .copied()
        .collect();
    if dirty.is_empty() {
        return Ok(false);
    }
    tracing::info!(partition = %part.tp, cleaned_to = manifest.cleaned_to, dirty_segments = dirty.len(), "cleaning pass started");
    let mut throttle = Throttle::new(shared);
    let threads = shared.config.cleaner_threads.max(1);
    let mut map = OffsetMap::with_memory(shared.config.cleaner_dedupe_buffer_bytes / threads);
    let mut bytes_read = 0u64;

    // 1. Map the dirty segments, as many records as the map holds.
    let mut mapped_end = manifest.cleaned_to;
    'map: for s in &dirty {
        let bytes = read_segment(shared, part, s).await?;
        bytes_read += bytes.len() as u64;
        throttle.charge(bytes.len()).await;
        for batch in batches_of(&bytes)? {
            let h = batch.header();
            // The first dirty segment starts below `cleaned_to`; what precedes it was mapped
            // by earlier passes. Mapping it again would spend the map on it, and a segment
            // holding more keys than the map would then never get past `cleaned_to` (Kafka's
            // buildOffsetMap also starts at the first dirty offset).
            if h.last_offset() < manifest.cleaned_to {
                continue;
            }
            if h.is_control()
                || (h.is_transactional() && aborted.holds(h.producer_id, h.base_offset))
            {
                // Not mapped: an aborted record must not shadow a committed value of its
                // key, and markers (all keyed by their type) must not shadow each other.
                // Committed transactional records are mapped like any other.
                mapped_end = mapped_end.max(h.last_offset() + 1);
                continue;
            }
            let records = wire_clean::records(&batch, limit)?;
            for r in records.iter().filter(|r| r.offset >= manifest.cleaned_to) {
                if let Some(key) = &r.key {
                    if !map.put(key, r.offset) {
                        mapped_end = mapped_end.max(r.offset);
                        break 'map;
                    }
                }
                mapped_end = mapped_end.max(r.offset + 1);
            }
            mapped_end = mapped_end.max(batch.header().last_offset() + 1);
        }
    }

    // 2. Filter every segment that starts below the end of the map.
    let delete_horizon = now.saturating_sub(config.delete_retention_ms);
    let claim = manifest.claim;
    let keep_fast = shared.config.tiered && config.fast_tier().is_some();
    let mut pieces = Vec::new();
    let mut removed = 0u64;
    // Producers with a transaction whose batches this pass read and has not yet seen the
    // marker of; filtering runs from the log start, so each transaction's data comes first.
    let mut open_txns: HashSet<i64> = HashSet::new();
    // Aborted transactions whose data is all gone: the list forgets them with this pass.
    let mut forgotten: Vec<AbortedTxn> = Vec::new();
    for s in segments
        .iter()
        .filter(|s| s.segment.base_offset < mapped_end)
    {
        let bytes = read_segment(shared, part, s).await?;
        bytes_read += bytes.len() as u64;
        throttle.charge(bytes.len()).await;
        let tombstones_expire = s.cleaned_at.is_some_and(|t| t <= delete_horizon);
        let mut body: Vec<Bytes> = Vec::new();
        let mut entries = Vec::new();
        let mut position = 0u32;
        let mut changed = false;
        let segment = SegmentRef {
            base_offset: s.segment.base_offset,
            stream: shared.stream,
            claim,
            generation: shared.next_cleaner_generation(),
            // A cleaned copy of a fast-tier segment stays there while the topic asks for it;
            // the tiering pass moves it on by its own rule.
            fast: s.segment.fast && keep_fast,
        };
        for batch in batches_of(&bytes)? {
            let h = *batch.header();
            let last_of_producer = h.producer_id >= 0
                && manifest
                    .producers
                    .producers
                    .get(&h.producer_id)
                    .and_then(|p| p.batches.back())
                    .is_some_and(|b| b.base_offset == h.base_offset);
            let mut dropped = 0u64;
            let filtered = if h.is_control() {
                let fate = marker_fate(
                    &batch,
                    &aborted,
                    &mut open_txns,
                    &mut forgotten,
                    now,
                    config.delete_retention_ms,
                );
                match fate {
                    MarkerFate::Keep => Ok(Filtered::Unchanged),
                    MarkerFate::SetHorizon(horizon) => {
                        wire_clean::with_delete_horizon(&batch, limit, horizon)
                            .map(Filtered::Rewritten)
                    }
                    MarkerFate::Remove => {
                        dropped += u64::try_from(h.record_count).unwrap_or(0);
                        Ok(Filtered::Removed)
                    }
                }
            } else if h.is_transactional() && aborted.holds(h.producer_id, h.base_offset) {
                // Aborted data goes whole; its marker stays for this pass (see `marker_fate`).
                open_txns.insert(h.producer_id);
                wire_clean::filter_batch(&batch, limit, last_of_producer, |_| {
                    dropped += 1;
                    false
                })
            } else {
                if h.is_transactional() {
                    open_txns.insert(h.producer_id);
                }
                wire_clean::filter_batch(&batch, limit, last_of_producer, |r| {
                    let keep = match &r.key {
                        // Keyless records predate the compact policy; Kafka's cleaner drops them.
                        None => false,
                        Some(key) => {
                            r.offset >= mapped_end
                                || (map.get(key).is_none_or(|latest| r.offset >= latest)
                                    && !(r.is_tombstone && tombstones_expire))
                        }
                    };
                    if !keep {
                        dropped += 1;
                    }
                    keep
                })
            }?;
            removed += dropped;
            let out = match filtered {
                Filtered::Unchanged => batch.bytes().clone(),
                Filtered::Rewritten(b) => {
                    changed = true;
                    b
                }
                Filtered::Removed => {
                    changed = true;
                    continue;
                }
            };
            let header = strata_wire::read_batch_header(&out).ok_or_else(|| {
                LogError::CorruptStorage("a filtered batch does not parse".into())
            })?;
            let length = out.len() as u32;
            entries.push(IndexEntry {
                base_offset: header.base_offset,
                last_offset_delta: header.last_offset_delta as u32,
                length,
                position,
                segment,
                max_timestamp: header.max_timestamp,
            });
            position += length;
            body.push(out);
        }
        let covered = s.last_offset < mapped_end;
        pieces.push(Piece {
            original: *s,
            body,
            entries,
            changed,
            mergeable: covered && tombstones_expire,
            // Only data the map covered counts as passed: a tombstone's clock starts then.
            cleaned_at: if covered {
                Some(s.cleaned_at.unwrap_or(now))
            } else {
                s.cleaned_at
            },
        });
    }
    let stream = shared.stream;
    let outputs = merge_small(
        pieces,
        shared.config.segment_bytes as u64,
        |base_offset, fast| SegmentRef {
            base_offset,
            stream,
            claim,
            generation: shared.next_cleaner_generation(),
            fast,
        },
    );

    // New segments are written before anything names them; the collector leaves them alone
    // while this pass is in flight.
    let keys: Vec<String> = outputs
        .iter()
        .filter_map(|o| o.replacement.as_ref()?.as_ref())
        .map(|(meta, _, _)| manifest::segment_key(part.topic_id, part.tp.partition, meta.segment))
        .collect();
    lock_mutex(&shared.cleaner_inflight).extend(keys.iter().cloned());
    let result = write_and_swap(
        shared,
        part,
        &manifest,
        outputs,
        mapped_end,
        forgotten,
        now,
        &mut throttle,
        bytes_read,
        removed,
    )
    .await;
    {
        let mut inflight = lock_mutex(&shared.cleaner_inflight);
        for k in &keys {
            inflight.remove(k);
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn write_and_swap(
    shared: &Shared,
    part: &Arc<Partition>,
    planned: &Manifest,
    outputs: Vec<Output>,
    mapped_end: i64,
    forgotten: Vec<AbortedTxn>,
    now: i64,
    throttle: &mut Throttle<'_>,
    bytes_read: u64,
    removed: u64,
) -> LogResult<bool> {
    let mut written = 0u64;
    let mut replaced = Vec::new();
    let mut replacements = Vec::new();
    let mut fresh_entries = Vec::new();
    for o in &outputs {
        let Some(r) = &o.replacement else { continue };
        replaced.extend(o.originals.iter().map(|s| s.segment));
        if let Some((meta, body, entries)) = r {
            let key = ObjectKey::new(manifest::segment_key(
                part.topic_id,
                part.tp.partition,
                meta.segment,
            ))?;
            shared
                .store
                .put(&key, body.clone(), PutMode::Create)
                .await?;
            written += body.len() as u64;
            throttle.charge(body.len()).await;
            replacements.push(*meta);
            fresh_entries.extend_from_slice(entries);
        }
    }

    let originals: Vec<SegmentRef> = outputs
        .iter()
        .flat_map(|o| &o.originals)
        .map(|s| s.segment)
        .collect();
    let recorded = record_and_finish(
        shared,
        part,
        planned.claim,
        &originals,
        |current| CleaningIntent {
            replaced,
            replacements,
            cleaned_to: mapped_end.max(current.cleaned_to),
            forget_aborted: forgotten,
        },
        fresh_entries,
        "cleaning",
    )
    .await?;
    if !recorded {
        return Ok(false);
    }
    let stats = &shared.cleaner_stats;
    stats.bytes_read.fetch_add(bytes_read, Ordering::Relaxed);
    stats.bytes_written.fetch_add(written, Ordering::Relaxed);
    stats.records_removed.fetch_add(removed, Ordering::Relaxed);
    stats.passes.fetch_add(1, Ordering::Relaxed);
    stats
        .last_pass_millis
        .store(u64::try_from(now).unwrap_or(0), Ordering::Relaxed);
    tracing::info!(partition = %part.tp, cleaned_to = mapped_end, bytes_read, written, removed, "cleaned");
    Ok(true)
}

/// Records a rewrite of segments in the manifest and finishes it (the cleaner's swap, step 3;
/// the tiering pass uses it too): under the partition's maintenance lock, checks that the
/// partition is still ours, under the claim `planned_claim` the pass read, with no other pass
/// recorded and every one of `originals` still listed; records the intent `intent` builds
/// from the current manifest (compare-and-swap: a deposed owner stops here); then repoints the
/// index chunks and swaps the segment lists ([`finish_pending`]). False: dropped, nothing
/// recorded (the new segments are orphans for the collector).
pub(crate) async fn record_and_finish(
    shared: &Shared,
    part: &Arc<Partition>,
    planned_claim: u64,
    originals: &[SegmentRef],
    intent: impl FnOnce(&Manifest) -> CleaningIntent,
    fresh_entries: Vec<IndexEntry>,
    what: &str,
) -> LogResult<bool> {
    let _serial = part.maintenance.lock().await;
    let (current, version, serving) = {
        let st = part.lock();
        (st.manifest.clone(), st.manifest_version.clone(), st.serving)
    };
    // Handed over (or its topic deleted) while the pass read and wrote: the successor owns
    // the manifest now, so recording the pass would fail and read as being deposed. The
    // segments written are orphans the successor's collector removes.
    if serving == Serving::Gone {
        tracing::info!(partition = %part.tp, "{what} pass dropped: the partition was handed over");
        return Ok(false);
    }
    // Retention, DeleteRecords or a new owner may have moved on while we read: every replaced
    // segment must still be listed, under our claim, with no other pass recorded.
    let still_listed = originals
        .iter()
        .all(|original| current.segments.iter().any(|s| s.segment == *original));
    if current.claim != planned_claim || current.cleaning.is_some() || !still_listed {
        tracing::info!(partition = %part.tp, "{what} pass dropped: the manifest changed under it");
        return Ok(false);
    }
    let mut next = current.clone();
    next.cleaning = Some(intent(&current));
    next.writer_stream = shared.stream;
    match put_manifest(shared, part, &next, version).await {
        Ok(v) => {
            let mut st = part.lock();
            st.manifest = next;
            st.manifest_version = Some(v);
        }
        Err(LogError::Fenced) => {
            resync_manifest(shared, part).await?;
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    finish_pending(shared, part, Some(fresh_entries)).await?;
    Ok(true)
}

/// Index entries of a stored segment, from its batch headers (for finishing a pass recorded by
/// an earlier owner, whose entries are not in memory).
async fn entries_of(
    shared: &Shared,
    part: &Partition,
    meta: &SegmentMeta,
) -> LogResult<Vec<IndexEntry>> {
    let bytes = read_segment(shared, part, meta).await?;
    entries_in(&bytes, meta.segment)
}

/// Index entries of segment `segment` holding `bytes`, from its batch headers.
pub(crate) fn entries_in(bytes: &Bytes, segment: SegmentRef) -> LogResult<Vec<IndexEntry>> {
    let mut out = Vec::new();
    let mut position = 0u32;
    for batch in batches_of(bytes)? {
        let h = batch.header();
        let length = batch.encoded_len() as u32;
        out.push(IndexEntry {
            base_offset: h.base_offset,
            last_offset_delta: h.last_offset_delta as u32,
            length,
            position,
            segment,
            max_timestamp: h.max_timestamp,
        });
        position += length;
    }
    Ok(out)
}

/// Finishes the pass recorded in the manifest: points the index chunks of its range at the new
/// segments, swaps the segment lists, moves `cleaned_to`, and deletes the replaced segments.
/// Idempotent, so any owner may run it again after a crash. The caller holds the partition's
/// maintenance lock.
pub(crate) async fn finish_pending(
    shared: &Shared,
    part: &Arc<Partition>,
    entries: Option<Vec<IndexEntry>>,
) -> LogResult<()> {
    let (manifest, _) = {
        let st = part.lock();
        (st.manifest.clone(), st.manifest_version.clone())
    };
    let Some(intent) = manifest.cleaning.clone() else {
        return Ok(());
    };
    let entries = match entries {
        Some(e) => e,
        None => {
            let mut all = Vec::new();
            for meta in &intent.replacements {
                all.extend(entries_of(shared, part, meta).await?);
            }
            all
        }
    };
    let replaced: HashSet<SegmentRef> = intent.replaced.iter().copied().collect();
    let fresh: HashSet<SegmentRef> = intent.replacements.iter().map(|m| m.segment).collect();
    let span = shared.config.index_chunk_span;
    let replaced_range = manifest
        .segments
        .iter()
        .filter(|s| replaced.contains(&s.segment))
        .fold(None, |acc: Option<(i64, i64)>, s| {
            let (lo, hi) = acc.unwrap_or((s.segment.base_offset, s.last_offset));
            Some((lo.min(s.segment.base_offset), hi.max(s.last_offset)))
        });
    if replaced_range.is_none() && !replaced.is_empty() {
        return Err(LogError::CorruptStorage(format!(
            "{}: a recorded cleaning pass replaces segments the manifest does not list",
            part.tp
        )));
    }
    let stamp = ChunkStamp {
        claim: manifest.claim,
        stream: shared.stream,
    };
    let mut chunks = Vec::new();
    // A segment's batches all start at or after its name's base, so these chunks hold every
    // entry of the replaced segments.
    let chunk_range = replaced_range
        .map(|(lo, hi)| index::chunk_of(lo, span)..=index::chunk_of(hi, span))
        .into_iter()
        .flatten();
    for k in chunk_range {
        let mine: Vec<IndexEntry> = entries
            .iter()
            .filter(|e| index::chunk_of(e.base_offset, span) == k)
            .copied()
            .collect();
        let chunk = write_chunk_with(shared, part, k, stamp, |current| {
            let mut merged: Vec<IndexEntry> = current
                .iter()
                .filter(|e| !replaced.contains(&e.segment) && !fresh.contains(&e.segment))
                .copied()
                .collect();
            merged.extend_from_slice(&mine);
            merged.sort_by_key(|e| e.base_offset);
            merged
        })
        .await?;
        chunks.push((k, chunk));
    }

    let (current, version) = {
        let st = part.lock();
        (st.manifest.clone(), st.manifest_version.clone())
    };
    let now = shared.clock.wall_millis();
    let mut next = current.clone();
    next.segments.retain(|s| !replaced.contains(&s.segment));
    next.segments.extend(intent.replacements.iter().copied());
    next.segments.sort_by_key(|s| s.segment.base_offset);
    for s in next.segments.iter_mut() {
        if s.last_offset < intent.cleaned_to && s.cleaned_at.is_none() {
            s.cleaned_at = Some(now);
        }
    }
    next.cleaned_to = next.cleaned_to.max(intent.cleaned_to);
    next.producers
        .aborted
        .retain(|a| !intent.forget_aborted.contains(a));
    next.cleaning = None;
    next.writer_stream = shared.stream;
    let v = match put_manifest(shared, part, &next, version).await {
        Ok(v) => v,
        Err(LogError::Fenced) => {
            resync_manifest(shared, part).await?;
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    {
        let mut st = part.lock();
        st.manifest = next;
        st.manifest_version = Some(v);
        // In the same step as the segments whose markers may go: the manifest and both
        // in-memory lists forget the ranges together.
        let forget = &intent.forget_aborted;
        st.producers.aborted.retain(|a| !forget.contains(a));
        st.txns.aborted.retain(|a| !forget.contains(a));
        for (k, chunk) in chunks {
            st.remember_chunk(k, chunk);
        }
        // The tail cache may still hold batches as appended; readers must see them cleaned.
        // (The cache's FIFO forgets them on its own: evicting a batch no longer here is a no-op.)
        if let Some((_, hi)) = replaced_range {
            st.cache.retain(|c| c.base_offset > hi);
        }
    }
    // Readers that found a replaced segment through a chunk read before the swap retry through
    // the new chunk (see `read`).
    for r in intent.replaced.iter().filter(|r| !fresh.contains(r)) {
        delete_quietly(
            shared,
            &manifest::segment_key(part.topic_id, part.tp.partition, *r),
        )
        .await;
    }
    Ok(())
}

/// Cleaned and fast-tier segments of `part` (the kinds named by claim) that nothing names any more: not in the stored manifest's list
/// or recorded pass, not being written by a pass of ours, and written under a claim no later
/// than ours (a successor's are never ours to judge). Called by the collector under the
/// partition's maintenance lock, after it checked the stored manifest is still ours.
pub(crate) fn unreferenced_cleaned(
    stored: &Manifest,
    listed_keys: &[(String, SegmentRef)],
    inflight: &HashSet<String>,
) -> Vec<String> {
    let named: BTreeSet<SegmentRef> = stored
        .segments
        .iter()
        .map(|s| s.segment)
        .chain(
            stored
                .cleaning
                .iter()
                .flat_map(|c| c.replacements.iter().map(|m| m.segment)),
        )
        .collect();
    listed_keys
        .iter()
        .filter(|(key, r)| r.claim <= stored.claim && !named.contains(r) && !inflight.contains(key))
        .map(|(key, _)| key.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_map_keeps_the_latest_offset_and_refuses_new_keys_when_full() {
        let mut map = OffsetMap::with_memory(10 * SLOT_BYTES);
        assert_eq!(map.capacity, 9);
        for i in 0..9 {
            assert!(map.put(format!("k{i}").as_bytes(), i));
        }
        assert!(map.put(b"k3", 100), "an update of a known key always fits");
        assert!(!map.put(b"new", 7), "a tenth key does not");
        assert_eq!(map.get(b"k3"), Some(100));
        assert_eq!(map.get(b"k0"), Some(0));
        assert_eq!(map.get(b"new"), None);
        assert_eq!(map.len(), 9);
    }
}
