//! Kafka wire framing and v2 record batches, with no IO.
//!
//! This crate owns the bytes that cross the socket: splitting length-prefixed request frames out
//! of a read buffer (rejecting hostile sizes before anything is buffered), reading request
//! headers so that even unknown or unsupported requests can be answered by correlation id,
//! decoding request bodies without letting a malformed body crash or exhaust the process, and
//! encoding responses — Fetch responses as a list of chunks that carry record batches as their
//! own [`bytes::Bytes`] instead of copying them ([`fetch`]). It also owns record batches
//! (magic 2) as raw bytes: splitting a produce request's records into batches, validating header, CRC-32C and record
//! framing, and rewriting the base offset and leader epoch for storage while sharing the record
//! bytes with the client's buffer.
//!
//! It never performs IO and never looks at a clock: callers hand it bytes and values and get bytes
//! and values back. It decompresses compressed batches only to check their records
//! ([`compressed::validate_compressed_records`]), streaming and without keeping the result. Everything here is a pure function of its input, which is
//! what lets the request decoder and the batch validator be fuzzed.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod batch;
pub mod builder;
pub mod clean;
pub mod compressed;
pub mod count;
pub mod decode;
pub mod fetch;
pub mod frame;
pub mod visibility;

#[cfg(test)]
mod testutil;

pub use batch::{
    find_batch_containing, read_batch_header, rewrite_for_append, split_batches,
    validate_client_batch, validate_records, BatchError, BatchHeader, BatchView, Compression,
    RecordsCheck, StoredBatch, TimestampType,
};
pub use compressed::validate_compressed_records;
pub use decode::decode_request;
pub use fetch::{FetchPartitionChunks, FetchResponseChunks, FetchTopicChunks};
pub use frame::{
    encode_response, parse_request_header, try_split_frame, EncodeError, FrameError, RequestApi,
    RequestHeaderInfo, ResponseFrame,
};
