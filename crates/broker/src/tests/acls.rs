//! The ACL authorizer in process: the client is `User:ANONYMOUS` (a PLAINTEXT listener), its
//! first rights written straight to storage as an operator's tool would, the rest through the
//! ACL APIs of the broker itself.

use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;

use super::*;
use crate::security::acl::{
    AccessEntry, AclBinding, AuthorizerConfig, Operation, PatternType, Permission, ResourcePattern,
    ResourceType, CLUSTER_NAME,
};
use crate::security::AclStore;

const ANONYMOUS: &str = "User:ANONYMOUS";
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
const SECURITY_DISABLED: i16 = 54;
const INVALID_REQUEST: i16 = 42;

fn allow(resource_type: ResourceType, name: &str, operation: Operation) -> AclBinding {
    AclBinding {
        pattern: ResourcePattern {
            resource_type,
            pattern_type: PatternType::Literal,
            name: name.into(),
        },
        entry: AccessEntry {
            principal: ANONYMOUS.into(),
            host: "*".into(),
            operation,
            permission: Permission::Allow,
        },
    }
}

/// A broker enforcing ACLs, where ANONYMOUS may manage ACLs and create topics, write and
/// describe `open`, and nothing else.
async fn guarded_broker() -> TestBroker {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let acls = AclStore::new(
        Arc::clone(&store),
        SystemClock::shared(),
        AuthorizerConfig::default(),
        Duration::from_secs(1),
    );
    let created = acls
        .create(&[
            allow(ResourceType::Cluster, CLUSTER_NAME, Operation::Alter),
            allow(ResourceType::Cluster, CLUSTER_NAME, Operation::Describe),
            allow(ResourceType::Cluster, CLUSTER_NAME, Operation::Create),
            allow(ResourceType::Topic, "open", Operation::Write),
        ])
        .await;
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
    start_on(store, |s| {
        s.authorizer = Some(AuthorizerConfig::default());
    })
    .await
}

fn creation(name: &str, operation: Operation) -> AclCreation {
    let mut c = AclCreation::default();
    c.resource_type = ResourceType::Topic.code();
    c.resource_name = StrBytes::from_string(name.to_string());
    c.resource_pattern_type = PatternType::Literal.code();
    c.principal = StrBytes::from_static_str(ANONYMOUS);
    c.host = StrBytes::from_static_str("*");
    c.operation = operation.code();
    c.permission_type = Permission::Allow.code();
    c
}

async fn produce_code(client: &mut Client, topic: &str) -> i16 {
    let records = record_batch(&[b"v"], 1);
    let response: ProduceResponse = client
        .call(ApiKey::Produce, 9, &produce_request(topic, -1, records))
        .await;
    response.responses[0].partition_responses[0].error_code
}

