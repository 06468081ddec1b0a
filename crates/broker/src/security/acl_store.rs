//! The ACL bindings every broker reads from shared storage and enforces from memory.
//!
//! One object per resource pattern (`strata_layout::acls`), changed by compare-and-swap, then
//! the change marker `security/acls-changes` is bumped. Every broker keeps the whole set as an
//! immutable [`AclSnapshot`] behind an `Arc` (a check clones the `Arc` and does no IO) and
//! polls the marker every `acl_refresh_interval`: one small read while nothing changes, and a
//! listing plus one read per resource when it does. A writer writes the bindings before it
//! bumps the marker, so a broker that sees the new marker reads bindings at least that new.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use strata_core::Clock;
use strata_layout::acls::{self, StoredAcls, StoredBinding};
use strata_layout::{cas, LayoutError};
use strata_storage::{ObjectKey, ObjectStore, StorageError, Version};
use tracing::{debug, warn};

use super::acl::{
    AccessEntry, AclBinding, AclFilter, AclSnapshot, AuthorizerConfig, Operation, PatternType,
    Permission, ResourcePattern, ResourceType,
};
use super::SecurityError;

/// How many times a change is retried when another writer got in between.
const CAS_ATTEMPTS: usize = 8;

fn storage(e: StorageError) -> SecurityError {
    SecurityError::Storage(LayoutError::Storage(e))
}

fn object_key(pattern: &ResourcePattern) -> Result<ObjectKey, SecurityError> {
    let key = acls::key(
        &pattern.resource_type.name().to_ascii_lowercase(),
        &pattern.pattern_type.name().to_ascii_lowercase(),
        &pattern.name,
    );
    ObjectKey::new(key).map_err(storage)
}

fn pattern_of_key(key: &str) -> Option<ResourcePattern> {
    let (resource_type, pattern_type, name) = acls::parse_key(key)?;
    Some(ResourcePattern {
        resource_type: ResourceType::from_name(&resource_type)?,
        pattern_type: PatternType::from_name(&pattern_type)?,
        name,
    })
}

fn to_stored(entry: &AccessEntry) -> StoredBinding {
    StoredBinding {
        principal: entry.principal.clone(),
        host: entry.host.clone(),
        operation: entry.operation.name().to_string(),
        permission: entry.permission.name().to_string(),
    }
}

/// None for a binding of an operation or permission this build does not know (written by a
/// newer one): it is kept in storage and ignored here.
fn from_stored(stored: &StoredBinding) -> Option<AccessEntry> {
    Some(AccessEntry {
        principal: stored.principal.clone(),
        host: stored.host.clone(),
        operation: Operation::from_name(&stored.operation)?,
        permission: Permission::from_name(&stored.permission)?,
    })
}

/// The ACLs of the cluster as this broker knows them, and how to change them.
#[derive(Debug)]
pub struct AclStore {
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    config: AuthorizerConfig,
    refresh_interval: Duration,
    snapshot: RwLock<Arc<AclSnapshot>>,
    /// Held across a whole reload (marker read, listing, reads, install). Without it the
    /// periodic refresher could list the bindings, then a change here write, bump and install
    /// its own reload, and then the refresher install what it listed before the change: the
    /// change this broker just acknowledged would go unenforced here until the next poll.
    reloading: tokio::sync::Mutex<()>,
    /// The marker's version when the snapshot was read; None before the first read or when
    /// there is no marker yet.
    seen: Mutex<Option<Version>>,
    /// Denied checks by (resource type, operation), for the metrics endpoint.
    denied: Mutex<BTreeMap<(ResourceType, Operation), u64>>,
}

