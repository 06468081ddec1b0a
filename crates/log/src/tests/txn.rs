//! Transactions, the partition side: transactional appends and markers → last stable offset
//! and aborted index; read_committed reads; epoch and coordinator fencing; state rebuilt by a
//! restart (write-ahead replay), after compaction (the manifest's snapshot) and by a new
//! owner; the aborted-index bound; the cleaner never letting aborted data shadow a committed value.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use strata_core::Offset;
use strata_storage::{MemoryStore, ObjectStore};
use strata_wire::batch::BatchError;

use super::{acquire_one, batch, config, open, open_managed, tp, DURABLE};
use crate::{Isolation, LogConfig, LogError, LogManager};

const T: Duration = Duration::from_secs(10);

/// `batch` with the transactional attribute bit set (CRC recomputed).
fn txn_batch(values: &[&str], producer: (i64, i16, i32)) -> Bytes {
    let mut b = BytesMut::from(&batch(values, 1_000, Some(producer))[..]);
    b[22] |= 0x10;
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

async fn setup(store: &Arc<dyn ObjectStore>, config: LogConfig) -> Arc<LogManager> {
    let log = open(store, config).await;
    log.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    log
}

/// (base offsets of the batches, aborted list) of a read from `from`.
async fn read(
    log: &LogManager,
    from: i64,
    isolation: Isolation,
) -> (Vec<i64>, Option<Vec<(i64, i64)>>) {
    let out = log
        .read_isolated(&tp("t", 0), Offset(from), 1 << 20, true, isolation)
        .await
        .unwrap();
    let bases = out
        .batches
        .iter()
        .map(|b| i64::from_be_bytes(b[..8].try_into().unwrap()))
        .collect();
    (bases, out.aborted)
}

fn lso(log: &LogManager) -> i64 {
    log.watermarks(&tp("t", 0)).unwrap().last_stable.0
}

async fn marker(log: &LogManager, pid: i64, epoch: i16, commit: bool) -> i64 {
    log.write_txn_marker(&tp("t", 0), pid, epoch, 0, commit, T)
        .await
        .unwrap()
        .0
}

#[tokio::test]
async fn markers_move_the_last_stable_offset_and_aborts_fill_the_aborted_index() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = setup(&store, config()).await;
    let (pid, epoch) = log.init_producer_id().await.unwrap();
    let t = tp("t", 0);
    log.append(&t, txn_batch(&["a", "b"], (pid, epoch, 0)), DURABLE)
        .await
        .unwrap();
    log.append(&t, batch(&["plain"], 0, None), DURABLE)
        .await
        .unwrap();
    // Open at 0: read_committed sees nothing, read_uncommitted everything.
    assert_eq!((lso(&log), log.watermarks(&t).unwrap().high.0), (0, 3));
    assert_eq!(
        read(&log, 0, Isolation::ReadCommitted).await,
        (vec![], Some(vec![]))
    );
    assert_eq!(
        read(&log, 0, Isolation::ReadUncommitted).await,
        (vec![0, 2], None)
    );
    assert_eq!(log.producers(&t).unwrap()[0].current_txn_start_offset, 0);
    assert_eq!(marker(&log, pid, epoch, true).await, 3);
    assert_eq!(lso(&log), 4);
    assert_eq!(log.producers(&t).unwrap()[0].current_txn_start_offset, -1);
    assert_eq!(
        read(&log, 0, Isolation::ReadCommitted).await,
        (vec![0, 2, 3], Some(vec![]))
    );
    // A second transaction, aborted: listed for reads that overlap it, not for later ones.
    log.append(&t, txn_batch(&["c"], (pid, epoch, 2)), DURABLE)
        .await
        .unwrap();
    assert_eq!(lso(&log), 4);
    assert_eq!(marker(&log, pid, epoch, false).await, 5);
    assert_eq!(lso(&log), 6);
    assert_eq!(
        read(&log, 0, Isolation::ReadCommitted).await,
        (vec![0, 2, 3, 4, 5], Some(vec![(pid, 4)]))
    );
    assert_eq!(
        read(&log, 5, Isolation::ReadCommitted).await,
        (vec![5], Some(vec![(pid, 4)]))
    );
    log.append(&t, batch(&["after"], 0, None), DURABLE)
        .await
        .unwrap();
    assert_eq!(
        read(&log, 6, Isolation::ReadCommitted).await,
        (vec![6], Some(vec![]))
    );
    let stats = log.txn_stats();
    assert_eq!(
        (stats.ongoing, stats.commit_markers, stats.abort_markers),
        (0, 1, 1)
    );
}

