//! Scratch storage for the benchmarks that open storage themselves instead of spawning a
//! broker (`lookup`, `restarts`): a fresh place per run, opened through the same registry
//! as the broker's, and emptied afterwards.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use strata_storage::{ObjectStore, StoreRegistry};

/// A fresh place named `name`: a new directory under `dir`, or `storage` with `name`
/// appended as a path segment (a subdirectory, a RADOS namespace, an S3 prefix). Returns the
/// URL and the directory to remove afterwards, if any.
pub fn fresh(storage: Option<&str>, dir: &Path, name: &str) -> Result<(String, Option<PathBuf>)> {
    match storage {
        None => {
            let dir = dir.join(name);
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            Ok((format!("file://{}", dir.display()), Some(dir)))
        }
        Some(url) => {
            let (base, query) = match url.split_once('?') {
                Some((base, query)) => (base, format!("?{query}")),
                None => (url, String::new()),
            };
            Ok((
                format!("{}/{name}{query}", base.trim_end_matches('/')),
                None,
            ))
        }
    }
}

/// Opens `url` (librados connects synchronously, hence the blocking thread).
pub async fn open(url: &str) -> Result<Arc<dyn ObjectStore>> {
    let opened = url.to_string();
    tokio::task::spawn_blocking(move || registry().open(&opened))
        .await
        .context("open the store")?
        .with_context(|| format!("open {url}"))
}

/// Deletes every object of a store opened on a place of its own.
pub async fn delete_all(store: &Arc<dyn ObjectStore>) -> Result<()> {
    for meta in store.list("").await.context("list for cleanup")? {
        store
            .delete(&meta.key)
            .await
            .context("delete for cleanup")?;
    }
    Ok(())
}

fn registry() -> StoreRegistry {
    #[allow(unused_mut)]
    let mut registry = StoreRegistry::with_builtins();
    #[cfg(feature = "rados")]
    registry.register("rados", strata_storage_rados::open);
    registry
}
