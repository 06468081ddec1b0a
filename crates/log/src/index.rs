//! The offset index: fixed-size entries, one per record batch, grouped in chunk objects that
//! each cover a fixed offset range. Finding any offset costs one chunk lookup (cached) and a
//! binary search over at most `span` entries, whatever the partition's size.
//!
//! Chunk layout: a 16-byte header `magic "SXI1" | writer stream u32 | owner claim u64`, then
//! entries of 40 bytes each (big-endian):
//! `base_offset i64 | last_offset_delta u32 | length u32 | position u32 | segment_stream u32 |
//!  segment_base i64 | max_timestamp i64`.
//! Entries only ever point into compacted segments; the uncompacted tail lives in memory and
//! in the write-ahead objects until compaction writes its segment.
//!
//! The header's claim number (the manifest's `claim`: unique per owner, larger for every later
//! owner) is the fence for chunk writes: a chunk is a shared, rewritten object (several
//! compactions add to the same chunk), so unlike segments it cannot be made harmless by a
//! unique name. A writer refuses to replace a chunk stamped with a later claim than its own,
//! and every replacement is a compare-and-swap on the version it read, so a deposed owner can
//! never overwrite what its successor wrote (docs/ARCHITECTURE.md, "Fencing").
//! Chunks written before the header existed (a multiple of 40 bytes, no magic) read as claim 0.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::{LogError, LogResult};

pub const ENTRY_SIZE: usize = 40;
/// Entries of chunks that point into cleaned segments: the 40 bytes plus the segment's claim
/// (u64) and generation (u32). Only such chunks use it (magic `SXI2`), so a partition never
/// cleaned keeps the format older builds read.
pub const ENTRY_SIZE_V2: usize = 52;
/// Entries of chunks that point into a segment held on the fast tier (`SegmentRef::fast`): the
/// 52 bytes plus a u32 of flags (bit 0: fast tier). Only such chunks use it (magic `SXI3`).
pub const ENTRY_SIZE_V3: usize = 56;
/// Size of the chunk header (magic, writer stream, epoch).
pub const HEADER_SIZE: usize = 16;
const MAGIC: &[u8; 4] = b"SXI1";
const MAGIC_V2: &[u8; 4] = b"SXI2";
const MAGIC_V3: &[u8; 4] = b"SXI3";
const FLAG_FAST: u32 = 1;

/// Who last wrote a chunk: the fence a later writer checks before replacing it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkStamp {
    /// The writer's claim number (`Manifest::claim`); 0 for legacy chunks.
    pub claim: u64,
    /// The writer's write-ahead stream (broker incarnation), for diagnosis.
    pub stream: u32,
}

/// Where one stored record batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub base_offset: i64,
    pub last_offset_delta: u32,
    pub length: u32,
    pub position: u32,
    pub segment: SegmentRef,
    pub max_timestamp: i64,
}

/// Names a segment object: the partition's segments are keyed by base offset and the stream
/// (broker incarnation) that wrote them, so two owners can never collide on a key.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct SegmentRef {
    pub base_offset: i64,
    pub stream: u32,
    /// Cleaned segments only (`generation` > 0): the writer's claim number.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub claim: u64,
    /// 0 for a segment written by tail compaction; otherwise a cleaned segment, numbered
    /// uniquely within its writer's process.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub generation: u32,
    /// Held on the fast (write-ahead) tier under `hot/` by the topic's `local.retention.*`,
    /// until the tiering pass copies it to the bulk tier. Such a segment always carries a claim
    /// and a generation, so its name is its writer's alone.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fast: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

impl SegmentRef {
    /// A segment written by tail compaction.
    pub fn compacted(base_offset: i64, stream: u32) -> Self {
        Self {
            base_offset,
            stream,
            claim: 0,
            generation: 0,
            fast: false,
        }
    }
}

impl IndexEntry {
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }

    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_i64(self.base_offset);
        buf.put_u32(self.last_offset_delta);
        buf.put_u32(self.length);
        buf.put_u32(self.position);
        buf.put_u32(self.segment.stream);
        buf.put_i64(self.segment.base_offset);
        buf.put_i64(self.max_timestamp);
    }

    pub fn decode(mut b: &[u8]) -> Self {
        let mut entry = IndexEntry {
            base_offset: b.get_i64(),
            last_offset_delta: b.get_u32(),
            length: b.get_u32(),
            position: b.get_u32(),
            segment: {
                let stream = b.get_u32();
                SegmentRef::compacted(b.get_i64(), stream)
            },
            max_timestamp: b.get_i64(),
        };
        if b.len() >= ENTRY_SIZE_V2 - ENTRY_SIZE {
            entry.segment.claim = b.get_u64();
            entry.segment.generation = b.get_u32();
        }
        if b.len() >= ENTRY_SIZE_V3 - ENTRY_SIZE_V2 {
            entry.segment.fast = b.get_u32() & FLAG_FAST != 0;
        }
        entry
    }
}

