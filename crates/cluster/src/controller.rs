//! The ownership state machine of one broker: which resources to claim, serve, hand over and
//! release. Pure: it is fed events with the caller's monotonic `now` and returns [`Action`]s;
//! it never reads a clock, draws a random number or touches storage. [`crate::runner`] carries
//! its actions out; the simulation and the unit tests below drive it by hand.
//!
//! Per resource it keeps a phase and the last ownership record it knows:
//!
//! ```text
//!            Claim / FenceThenClaim            Serve
//!   Idle ──────────────────────────▶ Claiming ──▶ (Idle, record mine) ──▶ Serving
//!    ▲                                                                      │ placed elsewhere
//!    │  ReleaseFinished        Release              HandoverFinished        ▼ StopServing(Handover)
//!    └──────────────── Releasing ◀──────── HandedOver ◀──────────── StoppingForHandover
//! ```
//!
//! Rules that make it safe together with the storage's conditional writes:
//!
//! - A resource is claimed only when placement puts it on us and its record is absent,
//!   Released, or names an owner (broker *and* incarnation) our view says is dead. A dead
//!   owner's stream is sealed first ([`Action::FenceThenClaim`]).
//! - A record we have not observed since our last failed attempt is never acted on, and at most
//!   one claim or release per resource is in flight; a lost race backs off (deterministic
//!   jitter from a stable hash, so runs replay).
//! - We serve only what the latest record says we hold at exactly that epoch, and only while
//!   our own lease cannot have lapsed in anybody's eyes.
//! - We release only after the host stopped, flushed and checkpointed the resource: Released
//!   tells the successor that nothing needs fencing or replaying.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use strata_core::{BrokerId, Epoch};

use crate::membership::{ClusterView, Incarnation};
use crate::ownership::{Claimant, OwnerState, VersionedRecord};
use crate::placement::{place, rendezvous_weight};
use crate::ClusterError;

/// Tuning of the controller. Durations are on the broker's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerConfig {
    /// First back-off after a failed or lost claim or release; doubles per failure.
    pub claim_backoff: Duration,
    pub max_claim_backoff: Duration,
    /// A broker must have been live this long before placement targets it (anti-flapping).
    pub placement_settle: Duration,
    /// Stop serving this long before our own lease could lapse in another broker's eyes.
    /// None trusts the stream seal alone (a paused broker may serve stale reads until it
    /// notices).
    pub self_lease_margin: Option<Duration>,
    /// How long an owner must have been absent from our view (by our own clock) before we
    /// fence it. A broker that registered after our last listing is absent too, without being
    /// dead: fencing on first sight would seal a healthy newcomer's stream. A couple of
    /// heartbeat intervals lets our next listing see it (the broker uses two); zero fences on
    /// first sight (the runtime-free tests, whose views are exact).
    pub dead_owner_grace: Duration,
    /// Spread partitions over the live brokers by rendezvous hashing, moving some to a broker
    /// that joins. Off, a partition stays with its live owner (only explicit moves, a draining
    /// or dead owner, or a new partition place by hashing): for operators who place by hand.
    pub auto_rebalance: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            claim_backoff: Duration::from_millis(250),
            max_claim_backoff: Duration::from_secs(5),
            placement_settle: Duration::from_secs(2),
            self_lease_margin: Some(Duration::from_secs(1)),
            dead_owner_grace: Duration::ZERO,
            auto_rebalance: true,
        }
    }
}

/// How a storage step the controller asked for failed, which is all it needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Somebody else changed the record first.
    Lost,
    /// Transient; the write may or may not have landed.
    Retryable,
    /// Anything else.
    Failed,
}

impl Failure {
    pub fn of(error: &ClusterError) -> Self {
        if matches!(
            error,
            ClusterError::Lost { .. } | ClusterError::NotOwner { .. }
        ) {
            Failure::Lost
        } else if error.is_retryable() {
            Failure::Retryable
        } else {
            Failure::Failed
        }
    }
}

/// What the controller is told.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Nothing new; time passed (back-offs may have run out, our lease may be running out).
    Tick,
    /// The membership published a new view.
    View(ClusterView),
    /// The membership's latest view, for our own standing only: its `self_lease_until` is
    /// taken if our lease held all along since the view last applied
    /// ([`ClusterView::self_lease_unbroken_since`]); a lost registration is always taken.
    /// Members and everything else stay as that view had them, the records having been read
    /// after it.
    SelfStanding(ClusterView),
    /// The resources that exist (from the catalog). Those not listed are stopped and forgotten.
    Resources(BTreeSet<String>),
    /// The operator's placement overrides.
    Overrides(BTreeMap<String, BrokerId>),
    /// The current ownership record of a resource, as just read (None: no record).
    Observed {
        resource: String,
        record: Option<VersionedRecord>,
    },
    ClaimFinished {
        resource: String,
        result: Result<VersionedRecord, Failure>,
    },
    /// The host finished a `StopServing { reason: Handover }`: with `ok`, everything is
    /// flushed and checkpointed; without, the resource was not cleanly stopped.
    HandoverFinished { resource: String, ok: bool },
    ReleaseFinished {
        resource: String,
        result: Result<VersionedRecord, Failure>,
    },
    /// The host could not start serving a resource it was told to serve.
    ServeFailed { resource: String },
    /// Our own write-ahead stream was sealed: everything is being taken over. Terminal.
    SelfFenced,
}

/// Why the host must stop serving a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Placement moved it: stop accepting, flush, checkpoint, then report `HandoverFinished`.
    Handover,
    /// Somebody else holds it now; our writes would fail anyway.
    Lost,
    /// Our heartbeats stopped landing: others may soon judge us dead.
    SelfLeaseExpired,
    /// Our stream was sealed or our registration taken over.
    Fenced,
    /// The resource no longer exists.
    Removed,
}

/// What the controller asks the caller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Claim by create-only put (`expected` None) or compare-and-swap from `expected`.
    /// Report `ClaimFinished`.
    Claim {
        resource: String,
        expected: Option<VersionedRecord>,
    },
    /// The owner is dead: seal `dead_stream` (all of the dead incarnation's writes are then
    /// final), then claim from `expected`. Report `ClaimFinished` (a failed seal is a failed
    /// claim).
    FenceThenClaim {
        resource: String,
        dead_owner: BrokerId,
        dead_stream: Option<u32>,
        expected: VersionedRecord,
    },
    /// Compare-and-swap the record to Released (after the handover finished). Report
    /// `ReleaseFinished`.
    Release {
        resource: String,
        current: VersionedRecord,
    },
    /// Recover and serve the resource, stamping `epoch` on everything written (report
    /// `ServeFailed` if that fails).
    Serve { resource: String, epoch: Epoch },
    /// Stop serving; for `Handover`, report `HandoverFinished` when flushed and checkpointed.
    StopServing {
        resource: String,
        reason: StopReason,
    },
}

