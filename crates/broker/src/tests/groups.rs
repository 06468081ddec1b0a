//! Consumer groups over the wire: the classic rebalance protocol, committed offsets (also
//! across a restart on the same store), coordinator lookup and group administration.

use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;

use super::*;

const CONSUMER: &str = "consumer";
const RANGE: &str = "range";

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn gid(group: &str) -> GroupId {
    GroupId(s(group))
}

/// A ConsumerProtocolSubscription (v0) for `topics`, as a Java or librdkafka consumer sends it.
fn subscription(topics: &[&str]) -> Bytes {
    let mut sub = ConsumerProtocolSubscription::default();
    sub.topics = topics.iter().map(|t| s(t)).collect();
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    sub.encode(&mut buf, 0).unwrap();
    buf.freeze()
}

fn join_request(version: i16, group: &str, member_id: &str, session_ms: i32) -> JoinGroupRequest {
    let mut protocol = JoinGroupRequestProtocol::default();
    protocol.name = s(RANGE);
    protocol.metadata = subscription(&["topic"]);
    let mut request = JoinGroupRequest::default();
    request.group_id = gid(group);
    request.session_timeout_ms = session_ms;
    if version >= 1 {
        request.rebalance_timeout_ms = 10_000;
    }
    request.member_id = s(member_id);
    request.protocol_type = s(CONSUMER);
    request.protocols = vec![protocol];
    request
}

