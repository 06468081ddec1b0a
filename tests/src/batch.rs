//! Hand-built Kafka record batches (magic 2), byte by byte.
//!
//! The tests write their own encoder rather than use a library's so that they control every
//! byte: they can corrupt a CRC or a length on purpose, and they know exactly which bytes a
//! compressed batch held when they compare it with what the broker hands back.
//!
//! Layout (Kafka's `DefaultRecordBatch`):
//! `baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 |
//! attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
//! producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32 | records...`
//! The CRC-32C covers everything from `attributes` to the end; with compression, everything
//! after `recordCount` is the compressed record data.

use std::io::Write;

/// Byte offsets of the header fields.
pub const BASE_OFFSET_AT: usize = 0;
pub const BATCH_LENGTH_AT: usize = 8;
pub const MAGIC_AT: usize = 16;
pub const CRC_AT: usize = 17;
pub const ATTRIBUTES_AT: usize = 21;
pub const LAST_OFFSET_DELTA_AT: usize = 23;
pub const RECORD_COUNT_AT: usize = 57;
/// Bytes before the records.
pub const HEADER_LEN: usize = 61;
/// `baseOffset` and `batchLength` are not counted in `batchLength`.
const LENGTH_FIELDS_LEN: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    /// Kafka's lz4 is the LZ4 frame format.
    Lz4,
}

impl Codec {
    fn attribute_bits(self) -> i16 {
        match self {
            Codec::None => 0,
            Codec::Lz4 => 3,
        }
    }
}

/// One record of a hand-built batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Added to the batch's base timestamp.
    pub timestamp_delta: i64,
}

impl BatchRecord {
    pub fn new(key: &[u8], value: &[u8]) -> Self {
        Self {
            key: Some(key.to_vec()),
            value: Some(value.to_vec()),
            headers: Vec::new(),
            timestamp_delta: 0,
        }
    }
}

/// Encodes a complete, valid batch with base offset 0 and no producer id (not idempotent).
pub fn encode_batch(records: &[BatchRecord], base_timestamp: i64, codec: Codec) -> Vec<u8> {
    let deltas: Vec<i32> = (0..records.len() as i32).collect();
    encode_batch_with_offset_deltas(records, base_timestamp, codec, &deltas)
}

/// [`encode_batch`] with each record's offset delta as given (a well-framed batch with a valid
/// CRC whose records may be out of sequence: only the broker's record walk can object).
pub fn encode_batch_with_offset_deltas(
    records: &[BatchRecord],
    base_timestamp: i64,
    codec: Codec,
    offset_deltas: &[i32],
) -> Vec<u8> {
    assert!(
        !records.is_empty(),
        "Kafka batches hold at least one record"
    );
    let mut body = Vec::new();
    for (record, offset_delta) in records.iter().zip(offset_deltas) {
        encode_record(&mut body, record, *offset_delta);
    }
    let body = match codec {
        Codec::None => body,
        Codec::Lz4 => lz4_frame(&body),
    };
    let max_timestamp = records
        .iter()
        .map(|r| base_timestamp + r.timestamp_delta)
        .max()
        .unwrap_or(base_timestamp);

    let mut batch = Vec::with_capacity(HEADER_LEN + body.len());
    batch.extend_from_slice(&0i64.to_be_bytes()); // baseOffset: the broker assigns it
    batch.extend_from_slice(&0i32.to_be_bytes()); // batchLength, patched below
    batch.extend_from_slice(&(-1i32).to_be_bytes()); // partitionLeaderEpoch: unknown to a client
    batch.push(2); // magic
    batch.extend_from_slice(&0u32.to_be_bytes()); // crc, patched below
    batch.extend_from_slice(&codec.attribute_bits().to_be_bytes());
    batch.extend_from_slice(&(records.len() as i32 - 1).to_be_bytes()); // lastOffsetDelta
    batch.extend_from_slice(&base_timestamp.to_be_bytes());
    batch.extend_from_slice(&max_timestamp.to_be_bytes());
    batch.extend_from_slice(&(-1i64).to_be_bytes()); // producerId
    batch.extend_from_slice(&(-1i16).to_be_bytes()); // producerEpoch
    batch.extend_from_slice(&(-1i32).to_be_bytes()); // baseSequence
    batch.extend_from_slice(&(records.len() as i32).to_be_bytes());
    debug_assert_eq!(batch.len(), HEADER_LEN);
    batch.extend_from_slice(&body);

    let length = (batch.len() - LENGTH_FIELDS_LEN) as i32;
    batch[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    batch
}

fn encode_record(out: &mut Vec<u8>, record: &BatchRecord, offset_delta: i32) {
    let mut body = Vec::new();
    body.push(0); // attributes (unused)
    put_varlong(&mut body, record.timestamp_delta);
    put_varint(&mut body, offset_delta);
    put_nullable_bytes(&mut body, record.key.as_deref());
    put_nullable_bytes(&mut body, record.value.as_deref());
    put_varint(&mut body, record.headers.len() as i32);
    for (key, value) in &record.headers {
        put_nullable_bytes(&mut body, Some(key));
        put_nullable_bytes(&mut body, value.as_deref());
    }
    put_varint(out, body.len() as i32);
    out.extend_from_slice(&body);
}

fn put_nullable_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(bytes) => {
            put_varint(out, bytes.len() as i32);
            out.extend_from_slice(bytes);
        }
    }
}

