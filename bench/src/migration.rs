//! `migration`: how long a partition is unavailable while it moves between brokers of a
//! cluster, and while a dead owner's partition is taken over.
//!
//! Starts `--brokers` `strata serve --cluster true` processes on one fresh storage directory,
//! and for each `--partition-bytes` size creates a 1-partition topic, fills it with large
//! batches (acks=1), then runs `--migrations` moves, alternating the target broker, while a
//! producer sends a small acks=all record every `--send-interval-ms`. A move is what
//! `strata partitions move` does: the placement override is written to storage directly (no
//! broker is asked); the unavailability of one move is the time from just before that write
//! until the first acknowledged produce that landed on the new owner. Failover: SIGKILL the
//! owner, time until the first acknowledged produce on the survivor, restart the killed broker.
//!
//! "Landed on the new owner": a poller re-reads the partition's ownership record every
//! millisecond; the first acknowledgement received after the poller saw the target hold the
//! partition Active at a higher epoch counts. The old owner acknowledges nothing after it
//! stopped appending, which comes before its release and so before that claim. The poller's
//! lag can only delay the sample, by at most one poll plus one send interval.
//!
//! Brokers never talk to each other by design; the run checks it with `ss -tnp`: no broker
//! process may hold a TCP connection to another broker's listening port.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use strata_cluster::admin;
use strata_cluster::{OwnerRecord, OwnerState};
use strata_core::BrokerId;
use strata_storage::{ObjectStore, StoreRegistry};

use crate::broker::{self, SpawnedBroker};
use crate::cli::{MigrationArgs, TargetArgs};
use crate::clients::{base_config, create_topic};
use crate::clock;
use crate::system;

/// How often the ownership record is re-read while waiting for a move or a takeover.
const OWNER_POLL: Duration = Duration::from_millis(1);
/// A move or takeover that has not completed after this long fails the run.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Acknowledgement times of the probe producer, as nanoseconds since the run's origin.
#[derive(Clone)]
struct Acks {
    origin: Instant,
    acked_ns: Arc<Mutex<Vec<u64>>>,
    /// (acknowledged at, produce latency) of every acknowledged record, ns.
    latency_ns: Arc<Mutex<Vec<(u64, u64)>>>,
    failed: Arc<Mutex<u64>>,
    /// librdkafka's own log, when asked for (`--client-log`).
    client_log: Option<Arc<Mutex<std::fs::File>>>,
}

impl ClientContext for Acks {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        if let Some(file) = &self.client_log {
            use std::io::Write;
            let at = clock::nanos_since(self.origin) as f64 / 1e6;
            let _ = writeln!(lock(file), "{at:.3} {level:?} {fac} {log_message}");
        }
    }
}

/// One move, in nanoseconds since the run's origin: the override written, the target seen
/// holding the partition, the first acknowledgement after that.
struct Move {
    started: u64,
    claimed: u64,
    acked: u64,
    /// The longest wait between two consecutive acknowledgements from the last one before
    /// `started` to `acked`: how long the producer really went without one (the old owner
    /// keeps acknowledging while it prepares, until it stops accepting).
    gap: u64,
    /// The probe's largest produce latency among records acknowledged from `started` until
    /// the next move starts.
    max_latency: u64,
}

impl Move {
    fn total_ms(&self) -> f64 {
        (self.acked - self.started) as f64 / 1e6
    }

    fn gap_ms(&self) -> f64 {
        self.gap as f64 / 1e6
    }
}

/// The longest interval between consecutive acknowledgements covering `[from, to]`.
fn longest_ack_gap(acks: &Acks, from: u64, to: u64) -> u64 {
    let acked = lock(&acks.acked_ns);
    let mut times: Vec<u64> = acked.iter().copied().filter(|t| *t <= to).collect();
    times.sort_unstable();
    let first = times.partition_point(|t| *t < from).saturating_sub(1);
    times[first..]
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(to.saturating_sub(from))
}

impl ProducerContext for Acks {
    /// When the record was handed to the client, ns since the origin.
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Self::DeliveryOpaque) {
        let now = clock::nanos_since(self.origin);
        match result {
            Ok(_) => {
                lock(&self.acked_ns).push(now);
                lock(&self.latency_ns).push((now, now.saturating_sub(*sent)));
            }
            Err(_) => *lock(&self.failed) += 1,
        }
    }
}

