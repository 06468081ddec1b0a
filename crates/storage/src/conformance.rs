//! The behaviour every [`ObjectStore`] backend must show, as a suite any backend's tests can run
//! (enable the `conformance` feature):
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
//! async fn s3_store_passes_conformance() {
//!     let store: Arc<dyn ObjectStore> = Arc::new(S3Store::open(...)?);
//!     strata_storage::conformance::run_all(store, &format!("conformance/{}", uuid)).await;
//! }
//! ```
//!
//! Every check works under `<prefix>/<check name>/`, expects that to be empty when it starts and
//! deletes what it wrote when it passes, so give each run a fresh prefix on shared storage. Checks
//! panic with a message naming the backend and the broken rule; they are test code.

// Test support: it measures real latencies and waits in real time.
#![allow(clippy::disallowed_methods)]
// A failed check is supposed to panic: unwrapping is how it reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Barrier;

use crate::{ObjectKey, ObjectStore, PutMode, StorageError, StorageResult, Version};

/// Runs every check, one after another, then checks that nothing is left under `prefix`.
pub async fn run_all(store: Arc<dyn ObjectStore>, prefix: &str) {
    put_get_roundtrip(&store, prefix).await;
    missing_objects_are_not_found(&store, prefix).await;
    create_only_conflict(&store, prefix).await;
    cas_success(&store, prefix).await;
    cas_precondition_failure(&store, prefix).await;
    cas_on_missing_object(&store, prefix).await;
    recreated_object_rejects_stale_version(&store, prefix).await;
    get_range_edges(&store, prefix).await;
    list_by_prefix(&store, prefix).await;
    list_tags_track_rewrites(&store, prefix).await;
    list_during_writes_shows_only_whole_objects(&store, prefix).await;
    key_and_keys_below_it_coexist(&store, prefix).await;
    delete_idempotent(&store, prefix).await;
    large_object(&store, prefix).await;
    empty_object(&store, prefix).await;
    concurrent_create_race(&store, prefix).await;
    concurrent_cas_race(&store, prefix).await;
    cas_counter(&store, prefix).await;
    let left = ok(&store, store.list(&dir(prefix)).await, "final list");
    assert!(
        left.is_empty(),
        "[{}] checks left objects behind: {left:?}",
        store.backend_name()
    );
}

/// A put returns a version and get returns the same bytes and version.
pub async fn put_get_roundtrip(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "put-get-roundtrip").await;
    let k = c.key("a/b/object");
    let data = Bytes::from_static(b"hello, storage");
    let version = c.ok(store.put(&k, data.clone(), PutMode::Create).await, "put");
    let (read, read_version) = c.ok(store.get(&k).await, "get");
    c.check(read == data, "get returns the bytes put");
    c.check(
        read_version == version,
        "get returns the version put returned",
    );
    c.finish(&[k]).await;
}

/// Get, ranged get and CAS of a missing object fail with the right error.
pub async fn missing_objects_are_not_found(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "missing").await;
    let k = c.key("nothing-here");
    c.check(
        matches!(store.get(&k).await, Err(StorageError::NotFound(_))),
        "get of a missing object is NotFound",
    );
    c.check(
        matches!(
            store.get_range(&k, 0..1).await,
            Err(StorageError::NotFound(_))
        ),
        "get_range of a missing object is NotFound",
    );
    c.finish(&[]).await;
}

/// A second create-only put of a key fails and leaves the first object untouched.
pub async fn create_only_conflict(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "create-only").await;
    let k = c.key("seal");
    let first = c.ok(
        store
            .put(&k, Bytes::from_static(b"first"), PutMode::Create)
            .await,
        "first create",
    );
    let second = store
        .put(&k, Bytes::from_static(b"second"), PutMode::Create)
        .await;
    c.check(
        matches!(second, Err(StorageError::AlreadyExists(_))),
        &format!("second create is AlreadyExists, got {second:?}"),
    );
    let (data, version) = c.ok(store.get(&k).await, "get");
    c.check(
        &data[..] == b"first",
        "a failed create does not change the object",
    );
    c.check(
        version == first,
        "a failed create does not change the version",
    );
    c.finish(&[k]).await;
}

