//! A shared-receive lane's replies (`srq_lane.rs`): copies of its prepared
//! sends' work requests, made once when the lane starts, so a post only
//! stamps the id.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::error::Error;
use crate::sys::{self, ibv_send_flags as F};

use super::prepared_wr::PreparedWr;
use super::provider::Provider;

/// One unsignaled and one signaled copy of each reply, so a post picks
/// one rather than writing the flags. They point at the prepared entries'
/// own scatter/gather blocks, which stay put while the lane lives: the
/// lane borrows its engine (`&mut`) for its whole life, so no entry can be
/// released, lent or rebuilt meanwhile.
pub(crate) struct ReplyWrs {
    wrs: Box<[[sys::ibv_send_wr; 2]]>,
}

impl ReplyWrs {
    /// Copies of each of `replies`, in order.
    pub(crate) fn new<'a>(replies: impl Iterator<Item = &'a PreparedWr>) -> ReplyWrs {
        let wrs: Vec<_> = replies
            .map(|r| {
                let (mut quiet, mut loud) = (r.send, r.send);
                quiet.send_flags = r.flags().without(F::SIGNALED);
                loud.send_flags = r.flags() | F::SIGNALED;
                [quiet, loud]
            })
            .collect();
        ReplyWrs {
            wrs: wrs.into_boxed_slice(),
        }
    }

    /// Posts reply `at` with id `id` (`id::ring(false, qp, seq)`), signaled
    /// or not; the caller records it in the ring (`Ring::push_filled`).
    #[inline(always)]
    pub(crate) fn post_send<P: Provider>(
        &mut self,
        prov: &mut P,
        qp: &P::Qp,
        at: usize,
        id: u64,
        signaled: bool,
    ) -> Result<(), Error> {
        let wr = &mut self.wrs[at][usize::from(signaled)];
        wr.wr_id = id;
        // SAFETY: the copy points at its entry's scatter/gather block (on
        // the heap, stable while the entry lives), built from the buffers
        // the entry owned when the lane started. The lane that owns this
        // copy borrows the engine for its life, so the entry stays; the
        // lane holds the entry's buffers, and writes reply `at`'s only
        // when its queue's room check proves the reply's previous post
        // retired (`SrqLane::reply`: a queue holds fewer posts than the
        // lane has replies, used in turn). Dropped, the lane gives the
        // buffers back with each entry's latest post recorded; forgotten,
        // it keeps them, and the queue pair is leaked with them
        // (`QpSlot::lane_out`), so nothing reaches them until the device
        // is done.
        unsafe { prov.post_send(qp, core::slice::from_mut(wr)) }.map_err(|f| f.error)
    }
}
