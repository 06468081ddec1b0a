//! [`GroupsState`]: every group this coordinator hosts, the deadlines the caller must tick on,
//! and the writes whose completion gates responses.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use strata_core::TopicPartition;

use crate::api::{
    ConsumerGroupDescription, ConsumerHeartbeatRequest, ConsumerHeartbeatResponse,
    DeleteGroupsResponse, GroupDescription, HeartbeatRequest, HeartbeatResponse, JoinRequest,
    JoinResponse, LeaveRequest, LeaveResponse, ListedGroup, MemberDescription, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, Output, PersistId, PersistOutcome, Protocol, RequestToken, Response,
    SyncRequest, SyncResponse, TopicCatalog,
};
use crate::config::GroupConfig;
use crate::consumer::ConsumerGroup;
use crate::error::GroupError;
use crate::group::{Group, GroupState, StoredOffset};
use crate::ids::MemberIdGenerator;
use crate::offsets::unknown_offset;
use crate::record::{
    ConsumerGroupValue, ConsumerMemberValue, GroupMetadataValue, OffsetValue, PersistRecord,
    RecordBody,
};

/// What to do when a persist completes.
#[derive(Debug)]
pub(crate) enum Pending {
    /// Nothing waits on it (group metadata written when a group went Empty).
    Untracked,
    /// The leader's SyncGroup assignment for `generation`; the group's parked SyncGroups are
    /// answered on completion.
    Assignment {
        group_id: String,
        generation: i32,
        assignment: HashMap<String, Bytes>,
    },
    /// A static member took a new member id in a Stable group; its parked JoinGroup is answered
    /// on completion, and the replacement is undone if the write failed.
    StaticReplace {
        group_id: String,
        instance_id: String,
        old_member_id: String,
        new_member_id: String,
        old_protocols: Vec<Protocol>,
        old_rebalance_timeout_ms: i32,
        old_session_timeout_ms: i32,
        leader_before: Option<String>,
        supports_skip_assignment: bool,
    },
    /// Transactional offsets that become pending once durable (`txn_offsets.rs`).
    TxnOffsetCommit {
        group_id: String,
        token: RequestToken,
        producer_id: i64,
        staged: Vec<(TopicPartition, OffsetValue)>,
        results: Vec<(TopicPartition, Option<GroupError>)>,
    },
    /// A transaction's pending offsets of one group, made visible (or dropped) once durable.
    TxnEnd {
        group_id: String,
        token: RequestToken,
        producer_id: i64,
        commit: bool,
    },
    /// Offsets that become visible once durable, and the commit's answer.
    OffsetCommit {
        group_id: String,
        token: RequestToken,
        staged: Vec<(TopicPartition, OffsetValue)>,
        results: Vec<(TopicPartition, Option<GroupError>)>,
    },
    /// Deleted offsets, restored if the tombstones could not be written.
    OffsetDelete {
        group_id: String,
        token: RequestToken,
        response: OffsetDeleteResponse,
        removed: Vec<(TopicPartition, StoredOffset)>,
        removed_pending: Vec<(TopicPartition, u64)>,
    },
    /// A consumer group's write; `waiters` are the heartbeat answers it gates.
    Consumer {
        group_id: String,
        waiters: Vec<(RequestToken, Response)>,
    },
    /// Deleted groups, restored if the tombstones could not be written.
    DeleteGroups {
        token: RequestToken,
        response: DeleteGroupsResponse,
        removed: Vec<Group>,
    },
}

impl Pending {
    fn holds_token(&self) -> bool {
        if let Pending::Consumer { waiters, .. } = self {
            return !waiters.is_empty();
        }
        matches!(
            self,
            Pending::OffsetCommit { .. }
                | Pending::TxnOffsetCommit { .. }
                | Pending::TxnEnd { .. }
                | Pending::OffsetDelete { .. }
                | Pending::DeleteGroups { .. }
        )
    }
}

/// Everything a group operation may touch besides the group itself.
pub(crate) struct Ctx<'a> {
    pub config: &'a GroupConfig,
    pub ids: &'a mut Box<dyn MemberIdGenerator>,
    next_seq: &'a mut u64,
    pending: &'a mut HashMap<PersistId, Pending>,
    out: &'a mut Vec<Output>,
}

