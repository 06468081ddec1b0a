//! Produce (v3–v13): every partition of the request is appended concurrently; each gets its
//! own error code. Record batches go to the log as the client's bytes.
//!
//! A refused batch is explained (v8+): `error_message` for every error, and for a batch
//! refused because of one of its records (INVALID_RECORD) `record_errors` names that record by
//! its index in the batch (KIP-467), as Kafka does. Strata locates the record for the checks
//! of a batch's records, compressed or not (a record whose fields do not fill its declared
//! length, an out-of-sequence offset delta); whole-batch failures (CRC mismatch:
//! CORRUPT_MESSAGE, sizes, sequence numbers, framing between records, compressed data that
//! does not decompress) get the message alone. Strata checks no record's timestamp, so it
//! never answers INVALID_TIMESTAMP for one.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use strata_core::TopicPartition;
use strata_log::{Acks, AppendOutcome, AppendTicket, LogError, TopicInfo, TxnGuard};
use strata_txn::TxnError;
use strata_wire::batch::{read_batch_header, BatchError};
use tracing::debug;

use super::{refuse_internal, topic_id_of, topics_or_auto_create};
use crate::authorize::{Op, Res};
use crate::errors::{code, error_code, lookup_error_code, txn_error_code, txn_verification_code};
use crate::server::Broker;
use crate::RequestContext;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What the connection does after a produce.
#[derive(Debug)]
pub(crate) enum Outcome {
    Respond(ProduceResponse),
    /// acks=0 and every partition was accepted: Kafka sends nothing back.
    NoResponse,
    /// acks=0 and some partition failed: Kafka closes the connection, the only signal such a
    /// producer gets, so that it refreshes metadata.
    CloseConnection,
}

/// A partition's failure: a Kafka code and, for v8+, a message and the records that failed
/// the batch (KIP-467).
#[derive(Debug, Clone)]
struct PartitionError {
    code: i16,
    message: Option<String>,
    /// (index of the record in its batch, why).
    records: Vec<(i32, String)>,
}

impl From<(i16, Option<String>)> for PartitionError {
    fn from((code, message): (i16, Option<String>)) -> Self {
        Self {
            code,
            message,
            records: Vec::new(),
        }
    }
}

impl From<&LogError> for PartitionError {
    fn from(e: &LogError) -> Self {
        let records = match e {
            LogError::CorruptMessage(BatchError::InvalidRecord { index, reason }) => {
                vec![(*index, reason.clone())]
            }
            _ => Vec::new(),
        };
        Self {
            code: error_code(e),
            message: Some(e.to_string()),
            records,
        }
    }
}

