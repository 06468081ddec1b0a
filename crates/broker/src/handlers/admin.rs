//! The describing admin APIs of current tools: DescribeTopicPartitions (v0, KIP-966),
//! DescribeLogDirs (v1–v4), ListConfigResources (v0–v1, KIP-1142; v0 was
//! ListClientMetricsResources) and DescribeProducers (v0).
//!
//! DescribeTopicPartitions builds each partition from [`Leaders::partition`], the function
//! Metadata uses, so the two never disagree. DescribeLogDirs reports the storage as one log
//! directory holding the partitions this broker serves, as Kafka reports the replicas it hosts.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::list_config_resources_response::ConfigResource;
use kafka_protocol::messages::{
    BrokerId as WireBrokerId, DescribeLogDirsRequest, DescribeLogDirsResponse,
    DescribeProducersRequest, DescribeProducersResponse, DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse, ListConfigResourcesRequest, ListConfigResourcesResponse,
    ProducerId,
};
use strata_core::TopicPartition;
use strata_log::TopicInfo;
use uuid::Uuid;

use super::configs::resource;
use super::metadata::Leaders;
use super::{acl_op, is_internal_topic, str_bytes, topic_name, uuid_of};
use crate::authorize::{Op, Res};
use crate::errors::{code, error_code, error_message};
use crate::server::Broker;
use crate::RequestContext;

// ----- DescribeTopicPartitions -----

/// DescribeTopicPartitions v0, as Kafka's `DescribeTopicPartitionsRequestHandler` answers it:
/// the named topics (all of them when none is named) in name order from the cursor on, at
/// most `min(response_partition_limit, max_request_partition_size_limit)` partitions (at
/// least one), and `next_cursor` naming the first partition left out. Named topics that do
/// not exist are answered UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for an illegal
/// name); a cursor outside a named list, or with a negative partition, fails the request with
/// INVALID_REQUEST.
pub(crate) fn describe_topic_partitions(
    broker: &Broker,
    request: DescribeTopicPartitionsRequest,
    ctx: &RequestContext,
) -> DescribeTopicPartitionsResponse {
    let fetch_all = request.topics.is_empty();
    let cursor = request
        .cursor
        .as_ref()
        .map(|c| (c.topic_name.0.to_string(), c.partition_index));
    let from = cursor.as_ref().map_or("", |(name, _)| name.as_str());
    let mut names: Vec<String> = if fetch_all {
        broker
            .log
            .topics()
            .iter()
            .map(|info| info.name.to_string())
            .collect()
    } else {
        request
            .topics
            .iter()
            .map(|t| t.name.0.to_string())
            .collect()
    };
    names.retain(|name| name.as_str() >= from);
    names.sort();
    names.dedup();
    if let Some((name, partition)) = &cursor {
        let refusal = if !fetch_all && !names.contains(name) {
            Some(format!(
                "the topic list does not contain the cursor's topic {name}"
            ))
        } else if *partition < 0 {
            Some("the cursor's partition index cannot be negative".to_string())
        } else {
            None
        };
        if let Some(text) = refusal {
            tracing::debug!(peer = %ctx.peer, %text, "DescribeTopicPartitions refused");
            return refused_topic_partitions(&request, code::INVALID_REQUEST);
        }
    }
    // As Kafka: a topic named that the principal may not describe is answered
    // TOPIC_AUTHORIZATION_FAILED (after the others, whether it exists or not, so the answer
    // tells nothing about it); with none named, such topics are left out.
    let authz = broker.authz(ctx);
    let mut unauthorized = Vec::new();
    names.retain(|name| {
        if fetch_all {
            return authz.shows(Op::Describe, Res::Topic, name);
        }
        let allowed = authz.allows(Op::Describe, Res::Topic, name);
        if !allowed {
            unauthorized.push(unauthorized_topic(name));
        }
        allowed
    });
    let limit = usize::try_from(request.response_partition_limit)
        .unwrap_or(0)
        .min(broker.settings.max_request_partition_size_limit)
        .max(1);
    let start_of = |name: &str| match &cursor {
        Some((cursor_topic, partition)) if cursor_topic == name => *partition,
        _ => 0,
    };
    let leaders = Leaders::of(broker);
    let mut response = DescribeTopicPartitionsResponse::default();
    let mut remaining = limit;
    for name in names {
        if remaining == 0 {
            // Every partition of the topics before fitted: the next answer starts here.
            response.next_cursor = Some(cursor_at(&name, 0));
            break;
        }
        let Some(info) = broker.log.topic(&name) else {
            // Asked for all topics, one deleted since the listing is simply not there.
            if !fetch_all {
                response.topics.push(missing_topic(&name));
            }
            continue;
        };
        let start = start_of(&name).min(info.partitions);
        let wanted = i32::try_from(remaining).unwrap_or(i32::MAX);
        let end = info.partitions.min(start.saturating_add(wanted));
        response
            .topics
            .push(described_topic(&info, &leaders, start..end));
        if end < info.partitions {
            response.next_cursor = Some(cursor_at(&name, end));
            break;
        }
        remaining -= usize::try_from(end - start).unwrap_or(0);
    }
    response.topics.extend(unauthorized);
    response
}

