//! Taking over and handing over partitions.
//!
//! A partition's manifest names the stream (broker incarnation) that may hold its batches
//! beyond the checkpoint. To take a partition over, a broker:
//! 1. fences that stream with a seal, unless the previous owner released the partition
//!    gracefully (its tail is then already compacted and it may still be serving others);
//! 2. replays the stream's objects below the seal for this partition, from the checkpoint;
//! 3. claims the manifest by compare-and-swap with its own stream and epoch — from then on the
//!    old owner's manifest updates fail;
//! 4. serves it, and compacts the replayed tail soon after in the background (the
//!    `replayed` queue), so nothing of it depends on the old stream for long.
//!
//! The old owner cannot acknowledge anything after step 1 (its next group commit hits the seal)
//! and cannot change the manifest after step 3: one writer per epoch, by construction.
//! Handing over is the cooperative version: stop appends, let pending ones land, compact,
//! write the manifest with `released`, forget the partition. No record is copied to the new
//! owner; it reads the manifest.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use strata_core::{Offset, TopicPartition};
use strata_storage::{ObjectKey, StorageError, Version};

use crate::cache::CachedBatch;
use crate::catalog::{TopicId, TopicInfo};
use crate::manager::LogManager;
use crate::manifest::read_manifest;
use crate::manifest::Manifest;
use crate::partition::{PartState, Partition, Serving, TailEntry};
use crate::shared::{lock_mutex, read_lock, write_partitions, Shared};
use crate::wal;
use crate::{LogError, LogResult};

/// Manifest reads, manifest claims and write-ahead reads in flight at once during a takeover:
/// enough to hide a local disk's sync or an object store's round trip behind each other (and,
/// on ext4, to share each journal commit among many fsyncs), few enough to leave the storage
/// limits to the write path: with the cluster's claims running beside them
/// (`strata_cluster::CLAIMS_AT_ONCE`), half of the default 256 requests in flight. 64 rather
/// than 32 took a 10,000-partition takeover from 18.2 to 17.4 s on a 2-core machine, one run
/// each (docs/BENCHMARKS.md).
pub(crate) const TAKEOVER_CONCURRENCY: usize = 64;

/// Compactions of replayed tails in flight at once, behind serving. Fewer than the takeover's
/// own requests: they run while the rest of a takeover is still being acquired, and three
/// durable writes each.
pub(crate) const REPLAYED_COMPACTIONS_AT_ONCE: usize = 32;

/// How long a takeover keeps what it read of a sealed stream after last using it: long enough
/// for the next batches of the same takeover (the cluster hands a big one over in batches of
/// thousands, each a call of [`acquire`]), short enough that the objects do not outlive it.
const SEALED_STREAM_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// What takeovers learnt of the streams they sealed, for the later batches of the same
/// takeover. A 10,000-partition takeover came in three batches, and each sealed the dead
/// stream again and read all of its objects again, one after another: 3.6 s of its 19 s.
///
/// Keeping them is exact, not a cache that can go stale: a seal is final (sealing again finds
/// it), and below the seal every sequence number holds a data object or a hole marker, all
/// created once and never rewritten, so no object can appear there later. One can disappear
/// (collected once every batch in it was compacted), and replaying a kept copy of it is
/// harmless: its batches lie below the offsets the manifests now start from, so they are
/// skipped as already compacted. The objects are kept only if together they fit in
/// `cache_bytes`: the tails replayed from them are held in memory until compacted anyway.
#[derive(Debug, Default)]
pub(crate) struct SealedStreams {
    streams: std::sync::Mutex<HashMap<u32, Sealed>>,
}

#[derive(Debug)]
struct Sealed {
    seal: u64,
    /// The objects below the seal, in order, once read (None: not read, or too large to keep).
    objects: Option<Arc<[WalObject]>>,
    used_at: std::time::Duration,
}

/// A write-ahead object below a seal, decoded.
#[derive(Debug)]
struct WalObject {
    key: ObjectKey,
    seq: u64,
    bytes: Bytes,
    header: wal::WalHeader,
}