pub(crate) async fn handle(
    broker: &Broker,
    request: ProduceRequest,
    ctx: &RequestContext,
) -> Outcome {
    let v = ctx.api_version;
    let fire_and_forget = request.acks == 0;
    // acks=0 requests carry a timeout too: it bounds the wait for room in the in-flight budget.
    let timeout = Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0))
        .max(broker.settings.min_produce_timeout);
    let acks = match request.acks {
        0 => Ok(Acks::None { timeout }),
        1 | -1 => Ok(Acks::Durable { timeout }),
        other => Err(PartitionError::from((
            code::INVALID_REQUIRED_ACKS,
            Some(format!("acks must be 0, 1 or -1, got {other}")),
        ))),
    };
    // Kafka: a request carrying transactional batches needs a transactional id, and WRITE on
    // it; otherwise every partition is refused.
    let authz = broker.authz(ctx);
    let transactional_id = request
        .transactional_id
        .as_ref()
        .map(|id| id.0.as_str())
        .filter(|id| !id.is_empty());
    let refusal = match &acks {
        Err(e) => Some(e.clone()),
        Ok(_)
            if has_transactional_batches(&request)
                && !transactional_id
                    .is_some_and(|id| authz.allows(Op::Write, Res::TransactionalId, id)) =>
        {
            Some(PartitionError::from((
                code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                Some(match transactional_id {
                    None => "transactional batches need the request's transactional_id".into(),
                    Some(id) => format!("no WRITE permission on transactional id {id}"),
                }),
            )))
        }
        Ok(_) => None,
    };
    let acks = acks.unwrap_or(Acks::None { timeout });
    // KIP-890 part 1: a batch that would open the producer's transaction in a partition is
    // appended only once the coordinator confirms the partition is in the ongoing transaction.
    // Before waiting for the turn: verifying assigns no offsets, so the requests behind this
    // one verify meanwhile instead of each paying its round trip after ours.
    let verified = match (&refusal, transactional_id) {
        (None, Some(id)) => verify_txn_partitions(broker, &request, id, v).await,
        _ => Verification::default(),
    };

    // Offsets are assigned in the connection's request order: wait for our turn, queue every
    // partition's batches one after another, pass the turn on, then wait for durability
    // together with the requests behind us.
    let mut turn = ctx.produce_turn.lock().ok().and_then(|mut t| t.take());
    if let Some(t) = turn.as_mut() {
        t.wait().await;
    }
    // Every partition of the request in one group commit, even when the writer is idle and
    // would otherwise write the first batch alone at once.
    let hold = broker.log.hold_writes();
    // Kafka creates topics on Metadata, which producers send first; creating here too (when
    // enabled) serves clients that skip it. All of the request's topics at once.
    let names: Vec<String> = if v >= 13 {
        Vec::new()
    } else {
        request
            .topic_data
            .iter()
            .map(|t| t.name.0.to_string())
            .collect()
    };
    // WRITE on the topic, checked before the topic is looked up (or created), so a client
    // cannot learn which topics exist from the error; creating also needs CREATE.
    let unauthorized = || PartitionError::from((code::TOPIC_AUTHORIZATION_FAILED, None));
    let refused: HashSet<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|name| {
            !authz.allows(Op::Write, Res::Topic, name)
                || (broker.settings.auto_create_topics
                    && broker.log.topic(name).is_none()
                    && !authz.may_create_topic(name))
        })
        .collect();
    let resolved = topics_or_auto_create(
        broker,
        names
            .iter()
            .map(String::as_str)
            .filter(|name| !refused.contains(name)),
        true,
    )
    .await;
    let mut staged = Vec::with_capacity(request.topic_data.len());
    for topic in request.topic_data {
        let info = if v >= 13 {
            match broker.log.topic_by_id(topic_id_of(&topic.topic_id)) {
                Some(info) if !authz.allows(Op::Write, Res::Topic, &info.name) => {
                    Err(unauthorized())
                }
                Some(info) => Ok(info),
                None => Err(PartitionError::from((code::UNKNOWN_TOPIC_ID, None))),
            }
        } else if refused.contains(topic.name.0.as_str()) {
            Err(unauthorized())
        } else {
            match resolved.get(topic.name.0.as_str()) {
                Some(Ok(info)) => Ok(Arc::clone(info)),
                Some(Err(e)) => Err((lookup_error_code(e), Some(e.to_string())).into()),
                None => Err((code::UNKNOWN_TOPIC_OR_PARTITION, None).into()),
            }
        };
        staged.push(produce_topic(broker, topic, info, acks, refusal.clone(), &verified, v).await);
    }
    drop(hold);
    if let Some(t) = turn.as_mut() {
        t.pass();
    }
    let topics = join_all(staged.into_iter().map(|(key, partitions)| async move {
        let results = join_all(partitions.into_iter().map(|(index, staged)| async move {
            let result = match staged {
                Ok((tp, ticket)) => {
                    let result = ticket.wait().await;
                    if let Err(e) = &result {
                        log_append_failure(&tp, e);
                    }
                    result.map_err(|e| PartitionError::from(&e))
                }
                Err(e) => Err(e),
            };
            (index, result)
        }))
        .await;
        (key, results)
    }))
    .await;

    if fire_and_forget {
        let failed = topics
            .iter()
            .flat_map(|(_, partitions)| partitions.iter())
            .find_map(|(index, result)| result.as_ref().err().map(|e| (*index, e.clone())));
        return match failed {
            None => Outcome::NoResponse,
            Some((partition, failure)) => {
                debug!(peer = %ctx.peer, partition, error = failure.code, message = ?failure.message,
                    "acks=0 produce failed; closing connection");
                Outcome::CloseConnection
            }
        };
    }

    let mut response = ProduceResponse::default();
    response.responses = topics
        .into_iter()
        .map(|(topic, partitions)| {
            let mut t = TopicProduceResponse::default();
            match topic {
                TopicKey::Name(name) => t.name = name,
                TopicKey::Id(id) => t.topic_id = id,
            }
            t.partition_responses = partitions
                .into_iter()
                .map(|(index, result)| partition_response(index, result, v))
                .collect();
            t
        })
        .collect();
    Outcome::Respond(response)
}

/// Whether any batch of the request has the transactional bit (Kafka's
/// `RequestUtils.hasTransactionalRecords`), from the batch headers alone.
fn has_transactional_batches(request: &ProduceRequest) -> bool {
    request
        .topic_data
        .iter()
        .flat_map(|t| &t.partition_data)
        .filter_map(|p| p.records.as_ref())
        .any(|records| {
            let mut at = 0usize;
            while let Some(h) = records.get(at..).and_then(read_batch_header) {
                if h.is_transactional() {
                    return true;
                }
                at = at.saturating_add(h.total_len());
            }
            false
        })
}

