//! Member id suffixes. Kafka appends a random UUID to the client id (or group instance id); the
//! randomness is injected here so that tests and simulations replay identically from a seed.

/// A source of member id suffixes. Implementations must not repeat a suffix within one
/// coordinator's lifetime; the coordinator still re-draws on the (unlikely) collision with a
/// member id already in the group.
pub trait MemberIdGenerator: Send + std::fmt::Debug {
    /// A fresh, UUID-like suffix (Kafka appends `-` and this to the client or instance id).
    fn next_suffix(&mut self) -> String;
}

/// Deterministic UUID-shaped suffixes from a 64-bit seed (SplitMix64). Seed it from real
/// randomness in production so member ids of different coordinator incarnations do not repeat.
#[derive(Debug, Clone)]
pub struct SeededMemberIds {
    state: u64,
}

impl SeededMemberIds {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl MemberIdGenerator for SeededMemberIds {
    fn next_suffix(&mut self) -> String {
        let high = self.next_u64();
        let low = self.next_u64();
        // Shape it as a version-4 UUID so ids look like the ones Kafka hands out; tools that
        // parse member ids (rarely, but some dashboards do) see what they expect.
        let high = (high & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
        let low = (low & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xFFFF,
            high & 0xFFFF,
            low >> 48,
            low & 0xFFFF_FFFF_FFFF
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_suffixes_are_uuid_shaped_and_replayable() {
        let mut a = SeededMemberIds::new(7);
        let mut b = SeededMemberIds::new(7);
        let first = a.next_suffix();
        assert_eq!(first, b.next_suffix());
        assert_ne!(first, a.next_suffix());
        let parts: Vec<&str> = first.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'), "{first}");
    }
}
