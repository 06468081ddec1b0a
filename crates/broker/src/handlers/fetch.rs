//! Fetch (v4–v16): long poll, with fetch sessions.
//!
//! A fetch reads its partitions in request order within `max_bytes` (and each partition within
//! its `partition_max_bytes`); the first partition with data always gets at least one whole
//! batch, however large, so a consumer can never get stuck behind a big batch (KIP-74). If
//! fewer than `min_bytes` are available the request waits, up to `max_wait_ms`, on the high
//! watermarks of all its partitions and reads again as soon as any of them moves. Errors and
//! shutdown end the wait at once.
//!
//! Fetch sessions (KIP-227, v7+): the session cache ([`crate::fetch_sessions`]) turns an
//! incremental request into the session's partitions, read here like a full fetch's, and
//! picks which of them the answer lists; a full fetch asking for a session gets one if the
//! cache has room. An incremental fetch with nothing to list waits for data like any other.
//!
//! Transactions: isolation_level 1 (read_committed) reads only below each partition's last
//! stable offset and lists the aborted transactions the returned batches overlap; both levels
//! report the last stable offset. A read_committed long poll waits on the high watermark like
//! any other: the last stable offset only moves when a marker becomes durable, which moves the
//! high watermark too, so every move of it wakes the fetch.
//!
//! Zero copy: each partition's records are the list of batches the log returned, and
//! strata-wire's Fetch encoder ([`FetchResponseChunks`]) writes every batch of 512 bytes or more
//! to the socket from its own buffer; only smaller ones are copied into the response buffer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::select_all;
use kafka_protocol::messages::fetch_response::AbortedTransaction;
use kafka_protocol::messages::{FetchRequest, ProducerId, TopicName};
use strata_core::{Offset, TopicPartition};
use strata_log::{Isolation, LogError, ReadOutcome, TopicInfo, Watermarks};
use strata_wire::{FetchPartitionChunks, FetchResponseChunks, FetchTopicChunks};
use tokio::sync::watch;

use super::{check_leader_epoch, leader_epoch_of, topic_id_of};
use crate::authorize::{Authz, Op, Res};
use crate::errors::{code, error_code, fetch_session_error_code};
use crate::fetch_sessions::{Begin, PartitionKey, Seen, TopicKey, Wants};
use crate::framing::{encode_fetch_response, EncodeError, ResponseFrame};
use crate::quotas::QuotaKind;
use crate::server::Broker;
use crate::RequestContext;

/// Answers a Fetch, with the client's fetch quota applied as Kafka applies it: the read is
/// bounded by what the quota allows over its whole window; the records read are counted;
/// over the quota, the answer carries no partitions (only `throttle_time_ms`, and the
/// session id of an incremental fetch), the records are not counted after all, and the
/// connection is muted for the returned time.
pub(crate) async fn handle(
    broker: &Broker,
    mut request: FetchRequest,
    ctx: &RequestContext,
) -> Result<(ResponseFrame, std::time::Duration), EncodeError> {
    let quotas = &broker.quotas;
    let (user, client_id) = (
        ctx.principal.name.as_str(),
        ctx.client_id.as_deref().unwrap_or(""),
    );
    if let Some(max) = quotas.max_in_window(QuotaKind::Fetch, user, client_id) {
        // f64 to i32 saturates; at least one byte, as Kafka reads at least one batch anyway.
        request.max_bytes = request.max_bytes.min((max as i32).max(1));
    }
    let incremental = request.session_id != 0 && request.session_epoch > 0;
    let mut response = fetch(broker, request, ctx).await;
    let bytes: usize = response
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .flat_map(|p| p.records.iter().flatten())
        .map(Bytes::len)
        .sum();
    let bandwidth = quotas.record(QuotaKind::Fetch, user, client_id, bytes as f64);
    // Kafka: either quota exceeded answers the fetch empty, with the longer throttle.
    let mute = bandwidth.max(crate::dispatch::request_throttle(broker, ctx));
    if !mute.is_zero() {
        quotas.unrecord(QuotaKind::Fetch, user, client_id, bytes as f64);
        // Kafka's FetchContext.getThrottledResponse: the records read wait for the next
        // fetch at the same offsets; a full fetch's new session is not handed out.
        response.topics.clear();
        if !incremental {
            response.fields.session_id = 0;
        }
    }
    response.fields.throttle_time_ms = i32::try_from(mute.as_millis()).unwrap_or(i32::MAX);
    ctx.errors.add(response.fields.error_code);
    for partition in response.topics.iter().flat_map(|t| &t.partitions) {
        ctx.errors.add(partition.fields.error_code);
    }
    Ok((
        encode_fetch_response(ctx.correlation_id, &response, ctx.api_version)?,
        mute,
    ))
}

