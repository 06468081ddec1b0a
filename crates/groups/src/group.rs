//! One classic group: its members, its generation, and the rebalance machinery that Kafka's
//! GroupCoordinator spreads over GroupMetadata, the rebalance purgatory (DelayedJoin,
//! InitialDelayedJoin, DelayedSync) and the heartbeat purgatory (DelayedHeartbeat).
//!
//! Kafka's purgatories become deadlines stored on the group and its members. A timer "fires"
//! when [`Group::fire_due`] is given a time at or past its deadline, and it fires *at its
//! deadline*: anything it schedules counts from then, so a late tick replays exactly the
//! sequence of expirations a real-time timer wheel would have produced.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use strata_core::TopicPartition;

use crate::api::{JoinMember, JoinResponse, Protocol, RequestToken, Response, SyncResponse};
use crate::consumer::ConsumerGroup;
use crate::error::GroupError;
use crate::record::{GroupMetadataValue, OffsetValue, PersistedMember, RecordBody};
use crate::state::{Ctx, Pending};
use crate::subscription::subscribed_topics;

/// The consumer protocol type; only its metadata is parsed (for OffsetDelete).
pub(crate) const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

/// Upper bound on timer firings per call: a safety valve against a pathological timer cascade
/// (for example members asking for a zero rebalance timeout) stalling the caller's event loop.
const MAX_FIRINGS_PER_CALL: usize = 100_000;

/// A classic group's state, spelled as Kafka spells it in DescribeGroups and ListGroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupState {
    /// No members; the group may still hold committed offsets.
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Assignment distributed; members heartbeat.
    Stable,
    /// Deleted or not hosted here.
    Dead,
    /// KIP-848 consumer groups only: the group epoch moved past the target assignment's.
    Assigning,
    /// KIP-848 consumer groups only: members are still moving to their target assignment.
    Reconciling,
}

impl GroupState {
    pub fn as_str(&self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
            GroupState::Assigning => "Assigning",
            GroupState::Reconciling => "Reconciling",
        }
    }

    /// Parses a state name case-insensitively, as ListGroups' states filter does.
    pub fn parse(name: &str) -> Option<GroupState> {
        [
            GroupState::Empty,
            GroupState::PreparingRebalance,
            GroupState::CompletingRebalance,
            GroupState::Stable,
            GroupState::Dead,
            GroupState::Assigning,
            GroupState::Reconciling,
        ]
        .into_iter()
        .find(|state| state.as_str().eq_ignore_ascii_case(name))
    }

    fn valid_previous_states(self) -> &'static [GroupState] {
        use GroupState::*;
        match self {
            Empty => &[PreparingRebalance],
            PreparingRebalance => &[Stable, CompletingRebalance, Empty],
            CompletingRebalance => &[PreparingRebalance],
            Stable => &[CompletingRebalance],
            Dead => &[Stable, PreparingRebalance, CompletingRebalance, Empty, Dead],
            // Consumer-group states are derived, never transitioned to.
            Assigning | Reconciling => &[],
        }
    }
}

impl fmt::Display for GroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A committed offset and the sequence number of the record that made it durable; the sequence
/// decides which of two racing commits wins, as the log position does in Kafka.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredOffset {
    pub value: OffsetValue,
    pub seq: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<Protocol>,
    pub assignment: Bytes,
    /// The parked JoinGroup, answered when the rebalance completes.
    pub awaiting_join: Option<RequestToken>,
    /// The parked SyncGroup, answered when the leader's assignment is durable.
    pub awaiting_sync: Option<RequestToken>,
    /// Joined but not yet through a completed rebalance: such a member is expired by the
    /// new-member join timeout even while it waits in a rebalance.
    pub is_new: bool,
    pub heartbeat_deadline: Option<Duration>,
    /// Join order: Kafka's "first member to join leads" and every member listing follow it.
    pub join_seq: u64,
}

