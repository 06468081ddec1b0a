//! The broker's metrics in the Prometheus text exposition format (version 0.0.4), rendered on
//! demand from the storage counters and the log's state — nothing is recorded here, so a scrape
//! costs one pass over a few atomics and the served partitions, and no scrape costs nothing.

use std::fmt::{self, Write};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use strata_broker::cluster::{ClusterMetrics, ClusterNode};
use strata_broker::traffic::{
    TopicTraffic, TrafficSnapshot, LATENCY_BUCKETS as TRAFFIC_LATENCY_BUCKETS,
};
use strata_broker::{Broker, FetchSessionStats};
use strata_core::{Clock, TopicPartition};
use strata_log::LogManager;
use strata_storage::{
    RequestPrices, StorageHealth, StorageHealthSnapshot, StorageMetrics, StorageMetricsSnapshot,
    LATENCY_BUCKET_BOUNDS,
};

/// Storage counts as unhealthy once this many requests in a row have failed. One or two failures
/// are routine on object stores (a throttled request, a retried timeout); three in a row, each
/// already past the timeout, means storage is not answering.
pub const UNHEALTHY_AFTER_FAILURES: u64 = 3;

/// At most this many `strata_log_high_watermark` series (the first partitions by topic name and
/// partition number). Every served partition is a series, and a broker with tens of thousands of
/// partitions would otherwise make each scrape — and the time-series database — that much larger.
/// `strata_log_high_watermark_omitted` says how many were left out.
pub const MAX_WATERMARK_SERIES: usize = 1000;

/// Where the numbers come from. The log is attached once it has opened, so the endpoint (and
/// `/health` in particular) answers during a long log recovery too.
#[derive(Debug)]
pub struct MetricsSource {
    backend: String,
    metrics: Arc<StorageMetrics>,
    health: Arc<StorageHealth>,
    /// The bulk tier's, when `wal_storage` splits storage in two (the fields above are then the
    /// write-ahead tier's).
    bulk: Option<TierSource>,
    log: OnceLock<Arc<LogManager>>,
    cluster: OnceLock<Arc<ClusterNode>>,
    broker: OnceLock<Arc<Broker>>,
    /// Consumer-group lag passes (`group_lag_interval`); None when they are off.
    lag: OnceLock<Arc<crate::lag::LagMetrics>>,
    /// Reloads of the TLS files (`ssl_reload_interval`).
    tls_reloads: Arc<strata_broker::security::tls::TlsReloadStats>,
    /// Prices for the estimated request cost of S3 tiers.
    s3_prices: RequestPrices,
    clock: Arc<dyn Clock>,
    started: Duration,
}

impl MetricsSource {
    /// The clock the endpoint times its clients on.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// `backend` labels the storage series (the store's `backend_name()`, e.g. "s3", "file").
    pub fn new(
        backend: impl Into<String>,
        metrics: Arc<StorageMetrics>,
        health: Arc<StorageHealth>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let started = clock.monotonic();
        // By area, so an operator can tell which poller an idle broker's requests come from.
        metrics.set_key_areas(strata_layout::key_area);
        Self {
            backend: backend.into(),
            metrics,
            health,
            bulk: None,
            log: OnceLock::new(),
            cluster: OnceLock::new(),
            broker: OnceLock::new(),
            lag: OnceLock::new(),
            tls_reloads: Arc::default(),
            s3_prices: RequestPrices::S3_STANDARD,
            clock,
            started,
        }
    }

    /// Tiered storage: the constructor's storage is the write-ahead tier, this the bulk tier.
    /// Each tier's series then carry `tier="wal"` or `tier="bulk"`.
    pub fn with_bulk_tier(
        mut self,
        backend: impl Into<String>,
        metrics: Arc<StorageMetrics>,
        health: Arc<StorageHealth>,
    ) -> Self {
        metrics.set_key_areas(strata_layout::key_area);
        self.bulk = Some(TierSource {
            backend: backend.into(),
            metrics,
            health,
        });
        self
    }

    /// What S3 charges per request, for `strata_storage_request_cost_per_gb_ingested`.
    pub fn with_s3_prices(mut self, prices: RequestPrices) -> Self {
        self.s3_prices = prices;
        self
    }

    /// Adds the log's metrics from now on. Only the first call counts.
    pub fn attach_log(&self, log: Arc<LogManager>) {
        let _ = self.log.set(log);
    }

    /// Cluster mode: membership and ownership changes are reported from now on.
    pub fn attach_cluster(&self, node: Arc<ClusterNode>) {
        let _ = self.cluster.set(node);
    }