impl Action {
    pub fn resource(&self) -> &str {
        match self {
            Action::Claim { resource, .. }
            | Action::FenceThenClaim { resource, .. }
            | Action::Release { resource, .. }
            | Action::Serve { resource, .. }
            | Action::StopServing { resource, .. } => resource,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Claiming,
    Serving { epoch: Epoch },
    StoppingForHandover { epoch: Epoch },
    HandedOver { epoch: Epoch },
    Releasing { epoch: Epoch },
}

#[derive(Debug, Clone)]
struct Slot {
    phase: Phase,
    record: Option<VersionedRecord>,
    /// Whether `record` is trustworthy: false until observed, and again after any attempt
    /// whose outcome left the record unknown.
    known: bool,
    retry_at: Duration,
    failures: u32,
    /// Since when (our clock) the record's owner has been missing from our view.
    owner_absent_since: Option<(BrokerId, Incarnation, Duration)>,
}

impl Slot {
    /// Idle, with a known record that another broker holds Active.
    fn held_active_elsewhere(&self, me: &Claimant) -> bool {
        self.phase == Phase::Idle
            && self.known
            && self
                .record
                .as_ref()
                .is_some_and(|(_, r)| r.state == OwnerState::Active && !r.is_held_by(me))
    }

    fn new() -> Self {
        Self {
            phase: Phase::Idle,
            record: None,
            known: false,
            retry_at: Duration::ZERO,
            failures: 0,
            owner_absent_since: None,
        }
    }
}

/// One broker's ownership decisions. See the module documentation.
#[derive(Debug, Clone)]
pub struct OwnershipController {
    me: Claimant,
    config: ControllerConfig,
    view: ClusterView,
    resources: BTreeSet<String>,
    overrides: BTreeMap<String, BrokerId>,
    slots: BTreeMap<String, Slot>,
    /// The resources a handover could be awaited for, noted by each decision so that the move
    /// watch, every few milliseconds, does not scan 10,000 slots to find none. None after an
    /// event that may have changed a slot, until the next decision.
    awaited_note: Option<AwaitedNote>,
    fenced: bool,
}

impl OwnershipController {
    pub fn new(me: Claimant, config: ControllerConfig) -> Self {
        Self {
            me,
            config,
            view: ClusterView::default(),
            resources: BTreeSet::new(),
            overrides: BTreeMap::new(),
            slots: BTreeMap::new(),
            awaited_note: None,
            fenced: false,
        }
    }

    pub fn me(&self) -> &Claimant {
        &self.me
    }

    /// Applies `event` and returns what to do now.
    pub fn step(&mut self, now: Duration, event: Event) -> Vec<Action> {
        self.apply(now, event);
        self.decide(now)
    }

    /// Applies several events, then decides once: a whole observation round (view, resources,
    /// overrides, records) should be taken together, or a broker waking from a pause could
    /// act on a fresh view and stale records.
    pub fn step_all(
        &mut self,
        now: Duration,
        events: impl IntoIterator<Item = Event>,
    ) -> Vec<Action> {
        for event in events {
            self.apply(now, event);
        }
        self.decide(now)
    }

    /// Resources whose ownership record we need fresh: placed on us, or held or in flight here.
    /// Reading only these keeps storage reads per broker proportional to its share.
    pub fn wants_observation(&self, now: Duration) -> Vec<String> {
        let candidates = self.candidates(now);
        let mut wanted: BTreeSet<&String> = self
            .resources
            .iter()
            .filter(|r| {
                // Where hashing alone would put it too: without automatic rebalancing that is
                // who takes over when the owner dies, so it must keep the record in sight.
                place(r, &candidates, &self.overrides) == Some(self.me.broker)
                    || self.placement(r, &candidates) == Some(self.me.broker)
            })
            .collect();
        for (resource, slot) in &self.slots {
            let held = slot
                .record
                .as_ref()
                .is_some_and(|(_, r)| r.is_held_by(&self.me));
            // After a failed claim or release the outcome may be that we hold it after all
            // (an ambiguous write that landed): keep looking until we know, or a live owner
            // that does not know it owns something would block everybody.
            let uncertain = !slot.known && slot.failures > 0;
            if held || uncertain || slot.phase != Phase::Idle {
                wanted.insert(resource);
            }
        }
        wanted.into_iter().cloned().collect()
    }

    /// Resources placed on us whose record another broker, live by our view, still holds
    /// Active: it saw the same placement and is handing them over, and its Released is all we
    /// wait for. The runner re-reads just these records on a short period between full rounds,
    /// so a move costs the old owner's flush rather than our next full round. Empty almost
    /// always, so the fast path costs nothing when no move is under way.
    pub fn awaiting_handover(&self, now: Duration) -> Vec<String> {
        let candidates = self.candidates(now);
        let awaited = |resource: &String, slot: &Slot| {
            slot.held_active_elsewhere(&self.me)
                && self.resources.contains(resource)
                && self.placement(resource, &candidates) == Some(self.me.broker)
                && slot
                    .record
                    .as_ref()
                    .is_some_and(|(_, r)| self.view.is_live_incarnation(r.owner, r.incarnation))
        };
        match &self.awaited_note {
            // Nothing but time has passed since the note: a slot outside it could only qualify
            // through a placement that changed, and placement changes with time only through
            // the candidates (a member settling in, a lease lapsing).
            Some(note) if note.candidates == candidates => note
                .resources
                .iter()
                .filter(|resource| {
                    self.slots
                        .get(*resource)
                        .is_some_and(|slot| awaited(resource, slot))
                })
                .cloned()
                .collect(),
            _ => self
                .slots
                .iter()
                .filter(|(resource, slot)| awaited(resource, slot))
                .map(|(resource, _)| resource.clone())
                .collect(),
        }
    }

    /// The placement overrides as last observed.
    pub fn overrides(&self) -> &BTreeMap<String, BrokerId> {
        &self.overrides
    }

    /// Where `resource` belongs as of `now`, by our view.
    pub fn target(&self, now: Duration, resource: &str) -> Option<BrokerId> {
        self.placement(resource, &self.candidates(now))
    }

    /// Where `resource` belongs among `candidates`: an explicit placement first; then, without
    /// automatic rebalancing, its current owner while that owner is live and a candidate;
    /// otherwise rendezvous hashing.
    fn placement(&self, resource: &str, candidates: &BTreeSet<BrokerId>) -> Option<BrokerId> {
        if !self.config.auto_rebalance {
            let overridden = self
                .overrides
                .get(resource)
                .is_some_and(|t| candidates.contains(t));
            let owner = self
                .slots
                .get(resource)
                .and_then(|s| s.record.as_ref())
                .map(|(_, r)| r)
                .filter(|r| {
                    r.state == OwnerState::Active
                        && candidates.contains(&r.owner)
                        && self.view.is_live_incarnation(r.owner, r.incarnation)
                });
            if let (false, Some(owner)) = (overridden, owner) {
                return Some(owner.owner);
            }
        }
        place(resource, candidates, &self.overrides)
    }

    /// What we believe we serve, at which epoch.
    pub fn serving(&self) -> BTreeMap<String, Epoch> {
        self.slots
            .iter()
            .filter_map(|(r, s)| match s.phase {
                Phase::Serving { epoch } => Some((r.clone(), epoch)),
                _ => None,
            })
            .collect()
    }

    /// Whether we hold nothing any more: no record names us Active and nothing is in flight.
    /// A draining broker may leave once this is true.
    pub fn holds_nothing(&self) -> bool {
        self.slots.values().all(|s| {
            s.phase == Phase::Idle
                && !s
                    .record
                    .as_ref()
                    .is_some_and(|(_, r)| r.is_held_by(&self.me) && r.state == OwnerState::Active)
        })
    }

    /// What the controller knows about one resource, for diagnostics.
    pub fn describe(&self, resource: &str) -> String {
        format!("{:?}", self.slots.get(resource))
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced || self.view.registration_lost
    }

    /// Applies `event` without deciding anything (see [`Self::step_all`]).
    pub fn apply(&mut self, now: Duration, event: Event) {
        if !matches!(event, Event::Tick | Event::SelfStanding(_)) {
            self.awaited_note = None;
        }
        match event {
            Event::Tick => {}
            Event::View(view) => self.view = view,
            Event::SelfStanding(latest) => {
                let margin = self.config.self_lease_margin.unwrap_or_default();
                if latest.self_lease_unbroken_since(self.view.observed_at, margin) {
                    self.view.self_lease_until = latest.self_lease_until;
                }
                self.view.registration_lost |= latest.registration_lost;
            }
            Event::Resources(resources) => self.resources = resources,
            Event::Overrides(overrides) => self.overrides = overrides,
            Event::SelfFenced => self.fenced = true,
            Event::Observed { resource, record } => {
                let slot = self.slots.entry(resource).or_insert_with(Slot::new);
                // An observation older than what we know (progress only moves forward) is
                // dropped; an absent record is always taken (the resource was deleted).
                let stale = match (&record, &slot.record) {
                    (Some((_, seen)), Some((_, known))) => {
                        slot.known && seen.progress() < known.progress()
                    }
                    _ => false,
                };
                if !stale {
                    slot.record = record;
                    slot.known = true;
                }
            }
            Event::ClaimFinished { resource, result } => {
                let Some(slot) = self.slots.get_mut(&resource) else {
                    return;
                };
                if slot.phase != Phase::Claiming {
                    return;
                }
                slot.phase = Phase::Idle;
                match result {
                    Ok(record) => {
                        slot.record = Some(record);
                        slot.known = true;
                        slot.failures = 0;
                    }
                    Err(failure) => {
                        Self::back_off(&self.me, &self.config, now, &resource, slot, failure)
                    }
                }
            }
            Event::HandoverFinished { resource, ok } => {
                let Some(slot) = self.slots.get_mut(&resource) else {
                    return;
                };
                let Phase::StoppingForHandover { epoch } = slot.phase else {
                    return;
                };
                if ok {
                    slot.phase = Phase::HandedOver { epoch };
                } else {
                    slot.phase = Phase::Idle;
                    Self::back_off(
                        &self.me,
                        &self.config,
                        now,
                        &resource,
                        slot,
                        Failure::Failed,
                    );
                    // The record itself is still valid: only the host failed.
                    slot.known = true;
                }
            }
            Event::ReleaseFinished { resource, result } => {
                let Some(slot) = self.slots.get_mut(&resource) else {
                    return;
                };
                let Phase::Releasing { epoch } = slot.phase else {
                    return;
                };
                match result {
                    Ok(record) => {
                        slot.phase = Phase::Idle;
                        slot.record = Some(record);
                        slot.known = true;
                        slot.failures = 0;
                    }
                    Err(Failure::Lost) => {
                        // Somebody fenced us and took it: nothing left to release.
                        slot.phase = Phase::Idle;
                        Self::back_off(&self.me, &self.config, now, &resource, slot, Failure::Lost);
                    }
                    Err(failure) => {
                        // Still flushed and checkpointed: retry the release after a pause.
                        slot.phase = Phase::HandedOver { epoch };
                        Self::back_off(&self.me, &self.config, now, &resource, slot, failure);
                    }
                }
            }
            Event::ServeFailed { resource } => {
                let Some(slot) = self.slots.get_mut(&resource) else {
                    return;
                };
                if matches!(slot.phase, Phase::Serving { .. }) {
                    slot.phase = Phase::Idle;
                    Self::back_off(
                        &self.me,
                        &self.config,
                        now,
                        &resource,
                        slot,
                        Failure::Failed,
                    );
                    slot.known = true;
                }
            }
        }
    }

    fn back_off(
        me: &Claimant,
        config: &ControllerConfig,
        now: Duration,
        resource: &str,
        slot: &mut Slot,
        failure: Failure,
    ) {
        slot.failures = slot.failures.saturating_add(1);
        // Whatever we knew may be outdated now (a lost race means somebody wrote; a transient
        // error may have been applied): act again only after a fresh observation.
        slot.known = false;
        let exponent = slot.failures.saturating_sub(1).min(16);
        let base = config
            .claim_backoff
            .saturating_mul(1u32 << exponent)
            .min(config.max_claim_backoff);
        // Deterministic jitter: two brokers that lost the same race retry at different times.
        let jitter_range = u64::try_from(config.claim_backoff.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let jitter =
            rendezvous_weight(&format!("{resource}#{}", slot.failures), me.broker) % jitter_range;
        slot.retry_at = now + base + Duration::from_millis(jitter);
        tracing::debug!(resource, ?failure, failures = slot.failures, "backing off");
    }

    fn candidates(&self, now: Duration) -> BTreeSet<BrokerId> {
        self.view
            .placement_candidates(now, self.config.placement_settle)
    }

    /// Whether a decision at `now` would take our own lease for in doubt, by the view last
    /// applied (the runner then takes a fresh round first when that view is old).
    pub fn lease_in_doubt(&self, now: Duration) -> bool {
        !self.self_ok(now)
    }

    /// Whether nobody can have judged us dead yet (with the configured margin).
    fn self_ok(&self, now: Duration) -> bool {
        match self.view.self_lease_until {
            None => false,
            Some(until) => self
                .config
                .self_lease_margin
                .is_none_or(|margin| now + margin < until),
        }
    }

    fn decide(&mut self, now: Duration) -> Vec<Action> {
        let candidates = self.candidates(now);
        let context = Context {
            now,
            self_ok: self.self_ok(now),
            dead: self.is_fenced(),
            dead_owner_grace: self.config.dead_owner_grace,
        };
        if !context.self_ok {
            // Others may have judged us dead meanwhile and taken things over: nothing we know
            // about any record can be trusted until it is read again.
            for slot in self.slots.values_mut() {
                slot.known = false;
            }
        }
        let names: BTreeSet<String> = self
            .resources
            .iter()
            .chain(self.slots.keys())
            .cloned()
            .collect();
        let mut actions = Vec::new();
        let mut awaitable = Vec::new();
        for name in names {
            let exists = self.resources.contains(&name);
            let target = if exists {
                self.placement(&name, &candidates)
            } else {
                None
            };
            let slot = self.slots.entry(name.clone()).or_insert_with(Slot::new);
            if let Some(action) =
                decide_one(&self.me, &self.view, &context, &name, exists, target, slot)
            {
                actions.push(action);
            }
            if !exists && slot.phase == Phase::Idle {
                self.slots.remove(&name);
            } else if target == Some(self.me.broker) && slot.held_active_elsewhere(&self.me) {
                awaitable.push(name);
            }
        }
        self.awaited_note = Some(AwaitedNote {
            candidates,
            resources: awaitable,
        });
        actions
    }
}

/// What a decision noted for [`OwnershipController::awaiting_handover`]: the slots placed on
/// us that another broker holds Active, and the placement candidates they were placed among.
/// A slot placed elsewhere is left out, which in a cluster of two is half of all partitions.
#[derive(Debug, Clone)]
struct AwaitedNote {
    candidates: BTreeSet<BrokerId>,
    resources: Vec<String>,
}

struct Context {
    now: Duration,
    self_ok: bool,
    dead: bool,
    dead_owner_grace: Duration,
}

fn decide_one(
    me: &Claimant,
    view: &ClusterView,
    cx: &Context,
    name: &str,
    exists: bool,
    target: Option<BrokerId>,
    slot: &mut Slot,
) -> Option<Action> {
    let mine_active = slot
        .record
        .as_ref()
        .and_then(|(_, r)| (r.is_held_by(me) && r.state == OwnerState::Active).then_some(r.epoch));
    let placed_elsewhere = target.is_some_and(|t| t != me.broker);
    let stop = |slot: &mut Slot, reason: StopReason| {
        slot.phase = Phase::Idle;
        Some(Action::StopServing {
            resource: name.to_string(),
            reason,
        })
    };
    match slot.phase {
        Phase::Claiming | Phase::StoppingForHandover { .. } | Phase::Releasing { .. } => None,
        Phase::Serving { epoch } => {
            if cx.dead {
                stop(slot, StopReason::Fenced)
            } else if !exists {
                stop(slot, StopReason::Removed)
            } else if mine_active != Some(epoch) {
                stop(slot, StopReason::Lost)
            } else if !cx.self_ok {
                stop(slot, StopReason::SelfLeaseExpired)
            } else if placed_elsewhere {
                slot.phase = Phase::StoppingForHandover { epoch };
                Some(Action::StopServing {
                    resource: name.to_string(),
                    reason: StopReason::Handover,
                })
            } else {
                None
            }
        }
        Phase::HandedOver { epoch } => {
            if cx.dead || !exists || mine_active != Some(epoch) {
                // Fenced or gone: never release, the successor fences and replays instead.
                slot.phase = Phase::Idle;
                return None;
            }
            if slot.retry_at > cx.now || !slot.known {
                return None;
            }
            match target {
                Some(t) if t == me.broker && cx.self_ok => {
                    // Placement came back to us before we let go: just serve again.
                    slot.phase = Phase::Serving { epoch };
                    Some(Action::Serve {
                        resource: name.to_string(),
                        epoch,
                    })
                }
                Some(t) if t != me.broker => {
                    let current = slot.record.clone()?;
                    slot.phase = Phase::Releasing { epoch };
                    Some(Action::Release {
                        resource: name.to_string(),
                        current,
                    })
                }
                _ => None,
            }
        }
        Phase::Idle => {
            if cx.dead || !exists || !cx.self_ok || slot.retry_at > cx.now || !slot.known {
                return None;
            }
            if let Some(epoch) = mine_active {
                return if placed_elsewhere {
                    // Held but not served (a claim whose answer we lost, a failed start, a
                    // lease scare): still hand over properly, the host may hold unflushed data.
                    slot.phase = Phase::StoppingForHandover { epoch };
                    Some(Action::StopServing {
                        resource: name.to_string(),
                        reason: StopReason::Handover,
                    })
                } else {
                    slot.phase = Phase::Serving { epoch };
                    Some(Action::Serve {
                        resource: name.to_string(),
                        epoch,
                    })
                };
            }
            if target != Some(me.broker) {
                return None;
            }
            let resource = name.to_string();
            let action = match &slot.record {
                None => Action::Claim {
                    resource,
                    expected: None,
                },
                Some(current @ (_, record)) => {
                    if record.state == OwnerState::Released {
                        Action::Claim {
                            resource,
                            expected: Some(current.clone()),
                        }
                    } else if view.is_live_incarnation(record.owner, record.incarnation) {
                        // A live owner hands over by itself once it sees the new placement.
                        slot.owner_absent_since = None;
                        return None;
                    } else {
                        let since = match slot.owner_absent_since {
                            Some((o, i, t)) if o == record.owner && i == record.incarnation => t,
                            _ => {
                                slot.owner_absent_since =
                                    Some((record.owner, record.incarnation, cx.now));
                                cx.now
                            }
                        };
                        // The grace guards against sealing a live newcomer we have not
                        // listed yet. Two kinds of owner need none. An earlier incarnation of
                        // our own id: we hold the id's registration, so that process is dead
                        // to the cluster (and the seal stops it should it still be running).
                        // An incarnation this observer saw live and then saw go (its lease
                        // lapsed by our own clock, or it left): it is no newcomer, and the
                        // lapse is the contract by which it stopped serving (its own
                        // `self_lease_margin`). Waiting the grace out there only added two
                        // heartbeats to every takeover.
                        let own_predecessor = record.owner == me.broker;
                        let seen_leaving = view
                            .departed
                            .get(&record.owner)
                            .is_some_and(|d| d.registration.incarnation == record.incarnation);
                        // The grace runs in listings, not in time: the owner must still be
                        // missing from a view *listed* a grace after we first found it
                        // missing. Decisions between rounds (after a long run of claims or
                        // serves) use the round's view, and a grace counted on the clock ran
                        // out there with no listing since: a broker 7 s old at 10,000
                        // partitions was sealed that way, live, by a peer deciding on a view
                        // listed before it joined.
                        if !own_predecessor
                            && !seen_leaving
                            && view.observed_at < since + cx.dead_owner_grace
                        {
                            return None;
                        }
                        Action::FenceThenClaim {
                            resource,
                            dead_owner: record.owner,
                            dead_stream: record.stream,
                            expected: current.clone(),
                        }
                    }
                }
            };
            slot.phase = Phase::Claiming;
            Some(action)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{BrokerRegistration, Member};
    use crate::ownership::OwnerRecord;
    use strata_storage::Version;

    const LEASE: Duration = Duration::from_secs(5);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn claimant(b: i32) -> Claimant {
        Claimant {
            broker: BrokerId(b),
            incarnation: Incarnation(b as u64 * 100),
            stream: Some(b as u32),
        }
    }

    fn config() -> ControllerConfig {
        ControllerConfig {
            placement_settle: Duration::ZERO,
            ..ControllerConfig::default()
        }
    }

    fn member(b: i32, draining: bool, live_since: Duration) -> (BrokerId, Member) {
        (
            BrokerId(b),
            Member {
                registration: BrokerRegistration {
                    node_id: BrokerId(b),
                    host: "localhost".into(),
                    port: 9000 + b as u16,
                    incarnation: claimant(b).incarnation,
                    started_ms: 0,
                    heartbeat: 1,
                    draining,
                    process: None,
                    listeners: Vec::new(),
                },
                live_since,
            },
        )
    }

    /// A view, as broker `me` would publish it at `now`, of live brokers `live`
    /// (negative id = draining).
    fn view(now: Duration, live: &[i32]) -> ClusterView {
        ClusterView {
            observed_at: now,
            members: live
                .iter()
                .map(|b| member(b.abs(), *b < 0, Duration::ZERO))
                .collect(),
            departed: BTreeMap::new(),
            self_lease_until: Some(now + LEASE),
            registration_lost: false,
            self_lease_renewals: Vec::new(),
        }
    }

    fn record(owner: i32, epoch: u64, state: OwnerState, version: u64) -> VersionedRecord {
        (
            Version(version.to_string()),
            OwnerRecord {
                owner: BrokerId(owner),
                incarnation: claimant(owner).incarnation,
                epoch: Epoch(epoch),
                state,
                stream: Some(owner as u32),
            },
        )
    }

    fn brokers(ids: &[i32]) -> BTreeSet<BrokerId> {
        ids.iter().map(|b| BrokerId(*b)).collect()
    }

    /// The first `t/<i>` that hashing puts on `target` among `among`.
    fn placed_on(target: i32, among: &[i32]) -> String {
        (0..)
            .map(|i| format!("t/{i}"))
            .find(|r| place(r, &brokers(among), &BTreeMap::new()) == Some(BrokerId(target)))
            .unwrap()
    }

    fn resources(names: &[&String]) -> Event {
        Event::Resources(names.iter().map(|s| s.to_string()).collect())
    }

    fn observed(resource: &str, record: Option<VersionedRecord>) -> Event {
        Event::Observed {
            resource: resource.to_string(),
            record,
        }
    }

    /// A controller for broker `me` that has seen `live` and the resources.
    fn controller(me: i32, live: &[i32], names: &[&String]) -> OwnershipController {
        let mut c = OwnershipController::new(claimant(me), config());
        assert!(c.step(ms(0), Event::View(view(ms(0), live))).is_empty());
        assert!(c.step(ms(0), resources(names)).is_empty());
        c
    }

    /// A controller for broker `me` whose placement waits 2 s for a member to settle in,
    /// with no view or resources yet.
    fn settling_controller(me: i32) -> OwnershipController {
        OwnershipController::new(
            claimant(me),
            ControllerConfig {
                placement_settle: Duration::from_secs(2),
                ..ControllerConfig::default()
            },
        )
    }

    /// Drives `c` to serving `resource` at epoch 1 from an absent record.
    fn serve_fresh(c: &mut OwnershipController, resource: &str, now: Duration) -> VersionedRecord {
        let actions = c.step(now, observed(resource, None));
        assert_eq!(
            actions,
            [Action::Claim {
                resource: resource.into(),
                expected: None
            }]
        );
        let won = record(c.me().broker.0, 1, OwnerState::Active, 1);
        let actions = c.step(
            now,
            Event::ClaimFinished {
                resource: resource.into(),
                result: Ok(won.clone()),
            },
        );
        assert_eq!(
            actions,
            [Action::Serve {
                resource: resource.into(),
                epoch: Epoch(1)
            }]
        );
        won
    }

    #[test]
    fn claims_an_unowned_resource_placed_on_it_once_observed_and_serves_after_winning() {
        let r = placed_on(1, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&r]);
        // Nothing is done on a record never read: it might exist.
        assert!(c.step(ms(0), Event::Tick).is_empty());
        assert_eq!(c.wants_observation(ms(0)), std::slice::from_ref(&r));
        serve_fresh(&mut c, &r, ms(10));
        assert_eq!(c.serving(), BTreeMap::from([(r.clone(), Epoch(1))]));
        // Steady state: nothing more to do.
        assert!(c.step(ms(20), Event::Tick).is_empty());
        assert!(c
            .step(
                ms(30),
                observed(&r, Some(record(1, 1, OwnerState::Active, 1)))
            )
            .is_empty());
    }

    #[test]
    fn at_most_one_claim_per_resource_is_in_flight() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        assert_eq!(c.step(ms(0), observed(&r, None)).len(), 1);
        assert!(c.step(ms(1), Event::Tick).is_empty());
        assert!(c.step(ms(2), observed(&r, None)).is_empty());
        assert!(c.step(ms(3), Event::View(view(ms(3), &[1]))).is_empty());
    }

    #[test]
    fn leaves_alone_what_is_placed_elsewhere() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&r]);
        assert!(c.wants_observation(ms(0)).is_empty());
        assert!(c.step(ms(0), observed(&r, None)).is_empty());
        let dead_owner = record(3, 4, OwnerState::Active, 9);
        assert!(c.step(ms(0), observed(&r, Some(dead_owner))).is_empty());
    }

