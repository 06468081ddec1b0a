//! Consumer groups (Kafka's classic protocol): FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups, DeleteGroups
//! and OffsetDelete.
//!
//! Every decision is the group coordinator's ([`crate::coordinator`] running the sans-IO
//! `strata-groups` state machine). This module only converts: wire requests into domain
//! requests, and domain answers into wire responses shaped for the request's version (fields a
//! version does not carry are left at their defaults, because `kafka-protocol` refuses to
//! encode them otherwise). The one thing decided here is what Kafka decides in its request
//! layer rather than in its coordinator: partitions of unknown topics are answered
//! UNKNOWN_TOPIC_OR_PARTITION on OffsetCommit and OffsetDelete without reaching the
//! coordinator, as Kafka's `KafkaApis` does.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::future::join_all;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup as WireListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    BrokerId as WireBrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use strata_core::{Offset, TopicPartition};
use strata_groups::{self as groups, GroupError, GroupState, Response};
use tracing::{debug, error};

use super::{acl_op, str_bytes, topic_name};
use crate::authorize::{Op, Res};
use crate::errors::{code, group_code, group_error_code, message};
use crate::server::Broker;
use crate::RequestContext;

/// FindCoordinator key types.
mod key_type {
    pub const GROUP: i8 = 0;
    pub const TRANSACTION: i8 = 1;
    pub const SHARE: i8 = 2;
}

// ----- FindCoordinator -----

/// What a transactional producer is told by a broker that could not send transaction markers
/// to other brokers (see `txn_markers.rs`).
pub(crate) const TRANSACTIONS_NEED_PLAINTEXT: &str = "transactions need an inter-broker \
    listener (PLAINTEXT, or SASL_PLAINTEXT with inter_broker_sasl_mechanism): Strata brokers \
    send each other transaction markers on it";

/// FindCoordinator v0–v6. Every group is coordinated by this broker: it hosts every shard of
/// `__consumer_offsets`. Any group id is accepted, the empty one included, as Kafka does (the
/// group APIs themselves refuse an empty id where it is invalid). In cluster mode a group's
/// lookup first waits a little while its coordinator shard is between owners
/// (`cluster::GROUP_LOOKUP_WAIT`).
pub(crate) async fn find_coordinator(
    broker: &Broker,
    request: FindCoordinatorRequest,
    ctx: &RequestContext,
) -> FindCoordinatorResponse {
    let v = ctx.api_version;
    let kind = if v >= 1 {
        request.key_type
    } else {
        key_type::GROUP
    };
    let found = coordinator_for(kind);
    let authz = broker.authz(ctx);
    // A group's answer is taken once, after the wait: looking again afterwards could catch
    // the shard between owners a moment later and answer COORDINATOR_NOT_AVAILABLE after all.
    let waited: HashMap<String, super::cluster::CoordinatorAnswer> = if kind == key_type::GROUP {
        let keys: Vec<&str> = if v >= 4 {
            request
                .coordinator_keys
                .iter()
                .map(|k| k.as_str())
                .collect()
        } else {
            vec![request.key.as_str()]
        };
        let keys: Vec<&str> = keys
            .into_iter()
            .filter(|key| authz.allows(Op::Describe, Res::Group, key))
            .collect();
        let answers = super::cluster::group_coordinators_waiting(broker, &keys, ctx).await;
        keys.into_iter().map(str::to_string).zip(answers).collect()
    } else {
        HashMap::new()
    };
    // DESCRIBE on the group (or transactional id): without it the coordinator's address is
    // not given out.
    let described = |key: &str| {
        if kind == key_type::TRANSACTION {
            return if authz.allows(Op::Describe, Res::TransactionalId, key) {
                Ok(())
            } else {
                Err((
                    code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    "Transactional Id authorization failed.".to_string(),
                ))
            };
        }
        if authz.allows(Op::Describe, Res::Group, key) {
            Ok(())
        } else {
            Err((
                code::GROUP_AUTHORIZATION_FAILED,
                "Group authorization failed.".to_string(),
            ))
        }
    };
    let locate = |key: &str| {
        if kind == key_type::TRANSACTION {
            if !broker.txn.can_write_markers() {
                // Fatal at once for both librdkafka and the Java producer, with our message.
                return Err((
                    code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    TRANSACTIONS_NEED_PLAINTEXT.to_string(),
                ));
            }
            super::cluster::txn_coordinator(broker, key, ctx)
        } else {
            match waited.get(key) {
                Some(answer) => answer.clone(),
                None => super::cluster::group_coordinator(broker, key, ctx),
            }
        }
    };
    let mut response = FindCoordinatorResponse::default();
    if v >= 4 {
        response.coordinators = request
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let mut c = Coordinator::default();
                let found = found
                    .clone()
                    .and_then(|()| described(key.as_str()))
                    .and_then(|()| locate(key.as_str()));
                c.key = key;
                match &found {
                    Ok((id, host, port)) => {
                        c.node_id = WireBrokerId(*id);
                        c.host = str_bytes(host);
                        c.port = i32::from(*port);
                    }
                    Err((error, text)) => {
                        c.node_id = WireBrokerId(-1);
                        c.port = -1;
                        c.error_code = *error;
                        c.error_message = message(text.clone());
                    }
                }
                c
            })
            .collect();
        return response;
    }
    let found = found
        .and_then(|()| described(request.key.as_str()))
        .and_then(|()| locate(request.key.as_str()));
    match found {
        Ok((id, host, port)) => {
            response.node_id = WireBrokerId(id);
            response.host = str_bytes(&host);
            response.port = i32::from(port);
        }
        Err((error, text)) => {
            // Kafka's "no node": id -1, empty host, port -1.
            response.node_id = WireBrokerId(-1);
            response.port = -1;
            response.error_code = error;
            if v >= 1 {
                response.error_message = message(text);
            }
        }
    }
    response
}

