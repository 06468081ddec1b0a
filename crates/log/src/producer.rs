//! Idempotent-producer state of one partition, as Kafka keeps it: per producer id, the
//! current epoch and the last five batches' sequence ranges, so a retried batch is recognised
//! as a duplicate (and answered with its original offset) and a gap is refused.
//!
//! The state is rebuilt on recovery from the manifest's snapshot plus the producer fields of
//! replayed write-ahead entries, so it survives restarts and moves with the partition.
//!
//! Transactions, the partition side (Kafka's ProducerStateManager): a producer's first
//! transactional batch opens its ongoing transaction at that batch's offset; a marker (a
//! control batch the coordinator has the partition owner append) closes it, and an abort
//! marker records the aborted range (producer, first offset, marker offset) that read_committed
//! fetches list. The snapshot carries both, so a new owner knows them.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_storage::{ObjectKey, PutMode, StorageError};

use crate::manager::LogManager;
use crate::{LogError, LogResult};

/// Batches remembered per producer: Kafka's max.in.flight.requests.per.connection bound for
/// idempotent producers is 5, so a retry can only ever repeat one of the last five.
const BATCHES_KEPT: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSeq {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerEntry {
    pub epoch: i16,
    pub batches: VecDeque<BatchSeq>,
    /// Max timestamp of the producer's last batch (what DescribeProducers reports). Snapshots
    /// written before it existed read as -1, unknown, until the producer appends again.
    #[serde(default = "unknown_timestamp")]
    pub last_timestamp: i64,
    /// First offset of the producer's ongoing transaction in this partition, if one is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn_first_offset: Option<i64>,
    /// Epoch of the transaction coordinator that wrote the producer's last marker (-1: none);
    /// a marker from an older coordinator is refused (a zombie coordinator).
    #[serde(default = "no_coordinator_epoch")]
    pub coordinator_epoch: i32,
    /// Offset of the producer's last marker here, if any: what a transaction guard compares
    /// (see [`TxnGuard`]). Every marker has a new offset, so an unchanged value proves that no
    /// transaction of this producer ended here in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_marker: Option<i64>,
}

/// A producer's transactional standing in one partition, taken before its transaction
/// coordinator is asked to verify a produce (KIP-890 part 1) and checked again, under the
/// partition's lock, when the produce is appended: Kafka's verification guard. Without it a
/// produce verified while its transaction was open, then delayed until after that
/// transaction's marker, would open a transaction the coordinator knows nothing of, holding
/// the last stable offset back until the producer's timeout (a hanging transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnGuard {
    /// The producer's transaction is open here: its batches continue it, no verification.
    Open,
    /// No transaction open, and this was the offset of the producer's last marker here: a
    /// batch opening one is appended only if that is still so (no marker since).
    Closed { last_marker: Option<i64> },
}

impl Default for ProducerEntry {
    fn default() -> Self {
        Self {
            epoch: 0,
            batches: VecDeque::new(),
            last_timestamp: unknown_timestamp(),
            txn_first_offset: None,
            coordinator_epoch: no_coordinator_epoch(),
            last_marker: None,
        }
    }
}

fn unknown_timestamp() -> i64 {
    -1
}

fn no_coordinator_epoch() -> i32 {
    -1
}

/// What a batch means to transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TxnKind {
    /// Not part of a transaction.
    #[default]
    None,
    /// Transactional data.
    Data,
    /// A commit or abort marker (a control batch).
    Marker {
        commit: bool,
        coordinator_epoch: i32,
    },
}

impl TxnKind {
    /// Reads a stored batch's attributes (and a marker's record). The write-ahead header does
    /// not carry attributes: replay reads them from the batch itself, so objects written before
    /// transactions existed read unchanged (as plain batches, which they are).
    pub fn of_stored(batch: &[u8]) -> TxnKind {
        match strata_wire::batch::read_batch_header(batch) {
            // A marker is a few dozen bytes: copied to be parsed.
            Some(h) if h.is_control() => {
                match strata_wire::builder::read_txn_marker(&Bytes::copy_from_slice(batch)) {
                    Some(m) => TxnKind::Marker {
                        commit: m.commit,
                        coordinator_epoch: m.coordinator_epoch,
                    },
                    // A control record of a type we do not know changes no state, as in Kafka.
                    None => TxnKind::None,
                }
            }
            Some(h) if h.is_transactional() => TxnKind::Data,
            _ => TxnKind::None,
        }
    }
}

