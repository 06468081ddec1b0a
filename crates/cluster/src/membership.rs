//! Who is in the cluster, judged through storage alone.
//!
//! Each broker keeps one object, `cluster/brokers/<node id>`, holding its address, a random
//! incarnation id (new for every process start), its start time, a heartbeat counter and a
//! `draining` flag. It rewrites the object by compare-and-swap every `heartbeat_interval`; the
//! version change is the heartbeat. Everybody lists and reads the registrations every interval
//! and feeds the versions to a [`LivenessTracker`], which needs no synchronized clocks.
//!
//! Starting with an id that is already registered: if the registration is our own incarnation
//! (an earlier attempt whose answer was lost) we adopt it. If it names a process on this very
//! machine that provably no longer runs ([`crate::process`]: the usual crash-and-restart),
//! we take it over at once. Otherwise we watch it for a whole lease: if its version moves, a
//! live broker has that id and we refuse to start; if it stays still, its owner is dead and we
//! take the registration over by compare-and-swap (failing that, the owner just heartbeated
//! and we refuse after all).
//!
//! [`Membership`] exposes each step (`try_register`, `heartbeat`, `refresh`, `set_draining`,
//! `leave`) so the simulation can interleave brokers at will; [`Membership::spawn`] runs them
//! on a timer and hands back a [`MembershipHandle`] with a `watch` of the [`ClusterView`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_core::{BrokerId, Clock, Ticker};
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError, Version};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::keys::{broker_key, parse_broker_key, BROKERS_PREFIX};
use crate::liveness::LivenessTracker;
use crate::process::{NoProcessTable, ProcessIdentity, ProcessTable};
use crate::{ClusterError, ClusterResult};
use strata_layout::schema::{self, Schema};

pub use strata_layout::cluster::Incarnation;

/// The content of `cluster/brokers/<node id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub node_id: BrokerId,
    /// Advertised address, as clients should reach the broker (Metadata).
    pub host: String,
    pub port: u16,
    pub incarnation: Incarnation,
    /// Wall-clock start time, for operators only: liveness never compares clocks.
    pub started_ms: i64,
    /// Bumped by every heartbeat, so each write changes the object even if nothing else did.
    pub heartbeat: u64,
    /// A draining broker is live but gets nothing placed on it and hands everything off.
    #[serde(default)]
    pub draining: bool,
    /// The process behind this incarnation, so a successor on the same machine can prove it
    /// dead. None where the platform cannot tell (registrations of older versions too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessIdentity>,
    /// The endpoint of each named listener (`host`/`port` above are the first's), so a client
    /// is told every broker's address on the listener it came in on. Empty in registrations
    /// of older versions, which had one listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerEndpoint>,
}

/// Where clients of one named listener reach a broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerEndpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl BrokerRegistration {
    /// The address clients of listener `name` use: its named endpoint, or the registration's
    /// address when the broker registered none of that name.
    pub fn endpoint(&self, name: &str) -> (&str, u16) {
        self.listeners
            .iter()
            .find(|l| l.name == name)
            .map_or((self.host.as_str(), self.port), |l| {
                (l.host.as_str(), l.port)
            })
    }
}

impl BrokerRegistration {
    fn encode(&self) -> ClusterResult<Bytes> {
        Ok(schema::encode(self)?)
    }

    /// Decodes a registration read from `key`.
    pub fn decode(key: &ObjectKey, bytes: &[u8]) -> ClusterResult<Self> {
        Ok(schema::decode(key.as_str(), bytes)?)
    }
}

impl Schema for BrokerRegistration {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "broker registration";
}

/// Timing of membership. All are measured on each observer's own monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembershipConfig {
    /// How often a broker rewrites its registration and re-reads everybody else's.
    pub heartbeat_interval: Duration,
    /// How long a registration may stay unchanged before its broker counts as dead.
    pub lease_period: Duration,
    /// How long the view remembers a broker that left it (lease expired or registration
    /// withdrawn) in [`ClusterView::departed`]. Zero forgets at once.
    pub remember_departed: Duration,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            lease_period: Duration::from_secs(5),
            remember_departed: Duration::from_secs(15 * 60),
        }
    }
}

/// A registration silent for this many leases is deleted (see [`MembershipConfig::forget_after`]).
const FORGET_AFTER_LEASES: u32 = 60;

impl MembershipConfig {
    /// A registration that has not changed for this long belongs to a broker that is not
    /// coming back under that incarnation (a crash on another machine, a container gone), and
    /// is deleted, so dead brokers do not cost every broker a read per heartbeat forever and
    /// their ids can be allocated again. Far beyond the lease on purpose: everything the dead
    /// broker owned was taken over a lease after it stopped.
    pub fn forget_after(&self) -> Duration {
        self.lease_period * FORGET_AFTER_LEASES
    }

    /// An observer blind for longer than this grants everybody a fresh lease.
    pub fn max_observation_gap(&self) -> Duration {
        (self.lease_period / 2).max(self.heartbeat_interval * 2)
    }
}

/// What a starting broker says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalBroker {
    pub node_id: BrokerId,
    pub host: String,
    pub port: u16,
    pub incarnation: Incarnation,
    /// Named listeners' endpoints (see [`BrokerRegistration::listeners`]).
    pub listeners: Vec<ListenerEndpoint>,
}

/// One live broker as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub registration: BrokerRegistration,
    /// Observer's monotonic time since which the broker has been continuously live.
    pub live_since: Duration,
}

/// A broker that was live in an earlier view of this observer and is not any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    /// Its registration as last seen live (its endpoints).
    pub registration: BrokerRegistration,
    /// Observer's monotonic time of the first view without it.
    pub since: Duration,
}

/// One observer's picture of the cluster, republished after every listing round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// The observer's monotonic time of the listing this view comes from.
    pub observed_at: Duration,
    /// Live brokers only (the observer itself included once registered).
    pub members: BTreeMap<BrokerId, Member>,
    /// Brokers this observer saw live and that left since, for
    /// [`MembershipConfig::remember_departed`]; never a live one, never the observer. They
    /// own nothing: the broker layer only keeps listing them to clients for a while (see
    /// `departed_broker_listing` in the broker's Metadata).
    pub departed: BTreeMap<BrokerId, Departed>,
    /// Until when nobody can have judged *us* dead: one lease after we issued our last
    /// heartbeat that landed. None while unregistered.
    pub self_lease_until: Option<Duration>,
    /// Our registration was taken over: this process is considered dead and must stop.
    pub registration_lost: bool,
    /// Our last registration writes that landed, oldest first (at most [`RENEWALS_KEPT`]),
    /// and how much lease each found left: what [`Self::self_lease_unbroken_since`] needs to
    /// tell whether our lease held all along since an earlier view.
    pub self_lease_renewals: Vec<Renewal>,
}

/// How many [`Renewal`]s a view carries: half a minute of heartbeats at the default
/// interval, more than any round or run of actions lasts.
pub const RENEWALS_KEPT: usize = 32;

/// One registration write of ours that landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// Our monotonic time when we learned it landed (from then on the new lease counts).
    pub landed: Duration,
    /// Until when the lease before it ran (None: there was none, this write started one).
    pub previous_until: Option<Duration>,
}

