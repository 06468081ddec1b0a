//! The per-partition manifest: the one object that says what a partition durably is. It is
//! replaced only by compare-and-swap, so two writers can never both think they advanced it.
//!
//! Everything below `checkpoint` lives in segments listed here and indexed by chunk objects;
//! everything from `checkpoint` on is replayed from write-ahead objects at recovery.

use serde::{Deserialize, Serialize};
use strata_storage::{ObjectKey, StorageError};

use crate::catalog::TopicId;
use crate::index::SegmentRef;
use crate::producer::{AbortedTxn, ProducerStates};
use crate::shared::Shared;
use crate::{LogError, LogResult};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub log_start: i64,
    /// First offset not yet compacted into a segment.
    pub checkpoint: i64,
    pub segments: Vec<SegmentMeta>,
    /// Producer state as of `checkpoint` (replay adds the tail's batches).
    pub producers: ProducerStates,
    /// The stream (broker incarnation) of the current or last owner: batches from
    /// `checkpoint` on are in its write-ahead objects. 0 = none yet.
    pub writer_stream: u32,
    /// Ownership epoch of that owner (the Kafka leader epoch).
    #[serde(default)]
    pub epoch: u64,
    /// How many times the partition has been claimed: every takeover, handover and standalone
    /// start adds one by compare-and-swap, so each owner's number is unique and larger than
    /// every earlier owner's, whoever assigned its Kafka epoch (a standalone broker and a
    /// cluster could both arrive at epoch 1). It is the fencing token of index-chunk writes.
    #[serde(default)]
    pub claim: u64,
    /// Set by a graceful handover once the tail is compacted: the next owner has nothing to
    /// replay and must not fence the previous owner (which is alive and serving others).
    #[serde(default)]
    pub released: bool,
    /// Sealed streams of earlier owners that still hold batches from `checkpoint` on (a
    /// takeover whose replayed tail is not compacted yet), oldest first. Replayed before
    /// `writer_stream`; emptied by the compaction that passes their batches.
    #[serde(default)]
    pub inherited_streams: Vec<u32>,
    /// The log cleaner's checkpoint (Kafka's "cleaner checkpoint"): segments below it were
    /// cleaned by key at least once; the bytes from it on are dirty. A new owner continues
    /// from here.
    #[serde(default)]
    pub cleaned_to: i64,
    /// A cleaning pass recorded but not yet swapped in (see `cleaner`): its new segments exist
    /// and are protected from garbage collection; whoever owns the partition next finishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaning: Option<CleaningIntent>,
}

/// A cleaning pass between its two manifest updates: the new segments are written, the index
/// chunks are being pointed at them. Finishing it (any owner may, any number of times)
/// rewrites the chunks of the replaced range and then swaps the segment lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleaningIntent {
    /// Segments being replaced, in offset order (still listed in `segments`).
    pub replaced: Vec<SegmentRef>,
    /// Their replacements, in offset order (fewer when a segment lost every batch).
    pub replacements: Vec<SegmentMeta>,
    /// The cleaner checkpoint once the swap lands.
    pub cleaned_to: i64,
    /// Aborted transactions whose data no segment holds any more: dropped from the aborted
    /// list by the swap, before (or with) the removal of their markers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forget_aborted: Vec<AbortedTxn>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMeta {
    pub segment: SegmentRef,
    pub last_offset: i64,
    pub size: u64,
    pub max_timestamp: i64,
    /// Wall-clock time (ms) the cleaner first passed this data: tombstones in it are kept
    /// `delete.retention.ms` from then. None: never cleaned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaned_at: Option<i64>,
}

// The keys are the layout's; the manifest's JSON is ours (nobody else reads it).
pub use strata_layout::partition::{chunk_key, manifest_key, topic_prefix};

pub fn segment_key(topic: TopicId, partition: i32, segment: SegmentRef) -> String {
    if segment.fast {
        strata_layout::partition::fast_segment_key(
            topic,
            partition,
            segment.base_offset,
            segment.stream,
            segment.claim,
            segment.generation,
        )
    } else if segment.generation == 0 {
        strata_layout::partition::segment_key(topic, partition, segment.base_offset, segment.stream)
    } else {
        strata_layout::partition::cleaned_segment_key(
            topic,
            partition,
            segment.base_offset,
            segment.stream,
            segment.claim,
            segment.generation,
        )
    }
}

pub(crate) async fn read_manifest(
    shared: &Shared,
    topic: TopicId,
    partition: i32,
) -> LogResult<(Manifest, Option<strata_storage::Version>)> {
    let key = ObjectKey::new(manifest_key(topic, partition))?;
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
