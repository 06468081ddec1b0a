//! Checkers over the history and the final read-back. Each one counts anomalies and keeps a few
//! examples precise enough to find the events in the history file.
//!
//! Why these hold for Strata: offsets are assigned densely under the partition's lock and only
//! durable batches become readable, records are never deleted here (no retention, no
//! DeleteRecords), and the producers are idempotent, so the log of every partition must be
//! exactly 0..high watermark with each value once, and every acknowledged value at its
//! acknowledged offset. A write that failed (not acknowledged) may be stored or not, but at most
//! once, and its absence leaves no hole: the writer that failed to make it durable stops
//! accepting appends rather than assign the next offset past it.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{Entry, Event};
use crate::readback::PartitionLog;

const EXAMPLES_KEPT: usize = 5;

pub struct Check {
    pub name: &'static str,
    pub what: &'static str,
    pub checked: usize,
    pub anomalies: usize,
    pub examples: Vec<String>,
}

impl Check {
    fn new(name: &'static str, what: &'static str) -> Self {
        Self {
            name,
            what,
            checked: 0,
            anomalies: 0,
            examples: Vec::new(),
        }
    }

    fn fail(&mut self, example: String) {
        self.anomalies += 1;
        if self.examples.len() < EXAMPLES_KEPT {
            self.examples.push(example);
        }
    }
}

/// What the history says about writes, counted for the report.
#[derive(Default)]
pub struct Counts {
    pub sent: usize,
    pub acked: usize,
    pub failed: usize,
    pub failed_but_stored: usize,
    pub producer_fatal: usize,
    pub reads: usize,
    pub commits_ok: usize,
    pub commits_failed: usize,
    pub rebalances: usize,
    pub client_errors: usize,
    pub stored: usize,
}

pub fn check(
    history: &[Entry],
    logs: &BTreeMap<i32, PartitionLog>,
    partitions: i32,
) -> (Vec<Check>, Counts) {
    let mut counts = Counts::default();
    let mut sent: HashMap<&str, i32> = HashMap::new();
    let mut acked: Vec<(&str, i32, i64, u64)> = Vec::new();
    let mut failed: HashSet<&str> = HashSet::new();
    for entry in history {
        match &entry.event {
            Event::Send {
                value, partition, ..
            } => {
                counts.sent += 1;
                sent.insert(value, *partition);
            }
            Event::Ack {
                value,
                partition,
                offset,
            } => {
                counts.acked += 1;
                acked.push((value, *partition, *offset, entry.at_ms));
            }
            Event::SendFailed { value, .. } => {
                counts.failed += 1;
                failed.insert(value);
            }
            Event::ProducerFatal { .. } => counts.producer_fatal += 1,
            Event::Read { .. } => counts.reads += 1,
            Event::Commit { ok: true, .. } => counts.commits_ok += 1,
            Event::Commit { ok: false, .. } => counts.commits_failed += 1,
            Event::Rebalance { .. } => counts.rebalances += 1,
            Event::ClientError { .. } => counts.client_errors += 1,
            _ => {}
        }
    }

    // The final log, by place and by value.
    let mut at: HashMap<(i32, i64), &str> = HashMap::new();
    let mut places: HashMap<&str, Vec<(i32, i64)>> = HashMap::new();
    let mut readable = Check::new(
        "readable",
        "the final read reaches every partition's high watermark without errors",
    );
    let mut dense = Check::new(
        "dense",
        "final read: offsets run 0, 1, 2, ... up to the high watermark, log start 0",
    );
    for partition in 0..partitions {
        readable.checked += 1;
        dense.checked += 1;
        let Some(log) = logs.get(&partition) else {
            readable.fail(format!("partition {partition}: not read at all"));
            continue;
        };
        for error in &log.errors {
            readable.fail(format!("partition {partition}: {error}"));
        }
        if !log.complete() {
            readable.fail(format!(
                "partition {partition}: read {} records, last offset {:?}, high watermark {}",
                log.records.len(),
                log.records.last().map(|(o, _)| *o),
                log.high
            ));
        }
        if log.low != 0 {
            dense.fail(format!(
                "partition {partition}: log start {} although nothing was deleted",
                log.low
            ));
        }
        let mut expected = 0;
        for (offset, value) in &log.records {
            if *offset != expected {
                dense.fail(format!(
                    "partition {partition}: offset {offset} follows {} (value {value:?})",
                    expected - 1
                ));
            }
            expected = offset + 1;
            at.insert((partition, *offset), value);
            places.entry(value).or_default().push((partition, *offset));
            counts.stored += 1;
        }
    }
    if let Some(errors) = logs.get(&-1) {
        for error in &errors.errors {
            readable.fail(format!("read-back consumer: {error}"));
        }
    }

    let mut lost = Check::new(
        "no lost write",
        "every acknowledged value is in the final read",
    );
    let mut acked_place = Check::new(
        "acked place",
        "each acknowledged offset holds exactly the acknowledged value",
    );
    for (value, partition, offset, at_ms) in &acked {
        lost.checked += 1;
        if !places.contains_key(value) {
            lost.fail(format!(
                "{value} acknowledged at {partition}/{offset} (t={at_ms} ms) is not stored"
            ));
        }
        if *offset < 0 {
            // Acknowledged without an offset (librdkafka's -1001): an idempotent producer
            // whose later batch of the partition was acknowledged counts the earlier ones it
            // never got an answer for as stored ("implied acknowledgement"), the broker having
            // appended in sequence order. There is no place to check; "no lost write" still
            // requires the value in the log.
            continue;
        }
        acked_place.checked += 1;
        match at.get(&(*partition, *offset)) {
            Some(stored) if stored == value => {}
            other => acked_place.fail(format!(
                "{value} acknowledged at {partition}/{offset} (t={at_ms} ms), but that offset \
                 holds {other:?}"
            )),
        }
    }

    let mut duplicate = Check::new("no duplicate", "no value is stored at two offsets");
    let mut phantom = Check::new(
        "no phantom",
        "every stored value was sent, to the partition it is stored in",
    );
    for (value, where_) in &places {
        duplicate.checked += 1;
        phantom.checked += 1;
        if where_.len() > 1 {
            duplicate.fail(format!("{value} stored at {where_:?}"));
        }
        match sent.get(value) {
            Some(partition) if where_.iter().all(|(p, _)| p == partition) => {}
            Some(partition) => phantom.fail(format!(
                "{value} sent to partition {partition} but stored at {where_:?}"
            )),
            None => phantom.fail(format!("{value} stored at {where_:?} was never sent")),
        }
        if failed.contains(value) {
            counts.failed_but_stored += 1;
        }
    }

    let (skips, read_matches) = check_reads(history, &at);
    let commits = check_commits(history);
    (
        vec![
            lost,
            acked_place,
            duplicate,
            phantom,
            dense,
            readable,
            skips,
            read_matches,
            commits.0,
            commits.1,
        ],
        counts,
    )
}

