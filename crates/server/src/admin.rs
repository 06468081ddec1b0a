//! Operator commands on a running cluster: `strata partitions move`, `strata broker
//! drain|undrain` and `strata cluster status`. They talk to the storage only (the
//! coordination objects under `cluster/`), never to a broker: brokers pick the requests up
//! from there. They refuse a storage URL where no cluster exists instead of creating one.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use strata_cluster::admin;
use strata_cluster::OwnerState;
use strata_core::{BrokerId, SystemClock};
use strata_storage::ObjectStore;

use crate::cli::{out, out_json, table};

/// How often a move's progress is re-read from storage. The printed time overshoots the real
/// one by up to this much, and moves now take tens of milliseconds, so 20 ms was a visible
/// part of what `partitions move` reported; one small read per 5 ms lasts only as long as
/// the move.
const POLL: Duration = Duration::from_millis(5);
const DRAIN_POLL: Duration = Duration::from_millis(250);
/// How often a wait says it is still waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, clap::Subcommand)]
pub enum PartitionsCommand {
    /// Move one partition to another broker (cluster mode), and wait until it serves there.
    ///
    /// Writes a placement override (what AlterPartitionReassignments does): the current owner
    /// stops accepting appends, flushes and checkpoints, releases the partition, and the target
    /// claims it at the next epoch. No data is copied, so this takes about the same time for
    /// any partition size. Prints the time from the request until the target serves. The
    /// override stays: the partition returns to the target whenever it is live.
    Move(MoveArgs),
}

#[derive(Debug, clap::Args)]
pub struct MoveArgs {
    /// Topic name.
    topic: String,
    /// Partition index.
    partition: i32,
    /// Node id of the broker to move the partition to.
    #[arg(long, value_name = "BROKER")]
    to: i32,
    #[command(flatten)]
    storage: ClusterStorage,
    /// Give up waiting after this long (the move itself stays requested).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    timeout: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum BrokerCommand {
    /// Drain a broker (cluster mode): move every partition it holds to the other brokers.
    ///
    /// Writes a drain request (cluster/drain/<ID>) for the broker's current incarnation; the
    /// broker picks it up within about a second, marks itself draining, and placement moves
    /// all its partitions away. Shows how many partitions it still holds until none is left;
    /// the broker can then be stopped (SIGTERM: it leaves the cluster cleanly). A broker
    /// restarted afterwards is a new incarnation and serves normally again.
    Drain(DrainArgs),
    /// Cancel a drain (cluster mode): the broker takes partitions again, without a restart.
    ///
    /// Deletes the drain request; the broker notices within about a second and clears its
    /// draining mark, and placement may move partitions back to it.
    Undrain(UndrainArgs),
}

#[derive(Debug, clap::Args)]
pub struct UndrainArgs {
    /// Node id of the broker.
    id: i32,
    #[command(flatten)]
    storage: ClusterStorage,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Brokers (incarnation, start, heartbeats, draining), partitions per broker, and every
    /// partition's lease (owner record: owner, epoch, state), read from the storage.
    Status {
        #[command(flatten)]
        storage: ClusterStorage,
        /// Print one JSON document instead of tables.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Node id of the broker to drain.
    id: i32,
    #[command(flatten)]
    storage: ClusterStorage,
    /// Give up waiting after this long (the broker keeps draining).
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    timeout: String,
    /// Drain even when no other broker could take the partitions (they stay leaderless
    /// until one joins).
    #[arg(long)]
    force: bool,
}

/// Where the cluster's objects are: the storage the brokers were started with, or with two
/// tiers the write-ahead tier, which holds the catalog, the cluster objects and the users (the
/// bulk tier holds only segments). Both flags are accepted so an operator can pass the
/// brokers' own `--storage`/`--wal-storage` (or their STRATA_STORAGE/STRATA_WAL_STORAGE).
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterStorage {
    /// The cluster's storage URL (as given to `strata serve --storage`).
    #[arg(long, value_name = "URL", env = "STRATA_STORAGE")]
    storage: String,
    /// The write-ahead tier's URL, if the brokers run with `--wal-storage`: the cluster's
    /// objects live there, so it is what these commands open.
    #[arg(long, value_name = "URL", env = "STRATA_WAL_STORAGE")]
    wal_storage: Option<String>,
}

impl ClusterStorage {
    pub fn cluster_url(&self) -> &str {
        self.wal_storage
            .as_deref()
            .filter(|w| !w.trim().is_empty())
            .unwrap_or(&self.storage)
    }
}

fn duration(text: &str) -> anyhow::Result<Duration> {
    humantime_serde::re::humantime::parse_duration(text)
        .with_context(|| format!("--timeout {text:?} is not a duration (e.g. 30s)"))
}

pub async fn partitions(command: PartitionsCommand) -> anyhow::Result<()> {
    match command {
        PartitionsCommand::Move(args) => move_partition(args).await,
    }
}

pub async fn broker(command: BrokerCommand) -> anyhow::Result<()> {
    match command {
        BrokerCommand::Drain(args) => drain(args).await,
        BrokerCommand::Undrain(args) => undrain(args).await,
    }
}

pub async fn cluster(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Status { storage, json } => status(storage.cluster_url(), json).await,
    }
}

