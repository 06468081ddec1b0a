//! Request counters and latency histograms per kind of request, and the health they imply.
//!
//! Put [`MetricsStore`] right around the backend (under retries and the concurrency limit, over
//! the timeout) so that it counts the requests the storage actually sees — object stores bill per
//! request, so [`StorageMetricsSnapshot::requests_per_gb_ingested`] is the number that tells how
//! well group commit is batching — and sees every timeout as a failed request.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use strata_core::Clock;

use crate::health::is_storage_failure;
use crate::{
    ListedKey, ObjectKey, ObjectMeta, ObjectStore, OpKind, PutMode, StorageHealth, StorageResult,
    Version,
};

/// Upper bounds of the latency buckets: powers of two from 64 µs to about 16.8 s, so every bucket
/// is twice as wide as the one before (log-spaced) and a few dozen counters cover both a local
/// disk and a slow S3. One more bucket counts everything slower.
pub const LATENCY_BUCKET_BOUNDS: [Duration; 19] = {
    let mut bounds = [Duration::ZERO; 19];
    let mut i = 0;
    while i < bounds.len() {
        bounds[i] = Duration::from_micros(64 << i);
        i += 1;
    }
    bounds
};

const BUCKETS: usize = LATENCY_BUCKET_BOUNDS.len() + 1;

/// Names the part of the layout a key (or a listed prefix) belongs to, e.g. "membership" for a
/// broker registration. Must return one of a small fixed set of names: each is a metric series.
pub type KeyArea = fn(&str) -> &'static str;

/// Live counters, shared by every store that records into them.
#[derive(Debug, Default)]
pub struct StorageMetrics {
    ops: [OpCounters; OpKind::COUNT],
    /// Set once by whoever knows the layout (this crate does not): requests are then also
    /// counted by area, which tells which poller sends them.
    key_area: OnceLock<KeyArea>,
    by_area: Mutex<BTreeMap<(&'static str, OpKind), u64>>,
}

#[derive(Debug, Default)]
struct OpCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    failures: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    latency_buckets: [AtomicU64; BUCKETS],
    latency_sum_micros: AtomicU64,
}

impl StorageMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts requests by area of the key too, from now on. Only the first call counts.
    pub fn set_key_areas(&self, key_area: KeyArea) {
        let _ = self.key_area.set(key_area);
    }

    /// Counts one request against the area of `key` (a listing: of its prefix), if areas are
    /// set. A lock per request is cheap next to a storage round trip.
    pub fn record_area(&self, op: OpKind, key: &str) {
        let Some(key_area) = self.key_area.get() else {
            return;
        };
        let area = key_area(key);
        let mut by_area = self.by_area.lock().unwrap_or_else(|e| e.into_inner());
        *by_area.entry((area, op)).or_default() += 1;
    }

    /// Records one finished request. `bytes_in` is what was written to storage and `bytes_out`
    /// what was read from it; both count only when the request succeeded.
    pub fn record<T>(
        &self,
        op: OpKind,
        latency: Duration,
        result: &StorageResult<T>,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        let counters = &self.ops[op.index()];
        counters.requests.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(_) => {
                counters.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
                counters.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
            }
            Err(error) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                if is_storage_failure(error) {
                    counters.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let bucket = LATENCY_BUCKET_BOUNDS
            .iter()
            .position(|bound| latency <= *bound)
            .unwrap_or(BUCKETS - 1);
        counters.latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        counters
            .latency_sum_micros
            .fetch_add(micros, Ordering::Relaxed);
    }

    /// Copies the counters. Counters are read one by one, so a snapshot taken under load may mix
    /// requests a few microseconds apart; every counter only grows.
    pub fn snapshot(&self) -> StorageMetricsSnapshot {
        let ops = OpKind::ALL.map(|op| {
            let c = &self.ops[op.index()];
            let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
            OpMetricsSnapshot {
                requests: load(&c.requests),
                errors: load(&c.errors),
                failures: load(&c.failures),
                bytes_in: load(&c.bytes_in),
                bytes_out: load(&c.bytes_out),
                latency: LatencyHistogram {
                    counts: c.latency_buckets.iter().map(load).collect(),
                    sum: Duration::from_micros(load(&c.latency_sum_micros)),
                },
            }
        });
        let by_area = self
            .by_area
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(&(area, op), &n)| (area, op, n))
            .collect();
        StorageMetricsSnapshot { ops, by_area }
    }
}

/// A point-in-time copy of [`StorageMetrics`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageMetricsSnapshot {
    ops: [OpMetricsSnapshot; OpKind::COUNT],
    /// Requests by (area, kind), sorted; empty unless areas are set.
    by_area: Vec<(&'static str, OpKind, u64)>,
}

