//! JoinGroup, SyncGroup, Heartbeat and LeaveGroup against one group, following Kafka's
//! GroupCoordinator (`handleJoinGroup`, `doSyncGroup`, `handleHeartbeat`, `handleLeaveGroup`).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;

use crate::api::{
    HeartbeatRequest, JoinRequest, JoinResponse, LeavingMember, LeftMember, Protocol, RequestToken,
    Response, SyncRequest, SyncResponse,
};
use crate::error::GroupError;
use crate::group::{millis, Group, GroupState, Member};
use crate::record::RecordBody;
use crate::state::{Ctx, Pending};

/// A JoinGroup after version-dependent normalisation.
struct Join {
    token: RequestToken,
    member_id: String,
    group_instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    protocol_type: String,
    protocols: Vec<Protocol>,
    /// KIP-394 (v4+): new dynamic members first receive a member id and must rejoin with it.
    require_known_member_id: bool,
    /// KIP-814 (v9+): a static leader rejoining a Stable group may be told to skip assignment.
    supports_skip_assignment: bool,
    reason: String,
}

impl Join {
    fn from_request(token: RequestToken, req: JoinRequest) -> Self {
        // Kafka's member protocol set is keyed by name; a duplicate would be counted twice in
        // the group's per-protocol support counts and corrupt protocol selection.
        let mut protocols: Vec<Protocol> = Vec::with_capacity(req.protocols.len());
        for protocol in req.protocols {
            if !protocols.iter().any(|p| p.name == protocol.name) {
                protocols.push(protocol);
            }
        }
        Self {
            token,
            member_id: req.member_id,
            group_instance_id: req.group_instance_id,
            client_id: req.client_id,
            client_host: req.client_host,
            session_timeout_ms: req.session_timeout_ms,
            // JoinGroup v0 has no rebalance timeout; Kafka uses the session timeout.
            rebalance_timeout_ms: if req.api_version == 0 {
                req.session_timeout_ms
            } else {
                req.rebalance_timeout_ms
            },
            protocol_type: req.protocol_type,
            protocols,
            require_known_member_id: req.api_version >= 4,
            supports_skip_assignment: req.api_version >= 9,
            reason: req.reason.unwrap_or_else(|| "not provided".to_string()),
        }
    }
}

impl Group {
    pub(crate) fn handle_join(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        token: RequestToken,
        req: JoinRequest,
    ) {
        let join = Join::from_request(token, req);
        if !self.accept_joining_member(&join.member_id, cx.config.max_group_size) {
            // Kafka evicts a known member that no longer fits (e.g. after a reload over
            // capacity) so that it stops counting against the limit.
            let member_id = join.member_id.clone();
            self.remove(cx, &member_id);
            cx.respond(
                join.token,
                Response::Join(JoinResponse::error("", GroupError::GroupMaxSizeReached)),
            );
        } else if join.member_id.is_empty() {
            self.do_new_member_join(cx, now, join);
        } else {
            self.do_current_member_join(cx, now, join);
        }
        if self.state == GroupState::PreparingRebalance {
            self.try_complete_join(cx, now);
        }
    }

    /// Kafka's `acceptJoiningMember`: the size limit counts members already in the rebalance,
    /// so it holds even before everyone has rejoined.
    fn accept_joining_member(&self, member_id: &str, max_group_size: usize) -> bool {
        match self.state {
            GroupState::Empty
            | GroupState::Dead
            | GroupState::Assigning
            | GroupState::Reconciling => true,
            GroupState::PreparingRebalance => {
                self.members
                    .get(member_id)
                    .is_some_and(|m| m.awaiting_join.is_some())
                    || self.num_awaiting_join() < max_group_size
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.members.contains_key(member_id) || self.members.len() < max_group_size
            }
        }
    }

