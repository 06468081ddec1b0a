//! Retries with exponential backoff and full jitter, and the resolution of ambiguous puts.
//!
//! A put that times out may have landed. Retried blindly, a create-only put then reports
//! `AlreadyExists` about its own object — and a broker would believe it was fenced — while a
//! compare-and-swap reports `Precondition` about its own write. So when an attempt of a put was
//! ambiguous and a later attempt hits exactly that conflict, the object is read back: if it holds
//! the bytes we wrote, the put succeeded and we return the version read; otherwise the conflict
//! stands.
//!
//! The read-back compares bytes, so it cannot tell our write from another writer's identical
//! bytes. Payloads whose authorship matters (epoch seals, owner records, manifests) should name
//! their writer and epoch, which they do anyway for fencing.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_core::Clock;

use crate::{
    ListedKey, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageError, StorageResult, Version,
};

/// When to give up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included. 1 means never retry.
    pub max_attempts: u32,
    /// The backoff ceiling before the first retry; it doubles with each retry.
    pub initial_backoff: Duration,
    /// The backoff ceiling never grows past this.
    pub max_backoff: Duration,
    /// No retry is started if its backoff would end later than this after the first attempt
    /// began; the last error is returned instead.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    /// Suits a remote object store: rides out a few seconds of throttling or a short outage.
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(2),
            max_elapsed: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The largest backoff before retry number `retry` (1-based): `initial · 2^(retry-1)`, capped.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

/// Retries the inner store's errors that may pass within seconds (see
/// [`StorageError::is_worth_retrying_now`]); a full storage is answered at once.
///
/// Backoff is "full jitter": a uniformly random wait between zero and the exponential ceiling,
/// which spreads out brokers that failed together better than a fixed or ±-jittered backoff.
/// The randomness comes from a seeded RNG and elapsed time from the injected clock, so a
/// simulation replays the same waits; and the waits are the clock's sleeps.
#[derive(Debug)]
pub struct RetryStore {
    inner: Arc<dyn ObjectStore>,
    policy: RetryPolicy,
    clock: Arc<dyn Clock>,
    rng: Mutex<StdRng>,
}

