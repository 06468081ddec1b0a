//! The per-partition manifest: the one object that says what a partition durably is. It is
//! replaced only by compare-and-swap, so two writers can never both think they advanced it.
//!
//! Everything below `checkpoint` lives in segments listed here and indexed by chunk objects;
//! everything from `checkpoint` on is replayed from write-ahead objects at recovery.

use serde::{Deserialize, Serialize};
use strata_storage::{ObjectKey, StorageError};

use crate::catalog::TopicId;
use crate::index::SegmentRef;
use crate::producer::ProducerStates;
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMeta {
    pub segment: SegmentRef,
    pub last_offset: i64,
    pub size: u64,
    pub max_timestamp: i64,
}

// The keys are the layout's; the manifest's JSON is ours (nobody else reads it).
pub use strata_layout::partition::{chunk_key, manifest_key, topic_prefix};

pub fn segment_key(topic: TopicId, partition: i32, segment: SegmentRef) -> String {
    strata_layout::partition::segment_key(topic, partition, segment.base_offset, segment.stream)
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
