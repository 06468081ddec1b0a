//! Settings of the log layer (broker-wide) and of a topic (per-topic Kafka configs).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config_table::{config_def, TOPIC_CONFIGS};
use crate::{LogError, LogResult};

/// Broker-wide log settings. The server fills these from its configuration file; defaults suit
/// a local directory or RADOS (millisecond group commit).
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// A group-commit write starts when this much data is queued… It is also the most one write
    /// takes (at least one batch), so a backlog leaves in writes of about this size.
    pub flush_bytes: usize,
    /// …or when the oldest queued batch has waited this long.
    pub flush_interval: Duration,
    /// …or at once when no group-commit write is in flight and no produce request is still
    /// queueing its batches ([`crate::LogManager::hold_writes`]). Waiting for more data only
    /// pays while a write is busy; an idle writer that waits `flush_interval` adds it to every
    /// append's latency for nothing. Off on S3, where a write costs a billed request and
    /// fewer, larger objects are the point of the interval.
    pub flush_when_idle: bool,
    /// How many group-commit writes may be in flight at once. Offsets stay dense because a
    /// write's partitions are only published once every earlier write has landed.
    pub max_inflight_flushes: usize,
    /// Produce bytes accepted but not yet durable, broker-wide. At the limit, appends wait
    /// (backpressure) up to their timeout instead of growing memory.
    pub max_pending_bytes: usize,
    /// A partition's write-ahead tail is compacted into a segment once it holds this much…
    pub segment_bytes: usize,
    /// …or is this old.
    pub segment_interval: Duration,
    /// Size of the shared tail cache, in bytes of record batches.
    pub cache_bytes: usize,
    /// Offsets covered by one index chunk (fixed: index chunk k covers [k·span, (k+1)·span)).
    pub index_chunk_span: i64,
    /// How often retention is enforced.
    pub retention_check_interval: Duration,
    /// Partitions given to topics created without an explicit count (auto-creation).
    pub default_partitions: i32,
    /// A compressed batch is decompressed on append to check its records (as Kafka does); one
    /// that inflates past this, or past the topic's `max.message.bytes` if that is larger, is
    /// refused (MESSAGE_TOO_LARGE) instead of being inflated further: compression bombs cost at
    /// most this much decompression.
    pub max_decompressed_batch_bytes: usize,
    /// Compressed batches being decompressed at once, broker-wide; more wait their turn. Each
    /// holds a decompressor's window (up to 16 MiB for zstd) or, for raw snappy, the whole
    /// decompressed batch, so this bounds that memory as well as the CPU.
    pub max_concurrent_decompressions: usize,
    /// A graceful handover waits this long for the partition's queued appends to become
    /// durable; past it the handover fails and the partition serves on (the cluster retries).
    pub handover_timeout: Duration,
    /// Shutdown waits this long for queued appends to become durable before failing them
    /// (storage may be down).
    pub shutdown_timeout: Duration,
    /// Deletes of compacted write-ahead objects in flight at once, per compaction or handover.
    /// A handover frees one object per group commit since the last compaction (a thousand
    /// after a few seconds at 2k records/s); one at a time, on a local disk where each delete
    /// syncs a directory, that took seconds.
    pub wal_delete_concurrency: usize,
    /// Memory of the cleaner's key → latest offset map, per broker (split between
    /// `cleaner_threads`): 24 bytes a distinct key, filled to 90%. More dirty keys than fit
    /// make a pass cover fewer offsets (the next pass continues), never more memory.
    pub cleaner_dedupe_buffer_bytes: usize,
    /// The cleaner's reads and writes of segments, per broker, in bytes a second (u64::MAX:
    /// unthrottled), so cleaning does not starve produce and fetch of storage bandwidth.
    pub cleaner_io_max_bytes_per_second: u64,
    /// Cleaning passes running at once, each over one partition; 0 turns the cleaner off.
    pub cleaner_threads: usize,
    /// Aborted transactions a partition remembers (in its manifest, about 60 bytes each,
    /// rewritten by every compaction). At the bound a transactional batch that would start a
    /// new transaction in the partition is refused until retention or DeleteRecords moves the
    /// log start past older ones; markers are always accepted, so open transactions can end.
    pub max_aborted_transactions: usize,
    /// A partition's uncompacted write-ahead tail may hold at most this many bytes…
    ///
    /// The tail grows when compaction cannot keep up or cannot write at all (the bulk tier
    /// down). Past the bound a produce to the partition is refused with a retriable error until
    /// compaction catches up, so an outage of the bulk tier costs producers retries, not an
    /// index that grows without end in memory, write-ahead objects that can never be freed, and
    /// a takeover that must replay all of them. Transaction markers are always accepted.
    pub max_uncompacted_bytes: usize,
    /// …and at most this many batches: each costs 64 bytes of index in memory, and tiny
    /// batches would otherwise let a small byte count hold millions of them.
    pub max_uncompacted_batches: usize,
    /// Readers behind the tail read segments in aligned windows of this many bytes, kept for
    /// other fetches and read one ahead (`read_ahead`); 0 (the default) reads exactly what a
    /// fetch needs.
    pub read_ahead_bytes: usize,
    /// Memory for kept windows, broker-wide (windows their readers passed are dropped first;
    /// read-ahead only into memory no reader still needs).
    pub read_ahead_memory_bytes: usize,
    /// Segment reads of readers behind the tail in flight at once, broker-wide.
    pub catchup_max_concurrent_reads: usize,
    /// Segment bytes those readers read a second, broker-wide (u64::MAX: unpaced), so a
    /// replay of old data cannot take the storage bandwidth producers and tail readers need.
    pub catchup_io_max_bytes_per_second: u64,
    /// The store routes keys to a write-ahead tier and a bulk tier (`wal_storage` set): only
    /// then does a topic's `local.retention.*` keep compacted segments on the fast tier.
    pub tiered: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            flush_bytes: 1 << 20,
            flush_interval: Duration::from_millis(1),
            flush_when_idle: true,
            max_inflight_flushes: 4,
            max_pending_bytes: 256 << 20,
            segment_bytes: 16 << 20,
            segment_interval: Duration::from_secs(10),
            cache_bytes: 256 << 20,
            index_chunk_span: 1 << 16,
            retention_check_interval: Duration::from_secs(30),
            default_partitions: 1,
            max_decompressed_batch_bytes: 64 << 20,
            max_concurrent_decompressions: default_concurrent_decompressions(),
            handover_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(30),
            wal_delete_concurrency: 16,
            cleaner_dedupe_buffer_bytes: 64 << 20,
            cleaner_io_max_bytes_per_second: u64::MAX,
            cleaner_threads: 1,
            max_aborted_transactions: 10_000,
            max_uncompacted_bytes: 1 << 30,
            max_uncompacted_batches: 1_000_000,
            read_ahead_bytes: 0,
            read_ahead_memory_bytes: 64 << 20,
            catchup_max_concurrent_reads: 8,
            catchup_io_max_bytes_per_second: u64::MAX,
            tiered: false,
        }
    }
}

