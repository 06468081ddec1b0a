//! Fencing a broker by sealing its write-ahead stream.
//!
//! The log writes each group commit as `wal/<stream:08x>/<seq:020>`, create-only, sequence
//! numbers going up by one. Writing an object of our own at the writer's next sequence number
//! (create-only too) makes its next write fail with `AlreadyExists`; reading that object back it
//! finds a seal, not its bytes, and stops acknowledging. Recovery then reads the stream up to
//! the seal and everything acknowledged is there.
//!
//! Two subtleties:
//!
//! - The writer keeps up to `in_flight_window` writes in flight, so below the highest listed
//!   sequence there may be holes that a slow write could still fill *after* we sealed and after
//!   the successor replayed. We fill every hole in that window with a hole marker (also a seal
//!   object) create-only: either the late write landed first (it is visible to the replay) or
//!   ours did (the late write fails and is never acknowledged).
//! - Contract for the log: it must never delete the highest-sequence object of a stream that
//!   may still be written, or the seal would land below the writer's next sequence number.

use std::collections::BTreeSet;
use std::ops::RangeBounds;

use strata_core::BrokerId;
use strata_layout::wal::encode_seal;
use strata_storage::{ObjectStore, PutMode, StorageError};

use crate::keys::{parse_wal_seq, wal_key, wal_stream_prefix};
use crate::{ClusterError, ClusterResult};

pub use strata_layout::wal::{is_seal, parse_seal, SealInfo, SealKind, SEAL_MAGIC};

/// How many times the old writer may beat us to the next sequence number before we give up
/// (it can only win while it still has writes queued; it loses as soon as it sees a seal).
const MAX_SEAL_ATTEMPTS: u32 = 64;

/// Who seals, and how far below the end of the stream writes may still be in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealOptions {
    pub sealed_by: BrokerId,
    pub sealed_ms: i64,
    /// The log's maximum number of group-commit writes in flight (its `max_inflight_flushes`).
    pub in_flight_window: u64,
}

