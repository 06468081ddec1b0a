//! Transactions, the partition side: the entry point through which the transaction
//! coordinator has a partition's owner write a commit or abort marker, and the counters
//! `/metrics` reports. The state itself (ongoing transactions, aborted ranges) lives with the
//! producer state (`producer`), and the read path (`read`) applies it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use strata_core::{Offset, TopicPartition};

use crate::append::{Acks, Origin};
use crate::manager::LogManager;
use crate::producer::TxnGuard;
use crate::LogResult;

/// Markers written since start, by type.
#[derive(Debug, Default)]
pub(crate) struct TxnStats {
    commits: AtomicU64,
    aborts: AtomicU64,
}

/// What `/metrics` reports about transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxnSnapshot {
    /// Open transactions over the partitions served (a producer with a transaction open in
    /// three partitions counts three), durable data only.
    pub ongoing: u64,
    pub commit_markers: u64,
    pub abort_markers: u64,
}

/// What a read returns up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Everything below the high watermark (Kafka's isolation_level 0).
    #[default]
    ReadUncommitted,
    /// Only below the last stable offset, with the aborted transactions the data overlaps
    /// (isolation_level 1).
    ReadCommitted,
}

impl LogManager {
    /// Appends a transaction marker for `producer_id` to `tp` (the WriteTxnMarkers work of a
    /// partition owner) and returns its offset once durable. The marker goes through the
    /// ordinary append path: refused unless this broker serves the partition
    /// (NotOwner), fenced like every append, checked against the producer's state (an older
    /// producer epoch: InvalidProducerEpoch; an older coordinator epoch:
    /// TransactionCoordinatorFenced). A marker for a producer with no transaction open here is
    /// still written, as Kafka writes it, and changes nothing but the producer's epochs.
    pub async fn write_txn_marker(
        &self,
        tp: &TopicPartition,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
        commit: bool,
        timeout: Duration,
    ) -> LogResult<Offset> {
        let marker = strata_wire::builder::build_txn_marker(
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
            self.shared.clock.wall_millis(),
        );
        let ticket = self
            .enqueue_from(
                tp,
                marker,
                Acks::Durable { timeout },
                Origin::Coordinator,
                None,
            )
            .await?;
        let outcome = ticket.wait().await?;
        let stats = &self.shared.txn_stats;
        if commit {
            stats.commits.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.aborts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome.base_offset)
    }

    /// `producer_id`'s transactional standing in `tp`, counting appends not yet durable, to
    /// pass back with its produce ([`Self::enqueue_guarded`]). While its transaction is open
    /// there ([`TxnGuard::Open`]) its batches continue it, so only a produce taken as
    /// [`TxnGuard::Closed`] needs the coordinator's verification (KIP-890).
    pub fn txn_guard(&self, tp: &TopicPartition, producer_id: i64) -> LogResult<TxnGuard> {
        let part = self.partition_readable(tp)?;
        let st = part.lock();
        Ok(st.producers.txn_guard(producer_id))
    }

    /// Transaction counters for `/metrics`: a walk over the served partitions.
    pub fn txn_stats(&self) -> TxnSnapshot {
        let ongoing = self
            .shared
            .partitions_snapshot()
            .iter()
            .map(|p| p.lock().txns.ongoing.len() as u64)
            .sum();
        let stats = &self.shared.txn_stats;
        TxnSnapshot {
            ongoing,
            commit_markers: stats.commits.load(Ordering::Relaxed),
            abort_markers: stats.aborts.load(Ordering::Relaxed),
        }
    }
}
