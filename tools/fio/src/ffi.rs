//! The C interface `shim.c` calls: plain integers and pointers, no fio structure. Errors come
//! back as one line of text in the caller's buffer (fio prints it); a panic is caught and
//! reported the same way, never unwound into fio.

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use usnvme_engine::fabric::address::check_nqn;
use usnvme_engine::fabric::pdu::Digests;
use usnvme_engine::transport::ReconnectPolicy;
use usnvme_engine::{BlockDevice, Op};

use crate::job::{self, Done, Job, Queued};
use crate::registry;

/// A job's files, opened at fio's `setup`.
#[derive(Debug)]
pub struct Files(Vec<Arc<dyn BlockDevice>>);

/// Runs `f`; its error (or a panic) goes to `err` and gives `on_error`.
fn guarded<T>(err: Option<&mut [u8]>, on_error: T, f: impl FnOnce() -> Result<T, String>) -> T {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => return v,
        Ok(Err(e)) => e,
        Err(_) => "internal error (a panic): please report it with the job file".to_string(),
    };
    write_str(err, &message);
    on_error
}

/// The C buffer `buf` of `len` bytes (None when NULL or empty).
///
/// # Safety
/// `buf` is NULL or has `len` writable bytes, not otherwise used while the slice lives.
unsafe fn c_buffer<'a>(buf: *mut c_char, len: usize) -> Option<&'a mut [u8]> {
    if buf.is_null() || len == 0 {
        return None;
    }
    // SAFETY: per this function's contract.
    Some(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// Copies `s` into a C string buffer, cut to fit, NUL-terminated.
fn write_str(out: Option<&mut [u8]>, s: &str) {
    let Some(out) = out else {
        return;
    };
    let n = s.len().min(out.len() - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out[n] = 0;
}

/// The engine's options of a job (`struct usnvme_remote_options` in shim.c, filled from fio's
/// `hostnqn=`, `hdr_digest=`, … as fio parsed them within their ranges).
#[repr(C)]
#[derive(Debug)]
pub struct RemoteOptions {
    /// NUL-terminated; NULL or empty: this machine's host NQN.
    pub hostnqn: *const c_char,
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Seconds; 0: no Keep Alive.
    pub keep_alive_tmo: u32,
    /// Seconds.
    pub reconnect_delay: u32,
    /// Seconds; 0: give up at once, -1: never.
    pub ctrl_loss_tmo: i32,
}

impl RemoteOptions {
    /// How the job's remote subsystems are reached; a host NQN that is not one is an error.
    ///
    /// # Safety
    /// `hostnqn` is NULL or a NUL-terminated string.
    unsafe fn host(&self) -> Result<registry::RemoteHost, String> {
        let nqn = if self.hostnqn.is_null() {
            None
        } else {
            // SAFETY: NUL-terminated (this function's contract).
            let nqn = unsafe { CStr::from_ptr(self.hostnqn) }.to_string_lossy();
            Some(nqn.into_owned()).filter(|n| !n.is_empty())
        };
        if let Some(nqn) = &nqn {
            check_nqn(nqn).map_err(|e| {
                format!("hostnqn={nqn}: {e} (example: nqn.2014-08.org.nvmexpress:uuid:UUID)")
            })?;
        }
        Ok(registry::RemoteHost {
            nqn,
            digests: Digests {
                header: self.hdr_digest,
                data: self.data_digest,
            },
            keep_alive_tmo_s: self.keep_alive_tmo,
            reconnect: ReconnectPolicy::from_secs(self.reconnect_delay, self.ctrl_loss_tmo),
        })
    }
}

/// Opens the files `names[..count]` of a job. `bs[..bs_count]` are the job's block sizes (fio's
/// bs, each direction's smallest and largest; 0 where unused): each must be a multiple of every
/// file's block size. Remote subsystems are reached as `remote` says (NULL: as Linux's host
/// by default). Fills `sizes[i]` with file i's size in bytes. NULL on error.
///
/// # Safety
/// `names` holds `count` NUL-terminated strings; `sizes` has room for `count` values; `bs`
/// holds `bs_count` values; `remote` is NULL or valid as [`RemoteOptions::host`] says; `err`
/// has `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_files_open(
    names: *const *const c_char,
    count: usize,
    bs: *const u64,
    bs_count: usize,
    remote: *const RemoteOptions,
    sizes: *mut u64,
    err: *mut c_char,
    err_len: usize,
) -> *mut Files {
    // SAFETY: `err` has `err_len` bytes (the contract).
    let err = unsafe { c_buffer(err, err_len) };
    guarded(err, std::ptr::null_mut(), || {
        // SAFETY: per this function's contract.
        let names = unsafe { std::slice::from_raw_parts(names, count) };
        let names: Vec<String> = names
            .iter()
            // SAFETY: each is a NUL-terminated string (the contract).
            .map(|&n| unsafe { CStr::from_ptr(n) }.to_string_lossy().into_owned())
            .collect();
        // SAFETY: per this function's contract.
        let bs = unsafe { std::slice::from_raw_parts(bs, bs_count) };
        // SAFETY: NULL or valid (the contract).
        let host = match unsafe { remote.as_ref() } {
            // SAFETY: its string is NULL or NUL-terminated (the contract).
            Some(remote) => unsafe { remote.host() }?,
            None => registry::RemoteHost::default(),
        };
        let files = Files(registry::open(&names, &host)?);
        for d in &files.0 {
            let info = d.info();
            let block = u64::from(info.block_size.max(1));
            if let Some(b) = bs.iter().find(|&&b| b % block != 0) {
                return Err(format!(
                    "bs={b} is not a multiple of {}'s {block}-byte blocks",
                    info.name
                ));
            }
        }
        // SAFETY: per this function's contract.
        let sizes = unsafe { std::slice::from_raw_parts_mut(sizes, count) };
        for (size, d) in sizes.iter_mut().zip(&files.0) {
            *size = d.info().size_bytes;
        }
        Ok(Box::into_raw(Box::new(files)))
    })
}

/// Dropping a job's files ends the job's hold on the controllers.
impl Drop for Files {
    fn drop(&mut self) {
        self.0.clear();
        registry::release();
    }
}

/// Closes what [`usnvme_fio_files_open`] opened (the last job shuts the controllers down).
///
/// # Safety
/// `files` came from `usnvme_fio_files_open` and is not used again (NULL is allowed).
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_files_close(files: *mut Files) {
    if !files.is_null() {
        // SAFETY: it came from Box::into_raw and is dropped once (the contract).
        let files = unsafe { Box::from_raw(files) };
        let _ = catch_unwind(AssertUnwindSafe(|| drop(files)));
    }
}

/// A job's queues on `files`, each holding `depth` I/Os of up to `max_io` bytes: call it on the
/// job's thread (its CPU chooses the memory's node). `paced`: the job sleeps between I/Os
/// (`rate`, `thinktime`), so its doorbells ring at commit. NULL on error.
///
/// # Safety
/// `files` came from `usnvme_fio_files_open`; `err` has `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_job_new(
    files: *const Files,
    depth: u32,
    max_io: u64,
    paced: bool,
    err: *mut c_char,
    err_len: usize,
) -> *mut Job {
    // SAFETY: `err` has `err_len` bytes (the contract).
    let err = unsafe { c_buffer(err, err_len) };
    guarded(err, std::ptr::null_mut(), || {
        // SAFETY: a live Files (the contract).
        let files = unsafe { files.as_ref() }.ok_or("the job's files were not opened")?;
        let job = Job::new(&files.0, depth, max_io, paced)?;
        Ok(Box::into_raw(Box::new(job)))
    })
}

/// Ends a job: its queues are deleted, its buffers freed.
///
/// # Safety
/// `job` came from `usnvme_fio_job_new` and is not used again (NULL is allowed).
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_job_free(job: *mut Job) {
    if !job.is_null() {
        // SAFETY: it came from Box::into_raw and is dropped once (the contract).
        let job = unsafe { Box::from_raw(job) };
        let _ = catch_unwind(AssertUnwindSafe(|| drop(job)));
    }
}

/// fio's I/O buffers for the job: `len` bytes in DMA memory, their start in `*start`. 0, or -1
/// with the reason in `err`.
///
/// # Safety
/// `job` is live and used by this thread only; `start` is writable; `err` has `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_alloc_buffers(
    job: *mut Job,
    len: usize,
    start: *mut *mut u8,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    // SAFETY: `err` has `err_len` bytes (the contract).
    let err = unsafe { c_buffer(err, err_len) };
    guarded(err, -1, || {
        // SAFETY: live and this thread's (the contract).
        let job = unsafe { job.as_mut() }.ok_or("the job was not set up")?;
        let ptr = job.alloc_buffers(len)?;
        // SAFETY: writable (the contract).
        unsafe { *start = ptr };
        Ok(0)
    })
}