/// Opens the storage of an existing cluster. A local directory is checked before opening,
/// which would create it: a mistyped path must not become an empty cluster.
async fn open(storage: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let missing = |why: &str| {
        anyhow::anyhow!(
            "no Strata cluster at {storage:?}: {why}; pass the URL the brokers were started \
             with (`strata serve --storage`, and `--wal-storage` if they have two tiers: \
             the cluster's objects are on the write-ahead tier), e.g. --storage \
             file:///var/lib/strata, s3://bucket/prefix or rados://pool"
        )
    };
    if let Some(dir) = strata_storage::local_directory(storage)? {
        if !dir.is_dir() {
            return Err(missing("the directory does not exist"));
        }
    }
    let store = crate::open_backend(storage.to_string())
        .await
        .with_context(|| format!("opening storage {storage:?}"))?;
    if !admin::cluster_exists(store.as_ref()).await? {
        return Err(missing(
            "no broker has registered there and it holds no topics",
        ));
    }
    Ok(store)
}

async fn move_partition(args: MoveArgs) -> anyhow::Result<()> {
    let timeout = duration(&args.timeout)?;
    let store = open(args.storage.cluster_url()).await?;
    let clock = SystemClock::shared();
    let target = BrokerId(args.to);
    let resource = admin::partition_resource(store.as_ref(), &args.topic, args.partition).await?;
    let before = admin::owner(Arc::clone(&store), &resource).await?;
    let name = format!("{}-{}", args.topic, args.partition);
    let started = clock.monotonic();
    request_move(&store, &args.topic, args.partition, target).await?;
    let mut next_progress = PROGRESS_EVERY;
    loop {
        let now = admin::owner(Arc::clone(&store), &resource).await?;
        if let Some(record) = &now {
            let moved = before
                .as_ref()
                .is_none_or(|b| b.owner == target || record.epoch > b.epoch);
            if record.owner == target && record.state == OwnerState::Active && moved {
                let elapsed = clock.monotonic().saturating_sub(started);
                if before
                    .as_ref()
                    .is_some_and(|b| b.owner == target && b.epoch == record.epoch)
                {
                    // The placement now pins it there; nothing was handed over.
                    let _ = writeln!(
                        std::io::stdout(),
                        "{name} is already on broker {target} (epoch {}); it stays there",
                        record.epoch
                    );
                    return Ok(());
                }
                let from = before
                    .as_ref()
                    .map(|b| format!("broker {} (epoch {})", b.owner, b.epoch))
                    .unwrap_or_else(|| "nobody".to_string());
                let _ = writeln!(
                    std::io::stdout(),
                    "moved {name} from {from} to broker {target} (epoch {}) in {} ms",
                    record.epoch,
                    elapsed.as_millis()
                );
                return Ok(());
            }
        }
        let waited = clock.monotonic().saturating_sub(started);
        if waited > timeout {
            bail!(
                "{name} is not served by broker {target} after {timeout:?} (now: {now:?}); \
                 the move stays requested"
            );
        }
        if waited >= next_progress {
            next_progress += PROGRESS_EVERY;
            let state = now
                .as_ref()
                .map(|r| format!("broker {} epoch {} {:?}", r.owner, r.epoch, r.state))
                .unwrap_or_else(|| "unowned".into());
            let _ = writeln!(
                std::io::stderr(),
                "waiting for {name} to move to broker {target} ({} s; now {state})",
                waited.as_secs()
            );
        }
        clock.sleep(POLL).await;
    }
}

