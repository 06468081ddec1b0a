//! The classic group protocol end to end through `GroupsState`'s public API, with time moved
//! by hand. Each test names the Kafka behaviour it pins down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use strata_core::{Offset, TopicPartition};
use strata_groups::{
    GroupConfig, GroupError, GroupState, GroupsState, JoinRequest, LeavingMember,
    OffsetDeleteRequest, OffsetFetchRequest, Output, PersistFailure, PersistOutcome, Protocol,
    RecordBody, Response, SeededMemberIds,
};

const G: &str = "payments";

#[test]
fn three_members_join_sync_and_heartbeat_into_a_stable_generation() {
    let mut h = Harness::new();
    let (a, ta) = h.join_new(join_req(G, "", "client-a", &["orders"]));
    let (b, tb) = h.join_new(join_req(G, "", "client-b", &["orders"]));
    let (c, tc) = h.join_new(join_req(G, "", "client-c", &["orders", "refunds"]));
    assert!(a.starts_with("client-a-"), "{a}");
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));

    // The initial delay (3 s) is extended once because members kept arriving during it.
    h.advance_ms(3_000);
    assert!(!h.answered(ta) && !h.answered(tb) && !h.answered(tc));
    h.advance_ms(3_000);
    let (ra, rb, rc) = (
        h.join_response(ta),
        h.join_response(tb),
        h.join_response(tc),
    );
    for r in [&ra, &rb, &rc] {
        assert_eq!(r.error, None);
        assert_eq!(r.generation_id, 1);
        assert_eq!(r.leader, a);
        assert_eq!(r.protocol_name.as_deref(), Some("range"));
        assert_eq!(r.protocol_type.as_deref(), Some("consumer"));
    }
    // The leader sees everyone's metadata; followers see nobody's.
    let seen: Vec<&str> = ra.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(seen, [a.as_str(), b.as_str(), c.as_str()]);
    assert_eq!(ra.members[2].metadata, subscription(&["orders", "refunds"]));
    assert!(rb.members.is_empty() && rc.members.is_empty());
    assert_eq!(
        h.state.group_state(G),
        Some(GroupState::CompletingRebalance)
    );

    // Followers sync first and wait for the leader's assignment.
    let sb = h.sync(G, 1, &b, None, vec![]);
    let sc = h.sync(G, 1, &c, None, vec![]);
    assert!(!h.answered(sb) && !h.answered(sc));
    // Heartbeats are fine while the assignment is being computed.
    assert_eq!(h.heartbeat(G, 1, &b, None), None);

    // The leader's assignment is only released once it is durable.
    h.hold_persists = true;
    let assignments = vec![
        (a.clone(), assignment_for(&a)),
        (b.clone(), assignment_for(&b)),
        (c.clone(), assignment_for(&c)),
    ];
    let sa = h.sync(G, 1, &a, None, assignments);
    assert!(!h.answered(sa) && !h.answered(sb));
    assert_eq!(h.held.len(), 1);
    assert!(
        matches!(&h.held[0].1[0].body, RecordBody::GroupMetadata(v) if v.generation_id == 1 && v.members.len() == 3)
    );
    h.complete_persist(PersistOutcome::Durable);
    for (token, member) in [(sa, &a), (sb, &b), (sc, &c)] {
        let response = h.sync_response(token);
        assert_eq!(response.error, None);
        assert_eq!(response.assignment, assignment_for(member));
        assert_eq!(response.protocol_name.as_deref(), Some("range"));
    }
    assert_eq!(h.state.group_state(G), Some(GroupState::Stable));

    // Heartbeats keep the members alive well past a session timeout.
    for _ in 0..5 {
        h.advance_ms(5_000);
        for member in [&a, &b, &c] {
            assert_eq!(h.heartbeat(G, 1, member, None), None);
        }
    }
    assert_eq!(h.state.generation(G), Some(1));
    assert_eq!(
        h.heartbeat(G, 0, &a, None),
        Some(GroupError::IllegalGeneration)
    );
    assert_eq!(
        h.heartbeat(G, 1, "nobody", None),
        Some(GroupError::UnknownMemberId)
    );
    assert_eq!(
        h.heartbeat("no-such-group", 1, &a, None),
        Some(GroupError::UnknownMemberId)
    );
    assert_eq!(h.state.parked_requests(), 0);
}

#[test]
fn initial_rebalance_delay_extends_while_members_keep_arriving_up_to_the_rebalance_timeout() {
    let mut h = Harness::new();
    let (_, ta) = h.join_new(join_req(G, "", "a", &["t"]));
    h.advance_ms(2_000);
    let (_, tb) = h.join_new(join_req(G, "", "b", &["t"]));
    h.advance_ms(1_000); // 3 s: B arrived during the first delay, so wait another 3 s
    assert!(!h.answered(ta));
    h.advance_ms(2_000);
    let (_, tc) = h.join_new(join_req(G, "", "c", &["t"])); // 5 s
    h.advance_ms(1_000); // 6 s: C arrived during the second delay
    assert!(!h.answered(ta));
    h.advance_ms(2_999);
    assert!(!h.answered(ta));
    h.advance_ms(1); // 9 s
    for t in [ta, tb, tc] {
        assert_eq!(h.join_response(t).generation_id, 1);
    }

    // With the delay configured to zero, the first member's rebalance completes immediately.
    let mut h = Harness::with_config(GroupConfig {
        initial_rebalance_delay: Duration::ZERO,
        ..GroupConfig::default()
    });
    let (_, t) = h.join_new(join_req(G, "", "a", &["t"]));
    assert_eq!(h.join_response(t).generation_id, 1);
}

#[test]
fn first_member_to_join_leads_and_keeps_leadership_until_it_leaves() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![join_req(G, "", "a", &["t"]), join_req(G, "", "b", &["t"])],
    );
    let (a, b) = (&members[0].member_id, &members[1].member_id);
    assert_eq!(h.state.leader(G).as_deref(), Some(a.as_str()));

    // A newcomer forces a rebalance; the old leader rejoins and stays leader.
    let (c, tc) = h.join_new(join_req(G, "", "c", &["t"]));
    assert_eq!(
        h.heartbeat(G, 1, b, None),
        Some(GroupError::RebalanceInProgress)
    );
    let tb = h.join(join_req(G, b, "b", &["t"]));
    let ta = h.join(join_req(G, a, "a", &["t"]));
    for t in [ta, tb, tc] {
        let r = h.join_response(t);
        assert_eq!((r.generation_id, r.leader.as_str()), (2, a.as_str()));
    }
    assert_eq!(h.join_response(ta).members.len(), 3);

    // When the leader leaves, the earliest-joined remaining member takes over.
    let left = h.leave(
        G,
        vec![LeavingMember {
            member_id: a.clone(),
            group_instance_id: None,
            reason: None,
        }],
    );
    assert_eq!(left.members[0].error, None);
    let tb = h.join(join_req(G, b, "b", &["t"]));
    let tc = h.join(join_req(G, &c, "c", &["t"]));
    let r = h.join_response(tb);
    assert_eq!((r.generation_id, r.leader.as_str()), (3, b.as_str()));
    assert_eq!(h.join_response(tc).leader, *b);
}

