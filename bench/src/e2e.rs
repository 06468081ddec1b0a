//! The end-to-end latency benchmark: producers paced at a fixed total rate and consumers reading
//! the same topic at the same time, in one process (by default one of each; `--producers 4
//! --consumers 4 --partitions 100 --record-size 1024` is the OpenMessaging Benchmark's standard
//! Kafka workload, each producer and consumer its own librdkafka client, the consumers sharing
//! the partitions in one consumer group). Each payload carries its send time (nanoseconds
//! on this process's monotonic clock), so receive time minus that stamp is the latency a record
//! sees from `send()` in one application to `poll()` in another — through librdkafka's batching,
//! the broker's group commit and durable write, and the consumer's long-poll fetch.
//!
//! Pacing: record i is due at start + i/rate, and producer p of N sends the records i with
//! i mod N = p, so together they hold the rate and each holds rate/N. A producer sleeps until
//! its next record is due and never skips one, so if it falls behind (a full client queue, a
//! descheduled thread) it catches up in a burst; the largest delay behind schedule is reported
//! so that shows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use rdkafka::consumer::{BaseConsumer, Consumer};
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

/// What one consumer thread saw.
struct Received {
    records: u64,
    /// Nanoseconds since origin of the last record received.
    last_ns: u64,
    latency_us: Histogram<u64>,
    errors: u64,
    /// Per second of send time: what `--timeline` prints.
    seconds: Vec<Second>,
}

/// The records sent in one second of the run, as the consumers saw them.
#[derive(Debug, Clone, Copy, Default)]
struct Second {
    records: u64,
    /// Records whose end-to-end latency exceeded [`TIMELINE_SLOW_US`].
    slow: u64,
    max_us: u64,
}

/// What `--timeline` counts as slow: the local backend's p99 aim (issue 19).
const TIMELINE_SLOW_US: u64 = 5_000;

impl Received {
    fn new() -> Result<Self> {
        Ok(Self {
            records: 0,
            last_ns: 0,
            latency_us: new_histogram()?,
            errors: 0,
            seconds: Vec::new(),
        })
    }

    fn record(&mut self, sent_ns: u64, latency_us: u64) {
        self.latency_us.saturating_record(latency_us);
        let at = (sent_ns / 1_000_000_000) as usize;
        if self.seconds.len() <= at {
            self.seconds.resize(at + 1, Second::default());
        }
        let second = &mut self.seconds[at];
        second.records += 1;
        second.slow += u64::from(latency_us > TIMELINE_SLOW_US);
        second.max_us = second.max_us.max(latency_us);
    }

    fn merge(&mut self, other: Received) -> Result<()> {
        self.records += other.records;
        self.last_ns = self.last_ns.max(other.last_ns);
        self.errors += other.errors;
        self.latency_us
            .add(&other.latency_us)
            .context("merge latency histograms")?;
        if self.seconds.len() < other.seconds.len() {
            self.seconds.resize(other.seconds.len(), Second::default());
        }
        for (mine, theirs) in self.seconds.iter_mut().zip(other.seconds) {
            mine.records += theirs.records;
            mine.slow += theirs.slow;
            mine.max_us = mine.max_us.max(theirs.max_us);
        }
        Ok(())
    }
}

/// Prints one line per second of send time (UTC wall clock, to line up with the broker's log):
/// the records, how many took over 5 ms, and the slowest.
fn print_timeline(origin_wall: SystemTime, seconds: &[Second]) {
    let base = origin_wall
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    eprintln!("second (UTC)  records  over 5 ms  max ms");
    for (i, s) in seconds.iter().enumerate() {
        let t = (base + i as u64) % 86_400;
        eprintln!(
            "{:02}:{:02}:{:02}  {:>9}  {:>9}  {:>6.1}",
            t / 3600,
            t / 60 % 60,
            t % 60,
            s.records,
            s.slow,
            s.max_us as f64 / 1e3
        );
    }
}

/// Shared between the producing threads and the consumer threads.
struct Progress {
    /// Set once every producer has flushed: `delivered` is then final.
    producing_done: AtomicBool,
    delivered: AtomicU64,
    /// Records received, over all consumers.
    received: AtomicU64,
}

