//! Judging which brokers are alive without synchronized clocks.
//!
//! A broker proves it is alive by changing its registration object (each heartbeat is a
//! compare-and-swap, so the object's version moves). An observer never compares its clock with
//! the broker's: it remembers, per broker, the version it last saw and *its own* monotonic time
//! when it first saw that version. A broker whose version has not moved for `lease_period` of the
//! observer's time is dead. Only clock *rates* need to agree roughly, never clock values.
//!
//! One refinement keeps an observer that was itself cut off (storage outage, a long pause of its
//! own process) from declaring everybody dead the moment it can see again: if more than
//! `max_observation_gap` passed since its previous observation, the history says nothing about
//! the others, so every broker is granted a fresh lease from now.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use strata_core::BrokerId;
use strata_storage::Version;

/// Pure liveness bookkeeping: feed it observations, ask it who is live. No IO, no ambient time.
#[derive(Debug, Clone)]
pub struct LivenessTracker {
    lease_period: Duration,
    max_observation_gap: Duration,
    last_observation: Option<Duration>,
    brokers: BTreeMap<BrokerId, Seen>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    version: Version,
    /// When this observer first saw `version`.
    since: Duration,
    /// Start of the current unbroken live streak (for placement hysteresis).
    live_since: Duration,
}

impl LivenessTracker {
    /// `max_observation_gap` is usually half the lease: two or three missed rounds.
    pub fn new(lease_period: Duration, max_observation_gap: Duration) -> Self {
        Self {
            lease_period,
            max_observation_gap,
            last_observation: None,
            brokers: BTreeMap::new(),
        }
    }

    pub fn lease_period(&self) -> Duration {
        self.lease_period
    }

    /// Records that `broker`'s registration had `version` at our monotonic time `now`.
    ///
    /// A broker seen for the first time counts as live: we cannot tell a fresh registration
    /// from a stale one, and assuming death would let a newly started observer fence everybody.
    pub fn observe(&mut self, now: Duration, broker: BrokerId, version: &Version) {
        self.note_observation_time(now);
        let lease = self.lease_period;
        match self.brokers.get_mut(&broker) {
            Some(seen) if seen.version == *version => {}
            Some(seen) => {
                let was_dead = now.saturating_sub(seen.since) >= lease;
                seen.version = version.clone();
                seen.since = now;
                if was_dead {
                    seen.live_since = now;
                }
            }
            None => {
                self.brokers.insert(
                    broker,
                    Seen {
                        version: version.clone(),
                        since: now,
                        live_since: now,
                    },
                );
            }
        }
    }

    /// Drops a broker whose registration is gone (it left, or was never there).
    pub fn forget(&mut self, broker: BrokerId) {
        self.brokers.remove(&broker);
    }

    /// Keeps only the brokers for which `keep` is true (those present in a full listing).
    pub fn retain(&mut self, mut keep: impl FnMut(BrokerId) -> bool) {
        self.brokers.retain(|id, _| keep(*id));
    }

    pub fn is_live(&self, now: Duration, broker: BrokerId) -> bool {
        self.brokers
            .get(&broker)
            .is_some_and(|seen| now.saturating_sub(seen.since) < self.lease_period)
    }

    /// The brokers whose registration moved within the lease, as of `now`.
    pub fn live(&self, now: Duration) -> BTreeSet<BrokerId> {
        self.brokers
            .keys()
            .copied()
            .filter(|id| self.is_live(now, *id))
            .collect()
    }

    /// Every broker we track, live or not.
    pub fn known(&self) -> BTreeSet<BrokerId> {
        self.brokers.keys().copied().collect()
    }

    /// When `broker` will be dead unless its version moves again.
    pub fn expires_at(&self, broker: BrokerId) -> Option<Duration> {
        self.brokers
            .get(&broker)
            .map(|seen| seen.since + self.lease_period)
    }

    /// How long `broker`'s registration has stayed unchanged, as of `now` (None if unknown).
    pub fn silent_for(&self, now: Duration, broker: BrokerId) -> Option<Duration> {
        self.brokers
            .get(&broker)
            .map(|seen| now.saturating_sub(seen.since))
    }

    /// Since when `broker` has been continuously live, if it is live now.
    pub fn live_since(&self, now: Duration, broker: BrokerId) -> Option<Duration> {
        if !self.is_live(now, broker) {
            return None;
        }
        self.brokers.get(&broker).map(|seen| seen.live_since)
    }

