//! The transaction coordinator's APIs: InitProducerId with a transactional id (v0–v4),
//! AddPartitionsToTxn (v0–v3 from clients; v4 batched and verify-only from brokers, KIP-890),
//! EndTxn (v0–v4), DescribeTransactions (v0), ListTransactions (v0–v2). Clients below the
//! versions that know PRODUCER_FENCED get INVALID_PRODUCER_EPOCH instead, as from Kafka.

use std::collections::BTreeSet;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedState;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, DescribeTransactionsRequest,
    DescribeTransactionsResponse, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
    InitProducerIdResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId,
    TransactionalId,
};
use strata_core::TopicPartition;
use strata_txn::{ListFilter, TxnError, TxnState};

use super::{str_bytes, topic_name};
use crate::authorize::{Op, Res};
use crate::errors::{code, error_code, txn_error_code};
use crate::server::Broker;
use crate::RequestContext;

/// Kafka's OPERATION_NOT_ATTEMPTED: the other partitions of a request one of which failed.
const OPERATION_NOT_ATTEMPTED: i16 = 55;

/// PRODUCER_FENCED exists for clients from these versions on; older ones get
/// INVALID_PRODUCER_EPOCH, as Kafka answers them.
fn fenced(code: i16, version: i16, fenced_since: i16) -> i16 {
    if code == code::PRODUCER_FENCED && version < fenced_since {
        code::INVALID_PRODUCER_EPOCH
    } else {
        code
    }
}

/// InitProducerId for a transactional producer (the idempotent case is `producer.rs`).
pub(crate) async fn init_producer_id(
    broker: &Broker,
    request: InitProducerIdRequest,
    transactional_id: String,
    ctx: &RequestContext,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    if !broker
        .authz(ctx)
        .allows(Op::Write, Res::TransactionalId, &transactional_id)
    {
        response.error_code = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        return response;
    }
    // Taken only if the transactional id needs a new producer id; an unused one is a gap in
    // a 64-bit space, and allocating is in memory except once per block.
    let fresh = match broker.log.init_producer_id().await {
        Ok((id, _)) => id,
        Err(e) => {
            response.error_code = error_code(&e);
            return response;
        }
    };
    let answer = broker
        .txn
        .init_producer_id(strata_txn::InitProducerIdRequest {
            transactional_id,
            timeout_ms: request.transaction_timeout_ms,
            producer_id: if ctx.api_version >= 3 {
                request.producer_id.0
            } else {
                -1
            },
            producer_epoch: if ctx.api_version >= 3 {
                request.producer_epoch
            } else {
                -1
            },
            fresh_producer_id: fresh,
        })
        .await;
    match answer {
        Ok((id, epoch)) => {
            response.error_code = code::NONE;
            response.producer_id = ProducerId(id);
            response.producer_epoch = epoch;
        }
        Err(e) => response.error_code = fenced(txn_error_code(&e), ctx.api_version, 4),
    }
    response
}

/// Answers every partition of `topics` with `result`, or with OPERATION_NOT_ATTEMPTED where
/// another partition failed on its own account.
fn topic_results(
    topics: &[(String, Vec<i32>)],
    each: impl Fn(&str, i32) -> i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    topics
        .iter()
        .map(|(name, partitions)| {
            let mut t = AddPartitionsToTxnTopicResult::default();
            t.name = topic_name(name);
            t.results_by_partition = partitions
                .iter()
                .map(|p| {
                    let mut r = AddPartitionsToTxnPartitionResult::default();
                    r.partition_index = *p;
                    r.partition_error_code = each(name, *p);
                    r
                })
                .collect();
            t
        })
        .collect()
}

