//! `restarts`: what a broker start costs after many starts before it.
//!
//! Every start of a log registers a write-ahead stream of its own; the next start seals it,
//! and the garbage collector deletes what it held. What must stay for ever is the seal (and
//! any hole markers below it), because it fences a deposed writer that wakes up late. This
//! opens one partition log on one store `--starts` times in a row; each time it appends one
//! batch, runs one collector pass (a broker that lives past `retention_check_interval` runs
//! one) and shuts down. It reports, at chosen starts, the wall time and the storage requests
//! of the open and of a second collector pass, and at the end what is left in storage: a
//! start should cost the same at the thousandth as at the tenth.
//!
//! No broker and no client: the log itself, on a fresh directory (or `--storage`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use strata_core::{BrokerId, SystemClock, TopicPartition};
use strata_log::{Acks, LogConfig, LogManager};
use strata_storage::{MetricsStore, ObjectStore, OpKind, StorageMetrics};
use strata_wire::builder::{build_batch, SimpleRecord};

use crate::cli::RestartsArgs;
use crate::clock;
use crate::scratch;
use crate::system;

pub fn run(args: &RestartsArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("build a tokio runtime")?;
    let load_before = system::load_average();
    let (url, dir) = scratch::fresh(
        args.storage.as_deref(),
        &args.dir,
        &format!("strata-restarts-{}", std::process::id()),
    )?;
    let result = runtime.block_on(measure(args, &url));
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    let rows = result?;
    println!(
        "restarts: {} starts of one log on {url}, each: open, append one batch, one collector \
         pass, shut down; load average before {load_before:?}, after {:?}",
        args.starts,
        system::load_average()
    );
    println!(
        "{:>6} {:>9} {:>6} {:>6} {:>6} {:>6} | {:>9} {:>6} {:>6}",
        "start", "open ms", "list", "get", "put", "delete", "pass ms", "list", "get"
    );
    for row in &rows.starts {
        println!(
            "{:>6} {:>9.2} {:>6} {:>6} {:>6} {:>6} | {:>9.2} {:>6} {:>6}",
            row.start,
            row.open_ms,
            row.open.list,
            row.open.get,
            row.open.put,
            row.open.delete,
            row.pass_ms,
            row.pass.list,
            row.pass.get
        );
    }
    println!(
        "left in storage: {} write-ahead objects, {} stream registrations",
        rows.wal_objects, rows.registrations
    );
    Ok(())
}

/// Requests of one step, by kind.
#[derive(Debug, Default, Clone, Copy)]
struct Requests {
    list: u64,
    get: u64,
    put: u64,
    delete: u64,
}

impl Requests {
    fn since(metrics: &StorageMetrics, before: &[u64; OpKind::COUNT]) -> Self {
        let now = counts(metrics);
        let d = |k: OpKind| now[k as usize] - before[k as usize];
        Requests {
            list: d(OpKind::List),
            get: d(OpKind::Get) + d(OpKind::GetRange),
            put: d(OpKind::PutCreate) + d(OpKind::PutUpdate),
            delete: d(OpKind::Delete),
        }
    }
}

fn counts(metrics: &StorageMetrics) -> [u64; OpKind::COUNT] {
    let snapshot = metrics.snapshot();
    OpKind::ALL.map(|k| snapshot.op(k).requests)
}

struct Row {
    start: usize,
    open_ms: f64,
    open: Requests,
    pass_ms: f64,
    pass: Requests,
}

struct Outcome {
    starts: Vec<Row>,
    wal_objects: usize,
    registrations: usize,
}

async fn measure(args: &RestartsArgs, url: &str) -> Result<Outcome> {
    let wrapped = MetricsStore::new(scratch::open(url).await?, SystemClock::shared());
    let metrics = Arc::clone(wrapped.metrics());
    let store: Arc<dyn ObjectStore> = Arc::new(wrapped);
    let tp = TopicPartition::new("restarts", 0);
    let record = SimpleRecord {
        key: None,
        value: Some(Bytes::from_static(b"one record per start")),
    };
    let acks = Acks::Durable {
        timeout: Duration::from_secs(60),
    };
    let mut rows = Vec::new();
    for start in 1..=args.starts {
        let before = counts(&metrics);
        let began = clock::now();
        let log = LogManager::open(
            Arc::clone(&store),
            SystemClock::shared(),
            LogConfig::default(),
            BrokerId(0),
        )
        .await
        .context("open the log")?;
        let open_ms = began.elapsed().as_secs_f64() * 1e3;
        let open = Requests::since(&metrics, &before);
        if start == 1 {
            log.create_topic("restarts", Some(1), BTreeMap::new(), false)
                .await
                .context("create the topic")?;
        }
        let now_ms = (clock::unix_seconds() * 1000.0) as i64;
        log.append(
            &tp,
            build_batch(std::slice::from_ref(&record), now_ms),
            acks,
        )
        .await
        .context("append")?;
        log.collect_garbage().await.context("collector pass")?;
        // The second pass is the steady state: what every later pass of this broker costs.
        let before = counts(&metrics);
        let began = clock::now();
        log.collect_garbage().await.context("collector pass")?;
        let pass_ms = began.elapsed().as_secs_f64() * 1e3;
        let pass = Requests::since(&metrics, &before);
        log.shutdown().await.context("shut down")?;
        if args.report_at.contains(&start) || start == args.starts {
            rows.push(Row {
                start,
                open_ms,
                open,
                pass_ms,
                pass,
            });
        }
    }
    let wal_objects = store.list("wal/").await?.len();
    let registrations = store.list("meta/streams/").await?.len();
    if args.storage.is_some() {
        scratch::delete_all(&store).await?;
    }
    Ok(Outcome {
        starts: rows,
        wal_objects,
        registrations,
    })
}
