//! A store that fails on purpose, for tests and the deterministic simulation: random errors and
//! latency per kind of request from a seeded RNG, an outage switch, scripted one-off faults, and
//! ambiguous failures — a put that is applied and then reported as failed, the case that makes
//! retries dangerous and that the layers above must survive.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_core::{Clock, SystemClock};

use crate::{
    ListedKey, ObjectKey, ObjectMeta, ObjectStore, OpKind, PutMode, StorageError, StorageResult,
    Version,
};

/// Which error a fault produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InjectedError {
    Throttled,
    Timeout,
    #[default]
    Unavailable,
    /// Out of space (what a local directory on a full filesystem answers).
    Full,
    Other,
}

impl InjectedError {
    fn to_error(self, op: OpKind) -> StorageError {
        match self {
            InjectedError::Throttled => StorageError::Throttled(format!("injected fault on {op}")),
            InjectedError::Timeout => StorageError::Timeout(Duration::ZERO),
            InjectedError::Unavailable => {
                StorageError::Unavailable(format!("injected fault on {op}"))
            }
            InjectedError::Full => StorageError::Full(format!("injected fault on {op}")),
            InjectedError::Other => StorageError::Other(format!("injected fault on {op}")),
        }
    }
}

/// One scripted fault, consumed by the next request of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without touching the inner store.
    Fail(InjectedError),
    /// Carry the request out on the inner store, then report this error anyway: the ambiguous
    /// outcome of a request whose answer was lost.
    ApplyThenFail(InjectedError),
    /// Wait this long, then carry the request out normally.
    Delay(Duration),
}

/// Random faults for one kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OpFaults {
    /// Chance (0.0..=1.0) that a request fails without being applied.
    pub error_probability: f64,
    /// Chance that a request is applied and then reported as failed (ambiguous). Checked after
    /// `error_probability`; meaningful for puts and deletes.
    pub ambiguous_probability: f64,
    /// The error both kinds of failure report.
    pub error: InjectedError,
    /// Added to every request.
    pub latency: Duration,
    /// Plus a uniformly random extra delay up to this.
    pub latency_jitter: Duration,
}

/// Random faults for every kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    ops: [OpFaults; OpKind::COUNT],
}

impl FaultConfig {
    /// No faults at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// The same faults for every kind of request.
    pub fn uniform(faults: OpFaults) -> Self {
        Self {
            ops: [faults; OpKind::COUNT],
        }
    }

    /// Sets the faults for one kind of request.
    pub fn with(mut self, op: OpKind, faults: OpFaults) -> Self {
        self.ops[op.index()] = faults;
        self
    }

    pub fn get(&self, op: OpKind) -> &OpFaults {
        &self.ops[op.index()]
    }
}

/// Wraps a store and fails some of its requests. Share it as `Arc<FaultInjectingStore>` to flip
/// the outage switch or script faults while it serves as an `Arc<dyn ObjectStore>` below.
#[derive(Debug)]
pub struct FaultInjectingStore {
    inner: Arc<dyn ObjectStore>,
    /// Injected latency is slept on this clock (the real one unless [`Self::with_clock`]).
    clock: Arc<dyn Clock>,
    state: Mutex<FaultState>,
    outage: AtomicBool,
    injected: AtomicU64,
}

#[derive(Debug)]
struct FaultState {
    config: FaultConfig,
    rng: StdRng,
    scripted: [VecDeque<Fault>; OpKind::COUNT],
}

/// What one request will suffer, decided up front under the lock.
#[derive(Debug)]
struct Plan {
    delay: Duration,
    outcome: Outcome,
}

#[derive(Debug)]
enum Outcome {
    Pass,
    Fail(InjectedError),
    ApplyThenFail(InjectedError),
}

