//! [`SharedTlsf`]: a [`Tlsf`] behind a mutex, for many threads.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::allocator::Tlsf;
use super::types::{Allocation, Stats, TlsfConfig, TlsfError};

/// A [`Tlsf`] shared by many threads through a [`std::sync::Mutex`].
///
/// Why a plain mutex: the critical section is one O(1) `alloc` or `free`,
/// tens of nanoseconds with no system call, so the lock is held very briefly
/// and is uncontended most of the time. Per-thread caches (the usual way to
/// avoid the lock) would hoard registered memory that other threads and the
/// peer need, and give up the exact accounting. Code with one owner per
/// thread (one allocator per queue pair or per core) should use [`Tlsf`]
/// directly, lock-free; [`SharedTlsf::lock`] serves batches with one lock.
///
/// A poisoned lock is recovered: every `Tlsf` operation either completes or
/// changes nothing, so the allocator behind it is always consistent.
#[derive(Debug)]
pub struct SharedTlsf {
    inner: Mutex<Tlsf>,
}

impl From<Tlsf> for SharedTlsf {
    fn from(tlsf: Tlsf) -> Self {
        Self {
            inner: Mutex::new(tlsf),
        }
    }
}

impl SharedTlsf {
    /// Creates the allocator as [`Tlsf::new`] does.
    ///
    /// # Errors
    ///
    /// As [`Tlsf::new`].
    pub fn new(capacity: u64, config: TlsfConfig) -> Result<Self, TlsfError> {
        Tlsf::new(capacity, config).map(Self::from)
    }

    /// Locks the allocator, for several operations under one lock.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Tlsf> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Tlsf::alloc`] under the lock.
    ///
    /// # Errors
    ///
    /// As [`Tlsf::alloc`].
    #[inline]
    pub fn alloc(&self, size: u64, align: u64) -> Result<Allocation, TlsfError> {
        self.lock().alloc(size, align)
    }

    /// [`Tlsf::free`] under the lock.
    ///
    /// # Errors
    ///
    /// As [`Tlsf::free`].
    #[inline]
    pub fn free(&self, handle: u32) -> Result<(), TlsfError> {
        self.lock().free(handle)
    }

    /// [`Tlsf::stats`] under the lock.
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// [`Tlsf::check_invariants`] under the lock.
    ///
    /// # Errors
    ///
    /// As [`Tlsf::check_invariants`].
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        self.lock().check_invariants()
    }

    /// Unwraps the allocator.
    #[must_use]
    pub fn into_inner(self) -> Tlsf {
        self.inner
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
