//! Incremental fetch sessions (KIP-227), as a state machine without IO: the Fetch handler asks
//! [`FetchSessions::begin`] what to read, reads it, and tells [`FetchSessions::finish_full`] or
//! [`FetchSessions::finish_incremental`] what it found, which decides the session id of the
//! answer and which partitions an incremental answer lists.
//!
//! A session remembers, per partition, what the client asked for (offset, byte limit, leader
//! epoch) and what it was last told (high watermark, last stable offset, log start offset), so
//! a consumer of many partitions sends only the partitions whose position changed and hears
//! only about partitions with something new. The rules are Kafka's (`FetchSession.scala`):
//!
//! - epoch -1 is sessionless; with a session id it also closes that session;
//! - epoch 0 is a full fetch: it closes the session it names and creates a new one, if the cache
//!   has room (the answer carries its id, or 0 when none was created);
//! - epoch n > 0 is an incremental fetch of session `id`: an unknown id is
//!   FETCH_SESSION_ID_NOT_FOUND, another epoch than the session's INVALID_FETCH_SESSION_EPOCH,
//!   and a session created with topic ids used without them (or the reverse)
//!   FETCH_SESSION_TOPIC_ID_ERROR; otherwise the request's partitions are added or updated, its
//!   forgotten ones removed, and the epoch moves on (a session left empty is closed and the
//!   fetch answered sessionless);
//! - an incremental answer lists a partition when it has records, an error, or a high
//!   watermark, last stable offset or log start offset other than the last one sent. An error
//!   also forgets the last high watermark, so the partition is listed again once it recovers.
//!   Listed partitions move to the end of the session's order: the next fetch reads the others
//!   first, so a response's byte limit cannot starve the partitions at the back.
//!
//! The cache is bounded twice: `slots` sessions, and `max_partitions` partitions over all of
//! them (a session grows with every incremental fetch that adds partitions, so the slot count
//! alone bounds nothing). A new session takes a free slot, or evicts, as Kafka does, the least
//! recently used session if it has been idle longer than `eviction_after`, or else the smallest
//! session that had existed for longer than `eviction_after` when last used, if the newcomer is
//! larger. Without either, or without room for its partitions, no session is created and the
//! client keeps sending full fetches. An incremental fetch that would take the cache past
//! `max_partitions` closes its session (FETCH_SESSION_ID_NOT_FOUND: the client starts over with
//! a full fetch, which is then served without a session if it still does not fit).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

/// Session epoch of a request that wants no session (and closes the one it names).
pub(crate) const FINAL_EPOCH: i32 = -1;
/// Session epoch of a full fetch that asks for a new session.
pub(crate) const INITIAL_EPOCH: i32 = 0;
/// The session id that means "no session".
pub(crate) const NO_SESSION: i32 = 0;

/// Why an incremental fetch cannot use the session it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FetchSessionError {
    /// No session with this id (never created, evicted, closed, or another broker's).
    #[error("fetch session not found")]
    NotFound,
    /// The request's epoch is not the one the session expects next.
    #[error("fetch session epoch out of sequence")]
    InvalidEpoch,
    /// The session was created with topic ids (Fetch v13+) and used without, or the reverse.
    #[error("fetch session created with a different topic naming (ids or names)")]
    TopicIdMismatch,
}

/// How a request names a topic: by name before Fetch v13, by id from v13.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum TopicKey {
    Name(StrBytes),
    Id(Uuid),
}

/// One partition of a session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PartitionKey {
    pub topic: TopicKey,
    pub partition: i32,
}

/// What the client asks of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wants {
    pub fetch_offset: i64,
    pub max_bytes: i32,
    pub current_leader_epoch: i32,
}

/// What one read found for a partition, as far as the session cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub record_bytes: usize,
    pub error: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
}

#[derive(Debug, Clone)]
struct Cached {
    wants: Wants,
    /// What the client was last told; -1 when never told (or after an error).
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    /// Set while one fetch is being answered: the partition was listed.
    listed: bool,
}

impl Cached {
    fn new(wants: Wants) -> Self {
        Self {
            wants,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            listed: false,
        }
    }

    /// Whether an incremental answer must list the partition; remembers what it says.
    fn update(&mut self, seen: &Seen) -> bool {
        let mut list = seen.record_bytes > 0;
        if seen.error != 0 {
            self.high_watermark = -1;
            return true;
        }
        if self.high_watermark != seen.high_watermark {
            self.high_watermark = seen.high_watermark;
            list = true;
        }
        if self.last_stable_offset != seen.last_stable_offset {
            self.last_stable_offset = seen.last_stable_offset;
            list = true;
        }
        if self.log_start_offset != seen.log_start_offset {
            self.log_start_offset = seen.log_start_offset;
            list = true;
        }
        list
    }
}