#[tokio::test]
async fn interleaved_transactions_of_two_producers() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = setup(&store, config()).await;
    let t = tp("t", 0);
    let (a, _) = log.init_producer_id().await.unwrap();
    let (b, _) = log.init_producer_id().await.unwrap();
    log.append(&t, txn_batch(&["a0"], (a, 0, 0)), DURABLE)
        .await
        .unwrap();
    log.append(&t, txn_batch(&["b0"], (b, 0, 0)), DURABLE)
        .await
        .unwrap();
    log.append(&t, txn_batch(&["a1"], (a, 0, 1)), DURABLE)
        .await
        .unwrap();
    assert_eq!(log.txn_stats().ongoing, 2);
    assert_eq!(marker(&log, a, 0, true).await, 3);
    // B's transaction, open since 1, holds the last stable offset back.
    assert_eq!(lso(&log), 1);
    assert_eq!(
        read(&log, 0, Isolation::ReadCommitted).await,
        (vec![0], Some(vec![]))
    );
    assert_eq!(marker(&log, b, 0, false).await, 4);
    assert_eq!(lso(&log), 5);
    assert_eq!(
        read(&log, 0, Isolation::ReadCommitted).await,
        (vec![0, 1, 2, 3, 4], Some(vec![(b, 1)]))
    );
    // A fetch from 2 still overlaps B's aborted range [1, 4].
    assert_eq!(
        read(&log, 2, Isolation::ReadCommitted).await,
        (vec![2, 3, 4], Some(vec![(b, 1)]))
    );
    assert_eq!(log.txn_stats().ongoing, 0);
}

#[tokio::test]
async fn epochs_fence_data_and_markers_and_clients_cannot_write_markers() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = setup(&store, config()).await;
    let t = tp("t", 0);
    let (pid, _) = log.init_producer_id().await.unwrap();
    log.append(&t, txn_batch(&["a"], (pid, 2, 0)), DURABLE)
        .await
        .unwrap();
    // A non-transactional batch while the transaction is open.
    assert!(matches!(
        log.append(&t, batch(&["x"], 0, Some((pid, 2, 1))), DURABLE)
            .await,
        Err(LogError::InvalidTxnState(_))
    ));
    // Older producer epoch: data and marker.
    assert!(matches!(
        log.append(&t, txn_batch(&["x"], (pid, 1, 0)), DURABLE)
            .await,
        Err(LogError::InvalidProducerEpoch { .. })
    ));
    assert!(matches!(
        log.write_txn_marker(&t, pid, 1, 0, false, T).await,
        Err(LogError::InvalidProducerEpoch { .. })
    ));
    // The coordinator (epoch 5) aborts with a bumped producer epoch (3).
    assert_eq!(
        log.write_txn_marker(&t, pid, 3, 5, false, T)
            .await
            .unwrap()
            .0,
        1
    );
    // A zombie coordinator of epoch 4 is fenced.
    assert!(matches!(
        log.write_txn_marker(&t, pid, 3, 4, true, T).await,
        Err(LogError::TransactionCoordinatorFenced { .. })
    ));
    // A marker for a producer with nothing open here is still written, and records nothing.
    assert_eq!(
        log.write_txn_marker(&t, pid, 3, 5, false, T)
            .await
            .unwrap()
            .0,
        2
    );
    assert_eq!(
        read(&log, 0, Isolation::ReadCommitted).await.1,
        Some(vec![(pid, 0)])
    );
    // The bumped epoch starts its sequences at 0.
    log.append(&t, txn_batch(&["b"], (pid, 3, 0)), DURABLE)
        .await
        .unwrap();
    // A client's control batch is refused as Kafka refuses it (INVALID_RECORD).
    let control = strata_wire::builder::build_txn_marker(pid, 3, true, 5, 0);
    assert!(matches!(
        log.append(&t, control, DURABLE).await,
        Err(LogError::CorruptMessage(BatchError::ControlBatchFromClient))
    ));
    assert_eq!(lso(&log), 3);
    assert!(matches!(
        log.write_txn_marker(&tp("nope", 0), pid, 3, 5, true, T)
            .await,
        Err(LogError::UnknownTopicOrPartition)
    ));
}

