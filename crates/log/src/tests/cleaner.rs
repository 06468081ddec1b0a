//! The log cleaner (key compaction): what a pass keeps, how reads cross the holes it leaves,
//! tombstones, compressed and idempotent batches, a map smaller than the key set, and a
//! deposed owner's pass.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use strata_core::clock::ManualClock;
use strata_core::{BrokerId, Clock, Offset, SystemClock};
use strata_storage::{MemoryStore, ObjectStore};
use strata_wire::batch::BatchError;

use super::{as_gzip, config, frame_batch, gzip, open_managed, put_varint, tp, DURABLE};
use crate::{LogConfig, LogError, LogManager};

/// An uncompressed batch of (key, value) records (None value: a tombstone), timestamps `ts`.
pub(crate) fn keyed(
    records: &[(Option<&str>, Option<&str>)],
    ts: i64,
    producer: Option<(i64, i16, i32)>,
) -> Bytes {
    let mut body_records = BytesMut::new();
    for (i, (k, v)) in records.iter().enumerate() {
        let mut r = BytesMut::new();
        r.put_i8(0);
        put_varint(&mut r, 0);
        put_varint(&mut r, i as i64);
        for field in [k, v] {
            match field {
                Some(s) => {
                    put_varint(&mut r, s.len() as i64);
                    r.put_slice(s.as_bytes());
                }
                None => put_varint(&mut r, -1),
            }
        }
        put_varint(&mut r, 0);
        put_varint(&mut body_records, r.len() as i64);
        body_records.put_slice(&r);
    }
    frame_batch(&body_records, records.len(), ts, ts, producer)
}

fn compact_topic(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut m = BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]);
    for (k, v) in extra {
        m.insert(k.to_string(), v.to_string());
    }
    m
}

/// Every stored record from `from` on: (offset, key, value). Moves past each batch by its last
/// offset, as consumers do, since a cleaned batch spans offsets it no longer holds.
async fn read_all(log: &LogManager, from: i64) -> Vec<(i64, String, Option<String>)> {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        let read = log
            .read(&tp("c", 0), Offset(at), 1 << 20, true)
            .await
            .unwrap_or_else(|e| panic!("reading offset {at}: {e}"));
        if read.batches.is_empty() {
            return out;
        }
        for b in &read.batches {
            let view = strata_wire::split_batches(b).unwrap().remove(0);
            for r in strata_wire::clean::records(&view, 1 << 20).unwrap() {
                if r.offset >= at {
                    let value = (!r.is_tombstone).then(String::new);
                    out.push((
                        r.offset,
                        String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                        value,
                    ));
                }
            }
            at = view.header().last_offset() + 1;
        }
    }
}

/// Latest (offset, is_tombstone) per key among `appended` (offset, key, tombstone).
fn latest(appended: &[(i64, String, bool)]) -> BTreeMap<String, (i64, bool)> {
    let mut m = BTreeMap::new();
    for (o, k, t) in appended {
        m.insert(k.clone(), (*o, *t));
    }
    m
}

fn survivors(read: &[(i64, String, Option<String>)]) -> BTreeMap<String, (i64, bool)> {
    let mut m = BTreeMap::new();
    for (o, k, v) in read {
        assert!(
            m.insert(k.clone(), (*o, v.is_none())).is_none(),
            "key {k} survives twice"
        );
    }
    m
}

async fn open_with_clock(
    store: &Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    config: LogConfig,
) -> Arc<LogManager> {
    LogManager::open(store.clone(), clock, config, BrokerId(0))
        .await
        .unwrap()
}

fn manual_config() -> LogConfig {
    LogConfig {
        // Every append is written at once: the writer's timer never fires on a manual clock.
        flush_bytes: 1,
        cleaner_threads: 0,
        ..config()
    }
}

/// Appends `count` single-record batches cycling over `keys` keys; returns what was appended.
async fn updates(log: &LogManager, count: usize, keys: usize, ts: i64) -> Vec<(i64, String, bool)> {
    let mut out = Vec::new();
    for i in 0..count {
        let key = format!("k{}", i % keys);
        let value = format!("v{i}");
        let o = log
            .append(
                &tp("c", 0),
                keyed(&[(Some(&key), Some(&value))], ts, None),
                DURABLE,
            )
            .await
            .unwrap()
            .base_offset
            .0;
        out.push((o, key, false));
    }
    out
}

