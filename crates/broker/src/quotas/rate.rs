//! Kafka's windowed rate (`org.apache.kafka.common.metrics.stats.Rate` over `SampledStat`) and
//! the throttle time `ClientQuotaManager` derives from it. Pure logic over times the caller
//! reads from the broker's clock.

use std::time::Duration;

/// `quota.window.num` samples of `quota.window.size` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub samples: usize,
    pub size: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    /// When the sample started (monotonic).
    start: Duration,
    value: f64,
}

/// A rate measured over the last `samples` windows, as Kafka measures quota usage.
#[derive(Debug, Clone)]
pub struct Rate {
    samples: Vec<Sample>,
    current: usize,
}

impl Rate {
    pub fn new(now: Duration) -> Self {
        Self {
            samples: vec![Sample {
                start: now,
                value: 0.0,
            }],
            current: 0,
        }
    }

    /// Adds `value` at `now`: to the current sample while it is younger than one window,
    /// otherwise to a fresh sample (reusing the oldest once there are `samples` of them).
    pub fn record(&mut self, window: Window, value: f64, now: Duration) {
        let samples = window.samples.max(2);
        let start = self.samples[self.current].start;
        if now.saturating_sub(start) >= window.size {
            self.current = (self.current + 1) % samples;
            let fresh = Sample {
                start: now,
                value: 0.0,
            };
            if self.current >= self.samples.len() {
                self.samples.push(fresh);
            } else {
                self.samples[self.current] = fresh;
            }
        }
        self.samples[self.current].value += value;
    }

    /// Resets samples that ended a whole window ago (Kafka's `purgeObsoleteSamples`).
    fn purge(&mut self, window: Window, now: Duration) {
        let span = window.size * window.samples.max(2) as u32;
        for sample in &mut self.samples {
            if now.saturating_sub(sample.start) >= span {
                *sample = Sample {
                    start: now,
                    value: 0.0,
                };
            }
        }
    }

    /// The time the rate is computed over (Kafka's `Rate.windowSize`): from the oldest
    /// sample's start to now, but at least `samples - 1` whole windows, so a young rate is not
    /// a burst divided by almost nothing.
    pub fn window_size(&mut self, window: Window, now: Duration) -> Duration {
        self.purge(window, now);
        let oldest = self.samples.iter().map(|s| s.start).min().unwrap_or(now);
        let elapsed = now.saturating_sub(oldest);
        let min = window.size * (window.samples.max(2) as u32 - 1);
        elapsed.max(min)
    }

    /// Units per second at `now`.
    pub fn measure(&mut self, window: Window, now: Duration) -> f64 {
        let size = self.window_size(window, now).as_secs_f64();
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        if size > 0.0 {
            total / size
        } else {
            0.0
        }
    }
}

/// How long a client over `quota` must be held back so that its rate falls back to the quota
/// (Kafka's `QuotaUtils.throttleTime`: (observed − quota) / quota × the rate's window), at
/// most `max`. Zero when the rate is within the quota.
pub fn throttle_time(
    rate: &mut Rate,
    window: Window,
    quota: f64,
    now: Duration,
    max: Duration,
) -> Duration {
    let observed = rate.measure(window, now);
    if quota <= 0.0 || observed <= quota {
        return Duration::ZERO;
    }
    let size = rate.window_size(window, now).as_secs_f64();
    let secs = (observed - quota) / quota * size;
    Duration::try_from_secs_f64(secs).map_or(max, |t| t.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Window = Window {
        samples: 11,
        size: Duration::from_secs(1),
    };
    const MAX: Duration = Duration::from_secs(30);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_young_rate_is_spread_over_at_least_ten_windows() {
        let mut rate = Rate::new(secs(0.0));
        rate.record(W, 1000.0, secs(0.0));
        assert_eq!(rate.window_size(W, secs(0.5)), secs(10.0));
        assert_eq!(rate.measure(W, secs(0.5)), 100.0);
    }

    #[test]
    fn a_steady_rate_measures_as_itself_once_the_samples_are_full() {
        let mut rate = Rate::new(secs(0.0));
        for tick in 0..100 {
            // 100 units every 100 ms: 1000 per second.
            rate.record(W, 100.0, secs(tick as f64 * 0.1));
        }
        let measured = rate.measure(W, secs(9.95));
        assert!((measured - 1000.0).abs() < 1.0, "{measured}");
        // Still 1000/s thirty seconds later if it keeps going, even as samples are reused.
        for tick in 100..400 {
            rate.record(W, 100.0, secs(tick as f64 * 0.1));
        }
        let measured = rate.measure(W, secs(39.95));
        assert!((measured - 1000.0).abs() < 100.0, "{measured}");
        // And it decays to nothing once the client stops.
        assert_eq!(rate.measure(W, secs(60.0)), 0.0);
    }

    #[test]
    fn the_throttle_is_the_excess_over_the_quota_times_the_window() {
        let mut rate = Rate::new(secs(0.0));
        // 20,000 units at once against a quota of 1000/s, measured over the minimum 10 s
        // window: observed 2000/s, twice the quota, so a whole window of throttle.
        rate.record(W, 20_000.0, secs(0.0));
        assert_eq!(
            throttle_time(&mut rate, W, 1000.0, secs(0.0), MAX),
            secs(10.0)
        );
        // Within the quota: no throttle.
        let mut calm = Rate::new(secs(0.0));
        calm.record(W, 5_000.0, secs(0.0));
        assert_eq!(
            throttle_time(&mut calm, W, 1000.0, secs(0.0), MAX),
            Duration::ZERO
        );
        // The cap.
        assert_eq!(
            throttle_time(&mut rate, W, 1.0, secs(0.0), secs(3.0)),
            secs(3.0)
        );
    }

    #[test]
    fn a_client_that_waits_its_throttle_out_is_back_within_its_quota() {
        let mut rate = Rate::new(secs(0.0));
        let mut now = secs(0.0);
        let mut sent = 0.0;
        // A client sending 100 KB batches as fast as it is let, with a quota of 100 KB/s.
        for _ in 0..200 {
            rate.record(W, 100_000.0, now);
            sent += 100_000.0;
            let throttle = throttle_time(&mut rate, W, 100_000.0, now, MAX);
            now += throttle.max(secs(0.01));
        }
        let achieved = sent / now.as_secs_f64();
        assert!(achieved < 120_000.0, "{achieved}");
        assert!(achieved > 80_000.0, "{achieved}");
    }
}
