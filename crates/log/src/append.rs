//! The append path: validating a produce's batches, assigning offsets, queueing them for the
//! group commit, and — once the writer reports a write-ahead object durable — publishing its
//! batches to their partitions (tail, cache, high watermark). Publishing is here rather than in
//! the writer so the writer knows nothing of partitions and can be tested on its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::{timeout_at, Clock, Offset, TopicPartition};
use strata_storage::StorageError;
use strata_wire::batch::{self as wire_batch, BatchView, RecordsCheck};
use tokio::sync::{oneshot, watch, Semaphore};

use crate::cache::CachedBatch;
use crate::config::TimestampType;
use crate::manager::LogManager;
use crate::partition::{Serving, TailEntry};
use crate::producer::{BatchInfo, ProducerStates, SeqCheck, TxnGuard, TxnKind};
use crate::shared::{lock_mutex, spawn_delete, Shared};
use crate::wal::{self, WalEntry};
use crate::writer::PendingAppend;
use crate::{LogError, LogResult};

/// How long a produce waits for durability, from the request's acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// acks=0: do not wait for durability (the append is still queued and written).
    /// `timeout` bounds only the wait for room in the in-flight budget.
    None { timeout: Duration },
    /// acks=1 or acks=-1: wait until the batches are durable in storage. With no replicas
    /// besides the storage itself the two mean the same thing.
    Durable { timeout: Duration },
}

/// The result of a successful append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Offset given to the first record of the first batch.
    pub base_offset: Offset,
    /// Broker time stamped on the batches when the topic uses LogAppendTime, else -1.
    pub log_append_time: i64,
    pub log_start_offset: Offset,
}

/// An append whose offsets are assigned; `wait` for it to become durable.
#[derive(Debug)]
pub struct AppendTicket {
    waits: Vec<oneshot::Receiver<LogResult<()>>>,
    /// A retried batch found queued but not yet durable: answer only once the high watermark
    /// passes this offset (one past its last), or a retry would acknowledge undurable data.
    durable_at: Option<(watch::Receiver<Offset>, i64)>,
    /// On `clock`'s monotonic time.
    deadline: Duration,
    clock: Arc<dyn Clock>,
    outcome: AppendOutcome,
}

impl AppendTicket {
    /// Resolves once every batch of the append is durable (at once for acks=0), or fails with
    /// the reason one was not (Timeout if the deadline passed first).
    pub async fn wait(self) -> LogResult<AppendOutcome> {
        for rx in self.waits {
            match timeout_at(self.clock.as_ref(), self.deadline, rx).await {
                Err(_) => return Err(LogError::Timeout),
                Ok(Err(_)) => return Err(LogError::ShuttingDown),
                Ok(Ok(result)) => result?,
            }
        }
        if let Some((mut hw, end)) = self.durable_at {
            let durable = hw.wait_for(|hw| hw.0 >= end);
            match timeout_at(self.clock.as_ref(), self.deadline, durable).await {
                Err(_) => return Err(LogError::Timeout),
                Ok(Err(_)) => return Err(LogError::ShuttingDown),
                Ok(Ok(_)) => {}
            }
        }
        Ok(self.outcome)
    }
}

impl LogManager {
    /// Appends the record batches of one produce partition (raw bytes as the client sent
    /// them). Validates every batch (framing, magic 2, CRC, size, producer sequence) before
    /// accepting any, assigns dense offsets and, unless `acks` is None, returns only once the
    /// data is durable.
    pub async fn append(
        &self,
        tp: &TopicPartition,
        records: Bytes,
        acks: Acks,
    ) -> LogResult<AppendOutcome> {
        self.enqueue(tp, records, acks).await?.wait().await
    }

    /// The first half of [`Self::append`]: validates, assigns offsets and queues the batches
    /// for the group commit, then returns a ticket to wait for durability with. Offsets are
    /// assigned in the order `enqueue` calls complete, so a caller that must keep its requests
    /// in order (a connection's pipelined produces) enqueues them one after another and waits
    /// for them concurrently.
    pub async fn enqueue(
        &self,
        tp: &TopicPartition,
        records: Bytes,
        acks: Acks,
    ) -> LogResult<AppendTicket> {
        self.enqueue_from(tp, records, acks, Origin::Client, None)
            .await
    }