#[tokio::test]
async fn a_pass_keeps_the_latest_record_of_each_key_at_its_offset_and_fetches_cross_the_holes() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open_with_clock(
        &store,
        SystemClock::shared(),
        LogConfig {
            cleaner_threads: 0,
            ..config()
        },
    )
    .await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let appended = updates(&log, 40, 5, 0).await;
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    let read = read_all(&log, 0).await;
    assert_eq!(survivors(&read), latest(&appended));
    assert_eq!(read.len(), 5);
    // Offset 0 was cleaned away: a fetch there starts at the first surviving batch.
    let first = log
        .read(&tp("c", 0), Offset(0), 1 << 20, true)
        .await
        .unwrap();
    let base = i64::from_be_bytes(first.batches[0][..8].try_into().unwrap());
    assert_eq!(base, 35);
    // The log start and high watermark do not move; later appends continue the offsets.
    let w = log.watermarks(&tp("c", 0)).unwrap();
    assert_eq!((w.log_start.0, w.high.0), (0, 40));
    let more = updates(&log, 1, 1, 0).await;
    assert_eq!(more[0].0, 40);
    // And after a restart, through the index alone; the next pass continues from the
    // manifest's cleaner checkpoint.
    log.shutdown().await.unwrap();
    let log = open_with_clock(
        &store,
        SystemClock::shared(),
        LogConfig {
            cleaner_threads: 0,
            ..config()
        },
    )
    .await;
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    let mut expect = appended.clone();
    expect.extend(more);
    assert_eq!(survivors(&read_all(&log, 0).await), latest(&expect));
}

#[tokio::test]
async fn keyless_records_are_refused_on_compacted_topics_and_nothing_is_stored() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open_with_clock(
        &store,
        SystemClock::shared(),
        LogConfig {
            cleaner_threads: 0,
            ..config()
        },
    )
    .await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let mixed = keyed(&[(Some("k"), Some("v")), (None, Some("v"))], 0, None);
    match log.append(&tp("c", 0), mixed, DURABLE).await {
        Err(LogError::CorruptMessage(BatchError::KeylessRecordOnCompactedTopic { index: 1 })) => {}
        other => panic!("expected the keyless record refused, got {other:?}"),
    }
    // Compressed: found after decompressing.
    let plain = keyed(&[(None, Some("v"))], 0, None);
    let zipped = as_gzip(&plain, &gzip(&plain[61..]));
    assert!(matches!(
        log.append(&tp("c", 0), zipped, DURABLE).await,
        Err(LogError::CorruptMessage(
            BatchError::KeylessRecordOnCompactedTopic { index: 0 }
        ))
    ));
    assert_eq!(log.watermarks(&tp("c", 0)).unwrap().high.0, 0);
    // A topic that deletes takes them.
    log.create_topic("d", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    log.append(&tp("d", 0), keyed(&[(None, Some("v"))], 0, None), DURABLE)
        .await
        .unwrap();
}

#[tokio::test]
async fn tombstones_are_removed_only_once_delete_retention_ms_passed_since_first_cleaned() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let log = open_with_clock(&store, clock.clone(), manual_config()).await;
    log.create_topic(
        "c",
        Some(1),
        compact_topic(&[("delete.retention.ms", "1000")]),
        false,
    )
    .await
    .unwrap();
    let append = |recs: Vec<(Option<&'static str>, Option<&'static str>)>| {
        let log = log.clone();
        async move {
            log.append(&tp("c", 0), keyed(&recs, 0, None), DURABLE)
                .await
                .unwrap();
            log.compact_now(&tp("c", 0)).await.unwrap();
        }
    };
    append(vec![(Some("a"), Some("1")), (Some("b"), Some("2"))]).await;
    append(vec![(Some("a"), None)]).await;
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    let keys = |r: Vec<(i64, String, Option<String>)>| {
        r.into_iter()
            .map(|(_, k, v)| (k, v.is_none()))
            .collect::<Vec<_>>()
    };
    // The first pass removes a's value but keeps its tombstone for delete.retention.ms.
    assert_eq!(
        keys(read_all(&log, 0).await),
        vec![("b".into(), false), ("a".into(), true)]
    );
    clock.advance(Duration::from_millis(900));
    append(vec![(Some("c"), Some("3"))]).await;
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    assert_eq!(
        keys(read_all(&log, 0).await).len(),
        3,
        "the tombstone is 900ms old: kept"
    );
    clock.advance(Duration::from_millis(200));
    append(vec![(Some("d"), Some("4"))]).await;
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    assert_eq!(
        keys(read_all(&log, 0).await),
        vec![
            ("b".into(), false),
            ("c".into(), false),
            ("d".into(), false)
        ]
    );
}

#[tokio::test]
async fn compressed_batches_are_filtered_and_recompressed_with_their_codec() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open_with_clock(
        &store,
        SystemClock::shared(),
        LogConfig {
            cleaner_threads: 0,
            ..config()
        },
    )
    .await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let plain = keyed(
        &[
            (Some("a"), Some("1")),
            (Some("b"), Some("2")),
            (Some("a"), Some("3")),
        ],
        0,
        None,
    );
    log.append(&tp("c", 0), as_gzip(&plain, &gzip(&plain[61..])), DURABLE)
        .await
        .unwrap();
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    let read = log
        .read(&tp("c", 0), Offset(0), 1 << 20, true)
        .await
        .unwrap();
    let view = strata_wire::split_batches(&read.batches[0])
        .unwrap()
        .remove(0);
    assert_eq!(view.compression(), strata_wire::Compression::Gzip);
    assert_eq!(
        (
            view.header().base_offset,
            view.header().last_offset(),
            view.record_count()
        ),
        (0, 2, 2)
    );
    let offsets: Vec<i64> = strata_wire::clean::records(&view, 1 << 20)
        .unwrap()
        .iter()
        .map(|r| r.offset)
        .collect();
    assert_eq!(offsets, vec![1, 2]);
}

