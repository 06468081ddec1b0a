//! The in-process backend: for tests, simulations and benchmarks of the broker alone.

use std::collections::BTreeMap;
use std::ops::{Bound, Range};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;

use crate::{
    ChangeTag, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageError, StorageResult, Version,
};

/// An object store held in memory. Every operation takes one mutex, so each is trivially atomic
/// and compare-and-swap is exact.
///
/// Versions are generation numbers drawn from one store-wide counter rather than restarting at 1
/// per key: the generations of one key still only grow, and a key that is deleted and created again
/// can never hand back a version that a stale writer still holds (no ABA on delete + recreate).
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    objects: BTreeMap<ObjectKey, StoredObject>,
    last_generation: u64,
}

#[derive(Debug)]
struct StoredObject {
    data: Bytes,
    generation: u64,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many objects the store holds (for tests and simulation invariants).
    pub fn object_count(&self) -> usize {
        self.lock().objects.len()
    }

    /// Total payload bytes held.
    pub fn total_bytes(&self) -> u64 {
        self.lock()
            .objects
            .values()
            .map(|o| o.data.len() as u64)
            .sum()
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        // A panic while holding the lock cannot leave the map half-updated (every mutation is a
        // single insert or remove), so a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn version_of(generation: u64) -> Version {
    Version(generation.to_string())
}

#[async_trait]
impl ObjectStore for MemoryStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let mut state = self.lock();
        match (&mode, state.objects.get(key)) {
            (PutMode::Create, Some(_)) => return Err(StorageError::AlreadyExists(key.clone())),
            (PutMode::Update(_), None) => return Err(StorageError::Precondition(key.clone())),
            (PutMode::Update(expected), Some(current))
                if *expected != version_of(current.generation) =>
            {
                return Err(StorageError::Precondition(key.clone()))
            }
            _ => {}
        }
        state.last_generation += 1;
        let generation = state.last_generation;
        state
            .objects
            .insert(key.clone(), StoredObject { data, generation });
        Ok(version_of(generation))
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        let state = self.lock();
        let object = state
            .objects
            .get(key)
            .ok_or_else(|| StorageError::NotFound(key.clone()))?;
        Ok((object.data.clone(), version_of(object.generation)))
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        let data = {
            let state = self.lock();
            state
                .objects
                .get(key)
                .ok_or_else(|| StorageError::NotFound(key.clone()))?
                .data
                .clone()
        };
        let (start, end) = clamp_range(key, &range, data.len() as u64)?;
        Ok(data.slice(start..end))
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let state = self.lock();
        // Keys sort as strings, so every key with the prefix sits in one contiguous run that
        // starts at the prefix itself.
        Ok(state
            .objects
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(key, _)| key.as_str().starts_with(prefix))
            .map(|(key, object)| ObjectMeta {
                key: key.clone(),
                size: object.data.len() as u64,
                // The generation is the version: store-wide, so it never repeats for a key.
                tag: Some(ChangeTag(object.generation.to_string())),
            })
            .collect())
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.lock().objects.remove(key);
        Ok(())
    }

    fn backend_name(&self) -> &'static str {
        "memory"
    }
}

/// Applies the contract's range rules to an object of `len` bytes: a range running past the end is
/// cut at the end, one starting past the end (or reversed) is `Invalid`. Returns in-memory offsets.
pub(crate) fn clamp_range(
    key: &ObjectKey,
    range: &Range<u64>,
    len: u64,
) -> StorageResult<(usize, usize)> {
    if range.start > range.end {
        return Err(StorageError::Invalid(format!(
            "reversed range {range:?} for {key}"
        )));
    }
    if range.start > len {
        return Err(StorageError::Invalid(format!(
            "range {range:?} starts past the end of {key} ({len} bytes)"
        )));
    }
    let end = range.end.min(len);
    let to_usize = |offset: u64| {
        usize::try_from(offset)
            .map_err(|_| StorageError::Invalid(format!("range {range:?} does not fit in memory")))
    };
    Ok((to_usize(range.start)?, to_usize(end)?))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_store_passes_conformance() {
        crate::conformance::run_all(Arc::new(MemoryStore::new()), "conformance").await;
    }

    #[tokio::test]
    async fn recreated_key_never_reuses_a_stale_version() {
        let store = MemoryStore::new();
        let key = ObjectKey::new("owners/t/0").unwrap();
        let stale = store
            .put(&key, Bytes::from_static(b"a"), PutMode::Create)
            .await
            .unwrap();
        store.delete(&key).await.unwrap();
        store
            .put(&key, Bytes::from_static(b"b"), PutMode::Create)
            .await
            .unwrap();
        let err = store
            .put(&key, Bytes::from_static(b"c"), PutMode::Update(stale))
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Precondition(_)), "{err}");
    }
}
