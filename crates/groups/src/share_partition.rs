//! One share partition (KIP-932): the in-flight window of a (share group, topic partition) on
//! the partition's owner, as Kafka's `SharePartition` keeps it, without IO.
//!
//! Offsets below the share-partition start offset (SPSO) are done (acknowledged or archived).
//! From the SPSO up to the end offset every record has a state: AVAILABLE, ACQUIRED by one
//! member until a lock deadline, ACKNOWLEDGED, or ARCHIVED, plus how many times it was
//! delivered. Records at or past the end offset were never delivered. The window never holds
//! more than `max_record_locks` records, so a group whose consumers stall cannot grow memory:
//! acquisition of new records stops until the SPSO moves.
//!
//! Time is an input (`now`, the injected clock's monotonic reading); nothing here reads a
//! clock. Only the durable part — SPSO, delivery counts, acknowledged and archived records —
//! goes into a [`ShareSnapshot`]: acquisition is not durable, as in Kafka, so a record acquired
//! when its owner crashed is available again to the next owner.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The tunables of every share partition: Kafka's broker settings of the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimits {
    /// `group.share.partition.max.record.locks`: records in flight per share partition.
    pub max_record_locks: usize,
    /// `group.share.record.lock.duration.ms`: how long an acquired record stays with its member.
    pub lock_duration: Duration,
    /// `group.share.delivery.count.limit`: deliveries after which a released record is
    /// archived instead of offered again.
    pub delivery_count_limit: u16,
}

impl Default for ShareLimits {
    fn default() -> Self {
        Self {
            max_record_locks: 2000,
            lock_duration: Duration::from_secs(30),
            delivery_count_limit: 5,
        }
    }
}

/// Kafka's acknowledge types (ShareFetch and ShareAcknowledge `acknowledge_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckType {
    /// 0: an offset with no record (compacted away or a control record).
    Gap,
    Accept,
    Release,
    Reject,
}

impl AckType {
    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            0 => Some(Self::Gap),
            1 => Some(Self::Accept),
            2 => Some(Self::Release),
            3 => Some(Self::Reject),
            _ => None,
        }
    }
}

/// Why an acknowledgement was refused; nothing of it was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShareAckError {
    /// An offset not acquired by this member (never delivered, already acknowledged, its lock
    /// expired, or another member's): Kafka's INVALID_RECORD_STATE.
    #[error("offsets {0}..={1} are not acquired by this member")]
    InvalidRecordState(i64, i64),
    /// Malformed batch: last before first, or a type count that matches neither one type for
    /// the whole range nor one per offset: Kafka's INVALID_REQUEST.
    #[error("malformed acknowledgement batch {0}..={1}")]
    InvalidRequest(i64, i64),
}

/// One record's state in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    Available,
    Acquired {
        member: Arc<str>,
        deadline: Duration,
    },
    Acknowledged,
    Archived,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    state: RecordState,
    delivery_count: u16,
}

/// One stored batch as read for acquisition: its offsets, and whether its records are
/// delivered at all (control batches, and aborted transactions under read_committed, are not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpan {
    pub base: i64,
    pub last: i64,
    pub deliver: bool,
}

/// A run of acquired offsets with one delivery count, as ShareFetch's `acquired_records`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquiredRange {
    pub first: i64,
    pub last: i64,
    pub delivery_count: u16,
}

/// How many records changed state, by outcome: what the metrics count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareCounts {
    pub acquired: u64,
    /// Of `acquired`, the records delivered before (delivery count above 1).
    pub redelivered: u64,
    pub accepted: u64,
    pub released: u64,
    pub rejected: u64,
    pub archived: u64,
}

impl ShareCounts {
    pub fn add(&mut self, other: ShareCounts) {
        self.acquired += other.acquired;
        self.redelivered += other.redelivered;
        self.accepted += other.accepted;
        self.released += other.released;
        self.rejected += other.rejected;
        self.archived += other.archived;
    }

