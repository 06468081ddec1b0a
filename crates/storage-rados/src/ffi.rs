//! Owned handles over librados' C API, through the `ceph` crate's declarations.
//!
//! The `ceph` crate's safe layer is not used: `connect_to_ceph` connects before any option can be
//! set (so no keyring or timeouts), `config_set` refuses on any handle it created, its
//! `disconnect_from_ceph` followed by `Drop` shuts the cluster down twice, and it has no
//! write-operation API. Everything here is synchronous and blocking: callers run it on a blocking
//! thread. Every `unsafe` block keeps the buffers it hands librados alive until the call that uses
//! them has returned (or, for aio, until its completion has been waited for).

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::ptr;

use ceph::rados as sys;

use crate::config::RadosConfig;

/// A positive errno from librados (it returns them negated).
pub(crate) type Errno = i32;

/// From librados.h: `rados_write_op_create` fails with EEXIST if the object exists.
const LIBRADOS_CREATE_EXCLUSIVE: c_int = 1;

/// Objects up to this size are read in one round trip (stat and read in one operation); larger
/// ones take a second, exact read pinned to the version the first one saw. Kept below glibc's
/// mmap threshold (128 KiB) so the speculative buffer is a cheap heap allocation.
const FIRST_READ: usize = 64 * 1024;

/// How often `read_whole` starts over when a large object keeps changing between its two reads.
const READ_ATTEMPTS: usize = 8;

/// How many `rados_aio_stat` calls are in flight at once while sizing a listing.
const STAT_BATCH: usize = 128;

fn check(ret: c_int) -> Result<c_int, Errno> {
    if ret < 0 {
        Err(-ret)
    } else {
        Ok(ret)
    }
}

fn c_string(value: &str) -> Result<CString, Errno> {
    CString::new(value).map_err(|_| libc::EINVAL)
}

/// A connected cluster handle. librados documents `rados_t` as safe to share between threads.
pub(crate) struct Cluster(sys::rados_t);

// SAFETY: librados' cluster handle is internally synchronised; every method takes `&self` and
// only calls thread-safe librados functions.
unsafe impl Send for Cluster {}
unsafe impl Sync for Cluster {}

/// Which step of connecting failed, for the error message.
#[derive(Debug)]
pub(crate) struct ConnectError {
    pub step: String,
    pub errno: Errno,
}

impl Cluster {
    /// Creates the handle, reads ceph.conf and `CEPH_ARGS`, sets options, connects. Blocks for
    /// up to `client_mount_timeout` when the monitors do not answer.
    pub(crate) fn connect(config: &RadosConfig) -> Result<Self, ConnectError> {
        let fail = |step: &str| {
            let step = step.to_string();
            move |errno| ConnectError { step, errno }
        };
        let name = c_string(&format!("client.{}", config.user)).map_err(fail("client name"))?;
        let cluster_name = c_string("ceph").map_err(fail("cluster name"))?;
        let mut handle: sys::rados_t = ptr::null_mut();
        // SAFETY: out-pointer to a local; the strings outlive the call.
        check(unsafe { sys::rados_create2(&mut handle, cluster_name.as_ptr(), name.as_ptr(), 0) })
            .map_err(fail("rados_create2"))?;
        // From here on, Drop shuts the handle down on every error path.
        let cluster = Self(handle);

        let conf = match &config.conf {
            Some(path) => Some(c_string(path).map_err(fail("conf path"))?),
            None => None,
        };
        let conf_ptr = conf.as_ref().map_or(ptr::null(), |path| path.as_ptr());
        // SAFETY: valid handle; a null path means "search the default locations".
        check(unsafe { sys::rados_conf_read_file(cluster.0, conf_ptr) })
            .map_err(fail("reading ceph.conf"))?;
        // SAFETY: valid handle; null means the CEPH_ARGS variable.
        check(unsafe { sys::rados_conf_parse_env(cluster.0, ptr::null()) })
            .map_err(fail("parsing CEPH_ARGS"))?;
        for (option, value) in config.effective_ceph_options() {
            let c_option = c_string(&option).map_err(fail(&option))?;
            let c_value = c_string(&value).map_err(fail(&option))?;
            // SAFETY: valid handle, strings outlive the call.
            check(unsafe { sys::rados_conf_set(cluster.0, c_option.as_ptr(), c_value.as_ptr()) })
                .map_err(fail(&format!("setting librados option {option}={value}")))?;
        }
        // SAFETY: valid, configured, not yet connected handle.
        check(unsafe { sys::rados_connect(cluster.0) }).map_err(fail("rados_connect"))?;
        Ok(cluster)
    }

