//! Checking the records inside compressed batches, the way Kafka's `LogValidator` does, without
//! keeping what they decompress to.
//!
//! A batch whose compression bits are set but whose body does not decompress to exactly
//! `recordsCount` well-framed records would be stored and served as is, and consumers would stop
//! at it for good (librdkafka retries the same fetch forever). Kafka decompresses every compressed
//! batch on produce and answers `CORRUPT_MESSAGE`; so does this.
//!
//! The decompressed bytes are streamed through the same record walk the uncompressed path makes
//! and dropped: only a decompressor's own window and a small read-ahead live at a time (raw snappy
//! is the exception, see [`Compression::Snappy`] below). The stored bytes are never touched:
//! compression passes through to consumers as the producer wrote it.
//!
//! The work is bounded by `max_decompressed_bytes`: the walk stops with
//! [`BatchError::DecompressedTooLarge`] as soon as a batch has inflated past it, or as soon as a
//! record *declares* a length that would take it past it, so a compression bomb costs at most
//! that many bytes of decompression.

use std::io::{self, BufRead, BufReader, Read};

use crate::batch::{
    decode_varint, decode_varlong, validate_records, BatchError, BatchHeader, BatchView,
    Compression, RecordsCheck, NO_TIMESTAMP,
};

/// Read-ahead between a streaming decompressor and the record walk. Small: the walk reads a few
/// bytes at a time and skips keys and values without looking at them.
const READ_AHEAD: usize = 16 << 10;

/// Kafka's Java producer frames snappy with xerial's `SnappyOutputStream`: this magic, a version
/// and a compatible version (4 bytes each), then blocks of a 4-byte length and raw snappy.
/// librdkafka sends raw snappy without the framing. Kafka reads both; so do we.
pub(crate) const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;

/// Largest zstd window accepted, as a power of two. A zstd frame names its window size and the
/// decoder allocates it up front, so a hostile frame could otherwise ask for 128 MiB (the
/// library's default limit, 2^27). Producers at level 19 and below never use more than 2^23;
/// only the "ultra" levels 20-22 go above 2^24 (16 MiB), and only for large inputs.
const ZSTD_MAX_WINDOW_LOG: u32 = 24;

/// Checks the records of a batch, decompressing it if it is compressed.
///
/// For an uncompressed batch this is [`validate_records`]. For a compressed one the records are
/// decompressed as a stream and walked with the same checks: every record's length matches its
/// fields, the records end exactly where the decompressed data ends, their number equals
/// `recordsCount`, and offset deltas run 0, 1, 2, …. Data that does not decompress is
/// [`BatchError::InvalidRecords`] (Kafka's `CORRUPT_MESSAGE`); data that would inflate beyond
/// `max_decompressed_bytes` is [`BatchError::DecompressedTooLarge`].
///
/// CPU-heavy for large batches (it decompresses them): callers on an async runtime should run it
/// on a blocking thread.
pub fn validate_compressed_records(
    batch: &BatchView,
    max_decompressed_bytes: u64,
) -> Result<RecordsCheck, BatchError> {
    let records = batch.records();
    let data: &[u8] = &records;
    let header = batch.header();
    let limit = max_decompressed_bytes;
    match batch.compression() {
        Compression::None => validate_records(batch),
        Compression::Gzip => {
            // Multi-member, like Java's GZIPInputStream: concatenated gzip members are one stream.
            let decoder = flate2::bufread::MultiGzDecoder::new(data);
            walk(
                Walker::new(BufReader::with_capacity(READ_AHEAD, decoder), "gzip", limit),
                header,
            )
        }
        Compression::Snappy if data.starts_with(&XERIAL_MAGIC) => walk(
            Walker::new(
                BufReader::with_capacity(READ_AHEAD, Xerial::new(data, limit)?),
                "snappy",
                limit,
            ),
            header,
        ),
        Compression::Snappy => {
            // Raw snappy is one block whose copies may reach back to its very start, so it cannot
            // be streamed: it is decompressed whole, after its declared length (the format's
            // preamble) is checked against the limit, and dropped after the walk.
            let len = snap::raw::decompress_len(data).map_err(|e| codec_error("snappy", &e))?;
            check_snappy_len(len, data.len(), limit).map_err(|e| match e {
                SnappyLen::Impossible(why) => codec_error("snappy", &why),
                SnappyLen::TooLarge => BatchError::DecompressedTooLarge { limit },
            })?;
            let plain = snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| codec_error("snappy", &e))?;
            walk(Walker::new(plain.as_slice(), "snappy", limit), header)
        }
        Compression::Lz4 => {
            // The LZ4 frame format (Kafka's KafkaLZ4BlockOutputStream, librdkafka's LZ4F); the
            // decoder buffers one block (at most 4 MiB) plus a 64 KiB window.
            check_lz4_frames(data)?;
            let decoder = lz4_flex::frame::FrameDecoder::new(data);
            walk(Walker::new(decoder, "lz4", limit), header)
        }
        Compression::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(data)
                .map_err(|e| codec_error("zstd", &e))?;
            decoder
                .window_log_max(ZSTD_MAX_WINDOW_LOG)
                .map_err(|e| codec_error("zstd", &e))?;
            walk(
                Walker::new(BufReader::with_capacity(READ_AHEAD, decoder), "zstd", limit),
                header,
            )
        }
    }
}