fn unauthorized_topic(name: &str) -> DescribeTopicPartitionsResponseTopic {
    let mut topic = DescribeTopicPartitionsResponseTopic::default();
    topic.error_code = code::TOPIC_AUTHORIZATION_FAILED;
    topic.name = Some(topic_name(name));
    topic.topic_id = Uuid::nil();
    topic.is_internal = false;
    topic
}

fn described_topic(
    info: &TopicInfo,
    leaders: &Leaders<'_>,
    partitions: std::ops::Range<i32>,
) -> DescribeTopicPartitionsResponseTopic {
    let mut topic = DescribeTopicPartitionsResponseTopic::default();
    topic.error_code = code::NONE;
    topic.name = Some(topic_name(&info.name));
    topic.topic_id = uuid_of(info.id);
    topic.is_internal = is_internal_topic(&info.name);
    topic.topic_authorized_operations = acl_op::topic_all();
    topic.partitions = partitions
        .map(|index| {
            let state = leaders.partition(info, index);
            let mut p = DescribeTopicPartitionsResponsePartition::default();
            p.error_code = state.error_code;
            p.partition_index = index;
            p.leader_id = WireBrokerId(state.leader_id);
            p.leader_epoch = state.leader_epoch;
            p.replica_nodes = state.replicas.into_iter().map(WireBrokerId).collect();
            p.isr_nodes = state.isr.into_iter().map(WireBrokerId).collect();
            // No eligible-leader replicas (KIP-966's ELR): there are no followers to elect.
            p.eligible_leader_replicas = Some(Vec::new());
            p.last_known_elr = Some(Vec::new());
            p.offline_replicas = Vec::new();
            p
        })
        .collect();
    topic
}

fn missing_topic(name: &str) -> DescribeTopicPartitionsResponseTopic {
    let mut topic = DescribeTopicPartitionsResponseTopic::default();
    topic.error_code = match strata_log::catalog::validate_topic_name(name) {
        Ok(()) => code::UNKNOWN_TOPIC_OR_PARTITION,
        Err(_) => code::INVALID_TOPIC_EXCEPTION,
    };
    topic.name = Some(topic_name(name));
    topic.topic_id = Uuid::nil();
    topic.is_internal = is_internal_topic(name);
    topic
}

fn cursor_at(name: &str, partition: i32) -> Cursor {
    let mut cursor = Cursor::default();
    cursor.topic_name = topic_name(name);
    cursor.partition_index = partition;
    cursor
}

