//! Reads of compacted segments for readers that fell behind (catch-up reads): a read-ahead
//! window cache shared by all readers, and the IO budget those reads are held to.
//!
//! A reader behind the tail cache fetches from segments, one storage request per fetch of at
//! most `partition_max_bytes` (1 MiB for librdkafka). On S3 each such request pays tens of
//! milliseconds of latency and a GET price; on any backend a reader replaying gigabytes takes
//! storage bandwidth and CPU from the producers and tail readers that matter more. So:
//!
//! - **Windows (opt-in, off by default).** Segments are read in aligned windows of
//!   `read_ahead_bytes` and the windows
//!   are kept, broker-wide, up to `read_ahead_memory_bytes`. A sequential reader makes one
//!   request per window instead of one per fetch, and several readers of the same old data (a
//!   replay by many consumer groups) share them. Segments never change under their key (a
//!   cleaned segment gets a new one), so a kept window is never stale; a window of a segment
//!   deleted since is what a reader just before the delete would have read. A fetch's batches
//!   are slices of the windows; only a batch that straddles two windows is copied. Off by
//!   default: measured slower than the page cache's own read-ahead on a local directory
//!   (docs/BENCHMARKS.md, "Readers behind the tail").
//! - **Passed windows go first.** A read of window w marks window w-1 of the same segment as
//!   passed: its reader has moved on, and only a slower reader of the same data could still
//!   want it. When memory is needed, passed windows are dropped (oldest first) before any
//!   window a reader has yet to reach, and only then the oldest of those.
//! - **Read-ahead only into free memory.** A read that used window w starts reading window w+1
//!   in the background if nobody holds it, an IO slot is free now (read-ahead never queues
//!   before a waiting reader), and the window fits in memory not held by windows readers have
//!   yet to reach. Without that rule eight partitions replayed at once with room for eight
//!   windows thrashed: each read-ahead dropped a window another reader was about to use, and
//!   every fetch re-read a whole window (measured on S3 at a quarter of the speed of no
//!   windows). Now a budget too small for read-ahead degrades to one request per window.
//! - **IO budget.** Every segment read (a reader's or a read-ahead) takes one of
//!   `catchup_max_concurrent_reads` slots and is paced, broker-wide, to
//!   `catchup_io_max_bytes_per_second`. Producers' write-ahead writes and reads of the
//!   uncompacted tail are outside it, so a replay of old data cannot take their bandwidth.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use strata_core::Clock;
use strata_storage::ObjectStore;
use tokio::sync::{watch, Semaphore};

use crate::read::read_range;
use crate::shared::lock_mutex;
use crate::LogResult;

/// One window: (segment key, window number).
type WindowId = (Arc<str>, u32);

/// Settings, from [`crate::LogConfig`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadAheadConfig {
    /// Window size in bytes; 0 reads exactly what each fetch needs and keeps nothing.
    pub window: u32,
    /// Memory for kept windows, broker-wide.
    pub memory: usize,
    /// Segment reads in flight at once, broker-wide.
    pub max_concurrent_reads: usize,
    /// Segment bytes read a second, broker-wide (u64::MAX: unpaced).
    pub max_bytes_per_second: u64,
}

/// A kept window.
#[derive(Debug)]
struct Kept {
    bytes: Bytes,
    /// A reader has moved on to the next window: dropped before windows not yet passed.
    passed: bool,
    /// A reader has used it; a window read ahead and not yet used is dropped before one a
    /// reader is in (losing it costs one read of it, losing a reader's costs one per fetch).
    used: bool,
}

