//! Committed offsets of one group: OffsetCommit validation and staging, OffsetFetch, and
//! OffsetDelete, following Kafka's GroupCoordinator and GroupMetadataManager.
//!
//! A commit is *staged* (pending) while its record is being written and only becomes visible
//! once storage confirms it, exactly as Kafka keeps `pendingOffsetCommits` until the append to
//! `__consumer_offsets` completes.

use std::collections::HashSet;
use std::time::Duration;

use strata_core::{Offset, TopicPartition};

use crate::api::{
    FetchedOffset, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteResponse, RequestToken,
    Response,
};
use crate::error::GroupError;
use crate::group::{Group, GroupState, StoredOffset, CONSUMER_PROTOCOL_TYPE};
use crate::record::{OffsetValue, RecordBody};
use crate::state::{Ctx, Pending};

impl Group {
    /// Kafka's `validateOffsetCommit`. Members commit with their member id and generation; a
    /// consumer outside group management (generation -1, no member id) may commit only while
    /// the group has no members, so it cannot clobber a live group's progress.
    pub(crate) fn validate_offset_commit(
        &self,
        generation_id: i32,
        member_id: &str,
        group_instance_id: Option<&str>,
        partitions: &[&TopicPartition],
    ) -> Option<GroupError> {
        if self.consumer.is_some() {
            return self.validate_consumer_commit(generation_id, member_id, partitions);
        }
        if self.state == GroupState::Dead {
            return Some(GroupError::CoordinatorNotAvailable);
        }
        if generation_id >= 0 || !member_id.is_empty() || group_instance_id.is_some() {
            if let Some(error) = self.validate_current_member(member_id, group_instance_id) {
                return Some(error);
            }
            if generation_id != self.generation_id {
                return Some(GroupError::IllegalGeneration);
            }
            None
        } else if self.state != GroupState::Empty {
            Some(GroupError::UnknownMemberId)
        } else {
            None
        }
    }

