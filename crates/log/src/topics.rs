//! Topic administration: creating, deleting and configuring topics and partitions by
//! replacing the catalog (see `catalog`), and applying catalog versions written by others.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_core::TopicPartition;
use strata_storage::ObjectStore;

use crate::catalog::{self, CatalogState, TopicId, TopicInfo};
use crate::config::TopicConfig;
use crate::manager::LogManager;
use crate::manifest;
use crate::ownership;
use crate::partition::{Partition, Serving, TailEntry};
use crate::shared::{read_lock, release_wal, spawn_delete, write_lock, Ownership};
use crate::{LogError, LogResult};

/// A topic to create: its name, partition count (None = the default), replication factor
/// (None = the broker default), explicit replica assignments by partition (checked against the
/// live brokers by the caller, which knows them) and config overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewTopic {
    pub name: String,
    pub partitions: Option<i32>,
    pub replication_factor: Option<i16>,
    pub assignments: BTreeMap<i32, Vec<i32>>,
    pub overrides: BTreeMap<String, String>,
}

impl LogManager {
    /// All topics, sorted by name.
    pub fn topics(&self) -> Vec<Arc<TopicInfo>> {
        read_lock(&self.shared.topics).values().cloned().collect()
    }

    /// The version of the catalog this broker applied last; it moves with every topic change.
    pub fn catalog_version(&self) -> u64 {
        read_lock(&self.shared.catalog).version
    }

    pub fn topic(&self, name: &str) -> Option<Arc<TopicInfo>> {
        read_lock(&self.shared.topics).get(name).cloned()
    }

    pub fn topic_by_id(&self, id: TopicId) -> Option<Arc<TopicInfo>> {
        read_lock(&self.shared.topics)
            .values()
            .find(|t| t.id == id)
            .cloned()
    }

