//! What the broker needs to know about itself. Filled by the server from its configuration file;
//! every bounded resource is named here with what happens at its limit.

use std::time::Duration;

use strata_core::BrokerId;
use strata_groups::GroupConfig;

use crate::fetch_sessions::FetchSessionLimits;

/// Settings of the Kafka front end.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    /// This broker's id, as clients see it in Metadata.
    pub node_id: BrokerId,
    /// The host clients are told to connect to.
    pub advertised_host: String,
    /// The port clients are told to connect to.
    pub advertised_port: u16,
    /// The cluster id reported in Metadata and DescribeCluster.
    pub cluster_id: String,
    /// Largest request frame accepted (Kafka's `socket.request.max.bytes`). Checked against the
    /// frame's length prefix before any of it is buffered; a larger frame closes the connection,
    /// as Kafka does.
    pub max_request_bytes: usize,
    /// Connections served at once. At the limit the broker stops accepting: further connections
    /// wait in the kernel's listen backlog until a slot frees (and are refused by the kernel or
    /// time out on the client side if the backlog fills).
    pub max_connections: usize,
    /// Connections open at once from one client address (Kafka's `max.connections.per.ip`).
    /// A connection beyond it is closed as soon as it is accepted, so one client cannot take
    /// every slot of `max_connections`.
    pub max_connections_per_ip: usize,
    /// A connection with no request in progress and nothing received for this long is closed
    /// (Kafka's `connections.max.idle.ms`), so idle clients give their slot back.
    pub connections_max_idle: Duration,
    /// Once the first byte of a request has arrived, the whole request must arrive within this
    /// long, or the connection is closed: a client trickling bytes (slow-loris) holds a slot
    /// and buffer for at most this long. Time spent waiting for `queued_max_request_bytes` does
    /// not count against the client.
    pub request_read_timeout: Duration,
    /// Memory for requests being received and decoded, broker-wide (Kafka's
    /// `queued.max.request.bytes`). A request is charged when its size prefix arrives, before
    /// any of its body is buffered; at the limit the broker stops reading from that socket until
    /// earlier requests finish and free their charge. Requests other than Produce are charged
    /// [`crate::limits::DECODE_EXPANSION`] times their size (decoding small entries into owned
    /// structures and answering each costs that much); a Produce its size plus
    /// [`crate::limits::PRODUCE_PARTITION_COST`] per partition. A request whose charge exceeds
    /// the whole budget can never be served and closes its connection.
    pub queued_max_request_bytes: usize,
    /// Topics one request (Metadata or Produce) may auto-create. Further unknown topics in the
    /// request are answered LEADER_NOT_AVAILABLE (retriable: the client asks again and they
    /// are created then).
    pub auto_create_topics_per_request: usize,
    /// Topics auto-created per second, broker-wide (bursts of up to one second's worth).
    /// Beyond it unknown topics are answered LEADER_NOT_AVAILABLE, as above.
    pub auto_create_topics_per_second: u32,
    /// Requests of one connection processed at once (Kafka clients pipeline). At the limit the
    /// broker stops reading that connection until the oldest request has been answered, which
    /// pushes back on the client through TCP.
    pub max_inflight_requests_per_connection: usize,
    /// Partitions one DescribeTopicPartitions answer describes at most (Kafka's
    /// `max.request.partition.size.limit`); a client asking for more (its
    /// `response_partition_limit`) gets this many and a cursor to ask for the rest, so one
    /// request cannot make the broker build an answer of every partition of every topic.
    pub max_request_partition_size_limit: usize,
    /// What DescribeConfigs reports as `listeners`: the address the Kafka listener is bound
    /// to, as Kafka spells it (`PLAINTEXT://host:port`). Descriptive only.
    pub listeners: String,
    /// What DescribeLogDirs names the one log directory: the storage location without
    /// credentials (a path, or `s3://bucket/prefix`). Descriptive only.
    pub log_dir: String,
    /// Whether Metadata (and Produce) may create unknown topics (`auto.create.topics.enable`).
    pub auto_create_topics: bool,
    /// `default.replication.factor`: the factor of topics created with -1 or auto-created.
    /// Strata keeps one copy in storage whatever it is; it sets how many live brokers
    /// Metadata lists as a partition's replicas. CreateTopics refuses a factor larger than
    /// the live brokers (INVALID_REPLICATION_FACTOR), as Kafka does.
    pub default_replication_factor: i16,
    /// Floor for a produce's durability wait: a client timeout of 0 (or a tiny one) would fail
    /// appends that are about to land, and the retry would duplicate them.
    pub min_produce_timeout: Duration,
    /// After shutdown starts, how long to wait for connections to finish their in-flight
    /// requests before giving up on them.
    pub shutdown_grace: Duration,
    /// Partitions of the internal `__consumer_offsets` topic, used only when this broker
    /// creates it (an existing topic keeps its count: groups are placed by hashing their id
    /// over it, so changing it would orphan them). Each is one coordinator shard, replayed from
    /// its start when the broker starts, so more shards cost startup time, not throughput.
    pub group_shards: i32,
    /// Partitions of the internal `__transaction_state` topic (Kafka's
    /// `transaction.state.log.num.partitions`), used only when this broker creates it: one
    /// transaction coordinator shard each, placed by hashing the transactional id.
    pub txn_shards: i32,
    /// `transaction.max.timeout.ms`: InitProducerId asking for a longer transaction timeout is
    /// refused with INVALID_TRANSACTION_TIMEOUT. Bounds how long an abandoned transaction
    /// holds back read_committed consumers.
    pub transaction_max_timeout: Duration,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how often each shard
    /// looks for transactions past their timeout (and idle ids past expiry).
    pub transaction_abort_timed_out_interval: Duration,
    /// `transactional.id.expiration.ms`: a transactional id with no transaction for this long
    /// is forgotten (a tombstone in its shard), bounding coordinator memory.
    pub transactional_id_expiration: Duration,
    /// `group.max.size` (and `group.consumer.max.size`): members one group may hold, classic or
    /// KIP-848; joins beyond it get GROUP_MAX_SIZE_REACHED. Each member is coordinator memory
    /// and a share of every rebalance's work.
    pub group_max_size: usize,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an empty group waits
    /// for more members before completing.
    pub group_initial_rebalance_delay: Duration,
    /// `group.min.session.timeout.ms`: JoinGroups asking for a shorter session are refused
    /// (INVALID_SESSION_TIMEOUT).
    pub group_min_session_timeout: Duration,
    /// `group.max.session.timeout.ms`: JoinGroups asking for a longer session are refused
    /// (INVALID_SESSION_TIMEOUT).
    pub group_max_session_timeout: Duration,
    /// How long a write of the group log may wait to become durable (see
    /// `GroupConfig::offsets_commit_timeout`).
    pub offsets_commit_timeout: Duration,
    /// How long a transaction marker (WriteTxnMarkers) may wait to become durable before its
    /// partition is answered REQUEST_TIMED_OUT (the coordinator retries it); Kafka bounds it
    /// by `request.timeout.ms`, whose default this is.
    pub txn_marker_timeout: Duration,
    /// The listener brokers send each other requests on (transaction markers, KIP-890
    /// verification): Kafka's `inter.broker.listener.name`. None: the first PLAINTEXT
    /// listener, or else the first one this broker can use (see `txn_markers`).
    pub inter_broker_listener_name: Option<String>,
    /// The login brokers use on a SASL_PLAINTEXT or SASL_SSL inter-broker listener. Its
    /// principal needs CLUSTER_ACTION on the cluster (or to be a super user) under an ACL
    /// authorizer, as Kafka's broker principal does.
    pub inter_broker_sasl: Option<strata_client::SaslCredentials>,
    /// The TLS client side brokers use on an SSL or SASL_SSL inter-broker listener: the
    /// broker's truststore (else the system's) and its own certificate, as Kafka's broker uses
    /// its keystore and truststore for its own connections. None without TLS settings.
    pub inter_broker_tls: Option<strata_client::Tls>,
    /// KIP-848 member session timeout (`GroupConfig::consumer_session_timeout`).
    pub group_consumer_session_timeout: Duration,
    /// KIP-848 heartbeat interval (`GroupConfig::consumer_heartbeat_interval`).
    pub group_consumer_heartbeat_interval: Duration,
    /// `group.consumer.migration.policy` (`GroupConfig::consumer_migration_policy`).
    pub group_consumer_migration_policy: strata_groups::MigrationPolicy,
    /// Share groups (KIP-932): `group.share.session.timeout.ms`, a member silent this long is
    /// removed.
    pub group_share_session_timeout: Duration,
    /// `group.share.heartbeat.interval.ms`: how often share members are told to heartbeat.
    pub group_share_heartbeat_interval: Duration,
    /// `group.share.max.groups`: share groups one coordinator hosts (each is memory and a
    /// share partition per partition it reads); beyond, a join gets GROUP_MAX_SIZE_REACHED.
    pub group_share_max_groups: usize,
    /// `group.share.max.size`: members of one share group (GROUP_MAX_SIZE_REACHED beyond).
    pub group_share_max_size: usize,
    /// `group.share.record.lock.duration.ms`: how long a member holds the records it acquired
    /// before they are offered to others again.
    pub group_share_record_lock_duration: Duration,
    /// `group.share.delivery.count.limit`: deliveries after which a released or expired
    /// record is archived (a poison record stops coming back).
    pub group_share_delivery_count_limit: u16,
    /// `group.share.partition.max.record.locks`: records in flight per share partition; the
    /// bound of its memory and of its stored snapshot.
    pub group_share_partition_max_record_locks: usize,
    /// `group.share.max.share.sessions`: share sessions kept at once; beyond (after dropping
    /// sessions idle for a member session) a new one gets SHARE_SESSION_LIMIT_REACHED.
    pub group_share_max_share_sessions: usize,
    /// Share partitions (share group × partition) held in memory on this broker; idle ones
    /// (nothing acquired, everything stored) are dropped to make room, and when none is idle
    /// the fetch gets LEADER_NOT_AVAILABLE. Strata's bound; Kafka has none.
    pub group_share_max_partitions: usize,
    /// `share.auto.offset.reset` for every share group (Kafka's group config; Strata has no
    /// group configs yet, so it is a broker setting): where a share partition with no stored
    /// state starts.
    pub share_auto_offset_reset: crate::share::ShareAutoOffsetReset,
    /// Fetch sessions kept at once (Kafka's `max.incremental.fetch.session.cache.slots`).
    /// When every slot is taken, a full fetch asking for a session evicts one as Kafka does
    /// (see `min_incremental_fetch_session_eviction`) or gets none: that client keeps sending
    /// full fetches, which works, only costs more. 0 turns sessions off.
    pub max_incremental_fetch_session_cache_slots: usize,
    /// Partitions kept over all fetch sessions (about 150 bytes each). A session grows with
    /// every incremental fetch that adds partitions; one that would pass this is closed
    /// (FETCH_SESSION_ID_NOT_FOUND, the client goes back to full fetches), and a full fetch
    /// that does not fit gets no session.
    pub max_incremental_fetch_session_partitions: usize,
    /// Kafka's `min.incremental.fetch.session.eviction.ms`: a session unused this long may be
    /// evicted for any new session, and one that had existed this long when last used may be
    /// evicted for a new session of more partitions. Younger sessions are never evicted.
    pub min_incremental_fetch_session_eviction: Duration,
    /// SASL mechanisms offered on SASL listeners (Kafka's `sasl.enabled.mechanisms`), a
    /// subset of PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; a handshake naming another is
    /// refused with UNSUPPORTED_SASL_MECHANISM and this list.
    pub sasl_enabled_mechanisms: Vec<String>,
    /// A connection on a TLS or SASL listener must finish its TLS handshake and SASL exchange
    /// within this long of being accepted, or it is closed: an unauthenticated client holds
    /// a connection slot for at most this long, whatever it sends (ApiVersions included).
    pub authentication_timeout: Duration,
    /// How long a broker trusts the SCRAM users it read from storage: a user created,
    /// changed or deleted through another broker is seen here within about this long.
    pub sasl_user_cache_ttl: Duration,
    /// Users (known or not) remembered by the cache at most. Each login of a name not in the
    /// cache costs one storage read; made-up names past this bound flush the cache instead of
    /// growing it.
    pub sasl_user_cache_entries: usize,
    /// Kafka's `connections.max.reauth.ms` (KIP-368): a SASL login lasts this long (or until
    /// its OAUTHBEARER token expires, if sooner), is told to the client in SaslAuthenticate
    /// v1+, and the client must log in again on the same connection before it ends, or its
    /// next request closes the connection. Zero (the default, as Kafka's) turns it off.
    pub connections_max_reauth: Duration,
    /// The ACL authorizer (`authorizer = acl`): None (`authorizer = none`) lets every client
    /// do everything, as a Kafka broker without an authorizer; Some enforces the ACLs kept in
    /// storage with these super users and this rule for resources without ACLs.
    pub authorizer: Option<crate::security::acl::AuthorizerConfig>,
    /// How often a broker looks for ACL changes made through any broker: a change is enforced
    /// everywhere within about this long. Each look is one small read of the change marker
    /// (`security/acls-changes`); a change costs a listing and one read per resource with ACLs.
    pub acl_refresh_interval: Duration,
    /// Client quotas are measured over this many samples (Kafka's `quota.window.num`)...
    pub quota_window_num: usize,
    /// ... of this long each (Kafka's `quota.window.size.seconds`): a client's rate is its
    /// usage over the last `quota_window_num` windows, and a throttle makes up for the excess
    /// over that span.
    pub quota_window_size: Duration,
    /// The longest one response is throttled (and its connection muted), however far over
    /// its quota a client went: a single huge request then costs its client at most this
    /// long, and the rest of the excess is worked off on later requests.
    pub quota_max_throttle: Duration,
    /// Users and client ids under a quota whose usage a broker tracks at once. Client ids are
    /// the client's choice: beyond this, buckets idle for a whole quota window are dropped,
    /// then the least recently used one (which restarts from zero).
    pub quota_max_tracked: usize,
    /// How often every broker reads the quota change marker in storage: a quota changed
    /// through any broker is enforced everywhere within about this long (one small read per
    /// interval when nothing changes).
    pub quota_refresh_interval: Duration,
    /// Cluster mode: None serves every partition here (a broker alone on its storage); Some
    /// makes this broker one member of a cluster sharing the storage (see [`crate::cluster`]).
    pub cluster: Option<ClusterSettings>,
}

