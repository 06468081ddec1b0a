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
//! Each object file starts with a 32-byte header — magic, incarnation, generation, payload
//! length — stripped on read. See [`Header`] for why the version lives there and [`Head`] for the
//! 24-byte header of files written by older versions, which still read. A listing reads it too
//! and reports it as the object's change tag and size.
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
//! - Deletes queue and go out in batches on one blocking thread (see [`Deletes`]): each key
//!   still under its lock, then one fsync per directory for the batch before any of its callers
//!   hears back. Payloads larger than [`WRITEBACK_SLICE`] are written in slices whose writeback
//!   is started as they go, so a segment never floods the disk queue ahead of a group commit.
//!
//! Every filesystem call runs on tokio's blocking pool; none runs on an async worker thread.
//!
//! # Reused files
//!
//! A broker on this backend creates a file per group commit and deletes them in bulk when
//! compaction has folded them into segments: thousands of inodes freed every few seconds. On ext4
//! that made inode allocation itself the broker's largest cost (its allocator scans past inodes
//! freed in the last few seconds; docs/BENCHMARKS.md, "Where the time goes"). So a delete does
//! not free the file: it renames it into `<root>/@recycle/` (a name no key can have) and keeps it
//! in a pool of at most [`MAX_RECYCLED`] files per store; a put takes the pooled file that best
//! fits its size by renaming it to its temp name, overwrites it from the start, `fdatasync`s it,
//! and publishes it exactly as a new file (`link(2)`, so create-only publication is unchanged).
//! Files up to a group commit's size keep their data blocks in the pool (at most
//! [`MAX_RECYCLED_BYTES`] per store, given back when the disk is full), so the put allocates
//! nothing and its flush writes the data alone: this is the preallocated write-ahead file of
//! docs/ARCHITECTURE.md, "The local backend reuses files". A file whose link count says it is
//! still published somewhere (a rename lost in a crash) is never reused.
//!
//! Reuse costs one promise: a published file used to never change. A reader that opened an
//! object just before it was deleted may now find its inode rewritten as another object. So
//! every read re-reads the header after the payload: if it differs (every write of a file starts
//! with a new header, before its payload), the object was deleted during the read, which is
//! reported as NotFound — the read is ordered after the delete. A listing skips a file that no
//! longer has its name once its header is read, likewise.
//!
//! Renames between processes are atomic, so several stores and processes can share one
//! directory and its pool: a file someone else took is simply gone when we try to take it.

use std::fs::{self, File, OpenOptions};
use std::io;
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

/// Files kept for reuse per store. A compaction pass deletes one file per group commit since the
/// last (10,000 at 1,000 commits per second and a 10 s segment interval), and every one the pool
/// cannot hold is freed and later allocated again, which is the cost reuse avoids.
const MAX_RECYCLED: usize = 16_384;
/// Data blocks the pooled files of one store may keep, and the largest file kept with its
/// blocks. A put that overwrites blocks the file already has writes no allocation, so its
/// `fdatasync` flushes the data alone, where a put into an empty file also has the inode and the
/// block bitmaps to write (docs/BENCHMARKS.md, "Reused files"). Group commits are at most
/// `flush_bytes` (1 MiB by default), hence the size limit; larger files (segments) and files
/// beyond the budget are emptied and keep only their inode. Under a full disk the kept blocks
/// are given back (see [`Pool::release_blocks`]).
const MAX_RECYCLED_BYTES: u64 = 64 << 20;
/// The largest file the pool keeps with its blocks: a default group commit and its header.
const MAX_KEPT_FILE_BYTES: u64 = (1 << 20) + 4096;

/// Payloads above this size (segments, not group commits) are written in slices of it, each
/// slice's writeback started once it is in the page cache and waited for one slice later. A
/// segment written whole and flushed at the end puts megabytes in the disk's queue at once, and
/// every group commit's `fdatasync` behind them waits for all of it (and ext4's journal commit
/// for a directory fsync waits for the segment's newly allocated blocks): the end-to-end tail
/// every compaction pass. Sliced, at most two slices are ever queued ahead of a commit, and the
/// final `fdatasync` finds little left to do. The same reason as RocksDB's `bytes_per_sync`.
const WRITEBACK_SLICE: usize = 1 << 20;

/// An [`ObjectStore`] over a directory. Cheap to clone; clones share the root path and the pool
/// of reusable files, and any number of stores (in any number of processes) may share one
/// directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: Arc<Path>,
    pool: Arc<Pool>,
    syncs: Arc<DirSyncs>,
    deletes: Arc<Deletes>,
}

/// Directory fsyncs shared by concurrent callers: every put and delete must make its change
/// to a directory durable before it returns, and one fsync started after a change covers it,
/// so callers that changed the same directory while an fsync ran wait for the next one and
/// share it. Compaction deletes thousands of write-ahead objects from one directory with 16
/// deletes in flight; each used to fsync the directory on its own, contending for it with the
/// group commits' puts (docs/BENCHMARKS.md, "Reused files").
#[derive(Debug, Default)]
struct DirSyncs {
    dirs: std::sync::Mutex<std::collections::HashMap<PathBuf, DirSync>>,
    done: std::sync::Condvar,
    /// Directory fsyncs run, for tests.
    runs: AtomicU64,
}

#[derive(Debug, Default)]
struct DirSync {
    /// Changes announced (a counter: a caller's ticket).
    requested: u64,
    /// Every ticket up to this one is durable.
    synced: u64,
    running: bool,
    /// Callers inside `sync` for this directory; the entry goes when none are left.
    callers: usize,
}

impl DirSyncs {
    /// Makes every change the caller already made to `dir` durable.
    fn sync(&self, dir: &Path) -> io::Result<()> {
        let lock = || {
            self.dirs
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        };
        let mut dirs = lock();
        let entry = dirs.entry(dir.to_path_buf()).or_default();
        entry.requested += 1;
        entry.callers += 1;
        let ticket = entry.requested;
        let result = loop {
            let entry = dirs.entry(dir.to_path_buf()).or_default();
            if entry.synced >= ticket {
                break Ok(());
            }
            if entry.running {
                dirs = self
                    .done
                    .wait(dirs)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            }
            // Ours to run. It covers every change announced so far: each was made before
            // its caller took a ticket.
            entry.running = true;
            let covers = entry.requested;
            drop(dirs);
            let result = fsync_dir(dir);
            self.runs.fetch_add(1, Ordering::Relaxed);
            dirs = lock();
            let entry = dirs.entry(dir.to_path_buf()).or_default();
            entry.running = false;
            if result.is_ok() {
                entry.synced = entry.synced.max(covers);
            }
            self.done.notify_all();
            // On failure the callers it covered try again themselves, each getting its own
            // answer.
            if let Err(e) = result {
                break Err(e);
            }
        };
        let entry = dirs.entry(dir.to_path_buf()).or_default();
        entry.callers -= 1;
        if entry.callers == 0 && !entry.running {
            dirs.remove(dir);
        }
        result
    }
}

/// Files ready to be taken by a put (paths under `@recycle`), by their length.
#[derive(Debug)]
struct Pool {
    dir: PathBuf,
    files: std::sync::Mutex<PoolFiles>,
}

