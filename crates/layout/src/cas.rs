//! The two storage steps every store of cluster-wide settings repeats: a read-modify-write of
//! one stored object by compare-and-swap, and the change marker that tells every broker to
//! read again. SCRAM users, ACLs, client quotas and placement overrides all follow them, so
//! the reasoning about races lives here once.
//!
//! Neither involves a partition owner or an epoch: these objects are not partition data, any
//! broker may write them, and a conflict only means another broker changed the same object
//! first (docs/ARCHITECTURE.md, the fencing table).

use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError, Version};

use crate::cluster::ChangesMarker;
use crate::schema::{self, Schema};
use crate::LayoutResult;

/// Applies `change` to the object at `key` and writes it back only if nobody wrote it since
/// it was read (a missing object starts as `fresh()` and is created only if still missing).
/// `change` returns whether it changed anything — an unchanged object is not written — and a
/// result for the caller; it runs again on the newer object after each lost race, so it must
/// be a pure function of the object. `Ok(None)`: every one of `attempts` tries lost a race.
pub async fn update<T, R, E>(
    store: &dyn ObjectStore,
    key: &ObjectKey,
    attempts: usize,
    fresh: impl Fn() -> T,
    mut change: impl FnMut(&mut T) -> Result<(bool, R), E>,
) -> Result<Option<R>, E>
where
    T: Schema,
    E: From<crate::LayoutError>,
{
    for _ in 0..attempts {
        let (mut object, mode) = match store.get(key).await {
            Ok((bytes, version)) => (
                schema::decode::<T>(key.as_str(), &bytes)?,
                PutMode::Update(version),
            ),
            Err(StorageError::NotFound(_)) => (fresh(), PutMode::Create),
            Err(e) => return Err(crate::LayoutError::from(e).into()),
        };
        let (changed, result) = change(&mut object)?;
        if !changed {
            return Ok(Some(result));
        }
        match store.put(key, schema::encode(&object)?, mode).await {
            Ok(_) => return Ok(Some(result)),
            Err(StorageError::Precondition(_) | StorageError::AlreadyExists(_)) => continue,
            Err(e) => return Err(crate::LayoutError::from(e).into()),
        }
    }
    Ok(None)
}

/// Rewrites the change marker at `key` with its counter raised by one (a counter, not a
/// constant, so that a backend whose version is a hash of the bytes sees a new version).
///
/// One try is enough: a writer that loses the race to another read the marker after its own
/// change was stored, so the winner's rewrite comes after that change too, and every poller
/// that sees the new version and reads again finds both changes. An unreadable marker is
/// simply replaced: only its version means anything.
pub async fn bump_marker(store: &dyn ObjectStore, key: &ObjectKey) -> LayoutResult<()> {
    let (mode, changes) = match store.get(key).await {
        Ok((bytes, version)) => {
            let seen = schema::decode::<ChangesMarker>(key.as_str(), &bytes)
                .unwrap_or_default()
                .changes;
            (PutMode::Update(version), seen.wrapping_add(1))
        }
        Err(StorageError::NotFound(_)) => (PutMode::Create, 1),
        Err(e) => return Err(e.into()),
    };
    let body = schema::encode(&ChangesMarker { changes })?;
    match store.put(key, body, mode).await {
        Ok(_) | Err(StorageError::AlreadyExists(_) | StorageError::Precondition(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The version of the change marker at `key`; None while nothing was ever changed. Pollers
/// compare it with the version they last saw: one small read while nothing changes.
pub async fn marker_version(
    store: &dyn ObjectStore,
    key: &ObjectKey,
) -> LayoutResult<Option<Version>> {
    match store.get(key).await {
        Ok((_, version)) => Ok(Some(version)),
        Err(StorageError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde::{Deserialize, Serialize};
    use strata_storage::MemoryStore;

    use super::*;
    use crate::LayoutError;

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    struct Tally {
        names: Vec<String>,
    }

    impl Schema for Tally {
        const SCHEMA: u32 = 1;
        const WHAT: &'static str = "tally";
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(name).unwrap()
    }

    async fn add(store: &dyn ObjectStore, name: &str) -> Result<Option<bool>, LayoutError> {
        update(store, &key("tally"), 8, Tally::default, |t: &mut Tally| {
            let new = !t.names.iter().any(|n| n == name);
            if new {
                t.names.push(name.to_string());
            }
            Ok::<_, LayoutError>((new, new))
        })
        .await
    }

    #[tokio::test]
    async fn concurrent_updates_all_land_and_an_unchanged_object_is_not_rewritten() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let adds: Vec<_> = (0..6)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { add(store.as_ref(), &format!("n{i}")).await })
            })
            .collect();
        for add in adds {
            assert_eq!(add.await.unwrap().unwrap(), Some(true));
        }
        let (bytes, version) = store.get(&key("tally")).await.unwrap();
        let mut names = schema::decode::<Tally>("tally", &bytes).unwrap().names;
        names.sort();
        assert_eq!(names, ["n0", "n1", "n2", "n3", "n4", "n5"]);

        assert_eq!(add(store.as_ref(), "n3").await.unwrap(), Some(false));
        let (_, after) = store.get(&key("tally")).await.unwrap();
        assert_eq!(after, version, "a change that changed nothing was written");
    }

    #[tokio::test]
    async fn a_failing_change_writes_nothing() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let refused: Result<Option<()>, LayoutError> = update(
            store.as_ref(),
            &key("fresh"),
            8,
            Tally::default,
            |_: &mut Tally| {
                Err(LayoutError::Corrupt {
                    key: "fresh".into(),
                    reason: "refused".into(),
                })
            },
        )
        .await;
        assert!(refused.is_err());
        assert!(matches!(
            store.get(&key("fresh")).await,
            Err(StorageError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn every_bump_changes_the_marker_version() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let marker = key("changes");
        assert_eq!(marker_version(store.as_ref(), &marker).await.unwrap(), None);
        let mut seen = Vec::new();
        for _ in 0..3 {
            bump_marker(store.as_ref(), &marker).await.unwrap();
            let version = marker_version(store.as_ref(), &marker).await.unwrap();
            assert!(version.is_some() && !seen.contains(&version));
            seen.push(version);
        }
        // An unreadable marker is replaced, not an error.
        let (_, version) = store.get(&marker).await.unwrap();
        store
            .put(
                &marker,
                bytes::Bytes::from_static(b"garbage"),
                PutMode::Update(version),
            )
            .await
            .unwrap();
        bump_marker(store.as_ref(), &marker).await.unwrap();
        let (bytes, _) = store.get(&marker).await.unwrap();
        assert_eq!(
            schema::decode::<ChangesMarker>("changes", &bytes).unwrap(),
            ChangesMarker { changes: 1 }
        );
    }
}