impl Ctx<'_> {
    pub fn respond(&mut self, token: RequestToken, response: Response) {
        self.out.push(Output::Respond { token, response });
    }

    /// Emits one atomic batch of records for `group_id` and remembers what waits on it.
    pub fn persist(
        &mut self,
        group_id: &str,
        bodies: Vec<RecordBody>,
        pending: Pending,
    ) -> PersistId {
        let records = bodies
            .into_iter()
            .map(|body| (group_id.to_string(), body))
            .collect();
        self.persist_records(records, pending)
    }

    pub fn pending_mut(&mut self, id: PersistId) -> Option<&mut Pending> {
        self.pending.get_mut(&id)
    }

    fn persist_records(
        &mut self,
        records: Vec<(String, RecordBody)>,
        pending: Pending,
    ) -> PersistId {
        let id = PersistId(*self.next_seq);
        *self.next_seq += 1;
        let records = records
            .into_iter()
            .map(|(group_id, body)| PersistRecord {
                seq: id.0,
                group_id,
                body,
            })
            .collect();
        self.out.push(Output::Persist { id, records });
        self.pending.insert(id, pending);
        id
    }
}

/// The coordinator for every classic group hosted here: a pure state machine driven by
/// requests, persist completions and time.
///
/// Each `handle_*` call takes the current monotonic time and a [`RequestToken`], and returns
/// [`Output`]s: responses to deliver (for this request or for earlier, parked ones) and record
/// batches to persist. Call [`GroupsState::tick`] whenever [`GroupsState::next_deadline`] has
/// passed, and [`GroupsState::persist_completed`] when a batch's write ends.
#[derive(Debug)]
pub struct GroupsState {
    config: GroupConfig,
    ids: Box<dyn MemberIdGenerator>,
    next_seq: u64,
    pending: HashMap<PersistId, Pending>,
    groups: HashMap<String, Group>,
    /// (earliest deadline, group id) for every group with a live timer.
    deadlines: BTreeSet<(Duration, String)>,
    indexed: HashMap<String, Duration>,
    /// Time never runs backwards inside the state machine, even if the caller's readings do.
    last_now: Duration,
}

impl GroupsState {
    /// An empty coordinator.
    pub fn new(config: GroupConfig, ids: Box<dyn MemberIdGenerator>) -> Self {
        Self {
            config,
            ids,
            next_seq: 1,
            pending: HashMap::new(),
            groups: HashMap::new(),
            deadlines: BTreeSet::new(),
            indexed: HashMap::new(),
            last_now: Duration::ZERO,
        }
    }

    /// A coordinator rebuilt from persisted records (in any order; only the newest record per
    /// [`crate::PersistKey`] matters). Members of rebuilt groups get one session timeout from
    /// `now` to reach this coordinator before they are expired.
    pub fn replay(
        config: GroupConfig,
        ids: Box<dyn MemberIdGenerator>,
        now: Duration,
        records: impl IntoIterator<Item = PersistRecord>,
    ) -> Self {
        let mut state = Self::new(config, ids);
        // A freshly built state parks no requests, so loading produces no responses; any
        // records it emits (an over-capacity group going Empty) are rewritten on the next
        // change, so dropping them loses nothing.
        let _ = state.load(now, records);
        state
    }

