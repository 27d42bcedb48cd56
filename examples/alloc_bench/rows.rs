//! The rows of `alloc_bench`: each allocator behind the one interface the
//! timed loop calls.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};

use verbs::memory::{ArenaModel, ModelBuf};
#[cfg(feature = "std")]
use verbs::tlsf::SharedTlsf;
use verbs::tlsf::Tlsf;
use verbs::{Arena, ArenaBuf};

/// The operations the benchmark needs from an allocator. Every row's
/// implementation is inlined into the timed loop, as a direct call in the
/// caller's code would be.
pub(crate) trait Bench {
    type Token;
    fn alloc(&mut self, layout: Layout) -> Self::Token;
    fn free(&mut self, token: Self::Token, layout: Layout);
    /// A line about the allocator's state after the measured steps.
    fn note(&mut self) -> Option<String> {
        None
    }
}

impl Bench for Tlsf {
    type Token = u32;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> u32 {
        match Tlsf::alloc(self, layout.size() as u64, layout.align() as u64) {
            Ok(a) => a.handle,
            Err(e) => panic!("tlsf alloc of {layout:?} failed: {e}"),
        }
    }
    #[inline(always)]
    fn free(&mut self, token: u32, _: Layout) {
        if let Err(e) = Tlsf::free(self, token) {
            panic!("tlsf free failed: {e}");
        }
    }
}

#[cfg(feature = "std")]
impl Bench for SharedTlsf {
    type Token = u32;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> u32 {
        match SharedTlsf::alloc(self, layout.size() as u64, layout.align() as u64) {
            Ok(a) => a.handle,
            Err(e) => panic!("shared tlsf alloc of {layout:?} failed: {e}"),
        }
    }
    #[inline(always)]
    fn free(&mut self, token: u32, _: Layout) {
        if let Err(e) = SharedTlsf::free(self, token) {
            panic!("shared tlsf free failed: {e}");
        }
    }
}

/// `std::alloc::alloc` / `dealloc`: the global (system) allocator.
pub(crate) struct System;

impl Bench for System {
    type Token = *mut u8;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> *mut u8 {
        // SAFETY: every layout of the mix has a non-zero size (at least 1
        // byte) and was built by `Layout::from_size_align`.
        let p = unsafe { alloc(layout) };
        if p.is_null() {
            handle_alloc_error(layout);
        }
        p
    }
    #[inline(always)]
    fn free(&mut self, token: *mut u8, layout: Layout) {
        // SAFETY: `token` came from `alloc` with exactly this `layout` (the
        // window keeps each pointer with its layout) and is freed once: its
        // slot is overwritten by the next allocation right after.
        unsafe { dealloc(token, layout) }
    }
}

/// `Tlsf` plus the atomic swap an `ArenaBuf`'s drop does.
pub(crate) struct TlsfSwap {
    pub(crate) tlsf: Tlsf,
    pub(crate) last: AtomicU32,
}

impl Bench for TlsfSwap {
    type Token = u32;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> u32 {
        Bench::alloc(&mut self.tlsf, layout)
    }
    #[inline(always)]
    fn free(&mut self, token: u32, layout: Layout) {
        black_box(self.last.swap(token, Ordering::AcqRel));
        Bench::free(&mut self.tlsf, token, layout);
    }
}

/// `Tlsf` with a front cache, reporting what the cache holds.
pub(crate) struct Cached(pub(crate) Tlsf);

impl Bench for Cached {
    type Token = u32;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> u32 {
        Bench::alloc(&mut self.0, layout)
    }
    #[inline(always)]
    fn free(&mut self, token: u32, layout: Layout) {
        Bench::free(&mut self.0, token, layout);
    }
    fn note(&mut self) -> Option<String> {
        let s = self.0.stats();
        Some(format!(
            "(cached: {:.2} MiB held by the front cache beside {:.2} MiB in use)",
            s.cached as f64 / f64::from(1 << 20),
            s.in_use as f64 / f64::from(1 << 20)
        ))
    }
}

/// The arena's allocator path: buffers dropped, or given back by `free`.
pub(crate) struct Model {
    pub(crate) model: ArenaModel,
    pub(crate) by_free: bool,
}

impl Bench for Model {
    type Token = ModelBuf;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> ModelBuf {
        match self.model.alloc(layout.size(), layout.align() as u64) {
            Ok(buf) => buf,
            Err(e) => panic!("arena model alloc of {layout:?} failed: {e}"),
        }
    }
    #[inline(always)]
    fn free(&mut self, token: ModelBuf, _: Layout) {
        if self.by_free {
            self.model.free(token);
        } else {
            self.model.drop_buf(token);
        }
    }
}

/// An arena whose buffers are dropped (from the owner's thread).
pub(crate) struct ArenaDrop(pub(crate) Arena);

#[inline(always)]
fn arena_alloc(arena: &mut Arena, layout: Layout) -> ArenaBuf {
    match arena.alloc_aligned(layout.size(), layout.align() as u64) {
        Ok(buf) => buf,
        Err(e) => panic!("arena alloc of {layout:?} failed: {e}"),
    }
}

impl Bench for ArenaDrop {
    type Token = ArenaBuf;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> ArenaBuf {
        arena_alloc(&mut self.0, layout)
    }
    #[inline(always)]
    fn free(&mut self, token: ArenaBuf, _: Layout) {
        drop(token);
    }
}

/// An arena whose buffers are given back with `Arena::free`.
pub(crate) struct ArenaFree(pub(crate) Arena);

impl Bench for ArenaFree {
    type Token = ArenaBuf;
    #[inline(always)]
    fn alloc(&mut self, layout: Layout) -> ArenaBuf {
        arena_alloc(&mut self.0, layout)
    }
    #[inline(always)]
    fn free(&mut self, token: ArenaBuf, _: Layout) {
        self.0.free(token);
    }
}
