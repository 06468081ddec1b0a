//! A deposed owner must be harmless: an owner paused past its lease resumes believing it still
//! owns its partitions, and every write it then makes (segments, index chunks, manifests, the
//! garbage collector's deletes) must leave its successor's log intact. These tests play that
//! owner directly on the log layer, where the pause is simply "do nothing until later".

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_core::Offset;
use strata_storage::{MemoryStore, ObjectStore};

use super::{batch, config, open_managed, tp, DURABLE};
use crate::{LogError, LogManager};

/// Every record from offset 0 to the high watermark, as (offset, value).
async fn records(log: &LogManager, topic: &str) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let read = log
            .read(&tp(topic, 0), Offset(at), 1 << 20, true)
            .await
            .unwrap_or_else(|e| panic!("reading offset {at}: {e}"));
        if read.batches.is_empty() {
            return out;
        }
        for b in &read.batches {
            for (offset, rec) in strata_wire::builder::read_records(b).unwrap() {
                out.push((
                    offset,
                    String::from_utf8(rec.value.unwrap().to_vec()).unwrap(),
                ));
                at = offset + 1;
            }
        }
    }
}

async fn acquire(log: &LogManager, epoch: u64) {
    for (tp, r) in log.acquire(vec![("t".into(), 0, epoch)]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("{tp} at epoch {epoch}: {e}"));
    }
}

async fn append(log: &LogManager, value: &str) -> i64 {
    log.append(&tp("t", 0), batch(&[value], 0, None), DURABLE)
        .await
        .unwrap()
        .base_offset
        .0
}

/// Broker `id` on `store`, with the catalog read and partition t/0 taken over at `epoch`.
async fn owner(store: &Arc<dyn ObjectStore>, id: i32, epoch: u64) -> Arc<LogManager> {
    let log = open_managed(store, id).await;
    log.refresh_catalog().await.unwrap();
    acquire(&log, epoch).await;
    log
}

/// A fresh store with topic `t` (one partition) owned by broker 1 at epoch 1, which has
/// acknowledged `a0`, `a1`, … (`count` records) and compacted none of them.
async fn first_owner(count: usize) -> (Arc<dyn ObjectStore>, Arc<LogManager>, Vec<String>) {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire(&a, 1).await;
    let values: Vec<String> = (0..count).map(|i| format!("a{i}")).collect();
    for v in &values {
        append(&a, v).await;
    }
    (store, a, values)
}

fn expected(values: impl IntoIterator<Item = String>) -> Vec<(i64, String)> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| (i as i64, v))
        .collect()
}

/// Issue 10, case 1: A is paused with an uncompacted tail; B takes over, writes more and
/// compacts; A resumes and compacts its stale tail. A used to rewrite the index chunk it shared
/// with B (only the manifest was fenced), so B's records became unreadable.
#[tokio::test]
async fn a_deposed_owner_compacting_after_its_successor_cannot_damage_the_index() {
    let (store, a, mut values) = first_owner(10).await;
    let b = owner(&store, 2, 2).await;
    for i in 0..10 {
        values.push(format!("b{i}"));
        assert_eq!(append(&b, &values[10 + i]).await, 10 + i as i64);
    }
    b.compact_now(&tp("t", 0)).await.unwrap();

    // A wakes up and compacts what it still believes is its tail.
    assert!(matches!(
        a.compact_now(&tp("t", 0)).await,
        Err(LogError::Fenced)
    ));
    assert!(*a.fenced().borrow(), "a deposed compaction must fence A");

    let c = owner(&store, 3, 3).await;
    assert_eq!(records(&c, "t").await, expected(values.clone()));
    c.collect_garbage().await.unwrap();
    assert_eq!(records(&c, "t").await, expected(values));
}

/// The other order: A's late compaction lands its segment and index entries before B ever
/// compacts. Those entries lie at or past B's checkpoint, so B never reads them and its own
/// compaction replaces them; A learns from the manifest that it was deposed.
#[tokio::test]
async fn a_deposed_owner_compacting_first_leaves_nothing_its_successor_reads() {
    let (store, a, mut values) = first_owner(10).await;
    let b = owner(&store, 2, 2).await;
    assert!(a.compact_now(&tp("t", 0)).await.is_err());
    assert!(*a.fenced().borrow(), "a deposed compaction must fence A");
    for i in 0..10 {
        values.push(format!("b{i}"));
        append(&b, &values[10 + i]).await;
    }
    assert_eq!(records(&b, "t").await, expected(values.clone()));
    b.compact_now(&tp("t", 0)).await.unwrap();
    assert_eq!(records(&b, "t").await, expected(values.clone()));

    let c = owner(&store, 3, 3).await;
    assert_eq!(records(&c, "t").await, expected(values));
}

