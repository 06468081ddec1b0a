//! `strata produce` and `strata consume`: quick checks that a topic takes and serves records.

use std::io::BufRead;

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, FetchRequest, ProduceRequest};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use serde_json::json;
use strata_core::Clock;

use super::topic::{log_offsets, topic_metadata};
use super::{duration, out, out_json, Connect};
use crate::kafka_client::{check, name, no_leader, Client};

/// Records per Produce request from stdin, and bytes: input of any length is sent in
/// requests of bounded size instead of being held in memory whole.
const PRODUCE_BATCH_RECORDS: usize = 1000;
const PRODUCE_BATCH_BYTES: usize = 1 << 20;
const PRODUCE_TIMEOUT_MS: i32 = 30_000;

#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    topic: String,
    #[command(flatten)]
    connect: Connect,
    /// Partition to write to.
    #[arg(long, value_name = "N", default_value_t = 0)]
    partition: i32,
    /// Key of every record [default: none].
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// A record value (repeatable); without it every line of stdin is one record.
    #[arg(long = "value", value_name = "VALUE")]
    values: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    topic: String,
    #[command(flatten)]
    connect: Connect,
    /// Partition to read.
    #[arg(long, value_name = "N", default_value_t = 0)]
    partition: i32,
    /// Where to start: earliest, latest, or an offset.
    #[arg(long, value_name = "OFFSET", default_value = "earliest")]
    offset: String,
    /// Stop after this many records.
    #[arg(long, value_name = "N", default_value_t = 10)]
    count: usize,
    /// Stop waiting for more records after this long (printing what came).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    timeout: String,
    /// Largest Fetch answer asked for, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    fetch_max_bytes: i32,
}

pub async fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    let (mut client, clock) = args.connect.client().await?;
    let mut leader = leader_of(&mut client, &args.topic, args.partition).await?;
    let key = args.key.map(Bytes::from);
    let mut sent = Vec::new();
    let mut pending: Vec<Bytes> = Vec::new();
    let mut pending_bytes = 0;
    let from_stdin = args.values.is_empty();
    let mut values = args.values.into_iter().map(Bytes::from);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        let next = if from_stdin {
            match lines.next() {
                Some(line) => Some(Bytes::from(line.context("reading stdin")?)),
                None => None,
            }
        } else {
            values.next()
        };
        let done = next.is_none();
        if let Some(value) = next {
            pending_bytes += value.len();
            pending.push(value);
        }
        let full = pending.len() >= PRODUCE_BATCH_RECORDS || pending_bytes >= PRODUCE_BATCH_BYTES;
        if (full || done) && !pending.is_empty() {
            let mut retry = client.retry();
            let base = loop {
                let sent = send(
                    &mut client,
                    clock.as_ref(),
                    &args.topic,
                    args.partition,
                    leader,
                    key.as_ref(),
                    &pending,
                )
                .await;
                match sent {
                    // Only answers that say nothing was stored: resending after a timeout
                    // could store the records twice.
                    Err(error) if retry.again_if(&error, unwritten).await => {
                        leader = leader_of(&mut client, &args.topic, args.partition).await?;
                    }
                    answer => break answer?,
                }
            };
            sent.push((base, pending.len()));
            pending.clear();
            pending_bytes = 0;
        }
        if done {
            break;
        }
    }
    let count: usize = sent.iter().map(|(_, n)| n).sum();
    let first = sent.first().map(|(base, _)| *base);
    let last = sent.last().map(|(base, n)| base + *n as i64 - 1);
    if args.connect.json {
        out_json(&json!({
            "topic": args.topic,
            "partition": args.partition,
            "count": count,
            "first_offset": first,
            "last_offset": last,
        }));
    } else if let (Some(first), Some(last)) = (first, last) {
        out(&format!(
            "produced {count} records to {}-{} at offsets {first}..={last}",
            args.topic, args.partition
        ));
    } else {
        out("nothing to produce (no --value and no input)");
    }
    Ok(())
}

async fn leader_of(client: &mut Client, topic: &str, partition: i32) -> anyhow::Result<i32> {
    let metadata = topic_metadata(client, topic).await?;
    let Some(p) = metadata
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)
    else {
        bail!(
            "topic {topic:?} has partitions 0..{}; there is no partition {partition}",
            metadata.partitions.len()
        );
    };
    if p.leader_id.0 < 0 {
        return Err(no_leader(topic, partition).into());
    }
    Ok(p.leader_id.0)
}

/// Produce errors after which the partition's log is known not to hold the records.
fn unwritten(error: &ResponseError) -> bool {
    matches!(
        error,
        ResponseError::NotLeaderOrFollower | ResponseError::LeaderNotAvailable
    )
}

async fn send(
    client: &mut Client,
    clock: &dyn Clock,
    topic: &str,
    partition: i32,
    leader: i32,
    key: Option<&Bytes>,
    values: &[Bytes],
) -> anyhow::Result<i64> {
    let timestamp = clock.wall_millis();
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, value)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: -1,
            timestamp,
            key: key.cloned(),
            value: Some(value.clone()),
            headers: Default::default(),
        })
        .collect();
    let mut batch = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .context("encoding the records")?;
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(PRODUCE_TIMEOUT_MS)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch.freeze()))])]);
    let response = client.node(leader).await?.request(9, &request).await?;
    let answer = response
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter())
        .find(|p| p.index == partition)
        .ok_or_else(|| anyhow::anyhow!("Produce answered nothing about {topic}-{partition}"))?;
    check(
        answer.error_code,
        || format!("producing to {topic}-{partition}"),
        answer.error_message.as_ref(),
    )?;
    Ok(answer.base_offset)
}

