//! Command-line flags. Every knob of a run is a flag, and every flag's value is echoed into the
//! report so a number can always be traced back to how it was produced.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(
    name = "strata-bench",
    version,
    about = "Benchmarks a Strata (or any Kafka-compatible) broker with librdkafka",
    after_help = "Examples:\n  \
        strata-bench --spawn-broker --storage memory:// throughput\n  \
        strata-bench --spawn-broker --storage file:///tmp/strata-bench e2e --rate 10000 --duration 30\n  \
        strata-bench --bootstrap 127.0.0.1:9092 throughput --records 5000000 --json out.json"
)]
pub struct Cli {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Also write the results as JSON to FILE (`-` prints JSON to stdout instead of the table).
    #[arg(long, global = true, value_name = "FILE")]
    pub json: Option<PathBuf>,

    #[command(subcommand)]
    pub command: BenchCommand,
}

/// Which broker to measure, and client settings common to every benchmark.
#[derive(Debug, Args, Serialize)]
pub struct TargetArgs {
    /// Bootstrap address of a running broker (ignored with --spawn-broker).
    #[arg(long, global = true, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,

    /// Start `strata serve --listen 127.0.0.1:0` for this run, and kill it afterwards.
    #[arg(long, global = true)]
    pub spawn_broker: bool,

    /// Storage URL for the spawned broker: `memory://`, `file:///absolute/dir`, or any other
    /// URL the broker accepts (`s3://…`, `rados://…`) [default: memory://]. No default in the
    /// parser: the flag is global, so a default here also filled in the `--storage` of the
    /// benchmarks that open storage themselves (`lookup`, `restarts`), which then ignored
    /// their `--dir`.
    #[arg(long, global = true)]
    pub storage: Option<String>,

    /// The strata binary to spawn [default: `strata` next to this executable, i.e.
    /// target/release/strata].
    #[arg(long, global = true, value_name = "PATH")]
    pub strata_bin: Option<PathBuf>,

    /// An extra argument for the spawned `strata serve`; repeat for several, e.g.
    /// `--broker-arg=--config --broker-arg=strata.toml`.
    #[arg(
        long = "broker-arg",
        global = true,
        value_name = "ARG",
        allow_hyphen_values = true
    )]
    pub broker_args: Vec<String>,

    /// An environment variable for the spawned broker, KEY=VALUE; repeatable. The broker's log
    /// settings are read from STRATA_LOG_* variables, e.g. `STRATA_LOG_FLUSH_INTERVAL=2ms`.
    #[arg(long = "broker-env", global = true, value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub broker_env: Vec<(String, String)>,

    /// Write the spawned broker's output to FILE [default: kept in memory, shown if it fails].
    #[arg(long, global = true, value_name = "FILE")]
    pub broker_log: Option<PathBuf>,

    /// Pid of an already running broker (with --bootstrap), to report its CPU use.
    #[arg(long, global = true, value_name = "PID")]
    pub broker_pid: Option<u32>,

    /// A librdkafka property for every client, applied after the benchmark's own; repeatable
    /// (like kcat's -X), e.g. `-X batch.size=2000000`.
    #[arg(
        short = 'X',
        long = "client-config",
        global = true,
        value_name = "KEY=VALUE",
        value_parser = parse_key_value
    )]
    pub client_config: Vec<(String, String)>,
}

