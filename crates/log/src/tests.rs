//! Log-layer tests on the in-memory store: offsets, durability across a crash (tasks aborted,
//! nothing flushed), compaction and the index, idempotence, retention and record deletion.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use strata_core::{BrokerId, Offset, SystemClock, TopicPartition};
use strata_storage::{MemoryStore, ObjectStore};

use crate::{Acks, LogConfig, LogError, LogManager};

const DURABLE: Acks = Acks::Durable {
    timeout: Duration::from_secs(10),
};

fn put_varint(buf: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            buf.put_u8(b);
            return;
        }
        buf.put_u8(b | 0x80);
    }
}

/// An uncompressed v2 batch of `values`, timestamps `ts0`, `ts0+1`, …
pub(crate) fn batch(values: &[&str], ts0: i64, producer: Option<(i64, i16, i32)>) -> Bytes {
    let mut records = BytesMut::new();
    for (i, v) in values.iter().enumerate() {
        let mut r = BytesMut::new();
        r.put_i8(0);
        put_varint(&mut r, i as i64);
        put_varint(&mut r, i as i64);
        put_varint(&mut r, -1);
        put_varint(&mut r, v.len() as i64);
        r.put_slice(v.as_bytes());
        put_varint(&mut r, 0);
        put_varint(&mut records, r.len() as i64);
        records.put_slice(&r);
    }
    frame_batch(
        &records,
        values.len(),
        ts0,
        ts0 + values.len() as i64 - 1,
        producer,
    )
}

/// Wraps `count` encoded records (offset deltas 0, 1, …) in an uncompressed v2 batch header
/// with these timestamps and producer fields (None: not idempotent), CRC included.
pub(crate) fn frame_batch(
    records: &[u8],
    count: usize,
    first_timestamp: i64,
    max_timestamp: i64,
    producer: Option<(i64, i16, i32)>,
) -> Bytes {
    let (pid, epoch, seq) = producer.unwrap_or((-1, -1, -1));
    let mut body = BytesMut::new();
    body.put_i16(0);
    body.put_i32(count as i32 - 1);
    body.put_i64(first_timestamp);
    body.put_i64(max_timestamp);
    body.put_i64(pid);
    body.put_i16(epoch);
    body.put_i32(seq);
    body.put_i32(count as i32);
    body.put_slice(records);
    let mut out = BytesMut::new();
    out.put_i64(0);
    out.put_i32((4 + 1 + 4 + body.len()) as i32);
    out.put_i32(-1);
    out.put_i8(2);
    out.put_u32(crc32c::crc32c(&body));
    out.put_slice(&body);
    out.freeze()
}

fn config() -> LogConfig {
    LogConfig {
        flush_interval: Duration::from_millis(1),
        // Compaction only when a test asks for it (shutdown), unless it sets otherwise.
        segment_interval: Duration::from_secs(3600),
        segment_bytes: usize::MAX,
        index_chunk_span: 8,
        ..LogConfig::default()
    }
}

/// Opens an unmanaged log and waits for the start-up replay's tails to be compacted: that runs
/// behind serving, and these tests look at the storage (object counts, the collector, the
/// uncompacted-tail bound) as a settled start-up leaves it.
async fn open(store: &Arc<dyn ObjectStore>, config: LogConfig) -> Arc<LogManager> {
    let log = LogManager::open(store.clone(), SystemClock::shared(), config, BrokerId(0))
        .await
        .unwrap();
    log.replayed_tails_compacted().await;
    log
}

fn tp(topic: &str, p: i32) -> TopicPartition {
    TopicPartition::new(topic, p)
}

/// Write-ahead objects in `store` that hold data (not seals or hole markers).
async fn wal_data_objects(store: &Arc<dyn ObjectStore>) -> usize {
    let mut data = 0;
    for meta in store.list("wal/").await.unwrap() {
        let (bytes, _) = store.get(&meta.key).await.unwrap();
        data += usize::from(!crate::wal::is_seal(&bytes));
    }
    data
}

/// Whether `stream`'s newest write-ahead object is its seal.
async fn is_sealed(store: &Arc<dyn ObjectStore>, stream: u32) -> bool {
    let listed = store
        .list(&crate::wal::stream_prefix(stream))
        .await
        .unwrap();
    let Some(newest) = listed.iter().max_by_key(|m| m.key.as_str().to_string()) else {
        return false;
    };
    let (bytes, _) = store.get(&newest.key).await.unwrap();
    strata_layout::wal::parse_seal(&bytes)
        .is_some_and(|seal| seal.kind == strata_layout::wal::SealKind::Seal)
}

/// Sizes of the segment objects in `store`.
async fn segment_sizes(store: &Arc<dyn ObjectStore>) -> Vec<u64> {
    store
        .list("log/")
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.key.as_str().contains("/seg/"))
        .map(|m| m.size)
        .collect()
}

/// Reads every batch from `from` to the high watermark and returns the stored base offsets.
async fn base_offsets(log: &LogManager, tp: &TopicPartition, from: i64) -> Vec<i64> {
    let mut offsets = Vec::new();
    let mut at = from;
    loop {
        let out = log.read(tp, Offset(at), 1 << 20, true).await.unwrap();
        if out.batches.is_empty() {
            return offsets;
        }
        for b in &out.batches {
            let base = i64::from_be_bytes(b[..8].try_into().unwrap());
            let last_delta = i32::from_be_bytes(b[23..27].try_into().unwrap());
            offsets.push(base);
            at = base + last_delta as i64 + 1;
        }
    }
}

#[tokio::test]
async fn offsets_are_dense_and_reads_return_what_was_appended() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..10 {
        let out = log
            .append(
                &tp("t", 0),
                batch(&["a", "b", "c"], 1000 + i, None),
                DURABLE,
            )
            .await
            .unwrap();
        assert_eq!(out.base_offset, Offset(i * 3));
    }
    let wm = log.watermarks(&tp("t", 0)).unwrap();
    assert_eq!((wm.log_start, wm.high), (Offset(0), Offset(30)));
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..10).map(|i| i * 3).collect::<Vec<_>>()
    );
    // An offset inside a batch returns that whole batch.
    let mid = log
        .read(&tp("t", 0), Offset(4), 1 << 20, true)
        .await
        .unwrap();
    assert_eq!(
        i64::from_be_bytes(mid.batches[0][..8].try_into().unwrap()),
        3
    );
    assert!(matches!(
        log.read(&tp("t", 0), Offset(31), 100, true).await,
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        log.append(&tp("t", 2), batch(&["x"], 0, None), DURABLE)
            .await,
        Err(LogError::UnknownTopicOrPartition)
    ));
}

#[tokio::test]
async fn corrupt_batches_are_refused_and_nothing_is_appended() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let mut bad = batch(&["a"], 0, None).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert!(matches!(
        log.append(&tp("t", 0), Bytes::from(bad), DURABLE).await,
        Err(LogError::CorruptMessage(_))
    ));
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().high, Offset(0));
}

/// `plain` (an uncompressed batch from [`batch`]) with its records replaced by `records` and the
/// gzip bit set; the CRC is made right again.
fn as_gzip(plain: &Bytes, records: &[u8]) -> Bytes {
    let mut out = BytesMut::from(&plain[..61]);
    out.put_slice(records);
    let batch_length = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    out[22] |= 1; // low byte of the attributes: codec 1
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out.freeze()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[tokio::test]
async fn compressed_batches_are_checked_inside_and_stored_as_sent() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(
        &store,
        LogConfig {
            max_decompressed_batch_bytes: 4 << 20,
            ..config()
        },
    )
    .await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let plain = batch(&["a", "b", "c"], 1_000, None);

    // The poison batch: gzip bit, garbage, a valid CRC.
    let poison = as_gzip(&plain, b"certainly not gzip data");
    assert!(matches!(
        log.append(&tp("t", 0), poison, DURABLE).await,
        Err(LogError::CorruptMessage(_))
    ));
    // Valid gzip whose records disagree with the header's count.
    let one = batch(&["a"], 1_000, None);
    let miscounted = as_gzip(&plain, &gzip(&one[61..]));
    assert!(matches!(
        log.append(&tp("t", 0), miscounted, DURABLE).await,
        Err(LogError::CorruptMessage(_))
    ));
    // A bomb: a few KiB inflating to 8 MiB of one value.
    let zeros = "\0".repeat(8 << 20);
    let huge = batch(&[&zeros], 1_000, None);
    let bomb = as_gzip(&huge, &gzip(&huge[61..]));
    assert!(bomb.len() < 64 << 10);
    assert!(matches!(
        log.append(&tp("t", 0), bomb, DURABLE).await,
        Err(LogError::CorruptMessage(
            strata_wire::BatchError::DecompressedTooLarge { limit }
        )) if limit == 4 << 20
    ));
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().high, Offset(0));

    // A good one is appended, and what is stored is what was sent, still compressed.
    let good = as_gzip(&plain, &gzip(&plain[61..]));
    log.append(&tp("t", 0), good.clone(), DURABLE)
        .await
        .unwrap();
    let out = log
        .read(&tp("t", 0), Offset(0), 1 << 20, true)
        .await
        .unwrap();
    assert_eq!(out.batches.len(), 1);
    // Everything but the base offset and leader epoch, which the broker sets.
    assert_eq!(&out.batches[0][16..], &good[16..]);
}

