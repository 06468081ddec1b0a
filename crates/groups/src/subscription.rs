//! The parts of the consumer protocol (the bytes inside JoinGroup and SyncGroup of protocol
//! type "consumer") the coordinator reads or writes itself: which topics a classic group reads,
//! so that OffsetDelete can refuse to delete offsets the group is still using; and, for
//! classic members of a consumer group (online migration), their subscription and owned
//! partitions, and the assignment the coordinator hands them.
//!
//! The metadata is client bytes: it is parsed defensively and never trusted. Like Kafka, a
//! reader takes the fields of the versions it knows and ignores what follows, so the
//! coordinator keeps working with consumer protocol versions it has never seen.

use std::collections::BTreeSet;

use bytes::Buf;

/// The topics in a ConsumerProtocolSubscription, or `None` if the bytes are not one.
pub fn subscribed_topics(metadata: &[u8]) -> Option<BTreeSet<String>> {
    // `bytes::Buf`'s checked getters: short input is None, never a panic.
    let mut reader = metadata;
    let version = reader.try_get_i16().ok()?;
    if version < 0 {
        return None;
    }
    let count = reader.try_get_i32().ok()?;
    if count < 0 {
        return None;
    }
    let mut topics = BTreeSet::new();
    // No pre-allocation from the untrusted count: a garbage count must not reserve gigabytes.
    for _ in 0..count {
        let len = usize::try_from(reader.try_get_i16().ok()?).ok()?;
        let name = take(&mut reader, len)?;
        topics.insert(String::from_utf8_lossy(name).into_owned());
    }
    // User data (nullable bytes) completes the v0 schema; a truncated one makes the whole
    // subscription unreadable, as it does for Kafka.
    let user_data_len = reader.try_get_i32().ok()?;
    if user_data_len >= 0 {
        take(&mut reader, user_data_len as usize)?;
    } else if user_data_len != -1 {
        return None;
    }
    Some(topics)
}

/// A ConsumerProtocolSubscription as far as the coordinator needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscription {
    pub topics: BTreeSet<String>,
    /// v1+: the partitions the member still owns (cooperative clients report them; eager
    /// ones have revoked everything before they join, and send none).
    pub owned: Vec<(String, Vec<i32>)>,
}

/// The subscription, with its owned partitions, or `None` if the bytes are not one.
pub fn parse_subscription(metadata: &[u8]) -> Option<Subscription> {
    let topics = subscribed_topics(metadata)?;
    let mut reader = metadata;
    let version = reader.try_get_i16().ok()?;
    let mut owned = Vec::new();
    if version >= 1 {
        // Skip the v0 prefix just validated, then read the owned partitions.
        let count = reader.try_get_i32().ok()?;
        for _ in 0..count {
            let len = usize::try_from(reader.try_get_i16().ok()?).ok()?;
            take(&mut reader, len)?;
        }
        let user_data_len = reader.try_get_i32().ok()?;
        if user_data_len >= 0 {
            take(&mut reader, user_data_len as usize)?;
        }
        // A v1 subscription cut short before its owned partitions owns nothing.
        if !reader.is_empty() {
            owned = topic_partitions(&mut reader)?;
        }
    }
    Some(Subscription { topics, owned })
}

/// `[topic string, [partition int32]]`, as subscriptions and assignments list partitions.
fn topic_partitions(reader: &mut &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    let count = reader.try_get_i32().ok()?;
    let mut out = Vec::new();
    for _ in 0..count.max(0) {
        let len = usize::try_from(reader.try_get_i16().ok()?).ok()?;
        let name = String::from_utf8_lossy(take(reader, len)?).into_owned();
        let n = reader.try_get_i32().ok()?;
        let mut partitions = Vec::new();
        for _ in 0..n.max(0) {
            partitions.push(reader.try_get_i32().ok()?);
        }
        out.push((name, partitions));
    }
    Some(out)
}

/// The partitions in a ConsumerProtocolAssignment (every version starts with version, then
/// the partitions), or `None` if the bytes are not one. Empty bytes are no assignment.
pub fn parse_assignment(bytes: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let mut reader = bytes;
    if reader.try_get_i16().ok()? < 0 {
        return None;
    }
    topic_partitions(&mut reader)
}