/// Kafka's answer to a request it refuses as a whole: every named topic with the error.
fn refused_topic_partitions(
    request: &DescribeTopicPartitionsRequest,
    error: i16,
) -> DescribeTopicPartitionsResponse {
    let mut response = DescribeTopicPartitionsResponse::default();
    response.topics = request
        .topics
        .iter()
        .map(|t| {
            let mut topic = DescribeTopicPartitionsResponseTopic::default();
            topic.error_code = error;
            topic.name = Some(t.name.clone());
            topic.topic_id = Uuid::nil();
            topic
        })
        .collect();
    response
}

// ----- DescribeLogDirs -----

/// DescribeLogDirs v1–v4: one log directory, named after the storage (without credentials),
/// holding the partitions this broker serves. Sizes come from the log's own accounting (no
/// storage request); offset lag is 0 and nothing is a future replica (there is one copy, in
/// storage). Total and usable bytes are -1: no backend tells how much room it has (a bucket
/// has no size; a local directory's free space is not exposed by the storage contract).
pub(crate) fn describe_log_dirs(
    broker: &Broker,
    request: DescribeLogDirsRequest,
    ctx: &RequestContext,
) -> DescribeLogDirsResponse {
    let v = ctx.api_version;
    if !broker.authz(ctx).allows_cluster(Op::Describe) {
        let mut response = DescribeLogDirsResponse::default();
        if v >= 3 {
            response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        }
        return response;
    }
    // Null asks for every partition hosted here; a list for those of it hosted here.
    let wanted: Vec<TopicPartition> = match request.topics {
        None => broker.log.served().into_iter().map(|(tp, _)| tp).collect(),
        Some(topics) => topics
            .into_iter()
            .flat_map(|t| {
                let name: std::sync::Arc<str> = std::sync::Arc::from(t.topic.0.as_str());
                t.partitions
                    .into_iter()
                    .map(move |p| TopicPartition::new(std::sync::Arc::clone(&name), p))
            })
            .collect(),
    };
    let mut by_topic: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
    for tp in wanted {
        // A partition not served here (another broker's, or none at all) is left out.
        if let Ok(size) = broker.log.partition_size(&tp) {
            by_topic
                .entry(tp.topic.to_string())
                .or_default()
                .insert(tp.partition, i64::try_from(size).unwrap_or(i64::MAX));
        }
    }
    let mut dir = DescribeLogDirsResult::default();
    dir.error_code = code::NONE;
    dir.log_dir = str_bytes(&broker.settings.log_dir);
    dir.topics = by_topic
        .into_iter()
        .map(|(name, partitions)| {
            let mut t = DescribeLogDirsTopic::default();
            t.name = topic_name(&name);
            t.partitions = partitions
                .into_iter()
                .map(|(index, size)| {
                    let mut p = DescribeLogDirsPartition::default();
                    p.partition_index = index;
                    p.partition_size = size;
                    p.offset_lag = 0;
                    p.is_future_key = false;
                    p
                })
                .collect();
            t
        })
        .collect();
    if v >= 4 {
        dir.total_bytes = -1;
        dir.usable_bytes = -1;
    }
    let mut response = DescribeLogDirsResponse::default();
    if v >= 3 {
        response.error_code = code::NONE;
    }
    response.results = vec![dir];
    response
}

// ----- ListConfigResources -----