fn coordinator_for(kind: i8) -> Result<(), (i16, String)> {
    match kind {
        key_type::GROUP | key_type::TRANSACTION => Ok(()),
        key_type::SHARE => Err((
            code::INVALID_REQUEST,
            "share groups are not supported".to_string(),
        )),
        // Kafka's CoordinatorType.forId throws InvalidRequestException for unknown types.
        other => Err((
            code::INVALID_REQUEST,
            format!("unknown coordinator key type {other}"),
        )),
    }
}

// ----- JoinGroup / SyncGroup / Heartbeat / LeaveGroup -----

/// JoinGroup v0–v9. The answer usually waits for the rebalance to complete.
pub(crate) async fn join_group(
    broker: &Broker,
    request: JoinGroupRequest,
    ctx: &RequestContext,
) -> JoinGroupResponse {
    let v = ctx.api_version;
    let member_id = request.member_id.to_string();
    if !broker
        .authz(ctx)
        .allows(Op::Read, Res::Group, request.group_id.0.as_str())
    {
        let mut r = join_response(
            groups::JoinResponse {
                error: None,
                generation_id: -1,
                protocol_type: None,
                protocol_name: None,
                leader: String::new(),
                skip_assignment: false,
                member_id,
                members: Vec::new(),
            },
            v,
        );
        r.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return r;
    }
    if super::share_groups::is_share_group(broker, request.group_id.0.as_str()) {
        // Kafka: a classic join to a group of another type.
        let mut r = join_response(
            groups::JoinResponse {
                error: Some(GroupError::InconsistentGroupProtocol),
                generation_id: -1,
                protocol_type: None,
                protocol_name: None,
                leader: String::new(),
                skip_assignment: false,
                member_id,
                members: Vec::new(),
            },
            v,
        );
        r.error_code = code::INCONSISTENT_GROUP_PROTOCOL;
        return r;
    }
    let join = groups::JoinRequest {
        api_version: v,
        group_id: request.group_id.0.to_string(),
        member_id: member_id.clone(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
        client_id: ctx.client_id.clone().unwrap_or_default(),
        client_host: client_host(ctx.peer),
        session_timeout_ms: request.session_timeout_ms,
        // v0 has no rebalance timeout; Kafka uses the session timeout in its place.
        rebalance_timeout_ms: if v >= 1 {
            request.rebalance_timeout_ms
        } else {
            request.session_timeout_ms
        },
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|p| groups::Protocol::new(p.name.to_string(), p.metadata))
            .collect(),
        reason: request.reason.map(|s| s.to_string()),
    };
    let answer = until_shutdown(ctx, broker.groups.join(join)).await;
    let joined = match expect(answer, |r| match r {
        Response::Join(j) => Some(j),
        _ => None,
    }) {
        Ok(joined) => joined,
        Err(error) => groups::JoinResponse {
            error: Some(error),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            skip_assignment: false,
            member_id,
            members: Vec::new(),
        },
    };
    join_response(joined, v)
}

fn join_response(joined: groups::JoinResponse, v: i16) -> JoinGroupResponse {
    let mut r = JoinGroupResponse::default();
    r.error_code = group_code(joined.error);
    r.generation_id = joined.generation_id;
    if v >= 7 {
        r.protocol_type = joined.protocol_type.map(StrBytes::from_string);
        r.protocol_name = joined.protocol_name.map(StrBytes::from_string);
    } else {
        // Not nullable before v7: Kafka sends the empty string.
        r.protocol_name = Some(StrBytes::from_string(
            joined.protocol_name.unwrap_or_default(),
        ));
    }
    r.leader = StrBytes::from_string(joined.leader);
    if v >= 9 {
        r.skip_assignment = joined.skip_assignment;
    }
    r.member_id = StrBytes::from_string(joined.member_id);
    r.members = joined
        .members
        .into_iter()
        .map(|m| {
            let mut member = JoinGroupResponseMember::default();
            member.member_id = StrBytes::from_string(m.member_id);
            if v >= 5 {
                member.group_instance_id = m.group_instance_id.map(StrBytes::from_string);
            }
            member.metadata = m.metadata;
            member
        })
        .collect();
    r
}

