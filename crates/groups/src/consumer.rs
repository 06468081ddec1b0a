//! KIP-848 "consumer" groups: ConsumerGroupHeartbeat, server-side assignment and incremental
//! reconciliation, following Kafka 4.x's GroupMetadataManager, ConsumerGroup and
//! CurrentAssignmentBuilder.
//!
//! Epochs: every change of membership, subscriptions or subscribed topics' metadata bumps the
//! *group epoch*; the next heartbeat then recomputes the *target assignment* at that epoch (the
//! *assignment epoch*). Each member moves towards its target on its own heartbeats: it first
//! gives up what is no longer its own (keeping its old epoch until it confirms the revocation by
//! listing what it still owns), then reaches the target epoch and receives new partitions, but
//! only those no other member still owns. A partition therefore never has two owners.
//!
//! A consumer group lives inside the classic [`Group`] as `Group::consumer`, so committed offsets,
//! deletion, timers and replay are shared with the classic protocol; the classic part stays
//! Empty while the group is of type consumer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use strata_core::TopicPartition;

use crate::api::{
    ConsumerGroupDescription, ConsumerHeartbeatRequest, ConsumerHeartbeatResponse,
    ConsumerMemberDescription, RequestToken, Response, TopicCatalog,
};
use crate::assignor::{self, Assignment, AssignorMember, DEFAULT_ASSIGNOR};
use crate::error::GroupError;
use crate::group::{Group, GroupState};
use crate::record::{
    ConsumerGroupValue, ConsumerMemberState, ConsumerMemberValue, RecordBody, TopicId,
};
use crate::state::{Ctx, Pending};

/// Member epoch of a member leaving for good.
pub const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
/// Member epoch of a static member leaving temporarily: it keeps its assignment until it
/// rejoins with the same instance id or its session expires.
pub const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;

#[derive(Debug, Clone)]
pub(crate) struct ConsumerMember {
    pub value: ConsumerMemberValue,
    pub session_deadline: Duration,
    /// Set while the member owes a revocation: it must confirm it within its rebalance timeout.
    pub revocation_deadline: Option<Duration>,
    /// Classic-protocol members only (`migration.rs`): the JoinGroup the member was told to
    /// send, or the SyncGroup that must follow its JoinGroup, is due within its rebalance
    /// timeout (Kafka's join and sync timeouts for such members).
    pub join_deadline: Option<Duration>,
}

impl ConsumerMember {
    /// A member that has just joined: epoch 0, subscribed to nothing and owning nothing yet;
    /// the caller fills in what its request said.
    pub(crate) fn joining(session_deadline: Duration) -> Self {
        ConsumerMember {
            value: ConsumerMemberValue {
                instance_id: None,
                rack_id: None,
                client_id: String::new(),
                client_host: String::new(),
                subscribed_topic_names: Vec::new(),
                subscribed_topic_regex: None,
                server_assignor: None,
                rebalance_timeout_ms: 0,
                member_epoch: 0,
                previous_member_epoch: 0,
                state: ConsumerMemberState::Stable,
                assigned: Assignment::new(),
                pending_revocation: Assignment::new(),
                target: Assignment::new(),
                classic: None,
            },
            session_deadline,
            revocation_deadline: None,
            join_deadline: None,
        }
    }

