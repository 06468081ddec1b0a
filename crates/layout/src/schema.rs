//! Versioned JSON encoding of stored objects.
//!
//! An object is its schema's JSON with a `schema` number beside its fields. Decoding reads the
//! number first: absent means 1 (every object written before versioning is schema 1, so old
//! data reads unchanged), larger than [`Schema::SCHEMA`] is refused. Readers of older builds
//! ignore the extra field, so a rolling upgrade can mix both.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{LayoutError, LayoutResult};

/// A stored JSON schema and its current number.
pub trait Schema: Serialize + DeserializeOwned {
    /// The schema number this build writes, and the newest it reads.
    const SCHEMA: u32;
    /// What the object is, for error messages.
    const WHAT: &'static str;
}

#[derive(Serialize)]
struct Envelope<'a, T> {
    schema: u32,
    #[serde(flatten)]
    body: &'a T,
}

#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    schema: Option<u32>,
}

/// Encodes `value` with its schema number.
pub fn encode<T: Schema>(value: &T) -> LayoutResult<Bytes> {
    serde_json::to_vec(&Envelope {
        schema: T::SCHEMA,
        body: value,
    })
    .map(Bytes::from)
    .map_err(|e| LayoutError::Encode {
        what: T::WHAT,
        reason: e.to_string(),
    })
}

/// Decodes an object read from `key` (named in errors).
pub fn decode<T: Schema>(key: &str, bytes: &[u8]) -> LayoutResult<T> {
    let corrupt = |e: serde_json::Error| LayoutError::Corrupt {
        key: key.to_owned(),
        reason: format!("{}: {e}", T::WHAT),
    };
    let found = serde_json::from_slice::<Probe>(bytes)
        .map_err(corrupt)?
        .schema
        .unwrap_or(1);
    if found > T::SCHEMA {
        return Err(LayoutError::UnsupportedSchema {
            key: key.to_owned(),
            found,
            supported: T::SCHEMA,
        });
    }
    serde_json::from_slice(bytes).map_err(corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Thing {
        a: u32,
    }

    impl Schema for Thing {
        const SCHEMA: u32 = 1;
        const WHAT: &'static str = "thing";
    }

    #[test]
    fn writes_its_number_reads_unversioned_and_refuses_newer() {
        let bytes = encode(&Thing { a: 3 }).unwrap();
        assert_eq!(&bytes[..], br#"{"schema":1,"a":3}"#);
        assert_eq!(decode::<Thing>("k", &bytes).unwrap(), Thing { a: 3 });
        assert_eq!(decode::<Thing>("k", br#"{"a":4}"#).unwrap(), Thing { a: 4 });
        assert!(matches!(
            decode::<Thing>("k", br#"{"schema":2,"a":4}"#),
            Err(LayoutError::UnsupportedSchema { found: 2, .. })
        ));
        assert!(matches!(
            decode::<Thing>("k", b"nope"),
            Err(LayoutError::Corrupt { .. })
        ));
    }
}
