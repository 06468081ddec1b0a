//! The `strata` binary: command line, settings (file, environment, flags), logging, and the
//! `serve` lifecycle — open storage and the log, serve Kafka clients, and on SIGINT/SIGTERM stop
//! accepting, finish in-flight requests, flush and checkpoint the log, exit 0.
//!
//! It owns no protocol or storage logic of its own: it only wires the layers together. Logs go
//! to stderr; once the listener is bound, one line says `listening on <address>` with the
//! actual port (tests start the binary with `--listen 127.0.0.1:0` and wait for that line).
//! With `metrics_listen` set, `metrics on <address>` likewise reports the metrics endpoint.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod admin;
mod cli;
mod console;
mod health;
mod http;
mod lag;
// The client moved to its own crate when the broker needed one (transaction markers); the
// commands still name it by its old path.
use strata_client as kafka_client;
mod listeners;
mod metrics;
mod settings;
mod users;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use strata_broker::cluster::{ClusterNode, Joined};
use strata_broker::{Broker, BrokerParts, BrokerSettings};
use strata_cluster::ListenerEndpoint;
use strata_core::{BrokerId, Clock, SystemClock};
use strata_log::{LogManager, Ownership as LogOwnership};
use strata_storage::{StackConfig, StorageStack, StoreRegistry, TieredStore};
use tokio::net::TcpListener;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::metrics::MetricsSource;
use crate::settings::{parse_host_port, FlagOverrides, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "strata",
    version,
    about = "A Kafka-compatible broker on object storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a broker.
    ///
    /// Settings come from defaults, then the --config file (TOML), then STRATA_* environment
    /// variables, then these flags; later ones win. Unknown keys in the file are errors.
    ///
    /// The file takes the flag names with underscores (listen, advertised_listener,
    /// listeners, advertised_listeners, listener_security_protocol_map,
    /// sasl_enabled_mechanisms, ssl_certificate, ssl_key, ssl_client_auth [default: none],
    /// ssl_truststore, ssl_principal_mapping_rules [default: DEFAULT], ssl_reload_interval
    /// [default: 30s], sasl_oauthbearer_jwks_file, sasl_oauthbearer_expected_issuer,
    /// sasl_oauthbearer_expected_audience, sasl_oauthbearer_clock_skew [default: 30s],
    /// sasl_oauthbearer_sub_claim_name [default: sub], connections_max_reauth [default: 0s],
    /// authentication_timeout [default:
    /// 10s], sasl_user_cache_ttl [default: 1s], sasl_user_cache_entries [default: 10000],
    /// authorizer [default: none], super_users, allow_everyone_if_no_acl_found [default:
    /// false], acl_refresh_interval [default: 1s],
    /// quota_window_num [default: 11], quota_window_size [default: 1s], quota_max_throttle
    /// [default: 10s], quota_max_tracked [default: 10000], quota_refresh_interval [default:
    /// 1s], node_id,
    /// cluster_id, storage, wal_storage, ephemeral_storage_ok, auto_create_topics,
    /// auto_create_topics_per_request, auto_create_topics_per_second,
    /// default_replication_factor, max_request_bytes,
    /// queued_max_request_bytes, max_connections, max_connections_per_ip, connections_max_idle,
    /// request_read_timeout,
    /// max_request_partition_size_limit, max_inflight_requests_per_connection, shutdown_grace,
    /// group_shards, txn_shards, transaction_max_timeout [default: 15m],
    /// transaction_abort_timed_out_interval [default: 10s], transactional_id_expiration
    /// [default: 7days], group_max_size,
    /// group_initial_rebalance_delay, group_min_session_timeout, group_max_session_timeout,
    /// offsets_commit_timeout, txn_marker_timeout [default: 30s: a transaction marker's wait
    /// to become durable], group_consumer_session_timeout [default: 45s],
    /// group_consumer_heartbeat_interval [default: 5s], group_consumer_migration_policy
    /// [default: bidirectional], group_share_session_timeout
    /// [default: 45s], group_share_heartbeat_interval [default: 5s], group_share_max_groups
    /// [default: 10], group_share_max_size [default: 200], group_share_record_lock_duration
    /// [default: 30s], group_share_delivery_count_limit [default: 5],
    /// group_share_partition_max_record_locks [default: 2000], group_share_max_share_sessions
    /// [default: 2000], group_share_max_partitions [default: 1000], share_auto_offset_reset
    /// [default: latest],
    /// max_incremental_fetch_session_cache_slots [default: 1000],
    /// max_incremental_fetch_session_partitions [default: 1000000],
    /// min_incremental_fetch_session_eviction [default: 120s], metrics_listen [a bare port
    /// binds 127.0.0.1], metrics_token, metrics_token_file [default: none; /metrics then needs
    /// Authorization: Bearer <token>], metrics_max_connections, metrics_timeout,
    /// group_lag_interval [default: 30s; 0s turns consumer-lag metrics off],
    /// s3_price_per_1000_put_requests [default: 0.005], s3_price_per_1000_get_requests
    /// [default: 0.0004: AWS S3 Standard in USD, for the request-cost metric],
    /// console_listen [default: none; a bare port binds 127.0.0.1], console_sasl_mechanism
    /// [default: none: the console uses metrics_token], inter_broker_listener_name [default:
    /// the first PLAINTEXT listener], inter_broker_sasl_mechanism, inter_broker_sasl_username
    /// [default: none; the password only from STRATA_INTER_BROKER_SASL_PASSWORD], cluster,
    /// lease_period,
    /// heartbeat_interval, ownership_interval, move_watch_interval, auto_rebalance,
    /// departed_broker_listing [default: 15m; 0s lists live brokers only], standalone_seal_check).
    ///
    /// The [log] section (file only, or STRATA_LOG_<KEY>):
    ///   flush_interval: a group-commit write starts when the oldest batch waited this long
    ///     [default: 1ms; 100ms on S3];
    ///   flush_bytes: ...or when this much is queued; also the most one write holds
    ///     [default: 1MiB; 8MiB on S3];
    ///   flush_when_idle: ...or at once when no write is in flight [default: true; false on
    ///     S3];
    ///   max_pending_bytes: produce data accepted but not yet durable, broker-wide; at the
    ///     limit producers wait [default: 256MiB];
    ///   segment_bytes: a partition's write-ahead tail is compacted into a segment at this
    ///     size [default: 16MiB; 64MiB on S3];
    ///   segment_interval: ...or this age [default: 10s; 60s on S3];
    ///   cache_bytes: memory for the shared tail cache [default: 256MiB];
    ///   retention_check_interval: how often retention is enforced [default: 30s];
    ///   default_partitions: partitions of topics created without a count [default: 1];
    ///   max_inflight_flushes: group-commit writes in flight at once [default: 4];
    ///   max_decompressed_batch_bytes: a compressed batch inflating past this is refused
    ///     [default: 64MiB];
    ///   max_concurrent_decompressions: batches decompressed at once [default: CPU cores];
    ///   handover_timeout: a graceful handover waits this long for queued appends to become
    ///     durable [default: 30s];
    ///   shutdown_timeout: shutdown waits this long for queued appends [default: 30s];
    ///   wal_delete_concurrency: write-ahead objects deleted at once after compaction
    ///     [default: 16];
    ///   cleaner_dedupe_buffer_bytes: memory of the log cleaner's key map (key compaction),
    ///     24 bytes a key; more keys mean more passes [default: 64MiB];
    ///   cleaner_io_max_bytes_per_second: segment bytes the cleaner reads and writes a
    ///     second [default: unlimited];
    ///   cleaner_threads: cleaning passes at once; 0 turns key compaction off [default: 1];
    ///   max_aborted_transactions: aborted transactions a partition remembers; at the bound
    ///     new transactions there are refused until the log start passes older ones
    ///     [default: 10000];
    ///   max_uncompacted_bytes: a partition's uncompacted write-ahead tail; past it produce
    ///     is refused (retriable) until compaction catches up, e.g. while the bulk tier is
    ///     down; at least twice segment_bytes [default: 1GiB];
    ///   max_uncompacted_batches: the same bound in batches, 64 bytes of memory each
    ///     [default: 1000000];
    ///   read_ahead_bytes: consumers behind the tail read segments in aligned windows of
    ///     this size, kept for other fetches and read one ahead into free window
    ///     memory [default: 0: off];
    ///   read_ahead_memory_bytes: memory for those windows, broker-wide [default: 64MiB];
    ///   catchup_max_concurrent_reads: their segment reads at once [default: 8];
    ///   catchup_io_max_bytes_per_second: segment bytes they read a second, broker-wide;
    ///     producers and readers at the tail are outside it [default: unlimited].
    ///
    /// Environment variables: STRATA_ + the upper-cased key, STRATA_LOG_ + key for the [log]
    /// section (e.g. STRATA_LISTEN, STRATA_STORAGE, STRATA_NODE_ID, STRATA_LOG_FLUSH_INTERVAL).
    /// Durations are human-readable ("1ms", "30s", "5m"); byte sizes are integers or
    /// "64MiB"/"1GB".
    // Boxed: the flags make it far larger than the other variants. Verbatim: the [log]
    // settings are one per line.
    #[command(verbatim_doc_comment)]
    Serve(Box<ServeArgs>),
    /// Create, list, describe, configure, grow and delete topics (Kafka protocol, to
    /// --bootstrap-server).
    #[command(subcommand)]
    Topic(cli::topic::TopicCommand),
    /// Consumer groups: list, describe, lag, reset offsets, delete (Kafka protocol).
    #[command(subcommand)]
    Group(cli::group::GroupCommand),
    /// ACLs: add, remove, list (Kafka protocol: CreateAcls, DeleteAcls, DescribeAcls).
    #[command(subcommand)]
    Acls(cli::acls::AclsCommand),
    /// Client quotas of users and client ids: describe, alter (Kafka protocol).
    #[command(subcommand)]
    Quotas(cli::quotas::QuotasCommand),
    /// Produce records to one partition: each --value, or each line of stdin (Kafka protocol).
    Produce(cli::data::ProduceArgs),
    /// Print records of one partition from an offset (Kafka protocol).
    Consume(cli::data::ConsumeArgs),
    /// The cluster as its storage records it (cluster mode).
    #[command(subcommand)]
    Cluster(admin::ClusterCommand),
    /// Operate on partitions of a running cluster (cluster mode).
    #[command(subcommand)]
    Partitions(admin::PartitionsCommand),
    /// Operate on brokers of a running cluster (cluster mode).
    #[command(subcommand)]
    Broker(admin::BrokerCommand),
    /// Manage SCRAM users in the cluster's storage (works with no broker running).
    #[command(subcommand)]
    Users(users::UsersCommand),
    /// Print a shell completion script, e.g. `strata completions bash > /etc/bash_completion.d/strata`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the version.
    Version,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// TOML settings file.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Address to bind [default: 127.0.0.1:9092]; port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// host:port advertised to clients [default: listen address and bound port].
    #[arg(long, value_name = "HOST:PORT")]
    advertised_listener: Option<String>,
    /// Named listeners NAME://host:port,... (e.g. PLAINTEXT://127.0.0.1:9092,
    /// SASL_SSL://0.0.0.0:9094); replaces --listen and --advertised-listener [default: one
    /// PLAINTEXT listener on --listen].
    #[arg(long, value_name = "LIST")]
    listeners: Option<String>,
    /// NAME://host:port,... advertised to clients of each named listener [default: the bound
    /// address of each].
    #[arg(long, value_name = "LIST")]
    advertised_listeners: Option<String>,
    /// NAME:PROTOCOL,... giving each listener PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    /// [default: PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL].
    #[arg(long, value_name = "MAP")]
    listener_security_protocol_map: Option<String>,
    /// SASL mechanisms offered on SASL listeners (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512,
    /// OAUTHBEARER) [default: PLAIN,SCRAM-SHA-256,SCRAM-SHA-512].
    #[arg(long, value_name = "LIST")]
    sasl_enabled_mechanisms: Option<String>,
    /// PEM certificate chain of SSL and SASL_SSL listeners (read at start-up).
    #[arg(long, value_name = "PATH")]
    ssl_certificate: Option<String>,
    /// PEM private key of --ssl-certificate.
    #[arg(long, value_name = "PATH")]
    ssl_key: Option<String>,
    /// Client certificates on SSL and SASL_SSL listeners (Kafka's ssl.client.auth): none,
    /// requested or required, or NAME:MODE,... per listener [default: none].
    #[arg(long, value_name = "MODE")]
    ssl_client_auth: Option<String>,
    /// PEM CA certificates that client certificates must chain to.
    #[arg(long, value_name = "PATH")]
    ssl_truststore: Option<String>,
    /// Client certificate subject to principal name (Kafka's ssl.principal.mapping.rules):
    /// RULE:pattern/replacement/[LU],...,DEFAULT [default: DEFAULT].
    #[arg(long, value_name = "RULES")]
    ssl_principal_mapping_rules: Option<String>,
    /// How often the certificate, key and truststore files are checked for changes
    /// [default: 30s].
    #[arg(long, value_name = "DURATION")]
    ssl_reload_interval: Option<String>,
    /// How long a SASL login lasts before the client must log in again on its connection
    /// (Kafka's connections.max.reauth.ms, KIP-368); 0s turns it off [default: 0s].
    #[arg(long, value_name = "DURATION")]
    connections_max_reauth: Option<String>,
    /// JWKS file with the keys OAUTHBEARER tokens are checked against (read at start-up).
    #[arg(long, value_name = "PATH")]
    sasl_oauthbearer_jwks_file: Option<String>,
    /// The iss claim OAUTHBEARER tokens must carry [default: not checked].
    #[arg(long, value_name = "ISSUER")]
    sasl_oauthbearer_expected_issuer: Option<String>,
    /// Audiences (comma-separated) one of which a token's aud must name [default: not checked].
    #[arg(long, value_name = "LIST")]
    sasl_oauthbearer_expected_audience: Option<String>,
    /// Slack on token times (exp, nbf, iat) [default: 30s].
    #[arg(long, value_name = "DURATION")]
    sasl_oauthbearer_clock_skew: Option<String>,
    /// The token claim naming the principal [default: sub].
    #[arg(long, value_name = "CLAIM")]
    sasl_oauthbearer_sub_claim_name: Option<String>,
    /// `acl` to enforce the ACLs kept in storage (CreateAcls, `strata acls`); `none` lets
    /// every client do everything [default: none].
    #[arg(long, value_name = "none|acl")]
    authorizer: Option<String>,
    /// Principals allowed everything with --authorizer acl, `;`-separated, e.g.
    /// `User:admin;User:ops` [default: none].
    #[arg(long, value_name = "LIST")]
    super_users: Option<String>,
    /// With --authorizer acl, allow operations on resources no ACL names [default: false].
    #[arg(long, value_name = "BOOL")]
    allow_everyone_if_no_acl_found: Option<bool>,
    /// How often a broker looks for ACL changes made through other brokers [default: 1s].
    #[arg(long, value_name = "DURATION")]
    acl_refresh_interval: Option<String>,
    /// This broker's node id, at most 1000 in cluster mode [default: allocated by the cluster
    /// from 1001 up, a crashed predecessor's on this machine first; 0 with --cluster false].
    #[arg(long, value_name = "ID")]
    node_id: Option<i32>,
    /// Cluster id reported to clients [default: strata].
    #[arg(long, value_name = "ID")]
    cluster_id: Option<String>,
    /// Storage: a directory or file:///path; s3://BUCKET/PREFIX (credentials and region from
    /// the AWS_* environment, or ?endpoint=http://host:port&allow_http=true for MinIO or
    /// radosgw); rados://POOL[/NAMESPACE]?conf=/etc/ceph/ceph.conf&user=admin (builds with
    /// the `rados` feature); memory:// (needs --ephemeral-storage-ok) [default:
    /// ./strata-data].
    #[arg(long, value_name = "URL")]
    storage: Option<String>,
    /// A separate write-ahead tier, same URL forms as --storage: write-ahead objects and the
    /// small objects (manifests, catalog, cluster, users) go there and acknowledgements wait
    /// only for it; --storage then holds the compacted data, segments and their index chunks
    /// (the bulk tier). In cluster mode it must be shared at least as widely as --storage
    /// [default: unset, one storage for everything].
    #[arg(long, value_name = "URL")]
    wal_storage: Option<String>,
    /// Allow memory:// storage, which acknowledges produces (acks=all too) and loses every
    /// record, offset and topic when the broker exits; for tests and benchmarks. Without it
    /// the broker refuses to start on memory:// [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    ephemeral_storage_ok: Option<bool>,
    /// Create unknown topics on first use [default: true].
    #[arg(long, value_name = "BOOL")]
    auto_create_topics: Option<bool>,
    /// Largest request accepted, e.g. 100MiB [default: 100MiB].
    #[arg(long, value_name = "SIZE")]
    max_request_bytes: Option<String>,
    /// Client connections served at once [default: 4096].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Connections from one client address; more are closed at once [default: 1024].
    #[arg(long, value_name = "N")]
    max_connections_per_ip: Option<usize>,
    /// Close a connection with nothing in progress for this long [default: 10m].
    #[arg(long, value_name = "DURATION")]
    connections_max_idle: Option<String>,
    /// Close a connection whose request has not fully arrived this long after its first byte
    /// [default: 30s].
    #[arg(long, value_name = "DURATION")]
    request_read_timeout: Option<String>,
    /// Memory for requests being received and decoded, broker-wide; at the limit sockets are
    /// not read until memory frees. Non-Produce requests count 96 times their size, Produce its
    /// size plus 640 bytes per partition [default: 256MiB].
    #[arg(long, value_name = "SIZE")]
    queued_max_request_bytes: Option<String>,
    /// Topics one request may auto-create; more are answered LEADER_NOT_AVAILABLE and created
    /// when asked again [default: 100].
    #[arg(long, value_name = "N")]
    auto_create_topics_per_request: Option<usize>,
    /// Topics auto-created per second, broker-wide [default: 100].
    #[arg(long, value_name = "N")]
    auto_create_topics_per_second: Option<u32>,
    /// Replication factor of topics created with -1 or auto-created; the storage keeps one
    /// durable copy whatever it is, Metadata lists this many live brokers as replicas
    /// [default: 1].
    #[arg(long, value_name = "N")]
    default_replication_factor: Option<i16>,
    /// Partitions one DescribeTopicPartitions answer describes; the client gets a cursor for
    /// the rest [default: 2000].
    #[arg(long, value_name = "N")]
    max_request_partition_size_limit: Option<usize>,
    /// Partitions of __consumer_offsets (consumer-group coordinator shards), used when the
    /// topic is first created [default: 8].
    #[arg(long, value_name = "N")]
    group_shards: Option<i32>,
    /// Partitions of __transaction_state (transaction coordinator shards), used when the
    /// topic is first created [default: 8].
    #[arg(long, value_name = "N")]
    txn_shards: Option<i32>,
    /// Longest transaction timeout a producer may ask for; larger ones are refused with
    /// INVALID_TRANSACTION_TIMEOUT (transaction.max.timeout.ms) [default: 15m].
    #[arg(long, value_name = "DURATION")]
    transaction_max_timeout: Option<String>,
    /// How often transactions open past their timeout are looked for and aborted
    /// [default: 10s].
    #[arg(long, value_name = "DURATION")]
    transaction_abort_timed_out_interval: Option<String>,
    /// How long a transactional id without transactions is remembered [default: 7days].
    #[arg(long, value_name = "DURATION")]
    transactional_id_expiration: Option<String>,
    /// Members one consumer group may hold (classic or KIP-848); joins beyond it get
    /// GROUP_MAX_SIZE_REACHED [default: 10000].
    #[arg(long, value_name = "N")]
    group_max_size: Option<usize>,
    /// How long the first rebalance of an empty consumer group waits for more members, e.g.
    /// 0s [default: 3s].
    #[arg(long, value_name = "DURATION")]
    group_initial_rebalance_delay: Option<String>,
    /// Shortest consumer session timeout accepted [default: 6s].
    #[arg(long, value_name = "DURATION")]
    group_min_session_timeout: Option<String>,
    /// Longest consumer session timeout accepted [default: 30m].
    #[arg(long, value_name = "DURATION")]
    group_max_session_timeout: Option<String>,
    /// Session timeout of KIP-848 (group.protocol=consumer) members: a member silent this long
    /// loses its partitions [default: 45s].
    #[arg(long, value_name = "DURATION")]
    group_consumer_session_timeout: Option<String>,
    /// Heartbeat interval KIP-848 members are told to keep, below the session timeout
    /// [default: 5s].
    #[arg(long, value_name = "DURATION")]
    group_consumer_heartbeat_interval: Option<String>,
    /// Whether a live group may change protocol: bidirectional, upgrade (classic to consumer
    /// only), downgrade or disabled [default: bidirectional].
    #[arg(long, value_name = "POLICY")]
    group_consumer_migration_policy: Option<String>,
    /// Session timeout of share-group members [default: 45s].
    #[arg(long, value_name = "DURATION")]
    group_share_session_timeout: Option<String>,
    /// Heartbeat interval share-group members are told to keep [default: 5s].
    #[arg(long, value_name = "DURATION")]
    group_share_heartbeat_interval: Option<String>,
    /// Share groups one coordinator hosts [default: 10].
    #[arg(long, value_name = "N")]
    group_share_max_groups: Option<usize>,
    /// Members of one share group [default: 200].
    #[arg(long, value_name = "N")]
    group_share_max_size: Option<usize>,
    /// How long a share consumer holds acquired records [default: 30s].
    #[arg(long, value_name = "DURATION")]
    group_share_record_lock_duration: Option<String>,
    /// Deliveries after which a share-group record is archived [default: 5].
    #[arg(long, value_name = "N")]
    group_share_delivery_count_limit: Option<u16>,
    /// Records in flight per share partition [default: 2000].
    #[arg(long, value_name = "N")]
    group_share_partition_max_record_locks: Option<usize>,
    /// Share sessions kept at once [default: 2000].
    #[arg(long, value_name = "N")]
    group_share_max_share_sessions: Option<usize>,
    /// Share partitions held in memory per broker [default: 1000].
    #[arg(long, value_name = "N")]
    group_share_max_partitions: Option<usize>,
    /// Where share groups start on a partition: latest, earliest or by_duration:<ISO-8601>
    /// (e.g. by_duration:PT1H: records of the last hour) [default: latest].
    #[arg(long, value_name = "POLICY")]
    share_auto_offset_reset: Option<String>,
    /// Address of the HTTP endpoint with GET /metrics (Prometheus text format) and GET /health
    /// (200 "ok", or 503 after 3 failed storage requests in a row); port 0 picks a free port
    /// [default: none, no endpoint].
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Address of the web console: the cluster's brokers, topics and groups (with lag), and
    /// actions to create a topic, move a partition, drain or undrain a broker; a bare port
    /// binds 127.0.0.1 [default: none, no console].
    #[arg(long, value_name = "ADDR")]
    console_listen: Option<String>,
    /// Cluster mode: share the storage with other brokers (each with its own node id, set by
    /// hand or allocated); partitions are spread over the live brokers and taken over when one
    /// dies. A broker whose stream is fenced by the others exits with status 1 (restart it).
    /// `false` (standalone) takes every partition at start and fences any other broker's
    /// stream on the storage [default: true].
    #[arg(long, value_name = "BOOL")]
    cluster: Option<bool>,
    /// Cluster mode: how long a silent broker stays owner before the others take over its
    /// partitions [default: 5s].
    #[arg(long, value_name = "DURATION")]
    lease_period: Option<String>,
    /// Cluster mode: how often a broker heartbeats [default: 1s].
    #[arg(long, value_name = "DURATION")]
    heartbeat_interval: Option<String>,
    /// Cluster mode: how often ownership records are listed [default: 250ms; 1s on S3].
    #[arg(long, value_name = "DURATION")]
    ownership_interval: Option<String>,
    /// Cluster mode: how often the placement-changes marker is read so moves start at once
    /// [default: 10ms; 100ms on S3].
    #[arg(long, value_name = "DURATION")]
    move_watch_interval: Option<String>,
    /// Cluster mode: spread partitions over live brokers automatically, moving some to a
    /// broker that joins; false keeps each partition with its live owner unless moved
    /// explicitly (draining and failover still move it) [default: true].
    #[arg(long, value_name = "BOOL")]
    auto_rebalance: Option<bool>,
    /// Log filter (error, warn, info, debug, trace, or a tracing directive like
    /// "strata_broker=debug"); overrides RUST_LOG [default: info].
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
}

