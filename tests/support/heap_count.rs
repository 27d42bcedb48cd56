//! A global allocator that counts the heap operations of the threads that
//! opted in (`counted`) and forwards every call to the system's: what the
//! zero-allocation tests measure the data path with. Each test binary that
//! includes it installs it:
//! `#[global_allocator] static GLOBAL: heap_count::Counting = heap_count::Counting;`

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts the heap operations of threads that opted in, then forwards to
/// the system allocator.
pub struct Counting;

pub static HEAP_OPS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set while this thread runs measured code.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    // try_with: the allocator also runs while thread-locals are torn down.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        HEAP_OPS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// GlobalAlloc contract; counting touches only an atomic and a const-
// initialized thread-local (neither allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` with this thread's heap operations counted.
pub fn counted<T>(f: impl FnOnce() -> T) -> T {
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    r
}
