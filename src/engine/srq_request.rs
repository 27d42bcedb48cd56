//! A shared-receive lane's request (`srq_lane.rs`): one successful shared
//! receive of the lane's queue pair, lent in its slot for as long as this
//! value lives. It is read by copy, answered from the lane's ring of
//! replies, and posted again in place, which consumes it; dropped without
//! that, its slot is freed and its buffers dropped (the device is done
//! with them); forgotten, the slot leaks with its buffers (`srq.rs`).
//! It borrows the lane, so it cannot outlive the lane's next poll, and
//! nothing else can reach its slot meanwhile.

use crate::error::{site, Error};
use crate::memory::{HostBuf, NicBuf};

use super::check::{cannot_send_on, post_hint};
use super::doorbell::{self, Provider, ReplyAt, ReplyRing, Verbs};
use super::id;
use super::prepared_table::gone;
use super::qp_slot::QpSlot;
use super::srq::LentSlot;

/// What a shared-receive lane answers with: its queue pair's slot (moved
/// out of the engine for the lane's life) and the ring of replies (post
/// `seq` uses reply `seq % len`).
pub(super) struct ReplySide<B, Q> {
    pub(super) slot: QpSlot<Q>,
    pub(super) ring: ReplyRing<B>,
    /// `id::ring(false, qp, 0)`: the replies' ids start here.
    pub(super) send_ids: u64,
}

impl<B: NicBuf, Q> ReplySide<B, Q> {
    /// The next reply, to fill and post. Refused when the send queue is
    /// full or the queue pair not ready to send.
    #[inline(always)]
    pub(super) fn next_reply(&mut self) -> Result<NextReply<'_, B, Q>, Error> {
        let slot = &mut self.slot;
        if slot.send.len() >= slot.send_room {
            return Err(cannot_send_on(slot));
        }
        let seq = slot.send.next_seq();
        // The reply post `seq` uses was last posted `len` posts back or
        // earlier: retired, as the room check above found fewer in flight.
        let reply = self
            .ring
            .for_post(seq, id::ring_at(self.send_ids, seq))
            .ok_or_else(gone)?;
        Ok(NextReply { reply, slot })
    }
}

impl<B: HostBuf, Q> ReplySide<B, Q> {
    /// Copies `src` into the next reply's buffer at `offset` and posts it.
    #[inline(always)]
    pub(super) fn send<P: Provider<Qp = Q>>(
        &mut self,
        prov: &mut P,
        offset: usize,
        src: &[u8],
    ) -> Result<(), Error> {
        let next = self.next_reply()?;
        next.reply.buf.write_at(offset, src)?;
        next.post(prov)
    }
}

impl<B: NicBuf, Q> ReplySide<B, Q> {
    /// Fills the next reply's buffer with `fill` and posts it (the sim's
    /// buffers are not host memory).
    #[cfg(test)]
    pub(super) fn fill_and_post<P: Provider<Qp = Q>>(
        &mut self,
        prov: &mut P,
        fill: impl FnOnce(&mut B),
    ) -> Result<(), Error> {
        let next = self.next_reply()?;
        fill(next.reply.buf);
        next.post(prov)
    }
}

/// The lane's next reply, found idle by [`ReplySide::next_reply`]: its
/// buffer to fill, then its post.
pub(super) struct NextReply<'a, B, Q> {
    pub(super) reply: ReplyAt<'a, B>,
    slot: &'a mut QpSlot<Q>,
}

impl<B, Q> NextReply<'_, B, Q> {
    /// Posts it (signaled as the ring says).
    #[inline(always)]
    pub(super) fn post<P: Provider<Qp = Q>>(self, prov: &mut P) -> Result<(), Error> {
        let qp = self.slot.qp.as_ref().ok_or_else(gone)?;
        self.reply.post_send(prov, qp).map_err(post_hint)?;
        self.slot.send.push_filled();
        Ok(())
    }
}

