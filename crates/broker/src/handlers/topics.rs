//! CreateTopics (v2–v7), DeleteTopics (v1–v6), CreatePartitions (v0–v3).
//!
//! Replication factor: durability is the storage's job (Ceph replicas, S3's own), so the data
//! has one copy in storage whatever the factor. Tools still ask for 3 (Kafka Connect's
//! internal topics, Schema Registry's `_schemas`), so any factor from 1 to the number of live
//! brokers is accepted (-1: `default_replication_factor`) and stored in the catalog, and
//! Metadata lists that many live brokers as replicas (see `metadata::Leaders::replicas`); a
//! larger factor is refused with INVALID_REPLICATION_FACTOR as Kafka refuses it.
//!
//! Explicit replica assignments (CreateTopics, CreatePartitions) must name live brokers, each
//! once per partition, with the same number of replicas for every partition. They are stored;
//! the first replica is the partition's preferred owner, which placement moves it to while
//! that broker is live (see `cluster::host`), and Metadata lists the assignment's brokers.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment;
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
use super::metadata::Leaders;
use super::{refuse_internal, str_bytes, topic_id_of, topic_name, uuid_of};
use crate::authorize::{Op, Res};
use crate::errors::{code, error_code, message};
use crate::server::Broker;
use crate::RequestContext;

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
    let live: BTreeSet<i32> = Leaders::of(broker).live_ids().into_iter().collect();
    let authz = broker.authz(ctx);
    let mut outcomes = Vec::with_capacity(request.topics.len());
    let mut specs = Vec::new();
    for topic in request.topics {
        let name = topic.name.clone();
        let prepared = if duplicates.contains(name.0.as_str()) {
            Err((
                code::INVALID_REQUEST,
                format!("topic {} appears more than once in the request", name.0),
            ))
        } else if !authz.may_create_topic(name.0.as_str()) {
            Err((
                code::TOPIC_AUTHORIZATION_FAILED,
                "Authorization failed.".to_string(),
            ))
        } else {
            prepare(broker, &live, topic)
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
fn prepare(
    broker: &Broker,
    live: &BTreeSet<i32>,
    topic: CreatableTopic,
) -> Result<NewTopic, (i16, String)> {
    let (partitions, replication_factor, assignments) = if topic.assignments.is_empty() {
        let partitions = match topic.num_partitions {
            -1 => None,
            n if n <= 0 => {
                return Err((
                    code::INVALID_PARTITIONS,
                    format!("number of partitions must be positive or -1, got {n}"),
                ))
            }
            n => Some(n),
        };
        let factor = match topic.replication_factor {
            -1 => broker.settings.default_replication_factor,
            rf => rf,
        };
        check_replication_factor(factor, live)?;
        (partitions, factor, BTreeMap::new())
    } else {
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return Err((
                code::INVALID_REQUEST,
                "with manual assignments, num_partitions and replication_factor must be -1"
                    .to_string(),
            ));
        }
        let mut indexes: Vec<i32> = topic
            .assignments
            .iter()
            .map(|a| a.partition_index)
            .collect();
        indexes.sort_unstable();
        if !indexes
            .iter()
            .enumerate()
            .all(|(i, p)| usize::try_from(*p) == Ok(i))
        {
            return Err((
                code::INVALID_REPLICA_ASSIGNMENT,
                format!(
                    "assigned partitions must be numbered 0, 1, 2, ... once each, got {indexes:?}"
                ),
            ));
        }
        let assignments = check_assignments(
            live,
            None,
            topic.assignments.iter().map(|a| {
                (
                    a.partition_index,
                    a.broker_ids.iter().map(|b| b.0).collect(),
                )
            }),
        )?;
        let factor = assignments.values().next().map_or(1, Vec::len);
        (
            Some(i32::try_from(indexes.len()).unwrap_or(i32::MAX)),
            i16::try_from(factor).unwrap_or(i16::MAX),
            assignments,
        )
    };
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
        replication_factor: Some(replication_factor),
        assignments,
        overrides,
    })
}

/// A factor from 1 to the number of live brokers, as Kafka allows. The storage keeps the
/// data durable whatever the factor; it decides how many brokers are reported as replicas.
pub(crate) fn check_replication_factor(
    factor: i16,
    live: &BTreeSet<i32>,
) -> Result<(), (i16, String)> {
    if factor <= 0 {
        return Err((
            code::INVALID_REPLICATION_FACTOR,
            format!("replication factor must be positive or -1, got {factor}"),
        ));
    }
    if usize::try_from(factor).unwrap_or(usize::MAX) > live.len() {
        return Err((
            code::INVALID_REPLICATION_FACTOR,
            format!(
                "replication factor {factor} is larger than the {} live broker(s) {live:?}",
                live.len()
            ),
        ));
    }
    Ok(())
}