#[tokio::test]
async fn acknowledged_appends_survive_a_crash_without_flush() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..20 {
        log.append(&tp("t", 0), batch(&["x", "y"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.abort_for_test();
    drop(log);
    let log = open(&store, config()).await;
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().high, Offset(40));
    assert_eq!(base_offsets(&log, &tp("t", 0), 0).await.len(), 20);
    // And appends continue densely after recovery.
    let out = log
        .append(&tp("t", 0), batch(&["z"], 0, None), DURABLE)
        .await
        .unwrap();
    assert_eq!(out.base_offset, Offset(40));
}

#[tokio::test]
async fn compacted_data_is_read_through_the_index_after_restart() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..30 {
        log.append(&tp("t", 0), batch(&["a", "b", "c"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.shutdown().await.unwrap();
    assert_eq!(
        wal_data_objects(&store).await,
        1,
        "write-ahead objects are deleted once compacted, except the stream's newest (sealing \
         finds the writer's position by listing)"
    );
    assert!(
        is_sealed(&store, log.stream()).await,
        "shutdown seals its stream"
    );
    let log = open(&store, config()).await;
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().high, Offset(90));
    // Chunks span 8 offsets, so this walks many chunks and batches that straddle them.
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..30).map(|i| i * 3).collect::<Vec<_>>()
    );
    let mid = log.read(&tp("t", 0), Offset(47), 1, true).await.unwrap();
    assert_eq!(mid.batches.len(), 1);
    assert_eq!(
        i64::from_be_bytes(mid.batches[0][..8].try_into().unwrap()),
        45
    );
    // New data after the compacted part, then a crash: both parts readable.
    log.append(&tp("t", 0), batch(&["d"], 99, None), DURABLE)
        .await
        .unwrap();
    log.abort_for_test();
    let log = open(&store, config()).await;
    assert_eq!(base_offsets(&log, &tp("t", 0), 84).await, vec![84, 87, 90]);
}

/// A memory store whose requests `metrics` counts (by key area, if the test set them).
fn metered_memory_store(metrics: &Arc<strata_storage::StorageMetrics>) -> Arc<dyn ObjectStore> {
    let clock = SystemClock::shared();
    Arc::new(strata_storage::MetricsStore::with_shared(
        Arc::new(MemoryStore::new()),
        Arc::clone(metrics),
        Arc::new(strata_storage::StorageHealth::new(Arc::clone(&clock))),
        clock,
    ))
}

/// A cold read by offset costs one index chunk read, whatever the offset: the previous chunk
/// is read only when the offset lies in a batch that started there.
#[tokio::test]
async fn a_cold_lookup_reads_one_index_chunk_unless_its_batch_started_in_the_previous_one() {
    // The storage metrics layer counts requests by key area; index chunks are one area.
    let metrics = Arc::new(strata_storage::StorageMetrics::new());
    metrics.set_key_areas(|key| {
        if key.contains("/index/") {
            "index"
        } else {
            "other"
        }
    });
    let store = metered_memory_store(&metrics);
    let index_requests = || metrics.snapshot().area_requests("index");
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    // Batches of three records: bases 0, 3, 6, 9, ...; chunks of 8 offsets, so chunk 1
    // (offsets 8..16) indexes the batches at 9, 12 and 15, and offset 8 is in the batch at 6.
    for i in 0..30 {
        log.append(&tp("t", 0), batch(&["a", "b", "c"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.shutdown().await.unwrap();
    for (offset, base, chunk_reads) in [
        (10, 9, 1),
        (9, 9, 1),
        (8, 6, 2),
        (43, 42, 1),
        (40, 39, 2),
        (0, 0, 1),
    ] {
        let log = open(&store, config()).await;
        let before = index_requests();
        let out = log
            .read(&tp("t", 0), Offset(offset), 1, true)
            .await
            .unwrap();
        let after = index_requests();
        assert_eq!(
            i64::from_be_bytes(out.batches[0][..8].try_into().unwrap()),
            base,
            "offset {offset}"
        );
        assert_eq!(
            after - before,
            chunk_reads,
            "chunk reads for offset {offset}"
        );
        log.shutdown().await.unwrap();
    }
}

/// A consumer replaying compacted data one batch per fetch, through read-ahead windows that do
/// not line up with batches: it gets exactly the appended batches, and storage is read once per
/// window — each segment's first window by the reader, every later one ahead of it.
#[tokio::test]
async fn a_replay_through_read_ahead_windows_returns_exactly_the_appended_batches() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let sent: Vec<Bytes> = (0..30).map(|i| batch(&["a", "b", "c"], i, None)).collect();
    let one = sent[0].len();
    let windows = LogConfig {
        segment_bytes: one * 10,
        read_ahead_bytes: one * 3 + 7,
        read_ahead_memory_bytes: 1 << 20,
        ..config()
    };
    let log = open(&store, windows.clone()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    for b in &sent {
        log.append(&tp("t", 0), b.clone(), DURABLE).await.unwrap();
    }
    log.shutdown().await.unwrap();
    let segments = segment_sizes(&store).await;
    assert_eq!(segments.len(), 3, "{segments:?}");

    let log = open(&store, windows).await;
    let mut read = Vec::new();
    let mut at = 0;
    while at < 90 {
        let out = log.read(&tp("t", 0), Offset(at), 1, true).await.unwrap();
        assert_eq!(out.batches.len(), 1, "one batch per fetch at offset {at}");
        read.push(out.batches[0].clone());
        at += 3;
    }
    for (i, (got, want)) in read.iter().zip(&sent).enumerate() {
        assert_eq!(
            i64::from_be_bytes(got[..8].try_into().unwrap()),
            i as i64 * 3
        );
        // From the magic byte on, the batch is stored as sent (the base offset and the
        // partition leader epoch before it are the broker's).
        assert_eq!(got[16..], want[16..], "batch {i}");
    }
    let s = log.read_ahead_stats();
    assert_eq!(s.bytes_read, segments.iter().sum::<u64>(), "{s:?}");
    assert_eq!(
        s.misses, 3,
        "a reader waited for storage once per segment: {s:?}"
    );
    assert_eq!(s.hits, 30 - 3, "{s:?}");
}

#[tokio::test]
async fn idempotent_retries_are_deduplicated_across_restarts() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let (pid, epoch) = log.init_producer_id().await.unwrap();
    let b0 = batch(&["a", "b"], 0, Some((pid, epoch, 0)));
    let b1 = batch(&["c"], 0, Some((pid, epoch, 2)));
    assert_eq!(
        log.append(&tp("t", 0), b0.clone(), DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(0)
    );
    assert_eq!(
        log.append(&tp("t", 0), b1.clone(), DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(2)
    );
    assert_eq!(
        log.append(&tp("t", 0), b0.clone(), DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(0)
    );
    let gap = batch(&["e"], 0, Some((pid, epoch, 9)));
    assert!(matches!(
        log.append(&tp("t", 0), gap, DURABLE).await,
        Err(LogError::OutOfOrderSequence { .. })
    ));
    log.abort_for_test();
    let log = open(&store, config()).await;
    assert_eq!(
        log.append(&tp("t", 0), b1.clone(), DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(2)
    );
    log.shutdown().await.unwrap();
    let log = open(&store, config()).await;
    assert_eq!(
        log.append(&tp("t", 0), b1, DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(2)
    );
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().high, Offset(3));
    let (pid2, _) = log.init_producer_id().await.unwrap();
    assert_ne!(pid, pid2, "producer ids are never reused across restarts");
}

#[tokio::test]
async fn delete_records_and_retention_move_the_log_start() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let mut cfg = config();
    cfg.segment_interval = Duration::from_millis(20);
    cfg.retention_check_interval = Duration::from_millis(20);
    let log = open(&store, cfg.clone()).await;
    let overrides = BTreeMap::from([("retention.ms".to_string(), "60000".to_string())]);
    log.create_topic("t", Some(1), overrides, false)
        .await
        .unwrap();
    let now = strata_core::Clock::wall_millis(&SystemClock::new());
    // Old records (two hours ago) and fresh ones, in separate segments.
    for _ in 0..5 {
        log.append(&tp("t", 0), batch(&["old"], now - 7_200_000, None), DURABLE)
            .await
            .unwrap();
    }
    log.shutdown().await.unwrap();
    let log = open(&store, cfg).await;
    log.append(&tp("t", 0), batch(&["new"], now, None), DURABLE)
        .await
        .unwrap();
    let mut rx = log.subscribe(&tp("t", 0)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while log.watermarks(&tp("t", 0)).unwrap().log_start < Offset(5) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention never ran"
        );
        let _ = tokio::time::timeout(Duration::from_millis(50), rx.changed()).await;
    }
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().log_start, Offset(5));
    assert!(matches!(
        log.read(&tp("t", 0), Offset(0), 100, true).await,
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert_eq!(
        log.delete_records(&tp("t", 0), None).await.unwrap(),
        Offset(6)
    );
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().log_start, Offset(6));
}

#[tokio::test]
async fn timestamps_find_the_first_record_at_or_after() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    log.append(&tp("t", 0), batch(&["a", "b", "c"], 100, None), DURABLE)
        .await
        .unwrap();
    log.append(&tp("t", 0), batch(&["d", "e"], 200, None), DURABLE)
        .await
        .unwrap();
    let at = |ts| {
        let log = log.clone();
        async move { log.offset_for_timestamp(&tp("t", 0), ts).await.unwrap() }
    };
    assert_eq!(at(0).await, Some((Offset(0), 100)));
    assert_eq!(at(101).await, Some((Offset(1), 101)));
    assert_eq!(at(150).await, Some((Offset(3), 200)));
    assert_eq!(at(201).await, Some((Offset(4), 201)));
    assert_eq!(at(202).await, None);
    log.shutdown().await.unwrap();
    let log = open(&store, config()).await;
    assert_eq!(
        log.offset_for_timestamp(&tp("t", 0), 101).await.unwrap(),
        Some((Offset(1), 101))
    );
    assert_eq!(
        log.max_timestamp(&tp("t", 0)).await.unwrap(),
        Some((Offset(4), 201))
    );
}

#[tokio::test]
async fn topics_survive_restarts_and_deleted_topics_lose_their_data() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("keep", Some(3), BTreeMap::new(), false)
        .await
        .unwrap();
    log.create_topic("drop", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    assert!(matches!(
        log.create_topic("keep", Some(1), BTreeMap::new(), false)
            .await,
        Err(LogError::TopicAlreadyExists(_))
    ));
    log.append(&tp("drop", 0), batch(&["x"], 0, None), DURABLE)
        .await
        .unwrap();
    log.delete_topic("drop").await.unwrap();
    log.create_partitions("keep", 5, BTreeMap::new(), false)
        .await
        .unwrap();
    log.shutdown().await.unwrap();
    let log = open(&store, config()).await;
    assert_eq!(log.topics().len(), 1);
    assert_eq!(log.topic("keep").unwrap().partitions, 5);
    log.create_topic("drop", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    assert_eq!(log.watermarks(&tp("drop", 0)).unwrap().high, Offset(0));
}

/// A tail larger than `segment_bytes` compacts into several segments of about that size (so
/// one compaction never writes, and fsyncs, a giant object), all readable through the index.
#[tokio::test]
async fn a_large_tail_compacts_into_bounded_segments() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let small = LogConfig {
        segment_bytes: 400,
        ..config()
    };
    let log = open(&store, small.clone()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let one = batch(&["a", "b", "c"], 0, None).len();
    for i in 0..30 {
        log.append(&tp("t", 0), batch(&["a", "b", "c"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.shutdown().await.unwrap();
    let segments = segment_sizes(&store).await;
    let per_segment = 400 / one;
    assert_eq!(
        segments.len(),
        30_usize.div_ceil(per_segment),
        "{segments:?}"
    );
    assert!(segments.iter().all(|s| *s as usize <= 400), "{segments:?}");
    assert_eq!(wal_data_objects(&store).await, 1);
    let log = open(&store, small).await;
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..30).map(|i| i * 3).collect::<Vec<_>>()
    );
}

/// Acquires one partition at `epoch` on a managed log, which must succeed.
async fn acquire_one(log: &LogManager, topic: &str, partition: i32, epoch: u64) {
    for (_, r) in log
        .acquire(vec![(topic.into(), partition, epoch)])
        .await
        .unwrap()
    {
        r.unwrap();
    }
}

async fn open_managed(store: &Arc<dyn ObjectStore>, broker: i32) -> Arc<LogManager> {
    LogManager::open_with(
        store.clone(),
        SystemClock::shared(),
        config(),
        BrokerId(broker),
        crate::Ownership::Managed,
    )
    .await
    .unwrap()
}

/// Broker 1 on `store`, owning topic `t`'s one partition at epoch 1, after `records`
/// one-record appends.
async fn broker_one_wrote(store: &Arc<dyn ObjectStore>, records: i64) -> Arc<LogManager> {
    let a = open_managed(store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire_one(&a, "t", 0, 1).await;
    for i in 0..records {
        a.append(&tp("t", 0), batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
    }
    a
}

/// [`broker_one_wrote`], then broker 1 crashes and broker 2 takes `t`-0 over at epoch 2
/// (sealing broker 1's stream).
async fn broker_two_took_over(
    store: &Arc<dyn ObjectStore>,
    records: i64,
) -> (Arc<LogManager>, Arc<LogManager>) {
    let a = broker_one_wrote(store, records).await;
    let b = open_managed(store, 2).await;
    a.abort_for_test();
    b.refresh_catalog().await.unwrap();
    acquire_one(&b, "t", 0, 2).await;
    (a, b)
}

/// The cluster hands a big takeover to the log in batches; each batch sealed the dead stream
/// again and read every object of it again. The later batches of one takeover now seal and
/// read nothing of it, and still replay exactly what the dead owner acknowledged.
#[tokio::test]
async fn a_takeover_in_batches_seals_and_reads_the_dead_stream_once() {
    let metrics = Arc::new(strata_storage::StorageMetrics::new());
    // Areas by write-ahead stream, so the dead one's requests are told from the new owner's.
    metrics.set_key_areas(|key| {
        static STREAMS: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
        let Some(stream) = key.strip_prefix("wal/").and_then(|rest| rest.get(..8)) else {
            return "other";
        };
        let mut streams = STREAMS.lock().unwrap();
        match streams.iter().find(|s| **s == stream) {
            Some(interned) => interned,
            None => {
                let interned: &'static str = Box::leak(stream.to_string().into_boxed_str());
                streams.push(interned);
                interned
            }
        }
    });
    let store = metered_memory_store(&metrics);
    let dead_stream_requests = |a: &LogManager| {
        metrics
            .snapshot()
            .area_requests(&format!("{:08x}", a.stream()))
    };
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(4), BTreeMap::new(), false)
        .await
        .unwrap();
    let all: Vec<(String, i32, u64)> = (0..4).map(|p| ("t".to_string(), p, 1)).collect();
    for (_, r) in a.acquire(all).await.unwrap() {
        r.unwrap();
    }
    // Partition p gets p + 1 appends of two records, each its own write-ahead object.
    for p in 0..4 {
        for i in 0..=p {
            a.append(&tp("t", p), batch(&["a", "b"], i as i64, None), DURABLE)
                .await
                .unwrap();
        }
    }
    let b = open_managed(&store, 2).await;
    a.abort_for_test();
    b.refresh_catalog().await.unwrap();
    // One batch of the takeover; what it cost the dead stream, in requests.
    let take_over = |partitions: [i32; 2]| {
        let (a, b) = (&a, &b);
        async move {
            let before = dead_stream_requests(a);
            let wanted = partitions.iter().map(|p| ("t".into(), *p, 2)).collect();
            for (_, r) in b.acquire(wanted).await.unwrap() {
                r.unwrap();
            }
            dead_stream_requests(a) - before
        }
    };
    let first = take_over([0, 1]).await;
    assert!(
        first > 10,
        "the first batch seals and reads the stream: {first}"
    );
    assert_eq!(
        take_over([2, 3]).await,
        0,
        "the second batch seals and reads nothing of the dead stream"
    );
    assert_eq!(b.shared.sealed_streams.len(), 1);
    for p in 0..4 {
        assert_eq!(
            b.watermarks(&tp("t", p)).unwrap().high,
            Offset(2 * (p as i64 + 1))
        );
        assert_eq!(
            base_offsets(&b, &tp("t", p), 0).await,
            (0..=p as i64).map(|i| 2 * i).collect::<Vec<_>>()
        );
    }
}

#[tokio::test]
async fn a_takeover_fences_the_old_owner_and_keeps_every_acknowledged_record() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    assert!(matches!(
        a.append(&tp("t", 0), batch(&["x"], 0, None), DURABLE).await,
        Err(LogError::NotOwner)
    ));
    for (_, r) in a
        .acquire(vec![("t".into(), 0, 1), ("t".into(), 1, 1)])
        .await
        .unwrap()
    {
        r.unwrap();
    }
    for i in 0..5 {
        a.append(&tp("t", 0), batch(&["a", "b"], i, None), DURABLE)
            .await
            .unwrap();
    }
    // B takes partition 0 over without A's cooperation (A is "dead" to the cluster).
    let b = open_managed(&store, 2).await;
    acquire_one(&b, "t", 0, 2).await;
    assert_eq!(b.watermarks(&tp("t", 0)).unwrap().high, Offset(10));
    assert_eq!(b.served_epoch(&tp("t", 0)), Some(2));
    // A wakes up: its next write hits the seal, so nothing more is acknowledged by it.
    assert!(a
        .append(&tp("t", 0), batch(&["late"], 0, None), DURABLE)
        .await
        .is_err());
    assert!(a
        .append(&tp("t", 1), batch(&["late"], 0, None), DURABLE)
        .await
        .is_err());
    assert!(*a.fenced().borrow());
    // B continues densely, and its data reads back whole.
    assert_eq!(
        b.append(&tp("t", 0), batch(&["c"], 9, None), DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(10)
    );
    assert_eq!(
        base_offsets(&b, &tp("t", 0), 0).await,
        vec![0, 2, 4, 6, 8, 10]
    );
}

/// While armed, holds every segment write until released: a compaction that has begun cannot
/// finish.
#[derive(Debug)]
struct HoldsSegments {
    armed: std::sync::atomic::AtomicBool,
    release: tokio::sync::watch::Sender<bool>,
}

#[async_trait::async_trait]
impl intercept::Intercept for HoldsSegments {
    async fn before_put(
        &self,
        key: &strata_storage::ObjectKey,
        _mode: &strata_storage::PutMode,
    ) -> strata_storage::StorageResult<()> {
        if self.armed.load(std::sync::atomic::Ordering::SeqCst) && key.as_str().contains("/seg/") {
            let mut released = self.release.subscribe();
            let _ = released.wait_for(|r| *r).await;
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_takeover_serves_the_replayed_tail_before_compacting_it() {
    let held = intercept::Intercepted::new(
        Arc::new(MemoryStore::new()),
        HoldsSegments {
            armed: false.into(),
            release: tokio::sync::watch::channel(false).0,
        },
    );
    let holds = &held.hooks;
    let store: Arc<dyn ObjectStore> = held.clone();
    let a = broker_one_wrote(&store, 10).await;
    let b = open_managed(&store, 2).await;
    a.abort_for_test();
    b.refresh_catalog().await.unwrap();
    holds.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    // Compacting before serving would wait here for the held segment write for ever.
    tokio::time::timeout(Duration::from_secs(30), acquire_one(&b, "t", 0, 2))
        .await
        .expect("the takeover waited for the replayed tail's compaction");
    let t0 = tp("t", 0);
    assert_eq!(b.watermarks(&t0).unwrap().high, Offset(10));
    assert_eq!(base_offsets(&b, &t0, 0).await, (0..10).collect::<Vec<_>>());
    b.append(&t0, batch(&["b"], 10, None), DURABLE)
        .await
        .unwrap();

    holds.release.send_replace(true);
    b.replayed_tails_compacted().await;
    let part = b.shared.partition(&t0).unwrap();
    assert!(
        part.lock().tail.iter().all(|t| t.stream == b.shared.stream),
        "the replayed tail was compacted in the background"
    );
    assert_eq!(base_offsets(&b, &t0, 0).await, (0..11).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_graceful_handover_moves_no_data_and_leaves_the_old_owner_serving_the_rest() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    for (_, r) in a
        .acquire(vec![("t".into(), 0, 1), ("t".into(), 1, 1)])
        .await
        .unwrap()
    {
        r.unwrap();
    }
    for i in 0..4 {
        a.append(&tp("t", 0), batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
    }
    assert_eq!(a.release(&tp("t", 0)).await.unwrap(), Offset(4));
    assert!(matches!(
        a.append(&tp("t", 0), batch(&["x"], 0, None), DURABLE).await,
        Err(LogError::NotOwner)
    ));
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    acquire_one(&b, "t", 0, 2).await;
    assert_eq!(b.watermarks(&tp("t", 0)).unwrap().high, Offset(4));
    // A was not fenced: it still serves partition 1.
    a.append(&tp("t", 1), batch(&["still mine"], 0, None), DURABLE)
        .await
        .unwrap();
    assert!(!*a.fenced().borrow());
    assert_eq!(base_offsets(&b, &tp("t", 0), 0).await, vec![0, 1, 2, 3]);
}

#[tokio::test]
async fn the_collector_removes_what_crashed_incarnations_left_and_nothing_still_needed() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..6 {
        log.append(&tp("t", (i % 2) as i32), batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.abort_for_test();
    // The restart replays and compacts the crashed stream; its objects become garbage.
    let log = open(&store, config()).await;
    let wal_before = store.list("wal/").await.unwrap().len();
    assert!(wal_before > 1);
    let deleted = log.collect_garbage().await.unwrap();
    let wal_after = store.list("wal/").await.unwrap();
    assert_eq!(deleted, wal_before - wal_after.len());
    // Only the seal is left of the old stream.
    assert_eq!(wal_after.len(), 1, "{wal_after:?}");
    // And the data is all still there.
    assert_eq!(base_offsets(&log, &tp("t", 0), 0).await, vec![0, 1, 2]);
    assert_eq!(base_offsets(&log, &tp("t", 1), 0).await, vec![0, 1, 2]);
    // An orphan segment (a compaction whose manifest update never landed) is collected too.
    let orphan = strata_storage::ObjectKey::new(strata_layout::partition::segment_key(
        log.topic("t").unwrap().id,
        0,
        0,
        0xdead,
    ))
    .unwrap();
    store
        .put(
            &orphan,
            Bytes::from_static(b"junk"),
            strata_storage::PutMode::Create,
        )
        .await
        .unwrap();
    // The collector lists a partition's segments again once its manifest moved (here a
    // compaction; an orphan is left by a pass that changed or failed to change it).
    log.append(&tp("t", 0), batch(&["b"], 9, None), DURABLE)
        .await
        .unwrap();
    log.compact_now(&tp("t", 0)).await.unwrap();
    assert_eq!(log.collect_garbage().await.unwrap(), 1);
    assert!(store.get(&orphan).await.is_err());
}

/// The collector does not poll storage per partition: a partition whose manifest did not
/// change since its segments were last listed is not listed again (with 10,000 partitions
/// that was 10,000 listings every `retention_check_interval`, idle or not), and neither is
/// an empty one that never had a manifest.
#[tokio::test]
async fn the_collector_lists_only_partitions_whose_manifest_changed() {
    let metrics;
    let store: Arc<dyn ObjectStore> = {
        let wrapped =
            strata_storage::MetricsStore::new(Arc::new(MemoryStore::new()), SystemClock::shared());
        metrics = Arc::clone(wrapped.metrics());
        Arc::new(wrapped)
    };
    let lists = || metrics.snapshot().op(strata_storage::OpKind::List).requests;
    let log = open(&store, config()).await;
    log.create_topic("t", Some(20), BTreeMap::new(), false)
        .await
        .unwrap();
    // Ten more that stay empty (no manifest ever): listed once, like the others.
    log.create_topic("empty", Some(10), BTreeMap::new(), false)
        .await
        .unwrap();
    for p in 0..20 {
        log.append(&tp("t", p), batch(&["a"], 0, None), DURABLE)
            .await
            .unwrap();
        log.compact_now(&tp("t", p)).await.unwrap();
    }
    // The first pass lists every partition's segments (and the stream registrations; no
    // other stream is registered, so no write-ahead objects are listed).
    let before = lists();
    log.collect_garbage().await.unwrap();
    assert_eq!(lists() - before, 1 + 20 + 10);
    // Nothing changed: only the registrations.
    let before = lists();
    log.collect_garbage().await.unwrap();
    assert_eq!(lists() - before, 1);
    // One partition's manifest moves: that one is listed again, and its orphan collected.
    let orphan = strata_storage::ObjectKey::new(strata_layout::partition::segment_key(
        log.topic("t").unwrap().id,
        3,
        0,
        0xdead,
    ))
    .unwrap();
    store
        .put(
            &orphan,
            Bytes::from_static(b"junk"),
            strata_storage::PutMode::Create,
        )
        .await
        .unwrap();
    log.append(&tp("t", 3), batch(&["b"], 1, None), DURABLE)
        .await
        .unwrap();
    log.compact_now(&tp("t", 3)).await.unwrap();
    let before = lists();
    assert_eq!(log.collect_garbage().await.unwrap(), 1);
    assert_eq!(lists() - before, 2);
    assert!(store.get(&orphan).await.is_err());
}

/// Storage that fails often, sometimes after applying the write (the ambiguous case), under the
/// production wrapper stack: every acknowledged append is there afterwards, exactly once, in
/// order, and the producers only ever saw retriable errors.
#[tokio::test]
async fn injected_storage_faults_lose_no_acknowledged_record() {
    faults_lose_no_acknowledged_record(usize::MAX).await;
}

/// The same with segments of a few batches: compaction runs many bounded passes, each a
/// segment, index chunks and a manifest that may fail or land ambiguously in between.
#[tokio::test]
async fn injected_storage_faults_lose_nothing_with_many_small_compaction_passes() {
    faults_lose_no_acknowledged_record(200).await;
}

async fn faults_lose_no_acknowledged_record(segment_bytes: usize) {
    use strata_storage::{
        FaultConfig, FaultInjectingStore, InjectedError, OpFaults, RetryPolicy, StackConfig,
        StorageStack,
    };
    let seed: u64 = std::env::var("STRATA_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    println!("fault seed {seed} (replay with STRATA_FAULT_SEED={seed})");
    let backend: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let faults = FaultConfig::uniform(OpFaults {
        error_probability: 0.15,
        ambiguous_probability: 0.05,
        error: InjectedError::Unavailable,
        latency: Duration::from_micros(200),
        latency_jitter: Duration::from_micros(500),
    });
    let faulty: Arc<dyn ObjectStore> =
        Arc::new(FaultInjectingStore::new(backend.clone(), faults, seed));
    let stack = StorageStack::build(
        faulty,
        &StackConfig {
            retry: RetryPolicy {
                max_attempts: 4,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(5),
                max_elapsed: Duration::from_secs(2),
            },
            seed,
            ..StackConfig::default()
        },
        SystemClock::shared(),
    );
    let mut cfg = config();
    cfg.segment_interval = Duration::from_millis(30);
    cfg.segment_bytes = segment_bytes;
    // Opening may itself hit injected faults: retry it like an operator's supervisor would.
    let log = loop {
        match LogManager::open(
            stack.store.clone(),
            SystemClock::shared(),
            cfg.clone(),
            BrokerId(0),
        )
        .await
        {
            Ok(l) => break l,
            Err(e) => assert!(e.is_retryable(), "non-retriable error opening: {e}"),
        }
    };
    loop {
        match log.create_topic("t", Some(3), BTreeMap::new(), false).await {
            Ok(_) | Err(LogError::TopicAlreadyExists(_)) => break,
            Err(e) => assert!(e.is_retryable(), "non-retriable error creating: {e}"),
        }
    }
    let mut tasks = Vec::new();
    for p in 0..3 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..60 {
                let value = format!("p{p}-{i}");
                match log
                    .append(&tp("t", p), batch(&[&value], i, None), DURABLE)
                    .await
                {
                    Ok(out) => acked.push((out.base_offset.0, value)),
                    Err(e) => assert!(e.is_retryable(), "non-retriable error: {e}"),
                }
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.push(t.await.unwrap());
    }
    log.abort_for_test();
    // Reopen on the raw store, without faults: storage alone must hold every acknowledgement.
    let log = open(&backend, config()).await;
    for (p, acked) in acked.iter().enumerate() {
        assert!(
            !acked.is_empty(),
            "partition {p}: nothing was acknowledged at all"
        );
        let mut stored = Vec::new();
        let mut at = 0;
        loop {
            let out = log
                .read(&tp("t", p as i32), Offset(at), 1 << 20, true)
                .await
                .unwrap();
            if out.batches.is_empty() {
                break;
            }
            for b in &out.batches {
                for (off, rec) in strata_wire::builder::read_records(b).unwrap() {
                    stored.push((off, String::from_utf8(rec.value.unwrap().to_vec()).unwrap()));
                    at = off + 1;
                }
            }
        }
        let offsets: Vec<i64> = stored.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            (0..stored.len() as i64).collect::<Vec<_>>(),
            "offsets dense"
        );
        for (offset, value) in acked {
            let found: Vec<_> = stored.iter().filter(|(_, v)| v == value).collect();
            assert_eq!(found.len(), 1, "{value} stored {} times", found.len());
            assert_eq!(found[0].0, *offset, "{value} moved");
        }
    }
}

#[tokio::test]
async fn serving_again_under_the_same_or_a_new_epoch_resumes_with_the_uncompacted_tail() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire_one(&a, "t", 0, 3).await;
    for i in 0..5 {
        a.append(&tp("t", 0), batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
    }
    a.abandon(&tp("t", 0));
    assert!(matches!(
        a.append(&tp("t", 0), batch(&["x"], 0, None), DURABLE).await,
        Err(LogError::NotOwner)
    ));
    assert!(a.served().is_empty());
    acquire_one(&a, "t", 0, 3).await;
    // Nothing acknowledged before the pause is lost, and offsets are not handed out twice.
    assert_eq!(
        a.append(&tp("t", 0), batch(&["b"], 9, None), DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(5)
    );
    assert_eq!(
        base_offsets(&a, &tp("t", 0), 0).await,
        vec![0, 1, 2, 3, 4, 5]
    );
    // Offered back under a newer epoch with nobody having claimed it in between (the stored
    // manifest is still our last write): the in-memory state, with the uncompacted tail only
    // our own stream holds, is still the truth, so it serves on under the new epoch. (It used
    // to be refused for good, leaving the partition with no server after a storage outage.)
    a.abandon(&tp("t", 0));
    acquire_one(&a, "t", 0, 4).await;
    assert_eq!(a.served_epoch(&tp("t", 0)), Some(4));
    assert_eq!(
        a.append(&tp("t", 0), batch(&["c"], 9, None), DURABLE)
            .await
            .unwrap()
            .base_offset,
        Offset(6)
    );
    // And a successor sees every record, and the new epoch in the manifest.
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    acquire_one(&b, "t", 0, 5).await;
    assert_eq!(
        base_offsets(&b, &tp("t", 0), 0).await,
        vec![0, 1, 2, 3, 4, 5, 6]
    );
    // A, sealed by B, can no longer be given it back.
    a.abandon(&tp("t", 0));
    assert!(matches!(
        a.acquire(vec![("t".into(), 0, 6)]).await,
        Err(LogError::Fenced)
    ));
}

/// A log over a memory store whose puts can be made to fail like a full disk.
async fn open_with_faults(
    config: LogConfig,
) -> (Arc<strata_storage::FaultInjectingStore>, Arc<LogManager>) {
    use strata_storage::{FaultConfig, FaultInjectingStore};
    let faults = Arc::new(FaultInjectingStore::new(
        Arc::new(MemoryStore::new()),
        FaultConfig::none(),
        7,
    ));
    let store: Arc<dyn ObjectStore> = faults.clone();
    (faults, open(&store, config).await)
}

/// Every put fails with ENOSPC's meaning; reads and lists still work.
fn fill_up(faults: &strata_storage::FaultInjectingStore) {
    use strata_storage::{FaultConfig, InjectedError, OpFaults, OpKind};
    let full = OpFaults {
        error_probability: 1.0,
        error: InjectedError::Full,
        ..OpFaults::default()
    };
    faults.set_config(
        FaultConfig::none()
            .with(OpKind::PutCreate, full)
            .with(OpKind::PutUpdate, full),
    );
}

async fn wait_for_high_watermark(log: &LogManager, tp: &TopicPartition, at_least: i64) {
    let mut hw = log.subscribe(tp).unwrap();
    tokio::time::timeout(Duration::from_secs(30), hw.wait_for(|hw| hw.0 >= at_least))
        .await
        .expect("high watermark reached in time")
        .unwrap();
}

fn is_full(result: &Result<crate::AppendOutcome, LogError>) -> bool {
    matches!(
        result,
        Err(LogError::Storage(strata_storage::StorageError::Full(_)))
    )
}

#[tokio::test]
async fn a_full_storage_fails_appends_at_once_and_resumes_without_loss() {
    let (faults, log) = open_with_faults(config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let t0 = tp("t", 0);
    let pid = 1000;
    let idem = |seq: i32, value: &'static str| batch(&[value], 1, Some((pid, 0, seq)));
    for seq in 0..3 {
        log.append(&t0, idem(seq, "before"), DURABLE).await.unwrap();
    }

    fill_up(&faults);
    // Used to wait out the request timeout (REQUEST_TIMED_OUT) while the write was retried.
    let first = log.append(&t0, idem(3, "during"), DURABLE).await;
    assert!(is_full(&first), "{first:?}");
    // While the write is stuck, nothing new is taken: no offsets handed out, no growing group.
    let next = log.append(&t0, idem(4, "later"), DURABLE).await;
    assert!(is_full(&next), "{next:?}");
    let retry = log.append(&t0, idem(3, "during"), DURABLE).await;
    assert!(
        is_full(&retry),
        "a retry is not acknowledged before it is durable: {retry:?}"
    );
    // Reads of what is durable go on.
    assert_eq!(base_offsets(&log, &t0, 0).await, vec![0, 1, 2]);

    faults.set_config(strata_storage::FaultConfig::none());
    // The stuck write lands by itself; the client's retry then finds it as a duplicate.
    wait_for_high_watermark(&log, &t0, 4).await;
    let retry = log.append(&t0, idem(3, "during"), DURABLE).await.unwrap();
    assert_eq!(retry.base_offset, Offset(3));
    let next = log.append(&t0, idem(4, "later"), DURABLE).await.unwrap();
    assert_eq!(next.base_offset, Offset(4));
    assert_eq!(base_offsets(&log, &t0, 0).await, vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_retry_of_a_batch_not_yet_durable_waits_for_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let t0 = tp("t", 0);
    let first = batch(&["x"], 1, Some((77, 0, 0)));
    // Queued, offsets assigned, not yet written: this test's runtime has one thread and the
    // writer has not run yet.
    let ticket = log.enqueue(&t0, first.clone(), DURABLE).await.unwrap();
    assert_eq!(log.watermarks(&t0).unwrap().high, Offset(0));
    // The retry is a duplicate; it used to be acknowledged right here, before anything was
    // durable.
    let retry = log.append(&t0, first, DURABLE).await.unwrap();
    assert_eq!(retry.base_offset, Offset(0));
    assert_eq!(log.watermarks(&t0).unwrap().high, Offset(1));
    ticket.wait().await.unwrap();
}

#[tokio::test]
async fn a_backlog_is_written_in_groups_of_at_most_flush_bytes() {
    let flush_bytes = 1000;
    let store = Arc::new(MemoryStore::new());
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let log = open(
        &dyn_store,
        LogConfig {
            flush_bytes,
            ..config()
        },
    )
    .await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let t0 = tp("t", 0);
    let value = "v".repeat(200);
    let one = batch(&[value.as_str()], 1, None);
    // Forty batches queue before the writer runs (one runtime thread): one backlog of 10 KB,
    // like the one that builds up while a write is stuck.
    for _ in 0..40 {
        log.append(
            &t0,
            one.clone(),
            Acks::None {
                timeout: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
    }
    wait_for_high_watermark(&log, &t0, 40).await;
    let header_room = 4096;
    for meta in store.list("wal/").await.unwrap() {
        assert!(
            meta.size as usize <= flush_bytes + one.len() + header_room,
            "{} holds {} bytes",
            meta.key,
            meta.size
        );
    }
    assert_eq!(
        base_offsets(&log, &t0, 0).await,
        (0..40).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn suspended_writes_keep_reads_and_resume_under_the_same_epoch() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let t0 = tp("t", 0);
    acquire_one(&a, "t", 0, 3).await;
    for i in 0..3 {
        a.append(&t0, batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
    }
    a.suspend_writes(&t0);
    let refused = a.append(&t0, batch(&["x"], 0, None), DURABLE).await;
    assert!(
        matches!(&refused, Err(e @ LogError::Storage(_)) if e.is_retryable()),
        "{refused:?}"
    );
    // Reads below the high watermark are still served, at the same epoch.
    assert_eq!(base_offsets(&a, &t0, 0).await, vec![0, 1, 2]);
    assert_eq!(a.readable_epoch(&t0), Some(3));
    assert!(a.served().is_empty(), "not served for appends");
    acquire_one(&a, "t", 0, 3).await;
    let next = a
        .append(&t0, batch(&["b"], 9, None), DURABLE)
        .await
        .unwrap();
    assert_eq!(next.base_offset, Offset(3));
    // Abandoning (someone else holds it) stops the reads too.
    a.abandon(&t0);
    assert!(matches!(
        a.read(&t0, Offset(0), 1 << 20, true).await,
        Err(LogError::NotOwner)
    ));
    assert_eq!(a.readable_epoch(&t0), None);
}

mod cleaner;
mod deposed;
mod intercept;
mod moves;
mod tiers;
mod txn;

#[tokio::test]
async fn partition_size_and_producer_state_survive_compaction_and_restart() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let (pid, epoch) = log.init_producer_id().await.unwrap();
    let batches: Vec<Bytes> = (0..4)
        .map(|i| batch(&["a", "b"], 1_000 + i, Some((pid, epoch, (2 * i) as i32))))
        .collect();
    let total: u64 = batches.iter().map(|b| b.len() as u64).sum();
    for b in &batches {
        log.append(&tp("t", 0), b.clone(), DURABLE).await.unwrap();
    }
    // In the uncompacted tail.
    assert_eq!(log.partition_size(&tp("t", 0)).unwrap(), total);
    let producers = log.producers(&tp("t", 0)).unwrap();
    assert_eq!(
        producers,
        [crate::ProducerSummary {
            producer_id: pid,
            epoch,
            last_sequence: 7,
            // The batch's max timestamp: its first plus one per later record.
            last_timestamp: 1_004,
            coordinator_epoch: -1,
            current_txn_start_offset: -1,
        }]
    );
    // In a compacted segment, read back from the manifest after a restart.
    log.compact_now(&tp("t", 0)).await.unwrap();
    assert_eq!(log.partition_size(&tp("t", 0)).unwrap(), total);
    log.shutdown().await.unwrap();
    let log = open(&store, config()).await;
    assert_eq!(log.partition_size(&tp("t", 0)).unwrap(), total);
    assert_eq!(log.producers(&tp("t", 0)).unwrap(), producers);
    assert!(matches!(
        log.partition_size(&tp("t", 1)),
        Err(LogError::UnknownTopicOrPartition)
    ));
}

/// Write-ahead objects in `store` (group commits; no seal is written in these tests).
async fn wal_objects(store: &Arc<dyn ObjectStore>) -> usize {
    store.list("wal/").await.unwrap().len()
}

/// A log with topic `t` of two partitions, and how many write-ahead objects it starts with.
async fn log_of_two_partitions(cfg: LogConfig) -> (Arc<dyn ObjectStore>, Arc<LogManager>, usize) {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, cfg).await;
    log.create_topic("t", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    let before = wal_objects(&store).await;
    (store, log, before)
}

/// An idle writer writes an append at once instead of waiting for the interval, but not while
/// a produce request holds it: the request's partitions then leave together in one write.
#[tokio::test(start_paused = true)]
async fn an_idle_writer_writes_at_once_but_waits_for_a_request_that_holds_it() {
    let interval = Duration::from_secs(60);
    let cfg = LogConfig {
        flush_interval: interval,
        ..config()
    };
    assert!(cfg.flush_when_idle, "the default");
    let (store, log, before) = log_of_two_partitions(cfg).await;
    let start = tokio::time::Instant::now();
    log.append(&tp("t", 0), batch(&["a"], 0, None), DURABLE)
        .await
        .unwrap();
    assert!(start.elapsed() < interval, "waited for the interval");
    assert_eq!(wal_objects(&store).await, before + 1);

    let hold = log.hold_writes();
    let first = log
        .enqueue(&tp("t", 0), batch(&["b"], 0, None), DURABLE)
        .await
        .unwrap();
    let second = log
        .enqueue(&tp("t", 1), batch(&["c"], 0, None), DURABLE)
        .await
        .unwrap();
    // Virtual time: the sleep ends only once every task, the writer's too, is waiting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(wal_objects(&store).await, before + 1, "written while held");
    drop(hold);
    first.wait().await.unwrap();
    second.wait().await.unwrap();
    assert_eq!(wal_objects(&store).await, before + 2, "not one write");
    assert!(start.elapsed() < interval, "waited for the interval");
}

/// With `flush_when_idle` off (the S3 default) a lone append waits for the interval, so that
/// appends arriving meanwhile share its write.
#[tokio::test(start_paused = true)]
async fn without_flush_when_idle_a_lone_append_waits_for_the_interval() {
    let interval = Duration::from_millis(100);
    let cfg = LogConfig {
        flush_interval: interval,
        flush_when_idle: false,
        ..config()
    };
    let (store, log, before) = log_of_two_partitions(cfg).await;
    let start = tokio::time::Instant::now();
    let first = log
        .enqueue(&tp("t", 0), batch(&["a"], 0, None), DURABLE)
        .await
        .unwrap();
    tokio::time::sleep(interval / 2).await;
    let second = log
        .enqueue(&tp("t", 1), batch(&["b"], 0, None), DURABLE)
        .await
        .unwrap();
    first.wait().await.unwrap();
    second.wait().await.unwrap();
    assert!(start.elapsed() >= interval, "written before the interval");
    assert_eq!(wal_objects(&store).await, before + 1, "not one write");
}

/// Restarts leave a bounded residue: each retired stream keeps only its seal, a start-up
/// does not write to streams sealed and collected before, and neither a start nor a
/// collector pass reads more objects the more incarnations came before.
#[tokio::test]
async fn restarts_leave_one_seal_each_and_cost_no_more_with_each_incarnation() {
    let metrics;
    let store: Arc<dyn ObjectStore> = {
        let wrapped =
            strata_storage::MetricsStore::new(Arc::new(MemoryStore::new()), SystemClock::shared());
        metrics = Arc::clone(wrapped.metrics());
        Arc::new(wrapped)
    };
    let ops = |kind| metrics.snapshot().op(kind).requests;
    use strata_storage::OpKind::{Get, PutCreate as Put};
    let mut costs = Vec::new();
    for i in 0..8i64 {
        let (gets, puts) = (ops(Get), ops(Put));
        let log = open(&store, config()).await;
        let open_cost = (ops(Get) - gets, ops(Put) - puts);
        if i == 0 {
            log.create_topic("t", Some(1), BTreeMap::new(), false)
                .await
                .unwrap();
        }
        log.append(&tp("t", 0), batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
        log.collect_garbage().await.unwrap();
        let gets = ops(Get);
        log.collect_garbage().await.unwrap();
        costs.push((open_cost, ops(Get) - gets));
        log.shutdown().await.unwrap();
    }
    let log = open(&store, config()).await;
    log.collect_garbage().await.unwrap();
    let wal: Vec<String> = store
        .list("wal/")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key.as_str().to_string())
        .collect();
    eprintln!("{costs:?}\n{wal:?}");
    // Eight retired streams, one seal each.
    assert_eq!(wal.len(), 8, "{wal:?}");
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..8).collect::<Vec<i64>>()
    );
    // From the third start on (two streams are retired by then), nothing grows.
    let steady = &costs[2..];
    assert!(
        steady.iter().all(|c| *c == steady[0]),
        "per-start (gets, puts) and per-pass gets grew: {costs:?}"
    );
}

/// Hole markers below a retired stream's seal stay (they fence the deposed writer's late
/// writes), and a start-up after the stream is retired does not seal it again (which put
/// back markers where the collector had deleted data).
#[tokio::test]
async fn a_retired_stream_keeps_its_markers_and_is_not_sealed_again() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(&store, config()).await;
    let first = log.stream();
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    log.append(&tp("t", 0), batch(&["a"], 0, None), DURABLE)
        .await
        .unwrap();
    log.abort_for_test();
    // A write past a gap: the sealer fills the gap at 2 with a hole marker.
    let key = |seq| strata_storage::ObjectKey::new(crate::wal::key(first, seq)).unwrap();
    let (object, _) = store.get(&key(1)).await.unwrap();
    store
        .put(&key(3), object, strata_storage::PutMode::Create)
        .await
        .unwrap();
    let seqs = |store: Arc<dyn ObjectStore>| async move {
        store
            .list(&crate::wal::stream_prefix(first))
            .await
            .unwrap()
            .iter()
            .filter_map(|m| crate::wal::parse_key(m.key.as_str()).map(|(_, q)| q))
            .collect::<Vec<u64>>()
    };
    let log = open(&store, config()).await;
    assert_eq!(seqs(store.clone()).await, [1, 2, 3, 4]);
    log.collect_garbage().await.unwrap();
    // The data went; the hole and the seal stay; the registration went.
    assert_eq!(seqs(store.clone()).await, [2, 4]);
    let registered = strata_layout::streams::registered(store.as_ref())
        .await
        .unwrap();
    assert!(!registered.contains(&first), "{registered:?}");
    log.shutdown().await.unwrap();
    // The next start does not seal it again: no marker comes back at 1 or 3.
    let log = open(&store, config()).await;
    log.collect_garbage().await.unwrap();
    assert_eq!(seqs(store.clone()).await, [2, 4]);
    assert_eq!(base_offsets(&log, &tp("t", 0), 0).await, vec![0]);
}

/// The highest registration is never deleted (new ids are allocated above it), so a retired
/// stream that holds it is remembered instead: later passes read nothing of it.
#[tokio::test]
async fn a_retired_stream_with_the_highest_registration_is_read_once() {
    let metrics;
    let store: Arc<dyn ObjectStore> = {
        let wrapped =
            strata_storage::MetricsStore::new(Arc::new(MemoryStore::new()), SystemClock::shared());
        metrics = Arc::clone(wrapped.metrics());
        Arc::new(wrapped)
    };
    let gets = || metrics.snapshot().op(strata_storage::OpKind::Get).requests;
    let b = open_managed(&store, 2).await;
    let a = open_managed(&store, 1).await;
    assert!(a.stream() > b.stream());
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire_one(&a, "t", 0, 1).await;
    a.append(&tp("t", 0), batch(&["a"], 0, None), DURABLE)
        .await
        .unwrap();
    a.abort_for_test();
    b.refresh_catalog().await.unwrap();
    acquire_one(&b, "t", 0, 2).await;
    b.compact_now(&tp("t", 0)).await.unwrap();
    assert!(b.collect_garbage().await.unwrap() > 0);
    let registered = strata_layout::streams::registered(store.as_ref())
        .await
        .unwrap();
    assert_eq!(registered, [b.stream(), a.stream()]);
    let before = gets();
    b.collect_garbage().await.unwrap();
    assert_eq!(gets(), before, "a pass read the retired stream again");
    assert_eq!(base_offsets(&b, &tp("t", 0), 0).await, vec![0]);
}

/// A cluster broker stopped cleanly hands its partitions over, and nobody else seals its
/// stream: it seals it itself at shutdown, so another broker's collector retires it instead
/// of keeping its registration and newest object for ever.
#[tokio::test]
async fn a_cleanly_stopped_brokers_stream_is_retired_by_another_broker() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = broker_one_wrote(&store, 5).await;
    let b = open_managed(&store, 2).await;
    assert_eq!(a.release(&tp("t", 0)).await.unwrap(), Offset(5));
    a.shutdown().await.unwrap();
    assert!(is_sealed(&store, a.stream()).await);
    b.refresh_catalog().await.unwrap();
    acquire_one(&b, "t", 0, 2).await;
    b.collect_garbage().await.unwrap();
    let registered = strata_layout::streams::registered(store.as_ref())
        .await
        .unwrap();
    assert_eq!(registered, [b.stream()]);
    let left = store
        .list(&crate::wal::stream_prefix(a.stream()))
        .await
        .unwrap();
    for meta in &left {
        let (bytes, _) = store.get(&meta.key).await.unwrap();
        assert!(
            crate::wal::is_seal(&bytes),
            "{} holds data",
            meta.key.as_str()
        );
    }
    assert_eq!(base_offsets(&b, &tp("t", 0), 0).await, vec![0, 1, 2, 3, 4]);
}

/// Producer-id blocks are claimed above the highest marker, so only that one is kept: the
/// markers no longer pile up one per start (every claim listed them all), and ids stay
/// unique across restarts and between brokers claiming at once.
#[tokio::test]
async fn producer_id_blocks_keep_only_the_highest_marker_and_never_repeat() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let a = open_managed(&store, 1).await;
        let b = open_managed(&store, 2).await;
        let (x, y) = tokio::join!(a.init_producer_id(), b.init_producer_id());
        for (pid, _) in [x.unwrap(), y.unwrap()] {
            assert!(seen.insert(pid), "producer id {pid} handed out twice");
        }
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();
    }
    let markers = store.list("meta/producer-ids/").await.unwrap();
    assert!(markers.len() <= 2, "{markers:?}");
    let highest = *seen.last().unwrap();
    let log = open(&store, config()).await;
    let (next, _) = log.init_producer_id().await.unwrap();
    assert!(next > highest, "{next} is not above {highest}");
}

/// A deposed owner that resumes and stops cleanly seals its stream at shutdown: the
/// successor sealed it first, so the procedure finds that seal and keeps it, and the
/// successor's data and writes are untouched. Its collector, run while deposed, deletes no
/// registration but that of a retired stream.
#[tokio::test]
async fn a_deposed_owner_that_resumes_and_stops_harms_nothing_with_its_seal_or_collector() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = broker_one_wrote(&store, 3).await;
    // A is "paused": B takes the partition over, sealing A's stream.
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    acquire_one(&b, "t", 0, 2).await;
    let seal_of_a = |store: Arc<dyn ObjectStore>, stream: u32| async move {
        let mut seals = Vec::new();
        for meta in store
            .list(&crate::wal::stream_prefix(stream))
            .await
            .unwrap()
        {
            let (bytes, _) = store.get(&meta.key).await.unwrap();
            if strata_layout::wal::parse_seal(&bytes)
                .is_some_and(|s| s.kind == strata_layout::wal::SealKind::Seal)
            {
                seals.push(meta.key.as_str().to_string());
            }
        }
        seals
    };
    let sealed_by_b = seal_of_a(store.clone(), a.stream()).await;
    assert_eq!(sealed_by_b.len(), 1, "{sealed_by_b:?}");
    // A resumes: its collector runs, then it stops cleanly (sealing its stream again).
    a.collect_garbage().await.unwrap();
    assert!(a
        .append(&tp("t", 0), batch(&["late"], 9, None), DURABLE)
        .await
        .is_err());
    let _ = a.shutdown().await;
    assert_eq!(seal_of_a(store.clone(), a.stream()).await, sealed_by_b);
    let registered = strata_layout::streams::registered(store.as_ref())
        .await
        .unwrap();
    assert!(registered.contains(&b.stream()), "{registered:?}");
    // B serves on, and everything acknowledged is there.
    b.append(&tp("t", 0), batch(&["b"], 5, None), DURABLE)
        .await
        .unwrap();
    assert_eq!(base_offsets(&b, &tp("t", 0), 0).await, vec![0, 1, 2, 3]);
    b.compact_now(&tp("t", 0)).await.unwrap();
    b.collect_garbage().await.unwrap();
    assert_eq!(base_offsets(&b, &tp("t", 0), 0).await, vec![0, 1, 2, 3]);
}

/// A cluster broker killed before it wrote anything is named by no manifest, so no takeover
/// seals its stream; its node id's next incarnation does, at start, and a collector then
/// retires it. Another node's stream is left alone.
#[tokio::test]
async fn a_restarted_node_seals_the_stream_its_crashed_predecessor_never_wrote() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let other = open_managed(&store, 2).await;
    let crashed = open_managed(&store, 1).await;
    crashed.abort_for_test();
    assert!(!is_sealed(&store, crashed.stream()).await);
    let restarted = open_managed(&store, 1).await;
    assert!(is_sealed(&store, crashed.stream()).await);
    assert!(!is_sealed(&store, other.stream()).await);
    assert!(!is_sealed(&store, restarted.stream()).await);
    restarted.collect_garbage().await.unwrap();
    let registered = strata_layout::streams::registered(store.as_ref())
        .await
        .unwrap();
    assert_eq!(registered, [other.stream(), restarted.stream()]);
    // The other node's writer still works: it was not fenced.
    other
        .create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire_one(&other, "t", 0, 1).await;
    other
        .append(&tp("t", 0), batch(&["a"], 0, None), DURABLE)
        .await
        .unwrap();
}

/// A predecessor's stream that a takeover sealed already is not sealed again at the next
/// start: that would put hole markers back where the collector deleted data.
#[tokio::test]
async fn a_restarted_node_leaves_an_already_sealed_predecessor_alone() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (a, _b) = broker_two_took_over(&store, 3).await;
    assert!(is_sealed(&store, a.stream()).await);
    // As a collector may leave it: data gone from the middle, the seal above.
    let listing = |store: Arc<dyn ObjectStore>, stream: u32| async move {
        store
            .list(&crate::wal::stream_prefix(stream))
            .await
            .unwrap()
            .iter()
            .map(|m| m.key.as_str().to_string())
            .collect::<Vec<_>>()
    };
    let before = listing(store.clone(), a.stream()).await;
    assert!(before.len() >= 3, "{before:?}");
    store
        .delete(&strata_storage::ObjectKey::new(&before[1]).unwrap())
        .await
        .unwrap();
    let gapped = listing(store.clone(), a.stream()).await;
    let _restarted = open_managed(&store, 1).await;
    assert_eq!(listing(store.clone(), a.stream()).await, gapped);
}

/// Writes a deposed writer had in flight when it was sealed can land above the seal. They
/// were never acknowledged, and the stream used to look live for ever (its newest object is
/// data), so nothing of it was collected: now a collector finds the seal below them, deletes
/// them with the rest, and retires the stream. A live writer's stream is never touched.
#[tokio::test]
async fn late_writes_above_a_seal_are_collected_and_the_stream_retired() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (a, b) = broker_two_took_over(&store, 3).await;
    // A live, idle writer: its newest object is data and stays so between passes.
    let c = open_managed(&store, 3).await;
    c.create_topic("u", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire_one(&c, "u", 0, 1).await;
    c.append(&tp("u", 0), batch(&["c"], 0, None), DURABLE)
        .await
        .unwrap();
    let listing = |stream: u32| {
        let store = store.clone();
        async move {
            store
                .list(&crate::wal::stream_prefix(stream))
                .await
                .unwrap()
                .iter()
                .filter_map(|m| crate::wal::parse_key(m.key.as_str()).map(|(_, seq)| seq))
                .collect::<Vec<u64>>()
        }
    };
    // A's last data object, landing late just above the seal.
    let seqs = listing(a.stream()).await;
    let seal = *seqs.last().unwrap();
    let key = |seq| strata_storage::ObjectKey::new(crate::wal::key(a.stream(), seq)).unwrap();
    let (late, _) = store.get(&key(seqs[0])).await.unwrap();
    store
        .put(&key(seal + 1), late, strata_storage::PutMode::Create)
        .await
        .unwrap();
    let c_objects = listing(c.stream()).await;
    b.compact_now(&tp("t", 0)).await.unwrap();
    // Busy writers change between passes; this stream does not, so the second pass looks
    // below its newest object.
    b.collect_garbage().await.unwrap();
    b.collect_garbage().await.unwrap();
    let left = listing(a.stream()).await;
    assert!(
        !left.contains(&(seal + 1)),
        "the late write stays: {left:?}"
    );
    assert!(left.contains(&seal), "the seal went: {left:?}");
    let registered = strata_layout::streams::registered(store.as_ref())
        .await
        .unwrap();
    assert_eq!(registered, [b.stream(), c.stream()]);
    b.collect_garbage().await.unwrap();
    assert_eq!(listing(c.stream()).await, c_objects);
    c.append(&tp("u", 0), batch(&["c"], 1, None), DURABLE)
        .await
        .unwrap();
    // B's own records are all there, and B's stream was never judged.
    assert!(!is_sealed(&store, b.stream()).await);
    assert_eq!(base_offsets(&b, &tp("t", 0), 0).await, vec![0, 1, 2]);
}
