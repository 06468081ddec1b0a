//! KIP-848 consumer groups through `GroupsState`: joining, incremental reconciliation (no
//! partition ever has two owners), fencing, timeouts, metadata changes, static members,
//! offsets, mixing with the classic protocol and replay.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{join_req, Harness};
use strata_groups::assignor::Assignment;
use strata_groups::{
    ConsumerHeartbeatRequest, ConsumerHeartbeatResponse, GroupConfig, GroupError, GroupState,
    GroupsState, Response, SeededMemberIds, TopicId,
};

const GROUP: &str = "g";

fn topic_id(n: u8) -> TopicId {
    TopicId([n; 16])
}

fn catalog(partitions: i32) -> BTreeMap<String, (TopicId, i32)> {
    BTreeMap::from([
        ("t".to_string(), (topic_id(1), partitions)),
        ("u".to_string(), (topic_id(2), 2)),
    ])
}

fn config() -> GroupConfig {
    GroupConfig {
        consumer_session_timeout: Duration::from_millis(10_000),
        consumer_heartbeat_interval: Duration::from_millis(1_000),
        ..GroupConfig::default()
    }
}

/// One KIP-848 client: it owns what the coordinator last assigned it, and reports it.
#[derive(Debug, Clone)]
struct Client {
    id: String,
    epoch: i32,
    owned: Assignment,
}

fn req(member_id: &str, epoch: i32) -> ConsumerHeartbeatRequest {
    ConsumerHeartbeatRequest {
        api_version: 1,
        group_id: GROUP.into(),
        member_id: member_id.into(),
        member_epoch: epoch,
        instance_id: None,
        rack_id: None,
        rebalance_timeout_ms: if epoch == 0 { 30_000 } else { -1 },
        subscribed_topic_names: (epoch == 0).then(|| vec!["t".to_string()]),
        subscribed_topic_regex: None,
        server_assignor: None,
        owned: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        timeouts: Default::default(),
    }
}

fn send(
    h: &mut Harness,
    topics: &BTreeMap<String, (TopicId, i32)>,
    r: ConsumerHeartbeatRequest,
) -> ConsumerHeartbeatResponse {
    let token = h.token();
    let out = h.state.handle_consumer_heartbeat(h.now, token, r, topics);
    h.absorb(out);
    match h.answers.remove(&token) {
        Some(Response::ConsumerHeartbeat(r)) => r,
        other => panic!("no heartbeat answer: {other:?}"),
    }
}

fn join(h: &mut Harness, topics: &BTreeMap<String, (TopicId, i32)>, id: &str) -> Client {
    let r = send(h, topics, req(id, 0));
    assert_eq!(r.error, None);
    Client {
        id: r.member_id.unwrap(),
        epoch: r.member_epoch,
        owned: r.assignment.unwrap_or_default(),
    }
}

/// A heartbeat that reports what the client owns, then adopts the answer (revoking first).
fn beat(h: &mut Harness, topics: &BTreeMap<String, (TopicId, i32)>, c: &mut Client) {
    let mut r = req(&c.id, c.epoch);
    r.owned = Some(c.owned.clone());
    let answer = send(h, topics, r);
    assert_eq!(answer.error, None, "{c:?}");
    c.epoch = answer.member_epoch;
    if let Some(a) = answer.assignment {
        c.owned = a;
    }
}

fn partitions(a: &Assignment) -> BTreeSet<(TopicId, i32)> {
    a.iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
        .collect()
}

fn assert_disjoint(clients: &[Client]) {
    let mut seen = BTreeSet::new();
    for c in clients {
        for tp in partitions(&c.owned) {
            assert!(seen.insert(tp), "{tp:?} owned twice: {clients:?}");
        }
    }
}