    pub(crate) fn handle_offset_commit(
        &mut self,
        cx: &mut Ctx<'_>,
        now: Duration,
        token: RequestToken,
        req: OffsetCommitRequest,
    ) {
        let reject_all = |cx: &mut Ctx<'_>, error: GroupError, req: OffsetCommitRequest| {
            let partitions = req
                .partitions
                .into_iter()
                .map(|p| (p.partition, Some(error)))
                .collect();
            cx.respond(
                token,
                Response::OffsetCommit(OffsetCommitResponse { partitions }),
            );
        };
        let partitions: Vec<&TopicPartition> =
            req.partitions.iter().map(|p| &p.partition).collect();
        if let Some(error) = self.validate_offset_commit(
            req.generation_id,
            &req.member_id,
            req.group_instance_id.as_deref(),
            &partitions,
        ) {
            reject_all(cx, error, req);
            return;
        }
        match self.state {
            GroupState::Empty => self.store_offsets(cx, token, req),
            GroupState::Stable | GroupState::PreparingRebalance => {
                // Commits are still welcome while preparing a rebalance (the heartbeat tells
                // the member to rejoin), and they prove the member alive.
                self.schedule_session_heartbeat(&req.member_id, now);
                self.store_offsets(cx, token, req);
            }
            GroupState::CompletingRebalance => {
                // The member holds the new generation but no assignment yet; its partitions
                // are about to change, so it must finish the rebalance first.
                reject_all(cx, GroupError::RebalanceInProgress, req);
            }
            GroupState::Dead | GroupState::Assigning | GroupState::Reconciling => {
                reject_all(cx, GroupError::CoordinatorNotAvailable, req)
            }
        }
    }

    fn store_offsets(&mut self, cx: &mut Ctx<'_>, token: RequestToken, req: OffsetCommitRequest) {
        let max_metadata = cx.config.offset_metadata_max_bytes;
        let mut results = Vec::with_capacity(req.partitions.len());
        let mut staged = Vec::with_capacity(req.partitions.len());
        for partition in req.partitions {
            let metadata = partition.metadata.unwrap_or_default();
            // Kafka measures the Java string length (UTF-16 code units).
            if metadata.encode_utf16().count() > max_metadata {
                results.push((
                    partition.partition,
                    Some(GroupError::OffsetMetadataTooLarge),
                ));
                continue;
            }
            results.push((partition.partition.clone(), None));
            staged.push((
                partition.partition,
                OffsetValue {
                    offset: partition.offset,
                    leader_epoch: partition.leader_epoch,
                    metadata,
                    commit_timestamp_ms: req.commit_timestamp_ms,
                },
            ));
        }
        if staged.is_empty() {
            cx.respond(
                token,
                Response::OffsetCommit(OffsetCommitResponse {
                    partitions: results,
                }),
            );
            return;
        }
        let bodies = staged
            .iter()
            .map(|(partition, value)| RecordBody::Offset {
                partition: partition.clone(),
                value: value.clone(),
            })
            .collect();
        let partitions: Vec<TopicPartition> = staged.iter().map(|(p, _)| p.clone()).collect();
        let id = cx.persist(
            &self.id,
            bodies,
            Pending::OffsetCommit {
                group_id: self.id.clone(),
                token,
                staged,
                results,
            },
        );
        for partition in partitions {
            self.pending_offset_commits.insert(partition, id.0);
        }
    }

    /// Applies a durable commit. A partition whose pending entry is gone was deleted while the
    /// write was in flight and stays deleted; an older commit never overwrites a newer one.
    pub(crate) fn apply_committed(&mut self, seq: u64, staged: Vec<(TopicPartition, OffsetValue)>) {
        for (partition, value) in staged {
            let Some(&newest_pending) = self.pending_offset_commits.get(&partition) else {
                continue;
            };
            if self.offsets.get(&partition).is_none_or(|s| s.seq <= seq) {
                self.offsets
                    .insert(partition.clone(), StoredOffset { value, seq });
            }
            if newest_pending == seq {
                self.pending_offset_commits.remove(&partition);
            }
        }
    }

    pub(crate) fn fail_pending_commits(
        &mut self,
        seq: u64,
        staged: &[(TopicPartition, OffsetValue)],
    ) {
        for (partition, _) in staged {
            if self.pending_offset_commits.get(partition) == Some(&seq) {
                self.pending_offset_commits.remove(partition);
            }
        }
    }

    pub(crate) fn fetch_offsets(
        &self,
        partitions: Option<&[TopicPartition]>,
        require_stable: bool,
    ) -> Vec<FetchedOffset> {
        let all: Vec<TopicPartition>;
        let partitions = match partitions {
            Some(listed) => listed,
            None => {
                all = self.offsets.keys().cloned().collect();
                &all
            }
        };
        partitions
            .iter()
            .map(|partition| {
                if require_stable
                    && (self.pending_offset_commits.contains_key(partition)
                        || self
                            .pending_txn_offsets
                            .values()
                            .any(|p| p.contains_key(partition)))
                {
                    return unknown_offset(partition, Some(GroupError::UnstableOffsetCommit));
                }
                match self.offsets.get(partition) {
                    Some(stored) => FetchedOffset {
                        partition: partition.clone(),
                        offset: stored.value.offset,
                        leader_epoch: stored.value.leader_epoch,
                        metadata: stored.value.metadata.clone(),
                        error: None,
                    },
                    None => unknown_offset(partition, None),
                }
            })
            .collect()
    }

    /// Kafka's `handleDeleteOffsets`: an Empty group may drop any offsets; a consumer group
    /// with members only those of topics none of its members subscribes to.
    pub(crate) fn handle_offset_delete(
        &mut self,
        cx: &mut Ctx<'_>,
        token: RequestToken,
        partitions: Vec<TopicPartition>,
    ) {
        let mut seen = HashSet::new();
        let partitions: Vec<TopicPartition> = partitions
            .into_iter()
            .filter(|p| seen.insert(p.clone()))
            .collect();
        let group_error = match self.state {
            GroupState::Dead => Some(GroupError::GroupIdNotFound),
            GroupState::Empty => None,
            GroupState::PreparingRebalance
            | GroupState::CompletingRebalance
            | GroupState::Stable
                if self.protocol_type.as_deref() == Some(CONSUMER_PROTOCOL_TYPE) =>
            {
                None
            }
            _ => Some(GroupError::NonEmptyGroup),
        };
        if let Some(error) = group_error {
            cx.respond(
                token,
                Response::OffsetDelete(OffsetDeleteResponse {
                    error: Some(error),
                    partitions: Vec::new(),
                }),
            );
            return;
        }
        let check_subscription = self.effective_state() != GroupState::Empty;
        let mut results = Vec::with_capacity(partitions.len());
        let mut removed = Vec::new();
        let mut removed_pending = Vec::new();
        let mut bodies = Vec::new();
        for partition in partitions {
            if check_subscription && self.is_subscribed_to_topic(&partition.topic) {
                results.push((partition, Some(GroupError::GroupSubscribedToTopic)));
                continue;
            }
            let had_offset = self.offsets.remove(&partition);
            let had_pending = self.pending_offset_commits.remove(&partition);
            // A commit still in flight gets a tombstone too: it is ordered before the
            // tombstone, so replay cannot resurrect it.
            if had_offset.is_some() || had_pending.is_some() {
                bodies.push(RecordBody::OffsetTombstone {
                    partition: partition.clone(),
                });
            }
            if let Some(stored) = had_offset {
                removed.push((partition.clone(), stored));
            }
            if let Some(seq) = had_pending {
                removed_pending.push((partition.clone(), seq));
            }
            results.push((partition, None));
        }
        let response = OffsetDeleteResponse {
            error: None,
            partitions: results,
        };
        if bodies.is_empty() {
            cx.respond(token, Response::OffsetDelete(response));
            return;
        }
        tracing::info!(group = %self.id, partitions = bodies.len(), "deleting committed offsets");
        cx.persist(
            &self.id,
            bodies,
            Pending::OffsetDelete {
                group_id: self.id.clone(),
                token,
                response,
                removed,
                removed_pending,
            },
        );
    }
}

pub(crate) fn unknown_offset(
    partition: &TopicPartition,
    error: Option<GroupError>,
) -> FetchedOffset {
    FetchedOffset {
        partition: partition.clone(),
        offset: Offset(-1),
        leader_epoch: None,
        metadata: String::new(),
        error,
    }
}
