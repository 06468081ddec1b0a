//! The one table of topic configs: every name a topic accepts, its default, whether Strata
//! honours it, and why. Validation (`TopicConfig::from_overrides`), DescribeConfigs and
//! `docs/CONFIGS.md` (rendered by [`markdown`], checked by a test) all read it, so what is
//! accepted, what is described and what is documented cannot drift apart.
//!
//! Tools set many configs that mean nothing without broker-local segment files or follower
//! replicas (`segment.bytes`, `min.insync.replicas`, ...). Refusing them would break those
//! tools for no benefit, so they are accepted (their values still validated as Kafka
//! validates them) and described, with no effect. A config whose Kafka meaning Strata cannot
//! deliver — recompression — is refused for any value but
//! the one Strata behaves as, so nobody believes they got what they asked for.

/// What Strata does with a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Read and acted on.
    Honoured,
    /// Validated, stored and described; changes nothing.
    AcceptedNoEffect,
    /// Only the value Strata behaves as is accepted; any other is INVALID_CONFIG.
    Refused,
}

impl Support {
    pub fn label(self) -> &'static str {
        match self {
            Support::Honoured => "honoured",
            Support::AcceptedNoEffect => "accepted, no effect",
            Support::Refused => "refused unless default",
        }
    }
}

/// Kafka's config types, as DescribeConfigs v3+ reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Boolean,
    String,
    Int,
    Long,
    Double,
    List,
}

impl Kind {
    /// Kafka's ConfigType number.
    pub fn code(self) -> i8 {
        match self {
            Kind::Boolean => 1,
            Kind::String => 2,
            Kind::Int => 3,
            Kind::Long => 5,
            Kind::Double => 6,
            Kind::List => 7,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct ConfigDef {
    pub name: &'static str,
    /// Kafka's default, as DescribeConfigs reports it.
    pub default: &'static str,
    pub kind: Kind,
    pub support: Support,
    /// What the config does in Strata, or why it does nothing / is refused.
    pub why: &'static str,
    /// Checks a value: for Refused rows the values Strata behaves as; for the others Kafka's
    /// own validation of the value.
    pub check: fn(&str) -> Result<(), String>,
}

fn int_at_least(value: &str, min: i64, max: i64) -> Result<(), String> {
    match value.trim().parse::<i64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(()),
        Ok(_) if max == i64::MAX => Err(format!("must be at least {min}")),
        Ok(_) => Err(format!("must be between {min} and {max}")),
        Err(_) => Err("not an integer".to_string()),
    }
}

fn int(value: &str, min: i64) -> Result<(), String> {
    int_at_least(value, min, i64::from(i32::MAX))
}

fn long(value: &str, min: i64) -> Result<(), String> {
    int_at_least(value, min, i64::MAX)
}

fn boolean(value: &str) -> Result<(), String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "false" => Ok(()),
        _ => Err("must be true or false".to_string()),
    }
}

fn one_of(value: &str, allowed: &[&str], why: &str) -> Result<(), String> {
    if allowed.contains(&value.trim()) {
        Ok(())
    } else {
        Err(why.to_string())
    }
}

/// Kafka's `cleanup.policy` list: `compact` and/or `delete`.
fn cleanup_policy(value: &str) -> Result<(), String> {
    if value
        .split(',')
        .all(|item| matches!(item.trim(), "compact" | "delete"))
    {
        Ok(())
    } else {
        Err("must be a list of compact and delete".to_string())
    }
}

/// A throttled-replicas list: empty, `*`, or `partition:broker` pairs, as Kafka checks it.
fn throttled_replicas(value: &str) -> Result<(), String> {
    let v = value.trim();
    if v.is_empty() || v == "*" {
        return Ok(());
    }
    let pair = |item: &str| {
        let (p, b) = item.trim().split_once(':')?;
        p.trim().parse::<u32>().ok()?;
        b.trim().parse::<u32>().ok()
    };
    if v.split(',').all(|item| pair(item).is_some()) {
        Ok(())
    } else {
        Err("must be empty, * or a list of partition:broker pairs".to_string())
    }
}

const WEEK_MS: &str = "604800000";