    fn deadline(&self) -> Duration {
        [self.revocation_deadline, self.join_deadline]
            .into_iter()
            .flatten()
            .fold(self.session_deadline, Duration::min)
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ConsumerGroup {
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub topics: BTreeMap<String, (TopicId, i32)>,
    pub members: BTreeMap<String, ConsumerMember>,
    /// instance id → member id.
    pub static_members: HashMap<String, String>,
    /// A write of this group failed: what storage holds may lag what is in memory, so the next
    /// write carries the whole group.
    pub rewrite_all: bool,
    /// Writes of this group not yet durable; answers that show their effects wait for them.
    pub inflight: BTreeSet<u64>,
    /// The members' subscription regexes resolved against the catalog (memory only: rebuilt
    /// from the members' regexes after a replay).
    pub regexes: RegexCache,
}

/// Topics matched by each subscription regex, valid while the catalog stays at `version`, so a
/// heartbeat matches regexes against the topic list only when topics changed or a new regex
/// arrived, not on every beat.
#[derive(Debug, Clone, Default)]
pub(crate) struct RegexCache {
    version: Option<u64>,
    resolved: BTreeMap<String, BTreeSet<String>>,
}

/// A subscription regex compiled as Kafka applies it: RE2 syntax (the `regex` crate is an RE2
/// dialect, like Kafka's RE2J), matching the whole topic name. The size limit bounds the
/// memory one heartbeat can make the coordinator spend on compiling.
fn compile_regex(regex: &str) -> Result<regex::Regex, GroupError> {
    regex::RegexBuilder::new(&format!("^(?:{regex})$"))
        .size_limit(1 << 20)
        .build()
        .map_err(|_| GroupError::InvalidRegularExpression)
}

/// What a change touched, and so what must be written.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    pub metadata: bool,
    pub members: BTreeSet<String>,
    /// One request moves the group epoch at most once, however many things it changed.
    pub bumped: bool,
}

pub(crate) fn millis(ms: i32) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

fn duration_ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

pub(crate) fn subtract(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        let rest: BTreeSet<i32> = match b.get(t) {
            Some(other) => ps.difference(other).copied().collect(),
            None => ps.clone(),
        };
        if !rest.is_empty() {
            out.insert(*t, rest);
        }
    }
    out
}

pub(crate) fn intersect(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        if let Some(other) = b.get(t) {
            let both: BTreeSet<i32> = ps.intersection(other).copied().collect();
            if !both.is_empty() {
                out.insert(*t, both);
            }
        }
    }
    out
}

fn union_into(a: &mut Assignment, b: &Assignment) {
    for (t, ps) in b {
        a.entry(*t).or_default().extend(ps.iter().copied());
    }
}

fn overlaps(a: &Assignment, b: &Assignment) -> bool {
    !intersect(a, b).is_empty()
}

fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    subtract(a, b).is_empty()
}

impl ConsumerGroup {
    pub fn state(&self) -> GroupState {
        if self.members.is_empty() {
            GroupState::Empty
        } else if self.group_epoch > self.assignment_epoch {
            GroupState::Assigning
        } else if self.members.values().any(|m| {
            m.value.member_epoch != self.assignment_epoch
                || m.value.state != ConsumerMemberState::Stable
        }) {
            GroupState::Reconciling
        } else {
            GroupState::Stable
        }
    }

    pub fn value(&self) -> ConsumerGroupValue {
        ConsumerGroupValue {
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            topics: self.topics.clone(),
        }
    }

    /// Rebuilt from its records; members get one session from `now` to show up.
    pub fn from_records(
        value: ConsumerGroupValue,
        members: BTreeMap<String, ConsumerMemberValue>,
        now: Duration,
        session: Duration,
    ) -> Self {
        let mut group = ConsumerGroup {
            group_epoch: value.group_epoch,
            assignment_epoch: value.assignment_epoch,
            topics: value.topics,
            ..Default::default()
        };
        for (id, value) in members {
            if let Some(instance) = &value.instance_id {
                group.static_members.insert(instance.clone(), id.clone());
            }
            // A revocation owed before the move restarts its clock here: the member could not
            // confirm it while no coordinator was serving the group.
            let revocation_deadline = (value.state == ConsumerMemberState::UnrevokedPartitions)
                .then(|| now + millis(value.rebalance_timeout_ms));
            group.members.insert(
                id,
                ConsumerMember {
                    // A classic member's session is its own; a consumer member's, the broker's.
                    session_deadline: now
                        + value
                            .classic
                            .as_ref()
                            .map_or(session, |c| millis(c.session_timeout_ms)),
                    revocation_deadline,
                    join_deadline: None,
                    value,
                },
            );
        }
        group
    }

    pub fn earliest_deadline(&self) -> Option<(Duration, &str)> {
        self.members
            .iter()
            .map(|(id, m)| (m.deadline(), id.as_str()))
            .min()
    }

    pub(crate) fn bump_epoch(&mut self, changes: &mut Changes) {
        if !changes.bumped {
            self.group_epoch = self.group_epoch.saturating_add(1);
            changes.bumped = true;
        }
        changes.metadata = true;
    }