struct Consumed {
    offset: i64,
    timestamp: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
}

pub async fn consume(args: ConsumeArgs) -> anyhow::Result<()> {
    let wait = duration("--timeout", &args.timeout)?;
    let (mut client, clock) = args.connect.client().await?;
    let (topic, partition) = (args.topic.as_str(), args.partition);
    let mut leader = leader_of(&mut client, topic, partition).await?;
    let mut offset = match args.offset.as_str() {
        "earliest" | "latest" => {
            let offsets = log_offsets(&mut client, topic, &[(partition, leader)]).await?;
            let (start, end) = offsets.get(&partition).copied().unwrap_or((0, 0));
            if args.offset == "earliest" {
                start
            } else {
                end
            }
        }
        other => other
            .parse()
            .with_context(|| format!("--offset {other:?} is not earliest, latest or an offset"))?,
    };
    let deadline = clock.monotonic().saturating_add(wait);
    let mut consumed = Vec::new();
    let mut retry = client.retry();
    while consumed.len() < args.count && clock.monotonic() < deadline {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(args.fetch_max_bytes)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(offset)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(args.fetch_max_bytes)])]);
        let response = client.node(leader).await?.request(12, &request).await?;
        let answer = check(
            response.error_code,
            || format!("fetching {topic}-{partition}"),
            None,
        )
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            let data = response
                .responses
                .iter()
                .flat_map(|t| t.partitions.iter())
                .find(|p| p.partition_index == partition)
                .ok_or_else(|| {
                    anyhow::anyhow!("Fetch answered nothing about {topic}-{partition}")
                })?;
            check(
                data.error_code,
                || format!("fetching {topic}-{partition} from offset {offset}"),
                None,
            )?;
            Ok(data)
        });
        let data = match answer {
            Ok(data) => data,
            // The partition moved: ask its new leader.
            Err(error) if retry.again(&error).await => {
                leader = leader_of(&mut client, topic, partition).await?;
                continue;
            }
            Err(error) => return Err(error),
        };
        let Some(records) = &data.records else {
            continue;
        };
        for batch in whole_batches(records) {
            let mut batch = batch;
            let set = RecordBatchDecoder::decode(&mut batch).with_context(|| {
                format!(
                    "decoding a batch of {topic}-{partition} near offset {offset} (strata \
                     consume reads uncompressed batches only; kcat reads them all)"
                )
            })?;
            for record in set.records {
                // A fetch returns the whole batch holding the offset asked for.
                if record.offset < offset {
                    continue;
                }
                offset = record.offset + 1;
                if record.control || consumed.len() >= args.count {
                    continue;
                }
                consumed.push(Consumed {
                    offset: record.offset,
                    timestamp: record.timestamp,
                    key: record.key,
                    value: record.value,
                });
            }
        }
    }
    let text = |b: &Option<Bytes>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
    if args.connect.json {
        let records: Vec<_> = consumed
            .iter()
            .map(|r| {
                json!({
                    "partition": partition,
                    "offset": r.offset,
                    "timestamp": r.timestamp,
                    "key": text(&r.key),
                    "value": text(&r.value),
                })
            })
            .collect();
        out_json(&json!(records));
    } else {
        for r in &consumed {
            out(&text(&r.value).unwrap_or_default());
        }
    }
    if consumed.len() < args.count {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!(
                "strata: {} of {} records within {wait:?} (the partition has no more yet)\n",
                consumed.len(),
                args.count
            )
            .as_bytes(),
        );
    }
    Ok(())
}

/// The whole record batches at the front of a Fetch answer: a broker may end one with a
/// partial batch (cut at max bytes), which is fetched again from its start next time.
fn whole_batches(records: &Bytes) -> Vec<Bytes> {
    let mut batches = Vec::new();
    let mut at = 0;
    while let Some(header) = records.get(at..at + 12) {
        let length = i32::from_be_bytes([header[8], header[9], header[10], header[11]]);
        let Some(end) = usize::try_from(length).ok().map(|l| at + 12 + l) else {
            break;
        };
        if end > records.len() {
            break;
        }
        batches.push(records.slice(at..end));
        at = end;
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_batch_at_the_end_is_left_for_the_next_fetch() {
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: 1,
            key: None,
            value: Some(Bytes::from_static(b"v")),
            headers: Default::default(),
        };
        let mut bytes = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut bytes, [&record], &options).unwrap();
        let one = bytes.len();
        RecordBatchEncoder::encode(&mut bytes, [&record], &options).unwrap();
        let all = bytes.freeze();
        assert_eq!(whole_batches(&all).len(), 2);
        assert_eq!(whole_batches(&all.slice(..one + 20)).len(), 1);
        assert_eq!(whole_batches(&all.slice(..5)).len(), 0);
    }
}
