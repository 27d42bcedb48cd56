//! The C library's return conventions, converted in one place.
//!
//! - errno-returning calls (post, modify, query, destroy): 0 or an errno value;
//! - NULL-plus-errno calls (create, alloc, reg, open): a pointer or NULL;
//! - count calls (poll, query_gid_table): a count or a negative value.
#![allow(unsafe_code)]

use core::ptr::NonNull;

use crate::error::Error;

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to this thread's
    // errno for the whole life of the thread (glibc, musl).
    unsafe { *libc::__errno_location() }
}

/// A call that returns 0 on success or an errno value. Some providers
/// return -1 and set `errno` instead; both are handled.
#[inline]
pub(crate) fn check_rc(call: &'static str, rc: core::ffi::c_int) -> Result<(), Error> {
    match rc {
        0 => Ok(()),
        -1 => Err(Error::os(call, errno())),
        e if e < 0 => Err(Error::os(call, -e)),
        e => Err(Error::os(call, e)),
    }
}

/// A call that returns a pointer, or NULL with `errno` set.
#[inline]
pub(crate) fn check_ptr<T>(call: &'static str, ptr: *mut T) -> Result<NonNull<T>, Error> {
    NonNull::new(ptr).ok_or_else(|| {
        let e = errno();
        // Some failure paths return NULL without setting errno.
        Error::os(call, if e == 0 { libc::EINVAL } else { e })
    })
}

/// A call that returns a count, or a negative value on failure (a negative
/// errno, or -1 with `errno` set).
#[inline]
pub(crate) fn check_count(call: &'static str, n: isize) -> Result<usize, Error> {
    if n >= 0 {
        Ok(n as usize)
    } else if n == -1 {
        Err(Error::os(call, errno()))
    } else {
        Err(Error::os(call, (-n) as i32))
    }
}

/// Waits until `fd` is readable or `timeout_ms` passes (`poll(2)`);
/// `Ok(false)` on timeout or interruption.
pub(crate) fn wait_readable(
    call: &'static str,
    fd: core::ffi::c_int,
    timeout_ms: i32,
) -> Result<bool, Error> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    match ready {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ if errno() == libc::EINTR => Ok(false),
        _ => Err(Error::os(call, errno())),
    }
}