#[tokio::test]
async fn an_idempotent_producers_last_batch_survives_cleaning_empty_and_its_retry_is_a_duplicate() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let config = LogConfig {
        cleaner_threads: 0,
        ..config()
    };
    let log = open_with_clock(&store, SystemClock::shared(), config.clone()).await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let (pid, epoch) = log.init_producer_id().await.unwrap();
    let idem = keyed(&[(Some("a"), Some("1"))], 0, Some((pid, epoch, 0)));
    assert_eq!(
        log.append(&tp("c", 0), idem.clone(), DURABLE)
            .await
            .unwrap()
            .base_offset
            .0,
        0
    );
    log.append(
        &tp("c", 0),
        keyed(&[(Some("a"), Some("2"))], 0, None),
        DURABLE,
    )
    .await
    .unwrap();
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    // The producer's batch lost its only record but stays, empty, with its sequence.
    let read = log
        .read(&tp("c", 0), Offset(0), 1 << 20, true)
        .await
        .unwrap();
    let empty = strata_wire::split_batches(&read.batches[0])
        .unwrap()
        .remove(0);
    let h = empty.header();
    assert_eq!(
        (
            h.base_offset,
            h.record_count,
            h.producer_id,
            h.base_sequence
        ),
        (0, 0, pid, 0)
    );
    // A retry of it is recognised, before and after a restart.
    assert_eq!(
        log.append(&tp("c", 0), idem.clone(), DURABLE)
            .await
            .unwrap()
            .base_offset
            .0,
        0
    );
    log.shutdown().await.unwrap();
    let log = open_with_clock(&store, SystemClock::shared(), config).await;
    assert_eq!(
        log.append(&tp("c", 0), idem, DURABLE)
            .await
            .unwrap()
            .base_offset
            .0,
        0
    );
    assert_eq!(log.watermarks(&tp("c", 0)).unwrap().high.0, 2);
}

#[tokio::test]
async fn a_map_smaller_than_the_key_set_converges_over_several_passes() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let config = LogConfig {
        cleaner_threads: 0,
        // Nine keys a pass.
        cleaner_dedupe_buffer_bytes: 10 * crate::cleaner::SLOT_BYTES,
        segment_bytes: 400,
        ..config()
    };
    let log = open_with_clock(&store, SystemClock::shared(), config).await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let appended = updates(&log, 90, 30, 0).await;
    log.compact_now(&tp("c", 0)).await.unwrap();
    let mut passes = 0;
    while log.clean_now(&tp("c", 0)).await.unwrap() {
        passes += 1;
        assert!(passes < 100, "the cleaner does not converge");
    }
    assert!(passes > 1, "one pass cannot map 30 keys in a 9-key map");
    assert_eq!(survivors(&read_all(&log, 0).await), latest(&appended));
    let stats = log.cleaner_stats();
    assert_eq!(stats.records_removed, 60);
}

/// One segment holding more keys than the map: each pass must map from where the last one
/// stopped, not from the segment's start (which filled the map with the same keys every time
/// and never moved `cleaned_to`, found end to end by
/// `a_consumer_reading_from_offset_0_during_cleaning_sees_every_latest_value`).
#[tokio::test]
async fn a_segment_with_more_keys_than_the_map_is_cleaned_over_several_passes() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let config = LogConfig {
        cleaner_threads: 0,
        // Nine keys a pass.
        cleaner_dedupe_buffer_bytes: 10 * crate::cleaner::SLOT_BYTES,
        // One segment for all 90 records.
        segment_bytes: 1 << 20,
        ..config()
    };
    let log = open_with_clock(&store, SystemClock::shared(), config).await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let appended = updates(&log, 90, 30, 0).await;
    log.compact_now(&tp("c", 0)).await.unwrap();
    let mut passes = 0;
    loop {
        let read = read_all(&log, 0).await;
        let keys: std::collections::BTreeSet<&String> = read.iter().map(|(_, k, _)| k).collect();
        if keys.len() == read.len() {
            break;
        }
        assert!(log.clean_now(&tp("c", 0)).await.unwrap());
        passes += 1;
        assert!(passes < 20, "the cleaner does not converge");
    }
    assert_eq!(survivors(&read_all(&log, 0).await), latest(&appended));
}

