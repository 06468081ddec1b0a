//! A partition's objects under `log/<topic-id>/<partition>/`: its manifest, its index chunks
//! and its compacted segments (`seg/`, and `hot/` for segments held on the fast tier by a
//! topic's `local.retention.*`). Their contents are the log's (see the crate doc).

use crate::TopicId;

pub const PREFIX: &str = "log/";

/// Everything of one topic (deleted with the topic).
pub fn topic_prefix(topic: TopicId) -> String {
    format!("{PREFIX}{topic}/")
}

pub fn manifest_key(topic: TopicId, partition: i32) -> String {
    format!("{PREFIX}{topic}/{partition}/manifest")
}

/// Index chunk `chunk` covers offsets `[chunk × span, (chunk + 1) × span)`.
pub fn chunk_key(topic: TopicId, partition: i32, chunk: i64) -> String {
    format!("{PREFIX}{topic}/{partition}/index/{chunk:020}")
}

/// The prefix of a partition's segments.
pub fn segment_prefix(topic: TopicId, partition: i32) -> String {
    format!("{PREFIX}{topic}/{partition}/seg/")
}

/// A segment is named by its base offset and the stream (broker incarnation) that wrote it, so
/// two owners never write one key.
pub fn segment_key(topic: TopicId, partition: i32, base_offset: i64, stream: u32) -> String {
    format!("{PREFIX}{topic}/{partition}/seg/{base_offset:020}-{stream:08x}")
}

/// A segment written by the log cleaner (key compaction): also named by the claim number of
/// the owner that wrote it and a generation unique within that owner's process, so a cleaned
/// segment never collides with the segment it replaces, with a later cleaning of the same
/// range, or with another owner's. The claim lets a garbage collector tell a successor's
/// segments (a larger claim: never touched) from its own and its predecessors'.
pub fn cleaned_segment_key(
    topic: TopicId,
    partition: i32,
    base_offset: i64,
    stream: u32,
    claim: u64,
    generation: u32,
) -> String {
    format!(
        "{PREFIX}{topic}/{partition}/seg/{base_offset:020}-{stream:08x}-{claim:016x}-{generation:08x}"
    )
}

/// The prefix of a partition's fast-tier segments.
pub fn fast_segment_prefix(topic: TopicId, partition: i32) -> String {
    format!("{PREFIX}{topic}/{partition}/hot/")
}

/// A segment kept on the fast (write-ahead) tier until its topic's `local.retention.*` passes,
/// then copied to the bulk tier as a segment under `seg/`. Its own directory because the tier
/// of a key is a function of its name (see `tier`); named like a cleaned segment (claim and
/// generation) so every writer's name is its own and the claim rule of the garbage collector
/// applies to it.
pub fn fast_segment_key(
    topic: TopicId,
    partition: i32,
    base_offset: i64,
    stream: u32,
    claim: u64,
    generation: u32,
) -> String {
    format!(
        "{PREFIX}{topic}/{partition}/hot/{base_offset:020}-{stream:08x}-{claim:016x}-{generation:08x}"
    )
}

/// The base offset, stream, claim and generation of a listed cleaned-segment key; None for
/// anything else (including segments written by tail compaction).
pub fn parse_cleaned_segment_key(key: &str) -> Option<(i64, u32, u64, u32)> {
    parse_claimed(key, "/seg/")
}

/// The base offset, stream, claim and generation of a listed fast-tier segment key.
pub fn parse_fast_segment_key(key: &str) -> Option<(i64, u32, u64, u32)> {
    parse_claimed(key, "/hot/")
}

fn parse_claimed(key: &str, dir: &str) -> Option<(i64, u32, u64, u32)> {
    let rest = key.strip_prefix(PREFIX)?;
    let (_, name) = rest.rsplit_once(dir)?;
    let mut parts = name.split('-');
    let base = parts.next()?.parse().ok()?;
    let stream = u32::from_str_radix(parts.next()?, 16).ok()?;
    let claim = u64::from_str_radix(parts.next()?, 16).ok()?;
    let generation = u32::from_str_radix(parts.next()?, 16).ok()?;
    parts
        .next()
        .is_none()
        .then_some((base, stream, claim, generation))
}

/// The base offset and stream of a listed segment key; None for anything else.
pub fn parse_segment_key(key: &str) -> Option<(i64, u32)> {
    let rest = key.strip_prefix(PREFIX)?;
    let (_, name) = rest.rsplit_once("/seg/")?;
    let (base, stream) = name.split_once('-')?;
    Some((base.parse().ok()?, u32::from_str_radix(stream, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let t = TopicId([0xab; 16]);
        let hex = "abababababababababababababababab";
        assert_eq!(topic_prefix(t), format!("log/{hex}/"));
        assert_eq!(manifest_key(t, 3), format!("log/{hex}/3/manifest"));
        assert_eq!(
            chunk_key(t, 3, 2),
            format!("log/{hex}/3/index/00000000000000000002")
        );
        let seg = segment_key(t, 3, 100, 0x2a);
        assert_eq!(
            seg,
            format!("log/{hex}/3/seg/00000000000000000100-0000002a")
        );
        assert!(seg.starts_with(&segment_prefix(t, 3)));
        assert!(seg.starts_with(&topic_prefix(t)));
        assert_eq!(parse_segment_key(&seg), Some((100, 0x2a)));
        assert_eq!(parse_segment_key(&manifest_key(t, 3)), None);
        let cleaned = cleaned_segment_key(t, 3, 100, 0x2a, 7, 9);
        assert_eq!(
            cleaned,
            format!("log/{hex}/3/seg/00000000000000000100-0000002a-0000000000000007-00000009")
        );
        assert!(cleaned.starts_with(&segment_prefix(t, 3)));
        assert_eq!(parse_cleaned_segment_key(&cleaned), Some((100, 0x2a, 7, 9)));
        // Each parser reads only its own kind, so old code never mistakes a cleaned segment.
        assert_eq!(parse_segment_key(&cleaned), None);
        assert_eq!(parse_cleaned_segment_key(&seg), None);
        let fast = fast_segment_key(t, 3, 100, 0x2a, 7, 9);
        assert_eq!(
            fast,
            format!("log/{hex}/3/hot/00000000000000000100-0000002a-0000000000000007-00000009")
        );
        assert!(fast.starts_with(&fast_segment_prefix(t, 3)));
        assert_eq!(parse_fast_segment_key(&fast), Some((100, 0x2a, 7, 9)));
        assert_eq!(parse_cleaned_segment_key(&fast), None);
        assert_eq!(parse_segment_key(&fast), None);
        assert_eq!(parse_fast_segment_key(&cleaned), None);
    }
}