/// Group members' reads: no forward jump within a session (one assignment of a member), and
/// every value read is the one the final log holds at that offset.
fn check_reads(history: &[Entry], at: &HashMap<(i32, i64), &str>) -> (Check, Check) {
    let mut skips = Check::new(
        "no poll skip",
        "a member's reads of a partition within one assignment never jump forward",
    );
    let mut matches = Check::new(
        "reads match",
        "every value a member read is the value the final read finds at that offset",
    );
    let mut last: HashMap<(usize, u64, i32), i64> = HashMap::new();
    for entry in history {
        let Event::Read {
            member,
            session,
            partition,
            offset,
            value,
        } = &entry.event
        else {
            continue;
        };
        skips.checked += 1;
        matches.checked += 1;
        if let Some(previous) = last.insert((*member, *session, *partition), *offset) {
            if *offset > previous + 1 {
                skips.fail(format!(
                    "member {member} session {session}: {partition}/{previous} then \
                     {partition}/{offset} (t={} ms)",
                    entry.at_ms
                ));
            }
        }
        match at.get(&(*partition, *offset)) {
            Some(stored) if stored == value => {}
            other => matches.fail(format!(
                "member {member} read {value:?} at {partition}/{offset} (t={} ms); the final \
                 read has {other:?}",
                entry.at_ms
            )),
        }
    }
    (skips, matches)
}

