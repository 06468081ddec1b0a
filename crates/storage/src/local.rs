//! The local-directory backend: the embedded default for a single machine, and the backend that
//! lets tests run several brokers (even several processes) against one real filesystem.
//!
//! # Layout
//!
//! A key `a/b/c` lives in the file `<root>/a/b/c@`. Every segment but the last is a directory; the
//! last gets an `@` suffix. No key segment may contain `@` (see [`ObjectKey`]), which buys three
//! things: the keys `a` and `a/b` can both exist (file `a@` next to directory `a`, as in any object
//! store), temp files (`c@tmp.<pid>.<n>`) and the store's own directories (`@locks`,
//! `@recycle`) can never be mistaken for objects by `list`, and a hand-made file in the tree is
//! simply ignored.
//!
//! Each object file starts with a 24-byte header — magic, incarnation, generation — stripped on
//! read. See [`Header`] for why the version lives there. A listing reads it too and reports it
//! as the object's change tag.
//!
//! # Atomicity and durability
//!
//! - A put writes the whole object into a temp file in the target directory and fsyncs it before
//!   it becomes visible under its key, so a reader never sees a partial object, and a put that
//!   returned `Ok` survives a crash (the directory is fsynced after publishing, and every directory
//!   the put had to create is fsynced into its parent).
//! - Create publishes with `link(2)`, which fails with `EEXIST` if the name exists: atomic
//!   create-if-absent even between processes, without a lock.
//! - Update (compare-and-swap) and delete hold an exclusive `flock(2)` on the key's lock file
//!   while they check the current version and `rename(2)` / unlink. `flock` rather than `fcntl`
//!   locks because `flock` locks belong to the open file description: two `LocalStore`s in one
//!   process exclude each other exactly like two processes do, whereas `fcntl` locks are per
//!   process and would let them both in. The lock files are a fixed set of [`LOCK_STRIPES`]
//!   under `<root>/@locks/`, a key's chosen by a hash of the key, created once and never
//!   deleted: a lock file per key would allocate and free an inode on every delete, which is
//!   the cost the reuse below removes (two keys sharing a lock only take turns; no operation
//!   holds two). Every process on a directory must use the same scheme: a Strata from before
//!   it locked a file next to each key instead.
//!
//! Every filesystem call runs on tokio's blocking pool; none runs on an async worker thread.
//!
//! # Reused files
//!
//! A broker on this backend creates a file per group commit and deletes them in bulk when
//! compaction has folded them into segments: thousands of inodes freed every few seconds. On ext4
//! that made inode allocation itself the broker's largest cost (its allocator scans past inodes
//! freed in the last few seconds; docs/BENCHMARKS.md, "Where the time goes"). So a delete does
//! not free the file: it renames it into `<root>/@recycle/` (a name no key can have), truncates
//! it, and keeps it in a pool of at most [`MAX_RECYCLED`] empty files per store; a put takes a
//! file from the pool by renaming it to its temp name, writes and fsyncs it, and publishes it
//! exactly as a new file (`link(2)`, so create-only publication is unchanged). A file whose
//! link count says it is still published somewhere (a rename lost in a crash) is never reused.
//!
//! Reuse costs one promise: a published file used to never change. A reader that opened an
//! object just before it was deleted may now find its inode truncated and rewritten as another
//! object. So every read re-reads the 24-byte header after the payload: if it is gone or
//! differs (every write of a file starts with a new header), the object was deleted during the
//! read, which is reported as NotFound — the read is ordered after the delete. A listing skips
//! a file that no longer has its name once its header is read, likewise.
//!
//! Renames between processes are atomic, so several stores and processes can share one
//! directory and its pool: a file someone else took is simply gone when we try to take it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::key::is_valid_segment;
use crate::memory::clamp_range;
use crate::{
    ChangeTag, ObjectKey, ObjectMeta, ObjectStore, PutMode, StorageError, StorageResult, Version,
};

/// Marks an object file; no key segment can contain it.
const OBJECT_SUFFIX: &str = "@";
/// The directory of the lock files, under the root, and how many there are.
const LOCK_DIR: &str = "@locks";
const LOCK_STRIPES: u64 = 1024;
const TEMP_INFIX: &str = "@tmp.";

/// How often a put starts over because a concurrent delete pruned the (empty) directory it had
/// just created. Each retry needs another delete to win a microsecond-wide race, so hitting the
/// limit means something outside Strata keeps removing directories.
const MAX_DIRECTORY_RACES: usize = 16;

/// The directory of reusable files, under the root.
const RECYCLE_DIR: &str = "@recycle";
/// A file being emptied for reuse (`p.<pid>.<n>`), and one ready for it (`r.<pid>.<n>`).
const RECYCLING_PREFIX: &str = "p.";
const RECYCLED_PREFIX: &str = "r.";

/// Empty files kept for reuse per store. A compaction pass deletes one file per group commit
/// since the last (10,000 at 1,000 commits per second and a 10 s segment interval), and every
/// one the pool cannot hold is freed and later allocated again, which is the cost reuse
/// avoids. Each costs an inode and a name, no data blocks.
const MAX_RECYCLED: usize = 16_384;

/// An [`ObjectStore`] over a directory. Cheap to clone; clones share the root path and the pool
/// of reusable files, and any number of stores (in any number of processes) may share one
/// directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: Arc<Path>,
    pool: Arc<Pool>,
}

/// Empty files ready to be taken by a put (paths under `@recycle`), newest last.
#[derive(Debug)]
struct Pool {
    dir: PathBuf,
    files: std::sync::Mutex<Vec<PathBuf>>,
}

