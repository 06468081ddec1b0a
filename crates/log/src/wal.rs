//! Write-ahead objects: one group-commit write holding record batches of many partitions.
//!
//! Layout: `"STRWAL01" | stream u32 | seq u64 | count u32 | count × entry | crc32c u32 | data`.
//! Each entry (66 bytes) says which partition a batch belongs to, its offsets and where its
//! bytes sit in the object, plus the producer fields needed to rebuild idempotence state on
//! replay without parsing the batches. The header has its own CRC; each batch keeps the
//! client's CRC, so a torn or foreign object is detected before anything is replayed.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use strata_core::{BrokerId, Clock};
use strata_storage::ObjectStore;

use crate::catalog::TopicId;
use crate::producer::TxnKind;
use crate::{LogError, LogResult};

use strata_layout::wal::DATA_MAGIC as MAGIC;
const ENTRY_SIZE: usize = 66;
const FIXED: usize = 8 + 4 + 8 + 4;

/// One batch in a write-ahead object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalEntry {
    pub topic_id: TopicId,
    pub partition: i32,
    pub base_offset: i64,
    pub last_offset_delta: u32,
    pub position: u32,
    pub length: u32,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
    /// Not stored in the header: read from the batch's own attributes (see
    /// [`TxnKind::of_stored`]), so the format is unchanged.
    pub kind: TxnKind,
}

impl WalEntry {
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
}

// The keys and the seal format are the layout's; the object's binary codec is ours.
pub use strata_layout::wal::{is_seal, key, parse_key, stream_prefix};

/// Header size for `n` entries; batch positions start right after it.
pub fn header_len(n: usize) -> usize {
    FIXED + n * ENTRY_SIZE + 4
}

/// Builds the object. `batches` pairs each entry (position/length filled in here) with its
/// bytes in pieces (a rewritten header and the client's records); the data is copied once
/// into the contiguous object the storage needs, and readers later share slices of it.
pub fn encode(stream: u32, seq: u64, batches: &mut [(WalEntry, [Bytes; 2])]) -> Bytes {
    let header = header_len(batches.len());
    let size = |parts: &[Bytes; 2]| parts[0].len() + parts[1].len();
    let total = header + batches.iter().map(|(_, b)| size(b)).sum::<usize>();
    let mut buf = BytesMut::with_capacity(total);
    buf.put_slice(MAGIC);
    buf.put_u32(stream);
    buf.put_u64(seq);
    buf.put_u32(batches.len() as u32);
    let mut position = header as u32;
    for (e, bytes) in batches.iter_mut() {
        e.position = position;
        e.length = size(bytes) as u32;
        position += e.length;
        buf.put_slice(&e.topic_id.0);
        buf.put_i32(e.partition);
        buf.put_i64(e.base_offset);
        buf.put_u32(e.last_offset_delta);
        buf.put_u32(e.position);
        buf.put_u32(e.length);
        buf.put_i64(e.max_timestamp);
        buf.put_i64(e.producer_id);
        buf.put_i16(e.producer_epoch);
        buf.put_i32(e.base_sequence);
        buf.put_i32(e.record_count);
    }
    let crc = crc32c::crc32c(&buf);
    buf.put_u32(crc);
    for (_, parts) in batches.iter() {
        buf.put_slice(&parts[0]);
        buf.put_slice(&parts[1]);
    }
    buf.freeze()
}

/// A decoded object header.
#[derive(Debug, Clone)]
pub struct WalHeader {
    pub stream: u32,
    pub seq: u64,
    pub entries: Vec<WalEntry>,
}

/// Parses and checks an object; every entry's byte range is checked to lie inside it.
pub fn decode(object: &[u8]) -> LogResult<WalHeader> {
    let corrupt = |why: &str| LogError::CorruptStorage(format!("write-ahead object: {why}"));
    if object.len() < FIXED + 4 || &object[..8] != MAGIC {
        return Err(corrupt("bad magic or too short"));
    }
    let mut b = &object[8..];
    let stream = b.get_u32();
    let seq = b.get_u64();
    let count = b.get_u32() as usize;
    let header = count
        .checked_mul(ENTRY_SIZE)
        .and_then(|n| n.checked_add(FIXED + 4))
        .filter(|&n| n <= object.len())
        .ok_or_else(|| corrupt("entry count runs past the object"))?;
    let stored_crc = (&object[header - 4..header]).get_u32();
    if crc32c::crc32c(&object[..header - 4]) != stored_crc {
        return Err(corrupt("header checksum mismatch"));
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let mut id = [0u8; 16];
        b.copy_to_slice(&mut id);
        let e = WalEntry {
            topic_id: TopicId(id),
            partition: b.get_i32(),
            base_offset: b.get_i64(),
            last_offset_delta: b.get_u32(),
            position: b.get_u32(),
            length: b.get_u32(),
            max_timestamp: b.get_i64(),
            producer_id: b.get_i64(),
            producer_epoch: b.get_i16(),
            base_sequence: b.get_i32(),
            record_count: b.get_i32(),
            kind: TxnKind::None,
        };
        let end = e.position as usize + e.length as usize;
        if (e.position as usize) < header || end > object.len() {
            return Err(corrupt("entry points outside the object"));
        }
        let mut e = e;
        // Only batches with a producer can belong to a transaction: skip the others' bytes.
        if e.producer_id >= 0 {
            e.kind = TxnKind::of_stored(&object[e.position as usize..end]);
        }
        entries.push(e);
    }
    Ok(WalHeader {
        stream,
        seq,
        entries,
    })
}

