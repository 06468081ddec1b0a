use std::ffi::CString;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use strata_core::{Clock, SystemClock};
use strata_storage::{
    ListedKey, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageError, StorageResult, Version,
};
use tokio::sync::Semaphore;

use crate::config::RadosConfig;
use crate::ffi::{errno_text, Cluster, Condition, Errno, IoCtx};

/// Strata's [`ObjectStore`] on a RADOS pool (and namespace) through librados.
///
/// Every librados call blocks, so each operation runs on tokio's blocking pool, at most
/// `max_in_flight` at a time (a semaphore; further callers wait asynchronously), with an I/O
/// context of its own checked out of a small pool — a context's "last version" belongs to the
/// last operation on it, so two operations must never share one.
pub struct RadosStore {
    shared: Arc<Shared>,
    in_flight: Arc<Semaphore>,
    /// Times requests for error reports (the real clock unless [`Self::with_clock`]).
    clock: Arc<dyn Clock>,
}

struct Shared {
    config: RadosConfig,
    pool: CString,
    namespace: CString,
    /// Declared before `cluster`: contexts must be destroyed before the cluster shuts down.
    idle: Mutex<Vec<IoCtx>>,
    cluster: Cluster,
}

impl fmt::Debug for RadosStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RadosStore")
            .field("pool", &self.shared.config.pool)
            .field("namespace", &self.shared.config.namespace)
            .field("user", &self.shared.config.user)
            .field("max_in_flight", &self.shared.config.max_in_flight)
            .finish()
    }
}

impl RadosStore {
    /// Connects to the cluster a `rados://` URL names and checks the pool exists. Runs the
    /// blocking connect on the blocking pool; fails after `client_mount_timeout` (10 s unless
    /// the URL says otherwise) if no monitor answers.
    pub async fn connect(url: &str) -> StorageResult<Self> {
        let config = RadosConfig::from_url(url)?;
        tokio::task::spawn_blocking(move || Self::connect_blocking(config))
            .await
            .map_err(|err| StorageError::Other(format!("RADOS connect task failed: {err}")))?
    }

    /// [`Self::connect`] for synchronous callers that may block (the server's store registry
    /// at startup). Never call it from async code.
    pub fn connect_blocking(config: RadosConfig) -> StorageResult<Self> {
        let cluster = Cluster::connect(&config).map_err(|err| {
            let message = format!(
                "connecting to RADOS as client.{} ({}): {}",
                config.user,
                err.step,
                errno_text(err.errno)
            );
            match err.errno {
                libc::ETIMEDOUT | libc::ECONNREFUSED | libc::ENOTCONN | libc::EHOSTUNREACH => {
                    StorageError::Unavailable(message)
                }
                _ => StorageError::Invalid(message),
            }
        })?;
        let pool = CString::new(config.pool.clone())
            .map_err(|_| StorageError::Invalid("pool name contains NUL".to_string()))?;
        let namespace = CString::new(config.namespace.clone())
            .map_err(|_| StorageError::Invalid("namespace contains NUL".to_string()))?;
        // Opening one context now turns a missing pool into a startup error.
        let first = cluster.ioctx(&pool, &namespace).map_err(|errno| {
            StorageError::Invalid(format!(
                "opening RADOS pool {:?}: {}",
                config.pool,
                errno_text(errno)
            ))
        })?;
        let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                pool,
                namespace,
                idle: Mutex::new(vec![first]),
                cluster,
            }),
            in_flight,
            clock: SystemClock::shared(),
        })
    }

    /// Times requests on `clock` instead of the real clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The parsed configuration.
    pub fn config(&self) -> &RadosConfig {
        &self.shared.config
    }

    /// Runs `op` with an I/O context on the blocking pool, within the in-flight limit.
    async fn run<T, F>(&self, op: F) -> Result<T, OpError>
    where
        T: Send + 'static,
        F: FnOnce(&IoCtx) -> Result<T, Errno> + Send + 'static,
    {
        let permit = Arc::clone(&self.in_flight)
            .acquire_owned()
            .await
            .map_err(|_| OpError::Internal("RADOS store is shut down".to_string()))?;
        let shared = Arc::clone(&self.shared);
        let started = self.clock.monotonic();
        let joined = tokio::task::spawn_blocking(move || {
            // Held by the blocking thread, so the limit counts operations really running, even
            // when the awaiting future has been dropped.
            let _permit = permit;
            let io = shared.checkout()?;
            let result = op(&io);
            shared.checkin(io);
            result.map_err(OpError::Errno)
        })
        .await;
        let elapsed = self.clock.monotonic().saturating_sub(started);
        match joined {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(OpError::Errno(errno))) => Err(OpError::Timed(errno, elapsed)),
            Ok(Err(other)) => Err(other),
            Err(err) => Err(OpError::Internal(format!("RADOS task failed: {err}"))),
        }
    }

    fn oid(key: &ObjectKey) -> StorageResult<CString> {
        CString::new(key.as_str())
            .map_err(|_| StorageError::Invalid(format!("key {key} contains NUL")))
    }
}