/// The bearer token the metrics endpoint requires, if one is configured.
fn metrics_token(settings: &Settings) -> anyhow::Result<Option<Arc<str>>> {
    let token = match (&settings.metrics_token, &settings.metrics_token_file) {
        (Some(token), _) => token.trim().to_string(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("reading metrics_token_file {}", path.display()))?
            .trim()
            .to_string(),
        (None, None) => return Ok(None),
    };
    if token.is_empty() {
        anyhow::bail!("metrics_token_file holds an empty token");
    }
    Ok(Some(Arc::from(token)))
}

/// The brokers' own login on a SASL_PLAINTEXT inter-broker listener, if one is configured;
/// the password comes only from STRATA_INTER_BROKER_SASL_PASSWORD.
fn inter_broker_sasl(
    settings: &Settings,
) -> anyhow::Result<Option<strata_client::SaslCredentials>> {
    let (Some(mechanism), Some(username)) = (
        &settings.inter_broker_sasl_mechanism,
        &settings.inter_broker_sasl_username,
    ) else {
        return Ok(None);
    };
    let mechanism = strata_client::SaslMechanism::parse(mechanism)
        .context("inter_broker_sasl_mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")?;
    let password = std::env::var("STRATA_INTER_BROKER_SASL_PASSWORD").context(
        "inter_broker_sasl_mechanism needs the password in STRATA_INTER_BROKER_SASL_PASSWORD",
    )?;
    Ok(Some(strata_client::SaslCredentials {
        mechanism,
        username: username.clone(),
        password,
    }))
}

