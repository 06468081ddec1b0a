//! The server-side assignors of KIP-848 consumer groups: `uniform` (Kafka's default, sticky and
//! balanced) and `range` (contiguous ranges per topic, so co-partitioned topics line up).
//!
//! Both are pure functions of the members' subscriptions, the topics' partition counts and
//! (for `uniform`) the previous target assignment, so that replaying a group and recomputing
//! gives the same answer.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::GroupError;
use crate::record::TopicId;

/// Partitions per topic, as assignments are stored and sent (topics by id, as on the wire).
pub type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// The assignor used when no member names one: Kafka's `group.consumer.assignors` default.
pub const DEFAULT_ASSIGNOR: &str = "uniform";
pub const RANGE_ASSIGNOR: &str = "range";

/// Whether `name` is an assignor this coordinator runs.
pub fn check_assignor(name: &str) -> Result<(), GroupError> {
    match name {
        DEFAULT_ASSIGNOR | RANGE_ASSIGNOR => Ok(()),
        _ => Err(GroupError::UnsupportedAssignor),
    }
}

/// One member as the assignor sees it.
#[derive(Debug, Clone)]
pub struct AssignorMember {
    /// Topic ids the member subscribes to that exist.
    pub subscribed: BTreeSet<TopicId>,
    /// The member's previous target, for stickiness.
    pub previous: Assignment,
}

/// Runs assignor `name` (already checked) over `members` and `topics` (id → partition count).
pub fn assign(
    name: &str,
    members: &BTreeMap<String, AssignorMember>,
    topics: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    if name == RANGE_ASSIGNOR {
        range(members, topics)
    } else {
        uniform(members, topics)
    }
}

/// Per topic, its subscribers sorted by member id each take a contiguous range; the first
/// `partitions % subscribers` get one more.
fn range(
    members: &BTreeMap<String, AssignorMember>,
    topics: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect();
    for (topic, &count) in topics {
        let subscribers: Vec<&String> = members
            .iter()
            .filter(|(_, m)| m.subscribed.contains(topic))
            .map(|(id, _)| id)
            .collect();
        if subscribers.is_empty() || count <= 0 {
            continue;
        }
        let n = subscribers.len() as i32;
        let (quota, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, member) in subscribers.into_iter().enumerate() {
            let take = quota + i32::from((i as i32) < extra);
            if take == 0 {
                continue;
            }
            if let Some(a) = out.get_mut(member) {
                a.entry(*topic).or_default().extend(next..next + take);
            }
            next += take;
        }
    }
    out
}