/// Seals `stream` so its writer can never again acknowledge anything (see
/// `strata_cluster::seal_stream`: the seal goes after the last object, and holes are filled
/// across the writer's in-flight window so a late write cannot land unseen). Returns the seal's
/// sequence: objects below it are exactly what the stream durably holds.
pub async fn seal_stream(
    store: &dyn strata_storage::ObjectStore,
    stream: u32,
    sealer: strata_core::BrokerId,
    now_ms: i64,
    in_flight_window: usize,
) -> LogResult<u64> {
    let options = seal_options(sealer, now_ms, in_flight_window);
    strata_cluster::seal_stream(store, stream, &options)
        .await
        .map_err(cluster_error)
}

/// Seals every stream registered under `broker` below `ours` that is not sealed yet: the
/// streams of this node id's earlier incarnations, in a cluster where the node id is held
/// before the log opens. Returns how many it sealed.
///
/// Why: a stream is otherwise sealed only by a takeover of a partition whose manifest names
/// it. A cluster broker that died before writing anything (a crash loop at start-up, a kill
/// during its first second) is named by no manifest, so nobody sealed its stream, the
/// collector never retired it, and every pass listed it for ever — one more per crash.
/// A stream already sealed is left alone: sealing it again would put hole markers back where
/// the collector deleted data.
pub(crate) async fn seal_predecessors(
    store: &dyn ObjectStore,
    broker: BrokerId,
    ours: u32,
    now_ms: i64,
    in_flight_window: usize,
) -> LogResult<usize> {
    let options = seal_options(broker, now_ms, in_flight_window);
    strata_cluster::seal_streams_of(
        store,
        broker,
        ..ours,
        strata_cluster::SealWhich::Unsealed,
        &options,
    )
    .await
    .map_err(cluster_error)
}

/// A seal by `sealer` at `now_ms`, filling holes across the log's `max_inflight_flushes`.
fn seal_options(
    sealer: BrokerId,
    now_ms: i64,
    in_flight_window: usize,
) -> strata_cluster::SealOptions {
    strata_cluster::SealOptions {
        sealed_by: sealer,
        sealed_ms: now_ms,
        in_flight_window: in_flight_window as u64,
    }
}

/// The log reports a sealer's failure as storage being unavailable: every way a seal fails
/// is storage refusing or losing a request, and a retry later is the remedy for all of them.
fn cluster_error(e: strata_cluster::ClusterError) -> LogError {
    LogError::Storage(strata_storage::StorageError::Unavailable(e.to_string()))
}

/// Claims a new write-ahead stream id for this broker incarnation (create-only, so two
/// brokers, or a broker and its restarted self, never share one).
pub(crate) async fn register_stream(
    store: &dyn ObjectStore,
    broker: BrokerId,
    clock: &dyn Clock,
) -> LogResult<u32> {
    let registration = strata_layout::streams::StreamRegistration {
        broker,
        started_ms: clock.wall_millis(),
    };
    Ok(strata_layout::streams::register(store, &registration).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(partition: i32, base: i64) -> WalEntry {
        WalEntry {
            topic_id: TopicId([7; 16]),
            partition,
            base_offset: base,
            last_offset_delta: 1,
            position: 0,
            length: 0,
            max_timestamp: 99,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            record_count: 2,
            kind: TxnKind::None,
        }
    }

    #[test]
    fn objects_round_trip_and_locate_batches() {
        let mut batches = vec![
            (
                entry(0, 10),
                [Bytes::from_static(b"first "), Bytes::from_static(b"batch")],
            ),
            (entry(3, 0), [Bytes::new(), Bytes::from_static(b"second")]),
        ];
        let object = encode(5, 42, &mut batches);
        let header = decode(&object).unwrap();
        assert_eq!((header.stream, header.seq), (5, 42));
        assert_eq!(header.entries.len(), 2);
        for (e, (_, bytes)) in header.entries.iter().zip(&batches) {
            let at = e.position as usize;
            assert_eq!(
                &object[at..at + e.length as usize],
                &[&bytes[0][..], &bytes[1][..]].concat()[..]
            );
        }
    }

    #[test]
    fn detects_corruption_and_truncation() {
        let mut batches = vec![(
            entry(0, 10),
            [Bytes::from_static(b"da"), Bytes::from_static(b"ta")],
        )];
        let object = encode(1, 1, &mut batches);
        let mut bad = object.to_vec();
        bad[20] ^= 1;
        assert!(decode(&bad).is_err());
        assert!(decode(&object[..object.len() - 1]).is_err());
        assert!(decode(&object[..10]).is_err());
        assert!(decode(b"").is_err());
    }

    #[test]
    fn keys_parse_back() {
        assert_eq!(parse_key(&key(0xab, 17)), Some((0xab, 17)));
        assert_eq!(parse_key("wal/zz/1"), None);
    }
}