#[tokio::test]
async fn a_deposed_owners_pass_fails_at_its_manifest_and_its_segments_are_collected() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    for (tp_, r) in a.acquire(vec![("c".into(), 0, 1)]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("{tp_}: {e}"));
    }
    let mut appended = updates(&a, 20, 4, 0).await;
    a.compact_now(&tp("c", 0)).await.unwrap();
    // B takes the partition over while A is paused; A then runs its pass.
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    for (tp_, r) in b.acquire(vec![("c".into(), 0, 2)]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("{tp_}: {e}"));
    }
    assert!(matches!(
        a.clean_now(&tp("c", 0)).await,
        Err(LogError::Fenced) | Ok(false)
    ));
    let prefix =
        |log: &LogManager| strata_layout::partition::segment_prefix(log.topic("c").unwrap().id, 0);
    let cleaned = |keys: Vec<_>| {
        keys.into_iter()
            .map(|m: strata_storage::ObjectMeta| m)
            .filter(|m| {
                strata_layout::partition::parse_cleaned_segment_key(m.key.as_str()).is_some()
            })
            .map(|m| m.key.as_str().to_string())
            .collect::<Vec<_>>()
    };
    let orphans: Vec<String> = cleaned(store.list(&prefix(&b)).await.unwrap());
    assert!(
        !orphans.is_empty(),
        "A's pass wrote its segments before failing"
    );
    // B reads every latest value, cleans on, and collects A's orphans.
    appended.extend(updates(&b, 4, 4, 0).await);
    b.compact_now(&tp("c", 0)).await.unwrap();
    assert!(b.clean_now(&tp("c", 0)).await.unwrap());
    b.collect_garbage().await.unwrap();
    let stored = store.list(&prefix(&b)).await.unwrap();
    let names: Vec<String> = stored.iter().map(|m| m.key.as_str().to_string()).collect();
    for orphan in &orphans {
        assert!(
            !names.contains(orphan),
            "A's orphan {orphan} is still there: {names:?}"
        );
    }
    let read = {
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let r = b
                .read(&tp("c", 0), Offset(at), 1 << 20, true)
                .await
                .unwrap();
            if r.batches.is_empty() {
                break out;
            }
            for batch in &r.batches {
                let view = strata_wire::split_batches(batch).unwrap().remove(0);
                for rec in strata_wire::clean::records(&view, 1 << 20).unwrap() {
                    out.push((
                        rec.offset,
                        String::from_utf8(rec.key.unwrap().to_vec()).unwrap(),
                        Some(String::new()),
                    ));
                }
                at = view.header().last_offset() + 1;
            }
        }
    };
    assert_eq!(survivors(&read), latest(&appended));
}

/// A store that dies part-way through a cleaning pass: once armed, it lets one manifest update
/// through (the pass recording its intent) and then fails every write, as if the broker had
/// crashed right after that compare-and-swap. Reads keep working (they change nothing).
#[derive(Debug)]
struct DiesAfterIntent {
    armed: std::sync::atomic::AtomicBool,
    dead: std::sync::atomic::AtomicBool,
}

impl DiesAfterIntent {
    fn crashed(&self) -> strata_storage::StorageResult<()> {
        if self.dead.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(strata_storage::StorageError::Unavailable("crashed".into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl super::intercept::Intercept for DiesAfterIntent {
    async fn before_put(
        &self,
        _key: &strata_storage::ObjectKey,
        _mode: &strata_storage::PutMode,
    ) -> strata_storage::StorageResult<()> {
        self.crashed()
    }

    fn after_put(&self, key: &strata_storage::ObjectKey, mode: &strata_storage::PutMode) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.armed.load(SeqCst) && super::intercept::is_manifest_update(key, mode) {
            self.dead.store(true, SeqCst);
        }
    }

    async fn before_delete(
        &self,
        _key: &strata_storage::ObjectKey,
    ) -> strata_storage::StorageResult<()> {
        self.crashed()
    }
}

/// A owner that crashes between a pass's two manifest updates — the pass recorded, its new
/// segments written, no index chunk repointed, the segment lists not swapped — leaves a log
/// that reads right, and the next owner finishes the pass: every key's latest record
/// survives, once, and the replaced segments are deleted.
#[tokio::test]
async fn a_pass_cut_off_after_recording_its_intent_is_finished_by_the_next_owner() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let intercepted = super::intercept::Intercepted::new(
        Arc::clone(&store),
        DiesAfterIntent {
            armed: AtomicBool::new(false),
            dead: AtomicBool::new(false),
        },
    );
    let dying = &intercepted.hooks;
    let dying_store: Arc<dyn ObjectStore> = intercepted.clone();
    let a = open_managed(&dying_store, 1).await;
    a.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    for (tp_, r) in a.acquire(vec![("c".into(), 0, 1)]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("{tp_}: {e}"));
    }
    let appended = updates(&a, 30, 4, 0).await;
    a.compact_now(&tp("c", 0)).await.unwrap();
    let prefix = strata_layout::partition::segment_prefix(a.topic("c").unwrap().id, 0);
    let originals: Vec<String> = store
        .list(&prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key.as_str().to_string())
        .collect();
    assert!(!originals.is_empty());
    dying.armed.store(true, SeqCst);
    assert!(
        a.clean_now(&tp("c", 0)).await.is_err(),
        "the pass dies after recording its intent"
    );
    assert!(dying.dead.load(SeqCst), "the intent was written");
    let cleaned_keys = |keys: Vec<strata_storage::ObjectMeta>| -> Vec<String> {
        keys.into_iter()
            .map(|m| m.key.as_str().to_string())
            .filter(|k| strata_layout::partition::parse_cleaned_segment_key(k).is_some())
            .collect()
    };
    let written_by_a = cleaned_keys(store.list(&prefix).await.unwrap());
    assert!(!written_by_a.is_empty(), "A wrote its replacements first");

    // B takes the partition over from the dead A and serves the half-done pass.
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    for (tp_, r) in b.acquire(vec![("c".into(), 0, 2)]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("{tp_}: {e}"));
    }
    let before = read_all(&b, 0).await;
    let expected: BTreeMap<i64, String> =
        appended.iter().map(|(o, k, _)| (*o, k.clone())).collect();
    let mut last_per_key = BTreeMap::new();
    let mut previous = -1;
    for (offset, key, _) in &before {
        assert!(*offset > previous, "offsets go forward: {before:?}");
        previous = *offset;
        assert_eq!(
            expected.get(offset),
            Some(key),
            "a record B reads was appended there"
        );
        last_per_key.insert(key.clone(), (*offset, false));
    }
    assert_eq!(
        last_per_key,
        latest(&appended),
        "every key's latest record is readable"
    );