/// The records of a compressed batch, decompressed whole, for the log cleaner (which must
/// rewrite them). Bounded like the produce check: past `max_decompressed_bytes` the batch is
/// refused with [`BatchError::DecompressedTooLarge`] instead of being inflated further.
pub(crate) fn decompress(
    batch: &BatchView,
    max_decompressed_bytes: u64,
) -> Result<Vec<u8>, BatchError> {
    let records = batch.records();
    let data: &[u8] = &records;
    let limit = max_decompressed_bytes;
    let read_all = |mut reader: Box<dyn Read + '_>, codec: &str| {
        let mut out = Vec::new();
        let taken = reader
            .by_ref()
            .take(limit.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| io_error(codec, e))?;
        if taken as u64 > limit {
            return Err(BatchError::DecompressedTooLarge { limit });
        }
        Ok(out)
    };
    match batch.compression() {
        Compression::None => Ok(data.to_vec()),
        Compression::Gzip => read_all(Box::new(flate2::bufread::MultiGzDecoder::new(data)), "gzip"),
        Compression::Snappy if data.starts_with(&XERIAL_MAGIC) => {
            read_all(Box::new(Xerial::new(data, limit)?), "snappy")
        }
        Compression::Snappy => {
            let len = snap::raw::decompress_len(data).map_err(|e| codec_error("snappy", &e))?;
            check_snappy_len(len, data.len(), limit).map_err(|e| match e {
                SnappyLen::Impossible(why) => codec_error("snappy", &why),
                SnappyLen::TooLarge => BatchError::DecompressedTooLarge { limit },
            })?;
            snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| codec_error("snappy", &e))
        }
        Compression::Lz4 => {
            check_lz4_frames(data)?;
            read_all(Box::new(lz4_flex::frame::FrameDecoder::new(data)), "lz4")
        }
        Compression::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(data)
                .map_err(|e| codec_error("zstd", &e))?;
            decoder
                .window_log_max(ZSTD_MAX_WINDOW_LOG)
                .map_err(|e| codec_error("zstd", &e))?;
            read_all(Box::new(decoder), "zstd")
        }
    }
}

fn io_error(codec: &str, error: io::Error) -> BatchError {
    // The xerial reader reports the limit through the io::Error.
    if let Some(batch_error) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<BatchError>())
    {
        return batch_error.clone();
    }
    codec_error(codec, &error)
}

fn codec_error(codec: &str, error: &dyn std::fmt::Display) -> BatchError {
    BatchError::InvalidRecords(format!("{codec} data does not decompress: {error}"))
}

/// Decompressed bytes, counted against the limit as the walk takes them.
struct Walker<R> {
    input: R,
    codec: &'static str,
    /// Decompressed bytes taken so far.
    taken: u64,
    limit: u64,
    /// Set when the data itself failed (it does not decompress, or ends inside a record):
    /// the batch is corrupt, not one of its records.
    data_failed: bool,
}

