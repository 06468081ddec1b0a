//! Fetch sessions (KIP-227) over the wire: a full fetch opens a session, and incremental
//! fetches of it list only the partitions with something new, or wait for some.

use kafka_protocol::messages::fetch_request::ForgottenTopic;
use strata_core::TopicPartition;
use strata_log::Acks;

use crate::errors::code;

use super::*;

const PARTITIONS: i32 = 8;

/// A topic of [`PARTITIONS`] partitions holding one batch each; returns its id.
async fn topic_with_one_batch_per_partition(broker: &TestBroker, name: &str) -> uuid::Uuid {
    let info = broker
        .log
        .create_topic(name, Some(PARTITIONS), Default::default(), false)
        .await
        .unwrap();
    for p in 0..PARTITIONS {
        append(broker, name, p).await;
    }
    crate::handlers::uuid_of(info.id)
}

async fn append(broker: &TestBroker, topic: &str, partition: i32) {
    let tp = TopicPartition::new(topic, partition);
    let acks = Acks::Durable { timeout: PATIENCE };
    let batch = record_batch(&[format!("{topic}-{partition}").as_bytes()], 1);
    broker.log.append(&tp, batch, acks).await.unwrap();
}

/// A fetch of `partitions` (partition, offset) of one topic, named as `version` names topics.
fn fetch(
    version: i16,
    topic: (&str, uuid::Uuid),
    partitions: &[(i32, i64)],
    session: (i32, i32),
    max_wait_ms: i32,
) -> FetchRequest {
    let mut t = FetchTopic::default();
    if version >= 13 {
        t.topic_id = topic.1;
    } else {
        t.topic = topic_name(topic.0);
    }
    t.partitions = partitions
        .iter()
        .map(|&(p, offset)| {
            let mut partition = FetchPartition::default();
            partition.partition = p;
            partition.fetch_offset = offset;
            partition.partition_max_bytes = 1 << 20;
            partition
        })
        .collect();
    let mut request = FetchRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.max_wait_ms = max_wait_ms;
    request.min_bytes = 1;
    request.max_bytes = 50 << 20;
    request.session_id = session.0;
    request.session_epoch = session.1;
    if !t.partitions.is_empty() {
        request.topics = vec![t];
    }
    request
}

/// The partitions an answer lists, with whether each carries records.
fn listed(response: &FetchResponse) -> Vec<(i32, bool)> {
    response
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            assert_eq!(p.error_code, 0, "partition {}", p.partition_index);
            let has_records = p.records.as_ref().is_some_and(|r| !r.is_empty());
            (p.partition_index, has_records)
        })
        .collect()
}

