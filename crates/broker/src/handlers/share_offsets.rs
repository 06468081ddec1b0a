//! The offsets APIs of share groups (KIP-932): DescribeShareGroupOffsets,
//! AlterShareGroupOffsets and DeleteShareGroupOffsets v0, over the stored share state
//! (`crate::share`). Conversion and checks only.

use kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse, TopicName,
};
use strata_core::TopicPartition;
use uuid::Uuid;

use super::str_bytes;
use crate::authorize::{Op, Res};
use crate::errors::{code, group_error_code, share_error_code};
use crate::server::Broker;
use crate::RequestContext;

/// The checks the share-group offsets APIs share: the group's ACL, its coordinator, and (for
/// changes) no members.
fn offsets_refusal(
    broker: &Broker,
    ctx: &RequestContext,
    group_id: &str,
    op: Op,
    change: bool,
) -> Option<i16> {
    if !broker.authz(ctx).allows(op, Res::Group, group_id) {
        Some(code::GROUP_AUTHORIZATION_FAILED)
    } else if let Err(refusal) = broker.groups.hosting(group_id) {
        Some(group_error_code(&refusal))
    } else if change && broker.share.has_members(group_id) {
        Some(code::NON_EMPTY_GROUP)
    } else {
        None
    }
}

/// DescribeShareGroupOffsets v0: the stored start offset of each share partition (-1 where
/// the group has none yet); no topics named means every topic.
pub(crate) async fn describe_share_group_offsets(
    broker: &Broker,
    request: DescribeShareGroupOffsetsRequest,
    ctx: &RequestContext,
) -> DescribeShareGroupOffsetsResponse {
    let mut response = DescribeShareGroupOffsetsResponse::default();
    let authz = broker.authz(ctx);
    for g in request.groups {
        let group_id = g.group_id.0.to_string();
        let mut out = DescribeShareGroupOffsetsResponseGroup::default();
        out.group_id = g.group_id;
        if let Some(error) = offsets_refusal(broker, ctx, &group_id, Op::Describe, false) {
            out.error_code = error;
            response.groups.push(out);
            continue;
        }
        let wanted: Vec<(String, Option<Vec<i32>>)> = match g.topics {
            Some(topics) => topics
                .into_iter()
                .map(|t| (t.topic_name.0.to_string(), Some(t.partitions)))
                .collect(),
            None => broker
                .log
                .topics()
                .into_iter()
                .filter(|t| !super::is_internal_topic(&t.name))
                .map(|t| (t.name.to_string(), None))
                .collect(),
        };
        let listing_all = wanted.iter().all(|(_, p)| p.is_none());
        for (name, partitions) in wanted {
            let mut topic = DescribeShareGroupOffsetsResponseTopic::default();
            topic.topic_name = TopicName(str_bytes(&name));
            let info = broker.log.topic(&name);
            let allowed = authz.allows(Op::Describe, Res::Topic, &name);
            if let Some(t) = &info {
                topic.topic_id = Uuid::from_bytes(t.id.0);
            }
            let partitions = partitions
                .unwrap_or_else(|| (0..info.as_ref().map_or(0, |t| t.partitions)).collect());
            for p in partitions {
                let mut part = DescribeShareGroupOffsetsResponsePartition::default();
                part.partition_index = p;
                part.start_offset = -1;
                part.leader_epoch = -1;
                match &info {
                    _ if !allowed => part.error_code = code::TOPIC_AUTHORIZATION_FAILED,
                    None => part.error_code = code::UNKNOWN_TOPIC_OR_PARTITION,
                    Some(t) if p < 0 || p >= t.partitions => {
                        part.error_code = code::UNKNOWN_TOPIC_OR_PARTITION
                    }
                    Some(t) => match broker.share.stored_start(&group_id, t.id.0, p).await {
                        Ok(Some(start)) => part.start_offset = start,
                        Ok(None) => {}
                        Err(e) => part.error_code = share_error_code(&e),
                    },
                }
                topic.partitions.push(part);
            }
            // Listing every topic: only those the group has state for.
            let keep = !listing_all
                || topic
                    .partitions
                    .iter()
                    .any(|p| p.start_offset >= 0 || p.error_code != code::NONE && allowed);
            if keep {
                out.topics.push(topic);
            }
        }
        response.groups.push(out);
    }
    response
}

