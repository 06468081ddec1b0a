//! A cluster node: joining, its lifecycle, the owner cache, and the fencing watchdog.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use strata_cluster::admin::drain_request;
use strata_cluster::{
    join_with_allocated_id, Claimant, ClusterError, ClusterResult, ClusterView, ControllerConfig,
    Incarnation, ListenerEndpoint, LocalBroker, Membership, MembershipConfig, MembershipHandle,
    Newcomer, OsProcessTable, OwnerRecord, OwnerState, Ownership, OwnershipRunner, OwnershipStatus,
    RunnerConfig, RunnerHandle, VersionedRecord,
};
use strata_core::{BrokerId, Clock, Epoch, Ticker, TopicPartition};

/// The node-id ranges (hand-set ids up to the first, allocated ids from the second), for the
/// server's settings.
pub use strata_cluster::{FIRST_ALLOCATED_NODE_ID, MAX_CONFIGURED_NODE_ID};
use strata_log::{LogError, LogManager, TopicId};
use strata_storage::{ObjectStore, StorageError};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::host::LogHost;
use super::stats::{ClusterMetrics, OwnershipStats};
use crate::coordinator::GroupCoordinator;
use crate::ClusterSettings;

/// How many ownership refreshes pass between two looks at our drain request: draining is an
/// operator action, a second of delay is fine, and it saves a storage read per refresh.
const DRAIN_POLL_EVERY: u32 = 4;

/// While a partition changes hands, the owner cache (what Metadata answers) is re-read this
/// often, so clients sent away with NOT_LEADER_OR_FOLLOWER learn the new owner in
/// milliseconds rather than after the next `ownership_interval`.
const HANDOVER_REFRESH: Duration = Duration::from_millis(10);

/// Fast refreshes stop after this long even if the cache never settles (e.g. a successor that
/// is slow to claim): the regular refresh takes over.
const HANDOVER_REFRESH_FOR: Duration = Duration::from_secs(2);

/// The resource name of a partition (`strata_layout::cluster` defines it).
pub use strata_layout::cluster::{
    parse_partition_resource as parse_resource, partition_resource as resource_name,
};