fn sync_request(
    group: &str,
    generation: i32,
    member_id: &str,
    assignments: &[(&str, &'static [u8])],
) -> SyncGroupRequest {
    let mut request = SyncGroupRequest::default();
    request.group_id = gid(group);
    request.generation_id = generation;
    request.member_id = s(member_id);
    request.assignments = assignments
        .iter()
        .map(|(member, assignment)| {
            let mut a = SyncGroupRequestAssignment::default();
            a.member_id = s(member);
            a.assignment = Bytes::from_static(assignment);
            a
        })
        .collect();
    request
}

fn heartbeat_request(group: &str, generation: i32, member_id: &str) -> HeartbeatRequest {
    let mut request = HeartbeatRequest::default();
    request.group_id = gid(group);
    request.generation_id = generation;
    request.member_id = s(member_id);
    request
}

/// An OffsetCommit of `(topic, partition, offset)`s, grouped by topic in the given order.
fn commit_request(
    group: &str,
    generation: i32,
    member_id: &str,
    offsets: &[(&str, i32, i64)],
) -> OffsetCommitRequest {
    let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
    for (topic, partition, offset) in offsets {
        let mut p = OffsetCommitRequestPartition::default();
        p.partition_index = *partition;
        p.committed_offset = *offset;
        p.committed_metadata = Some(s(&format!("meta-{partition}")));
        match topics.iter_mut().find(|t| t.name.0.as_str() == *topic) {
            Some(t) => t.partitions.push(p),
            None => {
                let mut t = OffsetCommitRequestTopic::default();
                t.name = topic_name(topic);
                t.partitions = vec![p];
                topics.push(t);
            }
        }
    }
    let mut request = OffsetCommitRequest::default();
    request.group_id = gid(group);
    request.generation_id_or_member_epoch = generation;
    request.member_id = s(member_id);
    request.topics = topics;
    request
}

/// OffsetFetch up to v7 for one group; `None` asks for every committed partition.
fn fetch_offsets_request(group: &str, wanted: Option<&[(&str, &[i32])]>) -> OffsetFetchRequest {
    let mut request = OffsetFetchRequest::default();
    request.group_id = gid(group);
    request.topics = wanted.map(|topics| {
        topics
            .iter()
            .map(|(name, partitions)| {
                let mut t = OffsetFetchRequestTopic::default();
                t.name = topic_name(name);
                t.partition_indexes = partitions.to_vec();
                t
            })
            .collect()
    });
    request
}

/// OffsetFetch v8+ for several groups, each asking for `partitions` of `topic`.
fn fetch_groups_request(groups: &[&str], topic: &str, partitions: &[i32]) -> OffsetFetchRequest {
    let mut request = OffsetFetchRequest::default();
    request.groups = groups
        .iter()
        .map(|group| {
            let mut t = OffsetFetchRequestTopics::default();
            t.name = topic_name(topic);
            t.partition_indexes = partitions.to_vec();
            let mut g = OffsetFetchRequestGroup::default();
            g.group_id = gid(group);
            g.topics = Some(vec![t]);
            g
        })
        .collect();
    request
}

fn describe_request(groups: &[&str]) -> DescribeGroupsRequest {
    let mut request = DescribeGroupsRequest::default();
    request.groups = groups.iter().map(|g| gid(g)).collect();
    request
}

fn list_request(states: &[&str], types: &[&str]) -> ListGroupsRequest {
    let mut request = ListGroupsRequest::default();
    request.states_filter = states.iter().map(|t| s(t)).collect();
    request.types_filter = types.iter().map(|t| s(t)).collect();
    request
}

fn listed(response: &ListGroupsResponse) -> Vec<String> {
    let mut ids: Vec<String> = response
        .groups
        .iter()
        .map(|g| g.group_id.0.to_string())
        .collect();
    ids.sort();
    ids
}

async fn create_topic_with(client: &mut Client, name: &str, partitions: i32) {
    let mut topic = CreatableTopic::default();
    topic.name = topic_name(name);
    topic.num_partitions = partitions;
    topic.replication_factor = -1;
    let mut request = CreateTopicsRequest::default();
    request.timeout_ms = 5_000;
    request.topics = vec![topic];
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    assert_eq!(response.topics[0].error_code, 0, "create {name}");
}

/// Joins `group` as a new member through KIP-394's two steps; returns the member id and the
/// (completed) JoinGroup answer.
async fn join_new_member(client: &mut Client, group: &str) -> (String, JoinGroupResponse) {
    let first: JoinGroupResponse = client
        .call(ApiKey::JoinGroup, 5, &join_request(5, group, "", 10_000))
        .await;
    assert_eq!(first.error_code, 79, "MEMBER_ID_REQUIRED first");
    let member_id = first.member_id.to_string();
    let joined: JoinGroupResponse = client
        .call(
            ApiKey::JoinGroup,
            5,
            &join_request(5, group, &member_id, 10_000),
        )
        .await;
    assert_eq!(joined.error_code, 0);
    (member_id, joined)
}

#[tokio::test]
async fn two_members_join_sync_heartbeat_commit_and_leave() {
    let broker = start().await;
    let mut a = broker.client().await;
    let mut b = broker.client().await;
    create_topic_with(&mut a, "topic", 2).await;
    let v = 5;

    // A alone: MEMBER_ID_REQUIRED, then generation 1 with A leading.
    let (a_id, joined) = join_new_member(&mut a, "g").await;
    assert!(a_id.starts_with("broker-test-"), "{a_id}");
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.leader.as_str(), a_id);
    assert_eq!(joined.members.len(), 1);
    assert_eq!(
        joined.protocol_name.as_ref().map(|p| p.as_str()),
        Some(RANGE)
    );
    let synced: SyncGroupResponse = a
        .call(
            ApiKey::SyncGroup,
            3,
            &sync_request("g", 1, &a_id, &[(&a_id, b"a-gen1")]),
        )
        .await;
    assert_eq!(synced.error_code, 0);
    assert_eq!(&synced.assignment[..], b"a-gen1");
    let beat: HeartbeatResponse = a
        .call(ApiKey::Heartbeat, 4, &heartbeat_request("g", 1, &a_id))
        .await;
    assert_eq!(beat.error_code, 0);

    // B arrives: its join waits for A to rejoin, which A learns from its heartbeat.
    let first: JoinGroupResponse = b
        .call(ApiKey::JoinGroup, v, &join_request(v, "g", "", 10_000))
        .await;
    assert_eq!(first.error_code, 79);
    let b_id = first.member_id.to_string();
    assert_ne!(a_id, b_id);
    let b_join = b
        .send(ApiKey::JoinGroup, v, &join_request(v, "g", &b_id, 10_000))
        .await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let beat: HeartbeatResponse = a
            .call(ApiKey::Heartbeat, 4, &heartbeat_request("g", 1, &a_id))
            .await;
        if beat.error_code == 27 {
            break;
        }
        assert_eq!(beat.error_code, 0);
        assert!(tokio::time::Instant::now() < deadline, "no rebalance");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rejoined: JoinGroupResponse = a
        .call(ApiKey::JoinGroup, v, &join_request(v, "g", &a_id, 10_000))
        .await;
    assert_eq!((rejoined.error_code, rejoined.generation_id), (0, 2));
    assert_eq!(rejoined.leader.as_str(), a_id);
    let mut members: Vec<String> = rejoined
        .members
        .iter()
        .map(|m| m.member_id.to_string())
        .collect();
    members.sort();
    let mut expected = vec![a_id.clone(), b_id.clone()];
    expected.sort();
    assert_eq!(members, expected);
    let (got, b_joined): (i32, JoinGroupResponse) = b.recv(v).await;
    assert_eq!(got, b_join);
    assert_eq!((b_joined.error_code, b_joined.generation_id), (0, 2));
    assert_eq!(b_joined.leader.as_str(), a_id);
    assert!(b_joined.members.is_empty(), "followers get no member list");

    // The follower's SyncGroup waits for the leader's assignment.
    let b_sync = b
        .send(ApiKey::SyncGroup, 5, &sync_request("g", 2, &b_id, &[]))
        .await;
    let a_synced: SyncGroupResponse = a
        .call(
            ApiKey::SyncGroup,
            5,
            &sync_request("g", 2, &a_id, &[(&a_id, b"a-gen2"), (&b_id, b"b-gen2")]),
        )
        .await;
    assert_eq!(a_synced.error_code, 0);
    assert_eq!(&a_synced.assignment[..], b"a-gen2");
    assert_eq!(
        a_synced.protocol_name.as_ref().map(|p| p.as_str()),
        Some(RANGE)
    );
    let (got, b_synced): (i32, SyncGroupResponse) = b.recv(5).await;
    assert_eq!(got, b_sync);
    assert_eq!(b_synced.error_code, 0);
    assert_eq!(&b_synced.assignment[..], b"b-gen2");
    for (client, id) in [(&mut a, &a_id), (&mut b, &b_id)] {
        let beat: HeartbeatResponse = client
            .call(ApiKey::Heartbeat, 0, &heartbeat_request("g", 2, id))
            .await;
        assert_eq!(beat.error_code, 0);
    }

    // Commits are checked against the generation.
    let commit: OffsetCommitResponse = a
        .call(
            ApiKey::OffsetCommit,
            8,
            &commit_request("g", 2, &a_id, &[("topic", 0, 7)]),
        )
        .await;
    assert_eq!(commit.topics[0].partitions[0].error_code, 0);
    let stale: OffsetCommitResponse = b
        .call(
            ApiKey::OffsetCommit,
            8,
            &commit_request("g", 1, &b_id, &[("topic", 1, 9)]),
        )
        .await;
    assert_eq!(
        stale.topics[0].partitions[0].error_code, 22,
        "ILLEGAL_GENERATION"
    );

    let described: DescribeGroupsResponse = a
        .call(ApiKey::DescribeGroups, 5, &describe_request(&["g"]))
        .await;
    let group = &described.groups[0];
    assert_eq!(group.error_code, 0);
    assert_eq!(group.group_state.as_str(), "Stable");
    assert_eq!(group.protocol_type.as_str(), CONSUMER);
    assert_eq!(group.protocol_data.as_str(), RANGE);
    assert_eq!(group.members.len(), 2);
    for m in &group.members {
        assert_eq!(m.client_host.as_str(), "/127.0.0.1");
        assert_eq!(m.client_id.as_str(), "broker-test");
        assert!(!m.member_assignment.is_empty());
    }

    // Both leave in one batched LeaveGroup (v3+).
    let mut leave = LeaveGroupRequest::default();
    leave.group_id = gid("g");
    leave.members = [&a_id, &b_id, &"nobody".to_string()]
        .iter()
        .map(|id| {
            let mut m = MemberIdentity::default();
            m.member_id = s(id);
            m
        })
        .collect();
    let left: LeaveGroupResponse = a.call(ApiKey::LeaveGroup, 4, &leave).await;
    assert_eq!(left.error_code, 0);
    let codes: Vec<i16> = left.members.iter().map(|m| m.error_code).collect();
    assert_eq!(codes, vec![0, 0, 25]);
    let described: DescribeGroupsResponse = a
        .call(ApiKey::DescribeGroups, 5, &describe_request(&["g"]))
        .await;
    assert_eq!(described.groups[0].group_state.as_str(), "Empty");
    // The committed offset stays with the empty group.
    let fetched: OffsetFetchResponse = a
        .call(
            ApiKey::OffsetFetch,
            6,
            &fetch_offsets_request("g", Some(&[("topic", &[0])])),
        )
        .await;
    assert_eq!(fetched.topics[0].partitions[0].committed_offset, 7);
    broker.shutdown().await;
}

#[tokio::test]
async fn join_before_v4_assigns_the_member_id_at_once() {
    let broker = start().await;
    let mut client = broker.client().await;
    for v in [0, 3] {
        let group = format!("old-{v}");
        let joined: JoinGroupResponse = client
            .call(ApiKey::JoinGroup, v, &join_request(v, &group, "", 10_000))
            .await;
        assert_eq!(joined.error_code, 0, "v{v}");
        assert_eq!(joined.generation_id, 1, "v{v}");
        assert!(!joined.member_id.is_empty(), "v{v}");
        assert_eq!(joined.leader, joined.member_id, "v{v}");
    }
    broker.shutdown().await;
}

#[tokio::test]
async fn committed_offsets_round_trip_and_survive_a_restart() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "orders", 3).await;

    // A consumer outside group management commits (generation -1, no member id).
    let commit: OffsetCommitResponse = client
        .call(
            ApiKey::OffsetCommit,
            9,
            &commit_request(
                "billing",
                -1,
                "",
                &[("orders", 0, 10), ("missing", 0, 5), ("orders", 1, 20)],
            ),
        )
        .await;
    let codes: Vec<(String, Vec<i16>)> = commit
        .topics
        .iter()
        .map(|t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.error_code).collect(),
            )
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            ("orders".to_string(), vec![0, 0]),
            ("missing".to_string(), vec![3])
        ]
    );
    let out_of_range: OffsetCommitResponse = client
        .call(
            ApiKey::OffsetCommit,
            2,
            &commit_request("billing", -1, "", &[("orders", 3, 1)]),
        )
        .await;
    assert_eq!(out_of_range.topics[0].partitions[0].error_code, 3);

    let check = |response: &OffsetFetchResponse| {
        let p = &response.topics[0].partitions;
        let got: Vec<(i32, i64, String, i16)> = p
            .iter()
            .map(|p| {
                (
                    p.partition_index,
                    p.committed_offset,
                    p.metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                    p.error_code,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 10, "meta-0".to_string(), 0),
                (1, 20, "meta-1".to_string(), 0),
                (2, -1, String::new(), 0)
            ]
        );
    };
    for v in [1, 5, 7] {
        let fetched: OffsetFetchResponse = client
            .call(
                ApiKey::OffsetFetch,
                v,
                &fetch_offsets_request("billing", Some(&[("orders", &[0, 1, 2])])),
            )
            .await;
        check(&fetched);
    }
    // Null topics (v2+): every committed partition.
    let all: OffsetFetchResponse = client
        .call(
            ApiKey::OffsetFetch,
            7,
            &fetch_offsets_request("billing", None),
        )
        .await;
    assert_eq!(all.error_code, 0);
    let committed: Vec<(i32, i64)> = all.topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.committed_offset))
        .collect();
    assert_eq!(committed, vec![(0, 10), (1, 20)]);

    let multi = |response: &OffsetFetchResponse| -> Vec<(String, i16, Vec<i64>)> {
        response
            .groups
            .iter()
            .map(|g| {
                (
                    g.group_id.0.to_string(),
                    g.error_code,
                    g.topics[0]
                        .partitions
                        .iter()
                        .map(|p| p.committed_offset)
                        .collect(),
                )
            })
            .collect()
    };
    let expected = vec![
        ("billing".to_string(), 0, vec![10, 20]),
        ("nobody".to_string(), 0, vec![-1, -1]),
    ];
    let fetched: OffsetFetchResponse = client
        .call(
            ApiKey::OffsetFetch,
            8,
            &fetch_groups_request(&["billing", "nobody"], "orders", &[0, 1]),
        )
        .await;
    assert_eq!(multi(&fetched), expected);

    // A new broker on the same storage replays __consumer_offsets.
    drop(client);
    let store = broker.stop_and_keep_store().await;
    let broker = start_on(store, |_| {}).await;
    let mut client = broker.client().await;
    let fetched: OffsetFetchResponse = client
        .call(
            ApiKey::OffsetFetch,
            9,
            &fetch_groups_request(&["billing", "nobody"], "orders", &[0, 1]),
        )
        .await;
    assert_eq!(multi(&fetched), expected);
    let listed: ListGroupsResponse = client
        .call(ApiKey::ListGroups, 4, &list_request(&[], &[]))
        .await;
    assert_eq!(listed.groups.len(), 1);
    assert_eq!(listed.groups[0].group_state.as_str(), "Empty");
    broker.shutdown().await;
}

