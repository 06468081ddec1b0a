//! Runs the storage conformance suite and RADOS-specific checks against a real Ceph cluster named
//! by `STRATA_TEST_RADOS_URL` (scripts/ceph-up.sh prints an env file to `source`). Without the
//! variable, or in a build without the `rados` feature, every test prints a notice and passes as
//! skipped: `cargo test -p strata-storage-rados --features rados`.

// Tests run against a real server in real time (see clippy.toml).
#![allow(clippy::disallowed_methods)]
// Test helpers outside #[test] functions: a failed unwrap is how they report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The cluster URL, or `None` (and a notice) when these tests cannot run here.
fn test_url(test: &str) -> Option<String> {
    if !strata_storage_rados::RADOS_SUPPORTED {
        eprintln!("SKIPPED {test}: built without the `rados` feature");
        return None;
    }
    match std::env::var("STRATA_TEST_RADOS_URL") {
        Ok(url) if !url.is_empty() => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
            Some(url)
        }
        _ => {
            eprintln!("SKIPPED {test}: STRATA_TEST_RADOS_URL is not set (see scripts/ceph-up.sh)");
            None
        }
    }
}

#[cfg(feature = "rados")]
mod with_rados {
    use std::sync::Arc;

    use bytes::Bytes;
    use strata_storage::{conformance, ObjectKey, ObjectStore, PutMode, StorageError, Version};
    use strata_storage_rados::RadosStore;

    use super::test_url;

    fn unique(name: &str) -> String {
        format!("{name}-{}", uuid::Uuid::new_v4().simple())
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(name).unwrap()
    }

    /// The URL moved into a namespace of its own, so runs cannot see each other's objects.
    fn in_namespace(url: &str, namespace: &str) -> String {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let pool_only = base
            .trim_start_matches("rados://")
            .split('/')
            .next()
            .unwrap_or_default();
        format!("rados://{pool_only}/{namespace}?{query}")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn rados_store_passes_conformance() {
        let Some(url) = test_url("rados_store_passes_conformance") else {
            return;
        };
        let store: Arc<dyn ObjectStore> = Arc::new(RadosStore::connect(&url).await.unwrap());
        conformance::run_all(store, &format!("conformance/{}", unique("run"))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn rados_store_passes_conformance_in_a_namespace() {
        let Some(url) = test_url("rados_store_passes_conformance_in_a_namespace") else {
            return;
        };
        let url = in_namespace(&url, &unique("ns"));
        let store: Arc<dyn ObjectStore> = Arc::new(RadosStore::connect(&url).await.unwrap());
        conformance::run_all(store, "conformance").await;
    }

    /// Namespaces isolate: the same key in two namespaces is two objects, and listing one never
    /// shows the other's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn namespaces_isolate_keys_and_listings() {
        let Some(url) = test_url("namespaces_isolate_keys_and_listings") else {
            return;
        };
        let a = RadosStore::connect(&in_namespace(&url, &unique("a")))
            .await
            .unwrap();
        let b = RadosStore::connect(&in_namespace(&url, &unique("b")))
            .await
            .unwrap();
        let k = key("brokers/1");
        a.put(&k, Bytes::from_static(b"in a"), PutMode::Create)
            .await
            .unwrap();
        b.put(&k, Bytes::from_static(b"in b"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(&a.get(&k).await.unwrap().0[..], b"in a");
        assert_eq!(&b.get(&k).await.unwrap().0[..], b"in b");
        let listed: Vec<String> = a
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.key.to_string())
            .collect();
        assert_eq!(listed, vec!["brokers/1".to_string()]);
        a.delete(&k).await.unwrap();
        b.delete(&k).await.unwrap();
    }

    /// Versions are RADOS object versions: decimal, growing with every write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn versions_are_object_versions_that_grow() {
        let Some(url) = test_url("versions_are_object_versions_that_grow") else {
            return;
        };
        let store = RadosStore::connect(&url).await.unwrap();
        let k = key(&format!("versions/{}", unique("k")));
        let v1 = store
            .put(&k, Bytes::from_static(b"x"), PutMode::Create)
            .await
            .unwrap();
        let v2 = store
            .put(&k, Bytes::from_static(b"x"), PutMode::Update(v1.clone()))
            .await
            .unwrap();
        let n1: u64 = v1.0.parse().unwrap();
        let n2: u64 = v2.0.parse().unwrap();
        assert!(n2 > n1, "{n1} then {n2}");
        let ahead = Version((n2 + 1000).to_string());
        let err = store
            .put(&k, Bytes::new(), PutMode::Update(ahead))
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Precondition(_)), "{err:?}");
        store.delete(&k).await.unwrap();
    }