/// One transaction of an AddPartitionsToTxn request, checked and carried out as Kafka's
/// handler does: transactional-id WRITE, then topic WRITE and existence per partition (any
/// failure leaves the others OPERATION_NOT_ATTEMPTED), then the coordinator.
async fn add_one(
    broker: &Broker,
    ctx: &RequestContext,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    verify_only: bool,
    topics: Vec<(String, Vec<i32>)>,
) -> Vec<AddPartitionsToTxnTopicResult> {
    let authz = broker.authz(ctx);
    if !authz.allows(Op::Write, Res::TransactionalId, transactional_id) {
        return topic_results(&topics, |_, _| code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let mut refused = std::collections::HashMap::new();
    for (name, partitions) in &topics {
        let error = if !authz.allows(Op::Write, Res::Topic, name) {
            Some(code::TOPIC_AUTHORIZATION_FAILED)
        } else {
            match broker.log.topic(name) {
                Some(t) if partitions.iter().all(|p| (0..t.partitions).contains(p)) => None,
                _ => Some(code::UNKNOWN_TOPIC_OR_PARTITION),
            }
        };
        if let Some(e) = error {
            refused.insert(name.clone(), e);
        }
    }
    if !refused.is_empty() {
        return topic_results(&topics, |t, _| {
            refused.get(t).copied().unwrap_or(OPERATION_NOT_ATTEMPTED)
        });
    }
    let partitions: Vec<TopicPartition> = topics
        .iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| TopicPartition::new(t.as_str(), *p)))
        .collect();
    let v = ctx.api_version;
    if verify_only {
        let answer = broker
            .txn
            .verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
            .await;
        return match answer {
            Err(e) => topic_results(&topics, |_, _| txn_error_code(&e)),
            Ok(results) => {
                let lookup: std::collections::HashMap<TopicPartition, Result<(), TxnError>> =
                    results.into_iter().collect();
                topic_results(&topics, |t, p| {
                    match lookup.get(&TopicPartition::new(t, p)) {
                        Some(Ok(())) => code::NONE,
                        Some(Err(e)) => txn_error_code(e),
                        None => code::UNKNOWN_SERVER_ERROR,
                    }
                })
            }
        };
    }
    let result = broker
        .txn
        .add_partitions(
            transactional_id,
            producer_id,
            producer_epoch,
            partitions.into_iter().collect::<BTreeSet<_>>(),
        )
        .await;
    let code = match result {
        Ok(()) => code::NONE,
        Err(e) => fenced(txn_error_code(&e), v, 3),
    };
    topic_results(&topics, |_, _| code)
}

pub(crate) async fn add_partitions_to_txn(
    broker: &Broker,
    request: AddPartitionsToTxnRequest,
    ctx: &RequestContext,
) -> AddPartitionsToTxnResponse {
    let mut response = AddPartitionsToTxnResponse::default();
    let topics_of = |topics: Vec<
        kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic,
    >| {
        topics
            .into_iter()
            .map(|t| (t.name.0.to_string(), t.partitions))
            .collect::<Vec<_>>()
    };
    if ctx.api_version <= 3 {
        response.results_by_topic_v3_and_below = add_one(
            broker,
            ctx,
            request.v3_and_below_transactional_id.as_str(),
            request.v3_and_below_producer_id.0,
            request.v3_and_below_producer_epoch,
            false,
            topics_of(request.v3_and_below_topics),
        )
        .await;
        return response;
    }
    // v4+ is the brokers' form (KIP-890): Kafka requires CLUSTER_ACTION for it.
    if !broker.authz(ctx).allows_cluster(Op::ClusterAction) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        return response;
    }
    response.error_code = code::NONE;
    for txn in request.transactions {
        let mut result = AddPartitionsToTxnResult::default();
        result.topic_results = add_one(
            broker,
            ctx,
            txn.transactional_id.as_str(),
            txn.producer_id.0,
            txn.producer_epoch,
            txn.verify_only,
            topics_of(txn.topics),
        )
        .await;
        result.transactional_id = txn.transactional_id;
        response.results_by_transaction.push(result);
    }
    response
}

pub(crate) async fn end_txn(
    broker: &Broker,
    request: EndTxnRequest,
    ctx: &RequestContext,
) -> EndTxnResponse {
    let mut response = EndTxnResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    let id = request.transactional_id.as_str();
    if !broker
        .authz(ctx)
        .allows(Op::Write, Res::TransactionalId, id)
    {
        response.error_code = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        return response;
    }
    let result = broker
        .txn
        .end_txn(
            id,
            request.producer_id.0,
            request.producer_epoch,
            request.committed,
        )
        .await;
    response.error_code = match result {
        Ok(()) => code::NONE,
        Err(e) => fenced(txn_error_code(&e), ctx.api_version, 2),
    };
    response
}