#[tokio::test]
async fn a_topic_without_write_is_refused_and_an_acl_made_through_the_api_opens_it() {
    let broker = guarded_broker().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "open").await;
    let mut request = CreateTopicsRequest::default();
    request.topics = vec![creatable("closed", 1, 1)];
    request.timeout_ms = 10_000;
    let created: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    assert_eq!(created.topics[0].error_code, 0, "CREATE on the cluster");

    assert_eq!(produce_code(&mut client, "open").await, 0);
    assert_eq!(
        produce_code(&mut client, "closed").await,
        TOPIC_AUTHORIZATION_FAILED
    );
    // Not even whether it exists is told: an unknown topic is refused the same way, and not
    // created.
    assert_eq!(
        produce_code(&mut client, "nowhere").await,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert!(broker.log.topic("nowhere").is_none());

    // Metadata of every topic lists only those it may describe (WRITE implies DESCRIBE); a
    // named one it may not describe is TOPIC_AUTHORIZATION_FAILED.
    let mut every = MetadataRequest::default();
    every.topics = None;
    let all: MetadataResponse = client.call(ApiKey::Metadata, 12, &every).await;
    let names: Vec<_> = all
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect();
    assert_eq!(names, ["open"]);
    let named: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&["closed"]))
        .await;
    assert_eq!(named.topics[0].error_code, TOPIC_AUTHORIZATION_FAILED);

    // Granted through the broker: enforced at once, here.
    let mut request = CreateAclsRequest::default();
    request.creations = vec![creation("closed", Operation::Write)];
    let created: CreateAclsResponse = client.call(ApiKey::CreateAcls, 3, &request).await;
    assert_eq!(created.results[0].error_code, 0, "{:?}", created.results[0]);
    assert_eq!(produce_code(&mut client, "closed").await, 0);

    // Described, then taken away again.
    let mut describe = DescribeAclsRequest::default();
    describe.resource_type_filter = ResourceType::Topic.code();
    describe.resource_name_filter = Some(StrBytes::from_static_str("closed"));
    describe.pattern_type_filter = 2; // MATCH
    describe.principal_filter = None;
    describe.host_filter = None;
    describe.operation = 1;
    describe.permission_type = 1;
    let described: DescribeAclsResponse = client.call(ApiKey::DescribeAcls, 3, &describe).await;
    assert_eq!(described.error_code, 0);
    assert_eq!(described.resources.len(), 1);
    assert_eq!(
        described.resources[0].acls[0].operation,
        Operation::Write.code()
    );

    let mut filter = DeleteAclsFilter::default();
    filter.resource_type_filter = ResourceType::Topic.code();
    filter.resource_name_filter = Some(StrBytes::from_static_str("closed"));
    filter.pattern_type_filter = PatternType::Literal.code();
    filter.principal_filter = None;
    filter.host_filter = None;
    filter.operation = 1;
    filter.permission_type = 1;
    let mut delete = DeleteAclsRequest::default();
    delete.filters = vec![filter];
    let deleted: DeleteAclsResponse = client.call(ApiKey::DeleteAcls, 3, &delete).await;
    assert_eq!(deleted.filter_results[0].error_code, 0);
    assert_eq!(deleted.filter_results[0].matching_acls.len(), 1);
    assert_eq!(
        produce_code(&mut client, "closed").await,
        TOPIC_AUTHORIZATION_FAILED
    );
    broker.shutdown().await;
}

