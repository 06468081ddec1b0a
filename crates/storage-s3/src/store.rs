use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::aws::AmazonS3;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, ObjectStore as _, ObjectStoreExt as _, PutMode as OsPutMode, PutOptions,
    PutPayload, UpdateVersion,
};
use strata_core::{Clock, SystemClock};
use strata_storage::{
    ChangeTag, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageError, StorageResult, Version,
};

use crate::config::{EtagQuoting, S3Config};
use crate::errors::{http_status, is_final_server_error, map_error, Op};
use crate::trailer::{self, TRAILER_LEN};

/// How many times a read that overlapped an overwrite on RGW (500) is made in all.
const TORN_READ_ATTEMPTS: u32 = 5;

/// What `EtagQuoting::Auto` has learned about the server so far.
const LEARNED_NOTHING: u8 = 0;
const LEARNED_QUOTED: u8 = 1;
const LEARNED_UNQUOTED: u8 = 2;

/// Strata's [`ObjectStore`] over an S3-compatible service. Cheap to share behind an `Arc`; the
/// HTTP connection pool lives inside.
pub struct S3Store {
    inner: Arc<AmazonS3>,
    config: S3Config,
    /// For `EtagQuoting::Auto`: which `If-Match` form the server accepted last.
    learned_quoting: AtomicU8,
    /// Times requests for error reports (the real clock unless [`Self::with_clock`]).
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Store")
            .field("bucket", &self.config.bucket)
            .field("prefix", &self.config.prefix)
            .field("endpoint", &self.config.endpoint())
            .field("etag_quoting", &self.config.etag_quoting)
            .finish()
    }
}

impl S3Store {
    /// Builds a store from `s3://BUCKET[/PREFIX]?options` plus the `AWS_*` environment (see the
    /// crate docs). Does no IO: a wrong endpoint or missing bucket shows on the first request.
    pub fn from_url(url: &str) -> StorageResult<Self> {
        Self::from_config(S3Config::from_url(url)?)
    }