/// Counters of one kind of request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpMetricsSnapshot {
    pub requests: u64,
    /// Requests that returned any error, including answers such as `NotFound` or `Precondition`.
    pub errors: u64,
    /// Requests the storage failed to serve (throttled, timed out, unavailable, other).
    pub failures: u64,
    /// Payload bytes written to storage by successful requests.
    pub bytes_in: u64,
    /// Payload bytes read from storage by successful requests.
    pub bytes_out: u64,
    pub latency: LatencyHistogram,
}

/// Request latencies in the fixed [`LATENCY_BUCKET_BOUNDS`] buckets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LatencyHistogram {
    /// `counts[i]` requests took at most `LATENCY_BUCKET_BOUNDS[i]` (and more than the bound
    /// before); the last entry counts requests slower than every bound.
    pub counts: Vec<u64>,
    pub sum: Duration,
}

impl LatencyHistogram {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn mean(&self) -> Option<Duration> {
        let count = u32::try_from(self.count()).ok().filter(|c| *c > 0)?;
        Some(self.sum / count)
    }

    /// An upper estimate of the `q`-quantile (0.0..=1.0): the bound of the bucket it falls in.
    /// Requests slower than every bound report the last bound. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return LATENCY_BUCKET_BOUNDS
                    .get(i)
                    .or(LATENCY_BUCKET_BOUNDS.last())
                    .copied();
            }
        }
        LATENCY_BUCKET_BOUNDS.last().copied()
    }
}

impl StorageMetricsSnapshot {
    pub fn op(&self, op: OpKind) -> &OpMetricsSnapshot {
        &self.ops[op.index()]
    }

    pub fn iter(&self) -> impl Iterator<Item = (OpKind, &OpMetricsSnapshot)> {
        OpKind::ALL.into_iter().zip(self.ops.iter())
    }

    pub fn total_requests(&self) -> u64 {
        self.ops.iter().map(|o| o.requests).sum()
    }

    /// Requests by area of the key and kind, sorted (see [`StorageMetrics::set_key_areas`]).
    pub fn by_area(&self) -> &[(&'static str, OpKind, u64)] {
        &self.by_area
    }

    /// Requests to keys of `area`, of every kind.
    pub fn area_requests(&self, area: &str) -> u64 {
        self.by_area
            .iter()
            .filter(|(a, _, _)| *a == area)
            .map(|(_, _, n)| n)
            .sum()
    }

    pub fn total_failures(&self) -> u64 {
        self.ops.iter().map(|o| o.failures).sum()
    }

    /// Payload bytes successfully written to storage.
    pub fn bytes_ingested(&self) -> u64 {
        self.ops.iter().map(|o| o.bytes_in).sum()
    }

    /// Requests of every kind per gigabyte (10⁹ bytes) successfully written: what an object
    /// store bills per request, per unit of data the broker stored. `None` before any write.
    pub fn requests_per_gb_ingested(&self) -> Option<f64> {
        requests_per_gb(self.total_requests(), self.bytes_ingested())
    }
}

/// What an object store charges per request, per 1,000 requests of each billing class, in
/// the bill's currency. S3 bills writes and listings (PUT, COPY, POST, LIST) at one price and
/// reads (GET, HEAD) at another, and deletes nothing; the put price here covers `put_*` and
/// `list`, the get price `get` and `get_range`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestPrices {
    pub per_1000_puts: f64,
    pub per_1000_gets: f64,
}

impl RequestPrices {
    /// AWS S3 Standard's list prices in us-east-1, in USD (the default estimate).
    pub const S3_STANDARD: Self = Self {
        per_1000_puts: 0.005,
        per_1000_gets: 0.0004,
    };

    /// What the requests counted in `snapshot` cost.
    pub fn cost(&self, snapshot: &StorageMetricsSnapshot) -> f64 {
        let count = |kinds: &[OpKind]| -> f64 {
            kinds.iter().map(|k| snapshot.op(*k).requests as f64).sum()
        };
        let puts = count(&[OpKind::PutCreate, OpKind::PutUpdate, OpKind::List]);
        let gets = count(&[OpKind::Get, OpKind::GetRange]);
        (puts * self.per_1000_puts + gets * self.per_1000_gets) / 1000.0
    }

    /// The request cost per gigabyte (10⁹ bytes) successfully written, or `None` before any
    /// write: the storage's request bill per unit of data ingested, which group-commit
    /// settings and segment sizes change.
    pub fn cost_per_gb_ingested(&self, snapshot: &StorageMetricsSnapshot) -> Option<f64> {
        let bytes = snapshot.bytes_ingested();
        (bytes > 0).then(|| self.cost(snapshot) / (bytes as f64 / 1e9))
    }
}

