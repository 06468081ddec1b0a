//! Two stores behind one: a write-ahead tier that acknowledgements wait for, and a bulk tier for
//! large, old, rarely rewritten objects. Which key lives where is the layout's business (this
//! crate knows no key names), so the router is handed two functions by whoever knows it.
//!
//! Each tier keeps the whole `ObjectStore` contract on its own keys (create-only, compare-and-swap,
//! atomic reads): a key lives in exactly one tier, so no operation ever spans both, except a
//! listing of a prefix that can hold keys of both, which lists each tier and merges.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ListedKey, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageResult, Version};

/// Where a key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// The write-ahead tier: what acknowledgements and coordination wait for.
    Wal,
    /// The bulk tier: large objects written in the background.
    Bulk,
}

impl Tier {
    /// The metric label of the tier.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Wal => "wal",
            Tier::Bulk => "bulk",
        }
    }
}

/// Which tiers a listing of a prefix must ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrefixTiers {
    Only(Tier),
    Both,
}

/// How keys are placed: supplied by the layer that names them.
#[derive(Debug, Clone, Copy)]
pub struct TierRouting {
    /// The tier a key lives in. Must be a pure function of the key: a key routed to one tier on
    /// write and the other on read would be lost.
    pub key: fn(&str) -> Tier,
    /// The tiers that may hold keys starting with a prefix. `Both` is always correct, only
    /// dearer (two listings).
    pub prefix: fn(&str) -> PrefixTiers,
}

/// An [`ObjectStore`] that sends each key to the tier [`TierRouting`] names. Give each tier its
/// own wrapper stack (retries, timeout, limit, metrics), so one tier's outage, retries and
/// request counts stay its own.
#[derive(Debug)]
pub struct TieredStore {
    wal: Arc<dyn ObjectStore>,
    bulk: Arc<dyn ObjectStore>,
    routing: TierRouting,
}

impl TieredStore {
    pub fn new(
        wal: Arc<dyn ObjectStore>,
        bulk: Arc<dyn ObjectStore>,
        routing: TierRouting,
    ) -> Self {
        Self { wal, bulk, routing }
    }

    fn store(&self, tier: Tier) -> &dyn ObjectStore {
        match tier {
            Tier::Wal => self.wal.as_ref(),
            Tier::Bulk => self.bulk.as_ref(),
        }
    }

    fn of(&self, key: &ObjectKey) -> &dyn ObjectStore {
        self.store((self.routing.key)(key.as_str()))
    }
}

/// Merges two key-sorted listings into one sorted listing. A key in both (only possible if it
/// was written before the routing changed) is listed once, from the tier that routes it, since
/// that is the copy reads and deletes reach.
fn merge<T>(
    wal: Vec<T>,
    bulk: Vec<T>,
    key_of: impl Fn(&T) -> &ObjectKey,
    route: fn(&str) -> Tier,
) -> Vec<T> {
    let mut out = Vec::with_capacity(wal.len() + bulk.len());
    let mut wal = wal.into_iter().peekable();
    let mut bulk = bulk.into_iter().peekable();
    loop {
        let take_wal = match (wal.peek(), bulk.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(w), Some(b)) => match key_of(w).cmp(key_of(b)) {
                std::cmp::Ordering::Less => true,
                std::cmp::Ordering::Greater => false,
                std::cmp::Ordering::Equal => {
                    let wal_routed = route(key_of(w).as_str()) == Tier::Wal;
                    // Drop the copy the routing does not reach, keep the other.
                    if wal_routed {
                        bulk.next();
                    } else {
                        wal.next();
                    }
                    wal_routed
                }
            },
        };
        let next = if take_wal { wal.next() } else { bulk.next() };
        out.extend(next);
    }
    out
}

