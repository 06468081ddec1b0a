//! The broker-wide group-commit writer.
//!
//! Appends queue here in offset order per partition. The writer takes whatever has queued
//! when the size or time trigger fires, writes it as one write-ahead object (create-only, so a
//! fenced writer fails instead of overwriting) and, once durable, publishes each batch to its
//! partition: high watermark, tail, cache, and the waiting producers' acknowledgements.
//!
//! Several writes may be in flight, but results are published strictly in sequence order, so
//! a partition's high watermark never jumps over data that is not yet durable.
//!
//! A write that fails (a full disk, an outage) is retried with the same key and bytes until it
//! lands, since later offsets cannot be published before it. Meanwhile the writer is *stalled*:
//! producers waiting on the stuck groups and on the queue are answered with the storage error
//! at once (their batches may still land later, which an idempotent retry then finds as a
//! duplicate), and new appends are refused before offsets are assigned. So the data waiting
//! during an outage is what was queued when it began, in groups of at most `flush_bytes`, and
//! the first write that lands needs no more space than one normal group commit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{FuturesOrdered, StreamExt};
use rand::rngs::StdRng;
use rand::SeedableRng;
use strata_core::Clock;
use strata_storage::{full_jitter, holds_our_bytes, ObjectKey, ObjectStore, PutMode, StorageError};
use tokio::sync::{oneshot, watch, Notify, OwnedSemaphorePermit};

use crate::partition::Partition;
use crate::wal::{self, WalEntry};
use crate::{LogError, LogResult};

/// One batch waiting for its group commit.
#[derive(Debug)]
pub struct PendingAppend {
    pub partition: Arc<Partition>,
    pub entry: WalEntry,
    /// The stored batch in two pieces: rewritten header, client's records (shared).
    pub parts: [Bytes; 2],
    pub done: Option<oneshot::Sender<LogResult<()>>>,
    /// Holds this append's share of the in-flight byte budget until it is durable.
    pub permit: Option<OwnedSemaphorePermit>,
}

#[derive(Debug, Default)]
struct QueueInner {
    items: Vec<PendingAppend>,
    bytes: usize,
    first_at: Option<Duration>,
    closed: bool,
    /// Set once a write failed for good (fenced or a permanent storage error): nothing more
    /// is accepted, since offsets after the failed write could no longer be made dense.
    failed: Option<String>,
    /// Group writes currently failing and being retried.
    stalled_groups: usize,
    /// The last error of a stalled write, answered to appends while `stalled_groups > 0`.
    stall: Option<Stall>,
    /// Produce requests still queueing their batches ([`WriteHold`]): an idle writer waits
    /// for them so that one request's partitions go in one write.
    holds: usize,
}

/// Why the writer is stalled, kept as text: a [`StorageError`] is not `Clone`.
#[derive(Debug, Clone)]
struct Stall {
    full: bool,
    message: String,
}

impl Stall {
    fn of(error: &StorageError) -> Self {
        match error {
            StorageError::Full(message) => Self {
                full: true,
                message: message.clone(),
            },
            StorageError::Unavailable(message) => Self {
                full: false,
                message: message.clone(),
            },
            other => Self {
                full: false,
                message: other.to_string(),
            },
        }
    }

    fn error(&self) -> LogError {
        let message = format!("write-ahead writes are failing: {}", self.message);
        LogError::Storage(if self.full {
            StorageError::Full(message)
        } else {
            StorageError::Unavailable(message)
        })
    }
}

#[derive(Debug, Default)]
pub struct WriterQueue {
    inner: Mutex<QueueInner>,
    notify: Notify,
}

