//! The coordinator's tunables, named after the Kafka broker settings they mirror so operators
//! can carry their Kafka knowledge over unchanged.

use std::time::Duration;

/// Settings of the classic group coordinator. Defaults are Kafka's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// `group.min.session.timeout.ms`: joins asking for a shorter session get
    /// INVALID_SESSION_TIMEOUT, so a client cannot make the coordinator expire it on every blip.
    pub min_session_timeout: Duration,
    /// `group.max.session.timeout.ms`: joins asking for a longer session get
    /// INVALID_SESSION_TIMEOUT, bounding how long a dead member can hold partitions.
    pub max_session_timeout: Duration,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an Empty group waits
    /// for more members, extended by the same amount while new members keep arriving (bounded by
    /// the rebalance timeout). Zero completes the first rebalance as soon as a timer can fire.
    pub initial_rebalance_delay: Duration,
    /// `group.max.size`: joins beyond it get GROUP_MAX_SIZE_REACHED.
    pub max_group_size: usize,
    /// How long a brand-new member's JoinGroup may stay parked before the member is dropped. New
    /// members cannot heartbeat (they have no member id yet), and a client that timed out and
    /// retried would otherwise leave a defunct member in every rebalance. Kafka hard-codes 5 min.
    pub new_member_join_timeout: Duration,
    /// `offset.metadata.max.bytes`: longer commit metadata gets OFFSET_METADATA_TOO_LARGE.
    pub offset_metadata_max_bytes: usize,
    /// `offsets.commit.timeout.ms`: how long a write of the group log (a commit, a rebalance's
    /// state) may wait to become durable before the request fails with
    /// COORDINATOR_NOT_AVAILABLE and the client retries. Kafka's 5 s waits on replicas; ours
    /// waits on the storage, so it gets more.
    pub offsets_commit_timeout: Duration,
    /// `group.consumer.session.timeout.ms`: a KIP-848 consumer-group member that has not
    /// heartbeated for this long is removed and its partitions reassigned. The broker decides
    /// it for every member (the client does not choose it in this protocol).
    pub consumer_session_timeout: Duration,
    /// `group.consumer.heartbeat.interval.ms`: how often KIP-848 members are told to heartbeat.
    pub consumer_heartbeat_interval: Duration,
    /// `group.consumer.migration.policy`: whether a live group may change protocol.
    pub consumer_migration_policy: MigrationPolicy,
}

/// Kafka's `group.consumer.migration.policy`. Classic-protocol members may always join a
/// consumer group that has members; the policy decides whether a live group is *converted*:
/// a classic group to a consumer group when a consumer-protocol member joins it (upgrade), and
/// a consumer group back to a classic one when its last consumer-protocol member leaves and
/// only classic members remain (downgrade). Kafka 4's default is both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigrationPolicy {
    #[default]
    Bidirectional,
    Upgrade,
    Downgrade,
    Disabled,
}

impl MigrationPolicy {
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "bidirectional" => Some(Self::Bidirectional),
            "upgrade" => Some(Self::Upgrade),
            "downgrade" => Some(Self::Downgrade),
            "disabled" => Some(Self::Disabled),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bidirectional => "bidirectional",
            Self::Upgrade => "upgrade",
            Self::Downgrade => "downgrade",
            Self::Disabled => "disabled",
        }
    }

    pub fn upgrades(self) -> bool {
        matches!(self, Self::Bidirectional | Self::Upgrade)
    }

    pub fn downgrades(self) -> bool {
        matches!(self, Self::Bidirectional | Self::Downgrade)
    }
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            min_session_timeout: Duration::from_millis(6_000),
            max_session_timeout: Duration::from_millis(1_800_000),
            initial_rebalance_delay: Duration::from_millis(3_000),
            max_group_size: i32::MAX as usize,
            new_member_join_timeout: Duration::from_millis(300_000),
            offset_metadata_max_bytes: 4096,
            offsets_commit_timeout: Duration::from_secs(30),
            consumer_session_timeout: Duration::from_millis(45_000),
            consumer_heartbeat_interval: Duration::from_millis(5_000),
            consumer_migration_policy: MigrationPolicy::default(),
        }
    }
}