impl SealedStreams {
    /// Forgets what was last used longer ago than [`SEALED_STREAM_KEPT_FOR`]: at every
    /// takeover batch and every maintenance tick.
    pub(crate) fn expire(&self, now: std::time::Duration) {
        lock_mutex(&self.streams)
            .retain(|_, s| now.saturating_sub(s.used_at) < SEALED_STREAM_KEPT_FOR);
    }

    fn seal(&self, stream: u32, now: std::time::Duration) -> Option<u64> {
        let mut streams = lock_mutex(&self.streams);
        let sealed = streams.get_mut(&stream)?;
        sealed.used_at = now;
        Some(sealed.seal)
    }

    fn sealed(&self, stream: u32, seal: u64, now: std::time::Duration) {
        lock_mutex(&self.streams).insert(
            stream,
            Sealed {
                seal,
                objects: None,
                used_at: now,
            },
        );
    }

    fn objects(&self, stream: u32, seal: u64) -> Option<Arc<[WalObject]>> {
        let streams = lock_mutex(&self.streams);
        let sealed = streams.get(&stream).filter(|s| s.seal == seal)?;
        sealed.objects.clone()
    }

    fn keep_objects(&self, stream: u32, seal: u64, objects: Arc<[WalObject]>) {
        if let Some(sealed) = lock_mutex(&self.streams)
            .get_mut(&stream)
            .filter(|s| s.seal == seal)
        {
            sealed.objects = Some(objects);
        }
    }

    /// How many streams are kept (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock_mutex(&self.streams).len()
    }
}

/// One partition to take over, under `epoch` (None = one past the manifest's epoch, for a
/// broker that owns everything by itself).
#[derive(Debug, Clone)]
pub struct Acquire {
    pub topic: Arc<TopicInfo>,
    pub partition: i32,
    pub epoch: Option<u64>,
}

struct Loading {
    want: Acquire,
    manifest: Manifest,
    version: Option<Version>,
    state: PartState,
    /// Streams to replay, in order (inherited ones, then the last owner's).
    replay: Vec<u32>,
    /// Streams that contributed batches to the tail.
    contributed: Vec<u32>,
}

/// Claims lost to the fenced owner's own manifest writes that are taken again from the start
/// before the partition is reported as lost. The owner is sealed, so its tail cannot grow and
/// its compactions run out within a few passes; a bound still keeps two brokers that keep
/// deposing each other from looping here.
const CLAIM_RETRIES: usize = 4;

/// Takes over `wanted` partitions (see the module doc). Partitions already served here are
/// skipped. Returns the partitions now served; one that lost a race for its manifest is
/// reported as `Fenced` in the error list and not served.
///
/// A claim can lose its compare-and-swap without anyone else claiming: the owner we just
/// sealed may still compact its tail or apply retention, which rewrites the manifest under the
/// same claim. That is not a lost race; the partition is loaded again from the new manifest.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    mut wanted: Vec<Acquire>,
) -> LogResult<Vec<(TopicPartition, LogResult<()>)>> {
    let mut results = Vec::new();
    for attempt in 0..=CLAIM_RETRIES {
        let last = attempt == CLAIM_RETRIES;
        let (mut done, again) = acquire_pass(shared, wanted, last).await?;
        results.append(&mut done);
        if again.is_empty() {
            break;
        }
        tracing::info!(
            partitions = again.len(),
            attempt,
            "the fenced owner rewrote manifests during the takeover; loading them again"
        );
        wanted = again;
    }
    Ok(results)
}

