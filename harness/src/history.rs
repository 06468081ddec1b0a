//! The history: every operation the clients and the nemesis performed, in the order the harness
//! observed them, with the time since the campaign started. The checkers read only this (and the
//! final read-back), so a failure can be explained from the history file alone.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Event {
    /// A producer handed a record to librdkafka.
    Send {
        producer: String,
        value: String,
        partition: i32,
    },
    /// The broker acknowledged it (acks=all) at this offset.
    Ack {
        value: String,
        partition: i32,
        offset: i64,
    },
    /// Delivery failed: the write may or may not be stored.
    SendFailed { value: String, error: String },
    /// The producer hit a fatal error (idempotence broken) and was replaced.
    ProducerFatal { producer: String, error: String },
    /// A group member's assignment changed; its reads after this belong to a new session.
    Rebalance {
        member: usize,
        session: u64,
        kind: String,
        partitions: Vec<i32>,
    },
    /// A group member received a record.
    Read {
        member: usize,
        session: u64,
        partition: i32,
        offset: i64,
        value: String,
    },
    /// A group member's offset commit finished (the offset is the next one to read).
    Commit {
        member: usize,
        partition: i32,
        offset: i64,
        ok: bool,
        error: Option<String>,
    },
    /// The group's committed offset as OffsetFetch answered it.
    Committed { partition: i32, offset: i64 },
    /// The nemesis began a fault.
    Fault { kind: String, detail: String },
    /// The nemesis finished one (healed, or gave up with an error).
    FaultDone {
        kind: String,
        detail: String,
        error: Option<String>,
    },
    /// A client error worth keeping (consumer errors, read-back errors).
    ClientError { who: String, error: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub at_ms: u64,
    #[serde(flatten)]
    pub event: Event,
}

/// Shared by every workload thread and the nemesis.
#[derive(Clone)]
pub struct History {
    started: Instant,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl History {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            entries: Arc::default(),
        }
    }

    pub fn record(&self, event: Event) {
        let at_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Ok(mut entries) = self.entries.lock() {
            entries.push(Entry { at_ms, event });
        }
    }

    pub fn snapshot(&self) -> Vec<Entry> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// One JSON object per line.
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for entry in self.snapshot() {
            serde_json::to_writer(&mut out, &entry)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }
}
