//! Share groups (KIP-932): ShareGroupHeartbeat v1, ShareGroupDescribe v1, ShareFetch v1 and
//! ShareAcknowledge v1. Conversion and IO only; `strata-groups` decides membership and record
//! states, `crate::share` holds them.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::select_all;
use kafka_protocol::messages::share_acknowledge_response::{
    PartitionData as AckPartitionData, ShareAcknowledgeTopicResponse,
};
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::share_group_describe_response::{
    Assignment as DescribeAssignment, DescribedGroup, Member,
    TopicPartitions as DescribeTopicPartitions,
};
use kafka_protocol::messages::share_group_heartbeat_response::{
    Assignment as HeartbeatAssignment, TopicPartitions as HeartbeatTopicPartitions,
};
use kafka_protocol::messages::{
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
    ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use strata_core::{Offset, TopicPartition};
use strata_groups::assignor::Assignment;
use strata_groups::share::ShareHeartbeatRequest;
use strata_groups::share_partition::{BatchSpan, ShareAckError};
use strata_groups::GroupState;
use strata_log::Isolation;
use tokio::sync::watch;
use uuid::Uuid;

use super::groups::client_host;
use super::{str_bytes, topic_id_of};
use crate::authorize::{Op, Res};
use crate::errors::{
    code, group_code, group_error_code, message, share_ack_error_code, share_error_code,
};
use crate::group_configs::GroupConfig;
use crate::server::Broker;
use crate::share::{SessionStep, ShareError};
use crate::RequestContext;

/// Records a ShareFetch acquires when the client sets no `max_records`.
const DEFAULT_MAX_RECORDS: usize = 500;

/// ShareGroupHeartbeat v1: join (epoch 0), heartbeat, leave (epoch -1).
pub(crate) async fn share_group_heartbeat(
    broker: &Broker,
    request: ShareGroupHeartbeatRequest,
    ctx: &RequestContext,
) -> ShareGroupHeartbeatResponse {
    let mut response = ShareGroupHeartbeatResponse::default();
    let group_id = request.group_id.0.to_string();
    let authz = broker.authz(ctx);
    let refusal = if !authz.allows(Op::Read, Res::Group, &group_id) {
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
    if let Some((error, text)) = refusal {
        response.error_code = error;
        response.error_message = message(text);
        return response;
    }
    if let Err(refusal) = broker.groups.hosting(&group_id) {
        response.error_code = group_error_code(&refusal);
        return response;
    }
    // A group id a consumer group uses cannot become a share group (Kafka answers
    // GROUP_ID_NOT_FOUND: "Group is not a share group").
    if !broker.share.has_group(&group_id) && request.member_epoch == 0 {
        match broker.groups.describe(group_id.clone()).await {
            Ok(d) if d.state != GroupState::Dead => {
                response.error_code = code::GROUP_ID_NOT_FOUND;
                response.error_message = message(format!("Group {group_id} is not a share group."));
                return response;
            }
            Ok(_) => {}
            Err(e) => {
                response.error_code = group_code(Some(e));
                return response;
            }
        }
    }
    let timeouts = broker
        .share
        .configs
        .cached_with(&group_id, GroupConfig::share_timeouts);
    let req = ShareHeartbeatRequest {
        group_id,
        timeouts,
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        rack_id: request.rack_id.map(|s| s.to_string()),
        subscribed_topic_names: request
            .subscribed_topic_names
            .map(|names| names.into_iter().map(|n| n.0.to_string()).collect()),
        client_id: ctx.client_id.clone().unwrap_or_default(),
        client_host: client_host(ctx.peer),
    };
    let h = broker
        .share
        .heartbeat(req, &crate::coordinator::LogCatalog(&broker.log));
    response.error_code = group_code(h.error);
    if let Some(error) = h.error {
        response.error_message = message(error.to_string());
    }
    response.member_id = Some(StrBytes::from_string(h.member_id));
    response.member_epoch = h.member_epoch;
    response.heartbeat_interval_ms = h.heartbeat_interval_ms;
    response.assignment = h.assignment.map(|a| {
        let mut out = HeartbeatAssignment::default();
        out.topic_partitions = a
            .into_iter()
            .map(|(topic, partitions)| {
                let mut t = HeartbeatTopicPartitions::default();
                t.topic_id = Uuid::from_bytes(topic.0);
                t.partitions = partitions.into_iter().collect();
                t
            })
            .collect();
        out
    });
    response
}

/// ShareGroupDescribe v1.
pub(crate) async fn share_group_describe(
    broker: &Broker,
    request: ShareGroupDescribeRequest,
    ctx: &RequestContext,
) -> ShareGroupDescribeResponse {
    let authz = broker.authz(ctx);
    let mut response = ShareGroupDescribeResponse::default();
    for group_id in request.group_ids {
        let id = group_id.0.to_string();
        let mut out = DescribedGroup::default();
        out.group_id = group_id;
        out.authorized_operations = i32::MIN;
        if !authz.allows(Op::Describe, Res::Group, &id) {
            out.error_code = code::GROUP_AUTHORIZATION_FAILED;
        } else if let Err(refusal) = broker.groups.hosting(&id) {
            out.error_code = group_error_code(&refusal);
        } else if let Some(d) = broker.share.describe(&id) {
            out.group_state = str_bytes(d.state);
            out.group_epoch = d.group_epoch;
            out.assignment_epoch = d.assignment_epoch;
            out.assignor_name = str_bytes("simple");
            out.members = d
                .members
                .into_iter()
                .map(|m| {
                    let mut w = Member::default();
                    w.member_id = StrBytes::from_string(m.member_id);
                    w.rack_id = m.rack_id.map(StrBytes::from_string);
                    w.member_epoch = m.member_epoch;
                    w.client_id = StrBytes::from_string(m.client_id);
                    w.client_host = StrBytes::from_string(m.client_host);
                    w.subscribed_topic_names = m
                        .subscribed_topic_names
                        .into_iter()
                        .map(|n| TopicName(StrBytes::from_string(n)))
                        .collect();
                    w.assignment = describe_assignment(broker, &m.assignment);
                    w
                })
                .collect();
        } else {
            out.error_code = code::GROUP_ID_NOT_FOUND;
            out.error_message = message(format!("Group {id} not found."));
        }
        response.groups.push(out);
    }
    response
}

fn describe_assignment(broker: &Broker, a: &Assignment) -> DescribeAssignment {
    let mut out = DescribeAssignment::default();
    out.topic_partitions = a
        .iter()
        .map(|(topic, partitions)| {
            let mut t = DescribeTopicPartitions::default();
            t.topic_id = Uuid::from_bytes(topic.0);
            if let Some(info) = broker.log.topic_by_id(strata_log::TopicId(topic.0)) {
                t.topic_name = TopicName(str_bytes(&info.name));
            }
            t.partitions = partitions.iter().copied().collect();
            t
        })
        .collect();
    out
}

/// One acknowledgement batch: first and last offset, and the types.
type AckBatch = (i64, i64, Vec<i8>);

/// A partition named by a share request, resolved.
struct Target {
    uuid: Uuid,
    tp: Result<TopicPartition, i16>,
}

fn resolve(broker: &Broker, ctx: &RequestContext, uuid: Uuid, partition: i32) -> Target {
    let tp = match broker.log.topic_by_id(topic_id_of(&uuid)) {
        None => Err(code::UNKNOWN_TOPIC_ID),
        Some(t) if !broker.authz(ctx).allows(Op::Read, Res::Topic, &t.name) => {
            Err(code::TOPIC_AUTHORIZATION_FAILED)
        }
        Some(t) if partition < 0 || partition >= t.partitions => {
            Err(code::UNKNOWN_TOPIC_OR_PARTITION)
        }
        Some(t) => Ok(TopicPartition::new(t.name.to_string(), partition)),
    };
    Target { uuid, tp }
}

/// Applies one partition's acknowledgement batches (all or none per batch; the first error
/// is the partition's answer) and waits until they are stored.
async fn acknowledge(
    broker: &Broker,
    group_id: &str,
    member_id: &str,
    target: &Target,
    batches: &[AckBatch],
) -> (i16, Option<String>) {
    let tp = match &target.tp {
        Ok(tp) => tp,
        Err(code) => return (*code, None),
    };
    let part = match broker
        .share
        .part(group_id, tp, *target.uuid.as_bytes())
        .await
    {
        Ok(p) => p,
        Err(e) => return (share_error_code(&e), Some(e.to_string())),
    };
    let limits = broker.share.limits(group_id);
    let (first_error, upto) = part.update(|p| {
        // The group's delivery-count limit decides whether a release archives.
        p.set_limits(limits);
        let mut first_error: Option<ShareAckError> = None;
        let mut changed = false;
        for (first, last, types) in batches {
            match p.acknowledge(member_id, *first, *last, types) {
                Ok(counts) => {
                    broker.share.count(&part, counts);
                    changed = true;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        (first_error, changed)
    });
    if let Err(e) = broker.share.persist(group_id, tp, &part, upto).await {
        return (share_error_code(&e), Some(e.to_string()));
    }
    match first_error {
        Some(e) => (share_ack_error_code(&e), Some(e.to_string())),
        None => (code::NONE, None),
    }
}

/// ShareFetch v1: acknowledgements first, then acquisition, waiting up to `max_wait_ms` for
/// records when none could be acquired.
pub(crate) async fn share_fetch(
    broker: &Broker,
    request: ShareFetchRequest,
    ctx: &RequestContext,
) -> ShareFetchResponse {
    let mut response = ShareFetchResponse::default();
    response.acquisition_lock_timeout_ms =
        i32::try_from(broker.share.settings.limits.lock_duration.as_millis()).unwrap_or(i32::MAX);
    let (Some(group_id), Some(member_id)) = (request.group_id, request.member_id) else {
        response.error_code = code::INVALID_REQUEST;
        response.error_message = message("ShareFetch needs a group id and a member id");
        return response;
    };
    let (group_id, member_id) = (group_id.0.to_string(), member_id.to_string());
    let lock_duration = broker.share.limits(&group_id).lock_duration;
    response.acquisition_lock_timeout_ms =
        i32::try_from(lock_duration.as_millis()).unwrap_or(i32::MAX);
    if !broker.authz(ctx).allows(Op::Read, Res::Group, &group_id) {
        response.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return response;
    }
    // Partitions named in this request, with their acknowledgements.
    let mut acks: BTreeMap<(Uuid, i32), Vec<AckBatch>> = BTreeMap::new();
    let mut requested = Vec::new();
    for t in &request.topics {
        for p in &t.partitions {
            acks.entry((t.topic_id, p.partition_index))
                .or_default()
                .extend(
                    p.acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
                );
            if let Ok(tp) = resolve(broker, ctx, t.topic_id, p.partition_index).tp {
                requested.push((tp, *t.topic_id.as_bytes()));
            }
        }
    }
    let forgotten: Vec<_> = request
        .forgotten_topics_data
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter_map(|p| resolve(broker, ctx, t.topic_id, *p).tp.ok())
                .map(|tp| (tp, *t.topic_id.as_bytes()))
        })
        .collect::<Vec<_>>();
    // Acknowledgements of a closing session are applied before it releases the rest.
    let closing = request.share_session_epoch == -1;
    let mut answers: BTreeMap<(Uuid, i32), PartitionData> = BTreeMap::new();
    let apply_acks = async |answers: &mut BTreeMap<(Uuid, i32), PartitionData>| {
        for ((uuid, partition), batches) in &acks {
            if batches.is_empty() {
                continue;
            }
            let target = resolve(broker, ctx, *uuid, *partition);
            let (error, text) = acknowledge(broker, &group_id, &member_id, &target, batches).await;
            let entry = answers
                .entry((*uuid, *partition))
                .or_insert_with(|| partition_data(*partition));
            entry.acknowledge_error_code = error;
            entry.acknowledge_error_message = text.map(StrBytes::from_string);
        }
    };
    if closing {
        apply_acks(&mut answers).await;
    }
    let step = broker.share.session(
        &group_id,
        &member_id,
        request.share_session_epoch,
        &requested,
        &forgotten,
        false,
    );
    let (partitions, full) = match step {
        Err(e) => {
            response.error_code = share_error_code(&e);
            response.error_message = message(e.to_string());
            return response;
        }
        Ok(SessionStep::Closed) => (Vec::new(), false),
        Ok(SessionStep::Fetch { partitions, full }) => (partitions, full),
    };
    if full {
        // A new session: an administrator may have reset these share partitions.
        for (tp, _) in &partitions {
            broker.share.refresh(&group_id, tp).await;
        }
    }
    if !closing {
        apply_acks(&mut answers).await;
    }

    let max_records = usize::try_from(request.max_records)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX_RECORDS);
    let max_bytes = usize::try_from(request.max_bytes).unwrap_or(0).max(1);
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
    let member: std::sync::Arc<str> = std::sync::Arc::from(member_id.as_str());
    let partition_max: BTreeMap<(Uuid, i32), usize> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    (t.topic_id, p.partition_index),
                    // v1 clients send 0: no per-partition limit.
                    usize::try_from(p.partition_max_bytes)
                        .ok()
                        .filter(|n| *n > 0)
                        .unwrap_or(max_bytes),
                )
            })
        })
        .collect();

    let mut watermarks: Vec<watch::Receiver<Offset>> = partitions
        .iter()
        .filter_map(|(tp, _)| broker.log.subscribe(tp).ok())
        .map(|mut rx| {
            rx.borrow_and_update();
            rx
        })
        .collect();
    let mut deadline = broker.clock.sleep(max_wait);
    let mut shutdown = ctx.shutdown.clone();
    let mut acquired_any = false;
    // An error (the partition moved, storage failed) is answered at once, not after the wait.
    let mut any_error = false;
    let mut pass_answers;
    loop {
        pass_answers = BTreeMap::new();
        let mut budget = max_records;
        let mut bytes_left = max_bytes;
        for (tp, topic_id) in &partitions {
            let uuid = Uuid::from_bytes(*topic_id);
            let mut out = partition_data(tp.partition);
            let limit = partition_max
                .get(&(uuid, tp.partition))
                .copied()
                .unwrap_or(max_bytes)
                .min(bytes_left);
            if budget > 0 && limit > 0 {
                match acquire(broker, &group_id, &member, tp, *topic_id, budget, limit).await {
                    Ok((records, ranges, n)) => {
                        budget -= n;
                        bytes_left = bytes_left.saturating_sub(records.len());
                        if n > 0 {
                            acquired_any = true;
                            out.records = Some(records);
                            out.acquired_records = ranges;
                        }
                    }
                    Err(e) => {
                        out.error_code = share_error_code(&e);
                        out.error_message = message(e.to_string());
                        any_error = true;
                    }
                }
            }
            pass_answers.insert((uuid, tp.partition), out);
        }
        if acquired_any || any_error || max_wait.is_zero() || closing || *shutdown.borrow() {
            break;
        }
        // Records become available by an append or by a lock expiring.
        let next_expiry = partitions
            .iter()
            .filter_map(|(tp, _)| broker.share.next_lock_deadline(&group_id, tp))
            .min()
            .map(|at| at.saturating_sub(broker.clock.monotonic()));
        let expiry = broker.clock.sleep(next_expiry.unwrap_or(max_wait));
        watermarks.retain(|rx| rx.has_changed().is_ok());
        let appended = async {
            if watermarks.is_empty() {
                std::future::pending::<()>().await;
            } else {
                let changes = watermarks.iter_mut().map(|rx| Box::pin(rx.changed()));
                let _ = select_all(changes).await;
            }
        };
        tokio::select! {
            _ = appended => {}
            _ = expiry => {}
            _ = &mut deadline => {
                break;
            }
            _ = shutdown.changed() => break,
        }
    }
    for (key, out) in pass_answers {
        let listed = full || out.error_code != code::NONE || out.records.is_some();
        match answers.get_mut(&key) {
            Some(existing) => {
                existing.error_code = out.error_code;
                existing.error_message = out.error_message;
                existing.records = out.records;
                existing.acquired_records = out.acquired_records;
            }
            None if listed => {
                answers.insert(key, out);
            }
            None => {}
        }
    }
    let mut topics: BTreeMap<Uuid, ShareFetchableTopicResponse> = BTreeMap::new();
    for ((uuid, _), out) in answers {
        topics
            .entry(uuid)
            .or_insert_with(|| {
                let mut t = ShareFetchableTopicResponse::default();
                t.topic_id = uuid;
                t
            })
            .partitions
            .push(out);
    }
    response.responses = topics.into_values().collect();
    response
}