impl ClusterView {
    /// Whether, by this view's renewals, our lease held with more than `margin` to spare at
    /// every moment from `since` to this view: each write that landed after `since` landed
    /// while the lease before it still had more than `margin` to run.
    ///
    /// That is what lets a decision use this view's `self_lease_until` with records read
    /// after `since` (by an older view): nobody can have judged us dead in between, so
    /// nobody can have taken over what those records say we hold. A renewal that landed late
    /// breaks it, and so does a gap the kept renewals no longer cover.
    pub fn self_lease_unbroken_since(&self, since: Duration, margin: Duration) -> bool {
        let renewals = &self.self_lease_renewals;
        // Every renewal after `since` is kept: the run of them starts before it, or nothing
        // was ever dropped.
        let covered =
            renewals.len() < RENEWALS_KEPT || renewals.first().is_some_and(|r| r.landed <= since);
        covered
            && !self.registration_lost
            && renewals.iter().filter(|r| r.landed > since).all(|r| {
                r.previous_until
                    .is_some_and(|until| r.landed + margin < until)
            })
    }

    pub fn is_live(&self, broker: BrokerId) -> bool {
        self.members.contains_key(&broker)
    }

    /// Whether `broker` is live *as the incarnation named*: an owner record written by an
    /// earlier life of a restarted broker belongs to a dead process.
    pub fn is_live_incarnation(&self, broker: BrokerId, incarnation: Incarnation) -> bool {
        self.members
            .get(&broker)
            .is_some_and(|m| m.registration.incarnation == incarnation)
    }

    pub fn is_draining(&self, broker: BrokerId) -> bool {
        self.members
            .get(&broker)
            .is_some_and(|m| m.registration.draining)
    }

    /// Advertised address of a live broker.
    pub fn address(&self, broker: BrokerId) -> Option<(&str, u16)> {
        self.members
            .get(&broker)
            .map(|m| (m.registration.host.as_str(), m.registration.port))
    }

    /// The brokers placement may target at `now`: live, not draining, and live for at least
    /// `settle` (so a flapping broker does not pull partitions back and forth). When no broker
    /// has settled yet (a cluster starting cold) every live non-draining broker qualifies.
    pub fn placement_candidates(&self, now: Duration, settle: Duration) -> BTreeSet<BrokerId> {
        let eligible = || {
            self.members
                .iter()
                .filter(|(_, m)| !m.registration.draining)
        };
        let settled: BTreeSet<BrokerId> = eligible()
            .filter(|(_, m)| now.saturating_sub(m.live_since) >= settle)
            .map(|(id, _)| *id)
            .collect();
        if settled.is_empty() {
            eligible().map(|(id, _)| *id).collect()
        } else {
            settled
        }
    }
}

/// Every registration in storage, by node id, with the version it was read at: decoded, or
/// why not (unreadable, or naming another node id than its key). One listing and a read per
/// registration; a registration deleted between the two is simply absent.
pub(crate) async fn read_registrations(
    store: &dyn ObjectStore,
) -> ClusterResult<BTreeMap<BrokerId, (ClusterResult<BrokerRegistration>, Version)>> {
    let mut registrations = BTreeMap::new();
    for listed in store.list_keys(BROKERS_PREFIX).await? {
        let Some(id) = parse_broker_key(listed.key.as_str()) else {
            continue;
        };
        let (bytes, version) = match store.get(&listed.key).await {
            Ok(found) => found,
            Err(StorageError::NotFound(_)) => continue, // left between list and get
            Err(e) => return Err(e.into()),
        };
        let read = BrokerRegistration::decode(&listed.key, &bytes).and_then(|registration| {
            if registration.node_id == id {
                Ok(registration)
            } else {
                Err(ClusterError::corrupt(
                    &listed.key,
                    format!("names node id {}", registration.node_id),
                ))
            }
        });
        registrations.insert(id, (read, version));
    }
    Ok(registrations)
}

/// How far `try_register` got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinProgress {
    Registered,
    /// Another incarnation holds our id; we are watching whether it is alive. Call again after
    /// a heartbeat interval; the answer is known at `decided_at` (our monotonic time) at latest.
    Waiting {
        previous: Option<Incarnation>,
        decided_at: Duration,
    },
}

#[derive(Debug, Clone)]
enum JoinState {
    Unregistered,
    Watching { version: Version, since: Duration },
    Registered { version: Version },
    Lost,
}

/// One broker's membership: its own registration and its view of everybody's.
#[derive(Debug)]
pub struct Membership {
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    config: MembershipConfig,
    key: ObjectKey,
    me: BrokerRegistration,
    state: JoinState,
    tracker: LivenessTracker,
    /// Our monotonic time when we issued the last registration write known to have landed.
    last_write_issued: Option<Duration>,
    /// The last [`RENEWALS_KEPT`] writes that landed (see [`ClusterView::self_lease_renewals`]).
    renewals: std::collections::VecDeque<Renewal>,
    view: watch::Sender<ClusterView>,
    processes: Arc<dyn ProcessTable>,
}

