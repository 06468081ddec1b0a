//! The quota objects in shared storage (`strata_layout::quotas`): read whole into a
//! [`QuotaTable`], changed entity by entity with compare-and-swap, and watched through a change
//! marker so that every broker applies a change made anywhere within about one
//! `quota_refresh_interval`, at the cost of one small read per interval when nothing changes.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use strata_core::Clock;
use strata_layout::quotas::{self, StoredQuota};
use strata_layout::{cas, LayoutError};
use strata_storage::{ObjectKey, ObjectStore, StorageError, Version};
use tracing::{debug, warn};

use super::model::{Entity, QuotaKind, QuotaTable};
use super::Quotas;

/// How many times a change is retried when another writer got in between.
const CAS_ATTEMPTS: usize = 8;

/// What can go wrong changing or reading quotas: the quota layer's one error enum, mapped to
/// Kafka codes in [`crate::errors`].
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// An entity, key or value Kafka would refuse (INVALID_REQUEST).
    #[error("{0}")]
    Invalid(String),
    /// The quota objects could not be read or written.
    #[error("quota store: {0}")]
    Storage(#[from] LayoutError),
    /// Another broker kept changing the entity while we tried to; the client may retry.
    #[error("quota entity changed concurrently too many times")]
    Contended,
    /// The principal may not alter quotas (ALTER_CONFIGS on the cluster, with the ACL
    /// authorizer on).
    #[error("altering client quotas needs ALTER_CONFIGS on the cluster")]
    NotAuthorized,
}

fn storage(e: StorageError) -> QuotaError {
    QuotaError::Storage(LayoutError::Storage(e))
}

fn object_key(key: impl AsRef<str>) -> Result<ObjectKey, QuotaError> {
    ObjectKey::new(key).map_err(storage)
}

/// One operation of AlterClientQuotas: set `key` to a value, or remove it (None).
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub kind: QuotaKind,
    pub value: Option<f64>,
}

/// Validates one AlterClientQuotas op as Kafka does: a known key, and a value the key accepts
/// (whole and at least 1 for the byte rates, positive for the request percentage).
pub fn parse_op(key: &str, value: f64, remove: bool) -> Result<Op, QuotaError> {
    let Some(kind) = QuotaKind::from_key(key) else {
        return Err(QuotaError::Invalid(format!(
            "Invalid configuration key {key}"
        )));
    };
    if remove {
        return Ok(Op { kind, value: None });
    }
    if !value.is_finite() || value <= 0.0 {
        return Err(QuotaError::Invalid(format!(
            "Configuration {key} must be greater than 0"
        )));
    }
    if kind != QuotaKind::Request && value.fract() != 0.0 {
        return Err(QuotaError::Invalid(format!(
            "Configuration {key} must be a whole number"
        )));
    }
    Ok(Op {
        kind,
        value: Some(value),
    })
}

/// The quota objects over the cluster's storage.
#[derive(Debug)]
pub struct QuotaStore {
    store: Arc<dyn ObjectStore>,
    /// Held across a load and its install ([`reload_into`](Self::reload_into)): without it
    /// the watcher could list the quotas, an alter here write and install its own reload,
    /// and the watcher then install what it listed before the alter.
    reloading: tokio::sync::Mutex<()>,
}

impl QuotaStore {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    /// Loads the table and makes it what `quotas` enforces; loads run one at a time, so the
    /// last one installed is the last one read.
    pub async fn reload_into(&self, quotas: &Quotas) -> Result<(), QuotaError> {
        let _one_at_a_time = self.reloading.lock().await;
        let table = self.load().await?;
        debug!(entities = ?table, "client quotas loaded");
        quotas.replace_table(table);
        Ok(())
    }