/// Heartbeats every client in turn until the group is Stable, checking ownership after each.
fn settle(h: &mut Harness, topics: &BTreeMap<String, (TopicId, i32)>, clients: &mut [Client]) {
    for _ in 0..20 {
        for i in 0..clients.len() {
            beat(h, topics, &mut clients[i]);
            assert_disjoint(clients);
        }
        if h.state.group_state(GROUP) == Some(GroupState::Stable) {
            return;
        }
    }
    panic!("never stable: {clients:?}");
}

fn harness() -> Harness {
    Harness::with_config(config())
}

#[test]
fn a_first_member_gets_every_partition_at_epoch_one() {
    let mut h = harness();
    let topics = catalog(4);
    let c = join(&mut h, &topics, "m1");
    assert_eq!(c.epoch, 1);
    assert_eq!(partitions(&c.owned).len(), 4);
    assert_eq!(h.state.group_state(GROUP), Some(GroupState::Stable));
}

#[test]
fn a_second_member_gets_partitions_only_after_the_first_revoked_them() {
    let mut h = harness();
    let topics = catalog(4);
    let mut a = join(&mut h, &topics, "a");
    let mut b = join(&mut h, &topics, "b");
    // b is at the new epoch but every partition is still a's: it gets nothing yet.
    assert_eq!(b.epoch, 2);
    assert!(b.owned.is_empty(), "{b:?}");
    assert_eq!(h.state.group_state(GROUP), Some(GroupState::Reconciling));
    // a is told to keep half; it stays at epoch 1 until it confirms the revocation.
    beat(&mut h, &topics, &mut a);
    assert_eq!(a.epoch, 1);
    assert_eq!(partitions(&a.owned).len(), 2);
    beat(&mut h, &topics, &mut a);
    assert_eq!(a.epoch, 2);
    beat(&mut h, &topics, &mut b);
    assert_eq!(partitions(&b.owned).len(), 2);
    assert_disjoint(&[a, b]);
    assert_eq!(h.state.group_state(GROUP), Some(GroupState::Stable));
}

#[test]
fn five_members_share_every_partition_exactly_once() {
    let mut h = harness();
    let topics = catalog(12);
    let mut clients = Vec::new();
    for i in 0..5 {
        clients.push(join(&mut h, &topics, &format!("m{i}")));
        settle(&mut h, &topics, &mut clients);
    }
    let all: BTreeSet<_> = clients.iter().flat_map(|c| partitions(&c.owned)).collect();
    assert_eq!(all.len(), 12);
    for c in &clients {
        let n = partitions(&c.owned).len();
        assert!((2..=3).contains(&n), "{clients:?}");
    }
}

#[test]
fn range_assignor_is_chosen_per_request_and_unknown_ones_refused() {
    let mut h = harness();
    let topics = catalog(4);
    let mut r = req("a", 0);
    r.server_assignor = Some("fancy".into());
    assert_eq!(
        send(&mut h, &topics, r).error,
        Some(GroupError::UnsupportedAssignor)
    );
    let mut clients = Vec::new();
    for id in ["a", "b"] {
        let mut r = req(id, 0);
        r.server_assignor = Some("range".into());
        let answer = send(&mut h, &topics, r);
        clients.push(Client {
            id: id.into(),
            epoch: answer.member_epoch,
            owned: answer.assignment.unwrap_or_default(),
        });
    }
    settle(&mut h, &topics, &mut clients);
    assert_eq!(
        clients[0].owned,
        Assignment::from([(topic_id(1), BTreeSet::from([0, 1]))])
    );
    assert_eq!(
        clients[1].owned,
        Assignment::from([(topic_id(1), BTreeSet::from([2, 3]))])
    );
}

