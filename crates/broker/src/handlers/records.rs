//! DeleteRecords (v0–v2): moves partitions' log start forward, concurrently.

use std::sync::Arc;

use futures::future::join_all;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use strata_core::{Offset, TopicPartition};
use tracing::info;

use super::refuse_internal;
use crate::authorize::{Op, Res};
use crate::errors::{code, error_code};
use crate::server::Broker;
use crate::RequestContext;

/// An offset of -1 asks to delete everything below the high watermark.
const HIGH_WATERMARK: i64 = -1;

pub(crate) async fn delete_records(
    broker: &Broker,
    request: DeleteRecordsRequest,
    ctx: &RequestContext,
) -> DeleteRecordsResponse {
    let authz = &broker.authz(ctx);
    let topics = join_all(request.topics.into_iter().map(|topic| async move {
        let allowed = authz.allows(Op::Delete, Res::Topic, topic.name.0.as_str());
        let info = broker.log.topic(topic.name.0.as_str());
        let partitions = join_all(topic.partitions.into_iter().map(|p| {
            let info = info.clone();
            async move {
                let mut out = DeleteRecordsPartitionResult::default();
                out.partition_index = p.partition_index;
                out.low_watermark = -1;
                let tp = match info {
                    // Before the lookup's answer, so a refusal does not tell what exists.
                    _ if !allowed => {
                        out.error_code = code::TOPIC_AUTHORIZATION_FAILED;
                        return out;
                    }
                    Some(info) if refuse_internal(&info.name, "delete records of").is_some() => {
                        out.error_code = code::INVALID_TOPIC_EXCEPTION;
                        return out;
                    }
                    Some(info) if (0..info.partitions).contains(&p.partition_index) => {
                        TopicPartition::new(Arc::clone(&info.name), p.partition_index)
                    }
                    _ => {
                        out.error_code = code::UNKNOWN_TOPIC_OR_PARTITION;
                        return out;
                    }
                };
                let before = match p.offset {
                    HIGH_WATERMARK => None,
                    offset if offset < 0 => {
                        out.error_code = code::OFFSET_OUT_OF_RANGE;
                        return out;
                    }
                    offset => Some(Offset(offset)),
                };
                match broker.log.delete_records(&tp, before).await {
                    Ok(log_start) => {
                        info!(partition = %tp, log_start = log_start.get(), "deleted records");
                        out.error_code = code::NONE;
                        out.low_watermark = log_start.get();
                    }
                    Err(e) => out.error_code = error_code(&e),
                }
                out
            }
        }))
        .await;
        let mut out = DeleteRecordsTopicResult::default();
        out.name = topic.name;
        out.partitions = partitions;
        out
    }))
    .await;
    let mut response = DeleteRecordsResponse::default();
    response.topics = topics;
    response
}
