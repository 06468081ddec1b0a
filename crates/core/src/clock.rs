//! Time is an input. Lease expiry, session timeouts, group-commit triggers, retry backoff and
//! every wait read the clock through this trait, so that tests and the simulation can drive
//! time by hand. Production code never calls `tokio::time` or `std::time::Instant::now`
//! directly (clippy's `disallowed-methods` enforces it, see `clippy.toml`): it sleeps with
//! [`Clock::sleep`], bounds a wait with [`timeout`], ticks with [`Ticker`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What [`Clock::sleep_until`] returns: a future that completes once the clock has reached
/// the deadline.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of monotonic time (for timeouts), wall time (for record timestamps), and waits.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Monotonic time since an arbitrary origin fixed when the clock was made.
    fn monotonic(&self) -> Duration;
    /// Milliseconds since the Unix epoch, as Kafka timestamps count them.
    fn wall_millis(&self) -> i64;
    /// Completes once [`Self::monotonic`] has reached `deadline` (at once if it has).
    fn sleep_until(&self, deadline: Duration) -> Sleep;
    /// Completes once `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> Sleep {
        self.sleep_until(self.monotonic().saturating_add(duration))
    }
}

/// The error of a wait that reached its deadline first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// Runs `future` until it completes or `duration` passes on `clock`, whichever is first.
pub async fn timeout<F: Future>(
    clock: &dyn Clock,
    duration: Duration,
    future: F,
) -> Result<F::Output, Elapsed> {
    timeout_at(clock, clock.monotonic().saturating_add(duration), future).await
}

/// Runs `future` until it completes or `clock` reaches `deadline`, whichever is first. The
/// future is polled first, so one that is ready wins even past the deadline.
pub async fn timeout_at<F: Future>(
    clock: &dyn Clock,
    deadline: Duration,
    future: F,
) -> Result<F::Output, Elapsed> {
    let mut future = std::pin::pin!(future);
    let mut sleep = clock.sleep_until(deadline);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        sleep.as_mut().poll(cx).map(|()| Err(Elapsed))
    })
    .await
}

/// Fires every `period` on a clock. A tick that comes late (the work between ticks took longer
/// than the period) is not made up for: the next one is a full period later, so a slow round
/// is never followed by a burst.
#[derive(Debug)]
pub struct Ticker {
    clock: Arc<dyn Clock>,
    period: Duration,
    next: Option<Duration>,
}

impl Ticker {
    /// The first [`Self::tick`] completes at once, like `tokio::time::interval`'s.
    pub fn new(clock: Arc<dyn Clock>, period: Duration) -> Self {
        Self {
            clock,
            period,
            next: None,
        }
    }

    pub async fn tick(&mut self) {
        if let Some(next) = self.next {
            self.clock.sleep_until(next).await;
        }
        let now = self.clock.monotonic();
        let due = self.next.unwrap_or(now);
        // Behind by a period or more: start afresh from now rather than catch up.
        let base = if now.saturating_sub(due) >= self.period {
            now
        } else {
            due
        };
        self.next = Some(base.saturating_add(self.period));
    }
}

/// The real clock. Monotonic time is tokio's, so a test that pauses tokio's time
/// (`start_paused`) moves this clock too, and its sleeps are tokio's timers.
#[derive(Debug)]
pub struct SystemClock {
    origin: tokio::time::Instant,
}

impl SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place ambient time is read
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
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
    #[allow(clippy::disallowed_methods)] // the one place ambient time is read
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }

    #[allow(clippy::disallowed_methods)] // the real clock's waits are tokio's timers
    fn sleep_until(&self, deadline: Duration) -> Sleep {
        let at = self.origin.checked_add(deadline).unwrap_or(self.origin);
        Box::pin(tokio::time::sleep_until(at))
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
/// Its sleeps complete when [`Self::advance`] moves it past their deadline.
#[derive(Debug, Default)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
    wall_origin_ms: i64,
}