/// What KIP-890 part 1's verification found for a transactional produce.
#[derive(Default)]
struct Verification {
    /// The partitions whose transactional batch the coordinator did not verify, with the
    /// error each is answered.
    refused: HashMap<TopicPartition, PartitionError>,
    /// Every other partition with a transactional batch: its producer's standing before the
    /// verification, which the append checks again (a transaction that ended meanwhile is
    /// not reopened by this produce).
    guards: HashMap<TopicPartition, TxnGuard>,
}

/// Verifies `request`'s transactional batches with their coordinator (KIP-890 part 1). Only a
/// batch that would open its producer's transaction in a partition is verified: once one is
/// appended, the partition's producer state holds the transaction open, which serves as the
/// cache of the verification for that producer, epoch and partition until its marker; the
/// guard taken here makes the append check that this is still so. Partitions not served here
/// or of unknown topics are left to the append, which refuses them.
async fn verify_txn_partitions(
    broker: &Broker,
    request: &ProduceRequest,
    transactional_id: &str,
    v: i16,
) -> Verification {
    let mut guards = HashMap::new();
    let mut wanted: BTreeMap<(i64, i16), Vec<TopicPartition>> = BTreeMap::new();
    for topic in &request.topic_data {
        let info = if v >= 13 {
            broker.log.topic_by_id(topic_id_of(&topic.topic_id))
        } else {
            broker.log.topic(topic.name.0.as_str())
        };
        let Some(info) = info else { continue };
        for p in &topic.partition_data {
            let Some(records) = p.records.as_ref() else {
                continue;
            };
            let Some(h) = first_transactional(records) else {
                continue;
            };
            let tp = TopicPartition::new(Arc::clone(&info.name), p.index);
            let Ok(guard) = broker.log.txn_guard(&tp, h.producer_id) else {
                continue;
            };
            guards.insert(tp.clone(), guard);
            if matches!(guard, TxnGuard::Closed { .. }) {
                wanted
                    .entry((h.producer_id, h.producer_epoch))
                    .or_default()
                    .push(tp);
            }
        }
    }
    let mut refused = HashMap::new();
    for ((producer_id, epoch), partitions) in wanted {
        let answers: Vec<(TopicPartition, i16)> = match broker
            .txn
            .verify_partitions(transactional_id, producer_id, epoch, partitions.clone())
            .await
        {
            Ok(results) => results
                .into_iter()
                .map(|(tp, r)| (tp, r.as_ref().err().map_or(code::NONE, txn_error_code)))
                .collect(),
            // Not hosted here: ask the broker that hosts it.
            Err(TxnError::NotCoordinator) if broker.cluster.is_some() => {
                match broker.txn.marker_writer() {
                    Some(w) => {
                        w.verify_remote(transactional_id, producer_id, epoch, &partitions)
                            .await
                    }
                    None => partitions
                        .iter()
                        .map(|tp| (tp.clone(), code::COORDINATOR_NOT_AVAILABLE))
                        .collect(),
                }
            }
            Err(e) => partitions
                .iter()
                .map(|tp| (tp.clone(), txn_error_code(&e)))
                .collect(),
        };
        for (tp, coordinator_code) in answers {
            if coordinator_code == code::NONE {
                continue;
            }
            let error = txn_verification_code(coordinator_code);
            let message = if error == code::INVALID_TXN_STATE {
                "the partition was not added to the transaction".to_string()
            } else {
                format!("the transaction coordinator did not verify the partition (error {coordinator_code})")
            };
            debug!(partition = %tp, producer_id, coordinator_code, "transactional produce not verified");
            guards.remove(&tp);
            refused.insert(tp, PartitionError::from((error, Some(message))));
        }
    }
    Verification { refused, guards }
}

/// The header of the first transactional batch in `records`, if any.
fn first_transactional(records: &Bytes) -> Option<strata_wire::batch::BatchHeader> {
    let mut at = 0usize;
    while let Some(h) = records.get(at..).and_then(read_batch_header) {
        if h.is_transactional() {
            return Some(h);
        }
        at = at.saturating_add(h.total_len());
    }
    None
}

/// How the request named the topic, echoed back in the response.
enum TopicKey {
    Name(kafka_protocol::messages::TopicName),
    Id(uuid::Uuid),
}

/// A partition whose batches are queued (or refused before that).
type StagedPartition = (i32, Result<(TopicPartition, AppendTicket), PartitionError>);

