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
//! successfully: its slot is lent to the lane (no longer posted, so no
//! peer writes it), read by copy, and posted again in place; a request
//! not posted again by the next poll is dropped there (the device is done
//! with it). Every other
//! completion goes through the engine's router to the poll's callback.
//! Dropped, the lane gives each reply still in flight an entry again;
//! forgotten, it leaks the queue pair, its reservation and the replies'
//! buffers, as after a failed destroy.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::mem::MaybeUninit;

use crate::error::{site, Error, ErrorKind};
use crate::memory::{HostBuf, NicBuf};
use crate::sgl::Sgl;
use crate::sys::{self, ibv_wc_status as WcStatus};

use super::check::{cannot_send_on, post_hint};
use super::completion::{check_status, CompletionRef};
use super::config::Queue;
use super::core::Engine;
use super::doorbell::{Provider, ReplyWrs, Verbs};
use super::id;
use super::prepared::rebuilt;
use super::prepared_table::{gone, PreparedSend, NEVER};
use super::qp_slot::{signal_decision, QpId, QpSlot, QpState};
use super::slot_back::SlotBack;

/// A server's loop on one queue pair of an engine with a shared receive
/// queue: see [`Engine::srq_lane`].
pub struct SrqLane<'e, B: NicBuf, P: Provider = Verbs> {
    engine: &'e mut Engine<B, P>,
    /// The queue pair's slot, moved out of the engine for the lane's life
    /// (a placeholder in its place, `QpSlot::lent_to_lane`); back in the
    /// engine while the router runs, and when the lane is dropped.
    slot: QpSlot<P::Qp>,
    qp: u32,
    replies: Box<[PreparedSend]>,
    /// Each reply's buffers, moved out of its entry for the lane's life
    /// (the request still names their memory).
    bufs: Box<[Sgl<B>]>,
    wrs: ReplyWrs,
    /// The reply the next post uses: post `seq` uses reply `seq % len`.
    next: usize,
    /// `id::ring(false, qp, 0)`: the replies' ids start here.
    send_ids: u64,
}

