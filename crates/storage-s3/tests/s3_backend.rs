//! Runs the storage conformance suite and S3-specific checks against a real S3 server named by
//! `STRATA_TEST_S3_URL` (moto from scripts/moto-up.sh, RGW from scripts/ceph-up.sh; `source` the
//! env file they print). Without the variable every test prints a notice and passes as skipped.

// Tests run against a real server in real time (see clippy.toml).
#![allow(clippy::disallowed_methods)]
// Test helpers outside #[test] functions: a failed unwrap is how they report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use bytes::Bytes;
use strata_storage::{conformance, ObjectKey, ObjectStore, PutMode, StorageError, Version};
use strata_storage_s3::{S3Store, TRAILER_LEN};

/// `url` with one more query option.
fn with_option(url: &str, option: &str) -> String {
    if option.is_empty() {
        url.to_string()
    } else if url.contains('?') {
        format!("{url}&{option}")
    } else {
        format!("{url}?{option}")
    }
}

/// The server URL with `extra` query options appended, or `None` (and a notice) when unset.
fn test_url(test: &str, extra: &str) -> Option<String> {
    match std::env::var("STRATA_TEST_S3_URL") {
        Ok(url) if !url.is_empty() => {
            init_logging();
            Some(with_option(&url, extra))
        }
        _ => {
            eprintln!("SKIPPED {test}: STRATA_TEST_S3_URL is not set (see scripts/moto-up.sh)");
            None
        }
    }
}

/// Logs go to the test output when RUST_LOG is set (`RUST_LOG=strata_storage_s3=debug`).
fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_store_passes_conformance() {
    let Some(url) = test_url("s3_store_passes_conformance", "") else {
        return;
    };
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::from_url(&url).unwrap());
    conformance::run_all(store, &format!("conformance/{}", unique("run"))).await;
}

/// Without the trailer, objects are the caller's bytes exactly and every check holds except those
/// the trailer exists for: identical bytes get identical ETags, and the CAS counter (racers writing
/// identical bytes) cannot pass on RGW, whose losers get a 500 that raw mode cannot resolve — it
/// reports them ambiguous (Unavailable) rather than let two writers both believe they won.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raw_objects_pass_conformance_except_identical_bytes_versions() {
    let Some(url) = test_url("raw_objects_pass_conformance", "version_trailer=false") else {
        return;
    };
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::from_url(&url).unwrap());
    let prefix = format!("conformance/{}", unique("raw"));
    conformance::put_get_roundtrip(&store, &prefix).await;
    conformance::missing_objects_are_not_found(&store, &prefix).await;
    conformance::create_only_conflict(&store, &prefix).await;
    conformance::cas_precondition_failure(&store, &prefix).await;
    conformance::cas_on_missing_object(&store, &prefix).await;
    conformance::recreated_object_rejects_stale_version(&store, &prefix).await;
    conformance::get_range_edges(&store, &prefix).await;
    conformance::list_by_prefix(&store, &prefix).await;
    // Not `list_tags_track_rewrites`: it rewrites identical bytes, whose ETag (the listing's
    // change tag) stays the same without the trailer. Harmless to a poller (same bytes, same
    // decoded content), but not what the check demands.
    conformance::list_during_writes_shows_only_whole_objects(&store, &prefix).await;
    conformance::key_and_keys_below_it_coexist(&store, &prefix).await;
    conformance::delete_idempotent(&store, &prefix).await;
    conformance::large_object(&store, &prefix).await;
    conformance::empty_object(&store, &prefix).await;
    conformance::concurrent_create_race(&store, &prefix).await;
    conformance::concurrent_cas_race(&store, &prefix).await;

    let k = key(&format!("{prefix}/same-bytes"));
    let v1 = store
        .put(&k, Bytes::from_static(b"x"), PutMode::Create)
        .await
        .unwrap();
    let v2 = store
        .put(&k, Bytes::from_static(b"x"), PutMode::Update(v1.clone()))
        .await
        .unwrap();
    assert_eq!(
        v1, v2,
        "raw S3 objects: identical bytes, identical ETag (the documented ABA)"
    );
    store.delete(&k).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_live_under_the_url_prefix_with_the_trailer() {
    let Some(url) = test_url("objects_live_under_the_url_prefix", "") else {
        return;
    };
    let sub = unique("prefixed");
    let outer_url = url.clone();
    let inner_url = match url.split_once('?') {
        Some((base, query)) => format!("{}/{sub}?{query}", base.trim_end_matches('/')),
        None => format!("{}/{sub}", url.trim_end_matches('/')),
    };
    let inner = S3Store::from_url(&inner_url).unwrap();
    let outer = S3Store::from_url(&outer_url).unwrap();
    let raw_outer = S3Store::from_url(&with_option(&outer_url, "version_trailer=false")).unwrap();

    let k = key("wal/1/0/00000000000000000001");
    inner
        .put(&k, Bytes::from_static(b"batch"), PutMode::Create)
        .await
        .unwrap();
    let seen_from_outer = key(&format!("{sub}/wal/1/0/00000000000000000001"));
    assert_eq!(&outer.get(&seen_from_outer).await.unwrap().0[..], b"batch");
    let raw = raw_outer.get(&seen_from_outer).await.unwrap().0;
    assert_eq!(
        raw.len() as u64,
        5 + TRAILER_LEN,
        "stored object = bytes + trailer"
    );
    assert_eq!(&raw[..5], b"batch");
    let listed = inner.list("wal/").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].key.as_str(), listed[0].size), (k.as_str(), 5));

    // An object some other tool wrote is reported, not misread.
    let foreign_key = key("foreign");
    let raw_inner = S3Store::from_url(&with_option(&inner_url, "version_trailer=false")).unwrap();
    raw_inner
        .put(&foreign_key, Bytes::from_static(b"plain"), PutMode::Create)
        .await
        .unwrap();
    assert!(matches!(
        inner.get(&foreign_key).await,
        Err(StorageError::Other(_))
    ));

    inner.delete(&k).await.unwrap();
    raw_inner.delete(&foreign_key).await.unwrap();
    assert!(inner.list("").await.unwrap().is_empty());
}

