//! Share groups at run time (KIP-932): the membership of the share groups whose coordinator
//! shard is here, the share partitions of the data partitions this broker owns, the share
//! sessions of the members fetching from them, and the durable share state.
//!
//! The decisions are `strata-groups`' (`share`, `share_partition`); this module holds them in
//! memory, loads and stores the share-partition snapshots, and enforces the bounds.
//!
//! Durability: each share partition is one object, `share/<group>/<topic id>/<partition>`
//! (`strata_layout::share`), holding a compact snapshot. The owner that loads it rewrites it
//! at once by compare-and-swap (its claim), and every later write is a compare-and-swap on the
//! version it last wrote; a deposed owner's next write therefore fails, and it drops the share
//! partition and answers NOT_LEADER_OR_FOLLOWER. Acknowledgements are answered only once a
//! snapshot containing them is stored; concurrent acknowledgements of one share partition
//! share one write (the second waits for the first and finds its change already stored).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use strata_core::{Clock, TopicPartition};
use strata_groups::share::{
    ShareGroupConfig, ShareGroupDescription, ShareGroups, ShareHeartbeatRequest,
    ShareHeartbeatResponse,
};
/// Records by outcome, as the share metrics count them.
pub use strata_groups::share_partition::ShareCounts;
use strata_groups::share_partition::{ShareLimits, SharePartition, ShareSnapshot};
use strata_groups::{GroupError, SeededMemberIds, TopicCatalog};
use strata_log::{LogError, LogManager};
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError, Version};
use tracing::warn;

/// Where a share group with no stored state starts (`share.auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShareAutoOffsetReset {
    /// Only records produced after the share partition is first read (Kafka's default).
    #[default]
    Latest,
    /// From the log start.
    Earliest,
    /// From the first record no older than this when the share partition is first read
    /// (Kafka's `by_duration:<ISO-8601 duration>`, KIP-1106); the end when every record is older.
    ByDuration(Duration),
}

impl ShareAutoOffsetReset {
    /// `latest`, `earliest`, or `by_duration:` and an ISO-8601 duration (`PT1H`, `P1DT30M`,
    /// `PT0.5S`), as Kafka accepts them.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "latest" => Some(Self::Latest),
            "earliest" => Some(Self::Earliest),
            _ => text
                .strip_prefix("by_duration:")
                .and_then(parse_iso_duration)
                .map(Self::ByDuration),
        }
    }
}

impl std::fmt::Display for ShareAutoOffsetReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Latest => f.write_str("latest"),
            Self::Earliest => f.write_str("earliest"),
            Self::ByDuration(d) => {
                let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
                if nanos == 0 {
                    write!(f, "by_duration:PT{secs}S")
                } else {
                    let fraction = format!("{nanos:09}");
                    write!(
                        f,
                        "by_duration:PT{secs}.{}S",
                        fraction.trim_end_matches('0')
                    )
                }
            }
        }
    }
}

/// An ISO-8601 duration of days, hours, minutes and seconds, as Java's `Duration.parse` reads
/// it (`PnDTnHnMn.nS`, case-insensitive, at least one part); negative durations are refused,
/// as Kafka refuses them here.
fn parse_iso_duration(text: &str) -> Option<Duration> {
    let upper = text.trim().to_ascii_uppercase();
    let rest = upper.strip_prefix('P')?;
    let (days, time) = match rest.split_once('T') {
        Some((days, time)) => {
            if time.is_empty() {
                return None;
            }
            (days, Some(time))
        }
        None => (rest, None),
    };
    let mut total = Duration::ZERO;
    let mut parts = 0;
    let mut take = |section: &str, units: &[(char, u64)]| -> Option<()> {
        let mut section = section;
        let mut allowed = units;
        while !section.is_empty() {
            let end = section.find(|c: char| c.is_ascii_alphabetic())?;
            let (number, unit) = (&section[..end], section[end..].chars().next()?);
            let at = allowed.iter().position(|(u, _)| *u == unit)?;
            let seconds = allowed[at].1;
            allowed = &allowed[at + 1..];
            let (whole, fraction) = match number.split_once(['.', ',']) {
                Some((w, f))
                    if unit == 'S' && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    (w, f)
                }
                Some(_) => return None,
                None => (number, ""),
            };
            if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let whole: u64 = whole.parse().ok()?;
            let nanos: u32 = if fraction.is_empty() {
                0
            } else {
                format!("{fraction:0<9}").parse().ok()?
            };
            total = total
                .checked_add(Duration::from_secs(whole.checked_mul(seconds)?))?
                .checked_add(Duration::from_nanos(u64::from(nanos)))?;
            parts += 1;
            section = &section[end + 1..];
        }
        Some(())
    };
    take(days, &[('D', 86_400)])?;
    if let Some(time) = time {
        take(time, &[('H', 3_600), ('M', 60), ('S', 1)])?;
    }
    (parts > 0).then_some(total)
}

