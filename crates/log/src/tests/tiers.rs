//! Tiered storage (`wal_storage`): the log runs on a `TieredStore` routed by the layout, so
//! compaction must put segments and index chunks on the bulk tier and leave write-ahead
//! objects, manifests and the catalog on the write-ahead tier; recovery, takeover and garbage
//! collection must see both tiers; and a bulk tier that is down must not stop acknowledgements.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_core::Offset;
use strata_storage::{
    FaultConfig, FaultInjectingStore, MemoryStore, ObjectStore, PutMode, TieredStore,
};

use super::{acquire_one, base_offsets, batch, config, open, open_managed, tp, DURABLE};
use crate::{LogConfig, LogError};

struct Tiers {
    wal: Arc<MemoryStore>,
    bulk: Arc<FaultInjectingStore>,
    store: Arc<dyn ObjectStore>,
}

fn tiers() -> Tiers {
    let wal = Arc::new(MemoryStore::new());
    let bulk = Arc::new(FaultInjectingStore::new(
        Arc::new(MemoryStore::new()),
        FaultConfig::none(),
        7,
    ));
    let store = Arc::new(TieredStore::new(
        wal.clone(),
        bulk.clone(),
        strata_layout::tier::ROUTING,
    ));
    Tiers { wal, bulk, store }
}

async fn keys(store: &dyn ObjectStore) -> Vec<String> {
    store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key.as_str().to_string())
        .collect()
}

fn is_compacted_data(key: &str) -> bool {
    key.starts_with("log/") && (key.contains("/seg/") || key.contains("/index/"))
}

/// Small segments, so one compaction writes several.
fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes: 300,
        ..config()
    }
}

