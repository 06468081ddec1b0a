//! Consumer-group lag on `/metrics`: every `group_lag_interval` the broker computes, for the
//! groups it coordinates, how far each group's committed offset is behind the log end of each
//! partition it committed for, and `/metrics` reports the last result.
//!
//! The numbers are those of `strata group lag` and the console, from the same code: the broker
//! asks itself as a Kafka client (ListGroups to itself, OffsetFetch per group, ListOffsets per
//! topic to the partitions' owners). That keeps one definition of lag, and reaches the log ends
//! of partitions other brokers own without a second inter-broker path. Each broker reports only
//! the groups it coordinates (a group's `__consumer_offsets` shard), so summing over brokers
//! counts every group once; while a shard moves, its groups may be missing from one pass.
//!
//! Computing lag at scrape time would make a scrape's duration depend on the number of groups
//! and on other brokers; a background pass bounds the work per interval instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::messages::ListGroupsRequest;
use strata_core::Clock;
use tracing::{debug, warn};

use crate::cli::group::{committed, topic_offsets};
use crate::kafka_client::Client;

/// Partition series reported at most, over all groups (the per-group sums are always
/// reported): a scrape stays bounded whatever the groups commit for.
pub const MAX_LAG_SERIES: usize = 10_000;
/// Groups one pass looks at, at most, in group id order.
pub const MAX_LAG_GROUPS: usize = 10_000;
/// How long one request of a pass may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One partition's lag for one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLag {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    /// Log end offset minus committed offset, never negative.
    pub lag: i64,
}

/// The result of the last completed pass.
#[derive(Debug, Clone, Default)]
pub struct LagSnapshot {
    /// Sorted by group, topic and partition; at most [`MAX_LAG_SERIES`].
    pub partitions: Vec<PartitionLag>,
    /// Every group's total lag, sorted by group.
    pub sums: Vec<(String, i64)>,
    /// Wall-clock time the pass finished, in milliseconds since the epoch; 0 before the first.
    pub computed_at_ms: i64,
}

/// Where the exporter leaves its passes and `/metrics` reads them.
#[derive(Debug, Default)]
pub struct LagMetrics {
    latest: Mutex<Option<LagSnapshot>>,
}

impl LagMetrics {
    /// The last completed pass; None before the first (or when lag metrics are off).
    pub fn snapshot(&self) -> Option<LagSnapshot> {
        self.latest.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn store(&self, snapshot: LagSnapshot) {
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(snapshot);
        }
    }
}

/// Runs passes every `interval` until the task is dropped. `bootstrap` is this broker's
/// PLAINTEXT listener; `node_id` is this broker, whose groups are the ones reported.
pub async fn run(
    bootstrap: String,
    node_id: i32,
    clock: Arc<dyn Clock>,
    interval: Duration,
    out: Arc<LagMetrics>,
) {
    let mut client: Option<Client> = None;
    loop {
        clock.sleep(interval).await;
        if client.is_none() {
            match Client::connect(&bootstrap, Arc::clone(&clock), REQUEST_TIMEOUT).await {
                Ok(c) => client = Some(c),
                Err(e) => {
                    debug!(error = %e, "group lag: connecting to this broker failed; next pass retries");
                    continue;
                }
            }
        }
        let Some(c) = client.as_mut() else { continue };
        match pass(c, node_id).await {
            Ok((partitions, sums)) => out.store(LagSnapshot {
                partitions,
                sums,
                computed_at_ms: clock.wall_millis(),
            }),
            Err(e) => {
                // A fresh connection next time: the failure may have been this one's.
                warn!(error = %format!("{e:#}"), "group lag: a pass failed; the last result stays on /metrics");
                client = None;
            }
        }
    }
}

type PassResult = (Vec<PartitionLag>, Vec<(String, i64)>);

/// One pass over the groups this broker coordinates.
async fn pass(client: &mut Client, node_id: i32) -> anyhow::Result<PassResult> {
    let response = client
        .node(node_id)
        .await?
        .request(5, &ListGroupsRequest::default())
        .await?;
    if response.error_code != 0 {
        anyhow::bail!("ListGroups answered error {}", response.error_code);
    }
    let mut groups: Vec<String> = response
        .groups
        .iter()
        .map(|g| g.group_id.to_string())
        .collect();
    groups.sort();
    groups.truncate(MAX_LAG_GROUPS);
    // One ListOffsets round per topic per pass, however many groups read it.
    let mut ends: HashMap<String, BTreeMap<i32, (i64, i64)>> = HashMap::new();
    let mut partitions = Vec::new();
    let mut sums = Vec::with_capacity(groups.len());
    for group in groups {
        // A group deleted or moved since ListGroups: skip it this pass.
        let offsets = match committed(client, &group).await {
            Ok(offsets) => offsets,
            Err(e) => {
                debug!(group, error = %format!("{e:#}"), "group lag: skipping a group");
                continue;
            }
        };
        let mut sum = 0i64;
        for (topic, committed) in offsets {
            if !ends.contains_key(&topic) {
                // A deleted topic has no log end: its offsets are not lag.
                let Ok(topic_ends) = topic_offsets(client, &topic).await else {
                    continue;
                };
                ends.insert(topic.clone(), topic_ends);
            }
            let Some(topic_ends) = ends.get(&topic) else {
                continue;
            };
            for (partition, offset) in committed {
                let Some(&(_, end)) = topic_ends.get(&partition) else {
                    continue;
                };
                let lag = end.saturating_sub(offset).max(0);
                sum = sum.saturating_add(lag);
                partitions.push(PartitionLag {
                    group: group.clone(),
                    topic: topic.clone(),
                    partition,
                    lag,
                });
            }
        }
        sums.push((group, sum));
    }
    partitions
        .sort_by(|a, b| (&a.group, &a.topic, a.partition).cmp(&(&b.group, &b.topic, b.partition)));
    partitions.truncate(MAX_LAG_SERIES);
    Ok((partitions, sums))
}
