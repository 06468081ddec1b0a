//! A cheap, shared view of whether storage is answering, for the broker's health reporting.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_core::Clock;

use crate::StorageError;

/// Last success and failure times and the current run of failures, updated by
/// [`MetricsStore`](crate::MetricsStore) on every request. Reading it takes no lock on the
/// request path: the counters are atomics, only the last error message sits behind a mutex, and
/// that is touched on failures alone.
#[derive(Debug)]
pub struct StorageHealth {
    clock: Arc<dyn Clock>,
    /// Monotonic nanoseconds + 1 of the last success; 0 means never.
    last_success_mono: AtomicU64,
    last_success_wall_ms: AtomicI64,
    last_failure_mono: AtomicU64,
    last_failure_wall_ms: AtomicI64,
    consecutive_failures: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A point-in-time copy of [`StorageHealth`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageHealthSnapshot {
    pub last_success_wall_millis: Option<i64>,
    pub last_failure_wall_millis: Option<i64>,
    /// How long ago storage last answered, by the monotonic clock.
    pub since_last_success: Option<Duration>,
    pub since_last_failure: Option<Duration>,
    /// Failures since the last success.
    pub consecutive_failures: u64,
    pub last_error: Option<String>,
}

impl StorageHealthSnapshot {
    /// Healthy unless the last `max_consecutive_failures` or more requests in a row all failed.
    pub fn is_healthy(&self, max_consecutive_failures: u64) -> bool {
        self.consecutive_failures < max_consecutive_failures.max(1)
    }
}

/// Whether an error means the storage failed to serve the request, as opposed to answering it.
/// `NotFound`, `AlreadyExists` and `Precondition` are answers (a lost CAS race is a healthy
/// storage doing its job) and `Invalid` is the caller's mistake, so none of them count.
pub fn is_storage_failure(error: &StorageError) -> bool {
    matches!(
        error,
        StorageError::Throttled(_)
            | StorageError::Timeout(_)
            | StorageError::Unavailable(_)
            | StorageError::Other(_)
    )
}

impl StorageHealth {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            last_success_mono: AtomicU64::new(0),
            last_success_wall_ms: AtomicI64::new(0),
            last_failure_mono: AtomicU64::new(0),
            last_failure_wall_ms: AtomicI64::new(0),
            consecutive_failures: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }

    /// Records the outcome of one request, classifying errors with [`is_storage_failure`].
    pub fn record<T>(&self, result: &Result<T, StorageError>) {
        match result {
            Err(error) if is_storage_failure(error) => self.record_failure(error),
            _ => self.record_success(),
        }
    }

    pub fn record_success(&self) {
        self.last_success_mono
            .store(self.mono_stamp(), Ordering::Relaxed);
        self.last_success_wall_ms
            .store(self.clock.wall_millis(), Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
    }

    pub fn record_failure(&self, error: &StorageError) {
        self.last_failure_mono
            .store(self.mono_stamp(), Ordering::Relaxed);
        self.last_failure_wall_ms
            .store(self.clock.wall_millis(), Ordering::Relaxed);
        self.consecutive_failures.fetch_add(1, Ordering::Relaxed);
        *self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error.to_string());
    }

    pub fn consecutive_failures(&self) -> u64 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> StorageHealthSnapshot {
        let now = self.clock.monotonic();
        let since =
            |stamp: u64| (stamp != 0).then(|| now.saturating_sub(Duration::from_nanos(stamp - 1)));
        let success = self.last_success_mono.load(Ordering::Relaxed);
        let failure = self.last_failure_mono.load(Ordering::Relaxed);
        StorageHealthSnapshot {
            last_success_wall_millis: (success != 0)
                .then(|| self.last_success_wall_ms.load(Ordering::Relaxed)),
            last_failure_wall_millis: (failure != 0)
                .then(|| self.last_failure_wall_ms.load(Ordering::Relaxed)),
            since_last_success: since(success),
            since_last_failure: since(failure),
            consecutive_failures: self.consecutive_failures(),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        }
    }

    fn mono_stamp(&self) -> u64 {
        u64::try_from(self.clock.monotonic().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;

    use super::*;

    #[test]
    fn failures_accumulate_until_a_success() {
        let clock = Arc::new(ManualClock::new(1_000));
        let health = StorageHealth::new(clock.clone());
        assert_eq!(health.snapshot().since_last_success, None);

        health.record::<()>(&Err(StorageError::Unavailable("down".into())));
        health.record::<()>(&Err(StorageError::Timeout(Duration::from_secs(1))));
        // Answers are not failures.
        health.record::<()>(&Err(StorageError::Precondition(
            crate::ObjectKey::new("k").unwrap(),
        )));
        let snap = health.snapshot();
        assert_eq!(snap.consecutive_failures, 0);

        health.record::<()>(&Err(StorageError::Unavailable("down".into())));
        health.record::<()>(&Err(StorageError::Unavailable("still down".into())));
        clock.advance(Duration::from_secs(3));
        let snap = health.snapshot();
        assert_eq!(snap.consecutive_failures, 2);
        assert!(!snap.is_healthy(2));
        assert!(snap.is_healthy(3));
        assert_eq!(snap.since_last_success, Some(Duration::from_secs(3)));
        assert_eq!(snap.last_success_wall_millis, Some(1_000));
        assert!(snap.last_error.unwrap().contains("still down"));

        health.record::<()>(&Ok(()));
        assert_eq!(health.snapshot().consecutive_failures, 0);
    }
}
