//! `fetch-rate`: how fast one connection can read one partition with Fetch requests that honour
//! `partition_max_bytes` and `max_bytes`, when the client does nothing with the records.
//!
//! A librdkafka consumer of one partition reads about 2 M records/s of 100-byte records here
//! with 1 MiB fetches; the question (issue 19, item 6) is how much of each fetch's round trip
//! is the broker's. This client sends one Fetch at a time (`kafka-protocol`, Fetch v12,
//! `max_wait_ms` 0), reads the response, walks only the batch headers to find the next offset
//! and count records, and sends the next: its own cost per fetch is tiny, so its rate is close
//! to what the broker and the socket allow one fetcher. Records are produced first, in batches
//! of `--records-per-batch` (9,000 of 100 bytes is about what librdkafka builds at its default
//! `batch.size` of 1 MB), so they sit in the broker's tail cache as a fast consumer finds them.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use strata_wire::builder::{build_batch, SimpleRecord};

use crate::cli::{FetchRateArgs, TargetArgs};
use crate::clients;
use crate::clock;
use crate::fetch_sessions::Connection;
use crate::system;

pub fn run(
    bootstrap: &str,
    target: &TargetArgs,
    broker_pid: Option<u32>,
    args: &FetchRateArgs,
) -> Result<()> {
    let topic = clients::default_topic_name();
    clients::create_topic(bootstrap, target, &topic, 1, &[])?;
    let address = bootstrap.split(',').next().unwrap_or(bootstrap);
    let mut connection = Connection::open(address)?;

    let now_ms = (clock::unix_seconds() * 1000.0) as i64;
    let records: Vec<SimpleRecord> = (0..args.records_per_batch)
        .map(|_| SimpleRecord {
            key: None,
            value: Some(Bytes::from(vec![0x5a; args.record_size])),
        })
        .collect();
    let batch = build_batch(&records, now_ms);
    let batches = args.records.div_ceil(args.records_per_batch.max(1) as u64);
    for _ in 0..batches {
        connection.produce_batch(&topic, &[0], batch.clone(), -1)?;
    }
    let total = batches * args.records_per_batch as u64;

    let load_before = system::load_average();
    let mut round_trips = Histogram::<u64>::new(3).context("histogram")?;
    let (mut offset, mut fetched, mut fetches, mut bytes) = (0i64, 0u64, 0u64, 0u64);
    let cpu_before = broker_pid.and_then(system::process_cpu_time);
    let started = Instant::now();
    while fetched < total {
        let request = request(&topic, offset, args);
        let sent = Instant::now();
        let (response, _, received) = connection.fetch(&request)?;
        round_trips.record(sent.elapsed().as_micros().max(1) as u64)?;
        fetches += 1;
        bytes += received as u64;
        if response.error_code != 0 {
            bail!("fetch answered error {}", response.error_code);
        }
        let Some(p) = response
            .responses
            .first()
            .and_then(|t| t.partitions.first())
        else {
            bail!("fetch answered no partition");
        };
        if p.error_code != 0 {
            bail!("fetch of partition 0 answered error {}", p.error_code);
        }
        let records = p.records.clone().unwrap_or_default();
        if records.len() > args.partition_max_bytes && batches_in(&records)?.0 > 1 {
            bail!(
                "{} bytes answered for a partition limit of {}",
                records.len(),
                args.partition_max_bytes
            );
        }
        let (_, count, next) = batches_in(&records)?;
        if count == 0 {
            bail!("no records at offset {offset} of {total}");
        }
        fetched += count;
        offset = next;
    }
    let elapsed = started.elapsed();
    let broker_cpu = match (cpu_before, broker_pid.and_then(system::process_cpu_time)) {
        (Some(before), Some(after)) => format!(
            "{:.0} µs per fetch ({:.0}% of a core)",
            after.saturating_sub(before).as_secs_f64() * 1e6 / fetches.max(1) as f64,
            after.saturating_sub(before).as_secs_f64() * 100.0 / elapsed.as_secs_f64()
        ),
        _ => "n/a (no --broker-pid)".to_string(),
    };
    println!(
        "fetch-rate: 1 partition, {total} records of {} bytes in batches of {}, Fetch v12 one at \
         a time, partition_max_bytes {} max_bytes {}, max_wait_ms 0; {} CPUs",
        args.record_size,
        args.records_per_batch,
        args.partition_max_bytes,
        args.max_bytes,
        system::cpus()
    );
    println!(
        "load average before {load_before:?}, after {:?}",
        system::load_average()
    );
    println!(
        "{fetches} fetches in {:.3} s: {:.0} records/s, {:.1} MB/s, {:.0} bytes per response",
        elapsed.as_secs_f64(),
        fetched as f64 / elapsed.as_secs_f64(),
        bytes as f64 / elapsed.as_secs_f64() / 1e6,
        bytes as f64 / fetches.max(1) as f64
    );
    println!(
        "round trip p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; broker CPU {broker_cpu}",
        round_trips.value_at_quantile(0.5) as f64 / 1e3,
        round_trips.value_at_quantile(0.99) as f64 / 1e3,
        round_trips.max() as f64 / 1e3
    );
    Ok(())
}

fn request(topic: &str, offset: i64, args: &FetchRateArgs) -> FetchRequest {
    let mut p = FetchPartition::default();
    p.partition = 0;
    p.fetch_offset = offset;
    p.partition_max_bytes = i32::try_from(args.partition_max_bytes).unwrap_or(i32::MAX);
    let mut t = FetchTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.to_string()));
    t.partitions = vec![p];
    let mut request = FetchRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.max_wait_ms = 0;
    request.min_bytes = 1;
    request.max_bytes = i32::try_from(args.max_bytes).unwrap_or(i32::MAX);
    request.session_id = 0;
    request.session_epoch = -1;
    request.topics = vec![t];
    request
}

/// Walks the v2 batch headers in `records`: (batches, records, the offset after the last).
fn batches_in(records: &[u8]) -> Result<(u64, u64, i64)> {
    let (mut at, mut batches, mut count, mut next) = (0usize, 0u64, 0u64, 0i64);
    // base offset (8), length (4), leader epoch (4), magic (1), crc (4), attributes (2), last
    // offset delta (4), timestamps (16), producer id (8), epoch (2), sequence (4), count (4).
    while at + 61 <= records.len() {
        let field = |from: usize, len: usize| &records[at + from..at + from + len];
        let base = i64::from_be_bytes(field(0, 8).try_into()?);
        let length = i32::from_be_bytes(field(8, 4).try_into()?);
        let last_delta = i32::from_be_bytes(field(23, 4).try_into()?);
        let n = i32::from_be_bytes(field(57, 4).try_into()?);
        let size = 12 + usize::try_from(length).context("negative batch length")?;
        if at + size > records.len() {
            break; // a partial batch at the end: Kafka may send one; it is fetched again
        }
        batches += 1;
        count += u64::try_from(n).context("negative record count")?;
        next = base + i64::from(last_delta) + 1;
        at += size;
    }
    Ok((batches, count, next))
}