#[cold]
fn no_request() -> Error {
    Error::invalid(site!(
        "srq_lane request",
        "no request is lent to the lane (posted again already, or none polled)",
        "poll until it returns Some"
    ))
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Starts a shared-receive lane on the queue pair of `replies`: its
    /// requests are the shared receives it completes, answered with
    /// [`SrqLane::reply`] from `replies` in turn, posted again with
    /// [`SrqLane::repost_request`]. Refused unless the engine has a shared
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
        if (replies.len() as u64) < depth {
            return Err(Error::invalid(site!(
                "srq_lane",
                "fewer replies than the send queue holds posts",
                "prepare one reply per QpConfig::max_send_wr (as granted)"
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
        let sends = &self.prepared.sends;
        let wrs = ReplyWrs::new(replies.iter().map(|r| &sends[r.index as usize].wr));
        let bufs = replies
            .iter()
            .map(|r| core::mem::take(&mut self.prepared.sends[r.index as usize].sgl))
            .collect();
        let lent = QpSlot::lent_to_lane(&self.qps[qp as usize]);
        let slot = core::mem::replace(&mut self.qps[qp as usize], lent);
        Ok(SrqLane {
            engine: self,
            slot,
            qp,
            replies: replies.into(),
            bufs,
            wrs,
            next: 0,
            send_ids: id::ring(false, qp, 0),
        })
    }
}

impl<B: NicBuf, P: Provider> SrqLane<'_, B, P> {
    /// The queue pair the lane answers on.
    pub fn qp(&self) -> QpId {
        QpId {
            engine: self.engine.id,
            index: self.qp,
            generation: self.slot.generation,
        }
    }

    /// The simulated device, which completes requests while a lane holds
    /// the engine.
    #[cfg(test)]
    pub(super) fn provider(&mut self) -> &mut P {
        &mut self.engine.prov
    }

    /// Takes at most one entry off `queue`'s completion queue (as
    /// [`Engine::poll_queue`]). A request of the lane's comes back as
    /// `Some` with its length, lent to the lane (read it with
    /// [`SrqLane::read_request`]) until it is posted again
    /// ([`SrqLane::repost_request`]) or the next poll, which drops it. A
    /// reply's completion is counted; a failed reply moves the queue pair
    /// to ERR and comes back as the error. Anything else, a failed
    /// receive included, is handed to `on_other` with its buffers, as
    /// [`Engine::poll`] hands it.
    #[inline(always)]
    pub fn poll(
        &mut self,
        queue: Queue,
        mut on_other: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<Option<u32>, Error> {
        let e = &mut *self.engine;
        let Some(srq) = e.srq.as_mut() else {
            return Ok(None);
        };
        // The last request, if not posted again, is dropped.
        srq.release_lent();
        let Some(cq) = queue.of(&e.cq, &e.recv_cq) else {
            return Ok(None);
        };
        let mut out = MaybeUninit::<sys::ibv_wc>::uninit();
        let Some(wc) = e.prov.poll_one(cq, &mut out)? else {
            return Ok(None);
        };
        // The lane's queue pair number and SUCCESS, in one test.
        if (wc.qp_num ^ self.slot.qp_num) | (wc.status.0 ^ WcStatus::SUCCESS.0) == 0 {
            if let Some((slot, generation)) = id::srq_in(wc.wr_id) {
                if srq.lend(slot, generation).is_some() {
                    self.slot.tally.srq_recvs += 1;
                    return Ok(Some(wc.byte_len));
                }
            } else if let Some(seq) = id::seq_in(wc.wr_id, self.send_ids) {
                self.slot.send.retire_filled(seq);
                return Ok(None);
            }
        }
        self.route(wc, &mut on_other)?;
        Ok(None)
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
        if let Some(seq) = id::seq_in(wc.wr_id, self.send_ids) {
            if wc.qp_num == self.slot.qp_num {
                return self.own(seq, wc);
            }
        }
        let back = SlotBack::new(self.engine, &mut self.slot, self.qp);
        back.engine.route(core::slice::from_ref(wc), on_other);
        drop(back);
        Ok(())
    }

    /// A reply's completion that is not a success the poll counted: a
    /// failure (the queue pair goes to ERR, the error comes back) or a
    /// stale or duplicated id (nothing).
    fn own(&mut self, seq: u64, wc: &sys::ibv_wc) -> Result<(), Error> {
        if self.slot.send.retire_filled(seq) == 0 || wc.status == WcStatus::SUCCESS {
            return Ok(());
        }
        self.slot.set_state(QpState::ERR);
        let reply = self.replies[self.reply_of(seq)];
        let opcode = self.engine.prepared.sends[reply.index as usize].opcode;
        check_status(wc.status, opcode, false)
    }

    /// Which reply post `seq` (posted by this lane) used.
    fn reply_of(&self, seq: u64) -> usize {
        reply_at(
            self.next,
            self.slot.send.next_seq(),
            seq,
            self.replies.len(),
        )
    }

    /// Posts the request lent to the lane again, in its slot of the shared
    /// receive queue. Refused when none is lent; if the device refuses it,
    /// it stays lent.
    #[inline(always)]
    pub fn repost_request(&mut self) -> Result<(), Error> {
        self.engine.repost_lent_srq()
    }
}

/// The reply post `seq` used, when the post at `tail` uses reply `next`
/// of `len` (replies are used in turn).
fn reply_at(next: usize, tail: u64, seq: u64, len: usize) -> usize {
    let back = ((tail - seq) % len as u64) as usize;
    (next + len - back) % len
}

impl<B: NicBuf, P: Provider> SrqLane<'_, B, P> {
    /// The first buffer of the request lent to the lane, if one is.
    #[inline(always)]
    pub(super) fn request_buf(&self) -> Result<&B, Error> {
        let srq = self.engine.srq.as_ref().ok_or_else(no_request)?;
        srq.lent_first().ok_or_else(no_request)
    }

    /// The next reply's buffer, to fill before [`SrqLane::post_reply`]
    /// posts it. Refused when the send queue is full or the queue pair not
    /// ready to send.
    #[inline(always)]
    pub(super) fn next_reply(&mut self) -> Result<&mut B, Error> {
        let slot = &self.slot;
        if slot.send.len() >= slot.send_room {
            return Err(cannot_send_on(slot));
        }
        // Reply `next`'s last post is `replies.len()` posts back or older:
        // retired, as the room check above found fewer in flight.
        self.bufs[self.next].buf_mut(0).ok_or_else(gone)
    }

    /// Posts the next reply, unsignaled unless the queue needs a signal
    /// (half its depth in a row). Only after [`SrqLane::next_reply`]
    /// found room for it (nothing posted since).
    #[inline(always)]
    pub(super) fn post_reply(&mut self) -> Result<(), Error> {
        let slot = &mut self.slot;
        debug_assert!(slot.send.len() < slot.send_room);
        let qp = slot.qp.as_ref().ok_or_else(gone)?;
        let at = self.next;
        let seq = slot.send.next_seq();
        let mut run = slot.unsignaled_run;
        let signaled = signal_decision(&mut run, slot.send.half(), false, 0);
        self.wrs
            .post_send(
                &mut self.engine.prov,
                qp,
                at,
                id::ring_at(self.send_ids, seq),
                signaled,
            )
            .map_err(post_hint)?;
        slot.send.push_filled();
        slot.unsignaled_run = run;
        self.next = if at + 1 == self.bufs.len() { 0 } else { at + 1 };
        Ok(())
    }
}

impl<B: HostBuf, P: Provider> SrqLane<'_, B, P> {
    /// Copies from the request lent to the lane, at `offset`, into `dst`.
    /// Refused when none is lent.
    #[inline(always)]
    pub fn read_request(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.request_buf()?.read_at(offset, dst)
    }

    /// Copies `src` into the next reply's buffer at `offset` and posts it,
    /// unsignaled unless the queue needs a signal (half its depth in a
    /// row): it completes, and is counted, with the next signaled one.
    /// Refused when the send queue is full, or the queue pair not ready
    /// to send.
    #[inline(always)]
    pub fn reply(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.next_reply()?.write_at(offset, src)?;
        self.post_reply()
    }
}

impl<B: NicBuf, P: Provider> Drop for SrqLane<'_, B, P> {
    /// Gives each reply still in flight an entry again (out of the lane's
    /// reservation, whose rest is returned), puts the queue pair's slot and
    /// the buffers back, and records each reply's latest post (what a
    /// loan, a copy or a release checks).
    fn drop(&mut self) {
        let e = &mut *self.engine;
        if let Some(srq) = e.srq.as_mut() {
            srq.release_lent();
        }
        // The room it held: the send queue's depth.
        e.flights[0].unreserve(self.slot.send.capacity() as u32);
        let (replies, sends) = (&self.replies, &e.prepared.sends);
        let (tail, next) = (self.slot.send.next_seq(), self.next);
        let reply_of = |seq: u64| replies[reply_at(next, tail, seq, replies.len())];
        e.flights[0].adopt(&mut self.slot.send, |seq| {
            let r = reply_of(seq);
            let s = &sends[r.index as usize];
            (s.tag, s.opcode, r.index, r.key as u32)
        });
        for (at, r) in replies.iter().enumerate() {
            let s = &mut e.prepared.sends[r.index as usize];
            s.sgl = core::mem::take(&mut self.bufs[at]);
            s.last_post = NEVER;
        }
        let in_flight = self.slot.send.len();
        for seq in tail - in_flight..tail {
            e.prepared.sends[reply_of(seq).index as usize].last_post = seq;
        }
        core::mem::swap(&mut self.slot, &mut e.qps[self.qp as usize]);
    }
}
