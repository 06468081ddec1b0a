//! The time a request keeps the broker busy, for the `request_percentage` quota.
//!
//! Kafka charges a request the time its handler thread and network thread spend on it, not
//! the time it waits (a long-poll Fetch parked in purgatory, a Produce waiting for replicas).
//! A Strata request is one future: the time spent inside its `poll` calls is exactly the
//! time a worker thread spent on it, and the time between polls is waiting (for storage, a
//! long poll, its turn). [`measured`] drives a request's future and adds up its polls; a
//! response that must carry its throttle reads the total so far, including the poll it is
//! built in, with [`BusyMeter::so_far`].

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata_core::Clock;

/// Busy time of one request. Shared by the driver and the handler (through the request
/// context); atomics only because the context is `Sync`, a request is polled by one thread
/// at a time.
#[derive(Debug)]
pub(crate) struct BusyMeter {
    clock: Arc<dyn Clock>,
    /// Nanoseconds spent in finished polls.
    done: AtomicU64,
    /// Monotonic nanoseconds at which the running poll started, or `u64::MAX` between polls.
    polling_since: AtomicU64,
    /// Nanoseconds already charged to the request quota (by the response).
    charged: AtomicU64,
}

const IDLE: u64 = u64::MAX;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
}

impl BusyMeter {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            done: AtomicU64::new(0),
            polling_since: AtomicU64::new(IDLE),
            charged: AtomicU64::new(0),
        }
    }

    /// Busy time so far, the running poll included.
    pub(crate) fn so_far(&self) -> Duration {
        let done = self.done.load(Ordering::Relaxed);
        let since = self.polling_since.load(Ordering::Relaxed);
        let running = if since == IDLE {
            0
        } else {
            nanos(self.clock.monotonic()).saturating_sub(since)
        };
        Duration::from_nanos(done.saturating_add(running))
    }

    /// Busy time not yet charged to the quota, and marks it charged: a response charges what
    /// its request used up to that point, the driver charges the rest (encoding, writing up
    /// the reply) once the request is done, as Kafka records network-thread time afterwards.
    pub(crate) fn take_uncharged(&self) -> Duration {
        let total = nanos(self.so_far());
        let before = self.charged.swap(total, Ordering::Relaxed);
        Duration::from_nanos(total.saturating_sub(before))
    }

    fn start_poll(&self) {
        self.polling_since
            .store(nanos(self.clock.monotonic()), Ordering::Relaxed);
    }

    fn end_poll(&self) {
        let since = self.polling_since.swap(IDLE, Ordering::Relaxed);
        if since != IDLE {
            let spent = nanos(self.clock.monotonic()).saturating_sub(since);
            self.done.fetch_add(spent, Ordering::Relaxed);
        }
    }
}

/// Drives `request` to completion, adding the time spent in each of its polls to `meter`.
pub(crate) async fn measured<F: Future>(meter: &BusyMeter, request: F) -> F::Output {
    let mut request = pin!(request);
    std::future::poll_fn(|cx| {
        meter.start_poll();
        let polled = request.as_mut().poll(cx);
        meter.end_poll();
        polled
    })
    .await
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;

    use super::*;

    #[tokio::test]
    async fn only_time_inside_polls_counts() {
        let clock = Arc::new(ManualClock::new(0));
        let meter = BusyMeter::new(clock.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiter = {
            let clock = clock.clone();
            async move {
                // 3 ms of work, a wait, 2 ms of work.
                clock.advance(Duration::from_millis(3));
                let _ = rx.await;
                clock.advance(Duration::from_millis(2));
            }
        };
        let driver = measured(&meter, waiter);
        let outside = async {
            tokio::task::yield_now().await;
            // Time passing while the request waits is not busy time.
            clock.advance(Duration::from_secs(10));
            let _ = tx.send(());
        };
        tokio::join!(driver, outside);
        assert_eq!(meter.so_far(), Duration::from_millis(5));
        assert_eq!(meter.take_uncharged(), Duration::from_millis(5));
        assert_eq!(meter.take_uncharged(), Duration::ZERO);
    }
}