/// `requests` per gigabyte (10⁹ bytes) of `bytes`, or `None` when `bytes` is zero.
pub fn requests_per_gb(requests: u64, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| requests as f64 / (bytes as f64 / 1e9))
}

/// Counts every request that passes through into a [`StorageMetrics`] and a [`StorageHealth`].
#[derive(Debug)]
pub struct MetricsStore {
    inner: Arc<dyn ObjectStore>,
    metrics: Arc<StorageMetrics>,
    health: Arc<StorageHealth>,
    clock: Arc<dyn Clock>,
}

impl MetricsStore {
    /// Wraps `inner` with fresh metrics and health; `clock` times requests and stamps health.
    pub fn new(inner: Arc<dyn ObjectStore>, clock: Arc<dyn Clock>) -> Self {
        let health = Arc::new(StorageHealth::new(Arc::clone(&clock)));
        Self::with_shared(inner, Arc::new(StorageMetrics::new()), health, clock)
    }

    /// Wraps `inner`, recording into existing metrics and health (e.g. one set for several
    /// stores).
    pub fn with_shared(
        inner: Arc<dyn ObjectStore>,
        metrics: Arc<StorageMetrics>,
        health: Arc<StorageHealth>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner,
            metrics,
            health,
            clock,
        }
    }

    pub fn metrics(&self) -> &Arc<StorageMetrics> {
        &self.metrics
    }

    pub fn health(&self) -> &Arc<StorageHealth> {
        &self.health
    }

    fn record<T>(
        &self,
        op: OpKind,
        key: &str,
        started: Duration,
        result: &StorageResult<T>,
        bytes: (u64, u64),
    ) {
        let latency = self.clock.monotonic().saturating_sub(started);
        self.metrics.record(op, latency, result, bytes.0, bytes.1);
        self.metrics.record_area(op, key);
        self.health.record_op(op, result);
        if let Err(error) = result {
            if is_storage_failure(error) {
                tracing::debug!(backend = self.inner.backend_name(), %op, %error, "storage request failed");
            }
        }
    }
}

