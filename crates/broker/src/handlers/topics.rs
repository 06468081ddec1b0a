//! CreateTopics (v2–v7), DeleteTopics (v1–v6), CreatePartitions (v0–v3).
//!
//! Replication factor: durability is the storage's job (Ceph replicas, S3's own), and every
//! partition has exactly one copy as far as Kafka clients can tell. A request for -1 (the
//! broker default) or 1 is accepted; a larger factor is refused with INVALID_REPLICATION_FACTOR
//! as a Kafka cluster with that many brokers would refuse it, so tools that insist on three
//! replicas learn at creation time that they will not get them from the broker.
//! Manual replica assignments are accepted only when trivial (every replica is this broker).

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use strata_log::{LogError, NewTopic, TopicInfo};
use tracing::info;

use super::configs::{config_source, topic_entries};
use super::{refuse_internal, str_bytes, topic_id_of, topic_name, uuid_of};
use crate::errors::{code, error_code, message};
use crate::server::Broker;
use crate::RequestContext;

/// Brokers a partition could be replicated to. One until brokers register with each other.
fn broker_count(_broker: &Broker) -> i16 {
    1
}

pub(crate) async fn create_topics(
    broker: &Broker,
    request: CreateTopicsRequest,
    ctx: &RequestContext,
) -> CreateTopicsResponse {
    let v = ctx.api_version;
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = request
        .topics
        .iter()
        .filter(|t| !seen.insert(t.name.0.to_string()))
        .map(|t| t.name.0.to_string())
        .collect();

    // Every topic is validated first, then all valid ones are created in one catalog change.
    let mut outcomes = Vec::with_capacity(request.topics.len());
    let mut specs = Vec::new();
    for topic in request.topics {
        let name = topic.name.clone();
        let prepared = if duplicates.contains(name.0.as_str()) {
            Err((
                code::INVALID_REQUEST,
                format!("topic {} appears more than once in the request", name.0),
            ))
        } else {
            prepare(broker, topic)
        };
        match prepared {
            Ok(spec) => {
                specs.push(spec);
                outcomes.push((name, None));
            }
            Err(e) => outcomes.push((name, Some(e))),
        }
    }
    let created = match broker.log.create_topics(specs, request.validate_only).await {
        Ok(created) => created
            .into_iter()
            .map(|r| r.map_err(|e| (error_code(&e), e.to_string())))
            .collect(),
        Err(e) => {
            let failure = (error_code(&e), e.to_string());
            outcomes
                .iter()
                .filter(|(_, refused)| refused.is_none())
                .map(|_| Err(failure.clone()))
                .collect::<Vec<_>>()
        }
    };
    let mut created = created.into_iter();
    let mut results = Vec::with_capacity(outcomes.len());
    let mut created_any = false;
    // (result index, topic) of each topic created here, whose leaders the answer waits for.
    let mut awaited = Vec::new();
    for (name, refused) in outcomes {
        let outcome = match refused {
            Some(e) => Err(e),
            None => created.next().unwrap_or_else(|| {
                Err((
                    code::UNKNOWN_SERVER_ERROR,
                    "topic creation lost its result".into(),
                ))
            }),
        };
        if let Ok(info) = &outcome {
            if !request.validate_only {
                created_any = true;
                info!(topic = %info.name, partitions = info.partitions, "created topic");
                awaited.push((
                    results.len(),
                    std::sync::Arc::clone(info),
                    0..info.partitions,
                ));
            }
        }
        results.push(creatable_result(name, outcome, v));
    }
    // Once per request, not per topic: one announcement covers every change before it.
    if created_any {
        super::announce_topology_change(broker).await;
        // Answered once every new partition has a leader, as Kafka does.
        for (i, info) in super::leaderless_after(broker, request.timeout_ms, &awaited).await {
            results[i].error_code = code::REQUEST_TIMED_OUT;
            results[i].error_message = message(format!(
                "topic {} was created, but not every partition had a leader within the \
                 request's {} ms; it gets one when a broker claims it",
                info.name, request.timeout_ms
            ));
        }
    }
    let mut response = CreateTopicsResponse::default();
    response.topics = results;
    response
}