/// The largest produce latency (send to acknowledgement) of records acknowledged in
/// `[from, to)`: what a producer saw of a move, however the client retried meanwhile.
fn max_latency_acked_in(acks: &Acks, from: u64, to: u64) -> u64 {
    lock(&acks.latency_ns)
        .iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|(_, l)| *l)
        .max()
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(e) => e.into_inner(),
    }
}

/// The brokers of the cluster under test, by node id (index + 1).
struct Cluster {
    bin: PathBuf,
    storage: String,
    args: Vec<String>,
    brokers: Vec<Option<SpawnedBroker>>,
}

impl Cluster {
    fn start_broker(&mut self, index: usize, target: &TargetArgs) -> Result<()> {
        let mut args = vec![
            "--cluster".to_string(),
            "true".to_string(),
            "--node-id".to_string(),
            (index + 1).to_string(),
        ];
        args.extend(self.args.iter().cloned());
        let log = target
            .broker_log
            .as_ref()
            .map(|p| p.with_extension(format!("{}.log", index + 1)));
        let broker = SpawnedBroker::start(
            &self.bin,
            &self.storage,
            &args,
            &target.broker_env,
            log.as_deref(),
        )?;
        eprintln!(
            "broker {} (pid {}) listening at {}",
            index + 1,
            broker.pid(),
            broker.bootstrap()
        );
        self.brokers[index] = Some(broker);
        Ok(())
    }