#[test]
fn protocol_is_chosen_by_vote_among_protocols_every_member_supports() {
    let mut h = Harness::new();
    let with_protocols = |client: &str, names: &[&str]| JoinRequest {
        protocols: names
            .iter()
            .map(|n| Protocol::new(*n, Bytes::from(n.to_string())))
            .collect(),
        ..join_req(G, "", client, &[])
    };
    let (_, ta) = h.join_new(with_protocols("a", &["sticky", "range", "roundrobin"]));
    let (_, tb) = h.join_new(with_protocols("b", &["range", "sticky"]));
    let (_, tc) = h.join_new(with_protocols("c", &["roundrobin", "sticky", "range"]));
    // Not a single protocol in common with the members: refused.
    let td = h.join(with_protocols("d", &["cooperative-sticky"]));
    assert_eq!(
        h.join_response(td).error,
        Some(GroupError::InconsistentGroupProtocol)
    );
    // A different protocol type: refused.
    let te = h.join(JoinRequest {
        protocol_type: "connect".into(),
        ..with_protocols("e", &["range"])
    });
    assert_eq!(
        h.join_response(te).error,
        Some(GroupError::InconsistentGroupProtocol)
    );

    h.run_until(60_000, |h| h.answered(ta));
    // roundrobin is not supported by b; of sticky and range, a and c vote sticky, b range.
    for t in [ta, tb, tc] {
        assert_eq!(h.join_response(t).protocol_name.as_deref(), Some("sticky"));
    }
    // On a tie, the protocol first voted for (in join order) wins, so the choice is stable.
    let mut tie = Harness::new();
    let (_, tx) = tie.join_new(with_protocols("x", &["sticky", "range"]));
    let (_, ty) = tie.join_new(with_protocols("y", &["range", "sticky"]));
    tie.run_until(60_000, |h| h.answered(tx) && h.answered(ty));
    assert_eq!(
        tie.join_response(ty).protocol_name.as_deref(),
        Some("sticky")
    );
    // The leader gets each member's metadata for the chosen protocol.
    assert!(h
        .join_response(ta)
        .members
        .iter()
        .all(|m| m.metadata == "sticky"));
}

#[test]
fn member_id_required_hands_out_an_id_that_expires_after_the_session_timeout() {
    let mut h = Harness::new();
    let t = h.join(join_req(G, "", "client", &["t"]));
    let r = h.join_response(t);
    assert_eq!(r.error, Some(GroupError::MemberIdRequired));
    assert_eq!(r.generation_id, -1);
    assert!(r.member_id.starts_with("client-"));
    assert_eq!(h.state.group_state(G), Some(GroupState::Empty));

    // Unused for a session timeout, the id is forgotten (and with it the empty group).
    h.advance_ms(SESSION_MS as u64);
    let late = h.join(join_req(G, &r.member_id, "client", &["t"]));
    assert_eq!(
        h.join_response(late).error,
        Some(GroupError::UnknownMemberId)
    );
    assert_eq!(h.state.group_state(G), None);

    // Used in time, the id is accepted as the member's id.
    let t = h.join(join_req(G, "", "client", &["t"]));
    let id = h.join_response(t).member_id;
    h.advance_ms(1_000);
    let t = h.join(join_req(G, &id, "client", &["t"]));
    h.run_until(60_000, |h| h.answered(t));
    let r = h.join_response(t);
    assert_eq!(
        (r.error, r.member_id.as_str(), r.leader.as_str()),
        (None, id.as_str(), id.as_str())
    );

    // Before v4 there is no such round trip.
    let mut h = Harness::new();
    let t = h.join(JoinRequest {
        api_version: 3,
        ..join_req(G, "", "old", &["t"])
    });
    assert!(!h.answered(t));
    h.run_until(60_000, |h| h.answered(t));
    assert_eq!(h.join_response(t).error, None);
}

#[test]
fn pending_member_holds_up_a_rebalance_until_it_rejoins() {
    let mut h = Harness::new();
    let members = form_stable_group(&mut h, G, vec![join_req(G, "", "a", &["t"])]);
    let a = members[0].member_id.clone();
    // A newcomer fetches its id; the leader's rejoin alone does not complete the rebalance
    // because the pending member is expected.
    let t = h.join(join_req(G, "", "b", &["t"]));
    let b = h.join_response(t).member_id;
    let ta = h.join(join_req(G, &a, "a", &["t"]));
    assert!(!h.answered(ta));
    let tb = h.join(join_req(G, &b, "b", &["t"]));
    assert_eq!(h.join_response(ta).generation_id, 2);
    assert_eq!(h.join_response(tb).generation_id, 2);
}

#[test]
fn session_timeout_expiry_removes_the_member_and_survivors_get_a_new_generation() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            join_req(G, "", "a", &["t"]),
            join_req(G, "", "b", &["t"]),
            join_req(G, "", "c", &["t"]),
        ],
    );
    let [a, b, c] = [0, 1, 2].map(|i| members[i].member_id.clone());
    // b and c heartbeat; a has gone silent.
    for _ in 0..2 {
        h.advance_ms(4_000);
        assert_eq!(h.heartbeat(G, 1, &b, None), None);
        assert_eq!(h.heartbeat(G, 1, &c, None), None);
    }
    h.advance_ms(2_000); // a's session (10 s since the sync) has run out
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
    assert_eq!(
        h.heartbeat(G, 1, &b, None),
        Some(GroupError::RebalanceInProgress)
    );
    assert_eq!(
        h.heartbeat(G, 1, &a, None),
        Some(GroupError::UnknownMemberId)
    );
    let tb = h.join(join_req(G, &b, "b", &["t"]));
    let tc = h.join(join_req(G, &c, "c", &["t"]));
    let rb = h.join_response(tb);
    assert_eq!(rb.generation_id, 2);
    assert_eq!(
        rb.leader, b,
        "the departed leader's successor is the earliest survivor"
    );
    assert_eq!(rb.members.len(), 2);
    assert_eq!(h.join_response(tc).generation_id, 2);
}