    /// The Kafka front end's own counts (fetch sessions) are reported from now on.
    pub fn attach_broker(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    /// Where the TLS file watcher counts its reloads.
    pub fn tls_reload_stats(&self) -> Arc<strata_broker::security::tls::TlsReloadStats> {
        Arc::clone(&self.tls_reloads)
    }

    /// Consumer-group lag is reported from now on. Only the first call counts.
    pub fn attach_lag(&self, lag: Arc<crate::lag::LagMetrics>) {
        let _ = self.lag.set(lag);
    }

    /// The storage's health; with tiers, the first unhealthy tier's (the write-ahead tier's
    /// first: produce stops with it), so either tier failing turns `/health` 503.
    pub fn health(&self) -> StorageHealthSnapshot {
        let wal = self.health.snapshot();
        match &self.bulk {
            Some(bulk) if wal.is_healthy(UNHEALTHY_AFTER_FAILURES) => bulk.health.snapshot(),
            _ => wal,
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            backend: self.backend.clone(),
            storage: self.metrics.snapshot(),
            health: self.health.snapshot(),
            bulk: self.bulk.as_ref().map(|bulk| TierSnapshot {
                backend: bulk.backend.clone(),
                storage: bulk.metrics.snapshot(),
                health: bulk.health.snapshot(),
            }),
            log: self.log.get().map(|log| log_snapshot(log)),
            cluster: self.cluster.get().map(|node| node.metrics()),
            fetch_sessions: self.broker.get().map(|broker| broker.fetch_session_stats()),
            share: self.broker.get().map(|broker| broker.share_state().stats()),
            transactions: self.broker.get().map(|broker| broker.txn_stats()),
            group_loads: self.broker.get().map(|broker| broker.group_load_stats()),
            authentications: self
                .broker
                .get()
                .map(|broker| broker.auth_stats().snapshot())
                .unwrap_or_default(),
            traffic: self.broker.get().map(|broker| broker.traffic().snapshot()),
            authorization_denied: self
                .broker
                .get()
                .map(|broker| broker.authorization_denied())
                .unwrap_or_default(),
            throttles: self
                .broker
                .get()
                .map(|broker| broker.throttle_stats().snapshot())
                .unwrap_or_default(),
            lag: self.lag.get().and_then(|lag| lag.snapshot()),
            tls_reloads: self.tls_reloads.snapshot(),
            s3_prices: self.s3_prices,
            uptime: self.clock.monotonic().saturating_sub(self.started),
        }
    }

    pub fn render(&self) -> String {
        render(&self.snapshot())
    }
}

fn log_snapshot(log: &LogManager) -> LogSnapshot {
    let mut served: Vec<TopicPartition> = log.served().into_iter().map(|(tp, _)| tp).collect();
    let partitions_served = served.len();
    // Sorted, so the capped set is the same from one scrape to the next.
    served.sort_unstable_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    served.truncate(MAX_WATERMARK_SERIES);
    // A partition released or deleted since `served()` has no watermark any more: skip it.
    let high_watermarks = served
        .into_iter()
        .filter_map(|tp| log.watermarks(&tp).ok().map(|w| (tp, w.high.0)))
        .collect();
    let mut dirty_ratios = log.dirty_ratios();
    dirty_ratios.truncate(MAX_WATERMARK_SERIES);
    LogSnapshot {
        cache_bytes: log.cache_used() as u64,
        partitions_served,
        high_watermarks,
        cleaner: log.cleaner_stats(),
        tiering: log.tiering_stats(),
        reads: log.read_stats(),
        read_ahead: log.read_ahead_stats(),
        dirty_ratios,
        txn: log.txn_stats(),
    }
}

#[derive(Debug)]
struct TierSource {
    backend: String,
    metrics: Arc<StorageMetrics>,
    health: Arc<StorageHealth>,
}

/// The bulk tier's storage numbers.
#[derive(Debug, Clone)]
pub struct TierSnapshot {
    pub backend: String,
    pub storage: StorageMetricsSnapshot,
    pub health: StorageHealthSnapshot,
}

/// Everything one scrape reports.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The storage, or with tiers the write-ahead tier.
    pub backend: String,
    pub storage: StorageMetricsSnapshot,
    pub health: StorageHealthSnapshot,
    /// The bulk tier, when `wal_storage` is set.
    pub bulk: Option<TierSnapshot>,
    /// None until the log has opened.
    pub log: Option<LogSnapshot>,
    /// None in standalone mode and until the broker joined its cluster.
    pub cluster: Option<ClusterMetrics>,
    /// None until the broker has started.
    pub fetch_sessions: Option<FetchSessionStats>,
    /// Share groups (KIP-932); None until the broker has started.
    pub share: Option<strata_broker::share::ShareStats>,
    /// Transactions coordinated here. None until the broker has started.
    pub transactions: Option<strata_broker::txn_coordinator::TxnStatsSnapshot>,
    /// Group coordinator shard loads. None until the broker has started.
    pub group_loads: Option<strata_broker::coordinator::GroupLoadSnapshot>,
    /// Authentication outcomes: (mechanism, result, count).
    pub authentications: Vec<(String, &'static str, u64)>,
    /// Requests per API, traffic per topic, connections. None until the broker has started.
    pub traffic: Option<TrafficSnapshot>,
    /// Checks the ACL authorizer refused, by (resource type, operation).
    pub authorization_denied: Vec<(&'static str, &'static str, u64)>,
    /// Client-quota throttles: (kind, seconds, throttled responses).
    pub throttles: Vec<(&'static str, f64, u64)>,
    /// Consumer-group lag of the groups coordinated here, as of the last pass; None before
    /// the first pass or when `group_lag_interval` is 0s.
    pub lag: Option<crate::lag::LagSnapshot>,
    /// TLS file reloads: (swapped in, refused).
    pub tls_reloads: (u64, u64),
    /// Prices for the estimated request cost of S3 tiers.
    pub s3_prices: RequestPrices,
    pub uptime: Duration,
}

#[derive(Debug, Clone)]
pub struct LogSnapshot {
    pub cache_bytes: u64,
    pub partitions_served: usize,
    /// At most [`MAX_WATERMARK_SERIES`], sorted by topic and partition.
    pub high_watermarks: Vec<(TopicPartition, i64)>,
    /// The log cleaner's counters (key compaction).
    pub cleaner: strata_log::CleanerSnapshot,
    /// Segments moved from the fast tier to the bulk tier (`local.retention.*`).
    pub tiering: strata_log::TieringSnapshot,
    /// Partition reads by where they were served from.
    pub reads: strata_log::read::ReadSnapshot,
    pub read_ahead: strata_log::ReadAheadSnapshot,
    /// Served partitions of compacted topics and their dirty ratios (same cap, same order).
    pub dirty_ratios: Vec<(TopicPartition, f64)>,
    /// Transactions on the partition side (open ones, markers written).
    pub txn: strata_log::TxnSnapshot,
}

/// A per-topic counter family: name, help, and which count it reports.
type TopicFamily = (&'static str, &'static str, fn(&TopicTraffic) -> u64);

/// Kafka's request and topic metrics, and connections.
fn render_traffic(out: &mut Exposition, traffic: &TrafficSnapshot) {
    out.family(
        "strata_requests_total",
        "counter",
        "Kafka requests received, by API (Kafka's name: Produce, Fetch, Metadata, ...).",
    );
    for api in &traffic.apis {
        out.sample("strata_requests_total", &[("api", api.api)], api.requests);
    }
    out.family(
        "strata_requests_refused_total",
        "counter",
        "Kafka requests answered by closing the connection (an unsupported version or API, an unreadable body, a failed acks=0 produce), by API.",
    );
    for api in &traffic.apis {
        out.sample(
            "strata_requests_refused_total",
            &[("api", api.api)],
            api.refused,
        );
    }
    out.family(
        "strata_request_errors_total",
        "counter",
        "Error codes in the responses sent, by API and Kafka's error name (NONE for success); every partition, topic or group outcome counts, as in Kafka's ErrorsPerSec.",
    );
    for api in &traffic.apis {
        for (error, count) in &api.errors {
            out.sample(
                "strata_request_errors_total",
                &[("api", api.api), ("error", error.as_str())],
                *count,
            );
        }
    }
    out.family(
        "strata_request_seconds",
        "histogram",
        "Time from a request's frame to its reply, by API: includes a fetch's long poll and a produce's wait for durable storage, not the queueing behind earlier requests of the connection.",
    );
    for api in &traffic.apis {
        let labels = [("api", api.api)];
        let mut cumulative = 0u64;
        for (i, bound) in TRAFFIC_LATENCY_BUCKETS.iter().enumerate() {
            cumulative += api.buckets.get(i).copied().unwrap_or(0);
            let le = Float(*bound).to_string();
            out.sample(
                "strata_request_seconds_bucket",
                &[labels[0], ("le", le.as_str())],
                cumulative,
            );
        }
        out.sample(
            "strata_request_seconds_bucket",
            &[labels[0], ("le", "+Inf")],
            api.requests,
        );
        out.sample("strata_request_seconds_sum", &labels, Float(api.seconds));
        out.sample("strata_request_seconds_count", &labels, api.requests);
    }
    let topic_families: [TopicFamily; 3] = [
        (
            "strata_topic_bytes_in_total",
            "Record-batch bytes accepted from producers, by topic (Kafka's BytesInPerSec).",
            |t| t.bytes_in,
        ),
        (
            "strata_topic_records_in_total",
            "Records accepted from producers, by topic (Kafka's MessagesInPerSec), as their batch headers declare them.",
            |t| t.records_in,
        ),
        (
            "strata_topic_bytes_out_total",
            "Record-batch bytes sent to fetching clients, by topic (Kafka's BytesOutPerSec).",
            |t| t.bytes_out,
        ),
    ];
    for (name, help, value) in topic_families {
        out.family(name, "counter", help);
        for (topic, counts) in &traffic.topics {
            out.sample(name, &[("topic", topic)], value(counts));
        }
    }
    out.family(
        "strata_topic_traffic_omitted_total",
        "counter",
        "Traffic of topics past the first 1000 seen, which get no series of their own (kind: bytes_in, records_in, bytes_out).",
    );
    for (kind, value) in [
        ("bytes_in", traffic.omitted.bytes_in),
        ("records_in", traffic.omitted.records_in),
        ("bytes_out", traffic.omitted.bytes_out),
    ] {
        out.sample(
            "strata_topic_traffic_omitted_total",
            &[("kind", kind)],
            value,
        );
    }
    out.family(
        "strata_connections",
        "gauge",
        "Client connections open now, over all listeners (max_connections bounds it).",
    );
    out.sample("strata_connections", &[], traffic.connections_open);
    out.family(
        "strata_connections_accepted_total",
        "counter",
        "Client connections accepted since start.",
    );
    out.sample(
        "strata_connections_accepted_total",
        &[],
        traffic.connections_accepted,
    );
}

/// One storage tier's base labels, counters and health, as rendered.
type TierRow<'a> = (
    Vec<(&'a str, &'a str)>,
    &'a StorageMetricsSnapshot,
    &'a StorageHealthSnapshot,
);

/// The exposition text for `snapshot`.
pub fn render(snapshot: &Snapshot) -> String {
    let mut out = Exposition::default();
    // One storage: series labelled by backend alone, as before tiers existed. Two tiers: each
    // tier's series also carry `tier`, so dashboards of a single storage need no change.
    let mut tiers: Vec<TierRow<'_>> = Vec::new();
    match &snapshot.bulk {
        None => tiers.push((
            vec![("backend", snapshot.backend.as_str())],
            &snapshot.storage,
            &snapshot.health,
        )),
        Some(bulk) => {
            tiers.push((
                vec![("backend", snapshot.backend.as_str()), ("tier", "wal")],
                &snapshot.storage,
                &snapshot.health,
            ));
            tiers.push((
                vec![("backend", bulk.backend.as_str()), ("tier", "bulk")],
                &bulk.storage,
                &bulk.health,
            ));
        }
    }
    fn with<'a>(
        base: &[(&'a str, &'a str)],
        more: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        let mut labels = base.to_vec();
        labels.extend_from_slice(more);
        labels
    }