    pub(crate) fn remove_member(&mut self, member_id: &str, changes: &mut Changes) {
        if let Some(member) = self.members.remove(member_id) {
            if let Some(instance) = &member.value.instance_id {
                if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(instance);
                }
            }
            changes.members.insert(member_id.to_string());
            self.bump_epoch(changes);
        }
    }

    /// Partitions some member other than `except` owns or is still revoking.
    pub(crate) fn owned_by_others(&self, except: &str) -> Assignment {
        let mut owned = Assignment::new();
        for (id, m) in &self.members {
            if id != except {
                union_into(&mut owned, &m.value.assigned);
                union_into(&mut owned, &m.value.pending_revocation);
            }
        }
        owned
    }

    /// The assignor most members ask for (ties: by name), else the default.
    fn assignor_name(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(name) = &m.value.server_assignor {
                *counts.entry(name.as_str()).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
            .map_or(DEFAULT_ASSIGNOR.to_string(), |(name, _)| name.to_string())
    }

    /// Brings the regex resolutions up to date with the catalog and the members' regexes.
    fn resolve_regexes(&mut self, catalog: &dyn TopicCatalog) {
        let wanted: BTreeSet<&String> = self
            .members
            .values()
            .filter_map(|m| m.value.subscribed_topic_regex.as_ref())
            .collect();
        let cache = &mut self.regexes;
        let version = catalog.version();
        if cache.version != Some(version) {
            cache.resolved.clear();
            cache.version = Some(version);
        }
        cache.resolved.retain(|regex, _| wanted.contains(regex));
        let missing: Vec<&String> = wanted
            .into_iter()
            .filter(|r| !cache.resolved.contains_key(*r))
            .collect();
        if missing.is_empty() {
            return;
        }
        let names = catalog.names();
        for regex in missing {
            // Validated when the member sent it; one that no longer compiles matches nothing.
            let matched = match compile_regex(regex) {
                Ok(re) => names.iter().filter(|n| re.is_match(n)).cloned().collect(),
                Err(_) => BTreeSet::new(),
            };
            cache.resolved.insert(regex.clone(), matched);
        }
    }

    /// The topics a member subscribes to: its names and what its regex matches.
    fn member_topics<'a>(&'a self, v: &'a ConsumerMemberValue) -> impl Iterator<Item = &'a String> {
        let matched = v
            .subscribed_topic_regex
            .as_ref()
            .and_then(|r| self.regexes.resolved.get(r))
            .into_iter()
            .flatten();
        v.subscribed_topic_names.iter().chain(matched)
    }

    /// The subscribed topics as the catalog has them now.
    pub(crate) fn subscribed_metadata(
        &self,
        catalog: &dyn TopicCatalog,
    ) -> BTreeMap<String, (TopicId, i32)> {
        let mut topics = BTreeMap::new();
        for m in self.members.values() {
            for name in self.member_topics(&m.value) {
                if topics.contains_key(name) {
                    continue;
                }
                if let Some(found) = catalog.lookup(name) {
                    topics.insert(name.clone(), found);
                }
            }
        }
        topics
    }

    fn compute_target(&mut self, changes: &mut Changes) {
        let ids: BTreeMap<&str, TopicId> = self
            .topics
            .iter()
            .map(|(name, (id, _))| (name.as_str(), *id))
            .collect();
        let members: BTreeMap<String, AssignorMember> = self
            .members
            .iter()
            .map(|(id, m)| {
                let subscribed = self
                    .member_topics(&m.value)
                    .filter_map(|n| ids.get(n.as_str()).copied())
                    .collect();
                (
                    id.clone(),
                    AssignorMember {
                        subscribed,
                        previous: m.value.target.clone(),
                    },
                )
            })
            .collect();
        let counts: BTreeMap<TopicId, i32> = self.topics.values().copied().collect();
        let mut targets = assignor::assign(&self.assignor_name(), &members, &counts);
        for (id, m) in self.members.iter_mut() {
            let target = targets.remove(id).unwrap_or_default();
            if target != m.value.target {
                m.value.target = target;
                changes.members.insert(id.clone());
            }
        }
        self.assignment_epoch = self.group_epoch;
        changes.metadata = true;
    }

    /// After a member's request: moves the group epoch if its subscription changed or the
    /// subscribed topics did (created, deleted or grown), and recomputes the target assignment
    /// if the epoch moved past it.
    pub(crate) fn retarget(
        &mut self,
        subscription_changed: bool,
        catalog: &dyn TopicCatalog,
        changes: &mut Changes,
    ) {
        if subscription_changed {
            self.bump_epoch(changes);
        }
        self.resolve_regexes(catalog);
        let metadata = self.subscribed_metadata(catalog);
        if metadata != self.topics {
            self.topics = metadata;
            self.bump_epoch(changes);
        }
        if self.group_epoch > self.assignment_epoch {
            self.compute_target(changes);
        }
    }

    /// Kafka's `CurrentAssignmentBuilder`: moves the member one step towards its target.
    pub(crate) fn reconcile(
        &mut self,
        member_id: &str,
        owned: Option<&Assignment>,
        now: Duration,
        changes: &mut Changes,
    ) {
        let target_epoch = self.assignment_epoch;
        let others = self.owned_by_others(member_id);
        let Some(member) = self.members.get_mut(member_id) else {
            return;
        };
        let v = &mut member.value;
        let step = match v.state {
            ConsumerMemberState::Stable => v.member_epoch != target_epoch,
            // Only the member's word that it let go of the partitions moves it on.
            ConsumerMemberState::UnrevokedPartitions => {
                owned.is_some_and(|o| !overlaps(o, &v.pending_revocation))
            }
            ConsumerMemberState::UnreleasedPartitions => true,
        };
        if !step {
            return;
        }
        let before = v.clone();
        let keep = intersect(&v.assigned, &v.target);
        let revoke = subtract(&v.assigned, &v.target);
        if !revoke.is_empty() {
            v.assigned = keep;
            v.pending_revocation = revoke;
            v.state = ConsumerMemberState::UnrevokedPartitions;
            member.revocation_deadline = Some(now + millis(v.rebalance_timeout_ms));
        } else {
            let wanted = subtract(&v.target, &keep);
            let unreleased = intersect(&wanted, &others);
            let mut assigned = keep;
            union_into(&mut assigned, &subtract(&wanted, &unreleased));
            v.assigned = assigned;
            v.pending_revocation = Assignment::new();
            v.state = if unreleased.is_empty() {
                ConsumerMemberState::Stable
            } else {
                ConsumerMemberState::UnreleasedPartitions
            };
            if v.member_epoch != target_epoch {
                v.previous_member_epoch = v.member_epoch;
                v.member_epoch = target_epoch;
            }
            member.revocation_deadline = None;
        }
        if *v != before {
            changes.members.insert(member_id.to_string());
        }
    }

    /// Whether `tp` is the member's: assigned to it, or owed back by it and so still owned by
    /// no one else.
    fn member_holds(&self, member: &ConsumerMemberValue, tp: &TopicPartition) -> bool {
        let Some((id, _)) = self.topics.get(&*tp.topic) else {
            return false;
        };
        let has = |a: &Assignment| a.get(id).is_some_and(|ps| ps.contains(&tp.partition));
        has(&member.assigned) || has(&member.pending_revocation)
    }

    fn describe(&self, group_id: &str) -> ConsumerGroupDescription {
        ConsumerGroupDescription {
            group_id: group_id.to_string(),
            error: None,
            state: self.state(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor_name: self.assignor_name(),
            members: self
                .members
                .iter()
                .map(|(id, m)| ConsumerMemberDescription {
                    member_id: id.clone(),
                    instance_id: m.value.instance_id.clone(),
                    rack_id: m.value.rack_id.clone(),
                    member_epoch: m.value.member_epoch,
                    client_id: m.value.client_id.clone(),
                    client_host: m.value.client_host.clone(),
                    subscribed_topic_names: m.value.subscribed_topic_names.clone(),
                    subscribed_topic_regex: m.value.subscribed_topic_regex.clone(),
                    assignment: m.value.assigned.clone(),
                    target_assignment: m.value.target.clone(),
                    classic: m.value.classic.is_some(),
                })
                .collect(),
        }
    }
}

/// Kafka's `throwIfConsumerGroupHeartbeatRequestIsInvalid`.
pub(crate) fn validate(req: &ConsumerHeartbeatRequest) -> Result<(), GroupError> {
    if req.group_id.is_empty() {
        return Err(GroupError::InvalidRequest);
    }
    if req.instance_id.as_deref() == Some("") || req.rack_id.as_deref() == Some("") {
        return Err(GroupError::InvalidRequest);
    }
    // v1 clients name themselves (KIP-1082); v0 ones get an id on their first heartbeat.
    if req.member_id.is_empty() && (req.api_version >= 1 || req.member_epoch != 0) {
        return Err(GroupError::InvalidRequest);
    }
    match req.member_epoch {
        0 => {
            if req.rebalance_timeout_ms < 0 {
                return Err(GroupError::InvalidRequest);
            }
            if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
                return Err(GroupError::InvalidRequest);
            }
        }
        LEAVE_GROUP_STATIC_MEMBER_EPOCH if req.instance_id.is_none() => {
            return Err(GroupError::InvalidRequest);
        }
        e if e < LEAVE_GROUP_STATIC_MEMBER_EPOCH => return Err(GroupError::InvalidRequest),
        _ => {}
    }
    if let Some(regex) = req.subscribed_topic_regex.as_deref() {
        if !regex.is_empty() {
            compile_regex(regex)?;
        }
    }
    if let Some(name) = &req.server_assignor {
        assignor::check_assignor(name)?;
    }
    Ok(())
}