/// Compare-and-swap with the current version replaces the object and returns a new version.
pub async fn cas_success(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "cas-success").await;
    let k = c.key("manifest");
    let v1 = c.ok(
        store
            .put(&k, Bytes::from_static(b"v1"), PutMode::Create)
            .await,
        "create",
    );
    let v2 = c.ok(
        store
            .put(&k, Bytes::from_static(b"v2"), PutMode::Update(v1.clone()))
            .await,
        "update from current version",
    );
    c.check(v2 != v1, "an update yields a new version");
    let (data, version) = c.ok(store.get(&k).await, "get");
    c.check(&data[..] == b"v2", "get returns the updated bytes");
    c.check(version == v2, "get returns the updated version");
    let v3 = c.ok(
        store
            .put(&k, Bytes::from_static(b"v2"), PutMode::Update(v2.clone()))
            .await,
        "update with identical bytes",
    );
    c.check(
        v3 != v2,
        "an update with identical bytes still yields a new version",
    );
    c.finish(&[k]).await;
}

/// Compare-and-swap with a stale version fails and changes nothing.
pub async fn cas_precondition_failure(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "cas-precondition").await;
    let k = c.key("manifest");
    let v1 = c.ok(
        store
            .put(&k, Bytes::from_static(b"v1"), PutMode::Create)
            .await,
        "create",
    );
    let v2 = c.ok(
        store
            .put(&k, Bytes::from_static(b"v2"), PutMode::Update(v1.clone()))
            .await,
        "update",
    );
    let stale = store
        .put(&k, Bytes::from_static(b"stale"), PutMode::Update(v1))
        .await;
    c.check(
        matches!(stale, Err(StorageError::Precondition(_))),
        &format!("update from a stale version is Precondition, got {stale:?}"),
    );
    let made_up = store
        .put(
            &k,
            Bytes::from_static(b"stale"),
            PutMode::Update(Version("no-such-version".into())),
        )
        .await;
    c.check(
        matches!(made_up, Err(StorageError::Precondition(_))),
        &format!("update from a made-up version is Precondition, got {made_up:?}"),
    );
    let (data, version) = c.ok(store.get(&k).await, "get");
    c.check(
        &data[..] == b"v2" && version == v2,
        "failed updates change nothing",
    );
    c.finish(&[k]).await;
}

/// Compare-and-swap on a missing object fails with `Precondition` and creates nothing.
pub async fn cas_on_missing_object(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "cas-missing").await;
    let k = c.key("never-created");
    let result = store
        .put(
            &k,
            Bytes::from_static(b"x"),
            PutMode::Update(Version("1".into())),
        )
        .await;
    c.check(
        matches!(result, Err(StorageError::Precondition(_))),
        &format!("update of a missing object is Precondition, got {result:?}"),
    );
    c.check(
        matches!(store.get(&k).await, Err(StorageError::NotFound(_))),
        "a failed update creates nothing",
    );
    c.finish(&[]).await;
}

/// A version taken before a delete does not match the object created again after it.
pub async fn recreated_object_rejects_stale_version(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "recreate").await;
    let k = c.key("owner");
    let old = c.ok(
        store
            .put(&k, Bytes::from_static(b"old"), PutMode::Create)
            .await,
        "create",
    );
    c.ok(store.delete(&k).await, "delete");
    c.ok(
        store
            .put(&k, Bytes::from_static(b"new"), PutMode::Create)
            .await,
        "create again",
    );
    let stale = store
        .put(&k, Bytes::from_static(b"stale"), PutMode::Update(old))
        .await;
    c.check(
        matches!(stale, Err(StorageError::Precondition(_))),
        &format!("update with a version from before the delete is Precondition, got {stale:?}"),
    );
    c.finish(&[k]).await;
}

