//! `LogManager`: the broker-wide entry point of the log layer. This file opens and shuts the
//! log down; the rest of its API lives with the code it drives: topic administration in
//! `topics`, appends in `append`, reads in `read`, taking partitions over and handing them on in
//! `ownership`, compaction and retention in `maintenance`, producer ids in `producer`.

use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use strata_core::{BrokerId, Clock};
use strata_storage::ObjectStore;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::append::publish;
use crate::cache::TailCache;
use crate::catalog;
use crate::config::LogConfig;
use crate::ownership;
use crate::partition::Partition;
use crate::producer::ProducerIdBlock;
use crate::shared::{lock_mutex, read_lock, Ownership, Shared};
use crate::wal::{self, register_stream};
use crate::writer::{self, WriterContext, WriterQueue};
use crate::LogResult;

/// The log layer of one broker.
#[derive(Debug)]
pub struct LogManager {
    pub(crate) shared: Arc<Shared>,
    give_up: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    writer_task: Mutex<Option<JoinHandle<()>>>,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    broker: BrokerId,
}

impl LogManager {
    /// Opens the log on `store`: loads the catalog, recovers every partition (replaying
    /// write-ahead objects not yet compacted) and starts the group-commit writer and the
    /// background compaction and retention tasks.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        config: LogConfig,
        broker: BrokerId,
    ) -> LogResult<Arc<Self>> {
        Self::open_with(store, clock, config, broker, Ownership::All).await
    }

    /// Opens the log; with `Ownership::Managed` no partition is served until `acquire`.
    pub async fn open_with(
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        config: LogConfig,
        broker: BrokerId,
        mode: Ownership,
    ) -> LogResult<Arc<Self>> {
        let catalog_state = catalog::load_latest(store.as_ref()).await?;
        let stream = register_stream(store.as_ref(), broker, clock.as_ref()).await?;
        tracing::info!(
            stream,
            catalog_version = catalog_state.version,
            "opening log"
        );

        let topics = catalog_state
            .topics
            .iter()
            .map(|(name, info)| (name.clone(), Arc::new(info.clone())))
            .collect::<BTreeMap<_, _>>();
        let config_cleaner_threads = config.cleaner_threads;
        let read_ahead = Arc::new(crate::read_ahead::ReadAhead::new(
            crate::read_ahead::ReadAheadConfig {
                window: u32::try_from(config.read_ahead_bytes).unwrap_or(u32::MAX),
                memory: config.read_ahead_memory_bytes,
                max_concurrent_reads: config.catchup_max_concurrent_reads,
                max_bytes_per_second: config.catchup_io_max_bytes_per_second,
            },
        ));
        let shared = Arc::new(Shared {
            store: store.clone(),
            clock: clock.clone(),
            pending_bytes: Arc::new(Semaphore::new(config.max_pending_bytes)),
            decompressions: Arc::new(Semaphore::new(config.max_concurrent_decompressions.max(1))),
            cache: TailCache::new(config.cache_bytes),
            config,
            stream,
            broker,
            mode,
            fenced: watch::channel(false).0,
            catalog: RwLock::new(catalog_state),
            topics: RwLock::new(topics),
            partitions: RwLock::new(HashMap::new()),
            queue: Arc::new(WriterQueue::default()),
            wal_live: Mutex::new(BTreeMap::new()),
            wal_newest: Mutex::new((0, None)),
            retired_streams: Mutex::new(HashMap::new()),
            unsealed_tops: Mutex::new(HashMap::new()),
            sealed_streams: Default::default(),
            producer_ids: tokio::sync::Mutex::new(ProducerIdBlock::default()),
            catalog_lock: tokio::sync::Mutex::new(()),
            cleaner_slots: Semaphore::new(config_cleaner_threads.max(1)),
            cleaning_now: Mutex::new(Default::default()),
            cleaner_inflight: Mutex::new(Default::default()),
            cleaner_generation: std::sync::atomic::AtomicU32::new(1),
            cleaner_stats: Default::default(),
            tiering_stats: Default::default(),
            read_ahead,
            read_stats: Default::default(),
            txn_stats: Default::default(),
            replayed: crate::maintenance::ReplayedQueue::new(),
        });

        if mode == Ownership::Managed {
            // In a cluster the node id is held before the log opens (the server joins first),
            // so this id's earlier streams are dead or deposed incarnations'. Best effort: a
            // failure here leaves a stream to the next start, never a partition unserved.
            match wal::seal_predecessors(
                shared.store.as_ref(),
                broker,
                stream,
                shared.clock.wall_millis(),
                shared.config.max_inflight_flushes,
            )
            .await
            {
                Ok(0) => {}
                Ok(sealed) => {
                    tracing::info!(sealed, "sealed this node id's earlier write-ahead streams")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot seal this node id's earlier write-ahead streams; the next start tries again")
                }
            }
        }
        if mode == Ownership::All {
            // Alone on the storage: fence every earlier incarnation's stream (so the collector
            // may clean them up), then take every partition over, replaying whatever they left
            // uncompacted. Only registered streams: one whose registration is gone was retired
            // by the collector (sealed, nothing but hole markers below the seal). Sealing those
            // again cost a listing and a read per broker start there ever was, and put hole
            // markers back where the collector had deleted data. Skipping one is safe whatever
            // the truth: taking a partition over seals every stream its manifest names. A
            // registered stream that never wrote is sealed too (a seal at 1), which fences it
            // and lets the collector retire it.
            let others: Vec<u32> = strata_layout::streams::registered(shared.store.as_ref())
                .await?
                .into_iter()
                .filter(|s| *s != stream)
                .collect();
            for s in others {
                wal::seal_stream(
                    shared.store.as_ref(),
                    s,
                    broker,
                    shared.clock.wall_millis(),
                    shared.config.max_inflight_flushes,
                )
                .await?;
            }
            let topics = read_lock(&shared.topics).clone();
            for (tp, result) in
                ownership::acquire(&shared, ownership::missing(&shared, &topics)).await?
            {
                result.map_err(|e| {
                    tracing::error!(partition = %tp, error = %e, "cannot serve partition");
                    e
                })?;
            }
        }

        let (give_up, give_up_rx) = watch::channel(false);
        let (stop, stop_rx) = watch::channel(false);
        let publish_shared = shared.clone();
        let fenced_shared = shared.clone();
        let ctx = WriterContext {
            store,
            clock,
            queue: shared.queue.clone(),
            stream,
            flush_bytes: shared.config.flush_bytes,
            flush_interval: shared.config.flush_interval,
            flush_when_idle: shared.config.flush_when_idle,
            max_inflight: shared.config.max_inflight_flushes,
            on_durable: Arc::new(move |seq, object, items| {
                publish(&publish_shared, seq, object, items)
            }),
            give_up: give_up_rx,
            on_fenced: Arc::new(move || {
                fenced_shared.fenced.send_replace(true);
            }),
        };
        let writer_task = tokio::spawn(writer::run(ctx));
        let mut tasks = vec![
            tokio::spawn(crate::maintenance::run(shared.clone(), stop_rx.clone())),
            tokio::spawn(crate::maintenance::compact_replayed(
                shared.clone(),
                stop_rx.clone(),
            )),
        ];
        if shared.config.tiered {
            tasks.push(tokio::spawn(crate::tiering::run(
                shared.clone(),
                stop_rx.clone(),
            )));
        }
        for _ in 0..shared.config.cleaner_threads {
            tasks.push(tokio::spawn(crate::cleaner::run(
                shared.clone(),
                stop_rx.clone(),
            )));
        }
        Ok(Arc::new(Self {
            shared,
            give_up,
            stop,
            writer_task: Mutex::new(Some(writer_task)),
            tasks: Mutex::new(tasks),
            broker,
        }))
    }

    /// The log cleaner's counters since start (`/metrics`).
    pub fn cleaner_stats(&self) -> crate::cleaner::CleanerSnapshot {
        self.shared.cleaner_stats.snapshot()
    }

    /// Segments moved from the fast tier to the bulk tier, and what the fast tier holds now.
    pub fn tiering_stats(&self) -> crate::tiering::TieringSnapshot {
        self.shared.tiering_snapshot()
    }

    /// Reads served so far, by where their batches came from.
    pub fn read_stats(&self) -> crate::read::ReadSnapshot {
        self.shared.read_stats.snapshot()
    }

    /// Catch-up reads of segments: kept windows, read-ahead and time spent in the IO budget.
    pub fn read_ahead_stats(&self) -> crate::ReadAheadSnapshot {
        self.shared.read_ahead.snapshot()
    }

    /// Each served partition of a compacted topic with its dirty ratio (bytes of segments the
    /// cleaner has not passed, over all segment bytes).
    pub fn dirty_ratios(&self) -> Vec<(strata_core::TopicPartition, f64)> {
        let now = self.shared.clock.wall_millis();
        let mut out = Vec::new();
        for part in self.shared.partitions_snapshot() {
            let Some(topic) = self.shared.topic(&part.tp.topic) else {
                continue;
            };
            if !topic.config.cleanup_policy.compact {
                continue;
            }
            let ratio = {
                let st = part.lock();
                crate::cleaner::dirtiness(&st.manifest, &topic.config, now, st.last_stable()).ratio
            };
            out.push((part.tp.clone(), ratio));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Runs one cleaning pass over `tp` now, due or not. Returns whether a pass ran.
    #[cfg(test)]
    pub(crate) async fn clean_now(
        &self,
        tp: &strata_core::TopicPartition,
    ) -> crate::LogResult<bool> {
        let part = self.partition(tp)?;
        let result = crate::cleaner::clean_once(&self.shared, &part).await;
        if let Err(e) = &result {
            crate::maintenance::on_failure(&self.shared, &part, "cleaning", e).await;
        }
        result
    }

    pub fn config(&self) -> &LogConfig {
        &self.shared.config
    }

    pub fn broker(&self) -> BrokerId {
        self.broker
    }

    /// Bytes currently held by the tail cache.
    pub fn cache_used(&self) -> usize {
        self.shared.cache.used()
    }

    /// Keeps the group-commit writer, if idle, from starting a write until the guard is
    /// dropped: a produce request takes one while it queues its partitions' batches, so that
    /// they leave in one write instead of the first alone and the rest after it. Only the
    /// start-when-idle rule waits for it; the interval and size triggers do not.
    pub fn hold_writes(&self) -> crate::writer::WriteHold {
        self.shared.queue.hold()
    }

    /// This incarnation's write-ahead stream id.
    pub fn stream(&self) -> u32 {
        self.shared.stream
    }

    /// Turns true if another broker fenced this one (sealed its stream): from then on nothing
    /// can be acknowledged, and the broker should stop and start afresh.
    pub fn fenced(&self) -> watch::Receiver<bool> {
        self.shared.fenced.subscribe()
    }

    /// Simulates a crash: stops every task at once without flushing or compacting.
    #[cfg(test)]
    pub(crate) fn abort_for_test(&self) {
        self.shared.queue.close();
        if let Some(w) = lock_mutex(&self.writer_task).take() {
            w.abort();
        }
        for t in lock_mutex(&self.tasks).drain(..) {
            t.abort();
        }
    }

    /// Stops accepting appends, flushes everything queued and compacts every partition, so a
    /// restart has nothing to replay.
    pub async fn shutdown(&self) -> LogResult<()> {
        self.shared.queue.close();
        let writer = lock_mutex(&self.writer_task).take();
        if let Some(mut handle) = writer {
            // Storage may be down: bound the wait, then let pending appends fail.
            let patience = self.shared.config.shutdown_timeout;
            if strata_core::timeout(self.shared.clock.as_ref(), patience, &mut handle)
                .await
                .is_err()
            {
                let _ = self.give_up.send(true);
                let _ = handle.await;
            }
        }
        let _ = self.stop.send(true);
        let tasks: Vec<JoinHandle<()>> = lock_mutex(&self.tasks).drain(..).collect();
        for t in tasks {
            let _ = t.await;
        }
        let parts: Vec<Arc<Partition>> = read_lock(&self.shared.partitions)
            .values()
            .cloned()
            .collect();
        // Partitions compact independently: one at a time, a broker holding 10,000 with
        // tails took minutes to stop.
        let shared = &self.shared;
        let outcomes: Vec<LogResult<()>> = futures::stream::iter(parts)
            .map(|part| async move {
                let result = crate::maintenance::compact(shared, &part).await;
                if let Err(e) = &result {
                    tracing::warn!(partition = %part.tp, error = %e, "final compaction failed; the tail will be replayed at start-up");
                }
                result
            })
            .buffer_unordered(crate::ownership::TAKEOVER_CONCURRENCY)
            .collect()
            .await;
        self.seal_own_stream().await;
        outcomes
            .into_iter()
            .collect::<LogResult<Vec<()>>>()
            .map(|_| ())
    }

    /// Seals this incarnation's stream once its writer has stopped, so the collector (of the
    /// next start, or of another broker) may retire it. Unsealed, it stayed for ever: a
    /// cluster broker stopped cleanly hands its partitions over and nobody seals its stream,
    /// so its registration and newest object were never collected, one more per restart.
    /// The usual fencing procedure (seal above the highest object, holes below), so writes
    /// that were still in flight when the writer gave up cannot land unseen by a replay. A
    /// failure only leaves the stream as it was before this existed.
    async fn seal_own_stream(&self) {
        let shared = &self.shared;
        // Logged before the seal, in the same stream notation as fence.rs's "stream sealed",
        // so a reader of the logs (the fault harness) can tell this seal from a takeover's.
        tracing::info!(
            stream = format_args!("{:08x}", shared.stream),
            "sealing this broker's own write-ahead stream at shutdown"
        );
        if let Err(e) = wal::seal_stream(
            shared.store.as_ref(),
            shared.stream,
            shared.broker,
            shared.clock.wall_millis(),
            shared.config.max_inflight_flushes,
        )
        .await
        {
            tracing::warn!(error = %e, "cannot seal this broker's write-ahead stream at shutdown; it stays until a start-up or a takeover seals it");
        }
    }
}