    #[test]
    fn never_claims_from_a_live_owner_but_takes_a_released_one_without_fencing() {
        let r = placed_on(1, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&r]);
        let held_by_2 = record(2, 3, OwnerState::Active, 7);
        assert!(c.step(ms(0), observed(&r, Some(held_by_2))).is_empty());
        let released = record(2, 3, OwnerState::Released, 8);
        assert_eq!(
            c.step(ms(1), observed(&r, Some(released.clone()))),
            [Action::Claim {
                resource: r.clone(),
                expected: Some(released)
            }]
        );
    }

    #[test]
    fn awaits_a_handover_only_from_a_live_owner_of_what_is_placed_on_it() {
        let r = placed_on(1, &[1, 2]);
        let elsewhere = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&r, &elsewhere]);
        // Unknown records are for the full round, not the fast path.
        assert!(c.awaiting_handover(ms(0)).is_empty());
        let held_by_2 = record(2, 3, OwnerState::Active, 7);
        c.step(ms(0), observed(&r, Some(held_by_2.clone())));
        c.step(ms(0), observed(&elsewhere, Some(held_by_2)));
        assert_eq!(c.awaiting_handover(ms(0)), std::slice::from_ref(&r));
        // A record of an incarnation our view does not know is a dead owner's: fenced by the
        // full round, never awaited.
        let (version, mut stale) = record(2, 3, OwnerState::Active, 7);
        stale.incarnation = Incarnation(1);
        let mut d = controller(1, &[1, 2], &[&r]);
        d.apply(ms(0), observed(&r, Some((version, stale))));
        assert!(d.awaiting_handover(ms(0)).is_empty());
        // Released: claimed at once, and no longer awaited.
        let released = record(2, 3, OwnerState::Released, 8);
        assert_eq!(c.step(ms(3), observed(&r, Some(released))).len(), 1);
        assert!(c.awaiting_handover(ms(3)).is_empty());
    }

    /// The move watch asks every few milliseconds; the decisions note which slots could be
    /// awaited so it need not scan them all. It must answer as the scan would, after every
    /// kind of step, including an event applied without a decision.
    #[test]
    fn the_awaited_handovers_noted_by_decisions_are_those_a_scan_finds() {
        let names: Vec<String> = (0..40).map(|i| format!("t/{i}")).collect();
        let refs: Vec<&String> = names.iter().collect();
        let mut c = controller(1, &[1, 2], &refs);
        let scanned = |c: &OwnershipController, now| {
            let mut scan = c.clone();
            scan.awaited_note = None;
            scan.awaiting_handover(now)
        };
        let mut awaited_somewhere = false;
        for (i, name) in names.iter().enumerate() {
            let held = match i % 4 {
                0 => record(2, 3, OwnerState::Active, 7),
                1 => record(2, 3, OwnerState::Released, 7),
                2 => record(1, 1, OwnerState::Active, 7),
                _ => record(3, 4, OwnerState::Active, 7),
            };
            c.step(ms(i as u64), observed(name, Some(held)));
            let now = ms(i as u64);
            assert_eq!(c.awaiting_handover(now), scanned(&c, now), "after {name}");
            awaited_somewhere |= !c.awaiting_handover(now).is_empty();
        }
        assert!(awaited_somewhere, "some record is awaited from broker 2");
        // Broker 2 leaves the view: nothing is awaited from it any more.
        let mut view = c.view.clone();
        view.members.remove(&BrokerId(2));
        c.apply(ms(50), Event::View(view));
        assert_eq!(c.awaiting_handover(ms(50)), scanned(&c, ms(50)));
        c.step(ms(51), Event::Tick);
        assert!(c.awaiting_handover(ms(51)).is_empty());
        assert_eq!(c.awaiting_handover(ms(51)), scanned(&c, ms(51)));
    }

    /// The note leaves out what is placed elsewhere, and placement can change with time alone:
    /// while no member has settled in every member is a candidate, and once one has, only it
    /// is. A partition broker 2 holds then becomes ours with no event between, and the watch
    /// must see that without waiting for the next decision.
    #[test]
    fn a_handover_that_time_alone_makes_ours_is_awaited_without_a_decision() {
        let r = placed_on(2, &[1, 2]);
        let mut c = settling_controller(1);
        let mut joined = view(ms(1_500), &[1]);
        joined.members.extend([member(2, false, ms(1_000))]);
        c.step(ms(1_500), Event::View(joined));
        c.step(ms(1_500), resources(&[&r]));
        let held_by_2 = record(2, 3, OwnerState::Active, 7);
        assert!(c.step(ms(1_500), observed(&r, Some(held_by_2))).is_empty());
        assert!(
            c.awaiting_handover(ms(1_500)).is_empty(),
            "placed on 2 among both"
        );
        // At 2.5 s broker 1 has settled in and broker 2 (live since 1 s) has not.
        assert_eq!(c.awaiting_handover(ms(2_500)), std::slice::from_ref(&r));
    }

    #[test]
    fn fences_a_dead_owner_before_claiming() {
        let r = placed_on(1, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&r]);
        let held_by_dead = record(3, 4, OwnerState::Active, 9);
        assert_eq!(
            c.step(ms(0), observed(&r, Some(held_by_dead.clone()))),
            [Action::FenceThenClaim {
                resource: r.clone(),
                dead_owner: BrokerId(3),
                dead_stream: Some(3),
                expected: held_by_dead
            }]
        );
    }

    #[test]
    fn a_dead_owner_is_fenced_after_the_grace_but_our_own_predecessor_at_once() {
        let grace = ControllerConfig {
            dead_owner_grace: ms(2000),
            ..config()
        };
        let r = placed_on(1, &[1]);
        let start = |c: &mut OwnershipController| {
            assert!(c.step(ms(0), Event::View(view(ms(0), &[1]))).is_empty());
            assert!(c.step(ms(0), resources(&[&r])).is_empty());
        };
        // Another broker's record, absent from our view: maybe a newcomer we have not listed
        // yet, so it must stay absent for the grace.
        let mut c = OwnershipController::new(claimant(1), grace);
        start(&mut c);
        let other = record(3, 4, OwnerState::Active, 9);
        assert!(c.step(ms(0), observed(&r, Some(other.clone()))).is_empty());
        assert!(c
            .step(ms(1999), Event::View(view(ms(1999), &[1])))
            .is_empty());
        // The grace counts listings, not time: deciding on a view listed before it ran out
        // (a long run of actions between rounds) waits, however late it is.
        assert!(c
            .step(ms(5000), observed(&r, Some(other.clone())))
            .is_empty());
        assert!(matches!(
            &c.step(ms(5000), Event::View(view(ms(2000), &[1])))[..],
            [Action::FenceThenClaim {
                dead_owner: BrokerId(3),
                ..
            }]
        ));
        // An earlier incarnation of our own id: we hold the id, so it is dead now.
        let mut c = OwnershipController::new(claimant(1), grace);
        start(&mut c);
        let (version, mut old) = record(1, 2, OwnerState::Active, 5);
        old.incarnation = Incarnation(7);
        assert!(matches!(
            &c.step(ms(0), observed(&r, Some((version, old))))[..],
            [Action::FenceThenClaim {
                dead_owner: BrokerId(1),
                ..
            }]
        ));
    }

    #[test]
    fn an_owner_seen_live_then_gone_is_fenced_without_the_grace() {
        let grace = ControllerConfig {
            dead_owner_grace: ms(2000),
            ..config()
        };
        let r = placed_on(1, &[1]);
        let held_by_3 = record(3, 4, OwnerState::Active, 9);
        // Our view had broker 3 live, then lost it (its lease lapsed by our clock).
        let gone = |incarnation: Incarnation| {
            let mut v = view(ms(0), &[1]);
            let (_, mut m) = member(3, false, Duration::ZERO);
            m.registration.incarnation = incarnation;
            v.departed.insert(
                BrokerId(3),
                crate::membership::Departed {
                    registration: m.registration,
                    since: ms(0),
                },
            );
            v
        };
        let mut c = OwnershipController::new(claimant(1), grace);
        assert!(c
            .step(ms(0), Event::View(gone(claimant(3).incarnation)))
            .is_empty());
        assert!(c.step(ms(0), resources(&[&r])).is_empty());
        assert!(matches!(
            &c.step(ms(0), observed(&r, Some(held_by_3.clone())))[..],
            [Action::FenceThenClaim {
                dead_owner: BrokerId(3),
                ..
            }]
        ));
        // Another incarnation of broker 3 went: the record's may be a newcomer's, so the
        // grace still applies to it.
        let mut c = OwnershipController::new(claimant(1), grace);
        assert!(c.step(ms(0), Event::View(gone(Incarnation(1)))).is_empty());
        assert!(c.step(ms(0), resources(&[&r])).is_empty());
        assert!(c
            .step(ms(1999), observed(&r, Some(held_by_3.clone())))
            .is_empty());
    }

    #[test]
    fn an_earlier_incarnation_of_itself_is_a_dead_owner_to_fence() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        let (version, mut old) = record(1, 2, OwnerState::Active, 5);
        old.incarnation = Incarnation(7);
        old.stream = Some(77);
        let actions = c.step(ms(0), observed(&r, Some((version, old))));
        assert!(
            matches!(
                &actions[..],
                [Action::FenceThenClaim {
                    dead_owner: BrokerId(1),
                    dead_stream: Some(77),
                    ..
                }]
            ),
            "{actions:?}"
        );
    }

    #[test]
    fn hands_over_when_placement_moves_and_releases_only_after_the_handover() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1], &[&r]);
        let held = serve_fresh(&mut c, &r, ms(0));
        // Broker 2 joins and outweighs us for r.
        assert_eq!(
            c.step(ms(100), Event::View(view(ms(100), &[1, 2]))),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Handover
            }]
        );
        assert!(c.serving().is_empty());
        assert!(!c.holds_nothing());
        // Nothing is released while the host flushes.
        assert!(c.step(ms(150), Event::Tick).is_empty());
        assert_eq!(
            c.step(
                ms(200),
                Event::HandoverFinished {
                    resource: r.clone(),
                    ok: true
                }
            ),
            [Action::Release {
                resource: r.clone(),
                current: held
            }]
        );
        assert!(c.step(ms(210), Event::Tick).is_empty());
        let released = record(1, 1, OwnerState::Released, 2);
        assert!(c
            .step(
                ms(250),
                Event::ReleaseFinished {
                    resource: r.clone(),
                    result: Ok(released)
                }
            )
            .is_empty());
        assert!(c.holds_nothing());
    }

    #[test]
    fn without_auto_rebalance_a_joining_broker_takes_nothing_but_a_dead_owner_is_replaced() {
        let sticky = ControllerConfig {
            auto_rebalance: false,
            ..config()
        };
        let r = placed_on(2, &[1, 2]);
        let start = |me: i32, live: &[i32]| {
            let mut c = OwnershipController::new(claimant(me), sticky);
            assert!(c.step(ms(0), Event::View(view(ms(0), live))).is_empty());
            assert!(c.step(ms(0), resources(&[&r])).is_empty());
            c
        };
        // Broker 1 holds r; broker 2 joins and hashing would pick it: 1 keeps serving.
        let mut one = start(1, &[1]);
        serve_fresh(&mut one, &r, ms(0));
        assert!(one
            .step(ms(100), Event::View(view(ms(100), &[1, 2])))
            .is_empty());
        assert_eq!(one.serving().len(), 1);
        // Broker 2 sees 1's live record and does not claim or await a handover.
        let mut two = start(2, &[1, 2]);
        let held = record(1, 1, OwnerState::Active, 2);
        assert!(two.wants_observation(ms(0)).contains(&r));
        assert!(two.step(ms(0), observed(&r, Some(held.clone()))).is_empty());
        assert!(two.awaiting_handover(ms(0)).is_empty());
        // An explicit move still moves it.
        assert!(matches!(
            &one.step(
                ms(200),
                Event::Overrides(BTreeMap::from([(r.clone(), BrokerId(2))]))
            )[..],
            [Action::StopServing {
                reason: StopReason::Handover,
                ..
            }]
        ));
        // And when the owner dies, hashing's choice takes over.
        assert!(two
            .step(ms(300), Event::View(view(ms(300), &[2])))
            .iter()
            .any(|a| matches!(
                a,
                Action::FenceThenClaim {
                    dead_owner: BrokerId(1),
                    ..
                }
            )));
    }

    #[test]
    fn a_failed_handover_is_retried_and_never_released_blindly() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        assert_eq!(
            c.step(ms(100), Event::View(view(ms(100), &[1, 2]))).len(),
            1
        );
        let actions = c.step(
            ms(200),
            Event::HandoverFinished {
                resource: r.clone(),
                ok: false,
            },
        );
        assert!(actions.is_empty(), "{actions:?}");
        // After the back-off the handover is tried again (not a release).
        let actions = c.step(ms(10_000), Event::View(view(ms(10_000), &[1, 2])));
        assert_eq!(
            actions,
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Handover
            }]
        );
    }

    #[test]
    fn placement_coming_back_during_a_handover_serves_again_without_releasing() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        c.step(ms(100), Event::View(view(ms(100), &[1, 2])));
        c.step(ms(150), Event::View(view(ms(150), &[1])));
        assert_eq!(
            c.step(
                ms(200),
                Event::HandoverFinished {
                    resource: r.clone(),
                    ok: true
                }
            ),
            [Action::Serve {
                resource: r.clone(),
                epoch: Epoch(1)
            }]
        );
    }

    #[test]
    fn stops_serving_when_somebody_else_took_the_record() {
        let r = placed_on(1, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        let stolen = record(2, 2, OwnerState::Active, 5);
        assert_eq!(
            c.step(ms(10), observed(&r, Some(stolen))),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Lost
            }]
        );
        // …and does not try to take it back from the live thief.
        assert!(c.step(ms(10_000), Event::Tick).is_empty());
    }

    #[test]
    fn an_older_observation_never_overrides_a_newer_record() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        let older = record(2, 1, OwnerState::Released, 3);
        c.step(ms(0), observed(&r, Some(older.clone())));
        let mine = record(1, 2, OwnerState::Active, 4);
        c.step(
            ms(1),
            Event::ClaimFinished {
                resource: r.clone(),
                result: Ok(mine),
            },
        );
        assert!(c.step(ms(2), observed(&r, Some(older))).is_empty());
        assert_eq!(c.serving(), BTreeMap::from([(r.clone(), Epoch(2))]));
    }

    #[test]
    fn backs_off_after_a_lost_race_and_acts_only_on_a_fresh_observation() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        c.step(ms(0), observed(&r, None));
        let actions = c.step(
            ms(10),
            Event::ClaimFinished {
                resource: r.clone(),
                result: Err(Failure::Lost),
            },
        );
        assert!(actions.is_empty());
        // Within the back-off nothing happens even with a fresh observation.
        assert!(c.step(ms(20), observed(&r, None)).is_empty());
        // Past the back-off it tries once more, from what it has read since.
        assert_eq!(c.step(ms(1_000), Event::Tick).len(), 1);

        // Without a fresh observation, nothing happens however long it waits.
        let mut c2 = controller(1, &[1], &[&r]);
        c2.step(ms(0), observed(&r, None));
        c2.step(
            ms(10),
            Event::ClaimFinished {
                resource: r.clone(),
                result: Err(Failure::Lost),
            },
        );
        assert!(
            c2.step(ms(1_000), Event::Tick).is_empty(),
            "needs a fresh observation"
        );
        assert_eq!(c2.step(ms(1_001), observed(&r, None)).len(), 1);
    }

    #[test]
    fn back_off_grows_and_differs_between_brokers() {
        let r = "t/0";
        let lose = |me: i32, times: u32| {
            let mut c = controller(me, &[me], &[&r.to_string()]);
            let mut retry = Duration::ZERO;
            let mut waited = Duration::ZERO;
            for _ in 0..times {
                let now = retry;
                let claimed = c.step(now, observed(r, None));
                assert_eq!(claimed.len(), 1, "{claimed:?}");
                c.step(
                    now,
                    Event::ClaimFinished {
                        resource: r.into(),
                        result: Err(Failure::Lost),
                    },
                );
                retry = c.slots[r].retry_at;
                assert!(retry > now);
                waited = retry - now;
            }
            waited
        };
        let one = lose(1, 1);
        let three = lose(1, 3);
        assert!(three > one);
        assert_ne!(
            lose(1, 1),
            lose(2, 1),
            "deterministic jitter should differ per broker"
        );
    }

    #[test]
    fn an_ambiguous_claim_that_landed_is_adopted_after_observing_it() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        c.step(ms(0), observed(&r, None));
        c.step(
            ms(10),
            Event::ClaimFinished {
                resource: r.clone(),
                result: Err(Failure::Retryable),
            },
        );
        let landed = record(1, 1, OwnerState::Active, 1);
        c.step(ms(10_000), Event::View(view(ms(10_000), &[1])));
        assert_eq!(
            c.step(ms(10_000), observed(&r, Some(landed))),
            [Action::Serve {
                resource: r.clone(),
                epoch: Epoch(1)
            }]
        );
    }

    /// Regression (simulation seed 119): a claim reported failed had landed; the resource was
    /// not placed on the claimer, so it never re-read the record, never learned it held it and
    /// never handed it over, while the placement target waited for that "live owner" forever.
    #[test]
    fn a_claim_with_an_unknown_outcome_is_observed_until_known_even_if_placed_elsewhere() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1], &[&r]);
        c.step(ms(0), observed(&r, None));
        c.step(
            ms(10),
            Event::ClaimFinished {
                resource: r.clone(),
                result: Err(Failure::Retryable),
            },
        );
        c.step(ms(20), Event::View(view(ms(20), &[1, 2])));
        assert_eq!(c.wants_observation(ms(20)), std::slice::from_ref(&r));
        c.step(ms(2_000), Event::View(view(ms(2_000), &[1, 2])));
        let landed = record(1, 1, OwnerState::Active, 1);
        assert_eq!(
            c.step(ms(2_001), observed(&r, Some(landed))),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Handover
            }]
        );
    }

    #[test]
    fn a_draining_broker_gets_nothing_and_hands_everything_off() {
        let on_1 = placed_on(1, &[1, 2]);
        let on_2 = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&on_1, &on_2]);
        serve_fresh(&mut c, &on_1, ms(0));
        // Broker 1 drains: everything is placed on 2.
        let actions = c.step(ms(10), Event::View(view(ms(10), &[-1, 2])));
        assert_eq!(
            actions,
            [Action::StopServing {
                resource: on_1.clone(),
                reason: StopReason::Handover
            }]
        );
        // A draining broker claims nothing either.
        assert!(c.step(ms(20), observed(&on_2, None)).is_empty());
        // Alone and draining, it keeps serving: there is nobody to hand over to.
        let mut alone = controller(1, &[1], &[&on_1]);
        serve_fresh(&mut alone, &on_1, ms(0));
        assert!(alone
            .step(ms(10), Event::View(view(ms(10), &[-1])))
            .is_empty());
        assert_eq!(alone.serving().len(), 1);
    }

    #[test]
    fn a_draining_broker_is_no_placement_target() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1, -2], &[&r]);
        assert_eq!(
            c.step(ms(0), observed(&r, None)).len(),
            1,
            "r falls to broker 1"
        );
    }

    #[test]
    fn an_override_wins_while_its_target_is_live_and_is_ignored_otherwise() {
        let r = placed_on(1, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        // Override to a dead broker: ignored.
        let to_3 = BTreeMap::from([(r.clone(), BrokerId(3))]);
        assert!(c.step(ms(10), Event::Overrides(to_3)).is_empty());
        // Override to live broker 2: hand over.
        let to_2 = BTreeMap::from([(r.clone(), BrokerId(2))]);
        assert_eq!(
            c.step(ms(20), Event::Overrides(to_2)),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Handover
            }]
        );
    }

    #[test]
    fn a_returning_broker_gets_resources_back_only_after_it_settled() {
        let r = placed_on(2, &[1, 2]);
        let mut c = settling_controller(1);
        c.step(ms(0), Event::View(view(ms(0), &[1])));
        c.step(ms(0), resources(&[&r]));
        serve_fresh(&mut c, &r, ms(0));
        // Broker 2 comes back at t = 10 s (for the third time today).
        let mut back = view(ms(10_000), &[1]);
        back.members.extend([member(2, false, ms(10_000))]);
        assert!(c.step(ms(10_000), Event::View(back.clone())).is_empty());
        assert!(c.step(ms(11_000), Event::Tick).is_empty());
        back.self_lease_until = Some(ms(20_000));
        c.step(ms(11_500), Event::View(back));
        assert_eq!(
            c.step(ms(12_000), Event::Tick),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Handover
            }]
        );
    }

    #[test]
    fn stops_serving_before_its_own_lease_can_lapse_and_resumes_after_a_heartbeat() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        // The view says our lease runs until 5 s; with a 1 s margin we stop at 4 s.
        assert!(c.step(ms(3_900), Event::Tick).is_empty());
        assert_eq!(
            c.step(ms(4_000), Event::Tick),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::SelfLeaseExpired
            }]
        );
        // Claims are held back too; once a heartbeat lands, the record is read again (it may
        // have been taken while we could have been judged dead) before we serve again.
        assert!(c
            .step(ms(4_500), Event::View(view(ms(4_500), &[1])))
            .is_empty());
        let still_ours = record(1, 1, OwnerState::Active, 1);
        assert_eq!(
            c.step(ms(4_600), observed(&r, Some(still_ours))),
            [Action::Serve {
                resource: r.clone(),
                epoch: Epoch(1)
            }]
        );
    }

    #[test]
    fn fenced_stops_everything_and_never_claims_or_releases_again() {
        let on_1 = placed_on(1, &[1, 2]);
        let on_2 = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1, 2], &[&on_1, &on_2]);
        serve_fresh(&mut c, &on_1, ms(0));
        assert_eq!(
            c.step(ms(10), Event::SelfFenced),
            [Action::StopServing {
                resource: on_1.clone(),
                reason: StopReason::Fenced
            }]
        );
        assert!(c.is_fenced());
        assert!(c.step(ms(20), observed(&on_1, None)).is_empty());
        assert!(c.step(ms(20_000), Event::Tick).is_empty());
    }

    #[test]
    fn a_lost_registration_counts_as_fenced() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        let mut lost = view(ms(10), &[1]);
        lost.registration_lost = true;
        assert_eq!(
            c.step(ms(10), Event::View(lost)),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Fenced
            }]
        );
    }

    #[test]
    fn a_removed_resource_is_stopped_and_forgotten() {
        let r = placed_on(1, &[1]);
        let mut c = controller(1, &[1], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        assert_eq!(
            c.step(ms(10), Event::Resources(BTreeSet::new())),
            [Action::StopServing {
                resource: r.clone(),
                reason: StopReason::Removed
            }]
        );
        assert!(c.slots.is_empty());
    }

    #[test]
    fn a_lost_release_means_somebody_fenced_us() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1], &[&r]);
        serve_fresh(&mut c, &r, ms(0));
        c.step(ms(10), Event::View(view(ms(10), &[1, 2])));
        c.step(
            ms(20),
            Event::HandoverFinished {
                resource: r.clone(),
                ok: true,
            },
        );
        assert!(c
            .step(
                ms(30),
                Event::ReleaseFinished {
                    resource: r.clone(),
                    result: Err(Failure::Lost)
                }
            )
            .is_empty());
        let taken = record(2, 2, OwnerState::Active, 9);
        assert!(c.step(ms(10_000), observed(&r, Some(taken))).is_empty());
        assert!(c.holds_nothing());
    }

    #[test]
    fn a_failed_release_is_retried_from_a_fresh_observation() {
        let r = placed_on(2, &[1, 2]);
        let mut c = controller(1, &[1], &[&r]);
        let held = serve_fresh(&mut c, &r, ms(0));
        c.step(ms(10), Event::View(view(ms(10), &[1, 2])));
        c.step(
            ms(20),
            Event::HandoverFinished {
                resource: r.clone(),
                ok: true,
            },
        );
        c.step(
            ms(30),
            Event::ReleaseFinished {
                resource: r.clone(),
                result: Err(Failure::Retryable),
            },
        );
        c.step(ms(10_000), Event::View(view(ms(10_000), &[1, 2])));
        assert_eq!(
            c.step(ms(10_001), observed(&r, Some(held.clone()))),
            [Action::Release {
                resource: r.clone(),
                current: held
            }]
        );
    }

    /// A pure model of the ownership objects: compare-and-swap semantics, no runtime.
    #[derive(Default)]
    struct Records {
        records: BTreeMap<String, VersionedRecord>,
        next_version: u64,
        sealed: BTreeSet<u32>,
    }

    impl Records {
        fn cas(
            &mut self,
            resource: &str,
            expected: Option<&VersionedRecord>,
            new: OwnerRecord,
        ) -> Result<VersionedRecord, Failure> {
            let current = self.records.get(resource);
            if current.map(|(v, _)| v) != expected.map(|(v, _)| v) {
                return Err(Failure::Lost);
            }
            if let Some((_, old)) = current {
                assert!(
                    new.progress() > old.progress(),
                    "epochs must only move forward"
                );
            }
            self.next_version += 1;
            let versioned = (Version(self.next_version.to_string()), new);
            self.records.insert(resource.to_string(), versioned.clone());
            Ok(versioned)
        }
    }

    /// Several controllers over one model; each `round` lets every broker observe and act.
    struct Cluster {
        brokers: BTreeMap<i32, OwnershipController>,
        serving: BTreeMap<i32, BTreeMap<String, Epoch>>,
        records: Records,
        live: Vec<i32>,
        now: Duration,
    }

    impl Cluster {
        fn new(ids: &[i32], names: &[String]) -> Self {
            let refs: Vec<&String> = names.iter().collect();
            Self {
                brokers: ids
                    .iter()
                    .map(|b| (*b, controller(*b, ids, &refs)))
                    .collect(),
                serving: ids.iter().map(|b| (*b, BTreeMap::new())).collect(),
                records: Records::default(),
                live: ids.to_vec(),
                now: Duration::ZERO,
            }
        }

        fn round(&mut self) {
            self.now += ms(500);
            let ids: Vec<i32> = self.brokers.keys().copied().collect();
            for id in ids {
                if !self.live.iter().any(|l| l.abs() == id) {
                    continue; // dead brokers do nothing
                }
                let now = self.now;
                let v = view(now, &self.live);
                let c = self.brokers.get_mut(&id).unwrap();
                // First in, first out, as the runner carries actions out.
                let mut queue: std::collections::VecDeque<Action> =
                    c.step(now, Event::View(v)).into();
                for r in c.wants_observation(now) {
                    let record = self.records.records.get(&r).cloned();
                    queue.extend(c.step(now, observed(&r, record)));
                }
                while let Some(action) = queue.pop_front() {
                    let me = c.me().clone();
                    let serving = self.serving.get_mut(&id).unwrap();
                    let event = match action {
                        Action::Claim { resource, expected } => {
                            let epoch = expected.as_ref().map_or(1, |(_, r)| r.epoch.0 + 1);
                            let new = OwnerRecord {
                                owner: me.broker,
                                incarnation: me.incarnation,
                                epoch: Epoch(epoch),
                                state: OwnerState::Active,
                                stream: me.stream,
                            };
                            let result = self.records.cas(&resource, expected.as_ref(), new);
                            Some(Event::ClaimFinished { resource, result })
                        }
                        Action::FenceThenClaim {
                            resource,
                            dead_stream,
                            expected,
                            ..
                        } => {
                            self.records.sealed.extend(dead_stream);
                            let new = OwnerRecord {
                                owner: me.broker,
                                incarnation: me.incarnation,
                                epoch: Epoch(expected.1.epoch.0 + 1),
                                state: OwnerState::Active,
                                stream: me.stream,
                            };
                            let result = self.records.cas(&resource, Some(&expected), new);
                            Some(Event::ClaimFinished { resource, result })
                        }
                        Action::Release { resource, current } => {
                            let new = OwnerRecord {
                                state: OwnerState::Released,
                                ..current.1.clone()
                            };
                            let result = self.records.cas(&resource, Some(&current), new);
                            Some(Event::ReleaseFinished { resource, result })
                        }
                        Action::Serve { resource, epoch } => {
                            serving.insert(resource, epoch);
                            None
                        }
                        Action::StopServing { resource, reason } => {
                            serving.remove(&resource);
                            (reason == StopReason::Handover)
                                .then_some(Event::HandoverFinished { resource, ok: true })
                        }
                    };
                    if let Some(event) = event {
                        queue.extend(c.step(now, event));
                    }
                }
            }
            self.check();
        }

        fn rounds(&mut self, n: usize) {
            for _ in 0..n {
                self.round();
            }
        }

        /// At most one broker serves a resource at any epoch, and only at the record's epoch
        /// unless it is dead (a dead broker's beliefs are stale until it is fenced).
        fn check(&self) {
            let mut seen: BTreeMap<(&String, Epoch), i32> = BTreeMap::new();
            for (b, serving) in &self.serving {
                for (r, e) in serving {
                    if let Some(other) = seen.insert((r, *e), *b) {
                        panic!("{r} served at epoch {e} by {other} and {b}");
                    }
                }
            }
        }

        /// Who serves each resource (the live ones only).
        fn owners(&self) -> BTreeMap<String, i32> {
            let mut owners = BTreeMap::new();
            for (b, serving) in &self.serving {
                if !self.live.iter().any(|l| l.abs() == *b) {
                    continue;
                }
                for r in serving.keys() {
                    assert!(owners.insert(r.clone(), *b).is_none(), "{r} served twice");
                }
            }
            owners
        }

        fn expected(&self, names: &[String]) -> BTreeMap<String, i32> {
            let candidates: BTreeSet<BrokerId> = self
                .live
                .iter()
                .filter(|b| **b > 0)
                .map(|b| BrokerId(*b))
                .collect();
            names
                .iter()
                .map(|r| {
                    (
                        r.clone(),
                        place(r, &candidates, &BTreeMap::new()).unwrap().0,
                    )
                })
                .collect()
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("topic/{i}")).collect()
    }

    #[test]
    fn a_cluster_converges_to_placement_through_join_death_and_drain() {
        let rs = names(40);
        let mut cluster = Cluster::new(&[1, 2, 3], &rs);
        cluster.rounds(5);
        assert_eq!(cluster.owners(), cluster.expected(&rs), "initial placement");

        // Broker 4 joins: only what it now outweighs moves, gracefully (Released, no fence).
        cluster.live = vec![1, 2, 3, 4];
        cluster.brokers.insert(
            4,
            controller(4, &[1, 2, 3, 4], &rs.iter().collect::<Vec<_>>()),
        );
        cluster.serving.insert(4, BTreeMap::new());
        cluster.rounds(5);
        assert_eq!(cluster.owners(), cluster.expected(&rs), "after join");
        assert!(cluster.records.sealed.is_empty(), "a join fences nobody");

        // Broker 2 dies (its lease lapsed in everybody's view): its resources are fenced over.
        cluster.live = vec![1, 3, 4];
        cluster.rounds(5);
        assert_eq!(cluster.owners(), cluster.expected(&rs), "after death");
        assert_eq!(cluster.records.sealed, BTreeSet::from([2]));

        // Broker 3 drains: it ends up holding nothing, all released cleanly.
        cluster.live = vec![1, -3, 4];
        cluster.rounds(5);
        assert_eq!(cluster.owners(), cluster.expected(&rs), "after drain");
        assert!(cluster.brokers[&3].holds_nothing());
        assert_eq!(
            cluster.records.sealed,
            BTreeSet::from([2]),
            "draining fences nobody"
        );
    }

    #[test]
    fn two_brokers_racing_for_one_resource_end_with_exactly_one_owner() {
        let r = placed_on(1, &[1, 2]);
        // Split brain in placement: each sees only itself, so both want r.
        let mut a = controller(1, &[1], &[&r]);
        let mut b = controller(2, &[2], &[&r]);
        let mut records = Records::default();
        let claim_a = a.step(ms(0), observed(&r, None));
        let claim_b = b.step(ms(0), observed(&r, None));
        let run = |c: &mut OwnershipController, action: &Action, records: &mut Records| {
            let Action::Claim { resource, expected } = action else {
                panic!("{action:?}")
            };
            let me = c.me().clone();
            let new = OwnerRecord {
                owner: me.broker,
                incarnation: me.incarnation,
                epoch: Epoch(1),
                state: OwnerState::Active,
                stream: me.stream,
            };
            let result = records.cas(resource, expected.as_ref(), new);
            c.step(
                ms(1),
                Event::ClaimFinished {
                    resource: resource.clone(),
                    result,
                },
            )
        };
        let after_a = run(&mut a, &claim_a[0], &mut records);
        let after_b = run(&mut b, &claim_b[0], &mut records);
        assert_eq!(
            after_a,
            [Action::Serve {
                resource: r.clone(),
                epoch: Epoch(1)
            }]
        );
        assert!(after_b.is_empty(), "the loser backs off: {after_b:?}");
        // Views converge: both see both; the loser sees a live owner and never steals.
        for c in [&mut a, &mut b] {
            c.step(ms(20_000), Event::View(view(ms(20_000), &[1, 2])));
        }
        let current = records.records.get(&r).cloned();
        let actions_b = b.step(ms(20_001), observed(&r, current.clone()));
        assert!(
            actions_b
                .iter()
                .all(|x| !matches!(x, Action::Claim { .. } | Action::FenceThenClaim { .. })),
            "{actions_b:?}"
        );
        assert_eq!(a.serving().len() + b.serving().len(), 1);
    }

    #[test]
    fn a_flapping_broker_is_fenced_once_and_then_gets_its_share_back_cleanly() {
        let rs = names(30);
        let mut cluster = Cluster::new(&[1, 2, 3], &rs);
        cluster.rounds(4);
        for _ in 0..3 {
            cluster.live = vec![1, 2];
            cluster.rounds(3);
            assert_eq!(cluster.owners(), cluster.expected(&rs));
            cluster.live = vec![1, 2, 3];
            cluster.rounds(3);
        }
        // Broker 3's stream was sealed the first time it was judged dead; its old incarnation
        // would restart in reality, here it keeps its stream, so only 3 is ever sealed.
        assert_eq!(cluster.records.sealed, BTreeSet::from([3]));
        assert_eq!(cluster.owners(), cluster.expected(&rs));
    }
}