/// Why a cluster node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterStartError {
    #[error("log: {0}")]
    Log(#[from] LogError),
    #[error("cluster: {0}")]
    Cluster(#[from] ClusterError),
}

/// This broker's membership in a cluster, and its read side for the Kafka handlers.
#[derive(Debug)]
pub struct ClusterNode {
    me: BrokerId,
    incarnation: Incarnation,
    store: Arc<dyn ObjectStore>,
    log: Arc<LogManager>,
    ownership: Ownership,
    view: watch::Receiver<ClusterView>,
    status: watch::Receiver<OwnershipStatus>,
    /// Every ownership record, by resource, as of the last refresh.
    owners: std::sync::RwLock<Arc<BTreeMap<String, OwnerRecord>>>,
    membership: Mutex<Option<MembershipHandle>>,
    runner: Mutex<Option<RunnerHandle>>,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Separate from `tasks`: leaving stops it first, so that the runner and membership
    /// ending on purpose are not taken for being fenced.
    watchdog: std::sync::Mutex<Option<JoinHandle<()>>>,
    fatal: watch::Sender<Option<String>>,
    draining: AtomicBool,
    /// Set by `leave`: from then on a withdrawn drain request must not clear the draining
    /// mark leaving relies on.
    leaving: AtomicBool,
    clock: Arc<dyn Clock>,
    stats: Arc<OwnershipStats>,
    lease_period: Duration,
}

/// A broker registered in the cluster but not yet serving: what [`ClusterNode::join`] returns
/// and [`ClusterNode::start_joined`] takes. The log must be opened in between, under
/// [`node_id`](Self::node_id), which with an allocated id is only known here.
#[derive(Debug)]
pub struct Joined {
    membership: MembershipHandle,
    node_id: BrokerId,
    incarnation: Incarnation,
}

impl Joined {
    pub fn node_id(&self) -> BrokerId {
        self.node_id
    }
}

impl ClusterNode {
    /// Registers this broker and starts heartbeating. With `node_id` set, waits out the lease
    /// of a dead predecessor with that id (at once if its process is provably gone from this
    /// machine) and refuses if a live broker has it. Without, the cluster allocates one
    /// (`strata_cluster::node_ids`): a crashed predecessor's on this machine, else the lowest
    /// free id from 1001 up.
    pub async fn join(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        settings: &ClusterSettings,
        node_id: Option<BrokerId>,
        advertised: (String, u16),
        seed: u64,
    ) -> Result<Joined, ClusterStartError> {
        Self::join_with_listeners(
            store,
            clock,
            settings,
            node_id,
            advertised,
            Vec::new(),
            seed,
        )
        .await
    }

    /// [`join`](Self::join), registering the endpoint of every named listener too, so other
    /// brokers tell a client this broker's address on the listener the client uses.
    pub async fn join_with_listeners(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        settings: &ClusterSettings,
        node_id: Option<BrokerId>,
        advertised: (String, u16),
        listeners: Vec<ListenerEndpoint>,
        seed: u64,
    ) -> Result<Joined, ClusterStartError> {
        // Random (from the process's seed), not a counter: a restarted process must never
        // reuse its predecessor's.
        let incarnation = Incarnation::random(&mut StdRng::seed_from_u64(seed));
        let config = MembershipConfig {
            heartbeat_interval: settings.heartbeat_interval,
            lease_period: settings.lease_period,
            remember_departed: settings.departed_broker_listing,
        };
        // A broker restarted on the same machine after a crash proves its predecessor dead
        // through the process table and takes its id over without waiting a lease.
        let processes = Arc::new(OsProcessTable);
        let membership = match node_id {
            Some(node_id) => {
                let mut membership = Membership::new(
                    store,
                    clock,
                    config,
                    LocalBroker {
                        node_id,
                        host: advertised.0,
                        port: advertised.1,
                        incarnation,
                        listeners: listeners.clone(),
                    },
                )?
                .with_process_table(processes);
                info!(broker = %node_id, %incarnation, "joining the cluster");
                membership.join().await?;
                membership
            }
            None => {
                info!(%incarnation, "joining the cluster with an allocated node id");
                join_with_allocated_id(
                    store,
                    clock,
                    config,
                    Newcomer {
                        host: advertised.0,
                        port: advertised.1,
                        incarnation,
                        listeners,
                    },
                    processes,
                )
                .await?
            }
        };
        let node_id = membership.me().node_id;
        Ok(Joined {
            membership: membership.spawn(),
            node_id,
            incarnation,
        })
    }

    /// Starts taking partitions as the member `joined`. `log` must have been opened with
    /// `Ownership::Managed` under the joined node id, `groups` started without loading any
    /// shard.
    pub async fn start_joined(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        log: Arc<LogManager>,
        groups: Arc<GroupCoordinator>,
        txn: Arc<crate::txn_coordinator::TxnCoordinator>,
        joined: Joined,
        settings: ClusterSettings,
    ) -> Result<Arc<Self>, ClusterStartError> {
        let Joined {
            membership,
            node_id,
            incarnation,
        } = joined;
        let view = membership.view();

        let stats = Arc::new(OwnershipStats::default());
        let host = LogHost {
            log: Arc::clone(&log),
            groups,
            txn: Some(txn),
            clock: Arc::clone(&clock),
            stats: Arc::clone(&stats),
            served: std::sync::Mutex::new(HashMap::new()),
        };
        let controller = ControllerConfig {
            // A newcomer is a placement target once it has been live this long; with short
            // leases (tests) the default 2s would dominate every takeover.
            placement_settle: settings.lease_period.min(Duration::from_secs(2)),
            // Stop serving a fifth of a lease before anybody could judge us dead.
            self_lease_margin: Some((settings.lease_period / 5).min(Duration::from_secs(1))),
            // A broker that joined after our last listing is not dead: give our next listing
            // time to see it before sealing its stream.
            dead_owner_grace: settings.heartbeat_interval * 2,
            auto_rebalance: settings.auto_rebalance,
            ..ControllerConfig::default()
        };
        let runner = OwnershipRunner::new(
            Arc::clone(&store),
            Arc::clone(&clock),
            Claimant {
                broker: node_id,
                incarnation,
                stream: Some(log.stream()),
            },
            controller,
            RunnerConfig {
                interval: settings.ownership_interval,
                in_flight_window: log.config().max_inflight_flushes as u64,
                // Zero turns the watch off (the S3 default, where each read is billed): moves
                // then wait for full rounds, except those this broker starts itself.
                watch_interval: Some(settings.move_watch_interval).filter(|w| !w.is_zero()),
                ..RunnerConfig::default()
            },
            view.clone(),
            host,
        );
        // The owner cache (Metadata) reads through the runner's `Ownership`: clones share its
        // cache of decoded records, so a changed record is read once, not once per poller.
        let ownership = runner.ownership().clone();
        let runner = runner.spawn();
        let status = runner.status();
        let records = runner.records();

        let node = Arc::new(Self {
            me: node_id,
            incarnation,
            ownership,
            store,
            log: Arc::clone(&log),
            view: view.clone(),
            status: status.clone(),
            owners: std::sync::RwLock::new(Arc::new(BTreeMap::new())),
            membership: Mutex::new(Some(membership)),
            runner: Mutex::new(Some(runner)),
            tasks: std::sync::Mutex::new(Vec::new()),
            watchdog: std::sync::Mutex::new(None),
            fatal: watch::Sender::new(None),
            draining: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            clock: Arc::clone(&clock),
            stats,
            lease_period: settings.lease_period,
        });
        node.refresh_owners().await;
        let refresher = tokio::spawn(refresh_loop(
            Arc::downgrade(&node),
            Arc::clone(&clock),
            settings.ownership_interval,
            status.clone(),
            records,
        ));
        let watchdog = tokio::spawn(watch_fencing(
            Arc::downgrade(&node),
            log.fenced(),
            view,
            status,
        ));
        lock_tasks(&node.tasks).push(refresher);
        *lock_watchdog(&node.watchdog) = Some(watchdog);
        info!(broker = %node_id, %incarnation, stream = log.stream(), "cluster member");
        Ok(node)
    }

    pub fn node_id(&self) -> BrokerId {
        self.me
    }

    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// The latest membership view (live brokers with their addresses).
    pub fn view(&self) -> ClusterView {
        self.view.borrow().clone()
    }

    /// What the ownership runner reports: what we serve, whether we hold nothing.
    pub fn status(&self) -> OwnershipStatus {
        self.status.borrow().clone()
    }

    /// Every ownership record as of the last refresh.
    pub fn owners(&self) -> Arc<BTreeMap<String, OwnerRecord>> {
        match self.owners.read() {
            Ok(g) => Arc::clone(&g),
            Err(e) => Arc::clone(&e.into_inner()),
        }
    }

    /// The live leader of a partition and its epoch, as far as this broker knows: the owner
    /// of an Active record whose incarnation is live. Our own log is more current than the
    /// cache for what we serve ourselves (an acquire that just finished), and for what we do
    /// *not* serve: a cached record naming us that our log does not serve is one we just
    /// handed over (or are still acquiring). Naming ourselves would send the client straight
    /// back to a broker that refuses it until the next refresh; no leader makes it ask again.
    pub fn leader_of(
        &self,
        view: &ClusterView,
        owners: &BTreeMap<String, OwnerRecord>,
        topic: TopicId,
        tp: &TopicPartition,
    ) -> Option<(BrokerId, Epoch)> {
        let cached = owners
            .get(&resource_name(topic, tp.partition))
            .filter(|r| {
                r.state == OwnerState::Active && view.is_live_incarnation(r.owner, r.incarnation)
            })
            .map(|r| (r.owner, r.epoch));
        // Readable counts as served: a partition whose appends are suspended while our lease is
        // in doubt still serves fetches, and its produce errors are retriable storage errors.
        match (self.log.readable_epoch(tp), cached) {
            (Some(mine), Some((_, epoch))) if mine >= epoch.0 => Some((self.me, Epoch(mine))),
            (Some(mine), None) => Some((self.me, Epoch(mine))),
            (None, Some((owner, _))) if owner == self.me => None,
            (_, cached) => cached,
        }
    }

    /// A topic or partitions were created or deleted here: every broker (this one included)
    /// runs a full ownership round within its move watch interval, so new partitions are
    /// served in milliseconds rather than after the next regular round.
    pub async fn announce_topology_change(&self) {
        self.ownership.announce_change().await;
        self.observe_now().await;
    }

    /// Our own change of placement or topology: our runner acts on it now, whatever the move
    /// watch (which may be off). The other brokers see it at their next watch or round.
    async fn observe_now(&self) {
        if let Some(runner) = self.runner.lock().await.as_ref() {
            runner.observe_now();
        }
    }

    /// The lease: a healthy cluster gives every partition an owner within it.
    pub fn lease_period(&self) -> Duration {
        self.lease_period
    }

    /// Membership and ownership-change figures for `/metrics`.
    pub fn metrics(&self) -> ClusterMetrics {
        ClusterMetrics {
            live_brokers: self.view.borrow().members.len(),
            draining: self.draining.load(Ordering::Relaxed),
            partitions_owned: self.status.borrow().serving.len(),
            ownership: self.stats.snapshot(),
        }
    }

    /// Completes when this process must stop (see the module doc), with the reason.
    pub async fn fatal(&self) -> String {
        let mut fatal = self.fatal.subscribe();
        loop {
            if let Some(reason) = fatal.borrow_and_update().clone() {
                return reason;
            }
            if fatal.changed().await.is_err() {
                // Unreachable while `self` lives (it holds the sender).
                std::future::pending::<()>().await;
            }
        }
    }

    /// Places `resource` on `target` (None: back to hashing) — AlterPartitionReassignments.
    pub async fn set_placement(
        &self,
        resource: &str,
        target: Option<BrokerId>,
    ) -> ClusterResult<()> {
        let changed = match target {
            Some(broker) => {
                self.ownership
                    .set_placement_override(resource, broker)
                    .await
            }
            None => match self.ownership.clear_placement_override(resource).await {
                Err(ClusterError::Storage(StorageError::NotFound(_))) => Ok(()),
                other => other,
            },
        };
        if changed.is_ok() {
            self.observe_now().await;
        }
        changed
    }

    /// Reassignments in progress: overrides whose target is not yet the live owner, with the
    /// current owner if any.
    pub async fn reassignments(&self) -> ClusterResult<Vec<(String, BrokerId, Option<BrokerId>)>> {
        let overrides = self.ownership.placement_overrides().await?;
        let owners = self.owners();
        let view = self.view();
        Ok(overrides
            .into_iter()
            .filter_map(|(resource, target)| {
                let owner = owners
                    .get(&resource)
                    .filter(|r| {
                        r.state == OwnerState::Active
                            && view.is_live_incarnation(r.owner, r.incarnation)
                    })
                    .map(|r| r.owner);
                (owner != Some(target)).then_some((resource, target, owner))
            })
            .collect())
    }

    /// Graceful stop (SIGTERM): mark ourselves draining so placement moves every partition
    /// away, wait up to `patience` until we hold nothing, then stop the runner and leave
    /// (delete our registration). Waits for nothing when no other broker could take over.
    /// What is still held after `patience` is taken over by fencing once we have left.
    pub async fn leave(&self, patience: Duration) {
        self.leaving.store(true, Ordering::Relaxed);
        // The owner cache keeps refreshing meanwhile: Metadata must point clients at the
        // partitions' new owners while we hand over.
        if let Some(watchdog) = lock_watchdog(&self.watchdog).take() {
            watchdog.abort();
        }
        let others = self
            .view()
            .members
            .iter()
            .filter(|(id, m)| **id != self.me && !m.registration.draining)
            .count();
        if let Some(membership) = self.membership.lock().await.as_ref() {
            if others > 0 {
                if let Err(e) = membership.set_draining(true).await {
                    warn!(error = %e, "could not mark this broker draining");
                }
            }
        }
        if others > 0 {
            info!(
                held = self.status().serving.len(),
                "handing partitions over before leaving"
            );
            let mut status = self.status.clone();
            let mut view = self.view.clone();
            let me = self.me;
            // Brokers stopped together each see the others draining too: nobody is left to
            // take a partition, and waiting out `patience` would only delay every exit.
            // What we hold is durable (the log flushes on shutdown) and is taken over by
            // fencing when a broker next starts.
            let nobody_to_take = async move {
                let _ = view
                    .wait_for(|v| {
                        v.members
                            .iter()
                            .all(|(id, m)| *id == me || m.registration.draining)
                    })
                    .await;
            };
            let handed_over = strata_core::timeout(self.clock.as_ref(), patience, async {
                tokio::select! {
                    done = status.wait_for(|s| s.holds_nothing) => done.is_ok(),
                    () = nobody_to_take => false,
                }
            });
            match handed_over.await {
                Ok(true) => {}
                Ok(false) => info!(
                    still_held = self.status().serving.len(),
                    "no live broker is left to take partitions (all are leaving or draining); \
                     leaving now (they are taken over by fencing when a broker starts)"
                ),
                Err(_) => warn!(
                    still_held = self.status().serving.len(),
                    ?patience,
                    "partitions not handed over in time; leaving anyway (they are taken over by fencing)"
                ),
            }
        }
        if let Some(runner) = self.runner.lock().await.take() {
            if let Err(e) = runner.stop().await {
                warn!(error = %e, "ownership runner ended with an error");
            }
        }
        if let Some(membership) = self.membership.lock().await.take() {
            match membership.leave().await {
                Ok(()) => info!("left the cluster"),
                Err(e) => warn!(error = %e, "could not leave the cluster cleanly"),
            }
        }
        self.stop_tasks();
    }

    /// After being fenced: stops everything and withdraws our registration if it is still
    /// ours, so the other brokers stop advertising this one to clients (Metadata) at their
    /// next listing instead of a lease later — clients would otherwise keep trying to connect
    /// to a process that is gone. Nothing is handed over: our successors already fenced us and
    /// took what we held.
    pub async fn withdraw(&self, patience: Duration) {
        if let Some(watchdog) = lock_watchdog(&self.watchdog).take() {
            watchdog.abort();
        }
        self.stop_tasks();
        if let Some(runner) = self.runner.lock().await.take() {
            let _ = runner.stop().await;
        }
        if let Some(membership) = self.membership.lock().await.take() {
            match strata_core::timeout(self.clock.as_ref(), patience, membership.leave()).await {
                Ok(Ok(())) => info!("withdrew this broker's registration"),
                Ok(Err(e)) => warn!(error = %e, "could not withdraw this broker's registration"),
                Err(_) => warn!(
                    ?patience,
                    "withdrawing this broker's registration timed out"
                ),
            }
        }
    }

    /// Stops every task without releasing or leaving: to the others this broker simply died
    /// (its lease lapses, its stream gets sealed). For tests of failover.
    pub async fn halt(&self) {
        self.stop_tasks();
        if let Some(runner) = self.runner.lock().await.take() {
            let _ = runner.stop().await;
        }
        // Dropping the handle stops heartbeats without deleting the registration.
        drop(self.membership.lock().await.take());
    }

    fn stop_tasks(&self) {
        if let Some(watchdog) = lock_watchdog(&self.watchdog).take() {
            watchdog.abort();
        }
        for task in lock_tasks(&self.tasks).drain(..) {
            task.abort();
        }
    }

    /// A process paused past its lease (SIGSTOP, a long GC-like stall, a frozen VM) comes back
    /// believing it still serves its partitions; if a successor sealed its stream meanwhile it
    /// must stop before it claims anything again. Costs a listing only while our own lease is
    /// in doubt.
    async fn check_sealed_after_lapse(&self) {
        let lapsed = self
            .view
            .borrow()
            .self_lease_until
            .is_some_and(|until| self.clock.monotonic() > until);
        if !lapsed {
            return;
        }
        match self.log.is_sealed().await {
            Ok(true) => {
                for (tp, _) in self.log.served() {
                    self.log.abandon(&tp);
                }
                self.die("our lease lapsed and a successor sealed our write-ahead stream".into());
            }
            Ok(false) => {}
            Err(e) => warn!(error = %e, "could not check whether our stream was sealed"),
        }
    }

    /// One listing, plus a read of each record that changed since the last refresh (`Ownership`
    /// keeps what it read): while nothing moves, a refresh costs one request whatever the
    /// number of partitions (on backends whose listings carry change tags; RADOS reads all).
    pub(crate) async fn refresh_owners(&self) {
        match self.ownership.list("").await {
            Ok(records) => self.set_owners(
                records
                    .into_iter()
                    .map(|(r, (_, record))| (r, record))
                    .collect(),
            ),
            Err(e) => warn!(error = %e, "could not refresh ownership records"),
        }
    }

    fn set_owners(&self, owners: BTreeMap<String, OwnerRecord>) {
        match self.owners.write() {
            Ok(mut g) => *g = Arc::new(owners),
            Err(e) => *e.into_inner() = Arc::new(owners),
        }
    }

    /// Whether the owner cache agrees with what we serve: every partition names an Active
    /// owner, and those naming us are the ones we serve. Otherwise a handover is in flight.
    fn owners_settled(&self) -> bool {
        let serving = self.status.borrow().serving.clone();
        self.owners().iter().all(|(resource, record)| {
            record.state == OwnerState::Active
                && (record.owner != self.me || serving.contains_key(resource))
        })
    }

    async fn check_drain_request(&self) {
        let requested = match drain_request(self.store.as_ref(), self.me).await {
            Ok(requested) => requested,
            Err(e) => {
                warn!(error = %e, "could not read drain requests");
                return;
            }
        };
        if self.draining.load(Ordering::Relaxed) {
            // `strata broker undrain` withdrew the request: take partitions again, without
            // the restart that used to be the only way back.
            if requested != Some(self.incarnation) && !self.leaving.load(Ordering::Relaxed) {
                info!("drain request withdrawn: taking partitions again");
                if let Some(membership) = self.membership.lock().await.as_ref() {
                    match membership.set_draining(false).await {
                        Ok(()) => self.draining.store(false, Ordering::Relaxed),
                        Err(e) => warn!(error = %e, "could not clear this broker's draining mark"),
                    }
                }
            }
            return;
        }
        if requested != Some(self.incarnation) {
            return;
        }
        info!("drain requested: handing every partition over");
        if let Some(membership) = self.membership.lock().await.as_ref() {
            match membership.set_draining(true).await {
                Ok(()) => self.draining.store(true, Ordering::Relaxed),
                Err(e) => warn!(error = %e, "could not mark this broker draining"),
            }
        }
    }

    fn die(&self, reason: String) {
        error!(
            reason,
            "this broker can no longer acknowledge anything; it must restart"
        );
        self.fatal.send_replace(Some(reason));
    }
}

fn lock_tasks(
    tasks: &std::sync::Mutex<Vec<JoinHandle<()>>>,
) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
    match tasks.lock() {
        Ok(g) => g,
        Err(e) => e.into_inner(),
    }
}

