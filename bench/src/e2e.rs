//! The end-to-end latency benchmark: a producer paced at a fixed rate and a consumer reading the
//! same topic at the same time, in one process. Each payload carries its send time (nanoseconds
//! on this process's monotonic clock), so receive time minus that stamp is the latency a record
//! sees from `send()` in one application to `poll()` in another — through librdkafka's batching,
//! the broker's group commit and durable write, and the consumer's long-poll fetch.
//!
//! Pacing: record i is due at start + i/rate. The producer sleeps until a record is due and
//! never skips one, so if it falls behind (a full client queue, a descheduled thread) it catches
//! up in a burst; the largest delay behind schedule is reported so that shows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::Producer;
use rdkafka::Message;

use crate::cli::{E2eArgs, TargetArgs};
use crate::clients::{self, BenchContext, ProduceStats, SendClock};
use crate::clock;
use crate::report::{new_histogram, LatencySummary, Phase};
use crate::system::CpuMeter;
use crate::Outcome;

const POLL_TIMEOUT: Duration = Duration::from_millis(100);
/// After the producer has flushed, how long the consumer may take to see the last records.
const DRAIN_GRACE: Duration = Duration::from_secs(30);
const ERRORS_PRINTED: u64 = 5;

/// What the consumer thread saw.
struct Received {
    records: u64,
    /// Nanoseconds since origin of the last record received.
    last_ns: u64,
    latency_us: Histogram<u64>,
    errors: u64,
}

/// Shared between the producing (main) thread and the consumer thread.
struct Progress {
    /// Set once the producer has flushed: `delivered` is then final.
    producing_done: AtomicBool,
    delivered: AtomicU64,
}

pub fn run(
    bootstrap: &str,
    target: &TargetArgs,
    broker_pid: Option<u32>,
    args: &E2eArgs,
) -> Result<Outcome> {
    let workload = &args.workload;
    if workload.record_size < 8 {
        bail!("--record-size must be at least 8: the payload carries an 8-byte send time");
    }
    if !(args.duration > 0.0 && args.warmup >= 0.0 && args.warmup < args.duration) {
        bail!("need 0 <= --warmup < --duration");
    }
    let topic = workload
        .topic
        .clone()
        .unwrap_or_else(clients::default_topic_name);
    clients::create_topic(bootstrap, target, &topic, workload.partitions)?;

    let origin = clock::now();
    let producer = clients::producer(
        bootstrap,
        target,
        workload,
        args.linger_ms,
        ProduceStats::new(origin)?,
    )?;
    producer
        .client()
        .fetch_metadata(Some(&topic), Duration::from_secs(10))
        .context("producer metadata")?;
    let consumer: BaseConsumer<BenchContext> = clients::consumer(bootstrap, target)?;
    clients::learn_leaders(&consumer, &topic)?;
    clients::assign_all(&consumer, &topic, workload.partitions)?;

    let total = (args.rate as f64 * args.duration).round() as u64;
    let interval_ns = 1e9 / args.rate as f64;
    let start_ns = clock::nanos_since(origin);
    let timed_from_ns = start_ns + clock::duration_to_nanos(Duration::from_secs_f64(args.warmup));
    producer.context().time_from(timed_from_ns);
    let progress = Progress {
        producing_done: AtomicBool::new(false),
        delivered: AtomicU64::new(0),
    };
    eprintln!(
        "producing {total} records of {} bytes to {topic} at {} records/s for {} s \
         (first {} s not timed), consuming concurrently",
        workload.record_size, args.rate, args.duration, args.warmup
    );

    let deadline = clock::now()
        + Duration::from_secs_f64(args.duration)
        + Duration::from_secs(workload.timeout_secs);
    let cpu = CpuMeter::start(broker_pid);
    let start = clock::now();
    let (paced, received) = std::thread::scope(|scope| -> Result<_> {
        let reader = scope.spawn(|| receive(&consumer, origin, timed_from_ns, &progress, deadline));
        let paced = pace(
            &producer,
            args,
            &topic,
            origin,
            start_ns,
            total,
            interval_ns,
            deadline,
        );
        // Whatever happened, let the consumer know no more records will be sent.
        let flushed = producer.flush(clock::remaining(deadline));
        progress
            .delivered
            .store(producer.context().delivered(), Ordering::Release);
        progress.producing_done.store(true, Ordering::Release);
        let received = reader
            .join()
            .map_err(|_| anyhow!("the consumer thread panicked"))??;
        let paced = paced?;
        flushed.context("flush the producer")?;
        Ok((paced, received))
    })?;
    let elapsed = clock::now().saturating_duration_since(start);
    let cpu = cpu.finish(elapsed);

    let stats = producer.context();
    let delivered = stats.delivered();
    let timed_note = format!(
        "percentiles over records sent after the first {} s of warm-up",
        args.warmup
    );
    let mut produce = Phase::new(
        "produce (paced)",
        delivered,
        workload.record_size,
        paced.elapsed,
        cpu,
    );
    produce.failed = total.saturating_sub(delivered);
    produce.latency = LatencySummary::from_histogram(&stats.latency()?);
    produce.notes.push(format!(
        "latency = send() to delivery report (acks={}); target {} records/s, at most {:.3} ms \
         behind schedule",
        workload.acks,
        args.rate,
        paced.max_lag_ns as f64 / 1e6
    ));
    produce.notes.push(timed_note.clone());
    if let Some(error) = stats.first_error() {
        produce.notes.push(format!("first delivery error: {error}"));
    }

    // The consume rate is over the same window as production (from the first send to the last
    // record received), which is what "keeping up" means.
    let receive_window =
        Duration::from_nanos(received.last_ns.saturating_sub(start_ns)).max(paced.elapsed);
    let mut end_to_end = Phase::new(
        "end-to-end",
        received.records,
        workload.record_size,
        receive_window,
        cpu,
    );
    end_to_end.failed = delivered.saturating_sub(received.records);
    end_to_end.latency = LatencySummary::from_histogram(&received.latency_us);
    end_to_end.notes.push(
        "latency = consumer poll() return minus the send time stamped in the payload".to_string(),
    );
    end_to_end.notes.push(timed_note);
    if received.errors > 0 {
        end_to_end
            .notes
            .push(format!("{} consumer errors", received.errors));
    }
    Ok(Outcome {
        topic: Some(topic),
        settings: serde_json::to_value(args).context("serialise the settings")?,
        phases: vec![produce, end_to_end],
    })
}