#[test]
fn epochs_ahead_or_stale_are_fenced_and_unknown_members_refused() {
    let mut h = harness();
    let topics = catalog(2);
    let a = join(&mut h, &topics, "a");
    assert_eq!(
        send(&mut h, &topics, req("a", a.epoch + 1)).error,
        Some(GroupError::FencedMemberEpoch)
    );
    assert_eq!(
        send(&mut h, &topics, req("nobody", 1)).error,
        Some(GroupError::UnknownMemberId)
    );
    let b = join(&mut h, &topics, "b");
    let mut clients = [a, b];
    settle(&mut h, &topics, &mut clients);
    let [a, _b] = clients;
    // One epoch behind (its last answer was lost): accepted only if it owns nothing that is
    // not its own; owning b's partitions too means it missed a revocation, so it is fenced.
    let mut lost = req("a", a.epoch - 1);
    lost.owned = Some(a.owned.clone());
    assert_eq!(send(&mut h, &topics, lost).error, None);
    let mut greedy = req("a", a.epoch - 1);
    greedy.owned = Some(Assignment::from([(topic_id(1), BTreeSet::from([0, 1]))]));
    assert_eq!(
        send(&mut h, &topics, greedy).error,
        Some(GroupError::FencedMemberEpoch)
    );
    // A group that does not exist knows no member.
    let mut other = req("x", 3);
    other.group_id = "nope".into();
    assert_eq!(
        send(&mut h, &topics, other).error,
        Some(GroupError::UnknownMemberId)
    );
}

#[test]
fn a_member_whose_session_expires_loses_its_partitions_to_the_others() {
    let mut h = harness();
    let topics = catalog(4);
    let mut clients = vec![join(&mut h, &topics, "a")];
    clients.push(join(&mut h, &topics, "b"));
    settle(&mut h, &topics, &mut clients);
    // Only a keeps heartbeating; b's session (10 s) runs out.
    for _ in 0..12 {
        h.advance_ms(1_000);
        beat(&mut h, &topics, &mut clients[0]);
    }
    assert_eq!(partitions(&clients[0].owned).len(), 4);
    assert_eq!(
        send(&mut h, &topics, req("b", clients[1].epoch)).error,
        Some(GroupError::UnknownMemberId)
    );
}

#[test]
fn a_groups_own_session_timeout_and_heartbeat_interval_override_the_brokers() {
    let mut h = harness();
    let topics = catalog(2);
    let own = strata_groups::GroupTimeouts {
        session: Some(Duration::from_millis(2_000)),
        heartbeat_interval: Some(Duration::from_millis(500)),
    };
    let mut r = req("a", 0);
    r.timeouts = own;
    let joined = send(&mut h, &topics, r);
    assert_eq!(joined.heartbeat_interval_ms, 500);
    // Silent for 2.5 s: past the group's 2 s session, well within the broker's 10 s.
    h.advance_ms(2_500);
    let mut r = req("a", joined.member_epoch);
    r.timeouts = own;
    assert_eq!(
        send(&mut h, &topics, r).error,
        Some(GroupError::UnknownMemberId)
    );
    // Without the group's own timings the broker's apply.
    let b = send(&mut h, &topics, req("b", 0));
    assert_eq!(b.heartbeat_interval_ms, 1_000);
    h.advance_ms(2_500);
    assert_eq!(send(&mut h, &topics, req("b", b.member_epoch)).error, None);
}

#[test]
fn a_member_that_never_confirms_a_revocation_is_removed_after_its_rebalance_timeout() {
    let mut h = harness();
    let topics = catalog(4);
    let mut a = join(&mut h, &topics, "a");
    let mut b = join(&mut h, &topics, "b");
    // a hears about the revocation, then heartbeats without ever confirming it.
    let answer = send(&mut h, &topics, req("a", a.epoch));
    assert_eq!(answer.error, None);
    for _ in 0..31 {
        h.advance_ms(1_000);
        let _ = send(&mut h, &topics, req("a", a.epoch));
        beat(&mut h, &topics, &mut b);
    }
    assert_eq!(partitions(&b.owned).len(), 4, "{b:?}");
    beat_expect(&mut h, &topics, &mut a, GroupError::UnknownMemberId);
}

fn beat_expect(
    h: &mut Harness,
    topics: &BTreeMap<String, (TopicId, i32)>,
    c: &mut Client,
    error: GroupError,
) {
    let mut r = req(&c.id, c.epoch);
    r.owned = Some(c.owned.clone());
    assert_eq!(send(h, topics, r).error, Some(error));
}