    /// [`Self::enqueue`] for a produce whose producer's standing was taken as `guard` before
    /// its coordinator verified it ([`Self::txn_guard`]): a batch that would open a
    /// transaction is refused (InvalidTxnState) unless the standing is still `guard`, that is
    /// unless no marker of that producer landed here since. Kafka's verification guard.
    pub async fn enqueue_guarded(
        &self,
        tp: &TopicPartition,
        records: Bytes,
        acks: Acks,
        guard: TxnGuard,
    ) -> LogResult<AppendTicket> {
        self.enqueue_from(tp, records, acks, Origin::Client, Some(guard))
            .await
    }

    /// [`Self::enqueue`] for batches of either origin: the coordinator's (transaction markers)
    /// skip the rules Kafka applies to producers' batches only, and nothing else.
    pub(crate) async fn enqueue_from(
        &self,
        tp: &TopicPartition,
        records: Bytes,
        acks: Acks,
        origin: Origin,
        guard: Option<TxnGuard>,
    ) -> LogResult<AppendTicket> {
        let shared = &self.shared;
        let part = self.partition_readable(tp)?;
        if part.lock().serving.is_suspended() {
            // Kept readable while our lease is in doubt: say why appends are refused. The
            // storage refusing our heartbeats is the usual cause, and the client retries.
            shared.queue.check_accepting()?;
            return Err(LogError::Storage(StorageError::Unavailable(
                "ownership in doubt: this broker's heartbeats are not landing in storage".into(),
            )));
        }
        let topic = self
            .topic(&tp.topic)
            .ok_or(LogError::UnknownTopicOrPartition)?;
        let batches = wire_batch::split_batches(&records)?;
        if batches.is_empty() {
            return Err(LogError::InvalidRequest(
                "produce with no record batch".into(),
            ));
        }
        let max = topic.config.max_message_bytes.max(0) as usize;
        let mut max_timestamps = Vec::with_capacity(batches.len());
        let mut compressed = Vec::new();
        for (i, b) in batches.iter().enumerate() {
            if b.encoded_len() > max {
                return Err(LogError::MessageTooLarge {
                    size: b.encoded_len(),
                    max,
                });
            }
            if origin == Origin::Client {
                // Refuses control batches (INVALID_RECORD, as Kafka 4's LogValidator does).
                wire_batch::validate_client_batch(b)?;
                if b.is_transactional() && b.producer_id() < 0 {
                    return Err(LogError::InvalidTxnState(
                        "a transactional batch without a producer id".into(),
                    ));
                }
            }
            // Like Kafka, trust the records over the header for an uncompressed batch's max
            // timestamp: it drives retention and timestamp lookups.
            max_timestamps.push(match wire_batch::validate_records(b)? {
                RecordsCheck::Verified { max_timestamp } => max_timestamp,
                RecordsCheck::Compressed => {
                    compressed.push(i);
                    b.max_timestamp()
                }
            });
        }
        if !compressed.is_empty() {
            let views = compressed.iter().map(|i| batches[*i].clone()).collect();
            let limit = limit_for(shared, max);
            let checks = check_compressed(&shared.decompressions, views, limit).await?;
            for (i, check) in compressed.iter().zip(checks) {
                if let RecordsCheck::Verified { max_timestamp } = check {
                    max_timestamps[*i] = max_timestamp;
                }
            }
        }
        if topic.config.cleanup_policy.compact {
            check_keys(&shared.decompressions, &batches, limit_for(shared, max)).await?;
        }
        shared.queue.check_accepting()?;

        // Backpressure: hold the request's bytes against the broker-wide in-flight budget.
        let timeout = match acks {
            Acks::Durable { timeout } | Acks::None { timeout } => timeout,
        };
        let want = records
            .len()
            .clamp(1, shared.config.max_pending_bytes.max(1)) as u32;
        let permit = match strata_core::timeout(
            shared.clock.as_ref(),
            timeout,
            shared.pending_bytes.clone().acquire_many_owned(want),
        )
        .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(LogError::ShuttingDown),
            Err(_) => return Err(LogError::Backpressure),
        };

