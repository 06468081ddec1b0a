//! One module per Kafka API family. Handlers take a decoded request and return the response
//! message; dispatch does the decoding and encoding. Every field a handler sets is gated on the
//! negotiated version: `kafka-protocol` refuses to encode a field the version does not carry.

pub(crate) mod admin;
pub(crate) mod cluster;
pub(crate) mod configs;
pub(crate) mod consumer_groups;
pub(crate) mod fetch;
pub(crate) mod groups;
pub(crate) mod leader_epoch;
pub(crate) mod list_offsets;
pub(crate) mod metadata;
pub(crate) mod produce;
pub(crate) mod producer;
pub(crate) mod quotas;
pub(crate) mod records;
pub(crate) mod security;
pub(crate) mod share_groups;
pub(crate) mod share_offsets;
pub(crate) mod topics;
pub(crate) mod txn;
pub(crate) mod txn_markers;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use strata_core::TopicPartition;
use strata_log::{LogError, NewTopic, TopicId, TopicInfo};
use uuid::Uuid;

use crate::coordinator::OFFSETS_TOPIC;
use crate::errors::{code, LookupError};
use crate::server::Broker;

/// The leader epoch a broker alone on its storage reports. With one epoch, clients'
/// truncation checks (OffsetForLeaderEpoch) always agree.
pub(crate) const LEADER_EPOCH: i32 = 0;

/// The leader epoch of a partition served here: [`LEADER_EPOCH`] alone on the storage, the
/// ownership epoch in cluster mode (what Metadata reports, so a client's view of who leads can
/// be checked). None in cluster mode when the partition is not served here: the request then
/// fails as NOT_LEADER_OR_FOLLOWER anyway.
pub(crate) fn leader_epoch_of(broker: &Broker, tp: &TopicPartition) -> Option<i32> {
    match broker.cluster {
        None => Some(LEADER_EPOCH),
        Some(_) => broker
            .log
            .readable_epoch(tp)
            .map(|e| i32::try_from(e).unwrap_or(i32::MAX)),
    }
}

/// Validates the leader epoch a client believes current (-1 = "not known, skip the check")
/// against the partition's (`leader_epoch`, None = not served here: no check), as Kafka does
/// on Fetch, ListOffsets and OffsetForLeaderEpoch.
pub(crate) fn check_leader_epoch(current_leader_epoch: i32, leader_epoch: Option<i32>) -> i16 {
    let Some(leader_epoch) = leader_epoch else {
        return code::NONE;
    };
    if current_leader_epoch < 0 || current_leader_epoch == leader_epoch {
        code::NONE
    } else if current_leader_epoch > leader_epoch {
        code::UNKNOWN_LEADER_EPOCH
    } else {
        code::FENCED_LEADER_EPOCH
    }
}

/// Whether `name` is a topic the broker writes for itself: `__consumer_offsets`, which holds
/// committed offsets and group membership. Metadata reports it internal, as Kafka does.
pub(crate) fn is_internal_topic(name: &str) -> bool {
    name == OFFSETS_TOPIC || name == crate::txn_coordinator::TXN_TOPIC
}

/// The refusal of a client operation that would corrupt or lose an internal topic's data:
/// producing to it (the coordinator's replay would read foreign records), deleting it or its
/// records, adding partitions (groups are placed by hashing over the partition count, so a new
/// count would orphan every group) or changing its configs (a retention limit would expire
/// committed offsets). INVALID_TOPIC_EXCEPTION is what Kafka answers a client producing to an
/// internal topic ("Cannot append to internal topic"); the same non-retriable code serves the
/// other operations, with a message saying which.
pub(crate) fn refuse_internal(name: &str, operation: &str) -> Option<(i16, String)> {
    is_internal_topic(name).then(|| {
        (
            code::INVALID_TOPIC_EXCEPTION,
            format!("cannot {operation} internal topic {name}: it holds coordinator state"),
        )
    })
}

pub(crate) fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

pub(crate) fn topic_name(name: &str) -> TopicName {
    TopicName(str_bytes(name))
}

pub(crate) fn uuid_of(id: TopicId) -> Uuid {
    Uuid::from_bytes(id.0)
}

pub(crate) fn topic_id_of(uuid: &Uuid) -> TopicId {
    TopicId(*uuid.as_bytes())
}

