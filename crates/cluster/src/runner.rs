//! Carries out what the [`OwnershipController`] decides: reads ownership records, claims,
//! seals dead owners' streams, releases, and tells the [`ResourceHost`] (the log, through the
//! broker) to start and stop serving. All decisions stay in the controller; this is plumbing.
//!
//! Each step is public (`observe`, `act_one`, `act`) so the simulation can interleave several
//! brokers' steps in any order; [`OwnershipRunner::spawn`] runs them on a timer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use strata_core::{BrokerId, Clock, Epoch, Ticker};
use strata_storage::{ObjectStore, Version};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::controller::{
    Action, ControllerConfig, Event, Failure, OwnershipController, StopReason,
};
use crate::fence::{seal_stream, SealOptions};
use crate::membership::ClusterView;
use crate::ownership::{Claimant, Ownership, VersionedRecord};
use crate::{ClusterError, ClusterResult};

/// What the runner needs from the layer that actually serves resources (the log).
#[async_trait]
pub trait ResourceHost: Send + Sync + 'static {
    /// Every resource that exists (e.g. every `<topic-id>/<partition>` in the catalog).
    async fn resources(&self) -> ClusterResult<BTreeSet<String>>;

    /// Recover `resource` (manifest, then the write-ahead tail, including a sealed
    /// predecessor's up to its seal) and start serving it, stamping `epoch` on every
    /// conditional write. An error whose `is_fenced()` is true means our own stream is sealed.
    async fn start_serving(&self, resource: &str, epoch: Epoch) -> ClusterResult<()>;

    /// [`Self::start_serving`] for many resources at once, one result per resource in the
    /// order given. A host that recovers resources from shared objects (the log: one seal and
    /// one replay of a dead owner's stream for all its partitions) overrides it; one by one,
    /// taking over 10,000 partitions replayed the dead stream 10,000 times.
    async fn start_serving_all(&self, batch: &[(String, Epoch)]) -> Vec<ClusterResult<()>> {
        let mut results = Vec::with_capacity(batch.len());
        for (resource, epoch) in batch {
            results.push(self.start_serving(resource, *epoch).await);
        }
        results
    }

    /// Stop serving `resource`. For [`StopReason::Handover`]: stop accepting appends, flush
    /// what is queued, checkpoint (manifest) so a successor needs no replay of our stream, and
    /// return Ok only when all that is durable. Must be idempotent and accept resources it is
    /// not serving.
    async fn stop_serving(&self, resource: &str, reason: StopReason) -> ClusterResult<()>;

    /// The resources as of the last [`Self::resources`] plus what this broker changed itself
    /// (a topic it created), without asking storage; None if the host cannot tell, and then
    /// every round calls [`Self::resources`]. Rounds that saw no change announced (the
    /// `cluster/placement-changes` marker, which topic creation and deletion rewrite) use this
    /// instead of re-reading the catalog.
    fn known_resources(&self) -> Option<BTreeSet<String>> {
        None
    }

    /// Where resources prefer to live (e.g. a partition's explicitly assigned first
    /// replica), as of the last [`Self::resources`]. Placement puts a resource there while
    /// that broker is a candidate, ahead of hashing; an operator's override wins over it.
    fn preferred_owners(&self) -> BTreeMap<String, BrokerId> {
        BTreeMap::new()
    }
}

/// Claims taken from the queue to be carried out together: (resource, the record to replace,
/// the dead owner's stream to seal first), and each dead stream once with the first resource
/// that named it (for the log line).
#[derive(Default)]
struct ClaimBatch {
    claims: Vec<(String, Option<VersionedRecord>, Option<u32>)>,
    dead: BTreeMap<u32, (BrokerId, String)>,
}

/// Ownership record writes in flight at once while claiming many resources (a takeover):
/// enough to hide a local disk's sync or an object store's round trip, few enough not to
/// queue up behind the storage limits of the write path. The log's acquires run beside the
/// claims with as many again (`TAKEOVER_CONCURRENCY`): together half of the default 256.
pub const CLAIMS_AT_ONCE: usize = 64;

/// Claims or serves carried out as one batch: bounds the memory of one takeover step (the
/// log holds every batched partition's recovered state until the batch is served).
pub const BATCH_MAX: usize = 4096;

/// How long the move watch keeps re-reading an awaited record after its handover started or,
/// if later, after the last awaited handover finished. Nearly every handover is done within
/// tens of milliseconds (the old owner's flush), and a drain releases its partitions one
/// after another for seconds, finishing some all the time. A handover that makes no progress
/// for this long is compacting a backlog or stuck; waiting out a full round (`interval`)
/// costs it little, while polling it every few milliseconds would cost a request each time.
pub const HANDOVER_WATCHED_FOR: Duration = Duration::from_secs(1);

/// Awaited records of one topic that the move watch reads one by one; more than this and it
/// lists the topic's records instead, reading only those whose change tag moved (one
/// request instead of one per partition when a drain moves a whole topic).
pub const AWAITED_READS_PER_TOPIC: usize = 4;

/// Storage requests one move watch may send for the awaited records; a watch that would send
/// more (a drain of a broker serving many small topics) lists every record once instead, as a
/// full round does.
pub const AWAITED_REQUESTS_MAX: usize = 16;

/// The part of a resource name up to and including its last `/` (a partition's topic), or ""
/// for a name without one.
fn topic_prefix(resource: &str) -> &str {
    resource.rfind('/').map_or("", |i| &resource[..=i])
}

/// Timing of the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// How often ownership records and overrides are re-read (also after every view change).
    pub interval: Duration,
    /// The log's maximum group-commit writes in flight, for sealing (see [`SealOptions`]).
    pub in_flight_window: u64,
    /// The fast path of a move ([`OwnershipRunner::watch`]) runs this often between full
    /// rounds; None: moves wait for full rounds (up to two `interval`s). Each run reads the
    /// small `cluster/placement-changes` marker (one request, whatever the number of
    /// partitions or overrides) and re-reads the records of resources whose handover we await
    /// (usually none; [`HANDOVER_WATCHED_FOR`], [`AWAITED_READS_PER_TOPIC`] and
    /// [`AWAITED_REQUESTS_MAX`] bound that).
    pub watch_interval: Option<Duration>,
    /// A round re-lists the overrides and re-reads the resources (the catalog) only when the
    /// `cluster/placement-changes` marker moved, and at least every this many rounds anyway: a
    /// mover or topic creator that died between its change and the marker is seen that late.
    pub full_listing_every: u32,
    /// A regular round (the `interval` tick) waits until at least this many times as long as
    /// the last round took has passed since that round started, so rounds take at most about
    /// `1 / round_cost_ratio` of the runner's time whatever the number of partitions. Rounds
    /// that answer an announced change (a new view, a moved placement marker, a command, a
    /// long takeover's fresh round) are never held back. See [`OwnershipRunner::round_due_by_cost`].
    pub round_cost_ratio: u32,
}

/// The default of [`RunnerConfig::round_cost_ratio`]: regular rounds take at most about a
/// quarter of the runner's time. At a thousand partitions a round takes a few milliseconds,
/// so this never holds one back; at 10,000 a broker on `file://` a round took about 240 ms
/// and ran four times a second, most of an idle broker's core (docs/BENCHMARKS.md).
pub const ROUND_COST_RATIO: u32 = 4;

/// The longest a regular round is held back by [`RunnerConfig::round_cost_ratio`], however
/// long the last one took: a round that waited out storage timeouts in an outage (10 s each)
/// would otherwise hold the next one back for most of a minute after the storage is back.
pub const ROUND_SPACING_MAX: Duration = Duration::from_secs(10);

/// The default of [`RunnerConfig::full_listing_every`]: 30 s at S3's 1 s round, 7.5 s at the
/// 250 ms local one, for changes whose writer died before announcing them.
pub const FULL_LISTING_EVERY: u32 = 30;

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            in_flight_window: 64,
            watch_interval: None,
            full_listing_every: FULL_LISTING_EVERY,
            round_cost_ratio: ROUND_COST_RATIO,
        }
    }
}

/// What a running runner reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OwnershipStatus {
    /// What this broker serves, at which epoch.
    pub serving: BTreeMap<String, Epoch>,
    /// Nothing is held or in flight: a draining broker may now leave.
    pub holds_nothing: bool,
    pub fenced: bool,
}