/// One decompression per core: the work is pure CPU, so more at once would only queue on the
/// cores while holding their memory.
pub fn default_concurrent_decompressions() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Whether record timestamps come from the producer or from the broker at append time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// `cleanup.policy`: what happens to old records. Kafka's list of `delete` and `compact`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupPolicy {
    /// Whole segments older than `retention.ms` or beyond `retention.bytes` are dropped.
    pub delete: bool,
    /// The cleaner keeps only the latest record of each key (key compaction).
    pub compact: bool,
}

impl Default for CleanupPolicy {
    fn default() -> Self {
        Self {
            delete: true,
            compact: false,
        }
    }
}

impl CleanupPolicy {
    /// Kafka's spelling: `delete`, `compact` or `compact,delete`.
    pub fn describe(self) -> String {
        match (self.compact, self.delete) {
            (true, true) => "compact,delete".to_string(),
            (true, false) => "compact".to_string(),
            _ => "delete".to_string(),
        }
    }
}

fn default_delete_retention_ms() -> i64 {
    86_400_000
}
fn default_max_compaction_lag_ms() -> i64 {
    i64::MAX
}
fn default_min_cleanable_dirty_ratio() -> f64 {
    0.5
}

/// The topic-level configs Strata honours, with Kafka's names and defaults. Stored in the
/// catalog: fields added later carry serde defaults, so older catalogs load unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicConfig {
    /// `retention.ms`; -1 keeps data forever.
    pub retention_ms: i64,
    /// `retention.bytes` per partition; -1 means no size limit.
    pub retention_bytes: i64,
    /// `max.message.bytes`: the largest record batch accepted.
    pub max_message_bytes: i32,
    /// `message.timestamp.type`.
    pub timestamp_type: TimestampType,
    /// `cleanup.policy`.
    #[serde(default)]
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long a tombstone survives after the cleaner first passed
    /// the segment holding it (so a consumer that is behind still sees the delete).
    #[serde(default = "default_delete_retention_ms")]
    pub delete_retention_ms: i64,
    /// `min.compaction.lag.ms`: records younger than this are never cleaned.
    #[serde(default)]
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: dirty records older than this make the partition cleanable
    /// whatever its dirty ratio.
    #[serde(default = "default_max_compaction_lag_ms")]
    pub max_compaction_lag_ms: i64,
    /// `min.cleanable.dirty.ratio`: cleaned when at least this share of the segments' bytes
    /// was never cleaned.
    #[serde(default = "default_min_cleanable_dirty_ratio")]
    pub min_cleanable_dirty_ratio: f64,
    /// `local.retention.ms`: on a tiered broker, how long compacted segments stay on the fast
    /// (write-ahead) tier before the tiering pass moves them to the bulk tier. -2 (Kafka's
    /// "same as retention.ms") and 0: not at all; -1: no time limit. See [`Self::fast_tier`].
    #[serde(default = "unset_local_retention")]
    pub local_retention_ms: i64,
    /// `local.retention.bytes`: the same bound in bytes of segments per partition.
    #[serde(default = "unset_local_retention")]
    pub local_retention_bytes: i64,
}

