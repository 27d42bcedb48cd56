//! The count of objects whose destroy failed, and which were leaked with
//! whatever the device may still reach through them.

use core::sync::atomic::{AtomicUsize, Ordering};

static LEAKED: AtomicUsize = AtomicUsize::new(0);

/// Objects whose destroy or deregistration failed since the process
/// started: each one, and the memory the device may still reach through
/// it, was leaked rather than freed.
pub fn leaked_objects() -> usize {
    LEAKED.load(Ordering::Relaxed)
}

/// Counts one leaked object (a failed destroy).
pub(crate) fn count_leak() {
    LEAKED.fetch_add(1, Ordering::Relaxed);
}
