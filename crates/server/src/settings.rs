//! The server's settings: defaults, overridden by the TOML file, then by `STRATA_*` environment
//! variables, then by command-line flags. Unknown keys are rejected with the key's name; bad
//! values are reported with the key (or variable) they came from.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use strata_log::LogConfig;
use strata_storage::RequestPrices;

/// `metrics_listen`: an address, or a bare port (`9100`, `:9100`) for loopback only.
fn loopback_unless_told<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let port = text.strip_prefix(':').unwrap_or(&text);
    if let Ok(port) = port.parse::<u16>() {
        return Ok(Some(SocketAddr::from(([127, 0, 0, 1], port))));
    }
    text.parse()
        .map(Some)
        .map_err(|_| de::Error::custom(format!("{text:?} is not host:port or a port")))
}

/// Everything `strata serve` can be configured with. Field docs are the reference: `strata.toml`
/// uses these names, environment variables are `STRATA_` + the upper-cased name (`STRATA_LOG_` +
/// name for the `[log]` section).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Address the Kafka listener binds. Port 0 picks a free port (reported in the log).
    pub listen: SocketAddr,
    /// `host:port` clients are told to connect to. Default: the listen address (with the
    /// machine's host name if it listens on all interfaces) and the bound port.
    pub advertised_listener: Option<String>,
    /// Kafka-style named listeners, `NAME://host:port` separated by commas (for example
    /// `PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094`); each name's security protocol
    /// comes from `listener_security_protocol_map`. Unset (the default): one PLAINTEXT
    /// listener on `listen`, advertised as `advertised_listener`. Set, it replaces both.
    pub listeners: Option<String>,
    /// `NAME://host:port` clients who came in on listener NAME are told to connect to, for
    /// some or all of `listeners`. A listener not named here advertises its bound address.
    pub advertised_listeners: Option<String>,
    /// `NAME:PROTOCOL` pairs giving each listener its security protocol: PLAINTEXT, SSL,
    /// SASL_PLAINTEXT or SASL_SSL [default: each protocol's name maps to itself].
    pub listener_security_protocol_map: String,
    /// SASL mechanisms offered on SASL listeners, comma-separated: any of PLAIN,
    /// SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER [default: PLAIN,SCRAM-SHA-256,SCRAM-SHA-512].
    pub sasl_enabled_mechanisms: String,
    /// PEM file with the certificate chain (leaf first) of SSL and SASL_SSL listeners.
    /// Read at start-up; a renewed certificate takes a restart.
    pub ssl_certificate: Option<std::path::PathBuf>,
    /// PEM file with the private key of `ssl_certificate` (PKCS#8, PKCS#1 or SEC1).
    pub ssl_key: Option<std::path::PathBuf>,
    /// Kafka's `ssl.client.auth`: whether SSL and SASL_SSL listeners ask clients for a
    /// certificate, `none`, `requested` or `required`, for every TLS listener, or
    /// `NAME:MODE` pairs per listener (listeners not named: `none`) [default: none].
    pub ssl_client_auth: String,
    /// PEM file with the CA certificates client certificates must chain to; needed when
    /// `ssl_client_auth` is not `none`.
    pub ssl_truststore: Option<std::path::PathBuf>,
    /// Kafka's `ssl.principal.mapping.rules`: how a client certificate's subject (RFC 2253,
    /// `CN=alice,OU=eng,O=Acme`) becomes the principal `User:<name>` on an SSL listener,
    /// `RULE:pattern/replacement/[LU]` and `DEFAULT`, comma-separated [default: DEFAULT].
    pub ssl_principal_mapping_rules: String,
    /// How often `ssl_certificate`, `ssl_key` and `ssl_truststore` are read again: changed
    /// files are served to new connections (open ones keep theirs); files that do not load
    /// are logged and the previous ones kept.
    #[serde(with = "humantime_serde")]
    pub ssl_reload_interval: Duration,
    /// JSON Web Key Set file (`{"keys": [...]}`) with the public keys OAUTHBEARER tokens are
    /// checked against (RSA and EC P-256/P-384); needed when `sasl_enabled_mechanisms` names
    /// OAUTHBEARER. Read at start-up.
    pub sasl_oauthbearer_jwks_file: Option<std::path::PathBuf>,
    /// The `iss` OAUTHBEARER tokens must carry (Kafka's `sasl.oauthbearer.expected.issuer`);
    /// unset: not checked.
    pub sasl_oauthbearer_expected_issuer: Option<String>,
    /// Audiences, comma-separated, one of which an OAUTHBEARER token's `aud` must name (Kafka's
    /// `sasl.oauthbearer.expected.audience`) [default: empty, not checked].
    pub sasl_oauthbearer_expected_audience: String,
    /// Slack allowed when checking an OAUTHBEARER token's `exp`, `nbf` and `iat` against the
    /// broker's clock (Kafka's `sasl.oauthbearer.clock.skew.seconds`).
    #[serde(with = "humantime_serde")]
    pub sasl_oauthbearer_clock_skew: Duration,
    /// The token claim naming the principal `User:<value>` (Kafka's
    /// `sasl.oauthbearer.sub.claim.name`) [default: sub].
    pub sasl_oauthbearer_sub_claim_name: String,
    /// A connection on an SSL or SASL listener must finish its TLS handshake and SASL login
    /// within this long of being accepted, or it is closed: an unauthenticated client holds a
    /// connection slot no longer than this.
    #[serde(with = "humantime_serde")]
    pub authentication_timeout: Duration,
    /// How long a broker trusts the SCRAM users it read from storage: a user created, changed
    /// or deleted through any broker (or `strata users`) is seen by all within about this.
    #[serde(with = "humantime_serde")]
    pub sasl_user_cache_ttl: Duration,
    /// Users (known or not) the cache holds at most; a flood of made-up names flushes it
    /// rather than growing it.
    pub sasl_user_cache_entries: usize,
    /// Kafka's `connections.max.reauth.ms` (KIP-368): how long a SASL login lasts (or until
    /// its OAUTHBEARER token expires, if sooner); clients that support it (SaslAuthenticate
    /// v1+) log in again on the same connection before then, and a connection whose session
    /// ended is closed on its next request. 0s (the default, as Kafka's) turns it off.
    #[serde(with = "humantime_serde")]
    pub connections_max_reauth: Duration,
    /// `none` (the default): no authorization, every client may do everything, as a Kafka
    /// broker without an authorizer. `acl`: the ACLs in storage decide (CreateAcls,
    /// `strata acls`); without ACLs only `super_users` may do anything.
    pub authorizer: String,
    /// Principals allowed everything whatever the ACLs say, `;`-separated (Kafka's
    /// `super.users`), e.g. `User:admin;User:ops` [default: none].
    pub super_users: String,
    /// With `authorizer = acl`: allow an operation on a resource that no ACL names (Kafka's
    /// `allow.everyone.if.no.acl.found`) [default: false: refuse it].
    pub allow_everyone_if_no_acl_found: bool,
    /// How often a broker looks for ACL changes made through any broker, so that a change is
    /// enforced everywhere within about this long; each look is one small storage read.
    #[serde(with = "humantime_serde")]
    pub acl_refresh_interval: Duration,
    /// Client quotas are measured over this many samples (Kafka's `quota.window.num`)...
    pub quota_window_num: usize,
    /// ...of this long each (Kafka's `quota.window.size.seconds`).
    #[serde(with = "humantime_serde")]
    pub quota_window_size: Duration,
    /// The longest one response over a quota is throttled (its connection muted).
    #[serde(with = "humantime_serde")]
    pub quota_max_throttle: Duration,
    /// Users and client ids under a quota whose usage a broker tracks at once (client ids
    /// are the client's choice); beyond it the least recently used bucket starts over.
    pub quota_max_tracked: usize,
    /// How often each broker reads the quota change marker: a quota altered anywhere is
    /// enforced everywhere within about this long.
    #[serde(with = "humantime_serde")]
    pub quota_refresh_interval: Duration,
    /// This broker's id, as clients see it. Unset in cluster mode: the cluster allocates one
    /// (from 1001 up, a crashed predecessor's on this machine first), so set ids must stay at
    /// or below 1000. Unset without a cluster: 0.
    pub node_id: Option<i32>,
    /// Reported to clients in Metadata and DescribeCluster.
    pub cluster_id: String,
    /// Where all data lives: a directory path, `file:///abs/path`, or `memory://` (lost on exit,
    /// so refused unless `ephemeral_storage_ok` is set).
    pub storage: String,
    /// A separate write-ahead tier (same URL forms as `storage`): write-ahead objects and the
    /// small objects (manifests, catalog, cluster and security objects) live there, and
    /// acknowledgements wait only for it; `storage` then holds the compacted data alone,
    /// segments and their index chunks (the bulk tier). Unset (the default): `storage` holds everything. In cluster mode it
    /// must be reachable from at least everywhere `storage` is (no local directory for the
    /// write-ahead tier over S3 or RADOS bulk storage).
    pub wal_storage: Option<String>,
    /// Allow `memory://` storage. It acknowledges produces (acks=all too) and then loses every
    /// record, offset and topic when the process exits; without this the broker refuses to
    /// start on it rather than promise durability it does not have. For tests and benchmarks.
    pub ephemeral_storage_ok: bool,
    /// Create topics on first use (Kafka's `auto.create.topics.enable`).
    pub auto_create_topics: bool,
    /// Topics one Metadata or Produce request may auto-create (all in one catalog write);
    /// further unknown topics are answered LEADER_NOT_AVAILABLE, and clients ask again.
    pub auto_create_topics_per_request: usize,
    /// Topics auto-created per second, broker-wide (bursts up to one second's worth); beyond it
    /// unknown topics are answered LEADER_NOT_AVAILABLE, and clients ask again.
    pub auto_create_topics_per_second: u32,
    /// Kafka's `default.replication.factor`: the factor of topics created with -1 or
    /// auto-created. The storage keeps the data durable whatever it is; it sets how many live
    /// brokers Metadata lists as replicas. CreateTopics with -1 is refused while fewer brokers
    /// are live. 1 to 32767.
    pub default_replication_factor: i16,
    /// Largest request accepted (Kafka's `socket.request.max.bytes`); larger ones close the
    /// connection.
    pub max_request_bytes: ByteSize,
    /// Client connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Connections open at once from one client address (Kafka's `max.connections.per.ip`);
    /// more are closed as soon as they are accepted.
    pub max_connections_per_ip: usize,
    /// A connection with no request in progress and nothing received for this long is closed
    /// (Kafka's `connections.max.idle.ms`).
    #[serde(with = "humantime_serde")]
    pub connections_max_idle: Duration,
    /// Once a request's first byte has arrived, the whole request must arrive within this
    /// long or the connection is closed (against clients trickling bytes). Time the broker
    /// spends waiting for `queued_max_request_bytes` does not count.
    #[serde(with = "humantime_serde")]
    pub request_read_timeout: Duration,
    /// Memory for requests being received and decoded, broker-wide (Kafka's
    /// `queued.max.request.bytes`). A request is charged when its size arrives, before its body
    /// is buffered: a Produce its size plus 640 bytes per partition, any other request 96 times
    /// its size (what decoding small entries costs). At the limit the broker stops reading
    /// sockets until memory frees; a request that would need more than all of it closes its
    /// connection. Must be at least `max_request_bytes`.
    pub queued_max_request_bytes: ByteSize,
    /// Partitions one DescribeTopicPartitions answer describes at most (Kafka's
    /// `max.request.partition.size.limit`); the client gets a cursor for the rest. At least 1.
    pub max_request_partition_size_limit: usize,
    /// Requests of one connection processed at once before the broker stops reading it.
    pub max_inflight_requests_per_connection: usize,
    /// On SIGINT/SIGTERM, how long to wait for in-flight requests before giving up on them.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Partitions of the internal `__consumer_offsets` topic (one consumer-group coordinator
    /// shard each), applied only when the topic is first created: groups are placed by hashing
    /// their id over the partitions, so an existing topic keeps its count. Every shard is
    /// replayed at startup. Kafka's `offsets.topic.num.partitions` (50 there).
    pub group_shards: i32,
    /// Partitions of the internal `__transaction_state` topic (one transaction coordinator
    /// shard each), applied only when the topic is first created: transactional ids are placed
    /// by hashing over them. Kafka's `transaction.state.log.num.partitions` (50 there).
    pub txn_shards: i32,
    /// Longest transaction timeout a producer may ask for (Kafka's
    /// `transaction.max.timeout.ms`); larger ones are refused with INVALID_TRANSACTION_TIMEOUT.
    #[serde(with = "humantime_serde")]
    pub transaction_max_timeout: Duration,
    /// How often the transaction coordinator aborts transactions open past their timeout
    /// (Kafka's `transaction.abort.timed.out.transaction.cleanup.interval.ms`).
    #[serde(with = "humantime_serde")]
    pub transaction_abort_timed_out_interval: Duration,
    /// How long a transactional id without transactions is remembered (Kafka's
    /// `transactional.id.expiration.ms`).
    #[serde(with = "humantime_serde")]
    pub transactional_id_expiration: Duration,
    /// Members one consumer group may hold, classic or KIP-848 (Kafka's `group.max.size`,
    /// unbounded there); joins beyond it get GROUP_MAX_SIZE_REACHED.
    pub group_max_size: usize,
    /// How long the first rebalance of an empty consumer group waits for more members
    /// (Kafka's `group.initial.rebalance.delay.ms`). "0s" completes it at once.
    #[serde(with = "humantime_serde")]
    pub group_initial_rebalance_delay: Duration,
    /// Shortest session timeout a consumer may ask for (`group.min.session.timeout.ms`).
    #[serde(with = "humantime_serde")]
    pub group_min_session_timeout: Duration,
    /// Longest session timeout a consumer may ask for (`group.max.session.timeout.ms`).
    #[serde(with = "humantime_serde")]
    pub group_max_session_timeout: Duration,
    /// How long a group write (offset commit, rebalance state) may wait to become durable
    /// before the request fails with COORDINATOR_NOT_AVAILABLE (`offsets.commit.timeout.ms`).
    #[serde(with = "humantime_serde")]
    pub offsets_commit_timeout: Duration,
    /// How long a transaction marker (WriteTxnMarkers) may wait to become durable before its
    /// partition is answered REQUEST_TIMED_OUT and the coordinator retries it (Kafka:
    /// `request.timeout.ms`).
    #[serde(with = "humantime_serde")]
    pub txn_marker_timeout: Duration,
    /// KIP-848 consumer groups (`group.protocol=consumer`): a member silent for this long is
    /// removed and its partitions go to the others (`group.consumer.session.timeout.ms`).
    #[serde(with = "humantime_serde")]
    pub group_consumer_session_timeout: Duration,
    /// KIP-848 consumer groups: the heartbeat interval members are told to keep
    /// (`group.consumer.heartbeat.interval.ms`); must be below the session timeout.
    #[serde(with = "humantime_serde")]
    pub group_consumer_heartbeat_interval: Duration,
    /// Whether a live group may change protocol (`group.consumer.migration.policy`):
    /// bidirectional, upgrade, downgrade or disabled.
    pub group_consumer_migration_policy: String,
    /// A share-group (KIP-932) member silent this long is removed (`group.share.session.timeout.ms`).
    #[serde(with = "humantime_serde")]
    pub group_share_session_timeout: Duration,
    /// The heartbeat interval share-group members are told to keep (`group.share.heartbeat.interval.ms`); below the session timeout.
    #[serde(with = "humantime_serde")]
    pub group_share_heartbeat_interval: Duration,
    /// Share groups one coordinator hosts (`group.share.max.groups`); a join of one more gets GROUP_MAX_SIZE_REACHED.
    pub group_share_max_groups: usize,
    /// Members of one share group (`group.share.max.size`); joins beyond get GROUP_MAX_SIZE_REACHED.
    pub group_share_max_size: usize,
    /// How long a share consumer holds records it acquired before they go back to the group (`group.share.record.lock.duration.ms`).
    #[serde(with = "humantime_serde")]
    pub group_share_record_lock_duration: Duration,
    /// Deliveries after which a released or expired record is archived, not offered again (`group.share.delivery.count.limit`).
    pub group_share_delivery_count_limit: u16,
    /// Records in flight per share partition (`group.share.partition.max.record.locks`): bounds its memory and stored state.
    pub group_share_partition_max_record_locks: usize,
    /// Share sessions kept at once (`group.share.max.share.sessions`); beyond, SHARE_SESSION_LIMIT_REACHED.
    pub group_share_max_share_sessions: usize,
    /// Share partitions (share group x partition) held in memory; idle ones are dropped to make room (their state is stored).
    pub group_share_max_partitions: usize,
    /// Where a share group starts on a partition it has no state for: latest or earliest (Kafka's `share.auto.offset.reset` group config, a broker setting here).
    pub share_auto_offset_reset: String,
    /// Incremental fetch sessions (KIP-227) kept at once, each holding what one consumer
    /// fetches so that it need not resend every partition (Kafka's
    /// `max.incremental.fetch.session.cache.slots`). When all are taken a new session evicts
    /// one by Kafka's rule or is not created (the client then sends full fetches). 0 turns
    /// sessions off.
    pub max_incremental_fetch_session_cache_slots: usize,
    /// Partitions kept over all fetch sessions (about 150 bytes each); a session that would
    /// grow past it is closed and its client goes back to full fetches.
    pub max_incremental_fetch_session_partitions: usize,
    /// A fetch session unused this long may be evicted for a new one, and one that existed
    /// this long may be evicted for a larger one (Kafka's
    /// `min.incremental.fetch.session.eviction.ms`).
    #[serde(with = "humantime_serde")]
    pub min_incremental_fetch_session_eviction: Duration,
    /// Address of the HTTP endpoint serving `GET /metrics` (Prometheus text format) and
    /// `GET /health` (200 while storage answers, 503 after 3 failed requests in a row). Unset
    /// (the default) serves neither. Port 0 picks a free port (reported in the log as
    /// `metrics on <address>`). A bare port (`9100` or `:9100`) binds loopback only
    /// (127.0.0.1): serving other hosts takes an explicit address such as `0.0.0.0:9100`.
    #[serde(deserialize_with = "loopback_unless_told")]
    pub metrics_listen: Option<SocketAddr>,
    /// A bearer token `GET /metrics` must present (`Authorization: Bearer <token>`; 401
    /// without). `/health` stays open to orchestrators' probes but, without the token, tells
    /// only `ok` or `storage unhealthy`. Unset (the default): no token. Prefer
    /// `metrics_token_file`, which keeps the token out of the configuration file.
    #[serde(skip_serializing)]
    pub metrics_token: Option<String>,
    /// A file holding `metrics_token` (surrounding whitespace ignored), read at start-up.
    pub metrics_token_file: Option<std::path::PathBuf>,
    /// Address of the web console (pages for the cluster, topics and groups, and actions to
    /// create a topic, move a partition, drain or undrain a broker). Unset (the default): no
    /// console. A bare port binds loopback only. Its data and actions need `metrics_token`
    /// when one is set; beyond loopback a token is required.
    #[serde(deserialize_with = "loopback_unless_told")]
    pub console_listen: Option<SocketAddr>,
    /// Log the console's users in as Kafka users instead of with `metrics_token`: the page
    /// asks for a user name and password, and the console talks to the broker as that user
    /// with this SASL mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) on the first
    /// SASL_PLAINTEXT listener, so the ACLs decide what each user sees and may do (moves and
    /// drains need ALTER on CLUSTER). Unset (the default): the token login.
    pub console_sasl_mechanism: Option<String>,
    /// The listener brokers send each other transaction markers and KIP-890 checks on
    /// (Kafka's `inter.broker.listener.name`): PLAINTEXT, SSL (brokers present `ssl_certificate`
    /// and trust `ssl_truststore`), or SASL_PLAINTEXT / SASL_SSL with `inter_broker_sasl_mechanism`
    /// [default: the first PLAINTEXT listener, else the first of the others the broker can use].
    pub inter_broker_listener_name: Option<String>,
    /// How brokers log in to each other on a SASL_PLAINTEXT or SASL_SSL inter-broker listener:
    /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, as `inter_broker_sasl_username`, with the password in the
    /// environment variable STRATA_INTER_BROKER_SASL_PASSWORD (never in a file or a flag). The
    /// user needs CLUSTER_ACTION on the cluster under `authorizer = acl` [default: none].
    pub inter_broker_sasl_mechanism: Option<String>,
    pub inter_broker_sasl_username: Option<String>,
    /// Connections the HTTP endpoint serves at once. At the limit, the connection that has
    /// waited longest for its request is closed to make room, so idle clients cannot keep a
    /// health check waiting.
    pub metrics_max_connections: usize,
    /// An HTTP client gets this long to send its request, and again to take the answer.
    #[serde(with = "humantime_serde")]
    pub metrics_timeout: Duration,
    /// What S3 storage charges per 1,000 PUT, COPY, POST and LIST requests, in the bill's
    /// currency; with the next, the estimate `strata_storage_request_cost_per_gb_ingested`
    /// (AWS S3 Standard, us-east-1, USD, by default).
    pub s3_price_per_1000_put_requests: f64,
    /// …and per 1,000 GET requests.
    pub s3_price_per_1000_get_requests: f64,
    /// How often the consumer-group lag on `/metrics` (`strata_group_lag`) is computed for
    /// the groups this broker coordinates: one OffsetFetch per group and one ListOffsets per
    /// topic and owner each time. `0s` turns it off. Needs `metrics_listen` and a PLAINTEXT
    /// listener (the broker asks itself as a Kafka client).
    #[serde(with = "humantime_serde")]
    pub group_lag_interval: Duration,
    /// Cluster mode: this broker is one of several sharing `storage`; partitions are spread
    /// over the live brokers, move between them, and are taken over when one dies. Off: this
    /// broker serves every partition (only one broker may run on the storage).
    pub cluster: bool,
    /// Cluster mode: a broker whose heartbeat stood still this long is dead and its
    /// partitions are taken over (failover takes about this long).
    #[serde(with = "humantime_serde")]
    pub lease_period: Duration,
    /// Cluster mode: how often a broker proves it is alive.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// Cluster mode: how often ownership records are listed (claims, takeovers, Metadata).
    /// Default by backend: 250ms; 1s for S3, where every listing is billed.
    #[serde(with = "humantime_serde::option")]
    pub ownership_interval: Option<Duration>,
    /// Cluster mode: how often the placement-changes marker is read, so a move starts (and
    /// completes) without waiting for a full ownership round; 0s turns the watch off (moves
    /// started elsewhere then wait for up to two ownership rounds; those started through this
    /// broker do not). Default by backend: 10ms; off for S3, where each read is billed (it
    /// was 10 of an idle broker's ~17 requests a second). While this broker awaits handovers
    /// the watch also reads their records: at most 16 requests a watch, a topic with many of
    /// them listed once (docs/ARCHITECTURE.md, "Move watch cost during a move").
    #[serde(with = "humantime_serde::option")]
    pub move_watch_interval: Option<Duration>,
    /// Cluster mode: spread partitions over the live brokers automatically, moving some to a
    /// broker that joins (as few as possible: rendezvous hashing). Off, partitions stay with
    /// their live owner; explicit moves, draining and failover still move them.
    pub auto_rebalance: bool,
    /// Cluster mode: how long Metadata keeps listing a broker that left the cluster, as a
    /// broker that leads nothing; 0s lists live brokers only, as Kafka does. It keeps
    /// librdkafka's transactional producer from waiting forever on a group coordinator that
    /// died (see `strata_broker::ClusterSettings::departed_broker_listing`).
    #[serde(with = "humantime_serde")]
    pub departed_broker_listing: Duration,
    /// Standalone mode (`cluster = false`): how often the broker checks whether another broker
    /// started on the same storage sealed its write-ahead stream, so that it exits instead of
    /// answering as leader with stale data. Each check lists this broker's stream.
    #[serde(with = "humantime_serde")]
    pub standalone_seal_check: Duration,
    /// The partition log.
    pub log: LogSettings,
}