#[cfg(test)]
mod reset_tests {
    use super::*;

    #[test]
    fn by_duration_reads_iso_8601_durations_as_kafka_does() {
        let parse = ShareAutoOffsetReset::parse;
        let d = |secs: u64, nanos: u32| {
            Some(ShareAutoOffsetReset::ByDuration(Duration::new(secs, nanos)))
        };
        assert_eq!(parse("by_duration:PT1H"), d(3_600, 0));
        assert_eq!(parse("by_duration:P1DT30M"), d(86_400 + 1_800, 0));
        assert_eq!(parse("by_duration:pt0.5s"), d(0, 500_000_000));
        assert_eq!(parse("by_duration:PT1M2.25S"), d(62, 250_000_000));
        assert_eq!(parse("by_duration:P2D"), d(172_800, 0));
        for bad in [
            "by_duration:",
            "by_duration:P",
            "by_duration:PT",
            "by_duration:-PT1H",
            "by_duration:PT-1H",
            "by_duration:PT1S1M",
            "by_duration:P1H",
            "by_duration:PT1.5M",
            "by_duration:1h",
            "by_duration",
            "beginning",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        for text in [
            "latest",
            "earliest",
            "by_duration:PT90S",
            "by_duration:PT0.25S",
        ] {
            assert_eq!(parse(text).unwrap().to_string(), text);
        }
    }
}

/// Share settings, from [`crate::BrokerSettings`].
#[derive(Debug, Clone, Copy)]
pub struct ShareSettings {
    pub groups: ShareGroupConfig,
    pub limits: ShareLimits,
    pub auto_offset_reset: ShareAutoOffsetReset,
    /// Share sessions kept at once (`group.share.max.share.sessions`).
    pub max_share_sessions: usize,
    /// Share partitions (group × partition) held in memory; idle ones are dropped (their
    /// state is stored) to make room.
    pub max_share_partitions: usize,
}

/// Why a share partition could not be served; one variant per answer the client gets.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("partition not served here: {0}")]
    Log(#[from] LogError),
    /// Another owner wrote the share state since we loaded it: we were deposed.
    #[error("share state of {0} was written by another owner")]
    Fenced(String),
    #[error("share state storage failed: {0}")]
    Storage(String),
    /// Every share-partition slot holds acquired records.
    #[error("too many share partitions in use on this broker")]
    TooManySharePartitions,
    #[error("share session not found")]
    SessionNotFound,
    #[error("share session epoch {0} is not the expected {1}")]
    InvalidSessionEpoch(i32, i32),
    #[error("share session limit reached")]
    SessionLimitReached,
}

/// One share partition and its stored copy.
#[derive(Debug)]
pub(crate) struct SharePart {
    pub state: Mutex<SharePartition>,
    /// The log's epoch when loaded: a partition that moved away and back is loaded again.
    epoch: u64,
    /// Bumped under `state`'s lock by each change that must be stored.
    changes: AtomicU64,
    stored: tokio::sync::Mutex<Stored>,
    key: Option<ObjectKey>,
    /// Records by outcome since this share partition was loaded here, for its metrics series.
    counts: Mutex<ShareCounts>,
}

#[derive(Debug)]
struct Stored {
    version: Option<Version>,
    /// The change count the stored snapshot includes.
    persisted: u64,
}

impl SharePart {
    /// Runs `f` on the state; if `changed` says it changed something durable, counts a change.
    /// Returns the change number to wait for.
    pub fn update<T>(&self, f: impl FnOnce(&mut SharePartition) -> (T, bool)) -> (T, u64) {
        let mut st = lock(&self.state);
        let (out, changed) = f(&mut st);
        let n = if changed {
            self.changes.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            self.changes.load(Ordering::SeqCst)
        };
        (out, n)
    }
}

#[derive(Debug)]
struct Session {
    next_epoch: i32,
    partitions: BTreeSet<(TopicPartition, [u8; 16])>,
    last_used: Duration,
}

/// What a share session makes of a request.
#[derive(Debug)]
pub(crate) enum SessionStep {
    /// Fetch these partitions; `full` lists them all in the answer.
    Fetch {
        partitions: Vec<(TopicPartition, [u8; 16])>,
        full: bool,
    },
    /// The session closed (epoch -1): only acknowledgements, no fetch.
    Closed,
}

/// Records by outcome, since start: `/metrics`.
#[derive(Debug, Default)]
pub struct ShareMetrics {
    pub acquired: AtomicU64,
    pub redelivered: AtomicU64,
    pub accepted: AtomicU64,
    pub released: AtomicU64,
    pub rejected: AtomicU64,
    pub archived: AtomicU64,
}

impl ShareMetrics {
    pub(crate) fn count(&self, c: ShareCounts) {
        self.acquired.fetch_add(c.acquired, Ordering::Relaxed);
        self.redelivered.fetch_add(c.redelivered, Ordering::Relaxed);
        self.accepted.fetch_add(c.accepted, Ordering::Relaxed);
        self.released.fetch_add(c.released, Ordering::Relaxed);
        self.rejected.fetch_add(c.rejected, Ordering::Relaxed);
        self.archived.fetch_add(c.archived, Ordering::Relaxed);
    }
}

/// What `/metrics` shows of share groups.
#[derive(Debug, Clone, Default)]
pub struct ShareStats {
    /// Records by outcome since start: acquired, redelivered, accepted, released, rejected,
    /// archived.
    pub records: Vec<(&'static str, u64)>,
    /// Records not yet done per share group, over the share partitions held here; at most
    /// [`MAX_BACKLOG_SERIES`] groups, sorted by name.
    pub backlog: Vec<(String, u64)>,
    /// Per share partition held here (at most [`MAX_BACKLOG_SERIES`], sorted by group, topic
    /// and partition): records by outcome since it was loaded, and its backlog.
    pub partitions: Vec<SharePartitionStats>,
}

/// One share partition's series.
#[derive(Debug, Clone)]
pub struct SharePartitionStats {
    pub group: String,
    pub partition: TopicPartition,
    pub counts: ShareCounts,
    pub backlog: u64,
}

/// Bound on the backlog series one scrape reports (group ids are client-chosen).
pub const MAX_BACKLOG_SERIES: usize = 100;

type PartKey = (String, TopicPartition);

#[derive(Debug)]
pub struct ShareState {
    log: Arc<LogManager>,
    clock: Arc<dyn Clock>,
    store: Option<Arc<dyn ObjectStore>>,
    pub(crate) settings: ShareSettings,
    groups: Mutex<ShareGroups>,
    parts: Mutex<HashMap<PartKey, Arc<SharePart>>>,
    loading: tokio::sync::Mutex<()>,
    sessions: Mutex<HashMap<(String, String), Session>>,
    pub metrics: ShareMetrics,
    /// Per-group configs (`share.auto.offset.reset`, `share.record.lock.duration.ms`).
    pub(crate) configs: Arc<crate::group_configs::GroupConfigs>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ShareState {
    pub fn new(
        log: Arc<LogManager>,
        clock: Arc<dyn Clock>,
        settings: ShareSettings,
        seed: u64,
        store: Option<Arc<dyn ObjectStore>>,
    ) -> Self {
        Self {
            log,
            clock,
            configs: Arc::new(crate::group_configs::GroupConfigs::new(store.clone())),
            store,
            groups: Mutex::new(ShareGroups::new(
                settings.groups,
                Box::new(SeededMemberIds::new(seed)),
            )),
            settings,
            parts: Mutex::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            sessions: Mutex::new(HashMap::new()),
            metrics: ShareMetrics::default(),
        }
    }

    fn now(&self) -> Duration {
        self.clock.monotonic()
    }

    /// Counts records changing state in `part`, broker-wide and in the partition's series.
    pub(crate) fn count(&self, part: &SharePart, counts: ShareCounts) {
        self.metrics.count(counts);
        lock(&part.counts).add(counts);
    }

    /// The share-partition limits of `group`: its own configs where it set them, else the
    /// broker's.
    pub(crate) fn limits(&self, group_id: &str) -> ShareLimits {
        self.configs
            .cached_with(group_id, |c| c.share_limits(self.settings.limits))
    }

    /// What `group`'s consumers see of transactions (`share.isolation.level`).
    pub(crate) fn isolation(&self, group_id: &str) -> strata_log::Isolation {
        self.configs
            .cached_with(group_id, crate::group_configs::GroupConfig::isolation)
    }

    // ----- membership -----

    pub(crate) fn has_group(&self, group_id: &str) -> bool {
        lock(&self.groups).contains(group_id)
    }

    pub(crate) fn heartbeat(
        &self,
        req: ShareHeartbeatRequest,
        catalog: &dyn TopicCatalog,
    ) -> ShareHeartbeatResponse {
        let now = self.now();
        lock(&self.groups).heartbeat(req, now, catalog)
    }

    pub(crate) fn describe(&self, group_id: &str) -> Option<ShareGroupDescription> {
        let now = self.now();
        let mut groups = lock(&self.groups);
        groups.expire(now);
        groups.describe(group_id)
    }

    pub(crate) fn list(&self, hosted: impl Fn(&str) -> bool) -> Vec<(String, &'static str)> {
        let now = self.now();
        let mut groups = lock(&self.groups);
        groups.expire(now);
        // Groups whose shard moved away are the new coordinator's now.
        groups.retain(&hosted);
        groups.list()
    }

    pub(crate) fn delete_group(&self, group_id: &str) -> Result<(), GroupError> {
        let now = self.now();
        lock(&self.groups).delete(group_id, now)?;
        lock(&self.parts).retain(|(g, _), _| g != group_id);
        Ok(())
    }

    // ----- sessions -----

    /// Applies the share-session rules of KIP-932 to a ShareFetch (`acknowledge_only` false)
    /// or ShareAcknowledge: epoch 0 opens a session (replacing the member's), -1 closes it
    /// (releasing what the member holds), n continues session n.
    pub(crate) fn session(
        &self,
        group_id: &str,
        member_id: &str,
        epoch: i32,
        requested: &[(TopicPartition, [u8; 16])],
        forgotten: &[(TopicPartition, [u8; 16])],
        acknowledge_only: bool,
    ) -> Result<SessionStep, ShareError> {
        let now = self.now();
        let key = (group_id.to_string(), member_id.to_string());
        let mut sessions = lock(&self.sessions);
        match epoch {
            -1 => {
                let released = sessions.remove(&key);
                drop(sessions);
                if let Some(s) = released {
                    self.release_member(group_id, member_id, s.partitions.iter().map(|p| &p.0));
                }
                Ok(SessionStep::Closed)
            }
            0 if acknowledge_only => Err(ShareError::InvalidSessionEpoch(0, 1)),
            0 => {
                let old = sessions.remove(&key);
                if sessions.len() >= self.settings.max_share_sessions {
                    // Sessions unused for a whole member session are of members gone.
                    let idle = self.settings.groups.session_timeout;
                    sessions.retain(|_, s| now.saturating_sub(s.last_used) < idle);
                    if sessions.len() >= self.settings.max_share_sessions {
                        return Err(ShareError::SessionLimitReached);
                    }
                }
                let partitions: BTreeSet<_> = requested.iter().cloned().collect();
                sessions.insert(
                    key,
                    Session {
                        next_epoch: 1,
                        partitions: partitions.clone(),
                        last_used: now,
                    },
                );
                drop(sessions);
                if let Some(s) = old {
                    self.release_member(group_id, member_id, s.partitions.iter().map(|p| &p.0));
                }
                Ok(SessionStep::Fetch {
                    partitions: partitions.into_iter().collect(),
                    full: true,
                })
            }
            n => {
                let session = sessions.get_mut(&key).ok_or(ShareError::SessionNotFound)?;
                if n != session.next_epoch {
                    return Err(ShareError::InvalidSessionEpoch(n, session.next_epoch));
                }
                session.next_epoch = if n == i32::MAX { 1 } else { n + 1 };
                session.last_used = now;
                if acknowledge_only {
                    return Ok(SessionStep::Fetch {
                        partitions: Vec::new(),
                        full: false,
                    });
                }
                for p in requested {
                    session.partitions.insert(p.clone());
                }
                for p in forgotten {
                    session.partitions.remove(p);
                }
                Ok(SessionStep::Fetch {
                    partitions: session.partitions.iter().cloned().collect(),
                    full: false,
                })
            }
        }
    }

    fn release_member<'a>(
        &self,
        group_id: &str,
        member_id: &str,
        partitions: impl Iterator<Item = &'a TopicPartition>,
    ) {
        let parts = lock(&self.parts);
        for tp in partitions {
            if let Some(part) = parts.get(&(group_id.to_string(), tp.clone())) {
                let (counts, _) = part.update(|p| (p.release_member(member_id), false));
                self.count(part, counts);
            }
        }
    }

