//! Share groups (KIP-932) over the wire: group types refusing each other's ids, listing and
//! deleting, and share-partition state in storage (acknowledgements stored before they are
//! answered; a deposed writer's acknowledgement refused).

use kafka_protocol::messages::share_acknowledge_request::{
    AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch as AckBatch,
};
use kafka_protocol::messages::share_fetch_request::{
    FetchPartition as ShareFetchPartition, FetchTopic as ShareFetchTopic,
};
use strata_groups::share_partition::ShareSnapshot;
use strata_storage::{ObjectKey, PutMode};

use super::*;
use crate::share::ShareAutoOffsetReset;

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn share_join(group: &str, member: &str, topic: &str) -> ShareGroupHeartbeatRequest {
    let mut r = ShareGroupHeartbeatRequest::default();
    r.group_id = GroupId(s(group));
    r.member_id = s(member);
    r.member_epoch = 0;
    r.subscribed_topic_names = Some(vec![topic_name(topic)]);
    r
}

fn share_fetch(group: &str, member: &str, epoch: i32, topic: uuid::Uuid) -> ShareFetchRequest {
    let mut p = ShareFetchPartition::default();
    p.partition_index = 0;
    let mut t = ShareFetchTopic::default();
    t.topic_id = topic;
    t.partitions = vec![p];
    let mut r = ShareFetchRequest::default();
    r.group_id = Some(GroupId(s(group)));
    r.member_id = Some(s(member));
    r.share_session_epoch = epoch;
    r.max_wait_ms = 0;
    r.max_bytes = 1 << 20;
    r.max_records = 100;
    r.topics = vec![t];
    r
}

fn share_ack(
    group: &str,
    member: &str,
    epoch: i32,
    topic: uuid::Uuid,
    (first, last, kind): (i64, i64, i8),
) -> ShareAcknowledgeRequest {
    let mut b = AckBatch::default();
    b.first_offset = first;
    b.last_offset = last;
    b.acknowledge_types = vec![kind];
    let mut p = AcknowledgePartition::default();
    p.partition_index = 0;
    p.acknowledgement_batches = vec![b];
    let mut t = AcknowledgeTopic::default();
    t.topic_id = topic;
    t.partitions = vec![p];
    let mut r = ShareAcknowledgeRequest::default();
    r.group_id = Some(GroupId(s(group)));
    r.member_id = Some(s(member));
    r.share_session_epoch = epoch;
    r.topics = vec![t];
    r
}

