//! Kafka request/response framing: size-prefixed frames, request headers, response encoding.
//!
//! Every Kafka message on the wire is `size: i32` followed by `size` bytes. A request body starts
//! with the request header (`api_key: i16`, `api_version: i16`, `correlation_id: i32`,
//! `client_id: nullable string`, and tagged fields in the flexible header v2); a response body
//! starts with the response header (`correlation_id`, plus tagged fields in v1).

use std::io::IoSlice;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::{Decodable, Encodable, VersionRange};
use thiserror::Error;

/// Bytes of the size prefix in front of every frame.
pub const SIZE_PREFIX_LEN: usize = 4;

/// `api_key`, `api_version` and `correlation_id`: the part of a request header that every
/// version shares, and all we need to answer a request we cannot decode.
pub const REQUEST_HEADER_FIXED_LEN: usize = 8;

/// Why an incoming frame or request could not be taken apart.
///
/// Kafka closes the connection on all of these (after answering, where the correlation id is
/// known and the broker chooses to); the stream cannot be trusted to be in sync afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The size prefix is negative.
    #[error("frame size {0} is negative")]
    NegativeSize(i32),
    /// The size prefix exceeds the configured limit; nothing of the body was buffered.
    #[error("frame of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The declared size.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// The frame is too short to hold api key, version and correlation id.
    #[error("request frame of {len} bytes is too short for a request header")]
    TruncatedHeader {
        /// Length of the frame.
        len: usize,
    },
    /// The api key and version are supported, but the rest of the header does not decode.
    #[error(
        "malformed request header (api key {api_key}, version {api_version}, correlation id \
         {correlation_id}): {reason}"
    )]
    MalformedHeader {
        /// Raw api key.
        api_key: i16,
        /// Requested version.
        api_version: i16,
        /// Correlation id, for the error answer.
        correlation_id: i32,
        /// What the decoder reported.
        reason: String,
    },
    /// [`decode_request`](crate::decode::decode_request) was asked for a request whose key or
    /// version is not supported; answer it from the header instead.
    #[error("api key {api_key} version {api_version} is not supported")]
    Unsupported {
        /// Raw api key.
        api_key: i16,
        /// Requested version.
        api_version: i16,
    },
    /// The request body does not decode.
    #[error("malformed {api_key:?} v{api_version} request body: {reason}")]
    MalformedBody {
        /// The request's api.
        api_key: ApiKey,
        /// Requested version.
        api_version: i16,
        /// What the decoder (or the guard around it) reported.
        reason: String,
    },
}

/// Why a response could not be encoded. Always a bug on our side, never the client's doing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// The response header version is not 0 or 1.
    #[error("cannot encode response header v{version}: {reason}")]
    Header {
        /// Requested header version.
        version: i16,
        /// What the encoder reported.
        reason: String,
    },
    /// The body does not encode at this version (e.g. a field this version cannot carry).
    #[error("cannot encode response body v{version}: {reason}")]
    Body {
        /// Requested body version.
        version: i16,
        /// What the encoder reported.
        reason: String,
    },
    /// The frame would not fit the i32 size prefix.
    #[error("response of {size} bytes does not fit a Kafka frame")]
    FrameTooLarge {
        /// Bytes after the size prefix.
        size: usize,
    },
}

/// Splits one complete frame body off the front of a connection's read buffer.
///
/// Returns `Ok(None)` until the size prefix and the whole body are buffered. The size is checked
/// as soon as its four bytes arrive, so a client announcing a negative or oversized frame is
/// rejected before we buffer (or reserve room for) any of its body. Once the size is known to be
/// acceptable, room for the rest of the frame is reserved so the body is read into one allocation.
/// The returned body excludes the size prefix and is a zero-copy split of the buffer.
///
/// A connection can thus hold at most `max_frame` bytes of reservation for a frame it has not
/// sent yet; bounding the sum over all connections (Kafka's `queued.max.request.bytes`) is the
/// connection layer's job.
pub fn try_split_frame(buf: &mut BytesMut, max_frame: usize) -> Result<Option<Bytes>, FrameError> {
    let Some(prefix) = buf.get(..SIZE_PREFIX_LEN) else {
        return Ok(None);
    };
    let mut raw = [0u8; SIZE_PREFIX_LEN];
    raw.copy_from_slice(prefix);
    let declared = i32::from_be_bytes(raw);
    let size = usize::try_from(declared).map_err(|_| FrameError::NegativeSize(declared))?;
    if size > max_frame {
        return Err(FrameError::TooLarge {
            size,
            max: max_frame,
        });
    }
    let needed = SIZE_PREFIX_LEN + size;
    if buf.len() < needed {
        buf.reserve(needed - buf.len());
        return Ok(None);
    }
    buf.advance(SIZE_PREFIX_LEN);
    Ok(Some(buf.split_to(size).freeze()))
}