    // ----- share partitions -----

    /// The share partition of `group_id` on `tp`, loaded (and claimed) from storage first if
    /// this broker does not hold it under the partition's current epoch.
    pub(crate) async fn part(
        &self,
        group_id: &str,
        tp: &TopicPartition,
        topic_id: [u8; 16],
    ) -> Result<Arc<SharePart>, ShareError> {
        let epoch = self
            .log
            .readable_epoch(tp)
            .ok_or(ShareError::Log(LogError::NotOwner))?;
        let key = (group_id.to_string(), tp.clone());
        if let Some(p) = lock(&self.parts).get(&key).filter(|p| p.epoch == epoch) {
            return Ok(Arc::clone(p));
        }
        let _loading = self.loading.lock().await;
        if let Some(p) = lock(&self.parts).get(&key).filter(|p| p.epoch == epoch) {
            return Ok(Arc::clone(p));
        }
        let part = Arc::new(self.load(group_id, tp, topic_id, epoch).await?);
        let mut parts = lock(&self.parts);
        parts.remove(&key);
        if parts.len() >= self.settings.max_share_partitions {
            // Idle share partitions hold nothing that is not stored.
            parts.retain(|_, p| lock(&p.state).acquired_count() > 0);
            if parts.len() >= self.settings.max_share_partitions {
                return Err(ShareError::TooManySharePartitions);
            }
        }
        parts.insert(key, Arc::clone(&part));
        Ok(part)
    }