/// How long the consumers of a group get to be assigned every partition before producing
/// starts (the broker's initial rebalance delay is 3 s by default).
const ASSIGNMENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Stops process `pid` at `at` for `length` (`--pause-broker-at`).
fn pause_broker(at: std::time::Instant, length: Duration, pid: u32) {
    std::thread::sleep(at.saturating_duration_since(clock::now()));
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
    if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
        eprintln!("could not stop the broker (pid {pid})");
        return;
    }
    eprintln!("broker stopped for {length:?}");
    std::thread::sleep(length);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
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
    let pause = match (args.pause_broker_at, args.pause_broker_ms, broker_pid) {
        (Some(at), Some(ms), Some(pid)) if at >= 0.0 && at < args.duration => {
            Some((Duration::from_secs_f64(at), Duration::from_millis(ms), pid))
        }
        (Some(_), _, None) => bail!("--pause-broker-at needs the broker's pid"),
        (Some(_), _, Some(_)) => bail!("--pause-broker-at must fall within --duration"),
        _ => None,
    };
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

    let origin = clock::now();
    let origin_wall = SystemTime::now();
    let producers = (0..args.producers)
        .map(|_| -> Result<_> {
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
            Ok(producer)
        })
        .collect::<Result<Vec<_>>>()?;
    let grouped = args.consumers > 1 || args.subscribe;
    let consumers = (0..args.consumers)
        .map(|_| -> Result<BaseConsumer<BenchContext>> {
            if grouped {
                let consumer =
                    clients::group_consumer(bootstrap, target, &format!("{topic}-group"))?;
                consumer
                    .subscribe(&[topic.as_str()])
                    .context("subscribe the consumer")?;
                Ok(consumer)
            } else {
                let consumer = clients::consumer(bootstrap, target)?;
                clients::learn_leaders(&consumer, &topic)?;
                clients::assign_all(&consumer, &topic, workload.partitions)?;
                Ok(consumer)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if grouped {
        wait_for_assignment(&consumers, workload.partitions)?;
    }
    let catch_up = match &args.catch_up_topic {
        Some(old) => {
            let consumer = clients::replay_consumer(bootstrap, target)?;
            let partitions = clients::partition_count(&consumer, old)?;
            clients::assign_all(&consumer, old, partitions)?;
            Some((consumer, old.as_str(), partitions))
        }
        None => None,
    };

    let total = (args.rate as f64 * args.duration).round() as u64;
    let interval_ns = 1e9 / args.rate as f64;
    let start_ns = clock::nanos_since(origin);
    let timed_from_ns = start_ns + clock::duration_to_nanos(Duration::from_secs_f64(args.warmup));
    for producer in &producers {
        producer.context().time_from(timed_from_ns);
    }
    let progress = Progress {
        producing_done: AtomicBool::new(false),
        delivered: AtomicU64::new(0),
        received: AtomicU64::new(0),
    };
    eprintln!(
        "producing {total} records of {} bytes to {topic} ({} partitions) at {} records/s for {} s \
         from {} producer(s) (first {} s not timed), consuming concurrently with {} consumer(s){}",
        workload.record_size,
        workload.partitions,
        args.rate,
        args.duration,
        args.producers,
        args.warmup,
        args.consumers,
        if grouped { " in one group" } else { "" }
    );

    let deadline = clock::now()
        + Duration::from_secs_f64(args.duration)
        + Duration::from_secs(workload.timeout_secs);
    let cpu = CpuMeter::start(broker_pid);
    let start = clock::now();
    let (paced, received, replayed) = std::thread::scope(|scope| -> Result<_> {
        if let Some((at, length, pid)) = pause {
            scope.spawn(move || pause_broker(start + at, length, pid));
        }
        let replayer = catch_up.as_ref().map(|(consumer, _, _)| {
            let progress = &progress;
            scope.spawn(move || replay(consumer, progress, deadline))
        });
        let readers: Vec<_> = consumers
            .iter()
            .map(|consumer| {
                let progress = &progress;
                scope.spawn(move || receive(consumer, origin, timed_from_ns, progress, deadline))
            })
            .collect();
        let senders: Vec<_> = producers
            .iter()
            .enumerate()
            .map(|(index, producer)| {
                let topic = topic.as_str();
                let lane = Lane {
                    first: index as u64,
                    step: args.producers as u64,
                };
                scope.spawn(move || {
                    let paced = pace(
                        producer,
                        args,
                        topic,
                        origin,
                        start_ns,
                        total,
                        interval_ns,
                        lane,
                        deadline,
                    );
                    // Whatever happened, this producer sends nothing more.
                    let flushed = producer.flush(clock::remaining(deadline));
                    (paced, flushed)
                })
            })
            .collect();
        let mut paced_all = Vec::new();
        let mut flushed_all = Vec::new();
        for sender in senders {
            let (paced, flushed) = sender
                .join()
                .map_err(|_| anyhow!("a producer thread panicked"))?;
            paced_all.push(paced);
            flushed_all.push(flushed);
        }
        let delivered: u64 = producers.iter().map(|p| p.context().delivered()).sum();
        progress.delivered.store(delivered, Ordering::Release);
        progress.producing_done.store(true, Ordering::Release);
        let mut received_all = Vec::new();
        for reader in readers {
            received_all.push(
                reader
                    .join()
                    .map_err(|_| anyhow!("a consumer thread panicked"))??,
            );
        }
        let mut paced = Paced {
            elapsed: Duration::ZERO,
            max_lag_ns: 0,
        };
        for one in paced_all {
            let one = one?;
            paced.elapsed = paced.elapsed.max(one.elapsed);
            paced.max_lag_ns = paced.max_lag_ns.max(one.max_lag_ns);
        }
        for flushed in flushed_all {
            flushed.context("flush a producer")?;
        }
        let mut received = Received::new()?;
        for one in received_all {
            received.merge(one)?;
        }
        let replayed = match replayer {
            Some(thread) => Some(
                thread
                    .join()
                    .map_err(|_| anyhow!("the catch-up consumer thread panicked"))??,
            ),
            None => None,
        };
        Ok((paced, received, replayed))
    })?;
    let elapsed = clock::now().saturating_duration_since(start);
    let cpu = cpu.finish(elapsed);

    let delivered: u64 = producers.iter().map(|p| p.context().delivered()).sum();
    let mut produce_latency = new_histogram()?;
    for producer in &producers {
        produce_latency
            .add(&producer.context().latency()?)
            .context("merge latency histograms")?;
    }
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
    produce.latency = LatencySummary::from_histogram(&produce_latency);
    produce.notes.push(format!(
        "latency = send() to delivery report (acks={}); target {} records/s over {} \
         producer(s), at most {:.3} ms behind schedule",
        workload.acks,
        args.rate,
        args.producers,
        paced.max_lag_ns as f64 / 1e6
    ));
    produce.notes.push(timed_note.clone());
    if let Some(error) = producers.iter().find_map(|p| p.context().first_error()) {
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
    if args.timeline {
        print_timeline(origin_wall, &received.seconds);
    }
    end_to_end.notes.push(format!(
        "latency = consumer poll() return minus the send time stamped in the payload; {} \
         consumer(s){}",
        args.consumers,
        if grouped {
            " sharing the partitions in one consumer group"
        } else {
            ""
        }
    ));
    end_to_end.notes.push(timed_note);
    if received.errors > 0 {
        end_to_end
            .notes
            .push(format!("{} consumer errors", received.errors));
    }
    let mut phases = vec![produce, end_to_end];
    if let (Some(replayed), Some((_, old, partitions))) = (replayed, &catch_up) {
        let mut phase = Phase::new("catch-up read", replayed.records, 0, replayed.elapsed, cpu);
        phase.payload_bytes = replayed.bytes;
        phase.megabytes_per_second = if replayed.elapsed.is_zero() {
            0.0
        } else {
            replayed.bytes as f64 / 1e6 / replayed.elapsed.as_secs_f64()
        };
        phase.notes.push(format!(
            "one more consumer read {old} ({partitions} partitions) from its beginning during \
             the run: {} records, {:.1} MB of payload{}",
            replayed.records,
            replayed.bytes as f64 / 1e6,
            if replayed.reached_end {
                ", to its end"
            } else {
                ", stopped when the run ended"
            }
        ));
        if replayed.errors > 0 {
            phase
                .notes
                .push(format!("{} catch-up consumer errors", replayed.errors));
        }
        phases.push(phase);
    }
    Ok(Outcome {
        topic: Some(topic),
        settings: serde_json::to_value(args).context("serialise the settings")?,
        phases,
    })
}

/// What the catch-up consumer read.
struct Replayed {
    records: u64,
    bytes: u64,
    elapsed: Duration,
    reached_end: bool,
    errors: u64,
}

/// Reads the catch-up topic as fast as librdkafka delivers it until every assigned partition
/// reached its end or the producers are done.
fn replay(
    consumer: &BaseConsumer<BenchContext>,
    progress: &Progress,
    deadline: Instant,
) -> Result<Replayed> {
    let started = clock::now();
    let mut out = Replayed {
        records: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
        reached_end: false,
        errors: 0,
    };
    let partitions = consumer
        .assignment()
        .context("catch-up assignment")?
        .count();
    let mut ended = std::collections::HashSet::new();
    while !progress.producing_done.load(Ordering::Acquire) && !clock::remaining(deadline).is_zero()
    {
        match consumer.poll(POLL_TIMEOUT) {
            Some(Ok(message)) => {
                out.records += 1;
                out.bytes += message.payload_len() as u64;
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(partition))) => {
                ended.insert(partition);
                if ended.len() >= partitions {
                    out.reached_end = true;
                    break;
                }
            }
            Some(Err(error)) => {
                out.errors += 1;
                if out.errors <= ERRORS_PRINTED {
                    eprintln!("catch-up consume error: {error}");
                }
            }
            None => {}
        }
    }
    out.elapsed = clock::now().saturating_duration_since(started);
    Ok(out)
}

/// Polls the consumers of a group until, together, they are assigned every partition, so that
/// no record's latency includes the group forming.
fn wait_for_assignment(consumers: &[BaseConsumer<BenchContext>], partitions: i32) -> Result<()> {
    let deadline = clock::now() + ASSIGNMENT_TIMEOUT;
    loop {
        let mut assigned = 0;
        for consumer in consumers {
            if let Some(Err(error)) = consumer.poll(Duration::from_millis(50)) {
                eprintln!("consumer error while joining: {error}");
            }
            assigned += consumer.assignment().map_or(0, |a| a.count());
        }
        if assigned >= usize::try_from(partitions).unwrap_or(usize::MAX) {
            return Ok(());
        }
        if clock::remaining(deadline).is_zero() {
            bail!("the consumer group was assigned {assigned} of {partitions} partitions in {ASSIGNMENT_TIMEOUT:?}");
        }
    }
}

/// Which records one producer sends: `first`, `first + step`, ...
#[derive(Debug, Clone, Copy)]
struct Lane {
    first: u64,
    step: u64,
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
    lane: Lane,
    deadline: Instant,
) -> Result<Paced> {
    let workload = &args.workload;
    let mut payload = vec![0x5a_u8; workload.record_size];
    // Every record reads the clock: at 10k records/s the cost is nothing, and the stamp is exact.
    let mut send_clock = SendClock::new(origin, 1);
    let mut max_lag_ns = 0_u64;
    let mut last_sent_ns = start_ns;
    for index in (lane.first..total).step_by(usize::try_from(lane.step.max(1)).unwrap_or(1)) {
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
    let mut received = Received::new()?;
    let mut drain_deadline: Option<Instant> = None;
    loop {
        if progress.producing_done.load(Ordering::Acquire) {
            if progress.received.load(Ordering::Acquire)
                >= progress.delivered.load(Ordering::Acquire)
            {
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
                progress.received.fetch_add(1, Ordering::AcqRel);
                received.last_ns = now_ns;
                if let Some(sent_ns) = message.payload().and_then(clients::stamped_send_ns) {
                    if sent_ns >= timed_from_ns {
                        received.record(sent_ns, now_ns.saturating_sub(sent_ns) / 1000);
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