/// Zig-zag varint, as Kafka's records use.
fn put_varint(out: &mut Vec<u8>, value: i32) {
    put_varlong(out, i64::from(value));
}

fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

fn lz4_frame(data: &[u8]) -> Vec<u8> {
    let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
    encoder.write_all(data).expect("lz4 into a Vec cannot fail");
    encoder.finish().expect("finish the lz4 frame")
}

/// A poison batch: a valid header naming compression codec `codec_id` (1-4: gzip, snappy, lz4,
/// zstd) and `record_count` records, then `body` (random bytes, say) and a correct CRC. Before
/// brokers decompressed on produce such a batch was acknowledged and then stalled consumers.
pub fn with_compressed_body(codec_id: i16, body: &[u8], record_count: i32) -> Vec<u8> {
    let records = vec![BatchRecord::new(b"k", b"v"); record_count as usize];
    let mut batch = encode_batch(&records, 0, Codec::None);
    batch.truncate(HEADER_LEN);
    batch.extend_from_slice(body);
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&codec_id.to_be_bytes());
    let length = (batch.len() - LENGTH_FIELDS_LEN) as i32;
    batch[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    batch
}

/// The same batch with one CRC bit flipped.
pub fn with_wrong_crc(batch: &[u8]) -> Vec<u8> {
    let mut corrupt = batch.to_vec();
    corrupt[CRC_AT] ^= 0x01;
    corrupt
}

/// The same batch with `batchLength` changed by `delta` (bytes unchanged).
pub fn with_length_off_by(batch: &[u8], delta: i32) -> Vec<u8> {
    let mut corrupt = batch.to_vec();
    let length = read_i32(batch, BATCH_LENGTH_AT) + delta;
    corrupt[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&length.to_be_bytes());
    corrupt
}

pub fn read_i32(bytes: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub fn read_i64(bytes: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Splits a Fetch response's records into whole batches. A partial batch at the end (Kafka
/// may cut the last one at the size limit) is left out.
pub fn split_batches(mut records: &[u8]) -> Vec<&[u8]> {
    let mut batches = Vec::new();
    while records.len() >= LENGTH_FIELDS_LEN {
        let total = LENGTH_FIELDS_LEN + read_i32(records, BATCH_LENGTH_AT).max(0) as usize;
        if records.len() < total {
            break;
        }
        let (batch, rest) = records.split_at(total);
        batches.push(batch);
        records = rest;
    }
    batches
}

/// `baseOffset` of a batch.
pub fn base_offset(batch: &[u8]) -> i64 {
    read_i64(batch, BASE_OFFSET_AT)
}

/// How many records a batch holds, from `lastOffsetDelta`.
pub fn record_span(batch: &[u8]) -> i64 {
    i64::from(read_i32(batch, LAST_OFFSET_DELTA_AT)) + 1
}

/// Whether the stored CRC matches the bytes it covers.
pub fn crc_is_valid(batch: &[u8]) -> bool {
    let stored = u32::from_be_bytes(batch[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
    stored == crc32c::crc32c(&batch[ATTRIBUTES_AT..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_kafkas_zigzag_encoding() {
        let encode = |v: i64| {
            let mut out = Vec::new();
            put_varlong(&mut out, v);
            out
        };
        assert_eq!(encode(0), [0]);
        assert_eq!(encode(-1), [1]);
        assert_eq!(encode(1), [2]);
        assert_eq!(encode(63), [126]);
        assert_eq!(encode(64), [0x80, 0x01]);
        assert_eq!(encode(-65), [0x81, 0x01]);
    }

    #[test]
    fn encoded_batch_has_consistent_length_crc_and_count() {
        let records = vec![BatchRecord::new(b"k", b"v"), BatchRecord::new(b"k2", b"v2")];
        for codec in [Codec::None, Codec::Lz4] {
            let batch = encode_batch(&records, 1_700_000_000_000, codec);
            assert_eq!(split_batches(&batch), vec![batch.as_slice()]);
            assert!(crc_is_valid(&batch));
            assert!(!crc_is_valid(&with_wrong_crc(&batch)));
            assert_eq!(record_span(&batch), 2);
            assert_eq!(read_i32(&batch, RECORD_COUNT_AT), 2);
            assert_eq!(batch[MAGIC_AT], 2);
        }
    }
}