#[derive(Debug, Default)]
struct PoolFiles {
    by_len: std::collections::BTreeMap<u64, Vec<PathBuf>>,
    count: usize,
    /// Sum of the lengths: the data blocks the pool keeps.
    bytes: u64,
}

impl PoolFiles {
    fn push(&mut self, path: PathBuf, len: u64) {
        self.by_len.entry(len).or_default().push(path);
        self.count += 1;
        self.bytes += len;
    }

    /// The file that fits `needed` bytes best: the shortest at least that long, else the
    /// longest there is (the put extends it).
    fn take_fitting(&mut self, needed: u64) -> Option<(PathBuf, u64)> {
        let len = match self.by_len.range(needed..).next() {
            Some((&len, _)) => len,
            None => *self.by_len.keys().next_back()?,
        };
        let paths = self.by_len.get_mut(&len)?;
        let path = paths.pop()?;
        if paths.is_empty() {
            self.by_len.remove(&len);
        }
        self.count -= 1;
        self.bytes -= len;
        Some((path, len))
    }

    /// Whether a file of `len` bytes may join with its blocks.
    fn keeps(&self, len: u64) -> bool {
        len <= MAX_KEPT_FILE_BYTES && self.bytes + len <= MAX_RECYCLED_BYTES
    }
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

/// Where a test stops a put or a delete as a crash would (see the crash tests below); nothing
/// outside tests.
#[cfg(test)]
fn crash_point(step: &'static str) {
    tests::crash_point(step);
}
#[cfg(not(test))]
#[inline(always)]
fn crash_point(_step: &'static str) {}

impl Pool {
    fn files(&self) -> std::sync::MutexGuard<'_, PoolFiles> {
        self.files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens the pool directory, adopting the files left in it by earlier runs (and, from
    /// processes no longer alive, files they were recycling when they stopped).
    fn open(root: &Path) -> io::Result<Self> {
        let dir = root.join(RECYCLE_DIR);
        create_dirs_durably(&dir)?;
        let mut files = PoolFiles::default();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let ready = if name.starts_with(RECYCLED_PREFIX) {
                entry.path()
            } else if let Some(rest) = name.strip_prefix(RECYCLING_PREFIX) {
                let pid = rest.split('.').next().and_then(|p| p.parse::<i32>().ok());
                // Only a dead process's: a live one is still deciding what to keep.
                if pid.is_none_or(process_alive) {
                    continue;
                }
                let ready = dir.join(format!("{RECYCLED_PREFIX}{}", unique_suffix()));
                if fs::rename(entry.path(), &ready).is_err() {
                    continue;
                }
                ready
            } else {
                continue;
            };
            // Another store may take it meanwhile; then it is simply gone when we try.
            let Ok(len) = fs::metadata(&ready).map(|m| m.len()) else {
                continue;
            };
            let (ready, len) = if files.keeps(len) {
                (ready, len)
            } else {
                match Self::empty(&dir, &ready) {
                    Some(emptied) => (emptied, 0),
                    None => continue,
                }
            };
            files.push(ready, len);
            if files.count >= MAX_RECYCLED {
                break;
            }
        }
        Ok(Self {
            dir,
            files: std::sync::Mutex::new(files),
        })
    }

    /// Takes the pooled file that best fits `needed` bytes as `temp` and returns it open for
    /// writing, with whatever it held. None when the pool has nothing usable.
    fn take(&self, temp: &Path, needed: u64) -> Option<File> {
        loop {
            let (candidate, _) = self.files().take_fitting(needed)?;
            match fs::rename(&candidate, temp) {
                Ok(()) => {}
                // Another store or process took it first.
                Err(_) => continue,
            }
            crash_point("put: took a pooled file");
            let file = match OpenOptions::new().write(true).open(temp) {
                Ok(file) => file,
                Err(_) => continue,
            };
            // Still published under another name (a rename lost in a crash): never rewrite it.
            // Dropping our name does not free it.
            let reusable = file.metadata().is_ok_and(|m| m.nlink() == 1);
            if !reusable {
                let _ = fs::remove_file(temp);
                continue;
            }
            return Some(file);
        }
    }

    /// Moves a deleted object's file into the pool (with its blocks when the pool's budget
    /// allows, else emptied), or unlinks it when the pool is full. Returns whether the object
    /// existed.
    fn recycle(&self, object: &Path) -> io::Result<bool> {
        if self.files().count >= MAX_RECYCLED {
            return match fs::remove_file(object) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
            };
        }
        let suffix = unique_suffix();
        // Under a name no one takes while we decide what to keep, so that no put can be
        // writing it meanwhile.
        let recycling = self.dir.join(format!("{RECYCLING_PREFIX}{suffix}"));
        match fs::rename(object, &recycling) {
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
        crash_point("delete: renamed into the pool");
        let ready = self.dir.join(format!("{RECYCLED_PREFIX}{suffix}"));
        let kept = fs::metadata(&recycling).and_then(|meta| {
            let len = meta.len();
            if self.files().keeps(len) {
                return Ok(len);
            }
            OpenOptions::new()
                .write(true)
                .open(&recycling)
                .and_then(|file| file.set_len(0))
                .map(|()| 0)
        });
        let ready_len = kept.and_then(|len| {
            crash_point("delete: decided what to keep");
            fs::rename(&recycling, &ready).map(|()| len)
        });
        match ready_len {
            Ok(len) => self.files().push(ready, len),
            Err(e) => {
                tracing::warn!(path = %recycling.display(), error = %e, "could not keep a deleted file for reuse");
                let _ = fs::remove_file(&recycling);
            }
        }
        Ok(true)
    }

    /// Empties a pooled file and returns its new name in the pool; None if it is gone (another
    /// store took it). It is moved out of reach first: truncating it where it lies could cut a
    /// put in another process that took it between our open and our truncate.
    fn empty(dir: &Path, pooled: &Path) -> Option<PathBuf> {
        let suffix = unique_suffix();
        let private = dir.join(format!("{RECYCLING_PREFIX}{suffix}"));
        fs::rename(pooled, &private).ok()?;
        let ready = dir.join(format!("{RECYCLED_PREFIX}{suffix}"));
        let emptied = OpenOptions::new()
            .write(true)
            .open(&private)
            .and_then(|file| file.set_len(0))
            .and_then(|()| fs::rename(&private, &ready));
        match emptied {
            Ok(()) => Some(ready),
            Err(e) => {
                tracing::warn!(path = %private.display(), error = %e, "could not empty a pooled file");
                let _ = fs::remove_file(&private);
                None
            }
        }
    }

    /// Empties every pooled file, giving their blocks back to the filesystem: called when a
    /// write found it full, so that space the pool holds never stands between a producer and a
    /// disk with room left. The files stay in the pool (as inodes) and are returned as such.
    fn release_blocks(&self) {
        let mut files = self.files();
        if files.bytes == 0 {
            return;
        }
        let kept = std::mem::take(&mut *files);
        for (len, paths) in kept.by_len {
            for path in paths {
                if len == 0 {
                    files.push(path, 0);
                } else if let Some(emptied) = Self::empty(&self.dir, &path) {
                    files.push(emptied, 0);
                }
            }
        }
        tracing::warn!(
            released = kept.bytes,
            "the disk is full: emptied the reuse pool's files"
        );
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
            syncs: Arc::default(),
            deletes: Arc::default(),
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
/// predecessor. It is as cheap to read as `stat` (one 32-byte `pread`), and because `get` reads
/// header and payload from one open file and checks afterwards that the header is unchanged
/// (see [`unchanged`]), the version returned always belongs to the bytes returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    incarnation: u64,
    generation: u64,
}

impl Header {
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

    /// The header every write makes: magic, incarnation, generation, payload length. The
    /// length is in the header, not taken from the file's size, because a reused file keeps
    /// its blocks (see "Reused files" above): a payload shorter than the file it was written
    /// into is followed by the previous object's bytes.
    fn encode(self, len: u64) -> [u8; Head::LEN] {
        let mut out = [0u8; Head::LEN];
        out[..8].copy_from_slice(&Head::MAGIC);
        out[8..16].copy_from_slice(&self.incarnation.to_le_bytes());
        out[16..24].copy_from_slice(&self.generation.to_le_bytes());
        out[24..].copy_from_slice(&len.to_le_bytes());
        out
    }
}

/// What the first bytes of an object file say: its version and where its payload is.
///
/// Two formats are read. Files written since reuse kept blocks carry [`Head::MAGIC`] and the
/// payload length (32 bytes). Older files carry [`Head::MAGIC_V1`] in a 24-byte header, and
/// their payload runs to the end of the file; nothing writes that format any more, but a data
/// directory from an older Strata still holds such files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    header: Header,
    /// Where the payload starts: the header's length.
    offset: u64,
    len: u64,
    /// The header as read, compared byte for byte by [`unchanged`].
    raw: [u8; Head::LEN],
}

impl Head {
    const MAGIC: [u8; 8] = *b"STRATA\x00\x02";
    const LEN: usize = 32;
    const MAGIC_V1: [u8; 8] = *b"STRATA\x00\x01";
    const LEN_V1: usize = 24;

    /// Parses the first bytes of a file `file_len` long (`bytes` holds as many as were there,
    /// up to [`Head::LEN`]). None when they are not a Strata object header or promise more
    /// payload than the file holds.
    fn decode(bytes: &[u8], file_len: u64) -> Option<Self> {
        let word = |at: usize| -> Option<u64> {
            let mut w = [0u8; 8];
            w.copy_from_slice(bytes.get(at..at + 8)?);
            Some(u64::from_le_bytes(w))
        };
        let header = Header {
            incarnation: word(8)?,
            generation: word(16)?,
        };
        let magic = bytes.get(..8)?;
        let (offset, len) = if magic == Self::MAGIC {
            let offset = Self::LEN as u64;
            let len = word(24)?;
            if offset.checked_add(len)? > file_len {
                return None;
            }
            (offset, len)
        } else if magic == Self::MAGIC_V1 {
            let offset = Self::LEN_V1 as u64;
            (offset, file_len.checked_sub(offset)?)
        } else {
            return None;
        };
        let mut raw = [0u8; Self::LEN];
        let kept = usize::try_from(offset).ok()?;
        raw[..kept].copy_from_slice(bytes.get(..kept)?);
        Some(Self {
            header,
            offset,
            len,
            raw,
        })
    }

    /// Reads the head of an open object file.
    fn read_from(file: &File, path: &Path) -> StorageResult<Self> {
        let file_len = file
            .metadata()
            .map_err(|e| io_error("stat", path, e))?
            .len();
        let mut bytes = [0u8; Self::LEN];
        let got = read_up_to(file, &mut bytes).map_err(|e| io_error("read", path, e))?;
        Self::decode(&bytes[..got], file_len).ok_or_else(|| not_an_object(path))
    }

    /// The header bytes as they were read (24 or 32 of them).
    fn raw(&self) -> &[u8] {
        &self.raw[..usize::try_from(self.offset).unwrap_or(Self::LEN)]
    }
}

/// Reads from the start of `file` into `buf` until it is full or the file ends; returns how
/// many bytes were read.
fn read_up_to(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
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
/// one, else a new one) and makes it durable. On error nothing is left behind.
///
/// A pooled file is overwritten in place from its start and keeps its length when that is
/// more than the object's (the header says where the object ends), so its blocks are reused
/// rather than freed and allocated again: `fdatasync` then has only the data to flush unless
/// the file had to grow, in which case it flushes the new length and blocks too, which is all
/// a reader after a crash needs. (`fsync` would also write the inode's timestamps.)
fn write_temp(
    pool: &Pool,
    location: &Location,
    header: Header,
    data: &[u8],
) -> io::Result<PathBuf> {
    let len = data.len() as u64;
    loop {
        // Unique within the process by the counter, across processes by the pid; `create_new`
        // catches anything else (a pid reused by a process on another host sharing the
        // directory).
        let temp = location
            .dir
            .join(format!("{}{TEMP_INFIX}{}", location.last, unique_suffix()));
        let file = match pool.take(&temp, Head::LEN as u64 + len) {
            Some(file) => file,
            None => match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            },
        };
        // The header first: a reader of this inode's previous object sees it change before any
        // of the new payload can reach it.
        let written = file
            .write_all_at(&header.encode(len), 0)
            .and_then(|()| {
                crash_point("put: wrote the header");
                write_payload(&file, data, Head::LEN as u64)
            })
            .and_then(|()| {
                crash_point("put: wrote the payload");
                file.sync_data()
            });
        return match written {
            Ok(()) => {
                crash_point("put: flushed");
                Ok(temp)
            }
            Err(e) => {
                remove_temp(&temp);
                if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                    pool.release_blocks();
                }
                Err(e)
            }
        };
    }
}

/// Writes `data` at `at`, in writeback slices when it is larger than one (see
/// [`WRITEBACK_SLICE`]). Durability still comes from the caller's `fdatasync`: the slices only
/// pace what reaches the disk before it.
fn write_payload(file: &File, data: &[u8], at: u64) -> io::Result<()> {
    if data.len() <= WRITEBACK_SLICE {
        return file.write_all_at(data, at);
    }
    let mut paced = true;
    let mut previous: Option<(u64, usize)> = None;
    let mut offset = at;
    for slice in data.chunks(WRITEBACK_SLICE) {
        file.write_all_at(slice, offset)?;
        if paced {
            let waited =
                writeback(file, offset, slice.len(), false).and_then(|()| match previous {
                    Some((start, len)) => writeback(file, start, len, true),
                    None => Ok(()),
                });
            match waited {
                Ok(()) => {}
                // Not offered here (another OS, or a filesystem without it): plain writes,
                // with the final flush doing all of it as before.
                Err(e) if unsupported(&e) => paced = false,
                Err(e) => return Err(e),
            }
        }
        previous = Some((offset, slice.len()));
        offset += slice.len() as u64;
    }
    Ok(())
}

/// Starts writeback of a written range, or (`wait`) waits until all of it has reached the disk.
#[cfg(target_os = "linux")]
fn writeback(file: &File, offset: u64, len: usize, wait: bool) -> io::Result<()> {
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: sync_file_range reads no memory of ours; the descriptor is open for as long as
    // `file` is borrowed.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn writeback(_file: &File, _offset: u64, _len: usize, _wait: bool) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Whether `sync_file_range` failed only because it is not offered for this file.
fn unsupported(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
        || matches!(
            e.raw_os_error(),
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::ESPIPE)
        )
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

fn put_create(
    pool: &Pool,
    syncs: &DirSyncs,
    location: &Location,
    data: &[u8],
) -> StorageResult<Version> {
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
        crash_point("put: linked");
        remove_temp(&temp);
        crash_point("put: removed the temp name");
        return match linked {
            Ok(()) => match syncs.sync(&location.dir) {
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
    syncs: &DirSyncs,
    location: &Location,
    data: &[u8],
    expected: &Version,
) -> StorageResult<Version> {
    let _lock = KeyLock::acquire(location)?;
    // Under the lock nobody else can replace or delete the object, and a create cannot succeed
    // while it exists, so the version read here stays current until our rename.
    let current = match File::open(&location.object) {
        Ok(file) => Head::read_from(&file, &location.object)?.header,
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
    syncs.sync(&location.dir).map_err(|e| {
        StorageError::Unavailable(format!(
            "replaced {} but could not fsync its directory: {e}",
            location.key
        ))
    })?;
    Ok(next.version())
}

fn get(location: &Location) -> StorageResult<(Bytes, Version)> {
    let (file, head) = open_object(location)?;
    let mut data = vec![0u8; to_usize(head.len, location)?];
    let read = file.read_exact_at(&mut data, head.offset);
    unchanged(&file, &head, location, read)?;
    Ok((Bytes::from(data), head.header.version()))
}

fn get_range(location: &Location, range: &Range<u64>) -> StorageResult<Bytes> {
    let (file, head) = open_object(location)?;
    let (start, end) = clamp_range(&location.key, range, head.len)?;
    let mut data = vec![0u8; end - start];
    let read = file.read_exact_at(&mut data, head.offset + start as u64);
    unchanged(&file, &head, location, read)?;
    Ok(Bytes::from(data))
}

/// After a read of an object's payload: whether the file still holds the object whose header
/// was read first. A delete keeps the file for reuse, and the next write of it starts with a
/// new header (a new incarnation or generation), so a header that is gone or differs means the
/// object was deleted during the read (NotFound), and nothing read may be returned.
fn unchanged(
    file: &File,
    head: &Head,
    location: &Location,
    read: io::Result<()>,
) -> StorageResult<()> {
    let mut again = [0u8; Head::LEN];
    let expected = head.raw();
    let again = &mut again[..expected.len()];
    let same = file.read_exact_at(again, 0).is_ok() && again == expected;
    match read {
        _ if !same => Err(StorageError::NotFound(location.key.clone())),
        Ok(()) => Ok(()),
        Err(e) => Err(io_error("read", &location.object, e)),
    }
}

/// Opens an object file and reads its head. Everything read through this handle belongs to one
/// version as long as the header does not change (see [`unchanged`]).
fn open_object(location: &Location) -> StorageResult<(File, Head)> {
    let file = match File::open(&location.object) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StorageError::NotFound(location.key.clone()))
        }
        Err(e) => return Err(io_error("open", &location.object, e)),
    };
    let head = Head::read_from(&file, &location.object)?;
    Ok((file, head))
}

fn to_usize(len: u64, location: &Location) -> StorageResult<usize> {
    usize::try_from(len).map_err(|_| {
        StorageError::Invalid(format!("{} is too large to read at once", location.key))
    })
}

/// Deletes one object (the batch path with a batch of one; the crash tests drive it).
#[cfg(test)]
fn delete(root: &Path, pool: &Pool, syncs: &DirSyncs, location: &Location) -> StorageResult<()> {
    delete_batch(root, pool, syncs, std::slice::from_ref(location))
        .pop()
        .unwrap_or(Ok(()))
}

/// Deletes a batch of objects: each under its key's lock as before, then one fsync per
/// directory for the whole batch, then one attempt per directory to prune it. Returns one
/// result per location, in order; an object whose directory could not be fsynced gets that
/// error (it is gone from the namespace but perhaps not durably, so it is not reported done).
///
/// A key's lock is released before the directory fsync, not held through it: the lock orders
/// writers of one key, and a put that follows the delete into that key (or any change to the
/// directory) is made durable by a later fsync of the same directory, which covers the
/// delete's rename too. Holding a batch's worth of stripes through an fsync would make group
/// commits whose keys share a stripe wait for it.
fn delete_batch(
    root: &Path,
    pool: &Pool,
    syncs: &DirSyncs,
    locations: &[Location],
) -> Vec<StorageResult<()>> {
    let mut results: Vec<StorageResult<bool>> = locations
        .iter()
        .map(|location| {
            let _lock = KeyLock::acquire(location)?;
            pool.recycle(&location.object)
                .map_err(|e| io_error("delete", &location.object, e))
        })
        .collect();
    let mut dirs: Vec<&Path> = locations.iter().map(|l| l.dir.as_path()).collect();
    dirs.sort_unstable();
    dirs.dedup();
    for dir in dirs {
        let changed = locations
            .iter()
            .zip(&results)
            .any(|(l, r)| l.dir == dir && matches!(r, Ok(true)));
        if !changed {
            continue;
        }
        if let Err(e) = sync_dir_or_ancestor(syncs, root, dir) {
            // Each caller gets its own copy, keeping the errno that tells "full" from others.
            let copy = || {
                e.raw_os_error().map_or_else(
                    || io::Error::new(e.kind(), e.to_string()),
                    io::Error::from_raw_os_error,
                )
            };
            for (l, r) in locations.iter().zip(results.iter_mut()) {
                if l.dir == dir && matches!(r, Ok(true)) {
                    *r = Err(io_error("fsync", dir, copy()));
                }
            }
        }
    }
    let mut pruned: Vec<&Path> = Vec::new();
    for location in locations {
        if !pruned.contains(&location.dir.as_path()) {
            pruned.push(&location.dir);
            prune_empty_dirs(root, &location.dir);
        }
    }
    results.into_iter().map(|r| r.map(|_| ())).collect()
}

/// Makes a delete's rename out of `dir` durable. If `dir` is gone, another deleter emptied it
/// meanwhile and pruned it (another store on the directory, or another process): the rename
/// and the removal are both in the filesystem's journal, in that order, and an fsync of the
/// nearest directory still there commits them. Before this a delete that lost that race
/// reported an fsync error for an object it had deleted.
fn sync_dir_or_ancestor(syncs: &DirSyncs, root: &Path, dir: &Path) -> io::Result<()> {
    let mut current = dir;
    loop {
        match syncs.sync(current) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && current != root => {
                match current.parent() {
                    Some(parent) if parent.starts_with(root) => current = parent,
                    _ => return Err(e),
                }
            }
            result => return result,
        }
    }
}

/// Deletes queued by concurrent callers, carried out together on one blocking thread: the
/// group commit of deletes. Compaction frees a write-ahead object per group commit it folded
/// into segments, thousands at a time; one at a time each cost a blocking-pool hand-off, a
/// directory fsync (shared only with the few running at that moment) and a failed `rmdir`, and
/// sixteen in flight took both cores for a second or more every segment interval — the local
/// backend's end-to-end tail (docs/BENCHMARKS.md, "Deletes in groups"). Queued, they share one
/// fsync per directory per batch and never use more than one thread.
#[derive(Debug, Default)]
struct Deletes {
    state: std::sync::Mutex<DeleteQueue>,
}

type DeleteReply = tokio::sync::oneshot::Sender<StorageResult<()>>;

#[derive(Debug, Default)]
struct DeleteQueue {
    queued: Vec<(Location, DeleteReply)>,
    /// A blocking task is draining the queue: new deletes join it rather than start another.
    draining: bool,
}

/// Held by the task draining [`Deletes`]. However that task ends — done, panicked, or never
/// run because the runtime was shutting down — dropping this lets a later delete start a
/// drain of its own, and answers anything still queued with an error rather than leaving its
/// caller waiting for ever.
struct Draining {
    deletes: Arc<Deletes>,
    /// The drain returned normally, having handed the queue back empty: nothing to undo (and
    /// a later delete may already have started the next drain).
    finished: bool,
}

impl Draining {
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut queue = self.deletes.queue();
        queue.draining = false;
        queue.queued.clear();
    }
}