impl<R: BufRead> Walker<R> {
    fn new(input: R, codec: &'static str, limit: u64) -> Self {
        Self {
            input,
            codec,
            taken: 0,
            limit,
            data_failed: false,
        }
    }

    fn fill(&mut self) -> Result<&[u8], BatchError> {
        let codec = self.codec;
        let failed = &mut self.data_failed;
        self.input.fill_buf().map_err(|e| {
            *failed = true;
            io_error(codec, e)
        })
    }

    /// The next byte, or `None` at the end of the decompressed data.
    fn next_byte(&mut self) -> Result<Option<u8>, BatchError> {
        let Some(&byte) = self.fill()?.first() else {
            return Ok(None);
        };
        self.input.consume(1);
        self.take(1)?;
        Ok(Some(byte))
    }

    fn take(&mut self, count: u64) -> Result<(), BatchError> {
        self.taken = self.taken.saturating_add(count);
        if self.taken > self.limit {
            return Err(BatchError::DecompressedTooLarge { limit: self.limit });
        }
        Ok(())
    }

    /// The next byte of a record that ends at `end` (in decompressed bytes).
    fn byte_within(&mut self, end: u64) -> Result<u8, BatchError> {
        if self.taken >= end {
            return Err(BatchError::InvalidRecords(
                "a field runs past the record".into(),
            ));
        }
        match self.next_byte()? {
            Some(byte) => Ok(byte),
            None => {
                self.data_failed = true;
                Err(BatchError::InvalidRecords(
                    "decompressed data ends inside a record".into(),
                ))
            }
        }
    }

    /// Skips `count` bytes of a record that ends at `end`, without keeping them.
    fn skip_within(&mut self, count: u64, end: u64, what: &str) -> Result<(), BatchError> {
        if self.taken.saturating_add(count) > end {
            return Err(BatchError::InvalidRecords(format!(
                "{what} of {count} bytes runs past the record"
            )));
        }
        let mut left = count;
        while left > 0 {
            let available = self.fill()?.len();
            if available == 0 {
                self.data_failed = true;
                return Err(BatchError::InvalidRecords(
                    "decompressed data ends inside a record".into(),
                ));
            }
            let step = left.min(u64::try_from(available).unwrap_or(u64::MAX));
            // `step` is at most `available`, a usize.
            self.input
                .consume(usize::try_from(step).unwrap_or(available));
            self.take(step)?;
            left -= step;
        }
        Ok(())
    }

    /// Skips a length-prefixed field; `-1` (null) is allowed only where `nullable`.
    fn skip_sized(&mut self, end: u64, nullable: bool, what: &str) -> Result<(), BatchError> {
        let len = decode_varint(|| self.byte_within(end))?;
        if len == -1 && nullable {
            return Ok(());
        }
        let len = u64::try_from(len)
            .map_err(|_| BatchError::InvalidRecords(format!("invalid {what} length {len}")))?;
        self.skip_within(len, end, what)
    }
}

/// The streaming twin of `validate_records`' walk (same checks, same messages where they apply).
fn walk<R: BufRead>(
    mut walker: Walker<R>,
    header: &BatchHeader,
) -> Result<RecordsCheck, BatchError> {
    let declared = header.record_count;
    let mut max_timestamp = NO_TIMESTAMP;
    for seen in 0..declared.max(0) {
        let Some(first) = walker.next_byte()? else {
            return Err(BatchError::InvalidRecords(format!(
                "batch declares {declared} records but holds {seen}"
            )));
        };
        let mut first = Some(first);
        let len = decode_varint(|| match first.take() {
            Some(byte) => Ok(byte),
            None => walker
                .next_byte()?
                .ok_or_else(|| BatchError::InvalidRecords("varint runs past the records".into())),
        })?;
        let len = u64::try_from(len)
            .map_err(|_| BatchError::InvalidRecords(format!("invalid record length {len}")))?;
        let end = walker.taken.saturating_add(len);
        if end > walker.limit {
            // Refused on the declaration, before inflating a byte of it.
            return Err(BatchError::DecompressedTooLarge {
                limit: walker.limit,
            });
        }
        // A record whose fields do not fit its declared bytes is named (KIP-467's
        // record_errors), as the uncompressed walk does; framing between records (lengths,
        // the count) and data that does not decompress are the batch's.
        let timestamp_delta = record_body(&mut walker, len, end, seen).map_err(|e| match e {
            BatchError::InvalidRecords(reason) if !walker.data_failed => {
                BatchError::InvalidRecord {
                    index: seen,
                    reason,
                }
            }
            other => other,
        })?;
        max_timestamp = max_timestamp.max(header.base_timestamp.saturating_add(timestamp_delta));
    }
    if walker.next_byte()?.is_some() {
        return Err(BatchError::InvalidRecords(format!(
            "bytes remain after the {declared} declared records"
        )));
    }
    Ok(RecordsCheck::Verified { max_timestamp })
}

