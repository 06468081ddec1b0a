//! A store that holds one listing open, for the tests of the watched snapshots (ACLs, client
//! quotas, group configs): each has a poller that lists what storage holds and installs it,
//! and a change path that writes, then installs its own reload. These tests stop a poller
//! between its listing and its install while a change lands, then let it go.

use std::ops::Range;
use std::sync::Mutex;

use bytes::Bytes;
use strata_storage::{
    MemoryStore, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageResult, Version,
};
use tokio::sync::oneshot;

/// A memory store whose next listing under `prefix`, once [`armed`](Self::arm), has listed
/// and then waits; and whose next write of `marker` is announced once written.
#[derive(Debug)]
pub(crate) struct HeldListing {
    inner: MemoryStore,
    prefix: String,
    marker: String,
    armed: Mutex<Option<Armed>>,
}

#[derive(Debug)]
struct Armed {
    holding: Option<oneshot::Sender<()>>,
    release: Option<oneshot::Receiver<()>>,
    written: Option<oneshot::Sender<()>>,
}

/// The test's side of one armed hold.
pub(crate) struct Hold {
    /// Fires when a listing has listed and is held.
    pub holding: oneshot::Receiver<()>,
    /// Fires when the marker has been written.
    pub written: oneshot::Receiver<()>,
    /// Send to let the held listing return what it listed.
    pub release: oneshot::Sender<()>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl HeldListing {
    pub(crate) fn new(prefix: &str, marker: &str) -> Self {
        Self {
            inner: MemoryStore::new(),
            prefix: prefix.to_string(),
            marker: marker.to_string(),
            armed: Mutex::new(None),
        }
    }

    /// Holds the next listing under the prefix, and announces the next write of the marker.
    pub(crate) fn arm(&self) -> Hold {
        let (holding_tx, holding) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        let (written_tx, written) = oneshot::channel();
        *locked(&self.armed) = Some(Armed {
            holding: Some(holding_tx),
            release: Some(release_rx),
            written: Some(written_tx),
        });
        Hold {
            holding,
            written,
            release,
        }
    }
}

#[async_trait::async_trait]
impl ObjectStore for HeldListing {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let version = self.inner.put(key, data, mode).await?;
        if key.as_str() == self.marker {
            let written = locked(&self.armed).as_mut().and_then(|a| a.written.take());
            if let Some(written) = written {
                let _ = written.send(());
            }
        }
        Ok(version)
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        self.inner.get_range(key, range).await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let listed = self.inner.list(prefix).await?;
        if prefix.starts_with(&self.prefix) {
            let held = locked(&self.armed).as_mut().and_then(|a| {
                let release = a.release.take()?;
                Some((a.holding.take(), release))
            });
            if let Some((holding, release)) = held {
                if let Some(holding) = holding {
                    let _ = holding.send(());
                }
                let _ = release.await;
            }
        }
        Ok(listed)
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.inner.delete(key).await
    }

    fn backend_name(&self) -> &'static str {
        "held-listing"
    }
}