#[derive(Debug, Default)]
struct ManualInner {
    nanos: AtomicU64,
    /// Sleeps not yet due, woken by every advance (each re-checks its own deadline).
    sleepers: Mutex<Vec<Waker>>,
}

impl ManualInner {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

impl ManualClock {
    pub fn new(wall_origin_ms: i64) -> Self {
        Self {
            inner: Arc::default(),
            wall_origin_ms,
        }
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.inner.nanos.fetch_add(by, Ordering::SeqCst);
        let sleepers = std::mem::take(
            &mut *self
                .inner
                .sleepers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for waker in sleepers {
            waker.wake();
        }
    }
}

impl Clock for ManualClock {
    fn monotonic(&self) -> Duration {
        self.inner.now()
    }

    fn wall_millis(&self) -> i64 {
        self.wall_origin_ms + (self.inner.nanos.load(Ordering::SeqCst) / 1_000_000) as i64
    }

    fn sleep_until(&self, deadline: Duration) -> Sleep {
        let inner = Arc::clone(&self.inner);
        Box::pin(std::future::poll_fn(move |cx: &mut Context<'_>| {
            if inner.now() >= deadline {
                return Poll::Ready(());
            }
            let mut sleepers = inner
                .sleepers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // Checked again under the lock: an advance between the first check and the push
            // would otherwise find no waker to wake.
            if inner.now() >= deadline {
                return Poll::Ready(());
            }
            sleepers.push(cx.waker().clone());
            Poll::Pending
        }))
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

    /// Polls `future` once with a no-op waker.
    fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(future).poll(&mut cx)
    }

    #[test]
    fn a_manual_sleep_completes_only_once_the_clock_reaches_its_deadline() {
        let clock = ManualClock::new(0);
        let mut sleep = clock.sleep(Duration::from_secs(2));
        assert!(poll_once(&mut sleep).is_pending());
        clock.advance(Duration::from_millis(1999));
        assert!(poll_once(&mut sleep).is_pending());
        clock.advance(Duration::from_millis(1));
        assert!(poll_once(&mut sleep).is_ready());
    }

    #[test]
    fn a_timeout_elapses_on_the_manual_clock_and_a_ready_future_wins() {
        let clock = ManualClock::new(0);
        let mut waiting = Box::pin(timeout(
            &clock,
            Duration::from_secs(1),
            std::future::pending::<()>(),
        ));
        assert!(poll_once(&mut waiting).is_pending());
        clock.advance(Duration::from_secs(1));
        assert_eq!(poll_once(&mut waiting), Poll::Ready(Err(Elapsed)));

        let mut ready = Box::pin(timeout(&clock, Duration::ZERO, std::future::ready(7)));
        assert_eq!(poll_once(&mut ready), Poll::Ready(Ok(7)));
    }

    #[test]
    fn a_ticker_fires_at_once_then_every_period_without_bursts_after_a_late_tick() {
        let clock = Arc::new(ManualClock::new(0));
        let mut ticker = Ticker::new(clock.clone(), Duration::from_secs(1));
        assert!(poll_once(&mut Box::pin(ticker.tick())).is_ready());
        let mut second = Box::pin(ticker.tick());
        assert!(poll_once(&mut second).is_pending());
        clock.advance(Duration::from_secs(1));
        assert!(poll_once(&mut second).is_ready());
        drop(second);
        // Five periods late: one tick now, the next a full period after it.
        clock.advance(Duration::from_secs(5));
        assert!(poll_once(&mut Box::pin(ticker.tick())).is_ready());
        let mut after_late = Box::pin(ticker.tick());
        assert!(poll_once(&mut after_late).is_pending());
        clock.advance(Duration::from_millis(999));
        assert!(poll_once(&mut after_late).is_pending());
        clock.advance(Duration::from_millis(1));
        assert!(poll_once(&mut after_late).is_ready());
    }
}
