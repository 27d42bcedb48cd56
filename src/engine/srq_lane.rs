//! A shared-receive lane: a server's loop (a request from the shared
//! receive queue, a reply, the receive posted again) on one queue pair,
//! with everything checked once, when the lane starts, rather than on
//! every request: about a C server's work per request.
//!
//! Like a [`Lane`](super::lane::Lane), it borrows its engine (`&mut`) for
//! its life and moves its queue pair's slot out of the engine. Its sends
//! are posts of a ring of prepared replies, used in turn: the lane holds
//! at least as many replies as the send queue holds posts, so when the
//! queue has room for one more post, the reply it uses next has no post in
//! flight (its last post is older than every post the queue holds). The
//! one room check is the buffer check too, and a post keeps no entry: the
//! lane reserved the queue's depth in the engine's table when it started.
//! A request is a shared receive of the lane's queue pair that completed
//! successfully, handed out as a [`SrqRequest`] that borrows the lane
//! (`srq_request.rs`). Every other completion goes through the engine's
//! router to the poll's callback. Dropped, the lane gives each reply
//! still in flight an entry again; forgotten, it leaks the queue pair,
//! its reservation and the replies' buffers, as after a failed destroy.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::mem::MaybeUninit;

use crate::error::{site, Error, ErrorKind};
use crate::memory::{HostBuf, NicBuf};
use crate::sys::{self, ibv_wc_status as WcStatus};

use super::completion::{check_status, CompletionRef};
use super::config::Queue;
use super::core::Engine;
use super::doorbell::{Provider, ReplyRing, Verbs};
use super::id;
use super::prepared::rebuilt;
use super::prepared_table::{gone, PreparedSend, NEVER};
use super::qp_slot::{QpId, QpSlot, QpState};
use super::slot_back::SlotBack;
use super::srq_request::{ReplySide, SrqRequest};

/// A server's loop on one queue pair of an engine with a shared receive
/// queue: see [`Engine::srq_lane`].
pub struct SrqLane<'e, B: NicBuf, P: Provider = Verbs> {
    engine: &'e mut Engine<B, P>,
    qp: u32,
    /// The replies as prepared, in the ring's order (each one's buffers
    /// are in the ring for the lane's life).
    replies: Box<[PreparedSend]>,
    /// The queue pair's slot, moved out of the engine for the lane's life
    /// (a placeholder in its place, `QpSlot::lent_to_lane`; back in the
    /// engine while the router runs, and when the lane is dropped), and
    /// the ring.
    side: ReplySide<B, P::Qp>,
    /// The send queue's next post when the lane started.
    first_seq: u64,
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Starts a shared-receive lane on the queue pair of `replies`: its
    /// requests are the shared receives it completes, answered with
    /// [`SrqRequest::reply`] from `replies` in turn, posted again with
    /// [`SrqRequest::repost`]. Refused unless the engine has a shared
    /// receive queue, every reply is a live prepared send of this engine on
    /// one queue pair, each given once, with a buffer, and at least as many
    /// as the queue pair's send queue holds, and its send queue has nothing
    /// in flight; `QueueFull` when the completion queue lacks room for the
    /// send queue's depth (the lane reserves it). `mem::forget` on the lane
    /// leaks the queue pair and the replies' buffers.
    pub fn srq_lane(&mut self, replies: &[PreparedSend]) -> Result<SrqLane<'_, B, P>, Error> {
        if self.srq.is_none() {
            return Err(Error::invalid(site!(
                "srq_lane",
                "the engine has no shared receive queue",
                "EngineConfig::srq"
            )));
        }
        let mut qp = None;
        for r in replies {
            let entry = match self.prepared.sends.get_mut(r.index as usize) {
                Some(e) if e.key == r.key => e,
                other => rebuilt(other, r.key, &self.qps, false)?,
            };
            if *qp.get_or_insert(entry.qp) != entry.qp {
                return Err(Error::invalid(site!(
                    "srq_lane",
                    "the replies belong to two queue pairs"
                )));
            }
            if entry.sgl.first().is_none() {
                return Err(Error::invalid(site!(
                    "srq_lane",
                    "a reply has no buffer to write"
                )));
            }
        }
        let mut indices: Vec<u32> = replies.iter().map(|r| r.index).collect();
        indices.sort_unstable();
        if indices.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::invalid(site!("srq_lane", "a reply is given twice")));
        }
        let Some(qp) = qp else {
            return Err(Error::invalid(site!(
                "srq_lane",
                "no replies",
                "one per post the send queue holds"
            )));
        };
        let slot = &self.qps[qp as usize];
        slot.qp.as_ref().ok_or_else(gone)?;
        let depth = slot.send.capacity();
        if (replies.len() as u64) < depth || !replies.len().is_power_of_two() {
            return Err(Error::invalid(site!(
                "srq_lane",
                "the replies are fewer than the send queue holds posts, or not a power of two",
                "prepare one reply per QpConfig::max_send_wr (as granted), rounded up to a power of two"
            )));
        }
        if slot.send.len() != 0 {
            return Err(Error::invalid(site!(
                "srq_lane",
                "the queue pair has sends in flight",
                "poll until they complete"
            )));
        }
        if !self.flights[0].reserve(depth as u32) {
            return Err(Error::new(
                site!(
                    "srq_lane",
                    "the engine's completion queue has no room for the send queue's depth, which the lane holds",
                    "poll completions first, or a larger EngineConfig::cq_depth"
                ),
                ErrorKind::QueueFull,
            ));
        }
        let half = slot.send.half();
        let sgls: Vec<_> = replies
            .iter()
            .map(|r| core::mem::take(&mut self.prepared.sends[r.index as usize].sgl))
            .collect();
        let sends = &self.prepared.sends;
        let ring = ReplyRing::new(
            replies
                .iter()
                .map(|r| &sends[r.index as usize].wr)
                .zip(sgls),
            half,
        );
        let lent = QpSlot::lent_to_lane(&self.qps[qp as usize]);
        let slot = core::mem::replace(&mut self.qps[qp as usize], lent);
        let first_seq = slot.send.next_seq();
        Ok(SrqLane {
            engine: self,
            qp,
            replies: replies.into(),
            side: ReplySide {
                slot,
                ring,
                send_ids: id::ring(false, qp, 0),
            },
            first_seq,
        })
    }
}