/// An aborted transaction of one partition: read_committed fetches that overlap it are told
/// to drop the producer's records from `first_offset` up to the marker at `last_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// One appended batch as producer state sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
    pub base_offset: i64,
    pub max_timestamp: i64,
    pub kind: TxnKind,
}

/// One idempotent producer's state in a partition, as DescribeProducers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    pub producer_id: i64,
    pub epoch: i16,
    /// Sequence of the last record appended; -1 when none is remembered.
    pub last_sequence: i32,
    /// Max timestamp of the last batch; -1 when unknown.
    pub last_timestamp: i64,
    /// Epoch of the coordinator that wrote the producer's last marker; -1 when none.
    pub coordinator_epoch: i32,
    /// First offset of the producer's ongoing transaction; -1 when none is open.
    pub current_txn_start_offset: i64,
}

/// What to do with an incoming idempotent batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    /// New data: append it.
    Append,
    /// A retry of a batch already appended at this base offset: answer success, store nothing.
    Duplicate { base_offset: i64 },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStates {
    pub producers: BTreeMap<i64, ProducerEntry>,
    /// Aborted transactions whose markers are at or past the log start, in marker order
    /// (pruned as the log start passes them; bounded by `max_aborted_transactions`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aborted: Vec<AbortedTxn>,
}

/// The transactions of a partition's durable batches: what the last stable offset and the
/// aborted lists of read_committed fetches are computed from. The append path's
/// [`ProducerStates`] runs ahead of it (it includes batches not yet durable); a marker must be
/// durable before the transaction it closes stops holding the last stable offset back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnView {
    /// Producer id → first offset of its ongoing transaction.
    pub ongoing: BTreeMap<i64, i64>,
    pub aborted: Vec<AbortedTxn>,
}

impl TxnView {
    pub fn from_snapshot(states: &ProducerStates) -> Self {
        Self {
            ongoing: states
                .producers
                .iter()
                .filter_map(|(id, e)| e.txn_first_offset.map(|first| (*id, first)))
                .collect(),
            aborted: states.aborted.clone(),
        }
    }

    /// Follows one durable batch.
    pub fn apply(&mut self, b: &BatchInfo) {
        if b.producer_id < 0 {
            return;
        }
        match b.kind {
            TxnKind::None => {}
            TxnKind::Data => {
                self.ongoing.entry(b.producer_id).or_insert(b.base_offset);
            }
            TxnKind::Marker { commit, .. } => {
                if let Some(first) = self.ongoing.remove(&b.producer_id) {
                    if !commit {
                        self.aborted.push(AbortedTxn {
                            producer_id: b.producer_id,
                            first_offset: first,
                            last_offset: b.base_offset,
                        });
                    }
                }
            }
        }
    }

    /// Kafka's last stable offset: the first offset of the oldest ongoing transaction, or the
    /// high watermark when none is open.
    pub fn last_stable(&self, high_watermark: i64) -> i64 {
        self.ongoing
            .values()
            .copied()
            .min()
            .map_or(high_watermark, |first| first.min(high_watermark))
    }

    /// The aborted transactions a read_committed fetch of `[from, to)` must be told about
    /// (Kafka's rule: every one whose marker is at or past `from` and that starts before `to`),
    /// as (producer id, first offset).
    pub fn aborted_between(&self, from: i64, to: i64) -> Vec<(i64, i64)> {
        let start = self.aborted.partition_point(|a| a.last_offset < from);
        self.aborted[start..]
            .iter()
            .filter(|a| a.first_offset < to)
            .map(|a| (a.producer_id, a.first_offset))
            .collect()
    }

    pub fn prune(&mut self, log_start: i64) {
        prune_aborted(&mut self.aborted, log_start);
    }
}