impl Group {
    /// Whether a ConsumerGroupHeartbeat may use this group as it is: a consumer group, or an
    /// empty classic one (which becomes a consumer group). A classic group with members is
    /// converted first if the migration policy allows (`migration.rs`); otherwise it answers
    /// GROUP_ID_NOT_FOUND, as Kafka does.
    pub(crate) fn accepts_consumer_protocol(&self) -> bool {
        self.consumer.is_some() || (self.state == GroupState::Empty && self.members.is_empty())
    }

    pub(crate) fn has_consumer_members(&self) -> bool {
        self.consumer
            .as_ref()
            .is_some_and(|c| !c.members.is_empty())
    }

    pub(crate) fn consumer_heartbeat(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        token: RequestToken,
        req: ConsumerHeartbeatRequest,
        catalog: &dyn TopicCatalog,
    ) {
        let mut changes = Changes::default();
        let group = self.consumer.get_or_insert_with(ConsumerGroup::default);
        let answer = heartbeat(group, cx, now, &req, catalog, &mut changes);
        let response = match answer {
            Ok(response) => response,
            Err(error) => ConsumerHeartbeatResponse::error(error, &req.member_id, req.member_epoch),
        };
        let answer = Some((token, Response::ConsumerHeartbeat(response)));
        match self.maybe_downgrade(cx, now, &mut changes) {
            Some(value) => self.persist_downgrade(cx, changes, value, answer),
            None => self.persist_consumer(cx, changes, answer),
        }
    }