/// AlterShareGroupOffsets v0: sets the start offset of share partitions of an empty group.
pub(crate) async fn alter_share_group_offsets(
    broker: &Broker,
    request: AlterShareGroupOffsetsRequest,
    ctx: &RequestContext,
) -> AlterShareGroupOffsetsResponse {
    let mut response = AlterShareGroupOffsetsResponse::default();
    let group_id = request.group_id.0.to_string();
    if let Some(error) = offsets_refusal(broker, ctx, &group_id, Op::Read, true) {
        response.error_code = error;
        return response;
    }
    let authz = broker.authz(ctx);
    for t in request.topics {
        let name = t.topic_name.0.to_string();
        let info = broker.log.topic(&name);
        let allowed = authz.allows(Op::Read, Res::Topic, &name);
        let mut topic = AlterShareGroupOffsetsResponseTopic::default();
        topic.topic_name = t.topic_name;
        if let Some(i) = &info {
            topic.topic_id = Uuid::from_bytes(i.id.0);
        }
        for p in t.partitions {
            let mut out = AlterShareGroupOffsetsResponsePartition::default();
            out.partition_index = p.partition_index;
            out.error_code = match &info {
                _ if !allowed => code::TOPIC_AUTHORIZATION_FAILED,
                None => code::UNKNOWN_TOPIC_OR_PARTITION,
                Some(i) if p.partition_index < 0 || p.partition_index >= i.partitions => {
                    code::UNKNOWN_TOPIC_OR_PARTITION
                }
                _ if p.start_offset < 0 => code::INVALID_REQUEST,
                Some(i) => {
                    let tp = TopicPartition::new(name.clone(), p.partition_index);
                    match broker
                        .share
                        .reset(&group_id, &tp, i.id.0, Some(p.start_offset))
                        .await
                    {
                        Ok(()) => code::NONE,
                        Err(e) => share_error_code(&e),
                    }
                }
            };
            topic.partitions.push(out);
        }
        response.responses.push(topic);
    }
    response
}

/// DeleteShareGroupOffsets v0: forgets the share state of whole topics for an empty group (its
/// members start again by `share_auto_offset_reset`).
pub(crate) async fn delete_share_group_offsets(
    broker: &Broker,
    request: DeleteShareGroupOffsetsRequest,
    ctx: &RequestContext,
) -> DeleteShareGroupOffsetsResponse {
    let mut response = DeleteShareGroupOffsetsResponse::default();
    let group_id = request.group_id.0.to_string();
    if let Some(error) = offsets_refusal(broker, ctx, &group_id, Op::Delete, true) {
        response.error_code = error;
        return response;
    }
    let authz = broker.authz(ctx);
    for t in request.topics {
        let name = t.topic_name.0.to_string();
        let mut topic = DeleteShareGroupOffsetsResponseTopic::default();
        topic.topic_name = t.topic_name;
        topic.error_code = match broker.log.topic(&name) {
            _ if !authz.allows(Op::Read, Res::Topic, &name) => code::TOPIC_AUTHORIZATION_FAILED,
            None => code::UNKNOWN_TOPIC_OR_PARTITION,
            Some(i) => {
                topic.topic_id = Uuid::from_bytes(i.id.0);
                let mut error = code::NONE;
                for p in 0..i.partitions {
                    let tp = TopicPartition::new(name.clone(), p);
                    if let Err(e) = broker.share.reset(&group_id, &tp, i.id.0, None).await {
                        error = share_error_code(&e);
                    }
                }
                error
            }
        };
        response.responses.push(topic);
    }
    response
}
