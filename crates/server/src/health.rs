//! Storage health in the logs: one WARN when storage turns unhealthy, one INFO when it recovers.
//!
//! Per-request failures are logged at debug by the storage layer; at the default level an
//! operator would otherwise see nothing until producers time out. Logging transitions rather
//! than failures keeps a long outage down to two lines.

use std::sync::Arc;
use std::time::Duration;

use strata_core::{Clock, Ticker};
use strata_storage::{StorageHealth, StorageHealthSnapshot};
use tracing::{info, warn};

use crate::metrics::UNHEALTHY_AFTER_FAILURES;

/// How often the watcher looks. A failure run that starts and ends between two looks goes
/// unlogged; that is an outage of under a second, which retries absorb anyway.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A change worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Unhealthy {
        consecutive_failures: u64,
        last_error: String,
    },
    /// `down_for` is measured from the look that saw it unhealthy.
    Recovered { down_for: Duration },
}

/// Remembers the last state seen, so each change is reported once.
#[derive(Debug, Default)]
pub struct HealthTransitions {
    /// When (monotonic) storage was first seen unhealthy; None while healthy.
    unhealthy_since: Option<Duration>,
}

impl HealthTransitions {
    /// Compares `snapshot`, taken at monotonic time `now`, with the last one.
    pub fn observe(
        &mut self,
        snapshot: &StorageHealthSnapshot,
        now: Duration,
    ) -> Option<Transition> {
        let healthy = snapshot.is_healthy(UNHEALTHY_AFTER_FAILURES);
        match (self.unhealthy_since, healthy) {
            (None, false) => {
                self.unhealthy_since = Some(now);
                let writes = snapshot.writes_failing(UNHEALTHY_AFTER_FAILURES);
                let (consecutive_failures, last_error) = if writes {
                    (
                        snapshot.consecutive_write_failures,
                        &snapshot.last_write_error,
                    )
                } else {
                    (snapshot.consecutive_failures, &snapshot.last_error)
                };
                Some(Transition::Unhealthy {
                    consecutive_failures,
                    last_error: last_error
                        .clone()
                        .unwrap_or_else(|| "unknown error".to_string()),
                })
            }
            (Some(since), true) => {
                self.unhealthy_since = None;
                Some(Transition::Recovered {
                    down_for: now.saturating_sub(since),
                })
            }
            _ => None,
        }
    }
}

/// Watches `health` forever, logging transitions. Spawn it and abort it at shutdown.
pub async fn watch(backend: &'static str, health: Arc<StorageHealth>, clock: Arc<dyn Clock>) {
    let mut ticks = Ticker::new(Arc::clone(&clock), CHECK_INTERVAL);
    let mut state = HealthTransitions::default();
    loop {
        ticks.tick().await;
        match state.observe(&health.snapshot(), clock.monotonic()) {
            Some(Transition::Unhealthy {
                consecutive_failures,
                last_error,
            }) => warn!(
                backend,
                consecutive_failures,
                error = %last_error,
                "storage unhealthy: {consecutive_failures} requests (or writes) in a row failed"
            ),
            Some(Transition::Recovered { down_for }) => info!(
                backend,
                down_for = ?round_to_millis(down_for),
                "storage recovered"
            ),
            None => {}
        }
    }
}

/// Sub-millisecond digits in a log line are noise.
fn round_to_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;
    use strata_storage::StorageError;

    use super::*;

    #[test]
    fn each_transition_is_reported_once() {
        let clock = Arc::new(ManualClock::new(0));
        let health = StorageHealth::new(clock);
        let mut state = HealthTransitions::default();
        let secs = Duration::from_secs;

        assert_eq!(state.observe(&health.snapshot(), secs(1)), None);
        for _ in 0..UNHEALTHY_AFTER_FAILURES - 1 {
            health.record_failure(&StorageError::Unavailable("down".into()));
        }
        assert_eq!(
            state.observe(&health.snapshot(), secs(2)),
            None,
            "fewer than the threshold"
        );
        health.record_failure(&StorageError::Timeout(secs(10)));
        let Some(Transition::Unhealthy {
            consecutive_failures,
            last_error,
        }) = state.observe(&health.snapshot(), secs(3))
        else {
            panic!("expected an unhealthy transition");
        };
        assert_eq!(consecutive_failures, UNHEALTHY_AFTER_FAILURES);
        assert!(last_error.contains("10s"), "{last_error}");
        health.record_failure(&StorageError::Unavailable("still down".into()));
        assert_eq!(
            state.observe(&health.snapshot(), secs(4)),
            None,
            "still unhealthy: no repeat"
        );

        health.record_success();
        assert_eq!(
            state.observe(&health.snapshot(), secs(13)),
            Some(Transition::Recovered { down_for: secs(10) })
        );
        assert_eq!(state.observe(&health.snapshot(), secs(14)), None);
        assert_eq!(
            round_to_millis(Duration::from_micros(1_500_700)),
            Duration::from_millis(1500)
        );
    }
}