#[test]
fn rebalance_timeout_evicts_a_member_that_does_not_rejoin() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![join_req(G, "", "a", &["t"]), join_req(G, "", "b", &["t"])],
    );
    let (a, b) = (members[0].member_id.clone(), members[1].member_id.clone());
    // a changes its subscription, which starts a rebalance.
    let ta = h.join(join_req(G, &a, "a", &["t", "u"]));
    assert!(!h.answered(ta));
    // b stays alive by heartbeating but never rejoins.
    for _ in 0..5 {
        h.advance_ms(5_000);
        assert_eq!(
            h.heartbeat(G, 1, &b, None),
            Some(GroupError::RebalanceInProgress)
        );
        assert!(!h.answered(ta));
    }
    h.advance_ms(5_000); // 30 s: the rebalance timeout
    let ra = h.join_response(ta);
    assert_eq!(ra.generation_id, 2);
    assert_eq!(
        ra.members
            .iter()
            .map(|m| m.member_id.clone())
            .collect::<Vec<_>>(),
        [a]
    );
    assert_eq!(
        h.heartbeat(G, 2, &b, None),
        Some(GroupError::UnknownMemberId)
    );
}

#[test]
fn member_that_never_syncs_is_removed_after_the_rebalance_timeout() {
    let mut h = Harness::new();
    let short = |client: &str| JoinRequest {
        rebalance_timeout_ms: 5_000,
        ..join_req(G, "", client, &["t"])
    };
    let (_, ta) = h.join_new(short("a"));
    let (_, tb) = h.join_new(short("b"));
    h.run_until(60_000, |h| h.answered(ta) && h.answered(tb));
    let (a, b) = (h.join_response(ta).member_id, h.join_response(tb).member_id);
    let sa = h.sync(
        G,
        1,
        &a,
        None,
        vec![
            (a.clone(), assignment_for(&a)),
            (b.clone(), assignment_for(&b)),
        ],
    );
    assert_eq!(h.sync_response(sa).error, None);
    // b heartbeats, so its session never lapses, but it never asks for its assignment.
    h.advance_ms(4_000);
    assert_eq!(h.heartbeat(G, 1, &b, None), None);
    assert_eq!(h.heartbeat(G, 1, &a, None), None);
    h.advance_ms(1_000);
    assert_eq!(
        h.heartbeat(G, 1, &b, None),
        Some(GroupError::UnknownMemberId)
    );
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
}

#[test]
fn static_member_restart_within_the_session_timeout_gets_its_assignment_without_a_rebalance() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            static_join_req(G, "instance-a", "a", &["t"]),
            static_join_req(G, "instance-b", "b", &["t"]),
        ],
    );
    let (a, old_b) = (members[0].member_id.clone(), members[1].member_id.clone());
    assert!(old_b.starts_with("instance-b-"), "{old_b}");

    // b restarts: it rejoins without a member id but with its instance id and old metadata.
    h.advance_ms(3_000);
    h.hold_persists = true;
    let t = h.join(static_join_req(G, "instance-b", "b", &["t"]));
    assert!(!h.answered(t), "the new member id must be durable first");
    h.complete_persist(PersistOutcome::Durable);
    let r = h.join_response(t);
    assert_eq!(r.error, None);
    assert_eq!(r.generation_id, 1, "no rebalance");
    assert_ne!(r.member_id, old_b);
    assert_eq!(r.leader, a);
    assert!(!r.skip_assignment);
    let new_b = r.member_id;
    assert_eq!(h.state.group_state(G), Some(GroupState::Stable));

    // It syncs for its old assignment; a never notices anything.
    let s = h.sync(G, 1, &new_b, Some("instance-b"), vec![]);
    assert_eq!(h.sync_response(s).assignment, assignment_for(&old_b));
    assert_eq!(h.heartbeat(G, 1, &a, Some("instance-a")), None);
    assert_eq!(h.heartbeat(G, 1, &new_b, Some("instance-b")), None);
    assert_eq!(h.state.generation(G), Some(1));
}

#[test]
fn static_leader_restart_is_told_to_skip_assignment_from_join_group_v9() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            static_join_req(G, "instance-a", "a", &["t"]),
            static_join_req(G, "instance-b", "b", &["t"]),
        ],
    );
    let old_a = members[0].member_id.clone();
    let t = h.join(static_join_req(G, "instance-a", "a", &["t"]));
    let r = h.join_response(t);
    assert_eq!(r.generation_id, 1);
    assert_eq!(r.leader, r.member_id, "the new id inherits leadership");
    assert!(r.skip_assignment);
    assert_eq!(r.members.len(), 2);

    // Before v9 the old leader id is reported, so the restarted leader does not reassign.
    let t = h.join(JoinRequest {
        api_version: 8,
        ..static_join_req(G, "instance-a", "a", &["t"])
    });
    let r8 = h.join_response(t);
    assert_eq!(r8.leader, r.member_id);
    assert_ne!(r8.leader, r8.member_id);
    assert!(!r8.skip_assignment && r8.members.is_empty());
    assert_ne!(old_a, r8.member_id);
    assert_eq!(h.state.group_state(G), Some(GroupState::Stable));
}

#[test]
fn static_member_rejoining_with_an_unsupported_selected_protocol_triggers_a_rebalance() {
    let mut h = Harness::new();
    let base = |instance: &str, protocols: &[&str]| JoinRequest {
        protocols: protocols
            .iter()
            .map(|p| Protocol::new(*p, subscription(&["t"])))
            .collect(),
        ..static_join_req(G, instance, instance, &["t"])
    };
    form_stable_group(
        &mut h,
        G,
        vec![
            base("ia", &["range", "sticky"]),
            base("ib", &["range", "sticky"]),
        ],
    );
    let t = h.join(base("ib", &["sticky"]));
    assert!(!h.answered(t));
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
}