/// The chunk that covers `offset`.
pub fn chunk_of(offset: i64, span: i64) -> i64 {
    offset.div_euclid(span)
}

pub fn encode_chunk(stamp: ChunkStamp, entries: &[IndexEntry]) -> Bytes {
    // The oldest format that can say everything, so a partition that never used a newer
    // feature keeps chunks older builds read.
    let v3 = entries.iter().any(|e| e.segment.fast);
    let v2 = v3 || entries.iter().any(|e| e.segment.generation != 0);
    let (size, magic) = match (v2, v3) {
        (_, true) => (ENTRY_SIZE_V3, MAGIC_V3),
        (true, false) => (ENTRY_SIZE_V2, MAGIC_V2),
        _ => (ENTRY_SIZE, MAGIC),
    };
    let mut buf = BytesMut::with_capacity(HEADER_SIZE + entries.len() * size);
    buf.put_slice(magic);
    buf.put_u32(stamp.stream);
    buf.put_u64(stamp.claim);
    for e in entries {
        e.encode(&mut buf);
        if v2 {
            buf.put_u64(e.segment.claim);
            buf.put_u32(e.segment.generation);
        }
        if v3 {
            buf.put_u32(if e.segment.fast { FLAG_FAST } else { 0 });
        }
    }
    buf.freeze()
}

pub fn decode_chunk(bytes: &[u8]) -> LogResult<(ChunkStamp, Vec<IndexEntry>)> {
    let stamped = |size: usize| {
        let mut header = &bytes[MAGIC.len()..HEADER_SIZE];
        let stream = header.get_u32();
        let claim = header.get_u64();
        (ChunkStamp { claim, stream }, &bytes[HEADER_SIZE..], size)
    };
    let (stamp, body, size) = if bytes.len() >= HEADER_SIZE
        && (bytes.len() - HEADER_SIZE).is_multiple_of(ENTRY_SIZE_V3)
        && bytes.starts_with(MAGIC_V3)
    {
        stamped(ENTRY_SIZE_V3)
    } else if bytes.len() >= HEADER_SIZE
        && (bytes.len() - HEADER_SIZE).is_multiple_of(ENTRY_SIZE_V2)
        && bytes.starts_with(MAGIC_V2)
    {
        stamped(ENTRY_SIZE_V2)
    } else if bytes.len() % ENTRY_SIZE == HEADER_SIZE && bytes.starts_with(MAGIC) {
        stamped(ENTRY_SIZE)
    } else if bytes.len().is_multiple_of(ENTRY_SIZE) {
        (ChunkStamp::default(), bytes, ENTRY_SIZE)
    } else {
        return Err(LogError::CorruptStorage(format!(
            "index chunk of {} bytes is neither a stamped chunk nor a multiple of {ENTRY_SIZE}",
            bytes.len()
        )));
    };
    let entries: Vec<IndexEntry> = body.chunks_exact(size).map(IndexEntry::decode).collect();
    if entries
        .windows(2)
        .any(|w| w[1].base_offset <= w[0].last_offset())
    {
        return Err(LogError::CorruptStorage(
            "index chunk entries out of order".into(),
        ));
    }
    Ok((stamp, entries))
}

/// Position of the entry containing `offset` in a sorted chunk, if any.
#[cfg(test)]
pub fn find(entries: &[IndexEntry], offset: i64) -> Option<usize> {
    let i = entries.partition_point(|e| e.last_offset() < offset);
    (i < entries.len() && entries[i].base_offset <= offset).then_some(i)
}

