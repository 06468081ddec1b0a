//! `fetch-sessions`: the broker's CPU per Fetch of many partitions, sessionless full fetches
//! against incremental fetch-session fetches (KIP-227).
//!
//! librdkafka has no fetch sessions, so this speaks the protocol itself: one TCP connection,
//! Fetch requests built with `kafka-protocol`, sent one at a time (`max_wait_ms` 0: no long poll,
//! so every request is answered at once and the broker's CPU is the request's cost). Four
//! phases of `--fetches` requests each over a topic of `--partitions` partitions holding one
//! record each:
//!
//! - `sessionless-idle`: epoch -1, every partition at its end each time (nothing new);
//! - `session-idle`: one full fetch opens a session, then incremental fetches naming nothing;
//! - `sessionless-low` and `session-low`: before each fetch one Produce appends a record to
//!   each of `--changed` partitions (rotating), and the fetch asks for everything again
//!   (sessionless) or sends only the moved positions (session). The Produce costs the same in
//!   both, so the difference between them is the fetch's.
//!
//! Reported per phase: broker CPU per fetch (from `/proc/<pid>/stat`; needs `--spawn-broker`
//! or `--broker-pid`), client-side time per round trip, and request and response bytes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use strata_wire::builder::{build_batch, SimpleRecord};

use crate::cli::{FetchSessionsArgs, TargetArgs};
use crate::clients;
use crate::clock;
use crate::system;

/// Fetch v12: the last version naming topics (v13+ name them by id, which needs a Metadata
/// round trip first; the session logic is the same).
const FETCH_VERSION: i16 = 12;
const PRODUCE_VERSION: i16 = 9;

pub fn run(
    bootstrap: &str,
    target: &TargetArgs,
    broker_pid: Option<u32>,
    args: &FetchSessionsArgs,
) -> Result<()> {
    let topic = clients::default_topic_name();
    clients::create_topic(bootstrap, target, &topic, args.partitions, &[])?;
    let address = bootstrap.split(',').next().unwrap_or(bootstrap);
    let mut connection = Connection::open(address)?;
    let partitions = usize::try_from(args.partitions).context("--partitions")?;
    // One record in every partition, so every partition has a high watermark of 1.
    let all: Vec<usize> = (0..partitions).collect();
    connection.produce(&topic, &all)?;
    let mut offsets = vec![1i64; partitions];
    let load_before = system::load_average();
    let mut rows = Vec::new();
    let changed = args.changed.min(partitions);
    for (name, session, changes) in [
        ("sessionless-idle", false, 0),
        ("session-idle", true, 0),
        ("sessionless-low", false, changed),
        ("session-low", true, changed),
    ] {
        rows.push(phase(
            &mut connection,
            &topic,
            &mut offsets,
            broker_pid,
            args.fetches,
            name,
            session,
            changes,
        )?);
    }
    println!(
        "fetch-sessions: {} partitions, {} fetches per phase (Fetch v{FETCH_VERSION}, max_wait_ms 0), \
         {} partitions appended to before each fetch in the -low phases; {} CPUs",
        args.partitions,
        args.fetches,
        changed,
        system::cpus()
    );
    println!(
        "load average before {load_before:?}, after {:?}",
        system::load_average()
    );
    println!(
        "{:<18} {:>14} {:>14} {:>12} {:>14} {:>12}",
        "phase", "broker µs/fetch", "round trip µs", "request B", "response B", "partitions"
    );
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn phase(
    connection: &mut Connection,
    topic: &str,
    offsets: &mut [i64],
    broker_pid: Option<u32>,
    fetches: usize,
    name: &str,
    use_session: bool,
    changes: usize,
) -> Result<String> {
    let mut session = (0i32, -1i32);
    // Partitions whose position moved since the last request: what an incremental fetch
    // must name.
    let mut moved: Vec<usize> = Vec::new();
    if use_session {
        // Opening the session is a full fetch; not counted.
        let response = connection.fetch(&request(topic, offsets, None, (0, 0)))?;
        if response.0.session_id == 0 {
            bail!("the broker created no fetch session");
        }
        session = (response.0.session_id, 1);
    }
    let mut next_changed = 0usize;
    let mut broker_time = Duration::ZERO;
    let mut wall = Duration::ZERO;
    let (mut request_bytes, mut response_bytes, mut listed) = (0usize, 0usize, 0usize);
    for _ in 0..fetches {
        if changes > 0 {
            let targets: Vec<usize> = (0..changes)
                .map(|k| (next_changed + k) % offsets.len())
                .collect();
            next_changed = (next_changed + changes) % offsets.len();
            connection.produce(topic, &targets)?;
        }
        let fetch = if use_session {
            let epoch = session.1;
            session.1 += 1;
            request(topic, offsets, Some(&moved), (session.0, epoch))
        } else {
            request(topic, offsets, None, (0, -1))
        };
        moved.clear();
        let cpu_before = broker_pid.and_then(system::process_cpu_time);
        let started = Instant::now();
        let (response, sent, received) = connection.fetch(&fetch)?;
        wall += started.elapsed();
        if let (Some(before), Some(after)) =
            (cpu_before, broker_pid.and_then(system::process_cpu_time))
        {
            broker_time += after.saturating_sub(before);
        }
        if response.error_code != 0 {
            bail!("{name}: fetch answered error {}", response.error_code);
        }
        request_bytes += sent;
        response_bytes += received;
        for t in &response.responses {
            for p in &t.partitions {
                listed += 1;
                let index = usize::try_from(p.partition_index).context("partition index")?;
                let has_records = p.records.as_ref().is_some_and(|r| !r.is_empty());
                if has_records {
                    if let Some(o) = offsets.get_mut(index) {
                        *o = p.high_watermark;
                        moved.push(index);
                    }
                }
            }
        }
    }
    let n = fetches.max(1) as f64;
    let broker = if broker_pid.is_some() {
        format!("{:.1}", broker_time.as_secs_f64() * 1e6 / n)
    } else {
        "n/a".to_string()
    };
    Ok(format!(
        "{:<18} {:>14} {:>14.1} {:>12.0} {:>14.0} {:>12.1}",
        name,
        broker,
        wall.as_secs_f64() * 1e6 / n,
        request_bytes as f64 / n,
        response_bytes as f64 / n,
        listed as f64 / n
    ))
}

/// A Fetch of `topic`: every partition (`only` None), or only the partitions in `only`.
fn request(
    topic: &str,
    offsets: &[i64],
    only: Option<&[usize]>,
    session: (i32, i32),
) -> FetchRequest {
    let partition = |index: usize| {
        let mut p = FetchPartition::default();
        p.partition = i32::try_from(index).unwrap_or(i32::MAX);
        p.fetch_offset = offsets[index];
        p.partition_max_bytes = 1 << 20;
        p
    };
    let mut t = FetchTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.to_string()));
    t.partitions = match only {
        None => (0..offsets.len()).map(partition).collect(),
        Some(indices) => indices.iter().copied().map(partition).collect(),
    };
    let mut request = FetchRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.max_wait_ms = 0;
    request.min_bytes = 1;
    request.max_bytes = 50 << 20;
    request.session_id = session.0;
    request.session_epoch = session.1;
    if !t.partitions.is_empty() {
        request.topics = vec![t];
    }
    request
}