fn prune_aborted(aborted: &mut Vec<AbortedTxn>, log_start: i64) {
    let gone = aborted.partition_point(|a| a.last_offset < log_start);
    aborted.drain(..gone);
}

fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

fn last_seq_of(first_seq: i32, record_count: i32) -> i32 {
    // Sequences wrap at i32::MAX, as in Kafka.
    ((first_seq as i64 + record_count as i64 - 1) % (i32::MAX as i64 + 1)) as i32
}

impl ProducerStates {
    /// Checks a batch without changing state.
    pub fn check(
        &self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        record_count: i32,
    ) -> LogResult<SeqCheck> {
        let last_seq = last_seq_of(first_seq, record_count);
        let Some(entry) = self.producers.get(&producer_id) else {
            // No state: a fresh producer starts at sequence 0. Anything else means we lost its
            // state (e.g. retention removed it); the client resets its sequence on this error.
            return if first_seq == 0 {
                Ok(SeqCheck::Append)
            } else {
                Err(LogError::UnknownProducerId(producer_id))
            };
        };
        if epoch < entry.epoch {
            return Err(LogError::InvalidProducerEpoch {
                producer_id,
                got: epoch,
                current: entry.epoch,
            });
        }
        if epoch > entry.epoch {
            return if first_seq == 0 {
                Ok(SeqCheck::Append)
            } else {
                Err(LogError::OutOfOrderSequence {
                    producer_id,
                    expected: 0,
                    got: first_seq,
                })
            };
        }
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
        {
            return Ok(SeqCheck::Duplicate {
                base_offset: dup.base_offset,
            });
        }
        let expected = entry.batches.back().map_or(0, |b| next_seq(b.last_seq));
        if first_seq == expected {
            Ok(SeqCheck::Append)
        } else {
            Err(LogError::OutOfOrderSequence {
                producer_id,
                expected,
                got: first_seq,
            })
        }
    }

    /// Checks a batch of any kind without changing state: sequences for data (as
    /// [`Self::check`]), Kafka's transaction rules on top. A marker from an older producer
    /// epoch is refused (INVALID_PRODUCER_EPOCH), one from an older coordinator epoch too
    /// (TRANSACTION_COORDINATOR_FENCED); a non-transactional batch of a producer whose
    /// transaction is open here is refused (INVALID_TXN_STATE), as Kafka's ProducerAppendInfo
    /// does.
    pub fn check_batch(&self, b: &BatchInfo) -> LogResult<SeqCheck> {
        let entry = self.producers.get(&b.producer_id);
        if let TxnKind::Marker {
            coordinator_epoch, ..
        } = b.kind
        {
            if let Some(entry) = entry {
                if b.producer_epoch < entry.epoch {
                    return Err(LogError::InvalidProducerEpoch {
                        producer_id: b.producer_id,
                        got: b.producer_epoch,
                        current: entry.epoch,
                    });
                }
                if coordinator_epoch < entry.coordinator_epoch {
                    return Err(LogError::TransactionCoordinatorFenced {
                        producer_id: b.producer_id,
                        got: coordinator_epoch,
                        current: entry.coordinator_epoch,
                    });
                }
            }
            return Ok(SeqCheck::Append);
        }
        let decision = self.check(
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
            b.record_count,
        )?;
        if decision == SeqCheck::Append
            && b.kind == TxnKind::None
            && entry.is_some_and(|e| e.txn_first_offset.is_some())
        {
            return Err(LogError::InvalidTxnState(format!(
                "producer {} sent a non-transactional batch while its transaction is open",
                b.producer_id
            )));
        }
        Ok(decision)
    }

    /// `producer_id`'s standing here, for a [`TxnGuard`].
    pub fn txn_guard(&self, producer_id: i64) -> TxnGuard {
        match self.producers.get(&producer_id) {
            Some(e) if e.txn_first_offset.is_some() => TxnGuard::Open,
            entry => TxnGuard::Closed {
                last_marker: entry.and_then(|e| e.last_marker),
            },
        }
    }

