//! The log and the group coordinator as the ownership runner's [`ResourceHost`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use strata_cluster::{ClusterError, ClusterResult, ResourceHost, StopReason};
use strata_core::{BrokerId, Clock, Epoch, TopicPartition};

use strata_log::{LogError, LogManager};
use tracing::{info, warn};

use super::node::{parse_resource, resource_name};
use super::stats::OwnershipStats;
use crate::coordinator::{GroupCoordinator, OFFSETS_TOPIC};
use crate::txn_coordinator::{TxnCoordinator, TXN_TOPIC};

pub(super) struct LogHost {
    pub(super) log: Arc<LogManager>,
    pub(super) groups: Arc<GroupCoordinator>,
    /// None only in tests that drive the host by hand.
    pub(super) txn: Option<Arc<TxnCoordinator>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) stats: Arc<OwnershipStats>,
    /// What we serve, by resource: a deleted topic's id no longer names its partitions.
    pub(super) served: std::sync::Mutex<HashMap<String, TopicPartition>>,
}

impl LogHost {
    fn served(&self) -> std::sync::MutexGuard<'_, HashMap<String, TopicPartition>> {
        match self.served.lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        }
    }

    /// The partition `resource` names, if its topic is known (whether the log holds it is
    /// for the log to say).
    fn partition_of(&self, resource: &str) -> Option<TopicPartition> {
        let (id, partition) = parse_resource(resource)?;
        let info = self.log.topic_by_id(id)?;
        Some(TopicPartition::new(Arc::clone(&info.name), partition))
    }

    /// The partition `resource` names, reading the catalog (once per batch) for a topic
    /// created through another broker.
    async fn resolve(&self, resource: &str, refreshed: &mut bool) -> ClusterResult<TopicPartition> {
        let (id, partition) = parse_resource(resource)
            .ok_or_else(|| ClusterError::Invalid(format!("{resource:?} is not a partition")))?;
        let info = match self.log.topic_by_id(id) {
            Some(info) => info,
            None => {
                if !*refreshed {
                    self.log
                        .refresh_catalog()
                        .await
                        .map_err(|e| self.cluster_error(resource, e))?;
                    *refreshed = true;
                }
                self.log
                    .topic_by_id(id)
                    .ok_or_else(|| ClusterError::Invalid(format!("{resource}: no such topic")))?
            }
        };
        Ok(TopicPartition::new(Arc::clone(&info.name), partition))
    }

    /// Marks the coordinator shard `resource` is the partition of (if it is one) as loading.
    fn expect_coordinator_shard(&self, resource: &str) {
        let Some(tp) = self.partition_of(resource) else {
            return;
        };
        if &*tp.topic == OFFSETS_TOPIC {
            self.groups.expect_shard(tp.partition);
        }
        if let (true, Some(txn)) = (&*tp.topic == TXN_TOPIC, &self.txn) {
            txn.expect_shard(tp.partition);
        }
    }

    /// Stops hosting (or expecting) the coordinator shard `tp` is the partition of, if it is
    /// one: at a handover, or when its start failed after [`Self::expect_coordinator_shard`].
    fn unload_coordinator_shard(&self, tp: &TopicPartition) {
        if &*tp.topic == OFFSETS_TOPIC {
            self.groups.unload_shard(tp.partition);
        }
        if let (true, Some(txn)) = (&*tp.topic == TXN_TOPIC, &self.txn) {
            txn.unload_shard(tp.partition);
        }
    }

    /// What follows the log's acquire of one partition: its group or transaction shard, the
    /// bookkeeping and the log line.
    async fn finish_start(
        &self,
        resource: &str,
        tp: TopicPartition,
        epoch: Epoch,
        acquired: Result<(), LogError>,
        started: std::time::Duration,
    ) -> ClusterResult<()> {
        if let Err(e) = acquired {
            self.unload_coordinator_shard(&tp);
            self.stats.acquire_failed.fetch_add(1, Ordering::Relaxed);
            return Err(self.cluster_error(resource, e));
        }
        let partition = tp.partition;
        if &*tp.topic == OFFSETS_TOPIC {
            if let Err(e) = self.groups.load_shard(partition).await {
                // Serving the partition without its shard would answer NOT_COORDINATOR
                // forever: give it up and let the runner try again.
                warn!(partition, error = %e, "could not load the group coordinator shard");
                self.log.abandon(&tp);
                self.stats.acquire_failed.fetch_add(1, Ordering::Relaxed);
                return Err(self.cluster_error(resource, e));
            }
        }
        if let (true, Some(txn)) = (&*tp.topic == TXN_TOPIC, &self.txn) {
            if let Err(e) = txn.load_shard(partition).await {
                warn!(partition, error = %e, "could not load the transaction coordinator shard");
                self.log.abandon(&tp);
                self.stats.acquire_failed.fetch_add(1, Ordering::Relaxed);
                return Err(self.cluster_error(resource, e));
            }
        }
        self.served().insert(resource.to_string(), tp.clone());
        let elapsed = self.clock.monotonic().saturating_sub(started);
        OwnershipStats::record(
            &self.stats.acquired,
            &self.stats.acquire_micros,
            &self.stats.acquire_max_micros,
            elapsed,
        );
        let high = self.log.watermarks(&tp).map(|w| w.high.get()).unwrap_or(-1);
        info!(
            "acquired {}-{} epoch {} in {} ms (high watermark {})",
            tp.topic,
            tp.partition,
            epoch.0,
            elapsed.as_millis(),
            high
        );
        Ok(())
    }

    fn cluster_error(&self, resource: &str, error: LogError) -> ClusterError {
        if *self.log.fenced().borrow() {
            return ClusterError::Fenced;
        }
        match error {
            // Somebody else claimed the manifest first.
            LogError::Fenced | LogError::NotOwner => ClusterError::Lost {
                resource: resource.to_string(),
            },
            LogError::Storage(e) => ClusterError::Storage(e),
            other => ClusterError::Invalid(format!("{resource}: {other}")),
        }
    }
}

