//! A lock-free stack of freed buffer handles: any thread pushes (a buffer's
//! drop), the arena's owner takes everything at once (its next allocation).
//!
//! Links live in a fixed table indexed by the handle's allocator slot, which
//! is unique among live buffers, so a push never allocates. Taking the whole
//! list with one `swap` means there is no pop, hence no ABA problem.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

const NIL: u32 = u32::MAX;

pub(crate) struct ReturnStack {
    head: AtomicU32,
    /// Per slot: the next slot in the stack.
    next: Box<[AtomicU32]>,
    /// Per slot: the full handle (slot + generation) to free.
    handle: Box<[AtomicU32]>,
}

impl ReturnStack {
    pub(crate) fn new(slots: usize) -> ReturnStack {
        let table = || {
            (0..slots)
                .map(|_| AtomicU32::new(NIL))
                .collect::<Vec<_>>()
                .into_boxed_slice()
        };
        ReturnStack {
            head: AtomicU32::new(NIL),
            next: table(),
            handle: table(),
        }
    }

    /// Pushes a freed handle. Lock-free, allocation-free.
    #[inline]
    pub(crate) fn push(&self, handle: u32, slot: u32) {
        let i = slot as usize;
        self.handle[i].store(handle, Ordering::Relaxed);
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            self.next[i].store(head, Ordering::Relaxed);
            // Release: the stores above are visible to whoever takes the list.
            match self
                .head
                .compare_exchange_weak(head, slot, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Takes every pushed handle and passes each to `free`.
    #[inline]
    pub(crate) fn drain(&self, mut free: impl FnMut(u32)) {
        if self.head.load(Ordering::Relaxed) == NIL {
            return;
        }
        let mut cur = self.head.swap(NIL, Ordering::Acquire);
        while cur != NIL {
            let i = cur as usize;
            let handle = self.handle[i].load(Ordering::Relaxed);
            cur = self.next[i].load(Ordering::Relaxed);
            free(handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_from_many_threads_are_all_drained_once() {
        extern crate std;
        let stack = std::sync::Arc::new(ReturnStack::new(4000));
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let s = stack.clone();
                std::thread::spawn(move || {
                    (0..1000u32).for_each(|i| s.push(100_000 + t * 1000 + i, t * 1000 + i))
                })
            })
            .collect();
        let mut seen = Vec::new();
        for t in threads {
            t.join().unwrap();
            stack.drain(|h| seen.push(h));
        }
        stack.drain(|h| seen.push(h));
        seen.sort_unstable();
        assert_eq!(seen, (0..4000).map(|i| 100_000 + i).collect::<Vec<_>>());
    }
}
