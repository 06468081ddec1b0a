//! The broker's use of `strata-wire` framing: turning response messages into the chunks of one
//! frame, plain or with record batches spliced in by reference (vectored write).
//!
//! Kept in one module so the connection and dispatch code never touch frame bytes directly.

use bytes::Bytes;
use kafka_protocol::protocol::Encodable;

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

/// Encodes `body` at `version`, writing each of `shared` (record batches the body carries)
/// as its own chunk instead of copying it.
pub(crate) fn encode_response_vectored<R: Encodable>(
    correlation_id: i32,
    header_version: i16,
    body: &R,
    version: i16,
    shared: &[Bytes],
) -> Result<ResponseFrame, EncodeError> {
    let frame = strata_wire::frame::encode_response_frame(
        correlation_id,
        header_version,
        body,
        version,
        shared,
    )?;
    Ok(ResponseFrame {
        chunks: frame.into_parts(),
    })
}
