//! The Ceph RADOS backend of Strata's storage contract: [`RadosStore`] implements
//! [`strata_storage::ObjectStore`] on a pool (and optional namespace) through librados — the
//! native, lowest-latency path. Create-only is an exclusive create and a full write in one atomic
//! write operation; compare-and-swap is `assert_version` and a full write in one operation, on the
//! object version RADOS bumps on every write (so versions never repeat, even for identical bytes).
//!
//! It owns the translation between the contract and librados (object names are the keys, errnos
//! become [`strata_storage::StorageError`] meanings) and nothing else. It must never block the
//! async runtime (every librados call runs on the blocking pool, bounded by `max_in_flight`),
//! never retry on its own, never write without the condition it was asked for, and never know
//! about Kafka.
//!
//! URL: `rados://POOL[/NAMESPACE]?conf=/etc/ceph/ceph.conf&user=admin[&keyring=PATH]
//! [&max_in_flight=32][&<librados option>=VALUE...]`. Any other query parameter is a librados
//! option set before connecting (`rados_osd_op_timeout=5`); see [`DEFAULT_CEPH_OPTIONS`] for the
//! timeouts set unless given.
//!
//! librados is linked only with the cargo feature `rados` (needs `librados-dev`). Without it
//! the crate still parses URLs, and [`open`] answers that this binary was built without RADOS.

// Tests may use real time and ambient randomness (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod config;

#[cfg(feature = "rados")]
mod ffi;
#[cfg(feature = "rados")]
mod store;

use std::sync::Arc;

use strata_storage::{ObjectStore, StorageResult};

pub use config::{RadosConfig, DEFAULT_CEPH_OPTIONS, DEFAULT_MAX_IN_FLIGHT};
#[cfg(feature = "rados")]
pub use store::RadosStore;

/// Whether this build links librados.
pub const RADOS_SUPPORTED: bool = cfg!(feature = "rados");

/// Opens a `rados://` URL as a shared store, blocking while it connects; the shape
/// `strata_storage::StoreRegistry::register` takes: `registry.register("rados",
/// strata_storage_rados::open)`. Built without the `rados` feature it checks the URL and then
/// reports that RADOS support is missing.
pub fn open(url: &str) -> StorageResult<Arc<dyn ObjectStore>> {
    let config = RadosConfig::from_url(url)?;
    open_config(config)
}

#[cfg(feature = "rados")]
fn open_config(config: RadosConfig) -> StorageResult<Arc<dyn ObjectStore>> {
    Ok(Arc::new(RadosStore::connect_blocking(config)?))
}

#[cfg(not(feature = "rados"))]
fn open_config(config: RadosConfig) -> StorageResult<Arc<dyn ObjectStore>> {
    Err(strata_storage::StorageError::Invalid(format!(
        "cannot open rados://{}: this binary was built without RADOS support \
         (rebuild with the cargo feature `rados`, which needs librados-dev)",
        config.pool
    )))
}

#[cfg(all(test, not(feature = "rados")))]
mod tests {
    use super::*;

    #[test]
    fn built_without_rados_says_so() {
        let err = open("rados://strata?conf=/nonexistent").unwrap_err();
        assert!(
            err.to_string().contains("built without RADOS support"),
            "{err}"
        );
        const { assert!(!RADOS_SUPPORTED) };
    }
}