/// The host a cluster node runs its ownership over, for tests that drive it by hand.
#[cfg(test)]
pub(crate) fn log_host(
    log: Arc<LogManager>,
    groups: Arc<GroupCoordinator>,
    clock: Arc<dyn Clock>,
) -> impl ResourceHost {
    LogHost {
        log,
        groups,
        txn: None,
        clock,
        stats: Arc::new(OwnershipStats::default()),
        served: std::sync::Mutex::new(HashMap::new()),
    }
}

impl std::fmt::Debug for LogHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHost").finish_non_exhaustive()
    }
}

#[async_trait]
impl ResourceHost for LogHost {
    async fn resources(&self) -> ClusterResult<BTreeSet<String>> {
        // Topics created or deleted through other brokers become resources here.
        self.log
            .refresh_catalog()
            .await
            .map_err(|e| self.cluster_error("catalog", e))?;
        Ok(self
            .log
            .topics()
            .iter()
            .flat_map(|t| (0..t.partitions).map(move |p| resource_name(t.id, p)))
            .collect())
    }

    fn known_resources(&self) -> Option<BTreeSet<String>> {
        // The log's catalog as last read, plus the topics created here since.
        Some(
            self.log
                .topics()
                .iter()
                .flat_map(|t| (0..t.partitions).map(move |p| resource_name(t.id, p)))
                .collect(),
        )
    }

    fn preferred_owners(&self) -> BTreeMap<String, BrokerId> {
        self.log
            .topics()
            .iter()
            .flat_map(|t| {
                t.assignments.iter().filter_map(move |(p, replicas)| {
                    Some((resource_name(t.id, *p), BrokerId(*replicas.first()?)))
                })
            })
            .collect()
    }

    async fn start_serving(&self, resource: &str, epoch: Epoch) -> ClusterResult<()> {
        let batch = [(resource.to_string(), epoch)];
        self.start_serving_all(&batch)
            .await
            .pop()
            .unwrap_or_else(|| Err(ClusterError::Invalid(format!("{resource}: no result"))))
    }