/// Names unique within the process by the counter, across processes by the pid.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

impl Pool {
    fn files(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens the pool directory, adopting the files left in it by earlier runs (and, from
    /// processes no longer alive, files they were emptying when they stopped).
    fn open(root: &Path) -> io::Result<Self> {
        let dir = root.join(RECYCLE_DIR);
        create_dirs_durably(&dir)?;
        let mut files = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if name.starts_with(RECYCLED_PREFIX) {
                files.push(entry.path());
            } else if let Some(rest) = name.strip_prefix(RECYCLING_PREFIX) {
                let pid = rest.split('.').next().and_then(|p| p.parse::<i32>().ok());
                if pid.is_some_and(|pid| !process_alive(pid)) {
                    let ready = dir.join(format!("{RECYCLED_PREFIX}{}", unique_suffix()));
                    if fs::rename(entry.path(), &ready).is_ok() {
                        files.push(ready);
                    }
                }
            }
            if files.len() >= MAX_RECYCLED {
                break;
            }
        }
        Ok(Self {
            dir,
            files: std::sync::Mutex::new(files),
        })
    }

    /// Takes a pooled file as `temp` and returns it open for writing, empty. None when the pool
    /// has nothing usable.
    fn take(&self, temp: &Path) -> Option<File> {
        loop {
            let candidate = self.files().pop()?;
            match fs::rename(&candidate, temp) {
                Ok(()) => {}
                // Another store or process took it first.
                Err(_) => continue,
            }
            let file = match OpenOptions::new().write(true).open(temp) {
                Ok(file) => file,
                Err(_) => continue,
            };
            // Still published under another name (a rename lost in a crash): never rewrite it.
            // Dropping our name does not free it. Otherwise empty it (an adopted file may not
            // have been emptied yet).
            let reusable = file.metadata().is_ok_and(|m| m.nlink() == 1);
            if !reusable || file.set_len(0).is_err() {
                let _ = fs::remove_file(temp);
                continue;
            }
            return Some(file);
        }
    }

    /// Moves a deleted object's file into the pool (emptied), or unlinks it when the pool is
    /// full. Returns whether the object existed.
    fn recycle(&self, object: &Path) -> io::Result<bool> {
        if self.files().len() >= MAX_RECYCLED {
            return match fs::remove_file(object) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
            };
        }
        let suffix = unique_suffix();
        // Emptied under a name no one takes, so that no put can be writing it meanwhile.
        let emptying = self.dir.join(format!("{RECYCLING_PREFIX}{suffix}"));
        match fs::rename(object, &emptying) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            // E.g. a key directory on another filesystem: no reuse, a plain delete.
            Err(_) => {
                return match fs::remove_file(object) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
        let ready = self.dir.join(format!("{RECYCLED_PREFIX}{suffix}"));
        let emptied = OpenOptions::new()
            .write(true)
            .open(&emptying)
            .and_then(|file| file.set_len(0))
            .and_then(|()| fs::rename(&emptying, &ready));
        match emptied {
            Ok(()) => self.files().push(ready),
            Err(e) => {
                tracing::warn!(path = %emptying.display(), error = %e, "could not keep a deleted file for reuse");
                let _ = fs::remove_file(&emptying);
            }
        }
        Ok(true)
    }
}

/// Whether a process with this pid exists on this host.
fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists; it sends nothing and
    // touches no memory of ours.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

impl LocalStore {
    /// Opens (creating it durably if needed) the directory `root` as an object store.
    ///
    /// This does blocking filesystem calls; it is meant for startup, before or outside the hot
    /// path. Everything the store does afterwards runs on the blocking pool.
    pub fn open(root: impl AsRef<Path>) -> StorageResult<Self> {
        let root = root.as_ref();
        if root.as_os_str().is_empty() {
            return Err(StorageError::Invalid(
                "local store path must not be empty".into(),
            ));
        }
        create_dirs_durably(root).map_err(|e| io_error("create directory", root, e))?;
        let locks = root.join(LOCK_DIR);
        create_dirs_durably(&locks).map_err(|e| io_error("create directory", &locks, e))?;
        let pool = Pool::open(root).map_err(|e| io_error("open the reuse pool", root, e))?;
        Ok(Self {
            root: Arc::from(root),
            pool: Arc::new(pool),
        })
    }

    /// The directory this store keeps its objects in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn location(&self, key: &ObjectKey) -> Location {
        let mut dir = self.root.to_path_buf();
        let mut segments = key.as_str().split('/').peekable();
        let mut last = "";
        while let Some(segment) = segments.next() {
            if segments.peek().is_some() {
                dir.push(segment);
            } else {
                last = segment;
            }
        }
        Location {
            object: dir.join(format!("{last}{OBJECT_SUFFIX}")),
            lock: self
                .root
                .join(LOCK_DIR)
                .join(format!("{}", lock_stripe(key.as_str()))),
            last: last.to_owned(),
            dir,
            key: key.clone(),
        }
    }
}

/// The lock stripe of a key: FNV-1a of its bytes, stable across processes and versions.
fn lock_stripe(key: &str) -> u64 {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash % LOCK_STRIPES
}

/// Where one key's files live.
#[derive(Debug)]
struct Location {
    key: ObjectKey,
    dir: PathBuf,
    last: String,
    object: PathBuf,
    lock: PathBuf,
}

