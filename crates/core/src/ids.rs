//! Newtypes for the values that cross layer boundaries, so an offset is never confused with a
//! count, an epoch or a broker id.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A Kafka offset: the position of a record in one partition's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Offset(pub i64);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    pub fn get(self) -> i64 {
        self.0
    }

    pub fn plus(self, n: i64) -> Offset {
        Offset(self.0 + n)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An ownership epoch: bumped by a conditional write each time a partition changes hands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A broker's id, as Kafka clients see it in Metadata (node id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BrokerId(pub i32);

impl fmt::Display for BrokerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One partition of one topic. The topic name is shared, so cloning is cheap.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicPartition {
    pub topic: Arc<str>,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// The coordinator shard (partition of `__consumer_offsets`, `__transaction_state`, …) that
/// owns `key`: Kafka's `Utils.abs(key.hashCode) % partitions`, with Java's String.hashCode over
/// UTF-16 code units, so a group or transactional id lands where a Kafka operator expects.
pub fn coordinator_shard(key: &str, shards: usize) -> usize {
    let mut h: i32 = 0;
    for unit in key.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    ((h & 0x7fff_ffff) as usize) % shards.max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn coordinator_shards_follow_kafkas_hash() {
        // Java: "group".hashCode() == 98629247; 98629247 % 50 == 47.
        assert_eq!(super::coordinator_shard("group", 50), 47);
        assert_eq!(super::coordinator_shard("", 8), 0);
        // Beyond the BMP: two UTF-16 units, as Java counts them ("😀".hashCode() == 1772899).
        assert_eq!(super::coordinator_shard("😀", 1_000_000_007), 1_772_899);
        // A negative hash is masked, not negated: "polygenelubricants".hashCode() == i32::MIN.
        assert_eq!(super::coordinator_shard("polygenelubricants", 50), 0);
    }
}