/// The TLS client side of a broker on an SSL or SASL_SSL inter-broker listener: its own
/// certificate (for listeners that require one) and `ssl_truststore`, else the system's trust
/// store — Kafka's broker uses its keystore and truststore for its own connections the same
/// way. None without a certificate, as no TLS listener can then exist. A truststore that
/// cannot be read fails the start only if the inter-broker listener is named and uses TLS:
/// otherwise brokers fall back to a listener without TLS, or refuse transactions (logged).
fn inter_broker_tls(settings: &Settings) -> anyhow::Result<Option<strata_client::Tls>> {
    let (Some(certificate), Some(key)) = (&settings.ssl_certificate, &settings.ssl_key) else {
        return Ok(None);
    };
    let files = strata_client::TlsFiles {
        ca: settings.ssl_truststore.clone(),
        certificate: Some(certificate.clone()),
        key: Some(key.clone()),
    };
    match strata_client::Tls::load(&files) {
        Ok(tls) => Ok(Some(tls)),
        Err(e) => {
            let named_tls = settings
                .inter_broker_listener_name
                .as_ref()
                .is_some_and(|name| {
                    settings.listener_specs().is_ok_and(|specs| {
                        specs.iter().any(|s| {
                            &s.name == name
                                && matches!(
                                    s.protocol,
                                    strata_broker::security::SecurityProtocol::Ssl
                                        | strata_broker::security::SecurityProtocol::SaslSsl
                                )
                        })
                    })
                });
            if named_tls {
                return Err(anyhow::anyhow!(e))
                    .context("the TLS inter-broker listener's client side (ssl_truststore)");
            }
            tracing::warn!(error = %e, "brokers cannot reach each other over TLS");
            Ok(None)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            let _ = writeln!(std::io::stdout(), "strata {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Topic(command) => run_admin(cli::topic::run(command)),
        Command::Group(command) => run_admin(cli::group::run(command)),
        Command::Acls(command) => run_admin(cli::acls::run(command)),
        Command::Quotas(command) => run_admin(cli::quotas::run(command)),
        Command::Produce(args) => run_admin(cli::data::produce(args)),
        Command::Consume(args) => run_admin(cli::data::consume(args)),
        Command::Cluster(command) => run_admin(admin::cluster(command)),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            // Into memory first: clap_complete panics on a write error (`| head`).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "strata", &mut script);
            let _ = std::io::stdout().write_all(&script);
            ExitCode::SUCCESS
        }
        Command::Partitions(command) => run_admin(admin::partitions(command)),
        Command::Broker(command) => run_admin(admin::broker(command)),
        Command::Users(command) => run_admin(users::run(command)),
        Command::Serve(args) => {
            if let Err(e) = init_logging(args.log_level.as_deref()) {
                let _ = writeln!(std::io::stderr(), "strata: {e:#}");
                return ExitCode::FAILURE;
            }
            let result = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")
                .and_then(|runtime| runtime.block_on(serve(*args)));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    // One line (plus the TOML excerpt for file errors), no backtrace: these are
                    // configuration and environment problems, not bugs.
                    error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Runs an operator command: errors to stderr, exit status 1.
fn run_admin(command: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
        .and_then(|runtime| runtime.block_on(command));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "strata: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(level: Option<&str>) -> anyhow::Result<()> {
    let filter = match level {
        Some(level) => {
            EnvFilter::try_new(level).with_context(|| format!("--log-level {level:?}"))?
        }
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person watching; logs captured to files stay plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let flags = FlagOverrides {
        listen: args.listen,
        advertised_listener: args.advertised_listener,
        listeners: args.listeners,
        advertised_listeners: args.advertised_listeners,
        listener_security_protocol_map: args.listener_security_protocol_map,
        sasl_enabled_mechanisms: args.sasl_enabled_mechanisms,
        ssl_certificate: args.ssl_certificate,
        ssl_key: args.ssl_key,
        ssl_client_auth: args.ssl_client_auth,
        ssl_truststore: args.ssl_truststore,
        ssl_principal_mapping_rules: args.ssl_principal_mapping_rules,
        ssl_reload_interval: args.ssl_reload_interval,
        connections_max_reauth: args.connections_max_reauth,
        sasl_oauthbearer_jwks_file: args.sasl_oauthbearer_jwks_file,
        sasl_oauthbearer_expected_issuer: args.sasl_oauthbearer_expected_issuer,
        sasl_oauthbearer_expected_audience: args.sasl_oauthbearer_expected_audience,
        sasl_oauthbearer_clock_skew: args.sasl_oauthbearer_clock_skew,
        sasl_oauthbearer_sub_claim_name: args.sasl_oauthbearer_sub_claim_name,
        authorizer: args.authorizer,
        super_users: args.super_users,
        allow_everyone_if_no_acl_found: args.allow_everyone_if_no_acl_found,
        acl_refresh_interval: args.acl_refresh_interval,
        node_id: args.node_id,
        cluster_id: args.cluster_id,
        storage: args.storage,
        wal_storage: args.wal_storage,
        ephemeral_storage_ok: args.ephemeral_storage_ok,
        auto_create_topics: args.auto_create_topics,
        max_request_bytes: args.max_request_bytes,
        max_connections: args.max_connections,
        max_connections_per_ip: args.max_connections_per_ip,
        connections_max_idle: args.connections_max_idle,
        request_read_timeout: args.request_read_timeout,
        queued_max_request_bytes: args.queued_max_request_bytes,
        auto_create_topics_per_request: args.auto_create_topics_per_request,
        auto_create_topics_per_second: args.auto_create_topics_per_second,
        default_replication_factor: args.default_replication_factor,
        max_request_partition_size_limit: args.max_request_partition_size_limit,
        group_shards: args.group_shards,
        txn_shards: args.txn_shards,
        transaction_max_timeout: args.transaction_max_timeout,
        transaction_abort_timed_out_interval: args.transaction_abort_timed_out_interval,
        transactional_id_expiration: args.transactional_id_expiration,
        group_max_size: args.group_max_size,
        group_initial_rebalance_delay: args.group_initial_rebalance_delay,
        group_min_session_timeout: args.group_min_session_timeout,
        group_max_session_timeout: args.group_max_session_timeout,
        group_consumer_session_timeout: args.group_consumer_session_timeout,
        group_consumer_heartbeat_interval: args.group_consumer_heartbeat_interval,
        group_consumer_migration_policy: args.group_consumer_migration_policy,
        group_share_session_timeout: args.group_share_session_timeout,
        group_share_heartbeat_interval: args.group_share_heartbeat_interval,
        group_share_max_groups: args.group_share_max_groups,
        group_share_max_size: args.group_share_max_size,
        group_share_record_lock_duration: args.group_share_record_lock_duration,
        group_share_delivery_count_limit: args.group_share_delivery_count_limit,
        group_share_partition_max_record_locks: args.group_share_partition_max_record_locks,
        group_share_max_share_sessions: args.group_share_max_share_sessions,
        group_share_max_partitions: args.group_share_max_partitions,
        share_auto_offset_reset: args.share_auto_offset_reset,
        metrics_listen: args.metrics_listen,
        console_listen: args.console_listen,
        cluster: args.cluster,
        lease_period: args.lease_period,
        heartbeat_interval: args.heartbeat_interval,
        ownership_interval: args.ownership_interval,
        move_watch_interval: args.move_watch_interval,
        auto_rebalance: args.auto_rebalance,
    };
    let (settings, unknown_env) = settings::load(args.config.as_deref(), std::env::vars(), &flags)?;
    for var in unknown_env {
        warn!(variable = %var, "ignoring unknown STRATA_* environment variable");
    }

    if settings::is_ephemeral(&settings.storage) {
        warn!(
            storage = %settings.storage,
            "storage is this process's memory (ephemeral_storage_ok is set): everything \
             acknowledged, acks=all included, is lost when the broker exits"
        );
    }

    let clock: Arc<dyn Clock> = SystemClock::shared();
    // The process's one source of randomness, drawn here and handed down (retry jitter, group
    // member ids), so that brokers started together do not retry in lockstep and a run can be
    // told apart from another in the log.
    #[allow(clippy::disallowed_methods)] // the one place the process draws its randomness
    let seed: u64 = rand::random();
    info!(seed, "randomness seed for retry jitter and member ids");
    let backend = open_backend(settings.storage.clone())
        .await
        .with_context(|| format!("opening storage {:?}", settings.storage))?;
    let stack_config = StackConfig {
        seed,
        ..StackConfig::default()
    };
    let storage = StorageStack::build(backend, &stack_config, Arc::clone(&clock));
    // Tiered: `storage` is the bulk tier, and the store everything above uses routes each key
    // to its tier. Each tier has its own stack, so retries, timeouts, the concurrency limit,
    // metrics and health of one tier never involve the other.
    let (storage, bulk) = match &settings.wal_storage {
        None => (storage, None),
        Some(wal_url) => {
            let wal_backend = open_backend(wal_url.clone())
                .await
                .with_context(|| format!("opening wal_storage {wal_url:?}"))?;
            let wal_config = StackConfig {
                seed: seed.rotate_left(29) ^ 0x2545_f491_4f6c_dd1d,
                ..StackConfig::default()
            };
            let wal = StorageStack::build(wal_backend, &wal_config, Arc::clone(&clock));
            refuse_untiered_data(&wal, &storage, wal_url, &settings.storage).await?;
            let tiered = StorageStack {
                store: Arc::new(TieredStore::new(
                    Arc::clone(&wal.store),
                    Arc::clone(&storage.store),
                    strata_layout::tier::ROUTING,
                )),
                metrics: Arc::clone(&wal.metrics),
                health: Arc::clone(&wal.health),
            };
            info!(wal = %wal_url, bulk = %settings.storage, "tiered storage: write-ahead tier and bulk tier");
            (tiered, Some((storage, wal.store.backend_name())))
        }
    };
    // With tiers, the write-ahead tier's backend: the router itself is no backend.
    let backend_name = match &bulk {
        Some((_, wal_backend)) => *wal_backend,
        None => storage.store.backend_name(),
    };
    let health_watch = tokio::spawn(health::watch(
        if bulk.is_some() {
            "wal tier"
        } else {
            backend_name
        },
        Arc::clone(&storage.health),
        Arc::clone(&clock),
    ));
    let mut metrics_source = MetricsSource::new(
        backend_name,
        Arc::clone(&storage.metrics),
        Arc::clone(&storage.health),
        Arc::clone(&clock),
    )
    .with_s3_prices(strata_storage::RequestPrices {
        per_1000_puts: settings.s3_price_per_1000_put_requests,
        per_1000_gets: settings.s3_price_per_1000_get_requests,
    });
    let bulk_health_watch = match &bulk {
        Some((bulk, _)) => {
            metrics_source = metrics_source.with_bulk_tier(
                bulk.store.backend_name(),
                Arc::clone(&bulk.metrics),
                Arc::clone(&bulk.health),
            );
            Some(tokio::spawn(health::watch(
                "bulk tier",
                Arc::clone(&bulk.health),
                Arc::clone(&clock),
            )))
        }
        None => None,
    };
    let metrics = Arc::new(metrics_source);
    // Up before the log opens, so /health answers (and shows storage failing) during a long
    // recovery, and a bad address fails before any recovery work.
    let metrics_server = match settings.metrics_listen {
        Some(address) => {
            let listener = TcpListener::bind(address)
                .await
                .with_context(|| format!("binding metrics_listen {address}"))?;
            let bound = listener
                .local_addr()
                .context("reading the bound metrics address")?;
            info!("metrics on {bound}");
            let limits = http::HttpLimits {
                max_connections: settings.metrics_max_connections,
                timeout: settings.metrics_timeout,
                token: metrics_token(&settings)?,
            };
            Some(tokio::spawn(http::serve(
                listener,
                Arc::clone(&metrics),
                limits,
            )))
        }
        None => None,
    };
    let (wal_scheme, bulk_scheme) = settings.tier_schemes();
    let cluster_settings = settings
        .cluster
        .then(|| settings.cluster_settings(&wal_scheme));
    // Bound before anything else so the advertised addresses (which a cluster registration
    // carries) are known; connections wait in the backlog until serving starts.
    let specs = settings.listener_specs()?;
    let client_auth = settings.ssl_client_auth_modes(&specs)?;
    let mut tls_contexts = Vec::new();
    let mut listeners = Vec::new();
    for spec in specs {
        let listener = TcpListener::bind(spec.bind)
            .await
            .with_context(|| format!("binding listener {} on {}", spec.name, spec.bind))?;
        let bound = listener.local_addr().context("reading the bound address")?;
        let (host, port) = match &spec.advertised {
            Some(advertised) => advertised.clone(),
            None if settings.listeners.is_none() => advertised(&settings, bound)?,
            None => default_advertised(bound),
        };
        let tls = match client_auth.iter().find(|(name, _)| *name == spec.name) {
            Some((_, mode)) => {
                let context = Arc::new(tls_context(&settings, *mode)?);
                tls_contexts.push(Arc::clone(&context));
                Some(context)
            }
            None => None,
        };
        let info = strata_broker::security::Listener {
            name: spec.name.clone(),
            protocol: spec.protocol,
            advertised_host: host,
            advertised_port: port,
            tls,
        };
        listeners.push((listener, info, bound));
    }
    if !tls_contexts.is_empty() {
        tokio::spawn(strata_broker::security::tls::TlsContext::watch(
            tls_contexts,
            Arc::clone(&clock),
            settings.ssl_reload_interval,
            metrics.tls_reload_stats(),
        ));
    }
    // Bound now, so a taken port fails before recovery; served once the broker is.
    let console_listener = match settings.console_listen {
        Some(address) => {
            // A SASL login talks to the broker as the user, on a SASL_PLAINTEXT listener.
            let (wanted, name) = match &settings.console_sasl_mechanism {
                Some(_) => (
                    strata_broker::security::SecurityProtocol::SaslPlaintext,
                    "SASL_PLAINTEXT (console_sasl_mechanism is set)",
                ),
                None => (
                    strata_broker::security::SecurityProtocol::Plaintext,
                    "PLAINTEXT",
                ),
            };
            let listener = listeners
                .iter()
                .find(|(_, info, _)| info.protocol == wanted);
            let Some((_, _, own)) = listener else {
                anyhow::bail!(
                    "console_listen needs a {name} listener: the console reads topics and \
                     groups as a Kafka client of this broker"
                );
            };
            Some((console::bind(address).await?, console::own_bootstrap(*own)))
        }
        None => None,
    };
    // The first listener is the broker's address in its cluster registration and in
    // DescribeConfigs; each client is told the endpoint of the listener it came in on.
    let (bound, advertised_host, advertised_port) = match listeners.first() {
        Some((_, info, bound)) => (*bound, info.advertised_host.clone(), info.advertised_port),
        None => anyhow::bail!("no listener to bind"),
    };
    let listeners_text = listeners
        .iter()
        .map(|(_, info, bound)| format!("{}://{bound}", info.name))
        .collect::<Vec<_>>()
        .join(",");
    // In cluster mode the broker joins first: an allocated node id is known only then, and the
    // log's write-ahead stream is registered under it.
    let joined = match &cluster_settings {
        Some(cluster) => Some(
            ClusterNode::join_with_listeners(
                Arc::clone(&storage.store),
                Arc::clone(&clock),
                cluster,
                settings.node_id.map(BrokerId),
                (advertised_host.clone(), advertised_port),
                listeners
                    .iter()
                    .map(|(_, info, _)| ListenerEndpoint {
                        name: info.name.clone(),
                        host: info.advertised_host.clone(),
                        port: info.advertised_port,
                    })
                    .collect(),
                seed.rotate_left(17) ^ 0x5851_f42d_4c95_7f2d,
            )
            .await
            .context("joining the cluster")?,
        ),
        None => None,
    };
    let node_id = joined
        .as_ref()
        .map_or(BrokerId(settings.node_id.unwrap_or(0)), Joined::node_id);
    // In cluster mode the log serves nothing until ownership is acquired.
    let log_mode = if joined.is_some() {
        LogOwnership::Managed
    } else {
        LogOwnership::All
    };
    let log = LogManager::open_with(
        Arc::clone(&storage.store),
        Arc::clone(&clock),
        strata_log::LogConfig {
            tiered: settings.wal_storage.is_some(),
            ..settings.log.to_log_config(&wal_scheme, &bulk_scheme)?
        },
        node_id,
        log_mode,
    )
    .await
    .with_context(|| format!("opening the log on {}", settings.storage))?;
    metrics.attach_log(Arc::clone(&log));

    let parts = BrokerParts {
        log: Arc::clone(&log),
        clock: Arc::clone(&clock),
        settings: BrokerSettings {
            node_id,
            advertised_host: advertised_host.clone(),
            advertised_port,
            cluster_id: settings.cluster_id.clone(),
            max_request_bytes: usize::try_from(settings.max_request_bytes.0)
                .context("max_request_bytes")?,
            max_connections: settings.max_connections,
            max_connections_per_ip: settings.max_connections_per_ip,
            connections_max_idle: settings.connections_max_idle,
            request_read_timeout: settings.request_read_timeout,
            queued_max_request_bytes: usize::try_from(settings.queued_max_request_bytes.0)
                .context("queued_max_request_bytes")?,
            auto_create_topics_per_request: settings.auto_create_topics_per_request,
            auto_create_topics_per_second: settings.auto_create_topics_per_second,
            default_replication_factor: settings.default_replication_factor,
            max_inflight_requests_per_connection: settings.max_inflight_requests_per_connection,
            max_request_partition_size_limit: settings.max_request_partition_size_limit,
            listeners: listeners_text,
            log_dir: settings::log_dir_name(&settings.storage),
            auto_create_topics: settings.auto_create_topics,
            shutdown_grace: settings.shutdown_grace,
            group_shards: settings.group_shards,
            txn_shards: settings.txn_shards,
            transaction_max_timeout: settings.transaction_max_timeout,
            transaction_abort_timed_out_interval: settings.transaction_abort_timed_out_interval,
            transactional_id_expiration: settings.transactional_id_expiration,
            group_max_size: settings.group_max_size,
            group_initial_rebalance_delay: settings.group_initial_rebalance_delay,
            group_min_session_timeout: settings.group_min_session_timeout,
            group_max_session_timeout: settings.group_max_session_timeout,
            offsets_commit_timeout: settings.offsets_commit_timeout,
            txn_marker_timeout: settings.txn_marker_timeout,
            inter_broker_listener_name: settings.inter_broker_listener_name.clone(),
            inter_broker_sasl: inter_broker_sasl(&settings)?,
            inter_broker_tls: inter_broker_tls(&settings)?,
            group_consumer_session_timeout: settings.group_consumer_session_timeout,
            group_consumer_heartbeat_interval: settings.group_consumer_heartbeat_interval,
            group_consumer_migration_policy: strata_broker::MigrationPolicy::parse(
                &settings.group_consumer_migration_policy,
            )
            .unwrap_or_default(),
            group_share_session_timeout: settings.group_share_session_timeout,
            group_share_heartbeat_interval: settings.group_share_heartbeat_interval,
            group_share_max_groups: settings.group_share_max_groups,
            group_share_max_size: settings.group_share_max_size,
            group_share_record_lock_duration: settings.group_share_record_lock_duration,
            group_share_delivery_count_limit: settings.group_share_delivery_count_limit,
            group_share_partition_max_record_locks: settings.group_share_partition_max_record_locks,
            group_share_max_share_sessions: settings.group_share_max_share_sessions,
            group_share_max_partitions: settings.group_share_max_partitions,
            share_auto_offset_reset: strata_broker::share::ShareAutoOffsetReset::parse(
                &settings.share_auto_offset_reset,
            )
            .unwrap_or_default(),
            max_incremental_fetch_session_cache_slots: settings
                .max_incremental_fetch_session_cache_slots,
            max_incremental_fetch_session_partitions: settings
                .max_incremental_fetch_session_partitions,
            min_incremental_fetch_session_eviction: settings.min_incremental_fetch_session_eviction,
            cluster: cluster_settings,
            sasl_enabled_mechanisms: settings.sasl_mechanisms(),
            authentication_timeout: settings.authentication_timeout,
            sasl_user_cache_ttl: settings.sasl_user_cache_ttl,
            sasl_user_cache_entries: settings.sasl_user_cache_entries,
            connections_max_reauth: settings.connections_max_reauth,
            authorizer: settings.authorizer_config(),
            acl_refresh_interval: settings.acl_refresh_interval,
            quota_window_num: settings.quota_window_num,
            quota_window_size: settings.quota_window_size,
            quota_max_throttle: settings.quota_max_throttle,
            quota_max_tracked: settings.quota_max_tracked,
            quota_refresh_interval: settings.quota_refresh_interval,
            ..BrokerSettings::default()
        },
        // Not the jitter seed itself: the two streams of numbers stay independent.
        member_id_seed: seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15,
    };
    // Loaded before the broker starts: a bad key file stops start-up, as a bad certificate does.
    let oauth = match (
        settings.oauth_settings(),
        &settings.sasl_oauthbearer_jwks_file,
    ) {
        (Some(oauth), Some(jwks)) => Some(
            strata_broker::security::oauth::TokenValidator::from_jwks_file(
                jwks,
                oauth,
                Arc::clone(&clock),
            )
            .context("loading sasl_oauthbearer_jwks_file")?,
        ),
        _ => None,
    };
    let broker = match joined {
        Some(joined) => Broker::open_joined(parts, Arc::clone(&storage.store), joined)
            .await
            .context("joining the cluster")?,
        None => Broker::open(parts)
            .await
            .context("starting the consumer-group coordinator (__consumer_offsets)")?,
    };
    let broker = match oauth {
        Some(oauth) => broker.with_oauth(oauth),
        None => broker,
    };
    let broker = Arc::new(
        broker
            .with_users(Arc::clone(&storage.store))
            .with_share_state(Arc::clone(&storage.store))
            .with_acls(Arc::clone(&storage.store))
            .await
            .context("reading the ACLs from storage")?
            .with_quotas(Arc::clone(&storage.store)),
    );
    metrics.attach_broker(Arc::clone(&broker));
    if let Some(node) = broker.cluster() {
        metrics.attach_cluster(Arc::clone(node));
    }
    info!(
        node_id = node_id.0,
        storage = %settings.storage,
        advertised = %format!("{advertised_host}:{advertised_port}"),
        "strata {} started",
        env!("CARGO_PKG_VERSION")
    );
    // Each listener before the `listening on` line: whoever waits for that line (the tests'
    // harness) may then read them all.
    for (_, info, bound) in &listeners {
        info!(
            "listener {} ({}) on {bound}, advertised as {}:{}",
            info.name,
            info.protocol.name(),
            info.advertised_host,
            info.advertised_port
        );
    }
    // Consumer-group lag on /metrics: the broker asks itself as a Kafka client, through its
    // first PLAINTEXT listener (as the console does).
    let plaintext_bootstrap = listeners
        .iter()
        .find(|(_, info, _)| info.protocol == strata_broker::security::SecurityProtocol::Plaintext)
        .map(|(_, _, own)| console::own_bootstrap(*own));
    let lag_task = match (&settings.metrics_listen, &plaintext_bootstrap) {
        (Some(_), Some(bootstrap)) if !settings.group_lag_interval.is_zero() => {
            let lag = Arc::new(lag::LagMetrics::default());
            metrics.attach_lag(Arc::clone(&lag));
            Some(tokio::spawn(lag::run(
                bootstrap.clone(),
                node_id.0,
                Arc::clone(&clock),
                settings.group_lag_interval,
                lag,
            )))
        }
        (Some(_), None) if !settings.group_lag_interval.is_zero() => {
            info!("no PLAINTEXT listener: consumer-group lag is not reported on /metrics");
            None
        }
        _ => None,
    };
    let listeners: Vec<_> = listeners
        .into_iter()
        .map(|(listener, info, _)| (listener, info))
        .collect();
    let console_server = match console_listener {
        Some((listener, bootstrap)) => {
            let console = console::Console::new(
                bootstrap,
                Arc::clone(&storage.store),
                Arc::clone(&clock),
                node_id.0,
                broker.cluster().is_some(),
                match settings
                    .console_sasl_mechanism
                    .as_deref()
                    .and_then(strata_client::SaslMechanism::parse)
                {
                    Some(mechanism) => console::Login::Sasl(mechanism),
                    None => console::Login::Token(metrics_token(&settings)?),
                },
            );
            Some(tokio::spawn(console::serve(listener, Arc::new(console))))
        }
        None => None,
    };
    info!("listening on {bound}");

    match broker.cluster().cloned() {
        None => {
            // Standalone, nothing heartbeats: another standalone broker started on the same
            // storage seals our stream, and we would learn it only from our next write — while
            // answering Metadata as leader and serving stale reads. Watch for the seal instead,
            // and exit like a fenced cluster broker.
            let sealed = watch_for_seal(
                Arc::clone(&log),
                Arc::clone(&clock),
                settings.standalone_seal_check,
            );
            tokio::select! {
                () = broker.serve_listeners(listeners, shutdown_signal()) => {}
                () = sealed => anyhow::bail!(
                    "another broker took this storage over (it sealed our write-ahead stream); \
                     exiting: run one standalone broker per storage, or use cluster mode"
                ),
            }
        }
        Some(node) => {
            // On a signal, hand partitions over while clients can still be told where they
            // went; if this broker is fenced, exit non-zero at once: it can acknowledge
            // nothing more, and its supervisor restarts it as a new incarnation.
            let leaving = Arc::clone(&node);
            let grace = settings.shutdown_grace;
            let stopped = async move {
                shutdown_signal().await;
                leaving.leave(grace).await;
            };
            tokio::select! {
                () = broker.serve_listeners(listeners, stopped) => {}
                reason = node.fatal() => {
                    node.withdraw(Duration::from_secs(2)).await;
                    anyhow::bail!(
                        "fenced out of the cluster ({reason}); exiting so that a supervisor \
                         restarts this broker as a new incarnation"
                    )
                }
            }
        }
    }
    info!("flushing and checkpointing the log");
    log.shutdown().await.context("shutting down the log")?;
    // Kept until the log is flushed, so a slow shutdown can still be watched.
    if let Some(server) = metrics_server {
        server.abort();
    }
    if let Some(server) = console_server {
        server.abort();
    }
    if let Some(task) = lag_task {
        task.abort();
    }
    health_watch.abort();
    if let Some(watch) = bulk_health_watch {
        watch.abort();
    }
    info!("stopped");
    Ok(())
}

/// Resolves once the log learns it is fenced: from a write that hit a seal, or from a look at
/// our own stream every `every` (a listing of our stream and a few small reads).
async fn watch_for_seal(log: Arc<LogManager>, clock: Arc<dyn Clock>, every: Duration) {
    let mut fenced = log.fenced();
    loop {
        if *fenced.borrow_and_update() {
            return;
        }
        tokio::select! {
            changed = fenced.changed() => {
                if changed.is_err() {
                    // The log is gone (shutting down): nothing more to watch.
                    std::future::pending::<()>().await;
                }
            }
            () = clock.sleep(every) => match log.is_sealed().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "could not check whether our stream was sealed"),
            },
        }
    }
}

/// Refuses to start tiered over a bulk tier that was used as a single storage (it holds a
/// topic catalog) while the write-ahead tier holds none: the catalog, manifests and cluster
/// objects would be looked for on the new write-ahead tier, so the broker would start empty
/// beside the old data instead of serving it.
async fn refuse_untiered_data(
    wal: &StorageStack,
    bulk: &StorageStack,
    wal_url: &str,
    bulk_url: &str,
) -> anyhow::Result<()> {
    let catalog = strata_layout::catalog::PREFIX;
    let on_wal = !wal.store.list_keys(catalog).await?.is_empty();
    if !on_wal && !bulk.store.list_keys(catalog).await?.is_empty() {
        anyhow::bail!(
            "storage {bulk_url:?} holds a topic catalog of its own: it was used as a single \
             storage, and with wal_storage {wal_url:?} its topics, offsets and cluster state \
             would be looked for on the write-ahead tier instead. Tiering existing data is not \
             supported: start without wal_storage, or give the bulk tier a fresh location"
        );
    }
    Ok(())
}

/// Opens the storage URL with every backend this binary has: memory and local directories
/// (built in), S3, and RADOS when built with the `rados` feature. Connecting may block (RADOS
/// talks to its monitors), so it runs off the async workers.
async fn open_backend(url: String) -> anyhow::Result<Arc<dyn strata_storage::ObjectStore>> {
    let mut registry = StoreRegistry::with_builtins();
    registry.register("s3", strata_storage_s3::open);
    registry.register("rados", strata_storage_rados::open);
    let store = tokio::task::spawn_blocking(move || registry.open(&url))
        .await
        .context("storage opener panicked")??;
    Ok(store)
}

/// The address clients are told to use: the configured one, or the bound one (with the host
/// name instead of a wildcard address, which clients cannot connect to).
/// The TLS configuration of one SSL or SASL_SSL listener.
fn tls_context(
    settings: &Settings,
    client_auth: strata_broker::security::tls::ClientAuth,
) -> anyhow::Result<strata_broker::security::tls::TlsContext> {
    use strata_broker::security::tls::{TlsContext, TlsFiles};
    let (Some(certificate), Some(key)) = (&settings.ssl_certificate, &settings.ssl_key) else {
        anyhow::bail!("a TLS listener needs ssl_certificate and ssl_key");
    };
    let mapper = strata_broker::security::principal_mapping::PrincipalMapper::parse(
        &settings.ssl_principal_mapping_rules,
    )?;
    let files = TlsFiles {
        certificate: certificate.clone(),
        key: key.clone(),
        truststore: settings.ssl_truststore.clone(),
    };
    TlsContext::load(files, client_auth, mapper)
        .context("loading ssl_certificate, ssl_key and ssl_truststore")
}

/// What a named listener without an advertised endpoint advertises: its bound address, or
/// the machine's name if it listens on all interfaces.
fn default_advertised(bound: SocketAddr) -> (String, u16) {
    if bound.ip().is_unspecified() {
        return (machine_name(), bound.port());
    }
    (bound.ip().to_string(), bound.port())
}

/// The machine's host name, what a broker listening on all interfaces advertises.
fn machine_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|n| n.trim().to_string())
        .unwrap_or_default();
    if name.is_empty() {
        "localhost".to_string()
    } else {
        name
    }
}

fn advertised(settings: &Settings, bound: SocketAddr) -> anyhow::Result<(String, u16)> {
    if let Some(advertised) = &settings.advertised_listener {
        return parse_host_port(advertised)
            .map_err(|e| anyhow::anyhow!("advertised_listener: {e}"));
    }
    let host = if bound.ip().is_unspecified() {
        let name = machine_name();
        warn!(host = %name, "listening on all interfaces; advertising the host name (set advertised_listener to choose)");
        name
    } else {
        bound.ip().to_string()
    };
    Ok((host, bound.port()))
}

/// Completes on the first SIGINT or SIGTERM. A second signal exits at once, for when a graceful
/// shutdown hangs.
async fn shutdown_signal() {
    wait_for_signal().await;
    info!("shutdown requested; stopping (signal again to exit at once)");
    tokio::spawn(async {
        wait_for_signal().await;
        warn!("second signal; exiting without finishing");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the broker");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
