//! The storage layer: the only durable state Strata has. It owns the [`ObjectStore`] contract —
//! create-only put, get and ranged get, list by prefix, delete, and compare-and-swap on an opaque
//! version — its backends (memory, local directory, later S3 and RADOS) and the wrappers that add
//! retries, timeouts, metrics and fault injection while implementing the same trait.
//!
//! It must never know about Kafka: no wire structs, no offsets, no topics. Keys are opaque
//! `/`-separated strings chosen by the layers above.

mod error;
mod key;
mod store;

pub use error::{StorageError, StorageResult};
pub use key::ObjectKey;
pub use store::{ObjectMeta, ObjectStore, PutMode, Version};