#[test]
fn partitions_added_to_a_subscribed_topic_are_assigned() {
    let mut h = harness();
    let mut clients = vec![join(&mut h, &catalog(2), "a")];
    clients.push(join(&mut h, &catalog(2), "b"));
    settle(&mut h, &catalog(2), &mut clients);
    let grown = catalog(6);
    settle(&mut h, &grown, &mut clients);
    let all: BTreeSet<_> = clients.iter().flat_map(|c| partitions(&c.owned)).collect();
    assert_eq!(all.len(), 6);
}

#[test]
fn leaving_hands_partitions_over_at_once() {
    let mut h = harness();
    let topics = catalog(4);
    let mut clients = vec![join(&mut h, &topics, "a"), join(&mut h, &topics, "b")];
    settle(&mut h, &topics, &mut clients);
    let left = send(&mut h, &topics, req("b", -1));
    assert_eq!((left.error, left.member_epoch), (None, -1));
    let mut a = clients.remove(0);
    settle(&mut h, &topics, std::slice::from_mut(&mut a));
    assert_eq!(partitions(&a.owned).len(), 4);
}

fn static_req(member_id: &str, epoch: i32, instance: &str) -> ConsumerHeartbeatRequest {
    let mut r = req(member_id, epoch);
    r.instance_id = Some(instance.into());
    r
}

#[test]
fn a_static_member_rejoining_keeps_its_assignment_and_a_duplicate_is_refused() {
    let mut h = harness();
    let topics = catalog(4);
    let first = send(&mut h, &topics, static_req("s1", 0, "i"));
    let mut b = join(&mut h, &topics, "b");
    let mut s = Client {
        id: "s1".into(),
        epoch: first.member_epoch,
        owned: first.assignment.unwrap_or_default(),
    };
    let mut clients = [s.clone(), b.clone()];
    settle(&mut h, &topics, &mut clients);
    [s, b] = clients;
    // Another process with the same instance id while s is alive.
    assert_eq!(
        send(&mut h, &topics, static_req("s2", 0, "i")).error,
        Some(GroupError::UnreleasedInstanceId)
    );
    // s leaves temporarily (-2) and comes back under a new member id: same epoch, same
    // partitions, no rebalance for b.
    let epoch_before = h.state.generation(GROUP);
    let left = send(&mut h, &topics, static_req("s1", -2, "i"));
    assert_eq!((left.error, left.member_epoch), (None, -2));
    let back = send(&mut h, &topics, static_req("s2", 0, "i"));
    assert_eq!(back.error, None);
    assert_eq!(back.member_epoch, s.epoch);
    assert_eq!(back.assignment.unwrap_or_default(), s.owned);
    assert_eq!(h.state.generation(GROUP), epoch_before);
    beat(&mut h, &topics, &mut b);
    assert_eq!(h.state.group_state(GROUP), Some(GroupState::Stable));
}

#[test]
fn offset_commits_check_the_member_epoch() {
    let mut h = harness();
    let topics = catalog(2);
    let a = join(&mut h, &topics, "a");
    let ok = h.commit(GROUP, a.epoch, "a", &[("t", 0, 5)]);
    assert_eq!(h.commit_errors(ok), vec![None]);
    let stale = h.commit(GROUP, a.epoch + 1, "a", &[("t", 0, 6)]);
    assert_eq!(
        h.commit_errors(stale),
        vec![Some(GroupError::StaleMemberEpoch)]
    );
    let unknown = h.commit(GROUP, a.epoch, "zz", &[("t", 0, 6)]);
    assert_eq!(
        h.commit_errors(unknown),
        vec![Some(GroupError::UnknownMemberId)]
    );
    let outsider = h.commit(GROUP, -1, "", &[("t", 0, 6)]);
    assert_eq!(
        h.commit_errors(outsider),
        vec![Some(GroupError::UnknownMemberId)]
    );
    let fetched = h.fetch(GROUP, Some(&[("t", 0)]));
    assert_eq!(fetched.partitions[0].offset.get(), 5);
    // OffsetFetch v9 names the member: it must be current too.
    let fetch_as = |h: &Harness, member: &str, epoch: i32| {
        h.state
            .offset_fetch(&strata_groups::OffsetFetchRequest {
                group_id: GROUP.into(),
                partitions: None,
                require_stable: false,
                member: Some((member.into(), epoch)),
            })
            .error
    };
    assert_eq!(fetch_as(&h, "a", a.epoch), None);
    assert_eq!(
        fetch_as(&h, "a", a.epoch + 1),
        Some(GroupError::StaleMemberEpoch)
    );
    assert_eq!(fetch_as(&h, "zz", 1), Some(GroupError::UnknownMemberId));
    assert_eq!(fetch_as(&h, "", -1), None);
}