/// Timing of cluster membership and ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterSettings {
    /// A broker whose heartbeat did not move for this long is dead and its partitions are
    /// taken over: the failover time is about this plus one heartbeat interval.
    pub lease_period: Duration,
    /// How often this broker proves it is alive (and re-reads who else is).
    pub heartbeat_interval: Duration,
    /// How often ownership records are re-read, by the ownership runner (claims and handovers
    /// wait for it) and for Metadata answers. Two rounds bound a graceful handover.
    pub ownership_interval: Duration,
    /// How often the ownership runner looks for moves between its full rounds (see
    /// `OwnershipRunner::watch`): the old owner starts handing over, and the target claims
    /// after the release, within about this long instead of a full `ownership_interval` each.
    /// Costs one small read (the `cluster/placement-changes` marker) per period, whatever the
    /// number of partitions and overrides, plus a read of each record awaited from a
    /// handing-over owner. Zero turns it off: a move started through another broker then
    /// waits for up to two `ownership_interval`s (one started here runs a round at once).
    pub move_watch_interval: Duration,
    /// Spread partitions over live brokers by hashing, moving some to a broker that joins.
    /// Off: partitions stay with their live owner unless moved explicitly (failover and
    /// draining still move them).
    pub auto_rebalance: bool,
    /// How long Metadata keeps listing a broker that left the cluster (crashed, or shut
    /// down), as a broker that owns nothing. librdkafka destroys a broker object that Metadata
    /// stops listing, and a transactional producer whose cached group coordinator was that
    /// broker then waits forever in send_offsets_to_transaction: its coordinator request is
    /// only retried on a state change of that broker, which no longer has any (librdkafka
    /// issues 5456 and 5511). Kept listed, the broker's failed reconnects re-run the lookup,
    /// which finds the new coordinator. The default, 15 minutes, is librdkafka's
    /// `metadata.max.age.ms`, after which its coordinator cache forgets an entry left unused.
    /// Zero lists live brokers only, as Kafka does.
    pub departed_broker_listing: Duration,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            lease_period: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(1),
            ownership_interval: Duration::from_millis(250),
            move_watch_interval: Duration::from_millis(10),
            auto_rebalance: true,
            departed_broker_listing: Duration::from_secs(15 * 60),
        }
    }
}

