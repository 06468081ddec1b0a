//! Idempotent-producer state of one partition, as Kafka keeps it: per producer id, the
//! current epoch and the last five batches' sequence ranges, so a retried batch is recognised
//! as a duplicate (and answered with its original offset) and a gap is refused.
//!
//! The state is rebuilt on recovery from the manifest's snapshot plus the producer fields of
//! replayed write-ahead entries, so it survives restarts and moves with the partition.

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

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerEntry {
    pub epoch: i16,
    pub batches: VecDeque<BatchSeq>,
    /// Max timestamp of the producer's last batch (what DescribeProducers reports). Snapshots
    /// written before it existed read as -1, unknown, until the producer appends again.
    #[serde(default = "unknown_timestamp")]
    pub last_timestamp: i64,
}

fn unknown_timestamp() -> i64 {
    -1
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

    /// Every producer with state, by id.
    pub fn summaries(&self) -> Vec<ProducerSummary> {
        self.producers
            .iter()
            .map(|(id, entry)| ProducerSummary {
                producer_id: *id,
                epoch: entry.epoch,
                last_sequence: entry.batches.back().map_or(-1, |b| b.last_seq),
                last_timestamp: entry.last_timestamp,
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
            let mut candidate = match store.list(PRODUCER_ID_PREFIX).await?.last() {
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