    /// Writes what `changes` touched; `answer` is released once it (and any earlier write of
    /// the group) is durable.
    pub(crate) fn persist_consumer(
        &mut self,
        cx: &mut Ctx<'_>,
        changes: Changes,
        answer: Option<(RequestToken, Response)>,
    ) {
        let Some(group) = self.consumer.as_mut() else {
            return;
        };
        let mut bodies = Vec::new();
        let everything = group.rewrite_all;
        if changes.metadata || everything {
            bodies.push(RecordBody::ConsumerGroupMetadata(group.value()));
        }
        let mut ids = changes.members;
        if everything {
            ids.extend(group.members.keys().cloned());
            group.rewrite_all = false;
        }
        for member_id in ids {
            let value = group.members.get(&member_id).map(|m| m.value.clone());
            bodies.push(RecordBody::ConsumerMember { member_id, value });
        }
        let waiters: Vec<(RequestToken, Response)> = answer.into_iter().collect();
        if bodies.is_empty() {
            // Nothing new to write, but the answer may show the effect of a write in flight.
            match group.inflight.last().copied() {
                Some(seq) => {
                    if let Some(Pending::Consumer { waiters: w, .. }) =
                        cx.pending_mut(crate::api::PersistId(seq))
                    {
                        w.extend(waiters);
                        return;
                    }
                    for (token, response) in waiters {
                        cx.respond(token, response);
                    }
                }
                None => {
                    for (token, response) in waiters {
                        cx.respond(token, response);
                    }
                }
            }
            return;
        }
        let id = cx.persist(
            &self.id,
            bodies,
            Pending::Consumer {
                group_id: self.id.clone(),
                waiters,
            },
        );
        group.inflight.insert(id.0);
    }