    // B finishes the recorded pass before anything else, then the log is cleaned.
    b.clean_now(&tp("c", 0)).await.unwrap();
    assert_eq!(survivors(&read_all(&b, 0).await), latest(&appended));
    let stored: Vec<String> = store
        .list(&prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key.as_str().to_string())
        .collect();
    for original in &originals {
        assert!(
            !stored.contains(original),
            "replaced segment {original} is still stored: {stored:?}"
        );
    }
    // B adopted A's replacements instead of cleaning again from scratch.
    assert_eq!(
        cleaned_keys(store.list(&prefix).await.unwrap()),
        written_by_a
    );
}

// Transactions (Kafka's `CleanedTransactionMetadata`): aborted data goes, committed
// transactional values are compacted like any other, nothing at or past the last stable
// offset is touched, markers outlive their data by delete.retention.ms.

const MARKER_TIMEOUT: Duration = Duration::from_secs(10);

/// `keyed` with the transactional attribute bit set (CRC recomputed).
fn txn_keyed(records: &[(Option<&str>, Option<&str>)], producer: (i64, i16, i32)) -> Bytes {
    let mut b = BytesMut::from(&keyed(records, 0, Some(producer))[..]);
    b[22] |= 0x10;
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

async fn txn_marker(log: &LogManager, pid: i64, commit: bool) -> i64 {
    log.write_txn_marker(&tp("c", 0), pid, 0, 0, commit, MARKER_TIMEOUT)
        .await
        .unwrap()
        .0
}

async fn put(log: &LogManager, batch: Bytes) -> i64 {
    log.append(&tp("c", 0), batch, DURABLE)
        .await
        .unwrap()
        .base_offset
        .0
}

/// What a consumer sees from offset 0: (offset, key, value) of the data records, and the
/// offsets of the control batches. read_committed applies the aborted list as Kafka's
/// consumers do: a producer listed from its first offset has its transactional batches
/// skipped until its abort marker.
struct Seen {
    records: Vec<(i64, String, String)>,
    markers: Vec<i64>,
}

async fn consume(log: &LogManager, isolation: crate::Isolation) -> Seen {
    let mut seen = Seen {
        records: Vec::new(),
        markers: Vec::new(),
    };
    let mut at = 0;
    let mut aborting = std::collections::BTreeSet::new();
    loop {
        let read = log
            .read_isolated(&tp("c", 0), Offset(at), 1 << 20, true, isolation)
            .await
            .unwrap();
        if read.batches.is_empty() {
            return seen;
        }
        let mut listed = read.aborted.clone().unwrap_or_default();
        listed.sort_by_key(|(_, first)| *first);
        for b in &read.batches {
            let view = strata_wire::split_batches(b).unwrap().remove(0);
            let h = *view.header();
            for (pid, first) in &listed {
                if *first <= h.last_offset() {
                    aborting.insert(*pid);
                }
            }
            listed.retain(|(_, first)| *first > h.last_offset());
            at = h.last_offset() + 1;
            if h.is_control() {
                seen.markers.push(h.base_offset);
                let marker = strata_wire::builder::read_txn_marker(b);
                if marker.is_some_and(|m| !m.commit) {
                    aborting.remove(&h.producer_id);
                }
                continue;
            }
            if h.is_transactional() && aborting.contains(&h.producer_id) {
                continue;
            }
            for (offset, r) in strata_wire::builder::read_records(b).unwrap() {
                let text = |f: Option<Bytes>| String::from_utf8(f.unwrap().to_vec()).unwrap();
                seen.records.push((offset, text(r.key), text(r.value)));
            }
        }
    }
}

fn values(seen: &Seen) -> Vec<(i64, &str, &str)> {
    seen.records
        .iter()
        .map(|(o, k, v)| (*o, k.as_str(), v.as_str()))
        .collect()
}

#[tokio::test]
async fn aborted_data_is_removed_and_committed_transactional_values_are_compacted_like_any() {
    use crate::Isolation::{ReadCommitted, ReadUncommitted};
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open_with_clock(&store, SystemClock::shared(), manual_config()).await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let (a, _) = log.init_producer_id().await.unwrap();
    let (b, _) = log.init_producer_id().await.unwrap();
    assert_eq!(
        put(&log, keyed(&[(Some("k"), Some("plain"))], 0, None)).await,
        0
    );
    assert_eq!(
        put(
            &log,
            txn_keyed(&[(Some("k"), Some("committed"))], (a, 0, 0))
        )
        .await,
        1
    );
    assert_eq!(txn_marker(&log, a, true).await, 2);
    assert_eq!(
        put(
            &log,
            txn_keyed(
                &[(Some("k"), Some("aborted")), (Some("j"), Some("aborted"))],
                (b, 0, 0)
            )
        )
        .await,
        3
    );
    assert_eq!(txn_marker(&log, b, false).await, 5);
    assert_eq!(
        put(&log, keyed(&[(Some("j"), Some("plain"))], 0, None)).await,
        6
    );
    let committed_before = consume(&log, ReadCommitted).await;
    assert_eq!(
        values(&committed_before),
        vec![(0, "k", "plain"), (1, "k", "committed"), (6, "j", "plain")]
    );
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());

    // The committed value superseded the plain one; the aborted batch is gone, its marker
    // stays for now (this pass removed its data), and so does its aborted range.
    let expect = vec![(1, "k", "committed"), (6, "j", "plain")];
    let committed = consume(&log, ReadCommitted).await;
    assert_eq!(values(&committed), expect);
    assert_eq!(committed.markers, vec![2, 5]);
    assert_eq!(values(&consume(&log, ReadUncommitted).await), expect);
    let read = log
        .read_isolated(&tp("c", 0), Offset(0), 1 << 20, true, ReadCommitted)
        .await
        .unwrap();
    assert_eq!(read.aborted, Some(vec![(b, 3)]));

    // A later plain value supersedes the committed one in turn.
    assert_eq!(
        put(&log, keyed(&[(Some("k"), Some("newest"))], 0, None)).await,
        7
    );
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    assert_eq!(
        values(&consume(&log, ReadCommitted).await),
        vec![(6, "j", "plain"), (7, "k", "newest")]
    );
}