impl AclStore {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        config: AuthorizerConfig,
        refresh_interval: Duration,
    ) -> Self {
        Self {
            store,
            clock,
            config,
            refresh_interval,
            snapshot: RwLock::new(Arc::new(AclSnapshot::default())),
            reloading: tokio::sync::Mutex::new(()),
            seen: Mutex::new(None),
            denied: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn config(&self) -> &AuthorizerConfig {
        &self.config
    }

    /// The bindings as of the last read: no IO.
    pub fn snapshot(&self) -> Arc<AclSnapshot> {
        match self.snapshot.read() {
            Ok(s) => Arc::clone(&s),
            // A poisoned lock only means a writer panicked mid-swap of an Arc: the value is
            // whole either way.
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn install(&self, snapshot: AclSnapshot) {
        let snapshot = Arc::new(snapshot);
        match self.snapshot.write() {
            Ok(mut s) => *s = snapshot,
            Err(poisoned) => *poisoned.into_inner() = snapshot,
        }
    }

    /// Counts one denied check.
    pub fn count_denied(&self, resource_type: ResourceType, operation: Operation) {
        if let Ok(mut denied) = self.denied.lock() {
            *denied.entry((resource_type, operation)).or_default() += 1;
        }
    }

    /// Denied checks so far by (resource type, operation).
    pub fn denied_snapshot(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.denied
            .lock()
            .map(|d| {
                d.iter()
                    .map(|((t, o), n)| (t.name(), o.name(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn marker_version(&self) -> Result<Option<Version>, SecurityError> {
        let key = ObjectKey::new(acls::CHANGES_KEY).map_err(storage)?;
        Ok(cas::marker_version(self.store.as_ref(), &key).await?)
    }

    /// Every stored object: its pattern, entries and version.
    async fn read_all(&self) -> Result<Vec<(ResourcePattern, StoredAcls, Version)>, SecurityError> {
        let listed = self.store.list_keys(acls::PREFIX).await.map_err(storage)?;
        let mut out = Vec::with_capacity(listed.len());
        for listed in listed {
            let Some(pattern) = pattern_of_key(listed.key.as_str()) else {
                debug!(key = %listed.key.as_str(), "not an ACL object this build knows; ignored");
                continue;
            };
            match self.store.get(&listed.key).await {
                Ok((bytes, version)) => {
                    let stored = StoredAcls::decode(listed.key.as_str(), &bytes)?;
                    out.push((pattern, stored, version));
                }
                // Deleted between the listing and the read: nothing to enforce.
                Err(StorageError::NotFound(_)) => {}
                Err(e) => return Err(storage(e)),
            }
        }
        Ok(out)
    }

    /// Reads every binding from storage and makes them the enforced set. Reloads run one at a
    /// time, so the last one installed is the last one read.
    pub async fn reload(&self) -> Result<(), SecurityError> {
        let _one_at_a_time = self.reloading.lock().await;
        let marker = self.marker_version().await?;
        let objects = self.read_all().await?;
        let bindings = objects.iter().flat_map(|(pattern, stored, _)| {
            stored.bindings.iter().filter_map(|b| {
                Some(AclBinding {
                    pattern: pattern.clone(),
                    entry: from_stored(b)?,
                })
            })
        });
        self.install(AclSnapshot::new(bindings));
        if let Ok(mut seen) = self.seen.lock() {
            *seen = marker;
        }
        Ok(())
    }

    /// Reloads if the change marker moved since the last read: one small read otherwise.
    pub async fn refresh(&self) -> Result<bool, SecurityError> {
        let current = self.marker_version().await?;
        let unchanged = self.seen.lock().map(|s| *s == current).unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        self.reload().await?;
        Ok(true)
    }

    /// Polls the marker every `refresh_interval` until the store is dropped.
    pub fn spawn_refresher(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let clock = Arc::clone(&self.clock);
        let interval = self.refresh_interval;
        tokio::spawn(async move {
            loop {
                clock.sleep(interval).await;
                let Some(store) = weak.upgrade() else { break };
                if let Err(e) = store.refresh().await {
                    // The previous snapshot stays enforced; the next poll tries again.
                    warn!(error = %e, "could not refresh the ACLs from storage");
                }
            }
        });
    }

    /// Bumps the change marker so every broker reloads.
    async fn bump_marker(&self) -> Result<(), SecurityError> {
        let key = ObjectKey::new(acls::CHANGES_KEY).map_err(storage)?;
        Ok(cas::bump_marker(self.store.as_ref(), &key).await?)
    }

    /// Read-modify-write of one resource's object by compare-and-swap; `change` edits the
    /// entries and says whether anything changed.
    async fn update<T>(
        &self,
        pattern: &ResourcePattern,
        mut change: impl FnMut(&mut Vec<StoredBinding>) -> (bool, T),
    ) -> Result<T, SecurityError> {
        let key = object_key(pattern)?;
        let updated = cas::update(
            self.store.as_ref(),
            &key,
            CAS_ATTEMPTS,
            StoredAcls::default,
            |stored: &mut StoredAcls| {
                let (changed, out) = change(&mut stored.bindings);
                stored.bindings.sort();
                Ok::<_, SecurityError>((changed, out))
            },
        )
        .await?;
        updated.ok_or_else(|| SecurityError::Contended(pattern.name.clone()))
    }

    /// Adds `bindings` (already validated); one result per binding, in order. Adding one that
    /// exists is a success that changes nothing, as in Kafka.
    pub async fn create(&self, bindings: &[AclBinding]) -> Vec<Result<(), SecurityError>> {
        let mut by_pattern: HashMap<&ResourcePattern, Vec<usize>> = HashMap::new();
        for (i, b) in bindings.iter().enumerate() {
            by_pattern.entry(&b.pattern).or_default().push(i);
        }
        let mut results: Vec<Option<Result<(), SecurityError>>> =
            bindings.iter().map(|_| None).collect();
        let mut any_written = false;
        for (pattern, indices) in by_pattern {
            let outcome = self
                .update(pattern, |stored| {
                    let mut changed = false;
                    for &i in &indices {
                        let entry = to_stored(&bindings[i].entry);
                        if !stored.contains(&entry) {
                            stored.push(entry);
                            changed = true;
                        }
                    }
                    (changed, changed)
                })
                .await;
            for &i in &indices {
                results[i] = Some(match &outcome {
                    Ok(_) => Ok(()),
                    Err(e) => Err(SecurityError::AclStorage(e.to_string())),
                });
            }
            any_written |= matches!(outcome, Ok(true));
        }
        if any_written {
            if let Err(e) = self.after_change().await {
                warn!(error = %e, "ACLs written but the change marker could not be bumped");
                return bindings
                    .iter()
                    .map(|_| Err(SecurityError::AclStorage(e.to_string())))
                    .collect();
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(SecurityError::AclStorage("binding not handled".into())))
            })
            .collect()
    }

    /// Deletes the bindings each filter matches, from what storage holds now (not the
    /// snapshot): one result per filter, with the bindings it deleted.
    pub async fn delete(
        &self,
        filters: &[AclFilter],
    ) -> Result<Vec<Result<Vec<AclBinding>, SecurityError>>, SecurityError> {
        let objects = self.read_all().await?;
        let mut results = Vec::with_capacity(filters.len());
        let mut any_deleted = false;
        for filter in filters {
            let mut deleted = Vec::new();
            let mut failure = None;
            for (pattern, _, _) in &objects {
                if !filter.may_match_pattern(pattern) {
                    continue;
                }
                let outcome = self
                    .update(pattern, |stored| {
                        let mut gone = Vec::new();
                        stored.retain(|b| match from_stored(b) {
                            Some(entry) if filter.matches_parts(pattern, &entry) => {
                                gone.push(entry);
                                false
                            }
                            _ => true,
                        });
                        (!gone.is_empty(), gone)
                    })
                    .await;
                match outcome {
                    Ok(gone) => deleted.extend(gone.into_iter().map(|entry| AclBinding {
                        pattern: pattern.clone(),
                        entry,
                    })),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            any_deleted |= !deleted.is_empty();
            results.push(match failure {
                Some(e) => Err(e),
                None => Ok(deleted),
            });
        }
        if any_deleted {
            self.after_change().await?;
        }
        Ok(results)
    }

    /// After this broker changed bindings: tell the others, and enforce them here at once.
    async fn after_change(&self) -> Result<(), SecurityError> {
        self.bump_marker().await?;
        self.reload().await
    }
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;
    use strata_storage::MemoryStore;

    use super::*;
    use crate::security::acl::PatternFilter;
    use crate::tests::held_listing::HeldListing;

    fn read_topic(principal: &str, name: &str, pattern_type: PatternType) -> AclBinding {
        AclBinding {
            pattern: ResourcePattern {
                resource_type: ResourceType::Topic,
                pattern_type,
                name: name.into(),
            },
            entry: AccessEntry {
                principal: principal.into(),
                host: "*".into(),
                operation: Operation::Read,
                permission: Permission::Allow,
            },
        }
    }

    fn stores() -> (AclStore, AclStore) {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let make = || {
            AclStore::new(
                Arc::clone(&store),
                Arc::clone(&clock),
                AuthorizerConfig::default(),
                Duration::from_secs(1),
            )
        };
        (make(), make())
    }

    #[tokio::test]
    async fn two_brokers_adding_to_one_resource_at_once_both_land() {
        let (a, b) = stores();
        let alice = [read_topic("User:alice", "t", PatternType::Literal)];
        let bob = [read_topic("User:bob", "t", PatternType::Literal)];
        let (x, y) = tokio::join!(a.create(&alice), b.create(&bob));
        assert!(x.iter().chain(y.iter()).all(|r| r.is_ok()));
        a.reload().await.unwrap();
        assert_eq!(a.snapshot().bindings().len(), 2);
    }

    #[tokio::test]
    async fn a_change_through_one_broker_is_seen_by_the_others_next_refresh() {
        let (a, b) = stores();
        b.reload().await.unwrap();
        assert!(!b.refresh().await.unwrap(), "nothing changed yet");
        let binding = read_topic("User:alice", "t", PatternType::Literal);
        assert!(a.create(std::slice::from_ref(&binding)).await[0].is_ok());
        assert_eq!(a.snapshot().bindings(), vec![binding.clone()]);
        assert!(b.refresh().await.unwrap());
        assert_eq!(b.snapshot().bindings(), vec![binding]);
        assert!(!b.refresh().await.unwrap());

        let filter = AclFilter {
            resource_type: Some(ResourceType::Topic),
            name: Some("t".into()),
            pattern: PatternFilter::Match,
            ..AclFilter::any()
        };
        let deleted = b.delete(&[filter]).await.unwrap();
        assert_eq!(deleted[0].as_ref().unwrap().len(), 1);
        assert!(a.refresh().await.unwrap());
        assert!(a.snapshot().is_empty());
    }

    #[tokio::test]
    async fn delete_takes_only_what_the_filter_matches() {
        let (a, _) = stores();
        let keep = read_topic("User:bob", "app-", PatternType::Prefixed);
        let drop = read_topic("User:alice", "app-", PatternType::Prefixed);
        let results = a.create(&[keep.clone(), drop.clone()]).await;
        assert!(results.iter().all(|r| r.is_ok()));
        let filter = AclFilter {
            principal: Some("User:alice".into()),
            ..AclFilter::any()
        };
        let deleted = a.delete(&[filter]).await.unwrap();
        assert_eq!(deleted[0].as_ref().unwrap(), &vec![drop]);
        assert_eq!(a.snapshot().bindings(), vec![keep]);
    }

    /// A binding this broker acknowledged is enforced here when CreateAcls returns, even if
    /// the periodic refresher was between its listing and its install when the change landed
    /// (a TLS end-to-end test saw the producer refused just after its ACL was added).
    #[tokio::test]
    async fn a_refresh_listed_before_a_change_does_not_undo_it() {
        let held = Arc::new(HeldListing::new(acls::PREFIX, acls::CHANGES_KEY));
        let store: Arc<dyn ObjectStore> = held.clone();
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let make = || {
            Arc::new(AclStore::new(
                Arc::clone(&store),
                Arc::clone(&clock),
                AuthorizerConfig::default(),
                Duration::from_secs(1),
            ))
        };
        let (here, other) = (make(), make());
        here.reload().await.unwrap();
        // Another broker changes something, so this one's next refresh reloads...
        let bob = read_topic("User:bob", "b", PatternType::Literal);
        assert!(other.create(std::slice::from_ref(&bob)).await[0].is_ok());
        // ...and that reload is held after listing only bob's binding.
        let hold = held.arm();
        let refreshing = tokio::spawn({
            let here = Arc::clone(&here);
            async move { here.refresh().await }
        });
        hold.holding.await.unwrap();
        let alice = read_topic("User:alice", "a", PatternType::Literal);
        let (created, ()) = tokio::join!(here.create(std::slice::from_ref(&alice)), async {
            // Let the held listing go once alice's binding is written and the marker bumped.
            hold.written.await.unwrap();
            hold.release.send(()).unwrap();
        });
        assert!(created[0].is_ok());
        assert!(refreshing.await.unwrap().unwrap());
        let mut enforced = here.snapshot().bindings();
        enforced.sort_by(|x, y| x.entry.principal.cmp(&y.entry.principal));
        assert_eq!(enforced, vec![alice, bob]);
    }
}
