//! What cluster polling costs in storage requests while nothing changes: what one broker's
//! ownership runner (a full round every `ownership_interval`, the move watch every
//! `MOVE_WATCH_INTERVAL` in between) and its owner cache refresh (`Ownership::list("")`, as the
//! broker's Metadata cache does) send, per round, with a thousand partitions and a few past
//! moves. Requests are counted by the metrics wrapper, not timed. Run with `--nocapture` to see
//! the table.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use strata_core::clock::ManualClock;
use strata_core::{BrokerId, Epoch};
use strata_storage::{
    MemoryStore, MetricsStore, ObjectKey, ObjectMeta, ObjectStore, OpKind, PutMode, StorageMetrics,
    StorageResult, Version,
};

use crate::{
    Claimant, ClusterResult, ControllerConfig, Incarnation, LocalBroker, Membership,
    MembershipConfig, Ownership, OwnershipRunner, ResourceHost, RunnerConfig, StopReason,
};

const RESOURCES: usize = 1000;
const MOVES: usize = 10;
const ROUNDS: u64 = 10;
/// A 250 ms round watched every 10 ms, as the broker runs it.
const WATCHES_PER_ROUND: u64 = 25;
const ROUND: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
struct Host {
    resources: Arc<BTreeSet<String>>,
    serving: Arc<Mutex<BTreeMap<String, Epoch>>>,
}

#[async_trait]
impl ResourceHost for Host {
    async fn resources(&self) -> ClusterResult<BTreeSet<String>> {
        Ok((*self.resources).clone())
    }
    async fn start_serving(&self, resource: &str, epoch: Epoch) -> ClusterResult<()> {
        self.serving
            .lock()
            .unwrap()
            .insert(resource.to_string(), epoch);
        Ok(())
    }
    async fn stop_serving(&self, resource: &str, _: StopReason) -> ClusterResult<()> {
        self.serving.lock().unwrap().remove(resource);
        Ok(())
    }
}

struct Broker {
    membership: Membership,
    runner: OwnershipRunner<Host>,
    /// The broker's owner cache (Metadata answers from it) reads through its own `Ownership`.
    owners: Ownership,
    serving: Arc<Mutex<BTreeMap<String, Epoch>>>,
}

fn broker(
    store: &Arc<dyn ObjectStore>,
    clock: &Arc<ManualClock>,
    id: i32,
    resources: &Arc<BTreeSet<String>>,
) -> Broker {
    let incarnation = Incarnation(id as u64);
    let membership = Membership::new(
        store.clone(),
        clock.clone(),
        MembershipConfig::default(),
        LocalBroker {
            node_id: BrokerId(id),
            host: "h".into(),
            port: 1,
            incarnation,
        },
    )
    .unwrap();
    let serving = Arc::new(Mutex::new(BTreeMap::new()));
    let runner = OwnershipRunner::new(
        store.clone(),
        clock.clone(),
        Claimant {
            broker: BrokerId(id),
            incarnation,
            stream: None,
        },
        ControllerConfig {
            placement_settle: Duration::ZERO,
            ..ControllerConfig::default()
        },
        RunnerConfig::default(),
        membership.subscribe(),
        Host {
            resources: resources.clone(),
            serving: serving.clone(),
        },
    );
    Broker {
        membership,
        runner,
        owners: Ownership::new(store.clone()),
        serving,
    }
}

/// Requests (LIST, GET, anything else) sent since `before`.
fn since(metrics: &StorageMetrics, before: &[u64; 3]) -> [u64; 3] {
    let now = counts(metrics);
    [now[0] - before[0], now[1] - before[1], now[2] - before[2]]
}

fn counts(metrics: &StorageMetrics) -> [u64; 3] {
    let snapshot = metrics.snapshot();
    let lists = snapshot.op(OpKind::List).requests;
    let gets = snapshot.op(OpKind::Get).requests;
    [lists, gets, snapshot.total_requests() - lists - gets]
}

async fn settle(brokers: &mut [Broker], clock: &ManualClock) {
    for _ in 0..4 {
        clock.advance(ROUND);
        for b in brokers.iter_mut() {
            b.membership.heartbeat().await.unwrap();
            b.membership.refresh().await.unwrap();
        }
        for b in brokers.iter_mut() {
            b.runner.observe().await.unwrap();
            b.runner.act().await;
        }
    }
}

fn served(brokers: &[Broker]) -> Vec<BTreeMap<String, Epoch>> {
    brokers
        .iter()
        .map(|b| b.serving.lock().unwrap().clone())
        .collect()
}

/// A backend whose listings carry no change tags, as RADOS: every listed object is read.
#[derive(Debug)]
struct Untagged(MemoryStore);

#[async_trait]
impl ObjectStore for Untagged {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        self.0.put(key, data, mode).await
    }
    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        self.0.get(key).await
    }
    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        self.0.get_range(key, range).await
    }
    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let mut listed = self.0.list(prefix).await?;
        for meta in &mut listed {
            meta.tag = None;
        }
        Ok(listed)
    }
    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.0.delete(key).await
    }
    fn backend_name(&self) -> &'static str {
        "untagged"
    }
}

