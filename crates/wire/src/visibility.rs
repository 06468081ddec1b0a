//! Which stored batches a reader delivers to its application, by isolation level.
//!
//! A Kafka consumer decides this itself from a Fetch response: control batches (transaction
//! markers) are never records, and a read_committed consumer also drops the batches of aborted
//! transactions, using the aborted-transaction list the broker sends beside the records. Share
//! groups move that decision to the broker (KIP-932's `share.isolation.level`): the broker hands
//! out records one by one, so it must know which are records at all. This module is that
//! decision, without IO, for both.

use bytes::Bytes;

use crate::batch::read_batch_header;
use crate::builder::read_txn_marker;

/// What one stored batch is to a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// Records the application receives.
    Data,
    /// A control batch (a transaction marker, or a control type unknown to us): never delivered.
    Control,
    /// Records of an aborted transaction, hidden from a read_committed reader.
    Aborted,
}

impl Visibility {
    pub fn delivered(self) -> bool {
        self == Self::Data
    }
}

/// Classifies `batches` (stored batches in offset order) for a reader. `aborted` is None for
/// read_uncommitted, and for read_committed the aborted transactions (producer id, first offset)
/// that overlap the batches, as the log reports them for a read that stops at the last stable
/// offset.
///
/// Kafka's consumer rule: a transaction becomes "aborted" for its producer once a batch reaches
/// its first offset, and stops being so at that producer's abort marker; a transactional batch
/// of a producer with an aborted transaction open is dropped. A batch whose header does not
/// parse is reported as data (the client gets it as stored, as any fetch would hand it out).
pub fn classify(batches: &[Bytes], aborted: Option<&[(i64, i64)]>) -> Vec<Visibility> {
    let mut pending: Vec<(i64, i64)> = aborted.map(<[_]>::to_vec).unwrap_or_default();
    // Popped from the end: sorted by first offset, descending.
    pending.sort_unstable_by_key(|&(_, first)| std::cmp::Reverse(first));
    let mut open: Vec<i64> = Vec::new();
    batches
        .iter()
        .map(|batch| {
            let Some(h) = read_batch_header(batch) else {
                return Visibility::Data;
            };
            let last = h.last_offset();
            while pending.last().is_some_and(|(_, first)| *first <= last) {
                if let Some((producer, _)) = pending.pop() {
                    if !open.contains(&producer) {
                        open.push(producer);
                    }
                }
            }
            if h.is_control() {
                if read_txn_marker(batch).is_some_and(|m| !m.commit) {
                    open.retain(|p| *p != h.producer_id);
                }
                Visibility::Control
            } else if aborted.is_some() && h.is_transactional() && open.contains(&h.producer_id) {
                Visibility::Aborted
            } else {
                Visibility::Data
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::build_txn_marker;
    use crate::testutil::{BatchBuilder, TestRecord};

    fn at(base: i64, mut batch: Vec<u8>) -> Bytes {
        // The base offset is outside the CRC: the log rewrites it on append the same way.
        batch[..8].copy_from_slice(&base.to_be_bytes());
        Bytes::from(batch)
    }

    fn data(base: i64, count: usize, producer: Option<i64>) -> Bytes {
        let mut b = BatchBuilder::new();
        if let Some(p) = producer {
            b = b.attributes(0x10).producer(p, 0, 0);
        }
        for n in 0..count {
            b = b.record(TestRecord::new(None, Some(&format!("v{n}"))).offset_delta(n as i32));
        }
        at(base, b.build())
    }

    fn marker(offset: i64, producer: i64, commit: bool) -> Bytes {
        at(offset, build_txn_marker(producer, 0, commit, 0, 0).to_vec())
    }

    /// The layout of librdkafka's share-consumer transaction test: an aborted record, its
    /// marker, five committed records and their marker.
    fn aborted_then_committed() -> Vec<Bytes> {
        vec![
            data(0, 1, Some(7)),
            marker(1, 7, false),
            data(2, 5, Some(7)),
            marker(7, 7, true),
        ]
    }

    #[test]
    fn read_uncommitted_drops_only_control_batches() {
        use Visibility::*;
        assert_eq!(
            classify(&aborted_then_committed(), None),
            vec![Data, Control, Data, Control]
        );
    }

    #[test]
    fn read_committed_also_drops_the_aborted_transactions_batches() {
        use Visibility::*;
        assert_eq!(
            classify(&aborted_then_committed(), Some(&[(7, 0)])),
            vec![Aborted, Control, Data, Control]
        );
    }

    #[test]
    fn an_abort_ends_only_its_own_producers_transaction() {
        use Visibility::*;
        // Producers 1 and 2 interleave; 2 aborts, 1 commits; a plain batch sits in between.
        let batches = vec![
            data(0, 2, Some(1)),
            data(2, 2, Some(2)),
            data(4, 1, None),
            marker(5, 2, false),
            data(6, 1, Some(2)),
            marker(7, 1, true),
            marker(8, 2, true),
        ];
        assert_eq!(
            classify(&batches, Some(&[(2, 2)])),
            vec![Data, Aborted, Data, Control, Data, Control, Control]
        );
    }

    #[test]
    fn a_read_that_starts_inside_an_aborted_transaction_drops_its_batches() {
        use Visibility::*;
        // The transaction began at offset 0, before this read; its marker is past the read.
        let batches = vec![data(10, 3, Some(4)), data(13, 1, None)];
        assert_eq!(classify(&batches, Some(&[(4, 0)])), vec![Aborted, Data]);
    }

    #[test]
    fn an_unparsable_batch_is_handed_out_as_stored() {
        assert_eq!(
            classify(&[Bytes::from_static(b"short")], Some(&[])),
            vec![Visibility::Data]
        );
    }
}