/// A member learns its new epoch only once the heartbeat that moved it is durable, so a commit
/// it sends meanwhile carries the previous epoch: accepted for partitions still its own,
/// refused for partitions it gave up, and refused two epochs back.
#[test]
fn a_commit_with_the_previous_epoch_is_accepted_only_for_partitions_still_held() {
    let mut h = harness();
    let topics = catalog(4);
    let mut a = join(&mut h, &topics, "a");
    let mut b = join(&mut h, &topics, "b");
    beat(&mut h, &topics, &mut a); // told to give two partitions back
    beat(&mut h, &topics, &mut a); // confirms: epoch 2
    beat(&mut h, &topics, &mut b);
    assert_eq!((a.epoch, b.epoch), (2, 2));
    let id = topics["t"].0;
    let kept = *a.owned[&id].iter().next().unwrap();
    let given = *b.owned[&id].iter().next().unwrap();

    let held = h.commit(GROUP, 1, &a.id, &[("t", kept, 7)]);
    assert_eq!(h.commit_errors(held), vec![None]);
    let moved = h.commit(GROUP, 1, &a.id, &[("t", kept, 8), ("t", given, 8)]);
    assert_eq!(
        h.commit_errors(moved),
        vec![
            Some(GroupError::StaleMemberEpoch),
            Some(GroupError::StaleMemberEpoch)
        ]
    );
    let ancient = h.commit(GROUP, 0, &a.id, &[("t", kept, 9)]);
    assert_eq!(
        h.commit_errors(ancient),
        vec![Some(GroupError::StaleMemberEpoch)]
    );
    let fetched = h.fetch(GROUP, Some(&[("t", kept)]));
    assert_eq!(fetched.partitions[0].offset.get(), 7);

    let fetch_as = |h: &Harness, epoch: i32| {
        h.state
            .offset_fetch(&strata_groups::OffsetFetchRequest {
                group_id: GROUP.into(),
                partitions: None,
                require_stable: false,
                member: Some((a.id.clone(), epoch)),
            })
            .error
    };
    assert_eq!(fetch_as(&h, 1), None);
    assert_eq!(fetch_as(&h, 0), Some(GroupError::StaleMemberEpoch));
}

#[test]
fn an_empty_group_changes_type_and_a_live_classic_one_is_kept_when_migration_is_disabled() {
    let mut h = harness();
    let topics = catalog(2);
    let a = join(&mut h, &topics, "a");
    // Once empty, the group may change type.
    assert_eq!(send(&mut h, &topics, req(&a.id, -1)).error, None);
    let listed = h.state.list_groups(&[]);
    assert_eq!(
        (listed[0].group_type, listed[0].state),
        ("consumer", GroupState::Empty)
    );
    let mut classic = Harness::with_config(GroupConfig {
        consumer_migration_policy: strata_groups::MigrationPolicy::Disabled,
        ..config()
    });
    let joined = classic.join(join_req("k", "", "classic", &["t"]));
    let member = classic.join_response(joined).member_id;
    let again = classic.join(join_req("k", &member, "classic", &["t"]));
    classic.run_until(10_000, |h| h.answered(again));
    let mut r = req("c1", 0);
    r.group_id = "k".into();
    // Kafka's answer when a live classic group may not be converted (`migration.rs` tests
    // the conversions).
    assert_eq!(
        send(&mut classic, &topics, r).error,
        Some(GroupError::GroupIdNotFound)
    );
}