impl WriterQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueInner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Whether appends are accepted; checked before offsets are assigned.
    pub fn check_accepting(&self) -> LogResult<()> {
        let q = self.lock();
        if let Some(why) = &q.failed {
            return Err(LogError::Storage(StorageError::Unavailable(why.clone())));
        }
        if q.closed {
            return Err(LogError::ShuttingDown);
        }
        if let Some(stall) = &q.stall {
            return Err(stall.error());
        }
        Ok(())
    }

    /// A group write failed for the first time: refuse new appends and answer every queued
    /// append now rather than when its own write fails (which waits for a free write slot).
    fn stall_begin(&self, error: &StorageError) {
        let stall = Stall::of(error);
        let waiting: Vec<_> = {
            let mut q = self.lock();
            q.stalled_groups += 1;
            q.stall = Some(stall.clone());
            q.items.iter_mut().filter_map(|i| i.done.take()).collect()
        };
        for done in waiting {
            let _ = done.send(Err(stall.error()));
        }
    }

    /// A stalled write failed again: keep the newest reason.
    fn stall_update(&self, error: &StorageError) {
        let mut q = self.lock();
        if q.stall.is_some() {
            q.stall = Some(Stall::of(error));
        }
    }

    /// A stalled write ended (landed, or failed for good): accept again once none is left.
    fn stall_end(&self) {
        let mut q = self.lock();
        q.stalled_groups = q.stalled_groups.saturating_sub(1);
        if q.stalled_groups == 0 {
            q.stall = None;
        }
    }

    /// Queues one batch. Called with the partition's lock held so queue order is offset order.
    pub fn push(&self, item: PendingAppend, now: Duration) {
        let mut q = self.lock();
        q.bytes += item.parts[0].len() + item.parts[1].len();
        q.first_at.get_or_insert(now);
        q.items.push(item);
        drop(q);
        self.notify.notify_one();
    }

    /// Holds back the start of a write on an idle writer until the returned guard is dropped
    /// (the interval and size triggers still fire).
    pub fn hold(self: &Arc<Self>) -> WriteHold {
        self.lock().holds += 1;
        WriteHold {
            queue: Arc::clone(self),
        }
    }

    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    fn fail(&self, why: String) -> Vec<PendingAppend> {
        let mut q = self.lock();
        q.failed = Some(why);
        q.bytes = 0;
        q.first_at = None;
        std::mem::take(&mut q.items)
    }

    /// Waits for the next group: returns when `flush_bytes` are queued, or the oldest item has
    /// waited `interval`, or at once when `idle` (no write in flight) and nobody holds the
    /// queue, or when the queue is closed. None when closed and empty. A group holds at most
    /// `flush_bytes` (or one batch, if larger): a backlog that built up while every write slot
    /// was busy leaves in several groups, so no single write needs more space than usual.
    async fn next_group(
        &self,
        flush_bytes: usize,
        interval: Duration,
        idle: bool,
        clock: &dyn strata_core::Clock,
    ) -> Option<Vec<PendingAppend>> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wait = {
                let mut q = self.lock();
                if q.items.is_empty() {
                    if q.closed || q.failed.is_some() {
                        return None;
                    }
                    None
                } else {
                    let now = clock.monotonic();
                    let due = q.first_at.map_or(now, |t| t + interval);
                    if q.bytes >= flush_bytes || now >= due || q.closed || (idle && q.holds == 0) {
                        return Some(take_group(&mut q, flush_bytes));
                    }
                    Some(due - now)
                }
            };
            match wait {
                None => notified.await,
                // The same clock as the trigger above: a write is due when `clock` says so.
                Some(d) => {
                    let _ = strata_core::timeout(clock, d, notified).await;
                }
            }
        }
    }
}

/// Keeps an idle writer from starting a write while a produce request queues its partitions'
/// batches one after another; see [`WriterQueue::hold`].
#[derive(Debug)]
pub struct WriteHold {
    queue: Arc<WriterQueue>,
}

impl Drop for WriteHold {
    fn drop(&mut self) {
        let mut q = self.queue.lock();
        q.holds = q.holds.saturating_sub(1);
        // Only the last hold going, with batches waiting, can let an idle writer start; any
        // other wake-up (every produce on S3, where the rule is off) would be for nothing.
        let wake = q.holds == 0 && !q.items.is_empty();
        drop(q);
        if wake {
            self.queue.notify.notify_one();
        }
    }
}