#[async_trait]
impl ObjectStore for TieredStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        self.of(key).put(key, data, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        self.of(key).get(key).await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        self.of(key).get_range(key, range).await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        match (self.routing.prefix)(prefix) {
            PrefixTiers::Only(tier) => self.store(tier).list(prefix).await,
            PrefixTiers::Both => {
                let (wal, bulk) =
                    futures::try_join!(self.wal.list(prefix), self.bulk.list(prefix))?;
                Ok(merge(wal, bulk, |m| &m.key, self.routing.key))
            }
        }
    }

    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        match (self.routing.prefix)(prefix) {
            PrefixTiers::Only(tier) => self.store(tier).list_keys(prefix).await,
            PrefixTiers::Both => {
                let (wal, bulk) =
                    futures::try_join!(self.wal.list_keys(prefix), self.bulk.list_keys(prefix))?;
                Ok(merge(wal, bulk, |m| &m.key, self.routing.key))
            }
        }
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.of(key).delete(key).await
    }

    fn backend_name(&self) -> &'static str {
        "tiered"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, StorageError};

    /// A toy layout: keys with a `/big/` part go to bulk.
    fn routing() -> TierRouting {
        TierRouting {
            key: |k| {
                if k.contains("/big/") {
                    Tier::Bulk
                } else {
                    Tier::Wal
                }
            },
            prefix: |p| {
                if p.contains("/big/") {
                    PrefixTiers::Only(Tier::Bulk)
                } else if p.starts_with("wal/") {
                    PrefixTiers::Only(Tier::Wal)
                } else {
                    PrefixTiers::Both
                }
            },
        }
    }

    fn key(k: &str) -> ObjectKey {
        ObjectKey::new(k).unwrap()
    }

    fn tiers() -> (Arc<MemoryStore>, Arc<MemoryStore>, TieredStore) {
        let wal = Arc::new(MemoryStore::new());
        let bulk = Arc::new(MemoryStore::new());
        let tiered = TieredStore::new(wal.clone(), bulk.clone(), routing());
        (wal, bulk, tiered)
    }

    #[tokio::test]
    async fn each_key_lands_in_its_tier_and_is_read_back_from_it() {
        let (wal, bulk, tiered) = tiers();
        let small = key("wal/1/1");
        let big = key("log/t/0/big/1");
        tiered
            .put(&small, Bytes::from_static(b"s"), PutMode::Create)
            .await
            .unwrap();
        let v = tiered
            .put(&big, Bytes::from_static(b"bulk bytes"), PutMode::Create)
            .await
            .unwrap();
        assert!(wal.get(&small).await.is_ok());
        assert!(bulk.get(&small).await.unwrap_err().is_not_found());
        assert!(bulk.get(&big).await.is_ok());
        assert!(wal.get(&big).await.unwrap_err().is_not_found());

        assert_eq!(&tiered.get(&big).await.unwrap().0[..], b"bulk bytes");
        assert_eq!(&tiered.get_range(&big, 5..10).await.unwrap()[..], b"bytes");
        // Create-only and compare-and-swap hold per tier.
        assert!(matches!(
            tiered
                .put(&big, Bytes::from_static(b"x"), PutMode::Create)
                .await,
            Err(StorageError::AlreadyExists(_))
        ));
        tiered
            .put(&big, Bytes::from_static(b"y"), PutMode::Update(v))
            .await
            .unwrap();
        tiered.delete(&big).await.unwrap();
        assert!(bulk.get(&big).await.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn listings_of_mixed_prefixes_merge_both_tiers_in_key_order() {
        let (wal, bulk, tiered) = tiers();
        for k in [
            "log/t/0/big/2",
            "log/t/0/index/1",
            "log/t/0/big/0",
            "log/t/0/manifest",
        ] {
            tiered
                .put(&key(k), Bytes::from_static(b"v"), PutMode::Create)
                .await
                .unwrap();
        }
        let names = |listed: Vec<ObjectMeta>| {
            listed
                .into_iter()
                .map(|m| m.key.as_str().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(tiered.list("log/t/").await.unwrap()),
            [
                "log/t/0/big/0",
                "log/t/0/big/2",
                "log/t/0/index/1",
                "log/t/0/manifest"
            ]
        );
        let keys: Vec<_> = tiered
            .list_keys("log/")
            .await
            .unwrap()
            .into_iter()
            .map(|k| k.key.as_str().to_string())
            .collect();
        assert_eq!(keys.len(), 4);
        assert_eq!(
            names(tiered.list("log/t/0/big/").await.unwrap()),
            ["log/t/0/big/0", "log/t/0/big/2"]
        );

        // A key stranded in the tier the routing does not reach is listed once, from the
        // reachable copy.
        wal.put(
            &key("log/t/0/big/0"),
            Bytes::from_static(b"stale"),
            PutMode::Create,
        )
        .await
        .unwrap();
        bulk.put(
            &key("log/t/0/index/1"),
            Bytes::from_static(b"stale"),
            PutMode::Create,
        )
        .await
        .unwrap();
        let listed = tiered.list("log/").await.unwrap();
        assert_eq!(listed.len(), 4);
        for meta in listed {
            let (bytes, _) = tiered.get(&meta.key).await.unwrap();
            assert_eq!(&bytes[..], b"v", "{}", meta.key.as_str());
        }
    }

    #[tokio::test]
    async fn a_listing_routed_to_one_tier_asks_only_that_tier() {
        let (wal, _bulk, tiered) = tiers();
        // Only possible by writing past the router: proves the bulk tier is not asked.
        wal.put(
            &key("log/t/0/big/9"),
            Bytes::from_static(b"v"),
            PutMode::Create,
        )
        .await
        .unwrap();
        assert!(tiered.list("log/t/0/big/").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_failing_tier_fails_only_what_needs_it() {
        use crate::{FaultConfig, FaultInjectingStore};
        let wal = Arc::new(MemoryStore::new());
        let bulk = Arc::new(FaultInjectingStore::new(
            Arc::new(MemoryStore::new()),
            FaultConfig::none(),
            1,
        ));
        let tiered = TieredStore::new(wal, bulk.clone(), routing());
        bulk.set_outage(true);
        tiered
            .put(&key("wal/1/1"), Bytes::from_static(b"v"), PutMode::Create)
            .await
            .unwrap();
        assert!(tiered
            .put(
                &key("log/t/0/big/1"),
                Bytes::from_static(b"v"),
                PutMode::Create
            )
            .await
            .is_err());
        assert!(tiered.list("wal/").await.is_ok());
        assert!(
            tiered.list("log/").await.is_err(),
            "a merged listing needs both"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tiered_memory_stores_pass_conformance() {
        let (_, _, tiered) = tiers();
        crate::conformance::run_all(Arc::new(tiered), "conf/big").await;
        let (_, _, tiered) = tiers();
        crate::conformance::run_all(Arc::new(tiered), "conf/small").await;
    }
}