#[tokio::test]
async fn nothing_at_or_past_the_last_stable_offset_is_cleaned() {
    use crate::Isolation::ReadUncommitted;
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open_with_clock(&store, SystemClock::shared(), manual_config()).await;
    log.create_topic("c", Some(1), compact_topic(&[]), false)
        .await
        .unwrap();
    let (a, _) = log.init_producer_id().await.unwrap();
    put(
        &log,
        keyed(&[(Some("k"), Some("v0")), (Some("x"), Some("x0"))], 0, None),
    )
    .await;
    log.compact_now(&tp("c", 0)).await.unwrap();
    // A transaction opens at 2 and stays open across the next segment.
    assert_eq!(
        put(&log, txn_keyed(&[(Some("k"), Some("open"))], (a, 0, 0))).await,
        2
    );
    put(
        &log,
        keyed(&[(Some("k"), Some("v3")), (Some("x"), Some("x4"))], 0, None),
    )
    .await;
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert_eq!(log.watermarks(&tp("c", 0)).unwrap().last_stable.0, 2);
    // Only the first segment is below the last stable offset, and nothing in it is
    // superseded by anything mapped; the rest waits for the transaction.
    log.clean_now(&tp("c", 0)).await.unwrap();
    let all = vec![
        (0, "k", "v0"),
        (1, "x", "x0"),
        (2, "k", "open"),
        (3, "k", "v3"),
        (4, "x", "x4"),
    ];
    assert_eq!(values(&consume(&log, ReadUncommitted).await), all);
    // Once it commits, the next pass covers everything.
    assert_eq!(txn_marker(&log, a, true).await, 5);
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    assert_eq!(
        values(&consume(&log, ReadUncommitted).await),
        vec![(3, "k", "v3"), (4, "x", "x4")]
    );
}

