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
    /// Spelled into a buffer and written once: every partition's keys and ownership resource
    /// name start with it, and Metadata names 10,000s of them per answer, so sixteen
    /// formatter calls per id showed in profiles.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 32];
        for (pair, b) in hex.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0x0f)];
        }
        // Only ASCII digits were written.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
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
        // Byte order and nibble order, as keys already in storage spell them.
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&[0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]);
        bytes[15] = 0xf0;
        assert_eq!(
            TopicId(bytes).to_string(),
            "0123456789abcdef00000000000000f0"
        );
    }
}
