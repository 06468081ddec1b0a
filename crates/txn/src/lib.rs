//! The transaction coordinator (KIP-98) as a sans-IO state machine, beside `strata-groups`.
//!
//! One [`TxnShard`] holds the transactions of one partition of `__transaction_state`. The
//! broker calls it with a request, the wall-clock time (Kafka's transaction timestamps and
//! timeouts are wall-clock) and a [`RequestToken`]; it answers with [`Output`]s: responses,
//! one record to make durable before the transition it carries takes effect
//! ([`TxnShard::persist_completed`]), and marker jobs (WriteTxnMarkers to every partition of a
//! transaction whose Prepare record is durable, reported back with
//! [`TxnShard::markers_written`]). Transaction timeouts and expiry fire through
//! [`TxnShard::tick`]. Every durable decision is one record in Kafka's own binary
//! `TransactionLogKey`/`TransactionLogValue` (version 0) format, so a coordinator rebuilt with
//! [`TxnShard::replay`] carries on where the previous one stopped, including sending the
//! markers of a transaction it finds prepared.

// Tests may use ambient time (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod error;
mod record;
mod state;

pub use error::TxnError;
pub use record::{
    decode_key, decode_value, encode_key, encode_value, RecordError, TxnRecord, TxnValue,
};
pub use state::{
    Completion, InitProducerIdRequest, ListFilter, MarkerJob, Output, PersistId, RequestToken,
    Response, TxnConfig, TxnDescription, TxnShard, TxnState,
};