impl Shared {
    fn checkout(&self) -> Result<IoCtx, OpError> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        match idle {
            Some(io) => Ok(io),
            None => self
                .cluster
                .ioctx(&self.pool, &self.namespace)
                .map_err(OpError::Errno),
        }
    }

    fn checkin(&self, io: IoCtx) {
        // A poisoned lock only costs a context, which is then destroyed.
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(io);
        }
    }
}

/// A failed librados call, before it is given a meaning.
#[derive(Debug)]
enum OpError {
    Errno(Errno),
    Timed(Errno, std::time::Duration),
    Internal(String),
}

/// Which operation failed, because an errno means different things for different verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Update,
    Read,
    List,
    Delete,
}

fn map_error(err: OpError, op: Op, key: Option<&ObjectKey>) -> StorageError {
    let (errno, elapsed) = match err {
        OpError::Timed(errno, elapsed) => (errno, elapsed),
        OpError::Errno(errno) => (errno, std::time::Duration::ZERO),
        OpError::Internal(message) => return StorageError::Other(message),
    };
    let text = || match key {
        Some(key) => format!("{key}: {} ({op:?}, errno {errno})", errno_text(errno)),
        None => format!("{} ({op:?}, errno {errno})", errno_text(errno)),
    };
    match (errno, op, key) {
        (libc::ENOENT, Op::Update, Some(key)) => StorageError::Precondition(key.clone()),
        (libc::ENOENT, _, Some(key)) => StorageError::NotFound(key.clone()),
        (libc::EEXIST, Op::Create, Some(key)) => StorageError::AlreadyExists(key.clone()),
        // assert_version: ERANGE when the object is newer than asked, EOVERFLOW when older;
        // ECANCELED is what compare ops (cmpxattr, omap_cmp) answer.
        (libc::ERANGE | libc::EOVERFLOW | libc::ECANCELED, Op::Update, Some(key)) => {
            StorageError::Precondition(key.clone())
        }
        (libc::ETIMEDOUT, _, _) => StorageError::Timeout(elapsed),
        (libc::EBUSY | libc::EAGAIN, _, _) => StorageError::Throttled(text()),
        // A full cluster or pool refuses writes without applying them.
        (libc::ENOSPC | libc::EDQUOT, _, _) => StorageError::Full(text()),
        (
            libc::ENOTCONN
            | libc::ESHUTDOWN
            | libc::ECONNREFUSED
            | libc::ECONNRESET
            | libc::EHOSTUNREACH
            | libc::EIO,
            _,
            _,
        ) => StorageError::Unavailable(text()),
        (libc::EINVAL | libc::ENAMETOOLONG | libc::EFBIG | libc::E2BIG, _, _) => {
            StorageError::Invalid(text())
        }
        _ => StorageError::Other(text()),
    }
}

