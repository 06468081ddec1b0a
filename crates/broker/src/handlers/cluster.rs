//! DescribeCluster (v0–v1), the coordinator lookup of FindCoordinator, and partition
//! reassignments (AlterPartitionReassignments / ListPartitionReassignments v0).
//!
//! Alone on its storage, this broker is the cluster and its controller. In cluster mode the
//! brokers are the live members and the controller is the lowest live id (nothing in Strata
//! controls anything; clients only display it). A reassignment moves a partition's ownership:
//! its first replica becomes a placement override, which the owner hands over to; Strata keeps
//! one copy of the data in storage, so the other replicas of a request mean nothing here.
//!
//! ElectLeaders (v0–v2): a PREFERRED election moves a partition to its preferred replica (its
//! assignment's first broker, or without one where rendezvous hashing places it) the way a
//! reassignment does: a placement override, which the owner hands over to gracefully. Note that
//! a reassignment keeps the topic's assignment, so a later preferred election moves the
//! partition back to it. An UNCLEAN election is never needed: the data is in storage, so any
//! live broker can own any partition without losing a record, and a partition without a live
//! owner is claimed by one within the lease anyway.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
    BrokerId as WireBrokerId, DescribeClusterRequest, DescribeClusterResponse, ElectLeadersRequest,
    ElectLeadersResponse, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};
use strata_cluster::ClusterView;
use strata_core::{BrokerId, TopicPartition};
use strata_groups::GroupError;
use strata_log::TopicInfo;

use super::topic_name;
use crate::authorize::{Op, Res};
use crate::cluster::{parse_resource, resource_name};
use crate::coordinator::{shard_of, OFFSETS_TOPIC};
use crate::security::acl::CLUSTER_NAME;

use super::metadata::Leaders;
use super::{acl_op, str_bytes};
use crate::errors::{code, message};
use crate::server::Broker;
use crate::RequestContext;

/// DescribeCluster endpoint types (v1+).
const ENDPOINT_BROKERS: i8 = 1;
const ENDPOINT_CONTROLLERS: i8 = 2;

pub(crate) fn describe_cluster(
    broker: &Broker,
    request: DescribeClusterRequest,
    ctx: &RequestContext,
) -> DescribeClusterResponse {
    let v = ctx.api_version;
    let node_id = broker.settings.node_id.0;
    let mut response = DescribeClusterResponse::default();
    if v >= 1 {
        response.endpoint_type = request.endpoint_type;
        match request.endpoint_type {
            ENDPOINT_BROKERS => {}
            ENDPOINT_CONTROLLERS => {
                // Kafka brokers answer this way too: controllers are asked directly.
                response.error_code = code::MISMATCHED_ENDPOINT_TYPE;
                response.error_message = message("this endpoint serves brokers, not controllers");
                return response;
            }
            other => {
                response.error_code = code::UNSUPPORTED_ENDPOINT_TYPE;
                response.error_message = message(format!("unknown endpoint type {other}"));
                return response;
            }
        }
    }
    response.error_code = code::NONE;
    response.cluster_id = str_bytes(&broker.settings.cluster_id);
    let leaders = Leaders::of(broker);
    response.controller_id = WireBrokerId(leaders.controller(node_id));
    response.brokers = leaders
        .brokers(&ctx.listener)
        .into_iter()
        .map(|(id, host, port)| {
            let mut b = DescribeClusterBroker::default();
            b.broker_id = WireBrokerId(id);
            b.host = str_bytes(&host);
            b.port = i32::from(port);
            b
        })
        .collect();
    // Like Kafka, DescribeCluster itself needs no ACL; it only tells what the caller may do.
    if request.include_cluster_authorized_operations {
        response.cluster_authorized_operations =
            broker
                .authz(ctx)
                .operations(Res::Cluster, CLUSTER_NAME, acl_op::cluster_all());
    }
    response
}

/// A coordinator lookup's answer: the broker (id, host, port), or the error code and message.
pub(crate) type CoordinatorAnswer = Result<(i32, String, u16), (i16, String)>;