/// B cached an index chunk (reading old data) before the deposed A rewrote it. B's
/// compare-and-swap then fails on its stale version; it must re-read the chunk and go on, not
/// take itself for deposed and never compact again.
#[tokio::test]
async fn a_successor_whose_cached_chunk_a_deposed_owner_rewrote_still_compacts() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire(&a, 1).await;
    let mut values = Vec::new();
    for i in 0..10 {
        values.push(format!("a{i}"));
        append(&a, &values[i]).await;
        if i == 4 {
            a.compact_now(&tp("t", 0)).await.unwrap();
        }
    }
    let b = owner(&store, 2, 2).await;
    // B reads the compacted part, caching index chunk 0.
    assert_eq!(records(&b, "t").await, expected(values.clone()));
    assert!(a.compact_now(&tp("t", 0)).await.is_err());
    for i in 0..10 {
        values.push(format!("b{i}"));
        append(&b, &values[10 + i]).await;
    }
    b.compact_now(&tp("t", 0)).await.unwrap();
    assert!(!*b.fenced().borrow());
    assert_eq!(records(&b, "t").await, expected(values.clone()));

    let c = owner(&store, 3, 3).await;
    assert_eq!(records(&c, "t").await, expected(values));
}

/// The host now hands over a partition it holds suspended (its lease was in doubt), which
/// writes the manifest as released. If the owner was deposed meanwhile — paused past its lease,
/// a successor claimed the partition — that write must be refused by the manifest's
/// compare-and-swap, leave the successor's manifest and records alone, and fence the old owner.
#[tokio::test]
async fn a_deposed_owner_handing_over_its_suspended_partition_changes_nothing() {
    let (store, a, mut values) = first_owner(10).await;
    a.suspend_writes(&tp("t", 0));
    let b = owner(&store, 2, 2).await;
    for i in 0..5 {
        values.push(format!("b{i}"));
        append(&b, &values[10 + i]).await;
    }
    b.compact_now(&tp("t", 0)).await.unwrap();

    // A resumes and is told to hand the partition over.
    assert!(
        a.release(&tp("t", 0)).await.is_err(),
        "a deposed owner released a partition it no longer owns"
    );
    // B goes on: its manifest still names it, so it appends and compacts as before.
    for i in 5..10 {
        values.push(format!("b{i}"));
        append(&b, &values[10 + i]).await;
    }
    b.compact_now(&tp("t", 0)).await.unwrap();
    assert!(
        !*b.fenced().borrow(),
        "the successor took itself for deposed"
    );

    let c = owner(&store, 3, 3).await;
    assert_eq!(records(&c, "t").await, expected(values.clone()));
    c.collect_garbage().await.unwrap();
    assert_eq!(records(&c, "t").await, expected(values));
}

/// A seeded simulation over the real log code: owners are deposed (by takeover after a
/// "pause", by a crash, or by a graceful handover) while deposed owners keep compacting,
/// appending and collecting garbage at random moments. Afterwards a fresh broker must read
/// every acknowledged record at its offset, densely, before and after garbage collection.
/// `STRATA_LOG_SIM_SEED=<n>` replays one seed. It runs on tokio's paused time (every wait of
/// the log goes through its clock, which reads tokio's time): virtual time, so a seed replays
/// exactly (`a_simulation_replays_exactly_from_its_seed`) and no run waits in real time.
#[tokio::test(start_paused = true)]
async fn simulated_takeovers_with_late_deposed_writers_lose_nothing() {
    for seed in sim_seeds(1..=12) {
        println!("log simulation seed {seed} (replay with STRATA_LOG_SIM_SEED={seed})");
        simulate(seed, false).await;
    }
}

