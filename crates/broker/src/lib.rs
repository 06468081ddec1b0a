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

mod api_versions;
mod connection;
pub mod coordinator;
mod dispatch;
pub mod errors;
mod framing;
mod handlers;
mod server;
mod settings;

#[cfg(test)]
mod tests;

pub use api_versions::{supported_apis, supported_versions};
pub use server::{Broker, BrokerParts};
pub use settings::BrokerSettings;

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
}
