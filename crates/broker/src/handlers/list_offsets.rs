//! ListOffsets (v1–v8): earliest, latest, max-timestamp and by-timestamp lookups.
//!
//! With isolation_level 1 (read_committed, v2+) "latest" is the last stable offset, as in
//! Kafka; the other lookups do not depend on it. Partitions are looked up concurrently.

use std::sync::Arc;

use futures::future::join_all;
use kafka_protocol::messages::list_offsets_request::ListOffsetsPartition;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use strata_core::TopicPartition;
use strata_log::{LogError, TopicInfo};

use super::{check_leader_epoch, leader_epoch_of, LEADER_EPOCH};
use crate::authorize::{Op, Res};
use crate::errors::{code, error_code};
use crate::server::Broker;
use crate::RequestContext;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
/// KIP-405 "earliest local": all of a Strata partition is equally local.
const EARLIEST_LOCAL: i64 = -4;

pub(crate) async fn handle(
    broker: &Broker,
    request: ListOffsetsRequest,
    ctx: &RequestContext,
) -> ListOffsetsResponse {
    let v = ctx.api_version;
    let committed = v >= 2 && request.isolation_level == 1;
    let authz = &broker.authz(ctx);
    let topics = join_all(request.topics.into_iter().map(|topic| async move {
        let info = broker.log.topic(topic.name.0.as_str());
        let allowed = authz.allows(Op::Describe, Res::Topic, topic.name.0.as_str());
        let partitions = join_all(
            topic
                .partitions
                .into_iter()
                .map(|p| list_partition(broker, info.clone(), allowed, p, v, committed)),
        )
        .await;
        let mut out = ListOffsetsTopicResponse::default();
        out.name = topic.name;
        out.partitions = partitions;
        out
    }))
    .await;
    let mut response = ListOffsetsResponse::default();
    response.topics = topics;
    response
}

async fn list_partition(
    broker: &Broker,
    info: Option<Arc<TopicInfo>>,
    allowed: bool,
    partition: ListOffsetsPartition,
    v: i16,
    committed: bool,
) -> ListOffsetsPartitionResponse {
    let mut out = ListOffsetsPartitionResponse::default();
    out.partition_index = partition.partition_index;
    if !allowed {
        out.error_code = code::TOPIC_AUTHORIZATION_FAILED;
        return out;
    }
    let tp = match info {
        Some(info) if (0..info.partitions).contains(&partition.partition_index) => {
            TopicPartition::new(Arc::clone(&info.name), partition.partition_index)
        }
        _ => {
            out.error_code = code::UNKNOWN_TOPIC_OR_PARTITION;
            return out;
        }
    };
    if v >= 4 {
        let epoch_error =
            check_leader_epoch(partition.current_leader_epoch, leader_epoch_of(broker, &tp));
        if epoch_error != code::NONE {
            out.error_code = epoch_error;
            return out;
        }
    }
    match lookup(broker, &tp, partition.timestamp, committed).await {
        Ok(Some((offset, timestamp))) => {
            out.offset = offset;
            out.timestamp = timestamp;
            if v >= 4 {
                out.leader_epoch = leader_epoch_of(broker, &tp).unwrap_or(LEADER_EPOCH);
            }
        }
        // Nothing at or after the timestamp: Kafka answers offset -1, timestamp -1.
        Ok(None) => {}
        Err(e) => out.error_code = error_code(&e),
    }
    out
}

/// The (offset, timestamp) answer for one partition.
async fn lookup(
    broker: &Broker,
    tp: &TopicPartition,
    timestamp: i64,
    committed: bool,
) -> Result<Option<(i64, i64)>, LogError> {
    match timestamp {
        LATEST if committed => Ok(Some((broker.log.watermarks(tp)?.last_stable.get(), -1))),
        LATEST => Ok(Some((broker.log.watermarks(tp)?.high.get(), -1))),
        EARLIEST | EARLIEST_LOCAL => Ok(Some((broker.log.watermarks(tp)?.log_start.get(), -1))),
        MAX_TIMESTAMP => Ok(broker
            .log
            .max_timestamp(tp)
            .await?
            .map(|(offset, ts)| (offset.get(), ts))),
        // Other negative specials (tiered-storage ones of later versions) match nothing here.
        t if t < 0 => Ok(None),
        t => Ok(broker
            .log
            .offset_for_timestamp(tp, t)
            .await?
            .map(|(offset, ts)| (offset.get(), ts))),
    }
}
