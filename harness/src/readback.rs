//! The final read: after the faults have stopped, a fresh consumer with no group assigns every
//! partition at offset 0 and reads up to the high watermark. Whatever it cannot read (an error,
//! a stall) is kept as evidence rather than treated as a harness failure.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use strata_tests::clients::{base_config, TestContext};

/// How long the read may go without receiving anything before it stops.
const STALL: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct PartitionLog {
    pub low: i64,
    pub high: i64,
    /// (offset, value) in the order received.
    pub records: Vec<(i64, String)>,
    pub errors: Vec<String>,
}

impl PartitionLog {
    /// Whether the read reached the high watermark.
    pub fn complete(&self) -> bool {
        self.high == 0
            || self
                .records
                .last()
                .is_some_and(|(o, _)| *o + 1 >= self.high)
    }
}

pub fn read_everything(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, PartitionLog> {
    let mut logs: BTreeMap<i32, PartitionLog> = BTreeMap::new();
    let mut config = base_config(bootstrap);
    config
        .set("group.id", "harness-readback")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set("fetch.wait.max.ms", "100");
    let consumer: BaseConsumer<TestContext> = match config.create_with_context(TestContext) {
        Ok(consumer) => consumer,
        Err(error) => {
            for partition in 0..partitions {
                logs.entry(partition)
                    .or_default()
                    .errors
                    .push(format!("create the read-back consumer: {error}"));
            }
            return logs;
        }
    };
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        let log = logs.entry(partition).or_default();
        let deadline = Instant::now() + STALL;
        loop {
            match consumer.fetch_watermarks(topic, partition, Duration::from_secs(5)) {
                Ok((low, high)) => {
                    (log.low, log.high) = (low, high);
                    break;
                }
                Err(error) if Instant::now() >= deadline => {
                    log.errors.push(format!("ListOffsets: {error}"));
                    break;
                }
                Err(_) => {}
            }
        }
        let _ = list.add_partition_offset(topic, partition, Offset::Offset(0));
    }
    if let Err(error) = consumer.assign(&list) {
        for log in logs.values_mut() {
            log.errors.push(format!("assign: {error}"));
        }
        return logs;
    }
    let mut last_progress = Instant::now();
    while !logs.values().all(PartitionLog::complete) && last_progress.elapsed() < STALL {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                last_progress = Instant::now();
                let value = message
                    .payload()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                logs.entry(message.partition())
                    .or_default()
                    .records
                    .push((message.offset(), value));
            }
            Some(Err(error)) => {
                // Errors name no partition in general; keep them on partition -1's list.
                let errors = &mut logs.entry(-1).or_default().errors;
                if errors.len() < 20 {
                    errors.push(error.to_string());
                }
            }
            None => {}
        }
    }
    logs
}