#[derive(Debug, Default)]
struct Windows {
    kept: HashMap<WindowId, Kept>,
    /// Insertion order, for eviction; an id may appear once.
    order: VecDeque<WindowId>,
    used: usize,
    /// Bytes of kept windows marked passed (part of `used`).
    passed: usize,
    /// Bytes of read-aheads in flight, counted against memory before they arrive.
    reserved: usize,
    /// Windows a read-ahead is fetching now; the value turns true (or its sender goes) when
    /// the fetch ends, for readers that need the window meanwhile.
    fetching: HashMap<WindowId, watch::Receiver<bool>>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ReadAheadStats {
    /// Segment reads answered from kept windows alone.
    pub hits: AtomicU64,
    /// Segment reads that went to storage.
    pub misses: AtomicU64,
    /// Windows read ahead in the background.
    pub prefetches: AtomicU64,
    /// Bytes read from segments in storage (readers' and read-ahead's).
    pub bytes_read: AtomicU64,
    /// Time readers waited for an IO slot or for the pace, in microseconds.
    pub throttled_micros: AtomicU64,
    /// Read-aheads not started because memory was held by windows readers have yet to reach.
    pub skipped: AtomicU64,
    /// Windows dropped for room before their reader passed them (thrashing, if it grows).
    pub dropped_unpassed: AtomicU64,
}

/// A reading of [`ReadAheadStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadAheadSnapshot {
    pub hits: u64,
    pub misses: u64,
    pub prefetches: u64,
    pub bytes_read: u64,
    pub throttled_micros: u64,
    pub skipped: u64,
    pub dropped_unpassed: u64,
    /// Bytes of windows kept now.
    pub kept_bytes: u64,
}

#[derive(Debug)]
pub(crate) struct ReadAhead {
    config: ReadAheadConfig,
    windows: Mutex<Windows>,
    slots: Arc<Semaphore>,
    /// The monotonic time from which the pace admits the next read.
    pace_next: Mutex<Duration>,
    pub stats: ReadAheadStats,
}

impl ReadAhead {
    pub fn new(config: ReadAheadConfig) -> Self {
        Self {
            config,
            windows: Mutex::new(Windows::default()),
            slots: Arc::new(Semaphore::new(config.max_concurrent_reads.max(1))),
            pace_next: Mutex::new(Duration::ZERO),
            stats: ReadAheadStats::default(),
        }
    }

    /// Whether reads go through windows (`read_ahead_bytes` > 0).
    pub fn windows_on(&self) -> bool {
        self.config.window > 0
    }

    pub fn snapshot(&self) -> ReadAheadSnapshot {
        let kept_bytes = lock_mutex(&self.windows).used as u64;
        ReadAheadSnapshot {
            hits: self.stats.hits.load(Ordering::Relaxed),
            misses: self.stats.misses.load(Ordering::Relaxed),
            prefetches: self.stats.prefetches.load(Ordering::Relaxed),
            bytes_read: self.stats.bytes_read.load(Ordering::Relaxed),
            throttled_micros: self.stats.throttled_micros.load(Ordering::Relaxed),
            skipped: self.stats.skipped.load(Ordering::Relaxed),
            dropped_unpassed: self.stats.dropped_unpassed.load(Ordering::Relaxed),
            kept_bytes,
        }
    }