    /// Adds groups rebuilt from `records` (for example when this broker takes over more
    /// groups). Groups already hosted that the records mention are replaced; their parked
    /// requests are answered NOT_COORDINATOR.
    pub fn load(
        &mut self,
        now: Duration,
        records: impl IntoIterator<Item = PersistRecord>,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut records: Vec<PersistRecord> = records.into_iter().collect();
        records.sort_by_key(|r| r.seq);
        #[derive(Default)]
        struct Loaded {
            metadata: Option<GroupMetadataValue>,
            consumer: Option<ConsumerGroupValue>,
            consumer_members: BTreeMap<String, ConsumerMemberValue>,
            offsets: BTreeMap<TopicPartition, StoredOffset>,
            txn_offsets: BTreeMap<i64, BTreeMap<TopicPartition, OffsetValue>>,
        }
        let mut loaded: BTreeMap<String, Loaded> = BTreeMap::new();
        let mut max_seq = 0;
        for record in records {
            max_seq = max_seq.max(record.seq);
            let entry = loaded.entry(record.group_id).or_default();
            match record.body {
                RecordBody::GroupMetadata(value) => {
                    entry.metadata = Some(value);
                    entry.consumer = None;
                    entry.consumer_members.clear();
                }
                RecordBody::GroupTombstone => {
                    entry.metadata = None;
                    entry.consumer = None;
                    entry.consumer_members.clear();
                }
                RecordBody::ConsumerGroupMetadata(value) => {
                    entry.metadata = None;
                    entry.consumer = Some(value);
                }
                RecordBody::ConsumerMember { member_id, value } => match value {
                    Some(value) => {
                        entry.consumer_members.insert(member_id, value);
                    }
                    None => {
                        entry.consumer_members.remove(&member_id);
                    }
                },
                RecordBody::Offset { partition, value } => {
                    entry.offsets.insert(
                        partition,
                        StoredOffset {
                            value,
                            seq: record.seq,
                        },
                    );
                }
                RecordBody::OffsetTombstone { partition } => {
                    entry.offsets.remove(&partition);
                }
                RecordBody::TxnOffset {
                    producer_id,
                    partition,
                    value,
                } => {
                    let pending = entry.txn_offsets.entry(producer_id).or_default();
                    match value {
                        Some(v) => {
                            pending.insert(partition, v);
                        }
                        None => {
                            pending.remove(&partition);
                        }
                    }
                    if pending.is_empty() {
                        entry.txn_offsets.remove(&producer_id);
                    }
                }
            }
        }
        // Sequence numbers continue past everything already written, so this coordinator's
        // records always sort after its predecessors'.
        self.next_seq = self.next_seq.max(max_seq.saturating_add(1));
        let replaced: Vec<String> = loaded
            .keys()
            .filter(|id| self.groups.contains_key(*id))
            .cloned()
            .collect();
        let mut out = self.unload(&replaced);
        for (group_id, entry) in loaded {
            if entry.metadata.is_none()
                && entry.consumer.is_none()
                && entry.offsets.is_empty()
                && entry.txn_offsets.is_empty()
            {
                continue;
            }
            let mut group = Group::from_record(group_id.clone(), entry.metadata);
            group.offsets = entry.offsets;
            group.pending_txn_offsets = entry.txn_offsets;
            match entry.consumer {
                Some(value) => {
                    group.consumer = Some(ConsumerGroup::from_records(
                        value,
                        entry.consumer_members,
                        now,
                        self.config.consumer_session_timeout,
                    ));
                }
                None if !entry.consumer_members.is_empty() => {
                    tracing::warn!(group = %group_id, members = entry.consumer_members.len(),
                        "consumer-group members without group metadata ignored");
                }
                None => {}
            }
            match &group.consumer {
                Some(c) => tracing::info!(group = %group_id, group_epoch = c.group_epoch,
                    members = c.members.len(), offsets = group.offsets.len(),
                    "loaded consumer group"),
                None => tracing::info!(group = %group_id, generation = group.generation_id,
                    members = group.members.len(), offsets = group.offsets.len(), "loaded group"),
            }
            self.groups.insert(group_id.clone(), group);
            self.with_group(&group_id, now, &mut out, |group, cx| {
                group.on_loaded(cx, now)
            });
        }
        out
    }

