//! Metadata (v0–v12): this broker is the whole cluster and leads every partition.

use std::sync::Arc;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId as WireBrokerId, MetadataRequest, MetadataResponse};
use strata_log::TopicInfo;

use super::LEADER_EPOCH;
use super::{
    acl_op, is_internal_topic, str_bytes, topic_id_of, topic_name, topic_or_auto_create, uuid_of,
};
use crate::errors::{code, error_code};
use crate::server::Broker;
use crate::RequestContext;

pub(crate) async fn handle(
    broker: &Broker,
    request: MetadataRequest,
    ctx: &RequestContext,
) -> MetadataResponse {
    let v = ctx.api_version;
    let node_id = broker.settings.node_id.0;
    let mut response = MetadataResponse::default();

    let mut me = MetadataResponseBroker::default();
    me.node_id = WireBrokerId(node_id);
    me.host = str_bytes(&broker.settings.advertised_host);
    me.port = i32::from(broker.settings.advertised_port);
    response.brokers = vec![me];
    if v >= 1 {
        response.controller_id = WireBrokerId(node_id);
    }
    if v >= 2 {
        response.cluster_id = Some(str_bytes(&broker.settings.cluster_id));
    }
    if (8..=10).contains(&v) && request.include_cluster_authorized_operations {
        response.cluster_authorized_operations = acl_op::cluster_all();
    }
    let with_topic_ops = v >= 8 && request.include_topic_authorized_operations;

    // v0: an empty list means every topic; v1+: null means every topic, empty means none.
    let requested = match request.topics {
        None => None,
        Some(topics) if topics.is_empty() && v == 0 => None,
        Some(topics) => Some(topics),
    };
    let Some(requested) = requested else {
        response.topics = broker
            .log
            .topics()
            .iter()
            .map(|info| described_topic(info, node_id, v, with_topic_ops))
            .collect();
        return response;
    };

    // Before v4 clients could not opt out: Kafka auto-creates for them when enabled.
    let allow_auto_create = v < 4 || request.allow_auto_topic_creation;
    let mut topics = Vec::with_capacity(requested.len());
    for wanted in requested {
        let by_id = v >= 10 && !wanted.topic_id.is_nil();
        let topic = if by_id {
            match broker.log.topic_by_id(topic_id_of(&wanted.topic_id)) {
                Some(info) => described_topic(&info, node_id, v, with_topic_ops),
                None => {
                    let mut t = MetadataResponseTopic::default();
                    t.error_code = code::UNKNOWN_TOPIC_ID;
                    t.topic_id = wanted.topic_id;
                    t.name = None;
                    t
                }
            }
        } else {
            let name = wanted.name.as_ref().map(|n| n.0.as_str()).unwrap_or("");
            match topic_or_auto_create(broker, name, allow_auto_create).await {
                Ok(info) => described_topic(&info, node_id, v, with_topic_ops),
                Err(e) => {
                    let mut t = MetadataResponseTopic::default();
                    t.error_code = error_code(&e);
                    t.name = Some(topic_name(name));
                    t
                }
            }
        };
        topics.push(topic);
    }
    response.topics = topics;
    response
}

fn described_topic(
    info: &Arc<TopicInfo>,
    node_id: i32,
    v: i16,
    with_topic_ops: bool,
) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    topic.error_code = code::NONE;
    topic.name = Some(topic_name(&info.name));
    if v >= 1 {
        topic.is_internal = is_internal_topic(&info.name);
    }
    if v >= 10 {
        topic.topic_id = uuid_of(info.id);
    }
    if with_topic_ops {
        topic.topic_authorized_operations = acl_op::topic_all();
    }
    topic.partitions = (0..info.partitions)
        .map(|index| {
            let mut p = MetadataResponsePartition::default();
            p.error_code = code::NONE;
            p.partition_index = index;
            p.leader_id = WireBrokerId(node_id);
            if v >= 7 {
                p.leader_epoch = LEADER_EPOCH;
            }
            p.replica_nodes = vec![WireBrokerId(node_id)];
            p.isr_nodes = vec![WireBrokerId(node_id)];
            p
        })
        .collect();
    topic
}
