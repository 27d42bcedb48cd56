//! A lane: one queue pair's prepared send (and receive) posted and
//! completed with everything checked once, when the lane starts, rather
//! than on every post: the shape of a ping-pong or a request-reply loop,
//! with about a C loop's work per message.
//!
//! A lane borrows its engine (`&mut`) for its life, so only the lane posts
//! meanwhile, and only its two requests: every request in its queue pair's
//! queues is a post of one of them. Starting the lane releases their
//! entries in the engine's table of requests in flight and reserves the
//! queues' whole depth there instead (so the completion queue keeps room
//! for every post the lane may make), and moves the queue pair's slot and
//! the two entries' buffers out of the engine into the lane. A post then
//! only counts (the queue's tail), and a completion of its own is
//! recognised by its queue pair number and id before the general router,
//! and only counts too (the queue's head); a failed one the lane counts
//! itself. Dropped, the lane gives each post still in flight an entry
//! again (out of its reservation) and puts the rest back, and
//! [`Engine::poll`] hands them back as posts of the prepared requests.
//! Forgotten, it keeps the slot and the reservation, and with them the
//! queue pair: leaked, as after a failed destroy, with every buffer it may
//! use (the placeholder in the engine says so: `QpSlot::lent_to_lane`).

use core::mem::MaybeUninit;

use crate::error::{site, Error};
use crate::memory::{HostBuf, NicBuf};
use crate::sgl::Sgl;
use crate::sys::{self, ibv_wc_opcode as WcOpcode, ibv_wc_status as WcStatus};

use super::check::{cannot_recv, cannot_send_on, post_hint};
use super::completion::{check_status, CompletionRef};
use super::config::Queue;
use super::core::Engine;
use super::doorbell::{LaneWrs, Provider, Verbs};
use super::id::{self, WrId};
use super::prepared::rebuilt;
use super::prepared_table::{gone, PreparedRecv, PreparedSend, NEVER};
use super::qp_slot::{signal_decision, QpId, QpSlot, QpState};
use super::slot_back::SlotBack;

/// What one [`Lane::poll`] completed of the lane's (others go to its
/// callback). Two words, each its own register where the poll is inlined
/// (packed into one, the caller would unpack them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LanePoll {
    /// The lane's sends completed.
    pub sent: u64,
    /// The lane's receives completed ([`Lane::received_len`] says how
    /// many bytes the last one brought).
    pub received: u64,
}

/// One queue pair's prepared send and receive, posted again and again with
/// the checks done once: see [`Engine::lane`].
pub struct Lane<'e, B: NicBuf, P: Provider = Verbs> {
    engine: &'e mut Engine<B, P>,
    /// The queue pair's slot, moved out of the engine for the lane's life
    /// (so the data path reaches it without an index), a placeholder in
    /// its place (`QpSlot::lent_to_lane`). Back in the engine while the
    /// router runs, and when the lane is dropped.
    slot: QpSlot<P::Qp>,
    qp: u32,
    send: PreparedSend,
    recv: Option<PreparedRecv>,
    /// The room the lane holds in each of the engine's tables of requests
    /// in flight: its queues' depths.
    reserved: [u32; 2],
    /// The two entries' buffers, moved out of the table for the lane's life
    /// (their memory stays put: the requests still name it), so a copy in
    /// or out reaches them without an index. Put back when the lane is
    /// dropped; forgotten, they are leaked with the queue pair.
    send_sgl: Sgl<B>,
    recv_sgl: Sgl<B>,
    /// The ids of the queue pair's rings start here (`id::ring(_, qp, 0)`);
    /// without a receive, `recv_ids` is `send_ids`, so a poll's second
    /// match never finds the queue pair's receives, which are not the
    /// lane's.
    send_ids: u64,
    recv_ids: u64,
    received_len: u32,
    wrs: LaneWrs,
}

#[cold]
fn no_recv() -> Error {
    Error::invalid(site!(
        "lane",
        "this lane has no prepared receive",
        "start it with Engine::lane(send, Some(recv))"
    ))
}