    /// The counts by outcome, as the metrics name them.
    pub fn by_outcome(&self) -> [(&'static str, u64); 6] {
        [
            ("acquired", self.acquired),
            ("redelivered", self.redelivered),
            ("accepted", self.accepted),
            ("released", self.released),
            ("rejected", self.rejected),
            ("archived", self.archived),
        ]
    }
}

/// The durable part of a share partition, compact: the SPSO and runs of equal state. Bounded
/// by the window, so at most `max_record_locks` runs whatever the partition's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareSnapshot {
    /// Bumped by each owner that loads the snapshot, as Kafka's state epoch.
    pub state_epoch: i32,
    pub start_offset: i64,
    pub batches: Vec<StateBatch>,
}

/// `state`: 0 available, 2 acknowledged, 4 archived (Kafka's RecordState ids; acquired (1) is
/// never stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateBatch {
    pub first: i64,
    pub last: i64,
    pub state: i8,
    pub delivery_count: u16,
}

/// One share partition's window.
#[derive(Debug, Clone)]
pub struct SharePartition {
    start: i64,
    slots: VecDeque<Slot>,
    limits: ShareLimits,
    state_epoch: i32,
}

impl SharePartition {
    /// A share partition no one has consumed yet, starting at `start` (the log's start or its
    /// high watermark, by `share.auto.offset.reset`).
    pub fn new(start: i64, limits: ShareLimits) -> Self {
        Self {
            start,
            slots: VecDeque::new(),
            limits,
            state_epoch: 0,
        }
    }

    /// The share-partition start offset: everything below it is done.
    pub fn start_offset(&self) -> i64 {
        self.start
    }

    /// One past the last offset ever delivered.
    pub fn end_offset(&self) -> i64 {
        self.start + self.slots.len() as i64
    }

    pub fn state_epoch(&self) -> i32 {
        self.state_epoch
    }

    pub fn limits(&self) -> ShareLimits {
        self.limits
    }

    /// The limits from now on: a group's own configs (`share.record.lock.duration.ms`,
    /// `share.delivery.count.limit`, `share.partition.max.record.locks`) may change while the
    /// partition is in memory. A lower record-lock limit than the window already holds only
    /// stops acquisition of new records until the start offset moves.
    pub fn set_limits(&mut self, limits: ShareLimits) {
        self.limits = limits;
    }

    /// The state of `offset`, if it is in the window.
    pub fn state(&self, offset: i64) -> Option<(&RecordState, u16)> {
        let slot = self.slot(offset)?;
        Some((&slot.state, slot.delivery_count))
    }

    fn slot(&self, offset: i64) -> Option<&Slot> {
        let i = usize::try_from(offset.checked_sub(self.start)?).ok()?;
        self.slots.get(i)
    }

