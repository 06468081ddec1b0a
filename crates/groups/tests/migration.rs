//! Online migration between the classic and the consumer protocol (`migration.rs`): a live
//! classic group upgraded by a joining consumer-protocol member, classic members reconciling
//! through JoinGroup/SyncGroup/Heartbeat inside the consumer group (never two owners of a
//! partition), the downgrade when the last consumer-protocol member leaves, timeouts, offset
//! commits, replay and the policy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use common::{join_req, Harness, REBALANCE_MS};
use strata_groups::subscription::{encode_assignment, parse_assignment};
use strata_groups::{
    ConsumerHeartbeatRequest, ConsumerHeartbeatResponse, GroupConfig, GroupError, GroupState,
    GroupsState, LeavingMember, MigrationPolicy, RecordBody, Response, SeededMemberIds, TopicId,
};

const G: &str = "g";
const PARTITIONS: i32 = 4;

fn topic_id() -> TopicId {
    TopicId([1; 16])
}

fn catalog() -> BTreeMap<String, (TopicId, i32)> {
    BTreeMap::from([("t".to_string(), (topic_id(), PARTITIONS))])
}

fn config(policy: MigrationPolicy) -> GroupConfig {
    GroupConfig {
        consumer_session_timeout: Duration::from_millis(10_000),
        consumer_heartbeat_interval: Duration::from_millis(1_000),
        consumer_migration_policy: policy,
        ..GroupConfig::default()
    }
}

/// A classic client with the eager protocol: it gives up everything before it rejoins.
#[derive(Debug, Clone)]
struct Classic {
    id: String,
    generation: i32,
    owned: BTreeSet<i32>,
}

/// A consumer-protocol client.
#[derive(Debug, Clone)]
struct Modern {
    id: String,
    epoch: i32,
    owned: BTreeSet<i32>,
}

fn harness(policy: MigrationPolicy) -> Harness {
    let mut h = Harness::with_config(config(policy));
    h.catalog = catalog();
    h
}

fn assignment_of(partitions: &[i32]) -> Bytes {
    Bytes::from(encode_assignment(&[("t".to_string(), partitions.to_vec())]))
}

fn partitions_in(bytes: &[u8]) -> BTreeSet<i32> {
    parse_assignment(bytes)
        .unwrap()
        .into_iter()
        .flat_map(|(t, ps)| {
            assert_eq!(t, "t");
            ps
        })
        .collect()
}

/// Two classic members, `a` leading, through one rebalance: a owns 0 and 1, b owns 2 and 3.
fn classic_group(h: &mut Harness) -> (Classic, Classic) {
    let (a, ta) = h.join_new(join_req(G, "", "a", &["t"]));
    let (b, tb) = h.join_new(join_req(G, "", "b", &["t"]));
    h.run_until(10_000, |h| h.answered(ta) && h.answered(tb));
    let generation = h.join_response(ta).generation_id;
    assert_eq!(h.join_response(ta).leader, a);
    let sb = h.sync(G, generation, &b, None, vec![]);
    let sa = h.sync(
        G,
        generation,
        &a,
        None,
        vec![
            (a.clone(), assignment_of(&[0, 1])),
            (b.clone(), assignment_of(&[2, 3])),
        ],
    );
    assert_eq!(
        partitions_in(&h.sync_response(sa).assignment),
        [0, 1].into()
    );
    assert_eq!(
        partitions_in(&h.sync_response(sb).assignment),
        [2, 3].into()
    );
    assert_eq!(h.state.group_state(G), Some(GroupState::Stable));
    (
        Classic {
            id: a,
            generation,
            owned: [0, 1].into(),
        },
        Classic {
            id: b,
            generation,
            owned: [2, 3].into(),
        },
    )
}

fn consumer_req(member_id: &str, epoch: i32) -> ConsumerHeartbeatRequest {
    ConsumerHeartbeatRequest {
        api_version: 1,
        group_id: G.into(),
        member_id: member_id.into(),
        member_epoch: epoch,
        instance_id: None,
        rack_id: None,
        rebalance_timeout_ms: if epoch == 0 { REBALANCE_MS } else { -1 },
        subscribed_topic_names: (epoch == 0).then(|| vec!["t".to_string()]),
        subscribed_topic_regex: None,
        server_assignor: None,
        owned: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        timeouts: Default::default(),
    }
}

