//! Explaining an anomaly where it is reported: a failed campaign in CI leaves only its printed
//! output behind (the history file and the broker logs stay on that machine), so for each value
//! an anomaly names, print what the history says of it, the records stored around each of its
//! places, and the ownership changes of its partition — enough to tell which owner wrote which
//! copy and what moved in between.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Entry, Event};
use crate::readback::PartitionLog;

/// Records printed on each side of a stored copy of a value.
const NEIGHBOURS: i64 = 3;
/// Broker log lines printed per partition, the latest ones (ownership changes only).
const OWNERSHIP_LINES: usize = 40;
/// Values explained per campaign: the first few examples say enough.
const VALUES_EXPLAINED: usize = 3;

/// The workload's values named in `examples` (`p<producer>.<incarnation>-<sequence>`).
pub fn values_named(examples: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for example in examples {
        for word in example.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-')) {
            if is_value(word) && !found.iter().any(|v| v == word) {
                found.push(word.to_string());
            }
        }
    }
    found.truncate(VALUES_EXPLAINED);
    found
}

fn is_value(word: &str) -> bool {
    let Some(rest) = word.strip_prefix('p') else {
        return false;
    };
    let Some((producer, sequence)) = rest.split_once('-') else {
        return false;
    };
    let Some((id, incarnation)) = producer.split_once('.') else {
        return false;
    };
    [id, incarnation, sequence]
        .iter()
        .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether a broker log line records an ownership change of partition `p` of `topic`.
fn is_ownership_line(line: &str, topic: &str, p: i32) -> bool {
    let named = format!("{topic}-{p}");
    let names_it = line
        .split(|c: char| c.is_whitespace() || c == '=')
        .any(|w| w == named);
    names_it
        && [
            "serving partition",
            "acquired",
            "handed",
            "lost the race",
            "fenced",
            "could not",
            "released",
        ]
        .iter()
        .any(|what| line.contains(what))
}

/// The explanation of `values`, as printable lines. `broker_logs` are each broker's kept log
/// lines, by broker id.
pub fn explain(
    values: &[String],
    history: &[Entry],
    logs: &BTreeMap<i32, PartitionLog>,
    topic: &str,
    broker_logs: &[(i32, Vec<String>)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut partitions = BTreeSet::new();
    for value in values {
        out.push(format!("  {value}:"));
        for entry in history {
            let (mentions, partition) = match &entry.event {
                Event::Send {
                    value: v,
                    partition,
                    ..
                }
                | Event::Ack {
                    value: v,
                    partition,
                    ..
                }
                | Event::Read {
                    value: v,
                    partition,
                    ..
                } => (v == value, Some(*partition)),
                Event::SendFailed { value: v, .. } => (v == value, None),
                _ => (false, None),
            };
            if mentions {
                partitions.extend(partition);
                let event = serde_json::to_string(&entry.event).unwrap_or_default();
                out.push(format!("    t={} ms {event}", entry.at_ms));
            }
        }
        for (p, log) in logs {
            let places: Vec<i64> = log
                .records
                .iter()
                .filter(|(_, v)| v == value)
                .map(|(o, _)| *o)
                .collect();
            for offset in places {
                partitions.insert(*p);
                let around: Vec<String> = log
                    .records
                    .iter()
                    .filter(|(o, _)| (offset - NEIGHBOURS..=offset + NEIGHBOURS).contains(o))
                    .map(|(o, v)| format!("{o}:{v}"))
                    .collect();
                out.push(format!(
                    "    stored at {p}/{offset}, around it: {}",
                    around.join(" ")
                ));
            }
        }
    }
    let faults: Vec<String> = history
        .iter()
        .filter(|e| matches!(e.event, Event::Fault { .. } | Event::FaultDone { .. }))
        .map(|e| {
            let event = serde_json::to_string(&e.event).unwrap_or_default();
            format!("    t={} ms {event}", e.at_ms)
        })
        .collect();
    if !faults.is_empty() {
        out.push("  faults:".to_string());
        out.extend(faults);
    }
    for p in partitions {
        let mut lines: Vec<(String, String)> = broker_logs
            .iter()
            .flat_map(|(id, lines)| {
                lines
                    .iter()
                    .filter(|l| is_ownership_line(l, topic, p))
                    .map(move |l| (timestamp(l).to_string(), format!("    broker {id}: {l}")))
            })
            .collect();
        lines.sort();
        let skip = lines.len().saturating_sub(OWNERSHIP_LINES);
        out.push(format!("  ownership of {topic}-{p} (broker logs):"));
        out.extend(lines.into_iter().skip(skip).map(|(_, l)| l));
    }
    out
}

/// The RFC 3339 time stamp of a broker log line (after the harness's `[#N err]` prefix), for
/// ordering lines of different brokers; empty when there is none.
fn timestamp(line: &str) -> &str {
    line.split_whitespace()
        .find(|w| w.len() > 20 && w.as_bytes()[4] == b'-' && w.contains('T'))
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn finds_the_values_an_example_names() {
        let examples = vec![
            "p0.0-1917 stored at [(1, 959), (1, 1015)]".to_string(),
            "p1.2-5 acknowledged at 3/7 (t=100 ms), but that offset holds Some(\"p0.0-1917\")"
                .to_string(),
        ];
        assert_eq!(values_named(&examples), vec!["p0.0-1917", "p1.2-5"]);
        assert!(values_named(&["partition 1 offset 5".to_string()]).is_empty());
    }

    #[test]
    fn explains_a_duplicate_with_history_neighbours_and_ownership() {
        let history = vec![
            Entry {
                at_ms: 10,
                event: Event::Send {
                    producer: "p0.0".into(),
                    value: "p0.0-2".into(),
                    partition: 1,
                },
            },
            Entry {
                at_ms: 20,
                event: Event::Ack {
                    value: "p0.0-2".into(),
                    partition: 1,
                    offset: 6,
                },
            },
        ];
        let records = (0..10)
            .map(|o| {
                (
                    o,
                    if o == 1 || o == 6 {
                        "p0.0-2".to_string()
                    } else {
                        format!("x{o}")
                    },
                )
            })
            .collect();
        let logs = BTreeMap::from([(
            1,
            PartitionLog {
                low: 0,
                high: 10,
                records,
                errors: Vec::new(),
            },
        )]);
        let broker_logs = vec![
            (
                2,
                vec![
                    "[#1 err] 2026-12-04T16:09:30.000000Z  INFO strata_log::ownership: \
                     serving partition partition=t-1 epoch=3"
                        .to_string(),
                    "[#1 err] 2026-12-04T16:09:31.000000Z  INFO something about t-10 serving partition"
                        .to_string(),
                ],
            ),
            (
                1,
                vec!["[#2 err] 2026-12-04T16:09:29.000000Z  INFO strata_log::ownership: \
                      handed partition over partition=t-1"
                    .to_string()],
            ),
        ];
        let out = explain(&["p0.0-2".to_string()], &history, &logs, "t", &broker_logs);
        let text = out.join("\n");
        assert!(text.contains("t=20 ms"), "{text}");
        assert!(
            text.contains("stored at 1/1, around it: 0:x0 1:p0.0-2 2:x2 3:x3 4:x4"),
            "{text}"
        );
        assert!(text.contains("stored at 1/6"), "{text}");
        let handed = text.find("broker 1:").unwrap();
        let serving = text.find("broker 2:").unwrap();
        assert!(handed < serving, "ownership lines in time order: {text}");
        assert!(!text.contains("t-10"), "another partition's line: {text}");
    }
}