/// Seals `stream` and returns the sequence number of its seal. Idempotent: sealing a sealed
/// stream returns the existing seal (and still fills holes a crashed sealer may have left).
///
/// Once this returns, no write to `stream` at or below the seal can land any more, so a
/// successor that now reads the stream sees every write its old owner could have acknowledged.
pub async fn seal_stream(
    store: &dyn ObjectStore,
    stream: u32,
    options: &SealOptions,
) -> ClusterResult<u64> {
    let prefix = wal_stream_prefix(stream);
    for _ in 0..MAX_SEAL_ATTEMPTS {
        let listed: BTreeSet<u64> = store
            .list(&prefix)
            .await?
            .iter()
            .filter_map(|m| parse_wal_seq(stream, m.key.as_str()))
            .collect();
        if let Some(existing) = find_seal(store, stream, &listed, options).await? {
            fill_holes(store, stream, existing, &listed, options).await?;
            return Ok(existing);
        }
        let seal_seq = listed.last().copied().unwrap_or(0) + 1;
        let seal = encode_seal(&SealInfo {
            kind: SealKind::Seal,
            stream,
            sealed_by: options.sealed_by,
            sealed_ms: options.sealed_ms,
        })?;
        let key = wal_key(stream, seal_seq)?;
        let sealed = match store.put(&key, seal, PutMode::Create).await {
            Ok(_) => true,
            // The writer (or another sealer) got there first: a seal is as good as ours; data
            // means the writer raced ahead, so look again.
            Err(StorageError::AlreadyExists(_)) => {
                read_is_seal(store, stream, seal_seq).await? == Some(true)
            }
            // Did our put land? Only reading tells; if nothing is there, try again.
            Err(e) if e.is_ambiguous() => match read_is_seal(store, stream, seal_seq).await {
                Ok(Some(is_seal)) => is_seal,
                Ok(None) => false,
                Err(_) => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        };
        if sealed {
            fill_holes(store, stream, seal_seq, &listed, options).await?;
            tracing::info!(stream = format_args!("{stream:08x}"), seal_seq, by = %options.sealed_by, "stream sealed");
            return Ok(seal_seq);
        }
    }
    Err(ClusterError::SealContended {
        stream,
        attempts: MAX_SEAL_ATTEMPTS,
    })
}

/// The existing end-of-stream seal, if the stream is sealed already. Writes that were in
/// flight when it was sealed may have landed above the seal (never acknowledged, since the
/// write at the seal failed), so we look down from the top through at most a window of them;
/// every sealer must agree on one seal, or successors would replay different tails.
async fn find_seal(
    store: &dyn ObjectStore,
    stream: u32,
    listed: &BTreeSet<u64>,
    options: &SealOptions,
) -> ClusterResult<Option<u64>> {
    let depth = usize::try_from(options.in_flight_window.saturating_add(1)).unwrap_or(usize::MAX);
    let newest_first: Vec<u64> = listed.iter().rev().take(depth).copied().collect();
    find_end_seal(store, stream, &newest_first).await
}

/// The first of `candidates` (sequence numbers, newest first) that holds an end-of-stream
/// seal (a hole marker is not one). The search both sealers and the log's collector make;
/// each passes at most a writer's in-flight window of the newest objects, since a seal sits
/// no deeper and looking further would only cost reads. A candidate gone meanwhile
/// (collected) is skipped.
pub async fn find_end_seal(
    store: &dyn ObjectStore,
    stream: u32,
    candidates: &[u64],
) -> ClusterResult<Option<u64>> {
    for &seq in candidates {
        let bytes = match store.get(&wal_key(stream, seq)?).await {
            Ok((bytes, _)) => bytes,
            Err(StorageError::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if parse_seal(&bytes).is_some_and(|info| info.kind == SealKind::Seal) {
            return Ok(Some(seq));
        }
    }
    Ok(None)
}

/// Some(true) for a seal, Some(false) for data, None if nothing is there.
async fn read_is_seal(
    store: &dyn ObjectStore,
    stream: u32,
    seq: u64,
) -> ClusterResult<Option<bool>> {
    match store.get(&wal_key(stream, seq)?).await {
        Ok((bytes, _)) => Ok(Some(is_seal(&bytes))),
        Err(StorageError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Puts a hole marker at every sequence number below `seal_seq` (within the in-flight window)
/// that the listing did not show. `AlreadyExists` means a late write landed first: fine, it is
/// there for the replay to see.
async fn fill_holes(
    store: &dyn ObjectStore,
    stream: u32,
    seal_seq: u64,
    listed: &BTreeSet<u64>,
    options: &SealOptions,
) -> ClusterResult<()> {
    let lowest = seal_seq.saturating_sub(options.in_flight_window).max(1);
    let hole = encode_seal(&SealInfo {
        kind: SealKind::Hole,
        stream,
        sealed_by: options.sealed_by,
        sealed_ms: options.sealed_ms,
    })?;
    for seq in lowest..seal_seq {
        if listed.contains(&seq) {
            continue;
        }
        match store
            .put(&wal_key(stream, seq)?, hole.clone(), PutMode::Create)
            .await
        {
            Ok(_) | Err(StorageError::AlreadyExists(_)) => {}
            // An ambiguous put either landed (good) or did not: then look to be sure.
            Err(e) if e.is_ambiguous() => {
                if read_is_seal(store, stream, seq).await?.is_none() {
                    return Err(e.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Which of a broker's streams [`seal_streams_of`] seals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealWhich {
    /// Streams that hold no object at all (never written).
    Empty,
    /// Streams whose newest object is not a seal or hole marker. One that is was sealed
    /// already, and sealing it again would put hole markers back where the log's collector
    /// deleted data.
    Unsealed,
}

/// Seals the streams registered for `broker` whose ids lie in `ids` and that `which` selects,
/// and returns how many. The one walk of a broker's streams behind both sealers that fence
/// streams no takeover would: the log's, at start-up, of this node id's earlier
/// incarnations, and the membership's, of a broker forgotten after a long silence. Each
/// caller bounds `ids` so that a stream registered by an incarnation that may still write
/// legitimately is never in it.
pub async fn seal_streams_of(
    store: &dyn ObjectStore,
    broker: BrokerId,
    ids: impl RangeBounds<u32>,
    which: SealWhich,
    options: &SealOptions,
) -> ClusterResult<usize> {
    let mut sealed = 0;
    for stream in streams_of_broker(store, broker).await? {
        if !ids.contains(&stream) {
            continue;
        }
        let newest = store
            .list(&wal_stream_prefix(stream))
            .await?
            .iter()
            .filter_map(|m| parse_wal_seq(stream, m.key.as_str()))
            .max();
        let seal = match (which, newest) {
            (SealWhich::Empty, newest) => newest.is_none(),
            (SealWhich::Unsealed, None) => true,
            (SealWhich::Unsealed, Some(seq)) => {
                read_is_seal(store, stream, seq).await? != Some(true)
            }
        };
        if seal {
            seal_stream(store, stream, options).await?;
            sealed += 1;
        }
    }
    Ok(sealed)
}

/// Seals the streams registered for `broker` up to `up_to` that hold nothing at all, and
/// returns how many. For a broker known gone (its registration forgotten): a stream it wrote
/// to is named by the manifests of the partitions it owned, whose takeovers seal it; one it
/// never wrote to is named nowhere, and without this its registration stays for ever, listed
/// by every collector pass. A seal at sequence 1 of an empty stream needs no hole markers:
/// nothing can land below it, and a late write above it is never acknowledged (the writer's
/// write at 1 fails first). Streams above `up_to` are left alone: see the caller.
pub async fn seal_empty_streams_of(
    store: &dyn ObjectStore,
    broker: BrokerId,
    up_to: u32,
    sealed_by: BrokerId,
    sealed_ms: i64,
) -> ClusterResult<usize> {
    let options = SealOptions {
        sealed_by,
        sealed_ms,
        in_flight_window: 0,
    };
    seal_streams_of(store, broker, ..=up_to, SealWhich::Empty, &options).await
}

/// The write-ahead streams the log registered for `broker` (every incarnation's), sorted.
pub async fn streams_of_broker(
    store: &dyn ObjectStore,
    broker: BrokerId,
) -> ClusterResult<Vec<u32>> {
    Ok(strata_layout::streams::streams_of_broker(store, broker).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;
    use strata_storage::{
        FaultConfig, FaultInjectingStore, InjectedError, MemoryStore, ObjectKey, OpKind,
    };

    fn options() -> SealOptions {
        SealOptions {
            sealed_by: BrokerId(9),
            sealed_ms: 1_000,
            in_flight_window: 4,
        }
    }

    async fn write(store: &dyn ObjectStore, stream: u32, seq: u64) -> Result<(), StorageError> {
        store
            .put(
                &wal_key(stream, seq).unwrap(),
                Bytes::from_static(b"STRWAL01data"),
                PutMode::Create,
            )
            .await
            .map(|_| ())
    }

    #[tokio::test]
    async fn seals_the_next_sequence_and_the_writer_then_fails() {
        let store = MemoryStore::new();
        for seq in 1..=3 {
            write(&store, 7, seq).await.unwrap();
        }
        assert_eq!(seal_stream(&store, 7, &options()).await.unwrap(), 4);
        assert!(matches!(
            write(&store, 7, 4).await,
            Err(StorageError::AlreadyExists(_))
        ));
        let (bytes, _) = store.get(&wal_key(7, 4).unwrap()).await.unwrap();
        assert!(is_seal(&bytes));
        let info = parse_seal(&bytes).unwrap();
        assert_eq!(
            (info.kind, info.sealed_by, info.stream),
            (SealKind::Seal, BrokerId(9), 7)
        );
        // Other streams are untouched.
        write(&store, 8, 1).await.unwrap();
    }

    #[tokio::test]
    async fn late_writes_above_a_seal_do_not_move_it() {
        let store = MemoryStore::new();
        write(&store, 7, 1).await.unwrap();
        assert_eq!(seal_stream(&store, 7, &options()).await.unwrap(), 2);
        // A write that was in flight when we sealed lands above the seal (never acknowledged).
        write(&store, 7, 3).await.unwrap();
        assert_eq!(seal_stream(&store, 7, &options()).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn an_empty_stream_is_sealed_at_one_and_sealing_again_is_idempotent() {
        let store = MemoryStore::new();
        assert_eq!(seal_stream(&store, 1, &options()).await.unwrap(), 1);
        assert_eq!(seal_stream(&store, 1, &options()).await.unwrap(), 1);
        assert_eq!(store.object_count(), 1);
        assert!(write(&store, 1, 1).await.is_err());
    }

    #[tokio::test]
    async fn holes_below_the_end_are_filled_so_a_late_write_cannot_land() {
        let store = MemoryStore::new();
        // Writes 3 and 5 landed; 4 is still in flight (the writer keeps several in flight).
        for seq in [1, 2, 3, 5] {
            write(&store, 7, seq).await.unwrap();
        }
        assert_eq!(seal_stream(&store, 7, &options()).await.unwrap(), 6);
        assert!(matches!(
            write(&store, 7, 4).await,
            Err(StorageError::AlreadyExists(_))
        ));
        let (bytes, _) = store.get(&wal_key(7, 4).unwrap()).await.unwrap();
        assert_eq!(parse_seal(&bytes).unwrap().kind, SealKind::Hole);
        // Data below the seal was left alone.
        let (bytes, _) = store.get(&wal_key(7, 5).unwrap()).await.unwrap();
        assert!(!is_seal(&bytes));
    }

    #[tokio::test]
    async fn holes_older_than_the_in_flight_window_are_left_alone() {
        let store = MemoryStore::new();
        // Everything but 11 and 20 was compacted and deleted: old gaps, not in-flight writes.
        for seq in [11, 20] {
            write(&store, 7, seq).await.unwrap();
        }
        assert_eq!(seal_stream(&store, 7, &options()).await.unwrap(), 21);
        // Window 4 below 21: 17..=20; 20 exists, so 17, 18, 19 get holes.
        let listed = store.list(&wal_stream_prefix(7)).await.unwrap();
        let seqs: Vec<u64> = listed
            .iter()
            .filter_map(|m| parse_wal_seq(7, m.key.as_str()))
            .collect();
        assert_eq!(seqs, [11, 17, 18, 19, 20, 21]);
    }

    /// Stands in for a writer that lands its next write between our listing and our put.
    #[derive(Debug)]
    struct RacingWriter {
        inner: MemoryStore,
        stream: u32,
        races_left: std::sync::Mutex<u32>,
    }

    #[async_trait::async_trait]
    impl ObjectStore for RacingWriter {
        async fn put(
            &self,
            key: &ObjectKey,
            data: Bytes,
            mode: PutMode,
        ) -> strata_storage::StorageResult<strata_storage::Version> {
            let race = {
                let mut left = self.races_left.lock().unwrap();
                let race = is_seal(&data) && *left > 0;
                if race {
                    *left -= 1;
                }
                race
            };
            if race {
                let seq = parse_wal_seq(self.stream, key.as_str()).unwrap();
                write(&self.inner, self.stream, seq).await.unwrap();
            }
            self.inner.put(key, data, mode).await
        }
        async fn get(
            &self,
            key: &ObjectKey,
        ) -> strata_storage::StorageResult<(Bytes, strata_storage::Version)> {
            self.inner.get(key).await
        }
        async fn get_range(
            &self,
            key: &ObjectKey,
            range: std::ops::Range<u64>,
        ) -> strata_storage::StorageResult<Bytes> {
            self.inner.get_range(key, range).await
        }
        async fn list(
            &self,
            prefix: &str,
        ) -> strata_storage::StorageResult<Vec<strata_storage::ObjectMeta>> {
            self.inner.list(prefix).await
        }
        async fn delete(&self, key: &ObjectKey) -> strata_storage::StorageResult<()> {
            self.inner.delete(key).await
        }
        fn backend_name(&self) -> &'static str {
            "racing"
        }
    }

    #[tokio::test]
    async fn a_writer_that_races_ahead_is_sealed_after_its_write() {
        let store = RacingWriter {
            inner: MemoryStore::new(),
            stream: 3,
            races_left: std::sync::Mutex::new(2),
        };
        write(&store.inner, 3, 1).await.unwrap();
        // The writer wins seq 2 and 3; our third attempt seals 4.
        assert_eq!(seal_stream(&store, 3, &options()).await.unwrap(), 4);
        for seq in 2..=3 {
            let (bytes, _) = store.inner.get(&wal_key(3, seq).unwrap()).await.unwrap();
            assert!(!is_seal(&bytes));
        }
    }

    #[tokio::test]
    async fn an_ambiguous_seal_that_landed_counts() {
        let faults = FaultInjectingStore::new(Arc::new(MemoryStore::new()), FaultConfig::none(), 1);
        faults.apply_then_fail_next(OpKind::PutCreate, InjectedError::Timeout);
        assert_eq!(seal_stream(&faults, 2, &options()).await.unwrap(), 1);
        faults.fail_next(OpKind::List, InjectedError::Unavailable);
        let err = seal_stream(&faults, 2, &options()).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
    }
}