/// The broker hosting `group`'s coordinator shard: this one alone on its storage; in cluster
/// mode the live owner of the shard's `__consumer_offsets` partition.
/// This broker is given by the endpoint of the listener the client came in on.
pub(crate) fn group_coordinator(
    broker: &Broker,
    group: &str,
    ctx: &RequestContext,
) -> CoordinatorAnswer {
    let shard = shard_of(group, broker.groups.shard_count());
    let found = shard_owner(broker, OFFSETS_TOPIC, shard as i32, ctx)?;
    // Our log still serves the partition while we hand it over, but the shard is unloaded
    // first: naming ourselves would earn the client a NOT_COORDINATOR from us.
    if broker.cluster.is_some()
        && found.0 == broker.settings.node_id.0
        && broker.groups.shard_hosting(shard) == Err(GroupError::NotCoordinator)
    {
        return Err((
            code::COORDINATOR_NOT_AVAILABLE,
            "the coordinator shard is being handed over".to_string(),
        ));
    }
    Ok(found)
}

/// How long a group's FindCoordinator waits for the group's coordinator shard to have a live
/// owner before it answers COORDINATOR_NOT_AVAILABLE. A planned handover leaves a shard without
/// one for 0.1–1 s (released, not yet claimed), which Kafka, naming the partition leader
/// whenever there is one, practically never does. librdkafka's generic coordinator request
/// (TxnOffsetCommit, the admin group APIs) retries that answer only twice, 100–200 ms apart,
/// then waits for a broker connection to come up or go down, which in a healthy cluster never
/// happens: `send_offsets_to_transaction` hung past its own timeout after a group coordinator
/// was handed back to a restarted broker (docs/RELIABILITY.md, the transactions pipeline).
///
/// The owner named may still be loading the shard; it answers COORDINATOR_LOAD_IN_PROGRESS
/// meanwhile, which clients retry against it (`coordinator::Slot::Loading`). A takeover of a
/// dead owner can take longer than this (its lease): then the answer is
/// COORDINATOR_NOT_AVAILABLE as before, and the dead broker's connection going down is what
/// restarts librdkafka's lookup. Far below every client's request timeout (librdkafka's
/// socket.timeout.ms 60 s, Java's request.timeout.ms 30 s).
pub(crate) const GROUP_LOOKUP_WAIT: Duration = Duration::from_secs(3);

/// How often a waiting lookup looks at the cluster's ownership again.
const GROUP_LOOKUP_POLL: Duration = Duration::from_millis(20);

/// [`group_coordinator`] of each of `groups`, in order, once every one of their shards has a
/// live owner or [`GROUP_LOOKUP_WAIT`] has passed: at once alone on the storage, or when they
/// all have one. The answers returned are the ones the wait saw.
pub(crate) async fn group_coordinators_waiting(
    broker: &Broker,
    groups: &[&str],
    ctx: &RequestContext,
) -> Vec<CoordinatorAnswer> {
    let deadline = broker.clock.monotonic().saturating_add(GROUP_LOOKUP_WAIT);
    loop {
        let answers: Vec<_> = groups
            .iter()
            .map(|group| group_coordinator(broker, group, ctx))
            .collect();
        let unowned = answers
            .iter()
            .any(|a| matches!(a, Err((code::COORDINATOR_NOT_AVAILABLE, _))));
        if !unowned || broker.cluster.is_none() || broker.clock.monotonic() >= deadline {
            return answers;
        }
        broker.clock.sleep(GROUP_LOOKUP_POLL).await;
    }
}

/// The broker hosting the transaction coordinator shard of `transactional_id`: the owner of
/// its `__transaction_state` partition, found exactly as a group's.
pub(crate) fn txn_coordinator(
    broker: &Broker,
    transactional_id: &str,
    ctx: &RequestContext,
) -> CoordinatorAnswer {
    let shard = crate::txn_coordinator::shard_of(transactional_id, broker.txn.shard_count()) as i32;
    shard_owner(broker, crate::txn_coordinator::TXN_TOPIC, shard, ctx)
}