#[tokio::test]
async fn bad_bindings_are_refused_one_by_one_and_users_need_cluster_rights() {
    let broker = guarded_broker().await;
    let mut client = broker.client().await;
    let mut bad = creation("t", Operation::Read);
    bad.principal = StrBytes::from_static_str("no-colon");
    let mut request = CreateAclsRequest::default();
    request.creations = vec![bad, creation("t", Operation::Read)];
    let created: CreateAclsResponse = client.call(ApiKey::CreateAcls, 3, &request).await;
    assert_eq!(created.results[0].error_code, INVALID_REQUEST);
    assert_eq!(created.results[1].error_code, 0);

    // Every right on the cluster taken away (ALTER alone would imply DESCRIBE): the user
    // APIs, open to any client before ACLs existed, are refused.
    let mut filter = DeleteAclsFilter::default();
    filter.resource_type_filter = ResourceType::Cluster.code();
    filter.resource_name_filter = None;
    filter.pattern_type_filter = 1;
    filter.principal_filter = None;
    filter.host_filter = None;
    filter.operation = 1;
    filter.permission_type = 1;
    let mut delete = DeleteAclsRequest::default();
    delete.filters = vec![filter];
    let deleted: DeleteAclsResponse = client.call(ApiKey::DeleteAcls, 3, &delete).await;
    assert_eq!(deleted.filter_results[0].matching_acls.len(), 3);
    let described: DescribeUserScramCredentialsResponse = client
        .call(
            ApiKey::DescribeUserScramCredentials,
            0,
            &DescribeUserScramCredentialsRequest::default(),
        )
        .await;
    assert_eq!(described.error_code, CLUSTER_AUTHORIZATION_FAILED);
    let mut alter = AlterUserScramCredentialsRequest::default();
    let mut deletion =
        kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialDeletion::default();
    deletion.name = StrBytes::from_static_str("admin");
    deletion.mechanism = 2;
    alter.deletions = vec![deletion];
    let altered: AlterUserScramCredentialsResponse = client
        .call(ApiKey::AlterUserScramCredentials, 0, &alter)
        .await;
    assert_eq!(altered.results[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    // Client quotas too, as Kafka: DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster.
    let quotas: DescribeClientQuotasResponse = client
        .call(
            ApiKey::DescribeClientQuotas,
            1,
            &DescribeClientQuotasRequest::default(),
        )
        .await;
    assert_eq!(quotas.error_code, CLUSTER_AUTHORIZATION_FAILED);
    let lifted: AlterClientQuotasResponse = client
        .call(
            ApiKey::AlterClientQuotas,
            1,
            &super::quotas::alter(
                &[("client-id", Some("greedy"))],
                &[("producer_byte_rate", 1e9, false)],
            ),
        )
        .await;
    assert_eq!(lifted.entries[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    broker.shutdown().await;
}

#[tokio::test]
async fn without_an_authorizer_everything_is_allowed_and_the_acl_apis_are_disabled() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "t").await;
    assert_eq!(produce_code(&mut client, "t").await, 0);
    let mut request = CreateAclsRequest::default();
    request.creations = vec![creation("t", Operation::Read)];
    let created: CreateAclsResponse = client.call(ApiKey::CreateAcls, 3, &request).await;
    assert_eq!(created.results[0].error_code, SECURITY_DISABLED);
    broker.shutdown().await;
}

/// DescribeTopicPartitions as Kafka answers it under ACLs: a named topic the principal may
/// not describe is TOPIC_AUTHORIZATION_FAILED (after the others, existing or not), and left
/// out when all topics are asked for. ListConfigResources needs DESCRIBE_CONFIGS on the
/// cluster.
#[tokio::test]
async fn describe_topic_partitions_refuses_named_topics_and_list_config_resources_is_checked() {
    use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
    use kafka_protocol::messages::{
        DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse,
        ListConfigResourcesRequest, ListConfigResourcesResponse,
    };

    let broker = guarded_broker().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "open").await;
    let mut request = CreateTopicsRequest::default();
    request.topics = vec![creatable("closed", 1, 1)];
    request.timeout_ms = 10_000;
    let created: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    assert_eq!(created.topics[0].error_code, 0);

    let describe = |names: &[&str]| {
        let mut request = DescribeTopicPartitionsRequest::default();
        request.topics = names
            .iter()
            .map(|n| {
                let mut t = TopicRequest::default();
                t.name = topic_name(n);
                t
            })
            .collect();
        request.response_partition_limit = 100;
        request
    };
    let named: DescribeTopicPartitionsResponse = client
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &describe(&["closed", "open", "nowhere"]),
        )
        .await;
    let answers: Vec<(String, i16)> = named
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(),
                t.error_code,
            )
        })
        .collect();
    assert_eq!(
        answers,
        [
            ("open".to_string(), 0),
            ("closed".to_string(), TOPIC_AUTHORIZATION_FAILED),
            ("nowhere".to_string(), TOPIC_AUTHORIZATION_FAILED),
        ]
    );
    let refused = named.topics.iter().find(|t| t.error_code != 0).unwrap();
    assert!(refused.partitions.is_empty());
    assert!(refused.topic_id.is_nil());

    let all: DescribeTopicPartitionsResponse = client
        .call(ApiKey::DescribeTopicPartitions, 0, &describe(&[]))
        .await;
    let names: Vec<_> = all
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect();
    assert_eq!(names, ["open"]);

    let listed: ListConfigResourcesResponse = client
        .call(
            ApiKey::ListConfigResources,
            1,
            &ListConfigResourcesRequest::default(),
        )
        .await;
    assert_eq!(listed.error_code, CLUSTER_AUTHORIZATION_FAILED);
    assert!(listed.config_resources.is_empty());
    let mut request = CreateAclsRequest::default();
    let mut grant = creation(CLUSTER_NAME, Operation::DescribeConfigs);
    grant.resource_type = ResourceType::Cluster.code();
    request.creations = vec![grant];
    let created: CreateAclsResponse = client.call(ApiKey::CreateAcls, 3, &request).await;
    assert_eq!(created.results[0].error_code, 0, "{:?}", created.results[0]);
    let listed: ListConfigResourcesResponse = client
        .call(
            ApiKey::ListConfigResources,
            1,
            &ListConfigResourcesRequest::default(),
        )
        .await;
    assert_eq!(listed.error_code, 0);
    assert!(listed
        .config_resources
        .iter()
        .any(|r| r.resource_name.as_str() == "open"));
    broker.shutdown().await;
}
