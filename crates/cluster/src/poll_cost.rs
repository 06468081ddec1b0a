//! What cluster polling costs in storage requests while nothing changes: what one broker's
//! ownership runner (a full round every `ownership_interval`, the move watch every
//! `MOVE_WATCH_INTERVAL` in between; the broker's owner cache is fed by the rounds) sends, per
//! round, with a thousand partitions and a few past moves; and what a whole idle broker
//! (membership and runner) sends per second with the S3 defaults. Requests are counted by the
//! metrics wrapper, not timed. Run with `--nocapture` to see the tables.

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

/// One broker: membership and ownership runner, whose rounds also feed the owner cache its
/// Metadata answers from (`OwnershipRunner::records`), as the broker does.
struct Broker {
    node: Node,
}

fn broker(
    store: &Arc<dyn ObjectStore>,
    clock: &Arc<ManualClock>,
    id: i32,
    resources: &BTreeSet<String>,
) -> Broker {
    Broker {
        node: node(store, clock, id, resources),
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
/// partitions — one listing (records) and one small read (the placement-changes marker) for
/// the full round, one small read per watch, nothing for the owner cache. The overrides are
/// listed only when the marker moved, or every `FULL_LISTING_EVERY` rounds (amortised here
/// below one request a round).
#[tokio::test]
async fn polling_cost_per_round_when_nothing_changes() {
    let [observe, watch] = poll_cost(Arc::new(MemoryStore::new()), "memory").await;
    assert_eq!(observe, [1, 1, 0]);
    assert_eq!(watch, [0, WATCHES_PER_ROUND, 0]);
}

/// Without change tags (RADOS) the owners-changes marker stands in for them: a round reads the
/// marker and the overrides instead of every record, and every record only at the forced full
/// re-read every `UNTAGGED_FULL_READ_EVERY` listings (counted here, amortised over the rounds).
#[tokio::test]
async fn polling_cost_per_round_without_change_tags() {
    let [observe, watch] =
        poll_cost(Arc::new(Untagged(Arc::new(MemoryStore::new()))), "untagged").await;
    assert_eq!(observe[0], 1);
    assert_eq!(watch, [0, WATCHES_PER_ROUND, 0]);
    // Before the marker a round read every record, over a thousand requests.
    let reads = observe[1];
    assert!(reads < RESOURCES as u64 / 10, "{reads} reads per round");
}

/// Requests per round (LIST, GET, other) of a full round and its watches, on one of two
/// brokers sharing `backend`.
async fn poll_cost(backend: Arc<dyn ObjectStore>, name: &str) -> [[u64; 3]; 2] {
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
    }

    let [b, other] = &mut brokers[..] else {
        unreachable!("two brokers")
    };
    let records = b.node.runner.records();
    let (mut observe, mut watch) = ([0; 3], [0; 3]);
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
        // The owner cache (Metadata) gets every record from the round, at no cost.
        assert_eq!(records.borrow().len(), RESOURCES);
    }
    assert_eq!(served(&brokers), before, "nothing changed hands");

    let per_round = |c: [u64; 3]| c.map(|n| n / ROUNDS);
    let (observe, watch) = (per_round(observe), per_round(watch));
    let total: u64 = [observe, watch].iter().flatten().sum();
    println!(
        "{name}: requests per {} ms round, one broker of two, {RESOURCES} partitions, {MOVES} overrides:",
        ROUND.as_millis()
    );
    println!("  {:<34} {:>6} {:>6} {:>6}", "", "LIST", "GET", "other");
    for (what, c) in [
        ("full round (observe)", observe),
        ("25 move watches", watch),
    ] {
        println!("  {what:<34} {:>6} {:>6} {:>6}", c[0], c[1], c[2]);
    }
    println!("  total {total}");
    [observe, watch]
}

fn add(sum: &mut [u64; 3], more: [u64; 3]) {
    for (s, m) in sum.iter_mut().zip(more) {
        *s += m;
    }
}

