//! The topic catalog: names, ids, partition counts and config overrides.
//!
//! Stored as a chain of immutable versions (`strata_layout::catalog`), each written create-only.
//! Whoever writes version N+1 first wins; a loser re-reads and retries. This gives a
//! linearizable catalog on any backend with create-only puts and no coordination service,
//! which is what several brokers sharing one bucket need.

use bytes::Bytes;
use strata_layout::catalog::{self as layout, Catalog, CatalogReader, CatalogTopic};
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError};

use crate::config::TopicConfig;
use crate::{LogError, LogResult};

pub use strata_layout::TopicId;

/// What the catalog knows of one topic (its schema is the layout's, its config ours).
pub type TopicInfo = CatalogTopic<TopicConfig>;

pub(crate) type CatalogState = Catalog<TopicConfig>;

/// Old versions kept for debugging and so a reader racing a writer's cleanup still finds one.
const VERSIONS_KEPT: u64 = 8;

pub(crate) fn version_key(version: u64) -> LogResult<ObjectKey> {
    Ok(ObjectKey::new(layout::version_key(version))?)
}

/// The newest catalog version number, from the names alone (no read): pollers compare it with
/// what they hold and read the catalog only when it moved. None if there is none yet.
pub(crate) async fn newest_version(store: &dyn ObjectStore) -> LogResult<Option<u64>> {
    Ok(CatalogReader::new(store).newest_version().await?)
}

/// Reads the newest catalog version (an empty catalog if there is none yet).
pub(crate) async fn load_latest(store: &dyn ObjectStore) -> LogResult<CatalogState> {
    Ok(CatalogReader::new(store).load().await?)
}

/// Applies `change` to the newest catalog and writes it as the next version, retrying on a
/// lost race. `change` may refuse (returning an error) after seeing the latest state.
pub(crate) async fn update<F, T>(
    store: &dyn ObjectStore,
    mut current: CatalogState,
    mut change: F,
) -> LogResult<(CatalogState, T)>
where
    F: FnMut(&mut CatalogState) -> LogResult<T>,
{
    loop {
        let mut next = current.clone();
        let out = change(&mut next)?;
        next.version = current.version + 1;
        let body: Bytes = layout::encode(&next)?;
        match store
            .put(&version_key(next.version)?, body, PutMode::Create)
            .await
        {
            Ok(_) => {
                if next.version > VERSIONS_KEPT {
                    // Best effort: an old version left behind costs a few bytes, nothing more.
                    if let Ok(old) = version_key(next.version - VERSIONS_KEPT) {
                        let _ = store.delete(&old).await;
                    }
                }
                return Ok((next, out));
            }
            Err(StorageError::AlreadyExists(_)) => {
                current = load_latest(store).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Kafka's topic-name rules: 1–249 chars of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> LogResult<()> {
    if name.is_empty() || name.len() > 249 {
        return Err(LogError::InvalidTopic(format!(
            "topic name must be 1 to 249 characters, got {}",
            name.len()
        )));
    }
    if name == "." || name == ".." {
        return Err(LogError::InvalidTopic(format!(
            "topic name {name:?} is reserved"
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(LogError::InvalidTopic(format!(
            "topic name {name:?} may only contain ASCII letters, digits, '.', '_' and '-'"
        )));
    }
    Ok(())
}