#[async_trait]
impl ObjectStore for MetricsStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let op = OpKind::of_put(&mode);
        let len = data.len() as u64;
        let started = self.clock.monotonic();
        let result = self.inner.put(key, data, mode).await;
        self.record(op, key.as_str(), started, &result, (len, 0));
        result
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        let started = self.clock.monotonic();
        let result = self.inner.get(key).await;
        let read = result.as_ref().map_or(0, |(data, _)| data.len() as u64);
        self.record(OpKind::Get, key.as_str(), started, &result, (0, read));
        result
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        let started = self.clock.monotonic();
        let result = self.inner.get_range(key, range).await;
        let read = result.as_ref().map_or(0, |data| data.len() as u64);
        self.record(OpKind::GetRange, key.as_str(), started, &result, (0, read));
        result
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let started = self.clock.monotonic();
        let result = self.inner.list(prefix).await;
        self.record(OpKind::List, prefix, started, &result, (0, 0));
        result
    }

    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        let started = self.clock.monotonic();
        let result = self.inner.list_keys(prefix).await;
        self.record(OpKind::List, prefix, started, &result, (0, 0));
        result
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        let started = self.clock.monotonic();
        let result = self.inner.delete(key).await;
        self.record(OpKind::Delete, key.as_str(), started, &result, (0, 0));
        result
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;

    use super::*;
    use crate::{FaultInjectingStore, InjectedError, MemoryStore, StorageError};

    #[tokio::test]
    async fn metrics_count_requests_errors_bytes_and_health() {
        let clock = Arc::new(ManualClock::new(0));
        let faults = Arc::new(FaultInjectingStore::new(
            Arc::new(MemoryStore::new()),
            Default::default(),
            7,
        ));
        let store = MetricsStore::new(faults.clone(), clock.clone());
        let key = ObjectKey::new("a/b").unwrap();

        let v = store
            .put(&key, Bytes::from(vec![0u8; 1000]), PutMode::Create)
            .await
            .unwrap();
        store
            .put(&key, Bytes::from(vec![1u8; 500]), PutMode::Update(v))
            .await
            .unwrap();
        assert!(store
            .put(&key, Bytes::from_static(b"x"), PutMode::Create)
            .await
            .is_err());
        store.get(&key).await.unwrap();
        store.get_range(&key, 10..20).await.unwrap();
        store.list("a/").await.unwrap();
        faults.fail_next(OpKind::Delete, InjectedError::Unavailable);
        assert!(store.delete(&key).await.is_err());

        let snap = store.metrics().snapshot();
        let create = snap.op(OpKind::PutCreate);
        assert_eq!((create.requests, create.errors, create.failures), (2, 1, 0));
        assert_eq!(create.bytes_in, 1000);
        assert_eq!(snap.op(OpKind::PutUpdate).bytes_in, 500);
        assert_eq!(snap.op(OpKind::Get).bytes_out, 500);
        assert_eq!(snap.op(OpKind::GetRange).bytes_out, 10);
        assert_eq!(snap.op(OpKind::List).requests, 1);
        let delete = snap.op(OpKind::Delete);
        assert_eq!((delete.requests, delete.failures), (1, 1));
        assert_eq!(snap.total_requests(), 7);
        assert_eq!(snap.bytes_ingested(), 1500);
        let per_gb = snap.requests_per_gb_ingested().unwrap();
        assert!((per_gb - 7.0 / 1.5e-6).abs() < 1e-3, "{per_gb}");
        // 2 creates, 1 update and 1 list at the put price, 1 get and 1 ranged get at the get
        // price, the delete free.
        let prices = RequestPrices {
            per_1000_puts: 5.0,
            per_1000_gets: 0.4,
        };
        let cost = prices.cost(&snap);
        assert!(
            (cost - (4.0 * 5.0 + 2.0 * 0.4) / 1000.0).abs() < 1e-12,
            "{cost}"
        );
        let per_gb = prices.cost_per_gb_ingested(&snap).unwrap();
        assert!((per_gb - cost / 1.5e-6).abs() < 1e-6, "{per_gb}");
        assert_eq!(
            prices.cost_per_gb_ingested(&StorageMetrics::new().snapshot()),
            None
        );
        // Every request took zero time on the manual clock: all land in the first bucket.
        assert_eq!(create.latency.counts[0], 2);
        assert_eq!(
            create.latency.quantile(0.99),
            Some(LATENCY_BUCKET_BOUNDS[0])
        );

        let health = store.health().snapshot();
        assert_eq!(health.consecutive_failures, 1);
        assert!(health.last_error.unwrap().contains("injected"));
    }

    #[tokio::test]
    async fn requests_are_counted_by_area_once_areas_are_set() {
        let store = MetricsStore::new(Arc::new(MemoryStore::new()), Arc::new(ManualClock::new(0)));
        let key = ObjectKey::new("a/b").unwrap();
        store.get(&key).await.unwrap_err();
        assert!(store.metrics().snapshot().by_area().is_empty());
        store
            .metrics()
            .set_key_areas(|key| if key.starts_with("a/") { "a" } else { "rest" });
        store.get(&key).await.unwrap_err();
        store.list("a/").await.unwrap();
        store.list("").await.unwrap();
        let snapshot = store.metrics().snapshot();
        assert_eq!(
            snapshot.by_area(),
            [
                ("a", OpKind::Get, 1),
                ("a", OpKind::List, 1),
                ("rest", OpKind::List, 1)
            ]
        );
        assert_eq!(snapshot.area_requests("a"), 2);
    }

    #[test]
    fn latency_lands_in_log_spaced_buckets() {
        let metrics = StorageMetrics::new();
        let ok: StorageResult<()> = Ok(());
        for micros in [10, 64, 65, 1_000, 100_000, 60_000_000] {
            metrics.record(OpKind::Get, Duration::from_micros(micros), &ok, 0, 0);
        }
        let err: StorageResult<()> = Err(StorageError::Timeout(Duration::from_secs(1)));
        metrics.record(OpKind::Get, Duration::from_secs(1), &err, 0, 0);
        let snapshot = metrics.snapshot();
        let hist = &snapshot.op(OpKind::Get).latency;
        assert_eq!(hist.count(), 7);
        assert_eq!(hist.counts[0], 2); // 10 µs and 64 µs
        assert_eq!(hist.counts[1], 1); // 65 µs <= 128 µs
        assert_eq!(hist.counts[BUCKETS - 1], 1); // 60 s: slower than every bound
        assert_eq!(hist.quantile(0.0), Some(Duration::from_micros(64)));
        assert_eq!(hist.quantile(0.5), Some(Duration::from_micros(1024)));
        assert_eq!(hist.quantile(1.0), LATENCY_BUCKET_BOUNDS.last().copied());
        assert_eq!(requests_per_gb(10, 0), None);
        assert_eq!(requests_per_gb(10, 2_000_000_000), Some(5.0));
    }
}
