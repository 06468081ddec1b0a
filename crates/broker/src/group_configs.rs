//! Per-group configs: Kafka's GROUP config resource (type 32), which clients set with
//! IncrementalAlterConfigs or AlterConfigs and read with DescribeConfigs. Share-group clients
//! and test suites rely on it: a share group starts at the end of each partition unless its
//! `share.auto.offset.reset` is set to `earliest`, which is done per group.
//!
//! What is honoured, per group:
//! - `share.auto.offset.reset` (`earliest` / `latest`): where a share partition with no stored
//!   state starts. Read from storage when the share partition is loaded, so a config set through
//!   any broker just before the first ShareFetch is seen by the partition's owner.
//! - `share.record.lock.duration.ms`: the acquisition lock of records acquired from then on.
//! - `consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms` (KIP-848 groups) and
//!   `share.session.timeout.ms`, `share.heartbeat.interval.ms` (share groups): a member's
//!   session from its next heartbeat, and the interval that heartbeat's answer asks for.
//!
//! All but the first apply on every broker within one `quota_refresh_interval` (a change marker
//! is polled), and at once on the broker that changed them. Kafka's other group configs
//! (`share.delivery.count.limit`, `share.partition.max.record.locks`) are refused with
//! INVALID_CONFIG and a message naming the broker setting that applies to every group instead,
//! and names Kafka does not know with Kafka's own message. DescribeConfigs lists the honoured
//! configs and, read-only, the broker-wide limits that apply.
//!
//! Storage: one object per group with configs, changed by compare-and-swap
//! (`strata_layout::group_configs`); a broker without shared storage keeps them in memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use strata_core::Clock;
use strata_layout::group_configs::{self, StoredGroupConfig};
use strata_layout::{cas, LayoutError};
use strata_storage::{ObjectKey, ObjectStore, StorageError, Version};
use tracing::{debug, warn};

use crate::share::ShareAutoOffsetReset;

/// How many times a change is retried when another writer got in between.
const CAS_ATTEMPTS: usize = 8;

pub const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub const CONSUMER_SESSION_TIMEOUT_MS: &str = "consumer.session.timeout.ms";
pub const CONSUMER_HEARTBEAT_INTERVAL_MS: &str = "consumer.heartbeat.interval.ms";
pub const SHARE_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
pub const SHARE_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";

/// The honoured configs that are a number of milliseconds.
const MILLISECONDS: &[&str] = &[
    SHARE_RECORD_LOCK_DURATION_MS,
    CONSUMER_SESSION_TIMEOUT_MS,
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    SHARE_SESSION_TIMEOUT_MS,
    SHARE_HEARTBEAT_INTERVAL_MS,
];

/// Kafka's group configs Strata does not keep per group, with the broker setting that applies
/// to every group instead.
const BROKER_WIDE: &[(&str, &str)] = &[
    (
        "share.delivery.count.limit",
        "group_share_delivery_count_limit",
    ),
    (
        "share.partition.max.record.locks",
        "group_share_partition_max_record_locks",
    ),
];

/// The group-config layer's one error enum, mapped to Kafka codes in [`crate::errors`].
#[derive(Debug, thiserror::Error)]
pub enum GroupConfigError {
    /// A name or value Kafka would refuse, or one Strata does not keep per group
    /// (INVALID_CONFIG).
    #[error("{0}")]
    Invalid(String),
    /// The config objects could not be read or written.
    #[error("group config store: {0}")]
    Storage(#[from] LayoutError),
    /// Another broker kept changing the group's configs while we tried to.
    #[error("the group's configs changed concurrently too many times")]
    Contended,
}

fn storage(e: StorageError) -> GroupConfigError {
    GroupConfigError::Storage(LayoutError::Storage(e))
}

fn object_key(key: impl AsRef<str>) -> Result<ObjectKey, GroupConfigError> {
    ObjectKey::new(key).map_err(storage)
}

/// Checks one config to set, as Kafka's `GroupConfig.validate` would (for the two names Strata
/// honours), and returns the value to store.
pub fn validate(name: &str, value: &str) -> Result<String, GroupConfigError> {
    match name {
        SHARE_AUTO_OFFSET_RESET => match ShareAutoOffsetReset::parse(value) {
            Some(reset) => Ok(reset.as_str().to_string()),
            None => Err(GroupConfigError::Invalid(format!(
                "Invalid value {value} for configuration {name}: must be earliest or latest"
            ))),
        },
        _ if MILLISECONDS.contains(&name) => match value.trim().parse::<i64>() {
            Ok(ms) if (1..=i64::from(i32::MAX)).contains(&ms) => Ok(ms.to_string()),
            _ => Err(GroupConfigError::Invalid(format!(
                "Invalid value {value} for configuration {name}: must be a number of \
                 milliseconds between 1 and {}",
                i32::MAX
            ))),
        },
        _ => Err(unsupported(name)),
    }
}

/// Whether `name` is a config Strata keeps per group.
pub fn check_name(name: &str) -> Result<(), GroupConfigError> {
    match name {
        SHARE_AUTO_OFFSET_RESET => Ok(()),
        _ if MILLISECONDS.contains(&name) => Ok(()),
        _ => Err(unsupported(name)),
    }
}

fn unsupported(name: &str) -> GroupConfigError {
    match BROKER_WIDE.iter().find(|(kafka, _)| *kafka == name) {
        Some((_, setting)) => GroupConfigError::Invalid(format!(
            "Strata does not keep {name} per group: the broker setting {setting} applies to \
             every group"
        )),
        None => GroupConfigError::Invalid(format!("Unknown group config name: {name}")),
    }
}

/// A config to set (Some) or remove (None).
pub type Change = (String, Option<String>);

/// One group's configs, as honoured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupConfig {
    pub values: BTreeMap<String, String>,
}

