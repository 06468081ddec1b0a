//! The SCRAM users every broker reads from shared storage, with a short cache.
//!
//! One object per user (`strata_layout::users`). A lookup at authentication reads the cache;
//! an entry older than the cache's time to live is read again, so a change made through any
//! broker (or `strata users`) is seen everywhere within about that long. Changes are
//! read-modify-write with compare-and-swap: two brokers altering one user at once both land.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use strata_core::Clock;
use strata_layout::users::{self, StoredCredential, StoredUser};
use strata_layout::{cas, LayoutError};
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError};

use super::scram::{Credential, Mechanism, MAX_ITERATIONS, MIN_ITERATIONS};
use super::SecurityError;

/// How many times a change is retried when another writer got in between.
const CAS_ATTEMPTS: usize = 8;

/// One change of AlterUserScramCredentials.
#[derive(Debug, Clone)]
pub enum Change {
    Upsert(Credential),
    Delete(Mechanism),
}

/// When a user was read (monotonic), and what storage held: None for no such user.
type CacheEntry = (Duration, Option<Arc<StoredUser>>);

/// The user store over the cluster's storage.
#[derive(Debug)]
pub struct UserStore {
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    max_entries: usize,
    /// User name → (read at, what storage held). Unknown users are cached too (as None), so
    /// repeated attempts with made-up names cost one read per name per `ttl`.
    cache: Mutex<HashMap<String, CacheEntry>>,
    /// The key of unknown users' fake salts, shared by every broker through storage, so that
    /// two brokers give an unknown user the same salt as they would a real one.
    secret: tokio::sync::OnceCell<Arc<[u8]>>,
}

fn key(user: &str) -> Result<ObjectKey, SecurityError> {
    ObjectKey::new(users::key(user)).map_err(|e| SecurityError::Storage(LayoutError::Storage(e)))
}

fn storage(e: StorageError) -> SecurityError {
    SecurityError::Storage(LayoutError::Storage(e))
}

pub(crate) fn to_stored(credential: &Credential) -> StoredCredential {
    StoredCredential {
        mechanism: credential.mechanism.name().to_string(),
        salt: B64.encode(&credential.salt),
        iterations: credential.iterations,
        stored_key: B64.encode(&credential.stored_key),
        server_key: B64.encode(&credential.server_key),
    }
}

/// The credential stored for `mechanism`; None if there is none or it does not decode.
pub fn credential_of(user: &StoredUser, mechanism: Mechanism) -> Option<Credential> {
    let stored = user.credential(mechanism.name())?;
    Some(Credential {
        mechanism,
        salt: B64.decode(&stored.salt).ok()?,
        iterations: stored.iterations,
        stored_key: B64.decode(&stored.stored_key).ok()?,
        server_key: B64.decode(&stored.server_key).ok()?,
    })
}

/// Refuses a credential Kafka would refuse.
pub fn check_credential(user: &str, credential: &Credential) -> Result<(), SecurityError> {
    if user.is_empty() {
        return Err(SecurityError::Unacceptable(
            "Username must not be empty".into(),
        ));
    }
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&credential.iterations) {
        return Err(SecurityError::Unacceptable(format!(
            "Iterations {} must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}",
            credential.iterations
        )));
    }
    if credential.salt.is_empty() {
        return Err(SecurityError::Unacceptable("Salt must not be empty".into()));
    }
    Ok(())
}

