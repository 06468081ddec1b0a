//! Turning a storage URL from the configuration into a store.
//!
//! This crate knows the built-in backends (`memory://`, `file://` and plain paths). Backends that
//! live in their own crates (S3, RADOS) plug in through [`StoreRegistry::register`], so the server
//! builds one registry with every backend it was compiled with and opens whatever URL it is given:
//!
//! ```ignore
//! let mut registry = StoreRegistry::with_builtins();
//! registry.register("s3", strata_storage_s3::open);
//! let store = registry.open(&settings.storage_url)?;
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use crate::{LocalStore, MemoryStore, ObjectStore, StorageError, StorageResult};

/// Opens a store from a URL of one scheme. Called only with URLs whose scheme it was registered
/// for. Openers run at startup and may block (connect, create a directory).
pub type StoreOpener = Arc<dyn Fn(&str) -> StorageResult<Arc<dyn ObjectStore>> + Send + Sync>;

/// Opens a built-in store:
///
/// - `memory://` — a fresh, empty in-process store.
/// - `memory://<name>` — the process-wide memory store called `<name>`, created on first use:
///   several brokers in one process given the same URL share one store, as they would share a
///   bucket.
/// - `file:///absolute/path` (or `file://localhost/...`) — a [`LocalStore`] on that directory.
/// - anything without `://` — a relative or absolute directory path, same as `file://`.
///
/// Any other scheme is `Invalid`, saying the backend is not built in; see [`StoreRegistry`] to add
/// backends from other crates.
pub fn open_store(url: &str) -> StorageResult<Arc<dyn ObjectStore>> {
    StoreRegistry::with_builtins().open(url)
}

/// The scheme of a storage URL, lowercased (`"s3"` for `s3://bucket/prefix`), or `None` for a
/// plain path. A URL is anything containing `://` after a valid scheme name.
pub fn url_scheme(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then(|| scheme.to_ascii_lowercase())
}

/// Storage URL schemes and how to open each.
#[derive(Clone)]
pub struct StoreRegistry {
    openers: BTreeMap<String, StoreOpener>,
}

