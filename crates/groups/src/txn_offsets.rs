//! Offsets committed inside a transaction (TxnOffsetCommit), following Kafka's
//! GroupMetadata `pendingTransactionalOffsetCommits`: written at once as `TxnOffset` records of
//! the producer, invisible to OffsetFetch (which answers UNSTABLE_OFFSET_COMMIT to
//! `require_stable` fetches meanwhile), and, when the transaction's marker reaches this
//! shard's partition, turned into ordinary offsets (commit) or dropped (abort) by one batch
//! that also deletes the pending records. Replay rebuilds the pending set from the records, so
//! a coordinator that moves keeps a transaction's offsets until its marker arrives.

use std::time::Duration;

use strata_core::TopicPartition;

use crate::api::{CommitPartition, OffsetCommitResponse, Output, RequestToken, Response};
use crate::error::GroupError;
use crate::group::{Group, StoredOffset};
use crate::record::{OffsetValue, RecordBody};
use crate::state::{Ctx, GroupsState, Pending};

/// TxnOffsetCommit for one group, as the broker passes it on.
#[derive(Debug, Clone, PartialEq)]
pub struct TxnOffsetCommitRequest {
    pub group_id: String,
    pub producer_id: i64,
    /// -1 (with an empty member id) from producers that send no group metadata (v0–v2).
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub commit_timestamp_ms: i64,
    pub partitions: Vec<CommitPartition>,
}

impl GroupsState {
    /// TxnOffsetCommit: answered once the pending offsets are durable. A group that does not
    /// exist yet is created (Empty) to hold them, as Kafka does.
    pub fn handle_txn_offset_commit(
        &mut self,
        now: Duration,
        token: RequestToken,
        req: TxnOffsetCommitRequest,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        let group_id = req.group_id.clone();
        self.ensure_group(&group_id);
        self.with_group_at(&group_id, now, &mut out, |group, cx| {
            group.stage_txn_offsets(cx, token, req)
        });
        out
    }

    /// The groups of this shard holding offsets of `producer_id`'s open transaction.
    pub fn groups_with_txn_offsets(&self, producer_id: i64) -> Vec<String> {
        let mut ids: Vec<String> = self
            .groups_iter()
            .filter(|g| g.pending_txn_offsets.contains_key(&producer_id))
            .map(|g| g.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// The transaction of `producer_id` ended (its marker is in this shard's partition): make
    /// its offsets of `group_id` visible (commit) or drop them. Answered `Response::TxnEnd`
    /// once durable, at once when nothing pends.
    pub fn handle_txn_end(
        &mut self,
        now: Duration,
        token: RequestToken,
        group_id: &str,
        producer_id: i64,
        commit: bool,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        let handled = self.with_group_at(group_id, now, &mut out, |group, cx| {
            group.end_txn(cx, token, producer_id, commit)
        });
        if handled != Some(true) {
            out.push(Output::Respond {
                token,
                response: Response::TxnEnd(None),
            });
        }
        out
    }
}

impl Group {
    fn stage_txn_offsets(
        &mut self,
        cx: &mut Ctx<'_>,
        token: RequestToken,
        req: TxnOffsetCommitRequest,
    ) {
        let respond_all = |cx: &mut Ctx<'_>, error: GroupError, req: TxnOffsetCommitRequest| {
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
        // Producers that send the consumer's group metadata (v3+) are checked like a member's
        // commit; the others cannot be.
        if req.generation_id >= 0 {
            let partitions: Vec<&TopicPartition> =
                req.partitions.iter().map(|p| &p.partition).collect();
            if let Some(error) = self.validate_offset_commit(
                req.generation_id,
                &req.member_id,
                req.group_instance_id.as_deref(),
                &partitions,
            ) {
                respond_all(cx, error, req);
                return;
            }
        }
        let max_metadata = cx.config.offset_metadata_max_bytes;
        let mut results = Vec::with_capacity(req.partitions.len());
        let mut staged = Vec::with_capacity(req.partitions.len());
        for p in req.partitions {
            let metadata = p.metadata.unwrap_or_default();
            if metadata.encode_utf16().count() > max_metadata {
                results.push((p.partition, Some(GroupError::OffsetMetadataTooLarge)));
                continue;
            }
            results.push((p.partition.clone(), None));
            staged.push((
                p.partition,
                OffsetValue {
                    offset: p.offset,
                    leader_epoch: p.leader_epoch,
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
            .map(|(partition, value)| RecordBody::TxnOffset {
                producer_id: req.producer_id,
                partition: partition.clone(),
                value: Some(value.clone()),
            })
            .collect();
        cx.persist(
            &self.id,
            bodies,
            Pending::TxnOffsetCommit {
                group_id: self.id.clone(),
                token,
                producer_id: req.producer_id,
                staged,
                results,
            },
        );
    }

    pub(crate) fn apply_txn_offsets(
        &mut self,
        producer_id: i64,
        staged: Vec<(TopicPartition, OffsetValue)>,
    ) {
        self.pending_txn_offsets
            .entry(producer_id)
            .or_default()
            .extend(staged);
    }

    /// Writes the end of `producer_id`'s transaction for this group; false if nothing pends.
    fn end_txn(
        &mut self,
        cx: &mut Ctx<'_>,
        token: RequestToken,
        producer_id: i64,
        commit: bool,
    ) -> bool {
        let Some(pending) = self.pending_txn_offsets.get(&producer_id) else {
            return false;
        };
        let mut bodies = Vec::with_capacity(pending.len() * 2);
        for (partition, value) in pending {
            if commit {
                bodies.push(RecordBody::Offset {
                    partition: partition.clone(),
                    value: value.clone(),
                });
            }
            bodies.push(RecordBody::TxnOffset {
                producer_id,
                partition: partition.clone(),
                value: None,
            });
        }
        cx.persist(
            &self.id,
            bodies,
            Pending::TxnEnd {
                group_id: self.id.clone(),
                token,
                producer_id,
                commit,
            },
        );
        true
    }

    /// The end record is durable: the offsets become visible (commit) or are gone (abort).
    pub(crate) fn end_txn_offsets(&mut self, seq: u64, producer_id: i64, commit: bool) {
        let Some(pending) = self.pending_txn_offsets.remove(&producer_id) else {
            return;
        };
        if commit {
            for (partition, value) in pending {
                self.offsets.insert(partition, StoredOffset { value, seq });
            }
        }
    }
}