/// Checks one record's fields, which must fill exactly its declared `len` bytes ending at
/// `end`; returns its timestamp delta.
fn record_body<R: BufRead>(
    walker: &mut Walker<R>,
    len: u64,
    end: u64,
    seen: i32,
) -> Result<i64, BatchError> {
    if len == 0 {
        return Err(BatchError::InvalidRecords("empty record".into()));
    }
    walker.byte_within(end)?; // record attributes, unused
    let timestamp_delta = decode_varlong(|| walker.byte_within(end))?;
    let offset_delta = decode_varint(|| walker.byte_within(end))?;
    if offset_delta != seen {
        return Err(BatchError::InvalidRecords(format!(
            "record {seen} has offset delta {offset_delta}"
        )));
    }
    walker.skip_sized(end, true, "key")?;
    walker.skip_sized(end, true, "value")?;
    let header_count = decode_varint(|| walker.byte_within(end))?;
    if header_count < 0 {
        return Err(BatchError::InvalidRecords(format!(
            "invalid header count {header_count}"
        )));
    }
    // Each header takes at least two bytes of the record or fails, so this is bounded.
    for _ in 0..header_count {
        walker.skip_sized(end, false, "header key")?;
        walker.skip_sized(end, true, "header value")?;
    }
    if walker.taken != end {
        let start = end - len;
        return Err(BatchError::InvalidRecords(format!(
            "record declares {len} bytes but its fields take {}",
            walker.taken - start
        )));
    }
    Ok(timestamp_delta)
}

/// Why a snappy block's declared length was refused.
enum SnappyLen {
    /// More than the block's bytes could ever expand to: garbage, not a bomb.
    Impossible(String),
    TooLarge,
}

/// Snappy's best case is a 3-byte copy element producing 64 bytes; a declared length beyond
/// that ratio is a damaged preamble (random bytes usually declare gigabytes), which deserves
/// CORRUPT_MESSAGE rather than a size complaint.
fn check_snappy_len(declared: usize, compressed: usize, limit: u64) -> Result<(), SnappyLen> {
    let declared = u64::try_from(declared).unwrap_or(u64::MAX);
    let possible = u64::try_from(compressed)
        .unwrap_or(u64::MAX)
        .saturating_mul(64 / 3 + 1);
    if declared > possible {
        return Err(SnappyLen::Impossible(format!(
            "{compressed} bytes cannot hold {declared} bytes of data"
        )));
    }
    if declared > limit {
        return Err(SnappyLen::TooLarge);
    }
    Ok(())
}

const LZ4_MAGIC: u32 = 0x184D_2204;
/// Skippable frames carry no data; any magic 0x184D2A50-0x184D2A5F.
const LZ4_SKIPPABLE_MAGIC: u32 = 0x184D_2A50;

