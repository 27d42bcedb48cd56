//! A shared-receive lane's replies (`srq_lane.rs`): a copy of each
//! prepared send's work request, made once when the lane starts, with
//! the buffers it names, so a post only stamps the id.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::error::Error;
use crate::sgl::Sgl;
use crate::sys::{self, ibv_send_flags as F};

use super::prepared_wr::PreparedWr;
use super::provider::Provider;

struct Reply<B> {
    wr: sys::ibv_send_wr,
    sgl: Sgl<B>,
}

/// The replies, a power of two of them, used in turn: post `seq` uses
/// reply `seq % len`. Each copy points at its prepared entry's
/// own scatter/gather block, which stays put while the lane lives: the
/// lane borrows its engine (`&mut`) for its whole life, so no entry can be
/// released, lent or rebuilt meanwhile. Reply `i` asks for a completion
/// when `i + 1` is a multiple of `every`, and the last one always: used
/// in turn, no more than `every - 1` posts in a row go unsignaled.
pub(crate) struct ReplyRing<B> {
    replies: Box<[Reply<B>]>,
    /// `replies.len() - 1`: the length is a power of two.
    mask: usize,
}

impl<B> ReplyRing<B> {
    /// Copies of each of `replies`' requests, in order, with the buffers
    /// they name (moved out of their entries).
    pub(crate) fn new<'a>(
        replies: impl ExactSizeIterator<Item = (&'a PreparedWr, Sgl<B>)>,
        every: u64,
    ) -> ReplyRing<B> {
        let len = replies.len();
        assert!(len.is_power_of_two(), "a ring of replies is a power of two");
        let replies: Vec<_> = replies
            .enumerate()
            .map(|(i, (r, sgl))| {
                let mut wr = r.send;
                let signaled = (i as u64 + 1) % every.max(1) == 0 || i + 1 == len;
                wr.send_flags = if signaled {
                    r.flags() | F::SIGNALED
                } else {
                    r.flags().without(F::SIGNALED)
                };
                Reply { wr, sgl }
            })
            .collect();
        ReplyRing {
            replies: replies.into_boxed_slice(),
            mask: len - 1,
        }
    }

    /// The reply post `seq` uses.
    #[inline(always)]
    pub(crate) fn index_of(&self, seq: u64) -> usize {
        seq as usize & self.mask
    }

    /// Whether reply `at` asks for a completion.
    pub(crate) fn signaled(&self, at: usize) -> bool {
        self.replies[at].wr.send_flags.contains(F::SIGNALED)
    }

    /// The reply post `seq` uses, to write and post, its work request
    /// stamped with `id` (`id::ring(false, qp, seq)`) now, so nothing
    /// waits for the post; `None` when it has no buffer.
    #[inline(always)]
    pub(crate) fn for_post(&mut self, seq: u64, id: u64) -> Option<ReplyAt<'_, B>> {
        let at = self.index_of(seq);
        // SAFETY: `at` is masked by `mask`, one less than the length, a
        // power of two (`new`): below the length.
        let reply = unsafe { self.replies.get_unchecked_mut(at) };
        reply.wr.wr_id = id;
        Some(ReplyAt {
            buf: reply.sgl.buf_mut(0)?,
            wr: &mut reply.wr,
        })
    }

    /// Reply `at`'s buffers, moved out (when the lane gives them back).
    pub(crate) fn take_sgl(&mut self, at: usize) -> Sgl<B> {
        core::mem::take(&mut self.replies[at].sgl)
    }
}

/// One reply of the ring, to write (its first buffer) and post.
pub(crate) struct ReplyAt<'a, B> {
    pub(crate) buf: &'a mut B,
    wr: &'a mut sys::ibv_send_wr,
}

impl<B> ReplyAt<'_, B> {
    /// Posts it with the id `ReplyRing::for_post` stamped; the caller
    /// records it in the ring (`Ring::push_filled`).
    #[inline(always)]
    pub(crate) fn post_send<P: Provider>(self, prov: &mut P, qp: &P::Qp) -> Result<(), Error> {
        let wr = self.wr;
        // SAFETY: the copy points at its entry's scatter/gather block (on
        // the heap, stable while the entry lives), built from the buffers
        // that entry owned and this ring holds now. The lane that owns
        // the ring borrows the engine for its life, so the entry stays;
        // it writes a reply's buffer only when its queue's room check
        // proves the reply's previous post retired (`srq_request.rs`: a
        // queue holds fewer posts than the lane has replies, used in
        // turn). Dropped, the lane gives the buffers back with each
        // entry's latest post recorded; forgotten, the ring keeps them,
        // and the queue pair is leaked with them (`QpSlot::lane_out`), so
        // nothing reaches them until the device is done.
        unsafe { prov.post_send(qp, core::slice::from_mut(wr)) }.map_err(|f| f.error)
    }
}
