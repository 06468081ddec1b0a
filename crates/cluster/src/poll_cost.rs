//! What cluster polling costs in storage requests while nothing changes: what one broker's
//! ownership runner (a full round every `ownership_interval`, the move watch every
//! `MOVE_WATCH_INTERVAL` in between) and its owner cache refresh (`Ownership::list("")`, as the
//! broker's Metadata cache does) send, per round, with a thousand partitions and a few past
//! moves. Requests are counted by the metrics wrapper, not timed. Run with `--nocapture` to see
//! the table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use strata_core::clock::ManualClock;
use strata_core::{BrokerId, Epoch};
use strata_storage::{MemoryStore, MetricsStore, ObjectStore, OpKind, StorageMetrics};

use crate::testkit::{node, serving, Node, Untagged};
use crate::Ownership;

const RESOURCES: usize = 1000;
const MOVES: usize = 10;
/// Two listings a round (full round, owner cache), so this many rounds hold two forced full
/// re-reads of untagged records and their share is counted.
const ROUNDS: u64 = crate::ownership::UNTAGGED_FULL_READ_EVERY;
/// A 250 ms round watched every 10 ms, as the broker runs it.
const WATCHES_PER_ROUND: u64 = 25;
const ROUND: Duration = Duration::from_millis(250);

/// One broker: membership and ownership runner, plus the owner cache its Metadata answers
/// from, which reads through a clone of the runner's `Ownership` (sharing its cache), as the
/// broker does.
struct Broker {
    node: Node,
    owners: Ownership,
}

fn broker(
    store: &Arc<dyn ObjectStore>,
    clock: &Arc<ManualClock>,
    id: i32,
    resources: &BTreeSet<String>,
) -> Broker {
    let node = node(store, clock, id, resources);
    let owners = node.runner.ownership().clone();
    Broker { node, owners }
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
            b.node.membership.heartbeat().await.unwrap();
            b.node.membership.refresh().await.unwrap();
        }
        for b in brokers.iter_mut() {
            b.node.runner.observe().await.unwrap();
            b.node.runner.act().await;
        }
    }
}

fn served(brokers: &[Broker]) -> Vec<BTreeMap<String, Epoch>> {
    brokers
        .iter()
        .map(|b| b.node.runner.host().serving.lock().unwrap().clone())
        .collect()
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

/// Without change tags (RADOS) the owners-changes marker stands in for them: a round reads the
/// marker and the overrides instead of every record, and every record only at the forced full
/// re-read every `UNTAGGED_FULL_READ_EVERY` listings (counted here, amortised over the rounds).
#[tokio::test]
async fn polling_cost_per_round_without_change_tags() {
    let [observe, watch, list] =
        poll_cost(Arc::new(Untagged(Arc::new(MemoryStore::new()))), "untagged").await;
    assert_eq!((observe[0], list[0]), (2, 1));
    assert_eq!(watch, [0, WATCHES_PER_ROUND, 0]);
    // Before the marker a round read every record, over a thousand requests.
    let reads = observe[1] + list[1];
    assert!(reads < RESOURCES as u64 / 10, "{reads} reads per round");
}

/// Requests per round (LIST, GET, other) of a full round, its watches and an owner-cache
/// refresh, on one of two brokers sharing `backend`.
async fn poll_cost(backend: Arc<dyn ObjectStore>, name: &str) -> [[u64; 3]; 3] {
    let clock = Arc::new(ManualClock::new(0));
    let metered = Arc::new(MetricsStore::new(backend, clock.clone()));
    let metrics = Arc::clone(metered.metrics());
    let store: Arc<dyn ObjectStore> = metered;
    let resources: BTreeSet<String> = (0..RESOURCES)
        .map(|i| format!("t{}/{}", i / 100, i % 100))
        .collect();
    let mut brokers = vec![
        broker(&store, &clock, 1, &resources),
        broker(&store, &clock, 2, &resources),
    ];
    for b in &mut brokers {
        b.node.membership.try_register().await.unwrap();
    }
    settle(&mut brokers, &clock).await;
    // Some past moves: their overrides stay behind.
    let mover = Ownership::new(store.clone());
    let on_first: Vec<String> = serving(&brokers[0].node).into_iter().collect();
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
        b.node.runner.watch().await.unwrap();
        b.owners.list("").await.unwrap();
    }

    let [b, other] = &mut brokers[..] else {
        unreachable!("two brokers")
    };
    let (mut observe, mut watch, mut list) = ([0; 3], [0; 3], [0; 3]);
    for _ in 0..ROUNDS {
        clock.advance(ROUND);
        // The other broker stays alive (unmeasured), or it would lose everything after a lease.
        other.node.membership.heartbeat().await.unwrap();
        b.node.membership.heartbeat().await.unwrap();
        b.node.membership.refresh().await.unwrap();
        let start = counts(&metrics);
        b.node.runner.observe().await.unwrap();
        b.node.runner.act().await;
        add(&mut observe, since(&metrics, &start));
        for _ in 0..WATCHES_PER_ROUND {
            let start = counts(&metrics);
            b.node.runner.watch().await.unwrap();
            b.node.runner.act().await;
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