/// The `[log]` section: how data is batched into storage, cached and expired.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// A group-commit write starts when the oldest queued batch has waited this long…
    /// Default by backend: 1ms for a local directory, memory and RADOS; 100ms for S3, where
    /// every request costs money.
    #[serde(with = "humantime_serde::option")]
    pub flush_interval: Option<Duration>,
    /// …or when this much is queued. Default by backend: 1MiB; 8MiB for S3. Also the most one
    /// write holds (a larger batch goes alone): a backlog, such as the one left when storage
    /// refused writes, leaves in writes of this size, so storage that recovers needs only this
    /// much free space for appends to resume.
    pub flush_bytes: Option<ByteSize>,
    /// …or at once when no write is in flight: waiting only pays while a write is busy.
    /// Default by backend: true; false for S3, where fewer, larger objects cost less.
    pub flush_when_idle: Option<bool>,
    /// Produce data accepted but not yet durable, broker-wide; at the limit producers wait.
    pub max_pending_bytes: ByteSize,
    /// A partition's write-ahead tail is compacted into a segment at this size… Default by
    /// backend: 16MiB; 64MiB for S3.
    pub segment_bytes: Option<ByteSize>,
    /// …or age. Default by backend: 10s; 60s for S3.
    #[serde(with = "humantime_serde::option")]
    pub segment_interval: Option<Duration>,
    /// Memory for the shared tail cache.
    pub cache_bytes: ByteSize,
    /// How often retention is enforced.
    #[serde(with = "humantime_serde")]
    pub retention_check_interval: Duration,
    /// Partitions of topics created without a count (auto-created topics).
    pub default_partitions: i32,
    /// Group-commit writes in flight at once.
    pub max_inflight_flushes: usize,
    /// Compressed batches are decompressed on produce to check their records (a damaged one
    /// would stall consumers forever); one inflating past this, or past the topic's
    /// `max.message.bytes` if larger, is refused with MESSAGE_TOO_LARGE (compression bombs).
    pub max_decompressed_batch_bytes: ByteSize,
    /// Compressed batches decompressed at once, broker-wide (CPU and decompression memory:
    /// up to 16MiB each for zstd, the whole batch for raw snappy); more wait. Default: the
    /// number of CPU cores.
    pub max_concurrent_decompressions: Option<usize>,
    /// A graceful handover waits this long for the partition's queued appends to become
    /// durable; past it the handover fails and the partition serves on.
    #[serde(with = "humantime_serde")]
    pub handover_timeout: Duration,
    /// Shutdown waits this long for queued appends to become durable before failing them.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// Deletes of compacted write-ahead objects in flight at once, per compaction or
    /// handover (a handover deletes them in the background once it released the partition).
    pub wal_delete_concurrency: usize,
    /// Memory of the log cleaner's key → latest offset map (key compaction), broker-wide and
    /// shared between `cleaner_threads`: 24 bytes a distinct key. A partition with more dirty
    /// keys than fit is cleaned in several passes, never with more memory.
    pub cleaner_dedupe_buffer_bytes: ByteSize,
    /// Segment bytes the cleaner reads and writes a second, broker-wide; unset: unthrottled.
    pub cleaner_io_max_bytes_per_second: Option<ByteSize>,
    /// Cleaning passes at once (each over one partition); 0 turns key compaction off.
    pub cleaner_threads: usize,
    /// Aborted transactions one partition remembers (in its manifest, ~60 bytes each); at
    /// the bound new transactions in that partition are refused (POLICY_VIOLATION) until
    /// retention or DeleteRecords passes older ones.
    pub max_aborted_transactions: usize,
    /// A partition's uncompacted write-ahead tail may hold this many bytes; past it produce to
    /// the partition is refused (KAFKA_STORAGE_ERROR, retriable) until compaction catches up,
    /// as when the bulk tier is down. At least twice `segment_bytes`.
    pub max_uncompacted_bytes: ByteSize,
    /// …and this many batches (64 bytes of memory each).
    pub max_uncompacted_batches: usize,
    /// Consumers behind the tail read segments in aligned windows of this size, kept for
    /// other fetches and read one ahead (only into memory no reader still needs); unset or 0
    /// reads exactly what each fetch needs (the default; docs/BENCHMARKS.md).
    pub read_ahead_bytes: Option<ByteSize>,
    /// Memory for those windows, broker-wide (windows their readers passed are dropped first).
    pub read_ahead_memory_bytes: ByteSize,
    /// Segment reads of consumers behind the tail in flight at once, broker-wide.
    pub catchup_max_concurrent_reads: usize,
    /// Segment bytes consumers behind the tail read a second, broker-wide; unset: unpaced.
    /// Producers and consumers at the tail are outside this budget.
    pub catchup_io_max_bytes_per_second: Option<ByteSize>,
}

impl Default for Settings {
    fn default() -> Self {
        let broker = strata_broker::BrokerSettings::default();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            advertised_listener: None,
            listeners: None,
            advertised_listeners: None,
            listener_security_protocol_map: crate::listeners::DEFAULT_PROTOCOL_MAP.to_string(),
            sasl_enabled_mechanisms: broker.sasl_enabled_mechanisms.join(","),
            ssl_certificate: None,
            ssl_key: None,
            ssl_client_auth: "none".to_string(),
            ssl_truststore: None,
            ssl_principal_mapping_rules: "DEFAULT".to_string(),
            ssl_reload_interval: Duration::from_secs(30),
            sasl_oauthbearer_jwks_file: None,
            sasl_oauthbearer_expected_issuer: None,
            sasl_oauthbearer_expected_audience: String::new(),
            sasl_oauthbearer_clock_skew: Duration::from_secs(30),
            sasl_oauthbearer_sub_claim_name: "sub".to_string(),
            authentication_timeout: broker.authentication_timeout,
            sasl_user_cache_ttl: broker.sasl_user_cache_ttl,
            sasl_user_cache_entries: broker.sasl_user_cache_entries,
            connections_max_reauth: broker.connections_max_reauth,
            authorizer: "none".to_string(),
            super_users: String::new(),
            allow_everyone_if_no_acl_found: false,
            acl_refresh_interval: broker.acl_refresh_interval,
            quota_window_num: broker.quota_window_num,
            quota_window_size: broker.quota_window_size,
            quota_max_throttle: broker.quota_max_throttle,
            quota_max_tracked: broker.quota_max_tracked,
            quota_refresh_interval: broker.quota_refresh_interval,
            node_id: None,
            cluster_id: broker.cluster_id,
            storage: "./strata-data".to_string(),
            wal_storage: None,
            ephemeral_storage_ok: false,
            auto_create_topics: true,
            auto_create_topics_per_request: broker.auto_create_topics_per_request,
            auto_create_topics_per_second: broker.auto_create_topics_per_second,
            default_replication_factor: broker.default_replication_factor,
            max_request_bytes: ByteSize(100 << 20),
            max_connections: broker.max_connections,
            max_connections_per_ip: broker.max_connections_per_ip,
            connections_max_idle: broker.connections_max_idle,
            request_read_timeout: broker.request_read_timeout,
            queued_max_request_bytes: ByteSize(broker.queued_max_request_bytes as u64),
            max_inflight_requests_per_connection: broker.max_inflight_requests_per_connection,
            max_request_partition_size_limit: broker.max_request_partition_size_limit,
            shutdown_grace: broker.shutdown_grace,
            group_shards: broker.group_shards,
            txn_shards: broker.txn_shards,
            transaction_max_timeout: broker.transaction_max_timeout,
            transaction_abort_timed_out_interval: broker.transaction_abort_timed_out_interval,
            transactional_id_expiration: broker.transactional_id_expiration,
            group_max_size: broker.group_max_size,
            group_initial_rebalance_delay: broker.group_initial_rebalance_delay,
            group_min_session_timeout: broker.group_min_session_timeout,
            group_max_session_timeout: broker.group_max_session_timeout,
            offsets_commit_timeout: broker.offsets_commit_timeout,
            txn_marker_timeout: broker.txn_marker_timeout,
            group_consumer_session_timeout: broker.group_consumer_session_timeout,
            group_consumer_heartbeat_interval: broker.group_consumer_heartbeat_interval,
            group_consumer_migration_policy: broker
                .group_consumer_migration_policy
                .as_str()
                .to_string(),
            group_share_session_timeout: broker.group_share_session_timeout,
            group_share_heartbeat_interval: broker.group_share_heartbeat_interval,
            group_share_max_groups: broker.group_share_max_groups,
            group_share_max_size: broker.group_share_max_size,
            group_share_record_lock_duration: broker.group_share_record_lock_duration,
            group_share_delivery_count_limit: broker.group_share_delivery_count_limit,
            group_share_partition_max_record_locks: broker.group_share_partition_max_record_locks,
            group_share_max_share_sessions: broker.group_share_max_share_sessions,
            group_share_max_partitions: broker.group_share_max_partitions,
            share_auto_offset_reset: broker.share_auto_offset_reset.to_string(),
            max_incremental_fetch_session_cache_slots: broker
                .max_incremental_fetch_session_cache_slots,
            max_incremental_fetch_session_partitions: broker
                .max_incremental_fetch_session_partitions,
            min_incremental_fetch_session_eviction: broker.min_incremental_fetch_session_eviction,
            metrics_listen: None,
            metrics_token: None,
            metrics_token_file: None,
            console_listen: None,
            console_sasl_mechanism: None,
            inter_broker_listener_name: None,
            inter_broker_sasl_mechanism: None,
            inter_broker_sasl_username: None,
            metrics_max_connections: 64,
            metrics_timeout: Duration::from_secs(5),
            s3_price_per_1000_put_requests: RequestPrices::S3_STANDARD.per_1000_puts,
            s3_price_per_1000_get_requests: RequestPrices::S3_STANDARD.per_1000_gets,
            group_lag_interval: Duration::from_secs(30),
            // On by default so brokers pointed at one storage form a cluster instead of fencing
            // each other; a lone broker pays a few small storage reads a second for it, and a
            // restart on the same machine is as quick as in standalone mode (the predecessor is
            // proven dead through the process table).
            cluster: true,
            lease_period: strata_broker::ClusterSettings::default().lease_period,
            heartbeat_interval: strata_broker::ClusterSettings::default().heartbeat_interval,
            ownership_interval: None,
            move_watch_interval: None,
            auto_rebalance: true,
            departed_broker_listing: strata_broker::ClusterSettings::default()
                .departed_broker_listing,
            standalone_seal_check: Duration::from_secs(2),
            log: LogSettings::default(),
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        let log = LogConfig::default();
        Self {
            flush_interval: None,
            flush_bytes: None,
            flush_when_idle: None,
            max_pending_bytes: ByteSize(log.max_pending_bytes as u64),
            segment_bytes: None,
            segment_interval: None,
            cache_bytes: ByteSize(log.cache_bytes as u64),
            retention_check_interval: log.retention_check_interval,
            default_partitions: log.default_partitions,
            max_inflight_flushes: log.max_inflight_flushes,
            max_decompressed_batch_bytes: ByteSize(log.max_decompressed_batch_bytes as u64),
            max_concurrent_decompressions: None,
            handover_timeout: log.handover_timeout,
            shutdown_timeout: log.shutdown_timeout,
            wal_delete_concurrency: log.wal_delete_concurrency,
            cleaner_dedupe_buffer_bytes: ByteSize(log.cleaner_dedupe_buffer_bytes as u64),
            cleaner_io_max_bytes_per_second: None,
            cleaner_threads: log.cleaner_threads,
            max_aborted_transactions: log.max_aborted_transactions,
            max_uncompacted_bytes: ByteSize(log.max_uncompacted_bytes as u64),
            max_uncompacted_batches: log.max_uncompacted_batches,
            read_ahead_bytes: None,
            read_ahead_memory_bytes: ByteSize(log.read_ahead_memory_bytes as u64),
            catchup_max_concurrent_reads: log.catchup_max_concurrent_reads,
            catchup_io_max_bytes_per_second: None,
        }
    }
}