/// One pass of [`acquire`]. Returns the settled results and, unless `last`, the partitions
/// whose claim lost only to the previous owner's own maintenance (to be loaded again).
async fn acquire_pass(
    shared: &Arc<Shared>,
    wanted: Vec<Acquire>,
    last: bool,
) -> LogResult<(Vec<(TopicPartition, LogResult<()>)>, Vec<Acquire>)> {
    let mut loading = Vec::new();
    let mut results = Vec::new();
    let mut again = Vec::new();
    let mut to_read = Vec::new();
    let mut phases = Phases::new(shared);
    for want in wanted {
        let tp = TopicPartition::new(want.topic.name.clone(), want.partition);
        if let Some(part) = shared.partition(&tp) {
            let same_epoch = want.epoch.is_none_or(|e| e == part.epoch());
            let resumed = {
                let mut st = part.lock();
                if !st.serving.is_suspended() {
                    true
                } else if same_epoch {
                    // Serving again under the same epoch: nobody took it over meanwhile (that
                    // would have been a new epoch), so our in-memory state is still the truth.
                    st.serving = Serving::Active;
                    tracing::info!(partition = %tp, epoch = part.epoch(), "serving partition again");
                    true
                } else {
                    false
                }
            };
            if resumed {
                results.push((tp, Ok(())));
                continue;
            }
            if let Some(epoch) = want.epoch {
                match resume_under_new_epoch(shared, &part, epoch).await {
                    Ok(true) => {
                        results.push((tp, Ok(())));
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        results.push((tp, Err(e)));
                        continue;
                    }
                }
            }
            // A new epoch and someone else held it in between: they sealed our stream; what we
            // hold is stale.
            write_partitions(shared).remove(&tp);
        }
        to_read.push((tp, want));
    }
    // Manifests are independent objects: read them concurrently (one at a time, 10,000 of
    // them were most of a large takeover on a local disk).
    let read: Vec<_> = futures::stream::iter(to_read)
        .map(|(tp, want)| async move {
            let manifest = read_manifest(shared, want.topic.id, want.partition).await;
            (tp, want, manifest)
        })
        .buffered(TAKEOVER_CONCURRENCY)
        .collect()
        .await;
    for (tp, want, manifest) in read {
        let (manifest, version) = match manifest {
            Ok(m) => m,
            Err(e) => {
                results.push((tp, Err(e)));
                continue;
            }
        };
        // Our own claim at this very epoch landed in an earlier attempt that then failed (an
        // ambiguous storage error, a failure right after the claim) before the partition was
        // served: nothing can be in our stream for it, since appends need it served. Replaying
        // the streams the claim inherited and claiming again is exactly the first attempt.
        let own_unserved_claim = manifest.writer_stream == shared.stream
            && !manifest.released
            && want.epoch == Some(manifest.epoch);
        if manifest.writer_stream == shared.stream && !manifest.released && !own_unserved_claim {
            // Our own unreleased tail is not in memory (dropped above): a fresh load would not
            // replay it and would hand its offsets out again. Refuse; only a new incarnation
            // (a restart) may serve this partition now.
            results.push((tp, Err(LogError::Fenced)));
            continue;
        }
        let mut replay: Vec<u32> = manifest
            .inherited_streams
            .iter()
            .copied()
            .filter(|s| *s != shared.stream)
            .collect();
        if manifest.writer_stream != 0
            && manifest.writer_stream != shared.stream
            && !manifest.released
            && !replay.contains(&manifest.writer_stream)
        {
            replay.push(manifest.writer_stream);
        }
        let state = PartState::fresh(manifest.clone(), version.clone());
        loading.push(Loading {
            want,
            manifest,
            version,
            state,
            replay,
            contributed: Vec::new(),
        });
    }

    phases.mark("manifests");
    // Fence every stream involved once, however many of its partitions we take.
    let streams: BTreeSet<u32> = loading
        .iter()
        .flat_map(|l| l.replay.iter().copied())
        .collect();
    let mut seals = HashMap::new();
    shared.sealed_streams.expire(shared.clock.monotonic());
    for stream in streams {
        if let Some(seal) = shared.sealed_streams.seal(stream, shared.clock.monotonic()) {
            seals.insert(stream, seal);
            continue;
        }
        let seal = wal::seal_stream(
            shared.store.as_ref(),
            stream,
            shared.broker,
            shared.clock.wall_millis(),
            shared.config.max_inflight_flushes,
        )
        .await?;
        tracing::info!(stream, seal, "fenced write-ahead stream for takeover");
        shared
            .sealed_streams
            .sealed(stream, seal, shared.clock.monotonic());
        seals.insert(stream, seal);
    }
    phases.mark("seal");
    // Replay in ownership order: the k-th stream of every partition's list, for k = 0, 1, …
    // (each stream is read once per round, for all partitions that need it at that rank).
    let rounds = loading.iter().map(|l| l.replay.len()).max().unwrap_or(0);
    for round in 0..rounds {
        let mut by_stream: BTreeMap<u32, HashMap<(TopicId, i32), usize>> = BTreeMap::new();
        for (i, l) in loading.iter().enumerate() {
            if let Some(&stream) = l.replay.get(round) {
                by_stream
                    .entry(stream)
                    .or_default()
                    .insert((l.want.topic.id, l.want.partition), i);
            }
        }
        for (stream, targets) in by_stream {
            let seal = seals.get(&stream).copied().unwrap_or(0);
            replay_stream(shared, stream, seal, &targets, &mut loading).await?;
        }
    }

    phases.mark("replay");
    // Claims of different manifests do not depend on each other: concurrently.
    let claims: Vec<_> = futures::stream::iter(loading)
        .map(|mut l| async move {
            let epoch = l.want.epoch.unwrap_or(l.manifest.epoch + 1);
            let mut claimed = l.manifest.clone();
            claimed.writer_stream = shared.stream;
            claimed.epoch = epoch;
            claimed.claim = l.manifest.claim + 1;
            claimed.released = false;
            claimed.inherited_streams = l.contributed.clone();
            let put = crate::maintenance::put_manifest_raw(
                shared,
                l.want.topic.id,
                l.want.partition,
                &claimed,
                l.version.clone(),
            )
            .await;
            let put = put.map(|version| {
                l.state.manifest = claimed;
                l.state.manifest_version = Some(version);
            });
            (l, epoch, put)
        })
        .buffered(TAKEOVER_CONCURRENCY)
        .collect()
        .await;
    let mut acquired = Vec::new();
    for (l, epoch, put) in claims {
        let tp = TopicPartition::new(l.want.topic.name.clone(), l.want.partition);
        if let Err(e) = put {
            if !last && matches!(e, LogError::Fenced) && only_owner_maintenance(shared, &l).await {
                again.push(l.want);
                continue;
            }
            tracing::warn!(partition = %tp, error = %e, "lost the race for a partition's manifest");
            results.push((tp, Err(e)));
            continue;
        }
        let part = Arc::new(Partition::new(tp.clone(), l.want.topic.id, epoch, l.state));
        write_partitions(shared).insert(tp.clone(), part.clone());
        tracing::info!(partition = %tp, epoch, high_watermark = part.lock().high_watermark, "serving partition");
        acquired.push(part);
        results.push((tp, Ok(())));
    }
    phases.mark("claim");
    for part in &acquired {
        let cached: Vec<(i64, usize)> = part
            .lock()
            .cache
            .iter()
            .map(|c| (c.base_offset, c.bytes.len()))
            .collect();
        for (base, len) in cached {
            shared.cache.admitted(part, base, len);
        }
    }
    // Replayed tails are compacted behind serving, not before: a takeover of thousands of
    // partitions spent most of its time in these compactions (three durable writes each) while
    // the partitions stayed unserved. Serving does not need them: the claimed manifest names
    // the inherited streams, so reads and a later takeover still find the replayed batches.
    let replayed: Vec<Arc<Partition>> = acquired
        .iter()
        .filter(|part| part.lock().tail.iter().any(|t| t.stream != shared.stream))
        .cloned()
        .collect();
    let queued = replayed.len();
    shared.replayed.push(replayed);
    if !acquired.is_empty() {
        tracing::info!(partitions = acquired.len(), replayed = queued, phases = %phases, "took partitions over");
    }
    Ok((results, again))
}

