//! The describing admin APIs over the wire: DescribeTopicPartitions' pagination, DescribeLogDirs,
//! DescribeProducers, broker configs, ListConfigResources, and the APIs of features Strata does
//! not have (ACLs, SCRAM, quotas, transactions), which must answer at once.

use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::describe_producers_request::TopicRequest as ProducersTopic;
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;

use std::collections::BTreeMap;

use kafka_protocol::messages::BrokerId as WireBrokerId;

use super::*;

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
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

fn dtp_request(
    topics: &[&str],
    limit: i32,
    cursor: Option<(&str, i32)>,
) -> DescribeTopicPartitionsRequest {
    let mut request = DescribeTopicPartitionsRequest::default();
    request.topics = topics
        .iter()
        .map(|t| {
            let mut r = TopicRequest::default();
            r.name = topic_name(t);
            r
        })
        .collect();
    request.response_partition_limit = limit;
    request.cursor = cursor.map(|(name, partition)| {
        let mut c = Cursor::default();
        c.topic_name = topic_name(name);
        c.partition_index = partition;
        c
    });
    request
}

/// (topic, error, partition indexes) of an answer, and its next cursor.
type Page = (Vec<(String, i16, Vec<i32>)>, Option<(String, i32)>);

fn page(response: &DescribeTopicPartitionsResponse) -> Page {
    let topics = response
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(),
                t.error_code,
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect();
    let cursor = response
        .next_cursor
        .as_ref()
        .map(|c| (c.topic_name.0.to_string(), c.partition_index));
    (topics, cursor)
}

fn t(name: &str, error: i16, partitions: &[i32]) -> (String, i16, Vec<i32>) {
    (name.to_string(), error, partitions.to_vec())
}

#[tokio::test]
async fn describe_topic_partitions_pages_through_named_topics_with_kafkas_cursor() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "a", 3).await;
    create_topic_with(&mut client, "b", 2).await;
    create_topic_with(&mut client, "c", 1).await;
    let named = ["c", "missing", "a", "b"];
    let broker_ref = &broker;
    let call = |cursor: Option<(&str, i32)>| {
        let request = dtp_request(&named, 2, cursor);
        async move {
            let mut client = broker_ref.client().await;
            let response: DescribeTopicPartitionsResponse = client
                .call(ApiKey::DescribeTopicPartitions, 0, &request)
                .await;
            page(&response)
        }
    };
    // Sorted by name; at most two partitions an answer; the cursor names the next one.
    assert_eq!(
        call(None).await,
        (vec![t("a", 0, &[0, 1])], Some(("a".to_string(), 2)))
    );
    assert_eq!(
        call(Some(("a", 2))).await,
        (
            vec![t("a", 0, &[2]), t("b", 0, &[0])],
            Some(("b".to_string(), 1))
        )
    );
    // The limit is used up exactly at the end of c: the cursor points at the next topic's
    // start, whether or not it exists, as in Kafka.
    assert_eq!(
        call(Some(("b", 1))).await,
        (
            vec![t("b", 0, &[1]), t("c", 0, &[0])],
            Some(("missing".to_string(), 0))
        )
    );
    assert_eq!(
        call(Some(("missing", 0))).await,
        (vec![t("missing", 3, &[])], None)
    );
    broker.shutdown().await;
}