impl UserStore {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        ttl: Duration,
        max_entries: usize,
    ) -> Self {
        Self {
            store,
            clock,
            ttl,
            max_entries: max_entries.max(1),
            cache: Mutex::new(HashMap::new()),
            secret: tokio::sync::OnceCell::new(),
        }
    }

    /// The cluster's fake-salt key, created by the first broker that needs it.
    pub async fn secret(&self) -> Result<Arc<[u8]>, SecurityError> {
        self.secret
            .get_or_try_init(|| async {
                let key = ObjectKey::new(users::SECRET_KEY).map_err(storage)?;
                let mut fresh = [0u8; 32];
                super::secure_random(&mut fresh)?;
                match self
                    .store
                    .put(&key, Bytes::copy_from_slice(&fresh), PutMode::Create)
                    .await
                {
                    Ok(_) => return Ok(Arc::from(fresh.as_slice())),
                    Err(StorageError::AlreadyExists(_)) => {}
                    Err(e) => return Err(storage(e)),
                }
                let (bytes, _) = self.store.get(&key).await.map_err(storage)?;
                Ok(Arc::from(bytes.as_ref()))
            })
            .await
            .cloned()
    }

    /// Reads `user` from storage: the object and its version, None if absent.
    async fn read(
        &self,
        user: &str,
    ) -> Result<Option<(StoredUser, strata_storage::Version)>, SecurityError> {
        // No user has an empty name (and its key would be the prefix itself).
        if user.is_empty() {
            return Ok(None);
        }
        let key = key(user)?;
        match self.store.get(&key).await {
            Ok((bytes, version)) => Ok(Some((StoredUser::decode(key.as_str(), &bytes)?, version))),
            Err(StorageError::NotFound(_)) => Ok(None),
            Err(e) => Err(storage(e)),
        }
    }

    /// `user`'s stored credentials, from the cache if read within the time to live.
    pub async fn lookup(&self, user: &str) -> Result<Option<Arc<StoredUser>>, SecurityError> {
        let now = self.clock.monotonic();
        if let Ok(cache) = self.cache.lock() {
            if let Some((at, found)) = cache.get(user) {
                if now.saturating_sub(*at) < self.ttl {
                    return Ok(found.clone());
                }
            }
        }
        let found = self
            .read(user)
            .await?
            .map(|(user, _)| user)
            .filter(|u| !u.credentials.is_empty())
            .map(Arc::new);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= self.max_entries {
                let ttl = self.ttl;
                cache.retain(|_, (at, _)| now.saturating_sub(*at) < ttl);
                if cache.len() >= self.max_entries {
                    // Every entry is fresh: made-up names are flooding in. Start over rather
                    // than grow; real users are read again on their next login.
                    cache.clear();
                }
            }
            cache.insert(user.to_string(), (now, found.clone()));
        }
        Ok(found)
    }

    /// Applies `changes` to `user` in one compare-and-swap (retried if another writer got in
    /// between). A deletion of a credential the user does not have is NotFound.
    pub async fn alter(&self, user: &str, changes: &[Change]) -> Result<(), SecurityError> {
        if user.is_empty() {
            return Err(SecurityError::Unacceptable(
                "Username must not be empty".into(),
            ));
        }
        let key = key(user)?;
        let written = cas::update(
            self.store.as_ref(),
            &key,
            CAS_ATTEMPTS,
            StoredUser::default,
            |stored: &mut StoredUser| {
                for change in changes {
                    match change {
                        Change::Upsert(credential) => {
                            check_credential(user, credential)?;
                            let name = credential.mechanism.name();
                            stored.credentials.retain(|c| c.mechanism != name);
                            stored.credentials.push(to_stored(credential));
                        }
                        Change::Delete(mechanism) => {
                            let before = stored.credentials.len();
                            stored
                                .credentials
                                .retain(|c| c.mechanism != mechanism.name());
                            if stored.credentials.len() == before {
                                return Err(SecurityError::NotFound(format!(
                                    "Attempt to delete a user credential that does not exist: {user} ({})",
                                    mechanism.name()
                                )));
                            }
                        }
                    }
                }
                stored
                    .credentials
                    .sort_by(|a, b| a.mechanism.cmp(&b.mechanism));
                Ok((true, ()))
            },
        )
        .await?;
        if written.is_none() {
            return Err(SecurityError::Contended(user.to_string()));
        }
        self.forget(user);
        Ok(())
    }

    /// Every user with at least one credential, by name.
    pub async fn list(&self) -> Result<Vec<(String, StoredUser)>, SecurityError> {
        let listed = self.store.list_keys(users::PREFIX).await.map_err(storage)?;
        let mut out = Vec::new();
        for listed in listed {
            let Some(name) = users::parse_key(listed.key.as_str()) else {
                continue;
            };
            if let Some((user, _)) = self.read(&name).await? {
                if !user.credentials.is_empty() {
                    out.push((name, user));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// `user` as stored now (not cached), None if it has no credential.
    pub async fn describe(&self, user: &str) -> Result<Option<StoredUser>, SecurityError> {
        Ok(self
            .read(user)
            .await?
            .map(|(u, _)| u)
            .filter(|u| !u.credentials.is_empty()))
    }

    /// Drops `user` from this broker's cache, after this broker changed it.
    fn forget(&self, user: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(user);
        }
    }
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;
    use strata_storage::MemoryStore;

    use super::*;

    fn credential(mechanism: Mechanism, password: &str) -> Credential {
        Credential::from_password(mechanism, password.as_bytes(), b"salt".to_vec(), 4096)
    }

    #[tokio::test]
    async fn two_brokers_altering_one_user_at_once_both_land() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let a = UserStore::new(Arc::clone(&store), Arc::clone(&clock), Duration::ZERO, 10);
        let b = UserStore::new(Arc::clone(&store), Arc::clone(&clock), Duration::ZERO, 10);
        let sha256 = [Change::Upsert(credential(Mechanism::Sha256, "p1"))];
        let sha512 = [Change::Upsert(credential(Mechanism::Sha512, "p2"))];
        let (x, y) = tokio::join!(a.alter("u", &sha256), b.alter("u", &sha512));
        x.unwrap();
        y.unwrap();
        let user = a.describe("u").await.unwrap().unwrap();
        let mut mechanisms: Vec<_> = user
            .credentials
            .iter()
            .map(|c| c.mechanism.clone())
            .collect();
        mechanisms.sort();
        assert_eq!(mechanisms, ["SCRAM-SHA-256", "SCRAM-SHA-512"]);
        assert!(credential_of(&user, Mechanism::Sha512)
            .unwrap()
            .verify_password(b"p2"));
    }

    #[tokio::test]
    async fn a_change_through_another_broker_is_seen_once_the_cache_entry_expires() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let ttl = Duration::from_secs(1);
        let reader = UserStore::new(Arc::clone(&store), Arc::clone(&dyn_clock), ttl, 10);
        let writer = UserStore::new(Arc::clone(&store), dyn_clock, ttl, 10);
        assert!(reader.lookup("u").await.unwrap().is_none());
        writer
            .alter("u", &[Change::Upsert(credential(Mechanism::Sha512, "p"))])
            .await
            .unwrap();
        assert!(reader.lookup("u").await.unwrap().is_none(), "cached miss");
        clock.advance(ttl);
        assert!(reader.lookup("u").await.unwrap().is_some());
        writer
            .alter("u", &[Change::Delete(Mechanism::Sha512)])
            .await
            .unwrap();
        clock.advance(ttl);
        assert!(
            reader.lookup("u").await.unwrap().is_none(),
            "a tombstone is no user"
        );
        assert!(reader.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn deleting_a_missing_credential_and_weak_credentials_are_refused() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let users = UserStore::new(store, Arc::new(ManualClock::new(0)), Duration::ZERO, 10);
        assert!(matches!(
            users.alter("u", &[Change::Delete(Mechanism::Sha256)]).await,
            Err(SecurityError::NotFound(_))
        ));
        let weak = Credential::from_password(Mechanism::Sha256, b"p", b"s".to_vec(), 1000);
        assert!(matches!(
            users.alter("u", &[Change::Upsert(weak)]).await,
            Err(SecurityError::Unacceptable(_))
        ));
        assert!(matches!(
            users
                .alter("", &[Change::Upsert(credential(Mechanism::Sha256, "p"))])
                .await,
            Err(SecurityError::Unacceptable(_))
        ));
    }

    #[tokio::test]
    async fn every_store_shares_one_fake_salt_key() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let a = UserStore::new(Arc::clone(&store), Arc::clone(&clock), Duration::ZERO, 10);
        let b = UserStore::new(store, clock, Duration::ZERO, 10);
        assert_eq!(a.secret().await.unwrap(), b.secret().await.unwrap());
    }

    #[tokio::test]
    async fn a_flood_of_unknown_names_keeps_the_cache_bounded() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let users = UserStore::new(
            store,
            Arc::new(ManualClock::new(0)),
            Duration::from_secs(60),
            5,
        );
        for i in 0..50 {
            users.lookup(&format!("nobody-{i}")).await.unwrap();
            assert!(users.cache.lock().unwrap().len() <= 5);
        }
    }
}