/// Committed offsets: never observed to go backwards, and none acknowledged lost.
fn check_commits(history: &[Entry]) -> (Check, Check) {
    let mut monotonic = Check::new(
        "commit monotonic",
        "the group's committed offset of each partition never goes backwards",
    );
    let mut kept = Check::new(
        "commit kept",
        "the final committed offset is at least every acknowledged commit",
    );
    let mut observed: HashMap<i32, (i64, u64)> = HashMap::new();
    let mut best_acked: BTreeMap<i32, (i64, u64)> = BTreeMap::new();
    for entry in history {
        match &entry.event {
            Event::Committed { partition, offset } => {
                monotonic.checked += 1;
                if let Some((previous, when)) = observed.insert(*partition, (*offset, entry.at_ms))
                {
                    if *offset < previous {
                        monotonic.fail(format!(
                            "partition {partition}: committed {previous} at t={when} ms, then \
                             {offset} at t={} ms",
                            entry.at_ms
                        ));
                    }
                }
            }
            Event::Commit {
                partition,
                offset,
                ok: true,
                ..
            } => {
                let best = best_acked
                    .entry(*partition)
                    .or_insert((*offset, entry.at_ms));
                if *offset > best.0 {
                    *best = (*offset, entry.at_ms);
                }
            }
            _ => {}
        }
    }
    // Without a final look, the last observed offsets predate later commits: comparing them
    // would report lost commits that may not be lost. The failure itself is the anomaly.
    let final_look_failed = history.iter().find_map(|entry| match &entry.event {
        Event::ClientError { who, error }
            if who == crate::workload::OBSERVER
                && error.starts_with(crate::workload::FINAL_LOOK_FAILED) =>
        {
            Some(error.clone())
        }
        _ => None,
    });
    if let Some(error) = final_look_failed {
        kept.checked += 1;
        kept.fail(format!(
            "the final committed offsets are unknown (OffsetFetch kept failing after the \
             faults): {error}"
        ));
        return (monotonic, kept);
    }
    for (partition, (offset, when)) in best_acked {
        kept.checked += 1;
        let last = observed.get(&partition).map(|(o, _)| *o);
        if last.is_none_or(|last| last < offset) {
            kept.fail(format!(
                "partition {partition}: commit of {offset} acknowledged at t={when} ms, final \
                 committed offset {last:?}"
            ));
        }
    }
    (monotonic, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at_ms: u64, event: Event) -> Entry {
        Entry { at_ms, event }
    }

    fn send(value: &str, partition: i32) -> Event {
        Event::Send {
            producer: "p0.0".to_string(),
            value: value.to_string(),
            partition,
        }
    }

    fn ack(value: &str, partition: i32, offset: i64) -> Event {
        Event::Ack {
            value: value.to_string(),
            partition,
            offset,
        }
    }

    fn log(records: &[(i64, &str)]) -> BTreeMap<i32, PartitionLog> {
        let high = records.last().map_or(0, |(o, _)| o + 1);
        BTreeMap::from([(
            0,
            PartitionLog {
                low: 0,
                high,
                records: records.iter().map(|(o, v)| (*o, v.to_string())).collect(),
                errors: Vec::new(),
            },
        )])
    }

    fn anomalies(checks: &[Check]) -> BTreeMap<&'static str, usize> {
        checks
            .iter()
            .filter(|c| c.anomalies > 0)
            .map(|c| (c.name, c.anomalies))
            .collect()
    }

    fn writes(values: &[&str]) -> Vec<Entry> {
        let mut history = Vec::new();
        for (offset, value) in values.iter().enumerate() {
            history.push(at(0, send(value, 0)));
            history.push(at(1, ack(value, 0, offset as i64)));
        }
        history
    }

    #[test]
    fn a_clean_history_has_no_anomaly() {
        let history = writes(&["a", "b", "c"]);
        let (checks, counts) = check(&history, &log(&[(0, "a"), (1, "b"), (2, "c")]), 1);
        assert_eq!(anomalies(&checks), BTreeMap::new());
        assert_eq!((counts.sent, counts.acked, counts.stored), (3, 3, 3));
    }

    #[test]
    fn a_hole_in_the_final_read_is_a_lost_write_and_a_gap() {
        // What seed 2 found: offsets readable during the run, missing from the final read.
        let mut history = writes(&["a", "b", "c"]);
        history.push(at(
            2,
            Event::Read {
                member: 0,
                session: 1,
                partition: 0,
                offset: 1,
                value: "b".to_string(),
            },
        ));
        let (checks, _) = check(&history, &log(&[(0, "a"), (2, "c")]), 1);
        assert_eq!(
            anomalies(&checks),
            BTreeMap::from([
                ("no lost write", 1),
                ("acked place", 1),
                ("dense", 1),
                ("reads match", 1)
            ])
        );
    }

    #[test]
    fn an_acknowledgement_without_an_offset_is_checked_for_loss_not_place() {
        // CI seed 3 on S3: librdkafka acknowledged three records at -1001 after a later batch
        // of theirs was acknowledged; they were stored once each.
        let mut history = writes(&["a", "b"]);
        history.push(at(0, send("c", 0)));
        history.push(at(1, ack("c", 0, -1001)));
        history.push(at(0, send("d", 0)));
        history.push(at(1, ack("d", 0, -1001)));
        let (checks, counts) = check(&history, &log(&[(0, "a"), (1, "b"), (2, "c")]), 1);
        assert_eq!(anomalies(&checks), BTreeMap::from([("no lost write", 1)]));
        assert_eq!(counts.acked, 4);
        let place = checks.iter().find(|c| c.name == "acked place").unwrap();
        assert_eq!(place.checked, 2);
    }

    #[test]
    fn a_value_at_two_offsets_or_never_sent_is_flagged() {
        let history = writes(&["a", "b"]);
        let (checks, _) = check(&history, &log(&[(0, "a"), (1, "b"), (2, "a"), (3, "x")]), 1);
        assert_eq!(
            anomalies(&checks),
            BTreeMap::from([("no duplicate", 1), ("no phantom", 1)])
        );
    }

    #[test]
    fn a_failed_write_may_be_stored_once_without_anomaly() {
        let mut history = writes(&["a"]);
        history.push(at(2, send("b", 0)));
        history.push(at(
            3,
            Event::SendFailed {
                value: "b".to_string(),
                error: "timed out".to_string(),
            },
        ));
        let (checks, counts) = check(&history, &log(&[(0, "a"), (1, "b")]), 1);
        assert_eq!(anomalies(&checks), BTreeMap::new());
        assert_eq!(counts.failed_but_stored, 1);
    }

    #[test]
    fn a_read_past_the_next_offset_within_a_session_is_a_skip_but_not_across_sessions() {
        let mut history = writes(&["a", "b", "c"]);
        let read = |session, offset: i64, value: &str| Event::Read {
            member: 0,
            session,
            partition: 0,
            offset,
            value: value.to_string(),
        };
        history.push(at(5, read(1, 0, "a")));
        history.push(at(6, read(1, 2, "c")));
        history.push(at(7, read(2, 0, "a")));
        history.push(at(8, read(3, 2, "c")));
        let (checks, _) = check(&history, &log(&[(0, "a"), (1, "b"), (2, "c")]), 1);
        assert_eq!(anomalies(&checks), BTreeMap::from([("no poll skip", 1)]));
    }

    #[test]
    fn committed_offsets_going_back_or_below_an_acknowledged_commit_are_flagged() {
        let mut history = writes(&["a"]);
        let committed = |offset| Event::Committed {
            partition: 0,
            offset,
        };
        history.push(at(
            5,
            Event::Commit {
                member: 0,
                partition: 0,
                offset: 9,
                ok: true,
                error: None,
            },
        ));
        history.push(at(6, committed(9)));
        history.push(at(7, committed(4)));
        let (checks, _) = check(&history, &log(&[(0, "a")]), 1);
        assert_eq!(
            anomalies(&checks),
            BTreeMap::from([("commit monotonic", 1), ("commit kept", 1)])
        );
    }

    #[test]
    fn a_failed_final_look_is_one_anomaly_not_lost_commits() {
        let mut history = writes(&["a"]);
        for (partition, offset) in [(0, 9), (1, 9)] {
            history.push(at(
                5,
                Event::Commit {
                    member: 0,
                    partition,
                    offset,
                    ok: true,
                    error: None,
                },
            ));
        }
        history.push(at(
            6,
            Event::Committed {
                partition: 0,
                offset: 4,
            },
        ));
        history.push(at(
            7,
            Event::ClientError {
                who: crate::workload::OBSERVER.to_string(),
                error: format!("{} for 30s: timed out", crate::workload::FINAL_LOOK_FAILED),
            },
        ));
        let (checks, _) = check(&history, &log(&[(0, "a")]), 1);
        assert_eq!(anomalies(&checks), BTreeMap::from([("commit kept", 1)]));
        let kept = checks.iter().find(|c| c.name == "commit kept").unwrap();
        assert!(kept.examples[0].contains("unknown"), "{}", kept.examples[0]);
    }

    #[test]
    fn an_unreadable_partition_is_flagged() {
        let history = writes(&["a", "b"]);
        let mut logs = log(&[(0, "a")]);
        if let Some(partition) = logs.get_mut(&0) {
            partition.high = 2;
        }
        let (checks, _) = check(&history, &logs, 1);
        assert_eq!(
            anomalies(&checks),
            BTreeMap::from([("no lost write", 1), ("acked place", 1), ("readable", 1)])
        );
    }
}
