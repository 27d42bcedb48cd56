//! A prepared request's work requests and entries, kept for posting again.

use alloc::boxed::Box;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

use crate::error::{site, Error};
use crate::memory::NicBuf;
use crate::sgl::{Sgl, MAX_SGE};
use crate::sys::{self, ibv_send_flags as F, Zeroed};
use crate::wr::SendOp;

use super::build::{check_atomic_result, send_wr};

/// A prepared request's work requests and entries, built once. The entries
/// live in a heap block of their own, so the requests' pointers to them
/// stay valid however the table that holds this value moves or grows.
pub(crate) struct PreparedWr {
    pub(super) send: sys::ibv_send_wr,
    pub(super) recv: sys::ibv_recv_wr,
    /// From `Box::leak`; freed in `Drop`.
    sges: NonNull<[sys::ibv_sge; MAX_SGE]>,
}

// SAFETY: the entries block is owned by this value alone and the requests
// point only into it; nothing is shared across threads.
unsafe impl Send for PreparedWr {}

impl PreparedWr {
    fn with(
        sges: [sys::ibv_sge; MAX_SGE],
        mut send: sys::ibv_send_wr,
        num: i32,
        recv_num: i32,
    ) -> PreparedWr {
        let sges = NonNull::from(Box::leak(Box::new(sges)));
        send.sg_list = sges.as_ptr().cast();
        let recv = sys::ibv_recv_wr {
            wr_id: 0,
            next: core::ptr::null_mut(),
            sg_list: sges.as_ptr().cast(),
            num_sge: recv_num,
        };
        send.num_sge = num;
        PreparedWr { send, recv, sges }
    }

    /// The work request of a send of `op` on `sgl`.
    pub(crate) fn send<B: NicBuf>(
        op: &SendOp,
        sgl: &Sgl<B>,
        max_sge: u32,
        flags: F,
    ) -> Result<PreparedWr, Error> {
        let (sges, (num, total)) = built(sgl, max_sge)?;
        check_atomic_result(op, total)?;
        Ok(PreparedWr::with(sges, send_wr(op, 0, flags), num, 0))
    }

    /// The work request of a receive into `sgl`.
    pub(crate) fn recv<B: NicBuf>(sgl: &Sgl<B>, max_sge: u32) -> Result<PreparedWr, Error> {
        let (sges, (num, _)) = built(sgl, max_sge)?;
        Ok(PreparedWr::with(sges, sys::ibv_send_wr::zeroed(), 0, num))
    }

    /// Rebuilds the entries from `sgl` (after a loan that may have swapped
    /// a buffer); the list must still have the same shape.
    pub(crate) fn rebuild<B: NicBuf>(&mut self, sgl: &Sgl<B>, max_sge: u32) -> Result<(), Error> {
        let (sges, (num, _)) = built(sgl, max_sge)?;
        if num != self.send.num_sge.max(self.recv.num_sge) {
            return Err(Error::invalid(site!(
                "post_prepared",
                "the prepared request's buffers changed shape"
            )));
        }
        // SAFETY: the block is owned by `self` (leaked in `with`), and no
        // post of it is in flight (the caller rebuilds only an idle entry).
        unsafe { self.sges.as_ptr().write(sges) };
        Ok(())
    }

    /// The send's flags but `SIGNALED`, which each post decides.
    pub(crate) fn flags(&self) -> F {
        self.send.send_flags.without(F::SIGNALED)
    }
}

/// `sgl`'s entries built into a block a prepared request keeps (the ones
/// past its count zeroed), and what `Sgl::build` returns.
fn built<B: NicBuf>(
    sgl: &Sgl<B>,
    max_sge: u32,
) -> Result<([sys::ibv_sge; MAX_SGE], (i32, u64)), Error> {
    let mut sges = [MaybeUninit::new(sys::ibv_sge::default()); MAX_SGE];
    let counts = sgl.build(max_sge, &mut sges)?;
    // SAFETY: every entry was initialized: zeroed above, some built since.
    Ok((sges.map(|e| unsafe { e.assume_init() }), counts))
}

impl Drop for PreparedWr {
    fn drop(&mut self) {
        // SAFETY: leaked by `with`, freed once; the table drops an entry
        // only when no post of it is in flight (or leaks it).
        drop(unsafe { Box::from_raw(self.sges.as_ptr()) });
    }
}
