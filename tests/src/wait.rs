//! Waiting on conditions with a deadline: the only synchronisation these tests use.
//!
//! A test never sleeps "long enough" for something to happen; it polls the condition it needs
//! and fails with a message naming that condition when the deadline passes.

use std::future::Future;
use std::time::{Duration, Instant};

/// The default time a condition gets to become true. Generous, because CI machines have two
/// cores and debug builds, and a passing test never waits for it.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// How often a condition is polled. Short enough not to slow tests, long enough not to spin.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `check` until it returns `Some`, and returns that value; panics naming `what` if
/// `timeout` passes first.
pub fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The async form of [`wait_until`], for conditions that need a client call to evaluate.
pub async fn wait_until_async<T, F>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> T
where
    F: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Time left until `deadline`, or a panic naming `what` if it has passed.
pub fn remaining(what: &str, deadline: Instant) -> Duration {
    let now = Instant::now();
    assert!(now < deadline, "deadline passed while {what}");
    deadline - now
}