/// Ranged reads: inside, at the edges, cut at the end, empty, and starting past the end.
pub async fn get_range_edges(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "get-range").await;
    let k = c.key("ten");
    c.ok(
        store
            .put(&k, Bytes::from_static(b"0123456789"), PutMode::Create)
            .await,
        "put",
    );
    let cases: [(std::ops::Range<u64>, &[u8]); 7] = [
        (0..10, b"0123456789"),
        (0..1, b"0"),
        (3..7, b"3456"),
        (9..10, b"9"),
        (5..100, b"56789"),
        (4..4, b""),
        (10..20, b""),
    ];
    for (range, want) in cases {
        let got = c.ok(
            store.get_range(&k, range.clone()).await,
            &format!("get_range {range:?}"),
        );
        c.check(
            &got[..] == want,
            &format!("get_range {range:?} returned {got:?}"),
        );
    }
    let past = store.get_range(&k, 11..12).await;
    c.check(
        matches!(past, Err(StorageError::Invalid(_))),
        &format!("a range starting past the end is Invalid, got {past:?}"),
    );
    c.finish(&[k]).await;
}

/// Listing returns exactly the objects under a prefix, sorted, with their sizes.
pub async fn list_by_prefix(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "list").await;
    // Written out of order, with neighbours that share leading characters.
    let names = [
        "t/b/2", "t/a/1", "t/a/10", "t/a/2", "t/ab/1", "u/a/1", "t/a",
    ];
    let keys: Vec<ObjectKey> = names.iter().map(|n| c.key(n)).collect();
    for (key, name) in keys.iter().zip(names) {
        c.ok(
            store
                .put(key, Bytes::from(name.to_owned()), PutMode::Create)
                .await,
            "put",
        );
    }
    let listed = |p: String| {
        let store = Arc::clone(store);
        async move {
            let found = store
                .list(&p)
                .await
                .unwrap_or_else(|e| panic!("list {p:?}: {e}"));
            (
                found.iter().map(|m| m.key.to_string()).collect::<Vec<_>>(),
                found,
            )
        }
    };
    let base = c.dir();
    let full = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("{base}{n}"))
            .collect::<Vec<_>>()
    };

    let (all, metas) = listed(base.clone()).await;
    c.check(
        all == full(&[
            "t/a", "t/a/1", "t/a/10", "t/a/2", "t/ab/1", "t/b/2", "u/a/1",
        ]),
        &format!("list of the whole check is sorted and complete: {all:?}"),
    );
    c.check(
        metas
            .iter()
            .all(|m| m.size == m.key.as_str().len() as u64 - base.len() as u64),
        &format!("list reports object sizes: {metas:?}"),
    );
    // The size-free listing pollers use names the same objects, in the same order, with the
    // same tags (nothing changed in between).
    for p in [base.clone(), format!("{base}t/a")] {
        let sized = c.ok(store.list(&p).await, "list");
        let keys = c.ok(store.list_keys(&p).await, "list_keys");
        let expected: Vec<crate::ListedKey> = sized.into_iter().map(Into::into).collect();
        c.check(
            keys == expected,
            &format!("list_keys {p:?} matches list: {keys:?} vs {expected:?}"),
        );
    }
    let (under_a, _) = listed(format!("{base}t/a/")).await;
    c.check(
        under_a == full(&["t/a/1", "t/a/10", "t/a/2"]),
        &format!("prefix t/a/ lists only keys below t/a: {under_a:?}"),
    );
    let (starting_a, _) = listed(format!("{base}t/a")).await;
    c.check(
        starting_a == full(&["t/a", "t/a/1", "t/a/10", "t/a/2", "t/ab/1"]),
        &format!("prefix t/a lists every key starting with it: {starting_a:?}"),
    );
    let (partial_segment, _) = listed(format!("{base}t/a/1")).await;
    c.check(
        partial_segment == full(&["t/a/1", "t/a/10"]),
        &format!("a prefix may end inside a segment: {partial_segment:?}"),
    );
    let (none, _) = listed(format!("{base}v")).await;
    c.check(
        none.is_empty(),
        &format!("an unused prefix lists nothing: {none:?}"),
    );
    let (odd, _) = listed(format!("{base}t/../")).await;
    c.check(
        odd.is_empty(),
        &format!("a prefix no key can have lists nothing: {odd:?}"),
    );
    c.finish(&keys).await;
}