/// SyncGroup v0–v5. Followers' answers wait for the leader's assignment.
pub(crate) async fn sync_group(
    broker: &Broker,
    request: SyncGroupRequest,
    ctx: &RequestContext,
) -> SyncGroupResponse {
    let v = ctx.api_version;
    if !broker
        .authz(ctx)
        .allows(Op::Read, Res::Group, request.group_id.0.as_str())
    {
        let mut r = SyncGroupResponse::default();
        r.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return r;
    }
    let sync = groups::SyncRequest {
        group_id: request.group_id.0.to_string(),
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
        protocol_type: request.protocol_type.map(|s| s.to_string()),
        protocol_name: request.protocol_name.map(|s| s.to_string()),
        assignments: request
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    let answer = until_shutdown(ctx, broker.groups.sync(sync)).await;
    let synced = expect(answer, |r| match r {
        Response::Sync(s) => Some(s),
        _ => None,
    })
    .unwrap_or_else(|error| groups::SyncResponse {
        error: Some(error),
        protocol_type: None,
        protocol_name: None,
        assignment: Default::default(),
    });
    let mut r = SyncGroupResponse::default();
    r.error_code = group_code(synced.error);
    if v >= 5 {
        r.protocol_type = synced.protocol_type.map(StrBytes::from_string);
        r.protocol_name = synced.protocol_name.map(StrBytes::from_string);
    }
    r.assignment = synced.assignment;
    r
}

/// Heartbeat v0–v4.
pub(crate) async fn heartbeat(
    broker: &Broker,
    request: HeartbeatRequest,
    ctx: &RequestContext,
) -> HeartbeatResponse {
    if !broker
        .authz(ctx)
        .allows(Op::Read, Res::Group, request.group_id.0.as_str())
    {
        let mut r = HeartbeatResponse::default();
        r.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return r;
    }
    let beat = groups::HeartbeatRequest {
        group_id: request.group_id.0.to_string(),
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
    };
    let error = match expect(broker.groups.heartbeat(beat).await, |r| match r {
        Response::Heartbeat(h) => Some(h),
        _ => None,
    }) {
        Ok(answer) => answer.error,
        Err(error) => Some(error),
    };
    let mut r = HeartbeatResponse::default();
    r.error_code = group_code(error);
    r
}

/// LeaveGroup v0–v5: one member (v0–v2) or a batch of members (v3+, by member id or, for
/// administrators removing static members, by group instance id).
pub(crate) async fn leave_group(
    broker: &Broker,
    request: LeaveGroupRequest,
    ctx: &RequestContext,
) -> LeaveGroupResponse {
    let v = ctx.api_version;
    if !broker
        .authz(ctx)
        .allows(Op::Read, Res::Group, request.group_id.0.as_str())
    {
        let mut r = LeaveGroupResponse::default();
        r.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return r;
    }
    let members = if v >= 3 {
        request
            .members
            .into_iter()
            .map(|m| groups::LeavingMember {
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.map(|s| s.to_string()),
                reason: m.reason.map(|s| s.to_string()),
            })
            .collect()
    } else {
        vec![groups::LeavingMember {
            member_id: request.member_id.to_string(),
            group_instance_id: None,
            reason: None,
        }]
    };
    let leave = groups::LeaveRequest {
        group_id: request.group_id.0.to_string(),
        members,
    };
    let left = expect(broker.groups.leave(leave).await, |r| match r {
        Response::Leave(l) => Some(l),
        _ => None,
    })
    .unwrap_or_else(|error| groups::LeaveResponse {
        error: Some(error),
        members: Vec::new(),
    });
    let mut r = LeaveGroupResponse::default();
    if v >= 3 {
        r.error_code = group_code(left.error);
        r.members = left
            .members
            .into_iter()
            .map(|m| {
                let mut member = MemberResponse::default();
                member.member_id = StrBytes::from_string(m.member_id);
                member.group_instance_id = m.group_instance_id.map(StrBytes::from_string);
                member.error_code = group_code(m.error);
                member
            })
            .collect();
    } else {
        // Kafka's LeaveGroupResponse for v0–v2: the top-level error, else the first member's.
        let error = left
            .error
            .or_else(|| left.members.iter().find_map(|m| m.error));
        r.error_code = group_code(error);
    }
    r
}

// ----- OffsetCommit / OffsetFetch / OffsetDelete -----

/// OffsetCommit v2–v9. `retention_time_ms` (v2–v4) is ignored, as Kafka ignores it since 2.1:
/// committed offsets live as long as their group.
pub(crate) async fn offset_commit(
    broker: &Broker,
    request: OffsetCommitRequest,
    ctx: &RequestContext,
) -> OffsetCommitResponse {
    let v = ctx.api_version;
    let authz = broker.authz(ctx);
    // READ on the group, then READ on each topic (Kafka's order).
    let group_allowed = authz.allows(Op::Read, Res::Group, request.group_id.0.as_str());
    let topic_refused: std::collections::HashSet<String> = request
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .filter(|name| group_allowed && !authz.allows(Op::Read, Res::Topic, name))
        .collect();
    let mut accepted = Vec::new();
    for topic in &request.topics {
        if !group_allowed || topic_refused.contains(topic.name.0.as_str()) {
            continue;
        }
        let info = broker.log.topic(topic.name.0.as_str());
        for p in &topic.partitions {
            let Some(info) = info.as_ref().filter(|i| p.partition_index < i.partitions) else {
                continue;
            };
            if p.partition_index < 0 {
                continue;
            }
            accepted.push(groups::CommitPartition {
                partition: TopicPartition::new(Arc::clone(&info.name), p.partition_index),
                offset: Offset(p.committed_offset),
                leader_epoch: (v >= 6 && p.committed_leader_epoch >= 0)
                    .then_some(p.committed_leader_epoch),
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            });
        }
    }
    let mut results: HashMap<TopicPartition, Option<GroupError>> = HashMap::new();
    if !accepted.is_empty() {
        let keys: Vec<TopicPartition> = accepted.iter().map(|p| p.partition.clone()).collect();
        let commit = groups::OffsetCommitRequest {
            group_id: request.group_id.0.to_string(),
            generation_id: request.generation_id_or_member_epoch,
            member_id: request.member_id.to_string(),
            group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
            commit_timestamp_ms: broker.clock.wall_millis(),
            partitions: accepted,
        };
        match expect(broker.groups.offset_commit(commit).await, |r| match r {
            Response::OffsetCommit(c) => Some(c),
            _ => None,
        }) {
            Ok(committed) => results.extend(committed.partitions),
            Err(error) => results.extend(keys.into_iter().map(|k| (k, Some(error)))),
        }
    }
    let mut response = OffsetCommitResponse::default();
    response.topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name: Arc<str> = Arc::from(topic.name.0.as_str());
            let mut t = OffsetCommitResponseTopic::default();
            t.partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let mut out = OffsetCommitResponsePartition::default();
                    out.partition_index = p.partition_index;
                    let key = TopicPartition::new(Arc::clone(&name), p.partition_index);
                    out.error_code = if !group_allowed {
                        code::GROUP_AUTHORIZATION_FAILED
                    } else if topic_refused.contains(topic.name.0.as_str()) {
                        code::TOPIC_AUTHORIZATION_FAILED
                    } else {
                        match results.get(&key) {
                            Some(error) => group_code(*error),
                            None => code::UNKNOWN_TOPIC_OR_PARTITION,
                        }
                    };
                    out
                })
                .collect();
            t.name = topic.name;
            t
        })
        .collect();
    response
}