    /// A consumer-group write ended.
    pub(crate) fn on_consumer_persisted(&mut self, seq: u64, failed: bool) {
        if let Some(group) = self.consumer.as_mut() {
            group.inflight.remove(&seq);
            if failed {
                group.rewrite_all = true;
            }
        }
    }

    /// A member's session, revocation, join or sync deadline passed: Kafka fences it out of
    /// the group.
    pub(crate) fn expire_consumer_member(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        member_id: &str,
    ) {
        let mut changes = Changes::default();
        if let Some(group) = self.consumer.as_mut() {
            tracing::info!(group = %self.id, member = %member_id,
                "consumer group member expired (session, revocation, join or sync timeout)");
            group.remove_member(member_id, &mut changes);
        }
        match self.maybe_downgrade(cx, now, &mut changes) {
            Some(value) => self.persist_downgrade(cx, changes, value, None),
            None => self.persist_consumer(cx, changes, None),
        }
    }

    /// Kafka's offset-commit check for consumer groups: members commit with their member id
    /// and current member epoch; commits from outside the group only while it has no members.
    ///
    /// One relaxation (the idea of KIP-1251's assignment epochs): a commit carrying the
    /// member's *previous* epoch is accepted when every partition in it is still the member's
    /// (assigned, or owed back but not yet released). The member's epoch moves in memory as
    /// soon as its heartbeat is processed, but the member learns the new epoch only once that
    /// heartbeat's write is durable; a commit sent in between carries the old epoch, and
    /// refusing it (as Kafka 4.0 does) fails the application's synchronous commit of records
    /// it did process, although no other member can own those partitions yet. Partitions
    /// that have moved on are still refused, so a fenced member cannot rewind another's
    /// progress.
    pub(crate) fn validate_consumer_commit(
        &self,
        generation_id: i32,
        member_id: &str,
        partitions: &[&TopicPartition],
    ) -> Option<GroupError> {
        let group = self.consumer.as_ref()?;
        if member_id.is_empty() && generation_id < 0 {
            return (!group.members.is_empty()).then_some(GroupError::UnknownMemberId);
        }
        let member = match group.members.get(member_id) {
            None => return Some(GroupError::UnknownMemberId),
            Some(m) => m,
        };
        let v = &member.value;
        if v.member_epoch == generation_id {
            return None;
        }
        if v.classic.is_some() {
            // A classic-protocol member's generation is its member epoch, which it learns from
            // JoinGroup and uses until it rejoins, so Kafka's exact check needs no relaxation;
            // it is answered in that protocol's terms.
            return Some(GroupError::IllegalGeneration);
        }
        let previous = generation_id >= 0
            && generation_id == v.previous_member_epoch
            && generation_id < v.member_epoch;
        if previous && partitions.iter().all(|tp| group.member_holds(v, tp)) {
            return None;
        }
        Some(GroupError::StaleMemberEpoch)
    }

    /// Kafka's `ConsumerGroup.validateOffsetFetch`: a member asking must be current; a tool
    /// (no member id, epoch -1) may always read.
    pub(crate) fn validate_consumer_fetch(
        &self,
        member_id: &str,
        epoch: i32,
    ) -> Option<GroupError> {
        let group = self.consumer.as_ref()?;
        if member_id.is_empty() && epoch < 0 {
            return None;
        }
        match group.members.get(member_id) {
            None => Some(GroupError::UnknownMemberId),
            // The previous epoch too, for the reason given at validate_consumer_commit: the
            // member cannot know its new epoch before the write that set it is durable, and
            // reading committed offsets hands no one a partition.
            Some(m)
                if m.value.member_epoch != epoch
                    && !(epoch >= 0
                        && epoch == m.value.previous_member_epoch
                        && epoch < m.value.member_epoch) =>
            {
                Some(GroupError::StaleMemberEpoch)
            }
            Some(_) => None,
        }
    }