pub(crate) async fn describe_transactions(
    broker: &Broker,
    request: DescribeTransactionsRequest,
    ctx: &RequestContext,
) -> DescribeTransactionsResponse {
    let mut response = DescribeTransactionsResponse::default();
    let authz = broker.authz(ctx);
    for id in request.transactional_ids {
        let mut s = TransactionState::default();
        s.producer_id = ProducerId(-1);
        s.producer_epoch = -1;
        s.transaction_state = str_bytes("");
        let described = if authz.allows(Op::Describe, Res::TransactionalId, id.as_str()) {
            broker.txn.describe(id.as_str()).await
        } else {
            Err(TxnError::InvalidRequest)
        };
        match described {
            Ok(d) => {
                s.error_code = code::NONE;
                s.transaction_state = str_bytes(d.state.name());
                s.transaction_timeout_ms = d.timeout_ms;
                s.transaction_start_time_ms = d.start_ms;
                s.producer_id = ProducerId(d.producer_id);
                s.producer_epoch = d.producer_epoch;
                let mut topics: Vec<TopicData> = Vec::new();
                for tp in d.partitions {
                    match topics.last_mut() {
                        Some(t) if t.topic.0.as_str() == &*tp.topic => {
                            t.partitions.push(tp.partition)
                        }
                        _ => {
                            let mut t = TopicData::default();
                            t.topic = topic_name(&tp.topic);
                            t.partitions = vec![tp.partition];
                            topics.push(t);
                        }
                    }
                }
                s.topics = topics;
            }
            Err(TxnError::InvalidRequest) => {
                s.error_code = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            }
            Err(e) => s.error_code = txn_error_code(&e),
        }
        s.transactional_id = id;
        response.transaction_states.push(s);
    }
    response
}

pub(crate) async fn list_transactions(
    broker: &Broker,
    request: ListTransactionsRequest,
    ctx: &RequestContext,
) -> ListTransactionsResponse {
    let mut response = ListTransactionsResponse::default();
    response.error_code = code::NONE;
    let mut states = Vec::new();
    for s in request.state_filters {
        match TxnState::from_name(s.as_str()) {
            Some(state) => states.push(state),
            None => response.unknown_state_filters.push(s),
        }
    }
    // Only unknown states asked for: nothing can match.
    if states.is_empty() && !response.unknown_state_filters.is_empty() {
        return response;
    }
    let filter = ListFilter {
        states,
        producer_ids: request.producer_id_filters.iter().map(|p| p.0).collect(),
        min_duration_ms: if ctx.api_version >= 1 {
            request.duration_filter
        } else {
            -1
        },
    };
    // v2 (KIP-1152): a regular expression the whole id must match; empty means any.
    let pattern = match request.transactional_id_pattern.as_deref() {
        Some(p) if !p.is_empty() && ctx.api_version >= 2 => {
            match regex::Regex::new(&format!("^(?:{p})$")) {
                Ok(r) => Some(r),
                Err(_) => {
                    response.error_code = code::INVALID_REGULAR_EXPRESSION;
                    return response;
                }
            }
        }
        _ => None,
    };
    let authz = broker.authz(ctx);
    for (id, producer_id, state) in broker.txn.list(filter).await {
        if !authz.shows(Op::Describe, Res::TransactionalId, &id)
            || pattern.as_ref().is_some_and(|r| !r.is_match(&id))
        {
            continue;
        }
        let mut l = ListedState::default();
        l.transactional_id = TransactionalId(str_bytes(&id));
        l.producer_id = ProducerId(producer_id);
        l.transaction_state = str_bytes(state.name());
        response.transaction_states.push(l);
    }
    response
}

/// AddOffsetsToTxn (v0–v3): adds the group's `__consumer_offsets` partition to the
/// transaction, so the commit marker reaches the group's coordinator.
pub(crate) async fn add_offsets_to_txn(
    broker: &Broker,
    request: kafka_protocol::messages::AddOffsetsToTxnRequest,
    ctx: &RequestContext,
) -> kafka_protocol::messages::AddOffsetsToTxnResponse {
    let mut response = kafka_protocol::messages::AddOffsetsToTxnResponse::default();
    let id = request.transactional_id.as_str();
    let authz = broker.authz(ctx);
    if !authz.allows(Op::Write, Res::TransactionalId, id) {
        response.error_code = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        return response;
    }
    if !authz.allows(Op::Read, Res::Group, request.group_id.as_str()) {
        response.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return response;
    }
    let shard =
        crate::coordinator::shard_of(request.group_id.as_str(), broker.groups.shard_count());
    let partition = TopicPartition::new(crate::coordinator::OFFSETS_TOPIC, shard as i32);
    let result = broker
        .txn
        .add_partitions(
            id,
            request.producer_id.0,
            request.producer_epoch,
            [partition].into_iter().collect(),
        )
        .await;
    response.error_code = match result {
        Ok(()) => code::NONE,
        Err(e) => fenced(txn_error_code(&e), ctx.api_version, 2),
    };
    response
}