impl TargetArgs {
    /// The spawned broker's storage URL: `--storage`, or memory.
    pub fn broker_storage(&self) -> &str {
        self.storage.as_deref().unwrap_or("memory://")
    }
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Produce N records as fast as the client sends them, then consume them from the beginning.
    Throughput(ThroughputArgs),
    /// Produce at a fixed rate while consuming concurrently: end-to-end latency.
    E2e(E2eArgs),
    /// No broker: time durable writes on a directory the way the local-directory backend does
    /// them, the floor under produce latency on `file://` storage.
    Disk(DiskArgs),
    /// Start a cluster of brokers on one fresh storage directory and time partition moves and
    /// failovers under a steady acks=all producer (starts its own brokers; ignores
    /// --bootstrap and --spawn-broker).
    Migration(MigrationArgs),
    /// No broker: time reads at random old offsets in partitions of different sizes, straight
    /// on the partition log over a local directory (constant-time lookup by offset).
    Lookup(LookupArgs),
    /// No broker: what a start of the partition log costs (time, storage requests) after
    /// many starts before it on the same storage, and what the starts leave behind.
    Restarts(RestartsArgs),
    /// Broker CPU per Fetch of many partitions: sessionless full fetches against incremental
    /// fetch-session fetches (KIP-227), with no new data and with a little.
    FetchSessions(FetchSessionsArgs),
    /// One connection reading one partition with Fetch requests that honour the size limits,
    /// doing nothing with the records: how fast the broker answers one fetcher.
    FetchRate(FetchRateArgs),
    /// No broker: the headline figures of a `bench/scripts/run-suite.sh` directory in one
    /// table, and how they moved against an earlier run's directory.
    Summary(SummaryArgs),
}

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// The directory of JSON reports the suite wrote.
    pub dir: PathBuf,
    /// An earlier run's directory: each figure also shows its change against it.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Every run and phase as one Markdown table (the form docs/BENCHMARKS.md's tables take),
    /// repeats not merged.
    #[arg(long)]
    pub markdown: bool,
}

#[derive(Debug, Args, Serialize)]
pub struct FetchRateArgs {
    /// Records produced, then read back.
    #[arg(long, default_value_t = 3_000_000)]
    pub records: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 100)]
    pub record_size: usize,
    /// Records per produced batch.
    #[arg(long, default_value_t = 9_000)]
    pub records_per_batch: usize,
    /// The Fetch's `partition_max_bytes` (librdkafka's `max.partition.fetch.bytes`).
    #[arg(long, default_value_t = 1 << 20)]
    pub partition_max_bytes: usize,
    /// The Fetch's `max_bytes` (librdkafka's `fetch.max.bytes`).
    #[arg(long, default_value_t = 52_428_800)]
    pub max_bytes: usize,
}

#[derive(Debug, Args, Serialize)]
pub struct FetchSessionsArgs {
    /// Partitions of the (fresh) topic, all fetched by every request.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub partitions: i32,
    /// Fetch requests timed per phase.
    #[arg(long, default_value_t = 2000)]
    pub fetches: usize,
    /// Partitions given one new record before each fetch in the `-low` phases.
    #[arg(long, default_value_t = 10)]
    pub changed: usize,
}

/// The topic and records, common to both benchmarks.
#[derive(Debug, Args, Serialize)]
pub struct WorkloadArgs {
    /// Topic to create [default: a fresh `strata-bench-<pid>-<time>`]. It must not exist.
    #[arg(long)]
    pub topic: Option<String>,

    /// Partitions of the topic.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub partitions: i32,

    /// Payload bytes per record (no key, no headers).
    #[arg(long, default_value_t = 100)]
    pub record_size: usize,

    /// Producer `acks`.
    #[arg(long, default_value = "all", value_parser = ["all", "-1", "0", "1"])]
    pub acks: String,

    /// How records are spread over partitions.
    #[arg(long, value_enum, default_value_t = Partitioning::Sticky)]
    pub partitioning: Partitioning,

    /// Give up on a phase that has not finished after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,

    /// A config of the created topic, `NAME=VALUE` (repeatable), e.g.
    /// `local.retention.ms=-1` to keep its compacted segments on the write-ahead tier.
    #[arg(long = "topic-config", value_name = "NAME=VALUE", value_parser = parse_topic_config)]
    pub topic_configs: Vec<(String, String)>,
}

