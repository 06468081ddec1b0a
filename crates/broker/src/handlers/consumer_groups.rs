//! KIP-848 consumer groups: ConsumerGroupHeartbeat v0–v1 and ConsumerGroupDescribe v0–v1.
//! Conversion only; the coordinator (`strata-groups`, `consumer.rs`) decides.

use std::collections::BTreeSet;

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribeAssignment, DescribedGroup, Member,
    TopicPartitions as DescribeTopicPartitions,
};
use kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment as HeartbeatAssignment, TopicPartitions as HeartbeatTopicPartitions,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, GroupId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use strata_groups::{self as groups, assignor::Assignment, Response, TopicId};

use super::groups::{client_host, expect, until_shutdown};
use super::{str_bytes, uuid_of};
use crate::authorize::{Op, Res};
use crate::errors::{code, group_code, message};
use crate::group_configs::GroupConfig;
use crate::server::Broker;
use crate::RequestContext;

/// ConsumerGroupHeartbeat v0–v1. Answered once what the heartbeat changed is durable.
pub(crate) async fn consumer_group_heartbeat(
    broker: &Broker,
    request: ConsumerGroupHeartbeatRequest,
    ctx: &RequestContext,
) -> ConsumerGroupHeartbeatResponse {
    // READ on the group, DESCRIBE on every topic subscribed to by name (Kafka's checks).
    let authz = broker.authz(ctx);
    let refusal = if !authz.allows(Op::Read, Res::Group, request.group_id.0.as_str()) {
        Some((
            code::GROUP_AUTHORIZATION_FAILED,
            "Group authorization failed.".to_string(),
        ))
    } else {
        let refused: Vec<&str> = request
            .subscribed_topic_names
            .iter()
            .flatten()
            .map(|n| n.0.as_str())
            .filter(|n| !authz.allows(Op::Describe, Res::Topic, n))
            .collect();
        (!refused.is_empty()).then(|| {
            (
                code::TOPIC_AUTHORIZATION_FAILED,
                format!("Topic authorization failed for topics {refused:?}"),
            )
        })
    };
    let refusal = refusal.or_else(|| {
        super::share_groups::is_share_group(broker, request.group_id.0.as_str()).then(|| {
            (
                code::GROUP_ID_NOT_FOUND,
                format!(
                    "Group {} is not a consumer group.",
                    request.group_id.0.as_str()
                ),
            )
        })
    });
    if let Some((error, text)) = refusal {
        let mut response = ConsumerGroupHeartbeatResponse::default();
        response.error_code = error;
        response.error_message = message(text);
        return response;
    }
    let owned = request.topic_partitions.map(|topics| {
        let mut owned = Assignment::new();
        for t in topics {
            let partitions: BTreeSet<i32> = t.partitions.into_iter().collect();
            if !partitions.is_empty() {
                owned
                    .entry(TopicId(*t.topic_id.as_bytes()))
                    .or_default()
                    .extend(partitions);
            }
        }
        owned
    });
    let req = groups::ConsumerHeartbeatRequest {
        api_version: ctx.api_version,
        group_id: request.group_id.0.to_string(),
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        instance_id: request.instance_id.map(|s| s.to_string()),
        rack_id: request.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: request.rebalance_timeout_ms,
        subscribed_topic_names: request
            .subscribed_topic_names
            .map(|names| names.into_iter().map(|n| n.0.to_string()).collect()),
        // An empty regex (librdkafka sends one alongside topic names) clears the member's
        // regex, as in Kafka.
        subscribed_topic_regex: request.subscribed_topic_regex.map(|s| s.to_string()),
        server_assignor: request.server_assignor.map(|s| s.to_string()),
        owned,
        client_id: ctx.client_id.clone().unwrap_or_default(),
        client_host: client_host(ctx.peer),
        timeouts: broker
            .share
            .configs
            .cached_with(request.group_id.0.as_str(), GroupConfig::consumer_timeouts),
    };
    let member_id = req.member_id.clone();
    let epoch = req.member_epoch;
    let answer = until_shutdown(ctx, broker.groups.consumer_heartbeat(req)).await;
    let mut response = ConsumerGroupHeartbeatResponse::default();
    match expect(answer, |r| match r {
        Response::ConsumerHeartbeat(h) => Some(h),
        _ => None,
    }) {
        Ok(h) => {
            response.error_code = group_code(h.error);
            if let Some(error) = h.error {
                response.error_message = message(error.to_string());
            }
            response.member_id = h.member_id.map(StrBytes::from_string);
            response.member_epoch = h.member_epoch;
            response.heartbeat_interval_ms = h.heartbeat_interval_ms;
            response.assignment = h.assignment.map(|a| {
                let mut out = HeartbeatAssignment::default();
                out.topic_partitions = a
                    .into_iter()
                    .map(|(topic, partitions)| {
                        let mut t = HeartbeatTopicPartitions::default();
                        t.topic_id = uuid_of(strata_layout::TopicId(topic.0));
                        t.partitions = partitions.into_iter().collect();
                        t
                    })
                    .collect();
                out
            });
        }
        Err(error) => {
            response.error_code = group_code(Some(error));
            response.error_message = message(error.to_string());
            response.member_id = (!member_id.is_empty()).then(|| StrBytes::from_string(member_id));
            response.member_epoch = epoch;
        }
    }
    response
}