    out.family(
        "strata_storage_requests_total",
        "counter",
        "Requests sent to object storage, by kind; every retry counts (object stores bill per request).",
    );
    for (base, storage, _) in &tiers {
        for (op, m) in storage.iter() {
            let labels = with(base, &[("op", op.as_str())]);
            out.sample("strata_storage_requests_total", &labels, m.requests);
        }
    }
    out.family(
        "strata_storage_requests_by_area_total",
        "counter",
        "Requests sent to object storage, by the part of the layout they touch (which tells the poller: membership, ownership, placement, placement_changes, drain, catalog, wal, partition, ...) and kind. What an idle broker costs is the rate of this family.",
    );
    for (base, storage, _) in &tiers {
        for (area, op, n) in storage.by_area() {
            let labels = with(base, &[("area", *area), ("op", op.as_str())]);
            out.sample("strata_storage_requests_by_area_total", &labels, n);
        }
    }
    out.family(
        "strata_storage_errors_total",
        "counter",
        "Storage requests that returned an error, including answers such as not-found or a lost conditional write.",
    );
    for (base, storage, _) in &tiers {
        for (op, m) in storage.iter() {
            let labels = with(base, &[("op", op.as_str())]);
            out.sample("strata_storage_errors_total", &labels, m.errors);
        }
    }
    out.family(
        "strata_storage_failures_total",
        "counter",
        "Storage requests the storage failed to serve (throttled, timed out, unavailable).",
    );
    for (base, storage, _) in &tiers {
        for (op, m) in storage.iter() {
            let labels = with(base, &[("op", op.as_str())]);
            out.sample("strata_storage_failures_total", &labels, m.failures);
        }
    }

    out.family(
        "strata_storage_bytes_total",
        "counter",
        "Payload bytes moved by successful storage requests: in = written to storage, out = read from it.",
    );
    for (base, storage, _) in &tiers {
        let bytes_in: u64 = storage.iter().map(|(_, m)| m.bytes_in).sum();
        let bytes_out: u64 = storage.iter().map(|(_, m)| m.bytes_out).sum();
        out.sample(
            "strata_storage_bytes_total",
            &with(base, &[("direction", "in")]),
            bytes_in,
        );
        out.sample(
            "strata_storage_bytes_total",
            &with(base, &[("direction", "out")]),
            bytes_out,
        );
    }

    out.family(
        "strata_storage_request_seconds",
        "histogram",
        "Latency of one storage request (one attempt; retries are separate requests).",
    );
    for (base, storage, _) in &tiers {
        for (op, m) in storage.iter() {
            let hist = &m.latency;
            let labels = with(base, &[("op", op.as_str())]);
            // The snapshot counts each bucket on its own; Prometheus buckets are cumulative.
            let mut cumulative = 0u64;
            for (i, bound) in LATENCY_BUCKET_BOUNDS.iter().enumerate() {
                cumulative += hist.counts.get(i).copied().unwrap_or(0);
                let le = Float(bound.as_secs_f64()).to_string();
                let mut bucket = labels.clone();
                bucket.push(("le", le.as_str()));
                out.sample("strata_storage_request_seconds_bucket", &bucket, cumulative);
            }
            // Requests slower than every bound are only in +Inf, which is therefore the total.
            let count = hist.count();
            let mut bucket = labels.clone();
            bucket.push(("le", "+Inf"));
            out.sample("strata_storage_request_seconds_bucket", &bucket, count);
            out.sample(
                "strata_storage_request_seconds_sum",
                &labels,
                Float(hist.sum.as_secs_f64()),
            );
            out.sample("strata_storage_request_seconds_count", &labels, count);
        }
    }

    out.family(
        "strata_storage_requests_per_gb_ingested",
        "gauge",
        "Storage requests of every kind per 10^9 bytes written since start: the request bill per unit of data stored. Absent before the first write.",
    );
    for (base, storage, _) in &tiers {
        if let Some(per_gb) = storage.requests_per_gb_ingested() {
            out.sample(
                "strata_storage_requests_per_gb_ingested",
                base,
                Float(per_gb),
            );
        }
    }

    out.family(
        "strata_storage_request_cost_per_gb_ingested",
        "gauge",
        "Estimated request cost per 10^9 bytes written since start, S3 storage only (RADOS and local disks bill no requests), at the configured s3_price_per_1000_* prices (default: AWS S3 Standard, USD). Absent before the first write.",
    );
    for (base, storage, _) in &tiers {
        let is_s3 = base.iter().any(|(k, v)| *k == "backend" && *v == "s3");
        if let Some(cost) = is_s3
            .then(|| snapshot.s3_prices.cost_per_gb_ingested(storage))
            .flatten()
        {
            out.sample(
                "strata_storage_request_cost_per_gb_ingested",
                base,
                Float(cost),
            );
        }
    }

    out.family(
        "strata_storage_healthy",
        "gauge",
        "1 unless the last 3 or more storage requests, or the last 3 or more writes, in a row failed.",
    );
    for (base, _, health) in &tiers {
        out.sample(
            "strata_storage_healthy",
            base,
            u64::from(health.is_healthy(UNHEALTHY_AFTER_FAILURES)),
        );
    }
    out.family(
        "strata_storage_consecutive_failures",
        "gauge",
        "Storage requests failed in a row since the last success.",
    );
    for (base, _, health) in &tiers {
        out.sample(
            "strata_storage_consecutive_failures",
            base,
            health.consecutive_failures,
        );
    }
    out.family(
        "strata_storage_consecutive_write_failures",
        "gauge",
        "Storage writes (puts) failed in a row since the last write that succeeded; reads do not reset it.",
    );
    for (base, _, health) in &tiers {
        out.sample(
            "strata_storage_consecutive_write_failures",
            base,
            health.consecutive_write_failures,
        );
    }

