//! Node ids chosen by the cluster rather than by the operator.
//!
//! A broker started without a node id gets one through the storage's conditional writes, like
//! everything else here: it registers under the lowest id not yet registered, create-only, so
//! two brokers starting at once can never both get the same id — the loser's create fails and
//! it tries the next one.
//!
//! Two ranges keep hand-set and allocated ids apart, as Kafka does with
//! `reserved.broker.max.id`: operators set ids up to [`MAX_CONFIGURED_NODE_ID`], allocation
//! starts at [`FIRST_ALLOCATED_NODE_ID`]. A broker configured with id 7 therefore never finds
//! id 7 taken by a broker that merely started first.
//!
//! A broker restarted after a crash should come back under its old id, so that clients'
//! cached metadata stays right and its partitions are fenced at once instead of after a lease.
//! The registrations say which process wrote them ([`crate::process`]): an allocated id whose
//! process provably no longer runs on this machine is taken over first (preferring the one that
//! advertised our own address). Anything not provable — another machine, another container —
//! is left alone, and its lease decides as usual.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_core::{BrokerId, Clock};
use strata_storage::ObjectStore;

use crate::membership::{
    read_registrations, BrokerRegistration, Incarnation, JoinProgress, LocalBroker, Membership,
    MembershipConfig,
};
use crate::process::ProcessTable;
use crate::{ClusterError, ClusterResult};

/// The highest id an operator may set (Kafka's default `reserved.broker.max.id`).
pub const MAX_CONFIGURED_NODE_ID: i32 = 1000;
/// The first id handed out by allocation.
pub const FIRST_ALLOCATED_NODE_ID: i32 = MAX_CONFIGURED_NODE_ID + 1;

/// How many ids one start may find taken under it before giving up. Each miss means another
/// broker registered between our listing and our write; this many in a row means something
/// else is wrong (a store that reports every create as a conflict, say).
const MAX_ATTEMPTS: usize = 64;

/// Who is starting, apart from the id it is about to get.
#[derive(Debug, Clone)]
pub struct Newcomer {
    pub host: String,
    pub port: u16,
    pub incarnation: Incarnation,
    /// Named listeners' endpoints (see `BrokerRegistration::listeners`).
    pub listeners: Vec<crate::membership::ListenerEndpoint>,
}

/// What one listing of the registrations says about allocated ids.
#[derive(Debug, Default)]
struct Registered {
    /// Every registered id, readable or not (an unreadable registration still holds its id).
    ids: BTreeMap<BrokerId, Option<BrokerRegistration>>,
}

impl Registered {
    /// The allocated id of a crashed predecessor on this machine, if any: one that advertised
    /// our address first, else the lowest.
    fn predecessor(&self, me: &Newcomer, processes: &dyn ProcessTable) -> Option<BrokerId> {
        let gone: Vec<&BrokerRegistration> = self
            .ids
            .iter()
            .filter(|(id, _)| id.0 >= FIRST_ALLOCATED_NODE_ID)
            .filter_map(|(_, registration)| registration.as_ref())
            .filter(|r| r.process.as_ref().is_some_and(|p| processes.is_gone(p)))
            .collect();
        gone.iter()
            .find(|r| r.host == me.host && r.port == me.port)
            .or_else(|| gone.first())
            .map(|r| r.node_id)
    }

    /// The lowest allocated id nobody has registered.
    fn lowest_free(&self) -> ClusterResult<BrokerId> {
        (FIRST_ALLOCATED_NODE_ID..=i32::MAX)
            .map(BrokerId)
            .find(|id| !self.ids.contains_key(id))
            .ok_or_else(|| ClusterError::Invalid("every node id is registered".to_string()))
    }
}

async fn list_registrations(store: &dyn ObjectStore) -> ClusterResult<Registered> {
    // An unreadable registration still holds its id.
    let ids = read_registrations(store)
        .await?
        .into_iter()
        .map(|(id, (read, _))| (id, read.ok()))
        .collect();
    Ok(Registered { ids })
}

