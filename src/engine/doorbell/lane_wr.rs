//! A lane's work requests: copies of its prepared send's and receive's,
//! made once when the lane starts, so a post only stamps the id.

use crate::error::Error;
use crate::sys::{self, ibv_send_flags as F, Zeroed};

use super::prepared_wr::PreparedWr;
use super::provider::Provider;

/// The copies a lane posts. They point at the prepared entries' own
/// scatter/gather blocks, which stay put while the lane lives: the lane
/// borrows its engine (`&mut`) for its whole life, so no entry can be
/// released, lent or rebuilt meanwhile.
pub(crate) struct LaneWrs {
    /// Unsignaled, then signaled: a post picks one rather than writing
    /// the flags.
    send: [sys::ibv_send_wr; 2],
    recv: sys::ibv_recv_wr,
}

impl LaneWrs {
    /// Copies of `send`, unsignaled and signaled, and of `recv`, if any.
    pub(crate) fn new(send: &PreparedWr, recv: Option<&PreparedWr>) -> LaneWrs {
        let (mut quiet, mut loud) = (send.send, send.send);
        quiet.send_flags = send.flags().without(F::SIGNALED);
        loud.send_flags = send.flags() | F::SIGNALED;
        LaneWrs {
            send: [quiet, loud],
            recv: recv.map_or_else(sys::ibv_recv_wr::zeroed, |r| r.recv),
        }
    }

    /// Posts the send with id `id` (`id::ring(false, qp, seq)`), signaled
    /// or not; the caller records it in the ring (`Ring::push_filled`).
    #[inline(always)]
    pub(crate) fn post_send<P: Provider>(
        &mut self,
        prov: &mut P,
        qp: &P::Qp,
        id: u64,
        signaled: bool,
    ) -> Result<(), Error> {
        let wr = &mut self.send[usize::from(signaled)];
        wr.wr_id = id;
        // SAFETY: the copy points at its entry's scatter/gather block (on
        // the heap, stable while the entry lives), built from the buffers
        // the entry owns. The lane that owns this copy borrows the engine
        // for its life, so the entry stays and keeps its buffers; the post
        // is recorded in the ring, whose slots name the entry. The lane
        // holds the entry's buffers and lends them only while their ring
        // is empty; dropped, it gives them back with the entry's latest
        // post recorded; forgotten, it keeps them, and the entry counts
        // as busy for good (`QpSlot::lane_out`, the queue pair leaked), so
        // no loan, copy or release reaches the buffers until the device
        // is done.
        unsafe { prov.post_send(qp, core::slice::from_mut(wr)) }.map_err(|f| f.error)
    }

    /// Posts the receive with id `id` (`id::ring(true, qp, seq)`); the
    /// caller made sure the lane has one and records the post as
    /// `post_send` says.
    #[inline(always)]
    pub(crate) fn post_recv<P: Provider>(
        &mut self,
        prov: &mut P,
        qp: &P::Qp,
        id: u64,
    ) -> Result<(), Error> {
        self.recv.wr_id = id;
        // SAFETY: as in `post_send`, for the receive's entry.
        unsafe { prov.post_recv(qp, core::slice::from_mut(&mut self.recv)) }.map_err(|f| f.error)
    }
}