/// Frees the job's I/O buffers.
///
/// # Safety
/// `job` is live (or NULL) and used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_free_buffers(job: *mut Job) {
    // SAFETY: live and this thread's, or NULL (the contract).
    if let Some(job) = unsafe { job.as_mut() } {
        job.free_buffers();
    }
}

/// What [`usnvme_fio_queue`] does, by fio's data direction.
pub const OP_READ: u32 = 0;
pub const OP_WRITE: u32 = 1;
pub const OP_TRIM: u32 = 2;
pub const OP_FLUSH: u32 = 3;

/// Queues I/O `token`: `op` on file `file`, `len` bytes at `offset`, through `buf` (one of the
/// job's buffers). 0 queued, 1 busy (collect completions first), -1 refused (why:
/// [`usnvme_fio_failure`]).
///
/// # Safety
/// `job` is live and used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_queue(
    job: *mut Job,
    file: u32,
    op: u32,
    offset: u64,
    len: u64,
    buf: *const u8,
    token: u64,
) -> c_int {
    // SAFETY: live and this thread's (the contract).
    let Some(job) = (unsafe { job.as_mut() }) else {
        return -1;
    };
    let op = match op {
        OP_READ => Op::Read,
        OP_WRITE => Op::Write,
        OP_TRIM => Op::Deallocate,
        OP_FLUSH => Op::Flush,
        _ => return -1,
    };
    match job.queue(file as usize, op, offset, len, buf, token) {
        Queued::Queued => 0,
        Queued::Busy => 1,
        Queued::Refused => -1,
    }
}

