//! Share groups (KIP-932): membership and assignment, as Kafka 4.x's GroupMetadataManager
//! handles ShareGroupHeartbeat, without IO.
//!
//! Share groups have no reconciliation: partitions are shared, so nothing is revoked before it
//! is handed out. Every member is assigned every partition of the topics it subscribes to
//! (Kafka's share `SimpleAssignor` gives a partition to several members; with all of them on
//! it, each partition's records spread over every member). A member's epoch moves to the group
//! epoch whenever its assignment changes. Membership is kept in memory only: members that find
//! a new coordinator (after a move or a restart) get UNKNOWN_MEMBER_ID and join again with
//! epoch 0, which costs them nothing since share groups keep no per-member progress — the
//! delivery state lives in the share partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::assignor::Assignment;
use crate::error::GroupError;
use crate::ids::MemberIdGenerator;
use crate::TopicCatalog;

/// Membership tunables (Kafka's `group.share.*` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareGroupConfig {
    /// `group.share.session.timeout.ms`: a member silent this long is removed.
    pub session_timeout: Duration,
    /// `group.share.heartbeat.interval.ms`: how often members are told to heartbeat.
    pub heartbeat_interval: Duration,
    /// `group.share.max.size`: members of one share group.
    pub max_size: usize,
    /// `group.share.max.groups`: share groups of one coordinator.
    pub max_groups: usize,
}

impl Default for ShareGroupConfig {
    fn default() -> Self {
        Self {
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(5),
            max_size: 200,
            max_groups: 10,
        }
    }
}

/// A ShareGroupHeartbeat, decoded.
#[derive(Debug, Clone, Default)]
pub struct ShareHeartbeatRequest {
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    /// None: unchanged since the last heartbeat.
    pub subscribed_topic_names: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
    /// The group's own `share.session.timeout.ms` and `share.heartbeat.interval.ms`, which
    /// the broker passes in; unset ones are the coordinator's.
    pub timeouts: crate::api::GroupTimeouts,
}

/// The answer; `assignment` is sent when it changed (or on joining), as Kafka does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareHeartbeatResponse {
    pub error: Option<GroupError>,
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    pub assignment: Option<Assignment>,
}

/// ShareGroupDescribe's view of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareMemberDescription {
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub assignment: Assignment,
}

/// ShareGroupDescribe's view of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupDescription {
    pub group_id: String,
    /// Kafka's share group states: "Empty" or "Stable".
    pub state: &'static str,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub members: Vec<ShareMemberDescription>,
}

#[derive(Debug, Clone)]
struct Member {
    epoch: i32,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    subscribed: BTreeSet<String>,
    assignment: Assignment,
    deadline: Duration,
}

#[derive(Debug, Clone, Default)]
struct Group {
    epoch: i32,
    members: BTreeMap<String, Member>,
}

impl Group {
    fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else {
            "Stable"
        }
    }
}

/// Every share group of one coordinator.
#[derive(Debug)]
pub struct ShareGroups {
    config: ShareGroupConfig,
    ids: Box<dyn MemberIdGenerator>,
    groups: BTreeMap<String, Group>,
}

/// Kafka's epoch to leave with.
pub const SHARE_LEAVE_EPOCH: i32 = -1;

impl ShareGroups {
    pub fn new(config: ShareGroupConfig, ids: Box<dyn MemberIdGenerator>) -> Self {
        Self {
            config,
            ids,
            groups: BTreeMap::new(),
        }
    }

    pub fn contains(&self, group_id: &str) -> bool {
        self.groups.contains_key(group_id)
    }