impl LogSettings {
    /// The log layer's config; settings not exposed here (the index chunk span, a storage
    /// format constant) keep their defaults.
    ///
    /// Group-commit and compaction settings left unset take the storage backend's defaults
    /// (a storage URL's scheme: "file", "memory", "s3", "rados"): group commits the write-ahead
    /// tier's (`wal_scheme`), segments the bulk tier's (`bulk_scheme`), so a RADOS write-ahead
    /// tier over S3 commits every millisecond and still writes large segments. With one storage
    /// both are its scheme.
    pub fn to_log_config(
        &self,
        wal_scheme: &str,
        bulk_scheme: &str,
    ) -> Result<LogConfig, SettingsError> {
        let profile = BackendProfile::for_scheme(wal_scheme);
        let bulk = BackendProfile::for_scheme(bulk_scheme);
        let size = |name: &str, v: ByteSize| {
            usize::try_from(v.0).map_err(|_| SettingsError::Value {
                key: format!("log.{name}"),
                message: format!("{} bytes does not fit this platform", v.0),
            })
        };
        let segment_bytes = size(
            "segment_bytes",
            self.segment_bytes.unwrap_or(ByteSize(bulk.segment_bytes)),
        )?;
        let max_uncompacted_bytes = size("max_uncompacted_bytes", self.max_uncompacted_bytes)?;
        // Below two segments the tail would refuse produce before compaction is even due.
        if max_uncompacted_bytes < segment_bytes.saturating_mul(2) {
            return Err(SettingsError::Value {
                key: "log.max_uncompacted_bytes".into(),
                message: format!(
                    "must be at least twice log.segment_bytes ({segment_bytes} bytes)"
                ),
            });
        }
        Ok(LogConfig {
            flush_bytes: size(
                "flush_bytes",
                self.flush_bytes.unwrap_or(ByteSize(profile.flush_bytes)),
            )?,
            flush_interval: self.flush_interval.unwrap_or(profile.flush_interval),
            flush_when_idle: self.flush_when_idle.unwrap_or(profile.flush_when_idle),
            max_inflight_flushes: self.max_inflight_flushes,
            max_pending_bytes: size("max_pending_bytes", self.max_pending_bytes)?,
            segment_bytes,
            segment_interval: self.segment_interval.unwrap_or(bulk.segment_interval),
            cache_bytes: size("cache_bytes", self.cache_bytes)?,
            retention_check_interval: self.retention_check_interval,
            default_partitions: self.default_partitions,
            max_decompressed_batch_bytes: size(
                "max_decompressed_batch_bytes",
                self.max_decompressed_batch_bytes,
            )?,
            max_concurrent_decompressions: self
                .max_concurrent_decompressions
                .unwrap_or_else(strata_log::default_concurrent_decompressions),
            handover_timeout: self.handover_timeout,
            shutdown_timeout: self.shutdown_timeout,
            wal_delete_concurrency: self.wal_delete_concurrency,
            cleaner_dedupe_buffer_bytes: size(
                "cleaner_dedupe_buffer_bytes",
                self.cleaner_dedupe_buffer_bytes,
            )?,
            cleaner_io_max_bytes_per_second: self
                .cleaner_io_max_bytes_per_second
                .map_or(u64::MAX, |b| b.0),
            cleaner_threads: self.cleaner_threads,
            max_aborted_transactions: self.max_aborted_transactions,
            max_uncompacted_bytes,
            max_uncompacted_batches: self.max_uncompacted_batches,
            read_ahead_bytes: size(
                "read_ahead_bytes",
                self.read_ahead_bytes.unwrap_or(ByteSize(0)),
            )?,
            read_ahead_memory_bytes: size("read_ahead_memory_bytes", self.read_ahead_memory_bytes)?,
            catchup_max_concurrent_reads: self.catchup_max_concurrent_reads,
            catchup_io_max_bytes_per_second: self
                .catchup_io_max_bytes_per_second
                .map_or(u64::MAX, |b| b.0),
            ..LogConfig::default()
        })
    }
}

/// Write tuning that suits a storage backend. Local disks and RADOS answer in about a
/// millisecond, so small, frequent group commits keep latency low. On S3 each request is
/// billed and takes tens of milliseconds, so fewer, larger objects cost less and lose little.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendProfile {
    pub flush_interval: Duration,
    pub flush_bytes: u64,
    pub flush_when_idle: bool,
    pub segment_bytes: u64,
    pub segment_interval: Duration,
    /// Cluster polling: full ownership rounds, and the move marker between them.
    pub ownership_interval: Duration,
    pub move_watch_interval: Duration,
}

impl BackendProfile {
    pub fn for_scheme(scheme: &str) -> Self {
        match scheme {
            "s3" => Self {
                flush_interval: Duration::from_millis(100),
                flush_bytes: 8 << 20,
                flush_when_idle: false,
                segment_bytes: 64 << 20,
                segment_interval: Duration::from_secs(60),
                // A round is one LIST and one GET (the placement-changes marker); at the local
                // defaults an idle broker would send ~110 billed requests a second. No move
                // watch: it read the marker ten times a second for moves that are rare; a
                // move started elsewhere waits for up to two rounds instead.
                ownership_interval: Duration::from_secs(1),
                move_watch_interval: Duration::ZERO,
            },
            _ => {
                let log = LogConfig::default();
                let cluster = strata_broker::ClusterSettings::default();
                Self {
                    flush_interval: log.flush_interval,
                    flush_bytes: log.flush_bytes as u64,
                    flush_when_idle: log.flush_when_idle,
                    segment_bytes: log.segment_bytes as u64,
                    segment_interval: log.segment_interval,
                    ownership_interval: cluster.ownership_interval,
                    move_watch_interval: cluster.move_watch_interval,
                }
            }
        }
    }
}

/// A byte count, written as a plain integer or with a unit: `64MiB`, `1GB`, `512 KiB`, `100`.
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) of 1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let digits_end = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(digits_end);
        if number.is_empty() {
            return Err(format!(
                "{text:?} is not a byte size (expected e.g. 1048576, \"64MiB\" or \"1GB\")"
            ));
        }
        let number: u64 = number
            .parse()
            .map_err(|_| format!("{text:?}: number too large"))?;
        let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            "tib" => 1 << 40,
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
                ))
            }
        };
        number
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| format!("{text:?}: too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            (1u64 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (size, unit) in units {
            if self.0 >= size && self.0.checked_rem(size) == Some(0) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ByteSizeVisitor;
        impl Visitor<'_> for ByteSizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte size: an integer or a string like \"64MiB\" or \"1GB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("byte size {v} is negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(ByteSizeVisitor)
    }
}

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("--{flag}: {message}")]
    Flag { flag: String, message: String },
    #[error("setting {key}: {message}")]
    Value { key: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// How an environment variable's text becomes a TOML value.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Kept as a string (addresses, names, durations, byte sizes).
    Text,
    Integer,
    Float,
    Boolean,
}

