//! One pass-through test store for the log tests that must act at a chosen write: hold it,
//! run something just before it, or fail everything after it. Each test says only what it
//! does to writes ([`Intercept`]); reads always go straight through, since they change nothing.

use std::sync::Arc;

use bytes::Bytes;
use strata_storage::{ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageResult, Version};

/// What a test does around the writes of an [`Intercepted`] store.
#[async_trait::async_trait]
pub(super) trait Intercept: Send + Sync + std::fmt::Debug + 'static {
    /// Before a put reaches the inner store; an error fails the put without applying it.
    async fn before_put(&self, _key: &ObjectKey, _mode: &PutMode) -> StorageResult<()> {
        Ok(())
    }

    /// After the inner store answered a put (whatever it answered).
    fn after_put(&self, _key: &ObjectKey, _mode: &PutMode) {}

    /// Before a delete reaches the inner store; an error fails it without applying it.
    async fn before_delete(&self, _key: &ObjectKey) -> StorageResult<()> {
        Ok(())
    }
}

/// `inner` with `hooks` around its writes.
#[derive(Debug)]
pub(super) struct Intercepted<I> {
    pub(super) inner: Arc<dyn ObjectStore>,
    pub(super) hooks: I,
}

impl<I: Intercept> Intercepted<I> {
    pub(super) fn new(inner: Arc<dyn ObjectStore>, hooks: I) -> Arc<Self> {
        Arc::new(Self { inner, hooks })
    }
}

/// Whether `key` and `mode` are a compare-and-swap of a partition manifest (a claim or a
/// maintenance pass committing).
pub(super) fn is_manifest_update(key: &ObjectKey, mode: &PutMode) -> bool {
    key.as_str().ends_with("/manifest") && matches!(mode, PutMode::Update(_))
}

#[async_trait::async_trait]
impl<I: Intercept> ObjectStore for Intercepted<I> {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        self.hooks.before_put(key, &mode).await?;
        let result = self.inner.put(key, data, mode.clone()).await;
        self.hooks.after_put(key, &mode);
        result
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        self.inner.get(key).await
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        range: std::ops::Range<u64>,
    ) -> StorageResult<Bytes> {
        self.inner.get_range(key, range).await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.hooks.before_delete(key).await?;
        self.inner.delete(key).await
    }

    fn backend_name(&self) -> &'static str {
        "intercepted"
    }
}
