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

use super::{base_offsets, batch, config, open, open_managed, tp, DURABLE};
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
    for (_, r) in a.acquire(vec![("t".into(), 0, 1)]).await.unwrap() {
        r.unwrap();
    }
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
    for (_, r) in b.acquire(vec![("t".into(), 0, 2)]).await.unwrap() {
        r.unwrap();
    }
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
