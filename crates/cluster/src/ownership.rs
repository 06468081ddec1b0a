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
//! AlterPartitionReassignments); [`crate::placement`] lets it win over hashing. Every change of
//! an override is followed by a rewrite of `cluster/placement-changes`, a small marker that
//! brokers poll instead of listing the overrides (see [`Ownership::placement_changes`]).
//!
//! # Reading only what changed
//!
//! Every broker lists the records and overrides several times a second. A listing reports each
//! object's [`ChangeTag`], and [`Ownership`] keeps what it decoded from each object with the tag
//! of the listing that preceded the read; a later listing showing the same tag means nobody
//! wrote the object since, so the cached record (and the version it was read at, which is what
//! a compare-and-swap needs) is still current and is not read again. An object whose tag is
//! unknown is read. So while nothing changes, polling costs one listing, whatever the number
//! of partitions.
//!
//! A backend whose listings carry no tags (RADOS lists names only) gets one from a marker:
//! every successful write of a record is followed by a rewrite of `cluster/owners-changes`,
//! and a listing that finds untagged records reads the marker once and tags each of them
//! with its version. A record read after the marker was seen at version v and listed again
//! while the marker is still at v cannot have been written since — its writer would have
//! rewritten the marker after the record — so the cached copy stands. A writer that dies
//! between its record and the marker leaves a change the marker does not announce; so the
//! synthetic tag also carries a counter of listings that changes every
//! [`UNTAGGED_FULL_READ_EVERY`] listings, forcing a full re-read then (about five seconds at
//! the default intervals). That only delays seeing a change, never makes a write unsafe:
//! every write is still a compare-and-swap on the version actually stored, and a failed one
//! drops the cached record so the next listing reads it.
//!
//! The cache lives inside `Ownership` behind a mutex shared by its clones, so every copy a
//! broker hands around benefits, and holds only decoded records (a few dozen bytes each) of
//! what was read through listings; entries whose object is no longer listed are dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_core::{BrokerId, Epoch};
use strata_storage::{ChangeTag, ObjectKey, ObjectStore, PutMode, StorageError, Version};

use crate::keys::{
    owner_key, owners_changes_key, placement_changes_key, placement_key, OWNERS_PREFIX,
    PLACEMENT_PREFIX,
};
use crate::membership::Incarnation;
use crate::{ClusterError, ClusterResult};
use strata_layout::cluster::{parse_owner_key, parse_placement_key, PlacementOverride};
use strata_layout::schema::{self, Schema};

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
        Ok(schema::encode(self)?)
    }

    fn decode(key: &ObjectKey, bytes: &[u8]) -> ClusterResult<Self> {
        Ok(schema::decode(key.as_str(), bytes)?)
    }
}

impl Schema for OwnerRecord {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "owner record";
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

/// What one listing of ownership records found: the resources with a record, each with the
/// change tag the listing reported. Hand it to [`Ownership::read_listed`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerListing {
    tags: BTreeMap<String, Option<ChangeTag>>,
}

impl OwnerListing {
    pub fn contains(&self, resource: &str) -> bool {
        self.tags.contains_key(resource)
    }

    /// The listed resources, sorted.
    pub fn resources(&self) -> impl Iterator<Item = &str> {
        self.tags.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.tags.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }
}

/// How many listings of untagged records may trust the `cluster/owners-changes` marker before
/// every record is read again (see the module doc). The runner and the owner cache each list
/// once per `ownership_interval` (250 ms by default), so forty is about five seconds.
pub const UNTAGGED_FULL_READ_EVERY: u64 = 40;

/// What the listings' reads decoded, by resource, with the tag of the listing before the read
/// (see the module doc).
#[derive(Default)]
struct ReadCache {
    owners: HashMap<String, (ChangeTag, VersionedRecord)>,
    /// Whether listings of records came without change tags: None until the first listing.
    /// Writers rewrite the owners-changes marker unless this is known to be `Some(false)`.
    untagged: Option<bool>,
    /// Listings of untagged records so far (the full re-read counter).
    untagged_listings: u64,
    /// None: the override was unreadable (warned about once, not re-read until it changes).
    placements: HashMap<String, (ChangeTag, Option<BrokerId>)>,
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCache")
            .field("owners", &self.owners.len())
            .field("placements", &self.placements.len())
            .finish()
    }
}

