//! A monotonic clock and deadlines without `std` (for polls that must not
//! spin forever on a dead peer), and random numbers for PSNs.
#![allow(unsafe_code)]

use core::time::Duration;

/// Nanoseconds of `CLOCK_MONOTONIC`.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A point in monotonic time after which a wait gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline(u64);

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline(now_ns().saturating_add(timeout.as_nanos().min(u64::MAX as u128) as u64))
    }

    /// A deadline that never passes.
    pub const NEVER: Deadline = Deadline(u64::MAX);

    /// True once the deadline is behind us.
    #[inline]
    pub fn passed(&self) -> bool {
        self.0 != u64::MAX && now_ns() >= self.0
    }

    /// Time left (zero once passed).
    pub fn remaining(&self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(now_ns()))
    }
}

/// A random `u32` from the kernel (`getrandom`), or, if that fails, a mix
/// of the clock and an address: PSNs need to differ, not to be secret.
pub fn random_u32() -> u32 {
    let mut buf = [0u8; 4];
    // SAFETY: `buf` is valid for 4 bytes of writes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == 4 {
        u32::from_ne_bytes(buf)
    } else {
        let x = now_ns() ^ (&buf as *const _ as u64).rotate_left(32);
        (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) as u32
    }
}
