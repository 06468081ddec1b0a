//! Per-group configs: Kafka's GROUP config resource (type 32), which clients set with
//! IncrementalAlterConfigs or AlterConfigs and read with DescribeConfigs. Share-group clients
//! and test suites rely on it: a share group starts at the end of each partition unless its
//! `share.auto.offset.reset` is set to `earliest`, which is done per group.
//!
//! What is honoured, per group (every config Kafka 4.2 defines for consumer and share groups):
//! - `share.auto.offset.reset` (`earliest` / `latest`): where a share partition with no stored
//!   state starts. Read from storage when the share partition is loaded, so a config set through
//!   any broker just before the first ShareFetch is seen by the partition's owner.
//! - `share.isolation.level` (`read_uncommitted`, the default, / `read_committed`): whether the
//!   group's consumers get records of open and aborted transactions. The broker decides, as in
//!   Kafka: read_committed acquires only below the last stable offset and archives aborted
//!   records without delivering them.
//! - `share.record.lock.duration.ms`: the acquisition lock of records acquired from then on.
//! - `share.delivery.count.limit` (2 to 10, Kafka's bounds): deliveries after which a released
//!   or expired record is archived.
//! - `share.partition.max.record.locks`: records in flight per share partition, at most the
//!   broker's `group_share_partition_max_record_locks`, which bounds the memory and the stored
//!   state of every share partition: a group may lower it, not raise it.
//! - `consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms` (KIP-848 groups) and
//!   `share.session.timeout.ms`, `share.heartbeat.interval.ms` (share groups): a member's
//!   session from its next heartbeat, and the interval that heartbeat's answer asks for.
//!
//! All but the first apply on every broker within one `quota_refresh_interval` (a change marker
//! is polled), and at once on the broker that changed them. Names Kafka does not know are
//! refused with Kafka's own message. DescribeConfigs lists every one of them, at the broker's
//! value when the group has not set it.
//!
//! Storage: one object per group with configs, changed by compare-and-swap
//! (`strata_layout::group_configs`); a broker without shared storage keeps them in memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use strata_core::Clock;
use strata_groups::share_partition::ShareLimits;
use strata_layout::group_configs::{self, StoredGroupConfig};
use strata_layout::{cas, LayoutError};
use strata_log::Isolation;
use strata_storage::{ObjectKey, ObjectStore, StorageError, Version};
use tracing::{debug, warn};

use crate::share::ShareAutoOffsetReset;

/// How many times a change is retried when another writer got in between.
const CAS_ATTEMPTS: usize = 8;

pub const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub const SHARE_ISOLATION_LEVEL: &str = "share.isolation.level";
pub const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub const SHARE_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";
pub const SHARE_PARTITION_MAX_RECORD_LOCKS: &str = "share.partition.max.record.locks";
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

/// Kafka's bounds of `share.delivery.count.limit` (`group.share.min.delivery.count.limit` and
/// `group.share.max.delivery.count.limit` at their defaults).
const DELIVERY_COUNT_LIMITS: std::ops::RangeInclusive<i64> = 2..=10;

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

/// Checks one config to set, as Kafka's `GroupConfig.validate` would, and returns the value
/// to store.
pub fn validate(name: &str, value: &str) -> Result<String, GroupConfigError> {
    let invalid = |must: &str| {
        GroupConfigError::Invalid(format!(
            "Invalid value {value} for configuration {name}: {must}"
        ))
    };
    let integer = || value.trim().parse::<i64>().ok();
    match name {
        SHARE_AUTO_OFFSET_RESET => ShareAutoOffsetReset::parse(value)
            .map(|reset| reset.to_string())
            .ok_or_else(|| invalid("must be earliest, latest or by_duration:<ISO-8601 duration>")),
        SHARE_ISOLATION_LEVEL => parse_isolation(value)
            .map(|level| isolation_name(level).to_string())
            .ok_or_else(|| invalid("must be read_committed or read_uncommitted")),
        SHARE_DELIVERY_COUNT_LIMIT => integer()
            .filter(|n| DELIVERY_COUNT_LIMITS.contains(n))
            .map(|n| n.to_string())
            .ok_or_else(|| {
                invalid(&format!(
                    "must be between {} and {}",
                    DELIVERY_COUNT_LIMITS.start(),
                    DELIVERY_COUNT_LIMITS.end()
                ))
            }),
        SHARE_PARTITION_MAX_RECORD_LOCKS => integer()
            .filter(|n| (1..=i64::from(i32::MAX)).contains(n))
            .map(|n| n.to_string())
            .ok_or_else(|| invalid(&format!("must be between 1 and {}", i32::MAX))),
        _ if MILLISECONDS.contains(&name) => integer()
            .filter(|ms| (1..=i64::from(i32::MAX)).contains(ms))
            .map(|ms| ms.to_string())
            .ok_or_else(|| {
                invalid(&format!(
                    "must be a number of milliseconds between 1 and {}",
                    i32::MAX
                ))
            }),
        _ => Err(unknown(name)),
    }
}