/// The most deletes one batch carries, so that its callers hear back while more keep coming.
const MAX_DELETE_BATCH: usize = 256;

impl Deletes {
    fn queue(&self) -> std::sync::MutexGuard<'_, DeleteQueue> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a delete; true when the caller must start the draining task.
    fn push(&self, location: Location, reply: DeleteReply) -> bool {
        let mut queue = self.queue();
        queue.queued.push((location, reply));
        !std::mem::replace(&mut queue.draining, true)
    }

    /// Carries out queued deletes until none is left. Run with a [`Draining`] alive.
    fn drain(&self, root: &Path, pool: &Pool, syncs: &DirSyncs) {
        loop {
            let batch: Vec<(Location, DeleteReply)> = {
                let mut queue = self.queue();
                if queue.queued.is_empty() {
                    queue.draining = false;
                    return;
                }
                let take = queue.queued.len().min(MAX_DELETE_BATCH);
                queue.queued.drain(..take).collect()
            };
            let (locations, replies): (Vec<Location>, Vec<DeleteReply>) = batch.into_iter().unzip();
            let results = delete_batch(root, pool, syncs, &locations);
            for (reply, result) in replies.into_iter().zip(results) {
                // A caller that stopped waiting only misses its answer.
                let _ = reply.send(result);
            }
        }
    }
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
            // Size and tag come from one read of one open file's header, so both belong to the
            // same write even if the key is replaced meanwhile.
            let file = match File::open(&path) {
                Ok(file) => file,
                // Deleted between readdir and open: it is not there any more.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error("open", &path, e)),
            };
            // The change tag is the header's version, not stat's (inode, mtime, size): a replace
            // always makes a new inode, but inode numbers are recycled and mtime has a coarse
            // tick, so two same-size rewrites between listings could bring the triple back (the
            // same reason the version lives in the header). The size is the header's too (a
            // reused file can be longer than its object). Reading 32 bytes of a file we have
            // open is one `pread` more than the `stat` a listing needs anyway.
            let head = Head::read_from(&file, &path);
            // Deleted since we opened it (its file may already hold another object): not
            // there any more.
            if !still_named(&file, &path) {
                continue;
            }
            let (size, tag) = match head {
                Ok(head) => (head.len, Some(ChangeTag(head.header.version().0))),
                Err(_) => {
                    // Still listed (reading it reports the problem) but without a tag, and with
                    // a size as an old-format file would have.
                    let len = file
                        .metadata()
                        .map_err(|e| io_error("stat", &path, e))?
                        .len();
                    let Some(size) = len.checked_sub(Head::LEN_V1 as u64) else {
                        tracing::warn!(path = %path.display(), "skipping a file too short to be a Strata object");
                        continue;
                    };
                    (size, None)
                }
            };
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
        let syncs = Arc::clone(&self.syncs);
        blocking(move || match mode {
            PutMode::Create => put_create(&pool, &syncs, &location, &data),
            PutMode::Update(expected) => put_update(&pool, &syncs, &location, &data, &expected),
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
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.deletes.push(self.location(key), reply) {
            let root = Arc::clone(&self.root);
            let pool = Arc::clone(&self.pool);
            let syncs = Arc::clone(&self.syncs);
            let mut draining = Draining {
                deletes: Arc::clone(&self.deletes),
                finished: false,
            };
            // Detached: the batch finishes for the other callers in it even if this one is
            // dropped while it waits.
            drop(tokio::task::spawn_blocking(move || {
                draining.deletes.drain(&root, &pool, &syncs);
                draining.finish();
            }));
        }
        answer
            .await
            .map_err(|_| StorageError::Other("the local delete task ended early".into()))?
    }

    fn backend_name(&self) -> &'static str {
        "file"
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::sync::Barrier;
    use std::time::Duration;

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

    /// Segments are written in writeback slices: every byte of a payload spanning several
    /// slices, the last one short, reads back in place, whole and by range.
    #[tokio::test]
    async fn a_payload_of_several_writeback_slices_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let len = 2 * WRITEBACK_SLICE + WRITEBACK_SLICE / 3 + 7;
        let data: Bytes = (0..len)
            .map(|i| (i % 251) as u8 ^ (i / 4096) as u8)
            .collect::<Vec<u8>>()
            .into();
        let k = key("seg/big");
        store.put(&k, data.clone(), PutMode::Create).await.unwrap();
        let (read, _) = store.get(&k).await.unwrap();
        assert!(read == data, "the payload read back differs");
        let from = (WRITEBACK_SLICE - 3) as u64;
        let range = store.get_range(&k, from..from + 10).await.unwrap();
        assert_eq!(&range[..], &data[from as usize..from as usize + 10]);
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
    async fn a_deleted_file_keeps_its_blocks_and_is_overwritten_by_the_next_put() {
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
        let kept = fs::metadata(&pooled[0]).unwrap().len();
        assert_eq!(kept, 4096 + Head::LEN as u64, "kept with its blocks");
        assert!(store.list("").await.unwrap().is_empty(), "never listed");

        // A shorter object in the same file: the rest of the file is the old object's bytes,
        // and nothing of them shows.
        store
            .put(&b, Bytes::from_static(b"bee"), PutMode::Create)
            .await
            .unwrap();
        let b_path = store.location(&b).object;
        assert_eq!(inode(&b_path), a_inode, "the same file");
        assert_eq!(fs::metadata(&b_path).unwrap().len(), kept, "not shrunk");
        assert_eq!(&store.get(&b).await.unwrap().0[..], b"bee");
        assert_eq!(&store.get_range(&b, 1..100).await.unwrap()[..], b"ee");
        assert!(matches!(
            store.get_range(&b, 3..4).await,
            Err(StorageError::Invalid(_)) | Ok(_)
        ));
        let listed = store.list("wal/").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].size, 3);
        assert_eq!(
            fs::read_dir(dir.path().join(RECYCLE_DIR)).unwrap().count(),
            0
        );
        // A longer object than the pooled file extends it.
        store.delete(&b).await.unwrap();
        let long = Bytes::from(vec![9u8; 10_000]);
        store.put(&a, long.clone(), PutMode::Create).await.unwrap();
        assert_eq!(inode(&store.location(&a).object), a_inode);
        assert_eq!(store.get(&a).await.unwrap().0, long);
        // A second store on the directory adopts what the first left in the pool.
        store.delete(&a).await.unwrap();
        let other = LocalStore::open(dir.path()).unwrap();
        other
            .put(&a, Bytes::from_static(b"again"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(inode(&other.location(&a).object), a_inode);
        assert_eq!(&other.get(&a).await.unwrap().0[..], b"again");
    }

    /// Files larger than a group commit (segments) are emptied when pooled, and the pool's
    /// blocks stay within their budget.
    #[tokio::test]
    async fn the_pool_keeps_blocks_only_of_small_files_and_within_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let big = key("seg/big");
        store
            .put(&big, Bytes::from(vec![1u8; 2 << 20]), PutMode::Create)
            .await
            .unwrap();
        store.delete(&big).await.unwrap();
        assert_eq!(
            store.pool.files().bytes,
            0,
            "a segment-sized file is emptied"
        );
        assert_eq!(store.pool.files().count, 1);
        let per_file = 1 << 20;
        let files = MAX_RECYCLED_BYTES / (per_file + Head::LEN as u64) + 3;
        for i in 0..files {
            let k = key(&format!("wal/{i}"));
            store
                .put(
                    &k,
                    Bytes::from(vec![2u8; per_file as usize]),
                    PutMode::Create,
                )
                .await
                .unwrap();
        }
        for i in 0..files {
            store.delete(&key(&format!("wal/{i}"))).await.unwrap();
        }
        let pool = store.pool.files();
        assert!(
            pool.bytes <= MAX_RECYCLED_BYTES,
            "{} bytes kept",
            pool.bytes
        );
        assert!(pool.bytes > MAX_RECYCLED_BYTES / 2);
        let on_disk: u64 = fs::read_dir(dir.path().join(RECYCLE_DIR))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(on_disk, pool.bytes, "the count matches the files");
        drop(pool);
        store.pool.release_blocks();
        assert_eq!(store.pool.files().bytes, 0);
        assert!(fs::read_dir(dir.path().join(RECYCLE_DIR))
            .unwrap()
            .all(|e| e.unwrap().metadata().unwrap().len() == 0));
    }

