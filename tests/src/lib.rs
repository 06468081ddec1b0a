//! End-to-end tests of Strata as users run it: the real `strata` binary, started as a child
//! process on a temporary data directory, driven by unchanged Kafka clients (librdkafka through
//! the `rdkafka` crate, kcat, Python's confluent-kafka) and by hand-built wire frames.
//!
//! This crate owns the harness that builds, starts, kills and restarts brokers, and the helpers
//! that say what the clients saw. It must never link the broker's own crates: what is tested is
//! exactly the binary and the bytes on the wire, nothing in-process.
//!
//! Test rules (the tests are a paper trail, so they must be able to fail): no sleeps as
//! synchronisation (wait on a condition with a deadline, see [`wait`]), no retries to hide
//! flakiness, random choices seeded and the seed printed.

// Test-support code: a failed expectation is a test failure, and a panic says so best.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: panicking is how a test reports a broken expectation"
)]
// The workspace bans ambient time so that broker code takes a `Clock`; these tests measure a
// real process on the real clock, so deadlines have to use it.
#![allow(
    clippy::disallowed_methods,
    reason = "deadlines against a real child process need the real clock"
)]

pub mod batch;
pub mod binary;
pub mod certs;
pub mod cleanup;
pub mod clients;
pub mod cluster;
pub mod command;
pub mod process;
pub mod raw;
pub mod records;
pub mod signals;
pub mod stream;
pub mod wait;

pub use process::{SharedStorage, StrataOptions, StrataProcess};
