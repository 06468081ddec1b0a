//! The tiering pass: on a broker with a write-ahead tier (`wal_storage`), moves the compacted
//! segments a topic keeps on the fast tier (`local.retention.ms` / `local.retention.bytes`,
//! see [`crate::config::TopicConfig::fast_tier`]) to the bulk tier once they have had their
//! stay. Kafka's tiered storage copies a segment to remote storage and later deletes the local
//! copy; Strata keeps one copy, so the move is a copy followed by a swap.
//!
//! A move copies the segment's bytes unchanged to a new bulk-tier object named by our claim and
//! a fresh generation (create-only: it collides with no other writer's name), then swaps it in
//! exactly as a cleaning pass swaps its output ([`crate::cleaner::record_and_finish`]): an
//! intent recorded in the manifest by compare-and-swap, the index chunks of the range
//! repointed under our claim stamp, the segment lists swapped, and only then the fast-tier
//! original deleted. It therefore inherits the cleaner's fencing and crash story: a deposed
//! owner stops at the manifest and leaves an orphan copy that the successor's collector
//! deletes (its claim is older); a crash after the intent is finished by whoever owns the
//! partition next; a reader that found the original through a chunk read before the swap
//! retries through the new chunk. Offsets, bytes and CRCs never change, so a consumer cannot
//! tell which tier served it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata_storage::{ObjectKey, PutMode};
use tokio::sync::watch;

use crate::cleaner::{entries_in, finish_pending, read_segment, record_and_finish, Throttle};
use crate::config::FastTierStay;
use crate::index::SegmentRef;
use crate::maintenance::on_failure;
use crate::manifest::{self, CleaningIntent, Manifest, SegmentMeta};
use crate::partition::{Partition, Serving};
use crate::shared::{lock_mutex, Shared};
use crate::LogResult;

/// Segments moved by one pass at most: bounds the manifest's recorded intent and the work a
/// crash leaves to the next owner. A backlog moves over consecutive ticks.
const MAX_SEGMENTS_PER_PASS: usize = 16;

/// Counters of the tiering pass, for `/metrics`.
#[derive(Debug, Default)]
pub struct TieringStats {
    pub segments_moved: AtomicU64,
    pub bytes_moved: AtomicU64,
}

/// A point-in-time view of the tiering pass and of what the fast tier holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TieringSnapshot {
    /// Segments moved from the fast tier to the bulk tier since start.
    pub segments_moved: u64,
    pub bytes_moved: u64,
    /// Compacted segments on the fast tier now, over the partitions served here.
    pub fast_segments: u64,
    pub fast_bytes: u64,
}

/// Runs tiering passes until `stop` turns true. Spawned only on a tiered broker.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let tick = (shared.config.segment_interval / 4)
        .clamp(Duration::from_millis(10), Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = shared.clock.sleep(tick) => {}
        }
        for part in shared.partitions_snapshot() {
            if *stop.borrow() {
                return;
            }
            // Never beside a cleaning pass of the same partition: both would rewrite its
            // segments and one would be dropped at the swap, its writes wasted.
            if !lock_mutex(&shared.cleaning_now).insert(part.tp.clone()) {
                continue;
            }
            let result = tier_down_once(&shared, &part).await;
            lock_mutex(&shared.cleaning_now).remove(&part.tp);
            if let Err(e) = result {
                on_failure(&shared, &part, "tiering", &e).await;
            }
        }
    }
}

