//! Just enough of the consumer protocol to know which topics a "consumer" group reads, so that
//! OffsetDelete can refuse to delete offsets the group is still using.
//!
//! The metadata is client bytes: it is parsed defensively and never trusted. Like Kafka, only the
//! version-0 prefix is read (version, topics, user data); every later version extends that
//! prefix, so the coordinator keeps working with consumer protocol versions it has never seen.

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
        }
    }
}