/// The object file header, and with it the object's version.
///
/// Why the version is stored in the file rather than derived from `stat` (inode + mtime + size):
/// inode numbers are recycled as soon as a file is unlinked, and mtime comes from the kernel's
/// coarse clock (one tick is several milliseconds), so two same-size replaces within one tick can
/// produce identical `stat` triples — a stale compare-and-swap would then succeed. Here the
/// generation is incremented under the key's lock, so within one life of a key it never repeats,
/// and the incarnation, random per create, tells a deleted-and-recreated key apart from its
/// predecessor. It is as cheap to read as `stat` (one 24-byte `pread`), and because `get` reads
/// header and payload from one open file, which is never modified after it is published, the
/// version returned always belongs to the bytes returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    incarnation: u64,
    generation: u64,
}

impl Header {
    const MAGIC: [u8; 8] = *b"STRATA\x00\x01";
    const LEN: u64 = 24;

    // Not injected: a fresh random value is exactly what is wanted here (uniqueness across
    // processes sharing the directory, not behaviour), and the local store is not part of the
    // deterministic simulation (the memory store is).
    #[allow(clippy::disallowed_methods)]
    fn fresh() -> Self {
        Self {
            incarnation: rand::random(),
            generation: 1,
        }
    }

    fn next(self) -> Self {
        Self {
            incarnation: self.incarnation,
            generation: self.generation + 1,
        }
    }

    fn version(self) -> Version {
        Version(format!("{:016x}.{}", self.incarnation, self.generation))
    }

    fn encode(self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&Self::MAGIC);
        out[8..16].copy_from_slice(&self.incarnation.to_le_bytes());
        out[16..].copy_from_slice(&self.generation.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; 24]) -> Option<Self> {
        if bytes[..8] != Self::MAGIC {
            return None;
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        Some(Self {
            incarnation: word(8),
            generation: word(16),
        })
    }

    /// Reads the header of an open object file, which must be at least `LEN` long.
    fn read_from(file: &File, path: &Path) -> StorageResult<Self> {
        let mut bytes = [0u8; 24];
        match file.read_exact_at(&mut bytes, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(not_an_object(path)),
            Err(e) => return Err(io_error("read", path, e)),
        }
        Self::decode(&bytes).ok_or_else(|| not_an_object(path))
    }
}

fn not_an_object(path: &Path) -> StorageError {
    StorageError::Other(format!(
        "{} is not a Strata object (missing or bad header)",
        path.display()
    ))
}

/// Maps an IO error to the storage vocabulary: a full filesystem is `Full`, conditions that can
/// clear up by themselves are `Unavailable` (and so retried), everything else is `Other`.
fn io_error(op: &str, path: &Path, error: io::Error) -> StorageError {
    let message = format!("{op} {}: {error}", path.display());
    match error.raw_os_error() {
        // Out of space: the temp file, link or rename failed, so nothing was published.
        Some(libc::ENOSPC | libc::EDQUOT) => StorageError::Full(message),
        Some(
            libc::EMFILE
            | libc::ENFILE
            | libc::ENOMEM
            | libc::EAGAIN
            | libc::EINTR
            | libc::EBUSY
            | libc::ETIMEDOUT
            | libc::ESTALE,
        ) => StorageError::Unavailable(message),
        _ => StorageError::Other(message),
    }
}

/// Runs blocking filesystem work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> StorageResult<T> + Send + 'static,
) -> StorageResult<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StorageError::Other(format!("local storage task failed: {e}")))?
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and any missing ancestors, fsyncing each new directory's parent so that the new
/// entries survive a crash together with the object about to be put in them.
fn create_dirs_durably(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut current = dir;
    loop {
        match fs::metadata(current) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "{} exists and is not a directory",
                    current.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(current);
                match current.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => current = parent,
                    // A relative path's first component: its parent is the working directory.
                    _ => break,
                }
            }
            Err(e) => return Err(e),
        }
    }
    for new_dir in missing.into_iter().rev() {
        match fs::create_dir(new_dir) {
            // Also fsync when another process won the race to create it: it may not have
            // fsynced yet, and our put must not return before the entry is durable.
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let parent = match new_dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        fsync_dir(parent)?;
    }
    Ok(())
}

/// Writes `header` + `data` to a temp file next to the object (a pooled file when there is
/// one, else a new one) and fsyncs it. On error nothing is left behind.
fn write_temp(
    pool: &Pool,
    location: &Location,
    header: Header,
    data: &[u8],
) -> io::Result<PathBuf> {
    loop {
        // Unique within the process by the counter, across processes by the pid; `create_new`
        // catches anything else (a pid reused by a process on another host sharing the
        // directory).
        let temp = location
            .dir
            .join(format!("{}{TEMP_INFIX}{}", location.last, unique_suffix()));
        let mut file = match pool.take(&temp) {
            Some(file) => file,
            None => match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            },
        };
        // The header first: a reader of this inode's previous object sees it change.
        let written = file
            .write_all(&header.encode())
            .and_then(|()| file.write_all(data))
            .and_then(|()| file.sync_all());
        return match written {
            Ok(()) => Ok(temp),
            Err(e) => {
                remove_temp(&temp);
                Err(e)
            }
        };
    }
}

fn remove_temp(temp: &Path) {
    if let Err(e) = fs::remove_file(temp) {
        if e.kind() != io::ErrorKind::NotFound {
            // Harmless for correctness (temp files are never listed or read) but it wastes space.
            tracing::warn!(path = %temp.display(), error = %e, "could not remove temp file");
        }
    }
}

/// An exclusive `flock` on a key's lock file, released when dropped (closing the file releases it).
#[derive(Debug)]
struct KeyLock {
    _file: File,
}

