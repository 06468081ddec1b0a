//! Kafka-level traffic counts for `/metrics`: requests, their latency and the ones refused,
//! per API; bytes and records produced and bytes fetched, per topic; connections open and
//! accepted. What a Kafka operator reads off `kafka.network:type=RequestMetrics` and
//! `kafka.server:type=BrokerTopicMetrics`, counted in memory and rendered by the server's
//! metrics endpoint.
//!
//! Counting stays off the hot path's locks: per-API counters are atomics in a table indexed by
//! API key, and a topic's counters are found under a read lock, taken for writing only the
//! first time a topic is seen. Topic names come from clients (auto-creation), so the number of
//! topics with their own series is bounded ([`MAX_TOPIC_SERIES`]); traffic of later topics
//! is still counted, under one `omitted` total, so the sums stay right.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kafka_protocol::messages::ApiKey;

/// Upper bounds (seconds) of the request latency histogram's buckets; `+Inf` is implied.
/// From half a millisecond (a metadata answer) to ten seconds (a long-polled fetch or a
/// produce waiting on slow storage).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Topics with series of their own; traffic of any further topic is counted as omitted.
pub const MAX_TOPIC_SERIES: usize = 1000;

/// API keys the table has room for (Kafka's keys are below 100).
const API_SLOTS: usize = 128;

/// Error codes with a counter of their own per API: Kafka's run from -1 to about 130; a code
/// past the table (none is sent today) is counted in the last slot, named `OTHER`.
const ERROR_SLOTS: usize = 192;

#[derive(Default)]
struct ApiCounters {
    requests: AtomicU64,
    refused: AtomicU64,
    /// Cumulative counts are computed at render time; each slot counts its own bucket.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    micros: AtomicU64,
    /// Responses' error codes by code + 1 (so `UNKNOWN_SERVER_ERROR`, -1, is slot 0); made on
    /// the API's first error tally, so the table costs memory only for APIs in use.
    errors: std::sync::OnceLock<Box<[AtomicU64; ERROR_SLOTS]>>,
}

#[derive(Default)]
struct TopicCounters {
    bytes_in: AtomicU64,
    records_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// One API's counts as of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiTraffic {
    pub api: &'static str,
    pub requests: u64,
    pub refused: u64,
    /// Per bucket of [`LATENCY_BUCKETS`] then `+Inf`, not cumulative.
    pub buckets: Vec<u64>,
    pub seconds: f64,
    /// Error codes the API's responses carried, by Kafka's name (`NONE` for success), with
    /// how often; only codes seen.
    pub errors: Vec<(String, u64)>,
}

/// One topic's counts as of a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicTraffic {
    pub bytes_in: u64,
    pub records_in: u64,
    pub bytes_out: u64,
}

/// Everything [`Traffic`] counted, as of one scrape.
#[derive(Debug, Clone, Default)]
pub struct TrafficSnapshot {
    /// APIs that saw at least one request, by key.
    pub apis: Vec<ApiTraffic>,
    /// Topics by name, sorted.
    pub topics: Vec<(String, TopicTraffic)>,
    /// Traffic of topics beyond [`MAX_TOPIC_SERIES`].
    pub omitted: TopicTraffic,
    pub connections_open: i64,
    pub connections_accepted: u64,
}

/// The broker's traffic counters.
pub struct Traffic {
    apis: Vec<ApiCounters>,
    topics: RwLock<HashMap<Arc<str>, Arc<TopicCounters>>>,
    omitted: TopicCounters,
    connections_open: AtomicI64,
    connections_accepted: AtomicU64,
}

