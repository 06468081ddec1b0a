//! A cheap, shared view of whether storage is answering, for the broker's health reporting.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_core::Clock;

use crate::{OpKind, StorageError};

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
    /// Puts failed since the last put that succeeded. Counted apart because a storage that
    /// serves reads but refuses writes (a full disk, a quota) keeps resetting the run above
    /// with every successful read, while no producer can be acknowledged.
    consecutive_write_failures: AtomicU64,
    last_write_error: Mutex<Option<String>>,
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
    /// Put failures since the last put that succeeded (other requests do not reset it).
    pub consecutive_write_failures: u64,
    pub last_write_error: Option<String>,
}

impl StorageHealthSnapshot {
    /// Healthy unless the last `max_consecutive_failures` or more requests in a row all failed,
    /// or as many puts in a row did (see [`Self::writes_failing`]).
    pub fn is_healthy(&self, max_consecutive_failures: u64) -> bool {
        self.consecutive_failures < max_consecutive_failures.max(1)
            && !self.writes_failing(max_consecutive_failures)
    }

    /// Whether the last `max_consecutive_failures` or more puts all failed, whatever the reads
    /// did meanwhile: nothing can be made durable, so no producer can be acknowledged.
    pub fn writes_failing(&self, max_consecutive_failures: u64) -> bool {
        self.consecutive_write_failures >= max_consecutive_failures.max(1)
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
            | StorageError::Full(_)
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
            consecutive_write_failures: AtomicU64::new(0),
            last_write_error: Mutex::new(None),
        }
    }

    /// [`Self::record`], and for puts also the write run: a put that succeeded ends it, a
    /// storage failure extends it, and an answer (a lost create or compare-and-swap race) says
    /// nothing about whether data can be stored, so it leaves it alone.
    pub fn record_op<T>(&self, op: OpKind, result: &Result<T, StorageError>) {
        self.record(result);
        if !op.is_put() {
            return;
        }
        match result {
            Ok(_) => self.consecutive_write_failures.store(0, Ordering::Relaxed),
            Err(error) if is_storage_failure(error) => {
                self.consecutive_write_failures
                    .fetch_add(1, Ordering::Relaxed);
                *self
                    .last_write_error
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error.to_string());
            }
            Err(_) => {}
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
            consecutive_write_failures: self.consecutive_write_failures.load(Ordering::Relaxed),
            last_write_error: self
                .last_write_error
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

    /// A full disk: every put fails, every read succeeds. Reads must not hide it.
    #[test]
    fn failing_writes_are_unhealthy_even_while_reads_succeed() {
        let clock = Arc::new(ManualClock::new(0));
        let health = StorageHealth::new(clock);
        let full = || Err::<(), _>(StorageError::Full("no space left on device".into()));
        for _ in 0..3 {
            health.record_op(OpKind::PutCreate, &full());
            health.record_op(OpKind::Get, &Ok(()));
        }
        let snap = health.snapshot();
        assert_eq!(snap.consecutive_failures, 0, "reads reset the overall run");
        assert_eq!(snap.consecutive_write_failures, 3);
        assert!(snap.writes_failing(3));
        assert!(!snap.is_healthy(3));
        assert!(snap.last_write_error.unwrap().contains("no space"));

        // A lost compare-and-swap race is an answer: it neither ends nor extends the run.
        health.record_op(
            OpKind::PutUpdate,
            &Err::<(), _>(StorageError::Precondition(
                crate::ObjectKey::new("k").unwrap(),
            )),
        );
        assert_eq!(health.snapshot().consecutive_write_failures, 3);
        health.record_op(OpKind::PutUpdate, &Ok(()));
        assert!(health.snapshot().is_healthy(3));
    }
}
