//! Test records: what a test sends, what a consumer got back, and the comparison between them.

use std::collections::BTreeMap;
use std::fmt;

/// One record as a client sees it: key, value and headers, any of which may be absent.
#[derive(Clone, PartialEq, Eq)]
pub struct TestRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// In order, duplicates allowed, values may be null: Kafka keeps all of that.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Producer-chosen CreateTime in ms, or `None` to let the client pick.
    pub timestamp: Option<i64>,
}

impl fmt::Debug for TestRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestRecord")
            .field("key", &self.key.as_deref().map(short))
            .field("value", &self.value.as_deref().map(short))
            .field("headers", &self.headers.len())
            .field("timestamp", &self.timestamp)
            .finish()
    }
}

/// A readable prefix of a payload, for failure messages about multi-kilobyte values.
fn short(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned();
    format!("{text:?} ({} bytes)", bytes.len())
}

/// A record read back by a consumer, with where it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedRecord {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub record: TestRecord,
}

/// A deterministic mix of records that covers the shapes Kafka allows: null and empty keys,
/// null, empty, small and multi-kilobyte values (compressible, but not trivially), no headers,
/// several headers, duplicate header keys and null header values.
pub fn varied_records(count: usize) -> Vec<TestRecord> {
    (0..count).map(varied_record).collect()
}

fn varied_record(i: usize) -> TestRecord {
    let key = match i % 7 {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(format!("key-{i}").into_bytes()),
    };
    let value = match i % 11 {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(payload(i, (i * 37) % 3000)),
    };
    let headers = match i % 5 {
        0 => Vec::new(),
        1 => vec![("trace".to_string(), Some(format!("t-{i}").into_bytes()))],
        2 => vec![
            ("dup".to_string(), Some(b"first".to_vec())),
            ("dup".to_string(), Some(b"second".to_vec())),
        ],
        3 => vec![("null-valued".to_string(), None)],
        _ => vec![
            ("a".to_string(), Some(Vec::new())),
            ("b".to_string(), Some(vec![0, 255, 7])),
            ("c".to_string(), Some(format!("{i}").into_bytes())),
        ],
    };
    TestRecord {
        key,
        value,
        headers,
        timestamp: None,
    }
}

/// `len` bytes that identify record `i` and compress moderately.
pub fn payload(i: usize, len: usize) -> Vec<u8> {
    let mut bytes = format!("record {i}: ").into_bytes();
    let mut state = i as u32 ^ 0x9e37_79b9;
    while bytes.len() < len {
        // A cheap xorshift: some entropy so codecs have real work, words so they win some.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let word: &[u8] = match state % 4 {
            0 => b"alpha ",
            1 => b"beta ",
            2 => b"gamma ",
            _ => &[(state >> 8) as u8, (state >> 16) as u8],
        };
        bytes.extend_from_slice(word);
    }
    bytes.truncate(len);
    bytes
}

/// Checks that every partition's consumed records are exactly the produced ones, in the
/// produced order, at offsets dense from `first_offset`. `produced` is per partition, in send
/// order. Panics with the first difference.
pub fn assert_partitions_match(
    produced: &BTreeMap<i32, Vec<TestRecord>>,
    consumed: &[ReceivedRecord],
    first_offset: i64,
) {
    let mut by_partition: BTreeMap<i32, Vec<&ReceivedRecord>> = BTreeMap::new();
    for received in consumed {
        by_partition
            .entry(received.partition)
            .or_default()
            .push(received);
    }
    for partition in by_partition.keys() {
        assert!(
            produced.contains_key(partition),
            "consumed records from partition {partition}, which nothing was produced to"
        );
    }
    for (partition, sent) in produced {
        let got = by_partition
            .get(partition)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        assert_eq!(
            got.len(),
            sent.len(),
            "partition {partition}: produced {} records, consumed {}",
            sent.len(),
            got.len()
        );
        for (index, (received, expected)) in got.iter().zip(sent).enumerate() {
            let offset = first_offset + index as i64;
            assert_eq!(
                received.offset, offset,
                "partition {partition}: record #{index} has offset {} (offsets must be dense from {first_offset})",
                received.offset
            );
            assert_same_content(&received.record, expected, *partition, offset);
        }
    }
}

/// Key, value and headers equal; the timestamp too when the producer set one.
pub fn assert_same_content(got: &TestRecord, expected: &TestRecord, partition: i32, offset: i64) {
    assert_eq!(got.key, expected.key, "key differs at {partition}/{offset}");
    assert_eq!(
        got.value, expected.value,
        "value differs at {partition}/{offset}: got {got:?}, expected {expected:?}"
    );
    assert_eq!(
        got.headers, expected.headers,
        "headers differ at {partition}/{offset}"
    );
    if let Some(ts) = expected.timestamp {
        assert_eq!(
            got.timestamp,
            Some(ts),
            "timestamp differs at {partition}/{offset}"
        );
    }
}

/// Wall-clock milliseconds since the Unix epoch, for producer-chosen timestamps. The broker
/// compares record timestamps with its own clock (retention), so tests must use the real one.
pub fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since_epoch.as_millis()).expect("milliseconds fit i64")
}

/// `count` records on one partition with distinct keys and values `value-<i>`, and
/// timestamps `first_timestamp + i * step_ms` when `first_timestamp` is given.
pub fn numbered_records(
    count: usize,
    first_timestamp: Option<i64>,
    step_ms: i64,
) -> Vec<TestRecord> {
    (0..count)
        .map(|i| TestRecord {
            key: Some(format!("key-{i}").into_bytes()),
            value: Some(format!("value-{i}").into_bytes()),
            headers: vec![("index".to_string(), Some(i.to_string().into_bytes()))],
            timestamp: first_timestamp.map(|t| t + i as i64 * step_ms),
        })
        .collect()
}