    async fn start_serving_all(&self, batch: &[(String, Epoch)]) -> Vec<ClusterResult<()>> {
        let started = self.clock.monotonic();
        // Coordinator shards among the claims answer COORDINATOR_LOAD_IN_PROGRESS from now on,
        // not NOT_COORDINATOR: the claim may already be visible to other brokers, which name
        // this one to clients (`finish_start` loads them or gives them up).
        for (resource, _) in batch {
            self.expect_coordinator_shard(resource);
        }
        let mut results: Vec<Option<ClusterResult<()>>> = batch.iter().map(|_| None).collect();
        let mut partitions = Vec::with_capacity(batch.len());
        let mut refreshed = false;
        for (i, (resource, epoch)) in batch.iter().enumerate() {
            match self.resolve(resource, &mut refreshed).await {
                Ok(tp) => partitions.push((i, tp, *epoch)),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        // One acquire for the whole batch: the log seals and replays each predecessor's
        // stream once for all of its partitions.
        let wanted = partitions
            .iter()
            .map(|(_, tp, epoch)| (tp.topic.to_string(), tp.partition, epoch.0))
            .collect();
        let mut acquired: HashMap<TopicPartition, Result<(), LogError>> =
            match self.log.acquire(wanted).await {
                Ok(outcomes) => outcomes.into_iter().collect(),
                Err(e) => {
                    // Nothing of the batch is served: every resource fails the same way.
                    let error = self.cluster_error("partitions", e);
                    for (i, (resource, _)) in batch.iter().enumerate() {
                        if results[i].is_none() {
                            results[i] = Some(Err(match &error {
                                ClusterError::Fenced => ClusterError::Fenced,
                                ClusterError::Lost { .. } => ClusterError::Lost {
                                    resource: resource.clone(),
                                },
                                other => ClusterError::Invalid(format!("{resource}: {other}")),
                            }));
                        }
                    }
                    HashMap::new()
                }
            };
        for (i, tp, epoch) in partitions {
            if results[i].is_some() {
                self.unload_coordinator_shard(&tp);
                continue;
            }
            let outcome = acquired
                .remove(&tp)
                .unwrap_or(Err(LogError::UnknownTopicOrPartition));
            results[i] = Some(
                self.finish_start(&batch[i].0, tp, epoch, outcome, started)
                    .await,
            );
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ClusterError::Invalid("no result".to_string()))))
            .collect()
    }

    async fn stop_serving(&self, resource: &str, reason: StopReason) -> ClusterResult<()> {
        let served = self.served().get(resource).cloned();
        let was_served = served.is_some();
        let tp = match served {
            Some(tp) => tp,
            // Not served, yet the log may still hold it: suspended when our lease was in
            // doubt, or abandoned after a failed start or handover. Handing it over must then
            // mark the manifest released. Otherwise the record says Released while the
            // manifest still names our stream as its unreleased writer, and the successor's
            // takeover seals our stream: a live broker fenced (RELIABILITY, finding (a)).
            None if reason == StopReason::Handover => match self.partition_of(resource) {
                Some(tp) => tp,
                None => return Ok(()),
            },
            None => return Ok(()),
        };
        // Before the log stops: the shard's pending writes then fail as NOT_COORDINATOR
        // instead of racing the handover.
        self.unload_coordinator_shard(&tp);
        let started = self.clock.monotonic();
        let outcome = if reason == StopReason::Handover {
            match self.log.release(&tp).await {
                // Never held here (a claim whose start failed before the log loaded it):
                // nothing of ours to release.
                Err(LogError::NotOwner) if !was_served => Ok(()),
                Ok(_) | Err(LogError::NotOwner) => {
                    let elapsed = self.clock.monotonic().saturating_sub(started);
                    OwnershipStats::record(
                        &self.stats.handed_over,
                        &self.stats.handover_micros,
                        &self.stats.handover_max_micros,
                        elapsed,
                    );
                    info!(
                        "handed over {}-{} in {} ms",
                        tp.topic,
                        tp.partition,
                        elapsed.as_millis()
                    );
                    Ok(())
                }
                Err(e) => {
                    // Not released: stop serving anyway, the successor fences and replays.
                    self.stats.handover_failed.fetch_add(1, Ordering::Relaxed);
                    self.log.abandon(&tp);
                    Err(self.cluster_error(resource, e))
                }
            }
        } else if reason == StopReason::SelfLeaseExpired {
            // Nobody is known to hold it instead: only our heartbeats are failing (usually a
            // storage refusing writes). Stop appending, keep serving what is durable.
            warn!(partition = %tp, ?reason, "stopped accepting appends; reads still served");
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            self.log.suspend_writes(&tp);
            Ok(())
        } else {
            warn!(partition = %tp, ?reason, "stopped serving");
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            self.log.abandon(&tp);
            Ok(())
        };
        self.served().remove(resource);
        outcome
    }
}
