//! Test-only helpers: a small v2 batch builder and a seeded RNG (no extra dependencies).

/// One record for [`BatchBuilder`].
#[derive(Debug, Clone)]
pub struct TestRecord {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    timestamp_delta: i64,
    /// Overrides the record's offset delta, which is otherwise its index.
    offset_delta: Option<i32>,
}

impl TestRecord {
    pub fn new(key: Option<&str>, value: Option<&str>) -> Self {
        Self {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers: Vec::new(),
            timestamp_delta: 0,
            offset_delta: None,
        }
    }

    pub fn timestamp_delta(mut self, delta: i64) -> Self {
        self.timestamp_delta = delta;
        self
    }

    pub fn offset_delta(mut self, delta: i32) -> Self {
        self.offset_delta = Some(delta);
        self
    }

    pub fn header(mut self, key: &str, value: Option<&str>) -> Self {
        self.headers.push((
            key.as_bytes().to_vec(),
            value.map(|v| v.as_bytes().to_vec()),
        ));
        self
    }

    fn encode(&self, index: i32, out: &mut Vec<u8>) {
        let mut body = vec![0u8]; // attributes
        put_varlong(&mut body, self.timestamp_delta);
        put_varint(&mut body, self.offset_delta.unwrap_or(index));
        put_nullable(&mut body, self.key.as_deref());
        put_nullable(&mut body, self.value.as_deref());
        put_varint(&mut body, self.headers.len() as i32);
        for (key, value) in &self.headers {
            put_nullable(&mut body, Some(key));
            put_nullable(&mut body, value.as_deref());
        }
        put_varint(out, body.len() as i32);
        out.extend_from_slice(&body);
    }
}

fn put_varint(out: &mut Vec<u8>, value: i32) {
    let mut zigzag = ((value << 1) ^ (value >> 31)) as u32;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(bytes) => {
            put_varint(out, bytes.len() as i32);
            out.extend_from_slice(bytes);
        }
    }
}

/// Builds v2 batches the way a producer would, with a correct length and CRC.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    base_offset: i64,
    partition_leader_epoch: i32,
    attributes: i16,
    base_timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    records: Vec<TestRecord>,
    /// Pre-encoded (e.g. "compressed") records and the count to declare for them.
    raw: Option<(Vec<u8>, i32)>,
}

impl BatchBuilder {
    pub fn new() -> Self {
        Self {
            base_offset: 0,
            partition_leader_epoch: -1,
            attributes: 0,
            base_timestamp: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            records: Vec::new(),
            raw: None,
        }
    }

    pub fn attributes(mut self, attributes: i16) -> Self {
        self.attributes = attributes;
        self
    }

    pub fn base_timestamp(mut self, timestamp: i64) -> Self {
        self.base_timestamp = timestamp;
        self
    }

    pub fn producer(mut self, id: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn record(mut self, record: TestRecord) -> Self {
        self.records.push(record);
        self
    }

    pub fn raw_records(mut self, bytes: Vec<u8>, count: i32) -> Self {
        self.raw = Some((bytes, count));
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let (records, count) = match &self.raw {
            Some((bytes, count)) => (bytes.clone(), *count),
            None => {
                let mut out = Vec::new();
                for (index, record) in self.records.iter().enumerate() {
                    record.encode(index as i32, &mut out);
                }
                (out, self.records.len() as i32)
            }
        };
        let max_timestamp = self.base_timestamp
            + self
                .records
                .iter()
                .map(|r| r.timestamp_delta)
                .max()
                .unwrap_or(0);
        let mut out = Vec::with_capacity(61 + records.len());
        out.extend_from_slice(&self.base_offset.to_be_bytes());
        out.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes());
        out.extend_from_slice(&self.partition_leader_epoch.to_be_bytes());
        out.push(2);
        out.extend_from_slice(&[0; 4]); // CRC, filled in below
        out.extend_from_slice(&self.attributes.to_be_bytes());
        out.extend_from_slice(&(count - 1).max(0).to_be_bytes());
        out.extend_from_slice(&self.base_timestamp.to_be_bytes());
        out.extend_from_slice(&max_timestamp.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.producer_epoch.to_be_bytes());
        out.extend_from_slice(&self.base_sequence.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&records);
        fix_crc(&mut out);
        out
    }
}

/// Recomputes the CRC of the batch that fills `batch` exactly.
/// Three records with keys, a null key, a null value and a header: the shape every batch check
/// is tried on.
pub fn three_records() -> BatchBuilder {
    BatchBuilder::new()
        .base_timestamp(1_000)
        .record(TestRecord::new(Some("k0"), Some("v0")).timestamp_delta(5))
        .record(
            TestRecord::new(None, Some("v1"))
                .timestamp_delta(9)
                .header("h", Some("x")),
        )
        .record(TestRecord::new(Some("k2"), None).timestamp_delta(2))
}

pub fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// xorshift64*: deterministic, good enough to shake parsers, and needs no crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..bound`, or 0 when `bound` is 0.
    pub fn below(&mut self, bound: usize) -> usize {
        if bound == 0 {
            0
        } else {
            (self.next_u64() % bound as u64) as usize
        }
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.byte()).collect()
    }
}