/// Registers under an allocated node id and returns the membership, registered and with a
/// first view of the cluster (as [`Membership::join`] leaves it). Transient storage errors are
/// retried every heartbeat interval, as joining does.
pub async fn join_with_allocated_id(
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    config: MembershipConfig,
    me: Newcomer,
    processes: Arc<dyn ProcessTable>,
) -> ClusterResult<Membership> {
    let mut misses = 0;
    loop {
        match try_allocate(&store, &clock, config, &me, &processes).await {
            Ok(Some(mut membership)) => {
                if let Err(e) = membership.refresh().await {
                    tracing::warn!(error = %e,
                        "first membership listing failed; the next round retries");
                }
                return Ok(membership);
            }
            Ok(None) => {
                misses += 1;
                if misses >= MAX_ATTEMPTS {
                    return Err(ClusterError::Invalid(format!(
                        "could not allocate a node id: {misses} candidates were registered by \
                         others first"
                    )));
                }
                // Somebody else won that id: look again at once.
                continue;
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "allocating a node id failed; retrying");
            }
            Err(e) => return Err(e),
        }
        clock.sleep(config.heartbeat_interval).await;
    }
}

/// One attempt: the registered membership, or None when the chosen id was taken under us.
async fn try_allocate(
    store: &Arc<dyn ObjectStore>,
    clock: &Arc<dyn Clock>,
    config: MembershipConfig,
    me: &Newcomer,
    processes: &Arc<dyn ProcessTable>,
) -> ClusterResult<Option<Membership>> {
    let registered = list_registrations(store.as_ref()).await?;
    let predecessor = registered.predecessor(me, processes.as_ref());
    let id = match predecessor {
        Some(id) => id,
        None => registered.lowest_free()?,
    };
    let mut membership = Membership::new(
        Arc::clone(store),
        Arc::clone(clock),
        config,
        LocalBroker {
            node_id: id,
            host: me.host.clone(),
            port: me.port,
            incarnation: me.incarnation,
            listeners: me.listeners.clone(),
        },
    )?
    .with_process_table(Arc::clone(processes));
    // For a free id `try_register` creates the registration (create-only); for a predecessor's
    // it sees the dead process and takes the registration over by compare-and-swap. Either
    // way, a registration that changed since our listing makes it wait or refuse: that id is
    // somebody else's now, so we list again instead.
    match membership.try_register().await {
        Ok(JoinProgress::Registered) => {
            tracing::info!(broker = %id, predecessor = predecessor.is_some(),
                "allocated node id");
            Ok(Some(membership))
        }
        Ok(JoinProgress::Waiting { .. }) | Err(ClusterError::BrokerIdInUse { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::BROKERS_PREFIX;
    use crate::testkit::FakeProcesses;
    use async_trait::async_trait;
    use bytes::Bytes;
    use std::ops::Range;
    use strata_core::clock::ManualClock;
    use strata_storage::{MemoryStore, ObjectKey, ObjectMeta, PutMode, StorageResult, Version};

    /// Yields to the scheduler before every request, so brokers started as concurrent tasks
    /// interleave between their listing and their create instead of running one by one.
    #[derive(Debug)]
    struct Yielding(Arc<dyn ObjectStore>);

    #[async_trait]
    impl ObjectStore for Yielding {
        async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
            tokio::task::yield_now().await;
            self.0.put(key, data, mode).await
        }
        async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
            tokio::task::yield_now().await;
            self.0.get(key).await
        }
        async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
            tokio::task::yield_now().await;
            self.0.get_range(key, range).await
        }
        async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
            tokio::task::yield_now().await;
            self.0.list(prefix).await
        }
        async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
            tokio::task::yield_now().await;
            self.0.delete(key).await
        }
        fn backend_name(&self) -> &'static str {
            "yielding"
        }
    }

    fn newcomer(port: u16, incarnation: u64) -> Newcomer {
        Newcomer {
            host: "127.0.0.1".into(),
            port,
            incarnation: Incarnation(incarnation),
            listeners: Vec::new(),
        }
    }

    async fn allocate(
        store: &Arc<dyn ObjectStore>,
        me: Newcomer,
        processes: Arc<FakeProcesses>,
    ) -> Membership {
        join_with_allocated_id(
            Arc::clone(store),
            Arc::new(ManualClock::new(0)),
            MembershipConfig::default(),
            me,
            processes,
        )
        .await
        .unwrap()
    }

    /// Registers a broker with a hand-set id, whose process has the id as its pid.
    async fn register_hand_set(store: &Arc<dyn ObjectStore>, id: i32) -> Membership {
        let mut configured = Membership::new(
            Arc::clone(store),
            Arc::new(ManualClock::new(0)),
            MembershipConfig::default(),
            LocalBroker {
                node_id: BrokerId(id),
                host: "127.0.0.1".into(),
                port: 9000,
                incarnation: Incarnation(u64::try_from(id).unwrap()),
                listeners: Vec::new(),
            },
        )
        .unwrap()
        .with_process_table(FakeProcesses::shared(u32::try_from(id).unwrap()));
        configured.try_register().await.unwrap();
        configured
    }

    fn id_of(membership: &Membership) -> i32 {
        membership.me().node_id.0
    }

    #[tokio::test]
    async fn brokers_starting_together_get_distinct_ids_above_the_configured_range() {
        let store: Arc<dyn ObjectStore> = Arc::new(Yielding(Arc::new(MemoryStore::new())));
        // A hand-set broker already registered: allocation never touches its range.
        register_hand_set(&store, 3).await;

        let mut racing = tokio::task::JoinSet::new();
        for i in 0..8u16 {
            let store = Arc::clone(&store);
            racing.spawn(async move {
                let me = newcomer(9100 + i, 100 + u64::from(i));
                allocate(&store, me, FakeProcesses::shared(u32::from(i) + 1)).await
            });
        }
        let started = racing.join_all().await;
        let mut ids: Vec<i32> = started.iter().map(id_of).collect();
        ids.sort_unstable();
        let expected: Vec<i32> = (FIRST_ALLOCATED_NODE_ID..FIRST_ALLOCATED_NODE_ID + 8).collect();
        assert_eq!(
            ids, expected,
            "eight racing starts, eight distinct ids, dense"
        );
        for membership in &started {
            assert!(membership.is_registered());
            // Each one's first view already lists the others that registered before it.
            assert!(membership.view().is_live(membership.me().node_id));
        }
    }

    #[tokio::test]
    async fn a_crashed_predecessor_on_this_machine_gives_back_its_id_and_a_live_one_does_not() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let first = allocate(&store, newcomer(9092, 1), FakeProcesses::shared(100)).await;
        let second = allocate(&store, newcomer(9093, 2), FakeProcesses::shared(200)).await;
        assert_eq!((id_of(&first), id_of(&second)), (1001, 1002));

        // Both still run: a third broker gets a new id.
        let processes = FakeProcesses::shared(300);
        let third = allocate(&store, newcomer(9094, 3), Arc::clone(&processes)).await;
        assert_eq!(id_of(&third), 1003);

        // Both predecessors died; a broker restarted with the second one's address takes the
        // second one's id back (same address first), at once.
        let restarted_processes = FakeProcesses::shared(400);
        restarted_processes.mark_gone(100);
        restarted_processes.mark_gone(200);
        let restarted = allocate(&store, newcomer(9093, 4), Arc::clone(&restarted_processes)).await;
        assert_eq!(id_of(&restarted), 1002);
        // Another restart, on an address nobody had: the lowest dead id.
        let other = allocate(&store, newcomer(9999, 5), restarted_processes).await;
        assert_eq!(id_of(&other), 1001);
    }

    #[tokio::test]
    async fn hand_set_and_unreadable_registrations_keep_their_ids() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let processes = FakeProcesses::shared(2);
        // A hand-set id whose process is gone is still not allocation's to take.
        register_hand_set(&store, 1).await;
        processes.mark_gone(1);
        // Garbage at the first allocated id still holds it.
        let garbage = ObjectKey::new(format!("{BROKERS_PREFIX}{FIRST_ALLOCATED_NODE_ID}")).unwrap();
        store
            .put(&garbage, Bytes::from_static(b"not json"), PutMode::Create)
            .await
            .unwrap();

        let allocated = allocate(&store, newcomer(9092, 7), processes).await;
        assert_eq!(id_of(&allocated), FIRST_ALLOCATED_NODE_ID + 1);
    }
}
