//! Client quotas: Kafka's entity model ([`model`]), its windowed rates and throttle times
//! ([`rate`]), the quota objects in shared storage ([`store`]), the busy time of a request
//! for `request_percentage` ([`busy`]), and the per-broker usage that decides whether a
//! response is throttled.
//!
//! Usage is aggregated per broker, as Kafka does: a client connected to two brokers may use
//! its quota on each. A response over quota carries `throttle_time_ms`, and its connection is
//! not read again for that long (Kafka's channel muting), so a client that ignores the field
//! still slows down.

pub(crate) mod busy;
pub mod model;
pub mod rate;
pub mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use strata_core::Clock;

pub use model::{Bucket, Entity, Filter, QuotaKind, QuotaTable};
pub use rate::{Rate, Window};
pub use store::QuotaStore;

/// How quotas are measured and bounded (the broker settings `quota_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSettings {
    pub window: Window,
    /// The longest throttle one response gets.
    pub max_throttle: Duration,
    /// Usage buckets (user and/or client id under a quota) remembered at once.
    pub max_tracked: usize,
    /// How often the change marker in storage is read.
    pub refresh_interval: Duration,
}

/// Throttles handed out, by kind, for the metrics endpoint.
#[derive(Debug, Default)]
pub struct ThrottleStats {
    micros: [AtomicU64; 3],
    responses: [AtomicU64; 3],
}

impl ThrottleStats {
    fn record(&self, kind: QuotaKind, throttle: Duration) {
        let i = kind as usize;
        let micros = u64::try_from(throttle.as_micros()).unwrap_or(u64::MAX);
        self.micros[i].fetch_add(micros, Ordering::Relaxed);
        self.responses[i].fetch_add(1, Ordering::Relaxed);
    }