/// Every topic config Strata accepts, sorted by name. Anything else is INVALID_CONFIG.
pub const TOPIC_CONFIGS: &[ConfigDef] = &[
    ConfigDef {
        name: "cleanup.policy",
        default: "delete",
        kind: Kind::List,
        support: Support::Honoured,
        why: "`delete`: retention by time and size; `compact`: the cleaner keeps the latest record per key (no retention deletion); `compact,delete`: both",
        check: cleanup_policy,
    },
    ConfigDef {
        name: "compression.type",
        default: "producer",
        kind: Kind::String,
        support: Support::Refused,
        why: "only `producer`: batches are stored as the producer compressed them; Kafka recompresses to any other value, Strata cannot",
        check: |v| one_of(v, &["producer"], "only compression.type=producer is supported: Strata stores batches as the producer compressed them and does not recompress"),
    },
    ConfigDef {
        name: "delete.retention.ms",
        default: "86400000",
        kind: Kind::Long,
        support: Support::Honoured,
        why: "compacted topics: how long a tombstone (null value) is kept after the cleaner first passed its segment",
        check: |v| long(v, 0),
    },
    ConfigDef {
        name: "file.delete.delay.ms",
        default: "60000",
        kind: Kind::Long,
        support: Support::AcceptedNoEffect,
        why: "no local files; removed data is deleted from storage by the garbage collector",
        check: |v| long(v, 0),
    },
    ConfigDef {
        name: "flush.messages",
        default: "9223372036854775807",
        kind: Kind::Long,
        support: Support::AcceptedNoEffect,
        why: "every acknowledged record is already durable in storage (group commit)",
        check: |v| long(v, 1),
    },
    ConfigDef {
        name: "flush.ms",
        default: "9223372036854775807",
        kind: Kind::Long,
        support: Support::AcceptedNoEffect,
        why: "every acknowledged record is already durable in storage (group commit)",
        check: |v| long(v, 0),
    },
    ConfigDef {
        name: "follower.replication.throttled.replicas",
        default: "",
        kind: Kind::List,
        support: Support::AcceptedNoEffect,
        why: "no follower replication: the storage replicates",
        check: throttled_replicas,
    },
    ConfigDef {
        name: "index.interval.bytes",
        default: "4096",
        kind: Kind::Int,
        support: Support::AcceptedNoEffect,
        why: "the index has one entry per batch",
        check: |v| int(v, 0),
    },
    ConfigDef {
        name: "leader.replication.throttled.replicas",
        default: "",
        kind: Kind::List,
        support: Support::AcceptedNoEffect,
        why: "no follower replication: the storage replicates",
        check: throttled_replicas,
    },
    ConfigDef {
        name: "local.retention.bytes",
        default: "-2",
        kind: Kind::Long,
        support: Support::Honoured,
        why: "with `wal_storage` set: bytes of compacted segments per partition kept on the fast (write-ahead) tier; beyond it the oldest move to the bulk tier. -2 (default) or 0: compacted segments go straight to the bulk tier (Kafka's -2, \"as retention\", would keep a second copy; Strata keeps one); -1: no size bound. No effect on a broker with one storage",
        check: |v| long(v, -2),
    },
    ConfigDef {
        name: "local.retention.ms",
        default: "-2",
        kind: Kind::Long,
        support: Support::Honoured,
        why: "with `wal_storage` set: how long compacted segments stay on the fast (write-ahead) tier, by their newest record's timestamp, before moving to the bulk tier. -2 (default) or 0: straight to the bulk tier; -1: no time bound. No effect on a broker with one storage",
        check: |v| long(v, -2),
    },
    ConfigDef {
        name: "max.compaction.lag.ms",
        default: "9223372036854775807",
        kind: Kind::Long,
        support: Support::Honoured,
        why: "compacted topics: segments with records older than this are cleaned whatever the dirty ratio",
        check: |v| long(v, 1),
    },
    ConfigDef {
        name: "max.message.bytes",
        default: "1048588",
        kind: Kind::Int,
        support: Support::Honoured,
        why: "the largest record batch the topic accepts (MESSAGE_TOO_LARGE beyond)",
        check: |v| int(v, 0),
    },
    ConfigDef {
        name: "message.downconversion.enable",
        default: "true",
        kind: Kind::Boolean,
        support: Support::AcceptedNoEffect,
        why: "Fetch below v4 (the message formats it would convert to) is not served",
        check: boolean,
    },
    ConfigDef {
        name: "message.timestamp.type",
        default: "CreateTime",
        kind: Kind::String,
        support: Support::Honoured,
        why: "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches at append",
        check: |v| one_of(v, &["CreateTime", "LogAppendTime"], "must be CreateTime or LogAppendTime"),
    },
    ConfigDef {
        name: "min.cleanable.dirty.ratio",
        default: "0.5",
        kind: Kind::Double,
        support: Support::Honoured,
        why: "compacted topics: cleaned once this share of the segments' bytes was never cleaned",
        check: |v| match v.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(()),
            _ => Err("must be a number between 0 and 1".to_string()),
        },
    },
    ConfigDef {
        name: "min.compaction.lag.ms",
        default: "0",
        kind: Kind::Long,
        support: Support::Honoured,
        why: "compacted topics: records younger than this are never cleaned",
        check: |v| long(v, 0),
    },
    ConfigDef {
        name: "min.insync.replicas",
        default: "1",
        kind: Kind::Int,
        support: Support::AcceptedNoEffect,
        why: "an acknowledged record is durable in storage; there are no followers to wait for (no NOT_ENOUGH_REPLICAS)",
        check: |v| int(v, 1),
    },
    ConfigDef {
        name: "preallocate",
        default: "false",
        kind: Kind::Boolean,
        support: Support::AcceptedNoEffect,
        why: "no local segment files",
        check: boolean,
    },
    ConfigDef {
        name: "remote.storage.enable",
        default: "false",
        kind: Kind::Boolean,
        support: Support::AcceptedNoEffect,
        why: "tiering is the broker's `wal_storage`, not a topic's switch: with it every topic's compacted data reaches the bulk tier (`storage`), after the stay on the fast tier its `local.retention.*` asks for, whatever this says; without it one storage holds everything. Either way all data is already in shared storage, which is what Kafka's remote tier adds",
        check: boolean,
    },
    ConfigDef {
        name: "retention.bytes",
        default: "-1",
        kind: Kind::Long,
        support: Support::Honoured,
        why: "bytes a partition keeps before its oldest data may be deleted; -1: no limit",
        check: |v| long(v, -1),
    },
    ConfigDef {
        name: "retention.ms",
        default: WEEK_MS,
        kind: Kind::Long,
        support: Support::Honoured,
        why: "how long records are kept before they may be deleted; -1: forever",
        check: |v| long(v, -1),
    },
    ConfigDef {
        name: "segment.bytes",
        default: "1073741824",
        kind: Kind::Int,
        support: Support::AcceptedNoEffect,
        why: "segments are cut by the broker-wide `log.segment_bytes` setting",
        check: |v| int(v, 14),
    },
    ConfigDef {
        name: "segment.index.bytes",
        default: "10485760",
        kind: Kind::Int,
        support: Support::AcceptedNoEffect,
        why: "index chunks have a fixed span (`log.index_chunk_span`)",
        check: |v| int(v, 4),
    },
    ConfigDef {
        name: "segment.ms",
        default: WEEK_MS,
        kind: Kind::Long,
        support: Support::AcceptedNoEffect,
        why: "segments are cut by the broker-wide `log.segment_interval` setting",
        check: |v| long(v, 1),
    },
    ConfigDef {
        name: "unclean.leader.election.enable",
        default: "false",
        kind: Kind::Boolean,
        support: Support::AcceptedNoEffect,
        why: "there is never an unclean election: any broker can own a partition without losing a record",
        check: boolean,
    },
];