impl GroupConfig {
    pub fn auto_offset_reset(&self) -> Option<ShareAutoOffsetReset> {
        self.values
            .get(SHARE_AUTO_OFFSET_RESET)
            .and_then(|v| ShareAutoOffsetReset::parse(v))
    }

    pub fn lock_duration(&self) -> Option<Duration> {
        self.millis(SHARE_RECORD_LOCK_DURATION_MS)
    }

    fn millis(&self, name: &str) -> Option<Duration> {
        self.values
            .get(name)
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
    }

    /// The KIP-848 timings the group sets for itself.
    pub fn consumer_timeouts(&self) -> strata_groups::GroupTimeouts {
        strata_groups::GroupTimeouts {
            session: self.millis(CONSUMER_SESSION_TIMEOUT_MS),
            heartbeat_interval: self.millis(CONSUMER_HEARTBEAT_INTERVAL_MS),
        }
    }

    /// The share-group timings the group sets for itself.
    pub fn share_timeouts(&self) -> strata_groups::GroupTimeouts {
        strata_groups::GroupTimeouts {
            session: self.millis(SHARE_SESSION_TIMEOUT_MS),
            heartbeat_interval: self.millis(SHARE_HEARTBEAT_INTERVAL_MS),
        }
    }
}

/// The group configs over the cluster's storage (or in memory without one), with a cache of
/// every group that has any.
#[derive(Debug)]
pub struct GroupConfigs {
    store: Option<Arc<dyn ObjectStore>>,
    /// Group → configs as last read; the whole map without a store. Holds only groups that
    /// have configs (an object with none is dropped from it), so it is as small as what
    /// operators set.
    cache: Mutex<HashMap<String, GroupConfig>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl GroupConfigs {
    pub fn new(store: Option<Arc<dyn ObjectStore>>) -> Self {
        Self {
            store,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The group's configs as last read or written here (no storage request: for hot paths).
    pub fn cached(&self, group: &str) -> GroupConfig {
        lock(&self.cache).get(group).cloned().unwrap_or_default()
    }

    /// `f` of the group's configs as last read here, without copying them (heartbeats and
    /// acquisitions look them up).
    pub fn cached_with<T>(&self, group: &str, f: impl FnOnce(&GroupConfig) -> T) -> T {
        let cache = lock(&self.cache);
        match cache.get(group) {
            Some(config) => f(config),
            None => f(&GroupConfig::default()),
        }
    }

    fn remember(&self, group: &str, config: GroupConfig) {
        let mut cache = lock(&self.cache);
        if config.values.is_empty() {
            cache.remove(group);
        } else {
            cache.insert(group.to_string(), config);
        }
    }

    /// The group's configs read from storage now (and remembered).
    pub async fn read(&self, group: &str) -> Result<GroupConfig, GroupConfigError> {
        let Some(store) = &self.store else {
            return Ok(self.cached(group));
        };
        let key = object_key(group_configs::key(group))?;
        let config = match store.get(&key).await {
            Ok((bytes, _)) => GroupConfig {
                values: StoredGroupConfig::decode(key.as_str(), &bytes)?.values,
            },
            Err(StorageError::NotFound(_)) => GroupConfig::default(),
            Err(e) => return Err(storage(e)),
        };
        self.remember(group, config.clone());
        Ok(config)
    }

    /// Applies `changes` (each validated by the caller) in one compare-and-swap; `replace`
    /// first drops every config not named (AlterConfigs' semantics). `check` judges the
    /// resulting set as a whole (a heartbeat interval below its session timeout). Nothing is
    /// written when `validate_only`.
    pub async fn alter(
        &self,
        group: &str,
        changes: &[Change],
        replace: bool,
        validate_only: bool,
        check: impl Fn(&GroupConfig) -> Result<(), GroupConfigError>,
    ) -> Result<(), GroupConfigError> {
        let apply = |values: &mut BTreeMap<String, String>| {
            if replace {
                values.clear();
            }
            for (name, value) in changes {
                match value {
                    Some(v) => values.insert(name.clone(), v.clone()),
                    None => values.remove(name),
                };
            }
        };
        let Some(store) = &self.store else {
            let mut config = self.cached(group);
            apply(&mut config.values);
            check(&config)?;
            if !validate_only {
                self.remember(group, config);
            }
            return Ok(());
        };
        if validate_only {
            let mut config = self.read(group).await?;
            apply(&mut config.values);
            return check(&config);
        }
        let key = object_key(group_configs::key(group))?;
        let fresh = || StoredGroupConfig {
            group: group.to_string(),
            values: BTreeMap::new(),
        };
        let written = cas::update(
            store.as_ref(),
            &key,
            CAS_ATTEMPTS,
            fresh,
            |stored: &mut StoredGroupConfig| {
                apply(&mut stored.values);
                check(&GroupConfig {
                    values: stored.values.clone(),
                })?;
                Ok::<_, GroupConfigError>((true, stored.values.clone()))
            },
        )
        .await?;
        let Some(values) = written else {
            return Err(GroupConfigError::Contended);
        };
        self.remember(group, GroupConfig { values });
        cas::bump_marker(store.as_ref(), &object_key(group_configs::CHANGES_KEY)?).await?;
        Ok(())
    }

    #[cfg(test)]
    async fn alter_unchecked(
        &self,
        group: &str,
        changes: &[Change],
        replace: bool,
        validate_only: bool,
    ) -> Result<(), GroupConfigError> {
        self.alter(group, changes, replace, validate_only, |_| Ok(()))
            .await
    }

    /// Every stored group with configs.
    async fn load_all(
        &self,
        store: &dyn ObjectStore,
    ) -> Result<HashMap<String, GroupConfig>, GroupConfigError> {
        let listed = store
            .list_keys(group_configs::PREFIX)
            .await
            .map_err(storage)?;
        let mut out = HashMap::new();
        for listed in listed {
            match store.get(&listed.key).await {
                Ok((bytes, _)) => {
                    let stored = StoredGroupConfig::decode(listed.key.as_str(), &bytes)?;
                    if !stored.values.is_empty() {
                        out.insert(
                            stored.group,
                            GroupConfig {
                                values: stored.values,
                            },
                        );
                    }
                }
                // Nothing deletes these objects, but a hand-cleaned store should not stop a
                // broker from reading the rest.
                Err(StorageError::NotFound(_)) => continue,
                Err(e) => return Err(storage(e)),
            }
        }
        Ok(out)
    }

    /// Reloads every group's configs whenever the change marker moves, every `interval`,
    /// until `this` is dropped. A failed read is retried at the next interval; the broker keeps
    /// what it last read meanwhile.
    pub async fn watch(this: Weak<Self>, clock: Arc<dyn Clock>, interval: Duration) {
        let mut ticker = strata_core::Ticker::new(clock, interval);
        let mut seen: Option<Option<Version>> = None;
        loop {
            ticker.tick().await;
            let Some(me) = this.upgrade() else {
                return;
            };
            let Some(store) = me.store.clone() else {
                return;
            };
            let marker = match object_key(group_configs::CHANGES_KEY) {
                Ok(key) => cas::marker_version(store.as_ref(), &key).await,
                Err(_) => continue,
            };
            let marker = match marker {
                Ok(marker) => marker,
                Err(e) => {
                    warn!(error = %e, "could not read the group-config change marker");
                    continue;
                }
            };
            if seen.as_ref() == Some(&marker) {
                continue;
            }
            match me.load_all(store.as_ref()).await {
                Ok(all) => {
                    debug!(groups = all.len(), "group configs loaded");
                    *lock(&me.cache) = all;
                    seen = Some(marker);
                }
                Err(e) => warn!(error = %e, "could not read the group configs"),
            }
        }
    }
}

/// The broker-wide settings Kafka lets a group override, as DescribeConfigs reports them for
/// a group (read-only here: see the module documentation).
pub fn broker_wide(settings: &crate::BrokerSettings) -> Vec<(&'static str, String)> {
    vec![
        (
            "share.delivery.count.limit",
            settings.group_share_delivery_count_limit.to_string(),
        ),
        (
            "share.partition.max.record.locks",
            settings.group_share_partition_max_record_locks.to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;
    use strata_storage::MemoryStore;

    use super::*;

    fn set(name: &str, value: &str) -> Change {
        (name.to_string(), Some(validate(name, value).unwrap()))
    }

    #[tokio::test]
    async fn a_config_set_through_one_broker_is_read_by_another_and_removed_again() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let a = GroupConfigs::new(Some(Arc::clone(&store)));
        let b = GroupConfigs::new(Some(Arc::clone(&store)));
        assert_eq!(b.read("g").await.unwrap(), GroupConfig::default());
        a.alter_unchecked(
            "g",
            &[set(SHARE_AUTO_OFFSET_RESET, "earliest")],
            false,
            false,
        )
        .await
        .unwrap();
        let lock = [set(SHARE_RECORD_LOCK_DURATION_MS, "15000")];
        let latest = [set(SHARE_AUTO_OFFSET_RESET, "latest")];
        let (x, y) = tokio::join!(
            a.alter_unchecked("g", &lock, false, false),
            b.alter_unchecked("g", &latest, false, false)
        );
        x.unwrap();
        y.unwrap();
        let read = b.read("g").await.unwrap();
        assert_eq!(read.auto_offset_reset(), Some(ShareAutoOffsetReset::Latest));
        assert_eq!(read.lock_duration(), Some(Duration::from_secs(15)));
        a.alter_unchecked("g", &[set(SHARE_AUTO_OFFSET_RESET, "earliest")], true, true)
            .await
            .unwrap();
        assert_eq!(
            b.read("g").await.unwrap(),
            read,
            "validate_only writes nothing"
        );
        // AlterConfigs replaces the whole set.
        a.alter_unchecked(
            "g",
            &[set(SHARE_AUTO_OFFSET_RESET, "earliest")],
            true,
            false,
        )
        .await
        .unwrap();
        let read = b.read("g").await.unwrap();
        assert_eq!(read.lock_duration(), None);
        a.alter_unchecked("g", &[(SHARE_AUTO_OFFSET_RESET.into(), None)], false, false)
            .await
            .unwrap();
        assert!(b.read("g").await.unwrap().values.is_empty());
        assert!(b.cached("g").values.is_empty());
    }

    #[test]
    fn values_and_names_are_checked_as_kafka_does() {
        assert_eq!(
            validate(SHARE_AUTO_OFFSET_RESET, "earliest").unwrap(),
            "earliest"
        );
        assert_eq!(
            validate(SHARE_RECORD_LOCK_DURATION_MS, "30000").unwrap(),
            "30000"
        );
        for (name, value) in [
            (SHARE_AUTO_OFFSET_RESET, "beginning"),
            (SHARE_RECORD_LOCK_DURATION_MS, "0"),
            (SHARE_RECORD_LOCK_DURATION_MS, "soon"),
        ] {
            assert!(matches!(
                validate(name, value),
                Err(GroupConfigError::Invalid(_))
            ));
        }
        assert_eq!(
            validate(CONSUMER_SESSION_TIMEOUT_MS, "6000").unwrap(),
            "6000"
        );
        let Err(GroupConfigError::Invalid(why)) = validate("share.delivery.count.limit", "4")
        else {
            panic!("accepted");
        };
        assert!(why.contains("group_share_delivery_count_limit"), "{why}");
        let Err(GroupConfigError::Invalid(why)) = validate("nonsense", "1") else {
            panic!("accepted");
        };
        assert_eq!(why, "Unknown group config name: nonsense");
    }

    /// Lets spawned tasks run until they wait on the (manual) clock again.
    async fn settle() {
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_watcher_picks_up_a_change_made_elsewhere_within_one_interval() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let watched = Arc::new(GroupConfigs::new(Some(Arc::clone(&store))));
        let task = tokio::spawn(GroupConfigs::watch(
            Arc::downgrade(&watched),
            clock.clone(),
            Duration::from_secs(1),
        ));
        settle().await;
        GroupConfigs::new(Some(store))
            .alter_unchecked(
                "g",
                &[set(SHARE_RECORD_LOCK_DURATION_MS, "5000")],
                false,
                false,
            )
            .await
            .unwrap();
        settle().await;
        assert_eq!(
            watched.cached("g").lock_duration(),
            None,
            "not before the next tick"
        );
        clock.advance(Duration::from_secs(1));
        settle().await;
        assert_eq!(
            watched.cached("g").lock_duration(),
            Some(Duration::from_secs(5))
        );
        drop(watched);
        clock.advance(Duration::from_secs(1));
        settle().await;
        assert!(task.is_finished(), "the watcher ends with its broker");
    }
}