    /// Builds a store from an already parsed [`S3Config`].
    pub fn from_config(config: S3Config) -> StorageResult<Self> {
        let inner = config
            .builder()
            .build()
            .map_err(|err| StorageError::Invalid(format!("S3 configuration: {err}")))?;
        Ok(Self {
            inner: Arc::new(inner),
            config,
            learned_quoting: AtomicU8::new(LEARNED_NOTHING),
            clock: SystemClock::shared(),
        })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &S3Config {
        &self.config
    }

    fn path(&self, key: &ObjectKey) -> StorageResult<Path> {
        let raw = match &self.config.prefix {
            Some(prefix) => format!("{prefix}/{key}"),
            None => key.as_str().to_string(),
        };
        // `parse`, not `from`: `from` would percent-encode `%` and the S3 key would no longer be
        // the Strata key, which breaks listings and any other tool looking at the bucket.
        Path::parse(raw).map_err(|err| StorageError::Invalid(err.to_string()))
    }

    fn key_of(&self, location: &str) -> StorageResult<ObjectKey> {
        let relative = match &self.config.prefix {
            Some(prefix) => location
                .strip_prefix(prefix.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .ok_or_else(|| {
                    StorageError::Other(format!("listing returned {location:?} outside {prefix:?}"))
                })?,
            None => location,
        };
        ObjectKey::new(relative)
    }

    fn send_quoted(&self) -> bool {
        match self.config.etag_quoting {
            EtagQuoting::Keep => true,
            EtagQuoting::Strip => false,
            EtagQuoting::Auto => self.learned_quoting.load(Ordering::Relaxed) != LEARNED_UNQUOTED,
        }
    }

    async fn put_once(
        &self,
        path: &Path,
        outgoing: &Outgoing,
        mode: OsPutMode,
    ) -> Result<object_store::PutResult, object_store::Error> {
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.inner.put_opts(path, outgoing.payload(), options).await
    }

    fn outgoing(&self, data: Bytes) -> Outgoing {
        Outgoing {
            data,
            trailer: self.config.version_trailer.then(trailer::new_trailer),
        }
    }

    /// One conditional put. A 500 is the server's final word but not a verdict: RGW answers 500
    /// (ECANCELED) to the losers of concurrent `If-Match` writes, and AWS may answer 500 to a
    /// write that landed. So after a 500 the object is inspected: our own bytes there mean we
    /// won, another writer's mean we lost, and only "unchanged" leaves the 500 standing.
    async fn put_resolving(
        &self,
        key: &ObjectKey,
        path: &Path,
        outgoing: &Outgoing,
        mode: OsPutMode,
        expected: Option<&str>,
    ) -> Result<Version, PutFailure> {
        let started = self.clock.monotonic();
        let err = match self.put_once(path, outgoing, mode).await {
            Ok(result) => return version_of(key, result.e_tag).map_err(PutFailure::Mapped),
            Err(object_store::Error::Precondition { .. }) => return Err(PutFailure::Rejected),
            Err(err) => err,
        };
        let op = if expected.is_some() {
            Op::Update
        } else {
            Op::Create
        };
        let final_server_error = is_final_server_error(&err);
        let original = map_error(
            err,
            op,
            Some(key),
            self.clock.monotonic().saturating_sub(started),
        );
        if !final_server_error {
            return Err(PutFailure::Mapped(original));
        }
        let found = match self.inspect(path, outgoing).await {
            Ok(found) => found,
            Err(err) => {
                tracing::debug!(%key, %err, "cannot inspect after a 500 to a conditional put");
                return Err(PutFailure::Mapped(original));
            }
        };
        tracing::debug!(%key, ?found, ?expected, %original, "resolving a 500 to a conditional put");
        let conflict = match (found, expected) {
            (Found::Ours(version), _) => return Ok(version),
            (Found::Indistinguishable, _) | (Found::Missing, None) => original,
            (Found::Missing, Some(_)) => StorageError::Precondition(key.clone()),
            (Found::Other(_), None) => StorageError::AlreadyExists(key.clone()),
            (Found::Other(tag), Some(expected)) => {
                if tag.as_deref().map(|t| t.trim_matches('"')) == Some(expected) {
                    original
                } else {
                    StorageError::Precondition(key.clone())
                }
            }
        };
        Err(PutFailure::Mapped(conflict))
    }

    /// What the key holds now, relative to `outgoing`.
    async fn inspect(
        &self,
        path: &Path,
        outgoing: &Outgoing,
    ) -> Result<Found, object_store::Error> {
        match &outgoing.trailer {
            // The trailer's nonce is ours alone: finding it at the end is proof.
            Some(trailer) => {
                let options = GetOptions {
                    range: Some(GetRange::Suffix(TRAILER_LEN)),
                    ..GetOptions::default()
                };
                let (tail, meta) = match self.read(path, options).await {
                    Ok(read) => read,
                    Err(object_store::Error::NotFound { .. }) => return Ok(Found::Missing),
                    Err(err) => return Err(err),
                };
                Ok(match meta.e_tag {
                    Some(tag) if tail == *trailer => Found::Ours(Version(tag)),
                    other => Found::Other(other),
                })
            }
            // Raw objects: the ETag is the MD5 of the bytes. A different ETag proves another
            // writer; the same one cannot tell our write from another writer's identical bytes
            // (on RGW two CAS racers writing the same bytes: one wins, one gets 500), so that
            // stays unresolved rather than letting both believe they won.
            None => {
                let meta = match self.head(path).await {
                    Ok(meta) => meta,
                    Err(object_store::Error::NotFound { .. }) => return Ok(Found::Missing),
                    Err(err) => return Err(err),
                };
                let ours = md5_hex(&outgoing.data);
                Ok(match meta.e_tag {
                    Some(tag) if tag.trim_matches('"') == ours => Found::Indistinguishable,
                    other => Found::Other(other),
                })
            }
        }
    }

    /// The caller's bytes of a whole stored object.
    fn unwrap_stored(&self, key: &ObjectKey, stored: Bytes) -> StorageResult<Bytes> {
        if !self.config.version_trailer {
            return Ok(stored);
        }
        trailer::strip(stored).ok_or_else(|| foreign_object(key))
    }

    /// The caller-visible size of a stored object.
    fn visible_size(&self, key: &ObjectKey, stored_size: u64) -> StorageResult<u64> {
        if !self.config.version_trailer {
            return Ok(stored_size);
        }
        trailer::data_size(stored_size).ok_or_else(|| foreign_object(key))
    }

    async fn put_update(
        &self,
        key: &ObjectKey,
        path: &Path,
        data: Bytes,
        expected: &Version,
    ) -> StorageResult<Version> {
        let quoted = with_quotes(&expected.0);
        let unquoted = quoted.trim_matches('"').to_string();
        let outgoing = self.outgoing(data);
        let send_quoted = self.send_quoted();
        let first = if send_quoted { &quoted } else { &unquoted };
        match self
            .put_resolving(key, path, &outgoing, update_mode(first), Some(&unquoted))
            .await
        {
            Ok(version) => {
                self.learn(send_quoted);
                return Ok(version);
            }
            Err(PutFailure::Rejected)
                if send_quoted
                    && self.config.etag_quoting == EtagQuoting::Auto
                    && self.learned_quoting.load(Ordering::Relaxed) == LEARNED_NOTHING => {}
            Err(failure) => return Err(failure.into_error(key)),
        }

        // 412 to the quoted form on a server we know nothing about. If the object still carries
        // the ETag we sent, the server did not understand the quoted tag (RGW 16.2); asking again
        // unquoted is a fresh atomic If-Match, so this can never overwrite someone else's write.
        let started = self.clock.monotonic();
        let current = match self.head(path).await {
            Ok(meta) => meta.e_tag,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(StorageError::Precondition(key.clone()))
            }
            Err(err) => {
                return Err(map_error(
                    err,
                    Op::Read,
                    Some(key),
                    self.clock.monotonic().saturating_sub(started),
                ))
            }
        };
        if current.as_deref().map(|tag| tag.trim_matches('"')) != Some(unquoted.as_str()) {
            return Err(StorageError::Precondition(key.clone()));
        }
        let version = self
            .put_resolving(
                key,
                path,
                &outgoing,
                update_mode(&unquoted),
                Some(&unquoted),
            )
            .await
            .map_err(|failure| failure.into_error(key))?;
        self.learn(false);
        tracing::info!(
            bucket = %self.config.bucket,
            "S3 server accepts If-Match only unquoted (Ceph RGW); sending ETags unquoted"
        );
        Ok(version)
    }

    /// GET (whole or ranged) and read the body. RGW 16.2 answers 500 (ECANCELED) to a read that
    /// overlaps an overwrite of the same object; such a read had no effect and the next one sees
    /// a whole object, so a 500 is repeated at once, a few times. Every other failure surfaces
    /// unretried, for Strata's retry wrapper to judge.
    async fn read(
        &self,
        path: &Path,
        options: GetOptions,
    ) -> Result<(Bytes, object_store::ObjectMeta), object_store::Error> {
        let mut attempt = 1;
        loop {
            let outcome = match self.inner.get_opts(path, options.clone()).await {
                Ok(result) => {
                    let meta = result.meta.clone();
                    result.bytes().await.map(|bytes| (bytes, meta))
                }
                Err(err) => Err(err),
            };
            match outcome {
                Err(err) if attempt < TORN_READ_ATTEMPTS && is_final_server_error(&err) => {
                    tracing::debug!(%path, attempt, "read overlapped a write (500); reading again");
                    attempt += 1;
                    tokio::task::yield_now().await;
                }
                other => return other,
            }
        }
    }

    /// HEAD, with [`Self::read`]'s handling of reads that overlap a write.
    async fn head(&self, path: &Path) -> Result<object_store::ObjectMeta, object_store::Error> {
        let mut attempt = 1;
        loop {
            match self.inner.head(path).await {
                Err(err) if attempt < TORN_READ_ATTEMPTS && is_final_server_error(&err) => {
                    attempt += 1;
                    tokio::task::yield_now().await;
                }
                other => return other,
            }
        }
    }

    fn learn(&self, quoted: bool) {
        if self.config.etag_quoting == EtagQuoting::Auto {
            let form = if quoted {
                LEARNED_QUOTED
            } else {
                LEARNED_UNQUOTED
            };
            self.learned_quoting.store(form, Ordering::Relaxed);
        }
    }

    async fn size_of(&self, key: &ObjectKey, path: &Path) -> StorageResult<u64> {
        let started = self.clock.monotonic();
        let stored = self.head(path).await.map(|meta| meta.size).map_err(|err| {
            map_error(
                err,
                Op::Read,
                Some(key),
                self.clock.monotonic().saturating_sub(started),
            )
        })?;
        self.visible_size(key, stored)
    }

    /// Creates the bucket this store points at; succeeds if it already exists and is ours. For
    /// tests and setup scripts: the broker itself assumes the bucket exists.
    pub async fn create_bucket(&self) -> StorageResult<()> {
        crate::bucket::create_bucket(&self.config, &self.inner).await
    }
}

/// One put's bytes as sent, kept so that a failed put can be recognised in storage afterwards.
struct Outgoing {
    data: Bytes,
    trailer: Option<Bytes>,
}

impl Outgoing {
    fn payload(&self) -> PutPayload {
        match &self.trailer {
            // Two chunks: the caller's bytes go out as they are, uncopied.
            Some(trailer) => PutPayload::from_iter([self.data.clone(), trailer.clone()]),
            None => PutPayload::from_bytes(self.data.clone()),
        }
    }
}

/// What a key holds after a failed put, compared with what we sent.
#[derive(Debug)]
enum Found {
    Ours(Version),
    /// Raw mode only: bytes identical to ours, written by us or by someone else.
    Indistinguishable,
    Other(Option<String>),
    Missing,
}

/// How one conditional PUT failed.
enum PutFailure {
    /// 412: the condition did not hold (or, for `EtagQuoting::Auto`, maybe the tag's form).
    Rejected,
    /// Any other failure, already given its meaning.
    Mapped(StorageError),
}

impl PutFailure {
    fn into_error(self, key: &ObjectKey) -> StorageError {
        match self {
            // object_store turns a 412 to If-None-Match into AlreadyExists itself, so a
            // Precondition here always comes from If-Match.
            PutFailure::Rejected => StorageError::Precondition(key.clone()),
            PutFailure::Mapped(err) => err,
        }
    }
}

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest as _;
    let digest = md5::Md5::digest(data);
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn update_mode(e_tag: &str) -> OsPutMode {
    OsPutMode::Update(UpdateVersion {
        e_tag: Some(e_tag.to_string()),
        version: None,
    })
}

/// Versions are kept exactly as the server sent them (quoted), so they compare equal whichever
/// call returned them; this restores the quotes if a caller built one by hand.
fn with_quotes(tag: &str) -> String {
    if tag.starts_with('"') || tag.starts_with("W/\"") {
        tag.to_string()
    } else {
        format!("\"{tag}\"")
    }
}

fn version_of(key: &ObjectKey, e_tag: Option<String>) -> StorageResult<Version> {
    e_tag.map(Version).ok_or_else(|| {
        StorageError::Other(format!(
            "server returned no ETag for {key}; compare-and-swap is impossible without one"
        ))
    })
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let path = self.path(key)?;
        match mode {
            PutMode::Create => {
                let outgoing = self.outgoing(data);
                self.put_resolving(key, &path, &outgoing, OsPutMode::Create, None)
                    .await
                    .map_err(|failure| failure.into_error(key))
            }
            PutMode::Update(expected) => self.put_update(key, &path, data, &expected).await,
        }
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        let path = self.path(key)?;
        let started = self.clock.monotonic();
        let (stored, meta) = self
            .read(&path, GetOptions::default())
            .await
            .map_err(|err| {
                map_error(
                    err,
                    Op::Read,
                    Some(key),
                    self.clock.monotonic().saturating_sub(started),
                )
            })?;
        Ok((
            self.unwrap_stored(key, stored)?,
            version_of(key, meta.e_tag)?,
        ))
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        if range.start > range.end {
            return Err(StorageError::Invalid(format!(
                "range {range:?} of {key} ends before it starts"
            )));
        }
        let path = self.path(key)?;
        // HTTP cannot ask for zero bytes, and a range that starts at the end gets 416 (or, for an
        // empty object, a 200 that object_store rejects); both need the size to answer right.
        if range.start == range.end {
            let size = self.size_of(key, &path).await?;
            return empty_or_invalid(key, &range, size);
        }
        let started = self.clock.monotonic();
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            ..GetOptions::default()
        };
        match self.read(&path, options).await {
            Ok((bytes, meta)) => {
                let stored_size = meta.size;
                // The server cut the range at the stored end, which may include trailer bytes.
                let size = self.visible_size(key, stored_size)?;
                if range.start >= size {
                    return empty_or_invalid(key, &range, size);
                }
                let keep = usize::try_from(range.end.min(size) - range.start)
                    .map_err(|_| StorageError::Invalid(format!("range {range:?} too large")))?;
                if bytes.len() < keep {
                    return Err(StorageError::Other(format!(
                        "short ranged read of {key}: {} bytes for {range:?}",
                        bytes.len()
                    )));
                }
                Ok(bytes.slice(..keep))
            }
            Err(err @ object_store::Error::NotFound { .. }) => Err(map_error(
                err,
                Op::Read,
                Some(key),
                self.clock.monotonic().saturating_sub(started),
            )),
            Err(err) if unsatisfiable_range(&err) => {
                let size = self.size_of(key, &path).await?;
                empty_or_invalid(key, &range, size)
            }
            Err(err) => Err(map_error(
                err,
                Op::Read,
                Some(key),
                self.clock.monotonic().saturating_sub(started),
            )),
        }
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let full_prefix = match &self.config.prefix {
            Some(base) => format!("{base}/{prefix}"),
            None => prefix.to_string(),
        };
        let mut objects = Vec::new();
        let mut page_token = None;
        loop {
            let options = PaginatedListOptions {
                page_token: page_token.take(),
                max_keys: self.config.list_page_size,
                ..PaginatedListOptions::default()
            };
            let started = self.clock.monotonic();
            // A raw string prefix, not object_store's `list`, which would treat "wal/1" as the
            // directory "wal/1/" and miss "wal/10/...". No delimiter: the whole subtree.
            let page = self
                .inner
                .list_paginated(
                    Some(full_prefix.as_str()).filter(|p| !p.is_empty()),
                    options,
                )
                .await
                .map_err(|err| {
                    map_error(
                        err,
                        Op::List,
                        None,
                        self.clock.monotonic().saturating_sub(started),
                    )
                })?;
            for meta in page.result.objects {
                let key = match self.key_of(meta.location.as_ref()) {
                    Ok(key) => key,
                    // Not written through Strata; recovery and GC must not fail because of it.
                    Err(err) => {
                        tracing::warn!(object = %meta.location, %err, "skipping an S3 object");
                        continue;
                    }
                };
                // A foreign object must not make recovery's or GC's listing fail; it shows with
                // size 0 here and fails loudly when read.
                let size = self.visible_size(&key, meta.size).unwrap_or_else(|_| {
                    tracing::warn!(%key, size = meta.size, "object without a version trailer");
                    0
                });
                // The ETag changes with every write: each carries a fresh random trailer (raw
                // mode: same bytes give the same ETag, but then also the same content).
                let tag = meta.e_tag.map(ChangeTag);
                objects.push(ObjectMeta { key, size, tag });
            }
            match page.page_token {
                Some(token) => page_token = Some(token),
                None => break,
            }
        }
        // S3 lists in UTF-8 byte order already; sorting keeps the contract true for servers that
        // do not.
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        let path = self.path(key)?;
        let started = self.clock.monotonic();
        match self.inner.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(map_error(
                err,
                Op::Delete,
                Some(key),
                self.clock.monotonic().saturating_sub(started),
            )),
        }
    }

    fn backend_name(&self) -> &'static str {
        "s3"
    }
}

fn foreign_object(key: &ObjectKey) -> StorageError {
    StorageError::Other(format!(
        "{key} has no Strata version trailer: written by another tool? \
         (version_trailer=false reads objects raw)"
    ))
}

fn empty_or_invalid(key: &ObjectKey, range: &Range<u64>, size: u64) -> StorageResult<Bytes> {
    if range.start > size {
        Err(StorageError::Invalid(format!(
            "range {range:?} starts past the end of {key} ({size} bytes)"
        )))
    } else {
        // Starting exactly at the end is an empty read, like reading a file at EOF.
        Ok(Bytes::new())
    }
}

/// A 416, or a 200 where a 206 was expected (some servers answer a range on an empty object with
/// the whole, empty object).
fn unsatisfiable_range(err: &object_store::Error) -> bool {
    let text = err.to_string();
    http_status(&text) == Some(416)
        || text.contains("non-partial")
        || text.contains("Range Not Satisfiable")
        || text.contains("InvalidRange")
}