        let log_append_time = match topic.config.timestamp_type {
            TimestampType::LogAppendTime => Some(shared.clock.wall_millis()),
            TimestampType::CreateTime => None,
        };
        let now = shared.clock.monotonic();
        let mut waits = Vec::new();
        let mut durable_at: Option<(watch::Receiver<Offset>, i64)> = None;
        let (first_base, log_start) = {
            let mut st = part.lock();
            // Suspended since the check above: refused like a handover racing the append.
            if st.serving != Serving::Active {
                return Err(LogError::NotOwner);
            }
            // Markers pass: they are tiny, and refusing them would leave transactions open.
            if origin == Origin::Client
                && (st.tail_bytes >= shared.config.max_uncompacted_bytes
                    || st.tail.len() >= shared.config.max_uncompacted_batches)
            {
                return Err(LogError::CompactionBehind {
                    bytes: st.tail_bytes,
                    batches: st.tail.len(),
                    max_bytes: shared.config.max_uncompacted_bytes,
                    max_batches: shared.config.max_uncompacted_batches,
                });
            }
            let infos: Vec<BatchInfo> = batches
                .iter()
                .zip(&max_timestamps)
                .map(|(b, max_ts)| BatchInfo {
                    producer_id: b.producer_id(),
                    producer_epoch: b.producer_epoch(),
                    base_sequence: b.base_sequence(),
                    record_count: b.record_count(),
                    base_offset: 0,
                    max_timestamp: log_append_time.unwrap_or(*max_ts),
                    kind: kind_of(b),
                })
                .collect();
            let decisions = match check_producers(
                &st.producers,
                &infos,
                shared.config.max_aborted_transactions,
                guard,
            ) {
                Ok(d) => d,
                Err(e) => {
                    // Debug, not info: a client can send these at will. What a fault campaign
                    // needs to tell a retry the log forgot from a client's own resend.
                    let first = infos.first();
                    tracing::debug!(partition = %tp, epoch = part.epoch(),
                        producer_id = first.map(|b| b.producer_id),
                        producer_epoch = first.map(|b| b.producer_epoch),
                        base_sequence = first.map(|b| b.base_sequence),
                        records = first.map(|b| b.record_count),
                        error = %e, "produce refused by the producer state");
                    return Err(e);
                }
            };
            for (b, decision) in batches.iter().zip(&decisions) {
                if let SeqCheck::Duplicate { base_offset } = decision {
                    tracing::debug!(partition = %tp, epoch = part.epoch(),
                        producer_id = b.producer_id(), producer_epoch = b.producer_epoch(),
                        base_sequence = b.base_sequence(), base_offset,
                        "retried batch recognised as a duplicate");
                    let end = base_offset + b.last_offset_delta() as i64 + 1;
                    if end > st.high_watermark {
                        let later = durable_at.as_ref().map_or(0, |(_, e)| *e).max(end);
                        durable_at = Some((part.hw.subscribe(), later));
                    }
                }
            }
            let mut first_base = None;
            let mut permit = Some(permit);
            let appended = decisions.iter().filter(|d| **d == SeqCheck::Append).count();
            let mut seen = 0;
            for ((b, decision), info) in batches.iter().zip(decisions).zip(&infos) {
                if let SeqCheck::Duplicate { base_offset } = decision {
                    first_base.get_or_insert(base_offset);
                    continue;
                }
                seen += 1;
                let base_offset = st.next_offset;
                first_base.get_or_insert(base_offset);
                let stored = wire_batch::rewrite_for_append(
                    b,
                    base_offset,
                    part.epoch() as i32,
                    log_append_time,
                );
                st.next_offset += b.last_offset_delta() as i64 + 1;
                st.producers.apply(&BatchInfo {
                    base_offset,
                    ..*info
                });
                let done = match acks {
                    Acks::None { .. } => None,
                    Acks::Durable { .. } => {
                        let (tx, rx) = oneshot::channel();
                        waits.push(rx);
                        Some(tx)
                    }
                };
                let entry = WalEntry {
                    topic_id: part.topic_id,
                    partition: tp.partition,
                    base_offset,
                    last_offset_delta: b.last_offset_delta() as u32,
                    position: 0,
                    length: 0,
                    max_timestamp: info.max_timestamp,
                    producer_id: b.producer_id(),
                    producer_epoch: b.producer_epoch(),
                    base_sequence: b.base_sequence(),
                    record_count: b.record_count(),
                    kind: info.kind,
                };
                let (header, body) = stored.into_parts();
                shared.queue.push(
                    PendingAppend {
                        partition: part.clone(),
                        entry,
                        parts: [header, body],
                        done,
                        // The last batch carries the budget, so it is freed once all are durable.
                        permit: if seen == appended {
                            permit.take()
                        } else {
                            None
                        },
                    },
                    now,
                );
            }
            (first_base.unwrap_or(st.next_offset), st.log_start)
        };