/// Position of the first entry at or after `offset` (for offsets that fall in a gap left by
/// deleted records, a reader simply moves on to the next batch).
pub fn find_at_or_after(entries: &[IndexEntry], offset: i64) -> Option<usize> {
    let i = entries.partition_point(|e| e.last_offset() < offset);
    (i < entries.len()).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(base: i64, count: u32) -> IndexEntry {
        IndexEntry {
            base_offset: base,
            last_offset_delta: count - 1,
            length: 100,
            position: 0,
            segment: SegmentRef::compacted(0, 1),
            max_timestamp: base * 10,
        }
    }

    #[test]
    fn entries_round_trip_at_fixed_size() {
        let entries = vec![entry(0, 3), entry(3, 1), entry(4, 10)];
        let stamp = ChunkStamp {
            claim: 7,
            stream: 0x2a,
        };
        let bytes = encode_chunk(stamp, &entries);
        assert_eq!(bytes.len(), HEADER_SIZE + 3 * ENTRY_SIZE);
        assert_eq!(decode_chunk(&bytes).unwrap(), (stamp, entries));
    }

    #[test]
    fn chunks_pointing_into_cleaned_segments_round_trip_and_others_keep_the_old_format() {
        let mut cleaned = entry(3, 1);
        cleaned.segment.claim = 5;
        cleaned.segment.generation = 2;
        let entries = vec![entry(0, 3), cleaned, entry(7, 1)];
        let stamp = ChunkStamp {
            claim: 5,
            stream: 1,
        };
        let bytes = encode_chunk(stamp, &entries);
        assert_eq!(bytes.len(), HEADER_SIZE + 3 * ENTRY_SIZE_V2);
        assert_eq!(decode_chunk(&bytes).unwrap(), (stamp, entries));
        let plain = encode_chunk(stamp, &[entry(0, 3)]);
        assert_eq!(&plain[..4], MAGIC);
        assert_eq!(plain.len(), HEADER_SIZE + ENTRY_SIZE);
    }

    #[test]
    fn chunks_pointing_into_fast_tier_segments_carry_the_flag() {
        let mut fast = entry(3, 1);
        fast.segment.claim = 5;
        fast.segment.generation = 2;
        fast.segment.fast = true;
        let mut cleaned = entry(7, 1);
        cleaned.segment.claim = 5;
        cleaned.segment.generation = 3;
        let entries = vec![entry(0, 3), fast, cleaned];
        let stamp = ChunkStamp {
            claim: 5,
            stream: 1,
        };
        let bytes = encode_chunk(stamp, &entries);
        assert_eq!(&bytes[..4], MAGIC_V3);
        assert_eq!(bytes.len(), HEADER_SIZE + 3 * ENTRY_SIZE_V3);
        assert_eq!(decode_chunk(&bytes).unwrap(), (stamp, entries.clone()));
        // Once the segment moved to the bulk tier, its chunk goes back to the older format.
        let moved: Vec<IndexEntry> = entries[1..]
            .iter()
            .map(|e| IndexEntry {
                segment: SegmentRef {
                    fast: false,
                    ..e.segment
                },
                ..*e
            })
            .collect();
        assert_eq!(&encode_chunk(stamp, &moved)[..4], MAGIC_V2);
    }

    #[test]
    fn a_hole_left_by_cleaning_finds_the_next_batch() {
        // Offsets 3..=6 were cleaned away (and 8..=9 inside the last batch's span).
        let entries = vec![entry(0, 3), entry(7, 4)];
        assert_eq!(find_at_or_after(&entries, 4), Some(1));
        assert_eq!(find_at_or_after(&entries, 9), Some(1));
        assert_eq!(find_at_or_after(&entries, 11), None);
    }

    #[test]
    fn unstamped_chunks_of_earlier_versions_read_as_claim_zero() {
        let entries = vec![entry(0, 3), entry(3, 1)];
        let mut legacy = BytesMut::new();
        for e in &entries {
            e.encode(&mut legacy);
        }
        assert_eq!(
            decode_chunk(&legacy).unwrap(),
            (ChunkStamp::default(), entries)
        );
    }

    #[test]
    fn finds_the_batch_containing_an_offset() {
        let entries = vec![entry(0, 3), entry(3, 1), entry(4, 10)];
        assert_eq!(find(&entries, 0), Some(0));
        assert_eq!(find(&entries, 2), Some(0));
        assert_eq!(find(&entries, 3), Some(1));
        assert_eq!(find(&entries, 13), Some(2));
        assert_eq!(find(&entries, 14), None);
    }

    #[test]
    fn rejects_corrupt_chunks() {
        assert!(decode_chunk(&[0u8; 39]).is_err());
        let bytes = encode_chunk(ChunkStamp::default(), &[entry(5, 3), entry(6, 1)]);
        assert!(decode_chunk(&bytes).is_err());
        // A stamped chunk cut mid-entry.
        let bytes = encode_chunk(ChunkStamp::default(), &[entry(5, 1)]);
        assert!(decode_chunk(&bytes[..bytes.len() - 1]).is_err());
    }
}