    if let Some(log) = &snapshot.log {
        out.family(
            "strata_log_cache_bytes",
            "gauge",
            "Bytes held by the shared tail cache.",
        );
        out.sample("strata_log_cache_bytes", &[], log.cache_bytes);
        out.family(
            "strata_log_partitions_served",
            "gauge",
            "Partitions this broker serves.",
        );
        out.sample(
            "strata_log_partitions_served",
            &[],
            log.partitions_served as u64,
        );
        out.family(
            "strata_log_high_watermark",
            "gauge",
            "One past the last durable offset of a served partition (the first 1000 partitions by topic and number).",
        );
        for (tp, high) in &log.high_watermarks {
            let partition = tp.partition.to_string();
            out.sample(
                "strata_log_high_watermark",
                &[("topic", &tp.topic), ("partition", &partition)],
                Int(*high),
            );
        }
        out.family(
            "strata_log_high_watermark_omitted",
            "gauge",
            "Served partitions left out of strata_log_high_watermark by its series cap.",
        );
        out.sample(
            "strata_log_high_watermark_omitted",
            &[],
            log.partitions_served.saturating_sub(MAX_WATERMARK_SERIES) as u64,
        );
        render_cleaner(&mut out, log);
        render_tiering(&mut out, log);
        out.family(
            "strata_log_reads_total",
            "counter",
            "Partition reads (fetches and replays) by where their batches came from: the tail cache in memory (a cache hit), the write-ahead objects of the uncompacted tail, or segments through the index (both storage reads).",
        );
        for (source, count) in [
            ("cache", log.reads.cache),
            ("wal", log.reads.wal),
            ("segments", log.reads.segments),
        ] {
            out.sample("strata_log_reads_total", &[("source", source)], count);
        }
        render_read_ahead(&mut out, &log.read_ahead);
        render_txn(&mut out, &log.txn);
    }

    if let Some(cluster) = &snapshot.cluster {
        render_cluster(&mut out, cluster);
    }

    out.family(
        "strata_authentications_total",
        "counter",
        "Authentication attempts by mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, TLS, other) and result (success, reauthenticated or the failure reason).",
    );
    for (mechanism, result, count) in &snapshot.authentications {
        out.sample(
            "strata_authentications_total",
            &[("mechanism", mechanism), ("result", result)],
            count,
        );
    }

    out.family(
        "strata_tls_reloads_total",
        "counter",
        "Changes to the TLS certificate, key or truststore files seen by the watcher (ssl_reload_interval), by result: success (new connections get them) or error (they did not load; the previous ones are kept).",
    );
    for (result, count) in [
        ("success", snapshot.tls_reloads.0),
        ("error", snapshot.tls_reloads.1),
    ] {
        out.sample("strata_tls_reloads_total", &[("result", result)], count);
    }

    if let Some(traffic) = &snapshot.traffic {
        render_traffic(&mut out, traffic);
    }
    render_lag(&mut out, &snapshot.lag.clone().unwrap_or_default());

    out.family(
        "strata_authorization_denied_total",
        "counter",
        "Requests (or parts of them: a topic, a group) the ACL authorizer refused, by resource type and operation.",
    );
    for (resource_type, operation, count) in &snapshot.authorization_denied {
        out.sample(
            "strata_authorization_denied_total",
            &[("resource_type", resource_type), ("operation", operation)],
            count,
        );
    }

    if !snapshot.throttles.is_empty() {
        out.family(
            "strata_quota_throttle_seconds_total",
            "counter",
            "Time responses over a client quota were throttled (connection muted), by quota kind (produce, fetch, request).",
        );
        for (kind, seconds, _) in &snapshot.throttles {
            out.sample(
                "strata_quota_throttle_seconds_total",
                &[("kind", kind)],
                seconds,
            );
        }
        out.family(
            "strata_quota_throttled_responses_total",
            "counter",
            "Responses over a client quota, by quota kind.",
        );
        for (kind, _, responses) in &snapshot.throttles {
            out.sample(
                "strata_quota_throttled_responses_total",
                &[("kind", kind)],
                responses,
            );
        }
    }

    if let Some(share) = &snapshot.share {
        out.family(
            "strata_share_records_total",
            "counter",
            "Share-group records by outcome: acquired by a member (redelivered: of those, the ones delivered before), accepted, released (by the member, a lock expiry or a closed session), rejected, archived at the delivery-count limit.",
        );
        for (outcome, n) in &share.records {
            out.sample("strata_share_records_total", &[("outcome", outcome)], n);
        }
        out.family(
            "strata_share_backlog",
            "gauge",
            "Records of a share group not yet acknowledged or archived, over the share partitions this broker holds (at most 100 groups).",
        );
        for (group, n) in &share.backlog {
            out.sample("strata_share_backlog", &[("group", group)], n);
        }
        out.family(
            "strata_share_partition_records_total",
            "counter",
            "Records of one share group on one partition by outcome, since this broker loaded that share partition (at most 100 share partitions).",
        );
        for p in &share.partitions {
            let partition = p.partition.partition.to_string();
            for (outcome, n) in p.counts.by_outcome() {
                out.sample(
                    "strata_share_partition_records_total",
                    &[
                        ("group", &p.group),
                        ("topic", &p.partition.topic),
                        ("partition", &partition),
                        ("outcome", outcome),
                    ],
                    n,
                );
            }
        }
        out.family(
            "strata_share_partition_backlog",
            "gauge",
            "Records of one share group on one partition not yet acknowledged or archived (at most 100 share partitions).",
        );
        for p in &share.partitions {
            let partition = p.partition.partition.to_string();
            out.sample(
                "strata_share_partition_backlog",
                &[
                    ("group", &p.group),
                    ("topic", &p.partition.topic),
                    ("partition", &partition),
                ],
                p.backlog,
            );
        }
    }

    if let Some(sessions) = &snapshot.fetch_sessions {
        out.family(
            "strata_fetch_sessions",
            "gauge",
            "Incremental fetch sessions (KIP-227) cached (max_incremental_fetch_session_cache_slots bounds it).",
        );
        out.sample("strata_fetch_sessions", &[], sessions.sessions as u64);
        out.family(
            "strata_fetch_session_partitions",
            "gauge",
            "Partitions held over all fetch sessions (max_incremental_fetch_session_partitions bounds it).",
        );
        out.sample(
            "strata_fetch_session_partitions",
            &[],
            sessions.partitions as u64,
        );
        out.family(
            "strata_fetch_session_evictions_total",
            "counter",
            "Fetch sessions evicted to make room for a new one.",
        );
        out.sample(
            "strata_fetch_session_evictions_total",
            &[],
            sessions.evictions,
        );
    }

    if let Some(loads) = &snapshot.group_loads {
        out.family(
            "strata_group_shard_loads_total",
            "counter",
            "__consumer_offsets shards this broker loaded (start-up, takeover, shard move).",
        );
        out.sample("strata_group_shard_loads_total", &[], loads.loads);
        out.family(
            "strata_group_shard_records_replayed_total",
            "counter",
            "Records those loads read from __consumer_offsets: bounded by live groups and offsets once the topic is compacted, not by commit history.",
        );
        out.sample(
            "strata_group_shard_records_replayed_total",
            &[],
            loads.replayed_records,
        );
    }