/// Writes the placement override that moves `topic`-`partition` to `target`, after checking
/// that the partition exists and the target is registered: the step `strata partitions move`
/// and the console's Move share.
pub async fn request_move(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    partition: i32,
    target: BrokerId,
) -> anyhow::Result<()> {
    let resource = admin::partition_resource(store.as_ref(), topic, partition).await?;
    if admin::registration(store.as_ref(), target).await?.is_none() {
        bail!("broker {target} is not registered in this cluster");
    }
    admin::set_placement(Arc::clone(store), &resource, target).await?;
    Ok(())
}

/// Writes the drain request for `broker`, after checking that it is registered and, unless
/// `force`, that another broker not draining could take its partitions (draining the last one
/// would leave every partition leaderless): the step `strata broker drain` and the console's
/// Drain share. Returns the incarnation the request names.
pub async fn request_drain(
    store: &Arc<dyn ObjectStore>,
    broker: BrokerId,
    force: bool,
) -> anyhow::Result<strata_cluster::Incarnation> {
    let registrations = admin::registrations(store.as_ref()).await?;
    if !registrations.iter().any(|r| r.node_id == broker) {
        let ids: Vec<String> = registrations
            .iter()
            .map(|r| r.node_id.to_string())
            .collect();
        bail!(
            "broker {broker} is not registered in this cluster (registered: {}); \
             `strata cluster status` lists the brokers",
            if ids.is_empty() {
                "none".to_string()
            } else {
                ids.join(", ")
            }
        );
    }
    let takers = registrations
        .iter()
        .filter(|r| r.node_id != broker && !r.draining)
        .count();
    if takers == 0 && !force {
        bail!(
            "broker {broker} is the only broker that could hold partitions (no other broker is \
             registered and not draining): draining it would leave every partition \
             leaderless. Start another broker first, or pass --force"
        );
    }
    Ok(admin::request_drain(store.as_ref(), broker).await?)
}

async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let timeout = duration(&args.timeout)?;
    let store = open(args.storage.cluster_url()).await?;
    let clock = SystemClock::shared();
    let broker = BrokerId(args.id);
    let incarnation = request_drain(&store, broker, args.force).await?;
    let started = clock.monotonic();
    let initial = admin::partitions_held(Arc::clone(&store), broker, incarnation).await?;
    let mut stderr = std::io::stderr();
    let _ = writeln!(
        stderr,
        "drain of broker {broker} (incarnation {incarnation}) requested; it holds {initial} partitions"
    );
    let interactive = std::io::IsTerminal::is_terminal(&stderr);
    let mut next_progress = Duration::ZERO;
    loop {
        let held = admin::partitions_held(Arc::clone(&store), broker, incarnation).await?;
        let waited = clock.monotonic().saturating_sub(started);
        if interactive {
            // One line updated in place: the count is what an operator watches.
            let _ = write!(
                stderr,
                "\r{held}/{initial} partitions still on broker {broker} ({} s)   ",
                waited.as_secs()
            );
            let _ = stderr.flush();
        } else if waited >= next_progress {
            // A log or a pipe gets a line a second instead of carriage returns.
            next_progress += PROGRESS_EVERY;
            let _ = writeln!(
                stderr,
                "{held}/{initial} partitions still on broker {broker} ({} s)",
                waited.as_secs()
            );
        }
        if held == 0 {
            if interactive {
                let _ = writeln!(stderr);
            }
            let _ = writeln!(
                std::io::stdout(),
                "broker {broker} holds no partitions after {} ms; it can be stopped now \
                 (SIGTERM: it leaves the cluster cleanly)",
                clock.monotonic().saturating_sub(started).as_millis()
            );
            return Ok(());
        }
        if clock.monotonic().saturating_sub(started) > timeout {
            if interactive {
                let _ = writeln!(stderr);
            }
            bail!("broker {broker} still holds {held} partitions after {timeout:?}; it keeps draining");
        }
        clock.sleep(DRAIN_POLL).await;
    }
}

async fn undrain(args: UndrainArgs) -> anyhow::Result<()> {
    let store = open(args.storage.cluster_url()).await?;
    let broker = BrokerId(args.id);
    if admin::cancel_drain(store.as_ref(), broker).await? {
        out(&format!(
            "drain of broker {broker} cancelled; it takes partitions again within about a second"
        ));
        Ok(())
    } else {
        bail!("broker {broker} has no drain request to cancel")
    }
}

/// `strata cluster status --json` and the console's cluster view: every registered broker
/// and every partition's owner record, as stored.
#[derive(Debug, serde::Serialize)]
pub struct ClusterStatus {
    pub brokers: Vec<BrokerStatus>,
    pub partitions: Vec<PartitionOwnerStatus>,
}

