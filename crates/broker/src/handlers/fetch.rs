//! Fetch (v4–v16): long poll without fetch sessions.
//!
//! A fetch reads its partitions in request order within `max_bytes` (and each partition within
//! its `partition_max_bytes`); the first partition with data always gets at least one whole
//! batch, however large, so a consumer can never get stuck behind a big batch (KIP-74). If
//! fewer than `min_bytes` are available the request waits, up to `max_wait_ms`, on the high
//! watermarks of all its partitions and reads again as soon as any of them moves. Errors and
//! shutdown end the wait at once.
//!
//! Fetch sessions (KIP-227) are not implemented: every response carries session id 0, which
//! tells the client no session was created, so it keeps sending full fetch requests — what a
//! broker without session support does; librdkafka does not use sessions at all, and the Java
//! client falls back to full fetches.
//!
//! Zero copy: record batches are written to the socket from the buffers the log returned (see
//! [`Splices`]); only records under 512 bytes are copied into the response buffer.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::select_all;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse};
use kafka_protocol::protocol::HeaderVersion;
use strata_core::{Offset, TopicPartition};
use strata_log::{LogError, Watermarks};
use tokio::sync::watch;

use super::{check_leader_epoch, leader_epoch_of, topic_id_of};
use crate::errors::{code, error_code};
use crate::framing::{encode_response, encode_response_vectored, EncodeError, ResponseFrame};
use crate::server::Broker;
use crate::RequestContext;

/// Session epoch a client sends when it does not want a session (FINAL_EPOCH).
const SESSIONLESS_EPOCH: i32 = -1;
/// Session epoch a client sends to ask for a new session (INITIAL_EPOCH).
const INITIAL_EPOCH: i32 = 0;

pub(crate) async fn handle(
    broker: &Broker,
    request: FetchRequest,
    ctx: &RequestContext,
) -> Result<ResponseFrame, EncodeError> {
    let (response, splices) = fetch(broker, request, ctx).await;
    encode_fetch(ctx, response, splices)
}

/// One partition of the request, resolved.
struct Wanted {
    topic: usize,
    partition: i32,
    target: Result<TopicPartition, i16>,
    fetch_offset: i64,
    max_bytes: usize,
}

/// What one read pass found for a partition.
struct Found {
    error: i16,
    watermarks: Option<Watermarks>,
    batches: Vec<Bytes>,
}