impl std::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traffic")
            .field(
                "connections_open",
                &self.connections_open.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl Default for Traffic {
    fn default() -> Self {
        Self {
            apis: (0..API_SLOTS).map(|_| ApiCounters::default()).collect(),
            topics: RwLock::new(HashMap::new()),
            omitted: TopicCounters::default(),
            connections_open: AtomicI64::new(0),
            connections_accepted: AtomicU64::new(0),
        }
    }
}

impl Traffic {
    /// Counts one request of `api_key` that took `elapsed` from its frame to its reply;
    /// `refused` when the broker answered it by closing the connection (an unsupported
    /// version, an unreadable body).
    pub(crate) fn request(&self, api_key: i16, elapsed: Duration, refused: bool) {
        let Some(counters) = usize::try_from(api_key)
            .ok()
            .and_then(|key| self.apis.get(key))
        else {
            return;
        };
        counters.requests.fetch_add(1, Ordering::Relaxed);
        if refused {
            counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        counters.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        counters.micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Counts the error codes of one response of `api_key`.
    pub(crate) fn errors(&self, api_key: i16, codes: &[(i16, u64)]) {
        if codes.is_empty() {
            return;
        }
        let Some(counters) = usize::try_from(api_key)
            .ok()
            .and_then(|key| self.apis.get(key))
        else {
            return;
        };
        let table = counters
            .errors
            .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
        for &(code, count) in codes {
            let slot = usize::try_from(i32::from(code) + 1)
                .unwrap_or(ERROR_SLOTS - 1)
                .min(ERROR_SLOTS - 1);
            table[slot].fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Counts a batch set accepted for `topic`: its bytes and the records its batch headers
    /// declare.
    pub(crate) fn produced(&self, topic: &Arc<str>, records: &[u8]) {
        let counters = self.topic(topic);
        let counters = counters.as_deref().unwrap_or(&self.omitted);
        counters
            .bytes_in
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        counters
            .records_in
            .fetch_add(record_count(records), Ordering::Relaxed);
    }

    /// Counts record bytes sent to a consumer (or follower-less reader) of `topic`.
    pub(crate) fn fetched(&self, topic: &Arc<str>, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let counters = self.topic(topic);
        let counters = counters.as_deref().unwrap_or(&self.omitted);
        counters.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        self.connections_accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_closed(&self) {
        self.connections_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// The counters of `topic`, created on first use while there is room for its series.
    fn topic(&self, topic: &Arc<str>) -> Option<Arc<TopicCounters>> {
        if let Ok(topics) = self.topics.read() {
            if let Some(counters) = topics.get(topic) {
                return Some(Arc::clone(counters));
            }
        }
        let mut topics = self.topics.write().ok()?;
        if let Some(counters) = topics.get(topic) {
            return Some(Arc::clone(counters));
        }
        if topics.len() >= MAX_TOPIC_SERIES {
            return None;
        }
        let counters = Arc::new(TopicCounters::default());
        topics.insert(Arc::clone(topic), Arc::clone(&counters));
        Some(counters)
    }

    pub fn snapshot(&self) -> TrafficSnapshot {
        let apis = self
            .apis
            .iter()
            .enumerate()
            .filter_map(|(key, c)| {
                let requests = c.requests.load(Ordering::Relaxed);
                let api = i16::try_from(key).ok().and_then(api_name)?;
                (requests > 0).then(|| ApiTraffic {
                    api,
                    requests,
                    refused: c.refused.load(Ordering::Relaxed),
                    buckets: c
                        .buckets
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect(),
                    seconds: c.micros.load(Ordering::Relaxed) as f64 / 1e6,
                    errors: error_counts(c),
                })
            })
            .collect();
        let mut topics: Vec<(String, TopicTraffic)> = self
            .topics
            .read()
            .map(|topics| {
                topics
                    .iter()
                    .map(|(name, c)| (name.to_string(), load(c)))
                    .collect()
            })
            .unwrap_or_default();
        topics.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        TrafficSnapshot {
            apis,
            topics,
            omitted: load(&self.omitted),
            connections_open: self.connections_open.load(Ordering::Relaxed),
            connections_accepted: self.connections_accepted.load(Ordering::Relaxed),
        }
    }
}

fn error_counts(c: &ApiCounters) -> Vec<(String, u64)> {
    let Some(table) = c.errors.get() else {
        return Vec::new();
    };
    table
        .iter()
        .enumerate()
        .filter_map(|(slot, count)| {
            let count = count.load(Ordering::Relaxed);
            (count > 0).then(|| {
                let name = if slot == ERROR_SLOTS - 1 {
                    "OTHER".to_string()
                } else {
                    let code = i16::try_from(slot).map_or(i16::MAX, |s| s - 1);
                    crate::error_codes::error_name(code)
                };
                (name, count)
            })
        })
        .collect()
}

fn load(c: &TopicCounters) -> TopicTraffic {
    TopicTraffic {
        bytes_in: c.bytes_in.load(Ordering::Relaxed),
        records_in: c.records_in.load(Ordering::Relaxed),
        bytes_out: c.bytes_out.load(Ordering::Relaxed),
    }
}

/// Kafka's name of an API ("Produce", "Fetch", …), as its request metrics label it:
/// `ApiKey`'s variants are named exactly so, and their Debug form is interned once.
fn api_name(key: i16) -> Option<&'static str> {
    static NAMES: std::sync::OnceLock<HashMap<i16, &'static str>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..API_SLOTS as i16)
            .filter_map(|k| ApiKey::try_from(k).ok().map(|api| (k, api)))
            .map(|(k, api)| (k, &*Box::leak(format!("{api:?}").into_boxed_str())))
            .collect()
    });
    names.get(&key).copied()
}

/// The records a set of v2 batches declares (each header's `recordsCount`), without reading
/// the records. Stops at the first header that does not fit: the bytes were validated before
/// they were accepted, so that is the end.
fn record_count(mut batches: &[u8]) -> u64 {
    // baseOffset i64 | batchLength i32 | … | recordsCount i32 at byte 57 of the header.
    const LENGTH_AT: usize = 8;
    const COUNT_AT: usize = 57;
    let mut records = 0u64;
    while batches.len() >= COUNT_AT + 4 {
        let length = i32::from_be_bytes([
            batches[LENGTH_AT],
            batches[LENGTH_AT + 1],
            batches[LENGTH_AT + 2],
            batches[LENGTH_AT + 3],
        ]);
        let count = i32::from_be_bytes([
            batches[COUNT_AT],
            batches[COUNT_AT + 1],
            batches[COUNT_AT + 2],
            batches[COUNT_AT + 3],
        ]);
        records += u64::try_from(count).unwrap_or(0);
        let Some(next) = usize::try_from(length)
            .ok()
            .and_then(|l| l.checked_add(LENGTH_AT + 4))
            .filter(|&next| next <= batches.len())
        else {
            break;
        };
        batches = &batches[next..];
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch header declaring `count` records over `body` bytes of records.
    fn batch(count: i32, body: usize) -> Vec<u8> {
        let mut b = vec![0u8; 61 + body];
        let length = i32::try_from(61 + body - 12).unwrap();
        b[8..12].copy_from_slice(&length.to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        b
    }

    #[test]
    fn records_are_counted_from_every_batch_header() {
        let mut two = batch(3, 10);
        two.extend(batch(5, 0));
        assert_eq!(record_count(&two), 8);
        assert_eq!(record_count(&[]), 0);
        // A truncated second header ends the count.
        let mut cut = batch(3, 10);
        cut.extend(&batch(5, 0)[..30]);
        assert_eq!(record_count(&cut), 3);
    }

    #[test]
    fn requests_land_in_their_latency_bucket_and_name() {
        let traffic = Traffic::default();
        traffic.request(0, Duration::from_micros(300), false);
        traffic.request(0, Duration::from_millis(30), false);
        traffic.request(0, Duration::from_secs(60), true);
        traffic.request(3, Duration::from_millis(1), false);
        traffic.request(-1, Duration::from_millis(1), false);
        let snapshot = traffic.snapshot();
        let produce = &snapshot.apis[0];
        assert_eq!(produce.api, "Produce");
        assert_eq!((produce.requests, produce.refused), (3, 1));
        assert_eq!(produce.buckets[0], 1, "300 µs ≤ 0.5 ms");
        assert_eq!(produce.buckets[6], 1, "30 ms ≤ 50 ms");
        assert_eq!(produce.buckets[LATENCY_BUCKETS.len()], 1, "+Inf");
        assert_eq!(snapshot.apis[1].api, "Metadata");
        assert_eq!(snapshot.apis.len(), 2, "a negative key is not counted");
        assert_eq!(api_name(60), Some("DescribeCluster"));
    }

    #[test]
    fn error_codes_are_counted_per_api_by_name() {
        let traffic = Traffic::default();
        traffic.request(0, Duration::from_millis(1), false);
        traffic.errors(0, &[(0, 2), (6, 1)]);
        traffic.errors(0, &[(6, 3), (-1, 1), (i16::MAX, 1)]);
        traffic.request(3, Duration::from_millis(1), false);
        traffic.errors(-4, &[(0, 1)]);
        let snapshot = traffic.snapshot();
        assert_eq!(
            snapshot.apis[0].errors,
            vec![
                ("UNKNOWN_SERVER_ERROR".to_string(), 1),
                ("NONE".to_string(), 2),
                ("NOT_LEADER_OR_FOLLOWER".to_string(), 4),
                ("OTHER".to_string(), 1),
            ]
        );
        assert!(snapshot.apis[1].errors.is_empty(), "Metadata had no tally");
    }

    #[test]
    fn topics_past_the_series_bound_are_counted_as_omitted() {
        let traffic = Traffic::default();
        for n in 0..MAX_TOPIC_SERIES + 2 {
            let name: Arc<str> = Arc::from(format!("t{n}"));
            traffic.produced(&name, &batch(2, 0));
            traffic.fetched(&name, 7);
        }
        let snapshot = traffic.snapshot();
        assert_eq!(snapshot.topics.len(), MAX_TOPIC_SERIES);
        assert_eq!(
            snapshot.omitted,
            TopicTraffic {
                bytes_in: 2 * 61,
                records_in: 4,
                bytes_out: 14
            }
        );
        let first = &snapshot.topics[0];
        assert_eq!(first.0, "t0");
        assert_eq!(first.1.records_in, 2);
    }
}