/// Looks topics up by name, creating the unknown ones with the default partition count when
/// auto-creation is on and `allowed` (the request permits it). Every creation of the request
/// is one catalog change, and at most `auto_create_topics_per_request` topics per request and
/// `auto_create_topics_per_second` broker-wide are created: the rest are answered
/// [`LookupError::CreationDeferred`] and created when the client asks again. A concurrent
/// creation of the same topic by another request or broker is not an error.
pub(crate) async fn topics_or_auto_create<'a>(
    broker: &Broker,
    names: impl IntoIterator<Item = &'a str>,
    allowed: bool,
) -> HashMap<&'a str, Result<Arc<TopicInfo>, LookupError>> {
    let mut found = HashMap::new();
    let mut missing = Vec::new();
    for name in names {
        if found.contains_key(name) {
            continue;
        }
        let outcome = match broker.log.topic(name) {
            Some(info) => Ok(info),
            None => match strata_log::catalog::validate_topic_name(name) {
                Err(e) => Err(LookupError::Log(e)),
                Ok(()) if !(allowed && broker.settings.auto_create_topics) => {
                    Err(LookupError::Log(LogError::UnknownTopicOrPartition))
                }
                Ok(()) => {
                    missing.push(name);
                    Err(LookupError::CreationDeferred)
                }
            },
        };
        found.insert(name, outcome);
    }
    if missing.is_empty() {
        return found;
    }
    let wanted = missing
        .len()
        .min(broker.settings.auto_create_topics_per_request);
    let granted = broker.limits.creations.take(wanted);
    if granted < missing.len() {
        tracing::info!(
            unknown = missing.len(),
            creating = granted,
            "auto-creation limit reached; the other topics are created when asked again"
        );
    }
    missing.truncate(granted);
    if missing.is_empty() {
        return found;
    }
    let specs = missing
        .iter()
        .map(|name| NewTopic {
            name: (*name).to_string(),
            partitions: None,
            // Auto-creation answers no client asking for a factor: the default is stored
            // unchecked, and Metadata reports as many replicas as are live.
            replication_factor: Some(broker.settings.default_replication_factor),
            assignments: BTreeMap::new(),
            overrides: BTreeMap::new(),
        })
        .collect();
    match broker.log.create_topics(specs, false).await {
        Ok(results) => {
            let mut created = Vec::new();
            for (name, result) in missing.into_iter().zip(results) {
                let outcome = match result {
                    Ok(info) => {
                        created.push((Arc::clone(&info), 0..info.partitions));
                        tracing::info!(
                            topic = name,
                            partitions = info.partitions,
                            "auto-created topic"
                        );
                        Ok(info)
                    }
                    Err(LogError::TopicAlreadyExists(_)) => broker
                        .log
                        .topic(name)
                        .ok_or(LogError::UnknownTopicOrPartition)
                        .map_err(LookupError::Log),
                    Err(e) => Err(LookupError::Log(e)),
                };
                found.insert(name, outcome);
            }
            if !created.is_empty() {
                announce_topology_change(broker).await;
                // Within a lease a healthy cluster has given every new partition an owner;
                // if not, Metadata answers LEADER_NOT_AVAILABLE for it as before.
                let patience = broker
                    .cluster()
                    .map_or(Duration::ZERO, |n| n.lease_period());
                await_leaders(broker, &created, patience).await;
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, topics = missing.len(), "auto-creating topics failed");
            let e = Arc::new(e);
            for name in missing {
                found.insert(name, Err(LookupError::Shared(Arc::clone(&e))));
            }
        }
    }
    found
}

/// How often [`await_leaders`] re-reads the ownership records.
pub(crate) const LEADER_POLL: Duration = Duration::from_millis(10);

/// Waits until every partition in `partitions` has a leader as Metadata would name it (a live
/// owner), or `patience` has passed; returns whether they all have one. Kafka assigns leaders
/// as part of creating a topic, and clients rely on it: some (the `rskafka` crate) cache a
/// leaderless answer and back off for ever. Here the owners claim new partitions within a
/// move watch of the announcement, so creation waits for that instead of answering first. A
/// broker alone on its storage serves every partition the moment it exists.
pub(crate) async fn await_leaders(
    broker: &Broker,
    partitions: &[(Arc<TopicInfo>, Range<i32>)],
    patience: Duration,
) -> bool {
    let Some(node) = broker.cluster() else {
        return true;
    };
    let deadline = broker.clock.monotonic().saturating_add(patience);
    loop {
        let all_led = partitions
            .iter()
            .all(|(info, range)| has_leaders(broker, info, range.clone()));
        if all_led {
            return true;
        }
        if broker.clock.monotonic() >= deadline {
            return false;
        }
        broker.clock.sleep(LEADER_POLL).await;
        node.refresh_owners().await;
    }
}

