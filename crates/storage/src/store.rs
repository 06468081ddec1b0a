use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ObjectKey, StorageResult};

/// An opaque object version: a generation counter, an ETag or a RADOS object version.
/// Only equality means anything; it is handed back to [`PutMode::Update`] for compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(pub String);

/// How a put may treat an existing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// Succeed only if no object exists at the key (`AlreadyExists` otherwise).
    Create,
    /// Succeed only if the object exists with exactly this version (`Precondition` otherwise).
    Update(Version),
}

/// A token that changes whenever an object is rewritten (or deleted and created again), reported
/// by a listing at no extra request. Two listings of one key giving equal tags saw the same write
/// of it, so a reader that cached what it decoded from that write may skip reading it again.
///
/// Not a [`Version`], on purpose: it only detects change and is never handed to a
/// compare-and-swap. A backend may spell it differently from the version `get` returns (an S3
/// listing's ETag need not be quoted like a GET's), and a caller that wants to write must still
/// read the object (and its version) first. Where a backend's listing knows nothing of versions
/// it is absent (`None` in [`ObjectMeta::tag`]): "unknown, read the object to know".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChangeTag(pub String);

/// What a listing says about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: ObjectKey,
    pub size: u64,
    /// The object's change tag as of the listing; None when the backend cannot tell cheaply.
    pub tag: Option<ChangeTag>,
}

/// What [`ObjectStore::list_keys`] says about one object: its key and change tag, no size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedKey {
    pub key: ObjectKey,
    pub tag: Option<ChangeTag>,
}

impl From<ObjectMeta> for ListedKey {
    fn from(meta: ObjectMeta) -> Self {
        Self {
            key: meta.key,
            tag: meta.tag,
        }
    }
}

/// The storage contract. Every operation is atomic for one object: readers see the whole old
/// object or the whole new one, never a mix, and a put that returned `Ok` is durable.
#[async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug + 'static {
    /// Writes a whole object, conditionally. Returns the new version.
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version>;

    /// Reads a whole object and its version.
    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)>;

    /// Reads `range` of an object. A range running past the end is cut at the end; a range that
    /// starts past the end is `Invalid`.
    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes>;

    /// Lists objects whose key starts with `prefix`, sorted by key, each with its size and (where
    /// the backend has one) its [`ChangeTag`].
    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>>;

    /// [`list`](Self::list) without sizes, for pollers that only want to know what exists and
    /// what changed. The same objects, order and tags; a backend whose sizes cost a request per
    /// object (RADOS: a stat each) answers it with the name listing alone. Wrappers must
    /// forward it, or their callers silently pay for the sizes again.
    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        Ok(self
            .list(prefix)
            .await?
            .into_iter()
            .map(ListedKey::from)
            .collect())
    }

    /// Deletes an object. Deleting a missing object is not an error (deletes are idempotent so a
    /// retried collector never fails).
    async fn delete(&self, key: &ObjectKey) -> StorageResult<()>;

    /// A short name for logs and metrics ("memory", "file", "s3", "rados").
    fn backend_name(&self) -> &'static str;
}