    fn generate_member_id(&self, cx: &mut Ctx<'_>, prefix: &str) -> String {
        // Re-draw on a collision: a duplicate member id would silently merge two clients.
        for _ in 0..16 {
            let candidate = format!("{prefix}-{}", cx.ids.next_suffix());
            if !self.members.contains_key(&candidate)
                && !self.pending_members.contains_key(&candidate)
            {
                return candidate;
            }
        }
        let mut n = self.members.len() + self.pending_members.len();
        loop {
            let candidate = format!("{prefix}-{}-{n}", cx.ids.next_suffix());
            if !self.members.contains_key(&candidate)
                && !self.pending_members.contains_key(&candidate)
            {
                return candidate;
            }
            n += 1;
        }
    }

    fn do_new_member_join(&mut self, cx: &mut Ctx<'_>, now: Duration, join: Join) {
        if self.state == GroupState::Dead {
            cx.respond(
                join.token,
                Response::Join(JoinResponse::error("", GroupError::CoordinatorNotAvailable)),
            );
            return;
        }
        if !self.supports_protocols(&join.protocol_type, &join.protocols) {
            cx.respond(
                join.token,
                Response::Join(JoinResponse::error(
                    "",
                    GroupError::InconsistentGroupProtocol,
                )),
            );
            return;
        }
        let prefix = join
            .group_instance_id
            .clone()
            .unwrap_or_else(|| join.client_id.clone());
        let new_member_id = self.generate_member_id(cx, &prefix);
        match join.group_instance_id.clone() {
            Some(instance_id) => match self.static_members.get(&instance_id).cloned() {
                Some(old_member_id) => {
                    tracing::info!(group = %self.id, instance = %instance_id, old = %old_member_id,
                        new = %new_member_id, state = %self.state,
                        "static member rejoined with an unknown member id; replacing the old id");
                    self.update_static_member_and_rebalance(
                        cx,
                        now,
                        join,
                        &instance_id,
                        &old_member_id,
                        &new_member_id,
                    );
                }
                None => self.add_member_and_rebalance(cx, now, join, new_member_id),
            },
            None if join.require_known_member_id => {
                // KIP-394: remember the id for one session timeout; the member counts as
                // "not yet joined" for any rebalance in progress until it comes back.
                self.pending_members.insert(
                    new_member_id.clone(),
                    now + millis(join.session_timeout_ms.into()),
                );
                cx.respond(
                    join.token,
                    Response::Join(JoinResponse::error(
                        new_member_id,
                        GroupError::MemberIdRequired,
                    )),
                );
            }
            None => self.add_member_and_rebalance(cx, now, join, new_member_id),
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        join: Join,
        member_id: String,
    ) {
        if self.state == GroupState::PreparingRebalance && self.generation_id == 0 {
            self.new_member_added_during_initial_rebalance();
        }
        let join_seq = self.next_join_seq();
        let reason = format!(
            "adding new member {member_id} with group instance id {:?}; client reason: {}",
            join.group_instance_id, join.reason
        );
        self.add(Member {
            member_id: member_id.clone(),
            group_instance_id: join.group_instance_id,
            client_id: join.client_id,
            client_host: join.client_host,
            rebalance_timeout_ms: join.rebalance_timeout_ms,
            session_timeout_ms: join.session_timeout_ms,
            protocol_type: join.protocol_type,
            protocols: join.protocols,
            assignment: Bytes::new(),
            awaiting_join: Some(join.token),
            awaiting_sync: None,
            is_new: true,
            heartbeat_deadline: None,
            join_seq,
        });
        // A new member cannot heartbeat while its JoinGroup is parked, so it is bounded by the
        // new-member join timeout instead of its session timeout.
        self.schedule_heartbeat(&member_id, now, cx.config.new_member_join_timeout);
        self.maybe_prepare_rebalance(cx, now, &reason);
    }

    /// Kafka's `updateStaticMemberAndRebalance`.
    fn update_static_member_and_rebalance(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        join: Join,
        instance_id: &str,
        old_member_id: &str,
        new_member_id: &str,
    ) {
        let leader_before = self.leader_id.clone();
        if !self.replace_static_member(cx, instance_id, old_member_id, new_member_id) {
            // The instance mapping pointed at a member that is gone; treat it as a new member.
            self.static_members.remove(instance_id);
            self.add_member_and_rebalance(cx, now, join, new_member_id.to_string());
            return;
        }
        // The old id's heartbeat deadline is moot; the new id gets a full session (still the
        // member's old session timeout, as in Kafka, until the update below).
        self.schedule_session_heartbeat(new_member_id, now);
        let Some(member) = self.members.get(new_member_id) else {
            return;
        };
        let old_protocols = member.protocols.clone();
        let old_rebalance_timeout_ms = member.rebalance_timeout_ms;
        let old_session_timeout_ms = member.session_timeout_ms;
        self.update_member(
            cx,
            new_member_id,
            join.protocols,
            join.rebalance_timeout_ms,
            join.session_timeout_ms,
            Some(join.token),
        );
        match self.state {
            GroupState::Stable => {
                // Kafka's test is whether the protocol the group would select changes, not
                // whether the metadata changed: a restarting cooperative consumer reports no
                // owned partitions, and rebalancing on that would defeat static membership.
                if self.select_protocol() == self.protocol_name {
                    tracing::info!(group = %self.id, instance = %instance_id,
                        "static member rejoined a Stable group without changing the selected protocol; no rebalance");
                    let value = self.metadata_value(None);
                    cx.persist(
                        &self.id,
                        vec![RecordBody::GroupMetadata(value)],
                        Pending::StaticReplace {
                            group_id: self.id.clone(),
                            instance_id: instance_id.to_string(),
                            old_member_id: old_member_id.to_string(),
                            new_member_id: new_member_id.to_string(),
                            old_protocols,
                            old_rebalance_timeout_ms,
                            old_session_timeout_ms,
                            leader_before,
                            supports_skip_assignment: join.supports_skip_assignment,
                        },
                    );
                } else {
                    let reason = format!(
                        "static member {new_member_id} with instance id {instance_id} changed the selected protocol; client reason: {}",
                        join.reason
                    );
                    self.maybe_prepare_rebalance(cx, now, &reason);
                }
            }
            GroupState::CompletingRebalance => {
                // The leader may already be computing an assignment for the old member id,
                // which the new id would never receive: start over.
                let reason = format!(
                    "updating metadata for static member {new_member_id} with instance id {instance_id}; client reason: {}",
                    join.reason
                );
                self.prepare_rebalance(cx, now, &reason);
            }
            GroupState::PreparingRebalance => {}
            GroupState::Empty
            | GroupState::Dead
            | GroupState::Assigning
            | GroupState::Reconciling => {
                // Unreachable in Kafka (a static member implies members). Rebalancing is the
                // recovery that answers the parked JoinGroup either way.
                tracing::error!(group = %self.id, state = %self.state,
                    "static member rejoined a group without members");
                self.maybe_prepare_rebalance(cx, now, "static member rejoined an empty group");
            }
        }
    }

    /// Completion of the metadata write for a static member that replaced its old member id in
    /// a Stable group.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_static_replace_persisted(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        failure: Option<GroupError>,
        instance_id: &str,
        old_member_id: &str,
        new_member_id: &str,
        old_protocols: Vec<Protocol>,
        old_rebalance_timeout_ms: i32,
        old_session_timeout_ms: i32,
        leader_before: Option<String>,
        supports_skip_assignment: bool,
    ) {
        let Some(member) = self.members.get_mut(new_member_id) else {
            // Replaced again or removed meanwhile; whoever did that answered the parked join.
            return;
        };
        let Some(token) = member.awaiting_join.take() else {
            return;
        };
        match failure {
            Some(error) => {
                tracing::warn!(group = %self.id, instance = %instance_id, %error,
                    "failed to persist a static member's new id; reverting to the old id");
                self.update_member(
                    cx,
                    new_member_id,
                    old_protocols,
                    old_rebalance_timeout_ms,
                    old_session_timeout_ms,
                    None,
                );
                if self.replace_static_member(cx, instance_id, new_member_id, old_member_id) {
                    self.schedule_session_heartbeat(old_member_id, now);
                }
                cx.respond(
                    token,
                    Response::Join(JoinResponse {
                        error: Some(error),
                        generation_id: self.generation_id,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        leader: leader_before.unwrap_or_default(),
                        skip_assignment: false,
                        member_id: String::new(),
                        members: Vec::new(),
                    }),
                );
            }
            None if supports_skip_assignment => {
                // v9+: tell a returning static leader it leads, but must not reassign: the
                // group is Stable and would ignore a new assignment anyway.
                let is_leader = self.is_leader(new_member_id);
                cx.respond(
                    token,
                    Response::Join(JoinResponse {
                        error: None,
                        generation_id: self.generation_id,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        leader: self.leader_or_empty(),
                        skip_assignment: is_leader,
                        member_id: new_member_id.to_string(),
                        members: if is_leader {
                            self.current_member_metadata()
                        } else {
                            Vec::new()
                        },
                    }),
                );
            }
            None => {
                // Before v9, report the leader as it was before the replacement: a returning
                // static leader then does not recognise itself and does not run a pointless
                // assignment that a Stable group would not distribute.
                cx.respond(
                    token,
                    Response::Join(JoinResponse {
                        error: None,
                        generation_id: self.generation_id,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        leader: leader_before.unwrap_or_default(),
                        skip_assignment: false,
                        member_id: new_member_id.to_string(),
                        members: Vec::new(),
                    }),
                );
            }
        }
    }