/// The same with storage that fails often, sometimes after applying a write (the ambiguous
/// case), under the production retry stack: appends, compactions, takeovers and collections
/// may fail, but an owner must never take itself for deposed, and nothing acknowledged may
/// be lost.
#[tokio::test(start_paused = true)]
async fn simulated_takeovers_under_storage_faults_lose_nothing() {
    for seed in sim_seeds(101..=108) {
        println!("log simulation seed {seed} with faults (replay with STRATA_LOG_SIM_SEED={seed})");
        simulate(seed, true).await;
    }
}

/// The same seed, run twice on virtual time, takes the same course: the same records are
/// acknowledged at the same offsets, the same faults are injected, and it ends at the same
/// virtual instant. What makes a failing seed worth reporting: it fails again when replayed.
#[tokio::test(start_paused = true)]
async fn a_simulation_replays_exactly_from_its_seed() {
    for (seed, faults) in [(5, false), (103, true), (6, false)] {
        let first = simulate(seed, faults).await;
        let second = simulate(seed, faults).await;
        assert!(!first.acked.is_empty(), "seed {seed}: nothing acknowledged");
        assert_eq!(
            first.injected_faults > 0,
            faults,
            "seed {seed}: faults injected"
        );
        // Odd seeds wait for the group-commit interval, so virtual time must pass.
        assert!(
            seed.is_multiple_of(2) || !first.elapsed.is_zero(),
            "seed {seed}: no virtual time passed"
        );
        assert_eq!(
            first, second,
            "seed {seed} took another course when replayed"
        );
    }
}

/// What a simulation run did, to compare two runs of one seed.
#[derive(Debug, PartialEq, Eq)]
struct SimTrace {
    acked: Vec<(i64, String)>,
    injected_faults: u64,
    /// Segments on the bulk tier that a tiering pass wrote (tiered runs; a plain topic has no
    /// other segments named by claim).
    bulk_copies: usize,
    /// Virtual time the run took, on the log's clock.
    elapsed: std::time::Duration,
}

fn sim_seeds(default: std::ops::RangeInclusive<u64>) -> Vec<u64> {
    match std::env::var("STRATA_LOG_SIM_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => default.collect(),
    }
}

/// Retries what storage faults may fail; anything else is returned.
async fn retried<T, F, Fut>(faults: bool, mut op: F) -> Result<T, LogError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LogError>>,
{
    loop {
        match op().await {
            Err(e) if faults && matches!(e, LogError::Storage(_) | LogError::Timeout) => {}
            other => return other,
        }
    }
}

async fn simulate(seed: u64, faults: bool) -> SimTrace {
    simulate_with(seed, faults, false, false).await
}

/// The simulation on a compacted topic: owners and deposed owners also run cleaning passes,
/// and what must survive is every key's latest acknowledged value, at its offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_takeovers_with_deposed_cleaners_keep_every_keys_latest_value() {
    for seed in sim_seeds(1..=12) {
        simulate_with(seed, false, true, false).await;
    }
}

/// The simulation on two tiers with a topic that holds segments on the fast tier
/// (`local.retention.bytes`): owners and deposed owners also run tiering passes, which copy
/// segments to the bulk tier and swap them in; every acknowledged record must still be read at
/// its offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_takeovers_with_deposed_tiering_passes_lose_nothing() {
    let mut moved = 0;
    for seed in sim_seeds(1..=12) {
        moved += simulate_with(seed, false, false, true).await.bulk_copies;
    }
    assert!(
        moved > 0,
        "no run moved a segment: the scenario tests nothing"
    );
}

