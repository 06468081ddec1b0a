//! The write-unique trailer that turns S3 ETags into real versions.
//!
//! S3's `If-Match` compares ETags, and the ETag of a single-part PUT is the MD5 of its bytes. Two
//! writes of identical bytes therefore share a version, and a compare-and-swap taken before an
//! A→B→A sequence still succeeds after it. Ending every stored object with 16 random bytes and a
//! magic makes every write's ETag distinct, so the service's own atomic `If-Match` check becomes
//! an exact version check — no read-then-write window. The payload is sent as two chunks, so the
//! caller's bytes are not copied; reads slice the trailer off the buffer they already hold.

use bytes::Bytes;

/// Bytes added to every object: a 16-byte nonce, then [`MAGIC`].
pub const TRAILER_LEN: u64 = 24;

/// Marks an object as written by this backend, so a foreign object is reported, not misread.
const MAGIC: &[u8; 8] = b"STRATAv1";

/// A fresh trailer. The nonce only has to differ between writes, so it comes from the thread RNG
/// rather than the injected one: it never influences any decision.
#[allow(clippy::disallowed_methods)]
pub(crate) fn new_trailer() -> Bytes {
    let nonce: [u8; 16] = rand::random();
    let mut trailer = Vec::with_capacity(TRAILER_LEN as usize);
    trailer.extend_from_slice(&nonce);
    trailer.extend_from_slice(MAGIC);
    Bytes::from(trailer)
}

/// The caller's bytes of a whole stored object, or `None` if it carries no trailer.
pub(crate) fn strip(stored: Bytes) -> Option<Bytes> {
    let len = stored.len();
    let data_len = len.checked_sub(TRAILER_LEN as usize)?;
    if &stored[len - MAGIC.len()..] != MAGIC {
        return None;
    }
    Some(stored.slice(..data_len))
}

/// The caller-visible size of a stored object of `stored_size` bytes.
pub(crate) fn data_size(stored_size: u64) -> Option<u64> {
    stored_size.checked_sub(TRAILER_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_foreign_objects() {
        let data = Bytes::from_static(b"record batch");
        let mut stored = data.to_vec();
        stored.extend_from_slice(&new_trailer());
        assert_eq!(strip(Bytes::from(stored)), Some(data));
        assert_eq!(strip(Bytes::from_static(b"short")), None);
        assert_eq!(strip(Bytes::from(vec![0u8; 40])), None);
        assert_ne!(new_trailer(), new_trailer());
        assert_eq!(data_size(TRAILER_LEN + 5), Some(5));
        assert_eq!(data_size(3), None);
    }
}