/// The fast-tier segments of `manifest` whose stay is over, oldest first: all of them when the
/// topic no longer asks for a stay; else those whose newest record is older than the age
/// bound, and then the oldest of the rest while the rest exceed the byte bound. Segments below
/// the log start are retention's, not ours.
pub(crate) fn due(
    manifest: &Manifest,
    stay: Option<FastTierStay>,
    now_ms: i64,
) -> Vec<SegmentMeta> {
    let fast: Vec<SegmentMeta> = manifest
        .segments
        .iter()
        .filter(|s| s.segment.fast && s.last_offset >= manifest.log_start)
        .copied()
        .collect();
    let Some(stay) = stay else {
        return fast;
    };
    let mut is_due: Vec<bool> = fast
        .iter()
        .map(|s| {
            stay.max_age_ms
                .is_some_and(|ms| s.max_timestamp < now_ms.saturating_sub(ms))
        })
        .collect();
    if let Some(limit) = stay.max_bytes {
        let mut kept: i64 = fast
            .iter()
            .zip(&is_due)
            .filter(|(_, d)| !**d)
            .map(|(s, _)| s.size as i64)
            .sum();
        for (s, d) in fast.iter().zip(is_due.iter_mut()) {
            if kept <= limit {
                break;
            }
            if !*d {
                *d = true;
                kept -= s.size as i64;
            }
        }
    }
    fast.into_iter()
        .zip(is_due)
        .filter_map(|(s, d)| d.then_some(s))
        .collect()
}

/// One pass over `part`: moves up to [`MAX_SEGMENTS_PER_PASS`] due segments to the bulk tier.
/// Returns how many moved (0 also when the swap was dropped because the manifest moved on).
pub(crate) async fn tier_down_once(shared: &Shared, part: &Arc<Partition>) -> LogResult<usize> {
    if !shared.config.tiered {
        return Ok(0);
    }
    let Some(topic) = shared.topic(&part.tp.topic) else {
        return Ok(0);
    };
    let (serving, pending) = {
        let st = part.lock();
        (st.serving, st.manifest.cleaning.is_some())
    };
    if serving != Serving::Active {
        return Ok(0);
    }
    if pending {
        // A pass (ours, an earlier owner's, or the cleaner's) recorded and not finished: finish
        // it first, so what is due is judged on the swapped lists.
        let _serial = part.maintenance.lock().await;
        finish_pending(shared, part, None).await?;
    }
    // Judged under the lock on the manifest in memory, without a copy: this runs for every
    // served partition every tick, and most have nothing due.
    let now = shared.clock.wall_millis();
    let (due_now, claim) = {
        let st = part.lock();
        (
            due(&st.manifest, topic.config.fast_tier(), now),
            st.manifest.claim,
        )
    };
    let plan: Vec<(SegmentMeta, SegmentRef)> = due_now
        .into_iter()
        .take(MAX_SEGMENTS_PER_PASS)
        .map(|s| {
            let copy = SegmentRef {
                base_offset: s.segment.base_offset,
                stream: shared.stream,
                claim,
                generation: shared.next_cleaner_generation(),
                fast: false,
            };
            (s, copy)
        })
        .collect();
    if plan.is_empty() {
        return Ok(0);
    }
    // The copies are written before anything names them; the collector leaves them alone
    // while the pass is in flight (as it does a cleaning pass's).
    let keys: Vec<String> = plan
        .iter()
        .map(|(_, copy)| manifest::segment_key(part.topic_id, part.tp.partition, *copy))
        .collect();
    lock_mutex(&shared.cleaner_inflight).extend(keys.iter().cloned());
    let result = copy_and_swap(shared, part, claim, &plan, &keys).await;
    {
        let mut inflight = lock_mutex(&shared.cleaner_inflight);
        for k in &keys {
            inflight.remove(k);
        }
    }
    result
}