    pub(crate) fn consumer_subscribes_to(&self, topic: &str) -> Option<bool> {
        let group = self.consumer.as_ref()?;
        Some(
            group
                .members
                .values()
                .any(|m| group.member_topics(&m.value).any(|t| t == topic)),
        )
    }

    pub(crate) fn describe_consumer(&self) -> Option<ConsumerGroupDescription> {
        self.consumer.as_ref().map(|c| c.describe(&self.id))
    }
}

fn heartbeat(
    group: &mut ConsumerGroup,
    cx: &mut Ctx<'_>,
    now: Duration,
    req: &ConsumerHeartbeatRequest,
    catalog: &dyn TopicCatalog,
    changes: &mut Changes,
) -> Result<ConsumerHeartbeatResponse, GroupError> {
    let session = req
        .timeouts
        .session
        .unwrap_or(cx.config.consumer_session_timeout);
    let interval = duration_ms(
        req.timeouts
            .heartbeat_interval
            .unwrap_or(cx.config.consumer_heartbeat_interval),
    );
    if req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH
        || req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH
    {
        let member_id = match &req.instance_id {
            Some(instance) => match group.static_members.get(instance) {
                Some(id) if *id == req.member_id => id.clone(),
                Some(_) => return Err(GroupError::FencedInstanceId),
                None => return Err(GroupError::UnknownMemberId),
            },
            None => req.member_id.clone(),
        };
        let Some(member) = group.members.get_mut(&member_id) else {
            return Err(GroupError::UnknownMemberId);
        };
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH {
            // The assignment stays reserved for the instance's return until its session ends.
            member.value.previous_member_epoch = member.value.member_epoch;
            member.value.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
            member.revocation_deadline = None;
            changes.members.insert(member_id.clone());
        } else {
            group.remove_member(&member_id, changes);
        }
        return Ok(ConsumerHeartbeatResponse {
            error: None,
            member_id: Some(member_id),
            member_epoch: req.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        });
    }

    let mut full = req.member_epoch == 0;
    let member_id = if req.member_epoch == 0 {
        join(group, cx, now, req, changes)?
    } else {
        let Some(member) = group.members.get(&req.member_id) else {
            return Err(GroupError::UnknownMemberId);
        };
        if member.value.classic.is_some() {
            // A classic-protocol member's id: it does not speak this protocol.
            return Err(GroupError::UnknownMemberId);
        }
        if let Some(instance) = &req.instance_id {
            match group.static_members.get(instance) {
                Some(id) if *id == req.member_id => {}
                Some(_) => return Err(GroupError::FencedInstanceId),
                None => return Err(GroupError::UnknownMemberId),
            }
        }
        let current = member.value.member_epoch;
        // Kafka's throwIfConsumerGroupMemberEpochIsInvalid: a member one epoch behind is
        // accepted only if it lost our last answer and owns nothing it should not.
        if req.member_epoch > current {
            return Err(GroupError::FencedMemberEpoch);
        }
        if req.member_epoch < current {
            let lost_answer = req.member_epoch == member.value.previous_member_epoch
                && req
                    .owned
                    .as_ref()
                    .is_some_and(|o| is_subset(o, &member.value.assigned));
            if !lost_answer {
                return Err(GroupError::FencedMemberEpoch);
            }
            full = true;
        }
        req.member_id.clone()
    };

    // Subscription and member details carried by this heartbeat.
    let Some(member) = group.members.get_mut(&member_id) else {
        return Err(GroupError::UnknownMemberId);
    };
    member.session_deadline = now + session;
    let before = member.value.clone();
    let v = &mut member.value;
    let mut subscription_changed = false;
    if let Some(names) = &req.subscribed_topic_names {
        let mut names = names.clone();
        names.sort();
        names.dedup();
        if names != v.subscribed_topic_names {
            v.subscribed_topic_names = names;
            subscription_changed = true;
        }
    }
    if let Some(regex) = &req.subscribed_topic_regex {
        // An empty regex clears it, as in Kafka (a member that moved back to topic names).
        let regex = (!regex.is_empty()).then(|| regex.clone());
        if regex != v.subscribed_topic_regex {
            v.subscribed_topic_regex = regex;
            subscription_changed = true;
        }
    }
    if req.server_assignor.is_some() && req.server_assignor != v.server_assignor {
        v.server_assignor = req.server_assignor.clone();
        subscription_changed = true;
    }
    if req.rebalance_timeout_ms >= 0 {
        v.rebalance_timeout_ms = req.rebalance_timeout_ms;
    }
    if req.rack_id.is_some() {
        v.rack_id = req.rack_id.clone();
    }
    v.client_id = req.client_id.clone();
    v.client_host = req.client_host.clone();
    if *v != before {
        changes.members.insert(member_id.clone());
    }
    group.retarget(subscription_changed, catalog, changes);
    let sent_before = group
        .members
        .get(&member_id)
        .map(|m| (m.value.member_epoch, m.value.assigned.clone()));
    group.reconcile(&member_id, req.owned.as_ref(), now, changes);
    let Some(member) = group.members.get(&member_id) else {
        return Err(GroupError::UnknownMemberId);
    };
    let now_state = (member.value.member_epoch, member.value.assigned.clone());
    let assignment_changed = sent_before.as_ref() != Some(&now_state);
    let send = full || assignment_changed || req.owned.is_some();
    Ok(ConsumerHeartbeatResponse {
        error: None,
        member_id: Some(member_id),
        member_epoch: member.value.member_epoch,
        heartbeat_interval_ms: interval,
        assignment: send.then(|| member.value.assigned.clone()),
    })
}