    /// Stops hosting the groups (ownership moved elsewhere): parked requests are answered
    /// NOT_COORDINATOR so their clients go find the new coordinator.
    pub fn unload(&mut self, group_ids: &[String]) -> Vec<Output> {
        let mut out = Vec::new();
        for group_id in group_ids {
            let Some(mut group) = self.groups.remove(group_id) else {
                continue;
            };
            self.unindex(group_id);
            let (_, mut cx) = self.split(&mut out);
            group.fail_all_parked(&mut cx, GroupError::NotCoordinator);
            tracing::info!(group = %group_id, generation = group.generation_id, "unloaded group");
        }
        out
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// JoinGroup. The response usually comes later, when the rebalance completes. `catalog`
    /// resolves topics when a classic member joins a consumer group (online migration).
    pub fn handle_join(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: JoinRequest,
        catalog: &dyn TopicCatalog,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let group_id = req.group_id.clone();
        self.fire_group(&group_id, now, &mut out);
        let reject = |out: &mut Vec<Output>, error: GroupError, member_id: String| {
            out.push(Output::Respond {
                token,
                response: Response::Join(JoinResponse::error(member_id, error)),
            });
        };
        if group_id.is_empty() {
            reject(&mut out, GroupError::InvalidGroupId, req.member_id);
            return out;
        }
        let session_ms = i64::from(req.session_timeout_ms);
        if session_ms < duration_ms(self.config.min_session_timeout)
            || session_ms > duration_ms(self.config.max_session_timeout)
        {
            reject(&mut out, GroupError::InvalidSessionTimeout, req.member_id);
            return out;
        }
        if !self.groups.contains_key(&group_id) {
            // Only a member without an id may create a group; a known id for a group that does
            // not exist (any more) must start over.
            if !req.member_id.is_empty() {
                reject(&mut out, GroupError::UnknownMemberId, req.member_id);
                return out;
            }
            self.groups
                .insert(group_id.clone(), Group::new(group_id.clone()));
        }
        if let Some(group) = self.groups.get_mut(&group_id) {
            if group.has_consumer_members() {
                // A classic member joins a live consumer group and speaks its own protocol
                // there (`migration.rs`), as in Kafka 4.
                self.with_group(&group_id, now, &mut out, |group, cx| {
                    group.classic_join_to_consumer(cx, now, token, req, catalog)
                });
                return out;
            }
            // An empty consumer group becomes a classic one with its first classic member.
            group.consumer = None;
        }
        self.with_group(&group_id, now, &mut out, |group, cx| {
            group.handle_join(cx, now, token, req)
        });
        out
    }

    /// SyncGroup. Followers' responses are parked until the leader's assignment is durable.
    pub fn handle_sync(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: SyncRequest,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let group_id = req.group_id.clone();
        let error = if group_id.is_empty() {
            Some(GroupError::InvalidGroupId)
        } else if !self.groups.contains_key(&group_id) {
            Some(GroupError::UnknownMemberId)
        } else {
            None
        };
        match error {
            Some(error) => out.push(Output::Respond {
                token,
                response: Response::Sync(SyncResponse::error(error)),
            }),
            None => {
                self.with_group(&group_id, now, &mut out, |group, cx| {
                    if group.consumer.is_some() {
                        group.classic_sync_to_consumer(cx, now, token, req)
                    } else {
                        group.handle_sync(cx, now, token, req)
                    }
                });
            }
        }
        out
    }

    /// Heartbeat. Always answered immediately.
    pub fn handle_heartbeat(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: HeartbeatRequest,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let error = if req.group_id.is_empty() {
            Some(GroupError::InvalidGroupId)
        } else {
            self.with_group(&req.group_id, now, &mut out, |group, _| {
                if group.consumer.is_some() {
                    group.classic_heartbeat_to_consumer(
                        now,
                        &req.member_id,
                        req.group_instance_id.as_deref(),
                        req.generation_id,
                    )
                } else {
                    group.handle_heartbeat(now, &req)
                }
            })
            .unwrap_or(Some(GroupError::UnknownMemberId))
        };
        out.push(Output::Respond {
            token,
            response: Response::Heartbeat(HeartbeatResponse { error }),
        });
        out
    }

    /// LeaveGroup, for one or many members. Always answered immediately (removing members
    /// may also complete a rebalance and answer other members' parked requests).
    pub fn handle_leave(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: LeaveRequest,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let response = if req.group_id.is_empty() {
            LeaveResponse {
                error: Some(GroupError::InvalidGroupId),
                members: Vec::new(),
            }
        } else {
            let group_id = req.group_id.clone();
            let members = req.members;
            let missing: Vec<_> = members
                .iter()
                .map(|m| crate::api::LeftMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    error: Some(GroupError::UnknownMemberId),
                })
                .collect();
            let results = self
                .with_group(&group_id, now, &mut out, |group, cx| {
                    if group.consumer.is_some() {
                        group.classic_leave_to_consumer(cx, now, members)
                    } else {
                        group.handle_leave(cx, now, members)
                    }
                })
                .unwrap_or(missing);
            LeaveResponse {
                error: None,
                members: results,
            }
        };
        out.push(Output::Respond {
            token,
            response: Response::Leave(response),
        });
        out
    }

    /// ConsumerGroupHeartbeat (KIP-848). Answered once what it changed is durable. `catalog`
    /// resolves subscribed topic names to ids and partition counts.
    pub fn handle_consumer_heartbeat(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: ConsumerHeartbeatRequest,
        catalog: &dyn TopicCatalog,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let reject = |out: &mut Vec<Output>, error: GroupError, req: &ConsumerHeartbeatRequest| {
            out.push(Output::Respond {
                token,
                response: Response::ConsumerHeartbeat(ConsumerHeartbeatResponse::error(
                    error,
                    &req.member_id,
                    req.member_epoch,
                )),
            });
        };
        if let Err(error) = crate::consumer::validate(&req) {
            reject(&mut out, error, &req);
            return out;
        }
        let group_id = req.group_id.clone();
        self.fire_group(&group_id, now, &mut out);
        let mut upgrade = false;
        match self.groups.get(&group_id) {
            None if req.member_epoch != 0 => {
                reject(&mut out, GroupError::UnknownMemberId, &req);
                return out;
            }
            None => {
                self.groups
                    .insert(group_id.clone(), Group::new(group_id.clone()));
            }
            Some(group) if !group.accepts_consumer_protocol() => {
                // A classic group with members: a joining member converts it (online
                // upgrade, `migration.rs`) if the policy allows; otherwise, as in Kafka, the
                // group is not a consumer group.
                if req.member_epoch != 0 || !group.can_upgrade(&self.config) {
                    reject(&mut out, GroupError::GroupIdNotFound, &req);
                    return out;
                }
                upgrade = true;
            }
            Some(group) if group.consumer.is_none() && req.member_epoch != 0 => {
                reject(&mut out, GroupError::UnknownMemberId, &req);
                return out;
            }
            Some(_) => {}
        }
        self.with_group(&group_id, now, &mut out, |group, cx| {
            if upgrade {
                if let Err(error) = group.upgrade_to_consumer(cx, now, catalog) {
                    cx.respond(
                        token,
                        Response::ConsumerHeartbeat(ConsumerHeartbeatResponse::error(
                            error,
                            &req.member_id,
                            req.member_epoch,
                        )),
                    );
                    return;
                }
            }
            group.consumer_heartbeat(cx, now, token, req, catalog)
        });
        out
    }