fn unset_local_retention() -> i64 {
    -2
}

/// Which compacted segments of a partition the topic keeps on the fast tier, from its
/// `local.retention.*` (meaningful only on a broker with a write-ahead tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastTierStay {
    /// A segment whose newest record is older than this (ms) moves to the bulk tier.
    pub max_age_ms: Option<i64>,
    /// Beyond this many bytes of fast-tier segments, the oldest move to the bulk tier.
    pub max_bytes: Option<i64>,
}

// The ratio is validated to lie in [0, 1], never NaN, so equality is total.
impl Eq for TopicConfig {}

impl Default for TopicConfig {
    fn default() -> Self {
        Self {
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            max_message_bytes: 1_048_588,
            timestamp_type: TimestampType::CreateTime,
            cleanup_policy: CleanupPolicy::default(),
            delete_retention_ms: default_delete_retention_ms(),
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: default_max_compaction_lag_ms(),
            min_cleanable_dirty_ratio: default_min_cleanable_dirty_ratio(),
            local_retention_ms: unset_local_retention(),
            local_retention_bytes: unset_local_retention(),
        }
    }
}

/// One config as DescribeConfigs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    pub name: &'static str,
    pub value: String,
    pub is_default: bool,
    pub read_only: bool,
}

impl TopicConfig {
    /// Whether compaction writes this topic's segments to the fast tier, and how long they
    /// stay there. None — straight to the bulk tier — unless `local.retention.ms` or
    /// `local.retention.bytes` is set explicitly, and neither is 0.
    ///
    /// Why -2 (both defaults) means "no stay" although Kafka reads it as "as long as
    /// retention": Kafka's local copy is a *second* copy beside the remote one, and keeping it
    /// for the whole retention costs only local disk. Strata keeps one copy, so a stay on the
    /// fast tier is instead of the bulk tier: reading -2 Kafka's way would keep every topic of
    /// a tiered broker off its bulk tier, undoing the operator's choice of tiers. A topic asks
    /// for the fast tier by naming a bound; -1 there means no bound of that kind.
    pub fn fast_tier(&self) -> Option<FastTierStay> {
        let (ms, bytes) = (self.local_retention_ms, self.local_retention_bytes);
        if (ms == -2 && bytes == -2) || ms == 0 || bytes == 0 {
            return None;
        }
        Some(FastTierStay {
            max_age_ms: (ms > 0).then_some(ms),
            max_bytes: (bytes > 0).then_some(bytes),
        })
    }