    /// Every stored entity with at least one value.
    pub async fn load(&self) -> Result<QuotaTable, QuotaError> {
        let listed = self
            .store
            .list_keys(quotas::PREFIX)
            .await
            .map_err(storage)?;
        let mut objects = Vec::with_capacity(listed.len());
        for listed in listed {
            match self.store.get(&listed.key).await {
                Ok((bytes, _)) => objects.push(StoredQuota::decode(listed.key.as_str(), &bytes)?),
                // Listed, then gone: nothing deletes quota objects, but a hand-cleaned store
                // should not stop every broker from loading the rest.
                Err(StorageError::NotFound(_)) => continue,
                Err(e) => return Err(storage(e)),
            }
        }
        Ok(QuotaTable::from_stored(objects))
    }

    /// Applies `ops` to `entity` in one compare-and-swap (retried if another writer got in
    /// between), then bumps the change marker.
    pub async fn alter(&self, entity: &Entity, ops: &[Op]) -> Result<(), QuotaError> {
        let parts = entity.to_stored();
        let key = object_key(quotas::key(&parts))?;
        let fresh = || StoredQuota {
            entity: parts.clone(),
            values: BTreeMap::new(),
        };
        let written = cas::update(
            self.store.as_ref(),
            &key,
            CAS_ATTEMPTS,
            fresh,
            |stored: &mut StoredQuota| {
                for op in ops {
                    match op.value {
                        Some(value) => stored.values.insert(op.kind.key().to_string(), value),
                        None => stored.values.remove(op.kind.key()),
                    };
                }
                Ok::<_, QuotaError>((true, ()))
            },
        )
        .await?;
        if written.is_none() {
            return Err(QuotaError::Contended);
        }
        cas::bump_marker(self.store.as_ref(), &object_key(quotas::CHANGES_KEY)?).await?;
        Ok(())
    }

    /// The marker's version, None while no quota was ever changed.
    async fn marker(&self) -> Result<Option<Version>, QuotaError> {
        Ok(cas::marker_version(self.store.as_ref(), &object_key(quotas::CHANGES_KEY)?).await?)
    }