#[tokio::test]
async fn compaction_writes_segments_to_the_bulk_tier_and_recovery_reads_both() {
    let t = tiers();
    let log = open(&t.store, small_segments()).await;
    log.create_topic("t", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..20 {
        log.append(
            &tp("t", (i % 2) as i32),
            batch(&["a", "b"], i, None),
            DURABLE,
        )
        .await
        .unwrap();
    }
    log.compact_now(&tp("t", 0)).await.unwrap();
    log.compact_now(&tp("t", 1)).await.unwrap();

    let bulk = keys(t.bulk.as_ref()).await;
    let wal = keys(t.wal.as_ref()).await;
    let segments = bulk.iter().filter(|k| k.contains("/seg/")).count();
    assert!(segments >= 4, "several segments per partition: {bulk:?}");
    assert!(bulk.iter().any(|k| k.contains("/index/")), "{bulk:?}");
    assert!(bulk.iter().all(|k| is_compacted_data(k)), "{bulk:?}");
    assert!(wal.iter().all(|k| !is_compacted_data(k)), "{wal:?}");
    assert!(wal.iter().any(|k| k.starts_with("wal/")), "{wal:?}");
    assert!(wal.iter().any(|k| k.ends_with("/manifest")), "{wal:?}");
    assert!(
        wal.iter().any(|k| k.starts_with("meta/catalog/")),
        "{wal:?}"
    );

    // More data after the compacted part, then a crash: the restart reads the segments from
    // the bulk tier and replays the rest from the write-ahead tier.
    log.append(&tp("t", 0), batch(&["late"], 99, None), DURABLE)
        .await
        .unwrap();
    log.abort_for_test();
    let log = open(&t.store, small_segments()).await;
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..=10).map(|i| i * 2).collect::<Vec<_>>()
    );
    assert_eq!(
        base_offsets(&log, &tp("t", 1), 0).await,
        (0..10).map(|i| i * 2).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_takeover_reads_the_old_owners_segments_and_tail_across_both_tiers() {
    let t = tiers();
    let a = open_managed(&t.store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire_one(&a, "t", 0, 1).await;
    for i in 0..6 {
        a.append(&tp("t", 0), batch(&["a", "b"], i, None), DURABLE)
            .await
            .unwrap();
    }
    a.compact_now(&tp("t", 0)).await.unwrap();
    for i in 6..9 {
        a.append(&tp("t", 0), batch(&["c"], i, None), DURABLE)
            .await
            .unwrap();
    }
    // B takes over without A's help: compacted data on the bulk tier, A's uncompacted tail
    // in A's stream on the write-ahead tier.
    let b = open_managed(&t.store, 2).await;
    acquire_one(&b, "t", 0, 2).await;
    assert_eq!(b.watermarks(&tp("t", 0)).unwrap().high, Offset(15));
    assert_eq!(
        base_offsets(&b, &tp("t", 0), 0).await,
        vec![0, 2, 4, 6, 8, 10, 12, 13, 14]
    );
    assert!(a
        .append(&tp("t", 0), batch(&["late"], 0, None), DURABLE)
        .await
        .is_err());
}

#[tokio::test]
async fn the_collector_deletes_garbage_on_both_tiers() {
    let t = tiers();
    let log = open(&t.store, config()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..6 {
        log.append(&tp("t", 0), batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.abort_for_test();
    // The restart replays and compacts the crashed stream: its write-ahead objects (on the
    // write-ahead tier) become garbage.
    let log = open(&t.store, config()).await;
    let wal_before = t.wal.list("wal/").await.unwrap().len();
    assert!(wal_before > 1);
    // An orphan segment on the bulk tier (a compaction whose manifest update never landed).
    let orphan = strata_storage::ObjectKey::new(strata_layout::partition::segment_key(
        log.topic("t").unwrap().id,
        0,
        0,
        0xdead,
    ))
    .unwrap();
    t.store
        .put(&orphan, Bytes::from_static(b"junk"), PutMode::Create)
        .await
        .unwrap();
    assert!(t.bulk.get(&orphan).await.is_ok(), "routed to the bulk tier");
    let deleted = log.collect_garbage().await.unwrap();
    assert_eq!(
        t.wal.list("wal/").await.unwrap().len(),
        1,
        "the seal is kept"
    );
    assert_eq!(
        deleted,
        wal_before - 1 + 1,
        "write-ahead garbage and the orphan"
    );
    assert!(t.bulk.get(&orphan).await.unwrap_err().is_not_found());
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..6).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn acknowledgements_continue_while_the_bulk_tier_is_down_and_compaction_catches_up() {
    let t = tiers();
    let log = open(&t.store, small_segments()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..4 {
        log.append(&tp("t", 0), batch(&["a", "b"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.compact_now(&tp("t", 0)).await.unwrap();

    t.bulk.set_outage(true);
    for i in 4..10 {
        log.append(&tp("t", 0), batch(&["c", "d"], i, None), DURABLE)
            .await
            .unwrap();
    }
    // Compaction fails (and would be retried at the next tick); nothing acknowledged is lost
    // and the tail still reads from the write-ahead tier.
    assert!(log.compact_now(&tp("t", 0)).await.is_err());
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().high, Offset(20));
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 8).await,
        vec![8, 10, 12, 14, 16, 18]
    );

    t.bulk.set_outage(false);
    log.compact_now(&tp("t", 0)).await.unwrap();
    log.abort_for_test();
    let log = open(&t.store, small_segments()).await;
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..10).map(|i| i * 2).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn compacted_data_is_read_while_the_write_ahead_tier_is_down() {
    let wal = Arc::new(FaultInjectingStore::new(
        Arc::new(MemoryStore::new()),
        FaultConfig::none(),
        3,
    ));
    let bulk = Arc::new(MemoryStore::new());
    let store: Arc<dyn ObjectStore> = Arc::new(TieredStore::new(
        wal.clone(),
        bulk,
        strata_layout::tier::ROUTING,
    ));
    let log = open(&store, small_segments()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    for i in 0..8 {
        log.append(&tp("t", 0), batch(&["a", "b"], i, None), DURABLE)
            .await
            .unwrap();
    }
    log.compact_now(&tp("t", 0)).await.unwrap();
    log.shutdown().await.unwrap();
    // A fresh broker: nothing of the partition cached.
    let log = open(&store, small_segments()).await;

    wal.set_outage(true);
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..8).map(|i| i * 2).collect::<Vec<_>>()
    );
    let short = crate::Acks::Durable {
        timeout: std::time::Duration::from_millis(200),
    };
    assert!(log
        .append(&tp("t", 0), batch(&["x"], 0, None), short)
        .await
        .is_err());
}

#[tokio::test]
async fn a_bulk_outage_fills_the_bounded_tail_then_refuses_produce_until_compaction_catches_up() {
    let t = tiers();
    let bound = LogConfig {
        max_uncompacted_batches: 3,
        max_uncompacted_bytes: 1 << 20,
        ..small_segments()
    };
    let log = open(&t.store, bound.clone()).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    t.bulk.set_outage(true);
    for i in 0..3 {
        log.append(&tp("t", 0), batch(&["a"], i, None), DURABLE)
            .await
            .unwrap();
    }
    assert!(log.compact_now(&tp("t", 0)).await.is_err());
    let refused = log
        .append(&tp("t", 0), batch(&["b"], 3, None), DURABLE)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LogError::CompactionBehind { batches: 3, .. }),
        "{refused}"
    );
    assert!(refused.is_retryable());
    assert_eq!(log.watermarks(&tp("t", 0)).unwrap().high, Offset(3));

    t.bulk.set_outage(false);
    log.compact_now(&tp("t", 0)).await.unwrap();
    log.append(&tp("t", 0), batch(&["b"], 3, None), DURABLE)
        .await
        .unwrap();
    assert_eq!(
        base_offsets(&log, &tp("t", 0), 0).await,
        (0..4).collect::<Vec<_>>()
    );

    // The byte bound alone refuses too.
    let bytes = LogConfig {
        max_uncompacted_batches: 1_000,
        max_uncompacted_bytes: 1,
        ..small_segments()
    };
    log.abort_for_test();
    let log = open(&t.store, bytes).await;
    t.bulk.set_outage(true);
    log.append(&tp("t", 0), batch(&["c"], 4, None), DURABLE)
        .await
        .unwrap();
    assert!(matches!(
        log.append(&tp("t", 0), batch(&["d"], 5, None), DURABLE)
            .await
            .unwrap_err(),
        LogError::CompactionBehind { batches: 1, .. }
    ));
}

// ---- local.retention.*: compacted segments held on the fast tier, then moved ----

use strata_core::clock::{Clock, ManualClock};

fn is_fast_segment(key: &str) -> bool {
    key.starts_with("log/") && key.contains("/hot/")
}

/// A tiered log on a manual clock: nothing runs on a timer unless the test advances it.
fn tiered_config() -> LogConfig {
    LogConfig {
        tiered: true,
        // Every append is written at once: the writer's timer never fires on a manual clock.
        flush_bytes: 1,
        cleaner_threads: 0,
        segment_bytes: 300,
        ..config()
    }
}

async fn open_tiered(
    store: &Arc<dyn ObjectStore>,
    clock: Arc<ManualClock>,
) -> Arc<crate::LogManager> {
    crate::LogManager::open(
        store.clone(),
        clock as Arc<dyn Clock>,
        tiered_config(),
        strata_core::BrokerId(0),
    )
    .await
    .unwrap()
}

fn topic_configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Two tiers, a tiered log on a manual clock, and topic "hot" (one partition) created with
/// the one config `held`.
async fn with_held_topic(held: (&str, &str)) -> (Tiers, Arc<ManualClock>, Arc<crate::LogManager>) {
    let t = tiers();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let log = open_tiered(&t.store, clock.clone()).await;
    log.create_topic("hot", Some(1), topic_configs(&[held]), false)
        .await
        .unwrap();
    (t, clock, log)
}

/// `count` batches of two records to `topic`'s partition 0, timestamped at the clock's start.
async fn append_batches(log: &crate::LogManager, topic: &str, count: i64) {
    for i in 0..count {
        log.append(
            &tp(topic, 0),
            batch(&["a", "b"], 1_000_000 + i, None),
            DURABLE,
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn local_retention_ms_keeps_segments_on_the_fast_tier_then_moves_them_to_the_bulk_tier() {
    let (t, clock, log) = with_held_topic(("local.retention.ms", "60000")).await;
    // A topic that asks for nothing goes straight to the bulk tier, as before.
    log.create_topic("cold", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    append_batches(&log, "hot", 12).await;
    append_batches(&log, "cold", 12).await;
    log.compact_now(&tp("hot", 0)).await.unwrap();
    log.compact_now(&tp("cold", 0)).await.unwrap();
    let hot_id = log.topic("hot").unwrap().id.to_string();
    let cold_id = log.topic("cold").unwrap().id.to_string();
    let wal = keys(t.wal.as_ref()).await;
    let bulk = keys(t.bulk.as_ref()).await;
    let fast: Vec<&String> = wal.iter().filter(|k| is_fast_segment(k)).collect();
    assert!(
        fast.len() >= 3,
        "several segments on the fast tier: {wal:?}"
    );
    assert!(fast.iter().all(|k| k.contains(&hot_id)), "{fast:?}");
    assert!(
        !bulk
            .iter()
            .any(|k| k.contains(&hot_id) && k.contains("/seg/")),
        "no segment of the held topic on the bulk tier yet: {bulk:?}"
    );
    assert!(bulk
        .iter()
        .any(|k| k.contains(&cold_id) && k.contains("/seg/")));
    // Index chunks stay on the bulk tier whichever tier their segments are on.
    assert!(bulk
        .iter()
        .any(|k| k.contains(&hot_id) && k.contains("/index/")));
    let offsets: Vec<i64> = (0..12).map(|i| i * 2).collect();
    assert_eq!(base_offsets(&log, &tp("hot", 0), 0).await, offsets);
    let stats = log.tiering_stats();
    assert_eq!(stats.fast_segments, fast.len() as u64);
    assert!(stats.fast_bytes > 0);

    // Not yet due: nothing moves.
    assert_eq!(log.tier_down_now(&tp("hot", 0)).await.unwrap(), 0);
    clock.advance(std::time::Duration::from_secs(61));
    let moved = log.tier_down_now(&tp("hot", 0)).await.unwrap();
    assert_eq!(moved, fast.len());
    let wal = keys(t.wal.as_ref()).await;
    let bulk = keys(t.bulk.as_ref()).await;
    assert!(!wal.iter().any(|k| is_fast_segment(k)), "{wal:?}");
    assert_eq!(
        bulk.iter()
            .filter(|k| k.contains(&hot_id) && k.contains("/seg/"))
            .count(),
        fast.len()
    );
    assert_eq!(base_offsets(&log, &tp("hot", 0), 0).await, offsets);
    let stats = log.tiering_stats();
    assert_eq!(
        (stats.segments_moved, stats.fast_segments),
        (moved as u64, 0)
    );
    // The collector finds nothing left over on either tier, and a restart reads the moved
    // segments through the rewritten index.
    log.collect_garbage().await.unwrap();
    assert_eq!(
        keys(t.bulk.as_ref())
            .await
            .iter()
            .filter(|k| k.contains(&hot_id) && k.contains("/seg/"))
            .count(),
        fast.len()
    );
    log.abort_for_test();
    let log = open_tiered(&t.store, clock.clone()).await;
    assert_eq!(base_offsets(&log, &tp("hot", 0), 0).await, offsets);
}

#[tokio::test]
async fn local_retention_bytes_moves_the_oldest_segments_beyond_the_bound() {
    let (t, _clock, log) = with_held_topic(("local.retention.bytes", "700")).await;
    append_batches(&log, "hot", 30).await;
    log.compact_now(&tp("hot", 0)).await.unwrap();
    let before = log.tiering_stats();
    assert!(before.fast_bytes > 700, "{before:?}");
    let moved = log.tier_down_now(&tp("hot", 0)).await.unwrap();
    assert!(moved > 0);
    let after = log.tiering_stats();
    assert!(
        after.fast_bytes <= 700 && after.fast_segments > 0,
        "{after:?}"
    );
    // The oldest went: every segment left on the fast tier starts after every moved one.
    let manifest = log
        .partition(&tp("hot", 0))
        .unwrap()
        .lock()
        .manifest
        .clone();
    let last_bulk = manifest
        .segments
        .iter()
        .filter(|s| !s.segment.fast)
        .map(|s| s.last_offset)
        .max()
        .unwrap();
    assert!(manifest
        .segments
        .iter()
        .filter(|s| s.segment.fast)
        .all(|s| s.segment.base_offset > last_bulk));
    assert_eq!(
        base_offsets(&log, &tp("hot", 0), 0).await,
        (0..30).map(|i| i * 2).collect::<Vec<_>>()
    );
    // Lifting the stay (back to the default) moves the rest.
    log.set_topic_configs("hot", BTreeMap::new(), false)
        .await
        .unwrap();
    log.tier_down_now(&tp("hot", 0)).await.unwrap();
    assert_eq!(log.tiering_stats().fast_segments, 0);
    assert!(!keys(t.wal.as_ref())
        .await
        .iter()
        .any(|k| is_fast_segment(k)));
}

#[tokio::test]
async fn a_deposed_owner_cannot_move_segments_and_its_copies_are_collected_by_the_successor() {
    let t = tiers();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let open_as = |broker: i32| {
        let store = t.store.clone();
        let clock = clock.clone();
        async move {
            crate::LogManager::open_with(
                store,
                clock as Arc<dyn Clock>,
                tiered_config(),
                strata_core::BrokerId(broker),
                crate::Ownership::Managed,
            )
            .await
            .unwrap()
        }
    };
    let a = open_as(1).await;
    a.create_topic(
        "hot",
        Some(1),
        topic_configs(&[("local.retention.ms", "1000")]),
        false,
    )
    .await
    .unwrap();
    acquire_one(&a, "hot", 0, 1).await;
    append_batches(&a, "hot", 10).await;
    a.compact_now(&tp("hot", 0)).await.unwrap();
    let fast_before: Vec<String> = keys(t.wal.as_ref())
        .await
        .into_iter()
        .filter(|k| is_fast_segment(k))
        .collect();
    assert!(!fast_before.is_empty());
    // B takes over while A is paused; then A, unaware, tries to move its segments.
    let b = open_as(2).await;
    acquire_one(&b, "hot", 0, 2).await;
    clock.advance(std::time::Duration::from_secs(2));
    let late = a.tier_down_now(&tp("hot", 0)).await;
    assert!(!matches!(late, Ok(n) if n > 0), "{late:?}");
    // A's copies are orphans on the bulk tier; B's index and manifest still name the
    // fast-tier originals, which are all still there.
    let wal_now: Vec<String> = keys(t.wal.as_ref())
        .await
        .into_iter()
        .filter(|k| is_fast_segment(k))
        .collect();
    assert_eq!(wal_now, fast_before);
    assert_eq!(
        base_offsets(&b, &tp("hot", 0), 0).await,
        (0..10).map(|i| i * 2).collect::<Vec<_>>()
    );
    // B moves them itself, and its collector deletes A's orphan copies (an older claim).
    let moved = b.tier_down_now(&tp("hot", 0)).await.unwrap();
    assert_eq!(moved, fast_before.len());
    b.collect_garbage().await.unwrap();
    let bulk_segments = keys(t.bulk.as_ref())
        .await
        .into_iter()
        .filter(|k| k.contains("/seg/"))
        .count();
    assert_eq!(bulk_segments, fast_before.len(), "A's copies collected");
    assert!(!keys(t.wal.as_ref())
        .await
        .iter()
        .any(|k| is_fast_segment(k)));
    assert_eq!(
        base_offsets(&b, &tp("hot", 0), 0).await,
        (0..10).map(|i| i * 2).collect::<Vec<_>>()
    );
}