    /// A wrong pool is a configuration error at connect time, not at the first write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_pool_fails_at_connect() {
        let Some(url) = test_url("missing_pool_fails_at_connect") else {
            return;
        };
        let (_, query) = url.split_once('?').unwrap_or((&url, ""));
        let err = RadosStore::connect(&format!("rados://no-such-pool-{}?{query}", unique("p")))
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{err:?}");
    }

    /// A cluster nobody answers for is Unavailable after the mount timeout, not a hang. Needs
    /// librados but no cluster.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unreachable_monitors_are_unavailable_after_the_mount_timeout() {
        let dir = std::env::temp_dir().join(unique("strata-rados-unreachable"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("ceph.conf");
        // Port 9 on loopback: nothing listens there. No auth, so it is the network that fails.
        std::fs::write(
            &conf,
            "[global]\nmon_host = 127.0.0.1:9\nauth_client_required = none\n\
             auth_cluster_required = none\nauth_service_required = none\n\
             log_file = /dev/null\n",
        )
        .unwrap();
        let url = format!(
            "rados://strata?conf={}&client_mount_timeout=2",
            conf.to_string_lossy()
        );
        let started = tokio::time::Instant::now();
        let err = RadosStore::connect(&url).await.unwrap_err();
        let elapsed = started.elapsed();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
        assert!(
            elapsed < std::time::Duration::from_secs(10),
            "took {elapsed:?}"
        );
    }

    /// The in-flight limit queues callers instead of failing them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn more_callers_than_the_in_flight_limit_all_complete() {
        let Some(url) = test_url("more_callers_than_the_in_flight_limit_all_complete") else {
            return;
        };
        let store = Arc::new(
            RadosStore::connect(&format!("{url}&max_in_flight=2"))
                .await
                .unwrap(),
        );
        let prefix = unique("limit");
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let store = Arc::clone(&store);
                let k = key(&format!("{prefix}/{i:03}"));
                tokio::spawn(async move {
                    store
                        .put(&k, Bytes::from(vec![i as u8; 1000]), PutMode::Create)
                        .await?;
                    store.get(&k).await
                })
            })
            .collect();
        for task in futures::future::join_all(tasks).await {
            task.unwrap().unwrap();
        }
        let listed = store.list(&format!("{prefix}/")).await.unwrap();
        assert_eq!(listed.len(), 40);
        assert!(listed.iter().all(|m| m.size == 1000));
        for meta in listed {
            store.delete(&meta.key).await.unwrap();
        }
    }

    /// A tiny latency measurement for the docs: `cargo test -p strata-storage-rados --features
    /// rados --test rados_backend -- --ignored --nocapture measure`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "measurement, not a check"]
    async fn measure_op_latencies() {
        let Some(url) = test_url("measure_op_latencies") else {
            return;
        };
        let store = RadosStore::connect(&url).await.unwrap();
        strata_storage::conformance::measure_op_latencies(
            &store,
            &unique("measure"),
            500,
            " (pool-wide scan + stats)",
        )
        .await;
    }
}

#[cfg(not(feature = "rados"))]
#[test]
fn rados_tests_need_the_rados_feature() {
    // Prints the notice (and passes) so a run without the feature says why nothing ran.
    assert!(test_url("rados_backend").is_none());
}