    /// (kind label, seconds of throttle, throttled responses) for each kind.
    pub fn snapshot(&self) -> Vec<(&'static str, f64, u64)> {
        QuotaKind::ALL
            .iter()
            .map(|kind| {
                let i = *kind as usize;
                (
                    kind.label(),
                    self.micros[i].load(Ordering::Relaxed) as f64 / 1e6,
                    self.responses[i].load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}

/// One bucket's rate and when it was last used (monotonic).
type Usage = (Rate, Duration);

/// The quotas a broker enforces and what each bucket has used.
#[derive(Debug)]
pub struct Quotas {
    settings: QuotaSettings,
    clock: Arc<dyn Clock>,
    table: RwLock<Arc<QuotaTable>>,
    usage: Mutex<HashMap<(QuotaKind, Bucket), Usage>>,
    pub stats: ThrottleStats,
}

impl Quotas {
    pub fn new(settings: QuotaSettings, clock: Arc<dyn Clock>) -> Self {
        Self {
            settings,
            clock,
            table: RwLock::new(Arc::new(QuotaTable::default())),
            usage: Mutex::new(HashMap::new()),
            stats: ThrottleStats::default(),
        }
    }

    pub fn settings(&self) -> QuotaSettings {
        self.settings
    }

    /// The quotas as last read from storage.
    pub fn table(&self) -> Arc<QuotaTable> {
        self.table
            .read()
            .map(|t| Arc::clone(&t))
            .unwrap_or_default()
    }

    pub fn replace_table(&self, table: QuotaTable) {
        if let Ok(mut current) = self.table.write() {
            *current = Arc::new(table);
        }
    }

    /// Records `value` (bytes, or percent-seconds of handler time) used by a connection of
    /// `user` with `client_id`, and returns how long its response must be throttled: zero
    /// when no quota applies or the usage is within it.
    pub fn record(&self, kind: QuotaKind, user: &str, client_id: &str, value: f64) -> Duration {
        self.record_with(kind, user, client_id, value, true)
    }

    /// Records `value` without throttling anything for it: request time spent after the
    /// response was built (Kafka records network-thread time the same way). Later requests
    /// pay for it.
    pub fn record_unthrottled(&self, kind: QuotaKind, user: &str, client_id: &str, value: f64) {
        self.record_with(kind, user, client_id, value, false);
    }

    /// The `request_percentage` usage of `busy` handler time: Kafka counts request time in
    /// percent of one second, so a quota of 100 is one thread kept busy.
    pub fn request_time(&self, user: &str, client_id: &str, busy: Duration) -> Duration {
        self.record(
            QuotaKind::Request,
            user,
            client_id,
            busy.as_secs_f64() * 100.0,
        )
    }

    fn record_with(
        &self,
        kind: QuotaKind,
        user: &str,
        client_id: &str,
        value: f64,
        throttle: bool,
    ) -> Duration {
        let table = self.table();
        let Some((quota, bucket)) = table.resolve(kind, user, client_id) else {
            return Duration::ZERO;
        };
        let now = self.clock.monotonic();
        let window = self.settings.window;
        let Ok(mut usage) = self.usage.lock() else {
            return Duration::ZERO;
        };
        if !usage.contains_key(&(kind, bucket.clone())) && usage.len() >= self.settings.max_tracked
        {
            self.make_room(&mut usage, now);
        }
        let (rate, used) = usage
            .entry((kind, bucket))
            .or_insert_with(|| (Rate::new(now), now));
        *used = now;
        rate.record(window, value, now);
        if !throttle {
            return Duration::ZERO;
        }
        let throttle = rate::throttle_time(rate, window, quota, now, self.settings.max_throttle);
        drop(usage);
        if !throttle.is_zero() {
            self.stats.record(kind, throttle);
        }
        throttle
    }

    /// Takes back `value` recorded for a response that was not sent after all (Kafka's
    /// `unrecordQuotaSensor`: an over-quota Fetch is answered empty, so its records do not
    /// count against the client).
    pub fn unrecord(&self, kind: QuotaKind, user: &str, client_id: &str, value: f64) {
        let table = self.table();
        let Some((_, bucket)) = table.resolve(kind, user, client_id) else {
            return;
        };
        let now = self.clock.monotonic();
        if let Ok(mut usage) = self.usage.lock() {
            if let Some((rate, _)) = usage.get_mut(&(kind, bucket)) {
                rate.record(self.settings.window, -value, now);
            }
        }
    }

    /// The most a client may use within the quota's whole window (Kafka's
    /// `getMaxValueInQuotaWindow`: the quota times `quota_window_num - 1` windows), or None
    /// without a quota. A Fetch reads no more than this, or a large enough one would be over
    /// the quota on its own every time and never be answered.
    pub fn max_in_window(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<f64> {
        let (quota, _) = self.table().resolve(kind, user, client_id)?;
        let windows = self.settings.window.samples.max(2) - 1;
        Some(quota * windows as f64 * self.settings.window.size.as_secs_f64())
    }

    /// Drops buckets unused for a whole quota window (their rate is zero anyway), or, if
    /// every bucket is in use (client ids are the client's to choose), the least recently
    /// used one: it starts over from zero, which favours that client a little.
    fn make_room(&self, usage: &mut HashMap<(QuotaKind, Bucket), Usage>, now: Duration) {
        let span = self.settings.window.size * self.settings.window.samples.max(2) as u32;
        usage.retain(|_, (_, used)| now.saturating_sub(*used) < span);
        if usage.len() >= self.settings.max_tracked {
            let oldest = usage
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                usage.remove(&oldest);
            }
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.usage.lock().map(|u| u.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use strata_core::clock::ManualClock;

    use super::model::Name;
    use super::*;

    fn quotas(clock: Arc<ManualClock>, max_tracked: usize) -> Quotas {
        Quotas::new(
            QuotaSettings {
                window: Window {
                    samples: 11,
                    size: Duration::from_secs(1),
                },
                max_throttle: Duration::from_secs(30),
                max_tracked,
                refresh_interval: Duration::from_secs(1),
            },
            clock,
        )
    }

    #[test]
    fn a_client_over_its_quota_is_throttled_and_another_is_not() {
        let clock = Arc::new(ManualClock::new(0));
        let q = quotas(Arc::clone(&clock), 100);
        let mut table = QuotaTable::default();
        table.insert(
            Entity {
                user: None,
                client_id: Some(Name::Named("greedy".into())),
            },
            QuotaKind::Produce,
            1000.0,
        );
        q.replace_table(table);
        assert_eq!(
            q.record(QuotaKind::Produce, "u", "greedy", 5000.0),
            Duration::ZERO
        );
        // 20,000 bytes in the first (10 s minimum) window: 2× the quota, 10 s of throttle.
        let throttle = q.record(QuotaKind::Produce, "u", "greedy", 15_000.0);
        assert_eq!(throttle, Duration::from_secs(10));
        assert_eq!(
            q.record(QuotaKind::Produce, "u", "other", 1e9),
            Duration::ZERO
        );
        assert_eq!(
            q.record(QuotaKind::Fetch, "u", "greedy", 1e9),
            Duration::ZERO
        );
        let stats = q.stats.snapshot();
        assert_eq!(stats[0], ("produce", 10.0, 1));
        assert_eq!(stats[1], ("fetch", 0.0, 0));
        // Usage is only tracked under a quota.
        assert_eq!(q.tracked(), 1);
    }

    #[test]
    fn many_client_ids_under_a_default_quota_keep_the_usage_bounded() {
        let clock = Arc::new(ManualClock::new(0));
        let q = quotas(Arc::clone(&clock), 10);
        let mut table = QuotaTable::default();
        table.insert(
            Entity {
                user: None,
                client_id: Some(Name::Default),
            },
            QuotaKind::Produce,
            1000.0,
        );
        q.replace_table(table);
        for i in 0..100 {
            q.record(QuotaKind::Produce, "u", &format!("c{i}"), 1.0);
            assert!(q.tracked() <= 10);
        }
    }
}
