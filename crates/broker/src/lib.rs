//! The Kafka front end: it owns client connections (accept loop, connection limit, request
//! framing, in-order responses over pipelined requests, graceful shutdown), request dispatch
//! by API key and version, the handlers of each implemented Kafka API, and the one table that
//! maps Strata's errors to Kafka error codes.
//!
//! It is the only layer that converts between Kafka wire types (`kafka-protocol` messages) and
//! domain types (`strata-log` calls, `TopicPartition`, `Offset`). It never stores anything
//! itself, never decompresses or re-encodes record batches (they stay the client's `Bytes`
//! from socket to log and back), and never panics or crashes on client input: a bad request
//! gets an error answer or, where the protocol has no way to say so, closes its connection only.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod api_versions;
mod authorize;
pub mod cluster;
mod connection;
pub mod coordinator;
mod dispatch;
mod error_codes;
pub mod errors;
mod fetch_sessions;
mod framing;
pub mod group_configs;
mod handlers;
mod limits;
mod produce_turn;
pub mod quotas;
pub mod security;
mod server;
mod settings;
mod shard_log;
pub mod share;
pub mod traffic;
pub mod txn_coordinator;
mod txn_markers;

#[cfg(test)]
mod tests;

pub use api_versions::{supported_apis, supported_versions};
pub use fetch_sessions::FetchSessionStats;
pub(crate) use produce_turn::ProduceTurn;
pub use server::{Broker, BrokerParts};
pub use settings::{BrokerSettings, ClusterSettings};
/// `group_consumer_migration_policy`, parsed by the server from its settings.
pub use strata_groups::MigrationPolicy;

use std::net::SocketAddr;

use tokio::sync::watch;

/// What a handler knows about the request it serves besides the request body.
#[derive(Debug, Clone)]
pub(crate) struct RequestContext {
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
    pub peer: SocketAddr,
    /// Turns true when the broker starts shutting down: long polls return early.
    pub shutdown: watch::Receiver<bool>,
    /// For a Produce: its place in the connection's order of appends.
    pub produce_turn: std::sync::Arc<std::sync::Mutex<Option<ProduceTurn>>>,
    /// Who the connection authenticated as (`User:ANONYMOUS` on a listener without SASL):
    /// what authorization and quotas will key on.
    pub principal: std::sync::Arc<security::Principal>,
    /// The listener the request came in on: its endpoint is the one advertised back.
    pub listener: std::sync::Arc<security::Listener>,
    /// The error codes of the response, counted per API once it is sent.
    pub errors: std::sync::Arc<error_codes::ErrorTally>,
    /// Time the request has kept the broker busy, for the `request_percentage` quota.
    pub busy: std::sync::Arc<quotas::busy::BusyMeter>,
}