/// A listing's change tag (where the backend gives one) changes with every rewrite — even of the
/// same bytes, twice between two listings (A→B→A), or a delete and re-create — and stays put for
/// an object nobody touched. Pollers rely on this to skip reading unchanged objects.
pub async fn list_tags_track_rewrites(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "list-tags").await;
    let (moving, still) = (c.key("moving"), c.key("still"));
    let body = Bytes::from_static(b"same bytes every time");
    let mut version = c.ok(
        store.put(&moving, body.clone(), PutMode::Create).await,
        "create",
    );
    c.ok(
        store.put(&still, body.clone(), PutMode::Create).await,
        "create",
    );
    let tags = |what: &'static str| {
        let store = Arc::clone(store);
        let dir = c.dir();
        let (moving, still) = (moving.clone(), still.clone());
        async move {
            let listed = store
                .list(&dir)
                .await
                .unwrap_or_else(|e| panic!("list ({what}): {e}"));
            let tag = |k: &ObjectKey| listed.iter().find(|m| m.key == *k).map(|m| m.tag.clone());
            (tag(&moving), tag(&still))
        }
    };
    let (Some(moving_before), Some(still_before)) = tags("before").await else {
        c.fail("a listing must list both objects");
    };
    let mut history = vec![moving_before.clone()];
    let mut still_now = still_before.clone();
    // One rewrite, then two rewrites between listings; then a delete and re-create.
    for rewrites in [1, 2, 0] {
        if rewrites == 0 {
            c.ok(store.delete(&moving).await, "delete");
            version = c.ok(
                store.put(&moving, body.clone(), PutMode::Create).await,
                "re-create",
            );
        }
        for _ in 0..rewrites {
            version = c.ok(
                store
                    .put(&moving, body.clone(), PutMode::Update(version.clone()))
                    .await,
                "rewrite",
            );
        }
        let (Some(moving_now), Some(still_later)) = tags("after a rewrite").await else {
            c.fail("a listing must list both objects");
        };
        if let Some(now) = &moving_now {
            c.check(
                history.iter().flatten().all(|earlier| earlier != now),
                &format!("a rewritten object's tag {now:?} repeats an earlier one: {history:?}"),
            );
        }
        if let (Some(before), Some(later)) = (&still_now, &still_later) {
            c.check(
                before == later,
                &format!("an untouched object's tag changed from {before:?} to {later:?}"),
            );
        }
        c.check(
            still_now.is_some() == still_later.is_some(),
            "a backend gives tags always or never",
        );
        history.push(moving_now);
        still_now = still_later;
    }
    c.finish(&[moving, still]).await;
}

/// While objects are being written, a listing shows only objects that exist whole: never a temp
/// file, never a partial size, and whatever it lists can be read in full.
pub async fn list_during_writes_shows_only_whole_objects(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
) {
    const WRITERS: usize = 8;
    const OBJECTS_EACH: usize = 8;
    const SIZE: usize = 64 << 10;
    let c = Check::start(store, prefix, "list-during-writes").await;
    let keys: Vec<Vec<ObjectKey>> = (0..WRITERS)
        .map(|w| {
            (0..OBJECTS_EACH)
                .map(|o| c.key(&format!("w{w}/o{o}")))
                .collect()
        })
        .collect();
    let writers: Vec<_> = keys
        .iter()
        .cloned()
        .map(|mine| {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                for key in mine {
                    store
                        .put(&key, Bytes::from(vec![7u8; SIZE]), PutMode::Create)
                        .await?;
                }
                StorageResult::Ok(())
            })
        })
        .collect();
    let all_written = futures::future::join_all(writers);
    tokio::pin!(all_written);
    // List and read back until every writer is done, and once more after.
    let mut rounds = 0;
    let results = loop {
        let finished = futures::poll!(all_written.as_mut());
        let listed = c.ok(store.list(&c.dir()).await, "list during writes");
        for meta in &listed {
            c.check(
                keys.iter().flatten().any(|k| *k == meta.key),
                &format!("listed a key nobody wrote: {}", meta.key),
            );
            c.check(
                meta.size == SIZE as u64,
                &format!("listed {} with partial size {}", meta.key, meta.size),
            );
        }
        if let Some(meta) = listed.last() {
            let (data, _) = c.ok(store.get(&meta.key).await, "get of a listed object");
            c.check(data.len() == SIZE, "a listed object reads back whole");
        }
        rounds += 1;
        if let std::task::Poll::Ready(results) = finished {
            c.check(
                listed.len() == WRITERS * OBJECTS_EACH,
                "all objects listed at the end",
            );
            break results;
        }
    };
    for result in results {
        c.ok(result.expect("writer task panicked"), "put during listing");
    }
    tracing::debug!(rounds, "listed while writing");
    c.finish(&keys.concat()).await;
}