/// Whether `name` is a config Strata keeps per group.
pub fn check_name(name: &str) -> Result<(), GroupConfigError> {
    match name {
        SHARE_AUTO_OFFSET_RESET
        | SHARE_ISOLATION_LEVEL
        | SHARE_DELIVERY_COUNT_LIMIT
        | SHARE_PARTITION_MAX_RECORD_LOCKS => Ok(()),
        _ if MILLISECONDS.contains(&name) => Ok(()),
        _ => Err(unknown(name)),
    }
}

fn unknown(name: &str) -> GroupConfigError {
    GroupConfigError::Invalid(format!("Unknown group config name: {name}"))
}

fn parse_isolation(text: &str) -> Option<Isolation> {
    match text {
        "read_uncommitted" => Some(Isolation::ReadUncommitted),
        "read_committed" => Some(Isolation::ReadCommitted),
        _ => None,
    }
}

/// Kafka's name of an isolation level.
pub fn isolation_name(level: Isolation) -> &'static str {
    match level {
        Isolation::ReadUncommitted => "read_uncommitted",
        Isolation::ReadCommitted => "read_committed",
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

    /// The group's share isolation level; read_uncommitted unless it set another.
    pub fn isolation(&self) -> Isolation {
        self.values
            .get(SHARE_ISOLATION_LEVEL)
            .and_then(|v| parse_isolation(v))
            .unwrap_or_default()
    }

    /// The share-partition limits of the group: its own where it set them, else the broker's.
    /// Its record-lock limit never exceeds the broker's, which bounds memory.
    pub fn share_limits(&self, broker: ShareLimits) -> ShareLimits {
        let number = |name: &str| self.values.get(name).and_then(|v| v.parse::<u64>().ok());
        ShareLimits {
            lock_duration: self.lock_duration().unwrap_or(broker.lock_duration),
            delivery_count_limit: number(SHARE_DELIVERY_COUNT_LIMIT)
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(broker.delivery_count_limit),
            max_record_locks: number(SHARE_PARTITION_MAX_RECORD_LOCKS)
                .and_then(|n| usize::try_from(n).ok())
                .map_or(broker.max_record_locks, |n| n.min(broker.max_record_locks)),
        }
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
    /// Held from a storage read or write to the cache update it leads to (`read`, `alter`,
    /// the watcher's reload), so they update the cache in the order they read: otherwise the
    /// watcher could list the configs, an alter here write and remember its result, and the
    /// watcher then put back what it listed before the alter.
    updating: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl GroupConfigs {
    pub fn new(store: Option<Arc<dyn ObjectStore>>) -> Self {
        Self {
            store,
            cache: Mutex::new(HashMap::new()),
            updating: tokio::sync::Mutex::new(()),
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
        let _in_order = self.updating.lock().await;
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
        let in_order = self.updating.lock().await;
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
        drop(in_order);
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
            let _in_order = me.updating.lock().await;
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
            (SHARE_ISOLATION_LEVEL, "serializable"),
            (SHARE_DELIVERY_COUNT_LIMIT, "1"),
            (SHARE_DELIVERY_COUNT_LIMIT, "11"),
            (SHARE_PARTITION_MAX_RECORD_LOCKS, "0"),
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
        assert_eq!(
            validate(SHARE_ISOLATION_LEVEL, "read_committed").unwrap(),
            "read_committed"
        );
        assert_eq!(validate(SHARE_DELIVERY_COUNT_LIMIT, "4").unwrap(), "4");
        let Err(GroupConfigError::Invalid(why)) = validate("nonsense", "1") else {
            panic!("accepted");
        };
        assert_eq!(why, "Unknown group config name: nonsense");
    }

    #[test]
    fn a_groups_limits_override_the_brokers_but_never_raise_its_record_lock_bound() {
        let broker = ShareLimits {
            max_record_locks: 2000,
            lock_duration: Duration::from_secs(30),
            delivery_count_limit: 5,
        };
        let mut config = GroupConfig::default();
        assert_eq!(config.share_limits(broker), broker);
        assert_eq!(config.isolation(), Isolation::ReadUncommitted);
        for (name, value) in [
            (SHARE_DELIVERY_COUNT_LIMIT, "2"),
            (SHARE_PARTITION_MAX_RECORD_LOCKS, "100"),
            (SHARE_RECORD_LOCK_DURATION_MS, "1500"),
            (SHARE_ISOLATION_LEVEL, "read_committed"),
        ] {
            config.values.insert(name.into(), value.into());
        }
        let limits = config.share_limits(broker);
        assert_eq!(limits.delivery_count_limit, 2);
        assert_eq!(limits.max_record_locks, 100);
        assert_eq!(limits.lock_duration, Duration::from_millis(1500));
        assert_eq!(config.isolation(), Isolation::ReadCommitted);
        config
            .values
            .insert(SHARE_PARTITION_MAX_RECORD_LOCKS.into(), "50000".into());
        assert_eq!(config.share_limits(broker).max_record_locks, 2000);
    }

    /// Lets spawned tasks run until they wait on the (manual) clock again.
    async fn settle() {
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
    }

    /// A broker's group configs over `store`, watched every second on `clock`, once the
    /// watcher has made its first read.
    async fn watched(
        store: &Arc<dyn ObjectStore>,
        clock: &Arc<ManualClock>,
    ) -> (Arc<GroupConfigs>, tokio::task::JoinHandle<()>) {
        let configs = Arc::new(GroupConfigs::new(Some(Arc::clone(store))));
        let task = tokio::spawn(GroupConfigs::watch(
            Arc::downgrade(&configs),
            clock.clone(),
            Duration::from_secs(1),
        ));
        settle().await;
        (configs, task)
    }

    #[tokio::test]
    async fn a_watcher_picks_up_a_change_made_elsewhere_within_one_interval() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let (watched, task) = watched(&store, &clock).await;
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

    /// An alter through this broker stays in its cache even if the watcher listed the
    /// configs just before it and installs after.
    #[tokio::test]
    async fn a_reload_listed_before_an_alter_does_not_undo_it() {
        let held = Arc::new(crate::tests::held_listing::HeldListing::new(
            group_configs::PREFIX,
            group_configs::CHANGES_KEY,
        ));
        let store: Arc<dyn ObjectStore> = held.clone();
        let clock = Arc::new(ManualClock::new(0));
        let (here, task) = watched(&store, &clock).await;
        // Another broker changes a group, so the watcher's next tick reloads...
        let elsewhere = [set(SHARE_RECORD_LOCK_DURATION_MS, "7000")];
        GroupConfigs::new(Some(store))
            .alter_unchecked("other", &elsewhere, false, false)
            .await
            .unwrap();
        // ...and that reload is held after listing only that group.
        let hold = held.arm();
        clock.advance(Duration::from_secs(1));
        hold.holding.await.unwrap();
        let change = [set(SHARE_RECORD_LOCK_DURATION_MS, "5000")];
        let (altered, ()) = tokio::join!(here.alter_unchecked("g", &change, false, false), async {
            // The alter waits for the watcher's install, so it cannot be the one to
            // release it: let it run as far as it can first.
            settle().await;
            hold.release.send(()).unwrap();
        });
        altered.unwrap();
        settle().await;
        assert_eq!(
            here.cached("g").lock_duration(),
            Some(Duration::from_secs(5))
        );
        drop(here);
        clock.advance(Duration::from_secs(1));
        settle().await;
        assert!(task.is_finished());
    }
}