    /// Where a share partition with no state starts: where the group's
    /// `share.auto.offset.reset` says, else the broker's.
    async fn fresh_start(
        &self,
        tp: &TopicPartition,
        config: crate::group_configs::GroupConfig,
    ) -> Result<i64, ShareError> {
        let marks = self.log.watermarks(tp)?;
        let reset = config
            .auto_offset_reset()
            .unwrap_or(self.settings.auto_offset_reset);
        Ok(match reset {
            ShareAutoOffsetReset::Latest => marks.high.0,
            ShareAutoOffsetReset::Earliest => marks.log_start.0,
            ShareAutoOffsetReset::ByDuration(age) => {
                let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
                let since = self.clock.wall_millis().saturating_sub(age);
                match self.log.offset_for_timestamp(tp, since).await? {
                    Some((offset, _)) => offset.0.max(marks.log_start.0),
                    None => marks.high.0,
                }
            }
        })
    }

    async fn load(
        &self,
        group_id: &str,
        tp: &TopicPartition,
        topic_id: [u8; 16],
        epoch: u64,
    ) -> Result<SharePart, ShareError> {
        let limits = self.limits(group_id);
        let Some(store) = &self.store else {
            let start = self.fresh_start(tp, self.configs.cached(group_id)).await?;
            return Ok(SharePart {
                state: Mutex::new(SharePartition::new(start, limits)),
                epoch,
                changes: AtomicU64::new(0),
                stored: tokio::sync::Mutex::new(Stored {
                    version: None,
                    persisted: 0,
                }),
                key: None,
                counts: Mutex::new(ShareCounts::default()),
            });
        };
        let key = ObjectKey::new(strata_layout::share::key(
            group_id,
            strata_layout::TopicId(topic_id),
            tp.partition,
        ))
        .map_err(|e| ShareError::Storage(e.to_string()))?;
        let (state, version) = match store.get(&key).await {
            Ok((bytes, version)) => {
                let snapshot: ShareSnapshot = serde_json::from_slice(&bytes).map_err(|e| {
                    ShareError::Storage(format!("unreadable share state {key}: {e}"))
                })?;
                (
                    SharePartition::from_snapshot(&snapshot, limits),
                    Some(version),
                )
            }
            Err(StorageError::NotFound(_)) => {
                // Read from storage, not the cache: a config set through another broker just
                // before this first fetch must count.
                let config = self
                    .configs
                    .read(group_id)
                    .await
                    .map_err(|e| ShareError::Storage(e.to_string()))?;
                let start = self.fresh_start(tp, config).await?;
                (SharePartition::new(start, limits), None)
            }
            Err(e) => return Err(ShareError::Storage(e.to_string())),
        };
        // Claim: from here on a previous owner's write fails on the version.
        let version = write(store.as_ref(), &key, &state.snapshot(), version).await?;
        Ok(SharePart {
            state: Mutex::new(state),
            epoch,
            changes: AtomicU64::new(0),
            stored: tokio::sync::Mutex::new(Stored {
                version: Some(version),
                persisted: 0,
            }),
            key: Some(key),
            counts: Mutex::new(ShareCounts::default()),
        })
    }

