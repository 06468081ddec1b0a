//! The throughput benchmark: produce N records as fast as librdkafka will send them, then read
//! them all back from the beginning.
//!
//! Consuming only after producing is deliberate: the records were just written, so the broker
//! serves them from its tail cache (or, if they outgrew it, from storage), and the consume rate
//! is not capped by the produce rate as it would be if both ran at once.

use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::Producer;

use crate::cli::{TargetArgs, ThroughputArgs};
use crate::clients::{self, BenchContext, ProduceStats, SendClock};
use crate::clock;
use crate::report::{LatencySummary, Phase};
use crate::system::CpuMeter;
use crate::Outcome;

/// How long the consumer may wait for a poll before checking the deadline again.
const POLL_TIMEOUT: Duration = Duration::from_millis(100);
/// Records sent per clock reading (see [`SendClock`]).
const CLOCK_READ_EVERY: u32 = 16;
/// Consumer errors printed before the rest are only counted.
const ERRORS_PRINTED: u64 = 5;

pub fn run(
    bootstrap: &str,
    target: &TargetArgs,
    broker_pid: Option<u32>,
    args: &ThroughputArgs,
) -> Result<Outcome> {
    let workload = &args.workload;
    let topic = workload
        .topic
        .clone()
        .unwrap_or_else(clients::default_topic_name);
    clients::create_topic(
        bootstrap,
        target,
        &topic,
        workload.partitions,
        &workload.topic_configs,
    )?;

    let (produce, delivered) = produce(bootstrap, target, broker_pid, args, &topic)?;
    let mut phases = vec![produce];
    if !args.no_consume {
        if args.consume_after > 0.0 {
            eprintln!("waiting {} s before consuming", args.consume_after);
            std::thread::sleep(Duration::from_secs_f64(args.consume_after));
        }
        phases.push(consume(
            bootstrap, target, broker_pid, args, &topic, delivered,
        )?);
    }
    Ok(Outcome {
        topic: Some(topic),
        settings: serde_json::to_value(args).context("serialise the settings")?,
        phases,
    })
}

/// Returns the phase and the number of records delivered.
fn produce(
    bootstrap: &str,
    target: &TargetArgs,
    broker_pid: Option<u32>,
    args: &ThroughputArgs,
    topic: &str,
) -> Result<(Phase, u64)> {
    let workload = &args.workload;
    let origin = clock::now();
    let stats = ProduceStats::new(origin)?;
    let producer = clients::producer(bootstrap, target, workload, args.linger_ms, stats)?;
    // Connect and learn the topic's leaders before the clock starts: connection set-up is not
    // what this benchmark measures.
    producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .context("producer metadata")?;

    eprintln!(
        "producing {} records of {} bytes to {topic} ({} partitions, linger.ms={}, acks={})",
        args.records, workload.record_size, workload.partitions, args.linger_ms, workload.acks
    );
    let mut payload = vec![0x5a_u8; workload.record_size];
    let deadline = clock::now() + Duration::from_secs(workload.timeout_secs);
    let mut send_clock = SendClock::new(origin, CLOCK_READ_EVERY);
    let cpu = CpuMeter::start(broker_pid);
    let start = clock::now();
    for index in 0..args.records {
        let partition = clients::partition_for(workload.partitioning, index, workload.partitions);
        clients::send(
            &producer,
            topic,
            partition,
            &mut payload,
            &mut send_clock,
            deadline,
        )?;
    }
    let flushed = producer.flush(clock::remaining(deadline));
    let elapsed = clock::now().saturating_duration_since(start);
    let cpu = cpu.finish(elapsed);

    let stats = producer.context();
    let delivered = stats.delivered();
    let failed = stats.failed();
    let mut phase = Phase::new("produce", delivered, workload.record_size, elapsed, cpu);
    phase.failed = args.records.saturating_sub(delivered);
    phase.latency = LatencySummary::from_histogram(&stats.latency()?);
    phase.notes.push(
        "latency = send() to delivery report per record; the client queue is kept full, so it \
         is mostly time queued in the client (e2e measures latency at a fixed rate)"
            .to_string(),
    );
    if let Err(error) = flushed {
        phase
            .notes
            .push(format!("flush did not finish before the timeout: {error}"));
    }
    if failed > 0 {
        phase.notes.push(format!(
            "{failed} delivery errors, first: {}",
            stats.first_error().unwrap_or_default()
        ));
    }
    Ok((phase, delivered))
}

fn consume(
    bootstrap: &str,
    target: &TargetArgs,
    broker_pid: Option<u32>,
    args: &ThroughputArgs,
    topic: &str,
    expected: u64,
) -> Result<Phase> {
    let workload = &args.workload;
    let consumer: BaseConsumer<BenchContext> = clients::consumer(bootstrap, target)?;
    clients::learn_leaders(&consumer, topic)?;
    eprintln!("consuming {expected} records from the beginning of {topic}");
    let deadline = clock::now() + Duration::from_secs(workload.timeout_secs);
    let cpu = CpuMeter::start(broker_pid);
    // The clock includes assignment, the offset lookup and the first fetch round trip: a real
    // consumer catching up pays for them too, and they are a small share of a long run.
    let start = clock::now();
    clients::assign_all(&consumer, topic, workload.partitions)?;
    let mut received = 0_u64;
    let mut payload_bytes = 0_u64;
    let mut first_record = None;
    let mut errors = 0_u64;
    let mut polls = 0_u32;
    while received < expected {
        // The deadline every 1,024 polls: reading the clock for every record cost this loop
        // about 3% of its CPU, which is the client's ceiling being measured.
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(1024) && clock::remaining(deadline).is_zero() {
            break;
        }
        match consumer.poll(POLL_TIMEOUT) {
            Some(Ok(message)) => {
                received += 1;
                payload_bytes += message.payload_len() as u64;
                if first_record.is_none() {
                    first_record = Some(clock::now());
                }
            }
            Some(Err(error)) => {
                errors += 1;
                if errors <= ERRORS_PRINTED {
                    eprintln!("consume error: {error}");
                }
            }
            // An empty poll waited up to POLL_TIMEOUT: check the deadline at once.
            None => {
                if clock::remaining(deadline).is_zero() {
                    break;
                }
            }
        }
    }
    let elapsed = clock::now().saturating_duration_since(start);
    let cpu = cpu.finish(elapsed);

    let mut phase = Phase::new("consume", received, workload.record_size, elapsed, cpu);
    // Report the bytes actually received, in case the topic held records of another size.
    phase.payload_bytes = payload_bytes;
    phase.megabytes_per_second = if elapsed.is_zero() {
        0.0
    } else {
        payload_bytes as f64 / 1e6 / elapsed.as_secs_f64()
    };
    phase.failed = expected.saturating_sub(received);
    if let Some(first) = first_record {
        phase.notes.push(format!(
            "first record after {:.1} ms (assign + first fetch)",
            first.saturating_duration_since(start).as_secs_f64() * 1000.0
        ));
    }
    if errors > 0 {
        phase.notes.push(format!(
            "{errors} consumer errors (first {ERRORS_PRINTED} printed above)"
        ));
    }
    Ok(phase)
}