async fn simulate_with(seed: u64, faults: bool, compacted: bool, tiered: bool) -> SimTrace {
    use strata_storage::{
        FaultConfig, FaultInjectingStore, InjectedError, OpFaults, RetryPolicy, StackConfig,
        StorageStack,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = strata_core::SystemClock::shared();
    let started = clock.monotonic();
    let mut fault_store: Option<Arc<FaultInjectingStore>> = None;
    let backend: Arc<dyn ObjectStore> = if tiered {
        Arc::new(strata_storage::TieredStore::new(
            Arc::new(MemoryStore::new()),
            Arc::new(MemoryStore::new()),
            strata_layout::tier::ROUTING,
        ))
    } else {
        Arc::new(MemoryStore::new())
    };
    let store: Arc<dyn ObjectStore> = if faults {
        let injected = FaultConfig::uniform(OpFaults {
            error_probability: 0.05,
            ambiguous_probability: 0.03,
            error: InjectedError::Unavailable,
            latency: std::time::Duration::ZERO,
            latency_jitter: std::time::Duration::from_micros(200),
        });
        let faulty = Arc::new(FaultInjectingStore::new(backend.clone(), injected, seed));
        fault_store = Some(Arc::clone(&faulty));
        StorageStack::build(
            faulty.clone(),
            &StackConfig {
                retry: RetryPolicy {
                    max_attempts: 3,
                    initial_backoff: std::time::Duration::from_millis(1),
                    max_backoff: std::time::Duration::from_millis(4),
                    max_elapsed: std::time::Duration::from_secs(1),
                },
                seed,
                ..StackConfig::default()
            },
            strata_core::SystemClock::shared(),
        )
        .store
    } else {
        backend.clone()
    };
    let mut cfg = config();
    // Segments of a few batches: many compaction passes, chunks shared between segments.
    cfg.segment_bytes = 300;
    cfg.tiered = tiered;
    // Both group-commit rules: odd seeds wait for the interval, even ones write at once when
    // no write is in flight (the production default), so groups form differently.
    cfg.flush_when_idle = seed.is_multiple_of(2);
    let open = |id: i32, store: Arc<dyn ObjectStore>| {
        let cfg = cfg.clone();
        async move {
            retried(faults, || {
                LogManager::open_with(
                    store.clone(),
                    strata_core::SystemClock::shared(),
                    cfg.clone(),
                    strata_core::BrokerId(id),
                    crate::Ownership::Managed,
                )
            })
            .await
            .unwrap()
        }
    };
    let take_over = |log: Arc<LogManager>, epoch: u64| async move {
        // A claim can lose the race for the manifest to the old owner's background compaction
        // (it may still update its manifest until the claim lands): the cluster simply claims
        // again at its next round, and so does this.
        for _ in 0..20 {
            let claimed = retried(faults, || async {
                log.refresh_catalog().await?;
                let results = log.acquire(vec![("t".into(), 0, epoch)]).await?;
                Ok(results.into_iter().try_for_each(|(_, r)| r))
            })
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: taking over at epoch {epoch}: {e}"));
            match claimed {
                Ok(()) => return,
                Err(LogError::Fenced) => {}
                Err(e) if faults && e.is_retryable() => {}
                Err(e) => panic!("seed {seed}: claiming at epoch {epoch}: {e}"),
            }
        }
        panic!("seed {seed}: no claim at epoch {epoch} succeeded in 20 rounds");
    };
    let mut next_id = 1;
    let mut owner = open(next_id, store.clone()).await;
    let overrides = if compacted {
        BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())])
    } else if tiered {
        // A couple of segments held, the older ones due: every pass has something to move.
        BTreeMap::from([("local.retention.bytes".to_string(), "600".to_string())])
    } else {
        BTreeMap::new()
    };
    retried(faults, || {
        owner.create_topic("t", Some(1), overrides.clone(), false)
    })
    .await
    .unwrap();
    let mut epoch = 1;
    take_over(owner.clone(), epoch).await;
    // Former owners that have not crashed: they go on acting on stale state.
    let mut deposed: Vec<Arc<LogManager>> = Vec::new();
    let mut acked: Vec<(i64, String)> = Vec::new();
    let mut n = 0;
    for step in 0..80 {
        match rng.random_range(0..12) {
            0..=3 => {
                for _ in 0..rng.random_range(1..4) {
                    let value = format!("s{seed}-{n}");
                    let key = format!("k{}", n % 7);
                    n += 1;
                    let records = if compacted {
                        super::cleaner::keyed(&[(Some(&key), Some(&value))], 0, None)
                    } else {
                        batch(&[&value], 0, None)
                    };
                    match owner.append(&tp("t", 0), records, DURABLE).await {
                        Ok(out) => acked.push((out.base_offset.0, value)),
                        Err(e) if faults && e.is_retryable() => {}
                        Err(e) => panic!("seed {seed} step {step}: append failed: {e}"),
                    }
                }
            }
            4 | 5 if compacted && rng.random_bool(0.5) => {
                match owner.clean_now(&tp("t", 0)).await {
                    Ok(_) => {}
                    Err(e) if faults && !matches!(e, LogError::Fenced) => {}
                    Err(e) => panic!("seed {seed} step {step}: the owner's cleaning failed: {e}"),
                }
            }
            4 | 5 if tiered && rng.random_bool(0.5) => {
                match owner.tier_down_now(&tp("t", 0)).await {
                    Ok(_) => {}
                    Err(e) => panic!("seed {seed} step {step}: the owner's tiering failed: {e}"),
                }
            }
            4 | 5 => match owner.compact_now(&tp("t", 0)).await {
                Ok(()) => {}
                Err(e) if faults && !matches!(e, LogError::Fenced) => {}
                Err(e) => panic!("seed {seed} step {step}: the owner's compaction failed: {e}"),
            },
            6 | 7 if !deposed.is_empty() => {
                let old = &deposed[rng.random_range(0..deposed.len())];
                let _ = old.compact_now(&tp("t", 0)).await;
                if compacted {
                    let _ = old.clean_now(&tp("t", 0)).await;
                }
                if tiered {
                    let _ = old.tier_down_now(&tp("t", 0)).await;
                }
                assert!(
                    old.append(&tp("t", 0), batch(&["late"], 0, None), DURABLE)
                        .await
                        .is_err(),
                    "seed {seed} step {step}: a deposed owner acknowledged an append"
                );
            }
            8 if !deposed.is_empty() => {
                let old = &deposed[rng.random_range(0..deposed.len())];
                let _ = old.collect_garbage().await;
            }
            9 => {
                if let Err(e) = owner.collect_garbage().await {
                    assert!(faults, "seed {seed} step {step}: collection failed: {e}");
                }
            }
            10 | 11 => {
                // A new owner takes over: after a pause of the old one (which goes on acting),
                // after its crash, or by a graceful handover.
                let mut how = rng.random_range(0..3);
                if how == 2 && owner.release(&tp("t", 0)).await.is_err() {
                    // A handover that failed half-way leaves the partition to a takeover.
                    assert!(faults, "seed {seed} step {step}: the handover failed");
                    how = 0;
                }
                next_id += 1;
                let next = open(next_id, store.clone()).await;
                epoch += 1;
                take_over(next.clone(), epoch).await;
                let old = std::mem::replace(&mut owner, next);
                match how {
                    0 => deposed.push(old),
                    1 => old.abort_for_test(),
                    _ => {}
                }
            }
            _ => {}
        }
        assert!(
            !*owner.fenced().borrow(),
            "seed {seed} step {step}: the current owner took itself for fenced"
        );
    }
    for old in &deposed {
        old.abort_for_test();
    }
    owner.abort_for_test();
    // Storage alone, without faults, must hold every acknowledgement.
    next_id += 1;
    let observer = open(next_id, backend.clone()).await;
    observer.refresh_catalog().await.unwrap();
    acquire(&observer, epoch + 1).await;
    let check_latest = |stored: Vec<(i64, String)>, when: &str| {
        let offsets: Vec<i64> = stored.iter().map(|(o, _)| *o).collect();
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "seed {seed} {when}: offsets increase"
        );
        // Values carry their sequence number n, whose key is n % 7.
        let mut latest: BTreeMap<String, (i64, String)> = BTreeMap::new();
        for (offset, value) in &acked {
            let n: usize = value.rsplit('-').next().unwrap().parse().unwrap();
            latest.insert(format!("k{}", n % 7), (*offset, value.clone()));
        }
        for (key, (offset, value)) in latest {
            assert!(
                stored.contains(&(offset, value.clone())),
                "seed {seed} {when}: the latest {key} ({value} at {offset}) is gone"
            );
        }
    };
    if compacted {
        check_latest(records(&observer, "t").await, "");
        observer.collect_garbage().await.unwrap();
        check_latest(records(&observer, "t").await, "after GC");
        return SimTrace {
            acked,
            injected_faults: 0,
            bulk_copies: 0,
            elapsed: clock.monotonic().saturating_sub(started),
        };
    }
    let check = |stored: Vec<(i64, String)>, when: &str| {
        let offsets: Vec<i64> = stored.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            (0..stored.len() as i64).collect::<Vec<_>>(),
            "seed {seed} {when}: offsets dense"
        );
        let mut seen = std::collections::HashSet::new();
        for (_, value) in &stored {
            assert!(
                seen.insert(value.clone()),
                "seed {seed} {when}: {value} stored twice"
            );
        }
        for (offset, value) in &acked {
            assert_eq!(
                stored.get(*offset as usize).map(|(_, v)| v),
                Some(value),
                "seed {seed} {when}: acknowledged {value} not at offset {offset}"
            );
        }
    };
    check(records(&observer, "t").await, "");
    observer.collect_garbage().await.unwrap();
    check(records(&observer, "t").await, "after GC");
    let bulk_copies = backend
        .list("log/")
        .await
        .unwrap()
        .iter()
        .filter(|m| strata_layout::partition::parse_cleaned_segment_key(m.key.as_str()).is_some())
        .count();
    SimTrace {
        acked,
        injected_faults: fault_store.map_or(0, |f| f.injected_count()),
        bulk_copies,
        elapsed: clock.monotonic().saturating_sub(started),
    }
}