impl Membership {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        config: MembershipConfig,
        local: LocalBroker,
    ) -> ClusterResult<Self> {
        let key = broker_key(local.node_id)?;
        let me = BrokerRegistration {
            node_id: local.node_id,
            host: local.host,
            port: local.port,
            incarnation: local.incarnation,
            started_ms: clock.wall_millis(),
            heartbeat: 0,
            draining: false,
            process: None,
            listeners: local.listeners,
        };
        let tracker = LivenessTracker::new(config.lease_period, config.max_observation_gap());
        Ok(Self {
            store,
            clock,
            config,
            key,
            me,
            state: JoinState::Unregistered,
            tracker,
            last_write_issued: None,
            renewals: std::collections::VecDeque::new(),
            view: watch::Sender::new(ClusterView::default()),
            processes: Arc::new(NoProcessTable),
        })
    }

    /// Records our process in the registration and lets `processes` prove a predecessor on
    /// this machine dead (without it, taking over an id always waits a lease).
    pub fn with_process_table(mut self, processes: Arc<dyn ProcessTable>) -> Self {
        self.me.process = processes.current();
        self.processes = processes;
        self
    }

    pub fn me(&self) -> &BrokerRegistration {
        &self.me
    }

    pub fn config(&self) -> &MembershipConfig {
        &self.config
    }

    pub fn is_registered(&self) -> bool {
        matches!(self.state, JoinState::Registered { .. })
    }

    /// A receiver of every view this membership publishes.
    pub fn subscribe(&self) -> watch::Receiver<ClusterView> {
        self.view.subscribe()
    }

    /// The latest published view.
    pub fn view(&self) -> ClusterView {
        self.view.borrow().clone()
    }

    /// One registration attempt. Refuses (`BrokerIdInUse`) when a live broker holds our id.
    pub async fn try_register(&mut self) -> ClusterResult<JoinProgress> {
        match &self.state {
            JoinState::Registered { .. } => return Ok(JoinProgress::Registered),
            JoinState::Lost => {
                return Err(ClusterError::RegistrationLost {
                    broker: self.me.node_id,
                })
            }
            JoinState::Unregistered | JoinState::Watching { .. } => {}
        }
        let existing = match self.store.get(&self.key).await {
            Ok(found) => Some(found),
            Err(StorageError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let now = self.clock.monotonic();
        let lease = self.config.lease_period;
        let Some((bytes, version)) = existing else {
            return match self.write_registration(PutMode::Create).await {
                Ok(version) => Ok(self.registered(version)),
                // Somebody registered the id between our read and our write: watch them.
                Err(ClusterError::Storage(StorageError::AlreadyExists(_))) => {
                    self.state = JoinState::Unregistered;
                    Ok(JoinProgress::Waiting {
                        previous: None,
                        decided_at: now + lease,
                    })
                }
                Err(e) => Err(e),
            };
        };
        // A registration we cannot decode still heartbeats (or not) like any other.
        let previous = BrokerRegistration::decode(&self.key, &bytes).ok();
        if let Some(previous) = &previous {
            if previous.incarnation == self.me.incarnation {
                // An earlier attempt of ours landed although we saw it fail.
                self.me.heartbeat = self.me.heartbeat.max(previous.heartbeat);
                return Ok(self.registered(version));
            }
        }
        let previous_incarnation = previous.as_ref().map(|p| p.incarnation);
        let provably_gone = previous
            .as_ref()
            .and_then(|p| p.process.as_ref())
            .is_some_and(|process| self.processes.is_gone(process));
        if provably_gone {
            tracing::info!(broker = %self.me.node_id, previous = ?previous_incarnation,
                "previous incarnation's process no longer runs on this machine; taking its registration over");
            return match self.write_registration(PutMode::Update(version)).await {
                Ok(version) => Ok(self.registered(version)),
                // Changed under us: somebody else (alive) holds the id now.
                Err(ClusterError::Storage(StorageError::Precondition(_))) => {
                    self.state = JoinState::Unregistered;
                    Err(self.in_use(previous_incarnation))
                }
                Err(e) => Err(e),
            };
        }
        match &self.state {
            JoinState::Watching {
                version: watched,
                since,
            } if *watched == version => {
                if now.saturating_sub(*since) < lease {
                    return Ok(JoinProgress::Waiting {
                        previous: previous_incarnation,
                        decided_at: *since + lease,
                    });
                }
                tracing::info!(broker = %self.me.node_id, previous = ?previous_incarnation,
                    "previous incarnation stayed silent for a whole lease; taking its registration over");
                match self.write_registration(PutMode::Update(version)).await {
                    Ok(version) => Ok(self.registered(version)),
                    Err(ClusterError::Storage(StorageError::Precondition(_))) => {
                        self.state = JoinState::Unregistered;
                        Err(self.in_use(previous_incarnation))
                    }
                    Err(e) => Err(e),
                }
            }
            JoinState::Watching { .. } => {
                self.state = JoinState::Unregistered;
                Err(self.in_use(previous_incarnation))
            }
            _ => {
                tracing::info!(broker = %self.me.node_id, previous = ?previous_incarnation,
                    "broker id is registered by another incarnation; watching whether it is alive");
                self.state = JoinState::Watching {
                    version,
                    since: now,
                };
                Ok(JoinProgress::Waiting {
                    previous: previous_incarnation,
                    decided_at: now + lease,
                })
            }
        }
    }

    /// Registers, waiting (in real time) as long as it takes to judge a previous incarnation.
    pub async fn join(&mut self) -> ClusterResult<()> {
        loop {
            match self.try_register().await {
                Ok(JoinProgress::Registered) => break,
                Ok(JoinProgress::Waiting { .. }) => {}
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "registration failed; retrying");
                }
                Err(e) => return Err(e),
            }
            self.clock.sleep(self.config.heartbeat_interval).await;
        }
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "first membership listing failed; the next round retries");
        }
        Ok(())
    }

    /// One heartbeat: rewrites our registration by compare-and-swap.
    pub async fn heartbeat(&mut self) -> ClusterResult<()> {
        let version = match &self.state {
            JoinState::Registered { version } => version.clone(),
            JoinState::Lost => {
                return Err(ClusterError::RegistrationLost {
                    broker: self.me.node_id,
                })
            }
            JoinState::Unregistered | JoinState::Watching { .. } => {
                return Err(ClusterError::Invalid(
                    "heartbeat before registration".to_string(),
                ))
            }
        };
        self.me.heartbeat += 1;
        match self.write_registration(PutMode::Update(version)).await {
            Ok(version) => {
                self.state = JoinState::Registered { version };
                Ok(())
            }
            Err(ClusterError::Storage(StorageError::Precondition(_))) => self.resync().await,
            Err(e) => Err(e),
        }
    }

    /// Our compare-and-swap lost: either an earlier write of ours landed unseen (adopt it) or
    /// another incarnation took the registration (we are dead to the cluster).
    async fn resync(&mut self) -> ClusterResult<()> {
        match self.store.get(&self.key).await {
            Ok((bytes, version)) => match BrokerRegistration::decode(&self.key, &bytes) {
                Ok(current) if current.incarnation == self.me.incarnation => {
                    self.me.heartbeat = self.me.heartbeat.max(current.heartbeat) + 1;
                    let version = self.write_registration(PutMode::Update(version)).await?;
                    self.state = JoinState::Registered { version };
                    Ok(())
                }
                _ => Err(self.lost()),
            },
            // Removed by hand, not taken: put ours back unless somebody beats us to it.
            Err(StorageError::NotFound(_)) => {
                match self.write_registration(PutMode::Create).await {
                    Ok(version) => {
                        self.state = JoinState::Registered { version };
                        Ok(())
                    }
                    Err(ClusterError::Storage(StorageError::AlreadyExists(_))) => Err(self.lost()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sets or clears our `draining` flag and writes it at once.
    pub async fn set_draining(&mut self, draining: bool) -> ClusterResult<()> {
        self.me.draining = draining;
        self.heartbeat().await
    }

    /// One listing round: reads every registration, updates liveness, publishes the view.
    pub async fn refresh(&mut self) -> ClusterResult<ClusterView> {
        let mut registrations = BTreeMap::new();
        for (id, (read, version)) in read_registrations(self.store.as_ref()).await? {
            match read {
                Ok(registration) => {
                    registrations.insert(id, (registration, version));
                }
                Err(e) => tracing::warn!(error = %e, "unreadable registration ignored"),
            }
        }
        // Time is read after the reads: a later "first seen" only makes us more patient.
        let now = self.clock.monotonic();
        for (id, (_, version)) in &registrations {
            self.tracker.observe(now, *id, version);
        }
        self.forget_long_dead(now, &mut registrations).await;
        self.tracker.retain(|id| registrations.contains_key(&id));
        let members = registrations
            .into_iter()
            .filter_map(|(id, (registration, _))| {
                let live_since = self.tracker.live_since(now, id)?;
                Some((
                    id,
                    Member {
                        registration,
                        live_since,
                    },
                ))
            })
            .collect();
        self.log_departures(now, &members);
        let departed = self.departed(now, &members);
        let view = ClusterView {
            observed_at: now,
            members,
            departed,
            self_lease_until: self.self_lease_until(),
            registration_lost: matches!(self.state, JoinState::Lost),
            self_lease_renewals: self.renewals.iter().copied().collect(),
        };
        self.view.send_replace(view.clone());
        Ok(view)
    }

    /// Says which brokers of the last view are not in the next: the moment a takeover can
    /// start, which an operator (and the takeover benchmark's timeline) needs to see.
    fn log_departures(&self, now: Duration, members: &BTreeMap<BrokerId, Member>) {
        let previous = self.view.borrow();
        for id in previous.members.keys() {
            if members.contains_key(id) || *id == self.me.node_id {
                continue;
            }
            match self.tracker.silent_for(now, *id) {
                Some(silent) => tracing::info!(broker = %id,
                    silent_ms = silent.as_millis() as u64,
                    "broker left the view: its registration stood still for a whole lease"),
                None => tracing::info!(broker = %id,
                    "broker left the view: its registration is gone"),
            }
        }
    }

    /// When the next broker we see live will lapse unless its registration moves: the
    /// earliest [`LivenessTracker::expires_at`] of the live brokers other than us, later than
    /// `after`. The spawned task lists again then, instead of at its next heartbeat: a
    /// listing on a tick finds a broker still live by a few microseconds about half the
    /// time (the one that first saw its last version took longer to read), and a takeover
    /// then started a whole heartbeat interval later.
    pub fn next_lapse(&self, after: Duration) -> Option<Duration> {
        let now = self.clock.monotonic();
        self.tracker
            .live(now)
            .into_iter()
            .filter(|id| *id != self.me.node_id)
            .filter_map(|id| self.tracker.expires_at(id))
            .filter(|at| *at > after)
            .min()
    }

    /// The departed brokers of the view about to be published with `members`: those the last
    /// view had live and `members` lacks, since `now`, and the last view's departed ones not
    /// back and not yet forgotten.
    fn departed(
        &self,
        now: Duration,
        members: &BTreeMap<BrokerId, Member>,
    ) -> BTreeMap<BrokerId, Departed> {
        let previous = self.view.borrow();
        let remembered =
            |since: Duration| now.saturating_sub(since) < self.config.remember_departed;
        let mut departed: BTreeMap<BrokerId, Departed> = previous
            .departed
            .iter()
            .filter(|(id, d)| !members.contains_key(id) && remembered(d.since))
            .map(|(id, d)| (*id, d.clone()))
            .collect();
        for (id, member) in &previous.members {
            if members.contains_key(id)
                || *id == self.me.node_id
                || self.config.remember_departed.is_zero()
            {
                continue;
            }
            departed.entry(*id).or_insert_with(|| Departed {
                registration: member.registration.clone(),
                since: now,
            });
        }
        departed
    }

    /// Deletes the registrations that stayed unchanged for [`MembershipConfig::forget_after`]
    /// of our clock. Every broker may do it; deleting twice is harmless.
    ///
    /// The delete is unconditional (not every store can delete on a version), so in the
    /// instant between our listing and our delete the id could be taken over by a restarted
    /// broker. That broker's next heartbeat then finds its registration missing and writes it
    /// back (see `resync`): it is invisible for one heartbeat, never fenced. A freshly
    /// allocated id cannot be hit, since allocation only creates ids that are not registered.
    async fn forget_long_dead(
        &mut self,
        now: Duration,
        registrations: &mut BTreeMap<BrokerId, (BrokerRegistration, Version)>,
    ) {
        let forget_after = self.config.forget_after();
        let long_dead: Vec<BrokerId> = registrations
            .keys()
            .copied()
            .filter(|&id| id != self.me.node_id)
            .filter(|&id| {
                self.tracker
                    .silent_for(now, id)
                    .is_some_and(|silent| silent >= forget_after)
            })
            .collect();
        for id in long_dead {
            let key = match broker_key(id) {
                Ok(key) => key,
                Err(_) => continue,
            };
            // Its never-written write-ahead streams are sealed once the registration is gone
            // (`seal_empty_streams_of`), but only those registered before we read the
            // registration one last time and found it still the silent one: an incarnation
            // that takes the id over after that read registers its stream after it, so above
            // this mark, and is never fenced by us. One that took it over before that read
            // changed the registration, and we delete nothing.
            let streams_before = match strata_layout::streams::registered(self.store.as_ref()).await
            {
                Ok(streams) => streams.last().copied(),
                Err(e) => {
                    tracing::warn!(broker = %id, error = %e,
                        "cannot list stream registrations; the long-dead broker is judged again next round");
                    continue;
                }
            };
            let listed_version = registrations.get(&id).map(|(_, version)| version.clone());
            match self.store.get(&key).await {
                Ok((_, version)) if Some(&version) == listed_version.as_ref() => {}
                // Changed or gone since the listing: the next round sees what it is now.
                _ => continue,
            }
            match self.store.delete(&key).await {
                Ok(()) => {
                    tracing::info!(broker = %id, silent_for = ?forget_after,
                        "deleted the registration of a broker silent far beyond its lease");
                    registrations.remove(&id);
                    self.tracker.forget(id);
                    if let Some(up_to) = streams_before {
                        match crate::fence::seal_empty_streams_of(
                            self.store.as_ref(),
                            id,
                            up_to,
                            self.me.node_id,
                            self.clock.wall_millis(),
                        )
                        .await
                        {
                            Ok(0) => {}
                            Ok(sealed) => tracing::info!(broker = %id, sealed,
                                "sealed the write-ahead streams a forgotten broker never wrote"),
                            // Only a registration left behind: nothing is served from it.
                            Err(e) => tracing::warn!(broker = %id, error = %e,
                                "cannot seal a forgotten broker's empty write-ahead streams"),
                        }
                    }
                }
                // The next round tries again.
                Err(e) => tracing::warn!(broker = %id, error = %e,
                    "could not delete a long-dead broker's registration"),
            }
        }
    }

    /// Leaves gracefully: deletes our registration if it is still ours.
    pub async fn leave(&mut self) -> ClusterResult<()> {
        match self.store.get(&self.key).await {
            Ok((bytes, _)) => {
                let ours = BrokerRegistration::decode(&self.key, &bytes)
                    .is_ok_and(|r| r.incarnation == self.me.incarnation);
                if ours {
                    self.store.delete(&self.key).await?;
                }
            }
            Err(StorageError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(broker = %self.me.node_id, "left the cluster");
        self.state = JoinState::Unregistered;
        self.last_write_issued = None;
        self.renewals.clear();
        self.publish_self_state();
        Ok(())
    }

    /// Runs heartbeats and listings on a timer in a task of its own.
    pub fn spawn(self) -> MembershipHandle {
        let view = self.subscribe();
        let (commands, receiver) = mpsc::channel(8);
        let task = tokio::spawn(self.run(receiver));
        MembershipHandle {
            view,
            commands,
            task,
        }
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>) -> ClusterResult<()> {
        let mut ticker = Ticker::new(Arc::clone(&self.clock), self.config.heartbeat_interval);
        let interval = self.config.heartbeat_interval;
        let mut last_beat: Option<Duration> = None;
        // The lapse last listed for: a listing that failed must not be retried at once, for
        // ever (the next tick retries it).
        let mut lapse_listed = Duration::ZERO;
        loop {
            let lapse = self.next_lapse(lapse_listed);
            let clock = Arc::clone(&self.clock);
            let lapse_due = async move {
                match lapse {
                    Some(at) => clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = lapse_due => {
                    lapse_listed = lapse.unwrap_or(lapse_listed);
                    if let Err(e) = self.refresh().await {
                        tracing::warn!(error = %e, "membership listing failed");
                    }
                }
                command = commands.recv() => match command {
                    Some(Command::SetDraining(draining, reply)) => {
                        let _ = reply.send(self.set_draining(draining).await);
                    }
                    Some(Command::Leave(reply)) => {
                        let _ = reply.send(self.leave().await);
                        return Ok(());
                    }
                    // Every handle is gone: stop heartbeating; the lease lapses as on a crash.
                    None => return Ok(()),
                },
                _ = ticker.tick() => {
                    // A late or slow heartbeat eats the lease's margin; saying which of the
                    // two it was (this task not run in time, or the write itself slow) is what
                    // an operator needs before the lease is in doubt.
                    let started = self.clock.monotonic();
                    if let Some(gap) = last_beat.map(|at| started.saturating_sub(at)) {
                        if gap >= interval * 2 {
                            tracing::warn!(gap_ms = gap.as_millis() as u64,
                                interval_ms = interval.as_millis() as u64,
                                "heartbeat started late: the membership task was not run in time");
                        }
                    }
                    last_beat = Some(started);
                    let beat = self.heartbeat().await;
                    let took = self.clock.monotonic().saturating_sub(started);
                    if took >= interval {
                        tracing::warn!(took_ms = took.as_millis() as u64,
                            interval_ms = interval.as_millis() as u64,
                            "slow heartbeat: writing the registration took longer than the interval");
                    }
                    match beat {
                        Ok(()) => {}
                        Err(e @ ClusterError::RegistrationLost { .. }) => {
                            tracing::error!(error = %e, "membership lost; stopping heartbeats");
                            return Err(e);
                        }
                        Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                    }
                    if let Err(e) = self.refresh().await {
                        tracing::warn!(error = %e, "membership listing failed");
                    }
                }
            }
        }
    }

    fn registered(&mut self, version: Version) -> JoinProgress {
        tracing::info!(broker = %self.me.node_id, incarnation = %self.me.incarnation, "registered");
        self.state = JoinState::Registered { version };
        JoinProgress::Registered
    }

    fn in_use(&self, incarnation: Option<Incarnation>) -> ClusterError {
        ClusterError::BrokerIdInUse {
            broker: self.me.node_id,
            incarnation: incarnation.unwrap_or(Incarnation(0)),
        }
    }

    fn lost(&mut self) -> ClusterError {
        tracing::error!(broker = %self.me.node_id, incarnation = %self.me.incarnation,
            "our registration was taken over; this process is considered dead");
        self.state = JoinState::Lost;
        self.last_write_issued = None;
        self.renewals.clear();
        self.publish_self_state();
        ClusterError::RegistrationLost {
            broker: self.me.node_id,
        }
    }

    fn self_lease_until(&self) -> Option<Duration> {
        match self.state {
            JoinState::Registered { .. } => self
                .last_write_issued
                .map(|issued| issued + self.config.lease_period),
            _ => None,
        }
    }

    /// Republishes the last view with our own standing updated (no listing).
    fn publish_self_state(&self) {
        let lost = matches!(self.state, JoinState::Lost);
        let until = self.self_lease_until();
        let renewals: Vec<Renewal> = self.renewals.iter().copied().collect();
        self.view.send_modify(|view| {
            view.registration_lost = lost;
            view.self_lease_until = until;
            view.self_lease_renewals = renewals;
        });
    }

    /// Writes our registration. A write whose outcome is unknown is read back: if what is
    /// stored is exactly what we wrote, it landed.
    async fn write_registration(&mut self, mode: PutMode) -> ClusterResult<Version> {
        let issued = self.clock.monotonic();
        let body = self.me.encode()?;
        let result = self.store.put(&self.key, body, mode).await;
        let version = match result {
            Ok(version) => version,
            Err(e) if e.is_ambiguous() => match self.store.get(&self.key).await {
                Ok((bytes, version))
                    if BrokerRegistration::decode(&self.key, &bytes).ok().as_ref()
                        == Some(&self.me) =>
                {
                    version
                }
                _ => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        };
        let landed = self.clock.monotonic();
        let previous_until = self.self_lease_until();
        if self.renewals.len() == RENEWALS_KEPT {
            self.renewals.pop_front();
        }
        self.renewals.push_back(Renewal {
            landed,
            previous_until,
        });
        self.last_write_issued = Some(issued);
        if matches!(self.state, JoinState::Registered { .. }) {
            self.publish_self_state();
        }
        Ok(version)
    }
}

enum Command {
    SetDraining(bool, oneshot::Sender<ClusterResult<()>>),
    Leave(oneshot::Sender<ClusterResult<()>>),
}

/// The running membership of this broker.
#[derive(Debug)]
pub struct MembershipHandle {
    view: watch::Receiver<ClusterView>,
    commands: mpsc::Sender<Command>,
    task: JoinHandle<ClusterResult<()>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::SetDraining(d, _) => write!(f, "SetDraining({d})"),
            Command::Leave(_) => f.write_str("Leave"),
        }
    }
}

impl MembershipHandle {
    /// A receiver of the cluster view, updated every heartbeat interval.
    pub fn view(&self) -> watch::Receiver<ClusterView> {
        self.view.clone()
    }

    /// Marks this broker draining (placement moves everything away) or undoes it.
    pub async fn set_draining(&self, draining: bool) -> ClusterResult<()> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::SetDraining(draining, reply))
            .await
            .map_err(|_| ClusterError::Stopped("membership"))?;
        answer
            .await
            .map_err(|_| ClusterError::Stopped("membership"))?
    }

    /// Deletes our registration and stops heartbeating.
    pub async fn leave(self) -> ClusterResult<()> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Leave(reply))
            .await
            .map_err(|_| ClusterError::Stopped("membership"))?;
        let left = answer
            .await
            .map_err(|_| ClusterError::Stopped("membership"))?;
        let _ = self.task.await;
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{wal_key, wal_stream_prefix};
    use crate::testkit::FakeProcesses;
    use strata_core::clock::ManualClock;
    use strata_storage::{
        Fault, FaultConfig, FaultInjectingStore, InjectedError, MemoryStore, OpKind,
    };

    const SECOND: Duration = Duration::from_secs(1);

    fn local(id: i32, incarnation: u64) -> LocalBroker {
        LocalBroker {
            node_id: BrokerId(id),
            host: format!("broker-{id}"),
            port: 9092,
            incarnation: Incarnation(incarnation),
            listeners: Vec::new(),
        }
    }

    #[test]
    fn a_registration_without_named_listeners_still_loads_and_answers_for_any_listener() {
        let key = broker_key(BrokerId(3)).unwrap();
        let me = BrokerRegistration {
            node_id: BrokerId(3),
            host: "h".into(),
            port: 9092,
            incarnation: Incarnation(7),
            started_ms: 0,
            heartbeat: 1,
            draining: false,
            process: None,
            listeners: Vec::new(),
        };
        // Without named listeners the object is exactly what older versions wrote.
        let old = me.encode().unwrap();
        assert!(!String::from_utf8_lossy(&old).contains("listeners"));
        let registration = BrokerRegistration::decode(&key, &old).unwrap();
        assert_eq!(registration, me);
        assert!(registration.listeners.is_empty());
        assert_eq!(registration.endpoint("SASL_SSL"), ("h", 9092));
        let mut named = registration.clone();
        named.listeners.push(ListenerEndpoint {
            name: "SASL_SSL".into(),
            host: "h".into(),
            port: 9094,
        });
        let round_trip = BrokerRegistration::decode(&key, &named.encode().unwrap()).unwrap();
        assert_eq!(round_trip.endpoint("SASL_SSL"), ("h", 9094));
        assert_eq!(round_trip.endpoint("PLAINTEXT"), ("h", 9092));
    }

    fn membership(
        store: &Arc<dyn ObjectStore>,
        clock: &Arc<ManualClock>,
        id: i32,
        inc: u64,
    ) -> Membership {
        Membership::new(
            store.clone(),
            clock.clone(),
            MembershipConfig::default(),
            local(id, inc),
        )
        .unwrap()
    }

    fn setup() -> (Arc<dyn ObjectStore>, Arc<ManualClock>) {
        (
            Arc::new(MemoryStore::new()),
            Arc::new(ManualClock::new(1_000_000)),
        )
    }

    fn ids(view: &ClusterView) -> Vec<i32> {
        view.members.keys().map(|b| b.0).collect()
    }

    /// Our lease held since a moment only if every write that landed since found more than
    /// the margin left of the lease before it, and the kept renewals reach back that far.
    #[test]
    fn a_lease_is_unbroken_only_if_every_renewal_since_landed_inside_the_margin() {
        let s = Duration::from_secs;
        let renewal = |landed: u64, until: Option<u64>| Renewal {
            landed: s(landed),
            previous_until: until.map(s),
        };
        let view = |renewals: Vec<Renewal>| ClusterView {
            self_lease_renewals: renewals,
            ..ClusterView::default()
        };
        // A 5 s lease renewed every second: 4 s of slack each time.
        let steady = view(
            (0..6)
                .map(|i| renewal(i, (i > 0).then(|| i - 1 + 5)))
                .collect(),
        );
        assert!(steady.self_lease_unbroken_since(s(1), s(1)));
        assert!(steady.self_lease_unbroken_since(s(0), s(1)));
        assert!(
            !steady.self_lease_unbroken_since(s(0), s(5)),
            "4 s of slack < a 5 s margin"
        );
        // Since before the first write ever: it started a lease, none held before it.
        assert!(!view(vec![renewal(3, None)]).self_lease_unbroken_since(s(2), s(1)));
        assert!(view(vec![renewal(3, None)]).self_lease_unbroken_since(s(3), s(1)));
        // One write landed with 0.5 s of its predecessor's lease left: broken for a 1 s
        // margin, not for a 0.25 s one, and only for windows that contain it.
        let ms = Duration::from_millis;
        let late = view(vec![
            renewal(1, Some(5)),
            Renewal {
                landed: ms(9_500),
                previous_until: Some(s(10)),
            },
            renewal(10, Some(14)),
        ]);
        assert!(!late.self_lease_unbroken_since(s(1), s(1)));
        assert!(late.self_lease_unbroken_since(s(1), ms(250)));
        assert!(late.self_lease_unbroken_since(ms(9_600), s(1)));
        // A full ring that starts after the moment asked about proves nothing.
        let full = view(
            (10..10 + RENEWALS_KEPT as u64)
                .map(|i| renewal(i, Some(i + 4)))
                .collect(),
        );
        assert!(full.self_lease_unbroken_since(s(10), s(1)));
        assert!(!full.self_lease_unbroken_since(s(9), s(1)));
        // A lost registration holds nothing.
        let lost = ClusterView {
            registration_lost: true,
            ..steady.clone()
        };
        assert!(!lost.self_lease_unbroken_since(s(1), s(1)));
    }

    /// The renewals a membership publishes are the writes that landed, each with the lease
    /// it found: a heartbeat late by more than the lease leaves one that found none left.
    #[tokio::test]
    async fn renewals_record_each_landed_write_and_the_lease_it_found() {
        let (store, clock) = setup();
        let mut m = membership(&store, &clock, 1, 100);
        m.try_register().await.unwrap();
        m.heartbeat().await.unwrap();
        clock.advance(Duration::from_secs(1));
        m.heartbeat().await.unwrap();
        let view = m.view();
        let lease = MembershipConfig::default().lease_period;
        assert!(view.self_lease_renewals.len() >= 2);
        let last = view.self_lease_renewals.last().copied().unwrap();
        assert_eq!(last.landed, clock.monotonic());
        assert_eq!(
            last.previous_until,
            Some(clock.monotonic() - Duration::from_secs(1) + lease)
        );
        let since = clock.monotonic() - Duration::from_secs(1);
        assert!(view.self_lease_unbroken_since(since, Duration::from_secs(1)));

        clock.advance(lease + Duration::from_secs(1));
        m.heartbeat().await.unwrap();
        let view = m.view();
        assert!(
            !view.self_lease_unbroken_since(since, Duration::ZERO),
            "the lease ran out between"
        );
    }

    #[tokio::test]
    async fn registers_heartbeats_and_sees_itself() {
        let (store, clock) = setup();
        let mut a = membership(&store, &clock, 1, 11);
        assert_eq!(a.try_register().await.unwrap(), JoinProgress::Registered);
        let (_, v1) = store.get(&broker_key(BrokerId(1)).unwrap()).await.unwrap();
        clock.advance(SECOND);
        a.heartbeat().await.unwrap();
        let (bytes, v2) = store.get(&broker_key(BrokerId(1)).unwrap()).await.unwrap();
        assert_ne!(v1, v2, "a heartbeat moves the version");
        let stored: BrokerRegistration = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((stored.heartbeat, stored.incarnation), (1, Incarnation(11)));
        assert_eq!(stored.host, "broker-1");
        let view = a.refresh().await.unwrap();
        assert_eq!(ids(&view), [1]);
        assert_eq!(view.address(BrokerId(1)), Some(("broker-1", 9092)));
        assert_eq!(view.self_lease_until, Some(SECOND + Duration::from_secs(5)));
        assert_eq!(*a.subscribe().borrow(), view);
    }

    #[tokio::test]
    async fn refuses_to_start_when_a_live_broker_has_the_same_id() {
        let (store, clock) = setup();
        let mut a = membership(&store, &clock, 1, 11);
        a.try_register().await.unwrap();
        let mut b = membership(&store, &clock, 1, 22);
        assert!(matches!(
            b.try_register().await.unwrap(),
            JoinProgress::Waiting { .. }
        ));
        clock.advance(SECOND);
        a.heartbeat().await.unwrap();
        let err = b.try_register().await.unwrap_err();
        assert!(
            matches!(
                err,
                ClusterError::BrokerIdInUse {
                    broker: BrokerId(1),
                    incarnation: Incarnation(11)
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("refusing to start"), "{err}");
    }

    #[tokio::test]
    async fn takes_over_the_id_of_an_incarnation_silent_for_a_whole_lease() {
        let (store, clock) = setup();
        let mut old = membership(&store, &clock, 1, 11);
        old.try_register().await.unwrap();
        // The old process froze. A new one starts with the same id.
        let mut new = membership(&store, &clock, 1, 22);
        let waiting = new.try_register().await.unwrap();
        assert_eq!(
            waiting,
            JoinProgress::Waiting {
                previous: Some(Incarnation(11)),
                decided_at: Duration::from_secs(5)
            }
        );
        clock.advance(Duration::from_millis(4_900));
        assert!(matches!(
            new.try_register().await.unwrap(),
            JoinProgress::Waiting { .. }
        ));
        clock.advance(Duration::from_millis(100));
        assert_eq!(new.try_register().await.unwrap(), JoinProgress::Registered);
        // The old process wakes up: its heartbeat finds the registration taken.
        let err = old.heartbeat().await.unwrap_err();
        assert!(
            matches!(err, ClusterError::RegistrationLost { .. }) && err.is_fenced(),
            "{err}"
        );
        assert!(old.view().registration_lost);
        new.heartbeat().await.unwrap();
    }

    #[tokio::test]
    async fn takes_over_at_once_the_id_of_a_process_proven_gone_and_waits_otherwise() {
        let (store, clock) = setup();
        let table = |me| {
            Arc::new(FakeProcesses {
                me,
                ..FakeProcesses::default()
            })
        };
        let mut old = membership(&store, &clock, 1, 11).with_process_table(table(100));
        old.try_register().await.unwrap();
        assert_eq!(old.me().process.as_ref().map(|p| p.pid), Some(100));

        // The old process still runs (or nothing can be proven): the lease decides.
        let processes = table(200);
        let mut new = membership(&store, &clock, 1, 22).with_process_table(processes.clone());
        assert!(matches!(
            new.try_register().await.unwrap(),
            JoinProgress::Waiting { .. }
        ));
        // Proven gone: taken over without waiting, and the old one is fenced from the id.
        processes.gone.lock().unwrap().insert(100);
        assert_eq!(new.try_register().await.unwrap(), JoinProgress::Registered);
        assert!(old.heartbeat().await.unwrap_err().is_fenced());
        new.heartbeat().await.unwrap();
    }

    #[tokio::test]
    async fn an_id_freed_by_a_graceful_leave_is_taken_at_once() {
        let (store, clock) = setup();
        let mut old = membership(&store, &clock, 1, 11);
        old.try_register().await.unwrap();
        old.leave().await.unwrap();
        let mut new = membership(&store, &clock, 1, 22);
        assert_eq!(new.try_register().await.unwrap(), JoinProgress::Registered);
    }

    #[tokio::test]
    async fn a_registration_silent_far_beyond_the_lease_is_deleted_and_a_live_one_is_not() {
        let (store, clock) = setup();
        let mut a = membership(&store, &clock, 1, 11);
        let mut b = membership(&store, &clock, 2, 22);
        a.try_register().await.unwrap();
        b.try_register().await.unwrap();
        a.refresh().await.unwrap();
        let forget_after = a.config().forget_after();
        let key = broker_key(BrokerId(2)).unwrap();
        // a heartbeats and looks every second; b went silent at the start. Each step stays
        // within the observation gap, so a never counts itself as having been blind.
        let mut silent = Duration::ZERO;
        while silent + SECOND < forget_after {
            clock.advance(SECOND);
            silent += SECOND;
            a.heartbeat().await.unwrap();
            a.refresh().await.unwrap();
        }
        assert!(
            store.get(&key).await.is_ok(),
            "kept while silent < {forget_after:?}"
        );
        clock.advance(SECOND);
        a.heartbeat().await.unwrap();
        let view = a.refresh().await.unwrap();
        assert!(matches!(
            store.get(&key).await,
            Err(StorageError::NotFound(_))
        ));
        assert_eq!(ids(&view), [1]);
        // The live broker's own registration stays, and so does a live other's.
        assert!(store.get(&broker_key(BrokerId(1)).unwrap()).await.is_ok());
        // b, had it only been paused, puts its registration back at its next heartbeat.
        b.heartbeat().await.unwrap();
        assert_eq!(ids(&a.refresh().await.unwrap()), [1, 2]);
    }

    /// A broker forgotten after 60 leases that never wrote to its write-ahead stream (named by
    /// no manifest, so sealed by no takeover) gets it sealed, so the log's collector can
    /// retire its registration. A stream it wrote to is left to the takeovers, and a live
    /// broker's stream is never touched.
    #[tokio::test]
    async fn forgetting_a_broker_seals_the_streams_it_never_wrote_and_nothing_else() {
        use strata_layout::streams::{register, StreamRegistration};
        let (store, clock) = setup();
        let stream_of = |broker: i32| StreamRegistration {
            broker: BrokerId(broker),
            started_ms: 5,
        };
        let mut a = membership(&store, &clock, 1, 11);
        let mut b = membership(&store, &clock, 2, 22);
        a.try_register().await.unwrap();
        b.try_register().await.unwrap();
        let live = register(store.as_ref(), &stream_of(1)).await.unwrap();
        let empty = register(store.as_ref(), &stream_of(2)).await.unwrap();
        let written = register(store.as_ref(), &stream_of(2)).await.unwrap();
        store
            .put(
                &wal_key(written, 1).unwrap(),
                Bytes::from_static(b"data"),
                PutMode::Create,
            )
            .await
            .unwrap();
        a.refresh().await.unwrap();
        let forget_after = a.config().forget_after();
        let mut silent = Duration::ZERO;
        while silent < forget_after {
            clock.advance(SECOND);
            silent += SECOND;
            a.heartbeat().await.unwrap();
            a.refresh().await.unwrap();
        }
        assert!(matches!(
            store.get(&broker_key(BrokerId(2)).unwrap()).await,
            Err(StorageError::NotFound(_))
        ));
        let objects = |stream: u32| {
            let store = store.clone();
            async move {
                let mut found = Vec::new();
                for meta in store.list(&wal_stream_prefix(stream)).await.unwrap() {
                    let (bytes, _) = store.get(&meta.key).await.unwrap();
                    found.push(crate::fence::is_seal(&bytes));
                }
                found
            }
        };
        assert_eq!(objects(empty).await, [true], "the empty stream is sealed");
        assert_eq!(
            objects(written).await,
            [false],
            "a written stream is left alone"
        );
        assert!(
            objects(live).await.is_empty(),
            "a live broker's stream is left alone"
        );
    }

    /// Streams registered above the mark taken before the last read of the registration
    /// belong to an incarnation that took the id over since: never sealed.
    #[tokio::test]
    async fn streams_above_the_mark_are_never_sealed() {
        use strata_layout::streams::{register, StreamRegistration};
        let (store, _) = setup();
        let registration = StreamRegistration {
            broker: BrokerId(2),
            started_ms: 5,
        };
        let old = register(store.as_ref(), &registration).await.unwrap();
        let new = register(store.as_ref(), &registration).await.unwrap();
        let sealed =
            crate::fence::seal_empty_streams_of(store.as_ref(), BrokerId(2), old, BrokerId(1), 9)
                .await
                .unwrap();
        assert_eq!(sealed, 1);
        assert!(store
            .list(&wal_stream_prefix(new))
            .await
            .unwrap()
            .is_empty());
        assert!(!store
            .list(&wal_stream_prefix(old))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn a_silent_broker_drops_out_of_the_view_after_the_lease_of_the_observers_clock() {
        let (store, clock) = setup();
        let mut a = membership(&store, &clock, 1, 11);
        let mut b = membership(&store, &clock, 2, 22);
        a.try_register().await.unwrap();
        b.try_register().await.unwrap();
        assert_eq!(ids(&a.refresh().await.unwrap()), [1, 2]);
        // b stops heartbeating; a keeps going and keeps looking.
        for _ in 0..4 {
            clock.advance(SECOND);
            a.heartbeat().await.unwrap();
            assert_eq!(ids(&a.refresh().await.unwrap()), [1, 2]);
        }
        clock.advance(SECOND);
        a.heartbeat().await.unwrap();
        let view = a.refresh().await.unwrap();
        assert_eq!(ids(&view), [1]);
        assert_eq!(view.departed.keys().map(|b| b.0).collect::<Vec<_>>(), [2]);
        assert_eq!(view.departed[&BrokerId(2)].since, Duration::from_secs(5));
        assert_eq!(view.departed[&BrokerId(2)].registration.port, 9092);
        // b comes back: live again, with a new streak.
        b.heartbeat().await.unwrap();
        clock.advance(SECOND);
        a.heartbeat().await.unwrap();
        let view = a.refresh().await.unwrap();
        assert_eq!(ids(&view), [1, 2]);
        assert_eq!(
            view.members[&BrokerId(2)].live_since,
            Duration::from_secs(6)
        );
        assert_eq!(view.members[&BrokerId(1)].live_since, Duration::ZERO);
        assert!(view.departed.is_empty(), "back, so not departed: {view:?}");
    }

    /// A departed broker is remembered for `remember_departed`, through later rounds, then
    /// forgotten; with zero it is never recorded.
    #[tokio::test]
    async fn a_departed_broker_is_remembered_for_its_time_then_forgotten() {
        for remember in [Duration::from_secs(3), Duration::ZERO] {
            let (store, clock) = setup();
            let config = MembershipConfig {
                remember_departed: remember,
                ..MembershipConfig::default()
            };
            let mut a =
                Membership::new(store.clone(), clock.clone(), config, local(1, 11)).unwrap();
            let mut b = membership(&store, &clock, 2, 22);
            a.try_register().await.unwrap();
            b.try_register().await.unwrap();
            assert_eq!(ids(&a.refresh().await.unwrap()), [1, 2]);
            b.leave().await.unwrap();
            let mut remembered = Vec::new();
            for _ in 0..5 {
                let view = a.refresh().await.unwrap();
                assert_eq!(ids(&view), [1]);
                remembered.push(view.departed.contains_key(&BrokerId(2)));
                clock.advance(SECOND);
                a.heartbeat().await.unwrap();
            }
            let expected = if remember.is_zero() {
                [false; 5]
            } else {
                [true, true, true, false, false]
            };
            assert_eq!(remembered, expected, "remember_departed {remember:?}");
        }
    }

    #[tokio::test]
    async fn draining_is_visible_to_others_and_leaving_removes_the_broker() {
        let (store, clock) = setup();
        let mut a = membership(&store, &clock, 1, 11);
        let mut b = membership(&store, &clock, 2, 22);
        a.try_register().await.unwrap();
        b.try_register().await.unwrap();
        b.set_draining(true).await.unwrap();
        let view = a.refresh().await.unwrap();
        assert!(view.is_draining(BrokerId(2)) && !view.is_draining(BrokerId(1)));
        assert_eq!(
            view.placement_candidates(Duration::ZERO, Duration::ZERO),
            BTreeSet::from([BrokerId(1)])
        );
        b.leave().await.unwrap();
        let view = a.refresh().await.unwrap();
        assert_eq!(ids(&view), [1]);
        assert!(view.departed.contains_key(&BrokerId(2)), "{view:?}");
    }

    #[tokio::test]
    async fn an_ambiguous_heartbeat_is_adopted_not_mistaken_for_a_takeover() {
        let memory: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let faults = Arc::new(FaultInjectingStore::new(memory, FaultConfig::none(), 7));
        let store: Arc<dyn ObjectStore> = faults.clone();
        let clock = Arc::new(ManualClock::new(0));
        let mut a = membership(&store, &clock, 1, 11);
        faults.apply_then_fail_next(OpKind::PutCreate, InjectedError::Timeout);
        assert_eq!(a.try_register().await.unwrap(), JoinProgress::Registered);
        // Applied, reported failed, and the read-back fails too: outcome unknown.
        faults.apply_then_fail_next(OpKind::PutUpdate, InjectedError::Timeout);
        faults.fail_next(OpKind::Get, InjectedError::Unavailable);
        assert!(a.heartbeat().await.unwrap_err().is_retryable());
        // The next heartbeat's compare-and-swap fails; the stored registration is ours.
        a.heartbeat().await.unwrap();
        a.heartbeat().await.unwrap();
        assert!(a.is_registered());
    }

    #[tokio::test]
    async fn an_observer_blind_through_an_outage_does_not_declare_everybody_dead() {
        let memory: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let faults = Arc::new(FaultInjectingStore::new(memory, FaultConfig::none(), 7));
        let store: Arc<dyn ObjectStore> = faults.clone();
        let clock = Arc::new(ManualClock::new(0));
        let mut a = membership(&store, &clock, 1, 11);
        let mut b = membership(&store, &clock, 2, 22);
        a.try_register().await.unwrap();
        b.try_register().await.unwrap();
        a.refresh().await.unwrap();
        faults.set_outage(true);
        for _ in 0..20 {
            clock.advance(SECOND);
            assert!(a.heartbeat().await.is_err() && b.heartbeat().await.is_err());
            assert!(a.refresh().await.is_err());
        }
        faults.set_outage(false);
        a.heartbeat().await.unwrap();
        b.heartbeat().await.unwrap();
        assert_eq!(ids(&a.refresh().await.unwrap()), [1, 2]);
    }

    /// A peer that stops is dropped from the view at its lapse, not at the next tick after it.
    /// The listing that first saw the peer's last version was slow (300 ms), so the listing of
    /// the tick five leases of ticks later finds it silent for 4.7 s, still live; without the
    /// wake at the lapse the view kept it until the tick after, 5.7 s after that first sight.
    /// Virtual time (tokio paused, the store's delay a sleep on it), so the figures are exact.
    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_leaves_the_view_at_its_lapse_not_at_the_next_tick() {
        let clock = strata_core::SystemClock::shared();
        let faults = Arc::new(
            FaultInjectingStore::new(
                Arc::new(MemoryStore::new()) as Arc<dyn ObjectStore>,
                FaultConfig::none(),
                1,
            )
            .with_clock(clock.clone()),
        );
        let store: Arc<dyn ObjectStore> = faults.clone();
        let config = MembershipConfig {
            heartbeat_interval: Duration::from_secs(1),
            lease_period: Duration::from_secs(5),
            ..MembershipConfig::default()
        };
        let mut one = Membership::new(store.clone(), clock.clone(), config, local(1, 11)).unwrap();
        one.join().await.unwrap();
        // Registered after broker 1's first listing, and silent from then on.
        let mut two = Membership::new(store.clone(), clock.clone(), config, local(2, 22)).unwrap();
        two.join().await.unwrap();
        faults.inject_next(OpKind::List, Fault::Delay(Duration::from_millis(300)));
        let started = clock.monotonic();
        let handle = one.spawn();
        let mut view = handle.view();
        view.wait_for(|v| v.is_live(BrokerId(2))).await.unwrap();
        let first_seen = clock.monotonic();
        assert_eq!(first_seen - started, Duration::from_millis(300));
        view.wait_for(|v| !v.is_live(BrokerId(2))).await.unwrap();
        assert_eq!(
            clock.monotonic() - first_seen,
            config.lease_period,
            "broker 2 leaves the view one lease after broker 1 first saw its last version"
        );
        assert!(view.borrow().departed.contains_key(&BrokerId(2)));
        handle.leave().await.unwrap();
    }

    /// The spawned task heartbeats on its clock's ticks: the real clock here, on tokio's paused
    /// time, so the test runs in virtual time.
    #[tokio::test(start_paused = true)]
    async fn the_spawned_membership_publishes_views_drains_and_leaves() {
        let (store, _) = setup();
        let mut m = Membership::new(
            store.clone(),
            strata_core::SystemClock::shared(),
            MembershipConfig {
                heartbeat_interval: Duration::from_millis(10),
                ..MembershipConfig::default()
            },
            local(3, 33),
        )
        .unwrap();
        m.join().await.unwrap();
        let handle = m.spawn();
        let mut view = handle.view();
        view.wait_for(|v| v.is_live(BrokerId(3))).await.unwrap();
        handle.set_draining(true).await.unwrap();
        view.wait_for(|v| v.is_draining(BrokerId(3))).await.unwrap();
        handle.leave().await.unwrap();
        assert!(store.list(BROKERS_PREFIX).await.unwrap().is_empty());
    }
}
