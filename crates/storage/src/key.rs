use std::fmt;
use std::sync::Arc;

/// A storage key: `/`-separated ASCII segments, no empty segment, no `.` or `..`.
///
/// Validation lives here so every backend (including the local directory, where a key becomes a
/// path) can trust keys it is handed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey(Arc<str>);

impl ObjectKey {
    /// Builds a key, rejecting anything that could escape a directory or confuse a listing.
    pub fn new(key: impl AsRef<str>) -> Result<Self, crate::StorageError> {
        let key = key.as_ref();
        if key.is_empty() || key.len() > 1024 || !key.split('/').all(is_valid_segment) {
            return Err(crate::StorageError::Invalid(format!(
                "bad object key {key:?}"
            )));
        }
        Ok(Self(key.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `segment` may appear between two `/` of a key. Backends rely on the characters this
/// excludes: the local directory marks its object, temp and lock files with `@`, which no key
/// segment can contain, so they can never collide with a key's directory.
pub(crate) fn is_valid_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment != "."
        && segment != ".."
        && segment.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'=' | b'%' | b'+')
        })
}

/// Keys compare, hash and order exactly as their strings do, so maps keyed by `ObjectKey` can be
/// searched with a plain `&str` (the memory store's prefix listing uses this).
impl std::borrow::Borrow<str> for ObjectKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_keys_that_escape_or_confuse() {
        for bad in [
            "", "/a", "a/", "a//b", "../x", "a/../b", "a/./b", "a b", "a\0b",
        ] {
            assert!(ObjectKey::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in [
            "a",
            "wal/1/0/00000000000000000001",
            "log/my-topic/3/manifest",
            "x.y=z%20",
        ] {
            assert!(ObjectKey::new(good).is_ok(), "{good:?} rejected");
        }
    }
}