/// OffsetFetch v1–v9: one group (v1–v7) or a batch of groups (v8+). A group that does not
/// exist answers -1 for every requested partition and no error, as Kafka does; v9's member id
/// and epoch belong to KIP-848 groups and are not checked for classic ones (nor by Kafka).
pub(crate) async fn offset_fetch(
    broker: &Broker,
    request: OffsetFetchRequest,
    ctx: &RequestContext,
) -> OffsetFetchResponse {
    let v = ctx.api_version;
    let require_stable = v >= 7 && request.require_stable;
    let mut response = OffsetFetchResponse::default();
    let authz = &broker.authz(ctx);
    // DESCRIBE on the group; DESCRIBE on each topic, named (TOPIC_AUTHORIZATION_FAILED) or
    // not (left out of "every committed partition").
    let topic_refused = |name: &TopicName| !authz.allows(Op::Describe, Res::Topic, name.0.as_str());
    if v >= 8 {
        let fetches = request.groups.into_iter().map(|group| async move {
            if !authz.allows(Op::Describe, Res::Group, group.group_id.0.as_str()) {
                let mut g = OffsetFetchResponseGroup::default();
                g.group_id = group.group_id;
                g.error_code = code::GROUP_AUTHORIZATION_FAILED;
                return g;
            }
            let every = group.topics.is_none();
            // v9+ (KIP-848): the member asking, checked against consumer groups.
            let member = group
                .member_id
                .as_ref()
                .filter(|_| v >= 9)
                .map(|id| (id.to_string(), group.member_epoch));
            let wanted = group.topics.map(|topics| {
                topics
                    .into_iter()
                    .map(|t| (t.name, t.partition_indexes))
                    .collect::<Vec<_>>()
            });
            let (error, topics) =
                fetch_group(broker, &group.group_id, wanted, require_stable, member).await;
            let mut g = OffsetFetchResponseGroup::default();
            g.group_id = group.group_id;
            g.error_code = group_code(error);
            g.topics = topics
                .into_iter()
                .filter(|(name, _)| !(every && topic_refused(name)))
                .map(|(name, partitions)| {
                    let refused = topic_refused(&name);
                    let mut t = OffsetFetchResponseTopics::default();
                    t.name = name;
                    t.partitions = partitions
                        .into_iter()
                        .map(|p| {
                            let mut out = OffsetFetchResponsePartitions::default();
                            out.partition_index = p.partition.partition;
                            if refused {
                                out.committed_offset = -1;
                                out.committed_leader_epoch = -1;
                                out.error_code = code::TOPIC_AUTHORIZATION_FAILED;
                                return out;
                            }
                            out.committed_offset = p.offset.get();
                            out.committed_leader_epoch = p.leader_epoch.unwrap_or(-1);
                            out.metadata = Some(StrBytes::from_string(p.metadata));
                            out.error_code = group_code(p.error);
                            out
                        })
                        .collect();
                    t
                })
                .collect();
            g
        });
        response.groups = join_all(fetches).await;
        return response;
    }

    if !authz.allows(Op::Describe, Res::Group, request.group_id.0.as_str()) {
        response.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return response;
    }
    let every = request.topics.is_none();
    let wanted = request.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect::<Vec<_>>()
    });
    let (error, mut topics) = fetch_group(
        broker,
        &request.group_id,
        wanted.clone(),
        require_stable,
        None,
    )
    .await;
    if v < 2 {
        if let (Some(error), Some(wanted)) = (error, wanted) {
            // v1 has no top-level error: Kafka repeats it on every requested partition.
            topics = wanted
                .into_iter()
                .map(|(name, indexes)| {
                    let partitions = indexes
                        .into_iter()
                        .map(|index| groups::FetchedOffset {
                            partition: TopicPartition::new(name.0.as_str(), index),
                            offset: Offset(-1),
                            leader_epoch: None,
                            metadata: String::new(),
                            error: Some(error),
                        })
                        .collect();
                    (name, partitions)
                })
                .collect();
        }
    } else {
        response.error_code = group_code(error);
    }
    response.topics = topics
        .into_iter()
        .filter(|(name, _)| !(every && topic_refused(name)))
        .map(|(name, partitions)| {
            let refused = topic_refused(&name);
            let mut t = OffsetFetchResponseTopic::default();
            t.name = name;
            t.partitions = partitions
                .into_iter()
                .map(|p| {
                    let mut out = OffsetFetchResponsePartition::default();
                    out.partition_index = p.partition.partition;
                    if refused {
                        out.committed_offset = -1;
                        if v >= 5 {
                            out.committed_leader_epoch = -1;
                        }
                        out.error_code = code::TOPIC_AUTHORIZATION_FAILED;
                        return out;
                    }
                    out.committed_offset = p.offset.get();
                    if v >= 5 {
                        out.committed_leader_epoch = p.leader_epoch.unwrap_or(-1);
                    }
                    out.metadata = Some(StrBytes::from_string(p.metadata));
                    out.error_code = group_code(p.error);
                    out
                })
                .collect();
            t
        })
        .collect();
    response
}