/// What the request header says, and whether we can decode the body.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestHeaderInfo {
    /// Raw api key, whether or not we know it.
    pub api_key: i16,
    /// Requested version, whether or not we support it.
    pub api_version: i16,
    /// To be echoed in the response, including error responses.
    pub correlation_id: i32,
    /// How far the header could be understood.
    pub api: RequestApi,
}

/// Whether a request's api key and version are decodable.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestApi {
    /// Known key, version within the codec's range; the full header was decoded and the frame now
    /// starts at the body.
    Supported {
        /// The api.
        key: ApiKey,
        /// The full header, including client id and tagged fields.
        header: RequestHeader,
    },
    /// Known key, but a version the codec cannot decode. Kafka answers ApiVersions requests of
    /// any version with an ApiVersions v0 response carrying `UNSUPPORTED_VERSION`.
    UnsupportedVersion {
        /// The api.
        key: ApiKey,
        /// The versions the codec can decode.
        valid_versions: VersionRange,
    },
    /// An api key the codec does not know.
    UnknownKey,
}

impl RequestHeaderInfo {
    /// The api, when the request can be decoded.
    pub fn supported_key(&self) -> Option<ApiKey> {
        match &self.api {
            RequestApi::Supported { key, .. } => Some(*key),
            _ => None,
        }
    }

    /// The client id, when the header was fully decoded and carried one.
    pub fn client_id(&self) -> Option<&str> {
        match &self.api {
            RequestApi::Supported { header, .. } => header.client_id.as_deref(),
            _ => None,
        }
    }

    /// The response header version to answer with.
    ///
    /// ApiVersions responses always use header v0, whatever the version, because a client that
    /// sent an unsupported ApiVersions version must still be able to read the answer. For other
    /// unsupported versions this is the codec's best guess; Kafka itself closes those connections.
    pub fn response_header_version(&self) -> i16 {
        match &self.api {
            RequestApi::Supported { key, .. } | RequestApi::UnsupportedVersion { key, .. } => {
                if *key == ApiKey::ApiVersions {
                    0
                } else {
                    key.response_header_version(self.api_version)
                }
            }
            RequestApi::UnknownKey => 0,
        }
    }
}

/// Reads the request header at the front of a frame.
///
/// Api key, version and correlation id are read first, so that a request with an unknown key or
/// an unsupported version still yields its correlation id for an error answer. Only for a known
/// key and a version within `valid_versions()` is the full header decoded, with the header
/// version that key and version call for (v2 adds tagged fields); `frame` is then advanced to
/// the body. In every other case `frame` is left untouched.
///
/// Never panics: it checks the length itself instead of using kafka-protocol's
/// `decode_request_header_from_buffer`, whose `peek_bytes` panics on frames shorter than 4 bytes.
pub fn parse_request_header(frame: &mut Bytes) -> Result<RequestHeaderInfo, FrameError> {
    let Some(mut fixed) = frame.get(..REQUEST_HEADER_FIXED_LEN) else {
        return Err(FrameError::TruncatedHeader { len: frame.len() });
    };
    let api_key = fixed.get_i16();
    let api_version = fixed.get_i16();
    let correlation_id = fixed.get_i32();
    let info = |api| RequestHeaderInfo {
        api_key,
        api_version,
        correlation_id,
        api,
    };
    let Ok(key) = ApiKey::try_from(api_key) else {
        return Ok(info(RequestApi::UnknownKey));
    };
    let valid_versions = key.valid_versions();
    if api_version < valid_versions.min || api_version > valid_versions.max {
        return Ok(info(RequestApi::UnsupportedVersion {
            key,
            valid_versions,
        }));
    }
    let header_version = key.request_header_version(api_version);
    // Decode from a cheap clone so a failure leaves the caller's frame as it was.
    let mut cursor = frame.clone();
    let header = RequestHeader::decode(&mut cursor, header_version).map_err(|error| {
        FrameError::MalformedHeader {
            api_key,
            api_version,
            correlation_id,
            reason: format!("{error:#}"),
        }
    })?;
    *frame = cursor;
    Ok(info(RequestApi::Supported { key, header }))
}