    /// Handles one heartbeat at `now`.
    pub fn heartbeat(
        &mut self,
        req: ShareHeartbeatRequest,
        now: Duration,
        catalog: &dyn TopicCatalog,
    ) -> ShareHeartbeatResponse {
        let interval = i32::try_from(
            req.timeouts
                .heartbeat_interval
                .unwrap_or(self.config.heartbeat_interval)
                .as_millis(),
        )
        .unwrap_or(i32::MAX);
        let refuse = |error: GroupError, req: &ShareHeartbeatRequest| ShareHeartbeatResponse {
            error: Some(error),
            member_id: req.member_id.clone(),
            member_epoch: req.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        };
        if req.group_id.is_empty() {
            return refuse(GroupError::InvalidGroupId, &req);
        }
        self.expire(now);
        if req.member_epoch == SHARE_LEAVE_EPOCH {
            if let Some(group) = self.groups.get_mut(&req.group_id) {
                if group.members.remove(&req.member_id).is_some() {
                    group.epoch += 1;
                }
            }
            return ShareHeartbeatResponse {
                error: None,
                member_id: req.member_id,
                member_epoch: SHARE_LEAVE_EPOCH,
                heartbeat_interval_ms: 0,
                assignment: None,
            };
        }
        if req.member_epoch < 0 {
            return refuse(GroupError::InvalidRequest, &req);
        }
        let joining = req.member_epoch == 0;
        if joining
            && req
                .subscribed_topic_names
                .as_ref()
                .is_none_or(|t| t.is_empty())
        {
            return refuse(GroupError::InvalidRequest, &req);
        }
        if !self.groups.contains_key(&req.group_id) {
            if !joining {
                return refuse(GroupError::UnknownMemberId, &req);
            }
            if self.groups.len() >= self.config.max_groups {
                return refuse(GroupError::GroupMaxSizeReached, &req);
            }
        }
        let max_size = self.config.max_size;
        let session = req.timeouts.session.unwrap_or(self.config.session_timeout);
        let member_id = if req.member_id.is_empty() {
            self.ids.next_suffix()
        } else {
            req.member_id.clone()
        };
        let group = self.groups.entry(req.group_id.clone()).or_default();
        match group.members.get(&member_id) {
            None if !joining => return refuse(GroupError::UnknownMemberId, &req),
            None if group.members.len() >= max_size => {
                return refuse(GroupError::GroupMaxSizeReached, &req)
            }
            Some(m) if !joining && m.epoch != req.member_epoch => {
                return refuse(GroupError::FencedMemberEpoch, &req)
            }
            _ => {}
        }
        let member = group
            .members
            .entry(member_id.clone())
            .or_insert_with(|| Member {
                epoch: 0,
                rack_id: None,
                client_id: String::new(),
                client_host: String::new(),
                subscribed: BTreeSet::new(),
                assignment: Assignment::new(),
                deadline: now,
            });
        member.deadline = now + session;
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        if req.rack_id.is_some() {
            member.rack_id = req.rack_id;
        }
        if let Some(topics) = req.subscribed_topic_names {
            member.subscribed = topics.into_iter().collect();
        }
        let target = assign(&member.subscribed, catalog);
        let changed = joining || target != member.assignment || member.epoch == 0;
        if changed {
            group.epoch += 1;
            member.assignment = target;
            member.epoch = group.epoch;
        }
        ShareHeartbeatResponse {
            error: None,
            member_id,
            member_epoch: member.epoch,
            heartbeat_interval_ms: interval,
            assignment: changed.then(|| member.assignment.clone()),
        }
    }

    /// Removes members whose session lapsed at `now`; returns (group, member) removed.
    pub fn expire(&mut self, now: Duration) -> Vec<(String, String)> {
        let mut gone = Vec::new();
        for (group_id, group) in &mut self.groups {
            let before = group.members.len();
            group.members.retain(|member_id, m| {
                let keep = m.deadline > now;
                if !keep {
                    gone.push((group_id.clone(), member_id.clone()));
                }
                keep
            });
            if group.members.len() != before {
                group.epoch += 1;
            }
        }
        gone
    }