/// The key `a` and the keys `a/...` are independent objects, as in any object store.
pub async fn key_and_keys_below_it_coexist(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "nested").await;
    let (outer, inner) = (c.key("a"), c.key("a/b"));
    c.ok(
        store
            .put(&inner, Bytes::from_static(b"inner"), PutMode::Create)
            .await,
        "put a/b",
    );
    c.ok(
        store
            .put(&outer, Bytes::from_static(b"outer"), PutMode::Create)
            .await,
        "put a",
    );
    c.check(
        &c.ok(store.get(&outer).await, "get a").0[..] == b"outer",
        "a reads back",
    );
    c.check(
        &c.ok(store.get(&inner).await, "get a/b").0[..] == b"inner",
        "a/b reads back",
    );
    c.ok(store.delete(&outer).await, "delete a");
    c.check(store.get(&inner).await.is_ok(), "deleting a leaves a/b");
    c.finish(&[inner]).await;
}

/// Delete removes an object, and deleting a missing object succeeds.
pub async fn delete_idempotent(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "delete").await;
    let k = c.key("x/y");
    c.ok(
        store
            .put(&k, Bytes::from_static(b"x"), PutMode::Create)
            .await,
        "put",
    );
    c.ok(store.delete(&k).await, "delete");
    c.check(
        store.get(&k).await.is_err_and(|e| e.is_not_found()),
        "deleted object is gone",
    );
    c.ok(store.delete(&k).await, "delete again");
    c.ok(
        store.delete(&c.key("never/existed")).await,
        "delete of a never-created key",
    );
    c.ok(
        store
            .put(&k, Bytes::from_static(b"again"), PutMode::Create)
            .await,
        "create after delete",
    );
    c.finish(&[k]).await;
}

/// An 8 MiB object survives whole, and ranged reads find its bytes where they were.
pub async fn large_object(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "large").await;
    let k = c.key("segment");
    let len = 8 << 20;
    // Not a repeating short pattern, so a misplaced block would show.
    let data: Bytes = (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into();
    c.ok(
        store.put(&k, data.clone(), PutMode::Create).await,
        "put 8 MiB",
    );
    let (read, _) = c.ok(store.get(&k).await, "get 8 MiB");
    c.check(
        read.len() == len,
        &format!("read {} bytes of {len}", read.len()),
    );
    c.check(read == data, "8 MiB object reads back unchanged");
    let mid = (len / 2) as u64;
    let range = c.ok(
        store.get_range(&k, mid - 100..mid + 5000).await,
        "get_range",
    );
    c.check(
        range == data.slice(mid as usize - 100..mid as usize + 5000),
        "range of large object",
    );
    let listed = c.ok(store.list(&c.dir()).await, "list");
    c.check(
        listed.len() == 1 && listed[0].size == len as u64,
        &format!("list reports the large size: {listed:?}"),
    );
    c.finish(&[k]).await;
}

/// An empty object is an object: it exists, lists with size 0 and reads back empty.
pub async fn empty_object(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "empty").await;
    let k = c.key("nothing");
    let v = c.ok(
        store.put(&k, Bytes::new(), PutMode::Create).await,
        "put empty",
    );
    let (data, version) = c.ok(store.get(&k).await, "get empty");
    c.check(
        data.is_empty() && version == v,
        "empty object reads back empty",
    );
    let range = c.ok(store.get_range(&k, 0..10).await, "get_range of empty");
    c.check(range.is_empty(), "range of empty object is empty");
    let again = store.put(&k, Bytes::new(), PutMode::Create).await;
    c.check(
        matches!(again, Err(StorageError::AlreadyExists(_))),
        "an empty object exists for create-only",
    );
    let listed = c.ok(store.list(&c.dir()).await, "list");
    c.check(
        listed.len() == 1 && listed[0].size == 0,
        &format!("empty object lists with size 0: {listed:?}"),
    );
    c.finish(&[k]).await;
}