    /// Bytes `[start, end)` of the segment `key`, whose object is `size` bytes long (None when
    /// the manifest does not list it, e.g. a segment a cleaning pass just replaced: then exactly
    /// the range is read and nothing is kept).
    pub async fn read(
        self: &Arc<Self>,
        store: &Arc<dyn ObjectStore>,
        clock: &Arc<dyn Clock>,
        key: &str,
        size: Option<u64>,
        start: u32,
        end: u32,
    ) -> LogResult<Run> {
        if end <= start {
            return Ok(Run::whole(Bytes::new()));
        }
        let window = self.config.window;
        let size = match size {
            Some(size) if window > 0 && u64::from(end) <= size => size,
            _ => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                return Ok(Run::whole(
                    self.fetch(store, clock, key, start, end - start).await?,
                ));
            }
        };
        let (first, last) = (start / window, (end - 1) / window);
        let key: Arc<str> = Arc::from(key);
        // The window before this read's, and all of this read's but its last, are behind its
        // reader once it returns: if memory is needed for the windows read below, they go
        // first.
        self.mark_passed(&key, first.saturating_sub(1)..last);
        let mut kept = self.kept(&key, first, last);
        if let Err(pending) = &mut kept {
            // Windows being read ahead are waited for rather than read twice (once).
            if !pending.is_empty() {
                for rx in pending.iter_mut() {
                    // Err: the read-ahead task ended without saying; the check below decides.
                    let _ = rx.wait_for(|done| *done).await;
                }
                kept = self.kept(&key, first, last);
            }
        }
        let parts = match kept.ok() {
            Some(parts) => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                parts
            }
            None => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                // One request for the windows missing (a fetch across a boundary usually
                // finds the first window kept and needs only the next), split after.
                let have = self.peek(&key, first, last);
                let missing = |n: &u32| have[(n - first) as usize].is_none();
                let lo = (first..=last).find(missing).unwrap_or(first);
                let hi = (first..=last).rev().find(missing).unwrap_or(last);
                let from = lo * window;
                let to = window_end(hi, window, size);
                let bytes = self.fetch(store, clock, &key, from, to - from).await?;
                let mut parts = Vec::with_capacity(have.len());
                for (n, kept) in (first..).zip(have) {
                    let part = match kept {
                        Some(part) if !(lo..=hi).contains(&n) => part,
                        _ => {
                            let a = (n * window - from) as usize;
                            let b = (window_end(n, window, size) - from) as usize;
                            let part = bytes.slice(a..b);
                            // All but the last are behind the reader once this read returns:
                            // kept as passed, so they cannot push out a window another reader
                            // is in.
                            self.keep((Arc::clone(&key), n), part.clone(), true, n < last);
                            part
                        }
                    };
                    parts.push(part);
                }
                parts
            }
        };
        self.read_ahead(store, clock, &key, last + 1, size);
        Ok(Run {
            parts,
            offset: (start - first * window) as usize,
            len: (end - start) as usize,
        })
    }

    /// Marks the kept windows `range` of `key` as passed by their reader.
    fn mark_passed(&self, key: &Arc<str>, range: std::ops::Range<u32>) {
        if range.is_empty() {
            return;
        }
        let mut w = lock_mutex(&self.windows);
        for n in range {
            let id = (Arc::clone(key), n);
            let newly = match w.kept.get_mut(&id) {
                Some(kept) if !kept.passed => {
                    kept.passed = true;
                    kept.bytes.len()
                }
                _ => 0,
            };
            w.passed += newly;
        }
    }

    /// Windows `first..=last` of `key` if all are kept; else the read-aheads to wait for
    /// when every missing one is being read, or none when some must be read here.
    fn kept(
        &self,
        key: &Arc<str>,
        first: u32,
        last: u32,
    ) -> Result<Vec<Bytes>, Vec<watch::Receiver<bool>>> {
        let mut w = lock_mutex(&self.windows);
        let mut parts = Vec::new();
        let mut pending = Vec::new();
        for n in first..=last {
            let id = (Arc::clone(key), n);
            if let Some(kept) = w.kept.get_mut(&id) {
                kept.used = true;
                parts.push(kept.bytes.clone());
            } else if let Some(rx) = w.fetching.get(&id) {
                pending.push(rx.clone());
            } else {
                return Err(Vec::new());
            }
        }
        if pending.is_empty() {
            Ok(parts)
        } else {
            Err(pending)
        }
    }

    /// Windows `first..=last` of `key` as kept now, each or None.
    fn peek(&self, key: &Arc<str>, first: u32, last: u32) -> Vec<Option<Bytes>> {
        let w = lock_mutex(&self.windows);
        (first..=last)
            .map(|n| {
                w.kept
                    .get(&(Arc::clone(key), n))
                    .map(|kept| kept.bytes.clone())
            })
            .collect()
    }

    /// One ranged read within the IO budget.
    async fn fetch(
        &self,
        store: &Arc<dyn ObjectStore>,
        clock: &Arc<dyn Clock>,
        key: &str,
        position: u32,
        length: u32,
    ) -> LogResult<Bytes> {
        let waited_from = clock.monotonic();
        let _slot = self.slots.acquire().await;
        self.pace(clock.as_ref(), length).await;
        let waited = clock.monotonic().saturating_sub(waited_from);
        self.stats
            .throttled_micros
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        let bytes = read_range(store.as_ref(), key, position, length).await?;
        self.stats
            .bytes_read
            .fetch_add(u64::from(length), Ordering::Relaxed);
        Ok(bytes)
    }

    /// Waits until the broker-wide pace admits `bytes` more. Each read reserves its share of
    /// time in turn, so concurrent readers split the rate instead of each taking all of it.
    async fn pace(&self, clock: &dyn Clock, bytes: u32) {
        let rate = self.config.max_bytes_per_second;
        if rate == 0 || rate == u64::MAX {
            return;
        }
        let now = clock.monotonic();
        let admitted = {
            let mut next = lock_mutex(&self.pace_next);
            let admitted = (*next).max(now);
            *next = admitted + Duration::from_secs_f64(f64::from(bytes) / rate as f64);
            admitted
        };
        if admitted > now {
            clock.sleep(admitted - now).await;
        }
    }

    /// Starts reading window `n` of `key` in the background if it exists, is not kept or being
    /// read, an IO slot is free now, and it fits in memory no reader still needs.
    fn read_ahead(
        self: &Arc<Self>,
        store: &Arc<dyn ObjectStore>,
        clock: &Arc<dyn Clock>,
        key: &Arc<str>,
        n: u32,
        size: u64,
    ) {
        let window = self.config.window;
        if u64::from(n) * u64::from(window) >= size {
            return;
        }
        let id = (Arc::clone(key), n);
        let from = n * window;
        let length = window_end(n, window, size) - from;
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            return;
        };
        let done = {
            let mut w = lock_mutex(&self.windows);
            if w.kept.contains_key(&id) || w.fetching.contains_key(&id) {
                return;
            }
            // Free memory: what windows not yet passed and read-aheads in flight leave. Taking
            // more would drop a window some reader is about to use, for one it may not.
            let wanted = w.used - w.passed + w.reserved + length as usize;
            if wanted > self.config.memory {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            w.reserved += length as usize;
            let (done, rx) = watch::channel(false);
            w.fetching.insert(id.clone(), rx);
            done
        };
        let (this, store, clock) = (Arc::clone(self), Arc::clone(store), Arc::clone(clock));
        tokio::spawn(async move {
            this.pace(clock.as_ref(), length).await;
            let result = read_range(store.as_ref(), &id.0, from, length).await;
            drop(slot);
            match result {
                Ok(bytes) => {
                    this.stats.prefetches.fetch_add(1, Ordering::Relaxed);
                    this.stats
                        .bytes_read
                        .fetch_add(u64::from(length), Ordering::Relaxed);
                    this.keep(id.clone(), bytes, false, false);
                }
                // A reader that needs the window reads it itself and sees the error.
                Err(e) => tracing::debug!(key = %id.0, window = n, error = %e, "read-ahead failed"),
            }
            // Kept first, then no longer fetching: a waiting reader finds it.
            {
                let mut w = lock_mutex(&this.windows);
                w.fetching.remove(&id);
                w.reserved -= length as usize;
            }
            let _ = done.send(true);
        });
    }

    /// Keeps a window (`used` when a reader read it itself, `passed` when that reader is already
    /// past it), dropping windows while over the memory budget: the oldest passed one first,
    /// then the oldest read ahead and not yet used, then the oldest.
    fn keep(&self, id: WindowId, bytes: Bytes, used: bool, passed: bool) {
        let len = bytes.len();
        if len > self.config.memory {
            return;
        }
        let mut w = lock_mutex(&self.windows);
        let kept = Kept {
            bytes,
            passed,
            used,
        };
        if let Some(old) = w.kept.insert(id.clone(), kept) {
            // Same bytes again (two readers raced to read it): keep its place in the order.
            w.used -= old.bytes.len();
            if old.passed {
                w.passed -= old.bytes.len();
            }
        } else {
            w.order.push_back(id);
        }
        w.used += len;
        if passed {
            w.passed += len;
        }
        while w.used > self.config.memory {
            // Windows are few (memory / window), so a scan is cheap.
            let rank = |id: &WindowId| match w.kept.get(id) {
                Some(k) if k.passed => 0,
                Some(k) if !k.used => 1,
                _ => 2,
            };
            let victim = (0..3)
                .find_map(|r| w.order.iter().position(|id| rank(id) == r))
                .unwrap_or(0);
            let Some(gone) = w.order.remove(victim) else {
                break;
            };
            if let Some(gone) = w.kept.remove(&gone) {
                w.used -= gone.bytes.len();
                if gone.passed {
                    w.passed -= gone.bytes.len();
                } else {
                    self.stats.dropped_unpassed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The bytes of one read, as the windows hold them: a batch within one window is a slice of
/// it; only a batch that straddles two windows is copied.
#[derive(Debug)]
pub(crate) struct Run {
    parts: Vec<Bytes>,
    /// Where the read starts in `parts[0]`.
    offset: usize,
    len: usize,
}

impl Run {
    fn whole(bytes: Bytes) -> Self {
        let len = bytes.len();
        Self {
            parts: vec![bytes],
            offset: 0,
            len,
        }
    }

    /// `len` bytes from `from` within the read (the caller's index entries keep it in range).
    pub fn slice(&self, from: usize, len: usize) -> Bytes {
        debug_assert!(from + len <= self.len);
        assemble(&self.parts, self.offset + from, len)
    }

    #[cfg(test)]
    fn bytes(&self) -> Bytes {
        self.slice(0, self.len)
    }
}

/// One past the last byte of window `n` in an object of `size` bytes.
fn window_end(n: u32, window: u32, size: u64) -> u32 {
    let end = (u64::from(n) + 1) * u64::from(window);
    // Positions within a segment are u32 (index entries), so the size fits.
    end.min(size) as u32
}

/// `length` bytes from `offset` into the concatenation of `parts`: a slice when one part holds
/// them all (the usual case), else a copy of the pieces.
fn assemble(parts: &[Bytes], offset: usize, length: usize) -> Bytes {
    let mut start = offset;
    for part in parts {
        if start < part.len() {
            if start + length <= part.len() {
                return part.slice(start..start + length);
            }
            break;
        }
        start -= part.len();
    }
    let mut out = BytesMut::with_capacity(length);
    let mut skip = offset;
    for part in parts {
        if skip >= part.len() {
            skip -= part.len();
            continue;
        }
        let take = (part.len() - skip).min(length - out.len());
        out.extend_from_slice(&part[skip..skip + take]);
        skip = 0;
        if out.len() == length {
            break;
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::clock::ManualClock;
    use strata_storage::{MemoryStore, ObjectKey, PutMode};

    const KEY: &str = "log/t/0/seg/0-1";

    /// A store holding one `len`-byte object whose byte i is i mod 251.
    async fn store_with_object(len: usize) -> (Arc<dyn ObjectStore>, Vec<u8>) {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        store
            .put(
                &ObjectKey::new(KEY).unwrap(),
                Bytes::from(body.clone()),
                PutMode::Create,
            )
            .await
            .unwrap();
        (store, body)
    }

    fn read_ahead(window: u32, memory: usize, rate: u64) -> Arc<ReadAhead> {
        Arc::new(ReadAhead::new(ReadAheadConfig {
            window,
            memory,
            max_concurrent_reads: 4,
            max_bytes_per_second: rate,
        }))
    }

    /// Lets spawned read-aheads run until `done` holds (a memory store answers at once).
    async fn settle(ra: &ReadAhead, done: impl Fn(&ReadAheadSnapshot) -> bool) {
        for _ in 0..10_000 {
            if done(&ra.snapshot()) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("read-ahead did not settle: {:?}", ra.snapshot());
    }

    #[tokio::test]
    async fn a_sequential_reader_reads_each_window_once_and_finds_the_next_one_read_ahead() {
        let (store, body) = store_with_object(10_000).await;
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let ra = read_ahead(1_000, 100_000, u64::MAX);
        // Fetches of 300 bytes from 0 to the end, as a consumer replaying the segment.
        let mut position = 0u32;
        while position < 10_000 {
            let end = (position + 300).min(10_000);
            let got = ra
                .read(&store, &clock, KEY, Some(10_000), position, end)
                .await
                .unwrap();
            assert_eq!(&got.bytes()[..], &body[position as usize..end as usize]);
            position = end;
        }
        let s = ra.snapshot();
        assert_eq!(
            s.bytes_read, 10_000,
            "every byte read from storage exactly once: {s:?}"
        );
        assert_eq!(
            s.misses, 1,
            "only the first fetch waited for storage: {s:?}"
        );
        assert_eq!(s.prefetches, 9, "{s:?}");
    }

    #[tokio::test]
    async fn a_read_across_windows_is_one_request_and_returns_exactly_its_bytes() {
        let (store, body) = store_with_object(5_000).await;
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let ra = read_ahead(1_000, 100_000, u64::MAX);
        let got = ra
            .read(&store, &clock, KEY, Some(5_000), 900, 3_100)
            .await
            .unwrap();
        assert_eq!(&got.bytes()[..], &body[900..3_100]);
        assert_eq!(ra.snapshot().misses, 1);
        // The windows it spanned (0..4000) are kept: a read inside them needs no request.
        settle(&ra, |s| s.prefetches == 1).await;
        let before = ra.snapshot().bytes_read;
        let got = ra
            .read(&store, &clock, KEY, Some(5_000), 0, 4_000)
            .await
            .unwrap();
        assert_eq!(&got.bytes()[..], &body[..4_000]);
        assert_eq!(ra.snapshot().hits, 1);
        assert_eq!(ra.snapshot().bytes_read, before);
    }

    #[tokio::test]
    async fn kept_windows_stay_within_the_memory_budget() {
        let (store, body) = store_with_object(20_000).await;
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let ra = read_ahead(1_000, 3_000, u64::MAX);
        for start in (0..20_000).step_by(1_000) {
            let got = ra
                .read(&store, &clock, KEY, Some(20_000), start, start + 1_000)
                .await
                .unwrap();
            assert_eq!(
                &got.bytes()[..],
                &body[start as usize..start as usize + 1_000]
            );
            assert!(ra.snapshot().kept_bytes <= 3_000, "{:?}", ra.snapshot());
        }
    }

    #[tokio::test]
    async fn without_a_window_or_a_known_size_exactly_the_range_is_read_and_nothing_kept() {
        let (store, body) = store_with_object(5_000).await;
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let off = read_ahead(0, 100_000, u64::MAX);
        let got = off
            .read(&store, &clock, KEY, Some(5_000), 10, 20)
            .await
            .unwrap();
        assert_eq!(&got.bytes()[..], &body[10..20]);
        let on = read_ahead(1_000, 100_000, u64::MAX);
        let got = on.read(&store, &clock, KEY, None, 10, 20).await.unwrap();
        assert_eq!(&got.bytes()[..], &body[10..20]);
        for ra in [off, on] {
            let s = ra.snapshot();
            assert_eq!(
                (s.bytes_read, s.kept_bytes, s.prefetches),
                (10, 0, 0),
                "{s:?}"
            );
        }
    }

    #[tokio::test]
    async fn reads_are_paced_to_the_byte_rate_broker_wide() {
        let (store, _) = store_with_object(5_000).await;
        let manual = Arc::new(ManualClock::new(0));
        let clock: Arc<dyn Clock> = manual.clone();
        // 1,000 bytes a second, no windows: each 500-byte read books half a second.
        let ra = read_ahead(0, 0, 1_000);
        ra.read(&store, &clock, KEY, None, 0, 500).await.unwrap();
        let second = tokio::spawn({
            let (ra, store, clock) = (Arc::clone(&ra), Arc::clone(&store), Arc::clone(&clock));
            async move { ra.read(&store, &clock, KEY, None, 500, 1_000).await }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!second.is_finished(), "the second read waits for its turn");
        assert_eq!(ra.snapshot().bytes_read, 500);
        manual.advance(Duration::from_millis(500));
        second.await.unwrap().unwrap();
        assert_eq!(ra.snapshot().bytes_read, 1_000);
        assert_eq!(ra.snapshot().throttled_micros, 500_000);
    }

    /// Four readers replaying four segments side by side, `fetch` bytes per fetch, each read
    /// followed by its read-ahead settling; returns the counters.
    async fn four_readers_side_by_side(memory: usize, fetch: u32) -> ReadAheadSnapshot {
        const LEN: u32 = 8_000;
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let body: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
        let keys: Vec<String> = (0..4).map(|r| format!("log/t/{r}/seg/0-1")).collect();
        for key in &keys {
            store
                .put(
                    &ObjectKey::new(key).unwrap(),
                    Bytes::from(body.clone()),
                    PutMode::Create,
                )
                .await
                .unwrap();
        }
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let ra = read_ahead(1_000, memory, u64::MAX);
        let mut position = 0u32;
        while position < LEN {
            let end = (position + fetch).min(LEN);
            for key in &keys {
                let got = ra
                    .read(&store, &clock, key, Some(u64::from(LEN)), position, end)
                    .await
                    .unwrap();
                assert_eq!(&got.bytes()[..], &body[position as usize..end as usize]);
                for _ in 0..10_000 {
                    if lock_mutex(&ra.windows).fetching.is_empty() {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                assert!(ra.snapshot().kept_bytes <= memory as u64);
            }
            position = end;
        }
        ra.snapshot()
    }

    #[tokio::test]
    async fn readers_side_by_side_with_two_windows_each_read_every_byte_once() {
        // Room for a window and its read-ahead per reader. Dropping the oldest window first
        // dropped a window its reader was still in whenever another reader's read-ahead
        // arrived; passed windows go first now.
        let s = four_readers_side_by_side(8_000, 250).await;
        assert_eq!(s.bytes_read, 4 * 8_000, "{s:?}");
        assert_eq!(s.dropped_unpassed, 0, "{s:?}");
        assert_eq!(s.misses, 4, "only each reader's first fetch waited: {s:?}");
    }

    #[tokio::test]
    async fn with_room_for_one_window_per_reader_read_ahead_stops_instead_of_thrashing() {
        // Room for one window per reader: read-ahead would have to drop a window another
        // reader is in. It is skipped, so each window is read once by its reader (the two
        // read-aheads started before memory filled are dropped unused, read once more).
        let s = four_readers_side_by_side(4_000, 250).await;
        assert!(s.bytes_read <= 4 * 8_000 + 2 * 1_000, "{s:?}");
        assert!(s.skipped > 0, "{s:?}");
        assert_eq!(s.misses, 4 * 8, "one request per window: {s:?}");
    }

    #[tokio::test]
    async fn a_fetch_across_two_windows_reads_only_the_missing_one_and_passes_the_first() {
        // Fetches of 300 bytes straddle window boundaries. Such a miss used to read both
        // windows again, and to keep the first as not passed although its reader was leaving
        // it, pushing out windows other readers were in: 1.7x the data read and 22 windows
        // dropped early, with room for one window per reader.
        let s = four_readers_side_by_side(4_000, 300).await;
        assert!(s.bytes_read <= 4 * 8_000 + 2 * 1_000, "{s:?}");
        assert!(s.dropped_unpassed <= 2, "{s:?}");
    }

    #[test]
    fn assemble_slices_within_one_part_and_copies_across_parts() {
        let parts = [Bytes::from_static(b"abcd"), Bytes::from_static(b"efgh")];
        assert_eq!(&assemble(&parts, 1, 2)[..], b"bc");
        assert_eq!(&assemble(&parts, 2, 4)[..], b"cdef");
        assert_eq!(&assemble(&parts, 4, 4)[..], b"efgh");
        assert_eq!(&assemble(&parts, 0, 8)[..], b"abcdefgh");
    }

    #[test]
    fn the_last_window_ends_at_the_object() {
        assert_eq!(window_end(0, 10, 25), 10);
        assert_eq!(window_end(2, 10, 25), 25);
    }
}