    pub fn describe(&self, group_id: &str) -> Option<ShareGroupDescription> {
        let g = self.groups.get(group_id)?;
        Some(ShareGroupDescription {
            group_id: group_id.to_string(),
            state: g.state(),
            group_epoch: g.epoch,
            assignment_epoch: g.epoch,
            members: g
                .members
                .iter()
                .map(|(id, m)| ShareMemberDescription {
                    member_id: id.clone(),
                    member_epoch: m.epoch,
                    rack_id: m.rack_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed.iter().cloned().collect(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        })
    }

    /// (group id, state) of every share group.
    pub fn list(&self) -> Vec<(String, &'static str)> {
        self.groups
            .iter()
            .map(|(id, g)| (id.clone(), g.state()))
            .collect()
    }

    /// DeleteGroups: only an empty group goes (NON_EMPTY_GROUP otherwise, GROUP_ID_NOT_FOUND
    /// for none).
    pub fn delete(&mut self, group_id: &str, now: Duration) -> Result<(), GroupError> {
        self.expire(now);
        match self.groups.get(group_id) {
            None => Err(GroupError::GroupIdNotFound),
            Some(g) if !g.members.is_empty() => Err(GroupError::NonEmptyGroup),
            Some(_) => {
                self.groups.remove(group_id);
                Ok(())
            }
        }
    }

    /// Forgets every group (the coordinator shard moved away): their members join the new
    /// coordinator.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.groups.retain(|id, _| keep(id));
    }
}

/// Kafka's share assignment here: every partition of every subscribed topic that exists.
fn assign(subscribed: &BTreeSet<String>, catalog: &dyn TopicCatalog) -> Assignment {
    let mut out = Assignment::new();
    for name in subscribed {
        if let Some((id, partitions)) = catalog.lookup(name) {
            if partitions > 0 {
                out.insert(id, (0..partitions).collect());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SeededMemberIds, TopicId};

    struct Catalog(Vec<(&'static str, TopicId, i32)>);

    impl TopicCatalog for Catalog {
        fn lookup(&self, name: &str) -> Option<(TopicId, i32)> {
            self.0.iter().find(|t| t.0 == name).map(|t| (t.1, t.2))
        }
        fn names(&self) -> Vec<String> {
            self.0.iter().map(|t| t.0.to_string()).collect()
        }
        fn version(&self) -> u64 {
            0
        }
    }

    fn groups() -> ShareGroups {
        ShareGroups::new(
            ShareGroupConfig::default(),
            Box::new(SeededMemberIds::new(7)),
        )
    }

    fn join(member: &str, topics: &[&str]) -> ShareHeartbeatRequest {
        ShareHeartbeatRequest {
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: 0,
            subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
            ..Default::default()
        }
    }

    fn beat(member: &str, epoch: i32) -> ShareHeartbeatRequest {
        ShareHeartbeatRequest {
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: epoch,
            ..Default::default()
        }
    }

    const T: TopicId = TopicId([1; 16]);

    #[test]
    fn every_member_is_assigned_every_partition_of_its_topics() {
        let cat = Catalog(vec![("t", T, 2)]);
        let mut g = groups();
        let now = Duration::ZERO;
        let a = g.heartbeat(join("a", &["t"]), now, &cat);
        let b = g.heartbeat(join("b", &["t", "missing"]), now, &cat);
        assert_eq!((a.error, a.member_epoch, b.member_epoch), (None, 1, 2));
        let all: Assignment = [(T, [0, 1].into())].into();
        assert_eq!(a.assignment, Some(all.clone()));
        assert_eq!(b.assignment, Some(all));
        // Nothing changed for a: same epoch, no assignment sent.
        let again = g.heartbeat(beat("a", 1), now, &cat);
        assert_eq!(
            (again.error, again.member_epoch, again.assignment),
            (None, 1, None)
        );
        // A partition added to the topic reaches a at its next heartbeat, with a new epoch.
        let cat = Catalog(vec![("t", T, 3)]);
        let grown = g.heartbeat(beat("a", 1), now, &cat);
        assert_eq!(grown.member_epoch, 3);
        assert_eq!(grown.assignment, Some([(T, [0, 1, 2].into())].into()));
    }

    #[test]
    fn wrong_epochs_and_unknown_members_are_refused() {
        let cat = Catalog(vec![("t", T, 1)]);
        let mut g = groups();
        let now = Duration::ZERO;
        g.heartbeat(join("a", &["t"]), now, &cat);
        assert_eq!(
            g.heartbeat(beat("a", 5), now, &cat).error,
            Some(GroupError::FencedMemberEpoch)
        );
        assert_eq!(
            g.heartbeat(beat("zz", 1), now, &cat).error,
            Some(GroupError::UnknownMemberId)
        );
        assert_eq!(
            g.heartbeat(join("b", &[]), now, &cat).error,
            Some(GroupError::InvalidRequest)
        );
    }

    #[test]
    fn a_groups_own_session_timeout_and_heartbeat_interval_override_the_coordinators() {
        let cat = Catalog(vec![("t", T, 1)]);
        let mut g = groups();
        let mut r = join("a", &["t"]);
        r.timeouts = crate::api::GroupTimeouts {
            session: Some(Duration::from_secs(3)),
            heartbeat_interval: Some(Duration::from_millis(700)),
        };
        assert_eq!(
            g.heartbeat(r, Duration::ZERO, &cat).heartbeat_interval_ms,
            700
        );
        g.heartbeat(join("b", &["t"]), Duration::ZERO, &cat);
        // a's own 3 s session ends long before b's 45 s one.
        assert_eq!(
            g.expire(Duration::from_secs(3)),
            vec![("g".to_string(), "a".to_string())]
        );
        assert_eq!(g.expire(Duration::from_secs(44)), vec![]);
    }

    #[test]
    fn a_silent_member_is_removed_after_the_session_timeout_and_a_leaver_at_once() {
        let cat = Catalog(vec![("t", T, 1)]);
        let mut g = groups();
        g.heartbeat(join("a", &["t"]), Duration::ZERO, &cat);
        g.heartbeat(join("b", &["t"]), Duration::from_secs(10), &cat);
        assert_eq!(g.expire(Duration::from_secs(44)), vec![]);
        assert_eq!(
            g.expire(Duration::from_secs(45)),
            vec![("g".to_string(), "a".to_string())]
        );
        let d = g.describe("g").unwrap();
        assert_eq!((d.state, d.members.len(), d.group_epoch), ("Stable", 1, 3));
        assert_eq!(
            g.heartbeat(beat("a", 1), Duration::from_secs(46), &cat)
                .error,
            Some(GroupError::UnknownMemberId)
        );
        assert_eq!(
            g.delete("g", Duration::from_secs(46)),
            Err(GroupError::NonEmptyGroup)
        );
        let left = g.heartbeat(beat("b", SHARE_LEAVE_EPOCH), Duration::from_secs(46), &cat);
        assert_eq!((left.error, left.member_epoch), (None, -1));
        assert_eq!(g.list(), vec![("g".to_string(), "Empty")]);
        assert_eq!(g.delete("g", Duration::from_secs(46)), Ok(()));
        assert_eq!(
            g.delete("g", Duration::from_secs(46)),
            Err(GroupError::GroupIdNotFound)
        );
    }

    #[test]
    fn groups_and_members_are_bounded() {
        let cat = Catalog(vec![("t", T, 1)]);
        let config = ShareGroupConfig {
            max_size: 1,
            max_groups: 1,
            ..ShareGroupConfig::default()
        };
        let mut g = ShareGroups::new(config, Box::new(SeededMemberIds::new(1)));
        g.heartbeat(join("a", &["t"]), Duration::ZERO, &cat);
        assert_eq!(
            g.heartbeat(join("b", &["t"]), Duration::ZERO, &cat).error,
            Some(GroupError::GroupMaxSizeReached)
        );
        let mut other = join("a", &["t"]);
        other.group_id = "h".into();
        assert_eq!(
            g.heartbeat(other, Duration::ZERO, &cat).error,
            Some(GroupError::GroupMaxSizeReached)
        );
    }
}