fn partition_data(partition: i32) -> PartitionData {
    let mut out = PartitionData::default();
    out.partition_index = partition;
    out.current_leader.leader_id = -1;
    out.current_leader.leader_epoch = -1;
    out
}

/// How many reads one acquisition makes at most when what it read held nothing to deliver
/// (transaction markers, aborted records): bounds the work of one ShareFetch while letting a
/// long aborted transaction be stepped over without a wait in between.
const MAX_READS_PER_ACQUIRE: usize = 16;

/// Reads from the share partition's next fetch offset and acquires what it can: the batches
/// holding acquired records (joined), the acquired ranges, and how many records. The group's
/// isolation level decides how far it reads (the high watermark, or the last stable offset
/// for read_committed) and which batches are records at all.
async fn acquire(
    broker: &Broker,
    group_id: &str,
    member: &std::sync::Arc<str>,
    tp: &TopicPartition,
    topic_id: [u8; 16],
    max_records: usize,
    max_bytes: usize,
) -> Result<(Bytes, Vec<AcquiredRecords>, usize), ShareError> {
    let part = broker.share.part(group_id, tp, topic_id).await?;
    let limits = broker.share.limits(group_id);
    let isolation = broker.share.isolation(group_id);
    for _ in 0..MAX_READS_PER_ACQUIRE {
        let marks = broker.log.watermarks(tp)?;
        let readable = match isolation {
            Isolation::ReadUncommitted => marks.high.0,
            Isolation::ReadCommitted => marks.last_stable.0,
        };
        let now = broker.clock.monotonic();
        let (from, _) = part.update(|p| {
            p.set_limits(limits);
            let expired = p.expire_locks(now);
            broker.share.count(&part, expired);
            p.skip_to(marks.log_start.0);
            (p.next_fetch_offset(), false)
        });
        let Some(from) = from.filter(|o| *o < readable) else {
            break;
        };
        let read = broker
            .log
            .read_isolated(tp, Offset(from), max_bytes, true, isolation)
            .await?;
        let visible = strata_wire::visibility::classify(&read.batches, read.aborted.as_deref());
        let spans: Vec<BatchSpan> = read
            .batches
            .iter()
            .zip(&visible)
            .map(|(b, v)| match strata_wire::read_batch_header(b) {
                Some(h) => BatchSpan {
                    base: h.base_offset,
                    last: h.base_offset + i64::from(h.last_offset_delta),
                    deliver: v.delivered(),
                },
                None => BatchSpan {
                    base: i64::MAX,
                    last: i64::MIN,
                    deliver: false,
                },
            })
            .collect();
        let ((used, ranges, counts), _) = part.update(|p| {
            (
                p.acquire(member, &spans, max_records, broker.clock.monotonic()),
                false,
            )
        });
        broker.share.count(&part, counts);
        if counts.acquired == 0 {
            // Nothing delivered: read on if the window moved past what was read.
            let moved = part
                .update(|p| (p.next_fetch_offset() != Some(from), false))
                .0;
            if moved {
                continue;
            }
            break;
        }
        let mut records = BytesMut::new();
        for (batch, used) in read.batches.iter().zip(used) {
            if used {
                records.extend_from_slice(batch);
            }
        }
        let acquired = ranges
            .iter()
            .map(|r| {
                let mut a = AcquiredRecords::default();
                a.first_offset = r.first;
                a.last_offset = r.last;
                a.delivery_count = i16::try_from(r.delivery_count).unwrap_or(i16::MAX);
                a
            })
            .collect();
        return Ok((records.freeze(), acquired, counts.acquired as usize));
    }
    Ok((Bytes::new(), Vec::new(), 0))
}