    /// Whether this transactional batch would open a new transaction here.
    pub fn opens_txn(&self, b: &BatchInfo) -> bool {
        b.kind == TxnKind::Data
            && self
                .producers
                .get(&b.producer_id)
                .is_none_or(|e| e.txn_first_offset.is_none())
    }

    /// Records an appended batch of any kind (after `check_batch` said Append, or on replay).
    pub fn apply(&mut self, b: &BatchInfo) {
        if b.producer_id < 0 {
            return;
        }
        match b.kind {
            TxnKind::None | TxnKind::Data => {
                self.record(
                    b.producer_id,
                    b.producer_epoch,
                    b.base_sequence,
                    b.record_count,
                    b.base_offset,
                    b.max_timestamp,
                );
                if b.kind == TxnKind::Data {
                    if let Some(entry) = self.producers.get_mut(&b.producer_id) {
                        entry.txn_first_offset.get_or_insert(b.base_offset);
                    }
                }
            }
            TxnKind::Marker {
                commit,
                coordinator_epoch,
            } => {
                let entry = self.producers.entry(b.producer_id).or_default();
                if b.producer_epoch != entry.epoch {
                    // A marker at a bumped epoch (the coordinator's abort of a fenced or
                    // timed-out producer): the new epoch starts its sequences afresh.
                    entry.epoch = b.producer_epoch;
                    entry.batches.clear();
                }
                entry.coordinator_epoch = coordinator_epoch;
                entry.last_timestamp = b.max_timestamp;
                entry.last_marker = Some(b.base_offset);
                if let Some(first) = entry.txn_first_offset.take() {
                    if !commit {
                        self.aborted.push(AbortedTxn {
                            producer_id: b.producer_id,
                            first_offset: first,
                            last_offset: b.base_offset,
                        });
                    }
                }
            }
        }
    }

    /// Forgets aborted transactions wholly below the log start: no fetch can overlap them.
    pub fn prune_aborted(&mut self, log_start: i64) {
        prune_aborted(&mut self.aborted, log_start);
    }

    /// Every producer with state, by id.
    pub fn summaries(&self) -> Vec<ProducerSummary> {
        self.producers
            .iter()
            .map(|(id, entry)| ProducerSummary {
                producer_id: *id,
                epoch: entry.epoch,
                last_sequence: entry.batches.back().map_or(-1, |b| b.last_seq),
                last_timestamp: entry.last_timestamp,
                coordinator_epoch: entry.coordinator_epoch,
                current_txn_start_offset: entry.txn_first_offset.unwrap_or(-1),
            })
            .collect()
    }

    /// Records an appended batch (after `check` said Append, or on replay); `max_timestamp`
    /// is the batch's (-1 where the caller does not know it).
    pub fn record(
        &mut self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        record_count: i32,
        base_offset: i64,
        max_timestamp: i64,
    ) {
        let entry = self.producers.entry(producer_id).or_default();
        entry.last_timestamp = max_timestamp;
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.batches.push_back(BatchSeq {
            first_seq,
            last_seq: last_seq_of(first_seq, record_count),
            base_offset,
        });
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
    }
}

// Producer ids: allocated in blocks so that one storage write serves a thousand producers.
#[derive(Debug, Default)]
pub(crate) struct ProducerIdBlock {
    next: i64,
    end: i64,
}

const PRODUCER_ID_BLOCK: i64 = 1000;

use strata_layout::producer_ids::{self, PREFIX as PRODUCER_ID_PREFIX};