#[async_trait]
impl ObjectStore for RadosStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let oid = Self::oid(key)?;
        let (condition, op) = match &mode {
            PutMode::Create => (Condition::Absent, Op::Create),
            PutMode::Update(version) => match version.0.parse::<u64>() {
                Ok(version) => (Condition::Version(version), Op::Update),
                // Not a version this backend ever handed out, so it cannot be current.
                Err(_) => return Err(StorageError::Precondition(key.clone())),
            },
        };
        // `data` moves into the blocking task and lives until librados has sent it: no copy.
        let version = self
            .run(move |io| io.write_full(&oid, &data, condition))
            .await
            .map_err(|err| map_error(err, op, Some(key)))?;
        Ok(Version(version.to_string()))
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        let oid = Self::oid(key)?;
        let (data, version) = self
            .run(move |io| io.read_whole(&oid))
            .await
            .map_err(|err| map_error(err, Op::Read, Some(key)))?;
        Ok((Bytes::from(data), Version(version.to_string())))
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        if range.start > range.end {
            return Err(StorageError::Invalid(format!(
                "range {range:?} of {key} ends before it starts"
            )));
        }
        let len = usize::try_from(range.end - range.start)
            .map_err(|_| StorageError::Invalid(format!("range {range:?} is too large")))?;
        let oid = Self::oid(key)?;
        let start = range.start;
        // One operation: the size comes back with the bytes, so "past the end" needs no stat.
        let (data, size) = self
            .run(move |io| io.read_range(&oid, start, len))
            .await
            .map_err(|err| map_error(err, Op::Read, Some(key)))?;
        if range.start > size {
            return Err(StorageError::Invalid(format!(
                "range {range:?} starts past the end of {key} ({size} bytes)"
            )));
        }
        Ok(Bytes::from(data))
    }

    /// RADOS cannot list by prefix: this walks every object of the namespace (the OSDs scan all
    /// placement groups of the pool), keeps the names with the prefix, then sizes them with
    /// pipelined stats. Cost grows with the pool, so the broker lists only for recovery and GC.
    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let wanted = prefix.to_string();
        let found = self
            .run(move |io| {
                let names = io.list_names(|name| name.starts_with(&wanted))?;
                let c_names: Vec<CString> = names
                    .iter()
                    .filter_map(|name| CString::new(name.as_str()).ok())
                    .collect();
                let sizes = io.stat_many(&c_names)?;
                Ok(names.into_iter().zip(sizes).collect::<Vec<_>>())
            })
            .await
            .map_err(|err| map_error(err, Op::List, None))?;
        let mut objects = Vec::with_capacity(found.len());
        for (name, size) in found {
            // Deleted between the listing and the stat: it is gone, so it is not listed.
            let Some(size) = size else { continue };
            match ObjectKey::new(&name) {
                // No change tag: a stat gives size and a seconds-resolution mtime, not the
                // object version, so pollers read RADOS objects every time.
                Ok(key) => objects.push(ObjectMeta {
                    key,
                    size,
                    tag: None,
                }),
                // Not written through Strata; recovery and GC must not fail because of it.
                Err(_) => {
                    tracing::warn!(object = %name, "skipping a RADOS object that is not a valid key")
                }
            }
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// The name listing alone: `list` stats every listed object for its size, one request
    /// each, which pollers (ownership, membership) have no use for.
    async fn list_keys(&self, prefix: &str) -> StorageResult<Vec<ListedKey>> {
        let wanted = prefix.to_string();
        let names = self
            .run(move |io| io.list_names(|name| name.starts_with(&wanted)))
            .await
            .map_err(|err| map_error(err, Op::List, None))?;
        let mut keys: Vec<ListedKey> = names
            .into_iter()
            .filter_map(|name| match ObjectKey::new(&name) {
                Ok(key) => Some(ListedKey { key, tag: None }),
                Err(_) => {
                    tracing::warn!(object = %name, "skipping a RADOS object that is not a valid key");
                    None
                }
            })
            .collect();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(keys)
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        let oid = Self::oid(key)?;
        match self.run(move |io| io.remove(&oid)).await {
            Ok(()) => Ok(()),
            Err(OpError::Timed(libc::ENOENT, _)) => Ok(()),
            Err(err) => Err(map_error(err, Op::Delete, Some(key))),
        }
    }

    fn backend_name(&self) -> &'static str {
        "rados"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_meanings_depend_on_the_verb() {
        let key = ObjectKey::new("owners/t/0").unwrap();
        let map = |errno, op| map_error(OpError::Errno(errno), op, Some(&key));
        assert!(matches!(
            map(libc::EEXIST, Op::Create),
            StorageError::AlreadyExists(_)
        ));
        assert!(matches!(
            map(libc::ERANGE, Op::Update),
            StorageError::Precondition(_)
        ));
        assert!(matches!(
            map(libc::EOVERFLOW, Op::Update),
            StorageError::Precondition(_)
        ));
        assert!(matches!(
            map(libc::ECANCELED, Op::Update),
            StorageError::Precondition(_)
        ));
        assert!(matches!(
            map(libc::ENOENT, Op::Update),
            StorageError::Precondition(_)
        ));
        assert!(matches!(
            map(libc::ENOENT, Op::Read),
            StorageError::NotFound(_)
        ));
        assert!(matches!(
            map(libc::ETIMEDOUT, Op::Read),
            StorageError::Timeout(_)
        ));
        assert!(matches!(
            map(libc::EBUSY, Op::Read),
            StorageError::Throttled(_)
        ));
        assert!(matches!(
            map(libc::ENOTCONN, Op::Create),
            StorageError::Unavailable(_)
        ));
        assert!(matches!(
            map(libc::ENOSPC, Op::Create),
            StorageError::Full(_)
        ));
        assert!(matches!(
            map(libc::EPERM, Op::Create),
            StorageError::Other(_)
        ));
    }
}
