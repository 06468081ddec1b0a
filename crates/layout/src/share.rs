//! Share-group state (KIP-932): one object per (share group, topic partition), holding a
//! compact snapshot of the share partition (its start offset, the state runs of its in-flight
//! window and the state epoch), rewritten by compare-and-swap by the partition's owner. The
//! content's schema belongs to `strata-groups` (`ShareSnapshot`); this module only names it.

use crate::TopicId;

/// Prefix of every share-state object.
pub const PREFIX: &str = "share/";

/// `share/<group as hex>/<topic id>/<partition>`: hex keeps any group id a valid key segment.
pub fn key(group_id: &str, topic: TopicId, partition: i32) -> String {
    let mut group = String::with_capacity(group_id.len() * 2);
    for byte in group_id.as_bytes() {
        group.push_str(&format!("{byte:02x}"));
    }
    if group.is_empty() {
        // An empty segment is not a valid key; no share group has an empty id, but a key must
        // still be well formed for any input.
        group.push('-');
    }
    format!("{PREFIX}{group}/{topic}/{partition}")
}

/// The prefix of every share-state object of one group (DeleteGroups, DeleteShareGroupOffsets).
pub fn group_prefix(group_id: &str) -> String {
    let key = key(group_id, TopicId([0; 16]), 0);
    let end = key.len() - format!("{}/0", TopicId([0; 16])).len();
    key[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_group_in_hex_under_the_prefix() {
        let t = TopicId([0xab; 16]);
        let k = key("g/1", t, 3);
        assert_eq!(k, format!("share/672f31/{t}/3"));
        assert!(k.starts_with(&group_prefix("g/1")));
        assert_eq!(group_prefix("g/1"), "share/672f31/");
    }
}
