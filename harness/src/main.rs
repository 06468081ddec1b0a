//! `strata-harness`: a fault-injection campaign against a cluster of real `strata` brokers.
//!
//! Starts `--brokers` brokers on one shared storage (a temporary directory, or a prefix or
//! namespace under `--storage`), creates a topic, runs idempotent acks=all producers and a
//! committing consumer group while a seeded nemesis kills, freezes, restarts, drains brokers and
//! moves partitions, then heals the cluster, reads every partition back from offset 0 with a
//! fresh consumer and checks the history (see `checker`). Prints the seed first and last; exits
//! 1 on any anomaly. `--seed N` replays the nemesis's choices.

// The report is the program's output.
#![allow(clippy::print_stdout, reason = "the campaign report goes to stdout")]
// A harness measures real processes on the real clock.
#![allow(
    clippy::disallowed_methods,
    reason = "deadlines and fault durations against real child processes need the real clock"
)]
// Like the test helpers it drives, a broken expectation of the harness itself is a panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test tooling: panicking is how the harness reports its own failure"
)]

mod checker;
mod cleanup;
mod explain;
mod history;
mod nemesis;
mod readback;
mod storage;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use strata_tests::clients::create_topic;
use strata_tests::cluster::{parse_millis, BrokerHooks, Cluster};

use crate::history::History;
use crate::nemesis::{Fault, Nemesis, Targets};
use crate::storage::{RadosCut, StorageProxy, Tmpfs};
use crate::workload::{Consumers, Producers};

const TOPIC: &str = "harness";

#[derive(Debug, Parser)]
#[command(about = "Fault-injection campaign against a strata cluster (see docs/RELIABILITY.md)")]
struct Args {
    /// Seed of the nemesis's RNG [default: the current time, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// How long faults are injected (the heal and the final read come after).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Shared storage: a directory or file:// URL, or an s3:// or rados:// URL; each run uses
    /// a fresh sub-directory, prefix or namespace under it [default: a temporary directory].
    #[arg(long)]
    storage: Option<String>,
    /// Brokers in the cluster (node ids 1..=N).
    #[arg(long, default_value_t = 3)]
    brokers: i32,
    /// Partitions of the workload's topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Idempotent producers.
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// Members of the consumer group.
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// Records per second each producer offers.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// The brokers' lease period (short, so a frozen broker is fenced quickly).
    #[arg(long, default_value = "2s")]
    lease: String,
    /// The brokers' heartbeat interval (at most half the lease).
    #[arg(long, default_value = "300ms")]
    heartbeat: String,
    /// The log's segment interval: short, so compaction runs often under the faults.
    #[arg(long, default_value = "2s")]
    segment_interval: String,
    /// Mean quiet time between two faults.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    fault_gap: Duration,
    /// Faults to mix, comma-separated: kill, pause, restart, move, drain; not in the default mix
    /// (which CI's seeds replay): consumer-kill; opt-in:
    /// partition (needs root and iptables), full (needs root: the local storage goes on a
    /// tmpfs the harness mounts; not with --storage), storage-partition, storage-slow,
    /// storage-errors (need --storage s3://...: each broker reaches S3 through its own proxy;
    /// storage-partition also works on rados://, by iptables: needs root).
    #[arg(long, value_delimiter = ',', default_value = "kill,pause,restart,move,drain",
          value_parser = Fault::parse)]
    faults: Vec<Fault>,
    /// Size of the tmpfs the `full` fault fills, in MiB.
    #[arg(long, default_value_t = 256)]
    full_size_mib: u64,
    /// Where the history is written (JSON lines) [default: <tmp>/strata-harness-<seed>.jsonl].
    #[arg(long)]
    history: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    });
    println!(
        "strata-harness: seed {seed} (replay with --seed {seed}), duration {:?}, {} brokers",
        args.duration, args.brokers
    );
    let wants_full = args.faults.contains(&Fault::Full);
    let wants_proxies = args.faults.iter().any(|f| f.needs_proxies());
    let is_s3 = args
        .storage
        .as_deref()
        .is_some_and(|s| s.starts_with("s3://"));
    if wants_full && args.storage.is_some() {
        eprintln!(
            "strata-harness: the full fault puts the storage on its own tmpfs; drop --storage"
        );
        std::process::exit(2);
    }
    let is_rados = args
        .storage
        .as_deref()
        .is_some_and(|s| s.starts_with("rados://"));
    // On RADOS only the partition exists (by iptables, see storage::RadosCut).
    let rados_partition_only = is_rados
        && args
            .faults
            .iter()
            .all(|f| !f.needs_proxies() || *f == Fault::StoragePartition);
    if wants_proxies && !is_s3 && !rados_partition_only {
        eprintln!(
            "strata-harness: storage-slow/errors need --storage s3://..., storage-partition \
             s3:// or rados://"
        );
        std::process::exit(2);
    }
    let tmpfs = wants_full.then(|| match Tmpfs::mount(args.full_size_mib) {
        Ok(tmpfs) => tmpfs,
        Err(error) => {
            eprintln!("strata-harness: {error}");
            std::process::exit(2);
        }
    });
    let base = match (&args.storage, &tmpfs) {
        (Some(storage), _) => Some(storage_base(storage)),
        (None, Some(tmpfs)) => Some(format!("file://{}", tmpfs.path().display())),
        (None, None) => None,
    };
    if let Some(base) = base {
        // SharedStorage puts each cluster under this base, as for the end-to-end tests. Set
        // before any other thread starts.
        std::env::set_var("STRATA_TEST_STORAGE", &base);
    }
    if std::env::var_os("STRATA_TEST_LOG").is_none() {
        // The brokers' sequence decisions (refusals, recognised retries) at debug: what tells
        // a duplicate's cause from the kept logs. Set before any other thread starts.
        std::env::set_var("STRATA_TEST_LOG", "info,strata_log::append=debug");
    }
    let code = run(&args, seed, tmpfs.as_ref());
    // Unmounted here (not by exit), after the cluster's brokers are gone.
    drop(tmpfs);
    println!(
        "strata-harness: seed {seed}: {}",
        if code == 0 { "no anomaly" } else { "ANOMALIES" }
    );
    std::process::exit(code);
}