#[tokio::test]
async fn share_groups_and_consumer_groups_refuse_each_others_ids_and_are_listed_and_deleted() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "jobs").await;

    let joined: ShareGroupHeartbeatResponse = client
        .call(
            ApiKey::ShareGroupHeartbeat,
            1,
            &share_join("workers", "m1", "jobs"),
        )
        .await;
    assert_eq!(joined.error_code, 0);
    assert_eq!(joined.member_epoch, 1);
    let assigned = joined.assignment.expect("an assignment on joining");
    assert_eq!(assigned.topic_partitions[0].partitions, vec![0]);

    // A consumer group cannot take a share group's id, by either protocol.
    let mut cg = ConsumerGroupHeartbeatRequest::default();
    cg.group_id = GroupId(s("workers"));
    cg.member_id = s("c1");
    cg.member_epoch = 0;
    cg.rebalance_timeout_ms = 10_000;
    cg.subscribed_topic_names = Some(vec![topic_name("jobs")]);
    let refused: ConsumerGroupHeartbeatResponse =
        client.call(ApiKey::ConsumerGroupHeartbeat, 0, &cg).await;
    assert_eq!(refused.error_code, crate::errors::code::GROUP_ID_NOT_FOUND);
    let mut join = JoinGroupRequest::default();
    join.group_id = GroupId(s("workers"));
    join.session_timeout_ms = 10_000;
    join.rebalance_timeout_ms = 10_000;
    join.protocol_type = s("consumer");
    let refused: JoinGroupResponse = client.call(ApiKey::JoinGroup, 5, &join).await;
    assert_eq!(
        refused.error_code,
        crate::errors::code::INCONSISTENT_GROUP_PROTOCOL
    );

    // ...nor a share group a consumer group's (one that only has committed offsets).
    let mut commit = OffsetCommitRequest::default();
    commit.group_id = GroupId(s("billing"));
    commit.generation_id_or_member_epoch = -1;
    let mut p =
        kafka_protocol::messages::offset_commit_request::OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = 0;
    let mut t =
        kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = topic_name("jobs");
    t.partitions = vec![p];
    commit.topics = vec![t];
    let committed: OffsetCommitResponse = client.call(ApiKey::OffsetCommit, 8, &commit).await;
    assert_eq!(committed.topics[0].partitions[0].error_code, 0);
    let refused: ShareGroupHeartbeatResponse = client
        .call(
            ApiKey::ShareGroupHeartbeat,
            1,
            &share_join("billing", "m2", "jobs"),
        )
        .await;
    assert_eq!(refused.error_code, crate::errors::code::GROUP_ID_NOT_FOUND);

    let mut list = ListGroupsRequest::default();
    list.types_filter = vec![s("share")];
    let listed: ListGroupsResponse = client.call(ApiKey::ListGroups, 5, &list).await;
    let names: Vec<(&str, &str, &str)> = listed
        .groups
        .iter()
        .map(|g| {
            (
                g.group_id.0.as_str(),
                g.group_type.as_str(),
                g.group_state.as_str(),
            )
        })
        .collect();
    assert_eq!(names, vec![("workers", "share", "Stable")]);

    let mut delete = DeleteGroupsRequest::default();
    delete.groups_names = vec![GroupId(s("workers"))];
    let deleted: DeleteGroupsResponse = client.call(ApiKey::DeleteGroups, 2, &delete).await;
    assert_eq!(
        deleted.results[0].error_code,
        crate::errors::code::NON_EMPTY_GROUP
    );
    let mut leave = share_join("workers", "m1", "jobs");
    leave.member_epoch = -1;
    leave.subscribed_topic_names = None;
    let left: ShareGroupHeartbeatResponse =
        client.call(ApiKey::ShareGroupHeartbeat, 1, &leave).await;
    assert_eq!((left.error_code, left.member_epoch), (0, -1));
    let deleted: DeleteGroupsResponse = client.call(ApiKey::DeleteGroups, 2, &delete).await;
    assert_eq!(deleted.results[0].error_code, 0);
    let listed: ListGroupsResponse = client.call(ApiKey::ListGroups, 5, &list).await;
    assert!(listed.groups.is_empty());
    broker.shutdown().await;
}