#[cold]
fn busy() -> Error {
    Error::new(
        site!(
            "lane buffer",
            "a post of this request is still in flight",
            "poll until its completion comes back"
        ),
        crate::error::ErrorKind::BadState,
    )
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Starts a lane on the queue pair of `send`: the prepared send, and
    /// `recv` if given (of the same queue pair), posted with
    /// [`Lane::post_send`] and [`Lane::post_recv`] and completed with
    /// [`Lane::poll`], every handle and buffer checked here once. Refused
    /// when anything in flight on the queue pair is not a post of these
    /// two requests (the receive side counts only with `recv`), and
    /// (`QueueFull`) when the engine's completion queue lacks room for the
    /// queue pair's whole depth (the lane reserves it). The lane holds the
    /// queue pair while it lives; `mem::forget` on it leaks the queue pair
    /// and the buffers of its prepared requests.
    pub fn lane(
        &mut self,
        send: PreparedSend,
        recv: Option<PreparedRecv>,
    ) -> Result<Lane<'_, B, P>, Error> {
        let entry = match self.prepared.sends.get_mut(send.index as usize) {
            Some(e) if e.key == send.key => e,
            other => rebuilt(other, send.key, &self.qps, false)?,
        };
        let qp = entry.qp;
        if let Some(r) = recv {
            let entry = match self.prepared.recvs.get_mut(r.index as usize) {
                Some(e) if e.key == r.key => e,
                other => rebuilt(other, r.key, &self.qps, true)?,
            };
            if entry.qp != qp {
                return Err(Error::invalid(site!(
                    "lane",
                    "the send and the receive belong to two queue pairs"
                )));
            }
        }
        let slot = &self.qps[qp as usize];
        slot.qp.as_ref().ok_or_else(gone)?;
        let reserved = self.lane_room(qp, send, recv)?;
        let e = &mut self.prepared.sends[send.index as usize];
        let send_sgl = core::mem::take(&mut e.sgl);
        let mut recv_sgl = Sgl::empty();
        let send_wr = &self.prepared.sends[send.index as usize].wr;
        let recv_wr = match recv {
            Some(r) => {
                let e = &mut self.prepared.recvs[r.index as usize];
                recv_sgl = core::mem::take(&mut e.sgl);
                Some(&self.prepared.recvs[r.index as usize].wr)
            }
            None => None,
        };
        let wrs = LaneWrs::new(send_wr, recv_wr);
        let lent = QpSlot::lent_to_lane(&self.qps[qp as usize]);
        let slot = core::mem::replace(&mut self.qps[qp as usize], lent);
        Ok(Lane {
            engine: self,
            slot,
            qp,
            send,
            recv,
            reserved,
            send_sgl,
            recv_sgl,
            send_ids: id::ring(false, qp, 0),
            recv_ids: id::ring(recv.is_some(), qp, 0),
            received_len: 0,
            wrs,
        })
    }
}

