//! The broker's use of `strata-wire` framing: turning response messages into the chunks of one
//! frame, plain or, for Fetch, with record batches as chunks of their own (vectored write).
//!
//! Kept in one module so the connection and dispatch code never touch frame bytes directly.

use bytes::Bytes;
use kafka_protocol::protocol::Encodable;
use strata_wire::FetchResponseChunks;

pub(crate) use strata_wire::frame::EncodeError;

/// One encoded response frame — size prefix, header, body — as chunks written in order with one
/// vectored write, so record batches go to the socket from their own buffers.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResponseFrame {
    pub chunks: Vec<Bytes>,
}

impl ResponseFrame {
    #[cfg(test)]
    pub fn to_vec(&self) -> Vec<u8> {
        self.chunks.iter().flat_map(|c| c.iter().copied()).collect()
    }
}

/// Encodes `body` at `version` into one buffer.
pub(crate) fn encode_response<R: Encodable>(
    correlation_id: i32,
    header_version: i16,
    body: &R,
    version: i16,
) -> Result<ResponseFrame, EncodeError> {
    let frame = strata_wire::frame::encode_response(correlation_id, header_version, body, version)?;
    Ok(ResponseFrame {
        chunks: vec![frame],
    })
}

/// Encodes a Fetch response at `version`, each record batch of 512 bytes or more as its own
/// chunk, written from the log's buffer.
pub(crate) fn encode_fetch_response(
    correlation_id: i32,
    body: &FetchResponseChunks,
    version: i16,
) -> Result<ResponseFrame, EncodeError> {
    let frame = body.encode_frame(correlation_id, version)?;
    Ok(ResponseFrame {
        chunks: frame.into_parts(),
    })
}