impl BrokerSettings {
    /// The fetch session cache's bounds.
    pub(crate) fn fetch_session_limits(&self) -> FetchSessionLimits {
        FetchSessionLimits {
            slots: self.max_incremental_fetch_session_cache_slots,
            max_partitions: self.max_incremental_fetch_session_partitions,
            eviction_after: self.min_incremental_fetch_session_eviction,
        }
    }

    /// How quotas are measured and bounded.
    pub(crate) fn quota_settings(&self) -> crate::quotas::QuotaSettings {
        crate::quotas::QuotaSettings {
            window: crate::quotas::Window {
                samples: self.quota_window_num,
                size: self.quota_window_size,
            },
            max_throttle: self.quota_max_throttle,
            max_tracked: self.quota_max_tracked,
            refresh_interval: self.quota_refresh_interval,
        }
    }

    /// The share groups' settings.
    pub fn share_settings(&self) -> crate::share::ShareSettings {
        crate::share::ShareSettings {
            groups: strata_groups::share::ShareGroupConfig {
                session_timeout: self.group_share_session_timeout,
                heartbeat_interval: self.group_share_heartbeat_interval,
                max_size: self.group_share_max_size,
                max_groups: self.group_share_max_groups,
            },
            limits: strata_groups::share_partition::ShareLimits {
                max_record_locks: self.group_share_partition_max_record_locks,
                lock_duration: self.group_share_record_lock_duration,
                delivery_count_limit: self.group_share_delivery_count_limit,
            },
            auto_offset_reset: self.share_auto_offset_reset,
            max_share_sessions: self.group_share_max_share_sessions,
            max_share_partitions: self.group_share_max_partitions,
        }
    }

