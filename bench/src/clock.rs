//! The benchmark's only sources of time.
//!
//! The workspace bans `Instant::now` and `SystemTime::now` (clippy.toml) so that broker code takes
//! time from an injectable clock and stays testable. A benchmark is the opposite case: measuring
//! real elapsed time is its purpose, and nothing here is unit-tested against a fake clock. So the
//! real clocks are read here, and only here, with the lint allowed locally.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The monotonic clock. Every latency in the benchmark is a difference of two of these readings
/// taken in this one process, so producer and consumer agree on time.
#[allow(clippy::disallowed_methods)] // measuring real time is what a benchmark is for
pub fn now() -> Instant {
    Instant::now()
}

/// Nanoseconds from `origin` to now, as the `u64` that travels in payloads and in delivery
/// opaques (an `Instant` cannot be sent through librdkafka; a number can).
pub fn nanos_since(origin: Instant) -> u64 {
    duration_to_nanos(now().saturating_duration_since(origin))
}

pub fn duration_to_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Wall-clock seconds since the Unix epoch, only to date a JSON report.
#[allow(clippy::disallowed_methods)] // dating a report needs the real wall clock
pub fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Time left until `deadline`, zero once it has passed.
pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(now())
}
