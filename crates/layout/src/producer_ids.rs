//! Idempotent producer id blocks: `meta/producer-ids/<block:020>`, an empty object created
//! (create-only) by the broker that claims block `block` (ids `block × size ..`, the size is
//! the log's).

pub const PREFIX: &str = "meta/producer-ids/";

pub fn key(block: u64) -> String {
    format!("{PREFIX}{block:020}")
}

/// The block number of a listed key; None for anything else.
pub fn parse_key(key: &str) -> Option<u64> {
    key.strip_prefix(PREFIX)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        assert_eq!(key(3), "meta/producer-ids/00000000000000000003");
        assert_eq!(parse_key(&key(3)), Some(3));
        assert_eq!(parse_key("meta/streams/3"), None);
    }
}