/// What a new owner must know: (LSO, HW, aborted list from 0, current txn start).
async fn txn_state(log: &LogManager, pid: i64) -> (i64, i64, Option<Vec<(i64, i64)>>, i64) {
    let t = tp("t", 0);
    let w = log.watermarks(&t).unwrap();
    let start = log
        .producers(&t)
        .unwrap()
        .iter()
        .find(|p| p.producer_id == pid)
        .map_or(-2, |p| p.current_txn_start_offset);
    (
        w.last_stable.0,
        w.high.0,
        read(log, 0, Isolation::ReadCommitted).await.1,
        start,
    )
}

#[tokio::test]
async fn transactions_survive_a_crash_compaction_and_restart() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = setup(&store, config()).await;
    let t = tp("t", 0);
    let (pid, _) = log.init_producer_id().await.unwrap();
    log.append(&t, txn_batch(&["a"], (pid, 0, 0)), DURABLE)
        .await
        .unwrap();
    marker(&log, pid, 0, false).await;
    log.append(&t, txn_batch(&["b"], (pid, 0, 1)), DURABLE)
        .await
        .unwrap();
    log.append(&t, batch(&["plain"], 0, None), DURABLE)
        .await
        .unwrap();
    // Aborted at [0, 1]; open since 2.
    let expected = (2, 4, Some(vec![(pid, 0)]), 2);
    assert_eq!(txn_state(&log, pid).await, expected);
    let upto_hw = read(&log, 0, Isolation::ReadUncommitted).await;
    // A crash: everything is in the write-ahead tail, rebuilt by replay.
    log.abort_for_test();
    let log = open(&store, config()).await;
    assert_eq!(txn_state(&log, pid).await, expected);
    assert_eq!(read(&log, 0, Isolation::ReadUncommitted).await, upto_hw);
    // Compacted into a segment: rebuilt from the manifest's snapshot.
    log.compact_now(&t).await.unwrap();
    log.shutdown().await.unwrap();
    let log = open(&store, config()).await;
    assert_eq!(txn_state(&log, pid).await, expected);
    // The open transaction continues (sequence 2), and its abort is listed once durable.
    log.append(&t, txn_batch(&["c"], (pid, 0, 2)), DURABLE)
        .await
        .unwrap();
    assert_eq!(marker(&log, pid, 0, false).await, 5);
    assert_eq!(
        txn_state(&log, pid).await,
        (6, 6, Some(vec![(pid, 0), (pid, 2)]), -1)
    );
    // Both aborts, one from the segment's snapshot and one from the tail, after a restart.
    log.abort_for_test();
    let log = open(&store, config()).await;
    assert_eq!(
        txn_state(&log, pid).await,
        (6, 6, Some(vec![(pid, 0), (pid, 2)]), -1)
    );
}