/// Whether a manifest that changed under our claim was rewritten only by the owner we were
/// taking over from (same writer, same claim, same epoch: a compaction, a retention pass, a
/// release), rather than claimed by someone else. Unreadable counts as a real loss.
async fn only_owner_maintenance(shared: &Shared, l: &Loading) -> bool {
    match read_manifest(shared, l.want.topic.id, l.want.partition).await {
        Ok((stored, Some(_))) => {
            stored.writer_stream == l.manifest.writer_stream
                && stored.claim == l.manifest.claim
                && stored.epoch == l.manifest.epoch
        }
        _ => false,
    }
}

/// A suspended partition offered back to us under a newer epoch: our lease lapsed (a storage
/// outage longer than the lease, a pause) and the cluster gave the partition to us again. If
/// nobody claimed it in between — the stored manifest is still exactly our last write, same
/// claim, our stream, not released — our in-memory state (with the uncompacted tail that lives
/// in our own stream, which we could not replay ourselves) is still the truth: claim the new
/// epoch on the manifest by compare-and-swap and serve on. Returns false when someone else
/// claimed it (or wins the race now): the caller then loads it afresh as a takeover.
async fn resume_under_new_epoch(
    shared: &Arc<Shared>,
    part: &Arc<Partition>,
    epoch: u64,
) -> LogResult<bool> {
    if epoch <= part.epoch() {
        return Ok(false);
    }
    let _serial = part.maintenance.lock().await;
    let (stored, version) = read_manifest(shared, part.topic_id, part.tp.partition).await?;
    let next = {
        let st = part.lock();
        let untouched = version.is_some()
            && version == st.manifest_version
            && stored.writer_stream == shared.stream
            && !stored.released
            && stored.claim == st.manifest.claim;
        if !untouched {
            return Ok(false);
        }
        let mut next = st.manifest.clone();
        next.epoch = epoch;
        next.claim += 1;
        next
    };
    let new_version = match crate::maintenance::put_manifest_raw(
        shared,
        part.topic_id,
        part.tp.partition,
        &next,
        version,
    )
    .await
    {
        Ok(v) => v,
        Err(LogError::Fenced) => return Ok(false),
        Err(e) => return Err(e),
    };
    {
        let mut st = part.lock();
        st.manifest = next;
        st.manifest_version = Some(new_version);
        st.serving = Serving::Active;
    }
    let previous = part.epoch();
    part.set_epoch(epoch);
    tracing::info!(partition = %part.tp, previous, epoch, "serving partition again under a new epoch; nobody held it in between");
    Ok(true)
}

