//! The operating system calls the crate makes besides verbs: the monotonic
//! clock, random numbers, waiting on a descriptor, interface names.

use crate::error::{Error, Site};

use super::ret::errno;

/// Nanoseconds of `CLOCK_MONOTONIC`.
#[inline]
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Four random bytes from the kernel (`getrandom`), or `None`.
pub(crate) fn getrandom_u32() -> Option<u32> {
    let mut buf = [0u8; 4];
    // SAFETY: `buf` is valid for 4 bytes of writes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    (n == 4).then(|| u32::from_ne_bytes(buf))
}

/// Waits until `fd` is readable or `timeout_ms` passes (`poll(2)`);
/// `Ok(false)` on timeout or interruption.
pub(crate) fn wait_readable(site: &'static Site, fd: i32, timeout_ms: i32) -> Result<bool, Error> {
    wait_readable_any(site, &[fd], timeout_ms)
}

/// Waits until one of `fds` (at most 4) is readable or `timeout_ms`
/// passes (`poll(2)`); `Ok(false)` on timeout or interruption.
pub(crate) fn wait_readable_any(
    site: &'static Site,
    fds: &[i32],
    timeout_ms: i32,
) -> Result<bool, Error> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 4];
    let n = fds.len().min(pfds.len());
    for (p, &fd) in pfds.iter_mut().zip(&fds[..n]) {
        p.fd = fd;
    }
    // SAFETY: `n` valid pollfds (of 4) for the duration of the call.
    let ready = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
    match ready {
        r if r > 0 => Ok(true),
        0 => Ok(false),
        _ if errno() == libc::EINTR => Ok(false),
        _ => Err(Error::os(site, errno())),
    }
}

/// Makes `fd` non-blocking (reads then return EAGAIN instead of sleeping).
pub(crate) fn set_nonblocking(site: &'static Site, fd: i32) -> Result<(), Error> {
    // SAFETY: F_GETFL/F_SETFL only read and change the descriptor's flags;
    // an invalid descriptor is an error return, not undefined behaviour.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(Error::os(site, errno()))
    }
}

/// The name of network interface `ifindex` (e.g. `eth0`), if it exists.
pub(crate) fn if_name(ifindex: u32) -> Option<alloc::string::String> {
    let mut buf = [0 as core::ffi::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    let bytes: alloc::vec::Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Some(alloc::string::String::from_utf8_lossy(&bytes).into_owned())
}

/// The system's page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}