/// ListConfigResources v0–v1. v0 (ListClientMetricsResources) lists client-metrics
/// subscriptions, of which Strata has none. v1 lists the resources of the requested types
/// (all types when none is named): every topic, and every live broker (Kafka's BROKER). The
/// other types Kafka knows (BROKER_LOGGER, CLIENT_METRICS, GROUP) have no configurable
/// resources here and list nothing; an unknown type is UNSUPPORTED_VERSION, as in Kafka.
/// Without DESCRIBE_CONFIGS on the cluster: CLUSTER_AUTHORIZATION_FAILED.
pub(crate) fn list_config_resources(
    broker: &Broker,
    request: ListConfigResourcesRequest,
    ctx: &RequestContext,
) -> ListConfigResourcesResponse {
    let mut response = ListConfigResourcesResponse::default();
    // As Kafka's KafkaApis: the whole listing needs DESCRIBE_CONFIGS on the cluster.
    if !broker.authz(ctx).allows_cluster(Op::DescribeConfigs) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        return response;
    }
    response.error_code = code::NONE;
    if ctx.api_version == 0 {
        return response;
    }
    let known = [
        resource::TOPIC,
        resource::BROKER,
        resource::BROKER_LOGGER,
        resource::CLIENT_METRICS,
        resource::GROUP,
    ];
    let types: Vec<i8> = if request.resource_types.is_empty() {
        known.to_vec()
    } else {
        request.resource_types
    };
    if let Some(unknown) = types.iter().find(|t| !known.contains(t)) {
        tracing::debug!(peer = %ctx.peer, resource_type = unknown, "unknown config resource type");
        response.error_code = code::UNSUPPORTED_VERSION;
        return response;
    }
    let entry = |kind: i8, name: &str| {
        let mut r = ConfigResource::default();
        r.resource_type = kind;
        r.resource_name = str_bytes(name);
        r
    };
    if types.contains(&resource::TOPIC) {
        for info in broker.log.topics() {
            response
                .config_resources
                .push(entry(resource::TOPIC, &info.name));
        }
    }
    if types.contains(&resource::BROKER) {
        for (id, _, _) in Leaders::of(broker).brokers(&ctx.listener) {
            response
                .config_resources
                .push(entry(resource::BROKER, &id.to_string()));
        }
    }
    response
}

// ----- DescribeProducers -----

/// DescribeProducers v0: the idempotent-producer state each partition keeps (the state new
/// appends are checked against). Strata has no transactions, so the coordinator epoch and the
/// transaction start are -1. A partition another broker serves is NOT_LEADER_OR_FOLLOWER, an
/// unknown one UNKNOWN_TOPIC_OR_PARTITION (the error table's answer for each).
pub(crate) fn describe_producers(
    broker: &Broker,
    request: DescribeProducersRequest,
    ctx: &RequestContext,
) -> DescribeProducersResponse {
    let authz = broker.authz(ctx);
    let mut response = DescribeProducersResponse::default();
    response.topics = request
        .topics
        .into_iter()
        .map(|t| {
            let name: std::sync::Arc<str> = std::sync::Arc::from(t.name.0.as_str());
            let allowed = authz.allows(Op::Read, Res::Topic, &name);
            let mut out = TopicResponse::default();
            out.partitions = t
                .partition_indexes
                .into_iter()
                .map(|index| {
                    let tp = TopicPartition::new(std::sync::Arc::clone(&name), index);
                    let mut p = PartitionResponse::default();
                    p.partition_index = index;
                    if !allowed {
                        p.error_code = code::TOPIC_AUTHORIZATION_FAILED;
                        return p;
                    }
                    match broker.log.producers(&tp) {
                        Ok(producers) => {
                            p.error_code = code::NONE;
                            p.active_producers = producers
                                .into_iter()
                                .map(|s| {
                                    let mut state = ProducerState::default();
                                    state.producer_id = ProducerId(s.producer_id);
                                    state.producer_epoch = i32::from(s.epoch);
                                    state.last_sequence = s.last_sequence;
                                    state.last_timestamp = s.last_timestamp;
                                    state.coordinator_epoch = s.coordinator_epoch;
                                    state.current_txn_start_offset = s.current_txn_start_offset;
                                    state
                                })
                                .collect();
                        }
                        Err(e) => {
                            p.error_code = error_code(&e);
                            p.error_message = error_message(&e);
                        }
                    }
                    p
                })
                .collect();
            out.name = t.name;
            out
        })
        .collect();
    response
}