    fn do_current_member_join(&mut self, cx: &mut Ctx<'_>, now: Duration, join: Join) {
        let member_id = join.member_id.clone();
        if self.state == GroupState::Dead {
            cx.respond(
                join.token,
                Response::Join(JoinResponse::error(
                    member_id,
                    GroupError::CoordinatorNotAvailable,
                )),
            );
            return;
        }
        if !self.supports_protocols(&join.protocol_type, &join.protocols) {
            cx.respond(
                join.token,
                Response::Join(JoinResponse::error(
                    member_id,
                    GroupError::InconsistentGroupProtocol,
                )),
            );
            return;
        }
        if self.pending_members.contains_key(&member_id) {
            if join.group_instance_id.is_some() {
                // Pending ids are only handed to dynamic members; Kafka treats this as an
                // internal error.
                cx.respond(
                    join.token,
                    Response::Join(JoinResponse::error(
                        member_id,
                        GroupError::UnknownServerError,
                    )),
                );
            } else {
                self.add_member_and_rebalance(cx, now, join, member_id);
            }
            return;
        }
        let instance_id = join.group_instance_id.as_deref();
        let instance_unknown = instance_id.is_some_and(|id| !self.static_members.contains_key(id));
        if self.is_static_member_fenced(&member_id, instance_id) {
            cx.respond(
                join.token,
                Response::Join(JoinResponse::error(member_id, GroupError::FencedInstanceId)),
            );
            return;
        }
        if !self.members.contains_key(&member_id) || instance_unknown {
            cx.respond(
                join.token,
                Response::Join(JoinResponse::error(member_id, GroupError::UnknownMemberId)),
            );
            return;
        }
        let matches = self
            .members
            .get(&member_id)
            .is_some_and(|m| m.protocols == join.protocols);
        match self.state {
            GroupState::PreparingRebalance => {
                let reason = format!(
                    "member {member_id} joining group during PreparingRebalance; client reason: {}",
                    join.reason
                );
                self.update_member_and_rebalance(cx, now, join, &reason);
            }
            GroupState::CompletingRebalance => {
                if matches {
                    // Most likely a retry after a lost JoinGroup response: repeat it.
                    let include_members = self.is_leader(&member_id);
                    let response =
                        self.current_generation_join_response(&member_id, include_members);
                    cx.respond(join.token, Response::Join(response));
                } else {
                    let reason = format!(
                        "updating metadata for member {member_id} during CompletingRebalance; client reason: {}",
                        join.reason
                    );
                    self.update_member_and_rebalance(cx, now, join, &reason);
                }
            }
            GroupState::Stable => {
                if self.is_leader(&member_id) {
                    // The leader rejoins to make the group reassign for changes the member
                    // metadata cannot show (for consumers: topic metadata changes).
                    let reason = format!(
                        "leader {member_id} re-joining group during Stable; client reason: {}",
                        join.reason
                    );
                    self.update_member_and_rebalance(cx, now, join, &reason);
                } else if !matches {
                    let reason = format!(
                        "updating metadata for member {member_id} during Stable; client reason: {}",
                        join.reason
                    );
                    self.update_member_and_rebalance(cx, now, join, &reason);
                } else {
                    // A follower with unchanged metadata: hand back the current generation so
                    // it can SyncGroup for its assignment.
                    let response = self.current_generation_join_response(&member_id, false);
                    cx.respond(join.token, Response::Join(response));
                }
            }
            GroupState::Empty
            | GroupState::Dead
            | GroupState::Assigning
            | GroupState::Reconciling => {
                cx.respond(
                    join.token,
                    Response::Join(JoinResponse::error(member_id, GroupError::UnknownMemberId)),
                );
            }
        }
    }

