//! A partition moved back and forth between two brokers many times: the storage work of each
//! handover and takeover must not grow with the number of earlier moves (issue 19, item 8:
//! `strata partitions move` went from ~400 ms to ~1.9 s after a few moves of one partition).
//! Counted in storage requests and bytes through the metrics wrapper, never in time.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_core::SystemClock;
use strata_storage::{MemoryStore, MetricsStore, ObjectStore, OpKind, StorageMetrics};

use super::{acquire_one, batch, open_managed, tp, DURABLE};
use crate::LogManager;

/// What one move cost: requests by kind, and bytes read and written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cost {
    requests: [u64; OpKind::COUNT],
    bytes_read: u64,
    bytes_written: u64,
}

fn cost(metrics: &StorageMetrics) -> Cost {
    let s = metrics.snapshot();
    Cost {
        requests: OpKind::ALL.map(|op| s.op(op).requests),
        bytes_read: OpKind::ALL.iter().map(|op| s.op(*op).bytes_out).sum(),
        bytes_written: OpKind::ALL.iter().map(|op| s.op(*op).bytes_in).sum(),
    }
}

fn minus(a: &Cost, b: &Cost) -> Cost {
    Cost {
        requests: std::array::from_fn(|i| a.requests[i] - b.requests[i]),
        bytes_read: a.bytes_read - b.bytes_read,
        bytes_written: a.bytes_written - b.bytes_written,
    }
}

/// What the handover and the takeover of one move cost the storage.
struct MoveCost {
    handover: Cost,
    takeover: Cost,
}

/// Write-ahead objects in storage.
async fn wal_objects(store: &Arc<dyn ObjectStore>) -> usize {
    store.list("wal/").await.unwrap().len()
}

/// Moves the partition `moves` times between two brokers, appending one index chunk's worth
/// of batches on each owner in between; returns what each handover and takeover cost.
async fn move_costs(moves: usize) -> Vec<MoveCost> {
    let metrics;
    let store: Arc<dyn ObjectStore> = {
        let wrapped = MetricsStore::new(Arc::new(MemoryStore::new()), SystemClock::shared());
        metrics = Arc::clone(wrapped.metrics());
        Arc::new(wrapped)
    };
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    let brokers: [&Arc<LogManager>; 2] = [&a, &b];
    acquire_one(&a, "t", 0, 1).await;
    let mut costs = Vec::new();
    for m in 0..moves {
        let (from, to) = (brokers[m % 2], brokers[(m + 1) % 2]);
        // As many batches as an index chunk spans (8 in the test config), so every move
        // writes exactly one chunk; each is its own write-ahead object.
        for i in 0..8 {
            from.append(&tp("t", 0), batch(&["v"], i, None), DURABLE)
                .await
                .unwrap();
        }
        let before = cost(&metrics);
        from.release(&tp("t", 0)).await.unwrap();
        let released = cost(&metrics);
        for (_, r) in to
            .acquire(vec![("t".into(), 0, m as u64 + 2)])
            .await
            .unwrap()
        {
            r.unwrap();
        }
        costs.push(MoveCost {
            handover: minus(&released, &before),
            takeover: minus(&cost(&metrics), &released),
        });
        // The handover's deletes finish in the background: every stream keeps only its newest
        // object. Waited for here so that they do not land in the next move's count.
        // Bounded in scheduler turns, not time: the deleting task runs on this same thread.
        let mut turns = 0;
        while wal_objects(&store).await > 2 {
            turns += 1;
            assert!(
                turns < 10_000,
                "the handover's write-ahead objects were never deleted"
            );
            tokio::task::yield_now().await;
        }
    }
    costs
}

/// The migration benchmark's handovers spent seconds deleting, one at a time, the write-ahead
/// objects their compaction freed, while the partition was being handed over (and the
/// refusing pass had that much more to do). A handover now makes no delete before it
/// returns, and its storage work is the same at the twentieth move as at the third.
#[tokio::test]
async fn a_handover_deletes_nothing_before_it_returns_and_costs_the_same_every_move() {
    let costs = move_costs(24).await;
    let deletes = OpKind::ALL
        .iter()
        .position(|op| *op == OpKind::Delete)
        .unwrap();
    for (i, c) in costs.iter().enumerate() {
        assert_eq!(
            c.handover.requests[deletes],
            0,
            "deletes during handover {}: {:?}",
            i + 1,
            c.handover
        );
    }
    // The first moves differ (first chunk writes, nothing cached yet); from then on every
    // move must cost what the third did.
    for (i, c) in costs.iter().enumerate().skip(2) {
        assert_eq!(
            c.handover.requests,
            costs[2].handover.requests,
            "handover {}",
            i + 1
        );
        assert_eq!(
            c.takeover.requests,
            costs[2].takeover.requests,
            "takeover {}",
            i + 1
        );
    }
}