/// A plain directory becomes an absolute file:// URL (created if missing); URLs pass through.
fn storage_base(storage: &str) -> String {
    if storage.contains("://") {
        return storage.to_string();
    }
    let path = PathBuf::from(storage);
    std::fs::create_dir_all(&path).expect("create the --storage directory");
    let absolute = std::fs::canonicalize(&path).expect("resolve the --storage directory");
    format!("file://{}", absolute.display())
}

fn run(args: &Args, seed: u64, tmpfs: Option<&Tmpfs>) -> i32 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    cleanup::on_signal(runtime.handle());
    let mut proxies = std::collections::BTreeMap::new();
    let storage = args.storage.as_deref().unwrap_or_default();
    let rados_cut = (storage.starts_with("rados://")
        && args.faults.contains(&Fault::StoragePartition))
    .then(|| RadosCut::install(storage, args.brokers).expect("iptables rules for the RADOS cut"));
    if rados_cut.is_none() && args.faults.iter().any(|f| f.needs_proxies()) {
        let upstream = storage::s3_endpoint(storage).expect("the s3:// URL names its endpoint=");
        for id in 1..=args.brokers {
            let proxy = StorageProxy::start(runtime.handle(), upstream.clone())
                .expect("a loopback port for a storage proxy");
            proxies.insert(id, proxy);
        }
    }
    let ports: std::collections::BTreeMap<i32, u16> = proxies
        .iter()
        .map(|(id, proxy)| (*id, proxy.port))
        .collect();
    let storage_url_of: Option<strata_tests::cluster::StorageUrlOf> =
        (!ports.is_empty()).then(|| -> strata_tests::cluster::StorageUrlOf {
            Box::new(move |id, url| match ports.get(&id) {
                Some(port) => storage::with_endpoint_port(url, *port),
                None => url.to_string(),
            })
        });
    let started = Instant::now();
    let history = History::new(started);
    let segment_interval = args.segment_interval.as_str();
    let hooks = BrokerHooks {
        storage_url_of,
        gid_of: rados_cut
            .is_some()
            .then_some(storage::broker_gid as fn(i32) -> u32),
        wal_storage: None,
    };
    let mut cluster = Cluster::start_with_hooks(
        args.brokers,
        &args.lease,
        &args.heartbeat,
        &[("STRATA_LOG_SEGMENT_INTERVAL", segment_interval)],
        hooks,
    );
    println!(
        "cluster of {} brokers on {} up after {:?}",
        args.brokers,
        cluster.storage.url(),
        started.elapsed()
    );
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    runtime.block_on(create_topic(&bootstrap, TOPIC, args.partitions, &[]));

    let producers = Producers::start(
        runtime.handle(),
        &bootstrap,
        TOPIC,
        args.partitions,
        args.producers,
        args.rate,
        &history,
    );
    let consumers = Consumers::start(&bootstrap, TOPIC, args.consumers, &history);

    let lease = parse_millis(&args.lease);
    let targets = Targets {
        proxies,
        rados_cut,
        tmpfs: tmpfs.map(|t| t.path().to_path_buf()),
        killer: Some(consumers.killer()),
        members: args.consumers,
    };
    let mut nemesis = Nemesis::new(
        seed,
        args.faults.clone(),
        lease,
        TOPIC,
        args.partitions,
        targets,
    );
    let faults_from = Instant::now();
    let faults_until = faults_from + args.duration;
    loop {
        let gap = nemesis.next_gap(args.fault_gap);
        if Instant::now() + gap >= faults_until {
            break;
        }
        // The quiet time between faults is part of the schedule, not a wait for anything.
        std::thread::sleep(gap);
        nemesis.step(&mut cluster, &history);
    }
    nemesis.heal(&mut cluster, &history);
    println!(
        "faults done after {:?}; healing and draining the clients",
        faults_from.elapsed()
    );

    runtime.block_on(producers.finish());
    consumers.finish();
    let logs = readback::read_everything(&bootstrap, TOPIC, args.partitions);
    let entries = history.snapshot();
    let (checks, counts) = checker::check(&entries, &logs, args.partitions);

    let history_path = args
        .history
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("strata-harness-{seed}.jsonl")));
    match history.write_to(&history_path) {
        Ok(()) => println!("history: {}", history_path.display()),
        Err(error) => println!("history: cannot write {}: {error}", history_path.display()),
    }

    println!("\nfaults (seed {seed}):");
    println!(
        "  {:<17} {:>8} {:>7} {:>7}",
        "kind", "injected", "failed", "fenced"
    );
    for (fault, tally) in &nemesis.tally {
        println!(
            "  {:<17} {:>8} {:>7} {:>7}",
            fault.name(),
            tally.injected,
            tally.failed,
            tally.fenced
        );
    }
    for exit in &nemesis.unexpected_exits {
        println!("  unexpected exit: {exit}");
    }
    let live_seals: Vec<String> = cluster
        .brokers
        .iter()
        .flat_map(|(id, broker)| {
            unjudged_seals(&broker.log_lines_containing("stream"))
                .into_iter()
                .map(move |line| format!("broker {id}: {line}"))
        })
        .collect();
    for seal in &live_seals {
        println!("  seal of a stream whose owner nobody judged dead: {seal}");
    }
    println!(
        "\noperations: {} sent, {} acknowledged, {} failed ({} of them stored), {} producer \
         fatal errors; {} stored; {} group reads, {} commits ok, {} failed, {} rebalances, {} \
         client errors",
        counts.sent,
        counts.acked,
        counts.failed,
        counts.failed_but_stored,
        counts.producer_fatal,
        counts.stored,
        counts.reads,
        counts.commits_ok,
        counts.commits_failed,
        counts.rebalances,
        counts.client_errors
    );

    println!("\nchecks:");
    println!(
        "  {:<17} {:>8} {:>9}  what",
        "check", "checked", "anomalies"
    );
    let mut anomalies = 0;
    for check in &checks {
        println!(
            "  {:<17} {:>8} {:>9}  {}",
            check.name, check.checked, check.anomalies, check.what
        );
        anomalies += check.anomalies;
    }
    println!(
        "  {:<17} {:>8} {:>9}  every broker restarts and every partition finds an owner",
        "liveness",
        "",
        nemesis.liveness.len()
    );
    anomalies += nemesis.liveness.len();
    for check in &checks {
        for example in &check.examples {
            println!("  {}: {example}", check.name);
        }
    }
    for failure in &nemesis.liveness {
        println!("  liveness: {failure}");
    }
    let examples: Vec<String> = checks
        .iter()
        .flat_map(|check| check.examples.iter().cloned())
        .collect();
    let values = explain::values_named(&examples);
    if !values.is_empty() {
        let broker_logs: Vec<(i32, Vec<String>)> = cluster
            .brokers
            .iter()
            .map(|(id, broker)| (*id, broker.log_lines_containing("")))
            .collect();
        println!("\nexplained:");
        for line in explain::explain(&values, &entries, &logs, TOPIC, &broker_logs) {
            println!("{line}");
        }
        // The producers' idempotence log (debug=eos): epoch bumps, sequence errors, drains.
        println!("  producers' idempotence log (librdkafka debug=eos, latest lines):");
        let client_log = strata_tests::clients::client_log_tail(2000);
        let eos: Vec<&str> = client_log
            .lines()
            .filter(|l| l.starts_with("librdkafka Debug"))
            .collect();
        for line in &eos[eos.len().saturating_sub(120)..] {
            println!("    {line}");
        }
    }
    if anomalies > 0 || !nemesis.unexpected_exits.is_empty() || !live_seals.is_empty() {
        // Keep what a developer needs: the brokers' recent output (an unexpected exit is not an
        // anomaly of the guarantees, but who fenced whom is only in these logs)...
        for (id, broker) in &cluster.brokers {
            let path = history_path.with_extension(format!("broker-{id}.log"));
            // Every kept line (the last few thousand), not just the short failure tail.
            let lines = broker.log_lines_containing("").join("\n");
            if std::fs::write(&path, lines).is_ok() {
                println!("broker {id} log tail: {}", path.display());
            }
        }
    }
    if anomalies > 0 {
        // ...and, on an anomaly, the shared storage.
        cluster.storage.keep();
        if let Some(tmpfs) = tmpfs {
            // The tmpfs goes with the unmount: copy the storage out first.
            let copy = history_path.with_extension("storage");
            let copied = std::process::Command::new("cp")
                .arg("-a")
                .arg(tmpfs.path())
                .arg(&copy)
                .status();
            if matches!(copied, Ok(status) if status.success()) {
                println!("storage copied to {}", copy.display());
            }
        } else {
            println!("storage kept: {}", cluster.storage.url());
        }
    }
    drop(cluster);
    i32::from(anomalies > 0)
}

