//! Who owns each resource, recorded in storage and changed only by conditional writes.
//!
//! `cluster/owners/<resource>` holds an [`OwnerRecord`]: the owning broker and incarnation, the
//! epoch, whether the owner still holds it (`Active`) or has handed it back (`Released`), and the
//! owner's write-ahead stream (what a successor must seal if the owner dies). The resource name
//! is opaque to this crate (the broker uses `<topic-id>/<partition>`).
//!
//! Every change is a create-only put (first claim) or a compare-and-swap on the version the
//! caller read, so of two brokers claiming from the same record exactly one wins. Every claim
//! bumps the epoch by one, so an epoch names one tenure of one owner; a release keeps it.
//!
//! `cluster/placement/<resource>` holds an operator's explicit placement (a `move` command or
//! AlterPartitionReassignments); [`crate::placement`] lets it win over hashing.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_core::{BrokerId, Epoch};
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError, Version};

use crate::keys::{owner_key, placement_key, OWNERS_PREFIX, PLACEMENT_PREFIX};
use crate::membership::Incarnation;
use crate::{ClusterError, ClusterResult};

/// Whether the owner named in a record still holds the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerState {
    Active,
    /// Handed back after a clean stop (flushed and checkpointed): the next owner need not
    /// fence or replay anything.
    Released,
}

/// The content of `cluster/owners/<resource>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    pub owner: BrokerId,
    pub incarnation: Incarnation,
    pub epoch: Epoch,
    pub state: OwnerState,
    /// The owner's write-ahead stream: sealing it is how a successor fences a dead owner.
    /// None when the owner writes no stream (nothing to fence).
    #[serde(default)]
    pub stream: Option<u32>,
}

impl OwnerRecord {
    /// Whether this record names exactly this claimant (broker *and* incarnation).
    pub fn is_held_by(&self, me: &Claimant) -> bool {
        self.owner == me.broker && self.incarnation == me.incarnation
    }

    /// Orders the records one resource goes through: Active e < Released e < Active e+1.
    /// Lets a reader drop an observation older than one it already has.
    pub fn progress(&self) -> (u64, u8) {
        (
            self.epoch.0,
            match self.state {
                OwnerState::Active => 0,
                OwnerState::Released => 1,
            },
        )
    }

    fn encode(&self) -> ClusterResult<Bytes> {
        serde_json::to_vec(self)
            .map(Bytes::from)
            .map_err(|e| ClusterError::Invalid(format!("cannot encode owner record: {e}")))
    }

    fn decode(key: &ObjectKey, bytes: &[u8]) -> ClusterResult<Self> {
        serde_json::from_slice(bytes).map_err(|e| ClusterError::corrupt(key, e))
    }
}

/// A record together with the version it was read at (what a compare-and-swap needs).
pub type VersionedRecord = (Version, OwnerRecord);

/// Who is claiming: this broker, this process's incarnation, and its write-ahead stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimant {
    pub broker: BrokerId,
    pub incarnation: Incarnation,
    pub stream: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PlacementOverride {
    broker: BrokerId,
}

/// Reads and conditionally writes ownership and placement objects.
#[derive(Debug, Clone)]
pub struct Ownership {
    store: Arc<dyn ObjectStore>,
}