#[test]
fn old_member_id_of_a_replaced_static_member_is_fenced() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            static_join_req(G, "instance-a", "a", &["t"]),
            static_join_req(G, "instance-b", "b", &["t"]),
        ],
    );
    let old_b = members[1].member_id.clone();
    let t = h.join(static_join_req(G, "instance-b", "b", &["t"]));
    let new_b = h.join_response(t).member_id;

    // The zombie with the old id is fenced on every API.
    assert_eq!(
        h.heartbeat(G, 1, &old_b, Some("instance-b")),
        Some(GroupError::FencedInstanceId)
    );
    let s = h.sync(G, 1, &old_b, Some("instance-b"), vec![]);
    assert_eq!(h.sync_response(s).error, Some(GroupError::FencedInstanceId));
    let j = h.join(JoinRequest {
        member_id: old_b.clone(),
        ..static_join_req(G, "instance-b", "b", &["t"])
    });
    assert_eq!(h.join_response(j).error, Some(GroupError::FencedInstanceId));
    let c = h.token();
    let out = h.state.handle_offset_commit(
        h.now,
        c,
        strata_groups::OffsetCommitRequest {
            group_id: G.into(),
            generation_id: 1,
            member_id: old_b.clone(),
            group_instance_id: Some("instance-b".into()),
            commit_timestamp_ms: 0,
            partitions: vec![strata_groups::CommitPartition {
                partition: TopicPartition::new("t", 0),
                offset: Offset(5),
                leader_epoch: None,
                metadata: None,
            }],
        },
    );
    h.absorb(out);
    assert_eq!(h.commit_errors(c), [Some(GroupError::FencedInstanceId)]);
    let left = h.leave(
        G,
        vec![LeavingMember {
            member_id: old_b,
            group_instance_id: Some("instance-b".into()),
            reason: None,
        }],
    );
    assert_eq!(left.members[0].error, Some(GroupError::FencedInstanceId));
    // The current holder is unaffected.
    assert_eq!(h.heartbeat(G, 1, &new_b, Some("instance-b")), None);
}

#[test]
fn batched_leave_group_removes_named_members_and_reports_each_error() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            join_req(G, "", "a", &["t"]),
            static_join_req(G, "instance-b", "b", &["t"]),
            static_join_req(G, "instance-c", "c", &["t"]),
            join_req(G, "", "d", &["t"]),
        ],
    );
    let [a, _b, c, d] = [0, 1, 2, 3].map(|i| members[i].member_id.clone());
    let left = h.leave(
        G,
        vec![
            LeavingMember {
                member_id: a.clone(),
                group_instance_id: None,
                reason: Some("shutdown".into()),
            },
            LeavingMember {
                member_id: String::new(),
                group_instance_id: Some("instance-b".into()),
                reason: None,
            },
            LeavingMember {
                member_id: "ghost".into(),
                group_instance_id: None,
                reason: None,
            },
            LeavingMember {
                member_id: String::new(),
                group_instance_id: Some("instance-z".into()),
                reason: None,
            },
        ],
    );
    assert_eq!(left.error, None);
    let errors: Vec<_> = left.members.iter().map(|m| m.error).collect();
    assert_eq!(
        errors,
        [
            None,
            None,
            Some(GroupError::UnknownMemberId),
            Some(GroupError::UnknownMemberId)
        ]
    );

    // The static member that was not named stays; survivors rebalance without the leavers.
    let tc = h.join(JoinRequest {
        member_id: c.clone(),
        ..static_join_req(G, "instance-c", "c", &["t"])
    });
    let td = h.join(join_req(G, &d, "d", &["t"]));
    let rc = h.join_response(tc);
    assert_eq!(rc.generation_id, 2);
    assert_eq!(h.join_response(td).generation_id, 2);
    let description = h.state.describe_group(G);
    let ids: Vec<_> = description
        .members
        .iter()
        .map(|m| m.member_id.clone())
        .collect();
    assert_eq!(ids, [c.clone(), d.clone()]);

    // Unknown group: every member is unknown.
    let left = h.leave(
        "nope",
        vec![LeavingMember {
            member_id: c,
            group_instance_id: None,
            reason: None,
        }],
    );
    assert_eq!(left.members[0].error, Some(GroupError::UnknownMemberId));
}

#[test]
fn leaving_the_last_member_empties_the_group_and_records_it() {
    let mut h = Harness::new();
    let members = form_stable_group(&mut h, G, vec![join_req(G, "", "a", &["t"])]);
    let before = h.durable.len();
    h.leave(
        G,
        vec![LeavingMember {
            member_id: members[0].member_id.clone(),
            group_instance_id: None,
            reason: None,
        }],
    );
    assert_eq!(h.state.group_state(G), Some(GroupState::Empty));
    assert_eq!(h.state.generation(G), Some(2));
    assert!(
        matches!(&h.durable[before].body, RecordBody::GroupMetadata(v) if v.generation_id == 2 && v.members.is_empty())
    );
}

#[test]
fn member_offset_commits_become_visible_once_durable() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![join_req(G, "", "a", &["t"]), join_req(G, "", "b", &["t"])],
    );
    let a = members[0].member_id.clone();
    h.hold_persists = true;
    let c = h.commit(G, 1, &a, &[("t", 0, 42), ("t", 1, 7)]);
    assert!(!h.answered(c));
    // Not yet durable: readers see the old value, or UNSTABLE_OFFSET_COMMIT if they ask.
    assert_eq!(
        h.fetch(G, Some(&[("t", 0)])).partitions[0].offset,
        Offset(-1)
    );
    let stable = h.state.offset_fetch(&OffsetFetchRequest {
        member: None,
        group_id: G.into(),
        partitions: Some(vec![TopicPartition::new("t", 0)]),
        require_stable: true,
    });
    assert_eq!(
        stable.partitions[0].error,
        Some(GroupError::UnstableOffsetCommit)
    );
    h.complete_persist(PersistOutcome::Durable);
    assert_eq!(h.commit_errors(c), [None, None]);
    let fetched = h.fetch(G, None);
    assert_eq!(fetched.partitions.len(), 2);
    assert_eq!(fetched.partitions[0].offset, Offset(42));
    assert_eq!(fetched.partitions[0].leader_epoch, Some(3));
    assert_eq!(fetched.partitions[0].metadata, "m42");
    let unknown = h.fetch(G, Some(&[("t", 9)]));
    assert_eq!(unknown.partitions[0].offset, Offset(-1));

    // A failed write is reported per partition and changes nothing.
    let c = h.commit(G, 1, &a, &[("t", 0, 50)]);
    h.complete_persist(PersistOutcome::Failed(PersistFailure::NotCoordinator));
    assert_eq!(h.commit_errors(c), [Some(GroupError::NotCoordinator)]);
    assert_eq!(
        h.fetch(G, Some(&[("t", 0)])).partitions[0].offset,
        Offset(42)
    );
    h.hold_persists = false;

    // Validation.
    let c = h.commit(G, 0, &a, &[("t", 0, 1)]);
    assert_eq!(h.commit_errors(c), [Some(GroupError::IllegalGeneration)]);
    let c = h.commit(G, 1, "stranger", &[("t", 0, 1)]);
    assert_eq!(h.commit_errors(c), [Some(GroupError::UnknownMemberId)]);
    let c = h.commit(G, -1, "", &[("t", 0, 1)]);
    assert_eq!(
        h.commit_errors(c),
        [Some(GroupError::UnknownMemberId)],
        "a live group only takes commits from members"
    );
    let too_long = "x".repeat(4097);
    let c = h.token();
    let out = h.state.handle_offset_commit(
        h.now,
        c,
        strata_groups::OffsetCommitRequest {
            group_id: G.into(),
            generation_id: 1,
            member_id: a.clone(),
            group_instance_id: None,
            commit_timestamp_ms: 0,
            partitions: vec![
                strata_groups::CommitPartition {
                    partition: TopicPartition::new("t", 0),
                    offset: Offset(60),
                    leader_epoch: None,
                    metadata: Some(too_long),
                },
                strata_groups::CommitPartition {
                    partition: TopicPartition::new("t", 1),
                    offset: Offset(61),
                    leader_epoch: None,
                    metadata: None,
                },
            ],
        },
    );
    h.absorb(out);
    assert_eq!(
        h.commit_errors(c),
        [Some(GroupError::OffsetMetadataTooLarge), None]
    );
    assert_eq!(
        h.fetch(G, Some(&[("t", 1)])).partitions[0].offset,
        Offset(61)
    );

    // During CompletingRebalance the member must finish the rebalance first.
    let ta = h.join(join_req(G, &a, "a", &["t"]));
    let tb = h.join(join_req(G, &members[1].member_id, "b", &["t"]));
    assert_eq!(h.join_response(ta).generation_id, 2);
    assert!(h.answered(tb));
    let c = h.commit(G, 2, &a, &[("t", 0, 70)]);
    assert_eq!(h.commit_errors(c), [Some(GroupError::RebalanceInProgress)]);
}