fn send(h: &mut Harness, r: ConsumerHeartbeatRequest) -> ConsumerHeartbeatResponse {
    let token = h.token();
    let topics = h.catalog.clone();
    let out = h.state.handle_consumer_heartbeat(h.now, token, r, &topics);
    h.absorb(out);
    match h.answers.remove(&token) {
        Some(Response::ConsumerHeartbeat(r)) => r,
        other => panic!("no heartbeat answer: {other:?}"),
    }
}

fn modern_join(h: &mut Harness, id: &str) -> Modern {
    let r = send(h, consumer_req(id, 0));
    assert_eq!(r.error, None);
    Modern {
        id: r.member_id.unwrap(),
        epoch: r.member_epoch,
        owned: r
            .assignment
            .unwrap_or_default()
            .values()
            .flatten()
            .copied()
            .collect(),
    }
}

fn modern_beat(h: &mut Harness, m: &mut Modern) {
    let mut r = consumer_req(&m.id, m.epoch);
    r.owned = Some(if m.owned.is_empty() {
        BTreeMap::new()
    } else {
        BTreeMap::from([(topic_id(), m.owned.clone())])
    });
    let answer = send(h, r);
    assert_eq!(answer.error, None, "{m:?}");
    m.epoch = answer.member_epoch;
    if let Some(a) = answer.assignment {
        m.owned = a.values().flatten().copied().collect();
    }
}

/// One classic heartbeat; on REBALANCE_IN_PROGRESS the eager client revokes everything,
/// rejoins and syncs, as librdkafka's and Java's eager consumers do.
fn classic_step(h: &mut Harness, c: &mut Classic) {
    match h.heartbeat(G, c.generation, &c.id, None) {
        None => {}
        Some(GroupError::RebalanceInProgress) => {
            c.owned.clear();
            let token = h.join(join_req(G, &c.id, "classic", &["t"]));
            let joined = h.join_response(token);
            assert_eq!(joined.error, None, "{c:?}");
            assert_eq!(joined.member_id, c.id);
            assert_eq!(joined.leader, "", "no member leads inside a consumer group");
            assert!(joined.members.is_empty());
            assert_eq!(joined.protocol_name.as_deref(), Some("range"));
            c.generation = joined.generation_id;
            let synced = h.sync(G, c.generation, &c.id, None, vec![]);
            let synced = h.sync_response(synced);
            assert_eq!(synced.error, None, "{c:?}");
            c.owned = partitions_in(&synced.assignment);
        }
        Some(other) => panic!("{c:?}: heartbeat answered {other:?}"),
    }
}

fn assert_disjoint(classic: &[&Classic], modern: &[&Modern]) -> BTreeSet<i32> {
    let mut seen = BTreeSet::new();
    let all = classic
        .iter()
        .map(|c| &c.owned)
        .chain(modern.iter().map(|m| &m.owned));
    for owned in all {
        for p in owned {
            assert!(
                seen.insert(*p),
                "partition {p} owned twice: {classic:?} {modern:?}"
            );
        }
    }
    seen
}

/// Steps every client until the consumer group is Stable with every partition owned,
/// checking after each step that no partition has two owners.
fn settle(h: &mut Harness, classic: &mut [&mut Classic], modern: &mut [&mut Modern]) {
    fn check(classic: &[&mut Classic], modern: &[&mut Modern]) -> BTreeSet<i32> {
        let cs: Vec<&Classic> = classic.iter().map(|c| &**c).collect();
        let ms: Vec<&Modern> = modern.iter().map(|m| &**m).collect();
        assert_disjoint(&cs, &ms)
    }
    for _ in 0..20 {
        for i in 0..classic.len() {
            classic_step(h, classic[i]);
            check(classic, modern);
        }
        for i in 0..modern.len() {
            modern_beat(h, modern[i]);
            check(classic, modern);
        }
        let owned = check(classic, modern);
        if h.state.group_state(G) == Some(GroupState::Stable) && owned.len() == PARTITIONS as usize
        {
            return;
        }
    }
    panic!("never stable");
}

fn group_type(h: &Harness) -> &'static str {
    h.state
        .list_groups(&[])
        .into_iter()
        .find(|g| g.group_id == G)
        .map(|g| g.group_type)
        .unwrap()
}