/// TxnOffsetCommit (v0–v4): offsets of a group committed inside the producer's transaction,
/// pending at the group's coordinator until the transaction's marker arrives.
pub(crate) async fn txn_offset_commit(
    broker: &Broker,
    request: kafka_protocol::messages::TxnOffsetCommitRequest,
    ctx: &RequestContext,
) -> kafka_protocol::messages::TxnOffsetCommitResponse {
    use kafka_protocol::messages::txn_offset_commit_response::{
        TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
    };
    let mut response = kafka_protocol::messages::TxnOffsetCommitResponse::default();
    let authz = broker.authz(ctx);
    let group_id = request.group_id.to_string();
    // Kafka's order: the transactional id, then the group, then each topic.
    let refused_all = if !authz.allows(
        Op::Write,
        Res::TransactionalId,
        request.transactional_id.as_str(),
    ) {
        Some(code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    } else if !authz.allows(Op::Read, Res::Group, &group_id) {
        Some(code::GROUP_AUTHORIZATION_FAILED)
    } else {
        None
    };
    let mut codes: std::collections::HashMap<TopicPartition, i16> = Default::default();
    let mut partitions = Vec::new();
    for topic in &request.topics {
        let name = topic.name.0.as_str();
        let refused = refused_all.or_else(|| {
            (!authz.allows(Op::Read, Res::Topic, name)).then_some(code::TOPIC_AUTHORIZATION_FAILED)
        });
        for p in &topic.partitions {
            let tp = TopicPartition::new(name, p.partition_index);
            match refused {
                Some(c) => {
                    codes.insert(tp, c);
                }
                None => partitions.push(strata_groups::CommitPartition {
                    partition: tp,
                    offset: strata_core::Offset(p.committed_offset),
                    leader_epoch: (ctx.api_version >= 2 && p.committed_leader_epoch >= 0)
                        .then_some(p.committed_leader_epoch),
                    metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                }),
            }
        }
    }
    if !partitions.is_empty() {
        let answer = broker
            .groups
            .txn_offset_commit(strata_groups::TxnOffsetCommitRequest {
                group_id,
                producer_id: request.producer_id.0,
                generation_id: if ctx.api_version >= 3 {
                    request.generation_id
                } else {
                    -1
                },
                member_id: if ctx.api_version >= 3 {
                    request.member_id.to_string()
                } else {
                    String::new()
                },
                group_instance_id: request
                    .group_instance_id
                    .as_ref()
                    .filter(|_| ctx.api_version >= 3)
                    .map(|s| s.to_string()),
                commit_timestamp_ms: broker.clock.wall_millis(),
                partitions: partitions.clone(),
            })
            .await;
        match answer {
            Ok(strata_groups::Response::OffsetCommit(r)) => {
                for (tp, e) in r.partitions {
                    codes.insert(tp, crate::errors::group_code(e));
                }
            }
            Ok(_) => {
                for p in &partitions {
                    codes.insert(p.partition.clone(), code::UNKNOWN_SERVER_ERROR);
                }
            }
            Err(e) => {
                for p in &partitions {
                    codes.insert(p.partition.clone(), crate::errors::group_error_code(&e));
                }
            }
        }
    }
    response.topics = request
        .topics
        .iter()
        .map(|topic| {
            let mut t = TxnOffsetCommitResponseTopic::default();
            t.name = topic.name.clone();
            t.partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let mut r = TxnOffsetCommitResponsePartition::default();
                    r.partition_index = p.partition_index;
                    r.error_code = codes
                        .get(&TopicPartition::new(
                            topic.name.0.as_str(),
                            p.partition_index,
                        ))
                        .copied()
                        .unwrap_or(code::UNKNOWN_SERVER_ERROR);
                    r
                })
                .collect();
            t
        })
        .collect();
    response
}
