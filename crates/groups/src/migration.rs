//! Online migration of a live group between the classic protocol (JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup) and the KIP-848 consumer protocol, as Kafka 4's group coordinator
//! does it, so a fleet of consumers can be restarted one by one onto the other protocol without
//! stopping the group.
//!
//! - **Upgrade.** A ConsumerGroupHeartbeat that joins a classic group with members (of protocol
//!   type "consumer") converts it into a consumer group: each classic member becomes a member at
//!   the group's generation, owning what its last SyncGroup gave it. Then the new member joins as
//!   usual, which moves the group epoch and the target assignment.
//! - **Classic members inside a consumer group.** They keep speaking their protocol and the
//!   coordinator translates. JoinGroup updates the member's subscription and moves it one step
//!   towards its target: partitions it must give up are left out of its assignment, and the
//!   client revokes them. The JoinGroup's generation is the member epoch. No member leads:
//!   SyncGroup answers with the member's assignment, computed by the broker's assignor.
//!   Heartbeat answers REBALANCE_IN_PROGRESS whenever the member has a step to take (the group
//!   epoch moved, a revocation is owed, or partitions it waits for became free), so it rejoins.
//!   A member that does not rejoin, or does not sync after joining, within its rebalance timeout
//!   is removed, as is one whose own session timeout passes.
//! - **Downgrade.** When the last consumer-protocol member leaves or is fenced and classic
//!   members remain, the group becomes a classic group again at the group epoch. Each member is
//!   given its target assignment, and a rebalance starts, so the classic protocol takes over
//!   from a consistent state.
//!
//! `group.consumer.migration.policy` ([`crate::MigrationPolicy`]) allows or forbids each
//! conversion. Classic members can always join a consumer group that has members, as in Kafka.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;

use crate::api::{
    JoinRequest, JoinResponse, LeavingMember, LeftMember, RequestToken, Response, SyncRequest,
    SyncResponse, TopicCatalog,
};
use crate::assignor::Assignment;
use crate::config::GroupConfig;
use crate::consumer::{intersect, millis, subtract, Changes, ConsumerGroup, ConsumerMember};
use crate::error::GroupError;
use crate::group::{Group, GroupState, Member, CONSUMER_PROTOCOL_TYPE};
use crate::record::{
    ClassicMemberMetadata, ClassicProtocol, ConsumerMemberState, ConsumerMemberValue,
    GroupMetadataValue, RecordBody, TopicId,
};
use crate::state::{Ctx, Pending};
use crate::subscription::{encode_assignment, encode_subscription, parse_assignment};
use crate::subscription::{parse_subscription, Subscription};

/// Partitions by topic name → the same by topic id; topics the catalog does not know, and
/// partitions past a topic's count, are dropped.
fn by_id(
    partitions: &[(String, Vec<i32>)],
    lookup: impl Fn(&str) -> Option<(TopicId, i32)>,
) -> Assignment {
    let mut out = Assignment::new();
    for (topic, ps) in partitions {
        let Some((id, count)) = lookup(topic) else {
            continue;
        };
        let valid: BTreeSet<i32> = ps
            .iter()
            .copied()
            .filter(|p| (0..count).contains(p))
            .collect();
        if !valid.is_empty() {
            out.entry(id).or_default().extend(valid);
        }
    }
    out
}

/// An assignment as the consumer protocol's bytes, topics by name.
fn assignment_bytes(group: &ConsumerGroup, assignment: &Assignment) -> Bytes {
    let names: BTreeMap<TopicId, &str> = group
        .topics
        .iter()
        .map(|(name, (id, _))| (*id, name.as_str()))
        .collect();
    let partitions: Vec<(String, Vec<i32>)> = assignment
        .iter()
        .filter_map(|(id, ps)| {
            names
                .get(id)
                .map(|n| (n.to_string(), ps.iter().copied().collect()))
        })
        .collect();
    Bytes::from(encode_assignment(&partitions))
}

fn classic_protocols(protocols: &[crate::api::Protocol]) -> Vec<ClassicProtocol> {
    protocols
        .iter()
        .map(|p| ClassicProtocol {
            name: p.name.clone(),
            metadata: p.metadata.clone(),
        })
        .collect()
}