impl<B: NicBuf, P: Provider> SrqLane<'_, B, P> {
    /// The queue pair the lane answers on.
    pub fn qp(&self) -> QpId {
        QpId {
            engine: self.engine.id,
            index: self.qp,
            generation: self.side.slot.generation,
        }
    }

    /// The simulated device, which completes requests while a lane holds
    /// the engine.
    #[cfg(test)]
    pub(super) fn provider(&mut self) -> &mut P {
        &mut self.engine.prov
    }

    /// Takes at most one entry off `queue`'s completion queue (as
    /// [`Engine::poll_queue`]). A request of the lane's comes back as a
    /// [`SrqRequest`], its receive lent to it: read it, answer it, post it
    /// again ([`SrqRequest::repost`]); dropped, its buffers are dropped and
    /// its slot freed. A reply's completion is counted; a failed reply
    /// moves the queue pair to ERR and comes back as the error. Anything
    /// else, a failed receive included, is handed to `on_other` with its
    /// buffers, as [`Engine::poll`] hands it.
    #[inline(always)]
    pub fn poll(
        &mut self,
        queue: Queue,
        on_other: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<Option<SrqRequest<'_, B, P>>, Error> {
        let e = &mut *self.engine;
        let Some(cq) = queue.of(&e.cq, &e.recv_cq) else {
            return Ok(None);
        };
        let mut out = MaybeUninit::<sys::ibv_wc>::uninit();
        let Some(wc) = e.prov.poll_one(cq, &mut out)? else {
            return Ok(None);
        };
        // The lane's queue pair number and SUCCESS, in one test, and a
        // receive in flight in its slot.
        let ours = (wc.qp_num ^ self.side.slot.qp_num) | (wc.status.0 ^ WcStatus::SUCCESS.0) == 0;
        let srq = self.engine.srq.as_ref();
        if !ours || srq.and_then(|s| s.posted_slot(wc.wr_id)).is_none() {
            self.not_request(wc, on_other)?;
            return Ok(None);
        }
        // Asked again: a borrow returned on one path would hold `self` on
        // the other (the router's) too. The compiler folds the two asks
        // into one comparison (critpath's listing).
        let e = &mut *self.engine;
        let Some(lent) = e.srq.as_mut().and_then(|s| s.lend_in_place(wc.wr_id)) else {
            return Ok(None);
        };
        self.side.slot.tally.srq_recvs += 1;
        Ok(Some(SrqRequest {
            lent,
            prov: &mut e.prov,
            side: &mut self.side,
            byte_len: wc.byte_len,
        }))
    }

    /// A completion that is not a request: a reply's success, counted
    /// here, or anything else ([`SrqLane::route`]).
    #[inline(always)]
    fn not_request(
        &mut self,
        wc: &sys::ibv_wc,
        mut on_other: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error> {
        let slot = &mut self.side.slot;
        if wc.qp_num == slot.qp_num && wc.status == WcStatus::SUCCESS {
            if let Some(seq) = id::seq_in(wc.wr_id, self.side.send_ids) {
                slot.send.retire_filled(seq);
                return Ok(());
            }
        }
        // Borrowed only here, so a poll that returns a request never
        // stores the callback.
        self.route(wc, &mut on_other)
    }

    /// [`SrqLane::poll`]'s other completions: a failed (or stale) reply,
    /// counted here, or anything else, through the engine's router.
    #[cold]
    #[inline(never)]
    fn route(
        &mut self,
        wc: &sys::ibv_wc,
        on_other: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error> {
        if let Some(seq) = id::seq_in(wc.wr_id, self.side.send_ids) {
            if wc.qp_num == self.side.slot.qp_num {
                return self.own(seq, wc);
            }
        }
        let back = SlotBack::new(self.engine, &mut self.side.slot, self.qp);
        back.engine.route(core::slice::from_ref(wc), on_other);
        drop(back);
        Ok(())
    }

    /// A reply's completion that is not a success the poll counted: a
    /// failure (the queue pair goes to ERR, the error comes back) or a
    /// stale or duplicated id (nothing).
    fn own(&mut self, seq: u64, wc: &sys::ibv_wc) -> Result<(), Error> {
        if self.side.slot.send.retire_filled(seq) == 0 || wc.status == WcStatus::SUCCESS {
            return Ok(());
        }
        self.side.slot.set_state(QpState::ERR);
        let reply = self.replies[self.reply_of(seq)];
        let opcode = self.engine.prepared.sends[reply.index as usize].opcode;
        check_status(wc.status, opcode, false)
    }

    /// Which reply post `seq` (posted by this lane) used.
    fn reply_of(&self, seq: u64) -> usize {
        self.side.ring.index_of(seq)
    }

    /// Fills the next reply with `fill` and posts it, without a request
    /// (as a request's `reply` does).
    #[cfg(test)]
    pub(super) fn reply_with(&mut self, fill: impl FnOnce(&mut B)) -> Result<(), Error> {
        self.side.fill_and_post(&mut self.engine.prov, fill)
    }
}

impl<B: HostBuf, P: Provider> SrqLane<'_, B, P> {
    /// Copies `src` into the next reply's buffer at `offset` and posts it,
    /// outside any request (a notice the server sends on its own), as
    /// [`SrqRequest::reply`] does. Refused when the send queue is full, or
    /// the queue pair not ready to send.
    #[inline(always)]
    pub fn send(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.side.send(&mut self.engine.prov, offset, src)
    }
}