impl FaultInjectingStore {
    /// Random draws come from `seed` alone, so a single-threaded run replays exactly.
    pub fn new(inner: Arc<dyn ObjectStore>, config: FaultConfig, seed: u64) -> Self {
        Self {
            inner,
            clock: SystemClock::shared(),
            state: Mutex::new(FaultState {
                config,
                rng: StdRng::seed_from_u64(seed),
                scripted: Default::default(),
            }),
            outage: AtomicBool::new(false),
            injected: AtomicU64::new(0),
        }
    }

    /// Sleeps injected latency on `clock` (a simulation's) instead of the real clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn set_config(&self, config: FaultConfig) {
        self.lock().config = config;
    }

    /// While on, every request fails at once with `Unavailable` and reaches nothing.
    pub fn set_outage(&self, on: bool) {
        self.outage.store(on, Ordering::SeqCst);
    }

    pub fn outage(&self) -> bool {
        self.outage.load(Ordering::SeqCst)
    }

    /// Queues a fault for the next request of kind `op` (faults of one kind are used in order,
    /// before any random fault is considered).
    pub fn inject_next(&self, op: OpKind, fault: Fault) {
        self.lock().scripted[op.index()].push_back(fault);
    }

    /// Shorthand: the next request of kind `op` fails without being applied.
    pub fn fail_next(&self, op: OpKind, error: InjectedError) {
        self.inject_next(op, Fault::Fail(error));
    }

    /// Shorthand: the next request of kind `op` is applied, then reported as `error`.
    pub fn apply_then_fail_next(&self, op: OpKind, error: InjectedError) {
        self.inject_next(op, Fault::ApplyThenFail(error));
    }

    /// How many requests have been failed on purpose so far (outages included).
    pub fn injected_count(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // Every mutation under this lock is a single step; a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn plan(&self, op: OpKind) -> Plan {
        if self.outage() {
            return Plan {
                delay: Duration::ZERO,
                outcome: Outcome::Fail(InjectedError::Unavailable),
            };
        }
        let mut state = self.lock();
        if let Some(fault) = state.scripted[op.index()].pop_front() {
            return match fault {
                Fault::Fail(error) => Plan {
                    delay: Duration::ZERO,
                    outcome: Outcome::Fail(error),
                },
                Fault::ApplyThenFail(error) => Plan {
                    delay: Duration::ZERO,
                    outcome: Outcome::ApplyThenFail(error),
                },
                Fault::Delay(delay) => Plan {
                    delay,
                    outcome: Outcome::Pass,
                },
            };
        }
        let faults = *state.config.get(op);
        let jitter = if faults.latency_jitter.is_zero() {
            Duration::ZERO
        } else {
            let nanos = u64::try_from(faults.latency_jitter.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(state.rng.random_range(0..=nanos))
        };
        // Draw both numbers every time so the sequence of draws does not depend on outcomes.
        let error_roll: f64 = state.rng.random();
        let ambiguous_roll: f64 = state.rng.random();
        let outcome = if error_roll < faults.error_probability {
            Outcome::Fail(faults.error)
        } else if ambiguous_roll < faults.ambiguous_probability {
            Outcome::ApplyThenFail(faults.error)
        } else {
            Outcome::Pass
        };
        Plan {
            delay: faults.latency + jitter,
            outcome,
        }
    }

    /// Runs one request under its planned fault.
    async fn run<T: Send>(
        &self,
        op: OpKind,
        request: impl std::future::Future<Output = StorageResult<T>> + Send,
    ) -> StorageResult<T> {
        let plan = self.plan(op);
        if !plan.delay.is_zero() {
            self.clock.sleep(plan.delay).await;
        }
        match plan.outcome {
            Outcome::Pass => request.await,
            Outcome::Fail(error) => {
                self.injected.fetch_add(1, Ordering::SeqCst);
                Err(error.to_error(op))
            }
            Outcome::ApplyThenFail(error) => {
                self.injected.fetch_add(1, Ordering::SeqCst);
                let applied = request.await;
                tracing::debug!(%op, ok = applied.is_ok(), "injected a failure after applying");
                Err(error.to_error(op))
            }
        }
    }
}

