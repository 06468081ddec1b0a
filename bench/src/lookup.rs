//! `lookup`: a read at an arbitrary old offset costs the same whatever the partition's size.
//!
//! No broker and no client: this measures the partition log itself (`strata-log`, on the
//! local-directory backend by default or on any storage URL with `--storage`, e.g. a RADOS
//! pool when built with the `rados` feature), which is where the promise lives — fixed-size index entries in
//! chunk objects that cover fixed offset ranges, so finding an offset is one computed chunk
//! read plus one ranged segment read, never a scan or a search over the partition.
//!
//! For each size it fills a fresh 1-partition log with uncompressed batches (`--records-per-
//! batch` records of `--record-bytes`), shuts it down (which compacts everything into segments
//! and index chunks), and then times single reads (`read(offset, 1 byte, at least one batch)`)
//! at random offsets. Every `--reads-per-open` reads the log is closed and opened again, so
//! each group starts with no index chunk and no data in the log's own memory (the operating
//! system's page cache is not dropped: that needs root, and is reported as a condition).
//!
//! The reads go through a [`MetricsStore`], so each size also reports the storage requests a
//! read made and the time spent in them, apart from the time spent outside them: a lookup
//! that stays constant in requests and in its own time, while the storage's answers slow
//! with the pool's size, tells the storage's cost from the log's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use strata_core::{BrokerId, Offset, SystemClock, TopicPartition};
use strata_log::{Acks, LogConfig, LogManager};
use strata_storage::{MetricsStore, ObjectStore, OpKind, StorageMetrics};
use strata_wire::builder::{build_batch, SimpleRecord};

use crate::cli::LookupArgs;
use crate::clock;
use crate::scratch;
use crate::system;

/// Appends waited for together: enough to keep the group commit busy.
const PIPELINE: usize = 256;

