//! A runtime-free driver for `GroupsState`: it plays the broker (tokens, persistence, ticking)
//! with time advanced by hand, and checks that every request is answered exactly once.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use strata_core::{Offset, TopicPartition};
use strata_groups::subscription::encode_subscription;
use strata_groups::{
    CommitPartition, GroupConfig, GroupError, GroupsState, HeartbeatRequest, JoinRequest,
    JoinResponse, LeaveRequest, LeaveResponse, LeavingMember, OffsetCommitRequest,
    OffsetFetchRequest, OffsetFetchResponse, Output, PersistId, PersistOutcome, PersistRecord,
    Protocol, RequestToken, Response, SeededMemberIds, SyncRequest, SyncResponse, TopicId,
};

pub const SESSION_MS: i32 = 10_000;
pub const REBALANCE_MS: i32 = 30_000;

pub struct Harness {
    pub state: GroupsState,
    pub now: Duration,
    next_token: u64,
    pub answers: HashMap<RequestToken, Response>,
    /// Persists not yet completed, when `hold_persists` is set.
    pub held: Vec<(PersistId, Vec<PersistRecord>)>,
    /// Every record that became durable, in completion order.
    pub durable: Vec<PersistRecord>,
    pub hold_persists: bool,
    /// Topics JoinGroup resolves when a classic member joins a consumer group.
    pub catalog: BTreeMap<String, (TopicId, i32)>,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_config(GroupConfig::default())
    }

    pub fn with_config(config: GroupConfig) -> Self {
        Self::from_state(GroupsState::new(config, Box::new(SeededMemberIds::new(42))))
    }

    pub fn from_state(state: GroupsState) -> Self {
        Self {
            state,
            now: Duration::ZERO,
            next_token: 0,
            answers: HashMap::new(),
            held: Vec::new(),
            durable: Vec::new(),
            hold_persists: false,
            catalog: BTreeMap::new(),
        }
    }

    pub fn token(&mut self) -> RequestToken {
        self.next_token += 1;
        RequestToken(self.next_token)
    }

    pub fn absorb(&mut self, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Respond { token, response } => {
                    let previous = self.answers.insert(token, response);
                    assert!(previous.is_none(), "{token:?} answered twice");
                }
                Output::Persist { id, records } => {
                    if self.hold_persists {
                        self.held.push((id, records));
                    } else {
                        self.durable.extend(records);
                        let more =
                            self.state
                                .persist_completed(self.now, id, PersistOutcome::Durable);
                        self.absorb(more);
                    }
                }
            }
        }
    }

    /// Completes the oldest held persist.
    pub fn complete_persist(&mut self, outcome: PersistOutcome) -> PersistId {
        assert!(!self.held.is_empty(), "no persist is held");
        let (id, records) = self.held.remove(0);
        if outcome == PersistOutcome::Durable {
            self.durable.extend(records);
        }
        let out = self.state.persist_completed(self.now, id, outcome);
        self.absorb(out);
        id
    }

    pub fn advance_ms(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        let out = self.state.tick(self.now);
        self.absorb(out);
    }

    /// Ticks from deadline to deadline until `done` holds (or `limit_ms` passes).
    pub fn run_until(&mut self, limit_ms: u64, mut done: impl FnMut(&Self) -> bool) {
        let limit = self.now + Duration::from_millis(limit_ms);
        while !done(self) {
            let next = self
                .state
                .next_deadline()
                .expect("nothing left to wait for");
            assert!(next <= limit, "condition not reached within {limit_ms} ms");
            if next > self.now {
                self.now = next;
            }
            let out = self.state.tick(self.now);
            self.absorb(out);
        }
    }

    pub fn answered(&self, token: RequestToken) -> bool {
        self.answers.contains_key(&token)
    }

    pub fn join_response(&self, token: RequestToken) -> JoinResponse {
        match self.answers.get(&token) {
            Some(Response::Join(r)) => r.clone(),
            other => panic!("{token:?}: expected a JoinGroup response, got {other:?}"),
        }
    }

    pub fn sync_response(&self, token: RequestToken) -> SyncResponse {
        match self.answers.get(&token) {
            Some(Response::Sync(r)) => r.clone(),
            other => panic!("{token:?}: expected a SyncGroup response, got {other:?}"),
        }
    }

    pub fn join(&mut self, req: JoinRequest) -> RequestToken {
        let token = self.token();
        let out = self.state.handle_join(self.now, token, req, &self.catalog);
        self.absorb(out);
        token
    }

    /// A v4+ new member: fetches a member id (MEMBER_ID_REQUIRED), then rejoins with it.
    /// Returns the member id and the token of the (usually parked) second JoinGroup.
    pub fn join_new(&mut self, mut req: JoinRequest) -> (String, RequestToken) {
        assert!(req.member_id.is_empty());
        if req.group_instance_id.is_some() || req.api_version < 4 {
            let token = self.join(req);
            return (String::new(), token);
        }
        let first = self.join(req.clone());
        let response = self.join_response(first);
        assert_eq!(response.error, Some(GroupError::MemberIdRequired));
        req.member_id = response.member_id.clone();
        let token = self.join(req);
        (response.member_id, token)
    }

    pub fn sync(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> RequestToken {
        let token = self.token();
        let out = self.state.handle_sync(
            self.now,
            token,
            SyncRequest {
                group_id: group.into(),
                generation_id: generation,
                member_id: member_id.into(),
                group_instance_id: instance.map(Into::into),
                protocol_type: Some("consumer".into()),
                protocol_name: None,
                assignments,
            },
        );
        self.absorb(out);
        token
    }

    pub fn heartbeat(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance: Option<&str>,
    ) -> Option<GroupError> {
        let token = self.token();
        let out = self.state.handle_heartbeat(
            self.now,
            token,
            HeartbeatRequest {
                group_id: group.into(),
                generation_id: generation,
                member_id: member_id.into(),
                group_instance_id: instance.map(Into::into),
            },
        );
        self.absorb(out);
        match self.answers.get(&token) {
            Some(Response::Heartbeat(r)) => r.error,
            other => panic!("expected a Heartbeat response, got {other:?}"),
        }
    }

    pub fn leave(&mut self, group: &str, members: Vec<LeavingMember>) -> LeaveResponse {
        let token = self.token();
        let out = self.state.handle_leave(
            self.now,
            token,
            LeaveRequest {
                group_id: group.into(),
                members,
            },
        );
        self.absorb(out);
        match self.answers.get(&token) {
            Some(Response::Leave(r)) => r.clone(),
            other => panic!("expected a LeaveGroup response, got {other:?}"),
        }
    }

    pub fn commit(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        offsets: &[(&str, i32, i64)],
    ) -> RequestToken {
        let token = self.token();
        let out = self.state.handle_offset_commit(
            self.now,
            token,
            OffsetCommitRequest {
                group_id: group.into(),
                generation_id: generation,
                member_id: member_id.into(),
                group_instance_id: None,
                commit_timestamp_ms: 1_700_000_000_000,
                partitions: offsets
                    .iter()
                    .map(|(topic, partition, offset)| CommitPartition {
                        partition: TopicPartition::new(*topic, *partition),
                        offset: Offset(*offset),
                        leader_epoch: Some(3),
                        metadata: Some(format!("m{offset}")),
                    })
                    .collect(),
            },
        );
        self.absorb(out);
        token
    }

    pub fn commit_errors(&self, token: RequestToken) -> Vec<Option<GroupError>> {
        match self.answers.get(&token) {
            Some(Response::OffsetCommit(r)) => r.partitions.iter().map(|(_, e)| *e).collect(),
            other => panic!("expected an OffsetCommit response, got {other:?}"),
        }
    }

    pub fn fetch(&self, group: &str, partitions: Option<&[(&str, i32)]>) -> OffsetFetchResponse {
        self.state.offset_fetch(&OffsetFetchRequest {
            member: None,
            group_id: group.into(),
            partitions: partitions.map(|ps| {
                ps.iter()
                    .map(|(t, p)| TopicPartition::new(*t, *p))
                    .collect()
            }),
            require_stable: false,
        })
    }
}