/// Kafka's `ConsumerGroup.supportsClassicProtocols`: the consumer protocol type, and a protocol
/// name every classic member already there also supports.
fn supports_classic(group: &ConsumerGroup, protocol_type: &str, names: &[&str]) -> bool {
    if protocol_type != CONSUMER_PROTOCOL_TYPE || names.is_empty() {
        return false;
    }
    let classic: Vec<&ClassicMemberMetadata> = group
        .members
        .values()
        .filter_map(|m| m.value.classic.as_deref())
        .collect();
    names.iter().any(|name| {
        classic
            .iter()
            .all(|c| c.protocols.iter().any(|p| p.name == *name))
    })
}

/// The classic member `member_id` (or the holder of `instance`), checked as Kafka's
/// `validateConsumerGroupMember` and `throwIfMemberDoesNotUseClassicProtocol` do.
fn classic_member<'a>(
    group: &'a mut ConsumerGroup,
    member_id: &str,
    instance: Option<&str>,
) -> Result<&'a mut ConsumerMember, GroupError> {
    if let Some(instance) = instance {
        match group.static_members.get(instance) {
            Some(id) if id == member_id => {}
            Some(_) => return Err(GroupError::FencedInstanceId),
            None => return Err(GroupError::UnknownMemberId),
        }
    }
    match group.members.get_mut(member_id) {
        Some(m) if m.value.classic.is_some() => Ok(m),
        _ => Err(GroupError::UnknownMemberId),
    }
}

fn rebalance_timeout(m: &ConsumerMember) -> Duration {
    millis(m.value.rebalance_timeout_ms)
}

impl ConsumerGroup {
    /// Whether the member waits for partitions of its target that others hold but that have
    /// been released since (Kafka's `waitingOnUnreleasedPartition`, negated by the caller).
    fn unreleased_now_free(&self, member_id: &str) -> bool {
        let Some(m) = self.members.get(member_id) else {
            return false;
        };
        let wanted = subtract(&m.value.target, &m.value.assigned);
        intersect(&wanted, &self.owned_by_others(member_id)).is_empty()
    }
}

impl Group {
    /// Whether a ConsumerGroupHeartbeat may convert this classic group, which has members, into
    /// a consumer group (Kafka's `validateOnlineUpgrade`).
    pub(crate) fn can_upgrade(&self, config: &GroupConfig) -> bool {
        let policy = config.consumer_migration_policy;
        let ok = self.consumer.is_none()
            && policy.upgrades()
            && self.state != GroupState::Dead
            && self.protocol_type.as_deref() == Some(CONSUMER_PROTOCOL_TYPE)
            && self.members.len() <= config.max_group_size;
        if !ok {
            tracing::info!(group = %self.id, policy = policy.as_str(),
                protocol_type = ?self.protocol_type, members = self.members.len(),
                "classic group not upgraded to a consumer group");
        }
        ok
    }

    /// Converts this classic group into a consumer group (Kafka's `convertToConsumerGroup`).
    /// Its members keep the partitions their last SyncGroup gave them, at the generation as
    /// member epoch. GROUP_ID_NOT_FOUND, and no change, if a member's subscription or
    /// assignment is not the consumer protocol's.
    pub(crate) fn upgrade_to_consumer(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        catalog: &dyn TopicCatalog,
    ) -> Result<(), GroupError> {
        let generation = self.generation_id;
        let mut group = ConsumerGroup {
            group_epoch: generation,
            assignment_epoch: generation,
            ..Default::default()
        };
        for member_id in self.member_ids_in_join_order() {
            let Some(m) = self.members.get(&member_id) else {
                continue;
            };
            let protocol = self
                .protocol_name
                .clone()
                .or_else(|| m.protocols.first().map(|p| p.name.clone()))
                .unwrap_or_default();
            let bad = |what: &str| {
                tracing::warn!(group = %self.id, member = %member_id,
                    "cannot upgrade the classic group: the member's {what} is not the consumer protocol's");
                GroupError::GroupIdNotFound
            };
            let subscription = parse_subscription(&m.metadata_for(&protocol))
                .ok_or_else(|| bad("subscription"))?;
            let owned = parse_assignment(&m.assignment).ok_or_else(|| bad("assignment"))?;
            let assigned = by_id(&owned, |t| catalog.lookup(t));
            let value = ConsumerMemberValue {
                instance_id: m.group_instance_id.clone(),
                rack_id: None,
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                subscribed_topic_names: subscription.topics.into_iter().collect(),
                subscribed_topic_regex: None,
                server_assignor: None,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                member_epoch: generation,
                previous_member_epoch: generation,
                state: ConsumerMemberState::Stable,
                assigned: assigned.clone(),
                pending_revocation: Assignment::new(),
                target: assigned,
                classic: Some(Box::new(ClassicMemberMetadata {
                    session_timeout_ms: m.session_timeout_ms,
                    protocols: classic_protocols(&m.protocols),
                })),
            };
            if let Some(instance) = &value.instance_id {
                group
                    .static_members
                    .insert(instance.clone(), member_id.clone());
            }
            group.members.insert(
                member_id.clone(),
                ConsumerMember {
                    session_deadline: now + millis(m.session_timeout_ms),
                    revocation_deadline: None,
                    join_deadline: None,
                    value,
                },
            );
        }
        group.topics = group.subscribed_metadata(catalog);
        // The whole group goes into the next write; its metadata record replaces the classic
        // one under the same key.
        group.rewrite_all = true;
        tracing::info!(group = %self.id, generation, members = group.members.len(),
            "upgrading the classic group to a consumer group");
        // Members waiting in a rebalance learn that another one is under way, and rejoin.
        self.fail_all_parked(cx, GroupError::RebalanceInProgress);
        self.reset_classic();
        self.consumer = Some(group);
        Ok(())
    }

