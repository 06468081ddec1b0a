//! Offline operations on a cluster's coordination objects, for the command line (`strata
//! partitions move`, `strata broker drain`): they need only the storage, never a running broker
//! or a log (opening a log would register a write-ahead stream). Topics are looked up through
//! the read-only [`CatalogReader`].
//!
//! Draining: the registration object is written only by its owner, so an operator cannot set
//! the draining flag there. [`request_drain`] writes `cluster/drain/<id>` naming the
//! incarnation it saw registered; that broker polls it ([`drain_request`]) and marks itself
//! draining. A restarted broker is a new incarnation and ignores a request left over for its
//! predecessor.

use std::sync::Arc;

use strata_core::BrokerId;
use strata_layout::cluster::{
    parse_partition_resource, partition_resource as resource_of, DrainRequest,
};
use strata_layout::schema;
use strata_layout::{CatalogReader, LayoutError};
use strata_storage::{ObjectStore, PutMode, StorageError};

use crate::keys::{broker_key, drain_key, parse_broker_key, BROKERS_PREFIX, DRAIN_PREFIX};
use crate::{BrokerRegistration, ClusterError, Incarnation, OwnerRecord, OwnerState, Ownership};

/// What went wrong in an admin operation.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Cluster(#[from] ClusterError),
}

impl From<StorageError> for AdminError {
    fn from(e: StorageError) -> Self {
        AdminError::Cluster(e.into())
    }
}

impl From<LayoutError> for AdminError {
    fn from(e: LayoutError) -> Self {
        AdminError::Cluster(e.into())
    }
}

/// The ownership record of `resource`, if it was ever claimed.
pub async fn owner(
    store: Arc<dyn ObjectStore>,
    resource: &str,
) -> Result<Option<OwnerRecord>, AdminError> {
    Ok(Ownership::new(store).read(resource).await?.map(|(_, r)| r))
}

/// Places `resource` on `broker` (what `strata partitions move` and a reassignment do).
pub async fn set_placement(
    store: Arc<dyn ObjectStore>,
    resource: &str,
    broker: BrokerId,
) -> Result<(), AdminError> {
    Ok(Ownership::new(store)
        .set_placement_override(resource, broker)
        .await?)
}

/// The resource name of `topic`'s `partition`, from the newest catalog.
pub async fn partition_resource(
    store: &dyn ObjectStore,
    topic: &str,
    partition: i32,
) -> Result<String, AdminError> {
    let reader = CatalogReader::new(store);
    let Some(info) = reader.topic(topic).await? else {
        return Err(AdminError::NotFound(
            if reader.newest_version().await?.is_none() {
                "no topics exist yet".into()
            } else {
                format!("no topic {topic:?}")
            },
        ));
    };
    if partition < 0 || partition >= info.partitions {
        return Err(AdminError::NotFound(format!(
            "topic {topic:?} has partitions 0..{}",
            info.partitions
        )));
    }
    Ok(resource_of(info.id, partition))
}