impl RetryStore {
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        policy: RetryPolicy,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Self {
        Self {
            inner,
            policy,
            clock,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    fn backoff(&self, retry: u32) -> Duration {
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        full_jitter(self.policy.backoff_ceiling(retry), &mut *rng)
    }

    async fn with_retries<T, Fut>(
        &self,
        op: &'static str,
        key: Option<&ObjectKey>,
        mut attempt: impl FnMut() -> Fut + Send,
    ) -> StorageResult<T>
    where
        Fut: Future<Output = StorageResult<T>> + Send,
    {
        let started = self.clock.monotonic();
        let mut attempts = 1;
        loop {
            let error = match attempt().await {
                Err(error) if error.is_worth_retrying_now() => error,
                done => return done,
            };
            if attempts >= self.policy.max_attempts {
                tracing::debug!(op, ?key, attempts, %error, "giving up: out of attempts");
                return Err(error);
            }
            let backoff = self.backoff(attempts);
            let elapsed = self.clock.monotonic().saturating_sub(started);
            if elapsed + backoff > self.policy.max_elapsed {
                tracing::debug!(op, ?key, attempts, ?elapsed, %error, "giving up: out of time");
                return Err(error);
            }
            tracing::debug!(op, ?key, attempts, ?backoff, %error, "retrying storage request");
            self.clock.sleep(backoff).await;
            attempts += 1;
        }
    }

    /// After a put that was ambiguous at least once ended in `conflict`: did our write land?
    async fn resolve_ambiguous_put(
        &self,
        key: &ObjectKey,
        data: &Bytes,
        conflict: StorageError,
    ) -> StorageResult<Version> {
        match holds_our_bytes(self, key, data).await {
            Ok(Some(version)) => {
                tracing::debug!(%key, "ambiguous put had landed; treating it as a success");
                Ok(version)
            }
            Ok(None) => Err(conflict),
            // Still cannot tell: say so rather than guess.
            Err(error) => Err(error),
        }
    }
}

/// A uniformly random wait between zero and `ceiling` ("full jitter"): brokers that failed
/// together spread out better than with a fixed or ±-jittered backoff.
pub fn full_jitter(ceiling: Duration, rng: &mut impl Rng) -> Duration {
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(0..=nanos))
}

/// After a put of `data` to `key` ran into a conflict (`AlreadyExists`, `Precondition`) that
/// an earlier, ambiguous attempt of the same put may have caused: does the object hold exactly
/// our bytes? `Some(version)` if so (the put landed), `None` if it holds other bytes or is gone
/// (created and deleted since: nothing shows that we won). The one place this question is
/// answered, for the retry layer and for writers that keep retrying beyond it.
pub async fn holds_our_bytes(
    store: &dyn ObjectStore,
    key: &ObjectKey,
    data: &Bytes,
) -> StorageResult<Option<Version>> {
    match store.get(key).await {
        Ok((stored, version)) if stored == *data => Ok(Some(version)),
        Ok(_) => Ok(None),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(error),
    }
}

#[async_trait]
impl ObjectStore for RetryStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let was_ambiguous = AtomicBool::new(false);
        let result = self
            .with_retries("put", Some(key), || {
                let (data, mode, was_ambiguous) = (data.clone(), mode.clone(), &was_ambiguous);
                async move {
                    let result = self.inner.put(key, data, mode).await;
                    if result.as_ref().is_err_and(StorageError::is_ambiguous) {
                        was_ambiguous.store(true, Ordering::Relaxed);
                    }
                    result
                }
            })
            .await;
        if !was_ambiguous.load(Ordering::Relaxed) {
            return result;
        }
        match (result, &mode) {
            (Err(conflict @ StorageError::AlreadyExists(_)), PutMode::Create)
            | (Err(conflict @ StorageError::Precondition(_)), PutMode::Update(_)) => {
                self.resolve_ambiguous_put(key, &data, conflict).await
            }
            (result, _) => result,
        }
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        self.with_retries("get", Some(key), || self.inner.get(key))
            .await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        self.with_retries("get_range", Some(key), || {
            self.inner.get_range(key, range.clone())
        })
        .await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        self.with_retries("list", None, || self.inner.list(prefix))
            .await
    }

    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        self.with_retries("list", None, || self.inner.list_keys(prefix))
            .await
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        // Deletes are idempotent, so a retry after an ambiguous delete is harmless.
        self.with_retries("delete", Some(key), || self.inner.delete(key))
            .await
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;

    use super::*;
    use crate::{FaultConfig, FaultInjectingStore, InjectedError, MemoryStore, OpKind};

    fn key(k: &str) -> ObjectKey {
        ObjectKey::new(k).unwrap()
    }

    struct Fixture {
        memory: Arc<MemoryStore>,
        faults: Arc<FaultInjectingStore>,
        store: RetryStore,
    }

    fn fixture(policy: RetryPolicy) -> Fixture {
        let memory = Arc::new(MemoryStore::new());
        let faults = Arc::new(FaultInjectingStore::new(
            memory.clone(),
            FaultConfig::none(),
            5,
        ));
        let store = RetryStore::new(
            faults.clone(),
            policy,
            strata_core::SystemClock::shared(),
            9,
        );
        Fixture {
            memory,
            faults,
            store,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ambiguous_create_that_landed_is_a_success() {
        let f = fixture(RetryPolicy::default());
        f.faults
            .apply_then_fail_next(OpKind::PutCreate, InjectedError::Timeout);
        let version = f
            .store
            .put(
                &key("wal/1/1/1"),
                Bytes::from_static(b"ours"),
                PutMode::Create,
            )
            .await
            .unwrap();
        let (data, stored_version) = f.memory.get(&key("wal/1/1/1")).await.unwrap();
        assert_eq!(&data[..], b"ours");
        assert_eq!(version, stored_version);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_storage_is_answered_at_once() {
        let f = fixture(RetryPolicy::default());
        for _ in 0..3 {
            f.faults.fail_next(OpKind::PutCreate, InjectedError::Full);
        }
        let err = f
            .store
            .put(&key("k"), Bytes::from_static(b"x"), PutMode::Create)
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Full(_)), "{err}");
        assert!(err.is_retryable() && !err.is_ambiguous());
        assert_eq!(
            f.faults.injected_count(),
            1,
            "no retries within the request"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ambiguous_create_beaten_by_another_writer_stays_already_exists() {
        let f = fixture(RetryPolicy::default());
        // Someone else holds the key, and our first attempt is lost before reaching storage:
        // the retry's AlreadyExists is read back and found not to be ours.
        let k = key("wal/1/1/1");
        f.memory
            .put(&k, Bytes::from_static(b"theirs"), PutMode::Create)
            .await
            .unwrap();
        f.faults
            .fail_next(OpKind::PutCreate, InjectedError::Unavailable);
        let err = f
            .store
            .put(&k, Bytes::from_static(b"ours"), PutMode::Create)
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::AlreadyExists(_)), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn unambiguous_already_exists_is_not_read_back() {
        let f = fixture(RetryPolicy::default());
        let k = key("k");
        f.memory
            .put(&k, Bytes::from_static(b"same"), PutMode::Create)
            .await
            .unwrap();
        // Same bytes, but our put never looked ambiguous: the object is not ours.
        let err = f
            .store
            .put(&k, Bytes::from_static(b"same"), PutMode::Create)
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::AlreadyExists(_)), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn ambiguous_cas_that_landed_is_a_success() {
        let f = fixture(RetryPolicy::default());
        let k = key("owners/t/0");
        let v1 = f
            .memory
            .put(&k, Bytes::from_static(b"epoch 1"), PutMode::Create)
            .await
            .unwrap();
        f.faults
            .apply_then_fail_next(OpKind::PutUpdate, InjectedError::Unavailable);
        let v2 = f
            .store
            .put(&k, Bytes::from_static(b"epoch 2"), PutMode::Update(v1))
            .await
            .unwrap();
        assert_eq!(f.memory.get(&k).await.unwrap().1, v2);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_after_max_attempts() {
        let f = fixture(RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        });
        for _ in 0..5 {
            f.faults.fail_next(OpKind::List, InjectedError::Throttled);
        }
        let err = f.store.list("").await.unwrap_err();
        assert!(matches!(err, StorageError::Throttled(_)), "{err}");
        assert_eq!(f.faults.injected_count(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_success() {
        let f = fixture(RetryPolicy::default());
        for _ in 0..4 {
            f.faults.fail_next(OpKind::Get, InjectedError::Unavailable);
        }
        f.memory
            .put(&key("k"), Bytes::from_static(b"v"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(&f.store.get(&key("k")).await.unwrap().0[..], b"v");
        assert_eq!(f.faults.injected_count(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let f = fixture(RetryPolicy::default());
        f.faults.fail_next(OpKind::Get, InjectedError::Other);
        assert!(matches!(
            f.store.get(&key("k")).await,
            Err(StorageError::Other(_))
        ));
        assert_eq!(
            f.faults.injected_count(),
            1,
            "Other is returned, not retried"
        );
        assert!(f
            .store
            .get(&key("missing"))
            .await
            .unwrap_err()
            .is_not_found());
    }

    /// Reads tokio's (paused) clock, so the retry budget sees the backoff sleeps go by.
    #[derive(Debug)]
    struct TokioClock(tokio::time::Instant);

    impl Clock for TokioClock {
        fn monotonic(&self) -> Duration {
            self.0.elapsed()
        }
        fn wall_millis(&self) -> i64 {
            0
        }
        fn sleep_until(&self, deadline: Duration) -> strata_core::Sleep {
            Box::pin(tokio::time::sleep_until(self.0 + deadline))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_when_out_of_time() {
        let memory = Arc::new(MemoryStore::new());
        let faults = Arc::new(FaultInjectingStore::new(memory, FaultConfig::none(), 5));
        faults.set_outage(true);
        let policy = RetryPolicy {
            max_attempts: 1_000,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(100),
            max_elapsed: Duration::from_secs(1),
        };
        let clock = Arc::new(TokioClock(tokio::time::Instant::now()));
        let store = RetryStore::new(faults.clone(), policy, clock, 11);
        let started = tokio::time::Instant::now();
        assert!(store.list("").await.is_err());
        assert!(started.elapsed() <= Duration::from_secs(1));
        // With waits of at most 100 ms, a 1 s budget allows at least 10 attempts.
        assert!(faults.injected_count() >= 10, "{}", faults.injected_count());
    }

    #[test]
    fn backoff_ceiling_doubles_up_to_the_cap() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            ..RetryPolicy::default()
        };
        let ceilings: Vec<_> = (1..=6)
            .map(|r| policy.backoff_ceiling(r).as_millis())
            .collect();
        assert_eq!(ceilings, [10, 20, 40, 80, 100, 100]);
        assert_eq!(policy.backoff_ceiling(200), Duration::from_millis(100));
    }

    #[tokio::test]
    async fn jitter_replays_by_seed() {
        let make = || {
            RetryStore::new(
                Arc::new(MemoryStore::new()),
                RetryPolicy::default(),
                Arc::new(ManualClock::new(0)),
                1234,
            )
        };
        let (a, b) = (make(), make());
        let waits_a: Vec<_> = (1..10).map(|r| a.backoff(r)).collect();
        let waits_b: Vec<_> = (1..10).map(|r| b.backoff(r)).collect();
        assert_eq!(waits_a, waits_b);
        assert!(waits_a
            .iter()
            .zip(1..)
            .all(|(w, r)| *w <= a.policy.backoff_ceiling(r)));
    }
}