/// One partition to read, resolved.
struct Wanted {
    key: PartitionKey,
    wants: Wants,
    target: Result<TopicPartition, i16>,
}

/// What one read pass found for a partition.
struct Found {
    error: i16,
    watermarks: Option<Watermarks>,
    batches: Vec<Bytes>,
    /// read_committed: aborted transactions (producer id, first offset) the batches overlap.
    aborted: Option<Vec<(i64, i64)>>,
}

/// The request's partitions and forgotten partitions, keyed as the session cache keys them.
fn request_partitions(
    request: &mut FetchRequest,
    uses_topic_ids: bool,
) -> (Vec<(PartitionKey, Wants)>, Vec<PartitionKey>) {
    let topic_key = |name: &TopicName, id: &uuid::Uuid| {
        if uses_topic_ids {
            TopicKey::Id(*id)
        } else {
            TopicKey::Name(name.0.clone())
        }
    };
    let mut requested = Vec::new();
    for topic in std::mem::take(&mut request.topics) {
        let topic_key = topic_key(&topic.topic, &topic.topic_id);
        for p in topic.partitions {
            let key = PartitionKey {
                topic: topic_key.clone(),
                partition: p.partition,
            };
            let wants = Wants {
                fetch_offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes,
                current_leader_epoch: p.current_leader_epoch,
            };
            requested.push((key, wants));
        }
    }
    let mut forgotten = Vec::new();
    for topic in std::mem::take(&mut request.forgotten_topics_data) {
        let topic_key = topic_key(&topic.topic, &topic.topic_id);
        forgotten.extend(topic.partitions.into_iter().map(|partition| PartitionKey {
            topic: topic_key.clone(),
            partition,
        }));
    }
    (requested, forgotten)
}

/// Resolves each partition to the log's, or to the error its answer carries.
fn resolve(
    broker: &Broker,
    authz: &Authz<'_>,
    v: i16,
    partitions: Vec<(PartitionKey, Wants)>,
) -> Vec<Wanted> {
    // Looking a topic up by id scans the catalog: once per topic, not per partition.
    let mut topics: HashMap<TopicKey, Result<Arc<TopicInfo>, i16>> = HashMap::new();
    partitions
        .into_iter()
        .map(|(key, wants)| {
            let info = topics
                .entry(key.topic.clone())
                .or_insert_with(|| match &key.topic {
                    TopicKey::Id(id) => match broker.log.topic_by_id(topic_id_of(id)) {
                        Some(info) if !authz.allows(Op::Read, Res::Topic, &info.name) => {
                            Err(code::TOPIC_AUTHORIZATION_FAILED)
                        }
                        Some(info) => Ok(info),
                        None => Err(code::UNKNOWN_TOPIC_ID),
                    },
                    // Checked before the lookup: a refusal must not tell whether it exists.
                    TopicKey::Name(name) if !authz.allows(Op::Read, Res::Topic, name) => {
                        Err(code::TOPIC_AUTHORIZATION_FAILED)
                    }
                    TopicKey::Name(name) => broker
                        .log
                        .topic(name.as_str())
                        .ok_or(code::UNKNOWN_TOPIC_OR_PARTITION),
                })
                .clone();
            let target = info.and_then(|info| {
                if key.partition < 0 || key.partition >= info.partitions {
                    return Err(code::UNKNOWN_TOPIC_OR_PARTITION);
                }
                let tp = TopicPartition::new(Arc::clone(&info.name), key.partition);
                if v >= 9 {
                    let epoch_error = check_leader_epoch(
                        wants.current_leader_epoch,
                        leader_epoch_of(broker, &tp),
                    );
                    if epoch_error != code::NONE {
                        return Err(epoch_error);
                    }
                }
                Ok(tp)
            });
            Wanted { key, wants, target }
        })
        .collect()
}

