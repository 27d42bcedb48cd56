//! The C library's return conventions, converted in one place.
//!
//! - errno-returning calls (post, modify, query, destroy): 0 or an errno
//!   value (some providers return -1 and set `errno`);
//! - NULL-plus-errno calls (create, alloc, reg, open): a pointer or NULL;
//! - count calls (poll, query_gid_table): a count or a negative value.

use core::ptr::NonNull;

use crate::error::{Error, Site};

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to this thread's
    // errno for the whole life of the thread (glibc, musl).
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno` to 0, before a call that may fail
/// without setting it.
#[cfg(feature = "rdmacm")]
pub(crate) fn clear_errno() {
    // SAFETY: as in `errno`; writing this thread's errno is what it is for.
    unsafe { *libc::__errno_location() = 0 };
}

/// A call that returns 0 on success or an errno value.
#[inline]
pub(crate) fn check_rc(site: &'static Site, rc: core::ffi::c_int) -> Result<(), Error> {
    match rc {
        0 => Ok(()),
        rc => Err(rc_error(site, rc)),
    }
}

#[cold]
fn rc_error(site: &'static Site, rc: core::ffi::c_int) -> Error {
    match rc {
        -1 => Error::os(site, errno()),
        e if e < 0 => Error::os(site, e.saturating_neg()),
        e => Error::os(site, e),
    }
}

/// A call that returns a pointer, or NULL with `errno` set.
#[inline]
pub(crate) fn check_ptr<T>(site: &'static Site, ptr: *mut T) -> Result<NonNull<T>, Error> {
    NonNull::new(ptr).ok_or_else(|| {
        let e = errno();
        // Some failure paths return NULL without setting errno.
        Error::os(site, if e == 0 { libc::EINVAL } else { e })
    })
}

/// A call that returns a count, or a negative value on failure (a negative
/// errno, or -1 with `errno` set).
#[inline]
pub(crate) fn check_count(site: &'static Site, n: isize) -> Result<usize, Error> {
    if n >= 0 {
        Ok(n as usize)
    } else if n == -1 {
        Err(Error::os(site, errno()))
    } else {
        Err(Error::os(
            site,
            n.saturating_neg().min(i32::MAX as isize) as i32,
        ))
    }
}

/// A refused post: the error, and how many requests of the chain (a
/// prefix) the provider took before the one it refused.
#[derive(Debug)]
pub struct PostFailed {
    pub(crate) error: Error,
    pub(crate) posted: usize,
}

/// Links a chain's `next` pointers within the slice (the last one NULL).
#[inline(always)]
pub(crate) fn link<W>(wrs: &mut [W], set: impl Fn(&mut W, *mut W)) {
    let base = wrs.as_mut_ptr();
    let n = wrs.len();
    for (i, w) in wrs.iter_mut().enumerate() {
        let next = if i + 1 < n {
            base.wrapping_add(i + 1)
        } else {
            core::ptr::null_mut()
        };
        set(w, next);
    }
}

/// The error of a refused post and how many requests before `bad` were
/// taken. In line only to see a chain of one, which took nothing before
/// it: `first` then need not live across the call.
#[inline(always)]
pub(crate) fn refused<W>(
    site: &'static crate::error::Site,
    rc: i32,
    first: *mut W,
    bad: *mut W,
    len: usize,
) -> PostFailed {
    let posted = if len > 1 {
        taken_before(first, bad, len)
    } else {
        0
    };
    PostFailed {
        error: post_error(site, rc),
        posted,
    }
}

/// How many requests of the chain of `len` at `first` come before `bad`
/// (NULL: none).
#[cold]
fn taken_before<W>(first: *mut W, bad: *mut W, len: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    ((bad as usize).wrapping_sub(first as usize) / core::mem::size_of::<W>()).min(len)
}

/// A refused post's error (`EIO` for a refusal that says 0).
#[cold]
fn post_error(site: &'static crate::error::Site, rc: i32) -> Error {
    match check_rc(site, rc) {
        Err(e) => e,
        Ok(()) => Error::os(site, libc::EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_convention_names_the_errno() {
        let site = crate::error::site!("call");
        assert!(check_rc(site, 0).is_ok());
        assert_eq!(
            check_rc(site, libc::EINVAL).unwrap_err().errno(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            check_rc(site, -libc::EBUSY).unwrap_err().errno(),
            Some(libc::EBUSY)
        );
        assert_eq!(check_count(site, 3), Ok(3));
        assert_eq!(
            check_count(site, -(libc::ENOMEM as isize))
                .unwrap_err()
                .errno(),
            Some(libc::ENOMEM)
        );
        assert_eq!(
            check_count(site, isize::MIN).unwrap_err().errno(),
            Some(i32::MAX)
        );
        let mut x = 0u8;
        assert!(check_ptr(site, &mut x as *mut u8).is_ok());
    }
}