#[tokio::test]
async fn incremental_fetches_list_only_partitions_with_new_data_by_name_and_by_id() {
    let broker = start().await;
    let mut client = broker.client().await;
    for version in [12, 13, 16] {
        let name = format!("sessions-v{version}");
        let id = topic_with_one_batch_per_partition(&broker, &name).await;
        let topic = (name.as_str(), id);
        let everything: Vec<_> = (0..PARTITIONS).map(|p| (p, 0)).collect();
        let full: FetchResponse = client
            .call(
                ApiKey::Fetch,
                version,
                &fetch(version, topic, &everything, (0, 0), 0),
            )
            .await;
        assert_eq!(full.error_code, 0);
        assert_ne!(full.session_id, 0, "v{version}: no session created");
        let all: Vec<_> = (0..PARTITIONS).map(|p| (p, true)).collect();
        assert_eq!(listed(&full), all, "v{version}");
        let session = full.session_id;

        // The client moves every position past the batch it got: nothing new anywhere.
        let moved: Vec<_> = (0..PARTITIONS).map(|p| (p, 1)).collect();
        let quiet: FetchResponse = client
            .call(
                ApiKey::Fetch,
                version,
                &fetch(version, topic, &moved, (session, 1), 0),
            )
            .await;
        assert_eq!(quiet.error_code, 0);
        assert_eq!(quiet.session_id, session);
        assert_eq!(listed(&quiet), vec![], "v{version}");

        append(&broker, &name, 5).await;
        let one: FetchResponse = client
            .call(
                ApiKey::Fetch,
                version,
                &fetch(version, topic, &[], (session, 2), 0),
            )
            .await;
        assert_eq!(listed(&one), vec![(5, true)], "v{version}");
        assert_eq!(one.responses[0].partitions[0].high_watermark, 2);

        // Replaying an epoch, and switching between names and ids, are refused.
        let replay: FetchResponse = client
            .call(
                ApiKey::Fetch,
                version,
                &fetch(version, topic, &[], (session, 2), 0),
            )
            .await;
        assert_eq!(replay.error_code, code::INVALID_FETCH_SESSION_EPOCH);
        assert!(replay.responses.is_empty());
        let other_version = if version >= 13 { 12 } else { 13 };
        let switched: FetchResponse = client
            .call(
                ApiKey::Fetch,
                other_version,
                &fetch(other_version, topic, &[], (session, 3), 0),
            )
            .await;
        assert_eq!(switched.error_code, code::FETCH_SESSION_TOPIC_ID_ERROR);

        // Forgetting every partition closes the session.
        let mut forget = fetch(version, topic, &[], (session, 3), 0);
        let mut forgotten = ForgottenTopic::default();
        if version >= 13 {
            forgotten.topic_id = id;
        } else {
            forgotten.topic = topic_name(&name);
        }
        forgotten.partitions = (0..PARTITIONS).collect();
        forget.forgotten_topics_data = vec![forgotten];
        let closed: FetchResponse = client.call(ApiKey::Fetch, version, &forget).await;
        assert_eq!(closed.error_code, 0);
        assert_eq!(closed.session_id, 0);
        let gone: FetchResponse = client
            .call(
                ApiKey::Fetch,
                version,
                &fetch(version, topic, &[], (session, 4), 0),
            )
            .await;
        assert_eq!(gone.error_code, code::FETCH_SESSION_ID_NOT_FOUND);
    }
    broker.shutdown().await;
}

#[tokio::test]
async fn an_incremental_fetch_with_nothing_new_waits_for_data_and_lists_where_it_landed() {
    let broker = start().await;
    let mut client = broker.client().await;
    let id = topic_with_one_batch_per_partition(&broker, "sessions-wait").await;
    let topic = ("sessions-wait", id);
    let past_all: Vec<_> = (0..PARTITIONS).map(|p| (p, 1)).collect();
    let full: FetchResponse = client
        .call(ApiKey::Fetch, 12, &fetch(12, topic, &past_all, (0, 0), 0))
        .await;
    assert_ne!(full.session_id, 0);
    // Waits up to 60 s; the test's patience is 20 s, so only a wake-up passes.
    let sent = client
        .send(
            ApiKey::Fetch,
            12,
            &fetch(12, topic, &[], (full.session_id, 1), 60_000),
        )
        .await;
    append(&broker, "sessions-wait", 3).await;
    let (got, woken): (i32, FetchResponse) = tokio::time::timeout(PATIENCE, client.recv(12))
        .await
        .expect("the long poll wakes on the append");
    assert_eq!(got, sent);
    assert_eq!(listed(&woken), vec![(3, true)]);
    broker.shutdown().await;
}

#[tokio::test]
async fn a_full_cache_answers_without_a_session() {
    let broker = start_with(|s| s.max_incremental_fetch_session_cache_slots = 1).await;
    let mut client = broker.client().await;
    let id = topic_with_one_batch_per_partition(&broker, "sessions-full").await;
    let topic = ("sessions-full", id);
    let everything: Vec<_> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let first: FetchResponse = client
        .call(ApiKey::Fetch, 12, &fetch(12, topic, &everything, (0, 0), 0))
        .await;
    assert_ne!(first.session_id, 0);
    // The only slot is taken by a session neither idle nor old: no session, all partitions.
    let second: FetchResponse = client
        .call(ApiKey::Fetch, 12, &fetch(12, topic, &everything, (0, 0), 0))
        .await;
    assert_eq!(second.error_code, 0);
    assert_eq!(second.session_id, 0);
    assert_eq!(listed(&second).len(), PARTITIONS as usize);
    broker.shutdown().await;
}