/// Drives one broker's [`OwnershipController`] against storage and a [`ResourceHost`].
#[derive(Debug)]
pub struct OwnershipRunner<H> {
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    ownership: Ownership,
    host: H,
    controller: OwnershipController,
    view: watch::Receiver<ClusterView>,
    pending: VecDeque<Action>,
    config: RunnerConfig,
    /// The version of `cluster/placement-changes` read before the last round that listed the
    /// overrides and resources (outer None: not read yet). Changes since are announced by a
    /// new one.
    placement_changes_seen: Option<Option<Version>>,
    /// What that round found, reused by the rounds that see the marker unchanged.
    overrides_seen: BTreeMap<String, BrokerId>,
    /// Rounds since the last one that listed everything.
    rounds_since_full: u32,
    /// Every record the last round listed, for the broker's owner cache (Metadata): the
    /// round's listing serves it too, so the cache costs no listing of its own.
    records: watch::Sender<Arc<BTreeMap<String, VersionedRecord>>>,
    /// When the move watch first found each resource it awaits a handover of (monotonic).
    awaited_since: BTreeMap<String, Duration>,
    /// When the move watch last found that a handover it awaited had finished (monotonic).
    handover_done: Option<Duration>,
    /// When the last round started (monotonic): the age of the view and records the
    /// controller decides on.
    last_round: Option<Duration>,
    /// How long the last round took, start to end, whether it succeeded or not.
    last_round_took: Duration,
    /// The controller stepped or an action ran since the status was last published: only
    /// then can it differ. Building it costs a map of every partition served, and the loop
    /// runs every move watch (a hundred times a second); at 10,000 partitions that was a
    /// fifth of an idle broker's CPU.
    stepped: bool,
}

