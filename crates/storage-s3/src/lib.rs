//! The S3 backend of Strata's storage contract: [`S3Store`] implements
//! [`strata_storage::ObjectStore`] over any S3-compatible service (AWS S3, Ceph RGW, moto) through
//! the `object_store` crate, using conditional PUTs — `If-None-Match: *` for create-only and
//! `If-Match: <etag>` for compare-and-swap — so that ownership fencing is enforced by the service.
//!
//! It owns the translation between the contract and S3 (keys under a URL prefix, ETags as
//! versions, HTTP outcomes as [`strata_storage::StorageError`] meanings) and nothing else. It must
//! never repeat a request whose outcome it cannot see — a retried conditional write can report our
//! own success as a conflict, so `object_store`'s retries are off and Strata's retry wrapper
//! decides, knowing which errors are ambiguous — never fall back to an unconditional write, and
//! never know about Kafka. The only repeats are ones whose first attempt provably did nothing: a
//! read RGW failed with 500 because it overlapped an overwrite, and (with `etag_quotes=auto`) one
//! `If-Match` re-sent unquoted after a 412 while the object still had the very ETag sent. A 500 to
//! a conditional PUT is resolved by looking at what is stored (RGW answers 500 to the losers of
//! concurrent `If-Match` writes): our own bytes mean success, another writer's mean the conflict.
//!
//! URL: `s3://BUCKET[/PREFIX]?endpoint=http://127.0.0.1:PORT&region=us-east-1&allow_http=true`.
//! Credentials come from the standard `AWS_*` environment variables (`AmazonS3Builder::from_env`);
//! any `object_store` S3 or HTTP-client option may also be given as a query parameter (`timeout=5s`,
//! `connect_timeout=1s`, ...), and the URL wins over the environment. Requests are path-style unless
//! `virtual_hosted_style_request=true`. Strata's own options: `etag_quotes=auto|keep|strip` (see
//! [`EtagQuoting`]; Ceph RGW 16.2 needs `strip`, `auto` learns it), `version_trailer=true|false`
//! (below) and `list_page_size=N`.
//!
//! Versions are S3 ETags. A single-part PUT's ETag is the MD5 of its bytes, so on its own it
//! cannot tell two writes of identical bytes apart; every stored object therefore ends with a
//! 24-byte write-unique trailer ([`TRAILER_LEN`]) that reads strip again, making `If-Match` an exact
//! version check (see `trailer.rs`; `version_trailer=false` stores raw bytes and accepts the ABA).

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod bucket;
mod config;
mod errors;
mod store;
mod trailer;

use std::sync::Arc;

pub use config::{EtagQuoting, S3Config};
pub use store::S3Store;
pub use trailer::TRAILER_LEN;

/// Opens an `s3://` URL as a shared store; the shape `strata_storage::StoreRegistry::register`
/// takes: `registry.register("s3", strata_storage_s3::open)`.
pub fn open(url: &str) -> strata_storage::StorageResult<Arc<dyn strata_storage::ObjectStore>> {
    Ok(Arc::new(S3Store::from_url(url)?))
}