#[tokio::test]
async fn an_acknowledgement_is_stored_before_it_is_answered_and_a_deposed_writer_is_refused() {
    let broker = start_with(|s| s.share_auto_offset_reset = ShareAutoOffsetReset::Earliest).await;
    let mut client = broker.client().await;
    let topic = create_topic(&mut client, "q").await;
    let produced: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request("q", -1, record_batch(&[b"a", b"b", b"c"], 1)),
        )
        .await;
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);

    let fetched: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("g", "m", 0, topic))
        .await;
    assert_eq!(fetched.error_code, 0);
    let part = &fetched.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    let ranges: Vec<(i64, i64, i16)> = part
        .acquired_records
        .iter()
        .map(|r| (r.first_offset, r.last_offset, r.delivery_count))
        .collect();
    assert_eq!(ranges, vec![(0, 2, 1)]);
    assert!(part.records.as_ref().is_some_and(|r| !r.is_empty()));

    // Accepting 0 is in storage once answered: the stored start offset moved past it.
    let acked: ShareAcknowledgeResponse = client
        .call(
            ApiKey::ShareAcknowledge,
            1,
            &share_ack("g", "m", 1, topic, (0, 0, 1)),
        )
        .await;
    assert_eq!(acked.error_code, 0);
    assert_eq!(acked.responses[0].partitions[0].error_code, 0);
    let t = broker.log.topic("q").unwrap();
    let key = ObjectKey::new(strata_layout::share::key(
        "g",
        strata_layout::TopicId(t.id.0),
        0,
    ))
    .unwrap();
    let (bytes, version) = broker.store.get(&key).await.unwrap();
    let stored: ShareSnapshot = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(stored.start_offset, 1);

    // Another owner claims the state (as a successor does on load): our next write is fenced,
    // and the acknowledgement it carried is refused, not confirmed.
    broker
        .store
        .put(&key, Bytes::from(bytes.to_vec()), PutMode::Update(version))
        .await
        .unwrap();
    let fenced: ShareAcknowledgeResponse = client
        .call(
            ApiKey::ShareAcknowledge,
            1,
            &share_ack("g", "m", 2, topic, (1, 1, 1)),
        )
        .await;
    assert_eq!(
        fenced.responses[0].partitions[0].error_code,
        crate::errors::code::NOT_LEADER_OR_FOLLOWER
    );
    let (bytes, _) = broker.store.get(&key).await.unwrap();
    let stored: ShareSnapshot = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        stored.start_offset, 1,
        "the refused acceptance of 1 is not stored"
    );

    // Loaded again from storage: 0 stays accepted, 1 and 2 (acquired, never stored as done)
    // are delivered again, with the delivery count the store knows.
    let again: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("g", "m2", 0, topic))
        .await;
    let ranges: Vec<(i64, i64)> = again.responses[0].partitions[0]
        .acquired_records
        .iter()
        .map(|r| (r.first_offset, r.last_offset))
        .collect();
    assert_eq!(ranges, vec![(1, 2)]);
    broker.shutdown().await;
}

#[tokio::test]
async fn share_sessions_follow_their_epochs() {
    let broker = start_with(|s| s.share_auto_offset_reset = ShareAutoOffsetReset::Earliest).await;
    let mut client = broker.client().await;
    let topic = create_topic(&mut client, "sessions").await;
    let unknown: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("g", "m", 3, topic))
        .await;
    assert_eq!(
        unknown.error_code,
        crate::errors::code::SHARE_SESSION_NOT_FOUND
    );
    let opened: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("g", "m", 0, topic))
        .await;
    assert_eq!(opened.error_code, 0);
    let wrong: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("g", "m", 2, topic))
        .await;
    assert_eq!(
        wrong.error_code,
        crate::errors::code::INVALID_SHARE_SESSION_EPOCH
    );
    let next: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("g", "m", 1, topic))
        .await;
    assert_eq!(next.error_code, 0);
    broker.shutdown().await;
}

fn describe_offsets(group: &str) -> DescribeShareGroupOffsetsRequest {
    let mut g =
        kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default();
    g.group_id = GroupId(s(group));
    g.topics = None;
    let mut r = DescribeShareGroupOffsetsRequest::default();
    r.groups = vec![g];
    r
}

fn stored_starts(response: &DescribeShareGroupOffsetsResponse) -> Vec<(String, i32, i64)> {
    response.groups[0]
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    t.topic_name.0.to_string(),
                    p.partition_index,
                    p.start_offset,
                )
            })
        })
        .collect()
}