#[test]
fn a_consumer_member_upgrades_a_live_classic_group_and_gets_partitions_only_once_released() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (mut a, mut b) = classic_group(&mut h);
    let generation = a.generation;

    let mut c = modern_join(&mut h, "c");
    assert_eq!(group_type(&h), "consumer");
    // The classic members came over at their generation; the join moved the epoch past it.
    assert_eq!(c.epoch, generation + 1);
    assert!(
        c.owned.is_empty(),
        "nothing is free until a or b gives it up"
    );
    let described = h.state.describe_consumer_group(G);
    assert_eq!(described.group_epoch, generation + 1);
    let kinds: BTreeMap<String, bool> = described
        .members
        .iter()
        .map(|m| (m.member_id.clone(), m.classic))
        .collect();
    assert_eq!(
        kinds,
        BTreeMap::from([
            (a.id.clone(), true),
            (b.id.clone(), true),
            (c.id.clone(), false)
        ])
    );

    settle(&mut h, &mut [&mut a, &mut b], &mut [&mut c]);
    // Each of the three owns something, and the classic members are at the group epoch.
    assert!(!a.owned.is_empty() && !b.owned.is_empty() && !c.owned.is_empty());
    assert_eq!(a.generation, generation + 1);
    assert_eq!(b.generation, generation + 1);
    // Heartbeats at the new generation are fine; an old one is refused in classic terms.
    assert_eq!(h.heartbeat(G, a.generation, &a.id, None), None);
    assert_eq!(
        h.heartbeat(G, generation, &a.id, None),
        Some(GroupError::IllegalGeneration)
    );
    assert_eq!(h.state.parked_requests(), 0);
}

#[test]
fn an_upgrade_during_a_classic_rebalance_answers_the_parked_join_and_the_member_rejoins() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (mut a, mut b) = classic_group(&mut h);
    // b rejoins with a changed subscription, which starts a classic rebalance; its JoinGroup
    // waits for a.
    let parked = h.join(join_req(G, &b.id, "classic", &["t", "v"]));
    assert!(!h.answered(parked));
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
    let mut c = modern_join(&mut h, "c");
    assert_eq!(group_type(&h), "consumer");
    let answer = h.join_response(parked);
    assert_eq!(answer.error, Some(GroupError::RebalanceInProgress));
    // An eager client gave everything up before rejoining.
    b.owned.clear();
    settle(&mut h, &mut [&mut a, &mut b], &mut [&mut c]);
    assert_eq!(h.state.parked_requests(), 0);
}

#[test]
fn classic_members_commit_at_their_generation_and_describe_groups_shows_their_assignment() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (mut a, mut b) = classic_group(&mut h);
    let mut c = modern_join(&mut h, "c");
    settle(&mut h, &mut [&mut a, &mut b], &mut [&mut c]);
    let p = *a.owned.iter().next().unwrap();
    let ok = h.commit(G, a.generation, &a.id, &[("t", p, 42)]);
    assert_eq!(h.commit_errors(ok), vec![None]);
    let stale = h.commit(G, a.generation - 1, &a.id, &[("t", p, 43)]);
    assert_eq!(
        h.commit_errors(stale),
        vec![Some(GroupError::IllegalGeneration)]
    );
    let described = h.state.describe_group(G);
    assert_eq!(described.protocol_type, "consumer");
    for m in described.members {
        let expected = if m.member_id == a.id {
            &a.owned
        } else if m.member_id == b.id {
            &b.owned
        } else {
            &c.owned
        };
        assert_eq!(&partitions_in(&m.assignment), expected, "{}", m.member_id);
        assert!(!m.metadata.is_empty());
    }
}