/// Takes the oldest items up to `flush_bytes` (at least one) off the queue. Those left keep the
/// oldest's arrival time, so they are due at once.
fn take_group(q: &mut QueueInner, flush_bytes: usize) -> Vec<PendingAppend> {
    let size = |i: &PendingAppend| i.parts[0].len() + i.parts[1].len();
    let mut bytes = 0;
    let mut count = 0;
    for item in &q.items {
        if count > 0 && bytes + size(item) > flush_bytes {
            break;
        }
        bytes += size(item);
        count += 1;
    }
    if count == q.items.len() {
        q.bytes = 0;
        q.first_at = None;
        return std::mem::take(&mut q.items);
    }
    let rest = q.items.split_off(count);
    q.bytes -= bytes;
    std::mem::replace(&mut q.items, rest)
}

/// Publishes a durable group: (sequence, the object as written, its batches).
pub type OnDurable = dyn Fn(u64, &Bytes, Vec<(PendingAppend, WalEntry)>) + Send + Sync;

/// What the writer needs from the log manager.
pub struct WriterContext {
    pub store: Arc<dyn ObjectStore>,
    pub clock: Arc<dyn Clock>,
    pub queue: Arc<WriterQueue>,
    pub stream: u32,
    pub flush_bytes: usize,
    pub flush_interval: Duration,
    /// Start a write at once when none is in flight (see `LogConfig::flush_when_idle`).
    pub flush_when_idle: bool,
    pub max_inflight: usize,
    /// Called for each durable group with its sequence and entries (positions filled in).
    pub on_durable: Arc<OnDurable>,
    /// Set when the writer should stop retrying a write that keeps failing (shutdown with
    /// storage down): the pending appends then fail instead of hanging forever.
    pub give_up: watch::Receiver<bool>,
    /// Called once if another broker sealed this stream.
    pub on_fenced: Arc<dyn Fn() + Send + Sync>,
}

/// The write-ahead put's backoff ceiling: first retry, and the cap it doubles up to.
const PUT_BACKOFF_FIRST: Duration = Duration::from_millis(2);
const PUT_BACKOFF_MAX: Duration = Duration::from_secs(1);

type WriteResult = (u64, Bytes, Vec<PendingAppend>, Vec<WalEntry>, LogResult<()>);

/// Runs until the queue is closed and drained (or a write failed for good).
pub async fn run(ctx: WriterContext) {
    let mut inflight: FuturesOrdered<futures::future::BoxFuture<'static, WriteResult>> =
        FuturesOrdered::new();
    let mut seq: u64 = 0;
    let mut draining = false;
    loop {
        let can_start = !draining && inflight.len() < ctx.max_inflight.max(1);
        let idle = ctx.flush_when_idle && inflight.is_empty();
        tokio::select! {
            biased;
            Some((seq_done, object, items, entries, result)) = inflight.next(), if !inflight.is_empty() => {
                match result {
                    Ok(()) => (ctx.on_durable)(seq_done, &object, items.into_iter().zip(entries).collect()),
                    Err(e) => {
                        tracing::error!(stream = ctx.stream, seq = seq_done, error = %e,
                            "group-commit write failed for good; no further appends are accepted");
                        if matches!(e, LogError::Fenced) {
                            (ctx.on_fenced)();
                        }
                        let why = e.to_string();
                        fail_all(items, &e);
                        // Later writes may have landed, but publishing them would skip the
                        // failed offsets: fail them too. Recovery sorts out what is durable.
                        while let Some((_, _, items, _, _)) = inflight.next().await {
                            fail_all(items, &e);
                        }
                        fail_all(ctx.queue.fail(why), &e);
                        return;
                    }
                }
            }
            group = ctx.queue.next_group(ctx.flush_bytes, ctx.flush_interval, idle, ctx.clock.as_ref()), if can_start => {
                match group {
                    Some(items) => {
                        seq += 1;
                        inflight.push_back(Box::pin(write_group(
                            ctx.store.clone(), ctx.clock.clone(), ctx.queue.clone(), ctx.stream,
                            seq, items, ctx.give_up.clone(),
                        )));
                    }
                    None => draining = true,
                }
            }
            else => {
                if draining && inflight.is_empty() {
                    return;
                }
            }
        }
        if draining && inflight.is_empty() {
            return;
        }
    }
}