async fn fetch(
    broker: &Broker,
    mut request: FetchRequest,
    ctx: &RequestContext,
) -> FetchResponseChunks {
    let v = ctx.api_version;
    let uses_topic_ids = v >= 13;
    let mut response = FetchResponseChunks::default();
    let (requested, forgotten) = request_partitions(&mut request, uses_topic_ids);
    let begin = if v >= 7 {
        broker.fetch_sessions.begin(
            broker.clock.monotonic(),
            request.session_id,
            request.session_epoch,
            uses_topic_ids,
            &requested,
            &forgotten,
        )
    } else {
        Begin::Full { create: false }
    };
    let (session, partitions) = match begin {
        Begin::Error(error) => {
            response.fields.error_code = fetch_session_error_code(&error);
            return response;
        }
        Begin::Full { create } => (Session::Full { create }, requested),
        Begin::Incremental { id, partitions } => (Session::Incremental(id), partitions),
    };
    let wanted = resolve(broker, &broker.authz(ctx), v, partitions);

    let isolation = if request.isolation_level == 1 {
        Isolation::ReadCommitted
    } else {
        Isolation::ReadUncommitted
    };
    let max_bytes = usize::try_from(request.max_bytes).unwrap_or(0);
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
    let may_wait = !max_wait.is_zero() && min_bytes > 0;

    // Subscribe before the first read so that no append between the read and the wait is
    // missed: a receiver only reports values newer than the one marked seen here.
    let mut watermarks: Vec<watch::Receiver<Offset>> = Vec::new();
    if may_wait {
        for w in &wanted {
            if let Ok(tp) = &w.target {
                if let Ok(mut rx) = broker.log.subscribe(tp) {
                    rx.borrow_and_update();
                    watermarks.push(rx);
                }
            }
        }
    }
    let mut deadline = broker.clock.sleep(max_wait);
    let mut shutdown = ctx.shutdown.clone();

    let found = loop {
        let (found, bytes, any_error) = read_pass(broker, &wanted, max_bytes, isolation).await;
        if !may_wait || bytes >= min_bytes || any_error || *shutdown.borrow() {
            break found;
        }
        match wait_for_append(&mut watermarks, &mut deadline, &mut shutdown).await {
            Wake::Appended => continue,
            Wake::Deadline | Wake::Shutdown => {
                // Read once more: data may have landed as the wait ended.
                break read_pass(broker, &wanted, max_bytes, isolation).await.0;
            }
        }
    };

    let answers: Vec<(FetchPartitionChunks, Seen)> = wanted
        .iter()
        .zip(found)
        .map(|(w, f)| answer(v, w, f))
        .collect();
    let listed = match session {
        Session::Full { create } => {
            if create {
                let read: Vec<_> = wanted
                    .iter()
                    .zip(&answers)
                    .map(|(w, (_, seen))| (w.key.clone(), w.wants, *seen))
                    .collect();
                response.fields.session_id = broker.fetch_sessions.finish_full(
                    broker.clock.monotonic(),
                    uses_topic_ids,
                    &read,
                );
            }
            vec![true; answers.len()]
        }
        Session::Incremental(id) => {
            response.fields.session_id = id;
            let seen: Vec<_> = wanted
                .iter()
                .zip(&answers)
                .map(|(w, (_, seen))| (&w.key, *seen))
                .collect();
            broker.fetch_sessions.finish_incremental(id, &seen)
        }
    };

    // Consecutive partitions of one topic share a topic entry, as in Kafka's answers; a topic
    // whose partitions are apart in a session's order appears once per run.
    let mut topics: Vec<(TopicKey, FetchTopicChunks)> = Vec::new();
    for ((w, (partition, seen)), listed) in wanted.iter().zip(answers).zip(listed) {
        if !listed {
            continue;
        }
        if let Ok(tp) = &w.target {
            broker.traffic.fetched(&tp.topic, seen.record_bytes as u64);
        }
        let same_topic = topics.last().is_some_and(|(key, _)| *key == w.key.topic);
        if !same_topic {
            let mut topic = FetchTopicChunks::default();
            match &w.key.topic {
                TopicKey::Id(id) => topic.fields.topic_id = *id,
                TopicKey::Name(name) => topic.fields.topic = TopicName(name.clone()),
            }
            topics.push((w.key.topic.clone(), topic));
        }
        if let Some((_, topic)) = topics.last_mut() {
            topic.partitions.push(partition);
        }
    }
    response.fields.error_code = code::NONE;
    response.topics = topics.into_iter().map(|(_, topic)| topic).collect();
    response
}

/// Whether the fetch is answered in full or through a session.
enum Session {
    Full { create: bool },
    Incremental(i32),
}