/// A request of a shared-receive lane: see [`SrqLane::poll`](super::srq_lane::SrqLane::poll).
/// It borrows the lane, and posting it again consumes it, so a request
/// read or posted again after the lane's next poll, or posted again
/// twice, does not compile:
///
/// ```compile_fail
/// # fn f(lane: &mut verbs::SrqLane<'_, verbs::ArenaBuf>) -> Result<(), verbs::Error> {
/// let first = lane.poll(verbs::Queue::Send, |_| {})?;
/// let second = lane.poll(verbs::Queue::Send, |_| {})?; // the lane is borrowed
/// drop((first, second));
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(lane: &mut verbs::SrqLane<'_, verbs::ArenaBuf>) -> Result<(), verbs::Error> {
/// if let Some(request) = lane.poll(verbs::Queue::Send, |_| {})? {
///     request.repost()?;
///     request.repost()?; // moved by the first
/// }
/// # Ok(()) }
/// ```
///
/// ```
/// # fn f(lane: &mut verbs::SrqLane<'_, verbs::ArenaBuf>) -> Result<(), verbs::Error> {
/// if let Some(request) = lane.poll(verbs::Queue::Send, |_| {})? {
///     request.repost()?;
/// }
/// let next = lane.poll(verbs::Queue::Send, |_| {})?; // the first is gone
/// # drop(next);
/// # Ok(()) }
/// ```
pub struct SrqRequest<'l, B: NicBuf, P: Provider = Verbs> {
    pub(super) lent: LentSlot<'l, B, P::Srq>,
    pub(super) prov: &'l mut P,
    pub(super) side: &'l mut ReplySide<B, P::Qp>,
    pub(super) byte_len: u32,
}

#[cold]
fn no_buffer() -> Error {
    Error::invalid(site!(
        "srq_lane request",
        "the receive has no buffer",
        "post shared receives with one (RecvRequest::new)"
    ))
}

impl<B: NicBuf, P: Provider> SrqRequest<'_, B, P> {
    /// The bytes the request carried.
    pub fn byte_len(&self) -> u32 {
        self.byte_len
    }

    /// The request's first buffer.
    #[inline(always)]
    pub(super) fn buf(&self) -> Result<&B, Error> {
        self.lent.slot.sgl.first().ok_or_else(no_buffer)
    }

    /// Fills the next reply with `fill` and posts it (as `reply` does).
    #[cfg(test)]
    pub(super) fn reply_with(&mut self, fill: impl FnOnce(&mut B)) -> Result<(), Error> {
        self.side.fill_and_post(self.prov, fill)
    }

    /// Posts the request's receive again, in its slot of the shared
    /// receive queue (the same buffers and entries). If the device refuses
    /// it, the slot is freed and its buffers dropped, as when the request
    /// is dropped.
    #[inline(always)]
    pub fn repost(mut self) -> Result<(), Error> {
        let lent = &mut self.lent;
        let id = lent.slot.next_in_place();
        // Marked first (no completion can come before the post returns:
        // polls need the lane), so nothing is reloaded after the call;
        // refused, the drop below releases the slot from this id.
        lent.slot.reposted(id);
        doorbell::srq_repost(self.prov, lent.srq, &mut lent.slot.wr)?;
        // Posted: nothing is left to release.
        core::mem::forget(self);
        Ok(())
    }
}

impl<B: HostBuf, P: Provider> SrqRequest<'_, B, P> {
    /// Copies from the request's first buffer, at `offset`, into `dst`.
    #[inline(always)]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.buf()?.read_at(offset, dst)
    }

    /// Copies `src` into the next reply's buffer at `offset` and posts it,
    /// unsignaled unless the ring's turn asks for a completion (every
    /// half queue): an unsignaled reply completes, and is counted, with
    /// the next signaled one. Refused when the send queue is full, or the
    /// queue pair not ready to send.
    #[inline(always)]
    pub fn reply(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.side.send(self.prov, offset, src)
    }
}

impl<B: NicBuf, P: Provider> core::fmt::Debug for SrqRequest<'_, B, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SrqRequest")
            .field("byte_len", &self.byte_len)
            .finish_non_exhaustive()
    }
}