impl KeyLock {
    /// Locks the key's stripe.
    fn acquire(location: &Location) -> StorageResult<Self> {
        let path = &location.lock;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io_error("open lock file", path, e))?;
        flock_exclusive(&file).map_err(|e| io_error("lock", path, e))?;
        Ok(Self { _file: file })
    }
}

fn flock_exclusive(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: flock takes a file descriptor we own (borrowed from a live `File`) and an
        // integer operation; it touches no memory of ours.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

fn put_create(pool: &Pool, location: &Location, data: &[u8]) -> StorageResult<Version> {
    for _ in 0..MAX_DIRECTORY_RACES {
        match create_dirs_durably(&location.dir) {
            Ok(()) => {}
            // A concurrent delete pruned a parent between our stat and our mkdir.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("create directory", &location.dir, e)),
        }
        let header = Header::fresh();
        let temp = match write_temp(pool, location, header, data) {
            Ok(temp) => temp,
            // A concurrent delete pruned the directory we just created while it was empty.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("write temp file", &location.dir, e)),
        };
        // link(2) refuses to replace an existing name: this is the atomic create-if-absent.
        let linked = fs::hard_link(&temp, &location.object);
        remove_temp(&temp);
        return match linked {
            Ok(()) => match fsync_dir(&location.dir) {
                Ok(()) => Ok(header.version()),
                // The object is visible but its name may not survive a crash: the outcome is
                // unknown to the caller, which is exactly what `Unavailable` says.
                Err(e) => Err(StorageError::Unavailable(format!(
                    "published {} but could not fsync its directory: {e}",
                    location.key
                ))),
            },
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(StorageError::AlreadyExists(location.key.clone()))
            }
            Err(e) => Err(io_error("link", &location.object, e)),
        };
    }
    Err(StorageError::Unavailable(format!(
        "directory {} kept disappearing while creating {}",
        location.dir.display(),
        location.key
    )))
}

fn put_update(
    pool: &Pool,
    location: &Location,
    data: &[u8],
    expected: &Version,
) -> StorageResult<Version> {
    let _lock = KeyLock::acquire(location)?;
    // Under the lock nobody else can replace or delete the object, and a create cannot succeed
    // while it exists, so the version read here stays current until our rename.
    let current = match File::open(&location.object) {
        Ok(file) => Header::read_from(&file, &location.object)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StorageError::Precondition(location.key.clone()))
        }
        Err(e) => return Err(io_error("open", &location.object, e)),
    };
    if current.version() != *expected {
        return Err(StorageError::Precondition(location.key.clone()));
    }
    let next = current.next();
    let temp = write_temp(pool, location, next, data)
        .map_err(|e| io_error("write temp file", &location.dir, e))?;
    if let Err(e) = fs::rename(&temp, &location.object) {
        remove_temp(&temp);
        return Err(io_error("rename", &location.object, e));
    }
    fsync_dir(&location.dir).map_err(|e| {
        StorageError::Unavailable(format!(
            "replaced {} but could not fsync its directory: {e}",
            location.key
        ))
    })?;
    Ok(next.version())
}

fn get(location: &Location) -> StorageResult<(Bytes, Version)> {
    let (file, data_len) = open_object(location)?;
    let header = Header::read_from(&file, &location.object)?;
    let mut data = vec![0u8; to_usize(data_len, location)?];
    let read = file.read_exact_at(&mut data, Header::LEN);
    unchanged(&file, header, location, read)?;
    Ok((Bytes::from(data), header.version()))
}

fn get_range(location: &Location, range: &Range<u64>) -> StorageResult<Bytes> {
    let (file, data_len) = open_object(location)?;
    let header = Header::read_from(&file, &location.object)?;
    let (start, end) = clamp_range(&location.key, range, data_len)?;
    let mut data = vec![0u8; end - start];
    let read = file.read_exact_at(&mut data, Header::LEN + start as u64);
    unchanged(&file, header, location, read)?;
    Ok(Bytes::from(data))
}

/// After a read of an object's payload: whether the file still holds the object whose header
/// was read first. A delete empties the file (for reuse) and the next write of it starts with a
/// new header, so a header that is gone or differs means the object was deleted during the
/// read (NotFound), and nothing read may be returned.
fn unchanged(
    file: &File,
    header: Header,
    location: &Location,
    read: io::Result<()>,
) -> StorageResult<()> {
    let mut again = [0u8; 24];
    let same = file.read_exact_at(&mut again, 0).is_ok() && Header::decode(&again) == Some(header);
    match read {
        _ if !same => Err(StorageError::NotFound(location.key.clone())),
        Ok(()) => Ok(()),
        Err(e) => Err(io_error("read", &location.object, e)),
    }
}

/// Opens an object file and returns it with its payload length. Everything read through this
/// handle belongs to one version as long as the header does not change (see [`unchanged`]).
fn open_object(location: &Location) -> StorageResult<(File, u64)> {
    let file = match File::open(&location.object) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StorageError::NotFound(location.key.clone()))
        }
        Err(e) => return Err(io_error("open", &location.object, e)),
    };
    let len = file
        .metadata()
        .map_err(|e| io_error("stat", &location.object, e))?
        .len();
    let data_len = len
        .checked_sub(Header::LEN)
        .ok_or_else(|| not_an_object(&location.object))?;
    Ok((file, data_len))
}

fn to_usize(len: u64, location: &Location) -> StorageResult<usize> {
    usize::try_from(len).map_err(|_| {
        StorageError::Invalid(format!("{} is too large to read at once", location.key))
    })
}