/// A requested topic, checked and turned into what the log creates.
fn prepare(broker: &Broker, topic: CreatableTopic) -> Result<NewTopic, (i16, String)> {
    let partitions = if topic.assignments.is_empty() {
        match topic.num_partitions {
            -1 => None,
            n if n <= 0 => {
                return Err((
                    code::INVALID_PARTITIONS,
                    format!("number of partitions must be positive or -1, got {n}"),
                ))
            }
            n => Some(n),
        }
    } else {
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return Err((
                code::INVALID_REQUEST,
                "with manual assignments, num_partitions and replication_factor must be -1"
                    .to_string(),
            ));
        }
        Some(trivial_assignment(broker, &topic)?)
    };
    match topic.replication_factor {
        -1 => {}
        rf if rf <= 0 => {
            return Err((
                code::INVALID_REPLICATION_FACTOR,
                format!("replication factor must be positive or -1, got {rf}"),
            ))
        }
        rf if rf > broker_count(broker) => {
            return Err((
                code::INVALID_REPLICATION_FACTOR,
                format!(
                    "replication factor {rf} is larger than the {} available broker(s); \
                     Strata keeps one copy per partition and leaves durability to its storage, \
                     so use 1 or -1",
                    broker_count(broker)
                ),
            ))
        }
        _ => {}
    }
    let mut overrides = BTreeMap::new();
    for config in topic.configs {
        let Some(value) = config.value else {
            return Err((
                code::INVALID_CONFIG,
                format!("config {} has a null value", config.name.as_str()),
            ));
        };
        overrides.insert(config.name.to_string(), value.to_string());
    }
    Ok(NewTopic {
        name: topic.name.0.to_string(),
        partitions,
        overrides,
    })
}

/// The partition count of a manual assignment, if every partition is numbered densely from 0
/// and placed on this broker alone.
fn trivial_assignment(broker: &Broker, topic: &CreatableTopic) -> Result<i32, (i16, String)> {
    let me = broker.settings.node_id.0;
    let mut indexes: Vec<i32> = topic
        .assignments
        .iter()
        .map(|a| a.partition_index)
        .collect();
    indexes.sort_unstable();
    let dense = indexes
        .iter()
        .enumerate()
        .all(|(i, p)| usize::try_from(*p) == Ok(i));
    let on_me = topic
        .assignments
        .iter()
        .all(|a| a.broker_ids.len() == 1 && a.broker_ids[0].0 == me);
    if dense && on_me {
        i32::try_from(indexes.len()).map_err(|_| (code::INVALID_REPLICA_ASSIGNMENT, String::new()))
    } else {
        Err((
            code::INVALID_REPLICA_ASSIGNMENT,
            format!("partitions must be numbered from 0 and each assigned to broker {me} alone"),
        ))
    }
}

fn creatable_result(
    name: TopicName,
    outcome: Result<std::sync::Arc<TopicInfo>, (i16, String)>,
    v: i16,
) -> CreatableTopicResult {
    let mut result = CreatableTopicResult::default();
    result.name = name;
    match outcome {
        Ok(info) => {
            result.error_code = code::NONE;
            result.error_message = None;
            if v >= 5 {
                result.num_partitions = info.partitions;
                result.replication_factor = 1;
                result.configs = Some(
                    topic_entries(&info)
                        .into_iter()
                        .map(|entry| {
                            let mut c = CreatableTopicConfigs::default();
                            c.name = str_bytes(entry.name);
                            c.value = Some(str_bytes(&entry.value));
                            c.read_only = entry.read_only;
                            c.config_source = config_source(&entry);
                            c.is_sensitive = false;
                            c
                        })
                        .collect(),
                );
            }
            if v >= 7 {
                result.topic_id = uuid_of(info.id);
            }
        }
        Err((error, text)) => {
            result.error_code = error;
            result.error_message = if text.is_empty() { None } else { message(text) };
        }
    }
    result
}