/// The registration of `broker`, if it is registered (it may still be dead: liveness needs
/// watching over a lease, which the command line does not do).
pub async fn registration(
    store: &dyn ObjectStore,
    broker: BrokerId,
) -> Result<Option<BrokerRegistration>, AdminError> {
    let key = broker_key(broker)?;
    match store.get(&key).await {
        Ok((bytes, _)) => Ok(Some(BrokerRegistration::decode(&key, &bytes)?)),
        Err(StorageError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Asks `broker`'s current incarnation to drain; returns that incarnation.
pub async fn request_drain(
    store: &dyn ObjectStore,
    broker: BrokerId,
) -> Result<Incarnation, AdminError> {
    let registration = registration(store, broker)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("broker {broker} is not registered")))?;
    let key = drain_key(broker)?;
    let body = schema::encode(&DrainRequest {
        incarnation: registration.incarnation,
    })?;
    // Overwrite whatever an earlier request left (maybe for an earlier incarnation).
    let mode = match store.get(&key).await {
        Ok((_, version)) => PutMode::Update(version),
        Err(StorageError::NotFound(_)) => PutMode::Create,
        Err(e) => return Err(e.into()),
    };
    store.put(&key, body, mode).await?;
    Ok(registration.incarnation)
}

/// The incarnation of `broker` an operator asked to drain, if any (the broker's own poll).
pub async fn drain_request(
    store: &dyn ObjectStore,
    broker: BrokerId,
) -> Result<Option<Incarnation>, ClusterError> {
    let key = drain_key(broker)?;
    match store.get(&key).await {
        Ok((bytes, _)) => Ok(Some(
            schema::decode::<DrainRequest>(key.as_str(), &bytes)?.incarnation,
        )),
        Err(StorageError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How many partitions `broker` (as `incarnation`) holds Active.
pub async fn partitions_held(
    store: Arc<dyn ObjectStore>,
    broker: BrokerId,
    incarnation: Incarnation,
) -> Result<usize, AdminError> {
    let records = Ownership::new(store).list("").await?;
    Ok(records
        .iter()
        .filter(|(_, (_, r))| {
            r.owner == broker && r.incarnation == incarnation && r.state == OwnerState::Active
        })
        .count())
}

/// Whether `store` holds a cluster at all: a broker registered there, or a topic catalog.
/// Lets the commands refuse a mistyped storage URL instead of reporting "not registered".
pub async fn cluster_exists(store: &dyn ObjectStore) -> Result<bool, AdminError> {
    if !store.list_keys(BROKERS_PREFIX).await?.is_empty() {
        return Ok(true);
    }
    Ok(CatalogReader::new(store).newest_version().await?.is_some())
}

/// Every registered broker (live or not: a crashed one stays registered until the others
/// forget it, far beyond its lease), by node id.
pub async fn registrations(store: &dyn ObjectStore) -> Result<Vec<BrokerRegistration>, AdminError> {
    let mut registrations = Vec::new();
    for listed in store.list_keys(BROKERS_PREFIX).await? {
        if parse_broker_key(listed.key.as_str()).is_none() {
            continue;
        }
        match store.get(&listed.key).await {
            Ok((bytes, _)) => registrations.push(BrokerRegistration::decode(&listed.key, &bytes)?),
            // Left between the listing and the read.
            Err(StorageError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    registrations.sort_by_key(|r| r.node_id.0);
    Ok(registrations)
}

/// The incarnation each broker with a pending drain request was asked to drain as.
pub async fn drain_requests(
    store: &dyn ObjectStore,
) -> Result<Vec<(BrokerId, Incarnation)>, AdminError> {
    let mut requests = Vec::new();
    for listed in store.list_keys(DRAIN_PREFIX).await? {
        let Some(broker) = listed
            .key
            .as_str()
            .strip_prefix(DRAIN_PREFIX)
            .and_then(|id| id.parse().ok())
            .map(BrokerId)
        else {
            continue;
        };
        if let Some(incarnation) = drain_request(store, broker).await? {
            requests.push((broker, incarnation));
        }
    }
    Ok(requests)
}

/// Withdraws the drain request of `broker`; returns whether there was one. The broker notices
/// at its next drain poll and takes partitions again.
pub async fn cancel_drain(store: &dyn ObjectStore, broker: BrokerId) -> Result<bool, AdminError> {
    let key = drain_key(broker)?;
    match store.get(&key).await {
        Ok(_) => {}
        Err(StorageError::NotFound(_)) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    match store.delete(&key).await {
        Ok(()) | Err(StorageError::NotFound(_)) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// One partition's ownership record, with its topic's name when the catalog still has it.
#[derive(Debug, Clone)]
pub struct PartitionOwner {
    pub topic: Option<String>,
    pub partition: i32,
    pub resource: String,
    pub record: OwnerRecord,
}

/// Every partition's ownership record (the leases), named from the newest catalog.
pub async fn partition_owners(
    store: Arc<dyn ObjectStore>,
) -> Result<Vec<PartitionOwner>, AdminError> {
    let topics = CatalogReader::new(store.as_ref()).topics().await?;
    let records = Ownership::new(store).list("").await?;
    let mut owners: Vec<PartitionOwner> = records
        .into_iter()
        .filter_map(|(resource, (_, record))| {
            let (id, partition) = parse_partition_resource(&resource)?;
            let topic = topics
                .iter()
                .find(|t| t.id == id)
                .map(|t| t.name.to_string());
            Some(PartitionOwner {
                topic,
                partition,
                resource,
                record,
            })
        })
        .collect();
    owners.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(owners)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use strata_layout::TopicId;
    use strata_storage::{MemoryStore, ObjectKey};

    async fn put(store: &dyn ObjectStore, key: &str, body: &str) {
        store
            .put(
                &ObjectKey::new(key).unwrap(),
                Bytes::from(body.to_owned()),
                PutMode::Create,
            )
            .await
            .unwrap();
    }

    /// The catalog as the log writes it, registrations as membership writes them: the admin
    /// commands read both through their one definition.
    #[tokio::test]
    async fn finds_a_partition_and_drains_the_registered_incarnation() {
        let store = MemoryStore::new();
        assert!(matches!(
            partition_resource(&store, "orders", 0).await,
            Err(AdminError::NotFound(m)) if m == "no topics exist yet"
        ));
        let id = TopicId([7; 16]);
        put(
            &store,
            &strata_layout::catalog::version_key(1),
            &format!(
                r#"{{"version":1,"topics":{{"orders":{{"name":"orders","id":{:?},"partitions":2,"overrides":{{}},"config":{{"retention_ms":1}}}}}}}}"#,
                id.0
            ),
        )
        .await;
        assert_eq!(
            partition_resource(&store, "orders", 1).await.unwrap(),
            format!("{id}/1")
        );
        assert!(matches!(
            partition_resource(&store, "orders", 2).await,
            Err(AdminError::NotFound(_))
        ));
        assert!(matches!(
            partition_resource(&store, "other", 0).await,
            Err(AdminError::NotFound(m)) if m.contains("no topic")
        ));

        assert!(matches!(
            request_drain(&store, BrokerId(3)).await,
            Err(AdminError::NotFound(_))
        ));
        put(
            &store,
            "cluster/brokers/3",
            r#"{"node_id":3,"host":"h","port":9092,"incarnation":"00000000000000ab","started_ms":1,"heartbeat":4}"#,
        )
        .await;
        assert_eq!(
            request_drain(&store, BrokerId(3)).await.unwrap(),
            Incarnation(0xab)
        );
        assert_eq!(
            drain_request(&store, BrokerId(3)).await.unwrap(),
            Some(Incarnation(0xab))
        );
        assert_eq!(drain_request(&store, BrokerId(4)).await.unwrap(), None);
        // A second request (a restarted broker) replaces the first.
        request_drain(&store, BrokerId(3)).await.unwrap();

        assert!(cluster_exists(&store).await.unwrap());
        assert!(!cluster_exists(&MemoryStore::new()).await.unwrap());
        let registered = registrations(&store).await.unwrap();
        assert_eq!(registered.len(), 1);
        assert_eq!(registered[0].node_id, BrokerId(3));
        assert_eq!(
            drain_requests(&store).await.unwrap(),
            vec![(BrokerId(3), Incarnation(0xab))]
        );
        // Undrain: the request is gone, and a second cancel finds nothing.
        assert!(cancel_drain(&store, BrokerId(3)).await.unwrap());
        assert_eq!(drain_request(&store, BrokerId(3)).await.unwrap(), None);
        assert!(!cancel_drain(&store, BrokerId(3)).await.unwrap());
    }
}