fn shard_owner(
    broker: &Broker,
    internal_topic: &str,
    shard: i32,
    ctx: &RequestContext,
) -> CoordinatorAnswer {
    let me = (
        broker.settings.node_id.0,
        ctx.listener.advertised_host.clone(),
        ctx.listener.advertised_port,
    );
    let Some(node) = broker.cluster.as_deref() else {
        return Ok(me);
    };
    let unavailable = |why: &str| (code::COORDINATOR_NOT_AVAILABLE, why.to_string());
    let topic = broker
        .log
        .topic(internal_topic)
        .ok_or_else(|| unavailable("the coordinator's internal topic does not exist yet"))?;
    let tp = TopicPartition::new(Arc::clone(&topic.name), shard);
    let view = node.view();
    let (leader, _) = node
        .leader_of(&view, &node.owners(), topic.id, &tp)
        .ok_or_else(|| unavailable("the coordinator shard is between owners"))?;
    let (host, port) = view
        .members
        .get(&leader)
        .map(|m| m.registration.endpoint(&ctx.listener.name))
        .map(|(h, p)| (h.to_string(), p))
        .ok_or_else(|| unavailable("the coordinator is not live"))?;
    if leader == broker.settings.node_id {
        return Ok(me);
    }
    Ok((leader.0, host, port))
}

pub(crate) async fn alter_partition_reassignments(
    broker: &Broker,
    request: AlterPartitionReassignmentsRequest,
    ctx: &RequestContext,
) -> AlterPartitionReassignmentsResponse {
    let mut response = AlterPartitionReassignmentsResponse::default();
    if !broker.authz(ctx).allows_cluster(Op::Alter) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        response.error_message = message("Cluster authorization failed.");
        return response;
    }
    response.error_code = code::NONE;
    let view = broker.cluster.as_deref().map(|n| n.view());
    for topic in request.topics {
        let info = broker.log.topic(topic.name.0.as_str());
        let mut out = ReassignableTopicResponse::default();
        out.name = topic.name;
        for p in topic.partitions {
            let mut r = ReassignablePartitionResponse::default();
            r.partition_index = p.partition_index;
            let outcome = match &info {
                Some(info) if (0..info.partitions).contains(&p.partition_index) => {
                    reassign(broker, view.as_ref(), info, p.partition_index, p.replicas).await
                }
                _ => Err((
                    code::UNKNOWN_TOPIC_OR_PARTITION,
                    "no such topic or partition".to_string(),
                )),
            };
            match outcome {
                Ok(()) => r.error_code = code::NONE,
                Err((error, text)) => {
                    r.error_code = error;
                    r.error_message = message(text);
                }
            }
            out.partitions.push(r);
        }
        response.responses.push(out);
    }
    response
}

async fn reassign(
    broker: &Broker,
    view: Option<&ClusterView>,
    info: &TopicInfo,
    partition: i32,
    replicas: Option<Vec<WireBrokerId>>,
) -> Result<(), (i16, String)> {
    let target = match replicas.as_deref() {
        None => None,
        Some([]) => {
            return Err((
                code::INVALID_REPLICA_ASSIGNMENT,
                "a reassignment needs at least one replica".to_string(),
            ))
        }
        Some([first, ..]) => Some(BrokerId(first.0)),
    };
    let (Some(node), Some(view)) = (broker.cluster.as_deref(), view) else {
        // Alone on its storage this broker holds everything: only itself is a valid target.
        return match target {
            None => Ok(()),
            Some(t) if t == broker.settings.node_id => Ok(()),
            Some(t) => Err((
                code::INVALID_REPLICA_ASSIGNMENT,
                format!("broker {t} does not exist: this broker is not in cluster mode"),
            )),
        };
    };
    if let Some(t) = target {
        if !view.is_live(t) || view.is_draining(t) {
            return Err((
                code::INVALID_REPLICA_ASSIGNMENT,
                format!("broker {t} is not a live, non-draining broker"),
            ));
        }
    }
    let resource = resource_name(info.id, partition);
    node.set_placement(&resource, target).await.map_err(|e| {
        (
            if e.is_retryable() {
                code::REQUEST_TIMED_OUT
            } else {
                code::UNKNOWN_SERVER_ERROR
            },
            e.to_string(),
        )
    })?;
    tracing::info!(
        topic = %info.name,
        partition,
        target = ?target.map(|t| t.0),
        "partition reassignment requested"
    );
    Ok(())
}