impl Ownership {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// The current record of `resource`, if any.
    pub async fn read(&self, resource: &str) -> ClusterResult<Option<VersionedRecord>> {
        let key = owner_key(resource)?;
        match self.store.get(&key).await {
            Ok((bytes, version)) => Ok(Some((version, OwnerRecord::decode(&key, &bytes)?))),
            Err(StorageError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Names of the resources that have a record, whose name starts with `prefix` (sorted).
    pub async fn list_resources(&self, prefix: &str) -> ClusterResult<Vec<String>> {
        let listed = self.store.list(&format!("{OWNERS_PREFIX}{prefix}")).await?;
        Ok(listed
            .into_iter()
            .filter_map(|m| m.key.as_str().strip_prefix(OWNERS_PREFIX).map(String::from))
            .collect())
    }

    /// Every record whose resource name starts with `prefix`, sorted by resource.
    pub async fn list(&self, prefix: &str) -> ClusterResult<Vec<(String, VersionedRecord)>> {
        let mut records = Vec::new();
        for resource in self.list_resources(prefix).await? {
            // A record deleted between the listing and the read is simply not there.
            if let Some(record) = self.read(&resource).await? {
                records.push((resource, record));
            }
        }
        Ok(records)
    }

    /// Claims `resource` for `me`: create-only when `expected` is None, otherwise a
    /// compare-and-swap from exactly the record the caller read (and judged claimable).
    ///
    /// The new record is Active at `expected.epoch + 1` (1 for a first claim). `Lost` means
    /// somebody changed the record first; the caller should re-read and reconsider.
    pub async fn claim(
        &self,
        resource: &str,
        me: &Claimant,
        expected: Option<&VersionedRecord>,
    ) -> ClusterResult<VersionedRecord> {
        let epoch = expected.map_or(Epoch(1), |(_, record)| Epoch(record.epoch.0 + 1));
        let record = OwnerRecord {
            owner: me.broker,
            incarnation: me.incarnation,
            epoch,
            state: OwnerState::Active,
            stream: me.stream,
        };
        let mode = match expected {
            None => PutMode::Create,
            Some((version, _)) => PutMode::Update(version.clone()),
        };
        let version = self.write(resource, &record, mode).await?;
        tracing::info!(resource, owner = %me.broker, %epoch, "claimed");
        Ok((version, record))
    }

    /// Marks `resource` Released by `me`, keeping the epoch. Call only after the resource was
    /// stopped, flushed and checkpointed: a successor takes a Released resource without fencing.
    pub async fn release(
        &self,
        resource: &str,
        me: &Claimant,
        current: &VersionedRecord,
    ) -> ClusterResult<VersionedRecord> {
        let (version, record) = current;
        if !record.is_held_by(me) || record.state != OwnerState::Active {
            return Err(ClusterError::NotOwner {
                resource: resource.to_string(),
            });
        }
        let released = OwnerRecord {
            state: OwnerState::Released,
            ..record.clone()
        };
        let version = self
            .write(resource, &released, PutMode::Update(version.clone()))
            .await?;
        tracing::info!(resource, owner = %me.broker, epoch = %record.epoch, "released");
        Ok((version, released))
    }

    /// Writes `record` conditionally. A conditional failure is `Lost`; an answer lost in
    /// transit is settled by reading back: exactly our record means our write landed.
    async fn write(
        &self,
        resource: &str,
        record: &OwnerRecord,
        mode: PutMode,
    ) -> ClusterResult<Version> {
        let key = owner_key(resource)?;
        match self.store.put(&key, record.encode()?, mode.clone()).await {
            Ok(version) => Ok(version),
            Err(StorageError::AlreadyExists(_) | StorageError::Precondition(_)) => {
                Err(ClusterError::Lost {
                    resource: resource.to_string(),
                })
            }
            Err(e) if e.is_ambiguous() => {
                let expected_version = match &mode {
                    PutMode::Create => None,
                    PutMode::Update(version) => Some(version),
                };
                match self.store.get(&key).await {
                    Ok((bytes, version))
                        if OwnerRecord::decode(&key, &bytes).ok().as_ref() == Some(record) =>
                    {
                        Ok(version)
                    }
                    // Still what we started from: our write did not land; try again later.
                    Ok((_, version)) if Some(&version) == expected_version => Err(e.into()),
                    Ok(_) => Err(ClusterError::Lost {
                        resource: resource.to_string(),
                    }),
                    Err(StorageError::NotFound(_)) if expected_version.is_none() => Err(e.into()),
                    Err(_) => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Places `resource` on `broker` explicitly (wins over hashing while `broker` is live).
    pub async fn set_placement_override(
        &self,
        resource: &str,
        broker: BrokerId,
    ) -> ClusterResult<()> {
        let key = placement_key(resource)?;
        let body = serde_json::to_vec(&PlacementOverride { broker })
            .map_err(|e| ClusterError::Invalid(e.to_string()))?;
        // Last writer wins, but through conditional writes so two movers never tear an object.
        for _ in 0..8 {
            let mode = match self.store.get(&key).await {
                Ok((_, version)) => PutMode::Update(version),
                Err(StorageError::NotFound(_)) => PutMode::Create,
                Err(e) => return Err(e.into()),
            };
            match self.store.put(&key, Bytes::from(body.clone()), mode).await {
                Ok(_) => {
                    tracing::info!(resource, %broker, "placement override set");
                    return Ok(());
                }
                Err(StorageError::AlreadyExists(_) | StorageError::Precondition(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(
            StorageError::Throttled(format!("placement override of {resource} keeps changing"))
                .into(),
        )
    }

    /// Returns `resource` to hash placement.
    pub async fn clear_placement_override(&self, resource: &str) -> ClusterResult<()> {
        self.store.delete(&placement_key(resource)?).await?;
        Ok(())
    }

    /// Every placement override, by resource.
    pub async fn placement_overrides(&self) -> ClusterResult<BTreeMap<String, BrokerId>> {
        let mut overrides = BTreeMap::new();
        for meta in self.store.list(PLACEMENT_PREFIX).await? {
            let Some(resource) = meta.key.as_str().strip_prefix(PLACEMENT_PREFIX) else {
                continue;
            };
            let bytes = match self.store.get(&meta.key).await {
                Ok((bytes, _)) => bytes,
                Err(StorageError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            match serde_json::from_slice::<PlacementOverride>(&bytes) {
                Ok(o) => {
                    overrides.insert(resource.to_string(), o.broker);
                }
                Err(e) => {
                    tracing::warn!(key = %meta.key, error = %e, "unreadable placement override ignored")
                }
            }
        }
        Ok(overrides)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_storage::MemoryStore;

    fn claimant(broker: i32, incarnation: u64) -> Claimant {
        Claimant {
            broker: BrokerId(broker),
            incarnation: Incarnation(incarnation),
            stream: Some(broker as u32),
        }
    }

    #[tokio::test]
    async fn first_claim_creates_epoch_one_and_a_second_creator_loses() {
        let ownership = Ownership::new(Arc::new(MemoryStore::new()));
        let (_, record) = ownership.claim("t/0", &claimant(1, 1), None).await.unwrap();
        assert_eq!(record.epoch, Epoch(1));
        assert_eq!(record.state, OwnerState::Active);
        let err = ownership
            .claim("t/0", &claimant(2, 2), None)
            .await
            .unwrap_err();
        assert!(matches!(err, ClusterError::Lost { .. }), "{err}");
        assert!(err.is_fenced());
    }

    #[tokio::test]
    async fn of_two_claims_from_the_same_record_exactly_one_wins() {
        let ownership = Ownership::new(Arc::new(MemoryStore::new()));
        let first = ownership.claim("t/0", &claimant(1, 1), None).await.unwrap();
        let a = ownership.claim("t/0", &claimant(2, 2), Some(&first)).await;
        let b = ownership.claim("t/0", &claimant(3, 3), Some(&first)).await;
        assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
        let (_, now) = ownership.read("t/0").await.unwrap().unwrap();
        assert_eq!(now.epoch, Epoch(2));
        assert_eq!(now.owner, BrokerId(2));
    }

    #[tokio::test]
    async fn release_keeps_the_epoch_and_the_next_claim_bumps_it() {
        let ownership = Ownership::new(Arc::new(MemoryStore::new()));
        let me = claimant(1, 1);
        let held = ownership.claim("t/0", &me, None).await.unwrap();
        let released = ownership.release("t/0", &me, &held).await.unwrap();
        assert_eq!(released.1.state, OwnerState::Released);
        assert_eq!(released.1.epoch, Epoch(1));
        assert!(released.1.progress() > held.1.progress());
        let next = ownership
            .claim("t/0", &claimant(2, 2), Some(&released))
            .await
            .unwrap();
        assert_eq!(next.1.epoch, Epoch(2));
        assert!(next.1.progress() > released.1.progress());
        // Only the holder may release, and only an Active record.
        let err = ownership.release("t/0", &me, &next).await.unwrap_err();
        assert!(matches!(err, ClusterError::NotOwner { .. }), "{err}");
    }

    #[tokio::test]
    async fn an_earlier_incarnation_of_the_same_broker_is_not_the_holder() {
        let ownership = Ownership::new(Arc::new(MemoryStore::new()));
        let old = ownership.claim("t/0", &claimant(1, 1), None).await.unwrap();
        assert!(!old.1.is_held_by(&claimant(1, 2)));
        let err = ownership
            .release("t/0", &claimant(1, 2), &old)
            .await
            .unwrap_err();
        assert!(matches!(err, ClusterError::NotOwner { .. }));
    }

    #[tokio::test]
    async fn an_ambiguous_claim_that_landed_is_recognised_by_reading_back() {
        use strata_storage::{FaultConfig, FaultInjectingStore, InjectedError, OpKind};
        let faults = Arc::new(FaultInjectingStore::new(
            Arc::new(MemoryStore::new()),
            FaultConfig::none(),
            1,
        ));
        let ownership = Ownership::new(faults.clone());
        faults.apply_then_fail_next(OpKind::PutCreate, InjectedError::Timeout);
        let (_, record) = ownership.claim("t/0", &claimant(1, 1), None).await.unwrap();
        assert_eq!(record.epoch, Epoch(1));
        // A failure that was not applied leaves the record as it was: retryable, not lost.
        let current = ownership.read("t/0").await.unwrap().unwrap();
        faults.fail_next(OpKind::PutUpdate, InjectedError::Unavailable);
        let err = ownership
            .claim("t/0", &claimant(2, 2), Some(&current))
            .await
            .unwrap_err();
        assert!(err.is_retryable() && !err.is_fenced(), "{err}");
        // Applied-then-failed is recognised as ours.
        faults.apply_then_fail_next(OpKind::PutUpdate, InjectedError::Timeout);
        let (_, record) = ownership
            .claim("t/0", &claimant(2, 2), Some(&current))
            .await
            .unwrap();
        assert_eq!(record.owner, BrokerId(2));
    }

    #[tokio::test]
    async fn records_list_by_prefix_and_bad_names_are_refused() {
        let ownership = Ownership::new(Arc::new(MemoryStore::new()));
        for r in ["a/0", "a/1", "b/0"] {
            ownership.claim(r, &claimant(1, 1), None).await.unwrap();
        }
        let listed: Vec<String> = ownership
            .list("a/")
            .await
            .unwrap()
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert_eq!(listed, ["a/0", "a/1"]);
        assert!(ownership.read("missing/0").await.unwrap().is_none());
        assert!(matches!(
            ownership.claim("bad name", &claimant(1, 1), None).await,
            Err(ClusterError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn placement_overrides_are_set_replaced_listed_and_cleared() {
        let ownership = Ownership::new(Arc::new(MemoryStore::new()));
        ownership
            .set_placement_override("t/0", BrokerId(2))
            .await
            .unwrap();
        ownership
            .set_placement_override("t/0", BrokerId(3))
            .await
            .unwrap();
        ownership
            .set_placement_override("t/1", BrokerId(1))
            .await
            .unwrap();
        let overrides = ownership.placement_overrides().await.unwrap();
        assert_eq!(
            overrides,
            BTreeMap::from([
                ("t/0".to_string(), BrokerId(3)),
                ("t/1".to_string(), BrokerId(1))
            ])
        );
        ownership.clear_placement_override("t/0").await.unwrap();
        ownership.clear_placement_override("t/0").await.unwrap();
        assert_eq!(ownership.placement_overrides().await.unwrap().len(), 1);
    }
}