pub fn subscription(topics: &[&str]) -> Bytes {
    Bytes::from(encode_subscription(1, topics, None))
}

/// A v9 consumer JoinGroup with the "range" protocol.
pub fn join_req(group: &str, member_id: &str, client_id: &str, topics: &[&str]) -> JoinRequest {
    JoinRequest {
        api_version: 9,
        group_id: group.into(),
        member_id: member_id.into(),
        group_instance_id: None,
        client_id: client_id.into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        protocol_type: "consumer".into(),
        protocols: vec![Protocol::new("range", subscription(topics))],
        reason: None,
    }
}

pub fn static_join_req(
    group: &str,
    instance: &str,
    client_id: &str,
    topics: &[&str],
) -> JoinRequest {
    JoinRequest {
        group_instance_id: Some(instance.into()),
        ..join_req(group, "", client_id, topics)
    }
}

pub fn assignment_for(member_id: &str) -> Bytes {
    Bytes::from(format!("assignment-of-{member_id}"))
}

/// A member of a stable group, as the test client sees itself.
#[derive(Debug, Clone)]
pub struct Joined {
    pub member_id: String,
    pub instance: Option<String>,
    pub generation: i32,
}

/// Joins every request (all within the initial delay), completes the rebalance, has the leader
/// assign `assignment-of-<member>` and every member sync. Returns members in join order.
pub fn form_stable_group(h: &mut Harness, group: &str, requests: Vec<JoinRequest>) -> Vec<Joined> {
    let mut tokens = Vec::new();
    for req in requests {
        let instance = req.group_instance_id.clone();
        let (_, token) = h.join_new(req);
        tokens.push((token, instance));
    }
    h.run_until(120_000, |h| tokens.iter().all(|(t, _)| h.answered(*t)));
    let joined: Vec<(JoinResponse, Option<String>)> = tokens
        .iter()
        .map(|(t, instance)| (h.join_response(*t), instance.clone()))
        .collect();
    for (response, _) in &joined {
        assert_eq!(response.error, None, "{response:?}");
    }
    let generation = joined[0].0.generation_id;
    let leader = joined[0].0.leader.clone();
    let mut sync_tokens = Vec::new();
    for (response, instance) in &joined {
        if response.member_id != leader {
            sync_tokens.push(h.sync(
                group,
                generation,
                &response.member_id,
                instance.as_deref(),
                vec![],
            ));
        }
    }
    let (leader_response, leader_instance) = joined
        .iter()
        .find(|(r, _)| r.member_id == leader)
        .expect("the leader is among the joiners");
    let assignments = leader_response
        .members
        .iter()
        .map(|m| (m.member_id.clone(), assignment_for(&m.member_id)))
        .collect();
    sync_tokens.push(h.sync(
        group,
        generation,
        &leader,
        leader_instance.as_deref(),
        assignments,
    ));
    for token in sync_tokens {
        let response = h.sync_response(token);
        assert_eq!(response.error, None);
    }
    joined
        .into_iter()
        .map(|(r, instance)| Joined {
            member_id: r.member_id,
            instance,
            generation: r.generation_id,
        })
        .collect()
}