    /// An I/O context on `pool`, in `namespace`. The context must be dropped before the cluster.
    pub(crate) fn ioctx(&self, pool: &CStr, namespace: &CStr) -> Result<IoCtx, Errno> {
        let mut io: sys::rados_ioctx_t = ptr::null_mut();
        // SAFETY: connected handle, out-pointer to a local, pool name outlives the call.
        check(unsafe { sys::rados_ioctx_create(self.0, pool.as_ptr(), &mut io) })?;
        let io = IoCtx(io);
        // SAFETY: fresh context used by no other thread yet; librados copies the namespace.
        unsafe { sys::rados_ioctx_set_namespace(io.0, namespace.as_ptr()) };
        Ok(io)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: created by rados_create2 and shut down exactly once, after every IoCtx (the
        // store drops its contexts first).
        unsafe { sys::rados_shutdown(self.0) }
    }
}

/// An I/O context. Not shared: `rados_get_last_version` reports the last operation *of this
/// context*, so each operation checks one out for itself.
pub(crate) struct IoCtx(sys::rados_ioctx_t);

// SAFETY: a context may move between threads; it is only ever used by one thread at a time
// (the store checks contexts out of a pool), so it is not Sync.
unsafe impl Send for IoCtx {}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create, destroyed once, no aio left in flight (every
        // aio issued here is waited for before its function returns).
        unsafe { sys::rados_ioctx_destroy(self.0) }
    }
}

/// What a conditional whole-object write requires.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Condition {
    /// The object must not exist (EEXIST otherwise).
    Absent,
    /// The object must exist at exactly this version (ENOENT, ERANGE or EOVERFLOW otherwise).
    Version(u64),
}

struct ReadOp(sys::rados_read_op_t);

impl ReadOp {
    fn new() -> Result<Self, Errno> {
        // SAFETY: plain constructor; null means out of memory.
        let op = unsafe { sys::rados_create_read_op() };
        if op.is_null() {
            Err(libc::ENOMEM)
        } else {
            Ok(Self(op))
        }
    }
}

impl Drop for ReadOp {
    fn drop(&mut self) {
        // SAFETY: created by rados_create_read_op, released once.
        unsafe { sys::rados_release_read_op(self.0) }
    }
}

struct WriteOp(sys::rados_write_op_t);

impl WriteOp {
    fn new() -> Result<Self, Errno> {
        // SAFETY: plain constructor; null means out of memory.
        let op = unsafe { sys::rados_create_write_op() };
        if op.is_null() {
            Err(libc::ENOMEM)
        } else {
            Ok(Self(op))
        }
    }
}

impl Drop for WriteOp {
    fn drop(&mut self) {
        // SAFETY: created by rados_create_write_op, released once.
        unsafe { sys::rados_release_write_op(self.0) }
    }
}

impl IoCtx {
    fn last_version(&self) -> u64 {
        // SAFETY: valid context, used by this thread only.
        unsafe { sys::rados_get_last_version(self.0) }
    }