#[tokio::test]
async fn markers_outlive_their_data_by_delete_retention_ms_and_the_aborted_range_goes_first() {
    use crate::Isolation::ReadCommitted;
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let log = open_with_clock(&store, clock.clone(), manual_config()).await;
    log.create_topic(
        "c",
        Some(1),
        compact_topic(&[("delete.retention.ms", "1000")]),
        false,
    )
    .await
    .unwrap();
    let (a, _) = log.init_producer_id().await.unwrap();
    let (b, _) = log.init_producer_id().await.unwrap();
    // 0-1: a's aborted transaction, then an idempotent batch of a at 2 (a producer's last
    // batch stays, empty, and would keep its transaction's marker, as in Kafka). 3-4 and 5-6:
    // b's committed transactions, the second superseding the first.
    assert_eq!(
        put(&log, txn_keyed(&[(Some("k"), Some("aborted"))], (a, 0, 0))).await,
        0
    );
    assert_eq!(txn_marker(&log, a, false).await, 1);
    assert_eq!(
        put(&log, keyed(&[(Some("i"), Some("x"))], 0, Some((a, 0, 1)))).await,
        2
    );
    assert_eq!(
        put(&log, txn_keyed(&[(Some("j"), Some("w1"))], (b, 0, 0))).await,
        3
    );
    assert_eq!(txn_marker(&log, b, true).await, 4);
    assert_eq!(
        put(&log, txn_keyed(&[(Some("j"), Some("w2"))], (b, 0, 1))).await,
        5
    );
    assert_eq!(txn_marker(&log, b, true).await, 6);
    let mut next_key = 0;
    let mut pass = |log: Arc<LogManager>| {
        next_key += 1;
        let key = format!("z{next_key}");
        async move {
            put(&log, keyed(&[(Some(&key), Some("z"))], 0, None)).await;
            log.compact_now(&tp("c", 0)).await.unwrap();
            assert!(log.clean_now(&tp("c", 0)).await.unwrap());
            let seen = consume(&log, ReadCommitted).await;
            let aborted = log
                .read_isolated(&tp("c", 0), Offset(0), 1 << 20, true, ReadCommitted)
                .await
                .unwrap()
                .aborted
                .unwrap();
            (seen.markers, aborted)
        }
    };
    // First pass: the aborted batch and the superseded committed one go; their markers stay,
    // as this pass still read their data.
    assert_eq!(pass(log.clone()).await, (vec![1, 4, 6], vec![(a, 0)]));
    // Second pass: no data left of a's transaction or b's first: the aborted range is
    // forgotten, and both markers get a delete horizon of delete.retention.ms.
    clock.advance(Duration::from_millis(100));
    assert_eq!(pass(log.clone()).await, (vec![1, 4, 6], vec![]));
    clock.advance(Duration::from_millis(900));
    assert_eq!(
        pass(log.clone()).await,
        (vec![1, 4, 6], vec![]),
        "900ms: kept"
    );
    clock.advance(Duration::from_millis(200));
    assert_eq!(pass(log.clone()).await, (vec![6], vec![]));
    // Still so after a restart (the manifest forgot the range too), and the idempotent
    // state of both producers survived: their next sequences are accepted.
    log.shutdown().await.unwrap();
    let log = open_with_clock(&store, clock.clone(), manual_config()).await;
    let read = log
        .read_isolated(&tp("c", 0), Offset(0), 1 << 20, true, ReadCommitted)
        .await
        .unwrap();
    assert_eq!(read.aborted, Some(vec![]));
    assert_eq!(
        values(&consume(&log, ReadCommitted).await),
        vec![
            (2, "i", "x"),
            (5, "j", "w2"),
            (7, "z1", "z"),
            (8, "z2", "z"),
            (9, "z3", "z"),
            (10, "z4", "z")
        ]
    );
    // Retries of the producers' last batches are recognised, and their next sequences taken.
    assert_eq!(
        put(&log, keyed(&[(Some("i"), Some("x"))], 0, Some((a, 0, 1)))).await,
        2
    );
    assert_eq!(
        put(&log, txn_keyed(&[(Some("j"), Some("w2"))], (b, 0, 1))).await,
        5
    );
    assert_eq!(
        put(&log, txn_keyed(&[(Some("k"), Some("again"))], (a, 0, 2))).await,
        11
    );
    assert_eq!(
        put(&log, txn_keyed(&[(Some("j"), Some("w3"))], (b, 0, 2))).await,
        12
    );
}

/// Segment objects of the test's partition in `store`.
async fn segment_objects(store: &Arc<dyn ObjectStore>) -> usize {
    store
        .list("log/")
        .await
        .unwrap()
        .iter()
        .filter(|m| m.key.as_str().contains("/seg/"))
        .count()
}

