//! [`ContinuousProducer`]: a producer that keeps a window of records in flight until told to
//! stop, recording the outcome of every record — for tests that restart or kill the broker
//! in the middle of a stream.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::DeliveryFuture;
use tokio::task::JoinHandle;

use crate::clients::{future_record, Acked, TestProducer};
use crate::records::TestRecord;
use crate::wait::wait_until_async;

/// What happened to one record of the stream.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Position in send order, also encoded in the key and value.
    pub sequence: u64,
    pub partition: i32,
    pub record: TestRecord,
    /// Where it was acknowledged, or librdkafka's delivery error.
    pub result: Result<Acked, String>,
}

/// The record with sequence number `sequence`: unique key and value, so a duplicate or a
/// record in the wrong place is recognisable.
pub fn stream_record(sequence: u64) -> TestRecord {
    TestRecord {
        key: Some(format!("k-{sequence}").into_bytes()),
        value: Some(format!("v-{sequence}-{}", "x".repeat((sequence % 97) as usize)).into_bytes()),
        headers: Vec::new(),
        timestamp: None,
    }
}

pub struct ContinuousProducer {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    task: JoinHandle<Vec<Outcome>>,
}

impl ContinuousProducer {
    /// Starts producing records 0, 1, 2, ... round-robin over `partitions`, keeping at most
    /// `window` unacknowledged, until [`finish`](Self::finish) or `limit` records.
    pub fn start(
        producer: TestProducer,
        topic: &str,
        partitions: i32,
        window: usize,
        limit: Option<u64>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(produce_loop(
            producer,
            topic.to_string(),
            partitions,
            window,
            limit.unwrap_or(u64::MAX),
            Arc::clone(&stop),
            Arc::clone(&acked),
        ));
        Self { stop, acked, task }
    }

    /// Records acknowledged so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` records were acknowledged.
    pub async fn wait_for_acked(&self, count: usize, timeout: Duration) {
        let acked = Arc::clone(&self.acked);
        wait_until_async(
            &format!("{count} records are acknowledged"),
            timeout,
            || {
                let now = acked.load(Ordering::SeqCst);
                async move { (now >= count).then_some(()) }
            },
        )
        .await;
    }

    /// Waits until a stream started with a `limit` has sent all its records and has every
    /// delivery report, and returns all outcomes in send order.
    pub async fn join(self, timeout: Duration) -> Vec<Outcome> {
        match tokio::time::timeout(timeout, self.task).await {
            Ok(outcomes) => outcomes.expect("the producing task panicked"),
            Err(_) => panic!(
                "the producer stream did not finish within {timeout:?} ({} records acknowledged)",
                self.acked.load(Ordering::SeqCst)
            ),
        }
    }

    /// Stops sending, waits for every outstanding delivery report, and returns all outcomes
    /// in send order.
    pub async fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the producing task panicked")
    }
}

async fn produce_loop(
    producer: TestProducer,
    topic: String,
    partitions: i32,
    window: usize,
    limit: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut in_flight: VecDeque<(u64, i32, TestRecord, DeliveryFuture)> = VecDeque::new();
    let mut next: u64 = 0;
    loop {
        let stopping = stop.load(Ordering::SeqCst) || next >= limit;
        if stopping && in_flight.is_empty() {
            break;
        }
        if stopping || in_flight.len() >= window {
            let (sequence, partition, record, delivery) = in_flight.pop_front().expect("non-empty");
            let result = match delivery.await {
                Ok(Ok(delivery)) => Ok(Acked {
                    partition: delivery.partition,
                    offset: delivery.offset,
                }),
                Ok(Err((error, _))) => Err(error.to_string()),
                Err(_) => Err("delivery future dropped by the producer".to_string()),
            };
            if result.is_ok() {
                acked.fetch_add(1, Ordering::SeqCst);
            }
            outcomes.push(Outcome {
                sequence,
                partition,
                record,
                result,
            });
            continue;
        }
        let partition = (next % partitions as u64) as i32;
        let record = stream_record(next);
        let delivery = producer
            .send_result(future_record(&topic, Some(partition), &record))
            .unwrap_or_else(|(e, _)| panic!("enqueue record {next}: {e}"));
        in_flight.push_back((next, partition, record, delivery));
        next += 1;
    }
    outcomes
}