const RACERS: usize = 16;

/// 16 tasks race to create one key: exactly one wins, and the object holds the winner's bytes.
pub async fn concurrent_create_race(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "create-race").await;
    let k = c.key("epoch/seal");
    let results = race(RACERS, |i| {
        let (store, k) = (Arc::clone(store), k.clone());
        async move {
            store
                .put(&k, Bytes::from(format!("writer {i}")), PutMode::Create)
                .await
        }
    })
    .await;
    let winners: Vec<usize> = winners(&c, &results, |e| {
        matches!(e, StorageError::AlreadyExists(_))
    });
    c.check(
        winners.len() == 1,
        &format!("exactly one create wins, winners: {winners:?}"),
    );
    let (data, version) = c.ok(store.get(&k).await, "get");
    let winner = winners[0];
    c.check(
        data == format!("writer {winner}").as_bytes(),
        "the object holds the winner's bytes",
    );
    c.check(
        results[winner].as_ref().ok() == Some(&version),
        "the winner's version is current",
    );
    c.finish(&[k]).await;
}

/// 16 tasks race to compare-and-swap from one version: exactly one wins.
pub async fn concurrent_cas_race(store: &Arc<dyn ObjectStore>, prefix: &str) {
    let c = Check::start(store, prefix, "cas-race").await;
    let k = c.key("owner");
    let base = c.ok(
        store
            .put(&k, Bytes::from_static(b"base"), PutMode::Create)
            .await,
        "create",
    );
    let results = race(RACERS, |i| {
        let (store, k, base) = (Arc::clone(store), k.clone(), base.clone());
        async move {
            store
                .put(
                    &k,
                    Bytes::from(format!("writer {i}")),
                    PutMode::Update(base),
                )
                .await
        }
    })
    .await;
    let winners = winners(&c, &results, |e| matches!(e, StorageError::Precondition(_)));
    c.check(
        winners.len() == 1,
        &format!("exactly one CAS wins, winners: {winners:?}"),
    );
    let (data, version) = c.ok(store.get(&k).await, "get");
    let winner = winners[0];
    c.check(
        data == format!("writer {winner}").as_bytes(),
        "the object holds the winner's bytes",
    );
    c.check(
        results[winner].as_ref().ok() == Some(&version),
        "the winner's version is current",
    );
    c.finish(&[k]).await;
}

/// 8 tasks each add 1 to a counter 20 times with read / compare-and-swap / retry loops: the
/// counter ends at exactly 160 (no lost update, no double apply).
pub async fn cas_counter(store: &Arc<dyn ObjectStore>, prefix: &str) {
    const TASKS: usize = 8;
    const INCREMENTS: usize = 20;
    let c = Check::start(store, prefix, "cas-counter").await;
    let k = c.key("counter");
    c.ok(
        store
            .put(&k, Bytes::from_static(b"0"), PutMode::Create)
            .await,
        "create",
    );
    let results = race(TASKS, |_| {
        let (store, k) = (Arc::clone(store), k.clone());
        async move {
            for _ in 0..INCREMENTS {
                loop {
                    let (data, version) = store.get(&k).await?;
                    let value: u64 = std::str::from_utf8(&data)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| StorageError::Other(format!("counter holds {data:?}")))?;
                    let next = Bytes::from((value + 1).to_string());
                    match store.put(&k, next, PutMode::Update(version)).await {
                        Ok(_) => break,
                        Err(StorageError::Precondition(_)) => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        }
    })
    .await;
    for result in results {
        c.ok(result, "increment loop");
    }
    let (data, _) = c.ok(store.get(&k).await, "get");
    let expected = (TASKS * INCREMENTS).to_string();
    c.check(
        data == expected.as_bytes(),
        &format!("counter is {data:?}, expected {expected}"),
    );
    c.finish(&[k]).await;
}

/// Runs `n` copies of a task, released together from a barrier, and returns their results in
/// task order.
async fn race<T, F, Fut>(n: usize, make: F) -> Vec<StorageResult<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = StorageResult<T>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let task = make(i);
            tokio::spawn(async move {
                barrier.wait().await;
                task.await
            })
        })
        .collect();
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|joined| joined.expect("race task panicked"))
        .collect()
}

