//! The small vocabulary every Strata layer shares: newtypes for the contracts between layers
//! (`TopicPartition`, `Offset`, `Epoch`, `BrokerId`) and the injected [`clock::Clock`].
//!
//! This crate owns no behaviour and must never do IO; anything with a policy belongs in a layer
//! above it. Keeping it tiny keeps the dependency arrows pointing one way.

pub mod clock;
pub mod ids;

pub use clock::{Clock, SystemClock};
pub use ids::{BrokerId, Epoch, Offset, TopicPartition};