/// The requested partitions by topic, or None for "every committed partition".
type WantedOffsets = Option<Vec<(TopicName, Vec<i32>)>>;

/// Fetches one group's offsets, grouped by topic in request order (or, for "all", in the
/// coordinator's order).
async fn fetch_group(
    broker: &Broker,
    group_id: &GroupId,
    wanted: WantedOffsets,
    require_stable: bool,
    member: Option<(String, i32)>,
) -> (
    Option<GroupError>,
    Vec<(TopicName, Vec<groups::FetchedOffset>)>,
) {
    let partitions = wanted.map(|topics| {
        topics
            .iter()
            .flat_map(|(name, indexes)| {
                let topic: Arc<str> = Arc::from(name.0.as_str());
                indexes
                    .iter()
                    .map(move |i| TopicPartition::new(Arc::clone(&topic), *i))
            })
            .collect::<Vec<_>>()
    });
    let fetch = groups::OffsetFetchRequest {
        group_id: group_id.0.to_string(),
        partitions,
        require_stable,
        member,
    };
    let fetched = match broker.groups.offset_fetch(fetch).await {
        Ok(fetched) => fetched,
        Err(error) => return (Some(error), Vec::new()),
    };
    let mut topics: Vec<(TopicName, Vec<groups::FetchedOffset>)> = Vec::new();
    let mut index: HashMap<Arc<str>, usize> = HashMap::new();
    for p in fetched.partitions {
        let at = *index
            .entry(Arc::clone(&p.partition.topic))
            .or_insert_with(|| {
                topics.push((topic_name(&p.partition.topic), Vec::new()));
                topics.len() - 1
            });
        topics[at].1.push(p);
    }
    (fetched.error, topics)
}

