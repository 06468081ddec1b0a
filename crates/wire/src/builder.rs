//! Building and reading simple record batches for the broker's own internal logs (committed
//! offsets and group metadata). Client batches never go through here: they stay the client's
//! bytes. These batches are uncompressed, carry no producer id, and hold key/value records
//! without headers.

use bytes::{BufMut, Bytes, BytesMut};

use crate::batch::{BatchError, BATCH_HEADER_LEN};

/// One record of an internal batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleRecord {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
}

fn put_varint(buf: &mut BytesMut, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let byte = (zigzag & 0x7f) as u8;
        zigzag >>= 7;
        if zigzag == 0 {
            buf.put_u8(byte);
            return;
        }
        buf.put_u8(byte | 0x80);
    }
}

fn get_varint(data: &[u8], at: &mut usize) -> Result<i64, BatchError> {
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *data
            .get(*at)
            .ok_or_else(|| BatchError::InvalidRecords("varint runs past the end".into()))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(BatchError::InvalidRecords(
        "varint longer than 10 bytes".into(),
    ))
}

fn put_bytes(buf: &mut BytesMut, b: &Option<Bytes>) {
    match b {
        None => put_varint(buf, -1),
        Some(b) => {
            put_varint(buf, b.len() as i64);
            buf.put_slice(b);
        }
    }
}

/// Encodes `records` as one uncompressed v2 batch with base offset 0 and every record
/// stamped `timestamp_ms`.
pub fn build_batch(records: &[SimpleRecord], timestamp_ms: i64) -> Bytes {
    build(records, timestamp_ms, 0, (-1, -1))
}

/// A transaction marker as Kafka's `EndTransactionMarker` writes it: a control batch
/// (attributes: control + transactional) of the producer's id and epoch, sequence -1, holding
/// one record whose key is (version 0, type: 0 abort, 1 commit) and whose value is
/// (version 0, coordinator epoch).
pub fn build_txn_marker(
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp_ms: i64,
) -> Bytes {
    let mut key = BytesMut::with_capacity(4);
    key.put_i16(0);
    key.put_i16(i16::from(commit));
    let mut value = BytesMut::with_capacity(6);
    value.put_i16(0);
    value.put_i32(coordinator_epoch);
    let record = SimpleRecord {
        key: Some(key.freeze()),
        value: Some(value.freeze()),
    };
    build(
        &[record],
        timestamp_ms,
        CONTROL_ATTRIBUTES,
        (producer_id, producer_epoch),
    )
}

const CONTROL_ATTRIBUTES: i16 = 0x20 | 0x10;

/// A transaction marker's contents, read back from a stored control batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnMarker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// Reads the marker of a stored control batch; None for any other batch, or a control record
/// of another type (Kafka skips unknown control types too).
pub fn read_txn_marker(batch: &Bytes) -> Option<TxnMarker> {
    if batch.len() < BATCH_HEADER_LEN {
        return None;
    }
    let attributes = i16::from_be_bytes([batch[21], batch[22]]);
    if attributes & 0x20 == 0 || attributes & 0x7 != 0 {
        return None;
    }
    let (_, record) = read_records(batch).ok()?.into_iter().next()?;
    let key = record.key?;
    let value = record.value.unwrap_or_default();
    if key.len() < 4 {
        return None;
    }
    let commit = match i16::from_be_bytes([key[2], key[3]]) {
        0 => false,
        1 => true,
        _ => return None,
    };
    // A value without the epoch reads as -1, as Kafka's EndTransactionMarker does for a short one.
    let coordinator_epoch = value
        .get(2..6)
        .and_then(|b| b.try_into().ok())
        .map_or(-1, i32::from_be_bytes);
    Some(TxnMarker {
        commit,
        coordinator_epoch,
    })
}