impl Member {
    pub fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|p| p.name == protocol)
            .map(|p| p.metadata.clone())
            .unwrap_or_default()
    }

    /// Kafka's `hasSatisfiedHeartbeat`: a member parked in a rebalance is alive by definition
    /// (the rebalance and sync timeouts police it instead), unless it is brand new.
    fn has_satisfied_heartbeat(&self) -> bool {
        !self.is_new && (self.awaiting_join.is_some() || self.awaiting_sync.is_some())
    }

    fn session_timeout(&self) -> Duration {
        millis(self.session_timeout_ms.into())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum JoinTimer {
    /// InitialDelayedJoin: the first rebalance of an Empty group. Never completes early; at its
    /// deadline it extends itself by another delay if new members arrived, until the group's
    /// rebalance timeout is used up.
    Initial {
        deadline: Duration,
        configured_delay_ms: i64,
        delay_ms: i64,
        remaining_ms: i64,
    },
    /// DelayedJoin: completes as soon as every member has rejoined, or at the deadline.
    Regular { deadline: Duration },
}

impl JoinTimer {
    fn deadline(&self) -> Duration {
        match self {
            JoinTimer::Initial { deadline, .. } | JoinTimer::Regular { deadline } => *deadline,
        }
    }
}

/// DelayedSync: members that do not send SyncGroup within the rebalance timeout after the join
/// completed are removed, and the group rebalances without them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SyncTimer {
    deadline: Duration,
    generation: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Due {
    PendingMember(String),
    Heartbeat(String),
    Join,
    Sync,
    ConsumerMember(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader_id: Option<String>,
    pub members: HashMap<String, Member>,
    /// group.instance.id → the member id currently holding it.
    pub static_members: HashMap<String, String>,
    /// KIP-394 member ids handed out with MEMBER_ID_REQUIRED, with their expiry.
    pub pending_members: HashMap<String, Duration>,
    /// Members that have not sent SyncGroup since the last completed join.
    pub pending_sync: HashSet<String>,
    /// protocol name → number of members supporting it.
    supported_protocols: HashMap<String, usize>,
    /// Set when a member joins during the first (generation 0) rebalance, which lets the initial
    /// delay extend itself.
    new_member_added: bool,
    join_timer: Option<JoinTimer>,
    sync_timer: Option<SyncTimer>,
    /// Topics the current generation consumes (consumer protocol only); `None` = unknown, which
    /// OffsetDelete treats as "subscribed to everything".
    subscribed_topics: Option<BTreeSet<String>>,
    pub offsets: BTreeMap<TopicPartition, StoredOffset>,
    /// Partitions with a commit being written → sequence number of the newest such commit.
    pub pending_offset_commits: HashMap<TopicPartition, u64>,
    /// Offsets committed inside open transactions, by producer id (`txn_offsets.rs`).
    pub pending_txn_offsets: BTreeMap<i64, BTreeMap<TopicPartition, OffsetValue>>,
    next_join_seq: u64,
    /// Set while the group is a KIP-848 consumer group (see `consumer.rs`); the classic state
    /// above then stays Empty.
    pub consumer: Option<ConsumerGroup>,
}

pub(crate) fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Group {
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            state: GroupState::Empty,
            generation_id: 0,
            protocol_type: None,
            protocol_name: None,
            leader_id: None,
            members: HashMap::new(),
            static_members: HashMap::new(),
            pending_members: HashMap::new(),
            pending_sync: HashSet::new(),
            supported_protocols: HashMap::new(),
            new_member_added: false,
            join_timer: None,
            sync_timer: None,
            subscribed_topics: None,
            offsets: BTreeMap::new(),
            pending_offset_commits: HashMap::new(),
            pending_txn_offsets: BTreeMap::new(),
            next_join_seq: 0,
            consumer: None,
        }
    }

    /// Rebuilds a group from its newest metadata record (Kafka's `GroupMetadata.loadGroup`):
    /// Stable if it has members, else Empty. Members only know the selected protocol, since
    /// that is all the record keeps.
    pub fn from_record(id: impl Into<String>, value: Option<GroupMetadataValue>) -> Self {
        let mut group = Group::new(id);
        let Some(value) = value else {
            return group;
        };
        group.generation_id = value.generation_id;
        group.protocol_type = value.protocol_type.filter(|t| !t.is_empty());
        let stored_protocol_type = group.protocol_type.clone();
        group.protocol_name = value.protocol_name;
        let protocol_name = match &group.protocol_name {
            Some(name) => name.clone(),
            None => {
                if !value.members.is_empty() {
                    tracing::warn!(group = %group.id,
                        "stored group has members but no protocol; loading it without members");
                }
                return group;
            }
        };
        for stored in value.members {
            if group.members.contains_key(&stored.member_id) {
                continue;
            }
            let join_seq = group.next_join_seq();
            group.add(Member {
                member_id: stored.member_id,
                group_instance_id: stored.group_instance_id,
                client_id: stored.client_id,
                client_host: stored.client_host,
                rebalance_timeout_ms: stored.rebalance_timeout_ms,
                session_timeout_ms: stored.session_timeout_ms,
                protocol_type: group.protocol_type.clone().unwrap_or_default(),
                protocols: vec![Protocol {
                    name: protocol_name.clone(),
                    metadata: stored.subscription,
                }],
                assignment: stored.assignment,
                awaiting_join: None,
                awaiting_sync: None,
                is_new: false,
                heartbeat_deadline: None,
                join_seq,
            });
        }
        // `add` adopts the first member's protocol type; the record's own value is the truth.
        group.protocol_type = stored_protocol_type;
        if let Some(leader) = value.leader {
            if group.members.contains_key(&leader) {
                group.leader_id = Some(leader);
            }
        }
        if !group.members.is_empty() {
            group.state = GroupState::Stable;
        }
        group.set_subscribed_topics();
        group
    }

    /// Empties the classic part (members, rebalance, timers) when the group becomes a consumer
    /// group (`migration.rs`); offsets and the generation stay.
    pub fn reset_classic(&mut self) {
        self.state = GroupState::Empty;
        self.protocol_type = None;
        self.protocol_name = None;
        self.leader_id = None;
        self.members.clear();
        self.static_members.clear();
        self.pending_members.clear();
        self.pending_sync.clear();
        self.supported_protocols.clear();
        self.new_member_added = false;
        self.join_timer = None;
        self.sync_timer = None;
        self.subscribed_topics = None;
    }

    // ----- membership bookkeeping (Kafka's GroupMetadata) -----

    pub fn member_ids_in_join_order(&self) -> Vec<String> {
        let mut members: Vec<&Member> = self.members.values().collect();
        members.sort_by_key(|m| m.join_seq);
        members.into_iter().map(|m| m.member_id.clone()).collect()
    }

    fn first_member_in_join_order(&self, filter: impl Fn(&Member) -> bool) -> Option<String> {
        self.members
            .values()
            .filter(|m| filter(m))
            .min_by_key(|m| m.join_seq)
            .map(|m| m.member_id.clone())
    }

    pub fn is_leader(&self, member_id: &str) -> bool {
        self.leader_id.as_deref() == Some(member_id)
    }

    pub fn leader_or_empty(&self) -> String {
        self.leader_id.clone().unwrap_or_default()
    }

    pub fn num_awaiting_join(&self) -> usize {
        self.members
            .values()
            .filter(|m| m.awaiting_join.is_some())
            .count()
    }

    fn has_all_members_joined(&self) -> bool {
        self.members.len() == self.num_awaiting_join() && self.pending_members.is_empty()
    }

    pub fn new_member_added_during_initial_rebalance(&mut self) {
        self.new_member_added = true;
    }

    pub fn next_join_seq(&mut self) -> u64 {
        self.next_join_seq += 1;
        self.next_join_seq
    }

    /// The largest rebalance timeout among members, in milliseconds.
    pub fn rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
            .max(0)
    }

    fn inc_supported(counts: &mut HashMap<String, usize>, protocols: &[Protocol]) {
        for p in protocols {
            *counts.entry(p.name.clone()).or_insert(0) += 1;
        }
    }

    fn dec_supported(counts: &mut HashMap<String, usize>, protocols: &[Protocol]) {
        for p in protocols {
            if let Some(count) = counts.get_mut(&p.name) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(&p.name);
                }
            }
        }
    }

    /// Kafka's `supportsProtocols`: an Empty group takes any non-empty protocol set; otherwise
    /// the protocol type must match and at least one protocol must be supported by every member.
    pub fn supports_protocols(&self, protocol_type: &str, protocols: &[Protocol]) -> bool {
        if self.state == GroupState::Empty {
            !protocol_type.is_empty() && !protocols.is_empty()
        } else {
            self.protocol_type.as_deref() == Some(protocol_type)
                && protocols.iter().any(|p| {
                    self.supported_protocols.get(&p.name).copied().unwrap_or(0)
                        == self.members.len()
                })
        }
    }

    /// Kafka's `selectProtocol`: among protocols every member supports, each member votes for
    /// the first in its own preference order; most votes wins. Kafka leaves ties to hash order;
    /// here the protocol that received its first vote from the earliest-joined member wins, so
    /// the choice is deterministic.
    pub fn select_protocol(&self) -> Option<String> {
        let member_count = self.members.len();
        let candidates: HashSet<&str> = self
            .supported_protocols
            .iter()
            .filter(|(_, count)| **count == member_count)
            .map(|(name, _)| name.as_str())
            .collect();
        let mut members: Vec<&Member> = self.members.values().collect();
        members.sort_by_key(|m| m.join_seq);
        let mut votes: Vec<(&str, usize)> = Vec::new();
        for member in members {
            let Some(choice) = member
                .protocols
                .iter()
                .find(|p| candidates.contains(p.name.as_str()))
            else {
                continue;
            };
            match votes.iter_mut().find(|(name, _)| *name == choice.name) {
                Some((_, count)) => *count += 1,
                None => votes.push((choice.name.as_str(), 1)),
            }
        }
        let mut best: Option<(&str, usize)> = None;
        for (name, count) in votes {
            if best.is_none_or(|(_, best_count)| count > best_count) {
                best = Some((name, count));
            }
        }
        best.map(|(name, _)| name.to_string())
    }

    /// Every member's metadata for the selected protocol, for the leader's JoinGroup response.
    pub fn current_member_metadata(&self) -> Vec<JoinMember> {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let mut members: Vec<&Member> = self.members.values().collect();
        members.sort_by_key(|m| m.join_seq);
        members
            .into_iter()
            .map(|m| JoinMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                metadata: m.metadata_for(&protocol),
            })
            .collect()
    }

    pub fn add(&mut self, member: Member) {
        if let Some(instance_id) = &member.group_instance_id {
            self.static_members
                .insert(instance_id.clone(), member.member_id.clone());
        }
        if self.members.is_empty() {
            self.protocol_type = Some(member.protocol_type.clone());
        }
        if self.leader_id.is_none() {
            self.leader_id = Some(member.member_id.clone());
        }
        Self::inc_supported(&mut self.supported_protocols, &member.protocols);
        self.pending_members.remove(&member.member_id);
        self.members.insert(member.member_id.clone(), member);
    }

    /// Kafka's `GroupMetadata.remove`. Unlike Kafka, a parked request of the removed member is
    /// answered (UNKNOWN_MEMBER_ID) rather than dropped, so every token gets its one response.
    pub fn remove(&mut self, cx: &mut Ctx<'_>, member_id: &str) {
        if let Some(mut member) = self.members.remove(member_id) {
            Self::dec_supported(&mut self.supported_protocols, &member.protocols);
            if let Some(token) = member.awaiting_join.take() {
                cx.respond(
                    token,
                    Response::Join(JoinResponse::error("", GroupError::UnknownMemberId)),
                );
            }
            if let Some(token) = member.awaiting_sync.take() {
                cx.respond(
                    token,
                    Response::Sync(SyncResponse::error(GroupError::UnknownMemberId)),
                );
            }
            if let Some(instance_id) = &member.group_instance_id {
                if self.static_members.get(instance_id).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(instance_id);
                }
            }
        }
        if self.is_leader(member_id) {
            self.leader_id = self.first_member_in_join_order(|_| true);
        }
        self.pending_members.remove(member_id);
        self.pending_sync.remove(member_id);
    }

    /// Kafka's `updateMember`. A new parked JoinGroup supersedes an older one from the same
    /// member; the older one is answered REBALANCE_IN_PROGRESS (a retriable error that makes a
    /// still-listening client simply rejoin) instead of being dropped.
    pub fn update_member(
        &mut self,
        cx: &mut Ctx<'_>,
        member_id: &str,
        protocols: Vec<Protocol>,
        rebalance_timeout_ms: i32,
        session_timeout_ms: i32,
        token: Option<RequestToken>,
    ) {
        let Some(member) = self.members.get_mut(member_id) else {
            return;
        };
        Self::dec_supported(&mut self.supported_protocols, &member.protocols);
        member.protocols = protocols;
        Self::inc_supported(&mut self.supported_protocols, &member.protocols);
        member.rebalance_timeout_ms = rebalance_timeout_ms;
        member.session_timeout_ms = session_timeout_ms;
        match token {
            Some(token) => {
                if let Some(superseded) = member.awaiting_join.replace(token) {
                    cx.respond(
                        superseded,
                        Response::Join(JoinResponse::error(
                            member_id,
                            GroupError::RebalanceInProgress,
                        )),
                    );
                }
            }
            None => member.awaiting_join = None,
        }
    }

    /// Kafka's `replaceStaticMember`: the member object keeps its place (join order, leadership,
    /// assignment) under a new member id; requests parked under the old id are fenced.
    pub fn replace_static_member(
        &mut self,
        cx: &mut Ctx<'_>,
        instance_id: &str,
        old_member_id: &str,
        new_member_id: &str,
    ) -> bool {
        let Some(mut member) = self.members.remove(old_member_id) else {
            return false;
        };
        if let Some(token) = member.awaiting_join.take() {
            cx.respond(
                token,
                Response::Join(JoinResponse::error(
                    old_member_id,
                    GroupError::FencedInstanceId,
                )),
            );
        }
        if let Some(token) = member.awaiting_sync.take() {
            cx.respond(
                token,
                Response::Sync(SyncResponse::error(GroupError::FencedInstanceId)),
            );
        }
        member.member_id = new_member_id.to_string();
        self.members.insert(new_member_id.to_string(), member);
        if self.is_leader(old_member_id) {
            self.leader_id = Some(new_member_id.to_string());
        }
        self.static_members
            .insert(instance_id.to_string(), new_member_id.to_string());
        // Kafka leaves the old id in the pending-sync set, so the sync timeout would later
        // "remove" a member that no longer exists and force a needless rebalance.
        if self.pending_sync.remove(old_member_id) {
            self.pending_sync.insert(new_member_id.to_string());
        }
        true
    }

    /// Kafka's `validateCurrentMember`: an instance id must map to this member id (else
    /// FENCED_INSTANCE_ID, or UNKNOWN_MEMBER_ID if it maps to nothing), and the member id must
    /// exist.
    pub fn validate_current_member(
        &self,
        member_id: &str,
        group_instance_id: Option<&str>,
    ) -> Option<GroupError> {
        if let Some(instance_id) = group_instance_id {
            match self.static_members.get(instance_id) {
                Some(current) if current != member_id => {
                    return Some(GroupError::FencedInstanceId);
                }
                Some(_) => {}
                None => return Some(GroupError::UnknownMemberId),
            }
        }
        if !self.members.contains_key(member_id) {
            return Some(GroupError::UnknownMemberId);
        }
        None
    }

    /// Kafka's `isStaticMemberFenced`.
    pub fn is_static_member_fenced(
        &self,
        member_id: &str,
        group_instance_id: Option<&str>,
    ) -> bool {
        group_instance_id
            .and_then(|id| self.static_members.get(id))
            .is_some_and(|current| current != member_id)
    }

    /// Kafka's `completeAndScheduleNextExpiration`: the member has until `at + timeout` to show
    /// a sign of life.
    pub fn schedule_heartbeat(&mut self, member_id: &str, at: Duration, timeout: Duration) {
        if let Some(member) = self.members.get_mut(member_id) {
            member.heartbeat_deadline = Some(at + timeout);
        }
    }

    pub fn schedule_session_heartbeat(&mut self, member_id: &str, at: Duration) {
        if let Some(member) = self.members.get_mut(member_id) {
            member.heartbeat_deadline = Some(at + member.session_timeout());
        }
    }

    fn transition_to(&mut self, target: GroupState) {
        debug_assert!(
            target.valid_previous_states().contains(&self.state),
            "group {} cannot go from {} to {}",
            self.id,
            self.state,
            target
        );
        tracing::debug!(group = %self.id, from = %self.state, to = %target, "group state change");
        self.state = target;
    }

    pub fn is_subscribed_to_topic(&self, topic: &str) -> bool {
        if let Some(subscribed) = self.consumer_subscribes_to(topic) {
            return subscribed;
        }
        match &self.subscribed_topics {
            Some(topics) => topics.contains(topic),
            None => true,
        }
    }

    pub fn compute_subscribed_topics(&self) -> Option<BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some(CONSUMER_PROTOCOL_TYPE) {
            return None;
        }
        if self.members.is_empty() {
            return Some(BTreeSet::new());
        }
        let protocol = self.protocol_name.as_deref()?;
        let mut all = BTreeSet::new();
        for member in self.members.values() {
            let topics = subscribed_topics(&member.metadata_for(protocol));
            match topics {
                Some(topics) => all.extend(topics),
                None => {
                    tracing::warn!(group = %self.id, member = %member.member_id,
                        "unreadable consumer subscription; treating the group as subscribed to every topic");
                    return None;
                }
            }
        }
        Some(all)
    }

    pub fn set_subscribed_topics(&mut self) {
        self.subscribed_topics = self.compute_subscribed_topics();
    }

    /// The group's metadata record; `assignment` overrides the members' current assignments.
    pub fn metadata_value(
        &self,
        assignment: Option<&HashMap<String, Bytes>>,
    ) -> GroupMetadataValue {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let mut members: Vec<&Member> = self.members.values().collect();
        members.sort_by_key(|m| m.join_seq);
        GroupMetadataValue {
            protocol_type: self.protocol_type.clone(),
            generation_id: self.generation_id,
            protocol_name: self.protocol_name.clone(),
            leader: self.leader_id.clone(),
            members: members
                .into_iter()
                .map(|m| PersistedMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata_for(&protocol),
                    assignment: assignment
                        .and_then(|a| a.get(&m.member_id).cloned())
                        .unwrap_or_else(|| m.assignment.clone()),
                })
                .collect(),
        }
    }

    /// A group with nothing worth keeping: created by a request that then failed, or emptied of
    /// its last offsets before it ever had a generation.
    pub fn is_trivial(&self) -> bool {
        self.state == GroupState::Empty
            && self.generation_id == 0
            && self.members.is_empty()
            && self.pending_members.is_empty()
            && self.offsets.is_empty()
            && self.pending_offset_commits.is_empty()
            && self.pending_txn_offsets.is_empty()
            && self
                .consumer
                .as_ref()
                .is_none_or(|c| c.members.is_empty() && c.group_epoch == 0 && c.inflight.is_empty())
    }

    /// The state DescribeGroups and ListGroups report: the consumer group's when it is one.
    pub fn effective_state(&self) -> GroupState {
        match &self.consumer {
            Some(c) => c.state(),
            None => self.state,
        }
    }

    /// Answers every parked request with `error`; used when the group leaves this coordinator.
    pub fn fail_all_parked(&mut self, cx: &mut Ctx<'_>, error: GroupError) {
        for member_id in self.member_ids_in_join_order() {
            let Some(member) = self.members.get_mut(&member_id) else {
                continue;
            };
            if let Some(token) = member.awaiting_join.take() {
                cx.respond(
                    token,
                    Response::Join(JoinResponse::error(member_id.as_str(), error)),
                );
            }
            if let Some(token) = member.awaiting_sync.take() {
                cx.respond(token, Response::Sync(SyncResponse::error(error)));
            }
        }
    }

    pub fn parked_requests(&self) -> usize {
        self.members
            .values()
            .map(|m| {
                usize::from(m.awaiting_join.is_some()) + usize::from(m.awaiting_sync.is_some())
            })
            .sum()
    }

    // ----- the rebalance (Kafka's GroupCoordinator) -----

    pub fn maybe_prepare_rebalance(&mut self, cx: &mut Ctx<'_>, at: Duration, reason: &str) {
        if matches!(
            self.state,
            GroupState::Stable | GroupState::CompletingRebalance | GroupState::Empty
        ) {
            self.prepare_rebalance(cx, at, reason);
        }
    }

    pub fn prepare_rebalance(&mut self, cx: &mut Ctx<'_>, at: Duration, reason: &str) {
        // Members waiting for an assignment that will never come must rejoin instead.
        if self.state == GroupState::CompletingRebalance {
            self.reset_and_propagate_assignment_error(cx, at, GroupError::RebalanceInProgress);
        }
        self.pending_sync.clear();
        self.sync_timer = None;
        let rebalance_timeout_ms = self.rebalance_timeout_ms();
        self.join_timer = Some(if self.state == GroupState::Empty {
            let delay_ms = duration_ms(cx.config.initial_rebalance_delay);
            JoinTimer::Initial {
                deadline: at + millis(delay_ms),
                configured_delay_ms: delay_ms,
                delay_ms,
                remaining_ms: (rebalance_timeout_ms - delay_ms).max(0),
            }
        } else {
            JoinTimer::Regular {
                deadline: at + millis(rebalance_timeout_ms),
            }
        });
        self.transition_to(GroupState::PreparingRebalance);
        tracing::info!(group = %self.id, generation = self.generation_id, reason, "preparing to rebalance");
        self.try_complete_join(cx, at);
    }

    /// DelayedJoin's `tryComplete`: the join phase ends early once everyone (including pending
    /// KIP-394 members) has rejoined. The initial delay never ends early, by design.
    pub fn try_complete_join(&mut self, cx: &mut Ctx<'_>, at: Duration) {
        if self.state == GroupState::PreparingRebalance
            && matches!(self.join_timer, Some(JoinTimer::Regular { .. }))
            && self.has_all_members_joined()
        {
            self.on_complete_join(cx, at);
        }
    }

    fn on_join_timer(&mut self, cx: &mut Ctx<'_>, at: Duration) {
        match self.join_timer.take() {
            Some(JoinTimer::Initial {
                configured_delay_ms,
                delay_ms,
                remaining_ms,
                ..
            }) => {
                if self.new_member_added && remaining_ms != 0 {
                    // More members arrived during the delay: give stragglers another delay, but
                    // never more than the rebalance timeout in total.
                    self.new_member_added = false;
                    let next_delay_ms = configured_delay_ms.min(remaining_ms);
                    self.join_timer = Some(JoinTimer::Initial {
                        deadline: at + millis(next_delay_ms),
                        configured_delay_ms,
                        delay_ms: next_delay_ms,
                        remaining_ms: (remaining_ms - delay_ms).max(0),
                    });
                } else {
                    self.on_complete_join(cx, at);
                }
            }
            Some(JoinTimer::Regular { .. }) => self.on_complete_join(cx, at),
            None => {}
        }
    }

    /// Kafka's `onCompleteJoin`: drop dynamic members that did not rejoin, make sure a joined
    /// member leads, start the next generation and answer every parked JoinGroup.
    fn on_complete_join(&mut self, cx: &mut Ctx<'_>, at: Duration) {
        self.join_timer = None;
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        // Static members are kept: they may be restarting and are policed by their session
        // timeout instead (KIP-345).
        let missing: Vec<String> = self
            .member_ids_in_join_order()
            .into_iter()
            .filter(|id| {
                self.members
                    .get(id)
                    .is_some_and(|m| m.awaiting_join.is_none() && m.group_instance_id.is_none())
            })
            .collect();
        if !missing.is_empty() {
            tracing::info!(group = %self.id, ?missing, "removing dynamic members that did not rejoin");
        }
        for member_id in &missing {
            self.remove(cx, member_id);
        }

        if !self.maybe_elect_new_joined_leader() && !self.members.is_empty() {
            // Only static members that have not rejoined are left: wait another rebalance
            // timeout (at least a millisecond, so time always moves) for them or their sessions
            // to expire.
            tracing::warn!(group = %self.id, "could not complete rebalance because no members rejoined");
            let delay = millis(self.rebalance_timeout_ms()).max(Duration::from_millis(1));
            self.join_timer = Some(JoinTimer::Regular {
                deadline: at + delay,
            });
            return;
        }

        self.init_next_generation();
        if self.state == GroupState::Empty {
            tracing::info!(group = %self.id, generation = self.generation_id, "group is now empty");
            let value = self.metadata_value(None);
            cx.persist(
                &self.id,
                vec![RecordBody::GroupMetadata(value)],
                Pending::Untracked,
            );
            return;
        }
        tracing::info!(group = %self.id, generation = self.generation_id,
            members = self.members.len(), "stabilized group; waiting for the leader's assignment");
        let leader_members = self.current_member_metadata();
        let leader = self.leader_or_empty();
        for member_id in self.member_ids_in_join_order() {
            let response = JoinResponse {
                error: None,
                generation_id: self.generation_id,
                protocol_type: self.protocol_type.clone(),
                protocol_name: self.protocol_name.clone(),
                leader: leader.clone(),
                skip_assignment: false,
                member_id: member_id.clone(),
                members: if self.is_leader(&member_id) {
                    leader_members.clone()
                } else {
                    Vec::new()
                },
            };
            let Some(member) = self.members.get_mut(&member_id) else {
                continue;
            };
            if let Some(token) = member.awaiting_join.take() {
                cx.respond(token, Response::Join(response));
            }
            member.heartbeat_deadline = Some(at + member.session_timeout());
            member.is_new = false;
            self.pending_sync.insert(member_id);
        }
        self.sync_timer = Some(SyncTimer {
            deadline: at + millis(self.rebalance_timeout_ms()),
            generation: self.generation_id,
        });
    }

    /// Kafka's `maybeElectNewJoinedLeader`: a leader that did not rejoin hands over to the
    /// earliest-joined member that did.
    fn maybe_elect_new_joined_leader(&mut self) -> bool {
        if let Some(leader) = &self.leader_id {
            if self
                .members
                .get(leader)
                .is_some_and(|m| m.awaiting_join.is_some())
            {
                return true;
            }
        } else if self.members.is_empty() {
            return false;
        }
        match self.first_member_in_join_order(|m| m.awaiting_join.is_some()) {
            Some(new_leader) => {
                tracing::info!(group = %self.id, leader = %new_leader, "electing a rejoined member as leader");
                self.leader_id = Some(new_leader);
                true
            }
            None => false,
        }
    }

    fn init_next_generation(&mut self) {
        self.generation_id = self.generation_id.wrapping_add(1);
        if self.members.is_empty() {
            self.protocol_name = None;
            self.set_subscribed_topics();
            self.transition_to(GroupState::Empty);
        } else {
            let protocol = self.select_protocol();
            if protocol.is_none() {
                tracing::error!(group = %self.id, "no protocol is supported by every member");
            }
            self.protocol_name = Some(protocol.unwrap_or_default());
            self.set_subscribed_topics();
            self.transition_to(GroupState::CompletingRebalance);
        }
        self.pending_sync.clear();
    }

    pub fn reset_and_propagate_assignment_error(
        &mut self,
        cx: &mut Ctx<'_>,
        at: Duration,
        error: GroupError,
    ) {
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
        }
        self.propagate_assignment(cx, at, Some(error));
    }

    pub fn set_and_propagate_assignment(
        &mut self,
        cx: &mut Ctx<'_>,
        at: Duration,
        assignment: &HashMap<String, Bytes>,
    ) {
        for member in self.members.values_mut() {
            member.assignment = assignment
                .get(&member.member_id)
                .cloned()
                .unwrap_or_default();
        }
        self.propagate_assignment(cx, at, None);
    }

    fn propagate_assignment(&mut self, cx: &mut Ctx<'_>, at: Duration, error: Option<GroupError>) {
        let (protocol_type, protocol_name) = match error {
            None => (self.protocol_type.clone(), self.protocol_name.clone()),
            Some(_) => (None, None),
        };
        for member_id in self.member_ids_in_join_order() {
            let Some(member) = self.members.get_mut(&member_id) else {
                continue;
            };
            if let Some(token) = member.awaiting_sync.take() {
                cx.respond(
                    token,
                    Response::Sync(SyncResponse {
                        error,
                        protocol_type: protocol_type.clone(),
                        protocol_name: protocol_name.clone(),
                        assignment: member.assignment.clone(),
                    }),
                );
                // The member may have outlived its session while parked; it gets a fresh one.
                member.heartbeat_deadline = Some(at + member.session_timeout());
            }
        }
    }

    pub fn complete_stable_transition(&mut self) {
        self.transition_to(GroupState::Stable);
    }

    /// Kafka's `removeMemberAndUpdateGroup`.
    pub fn remove_member_and_update_group(
        &mut self,
        cx: &mut Ctx<'_>,
        at: Duration,
        member_id: &str,
        reason: &str,
    ) {
        self.remove(cx, member_id);
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.maybe_prepare_rebalance(cx, at, reason)
            }
            GroupState::PreparingRebalance => self.try_complete_join(cx, at),
            GroupState::Empty
            | GroupState::Dead
            | GroupState::Assigning
            | GroupState::Reconciling => {}
        }
    }

    /// Kafka's `removePendingMemberAndUpdateGroup`.
    pub fn remove_pending_member_and_update_group(
        &mut self,
        cx: &mut Ctx<'_>,
        at: Duration,
        member_id: &str,
    ) {
        self.pending_members.remove(member_id);
        if self.state == GroupState::PreparingRebalance {
            self.try_complete_join(cx, at);
        }
    }

    /// Groups freshly rebuilt from storage: every member gets a full session to show up at this
    /// coordinator, and an over-full group rebalances so members can commit and leave.
    pub fn on_loaded(&mut self, cx: &mut Ctx<'_>, at: Duration) {
        for member in self.members.values_mut() {
            member.heartbeat_deadline = Some(at + member.session_timeout());
        }
        if self.members.len() > cx.config.max_group_size {
            self.prepare_rebalance(cx, at, "freshly loaded group is over capacity");
        }
    }

    // ----- timers -----

    /// Drops timers that can no longer do anything, so they do not show up as deadlines.
    fn normalize_timers(&mut self) {
        if let Some(timer) = self.sync_timer {
            let live = timer.generation == self.generation_id
                && matches!(
                    self.state,
                    GroupState::CompletingRebalance | GroupState::Stable
                )
                && !self.pending_sync.is_empty();
            if !live {
                self.sync_timer = None;
            }
        }
    }

    /// The earliest live timer. Ties break deterministically: pending members (by id), then
    /// heartbeats (by join order), then the join timer, then the sync timer. One pass, no
    /// sorting: this runs on every request.
    fn next_due(&self) -> Option<(Duration, Due)> {
        let pending = self
            .pending_members
            .iter()
            .map(|(id, deadline)| (*deadline, 0u8, 0u64, id.as_str()));
        let heartbeats = self.members.values().filter_map(|m| {
            m.heartbeat_deadline
                .map(|deadline| (deadline, 1u8, m.join_seq, m.member_id.as_str()))
        });
        let join = self
            .join_timer
            .iter()
            .map(|t| (t.deadline(), 2u8, 0u64, ""));
        let sync = self.sync_timer.iter().map(|t| (t.deadline, 3u8, 0u64, ""));
        let consumer = self
            .consumer
            .as_ref()
            .and_then(|c| c.earliest_deadline())
            .map(|(deadline, id)| (deadline, 4u8, 0u64, id));
        let (deadline, kind, _, member_id) = pending
            .chain(heartbeats)
            .chain(join)
            .chain(sync)
            .chain(consumer)
            .min()?;
        let due = match kind {
            0 => Due::PendingMember(member_id.to_string()),
            1 => Due::Heartbeat(member_id.to_string()),
            2 => Due::Join,
            3 => Due::Sync,
            _ => Due::ConsumerMember(member_id.to_string()),
        };
        Some((deadline, due))
    }

    pub fn earliest_deadline(&mut self) -> Option<Duration> {
        self.normalize_timers();
        self.next_due().map(|(deadline, _)| deadline)
    }

    /// Fires, in deadline order, every timer due at or before `now`.
    pub fn fire_due(&mut self, cx: &mut Ctx<'_>, now: Duration) {
        for _ in 0..MAX_FIRINGS_PER_CALL {
            self.normalize_timers();
            let Some((at, due)) = self.next_due() else {
                return;
            };
            if at > now {
                return;
            }
            match due {
                Due::PendingMember(member_id) => {
                    tracing::info!(group = %self.id, member = %member_id,
                        "pending member expired before rejoining");
                    self.remove_pending_member_and_update_group(cx, at, &member_id);
                }
                Due::Heartbeat(member_id) => self.on_expire_heartbeat(cx, at, &member_id),
                Due::Join => self.on_join_timer(cx, at),
                Due::Sync => self.on_expire_pending_sync(cx, at),
                Due::ConsumerMember(member_id) => self.expire_consumer_member(cx, at, &member_id),
            }
        }
        tracing::warn!(group = %self.id, "timer cascade cut short; the rest fires on the next tick");
    }

    fn on_expire_heartbeat(&mut self, cx: &mut Ctx<'_>, at: Duration, member_id: &str) {
        let Some(member) = self.members.get_mut(member_id) else {
            return;
        };
        if member.has_satisfied_heartbeat() {
            member.heartbeat_deadline = None;
            return;
        }
        tracing::info!(group = %self.id, member = %member_id, "member failed to heartbeat; removing it");
        self.remove_member_and_update_group(
            cx,
            at,
            member_id,
            "removing member on heartbeat expiration",
        );
    }

    fn on_expire_pending_sync(&mut self, cx: &mut Ctx<'_>, at: Duration) {
        self.sync_timer = None;
        if !matches!(
            self.state,
            GroupState::CompletingRebalance | GroupState::Stable
        ) || self.pending_sync.is_empty()
        {
            return;
        }
        let mut laggards: Vec<String> = self.pending_sync.iter().cloned().collect();
        laggards.sort();
        tracing::info!(group = %self.id, ?laggards, "removing members that never sent SyncGroup");
        for member_id in &laggards {
            self.remove(cx, member_id);
        }
        self.prepare_rebalance(cx, at, "removing members on pending sync expiration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_are_kafkas() {
        assert_eq!(
            GroupState::CompletingRebalance.as_str(),
            "CompletingRebalance"
        );
        assert_eq!(GroupState::parse("stable"), Some(GroupState::Stable));
        assert_eq!(GroupState::parse("nope"), None);
    }
}
