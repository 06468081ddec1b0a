//! The small vocabulary every Strata layer shares: newtypes for the contracts between layers
//! (`TopicPartition`, `Offset`, `Epoch`, `BrokerId`) and the injected [`clock::Clock`].
//!
//! This crate owns no behaviour and must never do IO; anything with a policy belongs in a layer
//! above it. Keeping it tiny keeps the dependency arrows pointing one way.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod clock;
pub mod ids;

pub use clock::{timeout, timeout_at, Clock, Elapsed, Sleep, SystemClock, Ticker};
pub use ids::{coordinator_shard, BrokerId, Epoch, Offset, TopicPartition};
