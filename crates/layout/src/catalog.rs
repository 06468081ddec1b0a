//! The topic catalog: `meta/catalog/<version:020>`, a chain of immutable versions, each the
//! whole catalog, written create-only by whoever writes version N+1 first (the log; see
//! `strata-log`'s catalog for the update protocol and how many old versions are kept).
//!
//! The schema is generic over the topic config `C`: what a config means (names, defaults,
//! validation) is the log's business, where the catalog is stored is this crate's. Readers
//! that do not care about configs use [`CatalogReader`], which skips them.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use strata_storage::{ObjectStore, StorageError};

use crate::schema::{self, Schema};
use crate::{LayoutResult, TopicId};

pub const PREFIX: &str = "meta/catalog/";

pub fn version_key(version: u64) -> String {
    format!("{PREFIX}{version:020}")
}

/// The version of a listed catalog key; None for anything else.
pub fn parse_version_key(key: &str) -> Option<u64> {
    key.strip_prefix(PREFIX)?.parse().ok()
}

/// One version of the catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog<C> {
    /// The version this object is (its key's number); 0 for "no catalog yet".
    pub version: u64,
    /// By name.
    pub topics: BTreeMap<String, CatalogTopic<C>>,
}

/// What the catalog knows of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogTopic<C> {
    pub name: Arc<str>,
    pub id: TopicId,
    pub partitions: i32,
    /// The replication factor clients asked for (None: created before it was stored, or with
    /// the broker default at the time, which is read as 1). Strata keeps one copy in storage
    /// whatever this says; it decides how many brokers Metadata lists as replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i16>,
    /// Explicit replica assignments, by partition: broker ids, the first one the partition's
    /// preferred owner. Partitions created without one are absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub assignments: BTreeMap<i32, Vec<i32>>,
    /// Explicitly set configs, as given (DescribeConfigs reports them as non-default).
    pub overrides: BTreeMap<String, String>,
    /// The effective config (defaults + overrides).
    pub config: C,
}

impl<C: Serialize + DeserializeOwned> Schema for Catalog<C> {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "topic catalog";
}

pub fn encode<C: Serialize + DeserializeOwned>(catalog: &Catalog<C>) -> LayoutResult<Bytes> {
    schema::encode(catalog)
}

pub fn decode<C: Serialize + DeserializeOwned>(
    key: &str,
    bytes: &[u8],
) -> LayoutResult<Catalog<C>> {
    schema::decode(key, bytes)
}

/// What a reader that ignores configs sees of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSummary {
    pub name: Arc<str>,
    pub id: TopicId,
    pub partitions: i32,
    pub replication_factor: Option<i16>,
    pub assignments: BTreeMap<i32, Vec<i32>>,
    pub overrides: BTreeMap<String, String>,
}

/// Config-less stand-in: reads any config and keeps nothing of it. Never written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "IgnoredAny")]
struct Skipped;

impl From<IgnoredAny> for Skipped {
    fn from(_: IgnoredAny) -> Self {
        Skipped
    }
}

impl Serialize for Skipped {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

/// Reads the catalog and never writes it: for those who only need to know the topics (the
/// offline admin commands, the cluster) and must not open a log to do so (opening one
/// registers a write-ahead stream).
#[derive(Clone, Copy)]
pub struct CatalogReader<'a> {
    store: &'a dyn ObjectStore,
}

impl std::fmt::Debug for CatalogReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogReader").finish_non_exhaustive()
    }
}

impl<'a> CatalogReader<'a> {
    pub fn new(store: &'a dyn ObjectStore) -> Self {
        Self { store }
    }

    /// The newest version number, from the names alone (no read): pollers compare it with what
    /// they hold and read the catalog only when it moved. None if there is none yet.
    pub async fn newest_version(&self) -> LayoutResult<Option<u64>> {
        Ok(self
            .store
            .list_keys(PREFIX)
            .await?
            .iter()
            .filter_map(|listed| parse_version_key(listed.key.as_str()))
            .max())
    }