    /// A data directory written before headers carried the payload length still reads, lists
    /// and updates.
    #[tokio::test]
    async fn objects_in_the_old_header_format_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let k = key("old/obj");
        let mut file = Head::MAGIC_V1.to_vec();
        file.extend_from_slice(&0x1234_u64.to_le_bytes());
        file.extend_from_slice(&3_u64.to_le_bytes());
        file.extend_from_slice(b"payload");
        fs::create_dir_all(dir.path().join("old")).unwrap();
        fs::write(dir.path().join("old/obj@"), &file).unwrap();
        let (data, version) = store.get(&k).await.unwrap();
        assert_eq!(&data[..], b"payload");
        assert_eq!(version, Version(format!("{:016x}.3", 0x1234)));
        assert_eq!(&store.get_range(&k, 3..7).await.unwrap()[..], b"load");
        let listed = store.list("old/").await.unwrap();
        assert_eq!(listed[0].size, 7);
        assert_eq!(listed[0].tag, Some(ChangeTag(version.0.clone())));
        let next = store
            .put(&k, Bytes::from_static(b"new"), PutMode::Update(version))
            .await
            .unwrap();
        assert_eq!(next, Version(format!("{:016x}.4", 0x1234)));
        assert_eq!(&store.get(&k).await.unwrap().0[..], b"new");
        // A header promising more than the file holds is not an object.
        let mut lying = Header::fresh().encode(100).to_vec();
        lying.extend_from_slice(b"short");
        fs::write(dir.path().join("old/lying@"), &lying).unwrap();
        assert!(matches!(
            store.get(&key("old/lying")).await,
            Err(StorageError::Other(_))
        ));
    }

    /// What `get` does first: open the object's file and read its header.
    fn open_for_read(store: &LocalStore, k: &ObjectKey) -> (Location, File, Head) {
        let location = store.location(k);
        let (file, head) = open_object(&location).unwrap();
        (location, file, head)
    }

    #[tokio::test]
    async fn a_read_overtaken_by_a_reuse_is_not_found_never_another_objects_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let (a, b) = (key("wal/a"), key("wal/b"));
        for (name, reused) in [("deleted", false), ("deleted and reused", true)] {
            store
                .put(&a, Bytes::from_static(b"aaaa"), PutMode::Create)
                .await
                .unwrap();
            let (location, file, head) = open_for_read(&store, &a);
            // Then the object is deleted (its file pooled) and maybe rewritten as another.
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
            let read = file.read_exact_at(&mut data, head.offset);
            let outcome = unchanged(&file, &head, &location, read);
            if reused {
                assert!(
                    matches!(outcome, Err(StorageError::NotFound(_))),
                    "{name}: {outcome:?}"
                );
                assert_eq!(&data, b"bbbb", "the bytes read were another object's");
                store.delete(&b).await.unwrap();
            } else {
                // The pooled file still holds the deleted object whole: the read is simply
                // ordered before the delete, as on any object store.
                assert!(outcome.is_ok(), "{name}: {outcome:?}");
                assert_eq!(&data, b"aaaa");
            }
        }
        // Untouched, the same check passes.
        store
            .put(&a, Bytes::from_static(b"aaaa"), PutMode::Create)
            .await
            .unwrap();
        let (location, file, head) = open_for_read(&store, &a);
        assert!(unchanged(&file, &head, &location, Ok(())).is_ok());
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

    thread_local! {
        static CRASH_AT: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
    }

    /// What a simulated crash unwinds with.
    struct SimulatedCrash;

    /// Stops the calling thread at `step` if a test asked for it: unwinding skips every later
    /// statement, including the cleanup a returned error would run, which is what a process
    /// that dies there leaves behind. (`resume_unwind` does not run the panic hook, so nothing
    /// is printed.)
    pub(super) fn crash_point(step: &'static str) {
        if CRASH_AT.with(|at| at.get()) == Some(step) {
            CRASH_AT.with(|at| at.set(None));
            std::panic::resume_unwind(Box::new(SimulatedCrash));
        }
    }

    /// Runs `work` as a process that dies at `step`; panics if it never got there.
    fn crash_at<T>(step: &'static str, work: impl FnOnce() -> T) {
        CRASH_AT.with(|at| at.set(Some(step)));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        CRASH_AT.with(|at| at.set(None));
        match outcome {
            Err(payload) if payload.is::<SimulatedCrash>() => {}
            Err(payload) => std::panic::resume_unwind(payload),
            Ok(_) => panic!("never reached {step}"),
        }
    }

    const PUT_STEPS: [&str; 6] = [
        "put: took a pooled file",
        "put: wrote the header",
        "put: wrote the payload",
        "put: flushed",
        "put: linked",
        "put: removed the temp name",
    ];

    /// After a crash (a new store on the directory, as the next process would open): puts and
    /// deletes of objects of many sizes, reading each back, and the surviving objects intact.
    fn churn_after_restart(root: &Path, survivors: &[(ObjectKey, Bytes)]) {
        let store = LocalStore::open(root).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for round in 0..40usize {
                let k = key(&format!("wal/churn/{round}"));
                let body = Bytes::from(vec![round as u8; (round * 397) % 9000 + 1]);
                store.put(&k, body.clone(), PutMode::Create).await.unwrap();
                assert_eq!(store.get(&k).await.unwrap().0, body);
                if round % 3 != 0 {
                    store.delete(&k).await.unwrap();
                }
            }
            for (k, body) in survivors {
                assert_eq!(&store.get(k).await.unwrap().0, body, "{k} changed");
            }
        });
    }

    /// A put into a reused file, stopped at every step: the key is absent until the link and
    /// whole after it, a reader never sees part of it, and the next process reuses nothing
    /// that is still published.
    #[test]
    fn a_put_that_dies_at_any_step_leaves_the_key_absent_or_whole() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for (index, step) in PUT_STEPS.into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let store = LocalStore::open(dir.path()).unwrap();
            let (old, new) = (key("wal/old"), key("wal/new"));
            rt.block_on(async {
                store
                    .put(&old, Bytes::from(vec![b'o'; 5000]), PutMode::Create)
                    .await
                    .unwrap();
                store.delete(&old).await.unwrap();
            });
            assert_eq!(store.pool.files().count, 1);
            let body = Bytes::from(vec![b'n'; 1000]);
            let location = store.location(&new);
            crash_at(step, || {
                put_create(&store.pool, &store.syncs, &location, &body)
            });
            drop(store);

            let after = LocalStore::open(dir.path()).unwrap();
            let published = index >= PUT_STEPS.iter().position(|s| *s == "put: linked").unwrap();
            let got = rt.block_on(after.get(&new));
            let listed = rt.block_on(after.list("wal/")).unwrap();
            if published {
                assert_eq!(got.unwrap().0, body, "{step}");
                assert_eq!(listed.len(), 1, "{step}");
                assert_eq!(listed[0].size, 1000, "{step}");
            } else {
                assert!(
                    matches!(got, Err(StorageError::NotFound(_))),
                    "{step}: {got:?}"
                );
                assert!(listed.is_empty(), "{step}: {listed:?}");
            }
            let survivors = if published {
                vec![(new.clone(), body.clone())]
            } else {
                Vec::new()
            };
            churn_after_restart(dir.path(), &survivors);
        }
    }

    /// A power cut can undo the rename that took a file out of the pool while keeping the link
    /// that published it: the file is then both pooled and an object. It must never be
    /// rewritten.
    #[test]
    fn a_pooled_file_that_is_still_published_is_never_rewritten() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let a = key("wal/a");
        let body = Bytes::from(vec![b'a'; 3000]);
        rt.block_on(store.put(&a, body.clone(), PutMode::Create))
            .unwrap();
        fs::hard_link(
            store.location(&a).object,
            dir.path()
                .join(RECYCLE_DIR)
                .join(format!("{RECYCLED_PREFIX}1.1")),
        )
        .unwrap();
        drop(store);
        let after = LocalStore::open(dir.path()).unwrap();
        assert_eq!(after.pool.files().count, 1, "adopted");
        rt.block_on(after.put(
            &key("wal/b"),
            Bytes::from(vec![b'b'; 3000]),
            PutMode::Create,
        ))
        .unwrap();
        assert_eq!(rt.block_on(after.get(&a)).unwrap().0, body);
        churn_after_restart(dir.path(), &[(a, body)]);
    }

    /// A pid no process has: a child's, after it exited.
    fn dead_pid() -> u32 {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    /// A delete stopped at every step, for a file kept with its blocks and for one emptied:
    /// the key is gone, and the next process adopts the half-recycled file and reuses it
    /// correctly.
    #[test]
    fn a_delete_that_dies_at_any_step_loses_nothing_and_its_file_is_adopted() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for step in [
            "delete: renamed into the pool",
            "delete: decided what to keep",
        ] {
            for len in [4000usize, 2 << 20] {
                let dir = tempfile::tempdir().unwrap();
                let store = LocalStore::open(dir.path()).unwrap();
                let (gone, kept) = (key("wal/gone"), key("wal/kept"));
                let kept_body = Bytes::from(vec![b'k'; 100]);
                rt.block_on(async {
                    store
                        .put(&gone, Bytes::from(vec![b'g'; len]), PutMode::Create)
                        .await
                        .unwrap();
                    store
                        .put(&kept, kept_body.clone(), PutMode::Create)
                        .await
                        .unwrap();
                });
                let location = store.location(&gone);
                crash_at(step, || {
                    delete(&store.root, &store.pool, &store.syncs, &location)
                });
                drop(store);
                // The next process: the one that died has a pid no process has now.
                let pool_dir = dir.path().join(RECYCLE_DIR);
                let dead = dead_pid();
                for entry in fs::read_dir(&pool_dir).unwrap() {
                    let name = entry.unwrap().file_name().into_string().unwrap();
                    let rest = name.strip_prefix(RECYCLING_PREFIX).unwrap();
                    let (_, n) = rest.split_once('.').unwrap();
                    fs::rename(
                        pool_dir.join(&name),
                        pool_dir.join(format!("{RECYCLING_PREFIX}{dead}.{n}")),
                    )
                    .unwrap();
                }
                let after = LocalStore::open(dir.path()).unwrap();
                assert_eq!(after.pool.files().count, 1, "{step}, {len}: adopted");
                let got = rt.block_on(after.get(&gone));
                assert!(
                    matches!(got, Err(StorageError::NotFound(_))),
                    "{step}: {got:?}"
                );
                drop(after);
                churn_after_restart(dir.path(), &[(kept, kept_body)]);
            }
        }
    }

    /// Callers that changed a directory while its fsync was running share the next one, and
    /// none returns before an fsync that started after its call; alone, each runs its own.
    /// Runs the drain of `store`'s queued deletes, as the task a delete starts would.
    async fn drain_now(store: &LocalStore) {
        let drainer = store.clone();
        tokio::task::spawn_blocking(move || {
            drainer
                .deletes
                .drain(&drainer.root, &drainer.pool, &drainer.syncs)
        })
        .await
        .unwrap();
    }

    /// Deletes that queue while a batch runs go out together: one fsync per directory for the
    /// lot, every caller answered, every object gone, and a key that was never there is fine.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_deletes_go_out_in_one_batch_with_one_fsync_per_directory() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let keys: Vec<ObjectKey> = (0..32)
            .map(|i| key(&format!("wal/{}/{i:04}", i % 2)))
            .collect();
        for k in &keys {
            store
                .put(k, Bytes::from_static(b"batch"), PutMode::Create)
                .await
                .unwrap();
        }
        let mut asked = keys.clone();
        asked.push(key("wal/0/never-there"));
        // As if a drain were running: the deletes queue behind it.
        store.deletes.queue().draining = true;
        let callers: Vec<_> = asked
            .iter()
            .map(|k| {
                let (store, k) = (store.clone(), k.clone());
                tokio::spawn(async move { store.delete(&k).await })
            })
            .collect();
        while store.deletes.queue().queued.len() < asked.len() {
            tokio::task::yield_now().await;
        }
        let runs_before = store.syncs.runs.load(Ordering::Relaxed);
        drain_now(&store).await;
        for caller in callers {
            caller.await.unwrap().unwrap();
        }
        assert_eq!(
            store.syncs.runs.load(Ordering::Relaxed) - runs_before,
            2,
            "one fsync for each of the two directories"
        );
        for k in &keys {
            assert!(matches!(store.get(k).await, Err(StorageError::NotFound(_))));
        }
        assert!(!store.deletes.queue().draining);
        // And the next delete starts a drain of its own.
        store
            .put(&keys[0], Bytes::from_static(b"again"), PutMode::Create)
            .await
            .unwrap();
        store.delete(&keys[0]).await.unwrap();
        assert!(matches!(
            store.get(&keys[0]).await,
            Err(StorageError::NotFound(_))
        ));
    }

    /// A delete whose directory another deleter pruned before the fsync makes its rename
    /// durable through the nearest directory still there, instead of failing.
    #[test]
    fn a_pruned_directory_is_synced_through_its_nearest_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let syncs = DirSyncs::default();
        let gone = dir.path().join("wal/00000001");
        sync_dir_or_ancestor(&syncs, dir.path(), &gone).unwrap();
        assert_eq!(
            syncs.runs.load(Ordering::Relaxed),
            3,
            "two missing, then the root"
        );
        fs::create_dir_all(&gone).unwrap();
        sync_dir_or_ancestor(&syncs, dir.path(), &gone).unwrap();
        assert_eq!(syncs.runs.load(Ordering::Relaxed), 4, "there: itself only");
        let outside = tempfile::tempdir().unwrap();
        let missing_root = outside.path().join("no-root");
        assert!(sync_dir_or_ancestor(&syncs, &missing_root, &missing_root.join("a")).is_err());
    }

    /// Two stores on one directory deleting from the same directories: every delete of an
    /// object that was there succeeds, even when the other store prunes the emptied directory
    /// between this one's rename and its fsync.
    #[test]
    fn deletes_racing_a_prune_from_another_store_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let stores = [
            LocalStore::open(dir.path()).unwrap(),
            LocalStore::open(dir.path()).unwrap(),
        ];
        rt.block_on(async {
            for round in 0..200 {
                let keys: Vec<ObjectKey> =
                    (0..4).map(|i| key(&format!("wal/{round}/{i}"))).collect();
                for k in &keys {
                    stores[0]
                        .put(k, Bytes::from_static(b"x"), PutMode::Create)
                        .await
                        .unwrap();
                }
                let deletes: Vec<_> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| {
                        let (store, k) = (stores[i % 2].clone(), k.clone());
                        tokio::spawn(async move { store.delete(&k).await })
                    })
                    .collect();
                for d in deletes {
                    d.await.unwrap().unwrap();
                }
            }
        });
    }

    /// A drain that never ran (or died) answers what was queued with an error and lets the
    /// next delete start a drain, rather than leaving callers waiting for ever.
    #[tokio::test]
    async fn a_drain_that_never_ran_answers_its_queue_and_hands_over() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let k = key("wal/x");
        store
            .put(&k, Bytes::from_static(b"x"), PutMode::Create)
            .await
            .unwrap();
        let (reply, answer) = tokio::sync::oneshot::channel();
        assert!(
            store.deletes.push(store.location(&k), reply),
            "first in leads"
        );
        drop(Draining {
            deletes: Arc::clone(&store.deletes),
            finished: false,
        });
        assert!(answer.await.is_err(), "the queued caller hears back");
        assert!(!store.deletes.queue().draining);
        store.delete(&k).await.unwrap();
        assert!(matches!(
            store.get(&k).await,
            Err(StorageError::NotFound(_))
        ));
    }

    /// A caller that stops waiting for its delete does not stop the batch it joined.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_delete_still_lets_its_batch_finish() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let (a, b) = (key("wal/a"), key("wal/b"));
        for k in [&a, &b] {
            store
                .put(k, Bytes::from_static(b"x"), PutMode::Create)
                .await
                .unwrap();
        }
        store.deletes.queue().draining = true;
        let dropped = {
            let (store, a) = (store.clone(), a.clone());
            tokio::spawn(async move { store.delete(&a).await })
        };
        let kept = {
            let (store, b) = (store.clone(), b.clone());
            tokio::spawn(async move { store.delete(&b).await })
        };
        while store.deletes.queue().queued.len() < 2 {
            tokio::task::yield_now().await;
        }
        dropped.abort();
        assert!(dropped.await.unwrap_err().is_cancelled());
        drain_now(&store).await;
        kept.await.unwrap().unwrap();
        for k in [&a, &b] {
            assert!(matches!(store.get(k).await, Err(StorageError::NotFound(_))));
        }
    }

    #[test]
    fn concurrent_directory_fsyncs_are_shared() {
        let dir = tempfile::tempdir().unwrap();
        let syncs = Arc::new(DirSyncs::default());
        for _ in 0..3 {
            syncs.sync(dir.path()).unwrap();
        }
        assert_eq!(syncs.runs.load(Ordering::Relaxed), 3, "alone, one each");

        // An fsync is running (held here): eight callers arrive meanwhile.
        let lock = || syncs.dirs.lock().unwrap();
        lock().entry(dir.path().to_path_buf()).or_default().running = true;
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let (syncs, path) = (Arc::clone(&syncs), dir.path().to_path_buf());
                std::thread::spawn(move || syncs.sync(&path))
            })
            .collect();
        // Wait (on the condition variable the callers notify through) until all eight have
        // taken a ticket.
        let mut dirs = lock();
        while dirs[dir.path()].requested < 8 {
            dirs = syncs
                .done
                .wait_timeout(dirs, Duration::from_millis(10))
                .unwrap()
                .0;
        }
        assert_eq!(
            syncs.runs.load(Ordering::Relaxed),
            3,
            "nobody ran while one was running"
        );
        // The running fsync ends without covering them (it started before their changes).
        let entry = dirs.get_mut(dir.path()).unwrap();
        entry.running = false;
        drop(dirs);
        syncs.done.notify_all();
        for caller in callers {
            caller.join().unwrap().unwrap();
        }
        assert_eq!(
            syncs.runs.load(Ordering::Relaxed),
            4,
            "one fsync for the eight"
        );
        assert!(lock().is_empty(), "nothing left behind");
    }
}