#[tokio::test]
async fn find_coordinator_answers_groups_and_transactional_ids() {
    let broker = start().await;
    let port = i32::from(broker.addr.port());
    let mut client = broker.client().await;
    for v in 0..=3 {
        let mut request = FindCoordinatorRequest::default();
        request.key = s("some-group");
        let response: FindCoordinatorResponse =
            client.call(ApiKey::FindCoordinator, v, &request).await;
        assert_eq!(response.error_code, 0, "v{v}");
        assert_eq!(response.node_id.0, 0, "v{v}");
        assert_eq!(response.host.as_str(), "127.0.0.1", "v{v}");
        assert_eq!(response.port, port, "v{v}");
    }
    // A transactional id's coordinator is found the same way (key type 1).
    let mut request = FindCoordinatorRequest::default();
    request.key = s("txn");
    request.key_type = 1;
    let response: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 3, &request).await;
    assert_eq!(response.error_code, 0);
    assert_eq!(response.node_id.0, 0);
    assert_eq!(response.port, port);

    for v in 4..=6 {
        let mut request = FindCoordinatorRequest::default();
        request.coordinator_keys = vec![s("g1"), s("g2"), s("")];
        let response: FindCoordinatorResponse =
            client.call(ApiKey::FindCoordinator, v, &request).await;
        let got: Vec<(String, i16, i32, i32)> = response
            .coordinators
            .iter()
            .map(|c| (c.key.to_string(), c.error_code, c.node_id.0, c.port))
            .collect();
        assert_eq!(
            got,
            vec![
                ("g1".to_string(), 0, 0, port),
                ("g2".to_string(), 0, 0, port),
                (String::new(), 0, 0, port)
            ],
            "v{v}"
        );
        request.key_type = 1;
        let response: FindCoordinatorResponse =
            client.call(ApiKey::FindCoordinator, v, &request).await;
        assert!(response
            .coordinators
            .iter()
            .all(|c| c.error_code == 0 && c.port == port));
    }
    let mut request = FindCoordinatorRequest::default();
    request.coordinator_keys = vec![s("share")];
    request.key_type = 2;
    let response: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 6, &request).await;
    assert_eq!(response.coordinators[0].error_code, 42);
    broker.shutdown().await;
}

