//! A deadline on every request, so a hung storage call turns into an error the retry layer and
//! the broker can act on instead of a stuck produce.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use strata_core::Clock;

use crate::{
    ListedKey, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageError, StorageResult, Version,
};

const MIB: u64 = 1 << 20;

/// Fails any request that takes longer than its deadline with [`StorageError::Timeout`].
///
/// The deadline is `request_timeout`, plus `per_mib` for every MiB the request is known to move
/// (put payloads and ranged reads), so a large segment upload is not held to the deadline of a
/// manifest read. Whole-object gets have unknown size; `request_timeout` must cover them.
///
/// A timed-out request is abandoned, not undone: a put may still land (which is why `Timeout`
/// is ambiguous), and a local-directory request keeps its blocking thread until it finishes.
#[derive(Debug)]
pub struct TimeoutStore {
    inner: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    request_timeout: Duration,
    per_mib: Duration,
}

impl TimeoutStore {
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        request_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner,
            clock,
            request_timeout,
            per_mib: Duration::ZERO,
        }
    }

    /// Extra time allowed per MiB transferred.
    pub fn with_transfer_allowance(mut self, per_mib: Duration) -> Self {
        self.per_mib = per_mib;
        self
    }

    fn deadline_for(&self, bytes: u64) -> Duration {
        let mibs = u32::try_from(bytes.div_ceil(MIB)).unwrap_or(u32::MAX);
        self.request_timeout
            .saturating_add(self.per_mib.saturating_mul(mibs))
    }

    async fn within<T>(
        &self,
        deadline: Duration,
        request: impl Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        strata_core::timeout(self.clock.as_ref(), deadline, request)
            .await
            .unwrap_or(Err(StorageError::Timeout(deadline)))
    }
}

#[async_trait]
impl ObjectStore for TimeoutStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let deadline = self.deadline_for(data.len() as u64);
        self.within(deadline, self.inner.put(key, data, mode)).await
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        self.within(self.request_timeout, self.inner.get(key)).await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        let deadline = self.deadline_for(range.end.saturating_sub(range.start));
        self.within(deadline, self.inner.get_range(key, range))
            .await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        self.within(self.request_timeout, self.inner.list(prefix))
            .await
    }

    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        self.within(self.request_timeout, self.inner.list_keys(prefix))
            .await
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.within(self.request_timeout, self.inner.delete(key))
            .await
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fault, FaultConfig, FaultInjectingStore, MemoryStore, OpKind};

    #[tokio::test(start_paused = true)]
    async fn slow_request_times_out_and_fast_one_does_not() {
        let faults = Arc::new(FaultInjectingStore::new(
            Arc::new(MemoryStore::new()),
            FaultConfig::none(),
            1,
        ));
        let store = TimeoutStore::new(
            faults.clone(),
            Duration::from_millis(500),
            strata_core::SystemClock::shared(),
        );
        faults.inject_next(OpKind::List, Fault::Delay(Duration::from_secs(10)));
        let started = tokio::time::Instant::now();
        let err = store.list("").await.unwrap_err();
        assert!(
            matches!(err, StorageError::Timeout(d) if d == Duration::from_millis(500)),
            "{err}"
        );
        assert!(err.is_ambiguous());
        assert_eq!(started.elapsed(), Duration::from_millis(500));

        faults.inject_next(OpKind::List, Fault::Delay(Duration::from_millis(100)));
        assert!(store.list("").await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn large_transfers_get_more_time() {
        let faults = Arc::new(FaultInjectingStore::new(
            Arc::new(MemoryStore::new()),
            FaultConfig::none(),
            1,
        ));
        let store = TimeoutStore::new(
            faults.clone(),
            Duration::from_millis(500),
            strata_core::SystemClock::shared(),
        )
        .with_transfer_allowance(Duration::from_millis(100));
        assert_eq!(store.deadline_for(0), Duration::from_millis(500));
        assert_eq!(store.deadline_for(1), Duration::from_millis(600));
        assert_eq!(store.deadline_for(8 * MIB), Duration::from_millis(1300));
        // 8 MiB and 1.2 s: fine with the allowance.
        faults.inject_next(OpKind::PutCreate, Fault::Delay(Duration::from_millis(1200)));
        let key = ObjectKey::new("big").unwrap();
        store
            .put(&key, Bytes::from(vec![0u8; 8 << 20]), PutMode::Create)
            .await
            .unwrap();
    }
}