    /// ConsumerGroupDescribe data for one group; GROUP_ID_NOT_FOUND unless it is a consumer
    /// group hosted here.
    pub fn describe_consumer_group(&self, group_id: &str) -> ConsumerGroupDescription {
        match self.groups.get(group_id).and_then(Group::describe_consumer) {
            Some(description) => description,
            None => ConsumerGroupDescription {
                group_id: group_id.to_string(),
                error: Some(GroupError::GroupIdNotFound),
                state: GroupState::Dead,
                group_epoch: -1,
                assignment_epoch: -1,
                assignor_name: String::new(),
                members: Vec::new(),
            },
        }
    }

    /// OffsetCommit. Answered once the offsets are durable (or at once if nothing is written).
    pub fn handle_offset_commit(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: OffsetCommitRequest,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let group_id = req.group_id.clone();
        if !self.groups.contains_key(&group_id) {
            if req.generation_id < 0 {
                // A consumer outside group management: the group exists to hold its offsets.
                self.groups
                    .insert(group_id.clone(), Group::new(group_id.clone()));
            } else {
                // A member of a generation this coordinator never saw.
                let partitions = req
                    .partitions
                    .into_iter()
                    .map(|p| (p.partition, Some(GroupError::IllegalGeneration)))
                    .collect();
                out.push(Output::Respond {
                    token,
                    response: Response::OffsetCommit(OffsetCommitResponse { partitions }),
                });
                return out;
            }
        }
        self.with_group(&group_id, now, &mut out, |group, cx| {
            group.handle_offset_commit(cx, now, token, req)
        });
        out
    }

    /// OffsetFetch for one group: committed offsets regardless of the group's state (simple
    /// consumers use offsets without group management). Unknown partitions get offset -1.
    pub fn offset_fetch(&self, req: &OffsetFetchRequest) -> OffsetFetchResponse {
        if let (Some(group), Some((member_id, epoch))) =
            (self.groups.get(&req.group_id), &req.member)
        {
            if let Some(error) = group.validate_consumer_fetch(member_id, *epoch) {
                return OffsetFetchResponse {
                    error: Some(error),
                    partitions: Vec::new(),
                };
            }
        }
        let partitions = match self.groups.get(&req.group_id) {
            Some(group) => group.fetch_offsets(req.partitions.as_deref(), req.require_stable),
            None => req
                .partitions
                .iter()
                .flatten()
                .map(|p| unknown_offset(p, None))
                .collect(),
        };
        OffsetFetchResponse {
            error: None,
            partitions,
        }
    }

    /// OffsetDelete. Answered once the tombstones are durable (or at once if there are none).
    pub fn handle_offset_delete(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: OffsetDeleteRequest,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let error = if req.group_id.is_empty() {
            Some(GroupError::InvalidGroupId)
        } else if !self.groups.contains_key(&req.group_id) {
            Some(GroupError::GroupIdNotFound)
        } else {
            None
        };
        match error {
            Some(error) => out.push(Output::Respond {
                token,
                response: Response::OffsetDelete(OffsetDeleteResponse {
                    error: Some(error),
                    partitions: Vec::new(),
                }),
            }),
            None => {
                let group_id = req.group_id;
                let partitions = req.partitions;
                self.with_group(&group_id, now, &mut out, |group, cx| {
                    group.handle_offset_delete(cx, token, partitions)
                });
            }
        }
        out
    }

    /// DeleteGroups: only Empty groups can go (NON_EMPTY_GROUP otherwise). Answered once the
    /// tombstones for the groups and all their offsets are durable.
    pub fn handle_delete_groups(
        &mut self,
        now: Duration,
        token: RequestToken,
        group_ids: Vec<String>,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut results = Vec::new();
        let mut removed = Vec::new();
        let mut records = Vec::new();
        for group_id in group_ids {
            if !seen.insert(group_id.clone()) {
                continue;
            }
            self.fire_group(&group_id, now, &mut out);
            let error = match self.groups.get(&group_id).map(Group::effective_state) {
                None => Some(GroupError::GroupIdNotFound),
                Some(GroupState::Empty) => None,
                Some(_) => Some(GroupError::NonEmptyGroup),
            };
            if error.is_none() {
                if let Some(group) = self.groups.remove(&group_id) {
                    self.unindex(&group_id);
                    // In-flight commits get tombstones too, so replay cannot resurrect them.
                    let partitions: BTreeSet<&TopicPartition> = group
                        .offsets
                        .keys()
                        .chain(group.pending_offset_commits.keys())
                        .collect();
                    for partition in partitions {
                        records.push((
                            group_id.clone(),
                            RecordBody::OffsetTombstone {
                                partition: partition.clone(),
                            },
                        ));
                    }
                    records.push((group_id.clone(), RecordBody::GroupTombstone));
                    tracing::info!(group = %group_id, offsets = group.offsets.len(), "deleting group");
                    removed.push(group);
                }
            }
            results.push((group_id, error));
        }
        let response = DeleteGroupsResponse { groups: results };
        if removed.is_empty() {
            out.push(Output::Respond {
                token,
                response: Response::DeleteGroups(response),
            });
        } else {
            let (_, mut cx) = self.split(&mut out);
            cx.persist_records(
                records,
                Pending::DeleteGroups {
                    token,
                    response,
                    removed,
                },
            );
        }
        out
    }