fn parse_topic_config(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
    Ok((name.trim().to_string(), value.trim().to_string()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Partitioning {
    /// No partition given: librdkafka's default partitioner, which sends key-less records to one
    /// partition at a time (`sticky.partitioning.linger.ms`) — what an application gets.
    Sticky,
    /// Record i goes to partition i mod P: every partition gets a batch in every request.
    RoundRobin,
}

#[derive(Debug, Args, Serialize)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,

    /// Records to produce.
    #[arg(long, short = 'n', default_value_t = 2_000_000)]
    pub records: u64,

    /// Producer `linger.ms`.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u32,

    /// Only produce; skip the consume phase.
    #[arg(long)]
    pub no_consume: bool,

    /// Seconds to wait between producing and consuming. With a short `segment_interval` and a
    /// small `cache_bytes` on the broker, the wait lets compaction move the records into
    /// segments, so the consume phase measures catch-up reads from storage (the bulk tier, with
    /// two tiers) instead of the tail cache.
    #[arg(long, default_value_t = 0.0)]
    pub consume_after: f64,
}

#[derive(Debug, Args, Serialize)]
pub struct E2eArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,

    /// Records per second to produce (paced, not bursty: record i is due at i/RATE seconds).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: u64,

    /// Seconds to produce for.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,

    /// Seconds at the start whose records are delivered and counted but left out of the latency
    /// percentiles (connection set-up, the consumer's first fetch, allocator warm-up).
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,

    /// Producer `linger.ms`. Lower than the throughput default because linger is a delay the
    /// client adds to every record on purpose; 1 ms keeps some batching at 10k records/s.
    #[arg(long, default_value_t = 1)]
    pub linger_ms: u32,

    /// Producers, each its own librdkafka client and thread, sharing the rate.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub producers: u32,

    /// Consumers, each its own librdkafka client and thread. More than one share the partitions
    /// in one consumer group (subscribe); one assigns itself every partition unless
    /// `--subscribe`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub consumers: u32,

    /// One consumer joins a consumer group and subscribes instead of assigning itself the
    /// partitions.
    #[arg(long)]
    pub subscribe: bool,

    /// An existing topic that one more consumer reads from its beginning, as fast as it can,
    /// while the timed run goes on: a reader that fell behind, replaying old data beside the
    /// consumers at the tail (issue 19, item 4). Its read rate is reported as its own phase.
    #[arg(long)]
    pub catch_up_topic: Option<String>,

    /// Print, per second of send time (UTC, to line up with the broker's log), the records
    /// received, how many took over 5 ms end to end, and the slowest: which moments make the
    /// tail.
    #[arg(long)]
    pub timeline: bool,

    /// Stop the broker (SIGSTOP) this many seconds into the run, for `--pause-broker-ms`, then
    /// let it go on (SIGCONT): a stall that lets a backlog form, to show whether it drains.
    /// Needs the broker's pid (`--spawn-broker` or `--broker-pid`).
    #[arg(long, requires = "pause_broker_ms")]
    pub pause_broker_at: Option<f64>,

    /// How long `--pause-broker-at` stops the broker, in milliseconds.
    #[arg(long, requires = "pause_broker_at")]
    pub pause_broker_ms: Option<u64>,
}

#[derive(Debug, Args, Serialize)]
pub struct MigrationArgs {
    /// Brokers to start (node ids 1..=N).
    #[arg(long, default_value_t = 2)]
    pub brokers: usize,
    /// Partition sizes to measure, each on its own 1-partition topic filled before the moves
    /// (e.g. `10MB,1GB`; suffixes KB, MB, GB are powers of 1000).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "10MB")]
    pub partition_bytes: Vec<u64>,
    /// Moves per size, alternating the target broker.
    #[arg(long, default_value_t = 50)]
    pub migrations: usize,
    /// SIGKILLs of the owner per size (the killed broker is restarted between them).
    #[arg(long, default_value_t = 3)]
    pub failovers: usize,
    /// Passed to every broker as --lease-period (failover time is about this).
    #[arg(long, default_value = "2s")]
    pub lease_period: String,
    /// Passed to every broker as --heartbeat-interval.
    #[arg(long, default_value = "200ms")]
    pub heartbeat_interval: String,
    /// The probe producer sends one small acks=all record this often.
    #[arg(long, default_value_t = 2)]
    pub send_interval_ms: u64,
    /// Probe records per second instead of one every `--send-interval-ms` (paced against a
    /// schedule, so the rate holds even when one send is late; e.g. 2000 for issue 19's run).
    #[arg(long)]
    pub probe_rate: Option<u64>,
    /// Print one line per move (broker-side time, client time, longest acknowledgement gap,
    /// the probe's largest produce latency around the move) instead of only the summary.
    #[arg(long)]
    pub per_move: bool,
    /// Pause between two moves.
    #[arg(long, default_value_t = 200)]
    pub pause_ms: u64,
    /// Storage directory [default: a fresh directory under the temp dir, deleted afterwards].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Write the probe producer's librdkafka debug log (broker, topic, msg, metadata) here,
    /// each line with its time since the run's origin, to explain slow samples.
    #[arg(long)]
    pub client_log: Option<PathBuf>,
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    let upper = text.trim().to_ascii_uppercase();
    let (number, unit) = match upper.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => upper.split_at(i),
        None => (upper.as_str(), ""),
    };
    let scale = match unit {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(format!("{text:?}: use a number with B, KB, MB or GB")),
    };
    number
        .parse::<u64>()
        .map(|n| n * scale)
        .map_err(|e| format!("{text:?}: {e}"))
}