#[test]
fn the_last_consumer_member_leaving_downgrades_to_a_classic_group_that_rebalances() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (mut a, mut b) = classic_group(&mut h);
    let mut c = modern_join(&mut h, "c");
    settle(&mut h, &mut [&mut a, &mut b], &mut [&mut c]);
    let epoch = h.state.describe_consumer_group(G).group_epoch;

    let left = send(&mut h, consumer_req(&c.id, -1));
    assert_eq!(left.error, None);
    assert_eq!(group_type(&h), "classic");
    assert_eq!(h.state.group_state(G), Some(GroupState::PreparingRebalance));
    // Written: a tombstone for every consumer-group member, then the classic metadata.
    let last = h.durable.iter().rev().take(4).collect::<Vec<_>>();
    assert!(matches!(&last[0].body, RecordBody::GroupMetadata(v) if v.members.len() == 2));
    let tombstones: BTreeSet<&str> = last[1..]
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::ConsumerMember {
                member_id,
                value: None,
            } => Some(member_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        tombstones,
        BTreeSet::from([a.id.as_str(), b.id.as_str(), c.id.as_str()])
    );

    // Until they rejoin, the members commit with the generation they know.
    let p = *a.owned.iter().next().unwrap();
    let commit = h.commit(G, a.generation, &a.id, &[("t", p, 7)]);
    assert_eq!(h.commit_errors(commit), vec![None]);

    // The classic protocol takes over: both members rejoin and one of them leads.
    let mut tokens = Vec::new();
    for m in [&a, &b] {
        let beat = h.heartbeat(G, m.generation, &m.id, None);
        assert!(
            matches!(
                beat,
                Some(GroupError::RebalanceInProgress | GroupError::IllegalGeneration)
            ),
            "{beat:?}"
        );
        tokens.push(h.join(join_req(G, &m.id, "classic", &["t"])));
    }
    h.run_until(REBALANCE_MS as u64, |h| {
        tokens.iter().all(|t| h.answered(*t))
    });
    let joined: Vec<_> = tokens.iter().map(|t| h.join_response(*t)).collect();
    assert!(joined.iter().all(|j| j.error.is_none()));
    // The classic group took the epoch its members had reached, and the rebalance the next.
    let generation = joined[0].generation_id;
    assert_eq!(generation, epoch + 1);
    let leader = joined[0].leader.clone();
    assert!(leader == a.id || leader == b.id, "{leader}");
    let follower = if leader == a.id { &b.id } else { &a.id };
    let sf = h.sync(G, generation, follower, None, vec![]);
    let sl = h.sync(
        G,
        generation,
        &leader,
        None,
        vec![
            (leader.clone(), assignment_of(&[0, 1])),
            (follower.clone(), assignment_of(&[2, 3])),
        ],
    );
    assert_eq!(h.sync_response(sl).error, None);
    assert_eq!(h.sync_response(sf).error, None);
    assert_eq!(h.state.group_state(G), Some(GroupState::Stable));

    // A restarted coordinator rebuilds the classic group, not the consumer one.
    let replayed = GroupsState::replay(
        config(MigrationPolicy::Bidirectional),
        Box::new(SeededMemberIds::new(7)),
        h.now,
        h.durable.clone(),
    );
    assert_eq!(replayed.generation(G), Some(generation));
    assert_eq!(
        replayed.describe_consumer_group(G).error,
        Some(GroupError::GroupIdNotFound)
    );
}

#[test]
fn a_replayed_consumer_group_keeps_its_classic_members_and_their_session_timeouts() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (mut a, mut b) = classic_group(&mut h);
    let mut c = modern_join(&mut h, "c");
    settle(&mut h, &mut [&mut a, &mut b], &mut [&mut c]);
    let mut replayed = Harness::from_state(GroupsState::replay(
        config(MigrationPolicy::Bidirectional),
        Box::new(SeededMemberIds::new(7)),
        h.now,
        h.durable.clone(),
    ));
    replayed.catalog = catalog();
    replayed.now = h.now;
    let described = replayed.state.describe_consumer_group(G);
    assert_eq!(described.members.len(), 3);
    assert_eq!(described.members.iter().filter(|m| m.classic).count(), 2);
    assert_eq!(replayed.heartbeat(G, a.generation, &a.id, None), None);
    let sync = replayed.sync(G, a.generation, &a.id, None, vec![]);
    assert_eq!(
        partitions_in(&replayed.sync_response(sync).assignment),
        a.owned
    );
    // b (classic, 10 s session) and c (consumer, 10 s session) stay silent; a heartbeats.
    for _ in 0..2 {
        replayed.advance_ms(4_000);
        assert_eq!(replayed.heartbeat(G, a.generation, &a.id, None), None);
    }
    replayed.advance_ms(4_000);
    // b and c are gone; with c gone only classic members are left, so the group went back
    // to the classic protocol.
    assert_eq!(group_type(&replayed), "classic");
    assert_eq!(
        replayed.heartbeat(G, a.generation, &b.id, None),
        Some(GroupError::UnknownMemberId)
    );
}