#[test]
fn deleting_an_empty_consumer_group_and_refusing_a_live_one() {
    let mut h = harness();
    let topics = catalog(2);
    let _a = join(&mut h, &topics, "a");
    let token = h.token();
    let out = h
        .state
        .handle_delete_groups(h.now, token, vec![GROUP.to_string()]);
    h.absorb(out);
    match h.answers.remove(&token) {
        Some(Response::DeleteGroups(r)) => {
            assert_eq!(r.groups[0].1, Some(GroupError::NonEmptyGroup))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(send(&mut h, &topics, req("a", -1)).error, None);
    let token = h.token();
    let out = h
        .state
        .handle_delete_groups(h.now, token, vec![GROUP.to_string()]);
    h.absorb(out);
    match h.answers.remove(&token) {
        Some(Response::DeleteGroups(r)) => assert_eq!(r.groups[0].1, None),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.state.group_state(GROUP), None);
}

#[test]
fn replay_resumes_the_group_with_the_same_epochs_and_assignments() {
    let mut h = harness();
    let topics = catalog(6);
    let mut clients = vec![join(&mut h, &topics, "a"), join(&mut h, &topics, "b")];
    // Mid-reconciliation: a has been asked to revoke but has not confirmed.
    beat(&mut h, &topics, &mut clients[0]);
    let before = h.state.describe_consumer_group(GROUP);
    let mut replayed = Harness::from_state(GroupsState::replay(
        config(),
        Box::new(SeededMemberIds::new(1)),
        Duration::ZERO,
        h.durable.clone(),
    ));
    assert_eq!(replayed.state.describe_consumer_group(GROUP), before);
    // And it carries on from there with the same clients.
    settle(&mut replayed, &topics, &mut clients);
    let all: BTreeSet<_> = clients.iter().flat_map(|c| partitions(&c.owned)).collect();
    assert_eq!(all.len(), 6);
}

#[test]
fn a_failed_write_fails_the_heartbeat_and_the_next_write_carries_the_whole_group() {
    let mut h = harness();
    let topics = catalog(2);
    let _a = join(&mut h, &topics, "a");
    h.hold_persists = true;
    let token = h.token();
    let out = h
        .state
        .handle_consumer_heartbeat(h.now, token, req("b", 0), &topics);
    h.absorb(out);
    assert!(!h.answered(token), "answered before its write was durable");
    h.complete_persist(strata_groups::PersistOutcome::Failed(
        strata_groups::PersistFailure::Unavailable,
    ));
    match h.answers.remove(&token) {
        Some(Response::ConsumerHeartbeat(r)) => {
            assert_eq!(r.error, Some(GroupError::CoordinatorNotAvailable))
        }
        other => panic!("{other:?}"),
    }
    h.hold_persists = false;
    let _c = join(&mut h, &topics, "c");
    let replayed = GroupsState::replay(
        config(),
        Box::new(SeededMemberIds::new(1)),
        Duration::ZERO,
        h.durable.clone(),
    );
    assert_eq!(
        replayed.describe_consumer_group(GROUP),
        h.state.describe_consumer_group(GROUP)
    );
}

#[test]
fn a_join_beyond_the_group_size_limit_is_refused_and_the_members_keep_their_partitions() {
    let mut h = Harness::with_config(GroupConfig {
        max_group_size: 2,
        ..config()
    });
    let topics = catalog(4);
    let mut clients = vec![join(&mut h, &topics, "a"), join(&mut h, &topics, "b")];
    settle(&mut h, &topics, &mut clients);

    let third = send(&mut h, &topics, req("c", 0));
    assert_eq!(third.error, Some(GroupError::GroupMaxSizeReached));

    // The refused join changed nothing: both members still hold all four partitions.
    settle(&mut h, &topics, &mut clients);
    assert_disjoint(&clients);
    let held: usize = clients.iter().map(|c| partitions(&c.owned).len()).sum();
    assert_eq!(held, 4);
}

fn regex_req(member_id: &str, regex: &str) -> ConsumerHeartbeatRequest {
    let mut r = req(member_id, 0);
    r.subscribed_topic_names = None;
    r.subscribed_topic_regex = Some(regex.into());
    r
}

/// A regex subscription takes the whole-name matches among non-internal topics, and a topic
/// created later that matches is assigned at the next heartbeat.
#[test]
fn a_regex_subscription_follows_the_topics_it_matches() {
    let mut h = harness();
    let mut topics = BTreeMap::from([
        ("orders-eu".to_string(), (topic_id(1), 2)),
        ("orders-us".to_string(), (topic_id(2), 2)),
        ("payments".to_string(), (topic_id(3), 2)),
        ("x-orders-eu".to_string(), (topic_id(4), 2)),
        ("__orders-internal".to_string(), (topic_id(5), 2)),
    ]);
    let answer = send(&mut h, &topics, regex_req("a", "orders-.*"));
    assert_eq!(answer.error, None);
    let mut a = Client {
        id: answer.member_id.unwrap(),
        epoch: answer.member_epoch,
        owned: answer.assignment.unwrap_or_default(),
    };
    assert_eq!(
        a.owned,
        Assignment::from([
            (topic_id(1), BTreeSet::from([0, 1])),
            (topic_id(2), BTreeSet::from([0, 1])),
        ])
    );
    let epoch = a.epoch;
    topics.insert("orders-asia".to_string(), (topic_id(6), 3));
    beat(&mut h, &topics, &mut a);
    assert!(a.epoch > epoch, "{a:?}");
    assert_eq!(a.owned.get(&topic_id(6)), Some(&BTreeSet::from([0, 1, 2])));
    let described = h.state.describe_consumer_group(GROUP);
    assert_eq!(
        described.members[0].subscribed_topic_regex.as_deref(),
        Some("orders-.*")
    );
}

/// A member may switch from a regex to names: an empty regex clears it.
#[test]
fn an_empty_regex_clears_the_subscription_regex() {
    let mut h = harness();
    let topics = catalog(2);
    let answer = send(&mut h, &topics, regex_req("a", "t|u"));
    let mut a = Client {
        id: answer.member_id.unwrap(),
        epoch: answer.member_epoch,
        owned: answer.assignment.unwrap_or_default(),
    };
    assert_eq!(partitions(&a.owned).len(), 4);
    let mut r = req(&a.id, a.epoch);
    r.subscribed_topic_names = Some(vec!["u".to_string()]);
    r.subscribed_topic_regex = Some(String::new());
    r.owned = Some(a.owned.clone());
    let answer = send(&mut h, &topics, r);
    assert_eq!(answer.error, None);
    a.epoch = answer.member_epoch;
    a.owned = answer.assignment.unwrap_or(a.owned);
    // t's partitions are revoked first, then the member settles on u alone.
    for _ in 0..3 {
        beat(&mut h, &topics, &mut a);
    }
    assert_eq!(
        a.owned,
        Assignment::from([(topic_id(2), BTreeSet::from([0, 1]))])
    );
}

#[test]
fn an_invalid_regex_is_refused_with_invalid_regular_expression() {
    let mut h = harness();
    let topics = catalog(2);
    for bad in ["orders-(", "[z-a]", "a{99999999}"] {
        assert_eq!(
            send(&mut h, &topics, regex_req("a", bad)).error,
            Some(GroupError::InvalidRegularExpression),
            "{bad}"
        );
    }
    assert_eq!(h.state.group_state(GROUP), None);
}