    /// Stats and reads `[offset, offset + len)` in one operation: returns the bytes (cut at the
    /// end of the object), the object's size and its version.
    fn stat_and_read(
        &self,
        oid: &CStr,
        offset: u64,
        len: usize,
        extra: impl FnOnce(&ReadOp),
    ) -> Result<(Vec<u8>, u64, u64), Errno> {
        let op = ReadOp::new()?;
        extra(&op);
        let mut size: u64 = 0;
        let mut stat_rval: c_int = 0;
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        let mut bytes_read: libc::size_t = 0;
        let mut read_rval: c_int = 0;
        // SAFETY: every out-pointer points at a local that lives until after operate; the read
        // buffer has `len` bytes of capacity, and librados writes at most `len` bytes to it.
        unsafe {
            sys::rados_read_op_stat(op.0, &mut size, ptr::null_mut(), &mut stat_rval);
            if len > 0 {
                sys::rados_read_op_read(
                    op.0,
                    offset,
                    len,
                    buf.as_mut_ptr().cast::<c_char>(),
                    &mut bytes_read,
                    &mut read_rval,
                );
            }
            check(sys::rados_read_op_operate(op.0, self.0, oid.as_ptr(), 0))?;
        }
        check(stat_rval)?;
        check(read_rval)?;
        if bytes_read > len {
            return Err(libc::EIO);
        }
        // SAFETY: librados initialised the first `bytes_read` bytes, within capacity.
        unsafe { buf.set_len(bytes_read) };
        Ok((buf, size, self.last_version()))
    }

    /// The whole object and its version.
    pub(crate) fn read_whole(&self, oid: &CStr) -> Result<(Vec<u8>, u64), Errno> {
        for _ in 0..READ_ATTEMPTS {
            let (first, size, version) = self.stat_and_read(oid, 0, FIRST_READ, |_| {})?;
            let size = usize::try_from(size).map_err(|_| libc::EFBIG)?;
            if size <= FIRST_READ {
                if first.len() != size {
                    return Err(libc::EIO);
                }
                let mut first = first;
                // The caller may cache these bytes for long: do not let a 100-byte manifest
                // pin a 64 KiB allocation.
                if first.capacity() > 2 * first.len() + 1024 {
                    first.shrink_to_fit();
                }
                return Ok((first, version));
            }
            // Bigger than the first read: read it all, but only if it is still the version
            // whose size we know; otherwise start over.
            let pinned = self.stat_and_read(oid, 0, size, |op| {
                // SAFETY: valid, unexecuted operation.
                unsafe { sys::rados_read_op_assert_version(op.0, version) }
            });
            match pinned {
                Ok((data, pinned_size, pinned_version)) if pinned_size as usize == data.len() => {
                    return Ok((data, pinned_version))
                }
                Ok(_) => return Err(libc::EIO),
                Err(libc::ERANGE) | Err(libc::EOVERFLOW) => continue,
                Err(errno) => return Err(errno),
            }
        }
        // A large object rewritten faster than it can be read: let the caller back off.
        Err(libc::EBUSY)
    }

    /// `[start, start + len)` cut at the end, and the object's size.
    pub(crate) fn read_range(
        &self,
        oid: &CStr,
        start: u64,
        len: usize,
    ) -> Result<(Vec<u8>, u64), Errno> {
        let (data, size, _) = self.stat_and_read(oid, start, len, |_| {})?;
        Ok((data, size))
    }

    /// Writes the whole object if `condition` holds, atomically; returns the new version.
    pub(crate) fn write_full(
        &self,
        oid: &CStr,
        data: &[u8],
        condition: Condition,
    ) -> Result<u64, Errno> {
        let op = WriteOp::new()?;
        // SAFETY: valid operation; `data` outlives operate, which copies it into the request.
        unsafe {
            match condition {
                Condition::Absent => {
                    sys::rados_write_op_create(op.0, LIBRADOS_CREATE_EXCLUSIVE, ptr::null())
                }
                Condition::Version(version) => sys::rados_write_op_assert_version(op.0, version),
            }
            sys::rados_write_op_write_full(op.0, data.as_ptr().cast::<c_char>(), data.len());
            check(sys::rados_write_op_operate(
                op.0,
                self.0,
                oid.as_ptr(),
                ptr::null_mut(),
                0,
            ))?;
        }
        Ok(self.last_version())
    }

    pub(crate) fn remove(&self, oid: &CStr) -> Result<(), Errno> {
        // SAFETY: valid context, oid outlives the call.
        check(unsafe { sys::rados_remove(self.0, oid.as_ptr()) }).map(|_| ())
    }