#[async_trait]
impl ObjectStore for FaultInjectingStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let op = OpKind::of_put(&mode);
        self.run(op, self.inner.put(key, data, mode)).await
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        self.run(OpKind::Get, self.inner.get(key)).await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        self.run(OpKind::GetRange, self.inner.get_range(key, range))
            .await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        self.run(OpKind::List, self.inner.list(prefix)).await
    }

    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        self.run(OpKind::List, self.inner.list_keys(prefix)).await
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.run(OpKind::Delete, self.inner.delete(key)).await
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn key(k: &str) -> ObjectKey {
        ObjectKey::new(k).unwrap()
    }

    #[tokio::test]
    async fn scripted_ambiguous_put_is_applied_but_reported_failed() {
        let memory = Arc::new(MemoryStore::new());
        let store = FaultInjectingStore::new(memory.clone(), FaultConfig::none(), 1);
        store.apply_then_fail_next(OpKind::PutCreate, InjectedError::Timeout);
        let err = store
            .put(&key("k"), Bytes::from_static(b"v"), PutMode::Create)
            .await
            .unwrap_err();
        assert!(err.is_ambiguous(), "{err}");
        assert_eq!(&memory.get(&key("k")).await.unwrap().0[..], b"v");

        store.fail_next(OpKind::Get, InjectedError::Throttled);
        assert!(matches!(
            store.get(&key("k")).await,
            Err(StorageError::Throttled(_))
        ));
        assert!(
            store.get(&key("k")).await.is_ok(),
            "scripted faults are used once"
        );
        assert_eq!(store.injected_count(), 2);
    }

    #[tokio::test]
    async fn outage_fails_everything_without_touching_the_store() {
        let memory = Arc::new(MemoryStore::new());
        let store = FaultInjectingStore::new(memory.clone(), FaultConfig::none(), 1);
        store.set_outage(true);
        assert!(store
            .put(&key("k"), Bytes::from_static(b"v"), PutMode::Create)
            .await
            .is_err());
        assert!(store.list("").await.is_err());
        assert_eq!(memory.object_count(), 0);
        store.set_outage(false);
        store
            .put(&key("k"), Bytes::from_static(b"v"), PutMode::Create)
            .await
            .unwrap();
    }

    async fn failures_for_seed(seed: u64) -> Vec<bool> {
        let config = FaultConfig::none().with(
            OpKind::Get,
            OpFaults {
                error_probability: 0.3,
                ..OpFaults::default()
            },
        );
        let memory = Arc::new(MemoryStore::new());
        memory
            .put(&key("k"), Bytes::from_static(b"v"), PutMode::Create)
            .await
            .unwrap();
        let store = FaultInjectingStore::new(memory, config, seed);
        let mut failed = Vec::new();
        for _ in 0..200 {
            failed.push(store.get(&key("k")).await.is_err());
        }
        // Other kinds were configured without faults.
        assert!(store.list("").await.is_ok());
        failed
    }

    #[tokio::test]
    async fn random_faults_follow_the_probability_and_replay_by_seed() {
        let seed = 42;
        let first = failures_for_seed(seed).await;
        let failures = first.iter().filter(|f| **f).count();
        assert!(
            (30..=90).contains(&failures),
            "seed {seed}: {failures}/200 failed"
        );
        assert_eq!(
            first,
            failures_for_seed(seed).await,
            "seed {seed} did not replay"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn injected_latency_delays_requests() {
        let config = FaultConfig::uniform(OpFaults {
            latency: Duration::from_millis(100),
            latency_jitter: Duration::from_millis(50),
            ..OpFaults::default()
        });
        let store = FaultInjectingStore::new(Arc::new(MemoryStore::new()), config, 3);
        let started = tokio::time::Instant::now();
        store.list("").await.unwrap();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took <= Duration::from_millis(150),
            "{took:?}"
        );
    }
}