#[derive(Debug, Args, Serialize)]
pub struct DiskArgs {
    /// Directory to write in (a subdirectory is created and removed); put it on the disk the
    /// broker's `file://` storage uses.
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,

    /// Writes to time.
    #[arg(long, default_value_t = 2000)]
    pub writes: u64,

    /// Bytes per write (about one group commit: linger-sized batches of several partitions).
    #[arg(long, default_value_t = 262_144)]
    pub size: usize,

    /// Writers at once (the broker keeps up to `max_inflight_flushes`, default 4, in flight).
    #[arg(long, default_value_t = 1)]
    pub parallel: u64,

    /// How each write is made durable.
    #[arg(long, value_enum, default_value_t = DiskMode::Publish)]
    pub mode: DiskMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskMode {
    /// As the local-directory backend publishes an object: temp file, fsync, link, unlink the
    /// temp name, fsync the directory (two fsyncs).
    Publish,
    /// The same without the directory fsync: what the second fsync costs (not crash-safe).
    PublishNoDirSync,
    /// Overwrite a slot of one preallocated, already-written file and `fdatasync` it: one
    /// flush, no metadata — the cheapest durable write a journal file could make.
    Overwrite,
    /// Publish a reused file without emptying it first: rename an already-written file to the
    /// temp name, overwrite it in place, `fdatasync`, link, unlink the temp name, fsync the
    /// directory. The file keeps its blocks, so the flush has no allocation to write.
    PublishReused,
    /// Not a raw-file probe: `--writes` objects of `--size` bytes put into one directory
    /// through the local backend's own store (untimed), then deleted `--parallel` at a time
    /// and timed, as compaction deletes the write-ahead objects it folded into segments. CPU
    /// per delete is what matters here.
    StoreDelete,
}

#[derive(Debug, Args, Serialize)]
pub struct LookupArgs {
    /// Partition sizes, each in a fresh log (e.g. `10MB,1GB`; KB, MB, GB are powers of 1000).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "10MB,1GB")]
    pub partition_bytes: Vec<u64>,
    /// Partition sizes in records instead (e.g. `10000,1000000,100000000`).
    #[arg(long, value_delimiter = ',')]
    pub records: Vec<u64>,
    /// Reads to time per size.
    #[arg(long, default_value_t = 2000)]
    pub reads: usize,
    /// The log is closed and opened again every this many reads (cold log memory).
    #[arg(long, default_value_t = 20)]
    pub reads_per_open: usize,
    #[arg(long, default_value_t = 10)]
    pub records_per_batch: usize,
    #[arg(long, default_value_t = 100)]
    pub record_bytes: usize,
    /// Where the logs are written (a subdirectory per size, removed afterwards).
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// Any storage URL instead of `--dir` (e.g. `rados://POOL?conf=...&user=admin`, with the
    /// `rados` feature): each size gets a fresh path segment under it (a RADOS namespace, an
    /// S3 prefix), emptied afterwards.
    #[arg(long)]
    pub storage: Option<String>,
    /// Keep each size's partition stored until every size is measured (normally each is
    /// deleted after its reads): listing a size again after a larger one (`--records
    /// 1000000,100000000,1000000`) then tells the storage's growth with all it holds from
    /// the partition's own.
    #[arg(long)]
    pub keep_until_end: bool,
    /// Fill every size first, then read them in turns (`--reads-per-open` reads of each size
    /// in a round, round after round), so that the storage's drift over the run — a pool
    /// that slows as it fills, neighbours that come and go — falls on every size alike
    /// instead of on whichever was measured last. Keeps every size stored until the end.
    #[arg(long)]
    pub interleave: bool,
}

#[derive(Debug, Args)]
pub struct RestartsArgs {
    /// Starts of the log, one after another, on one store.
    #[arg(long, default_value_t = 300)]
    pub starts: usize,
    /// The starts to report (the last is always reported).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,10,50,100,200")]
    pub report_at: Vec<usize>,
    /// Where the log is written (a fresh subdirectory, removed afterwards).
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// Any storage URL instead of `--dir` (e.g. `rados://POOL?conf=...&user=admin`, with the
    /// `rados` feature): the run gets a fresh path segment under it (a RADOS namespace, an S3
    /// prefix), emptied afterwards.
    #[arg(long)]
    pub storage: Option<String>,
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected KEY=VALUE, got `{text}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "strata-bench",
            "--spawn-broker",
            "--broker-arg=--config",
            "--broker-arg",
            "strata.toml",
            "-X",
            "batch.size=1000",
            "e2e",
            "--rate",
            "500",
        ])
        .unwrap();
        assert!(cli.target.spawn_broker);
        assert_eq!(cli.target.broker_args, ["--config", "strata.toml"]);
        assert_eq!(
            cli.target.client_config,
            [("batch.size".to_string(), "1000".to_string())]
        );
        let BenchCommand::E2e(e2e) = cli.command else {
            panic!("expected e2e");
        };
        assert_eq!(e2e.rate, 500);
        assert_eq!(e2e.workload.record_size, 100);
    }

    /// `lookup` and `restarts` take their own `--storage`, not the spawned broker's (whose
    /// default, `memory://`, used to stand in for theirs, so `--dir` was never used).
    #[test]
    fn log_benchmarks_default_to_a_directory() {
        for command in ["lookup", "restarts"] {
            let cli = Cli::try_parse_from(["strata-bench", command]).unwrap();
            let storage = match cli.command {
                BenchCommand::Lookup(args) => args.storage,
                BenchCommand::Restarts(args) => args.storage,
                _ => panic!("expected {command}"),
            };
            assert_eq!(storage, None, "{command}");
        }
        let cli =
            Cli::try_parse_from(["strata-bench", "restarts", "--storage", "file:///x"]).unwrap();
        let BenchCommand::Restarts(args) = cli.command else {
            panic!("expected restarts");
        };
        assert_eq!(args.storage.as_deref(), Some("file:///x"));
    }

    #[test]
    fn key_value_needs_an_equals_sign() {
        assert!(parse_key_value("linger.ms").is_err());
        assert_eq!(
            parse_key_value("a=b=c"),
            Ok(("a".to_string(), "b=c".to_string()))
        );
    }
}