/// Each compaction of a slowly written compacted topic leaves a small segment; the cleaner
/// merges adjacent ones (up to `segment_bytes`) once nothing in them has a tombstone clock
/// still running, so the object count stops growing with the partition's age, and every
/// latest value reads back at its offset.
#[tokio::test]
async fn adjacent_small_segments_are_merged_once_their_tombstones_have_expired() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let log = open_with_clock(&store, clock.clone(), manual_config()).await;
    log.create_topic(
        "c",
        Some(1),
        compact_topic(&[("delete.retention.ms", "1000")]),
        false,
    )
    .await
    .unwrap();
    let put = |key: String, value: Option<String>| {
        let log = log.clone();
        async move {
            let o = log
                .append(
                    &tp("c", 0),
                    keyed(&[(Some(&key), value.as_deref())], 0, None),
                    DURABLE,
                )
                .await
                .unwrap()
                .base_offset
                .0;
            (o, key, value.is_none())
        }
    };
    let mut appended = Vec::new();
    for i in 0..20 {
        appended.push(put(format!("k{i}"), Some(format!("v{i}"))).await);
        if i == 10 {
            // A tombstone among them: its segment is merged only once it is gone.
            appended.push(put("k3".to_string(), None).await);
        }
        log.compact_now(&tp("c", 0)).await.unwrap();
    }
    assert_eq!(segment_objects(&store).await, 20);
    // The first pass maps them all and starts their clocks: nothing merged yet.
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    let after_first = segment_objects(&store).await;
    assert!(
        after_first >= 19,
        "{after_first} segments after the first pass"
    );
    // A pass needs dirty data; one more update, after delete.retention.ms.
    clock.advance(Duration::from_millis(1_500));
    appended.push(put("k20".to_string(), Some("v20".to_string())).await);
    log.compact_now(&tp("c", 0)).await.unwrap();
    assert!(log.clean_now(&tp("c", 0)).await.unwrap());
    // The 20 old ones are one segment now; the newest, whose clock just started, is apart.
    assert_eq!(segment_objects(&store).await, 2);
    let expected: BTreeMap<String, (i64, bool)> = latest(&appended)
        .into_iter()
        .filter(|(_, (_, tombstone))| !tombstone)
        .collect();
    assert_eq!(survivors(&read_all(&log, 0).await), expected);
    // And again after a restart, through the index alone.
    drop(log);
    let log = open_with_clock(&store, clock.clone(), manual_config()).await;
    assert_eq!(survivors(&read_all(&log, 0).await), expected);
}

/// A deposed owner's merging pass: A, paused after cleaning once, resumes after B took the
/// partition over and runs a pass that merges its small segments. The merged segment is
/// create-only under A's claim, so it collides with nothing of B's; A's intent fails on the
/// manifest, B reads every latest value, merges on its own and collects A's orphan.
#[tokio::test]
async fn a_deposed_owners_merge_fails_at_its_manifest_and_leaves_only_an_orphan() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    // Tombstone clocks expire at once, so A's second pass merges.
    a.create_topic(
        "c",
        Some(1),
        compact_topic(&[("delete.retention.ms", "0")]),
        false,
    )
    .await
    .unwrap();
    for (tp_, r) in a.acquire(vec![("c".into(), 0, 1)]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("{tp_}: {e}"));
    }
    let mut appended = Vec::new();
    for i in 0..6 {
        let key = format!("m{i}");
        let o = a
            .append(
                &tp("c", 0),
                keyed(&[(Some(&key), Some("v"))], 0, None),
                DURABLE,
            )
            .await
            .unwrap()
            .base_offset
            .0;
        appended.push((o, key, false));
        a.compact_now(&tp("c", 0)).await.unwrap();
    }
    assert!(a.clean_now(&tp("c", 0)).await.unwrap());
    let o = a
        .append(
            &tp("c", 0),
            keyed(&[(Some("m6"), Some("v"))], 0, None),
            DURABLE,
        )
        .await
        .unwrap()
        .base_offset
        .0;
    appended.push((o, "m6".to_string(), false));
    a.compact_now(&tp("c", 0)).await.unwrap();
    // B takes over while A is paused; A then runs the pass that would merge.
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    for (tp_, r) in b.acquire(vec![("c".into(), 0, 2)]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("{tp_}: {e}"));
    }
    let before = segment_objects(&store).await;
    assert!(matches!(
        a.clean_now(&tp("c", 0)).await,
        Err(LogError::Fenced) | Ok(false)
    ));
    assert!(
        segment_objects(&store).await > before,
        "A's merging pass wrote its merged segment before failing"
    );
    assert_eq!(survivors(&read_all(&b, 0).await), latest(&appended));
    // B merges on its own, and its collector removes A's orphan.
    let o = b
        .append(
            &tp("c", 0),
            keyed(&[(Some("m7"), Some("v"))], 0, None),
            DURABLE,
        )
        .await
        .unwrap()
        .base_offset
        .0;
    appended.push((o, "m7".to_string(), false));
    b.compact_now(&tp("c", 0)).await.unwrap();
    assert!(b.clean_now(&tp("c", 0)).await.unwrap());
    b.collect_garbage().await.unwrap();
    assert_eq!(survivors(&read_all(&b, 0).await), latest(&appended));
    assert!(
        segment_objects(&store).await <= 3,
        "B's pass merged and A's orphan is gone: {} segments",
        segment_objects(&store).await
    );
}