/// Encodes a ConsumerProtocolAssignment: version 0's layout (version, partitions, null user
/// data), which every later version starts with and every client reads.
pub fn encode_assignment(partitions: &[(String, Vec<i32>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0i16.to_be_bytes());
    out.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
    for (topic, ps) in partitions {
        out.extend_from_slice(&(topic.len() as i16).to_be_bytes());
        out.extend_from_slice(topic.as_bytes());
        out.extend_from_slice(&(ps.len() as i32).to_be_bytes());
        for p in ps {
            out.extend_from_slice(&p.to_be_bytes());
        }
    }
    out.extend_from_slice(&(-1i32).to_be_bytes());
    out
}

/// The next `n` bytes, if there are that many.
fn take<'a>(reader: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if reader.len() < n {
        return None;
    }
    let (head, tail) = reader.split_at(n);
    *reader = tail;
    Some(head)
}

/// Encodes a ConsumerProtocolSubscription (version 0 layout, any version number) — for tests
/// and for callers that need to fabricate consumer metadata.
pub fn encode_subscription(version: i16, topics: &[&str], user_data: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&(topics.len() as i32).to_be_bytes());
    for topic in topics {
        out.extend_from_slice(&(topic.len() as i16).to_be_bytes());
        out.extend_from_slice(topic.as_bytes());
    }
    match user_data {
        Some(data) => {
            out.extend_from_slice(&(data.len() as i32).to_be_bytes());
            out.extend_from_slice(data);
        }
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_topics_of_a_v0_subscription() {
        let bytes = encode_subscription(0, &["orders", "payments"], None);
        let topics = subscribed_topics(&bytes).unwrap();
        assert_eq!(
            topics.into_iter().collect::<Vec<_>>(),
            ["orders", "payments"]
        );
    }

    #[test]
    fn reads_the_v0_prefix_of_later_versions() {
        let mut bytes = encode_subscription(3, &["orders"], Some(b"sticky"));
        // v1+ owned partitions, v2 generation, v3 rack follow; they are ignored.
        bytes.extend_from_slice(&[0, 0, 0, 1, 0, 1, b'x', 0, 0, 0, 0]);
        let topics = subscribed_topics(&bytes).unwrap();
        assert!(topics.contains("orders"));
    }

    #[test]
    fn owned_partitions_of_a_v1_subscription_are_read() {
        let mut bytes = encode_subscription(1, &["orders"], None);
        // ownedPartitions: [ {"orders", [0, 2]} ]
        bytes.extend_from_slice(&[0, 0, 0, 1, 0, 6]);
        bytes.extend_from_slice(b"orders");
        bytes.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2]);
        let sub = parse_subscription(&bytes).unwrap();
        assert_eq!(sub.owned, vec![("orders".to_string(), vec![0, 2])]);
        let v0 = parse_subscription(&encode_subscription(0, &["orders"], None)).unwrap();
        assert!(v0.owned.is_empty());
        assert!(parse_subscription(&bytes[..bytes.len() - 2]).is_none());
    }

    #[test]
    fn an_assignment_round_trips_and_garbage_is_none() {
        let a = vec![("t".to_string(), vec![1, 3]), ("u".to_string(), vec![0])];
        let bytes = encode_assignment(&a);
        assert_eq!(parse_assignment(&bytes), Some(a));
        assert_eq!(parse_assignment(&[]), Some(Vec::new()));
        assert_eq!(parse_assignment(&bytes[..7]), None);
        assert_eq!(parse_assignment(&[0xff, 0xff]), None);
    }

    #[test]
    fn garbage_metadata_is_unreadable_not_a_panic() {
        assert_eq!(subscribed_topics(&[]), None);
        assert_eq!(subscribed_topics(&[0, 0, 0x7f, 0xff, 0xff, 0xff]), None);
        assert_eq!(subscribed_topics(&[0, 0, 0, 0, 0, 1, 0x7f, 0xff]), None);
        assert_eq!(subscribed_topics(&[0xff, 0xff, 0, 0, 0, 0]), None);
        let truncated = encode_subscription(0, &["orders"], Some(b"abc"));
        assert_eq!(subscribed_topics(&truncated[..truncated.len() - 1]), None);
        for len in 0..64u8 {
            let junk: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37)).collect();
            let _ = subscribed_topics(&junk);
            let _ = parse_subscription(&junk);
            let _ = parse_assignment(&junk);
        }
    }
}