fn delete(root: &Path, pool: &Pool, location: &Location) -> StorageResult<()> {
    {
        let _lock = KeyLock::acquire(location)?;
        let existed = pool
            .recycle(&location.object)
            .map_err(|e| io_error("delete", &location.object, e))?;
        if existed {
            fsync_dir(&location.dir).map_err(|e| io_error("fsync", &location.dir, e))?;
        }
    }
    prune_empty_dirs(root, &location.dir);
    Ok(())
}

/// Removes now-empty directories from `dir` up to (not including) `root`, so that deleted WAL
/// epochs and topics do not leave a growing tree of empty directories for `list` to walk.
/// Best effort: any failure (usually "not empty") just stops the walk. A put racing with this
/// notices its directory vanished and starts over.
fn prune_empty_dirs(root: &Path, dir: &Path) {
    let mut current = dir;
    while current != root && current.starts_with(root) {
        if fs::remove_dir(current).is_err() {
            return;
        }
        match current.parent() {
            Some(parent) => current = parent,
            None => return,
        }
    }
}

fn list(root: &Path, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
    // Walk only the directory named by the prefix's complete segments; the part after the last
    // `/` filters names at that level.
    let (dir_part, name_filter) = match prefix.rfind('/') {
        Some(at) => (&prefix[..at], &prefix[at + 1..]),
        None => ("", prefix),
    };
    let mut start = root.to_path_buf();
    let mut key_prefix = String::new();
    if !dir_part.is_empty() {
        // A prefix whose complete segments no key could have matches nothing (and must not be
        // turned into a path: `..` would leave the root).
        if !dir_part.split('/').all(is_valid_segment) {
            return Ok(Vec::new());
        }
        start.extend(dir_part.split('/'));
        key_prefix = format!("{dir_part}/");
    }
    let mut found = Vec::new();
    walk(&start, &key_prefix, name_filter, &mut found)?;
    found.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(found)
}

fn walk(
    dir: &Path,
    key_prefix: &str,
    name_filter: &str,
    found: &mut Vec<ObjectMeta>,
) -> StorageResult<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        // Missing (or pruned mid-walk): nothing under it.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(()),
        Err(e) => return Err(io_error("list", dir, e)),
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("list", dir, e)),
        };
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let file_type = match entry.file_type() {
            Ok(file_type) => file_type,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("list", &entry.path(), e)),
        };
        if file_type.is_dir() {
            if is_valid_segment(name) && name.starts_with(name_filter) {
                walk(&entry.path(), &format!("{key_prefix}{name}/"), "", found)?;
            }
        } else if file_type.is_file() {
            // Temp and lock files contain `@` but do not end with it, and a name that is not a
            // valid segment cannot be ours: both are skipped.
            let Some(segment) = name.strip_suffix(OBJECT_SUFFIX) else {
                continue;
            };
            if !is_valid_segment(segment) || !segment.starts_with(name_filter) {
                continue;
            }
            let path = entry.path();
            // Size and tag come from one open file: a published file never changes, so both
            // belong to the same write even if the key is replaced meanwhile.
            let file = match File::open(&path) {
                Ok(file) => file,
                // Deleted between readdir and open: it is not there any more.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error("open", &path, e)),
            };
            let len = file
                .metadata()
                .map_err(|e| io_error("stat", &path, e))?
                .len();
            let Some(size) = len.checked_sub(Header::LEN) else {
                if !still_named(&file, &path) {
                    // Emptied by a delete since we opened it.
                    continue;
                }
                tracing::warn!(path = %path.display(), "skipping a file too short to be a Strata object");
                continue;
            };
            // The change tag is the header's version, not stat's (inode, mtime, size): a replace
            // always makes a new inode, but inode numbers are recycled and mtime has a coarse
            // tick, so two same-size rewrites between listings could bring the triple back (the
            // same reason the version lives in the header). Reading 24 bytes of a file we have
            // open is one `pread` more than the `stat` a listing needs anyway. A file with a bad
            // header is still listed (reading it reports the problem) but has no tag.
            let header = Header::read_from(&file, &path).ok();
            // Deleted since we opened it (its file may already hold another object): not
            // there any more.
            if !still_named(&file, &path) {
                continue;
            }
            let tag = header.map(|header| ChangeTag(header.version().0));
            found.push(ObjectMeta {
                key: ObjectKey::new(format!("{key_prefix}{segment}"))?,
                size,
                tag,
            });
        }
    }
    Ok(())
}