#[test]
fn simple_consumer_commits_with_generation_minus_one_only_while_the_group_is_empty() {
    let mut h = Harness::new();
    let c = h.commit("standalone", -1, "", &[("t", 0, 10), ("t", 1, 11)]);
    assert_eq!(h.commit_errors(c), [None, None]);
    assert_eq!(h.state.group_state("standalone"), Some(GroupState::Empty));
    let fetched = h.fetch("standalone", None);
    assert_eq!(
        fetched
            .partitions
            .iter()
            .map(|p| p.offset.get())
            .collect::<Vec<_>>(),
        [10, 11]
    );
    let listed = h.state.list_groups(&[]);
    assert_eq!(listed[0].group_id, "standalone");
    assert_eq!(listed[0].protocol_type, "");

    // A generation this coordinator never saw is refused for an unknown group.
    let c = h.commit("elsewhere", 5, "m", &[("t", 0, 1)]);
    assert_eq!(h.commit_errors(c), [Some(GroupError::IllegalGeneration)]);
    assert_eq!(h.state.group_state("elsewhere"), None);

    // Once the group has members, anonymous commits are refused.
    let members = form_stable_group(
        &mut h,
        "standalone",
        vec![join_req("standalone", "", "a", &["t"])],
    );
    let c = h.commit("standalone", -1, "", &[("t", 0, 99)]);
    assert_eq!(h.commit_errors(c), [Some(GroupError::UnknownMemberId)]);
    // The group's own member can commit.
    let c = h.commit("standalone", 1, &members[0].member_id, &[("t", 0, 12)]);
    assert_eq!(h.commit_errors(c), [None]);
    assert_eq!(
        h.fetch("standalone", Some(&[("t", 0)])).partitions[0].offset,
        Offset(12)
    );
}

#[test]
fn offset_delete_refuses_topics_the_group_still_consumes() {
    let mut h = Harness::new();
    let members = form_stable_group(&mut h, G, vec![join_req(G, "", "a", &["orders"])]);
    let a = members[0].member_id.clone();
    h.commit(G, 1, &a, &[("orders", 0, 5), ("retired", 0, 9)]);
    h.hold_persists = true;
    let t = h.token();
    let out = h.state.handle_offset_delete(
        h.now,
        t,
        OffsetDeleteRequest {
            group_id: G.into(),
            partitions: vec![
                TopicPartition::new("orders", 0),
                TopicPartition::new("retired", 0),
            ],
        },
    );
    h.absorb(out);
    assert!(!h.answered(t), "answered once the tombstone is durable");
    assert!(
        matches!(&h.held[0].1[0].body, RecordBody::OffsetTombstone { partition } if &*partition.topic == "retired")
    );
    h.complete_persist(PersistOutcome::Durable);
    let Some(Response::OffsetDelete(r)) = h.answers.get(&t) else {
        panic!()
    };
    assert_eq!(r.error, None);
    assert_eq!(
        r.partitions.iter().map(|(_, e)| *e).collect::<Vec<_>>(),
        [Some(GroupError::GroupSubscribedToTopic), None]
    );
    assert_eq!(
        h.fetch(G, Some(&[("retired", 0)])).partitions[0].offset,
        Offset(-1)
    );
    assert_eq!(
        h.fetch(G, Some(&[("orders", 0)])).partitions[0].offset,
        Offset(5)
    );

    // A member with unreadable consumer metadata makes every topic count as subscribed.
    let mut h = Harness::new();
    let garbage = JoinRequest {
        protocols: vec![Protocol::new("range", Bytes::from_static(&[0, 1, 0xff]))],
        ..join_req("g2", "", "x", &[])
    };
    let members = form_stable_group(&mut h, "g2", vec![garbage]);
    h.commit("g2", 1, &members[0].member_id, &[("anything", 0, 1)]);
    let t = h.token();
    let out = h.state.handle_offset_delete(
        h.now,
        t,
        OffsetDeleteRequest {
            group_id: "g2".into(),
            partitions: vec![TopicPartition::new("anything", 0)],
        },
    );
    h.absorb(out);
    let Some(Response::OffsetDelete(r)) = h.answers.get(&t) else {
        panic!()
    };
    assert_eq!(r.partitions[0].1, Some(GroupError::GroupSubscribedToTopic));

    // Unknown group.
    let t = h.token();
    let out = h.state.handle_offset_delete(
        h.now,
        t,
        OffsetDeleteRequest {
            group_id: "none".into(),
            partitions: vec![],
        },
    );
    h.absorb(out);
    let Some(Response::OffsetDelete(r)) = h.answers.get(&t) else {
        panic!()
    };
    assert_eq!(r.error, Some(GroupError::GroupIdNotFound));
}