/// With change tags: while nothing changes a round costs the same whatever the number of
/// partitions — two listings (records, overrides) for the full round, one small read per
/// watch, one listing for the owner cache.
#[tokio::test]
async fn polling_cost_per_round_when_nothing_changes() {
    let [observe, watch, list] = poll_cost(Arc::new(MemoryStore::new()), "memory").await;
    assert_eq!(observe, [2, 0, 0]);
    assert_eq!(watch, [0, WATCHES_PER_ROUND, 0]);
    assert_eq!(list, [1, 0, 0]);
}

/// Without change tags (RADOS) every record is still read each round, but the watches cost
/// one small read each, not a listing plus a read per override.
#[tokio::test]
async fn polling_cost_per_round_without_change_tags() {
    let [observe, watch, list] =
        poll_cost(Arc::new(Untagged(MemoryStore::new())), "untagged").await;
    assert_eq!(observe[0], 2);
    assert!(observe[1] >= MOVES as u64 + RESOURCES as u64 / 3);
    assert_eq!(watch, [0, WATCHES_PER_ROUND, 0]);
    assert_eq!(list, [1, RESOURCES as u64, 0]);
}

/// Requests per round (LIST, GET, other) of a full round, its watches and an owner-cache
/// refresh, on one of two brokers sharing `backend`.
async fn poll_cost(backend: Arc<dyn ObjectStore>, name: &str) -> [[u64; 3]; 3] {
    let clock = Arc::new(ManualClock::new(0));
    let metered = Arc::new(MetricsStore::new(backend, clock.clone()));
    let metrics = Arc::clone(metered.metrics());
    let store: Arc<dyn ObjectStore> = metered;
    let resources: Arc<BTreeSet<String>> = Arc::new(
        (0..RESOURCES)
            .map(|i| format!("t{}/{}", i / 100, i % 100))
            .collect(),
    );
    let mut brokers = vec![
        broker(&store, &clock, 1, &resources),
        broker(&store, &clock, 2, &resources),
    ];
    for b in &mut brokers {
        b.membership.try_register().await.unwrap();
    }
    settle(&mut brokers, &clock).await;
    // Some past moves: their overrides stay behind.
    let mover = Ownership::new(store.clone());
    let on_first: Vec<String> = brokers[0].serving.lock().unwrap().keys().cloned().collect();
    for resource in on_first.iter().take(MOVES) {
        mover
            .set_placement_override(resource, BrokerId(2))
            .await
            .unwrap();
    }
    settle(&mut brokers, &clock).await;
    let before = served(&brokers);
    assert_eq!(
        before.iter().map(BTreeMap::len).sum::<usize>(),
        RESOURCES,
        "every partition is served"
    );
    // One warm-up round fills whatever the pollers cache.
    for b in brokers.iter_mut() {
        b.runner.watch().await.unwrap();
        b.owners.list("").await.unwrap();
    }

    let b = &mut brokers[0];
    let (mut observe, mut watch, mut list) = ([0; 3], [0; 3], [0; 3]);
    for _ in 0..ROUNDS {
        clock.advance(ROUND);
        b.membership.heartbeat().await.unwrap();
        b.membership.refresh().await.unwrap();
        let start = counts(&metrics);
        b.runner.observe().await.unwrap();
        b.runner.act().await;
        add(&mut observe, since(&metrics, &start));
        for _ in 0..WATCHES_PER_ROUND {
            let start = counts(&metrics);
            b.runner.watch().await.unwrap();
            b.runner.act().await;
            add(&mut watch, since(&metrics, &start));
        }
        let start = counts(&metrics);
        let records = b.owners.list("").await.unwrap();
        assert_eq!(records.len(), RESOURCES);
        add(&mut list, since(&metrics, &start));
    }
    assert_eq!(served(&brokers), before, "nothing changed hands");

    let per_round = |c: [u64; 3]| c.map(|n| n / ROUNDS);
    let (observe, watch, list) = (per_round(observe), per_round(watch), per_round(list));
    let total: u64 = [observe, watch, list].iter().flatten().sum();
    println!(
        "{name}: requests per {} ms round, one broker of two, {RESOURCES} partitions, {MOVES} overrides:",
        ROUND.as_millis()
    );
    println!("  {:<34} {:>6} {:>6} {:>6}", "", "LIST", "GET", "other");
    for (what, c) in [
        ("full round (observe)", observe),
        ("25 move watches", watch),
        ("owner cache (Ownership::list)", list),
    ] {
        println!("  {what:<34} {:>6} {:>6} {:>6}", c[0], c[1], c[2]);
    }
    println!("  total {total}");
    [observe, watch, list]
}

fn add(sum: &mut [u64; 3], more: [u64; 3]) {
    for (s, m) in sum.iter_mut().zip(more) {
        *s += m;
    }
}