    /// Every object name in this context's namespace, in no particular order. The OSDs walk
    /// every placement group of the pool to answer: the cost grows with the pool, not the prefix.
    pub(crate) fn list_names(
        &self,
        mut keep: impl FnMut(&str) -> bool,
    ) -> Result<Vec<String>, Errno> {
        let mut ctx: sys::rados_list_ctx_t = ptr::null_mut();
        // SAFETY: valid context, out-pointer to a local.
        check(unsafe { sys::rados_nobjects_list_open(self.0, &mut ctx) })?;
        let listing = ListCtx(ctx);
        let mut names = Vec::new();
        loop {
            let mut entry: *const c_char = ptr::null();
            // SAFETY: the binding declares `entry` one indirection too deep; librados writes a
            // `const char*` into the pointed-at slot, which is `entry`. Key and namespace are
            // optional and not asked for. The string stays valid until the next call.
            let ret = unsafe {
                sys::rados_nobjects_list_next(
                    listing.0,
                    (&mut entry as *mut *const c_char).cast::<*mut *const c_char>(),
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            };
            if ret == -libc::ENOENT {
                break;
            }
            check(ret)?;
            if entry.is_null() {
                return Err(libc::EIO);
            }
            // SAFETY: non-null, NUL-terminated, valid until the next list call.
            let name = unsafe { CStr::from_ptr(entry) };
            if let Ok(name) = name.to_str() {
                if keep(name) {
                    names.push(name.to_string());
                }
            }
        }
        Ok(names)
    }

    /// Sizes of `names`, pipelined with aio; `None` for an object deleted since it was listed.
    pub(crate) fn stat_many(&self, names: &[CString]) -> Result<Vec<Option<u64>>, Errno> {
        let mut sizes = Vec::with_capacity(names.len());
        for batch in names.chunks(STAT_BATCH) {
            // Fixed-size output slots: they must not move while their aio is in flight.
            let mut slots: Vec<(u64, libc::time_t)> = vec![(0, 0); batch.len()];
            let mut completions: Vec<sys::rados_completion_t> = Vec::with_capacity(batch.len());
            let mut issue_error = None;
            for (name, slot) in batch.iter().zip(slots.iter_mut()) {
                let mut completion: sys::rados_completion_t = ptr::null_mut();
                // SAFETY: no callbacks; out-pointer to a local.
                let created = check(unsafe {
                    sys::rados_aio_create_completion(ptr::null_mut(), None, None, &mut completion)
                });
                if let Err(errno) = created {
                    issue_error = Some(errno);
                    break;
                }
                // SAFETY: the name and the slot outlive the wait below; the slot's address is
                // stable because `slots` is never resized.
                let issued = check(unsafe {
                    sys::rados_aio_stat(self.0, name.as_ptr(), completion, &mut slot.0, &mut slot.1)
                });
                if let Err(errno) = issued {
                    // SAFETY: never issued, so nothing refers to it.
                    unsafe { sys::rados_aio_release(completion) };
                    issue_error = Some(errno);
                    break;
                }
                completions.push(completion);
            }
            // Wait for everything issued before looking at any result or returning, so no
            // in-flight operation outlives the buffers it writes to.
            let mut results = Vec::with_capacity(completions.len());
            for completion in completions {
                // SAFETY: issued completion, waited for and released exactly once.
                let ret = unsafe {
                    sys::rados_aio_wait_for_complete(completion);
                    let ret = sys::rados_aio_get_return_value(completion);
                    sys::rados_aio_release(completion);
                    ret
                };
                results.push(ret);
            }
            if let Some(errno) = issue_error {
                return Err(errno);
            }
            for (ret, slot) in results.into_iter().zip(slots) {
                match check(ret) {
                    Ok(_) => sizes.push(Some(slot.0)),
                    Err(libc::ENOENT) => sizes.push(None),
                    Err(errno) => return Err(errno),
                }
            }
        }
        Ok(sizes)
    }
}

struct ListCtx(sys::rados_list_ctx_t);

impl Drop for ListCtx {
    fn drop(&mut self) {
        // SAFETY: opened by rados_nobjects_list_open, closed once.
        unsafe { sys::rados_nobjects_list_close(self.0) }
    }
}

/// The C library's description of an errno, for messages.
pub(crate) fn errno_text(errno: Errno) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}