async fn fetch(
    broker: &Broker,
    request: FetchRequest,
    ctx: &RequestContext,
) -> (FetchResponse, Splices) {
    let v = ctx.api_version;
    let mut response = FetchResponse::default();
    let mut splices = Splices::default();
    if v >= 7 {
        if request.session_id != 0 {
            // We never hand out sessions, so any id is unknown: the client resets to full
            // fetches.
            response.error_code = code::FETCH_SESSION_ID_NOT_FOUND;
            return (response, splices);
        }
        if request.session_epoch != SESSIONLESS_EPOCH && request.session_epoch != INITIAL_EPOCH {
            response.error_code = code::INVALID_FETCH_SESSION_EPOCH;
            return (response, splices);
        }
    }

    let mut topics: Vec<FetchableTopicResponse> = Vec::with_capacity(request.topics.len());
    let mut wanted: Vec<Wanted> = Vec::new();
    for (topic_index, topic) in request.topics.into_iter().enumerate() {
        let mut out = FetchableTopicResponse::default();
        let info = if v >= 13 {
            out.topic_id = topic.topic_id;
            broker
                .log
                .topic_by_id(topic_id_of(&topic.topic_id))
                .ok_or(code::UNKNOWN_TOPIC_ID)
        } else {
            let info = broker
                .log
                .topic(topic.topic.0.as_str())
                .ok_or(code::UNKNOWN_TOPIC_OR_PARTITION);
            out.topic = topic.topic;
            info
        };
        topics.push(out);
        for p in topic.partitions {
            let target = info.clone().and_then(|info| {
                if p.partition < 0 || p.partition >= info.partitions {
                    return Err(code::UNKNOWN_TOPIC_OR_PARTITION);
                }
                let tp = TopicPartition::new(Arc::clone(&info.name), p.partition);
                if v >= 9 {
                    let epoch_error =
                        check_leader_epoch(p.current_leader_epoch, leader_epoch_of(broker, &tp));
                    if epoch_error != code::NONE {
                        return Err(epoch_error);
                    }
                }
                Ok(tp)
            });
            wanted.push(Wanted {
                topic: topic_index,
                partition: p.partition,
                target,
                fetch_offset: p.fetch_offset,
                max_bytes: usize::try_from(p.partition_max_bytes).unwrap_or(0),
            });
        }
    }

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
        let (found, bytes, any_error) = read_pass(broker, &wanted, max_bytes).await;
        if !may_wait || bytes >= min_bytes || any_error || *shutdown.borrow() {
            break found;
        }
        match wait_for_append(&mut watermarks, &mut deadline, &mut shutdown).await {
            Wake::Appended => continue,
            Wake::Deadline | Wake::Shutdown => {
                // Read once more: data may have landed as the wait ended.
                break read_pass(broker, &wanted, max_bytes).await.0;
            }
        }
    };

    for (ordinal, (w, f)) in wanted.iter().zip(found).enumerate() {
        let mut p = PartitionData::default();
        p.partition_index = w.partition;
        p.error_code = f.error;
        match (f.error, f.watermarks) {
            (code::NONE, Some(marks)) => {
                p.high_watermark = marks.high.get();
                // No transactions: everything below the high watermark is stable.
                p.last_stable_offset = marks.high.get();
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
        p.records = Some(splices.records_field(ordinal, f.batches));
        if let Some(topic) = topics.get_mut(w.topic) {
            topic.partitions.push(p);
        }
    }
    response.error_code = code::NONE;
    response.responses = topics;
    (response, splices)
}

/// Reads every partition once, in request order, within the response and partition limits.
/// Returns what was found, the bytes found, and whether any partition failed.
async fn read_pass(
    broker: &Broker,
    wanted: &[Wanted],
    max_bytes: usize,
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
                });
                continue;
            }
        };
        let limit = w.max_bytes.min(max_bytes.saturating_sub(total));
        // Only the first partition with data may exceed the limits (by one batch).
        let min_one_batch = total == 0;
        let result = if limit == 0 && !min_one_batch {
            broker
                .log
                .watermarks(tp)
                .map(|marks| (Vec::new(), Some(marks)))
        } else {
            read_partition(broker, tp, w.fetch_offset, limit, min_one_batch).await
        };
        match result {
            Ok((batches, watermarks)) => {
                total += batches.iter().map(Bytes::len).sum::<usize>();
                found.push(Found {
                    error: code::NONE,
                    watermarks,
                    batches,
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
) -> Result<(Vec<Bytes>, Option<Watermarks>), LogError> {
    let outcome = broker
        .log
        .read(tp, Offset(offset), limit, min_one_batch)
        .await?;
    let watermarks = match outcome.watermarks {
        Some(marks) => Some(marks),
        None => Some(broker.log.watermarks(tp)?),
    };
    Ok((outcome.batches, watermarks))
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

/// Chunks shorter than this are copied by strata-wire's splicing encoder rather than spliced.
const SPLICE_MIN_LEN: usize = 512;
/// Size of the placeholder region (see [`Splices`]); larger records are joined by copying.
const PLACEHOLDER_SPACE: usize = 128 << 20;

/// Zeroed memory that placeholders are cut from. Allocated zeroed (calloc: fresh zero pages)
/// and never written or read, so it costs address space, not memory.
static PLACEHOLDERS: LazyLock<Bytes> = LazyLock::new(|| Bytes::from(vec![0u8; PLACEHOLDER_SPACE]));

/// Zero-copy bookkeeping for a Fetch response.
///
/// A partition's records are usually several stored batches (several `Bytes`), but the
/// response field is one `Bytes`. Rather than join them (a copy of every byte served), the
/// field gets a *placeholder*: a slice of [`PLACEHOLDERS`] of exactly the records' length and
/// unique address. strata-wire's splicing encoder writes that placeholder as its own chunk,
/// without reading it, and we then swap the chunk for the real batches. The frame is then
/// byte-for-byte the plain encoding of the joined records. If any placeholder did not come out
/// as its own chunk, the response is encoded again the plain way with the records joined.
#[derive(Default)]
struct Splices {
    /// Chunks the encoder may splice: single-batch records and placeholders.
    shared: Vec<Bytes>,
    /// Placeholder address -> the batches it stands for.
    placeholders: HashMap<usize, Vec<Bytes>>,
}

impl Splices {
    /// The value of one partition's `records` field. `ordinal` is unique per partition.
    fn records_field(&mut self, ordinal: usize, batches: Vec<Bytes>) -> Bytes {
        let total: usize = batches.iter().map(Bytes::len).sum();
        if batches.len() == 1 {
            let only = batches.into_iter().next().unwrap_or_default();
            if only.len() >= SPLICE_MIN_LEN {
                self.shared.push(only.clone());
            }
            return only;
        }
        if total < SPLICE_MIN_LEN || ordinal.saturating_add(total) > PLACEHOLDER_SPACE {
            return join(&batches);
        }
        let placeholder = PLACEHOLDERS.slice(ordinal..ordinal + total);
        self.placeholders
            .insert(placeholder.as_ptr().addr(), batches);
        self.shared.push(placeholder.clone());
        placeholder
    }
}

fn encode_fetch(
    ctx: &RequestContext,
    mut response: FetchResponse,
    mut splices: Splices,
) -> Result<ResponseFrame, EncodeError> {
    let v = ctx.api_version;
    let header_version = FetchResponse::header_version(v);
    if splices.shared.is_empty() {
        return encode_response(ctx.correlation_id, header_version, &response, v);
    }
    let frame = encode_response_vectored(
        ctx.correlation_id,
        header_version,
        &response,
        v,
        &splices.shared,
    )?;
    let mut chunks = Vec::with_capacity(frame.chunks.len() + splices.placeholders.len() * 4);
    let mut swapped = 0;
    for chunk in frame.chunks {
        match splices.placeholders.get(&chunk.as_ptr().addr()) {
            Some(batches) if batches.iter().map(Bytes::len).sum::<usize>() == chunk.len() => {
                chunks.extend(batches.iter().cloned());
                swapped += 1;
            }
            _ => chunks.push(chunk),
        }
    }
    if swapped == splices.placeholders.len() {
        return Ok(ResponseFrame { chunks });
    }
    // Some placeholder was copied instead of spliced: its zeros must not reach the client.
    tracing::debug!("fetch response not spliceable; joining records");
    for topic in &mut response.responses {
        for partition in &mut topic.partitions {
            let addr = partition.records.as_ref().map(|r| r.as_ptr().addr());
            if let Some(batches) = addr.and_then(|addr| splices.placeholders.remove(&addr)) {
                partition.records = Some(join(&batches));
            }
        }
    }
    encode_response(ctx.correlation_id, header_version, &response, v)
}

fn join(batches: &[Bytes]) -> Bytes {
    let mut joined = BytesMut::with_capacity(batches.iter().map(Bytes::len).sum());
    for batch in batches {
        joined.extend_from_slice(batch);
    }
    joined.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    use std::net::SocketAddr;

    fn ctx(version: i16) -> RequestContext {
        RequestContext {
            api_version: version,
            correlation_id: 9,
            client_id: None,
            peer: SocketAddr::from(([127, 0, 0, 1], 1)),
            shutdown: watch::channel(false).1,
            produce_turn: Default::default(),
        }
    }

    fn response_with(records: Vec<Bytes>, splices: &mut Splices) -> FetchResponse {
        let mut partition = PartitionData::default();
        partition.high_watermark = 10;
        partition.records = Some(splices.records_field(0, records));
        let mut topic = FetchableTopicResponse::default();
        topic.topic = TopicName(StrBytes::from_static_str("t"));
        topic.partitions = vec![partition];
        let mut response = FetchResponse::default();
        response.responses = vec![topic];
        response
    }

    #[test]
    fn several_batches_are_written_from_their_own_buffers() {
        let batches: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i; 700])).collect();
        for version in [4, 11, 12, 16] {
            let mut splices = Splices::default();
            let response = response_with(batches.clone(), &mut splices);
            let frame = encode_fetch(&ctx(version), response, splices).unwrap();
            // Each batch is its own chunk, pointing at the batch's memory: no copy.
            for batch in &batches {
                assert!(
                    frame
                        .chunks
                        .iter()
                        .any(|c| c.as_ptr() == batch.as_ptr() && c.len() == batch.len()),
                    "v{version}: batch not spliced"
                );
            }
            // Byte for byte what the plain encoder gives for the joined records.
            let mut plain = Splices::default();
            let mut joined = response_with(vec![join(&batches)], &mut plain);
            joined.responses[0].partitions[0].records = Some(join(&batches));
            let expected =
                encode_response(9, FetchResponse::header_version(version), &joined, version)
                    .unwrap();
            assert_eq!(frame.to_vec(), expected.to_vec(), "v{version}");
        }
    }
}