    /// JoinGroup from a classic-protocol member to a consumer group with members (Kafka's
    /// `classicGroupJoinToConsumerGroup`). Answered once what it changed is durable.
    pub(crate) fn classic_join_to_consumer(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        token: RequestToken,
        req: JoinRequest,
        catalog: &dyn TopicCatalog,
    ) {
        let mut changes = Changes::default();
        match self.classic_join(cx, now, &req, catalog, &mut changes) {
            Ok(response) => {
                let answer = Some((token, Response::Join(response)));
                match self.maybe_downgrade(cx, now, &mut changes) {
                    Some(value) => self.persist_downgrade(cx, changes, value, answer),
                    None => self.persist_consumer(cx, changes, answer),
                }
            }
            Err((error, member_id)) => {
                cx.respond(token, Response::Join(JoinResponse::error(member_id, error)));
            }
        }
    }

    fn classic_join(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        req: &JoinRequest,
        catalog: &dyn TopicCatalog,
        changes: &mut Changes,
    ) -> Result<JoinResponse, (GroupError, String)> {
        let Some(group) = self.consumer.as_mut() else {
            return Err((GroupError::UnknownMemberId, req.member_id.clone()));
        };
        let fail = |e: GroupError| (e, req.member_id.clone());
        let names: Vec<&str> = req.protocols.iter().map(|p| p.name.as_str()).collect();
        if !supports_classic(group, &req.protocol_type, &names) {
            return Err(fail(GroupError::InconsistentGroupProtocol));
        }
        let Some(first) = req.protocols.first() else {
            return Err(fail(GroupError::InconsistentGroupProtocol));
        };
        let Some(Subscription { topics, owned }) = parse_subscription(&first.metadata) else {
            return Err(fail(GroupError::InconsistentGroupProtocol));
        };
        let unknown = req.member_id.is_empty();
        let mut member_id = req.member_id.clone();
        if unknown {
            member_id = loop {
                let id = format!("{}-{}", req.client_id, cx.ids.next_suffix());
                if !group.members.contains_key(&id) {
                    break id;
                }
            };
            if req.group_instance_id.is_none() && req.api_version >= 4 {
                // KIP-394: a dynamic member first learns its id, then joins with it.
                return Err((GroupError::MemberIdRequired, member_id));
            }
        }
        let fail = |e: GroupError| (e, member_id.clone());
        if let Some(instance) = &req.group_instance_id {
            if let Some(old_id) = group.static_members.get(instance).cloned() {
                if old_id != member_id {
                    if !unknown {
                        return Err(fail(GroupError::FencedInstanceId));
                    }
                    // The instance is back under a new member id: it takes over the old
                    // member's epoch and assignment (KIP-345), whichever protocol that used.
                    if let Some(old) = group.members.remove(&old_id) {
                        group.members.insert(member_id.clone(), old);
                    }
                    group
                        .static_members
                        .insert(instance.clone(), member_id.clone());
                    changes.members.insert(old_id);
                    changes.members.insert(member_id.clone());
                }
            }
        }
        match group.members.get(&member_id) {
            Some(m) if m.value.classic.is_none() && req.group_instance_id.is_none() => {
                // The id of a member of the consumer protocol.
                return Err(fail(GroupError::UnknownMemberId));
            }
            Some(_) => {}
            None => {
                if group.members.len() >= cx.config.max_group_size {
                    return Err(fail(GroupError::GroupMaxSizeReached));
                }
                // Kafka creates the member for any id it does not know yet: the id handed out
                // with MEMBER_ID_REQUIRED, or one the client kept from before a conversion.
                // Its details are filled in below, as for a member already there.
                group
                    .members
                    .insert(member_id.clone(), ConsumerMember::joining(now));
                if let Some(instance) = &req.group_instance_id {
                    group
                        .static_members
                        .insert(instance.clone(), member_id.clone());
                }
                changes.members.insert(member_id.clone());
                group.bump_epoch(changes);
            }
        }
        let Some(member) = group.members.get_mut(&member_id) else {
            return Err(fail(GroupError::UnknownMemberId));
        };
        let before = member.value.clone();
        let v = &mut member.value;
        let topics: Vec<String> = topics.into_iter().collect();
        let subscription_changed = topics != v.subscribed_topic_names;
        v.subscribed_topic_names = topics;
        v.instance_id = req.group_instance_id.clone();
        // JoinGroup v0 has no rebalance timeout; the session timeout stands in, as in Kafka.
        v.rebalance_timeout_ms = if req.rebalance_timeout_ms > 0 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        };
        v.client_id = req.client_id.clone();
        v.client_host = req.client_host.clone();
        v.classic = Some(Box::new(ClassicMemberMetadata {
            session_timeout_ms: req.session_timeout_ms,
            protocols: classic_protocols(&req.protocols),
        }));
        if *v != before {
            changes.members.insert(member_id.clone());
        }
        member.session_deadline = now + millis(req.session_timeout_ms);
        // Kafka's sync timeout: the SyncGroup must follow within the rebalance timeout.
        member.join_deadline = Some(now + rebalance_timeout(member));
        group.retarget(subscription_changed, catalog, changes);
        // What the member still owns, by its own account: a cooperative client lists it; an
        // eager one revoked everything before joining and lists nothing.
        let owned = by_id(&owned, |t| group.topics.get(t).copied());
        group.reconcile(&member_id, Some(&owned), now, changes);
        let Some(member) = group.members.get(&member_id) else {
            return Err(fail(GroupError::UnknownMemberId));
        };
        Ok(JoinResponse {
            error: None,
            generation_id: member.value.member_epoch,
            protocol_type: Some(CONSUMER_PROTOCOL_TYPE.to_string()),
            protocol_name: Some(first.name.clone()),
            // No member leads: the broker's assignor has done the work.
            leader: String::new(),
            skip_assignment: false,
            member_id,
            members: Vec::new(),
        })
    }

    /// SyncGroup from a classic-protocol member of a consumer group: its current assignment,
    /// once every write of the group is durable (Kafka's `classicGroupSyncToConsumerGroup`).
    pub(crate) fn classic_sync_to_consumer(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        token: RequestToken,
        req: SyncRequest,
    ) {
        let result = (|| {
            let group = self.consumer.as_mut().ok_or(GroupError::UnknownMemberId)?;
            let group_epoch = group.group_epoch;
            let member = classic_member(group, &req.member_id, req.group_instance_id.as_deref())?;
            if req.generation_id != member.value.member_epoch {
                return Err(GroupError::IllegalGeneration);
            }
            let protocol = member
                .value
                .classic
                .as_ref()
                .and_then(|c| c.protocols.first())
                .map(|p| p.name.clone())
                .unwrap_or_default();
            if req
                .protocol_type
                .as_deref()
                .is_some_and(|t| t != CONSUMER_PROTOCOL_TYPE)
                || req.protocol_name.as_deref().is_some_and(|n| n != protocol)
            {
                return Err(GroupError::InconsistentGroupProtocol);
            }
            // A newer epoch the member has not joined yet; but one owing a revocation has
            // rejoined already and must first get the assignment without those partitions.
            if group_epoch > member.value.member_epoch
                && member.value.state != ConsumerMemberState::UnrevokedPartitions
            {
                return Err(GroupError::RebalanceInProgress);
            }
            member.join_deadline = None;
            member.session_deadline = now
                + millis(
                    member
                        .value
                        .classic
                        .as_ref()
                        .map_or(0, |c| c.session_timeout_ms),
                );
            let assigned = member.value.assigned.clone();
            Ok(SyncResponse {
                error: None,
                protocol_type: Some(CONSUMER_PROTOCOL_TYPE.to_string()),
                protocol_name: Some(protocol),
                assignment: assignment_bytes(group, &assigned),
            })
        })();
        match result {
            Ok(response) => self.persist_consumer(
                cx,
                Changes::default(),
                Some((token, Response::Sync(response))),
            ),
            Err(error) => cx.respond(token, Response::Sync(SyncResponse::error(error))),
        }
    }

    /// Heartbeat from a classic-protocol member of a consumer group (Kafka's
    /// `classicGroupHeartbeatToConsumerGroup`): REBALANCE_IN_PROGRESS while it has a step to
    /// take, which it takes by rejoining.
    pub(crate) fn classic_heartbeat_to_consumer(
        &mut self,
        now: Duration,
        member_id: &str,
        instance: Option<&str>,
        generation_id: i32,
    ) -> Option<GroupError> {
        let group = self.consumer.as_mut()?;
        let group_epoch = group.group_epoch;
        let free = group.unreleased_now_free(member_id);
        let member = match classic_member(group, member_id, instance) {
            Ok(m) => m,
            Err(e) => return Some(e),
        };
        if generation_id != member.value.member_epoch {
            return Some(GroupError::IllegalGeneration);
        }
        let session = member
            .value
            .classic
            .as_ref()
            .map_or(0, |c| c.session_timeout_ms);
        member.session_deadline = now + millis(session);
        let state = member.value.state;
        let rejoin = member.value.member_epoch < group_epoch
            || state == ConsumerMemberState::UnrevokedPartitions
            || (state == ConsumerMemberState::UnreleasedPartitions && free);
        if !rejoin {
            return None;
        }
        // Kafka's join timeout: the member must rejoin within its rebalance timeout.
        let deadline = now + rebalance_timeout(member);
        member.join_deadline.get_or_insert(deadline);
        Some(GroupError::RebalanceInProgress)
    }

    /// LeaveGroup to a consumer group: classic-protocol members only (Kafka's
    /// `classicGroupLeaveToConsumerGroup`); a consumer-protocol member leaves by heartbeat.
    pub(crate) fn classic_leave_to_consumer(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        members: Vec<LeavingMember>,
    ) -> Vec<LeftMember> {
        let mut changes = Changes::default();
        let mut results = Vec::with_capacity(members.len());
        for leaving in members {
            let error = match self.consumer.as_mut() {
                None => Some(GroupError::UnknownMemberId),
                Some(group) => {
                    let id = match &leaving.group_instance_id {
                        None => Ok(leaving.member_id.clone()),
                        // An administrator removes a static member by instance id alone.
                        Some(instance) => match group.static_members.get(instance) {
                            None => Err(GroupError::UnknownMemberId),
                            Some(id)
                                if !leaving.member_id.is_empty() && *id != leaving.member_id =>
                            {
                                Err(GroupError::FencedInstanceId)
                            }
                            Some(id) => Ok(id.clone()),
                        },
                    };
                    match id.and_then(|id| {
                        classic_member(group, &id, None)?;
                        Ok(id)
                    }) {
                        Ok(id) => {
                            tracing::info!(group = %self.id, member = %id,
                                reason = leaving.reason.as_deref().unwrap_or(""),
                                "classic member left the consumer group");
                            group.remove_member(&id, &mut changes);
                            None
                        }
                        Err(e) => Some(e),
                    }
                }
            };
            results.push(LeftMember {
                member_id: leaving.member_id,
                group_instance_id: leaving.group_instance_id,
                error,
            });
        }
        match self.maybe_downgrade(cx, now, &mut changes) {
            Some(value) => self.persist_downgrade(cx, changes, value, None),
            None => self.persist_consumer(cx, changes, None),
        }
        results
    }

    /// If only classic-protocol members are left and the policy allows it, turns the group
    /// back into a classic group (Kafka's `convertToClassicGroup`) and returns its metadata
    /// record; every former member's id is added to `changes` for its tombstone.
    pub(crate) fn maybe_downgrade(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        changes: &mut Changes,
    ) -> Option<GroupMetadataValue> {
        let group = self.consumer.as_ref()?;
        if group.members.is_empty() || group.members.values().any(|m| m.value.classic.is_none()) {
            return None;
        }
        let policy = cx.config.consumer_migration_policy;
        if !policy.downgrades() {
            tracing::info!(group = %self.id, policy = policy.as_str(),
                "only classic members are left, but the policy keeps the consumer group");
            return None;
        }
        let group = self.consumer.take()?;
        let mut classic = Group::new(self.id.clone());
        // The generation is the newest epoch a remaining member holds (Kafka takes the group
        // epoch before the departure that triggers the downgrade, the same for members that
        // had caught up): they keep committing with the generation they know until the
        // rebalance below gives them the next one.
        classic.generation_id = group
            .members
            .values()
            .map(|m| m.value.member_epoch)
            .max()
            .unwrap_or(group.group_epoch);
        for (member_id, m) in &group.members {
            let Some(meta) = &m.value.classic else {
                continue;
            };
            let join_seq = classic.next_join_seq();
            classic.add(Member {
                member_id: member_id.clone(),
                group_instance_id: m.value.instance_id.clone(),
                client_id: m.value.client_id.clone(),
                client_host: m.value.client_host.clone(),
                rebalance_timeout_ms: m.value.rebalance_timeout_ms,
                session_timeout_ms: meta.session_timeout_ms,
                protocol_type: CONSUMER_PROTOCOL_TYPE.to_string(),
                protocols: meta
                    .protocols
                    .iter()
                    .map(|p| crate::api::Protocol::new(p.name.clone(), p.metadata.clone()))
                    .collect(),
                // Each member starts from its target, as Kafka's conversion does; the rebalance
                // below then lets the classic protocol take over.
                assignment: assignment_bytes(&group, &m.value.target),
                awaiting_join: None,
                awaiting_sync: None,
                is_new: false,
                heartbeat_deadline: Some(now + millis(meta.session_timeout_ms)),
                join_seq,
            });
            changes.members.insert(member_id.clone());
        }
        classic.protocol_name = classic.select_protocol();
        classic.state = GroupState::Stable;
        classic.set_subscribed_topics();
        classic.offsets = std::mem::take(&mut self.offsets);
        classic.pending_offset_commits = std::mem::take(&mut self.pending_offset_commits);
        classic.pending_txn_offsets = std::mem::take(&mut self.pending_txn_offsets);
        let value = classic.metadata_value(None);
        tracing::info!(group = %self.id, generation = classic.generation_id,
            members = classic.members.len(), "downgrading the consumer group to a classic group");
        *self = classic;
        self.prepare_rebalance(
            cx,
            now,
            "downgrade from a consumer group to a classic group",
        );
        Some(value)
    }

    /// Writes a downgrade: tombstones for the consumer group's members and the classic
    /// group's metadata, which replaces the consumer group's under the same key.
    pub(crate) fn persist_downgrade(
        &mut self,
        cx: &mut Ctx<'_>,
        changes: Changes,
        value: GroupMetadataValue,
        answer: Option<(RequestToken, Response)>,
    ) {
        let mut bodies: Vec<RecordBody> = changes
            .members
            .into_iter()
            .map(|member_id| RecordBody::ConsumerMember {
                member_id,
                value: None,
            })
            .collect();
        bodies.push(RecordBody::GroupMetadata(value));
        cx.persist(
            &self.id,
            bodies,
            Pending::Consumer {
                group_id: self.id.clone(),
                waiters: answer.into_iter().collect(),
            },
        );
    }

    /// DescribeGroups' view of a consumer group's member: its subscription and assignment in
    /// the consumer protocol's bytes, as a classic member's would be.
    pub(crate) fn consumer_member_bytes(&self, member_id: &str) -> (Bytes, Bytes) {
        let Some(group) = self.consumer.as_ref() else {
            return (Bytes::new(), Bytes::new());
        };
        let Some(m) = group.members.get(member_id) else {
            return (Bytes::new(), Bytes::new());
        };
        let metadata = match m.value.classic.as_ref().and_then(|c| c.protocols.first()) {
            Some(p) => p.metadata.clone(),
            None => {
                let topics: Vec<&str> = m
                    .value
                    .subscribed_topic_names
                    .iter()
                    .map(String::as_str)
                    .collect();
                Bytes::from(encode_subscription(0, &topics, None))
            }
        };
        (metadata, assignment_bytes(group, &m.value.assigned))
    }
}