impl<H: ResourceHost> OwnershipRunner<H> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        me: Claimant,
        controller_config: ControllerConfig,
        config: RunnerConfig,
        view: watch::Receiver<ClusterView>,
        host: H,
    ) -> Self {
        Self {
            ownership: Ownership::new(store.clone()),
            store,
            clock,
            host,
            controller: OwnershipController::new(me, controller_config),
            view,
            pending: VecDeque::new(),
            config,
            placement_changes_seen: None,
            overrides_seen: BTreeMap::new(),
            rounds_since_full: 0,
            records: watch::Sender::new(Arc::new(BTreeMap::new())),
            awaited_since: BTreeMap::new(),
            handover_done: None,
            last_round: None,
            last_round_took: Duration::ZERO,
            stepped: false,
        }
    }

    /// Every ownership record as of the last round that succeeded, republished after each.
    pub fn records(&self) -> watch::Receiver<Arc<BTreeMap<String, VersionedRecord>>> {
        self.records.subscribe()
    }

    /// The runner's reads of ownership records; a clone shares its cache (see [`Ownership`]).
    pub fn ownership(&self) -> &Ownership {
        &self.ownership
    }

    pub fn controller(&self) -> &OwnershipController {
        &self.controller
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    /// Actions decided but not yet carried out.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn status(&self) -> OwnershipStatus {
        OwnershipStatus {
            serving: self.controller.serving(),
            holds_nothing: self.controller.holds_nothing() && self.pending.is_empty(),
            fenced: self.controller.is_fenced(),
        }
    }

    /// Feeds an event to the controller and queues what it decides.
    pub fn feed(&mut self, event: Event) {
        let now = self.clock.monotonic();
        let actions = self.controller.step_all(now, [self.self_standing(), event]);
        self.pending.extend(actions);
        self.stepped = true;
    }

    /// Our own standing as the membership has it now, for decisions made between rounds
    /// (see [`Event::SelfStanding`]). A decision after a long run of actions (a takeover of
    /// thousands of partitions acts for seconds) judged our lease by the round's view, which
    /// had it running out although heartbeats kept landing: it stopped serving everything
    /// as "lease in doubt" and a round later served it all again. The view is only peeked
    /// at, not marked seen, so the loop still takes a round when who is live changes.
    fn self_standing(&self) -> Event {
        Event::SelfStanding(self.view.borrow().clone())
    }

    /// Feeds a batch's events and decides once: deciding after each of them placed every
    /// resource again per event, 10,000 × 10,000 placements for a takeover of 10,000.
    fn feed_all(&mut self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let now = self.clock.monotonic();
        let standing = self.self_standing();
        let actions = self
            .controller
            .step_all(now, std::iter::once(standing).chain(events));
        self.pending.extend(actions);
        self.stepped = true;
    }

    /// Our own stream was sealed (the log's writer saw a seal): stop everything.
    pub fn self_fenced(&mut self) {
        self.feed(Event::SelfFenced);
    }

    /// One observation round: the latest view, the resources, the overrides and the records
    /// of the resources that concern us, all applied before the controller decides once.
    ///
    /// What changes rarely is re-read only when announced: the overrides and the catalog when
    /// the `cluster/placement-changes` marker moved (one small read instead of two listings),
    /// or every [`RunnerConfig::full_listing_every`] rounds in case an announcement was lost.
    /// The records are listed every round: claims and releases are not announced.
    pub async fn observe(&mut self) -> ClusterResult<()> {
        let changes = self.ownership.placement_changes().await?;
        self.observe_after(changes).await
    }

    /// [`Self::observe`] with the marker already read (by `watch`), timed for
    /// [`Self::round_due_by_cost`].
    async fn observe_after(&mut self, changes: Option<Version>) -> ClusterResult<()> {
        let started = self.clock.monotonic();
        // Set before anything can fail: a failing round is not retried before every action.
        self.last_round = Some(started);
        let result = self.round(changes).await;
        self.last_round_took = self.clock.monotonic().saturating_sub(started);
        result
    }

    /// Whether a regular round may start now: once the last round is older than
    /// [`RunnerConfig::round_cost_ratio`] times what it took.
    ///
    /// A round lists every owner record and decides over every resource, so its cost grows
    /// with the partitions: on `file://` at 10,000 a broker it took about 240 ms, and at the
    /// 250 ms interval an idle broker spent most of a core on rounds. Nothing is missed by
    /// spacing them out: deaths, placement changes and commands start rounds of their own,
    /// and what only a regular round notices (a claim or release by another broker we do not
    /// await, a grace running out) is seen a little later, in proportion to the cluster's
    /// size. A slow storage (an S3 listing of many pages) spaces them out the same way,
    /// which also bounds the requests they send.
    pub fn round_due_by_cost(&self) -> bool {
        let now = self.clock.monotonic();
        self.last_round.is_none_or(|at| {
            now.saturating_sub(at)
                >= self
                    .last_round_took
                    .saturating_mul(self.config.round_cost_ratio)
                    .min(ROUND_SPACING_MAX)
        })
    }

    /// The body of [`Self::observe_after`].
    async fn round(&mut self, changes: Option<Version>) -> ClusterResult<()> {
        let view = self.view.borrow_and_update().clone();
        let full = self.placement_changes_seen.as_ref() != Some(&changes)
            || self.rounds_since_full + 1 >= self.config.full_listing_every;
        let known = if full {
            None
        } else {
            self.host.known_resources()
        };
        let listed = known.is_none();
        let (resources, listed_overrides) = match known {
            Some(resources) => (resources, self.overrides_seen.clone()),
            None => (
                self.host.resources().await?,
                // Listed after the marker was read: a change announced after that read is
                // found by the next round, which sees a new marker.
                self.ownership.placement_overrides().await?,
            ),
        };
        // The operator's overrides win over the resources' own preferences.
        let mut overrides = self.host.preferred_owners();
        overrides.extend(listed_overrides.clone());
        // Which records to read depends on the new view and overrides: a scratch copy of the
        // controller answers that without deciding anything yet.
        let mut scratch = self.controller.clone();
        let now = self.clock.monotonic();
        let mut events = vec![
            Event::View(view),
            Event::Resources(resources),
            Event::Overrides(overrides),
        ];
        for event in &events {
            scratch.apply(now, event.clone());
        }
        // One listing tells which records exist and which changed since we read them: absent
        // ones cost no read, and neither do unchanged ones (`Ownership` keeps what it read).
        let existing = self.ownership.list_owners("").await?;
        let mut records = BTreeMap::new();
        for resource in existing.resources() {
            if let Some(record) = self.ownership.read_listed(&existing, resource).await? {
                records.insert(resource.to_string(), record);
            }
        }
        for resource in scratch.wants_observation(now) {
            let record = records.get(&resource).cloned();
            events.push(Event::Observed { resource, record });
        }
        // The listing and reads can take seconds at many partitions on a busy machine: judge
        // our lease by the standing of now, if it held since the view the round began with.
        events.push(self.self_standing());
        let now = self.clock.monotonic();
        let actions = self.controller.step_all(now, events);
        self.pending.extend(actions);
        self.stepped = true;
        if listed {
            self.placement_changes_seen = Some(changes);
            self.overrides_seen = listed_overrides;
            self.rounds_since_full = 0;
        } else {
            self.rounds_since_full += 1;
        }
        self.records.send_if_modified(|published| {
            let changed = **published != records;
            if changed {
                *published = Arc::new(records);
            }
            changed
        });
        Ok(())
    }

    /// The fast path of a move, cheap enough to run every few milliseconds between full
    /// rounds. Without it a move waits for two rounds: the old owner's (to see the new
    /// placement) and then the target's (to see the record Released).
    ///
    /// - Changed placement overrides (a move was requested) start a full round at once, so the
    ///   old owner starts handing over, and the target learns it is the target, right away.
    ///   What tells is a new version of the `cluster/placement-changes` marker, which movers
    ///   rewrite after every override change: one small read instead of listing the overrides.
    ///   The marker is read *before* the round lists the overrides, so a change announced
    ///   after that read is noticed by the next watch. A mover that dies between the override
    ///   and the marker only costs speed: full rounds list every override.
    /// - The records of the resources we await from a live owner
    ///   ([`OwnershipController::awaiting_handover`]) are re-read, so we claim as soon as the
    ///   old owner released: while each handover is younger than [`HANDOVER_WATCHED_FOR`] or
    ///   another finished within that time (one that makes no progress is left to the full
    ///   rounds); one topic's records through one listing when more than
    ///   [`AWAITED_READS_PER_TOPIC`] of them are awaited, and every record through one listing
    ///   when that would still take more than [`AWAITED_REQUESTS_MAX`] requests.
    ///
    /// Everything decided here is what a full round would decide from the same reads: the
    /// controller's rules hold whichever path fed it.
    pub async fn watch(&mut self) -> ClusterResult<()> {
        let changes = self.ownership.placement_changes().await?;
        if self.placement_changes_seen.as_ref() != Some(&changes) {
            // Takes the new marker as seen only if the round succeeds: a failed one is tried
            // again at the next watch.
            return self.observe_after(changes).await;
        }
        let now = self.clock.monotonic();
        let awaited: BTreeSet<String> =
            self.controller.awaiting_handover(now).into_iter().collect();
        // A resource no longer awaited has been handed over (or its move was called off):
        // progress, which keeps the rest of a drain watched.
        if self.awaited_since.keys().any(|r| !awaited.contains(r)) {
            self.handover_done = Some(now);
        }
        self.awaited_since
            .retain(|resource, _| awaited.contains(resource));
        let mut watched = Vec::new();
        for resource in awaited {
            let since = *self.awaited_since.entry(resource.clone()).or_insert(now);
            let progress = self.handover_done.map_or(since, |done| done.max(since));
            if now.saturating_sub(progress) < HANDOVER_WATCHED_FOR {
                watched.push(resource);
            }
        }
        if watched.is_empty() {
            return Ok(());
        }
        let events = self.read_awaited(watched).await?;
        let now = self.clock.monotonic();
        let actions = self.controller.step_all(now, events);
        self.pending.extend(actions);
        self.stepped = true;
        Ok(())
    }

    /// The current records of `resources` (sorted), as events: one read each, except that a
    /// topic with more than [`AWAITED_READS_PER_TOPIC`] of them is listed once and only its
    /// records whose change tag moved since they were last read are read again, and that
    /// every record is listed once if that would still take more than
    /// [`AWAITED_REQUESTS_MAX`] requests.
    async fn read_awaited(&self, resources: Vec<String>) -> ClusterResult<Vec<Event>> {
        let mut events = Vec::with_capacity(resources.len());
        // Sorted, so each topic's resources are one run.
        let groups: Vec<&[String]> = resources
            .chunk_by(|a, b| topic_prefix(a) == topic_prefix(b))
            .collect();
        let listed = |group: &[String]| {
            group.len() > AWAITED_READS_PER_TOPIC && !topic_prefix(&group[0]).is_empty()
        };
        let requests: usize = groups
            .iter()
            .map(|g| if listed(g) { 1 } else { g.len() })
            .sum();
        if requests > AWAITED_REQUESTS_MAX {
            let listing = self.ownership.list_owners("").await?;
            for resource in resources {
                let record = self.ownership.read_listed(&listing, &resource).await?;
                events.push(Event::Observed { resource, record });
            }
            return Ok(events);
        }
        for group in groups {
            if listed(group) {
                let listing = self.ownership.list_owners(topic_prefix(&group[0])).await?;
                for resource in group {
                    let record = self.ownership.read_listed(&listing, resource).await?;
                    events.push(Event::Observed {
                        resource: resource.clone(),
                        record,
                    });
                }
            } else {
                for resource in group {
                    let record = self.ownership.read(resource).await?;
                    events.push(Event::Observed {
                        resource: resource.clone(),
                        record,
                    });
                }
            }
        }
        Ok(events)
    }

    /// Carries out the oldest pending action. Returns false when nothing was pending.
    pub async fn act_one(&mut self) -> bool {
        let Some(action) = self.pending.pop_front() else {
            return false;
        };
        for event in self.execute(action).await {
            self.feed(event);
        }
        true
    }

    /// Carries out pending actions until none is left (each result may decide more).
    ///
    /// Claims waiting at the front of the queue run together (each dead stream sealed once,
    /// up to [`CLAIMS_AT_ONCE`] record writes in flight), and so do serves (one
    /// [`ResourceHost::start_serving_all`]), the serves beside the next claims: a takeover
    /// of thousands of partitions was thousands of sequential seals, claims and replays of the
    /// same dead stream.
    pub async fn act(&mut self) {
        while !self.pending.is_empty() {
            self.act_step().await;
        }
    }

    /// [`Self::act`] as the spawned loop runs it: it stops, leaving the rest pending, when the
    /// last round's view would put our own lease in doubt and that round is older than
    /// `interval`; the loop takes a round before it goes on.
    ///
    /// The controller decides on the view of its last round, including how long our own
    /// lease runs. A takeover of thousands of partitions acts for seconds (claims, then the
    /// log's acquires), and a decision after that saw a lease that had run out in the old
    /// view, although heartbeats kept landing: it stopped serving everything as "lease in
    /// doubt" and served it all again a round later, about 5 s of a 10,000-partition
    /// takeover. A fresh round brings the view and the records together, as every round does
    /// (a fresh view with old records could miss what others did while we were paused).
    ///
    /// The loop, not this, takes the round, so commands (our stream found sealed) are still
    /// heard between the steps of a long takeover.
    pub async fn act_in_rounds(&mut self) {
        while !self.pending.is_empty() {
            // Heartbeats that landed while we acted count before a round is called for.
            let now = self.clock.monotonic();
            self.controller.apply(now, self.self_standing());
            self.stepped = true;
            if self.round_due() {
                return;
            }
            self.act_step().await;
        }
    }

    /// Whether actions are pending that the controller would decide on a view in which our
    /// own lease is in doubt, from a round older than `interval`. Only a long run of actions
    /// gets there (seconds: the lease less its margin and a heartbeat), so normal acting
    /// takes no extra round; a doubt the fresh round confirms is acted on, since that round
    /// is then younger than `interval`.
    fn round_due(&self) -> bool {
        let now = self.clock.monotonic();
        !self.pending.is_empty()
            && self.controller.lease_in_doubt(now)
            && self
                .last_round
                .is_none_or(|at| now.saturating_sub(at) >= self.config.interval)
    }

    /// One step of [`Self::act`]: the batch of claims and the batch of serves at the front of
    /// the queue, carried out side by side, or one other action.
    async fn act_step(&mut self) {
        self.stepped = true;
        match self.pending.front() {
            None => {}
            Some(Action::Claim { .. } | Action::FenceThenClaim { .. } | Action::Serve { .. }) => {
                let (claims, serves) = self.take_claims_and_serves();
                // A takeover's claims come in batches, and each claim batch that lands decides
                // a serve batch; one after the other, the log's acquires (a manifest read and
                // write per partition) waited for every claim of the takeover, 3.5 s of a
                // 10,000-partition one. Side by side, batch k is acquired while batch k+1 is
                // claimed. Each resource's own steps keep their order: its serve is decided
                // only once its claim has finished.
                let (mut events, served) =
                    futures::join!(self.run_claims(claims), self.run_serves(serves));
                events.extend(served);
                self.feed_all(events);
            }
            Some(_) => {
                self.act_one().await;
            }
        }
    }

    /// Takes the claims and the serves from the front of the queue, up to [`BATCH_MAX`] of
    /// each, as far as the first action of another kind (which, like everything after it,
    /// stays in order). Nothing taken can concern the same resource: a claim is decided only
    /// for a resource we do not hold, a serve only once its claim has finished.
    fn take_claims_and_serves(&mut self) -> (ClaimBatch, Vec<(String, Epoch)>) {
        let mut claims = ClaimBatch::default();
        let mut serves = Vec::new();
        loop {
            let room = match self.pending.front() {
                Some(Action::Claim { .. } | Action::FenceThenClaim { .. }) => {
                    claims.claims.len() < BATCH_MAX
                }
                Some(Action::Serve { .. }) => serves.len() < BATCH_MAX,
                _ => false,
            };
            if !room {
                break;
            }
            match self.pending.pop_front() {
                Some(Action::Claim { resource, expected }) => {
                    claims.claims.push((resource, expected, None))
                }
                Some(Action::FenceThenClaim {
                    resource,
                    dead_owner,
                    dead_stream,
                    expected,
                }) => {
                    if let Some(stream) = dead_stream {
                        claims
                            .dead
                            .entry(stream)
                            .or_insert((dead_owner, resource.clone()));
                    }
                    claims.claims.push((resource, Some(expected), dead_stream));
                }
                Some(Action::Serve { resource, epoch }) => serves.push((resource, epoch)),
                // Not reached (the front was checked); put it back rather than lose it.
                Some(other) => {
                    self.pending.push_front(other);
                    break;
                }
                None => break,
            }
        }
        (claims, serves)
    }

    /// Carries out a batch of claims concurrently: each dead stream sealed once, then up to
    /// [`CLAIMS_AT_ONCE`] record writes in flight.
    async fn run_claims(&self, batch: ClaimBatch) -> Vec<Event> {
        if batch.claims.is_empty() {
            return Vec::new();
        }
        let me = self.controller.me().clone();
        // A seal is final (a sealed stream accepts no write below it, and a later sealer
        // finds the first seal), so one seal per dead stream covers all of its resources.
        let mut seals: BTreeMap<u32, Result<(), Failure>> = BTreeMap::new();
        for (stream, (dead_owner, resource)) in batch.dead {
            let options = SealOptions {
                sealed_by: me.broker,
                sealed_ms: self.clock.wall_millis(),
                in_flight_window: self.config.in_flight_window,
            };
            tracing::info!(resource, %dead_owner, stream = format_args!("{stream:08x}"),
                "owner is dead; sealing its stream before claiming");
            let sealed = seal_stream(self.store.as_ref(), stream, &options)
                .await
                .map(|_| ())
                .map_err(|e| failure(&resource, "seal", &e));
            seals.insert(stream, sealed);
        }
        let ownership = &self.ownership;
        let me = &me;
        let seals = &seals;
        let claims = batch
            .claims
            .into_iter()
            .map(|(resource, expected, dead_stream)| async move {
                if let Some(Err(failed)) = dead_stream.and_then(|s| seals.get(&s)) {
                    let result = Err(*failed);
                    return Event::ClaimFinished { resource, result };
                }
                let result = ownership
                    .claim(&resource, me, expected.as_ref())
                    .await
                    .map_err(|e| failure(&resource, "claim", &e));
                Event::ClaimFinished { resource, result }
            });
        futures::stream::iter(claims)
            .buffer_unordered(CLAIMS_AT_ONCE)
            .collect()
            .await
    }

    /// Hands a batch of serves to the host as one [`ResourceHost::start_serving_all`].
    async fn run_serves(&self, batch: Vec<(String, Epoch)>) -> Vec<Event> {
        let mut events = Vec::new();
        if batch.is_empty() {
            return events;
        }
        let results = self.host.start_serving_all(&batch).await;
        for ((resource, epoch), result) in batch.into_iter().zip(results) {
            if let Err(e) = result {
                tracing::warn!(resource, %epoch, error = %e, "could not start serving");
                let fenced = matches!(e, ClusterError::Fenced);
                events.push(Event::ServeFailed { resource });
                if fenced {
                    events.push(Event::SelfFenced);
                }
            }
        }
        events
    }

    async fn execute(&mut self, action: Action) -> Vec<Event> {
        let me = self.controller.me().clone();
        match action {
            Action::Claim { resource, expected } => {
                let result = self
                    .ownership
                    .claim(&resource, &me, expected.as_ref())
                    .await
                    .map_err(|e| failure(&resource, "claim", &e));
                vec![Event::ClaimFinished { resource, result }]
            }
            Action::FenceThenClaim {
                resource,
                dead_owner,
                dead_stream,
                expected,
            } => {
                if let Some(stream) = dead_stream {
                    let options = SealOptions {
                        sealed_by: me.broker,
                        sealed_ms: self.clock.wall_millis(),
                        in_flight_window: self.config.in_flight_window,
                    };
                    tracing::info!(resource, %dead_owner, stream = format_args!("{stream:08x}"),
                        "owner is dead; sealing its stream before claiming");
                    if let Err(e) = seal_stream(self.store.as_ref(), stream, &options).await {
                        let result = Err(failure(&resource, "seal", &e));
                        return vec![Event::ClaimFinished { resource, result }];
                    }
                }
                let result = self
                    .ownership
                    .claim(&resource, &me, Some(&expected))
                    .await
                    .map_err(|e| failure(&resource, "claim", &e));
                vec![Event::ClaimFinished { resource, result }]
            }
            Action::Release { resource, current } => {
                let result = self
                    .ownership
                    .release(&resource, &me, &current)
                    .await
                    .map_err(|e| failure(&resource, "release", &e));
                vec![Event::ReleaseFinished { resource, result }]
            }
            Action::Serve { resource, epoch } => {
                match self.host.start_serving(&resource, epoch).await {
                    Ok(()) => Vec::new(),
                    Err(e) => {
                        tracing::warn!(resource, %epoch, error = %e, "could not start serving");
                        let mut events = vec![Event::ServeFailed { resource }];
                        if matches!(e, ClusterError::Fenced) {
                            events.push(Event::SelfFenced);
                        }
                        events
                    }
                }
            }
            Action::StopServing { resource, reason } => {
                let stopped = self.host.stop_serving(&resource, reason).await;
                if let Err(e) = &stopped {
                    tracing::warn!(resource, ?reason, error = %e, "stopping did not finish cleanly");
                }
                if reason == StopReason::Handover {
                    let fenced = matches!(stopped, Err(ClusterError::Fenced));
                    let mut events = vec![Event::HandoverFinished {
                        resource,
                        ok: stopped.is_ok(),
                    }];
                    if fenced {
                        events.push(Event::SelfFenced);
                    }
                    events
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// Runs observation rounds every interval (and on every new view) in a task of its own.
    pub fn spawn(self) -> RunnerHandle {
        let (status_tx, status) = watch::channel(self.status());
        let records = self.records();
        let (commands, receiver) = mpsc::channel(8);
        let task = tokio::spawn(self.run(receiver, status_tx));
        RunnerHandle {
            status,
            records,
            commands,
            task,
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<RunnerCommand>,
        status: watch::Sender<OwnershipStatus>,
    ) -> ClusterResult<()> {
        let mut ticker = Ticker::new(Arc::clone(&self.clock), self.config.interval);
        // Never firing when the fast path is off; `pending()` keeps the select uniform.
        let mut watcher = self
            .config
            .watch_interval
            .map(|period| Ticker::new(Arc::clone(&self.clock), period));
        let mut view_seen = None;
        loop {
            let watch_tick = async {
                match watcher.as_mut() {
                    Some(watcher) => watcher.tick().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                command = commands.recv() => match command {
                    Some(RunnerCommand::SelfFenced) => self.self_fenced(),
                    Some(RunnerCommand::ObserveNow) => {
                        if let Err(e) = self.observe().await {
                            tracing::warn!(error = %e, "ownership observation failed");
                        }
                    }
                    None => return Ok(()),
                },
                // Actions left pending by a long takeover (`act_in_rounds`): a round first.
                _ = std::future::ready(()), if self.round_due() => {
                    if let Err(e) = self.observe().await {
                        tracing::warn!(error = %e, "ownership observation failed");
                    }
                }
                // Skipped while the last round's cost says it is too soon (see
                // `round_due_by_cost`); a later tick takes it.
                _ = ticker.tick() => {
                    if self.round_due_by_cost() {
                        if let Err(e) = self.observe().await {
                            tracing::warn!(error = %e, "ownership observation failed");
                        }
                    }
                }
                _ = watch_tick => {
                    if let Err(e) = self.watch().await {
                        tracing::debug!(error = %e, "ownership watch failed");
                    }
                }
                changed = self.view.changed() => {
                    if changed.is_err() {
                        // The membership is gone: act as if fenced, never hold on blindly.
                        self.self_fenced();
                    } else {
                        // The membership republishes after every heartbeat and listing; only a
                        // change of who is live (a death: takeover starts now) or of how they
                        // stand is worth a round before the next tick. It used to be a round
                        // per publication, two or three a second whatever the interval.
                        let summary = view_summary(&self.view.borrow_and_update());
                        if view_seen.as_ref() != Some(&summary) {
                            view_seen = Some(summary);
                            if let Err(e) = self.observe().await {
                                tracing::warn!(error = %e, "ownership observation failed");
                            }
                        }
                    }
                }
            }
            self.act_in_rounds().await;
            // Only a real change is published: watchers (the broker's owner cache) take every
            // publication for a change of what we serve and poll fast for a while after it,
            // and this loop runs every move watch, a hundred times a second.
            if std::mem::take(&mut self.stepped) {
                let now = self.status();
                status.send_if_modified(|published| {
                    let changed = *published != now;
                    if changed {
                        *published = now;
                    }
                    changed
                });
            }
            if self.controller.is_fenced() && self.pending.is_empty() {
                return Err(ClusterError::Fenced);
            }
        }
    }
}

/// What of a view matters to ownership: who is live since when, as which incarnation, where,
/// draining or not, and whether we lost our registration. Not the heartbeat counters, the
/// time of the listing or our own lease (each round reads the latest view anyway).
type ViewSummary = (Vec<(BrokerId, u64, bool, String, u16, Duration)>, bool);

fn view_summary(view: &ClusterView) -> ViewSummary {
    let members = view
        .members
        .iter()
        .map(|(id, m)| {
            let r = &m.registration;
            (
                *id,
                r.incarnation.0,
                r.draining,
                r.host.clone(),
                r.port,
                m.live_since,
            )
        })
        .collect();
    (members, view.registration_lost)
}

fn failure(resource: &str, what: &str, error: &ClusterError) -> Failure {
    let failure = Failure::of(error);
    if failure == Failure::Lost {
        tracing::info!(resource, what, "lost the race");
    } else {
        tracing::warn!(resource, what, error = %error, "ownership step failed");
    }
    failure
}

#[derive(Debug)]
enum RunnerCommand {
    SelfFenced,
    ObserveNow,
}

/// A running [`OwnershipRunner`].
#[derive(Debug)]
pub struct RunnerHandle {
    status: watch::Receiver<OwnershipStatus>,
    records: watch::Receiver<Arc<BTreeMap<String, VersionedRecord>>>,
    commands: mpsc::Sender<RunnerCommand>,
    task: JoinHandle<ClusterResult<()>>,
}

impl RunnerHandle {
    /// What this broker serves, updated after every round.
    pub fn status(&self) -> watch::Receiver<OwnershipStatus> {
        self.status.clone()
    }

    /// Every ownership record, republished after each round that saw a change.
    pub fn records(&self) -> watch::Receiver<Arc<BTreeMap<String, VersionedRecord>>> {
        self.records.clone()
    }

    /// Tells the runner our write-ahead stream was sealed: it stops everything and ends.
    pub async fn self_fenced(&self) -> ClusterResult<()> {
        self.commands
            .send(RunnerCommand::SelfFenced)
            .await
            .map_err(|_| ClusterError::Stopped("ownership runner"))
    }

    /// Runs a round now: this broker changed placement or the set of resources itself, so it
    /// need not wait for its next round (or a move watch, which may be off) to act on it.
    /// Best effort: a runner that is gone or busy with earlier commands drops it, and the
    /// next round sees the change anyway.
    pub fn observe_now(&self) {
        let _ = self.commands.try_send(RunnerCommand::ObserveNow);
    }

    /// Stops the runner without releasing anything (for a crash-like stop; a graceful stop
    /// drains first and waits for `holds_nothing`).
    pub async fn stop(self) -> ClusterResult<()> {
        drop(self.commands);
        match self.task.await {
            Ok(result) => result,
            Err(_) => Err(ClusterError::Stopped("ownership runner")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::parse_seal;
    use crate::keys::wal_key;
    use crate::placement::assign;
    use crate::testkit::{node, round, serving, two_settled, Node};
    use strata_core::clock::ManualClock;
    use strata_core::BrokerId;
    use strata_storage::MemoryStore;

    #[tokio::test]
    async fn brokers_split_by_placement_and_a_dead_owners_stream_is_sealed_before_takeover() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..12).map(|i| format!("t/{i}")).collect();
        let (mut a, mut b) = two_settled(&store, &store, &clock, &names).await;
        let both = BTreeSet::from([BrokerId(1), BrokerId(2)]);
        let expected = assign(&both, names.iter().map(String::as_str), &BTreeMap::new());
        let on = |id| {
            expected
                .iter()
                .filter(|(_, b)| **b == BrokerId(id))
                .map(|(r, _)| r.clone())
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(serving(&a), on(1));
        assert_eq!(serving(&b), on(2));
        assert!(!on(2).is_empty());

        // b freezes. After a lease of a's clock, a seals b's stream and takes everything.
        for _ in 0..12 {
            clock.advance(Duration::from_millis(500));
            round(&mut a).await;
        }
        assert_eq!(serving(&a), names);
        let (seal, _) = store.get(&wal_key(2, 1).unwrap()).await.unwrap();
        assert_eq!(parse_seal(&seal).unwrap().sealed_by, BrokerId(1));
        let records = Ownership::new(store.clone()).list("").await.unwrap();
        for (resource, (_, record)) in records {
            assert_eq!(record.owner, BrokerId(1), "{resource}");
            let expected_epoch = if on(2).contains(&resource) { 2 } else { 1 };
            assert_eq!(record.epoch, Epoch(expected_epoch), "{resource}");
        }
        // b wakes: its records were taken, so it stops serving them (its writes would hit the
        // seal anyway).
        b.membership.heartbeat().await.unwrap();
        b.membership.refresh().await.unwrap();
        b.runner.observe().await.unwrap();
        b.runner.act().await;
        assert!(serving(&b).is_empty());
        assert!(b
            .runner
            .host()
            .stops
            .lock()
            .unwrap()
            .iter()
            .all(|(_, why)| *why == StopReason::Lost));
    }

    /// Actions decided by a round acted on after our own lease has run out *in that round's
    /// view*, while heartbeats kept landing (a takeover of thousands of partitions acting for
    /// seconds): `act` decides on the stale view and holds the claims back as if our lease were
    /// in doubt; `act_in_rounds` stops until a round brings the fresh view, then serves.
    #[tokio::test]
    async fn actions_wait_for_a_fresh_round_rather_than_decide_on_a_stale_own_lease() {
        let names: BTreeSet<String> = (0..8).map(|i| format!("t/{i}")).collect();
        let start = || async {
            let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
            let clock = Arc::new(ManualClock::new(0));
            let mut a = node(&store, &clock, 1, &names);
            a.membership.try_register().await.unwrap();
            a.membership.heartbeat().await.unwrap();
            a.membership.refresh().await.unwrap();
            a.runner.observe().await.unwrap();
            assert_eq!(
                a.runner.pending(),
                names.len(),
                "a round decides the claims"
            );
            // Acting starts late (the runner was busy): 4.5 s of a 5 s lease with a 1 s
            // margin are gone by the round's view, but a heartbeat landed meanwhile.
            clock.advance(Duration::from_millis(4_500));
            a.membership.heartbeat().await.unwrap();
            (a, clock)
        };

        let (mut stale, _) = start().await;
        stale.runner.act().await;
        assert!(serving(&stale).is_empty(), "act decided on the stale lease");

        let (mut fresh, clock) = start().await;
        fresh.runner.act_in_rounds().await;
        assert_eq!(
            fresh.runner.pending(),
            names.len(),
            "nothing acted on the stale round"
        );
        fresh.runner.observe().await.unwrap();
        fresh.runner.act_in_rounds().await;
        assert_eq!(serving(&fresh), names);
        // While the round's view leaves our lease in no doubt, nothing waits for a round.
        clock.advance(Duration::from_secs(1));
        fresh.runner.self_fenced();
        assert!(fresh.runner.pending() > 0);
        fresh.runner.act_in_rounds().await;
        assert_eq!(fresh.runner.pending(), 0);
    }

    /// Heartbeats that land on time while the runner acts keep counting: a decision after
    /// seconds of acting takes our lease from the latest view, not the round's, so nothing is
    /// suspended and no extra round is needed. At 10,000 partitions a broker a takeover acts
    /// for seconds, and every decision after that suspended everything the broker served.
    #[tokio::test]
    async fn heartbeats_landing_while_acting_keep_the_lease_without_a_round() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..8).map(|i| format!("t/{i}")).collect();
        let mut a = node(&store, &clock, 1, &names);
        a.membership.try_register().await.unwrap();
        a.membership.heartbeat().await.unwrap();
        a.membership.refresh().await.unwrap();
        a.runner.observe().await.unwrap();
        assert_eq!(a.runner.pending(), names.len());
        let round = a.runner.last_round;
        // 4.5 s of a 5 s lease (1 s margin) pass by the round's view, with a heartbeat every
        // second, each well inside the lease before it.
        for _ in 0..4 {
            clock.advance(Duration::from_secs(1));
            a.membership.heartbeat().await.unwrap();
        }
        clock.advance(Duration::from_millis(500));
        a.runner.act_in_rounds().await;
        assert_eq!(a.runner.pending(), 0);
        assert_eq!(
            serving(&a),
            names,
            "served on the lease the heartbeats kept"
        );
        assert_eq!(a.runner.last_round, round, "no round was needed");
        // The controller decided on the round's records and the latest lease: a fenced
        // stop afterwards still goes through.
        a.runner.self_fenced();
        a.runner.act_in_rounds().await;
        assert!(serving(&a).is_empty());
    }

    /// A takeover of many resources of one dead owner seals its stream once and hands the
    /// host one batch: one by one, 10,000 partitions were 10,000 seals (each a listing of the
    /// stream) and 10,000 replays of the same stream by the log.
    #[tokio::test]
    async fn a_dead_owners_stream_is_sealed_once_and_its_resources_served_as_one_batch() {
        let listings = Arc::new(std::sync::Mutex::new(0));
        let store: Arc<dyn ObjectStore> = Arc::new(crate::testkit::WalListings(
            Arc::new(MemoryStore::new()),
            Arc::clone(&listings),
        ));
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..200).map(|i| format!("t/{i}")).collect();
        let (mut a, b) = two_settled(&store, &store, &clock, &names).await;
        let on_b = serving(&b).len();
        assert!(on_b > 50, "{on_b}");
        assert_eq!(*listings.lock().unwrap(), 0);
        a.runner.host().batches.lock().unwrap().clear();
        // b freezes; after its lease a takes everything over.
        for _ in 0..12 {
            clock.advance(Duration::from_millis(500));
            round(&mut a).await;
        }
        assert_eq!(serving(&a), names);
        let (seal, _) = store.get(&wal_key(2, 1).unwrap()).await.unwrap();
        assert_eq!(parse_seal(&seal).unwrap().sealed_by, BrokerId(1));
        // One seal: one listing of b's stream (none is needed for a fresh stream's hole check).
        assert_eq!(*listings.lock().unwrap(), 1);
        assert_eq!(*a.runner.host().batches.lock().unwrap(), vec![on_b]);
        for (resource, (_, record)) in Ownership::new(store.clone()).list("").await.unwrap() {
            assert_eq!(record.owner, BrokerId(1), "{resource}");
        }
    }

    /// A store whose owner-record writes after the first `free` wait until `open` turns true.
    #[derive(Debug)]
    struct ClaimsGated {
        inner: MemoryStore,
        free: usize,
        written: std::sync::atomic::AtomicUsize,
        open: watch::Receiver<bool>,
    }

    #[async_trait]
    impl ObjectStore for ClaimsGated {
        async fn put(
            &self,
            key: &strata_storage::ObjectKey,
            data: bytes::Bytes,
            mode: strata_storage::PutMode,
        ) -> strata_storage::StorageResult<Version> {
            if key.as_str().starts_with(crate::keys::OWNERS_PREFIX)
                && self
                    .written
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                    >= self.free
            {
                let mut open = self.open.clone();
                let _ = open.wait_for(|open| *open).await;
            }
            self.inner.put(key, data, mode).await
        }
        async fn get(
            &self,
            key: &strata_storage::ObjectKey,
        ) -> strata_storage::StorageResult<(bytes::Bytes, Version)> {
            self.inner.get(key).await
        }
        async fn get_range(
            &self,
            key: &strata_storage::ObjectKey,
            range: std::ops::Range<u64>,
        ) -> strata_storage::StorageResult<bytes::Bytes> {
            self.inner.get_range(key, range).await
        }
        async fn list(
            &self,
            prefix: &str,
        ) -> strata_storage::StorageResult<Vec<strata_storage::ObjectMeta>> {
            self.inner.list(prefix).await
        }
        async fn delete(
            &self,
            key: &strata_storage::ObjectKey,
        ) -> strata_storage::StorageResult<()> {
            self.inner.delete(key).await
        }
        fn backend_name(&self) -> &'static str {
            "claims-gated"
        }
    }

    /// A host that opens the gate of [`ClaimsGated`] when it is first asked to serve.
    #[derive(Debug)]
    struct OpensOnServe {
        inner: crate::testkit::Recorder,
        open: watch::Sender<bool>,
    }

    #[async_trait]
    impl ResourceHost for OpensOnServe {
        async fn resources(&self) -> ClusterResult<BTreeSet<String>> {
            self.inner.resources().await
        }
        fn known_resources(&self) -> Option<BTreeSet<String>> {
            self.inner.known_resources()
        }
        async fn start_serving(&self, resource: &str, epoch: Epoch) -> ClusterResult<()> {
            self.inner.start_serving(resource, epoch).await
        }
        async fn start_serving_all(&self, batch: &[(String, Epoch)]) -> Vec<ClusterResult<()>> {
            let _ = self.open.send(true);
            self.inner.start_serving_all(batch).await
        }
        async fn stop_serving(&self, resource: &str, reason: StopReason) -> ClusterResult<()> {
            self.inner.stop_serving(resource, reason).await
        }
    }

    /// A takeover claims in batches of [`BATCH_MAX`], and the log's acquire of a served batch
    /// (a manifest read and write per partition) used to wait until every later batch was
    /// claimed. Here the claims after the first batch cannot land before a serve has
    /// started: the takeover finishes only if the first batch is served beside them.
    #[tokio::test]
    async fn the_next_claims_run_while_the_last_claimed_are_served() {
        let (open, gate) = watch::channel(false);
        let store: Arc<dyn ObjectStore> = Arc::new(ClaimsGated {
            inner: MemoryStore::new(),
            free: BATCH_MAX,
            written: Default::default(),
            open: gate,
        });
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..BATCH_MAX + 100).map(|i| format!("t/{i}")).collect();
        let mut a = node(&store, &clock, 1, &names);
        let mut runner = OwnershipRunner::new(
            store.clone(),
            clock.clone(),
            a.runner.controller().me().clone(),
            ControllerConfig {
                placement_settle: Duration::ZERO,
                ..ControllerConfig::default()
            },
            RunnerConfig::default(),
            a.membership.subscribe(),
            OpensOnServe {
                inner: a.runner.host().clone(),
                open,
            },
        );
        a.membership.try_register().await.unwrap();
        a.membership.refresh().await.unwrap();
        runner.observe().await.unwrap();
        assert_eq!(runner.pending(), names.len());
        // Not a synchronisation: one serial order hangs for ever, the other finishes at once.
        tokio::time::timeout(Duration::from_secs(120), runner.act())
            .await
            .expect("the claims after the first batch waited for nothing but its serve");
        let batches = runner.host().inner.batches.lock().unwrap().clone();
        assert_eq!(batches, vec![BATCH_MAX, 100]);
        assert_eq!(serving(&a), names);
    }

    #[tokio::test]
    async fn a_move_completes_through_the_fast_path_without_another_full_round() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..4).map(|i| format!("t/{i}")).collect();
        let (mut a, mut b) = two_settled(&store, &store, &clock, &names).await;
        let moved = serving(&a).into_iter().next().expect("a serves something");
        // Nothing to do while nothing moves: no record is awaited.
        b.runner.watch().await.unwrap();
        assert_eq!(b.runner.pending(), 0);

        Ownership::new(store.clone())
            .set_placement_override(&moved, BrokerId(2))
            .await
            .unwrap();
        // The target sees the move first: a is live and still holds it, so b awaits it.
        b.runner.watch().await.unwrap();
        b.runner.act().await;
        let now = clock.monotonic();
        assert_eq!(
            b.runner.controller().awaiting_handover(now),
            std::slice::from_ref(&moved)
        );
        // The old owner sees it: hands over and releases.
        a.runner.watch().await.unwrap();
        a.runner.act().await;
        assert!(!serving(&a).contains(&moved));
        assert_eq!(
            a.runner.host().stops.lock().unwrap().last().unwrap(),
            &(moved.clone(), StopReason::Handover)
        );
        // The target's next watch re-reads just that record, claims at epoch + 1 and serves.
        b.runner.watch().await.unwrap();
        b.runner.act().await;
        assert!(serving(&b).contains(&moved));
        let (_, record) = Ownership::new(store.clone())
            .read(&moved)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((record.owner, record.epoch), (BrokerId(2), Epoch(2)));
        assert!(b.runner.controller().awaiting_handover(now).is_empty());
    }

    /// Two brokers over `names`; every partition `a` serves is then moved to `b`, which
    /// watches through a metered store. Returns them, the moved partitions (b awaits all of
    /// them from a, which has not seen the move) and b's metrics.
    async fn b_awaits_a_whole_drain(
        names: BTreeSet<String>,
    ) -> (
        Node,
        Node,
        BTreeSet<String>,
        Arc<ManualClock>,
        Arc<strata_storage::StorageMetrics>,
    ) {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let metered = Arc::new(strata_storage::MetricsStore::new(
            store.clone(),
            clock.clone(),
        ));
        let metrics = Arc::clone(metered.metrics());
        let (a, mut b) =
            two_settled(&store, &(metered as Arc<dyn ObjectStore>), &clock, &names).await;
        let moved = serving(&a);
        assert!(moved.len() > AWAITED_REQUESTS_MAX, "{}", moved.len());
        let mover = Ownership::new(store.clone());
        for resource in &moved {
            mover
                .set_placement_override(resource, BrokerId(2))
                .await
                .unwrap();
        }
        b.runner.watch().await.unwrap();
        b.runner.act().await;
        let awaited = b.runner.controller().awaiting_handover(clock.monotonic());
        assert_eq!(awaited.into_iter().collect::<BTreeSet<_>>(), moved);
        // The first watch that awaits them starts their handovers' watch (and may read the
        // records its cache does not hold yet).
        b.runner.watch().await.unwrap();
        (a, b, moved, clock, metrics)
    }

    /// 100 partitions of one topic.
    fn one_topic() -> BTreeSet<String> {
        (0..100).map(|i| format!("t/{i}")).collect()
    }

    /// (LIST, GET) requests `metrics` counted.
    fn lists_and_gets(metrics: &strata_storage::StorageMetrics) -> (u64, u64) {
        let snapshot = metrics.snapshot();
        (
            snapshot.op(strata_storage::OpKind::List).requests,
            snapshot.op(strata_storage::OpKind::Get).requests,
        )
    }

    /// A drain moves every partition of a broker at once. Re-reading each awaited record every
    /// watch (10 ms) was a read per partition per watch — 100 partitions, 10,000 reads a second
    /// — for as long as the handovers took; one listing of the topic tells which changed.
    #[tokio::test]
    async fn awaiting_many_handovers_costs_one_listing_a_watch_not_a_read_each() {
        let (mut a, mut b, moved, _clock, metrics) = b_awaits_a_whole_drain(one_topic()).await;
        let before = lists_and_gets(&metrics);
        for _ in 0..20 {
            b.runner.watch().await.unwrap();
        }
        let (lists, gets) = lists_and_gets(&metrics);
        // Each watch: the placement-changes marker (one get) and one listing of the topic.
        assert_eq!((lists - before.0, gets - before.1), (20, 20));
        // The old owner hands over; b's next watch sees every release through the listing.
        a.runner.watch().await.unwrap();
        while a.runner.act_one().await {}
        assert!(serving(&a).is_empty());
        b.runner.watch().await.unwrap();
        while b.runner.act_one().await {}
        assert_eq!(serving(&b), (0..100).map(|i| format!("t/{i}")).collect());
        for resource in &moved {
            let (_, record) = Ownership::new(Arc::clone(&b.runner.store))
                .read(resource)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (record.owner, record.epoch),
                (BrokerId(2), Epoch(2)),
                "{resource}"
            );
        }
    }

    /// A drain hands its partitions over one after another, for seconds: while some finish,
    /// the rest stay watched however long ago the drain began.
    #[tokio::test]
    async fn a_drain_that_makes_progress_stays_watched() {
        let (mut a, mut b, moved, clock, metrics) = b_awaits_a_whole_drain(one_topic()).await;
        // a sees the move and stops serving every moved partition (one action each), which
        // queues their releases: each action after that hands one partition over.
        a.runner.watch().await.unwrap();
        for _ in 0..moved.len() {
            assert!(a.runner.act_one().await);
        }
        for handed_over in 1..=4 {
            clock.advance(HANDOVER_WATCHED_FOR * 3 / 5);
            assert!(a.runner.act_one().await);
            b.runner.watch().await.unwrap();
            while b.runner.act_one().await {}
            assert_eq!(serving(&b).intersection(&moved).count(), handed_over);
        }
        // The next watch finds the last handover done; after it, no progress for a while:
        // the watch stops reading the records.
        b.runner.watch().await.unwrap();
        clock.advance(HANDOVER_WATCHED_FOR);
        let before = lists_and_gets(&metrics);
        b.runner.watch().await.unwrap();
        let (lists, gets) = lists_and_gets(&metrics);
        assert_eq!((lists - before.0, gets - before.1), (0, 1));
    }

    /// A drain of a broker serving many single-partition topics: one listing of every record
    /// per watch, not a read per topic.
    #[tokio::test]
    async fn awaiting_many_topics_costs_one_listing_of_everything() {
        let names = (0..100).map(|i| format!("t{i}/0")).collect();
        let (_a, mut b, _moved, _clock, metrics) = b_awaits_a_whole_drain(names).await;
        let before = lists_and_gets(&metrics);
        b.runner.watch().await.unwrap();
        let (lists, gets) = lists_and_gets(&metrics);
        assert_eq!((lists - before.0, gets - before.1), (1, 1));
    }

    /// A handover still not done after [`HANDOVER_WATCHED_FOR`] is left to the full rounds:
    /// the watch stops reading it, and the next round claims it once released.
    #[tokio::test]
    async fn a_slow_handover_is_left_to_the_full_rounds() {
        let (mut a, mut b, moved, clock, metrics) = b_awaits_a_whole_drain(one_topic()).await;
        clock.advance(HANDOVER_WATCHED_FOR);
        let before = lists_and_gets(&metrics);
        b.runner.watch().await.unwrap();
        let (lists, gets) = lists_and_gets(&metrics);
        // Only the placement-changes marker.
        assert_eq!((lists - before.0, gets - before.1), (0, 1));
        a.runner.watch().await.unwrap();
        while a.runner.act_one().await {}
        b.runner.watch().await.unwrap();
        assert!(serving(&b).is_disjoint(&moved), "the watch no longer looks");
        round(&mut b).await;
        while b.runner.act_one().await {}
        assert!(serving(&b).is_superset(&moved));
    }

    /// A mover that dies after writing the override but before signalling it: the watches
    /// miss it (they read only the signal), the next full round does not.
    #[tokio::test]
    async fn an_unsignalled_override_waits_for_the_forced_full_listing() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..4).map(|i| format!("t/{i}")).collect();
        let (mut a, mut b) = two_settled(&store, &store, &clock, &names).await;
        // Both have watched once since the last signal (the first watch always runs a round).
        a.runner.watch().await.unwrap();
        b.runner.watch().await.unwrap();
        let moved = serving(&a).into_iter().next().expect("a serves something");
        store
            .put(
                &crate::keys::placement_key(&moved).unwrap(),
                bytes::Bytes::from_static(br#"{"broker":2}"#),
                strata_storage::PutMode::Create,
            )
            .await
            .unwrap();
        for _ in 0..3 {
            a.runner.watch().await.unwrap();
            a.runner.act().await;
        }
        assert!(serving(&a).contains(&moved), "no signal, no early handover");
        assert!(a.runner.controller().overrides().is_empty());
        // Rounds reuse the overrides listed last until the forced full listing (a mover that
        // died before announcing its change costs that much delay, nothing else).
        let mut rounds = 0;
        while serving(&a).contains(&moved) || !serving(&b).contains(&moved) {
            assert!(
                rounds <= FULL_LISTING_EVERY + 1,
                "the forced full listing finds the override"
            );
            clock.advance(Duration::from_millis(500));
            round(&mut a).await;
            round(&mut b).await;
            rounds += 1;
        }
        assert!(
            rounds > 2,
            "found after {rounds} rounds: listed every round"
        );
    }

    /// The membership republishes its view after every heartbeat and listing; the runner ran a
    /// full round for each publication (two or three a second, each a listing, whatever
    /// `ownership_interval` said). Only a change of who is live, or how, is worth one now.
    /// A store whose listings of owner records take `took` of the manual clock's time, as a
    /// listing of thousands of records does.
    #[derive(Debug)]
    struct SlowListing {
        inner: MemoryStore,
        clock: Arc<ManualClock>,
        took: std::sync::Mutex<Duration>,
    }

    impl SlowListing {
        fn pass_time(&self, prefix: &str) {
            if prefix.starts_with(crate::keys::OWNERS_PREFIX) {
                self.clock.advance(*self.took.lock().unwrap());
            }
        }
    }

    #[async_trait]
    impl ObjectStore for SlowListing {
        async fn put(
            &self,
            key: &strata_storage::ObjectKey,
            data: bytes::Bytes,
            mode: strata_storage::PutMode,
        ) -> strata_storage::StorageResult<Version> {
            self.inner.put(key, data, mode).await
        }
        async fn get(
            &self,
            key: &strata_storage::ObjectKey,
        ) -> strata_storage::StorageResult<(bytes::Bytes, Version)> {
            self.inner.get(key).await
        }
        async fn get_range(
            &self,
            key: &strata_storage::ObjectKey,
            range: std::ops::Range<u64>,
        ) -> strata_storage::StorageResult<bytes::Bytes> {
            self.inner.get_range(key, range).await
        }
        async fn list(
            &self,
            prefix: &str,
        ) -> strata_storage::StorageResult<Vec<strata_storage::ObjectMeta>> {
            self.pass_time(prefix);
            self.inner.list(prefix).await
        }
        async fn list_keys(
            &self,
            prefix: &str,
        ) -> strata_storage::StorageResult<Vec<strata_storage::ListedKey>> {
            self.pass_time(prefix);
            self.inner.list_keys(prefix).await
        }
        async fn delete(
            &self,
            key: &strata_storage::ObjectKey,
        ) -> strata_storage::StorageResult<()> {
            self.inner.delete(key).await
        }
        fn backend_name(&self) -> &'static str {
            "slow-listing"
        }
    }

    /// A round that took long holds the next regular round back for `round_cost_ratio` times
    /// as long, counted from its start; a cheap round holds nothing back. At 10,000 partitions
    /// a broker, 240 ms rounds every 250 ms took most of an idle broker's core.
    #[tokio::test]
    async fn regular_rounds_wait_in_proportion_to_what_the_last_one_took() {
        let clock = Arc::new(ManualClock::new(0));
        let slow = Arc::new(SlowListing {
            inner: MemoryStore::new(),
            clock: Arc::clone(&clock),
            took: std::sync::Mutex::new(Duration::ZERO),
        });
        let store: Arc<dyn ObjectStore> = slow.clone();
        let names: BTreeSet<String> = (0..4).map(|i| format!("t/{i}")).collect();
        let mut a = node(&store, &clock, 1, &names);
        a.membership.try_register().await.unwrap();
        a.membership.refresh().await.unwrap();
        assert!(a.runner.round_due_by_cost(), "no round yet");
        a.runner.observe().await.unwrap();
        assert!(a.runner.round_due_by_cost(), "a round that took no time");

        *slow.took.lock().unwrap() = Duration::from_millis(300);
        a.runner.observe().await.unwrap();
        let ratio = RunnerConfig::default().round_cost_ratio;
        assert!(ratio > 1);
        // 300 ms have passed inside the round; the next waits until 300 ms × ratio after it
        // started.
        let due = Duration::from_millis(300) * ratio;
        clock.advance(due - Duration::from_millis(301));
        assert!(
            !a.runner.round_due_by_cost(),
            "too soon after a 300 ms round"
        );
        clock.advance(Duration::from_millis(1));
        assert!(a.runner.round_due_by_cost());

        // However long a round took (an outage's timeouts), the next waits 10 s at most.
        // A 5 s round would hold the next back 20 s; 5 s of it have passed inside the round.
        *slow.took.lock().unwrap() = Duration::from_secs(5);
        a.runner.observe().await.unwrap();
        clock.advance(ROUND_SPACING_MAX - Duration::from_secs(5) - Duration::from_millis(1));
        assert!(!a.runner.round_due_by_cost());
        clock.advance(Duration::from_millis(1));
        assert!(
            a.runner.round_due_by_cost(),
            "held back no longer than the cap"
        );

        // The cost is the last round's: a cheap one lifts the wait again.
        *slow.took.lock().unwrap() = Duration::ZERO;
        a.runner.observe().await.unwrap();
        assert!(a.runner.round_due_by_cost());
    }

    #[tokio::test]
    async fn only_a_change_of_the_live_brokers_is_worth_a_round_before_the_tick() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..4).map(|i| format!("t/{i}")).collect();
        let mut a = node(&store, &clock, 1, &names);
        let mut b = node(&store, &clock, 2, &names);
        a.membership.try_register().await.unwrap();
        b.membership.try_register().await.unwrap();
        let view = a.membership.refresh().await.unwrap();
        clock.advance(Duration::from_secs(1));
        a.membership.heartbeat().await.unwrap();
        b.membership.heartbeat().await.unwrap();
        let next = a.membership.refresh().await.unwrap();
        assert_ne!(
            view, next,
            "every publication differs (heartbeats, time of listing)"
        );
        assert_eq!(view_summary(&view), view_summary(&next));

        // B stops heartbeating: once its lease passes, A's view loses it, and that is a change.
        let mut dead = next.clone();
        for _ in 0..6 {
            clock.advance(Duration::from_secs(1));
            a.membership.heartbeat().await.unwrap();
            dead = a.membership.refresh().await.unwrap();
        }
        assert!(!dead.is_live(BrokerId(2)));
        assert_ne!(view_summary(&next), view_summary(&dead));
        // So is draining.
        let mut draining = next.clone();
        if let Some(m) = draining.members.get_mut(&BrokerId(2)) {
            m.registration.draining = true;
        }
        assert_ne!(view_summary(&next), view_summary(&draining));
    }

    #[tokio::test(start_paused = true)]
    async fn a_spawned_runner_reports_what_it_serves_and_ends_when_fenced() {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(0));
        let names: BTreeSet<String> = (0..4).map(|i| format!("t/{i}")).collect();
        let Node {
            mut membership,
            runner,
        } = node(&store, &clock, 1, &names);
        let host = runner.host().clone();
        membership.join().await.unwrap();
        let membership = membership.spawn();
        let handle = runner.spawn();
        let mut status = handle.status();
        status.wait_for(|s| s.serving.len() == 4).await.unwrap();
        assert!(!status.borrow().holds_nothing);
        handle.self_fenced().await.unwrap();
        let ended = handle.stop().await;
        assert!(matches!(ended, Err(ClusterError::Fenced)), "{ended:?}");
        assert!(host.serving.lock().unwrap().is_empty());
        assert!(host
            .stops
            .lock()
            .unwrap()
            .iter()
            .all(|(_, why)| *why == StopReason::Fenced));
        membership.leave().await.unwrap();
    }
}