/// One partition's answer, and what the session remembers of it.
fn answer(v: i16, w: &Wanted, f: Found) -> (FetchPartitionChunks, Seen) {
    let mut partition = FetchPartitionChunks::default();
    let p = &mut partition.fields;
    p.partition_index = w.key.partition;
    p.error_code = f.error;
    match (f.error, f.watermarks) {
        (code::NONE, Some(marks)) => {
            p.high_watermark = marks.high.get();
            p.last_stable_offset = marks.last_stable.get();
            if v >= 5 {
                p.log_start_offset = marks.log_start.get();
            }
        }
        _ => {
            // Kafka reports unknown watermarks as -1 with an error.
            p.high_watermark = -1;
            p.last_stable_offset = -1;
        }
    }
    p.aborted_transactions = f.aborted.map(|aborted| {
        aborted
            .into_iter()
            .map(|(producer_id, first_offset)| {
                let mut a = AbortedTransaction::default();
                a.producer_id = ProducerId(producer_id);
                a.first_offset = first_offset;
                a
            })
            .collect()
    });
    let seen = Seen {
        record_bytes: f.batches.iter().map(Bytes::len).sum(),
        error: p.error_code,
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        log_start_offset: p.log_start_offset,
    };
    partition.records = Some(f.batches);
    (partition, seen)
}

/// Reads every partition once, in request order, within the response and partition limits.
/// Returns what was found, the bytes found, and whether any partition failed.
async fn read_pass(
    broker: &Broker,
    wanted: &[Wanted],
    max_bytes: usize,
    isolation: Isolation,
) -> (Vec<Found>, usize, bool) {
    let mut found = Vec::with_capacity(wanted.len());
    let mut total = 0usize;
    let mut any_error = false;
    for w in wanted {
        let tp = match &w.target {
            Ok(tp) => tp,
            Err(error) => {
                any_error = true;
                found.push(Found {
                    error: *error,
                    watermarks: None,
                    batches: Vec::new(),
                    aborted: None,
                });
                continue;
            }
        };
        let partition_max = usize::try_from(w.wants.max_bytes).unwrap_or(0);
        let limit = partition_max.min(max_bytes.saturating_sub(total));
        // Only the first partition with data may exceed the limits (by one batch).
        let min_one_batch = total == 0;
        let result = if limit == 0 && !min_one_batch {
            broker.log.watermarks(tp).map(|marks| ReadOutcome {
                watermarks: Some(marks),
                aborted: (isolation == Isolation::ReadCommitted).then(Vec::new),
                ..ReadOutcome::default()
            })
        } else {
            read_partition(
                broker,
                tp,
                w.wants.fetch_offset,
                limit,
                min_one_batch,
                isolation,
            )
            .await
        };
        match result {
            Ok(outcome) => {
                total += outcome.batches.iter().map(Bytes::len).sum::<usize>();
                found.push(Found {
                    error: code::NONE,
                    watermarks: outcome.watermarks,
                    batches: outcome.batches,
                    aborted: outcome.aborted,
                });
            }
            Err(e) => {
                any_error = true;
                if !matches!(e, LogError::OffsetOutOfRange { .. }) {
                    tracing::debug!(partition = %tp, error = %e, "fetch read failed");
                }
                found.push(Found {
                    error: error_code(&e),
                    watermarks: None,
                    batches: Vec::new(),
                    aborted: None,
                });
            }
        }
    }
    (found, total, any_error)
}

async fn read_partition(
    broker: &Broker,
    tp: &TopicPartition,
    offset: i64,
    limit: usize,
    min_one_batch: bool,
    isolation: Isolation,
) -> Result<ReadOutcome, LogError> {
    let mut outcome = broker
        .log
        .read_isolated(tp, Offset(offset), limit, min_one_batch, isolation)
        .await?;
    if outcome.watermarks.is_none() {
        outcome.watermarks = Some(broker.log.watermarks(tp)?);
    }
    Ok(outcome)
}

enum Wake {
    Appended,
    Deadline,
    Shutdown,
}