/// Explicit replica assignments, by partition: every replica a live broker, none twice in a
/// partition, every partition with the same number of replicas (`factor` when the topic
/// already has one).
pub(crate) fn check_assignments(
    live: &BTreeSet<i32>,
    factor: Option<usize>,
    assignments: impl IntoIterator<Item = (i32, Vec<i32>)>,
) -> Result<BTreeMap<i32, Vec<i32>>, (i16, String)> {
    let bad = |text: String| Err((code::INVALID_REPLICA_ASSIGNMENT, text));
    let mut checked = BTreeMap::new();
    let mut factor = factor;
    for (partition, brokers) in assignments {
        if brokers.is_empty() {
            return bad(format!("partition {partition} is assigned no replica"));
        }
        if let Some(unknown) = brokers.iter().find(|b| !live.contains(b)) {
            return bad(format!(
                "partition {partition} is assigned to broker {unknown}, which is not a live \
                 broker (live: {live:?})"
            ));
        }
        let distinct: BTreeSet<i32> = brokers.iter().copied().collect();
        if distinct.len() != brokers.len() {
            return bad(format!(
                "partition {partition}'s replicas {brokers:?} name a broker twice"
            ));
        }
        match factor {
            Some(n) if n != brokers.len() => {
                return bad(format!(
                    "partition {partition} has {} replicas {brokers:?} where the others have {n}",
                    brokers.len()
                ))
            }
            _ => factor = Some(brokers.len()),
        }
        if checked.insert(partition, brokers).is_some() {
            return bad(format!("partition {partition} is assigned twice"));
        }
    }
    Ok(checked)
}

/// CreatePartitions' assignments: one per new partition, in order, each as long as the
/// topic's replication factor.
fn new_assignments(
    info: &TopicInfo,
    count: i32,
    live: &BTreeSet<i32>,
    given: &[CreatePartitionsAssignment],
) -> Result<BTreeMap<i32, Vec<i32>>, (i16, String)> {
    let new = usize::try_from(count - info.partitions).unwrap_or(0);
    if given.len() != new {
        return Err((
            code::INVALID_REPLICA_ASSIGNMENT,
            format!(
                "{} assignments given for the {new} new partition(s) of {}",
                given.len(),
                info.name
            ),
        ));
    }
    let factor = info.assignments.values().next().map(Vec::len).or_else(|| {
        info.replication_factor
            .and_then(|rf| usize::try_from(rf).ok())
    });
    check_assignments(
        live,
        factor,
        given
            .iter()
            .zip(info.partitions..)
            .map(|(a, partition)| (partition, a.broker_ids.iter().map(|b| b.0).collect())),
    )
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
                result.replication_factor = info.replication_factor.unwrap_or(1);
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
    let authz = broker.authz(ctx);
    let unauthorized = || {
        (
            code::TOPIC_AUTHORIZATION_FAILED,
            "Authorization failed.".to_string(),
        )
    };
    for (name, id) in targets {
        let mut result = DeletableTopicResult::default();
        let resolved = match (&name, id.is_nil()) {
            // Checked before the lookup, so a refusal does not tell whether the topic exists.
            (Some(name), true) if !authz.allows(Op::Delete, Res::Topic, name.0.as_str()) => {
                Err(unauthorized())
            }
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
        let resolved = resolved.and_then(|info| {
            if authz.allows(Op::Delete, Res::Topic, &info.name) {
                Ok(info)
            } else {
                Err(unauthorized())
            }
        });
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
    ctx: &RequestContext,
) -> CreatePartitionsResponse {
    let authz = broker.authz(ctx);
    let live: BTreeSet<i32> = Leaders::of(broker).live_ids().into_iter().collect();
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
        let existing = broker.log.topic(&name);
        let before = existing.as_ref().map_or(0, |t| t.partitions);
        let assigned = match (&topic.assignments, &existing) {
            (None, _) => Ok(BTreeMap::new()),
            (Some(given), Some(info)) => new_assignments(info, topic.count, &live, given),
            // The log answers for an unknown topic.
            (Some(_), None) => Ok(BTreeMap::new()),
        };
        let outcome = if duplicates.contains(&name) {
            Err((
                code::INVALID_REQUEST,
                format!("topic {name} appears more than once in the request"),
            ))
        } else if !authz.allows(Op::Alter, Res::Topic, &name) {
            Err((
                code::TOPIC_AUTHORIZATION_FAILED,
                "Authorization failed.".to_string(),
            ))
        } else if let Some(refusal) = refuse_internal(&name, "add partitions to") {
            Err(refusal)
        } else {
            match assigned {
                Err(refusal) => Err(refusal),
                Ok(assigned) => broker
                    .log
                    .create_partitions(&name, topic.count, assigned, request.validate_only)
                    .await
                    .map_err(|e| (error_code(&e), e.to_string())),
            }
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