/// Indices of the successful results; every failure must be the expected conflict.
fn winners<T: Debug>(
    c: &Check,
    results: &[StorageResult<T>],
    is_conflict: impl Fn(&StorageError) -> bool,
) -> Vec<usize> {
    let mut winners = Vec::new();
    for (i, result) in results.iter().enumerate() {
        match result {
            Ok(_) => winners.push(i),
            Err(e) if is_conflict(e) => {}
            Err(e) => c.fail(&format!("racer {i} failed with an unexpected error: {e}")),
        }
    }
    winners
}

fn dir(prefix: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    }
}

fn ok<T>(store: &Arc<dyn ObjectStore>, result: StorageResult<T>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("[{}] {what} failed: {e}", store.backend_name()))
}

/// One check's namespace and reporting.
struct Check {
    store: Arc<dyn ObjectStore>,
    dir: String,
    name: &'static str,
}

impl Check {
    async fn start(store: &Arc<dyn ObjectStore>, prefix: &str, name: &'static str) -> Self {
        let check = Self {
            store: Arc::clone(store),
            dir: format!("{}{name}/", dir(prefix)),
            name,
        };
        let existing = check.ok(store.list(&check.dir).await, "list before starting");
        check.check(
            existing.is_empty(),
            &format!(
                "prefix {:?} must start empty, found {existing:?}",
                check.dir
            ),
        );
        check
    }

    fn key(&self, rest: &str) -> ObjectKey {
        ObjectKey::new(format!("{}{rest}", self.dir)).expect("conformance keys are valid")
    }

    fn dir(&self) -> String {
        self.dir.clone()
    }

    fn ok<T>(&self, result: StorageResult<T>, what: &str) -> T {
        result.unwrap_or_else(|e| self.fail(&format!("{what} failed: {e}")))
    }

    fn check(&self, condition: bool, rule: &str) {
        if !condition {
            self.fail(rule);
        }
    }

    fn fail(&self, message: &str) -> ! {
        panic!(
            "[{} conformance / {}] {message}",
            self.store.backend_name(),
            self.name
        )
    }

    /// Deletes the check's objects and verifies nothing else (no temp file, no stray object) is
    /// listed under its prefix.
    async fn finish(self, keys: &[ObjectKey]) {
        for key in keys {
            self.ok(self.store.delete(key).await, &format!("delete {key}"));
        }
        let left = self.ok(self.store.list(&self.dir).await, "list after cleanup");
        self.check(
            left.is_empty(),
            &format!("objects left after cleanup: {left:?}"),
        );
    }
}