pub(crate) async fn delete_topics(
    broker: &Broker,
    request: DeleteTopicsRequest,
    ctx: &RequestContext,
) -> DeleteTopicsResponse {
    let v = ctx.api_version;
    // v6 names topics by name or id; earlier versions by name only.
    let targets: Vec<(Option<TopicName>, uuid::Uuid)> = if v >= 6 {
        request
            .topics
            .into_iter()
            .map(|t| (t.name, t.topic_id))
            .collect()
    } else {
        request
            .topic_names
            .into_iter()
            .map(|name| (Some(name), uuid::Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::with_capacity(targets.len());
    let mut deleted_any = false;
    for (name, id) in targets {
        let mut result = DeletableTopicResult::default();
        let resolved = match (&name, id.is_nil()) {
            (Some(name), true) => broker
                .log
                .topic(name.0.as_str())
                .ok_or(LogError::UnknownTopicOrPartition)
                .map_err(|e| (error_code(&e), e.to_string())),
            (_, false) => broker
                .log
                .topic_by_id(topic_id_of(&id))
                .ok_or((code::UNKNOWN_TOPIC_ID, format!("no topic with id {id}"))),
            (None, true) => Err((
                code::INVALID_REQUEST,
                "a topic must be named by name or id".to_string(),
            )),
        };
        let resolved = resolved.and_then(|info| match refuse_internal(&info.name, "delete") {
            Some(refusal) => Err(refusal),
            None => Ok(info),
        });
        let outcome = match resolved {
            Ok(info) => broker
                .log
                .delete_topic(&info.name)
                .await
                .map(|()| info)
                .map_err(|e| (error_code(&e), e.to_string())),
            Err(e) => Err(e),
        };
        deleted_any |= outcome.is_ok();
        match outcome {
            Ok(info) => {
                info!(topic = %info.name, "deleted topic");
                result.name = Some(topic_name(&info.name));
                if v >= 6 {
                    result.topic_id = uuid_of(info.id);
                }
                result.error_code = code::NONE;
            }
            Err((error, text)) => {
                result.name = if v >= 6 {
                    name
                } else {
                    name.or_else(|| Some(topic_name("")))
                };
                if v >= 6 {
                    result.topic_id = id;
                }
                result.error_code = error;
                if v >= 5 {
                    result.error_message = message(text);
                }
            }
        }
        responses.push(result);
    }
    if deleted_any {
        super::announce_topology_change(broker).await;
    }
    let mut response = DeleteTopicsResponse::default();
    response.responses = responses;
    response
}

pub(crate) async fn create_partitions(
    broker: &Broker,
    request: CreatePartitionsRequest,
    _ctx: &RequestContext,
) -> CreatePartitionsResponse {
    let me = broker.settings.node_id.0;
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = request
        .topics
        .iter()
        .filter(|t| !seen.insert(t.name.0.to_string()))
        .map(|t| t.name.0.to_string())
        .collect();
    let mut results = Vec::with_capacity(request.topics.len());
    let mut added_any = false;
    // (result index, topic, its new partitions), for the wait for their leaders.
    let mut added = Vec::new();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let before = broker.log.topic(&name).map_or(0, |t| t.partitions);
        let trivial = topic.assignments.as_ref().is_none_or(|assignments| {
            assignments
                .iter()
                .all(|a| a.broker_ids.len() == 1 && a.broker_ids[0].0 == me)
        });
        let outcome = if duplicates.contains(&name) {
            Err((
                code::INVALID_REQUEST,
                format!("topic {name} appears more than once in the request"),
            ))
        } else if let Some(refusal) = refuse_internal(&name, "add partitions to") {
            Err(refusal)
        } else if !trivial {
            Err((
                code::INVALID_REPLICA_ASSIGNMENT,
                format!("new partitions must each be assigned to broker {me} alone"),
            ))
        } else {
            broker
                .log
                .create_partitions(&name, topic.count, request.validate_only)
                .await
                .map_err(|e| (error_code(&e), e.to_string()))
        };
        added_any |= outcome.is_ok() && !request.validate_only;
        let mut result = CreatePartitionsTopicResult::default();
        result.name = topic.name;
        match outcome {
            Ok(()) => {
                if !request.validate_only {
                    info!(topic = %name, partitions = topic.count, "added partitions");
                    if let Some(info) = broker.log.topic(&name) {
                        added.push((results.len(), info, before..topic.count));
                    }
                }
                result.error_code = code::NONE;
                result.error_message = None;
            }
            Err((error, text)) => {
                result.error_code = error;
                result.error_message = message(text);
            }
        }
        results.push(result);
    }
    if added_any {
        super::announce_topology_change(broker).await;
        // As for CreateTopics: answered once the new partitions have leaders (the partitions
        // exist either way).
        for (i, info) in super::leaderless_after(broker, request.timeout_ms, &added).await {
            results[i].error_code = code::REQUEST_TIMED_OUT;
            results[i].error_message = message(format!(
                "the partitions of {} were added, but not every new one had a leader within \
                 the request's {} ms",
                info.name, request.timeout_ms
            ));
        }
    }
    let mut response = CreatePartitionsResponse::default();
    response.results = results;
    response
}