    fn update_member_and_rebalance(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        join: Join,
        reason: &str,
    ) {
        self.update_member(
            cx,
            &join.member_id,
            join.protocols,
            join.rebalance_timeout_ms,
            join.session_timeout_ms,
            Some(join.token),
        );
        self.maybe_prepare_rebalance(cx, now, reason);
    }

    fn current_generation_join_response(
        &self,
        member_id: &str,
        include_members: bool,
    ) -> JoinResponse {
        JoinResponse {
            error: None,
            generation_id: self.generation_id,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader: self.leader_or_empty(),
            skip_assignment: false,
            member_id: member_id.to_string(),
            members: if include_members {
                self.current_member_metadata()
            } else {
                Vec::new()
            },
        }
    }

    pub(crate) fn handle_sync(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        token: RequestToken,
        req: SyncRequest,
    ) {
        if let Some(error) = self.validate_sync(&req) {
            cx.respond(token, Response::Sync(SyncResponse::error(error)));
            return;
        }
        match self.state {
            GroupState::Empty => {
                cx.respond(
                    token,
                    Response::Sync(SyncResponse::error(GroupError::UnknownMemberId)),
                );
            }
            GroupState::PreparingRebalance => {
                cx.respond(
                    token,
                    Response::Sync(SyncResponse::error(GroupError::RebalanceInProgress)),
                );
            }
            GroupState::CompletingRebalance => {
                let Some(member) = self.members.get_mut(&req.member_id) else {
                    cx.respond(
                        token,
                        Response::Sync(SyncResponse::error(GroupError::UnknownMemberId)),
                    );
                    return;
                };
                if let Some(superseded) = member.awaiting_sync.replace(token) {
                    cx.respond(
                        superseded,
                        Response::Sync(SyncResponse::error(GroupError::RebalanceInProgress)),
                    );
                }
                self.pending_sync.remove(&req.member_id);
                if self.is_leader(&req.member_id) {
                    tracing::info!(group = %self.id, generation = self.generation_id,
                        members = self.members.len(), "assignment received from the leader");
                    // Later entries win, as in Kafka's map; members the leader left out get an
                    // empty assignment.
                    let mut assignment: HashMap<String, Bytes> =
                        req.assignments.into_iter().collect();
                    for member_id in self.members.keys() {
                        assignment.entry(member_id.clone()).or_default();
                    }
                    let value = self.metadata_value(Some(&assignment));
                    cx.persist(
                        &self.id,
                        vec![RecordBody::GroupMetadata(value)],
                        Pending::Assignment {
                            group_id: self.id.clone(),
                            generation: self.generation_id,
                            assignment,
                        },
                    );
                }
            }
            GroupState::Stable => {
                // A member that missed the assignment (or a restarted static member) gets the
                // current one back.
                self.pending_sync.remove(&req.member_id);
                let assignment = self
                    .members
                    .get(&req.member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                cx.respond(
                    token,
                    Response::Sync(SyncResponse {
                        error: None,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        assignment,
                    }),
                );
                self.schedule_session_heartbeat(&req.member_id, now);
            }
            GroupState::Dead | GroupState::Assigning | GroupState::Reconciling => {
                cx.respond(
                    token,
                    Response::Sync(SyncResponse::error(GroupError::CoordinatorNotAvailable)),
                );
            }
        }
    }

    fn validate_sync(&self, req: &SyncRequest) -> Option<GroupError> {
        if self.state == GroupState::Dead {
            return Some(GroupError::CoordinatorNotAvailable);
        }
        if let Some(error) =
            self.validate_current_member(&req.member_id, req.group_instance_id.as_deref())
        {
            return Some(error);
        }
        if req.generation_id != self.generation_id {
            return Some(GroupError::IllegalGeneration);
        }
        if let Some(protocol_type) = &req.protocol_type {
            if self.protocol_type.as_ref() != Some(protocol_type) {
                return Some(GroupError::InconsistentGroupProtocol);
            }
        }
        if let Some(protocol_name) = &req.protocol_name {
            if self.protocol_name.as_ref() != Some(protocol_name) {
                return Some(GroupError::InconsistentGroupProtocol);
            }
        }
        None
    }

    /// Completion of the leader's assignment write.
    pub(crate) fn on_assignment_persisted(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        generation: i32,
        assignment: &HashMap<String, Bytes>,
        failure: Option<GroupError>,
    ) {
        // Someone may have joined or left while the write was in flight; then this generation
        // is over and its assignment is moot.
        if self.state != GroupState::CompletingRebalance || self.generation_id != generation {
            return;
        }
        match failure {
            None => {
                self.set_and_propagate_assignment(cx, now, assignment);
                self.complete_stable_transition();
            }
            Some(error) => {
                self.reset_and_propagate_assignment_error(cx, now, error);
                self.maybe_prepare_rebalance(
                    cx,
                    now,
                    "error when storing group assignment during SyncGroup",
                );
            }
        }
    }

    pub(crate) fn handle_heartbeat(
        &mut self,
        now: Duration,
        req: &HeartbeatRequest,
    ) -> Option<GroupError> {
        if self.state == GroupState::Dead {
            return Some(GroupError::CoordinatorNotAvailable);
        }
        if let Some(error) =
            self.validate_current_member(&req.member_id, req.group_instance_id.as_deref())
        {
            return Some(error);
        }
        if req.generation_id != self.generation_id {
            return Some(GroupError::IllegalGeneration);
        }
        match self.state {
            GroupState::Empty => Some(GroupError::UnknownMemberId),
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.schedule_session_heartbeat(&req.member_id, now);
                None
            }
            GroupState::PreparingRebalance => {
                // The heartbeat still counts: the member stays alive while it gets around to
                // rejoining.
                self.schedule_session_heartbeat(&req.member_id, now);
                Some(GroupError::RebalanceInProgress)
            }
            GroupState::Dead | GroupState::Assigning | GroupState::Reconciling => {
                Some(GroupError::CoordinatorNotAvailable)
            }
        }
    }