#[tokio::test]
async fn a_new_owner_knows_the_open_transaction_and_a_deposed_owners_marker_is_refused() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire_one(&a, "t", 0, 1).await;
    let t = tp("t", 0);
    let (pid, _) = a.init_producer_id().await.unwrap();
    a.append(&t, txn_batch(&["a"], (pid, 0, 0)), DURABLE)
        .await
        .unwrap();
    a.append(&t, batch(&["plain"], 0, None), DURABLE)
        .await
        .unwrap();
    let b = open_managed(&store, 2).await;
    acquire_one(&b, "t", 0, 2).await;
    assert_eq!(txn_state(&b, pid).await, (0, 2, Some(vec![]), 0));
    // The deposed owner's marker is an append: it hits the seal and is not acknowledged.
    assert!(a.write_txn_marker(&t, pid, 0, 0, false, T).await.is_err());
    assert_eq!(
        b.write_txn_marker(&t, pid, 0, 0, false, T).await.unwrap().0,
        2
    );
    assert_eq!(txn_state(&b, pid).await, (3, 3, Some(vec![(pid, 0)]), -1));
}

#[tokio::test]
async fn the_aborted_index_is_bounded_and_the_log_start_frees_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = setup(
        &store,
        LogConfig {
            max_aborted_transactions: 1,
            ..config()
        },
    )
    .await;
    let t = tp("t", 0);
    let (pid, _) = log.init_producer_id().await.unwrap();
    log.append(&t, txn_batch(&["a"], (pid, 0, 0)), DURABLE)
        .await
        .unwrap();
    marker(&log, pid, 0, false).await;
    assert!(matches!(
        log.append(&t, txn_batch(&["b"], (pid, 0, 1)), DURABLE)
            .await,
        Err(LogError::TooManyAbortedTransactions { max: 1 })
    ));
    // Idempotent (non-transactional) appends are not affected, nor markers.
    log.append(&t, batch(&["c"], 0, Some((pid, 0, 1))), DURABLE)
        .await
        .unwrap();
    marker(&log, pid, 0, true).await;
    log.delete_records(&t, Some(Offset(2))).await.unwrap();
    assert_eq!(
        read(&log, 2, Isolation::ReadCommitted).await.1,
        Some(vec![])
    );
    log.append(&t, txn_batch(&["d"], (pid, 0, 2)), DURABLE)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_aborted_write_of_a_key_never_removes_its_committed_value() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = open(
        &store,
        LogConfig {
            cleaner_threads: 0,
            ..config()
        },
    )
    .await;
    log.create_topic(
        "t",
        Some(1),
        BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]),
        false,
    )
    .await
    .unwrap();
    let t = tp("t", 0);
    let (pid, _) = log.init_producer_id().await.unwrap();
    let keyed = |v: &str, producer| super::cleaner::keyed(&[(Some("k"), Some(v))], 0, producer);
    log.append(&t, keyed("committed-before", None), DURABLE)
        .await
        .unwrap();
    // An aborted write of the same key must not remove the committed value.
    let mut aborted = BytesMut::from(&keyed("aborted", Some((pid, 0, 0)))[..]);
    aborted[22] |= 0x10;
    let crc = crc32c::crc32c(&aborted[21..]);
    aborted[17..21].copy_from_slice(&crc.to_be_bytes());
    log.append(&t, aborted.freeze(), DURABLE).await.unwrap();
    marker(&log, pid, 0, false).await;
    log.compact_now(&t).await.unwrap();
    log.clean_now(&t).await.unwrap();
    let (bases, aborted) = read(&log, 0, Isolation::ReadCommitted).await;
    assert_eq!(
        bases,
        vec![0, 1, 2],
        "the value, the aborted batch (the producer's last: kept empty) and the marker stay"
    );
    let out = log
        .read_isolated(&t, Offset(1), 1 << 20, true, Isolation::ReadUncommitted)
        .await
        .unwrap();
    assert_eq!(
        i32::from_be_bytes(out.batches[0][57..61].try_into().unwrap()),
        0
    );
    assert_eq!(aborted, Some(vec![(pid, 1)]));
}