        Ok(AppendTicket {
            waits,
            durable_at,
            deadline: shared.clock.monotonic().saturating_add(timeout),
            clock: Arc::clone(&shared.clock),
            outcome: AppendOutcome {
                base_offset: Offset(first_base),
                log_append_time: log_append_time.unwrap_or(-1),
                log_start_offset: Offset(log_start),
            },
        })
    }
}

/// Decompresses compressed batches to check their records, on a blocking thread: a batch can
/// take milliseconds of CPU, which must not stall the connection tasks sharing the runtime's
/// workers (the CRC and the uncompressed walk stay inline: they read each byte once, at memory
/// speed). `slots` bounds how many run at once.
/// How far one batch may inflate when decompressed on append.
fn limit_for(shared: &Shared, max_message_bytes: usize) -> u64 {
    shared
        .config
        .max_decompressed_batch_bytes
        .max(max_message_bytes) as u64
}

/// A compacted topic refuses a batch holding a record without a key, as Kafka's
/// `LogValidator.validateKey` does, before anything is appended. Compressed batches are
/// decompressed again for it (on the blocking pool, in a decompression slot): the validation
/// walk above skips keys and keeps nothing, and only compacted topics pay for the second pass.
async fn check_keys(slots: &Arc<Semaphore>, batches: &[BatchView], limit: u64) -> LogResult<()> {
    let first_keyless = move |b: &BatchView| -> LogResult<()> {
        match strata_wire::clean::first_keyless_record(b, limit)? {
            Some(index) => Err(LogError::CorruptMessage(
                wire_batch::BatchError::KeylessRecordOnCompactedTopic { index },
            )),
            None => Ok(()),
        }
    };
    let (plain, compressed): (Vec<&BatchView>, Vec<&BatchView>) = batches
        .iter()
        .partition(|b| b.compression() == strata_wire::Compression::None);
    for b in plain {
        first_keyless(b)?;
    }
    if compressed.is_empty() {
        return Ok(());
    }
    let owned: Vec<BatchView> = compressed.into_iter().cloned().collect();
    let _slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| LogError::ShuttingDown)?;
    tokio::task::spawn_blocking(move || owned.iter().try_for_each(first_keyless))
        .await
        .map_err(|e| {
            LogError::CorruptMessage(wire_batch::BatchError::InvalidRecords(format!(
                "decompression failed: {e}"
            )))
        })?
}

async fn check_compressed(
    slots: &Arc<Semaphore>,
    batches: Vec<BatchView>,
    limit: u64,
) -> LogResult<Vec<RecordsCheck>> {
    let _slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| LogError::ShuttingDown)?;
    let checked = tokio::task::spawn_blocking(move || {
        batches
            .iter()
            .map(|b| strata_wire::validate_compressed_records(b, limit))
            .collect::<Result<Vec<_>, _>>()
    })
    .await;
    match checked {
        Ok(result) => Ok(result?),
        // Only a panic inside a decompressor gets here (the runtime is not shutting down while
        // a request is served): the batch is what it choked on.
        Err(e) => Err(LogError::CorruptMessage(
            wire_batch::BatchError::InvalidRecords(format!("decompression failed: {e}")),
        )),
    }
}

/// Who a batch comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A producer's Produce request.
    Client,
    /// The transaction coordinator's marker (WriteTxnMarkers), built by this broker.
    Coordinator,
}

fn kind_of(b: &BatchView) -> TxnKind {
    if b.is_control() {
        TxnKind::of_stored(b.bytes())
    } else if b.is_transactional() {
        TxnKind::Data
    } else {
        TxnKind::None
    }
}