/// ShareAcknowledge v1.
pub(crate) async fn share_acknowledge(
    broker: &Broker,
    request: ShareAcknowledgeRequest,
    ctx: &RequestContext,
) -> ShareAcknowledgeResponse {
    let mut response = ShareAcknowledgeResponse::default();
    let (Some(group_id), Some(member_id)) = (request.group_id, request.member_id) else {
        response.error_code = code::INVALID_REQUEST;
        return response;
    };
    let (group_id, member_id) = (group_id.0.to_string(), member_id.to_string());
    if !broker.authz(ctx).allows(Op::Read, Res::Group, &group_id) {
        response.error_code = code::GROUP_AUTHORIZATION_FAILED;
        return response;
    }
    let closing = request.share_session_epoch == -1;
    if !closing {
        if let Err(e) = broker.share.session(
            &group_id,
            &member_id,
            request.share_session_epoch,
            &[],
            &[],
            true,
        ) {
            response.error_code = share_error_code(&e);
            response.error_message = message(e.to_string());
            return response;
        }
    }
    for t in &request.topics {
        let mut topic = ShareAcknowledgeTopicResponse::default();
        topic.topic_id = t.topic_id;
        for p in &t.partitions {
            let batches: Vec<_> = p
                .acknowledgement_batches
                .iter()
                .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
                .collect();
            let target = resolve(broker, ctx, t.topic_id, p.partition_index);
            let (error, text) = acknowledge(broker, &group_id, &member_id, &target, &batches).await;
            let mut out = AckPartitionData::default();
            out.partition_index = p.partition_index;
            out.error_code = error;
            out.error_message = text.map(StrBytes::from_string);
            out.current_leader.leader_id = -1;
            out.current_leader.leader_epoch = -1;
            topic.partitions.push(out);
        }
        response.responses.push(topic);
    }
    if closing {
        let _ = broker
            .share
            .session(&group_id, &member_id, -1, &[], &[], true);
    }
    response
}

/// DeleteGroups for a share group here, with its stored state; None if `group_id` is not one.
pub(crate) async fn delete_share_group(broker: &Broker, group_id: &str) -> Option<i16> {
    if !broker.share.has_group(group_id) {
        return None;
    }
    if let Err(e) = broker.share.delete_group(group_id) {
        return Some(group_code(Some(e)));
    }
    Some(match broker.share.delete_stored(group_id).await {
        Ok(()) => code::NONE,
        Err(e) => share_error_code(&e),
    })
}

/// Whether `group_id` is a share group here: consumer and classic protocols refuse it.
pub(crate) fn is_share_group(broker: &Broker, group_id: &str) -> bool {
    broker.share.has_group(group_id)
}