/// Reads and conditionally writes ownership and placement objects. Clones share one cache of
/// decoded records (see the module doc).
#[derive(Debug, Clone)]
pub struct Ownership {
    store: Arc<dyn ObjectStore>,
    cache: Arc<Mutex<ReadCache>>,
}

impl Ownership {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            cache: Arc::default(),
        }
    }

    fn cache(&self) -> MutexGuard<'_, ReadCache> {
        // Every update is a single insert or removal, so a poisoned cache is still consistent.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
        let listing = self.list_owners(prefix).await?;
        Ok(listing.tags.into_keys().collect())
    }

    /// One listing of the records whose resource name starts with `prefix` (one request, no
    /// reads). Forgets cached records of that prefix that are no longer listed.
    pub async fn list_owners(&self, prefix: &str) -> ClusterResult<OwnerListing> {
        let listed = self
            .store
            .list_keys(&format!("{OWNERS_PREFIX}{prefix}"))
            .await?;
        let untagged = listed.iter().any(|m| m.tag.is_none());
        if !listed.is_empty() {
            self.cache().untagged = Some(untagged);
        }
        // Read after the listing, before any record: see the module doc.
        let synthetic = if untagged {
            Some(self.owners_changes_tag().await?)
        } else {
            None
        };
        let tags: BTreeMap<String, Option<ChangeTag>> = listed
            .into_iter()
            .filter_map(|m| {
                let resource = parse_owner_key(m.key.as_str())?;
                Some((resource.to_string(), m.tag.or_else(|| synthetic.clone())))
            })
            .collect();
        self.cache()
            .owners
            .retain(|resource, _| !resource.starts_with(prefix) || tags.contains_key(resource));
        Ok(OwnerListing { tags })
    }

    /// The change tag standing in for a listing's missing ones: the version of the
    /// owners-changes marker, plus which stretch of [`UNTAGGED_FULL_READ_EVERY`] listings this
    /// is (so that every record is read again at the start of each).
    async fn owners_changes_tag(&self) -> ClusterResult<ChangeTag> {
        let marker = match self.store.get(&owners_changes_key()?).await {
            Ok((_, version)) => Some(version),
            Err(StorageError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let stretch = {
            let mut cache = self.cache();
            cache.untagged_listings += 1;
            cache.untagged_listings / UNTAGGED_FULL_READ_EVERY
        };
        Ok(ChangeTag(format!("owners-changes {marker:?} #{stretch}")))
    }

    /// The record of `resource` as of `listing`: None without a read if the listing did not
    /// show it; the cached record if the listing shows the tag it was cached at; otherwise
    /// read (and cached under the listing's tag, if it has one).
    ///
    /// Caching under the tag of the listing *before* the read is what keeps this exact: if the
    /// object was rewritten between the listing and the read we hold a newer record under an
    /// older tag, and the next listing (showing the new tag) reads it again; a tag seen again
    /// means no write since, tags never repeat for a key.
    pub async fn read_listed(
        &self,
        listing: &OwnerListing,
        resource: &str,
    ) -> ClusterResult<Option<VersionedRecord>> {
        let Some(tag) = listing.tags.get(resource) else {
            return Ok(None);
        };
        if let Some(tag) = tag {
            if let Some((cached_tag, record)) = self.cache().owners.get(resource) {
                if cached_tag == tag {
                    return Ok(Some(record.clone()));
                }
            }
        }
        let read = self.read(resource).await?;
        let mut cache = self.cache();
        match (&read, tag) {
            (Some(record), Some(tag)) => {
                cache
                    .owners
                    .insert(resource.to_string(), (tag.clone(), record.clone()));
            }
            _ => {
                cache.owners.remove(resource);
            }
        }
        Ok(read)
    }

    /// Every record whose resource name starts with `prefix`, sorted by resource. One listing,
    /// plus a read of each record that changed since this `Ownership` (or a clone) last read it.
    pub async fn list(&self, prefix: &str) -> ClusterResult<Vec<(String, VersionedRecord)>> {
        let listing = self.list_owners(prefix).await?;
        let mut records = Vec::with_capacity(listing.len());
        for resource in listing.resources() {
            // A record deleted between the listing and the read is simply not there.
            if let Some(record) = self.read_listed(&listing, resource).await? {
                records.push((resource.to_string(), record));
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
        let written = self.write_record(resource, record, mode).await;
        match &written {
            Ok(_) => {
                let announce = self.cache().untagged != Some(false);
                if announce {
                    self.bump_marker(&owners_changes_key()?, "an owner record change")
                        .await;
                }
            }
            // What we cached is stale (or at best unproven): read it at the next listing.
            Err(_) => {
                self.cache().owners.remove(resource);
            }
        }
        written
    }

    async fn write_record(
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
        let body = schema::encode(&PlacementOverride { broker })?;
        // Last writer wins, but through conditional writes so two movers never tear an object.
        for _ in 0..8 {
            let mode = match self.store.get(&key).await {
                Ok((_, version)) => PutMode::Update(version),
                Err(StorageError::NotFound(_)) => PutMode::Create,
                Err(e) => return Err(e.into()),
            };
            match self.store.put(&key, body.clone(), mode).await {
                Ok(_) => {
                    tracing::info!(resource, %broker, "placement override set");
                    self.bump_placement_changes().await;
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
        self.bump_placement_changes().await;
        Ok(())
    }

    /// Tells every broker to run a full round now: the set of resources changed (a topic or
    /// partitions created or deleted), so where they belong changed too. Rewrites the same
    /// marker as an override change; logged, not returned, on failure (the next full round
    /// finds the change anyway).
    pub async fn announce_change(&self) {
        self.bump_placement_changes().await;
    }

    /// Rewrites `cluster/placement-changes` after an override changed, so that every broker's
    /// move watch ([`crate::OwnershipRunner::watch`]) runs a full round now rather than at its
    /// next regular one. Always *after* the override itself: a broker that sees the new marker
    /// then lists the overrides and finds the change. Only an accelerator, so a failure is
    /// logged, not returned: the override is in place and full rounds list every override (a
    /// mover that crashes between the two writes is covered the same way).
    async fn bump_placement_changes(&self) {
        match placement_changes_key() {
            Ok(key) => self.bump_marker(&key, "a placement change").await,
            Err(e) => tracing::warn!(error = %e, "placement-changes key"),
        }
    }

    /// Rewrites a changes marker (a counter, so every rewrite changes its version). Only an
    /// accelerator: a failure is logged and pollers find the change at their next full read.
    async fn bump_marker(&self, key: &ObjectKey, what: &str) {
        if let Err(e) = self.try_bump_marker(key).await {
            tracing::warn!(error = %e, marker = %key,
                "could not signal {what}; brokers see it at their next full read");
        }
    }

    async fn try_bump_marker(&self, key: &ObjectKey) -> ClusterResult<()> {
        Ok(strata_layout::cas::bump_marker(self.store.as_ref(), key).await?)
    }

    /// The version of `cluster/placement-changes` (None: no override was ever changed). It
    /// changes after every change of an override, so a broker that saw one version and lists
    /// the overrides afterwards needs to list them again only once it changes: one small read
    /// instead of a listing plus a read per override.
    pub async fn placement_changes(&self) -> ClusterResult<Option<Version>> {
        match self.store.get(&placement_changes_key()?).await {
            Ok((_, version)) => Ok(Some(version)),
            Err(StorageError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Every placement override, by resource: one listing, plus a read of each override that
    /// changed since the last call (see the module doc).
    pub async fn placement_overrides(&self) -> ClusterResult<BTreeMap<String, BrokerId>> {
        let listed = self.store.list_keys(PLACEMENT_PREFIX).await?;
        let mut overrides = BTreeMap::new();
        let mut seen = Vec::with_capacity(listed.len());
        for meta in listed {
            let Some(resource) = parse_placement_key(meta.key.as_str()) else {
                continue;
            };
            seen.push(resource.to_string());
            let cached = meta.tag.as_ref().and_then(|tag| {
                self.cache()
                    .placements
                    .get(resource)
                    .filter(|(cached_tag, _)| cached_tag == tag)
                    .map(|(_, broker)| *broker)
            });
            let broker = match cached {
                Some(broker) => broker,
                None => {
                    let broker = match self.store.get(&meta.key).await {
                        Ok((bytes, _)) => {
                            match schema::decode::<PlacementOverride>(meta.key.as_str(), &bytes) {
                                Ok(o) => Some(o.broker),
                                Err(e) => {
                                    tracing::warn!(key = %meta.key, error = %e, "unreadable placement override ignored");
                                    None
                                }
                            }
                        }
                        Err(StorageError::NotFound(_)) => {
                            self.cache().placements.remove(resource);
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    };
                    if let Some(tag) = meta.tag {
                        self.cache()
                            .placements
                            .insert(resource.to_string(), (tag, broker));
                    }
                    broker
                }
            };
            if let Some(broker) = broker {
                overrides.insert(resource.to_string(), broker);
            }
        }
        // Entries of overrides no longer listed would only grow the cache.
        let seen: std::collections::HashSet<&str> = seen.iter().map(String::as_str).collect();
        self.cache()
            .placements
            .retain(|resource, _| seen.contains(resource.as_str()));
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

    #[test]
    fn an_owner_record_of_the_old_format_still_reads() {
        // As written before schemas were versioned.
        let key = ObjectKey::new("cluster/owners/t/0").unwrap();
        let old = br#"{"owner":2,"incarnation":"000000000000002a","epoch":5,"state":"released","stream":7}"#;
        let record = OwnerRecord {
            owner: BrokerId(2),
            incarnation: Incarnation(0x2a),
            epoch: Epoch(5),
            state: OwnerState::Released,
            stream: Some(7),
        };
        assert_eq!(OwnerRecord::decode(&key, old).unwrap(), record);
        assert_eq!(
            OwnerRecord::decode(&key, &record.encode().unwrap()).unwrap(),
            record
        );
        assert!(matches!(
            OwnerRecord::decode(&key, br#"{"schema":9,"owner":2}"#),
            Err(ClusterError::Corrupt { .. })
        ));
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

    use strata_core::clock::ManualClock;
    use strata_storage::{MetricsStore, OpKind, StorageMetrics};

    /// A memory store behind the metrics wrapper, to count what a poll costs.
    fn counted() -> (Arc<dyn ObjectStore>, Arc<StorageMetrics>) {
        let metered =
            MetricsStore::new(Arc::new(MemoryStore::new()), Arc::new(ManualClock::new(0)));
        let metrics = Arc::clone(metered.metrics());
        (Arc::new(metered), metrics)
    }

    /// (LIST, GET) requests so far.
    fn lists_and_gets(metrics: &StorageMetrics) -> (u64, u64) {
        let snapshot = metrics.snapshot();
        (
            snapshot.op(OpKind::List).requests,
            snapshot.op(OpKind::Get).requests,
        )
    }

    /// Requests (LIST, GET) `work` sent.
    async fn cost<T>(
        metrics: &StorageMetrics,
        work: impl std::future::Future<Output = T>,
    ) -> (T, (u64, u64)) {
        let (lists, gets) = lists_and_gets(metrics);
        let out = work.await;
        let (lists_after, gets_after) = lists_and_gets(metrics);
        (out, (lists_after - lists, gets_after - gets))
    }

    #[tokio::test]
    async fn listings_read_only_the_records_that_changed() {
        let (store, metrics) = counted();
        // Separate instances, separate caches: one polls, the other writes (another broker).
        let poller = Ownership::new(store.clone());
        let writer = Ownership::new(store.clone());
        let me = claimant(1, 1);
        for i in 0..10 {
            writer.claim(&format!("t/{i}"), &me, None).await.unwrap();
        }
        let (first, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 10), "the first poll reads everything");
        let (again, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 0), "nothing changed, nothing read");
        assert_eq!(again.unwrap(), *first.as_ref().unwrap());

        // One release, one new record, one deleted record: exactly the two that exist and
        // changed are read.
        let records: BTreeMap<String, VersionedRecord> = first.unwrap().into_iter().collect();
        writer.release("t/3", &me, &records["t/3"]).await.unwrap();
        writer.claim("t/10", &me, None).await.unwrap();
        store.delete(&owner_key("t/7").unwrap()).await.unwrap();
        let (now, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 2));
        let now: BTreeMap<String, VersionedRecord> = now.unwrap().into_iter().collect();
        assert_eq!(now.len(), 10);
        assert!(!now.contains_key("t/7"));
        assert_eq!(now["t/3"].1.state, OwnerState::Released);
        assert_eq!(now["t/10"].1.epoch, Epoch(1));
        assert_eq!(
            poller.cache().owners.len(),
            10,
            "the deleted record is forgotten"
        );
        // A cached record carries the version a compare-and-swap needs.
        let (_, taken) = poller
            .claim("t/3", &claimant(2, 2), Some(&now["t/3"]))
            .await
            .unwrap();
        assert_eq!(taken.epoch, Epoch(2));
        // A clone shares the cache: it reads only what changed (the claim just made).
        let (_, spent) = cost(&metrics, poller.clone().list("")).await;
        assert_eq!(spent, (1, 1));
    }

    #[tokio::test]
    async fn a_record_rewritten_between_listing_and_read_is_read_again() {
        let (store, metrics) = counted();
        let poller = Ownership::new(store.clone());
        let writer = Ownership::new(store.clone());
        let me = claimant(1, 1);
        let held = writer.claim("t/0", &me, None).await.unwrap();
        let listing = poller.list_owners("").await.unwrap();
        assert!(listing.contains("t/0") && !listing.contains("t/1"));
        // Rewritten after the listing, before the read: the read sees the new record...
        writer.release("t/0", &me, &held).await.unwrap();
        let read = poller.read_listed(&listing, "t/0").await.unwrap().unwrap();
        assert_eq!(read.1.state, OwnerState::Released);
        // ...and the next listing (a new tag) reads it once more rather than trusting it.
        let (records, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 1));
        assert_eq!(records.unwrap()[0].1, read);
        let (_, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 0));
        // Not listed: absent, without a read.
        let (absent, spent) = cost(&metrics, poller.read_listed(&listing, "t/1")).await;
        assert!(absent.unwrap().is_none());
        assert_eq!(spent, (0, 0));
    }

    #[tokio::test]
    async fn without_change_tags_the_owners_changes_marker_stands_in_for_them() {
        let (counted, metrics) = counted();
        let store: Arc<dyn ObjectStore> = Arc::new(crate::testkit::Untagged(counted));
        let poller = Ownership::new(store.clone());
        let writer = Ownership::new(store.clone());
        let me = claimant(1, 1);
        let held = writer.claim("t/0", &me, None).await.unwrap();
        writer.claim("t/1", &me, None).await.unwrap();
        writer
            .set_placement_override("t/0", BrokerId(2))
            .await
            .unwrap();
        // The first listing reads the marker and every record; the next ones only the marker.
        let (_, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 3));
        let (_, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 1));
        // Overrides are still read whenever listed (their own marker tells when to list).
        let (_, spent) = cost(&metrics, poller.placement_overrides()).await;
        assert_eq!(spent, (1, 1));

        // Another broker's write moves the marker: the next listing reads everything again.
        writer.release("t/0", &me, &held).await.unwrap();
        let (records, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 3));
        let records: BTreeMap<String, VersionedRecord> = records.unwrap().into_iter().collect();
        assert_eq!(records["t/0"].1.state, OwnerState::Released);

        // A compare-and-swap that fails drops the cached record: the next listing reads it.
        let sneaky = OwnerRecord {
            epoch: Epoch(9),
            ..records["t/1"].1.clone()
        };
        store
            .put(
                &owner_key("t/1").unwrap(),
                sneaky.encode().unwrap(),
                PutMode::Update(records["t/1"].0.clone()),
            )
            .await
            .unwrap();
        let lost = poller
            .claim("t/1", &claimant(2, 2), Some(&records["t/1"]))
            .await;
        assert!(matches!(lost, Err(ClusterError::Lost { .. })));
        let (records, spent) = cost(&metrics, poller.list("")).await;
        assert_eq!(spent, (1, 2), "the marker and the record that failed");
        assert_eq!(records.unwrap()[1].1 .1.epoch, Epoch(9));
    }

    /// A writer that dies between its record and the marker: the change is seen at the next
    /// full re-read, within [`UNTAGGED_FULL_READ_EVERY`] listings, and not before.
    #[tokio::test]
    async fn without_change_tags_an_unannounced_change_is_seen_at_the_next_full_read() {
        let (counted, _) = counted();
        let store: Arc<dyn ObjectStore> = Arc::new(crate::testkit::Untagged(counted));
        let poller = Ownership::new(store.clone());
        let me = claimant(1, 1);
        let (version, record) = Ownership::new(store.clone())
            .claim("t/0", &me, None)
            .await
            .unwrap();
        assert_eq!(poller.list("").await.unwrap()[0].1 .1.epoch, Epoch(1));
        let unannounced = OwnerRecord {
            epoch: Epoch(2),
            ..record
        };
        store
            .put(
                &owner_key("t/0").unwrap(),
                unannounced.encode().unwrap(),
                PutMode::Update(version),
            )
            .await
            .unwrap();
        let mut listings = 0;
        loop {
            listings += 1;
            let seen = poller.list("").await.unwrap()[0].1 .1.epoch;
            if seen == Epoch(2) {
                break;
            }
            assert!(listings <= UNTAGGED_FULL_READ_EVERY, "never re-read");
        }
        assert!(
            listings > 1,
            "the cached record was trusted while the marker stood still"
        );
    }

    #[tokio::test]
    async fn overrides_are_read_only_when_changed_and_every_change_is_signalled() {
        let (store, metrics) = counted();
        let poller = Ownership::new(store.clone());
        let mover = Ownership::new(store.clone());
        assert_eq!(poller.placement_changes().await.unwrap(), None);
        for i in 0..3 {
            mover
                .set_placement_override(&format!("t/{i}"), BrokerId(2))
                .await
                .unwrap();
        }
        let signalled = poller.placement_changes().await.unwrap();
        assert!(signalled.is_some());
        let (overrides, spent) = cost(&metrics, poller.placement_overrides()).await;
        assert_eq!(overrides.unwrap().len(), 3);
        assert_eq!(spent, (1, 3));
        let (_, spent) = cost(&metrics, poller.placement_overrides()).await;
        assert_eq!(spent, (1, 0));

        // Moving again and clearing: each is signalled, and only the changed one is read.
        mover
            .set_placement_override("t/0", BrokerId(3))
            .await
            .unwrap();
        let moved = poller.placement_changes().await.unwrap();
        assert_ne!(moved, signalled);
        let (overrides, spent) = cost(&metrics, poller.placement_overrides()).await;
        assert_eq!(overrides.unwrap()["t/0"], BrokerId(3));
        assert_eq!(spent, (1, 1));
        mover.clear_placement_override("t/1").await.unwrap();
        let cleared = poller.placement_changes().await.unwrap();
        assert_ne!(cleared, moved);
        let (overrides, spent) = cost(&metrics, poller.placement_overrides()).await;
        assert_eq!(overrides.unwrap().len(), 2);
        assert_eq!(spent, (1, 0));
        assert_eq!(
            poller.cache().placements.len(),
            2,
            "the cleared one is forgotten"
        );
    }

    #[tokio::test]
    async fn a_failed_change_signal_does_not_fail_the_override() {
        use strata_storage::{Fault, FaultConfig, FaultInjectingStore, InjectedError};
        let faults = Arc::new(FaultInjectingStore::new(
            Arc::new(MemoryStore::new()),
            FaultConfig::none(),
            1,
        ));
        let ownership = Ownership::new(faults.clone());
        ownership
            .set_placement_override("t/0", BrokerId(2))
            .await
            .unwrap();
        let before = ownership.placement_changes().await.unwrap();
        // The override's update goes through, the marker's fails.
        faults.inject_next(OpKind::PutUpdate, Fault::Delay(std::time::Duration::ZERO));
        faults.fail_next(OpKind::PutUpdate, InjectedError::Unavailable);
        ownership
            .set_placement_override("t/0", BrokerId(3))
            .await
            .unwrap();
        assert_eq!(ownership.placement_changes().await.unwrap(), before);
        assert_eq!(
            ownership.placement_overrides().await.unwrap(),
            BTreeMap::from([("t/0".to_string(), BrokerId(3))])
        );
    }
}