/// OffsetDelete v0: removes a group's committed offsets for partitions it no longer consumes.
pub(crate) async fn offset_delete(
    broker: &Broker,
    request: OffsetDeleteRequest,
    ctx: &RequestContext,
) -> OffsetDeleteResponse {
    let authz = broker.authz(ctx);
    if !authz.allows(Op::Delete, Res::Group, request.group_id.0.as_str()) {
        let mut response = OffsetDeleteResponse::default();
        response.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return response;
    }
    let topic_refused: std::collections::HashSet<String> = request
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .filter(|name| !authz.allows(Op::Read, Res::Topic, name))
        .collect();
    let mut known = Vec::new();
    for topic in &request.topics {
        if topic_refused.contains(topic.name.0.as_str()) {
            continue;
        }
        if let Some(info) = broker.log.topic(topic.name.0.as_str()) {
            for p in &topic.partitions {
                if (0..info.partitions).contains(&p.partition_index) {
                    known.push(TopicPartition::new(
                        Arc::clone(&info.name),
                        p.partition_index,
                    ));
                }
            }
        }
    }
    let known_set: std::collections::HashSet<TopicPartition> = known.iter().cloned().collect();
    // The coordinator is asked even with nothing known, so that an unknown group or a group
    // still consuming is reported as Kafka reports it.
    let delete = groups::OffsetDeleteRequest {
        group_id: request.group_id.0.to_string(),
        partitions: known,
    };
    let deleted = expect(broker.groups.offset_delete(delete).await, |r| match r {
        Response::OffsetDelete(d) => Some(d),
        _ => None,
    })
    .unwrap_or_else(|error| groups::OffsetDeleteResponse {
        error: Some(error),
        partitions: Vec::new(),
    });
    let results: HashMap<TopicPartition, Option<GroupError>> =
        deleted.partitions.into_iter().collect();
    let mut response = OffsetDeleteResponse::default();
    response.error_code = group_code(deleted.error);
    response.topics = request
        .topics
        .into_iter()
        .filter_map(|topic| {
            let name: Arc<str> = Arc::from(topic.name.0.as_str());
            let partitions: Vec<OffsetDeleteResponsePartition> = topic
                .partitions
                .iter()
                .filter_map(|p| {
                    let key = TopicPartition::new(Arc::clone(&name), p.partition_index);
                    let error_code = if topic_refused.contains(topic.name.0.as_str()) {
                        code::TOPIC_AUTHORIZATION_FAILED
                    } else if !known_set.contains(&key) {
                        code::UNKNOWN_TOPIC_OR_PARTITION
                    } else {
                        // Absent when the whole request failed (top-level error).
                        group_code(*results.get(&key)?)
                    };
                    let mut out = OffsetDeleteResponsePartition::default();
                    out.partition_index = p.partition_index;
                    out.error_code = error_code;
                    Some(out)
                })
                .collect();
            if partitions.is_empty() {
                return None;
            }
            let mut t = OffsetDeleteResponseTopic::default();
            t.name = topic.name;
            t.partitions = partitions;
            Some(t)
        })
        .collect();
    response
}

// ----- DescribeGroups / ListGroups / DeleteGroups -----

/// DescribeGroups v0–v6. A group this broker does not host is reported Dead with no error up to
/// v5, and GROUP_ID_NOT_FOUND from v6 on (KIP-1043), as Kafka does.
pub(crate) async fn describe_groups(
    broker: &Broker,
    request: DescribeGroupsRequest,
    ctx: &RequestContext,
) -> DescribeGroupsResponse {
    let v = ctx.api_version;
    let with_ops = v >= 3 && request.include_authorized_operations;
    let authz = &broker.authz(ctx);
    let described = join_all(request.groups.into_iter().map(|group_id| async move {
        let mut g = DescribedGroup::default();
        if !authz.allows(Op::Describe, Res::Group, group_id.0.as_str()) {
            g.error_code = code::GROUP_AUTHORIZATION_FAILED;
            g.group_id = group_id;
            return g;
        }
        let answer = broker.groups.describe(group_id.0.to_string()).await;
        match answer {
            Ok(d) if v >= 6 && d.state == GroupState::Dead => {
                g.error_code = code::GROUP_ID_NOT_FOUND;
                g.error_message = message(format!("Group {} not found.", group_id.0.as_str()));
            }
            Ok(d) => {
                g.error_code = code::NONE;
                g.group_state = str_bytes(d.state.as_str());
                g.protocol_type = StrBytes::from_string(d.protocol_type);
                g.protocol_data = StrBytes::from_string(d.protocol);
                g.members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut member = DescribedGroupMember::default();
                        member.member_id = StrBytes::from_string(m.member_id);
                        if v >= 4 {
                            member.group_instance_id =
                                m.group_instance_id.map(StrBytes::from_string);
                        }
                        member.client_id = StrBytes::from_string(m.client_id);
                        member.client_host = StrBytes::from_string(m.client_host);
                        member.member_metadata = m.metadata;
                        member.member_assignment = m.assignment;
                        member
                    })
                    .collect();
                if with_ops {
                    g.authorized_operations = authz.operations(
                        Res::Group,
                        group_id.0.as_str(),
                        acl_op::bits(&[acl_op::READ, acl_op::DELETE, acl_op::DESCRIBE]),
                    );
                }
            }
            Err(error) => {
                g.error_code = group_error_code(&error);
                if v >= 6 {
                    g.error_message = message(error.to_string());
                }
            }
        }
        g.group_id = group_id;
        g
    }))
    .await;
    let mut response = DescribeGroupsResponse::default();
    response.groups = described;
    response
}

