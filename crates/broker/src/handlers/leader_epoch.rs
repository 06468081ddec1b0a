//! OffsetForLeaderEpoch (v2–v4): with one leader epoch (0) for every partition, the end offset
//! of any epoch a client asks about is the high watermark. librdkafka and the Java client call
//! this after a leader change to detect log truncation; with one epoch they never find any.

use std::sync::Arc;

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use strata_core::TopicPartition;

use super::{check_leader_epoch, leader_epoch_of, LEADER_EPOCH};
use crate::authorize::{Op, Res};
use crate::errors::{code, error_code};
use crate::server::Broker;
use crate::RequestContext;

pub(crate) fn offset_for_leader_epoch(
    broker: &Broker,
    request: OffsetForLeaderEpochRequest,
    ctx: &RequestContext,
) -> OffsetForLeaderEpochResponse {
    let authz = broker.authz(ctx);
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let allowed = authz.allows(Op::Describe, Res::Topic, topic.topic.0.as_str());
            let info = broker.log.topic(topic.topic.0.as_str());
            let partitions = topic
                .partitions
                .into_iter()
                .map(|p| {
                    let mut out = EpochEndOffset::default();
                    out.partition = p.partition;
                    out.leader_epoch = -1;
                    out.end_offset = -1;
                    if !allowed {
                        out.error_code = code::TOPIC_AUTHORIZATION_FAILED;
                        return out;
                    }
                    let tp = match &info {
                        Some(info) if (0..info.partitions).contains(&p.partition) => {
                            TopicPartition::new(Arc::clone(&info.name), p.partition)
                        }
                        _ => {
                            out.error_code = code::UNKNOWN_TOPIC_OR_PARTITION;
                            return out;
                        }
                    };
                    let leader_epoch = leader_epoch_of(broker, &tp);
                    let epoch_error = check_leader_epoch(p.current_leader_epoch, leader_epoch);
                    if epoch_error != code::NONE {
                        out.error_code = epoch_error;
                        return out;
                    }
                    let leader_epoch = leader_epoch.unwrap_or(LEADER_EPOCH);
                    if p.leader_epoch < LEADER_EPOCH {
                        // An epoch before the first: Kafka answers UNDEFINED (-1, -1).
                        return out;
                    }
                    match broker.log.watermarks(&tp) {
                        Ok(marks) => {
                            out.error_code = code::NONE;
                            // A log is never truncated (storage keeps every acknowledged
                            // batch across owners), so every epoch up to the current one
                            // ends, for a client's truncation check, at the high watermark.
                            out.leader_epoch = p.leader_epoch.min(leader_epoch);
                            out.end_offset = marks.high.get();
                        }
                        Err(e) => out.error_code = error_code(&e),
                    }
                    out
                })
                .collect();
            let mut out = OffsetForLeaderTopicResult::default();
            out.topic = topic.topic;
            out.partitions = partitions;
            out
        })
        .collect();
    let mut response = OffsetForLeaderEpochResponse::default();
    response.topics = topics;
    response
}