#[derive(Debug)]
struct Session {
    id: i32,
    /// The epoch the next incremental fetch must carry.
    epoch: i32,
    uses_topic_ids: bool,
    created: Duration,
    last_used: Duration,
    partitions: IndexMap<PartitionKey, Cached>,
}

/// What a fetch request is, once checked against the cache.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Read the request's own partitions and list them all; `create` says whether to offer a
    /// session afterwards ([`FetchSessions::finish_full`]).
    Full { create: bool },
    /// Read these partitions of session `id`, in this order, and ask
    /// [`FetchSessions::finish_incremental`] which to list.
    Incremental {
        id: i32,
        partitions: Vec<(PartitionKey, Wants)>,
    },
    /// Answer with this error and no partitions.
    Error(FetchSessionError),
}

/// Bounds of the cache (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchSessionLimits {
    /// Sessions kept at once (`max_incremental_fetch_session_cache_slots`).
    pub slots: usize,
    /// Partitions kept over all sessions (`max_incremental_fetch_session_partitions`).
    pub max_partitions: usize,
    /// Idle time after which a session may be evicted for any newcomer, and age after which
    /// it may be evicted for a larger one (`min_incremental_fetch_session_eviction`).
    pub eviction_after: Duration,
}

/// Counters for the metrics endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchSessionStats {
    pub sessions: usize,
    pub partitions: usize,
    pub evictions: u64,
}

/// The broker's fetch sessions.
#[derive(Debug)]
pub struct FetchSessions {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limits: FetchSessionLimits,
    sessions: HashMap<i32, Session>,
    partitions: usize,
    evictions: u64,
    /// Session ids are drawn at random so that a client holding an id from before a restart
    /// (or from another broker) is unlikely to hit a live session of someone else.
    rng: StdRng,
}

fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl FetchSessions {
    pub fn new(limits: FetchSessionLimits, seed: u64) -> Self {
        Self {
            state: Mutex::new(State {
                limits,
                sessions: HashMap::new(),
                partitions: 0,
                evictions: 0,
                rng: StdRng::seed_from_u64(seed),
            }),
        }
    }

    pub fn stats(&self) -> FetchSessionStats {
        self.with(|s| FetchSessionStats {
            sessions: s.sessions.len(),
            partitions: s.partitions,
            evictions: s.evictions,
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic while holding the lock leaves counts that are at worst stale; the cache stays
        // usable rather than failing every later fetch.
        let mut state = match self.state.lock() {
            Ok(state) => state,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut state)
    }

    /// Checks a request's session fields, closes what it closes, and applies an incremental
    /// fetch's changes. `requested` and `forgotten` are the request's partitions and forgotten
    /// partitions; `uses_topic_ids` whether the request names topics by id (v13+).
    pub(crate) fn begin(
        &self,
        now: Duration,
        session_id: i32,
        epoch: i32,
        uses_topic_ids: bool,
        requested: &[(PartitionKey, Wants)],
        forgotten: &[PartitionKey],
    ) -> Begin {
        self.with(|s| {
            if epoch == FINAL_EPOCH || epoch == INITIAL_EPOCH {
                if session_id != NO_SESSION {
                    s.remove(session_id);
                }
                return Begin::Full {
                    create: epoch == INITIAL_EPOCH,
                };
            }
            let Some(session) = s.sessions.get_mut(&session_id) else {
                return Begin::Error(FetchSessionError::NotFound);
            };
            if session.epoch != epoch {
                return Begin::Error(FetchSessionError::InvalidEpoch);
            }
            if session.uses_topic_ids != uses_topic_ids {
                return Begin::Error(FetchSessionError::TopicIdMismatch);
            }
            let before = session.partitions.len();
            for (key, wants) in requested {
                match session.partitions.get_mut(key) {
                    Some(cached) => cached.wants = *wants,
                    None => {
                        session.partitions.insert(key.clone(), Cached::new(*wants));
                    }
                }
            }
            for key in forgotten {
                session.partitions.shift_remove(key);
            }
            let after = session.partitions.len();
            s.partitions = s.partitions - before + after;
            if after == 0 || s.partitions > s.limits.max_partitions {
                s.remove(session_id);
                return if after == 0 {
                    Begin::Full { create: false }
                } else {
                    Begin::Error(FetchSessionError::NotFound)
                };
            }
            session.epoch = next_epoch(session.epoch);
            session.last_used = now;
            Begin::Incremental {
                id: session_id,
                partitions: session
                    .partitions
                    .iter()
                    .map(|(key, cached)| (key.clone(), cached.wants))
                    .collect(),
            }
        })
    }

    /// After a full fetch asking for a session: creates one holding the partitions read, if
    /// the cache has or can make room, and returns its id (or [`NO_SESSION`]).
    pub(crate) fn finish_full(
        &self,
        now: Duration,
        uses_topic_ids: bool,
        partitions: &[(PartitionKey, Wants, Seen)],
    ) -> i32 {
        self.with(|s| {
            let mut cached = IndexMap::with_capacity(partitions.len());
            for (key, wants, seen) in partitions {
                let mut entry = Cached::new(*wants);
                entry.update(seen);
                cached.insert(key.clone(), entry);
            }
            let size = cached.len();
            if size == 0 || s.partitions + size > s.limits.max_partitions {
                return NO_SESSION;
            }
            if !s.make_room(now, size) {
                return NO_SESSION;
            }
            let id = loop {
                let id = s.rng.random_range(1..=i32::MAX);
                if !s.sessions.contains_key(&id) {
                    break id;
                }
            };
            s.partitions += size;
            s.sessions.insert(
                id,
                Session {
                    id,
                    epoch: next_epoch(INITIAL_EPOCH),
                    uses_topic_ids,
                    created: now,
                    last_used: now,
                    partitions: cached,
                },
            );
            id
        })
    }

    /// After an incremental fetch of session `id`: which of the partitions read (in the order
    /// [`Begin::Incremental`] gave them) the answer lists. A session closed or evicted while
    /// the fetch waited lists them all: the client learns of it on its next fetch.
    pub(crate) fn finish_incremental(&self, id: i32, seen: &[(&PartitionKey, Seen)]) -> Vec<bool> {
        self.with(|s| {
            let Some(session) = s.sessions.get_mut(&id) else {
                return vec![true; seen.len()];
            };
            let mut any = false;
            let listed = seen
                .iter()
                .map(|(key, seen)| match session.partitions.get_mut(*key) {
                    Some(cached) => {
                        let list = cached.update(seen);
                        cached.listed = list;
                        any |= list;
                        list
                    }
                    // Forgotten by a later request while this one waited.
                    None => true,
                })
                .collect();
            if any {
                // Stable: the listed partitions keep their relative order at the back.
                session
                    .partitions
                    .sort_by(|_, a, _, b| a.listed.cmp(&b.listed));
                for cached in session.partitions.values_mut() {
                    cached.listed = false;
                }
            }
            listed
        })
    }
}

impl State {
    fn remove(&mut self, id: i32) -> Option<Session> {
        let session = self.sessions.remove(&id)?;
        self.partitions -= session.partitions.len();
        Some(session)
    }

    /// Kafka's `FetchSessionCache.tryEvict` for a client (non-follower) session of `size`
    /// partitions: a free slot, else the least recently used session if idle past
    /// `eviction_after`, else the smallest session that was older than `eviction_after` when
    /// last used, if smaller than the newcomer. A linear scan: it runs only when a full fetch
    /// finds every slot taken, over at most `slots` sessions.
    fn make_room(&mut self, now: Duration, size: usize) -> bool {
        if self.sessions.len() < self.limits.slots {
            return true;
        }
        let eviction_after = self.limits.eviction_after;
        let stale = self
            .sessions
            .values()
            .min_by_key(|s| (s.last_used, s.id))
            .filter(|s| now.saturating_sub(s.last_used) > eviction_after)
            .map(|s| s.id);
        let victim = stale.or_else(|| {
            self.sessions
                .values()
                .filter(|s| s.last_used.saturating_sub(s.created) > eviction_after)
                .min_by_key(|s| (s.partitions.len(), s.id))
                .filter(|s| s.partitions.len() < size)
                .map(|s| s.id)
        });
        match victim {
            Some(id) => {
                self.remove(id);
                self.evictions += 1;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(partition: i32) -> PartitionKey {
        PartitionKey {
            topic: TopicKey::Name(StrBytes::from_static_str("t")),
            partition,
        }
    }

    fn wants(offset: i64) -> Wants {
        Wants {
            fetch_offset: offset,
            max_bytes: 1 << 20,
            current_leader_epoch: -1,
        }
    }

    fn seen(bytes: usize, high: i64) -> Seen {
        Seen {
            record_bytes: bytes,
            error: 0,
            high_watermark: high,
            last_stable_offset: high,
            log_start_offset: 0,
        }
    }

    fn limits(slots: usize) -> FetchSessionLimits {
        FetchSessionLimits {
            slots,
            max_partitions: 1000,
            eviction_after: Duration::from_secs(120),
        }
    }

    const T0: Duration = Duration::from_secs(1000);

    /// A full fetch of partitions 0..n, all at high watermark 5 with nothing new.
    fn create(cache: &FetchSessions, now: Duration, n: i32) -> i32 {
        let requested: Vec<_> = (0..n).map(|p| (key(p), wants(5))).collect();
        assert_eq!(
            cache.begin(now, 0, INITIAL_EPOCH, false, &requested, &[]),
            Begin::Full { create: true }
        );
        let read: Vec<_> = requested
            .into_iter()
            .map(|(k, w)| (k, w, seen(0, 5)))
            .collect();
        cache.finish_full(now, false, &read)
    }

    fn partitions_of(begin: &Begin) -> Vec<i32> {
        match begin {
            Begin::Incremental { partitions, .. } => {
                partitions.iter().map(|(k, _)| k.partition).collect()
            }
            other => panic!("not incremental: {other:?}"),
        }
    }

    #[test]
    fn a_full_fetch_creates_a_session_and_incremental_fetches_follow_its_epochs() {
        let cache = FetchSessions::new(limits(10), 1);
        let id = create(&cache, T0, 3);
        assert_ne!(id, NO_SESSION);
        assert_eq!(cache.stats().sessions, 1);
        assert_eq!(cache.stats().partitions, 3);
        let first = cache.begin(T0, id, 1, false, &[], &[]);
        assert_eq!(partitions_of(&first), vec![0, 1, 2]);
        // Epoch 1 was used: replaying it is refused, and so is skipping ahead.
        for epoch in [1, 3] {
            assert_eq!(
                cache.begin(T0, id, epoch, false, &[], &[]),
                Begin::Error(FetchSessionError::InvalidEpoch)
            );
        }
        assert!(matches!(
            cache.begin(T0, id, 2, false, &[], &[]),
            Begin::Incremental { .. }
        ));
        assert_eq!(
            cache.begin(T0, id.wrapping_add(1), 3, false, &[], &[]),
            Begin::Error(FetchSessionError::NotFound)
        );
    }

    #[test]
    fn sessionless_fetches_create_nothing_and_a_final_epoch_closes_the_session() {
        let cache = FetchSessions::new(limits(10), 1);
        assert_eq!(
            cache.begin(T0, 0, FINAL_EPOCH, false, &[(key(0), wants(0))], &[]),
            Begin::Full { create: false }
        );
        assert_eq!(cache.stats().sessions, 0);
        let id = create(&cache, T0, 2);
        assert_eq!(
            cache.begin(T0, id, FINAL_EPOCH, false, &[], &[]),
            Begin::Full { create: false }
        );
        assert_eq!(cache.stats(), FetchSessionStats::default());
        assert_eq!(
            cache.begin(T0, id, 1, false, &[], &[]),
            Begin::Error(FetchSessionError::NotFound)
        );
        // A full fetch naming a session replaces it.
        let id = create(&cache, T0, 2);
        cache.begin(T0, id, INITIAL_EPOCH, false, &[], &[]);
        assert_eq!(cache.stats().sessions, 0);
    }

    #[test]
    fn incremental_fetches_add_update_and_forget_partitions() {
        let cache = FetchSessions::new(limits(10), 1);
        let id = create(&cache, T0, 2);
        let begin = cache.begin(
            T0,
            id,
            1,
            false,
            &[(key(1), wants(9)), (key(7), wants(3))],
            &[key(0)],
        );
        match &begin {
            Begin::Incremental { partitions, .. } => {
                assert_eq!(partitions, &vec![(key(1), wants(9)), (key(7), wants(3))])
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(cache.stats().partitions, 2);
        // Forgetting the last partitions closes the session; the fetch is sessionless.
        assert_eq!(
            cache.begin(T0, id, 2, false, &[], &[key(1), key(7)]),
            Begin::Full { create: false }
        );
        assert_eq!(cache.stats(), FetchSessionStats::default());
    }

    #[test]
    fn a_session_keeps_to_the_topic_naming_it_was_created_with() {
        let cache = FetchSessions::new(limits(10), 1);
        let id = create(&cache, T0, 1);
        assert_eq!(
            cache.begin(T0, id, 1, true, &[], &[]),
            Begin::Error(FetchSessionError::TopicIdMismatch)
        );
    }

    #[test]
    fn an_incremental_answer_lists_only_partitions_with_something_new() {
        let cache = FetchSessions::new(limits(10), 1);
        let id = create(&cache, T0, 4);
        let begin = cache.begin(T0, id, 1, false, &[], &[]);
        let keys: Vec<_> = (0..4).map(key).collect();
        let mut log_start_moved = seen(0, 5);
        log_start_moved.log_start_offset = 2;
        let mut failed = seen(0, -1);
        failed.error = 6;
        let read = [
            (&keys[0], seen(0, 5)),
            (&keys[1], seen(100, 6)),
            (&keys[2], log_start_moved),
            (&keys[3], failed),
        ];
        assert_eq!(partitions_of(&begin), vec![0, 1, 2, 3]);
        assert_eq!(
            cache.finish_incremental(id, &read),
            vec![false, true, true, true]
        );
        // Listed partitions went to the back; nothing new now except the failing partition.
        let begin = cache.begin(T0, id, 2, false, &[], &[]);
        assert_eq!(partitions_of(&begin), vec![0, 1, 2, 3]);
        let read = [
            (&keys[0], seen(0, 5)),
            (&keys[1], seen(0, 6)),
            (&keys[2], log_start_moved),
            (&keys[3], seen(0, 5)),
        ];
        // The partition that failed is listed once it recovers (its watermark was forgotten).
        assert_eq!(
            cache.finish_incremental(id, &read),
            vec![false, false, false, true]
        );
        let read = [
            (&keys[0], seen(0, 5)),
            (&keys[1], seen(0, 6)),
            (&keys[2], log_start_moved),
            (&keys[3], seen(0, 5)),
        ];
        cache.begin(T0, id, 3, false, &[], &[]);
        assert_eq!(cache.finish_incremental(id, &read), vec![false; 4]);
    }

    #[test]
    fn partitions_listed_move_to_the_back_of_the_next_read() {
        let cache = FetchSessions::new(limits(10), 1);
        let id = create(&cache, T0, 3);
        cache.begin(T0, id, 1, false, &[], &[]);
        let keys: Vec<_> = (0..3).map(key).collect();
        cache.finish_incremental(
            id,
            &[
                (&keys[0], seen(10, 6)),
                (&keys[1], seen(0, 5)),
                (&keys[2], seen(0, 5)),
            ],
        );
        assert_eq!(
            partitions_of(&cache.begin(T0, id, 2, false, &[], &[])),
            vec![1, 2, 0]
        );
    }

    #[test]
    fn a_full_cache_evicts_an_idle_session_and_otherwise_a_smaller_old_one() {
        let cache = FetchSessions::new(limits(2), 1);
        let a = create(&cache, T0, 3);
        let b = create(&cache, T0, 5);
        // Both slots busy and nobody idle or old: no session for a newcomer.
        assert_eq!(create(&cache, T0 + Duration::from_secs(60), 10), NO_SESSION);
        assert_eq!(cache.stats().evictions, 0);
        // `b` stays in use; `a` goes idle past the eviction time and makes way for anyone.
        let later = T0 + Duration::from_secs(121);
        cache.begin(later, b, 1, false, &[], &[]);
        let c = create(&cache, later, 1);
        assert_ne!(c, NO_SESSION);
        assert_eq!(cache.stats().evictions, 1);
        assert_eq!(
            cache.begin(later, a, 1, false, &[], &[]),
            Begin::Error(FetchSessionError::NotFound)
        );
        // Nobody idle now; `b` (5 partitions, older than the eviction time when last used)
        // gives way to a larger newcomer only, and `c` is too young to be evicted at all.
        assert_eq!(create(&cache, later, 5), NO_SESSION);
        let d = create(&cache, later, 6);
        assert_ne!(d, NO_SESSION);
        assert_eq!(cache.stats().evictions, 2);
        assert_eq!(
            cache.begin(later, b, 2, false, &[], &[]),
            Begin::Error(FetchSessionError::NotFound)
        );
        assert_eq!(cache.stats().sessions, 2);
        assert_eq!(cache.stats().partitions, 7);
    }

    #[test]
    fn the_partition_budget_bounds_new_and_growing_sessions() {
        let cache = FetchSessions::new(
            FetchSessionLimits {
                max_partitions: 4,
                ..limits(10)
            },
            1,
        );
        assert_eq!(create(&cache, T0, 5), NO_SESSION);
        let id = create(&cache, T0, 3);
        assert_ne!(id, NO_SESSION);
        assert!(matches!(
            cache.begin(T0, id, 1, false, &[(key(3), wants(0))], &[]),
            Begin::Incremental { .. }
        ));
        assert_eq!(
            cache.begin(T0, id, 2, false, &[(key(4), wants(0))], &[]),
            Begin::Error(FetchSessionError::NotFound)
        );
        assert_eq!(cache.stats(), FetchSessionStats::default());
    }

    #[test]
    fn epochs_wrap_to_one() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(-1), -1);
    }
}