/// ListGroups v0–v5, with v4's state filter and v5's type filter (matched case-insensitively,
/// as Kafka does). Filter values that name no state or type match nothing.
pub(crate) async fn list_groups(
    broker: &Broker,
    request: ListGroupsRequest,
    ctx: &RequestContext,
) -> ListGroupsResponse {
    let v = ctx.api_version;
    let mut response = ListGroupsResponse::default();
    let state_names = if v >= 4 {
        request.states_filter
    } else {
        Vec::new()
    };
    let states: Vec<GroupState> = state_names
        .iter()
        .filter_map(|s| GroupState::parse(s.as_str()))
        .collect();
    let type_names = if v >= 5 {
        request.types_filter
    } else {
        Vec::new()
    };
    // Classic, KIP-848 "consumer" and KIP-932 "share" groups.
    let type_wanted = |group_type: &str| {
        type_names.is_empty()
            || type_names
                .iter()
                .any(|t| t.as_str().eq_ignore_ascii_case(group_type))
    };
    // The coordinator reads an empty state list as "all"; a filter of only unknown names must
    // list nothing instead.
    if !state_names.is_empty() && states.is_empty() {
        return response;
    }
    // Every group with DESCRIBE on the cluster; otherwise only those the principal may
    // describe, the others not mentioned.
    let authz = broker.authz(ctx);
    let everything = authz.allows_cluster(Op::Describe) || !authz.enabled();
    match broker.groups.list(states).await {
        Ok(listed) => {
            response.groups = listed
                .into_iter()
                .filter(|g| type_wanted(g.group_type))
                .filter(|g| everything || authz.shows(Op::Describe, Res::Group, &g.group_id))
                .map(|g| {
                    let mut out = WireListedGroup::default();
                    out.group_id = GroupId(StrBytes::from_string(g.group_id));
                    out.protocol_type = StrBytes::from_string(g.protocol_type);
                    if v >= 4 {
                        out.group_state = str_bytes(g.state.as_str());
                    }
                    if v >= 5 {
                        out.group_type = str_bytes(g.group_type);
                    }
                    out
                })
                .collect();
        }
        Err(error) => response.error_code = group_error_code(&error),
    }
    if type_wanted("share") {
        let wanted_state = |state: &str| {
            state_names.is_empty()
                || state_names
                    .iter()
                    .any(|s| s.as_str().eq_ignore_ascii_case(state))
        };
        let shares = broker.share.list(|g| broker.groups.hosts(g));
        response.groups.extend(
            shares
                .into_iter()
                .filter(|(g, state)| {
                    wanted_state(state) && (everything || authz.shows(Op::Describe, Res::Group, g))
                })
                .map(|(g, state)| {
                    let mut out = WireListedGroup::default();
                    out.group_id = GroupId(StrBytes::from_string(g));
                    out.protocol_type = str_bytes("share");
                    if v >= 4 {
                        out.group_state = str_bytes(state);
                    }
                    if v >= 5 {
                        out.group_type = str_bytes("share");
                    }
                    out
                }),
        );
    }
    response
}

/// DeleteGroups v0–v2: only groups without members can be deleted (NON_EMPTY_GROUP), taking
/// their committed offsets with them.
pub(crate) async fn delete_groups(
    broker: &Broker,
    request: DeleteGroupsRequest,
    ctx: &RequestContext,
) -> DeleteGroupsResponse {
    let authz = broker.authz(ctx);
    let (ids, refused): (Vec<String>, Vec<String>) = request
        .groups_names
        .iter()
        .map(|g| g.0.to_string())
        .partition(|g| authz.allows(Op::Delete, Res::Group, g));
    // Share groups are deleted here; the rest go to the coordinator.
    let mut deleted = Vec::new();
    let mut others = Vec::new();
    for g in ids {
        match super::share_groups::delete_share_group(broker, &g).await {
            Some(error) => deleted.push((g, error)),
            None => others.push(g),
        }
    }
    let ids = others;
    if !ids.is_empty() {
        deleted.extend(
            broker
                .groups
                .delete_groups(ids)
                .await
                .groups
                .into_iter()
                .map(|(g, e)| (g, group_code(e))),
        );
    }
    let mut response = DeleteGroupsResponse::default();
    response.results = refused
        .into_iter()
        .map(|g| {
            let mut r = DeletableGroupResult::default();
            r.group_id = GroupId(StrBytes::from_string(g));
            r.error_code = code::GROUP_AUTHORIZATION_FAILED;
            r
        })
        .collect();
    response
        .results
        .extend(deleted.into_iter().map(|(group_id, error)| {
            let mut r = DeletableGroupResult::default();
            r.group_id = GroupId(StrBytes::from_string(group_id));
            r.error_code = error;
            r
        }));
    response
}