    /// The newest catalog with its configs as `C` (an empty catalog if there is none yet).
    pub async fn load<C: Serialize + DeserializeOwned + Default>(
        &self,
    ) -> LayoutResult<Catalog<C>> {
        let listed = self.store.list(PREFIX).await?;
        // Newest first: a version can be listed but (in a race with cleanup) already deleted.
        for meta in listed.iter().rev() {
            if parse_version_key(meta.key.as_str()).is_none() {
                continue;
            }
            match self.store.get(&meta.key).await {
                Ok((bytes, _)) => return decode(meta.key.as_str(), &bytes),
                Err(StorageError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Catalog::default())
    }

    /// Every topic of the newest catalog, by name.
    pub async fn topics(&self) -> LayoutResult<Vec<TopicSummary>> {
        let catalog: Catalog<Skipped> = self.load().await?;
        Ok(catalog
            .topics
            .into_values()
            .map(|t| TopicSummary {
                name: t.name,
                id: t.id,
                partitions: t.partitions,
                replication_factor: t.replication_factor,
                assignments: t.assignments,
                overrides: t.overrides,
            })
            .collect())
    }

    /// One topic of the newest catalog; None if it does not exist.
    pub async fn topic(&self, name: &str) -> LayoutResult<Option<TopicSummary>> {
        Ok(self.topics().await?.into_iter().find(|t| &*t.name == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_storage::{MemoryStore, ObjectKey, PutMode};

    /// A catalog version as the log wrote it before this crate existed (its config is the
    /// log's `TopicConfig`, read here as plain JSON).
    const OLD: &str = r#"{"version":2,"topics":{"orders":{"name":"orders","id":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],"partitions":3,"overrides":{"retention.ms":"1000"},"config":{"retention_ms":1000,"retention_bytes":-1,"max_message_bytes":1048588,"timestamp_type":"CreateTime"}}}}"#;

    async fn put(store: &MemoryStore, version: u64, body: &str) {
        store
            .put(
                &ObjectKey::new(version_key(version)).unwrap(),
                Bytes::from(body.to_owned()),
                PutMode::Create,
            )
            .await
            .unwrap();
    }

    #[test]
    fn keys_round_trip() {
        assert_eq!(version_key(7), "meta/catalog/00000000000000000007");
        assert_eq!(parse_version_key(&version_key(7)), Some(7));
        assert_eq!(parse_version_key("meta/streams/7"), None);
    }

    #[test]
    fn a_catalog_of_the_old_format_still_reads_with_its_config() {
        let catalog: Catalog<serde_json::Value> = decode("k", OLD.as_bytes()).unwrap();
        assert_eq!(catalog.version, 2);
        let orders = &catalog.topics["orders"];
        assert_eq!(orders.partitions, 3);
        assert_eq!(orders.replication_factor, None);
        assert!(orders.assignments.is_empty());
        assert_eq!(orders.config["retention_ms"], 1000);
        // Re-encoded, it reads back the same (with its schema number now).
        let again: Catalog<serde_json::Value> = decode("k", &encode(&catalog).unwrap()).unwrap();
        assert_eq!(again, catalog);
    }

    #[test]
    fn replication_factor_and_assignments_round_trip() {
        let mut catalog: Catalog<serde_json::Value> = decode("k", OLD.as_bytes()).unwrap();
        let orders = catalog.topics.get_mut("orders").unwrap();
        orders.replication_factor = Some(3);
        orders.assignments = BTreeMap::from([(0, vec![2, 1, 3]), (2, vec![3, 1, 2])]);
        let bytes = encode(&catalog).unwrap();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains(r#""replication_factor":3"#), "{text}");
        assert!(
            text.contains(r#""assignments":{"0":[2,1,3],"2":[3,1,2]}"#),
            "{text}"
        );
        let again: Catalog<serde_json::Value> = decode("k", &bytes).unwrap();
        assert_eq!(again, catalog);
    }

    #[tokio::test]
    async fn the_reader_lists_the_newest_version_and_skips_configs() {
        let store = MemoryStore::new();
        let reader = CatalogReader::new(&store);
        assert_eq!(reader.newest_version().await.unwrap(), None);
        assert!(reader.topics().await.unwrap().is_empty());
        put(&store, 1, r#"{"version":1,"topics":{}}"#).await;
        put(&store, 2, OLD).await;
        assert_eq!(reader.newest_version().await.unwrap(), Some(2));
        let orders = reader.topic("orders").await.unwrap().unwrap();
        assert_eq!(
            (orders.id, orders.partitions),
            (
                TopicId([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]),
                3
            )
        );
        assert_eq!(reader.topic("nope").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_catalog_of_a_newer_schema_is_refused_not_misread() {
        let store = MemoryStore::new();
        put(&store, 1, r#"{"schema":2,"version":1,"topics":{}}"#).await;
        assert!(matches!(
            CatalogReader::new(&store).topics().await,
            Err(crate::LayoutError::UnsupportedSchema { found: 2, .. })
        ));
    }
}
