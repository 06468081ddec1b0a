//! Time is an input. Lease expiry, session timeouts, group-commit triggers and retry backoff all
//! read the clock through this trait so that tests and the simulation can drive time by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of monotonic time (for timeouts) and wall time (for record timestamps).
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Monotonic time since an arbitrary origin fixed when the clock was made.
    fn monotonic(&self) -> Duration;
    /// Milliseconds since the Unix epoch, as Kafka timestamps count them.
    fn wall_millis(&self) -> i64;
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place ambient time is read
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    pub fn shared() -> Arc<dyn Clock> {
        Arc::new(Self::new())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }

    #[allow(clippy::disallowed_methods)] // the one place ambient time is read
    fn wall_millis(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to: for sans-IO state machine tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
    wall_origin_ms: i64,
}

impl ManualClock {
    pub fn new(wall_origin_ms: i64) -> Self {
        Self {
            nanos: AtomicU64::new(0),
            wall_origin_ms,
        }
    }

    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn monotonic(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn wall_millis(&self) -> i64 {
        self.wall_origin_ms + (self.nanos.load(Ordering::SeqCst) / 1_000_000) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.monotonic(), Duration::ZERO);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.monotonic(), Duration::from_millis(1500));
        assert_eq!(clock.wall_millis(), 2_500);
    }
}