#[tokio::test]
async fn list_describe_delete_groups_and_offsets() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "admin", 1).await;
    for group in ["adm-1", "adm-2"] {
        let commit: OffsetCommitResponse = client
            .call(
                ApiKey::OffsetCommit,
                8,
                &commit_request(group, -1, "", &[("admin", 0, 3)]),
            )
            .await;
        assert_eq!(commit.topics[0].partitions[0].error_code, 0);
    }
    // A group with a member.
    let mut member = broker.client().await;
    let (_, joined) = join_new_member(&mut member, "busy").await;
    assert_eq!(joined.generation_id, 1);

    let all: ListGroupsResponse = client
        .call(ApiKey::ListGroups, 0, &ListGroupsRequest::default())
        .await;
    assert_eq!(listed(&all), vec!["adm-1", "adm-2", "busy"]);
    let empty: ListGroupsResponse = client
        .call(ApiKey::ListGroups, 4, &list_request(&["empty"], &[]))
        .await;
    assert_eq!(listed(&empty), vec!["adm-1", "adm-2"]);
    assert!(empty
        .groups
        .iter()
        .all(|g| g.group_state.as_str() == "Empty"));
    let not_empty: ListGroupsResponse = client
        .call(
            ApiKey::ListGroups,
            4,
            &list_request(&["CompletingRebalance", "Stable"], &[]),
        )
        .await;
    assert_eq!(listed(&not_empty), vec!["busy"]);
    let bogus: ListGroupsResponse = client
        .call(ApiKey::ListGroups, 4, &list_request(&["Sleeping"], &[]))
        .await;
    assert!(bogus.groups.is_empty());
    let consumer_type: ListGroupsResponse = client
        .call(ApiKey::ListGroups, 5, &list_request(&[], &["consumer"]))
        .await;
    assert!(consumer_type.groups.is_empty(), "only classic groups here");
    let classic: ListGroupsResponse = client
        .call(ApiKey::ListGroups, 5, &list_request(&[], &["Classic"]))
        .await;
    assert_eq!(classic.groups.len(), 3);
    assert!(classic
        .groups
        .iter()
        .all(|g| g.group_type.as_str() == "classic"));

    let described: DescribeGroupsResponse = client
        .call(
            ApiKey::DescribeGroups,
            5,
            &describe_request(&["adm-1", "nope"]),
        )
        .await;
    let states: Vec<(i16, &str)> = described
        .groups
        .iter()
        .map(|g| (g.error_code, g.group_state.as_str()))
        .collect();
    assert_eq!(states, vec![(0, "Empty"), (0, "Dead")]);
    let described: DescribeGroupsResponse = client
        .call(ApiKey::DescribeGroups, 6, &describe_request(&["nope"]))
        .await;
    assert_eq!(described.groups[0].error_code, 69);
    assert!(described.groups[0].error_message.is_some());

    // OffsetDelete: known partitions go, unknown topics are reported per partition.
    let mut request = OffsetDeleteRequest::default();
    request.group_id = gid("adm-1");
    request.topics = ["admin", "ghost"]
        .iter()
        .map(|name| {
            let mut p = OffsetDeleteRequestPartition::default();
            p.partition_index = 0;
            let mut t = OffsetDeleteRequestTopic::default();
            t.name = topic_name(name);
            t.partitions = vec![p];
            t
        })
        .collect();
    let deleted: OffsetDeleteResponse = client.call(ApiKey::OffsetDelete, 0, &request).await;
    assert_eq!(deleted.error_code, 0);
    let codes: Vec<i16> = deleted
        .topics
        .iter()
        .map(|t| t.partitions[0].error_code)
        .collect();
    assert_eq!(codes, vec![0, 3]);
    let fetched: OffsetFetchResponse = client
        .call(
            ApiKey::OffsetFetch,
            7,
            &fetch_offsets_request("adm-1", Some(&[("admin", &[0])])),
        )
        .await;
    assert_eq!(fetched.topics[0].partitions[0].committed_offset, -1);
    request.group_id = gid("nope");
    let deleted: OffsetDeleteResponse = client.call(ApiKey::OffsetDelete, 0, &request).await;
    assert_eq!(deleted.error_code, 69);

    // DeleteGroups: empty groups go with their offsets, groups with members stay.
    let mut request = DeleteGroupsRequest::default();
    request.groups_names = vec![gid("adm-2"), gid("busy"), gid("nope")];
    let deleted: DeleteGroupsResponse = client.call(ApiKey::DeleteGroups, 2, &request).await;
    let results: Vec<(String, i16)> = deleted
        .results
        .iter()
        .map(|r| (r.group_id.0.to_string(), r.error_code))
        .collect();
    assert_eq!(
        results,
        vec![
            ("adm-2".to_string(), 0),
            ("busy".to_string(), 68),
            ("nope".to_string(), 69)
        ]
    );
    let fetched: OffsetFetchResponse = client
        .call(
            ApiKey::OffsetFetch,
            7,
            &fetch_offsets_request("adm-2", Some(&[("admin", &[0])])),
        )
        .await;
    assert_eq!(fetched.topics[0].partitions[0].committed_offset, -1);
    let all: ListGroupsResponse = client
        .call(ApiKey::ListGroups, 3, &ListGroupsRequest::default())
        .await;
    assert!(!listed(&all).contains(&"adm-2".to_string()));
    assert!(listed(&all).contains(&"busy".to_string()));
    broker.shutdown().await;
}