    if let Some(txn) = &snapshot.transactions {
        out.family(
            "strata_transactions_total",
            "counter",
            "Transactions this broker coordinated that ended, by result (timed_out: aborted by the coordinator after transaction.timeout.ms).",
        );
        for (result, n) in [
            ("committed", txn.committed),
            ("aborted", txn.aborted),
            ("timed_out", txn.timed_out),
        ] {
            out.sample("strata_transactions_total", &[("result", result)], n);
        }
        out.family(
            "strata_transactions_open",
            "gauge",
            "Transactions begun and not yet completed on the coordinator shards this broker hosts.",
        );
        out.sample("strata_transactions_open", &[], txn.open);
    }

    out.family(
        "strata_process_uptime_seconds",
        "gauge",
        "Seconds since the broker started.",
    );
    out.sample(
        "strata_process_uptime_seconds",
        &[],
        Float(snapshot.uptime.as_secs_f64()),
    );
    out.family(
        "strata_build_info",
        "gauge",
        "Always 1; labels the version.",
    );
    out.sample(
        "strata_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1u64,
    );
    out.text
}

/// Builds the exposition text. Writing to a `String` cannot fail, so `write!` results are
/// dropped.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{label}=\"{}\"", escape_label_value(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// Broker-wide, not per partition: a last-stable-offset lag per partition would be too many
/// series.
fn render_txn(out: &mut Exposition, txn: &strata_log::TxnSnapshot) {
    out.family(
        "strata_ongoing_transactions",
        "gauge",
        "Open transactions over the partitions this broker serves (a transaction open in three partitions counts three): they hold the last stable offset back.",
    );
    out.sample("strata_ongoing_transactions", &[], txn.ongoing);
    out.family(
        "strata_txn_markers_total",
        "counter",
        "Transaction markers (WriteTxnMarkers) this broker wrote, by type.",
    );
    out.sample(
        "strata_txn_markers_total",
        &[("type", "commit")],
        txn.commit_markers,
    );
    out.sample(
        "strata_txn_markers_total",
        &[("type", "abort")],
        txn.abort_markers,
    );
}

/// A label value as the text format wants it: backslash, double quote and line feed escaped.
/// Bounded by [`crate::lag::MAX_LAG_SERIES`] partition series; the sums cover every group.
fn render_lag(out: &mut Exposition, lag: &crate::lag::LagSnapshot) {
    out.family(
        "strata_group_lag",
        "gauge",
        "Records a consumer group is behind: log end offset minus committed offset, per partition it committed for (groups coordinated by this broker, as of the last pass).",
    );
    for p in &lag.partitions {
        let partition = p.partition.to_string();
        out.sample(
            "strata_group_lag",
            &[
                ("group", &p.group),
                ("topic", &p.topic),
                ("partition", &partition),
            ],
            p.lag,
        );
    }
    out.family(
        "strata_group_lag_sum",
        "gauge",
        "A consumer group's lag summed over its partitions (groups coordinated by this broker).",
    );
    for (group, sum) in &lag.sums {
        out.sample("strata_group_lag_sum", &[("group", group)], sum);
    }
    out.family(
        "strata_group_lag_timestamp_seconds",
        "gauge",
        "Wall-clock time the lag figures were computed (they are refreshed every group_lag_interval).",
    );
    out.sample(
        "strata_group_lag_timestamp_seconds",
        &[],
        lag.computed_at_ms as f64 / 1000.0,
    );
}

/// Catch-up reads of segments: the read-ahead windows and the IO budget.
fn render_read_ahead(out: &mut Exposition, r: &strata_log::ReadAheadSnapshot) {
    out.family(
        "strata_log_catchup_reads_total",
        "counter",
        "Segment reads of consumers behind the tail, by result: hit (answered from kept read-ahead windows) or miss (went to storage).",
    );
    out.sample(
        "strata_log_catchup_reads_total",
        &[("result", "hit")],
        r.hits,
    );
    out.sample(
        "strata_log_catchup_reads_total",
        &[("result", "miss")],
        r.misses,
    );
    for (name, help, value) in [
        (
            "strata_log_read_ahead_windows_total",
            "Segment windows read ahead in the background for consumers behind the tail.",
            r.prefetches,
        ),
        (
            "strata_log_catchup_bytes_read_total",
            "Segment bytes read from storage for consumers behind the tail (theirs and read-ahead).",
            r.bytes_read,
        ),
        (
            "strata_log_read_ahead_skipped_total",
            "Read-aheads not started because log.read_ahead_memory_bytes was held by windows readers have yet to reach.",
            r.skipped,
        ),
        (
            "strata_log_read_ahead_dropped_unpassed_total",
            "Read-ahead windows dropped for room before a reader had passed them; growth means the memory is too small for the replays.",
            r.dropped_unpassed,
        ),
    ] {
        out.family(name, "counter", help);
        out.sample(name, &[], value);
    }
    out.family(
        "strata_log_catchup_throttled_seconds_total",
        "counter",
        "Time consumers behind the tail waited for an IO slot or for log.catchup_io_max_bytes_per_second.",
    );
    out.sample(
        "strata_log_catchup_throttled_seconds_total",
        &[],
        Float(r.throttled_micros as f64 / 1e6),
    );
    out.family(
        "strata_log_read_ahead_bytes",
        "gauge",
        "Memory held by kept read-ahead windows (bounded by log.read_ahead_memory_bytes).",
    );
    out.sample("strata_log_read_ahead_bytes", &[], r.kept_bytes);
}

fn render_tiering(out: &mut Exposition, log: &LogSnapshot) {
    let t = &log.tiering;
    for (name, kind, help, value) in [
        (
            "strata_log_tiered_segments_total",
            "counter",
            "Compacted segments moved from the fast (write-ahead) tier to the bulk tier once their topic's local.retention.* passed.",
            t.segments_moved,
        ),
        (
            "strata_log_tiered_bytes_total",
            "counter",
            "Bytes of those segments.",
            t.bytes_moved,
        ),
        (
            "strata_log_fast_tier_segments",
            "gauge",
            "Compacted segments of partitions served here held on the fast tier by local.retention.*.",
            t.fast_segments,
        ),
        (
            "strata_log_fast_tier_segment_bytes",
            "gauge",
            "Bytes of those segments.",
            t.fast_bytes,
        ),
    ] {
        out.family(name, kind, help);
        out.sample(name, &[], value);
    }
}

fn render_cleaner(out: &mut Exposition, log: &LogSnapshot) {
    let c = &log.cleaner;
    for (name, help, value) in [
        (
            "strata_cleaner_bytes_read_total",
            "Segment bytes the log cleaner (key compaction) read.",
            c.bytes_read,
        ),
        (
            "strata_cleaner_bytes_written_total",
            "Bytes of cleaned segments the log cleaner wrote.",
            c.bytes_written,
        ),
        (
            "strata_cleaner_records_removed_total",
            "Records the log cleaner removed (superseded by a later record of their key, expired tombstones, keyless records).",
            c.records_removed,
        ),
        (
            "strata_cleaner_passes_total",
            "Cleaning passes that finished.",
            c.passes,
        ),
    ] {
        out.family(name, "counter", help);
        out.sample(name, &[], value);
    }
    out.family(
        "strata_cleaner_last_pass_timestamp_seconds",
        "gauge",
        "Wall-clock time the last cleaning pass finished (0: none since start).",
    );
    out.sample(
        "strata_cleaner_last_pass_timestamp_seconds",
        &[],
        c.last_pass_millis as f64 / 1000.0,
    );
    out.family(
        "strata_log_dirty_ratio",
        "gauge",
        "Share of a compacted partition's segment bytes the cleaner has not passed yet.",
    );
    for (tp, ratio) in &log.dirty_ratios {
        let partition = tp.partition.to_string();
        out.sample(
            "strata_log_dirty_ratio",
            &[("topic", &tp.topic), ("partition", &partition)],
            ratio,
        );
    }
}

