//! The `disk` probe: how long one durable create-only write takes on a directory, done the way
//! the local-directory backend does it (write a temp file, fsync it, `link(2)` it to its final
//! name, remove the temp name, fsync the directory). Every acks=all produce on `file://`
//! storage waits for one such write, so its latency is the floor under produce and end-to-end
//! latency on that disk, and its spread explains their tails.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;

use crate::cli::{DiskArgs, DiskMode};
use crate::clock;
use crate::report::{new_histogram, LatencySummary, Phase};
use crate::system::CpuMeter;
use crate::Outcome;

pub fn run(args: &DiskArgs) -> Result<Outcome> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    // A directory of our own inside the one given, removed afterwards, so the probe never
    // touches anything else there.
    let dir = args
        .dir
        .join(format!("strata-bench-disk-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    eprintln!(
        "{} durable writes of {} bytes in {} ({} at a time)",
        args.writes,
        args.size,
        dir.display(),
        args.parallel
    );

    if args.mode == DiskMode::StoreDelete {
        let outcome = store_deletes(&dir, args);
        let cleanup = fs::remove_dir_all(&dir);
        let outcome = outcome?;
        cleanup.with_context(|| format!("remove {}", dir.display()))?;
        return Ok(outcome);
    }

    let cpu = CpuMeter::start(None);
    let start = clock::now();
    let per_thread = args.writes.div_ceil(args.parallel);
    let results: Vec<Result<Histogram<u64>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.parallel)
            .map(|worker| {
                let dir = &dir;
                let first = worker * per_thread;
                let count = per_thread.min(args.writes.saturating_sub(first));
                scope.spawn(move || write_many(dir, worker, first, count, args))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| anyhow!("a writer thread panicked"))?)
            .collect()
    });
    let elapsed = clock::now().saturating_duration_since(start);
    let cpu = cpu.finish(elapsed);
    let cleanup = fs::remove_dir_all(&dir);

    let mut latency = new_histogram()?;
    for result in results {
        latency
            .add(result?)
            .map_err(|e| anyhow!("merge histograms: {e:?}"))?;
    }
    cleanup.with_context(|| format!("remove {}", dir.display()))?;

    let mut phase = Phase::new("durable write", args.writes, args.size, elapsed, cpu);
    phase.latency = LatencySummary::from_histogram(&latency);
    phase.notes.push(
        match args.mode {
            DiskMode::Publish => {
                "latency = temp file write + fsync + link + unlink temp + directory fsync, as \
                 the local-directory backend publishes a write-ahead object"
            }
            DiskMode::PublishNoDirSync => {
                "latency = temp file write + fsync + link + unlink temp, no directory fsync \
                 (not crash-safe: what the second fsync costs)"
            }
            DiskMode::Overwrite => {
                "latency = pwrite into a preallocated, already-written file + fdatasync (one \
                 flush, no metadata)"
            }
            DiskMode::StoreDelete => "",
            DiskMode::PublishReused => {
                "latency = rename an already-written file to a temp name + overwrite it in \
                 place + fdatasync + link + unlink temp + directory fsync (its return to the \
                 pool, one rename, is not timed)"
            }
        }
        .to_string(),
    );
    Ok(Outcome {
        topic: None,
        settings: serde_json::to_value(args).context("serialise the settings")?,
        phases: vec![phase],
    })
}

/// `--mode store-delete`: puts `writes` objects into one key directory of a `LocalStore`,
/// then deletes them `parallel` at a time through the store, timing each delete and the CPU of
/// the whole delete phase (this process's, which includes the store's blocking threads).
fn store_deletes(dir: &Path, args: &DiskArgs) -> Result<Outcome> {
    use futures::StreamExt;
    use strata_storage::{LocalStore, ObjectKey, ObjectStore, PutMode};

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start a runtime")?;
    let store = LocalStore::open(dir).context("open the local store")?;
    let key = |i: u64| ObjectKey::new(format!("wal/00000001/{i:016x}"));
    let body = bytes::Bytes::from(vec![0x5a; args.size]);
    let (latency, elapsed, cpu) = runtime.block_on(async {
        for i in 0..args.writes {
            store
                .put(&key(i)?, body.clone(), PutMode::Create)
                .await
                .context("put an object to delete")?;
        }
        let cpu = CpuMeter::start(None);
        let start = clock::now();
        let timings: Vec<Result<u64>> = futures::stream::iter(0..args.writes)
            .map(|i| {
                let store = store.clone();
                async move {
                    let k = key(i)?;
                    let began = clock::now();
                    store.delete(&k).await.context("delete")?;
                    Ok(micros(clock::now().saturating_duration_since(began)))
                }
            })
            .buffer_unordered(args.parallel as usize)
            .collect()
            .await;
        let elapsed = clock::now().saturating_duration_since(start);
        let cpu = cpu.finish(elapsed);
        let mut latency = new_histogram()?;
        for t in timings {
            latency.saturating_record(t?);
        }
        anyhow::Ok((latency, elapsed, cpu))
    })?;
    let mut phase = Phase::new("delete", args.writes, args.size, elapsed, cpu);
    phase.latency = LatencySummary::from_histogram(&latency);
    phase.notes.push(format!(
        "latency = one LocalStore::delete of a {}-byte object, {} in flight, all in one \
         directory (as compaction deletes write-ahead objects); cpu = this process, the \
         store's threads included",
        args.size, args.parallel
    ));
    Ok(Outcome {
        topic: None,
        settings: serde_json::to_value(args).context("serialise the settings")?,
        phases: vec![phase],
    })
}