/// Whether every partition of `info` in `partitions` has a leader as Metadata would name it.
fn has_leaders(broker: &Broker, info: &TopicInfo, mut partitions: Range<i32>) -> bool {
    let leaders = crate::handlers::metadata::Leaders::of(broker);
    partitions.all(|p| leaders.leader(info, p).is_some())
}

/// For CreateTopics and CreatePartitions: waits for the leaders of the partitions just created
/// (each with the index of its topic's result) within the request's `timeout_ms` — a
/// non-positive one asks not to wait, as in Kafka — and returns those still leaderless.
pub(crate) async fn leaderless_after<'a>(
    broker: &Broker,
    timeout_ms: i32,
    created: &'a [(usize, Arc<TopicInfo>, Range<i32>)],
) -> Vec<(usize, &'a TopicInfo)> {
    if timeout_ms <= 0 || created.is_empty() {
        return Vec::new();
    }
    let patience = Duration::from_millis(timeout_ms.unsigned_abs().into());
    let partitions: Vec<_> = created
        .iter()
        .map(|(_, info, range)| (Arc::clone(info), range.clone()))
        .collect();
    if await_leaders(broker, &partitions, patience).await {
        return Vec::new();
    }
    created
        .iter()
        .filter(|(_, info, range)| !has_leaders(broker, info, range.clone()))
        .map(|(i, info, _)| (*i, info.as_ref()))
        .collect()
}

/// In cluster mode, tells every broker that partitions appeared or went away (see
/// [`crate::cluster::ClusterNode::announce_topology_change`]).
pub(crate) async fn announce_topology_change(broker: &Broker) {
    if let Some(node) = broker.cluster() {
        node.announce_topology_change().await;
    }
}

/// Kafka's ACL operation codes, for the `*_authorized_operations` bitfields. Strata has no ACLs:
/// every client may do everything, and says so when asked.
pub(crate) mod acl_op {
    pub const READ: i32 = 3;
    pub const WRITE: i32 = 4;
    pub const CREATE: i32 = 5;
    pub const DELETE: i32 = 6;
    pub const ALTER: i32 = 7;
    pub const DESCRIBE: i32 = 8;
    pub const CLUSTER_ACTION: i32 = 9;
    pub const DESCRIBE_CONFIGS: i32 = 10;
    pub const ALTER_CONFIGS: i32 = 11;
    pub const IDEMPOTENT_WRITE: i32 = 12;

    pub fn bits(ops: &[i32]) -> i32 {
        ops.iter().fold(0, |acc, op| acc | (1 << op))
    }

    pub fn topic_all() -> i32 {
        bits(&[
            READ,
            WRITE,
            CREATE,
            DELETE,
            ALTER,
            DESCRIBE,
            DESCRIBE_CONFIGS,
            ALTER_CONFIGS,
        ])
    }

    pub fn cluster_all() -> i32 {
        bits(&[
            CREATE,
            ALTER,
            DESCRIBE,
            CLUSTER_ACTION,
            DESCRIBE_CONFIGS,
            ALTER_CONFIGS,
            IDEMPOTENT_WRITE,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_epoch_check_matches_kafka() {
        assert_eq!(check_leader_epoch(-1, Some(0)), code::NONE);
        assert_eq!(check_leader_epoch(0, Some(0)), code::NONE);
        assert_eq!(check_leader_epoch(3, Some(0)), code::UNKNOWN_LEADER_EPOCH);
        assert_eq!(check_leader_epoch(2, Some(3)), code::FENCED_LEADER_EPOCH);
        assert_eq!(check_leader_epoch(7, None), code::NONE);
    }

    #[test]
    fn topic_ids_convert_both_ways() {
        let id = TopicId([7; 16]);
        assert_eq!(topic_id_of(&uuid_of(id)), id);
    }
}