    /// Returns once the stored snapshot includes change `upto`. One write covers every change
    /// made before it started.
    pub(crate) async fn persist(
        &self,
        group_id: &str,
        tp: &TopicPartition,
        part: &SharePart,
        upto: u64,
    ) -> Result<(), ShareError> {
        let (Some(store), Some(key)) = (&self.store, &part.key) else {
            return Ok(());
        };
        let mut stored = part.stored.lock().await;
        if stored.persisted >= upto {
            return Ok(());
        }
        let (snapshot, covers) = {
            let st = lock(&part.state);
            (st.snapshot(), part.changes.load(Ordering::SeqCst))
        };
        match write(store.as_ref(), key, &snapshot, stored.version.clone()).await {
            Ok(version) => {
                stored.version = Some(version);
                stored.persisted = covers;
                Ok(())
            }
            Err(e) => {
                // Whatever happened, our copy may no longer be the stored one: load again.
                warn!(group = group_id, %tp, error = %e, "share state write failed; dropping the share partition");
                let mut parts = lock(&self.parts);
                let k = (group_id.to_string(), tp.clone());
                if parts
                    .get(&k)
                    .is_some_and(|p| std::ptr::eq(p.as_ref(), part))
                {
                    parts.remove(&k);
                }
                Err(e)
            }
        }
    }