/// Kafka's verification guard (KIP-890 part 1): a produce takes its producer's standing before
/// the coordinator verifies it, and an opening batch is refused if a marker of that producer
/// landed in between (its transaction ended: appending would open one the coordinator knows
/// nothing of, a hanging transaction). An unchanged standing appends; a continuing batch (the
/// transaction still open) needs nothing; the standing survives a restart.
#[tokio::test]
async fn a_produce_verified_before_its_transaction_ended_does_not_reopen_it() {
    use crate::TxnGuard;
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = setup(&store, config()).await;
    let (pid, epoch) = log.init_producer_id().await.unwrap();
    let t = tp("t", 0);
    let fresh = log.txn_guard(&t, pid).unwrap();
    assert_eq!(fresh, TxnGuard::Closed { last_marker: None });
    // Verified, and nothing happened since: it opens the transaction.
    log.enqueue_guarded(&t, txn_batch(&["a"], (pid, epoch, 0)), DURABLE, fresh)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let while_open = log.txn_guard(&t, pid).unwrap();
    assert_eq!(while_open, TxnGuard::Open);
    // Taken while open (no verification), then the transaction ends before the append.
    let commit = marker(&log, pid, epoch, true).await;
    let late = log
        .enqueue_guarded(
            &t,
            txn_batch(&["late"], (pid, epoch, 1)),
            DURABLE,
            while_open,
        )
        .await;
    assert!(
        matches!(late, Err(LogError::InvalidTxnState(_))),
        "{:?}",
        late.map(|_| ())
    );
    // A guard taken before that marker (Closed, no marker yet) is stale as well.
    let stale = log
        .enqueue_guarded(&t, txn_batch(&["late"], (pid, epoch, 1)), DURABLE, fresh)
        .await;
    assert!(matches!(stale, Err(LogError::InvalidTxnState(_))));
    assert_eq!(lso(&log), commit + 1, "no transaction was reopened");
    // The standing after the marker, taken afresh, opens the next transaction.
    let after = log.txn_guard(&t, pid).unwrap();
    assert_eq!(
        after,
        TxnGuard::Closed {
            last_marker: Some(commit)
        }
    );
    log.enqueue_guarded(&t, txn_batch(&["next"], (pid, epoch, 1)), DURABLE, after)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    // A continuing batch is appended under an Open guard or a stale one alike: it opens
    // nothing.
    log.enqueue_guarded(&t, txn_batch(&["more"], (pid, epoch, 2)), DURABLE, fresh)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let second = marker(&log, pid, epoch, false).await;
    // The marker offset the guard compares is rebuilt by a crash's replay, and kept in the
    // manifest's snapshot by compaction.
    let expected = TxnGuard::Closed {
        last_marker: Some(second),
    };
    log.abort_for_test();
    let log = open(&store, config()).await;
    assert_eq!(log.txn_guard(&t, pid).unwrap(), expected);
    log.compact_now(&t).await.unwrap();
    log.shutdown().await.unwrap();
    let log = open(&store, config()).await;
    assert_eq!(log.txn_guard(&t, pid).unwrap(), expected);
}

#[tokio::test]
async fn a_full_uncompacted_tail_refuses_producers_but_never_a_transaction_marker() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let log = setup(
        &store,
        LogConfig {
            max_uncompacted_batches: 2,
            ..config()
        },
    )
    .await;
    let t = tp("t", 0);
    let (pid, epoch) = log.init_producer_id().await.unwrap();
    log.append(&t, txn_batch(&["a"], (pid, epoch, 0)), DURABLE)
        .await
        .unwrap();
    log.append(&t, batch(&["plain"], 0, None), DURABLE)
        .await
        .unwrap();
    assert!(matches!(
        log.append(&t, batch(&["more"], 0, None), DURABLE).await,
        Err(LogError::CompactionBehind { .. })
    ));
    // The marker ends the transaction although the tail is full.
    assert_eq!(marker(&log, pid, epoch, true).await, 2);
    assert_eq!(lso(&log), 3);
}