pub(crate) fn encode_header(
    buf: &mut impl ByteBufMut,
    correlation_id: i32,
    response_header_version: i16,
) -> Result<(), EncodeError> {
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(buf, response_header_version)
        .map_err(|error| EncodeError::Header {
            version: response_header_version,
            reason: format!("{error:#}"),
        })
}

/// kafka-protocol reports errors as `anyhow::Error`; taking any `Display` avoids depending on
/// `anyhow` for a type name. `{:#}` prints the whole context chain.
fn body_error<E: std::fmt::Display>(version: i16) -> impl Fn(E) -> EncodeError {
    move |error| EncodeError::Body {
        version,
        reason: format!("{error:#}"),
    }
}

pub(crate) fn frame_size(len: usize) -> Result<i32, EncodeError> {
    i32::try_from(len).map_err(|_| EncodeError::FrameTooLarge { size: len })
}

/// Encodes a complete response frame: size prefix, response header, body.
///
/// The simple path: everything, record bytes included, is copied into one buffer. Use
/// [`FetchResponseChunks`](crate::fetch::FetchResponseChunks) for Fetch responses, whose
/// record batches must not be copied.
pub fn encode_response<M: Encodable>(
    correlation_id: i32,
    response_header_version: i16,
    body: &M,
    version: i16,
) -> Result<Bytes, EncodeError> {
    // Sizes are only a capacity hint; the prefix is patched with what was actually written.
    let hint = body.compute_size(version).unwrap_or(0);
    let mut buf = BytesMut::with_capacity(SIZE_PREFIX_LEN + 8 + hint);
    buf.put_i32(0);
    encode_header(&mut buf, correlation_id, response_header_version)?;
    body.encode(&mut buf, version)
        .map_err(body_error(version))?;
    let size = frame_size(buf.len() - SIZE_PREFIX_LEN)?;
    buf[..SIZE_PREFIX_LEN].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// A response frame as a list of byte chunks to be written with vectored IO, in order.
///
/// Record batches are not contiguous with the encoded fields around them: a Fetch response has
/// per-partition fields after each partition's records, so the frame is an interleaving of
/// encoded pieces and shared record chunks rather than one prefix plus trailing chunks. The first
/// part always starts with the size prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseFrame {
    parts: Vec<Bytes>,
    len: usize,
}

impl ResponseFrame {
    pub(crate) fn from_parts(parts: Vec<Bytes>) -> Self {
        let len = parts.iter().map(Bytes::len).sum();
        Self { parts, len }
    }