#[test]
fn replaying_persisted_records_rebuilds_offsets_and_group_metadata() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            static_join_req(G, "instance-a", "a", &["orders"]),
            join_req(G, "", "b", &["orders"]),
        ],
    );
    let (a, b) = (members[0].member_id.clone(), members[1].member_id.clone());
    h.commit(G, 1, &a, &[("orders", 0, 100), ("orders", 1, 200)]);
    h.commit(G, 1, &b, &[("orders", 0, 150)]);
    h.commit("standalone", -1, "", &[("logs", 3, 33)]);
    h.commit("standalone", -1, "", &[("logs", 4, 44)]);
    let t = h.token();
    let out = h.state.handle_offset_delete(
        h.now,
        t,
        OffsetDeleteRequest {
            group_id: "standalone".into(),
            partitions: vec![TopicPartition::new("logs", 4)],
        },
    );
    h.absorb(out);

    // Records may come back from storage in any order.
    for records in [h.durable.clone(), h.durable.iter().rev().cloned().collect()] {
        let now = Duration::from_secs(1_000);
        let state = GroupsState::replay(
            GroupConfig::default(),
            Box::new(SeededMemberIds::new(7)),
            now,
            records,
        );
        let mut r = Harness::from_state(state);
        r.now = now;
        assert_eq!(
            r.fetch(G, Some(&[("orders", 0), ("orders", 1)]))
                .partitions
                .iter()
                .map(|p| p.offset.get())
                .collect::<Vec<_>>(),
            [150, 200]
        );
        assert_eq!(
            r.fetch("standalone", None)
                .partitions
                .iter()
                .map(|p| (p.partition.partition, p.offset.get()))
                .collect::<Vec<_>>(),
            [(3, 33)]
        );
        assert_eq!(r.state.group_state(G), Some(GroupState::Stable));
        assert_eq!(r.state.generation(G), Some(1));
        assert_eq!(r.state.leader(G).as_deref(), Some(a.as_str()));
        let described = r.state.describe_group(G);
        assert_eq!(described.protocol, "range");
        assert_eq!(described.members[0].assignment, assignment_for(&a));
        assert_eq!(
            described.members[0].group_instance_id.as_deref(),
            Some("instance-a")
        );

        // Members carry on with the new coordinator without rejoining.
        assert_eq!(r.heartbeat(G, 1, &a, Some("instance-a")), None);
        let s = r.sync(G, 1, &b, None, vec![]);
        assert_eq!(r.sync_response(s).assignment, assignment_for(&b));
        // The static member restarts against the new coordinator without a rebalance.
        let j = r.join(static_join_req(G, "instance-a", "a", &["orders"]));
        assert_eq!(r.join_response(j).generation_id, 1);
        // New records sort after everything replayed.
        let max_seq = h.durable.iter().map(|rec| rec.seq).max().unwrap();
        assert!(r.durable.iter().all(|rec| rec.seq > max_seq));
    }

    // Members that do not show up at the new coordinator expire after their session.
    let state = GroupsState::replay(
        GroupConfig::default(),
        Box::new(SeededMemberIds::new(7)),
        Duration::ZERO,
        h.durable.clone(),
    );
    let mut r = Harness::from_state(state);
    assert_eq!(
        r.state.next_deadline(),
        Some(Duration::from_millis(SESSION_MS as u64))
    );
    r.advance_ms(SESSION_MS as u64);
    r.run_until(60_000, |r| {
        r.state.group_state(G) == Some(GroupState::Empty)
    });
    assert_eq!(r.state.generation(G), Some(2));
}

#[test]
fn describe_list_and_delete_groups() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            static_join_req(G, "instance-a", "a", &["orders"]),
            join_req(G, "", "b", &["orders"]),
        ],
    );
    let d = h.state.describe_group(G);
    assert_eq!(d.state.as_str(), "Stable");
    assert_eq!(
        (d.protocol_type.as_str(), d.protocol.as_str()),
        ("consumer", "range")
    );
    assert_eq!(d.members.len(), 2);
    assert_eq!(d.members[0].client_id, "a");
    assert_eq!(d.members[0].client_host, "/127.0.0.1");
    assert_eq!(d.members[0].metadata, subscription(&["orders"]));
    assert_eq!(
        d.members[1].assignment,
        assignment_for(&members[1].member_id)
    );
    let unknown = h.state.describe_group("nope");
    assert_eq!((unknown.state.as_str(), unknown.members.len()), ("Dead", 0));

    h.commit("idle", -1, "", &[("t", 0, 1)]);
    let all = h.state.list_groups(&[]);
    assert_eq!(
        all.iter()
            .map(|g| (g.group_id.as_str(), g.state.as_str()))
            .collect::<Vec<_>>(),
        [("idle", "Empty"), (G, "Stable")]
    );
    let stable = h.state.list_groups(&[GroupState::Stable]);
    assert_eq!(stable.len(), 1);
    assert_eq!(stable[0].protocol_type, "consumer");

    // Only Empty groups can be deleted; the answer waits for the tombstones.
    h.hold_persists = true;
    let t = h.token();
    let out = h.state.handle_delete_groups(
        h.now,
        t,
        vec![G.into(), "idle".into(), "nope".into(), "idle".into()],
    );
    h.absorb(out);
    assert!(!h.answered(t));
    let tombstones = &h.held[0].1;
    assert!(tombstones
        .iter()
        .any(|r| matches!(&r.body, RecordBody::GroupTombstone) && r.group_id == "idle"));
    assert!(tombstones
        .iter()
        .any(|r| matches!(&r.body, RecordBody::OffsetTombstone { .. })));
    assert!(tombstones.iter().all(|r| r.is_tombstone()));
    h.complete_persist(PersistOutcome::Durable);
    let Some(Response::DeleteGroups(r)) = h.answers.get(&t) else {
        panic!()
    };
    assert_eq!(
        r.groups,
        [
            (G.to_string(), Some(GroupError::NonEmptyGroup)),
            ("idle".to_string(), None),
            ("nope".to_string(), Some(GroupError::GroupIdNotFound)),
        ]
    );
    assert_eq!(h.state.group_state("idle"), None);
    assert_eq!(
        h.fetch("idle", Some(&[("t", 0)])).partitions[0].offset,
        Offset(-1)
    );

    // A failed deletion puts the group back.
    h.commit("idle2", -1, "", &[("t", 0, 1)]);
    h.complete_persist(PersistOutcome::Durable);
    let t = h.token();
    let out = h.state.handle_delete_groups(h.now, t, vec!["idle2".into()]);
    h.absorb(out);
    h.complete_persist(PersistOutcome::Failed(PersistFailure::Unavailable));
    let Some(Response::DeleteGroups(r)) = h.answers.get(&t) else {
        panic!()
    };
    assert_eq!(r.groups[0].1, Some(GroupError::CoordinatorNotAvailable));
    assert_eq!(
        h.fetch("idle2", Some(&[("t", 0)])).partitions[0].offset,
        Offset(1)
    );
}