/// Replays one sealed stream's objects (below the seal) into the partitions being loaded.
/// A batch is taken only at exactly the next expected offset: batches already compacted are
/// skipped, and one after a gap (a write after a failed one, never acknowledged) is ignored.
///
/// The objects are read [`TAKEOVER_CONCURRENCY`] at a time, in order of sequence (one at a
/// time, a dead stream of 2,600 objects took a second per takeover batch on a local disk),
/// and kept for the takeover's next batches ([`SealedStreams`]) while they fit in
/// `cache_bytes`; past that they are dropped as they are replayed, as before.
async fn replay_stream(
    shared: &Shared,
    stream: u32,
    seal: u64,
    targets: &HashMap<(TopicId, i32), usize>,
    loading: &mut [Loading],
) -> LogResult<()> {
    if let Some(objects) = shared.sealed_streams.objects(stream, seal) {
        for object in objects.iter() {
            replay_object(shared, stream, object, targets, loading);
        }
        return Ok(());
    }
    let listed = shared.store.list(&wal::stream_prefix(stream)).await?;
    let mut seqs: Vec<(u64, ObjectKey)> = listed
        .into_iter()
        .filter_map(|m| wal::parse_key(m.key.as_str()).map(|(_, q)| (q, m.key)))
        .filter(|(q, _)| *q < seal)
        .collect();
    seqs.sort();
    let mut fetched = futures::stream::iter(seqs)
        .map(|(seq, key)| async move {
            let got = shared.store.get(&key).await.map(|(bytes, _)| bytes);
            (seq, key, got)
        })
        .buffered(TAKEOVER_CONCURRENCY);
    let mut kept = Some((Vec::new(), 0usize));
    while let Some((seq, key, got)) = fetched.next().await {
        let bytes = match got {
            Ok(bytes) => bytes,
            // Collected: nothing in it was still needed.
            Err(StorageError::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if wal::is_seal(&bytes) {
            // A hole marker below the seal: that write never landed.
            continue;
        }
        let header = match wal::decode(&bytes) {
            Ok(h) if (h.stream, h.seq) == (stream, seq) => h,
            Ok(_) | Err(_) => {
                tracing::error!(%key, "unreadable or misplaced write-ahead object left in place");
                continue;
            }
        };
        let object = WalObject {
            key,
            seq,
            bytes,
            header,
        };
        replay_object(shared, stream, &object, targets, loading);
        if let Some((objects, size)) = &mut kept {
            *size += object.bytes.len();
            if *size > shared.config.cache_bytes {
                kept = None;
            } else {
                objects.push(object);
            }
        }
    }
    if let Some((objects, _)) = kept {
        shared
            .sealed_streams
            .keep_objects(stream, seal, objects.into());
    }
    Ok(())
}

/// Replays the batches of one object of `stream` that belong to the partitions being loaded.
fn replay_object(
    shared: &Shared,
    stream: u32,
    object: &WalObject,
    targets: &HashMap<(TopicId, i32), usize>,
    loading: &mut [Loading],
) {
    let (key, seq, header) = (&object.key, object.seq, &object.header);
    for e in &header.entries {
        let Some(&i) = targets.get(&(e.topic_id, e.partition)) else {
            continue;
        };
        let l = &mut loading[i];
        if !l.contributed.contains(&stream) {
            l.contributed.push(stream);
        }
        let st = &mut l.state;
        if e.base_offset != st.next_offset {
            if e.base_offset > st.next_offset {
                tracing::warn!(%key, expected = st.next_offset, found = e.base_offset,
                    "write-ahead batch after a gap ignored (never acknowledged)");
            }
            continue;
        }
        let tail = TailEntry {
            base_offset: e.base_offset,
            last_offset: e.last_offset(),
            max_timestamp: e.max_timestamp,
            stream,
            seq,
            position: e.position,
            length: e.length,
            producer_id: e.producer_id,
            producer_epoch: e.producer_epoch,
            base_sequence: e.base_sequence,
            record_count: e.record_count,
            kind: e.kind,
        };
        // Replayed batches are durable: both views of the producers follow them.
        st.producers.apply(&tail.info());
        st.txns.apply(&tail.info());
        st.next_offset = tail.last_offset + 1;
        st.high_watermark = st.next_offset;
        st.tail_bytes += e.length as usize;
        st.tail_since.get_or_insert(shared.clock.monotonic());
        st.tail.push_back(tail);
        let bytes: Bytes = object
            .bytes
            .slice(e.position as usize..(e.position + e.length) as usize);
        st.cache.push_back(CachedBatch {
            base_offset: tail.base_offset,
            last_offset: tail.last_offset,
            bytes,
        });
    }
}

/// Hands a partition over: refuse new appends, wait for pending ones to become durable,
/// compact the tail, mark the manifest released, stop serving. Returns the final high
/// watermark.
/// Returns, beside the outcome, the background task deleting the write-ahead objects the
/// handover freed (if any), for the manager to wait for at shutdown.
pub(crate) async fn release(
    shared: &Arc<Shared>,
    tp: &TopicPartition,
) -> (LogResult<Offset>, Option<tokio::task::JoinHandle<()>>) {
    let Some(part) = shared.partition(tp) else {
        return (Err(LogError::NotOwner), None);
    };
    let mut phases = Phases::new(shared);
    // Write-ahead objects the passes free are deleted only once the partition is handed over,
    // in the background. Deleted inside the passes, one at a time (each syncs a directory on
    // a local disk), a thousand of them took seconds; the serving pass's delay became the
    // backlog of the pass that runs while produce is refused, and each move fed the next
    // (issue 19: 0.4 s moves turning into 1.9 s ones).
    let mut freed = Vec::new();
    let outcome = release_compacted(shared, &part, &mut phases, &mut freed).await;
    let deleting = (!freed.is_empty()).then(|| {
        tokio::spawn(crate::maintenance::delete_unreferenced(
            Arc::clone(&shared.store),
            freed,
            shared.config.wal_delete_concurrency,
        ))
    });
    if let Ok(hw) = &outcome {
        tracing::info!(partition = %tp, high_watermark = hw, phases = %phases, "handed partition over");
    }
    (outcome.map(Offset), deleting)
}

/// [`release`] up to the released manifest, collecting the write-ahead objects it freed.
async fn release_compacted(
    shared: &Arc<Shared>,
    part: &Arc<Partition>,
    phases: &mut Phases<'_>,
    freed: &mut Vec<String>,
) -> LogResult<i64> {
    let tp = &part.tp;
    let mut hw_rx = part.hw.subscribe();
    // Compact what is durable *while still serving*: the pass after appends stop then covers
    // only what arrived meanwhile, so the time the partition refuses produce does not grow
    // with a compaction backlog (after a bulk load compaction can lag the writes by hundreds
    // of megabytes: 2 s of unavailability on the first move in the migration benchmark).
    // A failure here only means the second pass has more to do.
    if let Err(e) = crate::maintenance::compact_collecting(shared, part, freed).await {
        tracing::warn!(partition = %tp, error = %e, "compaction before handover failed; retried after appends stop");
    }
    phases.mark("compact_serving");
    {
        let mut st = part.lock();
        // A suspended partition stays suspended: it is released all the same (its manifest
        // is marked released for the successor), but serves nothing meanwhile.
        if st.serving == Serving::Active {
            st.serving = Serving::Releasing;
        }
    }
    // Appends already queued keep their place in the group commit; wait for them.
    let deadline = shared
        .clock
        .monotonic()
        .saturating_add(shared.config.handover_timeout);
    loop {
        let (hw, next) = {
            let st = part.lock();
            (st.high_watermark, st.next_offset)
        };
        if hw >= next {
            break;
        }
        if strata_core::timeout_at(shared.clock.as_ref(), deadline, hw_rx.changed())
            .await
            .is_err()
        {
            end_release(part);
            return Err(LogError::Timeout);
        }
    }
    phases.mark("drain");
    if let Err(e) = crate::maintenance::compact_collecting(shared, part, freed).await {
        end_release(part);
        return Err(e);
    }
    phases.mark("compact_refusing");
    let _serial = part.maintenance.lock().await;
    let (mut manifest, version) = {
        let st = part.lock();
        (st.manifest.clone(), st.manifest_version.clone())
    };
    manifest.released = true;
    crate::maintenance::put_manifest_raw(shared, part.topic_id, tp.partition, &manifest, version)
        .await?;
    phases.mark("manifest");
    let hw = {
        let mut st = part.lock();
        st.serving = Serving::Gone;
        st.high_watermark
    };
    write_partitions(shared).remove(tp);
    // Wake long-polls so they notice the partition is gone.
    part.hw.send_replace(Offset(hw));
    Ok(hw)
}

/// Durations of the steps of a takeover or handover, for its log line: a slow move is then
/// explained by the line that reports it.
struct Phases<'a> {
    shared: &'a Shared,
    last: std::time::Duration,
    done: Vec<(&'static str, std::time::Duration)>,
}

impl<'a> Phases<'a> {
    fn new(shared: &'a Shared) -> Self {
        Self {
            shared,
            last: shared.clock.monotonic(),
            done: Vec::new(),
        }
    }

    fn mark(&mut self, phase: &'static str) {
        let now = self.shared.clock.monotonic();
        self.done.push((phase, now.saturating_sub(self.last)));
        self.last = now;
    }
}

impl std::fmt::Display for Phases<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (phase, took)) in self.done.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{phase}={:.1}ms", took.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

/// A handover that failed before the manifest was released: serve appends again (unless the
/// partition was suspended meanwhile, which the failed handover does not undo).
fn end_release(part: &Partition) {
    let mut st = part.lock();
    if st.serving == Serving::Releasing {
        st.serving = Serving::Active;
    }
}

/// Partitions of `topics` not yet served here.
pub(crate) fn missing(shared: &Shared, topics: &BTreeMap<String, Arc<TopicInfo>>) -> Vec<Acquire> {
    let mut out = Vec::new();
    for info in topics.values() {
        for p in 0..info.partitions {
            let tp = TopicPartition::new(info.name.clone(), p);
            if shared.partition(&tp).is_none() {
                out.push(Acquire {
                    topic: info.clone(),
                    partition: p,
                    epoch: None,
                });
            }
        }
    }
    out
}

// The manager's ownership API: which partitions this broker serves, taking them over and
// handing them on (the functions above do the work).
impl LogManager {
    pub(crate) fn partition(&self, tp: &TopicPartition) -> LogResult<Arc<Partition>> {
        let p = self.partition_readable(tp)?;
        if p.lock().serving.is_suspended() {
            return Err(LogError::NotOwner);
        }
        Ok(p)
    }

    /// [`Self::partition`], but also a partition suspended by [`Self::suspend_writes`]: its
    /// data below the high watermark is durable and never rewritten, so it can still be read.
    pub(crate) fn partition_readable(&self, tp: &TopicPartition) -> LogResult<Arc<Partition>> {
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
        read_lock(&self.shared.partitions)
            .values()
            .filter(|p| !p.lock().serving.is_suspended())
            .map(|p| (p.tp.clone(), p.epoch()))
            .collect()
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
        let checked = self.shared.clock.monotonic();
        if !wanted.is_empty() && self.is_sealed().await? {
            tracing::error!(
                stream = self.shared.stream,
                "refusing to take partitions over: a successor sealed our write-ahead stream"
            );
            self.shared.fenced.send_replace(true);
            return Err(LogError::Fenced);
        }
        tracing::debug!(
            took_ms = self
                .shared
                .clock
                .monotonic()
                .saturating_sub(checked)
                .as_secs_f64()
                * 1e3,
            "checked our own stream for a seal before a takeover"
        );
        let mut list = Vec::new();
        let mut results = Vec::new();
        for (topic, partition, epoch) in wanted {
            match self.topic(&topic) {
                Some(info) if partition >= 0 && partition < info.partitions => list.push(Acquire {
                    topic: info,
                    partition,
                    epoch: Some(epoch),
                }),
                _ => results.push((
                    TopicPartition::new(topic, partition),
                    Err(LogError::UnknownTopicOrPartition),
                )),
            }
        }
        results.extend(acquire(&self.shared, list).await?);
        Ok(results)
    }

    /// Hands a partition over gracefully; returns its final high watermark.
    pub async fn release(&self, tp: &TopicPartition) -> LogResult<Offset> {
        let (outcome, deleting) = release(&self.shared, tp).await;
        if let Some(task) = deleting {
            // Kept so that shutdown waits for the deletes: objects of a stream nobody seals
            // (a broker that stopped cleanly) are never collected otherwise.
            let mut tasks = lock_mutex(&self.tasks);
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
        outcome
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
}

#[cfg(test)]
mod sealed_streams_tests {
    use std::time::Duration;

    use super::{SealedStreams, SEALED_STREAM_KEPT_FOR};

    #[test]
    fn a_kept_stream_is_forgotten_once_unused_for_the_keep_period() {
        let kept = SealedStreams::default();
        kept.sealed(7, 12, Duration::ZERO);
        let just_before = SEALED_STREAM_KEPT_FOR - Duration::from_millis(1);
        kept.expire(just_before);
        assert_eq!(kept.seal(7, just_before), Some(12), "a use renews it");
        kept.expire(just_before + just_before);
        assert_eq!(kept.len(), 1);
        kept.expire(just_before + SEALED_STREAM_KEPT_FOR);
        assert_eq!(kept.len(), 0);
        assert_eq!(kept.seal(7, just_before + SEALED_STREAM_KEPT_FOR), None);
    }
}