#[tokio::test]
async fn describe_topic_partitions_agrees_with_metadata_and_lists_all_topics() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "agree", 3).await;
    let response: DescribeTopicPartitionsResponse = client
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &dtp_request(&[], 2000, None),
        )
        .await;
    assert!(response.next_cursor.is_none());
    let names: Vec<String> = response
        .topics
        .iter()
        .map(|t| t.name.as_ref().unwrap().0.to_string())
        .collect();
    // Every topic, the internal ones included (they sort first), in name order.
    assert_eq!(
        names,
        ["__consumer_offsets", "__transaction_state", "agree"]
    );
    assert!(response.topics[0].is_internal && response.topics[1].is_internal);
    let described = &response.topics[2];
    assert_eq!(
        described.topic_authorized_operations,
        crate::handlers::acl_op::topic_all()
    );

    let metadata: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&["agree"]))
        .await;
    let from_metadata = &metadata.topics[0];
    assert_eq!(described.topic_id, from_metadata.topic_id);
    assert!(!described.topic_id.is_nil());
    let view = |leader: i32, epoch: i32, replicas: &[WireBrokerId], isr: &[WireBrokerId]| {
        (
            leader,
            epoch,
            replicas.iter().map(|b| b.0).collect::<Vec<_>>(),
            isr.iter().map(|b| b.0).collect::<Vec<_>>(),
        )
    };
    for (d, m) in described.partitions.iter().zip(&from_metadata.partitions) {
        assert_eq!(d.partition_index, m.partition_index);
        assert_eq!(d.error_code, m.error_code);
        assert_eq!(
            view(
                d.leader_id.0,
                d.leader_epoch,
                &d.replica_nodes,
                &d.isr_nodes
            ),
            view(
                m.leader_id.0,
                m.leader_epoch,
                &m.replica_nodes,
                &m.isr_nodes
            )
        );
        assert_eq!(d.eligible_leader_replicas, Some(vec![]));
    }
    assert_eq!(described.partitions.len(), 3);
    broker.shutdown().await;
}

#[tokio::test]
async fn describe_topic_partitions_bounds_an_answer_by_the_broker_limit() {
    let broker = start_with(|s| s.max_request_partition_size_limit = 2).await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "big", 5).await;
    // The client's limit is lowered to the broker's...
    let response: DescribeTopicPartitionsResponse = client
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &dtp_request(&["big"], 100, None),
        )
        .await;
    assert_eq!(
        page(&response),
        (vec![t("big", 0, &[0, 1])], Some(("big".to_string(), 2)))
    );
    // ...and a limit of 0 (or less) is raised to one partition, as Kafka does.
    let response: DescribeTopicPartitionsResponse = client
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &dtp_request(&["big"], 0, None),
        )
        .await;
    assert_eq!(
        page(&response),
        (vec![t("big", 0, &[0])], Some(("big".to_string(), 1)))
    );
    // A cursor past the last partition describes none of it.
    let response: DescribeTopicPartitionsResponse = client
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &dtp_request(&["big"], 2, Some(("big", 9))),
        )
        .await;
    assert_eq!(page(&response), (vec![t("big", 0, &[])], None));
    broker.shutdown().await;
}

#[tokio::test]
async fn describe_topic_partitions_refuses_a_cursor_it_cannot_follow() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "x", 1).await;
    for cursor in [("y", 0), ("x", -1)] {
        let response: DescribeTopicPartitionsResponse = client
            .call(
                ApiKey::DescribeTopicPartitions,
                0,
                &dtp_request(&["x"], 10, Some(cursor)),
            )
            .await;
        assert_eq!(page(&response), (vec![t("x", 42, &[])], None), "{cursor:?}");
    }
    // An illegal name is INVALID_TOPIC_EXCEPTION, not unknown.
    let response: DescribeTopicPartitionsResponse = client
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &dtp_request(&["bad/name"], 10, None),
        )
        .await;
    assert_eq!(page(&response), (vec![t("bad/name", 17, &[])], None));
    broker.shutdown().await;
}