/// Sticky and balanced: members keep what they had as long as they stay subscribed and no
/// other eligible member has two fewer partitions; free partitions go to the eligible member
/// with the fewest. With identical subscriptions every member ends with ⌊P/N⌋ or ⌈P/N⌉.
fn uniform(
    members: &BTreeMap<String, AssignorMember>,
    topics: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    let mut owner: BTreeMap<(TopicId, i32), String> = BTreeMap::new();
    let mut held: BTreeMap<String, BTreeSet<(TopicId, i32)>> = members
        .keys()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for (id, member) in members {
        for (topic, partitions) in &member.previous {
            let Some(&count) = topics.get(topic) else {
                continue;
            };
            if !member.subscribed.contains(topic) {
                continue;
            }
            for &p in partitions {
                if p < count && !owner.contains_key(&(*topic, p)) {
                    owner.insert((*topic, p), id.clone());
                    if let Some(h) = held.get_mut(id) {
                        h.insert((*topic, p));
                    }
                }
            }
        }
    }
    let eligible = |member: &str, topic: &TopicId| {
        members
            .get(member)
            .is_some_and(|m| m.subscribed.contains(topic))
    };
    // Free partitions, each to the least loaded eligible member (ties by member id).
    for (topic, &count) in topics {
        for p in 0..count.max(0) {
            if owner.contains_key(&(*topic, p)) {
                continue;
            }
            let least = held
                .iter()
                .filter(|(m, _)| eligible(m, topic))
                .min_by_key(|(m, h)| (h.len(), (*m).clone()))
                .map(|(m, _)| m.clone());
            if let Some(m) = least {
                owner.insert((*topic, p), m.clone());
                if let Some(h) = held.get_mut(&m) {
                    h.insert((*topic, p));
                }
            }
        }
    }
    // Balance: move one partition at a time from the most to a less loaded eligible member
    // while that narrows a gap of two or more. Each move lowers the sum of squared loads, so
    // this ends; the bound is a guard, not a limit a valid input reaches.
    let total: usize = held.values().map(BTreeSet::len).sum();
    for _ in 0..=total.saturating_mul(members.len().max(1)) {
        let mut moved = false;
        let mut by_load: Vec<(usize, String)> =
            held.iter().map(|(m, h)| (h.len(), m.clone())).collect();
        by_load.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        'outer: for (load, from) in &by_load {
            let Some(from_held) = held.get(from).cloned() else {
                continue;
            };
            // Give away the highest partitions first, keeping low ones stable.
            for tp in from_held.iter().rev() {
                let target = held
                    .iter()
                    .filter(|(m, h)| *m != from && h.len() + 1 < *load && eligible(m, &tp.0))
                    .min_by_key(|(m, h)| (h.len(), (*m).clone()))
                    .map(|(m, _)| m.clone());
                if let Some(to) = target {
                    if let Some(h) = held.get_mut(from) {
                        h.remove(tp);
                    }
                    if let Some(h) = held.get_mut(&to) {
                        h.insert(*tp);
                    }
                    moved = true;
                    break 'outer;
                }
            }
        }
        if !moved {
            break;
        }
    }
    held.into_iter()
        .map(|(m, set)| {
            let mut a = Assignment::new();
            for (topic, p) in set {
                a.entry(topic).or_default().insert(p);
            }
            (m, a)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid(n: u8) -> TopicId {
        TopicId([n; 16])
    }

    fn member(topics: &[u8], previous: &[(u8, &[i32])]) -> AssignorMember {
        AssignorMember {
            subscribed: topics.iter().map(|t| tid(*t)).collect(),
            previous: previous
                .iter()
                .map(|(t, ps)| (tid(*t), ps.iter().copied().collect()))
                .collect(),
        }
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    fn all_partitions(out: &BTreeMap<String, Assignment>) -> Vec<(TopicId, i32)> {
        let mut all: Vec<(TopicId, i32)> = out
            .values()
            .flat_map(|a| a.iter().flat_map(|(t, ps)| ps.iter().map(|p| (*t, *p))))
            .collect();
        all.sort();
        all
    }

    #[test]
    fn unknown_assignors_are_refused() {
        assert_eq!(check_assignor("uniform"), Ok(()));
        assert_eq!(check_assignor("range"), Ok(()));
        assert_eq!(
            check_assignor("sticky"),
            Err(GroupError::UnsupportedAssignor)
        );
    }

    #[test]
    fn range_gives_contiguous_ranges_per_topic() {
        let members = BTreeMap::from([
            ("a".to_string(), member(&[1, 2], &[])),
            ("b".to_string(), member(&[1, 2], &[])),
        ]);
        let topics = BTreeMap::from([(tid(1), 3), (tid(2), 3)]);
        let out = range(&members, &topics);
        assert_eq!(out["a"][&tid(1)], BTreeSet::from([0, 1]));
        assert_eq!(out["b"][&tid(1)], BTreeSet::from([2]));
        assert_eq!(out["a"][&tid(2)], BTreeSet::from([0, 1]));
        assert_eq!(out["b"][&tid(2)], BTreeSet::from([2]));
    }

    #[test]
    fn uniform_balances_every_partition_exactly_once() {
        for n in 1..=7usize {
            let members: BTreeMap<String, AssignorMember> = (0..n)
                .map(|i| (format!("m{i}"), member(&[1, 2], &[])))
                .collect();
            let topics = BTreeMap::from([(tid(1), 10), (tid(2), 3)]);
            let out = uniform(&members, &topics);
            let mut want: Vec<(TopicId, i32)> = (0..10)
                .map(|p| (tid(1), p))
                .chain((0..3).map(|p| (tid(2), p)))
                .collect();
            want.sort();
            assert_eq!(all_partitions(&out), want, "{n} members");
            let loads: Vec<usize> = out.values().map(count).collect();
            let (min, max) = (loads.iter().min(), loads.iter().max());
            assert!(
                max.zip(min).is_some_and(|(a, b)| a - b <= 1),
                "{n}: {loads:?}"
            );
        }
    }

    #[test]
    fn uniform_is_sticky_when_a_member_joins() {
        let before = BTreeMap::from([
            ("a".to_string(), member(&[1], &[(1, &[0, 1, 2])])),
            ("b".to_string(), member(&[1], &[(1, &[3, 4, 5])])),
            ("c".to_string(), member(&[1], &[])),
        ]);
        let topics = BTreeMap::from([(tid(1), 6)]);
        let out = uniform(&before, &topics);
        // Each old member gives up exactly one partition; the rest stay put.
        assert_eq!(count(&out["a"]), 2);
        assert_eq!(count(&out["b"]), 2);
        assert_eq!(count(&out["c"]), 2);
        assert!(out["a"][&tid(1)].is_subset(&BTreeSet::from([0, 1, 2])));
        assert!(out["b"][&tid(1)].is_subset(&BTreeSet::from([3, 4, 5])));
    }

    #[test]
    fn uniform_respects_heterogeneous_subscriptions() {
        let members = BTreeMap::from([
            ("a".to_string(), member(&[1], &[])),
            ("b".to_string(), member(&[1, 2], &[])),
        ]);
        let topics = BTreeMap::from([(tid(1), 2), (tid(2), 4)]);
        let out = uniform(&members, &topics);
        assert!(!out["a"].contains_key(&tid(2)));
        assert_eq!(out["b"][&tid(2)].len(), 4);
        assert_eq!(all_partitions(&out).len(), 6);
    }
}