impl fmt::Debug for StoreRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreRegistry")
            .field("schemes", &self.openers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl StoreRegistry {
    /// A registry that knows no scheme at all (plain paths still open a local directory).
    pub fn empty() -> Self {
        Self {
            openers: BTreeMap::new(),
        }
    }

    /// A registry with this crate's backends: `memory` and `file`.
    pub fn with_builtins() -> Self {
        let mut registry = Self::empty();
        registry.register("memory", open_memory_url);
        registry.register("file", open_file_url);
        registry
    }

    /// Adds (or replaces) the opener for `scheme` (case-insensitive, without `://`).
    pub fn register(
        &mut self,
        scheme: &str,
        opener: impl Fn(&str) -> StorageResult<Arc<dyn ObjectStore>> + Send + Sync + 'static,
    ) -> &mut Self {
        self.openers
            .insert(scheme.to_ascii_lowercase(), Arc::new(opener));
        self
    }

    /// The schemes this registry can open, sorted.
    pub fn schemes(&self) -> impl Iterator<Item = &str> {
        self.openers.keys().map(String::as_str)
    }

    /// Opens the store a URL (or plain directory path) names.
    pub fn open(&self, url: &str) -> StorageResult<Arc<dyn ObjectStore>> {
        let url = url.trim();
        if url.is_empty() {
            return Err(StorageError::Invalid("storage URL is empty".into()));
        }
        let Some(scheme) = url_scheme(url) else {
            if url.contains("://") {
                return Err(StorageError::Invalid(format!(
                    "storage URL {url:?} has a malformed scheme"
                )));
            }
            return Ok(Arc::new(LocalStore::open(url)?));
        };
        match self.openers.get(&scheme) {
            Some(opener) => opener(url),
            None => Err(StorageError::Invalid(format!(
                "storage backend {scheme:?} (from {url:?}) is not built into this binary; \
                 available: {}",
                self.schemes().collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

impl Default for StoreRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

fn open_memory_url(url: &str) -> StorageResult<Arc<dyn ObjectStore>> {
    let name = after_scheme(url).trim_end_matches('/');
    if name.is_empty() {
        return Ok(Arc::new(MemoryStore::new()));
    }
    // Strong references on purpose: a named store lives as long as the process, like a bucket
    // outlives the brokers that use it, so a broker restarted in-process finds its data again.
    static NAMED: OnceLock<Mutex<HashMap<String, Arc<MemoryStore>>>> = OnceLock::new();
    let mut named = NAMED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let store = named.entry(name.to_owned()).or_default();
    Ok(Arc::clone(store) as Arc<dyn ObjectStore>)
}

/// The directory a local-directory URL (`file://` or a plain path) names, None for any other
/// backend. Lets a caller that must not create a store (the operator commands) check first.
pub fn local_directory(url: &str) -> StorageResult<Option<PathBuf>> {
    let url = url.trim();
    match url_scheme(url).as_deref() {
        None if !url.contains("://") => Ok(Some(PathBuf::from(url))),
        Some("file") => file_url_path(url).map(Some),
        _ => Ok(None),
    }
}

fn open_file_url(url: &str) -> StorageResult<Arc<dyn ObjectStore>> {
    Ok(Arc::new(LocalStore::open(file_url_path(url)?)?))
}

fn file_url_path(url: &str) -> StorageResult<PathBuf> {
    let rest = after_scheme(url);
    // `file:///p` has an empty host; `localhost` is the only other host that means this machine.
    let path = if rest.starts_with('/') {
        rest
    } else if let Some(path) = rest
        .strip_prefix("localhost")
        .filter(|p| p.starts_with('/'))
    {
        path
    } else {
        return Err(StorageError::Invalid(format!(
            "file URL {url:?} must be file:///absolute/path (a plain path may be relative)"
        )));
    };
    percent_decode(path)
        .ok_or_else(|| StorageError::Invalid(format!("bad percent-encoding in {url:?}")))
}

fn after_scheme(url: &str) -> &str {
    url.split_once("://").map_or("", |(_, rest)| rest)
}

/// Decodes `%XX` escapes, so paths with spaces can be written as URLs.
fn percent_decode(path: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{ObjectKey, PutMode};

    #[test]
    fn local_directories_are_named_without_being_created() {
        let dir = |url: &str| local_directory(url).unwrap();
        assert_eq!(dir("./data"), Some(PathBuf::from("./data")));
        assert_eq!(dir("file:///var/x%20y"), Some(PathBuf::from("/var/x y")));
        assert_eq!(dir("file://localhost/v"), Some(PathBuf::from("/v")));
        assert_eq!(dir("s3://bucket/prefix"), None);
        assert_eq!(dir("memory://"), None);
        assert!(local_directory("file://host/v").is_err());
    }

    #[test]
    fn schemes_are_parsed_case_insensitively_and_paths_have_none() {
        assert_eq!(url_scheme("S3://bucket/x").as_deref(), Some("s3"));
        assert_eq!(url_scheme("rados://pool").as_deref(), Some("rados"));
        assert_eq!(url_scheme("/var/lib/strata"), None);
        assert_eq!(url_scheme("data/strata"), None);
        assert_eq!(url_scheme("1x://y"), None);
    }

    #[test]
    fn unknown_schemes_say_the_backend_is_not_built_in() {
        for url in ["s3://bucket/prefix", "rados://pool", "gopher://x"] {
            let err = open_store(url).unwrap_err();
            assert!(matches!(err, StorageError::Invalid(_)), "{url}: {err}");
            assert!(err.to_string().contains("not built into"), "{url}: {err}");
        }
        assert!(matches!(open_store(""), Err(StorageError::Invalid(_))));
        assert!(matches!(open_store("://x"), Err(StorageError::Invalid(_))));
    }

    #[test]
    fn file_urls_and_plain_paths_open_local_stores() {
        let dir = tempfile::tempdir().unwrap();
        let as_url = format!("file://{}", dir.path().join("by%20url").display());
        assert_eq!(open_store(&as_url).unwrap().backend_name(), "file");
        assert!(dir.path().join("by url").is_dir());

        let localhost = format!("file://localhost{}", dir.path().join("lh").display());
        open_store(&localhost).unwrap();
        assert!(dir.path().join("lh").is_dir());

        let plain = dir.path().join("plain");
        open_store(plain.to_str().unwrap()).unwrap();
        assert!(plain.is_dir());

        assert!(matches!(
            open_store("file://otherhost/x"),
            Err(StorageError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn named_memory_stores_are_shared_and_anonymous_ones_are_not() {
        let key = ObjectKey::new("k").unwrap();
        let a = open_store("memory://url-test-shared").unwrap();
        a.put(&key, Bytes::from_static(b"v"), PutMode::Create)
            .await
            .unwrap();
        let b = open_store("memory://url-test-shared/").unwrap();
        assert_eq!(&b.get(&key).await.unwrap().0[..], b"v");
        let fresh = open_store("memory://").unwrap();
        assert!(fresh.get(&key).await.unwrap_err().is_not_found());
    }

    #[test]
    fn registered_schemes_are_dispatched_to_their_opener() {
        let mut registry = StoreRegistry::with_builtins();
        registry.register("S3", |_url| {
            Ok(Arc::new(MemoryStore::new()) as Arc<dyn ObjectStore>)
        });
        assert_eq!(
            registry.schemes().collect::<Vec<_>>(),
            ["file", "memory", "s3"]
        );
        assert_eq!(
            registry.open("s3://bucket").unwrap().backend_name(),
            "memory"
        );
    }
}