#[tokio::test]
async fn share_group_offsets_are_described_altered_for_an_empty_group_and_deleted() {
    let broker = start_with(|s| s.share_auto_offset_reset = ShareAutoOffsetReset::Earliest).await;
    let mut client = broker.client().await;
    let topic = create_topic(&mut client, "admin").await;
    let values: Vec<Vec<u8>> = (0..6).map(|i| vec![b'a' + i]).collect();
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let produced: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request("admin", -1, record_batch(&refs, 1)),
        )
        .await;
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    let joined: ShareGroupHeartbeatResponse = client
        .call(
            ApiKey::ShareGroupHeartbeat,
            1,
            &share_join("ops", "m", "admin"),
        )
        .await;
    assert_eq!(joined.error_code, 0);

    let _: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("ops", "m", 0, topic))
        .await;
    let acked: ShareAcknowledgeResponse = client
        .call(
            ApiKey::ShareAcknowledge,
            1,
            &share_ack("ops", "m", 1, topic, (0, 1, 1)),
        )
        .await;
    assert_eq!(acked.responses[0].partitions[0].error_code, 0);
    let described: DescribeShareGroupOffsetsResponse = client
        .call(
            ApiKey::DescribeShareGroupOffsets,
            0,
            &describe_offsets("ops"),
        )
        .await;
    assert_eq!(stored_starts(&described), vec![("admin".to_string(), 0, 2)]);

    // Altering needs the group empty.
    let mut p = kafka_protocol::messages::alter_share_group_offsets_request::AlterShareGroupOffsetsRequestPartition::default();
    p.partition_index = 0;
    p.start_offset = 4;
    let mut t = kafka_protocol::messages::alter_share_group_offsets_request::AlterShareGroupOffsetsRequestTopic::default();
    t.topic_name = topic_name("admin");
    t.partitions = vec![p];
    let mut alter = AlterShareGroupOffsetsRequest::default();
    alter.group_id = GroupId(s("ops"));
    alter.topics = vec![t];
    let refused: AlterShareGroupOffsetsResponse =
        client.call(ApiKey::AlterShareGroupOffsets, 0, &alter).await;
    assert_eq!(refused.error_code, crate::errors::code::NON_EMPTY_GROUP);
    let closed: ShareAcknowledgeResponse = client
        .call(
            ApiKey::ShareAcknowledge,
            1,
            &share_ack("ops", "m", -1, topic, (2, 2, 1)),
        )
        .await;
    assert_eq!(closed.error_code, 0);
    let mut leave = share_join("ops", "m", "admin");
    leave.member_epoch = -1;
    let _: ShareGroupHeartbeatResponse = client.call(ApiKey::ShareGroupHeartbeat, 1, &leave).await;
    let altered: AlterShareGroupOffsetsResponse =
        client.call(ApiKey::AlterShareGroupOffsets, 0, &alter).await;
    assert_eq!(altered.error_code, 0);
    assert_eq!(altered.responses[0].partitions[0].error_code, 0);
    let described: DescribeShareGroupOffsetsResponse = client
        .call(
            ApiKey::DescribeShareGroupOffsets,
            0,
            &describe_offsets("ops"),
        )
        .await;
    assert_eq!(stored_starts(&described), vec![("admin".to_string(), 0, 4)]);

    // A new session starts where the administrator said.
    let fetched: ShareFetchResponse = client
        .call(ApiKey::ShareFetch, 1, &share_fetch("ops", "m2", 0, topic))
        .await;
    let ranges: Vec<(i64, i64)> = fetched.responses[0].partitions[0]
        .acquired_records
        .iter()
        .map(|r| (r.first_offset, r.last_offset))
        .collect();
    assert_eq!(ranges, vec![(4, 5)]);

    let mut dt = kafka_protocol::messages::delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic::default();
    dt.topic_name = topic_name("admin");
    let mut delete = DeleteShareGroupOffsetsRequest::default();
    delete.group_id = GroupId(s("ops"));
    delete.topics = vec![dt];
    let deleted: DeleteShareGroupOffsetsResponse = client
        .call(ApiKey::DeleteShareGroupOffsets, 0, &delete)
        .await;
    assert_eq!(deleted.error_code, 0);
    assert_eq!(deleted.responses[0].error_code, 0);
    let described: DescribeShareGroupOffsetsResponse = client
        .call(
            ApiKey::DescribeShareGroupOffsets,
            0,
            &describe_offsets("ops"),
        )
        .await;
    assert!(stored_starts(&described).is_empty());
    broker.shutdown().await;
}