#[test]
fn cooperative_rebalance_takes_two_rounds_and_bumps_the_generation_twice() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![join_req(G, "", "a", &["t"]), join_req(G, "", "b", &["t"])],
    );
    let (a, b) = (members[0].member_id.clone(), members[1].member_id.clone());

    // Round 1: c arrives; a and b rejoin (reporting their owned partitions in the metadata).
    let (c, tc) = h.join_new(join_req(G, "", "c", &["t"]));
    assert_eq!(
        h.heartbeat(G, 1, &a, None),
        Some(GroupError::RebalanceInProgress)
    );
    let ta = h.join(join_req(G, &a, "a", &["t", "owned:0,1"]));
    let tb = h.join(join_req(G, &b, "b", &["t", "owned:2,3"]));
    for t in [ta, tb, tc] {
        assert_eq!(h.join_response(t).generation_id, 2);
    }
    let sb = h.sync(G, 2, &b, None, vec![]);
    let sc = h.sync(G, 2, &c, None, vec![]);
    let sa = h.sync(
        G,
        2,
        &a,
        None,
        vec![
            (a.clone(), Bytes::from("0")),
            (b.clone(), Bytes::from("2")),
            (c.clone(), Bytes::new()),
        ],
    );
    assert_eq!(h.sync_response(sa).assignment, Bytes::from("0"));
    assert_eq!(h.sync_response(sb).assignment, Bytes::from("2"));
    assert_eq!(h.sync_response(sc).assignment, Bytes::new());
    assert_eq!(h.state.group_state(G), Some(GroupState::Stable));

    // Round 2: members that gave up partitions rejoin at once; the leader's rejoin alone
    // starts the next round, and the others follow.
    let ta = h.join(join_req(G, &a, "a", &["t", "owned:0"]));
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
    let tb = h.join(join_req(G, &b, "b", &["t", "owned:2"]));
    assert!(!h.answered(ta));
    let tc = h.join(join_req(G, &c, "c", &["t"]));
    for t in [ta, tb, tc] {
        let r = h.join_response(t);
        assert_eq!((r.error, r.generation_id), (None, 3));
    }
    let sa = h.sync(
        G,
        3,
        &a,
        None,
        vec![
            (a.clone(), Bytes::from("0")),
            (b.clone(), Bytes::from("2")),
            (c.clone(), Bytes::from("1,3")),
        ],
    );
    let sc = h.sync(G, 3, &c, None, vec![]);
    assert_eq!(h.sync_response(sa).error, None);
    assert_eq!(h.sync_response(sc).assignment, Bytes::from("1,3"));
    assert_eq!(h.state.generation(G), Some(3));
}

#[test]
fn follower_rejoining_a_stable_group_with_unchanged_metadata_does_not_rebalance() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![join_req(G, "", "a", &["t"]), join_req(G, "", "b", &["t"])],
    );
    let b = members[1].member_id.clone();
    let t = h.join(join_req(G, &b, "b", &["t"]));
    let r = h.join_response(t);
    assert_eq!((r.error, r.generation_id, r.members.len()), (None, 1, 0));
    assert_eq!(h.state.group_state(G), Some(GroupState::Stable));
    // With new metadata it does.
    let t = h.join(join_req(G, &b, "b", &["t", "u"]));
    assert!(!h.answered(t));
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
}

#[test]
fn sync_group_errors_follow_the_group_state() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![join_req(G, "", "a", &["t"]), join_req(G, "", "b", &["t"])],
    );
    let (a, b) = (members[0].member_id.clone(), members[1].member_id.clone());
    let s = h.sync(G, 0, &b, None, vec![]);
    assert_eq!(
        h.sync_response(s).error,
        Some(GroupError::IllegalGeneration)
    );
    let s = h.sync(G, 1, "ghost", None, vec![]);
    assert_eq!(h.sync_response(s).error, Some(GroupError::UnknownMemberId));
    let s = h.sync("nope", 1, &b, None, vec![]);
    assert_eq!(h.sync_response(s).error, Some(GroupError::UnknownMemberId));
    let t = h.token();
    let out = h.state.handle_sync(
        h.now,
        t,
        strata_groups::SyncRequest {
            group_id: G.into(),
            generation_id: 1,
            member_id: b.clone(),
            group_instance_id: None,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("roundrobin".into()),
            assignments: vec![],
        },
    );
    h.absorb(out);
    assert_eq!(
        h.sync_response(t).error,
        Some(GroupError::InconsistentGroupProtocol)
    );
    // Start a rebalance: SyncGroup now says REBALANCE_IN_PROGRESS.
    let ta = h.join(join_req(G, &a, "a", &["t"]));
    let s = h.sync(G, 1, &b, None, vec![]);
    assert_eq!(
        h.sync_response(s).error,
        Some(GroupError::RebalanceInProgress)
    );
    // A follower parked in SyncGroup when a new rebalance starts is told to rejoin.
    let tb = h.join(join_req(G, &b, "b", &["t"]));
    assert_eq!(h.join_response(ta).generation_id, 2);
    assert!(h.answered(tb));
    let s = h.sync(G, 2, &b, None, vec![]);
    assert!(!h.answered(s));
    let (_, tc) = h.join_new(join_req(G, "", "c", &["t"]));
    assert_eq!(
        h.sync_response(s).error,
        Some(GroupError::RebalanceInProgress)
    );
    assert!(!h.answered(tc));
}

#[test]
fn failed_assignment_write_sends_members_back_to_rejoin() {
    let mut h = Harness::new();
    let (a, ta) = h.join_new(join_req(G, "", "a", &["t"]));
    let (b, tb) = h.join_new(join_req(G, "", "b", &["t"]));
    h.run_until(60_000, |h| h.answered(ta) && h.answered(tb));
    h.hold_persists = true;
    let sb = h.sync(G, 1, &b, None, vec![]);
    let sa = h.sync(
        G,
        1,
        &a,
        None,
        vec![(a.clone(), Bytes::from("x")), (b.clone(), Bytes::from("y"))],
    );
    h.complete_persist(PersistOutcome::Failed(PersistFailure::Unavailable));
    assert_eq!(
        h.sync_response(sa).error,
        Some(GroupError::CoordinatorNotAvailable)
    );
    assert_eq!(
        h.sync_response(sb).error,
        Some(GroupError::CoordinatorNotAvailable)
    );
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
}