fn render_cluster(out: &mut Exposition, cluster: &ClusterMetrics) {
    out.family(
        "strata_cluster_live_brokers",
        "gauge",
        "Brokers this broker currently sees alive (itself included).",
    );
    out.sample(
        "strata_cluster_live_brokers",
        &[],
        cluster.live_brokers as u64,
    );
    out.family(
        "strata_cluster_draining",
        "gauge",
        "1 while this broker is draining (handing every partition off).",
    );
    out.sample("strata_cluster_draining", &[], u64::from(cluster.draining));
    out.family(
        "strata_cluster_partitions_owned",
        "gauge",
        "Partitions (consumer-group shards included) this broker owns and serves.",
    );
    out.sample(
        "strata_cluster_partitions_owned",
        &[],
        cluster.partitions_owned as u64,
    );
    let o = &cluster.ownership;
    out.family(
        "strata_cluster_ownership_changes_total",
        "counter",
        "Ownership changes on this broker: acquired (claimed and serving), handed_over (graceful), dropped (fenced, lost or lease running out), and failed attempts.",
    );
    for (change, count) in [
        ("acquired", o.acquired),
        ("acquire_failed", o.acquire_failed),
        ("handed_over", o.handed_over),
        ("handover_failed", o.handover_failed),
        ("dropped", o.dropped),
    ] {
        out.sample(
            "strata_cluster_ownership_changes_total",
            &[("change", change)],
            count,
        );
    }
    for (name, help, total, count, max) in [
        (
            "strata_cluster_acquire_seconds",
            "Time to start serving an acquired partition (replay, claim, compaction of a taken-over tail).",
            o.acquire_seconds_total,
            o.acquired,
            o.acquire_seconds_max,
        ),
        (
            "strata_cluster_handover_seconds",
            "Time to hand a partition over (compact while serving, stop appends, flush, checkpoint).",
            o.handover_seconds_total,
            o.handed_over,
            o.handover_seconds_max,
        ),
    ] {
        out.family(name, "summary", help);
        out.sample(&format!("{name}_sum"), &[], Float(total.as_secs_f64()));
        out.sample(&format!("{name}_count"), &[], count);
        let max_name = format!("{name}_max");
        out.family(&max_name, "gauge", "The slowest since the broker started.");
        out.sample(&max_name, &[], Float(max.as_secs_f64()));
    }
}

pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text escapes backslash and line feed (a quote is fine there).
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A float sample value in the text format's spelling (`+Inf`, `-Inf`, `NaN`; Rust's `Display`
/// never uses an exponent, which Prometheus parses fine).
struct Float(f64);

impl fmt::Display for Float {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            f.write_str("NaN")
        } else if v.is_infinite() {
            f.write_str(if v > 0.0 { "+Inf" } else { "-Inf" })
        } else {
            write!(f, "{v}")
        }
    }
}

/// An integer gauge that may be negative (a watermark is an `i64`).
struct Int(i64);

impl fmt::Display for Int {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;
    use strata_storage::{OpKind, StorageError, StorageResult};

    use super::*;

    fn snapshot_with(metrics: &StorageMetrics, health: &StorageHealth) -> Snapshot {
        Snapshot {
            backend: "s3".to_string(),
            storage: metrics.snapshot(),
            health: health.snapshot(),
            bulk: None,
            log: None,
            cluster: None,
            fetch_sessions: None,
            share: None,
            transactions: None,
            group_loads: None,
            authentications: Vec::new(),
            traffic: None,
            authorization_denied: vec![("TOPIC", "WRITE", 3)],
            throttles: Vec::new(),
            lag: None,
            tls_reloads: (1, 0),
            s3_prices: RequestPrices::S3_STANDARD,
            uptime: Duration::from_millis(1500),
        }
    }

    #[test]
    fn requests_topics_and_connections_are_rendered() {
        let health = StorageHealth::new(Arc::new(ManualClock::new(0)));
        let mut snapshot = snapshot_with(&StorageMetrics::new(), &health);
        let mut buckets = vec![0; TRAFFIC_LATENCY_BUCKETS.len() + 1];
        buckets[0] = 2; // ≤ 0.5 ms
        buckets[3] = 1; // ≤ 5 ms
        buckets[TRAFFIC_LATENCY_BUCKETS.len()] = 1; // slower than every bound
        snapshot.traffic = Some(TrafficSnapshot {
            apis: vec![strata_broker::traffic::ApiTraffic {
                api: "Fetch",
                requests: 4,
                refused: 1,
                buckets,
                seconds: 12.5,
                errors: vec![
                    ("NONE".to_string(), 9),
                    ("OFFSET_OUT_OF_RANGE".to_string(), 1),
                ],
            }],
            topics: vec![(
                "orders".to_string(),
                TopicTraffic {
                    bytes_in: 100,
                    records_in: 3,
                    bytes_out: 250,
                },
            )],
            omitted: TopicTraffic::default(),
            connections_open: 2,
            connections_accepted: 7,
        });
        let text = render(&snapshot);
        assert_eq!(value_of(&text, "strata_requests_total{api=\"Fetch\"}"), "4");
        assert_eq!(
            value_of(&text, "strata_requests_refused_total{api=\"Fetch\"}"),
            "1"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_request_errors_total{api=\"Fetch\",error=\"OFFSET_OUT_OF_RANGE\"}"
            ),
            "1"
        );
        // Prometheus buckets are cumulative; +Inf is the count.
        assert_eq!(
            value_of(
                &text,
                "strata_request_seconds_bucket{api=\"Fetch\",le=\"0.0005\"}"
            ),
            "2"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_request_seconds_bucket{api=\"Fetch\",le=\"0.005\"}"
            ),
            "3"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_request_seconds_bucket{api=\"Fetch\",le=\"10\"}"
            ),
            "3"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_request_seconds_bucket{api=\"Fetch\",le=\"+Inf\"}"
            ),
            "4"
        );
        assert_eq!(
            value_of(&text, "strata_request_seconds_sum{api=\"Fetch\"}"),
            "12.5"
        );
        assert_eq!(
            value_of(&text, "strata_topic_bytes_in_total{topic=\"orders\"}"),
            "100"
        );
        assert_eq!(
            value_of(&text, "strata_topic_records_in_total{topic=\"orders\"}"),
            "3"
        );
        assert_eq!(
            value_of(&text, "strata_topic_bytes_out_total{topic=\"orders\"}"),
            "250"
        );
        assert_eq!(value_of(&text, "strata_connections"), "2");
        assert_eq!(value_of(&text, "strata_connections_accepted_total"), "7");
    }

