//! Cluster mode: this broker as one member of a cluster of brokers sharing one storage, with
//! no coordination service beside them (see `strata-cluster` for how).
//!
//! A [`ClusterNode`] joins the membership, runs the ownership runner over a [`ResourceHost`]
//! backed by the log and the group coordinator, and keeps what the Kafka handlers need to
//! answer cluster questions: the live brokers (Metadata, DescribeCluster), who leads each
//! partition (a cached copy of every ownership record, refreshed on a timer, so Metadata never
//! waits for storage; a refresh lists the records and reads only those whose change tag moved),
//! and placement overrides (partition reassignments).
//!
//! Resources are partitions named `<topic-id-hex>/<partition>`: ids, not names, so a topic
//! deleted and re-created under the same name never inherits the old one's records.
//! The partitions of `__consumer_offsets` are the consumer-group shards: acquiring one loads
//! the shard (replay), handing it over unloads it first.
//!
//! # When this broker must die
//!
//! If another broker seals our write-ahead stream (it judged us dead, e.g. after a long pause)
//! or takes our registration over, nothing this process writes can be acknowledged any more.
//! The node then stops serving everything and [`ClusterNode::fatal`] completes; the server
//! exits non-zero so its supervisor restarts it as a new incarnation with a new stream. Trying
//! to carry on in-process would mean re-opening the log under a new stream while requests are
//! in flight on the old one; a restart is simpler and obviously correct.
//!
//! # Draining
//!
//! The registration object is written only by its owner, so an operator (`strata broker
//! drain`) cannot set the draining flag there. Instead it writes `cluster/drain/<id>` naming the
//! incarnation it saw registered; that broker polls the object and marks itself draining, and
//! placement moves every partition away. A restarted broker is a new incarnation and ignores a
//! request left over for its predecessor (`strata_cluster::admin` writes and reads it).

//!
//! The module's parts: `node` (joining, the lifecycle, the owner cache and the watchdog that
//! decides when this broker must die), `host` (the [`ResourceHost`] that turns ownership
//! decisions into the log's acquire/release and the coordinator's shard loads), `stats` (the
//! figures `/metrics` reports).

mod host;
mod node;
mod stats;

#[cfg(test)]
pub(crate) use host::log_host;
pub use node::*;
pub use stats::{ClusterMetrics, OwnershipStats, OwnershipStatsSnapshot};
