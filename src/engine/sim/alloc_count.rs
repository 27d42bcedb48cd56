//! Counts heap allocations made while the engine's data path runs (post
//! and poll), excluding the simulated device's and the caller's callback:
//! the data path must allocate nothing.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;

struct Counting;

std::thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// thread-locals touched are const-initialized and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ON.try_with(|on| {
            if on.get() {
                COUNT.with(|c| c.set(c.get() + 1));
            }
        });
        // SAFETY: the caller's contract, forwarded.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` (an engine call) and fails if it allocated.
pub(crate) fn counted<T>(f: impl FnOnce() -> T) -> T {
    let before = COUNT.with(Cell::get);
    let was = ON.with(|on| on.replace(true));
    let out = f();
    ON.with(|on| on.set(was));
    let made = COUNT.with(Cell::get) - before;
    assert_eq!(made, 0, "the engine's data path allocated {made} times");
    out
}

/// Runs `f` (the device's or the caller's code) without counting.
pub(crate) fn uncounted<T>(f: impl FnOnce() -> T) -> T {
    let was = ON.with(|on| on.replace(false));
    let out = f();
    ON.with(|on| on.set(was));
    out
}