    /// Records acquired right now, by anyone.
    pub fn acquired_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.state, RecordState::Acquired { .. }))
            .count()
    }

    /// Records not yet done up to `high_watermark`: the backlog of the group on this partition.
    pub fn backlog(&self, high_watermark: i64) -> u64 {
        let in_window = self
            .slots
            .iter()
            .filter(|s| {
                matches!(
                    s.state,
                    RecordState::Available | RecordState::Acquired { .. }
                )
            })
            .count() as u64;
        let beyond = u64::try_from(high_watermark - self.end_offset()).unwrap_or(0);
        in_window + beyond
    }

    /// Releases every lock whose deadline is at or before `now`.
    pub fn expire_locks(&mut self, now: Duration) -> ShareCounts {
        let limit = self.limits.delivery_count_limit;
        let mut counts = ShareCounts::default();
        for slot in &mut self.slots {
            if let RecordState::Acquired { deadline, .. } = &slot.state {
                if *deadline <= now {
                    release(slot, limit, &mut counts);
                }
            }
        }
        self.advance();
        counts
    }

    /// The earliest lock deadline, for a fetch waiting on records to become available.
    pub fn next_lock_deadline(&self) -> Option<Duration> {
        self.slots
            .iter()
            .filter_map(|s| match &s.state {
                RecordState::Acquired { deadline, .. } => Some(*deadline),
                _ => None,
            })
            .min()
    }

    /// Moves the SPSO up to the log start: records deleted by retention can no longer be
    /// delivered, so they count as archived.
    pub fn skip_to(&mut self, log_start: i64) {
        while self.start < log_start {
            if self.slots.pop_front().is_none() {
                self.start = log_start;
                return;
            }
            self.start += 1;
        }
    }

    /// Where the next read of the log should start: the first available record in the window,
    /// or the end offset if the window has room. None: nothing to acquire now.
    pub fn next_fetch_offset(&self) -> Option<i64> {
        if let Some(i) = self
            .slots
            .iter()
            .position(|s| s.state == RecordState::Available)
        {
            return Some(self.start + i as i64);
        }
        (self.slots.len() < self.limits.max_record_locks).then(|| self.end_offset())
    }

    /// Acquires for `member` the available records of `batches` (in offset order, as read
    /// from the log), up to `max_records`. The offsets of batches not delivered enter the
    /// window done (archived, never delivered), as gaps do, so a transaction marker or an
    /// aborted record never waits for an acknowledgement. Returns, per batch, whether it holds
    /// an acquired record (only those are sent), the acquired ranges, and the counts.
    pub fn acquire(
        &mut self,
        member: &Arc<str>,
        batches: &[BatchSpan],
        max_records: usize,
        now: Duration,
    ) -> (Vec<bool>, Vec<AcquiredRange>, ShareCounts) {
        let deadline = now + self.limits.lock_duration;
        let mut ranges: Vec<AcquiredRange> = Vec::new();
        let mut used = Vec::with_capacity(batches.len());
        let mut taken = 0usize;
        let mut redelivered = 0u64;
        let mut archived = 0u64;
        for &BatchSpan {
            base,
            last,
            deliver,
        } in batches
        {
            let mut any = false;
            let mut offset = base.max(self.start);
            if !deliver {
                // Not records to anyone: done without a delivery. Bounded by the window like
                // everything else, and not counted against `max_records`.
                while offset <= last {
                    let end = self.end_offset();
                    if offset >= end {
                        if self.slots.len() >= self.limits.max_record_locks {
                            break;
                        }
                        self.slots.push_back(Slot {
                            state: RecordState::Archived,
                            delivery_count: 0,
                        });
                        if offset > end {
                            // A gap before the batch, filled first.
                            continue;
                        }
                    } else if let Some(slot) = self.slots.get_mut((offset - self.start) as usize) {
                        // Delivered before under another isolation level and given back since.
                        if slot.state == RecordState::Available {
                            slot.state = RecordState::Archived;
                            archived += 1;
                        }
                    }
                    offset += 1;
                }
                used.push(false);
                continue;
            }
            while offset <= last && taken < max_records {
                let end = self.end_offset();
                if offset > end {
                    // Offsets between batches hold no records (compacted away): nothing to
                    // deliver, so they enter the window already done.
                    if self.slots.len() >= self.limits.max_record_locks {
                        break;
                    }
                    self.slots.push_back(Slot {
                        state: RecordState::Archived,
                        delivery_count: 0,
                    });
                    continue;
                }
                if offset == end {
                    if self.slots.len() >= self.limits.max_record_locks {
                        break;
                    }
                    self.slots.push_back(Slot {
                        state: RecordState::Available,
                        delivery_count: 0,
                    });
                }
                let i = (offset - self.start) as usize;
                if let Some(slot) = self.slots.get_mut(i) {
                    if slot.state == RecordState::Available {
                        slot.state = RecordState::Acquired {
                            member: Arc::clone(member),
                            deadline,
                        };
                        slot.delivery_count = slot.delivery_count.saturating_add(1);
                        taken += 1;
                        if slot.delivery_count > 1 {
                            redelivered += 1;
                        }
                        any = true;
                        match ranges.last_mut() {
                            Some(r)
                                if r.last + 1 == offset
                                    && r.delivery_count == slot.delivery_count =>
                            {
                                r.last = offset;
                            }
                            _ => ranges.push(AcquiredRange {
                                first: offset,
                                last: offset,
                                delivery_count: slot.delivery_count,
                            }),
                        }
                    }
                }
                offset += 1;
            }
            used.push(any);
        }
        self.advance();
        let counts = ShareCounts {
            acquired: taken as u64,
            redelivered,
            archived,
            ..ShareCounts::default()
        };
        (used, ranges, counts)
    }

    /// Applies one acknowledgement batch of `member`: all of it or, on error, nothing.
    /// `types` is one type for the whole range or one per offset.
    pub fn acknowledge(
        &mut self,
        member: &str,
        first: i64,
        last: i64,
        types: &[i8],
    ) -> Result<ShareCounts, ShareAckError> {
        let len = last
            .checked_sub(first)
            .and_then(|d| d.checked_add(1))
            .filter(|n| *n > 0)
            .ok_or(ShareAckError::InvalidRequest(first, last))?;
        let parsed: Vec<AckType> = types
            .iter()
            .map(|t| AckType::from_code(*t))
            .collect::<Option<_>>()
            .ok_or(ShareAckError::InvalidRequest(first, last))?;
        if parsed.is_empty() || (parsed.len() != 1 && parsed.len() as i64 != len) {
            return Err(ShareAckError::InvalidRequest(first, last));
        }
        if first < self.start || last >= self.end_offset() {
            return Err(ShareAckError::InvalidRecordState(first, last));
        }
        let lo = (first - self.start) as usize;
        let hi = (last - self.start) as usize;
        let held = self.slots.range(lo..=hi).all(|s| match &s.state {
            RecordState::Acquired { member: m, .. } => m.as_ref() == member,
            // A gap the window already archived may be acknowledged as a gap again.
            RecordState::Archived => s.delivery_count == 0,
            _ => false,
        });
        if !held {
            return Err(ShareAckError::InvalidRecordState(first, last));
        }
        let limit = self.limits.delivery_count_limit;
        let mut counts = ShareCounts::default();
        for (k, slot) in self.slots.range_mut(lo..=hi).enumerate() {
            let ack = if parsed.len() == 1 {
                parsed[0]
            } else {
                parsed[k]
            };
            if !matches!(slot.state, RecordState::Acquired { .. }) {
                continue;
            }
            match ack {
                AckType::Accept => {
                    slot.state = RecordState::Acknowledged;
                    counts.accepted += 1;
                }
                AckType::Release => release(slot, limit, &mut counts),
                AckType::Reject => {
                    slot.state = RecordState::Archived;
                    counts.rejected += 1;
                }
                AckType::Gap => slot.state = RecordState::Archived,
            }
        }
        self.advance();
        Ok(counts)
    }

    /// Releases every record `member` holds (its share session closed, or it left).
    pub fn release_member(&mut self, member: &str) -> ShareCounts {
        let limit = self.limits.delivery_count_limit;
        let mut counts = ShareCounts::default();
        for slot in &mut self.slots {
            if matches!(&slot.state, RecordState::Acquired { member: m, .. } if m.as_ref() == member)
            {
                release(slot, limit, &mut counts);
            }
        }
        self.advance();
        counts
    }

    /// Moves the SPSO over the done prefix of the window.
    fn advance(&mut self) {
        while let Some(front) = self.slots.front() {
            if !matches!(
                front.state,
                RecordState::Acknowledged | RecordState::Archived
            ) {
                break;
            }
            self.slots.pop_front();
            self.start += 1;
        }
    }

    /// The durable state. Acquired records are stored as available (with their delivery
    /// count): a new owner offers them again.
    pub fn snapshot(&self) -> ShareSnapshot {
        let mut batches: Vec<StateBatch> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let offset = self.start + i as i64;
            let state = match slot.state {
                RecordState::Available | RecordState::Acquired { .. } => 0,
                RecordState::Acknowledged => 2,
                RecordState::Archived => 4,
            };
            match batches.last_mut() {
                Some(b)
                    if b.last + 1 == offset
                        && b.state == state
                        && b.delivery_count == slot.delivery_count =>
                {
                    b.last = offset;
                }
                _ => batches.push(StateBatch {
                    first: offset,
                    last: offset,
                    state,
                    delivery_count: slot.delivery_count,
                }),
            }
        }
        ShareSnapshot {
            state_epoch: self.state_epoch,
            start_offset: self.start,
            batches,
        }
    }

    /// Rebuilds a share partition from its snapshot, under the next state epoch. Batches past
    /// the window bound or out of order are ignored (the snapshot came from storage).
    pub fn from_snapshot(snapshot: &ShareSnapshot, limits: ShareLimits) -> Self {
        let mut part = Self::new(snapshot.start_offset, limits);
        part.state_epoch = snapshot.state_epoch.saturating_add(1);
        for b in &snapshot.batches {
            if b.first != part.end_offset() || b.last < b.first {
                break;
            }
            let state = match b.state {
                2 => RecordState::Acknowledged,
                4 => RecordState::Archived,
                _ => RecordState::Available,
            };
            for _ in b.first..=b.last {
                if part.slots.len() >= limits.max_record_locks {
                    break;
                }
                part.slots.push_back(Slot {
                    state: state.clone(),
                    delivery_count: b.delivery_count,
                });
            }
        }
        part.advance();
        part
    }

    /// Moves the SPSO to `offset` (AlterShareGroupOffsets), forgetting the window.
    pub fn reset_to(&mut self, offset: i64) {
        self.slots.clear();
        self.start = offset;
    }
}

