//! The produce-path batch checks and the append rewrite. Must never panic, and whatever is
//! accepted must still be accepted after `rewrite_for_append`.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use strata_wire::batch::{
    find_batch_containing, read_batch_header, rewrite_for_append, split_batches,
    validate_client_batch, validate_records,
};

/// Recomputes the CRC of every batch that `batchLength` delimits, so that half of the runs get
/// past the CRC check and exercise the count, codec and record-framing checks behind it; random
/// bytes almost never carry a matching CRC-32C.
fn fix_crcs(data: &mut [u8]) {
    let mut position = 0;
    while data.len() - position >= 61 {
        let mut length = [0u8; 4];
        length.copy_from_slice(&data[position + 8..position + 12]);
        let Ok(length) = usize::try_from(i32::from_be_bytes(length)) else {
            return;
        };
        let end = position + 12 + length;
        if length < 49 || end > data.len() {
            return;
        }
        let crc = crc32c::crc32c(&data[position + 21..end]);
        data[position + 17..position + 21].copy_from_slice(&crc.to_be_bytes());
        position = end;
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, data)) = input.split_first() else {
        return;
    };
    let mut data = data.to_vec();
    if mode & 1 == 1 {
        fix_crcs(&mut data);
    }
    let records = Bytes::from(data);
    if let Ok(batches) = split_batches(&records) {
        for batch in &batches {
            let _ = validate_records(batch);
            let _ = validate_client_batch(batch);
            let append_time = (mode & 2 == 2).then_some(1_700_000_000_000);
            let stored = rewrite_for_append(batch, i64::from(mode) << 40, 7, append_time);
            let stored = stored.to_contiguous();
            assert!(split_batches(&stored).is_ok(), "a rewritten batch must stay valid");
            let header = read_batch_header(&stored);
            assert_eq!(header.map(|h| h.total_len()), Some(stored.len()));
        }
    }
    let _ = read_batch_header(&records);
    let _ = find_batch_containing(&records, i64::from(mode) - 128);
});