/// Not a check: times `n` rounds of create, compare-and-swap, get and ranged get of 4 KiB
/// objects under `prefix`, one listing of them and their deletion, and prints p50/p99 per
/// operation (the per-operation figures in docs/BENCHMARKS.md). Backends' tests run it on
/// demand (`--ignored`); `list_note` says what a listing costs on that backend.
pub async fn measure_op_latencies(
    store: &dyn ObjectStore,
    prefix: &str,
    n: usize,
    list_note: &str,
) {
    let key = |i: usize| ObjectKey::new(format!("{prefix}/{i:05}")).unwrap();
    let data = Bytes::from(vec![7u8; 4096]);
    let (mut create, mut cas, mut get, mut range, mut delete) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let k = key(i);
        let t = tokio::time::Instant::now();
        let v = store.put(&k, data.clone(), PutMode::Create).await.unwrap();
        create.push(t.elapsed());
        let t = tokio::time::Instant::now();
        store
            .put(&k, data.clone(), PutMode::Update(v))
            .await
            .unwrap();
        cas.push(t.elapsed());
        let t = tokio::time::Instant::now();
        store.get(&k).await.unwrap();
        get.push(t.elapsed());
        let t = tokio::time::Instant::now();
        store.get_range(&k, 100..1100).await.unwrap();
        range.push(t.elapsed());
    }
    let t = tokio::time::Instant::now();
    let listed = store.list(&format!("{prefix}/")).await.unwrap();
    let list_time = t.elapsed();
    assert_eq!(listed.len(), n);
    for i in 0..n {
        let t = tokio::time::Instant::now();
        store.delete(&key(i)).await.unwrap();
        delete.push(t.elapsed());
    }
    for (name, mut samples) in [
        ("put create 4KiB", create),
        ("put CAS 4KiB", cas),
        ("get 4KiB", get),
        ("get_range 1000B", range),
        ("delete", delete),
    ] {
        samples.sort();
        eprintln!(
            "{name:>16}: p50 {:?}  p99 {:?}  (n={n})",
            samples[n / 2],
            samples[n * 99 / 100]
        );
    }
    eprintln!("list of {n}{list_note}: {list_time:?}");
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::Range;
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::ObjectMeta;

    /// A store whose create-only put checks and then writes in two steps, with a yield between:
    /// the classic lost race. The suite must notice.
    #[derive(Debug, Default)]
    struct CheckThenWriteStore {
        objects: Mutex<BTreeMap<ObjectKey, Bytes>>,
    }

    #[async_trait]
    impl ObjectStore for CheckThenWriteStore {
        async fn put(&self, key: &ObjectKey, data: Bytes, _: PutMode) -> StorageResult<Version> {
            if self.objects.lock().unwrap().contains_key(key) {
                return Err(StorageError::AlreadyExists(key.clone()));
            }
            tokio::task::yield_now().await;
            self.objects.lock().unwrap().insert(key.clone(), data);
            Ok(Version("1".into()))
        }
        async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
            let objects = self.objects.lock().unwrap();
            let data = objects
                .get(key)
                .ok_or_else(|| StorageError::NotFound(key.clone()))?;
            Ok((data.clone(), Version("1".into())))
        }
        async fn get_range(&self, key: &ObjectKey, _: Range<u64>) -> StorageResult<Bytes> {
            Err(StorageError::NotFound(key.clone()))
        }
        async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
            let objects = self.objects.lock().unwrap();
            Ok(objects
                .iter()
                .filter(|(k, _)| k.as_str().starts_with(prefix))
                .map(|(k, d)| ObjectMeta {
                    key: k.clone(),
                    size: d.len() as u64,
                    tag: None,
                })
                .collect())
        }
        async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
            self.objects.lock().unwrap().remove(key);
            Ok(())
        }
        fn backend_name(&self) -> &'static str {
            "check-then-write"
        }
    }

    /// A store whose listing derives its tag from what `stat` would show (here: the size), so
    /// a same-size rewrite keeps the tag. The suite must notice.
    #[derive(Debug, Default)]
    struct SizeTaggedStore {
        inner: crate::MemoryStore,
    }

    #[async_trait]
    impl ObjectStore for SizeTaggedStore {
        async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
            self.inner.put(key, data, mode).await
        }
        async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
            self.inner.get(key).await
        }
        async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
            self.inner.get_range(key, range).await
        }
        async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
            let mut listed = self.inner.list(prefix).await?;
            for meta in &mut listed {
                meta.tag = Some(crate::ChangeTag(meta.size.to_string()));
            }
            Ok(listed)
        }
        async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
            self.inner.delete(key).await
        }
        fn backend_name(&self) -> &'static str {
            "size-tagged"
        }
    }

    #[tokio::test]
    #[should_panic(expected = "repeats an earlier one")]
    async fn tag_check_catches_a_tag_that_misses_a_rewrite() {
        let store: Arc<dyn ObjectStore> = Arc::new(SizeTaggedStore::default());
        list_tags_track_rewrites(&store, "tags").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "exactly one create wins")]
    async fn create_race_check_catches_a_non_atomic_create() {
        let store: Arc<dyn ObjectStore> = Arc::new(CheckThenWriteStore::default());
        concurrent_create_race(&store, "racy").await;
    }
}