    // ----- administration (DescribeShareGroupOffsets, AlterShareGroupOffsets, ...) -----

    fn object_key(
        group_id: &str,
        topic_id: [u8; 16],
        partition: i32,
    ) -> Result<ObjectKey, ShareError> {
        ObjectKey::new(strata_layout::share::key(
            group_id,
            strata_layout::TopicId(topic_id),
            partition,
        ))
        .map_err(|e| ShareError::Storage(e.to_string()))
    }

    /// The stored start offset of a share partition; None if it has no state yet.
    pub(crate) async fn stored_start(
        &self,
        group_id: &str,
        topic_id: [u8; 16],
        partition: i32,
    ) -> Result<Option<i64>, ShareError> {
        let Some(store) = &self.store else {
            let tp_match = |tp: &TopicPartition| tp.partition == partition;
            let parts = lock(&self.parts);
            let found = parts.iter().find(|((g, tp), _)| {
                g == group_id
                    && tp_match(tp)
                    && self
                        .log
                        .topic(&tp.topic)
                        .is_some_and(|t| t.id.0 == topic_id)
            });
            return Ok(found.map(|(_, p)| lock(&p.state).start_offset()));
        };
        let key = Self::object_key(group_id, topic_id, partition)?;
        match store.get(&key).await {
            Ok((bytes, _)) => {
                let snapshot: ShareSnapshot = serde_json::from_slice(&bytes).map_err(|e| {
                    ShareError::Storage(format!("unreadable share state {key}: {e}"))
                })?;
                Ok(Some(snapshot.start_offset))
            }
            Err(StorageError::NotFound(_)) => Ok(None),
            Err(e) => Err(ShareError::Storage(e.to_string())),
        }
    }

