//! The topic catalog: names, ids, partition counts and config overrides.
//!
//! Stored as a chain of immutable versions `meta/catalog/<version>`, each written create-only.
//! Whoever writes version N+1 first wins; a loser re-reads and retries. This gives a
//! linearizable catalog on any backend with create-only puts and no coordination service,
//! which is what several brokers sharing one bucket need.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError};

use crate::config::TopicConfig;
use crate::{LogError, LogResult};

/// A topic's 16-byte id (Kafka's topic UUID). Storage keys use it, so a topic deleted and
/// re-created under the same name never sees the old topic's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TopicId(pub [u8; 16]);

impl TopicId {
    pub fn random() -> Self {
        TopicId(*uuid::Uuid::new_v4().as_bytes())
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// What the catalog knows of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    pub name: Arc<str>,
    pub id: TopicId,
    pub partitions: i32,
    /// Explicitly set configs, as given (DescribeConfigs reports them as non-default).
    pub overrides: BTreeMap<String, String>,
    /// The effective config (defaults + overrides).
    pub config: TopicConfig,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CatalogState {
    pub version: u64,
    pub topics: BTreeMap<String, TopicInfo>,
}

const PREFIX: &str = "meta/catalog/";
/// Old versions kept for debugging and so a reader racing a writer's cleanup still finds one.
const VERSIONS_KEPT: u64 = 8;

pub(crate) fn version_key(version: u64) -> LogResult<ObjectKey> {
    Ok(ObjectKey::new(format!("{PREFIX}{version:020}"))?)
}

/// The newest catalog version number, from the names alone (no read): pollers compare it with
/// what they hold and read the catalog only when it moved. None if there is none yet.
pub(crate) async fn newest_version(store: &dyn ObjectStore) -> LogResult<Option<u64>> {
    Ok(store
        .list_keys(PREFIX)
        .await?
        .iter()
        .filter_map(|listed| listed.key.as_str().strip_prefix(PREFIX)?.parse().ok())
        .max())
}

/// Reads the newest catalog version (an empty catalog if there is none yet).
pub(crate) async fn load_latest(store: &dyn ObjectStore) -> LogResult<CatalogState> {
    let listed = store.list(PREFIX).await?;
    // Newest first: a version can be listed but (in a race with cleanup) already deleted.
    for meta in listed.iter().rev() {
        match store.get(&meta.key).await {
            Ok((bytes, _)) => {
                return serde_json::from_slice(&bytes)
                    .map_err(|e| LogError::CorruptStorage(format!("catalog {}: {e}", meta.key)))
            }
            Err(StorageError::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(CatalogState::default())
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
        let body = serde_json::to_vec(&next)
            .map_err(|e| LogError::CorruptStorage(format!("encoding catalog: {e}")))?;
        match store
            .put(
                &version_key(next.version)?,
                Bytes::from(body),
                PutMode::Create,
            )
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