/// Checks that the data is a sequence of complete LZ4 frames, without decompressing.
///
/// lz4_flex's decoder takes the end of its input as the end of a frame, so a frame cut short of
/// its end mark (and content checksum) would pass, while consumers (librdkafka's LZ4F, Kafka's
/// KafkaLZ4BlockInputStream) fail on it. The decoder still checks the contents and checksums.
fn check_lz4_frames(mut data: &[u8]) -> Result<(), BatchError> {
    fn take<'a>(data: &mut &'a [u8], count: usize) -> Result<&'a [u8], BatchError> {
        if data.len() < count {
            return Err(codec_error("lz4", &"frame is truncated"));
        }
        let (taken, rest) = data.split_at(count);
        *data = rest;
        Ok(taken)
    }
    fn u32_le(data: &mut &[u8]) -> Result<u32, BatchError> {
        let bytes = take(data, 4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
    let len = |value: u32| usize::try_from(value).unwrap_or(usize::MAX);
    while !data.is_empty() {
        let magic = u32_le(&mut data)?;
        if magic & 0xFFFF_FFF0 == LZ4_SKIPPABLE_MAGIC {
            let size = u32_le(&mut data)?;
            take(&mut data, len(size))?;
            continue;
        }
        if magic != LZ4_MAGIC {
            return Err(codec_error(
                "lz4",
                &format!("bad frame magic {magic:#010x}"),
            ));
        }
        let flags = take(&mut data, 2)?[0];
        let block_checksums = flags & 0x10 != 0;
        let content_size = flags & 0x08 != 0;
        let content_checksum = flags & 0x04 != 0;
        let dictionary = flags & 0x01 != 0;
        let descriptor_rest = 1 + if content_size { 8 } else { 0 } + if dictionary { 4 } else { 0 };
        take(&mut data, descriptor_rest)?;
        loop {
            let block = u32_le(&mut data)?;
            if block == 0 {
                break; // end mark
            }
            take(&mut data, len(block & 0x7FFF_FFFF))?;
            if block_checksums {
                take(&mut data, 4)?;
            }
        }
        if content_checksum {
            take(&mut data, 4)?;
        }
    }
    Ok(())
}

/// xerial-framed snappy as a stream: one block decompressed at a time.
struct Xerial<'a> {
    /// Compressed blocks not yet decompressed.
    input: &'a [u8],
    block: Vec<u8>,
    /// Bytes of `block` already read.
    at: usize,
    /// Decompressed bytes the remaining blocks may still produce.
    budget: u64,
    limit: u64,
    decoder: snap::raw::Decoder,
}

impl<'a> Xerial<'a> {
    fn new(data: &'a [u8], limit: u64) -> Result<Self, BatchError> {
        let input = data.get(XERIAL_HEADER_LEN..).ok_or_else(|| {
            BatchError::InvalidRecords("snappy data does not decompress: truncated header".into())
        })?;
        Ok(Self {
            input,
            block: Vec::new(),
            at: 0,
            budget: limit,
            limit,
            decoder: snap::raw::Decoder::new(),
        })
    }

    fn next_block(&mut self) -> io::Result<()> {
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let (len, rest) = self
            .input
            .split_first_chunk::<4>()
            .ok_or_else(|| invalid("truncated block length".into()))?;
        let len = usize::try_from(i32::from_be_bytes(*len))
            .map_err(|_| invalid("negative block length".into()))?;
        let compressed = rest
            .get(..len)
            .ok_or_else(|| invalid(format!("block of {len} bytes is truncated")))?;
        let size = snap::raw::decompress_len(compressed).map_err(|e| invalid(e.to_string()))?;
        match check_snappy_len(size, compressed.len(), self.budget) {
            Ok(()) => {}
            Err(SnappyLen::Impossible(why)) => return Err(invalid(why)),
            Err(SnappyLen::TooLarge) => {
                return Err(io::Error::other(BatchError::DecompressedTooLarge {
                    limit: self.limit,
                }))
            }
        }
        let size64 = u64::try_from(size).unwrap_or(u64::MAX);
        self.budget -= size64;
        self.block.resize(size, 0);
        self.decoder
            .decompress(compressed, &mut self.block)
            .map_err(|e| invalid(e.to_string()))?;
        self.at = 0;
        self.input = &rest[len..];
        Ok(())
    }
}