    /// DescribeGroups data for one group; an unknown group is reported Dead, as Kafka does.
    pub fn describe_group(&self, group_id: &str) -> GroupDescription {
        let Some(group) = self.groups.get(group_id) else {
            return GroupDescription {
                group_id: group_id.to_string(),
                state: GroupState::Dead,
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            };
        };
        if let Some(consumer) = group.describe_consumer() {
            // Kafka describes a consumer group through the classic API with its type and
            // state. Each member's subscription and assignment are given in the consumer
            // protocol's bytes (a classic member's own metadata), so tools that read them
            // show the assignment as for a classic group.
            return GroupDescription {
                group_id: group_id.to_string(),
                state: consumer.state,
                protocol_type: "consumer".to_string(),
                protocol: String::new(),
                members: consumer
                    .members
                    .into_iter()
                    .map(|m| {
                        let (metadata, assignment) = group.consumer_member_bytes(&m.member_id);
                        MemberDescription {
                            member_id: m.member_id,
                            group_instance_id: m.instance_id,
                            client_id: m.client_id,
                            client_host: m.client_host,
                            metadata,
                            assignment,
                        }
                    })
                    .collect(),
            };
        }
        let stable = group.state == GroupState::Stable;
        let protocol = if stable {
            group.protocol_name.clone().unwrap_or_default()
        } else {
            String::new()
        };
        let members = group
            .member_ids_in_join_order()
            .into_iter()
            .filter_map(|id| group.members.get(&id))
            .map(|m| MemberDescription {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: if stable {
                    m.metadata_for(&protocol)
                } else {
                    Bytes::new()
                },
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    Bytes::new()
                },
            })
            .collect();
        GroupDescription {
            group_id: group_id.to_string(),
            state: group.state,
            protocol_type: group.protocol_type.clone().unwrap_or_default(),
            protocol,
            members,
        }
    }

    /// ListGroups data, sorted by group id. An empty `states` filter lists every group.
    pub fn list_groups(&self, states: &[GroupState]) -> Vec<ListedGroup> {
        let mut groups: Vec<ListedGroup> = self
            .groups
            .values()
            .filter(|g| states.is_empty() || states.contains(&g.effective_state()))
            .map(|g| ListedGroup {
                group_id: g.id.clone(),
                group_type: if g.consumer.is_some() {
                    "consumer"
                } else {
                    "classic"
                },
                protocol_type: if g.consumer.is_some() {
                    "consumer".to_string()
                } else {
                    g.protocol_type.clone().unwrap_or_default()
                },
                state: g.effective_state(),
            })
            .collect();
        groups.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        groups
    }

    /// The group's state, if it is hosted here.
    pub fn group_state(&self, group_id: &str) -> Option<GroupState> {
        self.groups.get(group_id).map(Group::effective_state)
    }

    /// The group's current generation, if it is hosted here.
    pub fn generation(&self, group_id: &str) -> Option<i32> {
        self.groups.get(group_id).map(|g| g.generation_id)
    }

    /// The group's leader, if it has one.
    pub fn leader(&self, group_id: &str) -> Option<String> {
        self.groups.get(group_id).and_then(|g| g.leader_id.clone())
    }

    /// How many requests are parked (waiting for a rebalance, an assignment or a persist).
    /// Every parked request is answered eventually; this is for metrics and leak tests.
    pub fn parked_requests(&self) -> usize {
        let in_groups: usize = self.groups.values().map(Group::parked_requests).sum();
        in_groups + self.pending.values().filter(|p| p.holds_token()).count()
    }

    /// The outcome of a [`Output::Persist`]; releases (or fails) the responses it gated.
    pub fn persist_completed(
        &mut self,
        now: Duration,
        id: PersistId,
        outcome: PersistOutcome,
    ) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let Some(pending) = self.pending.remove(&id) else {
            tracing::debug!(?id, "completion for an unknown persist");
            return out;
        };
        let failure = match outcome {
            PersistOutcome::Durable => None,
            PersistOutcome::Failed(failure) => Some(failure.as_error()),
        };
        match pending {
            Pending::Untracked => {
                if let Some(error) = failure {
                    tracing::warn!(?id, %error, "failed to persist group metadata");
                }
            }
            Pending::Assignment {
                group_id,
                generation,
                assignment,
            } => {
                self.with_group(&group_id, now, &mut out, |group, cx| {
                    group.on_assignment_persisted(cx, now, generation, &assignment, failure)
                });
            }
            Pending::StaticReplace {
                group_id,
                instance_id,
                old_member_id,
                new_member_id,
                old_protocols,
                old_rebalance_timeout_ms,
                old_session_timeout_ms,
                leader_before,
                supports_skip_assignment,
            } => {
                self.with_group(&group_id, now, &mut out, |group, cx| {
                    group.on_static_replace_persisted(
                        cx,
                        now,
                        failure,
                        &instance_id,
                        &old_member_id,
                        &new_member_id,
                        old_protocols,
                        old_rebalance_timeout_ms,
                        old_session_timeout_ms,
                        leader_before,
                        supports_skip_assignment,
                    )
                });
            }
            Pending::TxnOffsetCommit {
                group_id,
                token,
                producer_id,
                staged,
                results,
            } => {
                if failure.is_none() {
                    // A group created only to hold these offsets is trivial, and dropped, until
                    // they are applied.
                    self.ensure_group(&group_id);
                    self.with_group(&group_id, now, &mut out, |group, _| {
                        group.apply_txn_offsets(producer_id, staged)
                    });
                }
                let partitions = results
                    .into_iter()
                    .map(|(partition, error)| (partition, error.or(failure)))
                    .collect();
                out.push(Output::Respond {
                    token,
                    response: Response::OffsetCommit(OffsetCommitResponse { partitions }),
                });
            }
            Pending::TxnEnd {
                group_id,
                token,
                producer_id,
                commit,
            } => {
                if failure.is_none() {
                    self.with_group(&group_id, now, &mut out, |group, _| {
                        group.end_txn_offsets(id.0, producer_id, commit)
                    });
                }
                out.push(Output::Respond {
                    token,
                    response: Response::TxnEnd(failure),
                });
            }
            Pending::OffsetCommit {
                group_id,
                token,
                staged,
                results,
            } => {
                self.with_group(&group_id, now, &mut out, |group, _| match failure {
                    None => group.apply_committed(id.0, staged),
                    Some(_) => group.fail_pending_commits(id.0, &staged),
                });
                let partitions = results
                    .into_iter()
                    .map(|(partition, error)| (partition, error.or(failure)))
                    .collect();
                out.push(Output::Respond {
                    token,
                    response: Response::OffsetCommit(OffsetCommitResponse { partitions }),
                });
            }
            Pending::OffsetDelete {
                group_id,
                token,
                response,
                removed,
                removed_pending,
            } => {
                let response = match failure {
                    None => response,
                    Some(error) => {
                        let in_flight: HashSet<u64> = self.pending.keys().map(|id| id.0).collect();
                        let group = self
                            .groups
                            .entry(group_id.clone())
                            .or_insert_with(|| Group::new(group_id.clone()));
                        for (partition, stored) in removed {
                            group.offsets.entry(partition).or_insert(stored);
                        }
                        // A commit that finished meanwhile was not applied (its partition was
                        // deleted); only still-running ones get their pending mark back.
                        for (partition, seq) in removed_pending {
                            if in_flight.contains(&seq) {
                                group.pending_offset_commits.entry(partition).or_insert(seq);
                            }
                        }
                        self.settle(&group_id);
                        OffsetDeleteResponse {
                            error: Some(error),
                            partitions: Vec::new(),
                        }
                    }
                };
                out.push(Output::Respond {
                    token,
                    response: Response::OffsetDelete(response),
                });
            }
            Pending::Consumer { group_id, waiters } => {
                if let Some(group) = self.groups.get_mut(&group_id) {
                    group.on_consumer_persisted(id.0, failure.is_some());
                }
                self.settle(&group_id);
                for (token, response) in waiters {
                    let response = match (failure, response) {
                        (Some(error), Response::ConsumerHeartbeat(r)) => {
                            Response::ConsumerHeartbeat(ConsumerHeartbeatResponse::error(
                                error,
                                r.member_id.as_deref().unwrap_or_default(),
                                r.member_epoch,
                            ))
                        }
                        (Some(error), Response::Join(r)) => {
                            Response::Join(JoinResponse::error(r.member_id, error))
                        }
                        (Some(error), Response::Sync(_)) => {
                            Response::Sync(SyncResponse::error(error))
                        }
                        (_, response) => response,
                    };
                    out.push(Output::Respond { token, response });
                }
            }
            Pending::DeleteGroups {
                token,
                mut response,
                removed,
            } => {
                if let Some(error) = failure {
                    let in_flight: HashSet<u64> = self.pending.keys().map(|id| id.0).collect();
                    for mut group in removed {
                        let group_id = group.id.clone();
                        if self.groups.contains_key(&group_id) {
                            // Recreated meanwhile; the new incarnation wins.
                            continue;
                        }
                        group
                            .pending_offset_commits
                            .retain(|_, seq| in_flight.contains(seq));
                        self.groups.insert(group_id.clone(), group);
                        self.settle(&group_id);
                    }
                    for (_, result) in response.groups.iter_mut() {
                        if result.is_none() {
                            *result = Some(error);
                        }
                    }
                }
                out.push(Output::Respond {
                    token,
                    response: Response::DeleteGroups(response),
                });
            }
        }
        out
    }

    /// Fires every timer due at or before `now` (session and rebalance timeouts, the initial
    /// rebalance delay, pending-member and pending-sync expiry).
    pub fn tick(&mut self, now: Duration) -> Vec<Output> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let due: Vec<String> = self
            .deadlines
            .iter()
            .take_while(|(deadline, _)| *deadline <= now)
            .map(|(_, group_id)| group_id.clone())
            .collect();
        for group_id in due {
            self.with_group(&group_id, now, &mut out, |_, _| ());
        }
        out
    }

    /// The earliest time at which [`GroupsState::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.deadlines.iter().next().map(|(deadline, _)| *deadline)
    }

    // ----- internals -----

    fn advance(&mut self, now: Duration) -> Duration {
        if now > self.last_now {
            self.last_now = now;
        }
        self.last_now
    }

    fn split<'a>(
        &'a mut self,
        out: &'a mut Vec<Output>,
    ) -> (&'a mut HashMap<String, Group>, Ctx<'a>) {
        let Self {
            config,
            ids,
            next_seq,
            pending,
            groups,
            ..
        } = self;
        (
            groups,
            Ctx {
                config,
                ids,
                next_seq,
                pending,
                out,
            },
        )
    }

    /// Runs `f` on the group with its timers brought up to `now` before and after (an event
    /// at `now` happens after everything due by then, and a timer it sets for `now` fires at
    /// once), then drops the group if nothing is left of it and re-indexes its deadline.
    /// Creates an Empty group `group_id` unless it exists (`txn_offsets.rs`).
    pub(crate) fn ensure_group(&mut self, group_id: &str) {
        if !self.groups.contains_key(group_id) {
            self.groups
                .insert(group_id.to_string(), Group::new(group_id.to_string()));
        }
    }

    pub(crate) fn groups_iter(&self) -> impl Iterator<Item = &Group> {
        self.groups.values()
    }

    /// [`Self::with_group`] at `now` for the other modules of the crate.
    pub(crate) fn with_group_at<R>(
        &mut self,
        group_id: &str,
        now: Duration,
        out: &mut Vec<Output>,
        f: impl FnOnce(&mut Group, &mut Ctx<'_>) -> R,
    ) -> Option<R> {
        let now = self.advance(now);
        self.with_group(group_id, now, out, f)
    }

    fn with_group<R>(
        &mut self,
        group_id: &str,
        now: Duration,
        out: &mut Vec<Output>,
        f: impl FnOnce(&mut Group, &mut Ctx<'_>) -> R,
    ) -> Option<R> {
        let result = {
            let (groups, mut cx) = self.split(out);
            let group = groups.get_mut(group_id)?;
            group.fire_due(&mut cx, now);
            let result = f(group, &mut cx);
            group.fire_due(&mut cx, now);
            result
        };
        self.settle(group_id);
        Some(result)
    }

    fn fire_group(&mut self, group_id: &str, now: Duration, out: &mut Vec<Output>) {
        self.with_group(group_id, now, out, |_, _| ());
    }

    fn settle(&mut self, group_id: &str) {
        let trivial = self.groups.get(group_id).is_some_and(Group::is_trivial);
        if trivial {
            // Kafka keeps such groups until its periodic cleanup; without that task here, a
            // failed first JoinGroup would otherwise leave an empty shell behind forever.
            self.groups.remove(group_id);
        }
        self.unindex(group_id);
        if let Some(deadline) = self
            .groups
            .get_mut(group_id)
            .and_then(Group::earliest_deadline)
        {
            self.indexed.insert(group_id.to_string(), deadline);
            self.deadlines.insert((deadline, group_id.to_string()));
        }
    }

    fn unindex(&mut self, group_id: &str) {
        if let Some(deadline) = self.indexed.remove(group_id) {
            self.deadlines.remove(&(deadline, group_id.to_string()));
        }
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