fn release(slot: &mut Slot, limit: u16, counts: &mut ShareCounts) {
    if slot.delivery_count >= limit {
        slot.state = RecordState::Archived;
        counts.archived += 1;
    } else {
        slot.state = RecordState::Available;
        counts.released += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ShareLimits {
        ShareLimits {
            max_record_locks: 10,
            lock_duration: Duration::from_secs(30),
            delivery_count_limit: 3,
        }
    }

    /// Batches of records, all delivered.
    fn spans(ranges: &[(i64, i64)]) -> Vec<BatchSpan> {
        ranges
            .iter()
            .map(|&(base, last)| BatchSpan {
                base,
                last,
                deliver: true,
            })
            .collect()
    }

    fn m(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn acquisition_hands_each_record_to_one_member_and_stops_at_the_lock_limit() {
        let mut p = SharePartition::new(0, limits());
        let t = Duration::ZERO;
        let (used, ranges, counts) = p.acquire(&m("a"), &spans(&[(0, 3), (4, 7)]), 5, t);
        assert_eq!(used, vec![true, true]);
        assert_eq!(
            ranges,
            vec![AcquiredRange {
                first: 0,
                last: 4,
                delivery_count: 1
            }]
        );
        assert_eq!(counts.acquired, 5);
        // b reading the same batches gets only what a did not take, and the window stops at 10.
        assert_eq!(p.next_fetch_offset(), Some(5));
        let (used, ranges, _) = p.acquire(&m("b"), &spans(&[(4, 7), (8, 15)]), 100, t);
        assert_eq!(used, vec![true, true]);
        assert_eq!(
            ranges,
            vec![AcquiredRange {
                first: 5,
                last: 9,
                delivery_count: 1
            }]
        );
        assert_eq!(p.end_offset(), 10);
        assert_eq!(p.next_fetch_offset(), None);
        let (used, ranges, _) = p.acquire(&m("c"), &spans(&[(8, 15)]), 100, t);
        assert_eq!(used, vec![false]);
        assert!(ranges.is_empty());
    }

    #[test]
    fn an_expired_lock_makes_records_available_again_with_a_higher_delivery_count() {
        let mut p = SharePartition::new(0, limits());
        p.acquire(&m("a"), &spans(&[(0, 1)]), 10, Duration::from_secs(1));
        assert_eq!(p.next_lock_deadline(), Some(Duration::from_secs(31)));
        assert_eq!(p.expire_locks(Duration::from_secs(30)).released, 0);
        assert_eq!(p.next_fetch_offset(), Some(2));
        assert_eq!(p.expire_locks(Duration::from_secs(31)).released, 2);
        assert_eq!(p.next_fetch_offset(), Some(0));
        // The dead member's late acknowledgement is refused; b gets them on delivery 2.
        assert_eq!(
            p.acknowledge("a", 0, 1, &[1]),
            Err(ShareAckError::InvalidRecordState(0, 1))
        );
        let (_, ranges, counts) = p.acquire(
            &m("b"),
            &spans(&[(0, 1), (2, 2)]),
            10,
            Duration::from_secs(31),
        );
        assert_eq!(
            ranges,
            vec![
                AcquiredRange {
                    first: 0,
                    last: 1,
                    delivery_count: 2
                },
                AcquiredRange {
                    first: 2,
                    last: 2,
                    delivery_count: 1
                }
            ]
        );
        // Three acquired, two of them delivered before.
        assert_eq!((counts.acquired, counts.redelivered), (3, 2));
    }

    #[test]
    fn a_record_released_past_the_delivery_count_limit_is_archived() {
        let mut p = SharePartition::new(0, limits());
        for round in 1..=3u16 {
            let (_, ranges, _) = p.acquire(&m("a"), &spans(&[(0, 0)]), 10, Duration::ZERO);
            assert_eq!(ranges[0].delivery_count, round);
            let counts = p.acknowledge("a", 0, 0, &[2]).unwrap();
            assert_eq!(counts.archived, u64::from(round == 3));
        }
        assert_eq!(p.start_offset(), 1, "the archived poison record is done");
        let (_, ranges, _) = p.acquire(&m("a"), &spans(&[(0, 0)]), 10, Duration::ZERO);
        assert!(ranges.is_empty());
    }

    #[test]
    fn batches_not_delivered_are_done_without_a_delivery_and_cost_no_record_budget() {
        let mut p = SharePartition::new(0, limits());
        let span = |base, last, deliver| BatchSpan {
            base,
            last,
            deliver,
        };
        // An aborted record, its marker, three records, a gap, and a commit marker.
        let batches = [
            span(0, 0, false),
            span(1, 1, false),
            span(2, 4, true),
            span(6, 6, false),
        ];
        let (used, ranges, counts) = p.acquire(&m("a"), &batches, 3, Duration::ZERO);
        assert_eq!(used, vec![false, false, true, false]);
        assert_eq!(
            ranges,
            vec![AcquiredRange {
                first: 2,
                last: 4,
                delivery_count: 1
            }]
        );
        assert_eq!((counts.acquired, counts.archived), (3, 0));
        assert_eq!(
            p.start_offset(),
            2,
            "the aborted record and its marker are done"
        );
        assert_eq!(
            p.end_offset(),
            7,
            "the gap and the marker past the records too"
        );
        p.acknowledge("a", 2, 4, &[1]).unwrap();
        assert_eq!(p.start_offset(), 7);

        // A record delivered and given back, then read as not delivered (the group switched to
        // read_committed and it was aborted), is archived rather than offered again.
        let mut q = SharePartition::new(0, limits());
        q.acquire(&m("a"), &spans(&[(0, 1)]), 10, Duration::ZERO);
        q.acknowledge("a", 0, 1, &[2]).unwrap();
        let (used, ranges, counts) = q.acquire(&m("b"), &[span(0, 1, false)], 10, Duration::ZERO);
        assert_eq!((used, ranges, counts.archived), (vec![false], vec![], 2));
        assert_eq!(q.start_offset(), 2);
    }

    #[test]
    fn a_groups_own_limits_apply_from_the_next_acquisition() {
        let mut p = SharePartition::new(0, limits());
        p.set_limits(ShareLimits {
            max_record_locks: 2,
            delivery_count_limit: 1,
            ..limits()
        });
        let (_, ranges, _) = p.acquire(&m("a"), &spans(&[(0, 4)]), 10, Duration::ZERO);
        assert_eq!(ranges[0].last, 1, "two record locks at most");
        let counts = p.acknowledge("a", 0, 1, &[2]).unwrap();
        assert_eq!(
            counts.archived, 2,
            "one delivery at most: released means archived"
        );
        assert_eq!(p.start_offset(), 2);
    }

    #[test]
    fn the_start_offset_advances_only_over_the_done_prefix() {
        let mut p = SharePartition::new(100, limits());
        p.acquire(&m("a"), &spans(&[(100, 104)]), 10, Duration::ZERO);
        p.acknowledge("a", 101, 102, &[1]).unwrap();
        assert_eq!(p.start_offset(), 100);
        p.acknowledge("a", 100, 100, &[3]).unwrap();
        assert_eq!(p.start_offset(), 103);
        p.acknowledge("a", 103, 104, &[1, 2]).unwrap();
        assert_eq!(p.start_offset(), 104);
        assert_eq!(p.next_fetch_offset(), Some(104));
        assert_eq!(p.backlog(110), 6);
    }

    #[test]
    fn an_acknowledgement_spanning_batches_is_applied_whole_or_not_at_all() {
        let mut p = SharePartition::new(0, limits());
        p.acquire(&m("a"), &spans(&[(0, 2), (3, 5)]), 10, Duration::ZERO);
        p.acquire(&m("b"), &spans(&[(6, 7)]), 10, Duration::ZERO);
        // 2..=6 crosses into b's records: refused, nothing changes.
        assert_eq!(
            p.acknowledge("a", 2, 6, &[1]),
            Err(ShareAckError::InvalidRecordState(2, 6))
        );
        assert!(matches!(
            p.state(2),
            Some((RecordState::Acquired { .. }, 1))
        ));
        assert_eq!(
            p.acknowledge("a", 0, 5, &[1, 1]),
            Err(ShareAckError::InvalidRequest(0, 5))
        );
        let counts = p.acknowledge("a", 0, 5, &[1, 1, 3, 1, 2, 1]).unwrap();
        assert_eq!(
            (counts.accepted, counts.rejected, counts.released),
            (4, 1, 1)
        );
        assert_eq!(p.start_offset(), 4);
        assert_eq!(p.next_fetch_offset(), Some(4));
    }

    #[test]
    fn a_closed_session_gives_back_only_its_members_records() {
        let mut p = SharePartition::new(0, limits());
        p.acquire(&m("a"), &spans(&[(0, 1)]), 10, Duration::ZERO);
        p.acquire(&m("b"), &spans(&[(2, 3)]), 10, Duration::ZERO);
        assert_eq!(p.release_member("b").released, 2);
        assert_eq!(p.next_fetch_offset(), Some(2));
        assert_eq!(p.acquired_count(), 2);
    }

    #[test]
    fn a_snapshot_keeps_decisions_and_delivery_counts_but_not_acquisitions() {
        let mut p = SharePartition::new(10, limits());
        p.acquire(&m("a"), &spans(&[(10, 16)]), 10, Duration::ZERO);
        p.acknowledge("a", 11, 12, &[1]).unwrap();
        p.acknowledge("a", 13, 13, &[3]).unwrap();
        p.acknowledge("a", 14, 14, &[2]).unwrap();
        let snap = p.snapshot();
        assert_eq!(snap.start_offset, 10);
        let json = serde_json::to_vec(&snap).unwrap();
        let back: ShareSnapshot = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, snap);
        assert_eq!(
            back.batches,
            vec![
                StateBatch {
                    first: 10,
                    last: 10,
                    state: 0,
                    delivery_count: 1
                },
                StateBatch {
                    first: 11,
                    last: 12,
                    state: 2,
                    delivery_count: 1
                },
                StateBatch {
                    first: 13,
                    last: 13,
                    state: 4,
                    delivery_count: 1
                },
                StateBatch {
                    first: 14,
                    last: 16,
                    state: 0,
                    delivery_count: 1
                },
            ]
        );
        let mut q = SharePartition::from_snapshot(&back, limits());
        assert_eq!(q.state_epoch(), 1);
        assert_eq!(q.end_offset(), 17);
        // 10 and 14..=16 come back (10 was still acquired at the snapshot), 11..=13 never do.
        let (_, ranges, _) = q.acquire(&m("b"), &spans(&[(10, 20)]), 100, Duration::ZERO);
        assert_eq!(
            ranges,
            vec![
                AcquiredRange {
                    first: 10,
                    last: 10,
                    delivery_count: 2
                },
                AcquiredRange {
                    first: 14,
                    last: 16,
                    delivery_count: 2
                },
                AcquiredRange {
                    first: 17,
                    last: 19,
                    delivery_count: 1
                },
            ]
        );
    }

    #[test]
    fn retention_moves_the_start_offset_past_deleted_records() {
        let mut p = SharePartition::new(0, limits());
        p.acquire(&m("a"), &spans(&[(0, 4)]), 10, Duration::ZERO);
        p.skip_to(3);
        assert_eq!(p.start_offset(), 3);
        assert_eq!(p.end_offset(), 5);
        p.skip_to(8);
        assert_eq!((p.start_offset(), p.end_offset()), (8, 8));
    }
}