#[tokio::test]
async fn describe_log_dirs_reports_the_bytes_each_partition_holds() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "sized", 2).await;
    let batch = record_batch(&[b"one", b"two", b"three"], 1_700_000_000_000);
    let produced: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request("sized", -1, batch.clone()),
        )
        .await;
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);

    // Null asks for every partition hosted here.
    let mut all = DescribeLogDirsRequest::default();
    all.topics = None;
    for v in [1, 3, 4] {
        let response: DescribeLogDirsResponse = client.call(ApiKey::DescribeLogDirs, v, &all).await;
        assert_eq!(response.error_code, 0, "v{v}");
        assert_eq!(response.results.len(), 1, "v{v}");
        let dir = &response.results[0];
        assert_eq!(dir.log_dir.as_str(), "memory://");
        if v >= 4 {
            assert_eq!((dir.total_bytes, dir.usable_bytes), (-1, -1));
        }
        let sized = dir
            .topics
            .iter()
            .find(|t| t.name.0.as_str() == "sized")
            .expect("the topic is hosted here");
        let sizes: Vec<(i32, i64, i64, bool)> = sized
            .partitions
            .iter()
            .map(|p| {
                (
                    p.partition_index,
                    p.partition_size,
                    p.offset_lag,
                    p.is_future_key,
                )
            })
            .collect();
        let len = batch.len() as i64;
        assert_eq!(sizes, [(0, len, 0, false), (1, 0, 0, false)], "v{v}");
    }

    // Named partitions: those not hosted here (unknown ones) are left out.
    let mut wanted = DescribableLogDirTopic::default();
    wanted.topic = topic_name("sized");
    wanted.partitions = vec![1, 7];
    let mut unknown = DescribableLogDirTopic::default();
    unknown.topic = topic_name("nope");
    unknown.partitions = vec![0];
    let mut request = DescribeLogDirsRequest::default();
    request.topics = Some(vec![wanted, unknown]);
    let response: DescribeLogDirsResponse = client.call(ApiKey::DescribeLogDirs, 4, &request).await;
    let topics: Vec<(String, Vec<i32>)> = response.results[0]
        .topics
        .iter()
        .map(|t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect();
    assert_eq!(topics, [("sized".to_string(), vec![1])]);
    broker.shutdown().await;
}

#[tokio::test]
async fn describe_producers_reports_the_idempotent_state_of_a_partition() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "idem", 1).await;
    let init: InitProducerIdResponse = client
        .call(ApiKey::InitProducerId, 4, &{
            let mut r = InitProducerIdRequest::default();
            r.transactional_id = None;
            r.transaction_timeout_ms = 60_000;
            r.producer_id = ProducerId(-1);
            r.producer_epoch = -1;
            r
        })
        .await;
    assert_eq!(init.error_code, 0);
    let pid = init.producer_id.0;
    let epoch = init.producer_epoch;
    for (seq, ts) in [(0, 1_700_000_000_000), (3, 1_700_000_000_500)] {
        let batch = producer_batch(&[b"a", b"b", b"c"], ts, (pid, epoch, seq));
        let produced: ProduceResponse = client
            .call(ApiKey::Produce, 9, &produce_request("idem", -1, batch))
            .await;
        assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    }
    let mut topic = ProducersTopic::default();
    topic.name = topic_name("idem");
    topic.partition_indexes = vec![0, 5];
    let mut request = DescribeProducersRequest::default();
    request.topics = vec![topic];
    let response: DescribeProducersResponse =
        client.call(ApiKey::DescribeProducers, 0, &request).await;
    let partitions = &response.topics[0].partitions;
    assert_eq!(partitions[0].error_code, 0);
    let states: Vec<(i64, i32, i32, i64, i32, i64)> = partitions[0]
        .active_producers
        .iter()
        .map(|p| {
            (
                p.producer_id.0,
                p.producer_epoch,
                p.last_sequence,
                p.last_timestamp,
                p.coordinator_epoch,
                p.current_txn_start_offset,
            )
        })
        .collect();
    assert_eq!(
        states,
        [(pid, i32::from(epoch), 5, 1_700_000_000_500, -1, -1)]
    );
    assert_eq!(partitions[1].error_code, 3, "no partition 5");
    broker.shutdown().await;
}