    fn bootstrap(&self) -> String {
        self.brokers
            .iter()
            .flatten()
            .map(|b| b.bootstrap().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Percentiles over one set of unavailability samples, in milliseconds.
fn summary(name: &str, samples: &mut [f64]) -> String {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i]
    };
    if samples.is_empty() {
        return format!("{name:>14}  no samples");
    }
    format!(
        "{name:>14}  n={:<4} p50={:>8.1} ms  p99={:>8.1} ms  max={:>8.1} ms  min={:>6.1} ms",
        samples.len(),
        at(0.5),
        at(0.99),
        samples[samples.len() - 1],
        samples[0],
    )
}

pub fn run(target: &TargetArgs, args: &MigrationArgs) -> Result<()> {
    let load_before = system::load_average();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("build a tokio runtime")?;
    let dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("strata-migration-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let storage = format!("file://{}", dir.display());
    let store: Arc<dyn ObjectStore> = StoreRegistry::with_builtins()
        .open(&storage)
        .with_context(|| format!("open {storage}"))?;
    let bin = match &target.strata_bin {
        Some(bin) => bin.clone(),
        None => broker::default_binary()?,
    };
    let mut broker_args = vec![
        "--lease-period".to_string(),
        args.lease_period.clone(),
        "--heartbeat-interval".to_string(),
        args.heartbeat_interval.clone(),
    ];
    broker_args.extend(target.broker_args.iter().cloned());
    let mut cluster = Cluster {
        bin,
        storage: storage.clone(),
        args: broker_args,
        brokers: (0..args.brokers).map(|_| None).collect(),
    };
    for i in 0..args.brokers {
        cluster.start_broker(i, target)?;
    }
    // Every broker must be a placement target before moves start (a newcomer settles first).
    std::thread::sleep(Duration::from_secs(3));

    let mut report = Vec::new();
    let mut peer_checks = 0usize;
    let mut peer_connections = Vec::new();
    for &bytes in &args.partition_bytes {
        let topic = format!("migration-{}-{bytes}", std::process::id());
        create_topic(&cluster.bootstrap(), target, &topic, 1, &[])?;
        let resource = runtime
            .block_on(admin::partition_resource(store.as_ref(), &topic, 0))
            .context("resolve the partition's resource name")?;
        let filled = fill(&cluster.bootstrap(), target, &topic, bytes)?;
        eprintln!(
            "{topic}: filled {} MB in {:.1} s",
            bytes / 1_000_000,
            filled.as_secs_f64()
        );

        let origin = clock::now();
        let client_log = match &args.client_log {
            Some(path) => Some(Arc::new(Mutex::new(
                std::fs::File::create(path)
                    .with_context(|| format!("create {}", path.display()))?,
            ))),
            None => None,
        };
        let acks = Acks {
            origin,
            acked_ns: Arc::default(),
            latency_ns: Arc::default(),
            failed: Arc::default(),
            client_log,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let probe = spawn_probe(&cluster.bootstrap(), target, args, &topic, &acks, &stop)?;
        std::thread::sleep(Duration::from_millis(500));

        let mut samples = Vec::new();
        for m in 0..args.migrations {
            let before = current_owner(&runtime, &store, &resource)?;
            let to = BrokerId(((before.owner.0 as usize) % args.brokers + 1) as i32);
            let started = clock::nanos_since(origin);
            runtime.block_on(admin::set_placement(Arc::clone(&store), &resource, to))?;
            let claimed = wait_for_owner(&runtime, &store, &resource, origin, |r| {
                r.owner == to && r.state == OwnerState::Active && r.epoch > before.epoch
            })?;
            let acked = first_ack_after(&acks, claimed)?;
            samples.push(Move {
                started,
                claimed,
                acked,
                gap: longest_ack_gap(&acks, started, acked),
                max_latency: 0,
            });
            if m % 10 == 0 {
                peer_checks += 1;
                peer_connections.extend(broker_to_broker_connections(&cluster)?);
            }
            // Let the producer settle on the new owner before the next move.
            std::thread::sleep(Duration::from_millis(args.pause_ms));
        }
        // Each move's window ends where the next one starts (the last one's at the pause).
        let ends: Vec<u64> = samples
            .iter()
            .skip(1)
            .map(|m| m.started)
            .chain(std::iter::once(clock::nanos_since(origin)))
            .collect();
        for (m, end) in samples.iter_mut().zip(ends) {
            m.max_latency = max_latency_acked_in(&acks, m.started, end);
        }
        let mut failovers = Vec::new();
        for _ in 0..args.failovers {
            let before = current_owner(&runtime, &store, &resource)?;
            let victim = (before.owner.0 - 1) as usize;
            let started = clock::nanos_since(origin);
            cluster.brokers[victim] = None; // SIGKILL (Drop kills the child)
            let claimed = wait_for_owner(&runtime, &store, &resource, origin, |r| {
                r.owner != before.owner && r.state == OwnerState::Active && r.epoch > before.epoch
            })?;
            let acked = first_ack_after(&acks, claimed)?;
            failovers.push((acked - started) as f64 / 1e6);
            // Restarted, the broker joins again; the override brings the partition back to it
            // (a graceful move), which the next repetition waits for.
            cluster.start_broker(victim, target)?;
            wait_for_owner(&runtime, &store, &resource, origin, |r| {
                r.owner == before.owner && r.state == OwnerState::Active
            })?;
            std::thread::sleep(Duration::from_millis(500));
        }
        stop.store(true, Ordering::Relaxed);
        let failed = probe
            .join()
            .map_err(|_| anyhow::anyhow!("probe panicked"))??;
        let failed_deliveries = *lock(&acks.failed) + failed;
        let mut all: Vec<f64> = lock(&acks.latency_ns)
            .iter()
            .map(|(_, l)| *l as f64 / 1e6)
            .collect();
        let run_latency = summary("probe latency", &mut all);
        report.push((bytes, samples, failovers, failed_deliveries, run_latency));
    }
    let load_after = system::load_average();

    println!(
        "migration: {} brokers, storage {storage}, lease {}, heartbeat {}, probe {} (acks=all), {} ms between moves",
        args.brokers,
        args.lease_period,
        args.heartbeat_interval,
        match args.probe_rate {
            Some(rate) => format!("{rate} records/s"),
            None => format!("every {} ms", args.send_interval_ms),
        },
        args.pause_ms
    );
    println!("load average before {load_before:?}, after {load_after:?}");
    for (bytes, moves, failovers, failed, run_latency) in &mut report {
        println!("partition {} MB:", *bytes / 1_000_000);
        if args.per_move {
            for (i, m) in moves.iter().enumerate() {
                println!(
                    "  move {:>3} at {:>8.3} s: broker {:>7.1} ms  client {:>6.1} ms  ack gap {:>6.1} ms  max produce latency {:>6.1} ms",
                    i + 1,
                    m.started as f64 / 1e9,
                    (m.claimed - m.started) as f64 / 1e6,
                    (m.acked - m.claimed) as f64 / 1e6,
                    m.gap_ms(),
                    m.max_latency as f64 / 1e6
                );
            }
        }
        let mut samples: Vec<f64> = moves.iter().map(Move::total_ms).collect();
        println!("{}", summary("migration", &mut samples));
        let mut gaps: Vec<f64> = moves.iter().map(Move::gap_ms).collect();
        println!("{}", summary("unavailable", &mut gaps));
        let mut handovers: Vec<f64> = moves
            .iter()
            .map(|m| (m.claimed - m.started) as f64 / 1e6)
            .collect();
        println!("{}", summary("broker-side", &mut handovers));
        let mut latencies: Vec<f64> = moves.iter().map(|m| m.max_latency as f64 / 1e6).collect();
        println!("{}", summary("max latency", &mut latencies));
        println!("{run_latency}");
        // Where the slowest moves spent their time: the brokers' handover (override written
        // until the target holds the partition) or the client finding the new owner.
        moves.sort_by(|a, b| b.total_ms().total_cmp(&a.total_ms()));
        for m in moves.iter().take(3) {
            println!(
                "  slow move at {:.3} s: {:.1} ms = handover {:.1} ms + client {:.1} ms; longest ack gap {:.1} ms",
                m.started as f64 / 1e9,
                m.total_ms(),
                (m.claimed - m.started) as f64 / 1e6,
                (m.acked - m.claimed) as f64 / 1e6,
                m.gap_ms()
            );
        }
        println!("{}", summary("failover", failovers));
        println!("  failed deliveries: {failed}");
        println!(
            "  failover samples (ms): {:?}",
            failovers
                .iter()
                .map(|v| v.round() as i64)
                .collect::<Vec<_>>()
        );
    }
    println!(
        "broker-to-broker TCP connections seen in {peer_checks} `ss -tnp` checks: {}",
        if peer_connections.is_empty() {
            "none (0 bytes between brokers)".to_string()
        } else {
            peer_connections.join("; ")
        }
    );
    drop(cluster);
    if args.data_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn current_owner(
    runtime: &tokio::runtime::Runtime,
    store: &Arc<dyn ObjectStore>,
    resource: &str,
) -> Result<OwnerRecord> {
    runtime
        .block_on(admin::owner(Arc::clone(store), resource))?
        .context("the partition has no owner")
}

/// Polls the ownership record until `done`; returns when that was seen (ns since `origin`).
fn wait_for_owner(
    runtime: &tokio::runtime::Runtime,
    store: &Arc<dyn ObjectStore>,
    resource: &str,
    origin: Instant,
    done: impl Fn(&OwnerRecord) -> bool,
) -> Result<u64> {
    let deadline = clock::now() + STEP_TIMEOUT;
    loop {
        if let Some(record) = runtime.block_on(admin::owner(Arc::clone(store), resource))? {
            if done(&record) {
                return Ok(clock::nanos_since(origin));
            }
        }
        if clock::remaining(deadline).is_zero() {
            bail!("{resource}: the expected owner did not appear within {STEP_TIMEOUT:?}");
        }
        std::thread::sleep(OWNER_POLL);
    }
}

/// The first acknowledgement received at or after `after_ns`.
fn first_ack_after(acks: &Acks, after_ns: u64) -> Result<u64> {
    let deadline = clock::now() + STEP_TIMEOUT;
    loop {
        if let Some(t) = lock(&acks.acked_ns)
            .iter()
            .rev()
            .take_while(|t| **t >= after_ns)
            .last()
        {
            return Ok(*t);
        }
        if clock::remaining(deadline).is_zero() {
            bail!("no produce was acknowledged within {STEP_TIMEOUT:?} of the new owner's claim");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Fills `topic` with about `bytes` of 64 KiB records, acks=1, large batches.
fn fill(bootstrap: &str, target: &TargetArgs, topic: &str, bytes: u64) -> Result<Duration> {
    const RECORD: usize = 64 * 1024;
    let mut config = base_config(bootstrap, target);
    config
        .set("acks", "1")
        .set("linger.ms", "20")
        .set("batch.size", "4000000")
        .set("queue.buffering.max.kbytes", "1048576");
    let acks = Acks {
        origin: clock::now(),
        acked_ns: Arc::default(),
        latency_ns: Arc::default(),
        failed: Arc::default(),
        client_log: None,
    };
    let producer: ThreadedProducer<Acks> = config.create_with_context(acks.clone())?;
    let payload = vec![0x5au8; RECORD];
    let started = clock::now();
    let count = bytes.div_ceil(RECORD as u64);
    for _ in 0..count {
        let mut record = BaseRecord::<(), [u8], Box<u64>>::with_opaque_to(topic, Box::new(0))
            .payload(&payload[..]);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(600))
        .context("fill: flush")?;
    let failed = *lock(&acks.failed);
    if failed > 0 {
        bail!("fill: {failed} records were not acknowledged");
    }
    Ok(clock::now().saturating_duration_since(started))
}

/// The probe: one small acks=all record every `send_interval_ms`, retried across moves.
/// Retry back-off and metadata refresh are set short so the client's own timers do not hide
/// the broker's handover time (librdkafka waits 100 ms by default).
fn spawn_probe(
    bootstrap: &str,
    target: &TargetArgs,
    args: &MigrationArgs,
    topic: &str,
    acks: &Acks,
    stop: &Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Result<u64>>> {
    let mut config: ClientConfig = base_config(bootstrap, target);
    config
        .set("acks", "all")
        .set("linger.ms", "0")
        .set("retries", "1000000")
        .set("retry.backoff.ms", "2")
        .set("retry.backoff.max.ms", "10")
        .set("topic.metadata.refresh.fast.interval.ms", "2")
        .set("message.timeout.ms", "60000");
    if acks.client_log.is_some() {
        config.set("debug", "broker,topic,msg,metadata");
    }
    let producer: ThreadedProducer<Acks> = config.create_with_context(acks.clone())?;
    let topic = topic.to_string();
    let stop = Arc::clone(stop);
    let interval = match args.probe_rate {
        Some(rate) => Duration::from_nanos(1_000_000_000 / rate.max(1)),
        None => Duration::from_millis(args.send_interval_ms),
    };
    let origin = acks.origin;
    Ok(std::thread::spawn(move || {
        let payload = [0u8; 100];
        let mut refused = 0u64;
        // Paced against a schedule: sleeping a fixed interval after each send would lower the
        // rate by however long each send and wake-up took.
        let start = clock::now();
        let mut sent = 0u32;
        while !stop.load(Ordering::Relaxed) {
            let opaque = Box::new(clock::nanos_since(origin));
            let record = BaseRecord::<(), [u8], Box<u64>>::with_opaque_to(&topic, opaque)
                .payload(&payload[..]);
            if producer.send(record).is_err() {
                refused += 1;
            }
            sent = sent.saturating_add(1);
            let next = start + interval * sent;
            std::thread::sleep(clock::remaining(next));
        }
        let _ = producer.flush(Duration::from_secs(30));
        Ok(refused)
    }))
}

/// TCP connections a broker process holds to another broker's listening port (`ss -tnp`).
fn broker_to_broker_connections(cluster: &Cluster) -> Result<Vec<String>> {
    let brokers: Vec<(u32, String)> = cluster
        .brokers
        .iter()
        .flatten()
        .map(|b| (b.pid(), b.bootstrap().to_string()))
        .collect();
    let ports: BTreeSet<&str> = brokers
        .iter()
        .filter_map(|(_, addr)| addr.rsplit_once(':').map(|(_, p)| p))
        .collect();
    let output = std::process::Command::new("ss")
        .args(["-tnp"])
        .output()
        .context("run ss -tnp")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut found = Vec::new();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(peer), Some(process)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let peer_port = peer.rsplit_once(':').map(|(_, p)| p).unwrap_or("");
        let by_broker = brokers
            .iter()
            .any(|(pid, _)| process.contains(&format!("pid={pid},")));
        if by_broker && ports.contains(peer_port) {
            found.push(line.to_string());
        }
    }
    Ok(found)
}
