//! The one error type of the layout layer.

use strata_storage::StorageError;

pub type LayoutResult<T> = Result<T, LayoutError>;

/// What can go wrong reading or writing an object of the layout.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The storage failed the request.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),

    /// A stored object does not decode as its kind's schema.
    #[error("corrupt object {key}: {reason}")]
    Corrupt { key: String, reason: String },

    /// A stored object was written by a newer Strata, in a schema this build does not know.
    #[error("object {key} has schema {found}; this build reads schemas up to {supported}")]
    UnsupportedSchema {
        key: String,
        found: u32,
        supported: u32,
    },

    /// A value could not be encoded (a schema that cannot be JSON: a bug, not bad input).
    #[error("cannot encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
}
