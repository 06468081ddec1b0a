//! Offsets committed inside a transaction: pending (invisible, unstable) until the
//! transaction's end reaches the shard, then visible on commit or gone on abort; replay keeps
//! them pending.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Harness;
use strata_core::{Offset, TopicPartition};
use strata_groups::{
    CommitPartition, GroupConfig, GroupError, GroupsState, OffsetFetchRequest, Response,
    SeededMemberIds, TxnOffsetCommitRequest,
};

const G: &str = "pipeline";
const PID: i64 = 77;

fn txn_commit(
    h: &mut Harness,
    producer_id: i64,
    offsets: &[(&str, i32, i64)],
) -> Vec<Option<GroupError>> {
    let token = h.token();
    let out = h.state.handle_txn_offset_commit(
        h.now,
        token,
        TxnOffsetCommitRequest {
            group_id: G.into(),
            producer_id,
            generation_id: -1,
            member_id: String::new(),
            group_instance_id: None,
            commit_timestamp_ms: 1,
            partitions: offsets
                .iter()
                .map(|(t, p, o)| CommitPartition {
                    partition: TopicPartition::new(*t, *p),
                    offset: Offset(*o),
                    leader_epoch: None,
                    metadata: None,
                })
                .collect(),
        },
    );
    h.absorb(out);
    h.commit_errors(token)
}

fn end(h: &mut Harness, producer_id: i64, commit: bool) {
    for group in h.state.groups_with_txn_offsets(producer_id) {
        let token = h.token();
        let out = h
            .state
            .handle_txn_end(h.now, token, &group, producer_id, commit);
        h.absorb(out);
        assert_eq!(h.answers.get(&token), Some(&Response::TxnEnd(None)));
    }
}

fn stable_fetch(h: &Harness, partition: (&str, i32)) -> (i64, Option<GroupError>) {
    let r = h.state.offset_fetch(&OffsetFetchRequest {
        member: None,
        group_id: G.into(),
        partitions: Some(vec![TopicPartition::new(partition.0, partition.1)]),
        require_stable: true,
    });
    (r.partitions[0].offset.get(), r.partitions[0].error)
}

fn fetch(h: &Harness, partition: (&str, i32)) -> i64 {
    h.fetch(G, Some(&[partition])).partitions[0].offset.get()
}

#[test]
fn transactional_offsets_become_visible_on_commit_only() {
    let mut h = Harness::new();
    h.commit(G, -1, "", &[("in", 0, 5)]);
    assert_eq!(
        txn_commit(&mut h, PID, &[("in", 0, 10), ("in", 1, 20)]),
        vec![None, None]
    );
    // Pending: the committed offset is still the old one, and stable fetches are told to wait.
    assert_eq!(fetch(&h, ("in", 0)), 5);
    assert_eq!(
        stable_fetch(&h, ("in", 0)),
        (-1, Some(GroupError::UnstableOffsetCommit))
    );
    assert_eq!(
        stable_fetch(&h, ("in", 1)).1,
        Some(GroupError::UnstableOffsetCommit)
    );
    end(&mut h, PID, true);
    assert_eq!(fetch(&h, ("in", 0)), 10);
    assert_eq!(stable_fetch(&h, ("in", 1)), (20, None));
    assert!(h.state.groups_with_txn_offsets(PID).is_empty());
}

#[test]
fn transactional_offsets_are_dropped_on_abort() {
    let mut h = Harness::new();
    h.commit(G, -1, "", &[("in", 0, 5)]);
    txn_commit(&mut h, PID, &[("in", 0, 10)]);
    end(&mut h, PID, false);
    assert_eq!(stable_fetch(&h, ("in", 0)), (5, None));
    // Another producer's transaction is untouched by this one's end.
    txn_commit(&mut h, PID + 1, &[("in", 0, 11)]);
    end(&mut h, PID, true);
    assert_eq!(
        stable_fetch(&h, ("in", 0)).1,
        Some(GroupError::UnstableOffsetCommit)
    );
}

#[test]
fn pending_transactional_offsets_survive_replay_until_their_end() {
    let mut h = Harness::new();
    txn_commit(&mut h, PID, &[("in", 0, 10)]);
    let now = Duration::from_secs(10);
    let replay = |records| {
        let mut r = Harness::from_state(GroupsState::replay(
            GroupConfig::default(),
            Box::new(SeededMemberIds::new(1)),
            now,
            records,
        ));
        r.now = now;
        r
    };
    let mut r = replay(h.durable.clone());
    assert_eq!(r.state.groups_with_txn_offsets(PID), vec![G.to_string()]);
    assert_eq!(
        stable_fetch(&r, ("in", 0)).1,
        Some(GroupError::UnstableOffsetCommit)
    );
    end(&mut r, PID, true);
    assert_eq!(fetch(&r, ("in", 0)), 10);
    // And after the end, replay shows the committed offset, nothing pending.
    let mut all = h.durable.clone();
    all.extend(r.durable.clone());
    let again = replay(all);
    assert_eq!(fetch(&again, ("in", 0)), 10);
    assert!(again.state.groups_with_txn_offsets(PID).is_empty());
}

#[test]
fn a_group_created_by_a_transactional_commit_keeps_its_offsets() {
    // No plain commit first: the group exists only to hold the transaction's offsets.
    let mut h = Harness::new();
    txn_commit(&mut h, PID, &[("in", 0, 3)]);
    assert_eq!(h.state.groups_with_txn_offsets(PID), vec![G.to_string()]);
    end(&mut h, PID, true);
    assert_eq!(fetch(&h, ("in", 0)), 3);
}