/// Listings longer than one page come back whole and sorted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_follows_pages() {
    let Some(url) = test_url("listing_follows_pages", "list_page_size=7") else {
        return;
    };
    let store = S3Store::from_url(&url).unwrap();
    let prefix = unique("pages");
    let keys: Vec<ObjectKey> = (0..23)
        .rev()
        .map(|i| key(&format!("{prefix}/{i:03}")))
        .collect();
    for k in &keys {
        store
            .put(k, Bytes::from_static(b"p"), PutMode::Create)
            .await
            .unwrap();
    }
    let listed: Vec<ObjectKey> = store
        .list(&format!("{prefix}/"))
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .collect();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(listed, expected);
    for k in &keys {
        store.delete(k).await.unwrap();
    }
}

/// Whatever form the server wants (RGW 16.2: unquoted, moto: quoted), `auto` finds it, and a
/// version string without quotes (as a caller might persist it) works too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_swap_works_with_auto_etag_quoting() {
    let Some(url) = test_url("compare_and_swap_works_with_auto_etag_quoting", "") else {
        return;
    };
    let store = S3Store::from_url(&url).unwrap();
    let k = key(&format!("cas/{}", unique("auto")));
    let v1 = store
        .put(&k, Bytes::from_static(b"1"), PutMode::Create)
        .await
        .unwrap();
    let v2 = store
        .put(&k, Bytes::from_static(b"2"), PutMode::Update(v1.clone()))
        .await
        .unwrap();
    let bare = Version(v2.0.trim_matches('"').to_string());
    let v3 = store
        .put(&k, Bytes::from_static(b"3"), PutMode::Update(bare))
        .await
        .unwrap();
    let stale = store
        .put(&k, Bytes::from_static(b"4"), PutMode::Update(v2))
        .await;
    assert!(
        matches!(stale, Err(StorageError::Precondition(_))),
        "{stale:?}"
    );
    assert_eq!(store.get(&k).await.unwrap(), (Bytes::from_static(b"3"), v3));
    store.delete(&k).await.unwrap();
}

/// Reports which fixed `etag_quotes` setting this server accepts; informational, never fails on
/// the answer (it is the reason `auto` exists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn which_if_match_form_the_server_accepts() {
    let Some(url) = test_url("which_if_match_form_the_server_accepts", "") else {
        return;
    };
    for form in ["keep", "strip"] {
        let store = S3Store::from_url(&with_option(&url, &format!("etag_quotes={form}"))).unwrap();
        let k = key(&format!("cas/{}", unique(form)));
        let v1 = store
            .put(&k, Bytes::from_static(b"1"), PutMode::Create)
            .await
            .unwrap();
        let outcome = store
            .put(&k, Bytes::from_static(b"2"), PutMode::Update(v1))
            .await;
        eprintln!(
            "etag_quotes={form}: {}",
            if outcome.is_ok() { "accepted" } else { "412" }
        );
        assert!(
            matches!(outcome, Ok(_) | Err(StorageError::Precondition(_))),
            "{outcome:?}"
        );
        store.delete(&k).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_bucket_is_idempotent_for_the_owner() {
    let Some(url) = test_url("create_bucket_is_idempotent_for_the_owner", "") else {
        return;
    };
    let store = S3Store::from_url(&url).unwrap();
    store.create_bucket().await.unwrap();
    store.create_bucket().await.unwrap();
}

/// Needs no server: nothing listens on port 9 of loopback.
#[tokio::test]
async fn unreachable_endpoint_is_unavailable_not_other() {
    let store = S3Store::from_url(
        "s3://nobucket/x?endpoint=http://127.0.0.1:9&region=us-east-1&allow_http=true\
         &access_key_id=a&secret_access_key=b",
    )
    .unwrap();
    let k = key("k");
    let err = store.get(&k).await.unwrap_err();
    assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    assert!(err.is_ambiguous() && err.is_retryable());
    let err = store
        .put(&k, Bytes::new(), PutMode::Create)
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    let err = store.list("").await.unwrap_err();
    assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
}

/// A tiny latency measurement for the docs: `cargo test -p strata-storage-s3 --test s3_backend
/// -- --ignored --nocapture measure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, not a check"]
async fn measure_op_latencies() {
    let Some(url) = test_url("measure_op_latencies", "") else {
        return;
    };
    let store = S3Store::from_url(&url).unwrap();
    strata_storage::conformance::measure_op_latencies(&store, &unique("measure"), 200, "").await;
}