/// Whether `path` still names the inode `file` has open.
fn still_named(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.ino() == named.ino() && open.dev() == named.dev(),
        _ => false,
    }
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn put(&self, key: &ObjectKey, data: Bytes, mode: PutMode) -> StorageResult<Version> {
        let location = self.location(key);
        let pool = Arc::clone(&self.pool);
        blocking(move || match mode {
            PutMode::Create => put_create(&pool, &location, &data),
            PutMode::Update(expected) => put_update(&pool, &location, &data, &expected),
        })
        .await
    }

    async fn get(&self, key: &ObjectKey) -> StorageResult<(Bytes, Version)> {
        let location = self.location(key);
        blocking(move || get(&location)).await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        let location = self.location(key);
        blocking(move || get_range(&location, &range)).await
    }

    async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectMeta>> {
        let root = Arc::clone(&self.root);
        let prefix = prefix.to_owned();
        blocking(move || list(&root, &prefix)).await
    }

    async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        let location = self.location(key);
        let root = Arc::clone(&self.root);
        let pool = Arc::clone(&self.pool);
        blocking(move || delete(&root, &pool, &location)).await
    }

    fn backend_name(&self) -> &'static str {
        "file"
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::sync::Barrier;

    use super::*;

    fn key(k: &str) -> ObjectKey {
        ObjectKey::new(k).unwrap()
    }

    #[test]
    fn a_full_filesystem_is_full_not_a_transient_outage() {
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let error = io_error(
                "write temp file",
                Path::new("/x"),
                io::Error::from_raw_os_error(errno),
            );
            assert!(matches!(error, StorageError::Full(_)), "{error}");
        }
        let error = io_error(
            "open",
            Path::new("/x"),
            io::Error::from_raw_os_error(libc::EMFILE),
        );
        assert!(matches!(error, StorageError::Unavailable(_)), "{error}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn local_store_passes_conformance() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        crate::conformance::run_all(Arc::new(store), "conformance").await;
    }

    #[tokio::test]
    async fn open_creates_missing_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a/b/c");
        let store = LocalStore::open(&root).unwrap();
        store
            .put(&key("x"), Bytes::from_static(b"1"), PutMode::Create)
            .await
            .unwrap();
        assert!(root.join("x@").is_file());
    }

    #[tokio::test]
    async fn a_key_and_keys_below_it_coexist() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        for k in ["a", "a/b", "a/b/c"] {
            store
                .put(&key(k), Bytes::from(k.to_owned()), PutMode::Create)
                .await
                .unwrap();
        }
        let listed: Vec<String> = store
            .list("a")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.key.to_string())
            .collect();
        assert_eq!(listed, ["a", "a/b", "a/b/c"]);
        assert_eq!(&store.get(&key("a/b")).await.unwrap().0[..], b"a/b");
    }

    #[tokio::test]
    async fn list_ignores_temp_lock_and_foreign_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let v = store
            .put(&key("p/obj"), Bytes::from_static(b"data"), PutMode::Create)
            .await
            .unwrap();
        // A crashed writer leaves a temp file; the lock files are beside the keys' tree.
        store
            .put(
                &key("p/obj"),
                Bytes::from_static(b"data2"),
                PutMode::Update(v),
            )
            .await
            .unwrap();
        fs::write(dir.path().join("p/obj@tmp.1.1"), b"partial").unwrap();
        fs::write(dir.path().join("p/notes.txt"), b"hand-made").unwrap();
        fs::write(dir.path().join("p/short@"), b"x").unwrap();
        assert!(dir
            .path()
            .join(LOCK_DIR)
            .join(lock_stripe("p/obj").to_string())
            .exists());
        let listed = store.list("").await.unwrap();
        assert_eq!(
            listed,
            vec![ObjectMeta {
                key: key("p/obj"),
                size: 5,
                tag: Some(ChangeTag(store.get(&key("p/obj")).await.unwrap().1 .0)),
            }]
        );
    }

    /// The change tag must not depend on what `stat` says: rewrites of the same size, whose
    /// files end up with the very same mtime (forced here, as the kernel's coarse clock does
    /// within one tick), still give a new tag every time, and an unchanged object keeps its tag.
    #[tokio::test]
    async fn list_tags_change_on_every_rewrite_even_within_one_mtime_tick() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let (k, other) = (key("t/obj"), key("t/other"));
        let mut version = store
            .put(&k, Bytes::from_static(b"same"), PutMode::Create)
            .await
            .unwrap();
        store
            .put(&other, Bytes::from_static(b"x"), PutMode::Create)
            .await
            .unwrap();
        let tick = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let pin_mtime = || {
            File::options()
                .write(true)
                .open(dir.path().join("t/obj@"))
                .unwrap()
                .set_modified(tick)
                .unwrap();
        };
        pin_mtime();
        let tags = |listed: Vec<ObjectMeta>| -> (ChangeTag, ChangeTag) {
            let tag = |k: &ObjectKey| {
                listed
                    .iter()
                    .find(|m| m.key == *k)
                    .and_then(|m| m.tag.clone())
                    .unwrap()
            };
            (tag(&k), tag(&other))
        };
        let (first, other_first) = tags(store.list("t/").await.unwrap());
        let mut seen = std::collections::HashSet::from([first]);
        for _ in 0..50 {
            version = store
                .put(&k, Bytes::from_static(b"same"), PutMode::Update(version))
                .await
                .unwrap();
            pin_mtime();
            let (tag, other_tag) = tags(store.list("t/").await.unwrap());
            assert!(seen.insert(tag.clone()), "tag {tag:?} came back");
            assert_eq!(other_tag, other_first, "an unchanged object keeps its tag");
        }
        // Deleted and created again with the same bytes: a new tag too.
        store.delete(&k).await.unwrap();
        store
            .put(&k, Bytes::from_static(b"same"), PutMode::Create)
            .await
            .unwrap();
        pin_mtime();
        let (tag, _) = tags(store.list("t/").await.unwrap());
        assert!(
            seen.insert(tag.clone()),
            "tag {tag:?} came back after re-creation"
        );
    }

    #[tokio::test]
    async fn reading_a_foreign_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        fs::write(dir.path().join("foreign@"), b"this is not a strata object").unwrap();
        let err = store.get(&key("foreign")).await.unwrap_err();
        assert!(
            err.to_string().contains("not a Strata object"),
            "unexpected error: {err}"
        );
    }

    #[tokio::test]
    async fn delete_leaves_no_empty_directories() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let k = key("wal/1/7/00001");
        let v = store
            .put(&k, Bytes::from_static(b"a"), PutMode::Create)
            .await
            .unwrap();
        store
            .put(&k, Bytes::from_static(b"b"), PutMode::Update(v))
            .await
            .unwrap();
        store.delete(&k).await.unwrap();
        assert!(!dir.path().join("wal").exists());
        assert!(dir.path().exists());
        // And the key can be created again afterwards.
        store
            .put(&k, Bytes::from_static(b"c"), PutMode::Create)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn recreated_key_never_reuses_a_stale_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let k = key("owners/t/0");
        let stale = store
            .put(&k, Bytes::from_static(b"a"), PutMode::Create)
            .await
            .unwrap();
        store.delete(&k).await.unwrap();
        store
            .put(&k, Bytes::from_static(b"a"), PutMode::Create)
            .await
            .unwrap();
        let err = store
            .put(&k, Bytes::from_static(b"c"), PutMode::Update(stale))
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Precondition(_)), "{err}");
    }

    fn inode(path: &Path) -> u64 {
        fs::metadata(path).unwrap().ino()
    }

    #[tokio::test]
    async fn a_deleted_file_is_emptied_and_reused_by_the_next_put() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let (a, b) = (key("wal/a"), key("wal/b"));
        store
            .put(&a, Bytes::from(vec![7u8; 4096]), PutMode::Create)
            .await
            .unwrap();
        let a_inode = inode(&store.location(&a).object);
        store.delete(&a).await.unwrap();
        assert!(matches!(
            store.get(&a).await,
            Err(StorageError::NotFound(_))
        ));
        let pooled: Vec<_> = fs::read_dir(dir.path().join(RECYCLE_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(pooled.len(), 1);
        assert_eq!(fs::metadata(&pooled[0]).unwrap().len(), 0, "kept empty");
        assert!(store.list("").await.unwrap().is_empty(), "never listed");

        store
            .put(&b, Bytes::from_static(b"bee"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(inode(&store.location(&b).object), a_inode, "the same file");
        assert_eq!(&store.get(&b).await.unwrap().0[..], b"bee");
        assert_eq!(
            fs::read_dir(dir.path().join(RECYCLE_DIR)).unwrap().count(),
            0
        );
        // A second store on the directory adopts what the first left in the pool.
        store.delete(&b).await.unwrap();
        let other = LocalStore::open(dir.path()).unwrap();
        other
            .put(&a, Bytes::from_static(b"again"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(inode(&other.location(&a).object), a_inode);
    }

    /// What `get` does first: open the object's file and read its header.
    fn open_for_read(store: &LocalStore, k: &ObjectKey) -> (Location, File, Header) {
        let location = store.location(k);
        let (file, _) = open_object(&location).unwrap();
        let header = Header::read_from(&file, &location.object).unwrap();
        (location, file, header)
    }

    #[tokio::test]
    async fn a_read_overtaken_by_a_delete_and_a_reuse_is_not_found_never_another_objects_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let (a, b) = (key("wal/a"), key("wal/b"));
        for (name, reused) in [("deleted", false), ("deleted and reused", true)] {
            store
                .put(&a, Bytes::from_static(b"aaaa"), PutMode::Create)
                .await
                .unwrap();
            let (location, file, header) = open_for_read(&store, &a);
            // Then the object is deleted (its file emptied) and maybe rewritten as another.
            store.delete(&a).await.unwrap();
            if reused {
                store
                    .put(&b, Bytes::from_static(b"bbbb"), PutMode::Create)
                    .await
                    .unwrap();
                assert_eq!(
                    inode(&store.location(&b).object),
                    file.metadata().unwrap().ino()
                );
            }
            let mut data = [0u8; 4];
            let read = file.read_exact_at(&mut data, Header::LEN);
            let outcome = unchanged(&file, header, &location, read);
            assert!(
                matches!(outcome, Err(StorageError::NotFound(_))),
                "{name}: {outcome:?}"
            );
            if reused {
                assert_eq!(&data, b"bbbb", "the bytes read were another object's");
                store.delete(&b).await.unwrap();
            }
        }
        // Untouched, the same check passes.
        store
            .put(&a, Bytes::from_static(b"aaaa"), PutMode::Create)
            .await
            .unwrap();
        let (location, file, header) = open_for_read(&store, &a);
        assert!(unchanged(&file, header, &location, Ok(())).is_ok());
    }

    /// Runs `work` on `n` threads at once, each with its own store on `root` and its own
    /// runtime (separate stores behave like separate processes), and returns what each gave.
    fn on_racing_stores<T: Send + 'static>(
        root: &Path,
        n: usize,
        work: impl Fn(usize, &LocalStore, &tokio::runtime::Runtime) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let barrier = Arc::new(Barrier::new(n));
        let work = Arc::new(work);
        let handles: Vec<_> = (0..n)
            .map(|index| {
                let (barrier, work) = (Arc::clone(&barrier), Arc::clone(&work));
                let root = root.to_path_buf();
                std::thread::spawn(move || {
                    let store = LocalStore::open(&root).unwrap();
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    barrier.wait();
                    work(index, &store, &rt)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Two stores (separate pools, one directory) create, read back and delete keys as fast
    /// as they can, taking each other's deleted files: every read returns its own key's bytes.
    #[test]
    fn stores_sharing_a_directory_share_reused_files_safely() {
        const ROUNDS: usize = 300;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        on_racing_stores(dir.path(), 2, move |writer, store, rt| {
            rt.block_on(async {
                for round in 0..ROUNDS {
                    let k = key(&format!("wal/{writer}/{round}"));
                    let body = Bytes::from(format!("{writer}-{round}").repeat(round % 7 + 1));
                    store.put(&k, body.clone(), PutMode::Create).await.unwrap();
                    assert_eq!(store.get(&k).await.unwrap().0, body);
                    // The other store's deletes never show in a listing as half an object.
                    for meta in store.list("wal/").await.unwrap() {
                        assert!(meta.key.as_str().starts_with("wal/"));
                    }
                    store.delete(&k).await.unwrap();
                    if round % 10 == 0 {
                        // Re-open: adopt whatever the other store left in the pool.
                        let again = LocalStore::open(&root).unwrap();
                        let k = key(&format!("wal/{writer}/re{round}"));
                        again.put(&k, body.clone(), PutMode::Create).await.unwrap();
                        assert_eq!(again.get(&k).await.unwrap().0, body);
                        again.delete(&k).await.unwrap();
                    }
                }
            });
        });
    }

    #[test]
    fn list_prefix_with_dot_dot_matches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("root");
        fs::create_dir(&inner).unwrap();
        fs::write(dir.path().join("outside@"), b"x").unwrap();
        assert!(list(&inner, "../").unwrap().is_empty());
        assert!(list(&inner, "a/../../").unwrap().is_empty());
    }

    fn increment(store: &LocalStore, counter: &ObjectKey) -> StorageResult<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            loop {
                let (data, version) = store.get(counter).await?;
                let value: u64 = std::str::from_utf8(&data).unwrap().parse().unwrap();
                let next = Bytes::from((value + 1).to_string());
                match store.put(counter, next, PutMode::Update(version)).await {
                    Ok(_) => return Ok(()),
                    Err(StorageError::Precondition(_)) => continue,
                    Err(e) => return Err(e),
                }
            }
        })
    }

    /// Separate `LocalStore`s, each on its own thread and runtime, share only the directory:
    /// the same situation as separate processes as far as `link` and `flock` are concerned.
    #[test]
    fn separate_stores_on_one_directory_race_safely() {
        const WRITERS: usize = 8;
        const INCREMENTS: usize = 20;
        let dir = tempfile::tempdir().unwrap();
        let setup = LocalStore::open(dir.path()).unwrap();
        let counter = key("race/counter");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(setup.put(&counter, Bytes::from_static(b"0"), PutMode::Create))
            .unwrap();

        let shared = counter.clone();
        let winners = on_racing_stores(dir.path(), WRITERS, move |writer, store, rt| {
            let won = rt
                .block_on(store.put(
                    &key("race/winner"),
                    Bytes::from(writer.to_string()),
                    PutMode::Create,
                ))
                .is_ok();
            for _ in 0..INCREMENTS {
                increment(store, &shared).unwrap();
            }
            won
        })
        .into_iter()
        .filter(|won| *won)
        .count();
        assert_eq!(winners, 1);
        let (data, _) = rt.block_on(setup.get(&counter)).unwrap();
        assert_eq!(
            std::str::from_utf8(&data).unwrap(),
            (WRITERS * INCREMENTS).to_string()
        );
    }

    const CHILD_DIR_ENV: &str = "STRATA_LOCAL_STORE_TEST_CHILD_DIR";
    const CHILD_ID_ENV: &str = "STRATA_LOCAL_STORE_TEST_CHILD_ID";
    const CHILD_INCREMENTS: usize = 25;

    /// The body of one child process of `separate_processes_on_one_directory_race_safely`;
    /// does nothing when run as an ordinary test.
    #[test]
    fn cross_process_child() {
        let (Ok(dir), Ok(id)) = (std::env::var(CHILD_DIR_ENV), std::env::var(CHILD_ID_ENV)) else {
            return;
        };
        let store = LocalStore::open(&dir).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let won = rt
            .block_on(store.put(
                &key("race/winner"),
                Bytes::from(id.clone()),
                PutMode::Create,
            ))
            .is_ok();
        for _ in 0..CHILD_INCREMENTS {
            increment(&store, &key("race/counter")).unwrap();
        }
        // Report through the store itself, so the parent needs no output parsing.
        let result = if won { "won" } else { "lost" };
        rt.block_on(store.put(
            &key(&format!("results/{id}")),
            Bytes::from(result),
            PutMode::Create,
        ))
        .unwrap();
    }

    /// Real processes: `link` and `flock` are what make create-only and compare-and-swap safe
    /// between brokers sharing a directory, so test them across process boundaries too.
    #[test]
    fn separate_processes_on_one_directory_race_safely() {
        const CHILDREN: usize = 4;
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(store.put(
            &key("race/counter"),
            Bytes::from_static(b"0"),
            PutMode::Create,
        ))
        .unwrap();

        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..CHILDREN)
            .map(|id| {
                Command::new(&exe)
                    .args(["--exact", "local::tests::cross_process_child", "--quiet"])
                    .env(CHILD_DIR_ENV, dir.path())
                    .env(CHILD_ID_ENV, id.to_string())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "a child process failed:\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }

        let results = rt.block_on(store.list("results/")).unwrap();
        assert_eq!(results.len(), CHILDREN, "every child reports");
        let mut winners = 0;
        for meta in results {
            let (data, _) = rt.block_on(store.get(&meta.key)).unwrap();
            if &data[..] == b"won" {
                winners += 1;
            }
        }
        assert_eq!(winners, 1);
        let (data, _) = rt.block_on(store.get(&key("race/counter"))).unwrap();
        assert_eq!(
            std::str::from_utf8(&data).unwrap(),
            (CHILDREN * CHILD_INCREMENTS).to_string()
        );
    }
}
