//! Operator commands on a running cluster: `strata partitions move` and `strata broker drain`.
//! They talk to the storage only (the coordination objects under `cluster/`), never to a
//! broker: brokers pick the requests up from there.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use strata_cluster::admin;
use strata_cluster::OwnerState;
use strata_core::{BrokerId, SystemClock};
use strata_storage::ObjectStore;

/// How often a move's progress is re-read from storage. The printed time overshoots the real
/// one by up to this much, and moves now take tens of milliseconds, so 20 ms was a visible
/// part of what `partitions move` reported; one small read per 5 ms lasts only as long as
/// the move.
const POLL: Duration = Duration::from_millis(5);
const DRAIN_POLL: Duration = Duration::from_millis(250);

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
    /// The cluster's storage URL (as given to `strata serve --storage`).
    #[arg(long, value_name = "URL", env = "STRATA_STORAGE")]
    storage: String,
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
}

#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Node id of the broker to drain.
    id: i32,
    /// The cluster's storage URL (as given to `strata serve --storage`).
    #[arg(long, value_name = "URL", env = "STRATA_STORAGE")]
    storage: String,
    /// Give up waiting after this long (the broker keeps draining).
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    timeout: String,
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
    }
}

async fn open(storage: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    crate::open_backend(storage.to_string())
        .await
        .with_context(|| format!("opening storage {storage:?}"))
}

async fn move_partition(args: MoveArgs) -> anyhow::Result<()> {
    let timeout = duration(&args.timeout)?;
    let store = open(&args.storage).await?;
    let clock = SystemClock::shared();
    let target = BrokerId(args.to);
    let resource = admin::partition_resource(store.as_ref(), &args.topic, args.partition).await?;
    if admin::registration(store.as_ref(), target).await?.is_none() {
        bail!("broker {target} is not registered in this cluster");
    }
    let before = admin::owner(Arc::clone(&store), &resource).await?;
    let name = format!("{}-{}", args.topic, args.partition);
    let started = clock.monotonic();
    admin::set_placement(Arc::clone(&store), &resource, target).await?;
    loop {
        let now = admin::owner(Arc::clone(&store), &resource).await?;
        if let Some(record) = &now {
            let moved = before
                .as_ref()
                .is_none_or(|b| b.owner == target || record.epoch > b.epoch);
            if record.owner == target && record.state == OwnerState::Active && moved {
                let elapsed = clock.monotonic().saturating_sub(started);
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
        if clock.monotonic().saturating_sub(started) > timeout {
            bail!(
                "{name} is not served by broker {target} after {timeout:?} (now: {now:?}); \
                 the move stays requested"
            );
        }
        clock.sleep(POLL).await;
    }
}

async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let timeout = duration(&args.timeout)?;
    let store = open(&args.storage).await?;
    let clock = SystemClock::shared();
    let broker = BrokerId(args.id);
    let incarnation = admin::request_drain(store.as_ref(), broker).await?;
    let started = clock.monotonic();
    let initial = admin::partitions_held(Arc::clone(&store), broker, incarnation).await?;
    let mut stderr = std::io::stderr();
    let _ = writeln!(
        stderr,
        "drain of broker {broker} (incarnation {incarnation}) requested; it holds {initial} partitions"
    );
    loop {
        let held = admin::partitions_held(Arc::clone(&store), broker, incarnation).await?;
        // One line updated in place: the count is what an operator watches.
        let _ = write!(
            stderr,
            "\r{held}/{initial} partitions still on broker {broker} ({} s)   ",
            clock.monotonic().saturating_sub(started).as_secs()
        );
        let _ = stderr.flush();
        if held == 0 {
            let _ = writeln!(stderr);
            let _ = writeln!(
                std::io::stdout(),
                "broker {broker} holds no partitions after {} ms; it can be stopped now \
                 (SIGTERM: it leaves the cluster cleanly)",
                clock.monotonic().saturating_sub(started).as_millis()
            );
            return Ok(());
        }
        if clock.monotonic().saturating_sub(started) > timeout {
            let _ = writeln!(stderr);
            bail!("broker {broker} still holds {held} partitions after {timeout:?}; it keeps draining");
        }
        clock.sleep(DRAIN_POLL).await;
    }
}
