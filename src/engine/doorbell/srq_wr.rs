//! A shared-receive slot's work request (`srq.rs`): built with the slot,
//! pointing at the slot's own block of entries, so posting the slot again
//! in place stamps its id and posts, nothing rebuilt. Its id is the slot's
//! one id (its receive's while posted or lent in place, else the next one
//! with `id::UNPOSTED` flipped).

use alloc::boxed::Box;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

use crate::sgl::MAX_SGE;
use crate::sys;

type Entries = [MaybeUninit<sys::ibv_sge>; MAX_SGE];

/// The work request and its entries, apart on the heap so the request's
/// pointer to them holds however the slot moves.
pub(crate) struct SrqWr {
    wr: sys::ibv_recv_wr,
    /// From `Box::leak`; freed in `Drop`.
    sges: NonNull<Entries>,
}

// SAFETY: the entries block is owned by this value alone and the request
// points only into it; nothing is shared across threads.
unsafe impl Send for SrqWr {}

impl SrqWr {
    /// A request with id `id`, no entries built yet.
    pub(crate) fn new(id: u64) -> SrqWr {
        let sges: NonNull<Entries> = NonNull::from(Box::leak(Box::new(
            [const { MaybeUninit::uninit() }; MAX_SGE],
        )));
        SrqWr {
            wr: sys::ibv_recv_wr {
                wr_id: id,
                next: core::ptr::null_mut(),
                sg_list: sges.as_ptr().cast(),
                num_sge: 0,
            },
            sges,
        }
    }

    /// The slot's id.
    #[inline(always)]
    pub(crate) fn id(&self) -> u64 {
        self.wr.wr_id
    }

    /// Sets the slot's id (the next post's, or the unposted marker).
    #[inline(always)]
    pub(crate) fn set_id(&mut self, id: u64) {
        self.wr.wr_id = id;
    }

    /// The entries, to build; `built` records how many were.
    pub(super) fn entries(&mut self) -> &mut Entries {
        // SAFETY: the block is this value's (from `new`), alive until its
        // drop; `&mut self` makes this the only reference to it.
        unsafe { self.sges.as_mut() }
    }

    /// The first `num` entries were built (by the post that moves the
    /// slot's buffers in, `doorbell::srq_recv`).
    pub(super) fn built(&mut self, num: i32) {
        self.wr.num_sge = num;
    }

    /// The request, to post: its id and its built entries.
    #[inline(always)]
    pub(super) fn wr(&mut self) -> &mut sys::ibv_recv_wr {
        &mut self.wr
    }
}

impl Drop for SrqWr {
    fn drop(&mut self) {
        // SAFETY: leaked by `new`, freed once. The provider reads the
        // entries during a post only (it copies them into its queue).
        drop(unsafe { Box::from_raw(self.sges.as_ptr()) });
    }
}