async fn copy_and_swap(
    shared: &Shared,
    part: &Arc<Partition>,
    claim: u64,
    plan: &[(SegmentMeta, SegmentRef)],
    keys: &[String],
) -> LogResult<usize> {
    let mut throttle = Throttle::new(shared);
    let mut entries = Vec::new();
    let mut replacements = Vec::with_capacity(plan.len());
    let mut bytes_moved = 0u64;
    for ((original, copy), key) in plan.iter().zip(keys) {
        let bytes = read_segment(shared, part, original).await?;
        throttle.charge(bytes.len()).await;
        entries.extend(entries_in(&bytes, *copy)?);
        shared
            .store
            .put(
                &ObjectKey::new(key.as_str())?,
                bytes.clone(),
                PutMode::Create,
            )
            .await?;
        throttle.charge(bytes.len()).await;
        bytes_moved += bytes.len() as u64;
        replacements.push(SegmentMeta {
            segment: *copy,
            ..*original
        });
    }
    let replaced: Vec<SegmentRef> = plan.iter().map(|(s, _)| s.segment).collect();
    let recorded = record_and_finish(
        shared,
        part,
        claim,
        &replaced,
        |current| CleaningIntent {
            replaced: replaced.clone(),
            replacements,
            // Not a cleaning: the cleaner's checkpoint stays where it is.
            cleaned_to: current.cleaned_to,
            forget_aborted: Vec::new(),
        },
        entries,
        "tiering",
    )
    .await?;
    if !recorded {
        return Ok(0);
    }
    let stats = &shared.tiering_stats;
    stats
        .segments_moved
        .fetch_add(plan.len() as u64, Ordering::Relaxed);
    stats.bytes_moved.fetch_add(bytes_moved, Ordering::Relaxed);
    tracing::info!(partition = %part.tp, segments = plan.len(), bytes = bytes_moved,
        "moved segments from the fast tier to the bulk tier");
    Ok(plan.len())
}

impl Shared {
    pub(crate) fn tiering_snapshot(&self) -> TieringSnapshot {
        let mut snap = TieringSnapshot {
            segments_moved: self.tiering_stats.segments_moved.load(Ordering::Relaxed),
            bytes_moved: self.tiering_stats.bytes_moved.load(Ordering::Relaxed),
            ..TieringSnapshot::default()
        };
        if self.config.tiered {
            for part in self.partitions_snapshot() {
                let st = part.lock();
                for s in st.manifest.segments.iter().filter(|s| s.segment.fast) {
                    snap.fast_segments += 1;
                    snap.fast_bytes += s.size;
                }
            }
        }
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(base: i64, size: u64, max_timestamp: i64, fast: bool) -> SegmentMeta {
        SegmentMeta {
            segment: SegmentRef {
                base_offset: base,
                stream: 1,
                claim: 1,
                generation: base as u32 + 1,
                fast,
            },
            last_offset: base + 9,
            size,
            max_timestamp,
            cleaned_at: None,
        }
    }

    fn bases(v: &[SegmentMeta]) -> Vec<i64> {
        v.iter().map(|s| s.segment.base_offset).collect()
    }

    #[test]
    fn due_segments_follow_the_age_and_byte_bounds_oldest_first() {
        let manifest = Manifest {
            log_start: 10,
            segments: vec![
                seg(0, 100, 1_000, true), // below the log start: retention's
                seg(10, 100, 1_000, false),
                seg(20, 100, 2_000, true),
                seg(30, 100, 3_000, true),
                seg(40, 100, 4_000, true),
            ],
            ..Manifest::default()
        };
        let stay = |age: Option<i64>, bytes: Option<i64>| {
            Some(FastTierStay {
                max_age_ms: age,
                max_bytes: bytes,
            })
        };
        // No stay asked for any more: every fast segment above the log start goes.
        assert_eq!(bases(&due(&manifest, None, 0)), [20, 30, 40]);
        // By age: newest record older than now - 1500.
        assert_eq!(bases(&due(&manifest, stay(Some(1_500), None), 4_000)), [20]);
        // By bytes: keep at most 150 bytes, so the two oldest go.
        assert_eq!(bases(&due(&manifest, stay(None, Some(150)), 0)), [20, 30]);
        // Both: the age takes 20; the bytes then still need 30 to go.
        assert_eq!(
            bases(&due(&manifest, stay(Some(1_500), Some(150)), 4_000)),
            [20, 30]
        );
        assert!(due(&manifest, stay(None, None), i64::MAX).is_empty());
        assert!(due(&manifest, stay(Some(10_000), Some(1_000)), 4_000).is_empty());
    }
}