impl LogManager {
    /// Allocates a new idempotent producer id (unique across restarts and brokers) with
    /// epoch 0. Ids come in blocks claimed by create-only writes, so brokers sharing the
    /// storage never hand out the same id.
    pub async fn init_producer_id(&self) -> LogResult<(i64, i16)> {
        let mut block = self.shared.producer_ids.lock().await;
        if block.next >= block.end {
            let store = self.shared.store.as_ref();
            let listed = store.list(PRODUCER_ID_PREFIX).await?;
            let mut candidate = match listed.last() {
                Some(meta) => producer_ids::parse_key(meta.key.as_str()).map_or(0, |n| n + 1),
                None => 0,
            };
            loop {
                let key = ObjectKey::new(producer_ids::key(candidate))?;
                match store.put(&key, Bytes::new(), PutMode::Create).await {
                    Ok(_) => break,
                    Err(StorageError::AlreadyExists(_)) => candidate += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            // Blocks are claimed above the highest marker, so only the highest must stay:
            // the lower ones only made every later claim list more (one per broker start
            // and per thousand producers, for ever). Ours is now above every one listed, and
            // only a claim above ours deletes ours, so the highest claimed always stays.
            // A failed delete leaves a marker for the next claim to delete.
            for meta in &listed {
                if producer_ids::parse_key(meta.key.as_str()).is_some_and(|n| n < candidate) {
                    if let Err(e) = store.delete(&meta.key).await {
                        tracing::debug!(key = %meta.key.as_str(), error = %e, "could not delete an old producer-id block marker");
                    }
                }
            }
            block.next = candidate as i64 * PRODUCER_ID_BLOCK;
            block.end = block.next + PRODUCER_ID_BLOCK;
        }
        let id = block.next;
        block.next += 1;
        Ok((id, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_in_order_and_recognises_retries() {
        let mut s = ProducerStates::default();
        assert_eq!(s.check(7, 0, 0, 10).unwrap(), SeqCheck::Append);
        s.record(7, 0, 0, 10, 100, -1);
        assert_eq!(s.check(7, 0, 10, 5).unwrap(), SeqCheck::Append);
        s.record(7, 0, 10, 5, 110, -1);
        assert_eq!(
            s.check(7, 0, 0, 10).unwrap(),
            SeqCheck::Duplicate { base_offset: 100 }
        );
        assert_eq!(
            s.check(7, 0, 10, 5).unwrap(),
            SeqCheck::Duplicate { base_offset: 110 }
        );
    }

    #[test]
    fn refuses_gaps_old_epochs_and_unknown_producers() {
        let mut s = ProducerStates::default();
        assert!(matches!(
            s.check(1, 0, 5, 1),
            Err(LogError::UnknownProducerId(1))
        ));
        s.record(1, 2, 0, 3, 0, -1);
        assert!(matches!(
            s.check(1, 2, 4, 1),
            Err(LogError::OutOfOrderSequence { expected: 3, .. })
        ));
        assert!(matches!(
            s.check(1, 1, 3, 1),
            Err(LogError::InvalidProducerEpoch { .. })
        ));
        assert_eq!(s.check(1, 3, 0, 1).unwrap(), SeqCheck::Append);
        assert!(s.check(1, 3, 1, 1).is_err());
    }

    /// A producer snapshot as manifests stored it before transactions: it loads with no
    /// transaction open, no coordinator epoch and no aborted transactions.
    #[test]
    fn a_snapshot_from_before_transactions_loads() {
        let old = r#"{"producers":{"7":{"epoch":2,"batches":[{"first_seq":0,"last_seq":4,"base_offset":10}],"last_timestamp":99}}}"#;
        let s: ProducerStates = serde_json::from_str(old).unwrap();
        let e = &s.producers[&7];
        assert_eq!(
            (e.epoch, e.txn_first_offset, e.coordinator_epoch),
            (2, None, -1)
        );
        assert!(s.aborted.is_empty());
        assert_eq!(TxnView::from_snapshot(&s), TxnView::default());
        // And a snapshot without transactional state is written as before.
        assert!(!serde_json::to_string(&s).unwrap().contains("aborted"));
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        let mut s = ProducerStates::default();
        s.record(1, 0, 0, 1, 0, -1);
        s.producers.get_mut(&1).unwrap().batches[0].last_seq = i32::MAX - 1;
        assert_eq!(s.check(1, 0, i32::MAX, 2).unwrap(), SeqCheck::Append);
        s.record(1, 0, i32::MAX, 2, 1, -1);
        assert_eq!(s.check(1, 0, 1, 1).unwrap(), SeqCheck::Append);
    }
}