struct Paced {
    /// From the first send to the last.
    elapsed: Duration,
    max_lag_ns: u64,
}

#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename the list
fn pace(
    producer: &rdkafka::producer::ThreadedProducer<ProduceStats>,
    args: &E2eArgs,
    topic: &str,
    origin: Instant,
    start_ns: u64,
    total: u64,
    interval_ns: f64,
    deadline: Instant,
) -> Result<Paced> {
    let workload = &args.workload;
    let mut payload = vec![0x5a_u8; workload.record_size];
    // Every record reads the clock: at 10k records/s the cost is nothing, and the stamp is exact.
    let mut send_clock = SendClock::new(origin, 1);
    let mut max_lag_ns = 0_u64;
    let mut last_sent_ns = start_ns;
    for index in 0..total {
        let due_ns = start_ns + (index as f64 * interval_ns) as u64;
        let now_ns = clock::nanos_since(origin);
        if now_ns < due_ns {
            std::thread::sleep(Duration::from_nanos(due_ns - now_ns));
        }
        let partition = clients::partition_for(workload.partitioning, index, workload.partitions);
        last_sent_ns = clients::send(
            producer,
            topic,
            partition,
            &mut payload,
            &mut send_clock,
            deadline,
        )?;
        max_lag_ns = max_lag_ns.max(last_sent_ns.saturating_sub(due_ns));
    }
    Ok(Paced {
        elapsed: Duration::from_nanos(last_sent_ns.saturating_sub(start_ns)),
        max_lag_ns,
    })
}

/// Polls until every delivered record has arrived (once production is over), the grace period
/// after production runs out, or the deadline passes.
fn receive(
    consumer: &BaseConsumer<BenchContext>,
    origin: Instant,
    timed_from_ns: u64,
    progress: &Progress,
    deadline: Instant,
) -> Result<Received> {
    let mut received = Received {
        records: 0,
        last_ns: 0,
        latency_us: new_histogram()?,
        errors: 0,
    };
    let mut drain_deadline: Option<Instant> = None;
    loop {
        if progress.producing_done.load(Ordering::Acquire) {
            if received.records >= progress.delivered.load(Ordering::Acquire) {
                break;
            }
            let drain_deadline = *drain_deadline.get_or_insert_with(|| clock::now() + DRAIN_GRACE);
            if clock::remaining(drain_deadline).is_zero() {
                break;
            }
        }
        if clock::remaining(deadline).is_zero() {
            break;
        }
        match consumer.poll(POLL_TIMEOUT) {
            Some(Ok(message)) => {
                let now_ns = clock::nanos_since(origin);
                received.records += 1;
                received.last_ns = now_ns;
                if let Some(sent_ns) = message.payload().and_then(clients::stamped_send_ns) {
                    if sent_ns >= timed_from_ns {
                        received
                            .latency_us
                            .saturating_record(now_ns.saturating_sub(sent_ns) / 1000);
                    }
                }
            }
            Some(Err(error)) => {
                received.errors += 1;
                if received.errors <= ERRORS_PRINTED {
                    eprintln!("consume error: {error}");
                }
            }
            None => {}
        }
    }
    Ok(received)
}