/// The documented bound (docs/ARCHITECTURE.md, "Polling cost"): while nothing changes, one
/// broker with the S3 defaults (a heartbeat and an ownership round a second, no move watch)
/// sends per second one registration write, one listing of the registrations and one read of
/// each that changed (every live broker's, each heartbeat changes it), one listing of the
/// owner records and one read of the placement-changes marker; the overrides (and, in the
/// broker, the catalog) are listed only every `FULL_LISTING_EVERY` rounds. Before, every round
/// also listed the overrides and the catalog, and the owner cache listed the records again.
#[tokio::test]
async fn an_idle_broker_with_the_s3_defaults_stays_within_the_documented_bound() {
    const BROKERS: u64 = 3;
    const SECONDS: u64 = 120;
    let clock = Arc::new(ManualClock::new(0));
    let shared: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    // Broker 1's requests are counted, by area of the layout, as `/metrics` reports them.
    let metered = Arc::new(MetricsStore::new(Arc::clone(&shared), clock.clone()));
    let metrics = Arc::clone(metered.metrics());
    metrics.set_key_areas(strata_layout::key_area);
    let counted: Arc<dyn ObjectStore> = metered;
    let resources: BTreeSet<String> = (0..300)
        .map(|i| format!("t{}/{}", i / 100, i % 100))
        .collect();
    let mut brokers: Vec<Broker> = (1..=BROKERS as i32)
        .map(|id| {
            let store = if id == 1 { &counted } else { &shared };
            broker(store, &clock, id, &resources)
        })
        .collect();
    for b in &mut brokers {
        b.node.membership.try_register().await.unwrap();
    }
    settle(&mut brokers, &clock).await;
    settle(&mut brokers, &clock).await;
    let before = served(&brokers);
    assert_eq!(
        before.iter().map(BTreeMap::len).sum::<usize>(),
        resources.len(),
        "every partition is served"
    );

    let start = metrics.snapshot();
    for _ in 0..SECONDS {
        clock.advance(Duration::from_secs(1));
        for b in brokers.iter_mut() {
            b.node.membership.heartbeat().await.unwrap();
        }
        for b in brokers.iter_mut() {
            b.node.membership.refresh().await.unwrap();
            b.node.runner.observe().await.unwrap();
            b.node.runner.act().await;
        }
    }
    assert_eq!(served(&brokers), before, "nothing changed hands");
    let end = metrics.snapshot();
    let area = |area: &str, op: OpKind| {
        let count = |s: &strata_storage::StorageMetricsSnapshot| {
            s.by_area()
                .iter()
                .find(|(a, o, _)| *a == area && *o == op)
                .map_or(0, |(_, _, n)| *n)
        };
        count(&end) - count(&start)
    };
    println!("one idle broker of {BROKERS}, S3 defaults, requests over {SECONDS} s:");
    for (what, op) in [
        ("membership", OpKind::PutUpdate),
        ("membership", OpKind::List),
        ("membership", OpKind::Get),
        ("ownership", OpKind::List),
        ("ownership", OpKind::Get),
        ("placement_changes", OpKind::Get),
        ("placement", OpKind::List),
        ("placement", OpKind::Get),
    ] {
        println!("  {what:<18} {op:<10} {:>5}", area(what, op));
    }
    let total = end.total_requests() - start.total_requests();
    let lists = end.op(OpKind::List).requests - start.op(OpKind::List).requests;
    println!(
        "  total {total} ({:.2}/s), listings {lists}",
        total as f64 / SECONDS as f64
    );

    let full_listings = SECONDS / u64::from(crate::runner::FULL_LISTING_EVERY);
    assert_eq!(area("membership", OpKind::PutUpdate), SECONDS);
    assert_eq!(area("membership", OpKind::List), SECONDS);
    assert_eq!(area("membership", OpKind::Get), SECONDS * BROKERS);
    assert_eq!(area("ownership", OpKind::List), SECONDS);
    assert_eq!(area("ownership", OpKind::Get), 0, "no record changed");
    assert_eq!(area("placement_changes", OpKind::Get), SECONDS);
    assert_eq!(area("placement", OpKind::List), full_listings);
    // Two listings a second; it was three (registrations, overrides, records), and the
    // broker's owner cache listed the records once more.
    assert_eq!(lists, 2 * SECONDS + full_listings);
    assert_eq!(total, SECONDS * (4 + BROKERS) + full_listings);
}