/// Slots of the preallocated file in `overwrite` mode (written round-robin).
const SLOTS: u64 = 64;

fn write_many(
    dir: &Path,
    worker: u64,
    first: u64,
    count: u64,
    args: &DiskArgs,
) -> Result<Histogram<u64>> {
    let mut latency = new_histogram()?;
    let data = vec![0x5a_u8; args.size];
    let ring = match args.mode {
        DiskMode::Overwrite => Some(preallocated(dir, worker, &data)?),
        // `StoreDelete` never comes here (see `run`).
        DiskMode::Publish
        | DiskMode::PublishNoDirSync
        | DiskMode::PublishReused
        | DiskMode::StoreDelete => None,
    };
    let reused = match args.mode {
        DiskMode::PublishReused => written_pool(dir, worker, &data)?,
        _ => Vec::new(),
    };
    for n in first..first + count {
        if let Some(pooled) = reused.get((n % SLOTS) as usize) {
            let temp = dir.join(format!("{n:020}.tmp"));
            let object = dir.join(format!("{n:020}"));
            let start = clock::now();
            publish_reused(dir, pooled, &temp, &object, &data)?;
            latency.saturating_record(micros(clock::now().saturating_duration_since(start)));
            // Deleting the object returns its file to the pool, off the put's path.
            fs::rename(&object, pooled).with_context(|| format!("recycle {}", object.display()))?;
            continue;
        }
        let start = clock::now();
        match &ring {
            Some(file) => {
                file.write_all_at(&data, (n % SLOTS) * data.len() as u64)
                    .and_then(|()| file.sync_data())
                    .context("overwrite and fdatasync")?;
            }
            None => durable_create(
                dir,
                &format!("{n:020}"),
                &data,
                args.mode == DiskMode::Publish,
            )?,
        }
        latency.saturating_record(micros(clock::now().saturating_duration_since(start)));
    }
    Ok(latency)
}

/// A file of `SLOTS` writes, every block written and flushed once, so that overwriting a slot
/// allocates nothing and `fdatasync` has no metadata to write.
fn preallocated(dir: &Path, worker: u64, data: &[u8]) -> Result<File> {
    let path = dir.join(format!("ring-{worker}"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    for slot in 0..SLOTS {
        file.write_all_at(data, slot * data.len() as u64)
            .with_context(|| format!("fill {}", path.display()))?;
    }
    file.sync_all()
        .with_context(|| format!("fsync {}", path.display()))?;
    Ok(file)
}

/// `SLOTS` files of `data`'s size, written and flushed once: a pool of deleted objects kept
/// with their blocks.
fn written_pool(dir: &Path, worker: u64, data: &[u8]) -> Result<Vec<PathBuf>> {
    (0..SLOTS)
        .map(|slot| {
            let path = dir.join(format!("pool-{worker}-{slot}"));
            let mut file =
                File::create(&path).with_context(|| format!("create {}", path.display()))?;
            file.write_all(data)
                .and_then(|()| file.sync_all())
                .with_context(|| format!("fill {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

fn publish_reused(
    dir: &Path,
    pooled: &Path,
    temp: &Path,
    object: &Path,
    data: &[u8],
) -> Result<()> {
    fs::rename(pooled, temp).with_context(|| format!("take {}", pooled.display()))?;
    let file = OpenOptions::new()
        .write(true)
        .open(temp)
        .with_context(|| format!("open {}", temp.display()))?;
    file.write_all_at(data, 0)
        .and_then(|()| file.sync_data())
        .with_context(|| format!("overwrite and fdatasync {}", temp.display()))?;
    drop(file);
    fs::hard_link(temp, object).with_context(|| format!("link {}", object.display()))?;
    fs::remove_file(temp).with_context(|| format!("remove {}", temp.display()))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))
}

fn durable_create(dir: &Path, name: &str, data: &[u8], sync_dir: bool) -> Result<()> {
    let temp: PathBuf = dir.join(format!("{name}.tmp"));
    let object = dir.join(name);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .with_context(|| format!("create {}", temp.display()))?;
    file.write_all(data)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write and fsync {}", temp.display()))?;
    drop(file);
    fs::hard_link(&temp, &object).with_context(|| format!("link {}", object.display()))?;
    fs::remove_file(&temp).with_context(|| format!("remove {}", temp.display()))?;
    if !sync_dir {
        return Ok(());
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
