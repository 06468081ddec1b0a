//! Write-ahead objects: `wal/<stream:08x>/<seq:020>`, create-only, sequence numbers going up
//! by one per stream. An object is either a group commit of the log (starting with
//! [`DATA_MAGIC`]; its binary codec is the log's) or a seal or hole marker another broker
//! wrote to fence the stream (starting with [`SEAL_MAGIC`], then a [`SealInfo`]).

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use strata_core::BrokerId;

use crate::schema::{self, Schema};
use crate::LayoutResult;

pub const PREFIX: &str = "wal/";

/// The first bytes of a group-commit object.
pub const DATA_MAGIC: &[u8; 8] = b"STRWAL01";

/// The first bytes of every seal and hole object.
pub const SEAL_MAGIC: &[u8; 8] = b"STRSEAL1";

/// Where object `seq` of `stream` lives.
pub fn key(stream: u32, seq: u64) -> String {
    format!("{PREFIX}{stream:08x}/{seq:020}")
}

/// The prefix of one stream's objects.
pub fn stream_prefix(stream: u32) -> String {
    format!("{PREFIX}{stream:08x}/")
}

/// Parses `wal/<stream>/<seq>` back; None for anything else.
pub fn parse_key(key: &str) -> Option<(u32, u64)> {
    let (stream, seq) = key.strip_prefix(PREFIX)?.split_once('/')?;
    Some((u32::from_str_radix(stream, 16).ok()?, seq.parse().ok()?))
}

/// The sequence number of a listed key of `stream`'s objects; None for another stream's.
pub fn parse_seq(stream: u32, key: &str) -> Option<u64> {
    parse_key(key).and_then(|(s, seq)| (s == stream).then_some(seq))
}

/// What a seal object says after the magic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealInfo {
    /// `Seal` at the end of the stream, `Hole` for a filled gap below it.
    pub kind: SealKind,
    pub stream: u32,
    pub sealed_by: BrokerId,
    /// Wall time of the sealer, for operators only.
    pub sealed_ms: i64,
}

impl Schema for SealInfo {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "seal";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SealKind {
    Seal,
    Hole,
}

/// Whether a write-ahead object is a seal or hole marker rather than data.
pub fn is_seal(bytes: &[u8]) -> bool {
    bytes.starts_with(SEAL_MAGIC)
}

/// Decodes a seal object; None for anything else (data, or a seal this build cannot read,
/// which [`is_seal`] still recognises as a seal).
pub fn parse_seal(bytes: &[u8]) -> Option<SealInfo> {
    schema::decode("seal", bytes.strip_prefix(SEAL_MAGIC)?).ok()
}

pub fn encode_seal(info: &SealInfo) -> LayoutResult<Bytes> {
    let body = schema::encode(info)?;
    let mut bytes = BytesMut::with_capacity(SEAL_MAGIC.len() + body.len());
    bytes.put_slice(SEAL_MAGIC);
    bytes.put_slice(&body);
    Ok(bytes.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        assert_eq!(key(0x2a, 5), "wal/0000002a/00000000000000000005");
        assert_eq!(
            parse_key("wal/0000002a/00000000000000000005"),
            Some((0x2a, 5))
        );
        assert_eq!(parse_seq(0x2a, &key(0x2a, 5)), Some(5));
        assert_eq!(parse_seq(0x2b, &key(0x2a, 5)), None);
        assert_eq!(parse_key("wal/zz/1"), None);
        assert_eq!(parse_key("meta/streams/0000002a"), None);
        assert!(key(7, 1).starts_with(&stream_prefix(7)));
    }

    #[test]
    fn a_seal_of_the_old_format_still_reads() {
        // Written by Strata before schemas were versioned.
        let old = br#"STRSEAL1{"kind":"hole","stream":7,"sealed_by":9,"sealed_ms":1000}"#;
        assert!(is_seal(old));
        assert_eq!(
            parse_seal(old),
            Some(SealInfo {
                kind: SealKind::Hole,
                stream: 7,
                sealed_by: BrokerId(9),
                sealed_ms: 1000,
            })
        );
        let info = SealInfo {
            kind: SealKind::Seal,
            stream: 1,
            sealed_by: BrokerId(2),
            sealed_ms: 3,
        };
        assert_eq!(parse_seal(&encode_seal(&info).unwrap()), Some(info));
        assert_eq!(parse_seal(b"STRWAL01data"), None);
        assert!(!is_seal(b"STRWAL01data"));
    }
}