impl<B: NicBuf, P: Provider> Drop for SrqLane<'_, B, P> {
    /// Gives each reply still in flight an entry again (out of the lane's
    /// reservation, whose rest is returned), puts the queue pair's slot and
    /// the buffers back, and records each reply's latest post (what a
    /// loan, a copy or a release checks).
    fn drop(&mut self) {
        let e = &mut *self.engine;
        let side = &mut self.side;
        // The room it held: the send queue's depth.
        e.flights[0].unreserve(side.slot.send.capacity() as u32);
        let (replies, sends) = (&self.replies, &e.prepared.sends);
        let tail = side.slot.send.next_seq();
        // The ring's own index (it is taken apart below, its index kept).
        let reply_of = |ring: &ReplyRing<B>, seq: u64| replies[ring.index_of(seq)];
        e.flights[0].adopt(&mut side.slot.send, |seq| {
            let r = reply_of(&side.ring, seq);
            let s = &sends[r.index as usize];
            (s.tag, s.opcode, r.index, r.key as u32)
        });
        for (at, r) in replies.iter().enumerate() {
            let s = &mut e.prepared.sends[r.index as usize];
            s.sgl = side.ring.take_sgl(at);
            s.last_post = NEVER;
        }
        let in_flight = side.slot.send.len();
        for seq in tail - in_flight..tail {
            e.prepared.sends[reply_of(&side.ring, seq).index as usize].last_post = seq;
        }
        // The unsignaled posts since the ring's last signaled one, which
        // the queue pair's next signal decision counts on.
        let posted = tail - self.first_seq;
        if posted > 0 {
            let signaled = |k: u64| side.ring.signaled(side.ring.index_of(tail - 1 - k));
            side.slot.unsignaled_run = (0..posted).take_while(|&k| !signaled(k)).count() as u64;
        }
        core::mem::swap(&mut side.slot, &mut e.qps[self.qp as usize]);
    }
}