    /// Builds a config from explicit overrides, rejecting unknown names and bad values.
    pub fn from_overrides(overrides: &BTreeMap<String, String>) -> LogResult<Self> {
        let mut config = TopicConfig::default();
        for (name, value) in overrides {
            config.apply(name, value)?;
        }
        // Kafka's LogConfig.validateValues.
        if config.min_compaction_lag_ms > config.max_compaction_lag_ms {
            return Err(LogError::InvalidConfig(format!(
                "conflict topic config setting min.compaction.lag.ms ({}) > max.compaction.lag.ms ({})",
                config.min_compaction_lag_ms, config.max_compaction_lag_ms
            )));
        }
        Ok(config)
    }

    fn apply(&mut self, name: &str, value: &str) -> LogResult<()> {
        let bad = |why: &str| LogError::InvalidConfig(format!("{name}={value:?}: {why}"));
        let Some(def) = config_def(name) else {
            return Err(LogError::InvalidConfig(format!(
                "unknown or unsupported topic config {name:?}"
            )));
        };
        (def.check)(value).map_err(|why| bad(&why))?;
        match name {
            "retention.ms" => {
                let v: i64 = value.trim().parse().map_err(|_| bad("not an integer"))?;
                if v < -1 {
                    return Err(bad("must be -1 or a non-negative number of milliseconds"));
                }
                self.retention_ms = v;
            }
            "retention.bytes" => {
                let v: i64 = value.trim().parse().map_err(|_| bad("not an integer"))?;
                if v < -1 {
                    return Err(bad("must be -1 or a non-negative number of bytes"));
                }
                self.retention_bytes = v;
            }
            "max.message.bytes" => {
                let v: i32 = value.trim().parse().map_err(|_| bad("not an integer"))?;
                if v < 0 {
                    return Err(bad("must be non-negative"));
                }
                self.max_message_bytes = v;
            }
            "message.timestamp.type" => {
                self.timestamp_type = match value.trim() {
                    "CreateTime" => TimestampType::CreateTime,
                    "LogAppendTime" => TimestampType::LogAppendTime,
                    _ => return Err(bad("must be CreateTime or LogAppendTime")),
                }
            }
            "cleanup.policy" => {
                let mut policy = CleanupPolicy {
                    delete: false,
                    compact: false,
                };
                for item in value.split(',') {
                    match item.trim() {
                        "delete" => policy.delete = true,
                        "compact" => policy.compact = true,
                        _ => return Err(bad("each item must be compact or delete")),
                    }
                }
                self.cleanup_policy = policy;
            }
            "delete.retention.ms" => {
                self.delete_retention_ms =
                    value.trim().parse().map_err(|_| bad("not an integer"))?;
            }
            "min.compaction.lag.ms" => {
                self.min_compaction_lag_ms =
                    value.trim().parse().map_err(|_| bad("not an integer"))?;
            }
            "max.compaction.lag.ms" => {
                self.max_compaction_lag_ms =
                    value.trim().parse().map_err(|_| bad("not an integer"))?;
            }
            "local.retention.ms" | "local.retention.bytes" => {
                let v: i64 = value.trim().parse().map_err(|_| bad("not an integer"))?;
                if v < -2 {
                    return Err(bad("must be -2, -1 or non-negative"));
                }
                if name == "local.retention.ms" {
                    self.local_retention_ms = v;
                } else {
                    self.local_retention_bytes = v;
                }
            }
            "min.cleanable.dirty.ratio" => {
                self.min_cleanable_dirty_ratio =
                    value.trim().parse().map_err(|_| bad("not a number"))?;
            }
            // Checked above, and either with no effect or only accepted at the value Strata
            // behaves as.
            _ => {}
        }
        Ok(())
    }