    pub(crate) fn handle_leave(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        members: Vec<LeavingMember>,
    ) -> Vec<LeftMember> {
        let mut results = Vec::with_capacity(members.len());
        for leaving in members {
            let reason = format!(
                "removing member {} on LeaveGroup; client reason: {}",
                leaving.member_id,
                leaving.reason.as_deref().unwrap_or("not provided")
            );
            let error = if leaving.member_id.is_empty() {
                // Administrative removal of a static member by its instance id.
                match leaving
                    .group_instance_id
                    .as_ref()
                    .and_then(|id| self.static_members.get(id))
                    .cloned()
                {
                    Some(current) => {
                        self.remove_member_and_update_group(cx, now, &current, &reason);
                        None
                    }
                    None => Some(GroupError::UnknownMemberId),
                }
            } else if self.pending_members.contains_key(&leaving.member_id) {
                self.remove_pending_member_and_update_group(cx, now, &leaving.member_id);
                None
            } else {
                match self.validate_current_member(
                    &leaving.member_id,
                    leaving.group_instance_id.as_deref(),
                ) {
                    Some(error) => Some(error),
                    None => {
                        self.remove_member_and_update_group(cx, now, &leaving.member_id, &reason);
                        None
                    }
                }
            };
            tracing::info!(group = %self.id, member = %leaving.member_id,
                instance = ?leaving.group_instance_id, error = ?error, "LeaveGroup");
            results.push(LeftMember {
                member_id: leaving.member_id,
                group_instance_id: leaving.group_instance_id,
                error,
            });
        }
        results
    }
}