#[derive(Debug, serde::Serialize)]
pub struct BrokerStatus {
    pub id: i32,
    pub host: String,
    pub port: u16,
    pub incarnation: String,
    pub started_ms: i64,
    pub heartbeat: u64,
    pub draining: bool,
    pub drain_requested: bool,
    /// Partitions it holds Active under its current incarnation.
    pub partitions: usize,
}

#[derive(Debug, serde::Serialize)]
pub struct PartitionOwnerStatus {
    /// None: the topic was deleted and its owner record not yet cleaned up.
    pub topic: Option<String>,
    /// The owner record's resource (topic id / partition).
    pub resource: String,
    pub partition: i32,
    pub owner: i32,
    pub incarnation: String,
    pub epoch: u64,
    pub state: String,
}

/// Reads the cluster's coordination objects from `store`.
pub async fn cluster_status(store: &Arc<dyn ObjectStore>) -> anyhow::Result<ClusterStatus> {
    let registrations = admin::registrations(store.as_ref()).await?;
    let requests = admin::drain_requests(store.as_ref()).await?;
    let owners = admin::partition_owners(Arc::clone(store)).await?;
    let brokers = registrations
        .iter()
        .map(|r| BrokerStatus {
            id: r.node_id.0,
            host: r.host.clone(),
            port: r.port,
            incarnation: r.incarnation.to_string(),
            started_ms: r.started_ms,
            heartbeat: r.heartbeat,
            draining: r.draining,
            drain_requested: requests
                .iter()
                .any(|(b, i)| *b == r.node_id && *i == r.incarnation),
            partitions: owners
                .iter()
                .filter(|o| {
                    o.record.owner == r.node_id
                        && o.record.incarnation == r.incarnation
                        && o.record.state == OwnerState::Active
                })
                .count(),
        })
        .collect();
    let partitions = owners
        .iter()
        .map(|o| PartitionOwnerStatus {
            topic: o.topic.clone(),
            resource: o.resource.to_string(),
            partition: o.partition,
            owner: o.record.owner.0,
            incarnation: o.record.incarnation.to_string(),
            epoch: o.record.epoch.0,
            state: format!("{:?}", o.record.state),
        })
        .collect();
    Ok(ClusterStatus {
        brokers,
        partitions,
    })
}

async fn status(storage: &str, json: bool) -> anyhow::Result<()> {
    let store = open(storage).await?;
    let status = cluster_status(&store).await?;
    if json {
        out_json(&serde_json::json!(status));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = status
        .brokers
        .iter()
        .map(|b| {
            vec![
                b.id.to_string(),
                format!("{}:{}", b.host, b.port),
                b.incarnation.clone(),
                b.heartbeat.to_string(),
                if b.draining {
                    "draining".into()
                } else if b.drain_requested {
                    "drain requested".into()
                } else {
                    "-".into()
                },
                b.partitions.to_string(),
            ]
        })
        .collect();
    let mut text = table(
        &[
            "BROKER",
            "ADDRESS",
            "INCARNATION",
            "HEARTBEATS",
            "DRAIN",
            "PARTITIONS",
        ],
        &rows,
    );
    let leases: Vec<Vec<String>> = status
        .partitions
        .iter()
        .map(|p| {
            vec![
                p.topic
                    .clone()
                    .unwrap_or_else(|| format!("(deleted) {}", p.resource)),
                p.partition.to_string(),
                p.owner.to_string(),
                p.epoch.to_string(),
                p.state.clone(),
            ]
        })
        .collect();
    text.push('\n');
    text.push_str(&table(
        &["TOPIC", "PARTITION", "OWNER", "EPOCH", "STATE"],
        &leases,
    ));
    out(&text);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::ClusterStorage;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        storage: ClusterStorage,
    }

    #[test]
    fn the_commands_open_the_write_ahead_tier_when_there_is_one() {
        let parse = |args: &[&str]| {
            Command::try_parse_from(std::iter::once("strata").chain(args.iter().copied()))
                .unwrap()
                .storage
        };
        let tiered = parse(&["--storage", "s3://bulk/p", "--wal-storage", "rados://fast"]);
        assert_eq!(tiered.cluster_url(), "rados://fast");
        let single = parse(&["--storage", "file:///var/lib/strata"]);
        assert_eq!(single.cluster_url(), "file:///var/lib/strata");
        let blank = parse(&["--storage", "rados://one", "--wal-storage", " "]);
        assert_eq!(blank.cluster_url(), "rados://one");
    }
}