/// The row of `name`, if Strata accepts it.
pub fn config_def(name: &str) -> Option<&'static ConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

/// `docs/CONFIGS.md`, rendered from the table.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Topic configs\n\n\
         Generated from `crates/log/src/config_table.rs` (a test checks this file matches it;\n\
         run `STRATA_BLESS=1 cargo test -p strata-log config_table` to rewrite it).\n\n\
         Every topic config Strata accepts. Any other name is refused with INVALID_CONFIG,\n\
         as Kafka refuses an unknown config. *Accepted, no effect*: the value is validated as\n\
         Kafka validates it, stored and described, and changes nothing — it is about local\n\
         segment files or follower replicas, which Strata does not have. *Refused unless\n\
         default*: any other value is INVALID_CONFIG, because Strata cannot do what Kafka\n\
         would do with it.\n\n\
         | config | default | support | why |\n|---|---|---|---|\n",
    );
    for d in TOPIC_CONFIGS {
        let default = if d.default.is_empty() {
            "(empty)".to_string()
        } else {
            format!("`{}`", d.default)
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            d.name,
            default,
            d.support.label(),
            d.why
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_sorted_unique_and_their_defaults_pass_their_own_check() {
        for pair in TOPIC_CONFIGS.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} before {}",
                pair[0].name,
                pair[1].name
            );
        }
        for d in TOPIC_CONFIGS {
            assert_eq!((d.check)(d.default), Ok(()), "{}", d.name);
        }
    }

    #[test]
    fn refused_rows_refuse_what_strata_cannot_do() {
        let check = |name: &str, value: &str| (config_def(name).unwrap().check)(value);
        assert!(check("compression.type", "zstd").is_err());
        assert!(check("cleanup.policy", "compact").is_ok());
        assert!(check("cleanup.policy", "compact,delete").is_ok());
        assert!(check("cleanup.policy", "shred").is_err());
        assert!(check("min.cleanable.dirty.ratio", "1.01").is_err());
        // Accepted either way: tiering is the broker's `wal_storage`, not a topic's choice.
        assert!(check("remote.storage.enable", "true").is_ok());
        assert!(check("remote.storage.enable", "false").is_ok());
        assert!(check("remote.storage.enable", "maybe").is_err());
        assert!(check("min.insync.replicas", "0").is_err());
        assert!(check("min.insync.replicas", "2").is_ok());
        assert!(check("segment.bytes", "13").is_err());
        assert!(check("unclean.leader.election.enable", "maybe").is_err());
        assert!(check("leader.replication.throttled.replicas", "0:1,1:2").is_ok());
        assert!(check("leader.replication.throttled.replicas", "zero").is_err());
        assert!(config_def("segment.bytes.typo").is_none());
    }

    #[test]
    fn the_docs_are_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CONFIGS.md");
        let rendered = markdown();
        if std::env::var_os("STRATA_BLESS").is_some() {
            std::fs::write(path, &rendered).unwrap();
        }
        let written = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            written == rendered,
            "docs/CONFIGS.md is not the table; STRATA_BLESS=1 cargo test -p strata-log config_table rewrites it"
        );
    }
}