pub fn run(args: &LookupArgs) -> Result<()> {
    anyhow::ensure!(
        args.reads_per_open > 0,
        "--reads-per-open must be at least 1"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("build a tokio runtime")?;
    let load_before = system::load_average();
    let mut rows = Vec::new();
    // `--records` names the sizes in records; otherwise `--partition-bytes` in bytes.
    let sizes: Vec<Size> = if args.records.is_empty() {
        args.partition_bytes
            .iter()
            .map(|&b| Size::Bytes(b))
            .collect()
    } else {
        args.records.iter().map(|&r| Size::Records(r)).collect()
    };
    if args.interleave {
        // Every size stored first, then read round by round: the storage's drift over the
        // run lands on every size alike.
        let mut sizes_read = Vec::new();
        for (i, size) in sizes.into_iter().enumerate() {
            let filled = runtime.block_on(fill(args, i, size))?;
            sizes_read.push((filled, Meter::new(size)?));
        }
        while sizes_read.iter().any(|(_, meter)| meter.done < args.reads) {
            for (filled, meter) in &mut sizes_read {
                runtime.block_on(read_some(args, filled, meter))?;
            }
        }
        for (filled, meter) in sizes_read {
            rows.push(meter.row(&filled));
            runtime.block_on(filled.scratch.remove())?;
        }
    } else {
        let mut kept = Vec::new();
        for (i, size) in sizes.into_iter().enumerate() {
            let filled = runtime.block_on(fill(args, i, size))?;
            let mut meter = Meter::new(size)?;
            while meter.done < args.reads {
                runtime.block_on(read_some(args, &filled, &mut meter))?;
            }
            rows.push(meter.row(&filled));
            if args.keep_until_end {
                kept.push(filled.scratch);
            } else {
                runtime.block_on(filled.scratch.remove())?;
            }
        }
        for scratch in kept {
            runtime.block_on(scratch.remove())?;
        }
    }
    println!(
        "lookup: {} reads per size at random offsets, log reopened every {} reads (cold log \
         memory, warm OS page cache), batches of {} records x {} bytes",
        args.reads, args.reads_per_open, args.records_per_batch, args.record_bytes
    );
    println!(
        "load average before {load_before:?}, after {:?}",
        system::load_average()
    );
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

/// A partition's size, in stored bytes or in records.
#[derive(Debug, Clone, Copy)]
enum Size {
    Bytes(u64),
    Records(u64),
}

/// One size's storage, removed once measured (or at the end, `--keep-until-end`).
struct Scratch {
    store: Arc<dyn ObjectStore>,
    dir: Option<std::path::PathBuf>,
}

impl Scratch {
    async fn remove(self) -> Result<()> {
        match self.dir {
            Some(dir) => {
                let _ = std::fs::remove_dir_all(&dir);
                Ok(())
            }
            None => scratch::delete_all(&self.store).await,
        }
    }
}

/// One size, stored and compacted, ready to be read.
struct Filled {
    scratch: Scratch,
    /// The same storage, through a meter that counts the reads' requests.
    metered: Arc<dyn ObjectStore>,
    metrics: Arc<StorageMetrics>,
    tp: TopicPartition,
    stored_bytes: u64,
    fill: Duration,
}

/// Fills a fresh one-partition log to `size`, then shuts it down (which compacts everything).
async fn fill(args: &LookupArgs, index: usize, size: Size) -> Result<Filled> {
    let (Size::Bytes(bytes) | Size::Records(bytes)) = size;
    let (url, dir) = scratch::fresh(
        args.storage.as_deref(),
        &args.dir,
        &format!("strata-lookup-{}-{index}-{bytes}", std::process::id()),
    )?;
    let store = scratch::open(&url).await?;
    let tp = TopicPartition::new("lookup", 0);

    let filled_at = clock::now();
    let log = open(&store).await?;
    log.create_topic("lookup", Some(1), BTreeMap::new(), false)
        .await
        .context("create the topic")?;
    let records: Vec<SimpleRecord> = (0..args.records_per_batch)
        .map(|_| SimpleRecord {
            key: None,
            value: Some(Bytes::from(vec![0x5a; args.record_bytes])),
        })
        .collect();
    // Stamped now: records from 1970 would be expired by time-based retention mid-fill.
    let now_ms = (clock::unix_seconds() * 1000.0) as i64;
    let batch = build_batch(&records, now_ms);
    let batches = match size {
        Size::Bytes(bytes) => bytes.div_ceil(batch.len() as u64),
        Size::Records(records) => records.div_ceil(args.records_per_batch.max(1) as u64),
    };
    let acks = Acks::Durable {
        timeout: Duration::from_secs(60),
    };
    let mut pending = Vec::with_capacity(PIPELINE);
    for _ in 0..batches {
        pending.push(log.enqueue(&tp, batch.clone(), acks).await?);
        if pending.len() == PIPELINE {
            for ticket in pending.drain(..) {
                ticket.wait().await?;
            }
        }
    }
    for ticket in pending.drain(..) {
        ticket.wait().await?;
    }
    log.shutdown().await.context("shut down (compact)")?;
    let fill = filled_at.elapsed();
    let metered = MetricsStore::new(Arc::clone(&store), SystemClock::shared());
    let metrics = Arc::clone(metered.metrics());
    Ok(Filled {
        scratch: Scratch { store, dir },
        metered: Arc::new(metered),
        metrics,
        tp,
        stored_bytes: batches * batch.len() as u64,
        fill,
    })
}

/// What the reads of one size measured so far.
struct Meter {
    histogram: Histogram<u64>,
    outside: Histogram<u64>,
    in_storage: StorageShare,
    rng_state: u64,
    done: usize,
    high: i64,
}

impl Meter {
    fn new(size: Size) -> Result<Self> {
        let (Size::Bytes(bytes) | Size::Records(bytes)) = size;
        Ok(Self {
            histogram: Histogram::<u64>::new(3).context("histogram")?,
            outside: Histogram::<u64>::new(3).context("histogram")?,
            in_storage: StorageShare::default(),
            rng_state: 0x9e37_79b9_7f4a_7c15_u64 ^ bytes,
            done: 0,
            high: 0,
        })
    }

    fn row(&self, filled: &Filled) -> String {
        let reads = self.done.max(1) as f64;
        format!(
            "{} MB ({} records, filled in {:.1} s): read at a random offset p50 {:.3} ms, \
             p99 {:.3} ms, max {:.3} ms\n  per read: {:.2} whole gets (mean {:.3} ms), {:.2} \
             ranged gets (mean {:.3} ms); outside storage p50 {:.3} ms, p99 {:.3} ms",
            filled.stored_bytes / 1_000_000,
            self.high,
            filled.fill.as_secs_f64(),
            self.histogram.value_at_quantile(0.5) as f64 / 1e3,
            self.histogram.value_at_quantile(0.99) as f64 / 1e3,
            self.histogram.max() as f64 / 1e3,
            self.in_storage.gets.requests as f64 / reads,
            self.in_storage.gets.mean_ms(),
            self.in_storage.ranged.requests as f64 / reads,
            self.in_storage.ranged.mean_ms(),
            self.outside.value_at_quantile(0.5) as f64 / 1e3,
            self.outside.value_at_quantile(0.99) as f64 / 1e3,
        )
    }
}

/// Opens the log afresh (cold log memory) and times up to `--reads-per-open` reads at random
/// offsets.
async fn read_some(args: &LookupArgs, filled: &Filled, meter: &mut Meter) -> Result<()> {
    let tp = &filled.tp;
    let log = open(&filled.metered).await?;
    meter.high = log.watermarks(tp)?.high.0;
    let high = meter.high;
    for _ in 0..args.reads_per_open.min(args.reads - meter.done) {
        // xorshift: reproducible offsets without another dependency.
        meter.rng_state ^= meter.rng_state << 13;
        meter.rng_state ^= meter.rng_state >> 7;
        meter.rng_state ^= meter.rng_state << 17;
        let offset = (meter.rng_state % high.max(1) as u64) as i64;
        let before = reads_of(&filled.metrics);
        let started = clock::now();
        let out = log.read(tp, Offset(offset), 1, true).await?;
        let took = started.elapsed();
        let read = reads_of(&filled.metrics).since(&before);
        anyhow::ensure!(
            !out.batches.is_empty(),
            "no batch at offset {offset} of {high}"
        );
        meter.histogram.record(took.as_micros().max(1) as u64)?;
        meter
            .outside
            .record(took.saturating_sub(read.time()).as_micros().max(1) as u64)?;
        meter.in_storage.add(&read);
        meter.done += 1;
    }
    log.shutdown().await?;
    Ok(())
}

/// Requests of one kind and the time spent in them.
#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    requests: u64,
    time: Duration,
}

impl Spent {
    fn of(metrics: &strata_storage::StorageMetricsSnapshot, kind: OpKind) -> Self {
        let op = metrics.op(kind);
        Spent {
            requests: op.requests,
            time: op.latency.sum,
        }
    }

    fn since(self, before: Spent) -> Spent {
        Spent {
            requests: self.requests.saturating_sub(before.requests),
            time: self.time.saturating_sub(before.time),
        }
    }

    fn mean_ms(self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.time.as_secs_f64() * 1e3 / self.requests as f64
    }
}

/// The reads a lookup sends: whole objects (index chunks) and ranges (segments).
#[derive(Debug, Default, Clone, Copy)]
struct StorageShare {
    gets: Spent,
    ranged: Spent,
}

impl StorageShare {
    fn since(self, before: &StorageShare) -> StorageShare {
        StorageShare {
            gets: self.gets.since(before.gets),
            ranged: self.ranged.since(before.ranged),
        }
    }

    fn time(&self) -> Duration {
        self.gets.time + self.ranged.time
    }

    fn add(&mut self, other: &StorageShare) {
        self.gets.requests += other.gets.requests;
        self.gets.time += other.gets.time;
        self.ranged.requests += other.ranged.requests;
        self.ranged.time += other.ranged.time;
    }
}

fn reads_of(metrics: &StorageMetrics) -> StorageShare {
    let snapshot = metrics.snapshot();
    StorageShare {
        gets: Spent::of(&snapshot, OpKind::Get),
        ranged: Spent::of(&snapshot, OpKind::GetRange),
    }
}

async fn open(store: &Arc<dyn ObjectStore>) -> Result<Arc<LogManager>> {
    LogManager::open(
        Arc::clone(store),
        SystemClock::shared(),
        LogConfig::default(),
        BrokerId(0),
    )
    .await
    .context("open the log")
}