    /// Loads the table into `quotas` whenever the change marker moves, every
    /// `refresh_interval`, until `quotas` is dropped. A failed read is retried next interval;
    /// the broker keeps enforcing what it last read meanwhile.
    pub async fn watch(self: Arc<Self>, quotas: Weak<Quotas>, clock: Arc<dyn Clock>) {
        let Some(interval) = quotas.upgrade().map(|q| q.settings().refresh_interval) else {
            return;
        };
        let mut ticker = strata_core::Ticker::new(clock, interval);
        let mut seen: Option<Option<Version>> = None;
        loop {
            ticker.tick().await;
            let marker = match self.marker().await {
                Ok(marker) => marker,
                Err(e) => {
                    warn!(error = %e, "could not read the quota change marker");
                    continue;
                }
            };
            if seen.as_ref() == Some(&marker) {
                if quotas.strong_count() == 0 {
                    return;
                }
                continue;
            }
            let Some(quotas) = quotas.upgrade() else {
                return;
            };
            match self.reload_into(&quotas).await {
                Ok(()) => seen = Some(marker),
                Err(e) => warn!(error = %e, "could not read the client quotas"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use strata_core::clock::ManualClock;
    use strata_storage::MemoryStore;

    use super::super::model::Name;
    use super::super::{QuotaSettings, Window};
    use super::*;
    use crate::tests::held_listing::HeldListing;

    fn quotas(clock: Arc<dyn Clock>) -> Arc<Quotas> {
        Arc::new(Quotas::new(
            QuotaSettings {
                window: Window {
                    samples: 11,
                    size: Duration::from_secs(1),
                },
                max_throttle: Duration::from_secs(30),
                max_tracked: 10,
                refresh_interval: Duration::from_secs(1),
            },
            clock,
        ))
    }

    fn client(name: &str) -> Entity {
        Entity {
            user: None,
            client_id: Some(Name::Named(name.into())),
        }
    }

    #[tokio::test]
    async fn alterations_through_two_stores_at_once_both_land_and_removal_leaves_nothing() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let a = QuotaStore::new(Arc::clone(&store));
        let b = QuotaStore::new(Arc::clone(&store));
        let produce = [parse_op("producer_byte_rate", 1000.0, false).unwrap()];
        let fetch = [parse_op("consumer_byte_rate", 2000.0, false).unwrap()];
        let c = client("c");
        let (x, y) = tokio::join!(a.alter(&c, &produce), b.alter(&c, &fetch));
        x.unwrap();
        y.unwrap();
        let table = a.load().await.unwrap();
        assert_eq!(
            table.resolve(QuotaKind::Produce, "u", "c").unwrap().0,
            1000.0
        );
        assert_eq!(table.resolve(QuotaKind::Fetch, "u", "c").unwrap().0, 2000.0);
        let remove = [
            parse_op("producer_byte_rate", 0.0, true).unwrap(),
            parse_op("consumer_byte_rate", 0.0, true).unwrap(),
        ];
        b.alter(&client("c"), &remove).await.unwrap();
        assert!(a.load().await.unwrap().is_empty());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(parse_op("producer_byte_rate", 1.0, false).is_ok());
        assert!(parse_op("request_percentage", 12.5, false).is_ok());
        assert!(parse_op("producer_byte_rate", 0.0, true).is_ok());
        for (key, value) in [
            ("nonsense", 1.0),
            ("producer_byte_rate", -1.0),
            ("producer_byte_rate", 0.0),
            ("consumer_byte_rate", 1.5),
            ("request_percentage", f64::NAN),
        ] {
            assert!(
                matches!(parse_op(key, value, false), Err(QuotaError::Invalid(_))),
                "{key} {value}"
            );
        }
    }

    /// Lets spawned tasks run until they wait on the (manual) clock again.
    async fn settle() {
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_watcher_applies_a_change_made_elsewhere_within_one_interval() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let quotas = quotas(Arc::clone(&dyn_clock));
        let watcher = Arc::new(QuotaStore::new(Arc::clone(&store)));
        let task = tokio::spawn(watcher.watch(Arc::downgrade(&quotas), dyn_clock));
        settle().await;
        assert!(quotas.table().is_empty());
        QuotaStore::new(store)
            .alter(
                &client("c"),
                &[parse_op("producer_byte_rate", 5.0, false).unwrap()],
            )
            .await
            .unwrap();
        settle().await;
        assert!(quotas.table().is_empty(), "not before the next tick");
        clock.advance(Duration::from_secs(1));
        settle().await;
        assert_eq!(
            quotas
                .table()
                .resolve(QuotaKind::Produce, "u", "c")
                .unwrap()
                .0,
            5.0
        );
        drop(quotas);
        clock.advance(Duration::from_secs(1));
        settle().await;
        assert!(task.is_finished(), "the watcher ends with its broker");
    }

    /// An alter through this broker is enforced here once AlterClientQuotas answers, even if
    /// the watcher listed the quotas just before it and installs after.
    #[tokio::test]
    async fn a_reload_listed_before_an_alter_does_not_undo_it() {
        let held = Arc::new(HeldListing::new(quotas::PREFIX, quotas::CHANGES_KEY));
        let store: Arc<dyn ObjectStore> = held.clone();
        let table = quotas(Arc::new(ManualClock::new(0)));
        let here = Arc::new(QuotaStore::new(store));
        let hold = held.arm();
        let watching = tokio::spawn({
            let (here, table) = (Arc::clone(&here), Arc::clone(&table));
            async move { here.reload_into(&table).await }
        });
        hold.holding.await.unwrap();
        let altered = async {
            let op = parse_op("producer_byte_rate", 5.0, false).unwrap();
            here.alter(&client("c"), &[op]).await?;
            // What the AlterClientQuotas handler does after a change.
            here.reload_into(&table).await
        };
        let (altered, ()) = tokio::join!(altered, async {
            hold.written.await.unwrap();
            hold.release.send(()).unwrap();
        });
        altered.unwrap();
        watching.await.unwrap().unwrap();
        let enforced = table.table().resolve(QuotaKind::Produce, "u", "c");
        assert_eq!(enforced.map(|(rate, _)| rate), Some(5.0));
    }
}
