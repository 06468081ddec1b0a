//! Test scaffolding shared by the runner's tests and the polling-cost test: a resource host
//! that records what it is told, a broker (membership + ownership runner) built on it, a
//! store whose listings carry no change tags (as RADOS's), and a process table whose dead
//! processes the test decides (membership and node-id allocation).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use strata_core::clock::ManualClock;
use strata_core::{BrokerId, Epoch};
use strata_storage::{ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageResult, Version};

use crate::membership::{Incarnation, LocalBroker, Membership, MembershipConfig};
use crate::process::{ProcessIdentity, ProcessTable};
use crate::{
    Claimant, ClusterResult, ControllerConfig, OwnershipRunner, ResourceHost, RunnerConfig,
    StopReason,
};

/// A host that records what it was told.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recorder {
    pub resources: BTreeSet<String>,
    pub serving: Arc<Mutex<BTreeMap<String, Epoch>>>,
    pub stops: Arc<Mutex<Vec<(String, StopReason)>>>,
    /// The size of every batch `start_serving_all` was given.
    pub batches: Arc<Mutex<Vec<usize>>>,
}

#[async_trait]
impl ResourceHost for Recorder {
    async fn resources(&self) -> ClusterResult<BTreeSet<String>> {
        Ok(self.resources.clone())
    }
    fn known_resources(&self) -> Option<BTreeSet<String>> {
        Some(self.resources.clone())
    }
    async fn start_serving(&self, resource: &str, epoch: Epoch) -> ClusterResult<()> {
        self.serving
            .lock()
            .unwrap()
            .insert(resource.to_string(), epoch);
        Ok(())
    }
    async fn start_serving_all(&self, batch: &[(String, Epoch)]) -> Vec<ClusterResult<()>> {
        self.batches.lock().unwrap().push(batch.len());
        let mut results = Vec::new();
        for (resource, epoch) in batch {
            results.push(self.start_serving(resource, *epoch).await);
        }
        results
    }
    async fn stop_serving(&self, resource: &str, reason: StopReason) -> ClusterResult<()> {
        self.serving.lock().unwrap().remove(resource);
        self.stops
            .lock()
            .unwrap()
            .push((resource.to_string(), reason));
        Ok(())
    }
}

pub(crate) struct Node {
    pub membership: Membership,
    pub runner: OwnershipRunner<Recorder>,
}

pub(crate) fn node(
    store: &Arc<dyn ObjectStore>,
    clock: &Arc<ManualClock>,
    id: i32,
    names: &BTreeSet<String>,
) -> Node {
    let incarnation = Incarnation(id as u64 * 1000);
    let membership = Membership::new(
        store.clone(),
        clock.clone(),
        MembershipConfig::default(),
        LocalBroker {
            node_id: BrokerId(id),
            host: "h".into(),
            port: 1,
            incarnation,
            listeners: Vec::new(),
        },
    )
    .unwrap();
    let runner = OwnershipRunner::new(
        store.clone(),
        clock.clone(),
        Claimant {
            broker: BrokerId(id),
            incarnation,
            stream: Some(id as u32),
        },
        ControllerConfig {
            placement_settle: Duration::ZERO,
            ..ControllerConfig::default()
        },
        RunnerConfig::default(),
        membership.subscribe(),
        Recorder {
            resources: names.clone(),
            ..Recorder::default()
        },
    );
    Node { membership, runner }
}

pub(crate) async fn round(node: &mut Node) {
    node.membership.heartbeat().await.unwrap();
    node.membership.refresh().await.unwrap();
    node.runner.observe().await.unwrap();
    node.runner.act().await;
}

/// Brokers 1 and 2 over `names`, registered and through three rounds half a second
/// apart, so placement has settled and each serves its share.
pub(crate) async fn two_settled(
    a_store: &Arc<dyn ObjectStore>,
    b_store: &Arc<dyn ObjectStore>,
    clock: &Arc<ManualClock>,
    names: &BTreeSet<String>,
) -> (Node, Node) {
    let mut a = node(a_store, clock, 1, names);
    let mut b = node(b_store, clock, 2, names);
    a.membership.try_register().await.unwrap();
    b.membership.try_register().await.unwrap();
    for _ in 0..3 {
        clock.advance(Duration::from_millis(500));
        round(&mut a).await;
        round(&mut b).await;
    }
    (a, b)
}

pub(crate) fn serving(node: &Node) -> BTreeSet<String> {
    node.runner
        .host()
        .serving
        .lock()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// A store whose listings carry no change tags, as RADOS: every listed object must be read.
#[derive(Debug)]
pub(crate) struct Untagged(pub Arc<dyn ObjectStore>);

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

/// Counts the listings of write-ahead streams (each seal of a stream lists it).
#[derive(Debug)]
pub(crate) struct WalListings(pub Arc<dyn ObjectStore>, pub Arc<Mutex<usize>>);

#[async_trait]
impl ObjectStore for WalListings {
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
        if prefix.starts_with("wal/") {
            *self.1.lock().unwrap() += 1;
        }
        self.0.list(prefix).await
    }
    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        self.0.delete(key).await
    }
    fn backend_name(&self) -> &'static str {
        "wal-listings"
    }
}

/// A process table where the test decides which pids are gone.
#[derive(Debug, Default)]
pub(crate) struct FakeProcesses {
    pub me: u32,
    pub gone: Mutex<BTreeSet<u32>>,
}

impl FakeProcesses {
    pub fn shared(me: u32) -> Arc<Self> {
        Arc::new(Self {
            me,
            ..Self::default()
        })
    }

    pub fn mark_gone(&self, pid: u32) {
        self.gone.lock().unwrap().insert(pid);
    }
}

impl ProcessTable for FakeProcesses {
    fn current(&self) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            boot_id: "boot".into(),
            pid_namespace: "pid:[1]".into(),
            pid: self.me,
            start_ticks: 1,
        })
    }

    fn is_gone(&self, other: &ProcessIdentity) -> bool {
        self.gone.lock().is_ok_and(|g| g.contains(&other.pid))
    }
}