    /// Creates a topic. `partitions` None = the default count. With `validate_only` nothing is
    /// written. Errors: TopicAlreadyExists, InvalidTopic, InvalidPartitions, InvalidConfig.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: Option<i32>,
        overrides: BTreeMap<String, String>,
        validate_only: bool,
    ) -> LogResult<Arc<TopicInfo>> {
        let spec = NewTopic {
            name: name.to_string(),
            partitions,
            overrides,
            ..NewTopic::default()
        };
        self.create_topics(vec![spec], validate_only)
            .await?
            .pop()
            .unwrap_or(Err(LogError::UnknownTopicOrPartition))
    }

    /// Creates several topics with one catalog change, so the catalog is written once however
    /// many topics a request names (each change rewrites the whole catalog: one change per
    /// topic made a request naming n topics write O(n²) bytes). Returns one result per spec,
    /// in order; a topic that fails validation or already exists does not stop the others.
    /// A failed catalog write fails them all (the outer error).
    pub async fn create_topics(
        &self,
        specs: Vec<NewTopic>,
        validate_only: bool,
    ) -> LogResult<Vec<LogResult<Arc<TopicInfo>>>> {
        let mut results: Vec<LogResult<Arc<TopicInfo>>> = specs
            .into_iter()
            .map(|spec| self.new_topic_info(spec).map(Arc::new))
            .collect();
        // Known to exist already: refused without a catalog write (checked again under the
        // change, against the newest catalog).
        for result in &mut results {
            if let Ok(info) = result {
                if self.topic(&info.name).is_some() {
                    *result = Err(LogError::TopicAlreadyExists(info.name.to_string()));
                }
            }
        }
        if validate_only {
            return Ok(results);
        }
        let wanted: Vec<(usize, Arc<TopicInfo>)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.as_ref().ok().cloned()?)))
            .collect();
        if wanted.is_empty() {
            return Ok(results);
        }
        let taken = self
            .change_catalog(|cat| {
                // Recomputed on every attempt: a lost race re-runs this on the newer catalog.
                let mut taken = std::collections::HashSet::new();
                for (i, info) in &wanted {
                    if cat.topics.contains_key(&*info.name) {
                        taken.insert(*i);
                    } else {
                        cat.topics.insert(info.name.to_string(), (**info).clone());
                    }
                }
                Ok(taken)
            })
            .await?;
        for (i, result) in results.iter_mut().enumerate() {
            if let Ok(info) = result {
                if taken.contains(&i) {
                    *result = Err(LogError::TopicAlreadyExists(info.name.to_string()));
                } else {
                    tracing::info!(topic = %info.name, partitions = info.partitions,
                        id = %info.id, "created topic");
                }
            }
        }
        Ok(results)
    }

    /// A new topic's catalog entry, validated.
    fn new_topic_info(&self, spec: NewTopic) -> LogResult<TopicInfo> {
        catalog::validate_topic_name(&spec.name)?;
        let count = spec
            .partitions
            .unwrap_or(self.shared.config.default_partitions);
        if count < 1 {
            return Err(LogError::InvalidPartitions(format!(
                "a topic needs at least one partition, got {count}"
            )));
        }
        if count > MAX_PARTITIONS {
            return Err(LogError::InvalidPartitions(format!(
                "at most {MAX_PARTITIONS} partitions per topic, got {count}"
            )));
        }
        check_assignments(&spec.assignments, 0, count)?;
        let config = TopicConfig::from_overrides(&spec.overrides)?;
        Ok(TopicInfo {
            name: spec.name.into(),
            id: TopicId::random(),
            partitions: count,
            replication_factor: spec.replication_factor,
            assignments: spec.assignments,
            overrides: spec.overrides,
            config,
        })
    }

    /// Deletes a topic and, in the background, its data.
    pub async fn delete_topic(&self, name: &str) -> LogResult<()> {
        let removed = self
            .change_catalog(|cat| {
                cat.topics
                    .remove(name)
                    .ok_or(LogError::UnknownTopicOrPartition)
            })
            .await?;
        tracing::info!(topic = name, id = %removed.id, "deleted topic");
        Ok(())
    }

    /// Raises a topic's partition count to `total` (InvalidPartitions if not larger), with
    /// the new partitions' explicit replica assignments if any (by partition).
    pub async fn create_partitions(
        &self,
        name: &str,
        total: i32,
        assignments: BTreeMap<i32, Vec<i32>>,
        validate_only: bool,
    ) -> LogResult<()> {
        let check = |info: &TopicInfo| {
            if total <= info.partitions {
                return Err(LogError::InvalidPartitions(format!(
                    "topic {name} has {} partitions; the new count {total} must be larger",
                    info.partitions
                )));
            }
            if total > MAX_PARTITIONS {
                return Err(LogError::InvalidPartitions(format!(
                    "at most {MAX_PARTITIONS} partitions per topic, got {total}"
                )));
            }
            check_assignments(&assignments, info.partitions, total)
        };
        let current = self.topic(name).ok_or(LogError::UnknownTopicOrPartition)?;
        check(&current)?;
        if validate_only {
            return Ok(());
        }
        self.change_catalog(|cat| {
            let t = cat
                .topics
                .get_mut(name)
                .ok_or(LogError::UnknownTopicOrPartition)?;
            check(t)?;
            t.partitions = total;
            t.assignments
                .extend(assignments.iter().map(|(p, a)| (*p, a.clone())));
            Ok(())
        })
        .await
    }

    /// Replaces a topic's overrides wholesale (AlterConfigs semantics).
    pub async fn set_topic_configs(
        &self,
        name: &str,
        overrides: BTreeMap<String, String>,
        validate_only: bool,
    ) -> LogResult<()> {
        let config = TopicConfig::from_overrides(&overrides)?;
        if self.topic(name).is_none() {
            return Err(LogError::UnknownTopicOrPartition);
        }
        if validate_only {
            return Ok(());
        }
        self.change_catalog(|cat| {
            let t = cat
                .topics
                .get_mut(name)
                .ok_or(LogError::UnknownTopicOrPartition)?;
            t.overrides = overrides.clone();
            t.config = config.clone();
            Ok(())
        })
        .await
    }

    /// Changes individual overrides (IncrementalAlterConfigs): Some = set, None = delete
    /// (back to default).
    pub async fn alter_topic_configs(
        &self,
        name: &str,
        changes: Vec<(String, Option<String>)>,
        validate_only: bool,
    ) -> LogResult<()> {
        let apply = |overrides: &mut BTreeMap<String, String>| -> LogResult<TopicConfig> {
            for (k, v) in &changes {
                match v {
                    Some(v) => {
                        overrides.insert(k.clone(), v.clone());
                    }
                    None => {
                        if crate::config_table::config_def(k).is_none() {
                            return Err(LogError::InvalidConfig(format!(
                                "unknown or unsupported topic config {k:?}"
                            )));
                        }
                        overrides.remove(k);
                    }
                }
            }
            TopicConfig::from_overrides(overrides)
        };
        let current = self.topic(name).ok_or(LogError::UnknownTopicOrPartition)?;
        apply(&mut current.overrides.clone())?;
        if validate_only {
            return Ok(());
        }
        self.change_catalog(|cat| {
            let t = cat
                .topics
                .get_mut(name)
                .ok_or(LogError::UnknownTopicOrPartition)?;
            let mut overrides = t.overrides.clone();
            t.config = apply(&mut overrides)?;
            t.overrides = overrides;
            Ok(())
        })
        .await
    }

    /// Applies a catalog change durably, then brings topics and partitions in line with it.
    async fn change_catalog<F, T>(&self, change: F) -> LogResult<T>
    where
        F: FnMut(&mut CatalogState) -> LogResult<T>,
    {
        let _serial = self.shared.catalog_lock.lock().await;
        let current = read_lock(&self.shared.catalog).clone();
        let (next, out) = catalog::update(self.shared.store.as_ref(), current, change).await?;
        self.apply_catalog(next).await?;
        Ok(out)
    }

    async fn apply_catalog(&self, next: CatalogState) -> LogResult<()> {
        let shared = &self.shared;
        let old_topics: BTreeMap<String, Arc<TopicInfo>> = read_lock(&shared.topics).clone();
        // Deleted topics first (a topic re-created under the same name has a new id): drop
        // their partitions and delete their data in the background.
        for (name, old) in &old_topics {
            if next.topics.get(name).is_some_and(|t| t.id == old.id) {
                continue;
            }
            let gone: Vec<Arc<Partition>> = {
                let mut parts = write_lock(&shared.partitions);
                (0..old.partitions)
                    .filter_map(|p| parts.remove(&TopicPartition::new(name.as_str(), p)))
                    .collect()
            };
            for part in gone {
                let tail: Vec<TailEntry> = {
                    let mut st = part.lock();
                    st.serving = Serving::Gone;
                    st.tail.drain(..).collect()
                };
                for key in release_wal(shared, &tail) {
                    spawn_delete(shared, key);
                }
            }
            let store = shared.store.clone();
            let prefix = manifest::topic_prefix(old.id);
            tokio::spawn(async move {
                if let Err(e) = delete_prefix(store.as_ref(), &prefix).await {
                    tracing::warn!(%prefix, error = %e, "deleting a removed topic's data failed; it stays as garbage");
                }
            });
        }
        let topics: BTreeMap<String, Arc<TopicInfo>> = next
            .topics
            .iter()
            .map(|(name, info)| {
                let same = old_topics.get(name).filter(|t| ***t == *info).cloned();
                (name.clone(), same.unwrap_or_else(|| Arc::new(info.clone())))
            })
            .collect();
        *write_lock(&shared.topics) = topics.clone();
        *write_lock(&shared.catalog) = next;
        // New partitions (new topics or raised counts): a broker alone serves them at once;
        // in a cluster the coordination layer decides who acquires them.
        if shared.mode == Ownership::All {
            for (tp, result) in
                ownership::acquire(shared, ownership::missing(shared, &topics)).await?
            {
                if let Err(e) = result {
                    tracing::warn!(partition = %tp, error = %e, "could not serve a new partition");
                }
            }
        }
        Ok(())
    }

    /// Re-reads the catalog (topics created or deleted by other brokers).
    pub async fn refresh_catalog(&self) -> LogResult<()> {
        // The cluster's ownership rounds call this several times a second: one listing while
        // nothing changed, the read only when a newer version is listed.
        let newest = catalog::newest_version(self.shared.store.as_ref()).await?;
        if newest.is_none_or(|newest| newest <= read_lock(&self.shared.catalog).version) {
            return Ok(());
        }
        let latest = catalog::load_latest(self.shared.store.as_ref()).await?;
        let _serial = self.shared.catalog_lock.lock().await;
        if latest.version > read_lock(&self.shared.catalog).version {
            self.apply_catalog(latest).await?;
        }
        Ok(())
    }
}

/// Explicit assignments must name partitions in `from..to` only, each with at least one
/// broker and no broker twice (which brokers exist is the caller's to check).
fn check_assignments(assignments: &BTreeMap<i32, Vec<i32>>, from: i32, to: i32) -> LogResult<()> {
    for (partition, brokers) in assignments {
        if !(from..to).contains(partition) {
            return Err(LogError::InvalidReplicaAssignment(format!(
                "partition {partition} is not among the partitions created ({from}..{to})"
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        if brokers.is_empty() || !brokers.iter().all(|b| seen.insert(*b)) {
            return Err(LogError::InvalidReplicaAssignment(format!(
                "partition {partition}'s replicas {brokers:?} must be non-empty and distinct"
            )));
        }
    }
    Ok(())
}

/// A topic with more partitions than this is almost certainly a typo.
const MAX_PARTITIONS: i32 = 100_000;

pub(crate) async fn delete_prefix(store: &dyn ObjectStore, prefix: &str) -> LogResult<()> {
    for meta in store.list(prefix).await? {
        store.delete(&meta.key).await?;
    }
    Ok(())
}