async fn produce_topic(
    broker: &Broker,
    topic: TopicProduceData,
    info: Result<Arc<TopicInfo>, PartitionError>,
    acks: Acks,
    refusal: Option<PartitionError>,
    verified: &Verification,
    v: i16,
) -> (TopicKey, Vec<StagedPartition>) {
    let key = if v >= 13 {
        TopicKey::Id(topic.topic_id)
    } else {
        TopicKey::Name(topic.name)
    };
    let info = match (refusal, info) {
        (Some(refused), _) => Err(refused),
        (None, info) => info,
    }
    .and_then(|info| match refuse_internal(&info.name, "produce to") {
        Some((error, text)) => Err((error, Some(text)).into()),
        None => Ok(info),
    });
    let mut results = Vec::with_capacity(topic.partition_data.len());
    for partition in topic.partition_data {
        let tp = info
            .as_ref()
            .ok()
            .map(|info| TopicPartition::new(Arc::clone(&info.name), partition.index));
        if let Some(e) = tp.as_ref().and_then(|tp| verified.refused.get(tp)) {
            results.push((partition.index, Err(e.clone())));
            continue;
        }
        let guard = tp.as_ref().and_then(|tp| verified.guards.get(tp)).copied();
        results.push(produce_partition(broker, info.clone(), partition, acks, guard).await);
    }
    (key, results)
}

async fn produce_partition(
    broker: &Broker,
    topic: Result<Arc<TopicInfo>, PartitionError>,
    partition: PartitionProduceData,
    acks: Acks,
    guard: Option<TxnGuard>,
) -> StagedPartition {
    let index = partition.index;
    let topic = match topic {
        Ok(topic) => topic,
        Err(e) => return (index, Err(e)),
    };
    if index < 0 || index >= topic.partitions {
        return (index, Err((code::UNKNOWN_TOPIC_OR_PARTITION, None).into()));
    }
    let records: Bytes = match partition.records {
        Some(records) if !records.is_empty() => records,
        _ => {
            return (
                index,
                Err((code::INVALID_RECORD, Some("no record batches".to_string())).into()),
            )
        }
    };
    let tp = TopicPartition::new(Arc::clone(&topic.name), index);
    // A handle on the same bytes (no copy), to count what was accepted.
    let accepted = records.clone();
    let enqueued = match guard {
        Some(guard) => broker.log.enqueue_guarded(&tp, records, acks, guard).await,
        None => broker.log.enqueue(&tp, records, acks).await,
    };
    match enqueued {
        Ok(ticket) => {
            broker.traffic.produced(&topic.name, &accepted);
            (index, Ok((tp, ticket)))
        }
        Err(e) => {
            log_append_failure(&tp, &e);
            (index, Err(PartitionError::from(&e)))
        }
    }
}

fn log_append_failure(tp: &TopicPartition, e: &LogError) {
    if e.is_retryable() {
        debug!(partition = %tp, error = %e, "append failed (retryable)");
    } else {
        debug!(partition = %tp, error = %e, "append refused");
    }
}

fn partition_response(
    index: i32,
    result: Result<AppendOutcome, PartitionError>,
    v: i16,
) -> PartitionProduceResponse {
    let mut p = PartitionProduceResponse::default();
    p.index = index;
    match result {
        Ok(outcome) => {
            p.error_code = code::NONE;
            p.base_offset = outcome.base_offset.get();
            p.log_append_time_ms = outcome.log_append_time;
            if v >= 5 {
                p.log_start_offset = outcome.log_start_offset.get();
            }
        }
        Err(failure) => {
            p.error_code = failure.code;
            p.base_offset = -1;
            p.log_append_time_ms = -1;
            if v >= 8 {
                p.error_message = failure.message.map(StrBytes::from_string);
                p.record_errors = failure
                    .records
                    .into_iter()
                    .map(|(index, why)| {
                        let mut r = BatchIndexAndErrorMessage::default();
                        r.batch_index = index;
                        r.batch_index_error_message = Some(StrBytes::from_string(why));
                        r
                    })
                    .collect();
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Encodable;
    use strata_core::Offset;

    #[test]
    fn partition_responses_encode_at_every_version() {
        for v in 3..=13 {
            let ok = partition_response(
                0,
                Ok(AppendOutcome {
                    base_offset: Offset(42),
                    log_append_time: -1,
                    log_start_offset: Offset(0),
                }),
                v,
            );
            let err = partition_response(
                1,
                Err(PartitionError {
                    code: code::INVALID_RECORD,
                    message: Some("record 1 is bad".to_string()),
                    records: vec![(1, "bad".to_string())],
                }),
                v,
            );
            let mut topic = TopicProduceResponse::default();
            if v < 13 {
                topic.name = super::super::topic_name("t");
            }
            topic.partition_responses = vec![ok, err];
            let mut response = ProduceResponse::default();
            response.responses = vec![topic];
            let mut buf = bytes::BytesMut::new();
            response.encode(&mut buf, v).unwrap();
        }
    }
}
