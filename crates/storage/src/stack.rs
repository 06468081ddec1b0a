//! The usual composition of the wrappers around a backend, in the one order that makes sense.

use std::sync::Arc;
use std::time::Duration;

use strata_core::Clock;

use crate::{
    ConcurrencyLimitStore, MetricsStore, ObjectStore, RetryPolicy, RetryStore, StorageHealth,
    StorageMetrics, TimeoutStore,
};

/// Settings for [`StorageStack::build`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackConfig {
    pub retry: RetryPolicy,
    /// Deadline of one attempt (see [`TimeoutStore`]).
    pub request_timeout: Duration,
    /// Extra deadline per MiB moved.
    pub timeout_per_mib: Duration,
    /// Requests in flight to the backend at most (see [`ConcurrencyLimitStore`]).
    pub max_in_flight: usize,
    /// Seeds the retry jitter.
    pub seed: u64,
}

impl Default for StackConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(10),
            timeout_per_mib: Duration::from_millis(200),
            max_in_flight: 256,
            seed: 0,
        }
    }
}

/// A backend wrapped as `retry → limit → metrics → timeout → backend`:
///
/// - retry outermost, so each attempt gets a fresh deadline and waits out its backoff without
///   holding a concurrency permit;
/// - the limit next, so time spent queueing for a permit is not charged to a deadline;
/// - metrics over the timeout, so a timed-out attempt is counted as the failed request it is, and
///   under retry, so every physical request is counted (object stores bill per request).
#[derive(Debug, Clone)]
pub struct StorageStack {
    pub store: Arc<dyn ObjectStore>,
    pub metrics: Arc<StorageMetrics>,
    pub health: Arc<StorageHealth>,
}

impl StorageStack {
    pub fn build(
        backend: Arc<dyn ObjectStore>,
        config: &StackConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let timed: Arc<dyn ObjectStore> = Arc::new(
            TimeoutStore::new(backend, config.request_timeout, Arc::clone(&clock))
                .with_transfer_allowance(config.timeout_per_mib),
        );
        let metered = MetricsStore::new(timed, Arc::clone(&clock));
        let metrics = Arc::clone(metered.metrics());
        let health = Arc::clone(metered.health());
        let limited = Arc::new(ConcurrencyLimitStore::new(
            Arc::new(metered),
            config.max_in_flight,
        ));
        let store = Arc::new(RetryStore::new(
            limited,
            config.retry.clone(),
            clock,
            config.seed,
        ));
        Self {
            store,
            metrics,
            health,
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::{FaultConfig, FaultInjectingStore, InjectedError, MemoryStore, OpKind};

    #[tokio::test(start_paused = true)]
    async fn stack_passes_conformance_and_counts_physical_requests() {
        let faults = Arc::new(FaultInjectingStore::new(
            Arc::new(MemoryStore::new()),
            FaultConfig::none(),
            1,
        ));
        let stack = StorageStack::build(
            faults.clone(),
            &StackConfig::default(),
            strata_core::SystemClock::shared(),
        );
        crate::conformance::run_all(Arc::clone(&stack.store), "stack").await;

        let before = stack.metrics.snapshot().op(OpKind::List).requests;
        faults.fail_next(OpKind::List, InjectedError::Throttled);
        stack.store.list("stack/").await.unwrap();
        let snap = stack.metrics.snapshot();
        assert_eq!(
            snap.op(OpKind::List).requests - before,
            2,
            "the retry is counted"
        );
        assert_eq!(stack.health.snapshot().consecutive_failures, 0);

        // Every wrapper (retry, limit, metrics, timeout, faults) hands the backend's change tags
        // through untouched: pollers depend on them to skip unchanged objects.
        let key = crate::ObjectKey::new("stack/tagged").unwrap();
        stack
            .store
            .put(
                &key,
                bytes::Bytes::from_static(b"x"),
                crate::PutMode::Create,
            )
            .await
            .unwrap();
        let listed = stack.store.list("stack/").await.unwrap();
        let direct = faults.list("stack/").await.unwrap();
        assert!(listed[0].tag.is_some());
        assert_eq!(listed, direct);
        stack.store.delete(&key).await.unwrap();
    }

    /// A backend whose sized listing is refused: `list_keys` through the whole stack must
    /// reach the backend's own `list_keys`, never fall back to `list` (what a wrapper that
    /// forgot to forward it would do, making RADOS pollers pay a stat per object again).
    #[derive(Debug)]
    struct KeysOnly(MemoryStore);

    #[async_trait::async_trait]
    impl ObjectStore for KeysOnly {
        async fn put(
            &self,
            key: &crate::ObjectKey,
            data: bytes::Bytes,
            mode: crate::PutMode,
        ) -> crate::StorageResult<crate::Version> {
            self.0.put(key, data, mode).await
        }
        async fn get(
            &self,
            key: &crate::ObjectKey,
        ) -> crate::StorageResult<(bytes::Bytes, crate::Version)> {
            self.0.get(key).await
        }
        async fn get_range(
            &self,
            key: &crate::ObjectKey,
            range: std::ops::Range<u64>,
        ) -> crate::StorageResult<bytes::Bytes> {
            self.0.get_range(key, range).await
        }
        async fn list(&self, _: &str) -> crate::StorageResult<Vec<crate::ObjectMeta>> {
            Err(crate::StorageError::Invalid("sized listing refused".into()))
        }
        async fn list_keys(&self, prefix: &str) -> crate::StorageResult<Vec<crate::ListedKey>> {
            self.0.list_keys(prefix).await
        }
        async fn delete(&self, key: &crate::ObjectKey) -> crate::StorageResult<()> {
            self.0.delete(key).await
        }
        fn backend_name(&self) -> &'static str {
            "keys-only"
        }
    }

    #[tokio::test]
    async fn every_wrapper_forwards_list_keys() {
        let faults = Arc::new(FaultInjectingStore::new(
            Arc::new(KeysOnly(MemoryStore::new())),
            FaultConfig::none(),
            1,
        ));
        let stack = StorageStack::build(
            faults,
            &StackConfig::default(),
            strata_core::SystemClock::shared(),
        );
        let key = crate::ObjectKey::new("k/one").unwrap();
        stack
            .store
            .put(
                &key,
                bytes::Bytes::from_static(b"x"),
                crate::PutMode::Create,
            )
            .await
            .unwrap();
        let listed = stack.store.list_keys("k/").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key, key);
        assert!(stack.store.list("k/").await.is_err());
        assert_eq!(stack.metrics.snapshot().op(OpKind::List).requests, 2);
    }
}