/// Environment overrides: variable, settings path, kind.
const ENV_OVERRIDES: &[(&str, &[&str], Kind)] = &[
    ("STRATA_LISTEN", &["listen"], Kind::Text),
    (
        "STRATA_ADVERTISED_LISTENER",
        &["advertised_listener"],
        Kind::Text,
    ),
    ("STRATA_LISTENERS", &["listeners"], Kind::Text),
    (
        "STRATA_ADVERTISED_LISTENERS",
        &["advertised_listeners"],
        Kind::Text,
    ),
    (
        "STRATA_LISTENER_SECURITY_PROTOCOL_MAP",
        &["listener_security_protocol_map"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_ENABLED_MECHANISMS",
        &["sasl_enabled_mechanisms"],
        Kind::Text,
    ),
    ("STRATA_SSL_CERTIFICATE", &["ssl_certificate"], Kind::Text),
    ("STRATA_SSL_KEY", &["ssl_key"], Kind::Text),
    ("STRATA_SSL_CLIENT_AUTH", &["ssl_client_auth"], Kind::Text),
    ("STRATA_SSL_TRUSTSTORE", &["ssl_truststore"], Kind::Text),
    (
        "STRATA_SSL_PRINCIPAL_MAPPING_RULES",
        &["ssl_principal_mapping_rules"],
        Kind::Text,
    ),
    (
        "STRATA_SSL_RELOAD_INTERVAL",
        &["ssl_reload_interval"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_OAUTHBEARER_JWKS_FILE",
        &["sasl_oauthbearer_jwks_file"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_OAUTHBEARER_EXPECTED_ISSUER",
        &["sasl_oauthbearer_expected_issuer"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_OAUTHBEARER_EXPECTED_AUDIENCE",
        &["sasl_oauthbearer_expected_audience"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_OAUTHBEARER_CLOCK_SKEW",
        &["sasl_oauthbearer_clock_skew"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_OAUTHBEARER_SUB_CLAIM_NAME",
        &["sasl_oauthbearer_sub_claim_name"],
        Kind::Text,
    ),
    (
        "STRATA_AUTHENTICATION_TIMEOUT",
        &["authentication_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_USER_CACHE_TTL",
        &["sasl_user_cache_ttl"],
        Kind::Text,
    ),
    (
        "STRATA_SASL_USER_CACHE_ENTRIES",
        &["sasl_user_cache_entries"],
        Kind::Integer,
    ),
    (
        "STRATA_CONNECTIONS_MAX_REAUTH",
        &["connections_max_reauth"],
        Kind::Text,
    ),
    ("STRATA_AUTHORIZER", &["authorizer"], Kind::Text),
    ("STRATA_SUPER_USERS", &["super_users"], Kind::Text),
    (
        "STRATA_ALLOW_EVERYONE_IF_NO_ACL_FOUND",
        &["allow_everyone_if_no_acl_found"],
        Kind::Boolean,
    ),
    (
        "STRATA_ACL_REFRESH_INTERVAL",
        &["acl_refresh_interval"],
        Kind::Text,
    ),
    (
        "STRATA_QUOTA_WINDOW_NUM",
        &["quota_window_num"],
        Kind::Integer,
    ),
    (
        "STRATA_QUOTA_WINDOW_SIZE",
        &["quota_window_size"],
        Kind::Text,
    ),
    (
        "STRATA_QUOTA_MAX_THROTTLE",
        &["quota_max_throttle"],
        Kind::Text,
    ),
    (
        "STRATA_QUOTA_MAX_TRACKED",
        &["quota_max_tracked"],
        Kind::Integer,
    ),
    (
        "STRATA_QUOTA_REFRESH_INTERVAL",
        &["quota_refresh_interval"],
        Kind::Text,
    ),
    ("STRATA_NODE_ID", &["node_id"], Kind::Integer),
    ("STRATA_CLUSTER_ID", &["cluster_id"], Kind::Text),
    ("STRATA_STORAGE", &["storage"], Kind::Text),
    ("STRATA_WAL_STORAGE", &["wal_storage"], Kind::Text),
    (
        "STRATA_EPHEMERAL_STORAGE_OK",
        &["ephemeral_storage_ok"],
        Kind::Boolean,
    ),
    (
        "STRATA_AUTO_CREATE_TOPICS",
        &["auto_create_topics"],
        Kind::Boolean,
    ),
    (
        "STRATA_MAX_REQUEST_BYTES",
        &["max_request_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_MAX_CONNECTIONS",
        &["max_connections"],
        Kind::Integer,
    ),
    (
        "STRATA_MAX_CONNECTIONS_PER_IP",
        &["max_connections_per_ip"],
        Kind::Integer,
    ),
    (
        "STRATA_CONNECTIONS_MAX_IDLE",
        &["connections_max_idle"],
        Kind::Text,
    ),
    (
        "STRATA_REQUEST_READ_TIMEOUT",
        &["request_read_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_QUEUED_MAX_REQUEST_BYTES",
        &["queued_max_request_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_AUTO_CREATE_TOPICS_PER_REQUEST",
        &["auto_create_topics_per_request"],
        Kind::Integer,
    ),
    (
        "STRATA_AUTO_CREATE_TOPICS_PER_SECOND",
        &["auto_create_topics_per_second"],
        Kind::Integer,
    ),
    (
        "STRATA_DEFAULT_REPLICATION_FACTOR",
        &["default_replication_factor"],
        Kind::Integer,
    ),
    (
        "STRATA_MAX_REQUEST_PARTITION_SIZE_LIMIT",
        &["max_request_partition_size_limit"],
        Kind::Integer,
    ),
    (
        "STRATA_MAX_INFLIGHT_REQUESTS_PER_CONNECTION",
        &["max_inflight_requests_per_connection"],
        Kind::Integer,
    ),
    ("STRATA_SHUTDOWN_GRACE", &["shutdown_grace"], Kind::Text),
    ("STRATA_GROUP_SHARDS", &["group_shards"], Kind::Integer),
    ("STRATA_TXN_SHARDS", &["txn_shards"], Kind::Integer),
    (
        "STRATA_TRANSACTION_MAX_TIMEOUT",
        &["transaction_max_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_TRANSACTION_ABORT_TIMED_OUT_INTERVAL",
        &["transaction_abort_timed_out_interval"],
        Kind::Text,
    ),
    (
        "STRATA_TRANSACTIONAL_ID_EXPIRATION",
        &["transactional_id_expiration"],
        Kind::Text,
    ),
    ("STRATA_GROUP_MAX_SIZE", &["group_max_size"], Kind::Integer),
    (
        "STRATA_GROUP_INITIAL_REBALANCE_DELAY",
        &["group_initial_rebalance_delay"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_MIN_SESSION_TIMEOUT",
        &["group_min_session_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_MAX_SESSION_TIMEOUT",
        &["group_max_session_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_OFFSETS_COMMIT_TIMEOUT",
        &["offsets_commit_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_TXN_MARKER_TIMEOUT",
        &["txn_marker_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_CONSUMER_SESSION_TIMEOUT",
        &["group_consumer_session_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_CONSUMER_HEARTBEAT_INTERVAL",
        &["group_consumer_heartbeat_interval"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_CONSUMER_MIGRATION_POLICY",
        &["group_consumer_migration_policy"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_SHARE_SESSION_TIMEOUT",
        &["group_share_session_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_SHARE_HEARTBEAT_INTERVAL",
        &["group_share_heartbeat_interval"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_SHARE_MAX_GROUPS",
        &["group_share_max_groups"],
        Kind::Integer,
    ),
    (
        "STRATA_GROUP_SHARE_MAX_SIZE",
        &["group_share_max_size"],
        Kind::Integer,
    ),
    (
        "STRATA_GROUP_SHARE_RECORD_LOCK_DURATION",
        &["group_share_record_lock_duration"],
        Kind::Text,
    ),
    (
        "STRATA_GROUP_SHARE_DELIVERY_COUNT_LIMIT",
        &["group_share_delivery_count_limit"],
        Kind::Integer,
    ),
    (
        "STRATA_GROUP_SHARE_PARTITION_MAX_RECORD_LOCKS",
        &["group_share_partition_max_record_locks"],
        Kind::Integer,
    ),
    (
        "STRATA_GROUP_SHARE_MAX_SHARE_SESSIONS",
        &["group_share_max_share_sessions"],
        Kind::Integer,
    ),
    (
        "STRATA_GROUP_SHARE_MAX_PARTITIONS",
        &["group_share_max_partitions"],
        Kind::Integer,
    ),
    (
        "STRATA_SHARE_AUTO_OFFSET_RESET",
        &["share_auto_offset_reset"],
        Kind::Text,
    ),
    (
        "STRATA_MAX_INCREMENTAL_FETCH_SESSION_CACHE_SLOTS",
        &["max_incremental_fetch_session_cache_slots"],
        Kind::Integer,
    ),
    (
        "STRATA_MAX_INCREMENTAL_FETCH_SESSION_PARTITIONS",
        &["max_incremental_fetch_session_partitions"],
        Kind::Integer,
    ),
    (
        "STRATA_MIN_INCREMENTAL_FETCH_SESSION_EVICTION",
        &["min_incremental_fetch_session_eviction"],
        Kind::Text,
    ),
    ("STRATA_METRICS_LISTEN", &["metrics_listen"], Kind::Text),
    ("STRATA_METRICS_TOKEN", &["metrics_token"], Kind::Text),
    ("STRATA_CONSOLE_LISTEN", &["console_listen"], Kind::Text),
    (
        "STRATA_CONSOLE_SASL_MECHANISM",
        &["console_sasl_mechanism"],
        Kind::Text,
    ),
    (
        "STRATA_INTER_BROKER_LISTENER_NAME",
        &["inter_broker_listener_name"],
        Kind::Text,
    ),
    (
        "STRATA_INTER_BROKER_SASL_MECHANISM",
        &["inter_broker_sasl_mechanism"],
        Kind::Text,
    ),
    (
        "STRATA_INTER_BROKER_SASL_USERNAME",
        &["inter_broker_sasl_username"],
        Kind::Text,
    ),
    (
        "STRATA_METRICS_TOKEN_FILE",
        &["metrics_token_file"],
        Kind::Text,
    ),
    (
        "STRATA_METRICS_MAX_CONNECTIONS",
        &["metrics_max_connections"],
        Kind::Integer,
    ),
    ("STRATA_METRICS_TIMEOUT", &["metrics_timeout"], Kind::Text),
    (
        "STRATA_S3_PRICE_PER_1000_PUT_REQUESTS",
        &["s3_price_per_1000_put_requests"],
        Kind::Float,
    ),
    (
        "STRATA_S3_PRICE_PER_1000_GET_REQUESTS",
        &["s3_price_per_1000_get_requests"],
        Kind::Float,
    ),
    (
        "STRATA_GROUP_LAG_INTERVAL",
        &["group_lag_interval"],
        Kind::Text,
    ),
    ("STRATA_CLUSTER", &["cluster"], Kind::Boolean),
    ("STRATA_LEASE_PERIOD", &["lease_period"], Kind::Text),
    (
        "STRATA_HEARTBEAT_INTERVAL",
        &["heartbeat_interval"],
        Kind::Text,
    ),
    (
        "STRATA_OWNERSHIP_INTERVAL",
        &["ownership_interval"],
        Kind::Text,
    ),
    (
        "STRATA_MOVE_WATCH_INTERVAL",
        &["move_watch_interval"],
        Kind::Text,
    ),
    ("STRATA_AUTO_REBALANCE", &["auto_rebalance"], Kind::Boolean),
    (
        "STRATA_DEPARTED_BROKER_LISTING",
        &["departed_broker_listing"],
        Kind::Text,
    ),
    (
        "STRATA_STANDALONE_SEAL_CHECK",
        &["standalone_seal_check"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_FLUSH_INTERVAL",
        &["log", "flush_interval"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_FLUSH_BYTES",
        &["log", "flush_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_FLUSH_WHEN_IDLE",
        &["log", "flush_when_idle"],
        Kind::Boolean,
    ),
    (
        "STRATA_LOG_MAX_PENDING_BYTES",
        &["log", "max_pending_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_SEGMENT_BYTES",
        &["log", "segment_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_SEGMENT_INTERVAL",
        &["log", "segment_interval"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_CACHE_BYTES",
        &["log", "cache_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_RETENTION_CHECK_INTERVAL",
        &["log", "retention_check_interval"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_HANDOVER_TIMEOUT",
        &["log", "handover_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_SHUTDOWN_TIMEOUT",
        &["log", "shutdown_timeout"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_DEFAULT_PARTITIONS",
        &["log", "default_partitions"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_MAX_INFLIGHT_FLUSHES",
        &["log", "max_inflight_flushes"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_WAL_DELETE_CONCURRENCY",
        &["log", "wal_delete_concurrency"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_MAX_DECOMPRESSED_BATCH_BYTES",
        &["log", "max_decompressed_batch_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_MAX_CONCURRENT_DECOMPRESSIONS",
        &["log", "max_concurrent_decompressions"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_CLEANER_DEDUPE_BUFFER_BYTES",
        &["log", "cleaner_dedupe_buffer_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_CLEANER_IO_MAX_BYTES_PER_SECOND",
        &["log", "cleaner_io_max_bytes_per_second"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_CLEANER_THREADS",
        &["log", "cleaner_threads"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_MAX_ABORTED_TRANSACTIONS",
        &["log", "max_aborted_transactions"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_MAX_UNCOMPACTED_BYTES",
        &["log", "max_uncompacted_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_MAX_UNCOMPACTED_BATCHES",
        &["log", "max_uncompacted_batches"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_READ_AHEAD_BYTES",
        &["log", "read_ahead_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_READ_AHEAD_MEMORY_BYTES",
        &["log", "read_ahead_memory_bytes"],
        Kind::Text,
    ),
    (
        "STRATA_LOG_CATCHUP_MAX_CONCURRENT_READS",
        &["log", "catchup_max_concurrent_reads"],
        Kind::Integer,
    ),
    (
        "STRATA_LOG_CATCHUP_IO_MAX_BYTES_PER_SECOND",
        &["log", "catchup_io_max_bytes_per_second"],
        Kind::Text,
    ),
];

/// Values given on the command line (the top layer).
#[derive(Debug, Default, Clone)]
pub struct FlagOverrides {
    pub listen: Option<String>,
    pub advertised_listener: Option<String>,
    pub listeners: Option<String>,
    pub advertised_listeners: Option<String>,
    pub listener_security_protocol_map: Option<String>,
    pub sasl_enabled_mechanisms: Option<String>,
    pub ssl_certificate: Option<String>,
    pub ssl_key: Option<String>,
    pub ssl_client_auth: Option<String>,
    pub ssl_truststore: Option<String>,
    pub ssl_principal_mapping_rules: Option<String>,
    pub ssl_reload_interval: Option<String>,
    pub connections_max_reauth: Option<String>,
    pub sasl_oauthbearer_jwks_file: Option<String>,
    pub sasl_oauthbearer_expected_issuer: Option<String>,
    pub sasl_oauthbearer_expected_audience: Option<String>,
    pub sasl_oauthbearer_clock_skew: Option<String>,
    pub sasl_oauthbearer_sub_claim_name: Option<String>,
    pub authorizer: Option<String>,
    pub super_users: Option<String>,
    pub allow_everyone_if_no_acl_found: Option<bool>,
    pub acl_refresh_interval: Option<String>,
    pub node_id: Option<i32>,
    pub cluster_id: Option<String>,
    pub storage: Option<String>,
    pub wal_storage: Option<String>,
    pub ephemeral_storage_ok: Option<bool>,
    pub auto_create_topics: Option<bool>,
    pub max_request_bytes: Option<String>,
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
    pub connections_max_idle: Option<String>,
    pub request_read_timeout: Option<String>,
    pub queued_max_request_bytes: Option<String>,
    pub auto_create_topics_per_request: Option<usize>,
    pub auto_create_topics_per_second: Option<u32>,
    pub default_replication_factor: Option<i16>,
    pub max_request_partition_size_limit: Option<usize>,
    pub group_shards: Option<i32>,
    pub txn_shards: Option<i32>,
    pub transaction_max_timeout: Option<String>,
    pub transaction_abort_timed_out_interval: Option<String>,
    pub transactional_id_expiration: Option<String>,
    pub group_max_size: Option<usize>,
    pub group_initial_rebalance_delay: Option<String>,
    pub group_min_session_timeout: Option<String>,
    pub group_max_session_timeout: Option<String>,
    pub group_consumer_session_timeout: Option<String>,
    pub group_consumer_heartbeat_interval: Option<String>,
    pub group_consumer_migration_policy: Option<String>,
    pub group_share_session_timeout: Option<String>,
    pub group_share_heartbeat_interval: Option<String>,
    pub group_share_max_groups: Option<usize>,
    pub group_share_max_size: Option<usize>,
    pub group_share_record_lock_duration: Option<String>,
    pub group_share_delivery_count_limit: Option<u16>,
    pub group_share_partition_max_record_locks: Option<usize>,
    pub group_share_max_share_sessions: Option<usize>,
    pub group_share_max_partitions: Option<usize>,
    pub share_auto_offset_reset: Option<String>,
    pub metrics_listen: Option<String>,
    pub console_listen: Option<String>,
    pub cluster: Option<bool>,
    pub lease_period: Option<String>,
    pub heartbeat_interval: Option<String>,
    pub ownership_interval: Option<String>,
    pub move_watch_interval: Option<String>,
    pub auto_rebalance: Option<bool>,
}

/// A layered settings document being assembled.
struct Layers {
    table: toml::Table,
}

impl Layers {
    fn set(&mut self, path: &[&str], value: toml::Value) {
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        let mut table = &mut self.table;
        for key in parents {
            let entry = table
                .entry((*key).to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            let toml::Value::Table(inner) = entry else {
                return;
            };
            table = inner;
        }
        table.insert((*last).to_string(), value);
    }
}

/// Loads the settings: defaults < `config_file` < environment (`env` yields the process
/// environment's variables) < `flags`. Warns about `STRATA_*` variables it does not know
/// through the returned list (they may belong to something else, so they are not fatal).
pub fn load(
    config_file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: &FlagOverrides,
) -> Result<(Settings, Vec<String>), SettingsError> {
    let mut layers = Layers {
        table: toml::Table::new(),
    };
    if let Some(path) = config_file {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: shown.clone(),
            source,
        })?;
        // Deserializing the file on its own gives the best messages: line, column, key name.
        toml::from_str::<Settings>(&text).map_err(|e| SettingsError::File {
            path: shown.clone(),
            message: e.to_string().trim_end().to_string(),
        })?;
        layers.table = toml::from_str::<toml::Table>(&text).map_err(|e| SettingsError::File {
            path: shown,
            message: e.to_string(),
        })?;
    }

    let mut unknown_env = Vec::new();
    for (var, value) in env {
        if !var.starts_with("STRATA_") {
            continue;
        }
        let Some((_, path, kind)) = ENV_OVERRIDES.iter().find(|(name, _, _)| *name == var) else {
            unknown_env.push(var);
            continue;
        };
        let parsed = match kind {
            Kind::Text => toml::Value::String(value.clone()),
            Kind::Integer => value
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| SettingsError::Env {
                    var: var.clone(),
                    message: format!("{value:?} is not an integer"),
                })?,
            Kind::Float => value
                .trim()
                .parse::<f64>()
                .map(toml::Value::Float)
                .map_err(|_| SettingsError::Env {
                    var: var.clone(),
                    message: format!("{value:?} is not a number"),
                })?,
            Kind::Boolean => match value.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => toml::Value::Boolean(true),
                "false" | "0" | "no" => toml::Value::Boolean(false),
                _ => {
                    return Err(SettingsError::Env {
                        var,
                        message: format!("{value:?} is not true or false"),
                    })
                }
            },
        };
        // Check the one value alone so a bad one is blamed on its variable.
        let mut probe = Layers {
            table: toml::Table::new(),
        };
        probe.set(path, parsed.clone());
        Settings::deserialize(toml::Value::Table(probe.table)).map_err(|e| SettingsError::Env {
            var: var.clone(),
            message: e.to_string().trim_end().to_string(),
        })?;
        layers.set(path, parsed);
    }

    let flag_values: Vec<(&str, &[&str], Option<toml::Value>)> = vec![
        (
            "listen",
            &["listen"],
            flags.listen.clone().map(toml::Value::String),
        ),
        (
            "advertised-listener",
            &["advertised_listener"],
            flags.advertised_listener.clone().map(toml::Value::String),
        ),
        (
            "listeners",
            &["listeners"],
            flags.listeners.clone().map(toml::Value::String),
        ),
        (
            "advertised-listeners",
            &["advertised_listeners"],
            flags.advertised_listeners.clone().map(toml::Value::String),
        ),
        (
            "listener-security-protocol-map",
            &["listener_security_protocol_map"],
            flags
                .listener_security_protocol_map
                .clone()
                .map(toml::Value::String),
        ),
        (
            "sasl-enabled-mechanisms",
            &["sasl_enabled_mechanisms"],
            flags
                .sasl_enabled_mechanisms
                .clone()
                .map(toml::Value::String),
        ),
        (
            "ssl-certificate",
            &["ssl_certificate"],
            flags.ssl_certificate.clone().map(toml::Value::String),
        ),
        (
            "ssl-key",
            &["ssl_key"],
            flags.ssl_key.clone().map(toml::Value::String),
        ),
        (
            "ssl-client-auth",
            &["ssl_client_auth"],
            flags.ssl_client_auth.clone().map(toml::Value::String),
        ),
        (
            "ssl-truststore",
            &["ssl_truststore"],
            flags.ssl_truststore.clone().map(toml::Value::String),
        ),
        (
            "ssl-principal-mapping-rules",
            &["ssl_principal_mapping_rules"],
            flags
                .ssl_principal_mapping_rules
                .clone()
                .map(toml::Value::String),
        ),
        (
            "ssl-reload-interval",
            &["ssl_reload_interval"],
            flags.ssl_reload_interval.clone().map(toml::Value::String),
        ),
        (
            "connections-max-reauth",
            &["connections_max_reauth"],
            flags
                .connections_max_reauth
                .clone()
                .map(toml::Value::String),
        ),
        (
            "sasl-oauthbearer-jwks-file",
            &["sasl_oauthbearer_jwks_file"],
            flags
                .sasl_oauthbearer_jwks_file
                .clone()
                .map(toml::Value::String),
        ),
        (
            "sasl-oauthbearer-expected-issuer",
            &["sasl_oauthbearer_expected_issuer"],
            flags
                .sasl_oauthbearer_expected_issuer
                .clone()
                .map(toml::Value::String),
        ),
        (
            "sasl-oauthbearer-expected-audience",
            &["sasl_oauthbearer_expected_audience"],
            flags
                .sasl_oauthbearer_expected_audience
                .clone()
                .map(toml::Value::String),
        ),
        (
            "sasl-oauthbearer-clock-skew",
            &["sasl_oauthbearer_clock_skew"],
            flags
                .sasl_oauthbearer_clock_skew
                .clone()
                .map(toml::Value::String),
        ),
        (
            "sasl-oauthbearer-sub-claim-name",
            &["sasl_oauthbearer_sub_claim_name"],
            flags
                .sasl_oauthbearer_sub_claim_name
                .clone()
                .map(toml::Value::String),
        ),
        (
            "authorizer",
            &["authorizer"],
            flags.authorizer.clone().map(toml::Value::String),
        ),
        (
            "super-users",
            &["super_users"],
            flags.super_users.clone().map(toml::Value::String),
        ),
        (
            "allow-everyone-if-no-acl-found",
            &["allow_everyone_if_no_acl_found"],
            flags
                .allow_everyone_if_no_acl_found
                .map(toml::Value::Boolean),
        ),
        (
            "acl-refresh-interval",
            &["acl_refresh_interval"],
            flags.acl_refresh_interval.clone().map(toml::Value::String),
        ),
        (
            "node-id",
            &["node_id"],
            flags.node_id.map(|v| toml::Value::Integer(i64::from(v))),
        ),
        (
            "cluster-id",
            &["cluster_id"],
            flags.cluster_id.clone().map(toml::Value::String),
        ),
        (
            "storage",
            &["storage"],
            flags.storage.clone().map(toml::Value::String),
        ),
        (
            "wal-storage",
            &["wal_storage"],
            flags.wal_storage.clone().map(toml::Value::String),
        ),
        (
            "ephemeral-storage-ok",
            &["ephemeral_storage_ok"],
            flags.ephemeral_storage_ok.map(toml::Value::Boolean),
        ),
        (
            "auto-create-topics",
            &["auto_create_topics"],
            flags.auto_create_topics.map(toml::Value::Boolean),
        ),
        (
            "max-request-bytes",
            &["max_request_bytes"],
            flags.max_request_bytes.clone().map(toml::Value::String),
        ),
        (
            "max-connections",
            &["max_connections"],
            flags
                .max_connections
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "max-connections-per-ip",
            &["max_connections_per_ip"],
            flags
                .max_connections_per_ip
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "connections-max-idle",
            &["connections_max_idle"],
            flags.connections_max_idle.clone().map(toml::Value::String),
        ),
        (
            "request-read-timeout",
            &["request_read_timeout"],
            flags.request_read_timeout.clone().map(toml::Value::String),
        ),
        (
            "queued-max-request-bytes",
            &["queued_max_request_bytes"],
            flags
                .queued_max_request_bytes
                .clone()
                .map(toml::Value::String),
        ),
        (
            "auto-create-topics-per-request",
            &["auto_create_topics_per_request"],
            flags
                .auto_create_topics_per_request
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "auto-create-topics-per-second",
            &["auto_create_topics_per_second"],
            flags
                .auto_create_topics_per_second
                .map(|v| toml::Value::Integer(i64::from(v))),
        ),
        (
            "default-replication-factor",
            &["default_replication_factor"],
            flags
                .default_replication_factor
                .map(|v| toml::Value::Integer(i64::from(v))),
        ),
        (
            "max-request-partition-size-limit",
            &["max_request_partition_size_limit"],
            flags
                .max_request_partition_size_limit
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "group-shards",
            &["group_shards"],
            flags
                .group_shards
                .map(|v| toml::Value::Integer(i64::from(v))),
        ),
        (
            "txn-shards",
            &["txn_shards"],
            flags.txn_shards.map(|v| toml::Value::Integer(i64::from(v))),
        ),
        (
            "transaction-max-timeout",
            &["transaction_max_timeout"],
            flags
                .transaction_max_timeout
                .clone()
                .map(toml::Value::String),
        ),
        (
            "transaction-abort-timed-out-interval",
            &["transaction_abort_timed_out_interval"],
            flags
                .transaction_abort_timed_out_interval
                .clone()
                .map(toml::Value::String),
        ),
        (
            "transactional-id-expiration",
            &["transactional_id_expiration"],
            flags
                .transactional_id_expiration
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-max-size",
            &["group_max_size"],
            flags
                .group_max_size
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "group-initial-rebalance-delay",
            &["group_initial_rebalance_delay"],
            flags
                .group_initial_rebalance_delay
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-min-session-timeout",
            &["group_min_session_timeout"],
            flags
                .group_min_session_timeout
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-max-session-timeout",
            &["group_max_session_timeout"],
            flags
                .group_max_session_timeout
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-consumer-session-timeout",
            &["group_consumer_session_timeout"],
            flags
                .group_consumer_session_timeout
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-consumer-heartbeat-interval",
            &["group_consumer_heartbeat_interval"],
            flags
                .group_consumer_heartbeat_interval
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-consumer-migration-policy",
            &["group_consumer_migration_policy"],
            flags
                .group_consumer_migration_policy
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-share-session-timeout",
            &["group_share_session_timeout"],
            flags
                .group_share_session_timeout
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-share-heartbeat-interval",
            &["group_share_heartbeat_interval"],
            flags
                .group_share_heartbeat_interval
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-share-max-groups",
            &["group_share_max_groups"],
            flags
                .group_share_max_groups
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "group-share-max-size",
            &["group_share_max_size"],
            flags
                .group_share_max_size
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "group-share-record-lock-duration",
            &["group_share_record_lock_duration"],
            flags
                .group_share_record_lock_duration
                .clone()
                .map(toml::Value::String),
        ),
        (
            "group-share-delivery-count-limit",
            &["group_share_delivery_count_limit"],
            flags
                .group_share_delivery_count_limit
                .map(|v| toml::Value::Integer(i64::from(v))),
        ),
        (
            "group-share-partition-max-record-locks",
            &["group_share_partition_max_record_locks"],
            flags
                .group_share_partition_max_record_locks
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "group-share-max-share-sessions",
            &["group_share_max_share_sessions"],
            flags
                .group_share_max_share_sessions
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "group-share-max-partitions",
            &["group_share_max_partitions"],
            flags
                .group_share_max_partitions
                .map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))),
        ),
        (
            "share-auto-offset-reset",
            &["share_auto_offset_reset"],
            flags
                .share_auto_offset_reset
                .clone()
                .map(toml::Value::String),
        ),
        (
            "metrics-listen",
            &["metrics_listen"],
            flags.metrics_listen.clone().map(toml::Value::String),
        ),
        (
            "console-listen",
            &["console_listen"],
            flags.console_listen.clone().map(toml::Value::String),
        ),
        (
            "cluster",
            &["cluster"],
            flags.cluster.map(toml::Value::Boolean),
        ),
        (
            "lease-period",
            &["lease_period"],
            flags.lease_period.clone().map(toml::Value::String),
        ),
        (
            "heartbeat-interval",
            &["heartbeat_interval"],
            flags.heartbeat_interval.clone().map(toml::Value::String),
        ),
        (
            "ownership-interval",
            &["ownership_interval"],
            flags.ownership_interval.clone().map(toml::Value::String),
        ),
        (
            "move-watch-interval",
            &["move_watch_interval"],
            flags.move_watch_interval.clone().map(toml::Value::String),
        ),
        (
            "auto-rebalance",
            &["auto_rebalance"],
            flags.auto_rebalance.map(toml::Value::Boolean),
        ),
    ];
    for (flag, path, value) in flag_values {
        let Some(value) = value else { continue };
        let mut probe = Layers {
            table: toml::Table::new(),
        };
        probe.set(path, value.clone());
        Settings::deserialize(toml::Value::Table(probe.table)).map_err(|e| {
            SettingsError::Flag {
                flag: flag.to_string(),
                message: e.to_string().trim_end().to_string(),
            }
        })?;
        layers.set(path, value);
    }

    let settings = Settings::deserialize(toml::Value::Table(layers.table))
        .map_err(|e| SettingsError::Invalid(e.to_string().trim_end().to_string()))?;
    settings.validate()?;
    Ok((settings, unknown_env))
}

impl Settings {
    /// The schemes of the write-ahead tier and the bulk tier (both `storage`'s without
    /// `wal_storage`): "file" for a plain path.
    pub fn tier_schemes(&self) -> (String, String) {
        let scheme = |url: &str| url_scheme_or_file(url);
        let bulk = scheme(&self.storage);
        let wal = self
            .wal_storage
            .as_deref()
            .map_or_else(|| bulk.clone(), scheme);
        (wal, bulk)
    }

    /// Cluster timing: the settings given, the rest from the backend's profile (the
    /// write-ahead tier's, which holds the cluster objects).
    pub fn cluster_settings(&self, scheme: &str) -> strata_broker::ClusterSettings {
        let profile = BackendProfile::for_scheme(scheme);
        strata_broker::ClusterSettings {
            lease_period: self.lease_period,
            heartbeat_interval: self.heartbeat_interval,
            ownership_interval: self
                .ownership_interval
                .unwrap_or(profile.ownership_interval),
            move_watch_interval: self
                .move_watch_interval
                .unwrap_or(profile.move_watch_interval),
            auto_rebalance: self.auto_rebalance,
            departed_broker_listing: self.departed_broker_listing,
        }
    }

    fn validate(&self) -> Result<(), SettingsError> {
        let bad = |key: &str, message: &str| {
            Err(SettingsError::Value {
                key: key.to_string(),
                message: message.to_string(),
            })
        };
        match self.node_id {
            Some(id) if id < 0 => return bad("node_id", "must be 0 or more"),
            Some(id) if self.cluster && id > strata_broker::cluster::MAX_CONFIGURED_NODE_ID => {
                return bad(
                    "node_id",
                    &format!(
                        "must be at most {} in cluster mode: ids above are allocated by the \
                         cluster (leave node_id unset to get one)",
                        strata_broker::cluster::MAX_CONFIGURED_NODE_ID
                    ),
                )
            }
            _ => {}
        }
        if self.max_request_bytes.0 < 1024 || self.max_request_bytes.0 > i32::MAX as u64 {
            return bad("max_request_bytes", "must be between 1KiB and 2GiB");
        }
        if self.max_connections == 0 {
            return bad("max_connections", "must be at least 1");
        }
        if self.max_connections_per_ip == 0 {
            return bad("max_connections_per_ip", "must be at least 1");
        }
        if self.connections_max_idle.is_zero() {
            return bad("connections_max_idle", "must be more than 0s");
        }
        if self.request_read_timeout.is_zero() {
            return bad("request_read_timeout", "must be more than 0s");
        }
        if self.queued_max_request_bytes.0 < self.max_request_bytes.0 {
            return bad(
                "queued_max_request_bytes",
                "must be at least max_request_bytes (a largest request must fit)",
            );
        }
        if usize::try_from(self.queued_max_request_bytes.0).is_err() {
            return bad("queued_max_request_bytes", "does not fit this platform");
        }
        if self.auto_create_topics_per_request == 0 {
            return bad(
                "auto_create_topics_per_request",
                "must be at least 1 (turn auto_create_topics off instead)",
            );
        }
        if self.default_replication_factor < 1 {
            return bad("default_replication_factor", "must be at least 1");
        }
        if self.auto_create_topics_per_second == 0 {
            return bad(
                "auto_create_topics_per_second",
                "must be at least 1 (turn auto_create_topics off instead)",
            );
        }
        if self.metrics_max_connections == 0 {
            return bad("metrics_max_connections", "must be at least 1");
        }
        for (key, price) in [
            (
                "s3_price_per_1000_put_requests",
                self.s3_price_per_1000_put_requests,
            ),
            (
                "s3_price_per_1000_get_requests",
                self.s3_price_per_1000_get_requests,
            ),
        ] {
            if !(price.is_finite() && price >= 0.0) {
                return bad(key, "must be a number of at least 0");
            }
        }
        if self.metrics_timeout.is_zero() {
            return bad("metrics_timeout", "must be more than 0s");
        }
        if self.metrics_token.is_some() && self.metrics_token_file.is_some() {
            return bad(
                "metrics_token",
                "give metrics_token or metrics_token_file, not both",
            );
        }
        if self
            .metrics_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return bad("metrics_token", "must not be empty");
        }
        if self.max_request_partition_size_limit == 0 {
            return bad("max_request_partition_size_limit", "must be at least 1");
        }
        if self.max_inflight_requests_per_connection == 0 {
            return bad("max_inflight_requests_per_connection", "must be at least 1");
        }
        if self.log.default_partitions < 1 {
            return bad("log.default_partitions", "must be at least 1");
        }
        if self.log.max_inflight_flushes == 0 {
            return bad("log.max_inflight_flushes", "must be at least 1");
        }
        if self.log.wal_delete_concurrency == 0 {
            return bad("log.wal_delete_concurrency", "must be at least 1");
        }
        // Zero would refuse every transaction on a partition that ever aborted one.
        if self.log.max_aborted_transactions == 0 {
            return bad("log.max_aborted_transactions", "must be at least 1");
        }
        // A batch of the tail is at most one produce request's batch: fewer than a thousand
        // would refuse ordinary producers before compaction is due.
        if self.log.max_uncompacted_batches < 1000 {
            return bad("log.max_uncompacted_batches", "must be at least 1000");
        }
        // Below a megabyte, ordinary producer batches (librdkafka's default batch.size is 1MB
        // uncompressed) would be refused.
        if self.log.max_decompressed_batch_bytes.0 < 1 << 20 {
            return bad("log.max_decompressed_batch_bytes", "must be at least 1MiB");
        }
        if self.log.max_concurrent_decompressions == Some(0) {
            return bad("log.max_concurrent_decompressions", "must be at least 1");
        }
        // Below this a pass maps too few keys to make progress worth its reads.
        if self.log.cleaner_dedupe_buffer_bytes.0 < 64 << 10 {
            return bad("log.cleaner_dedupe_buffer_bytes", "must be at least 64KiB");
        }
        if self
            .log
            .cleaner_io_max_bytes_per_second
            .is_some_and(|b| b.0 == 0)
        {
            return bad(
                "log.cleaner_io_max_bytes_per_second",
                "must be at least 1 (leave it unset for no limit)",
            );
        }
        if self
            .log
            .catchup_io_max_bytes_per_second
            .is_some_and(|b| b.0 == 0)
        {
            return bad(
                "log.catchup_io_max_bytes_per_second",
                "must be at least 1 (leave it unset for no limit)",
            );
        }
        if self.log.catchup_max_concurrent_reads == 0 {
            return bad("log.catchup_max_concurrent_reads", "must be at least 1");
        }
        // Windows are addressed by 32-bit segment positions, like index entries.
        if self
            .log
            .read_ahead_bytes
            .is_some_and(|b| b.0 > u64::from(u32::MAX))
        {
            return bad("log.read_ahead_bytes", "must be below 4GiB");
        }
        if is_ephemeral(&self.storage) && !self.ephemeral_storage_ok {
            return Err(SettingsError::Invalid(format!(
                "storage {:?} keeps everything in this process's memory: acknowledged records \
                 (acks=all too), offsets and topics are lost when it exits. Set \
                 ephemeral_storage_ok = true (--ephemeral-storage-ok, \
                 STRATA_EPHEMERAL_STORAGE_OK=true) to run on it anyway, e.g. for tests",
                self.storage
            )));
        }
        self.validate_tiers()?;
        if !(1..=MAX_GROUP_SHARDS).contains(&self.group_shards) {
            return bad(
                "group_shards",
                &format!("must be between 1 and {MAX_GROUP_SHARDS}"),
            );
        }
        if !(1..=MAX_GROUP_SIZE).contains(&self.group_max_size) {
            return bad(
                "group_max_size",
                &format!("must be between 1 and {MAX_GROUP_SIZE}"),
            );
        }
        if self.group_min_session_timeout > self.group_max_session_timeout {
            return bad(
                "group_min_session_timeout",
                "must not exceed group_max_session_timeout",
            );
        }
        // Kafka clients send session timeouts as 32-bit milliseconds: a larger bound can never
        // be asked for, so it is surely a typo.
        if self.group_max_session_timeout.as_millis() > i32::MAX as u128 {
            return bad("group_max_session_timeout", "must be at most 24d");
        }
        // Both binds would race for the port and the loser's error would not say why.
        if self.metrics_listen == Some(self.listen) && self.listen.port() != 0 {
            return bad("metrics_listen", "must differ from listen");
        }
        if let Some(console) = self.console_listen {
            if console.port() != 0
                && (console == self.listen || Some(console) == self.metrics_listen)
            {
                return bad(
                    "console_listen",
                    "must differ from listen and metrics_listen",
                );
            }
            // Its actions move partitions and drain brokers: never open to a network by
            // accident.
            let token = self.metrics_token.is_some() || self.metrics_token_file.is_some();
            if !console.ip().is_loopback() && !token && self.console_sasl_mechanism.is_none() {
                return bad(
                    "console_listen",
                    "serving the console beyond loopback needs metrics_token, \
                     metrics_token_file or console_sasl_mechanism (its actions move \
                     partitions and drain brokers)",
                );
            }
        }
        if let Some(mechanism) = &self.console_sasl_mechanism {
            if strata_client::SaslMechanism::parse(mechanism).is_none() {
                return bad(
                    "console_sasl_mechanism",
                    "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
                );
            }
        }
        self.check_inter_broker()?;
        // Sent to clients as 32-bit milliseconds; an interval not below the session would
        // expire members between two heartbeats.
        if self.group_consumer_session_timeout.is_zero()
            || self.group_consumer_session_timeout.as_millis() > i32::MAX as u128
        {
            return bad(
                "group_consumer_session_timeout",
                "must be between 1ms and 24d",
            );
        }
        if self.group_consumer_heartbeat_interval.is_zero()
            || self.group_consumer_heartbeat_interval >= self.group_consumer_session_timeout
        {
            return bad(
                "group_consumer_heartbeat_interval",
                "must be more than 0 and less than group_consumer_session_timeout",
            );
        }
        if self.group_share_session_timeout.is_zero()
            || self.group_share_session_timeout.as_millis() > i32::MAX as u128
        {
            return bad("group_share_session_timeout", "must be between 1ms and 24d");
        }
        if self.group_share_heartbeat_interval.is_zero()
            || self.group_share_heartbeat_interval >= self.group_share_session_timeout
        {
            return bad(
                "group_share_heartbeat_interval",
                "must be more than 0 and less than group_share_session_timeout",
            );
        }
        // Sent to clients as 32-bit milliseconds (acquisition_lock_timeout_ms).
        if self.group_share_record_lock_duration.is_zero()
            || self.group_share_record_lock_duration.as_millis() > i32::MAX as u128
        {
            return bad(
                "group_share_record_lock_duration",
                "must be between 1ms and 24d",
            );
        }
        // Kafka's bounds for group.share.delivery.count.limit (2..=10).
        if !(2..=10).contains(&self.group_share_delivery_count_limit) {
            return bad(
                "group_share_delivery_count_limit",
                "must be between 2 and 10",
            );
        }
        // Kafka's bounds for group.share.partition.max.record.locks (100..=10000).
        if !(100..=10_000).contains(&self.group_share_partition_max_record_locks) {
            return bad(
                "group_share_partition_max_record_locks",
                "must be between 100 and 10000",
            );
        }
        for (name, value) in [
            ("group_share_max_groups", self.group_share_max_groups),
            ("group_share_max_size", self.group_share_max_size),
            (
                "group_share_max_share_sessions",
                self.group_share_max_share_sessions,
            ),
            (
                "group_share_max_partitions",
                self.group_share_max_partitions,
            ),
        ] {
            if !(1..=100_000).contains(&value) {
                return bad(name, "must be between 1 and 100000");
            }
        }
        if strata_broker::MigrationPolicy::parse(&self.group_consumer_migration_policy).is_none() {
            return bad(
                "group_consumer_migration_policy",
                "must be bidirectional, upgrade, downgrade or disabled",
            );
        }
        if strata_broker::share::ShareAutoOffsetReset::parse(&self.share_auto_offset_reset)
            .is_none()
        {
            return bad(
                "share_auto_offset_reset",
                "must be latest, earliest or by_duration:<ISO-8601 duration> (e.g. by_duration:PT1H)",
            );
        }
        if !(1..=MAX_GROUP_SHARDS).contains(&self.txn_shards) {
            return bad(
                "txn_shards",
                &format!("must be between 1 and {MAX_GROUP_SHARDS}"),
            );
        }
        // Kafka sends timeouts as i32 milliseconds.
        if self.transaction_max_timeout.is_zero()
            || self.transaction_max_timeout.as_millis() > i32::MAX as u128
        {
            return bad(
                "transaction_max_timeout",
                "must be more than 0 and at most 2147483647ms",
            );
        }
        if self.transaction_abort_timed_out_interval.is_zero() {
            return bad(
                "transaction_abort_timed_out_interval",
                "must be more than 0",
            );
        }
        if self.transactional_id_expiration.is_zero() {
            return bad("transactional_id_expiration", "must be more than 0");
        }
        if self.offsets_commit_timeout.is_zero() {
            return bad("offsets_commit_timeout", "must be more than 0");
        }
        if self.txn_marker_timeout.is_zero() {
            return bad("txn_marker_timeout", "must be more than 0");
        }
        // A full cache is searched linearly for a session to evict, once per full fetch
        // that asks for a session; Kafka's own default is 1000.
        if self.max_incremental_fetch_session_cache_slots > 100_000 {
            return bad(
                "max_incremental_fetch_session_cache_slots",
                "must be at most 100000",
            );
        }
        // Zero would fail every handover and shutdown at once, losing nothing but availability.
        if self.log.handover_timeout.is_zero() {
            return bad("log.handover_timeout", "must be more than 0");
        }
        if self.log.shutdown_timeout.is_zero() {
            return bad("log.shutdown_timeout", "must be more than 0");
        }
        // Zero would list our stream in a tight loop.
        if self.standalone_seal_check.is_zero() {
            return bad("standalone_seal_check", "must be more than 0");
        }
        // A lease must survive a few lost heartbeats, or a busy broker is declared dead.
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval * 2 > self.lease_period {
            return bad(
                "heartbeat_interval",
                "must be more than 0 and at most half of lease_period",
            );
        }
        // A zero period would spin; a round slower than the lease would let ownership decisions
        // lag behind liveness (a broker judged dead long before anyone acts on it).
        if let Some(round) = self.ownership_interval {
            if round.is_zero() || round * 2 > self.lease_period {
                return bad(
                    "ownership_interval",
                    "must be more than 0 and at most half of lease_period",
                );
            }
        }
        if self.cluster_id.is_empty() {
            return bad("cluster_id", "must not be empty");
        }
        if let Some(advertised) = &self.advertised_listener {
            parse_host_port(advertised).map_err(|message| SettingsError::Value {
                key: "advertised_listener".to_string(),
                message,
            })?;
        }
        self.validate_security()
    }

    /// The write-ahead tier, if set, must be durable like `storage`, and in cluster mode
    /// reachable by every broker that can reach the bulk tier: a takeover replays the deposed
    /// owner's write-ahead objects, so a broker on another machine that could read the bulk
    /// tier but not the write-ahead tier would take partitions over without their tails.
    fn validate_tiers(&self) -> Result<(), SettingsError> {
        let Some(wal) = &self.wal_storage else {
            return Ok(());
        };
        if wal.trim().is_empty() {
            return Err(SettingsError::Value {
                key: "wal_storage".into(),
                message: "is empty: leave it unset for one storage".into(),
            });
        }
        if is_ephemeral(wal) && !self.ephemeral_storage_ok {
            return Err(SettingsError::Invalid(format!(
                "wal_storage {wal:?} keeps the write-ahead tier in this process's memory: \
                 acknowledged records are lost when it exits. Set ephemeral_storage_ok = true \
                 (--ephemeral-storage-ok) to run on it anyway, e.g. for tests"
            )));
        }
        if self.cluster && reach(wal) < reach(&self.storage) {
            return Err(SettingsError::Invalid(format!(
                "wal_storage {wal:?} can be read only {} but storage {:?} can be read {}: in \
                 cluster mode a broker there could take this broker's partitions over without \
                 reading its write-ahead objects, losing acknowledged records. Put the \
                 write-ahead tier on storage every broker reaches (rados://, s3://), or run a \
                 single broker with cluster = false (--cluster false)",
                reach(wal).describe(),
                self.storage,
                reach(&self.storage).describe(),
            )));
        }
        Ok(())
    }

    fn validate_security(&self) -> Result<(), SettingsError> {
        let bad = |key: &str, message: String| {
            Err(SettingsError::Value {
                key: key.to_string(),
                message,
            })
        };
        if self.listeners.is_some() && self.advertised_listener.is_some() {
            return bad(
                "advertised_listener",
                "is for the single `listen` listener; with `listeners` set, use \
                 advertised_listeners"
                    .into(),
            );
        }
        let specs = self.listener_specs()?;
        if specs.iter().any(|s| s.protocol.uses_tls())
            && (self.ssl_certificate.is_none() || self.ssl_key.is_none())
        {
            return bad(
                "ssl_certificate",
                "an SSL or SASL_SSL listener needs ssl_certificate and ssl_key".into(),
            );
        }
        let client_auth = self.ssl_client_auth_modes(&specs)?;
        if client_auth
            .iter()
            .any(|(_, mode)| *mode != strata_broker::security::tls::ClientAuth::None)
            && self.ssl_truststore.is_none()
        {
            return bad(
                "ssl_truststore",
                "ssl_client_auth requested or required needs ssl_truststore (the CAs client \
                 certificates must chain to)"
                    .into(),
            );
        }
        if let Err(e) = strata_broker::security::principal_mapping::PrincipalMapper::parse(
            &self.ssl_principal_mapping_rules,
        ) {
            return bad("ssl_principal_mapping_rules", e.to_string());
        }
        if self.ssl_reload_interval.is_zero() {
            return bad("ssl_reload_interval", "must be more than 0".into());
        }
        if self.sasl_mechanisms().iter().any(|m| m == "OAUTHBEARER")
            && self.sasl_oauthbearer_jwks_file.is_none()
        {
            return bad(
                "sasl_oauthbearer_jwks_file",
                "OAUTHBEARER in sasl_enabled_mechanisms needs the keys to check tokens against"
                    .into(),
            );
        }
        if self.sasl_oauthbearer_sub_claim_name.trim().is_empty() {
            return bad(
                "sasl_oauthbearer_sub_claim_name",
                "must name a claim".into(),
            );
        }
        let mechanisms = self.sasl_mechanisms();
        if mechanisms.is_empty() {
            return bad("sasl_enabled_mechanisms", "names no mechanism".into());
        }
        for mechanism in &mechanisms {
            if !strata_broker::security::MECHANISMS.contains(&mechanism.as_str()) {
                return bad(
                    "sasl_enabled_mechanisms",
                    format!(
                        "{mechanism} is not PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"
                    ),
                );
            }
        }
        if self.authentication_timeout.is_zero() {
            return bad("authentication_timeout", "must be more than 0".into());
        }
        if self.sasl_user_cache_entries == 0 {
            return bad("sasl_user_cache_entries", "must be at least 1".into());
        }
        if !matches!(self.authorizer.as_str(), "none" | "acl") {
            return bad(
                "authorizer",
                format!("`{}` is not `none` or `acl`", self.authorizer),
            );
        }
        for user in self.super_user_list() {
            if !matches!(user.split_once(':'), Some((kind, name)) if !kind.is_empty() && !name.is_empty())
            {
                return bad(
                    "super_users",
                    format!("`{user}` is not a principal like User:admin"),
                );
            }
        }
        if self.acl_refresh_interval.is_zero() {
            return bad("acl_refresh_interval", "must be more than 0".into());
        }
        if self.quota_window_num < 2 {
            return bad("quota_window_num", "must be at least 2".into());
        }
        if self.quota_window_size.is_zero() {
            return bad("quota_window_size", "must be more than 0".into());
        }
        if self.quota_max_tracked == 0 {
            return bad("quota_max_tracked", "must be at least 1".into());
        }
        if self.quota_refresh_interval.is_zero() {
            return bad("quota_refresh_interval", "must be more than 0".into());
        }
        Ok(())
    }

    /// `super_users` as a list.
    pub fn super_user_list(&self) -> Vec<String> {
        self.super_users
            .split(';')
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// The broker's authorizer: None for `authorizer = none`.
    pub fn authorizer_config(&self) -> Option<strata_broker::security::acl::AuthorizerConfig> {
        (self.authorizer == "acl").then(|| strata_broker::security::acl::AuthorizerConfig {
            super_users: self.super_user_list(),
            allow_everyone_if_no_acl_found: self.allow_everyone_if_no_acl_found,
        })
    }

    /// The listeners to bind: `listeners` if set, else one PLAINTEXT listener on `listen`.
    pub fn listener_specs(&self) -> Result<Vec<crate::listeners::ListenerSpec>, SettingsError> {
        let Some(listeners) = &self.listeners else {
            return Ok(vec![crate::listeners::ListenerSpec {
                name: "PLAINTEXT".to_string(),
                protocol: strata_broker::security::SecurityProtocol::Plaintext,
                bind: self.listen,
                advertised: None,
            }]);
        };
        crate::listeners::parse(
            listeners,
            self.advertised_listeners.as_deref(),
            &self.listener_security_protocol_map,
        )
        .map_err(|(key, message)| SettingsError::Value {
            key: key.to_string(),
            message,
        })
    }

    /// The inter-broker settings name a listener brokers can use, and a whole login.
    fn check_inter_broker(&self) -> Result<(), SettingsError> {
        use strata_broker::security::SecurityProtocol;
        let bad = |key: &str, message: String| {
            Err(SettingsError::Value {
                key: key.to_string(),
                message,
            })
        };
        match (
            &self.inter_broker_sasl_mechanism,
            &self.inter_broker_sasl_username,
        ) {
            (Some(mechanism), Some(_)) => {
                if strata_client::SaslMechanism::parse(mechanism).is_none() {
                    return bad(
                        "inter_broker_sasl_mechanism",
                        "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512".into(),
                    );
                }
            }
            (None, None) => {}
            (Some(_), None) => {
                return bad(
                    "inter_broker_sasl_username",
                    "is needed with inter_broker_sasl_mechanism".into(),
                )
            }
            (None, Some(_)) => {
                return bad(
                    "inter_broker_sasl_mechanism",
                    "is needed with inter_broker_sasl_username".into(),
                )
            }
        }
        let Some(name) = &self.inter_broker_listener_name else {
            return Ok(());
        };
        let specs = self.listener_specs()?;
        let Some(spec) = specs.iter().find(|s| &s.name == name) else {
            return bad(
                "inter_broker_listener_name",
                format!("names no listener ({name})"),
            );
        };
        let login = self.inter_broker_sasl_mechanism.is_some();
        match spec.protocol {
            // TLS listeners cannot start without ssl_certificate and ssl_key, which brokers
            // also present as clients (with ssl_truststore, or the system's, to trust).
            SecurityProtocol::Plaintext | SecurityProtocol::Ssl => Ok(()),
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl if login => Ok(()),
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl => bad(
                "inter_broker_listener_name",
                format!(
                    "{name} needs a login: set inter_broker_sasl_mechanism and \
                     inter_broker_sasl_username (and STRATA_INTER_BROKER_SASL_PASSWORD)"
                ),
            ),
        }
    }

    /// Each TLS listener's `ssl_client_auth` mode, by listener name.
    pub fn ssl_client_auth_modes(
        &self,
        specs: &[crate::listeners::ListenerSpec],
    ) -> Result<Vec<(String, strata_broker::security::tls::ClientAuth)>, SettingsError> {
        use strata_broker::security::tls::ClientAuth;
        let bad = |message: String| SettingsError::Value {
            key: "ssl_client_auth".to_string(),
            message,
        };
        let text = self.ssl_client_auth.trim();
        let tls = specs.iter().filter(|s| s.protocol.uses_tls());
        if let Some(mode) = ClientAuth::from_name(text) {
            return Ok(tls.map(|s| (s.name.clone(), mode)).collect());
        }
        let mut named = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, mode) = entry.split_once(':').ok_or_else(|| {
                bad(format!(
                    "{entry:?} is not none, requested, required or NAME:MODE"
                ))
            })?;
            let mode = ClientAuth::from_name(mode.trim()).ok_or_else(|| {
                bad(format!(
                    "{entry:?}: {mode:?} is not none, requested or required"
                ))
            })?;
            let name = name.trim().to_ascii_uppercase();
            match specs.iter().find(|s| s.name == name) {
                Some(spec) if spec.protocol.uses_tls() => {}
                Some(_) => return Err(bad(format!("listener {name} is not SSL or SASL_SSL"))),
                None => return Err(bad(format!("there is no listener {name}"))),
            }
            if named.iter().any(|(n, _)| *n == name) {
                return Err(bad(format!("listener {name} is named twice")));
            }
            named.push((name, mode));
        }
        Ok(tls
            .map(|s| {
                let mode = named
                    .iter()
                    .find(|(n, _)| *n == s.name)
                    .map_or(ClientAuth::None, |(_, m)| *m);
                (s.name.clone(), mode)
            })
            .collect())
    }

    /// The OAUTHBEARER token checks, when the mechanism is enabled.
    pub fn oauth_settings(&self) -> Option<strata_broker::security::oauth::OAuthSettings> {
        self.sasl_mechanisms()
            .iter()
            .any(|m| m == "OAUTHBEARER")
            .then(|| strata_broker::security::oauth::OAuthSettings {
                expected_issuer: self.sasl_oauthbearer_expected_issuer.clone(),
                expected_audience: self
                    .sasl_oauthbearer_expected_audience
                    .split(',')
                    .map(|a| a.trim().to_string())
                    .filter(|a| !a.is_empty())
                    .collect(),
                clock_skew: self.sasl_oauthbearer_clock_skew,
                sub_claim_name: self.sasl_oauthbearer_sub_claim_name.trim().to_string(),
            })
    }

    /// `sasl_enabled_mechanisms` as a list.
    pub fn sasl_mechanisms(&self) -> Vec<String> {
        self.sasl_enabled_mechanisms
            .split(',')
            .map(|m| m.trim().to_ascii_uppercase())
            .filter(|m| !m.is_empty())
            .collect()
    }
}

/// The storage location as DescribeLogDirs names the broker's one log directory: the URL
/// without user information or query (where credentials and endpoint options go), so nothing
/// secret reaches a client. A plain path is kept as it is.
pub fn log_dir_name(storage: &str) -> String {
    let Some((scheme, rest)) = storage.split_once("://") else {
        return storage.to_string();
    };
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{path}")
}

/// Who can read a storage: a tier is shared exactly as far as this reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// `memory://`: this process.
    Process,
    /// A local directory: processes on this machine.
    Machine,
    /// S3, RADOS or any other network store.
    Network,
}

impl Reach {
    fn describe(self) -> &'static str {
        match self {
            Reach::Process => "by this process",
            Reach::Machine => "on this machine",
            Reach::Network => "over the network",
        }
    }
}

fn url_scheme_or_file(url: &str) -> String {
    strata_storage::url_scheme(url).unwrap_or_else(|| "file".into())
}

pub fn reach(storage: &str) -> Reach {
    match strata_storage::url_scheme(storage).as_deref() {
        Some("memory") => Reach::Process,
        None | Some("file") => Reach::Machine,
        Some(_) => Reach::Network,
    }
}

/// Whether a storage URL names the in-process memory backend, which loses everything on exit.
pub fn is_ephemeral(storage: &str) -> bool {
    strata_storage::url_scheme(storage).as_deref() == Some("memory")
}

/// Upper bound of `group_max_size`: Kafka's own limit (a member count is an int32 on the wire).
const MAX_GROUP_SIZE: usize = i32::MAX as usize;

/// Upper bound of `group_shards`: each shard is a partition and a task replayed at startup; more
/// than Kafka's own default by a wide margin is a typo, not a plan.
const MAX_GROUP_SHARDS: i32 = 1000;

/// Splits `host:port` (IPv6 hosts in brackets).
pub fn parse_host_port(text: &str) -> Result<(String, u16), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not host:port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{text:?} has no host"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{text:?}: {port:?} is not a port number"))?;
    if port == 0 {
        return Err(format!("{text:?}: port 0 cannot be advertised"));
    }
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_topic_partitions_limit_defaults_to_kafkas_and_refuses_zero() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.max_request_partition_size_limit, 2000);
        let (s, _) = load(
            None,
            env(&[("STRATA_MAX_REQUEST_PARTITION_SIZE_LIMIT", "50")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.max_request_partition_size_limit, 50);
        let flags = FlagOverrides {
            max_request_partition_size_limit: Some(0),
            ..FlagOverrides::default()
        };
        let e = load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(e.contains("max_request_partition_size_limit"), "{e}");
    }

    #[test]
    fn log_dir_names_carry_no_credentials() {
        assert_eq!(log_dir_name("./strata-data"), "./strata-data");
        assert_eq!(
            log_dir_name("file:///var/lib/strata"),
            "file:///var/lib/strata"
        );
        assert_eq!(
            log_dir_name("s3://strata/run1?endpoint=http://127.0.0.1:9310&secret_access_key=x"),
            "s3://strata/run1"
        );
        assert_eq!(
            log_dir_name("s3://key:secret@strata/prefix"),
            "s3://strata/prefix"
        );
        assert_eq!(log_dir_name("rados://pool?user=admin"), "rados://pool");
    }
    use std::io::Write;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn byte_sizes_accept_integers_and_units() {
        assert_eq!(ByteSize::parse("100").unwrap(), ByteSize(100));
        assert_eq!(ByteSize::parse("64MiB").unwrap(), ByteSize(64 << 20));
        assert_eq!(ByteSize::parse("1GB").unwrap(), ByteSize(1_000_000_000));
        assert_eq!(ByteSize::parse("512 kib").unwrap(), ByteSize(512 << 10));
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("MiB").is_err());
        assert!(ByteSize::parse("99999999999TiB").is_err());
        assert_eq!(ByteSize(100 << 20).to_string(), "100MiB");
    }

    #[test]
    fn defaults_without_file_env_or_flags() {
        let (s, unknown) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.listen, "127.0.0.1:9092".parse().unwrap());
        assert_eq!(s.node_id, None);
        assert_eq!(s.storage, "./strata-data");
        assert!(s.auto_create_topics);
        assert_eq!(s.max_request_bytes, ByteSize(100 << 20));
        assert_eq!(s.group_shards, 8);
        assert_eq!(s.group_initial_rebalance_delay, Duration::from_secs(3));
        assert_eq!(s.group_min_session_timeout, Duration::from_secs(6));
        assert_eq!(s.group_max_session_timeout, Duration::from_secs(1800));
        assert!(unknown.is_empty());
    }

    #[test]
    fn resource_limits_have_defaults_and_are_validated() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.queued_max_request_bytes, ByteSize(256 << 20));
        assert_eq!(s.max_connections_per_ip, 1024);
        assert_eq!(s.connections_max_idle, Duration::from_secs(600));
        assert_eq!(s.request_read_timeout, Duration::from_secs(30));
        assert_eq!(s.auto_create_topics_per_request, 100);
        assert_eq!(s.auto_create_topics_per_second, 100);
        assert_eq!(s.default_replication_factor, 1);
        assert_eq!(s.metrics_max_connections, 64);
        let f = file("max_request_bytes = \"100MiB\"\nqueued_max_request_bytes = \"64MiB\"\n");
        let e = load(Some(f.path()), env(&[]), &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("queued_max_request_bytes"), "{e}");
        let e = load(
            None,
            env(&[("STRATA_CONNECTIONS_MAX_IDLE", "0s")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("connections_max_idle"), "{e}");
        let flags = FlagOverrides {
            auto_create_topics_per_second: Some(0),
            ..Default::default()
        };
        let e = load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(e.contains("auto_create_topics_per_second"), "{e}");
    }

    #[test]
    fn default_replication_factor_comes_from_every_layer_and_is_checked() {
        let s = load(
            None,
            env(&[("STRATA_DEFAULT_REPLICATION_FACTOR", "3")]),
            &FlagOverrides::default(),
        )
        .unwrap()
        .0;
        assert_eq!(s.default_replication_factor, 3);
        let flags = FlagOverrides {
            default_replication_factor: Some(2),
            ..Default::default()
        };
        assert_eq!(
            load(None, env(&[]), &flags)
                .unwrap()
                .0
                .default_replication_factor,
            2
        );
        let flags = FlagOverrides {
            default_replication_factor: Some(0),
            ..Default::default()
        };
        let e = load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(e.contains("default_replication_factor"), "{e}");
    }

    #[test]
    fn fetch_session_settings_have_kafkas_defaults_and_are_read_and_validated() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.max_incremental_fetch_session_cache_slots, 1000);
        assert_eq!(s.max_incremental_fetch_session_partitions, 1_000_000);
        assert_eq!(
            s.min_incremental_fetch_session_eviction,
            Duration::from_secs(120)
        );
        let f = file(
            "max_incremental_fetch_session_cache_slots = 10\n\
             min_incremental_fetch_session_eviction = \"30s\"\n",
        );
        let vars = env(&[("STRATA_MAX_INCREMENTAL_FETCH_SESSION_PARTITIONS", "500")]);
        let (s, unknown) = load(Some(f.path()), vars, &FlagOverrides::default()).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(s.max_incremental_fetch_session_cache_slots, 10);
        assert_eq!(s.max_incremental_fetch_session_partitions, 500);
        assert_eq!(
            s.min_incremental_fetch_session_eviction,
            Duration::from_secs(30)
        );
        let vars = env(&[("STRATA_MAX_INCREMENTAL_FETCH_SESSION_CACHE_SLOTS", "100001")]);
        let e = load(None, vars, &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_incremental_fetch_session_cache_slots"),
            "{e}"
        );
    }

    #[test]
    fn precedence_is_defaults_file_env_flags() {
        let f = file(
            "node_id = 1\ncluster_id = \"from-file\"\nstorage = \"/tmp/a\"\n\
             [log]\nflush_interval = \"5ms\"\ncache_bytes = \"1GiB\"\n",
        );
        let flags = FlagOverrides {
            storage: Some("memory://".into()),
            ephemeral_storage_ok: Some(true),
            ..Default::default()
        };
        let (s, _) = load(
            Some(f.path()),
            env(&[
                ("STRATA_CLUSTER_ID", "from-env"),
                ("STRATA_STORAGE", "/tmp/b"),
                ("STRATA_LOG_FLUSH_BYTES", "2MiB"),
                ("STRATA_LOG_FLUSH_WHEN_IDLE", "false"),
                ("HOME", "/root"),
            ]),
            &flags,
        )
        .unwrap();
        assert_eq!(s.node_id, Some(1));
        assert_eq!(s.cluster_id, "from-env");
        assert_eq!(s.storage, "memory://");
        assert_eq!(s.log.flush_interval, Some(Duration::from_millis(5)));
        assert_eq!(s.log.cache_bytes, ByteSize(1 << 30));
        assert_eq!(s.log.flush_bytes, Some(ByteSize(2 << 20)));
        assert_eq!(s.log.flush_when_idle, Some(false));
    }

    #[test]
    fn memory_storage_needs_the_ephemeral_opt_in() {
        for storage in ["memory://", "memory://named", "MEMORY://"] {
            let flags = FlagOverrides {
                storage: Some(storage.into()),
                ..Default::default()
            };
            let e = load(None, env(&[]), &flags).unwrap_err().to_string();
            assert!(e.contains("ephemeral_storage_ok"), "{e}");
            assert!(e.contains("--ephemeral-storage-ok"), "{e}");
            let (s, _) = load(
                None,
                env(&[("STRATA_EPHEMERAL_STORAGE_OK", "true")]),
                &flags,
            )
            .unwrap();
            assert!(s.ephemeral_storage_ok);
        }
        let f = file("storage = \"memory://\"\nephemeral_storage_ok = true\n");
        load(Some(f.path()), env(&[]), &FlagOverrides::default()).unwrap();
        // Durable storage needs nothing.
        let flags = FlagOverrides {
            storage: Some("file:///tmp/strata".into()),
            ..Default::default()
        };
        load(None, env(&[]), &flags).unwrap();
    }

    #[test]
    fn a_write_ahead_tier_is_set_like_storage_and_must_reach_as_far_in_cluster_mode() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.wal_storage, None, "one storage by default");
        assert_eq!(s.tier_schemes(), ("file".to_string(), "file".to_string()));

        // Every layer sets it; validation runs on the result.
        let f = file("storage = \"s3://b/p\"\nwal_storage = \"rados://fast\"\n");
        let (s, _) = load(Some(f.path()), env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.wal_storage.as_deref(), Some("rados://fast"));
        assert_eq!(s.tier_schemes(), ("rados".to_string(), "s3".to_string()));
        // Group commits tuned for the write-ahead tier, segments for the bulk tier.
        let (wal, bulk) = s.tier_schemes();
        let config = s.log.to_log_config(&wal, &bulk).unwrap();
        let rados = BackendProfile::for_scheme("rados");
        let s3 = BackendProfile::for_scheme("s3");
        assert_eq!(config.flush_interval, rados.flush_interval);
        assert!(config.flush_when_idle && !s3.flush_when_idle);
        assert_eq!(config.segment_bytes as u64, s3.segment_bytes);
        let (s, _) = load(
            None,
            env(&[("STRATA_WAL_STORAGE", "/var/wal")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.wal_storage.as_deref(), Some("/var/wal"));

        // A machine-local write-ahead tier under network bulk storage, in cluster mode: a
        // broker elsewhere could take over without the write-ahead objects.
        for (wal, storage) in [
            ("/var/wal", "s3://b/p"),
            ("file:///var/wal", "rados://pool"),
        ] {
            let flags = FlagOverrides {
                storage: Some(storage.into()),
                wal_storage: Some(wal.into()),
                ..Default::default()
            };
            let e = load(None, env(&[]), &flags).unwrap_err().to_string();
            assert!(e.contains("wal_storage") && e.contains("cluster"), "{e}");
            // Standalone it is a single-broker deployment, allowed.
            let standalone = FlagOverrides {
                cluster: Some(false),
                ..flags
            };
            load(None, env(&[]), &standalone).unwrap();
        }
        // Shared at least as widely as the bulk tier: fine in cluster mode.
        for (wal, storage) in [
            ("rados://fast", "s3://b/p"),
            ("/var/wal", "/var/bulk"),
            ("s3://fast/p", "/var/bulk"),
        ] {
            let flags = FlagOverrides {
                storage: Some(storage.into()),
                wal_storage: Some(wal.into()),
                ..Default::default()
            };
            load(None, env(&[]), &flags).unwrap();
        }
        // Memory needs the same opt-in as for storage; empty is a mistake.
        let flags = FlagOverrides {
            wal_storage: Some("memory://w".into()),
            cluster: Some(false),
            ..Default::default()
        };
        let e = load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(e.contains("ephemeral_storage_ok"), "{e}");
        let flags = FlagOverrides {
            wal_storage: Some(" ".into()),
            ..Default::default()
        };
        assert!(load(None, env(&[]), &flags).is_err());
    }

    #[test]
    fn s3_request_prices_default_to_s3_standard_and_must_be_numbers() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.s3_price_per_1000_put_requests, 0.005);
        assert_eq!(s.s3_price_per_1000_get_requests, 0.0004);
        let (s, _) = load(
            None,
            env(&[
                ("STRATA_S3_PRICE_PER_1000_PUT_REQUESTS", "0.0045"),
                ("STRATA_S3_PRICE_PER_1000_GET_REQUESTS", "0"),
            ]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.s3_price_per_1000_put_requests, 0.0045);
        assert_eq!(s.s3_price_per_1000_get_requests, 0.0);
        for value in ["cheap", "-1", "NaN"] {
            let refused = load(
                None,
                env(&[("STRATA_S3_PRICE_PER_1000_PUT_REQUESTS", value)]),
                &FlagOverrides::default(),
            );
            assert!(refused.is_err(), "{value}");
        }
    }

    #[test]
    fn the_uncompacted_tail_bound_defaults_and_must_hold_two_segments() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        let config = s.log.to_log_config("file", "s3").unwrap();
        assert_eq!(config.max_uncompacted_bytes, 1 << 30);
        assert_eq!(config.max_uncompacted_batches, 1_000_000);
        let (s, _) = load(
            None,
            env(&[
                ("STRATA_LOG_MAX_UNCOMPACTED_BYTES", "100MiB"),
                ("STRATA_LOG_MAX_UNCOMPACTED_BATCHES", "5000"),
            ]),
            &FlagOverrides::default(),
        )
        .unwrap();
        // 100 MiB holds six 16 MiB local segments but not two of S3's 64 MiB ones.
        let config = s.log.to_log_config("file", "file").unwrap();
        assert_eq!(config.max_uncompacted_bytes, 100 << 20);
        assert_eq!(config.max_uncompacted_batches, 5000);
        let err = s.log.to_log_config("file", "s3").unwrap_err().to_string();
        assert!(err.contains("log.max_uncompacted_bytes"), "{err}");
        let refused = load(
            None,
            env(&[("STRATA_LOG_MAX_UNCOMPACTED_BATCHES", "10")]),
            &FlagOverrides::default(),
        );
        assert!(refused.is_err());
    }

    #[test]
    fn catch_up_reads_have_a_window_by_bulk_backend_and_a_validated_budget() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        let local = s.log.to_log_config("file", "file").unwrap();
        assert_eq!(local.read_ahead_bytes, 0, "read-ahead windows are opt-in");
        assert_eq!(local.read_ahead_memory_bytes, 64 << 20);
        assert_eq!(local.catchup_max_concurrent_reads, 8);
        assert_eq!(local.catchup_io_max_bytes_per_second, u64::MAX);
        let (s, _) = load(
            None,
            env(&[
                ("STRATA_LOG_READ_AHEAD_BYTES", "4MiB"),
                ("STRATA_LOG_READ_AHEAD_MEMORY_BYTES", "16MiB"),
                ("STRATA_LOG_CATCHUP_MAX_CONCURRENT_READS", "2"),
                ("STRATA_LOG_CATCHUP_IO_MAX_BYTES_PER_SECOND", "50MB"),
            ]),
            &FlagOverrides::default(),
        )
        .unwrap();
        let config = s.log.to_log_config("file", "s3").unwrap();
        assert_eq!(config.read_ahead_bytes, 4 << 20);
        assert_eq!(config.read_ahead_memory_bytes, 16 << 20);
        assert_eq!(config.catchup_max_concurrent_reads, 2);
        assert_eq!(config.catchup_io_max_bytes_per_second, 50_000_000);
        for (key, value) in [
            ("STRATA_LOG_CATCHUP_MAX_CONCURRENT_READS", "0"),
            ("STRATA_LOG_CATCHUP_IO_MAX_BYTES_PER_SECOND", "0"),
            ("STRATA_LOG_READ_AHEAD_BYTES", "5GiB"),
        ] {
            let refused = load(None, env(&[(key, value)]), &FlagOverrides::default());
            assert!(refused.is_err(), "{key}={value}");
        }
    }

    #[test]
    fn decompression_bounds_have_defaults_and_are_validated() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.log.max_decompressed_batch_bytes, ByteSize(64 << 20));
        let config = s.log.to_log_config("file", "file").unwrap();
        assert_eq!(config.max_decompressed_batch_bytes, 64 << 20);
        assert!(config.max_concurrent_decompressions >= 1);
        let (s, _) = load(
            None,
            env(&[
                ("STRATA_LOG_MAX_DECOMPRESSED_BATCH_BYTES", "256MiB"),
                ("STRATA_LOG_MAX_CONCURRENT_DECOMPRESSIONS", "3"),
            ]),
            &FlagOverrides::default(),
        )
        .unwrap();
        let config = s.log.to_log_config("file", "file").unwrap();
        assert_eq!(config.max_decompressed_batch_bytes, 256 << 20);
        assert_eq!(config.max_concurrent_decompressions, 3);
        for (var, value, key) in [
            (
                "STRATA_LOG_MAX_DECOMPRESSED_BATCH_BYTES",
                "64KiB",
                "max_decompressed_batch_bytes",
            ),
            (
                "STRATA_LOG_MAX_CONCURRENT_DECOMPRESSIONS",
                "0",
                "max_concurrent_decompressions",
            ),
        ] {
            let e = load(None, env(&[(var, value)]), &FlagOverrides::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn unknown_file_keys_are_rejected_by_name() {
        let f = file("listen = \"127.0.0.1:9092\"\nmax_conections = 5\n");
        let e = load(Some(f.path()), env(&[]), &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_conections"), "{e}");
        let f = file("[log]\nflush_intervall = \"1ms\"\n");
        let e = load(Some(f.path()), env(&[]), &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("flush_intervall"), "{e}");
    }

    #[test]
    fn bad_values_name_their_source() {
        let f = file("[log]\nflush_interval = \"soon\"\n");
        let e = load(Some(f.path()), env(&[]), &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("flush_interval"), "{e}");

        let e = load(
            None,
            env(&[("STRATA_NODE_ID", "seven")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("STRATA_NODE_ID"), "{e}");

        let e = load(
            None,
            env(&[("STRATA_MAX_REQUEST_BYTES", "lots")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("STRATA_MAX_REQUEST_BYTES"), "{e}");

        let flags = FlagOverrides {
            listen: Some("not an address".into()),
            ..Default::default()
        };
        let e = load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(e.contains("--listen"), "{e}");
    }

    #[test]
    fn hand_set_node_ids_stay_below_the_allocated_range_in_cluster_mode() {
        let (s, _) = load(
            None,
            env(&[("STRATA_NODE_ID", "1000")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.node_id, Some(1000));
        let e = load(
            None,
            env(&[("STRATA_NODE_ID", "1001")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("node_id") && e.contains("1000"), "{e}");
        // Standalone, there is nothing to allocate and any id goes.
        let (s, _) = load(
            None,
            env(&[("STRATA_NODE_ID", "5000"), ("STRATA_CLUSTER", "false")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.node_id, Some(5000));
        let e = load(
            None,
            env(&[("STRATA_NODE_ID", "-1")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("node_id"), "{e}");
    }

    #[test]
    fn unknown_strata_variables_are_reported_not_fatal() {
        let (_, unknown) = load(
            None,
            env(&[("STRATA_LISTN", "x")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(unknown, vec!["STRATA_LISTN".to_string()]);
    }

    #[test]
    fn group_settings_come_from_every_layer_and_are_checked() {
        let f = file("group_shards = 3\ngroup_initial_rebalance_delay = \"100ms\"\n");
        let flags = FlagOverrides {
            group_initial_rebalance_delay: Some("0s".into()),
            group_max_size: Some(50),
            ..Default::default()
        };
        let (s, _) = load(
            Some(f.path()),
            env(&[("STRATA_GROUP_MIN_SESSION_TIMEOUT", "1s")]),
            &flags,
        )
        .unwrap();
        assert_eq!(s.group_shards, 3);
        assert_eq!(s.group_max_size, 50);
        assert_eq!(s.group_initial_rebalance_delay, Duration::ZERO);
        assert_eq!(s.group_min_session_timeout, Duration::from_secs(1));

        let f = file("group_shards = 0\n");
        let e = load(Some(f.path()), env(&[]), &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("group_shards"), "{e}");
        let e = load(
            None,
            env(&[("STRATA_GROUP_MAX_SIZE", "0")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("group_max_size"), "{e}");
        let e = load(
            None,
            env(&[("STRATA_GROUP_MIN_SESSION_TIMEOUT", "2h")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("group_min_session_timeout"), "{e}");
        let flags = FlagOverrides {
            group_max_session_timeout: Some("whenever".into()),
            ..Default::default()
        };
        let e = load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(e.contains("--group-max-session-timeout"), "{e}");
    }

    #[test]
    fn kip848_group_timings_have_kafkas_defaults_and_are_checked() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.group_consumer_session_timeout, Duration::from_secs(45));
        assert_eq!(s.group_consumer_heartbeat_interval, Duration::from_secs(5));
        let f = file("group_consumer_session_timeout = \"3s\"\n");
        let flags = FlagOverrides {
            group_consumer_heartbeat_interval: Some("200ms".into()),
            ..Default::default()
        };
        let (s, _) = load(Some(f.path()), env(&[]), &flags).unwrap();
        assert_eq!(s.group_consumer_session_timeout, Duration::from_secs(3));
        assert_eq!(
            s.group_consumer_heartbeat_interval,
            Duration::from_millis(200)
        );
        // An interval not below the session would expire members between heartbeats.
        let e = load(
            None,
            env(&[("STRATA_GROUP_CONSUMER_HEARTBEAT_INTERVAL", "45s")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("group_consumer_heartbeat_interval"), "{e}");
        let e = load(
            None,
            env(&[("STRATA_GROUP_CONSUMER_SESSION_TIMEOUT", "0s")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("group_consumer_session_timeout"), "{e}");
    }

    #[test]
    fn the_migration_policy_is_kafkas_default_and_checked() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.group_consumer_migration_policy, "bidirectional");
        let flags = FlagOverrides {
            group_consumer_migration_policy: Some("upgrade".into()),
            ..Default::default()
        };
        let (s, _) = load(None, env(&[]), &flags).unwrap();
        assert_eq!(s.group_consumer_migration_policy, "upgrade");
        let e = load(
            None,
            env(&[("STRATA_GROUP_CONSUMER_MIGRATION_POLICY", "sideways")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("group_consumer_migration_policy"), "{e}");
    }

    #[test]
    fn inter_broker_settings_name_a_usable_listener_and_a_whole_login() {
        let listeners = (
            "STRATA_LISTENERS",
            "P://127.0.0.1:0,S://127.0.0.1:0,T://127.0.0.1:0,U://127.0.0.1:0",
        );
        let map = (
            "STRATA_LISTENER_SECURITY_PROTOCOL_MAP",
            "P:PLAINTEXT,S:SASL_PLAINTEXT,T:SSL,U:SASL_SSL",
        );
        let tls = [
            ("STRATA_SSL_CERTIFICATE", "/c.pem"),
            ("STRATA_SSL_KEY", "/k.pem"),
        ];
        let load_env = |extra: &[(&str, &str)]| {
            let mut vars = vec![listeners, map, tls[0], tls[1]];
            vars.extend_from_slice(extra);
            load(None, env(&vars), &FlagOverrides::default())
        };
        let login = [
            ("STRATA_INTER_BROKER_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("STRATA_INTER_BROKER_SASL_USERNAME", "broker"),
        ];
        let (s, _) = load_env(&[("STRATA_INTER_BROKER_LISTENER_NAME", "P")]).unwrap();
        assert_eq!(s.inter_broker_listener_name.as_deref(), Some("P"));
        let mut with_login = login.to_vec();
        with_login.push(("STRATA_INTER_BROKER_LISTENER_NAME", "S"));
        let (s, _) = load_env(&with_login).unwrap();
        assert_eq!(s.inter_broker_sasl_username.as_deref(), Some("broker"));
        // TLS listeners: SSL needs only the certificate every TLS listener has; SASL_SSL a
        // login too.
        let (s, _) = load_env(&[("STRATA_INTER_BROKER_LISTENER_NAME", "T")]).unwrap();
        assert_eq!(s.inter_broker_listener_name.as_deref(), Some("T"));
        let mut sasl_ssl = login.to_vec();
        sasl_ssl.push(("STRATA_INTER_BROKER_LISTENER_NAME", "U"));
        assert!(load_env(&sasl_ssl).is_ok());
        for (extra, key) in [
            (
                vec![("STRATA_INTER_BROKER_LISTENER_NAME", "S")],
                "inter_broker_listener_name",
            ),
            (
                vec![("STRATA_INTER_BROKER_LISTENER_NAME", "U")],
                "inter_broker_listener_name",
            ),
            (
                vec![("STRATA_INTER_BROKER_LISTENER_NAME", "Q")],
                "inter_broker_listener_name",
            ),
            (vec![login[0]], "inter_broker_sasl_username"),
            (vec![login[1]], "inter_broker_sasl_mechanism"),
            (
                vec![("STRATA_INTER_BROKER_SASL_MECHANISM", "GSSAPI"), login[1]],
                "inter_broker_sasl_mechanism",
            ),
        ] {
            let e = load_env(&extra).unwrap_err().to_string();
            assert!(e.contains(key), "{extra:?}: {e}");
        }
    }

    #[test]
    fn ssl_client_auth_is_one_mode_or_per_listener_and_needs_a_truststore() {
        use strata_broker::security::tls::ClientAuth;
        let tls_flags = |client_auth: &str, truststore: bool| FlagOverrides {
            listeners: Some("A://127.0.0.1:0,B://127.0.0.1:0,P://127.0.0.1:0".into()),
            listener_security_protocol_map: Some("A:SSL,B:SASL_SSL,P:PLAINTEXT".into()),
            ssl_certificate: Some("c.pem".into()),
            ssl_key: Some("k.pem".into()),
            ssl_client_auth: Some(client_auth.into()),
            ssl_truststore: truststore.then(|| "ca.pem".into()),
            ..Default::default()
        };
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.ssl_client_auth, "none");
        assert_eq!(s.ssl_principal_mapping_rules, "DEFAULT");
        assert_eq!(s.ssl_reload_interval, Duration::from_secs(30));

        let (s, _) = load(None, env(&[]), &tls_flags("required", true)).unwrap();
        let modes = s
            .ssl_client_auth_modes(&s.listener_specs().unwrap())
            .unwrap();
        assert_eq!(
            modes,
            [
                ("A".to_string(), ClientAuth::Required),
                ("B".to_string(), ClientAuth::Required)
            ]
        );
        let (s, _) = load(None, env(&[]), &tls_flags("b:requested", true)).unwrap();
        let modes = s
            .ssl_client_auth_modes(&s.listener_specs().unwrap())
            .unwrap();
        assert_eq!(
            modes,
            [
                ("A".to_string(), ClientAuth::None),
                ("B".to_string(), ClientAuth::Requested)
            ]
        );
        let (s, _) = load(None, env(&[]), &tls_flags("none", false)).unwrap();
        assert_eq!(s.ssl_truststore, None);

        let refused = |flags: FlagOverrides| load(None, env(&[]), &flags).unwrap_err().to_string();
        for (client_auth, truststore, key) in [
            ("required", false, "ssl_truststore"),
            ("A:requested", false, "ssl_truststore"),
            ("sometimes", true, "ssl_client_auth"),
            ("P:required", true, "ssl_client_auth"),
            ("Z:required", true, "ssl_client_auth"),
            ("A:required,A:none", true, "ssl_client_auth"),
        ] {
            let e = refused(tls_flags(client_auth, truststore));
            assert!(e.contains(key), "{client_auth}: {e}");
        }
        let e = refused(FlagOverrides {
            ssl_principal_mapping_rules: Some("RULE:^CN=(.*$/$1/".into()),
            ..Default::default()
        });
        assert!(e.contains("ssl_principal_mapping_rules"), "{e}");
        let e = refused(FlagOverrides {
            ssl_reload_interval: Some("0s".into()),
            ..Default::default()
        });
        assert!(e.contains("ssl_reload_interval"), "{e}");
        let (s, _) = load(
            None,
            env(&[
                (
                    "STRATA_SSL_PRINCIPAL_MAPPING_RULES",
                    "RULE:^CN=(.*)$/$1/L,DEFAULT",
                ),
                ("STRATA_SSL_RELOAD_INTERVAL", "5s"),
            ]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.ssl_reload_interval, Duration::from_secs(5));
        assert!(s.ssl_principal_mapping_rules.starts_with("RULE:"));
    }

    #[test]
    fn security_settings_have_defaults_come_from_every_layer_and_are_checked() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        let specs = s.listener_specs().unwrap();
        assert_eq!(
            specs.len(),
            1,
            "one PLAINTEXT listener on `listen` by default"
        );
        assert_eq!(specs[0].bind, s.listen);
        assert_eq!(
            s.sasl_mechanisms(),
            ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        );
        assert_eq!(s.authentication_timeout, Duration::from_secs(10));
        assert_eq!(s.sasl_user_cache_ttl, Duration::from_secs(1));
        assert_eq!(s.sasl_user_cache_entries, 10_000);
        assert_eq!(s.quota_window_num, 11);
        assert_eq!(s.quota_window_size, Duration::from_secs(1));
        assert_eq!(s.quota_max_throttle, Duration::from_secs(10));
        assert_eq!(s.quota_max_tracked, 10_000);
        assert_eq!(s.quota_refresh_interval, Duration::from_secs(1));

        let f = file(
            "listeners = \"PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0\"\n\
             sasl_enabled_mechanisms = \"SCRAM-SHA-512\"\nsasl_user_cache_ttl = \"250ms\"\n",
        );
        let (s, _) = load(Some(f.path()), env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.listener_specs().unwrap().len(), 2);
        assert_eq!(s.sasl_mechanisms(), ["SCRAM-SHA-512"]);
        assert_eq!(s.sasl_user_cache_ttl, Duration::from_millis(250));
        let (s, _) = load(
            Some(f.path()),
            env(&[("STRATA_LISTENERS", "SASL_PLAINTEXT://127.0.0.1:0")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.listener_specs().unwrap().len(), 1);
        let flags = FlagOverrides {
            listeners: Some("A://127.0.0.1:0".into()),
            listener_security_protocol_map: Some("A:SASL_PLAINTEXT".into()),
            ..Default::default()
        };
        let (s, _) = load(Some(f.path()), env(&[]), &flags).unwrap();
        assert_eq!(s.listener_specs().unwrap()[0].name, "A");

        let refused = |flags: FlagOverrides| load(None, env(&[]), &flags).unwrap_err().to_string();
        let e = refused(FlagOverrides {
            listeners: Some("SASL_SSL://127.0.0.1:0".into()),
            ..Default::default()
        });
        assert!(e.contains("ssl_certificate"), "{e}");
        let e = refused(FlagOverrides {
            sasl_enabled_mechanisms: Some("GSSAPI".into()),
            ..Default::default()
        });
        assert!(e.contains("sasl_enabled_mechanisms"), "{e}");
        let e = refused(FlagOverrides {
            listeners: Some("EXTERNAL://127.0.0.1:0".into()),
            ..Default::default()
        });
        assert!(e.contains("listener_security_protocol_map"), "{e}");
        let e = refused(FlagOverrides {
            listeners: Some("PLAINTEXT://127.0.0.1:0".into()),
            advertised_listener: Some("h:1".into()),
            ..Default::default()
        });
        assert!(e.contains("advertised_listener"), "{e}");
        let e = load(
            None,
            env(&[("STRATA_SASL_USER_CACHE_ENTRIES", "0")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("sasl_user_cache_entries"), "{e}");
    }

    #[test]
    fn the_authorizer_is_off_by_default_and_its_settings_are_checked() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.authorizer_config(), None);
        assert_eq!(s.acl_refresh_interval, Duration::from_secs(1));

        let f = file(
            "authorizer = \"acl\"\nsuper_users = \"User:admin; User:ops\"\n\
             acl_refresh_interval = \"200ms\"\n",
        );
        let (s, _) = load(Some(f.path()), env(&[]), &FlagOverrides::default()).unwrap();
        let config = s.authorizer_config().unwrap();
        assert_eq!(config.super_users, ["User:admin", "User:ops"]);
        assert!(!config.allow_everyone_if_no_acl_found);
        assert_eq!(s.acl_refresh_interval, Duration::from_millis(200));
        let (s, _) = load(
            Some(f.path()),
            env(&[("STRATA_ALLOW_EVERYONE_IF_NO_ACL_FOUND", "true")]),
            &FlagOverrides {
                super_users: Some("User:root".into()),
                ..Default::default()
            },
        )
        .unwrap();
        let config = s.authorizer_config().unwrap();
        assert!(config.allow_everyone_if_no_acl_found);
        assert_eq!(config.super_users, ["User:root"]);

        let refused = |flags: FlagOverrides| load(None, env(&[]), &flags).unwrap_err().to_string();
        let e = refused(FlagOverrides {
            authorizer: Some("simple".into()),
            ..Default::default()
        });
        assert!(e.contains("authorizer"), "{e}");
        let e = refused(FlagOverrides {
            super_users: Some("admin".into()),
            ..Default::default()
        });
        assert!(e.contains("super_users"), "{e}");
        let e = refused(FlagOverrides {
            acl_refresh_interval: Some("0s".into()),
            ..Default::default()
        });
        assert!(e.contains("acl_refresh_interval"), "{e}");
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_set_by_every_layer() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.metrics_listen, None);

        let f = file("metrics_listen = \"127.0.0.1:9100\"\n");
        let (s, _) = load(Some(f.path()), env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.metrics_listen, Some("127.0.0.1:9100".parse().unwrap()));
        for bare in ["9100", ":9100"] {
            let f = file(&format!("metrics_listen = \"{bare}\"\n"));
            let (s, _) = load(Some(f.path()), env(&[]), &FlagOverrides::default()).unwrap();
            assert_eq!(
                s.metrics_listen,
                Some("127.0.0.1:9100".parse().unwrap()),
                "{bare}"
            );
        }
        let (s, _) = load(
            Some(f.path()),
            env(&[("STRATA_METRICS_LISTEN", "0.0.0.0:9101")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(s.metrics_listen, Some("0.0.0.0:9101".parse().unwrap()));
        let flags = FlagOverrides {
            metrics_listen: Some("127.0.0.1:0".into()),
            ..Default::default()
        };
        let (s, _) = load(
            Some(f.path()),
            env(&[("STRATA_METRICS_LISTEN", "0.0.0.0:9101")]),
            &flags,
        )
        .unwrap();
        assert_eq!(s.metrics_listen, Some("127.0.0.1:0".parse().unwrap()));

        let e = load(
            None,
            env(&[("STRATA_METRICS_LISTEN", "port nine")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("STRATA_METRICS_LISTEN"), "{e}");
        let flags = FlagOverrides {
            metrics_listen: Some("127.0.0.1:9092".into()),
            ..Default::default()
        };
        let e = load(None, env(&[]), &flags).unwrap_err().to_string();
        assert!(e.contains("metrics_listen"), "{e}");
    }

    #[test]
    fn the_console_is_off_by_default_and_beyond_loopback_only_with_a_token() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(s.console_listen, None);
        let flags = FlagOverrides {
            console_listen: Some("9300".into()),
            ..Default::default()
        };
        let (s, _) = load(None, env(&[]), &flags).unwrap();
        assert_eq!(s.console_listen, Some("127.0.0.1:9300".parse().unwrap()));

        let open = env(&[("STRATA_CONSOLE_LISTEN", "0.0.0.0:9300")]);
        let e = load(None, open, &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("console_listen") && e.contains("metrics_token"),
            "{e}"
        );
        let guarded = env(&[
            ("STRATA_CONSOLE_LISTEN", "0.0.0.0:9300"),
            ("STRATA_METRICS_TOKEN", "s3cret"),
        ]);
        let (s, _) = load(None, guarded, &FlagOverrides::default()).unwrap();
        assert_eq!(s.console_listen, Some("0.0.0.0:9300".parse().unwrap()));

        let clash = env(&[("STRATA_CONSOLE_LISTEN", "127.0.0.1:9092")]);
        let e = load(None, clash, &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("console_listen"), "{e}");
    }

    #[test]
    fn cluster_polling_defaults_by_backend_and_can_be_set() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        let local = s.cluster_settings("file");
        assert_eq!(local.ownership_interval, Duration::from_millis(250));
        assert_eq!(local.move_watch_interval, Duration::from_millis(10));
        let s3 = s.cluster_settings("s3");
        assert_eq!(s3.ownership_interval, Duration::from_secs(1));
        assert_eq!(s3.move_watch_interval, Duration::ZERO, "off on S3");

        assert!(s.cluster_settings("file").auto_rebalance);
        let (s, _) = load(
            None,
            env(&[("STRATA_AUTO_REBALANCE", "false")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert!(!s.cluster_settings("file").auto_rebalance);

        let (s, _) = load(
            None,
            env(&[
                ("STRATA_OWNERSHIP_INTERVAL", "500ms"),
                ("STRATA_MOVE_WATCH_INTERVAL", "5ms"),
            ]),
            &FlagOverrides::default(),
        )
        .unwrap();
        let s3 = s.cluster_settings("s3");
        assert_eq!(s3.ownership_interval, Duration::from_millis(500));
        assert_eq!(s3.move_watch_interval, Duration::from_millis(5));

        for (key, value) in [
            ("STRATA_OWNERSHIP_INTERVAL", "0s"),
            ("STRATA_OWNERSHIP_INTERVAL", "3s"),
        ] {
            let e = load(None, env(&[(key, value)]), &FlagOverrides::default())
                .unwrap_err()
                .to_string();
            let name = key.trim_start_matches("STRATA_").to_lowercase();
            assert!(e.contains(&name), "{key}={value}: {e}");
        }
        // Zero turns the move watch off, on any backend.
        let (s, _) = load(
            None,
            env(&[("STRATA_MOVE_WATCH_INTERVAL", "0s")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(
            s.cluster_settings("file").move_watch_interval,
            Duration::ZERO
        );
    }

    #[test]
    fn departed_brokers_are_listed_for_15_minutes_unless_set() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(
            s.cluster_settings("file").departed_broker_listing,
            Duration::from_secs(900)
        );
        let (s, _) = load(
            None,
            env(&[("STRATA_DEPARTED_BROKER_LISTING", "0s")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert_eq!(
            s.cluster_settings("file").departed_broker_listing,
            Duration::ZERO
        );
        let f = file("departed_broker_listing = \"2m\"\n");
        let (s, _) = load(Some(f.path()), env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(
            s.cluster_settings("s3").departed_broker_listing,
            Duration::from_secs(120)
        );
    }

    #[test]
    fn cluster_mode_is_on_by_default_and_set_by_every_layer() {
        let (s, _) = load(None, env(&[]), &FlagOverrides::default()).unwrap();
        assert!(s.cluster);
        assert_eq!(s.lease_period, Duration::from_secs(5));
        assert_eq!(s.heartbeat_interval, Duration::from_secs(1));

        let f = file("cluster = false\nlease_period = \"10s\"\n");
        let (s, _) = load(
            Some(f.path()),
            env(&[("STRATA_HEARTBEAT_INTERVAL", "2s")]),
            &FlagOverrides::default(),
        )
        .unwrap();
        assert!(!s.cluster);
        assert_eq!(s.lease_period, Duration::from_secs(10));
        assert_eq!(s.heartbeat_interval, Duration::from_secs(2));
        let flags = FlagOverrides {
            cluster: Some(false),
            ..Default::default()
        };
        let (s, _) = load(None, env(&[("STRATA_CLUSTER", "true")]), &flags).unwrap();
        assert!(!s.cluster);

        let e = load(
            None,
            env(&[("STRATA_HEARTBEAT_INTERVAL", "3s")]),
            &FlagOverrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("heartbeat_interval"), "{e}");
    }

    #[test]
    fn advertised_listener_must_be_host_and_port() {
        assert_eq!(
            parse_host_port("kafka.example:9093").unwrap(),
            ("kafka.example".to_string(), 9093)
        );
        assert_eq!(
            parse_host_port("[::1]:9092").unwrap(),
            ("::1".to_string(), 9092)
        );
        assert!(parse_host_port("nohost").is_err());
        assert!(parse_host_port("h:0").is_err());
    }
}
