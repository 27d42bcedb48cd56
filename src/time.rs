//! The one deadline type (a point on the monotonic clock, `no_std`), and
//! random numbers for PSNs.

use core::time::Duration;

use crate::raw::os::{getrandom_u32, now_ns};

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

    /// The earlier of two deadlines (a step's bound within a total bound).
    pub fn min(self, other: Deadline) -> Deadline {
        Ord::min(self, other)
    }

    /// True once the deadline is behind us.
    #[inline]
    pub fn passed(&self) -> bool {
        self.0 != u64::MAX && now_ns() >= self.0
    }

    /// Time left (zero once passed; `Duration::MAX` for [`Deadline::NEVER`]).
    pub fn remaining(&self) -> Duration {
        if self.0 == u64::MAX {
            return Duration::MAX;
        }
        Duration::from_nanos(self.0.saturating_sub(now_ns()))
    }

    /// Milliseconds left, as `poll(2)` and librdmacm take a timeout: 0
    /// once passed, at most `i32::MAX` (a wait in slices clamps further).
    pub(crate) fn remaining_ms(&self) -> i32 {
        self.remaining().as_millis().min(i32::MAX as u128) as i32
    }
}

/// A random `u32` from the kernel, or, if that fails, a mix of the clock
/// and an address: PSNs need to differ, not to be secret.
pub fn random_u32() -> u32 {
    getrandom_u32().unwrap_or_else(|| {
        let probe = 0u8;
        let x = now_ns() ^ (&probe as *const u8 as u64).rotate_left(32);
        (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) as u32
    })
}