    /// The chunks, in wire order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The chunks, in wire order, for a writer that consumes them.
    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }

    /// Total bytes on the wire, size prefix included.
    pub fn wire_len(&self) -> usize {
        self.len
    }

    /// The chunks as `IoSlice`s for `write_vectored`.
    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        self.parts.iter().map(|part| IoSlice::new(part)).collect()
    }

    /// The frame in one buffer. Copies; for tests and small responses.
    pub fn to_contiguous(&self) -> Bytes {
        if let [only] = self.parts.as_slice() {
            return only.clone();
        }
        let mut out = BytesMut::with_capacity(self.len);
        for part in &self.parts {
            out.extend_from_slice(part);
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_request;
    use crate::testutil::Rng;
    use kafka_protocol::messages::ApiVersionsResponse;

    fn frame_of(body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    fn request_bytes(key: i16, version: i16, correlation_id: i32, rest: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        out.put_i16(key);
        out.put_i16(version);
        out.put_i32(correlation_id);
        out.extend_from_slice(rest);
        out.freeze()
    }

    #[test]
    fn frame_is_returned_only_once_complete() {
        let wire = frame_of(b"hello world");
        let mut buf = BytesMut::new();
        for (index, byte) in wire.iter().enumerate() {
            assert_eq!(
                try_split_frame(&mut buf, 1024),
                Ok(None),
                "after {index} bytes"
            );
            buf.put_u8(*byte);
        }
        let frame = try_split_frame(&mut buf, 1024).unwrap().unwrap();
        assert_eq!(&frame[..], b"hello world");
        assert!(buf.is_empty());
    }

    #[test]
    fn back_to_back_frames_split_one_at_a_time() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&frame_of(b"one"));
        buf.extend_from_slice(&frame_of(b""));
        buf.extend_from_slice(&frame_of(b"three"));
        buf.extend_from_slice(&frame_of(b"four")[..5]);
        assert_eq!(&try_split_frame(&mut buf, 64).unwrap().unwrap()[..], b"one");
        assert_eq!(&try_split_frame(&mut buf, 64).unwrap().unwrap()[..], b"");
        assert_eq!(
            &try_split_frame(&mut buf, 64).unwrap().unwrap()[..],
            b"three"
        );
        assert_eq!(try_split_frame(&mut buf, 64), Ok(None));
        assert_eq!(buf.len(), 5);
    }

    #[test]
    fn oversized_frame_is_rejected_before_its_body_is_buffered() {
        let mut buf = BytesMut::with_capacity(16);
        buf.put_i32(1 << 30);
        let capacity_before = buf.capacity();
        assert_eq!(
            try_split_frame(&mut buf, 1 << 20),
            Err(FrameError::TooLarge {
                size: 1 << 30,
                max: 1 << 20
            })
        );
        // No room was reserved for the announced gigabyte.
        assert_eq!(buf.capacity(), capacity_before);
    }

    #[test]
    fn frame_at_the_limit_is_accepted() {
        let mut buf = BytesMut::from(&frame_of(&[7; 100])[..]);
        assert_eq!(try_split_frame(&mut buf, 100).unwrap().unwrap().len(), 100);
    }

    #[test]
    fn negative_frame_size_is_rejected() {
        let mut buf = BytesMut::from(&(-5i32).to_be_bytes()[..]);
        assert_eq!(
            try_split_frame(&mut buf, 1024),
            Err(FrameError::NegativeSize(-5))
        );
    }

    #[test]
    fn truncated_header_never_panics_and_says_so() {
        let full = request_bytes(18, 3, 9, &[]);
        for len in 0..REQUEST_HEADER_FIXED_LEN {
            let mut frame = full.slice(..len);
            assert_eq!(
                parse_request_header(&mut frame),
                Err(FrameError::TruncatedHeader { len })
            );
        }
    }

    #[test]
    fn unknown_api_key_still_yields_correlation_id() {
        let mut frame = request_bytes(12_345, 0, 4242, b"whatever");
        let info = parse_request_header(&mut frame).unwrap();
        assert_eq!(info.correlation_id, 4242);
        assert_eq!(info.api_key, 12_345);
        assert_eq!(info.api, RequestApi::UnknownKey);
        assert_eq!(info.supported_key(), None);
        assert_eq!(frame.len(), 16, "frame left untouched");
    }

    #[test]
    fn unsupported_version_yields_correlation_id_and_valid_range() {
        let mut frame = request_bytes(ApiKey::Produce as i16, 2, 99, &[]);
        let info = parse_request_header(&mut frame).unwrap();
        assert_eq!(info.correlation_id, 99);
        match info.api {
            RequestApi::UnsupportedVersion {
                key: ApiKey::Produce,
                valid_versions,
            } => assert!(valid_versions.min > 2),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unsupported_api_versions_request_is_answered_with_header_v0() {
        // A future client's ApiVersions v99 request, which Kafka answers with ApiVersions v0.
        let mut frame = request_bytes(ApiKey::ApiVersions as i16, 99, 1, &[0xde, 0xad]);
        let info = parse_request_header(&mut frame).unwrap();
        assert!(matches!(info.api, RequestApi::UnsupportedVersion { .. }));
        assert_eq!(info.response_header_version(), 0);
    }

    #[test]
    fn supported_header_is_decoded_and_frame_advanced_to_body() {
        // Metadata v1 uses header v1: nullable client id, no tagged fields.
        let mut frame = request_bytes(
            ApiKey::Metadata as i16,
            1,
            7,
            &[0, 3, b'c', b'l', b'i', 0xab],
        );
        let info = parse_request_header(&mut frame).unwrap();
        assert_eq!(info.supported_key(), Some(ApiKey::Metadata));
        assert_eq!(info.client_id(), Some("cli"));
        assert_eq!(info.correlation_id, 7);
        assert_eq!(&frame[..], &[0xab]);
        assert_eq!(info.response_header_version(), 0);
    }

    #[test]
    fn flexible_header_tagged_fields_are_consumed() {
        // ApiVersions v3 uses header v2: client id, then tagged fields (one, tag 5, 2 bytes).
        let mut frame = request_bytes(
            ApiKey::ApiVersions as i16,
            3,
            8,
            &[0xff, 0xff, 1, 5, 2, 0xaa, 0xbb, 0xcd],
        );
        let info = parse_request_header(&mut frame).unwrap();
        assert_eq!(info.client_id(), None);
        match &info.api {
            RequestApi::Supported { header, .. } => {
                assert_eq!(header.unknown_tagged_fields.len(), 1)
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(&frame[..], &[0xcd]);
    }

    #[test]
    fn malformed_header_keeps_correlation_id_and_frame() {
        // Client id claims 300 bytes, 2 follow.
        let mut frame = request_bytes(ApiKey::Metadata as i16, 1, 31, &[1, 44, b'a', b'b']);
        let before = frame.clone();
        match parse_request_header(&mut frame) {
            Err(FrameError::MalformedHeader { correlation_id, .. }) => {
                assert_eq!(correlation_id, 31)
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(frame, before);
    }

    fn split_response(frame: &Bytes, header_version: i16) -> (i32, Bytes) {
        let mut frame = frame.clone();
        let size = frame.get_i32();
        assert_eq!(size as usize, frame.len(), "size prefix matches the frame");
        let header = ResponseHeader::decode(&mut frame, header_version).unwrap();
        (header.correlation_id, frame)
    }

    #[test]
    fn encoded_response_round_trips() {
        let body = ApiVersionsResponse::default().with_error_code(35);
        for version in [0, 3] {
            let frame = encode_response(5150, 0, &body, version).unwrap();
            let (correlation_id, mut rest) = split_response(&frame, 0);
            assert_eq!(correlation_id, 5150);
            assert_eq!(
                ApiVersionsResponse::decode(&mut rest, version).unwrap(),
                body
            );
        }
    }

    #[test]
    fn unencodable_response_is_an_error_not_a_panic() {
        let body = ApiVersionsResponse::default();
        assert!(matches!(
            encode_response(1, 0, &body, 99),
            Err(EncodeError::Body { version: 99, .. })
        ));
        assert!(matches!(
            encode_response(1, 7, &body, 0),
            Err(EncodeError::Header { version: 7, .. })
        ));
    }

    /// Random, truncated and mutated frames through the whole inbound path: split, header,
    /// body. Nothing may panic or abort. The seed is in the failure message.
    #[test]
    fn random_frames_never_panic() {
        let seed = 0x000f_ea4e_5eed_0002;
        let mut rng = Rng::new(seed);
        let keys: Vec<i16> = ApiKey::iter().map(|key| key as i16).collect();
        for round in 0..30_000 {
            let mut frame = BytesMut::new();
            let key = match round % 5 {
                0 => rng.next_u64() as i16,
                _ => keys[rng.below(keys.len())],
            };
            let versions = ApiKey::try_from(key).map(|k| k.valid_versions());
            let version = match versions {
                Ok(range) if round % 7 != 0 => {
                    range.min + rng.below((range.max - range.min + 1) as usize) as i16
                }
                _ => rng.next_u64() as i16,
            };
            frame.put_i16(key);
            frame.put_i16(version);
            frame.put_i32(rng.next_u64() as i32);
            if round % 3 == 0 {
                frame.put_i16(rng.below(6) as i16 - 1);
            }
            let tail_len = rng.below(64);
            for _ in 0..tail_len {
                // Bias towards bytes that make big lengths and continuation bits.
                frame.put_u8(match rng.below(4) {
                    0 => 0xff,
                    1 => 0x7f,
                    2 => 0,
                    _ => rng.byte(),
                });
            }
            let cut = rng.below(frame.len() + 1);
            let wire = frame_of(&frame[..cut]);
            let outcome = std::panic::catch_unwind(|| {
                let mut buf = BytesMut::from(&wire[..]);
                if let Ok(Some(mut body)) = try_split_frame(&mut buf, 1 << 20) {
                    if let Ok(info) = parse_request_header(&mut body) {
                        let _ = decode_request(&info, &body);
                    }
                }
            });
            assert!(
                outcome.is_ok(),
                "panic with seed {seed:#x} at round {round}"
            );
        }
    }
}