impl<B: NicBuf, P: Provider> Lane<'_, B, P> {
    /// The queue pair the lane posts on.
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

    /// Posts the lane's send, signaled: its completion comes back on its
    /// own, with the unsignaled ones posted before it.
    #[inline(always)]
    pub fn post_send(&mut self) -> Result<(), Error> {
        self.post_send_as(true)
    }

    /// Posts the lane's send unsignaled, for a stream: it completes, and
    /// is counted in [`LanePoll::sent`], with the next signaled one. Posted
    /// signaled anyway when the queue needs it (half its depth unsignaled
    /// in a row), so a full queue always holds a request that completes.
    /// The buffer stays out of reach until a completion covers the post.
    #[inline(always)]
    pub fn post_send_unsignaled(&mut self) -> Result<(), Error> {
        self.post_send_as(false)
    }

    #[inline(always)]
    fn post_send_as(&mut self, asked: bool) -> Result<(), Error> {
        let slot = &mut self.slot;
        if slot.send.len() >= slot.send_room {
            return Err(cannot_send_on(slot));
        }
        let qp = slot.qp.as_ref().ok_or_else(gone)?;
        let seq = slot.send.next_seq();
        let mut run = slot.unsignaled_run;
        let signaled = signal_decision(&mut run, slot.send.half(), asked, 0);
        self.wrs
            .post_send(
                &mut self.engine.prov,
                qp,
                id::ring_at(self.send_ids, seq),
                signaled,
            )
            .map_err(post_hint)?;
        slot.send.push_filled();
        slot.unsignaled_run = run;
        Ok(())
    }

    /// Posts the lane's receive.
    #[inline(always)]
    pub fn post_recv(&mut self) -> Result<(), Error> {
        if self.recv.is_none() {
            return Err(no_recv());
        }
        let slot = &mut self.slot;
        if slot.recv.len() >= slot.recv_room {
            return Err(cannot_recv(slot.state, slot.has_srq));
        }
        let qp = slot.qp.as_ref().ok_or_else(gone)?;
        let seq = slot.recv.next_seq();
        self.wrs
            .post_recv(&mut self.engine.prov, qp, id::ring_at(self.recv_ids, seq))?;
        slot.recv.push_filled();
        Ok(())
    }

    /// Takes at most one entry off `queue`'s completion queue (as
    /// [`Engine::poll_queue`]). A completion of the lane's is counted; a
    /// failed one moves the queue pair to ERR and comes back as the error
    /// (with its status); any other request is handed to `on_other` with
    /// its buffers, as [`Engine::poll`] hands it.
    #[inline(always)]
    pub fn poll(
        &mut self,
        queue: Queue,
        mut on_other: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<LanePoll, Error> {
        let e = &mut *self.engine;
        let Some(cq) = queue.of(&e.cq, &e.recv_cq) else {
            return Ok(LanePoll::default());
        };
        let mut out = MaybeUninit::<sys::ibv_wc>::uninit();
        let Some(wc) = e.prov.poll_one(cq, &mut out)? else {
            return Ok(LanePoll::default());
        };
        // The lane's queue pair number and SUCCESS, in one test.
        if (wc.qp_num ^ self.slot.qp_num) | (wc.status.0 ^ WcStatus::SUCCESS.0) == 0 {
            if let Some(seq) = id::seq_in(wc.wr_id, self.send_ids) {
                let sent = self.slot.send.retire_filled(seq);
                return Ok(LanePoll { sent, received: 0 });
            }
            // Without a receive, `recv_ids` is `send_ids`: no match here.
            if let Some(seq) = id::seq_in(wc.wr_id, self.recv_ids) {
                let received = self.slot.recv.retire_filled(seq);
                self.received_len = wc.byte_len;
                return Ok(LanePoll { sent: 0, received });
            }
        }
        // Nothing of the lane's counts here: the result is a constant, so
        // the hot returns above need not merge with this call's.
        self.route(wc, &mut on_other)?;
        Ok(LanePoll::default())
    }

    /// [`Lane::poll`]'s other completions: a failed (or stale) one of the
    /// lane's queues, counted here, or anything else, through the engine's
    /// router to `on_other`.
    #[cold]
    #[inline(never)]
    fn route(
        &mut self,
        wc: &sys::ibv_wc,
        on_other: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error> {
        if let WrId::Ring { recv, qp, seq } = id::decode(wc.wr_id) {
            // Without a receive, the queue pair's receive queue is the engine's.
            let lanes = qp == self.qp && (!recv || self.recv.is_some());
            if lanes && wc.qp_num == self.slot.qp_num {
                return self.own(recv, seq, wc);
            }
        }
        let back = SlotBack::new(self.engine, &mut self.slot, self.qp);
        back.engine.route(core::slice::from_ref(wc), on_other);
        drop(back);
        Ok(())
    }

    /// A completion of one of the lane's queues that is not a success the
    /// poll counted: a failure (the queue pair goes to ERR and the error
    /// comes back) or a stale or duplicated id (nothing).
    fn own(&mut self, recv: bool, seq: u64, wc: &sys::ibv_wc) -> Result<(), Error> {
        let ring = if recv {
            &mut self.slot.recv
        } else {
            &mut self.slot.send
        };
        if ring.retire_filled(seq) == 0 || wc.status == WcStatus::SUCCESS {
            return Ok(());
        }
        self.slot.set_state(QpState::ERR);
        let opcode = if recv {
            WcOpcode::RECV
        } else {
            self.engine.prepared.sends[self.send.index as usize].opcode
        };
        check_status(wc.status, opcode, recv)
    }

    /// Bytes the lane's last completed receive brought.
    #[inline]
    pub fn received_len(&self) -> u32 {
        self.received_len
    }

    /// The first buffer of the lane's send (`recv` false) or receive,
    /// refused while its queue holds anything in flight.
    #[inline(always)]
    pub(super) fn idle_buf(&mut self, recv: bool) -> Result<&mut B, Error> {
        let (ring, sgl) = if recv {
            self.recv.ok_or_else(no_recv)?;
            (&self.slot.recv, &mut self.recv_sgl)
        } else {
            (&self.slot.send, &mut self.send_sgl)
        };
        if ring.len() != 0 {
            return Err(busy());
        }
        sgl.buf_mut(0)
            .ok_or_else(|| Error::invalid(site!("lane", "the request has no buffer")))
    }
}

impl<B: HostBuf, P: Provider> Lane<'_, B, P> {
    /// Copies `src` into the lane's send buffer at `offset`, for the next
    /// post to send (as [`Engine::write_prepared`]). Refused while a send
    /// of the lane's is in flight.
    #[inline]
    pub fn write_send(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.idle_buf(false)?.write_at(offset, src)
    }

    /// Copies from the lane's receive buffer at `offset` into `dst` (what
    /// the last receive brought). Refused while a receive of the lane's is
    /// posted.
    #[inline]
    pub fn read_recv(&mut self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.idle_buf(true)?.read_at(offset, dst)
    }
}

impl<B: NicBuf, P: Provider> Drop for Lane<'_, B, P> {
    /// Gives the posts still in flight their entries back (out of the
    /// lane's reservation, whose rest is returned), puts the queue pair's
    /// slot and the buffers back, and records each entry's latest post
    /// (what a loan or release checks). Forgotten instead, the queue pair
    /// is leaked with its slot, the reservation and the buffers, as after
    /// a failed destroy: the placeholder makes the engine leak its
    /// prepared requests and its requests in flight too.
    fn drop(&mut self) {
        let e = &mut *self.engine;
        e.lane_back(&mut self.slot, self.send, self.recv, self.reserved);
        core::mem::swap(&mut self.slot, &mut e.qps[self.qp as usize]);
        let slot = &e.qps[self.qp as usize];
        let latest = |ring: &super::ring::Ring| match ring.len() {
            0 => NEVER,
            _ => ring.next_seq() - 1,
        };
        let send = &mut e.prepared.sends[self.send.index as usize];
        send.last_post = latest(&slot.send);
        send.sgl = core::mem::take(&mut self.send_sgl);
        if let Some(r) = self.recv {
            let recv = &mut e.prepared.recvs[r.index as usize];
            recv.last_post = latest(&slot.recv);
            recv.sgl = core::mem::take(&mut self.recv_sgl);
        }
    }
}