    fn note_observation_time(&mut self, now: Duration) {
        if let Some(last) = self.last_observation {
            if now.saturating_sub(last) > self.max_observation_gap {
                // We were blind for a while; silence during our blindness proves nothing.
                let lease = self.lease_period;
                for seen in self.brokers.values_mut() {
                    if now.saturating_sub(seen.since) >= lease {
                        seen.live_since = now;
                    }
                    seen.since = now;
                }
            }
        }
        self.last_observation = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(5);
    const GAP: Duration = Duration::from_millis(2500);

    fn s(secs_tenths: u64) -> Duration {
        Duration::from_millis(secs_tenths * 100)
    }

    fn v(n: u64) -> Version {
        Version(n.to_string())
    }

    /// Observes every broker in `versions` at `now`, as one listing round would.
    fn round(t: &mut LivenessTracker, now: Duration, versions: &[(i32, u64)]) {
        for (id, version) in versions {
            t.observe(now, BrokerId(*id), &v(*version));
        }
    }

    #[test]
    fn first_sighting_counts_as_live() {
        let mut t = LivenessTracker::new(LEASE, GAP);
        t.observe(s(0), BrokerId(1), &v(10));
        assert!(t.is_live(s(0), BrokerId(1)));
        assert_eq!(t.live_since(s(0), BrokerId(1)), Some(s(0)));
    }

    #[test]
    fn a_broker_whose_version_stops_moving_dies_after_the_lease_of_our_clock() {
        let mut t = LivenessTracker::new(LEASE, GAP);
        let mut a_version = 1;
        for tenth in (0..=100).step_by(10) {
            a_version += 1;
            // Broker 1 heartbeats every second; broker 2 never moves.
            round(&mut t, s(tenth), &[(1, a_version), (2, 7)]);
        }
        assert!(t.is_live(s(100), BrokerId(1)));
        assert!(!t.is_live(s(100), BrokerId(2)));
        assert_eq!(t.live(s(100)), BTreeSet::from([BrokerId(1)]));
        // Broker 2 died exactly one lease after we first saw version 7.
        assert_eq!(t.expires_at(BrokerId(2)), Some(s(50)));
        assert!(t.is_live(s(49), BrokerId(2)));
        assert!(!t.is_live(s(50), BrokerId(2)));
    }

    #[test]
    fn a_dead_broker_that_moves_again_is_live_with_a_new_streak() {
        let mut t = LivenessTracker::new(LEASE, GAP);
        for tenth in (0..=60).step_by(10) {
            round(&mut t, s(tenth), &[(1, 1)]);
        }
        assert!(!t.is_live(s(60), BrokerId(1)));
        round(&mut t, s(70), &[(1, 2)]);
        assert!(t.is_live(s(70), BrokerId(1)));
        assert_eq!(t.live_since(s(70), BrokerId(1)), Some(s(70)));
    }

    #[test]
    fn a_live_streak_survives_heartbeats() {
        let mut t = LivenessTracker::new(LEASE, GAP);
        for (i, tenth) in (0..=80).step_by(10).enumerate() {
            round(&mut t, s(tenth), &[(1, i as u64)]);
        }
        assert_eq!(t.live_since(s(80), BrokerId(1)), Some(s(0)));
    }

    #[test]
    fn an_observer_that_was_blind_grants_everybody_a_fresh_lease() {
        let mut t = LivenessTracker::new(LEASE, GAP);
        round(&mut t, s(0), &[(1, 1), (2, 1)]);
        // Storage was out for 20 s: nobody could heartbeat, and we could not look.
        round(&mut t, s(200), &[(1, 1), (2, 1)]);
        assert_eq!(t.live(s(200)), BTreeSet::from([BrokerId(1), BrokerId(2)]));
        // Broker 1 recovers, broker 2 really is dead: it dies one lease after we could see.
        for tenth in (210..=250).step_by(10) {
            round(&mut t, s(tenth), &[(1, tenth), (2, 1)]);
        }
        assert_eq!(t.live(s(250)), BTreeSet::from([BrokerId(1)]));
    }

    #[test]
    fn forget_and_retain_drop_departed_brokers() {
        let mut t = LivenessTracker::new(LEASE, GAP);
        round(&mut t, s(0), &[(1, 1), (2, 1), (3, 1)]);
        t.forget(BrokerId(1));
        t.retain(|id| id != BrokerId(2));
        assert_eq!(t.known(), BTreeSet::from([BrokerId(3)]));
    }
}
