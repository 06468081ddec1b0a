//! WriteTxnMarkers (v1): the partition owner's half of ending a transaction. The transaction
//! coordinator sends it to the owner of every partition in the transaction (Kafka's contract;
//! a coordinator on this broker may call [`write_markers`] directly). Each (marker, partition)
//! is one control batch appended through the ordinary append path, so it is fenced like any
//! append and answered only once durable; the log refuses a marker from an older producer
//! epoch (INVALID_PRODUCER_EPOCH) or an older coordinator epoch
//! (TRANSACTION_COORDINATOR_FENCED), and a partition this broker does not serve
//! (NOT_LEADER_OR_FOLLOWER). A marker for a producer with no transaction open in the partition
//! is still written, as Kafka writes it.
//!
//! Only v1 is served: Kafka 4.0 removed v0, and `kafka-protocol` decodes no v2 (Kafka 4.1's
//! transaction_version field).

use std::sync::Arc;

use futures::future::join_all;
use kafka_protocol::messages::write_txn_markers_request::WritableTxnMarker;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};
use strata_core::TopicPartition;
use tracing::debug;

use crate::authorize::Op;
use crate::coordinator::OFFSETS_TOPIC;
use crate::errors::{code, error_code};
use crate::server::Broker;
use crate::RequestContext;

pub(crate) async fn handle(
    broker: &Broker,
    request: WriteTxnMarkersRequest,
    ctx: &RequestContext,
) -> WriteTxnMarkersResponse {
    // Kafka: CLUSTER_ACTION on the cluster, or the whole request is refused.
    if !broker.authz(ctx).allows_cluster(Op::ClusterAction) {
        return refuse_all(&request, code::CLUSTER_AUTHORIZATION_FAILED);
    }
    write_markers(broker, request).await
}

/// Writes every marker of the request into its partitions (all concurrently), without the
/// authorization check: the entry point for a transaction coordinator running on this broker.
pub(crate) async fn write_markers(
    broker: &Broker,
    request: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let mut response = WriteTxnMarkersResponse::default();
    response.markers = join_all(request.markers.into_iter().map(|m| write_marker(broker, m))).await;
    response
}

async fn write_marker(broker: &Broker, marker: WritableTxnMarker) -> WritableTxnMarkerResult {
    let mut out = WritableTxnMarkerResult::default();
    out.producer_id = marker.producer_id;
    let marker_ref = &marker;
    out.topics = join_all(marker.topics.iter().map(|topic| async move {
        let mut t = WritableTxnMarkerTopicResult::default();
        t.name = topic.name.clone();
        let name: Arc<str> = Arc::from(topic.name.0.as_str());
        t.partitions = join_all(topic.partition_indexes.iter().map(|&index| {
            let tp = TopicPartition::new(Arc::clone(&name), index);
            async move {
                let mut p = WritableTxnMarkerPartitionResult::default();
                p.partition_index = index;
                p.error_code = write_one(broker, &tp, marker_ref).await;
                p
            }
        }))
        .await;
        t
    }))
    .await;
    out
}

async fn write_one(broker: &Broker, tp: &TopicPartition, m: &WritableTxnMarker) -> i16 {
    match broker.log.topic(&tp.topic) {
        Some(info) if (0..info.partitions).contains(&tp.partition) => {}
        _ => return code::UNKNOWN_TOPIC_OR_PARTITION,
    }
    let written = broker
        .log
        .write_txn_marker(
            tp,
            m.producer_id.0,
            m.producer_epoch,
            m.coordinator_epoch,
            m.transaction_result,
            broker.settings.txn_marker_timeout,
        )
        .await;
    match written {
        Ok(offset) => {
            if tp.topic.as_ref() == OFFSETS_TOPIC {
                let code =
                    offsets_marker_written(broker, tp, m.producer_id.0, m.transaction_result).await;
                if code != code::NONE {
                    return code;
                }
            }
            debug!(partition = %tp, producer_id = m.producer_id.0, commit = m.transaction_result,
                offset = offset.get(), "transaction marker written");
            code::NONE
        }
        Err(e) => {
            debug!(partition = %tp, producer_id = m.producer_id.0, error = %e,
                "transaction marker refused");
            error_code(&e)
        }
    }
}

/// A marker is durable in a `__consumer_offsets` partition: the group coordinator makes the
/// producer's pending transactional offset commits (TxnOffsetCommit) of that shard visible
/// (commit) or drops them (abort) before the marker is reported written, so the transaction
/// coordinator completes the transaction only once its offsets are settled. A failure is
/// reported for the partition and the coordinator sends the marker again (a repeated marker
/// is harmless, and the offsets are still pending).
async fn offsets_marker_written(
    broker: &Broker,
    tp: &TopicPartition,
    producer_id: i64,
    commit: bool,
) -> i16 {
    match broker
        .groups
        .complete_txn_offsets(tp.partition, producer_id, commit)
        .await
    {
        Ok(()) => code::NONE,
        Err(e) => crate::errors::group_error_code(&e),
    }
}

fn refuse_all(request: &WriteTxnMarkersRequest, error: i16) -> WriteTxnMarkersResponse {
    let mut response = WriteTxnMarkersResponse::default();
    response.markers = request
        .markers
        .iter()
        .map(|m| {
            let mut out = WritableTxnMarkerResult::default();
            out.producer_id = m.producer_id;
            out.topics = m
                .topics
                .iter()
                .map(|topic| {
                    let mut t = WritableTxnMarkerTopicResult::default();
                    t.name = topic.name.clone();
                    t.partitions = topic
                        .partition_indexes
                        .iter()
                        .map(|&index| {
                            let mut p = WritableTxnMarkerPartitionResult::default();
                            p.partition_index = index;
                            p.error_code = error;
                            p
                        })
                        .collect();
                    t
                })
                .collect();
            out
        })
        .collect();
    response
}
