//! Ownership-change figures and what `/metrics` reports about this broker's place in the
//! cluster.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What `/metrics` reports about this broker's place in the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterMetrics {
    pub live_brokers: usize,
    pub draining: bool,
    /// Partitions (consumer-group shards included) this broker serves.
    pub partitions_owned: usize,
    pub ownership: OwnershipStatsSnapshot,
}

/// Partitions served by the log, for the ownership runner.
/// Counts and durations of ownership changes on this broker, for `/metrics`. Durations are
/// kept as totals with counts (Prometheus summaries without quantiles) plus the slowest, so an
/// operator sees both the usual handover and the worst one since start.
#[derive(Debug, Default)]
pub struct OwnershipStats {
    pub(super) acquired: AtomicU64,
    pub(super) acquire_failed: AtomicU64,
    pub(super) acquire_micros: AtomicU64,
    pub(super) acquire_max_micros: AtomicU64,
    pub(super) handed_over: AtomicU64,
    pub(super) handover_failed: AtomicU64,
    pub(super) handover_micros: AtomicU64,
    pub(super) handover_max_micros: AtomicU64,
    /// Stopped serving without a handover: fenced, lost, removed, our lease running out.
    pub(super) dropped: AtomicU64,
}

/// A copy of [`OwnershipStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnershipStatsSnapshot {
    pub acquired: u64,
    pub acquire_failed: u64,
    pub acquire_seconds_total: Duration,
    pub acquire_seconds_max: Duration,
    pub handed_over: u64,
    pub handover_failed: u64,
    pub handover_seconds_total: Duration,
    pub handover_seconds_max: Duration,
    pub dropped: u64,
}

impl OwnershipStats {
    pub(super) fn record(count: &AtomicU64, total: &AtomicU64, max: &AtomicU64, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        count.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(micros, Ordering::Relaxed);
        max.fetch_max(micros, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> OwnershipStatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let micros = |a: &AtomicU64| Duration::from_micros(a.load(Ordering::Relaxed));
        OwnershipStatsSnapshot {
            acquired: get(&self.acquired),
            acquire_failed: get(&self.acquire_failed),
            acquire_seconds_total: micros(&self.acquire_micros),
            acquire_seconds_max: micros(&self.acquire_max_micros),
            handed_over: get(&self.handed_over),
            handover_failed: get(&self.handover_failed),
            handover_seconds_total: micros(&self.handover_micros),
            handover_seconds_max: micros(&self.handover_max_micros),
            dropped: get(&self.dropped),
        }
    }
}