// ----- helpers -----

/// The client's address as Kafka reports it in DescribeGroups: Java's `InetAddress.toString()`
/// of an unresolved address, "/" and the IP (IPv6 uncompressed, IPv4-mapped shown as IPv4).
pub(crate) fn client_host(peer: SocketAddr) -> String {
    match peer.ip().to_canonical() {
        IpAddr::V4(ip) => format!("/{ip}"),
        IpAddr::V6(ip) => {
            let segments: Vec<String> = ip.segments().iter().map(|s| format!("{s:x}")).collect();
            format!("/{}", segments.join(":"))
        }
    }
}

/// Picks the expected variant out of a coordinator answer. Another variant is a bug in the
/// coordinator wiring: logged, and answered UNKNOWN_SERVER_ERROR rather than crashing.
pub(super) fn expect<T>(
    answer: Result<Response, GroupError>,
    pick: impl FnOnce(Response) -> Option<T>,
) -> Result<T, GroupError> {
    let response = answer?;
    let variant = variant_name(&response);
    pick(response).ok_or_else(|| {
        error!(
            response = variant,
            "group coordinator answered with the wrong response (bug)"
        );
        GroupError::UnknownServerError
    })
}

fn variant_name(response: &Response) -> &'static str {
    match response {
        Response::Join(_) => "Join",
        Response::Sync(_) => "Sync",
        Response::Heartbeat(_) => "Heartbeat",
        Response::Leave(_) => "Leave",
        Response::OffsetCommit(_) => "OffsetCommit",
        Response::DeleteGroups(_) => "DeleteGroups",
        Response::ConsumerHeartbeat(_) => "ConsumerHeartbeat",
        Response::OffsetDelete(_) => "OffsetDelete",
        Response::TxnEnd(_) => "TxnEnd",
    }
}

/// Runs a request that the coordinator may park (JoinGroup, SyncGroup) until it is answered
/// or the broker starts shutting down. At shutdown the client is told NOT_COORDINATOR, which is
/// what Kafka answers parked requests when it unloads a group: the client rediscovers the
/// coordinator and rejoins, instead of holding the broker's shutdown for a rebalance timeout.
pub(super) async fn until_shutdown(
    ctx: &RequestContext,
    request: impl Future<Output = Result<Response, GroupError>>,
) -> Result<Response, GroupError> {
    let mut shutdown = ctx.shutdown.clone();
    tokio::select! {
        answer = request => answer,
        _ = shutdown.wait_for(|stopping| *stopping) => {
            debug!(peer = %ctx.peer, "answering a parked group request NOT_COORDINATOR: shutting down");
            Err(GroupError::NotCoordinator)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Encodable;

    #[test]
    fn client_host_looks_like_javas_inet_address() {
        assert_eq!(client_host("127.0.0.1:5000".parse().unwrap()), "/127.0.0.1");
        assert_eq!(
            client_host("[::1]:5000".parse().unwrap()),
            "/0:0:0:0:0:0:0:1"
        );
        assert_eq!(
            client_host("[::ffff:10.0.0.7]:5000".parse().unwrap()),
            "/10.0.0.7"
        );
    }

    #[test]
    fn join_responses_encode_at_every_version() {
        for v in 0..=9 {
            let joined = groups::JoinResponse {
                error: None,
                generation_id: 3,
                protocol_type: Some("consumer".into()),
                protocol_name: None,
                leader: "m-1".into(),
                skip_assignment: true,
                member_id: "m-1".into(),
                members: vec![groups::JoinMember {
                    member_id: "m-1".into(),
                    group_instance_id: Some("i-1".into()),
                    metadata: bytes::Bytes::from_static(b"meta"),
                }],
            };
            let mut buf = bytes::BytesMut::new();
            join_response(joined, v).encode(&mut buf, v).unwrap();
        }
    }

    #[test]
    fn coordinator_key_types() {
        assert!(coordinator_for(key_type::GROUP).is_ok());
        assert!(coordinator_for(key_type::TRANSACTION).is_ok());
        assert_eq!(coordinator_for(7).unwrap_err().0, code::INVALID_REQUEST);
    }
}