/// Rings the doorbells of what was queued.
///
/// # Safety
/// `job` is live (or NULL) and used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_commit(job: *mut Job) {
    // SAFETY: live and this thread's, or NULL (the contract).
    if let Some(job) = unsafe { job.as_mut() } {
        job.commit();
    }
}

/// Collects at least `min` finished I/Os (unless `timeout_ns`, when not negative, passes
/// first) and hands up to `max` of them in `*events` (valid until the next call); returns how
/// many.
///
/// # Safety
/// `job` is live and used by this thread only; `events` is writable.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_reap(
    job: *mut Job,
    min: u32,
    max: u32,
    timeout_ns: i64,
    events: *mut *const Done,
) -> c_int {
    // SAFETY: live and this thread's (the contract).
    let Some(job) = (unsafe { job.as_mut() }) else {
        return -1;
    };
    let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
    let done = job.reap(min as usize, max as usize, timeout);
    // SAFETY: writable (the contract).
    unsafe { *events = done.as_ptr() };
    done.len() as c_int
}

/// Why the last I/O that failed on this thread failed, into `buf` (`len` bytes).
///
/// # Safety
/// `buf` has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnvme_fio_failure(buf: *mut c_char, len: usize) {
    // SAFETY: `buf` has `len` bytes (the contract).
    let out = unsafe { c_buffer(buf, len) };
    write_str(out, &job::last_failure());
}

/// fio's entry point (the engine's `struct ioengine_ops`), from the shim, which refuses a fio of
/// another version than its headers'. Only in the engine `cargo xtask fio-engine` builds.
#[cfg(usnvme_fio_shim)]
mod entry {
    use std::ffi::c_void;

    extern "C" {
        fn usnvme_fio_shim_get_ioengine(ops: *mut *mut c_void);
    }

    /// # Safety
    /// `ops` is writable (fio passes the address of its pointer).
    #[no_mangle]
    pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
        // SAFETY: the shim writes one pointer through `ops`, which the caller made writable.
        unsafe { usnvme_fio_shim_get_ioengine(ops) }
    }
}