fn fail_all(items: Vec<PendingAppend>, e: &LogError) {
    for item in items {
        if let Some(done) = item.done {
            let err = match e {
                LogError::Fenced => LogError::Fenced,
                other => LogError::Storage(StorageError::Unavailable(other.to_string())),
            };
            let _ = done.send(Err(err));
        }
    }
}

async fn write_group(
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
    queue: Arc<WriterQueue>,
    stream: u32,
    seq: u64,
    mut items: Vec<PendingAppend>,
    give_up: watch::Receiver<bool>,
) -> WriteResult {
    let mut batches: Vec<(WalEntry, [Bytes; 2])> = items
        .iter()
        .map(|i| (i.entry.clone(), i.parts.clone()))
        .collect();
    let object = wal::encode(stream, seq, &mut batches);
    let entries: Vec<WalEntry> = batches.into_iter().map(|(e, _)| e).collect();
    let mut stalled = false;
    let result = put_durably(
        store.as_ref(),
        clock.as_ref(),
        (stream, seq),
        object.clone(),
        give_up,
        |error| {
            if stalled {
                queue.stall_update(error);
                return;
            }
            stalled = true;
            queue.stall_begin(error);
            // Not acknowledged: the client retries, and finds its batch (a duplicate) once
            // this write lands, or never if the broker stops first.
            let answer = Stall::of(error);
            for done in items.iter_mut().filter_map(|i| i.done.take()) {
                let _ = done.send(Err(answer.error()));
            }
        },
    )
    .await;
    if stalled {
        queue.stall_end();
        if result.is_ok() {
            tracing::info!(
                stream,
                seq,
                "write-ahead write landed after failing; accepting appends again"
            );
        }
    }
    (seq, object, items, entries, result)
}

/// Writes a write-ahead object create-only until it lands, a seal refuses it, or `give_up`.
///
/// Two policies meet here, deliberately: each put goes through the storage stack's retry
/// layer, which rides out seconds of trouble within a budget (`RetryPolicy`); once that budget
/// is spent, this loop never abandons the write, because appends are waiting on it and giving
/// up would leave the broker unable to accept any until restarted. Its waits are full-jitter
/// backoff drawn from a generator seeded by the object's (stream, seq), so brokers that failed
/// together spread out, and a replay waits the same.
///
/// A retried create can find the object present because an earlier attempt did land even
/// though we saw an error: `holds_our_bytes` tells ours (success) from somebody else's seal
/// (we are fenced).
async fn put_durably(
    store: &dyn ObjectStore,
    clock: &dyn Clock,
    (stream, seq): (u32, u64),
    object: Bytes,
    mut give_up: watch::Receiver<bool>,
    mut on_failure: impl FnMut(&StorageError),
) -> LogResult<()> {
    let key = ObjectKey::new(wal::key(stream, seq))?;
    let mut rng = StdRng::seed_from_u64((u64::from(stream) << 40) ^ seq);
    let mut ceiling = PUT_BACKOFF_FIRST;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match store.put(&key, object.clone(), PutMode::Create).await {
            Ok(_) => return Ok(()),
            Err(StorageError::AlreadyExists(_)) => {
                return match holds_our_bytes(store, &key, &object).await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(LogError::Fenced),
                    Err(e) => Err(e.into()),
                };
            }
            // Only a seal (above) or a request the storage can never accept ends the writer:
            // anything else — a full disk, an I/O error, an outage — may pass, and giving up
            // would leave the broker unable to accept a single append until restarted.
            Err(e) if !matches!(e, StorageError::Invalid(_)) => {
                if attempts == 1 || attempts.is_multiple_of(20) {
                    tracing::warn!(%key, attempts, error = %e, "write-ahead put failed; retrying");
                }
                on_failure(&e);
                if *give_up.borrow() {
                    return Err(e.into());
                }
                tokio::select! {
                    _ = clock.sleep(full_jitter(ceiling, &mut rng)) => {}
                    _ = give_up.changed() => return Err(e.into()),
                }
                ceiling = (ceiling * 2).min(PUT_BACKOFF_MAX);
            }
            Err(e) => return Err(e.into()),
        }
    }
}