fn build(
    records: &[SimpleRecord],
    timestamp_ms: i64,
    attributes: i16,
    (producer_id, producer_epoch): (i64, i16),
) -> Bytes {
    let mut body = BytesMut::new();
    for (i, r) in records.iter().enumerate() {
        let mut rec = BytesMut::new();
        rec.put_i8(0);
        put_varint(&mut rec, 0);
        put_varint(&mut rec, i as i64);
        put_bytes(&mut rec, &r.key);
        put_bytes(&mut rec, &r.value);
        put_varint(&mut rec, 0);
        put_varint(&mut body, rec.len() as i64);
        body.put_slice(&rec);
    }
    let count = records.len() as i32;
    let mut covered = BytesMut::with_capacity(BATCH_HEADER_LEN - 21 + body.len());
    covered.put_i16(attributes);
    covered.put_i32(count - 1);
    covered.put_i64(timestamp_ms);
    covered.put_i64(timestamp_ms);
    covered.put_i64(producer_id);
    covered.put_i16(producer_epoch);
    covered.put_i32(-1);
    covered.put_i32(count);
    covered.put_slice(&body);
    let mut out = BytesMut::with_capacity(21 + covered.len());
    out.put_i64(0);
    out.put_i32((4 + 1 + 4 + covered.len()) as i32);
    out.put_i32(-1);
    out.put_i8(2);
    out.put_u32(crc32c::crc32c(&covered));
    out.put_slice(&covered);
    out.freeze()
}

/// The records of one stored, uncompressed batch with their absolute offsets.
pub fn read_records(batch: &Bytes) -> Result<Vec<(i64, SimpleRecord)>, BatchError> {
    if batch.len() < BATCH_HEADER_LEN {
        return Err(BatchError::InvalidRecords(
            "batch shorter than its header".into(),
        ));
    }
    let base_offset = i64::from_be_bytes(batch[0..8].try_into().unwrap_or([0; 8]));
    let attributes = i16::from_be_bytes([batch[21], batch[22]]);
    if attributes & 0x7 != 0 {
        return Err(BatchError::InvalidRecords(
            "internal batches are never compressed".into(),
        ));
    }
    let mut at = BATCH_HEADER_LEN;
    let mut out = Vec::new();
    let take = |at: &mut usize| -> Result<Option<Bytes>, BatchError> {
        let len = get_varint(batch, at)?;
        if len < 0 {
            return Ok(None);
        }
        let end = at
            .checked_add(len as usize)
            .filter(|e| *e <= batch.len())
            .ok_or_else(|| BatchError::InvalidRecords("field runs past the batch".into()))?;
        let b = batch.slice(*at..end);
        *at = end;
        Ok(Some(b))
    };
    while at < batch.len() {
        let len = get_varint(batch, &mut at)?;
        let end =
            at.checked_add(usize::try_from(len).map_err(|_| {
                BatchError::InvalidRecords(format!("negative record length {len}"))
            })?)
            .filter(|e| *e <= batch.len())
            .ok_or_else(|| BatchError::InvalidRecords("record runs past the batch".into()))?;
        at += 1; // attributes
        let _timestamp_delta = get_varint(batch, &mut at)?;
        let offset_delta = get_varint(batch, &mut at)?;
        let key = take(&mut at)?;
        let value = take(&mut at)?;
        out.push((
            base_offset.saturating_add(offset_delta),
            SimpleRecord { key, value },
        ));
        at = end;
    }
    Ok(out)
}

