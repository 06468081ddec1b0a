//! Coordination through storage alone: which brokers are alive, who owns each resource (a
//! partition, as far as the layers above care) and at which epoch, where each resource should
//! live, and how a dead owner is fenced. Brokers never talk to each other and there is no
//! coordination service: every decision rests on the storage's conditional writes (create-only
//! put, compare-and-swap on a version) and on each broker's own monotonic clock.
//!
//! This crate knows only [`strata_core`], [`strata_storage`] and [`strata_layout`] (where every
//! object it reads or writes is defined). It must never see a Kafka
//! wire type or the partition log: a resource is an opaque string, and everything that touches
//! data (recovering, flushing, checkpointing) is the [`ResourceHost`]'s job.
//!
//! # Modules
//!
//! - [`liveness`]: [`LivenessTracker`], pure: brokers are dead when their registration's
//!   version stayed still for a lease of the *observer's* clock.
//! - [`membership`]: registration, heartbeats, the [`ClusterView`], draining, leaving.
//! - [`node_ids`]: allocating a node id by create-only registration, for brokers started
//!   without one (a crashed predecessor's id on this machine first).
//! - [`ownership`]: [`OwnerRecord`]s changed only by compare-and-swap; placement overrides and
//!   the marker announcing their changes; reads through listings skip what did not change.
//! - [`placement`]: rendezvous hashing over live non-draining brokers, overrides first.
//! - [`controller`]: [`OwnershipController`], the sans-IO state machine deciding claims,
//!   fencing, handovers and releases.
//! - [`runner`]: [`OwnershipRunner`], the async plumbing that carries the decisions out.
//! - [`fence`]: sealing a write-ahead stream so a dead writer can never acknowledge again.
//! - [`process`]: proving through the operating system that a predecessor on the same machine
//!   is dead, so a restarted broker takes its id over without waiting a lease.
//! - [`keys`]: the keys of the objects under `cluster/` as `ObjectKey`s (the layout itself is
//!   `strata_layout`'s).
//! - [`admin`]: offline operator commands (move a partition, drain a broker) that need only
//!   the storage.
//!
//! Errors are [`ClusterError`], classified by [`ClusterError::is_retryable`] and
//! [`ClusterError::is_fenced`].
//!
//! # Integration (log and broker)
//!
//! Start-up: the log registers its write-ahead stream (`meta/streams/<id>`); the broker then
//! joins with [`Membership::join`] (a live broker with the same id makes it refuse with
//! `BrokerIdInUse`; a dead one's registration is taken over after a lease, or at once when
//! its process is provably gone from this machine), spawns it, and
//! spawns an [`OwnershipRunner`] whose [`Claimant`] carries the log's stream and whose
//! [`RunnerConfig::in_flight_window`] is the log's `max_inflight_flushes`.
//!
//! The [`ResourceHost`] the broker implements over the log:
//! - `start_serving(resource, epoch)`: load the manifest, replay write-ahead objects of every
//!   stream (a sealed stream only up to its seal), write the manifest by compare-and-swap with
//!   the new owner epoch *before* accepting appends (so a stale owner's compaction fails), then
//!   accept produce requests.
//! - `stop_serving(resource, Handover)`: answer NOT_LEADER_OR_FOLLOWER from now on, wait until
//!   everything queued is durable, checkpoint the manifest, return Ok. Other reasons: just stop.
//!
//! Graceful migration (a `move`, AlterPartitionReassignments):
//! [`Ownership::set_placement_override`]; the owner hands over (stop, flush, checkpoint), the
//! runner releases by compare-and-swap, the target sees `Released` and claims at epoch + 1
//! without fencing. Draining: [`MembershipHandle::set_draining`], wait for
//! [`OwnershipStatus::holds_nothing`], [`RunnerHandle::stop`], then [`MembershipHandle::leave`]
//! (a runner whose membership ends under it takes that as being fenced).
//!
//! Failover: a broker whose registration stays unchanged for a lease (of each observer's own
//! clock) is dead; the placement target seals the dead owner's stream ([`seal_stream`]), then
//! claims at epoch + 1 and serves, replaying the dead stream up to its seal.
//!
//! Contracts the log must keep for fencing to hold:
//! - its writer, finding its next object already present with other bytes (a seal), stops
//!   acknowledging and reports it; the broker then calls `self_fenced` on the runner, leaves
//!   and restarts as a new incarnation with a new stream;
//! - objects whose bytes start with [`fence::SEAL_MAGIC`] ([`is_seal`]) hold no data; a
//!   stream ends at its seal (objects above it were never acknowledged);
//! - it never deletes the highest-sequence object of a stream that may still be written,
//!   or a seal could land below the writer's next sequence number.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod admin;
pub mod controller;
mod error;
pub mod fence;
pub mod keys;
pub mod liveness;
pub mod membership;
pub mod node_ids;
pub mod ownership;
pub mod placement;
pub mod process;
pub mod runner;

#[cfg(test)]
mod poll_cost;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod testkit;

pub use controller::{Action, ControllerConfig, Event, Failure, OwnershipController, StopReason};
pub use error::{ClusterError, ClusterResult};
pub use fence::{
    find_end_seal, is_seal, parse_seal, seal_stream, seal_streams_of, streams_of_broker, SealInfo,
    SealKind, SealOptions, SealWhich,
};
pub use liveness::LivenessTracker;
pub use membership::{
    BrokerRegistration, ClusterView, Departed, Incarnation, JoinProgress, ListenerEndpoint,
    LocalBroker, Member, Membership, MembershipConfig, MembershipHandle, Renewal, RENEWALS_KEPT,
};
pub use node_ids::{
    join_with_allocated_id, Newcomer, FIRST_ALLOCATED_NODE_ID, MAX_CONFIGURED_NODE_ID,
};
pub use ownership::{Claimant, OwnerRecord, OwnerState, Ownership, VersionedRecord};
pub use placement::{assign, place, rendezvous_weight};
pub use process::{NoProcessTable, OsProcessTable, ProcessIdentity, ProcessTable};
pub use runner::{OwnershipRunner, OwnershipStatus, ResourceHost, RunnerConfig, RunnerHandle};