fn lock_watchdog(
    watchdog: &std::sync::Mutex<Option<JoinHandle<()>>>,
) -> std::sync::MutexGuard<'_, Option<JoinHandle<()>>> {
    match watchdog.lock() {
        Ok(g) => g,
        Err(e) => e.into_inner(),
    }
}

/// Keeps the owner cache current: from the ownership runner's rounds, which list every record
/// anyway (so the cache costs no listing of its own), and by listing every 10 ms while a
/// partition changes hands here. Also runs the regular checks of the node (sealed stream after
/// a lapsed lease, drain requests).
async fn refresh_loop(
    node: Weak<ClusterNode>,
    clock: Arc<dyn Clock>,
    interval: Duration,
    mut status: watch::Receiver<OwnershipStatus>,
    mut records: watch::Receiver<Arc<BTreeMap<String, VersionedRecord>>>,
) {
    let mut ticker = Ticker::new(Arc::clone(&clock), interval);
    let mut until_drain_poll = DRAIN_POLL_EVERY;
    // Until when (node clock) to refresh fast: what we serve changed, so a partition is
    // changing hands and the cache is about to be wrong for it.
    let mut fast_until: Option<Duration> = None;
    let mut status_open = true;
    let mut records_open = true;
    loop {
        let fast = fast_until.is_some();
        let regular = tokio::select! {
            changed = records.changed(), if records_open => {
                let Some(node) = node.upgrade() else { return };
                match changed {
                    Ok(()) => {
                        let published = Arc::clone(&records.borrow_and_update());
                        node.set_owners(
                            published
                                .iter()
                                .map(|(r, (_, record))| (r.clone(), record.clone()))
                                .collect(),
                        );
                        if fast_until.is_some() && node.owners_settled() {
                            fast_until = None;
                        }
                    }
                    // The runner ended (leaving, fenced): the regular ticks list instead.
                    Err(_) => records_open = false,
                }
                continue;
            }
            _ = ticker.tick() => true,
            changed = status.changed(), if status_open => {
                match changed {
                    Ok(()) => {
                        if let Some(node) = node.upgrade() {
                            fast_until = Some(node.clock.monotonic() + HANDOVER_REFRESH_FOR);
                        }
                    }
                    // The runner ended (leaving, fenced): the regular refresh goes on.
                    Err(_) => status_open = false,
                }
                false
            }
            _ = clock.sleep(HANDOVER_REFRESH), if fast => false,
        };
        let Some(node) = node.upgrade() else { return };
        // A regular tick lists only when the runner no longer publishes its rounds.
        if !regular || !records_open {
            node.refresh_owners().await;
        }
        if fast_until.is_some_and(|until| node.clock.monotonic() >= until || node.owners_settled())
        {
            fast_until = None;
        }
        if !regular {
            // The slower checks below keep the regular pace.
            continue;
        }
        node.check_sealed_after_lapse().await;
        until_drain_poll -= 1;
        if until_drain_poll == 0 {
            until_drain_poll = DRAIN_POLL_EVERY;
            node.check_drain_request().await;
        }
    }
}

/// Watches for the signs that this process has been judged dead.
async fn watch_fencing(
    node: Weak<ClusterNode>,
    mut log_fenced: watch::Receiver<bool>,
    mut view: watch::Receiver<ClusterView>,
    mut status: watch::Receiver<OwnershipStatus>,
) {
    let reason = loop {
        if *log_fenced.borrow_and_update() {
            break "our write-ahead stream was sealed by another broker";
        }
        if view.borrow_and_update().registration_lost {
            break "our registration was taken over by another incarnation";
        }
        if status.borrow_and_update().fenced {
            break "the ownership runner was fenced";
        }
        tokio::select! {
            r = log_fenced.changed() => if r.is_err() { break "the log stopped" },
            r = view.changed() => if r.is_err() { break "the membership task stopped" },
            r = status.changed() => if r.is_err() { break "the ownership runner stopped" },
        }
    };
    let Some(node) = node.upgrade() else { return };
    // Stop serving at once: nothing can be acknowledged any more, and readers must go to the
    // new owners.
    if let Some(runner) = node.runner.lock().await.as_ref() {
        let _ = runner.self_fenced().await;
    }
    for (tp, _) in node.log.served() {
        node.log.abandon(&tp);
    }
    node.die(reason.to_string());
}
