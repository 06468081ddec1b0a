//! `strata-bench` measures a Strata broker the way its users will meet it: through librdkafka
//! (via the `rdkafka` crate), the C client under most Kafka applications. It is a command you
//! run by hand, not a test: numbers depend on the machine, and the report says what the machine
//! was doing (CPU count, load average, CPU used by the benchmark and by the broker).
//!
//! Two benchmarks, each on a freshly created topic:
//!
//! - `throughput` produces N records of S bytes as fast as the client sends them (linger.ms 5,
//!   acks=all, no compression, librdkafka's default batch sizes) and reports records/s, MB/s and
//!   per-record send-to-acknowledgement latency percentiles; then it consumes the topic from the
//!   beginning (assign, no group) and reports the consume rate.
//! - `e2e` produces at a fixed rate while a consumer in the same process reads the topic, each
//!   payload stamped with its send time, and reports end-to-end latency percentiles.
//!
//! `fetch-sessions` speaks the Fetch protocol itself (librdkafka has no fetch sessions) and
//! reports the broker's CPU per Fetch of many partitions, with and without a session.
//!
//! A third command, `disk`, needs no broker: it times durable writes on a directory exactly as
//! the local-directory backend makes them, the floor under latency on `file://` storage.
//!
//! It measures a broker at `--bootstrap`, or starts one itself with `--spawn-broker` (the
//! `strata` binary next to this one, `--storage memory://` or `file:///dir`). Results print as a
//! table and, with `--json FILE`, as JSON. docs/BENCHMARKS.md has the commands and the results.

// A benchmark's output is its report: printing to stdout is the point of this binary.
#![allow(clippy::print_stdout)]

mod broker;
mod cli;
mod clients;
mod clock;
mod disk;
mod e2e;
mod fetch_rate;
mod fetch_sessions;
mod lookup;
mod migration;
mod report;
mod restarts;
mod scratch;
mod summary;
mod system;
mod throughput;

use anyhow::Result;
use clap::Parser;

use crate::broker::SpawnedBroker;
use crate::cli::{BenchCommand, Cli};
use crate::report::{Environment, Phase, Report};

/// What a benchmark returns, before the environment is added.
pub struct Outcome {
    /// The topic created for the run (none for `disk`).
    pub topic: Option<String>,
    /// The benchmark's flags, echoed into the report.
    pub settings: serde_json::Value,
    pub phases: Vec<Phase>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let target = &cli.target;
    // `migration` starts a cluster of its own and prints its own report.
    if let BenchCommand::Migration(args) = &cli.command {
        return migration::run(target, args);
    }
    if let BenchCommand::Lookup(args) = &cli.command {
        return lookup::run(args);
    }
    if let BenchCommand::Restarts(args) = &cli.command {
        return restarts::run(args);
    }
    if let BenchCommand::Summary(args) = &cli.command {
        return summary::run(args);
    }
    let load_average_before = system::load_average();
    let started_unix_seconds = clock::unix_seconds();

    // `disk` measures the disk alone; a broker would only add noise.
    let needs_broker = !matches!(cli.command, BenchCommand::Disk(_));
    let broker = if target.spawn_broker && needs_broker {
        let bin = match &target.strata_bin {
            Some(bin) => bin.clone(),
            None => broker::default_binary()?,
        };
        let broker = SpawnedBroker::start(
            &bin,
            target.broker_storage(),
            &target.broker_args,
            &target.broker_env,
            target.broker_log.as_deref(),
        )?;
        eprintln!(
            "started {} (pid {}) on {} listening at {}",
            bin.display(),
            broker.pid(),
            target.broker_storage(),
            broker.bootstrap()
        );
        Some(broker)
    } else {
        None
    };
    let bootstrap = broker
        .as_ref()
        .map_or_else(|| target.bootstrap.clone(), |b| b.bootstrap().to_string());
    let broker_pid = broker
        .as_ref()
        .map(SpawnedBroker::pid)
        .or(target.broker_pid);
    // Prints its own table: its numbers are per request, not per phase of records.
    if let BenchCommand::FetchSessions(args) = &cli.command {
        return fetch_sessions::run(&bootstrap, target, broker_pid, args);
    }
    if let BenchCommand::FetchRate(args) = &cli.command {
        return fetch_rate::run(&bootstrap, target, broker_pid, args);
    }

    let (benchmark, outcome) = match &cli.command {
        BenchCommand::Throughput(args) => (
            "throughput",
            throughput::run(&bootstrap, target, broker_pid, args)?,
        ),
        BenchCommand::E2e(args) => ("e2e", e2e::run(&bootstrap, target, broker_pid, args)?),
        BenchCommand::Disk(args) => ("disk", disk::run(args)?),
        BenchCommand::Migration(_)
        | BenchCommand::Lookup(_)
        | BenchCommand::Restarts(_)
        | BenchCommand::Summary(_)
        | BenchCommand::FetchSessions(_)
        | BenchCommand::FetchRate(_) => {
            unreachable!("handled above")
        }
    };
    // Read while the spawned broker still runs: the load it adds is part of the run.
    let load_average_after = system::load_average();
    let spawned_storage = broker
        .is_some()
        .then(|| target.broker_storage().to_string());
    drop(broker);

    let report = Report {
        benchmark: benchmark.to_string(),
        topic: outcome.topic,
        settings: outcome.settings,
        environment: Environment {
            cpus: system::cpus(),
            load_average_before,
            load_average_after,
            bootstrap: needs_broker.then_some(bootstrap),
            spawned_storage,
            broker_args: target.broker_args.clone(),
            broker_env: target.broker_env.clone(),
            client_config: target.client_config.clone(),
            started_unix_seconds,
        },
        phases: outcome.phases,
    };
    let json_to_stdout = cli.json.as_deref() == Some(std::path::Path::new("-"));
    if !json_to_stdout {
        report.print_table();
    }
    if let Some(path) = &cli.json {
        report.write_json(path)?;
    }
    Ok(())
}