#[test]
fn a_classic_member_that_does_not_rejoin_in_its_rebalance_timeout_is_removed() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (a, mut b) = classic_group(&mut h);
    let mut c = modern_join(&mut h, "c");
    // a is told to rejoin and keeps heartbeating without ever doing so.
    assert_eq!(
        h.heartbeat(G, a.generation, &a.id, None),
        Some(GroupError::RebalanceInProgress)
    );
    let mut waited = 0;
    while waited < REBALANCE_MS as u64 + 5_000 {
        h.advance_ms(2_500);
        waited += 2_500;
        modern_beat(&mut h, &mut c);
        classic_step(&mut h, &mut b);
        if h.heartbeat(G, a.generation, &a.id, None) == Some(GroupError::UnknownMemberId) {
            break;
        }
    }
    assert!(
        waited >= REBALANCE_MS as u64,
        "removed too early: {waited} ms"
    );
    assert!(
        waited <= REBALANCE_MS as u64 + 2_500,
        "not removed: {waited} ms"
    );
    // Its partitions went to the others.
    settle(&mut h, &mut [&mut b], &mut [&mut c]);
}

#[test]
fn a_classic_member_leaving_a_consumer_group_by_leave_group_hands_its_partitions_over() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (mut a, mut b) = classic_group(&mut h);
    let mut c = modern_join(&mut h, "c");
    settle(&mut h, &mut [&mut a, &mut b], &mut [&mut c]);
    let left = h.leave(
        G,
        vec![
            LeavingMember {
                member_id: a.id.clone(),
                group_instance_id: None,
                reason: None,
            },
            LeavingMember {
                member_id: c.id.clone(),
                group_instance_id: None,
                reason: None,
            },
        ],
    );
    // A consumer-protocol member does not leave through the classic API.
    assert_eq!(left.members[0].error, None);
    assert_eq!(left.members[1].error, Some(GroupError::UnknownMemberId));
    assert_eq!(group_type(&h), "consumer");
    settle(&mut h, &mut [&mut b], &mut [&mut c]);
}

#[test]
fn with_migration_disabled_a_live_classic_group_is_not_converted_and_none_is_downgraded() {
    let mut h = harness(MigrationPolicy::Disabled);
    let (_a, _b) = classic_group(&mut h);
    let r = send(&mut h, consumer_req("c", 0));
    assert_eq!(r.error, Some(GroupError::GroupIdNotFound));
    assert_eq!(group_type(&h), "classic");

    // A consumer group still takes classic members (as Kafka's does whatever the policy),
    // and stays a consumer group when its consumer-protocol member leaves.
    let mut h = harness(MigrationPolicy::Upgrade);
    let mut c = modern_join(&mut h, "c");
    let token = h.join(join_req(G, "", "k", &["t"]));
    let required = h.join_response(token);
    assert_eq!(required.error, Some(GroupError::MemberIdRequired));
    let mut k = Classic {
        id: required.member_id,
        generation: -1,
        owned: BTreeSet::new(),
    };
    let token = h.join(join_req(G, &k.id, "k", &["t"]));
    let joined = h.join_response(token);
    assert_eq!(joined.error, None);
    k.generation = joined.generation_id;
    settle(&mut h, &mut [&mut k], &mut [&mut c]);
    assert_eq!(send(&mut h, consumer_req(&c.id, -1)).error, None);
    assert_eq!(group_type(&h), "consumer");
    classic_step(&mut h, &mut k);
    assert_eq!(k.owned.len(), PARTITIONS as usize);
}

#[test]
fn a_classic_join_with_another_protocol_type_or_no_common_protocol_is_refused() {
    let mut h = harness(MigrationPolicy::Bidirectional);
    let (_a, _b) = classic_group(&mut h);
    let _c = modern_join(&mut h, "c");
    let mut other_type = join_req(G, "", "x", &["t"]);
    other_type.protocol_type = "connect".into();
    let token = h.join(other_type);
    assert_eq!(
        h.join_response(token).error,
        Some(GroupError::InconsistentGroupProtocol)
    );
    let mut other_protocol = join_req(G, "", "x", &["t"]);
    other_protocol.protocols[0].name = "roundrobin".into();
    let token = h.join(other_protocol);
    assert_eq!(
        h.join_response(token).error,
        Some(GroupError::InconsistentGroupProtocol)
    );
}
