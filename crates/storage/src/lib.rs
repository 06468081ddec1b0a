//! The storage layer: the only durable state Strata has. It owns the [`ObjectStore`] contract —
//! create-only put, get and ranged get, list by prefix, delete, and compare-and-swap on an opaque
//! version — its backends (memory, local directory, later S3 and RADOS) and the wrappers that add
//! retries, timeouts, metrics and fault injection while implementing the same trait.
//!
//! It must never know about Kafka: no wire structs, no offsets, no topics. Keys are opaque
//! `/`-separated strings chosen by the layers above.
//!
//! # Modules
//!
//! - Backends: [`MemoryStore`] (in-process; tests, simulation, broker benchmarks) and
//!   [`LocalStore`] (a directory: fsync'd temp file + `link`/`rename`, `flock` for
//!   compare-and-swap; safe for several processes sharing the directory). S3 and RADOS live in
//!   their own crates.
//! - [`open_store`] and [`StoreRegistry`] turn a configured URL (`memory://`, `file:///path`, a
//!   plain path, or a scheme registered by another crate) into an `Arc<dyn ObjectStore>`.
//! - Wrappers, each an `ObjectStore` around an `Arc<dyn ObjectStore>`: [`RetryStore`] (backoff
//!   with seeded full jitter; resolves ambiguous puts by reading back), [`TimeoutStore`],
//!   [`ConcurrencyLimitStore`], [`MetricsStore`] (per-kind counters and latency histograms into
//!   [`StorageMetrics`], success/failure into [`StorageHealth`]) and [`FaultInjectingStore`]
//!   (seeded random errors and latency, outages, scripted and ambiguous failures).
//!   [`StorageStack`] composes the production ones in the right order.
//! - [`TieredStore`]: a write-ahead tier and a bulk tier behind one store, each key routed by
//!   a [`TierRouting`] the layout supplies (this crate knows no key names).
//! - `conformance` (cargo feature `conformance`): the checks every backend must pass.
//!
//! Listings carry a [`ChangeTag`] per object where the backend knows one for free (the memory
//! store's generation, the local store's header, S3's ETag; RADOS has none), so pollers can
//! re-read only what changed.
//!
//! Errors are [`StorageError`], classified by meaning ([`StorageError::is_retryable`],
//! [`StorageError::is_ambiguous`]); every backend maps its own failures onto it.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod error;
mod fault;
mod health;
mod key;
mod limit;
mod local;
mod memory;
mod metrics;
mod op;
mod retry;
mod stack;
mod store;
mod tier;
mod timeout;
mod url;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use error::{StorageError, StorageResult};
pub use fault::{Fault, FaultConfig, FaultInjectingStore, InjectedError, OpFaults};
pub use health::{is_storage_failure, StorageHealth, StorageHealthSnapshot};
pub use key::ObjectKey;
pub use limit::ConcurrencyLimitStore;
pub use local::LocalStore;
pub use memory::MemoryStore;
pub use metrics::{
    requests_per_gb, KeyArea, LatencyHistogram, MetricsStore, OpMetricsSnapshot, RequestPrices,
    StorageMetrics, StorageMetricsSnapshot, LATENCY_BUCKET_BOUNDS,
};
pub use op::OpKind;
pub use retry::{full_jitter, holds_our_bytes, RetryPolicy, RetryStore};
pub use stack::{StackConfig, StorageStack};
pub use store::{ChangeTag, ListedKey, ObjectMeta, ObjectStore, PutMode, Version};
pub use tier::{PrefixTiers, Tier, TierRouting, TieredStore};
pub use timeout::TimeoutStore;
pub use url::{local_directory, open_store, url_scheme, StoreOpener, StoreRegistry};