/// Issue 10, case 1 (second finding): a broker paused past its lease came back, was given
/// partitions again and claimed them although a successor had sealed its stream — sealing the
/// successor in turn and advertising itself as leader until a produce hit the seal.
#[tokio::test]
async fn a_sealed_broker_refuses_to_take_partitions_over() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire(&a, 1).await;
    append(&a, "a0").await;
    let b = owner(&store, 2, 2).await;
    // A resumes and is offered partition 1, which nobody else holds.
    assert!(matches!(
        a.acquire(vec![("t".into(), 1, 1)]).await,
        Err(LogError::Fenced)
    ));
    assert!(*a.fenced().borrow());
    assert!(a.served_epoch(&tp("t", 1)).is_none());
    // B was not sealed by A: it still appends.
    assert_eq!(append(&b, "b0").await, 1);
}

/// A takeover whose claim of the manifest landed but was reported as failed (and no retry
/// resolved it) used to find "its own" manifest on the next attempt and refuse the partition
/// for ever, as if it had a tail of its own it could not replay. Nothing can be in its stream
/// for a partition it never served, so claiming again must simply work.
#[tokio::test]
async fn a_claim_that_landed_but_reported_failure_is_claimed_again() {
    use strata_storage::{FaultConfig, FaultInjectingStore, InjectedError, OpKind};
    let backend: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = open_managed(&backend, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire(&a, 1).await;
    let values: Vec<String> = (0..5).map(|i| format!("a{i}")).collect();
    for v in &values {
        append(&a, v).await;
    }
    let faulty = Arc::new(FaultInjectingStore::new(
        backend.clone(),
        FaultConfig::none(),
        1,
    ));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let b = open_managed(&store, 2).await;
    b.refresh_catalog().await.unwrap();
    faulty.apply_then_fail_next(OpKind::PutUpdate, InjectedError::Unavailable);
    let first = b.acquire(vec![("t".into(), 0, 2)]).await.unwrap();
    assert!(
        matches!(first[0].1, Err(LogError::Storage(_))),
        "{:?}",
        first[0].1
    );
    acquire(&b, 2).await;
    assert_eq!(records(&b, "t").await, expected(values.clone()));
    assert_eq!(append(&b, "b0").await, 5);
}

/// Issue 10, case 1 as seen with a standalone broker beside a cluster broker on one storage:
/// each assigns Kafka epochs its own way, so both owners can hold epoch 1. The fence of index
/// chunks is the manifest's claim counter, which every claim raises by compare-and-swap, so
/// the deposed owner is refused even at an equal epoch.
#[tokio::test]
async fn owners_at_equal_epochs_are_still_ordered_by_their_claims() {
    let (store, a, mut values) = first_owner(10).await;
    let b = owner(&store, 2, 1).await;
    for i in 0..10 {
        values.push(format!("b{i}"));
        append(&b, &values[10 + i]).await;
    }
    b.compact_now(&tp("t", 0)).await.unwrap();
    assert!(a.compact_now(&tp("t", 0)).await.is_err());
    assert!(*a.fenced().borrow());

    let c = owner(&store, 3, 2).await;
    assert_eq!(records(&c, "t").await, expected(values));
}

/// A compaction whose manifest update failed leaves a segment of our own stream that no
/// manifest lists; the next pass may replace it (different batches, same key). A deposed owner
/// must not: it re-reads the manifest first, finds the successor's claim, and stops — the
/// segment keeps its bytes and the successor's log is whole.
#[tokio::test]
async fn a_deposed_owner_does_not_replace_its_orphan_segment() {
    use strata_storage::{FaultConfig, FaultInjectingStore, InjectedError, ObjectKey, OpKind};
    let backend: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let faulty = Arc::new(FaultInjectingStore::new(
        backend.clone(),
        FaultConfig::none(),
        1,
    ));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let a = open_managed(&store, 1).await;
    a.create_topic("t", Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    acquire(&a, 1).await;
    let mut values: Vec<String> = (0..3).map(|i| format!("a{i}")).collect();
    for v in &values {
        append(&a, v).await;
    }
    // The pass writes its segment and chunk, then its manifest update fails.
    faulty.fail_next(OpKind::PutUpdate, InjectedError::Unavailable);
    assert!(a.compact_now(&tp("t", 0)).await.is_err());
    let topic = a.topic("t").unwrap().id;
    let orphan = ObjectKey::new(crate::manifest::segment_key(
        topic,
        0,
        crate::index::SegmentRef::compacted(0, a.stream()),
    ))
    .unwrap();
    let (orphan_bytes, _) = backend.get(&orphan).await.unwrap();
    values.push("a3".into());
    append(&a, "a3").await;

    let b = owner(&backend, 2, 2).await;
    // A resumes: its pass would write different bytes under the orphan's key.
    assert!(a.compact_now(&tp("t", 0)).await.is_err());
    assert!(*a.fenced().borrow());
    assert_eq!(backend.get(&orphan).await.unwrap().0, orphan_bytes);
    b.compact_now(&tp("t", 0)).await.unwrap();
    let c = owner(&backend, 3, 3).await;
    assert_eq!(records(&c, "t").await, expected(values));
}

/// Just before the first compare-and-swap of a partition manifest, runs `hook` (once): a
/// window in which another writer can act between the taker's manifest read and its claim.
#[derive(Debug)]
struct BeforeFirstClaim {
    hook: tokio::sync::Mutex<Option<Hook>>,
}

struct Hook(futures::future::BoxFuture<'static, ()>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

#[async_trait::async_trait]
impl super::intercept::Intercept for BeforeFirstClaim {
    async fn before_put(
        &self,
        key: &strata_storage::ObjectKey,
        mode: &strata_storage::PutMode,
    ) -> strata_storage::StorageResult<()> {
        if super::intercept::is_manifest_update(key, mode) {
            let hook = self.hook.lock().await.take();
            if let Some(Hook(run)) = hook {
                run.await;
            }
        }
        Ok(())
    }
}

/// The fenced owner may still compact its tail (or apply retention) after the seal and before
/// the taker's claim: its manifest changes under the same claim. The taker must load the
/// partition again, not give it up as lost — a standalone broker starting on storage another
/// one still uses exited on exactly this in an end-to-end run on S3.
#[tokio::test]
async fn a_claim_beaten_only_by_the_sealed_owners_compaction_is_taken_again() {
    let (store, a, values) = first_owner(6).await;
    let compacting = a.clone();
    let intercepted = super::intercept::Intercepted::new(
        store.clone(),
        BeforeFirstClaim {
            hook: tokio::sync::Mutex::new(Some(Hook(Box::pin(async move {
                compacting
                    .compact_now(&tp("t", 0))
                    .await
                    .expect("the sealed owner still compacts its own tail");
            })))),
        },
    );
    let hooked = &intercepted.hooks;
    let b = open_managed(&(intercepted.clone() as Arc<dyn ObjectStore>), 2).await;
    b.refresh_catalog().await.unwrap();
    acquire(&b, 2).await;
    assert!(
        hooked.hook.lock().await.is_none(),
        "the hook never ran, so the race was not played"
    );
    assert_eq!(b.served_epoch(&tp("t", 0)), Some(2));
    assert_eq!(records(&b, "t").await, expected(values.clone()));
    assert_eq!(append(&b, "b0").await, values.len() as i64);
}