    /// Replaces a share partition's state by one starting at `start` (None: deletes it, so
    /// `share_auto_offset_reset` applies again). The owner's copy is dropped here; an owner
    /// elsewhere finds its next write fenced, and checks the stored version when a member
    /// opens a share session ([`Self::refresh`]).
    pub(crate) async fn reset(
        &self,
        group_id: &str,
        tp: &TopicPartition,
        topic_id: [u8; 16],
        start: Option<i64>,
    ) -> Result<(), ShareError> {
        lock(&self.parts).remove(&(group_id.to_string(), tp.clone()));
        let Some(store) = &self.store else {
            return Ok(());
        };
        let key = Self::object_key(group_id, topic_id, tp.partition)?;
        let Some(start) = start else {
            return match store.delete(&key).await {
                Ok(()) | Err(StorageError::NotFound(_)) => Ok(()),
                Err(e) => Err(ShareError::Storage(e.to_string())),
            };
        };
        // Retried on a concurrent write (an owner storing acknowledgements of its last
        // records): the reset must land whole.
        for _ in 0..8 {
            let (epoch, version) = match store.get(&key).await {
                Ok((bytes, version)) => {
                    let old: Option<ShareSnapshot> = serde_json::from_slice(&bytes).ok();
                    (
                        old.map_or(0, |o| o.state_epoch.saturating_add(1)),
                        Some(version),
                    )
                }
                Err(StorageError::NotFound(_)) => (0, None),
                Err(e) => return Err(ShareError::Storage(e.to_string())),
            };
            let mut snapshot = SharePartition::new(start, self.settings.limits).snapshot();
            snapshot.state_epoch = epoch;
            match write(store.as_ref(), &key, &snapshot, version).await {
                Ok(_) => {
                    lock(&self.parts).remove(&(group_id.to_string(), tp.clone()));
                    return Ok(());
                }
                Err(ShareError::Fenced(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ShareError::Storage(format!(
            "share state {key} kept changing"
        )))
    }

    /// Drops our copy of a share partition if the stored state is no longer the one we wrote
    /// last (an administrator reset it): called when a member opens a share session, so one
    /// storage read per partition per new session.
    pub(crate) async fn refresh(&self, group_id: &str, tp: &TopicPartition) {
        let key = (group_id.to_string(), tp.clone());
        let Some(part) = lock(&self.parts).get(&key).cloned() else {
            return;
        };
        let (Some(store), Some(object)) = (&self.store, &part.key) else {
            return;
        };
        let stored = part.stored.lock().await;
        let current = match store.get(object).await {
            Ok((_, version)) => Some(version),
            Err(StorageError::NotFound(_)) => None,
            // Unknown: keep our copy; a write will tell.
            Err(_) => return,
        };
        if current != stored.version {
            drop(stored);
            let mut parts = lock(&self.parts);
            if parts.get(&key).is_some_and(|p| Arc::ptr_eq(p, &part)) {
                parts.remove(&key);
            }
        }
    }

    /// Deletes every stored share-partition state of `group_id` (DeleteGroups).
    pub(crate) async fn delete_stored(&self, group_id: &str) -> Result<(), ShareError> {
        lock(&self.parts).retain(|(g, _), _| g != group_id);
        let Some(store) = &self.store else {
            return Ok(());
        };
        let listed = store
            .list(&strata_layout::share::group_prefix(group_id))
            .await
            .map_err(|e| ShareError::Storage(e.to_string()))?;
        for meta in listed {
            match store.delete(&meta.key).await {
                Ok(()) | Err(StorageError::NotFound(_)) => {}
                Err(e) => return Err(ShareError::Storage(e.to_string())),
            }
        }
        Ok(())
    }

    /// Whether the share group has members (the offsets APIs need it empty).
    pub(crate) fn has_members(&self, group_id: &str) -> bool {
        self.describe(group_id)
            .is_some_and(|d| !d.members.is_empty())
    }

    /// Counters and backlog for `/metrics`.
    pub fn stats(&self) -> ShareStats {
        let m = &self.metrics;
        let records = vec![
            ("acquired", m.acquired.load(Ordering::Relaxed)),
            ("redelivered", m.redelivered.load(Ordering::Relaxed)),
            ("accepted", m.accepted.load(Ordering::Relaxed)),
            ("released", m.released.load(Ordering::Relaxed)),
            ("rejected", m.rejected.load(Ordering::Relaxed)),
            ("archived", m.archived.load(Ordering::Relaxed)),
        ];
        let mut per_group: std::collections::BTreeMap<String, u64> = Default::default();
        let mut partitions = Vec::new();
        for (group, tp, n, counts) in self.held() {
            *per_group.entry(group.clone()).or_default() += n;
            partitions.push(SharePartitionStats {
                group,
                partition: tp,
                counts,
                backlog: n,
            });
        }
        let mut backlog: Vec<(String, u64)> = per_group.into_iter().collect();
        backlog.truncate(MAX_BACKLOG_SERIES);
        partitions.sort_by(|a, b| (&a.group, &a.partition).cmp(&(&b.group, &b.partition)));
        partitions.truncate(MAX_BACKLOG_SERIES);
        ShareStats {
            records,
            backlog,
            partitions,
        }
    }

    /// Every held share partition: (group, partition, records not yet done, counts).
    fn held(&self) -> Vec<(String, TopicPartition, u64, ShareCounts)> {
        let parts: Vec<_> = lock(&self.parts)
            .iter()
            .map(|((g, tp), p)| (g.clone(), tp.clone(), Arc::clone(p)))
            .collect();
        parts
            .into_iter()
            .filter_map(|(g, tp, p)| {
                let high = self.log.watermarks(&tp).ok()?.high;
                let backlog = lock(&p.state).backlog(high.0);
                let counts = *lock(&p.counts);
                Some((g, tp, backlog, counts))
            })
            .collect()
    }

    /// The earliest lock deadline of `group_id`'s share partition on `tp`, if it holds any.
    pub(crate) fn next_lock_deadline(
        &self,
        group_id: &str,
        tp: &TopicPartition,
    ) -> Option<Duration> {
        let part = lock(&self.parts)
            .get(&(group_id.to_string(), tp.clone()))
            .cloned()?;
        let deadline = lock(&part.state).next_lock_deadline();
        deadline
    }
}

async fn write(
    store: &dyn ObjectStore,
    key: &ObjectKey,
    snapshot: &ShareSnapshot,
    version: Option<Version>,
) -> Result<Version, ShareError> {
    let data = serde_json::to_vec(snapshot).map_err(|e| ShareError::Storage(e.to_string()))?;
    let mode = match version {
        Some(v) => PutMode::Update(v),
        None => PutMode::Create,
    };
    match store.put(key, Bytes::from(data), mode).await {
        Ok(v) => Ok(v),
        Err(StorageError::Precondition(_) | StorageError::AlreadyExists(_)) => {
            Err(ShareError::Fenced(key.to_string()))
        }
        Err(e) => Err(ShareError::Storage(e.to_string())),
    }
}