impl Read for Xerial<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.block.len() {
            if self.input.is_empty() {
                return Ok(0);
            }
            self.next_block()?;
        }
        let n = out.len().min(self.block.len() - self.at);
        out[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use bytes::Bytes;

    use super::*;
    use crate::batch::{split_batches, BATCH_HEADER_LEN};
    use crate::testutil::{fix_crc, three_records, BatchBuilder, Rng, TestRecord};

    const LIMIT: u64 = 1 << 20;

    /// Every codec Kafka defines, with snappy in both of its framings.
    #[derive(Debug, Clone, Copy)]
    enum Codec {
        Gzip,
        SnappyRaw,
        SnappyXerial,
        Lz4,
        Zstd,
    }

    const CODECS: [Codec; 5] = [
        Codec::Gzip,
        Codec::SnappyRaw,
        Codec::SnappyXerial,
        Codec::Lz4,
        Codec::Zstd,
    ];

    impl Codec {
        fn id(self) -> i16 {
            match self {
                Codec::Gzip => 1,
                Codec::SnappyRaw | Codec::SnappyXerial => 2,
                Codec::Lz4 => 3,
                Codec::Zstd => 4,
            }
        }

        fn compress(self, plain: &[u8]) -> Vec<u8> {
            match self {
                Codec::Gzip => {
                    let mut encoder =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    encoder.write_all(plain).unwrap();
                    encoder.finish().unwrap()
                }
                Codec::SnappyRaw => snap::raw::Encoder::new().compress_vec(plain).unwrap(),
                Codec::SnappyXerial => {
                    // What xerial's SnappyOutputStream writes: header, then 32 KiB blocks.
                    let mut out = XERIAL_MAGIC.to_vec();
                    out.extend_from_slice(&1i32.to_be_bytes());
                    out.extend_from_slice(&1i32.to_be_bytes());
                    for chunk in plain.chunks(32 << 10) {
                        let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
                        out.extend_from_slice(&(block.len() as i32).to_be_bytes());
                        out.extend_from_slice(&block);
                    }
                    out
                }
                Codec::Lz4 => {
                    let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
                    encoder.write_all(plain).unwrap();
                    encoder.finish().unwrap()
                }
                Codec::Zstd => zstd::stream::encode_all(plain, 3).unwrap(),
            }
        }
    }

    fn records_of(builder: &BatchBuilder) -> Vec<u8> {
        builder.build()[BATCH_HEADER_LEN..].to_vec()
    }

    fn batch(codec: Codec, payload: Vec<u8>, count: i32) -> BatchView {
        let bytes = BatchBuilder::new()
            .base_timestamp(1_000)
            .attributes(codec.id())
            .raw_records(payload, count)
            .build();
        split_batches(&Bytes::from(bytes)).unwrap().remove(0)
    }

    fn check(codec: Codec, plain: &[u8], count: i32) -> Result<RecordsCheck, BatchError> {
        validate_compressed_records(&batch(codec, codec.compress(plain), count), LIMIT)
    }

    fn record_error(result: Result<RecordsCheck, BatchError>) -> (i32, String) {
        match result {
            Err(BatchError::InvalidRecord { index, reason }) => (index, reason),
            other => panic!("expected InvalidRecord, got {other:?}"),
        }
    }

    fn corrupt(result: Result<RecordsCheck, BatchError>) -> String {
        match result {
            Err(BatchError::InvalidRecords(why)) => why,
            other => panic!("expected InvalidRecords, got {other:?}"),
        }
    }

    #[test]
    fn valid_batches_pass_with_the_records_max_timestamp() {
        let plain = records_of(&three_records());
        for codec in CODECS {
            assert_eq!(
                check(codec, &plain, 3).unwrap(),
                RecordsCheck::Verified {
                    max_timestamp: 1_009
                },
                "{codec:?}"
            );
        }
    }

    #[test]
    fn large_valid_batches_stream_through() {
        // Many records and a value larger than any read-ahead or xerial block.
        let mut builder = BatchBuilder::new();
        for i in 0..2_000 {
            builder = builder.record(TestRecord::new(Some("key"), Some(&format!("value {i}"))));
        }
        let big = "x".repeat(200_000);
        builder = builder.record(TestRecord::new(None, Some(&big)));
        let plain = records_of(&builder);
        for codec in CODECS {
            assert!(
                matches!(
                    check(codec, &plain, 2_001),
                    Ok(RecordsCheck::Verified { .. })
                ),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn garbage_after_a_valid_header_is_corrupt() {
        // The poison batch: compression bits set, random bytes, a valid CRC.
        let mut rng = Rng::new(0x9015_0000_0000_0006);
        for codec in CODECS {
            for _ in 0..50 {
                let len = 1 + rng.below(300);
                let mut garbage = rng.bytes(len);
                if matches!(codec, Codec::SnappyXerial) {
                    // Keep the framing so the garbage reaches the block decoder.
                    let mut framed = codec.compress(&[]);
                    framed.extend_from_slice(&(garbage.len() as i32).to_be_bytes());
                    framed.append(&mut garbage);
                    garbage = framed;
                }
                let result = validate_compressed_records(&batch(codec, garbage, 3), LIMIT);
                assert!(
                    matches!(result, Err(BatchError::InvalidRecords(_))),
                    "{codec:?}: {result:?}"
                );
            }
        }
    }

    #[test]
    fn truncated_compressed_data_is_corrupt() {
        let plain = records_of(&three_records());
        for codec in CODECS {
            let full = codec.compress(&plain);
            for cut in [1, 2, full.len() / 2, full.len() - 1] {
                let result =
                    validate_compressed_records(&batch(codec, full[..cut].to_vec(), 3), LIMIT);
                assert!(
                    matches!(result, Err(BatchError::InvalidRecords(_))),
                    "{codec:?} cut at {cut} of {}: {result:?}",
                    full.len()
                );
            }
        }
    }

    #[test]
    fn record_framing_inside_is_checked_like_uncompressed() {
        let plain = records_of(&three_records());
        for codec in CODECS {
            assert!(
                corrupt(check(codec, &plain, 4)).contains("holds 3"),
                "{codec:?}"
            );
            assert!(
                corrupt(check(codec, &plain, 2)).contains("remain"),
                "{codec:?}"
            );
            assert!(
                !corrupt(check(codec, &plain[..plain.len() - 1], 3)).is_empty(),
                "{codec:?}"
            );
            // A record whose fields do not fill its length is named by its index (KIP-467).
            let mut longer = plain.clone();
            longer[0] += 2; // zigzag: the first record claims one more byte
            let (index, why) = record_error(check(codec, &longer, 3));
            assert_eq!(index, 0, "{codec:?}");
            assert!(why.contains("declares"), "{codec:?}: {why}");
            let mut trailing = plain.clone();
            trailing.push(0);
            assert!(!corrupt(check(codec, &trailing, 3)).is_empty(), "{codec:?}");
            let skewed = records_of(
                &BatchBuilder::new()
                    .record(TestRecord::new(None, Some("a")))
                    .record(TestRecord::new(None, Some("b")).offset_delta(5)),
            );
            let (index, why) = record_error(check(codec, &skewed, 2));
            assert_eq!(index, 1, "{codec:?}");
            assert!(why.contains("offset delta 5"), "{codec:?}: {why}");
            // Compressed nothing, one record declared.
            assert!(
                corrupt(check(codec, &[], 1)).contains("holds 0"),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn one_huge_record_is_refused_on_its_declared_length() {
        // 8 MiB of zeros compresses to a few KiB; the record's length alone is over the limit.
        let zeros = "\0".repeat(8 << 20);
        let plain = records_of(&BatchBuilder::new().record(TestRecord::new(None, Some(&zeros))));
        for codec in CODECS {
            let compressed = codec.compress(&plain);
            assert!(compressed.len() < 1 << 20, "{codec:?} does not compress");
            assert_eq!(
                validate_compressed_records(&batch(codec, compressed, 1), LIMIT),
                Err(BatchError::DecompressedTooLarge { limit: LIMIT }),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn many_small_records_are_refused_past_the_limit() {
        // Each record is small, together they inflate past the limit.
        let value = "y".repeat(100);
        let mut builder = BatchBuilder::new();
        for _ in 0..20_000 {
            builder = builder.record(TestRecord::new(None, Some(&value)));
        }
        let plain = records_of(&builder);
        assert!(plain.len() as u64 > 2 * LIMIT);
        for codec in CODECS {
            assert_eq!(
                check(codec, &plain, 20_000),
                Err(BatchError::DecompressedTooLarge { limit: LIMIT }),
                "{codec:?}"
            );
            // The same batch passes under a limit that fits it.
            let batch = batch(codec, codec.compress(&plain), 20_000);
            assert!(
                validate_compressed_records(&batch, 4 * LIMIT).is_ok(),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn trailing_data_past_the_records_is_refused_before_it_inflates() {
        // Valid records followed by a long run of zeros: "bytes remain", or the limit, but never
        // a walk through all of it.
        let mut plain = records_of(&three_records());
        plain.extend(std::iter::repeat_n(0u8, 8 << 20));
        for codec in CODECS {
            let result = check(codec, &plain, 3);
            match codec {
                // One block, decompressed whole: refused on its declared length.
                Codec::SnappyRaw => assert_eq!(
                    result,
                    Err(BatchError::DecompressedTooLarge { limit: LIMIT })
                ),
                _ => assert!(
                    matches!(&result, Err(BatchError::InvalidRecords(why)) if why.contains("remain")),
                    "{codec:?}: {result:?}"
                ),
            }
        }
    }

    #[test]
    fn zstd_frames_asking_for_a_huge_window_are_refused() {
        let plain = records_of(&three_records());
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        encoder.include_contentsize(false).unwrap();
        encoder.long_distance_matching(true).unwrap();
        encoder.window_log(ZSTD_MAX_WINDOW_LOG + 2).unwrap();
        encoder.write_all(&plain).unwrap();
        let compressed = encoder.finish().unwrap();
        assert!(corrupt(validate_compressed_records(
            &batch(Codec::Zstd, compressed, 3),
            LIMIT
        ))
        .contains("zstd"));
    }

    #[test]
    fn uncompressed_batches_are_walked_in_place() {
        let bytes = three_records().build();
        let batch = split_batches(&Bytes::from(bytes)).unwrap().remove(0);
        assert_eq!(
            validate_compressed_records(&batch, LIMIT).unwrap(),
            RecordsCheck::Verified {
                max_timestamp: 1_009
            }
        );
    }

    /// Mutated compressed data must give an error or a verdict, never a panic.
    #[test]
    fn mutated_compressed_data_never_panics() {
        let seed = 0x5eed_c0de_0000_0006;
        let mut rng = Rng::new(seed);
        let plain = records_of(&three_records());
        for codec in CODECS {
            let good = BatchBuilder::new()
                .attributes(codec.id())
                .raw_records(codec.compress(&plain), 3)
                .build();
            for round in 0..500 {
                let mut bytes = good.clone();
                for _ in 0..=rng.below(4) {
                    let at = BATCH_HEADER_LEN + rng.below(bytes.len() - BATCH_HEADER_LEN);
                    bytes[at] = rng.byte();
                }
                fix_crc(&mut bytes);
                let result = std::panic::catch_unwind(|| {
                    let batch = split_batches(&Bytes::from(bytes)).unwrap().remove(0);
                    let _ = validate_compressed_records(&batch, LIMIT);
                });
                assert!(
                    result.is_ok(),
                    "{codec:?}: panic with seed {seed:#x} at round {round}"
                );
            }
        }
    }

    /// On demand, in release mode: how fast compressed batches are checked, per codec, against
    /// decompression alone. Prints; asserts nothing about time.
    /// `cargo test --release -p strata-wire compressed_check_throughput -- --ignored --nocapture`
    #[test]
    #[ignore]
    // A measurement of wall time is the point here; nothing under test reads the clock.
    #[allow(clippy::disallowed_methods)]
    fn compressed_check_throughput() {
        let mut builder = BatchBuilder::new().base_timestamp(1_000);
        let value = "x".repeat(100);
        for i in 0..1000 {
            let key = format!("key-{i}");
            builder = builder.record(TestRecord::new(Some(&key), Some(&value)).timestamp_delta(i));
        }
        let plain = records_of(&builder);
        for codec in CODECS {
            let view = batch(codec, codec.compress(&plain), 1000);
            let rounds = 300;
            let started = std::time::Instant::now();
            for _ in 0..rounds {
                validate_compressed_records(&view, LIMIT).unwrap();
            }
            let seconds = started.elapsed().as_secs_f64();
            let mb = (plain.len() * rounds) as f64 / 1e6;
            println!(
                "{codec:?}: {:.0} MB/s of records checked ({:.0} k records/s), batch {} -> {} bytes",
                mb / seconds,
                1000.0 * rounds as f64 / seconds / 1e3,
                plain.len(),
                view.records().len()
            );
        }
    }
}
