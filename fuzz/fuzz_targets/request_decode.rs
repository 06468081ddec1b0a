//! Everything a client can send before a handler runs: frame splitting, request header parsing
//! and body decoding. Must never panic, abort or allocate without bound (libFuzzer flags any
//! single allocation over its malloc limit, 2 GiB by default, as a crash).

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use strata_wire::decode::decode_request;
use strata_wire::frame::{parse_request_header, try_split_frame};

/// A 1 MiB frame limit keeps each input's worst honest allocation small.
const MAX_FRAME: usize = 1 << 20;

fn decode_frame(mut frame: Bytes) {
    if let Ok(header) = parse_request_header(&mut frame) {
        let _ = decode_request(&header, &frame);
    }
}

fuzz_target!(|data: &[u8]| {
    // As a connection's byte stream: as many size-prefixed frames as the input holds.
    let mut stream = BytesMut::from(data);
    while let Ok(Some(frame)) = try_split_frame(&mut stream, MAX_FRAME) {
        decode_frame(frame);
    }
    // As one frame body, so the fuzzer does not have to learn the size prefix first.
    decode_frame(Bytes::copy_from_slice(data));
});