pub(crate) struct Connection {
    stream: TcpStream,
    correlation: i32,
}

impl Connection {
    pub(crate) fn open(address: &str) -> Result<Self> {
        let stream = TcpStream::connect(address).with_context(|| format!("connect {address}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Self {
            stream,
            correlation: 0,
        })
    }

    /// Sends one request and reads its response; returns it with the bytes sent and received.
    fn call<Req: Encodable + HeaderVersion, Resp: Decodable + HeaderVersion>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> Result<(Resp, usize, usize)> {
        self.correlation += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = key as i16;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(StrBytes::from_static_str("strata-bench"));
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        header.encode(&mut frame, Req::header_version(version))?;
        body.encode(&mut frame, version)?;
        let length = i32::try_from(frame.len() - 4).context("request too large")?;
        frame[..4].copy_from_slice(&length.to_be_bytes());
        self.stream.write_all(&frame)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size)?;
        let size = usize::try_from(i32::from_be_bytes(size)).context("negative frame size")?;
        let mut buf = vec![0u8; size];
        self.stream.read_exact(&mut buf)?;
        let mut response = Bytes::from(buf);
        let header = ResponseHeader::decode(&mut response, Resp::header_version(version))?;
        if header.correlation_id != self.correlation {
            bail!(
                "correlation id {} for {}",
                header.correlation_id,
                self.correlation
            );
        }
        let decoded = Resp::decode(&mut response, version)?;
        if response.has_remaining() {
            bail!("{} bytes left after the response", response.remaining());
        }
        Ok((decoded, frame.len(), size + 4))
    }

    pub(crate) fn fetch(
        &mut self,
        request: &FetchRequest,
    ) -> Result<(FetchResponse, usize, usize)> {
        self.call(ApiKey::Fetch, FETCH_VERSION, request)
    }

    /// Appends one small record to each of `partitions` in one acks=1 Produce.
    fn produce(&mut self, topic: &str, partitions: &[usize]) -> Result<()> {
        let now_ms = (clock::unix_seconds() * 1000.0) as i64;
        let record = SimpleRecord {
            key: None,
            value: Some(Bytes::from_static(b"fetch-sessions")),
        };
        let batch = build_batch(std::slice::from_ref(&record), now_ms);
        self.produce_batch(topic, partitions, batch, 1)
    }

    /// Appends `batch` to each of `partitions` in one Produce with `acks`.
    pub(crate) fn produce_batch(
        &mut self,
        topic: &str,
        partitions: &[usize],
        batch: Bytes,
        acks: i16,
    ) -> Result<()> {
        let mut t = TopicProduceData::default();
        t.name = TopicName(StrBytes::from_string(topic.to_string()));
        t.partition_data = partitions
            .iter()
            .map(|&p| {
                let mut data = PartitionProduceData::default();
                data.index = i32::try_from(p).unwrap_or(i32::MAX);
                data.records = Some(batch.clone());
                data
            })
            .collect();
        let mut request = ProduceRequest::default();
        request.acks = acks;
        request.timeout_ms = 30_000;
        request.topic_data = vec![t];
        let (response, _, _): (ProduceResponse, _, _) =
            self.call(ApiKey::Produce, PRODUCE_VERSION, &request)?;
        for t in &response.responses {
            for p in &t.partition_responses {
                if p.error_code != 0 {
                    bail!("produce to partition {} answered {}", p.index, p.error_code);
                }
            }
        }
        Ok(())
    }
}
