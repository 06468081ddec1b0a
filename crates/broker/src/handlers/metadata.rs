//! Metadata (v0–v12). Alone on its storage, this broker is the whole cluster and leads every
//! partition. In cluster mode the brokers are the live members, the controller is the lowest
//! live id (Kafka clients only display it: there is no controller), and a partition's leader is
//! the live owner of its Active ownership record, at the record's epoch.

use std::sync::Arc;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId as WireBrokerId, MetadataRequest, MetadataResponse};
use strata_log::TopicInfo;

use super::LEADER_EPOCH;
use super::{
    acl_op, is_internal_topic, str_bytes, topic_id_of, topic_name, topics_or_auto_create, uuid_of,
};
use crate::authorize::{Authz, Op, Res};
use crate::cluster::ClusterNode;
use crate::errors::{code, lookup_error_code};
use crate::security::acl::CLUSTER_NAME;
use crate::server::Broker;
use crate::RequestContext;
use std::collections::{BTreeMap, BTreeSet};
use strata_cluster::{rendezvous_weight, ClusterView, OwnerRecord};
use strata_core::{BrokerId, TopicPartition};
use strata_layout::cluster::partition_resource;

use crate::security::Listener;

pub(crate) async fn handle(
    broker: &Broker,
    request: MetadataRequest,
    ctx: &RequestContext,
) -> MetadataResponse {
    let v = ctx.api_version;
    let node_id = broker.settings.node_id.0;
    let mut response = MetadataResponse::default();
    let authz = broker.authz(ctx);

    let leaders = Leaders::of(broker);
    response.brokers = leaders
        .listed_brokers(&ctx.listener)
        .into_iter()
        .map(|(id, host, port)| {
            let mut b = MetadataResponseBroker::default();
            b.node_id = WireBrokerId(id);
            b.host = str_bytes(&host);
            b.port = i32::from(port);
            b
        })
        .collect();
    if v >= 1 {
        response.controller_id = WireBrokerId(leaders.controller(node_id));
    }
    if v >= 2 {
        response.cluster_id = Some(str_bytes(&broker.settings.cluster_id));
    }
    if (8..=10).contains(&v) && request.include_cluster_authorized_operations {
        response.cluster_authorized_operations =
            authz.operations(Res::Cluster, CLUSTER_NAME, acl_op::cluster_all());
    }
    let with_topic_ops = v >= 8 && request.include_topic_authorized_operations;

    // v0: an empty list means every topic; v1+: null means every topic, empty means none.
    let requested = match request.topics {
        None => None,
        Some(topics) if topics.is_empty() && v == 0 => None,
        Some(topics) => Some(topics),
    };
    let Some(requested) = requested else {
        // Every topic means every topic the principal may describe: the others are not
        // mentioned at all, as in Kafka.
        response.topics = broker
            .log
            .topics()
            .iter()
            .filter(|info| authz.shows(Op::Describe, Res::Topic, &info.name))
            .map(|info| described_topic(info, &leaders, v, with_topic_ops, &authz))
            .collect();
        return response;
    };

    // Before v4 clients could not opt out: Kafka auto-creates for them when enabled.
    let allow_auto_create = v < 4 || request.allow_auto_topic_creation;
    let by_id = |wanted: &MetadataRequestTopic| v >= 10 && !wanted.topic_id.is_nil();
    // A topic the principal may not describe, or may not create when it would be created,
    // is TOPIC_AUTHORIZATION_FAILED, and never created.
    let refused: std::collections::HashSet<&str> = requested
        .iter()
        .filter(|w| !by_id(w))
        .map(name_of)
        .filter(|name| {
            !authz.allows(Op::Describe, Res::Topic, name)
                || (allow_auto_create
                    && broker.settings.auto_create_topics
                    && broker.log.topic(name).is_none()
                    && !authz.may_create_topic(name))
        })
        .collect();
    // Every topic of the request is resolved (and the unknown ones created) at once.
    let resolved = topics_or_auto_create(
        broker,
        requested
            .iter()
            .filter(|w| !by_id(w))
            .map(name_of)
            .filter(|name| !refused.contains(name)),
        allow_auto_create,
    )
    .await;
    let mut topics = Vec::with_capacity(requested.len());
    for wanted in &requested {
        let topic = if by_id(wanted) {
            match broker.log.topic_by_id(topic_id_of(&wanted.topic_id)) {
                Some(info) if !authz.allows(Op::Describe, Res::Topic, &info.name) => {
                    let mut t = MetadataResponseTopic::default();
                    t.error_code = code::TOPIC_AUTHORIZATION_FAILED;
                    t.topic_id = wanted.topic_id;
                    t.name = None;
                    t
                }
                Some(info) => described_topic(&info, &leaders, v, with_topic_ops, &authz),
                None => {
                    let mut t = MetadataResponseTopic::default();
                    t.error_code = code::UNKNOWN_TOPIC_ID;
                    t.topic_id = wanted.topic_id;
                    t.name = None;
                    t
                }
            }
        } else {
            let name = name_of(wanted);
            match resolved.get(name) {
                Some(Ok(info)) => described_topic(info, &leaders, v, with_topic_ops, &authz),
                outcome => {
                    let error = match outcome {
                        _ if refused.contains(name) => code::TOPIC_AUTHORIZATION_FAILED,
                        Some(Err(e)) => lookup_error_code(e),
                        _ => code::UNKNOWN_TOPIC_OR_PARTITION,
                    };
                    let mut t = MetadataResponseTopic::default();
                    t.error_code = error;
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

fn name_of(wanted: &MetadataRequestTopic) -> &str {
    wanted.name.as_ref().map(|n| n.0.as_str()).unwrap_or("")
}

fn described_topic(
    info: &Arc<TopicInfo>,
    leaders: &Leaders<'_>,
    v: i16,
    with_topic_ops: bool,
    authz: &Authz<'_>,
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
        topic.topic_authorized_operations =
            authz.operations(Res::Topic, &info.name, acl_op::topic_all());
    }
    topic.partitions = (0..info.partitions)
        .map(|index| {
            let state = leaders.partition(info, index);
            let mut p = MetadataResponsePartition::default();
            p.partition_index = index;
            p.error_code = state.error_code;
            p.leader_id = WireBrokerId(state.leader_id);
            if v >= 7 {
                p.leader_epoch = state.leader_epoch;
            }
            p.replica_nodes = state.replicas.iter().copied().map(WireBrokerId).collect();
            p.isr_nodes = state.isr.iter().copied().map(WireBrokerId).collect();
            p
        })
        .collect();
    topic
}

/// `brokers` heaviest first by the partition's rendezvous weight: the order placement would
/// pick them in, so a partition's reported replicas are stable and spread over the brokers.
fn rendezvous_order(info: &TopicInfo, partition: i32, mut brokers: Vec<i32>) -> Vec<i32> {
    let resource = partition_resource(info.id, partition);
    brokers.sort_by_key(|b| {
        (
            std::cmp::Reverse(rendezvous_weight(&resource, BrokerId(*b))),
            *b,
        )
    });
    brokers
}

/// One partition as Metadata and DescribeTopicPartitions report it: both build their entries
/// from [`Leaders::partition`], so the two answers never disagree on leader, epoch or replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionState {
    pub error_code: i16,
    /// -1 when no live broker holds the partition.
    pub leader_id: i32,
    /// -1 when there is no leader.
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// The cluster view and ownership records one answer is built from.
type Snapshot<'a> = (
    &'a ClusterNode,
    ClusterView,
    Arc<BTreeMap<String, OwnerRecord>>,
);

/// Who leads what, from one snapshot of the cluster view and ownership records, so one
/// answer is consistent with itself.
pub(crate) struct Leaders<'a> {
    node_id: i32,
    cluster: Option<Snapshot<'a>>,
    /// [`Self::live_ids`], worked out once: every partition's replicas are drawn from it.
    live: Vec<i32>,
}

impl<'a> Leaders<'a> {
    pub(crate) fn of(broker: &'a Broker) -> Self {
        let node_id = broker.settings.node_id.0;
        let cluster = broker
            .cluster
            .as_deref()
            .map(|node| (node, node.view(), node.owners()));
        let live = match &cluster {
            None => vec![node_id],
            Some((_, view, _)) => {
                let mut ids: Vec<i32> = view.members.keys().map(|id| id.0).collect();
                if !ids.contains(&node_id) {
                    ids.push(node_id);
                    ids.sort_unstable();
                }
                ids
            }
        };
        Self {
            node_id,
            cluster,
            live,
        }
    }

    /// Every broker clients may connect to: id, host, port.
    ///
    /// The answering broker is always among them. Our own registration drops out of our view
    /// when our heartbeats stop landing (a full or unreachable storage), yet we still name
    /// ourselves leader of what we keep readable; a leader missing from the broker list is
    /// "no leader" to clients, and librdkafka then holds produces until they time out instead
    /// of getting the retriable storage error we answer with.
    ///
    /// This broker is given by the endpoint of `listener`, the one the client came in on.
    /// Other brokers by the endpoint they registered for a listener of the same name (their
    /// first listener's address if they have none of that name).
    pub(crate) fn brokers(&self, listener: &Listener) -> Vec<(i32, String, u16)> {
        let me = (
            self.node_id,
            listener.advertised_host.clone(),
            listener.advertised_port,
        );
        match &self.cluster {
            None => vec![me],
            Some((_, view, _)) => {
                let mut brokers: Vec<_> = view
                    .members
                    .iter()
                    .map(|(id, m)| {
                        let (host, port) = m.registration.endpoint(&listener.name);
                        (id.0, host.to_string(), port)
                    })
                    .collect();
                if !brokers.iter().any(|(id, _, _)| *id == self.node_id) {
                    brokers.push(me);
                    brokers.sort_by_key(|(id, _, _)| *id);
                }
                brokers
            }
        }
    }

    /// What Metadata lists: [`Self::brokers`], and the brokers that left the cluster within
    /// `departed_broker_listing` (see [`crate::ClusterSettings::departed_broker_listing`]), at
    /// their last endpoints. A departed broker leads nothing and coordinates nothing: it is
    /// listed only so that clients keep their broker object for it.
    pub(crate) fn listed_brokers(&self, listener: &Listener) -> Vec<(i32, String, u16)> {
        let mut brokers = self.brokers(listener);
        let Some((_, view, _)) = &self.cluster else {
            return brokers;
        };
        let listed: BTreeSet<i32> = brokers.iter().map(|(id, _, _)| *id).collect();
        for (id, departed) in &view.departed {
            if listed.contains(&id.0) {
                continue;
            }
            let (host, port) = departed.registration.endpoint(&listener.name);
            brokers.push((id.0, host.to_string(), port));
        }
        brokers.sort_by_key(|(id, _, _)| *id);
        brokers
    }

    /// The ids of [`Self::brokers`].
    pub(crate) fn live_ids(&self) -> Vec<i32> {
        self.live.clone()
    }

    /// The replicas (and ISR: they are the same) reported for a partition led by `leader`:
    /// the leader first, then the topic's explicit assignment in its order, or without one
    /// the live brokers in the partition's rendezvous order (stable while membership is),
    /// up to the replication factor. Only live brokers are listed: the storage holds the one
    /// copy of the data, any live broker can serve it at once, so there is no
    /// under-replicated or offline replica to report, only fewer replicas while fewer brokers
    /// are live. Metadata and DescribeTopicPartitions both answer from this.
    pub(crate) fn replicas(&self, info: &TopicInfo, partition: i32, leader: i32) -> Vec<i32> {
        let assigned = info.assignments.get(&partition);
        let factor = match assigned {
            Some(brokers) => brokers.len(),
            None => usize::try_from(info.replication_factor.unwrap_or(1)).unwrap_or(1),
        }
        .max(1);
        if factor == 1 {
            // The leader alone: no order of the others to work out (a hash per live broker,
            // per partition, per Metadata answer).
            return vec![leader];
        }
        let others: Vec<i32> = match assigned {
            Some(brokers) => brokers
                .iter()
                .copied()
                .filter(|b| self.live.contains(b))
                .collect(),
            None => rendezvous_order(info, partition, self.live.clone()),
        };
        let mut replicas = vec![leader];
        replicas.extend(others.into_iter().filter(|b| *b != leader));
        replicas.truncate(factor);
        replicas
    }

    /// The broker a partition prefers: its assignment's first replica, or without one the
    /// live, non-draining broker rendezvous hashing places it on. None without a candidate.
    pub(crate) fn preferred(&self, info: &TopicInfo, partition: i32) -> Option<i32> {
        if let Some(first) = info.assignments.get(&partition).and_then(|a| a.first()) {
            return Some(*first);
        }
        let candidates: Vec<i32> = match &self.cluster {
            None => vec![self.node_id],
            Some((_, view, _)) => view
                .members
                .keys()
                .filter(|id| !view.is_draining(**id))
                .map(|id| id.0)
                .collect(),
        };
        rendezvous_order(info, partition, candidates)
            .first()
            .copied()
    }

    /// Whether `broker` is live (this broker always is, to itself).
    pub(crate) fn is_live(&self, broker: i32) -> bool {
        self.live.contains(&broker)
    }

    /// The lowest live id (ourselves while the view is still empty).
    pub(crate) fn controller(&self, fallback: i32) -> i32 {
        match &self.cluster {
            None => self.node_id,
            Some((_, view, _)) => view
                .members
                .keys()
                .next()
                .map(|id| id.0)
                .unwrap_or(fallback),
        }
    }

    /// A partition's leader, epoch and replicas as clients are told them.
    pub(crate) fn partition(&self, info: &TopicInfo, index: i32) -> PartitionState {
        match self.leader(info, index) {
            Some((leader, epoch)) => {
                // Every replica is in sync: the storage, not the brokers, holds the data.
                let replicas = self.replicas(info, index, leader);
                PartitionState {
                    error_code: code::NONE,
                    leader_id: leader,
                    leader_epoch: epoch,
                    isr: replicas.clone(),
                    replicas,
                }
            }
            // Between owners (a handover, or a dead owner whose lease has not run out):
            // retriable, so clients refresh metadata until a new owner serves.
            None => PartitionState {
                error_code: code::LEADER_NOT_AVAILABLE,
                leader_id: -1,
                leader_epoch: -1,
                replicas: Vec::new(),
                isr: Vec::new(),
            },
        }
    }

    /// The leader of a partition and its epoch; None when no live broker holds it.
    pub(crate) fn leader(&self, info: &TopicInfo, partition: i32) -> Option<(i32, i32)> {
        match &self.cluster {
            None => Some((self.node_id, LEADER_EPOCH)),
            Some((node, view, owners)) => {
                let tp = TopicPartition::new(Arc::clone(&info.name), partition);
                node.leader_of(view, owners, info.id, &tp)
                    .map(|(id, epoch)| (id.0, i32::try_from(epoch.0).unwrap_or(i32::MAX)))
            }
        }
    }
}
