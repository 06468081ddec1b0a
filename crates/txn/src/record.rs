//! Kafka's `__transaction_state` records: key `TransactionLogKey` (version 0: the
//! transactional id) and value `TransactionLogValue` version 0, byte for byte as Kafka 4 writes
//! them for transactions without KIP-890 part 2 (`transaction.version` < 2, which is what
//! Strata offers), so Kafka's `TransactionLogMessageFormatter` reads them. A removed
//! (expired) transactional id is a tombstone: the key with no value.

use std::collections::BTreeSet;

use bytes::Buf;
use strata_core::TopicPartition;

use crate::state::TxnState;

/// One durable fact: the transactional id's metadata after a transition, or None once it
/// expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRecord {
    pub transactional_id: String,
    pub value: Option<TxnValue>,
}

/// The fields of `TransactionLogValue` v0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnValue {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<TopicPartition>,
    pub last_update_ms: i64,
    pub start_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable transaction log record: {0}")]
pub struct RecordError(pub &'static str);

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

pub fn encode_key(transactional_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + transactional_id.len());
    out.extend_from_slice(&KEY_VERSION.to_be_bytes());
    put_str(&mut out, transactional_id);
    out
}

pub fn encode_value(v: &TxnValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&VALUE_VERSION.to_be_bytes());
    out.extend_from_slice(&v.producer_id.to_be_bytes());
    out.extend_from_slice(&v.producer_epoch.to_be_bytes());
    out.extend_from_slice(&v.timeout_ms.to_be_bytes());
    out.push(v.state.code() as u8);
    // Kafka writes no partition list (null) for an Empty transaction.
    if v.state == TxnState::Empty {
        out.extend_from_slice(&(-1i32).to_be_bytes());
    } else {
        let mut by_topic: Vec<(&str, Vec<i32>)> = Vec::new();
        for tp in &v.partitions {
            match by_topic.last_mut() {
                Some((t, ps)) if *t == &*tp.topic => ps.push(tp.partition),
                _ => by_topic.push((&tp.topic, vec![tp.partition])),
            }
        }
        out.extend_from_slice(&(by_topic.len() as i32).to_be_bytes());
        for (topic, ps) in by_topic {
            put_str(&mut out, topic);
            out.extend_from_slice(&(ps.len() as i32).to_be_bytes());
            for p in ps {
                out.extend_from_slice(&p.to_be_bytes());
            }
        }
    }
    out.extend_from_slice(&v.last_update_ms.to_be_bytes());
    out.extend_from_slice(&v.start_ms.to_be_bytes());
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Kafka strings are at most i16::MAX bytes; transactional ids are bounded far below by the
    // request size, and topic names by 249.
    let len = s.len().min(i16::MAX as usize);
    out.extend_from_slice(&(len as i16).to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..len]);
}

/// Reads Kafka's big-endian fields through `bytes::Buf`'s checked getters: a short record is
/// an error, never a panic.
struct Reader<'a>(&'a [u8]);

fn truncated(_: bytes::TryGetError) -> RecordError {
    RecordError("truncated")
}

impl Reader<'_> {
    fn i8(&mut self) -> Result<i8, RecordError> {
        self.0.try_get_i8().map_err(truncated)
    }
    fn i16(&mut self) -> Result<i16, RecordError> {
        self.0.try_get_i16().map_err(truncated)
    }
    fn i32(&mut self) -> Result<i32, RecordError> {
        self.0.try_get_i32().map_err(truncated)
    }
    fn i64(&mut self) -> Result<i64, RecordError> {
        self.0.try_get_i64().map_err(truncated)
    }
    fn string(&mut self) -> Result<String, RecordError> {
        let len = usize::try_from(self.i16()?).map_err(|_| RecordError("null string"))?;
        if self.0.remaining() < len {
            return Err(RecordError("truncated"));
        }
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(text.to_vec()).map_err(|_| RecordError("string not UTF-8"))
    }
}

/// The transactional id of a key; an error for another key version (Kafka's are all 0).
pub fn decode_key(bytes: &[u8]) -> Result<String, RecordError> {
    let mut r = Reader(bytes);
    if r.i16()? != KEY_VERSION {
        return Err(RecordError("unknown key version"));
    }
    r.string()
}

pub fn decode_value(bytes: &[u8]) -> Result<TxnValue, RecordError> {
    let mut r = Reader(bytes);
    if r.i16()? != VALUE_VERSION {
        return Err(RecordError("unknown value version"));
    }
    let producer_id = r.i64()?;
    let producer_epoch = r.i16()?;
    let timeout_ms = r.i32()?;
    let state = TxnState::from_code(r.i8()?).ok_or(RecordError("unknown transaction state"))?;
    let mut partitions = BTreeSet::new();
    let topics = r.i32()?;
    for _ in 0..topics.max(0) {
        let topic = r.string()?;
        let count = r.i32()?;
        for _ in 0..count.max(0) {
            partitions.insert(TopicPartition::new(topic.as_str(), r.i32()?));
        }
    }
    let last_update_ms = r.i64()?;
    let start_ms = r.i64()?;
    Ok(TxnValue {
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms,
        start_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_in_kafkas_layout() {
        let v = TxnValue {
            producer_id: 7,
            producer_epoch: 3,
            timeout_ms: 60_000,
            state: TxnState::PrepareCommit,
            partitions: [("a", 0), ("a", 2), ("b", 1)]
                .into_iter()
                .map(|(t, p)| TopicPartition::new(t, p))
                .collect(),
            last_update_ms: 11,
            start_ms: 10,
        };
        let bytes = encode_value(&v);
        // version, pid, epoch, timeout, state 2 (PrepareCommit), two topics.
        assert_eq!(&bytes[..2], &[0, 0]);
        assert_eq!(&bytes[2..10], &7i64.to_be_bytes());
        assert_eq!(&bytes[10..12], &3i16.to_be_bytes());
        assert_eq!(bytes[16], 2);
        assert_eq!(&bytes[17..21], &2i32.to_be_bytes());
        assert_eq!(decode_value(&bytes), Ok(v));
        assert_eq!(decode_key(&encode_key("tx-é")), Ok("tx-é".to_string()));
        assert_eq!(encode_key("ab"), vec![0, 0, 0, 2, b'a', b'b']);
        assert!(decode_value(&bytes[..20]).is_err());
    }

    #[test]
    fn an_empty_transaction_has_a_null_partition_list() {
        let v = TxnValue {
            producer_id: 1,
            producer_epoch: 0,
            timeout_ms: 1,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            last_update_ms: 0,
            start_ms: -1,
        };
        let bytes = encode_value(&v);
        assert_eq!(&bytes[17..21], &(-1i32).to_be_bytes());
        assert_eq!(decode_value(&bytes), Ok(v));
    }
}