/// ConsumerGroupDescribe v0–v1: each group asked of its own shard.
pub(crate) async fn consumer_group_describe(
    broker: &Broker,
    request: ConsumerGroupDescribeRequest,
    ctx: &RequestContext,
) -> ConsumerGroupDescribeResponse {
    let mut response = ConsumerGroupDescribeResponse::default();
    let authz = broker.authz(ctx);
    for group_id in request.group_ids {
        let id = group_id.0.to_string();
        let mut out = DescribedGroup::default();
        out.group_id = GroupId(StrBytes::from_string(id.clone()));
        // Kafka reports "unknown operations" when the client did not ask for them.
        out.authorized_operations = i32::MIN;
        if !authz.allows(Op::Describe, Res::Group, &id) {
            out.error_code = code::GROUP_AUTHORIZATION_FAILED;
            response.groups.push(out);
            continue;
        }
        match broker.groups.consumer_describe(id).await {
            Ok(d) => {
                out.error_code = group_code(d.error);
                if let Some(error) = d.error {
                    out.error_message = message(error.to_string());
                }
                out.group_state = str_bytes(d.state.as_str());
                out.group_epoch = d.group_epoch;
                out.assignment_epoch = d.assignment_epoch;
                out.assignor_name = StrBytes::from_string(d.assignor_name);
                out.members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut member = Member::default();
                        member.member_id = StrBytes::from_string(m.member_id);
                        member.instance_id = m.instance_id.map(StrBytes::from_string);
                        member.rack_id = m.rack_id.map(StrBytes::from_string);
                        member.member_epoch = m.member_epoch;
                        member.client_id = StrBytes::from_string(m.client_id);
                        member.client_host = StrBytes::from_string(m.client_host);
                        member.subscribed_topic_names = m
                            .subscribed_topic_names
                            .into_iter()
                            .map(|n| TopicName(StrBytes::from_string(n)))
                            .collect();
                        member.subscribed_topic_regex =
                            m.subscribed_topic_regex.map(StrBytes::from_string);
                        member.assignment = describe_assignment(broker, m.assignment);
                        member.target_assignment = describe_assignment(broker, m.target_assignment);
                        // KIP-1099: 0 = a classic-protocol member (online migration), 1 = a
                        // consumer-protocol one.
                        member.member_type = if m.classic { 0 } else { 1 };
                        member
                    })
                    .collect();
            }
            Err(error) => {
                out.error_code = group_code(Some(error));
                out.error_message = message(error.to_string());
            }
        }
        response.groups.push(out);
    }
    response
}

fn describe_assignment(broker: &Broker, assignment: Assignment) -> DescribeAssignment {
    let mut out = DescribeAssignment::default();
    out.topic_partitions = assignment
        .into_iter()
        .map(|(topic, partitions)| {
            let id = strata_layout::TopicId(topic.0);
            let mut t = DescribeTopicPartitions::default();
            t.topic_id = uuid_of(id);
            t.topic_name = TopicName(StrBytes::from_string(
                broker
                    .log
                    .topic_by_id(id)
                    .map(|info| info.name.to_string())
                    .unwrap_or_default(),
            ));
            t.partitions = partitions.into_iter().collect();
            t
        })
        .collect();
    out
}