#[tokio::test]
async fn the_offsets_topic_is_internal_and_protected() {
    let broker = start_with(|s| s.group_shards = 3).await;
    let mut client = broker.client().await;
    let mut request = metadata_request(&["__consumer_offsets"]);
    request.allow_auto_topic_creation = false;
    let metadata: MetadataResponse = client.call(ApiKey::Metadata, 12, &request).await;
    let topic = &metadata.topics[0];
    assert_eq!(topic.error_code, 0);
    assert!(topic.is_internal);
    assert_eq!(topic.partitions.len(), 3);

    let produced: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request("__consumer_offsets", -1, record_batch(&[b"junk"], 1)),
        )
        .await;
    let p = &produced.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 17);
    assert!(p.error_message.is_some());

    let mut target = DeleteTopicState::default();
    target.name = Some(topic_name("__consumer_offsets"));
    let mut request = DeleteTopicsRequest::default();
    request.topics = vec![target];
    request.timeout_ms = 5_000;
    let deleted: DeleteTopicsResponse = client.call(ApiKey::DeleteTopics, 6, &request).await;
    assert_eq!(deleted.responses[0].error_code, 17);
    let metadata: MetadataResponse = client
        .call(
            ApiKey::Metadata,
            12,
            &metadata_request(&["__consumer_offsets"]),
        )
        .await;
    assert_eq!(metadata.topics[0].error_code, 0, "still there");
    broker.shutdown().await;
}