/// Kafka's ElectionType.
const ELECTION_PREFERRED: i8 = 0;
const ELECTION_UNCLEAN: i8 = 1;

pub(crate) async fn elect_leaders(
    broker: &Broker,
    request: ElectLeadersRequest,
    ctx: &RequestContext,
) -> ElectLeadersResponse {
    let mut response = ElectLeadersResponse::default();
    if !broker.authz(ctx).allows_cluster(Op::Alter) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        return response;
    }
    response.error_code = code::NONE;
    // v0 has no election type: it is always a preferred election.
    let election = if ctx.api_version == 0 {
        ELECTION_PREFERRED
    } else {
        request.election_type
    };
    if election != ELECTION_PREFERRED && election != ELECTION_UNCLEAN {
        response.error_code = code::INVALID_REQUEST;
        return response;
    }
    // Null names every partition; then, as Kafka does, only those an election moved (or
    // failed to) are answered.
    let all = request.topic_partitions.is_none();
    let wanted: Vec<(String, Vec<i32>)> = match request.topic_partitions {
        Some(topics) => topics
            .into_iter()
            .map(|t| (t.topic.0.to_string(), t.partitions))
            .collect(),
        None => broker
            .log
            .topics()
            .iter()
            .map(|t| (t.name.to_string(), (0..t.partitions).collect()))
            .collect(),
    };
    let view = broker.cluster.as_deref().map(|n| n.view());
    let leaders = Leaders::of(broker);
    let mut by_topic: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    // (topic, index of its result, the topic, partition, preferred broker) of each move.
    let mut moved = Vec::new();
    for (name, partitions) in wanted {
        let info = broker.log.topic(&name);
        for partition in partitions {
            let outcome = match &info {
                Some(info) if (0..info.partitions).contains(&partition) => {
                    elect(broker, view.as_ref(), &leaders, info, partition, election).await
                }
                _ => Err((
                    code::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("{name}-{partition} does not exist"),
                )),
            };
            if all && matches!(&outcome, Err((code::ELECTION_NOT_NEEDED, _))) {
                continue;
            }
            let results = by_topic.entry(name.clone()).or_default();
            let mut r = PartitionResult::default();
            r.partition_id = partition;
            match (outcome, &info) {
                (Ok(preferred), Some(info)) => {
                    r.error_code = code::NONE;
                    moved.push((
                        name.clone(),
                        results.len(),
                        Arc::clone(info),
                        partition,
                        preferred,
                    ));
                }
                (Ok(_), None) => r.error_code = code::NONE,
                (Err((error, text)), _) => {
                    r.error_code = error;
                    r.error_message = message(text);
                }
            }
            results.push(r);
        }
    }
    // As in Kafka, answered once the elected leaders lead (so an election asked again right
    // after is not needed), within the request's timeout.
    for (name, i, info, partition, preferred) in
        unmoved_after(broker, request.timeout_ms, moved).await
    {
        if let Some(r) = by_topic.get_mut(&name).and_then(|rs| rs.get_mut(i)) {
            r.error_code = code::REQUEST_TIMED_OUT;
            r.error_message = message(format!(
                "{}-{partition} is moving to broker {preferred}, which did not lead it within \
                 the request's {} ms",
                info.name, request.timeout_ms
            ));
        }
    }
    response.replica_election_results = by_topic
        .into_iter()
        .map(|(name, partition_result)| {
            let mut t = ReplicaElectionResult::default();
            t.topic = topic_name(&name);
            t.partition_result = partition_result;
            t
        })
        .collect();
    response
}