/// Within one stored batch, the first record whose timestamp is >= `target`, as (offset,
/// timestamp). Only uncompressed batches are looked inside (the broker never decompresses);
/// for a compressed or unreadable batch the answer is None and the caller falls back to the
/// batch's first offset. Under LogAppendTime every record carries the batch's max timestamp.
pub fn first_record_at_or_after(batch: &[u8], target: i64) -> Option<(i64, i64)> {
    if batch.len() < BATCH_HEADER_LEN {
        return None;
    }
    let be_i64 = |at: usize| batch[at..at + 8].try_into().ok().map(i64::from_be_bytes);
    let base_offset = be_i64(0)?;
    let attributes = i16::from_be_bytes([batch[21], batch[22]]);
    if attributes & 0x7 != 0 {
        return None;
    }
    let base_timestamp = be_i64(27)?;
    let max_timestamp = be_i64(35)?;
    if attributes & 0x8 != 0 {
        return (max_timestamp >= target).then_some((base_offset, max_timestamp));
    }
    let mut at = BATCH_HEADER_LEN;
    while at < batch.len() {
        let len = usize::try_from(get_varint(batch, &mut at).ok()?).ok()?;
        let end = at.checked_add(len).filter(|e| *e <= batch.len())?;
        at += 1; // attributes
        let timestamp_delta = get_varint(batch, &mut at).ok()?;
        let offset_delta = get_varint(batch, &mut at).ok()?;
        let timestamp = base_timestamp.saturating_add(timestamp_delta);
        if timestamp >= target {
            return Some((base_offset.saturating_add(offset_delta), timestamp));
        }
        at = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{split_batches, validate_records, RecordsCheck};

    #[test]
    fn txn_markers_read_back_as_kafka_lays_them_out() {
        let marker = build_txn_marker(42, 3, true, 7, 1000);
        let views = split_batches(&marker).unwrap();
        assert!(views[0].is_control() && views[0].is_transactional());
        assert_eq!((views[0].producer_id(), views[0].producer_epoch()), (42, 3));
        assert_eq!(views[0].base_sequence(), -1);
        let (_, record) = read_records(&marker).unwrap().remove(0);
        assert_eq!(record.key.as_deref(), Some(&[0, 0, 0, 1][..]));
        assert_eq!(record.value.as_deref(), Some(&[0, 0, 0, 0, 0, 7][..]));
        assert_eq!(
            read_txn_marker(&marker),
            Some(TxnMarker {
                commit: true,
                coordinator_epoch: 7
            })
        );
        let abort = build_txn_marker(42, 3, false, 0, 1000);
        assert_eq!(read_txn_marker(&abort).map(|m| m.commit), Some(false));
        assert_eq!(read_txn_marker(&build_batch(&[], 1)), None);
    }

    #[test]
    fn built_batches_validate_and_read_back() {
        let records = vec![
            SimpleRecord {
                key: Some(Bytes::from_static(b"k1")),
                value: Some(Bytes::from_static(b"v1")),
            },
            SimpleRecord {
                key: None,
                value: None,
            },
        ];
        let batch = build_batch(&records, 1234);
        let views = split_batches(&batch).unwrap();
        assert_eq!(views.len(), 1);
        assert!(matches!(
            validate_records(&views[0]).unwrap(),
            RecordsCheck::Verified {
                max_timestamp: 1234
            }
        ));
        let read = read_records(&batch).unwrap();
        assert_eq!(read, vec![(0, records[0].clone()), (1, records[1].clone())]);
    }

    #[test]
    fn varints_decode_as_kafka_writes_them() {
        let data = [0x00, 0x01, 0x02, 0x03, 0xac, 0x02];
        let mut at = 0;
        for expected in [0, -1, 1, -2, 150] {
            assert_eq!(get_varint(&data, &mut at).unwrap(), expected);
        }
        assert!(get_varint(&data, &mut at).is_err());
    }

    #[test]
    fn finds_the_first_record_at_or_after_a_timestamp() {
        let records: Vec<SimpleRecord> = (0..3)
            .map(|_| SimpleRecord {
                key: None,
                value: Some(Bytes::from_static(b"v")),
            })
            .collect();
        // build_batch stamps every record with the same time.
        let batch = build_batch(&records, 100);
        assert_eq!(first_record_at_or_after(&batch, 100), Some((0, 100)));
        assert_eq!(first_record_at_or_after(&batch, 101), None);
        for cut in 0..batch.len() {
            let _ = first_record_at_or_after(&batch[..cut], 0);
        }
    }

    #[test]
    fn garbage_never_panics() {
        let batch = build_batch(
            &[SimpleRecord {
                key: None,
                value: Some(Bytes::from_static(b"value")),
            }],
            0,
        );
        for cut in 0..batch.len() {
            let _ = read_records(&batch.slice(..cut));
        }
    }
}