/// A heartbeat with epoch 0: a new member, a retried join, or a static member coming back.
fn join(
    group: &mut ConsumerGroup,
    cx: &mut Ctx<'_>,
    now: Duration,
    req: &ConsumerHeartbeatRequest,
    changes: &mut Changes,
) -> Result<String, GroupError> {
    let session = req
        .timeouts
        .session
        .unwrap_or(cx.config.consumer_session_timeout);
    if let Some(instance) = &req.instance_id {
        if let Some(old_id) = group.static_members.get(instance).cloned() {
            let Some(old) = group.members.get(&old_id) else {
                group.static_members.remove(instance);
                return join(group, cx, now, req, changes);
            };
            if old.value.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH {
                if old_id == req.member_id {
                    return Ok(old_id);
                }
                return Err(GroupError::UnreleasedInstanceId);
            }
            // The instance is back: the new member id takes over the old one's epoch and
            // assignment, so nothing is rebalanced (KIP-345 carried into KIP-848).
            let new_id = if old_id == req.member_id {
                old_id.clone()
            } else {
                new_member_id(group, cx, req)
            };
            let Some(mut member) = group.members.remove(&old_id) else {
                return Err(GroupError::UnknownMemberId);
            };
            member.value.member_epoch = member.value.previous_member_epoch;
            member.session_deadline = now + session;
            group.members.insert(new_id.clone(), member);
            group
                .static_members
                .insert(instance.clone(), new_id.clone());
            changes.members.insert(old_id);
            changes.members.insert(new_id.clone());
            return Ok(new_id);
        }
    }
    if !req.member_id.is_empty() && group.members.contains_key(&req.member_id) {
        // A retried join whose answer was lost: the member carries on from where it is.
        return Ok(req.member_id.clone());
    }
    if group.members.len() >= cx.config.max_group_size {
        return Err(GroupError::GroupMaxSizeReached);
    }
    let member_id = new_member_id(group, cx, req);
    let mut member = ConsumerMember::joining(now + session);
    let v = &mut member.value;
    v.instance_id = req.instance_id.clone();
    v.rack_id = req.rack_id.clone();
    v.client_id = req.client_id.clone();
    v.client_host = req.client_host.clone();
    v.rebalance_timeout_ms = req.rebalance_timeout_ms;
    group.members.insert(member_id.clone(), member);
    if let Some(instance) = &req.instance_id {
        group
            .static_members
            .insert(instance.clone(), member_id.clone());
    }
    changes.members.insert(member_id.clone());
    group.bump_epoch(changes);
    Ok(member_id)
}

fn new_member_id(
    group: &ConsumerGroup,
    cx: &mut Ctx<'_>,
    req: &ConsumerHeartbeatRequest,
) -> String {
    if !req.member_id.is_empty() && !group.members.contains_key(&req.member_id) {
        return req.member_id.clone();
    }
    loop {
        let id = cx.ids.next_suffix();
        if !group.members.contains_key(&id) {
            return id;
        }
    }
}