/// A move of each partition to its preferred broker whose leader is not yet that broker once
/// `timeout_ms` passed.
async fn unmoved_after(
    broker: &Broker,
    timeout_ms: i32,
    mut moving: Vec<(String, usize, Arc<TopicInfo>, i32, i32)>,
) -> Vec<(String, usize, Arc<TopicInfo>, i32, i32)> {
    let Some(node) = broker.cluster() else {
        return Vec::new();
    };
    let patience = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    let deadline = broker.clock.monotonic().saturating_add(patience);
    loop {
        let leaders = Leaders::of(broker);
        moving.retain(|(_, _, info, partition, preferred)| {
            leaders.leader(info, *partition).map(|(id, _)| id) != Some(*preferred)
        });
        if moving.is_empty() || broker.clock.monotonic() >= deadline {
            return moving;
        }
        broker.clock.sleep(super::LEADER_POLL).await;
        node.refresh_owners().await;
    }
}

/// The broker a partition is moved to, or why it is not.
async fn elect(
    broker: &Broker,
    view: Option<&ClusterView>,
    leaders: &Leaders<'_>,
    info: &TopicInfo,
    partition: i32,
    election: i8,
) -> Result<i32, (i16, String)> {
    let leader = leaders.leader(info, partition).map(|(id, _)| id);
    if election == ELECTION_UNCLEAN {
        return Err((
            code::ELECTION_NOT_NEEDED,
            "the data is in shared storage: any live broker can lead without losing records, \
             so there is never an unclean election to make"
                .to_string(),
        ));
    }
    let Some(preferred) = leaders.preferred(info, partition) else {
        return Err((
            code::PREFERRED_LEADER_NOT_AVAILABLE,
            "no live broker can lead the partition".to_string(),
        ));
    };
    if leader == Some(preferred) {
        return Err((
            code::ELECTION_NOT_NEEDED,
            format!("broker {preferred}, the preferred replica, already leads"),
        ));
    }
    let draining = view.is_some_and(|v| v.is_draining(BrokerId(preferred)));
    if !leaders.is_live(preferred) || draining {
        return Err((
            code::PREFERRED_LEADER_NOT_AVAILABLE,
            format!(
                "the preferred replica, broker {preferred}, is not a live, non-draining broker"
            ),
        ));
    }
    reassign(
        broker,
        view,
        info,
        partition,
        Some(vec![WireBrokerId(preferred)]),
    )
    .await
    .map(|()| preferred)
}

pub(crate) async fn list_partition_reassignments(
    broker: &Broker,
    request: ListPartitionReassignmentsRequest,
    ctx: &RequestContext,
) -> ListPartitionReassignmentsResponse {
    let mut response = ListPartitionReassignmentsResponse::default();
    if !broker.authz(ctx).allows_cluster(Op::Describe) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        response.error_message = message("Cluster authorization failed.");
        return response;
    }
    response.error_code = code::NONE;
    let Some(node) = broker.cluster.as_deref() else {
        return response;
    };
    let ongoing = match node.reassignments().await {
        Ok(ongoing) => ongoing,
        Err(e) => {
            response.error_code = code::REQUEST_TIMED_OUT;
            response.error_message = message(e.to_string());
            return response;
        }
    };
    // By topic name, in the order of partitions; a filter keeps only what was asked.
    let wanted: Option<BTreeMap<String, Vec<i32>>> = request.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let mut by_topic: BTreeMap<String, Vec<OngoingPartitionReassignment>> = BTreeMap::new();
    for (resource, target, owner) in ongoing {
        let Some((id, partition)) = parse_resource(&resource) else {
            continue;
        };
        let Some(info) = broker.log.topic_by_id(id) else {
            continue;
        };
        let name = info.name.to_string();
        if let Some(wanted) = &wanted {
            if !wanted.get(&name).is_some_and(|ps| ps.contains(&partition)) {
                continue;
            }
        }
        let mut p = OngoingPartitionReassignment::default();
        p.partition_index = partition;
        p.replicas = vec![WireBrokerId(target.0)];
        p.adding_replicas = vec![WireBrokerId(target.0)];
        p.removing_replicas = owner.map(|o| vec![WireBrokerId(o.0)]).unwrap_or_default();
        p.replicas.extend(p.removing_replicas.iter().copied());
        by_topic.entry(name).or_default().push(p);
    }
    response.topics = by_topic
        .into_iter()
        .map(|(name, partitions)| {
            let mut t = OngoingTopicReassignment::default();
            t.name = topic_name(&name);
            t.partitions = partitions;
            t
        })
        .collect();
    response
}