#[test]
fn static_replacement_is_reverted_when_its_write_fails() {
    let mut h = Harness::new();
    let members = form_stable_group(
        &mut h,
        G,
        vec![
            static_join_req(G, "ia", "a", &["t"]),
            static_join_req(G, "ib", "b", &["t"]),
        ],
    );
    let old_b = members[1].member_id.clone();
    h.hold_persists = true;
    let t = h.join(static_join_req(G, "ib", "b", &["t"]));
    h.complete_persist(PersistOutcome::Failed(PersistFailure::NotCoordinator));
    let r = h.join_response(t);
    assert_eq!(
        (r.error, r.member_id.as_str()),
        (Some(GroupError::NotCoordinator), "")
    );
    // The old id is in charge again.
    assert_eq!(h.heartbeat(G, 1, &old_b, Some("ib")), None);
}

#[test]
fn unloading_a_group_answers_parked_requests_with_not_coordinator() {
    let mut h = Harness::new();
    let (_, ta) = h.join_new(join_req(G, "", "a", &["t"]));
    assert!(!h.answered(ta));
    assert_eq!(h.state.parked_requests(), 1);
    let out = h.state.unload(&[G.to_string()]);
    h.absorb(out);
    assert_eq!(h.join_response(ta).error, Some(GroupError::NotCoordinator));
    assert_eq!(h.state.group_state(G), None);
    assert_eq!(h.state.next_deadline(), None);
    assert_eq!(h.state.parked_requests(), 0);
}

#[test]
fn join_group_validates_group_id_session_timeout_and_group_size() {
    let mut h = Harness::with_config(GroupConfig {
        max_group_size: 2,
        ..GroupConfig::default()
    });
    let t = h.join(join_req("", "", "a", &["t"]));
    assert_eq!(h.join_response(t).error, Some(GroupError::InvalidGroupId));
    let t = h.join(JoinRequest {
        session_timeout_ms: 5_999,
        ..join_req(G, "", "a", &["t"])
    });
    assert_eq!(
        h.join_response(t).error,
        Some(GroupError::InvalidSessionTimeout)
    );
    let t = h.join(JoinRequest {
        session_timeout_ms: 1_800_001,
        ..join_req(G, "", "a", &["t"])
    });
    assert_eq!(
        h.join_response(t).error,
        Some(GroupError::InvalidSessionTimeout)
    );
    let t = h.join(join_req(G, "someone", "a", &["t"]));
    assert_eq!(
        h.join_response(t).error,
        Some(GroupError::UnknownMemberId),
        "a known id cannot create a group"
    );
    let t = h.join(JoinRequest {
        protocol_type: String::new(),
        ..join_req(G, "", "a", &["t"])
    });
    assert_eq!(
        h.join_response(t).error,
        Some(GroupError::InconsistentGroupProtocol)
    );
    assert_eq!(
        h.state.group_state(G),
        None,
        "failed joins leave no empty shell behind"
    );

    let (_, ta) = h.join_new(join_req(G, "", "a", &["t"]));
    let (_, tb) = h.join_new(join_req(G, "", "b", &["t"]));
    let tc = h.join(JoinRequest {
        api_version: 3,
        ..join_req(G, "", "c", &["t"])
    });
    assert_eq!(
        h.join_response(tc).error,
        Some(GroupError::GroupMaxSizeReached)
    );
    h.run_until(60_000, |h| h.answered(ta) && h.answered(tb));
    assert_eq!(h.join_response(ta).members.len(), 2);
}

#[test]
fn new_member_that_never_completes_a_join_is_dropped_after_the_new_member_timeout() {
    let mut h = Harness::new();
    let members = form_stable_group(&mut h, G, vec![join_req(G, "", "a", &["t"])]);
    let a = members[0].member_id.clone();
    // a long-running rebalance (a never rejoins but keeps heartbeating, with a 10 min timeout)
    let long = |client: &str, member: &str| JoinRequest {
        rebalance_timeout_ms: 600_000,
        ..join_req(G, member, client, &["t"])
    };
    let (_, tb) = h.join_new(long("b", ""));
    for _ in 0..59 {
        h.advance_ms(5_000);
        h.heartbeat(G, 1, &a, None);
    }
    assert!(!h.answered(tb));
    h.advance_ms(5_000); // 300 s after b joined
    assert_eq!(h.join_response(tb).error, Some(GroupError::UnknownMemberId));
}

#[test]
fn time_jumps_replay_expirations_in_deadline_order() {
    // One big jump yields the same outcome as small steps: the initial delay completes at
    // 3 s, then the lone member's session (10 s from then) expires, emptying the group.
    let mut h = Harness::new();
    let (_, t) = h.join_new(join_req(G, "", "a", &["t"]));
    h.advance_ms(60_000);
    assert_eq!(h.join_response(t).generation_id, 1);
    assert_eq!(h.state.group_state(G), Some(GroupState::Empty));
    assert_eq!(h.state.generation(G), Some(2));
    assert_eq!(h.state.next_deadline(), None);
}

#[test]
fn outputs_carry_persist_records_before_the_responses_they_gate() {
    let mut h = Harness::new();
    h.hold_persists = true;
    let t = h.token();
    let out = h.state.handle_offset_commit(
        h.now,
        t,
        strata_groups::OffsetCommitRequest {
            group_id: "s".into(),
            generation_id: -1,
            member_id: String::new(),
            group_instance_id: None,
            commit_timestamp_ms: 5,
            partitions: vec![strata_groups::CommitPartition {
                partition: TopicPartition::new("t", 0),
                offset: Offset(1),
                leader_epoch: None,
                metadata: None,
            }],
        },
    );
    assert!(matches!(out.as_slice(), [Output::Persist { .. }]));
    let Output::Persist { id, records } = &out[0] else {
        unreachable!()
    };
    assert_eq!(records[0].seq, id.0);
    assert_eq!(h.state.parked_requests(), 1);
    let done = h
        .state
        .persist_completed(h.now, *id, PersistOutcome::Durable);
    assert!(matches!(done.as_slice(), [Output::Respond { token, .. }] if *token == t));
    assert_eq!(h.state.parked_requests(), 0);
}