fn describe_configs_request(kind: i8, name: &str) -> DescribeConfigsRequest {
    let mut resource = DescribeConfigsResource::default();
    resource.resource_type = kind;
    resource.resource_name = s(name);
    resource.configuration_keys = None;
    let mut request = DescribeConfigsRequest::default();
    request.resources = vec![resource];
    request.include_synonyms = true;
    request
}

#[tokio::test]
async fn broker_configs_carry_kafkas_keys_from_the_settings_with_their_source() {
    let broker = start_with(|s| {
        s.auto_create_topics = false;
        s.group_shards = 3;
    })
    .await;
    let port = broker.addr.port();
    let mut client = broker.client().await;
    let response: DescribeConfigsResponse = client
        .call(
            ApiKey::DescribeConfigs,
            4,
            &describe_configs_request(4, "0"),
        )
        .await;
    let result = &response.results[0];
    assert_eq!(result.error_code, 0);
    let configs: BTreeMap<String, (String, i8, bool)> = result
        .configs
        .iter()
        .map(|c| {
            assert_eq!(c.synonyms.len(), 1, "{}", c.name.as_str());
            assert_eq!(c.synonyms[0].source, c.config_source);
            (
                c.name.to_string(),
                (
                    c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                    c.config_source,
                    c.read_only,
                ),
            )
        })
        .collect();
    let get = |key: &str| configs.get(key).cloned().unwrap_or_else(|| panic!("{key}"));
    const STATIC: i8 = 4;
    const DEFAULT: i8 = 5;
    assert_eq!(
        get("advertised.listeners"),
        (format!("PLAINTEXT://127.0.0.1:{port}"), STATIC, true)
    );
    assert_eq!(get("node.id"), ("0".to_string(), STATIC, true));
    assert_eq!(
        get("auto.create.topics.enable"),
        ("false".to_string(), STATIC, true)
    );
    assert_eq!(
        get("offsets.topic.num.partitions"),
        ("3".to_string(), STATIC, true)
    );
    // The test broker sets no rebalance delay; Strata's default is 3 s.
    assert_eq!(
        get("group.initial.rebalance.delay.ms"),
        ("0".to_string(), STATIC, true)
    );
    assert_eq!(get("num.partitions"), ("1".to_string(), DEFAULT, true));
    assert_eq!(
        get("default.replication.factor"),
        ("1".to_string(), DEFAULT, true)
    );
    assert_eq!(
        get("log.retention.ms"),
        ("604800000".to_string(), DEFAULT, true)
    );
    assert_eq!(
        get("log.retention.bytes"),
        ("-1".to_string(), DEFAULT, true)
    );
    assert_eq!(
        get("message.max.bytes"),
        ("1048588".to_string(), DEFAULT, true)
    );
    assert_eq!(
        get("max.request.partition.size.limit"),
        ("2000".to_string(), DEFAULT, true)
    );
    for key in ["listeners", "log.dirs", "broker.id"] {
        assert!(configs.contains_key(key), "{key}");
    }

    // BROKER_LOGGER: no per-logger levels, an empty list; another broker's id is refused.
    let response: DescribeConfigsResponse = client
        .call(
            ApiKey::DescribeConfigs,
            4,
            &describe_configs_request(8, "0"),
        )
        .await;
    assert_eq!(response.results[0].error_code, 0);
    assert!(response.results[0].configs.is_empty());
    let response: DescribeConfigsResponse = client
        .call(
            ApiKey::DescribeConfigs,
            4,
            &describe_configs_request(8, "7"),
        )
        .await;
    assert_eq!(response.results[0].error_code, 42);
    broker.shutdown().await;
}