/// Every advertised version of every group API encodes and decodes, on its error paths as on
/// its success paths (the round test covers the latter).
#[tokio::test]
async fn every_advertised_group_api_version_answers() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "versions", 1).await;
    for v in 0..=9 {
        // A session timeout below the broker's minimum is refused at once.
        let joined: JoinGroupResponse = client
            .call(ApiKey::JoinGroup, v, &join_request(v, "vg", "", 1))
            .await;
        assert_eq!(joined.error_code, 26, "join v{v}");
    }
    for v in 0..=5 {
        let synced: SyncGroupResponse = client
            .call(ApiKey::SyncGroup, v, &sync_request("vg", 1, "m", &[]))
            .await;
        assert_eq!(synced.error_code, 25, "sync v{v}");
    }
    for v in 0..=4 {
        let beat: HeartbeatResponse = client
            .call(ApiKey::Heartbeat, v, &heartbeat_request("vg", 1, "m"))
            .await;
        assert_eq!(beat.error_code, 25, "heartbeat v{v}");
    }
    for v in 0..=5 {
        let mut leave = LeaveGroupRequest::default();
        leave.group_id = gid("vg");
        if v >= 3 {
            let mut m = MemberIdentity::default();
            m.member_id = s("m");
            leave.members = vec![m];
        } else {
            leave.member_id = s("m");
        }
        let left: LeaveGroupResponse = client.call(ApiKey::LeaveGroup, v, &leave).await;
        let code = if v >= 3 {
            left.members[0].error_code
        } else {
            left.error_code
        };
        assert_eq!(code, 25, "leave v{v}");
    }
    for v in 2..=9 {
        let commit: OffsetCommitResponse = client
            .call(
                ApiKey::OffsetCommit,
                v,
                &commit_request("vg", 4, "m", &[("versions", 0, 1)]),
            )
            .await;
        assert_eq!(commit.topics[0].partitions[0].error_code, 22, "commit v{v}");
    }
    for v in 1..=9 {
        let fetched: OffsetFetchResponse = if v >= 8 {
            client
                .call(
                    ApiKey::OffsetFetch,
                    v,
                    &fetch_groups_request(&["vg"], "versions", &[0]),
                )
                .await
        } else {
            client
                .call(
                    ApiKey::OffsetFetch,
                    v,
                    &fetch_offsets_request("vg", Some(&[("versions", &[0])])),
                )
                .await
        };
        let offset = if v >= 8 {
            fetched.groups[0].topics[0].partitions[0].committed_offset
        } else {
            fetched.topics[0].partitions[0].committed_offset
        };
        assert_eq!(offset, -1, "fetch v{v}");
    }
    for v in 0..=6 {
        let mut request = describe_request(&["vg"]);
        request.include_authorized_operations = v >= 3;
        let described: DescribeGroupsResponse =
            client.call(ApiKey::DescribeGroups, v, &request).await;
        assert_eq!(described.groups.len(), 1, "describe v{v}");
    }
    for v in 0..=5 {
        let listed: ListGroupsResponse = client
            .call(ApiKey::ListGroups, v, &ListGroupsRequest::default())
            .await;
        assert_eq!(listed.error_code, 0, "list v{v}");
    }
    for v in 0..=2 {
        let mut request = DeleteGroupsRequest::default();
        request.groups_names = vec![gid("vg")];
        let deleted: DeleteGroupsResponse = client.call(ApiKey::DeleteGroups, v, &request).await;
        assert_eq!(deleted.results[0].error_code, 69, "delete v{v}");
    }
    broker.shutdown().await;
}

#[tokio::test]
async fn a_parked_join_is_answered_at_shutdown() {
    let broker = start().await;
    let mut a = broker.client().await;
    let mut b = broker.client().await;
    let (_, _) = join_new_member(&mut a, "parked").await;
    // B's join waits for A to rejoin, which never happens.
    let first: JoinGroupResponse = b
        .call(ApiKey::JoinGroup, 5, &join_request(5, "parked", "", 10_000))
        .await;
    let b_id = first.member_id.to_string();
    let sent = b
        .send(
            ApiKey::JoinGroup,
            5,
            &join_request(5, "parked", &b_id, 10_000),
        )
        .await;
    let stop = async {
        // As in shutdown_ends_long_polls_and_returns: the join must have been read first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        broker.shutdown().await;
    };
    let read = async {
        let (got, joined): (i32, JoinGroupResponse) = b.recv(5).await;
        (got, joined.error_code)
    };
    let ((), (got, error)) = tokio::join!(stop, read);
    assert_eq!((got, error), (sent, 16), "NOT_COORDINATOR");
}