/// Checks every idempotent or transactional batch of one append against a scratch copy of the
/// producers' state, so that either all batches are acceptable or none is appended. A batch
/// that would start a transaction is refused once the partition remembers
/// `max_aborted` aborted ones.
fn check_producers(
    states: &ProducerStates,
    batches: &[BatchInfo],
    max_aborted: usize,
    guard: Option<TxnGuard>,
) -> LogResult<Vec<SeqCheck>> {
    let mut scratch: Option<ProducerStates> = None;
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        if b.producer_id < 0 {
            out.push(SeqCheck::Append);
            continue;
        }
        let view = scratch.as_ref().unwrap_or(states);
        let decision = view.check_batch(b)?;
        if decision == SeqCheck::Append {
            if view.opens_txn(b) {
                if let Some(guard) = guard {
                    let now = view.txn_guard(b.producer_id);
                    if guard != now {
                        return Err(LogError::InvalidTxnState(format!(
                            "producer {}'s transaction ended here while its produce was being \
                             verified (guard {guard:?}, now {now:?}): the batch is not part of \
                             an ongoing transaction",
                            b.producer_id
                        )));
                    }
                }
                if states.aborted.len() >= max_aborted {
                    return Err(LogError::TooManyAbortedTransactions { max: max_aborted });
                }
            }
            if batches.len() > 1 {
                // The aborted list is not needed to check the request's next batches.
                let copy = || ProducerStates {
                    producers: states.producers.clone(),
                    aborted: Vec::new(),
                };
                scratch.get_or_insert_with(copy).apply(b);
            }
        }
        out.push(decision);
    }
    Ok(out)
}

/// Publishes a durable group: runs on the writer task, in sequence order.
pub(crate) fn publish(
    shared: &Arc<Shared>,
    seq: u64,
    object: &Bytes,
    items: Vec<(PendingAppend, WalEntry)>,
) {
    let now = shared.clock.monotonic();
    let mut live = 0usize;
    let mut admitted = Vec::with_capacity(items.len());
    for (item, entry) in items {
        let part = item.partition.clone();
        // The cache shares the write-ahead object's buffer: no copy per batch.
        let bytes = object.slice(entry.position as usize..(entry.position + entry.length) as usize);
        let hw = {
            let mut st = part.lock();
            if st.serving == Serving::Gone {
                None
            } else {
                let tail = TailEntry {
                    base_offset: entry.base_offset,
                    last_offset: entry.last_offset(),
                    max_timestamp: entry.max_timestamp,
                    stream: shared.stream,
                    seq,
                    position: entry.position,
                    length: entry.length,
                    producer_id: entry.producer_id,
                    producer_epoch: entry.producer_epoch,
                    base_sequence: entry.base_sequence,
                    record_count: entry.record_count,
                    kind: entry.kind,
                };
                st.txns.apply(&tail.info());
                st.tail.push_back(tail);
                st.tail_bytes += entry.length as usize;
                st.tail_since.get_or_insert(now);
                st.cache.push_back(CachedBatch {
                    base_offset: tail.base_offset,
                    last_offset: tail.last_offset,
                    bytes: bytes.clone(),
                });
                st.high_watermark = tail.last_offset + 1;
                live += 1;
                Some(st.high_watermark)
            }
        };
        if let Some(hw) = hw {
            part.hw.send_replace(Offset(hw));
            admitted.push((part, entry.base_offset, bytes.len()));
        }
        if let Some(done) = item.done {
            let _ = done.send(if hw.is_some() {
                Ok(())
            } else {
                Err(LogError::UnknownTopicOrPartition)
            });
        }
        drop(item.permit);
    }
    if live > 0 {
        lock_mutex(&shared.wal_live).insert((shared.stream, seq), live);
    }
    // This object is now the stream's newest: one held back as the previous newest may go.
    let deferred = {
        let mut newest = lock_mutex(&shared.wal_newest);
        newest.0 = seq;
        let previous = newest.1.take();
        if live == 0 {
            newest.1 = Some(seq);
        }
        previous
    };
    if let Some(old) = deferred {
        spawn_delete(shared, wal::key(shared.stream, old));
    }
    for (part, base, len) in admitted {
        shared.cache.admitted(&part, base, len);
    }
}