    /// The value of the one line that starts with `series ` (name plus labels, exactly).
    fn value_of<'a>(text: &'a str, series: &str) -> &'a str {
        let prefix = format!("{series} ");
        let matches: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .collect();
        assert_eq!(matches.len(), 1, "{series} in:\n{text}");
        matches[0]
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape_label_value("plain"), "plain");
        assert_eq!(
            escape_label_value("a\\b\"c\nd"),
            "a\\\\b\\\"c\\nd",
            "backslash, quote and newline"
        );
        assert_eq!(escape_help("x\\y\nz \"q\""), "x\\\\y\\nz \"q\"");

        let mut out = Exposition::default();
        out.sample("m", &[("topic", "we\"ird\\\n")], 3u64);
        assert_eq!(out.text, "m{topic=\"we\\\"ird\\\\\\n\"} 3\n");
        let mut out = Exposition::default();
        out.sample("m", &[], Float(f64::INFINITY));
        out.sample("m", &[], Float(f64::NAN));
        out.sample("m", &[], Float(0.25));
        out.sample("m", &[], Int(-1));
        assert_eq!(out.text, "m +Inf\nm NaN\nm 0.25\nm -1\n");
    }

    #[test]
    fn every_family_has_help_and_type_before_its_samples_and_lines_parse() {
        let clock = Arc::new(ManualClock::new(0));
        let metrics = StorageMetrics::new();
        let health = StorageHealth::new(clock);
        let mut snapshot = snapshot_with(&metrics, &health);
        snapshot.log = Some(LogSnapshot {
            cache_bytes: 4096,
            partitions_served: 2,
            high_watermarks: vec![
                (TopicPartition::new("orders", 0), 17),
                (TopicPartition::new("orders", 1), 0),
            ],
            reads: Default::default(),
            read_ahead: Default::default(),
            tiering: strata_log::TieringSnapshot {
                segments_moved: 4,
                bytes_moved: 4096,
                fast_segments: 2,
                fast_bytes: 2048,
            },
            cleaner: strata_log::CleanerSnapshot {
                bytes_read: 10,
                bytes_written: 5,
                records_removed: 3,
                passes: 1,
                last_pass_millis: 1_500,
            },
            dirty_ratios: vec![(TopicPartition::new("orders", 0), 0.25)],
            txn: strata_log::TxnSnapshot {
                ongoing: 2,
                commit_markers: 5,
                abort_markers: 1,
            },
        });
        snapshot.cluster = Some(ClusterMetrics {
            live_brokers: 3,
            draining: false,
            partitions_owned: 5,
            ownership: strata_broker::cluster::OwnershipStatsSnapshot {
                acquired: 7,
                handed_over: 2,
                handover_seconds_total: Duration::from_millis(90),
                handover_seconds_max: Duration::from_millis(60),
                ..Default::default()
            },
        });
        snapshot.fetch_sessions = Some(FetchSessionStats {
            sessions: 4,
            partitions: 1200,
            evictions: 9,
        });
        snapshot.share = Some(strata_broker::share::ShareStats {
            records: vec![("accepted", 12), ("archived", 1)],
            backlog: vec![("workers".to_string(), 30)],
            partitions: vec![strata_broker::share::SharePartitionStats {
                group: "workers".to_string(),
                partition: strata_core::TopicPartition::new("jobs", 2),
                counts: strata_broker::share::ShareCounts {
                    acquired: 7,
                    redelivered: 2,
                    ..Default::default()
                },
                backlog: 5,
            }],
        });
        snapshot.transactions = Some(strata_broker::txn_coordinator::TxnStatsSnapshot {
            committed: 5,
            aborted: 2,
            timed_out: 1,
            open: 3,
        });
        let text = render(&snapshot);
        assert_eq!(
            value_of(&text, "strata_transactions_total{result=\"timed_out\"}"),
            "1"
        );
        assert_eq!(
            value_of(&text, "strata_transactions_total{result=\"committed\"}"),
            "5"
        );
        assert_eq!(value_of(&text, "strata_transactions_open"), "3");
        assert_eq!(value_of(&text, "strata_log_tiered_segments_total"), "4");
        assert_eq!(
            value_of(&text, "strata_log_fast_tier_segment_bytes"),
            "2048"
        );
        assert!(text.ends_with('\n'));
        assert!(
            text.contains("strata_share_records_total{outcome=\"accepted\"} 12\n"),
            "{text}"
        );
        assert!(
            text.contains("strata_share_backlog{group=\"workers\"} 30\n"),
            "{text}"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_share_partition_records_total{group=\"workers\",topic=\"jobs\",partition=\"2\",outcome=\"redelivered\"}"
            ),
            "2"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_share_partition_backlog{group=\"workers\",topic=\"jobs\",partition=\"2\"}"
            ),
            "5"
        );
        assert_eq!(value_of(&text, "strata_cluster_live_brokers"), "3");
        assert_eq!(value_of(&text, "strata_fetch_sessions"), "4");
        assert_eq!(value_of(&text, "strata_fetch_session_partitions"), "1200");
        assert_eq!(value_of(&text, "strata_fetch_session_evictions_total"), "9");
        assert_eq!(value_of(&text, "strata_ongoing_transactions"), "2");
        assert_eq!(
            value_of(&text, "strata_txn_markers_total{type=\"abort\"}"),
            "1"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_cluster_ownership_changes_total{change=\"handed_over\"}"
            ),
            "2"
        );
        assert_eq!(
            value_of(&text, "strata_cluster_handover_seconds_sum"),
            "0.09"
        );
        assert_eq!(
            value_of(&text, "strata_cluster_handover_seconds_max"),
            "0.06"
        );

        let mut declared: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    ["counter", "gauge", "histogram", "summary"].contains(&kind),
                    "{line}"
                );
                assert!(
                    declared.iter().all(|(n, _)| n != name),
                    "{name} declared twice"
                );
                declared.push((name.to_string(), kind.to_string()));
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            // A sample: name, optional {labels}, one space, a number.
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(
                value == "+Inf" || value == "NaN" || value.parse::<f64>().is_ok(),
                "{line}"
            );
            let name = series.split('{').next().unwrap();
            // Samples belong to the family declared last (families are contiguous).
            let (family, kind) = declared.last().unwrap();
            let belongs = name == family
                || (kind == "histogram" && name == format!("{family}_bucket"))
                || ((kind == "histogram" || kind == "summary")
                    && [format!("{family}_sum"), format!("{family}_count")]
                        .contains(&name.to_string()));
            assert!(belongs, "{line} after # TYPE {family}");
        }
        assert_eq!(
            value_of(
                &text,
                "strata_log_high_watermark{topic=\"orders\",partition=\"0\"}"
            ),
            "17"
        );
        assert_eq!(value_of(&text, "strata_log_cache_bytes"), "4096");
        assert_eq!(value_of(&text, "strata_log_partitions_served"), "2");
        assert_eq!(value_of(&text, "strata_log_high_watermark_omitted"), "0");
        assert_eq!(value_of(&text, "strata_process_uptime_seconds"), "1.5");
        // Nothing written yet: no requests-per-GB sample, but the family is still described.
        assert!(text.contains("# TYPE strata_storage_requests_per_gb_ingested gauge"));
        assert!(!text.contains("strata_storage_requests_per_gb_ingested{"));
    }

    #[test]
    fn each_tier_has_its_own_series_and_either_failing_is_unhealthy() {
        let clock = Arc::new(ManualClock::new(0));
        let (wal, bulk) = (StorageMetrics::new(), StorageMetrics::new());
        let wal_health = Arc::new(StorageHealth::new(clock.clone()));
        let bulk_health = Arc::new(StorageHealth::new(clock.clone()));
        let ok: StorageResult<()> = Ok(());
        for _ in 0..3 {
            wal.record(OpKind::PutCreate, Duration::from_millis(1), &ok, 1_000, 0);
        }
        bulk.record(
            OpKind::PutCreate,
            Duration::from_millis(9),
            &ok,
            64 << 20,
            0,
        );
        let mut snapshot = snapshot_with(&wal, &wal_health);
        snapshot.backend = "rados".into();
        snapshot.bulk = Some(TierSnapshot {
            backend: "s3".into(),
            storage: bulk.snapshot(),
            health: bulk_health.snapshot(),
        });
        let text = render(&snapshot);
        let requests = |labels: &str| {
            value_of(
                &text,
                &format!("strata_storage_requests_total{{{labels},op=\"put_create\"}}"),
            )
            .to_string()
        };
        assert_eq!(requests("backend=\"rados\",tier=\"wal\""), "3");
        assert_eq!(requests("backend=\"s3\",tier=\"bulk\""), "1");
        assert_eq!(
            value_of(
                &text,
                "strata_storage_bytes_total{backend=\"s3\",tier=\"bulk\",direction=\"in\"}"
            ),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            value_of(
                &text,
                "strata_storage_healthy{backend=\"s3\",tier=\"bulk\"}"
            ),
            "1"
        );
        // A request cost for the S3 tier only: one PUT at S3 Standard's price for 64 MiB.
        let cost: f64 = value_of(
            &text,
            "strata_storage_request_cost_per_gb_ingested{backend=\"s3\",tier=\"bulk\"}",
        )
        .parse()
        .unwrap();
        let expected = 0.005 / 1000.0 / ((64u64 << 20) as f64 / 1e9);
        assert!((cost - expected).abs() < 1e-12, "{cost}");
        assert!(
            !text.contains("strata_storage_request_cost_per_gb_ingested{backend=\"rados\""),
            "{text}"
        );
        // One storage: no tier label, as before.
        let single = render(&snapshot_with(&wal, &wal_health));
        assert!(!single.contains("tier="), "{single}");

        // /health follows either tier.
        let source = MetricsSource::new("rados", Arc::new(wal), wal_health, clock.clone())
            .with_bulk_tier("s3", Arc::new(bulk), Arc::clone(&bulk_health));
        assert!(source.health().is_healthy(UNHEALTHY_AFTER_FAILURES));
        let failed: StorageResult<()> = Err(StorageError::Unavailable("down".into()));
        for _ in 0..3 {
            bulk_health.record_op(OpKind::PutCreate, &failed);
        }
        assert!(!source.health().is_healthy(UNHEALTHY_AFTER_FAILURES));
    }

    #[test]
    fn storage_counters_buckets_are_cumulative_and_end_in_the_total() {
        let clock = Arc::new(ManualClock::new(0));
        let metrics = StorageMetrics::new();
        let health = StorageHealth::new(clock);
        let ok: StorageResult<()> = Ok(());
        // 2 requests in the first bucket, 1 in the third, 1 slower than every bound.
        for micros in [10, 64, 200, 60_000_000] {
            metrics.record(OpKind::Get, Duration::from_micros(micros), &ok, 0, 1_000);
        }
        metrics.record(
            OpKind::PutCreate,
            Duration::from_millis(1),
            &ok,
            500_000_000,
            0,
        );
        let failed: StorageResult<()> = Err(StorageError::Unavailable("down".into()));
        metrics.record(OpKind::PutCreate, Duration::from_millis(3), &failed, 1, 0);

        let text = render(&snapshot_with(&metrics, &health));
        let get = "backend=\"s3\",op=\"get\"";
        let bucket = |le: &str| {
            value_of(
                &text,
                &format!("strata_storage_request_seconds_bucket{{{get},le=\"{le}\"}}"),
            )
            .to_string()
        };
        assert_eq!(bucket("0.000064"), "2");
        assert_eq!(bucket("0.000128"), "2");
        assert_eq!(bucket("0.000256"), "3");
        assert_eq!(bucket("16.777216"), "3");
        assert_eq!(bucket("+Inf"), "4");
        assert_eq!(
            value_of(
                &text,
                &format!("strata_storage_request_seconds_count{{{get}}}")
            ),
            "4"
        );
        let sum: f64 = value_of(
            &text,
            &format!("strata_storage_request_seconds_sum{{{get}}}"),
        )
        .parse()
        .unwrap();
        assert!((sum - 60.000274).abs() < 1e-9, "{sum}");
        // Buckets never decrease, for every op.
        let mut last: Option<(String, u64)> = None;
        for line in text
            .lines()
            .filter(|l| l.starts_with("strata_storage_request_seconds_bucket{"))
        {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let op = series.split(",le=").next().unwrap().to_string();
            let value: u64 = value.parse().unwrap();
            if let Some((prev_op, prev)) = &last {
                if *prev_op == op {
                    assert!(value >= *prev, "{line}");
                }
            }
            last = Some((op, value));
        }
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("strata_storage_request_seconds_bucket{"))
                .count(),
            OpKind::COUNT * (LATENCY_BUCKET_BOUNDS.len() + 1)
        );

        let create = "backend=\"s3\",op=\"put_create\"";
        assert_eq!(
            value_of(&text, &format!("strata_storage_requests_total{{{create}}}")),
            "2"
        );
        assert_eq!(
            value_of(&text, &format!("strata_storage_errors_total{{{create}}}")),
            "1"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_storage_bytes_total{backend=\"s3\",direction=\"in\"}"
            ),
            "500000000"
        );
        assert_eq!(
            value_of(
                &text,
                "strata_storage_bytes_total{backend=\"s3\",direction=\"out\"}"
            ),
            "4000"
        );
        // 6 requests for half a gigabyte written.
        assert_eq!(
            value_of(
                &text,
                "strata_storage_requests_per_gb_ingested{backend=\"s3\"}"
            ),
            "12"
        );
    }

    #[test]
    fn authorization_denials_are_counted_by_resource_type_and_operation() {
        let clock = Arc::new(ManualClock::new(0));
        let metrics = StorageMetrics::new();
        let health = StorageHealth::new(clock);
        let text = render(&snapshot_with(&metrics, &health));
        assert_eq!(
            value_of(
                &text,
                "strata_authorization_denied_total{resource_type=\"TOPIC\",operation=\"WRITE\"}"
            ),
            "3"
        );
    }

    #[test]
    fn health_gauges_follow_consecutive_failures() {
        let clock = Arc::new(ManualClock::new(0));
        let metrics = StorageMetrics::new();
        let health = StorageHealth::new(clock);
        for _ in 0..UNHEALTHY_AFTER_FAILURES {
            health.record_failure(&StorageError::Unavailable("down".into()));
        }
        let text = render(&snapshot_with(&metrics, &health));
        assert_eq!(
            value_of(&text, "strata_storage_healthy{backend=\"s3\"}"),
            "0"
        );
        assert_eq!(
            value_of(&text, "strata_storage_consecutive_failures{backend=\"s3\"}"),
            "3"
        );
        health.record_success();
        let text = render(&snapshot_with(&metrics, &health));
        assert_eq!(
            value_of(&text, "strata_storage_healthy{backend=\"s3\"}"),
            "1"
        );
        // No log attached yet: no log series at all.
        assert!(!text.contains("strata_log_"));
    }
}