    /// The group coordinator's configuration: the settings above over Kafka's defaults.
    pub fn txn_config(&self) -> strata_txn::TxnConfig {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        strata_txn::TxnConfig {
            max_timeout_ms: ms(self.transaction_max_timeout),
            expiration_ms: ms(self.transactional_id_expiration),
            abort_check_interval_ms: ms(self.transaction_abort_timed_out_interval).max(1),
        }
    }

    pub fn group_config(&self) -> GroupConfig {
        GroupConfig {
            min_session_timeout: self.group_min_session_timeout,
            max_session_timeout: self.group_max_session_timeout,
            initial_rebalance_delay: self.group_initial_rebalance_delay,
            max_group_size: self.group_max_size,
            offsets_commit_timeout: self.offsets_commit_timeout,
            consumer_session_timeout: self.group_consumer_session_timeout,
            consumer_heartbeat_interval: self.group_consumer_heartbeat_interval,
            consumer_migration_policy: self.group_consumer_migration_policy,
            ..GroupConfig::default()
        }
    }
}

impl Default for BrokerSettings {
    fn default() -> Self {
        let groups = GroupConfig::default();
        Self {
            node_id: BrokerId(0),
            advertised_host: "127.0.0.1".to_string(),
            advertised_port: 9092,
            cluster_id: "strata".to_string(),
            max_request_bytes: 100 << 20,
            max_connections: 4096,
            // Kafka's default is unlimited; a quarter of the slots leaves room for three more
            // clients even when one misbehaves.
            max_connections_per_ip: 1024,
            connections_max_idle: Duration::from_secs(600),
            request_read_timeout: Duration::from_secs(30),
            // Twice the default largest request (so one always fits, with room for others).
            queued_max_request_bytes: 256 << 20,
            auto_create_topics_per_request: 100,
            auto_create_topics_per_second: 100,
            max_inflight_requests_per_connection: 1024,
            // Kafka's default.
            max_request_partition_size_limit: 2000,
            listeners: "PLAINTEXT://127.0.0.1:9092".to_string(),
            log_dir: "memory://".to_string(),
            auto_create_topics: true,
            default_replication_factor: 1,
            min_produce_timeout: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            // Kafka uses 50; every shard is a partition replayed at startup, and one broker
            // rarely hosts enough groups to need more than a handful.
            group_shards: 8,
            // Same reasoning as group_shards (Kafka uses 50).
            txn_shards: 8,
            // Kafka's defaults.
            transaction_max_timeout: Duration::from_secs(15 * 60),
            transaction_abort_timed_out_interval: Duration::from_secs(10),
            transactional_id_expiration: Duration::from_secs(7 * 24 * 3600),
            // Kafka leaves groups unbounded; no real workload comes near ten thousand members,
            // and a bound keeps one client from growing the coordinator without end.
            group_max_size: 10_000,
            group_initial_rebalance_delay: groups.initial_rebalance_delay,
            group_min_session_timeout: groups.min_session_timeout,
            group_max_session_timeout: groups.max_session_timeout,
            offsets_commit_timeout: groups.offsets_commit_timeout,
            txn_marker_timeout: Duration::from_secs(30),
            inter_broker_listener_name: None,
            inter_broker_sasl: None,
            inter_broker_tls: None,
            group_consumer_session_timeout: groups.consumer_session_timeout,
            group_consumer_heartbeat_interval: groups.consumer_heartbeat_interval,
            group_consumer_migration_policy: groups.consumer_migration_policy,
            group_share_session_timeout: Duration::from_secs(45),
            group_share_heartbeat_interval: Duration::from_secs(5),
            group_share_max_groups: 10,
            group_share_max_size: 200,
            group_share_record_lock_duration: Duration::from_secs(30),
            group_share_delivery_count_limit: 5,
            group_share_partition_max_record_locks: 2000,
            group_share_max_share_sessions: 2000,
            // At most 2000 records of ~100 bytes of state each: about 200 MB at the most.
            group_share_max_partitions: 1000,
            share_auto_offset_reset: crate::share::ShareAutoOffsetReset::Latest,
            max_incremental_fetch_session_cache_slots: 1000,
            // A thousand sessions of a thousand partitions: about 150 MB at the most.
            max_incremental_fetch_session_partitions: 1_000_000,
            min_incremental_fetch_session_eviction: Duration::from_secs(120),
            // OAUTHBEARER needs keys to check tokens against: off unless configured.
            sasl_enabled_mechanisms: ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
                .iter()
                .map(|m| m.to_string())
                .collect(),
            authentication_timeout: Duration::from_secs(10),
            sasl_user_cache_ttl: Duration::from_secs(1),
            sasl_user_cache_entries: 10_000,
            connections_max_reauth: Duration::ZERO,
            authorizer: None,
            acl_refresh_interval: Duration::from_secs(1),
            // Kafka's defaults.
            quota_window_num: 11,
            quota_window_size: Duration::from_secs(1),
            // The rate's shortest span (window_num - 1 windows): a throttle longer than that
            // would make up for more than the rate can have measured.
            quota_max_throttle: Duration::from_secs(10),
            quota_max_tracked: 10_000,
            quota_refresh_interval: Duration::from_secs(1),
            cluster: None,
        }
    }
}
