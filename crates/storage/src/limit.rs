//! A cap on requests in flight to the storage, so a burst (a catch-up reader, a compaction, many
//! partitions flushing at once) queues in the broker instead of piling onto the storage, where it
//! would only come back as throttling and timeouts.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::{
    ListedKey, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageError, StorageResult, Version,
};

/// Lets at most `max_in_flight` requests into the inner store at once; the rest wait their turn
/// (tokio's semaphore is fair: first come, first served).
///
/// Put it under the retry layer, so a request waiting out its backoff holds no permit, and over
/// the timeout, so waiting for a permit does not count against a request's deadline.
#[derive(Debug)]
pub struct ConcurrencyLimitStore {
    inner: Arc<dyn ObjectStore>,
    permits: Semaphore,
    max_in_flight: usize,
}

impl ConcurrencyLimitStore {
    /// `max_in_flight` is raised to 1 if zero (a limit of zero would deadlock every caller).
    pub fn new(inner: Arc<dyn ObjectStore>, max_in_flight: usize) -> Self {
        let max_in_flight = max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner,
            permits: Semaphore::new(max_in_flight),
            max_in_flight,
        }
    }

    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Requests currently inside the inner store.
    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }

    async fn permit(&self) -> StorageResult<SemaphorePermit<'_>> {
        // The semaphore is never closed, so this cannot fail; map it anyway rather than panic.
        self.permits
            .acquire()
            .await
            .map_err(|_| StorageError::Unavailable("storage concurrency limiter closed".into()))
    }
}

#[async_trait]
impl ObjectStore for ConcurrencyLimitStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let _permit = self.permit().await?;
        self.inner.put(key, data, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        let _permit = self.permit().await?;
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        let _permit = self.permit().await?;
        self.inner.get_range(key, range).await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let _permit = self.permit().await?;
        self.inner.list(prefix).await
    }

    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        let _permit = self.permit().await?;
        self.inner.list_keys(prefix).await
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        let _permit = self.permit().await?;
        self.inner.delete(key).await
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::MemoryStore;

    /// Records the largest number of requests it ever had in flight.
    #[derive(Debug, Default)]
    struct Gauge {
        inner: MemoryStore,
        now: AtomicUsize,
        peak: AtomicUsize,
    }

    #[async_trait]
    impl ObjectStore for Gauge {
        async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            let result = self.inner.put(key, data, mode).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            result
        }
        async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
            self.inner.get(key).await
        }
        async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
            self.inner.get_range(key, range).await
        }
        async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
            self.inner.list(prefix).await
        }
        async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
            self.inner.delete(key).await
        }
        fn backend_name(&self) -> &'static str {
            "gauge"
        }
    }

    #[tokio::test(start_paused = true)]
    async fn never_more_than_the_limit_in_flight() {
        let gauge = Arc::new(Gauge::default());
        let store = Arc::new(ConcurrencyLimitStore::new(gauge.clone(), 3));
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let key = ObjectKey::new(format!("k{i}")).unwrap();
                    store.put(&key, Bytes::new(), PutMode::Create).await
                })
            })
            .collect();
        for task in futures::future::join_all(tasks).await {
            task.unwrap().unwrap();
        }
        assert_eq!(gauge.peak.load(Ordering::SeqCst), 3);
        assert_eq!(store.in_flight(), 0);
    }

    #[test]
    fn zero_limit_is_raised_to_one() {
        let store = ConcurrencyLimitStore::new(Arc::new(MemoryStore::new()), 0);
        assert_eq!(store.max_in_flight(), 1);
    }
}
