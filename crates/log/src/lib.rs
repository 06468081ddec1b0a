//! The partition log: everything between "a validated produce request" and "bytes durable in
//! object storage", and back again for fetches. It owns the topic catalog, offset assignment,
//! the broker-wide group-commit writer (many partitions' batches in one write-ahead object),
//! the fixed-size offset index, per-partition manifests replaced by compare-and-swap,
//! compaction of write-ahead objects into per-partition segments, retention, the shared tail
//! cache, and idempotent-producer state.
//!
//! It never speaks the Kafka wire protocol (the broker converts) and never touches a file or a
//! socket directly: all durable state goes through [`strata_storage::ObjectStore`].

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod append;
mod cache;
pub mod catalog;
pub mod cleaner;
pub mod config;
pub mod config_table;
mod error;
mod index;
mod maintenance;
mod manager;
mod manifest;
mod ownership;
mod partition;
mod producer;
pub mod read;
mod read_ahead;
mod shared;
mod tiering;
mod topics;
mod txn;
mod wal;
mod writer;

#[cfg(test)]
mod tests;

pub use append::{Acks, AppendOutcome, AppendTicket};
pub use catalog::{TopicId, TopicInfo};
pub use cleaner::CleanerSnapshot;
pub use config::{
    default_concurrent_decompressions, CleanupPolicy, LogConfig, TimestampType, TopicConfig,
};
pub use error::{LogError, LogResult};
pub use manager::LogManager;
pub use producer::{ProducerSummary, TxnGuard};
pub use read::{ReadOutcome, Watermarks};
pub use read_ahead::ReadAheadSnapshot;
pub use shared::Ownership;
pub use tiering::TieringSnapshot;
pub use topics::NewTopic;
pub use txn::{Isolation, TxnSnapshot};
pub use writer::WriteHold;
