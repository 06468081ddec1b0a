//! Identifiers that appear in keys.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A topic's 16-byte id (Kafka's topic UUID). Storage keys use it, so a topic deleted and
/// re-created under the same name never sees the old topic's objects. Keys spell it as 32
/// lowercase hex digits; the catalog stores it as its 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TopicId(pub [u8; 16]);

impl TopicId {
    pub fn random() -> Self {
        TopicId(*uuid::Uuid::new_v4().as_bytes())
    }

    /// Parses the key spelling (32 hex digits); None for anything else.
    pub fn parse_hex(text: &str) -> Option<Self> {
        if text.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(TopicId(bytes))
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_other_text() {
        let id = TopicId([0xab; 16]);
        assert_eq!(TopicId::parse_hex(&id.to_string()), Some(id));
        assert_eq!(TopicId::parse_hex("ab"), None);
        assert_eq!(TopicId::parse_hex(&"zz".repeat(16)), None);
    }
}