/// Seals placed (fence.rs logs `stream sealed` only when it puts one) by a broker life that had
/// not judged that stream's owner dead first (`owner is dead; sealing its stream`) and that
/// was not sealing its own stream as it stopped (`sealing this broker's own …`): a takeover
/// that found a live broker's stream in a manifest whose record was Released, which fences a
/// live broker (the RELIABILITY finding fixed by d2e765b). Lines carry the harness's `[#N`
/// prefix naming the broker's life.
fn unjudged_seals(lines: &[String]) -> Vec<String> {
    let stream_after = |line: &str, marker: &str| -> Option<String> {
        let rest = &line[line.find(marker)? + marker.len()..];
        Some(rest.chars().take_while(char::is_ascii_hexdigit).collect())
    };
    let life = |line: &str| line.split_whitespace().next().unwrap_or("").to_string();
    let mut judged = std::collections::BTreeSet::new();
    let mut found = Vec::new();
    for line in lines {
        if line.contains("sealing its stream before claiming")
            || line.contains("sealing this broker's own write-ahead stream at shutdown")
        {
            if let Some(stream) = stream_after(line, " stream=") {
                judged.insert((life(line), stream));
            }
        } else if line.contains("stream sealed") {
            if let Some(stream) = stream_after(line, "stream sealed stream=") {
                if !judged.contains(&(life(line), stream)) {
                    found.push(line.trim().to_string());
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::unjudged_seals;

    #[test]
    fn a_seal_without_a_judgement_of_its_owner_is_reported() {
        let lines: Vec<String> = [
            // Judged dead first: the expected failover.
            "[#2 err] 2026-12-01T10:53:24.273554Z  INFO strata_cluster::runner: owner is dead; \
             sealing its stream before claiming resource=\"r/3\" dead_owner=3 stream=00000003",
            "[#2 err] 2026-12-01T10:53:24.276960Z  INFO strata_cluster::fence: stream sealed \
             stream=00000003 seal_seq=92 by=2",
            // Seed 205: a Released record, and the takeover sealed a live broker's stream.
            "[#2 err] 2026-12-01T10:53:34.909504Z  INFO strata_cluster::ownership: claimed \
             resource=\"r/1\" owner=2 epoch=6",
            "[#2 err] 2026-12-01T10:53:34.912623Z  INFO strata_cluster::fence: stream sealed \
             stream=00000006 seal_seq=29 by=2",
            // A broker sealing its own stream as it stops.
            "[#1 err] 2026-12-04T16:09:31.539000Z  INFO strata_log::manager: sealing this \
             broker's own write-ahead stream at shutdown stream=00000001",
            "[#1 err] 2026-12-04T16:09:31.539420Z  INFO strata_cluster::fence: stream sealed \
             stream=00000001 seal_seq=295 by=1",
            // A later life's judgement does not cover an earlier life's seal, nor the reverse.
            "[#3 err] 2026-12-01T10:54:00.000000Z  INFO strata_cluster::fence: stream sealed \
             stream=00000003 seal_seq=93 by=2",
        ]
        .map(String::from)
        .to_vec();
        let found = unjudged_seals(&lines);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("stream=00000006"));
        assert!(found[1].starts_with("[#3 "));
    }
}