/// Waits until any watched high watermark moves, the deadline passes, or shutdown starts.
async fn wait_for_append(
    watermarks: &mut Vec<watch::Receiver<Offset>>,
    deadline: &mut strata_core::Sleep,
    shutdown: &mut watch::Receiver<bool>,
) -> Wake {
    // A partition deleted while we wait closes its channel; stop watching it so it cannot wake
    // us in a loop.
    watermarks.retain(|rx| rx.has_changed().is_ok());
    let any_append = async {
        if watermarks.is_empty() {
            std::future::pending::<()>().await;
        } else {
            let changes = watermarks.iter_mut().map(|rx| Box::pin(rx.changed()));
            let _ = select_all(changes).await;
        }
    };
    tokio::select! {
        _ = any_append => Wake::Appended,
        _ = deadline => Wake::Deadline,
        changed = shutdown.changed() => {
            let _ = changed;
            Wake::Shutdown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BrokerParts, BrokerSettings};
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchResponse, TopicName};
    use kafka_protocol::protocol::{Decodable, StrBytes};
    use std::net::SocketAddr;
    use strata_core::{BrokerId, SystemClock};
    use strata_log::{Acks, LogConfig, LogManager};
    use strata_storage::MemoryStore;

    fn ctx(version: i16) -> RequestContext {
        RequestContext {
            api_version: version,
            correlation_id: 9,
            client_id: None,
            peer: SocketAddr::from(([127, 0, 0, 1], 1)),
            shutdown: watch::channel(false).1,
            produce_turn: Default::default(),
            principal: std::sync::Arc::new(crate::security::Principal::anonymous()),
            listener: std::sync::Arc::new(crate::security::Listener::plaintext("127.0.0.1", 9092)),
            errors: Default::default(),
            busy: std::sync::Arc::new(crate::quotas::busy::BusyMeter::new(SystemClock::shared())),
        }
    }

    /// The whole handler on a memory log: every stored batch of 512 bytes or more goes out as
    /// its own chunk, pointing at the log's memory, and the frame decodes to the batches.
    #[tokio::test]
    async fn a_fetch_sends_the_logs_batches_from_their_own_memory() {
        let clock = SystemClock::shared();
        let log = LogManager::open(
            Arc::new(MemoryStore::new()),
            Arc::clone(&clock),
            LogConfig::default(),
            BrokerId(0),
        )
        .await
        .unwrap();
        let info = log
            .create_topic("zero-copy", Some(1), Default::default(), false)
            .await
            .unwrap();
        let tp = TopicPartition::new("zero-copy", 0);
        // Sizes around the 512-byte threshold: small batches are copied, the others not.
        for (i, len) in [700usize, 100, 4000, 511, 513].into_iter().enumerate() {
            let value = vec![b'a' + i as u8; len];
            let batch = crate::tests::record_batch(&[&value], 1_700_000_000_000);
            let acks = Acks::Durable {
                timeout: Duration::from_secs(20),
            };
            log.append(&tp, batch, acks).await.unwrap();
        }
        let stored = log
            .read(&tp, Offset(0), 1 << 20, true)
            .await
            .unwrap()
            .batches;
        assert_eq!(stored.len(), 5);
        let broker = Broker::open(BrokerParts {
            log: Arc::clone(&log),
            clock,
            settings: BrokerSettings::default(),
            member_id_seed: 1,
        })
        .await
        .unwrap();
        for version in [4, 11, 12, 13, 16] {
            let mut partition = FetchPartition::default();
            partition.partition_max_bytes = 1 << 20;
            let mut topic = FetchTopic::default();
            topic.topic = TopicName(StrBytes::from_static_str("zero-copy"));
            topic.topic_id = super::super::uuid_of(info.id);
            topic.partitions = vec![partition];
            let mut request = FetchRequest::default();
            request.max_bytes = 1 << 20;
            request.topics = vec![topic];
            let (frame, _) = handle(&broker, request, &ctx(version)).await.unwrap();
            for batch in stored.iter().filter(|batch| batch.len() >= 512) {
                assert!(
                    frame
                        .chunks
                        .iter()
                        .any(|c| c.as_ptr() == batch.as_ptr() && c.len() == batch.len()),
                    "v{version}: a {}-byte batch was copied",
                    batch.len()
                );
            }
            let mut body = Bytes::from(frame.to_vec()).slice(4..);
            kafka_protocol::messages::ResponseHeader::decode(
                &mut body,
                <FetchResponse as kafka_protocol::protocol::HeaderVersion>::header_version(version),
            )
            .unwrap();
            let response = FetchResponse::decode(&mut body, version).unwrap();
            let p = &response.responses[0].partitions[0];
            assert_eq!(p.error_code, 0, "v{version}");
            assert_eq!(
                p.records.as_deref(),
                Some(&stored.concat()[..]),
                "v{version}"
            );
        }
    }
}