    /// Every accepted config (the table's rows, in its order) with its effective value, for
    /// DescribeConfigs.
    pub fn entries(&self, overrides: &BTreeMap<String, String>) -> Vec<ConfigEntry> {
        TOPIC_CONFIGS
            .iter()
            .map(|def| {
                let value = match def.name {
                    "retention.ms" => self.retention_ms.to_string(),
                    "retention.bytes" => self.retention_bytes.to_string(),
                    "max.message.bytes" => self.max_message_bytes.to_string(),
                    "cleanup.policy" => self.cleanup_policy.describe(),
                    "message.timestamp.type" => match self.timestamp_type {
                        TimestampType::CreateTime => "CreateTime".to_string(),
                        TimestampType::LogAppendTime => "LogAppendTime".to_string(),
                    },
                    _ => overrides
                        .get(def.name)
                        .map_or(def.default, |v| v.trim())
                        .to_string(),
                };
                ConfigEntry {
                    name: def.name,
                    value,
                    is_default: !overrides.contains_key(def.name),
                    read_only: false,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn describes_every_row_of_the_table_with_overrides_as_set() {
        let overrides = BTreeMap::from([
            ("min.insync.replicas".to_string(), "2".to_string()),
            ("retention.ms".to_string(), "1000".to_string()),
        ]);
        let config = TopicConfig::from_overrides(&overrides).unwrap();
        let entries = config.entries(&overrides);
        assert_eq!(entries.len(), TOPIC_CONFIGS.len());
        let get = |name: &str| entries.iter().find(|e| e.name == name).unwrap().clone();
        assert_eq!(
            (
                get("min.insync.replicas").value,
                get("min.insync.replicas").is_default
            ),
            ("2".to_string(), false)
        );
        assert_eq!(get("retention.ms").value, "1000");
        assert_eq!(
            (get("segment.bytes").value, get("segment.bytes").is_default),
            ("1073741824".to_string(), true)
        );
        assert_eq!(get("compression.type").value, "producer");
    }

    use super::*;

    fn with(pairs: &[(&str, &str)]) -> LogResult<TopicConfig> {
        TopicConfig::from_overrides(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn local_retention_asks_for_the_fast_tier_only_when_set_and_not_zero() {
        let stay = |pairs: &[(&str, &str)]| with(pairs).unwrap().fast_tier();
        assert_eq!(stay(&[]), None);
        assert_eq!(stay(&[("local.retention.ms", "-2")]), None);
        assert_eq!(stay(&[("local.retention.ms", "0")]), None);
        assert_eq!(
            stay(&[
                ("local.retention.ms", "600000"),
                ("local.retention.bytes", "0")
            ]),
            None
        );
        assert_eq!(
            stay(&[("local.retention.ms", "600000")]),
            Some(FastTierStay {
                max_age_ms: Some(600_000),
                max_bytes: None
            })
        );
        assert_eq!(
            stay(&[
                ("local.retention.bytes", "1048576"),
                ("local.retention.ms", "-1")
            ]),
            Some(FastTierStay {
                max_age_ms: None,
                max_bytes: Some(1 << 20)
            })
        );
        // -1 alone: on the fast tier until retention deletes it.
        assert_eq!(
            stay(&[("local.retention.ms", "-1")]),
            Some(FastTierStay {
                max_age_ms: None,
                max_bytes: None
            })
        );
        assert!(with(&[("local.retention.ms", "-3")]).is_err());
        assert!(with(&[("local.retention.bytes", "x")]).is_err());
    }

    #[test]
    fn cleanup_policies_and_compaction_settings_parse_as_kafka_validates_them() {
        let policy = |v: &str| with(&[("cleanup.policy", v)]).unwrap().cleanup_policy;
        assert_eq!(
            policy("compact"),
            CleanupPolicy {
                delete: false,
                compact: true
            }
        );
        assert_eq!(
            policy("delete"),
            CleanupPolicy {
                delete: true,
                compact: false
            }
        );
        assert_eq!(
            policy("compact, delete"),
            CleanupPolicy {
                delete: true,
                compact: true
            }
        );
        assert_eq!(policy("delete,compact").describe(), "compact,delete");
        let c = with(&[
            ("delete.retention.ms", "5"),
            ("min.compaction.lag.ms", "6"),
            ("max.compaction.lag.ms", "7"),
            ("min.cleanable.dirty.ratio", "0.25"),
        ])
        .unwrap();
        assert_eq!(
            (
                c.delete_retention_ms,
                c.min_compaction_lag_ms,
                c.max_compaction_lag_ms
            ),
            (5, 6, 7)
        );
        assert_eq!(c.min_cleanable_dirty_ratio, 0.25);
        assert!(with(&[("delete.retention.ms", "-1")]).is_err());
        assert!(with(&[("min.compaction.lag.ms", "-1")]).is_err());
        assert!(with(&[("max.compaction.lag.ms", "0")]).is_err());
        assert!(with(&[("min.cleanable.dirty.ratio", "1.5")]).is_err());
        assert!(with(&[("min.cleanable.dirty.ratio", "NaN")]).is_err());
        assert!(with(&[
            ("min.compaction.lag.ms", "10"),
            ("max.compaction.lag.ms", "5")
        ])
        .is_err());
        let d = TopicConfig::default();
        assert_eq!(
            d.cleanup_policy,
            CleanupPolicy {
                delete: true,
                compact: false
            }
        );
        assert_eq!(
            (
                d.delete_retention_ms,
                d.min_compaction_lag_ms,
                d.max_compaction_lag_ms
            ),
            (86_400_000, 0, i64::MAX)
        );
    }

    #[test]
    fn catalogs_written_before_compaction_load_with_kafka_defaults() {
        let old = r#"{"retention_ms":1000,"retention_bytes":-1,"max_message_bytes":1048588,"timestamp_type":"CreateTime"}"#;
        let c: TopicConfig = serde_json::from_str(old).unwrap();
        assert_eq!(c.retention_ms, 1000);
        assert_eq!(c.cleanup_policy, CleanupPolicy::default());
        assert_eq!(c.min_cleanable_dirty_ratio, 0.5);
        assert_eq!(c.max_compaction_lag_ms, i64::MAX);
    }

    #[test]
    fn rejects_unknown_names_and_bad_values() {
        let one = |k: &str, v: &str| {
            TopicConfig::from_overrides(&BTreeMap::from([(k.to_string(), v.to_string())]))
        };
        assert!(one("retention.ms", "1000").is_ok());
        assert!(one("retention.ms", "-2").is_err());
        assert!(one("retention.ms", "soon").is_err());
        assert!(one("cleanup.policy", "compact,shred").is_err());
        assert!(one("cleanup.policy", "").is_err());
        assert!(one("segment.bytes.typo", "1").is_err());
        assert!(one("compression.type", "zstd").is_err());
        assert!(one("min.insync.replicas", "2").is_ok());
        assert!(one("min.insync.replicas", "0").is_err());
        assert_eq!(
            one("message.timestamp.type", "LogAppendTime")
                .unwrap()
                .timestamp_type,
            TimestampType::LogAppendTime
        );
    }
}