#[tokio::test]
async fn list_config_resources_lists_topics_and_brokers_by_type() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "listed", 1).await;
    let broker_ref = &broker;
    let call = |version: i16, types: Vec<i8>| {
        let mut request = ListConfigResourcesRequest::default();
        request.resource_types = types;
        async move {
            let mut client = broker_ref.client().await;
            let response: ListConfigResourcesResponse = client
                .call(ApiKey::ListConfigResources, version, &request)
                .await;
            let listed: Vec<(i8, String)> = response
                .config_resources
                .iter()
                .map(|r| (r.resource_type, r.resource_name.to_string()))
                .collect();
            (response.error_code, listed)
        }
    };
    let all = vec![
        (2, "__consumer_offsets".to_string()),
        (2, "__transaction_state".to_string()),
        (2, "listed".to_string()),
        (4, "0".to_string()),
    ];
    assert_eq!(call(1, vec![]).await, (0, all.clone()));
    assert_eq!(call(1, vec![4]).await, (0, vec![(4, "0".to_string())]));
    assert_eq!(call(1, vec![16, 32, 8]).await, (0, vec![]));
    assert_eq!(call(1, vec![99]).await, (35, vec![]));
    // v0 was ListClientMetricsResources: there are no client-metrics subscriptions.
    assert_eq!(call(0, vec![]).await, (0, vec![]));
    broker.shutdown().await;
}

#[tokio::test]
async fn security_and_transaction_apis_answer_at_once_as_kafka_without_them() {
    let broker = start().await;
    let mut client = broker.client().await;
    for v in 1..=3 {
        let response: DescribeAclsResponse = client
            .call(ApiKey::DescribeAcls, v, &DescribeAclsRequest::default())
            .await;
        assert_eq!(response.error_code, 54, "SECURITY_DISABLED v{v}");
        let mut request = CreateAclsRequest::default();
        request.creations = vec![AclCreation::default(), AclCreation::default()];
        let response: CreateAclsResponse = client.call(ApiKey::CreateAcls, v, &request).await;
        let codes: Vec<i16> = response.results.iter().map(|r| r.error_code).collect();
        assert_eq!(codes, [54, 54], "v{v}");
        let mut request = DeleteAclsRequest::default();
        request.filters = vec![Default::default()];
        let response: DeleteAclsResponse = client.call(ApiKey::DeleteAcls, v, &request).await;
        assert_eq!(response.filter_results[0].error_code, 54, "v{v}");
    }

    let mut request = DescribeUserScramCredentialsRequest::default();
    let response: DescribeUserScramCredentialsResponse = client
        .call(ApiKey::DescribeUserScramCredentials, 0, &request)
        .await;
    assert_eq!((response.error_code, response.results.len()), (0, 0));
    let mut alice = UserName::default();
    alice.name = s("alice");
    request.users = Some(vec![alice]);
    let response: DescribeUserScramCredentialsResponse = client
        .call(ApiKey::DescribeUserScramCredentials, 0, &request)
        .await;
    assert_eq!(response.results[0].error_code, 91, "RESOURCE_NOT_FOUND");
    assert_eq!(response.results[0].user.as_str(), "alice");

    let response: DescribeClientQuotasResponse = client
        .call(
            ApiKey::DescribeClientQuotas,
            1,
            &DescribeClientQuotasRequest::default(),
        )
        .await;
    assert_eq!((response.error_code, response.entries), (0, Some(vec![])));

    let mut request = ListTransactionsRequest::default();
    request.state_filters = vec![s("Ongoing"), s("Sleeping")];
    let response: ListTransactionsResponse =
        client.call(ApiKey::ListTransactions, 2, &request).await;
    assert_eq!(response.error_code, 0);
    assert!(response.transaction_states.is_empty());
    assert_eq!(response.unknown_state_filters, [s("Sleeping")]);

    let mut request = DescribeTransactionsRequest::default();
    request.transactional_ids = vec![TransactionalId(s("tx"))];
    let response: DescribeTransactionsResponse =
        client.call(ApiKey::DescribeTransactions, 0, &request).await;
    assert_eq!(response.transaction_states[0].error_code, 105);
    broker.shutdown().await;
}
