//! Where each resource should live: a pure function of the candidate brokers, the resource's
//! name and the operator's overrides. Every broker computes it for itself from its own view, so
//! it must give the same answer everywhere: no `RandomState`, no iteration-order dependence.
//!
//! Rendezvous (highest-random-weight) hashing: each (resource, broker) pair gets a weight from a
//! stable hash and the resource goes to the heaviest candidate. A broker joining takes only the
//! resources it now outweighs (about 1/n of them); a broker leaving gives up only its own.

use std::collections::{BTreeMap, BTreeSet};

use strata_core::BrokerId;

/// 64-bit FNV-1a: tiny, stable across platforms and releases, good enough once mixed.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The splitmix64 finalizer: spreads FNV's weak low bits over the whole word.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The weight of `broker` for `resource`. Stable forever: changing it moves every resource.
pub fn rendezvous_weight(resource: &str, broker: BrokerId) -> u64 {
    mix(fnv1a(resource.as_bytes()) ^ mix(u64::from(broker.0 as u32)))
}

/// The broker `resource` belongs on: an override if its target is a candidate, otherwise the
/// candidate with the highest weight (ties, astronomically rare, go to the lower id).
/// None when there is no candidate at all.
pub fn place(
    resource: &str,
    candidates: &BTreeSet<BrokerId>,
    overrides: &BTreeMap<String, BrokerId>,
) -> Option<BrokerId> {
    if let Some(target) = overrides.get(resource) {
        if candidates.contains(target) {
            return Some(*target);
        }
    }
    candidates
        .iter()
        .copied()
        .max_by_key(|b| (rendezvous_weight(resource, *b), std::cmp::Reverse(*b)))
}

/// [`place`] for many resources at once. Resources with no candidate are left out.
pub fn assign<'a>(
    candidates: &BTreeSet<BrokerId>,
    resources: impl IntoIterator<Item = &'a str>,
    overrides: &BTreeMap<String, BrokerId>,
) -> BTreeMap<String, BrokerId> {
    resources
        .into_iter()
        .filter_map(|r| place(r, candidates, overrides).map(|b| (r.to_string(), b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(ids: &[i32]) -> BTreeSet<BrokerId> {
        ids.iter().copied().map(BrokerId).collect()
    }

    fn resources(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("topic-{}/{}", i % 7, i)).collect()
    }

    fn assignment(ids: &[i32], rs: &[String]) -> BTreeMap<String, BrokerId> {
        assign(
            &brokers(ids),
            rs.iter().map(String::as_str),
            &BTreeMap::new(),
        )
    }

    #[test]
    fn weights_are_stable_across_builds_and_platforms() {
        // Pinned values: if these change, every cluster reshuffles on upgrade.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            rendezvous_weight("t/0", BrokerId(1)),
            rendezvous_weight("t/0", BrokerId(1))
        );
        assert_ne!(
            rendezvous_weight("t/0", BrokerId(1)),
            rendezvous_weight("t/0", BrokerId(2))
        );
    }

    #[test]
    fn spreads_resources_roughly_evenly() {
        let rs = resources(3000);
        let a = assignment(&[1, 2, 3, 4, 5], &rs);
        let mut counts = BTreeMap::new();
        for b in a.values() {
            *counts.entry(*b).or_insert(0) += 1;
        }
        for (b, n) in counts {
            assert!((450..=750).contains(&n), "broker {b} got {n} of 3000");
        }
    }

    #[test]
    fn a_joining_broker_takes_only_what_it_now_outweighs() {
        let rs = resources(2000);
        let before = assignment(&[1, 2, 3, 4], &rs);
        let after = assignment(&[1, 2, 3, 4, 5], &rs);
        let mut moved = 0;
        for r in &rs {
            if before[r] != after[r] {
                moved += 1;
                assert_eq!(after[r], BrokerId(5), "{r} moved between old brokers");
            }
        }
        assert!((300..=500).contains(&moved), "{moved} of 2000 moved");
    }

    #[test]
    fn a_leaving_broker_gives_up_only_its_own() {
        let rs = resources(2000);
        let before = assignment(&[1, 2, 3, 4, 5], &rs);
        let after = assignment(&[1, 2, 4, 5], &rs);
        for r in &rs {
            if before[r] != BrokerId(3) {
                assert_eq!(before[r], after[r], "{r} moved although its broker stayed");
            }
        }
    }

    #[test]
    fn overrides_win_only_while_their_target_is_a_candidate() {
        let overrides = BTreeMap::from([("t/0".to_string(), BrokerId(9))]);
        assert_eq!(
            place("t/0", &brokers(&[1, 9]), &overrides),
            Some(BrokerId(9))
        );
        let without = place("t/0", &brokers(&[1, 2]), &BTreeMap::new());
        assert_eq!(place("t/0", &brokers(&[1, 2]), &overrides), without);
        assert_eq!(place("t/0", &BTreeSet::new(), &overrides), None);
    }
}
